//! The binary's command line: help, and start-up errors that name the bad setting.

use std::process::{Command, Output};

fn dory(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dory"))
        .args(args)
        .output()
        .expect("run dory")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_documents_every_flag() {
    let o = dory(&["--help"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--config",
        "--broker",
        "--dgram-socket",
        "--stream-socket",
        "--tcp-port",
        "--status-addr",
        "--msg-buffer-max",
        "--batch-time-ms",
        "--per-topic-metrics",
        "send",
        "convert-config",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
    let o = dory(&["send", "--help"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--socket",
        "--topic",
        "--partition-key",
        "--key",
        "--value",
        "--stdin",
        "--count",
    ] {
        assert!(text.contains(flag), "send --help lacks {flag}:\n{text}");
    }
}

#[test]
fn unknown_config_key_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[kafka]\nbrokers = [\"127.0.0.1:9092\"]\nbatch_size = 3\n",
    )
    .expect("write");
    let o = dory(&["--config", path.to_str().expect("utf-8 path")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("batch_size"), "{}", stderr(&o));
}

#[test]
fn missing_brokers_and_inputs_are_named() {
    let o = dory(&["--dgram-socket", "/tmp/x.sock"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("kafka.brokers"), "{}", stderr(&o));
    let o = dory(&["--broker", "127.0.0.1:9092"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("input"), "{}", stderr(&o));
    let o = dory(&["--broker", "nohost", "--tcp-port", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("host:port"), "{}", stderr(&o));
}

#[test]
fn busy_status_port_is_a_startup_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("d.sock");
    let o = dory(&[
        "--broker",
        "127.0.0.1:9",
        "--dgram-socket",
        sock.to_str().expect("utf-8 path"),
        "--status-addr",
        &addr,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("status.addr"), "{}", stderr(&o));
    assert!(!sock.exists(), "no socket is left behind");
}

#[test]
fn unwritable_commit_points_file_is_a_startup_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("d.sock");
    let state = dir.path().join("no/such/dir/cp.json");
    let config = dir.path().join("dory.toml");
    std::fs::write(
        &config,
        format!(
            "[commit_points]\npath = {:?}\n",
            state.to_str().expect("utf-8 path")
        ),
    )
    .expect("write");
    let o = dory(&[
        "--config",
        config.to_str().expect("utf-8 path"),
        "--broker",
        "127.0.0.1:9",
        "--dgram-socket",
        sock.to_str().expect("utf-8 path"),
        "--status-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("commit_points.path"), "{}", stderr(&o));
    assert!(!sock.exists(), "no socket is left behind");
}

#[test]
fn send_needs_a_target() {
    let o = dory(&["send", "--topic", "t", "--value", "v"]);
    assert!(!o.status.success());
}
