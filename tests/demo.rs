//! Runs `scripts/demo.sh` (the README's "Try it") end to end, with the `dory` binary this
//! `cargo test` built and the harness's Tansu, and checks what a newcomer reads: every value
//! the demo sends shows up in the consumer's lines, with its key, and the count read back
//! equals the delivered count from dory's `/metrics`.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{dory_bin, tansu_path, Proc};

/// The script installs confluent-kafka from PyPI on its first run; every wait inside it is
/// bounded, this is the backstop.
const DEMO_TIMEOUT: Duration = Duration::from_secs(600);

/// One `partition P offset O key K value V` line of the demo's consumer.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Record {
    partition: i32,
    offset: i64,
    key: String,
    value: String,
}

fn parse_record(line: &str) -> Option<Record> {
    let rest = line.strip_prefix("partition ")?;
    let (partition, rest) = rest.split_once(" offset ")?;
    let (offset, rest) = rest.split_once(" key ")?;
    let (key, value) = rest.split_once(" value ")?;
    Some(Record {
        partition: partition.parse().ok()?,
        offset: offset.parse().ok()?,
        key: key.to_string(),
        value: value.to_string(),
    })
}

#[test]
fn demo_script_reads_back_every_value_sent() {
    let logs = tempfile::tempdir().expect("temp dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo.sh");
    let mut demo = Proc::spawn(
        "demo",
        Command::new("bash")
            .arg(&script)
            .env("DORY_BIN", dory_bin())
            .env("TANSU", tansu_path()),
        logs.path(),
    );
    let status = match demo.wait_exit(DEMO_TIMEOUT) {
        Some(s) => s,
        None => {
            // SIGTERM lets the script's trap stop its Tansu and dory; Proc's drop kills it
            // if that does not end it.
            demo.sigterm();
            demo.wait_exit(Duration::from_secs(30));
            panic!(
                "{} did not finish within {DEMO_TIMEOUT:?}",
                script.display()
            );
        }
    };
    // `Proc::spawn` writes stdout to `<log_dir>/<name>.stdout`.
    let stdout = fs::read_to_string(logs.path().join("demo.stdout")).expect("read demo stdout");
    // On a failed assertion, dropping `demo` prints everything the script wrote.
    assert!(status.success(), "demo.sh exited with {status}");

    let records: Vec<Record> = stdout.lines().filter_map(parse_record).collect();
    let mut got: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r.value.as_str(), r.key.as_str()))
        .collect();
    got.sort_unstable();
    let mut want = vec![
        ("hello from dory send", "(null)"),
        ("hello from dory send", "(null)"),
        ("hello from dory send", "(null)"),
        ("keyed message", "user-7"),
        ("line one", "(null)"),
        ("line two", "(null)"),
    ];
    want.sort_unstable();
    assert_eq!(
        got, want,
        "the consumer's lines do not show every value sent (value, key)"
    );
    let positions: BTreeSet<(i32, i64)> = records.iter().map(|r| (r.partition, r.offset)).collect();
    assert_eq!(
        positions.len(),
        records.len(),
        "a (partition, offset) shown twice"
    );

    for line in [
        "read back 6 of 6 delivered",
        "health: ok",
        "    malformed msg count: 1",
        "dory_messages_delivered_total{topic=\"demo\"} 6",
        "dory exited with status 0; its log:",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "demo output lacks the line {line:?}"
        );
    }
}
