//! The dory daemon under test, run from the built binary in a temp dir.

use super::*;

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

/// Restarts allowed when dory loses a port `free_port` chose to another process (see
/// [`Dory::restart_if_port_taken`]).
const PORT_RETRIES: u32 = 3;

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
    /// How it was started: [`Dory::start`] starts it again on other ports if one of the
    /// free ports it was given was taken by another test in between.
    args: DoryArgs,
}

impl Dory {
    /// Starts dory (see [`Dory::spawn`]) and waits until it listens on its status and TCP
    /// input ports (its own sockets, deadline 30 s), starting it again on new ports while
    /// [`PORT_RETRIES`] lasts if it lost one to another process in between. Panics, with
    /// its output, if it exits otherwise or never listens. Once it listens no port can be
    /// lost any more; call [`Dory::wait_ready`] to wait for its first metadata.
    pub fn start(args: DoryArgs) -> Dory {
        let mut dory = Dory::spawn(args);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut retries = PORT_RETRIES;
        loop {
            if let Some(s) = dory.proc.try_exit() {
                if dory.restart_if_port_taken(&mut retries) {
                    continue;
                }
                panic!("dory exited with {s} at start\n{}", dory.proc.logs());
            }
            let ports = [dory.status.port(), dory.tcp_port];
            if ports.iter().all(|&p| listens_on(dory.pid(), p)) {
                return dory;
            }
            if Instant::now() >= deadline {
                panic!(
                    "dory not listening on ports {ports:?} within 30 s\n{}",
                    dory.proc.logs()
                );
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Spawns dory with:
    /// `--broker H:P`... `--dgram-socket <tmp>/dgram.sock --stream-socket <tmp>/stream.sock
    /// --tcp-port <free> --status-addr 127.0.0.1:<free> [--batch-time-ms N]
    /// [--config <tmp>/dory.toml]`, without waiting for anything.
    fn spawn(args: DoryArgs) -> Dory {
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
        loop {
            if let Some(s) = self.proc.try_exit() {
                let logs = self.proc.logs();
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

    /// After dory exited: if it could not bind a port `free_port` chose (released before
    /// dory binds it, so another test or an outgoing connection can take it in between),
    /// starts it again with new ports and returns true, while `retries` lasts. Any other
    /// exit is left to the caller.
    fn restart_if_port_taken(&mut self, retries: &mut u32) -> bool {
        let logs = self.proc.logs();
        if *retries == 0 || !logs.contains("Address already in use") {
            return false;
        }
        *retries -= 1;
        eprintln!("dory could not bind a free port (taken in between); again:\n{logs}");
        *self = Dory::spawn(self.args.clone());
        true
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

/// Whether process `pid` has a socket listening on TCP `port` (IPv4 or IPv6): a listener in
/// `/proc/net/tcp{,6}` whose inode is one of the process's descriptors. Another process
/// listening on the port does not count.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let inodes: Vec<String> = fds
        .flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        fs::read_to_string(table).is_ok_and(|t| {
            t.lines().skip(1).any(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                // sl, local_address, rem_address, st, ..., inode (the 10th field).
                f.len() > 9
                    && f[3] == "0A"
                    && f[1]
                        .rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                        == Some(port)
                    && inodes.iter().any(|i| i == f[9])
            })
        })
    })
}
