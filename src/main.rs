//! The `dory` binary: parse flags, load config, start logging, run; one place maps errors
//! to the exit status.

use std::process::ExitCode;

use clap::Parser;
use dory::cli::{Cli, Command};
use dory::config::Config;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Some(Command::Send(args)) => match dory::send::run(&args) {
            Ok(n) => {
                eprintln!("sent {n} message(s)");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dory send: {e}");
                ExitCode::from(1)
            }
        },
        None => {
            let cfg = match Config::load(cli.run.config.as_deref(), &cli.run.overrides()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("dory: {e}");
                    return ExitCode::from(1);
                }
            };
            match dory::daemon::run(cfg) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    log::error!("{e}");
                    eprintln!("dory: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// Logs to stderr (the journal under systemd); `RUST_LOG` overrides the `info` default.
fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
}
