//! Fault-injection suite: the real dory binary against the librdkafka mock cluster (3
//! brokers, two topics of 6 partitions each, partition p led by broker p % 3 + 1), with
//! faults driven from the test through `rdkafka::mocking` while thousands of small messages
//! flow in through all three inputs (AnyPartition and PartitionKey, a unique id in every
//! value).
//!
//! Every scenario, once dory reports nothing in flight, consumes both topics back (CRC
//! checks on) and asserts, per topic:
//! * `sent = consumed_unique + Σ discarded` — nothing lost without a count (a message that
//!   is both consumed and counted discarded is only tolerated among possible duplicates);
//! * discard reasons only those the fault's class allows, with exact counts where known;
//! * consumed duplicates ≤ `dory_possible_duplicates_total`, and none where the fault cannot
//!   cause them; records unaltered, PartitionKey messages on `(u32)key % 6` (or, where a
//!   downed broker drops out of the mock's Metadata, on Dory's remapping over the partitions
//!   that still have a known leader);
//! * `received = delivered + Σ discarded + in_flight` at every scrape taken meanwhile (a
//!   background scraper), counters never decreasing, the pool empty at the end, and a clean
//!   exit 0 on SIGTERM.
//!
//! One line per scenario is printed to stdout (`cargo test --test faults -- --nocapture`):
//! `FAULTS <scenario>: sent=... delivered=... discarded={...} possible_duplicates=... ...`.
//!
//! Each daemon's log is kept in `target/faults-logs/<scenario>.log`. Daemons are started with
//! [`Dory::start_isolated`] (no inherited descriptors): the mock accepts connections without
//! CLOEXEC, and a daemon of one scenario holding another scenario's mock sockets would keep
//! that scenario's "downed" broker connections open.
//!
//! Data per scenario stays far below the mock's per-partition retention (5 MiB): values are
//! at most 100 bytes, keys at most 16 (so every message takes one 128-byte pool block).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::*;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use RDKafkaRespErr as E;

/// Topics of every scenario (about 65 % / 35 % of the traffic).
const TOPICS: [&str; 2] = ["fault_a", "fault_b"];
const PARTITIONS: i32 = 6;
const BROKERS: i32 = 3;

const DRAIN_TIMEOUT: Duration = Duration::from_secs(45);
const CONSUME_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(15);
/// How often the background scraper checks the accounting invariant.
const SCRAPE_EVERY: Duration = Duration::from_millis(100);

const KAFKA_ERROR: &str = "kafka_error";
const ATTEMPT_LIMIT: &str = "attempt_limit";
const NO_MEMORY: &str = "no_memory";
const SHUTDOWN: &str = "shutdown";

// ---------------------------------------------------------------------------------------------
// Daemon settings
// ---------------------------------------------------------------------------------------------

/// What each scenario sets through `--config` (and `--msg-buffer-max`). Backoffs are kept
/// short (50 ms doubling to 1 s) so recoveries fit the suite's time budget.
#[derive(Clone, Debug)]
struct Settings {
    max_failed_attempts: Option<u32>,
    retry_backoff_ms: u64,
    retry_backoff_max_ms: u64,
    shutdown_max_delay_ms: u64,
    socket_timeout_ms: Option<u64>,
    msg_buffer_max: Option<u64>,
    /// `kafka.idempotence` (dory's default is on).
    idempotence: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_failed_attempts: None,
            retry_backoff_ms: 50,
            retry_backoff_max_ms: 1000,
            shutdown_max_delay_ms: 2000,
            socket_timeout_ms: None,
            msg_buffer_max: None,
            idempotence: true,
        }
    }
}

impl Settings {
    fn toml(&self) -> String {
        let mut s = String::from("[delivery]\n");
        let _ = writeln!(s, "retry_backoff_ms = {}", self.retry_backoff_ms);
        let _ = writeln!(s, "retry_backoff_max_ms = {}", self.retry_backoff_max_ms);
        let _ = writeln!(s, "shutdown_max_delay_ms = {}", self.shutdown_max_delay_ms);
        if let Some(n) = self.max_failed_attempts {
            let _ = writeln!(s, "max_failed_delivery_attempts = {n}");
        }
        let _ = writeln!(s, "[kafka]\nidempotence = {}", self.idempotence);
        if let Some(ms) = self.socket_timeout_ms {
            let _ = writeln!(s, "socket_timeout_ms = {ms}");
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Traffic
// ---------------------------------------------------------------------------------------------

/// `count` small messages with ids `id_base..`: half datagrams, a quarter each UNIX stream
/// and TCP; half AnyPartition, half PartitionKey (random keys); a third with an empty key;
/// values `<id:08>` + up to 90 random bytes.
fn traffic(seed: u64, count: usize, id_base: u32) -> Vec<TestMsg> {
    let mut rng = XorShift::new(seed);
    let ts_base = now_ms();
    (0..count)
        .map(|i| {
            let id = id_base + u32::try_from(i).expect("id fits u32");
            let topic = if rng.percent(65) {
                TOPICS[0]
            } else {
                TOPICS[1]
            };
            let input = match rng.range(0, 4) {
                0 | 1 => Input::Dgram,
                2 => Input::Stream,
                _ => Input::Tcp,
            };
            let route = if rng.percent(50) {
                Route::PartitionKey(rng.next_u64() as u32 as i32)
            } else {
                Route::AnyPartition
            };
            let key = if rng.percent(33) {
                Vec::new()
            } else {
                let n = rng.range(1, 17) as usize;
                rng.bytes(n)
            };
            let mut value = format!("<{id:08}>").into_bytes();
            let extra = rng.range(0, 91) as usize;
            value.extend(rng.bytes(extra));
            TestMsg {
                id,
                input,
                route,
                topic: topic.to_string(),
                ts: ts_base - rng.range(0, 60_000) as i64,
                key,
                value,
            }
        })
        .collect()
}

/// Where the daemon listens (copied out of `Dory` so sender threads need nothing else).
#[derive(Clone, Debug)]
struct Endpoints {
    dgram: PathBuf,
    stream: PathBuf,
    tcp: u16,
    status: SocketAddr,
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        thread::sleep(t - now);
    }
}

/// The fault schedule: each action runs at its offset from the traffic's start (sleeping
/// until then is the fault's timing, not synchronisation). Records when each action really
/// ran and how long the mock took to apply it, so a late fault is reported as such.
struct FaultLog {
    start: Instant,
    entries: Vec<(String, u64, Duration, Duration)>,
}

/// A mock call slower than this means the fault was not applied when scheduled.
const FAULT_CALL_SLOW: Duration = Duration::from_millis(500);

impl FaultLog {
    fn new(start: Instant) -> FaultLog {
        FaultLog {
            start,
            entries: Vec::new(),
        }
    }

    /// Sleeps until `ms` after the start, then runs `action` (named `what`).
    fn at<T>(&mut self, ms: u64, what: &str, action: impl FnOnce() -> T) -> T {
        sleep_until(self.start + Duration::from_millis(ms));
        let began = self.start.elapsed();
        let t = Instant::now();
        let out = action();
        self.entries
            .push((what.to_string(), ms, began, t.elapsed()));
        out
    }

    /// Actions that ran late or whose mock call took long: the fault did not happen as
    /// scheduled (a harness or mock problem, not the daemon's).
    fn problems(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, ms, began, took)| {
                *took > FAULT_CALL_SLOW || *began > Duration::from_millis(*ms) + FAULT_CALL_SLOW
            })
            .map(|(what, ms, began, took)| {
                format!(
                    "fault {what} scheduled at {ms} ms ran at {began:?} and took {took:?}: \
                     not applied as scheduled (mock cluster thread busy?)"
                )
            })
            .collect()
    }

    fn describe(&self) -> String {
        self.entries
            .iter()
            .map(|(what, _, began, _)| format!("{what}@{:.1}s", began.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Sends `msgs` through their inputs, one thread per input (one connection each for the
/// stream inputs), each input's messages spread evenly over `duration` from `start`.
/// Returns when all are written (stream connections closed cleanly), with each message's
/// id and the instant its send completed.
fn send_paced(
    ep: &Endpoints,
    msgs: &[TestMsg],
    start: Instant,
    duration: Duration,
) -> Vec<(u32, Instant)> {
    enum Out {
        D(DgramSender),
        S(StreamSender),
        T(TcpSender),
    }
    thread::scope(|s| {
        let handles: Vec<_> = [Input::Dgram, Input::Stream, Input::Tcp]
            .into_iter()
            .map(|input| {
                let list: Vec<&TestMsg> = msgs.iter().filter(|m| m.input == input).collect();
                s.spawn(move || {
                    let mut out = match input {
                        Input::Dgram => Out::D(DgramSender::new(&ep.dgram)),
                        Input::Stream => Out::S(StreamSender::connect(&ep.stream)),
                        Input::Tcp => Out::T(TcpSender::connect(ep.tcp)),
                    };
                    let n = u32::try_from(list.len().max(1)).expect("count fits u32");
                    let mut sent = Vec::with_capacity(list.len());
                    for (i, m) in list.iter().enumerate() {
                        let i = u32::try_from(i).expect("index fits u32");
                        sleep_until(start + duration * i / n);
                        let bytes = m.encode();
                        match &mut out {
                            Out::D(d) => d.send(&bytes),
                            Out::S(st) => st.send(&bytes),
                            Out::T(t) => t.send(&bytes),
                        }
                        sent.push((m.id, Instant::now()));
                    }
                    match out {
                        Out::D(_) => {}
                        Out::S(st) => st.finish(),
                        Out::T(t) => t.finish(),
                    }
                    sent
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("sender thread panicked"))
            .collect()
    })
}

// ---------------------------------------------------------------------------------------------
// Background scraper: the invariant at every scrape, counters never decreasing
// ---------------------------------------------------------------------------------------------

struct Monitor {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<(u64, Vec<String>)>>,
}

impl Monitor {
    fn start(status: SocketAddr) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || {
            let mut scrapes = 0u64;
            let mut problems: Vec<String> = Vec::new();
            let mut prev: Option<Metrics> = None;
            while !flag.load(Ordering::SeqCst) {
                // Errors (the daemon starting or gone) are not the scraper's business.
                if let Ok((200, body)) = http_get(status, "/metrics", Duration::from_secs(2)) {
                    match Metrics::parse(&body) {
                        Ok(m) => {
                            scrapes += 1;
                            for v in m.invariant_violations() {
                                problems.push(format!("scrape {scrapes}: {v}"));
                            }
                            if let Some(p) = &prev {
                                problems.extend(decreases(p, &m, scrapes));
                            }
                            prev = Some(m);
                        }
                        Err(e) => problems.push(format!("scrape {scrapes}: {e}")),
                    }
                }
                thread::sleep(SCRAPE_EVERY);
            }
            (scrapes, problems)
        });
        Monitor {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the scraper: (scrapes taken, problems seen).
    fn finish(&mut self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.handle
            .take()
            .map(|h| h.join().expect("scraper thread panicked"))
            .unwrap_or_default()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Counters that went down between two scrapes.
fn decreases(prev: &Metrics, now: &Metrics, scrape: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |what: String, a: u64, b: u64| {
        if b < a {
            out.push(format!("scrape {scrape}: {what} went down from {a} to {b}"));
        }
    };
    for t in prev.topics() {
        check(
            format!("received[{t:?}]"),
            prev.received(&t),
            now.received(&t),
        );
        check(
            format!("delivered[{t:?}]"),
            prev.delivered(&t),
            now.delivered(&t),
        );
        check(
            format!("possible_duplicates[{t:?}]"),
            prev.possible_duplicates(&t),
            now.possible_duplicates(&t),
        );
    }
    for ((t, r), &n) in &prev.discarded {
        check(format!("discarded[{t:?},{r}]"), n, now.discarded(t, r));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// A scenario
// ---------------------------------------------------------------------------------------------

/// What a scenario's fault allows and requires.
#[derive(Clone, Debug, Default)]
struct Expect {
    /// Discard reasons that may appear (any other is a failure).
    allowed: Vec<&'static str>,
    /// Discard reasons that must appear (count > 0).
    required: Vec<&'static str>,
    /// Exact discard counts over both topics, where determinable.
    exact: Vec<(&'static str, u64)>,
    /// The fault cannot write a record twice: no consumed duplicates at all.
    no_duplicates: bool,
    /// No connection is lost: `dory_possible_duplicates_total` must stay 0.
    no_possible_duplicates: bool,
    /// The fault loses connections with requests outstanding: possible duplicates > 0.
    possible_duplicates_required: bool,
    /// Brokers that may drop out of Metadata during the fault (the mock lists only brokers
    /// that are up). Their partitions then have no known leader, and Dory's PartitionKey
    /// rule — `(u32)key % n` over the partitions *with a known leader* — maps keys over the
    /// remaining ones, so either placement is accepted.
    vanishing_brokers: Vec<i32>,
}

/// One topic's numbers.
#[derive(Clone, Debug, Default)]
struct TopicTally {
    sent: u64,
    received: u64,
    delivered: u64,
    discards: BTreeMap<String, u64>,
    possible_duplicates: u64,
    consumed_unique: u64,
    duplicates: u64,
    /// Of `duplicates`: copies stored under the same producer id, epoch and sequence number
    /// as the first, i.e. a resend a Kafka broker recognises and drops (the mock does not
    /// check the sequences of non-transactional producers, so it stores them).
    same_sequence: u64,
    /// sent − consumed_unique − Σ discarded (negative: consumed and also counted discarded).
    gap: i64,
}

struct Scenario {
    name: &'static str,
    started: Instant,
    mock: Mock,
    dory: Dory,
    ep: Endpoints,
    monitor: Monitor,
    settings: Settings,
    faults: Option<FaultLog>,
}

impl Scenario {
    /// A fresh 3-broker mock with both topics (leaders spread), and dory started with
    /// `settings`, ready.
    fn start(name: &'static str, settings: Settings) -> Scenario {
        let started = Instant::now();
        let mock = Mock::start(BROKERS);
        for t in TOPICS {
            mock.create_topic(t, PARTITIONS);
        }
        let mut args = DoryArgs::new(mock.broker_addrs());
        args.config_toml = Some(settings.toml());
        if let Some(bytes) = settings.msg_buffer_max {
            args.extra_args = vec!["--msg-buffer-max".into(), bytes.to_string()];
        }
        // Isolated: no other test's mock sockets leak into this daemon (and vice versa).
        let mut dory = Dory::start_isolated(args);
        dory.wait_ready();
        let ep = Endpoints {
            dgram: dory.dgram_path().to_path_buf(),
            stream: dory.stream_path().to_path_buf(),
            tcp: dory.tcp_port(),
            status: dory.status_addr(),
        };
        let monitor = Monitor::start(ep.status);
        Scenario {
            name,
            started,
            mock,
            dory,
            ep,
            monitor,
            settings,
            faults: None,
        }
    }

    fn cluster(
        &self,
    ) -> &rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
        self.mock.cluster()
    }

    /// Sends `msgs` paced over `duration` while `faults` runs on this thread (its log
    /// clocked from the traffic's start); returns when both are done. The fault schedule
    /// is kept in `self.faults`.
    fn drive(
        &mut self,
        msgs: &[TestMsg],
        duration: Duration,
        faults: impl FnOnce(&Mock, &mut FaultLog),
    ) -> Vec<(u32, Instant)> {
        let ep = &self.ep;
        let mock = &self.mock;
        let (sent, log) = thread::scope(|s| {
            let start = Instant::now();
            let sender = s.spawn(move || send_paced(ep, msgs, start, duration));
            let mut log = FaultLog::new(start);
            faults(mock, &mut log);
            (sender.join().expect("sender panicked"), log)
        });
        self.faults = Some(log);
        sent
    }

    /// Waits until every sent message is counted received and nothing is in flight.
    fn drain(&mut self, msgs: &[TestMsg]) -> Metrics {
        let want = per_topic(msgs);
        wait_received(&mut self.dory, &want);
        self.dory.wait_drained(DRAIN_TIMEOUT)
    }

    /// Dory's counter `name` (0 if absent), or a problem if /counters fails.
    fn counter(&self, name: &str) -> Result<u64, String> {
        Ok(self.dory.counters()?.get(name).copied().unwrap_or(0))
    }

    /// SIGTERM with nothing in flight: exit 0 within [`EXIT_TIMEOUT`].
    fn stop_clean(&mut self, problems: &mut Vec<String>) {
        let status = self.dory.terminate(EXIT_TIMEOUT);
        if status.code() != Some(0) {
            problems.push(format!("exit status after SIGTERM (idle): {status}"));
        }
    }

    /// Consumes both topics, compares with what was sent and with `fin` (the final
    /// /metrics), prints the summary line and panics listing every problem.
    fn verify(
        self,
        msgs: &[TestMsg],
        fin: &Metrics,
        expect: &Expect,
        problems: Vec<String>,
        notes: &str,
    ) {
        self.verify_with(msgs, fin, expect, problems, notes, |_, _, _| {});
    }

    /// [`Scenario::verify`], also handing each topic's consumed records to `post` (which
    /// may add problems) before the verdict.
    fn verify_with(
        mut self,
        msgs: &[TestMsg],
        fin: &Metrics,
        expect: &Expect,
        mut problems: Vec<String>,
        notes: &str,
        mut post: impl FnMut(&str, &[Consumed], &mut Vec<String>),
    ) {
        let (scrapes, monitor_problems) = self.monitor.finish();
        let mut notes = format!("{notes} scrapes={scrapes}");
        if let Some(f) = &self.faults {
            problems.extend(f.problems());
            let _ = write!(notes, " faults=[{}]", f.describe());
        }
        if scrapes == 0 {
            problems.push("the background scraper got no /metrics at all".into());
        }
        problems.extend(monitor_problems.into_iter().take(20));
        for v in fin.invariant_violations() {
            problems.push(format!("final /metrics: {v}"));
        }
        if let Some(used) = fin.pool_used() {
            if used != 0 {
                problems.push(format!(
                    "pool not empty with nothing in flight: dory_pool_bytes{{state=\"used\"}} = {used}"
                ));
            }
        }

        let bootstrap = self.mock.bootstrap();
        let by_id: HashMap<u32, &TestMsg> = msgs.iter().map(|m| (m.id, m)).collect();
        let mut tallies: BTreeMap<&str, TopicTally> = BTreeMap::new();
        for topic in TOPICS {
            let sent = msgs.iter().filter(|m| m.topic == topic).count() as u64;
            let delivered = fin.delivered(topic);
            let got = consume_all(&bootstrap, topic, delivered as usize, CONSUME_TIMEOUT);
            let (counts, record_problems) =
                check_records(topic, &got, &by_id, &expect.vanishing_brokers);
            problems.extend(record_problems);
            post(topic, &got, &mut problems);
            let consumed_unique = counts.len() as u64;
            let records = got.len() as u64;
            let discards = fin.discards_of(topic);
            let discarded: u64 = discards.values().sum();
            let same_sequence = if self.settings.idempotence {
                resends(&bootstrap, topic, discarded, &mut problems).resend_copies
            } else {
                0
            };
            let t = TopicTally {
                sent,
                received: fin.received(topic),
                delivered,
                possible_duplicates: fin.possible_duplicates(topic),
                consumed_unique,
                duplicates: records - consumed_unique,
                same_sequence,
                gap: sent as i64 - consumed_unique as i64 - discarded as i64,
                discards,
            };
            check_tally(topic, &t, expect, &counts, msgs, &mut problems);
            tallies.insert(topic, t);
        }
        check_reason_totals(&tallies, expect, &mut problems);

        if self.dory.try_exit().is_none() {
            self.stop_clean(&mut problems);
        }
        let line = summary(
            self.name,
            &tallies,
            self.started.elapsed(),
            &notes,
            &problems,
        );
        println!("{line}");
        save_log(self.name, &self.dory.logs());
        if !problems.is_empty() {
            let mut report = format!(
                "scenario {} failed ({} problem(s)); settings {:?}:\n",
                self.name,
                problems.len(),
                self.settings
            );
            for p in problems.iter().take(60) {
                let _ = writeln!(report, "  {p}");
            }
            if problems.len() > 60 {
                let _ = writeln!(report, "  ... and {} more", problems.len() - 60);
            }
            let _ = writeln!(report, "final /metrics:\n{}", fin.text);
            panic!("{report}");
        }
    }
}

/// Reads `topic`'s stored batches (raw Fetch) and judges its duplicates by Kafka's rules
/// ([`resend_report`]): resends under the original's producer id, epoch, sequence and
/// record count are what a Kafka broker drops (the mock, which checks sequences only for
/// transactional producers, stores them again). Every batch must carry a producer id, and,
/// where nothing was discarded (so no sequence was renumbered over a gap the mock, unlike
/// Kafka, may have written past), each identity's sequences must be gapless from 0.
fn resends(
    bootstrap: &str,
    topic: &str,
    discards: u64,
    problems: &mut Vec<String>,
) -> ResendReport {
    let batches = fetch_topic(bootstrap, topic);
    for b in batches.iter().filter(|b| b.producer_id < 0) {
        problems.push(format!(
            "{topic}/p{}@{}: batch without a producer id under idempotence",
            b.partition, b.base_offset
        ));
    }
    let mut r = resend_report(topic, &batches);
    if discards == 0 {
        problems.append(&mut r.problems);
    }
    if r.max_resend_distance >= 5 {
        problems.push(format!(
            "{topic}: a resend was stored {} distinct batches after its original: a Kafka \
             broker remembers only the last 5",
            r.max_resend_distance
        ));
    }
    r
}

/// Keeps the daemon's output of every scenario in `<target>/faults-logs/<scenario>.log`.
fn save_log(name: &str, logs: &str) {
    let dir = target_dir().join("faults-logs");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join(format!("{name}.log")), logs);
    }
}

fn per_topic(msgs: &[TestMsg]) -> BTreeMap<String, u64> {
    let mut want = BTreeMap::new();
    for m in msgs {
        *want.entry(m.topic.clone()).or_insert(0) += 1;
    }
    want
}

/// Waits until dory counts every message of `want` as received.
fn wait_received(dory: &mut Dory, want: &BTreeMap<String, u64>) -> Metrics {
    let want: Vec<(&str, u64)> = want.iter().map(|(t, &n)| (t.as_str(), n)).collect();
    dory.wait_received(&want, DRAIN_TIMEOUT)
}

/// Checks every consumed record of `topic` against what was sent (id known, right topic,
/// key/value/timestamp unaltered, PartitionKey partition); returns id → copies consumed.
fn check_records(
    topic: &str,
    got: &[Consumed],
    by_id: &HashMap<u32, &TestMsg>,
    vanishing_brokers: &[i32],
) -> (BTreeMap<u32, u64>, Vec<String>) {
    // Partitions whose leader (as created: p % 3 + 1) stays in Metadata.
    let remaining: Vec<i32> = (0..PARTITIONS)
        .filter(|p| !vanishing_brokers.contains(&(p % BROKERS + 1)))
        .collect();
    let mut counts: BTreeMap<u32, u64> = BTreeMap::new();
    let mut problems = Vec::new();
    for c in got {
        let at = format!("{topic}/p{}@{}", c.partition, c.offset);
        let value = c.value.as_deref().unwrap_or_default();
        let Some(id) = value_id(value) else {
            problems.push(format!(
                "{at}: record without an id ({} B value)",
                value.len()
            ));
            continue;
        };
        let Some(m) = by_id.get(&id) else {
            problems.push(format!("{at}: id {id} was never sent"));
            continue;
        };
        *counts.entry(id).or_insert(0) += 1;
        if m.topic != topic {
            problems.push(format!("{at}: id {id} was sent to topic {}", m.topic));
        }
        let want_key = (!m.key.is_empty()).then_some(&m.key[..]);
        if c.key.as_deref() != want_key || value != &m.value[..] {
            problems.push(format!("{at}: id {id}: key or value altered"));
        }
        if c.timestamp != m.ts || c.timestamp_type != TsType::CreateTime {
            problems.push(format!(
                "{at}: id {id}: timestamp {} {:?}, sent {} CreateTime",
                c.timestamp, c.timestamp_type, m.ts
            ));
        }
        if let Some(p) = m.expected_partition(PARTITIONS) {
            let mut ok = vec![p];
            if let (Route::PartitionKey(k), false) = (m.route, vanishing_brokers.is_empty()) {
                ok.push(remaining[(k as u32 as usize) % remaining.len()]);
            }
            if !ok.contains(&c.partition) {
                problems.push(format!(
                    "{at}: id {id} has partition key {:?}: belongs on partition {ok:?}",
                    m.route
                ));
            }
        }
    }
    (counts, problems)
}

/// The per-topic accounting checks.
fn check_tally(
    topic: &str,
    t: &TopicTally,
    expect: &Expect,
    counts: &BTreeMap<u32, u64>,
    msgs: &[TestMsg],
    problems: &mut Vec<String>,
) {
    if t.received != t.sent {
        problems.push(format!(
            "{topic}: received {} != sent {}",
            t.received, t.sent
        ));
    }
    if t.gap > 0 {
        let missing: Vec<u32> = msgs
            .iter()
            .filter(|m| m.topic == topic && !counts.contains_key(&m.id))
            .map(|m| m.id)
            .take(15)
            .collect();
        problems.push(format!(
            "{topic}: {} message(s) LOST without a count: sent {} != consumed_unique {} + \
             discarded {:?} (some ids not consumed: {missing:?})",
            t.gap, t.sent, t.consumed_unique, t.discards
        ));
    }
    let overlap = u64::try_from(-t.gap).unwrap_or(0);
    if overlap > 0 && overlap + t.duplicates > t.possible_duplicates {
        problems.push(format!(
            "{topic}: {overlap} message(s) consumed AND counted discarded (sent {} < \
             consumed_unique {} + discarded {:?}), beyond the possible duplicates ({} \
             possible, {} consumed twice)",
            t.sent, t.consumed_unique, t.discards, t.possible_duplicates, t.duplicates
        ));
    }
    if t.duplicates - t.same_sequence.min(t.duplicates) > t.possible_duplicates {
        let dup_ids: Vec<u32> = counts
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(&id, _)| id)
            .take(15)
            .collect();
        problems.push(format!(
            "{topic}: {} consumed duplicate(s) ({} of them same-sequence resends) but only {} \
             counted as possible duplicates (ids {dup_ids:?})",
            t.duplicates, t.same_sequence, t.possible_duplicates
        ));
    }
    if expect.no_duplicates && t.duplicates > 0 {
        problems.push(format!(
            "{topic}: {} duplicate record(s) under a fault that cannot write twice",
            t.duplicates
        ));
    }
    if expect.no_possible_duplicates && t.possible_duplicates > 0 {
        problems.push(format!(
            "{topic}: {} possible duplicate(s) counted, but no connection was lost",
            t.possible_duplicates
        ));
    }
    if t.delivered > t.consumed_unique {
        problems.push(format!(
            "{topic}: delivered {} > consumed_unique {}: acknowledged messages missing in Kafka",
            t.delivered, t.consumed_unique
        ));
    }
    for (reason, n) in &t.discards {
        if !expect.allowed.contains(&reason.as_str()) {
            problems.push(format!(
                "{topic}: {n} discard(s) with reason {reason:?}, not allowed under this fault \
                 (allowed: {:?})",
                expect.allowed
            ));
        }
    }
}

/// Required and exact discard counts, over both topics.
fn check_reason_totals(
    tallies: &BTreeMap<&str, TopicTally>,
    expect: &Expect,
    problems: &mut Vec<String>,
) {
    let total = |reason: &str| -> u64 {
        tallies
            .values()
            .map(|t| t.discards.get(reason).copied().unwrap_or(0))
            .sum()
    };
    for r in &expect.required {
        if total(r) == 0 {
            problems.push(format!(
                "no discards with reason {r:?}; the fault requires some"
            ));
        }
    }
    for (r, n) in &expect.exact {
        if total(r) != *n {
            problems.push(format!(
                "discards {r:?}: {} , expected exactly {n}",
                total(r)
            ));
        }
    }
    let pd: u64 = tallies.values().map(|t| t.possible_duplicates).sum();
    if expect.possible_duplicates_required && pd == 0 {
        problems.push(
            "no possible duplicates counted, though connections were lost with requests \
             outstanding"
                .into(),
        );
    }
}

fn summary(
    name: &str,
    tallies: &BTreeMap<&str, TopicTally>,
    took: Duration,
    notes: &str,
    problems: &[String],
) -> String {
    let sum = |f: fn(&TopicTally) -> u64| -> u64 { tallies.values().map(f).sum() };
    let mut reasons: BTreeMap<&str, u64> = BTreeMap::new();
    for t in tallies.values() {
        for (r, n) in &t.discards {
            *reasons.entry(r.as_str()).or_insert(0) += n;
        }
    }
    let lost: i64 = tallies.values().map(|t| t.gap.max(0)).sum();
    let overlap: i64 = tallies.values().map(|t| (-t.gap).max(0)).sum();
    let reasons = reasons
        .iter()
        .map(|(r, n)| format!("{r}:{n}"))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "FAULTS {name}: sent={} delivered={} discarded={{{reasons}}} possible_duplicates={} \
         consumed_unique={} duplicates={} same_sequence_resends={} lost={lost}{} ({:.1}s){}{} => {}",
        sum(|t| t.sent),
        sum(|t| t.delivered),
        sum(|t| t.possible_duplicates),
        sum(|t| t.consumed_unique),
        sum(|t| t.duplicates),
        sum(|t| t.same_sequence),
        if overlap > 0 {
            format!(" consumed_and_discarded={overlap}")
        } else {
            String::new()
        },
        took.as_secs_f64(),
        if notes.is_empty() { "" } else { " " },
        notes,
        if problems.is_empty() {
            "ok".to_string()
        } else {
            format!("FAILED ({} problem(s))", problems.len())
        }
    )
}

// The scenarios, by kind, in `tests/faults/` (a crate root's modules are looked for
// beside it, so each names its path).
#[path = "faults/connections.rs"]
mod connections;
#[path = "faults/produce_errors.rs"]
mod produce_errors;
#[path = "faults/shutdown.rs"]
mod shutdown;

// Issue 30: brokers dying with answers outstanding, on the mock and on Tansu.
#[path = "faults/answers_outstanding.rs"]
mod answers_outstanding;
