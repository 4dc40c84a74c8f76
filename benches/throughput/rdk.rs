//! The librdkafka anchor: the application linking librdkafka (the `rdkafka` crate's
//! `BaseProducer`) and producing directly to the counting sink, instead of handing its
//! messages to dory. Same messages as the sender's (same topics in the same round robin,
//! no key, the same values with the sequence number in front), same sink.
//!
//! It runs in its own process, so its CPU time is its own: the bench starts its own
//! executable with [`CHILD_FLAG`] and a JSON [`Spec`]. The child creates the producer,
//! fetches metadata, sends one warm-up message to [`WARMUP_TOPIC`] and flushes it (so the
//! idempotent producer has its producer id), says `ready` on stdout and waits for a line on stdin; then it sends
//! everything (waiting in `poll` whenever librdkafka's queue is full, paced like the
//! sender with a rate), `flush`es with a bounded timeout and prints `done` with a JSON
//! [`Report`]: its CPU time (`getrusage`, all threads) from the go to the end of the
//! flush, peak RSS, delivery reports by outcome, and a histogram of `send` → delivery
//! report latency with dory's bucket bounds.

use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child as ProcChild, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::ClientContext;
use serde::{Deserialize, Serialize};

use crate::latency::{self, Histogram};
use crate::sender::{self, Load};

/// First argument that makes the bench executable act as the librdkafka producer.
pub const CHILD_FLAG: &str = "--rdkafka-child";

/// The topic of the one warm-up message the child sends before it says `ready` (the sink
/// counts it: the parent subtracts it).
pub const WARMUP_TOPIC: &str = "dory-bench-warmup";

/// What the child sends, and librdkafka's configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spec {
    pub topics: Vec<String>,
    pub count: u64,
    pub value_size: usize,
    pub text_values: bool,
    pub per_call: usize,
    pub rate: Option<u64>,
    /// librdkafka properties, bootstrap.servers included.
    pub conf: Vec<(String, String)>,
    /// Bound for the final flush.
    pub flush_timeout_s: u64,
}

/// What the child reports at the end.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Delivery reports without error.
    pub delivered: u64,
    /// Delivery reports with an error.
    pub failed: u64,
    pub first_error: Option<String>,
    /// `flush` returned Ok within its timeout.
    pub flushed: bool,
    /// utime + stime of the whole process (all librdkafka threads), go → flushed.
    pub cpu_s: f64,
    /// go → flushed.
    pub secs: f64,
    /// Times `send` found librdkafka's queue full and waited in `poll`.
    pub queue_full: u64,
    pub peak_rss_bytes: Option<u64>,
    /// `send` → delivery report, per bucket of dory's latency bounds.
    pub latency_counts: Vec<u64>,
}

/// Counts delivery reports. Called from `poll`/`flush` on the producing thread.
struct Ctx {
    epoch: Instant,
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    latency: Vec<AtomicU64>,
}

impl ClientContext for Ctx {
    /// librdkafka's log lines go to stderr, i.e. `rdkafka.log` in the run's directory.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let t = self.epoch.elapsed().as_secs_f64();
        eprintln!("{t:9.3} {level:?} {fac} {message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let t = self.epoch.elapsed().as_secs_f64();
        eprintln!("{t:9.3} error {error}: {reason}");
    }
}

impl ProducerContext for Ctx {
    /// Microseconds since `epoch` at `send`.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_us: usize) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                let now_us = self.epoch.elapsed().as_micros() as u64;
                let lat = Duration::from_micros(now_us.saturating_sub(sent_us as u64));
                self.latency[latency::bucket(lat)].fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                let mut first = self.first_error.lock().unwrap();
                if first.is_none() {
                    *first = Some(e.to_string());
                }
            }
        }
    }
}

/// The child's `main`: returns the exit code.
pub fn child_main(spec_json: &str) -> i32 {
    match child(spec_json) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rdkafka child: {e}");
            1
        }
    }
}

fn child(spec_json: &str) -> Result<(), String> {
    let spec: Spec = serde_json::from_str(spec_json).map_err(|e| format!("bad spec: {e}"))?;
    if spec.topics.is_empty() || spec.per_call == 0 {
        return Err("no topics or per_call 0".into());
    }
    let mut cfg = ClientConfig::new();
    for (k, v) in &spec.conf {
        cfg.set(k, v);
    }
    let ctx = Ctx {
        epoch: Instant::now(),
        delivered: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        first_error: Mutex::new(None),
        latency: (0..Histogram::buckets())
            .map(|_| AtomicU64::new(0))
            .collect(),
    };
    let producer: BaseProducer<Ctx> = cfg
        .create_with_context(ctx)
        .map_err(|e| format!("creating the producer: {e}"))?;
    // Connected and the topics known before the clock starts, as dory is before the
    // sender starts (it answers /health).
    producer
        .client()
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| format!("metadata: {e}"))?;
    // One message to a topic of its own, flushed: an idempotent producer holds messages
    // until it has a producer id, which librdkafka first asks for up to 0.5 s after it
    // starts; a long-running application has it long since.
    producer
        .send(BaseRecord::<[u8], [u8], usize>::with_opaque_to(WARMUP_TOPIC, 0).payload(b"warm-up"))
        .map_err(|(e, _)| format!("warm-up send: {e}"))?;
    producer
        .flush(Duration::from_secs(10))
        .map_err(|e| format!("warm-up flush: {e}"))?;
    let c = producer.context();
    if c.delivered.load(Ordering::Relaxed) != 1 {
        return Err(format!(
            "warm-up message not delivered: {:?}",
            c.first_error.lock().unwrap()
        ));
    }
    c.delivered.store(0, Ordering::Relaxed);
    for b in &c.latency {
        b.store(0, Ordering::Relaxed);
    }
    let mut out = io::stdout().lock();
    writeln!(out, "ready").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    let mut line = String::new();
    io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("waiting for go: {e}"))?;
    if line.trim() != "go" {
        return Err(format!("expected go, got {line:?}"));
    }

    // The sender's values: template i mod len, value = its last value_size bytes.
    let load = Load {
        count: spec.count,
        value_size: spec.value_size,
        topics: spec.topics.iter().map(|t| t.as_bytes().to_vec()).collect(),
        per_call: spec.per_call,
        rate: spec.rate,
        text_values: spec.text_values,
    };
    let values: Vec<Vec<u8>> = sender::templates(&load)
        .into_iter()
        .map(|t| t[t.len() - spec.value_size..].to_vec())
        .collect();
    let mut value = vec![0u8; spec.value_size];
    let cpu0 = process_cpu_s();
    let start = Instant::now();
    let mut queue_full = 0u64;
    let epoch = producer.context().epoch;
    for seq in 0..spec.count {
        if let Some(rate) = spec.rate {
            // Paced as the sender: a burst of per_call messages every per_call / rate s.
            // Delivery reports are served once per burst; the wait is a sleep (librdkafka's
            // poll counts in whole milliseconds, so a shorter poll would spin).
            if seq % spec.per_call as u64 == 0 {
                producer.poll(Duration::ZERO);
                let due = start + Duration::from_secs_f64(seq as f64 / rate.max(1) as f64);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
        }
        value.copy_from_slice(&values[(seq % values.len() as u64) as usize]);
        sender::stamp_value(&mut value, seq);
        let topic = &spec.topics[(seq % spec.topics.len() as u64) as usize];
        let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(
            topic,
            epoch.elapsed().as_micros() as usize,
        )
        .payload(&value[..]);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    queue_full += 1;
                    producer.poll(Duration::from_millis(1));
                    record = r;
                }
                Err((e, _)) => return Err(format!("send #{seq}: {e}")),
            }
        }
        if seq % 1024 == 1023 {
            producer.poll(Duration::ZERO);
        }
    }
    let flushed = producer
        .flush(Duration::from_secs(spec.flush_timeout_s))
        .is_ok();
    let secs = start.elapsed().as_secs_f64();
    let cpu_s = process_cpu_s() - cpu0;
    let c = producer.context();
    let report = Report {
        delivered: c.delivered.load(Ordering::Relaxed),
        failed: c.failed.load(Ordering::Relaxed),
        first_error: c.first_error.lock().unwrap().clone(),
        flushed,
        cpu_s,
        secs,
        queue_full,
        peak_rss_bytes: peak_rss(),
        latency_counts: c
            .latency
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect(),
    };
    let json = serde_json::to_string(&report).map_err(|e| e.to_string())?;
    writeln!(out, "done {json}").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())
}

/// utime + stime of this whole process, in seconds.
fn process_cpu_s() -> f64 {
    // SAFETY: getrusage fills a struct we own; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

// ----- the parent's side -----

/// The running child: its stdout lines arrive on a channel (read by a thread), its
/// stderr (librdkafka's log) goes to `<dir>/rdkafka.log`. Killed on drop if still running.
pub struct Child {
    proc: ProcChild,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    log: std::path::PathBuf,
}

impl Child {
    pub fn spawn(spec: &Spec, dir: &Path) -> io::Result<Child> {
        let exe = std::env::current_exe()?;
        let log = dir.join("rdkafka.log");
        let json = serde_json::to_string(spec).map_err(io::Error::other)?;
        let mut proc = Command::new(exe)
            .arg(CHILD_FLAG)
            .arg(json)
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let stdin = proc.stdin.take();
        let stdout = proc.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name("rdkafka-out".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { return };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Child {
            proc,
            stdin,
            lines,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// The next stdout line starting with `prefix` (the rest of it), within `timeout`.
    pub fn wait_line(&self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return Ok(rest.trim().to_string());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "no {prefix:?} from the rdkafka child in {timeout:?}"
                    ))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!("rdkafka child closed stdout before {prefix:?}"))
                }
            }
        }
    }

    pub fn go(&mut self) -> io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("stdin gone"))?;
        stdin.write_all(b"go\n")?;
        stdin.flush()
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.try_wait().ok().flatten()
    }

    /// Waits for the exit up to `timeout`, then kills it. Returns whether it exited 0.
    pub fn finish(&mut self, timeout: Duration) -> bool {
        self.stdin = None;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.exited() {
                return s.success();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.proc.kill();
        let _ = self.proc.wait();
        false
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.proc.kill();
            let _ = self.proc.wait();
        }
    }
}
