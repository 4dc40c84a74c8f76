//! The live status page (`GET /`) and its feed (`GET /status.json`) against a running
//! daemon with traffic on the librdkafka mock cluster: the server-rendered tables and the
//! JSON hold the numbers of `/metrics`; then, in headless Chromium (when installed), the
//! numbers the page's script wrote into the DOM hold them too, and a screenshot is kept as
//! `<target>/status-page.png`.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);
const TOPICS: [(&str, u32); 2] = [("page_a", 40), ("page_b", 15)];
const MALFORMED: u64 = 3;

/// The `<table id="{id}">` element of `html` (to its `</table>`).
fn table<'a>(html: &'a str, id: &str) -> &'a str {
    let open = format!("<table id=\"{id}\"");
    let at = html
        .find(&open)
        .unwrap_or_else(|| panic!("no {open} in\n{html}"));
    let rest = &html[at..];
    &rest[..rest.find("</table>").expect("</table>")]
}

/// The row of `table` whose attribute `attr` is `value`, if any.
fn row<'a>(table: &'a str, attr: &str, value: &str) -> Option<&'a str> {
    let open = format!("<tr {attr}=\"{value}\">");
    let at = table.find(&open)?;
    let rest = &table[at..];
    Some(&rest[..rest.find("</tr>").unwrap_or(rest.len())])
}

/// The number in the cell `data-k="{key}"` of `row`.
fn num(row: &str, key: &str) -> i64 {
    let open = format!("data-k=\"{key}\">");
    let at = row
        .find(&open)
        .unwrap_or_else(|| panic!("no {open} in {row}"));
    let text = &row[at + open.len()..];
    let text = &text[..text.find('<').expect("cell end")];
    text.parse()
        .unwrap_or_else(|e| panic!("{key}: {text:?}: {e}"))
}

fn pool(m: &Metrics, state: &str) -> i64 {
    m.samples
        .iter()
        .find(|s| {
            s.name == "dory_pool_bytes" && s.labels.get("state").map(String::as_str) == Some(state)
        })
        .map(|s| s.value as i64)
        .unwrap_or_else(|| panic!("no dory_pool_bytes{{state={state:?}}}"))
}

/// Topics /metrics knows that have any traffic (the page omits an idle `""`).
fn busy_topics(m: &Metrics) -> Vec<String> {
    m.topics()
        .into_iter()
        .filter(|t| !t.is_empty() || m.received(t) != 0)
        .collect()
}

/// Asserts the page's tables (server-rendered or updated by the script) hold `m`'s numbers.
fn check_html(html: &str, m: &Metrics) {
    let topics = table(html, "topics");
    let queues = table(html, "queues");
    let topics_named = busy_topics(m);
    assert_eq!(
        topics.matches("<tr data-topic=").count(),
        topics_named.len(),
        "topic rows: {topics}"
    );
    let (mut received, mut delivered, mut discarded) = (0, 0, 0);
    for t in &topics_named {
        let r = row(topics, "data-topic", t).unwrap_or_else(|| panic!("no row {t:?}: {topics}"));
        let want = [
            ("received", m.received(t)),
            ("delivered", m.delivered(t)),
            ("discarded", m.discarded_total(t)),
            ("in_flight", m.in_flight(t)),
        ];
        for (k, v) in want {
            assert_eq!(num(r, k), v as i64, "topic {t:?} {k}: {r}");
        }
        received += m.received(t);
        delivered += m.delivered(t);
        discarded += m.discarded_total(t);
        let q = row(queues, "data-topic", t).unwrap_or_else(|| panic!("no queue row {t:?}"));
        for k in ["new", "batch", "send_wait", "ack_wait"] {
            assert_eq!(num(q, k), 0, "idle daemon: queue {t:?} {k}: {q}");
        }
    }
    let totals = row(table(html, "totals"), "data-row", "totals").expect("totals row");
    assert_eq!(num(totals, "received"), received as i64);
    assert_eq!(num(totals, "delivered"), delivered as i64);
    assert_eq!(num(totals, "discarded"), discarded as i64);
    assert_eq!(num(totals, "in_flight"), 0);
    assert_eq!(num(totals, "pool_used"), pool(m, "used"));
    assert_eq!(num(totals, "pool_capacity"), pool(m, "capacity"));
    let reasons = table(html, "reasons");
    let by_reason = m.discards_by_reason();
    assert_eq!(reasons.matches("<tr data-reason=").count(), by_reason.len());
    for (reason, n) in &by_reason {
        let r = row(reasons, "data-reason", reason).unwrap_or_else(|| panic!("no {reason}"));
        assert_eq!(num(r, "count"), *n as i64, "{reason}");
    }
    let report = table(html, "report");
    let r = row(report, "data-kind", "malformed").expect("malformed row");
    assert_eq!(num(r, "count"), MALFORMED as i64);
    // Commit points are on by default: every delivered topic has its row.
    let cps = table(html, "commit_points");
    for (t, _) in TOPICS {
        let r = row(cps, "data-topic", t).unwrap_or_else(|| panic!("no commit point {t}"));
        assert_eq!(num(r, "unresolved"), 0, "{r}");
        assert!(num(r, "commit_point") > 0, "{r}");
    }
    // The former index's links and button.
    for needle in [
        "href=\"/discards/json\"",
        "href=\"/commit_points/plain\"",
        "href=\"/metrics\"",
        "action=\"/metadata_update\"",
    ] {
        assert!(html.contains(needle), "missing {needle}");
    }
}

fn chromium() -> Option<PathBuf> {
    let candidates = ["/usr/bin/chromium", "/usr/bin/chromium-browser"];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .or_else(|| {
            std::env::var_os("PATH").and_then(|path| {
                std::env::split_paths(&path)
                    .map(|d| d.join("chromium"))
                    .find(|p| p.exists())
            })
        })
}

/// Headless Chromium on `url` with `extra` arguments; its stdout.
/// `budget_ms` of virtual time lets the page's script poll (every 2 s) before the dump.
fn run_chromium(
    bin: &PathBuf,
    profile: &std::path::Path,
    url: &str,
    budget_ms: u32,
    extra: &[&str],
) -> String {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--virtual-time-budget={budget_ms}"))
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(extra)
    .arg(url);
    let out = run_command(&mut cmd, Duration::from_secs(90));
    assert!(
        out.status.success(),
        "chromium failed: {}\n{}",
        out.status,
        out.stderr
    );
    out.stdout
}

#[test]
fn status_page_matches_metrics_in_html_json_and_browser() {
    let mock = Mock::start(1);
    for (t, _) in TOPICS {
        mock.create_topic(t, 2);
    }
    let mut dory = Dory::start(DoryArgs::new(mock.broker_addrs()));
    dory.wait_ready();
    for (t, n) in TOPICS {
        dory.send_stream(&stream_msgs(t, n));
    }
    let sender = DgramSender::new(dory.dgram_path());
    for _ in 0..MALFORMED {
        sender.send(&[0, 0, 0, 3, 1]);
    }
    dory.wait_received(&[(TOPICS[0].0, 40), (TOPICS[1].0, 15)], WAIT);
    dory.wait_metrics("malformed datagrams counted", WAIT, |m| {
        match m.discarded("", "malformed") {
            MALFORMED => Ok(()),
            n => Err(format!("malformed: {n}")),
        }
    });
    let m = dory.wait_drained(WAIT);
    for (t, n) in TOPICS {
        assert_eq!(m.delivered(t), u64::from(n), "{t}");
    }

    // (1) Without a browser: the server-rendered page and the JSON.
    let (code, html) = dory.http_get("/");
    assert_eq!(code, 200);
    assert!(html.contains("<script>") && !html.contains("src=\"http"));
    check_html(&html, &m);

    let (code, body) = dory.http_get("/status.json");
    assert_eq!(code, 200, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert!(json["now_ms"].as_i64().expect("now_ms") > 0);
    let topics = json["topics"].as_array().expect("topics");
    assert_eq!(topics.len(), busy_topics(&m).len(), "{body}");
    for t in topics {
        let name = t["topic"].as_str().expect("topic name");
        assert_eq!(t["received"], m.received(name), "{name}");
        assert_eq!(t["delivered"], m.delivered(name), "{name}");
        assert_eq!(t["discarded"], m.discarded_total(name), "{name}");
        assert_eq!(t["in_flight"], m.in_flight(name), "{name}");
    }
    let total: u64 = m.received.values().sum();
    assert_eq!(json["totals"]["received"], total);
    assert_eq!(json["pool"]["used"], pool(&m, "used"));
    assert_eq!(json["pool"]["capacity"], pool(&m, "capacity"));
    assert_eq!(
        json["discards_by_reason"],
        serde_json::json!([{"reason": "malformed", "count": MALFORMED}])
    );
    assert!(json["commit_points"]["topics"].is_array(), "{body}");

    // (2) In headless Chromium: the DOM after the script polled, and a screenshot.
    let Some(bin) = chromium() else {
        println!("SKIPPED: chromium not installed");
        return;
    };
    let profile = tempfile::tempdir().expect("profile dir");
    let url = format!("http://{}/", dory.status_addr());
    let dom = run_chromium(&bin, profile.path(), &url, 5000, &["--dump-dom"]);
    let live = &dom[dom
        .find("id=\"live\"")
        .unwrap_or_else(|| panic!("no #live in\n{dom}"))..];
    let live = &live[..live.find("</span>").expect("#live end")];
    assert!(
        live.contains("data-samples=") && live.contains("live: updated"),
        "the script did not update the page: {live}"
    );
    assert!(dom.contains("<svg"), "no sparklines: {dom}");
    check_html(&dom, &dory.metrics());

    // The screenshot under traffic, so the rates and sparklines show something.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (stop, path) = (Arc::clone(&stop), dory.stream_path().to_path_buf());
        thread::spawn(move || {
            let mut s = StreamSender::connect(&path);
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                let n = if round % 10 < 5 { 20 } else { 5 };
                let bytes: Vec<u8> = stream_msgs(TOPICS[round % 2].0, n)
                    .iter()
                    .flat_map(TestMsg::encode)
                    .collect();
                s.send(&bytes);
                round += 1;
                thread::sleep(Duration::from_millis(20));
            }
            s.finish();
        })
    };
    let shot = target_dir().join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        &bin,
        profile.path(),
        &url,
        20_000,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1200,900",
        ],
    );
    stop.store(true, Ordering::Relaxed);
    traffic.join().expect("traffic thread");
    let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("{}: {e}", shot.display()));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(
        png.len() > 10_000,
        "screenshot too small: {} bytes",
        png.len()
    );
    println!("screenshot: {}", shot.display());
    dory.wait_drained(WAIT);
    dory.assert_invariant();
}

/// The default `/metrics` (no `--per-topic-metrics`): every topic's accounting, the rest
/// summed over topics; `/metrics?topic=` has a topic's detail; both add up the same.
#[test]
fn default_metrics_carry_accounting_per_topic_and_detail_on_request() {
    let mock = Mock::start(1);
    for (t, _) in TOPICS {
        mock.create_topic(t, 2);
    }
    let mut args = DoryArgs::new(mock.broker_addrs());
    args.extra_args = vec!["--per-topic-metrics".into(), "accounting".into()];
    let mut dory = Dory::start(args);
    dory.wait_ready();
    for (t, n) in TOPICS {
        dory.send_stream(&stream_msgs(t, n));
    }
    dory.wait_received(&[(TOPICS[0].0, 40), (TOPICS[1].0, 15)], WAIT);
    let m = dory.wait_drained(WAIT);
    for (t, n) in TOPICS {
        assert_eq!(m.received(t), u64::from(n), "{t}");
        assert_eq!(m.delivered(t), u64::from(n), "{t}");
        assert_eq!(m.in_flight(t), 0, "{t}");
    }
    let count = |m: &Metrics, name: &str, labels: &[(&str, &str)]| m.sample(name, labels);
    // Detail families without the topic label, over all topics.
    assert_eq!(
        count(&m, "dory_delivery_latency_seconds_count", &[]),
        Some(55.0),
        "{}",
        m.text
    );
    assert!(
        !m.text.contains("dory_delivery_latency_seconds_count{"),
        "{}",
        m.text
    );
    assert_eq!(count(&m, "dory_possible_duplicates_total", &[]), Some(0.0));
    // One topic's page: its detail, and no other topic.
    let (code, body) = dory.http_get("/metrics?topic=page_a");
    assert_eq!(code, 200, "{body}");
    let a = Metrics::parse(&body).expect("prometheus text");
    assert_eq!(
        count(
            &a,
            "dory_delivery_latency_seconds_count",
            &[("topic", "page_a")]
        ),
        Some(40.0),
        "{body}"
    );
    assert_eq!(a.received("page_a"), 40);
    assert_eq!(a.received("page_b"), 0, "{body}");
    let (code, _) = dory.http_get("/metrics?topic=never_seen");
    assert_eq!(code, 404);
    dory.terminate(WAIT);
}
