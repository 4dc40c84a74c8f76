//! `dory convert-config`, run as the binary: Dory's example config and one using every
//! element convert to TOML that the real loader turns into the same `Config` as a
//! hand-written TOML of the same settings; notes go to stderr; bad files are refused with
//! the element, its line and exit status 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dory::config::{Config, Overrides};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn convert(path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dory"))
        .arg("convert-config")
        .arg(path)
        .output()
        .expect("run dory convert-config")
}

fn load(path: &Path) -> Config {
    Config::load(Some(path), &Overrides::default())
        .unwrap_or_else(|e| panic!("{} does not load: {e}", path.display()))
}

/// Converts `xml`, loads the printed TOML and compares it with `expected_toml` loaded the
/// same way; returns stderr.
fn converts_like(xml: &str, expected_toml: &str) -> String {
    let o = convert(&data(xml));
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let dir = tempfile::tempdir().expect("tempdir");
    let converted = dir.path().join("converted.toml");
    std::fs::write(&converted, &o.stdout).expect("write");
    assert_eq!(load(&converted), load(&data(expected_toml)));
    let again = convert(&data(xml));
    assert_eq!(o.stdout, again.stdout, "the output is deterministic");
    stderr
}

/// Every stderr line is a note naming its line and element.
fn assert_notes(stderr: &str, expected: &[&str]) {
    for line in stderr.lines() {
        assert!(line.starts_with("note: line "), "{line}");
    }
    for e in expected {
        assert!(stderr.contains(e), "no note about {e}:\n{stderr}");
    }
}

#[test]
fn dory_example_config_converts_to_the_same_settings() {
    let stderr = converts_like("dory-example.xml", "dory-example.toml");
    assert_notes(
        &stderr,
        &[
            "<inputConfig><allowLargeUnixDatagrams>",
            "<msgDelivery><dispatcherRestartMaxDelay>",
            "<msgDelivery><compareMetadataOnRefresh>",
            "<msgDelivery><pauseRateLimitInitial>",
            "<msgDelivery><pauseRateLimitMaxDouble>",
            "<msgDelivery><minPauseDelay>",
            "<httpInterface><loopbackOnly>: Dory served HTTP on all interfaces",
            "<logging><level>",
            "<logging><file>",
            "<logging><logDiscards>",
            "<batching>: batch time limits now count from a message's arrival",
        ],
    );
}

#[test]
fn config_with_every_element_converts_to_the_same_settings() {
    let stderr = converts_like("dory-every-element.xml", "dory-every-element.toml");
    assert_notes(
        &stderr,
        &[
            "<initialBrokers><broker>: no port: Dory used 9002",
            "<msgDebug>: only the topics selected",
            "<msgDelivery><compareMetadataOnRefresh>: false has no equivalent",
            "RUST_LOG=warn",
            "<logging><stdoutStderr>",
            "<logging><syslog>",
        ],
    );
    assert!(!stderr.contains("<httpInterface>"), "loopbackOnly is kept");
}

/// Writes `xml` to a file and converts it.
fn convert_text(xml: &str) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dory.xml");
    std::fs::write(&path, xml).expect("write");
    convert(&path)
}

const MINIMAL_HEAD: &str = "<?xml version=\"1.0\" encoding=\"US-ASCII\"?>\n<doryConfig>\n";
const MINIMAL_TAIL: &str =
    "  <initialBrokers><broker host=\"k\" port=\"9092\"/></initialBrokers>\n</doryConfig>\n";

fn with_inputs(inputs: &str) -> String {
    format!("{MINIMAL_HEAD}  <inputSources>{inputs}</inputSources>\n{MINIMAL_TAIL}")
}

#[test]
fn bad_files_are_refused_naming_element_and_line() {
    for (xml, expected) in [
        (
            with_inputs("\n    <unixDatagramm enable=\"true\"/>\n  "),
            "line 4: <inputSources><unixDatagramm>: unknown element",
        ),
        (
            with_inputs("<tcp enable=\"yes\"><port value=\"9000\"/></tcp>"),
            "line 3: <inputSources><tcp>: attribute `enable`: `yes` is neither true nor false",
        ),
        (
            with_inputs("<tcp enable=\"true\"><port value=\"09000\"/></tcp>"),
            "<inputSources><tcp><port>: attribute `value`: `09000`: a leading 0",
        ),
        (
            with_inputs("<unixDatagram enable=\"true\"><path value=\"d.sock\"/></unixDatagram>"),
            "<inputSources><unixDatagram><path>: attribute `value`: `d.sock` must be an absolute path",
        ),
        (
            format!("{MINIMAL_HEAD}{MINIMAL_TAIL}"),
            "<doryConfig>: element <inputSources> is required here",
        ),
        (
            "<doryConfig><inputSources></doryConfig>".to_string(),
            "not well-formed XML",
        ),
    ] {
        let o = convert_text(&xml);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{xml}\n{stderr}");
        assert!(stderr.contains(expected), "{xml}\nwanted {expected}\ngot {stderr}");
        assert!(o.stdout.is_empty(), "no TOML for a bad file");
    }
}

#[test]
fn a_value_dory_took_but_dory_refuses_is_an_error() {
    let long = format!("/{}", "s".repeat(120));
    let o = convert_text(&with_inputs(&format!(
        "<unixDatagram enable=\"true\"><path value=\"{long}\"/></unixDatagram>"
    )));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("input.dgram_socket"), "{stderr}");
}

#[test]
fn unreadable_file_exits_1() {
    let o = convert(Path::new("/nonexistent/dory.xml"));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/dory.xml"));
}

#[test]
fn usage_error_exits_2() {
    let o = Command::new(env!("CARGO_BIN_EXE_dory"))
        .arg("convert-config")
        .output()
        .expect("run dory");
    assert_eq!(o.status.code(), Some(2));
}
