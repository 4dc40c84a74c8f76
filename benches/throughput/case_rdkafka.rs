//! The `rdkafka` target: one run of the librdkafka producer process ([`rdk`]) delivering
//! straight to the counting sink, as a [`RunResult`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::case_common::{sink_report, ProgressWatch};
use crate::latency::Histogram;
use crate::opts::Opts;
use crate::procs::{CpuSnapshot, ScratchDir};
use crate::rdk;
use crate::run_result::RunResult;
use crate::sender::Load;
use crate::sink;

/// The application producing with librdkafka straight to the counting sink, in its own
/// process ([`rdk`]). Throughput: go → the sink counting the last record.
pub fn run_rdkafka(
    o: &Opts,
    load: &Load,
    conf: &[(String, String)],
    stall: Duration,
) -> Result<RunResult, String> {
    let dir = ScratchDir::new("rdkafka").map_err(|e| e.to_string())?;
    let n = load.count;
    let sink = sink::Sink::start(&load.topics, o.partitions, !o.no_crc)
        .map_err(|e| format!("sink: {e}"))?;
    let mut conf = conf.to_vec();
    conf.push((
        "bootstrap.servers".into(),
        format!("127.0.0.1:{}", sink.port),
    ));
    let spec = rdk::Spec {
        topics: load
            .topics
            .iter()
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .collect(),
        count: n,
        value_size: load.value_size,
        text_values: load.text_values,
        per_call: load.per_call,
        rate: load.rate,
        conf,
        flush_timeout_s: 60,
    };
    let mut child = rdk::Child::spawn(&spec, dir.path()).map_err(|e| e.to_string())?;
    let fail = |c: &rdk::Child, msg: String| {
        format!("{msg}\n--- librdkafka log tail:\n{}", c.log_tail(15))
    };
    if let Err(e) = child.wait_line("ready", Duration::from_secs(30)) {
        return Err(fail(&child, e));
    }
    // The child's warm-up message, counted by the sink before the clock starts.
    let warmup = sink.records();
    let machine0 = CpuSnapshot::take(&[child.pid()]);
    let start = Instant::now();
    child.go().map_err(|e| format!("rdkafka child: {e}"))?;

    let mut problems = Vec::new();
    let mut watch = ProgressWatch::new(stall);
    let mut done_at = None;
    while done_at.is_none() {
        std::thread::sleep(Duration::from_millis(2));
        let progress = sink.records() - warmup;
        if progress >= n {
            done_at = Some(sink.last_record_at());
            break;
        }
        if let Some(s) = child.exited() {
            problems.push(format!(
                "librdkafka process exited with {s} at {progress}/{n}"
            ));
            break;
        }
        if let Some(p) = watch.check(progress, n) {
            problems.push(p);
            break;
        }
    }
    let report = child
        .wait_line("done", Duration::from_secs(spec.flush_timeout_s + 30))
        .and_then(|j| serde_json::from_str::<rdk::Report>(&j).map_err(|e| e.to_string()));
    let (other_cores, steal_cores) = machine0.others_since(&CpuSnapshot::take(&[child.pid()]));
    if !child.finish(Duration::from_secs(10)) {
        problems.push("librdkafka process did not exit 0".into());
    }
    let report = match report {
        Ok(r) => r,
        Err(e) => return Err(fail(&child, format!("{e}; {}", problems.join("; ")))),
    };
    let rec = sink.records() - warmup;
    if report.delivered != n || report.failed > 0 {
        problems.push(format!(
            "librdkafka: {} delivered, {} failed of {n}{}",
            report.delivered,
            report.failed,
            report
                .first_error
                .as_deref()
                .map_or(String::new(), |e| format!(" (first error: {e})"))
        ));
    }
    if !report.flushed {
        problems.push("librdkafka flush timed out".into());
    }
    if rec != n {
        problems.push(format!("sink counted {rec} records of {n} sent"));
    }
    let mut extra = serde_json::Map::new();
    sink_report(&sink, rec, &mut extra, &mut problems);
    extra.insert("rdkafka_delivered".into(), json!(report.delivered));
    extra.insert("rdkafka_failed".into(), json!(report.failed));
    extra.insert("rdkafka_cpu_s".into(), json!(report.cpu_s));
    extra.insert("rdkafka_secs".into(), json!(report.secs));
    extra.insert("rdkafka_queue_full".into(), json!(report.queue_full));
    extra.insert("latency_counts".into(), json!(report.latency_counts));
    let Some(done_at) = done_at else {
        return Err(fail(&child, format!("incomplete: {}", problems.join("; "))));
    };
    let secs = done_at.saturating_duration_since(start).as_secs_f64();
    let hist = Histogram {
        counts: report.latency_counts.clone(),
    };
    Ok(RunResult {
        msgs_per_s: n as f64 / secs,
        secs,
        cpu_s_per_m: 0.0,
        app_cpu_s_per_m: Some(report.cpu_s / n as f64 * 1e6),
        latency_ms: hist.p50_p99_ms(),
        peak_rss_mib: report.peak_rss_bytes.map(|b| b as f64 / 1048576.0),
        discards: BTreeMap::new(),
        problems,
        other_cores,
        steal_cores,
        // librdkafka's produce calls only fill its own queue (as large as dory's pool), so
        // their duration says nothing of delivery: end to end only.
        sustained_msgs_per_s: None,
        tail_s: None,
        extra,
    })
}
