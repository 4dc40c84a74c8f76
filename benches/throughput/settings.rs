//! What an invocation settles before its first run, from the options: the checked
//! options and target list, the binaries, dory's batch times and librdkafka's matching
//! properties, all in the [`Ctx`] every configuration shares.

use std::path::PathBuf;

use crate::opts::{parse_size, Opts, Target};
use crate::tansu;

/// What every configuration shares.
pub struct Ctx<'a> {
    pub o: &'a Opts,
    pub targets: Vec<Target>,
    pub pool_bytes: u64,
    pub dory: Option<PathBuf>,
    pub tansu_bin: Option<PathBuf>,
    /// librdkafka properties for the `rdkafka` target (bootstrap.servers added per run).
    pub rdkafka_conf: Vec<(String, String)>,
    /// dory's batch time, for the `sink` and `tansu` targets and for `sink-variant`.
    pub batch_time_ms: u64,
    pub variant_batch_time_ms: u64,
}

impl<'a> Ctx<'a> {
    /// Checks the options and derives the rest from them.
    pub fn new(o: &'a Opts) -> Result<Ctx<'a>, String> {
        if o.topics.contains(&0)
            || o.runs == 0
            || o.messages == 0
            || o.per_call == 0
            || o.partitions <= 0
        {
            return Err(
                "--topics, --runs, --messages, --per-call and --partitions must be positive".into(),
            );
        }
        let pool_bytes = parse_size(&o.pool).ok_or_else(|| format!("bad --pool {:?}", o.pool))?;
        let mut targets = o.targets.clone();
        targets.dedup();
        match (&o.variant_toml, targets.contains(&Target::SinkVariant)) {
            (None, true) => return Err("target sink-variant needs --variant-toml".into()),
            (Some(_), false) => {
                let at = targets
                    .iter()
                    .position(|&t| t == Target::Sink)
                    .map_or(targets.len(), |i| i + 1);
                targets.insert(at, Target::SinkVariant);
            }
            _ => {}
        }
        let needs_daemon = targets.iter().any(|t| t.is_daemon());
        let dory = if needs_daemon {
            Some(dory_bin(o)?)
        } else {
            None
        };
        let tansu_bin = if targets.contains(&Target::Tansu) {
            Some(tansu::locate(o.tansu.as_deref()).map_err(|e| e.to_string())?)
        } else {
            None
        };
        // The variant's TOML is appended to the common one (`run_daemon`).
        let base_toml: Vec<&str> = o.daemon_toml.as_deref().into_iter().collect();
        let variant_toml: Vec<&str> = base_toml
            .iter()
            .copied()
            .chain(o.variant_toml.as_deref())
            .collect();
        let (batch_ms, variant_batch_ms) = (
            batch_time_ms(&base_toml, &o.daemon_args)?,
            batch_time_ms(&variant_toml, &o.daemon_args)?,
        );
        let rdkafka_conf = if targets.contains(&Target::Rdkafka) {
            rdkafka_conf(o, pool_bytes, batch_ms)?
        } else {
            Vec::new()
        };
        Ok(Ctx {
            o,
            targets,
            pool_bytes,
            dory,
            tansu_bin,
            rdkafka_conf,
            batch_time_ms: batch_ms,
            variant_batch_time_ms: variant_batch_ms,
        })
    }

    /// Human-readable output: stdout, or stderr when stdout carries JSON lines.
    pub fn say(&self, s: &str) {
        if self.o.json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    }
}

/// dory's binary: `--dory`, else the one cargo built for this bench, else `$DORY_BIN`.
fn dory_bin(o: &Opts) -> Result<PathBuf, String> {
    if let Some(p) = &o.dory {
        return Ok(p.clone());
    }
    if let Some(p) = option_env!("CARGO_BIN_EXE_dory") {
        // Cargo builds this binary with the dev-dependencies' features unified in: it is
        // not the one `cargo build --release` (and the .deb) ships, and uses 2-3 MiB more
        // memory (doc/performance.md, round thirteen).
        eprintln!(
            "note: measuring the dory that cargo built for this bench ({p}); for the \
             shipped build's memory, `cargo build --release` and pass a copy with --dory"
        );
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("DORY_BIN")
        .map(PathBuf::from)
        .ok_or_else(|| "no dory binary: pass --dory PATH or set DORY_BIN".into())
}

/// dory's batch time in a configuration: --batch-time-ms among `daemon_args`, else
/// `batching.time_ms` in the TOML dory is given, else dory's default (100 ms).
fn batch_time_ms(toml: &[&str], daemon_args: &[String]) -> Result<u64, String> {
    let t: toml::Table = toml
        .join("\n")
        .parse()
        .map_err(|e| format!("--daemon-toml/--variant-toml: {e}"))?;
    let mut time_ms = t
        .get("batching")
        .and_then(|b| b.get("time_ms"))
        .and_then(|v| v.as_integer())
        .and_then(|i| u64::try_from(i).ok());
    // --batch-time-ms on the command line overrides batching.time_ms, as in dory.
    let mut args = daemon_args.iter();
    while let Some(a) = args.next() {
        if let Some(v) = a.strip_prefix("--batch-time-ms=") {
            time_ms = v.parse().ok();
        } else if a == "--batch-time-ms" {
            time_ms = args.next().and_then(|v| v.parse().ok());
        }
    }
    Ok(time_ms.unwrap_or(100))
}

/// librdkafka's settings for the `rdkafka` target, matched to dory's (defaults, or what
/// --daemon-toml and --daemon-arg set): acks, idempotence, linger = batching.time_ms,
/// batch.size = batching.bytes, batch.num.messages = batching.messages (off: librdkafka's
/// maximum), compression codec, in-flight requests, and a queue as large as dory's pool.
/// --rdkafka-conf entries come last and win.
fn rdkafka_conf(o: &Opts, pool_bytes: u64, time_ms: u64) -> Result<Vec<(String, String)>, String> {
    let t: toml::Table = match &o.daemon_toml {
        Some(s) => s.parse().map_err(|e| format!("--daemon-toml: {e}"))?,
        None => toml::Table::new(),
    };
    let get = |section: &str, key: &str| -> Option<toml::Value> {
        t.get(section)?.as_table()?.get(key).cloned()
    };
    let size = |v: toml::Value| -> Option<u64> {
        match v {
            toml::Value::Integer(i) => u64::try_from(i).ok(),
            toml::Value::String(s) => parse_size(&s),
            _ => None,
        }
    };
    let acks = get("kafka", "acks")
        .and_then(|v| v.as_integer())
        .unwrap_or(-1);
    let idempotence = get("kafka", "idempotence")
        .and_then(|v| v.as_bool())
        .unwrap_or(acks == -1);
    let in_flight = get("kafka", "max_in_flight_requests")
        .and_then(|v| v.as_integer())
        .unwrap_or(5);
    let bytes = get("batching", "bytes").and_then(size).unwrap_or(256 << 10);
    let messages = get("batching", "messages")
        .and_then(|v| v.as_integer())
        .filter(|&n| n > 0)
        .unwrap_or(1_000_000);
    // compression.default: a codec, or a named config whose codec is used.
    let codec = match get("compression", "default").and_then(|v| v.as_str().map(String::from)) {
        None => "none".to_string(),
        Some(c) if ["none", "gzip", "snappy", "lz4", "zstd"].contains(&c.as_str()) => c,
        Some(name) => get("compression", "configs")
            .and_then(|c| c.get(&name)?.get("codec")?.as_str().map(String::from))
            .ok_or_else(|| format!("compression config {name:?} not found for librdkafka"))?,
    };
    let mut conf: Vec<(String, String)> = [
        ("client.id", "dory-bench-rdkafka".to_string()),
        (
            "acks",
            if acks == -1 {
                "all".into()
            } else {
                acks.to_string()
            },
        ),
        ("enable.idempotence", idempotence.to_string()),
        (
            "max.in.flight.requests.per.connection",
            in_flight.to_string(),
        ),
        ("linger.ms", time_ms.to_string()),
        ("batch.size", bytes.to_string()),
        ("batch.num.messages", messages.to_string()),
        ("compression.codec", codec),
        (
            "queue.buffering.max.kbytes",
            (pool_bytes / 1024).to_string(),
        ),
        ("queue.buffering.max.messages", "10000000".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for kv in &o.rdkafka_conf {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--rdkafka-conf {kv:?}: expected KEY=VALUE"))?;
        conf.retain(|(key, _)| key != k);
        conf.push((k.to_string(), v.to_string()));
    }
    Ok(conf)
}
