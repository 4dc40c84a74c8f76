//! The dory targets (`sink`, `sink-variant`, `tansu`): one run of the daemon in front of
//! the counting sink or Tansu, fed by the sender, from start-up to SIGTERM, with the
//! accounting invariant checked on `/metrics` throughout, as a [`RunResult`], with dory's
//! sustained rate besides the end-to-end one (see the module docs of `main.rs`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::case_common::{sink_report, ProgressWatch};
use crate::common::{http_get, Metrics};
use crate::latency::Histogram;
use crate::opts::{Opts, Target};
use crate::procs::{self, free_port, CpuSnapshot, Proc, ScratchDir};
use crate::run_result::RunResult;
use crate::scraper::Scraper;
use crate::sender::{self, Load};
use crate::stream_sender::{self, Clients};
use crate::{sink, tansu};

/// The broker dory delivers to in a run.
enum Broker {
    Sink(sink::Sink),
    Tansu(tansu::Tansu),
}

/// One run of dory for target `t`, with `batch_time_ms` the batch time it runs with (for
/// the sustained rate).
pub fn run_daemon(
    o: &Opts,
    load: &Load,
    t: Target,
    dory: &Path,
    tansu_bin: Option<&Path>,
    stall: Duration,
    batch_time_ms: u64,
) -> Result<RunResult, String> {
    let dir = ScratchDir::new(t.key()).map_err(|e| e.to_string())?;
    let n = load.count;
    let broker = match t {
        _ if t.uses_sink() => Broker::Sink(
            sink::Sink::start(&load.topics, o.partitions, !o.no_crc)
                .map_err(|e| format!("sink: {e}"))?,
        ),
        _ => Broker::Tansu(
            tansu::Tansu::start(
                tansu_bin.expect("tansu located"),
                dir.path(),
                &load.topics,
                o.partitions,
            )
            .map_err(|e| format!("tansu: {e}"))?,
        ),
    };
    let broker_port = match &broker {
        Broker::Sink(s) => s.port,
        Broker::Tansu(t) => t.port,
    };

    // ----- start dory -----
    let sock = dir.path().join("d.sock");
    let status: SocketAddr = format!("127.0.0.1:{}", free_port().map_err(|e| e.to_string())?)
        .parse()
        .unwrap();
    let mut cmd = Command::new(dory);
    cmd.current_dir(dir.path())
        .arg("--broker")
        .arg(format!("127.0.0.1:{broker_port}"))
        .arg("--dgram-socket")
        .arg(&sock)
        .arg("--status-addr")
        .arg(status.to_string())
        .arg("--msg-buffer-max")
        .arg(&o.pool);
    // The stream targets' clients: dory's UNIX stream socket and TCP port.
    let clients = match t {
        Target::StreamOne => Some(Clients { unix: 1, tcp: 0 }),
        Target::StreamMany => Some(Clients {
            unix: o.clients,
            tcp: o.clients,
        }),
        _ => None,
    };
    let stream_sock = dir.path().join("s.sock");
    let tcp: SocketAddr = format!("127.0.0.1:{}", free_port().map_err(|e| e.to_string())?)
        .parse()
        .unwrap();
    if clients.is_some() {
        cmd.arg("--stream-socket")
            .arg(&stream_sock)
            .arg("--tcp-port")
            .arg(tcp.port().to_string());
    }
    // Both TOML extras go into one --config file; the variant's only for its target.
    let variant = o
        .variant_toml
        .as_deref()
        .filter(|_| t == Target::SinkVariant);
    let mut toml: Vec<String> = o
        .daemon_toml
        .iter()
        .chain(variant.map(|v| v.to_string()).as_ref())
        .cloned()
        .collect();
    // More topics than dory tracks by default: raise input.max_topics (unless set).
    let topics = load.topics.len();
    if topics > DORY_DEFAULT_MAX_TOPICS && !toml.iter().any(|t| t.contains("max_topics")) {
        if toml.iter().any(|t| t.contains("[input]")) {
            return Err(format!(
                "{topics} topics: add max_topics = {topics} to the [input] of --daemon-toml"
            ));
        }
        toml.push(format!("[input]\nmax_topics = {topics}"));
    }
    if !toml.is_empty() {
        let p = dir.path().join("extra.toml");
        std::fs::write(&p, toml.join("\n")).map_err(|e| e.to_string())?;
        cmd.arg("--config").arg(p);
    }
    cmd.args(&o.daemon_args);
    if !o.dory_cpus.is_empty() {
        procs::set_cpus(&mut cmd, &o.dory_cpus);
    }
    let mut daemon = Proc::spawn("dory", &mut cmd, dir.path()).map_err(|e| e.to_string())?;
    let fail = |d: &Proc, msg: String| {
        format!(
            "{msg}\n--- dory log tail ({}):\n{}",
            d.log_path().display(),
            d.log_tail(15)
        )
    };

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = daemon.try_exit() {
            return Err(fail(
                &daemon,
                format!("dory exited with {s} before /health was 200"),
            ));
        }
        if let Ok((200, _)) = http_get(status, "/health", Duration::from_secs(2)) {
            break;
        }
        if Instant::now() > deadline {
            return Err(fail(&daemon, "dory not healthy within 30 s".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let pids: Vec<u32> = match &broker {
        Broker::Tansu(t) => vec![daemon.pid(), t.proc.pid()],
        Broker::Sink(_) => vec![daemon.pid()],
    };
    let machine0 = CpuSnapshot::take(&pids);
    let cpu0 = daemon.cpu_s().map_err(|e| e.to_string())?;
    let threads0 = procs::threads_stats(daemon.pid()).unwrap_or_default();
    let broker_cpu0 = match &broker {
        Broker::Tansu(t) => t.proc.cpu_s().ok(),
        Broker::Sink(_) => None,
    };
    let mut problems = Vec::new();
    let mut violations_seen = 0u64;
    let mut scrapes = 0u64;
    let mut check = |a: &Metrics, problems: &mut Vec<String>| {
        scrapes += 1;
        let v = a.invariant_violations();
        if !v.is_empty() {
            violations_seen += 1;
            if problems.len() < 5 {
                problems.push(format!("invariant violated at a scrape: {}", v.join(", ")));
            }
        }
    };
    let scrape = || -> Result<Metrics, String> {
        let (code, body) = http_get(status, "/metrics", Duration::from_secs(5))
            .map_err(|e| format!("GET /metrics: {e}"))?;
        if code != 200 {
            return Err(format!("GET /metrics answered {code}"));
        }
        Metrics::parse(&body)
    };

    // ----- send, wait until the broker side has everything -----
    let sender = {
        let (sock, stream_sock) = (sock.clone(), stream_sock.clone());
        let load = load.clone();
        std::thread::Builder::new()
            .name("sender".into())
            .spawn(move || match clients {
                None => sender::send(&sock, &load, stall).map(|s| (s, Vec::new())),
                Some(c) => stream_sender::send(&stream_sock, tcp, &load, c, stall)
                    .map(|s| (s.sent, s.per_client)),
            })
            .map_err(|e| e.to_string())?
    };
    // sink-scraped: /metrics once a second while the sender runs, as Prometheus would.
    let scraper = if t == Target::SinkScraped {
        Some(Scraper::start(status, Duration::from_secs(1)).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let mut watch = ProgressWatch::new(stall);
    let mut last_scrape = Instant::now();
    // With many topics /metrics is large (a few dozen lines per topic): scraping it costs
    // dory and the bench CPU, so the invariant is checked less often during the run.
    let scrape_every = if t.uses_sink() {
        Duration::from_millis(250).max(Duration::from_micros(2500) * load.topics.len() as u32)
    } else {
        Duration::from_millis(20)
    };
    let mut done_at: Option<Instant> = None;
    let mut settled: Option<Metrics> = None;
    while done_at.is_none() {
        std::thread::sleep(Duration::from_millis(2));
        if let Some(s) = daemon.try_exit() {
            problems.push(format!("dory exited with {s} during the run"));
            break;
        }
        let mut progress = watch.last;
        if let Broker::Sink(s) = &broker {
            progress = s.records();
            if progress >= n {
                done_at = Some(s.last_record_at());
            }
        }
        if last_scrape.elapsed() >= scrape_every {
            last_scrape = Instant::now();
            if let Ok(a) = scrape() {
                check(&a, &mut problems);
                let delivered = sum(&a.delivered);
                let received = sum(&a.received);
                let in_flight = sum(&a.in_flight);
                if t == Target::Tansu {
                    progress = delivered;
                }
                // Everything received and settled: done even if some were discarded.
                if received >= n && in_flight == 0 && done_at.is_none() {
                    if t == Target::Tansu || delivered < n {
                        done_at = Some(last_scrape);
                    }
                    settled = Some(a);
                }
            }
        }
        if let Some(p) = watch.check(progress, n) {
            problems.push(p);
            break;
        }
    }
    let sent = sender.join().map_err(|_| "sender panicked".to_string())?;
    let timed_scrapes = scraper.map(Scraper::finish);
    if let Some(s) = daemon.try_exit() {
        return Err(fail(
            &daemon,
            format!("dory exited with {s}; {}", problems.join("; ")),
        ));
    }
    let (sent, per_client) = match sent {
        Ok(s) => s,
        Err(e) => {
            return Err(fail(
                &daemon,
                format!("sender: {e}; {}", problems.join("; ")),
            ))
        }
    };

    // ----- wait until dory has settled everything, then read CPU and memory -----
    let settle_deadline = Instant::now() + Duration::from_secs(30);
    let final_acc = loop {
        if let Some(a) = settled.take() {
            break Some(a);
        }
        match scrape() {
            Ok(a) => {
                check(&a, &mut problems);
                if sum(&a.received) >= n && sum(&a.in_flight) == 0 {
                    break Some(a);
                }
                if Instant::now() > settle_deadline {
                    problems.push(format!(
                        "not settled within 30 s: received {} in_flight {}",
                        sum(&a.received),
                        sum(&a.in_flight)
                    ));
                    break Some(a);
                }
            }
            Err(e) if Instant::now() > settle_deadline => {
                problems.push(e);
                break None;
            }
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let cpu1 = daemon.cpu_s().map_err(|e| e.to_string())?;
    let threads1 = procs::threads_stats(daemon.pid()).unwrap_or_default();
    let (other_cores, steal_cores) = machine0.others_since(&CpuSnapshot::take(&pids));
    let rss = daemon.peak_rss().ok();
    let broker_cpu1 = match &broker {
        Broker::Tansu(t) => t.proc.cpu_s().ok(),
        Broker::Sink(_) => None,
    };
    // Final scrape after the CPU reading, for the invariant and the discard report.
    let final_acc = scrape().ok().or(final_acc);

    let mut extra = serde_json::Map::new();
    let mut discards = BTreeMap::new();
    let mut latency_ms = None;
    if let Some(a) = &final_acc {
        check(a, &mut problems);
        let (r, d) = (sum(&a.received), sum(&a.delivered));
        discards = a.discards_by_reason();
        let disc: u64 = discards.values().sum();
        if r != n {
            problems.push(format!("dory received {r} of {n} sent"));
        }
        if d + disc != r {
            problems.push(format!("delivered {d} + discarded {disc} != received {r}"));
        }
        extra.insert("received".into(), json!(r));
        extra.insert("delivered".into(), json!(d));
        if let Some(h) = Histogram::from_metrics(a) {
            extra.insert("latency_counts".into(), json!(h.counts));
            latency_ms = h.p50_p99_ms();
        }
    } else {
        problems.push("no final /metrics".into());
    }
    extra.insert("scrapes".into(), json!(scrapes));
    extra.insert("invariant_violations".into(), json!(violations_seen));
    extra.insert("daemon_cpu_s".into(), json!(cpu1 - cpu0));
    // Per thread, CPU seconds per million messages.
    let per_thread: BTreeMap<String, f64> = threads1
        .iter()
        .map(|(name, t1)| {
            let c0 = threads0.get(name).map_or(0.0, |t0| t0.cpu_s);
            (name.clone(), (t1.cpu_s - c0) / n as f64 * 1e6)
        })
        .filter(|(_, c)| *c > 0.0)
        .collect();
    extra.insert("daemon_threads_cpu_s_per_million".into(), json!(per_thread));
    // Per thread, context switches per million messages: [voluntary, involuntary].
    let per_m = |a: u64, b: u64| a.saturating_sub(b) * 1_000_000 / n.max(1);
    let mut per_thread_switches: BTreeMap<String, [u64; 2]> = threads1
        .iter()
        .map(|(name, t1)| {
            let t0 = threads0.get(name).copied().unwrap_or_default();
            (
                name.clone(),
                [
                    per_m(t1.voluntary, t0.voluntary),
                    per_m(t1.involuntary, t0.involuntary),
                ],
            )
        })
        .filter(|(_, [v, i])| v + i > 1000)
        .collect();
    per_thread_switches.insert(
        "sender (app)".into(),
        [per_m(sent.switches.0, 0), per_m(sent.switches.1, 0)],
    );
    extra.insert(
        "switches_per_million_by_thread".into(),
        json!(per_thread_switches),
    );
    extra.insert(
        "sender_secs".into(),
        json!((sent.end - sent.start).as_secs_f64()),
    );
    extra.insert("sendmmsg_calls".into(), json!(sent.calls));
    if !per_client.is_empty() {
        let (lo, hi) = per_client
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &r| {
                (lo.min(r), hi.max(r))
            });
        extra.insert("clients".into(), json!(per_client.len()));
        extra.insert("client_min_msgs_per_s".into(), json!(lo));
        extra.insert("client_max_msgs_per_s".into(), json!(hi));
        let mut sorted = per_client.clone();
        sorted.sort_by(f64::total_cmp);
        extra.insert(
            "client_median_msgs_per_s".into(),
            json!(sorted[sorted.len() / 2]),
        );
    }
    if let Some(s) = &timed_scrapes {
        let mut ms = s.ms.clone();
        ms.sort_by(f64::total_cmp);
        extra.insert("scrapes_timed".into(), json!(ms.len()));
        extra.insert("scrape_median_ms".into(), json!(ms.get(ms.len() / 2)));
        extra.insert("scrape_max_ms".into(), json!(ms.last()));
        extra.insert("scrape_max_body_bytes".into(), json!(s.max_body_bytes));
        extra.insert("scrape_gzip".into(), json!(s.all_gzip));
        if s.failed > 0 {
            problems.push(format!(
                "{} scrape(s) failed: {}",
                s.failed,
                s.first_error.as_deref().unwrap_or("")
            ));
        }
        if ms.is_empty() {
            problems.push("no scrape while the sender ran".into());
        }
    }
    extra.insert("sender_cpu_s".into(), json!(sent.cpu_s));
    if let (Some(a), Some(b)) = (broker_cpu0, broker_cpu1) {
        extra.insert("broker_cpu_s".into(), json!(b - a));
    }
    if let Broker::Sink(s) = &broker {
        let rec = s.records();
        sink_report(s, rec, &mut extra, &mut problems);
        if let Some(a) = &final_acc {
            let d = sum(&a.delivered);
            if rec != d {
                problems.push(format!(
                    "sink counted {rec} records, dory says {d} delivered"
                ));
            }
        }
    }

    let (exit, killed) = daemon.terminate(Duration::from_secs(30));
    if killed || !exit.is_some_and(|s| s.success()) {
        problems.push(format!(
            "dory exit after SIGTERM: {exit:?}{}",
            if killed { " (killed)" } else { "" }
        ));
    }
    if let Broker::Tansu(mut tb) = broker {
        tb.proc.terminate(Duration::from_secs(5));
    }
    let Some(done_at) = done_at else {
        return Err(fail(
            &daemon,
            format!("incomplete: {}", problems.join("; ")),
        ));
    };
    let secs = done_at.saturating_duration_since(sent.start).as_secs_f64();
    let send_secs = (sent.end - sent.start).as_secs_f64();
    let tail_s = done_at.saturating_duration_since(sent.end).as_secs_f64();
    Ok(RunResult {
        msgs_per_s: n as f64 / secs,
        secs,
        sustained_msgs_per_s: sustained(n, send_secs, tail_s, batch_time_ms),
        tail_s: Some(tail_s),
        cpu_s_per_m: (cpu1 - cpu0) / n as f64 * 1e6,
        app_cpu_s_per_m: Some(sent.cpu_s / n as f64 * 1e6),
        latency_ms,
        peak_rss_mib: rss.map(|b| b as f64 / 1048576.0),
        discards,
        problems,
        other_cores,
        steal_cores,
        extra,
    })
}

/// dory's `input.max_topics` default (`src/config`): the bench raises it for more topics.
const DORY_DEFAULT_MAX_TOPICS: usize = 10_000;

/// Longer than the batch time that the delivery tail may last for a run to count as one
/// where dory kept up: the last batch's Produce round trip and the sink's count (1-2 ms
/// here). A backlog shorter than this could pass unseen: it would flatter the sustained
/// rate by at most this over the sender's duration (under 2 % in a 1M-message run).
const TAIL_MARGIN: Duration = Duration::from_millis(25);

/// dory's sustained rate: `n` messages over the sender's duration, the same clock the
/// ceiling is timed by. The end-to-end rate also counts the delivery tail, the final
/// partial batches waiting out the batch time: a fixed latency (100 ms by default) that
/// weighs 5-7 % in a run of 1M messages and would weigh less in a longer one. The sender
/// blocks whenever dory does not take its datagrams, so its duration is dory's intake; it
/// is also dory's delivery rate only if dory did not fall behind, i.e. if the tail was no
/// longer than the batch time plus [`TAIL_MARGIN`]. `None` if it was longer (dory had a
/// backlog when the sender finished) or the run is degenerate.
fn sustained(n: u64, send_secs: f64, tail_s: f64, batch_time_ms: u64) -> Option<f64> {
    let bound = Duration::from_millis(batch_time_ms) + TAIL_MARGIN;
    (send_secs > 0.0 && tail_s <= bound.as_secs_f64()).then(|| n as f64 / send_secs)
}

/// Σ of a per-topic metric.
fn sum(per_topic: &BTreeMap<String, u64>) -> u64 {
    per_topic.values().sum()
}
