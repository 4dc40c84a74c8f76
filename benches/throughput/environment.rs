//! The environment a bench invocation reports, on its first lines and in its JSON config
//! line: the date, dory's version and commit (and whether `src` is modified), and a
//! one-line machine description.

use std::path::Path;
use std::process::Command;

use serde_json::json;

/// Date, dory version and commit, and a one-line machine description.
pub fn environment(dory: Option<&Path>) -> serde_json::Value {
    let run = |cmd: &mut Command| -> Option<String> {
        let out = cmd.output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let manifest = env!("CARGO_MANIFEST_DIR");
    let commit = run(Command::new("git")
        .args(["-C", manifest, "rev-parse", "--short", "HEAD"])
        .stderr(std::process::Stdio::null()));
    // Read-only: no optional index refresh.
    let dirty = Command::new("git")
        .args([
            "--no-optional-locks",
            "-C",
            manifest,
            "diff",
            "--quiet",
            "HEAD",
            "--",
            "src",
            "Cargo.toml",
            "Cargo.lock",
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .ok()
        .filter(|_| commit.is_some())
        .map(|s| !s.success());
    let version = dory.and_then(|d| run(Command::new(d).arg("--version")));
    let dory_desc = format!(
        "{} (commit {}{})",
        version.unwrap_or_else(|| "dory ?".into()),
        commit.clone().unwrap_or_else(|| "?".into()),
        if dirty == Some(true) {
            ", src modified"
        } else {
            ""
        }
    );
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let qlen = std::fs::read_to_string("/proc/sys/net/unix/max_dgram_qlen").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let machine = format!(
        "{cores} cores, {cpu}, Linux {}, net.unix.max_dgram_qlen={}, load average at start {}",
        kernel.trim(),
        qlen.trim(),
        load.join(" ")
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({"date": utc(now), "dory": dory_desc, "commit": commit, "src_modified": dirty, "machine": machine})
}

/// `YYYY-MM-DD HH:MM UTC` from Unix seconds (civil-from-days, proleptic Gregorian).
fn utc(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}
