//! The `dory` binary: parse flags, load config, start logging, run; one place maps errors
//! to the exit status.

use std::io::Read;
use std::process::ExitCode;

use clap::Parser;
use dory::cli::{Cli, Command, ConvertConfigArgs};
use dory::config::{convert, Config};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Some(Command::ConvertConfig(args)) => convert_config(&args),
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

/// `dory convert-config`: TOML on stdout, notes on stderr. Exit status 0 when converted
/// (notes or not), 1 when the file cannot be read, 2 when it cannot be converted (malformed
/// XML, an unknown element, a bad value), as for a usage error.
fn convert_config(args: &ConvertConfigArgs) -> ExitCode {
    let (text, source) = if args.path.as_os_str() == "-" {
        let mut text = String::new();
        match std::io::stdin().read_to_string(&mut text) {
            Ok(_) => (text, "standard input".to_string()),
            Err(e) => {
                eprintln!("dory convert-config: cannot read standard input: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        match std::fs::read_to_string(&args.path) {
            Ok(text) => (text, args.path.display().to_string()),
            Err(e) => {
                eprintln!(
                    "dory convert-config: cannot read {}: {e}",
                    args.path.display()
                );
                return ExitCode::from(1);
            }
        }
    };
    match convert::convert(&text, &source) {
        Ok(c) => {
            print!("{}", c.toml);
            for n in &c.notes {
                eprintln!("note: {n}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dory convert-config: {source}: {e}");
            ExitCode::from(2)
        }
    }
}

/// Logs to stderr (the journal under systemd); `RUST_LOG` overrides the `info` default.
fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
}
