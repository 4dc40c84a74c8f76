//! systemd integration, the supervisor's tool: readiness, status and the watchdog over
//! the `NOTIFY_SOCKET` protocol (sd_notify(3)): datagrams of `KEY=value` lines sent to
//! the UNIX socket named by `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket).
//! Without the variable every call is a no-op, so dory runs the same outside systemd.
//!
//! [`Agent`] is what the supervisor calls: `READY=1` once `/health` is ok (inputs open,
//! first metadata fetched); `STATUS=` with a one-line summary at state changes and every
//! [`STATUS_INTERVAL`] when it changed; `WATCHDOG=1` every half `$WATCHDOG_USEC` (when
//! `$WATCHDOG_PID` is unset or names this process) but only while every role thread's
//! heartbeat is alive and fresh ([`crate::report::liveness`]); `STOPPING=1` when the
//! shutdown signal arrives. A stuck or dead thread stops the pings, so systemd restarts
//! the daemon (`Restart=on-failure`), and is logged.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

use crate::report::liveness::Problem;
use crate::report::metrics::{Health, Metrics};

/// How often the status line is refreshed (sent only when it changed).
pub const STATUS_INTERVAL: Duration = Duration::from_secs(5);
/// How often the liveness of the role threads is checked without a watchdog (the result
/// is only logged then).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How often readiness is looked at until the daemon is ready.
const READY_POLL: Duration = Duration::from_millis(50);

/// A connection to the service manager's notification socket.
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
}

/// Why `$NOTIFY_SOCKET` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET={0:?} is neither an absolute path nor an @abstract name")]
    BadAddress(String),
    #[error("NOTIFY_SOCKET: {0}")]
    Io(#[from] io::Error),
}

impl Notifier {
    /// The notifier `$NOTIFY_SOCKET` names; `Ok(None)` when it is unset or empty.
    pub fn from_env() -> Result<Option<Notifier>, NotifyError> {
        match std::env::var_os("NOTIFY_SOCKET") {
            Some(v) if !v.is_empty() => Notifier::connect(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// A notifier sending to `target`: an absolute path, or `@name` (abstract namespace).
    pub fn connect(target: &OsStr) -> Result<Notifier, NotifyError> {
        let bytes = target.as_bytes();
        let addr = match bytes.first() {
            Some(b'/') => SocketAddr::from_pathname(target)?,
            Some(b'@') => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(&bytes[1..])?
            }
            _ => {
                return Err(NotifyError::BadAddress(
                    target.to_string_lossy().into_owned(),
                ))
            }
        };
        let sock = UnixDatagram::unbound()?;
        // A full socket must never block the supervisor.
        sock.set_nonblocking(true)?;
        Ok(Notifier { sock, addr })
    }

    /// Sends one notification (newline-separated `KEY=value` assignments).
    pub fn notify(&self, state: &str) -> io::Result<()> {
        self.sock
            .send_to_addr(state.as_bytes(), &self.addr)
            .map(|_| ())
    }
}

/// The watchdog ping interval: half of `WATCHDOG_USEC`, if it is set, positive and
/// meant for us (`WATCHDOG_PID` unset or equal to `pid`).
pub fn watchdog_interval(
    usec: Option<&str>,
    watchdog_pid: Option<&str>,
    pid: u32,
) -> Option<Duration> {
    if let Some(p) = watchdog_pid {
        if p.trim().parse::<u32>().ok() != Some(pid) {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    Some(Duration::from_micros(usec) / 2)
}

/// A one-line summary of the daemon for `STATUS=`.
pub fn summary(m: &Metrics, problems: &[Problem]) -> String {
    let state = match m.health() {
        Health::Starting => return "starting: opening inputs".into(),
        Health::InputsOpen => {
            return match m.metadata_failure() {
                Some((_, failures)) => format!(
                    "starting: inputs open, waiting for metadata ({failures} failed; /health \
                     has the last reason)"
                ),
                None => "starting: inputs open, waiting for metadata".into(),
            }
        }
        Health::Ready if problems.is_empty() => "ready".to_string(),
        Health::Ready => format!(
            "unhealthy ({})",
            problems
                .iter()
                .map(Problem::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    format!("{state}: {}", counts(m))
}

/// "received R, delivered D, discarded X, in flight F; brokers up U/K".
fn counts(m: &Metrics) -> String {
    let topics = m.snapshot_topics();
    let received: u64 = topics.iter().map(|t| t.received).sum();
    let delivered: u64 = topics.iter().map(|t| t.delivered).sum();
    let discarded: u64 = topics.iter().map(|t| t.discarded_total()).sum();
    let in_flight: i64 = topics.iter().map(|t| t.in_flight).sum();
    let (known, up) = m.brokers();
    format!(
        "received {received}, delivered {delivered}, discarded {discarded}, in flight \
         {in_flight}; brokers up {up}/{known}"
    )
}

/// The supervisor's side of systemd: when to look at readiness, status and liveness, and
/// what to send.
pub struct Agent {
    notifier: Option<Notifier>,
    /// Ping interval (half the watchdog timeout), if systemd runs a watchdog for us.
    watchdog: Option<Duration>,
    ready_sent: bool,
    last_status: String,
    next_status: Instant,
    next_check: Instant,
    /// What the last liveness check found (logged when it changes).
    problems: Vec<Problem>,
    /// A send failed: logged once.
    send_failed: bool,
}

impl Agent {
    /// From the environment (`NOTIFY_SOCKET`, `WATCHDOG_USEC`, `WATCHDOG_PID`). A bad
    /// `NOTIFY_SOCKET` is logged, not fatal: dory runs without notifications.
    pub fn from_env(now: Instant) -> Agent {
        let notifier = match Notifier::from_env() {
            Ok(n) => n,
            Err(e) => {
                log::warn!("systemd notifications off: {e}");
                None
            }
        };
        let watchdog = notifier.as_ref().and_then(|_| {
            watchdog_interval(
                std::env::var("WATCHDOG_USEC").ok().as_deref(),
                std::env::var("WATCHDOG_PID").ok().as_deref(),
                std::process::id(),
            )
        });
        if notifier.is_some() {
            log::info!(
                "systemd notifications on{}",
                watchdog.map_or(String::new(), |w| format!(", watchdog ping every {w:?}"))
            );
        }
        Agent::new(notifier, watchdog, now)
    }

    pub fn new(notifier: Option<Notifier>, watchdog: Option<Duration>, now: Instant) -> Agent {
        Agent {
            notifier,
            watchdog,
            ready_sent: false,
            last_status: String::new(),
            next_status: now,
            next_check: now,
            problems: Vec::new(),
            send_failed: false,
        }
    }

    /// When the supervisor should call [`Agent::tick`] next.
    pub fn next_wakeup(&self, now: Instant) -> Instant {
        let mut t = self.next_check;
        if self.notifier.is_some() {
            t = t.min(self.next_status);
            if !self.ready_sent {
                t = t.min(now + READY_POLL);
            }
        }
        t.max(now)
    }

    /// Does what is due at `now`: readiness, liveness check and watchdog ping, status.
    pub fn tick(&mut self, m: &Metrics, now: Instant) {
        let mut state = String::new();
        if now >= self.next_check {
            self.next_check = now + self.watchdog.unwrap_or(CHECK_INTERVAL);
            let problems = m.liveness().check(now);
            if !Problem::same(&problems, &self.problems) {
                if problems.is_empty() {
                    log::info!("every role thread is making progress again");
                } else {
                    for p in &problems {
                        log::error!(
                            "{p}{}",
                            if self.watchdog.is_some() {
                                "; no watchdog ping until it recovers"
                            } else {
                                ""
                            }
                        );
                    }
                }
                self.next_status = now;
            }
            self.problems = problems;
            if self.watchdog.is_some() && self.problems.is_empty() {
                state.push_str("WATCHDOG=1\n");
            }
        }
        if self.notifier.is_none() {
            return;
        }
        if !self.ready_sent && m.health() == Health::Ready {
            self.ready_sent = true;
            state.push_str("READY=1\n");
            self.next_status = now;
        }
        if now >= self.next_status {
            self.next_status = now + STATUS_INTERVAL;
            let line = summary(m, &self.problems);
            if line != self.last_status {
                state.push_str(&format!("STATUS={line}\n"));
                self.last_status = line;
            }
        }
        self.send(&state);
    }

    /// The shutdown signal arrived: `STOPPING=1` with a last status line.
    pub fn stopping(&mut self, m: &Metrics) {
        let (known, up) = m.brokers();
        let line = format!(
            "stopping: delivering {} in flight; brokers up {up}/{known}",
            m.total_in_flight()
        );
        self.send(&format!("STOPPING=1\nSTATUS={line}\n"));
    }

    /// Whether every role thread passed the last liveness check.
    pub fn threads_ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn send(&mut self, state: &str) {
        let Some(n) = &self.notifier else { return };
        if state.is_empty() {
            return;
        }
        if let Err(e) = n.notify(state) {
            if !self.send_failed {
                log::warn!("cannot notify systemd: {e}");
                self.send_failed = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::metrics::MetricsConfig;

    #[test]
    fn watchdog_interval_is_half_the_timeout_and_only_for_us() {
        let half = Some(Duration::from_secs(15));
        assert_eq!(watchdog_interval(Some("30000000"), None, 7), half);
        assert_eq!(watchdog_interval(Some("30000000"), Some("7"), 7), half);
        assert_eq!(watchdog_interval(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
    }

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        assert!(Notifier::connect(OsStr::new("/run/systemd/notify")).is_ok());
        assert!(Notifier::connect(OsStr::new("@dory-test")).is_ok());
        assert!(matches!(
            Notifier::connect(OsStr::new("relative")),
            Err(NotifyError::BadAddress(_))
        ));
    }

    fn pair() -> (tempfile::TempDir, UnixDatagram, Notifier) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).expect("bind");
        rx.set_nonblocking(true).expect("nonblocking");
        let n = Notifier::connect(path.as_os_str()).expect("connect");
        (dir, rx, n)
    }

    fn drain(rx: &UnixDatagram) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = rx.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        out
    }

    #[test]
    fn abstract_socket_receives() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("dory-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let rx = UnixDatagram::bind_addr(&addr).expect("bind abstract");
        rx.set_nonblocking(true).expect("nonblocking");
        let n = Notifier::connect(OsStr::new(&format!("@{name}"))).expect("connect");
        n.notify("READY=1").expect("send");
        assert_eq!(drain(&rx), vec!["READY=1"]);
    }

    #[test]
    fn ready_waits_for_health_and_pings_stop_on_a_stuck_thread() {
        let (_dir, rx, n) = pair();
        let m = Metrics::new(MetricsConfig::default());
        let t0 = Instant::now();
        let mut a = Agent::new(Some(n), Some(Duration::from_secs(1)), t0);
        let hb = m.liveness().register("router", Duration::from_secs(3));

        a.tick(&m, t0);
        assert_eq!(
            drain(&rx),
            vec!["WATCHDOG=1\nSTATUS=starting: opening inputs\n"]
        );
        m.set_health(Health::InputsOpen);
        m.metadata_updated(true);
        let t1 = t0 + Duration::from_millis(100);
        a.tick(&m, t1);
        assert_eq!(
            drain(&rx),
            vec![
                "READY=1\nSTATUS=ready: received 0, delivered 0, discarded 0, in flight 0; \
                 brokers up 0/0\n"
            ]
        );
        // Beating: a ping per interval, the status only when it changes.
        for s in 1..=3 {
            hb.beat();
            a.tick(&m, t0 + Duration::from_secs(s));
            assert_eq!(drain(&rx), vec!["WATCHDOG=1\n"]);
        }
        // No beat from 3 s on: still pinging within the allowance, then not.
        a.tick(&m, t0 + Duration::from_secs(6));
        assert_eq!(drain(&rx), vec!["WATCHDOG=1\n"]);
        assert!(a.threads_ok());
        a.tick(&m, t0 + Duration::from_secs(7));
        assert_eq!(
            drain(&rx),
            vec![
                "STATUS=unhealthy (thread router made no progress for 4s): received 0, \
                 delivered 0, discarded 0, in flight 0; brokers up 0/0\n"
            ]
        );
        assert!(!a.threads_ok());
        // Still stuck: no ping, and the status waits for its interval.
        a.tick(&m, t0 + Duration::from_secs(8));
        assert_eq!(drain(&rx), Vec::<String>::new());
        // Progress again: pings resume.
        hb.beat();
        a.tick(&m, t0 + Duration::from_secs(9));
        assert_eq!(
            drain(&rx),
            vec![
                "WATCHDOG=1\nSTATUS=ready: received 0, delivered 0, discarded 0, in flight 0; \
                 brokers up 0/0\n"
            ]
        );
        a.stopping(&m);
        assert_eq!(
            drain(&rx),
            vec!["STOPPING=1\nSTATUS=stopping: delivering 0 in flight; brokers up 0/0\n"]
        );
    }

    #[test]
    fn without_a_socket_nothing_is_sent_and_nothing_fails() {
        let m = Metrics::new(MetricsConfig::default());
        let t0 = Instant::now();
        let mut a = Agent::new(None, None, t0);
        assert_eq!(a.next_wakeup(t0), t0);
        a.tick(&m, t0);
        assert_eq!(a.next_wakeup(t0), t0 + CHECK_INTERVAL);
        a.stopping(&m);
    }
}
