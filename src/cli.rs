//! Command-line flags. Raw flags are parsed here, then turned into the validated
//! [`Config`](crate::config::Config) by the config module; `dory send` is a small client;
//! `dory convert-config` turns Dory's XML config into TOML.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{parse_byte_size, Overrides};

#[derive(Debug, Parser)]
#[command(
    name = "dory",
    version,
    about = "Kafka producer daemon: local clients hand it messages over UNIX or TCP sockets \
             (Dory's formats); it batches them and delivers them to Kafka 0.11-4.x.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send messages to a running daemon in Dory's client format.
    Send(SendArgs),
    /// Print the TOML equivalent of a Dory XML config file; what has no equivalent is
    /// explained on stderr.
    ConvertConfig(ConvertConfigArgs),
}

/// `dory convert-config`: which file to convert.
#[derive(Debug, Args)]
pub struct ConvertConfigArgs {
    /// Dory's XML config file (`-` reads standard input). The TOML goes to standard output.
    #[arg(value_name = "DORY_XML")]
    pub path: PathBuf,
}

/// Flags of the daemon itself. Each overrides the config file; with `--broker` and one
/// input flag no file is needed (and topic auto-creation is then on).
#[derive(Debug, Args)]
pub struct RunArgs {
    /// TOML config file (see config/dory.toml for every setting).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Kafka bootstrap broker; repeat for several.
    #[arg(long = "broker", value_name = "HOST:PORT")]
    pub brokers: Vec<String>,
    /// UNIX datagram socket to receive messages on (the preferred input).
    #[arg(long, value_name = "PATH")]
    pub dgram_socket: Option<PathBuf>,
    /// UNIX stream socket to receive messages on.
    #[arg(long, value_name = "PATH")]
    pub stream_socket: Option<PathBuf>,
    /// TCP port on 127.0.0.1 to receive messages on.
    #[arg(long, value_name = "PORT")]
    pub tcp_port: Option<u16>,
    /// Address of the status HTTP server (default 127.0.0.1:9090).
    #[arg(long, value_name = "ADDR:PORT")]
    pub status_addr: Option<String>,
    /// Message pool size in bytes; suffixes k, m, g (default 64m).
    #[arg(long, value_name = "BYTES", value_parser = parse_byte_size)]
    pub msg_buffer_max: Option<u64>,
    /// Batch time limit in milliseconds (0 disables the time limit; default 100).
    #[arg(long, value_name = "MS")]
    pub batch_time_ms: Option<u64>,
    /// Which /metrics families are per topic: accounting (default) or all
    /// (status.per_topic_metrics).
    #[arg(long, value_name = "accounting|all")]
    pub per_topic_metrics: Option<String>,
}

impl RunArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            brokers: self.brokers.clone(),
            dgram_socket: self.dgram_socket.clone(),
            stream_socket: self.stream_socket.clone(),
            tcp_port: self.tcp_port,
            status_addr: self.status_addr.clone(),
            msg_buffer_max: self.msg_buffer_max,
            batch_time_ms: self.batch_time_ms,
            per_topic_metrics: self.per_topic_metrics.clone(),
        }
    }
}

/// `dory send`: where to send, and what.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["socket", "stream_socket", "tcp_port"])))]
#[command(group(clap::ArgGroup::new("body").args(["value", "stdin"])))]
pub struct SendArgs {
    /// The daemon's UNIX datagram socket.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The daemon's UNIX stream socket.
    #[arg(long, value_name = "PATH")]
    pub stream_socket: Option<PathBuf>,
    /// The daemon's TCP port on 127.0.0.1.
    #[arg(long, value_name = "PORT")]
    pub tcp_port: Option<u16>,
    /// Kafka topic.
    #[arg(long)]
    pub topic: String,
    /// Send PartitionKey messages with this key (partition = key mod partition count);
    /// without it, AnyPartition messages.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub partition_key: Option<i64>,
    /// Kafka message key (default empty, sent to Kafka as a null key).
    #[arg(long, default_value = "")]
    pub key: String,
    /// Message value.
    #[arg(long)]
    pub value: Option<String>,
    /// Send each line of standard input as one message.
    #[arg(long)]
    pub stdin: bool,
    /// How many times to send the value (ignored with --stdin).
    #[arg(long, default_value_t = 1)]
    pub count: u64,
}
