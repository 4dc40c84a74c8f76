//! systemd integration: the real binary talks to a notification socket the test owns
//! (`NOTIFY_SOCKET`, `WATCHDOG_USEC`): `READY=1` only once `/health` is ok, `STATUS=`
//! lines, `WATCHDOG=1` at half the watchdog timeout, `STOPPING=1` on SIGTERM. The unit
//! file passes `systemd-analyze verify` (where systemd-analyze exists), and the paths of
//! the sample config lie in directories the unit makes writable.
//!
//! `cargo test --test systemd -- --nocapture` prints every notification received.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const WAIT: Duration = Duration::from_secs(30);

/// A notification socket in a temp dir; a thread records every datagram with its arrival
/// time.
struct NotifySocket {
    path: PathBuf,
    received: Arc<Mutex<Vec<(Instant, String)>>>,
    _dir: tempfile::TempDir,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind notify socket");
        let received = Arc::new(Mutex::new(Vec::new()));
        let rec = received.clone();
        thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            // Ends with the test process.
            while let Ok(n) = sock.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                rec.lock()
                    .expect("notify log lock")
                    .push((Instant::now(), text));
            }
        });
        NotifySocket {
            path,
            received,
            _dir: dir,
        }
    }

    fn messages(&self) -> Vec<(Instant, String)> {
        self.received.lock().expect("notify log lock").clone()
    }

    /// Waits until a datagram satisfies `pred`; returns its index.
    fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> usize {
        poll_until(what, timeout, || {
            let msgs = self.messages();
            msgs.iter()
                .position(|(_, m)| pred(m))
                .ok_or_else(|| format!("received so far: {:?}", texts(&msgs)))
        })
    }

    /// Prints every datagram, one assignment per line, with its time since `t0`.
    fn print(&self, t0: Instant) {
        println!("notifications received ({}):", self.path.display());
        for (at, m) in self.messages() {
            let ms = at.saturating_duration_since(t0).as_millis();
            for line in m.lines() {
                println!("  +{ms:>5} ms  {line}");
            }
        }
    }
}

fn texts(msgs: &[(Instant, String)]) -> Vec<&str> {
    msgs.iter().map(|(_, m)| m.as_str()).collect()
}

fn has_line(msg: &str, line: &str) -> bool {
    msg.lines().any(|l| l == line)
}

#[test]
fn notifies_ready_status_watchdog_and_stopping() {
    let mock = Mock::start(1);
    mock.create_topic("sd", 2);
    let notify = NotifySocket::bind();
    let mut args = DoryArgs::new(mock.broker_addrs());
    args.env = vec![
        ("NOTIFY_SOCKET".into(), notify.path.display().to_string()),
        // 1 s: pings every 500 ms.
        ("WATCHDOG_USEC".into(), "1000000".into()),
    ];
    let t0 = Instant::now();
    let mut dory = Dory::start(args);

    // READY=1 arrives only once /health answers 200 (it only moves forward, so asking
    // after the datagram arrived shows whether it was sent too early).
    let ready = notify.wait_for("READY=1", WAIT, |m| has_line(m, "READY=1"));
    let (code, body) = dory.http_get("/health");
    assert_eq!(code, 200, "READY=1 sent while /health says {code} {body}");
    let before = notify.messages();
    assert!(
        before[..ready]
            .iter()
            .all(|(_, m)| !m.contains("STATUS=ready")),
        "a ready status before READY=1: {:?}",
        texts(&before)
    );
    let ready_msg = &before[ready].1;
    assert!(
        ready_msg.contains("STATUS=ready: received 0, delivered 0"),
        "READY=1 comes with the ready status line: {ready_msg:?}"
    );

    // Messages in: a later status line counts them (refreshed every 5 s when changed).
    dory.send_stream(&stream_msgs("sd", 3));
    dory.wait_drained(WAIT);
    notify.wait_for("a status line counting the messages", WAIT, |m| {
        m.contains(
            "STATUS=ready: received 3, delivered 3, discarded 0, in flight 0; brokers up 1/1",
        )
    });

    // Watchdog pings: every 500 ms, counted over the run so far after READY.
    let msgs = notify.messages();
    let ready_at = msgs[ready].0;
    let pings: Vec<Instant> = msgs
        .iter()
        .filter(|(_, m)| has_line(m, "WATCHDOG=1"))
        .map(|(at, _)| *at)
        .filter(|at| *at >= ready_at)
        .collect();
    let span = msgs
        .last()
        .map(|(at, _)| at.saturating_duration_since(ready_at))
        .expect("messages");
    let expected = span.as_millis() / 500;
    assert!(
        pings.len() as u128 + 2 >= expected && pings.len() as u128 <= expected + 2,
        "{} pings in {span:?} after READY, expected about {expected}: {:?}",
        pings.len(),
        texts(&msgs)
    );
    for w in pings.windows(2) {
        let gap = w[1].saturating_duration_since(w[0]);
        assert!(
            gap >= Duration::from_millis(400) && gap <= Duration::from_millis(900),
            "watchdog ping gap {gap:?}"
        );
    }

    // SIGTERM: STOPPING=1 promptly, then a clean exit.
    let sigterm_at = Instant::now();
    let status = dory.terminate(WAIT);
    assert!(status.success(), "exit status {status}");
    let stopping = notify.wait_for("STOPPING=1", Duration::from_secs(5), |m| {
        has_line(m, "STOPPING=1")
    });
    let msgs = notify.messages();
    assert!(msgs[stopping].0 >= sigterm_at);
    assert!(
        msgs[stopping]
            .1
            .contains("STATUS=stopping: delivering 0 in flight"),
        "{:?}",
        msgs[stopping].1
    );
    notify.print(t0);
}

#[test]
fn not_ready_without_metadata() {
    // Nothing listens on the broker port: inputs open, metadata never comes.
    let notify = NotifySocket::bind();
    let broker = format!("127.0.0.1:{}", free_port());
    let mut args = DoryArgs::new([broker.clone()]);
    args.env = vec![("NOTIFY_SOCKET".into(), notify.path.display().to_string())];
    let t0 = Instant::now();
    let mut dory = Dory::start(args);
    notify.wait_for("the starting status", WAIT, |m| {
        m.contains("STATUS=starting: inputs open, waiting for metadata")
    });
    // An assertion window, not synchronisation: two seconds without READY=1.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let (code, _) = dory.http_get("/health");
        assert_ne!(code, 200, "healthy without metadata");
        thread::sleep(POLL_INTERVAL);
    }
    assert!(
        notify
            .messages()
            .iter()
            .all(|(_, m)| !has_line(m, "READY=1")),
        "READY=1 without metadata: {:?}",
        texts(&notify.messages())
    );
    // Why: /health names the broker and its error, and counts the failed fetches.
    let health = poll_until("/health to give the reason", WAIT, || {
        let (code, body) = dory.http_get("/health");
        let named = body.contains(&format!("the last: {broker}: "));
        if code == 503 && named && body.contains("failed in a row") {
            Ok(body)
        } else {
            Err(format!("{code} {body:?}"))
        }
    });
    assert!(
        health.starts_with("not ready: waiting for the first metadata fetch\n"),
        "{health:?}"
    );
    notify.wait_for("the status to count the failures", WAIT, |m| {
        m.contains("STATUS=starting: inputs open, waiting for metadata (")
            && m.contains("failed; /health has the last reason)")
    });
    println!("/health without a broker: {}", health.trim_end());
    // No WATCHDOG_USEC: no pings.
    assert!(notify
        .messages()
        .iter()
        .all(|(_, m)| !has_line(m, "WATCHDOG=1")));
    let status = dory.terminate(WAIT);
    assert!(status.success(), "exit status {status}");
    notify.wait_for("STOPPING=1", Duration::from_secs(5), |m| {
        has_line(m, "STOPPING=1")
    });
    notify.print(t0);
}

#[test]
fn watchdog_pid_of_another_process_gets_no_pings() {
    let mock = Mock::start(1);
    let notify = NotifySocket::bind();
    let mut args = DoryArgs::new(mock.broker_addrs());
    args.env = vec![
        ("NOTIFY_SOCKET".into(), notify.path.display().to_string()),
        ("WATCHDOG_USEC".into(), "400000".into()),
        // pid 1 is never the daemon under test.
        ("WATCHDOG_PID".into(), "1".into()),
    ];
    let mut dory = Dory::start(args);
    notify.wait_for("READY=1", WAIT, |m| has_line(m, "READY=1"));
    dory.wait_ready();
    let status = dory.terminate(WAIT);
    assert!(status.success(), "exit status {status}");
    notify.wait_for("STOPPING=1", Duration::from_secs(5), |m| {
        has_line(m, "STOPPING=1")
    });
    assert!(
        notify
            .messages()
            .iter()
            .all(|(_, m)| !has_line(m, "WATCHDOG=1")),
        "{:?}",
        texts(&notify.messages())
    );
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn unit_text() -> String {
    std::fs::read_to_string(repo().join("init/dory.service")).expect("read init/dory.service")
}

/// The unit's `Key=value` assignments of `key` (all of them, in order).
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
        .collect()
}

#[test]
fn unit_declares_notify_watchdog_and_hardening() {
    let unit = unit_text();
    for (key, want) in [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("WatchdogSec", "30s"),
        ("Restart", "on-failure"),
        ("User", "dory"),
        ("Group", "dory"),
        ("RuntimeDirectory", "dory"),
        ("StateDirectory", "dory"),
        ("LogsDirectory", "dory"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("CapabilityBoundingSet", ""),
        ("SystemCallFilter", "@system-service"),
        // The router and dispatchers ask for SCHED_BATCH (@resources is filtered out).
        ("SystemCallFilter", "sched_setscheduler"),
    ] {
        assert!(
            unit_values(&unit, key).iter().any(|v| v == want),
            "init/dory.service lacks {key}={want}"
        );
    }
    // The stop timeout leaves room for the default shutdown delay (30 s).
    let stop: u64 = unit_values(&unit, "TimeoutStopSec")
        .first()
        .and_then(|v| v.parse().ok())
        .expect("TimeoutStopSec in seconds");
    assert!(stop > 30, "TimeoutStopSec={stop}");
}

/// Every absolute path in the sample config (settings that are commented out too) lies
/// in a directory the unit makes writable: /run/dory, /var/lib/dory or /var/log/dory;
/// files dory only reads (TLS certificates and keys, the SASL password file) lie in
/// /etc/dory beside the config, readable under `ProtectSystem=strict`.
#[test]
fn sample_config_paths_fit_the_unit() {
    let unit = unit_text();
    let writable: Vec<String> = [
        ("RuntimeDirectory", "/run/"),
        ("StateDirectory", "/var/lib/"),
        ("LogsDirectory", "/var/log/"),
    ]
    .iter()
    .flat_map(|(key, base)| {
        unit_values(&unit, key)
            .into_iter()
            .map(move |d| format!("{base}{d}/"))
    })
    .collect();
    let config =
        std::fs::read_to_string(repo().join("config/dory.toml")).expect("read config/dory.toml");
    let mut paths = 0;
    for line in config.lines() {
        let Some((_, value)) = line.split_once("= \"/") else {
            continue;
        };
        let path = format!("/{}", value.trim_end_matches('"'));
        paths += 1;
        let key = line.trim_start_matches(['#', ' ']).split([' ', '=']).next();
        if matches!(
            key,
            Some("ca_file" | "cert_file" | "key_file" | "password_file")
        ) {
            assert!(
                path.starts_with("/etc/dory/"),
                "{line}: read-only inputs live in /etc/dory"
            );
            continue;
        }
        assert!(
            writable.iter().any(|w| path.starts_with(w.as_str())),
            "config/dory.toml names {path}, outside the unit's writable directories {writable:?}"
        );
    }
    assert!(paths >= 4, "found only {paths} paths in config/dory.toml");
}

/// `systemd-analyze verify` on a copy of the unit whose ExecStart is the binary under
/// test. Skipped, saying so, where systemd-analyze is missing.
#[test]
fn unit_passes_systemd_analyze_verify() {
    let probe = Command::new("systemd-analyze").arg("--version").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        println!("SKIPPED: systemd-analyze is not installed (apt-get install systemd)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let unit = unit_text().replace("/usr/bin/dory", &dory_bin().display().to_string());
    let path = dir.path().join("dory.service");
    std::fs::write(&path, unit).expect("write unit copy");
    let out = run_command(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg("--man=no")
            .arg(&path)
            .env("SYSTEMD_LOG_COLOR", "0"),
        Duration::from_secs(60),
    );
    println!(
        "systemd-analyze verify: exit {}; stdout: {:?}; stderr: {:?}",
        out.status, out.stdout, out.stderr
    );
    // Lines about the host (no systemd running in a container, other units' own
    // problems) are not about this unit; lines naming dory.service are.
    let ours: Vec<&str> = out
        .stderr
        .lines()
        .chain(out.stdout.lines())
        .filter(|l| l.contains("dory.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify found problems in the unit:\n{}",
        ours.join("\n")
    );
}
