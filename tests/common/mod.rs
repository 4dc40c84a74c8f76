//! Shared harness for dory's integration tests: real Kafka-protocol peers (the librdkafka
//! mock cluster and Tansu), the real `dory` binary in a temp dir, an encoder of Dory's client
//! wire format written independently of the daemon (so the tests cross-check it), senders for
//! the three inputs, a CRC-checking consumer, a deterministic data generator and the
//! delivery verifier.
//!
//! Rules kept throughout: every wait polls a condition against a deadline, every loop is
//! bounded, only loopback addresses are used, and only processes started here are stopped,
//! by PID, from `Drop` guards so that a failing test leaks nothing.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, Timestamp};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tempfile::TempDir;

pub mod proxy;
pub mod raw_fetch;
pub mod threads;
#[allow(unused_imports)]
pub use raw_fetch::*;

// The harness's parts, each re-exported here so that a test names `common::X`.
mod consume; // consuming back with a CRC-checking consumer
mod daemon; // the dory daemon under test
mod data; // deterministic test data
mod kafka_meta; // metadata helpers (rdkafka clients against any broker)
mod metrics; // HTTP/1.0 client and Prometheus text parser
mod mock; // the librdkafka mock cluster
mod process; // paths, ports, child processes
mod senders; // senders for the three inputs
mod tansu; // Tansu, installed from its wheel
mod verify; // delivery verification
mod wire; // Dory's client wire format, encoded independently of the daemon
#[allow(unused_imports)]
pub use self::{
    consume::*, daemon::*, data::*, kafka_meta::*, metrics::*, mock::*, process::*, senders::*,
    tansu::*, verify::*, wire::*,
};

// ---------------------------------------------------------------------------------------------
// Time and polling
// ---------------------------------------------------------------------------------------------

/// How often conditions are re-checked while polling.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Milliseconds since the Unix epoch, wall clock.
pub fn now_ms() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("wall clock is after 1970");
    i64::try_from(d.as_millis()).expect("epoch millis fit in i64")
}

/// Calls `probe` until it returns `Ok`, at most until `timeout` has passed. On timeout it
/// panics naming `what` and quoting the last `Err` (the probe's view of the current state).
pub fn poll_until<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe() {
            Ok(v) => return v,
            Err(e) => e,
        };
        let now = Instant::now();
        if now >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last state: {last}");
        }
        thread::sleep(POLL_INTERVAL.min(deadline - now));
    }
}
