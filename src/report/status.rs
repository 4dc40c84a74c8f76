//! HTTP status interface (§11 of the reference): Dory's status endpoints with their exact
//! plain-text and JSON shapes, plus `/health` and Prometheus `/metrics`.
//!
//! One named thread serves requests one at a time through tiny_http, reading only `Metrics`;
//! its single action is asking the router for a metadata refresh.

use std::fmt::Write as _;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use crossbeam_channel::{Sender, TrySendError};
use serde::Serialize;

use crate::report::metrics::{
    now_ms, Counter, DiscardReason, DiscardReport, Health, Metrics, TopicRange,
};

/// Location printed for every counter. Dory printed the C++ source location; monitoring
/// only needs it to be stable.
pub const COUNTER_LOCATION: &str = "[dory, 0]";

const TEXT: &str = "text/plain";
const JSON: &str = "application/json";
const HTML: &str = "text/html";
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the status server asks of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusRequest {
    /// `POST /metadata_update`: refresh metadata now.
    MetadataUpdate,
}

/// The status server's channel ends.
#[derive(Clone, Debug)]
pub struct StatusControl {
    pub to_router: Sender<StatusRequest>,
}

impl StatusControl {
    pub fn new(to_router: Sender<StatusRequest>) -> Self {
        StatusControl { to_router }
    }
}

/// A running status server; `stop` shuts it down.
pub struct StatusHandle {
    server: Arc<tiny_http::Server>,
    stopping: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    addr: SocketAddr,
}

impl StatusHandle {
    /// The bound address (useful when binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Unblocks the server thread and waits for it to finish its current request.
    pub fn stop(self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.server.unblock();
        if self.thread.join().is_err() {
            log::error!("status thread panicked");
        }
    }
}

/// Binds `addr` now (a failure is a start-up error for the caller to report) and serves on a
/// thread named "status".
pub fn spawn(
    addr: SocketAddr,
    metrics: &'static Metrics,
    control: StatusControl,
) -> io::Result<StatusHandle> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let server = tiny_http::Server::from_listener(listener, None).map_err(io::Error::other)?;
    let server = Arc::new(server);
    let stopping = Arc::new(AtomicBool::new(false));
    let thread = {
        let server = Arc::clone(&server);
        let stopping = Arc::clone(&stopping);
        thread::Builder::new()
            .name("status".into())
            .spawn(move || serve(&server, &stopping, metrics, &control))?
    };
    log::info!("status server listening on {addr}");
    Ok(StatusHandle {
        server,
        stopping,
        thread,
        addr,
    })
}

fn serve(
    server: &tiny_http::Server,
    stopping: &AtomicBool,
    metrics: &Metrics,
    control: &StatusControl,
) {
    loop {
        let request = match server.recv() {
            Ok(r) => r,
            Err(e) => {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                // An accept error (e.g. out of file descriptors): pause briefly so a
                // persistent one does not spin this thread.
                log::warn!("status server: {e}");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let reply = handle(
            metrics,
            control,
            request.method().as_str(),
            request.url(),
            now_ms(),
        );
        let mut response =
            tiny_http::Response::from_data(reply.body.into_bytes()).with_status_code(reply.status);
        if let Ok(h) = tiny_http::Header::from_bytes(&b"Content-Type"[..], reply.content_type) {
            response.add_header(h);
        }
        if let Err(e) = request.respond(response) {
            log::debug!("status server: writing response: {e}");
        }
    }
}

/// One HTTP response, before it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    fn ok(content_type: &'static str, body: String) -> Self {
        Reply {
            status: 200,
            content_type,
            body,
        }
    }

    fn text(status: u16, body: String) -> Self {
        Reply {
            status,
            content_type: TEXT,
            body,
        }
    }
}

/// Routes one request (`url` may carry a query string, which is ignored); `now_ms` is the
/// request time in milliseconds since the epoch.
pub fn handle(m: &Metrics, control: &StatusControl, method: &str, url: &str, now_ms: u64) -> Reply {
    m.inc(Counter::MongooseHttpRequest);
    let path = url.split('?').next().unwrap_or(url);
    match method {
        "GET" => get(m, path, now_ms),
        "POST" if path == "/metadata_update" => {
            match control.to_router.try_send(StatusRequest::MetadataUpdate) {
                Ok(()) => {}
                // A refresh is already pending (full) or the router is gone (shutdown):
                // either way the answer is the same.
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    log::debug!("status: metadata update request not queued");
                }
            }
            let secs = now_ms / 1000;
            Reply::text(
                200,
                format!("Metadata update initiated at {secs} {}\n", ctime(secs)),
            )
        }
        "POST" => Reply::text(404, "[not found: try /metadata_update]".into()),
        other => Reply::text(501, format!("[request method {other} not implemented]")),
    }
}

fn get(m: &Metrics, path: &str, now_ms: u64) -> Reply {
    let secs = now_ms / 1000;
    match path {
        "/server_info/plain" | "/server_info/json" => m.inc(Counter::MongooseGetServerInfoRequest),
        "/counters/plain" | "/counters/json" => m.inc(Counter::MongooseGetCountersRequest),
        "/discards/plain" | "/discards/json" => {
            m.inc(Counter::MongooseGetDiscardsRequest);
            m.note_discard_query(secs);
        }
        "/queues/plain" | "/queues/json" => m.inc(Counter::MongooseGetQueueStatsRequest),
        "/metadata_fetch_time/plain" | "/metadata_fetch_time/json" => {
            m.inc(Counter::MongooseGetMetadataFetchTimeRequest)
        }
        _ => {}
    }
    match path {
        "/server_info/plain" => Reply::ok(TEXT, header_plain(m, secs)),
        "/server_info/json" => Reply::ok(JSON, server_info_json(m, secs)),
        "/counters/plain" => Reply::ok(TEXT, counters_plain(m, secs)),
        "/counters/json" => Reply::ok(JSON, counters_json(m, secs)),
        "/discards/plain" => Reply::ok(TEXT, discards_plain(m, secs)),
        "/discards/json" => Reply::ok(JSON, discards_json(m, secs)),
        "/queues/plain" => Reply::ok(TEXT, queues_plain(m, secs)),
        "/queues/json" => Reply::ok(JSON, queues_json(m, secs)),
        "/metadata_fetch_time/plain" => Reply::ok(TEXT, metadata_fetch_time_plain(m, now_ms)),
        "/metadata_fetch_time/json" => Reply::ok(JSON, metadata_fetch_time_json(m, now_ms)),
        "/health" => health(m),
        "/metrics" => Reply::ok(PROMETHEUS, prometheus(m)),
        p if p.starts_with("/msg_debug/") => match m.msg_debug().and_then(|d| d.handle_http(p)) {
            Some(r) => Reply::text(r.status, r.body),
            None => Reply::text(404, "message debug logging is not configured\n".into()),
        },
        _ => Reply::ok(HTML, index_html()),
    }
}

// ----- time -----

/// C `ctime()` text of `secs` in local time, without the newline
/// (e.g. `Thu Aug 21 14:26:57 2014`).
pub fn ctime(secs: u64) -> String {
    let Ok(t) = libc::time_t::try_from(secs) else {
        return String::from("?");
    };
    // SAFETY: `tm` is plain old data for which all-zero bytes are a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers refer to live, properly aligned locals; localtime_r is the
    // re-entrant variant and writes only into `tm`.
    let converted = unsafe { libc::localtime_r(&t, &mut tm) };
    if converted.is_null() {
        return String::from("?");
    }
    let mut buf = [0u8; 64];
    // SAFETY: `buf` is writable for `buf.len()` bytes, the format is NUL-terminated and `tm`
    // was filled in by localtime_r. strftime writes at most `buf.len()` bytes and returns
    // how many it wrote (0 on overflow).
    let n = unsafe {
        libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%a %b %e %H:%M:%S %Y".as_ptr(),
            &tm,
        )
    };
    String::from_utf8_lossy(&buf[..n.min(buf.len())]).into_owned()
}

// ----- plain text -----

fn header_plain(m: &Metrics, now_secs: u64) -> String {
    let mut out = String::new();
    push_id_lines(&mut out, m);
    let _ = writeln!(out, "now: {now_secs} {}", ctime(now_secs));
    out
}

/// The `pid`, `version` and `since` lines every plain response starts with.
fn push_id_lines(out: &mut String, m: &Metrics) {
    let since = m.start_secs();
    let _ = writeln!(out, "pid: {}", m.pid());
    let _ = writeln!(out, "version: {}", m.version());
    let _ = writeln!(out, "since: {since} {}", ctime(since));
}

fn counters_plain(m: &Metrics, now_secs: u64) -> String {
    let mut out = header_plain(m, now_secs);
    out.push('\n');
    for &c in Counter::ALL {
        let _ = writeln!(out, "{COUNTER_LOCATION}.{}={}", c.name(), m.get(c));
    }
    out
}

fn discards_plain(m: &Metrics, now_secs: u64) -> String {
    let reports = m.discard_reports(now_secs);
    let mut out = header_plain(m, now_secs);
    let _ = writeln!(
        out,
        "report interval in seconds: {}",
        reports.interval.as_secs()
    );
    out.push('\n');
    report_plain(
        &mut out,
        "current (unfinished) reporting period",
        &reports.current,
    );
    if let Some(f) = &reports.finished {
        out.push('\n');
        report_plain(&mut out, "latest finished reporting period", f);
    }
    out
}

fn report_plain(out: &mut String, title: &str, r: &DiscardReport) {
    let _ = writeln!(out, "{title}:");
    let _ = writeln!(out, "    report ID: {}", r.id);
    let _ = writeln!(
        out,
        "    start time: {} {}",
        r.start_secs,
        ctime(r.start_secs)
    );
    let _ = writeln!(out, "    malformed msg count: {}", r.malformed_count);
    let _ = writeln!(
        out,
        "    UNIX stream unclean disconnect count: {}",
        r.unix_stream_unclean_count
    );
    let _ = writeln!(
        out,
        "    TCP unclean disconnect count: {}",
        r.tcp_unclean_count
    );
    let _ = writeln!(
        out,
        "    unsupported API key msg count: {}",
        r.unsupported_api_key_count
    );
    let _ = writeln!(
        out,
        "    unsupported version msg count: {}",
        r.unsupported_version_count
    );
    let _ = writeln!(out, "    bad topic msg count: {}", r.bad_topic_count);

    // Each optional group: only when non-empty, preceded by one empty line.
    fn group<T>(out: &mut String, items: &[T], mut line: impl FnMut(&mut String, &T)) {
        if !items.is_empty() {
            out.push('\n');
            for item in items {
                line(out, item);
            }
        }
    }
    group(out, &r.recent_malformed, |o, p| {
        let _ = writeln!(o, "    recent malformed msg: {}", b64_len_bracketed(p));
    });
    group(out, &r.recent_unix_stream_unclean, |o, p| {
        let _ = writeln!(
            o,
            "    recent UNIX stream unclean disconnect msg: {}",
            b64_len_bracketed(p)
        );
    });
    group(out, &r.recent_tcp_unclean, |o, p| {
        let _ = writeln!(
            o,
            "    recent TCP unclean disconnect msg: {}",
            b64_len_bracketed(p)
        );
    });
    group(out, &r.unsupported_versions, |o, (v, n)| {
        let _ = writeln!(o, "    unsupported msg version: {v} count: {n}");
    });
    group(out, &r.recent_bad_topics, |o, t| {
        let _ = writeln!(o, "    recent bad topic: {}", len_bracketed(t));
    });
    group(out, &r.recent_too_long, |o, p| {
        let _ = writeln!(o, "    recent too long msg: {}", b64_len_bracketed(p));
    });
    group(out, &r.rate_limit, |o, (t, n)| {
        let _ = writeln!(
            o,
            "    rate limit discard topic: {} count {n}",
            len_bracketed(t)
        );
    });
    group(out, &r.discard_topics, |o, (t, range)| {
        let _ = writeln!(o, "    discard topic: {}", range_plain(t, range));
    });
    group(out, &r.possible_duplicate_topics, |o, (t, range)| {
        let _ = writeln!(o, "    possible duplicate topic: {}", range_plain(t, range));
    });
}

fn range_plain(topic: &[u8], r: &TopicRange) -> String {
    format!(
        "{} begin [{}] end [{}] count {}",
        len_bracketed(topic),
        r.min_timestamp,
        r.max_timestamp,
        r.count
    )
}

/// `<raw byte length>[<topic>]`, the topic shown as (lossy) UTF-8.
fn len_bracketed(topic: &[u8]) -> String {
    format!("{}[{}]", topic.len(), String::from_utf8_lossy(topic))
}

/// `<base64 length>[<base64>]`.
fn b64_len_bracketed(raw: &[u8]) -> String {
    let b = BASE64.encode(raw);
    format!("{}[{b}]", b.len())
}

/// Topics with messages in the batch, send-wait or ack-wait state, sorted by name, and the
/// totals of all four states over every topic.
struct Queues {
    sending: Vec<(String, i64, i64, i64)>,
    totals: [i64; 4],
}

fn queues(m: &Metrics) -> Queues {
    let mut sending = Vec::new();
    let mut totals = [0i64; 4];
    let mut topics = m.snapshot_topics();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    for t in topics {
        let q = t.queued;
        for (total, v) in totals
            .iter_mut()
            .zip([q.new, q.batch, q.send_wait, q.ack_wait])
        {
            *total += v;
        }
        if q.batch != 0 || q.send_wait != 0 || q.ack_wait != 0 {
            let name = String::from_utf8_lossy(&t.name).into_owned();
            sending.push((name, q.batch, q.send_wait, q.ack_wait));
        }
    }
    Queues { sending, totals }
}

fn queues_plain(m: &Metrics, now_secs: u64) -> String {
    let q = queues(m);
    let mut out = header_plain(m, now_secs);
    out.push('\n');
    for (topic, batch, send_wait, ack_wait) in &q.sending {
        let _ = writeln!(
            out,
            "batch: {batch:10}  send_wait: {send_wait:10}  ack_wait: {ack_wait:10}  topic: [{topic}]"
        );
    }
    if !q.sending.is_empty() {
        out.push('\n');
    }
    let [new, batch, send_wait, ack_wait] = q.totals;
    let _ = writeln!(out, "{new:10} total new");
    let _ = writeln!(out, "{batch:10} total batch");
    let _ = writeln!(out, "{send_wait:10} total send_wait");
    let _ = writeln!(out, "{ack_wait:10} total ack_wait");
    let all = new + batch + send_wait + ack_wait;
    let _ = writeln!(
        out,
        "{all:10} total (all states: new + batch + send_wait + ack_wait)"
    );
    out
}

fn metadata_fetch_time_plain(m: &Metrics, now_ms: u64) -> String {
    let (updated, modified) = m.metadata_times_ms();
    let mut out = String::new();
    push_id_lines(&mut out, m);
    for (label, ms) in [
        ("now (milliseconds since epoch)", now_ms),
        (
            "metadata last updated at (milliseconds since epoch)",
            updated,
        ),
        (
            "metadata last modified at (milliseconds since epoch)",
            modified,
        ),
    ] {
        let _ = writeln!(out, "{label}: {ms} {}", ctime(ms / 1000));
    }
    out
}

// ----- JSON -----

/// Pretty JSON with the original's 4-space indentation. Key order is the field order of
/// the structs below.
fn to_json<T: Serialize>(value: &T) -> String {
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
    if let Err(e) = value.serialize(&mut ser) {
        // Cannot happen for these types (string keys, no maps); keep serving anyway.
        log::error!("status: serializing JSON: {e}");
        return String::from("{}\n");
    }
    buf.push(b'\n');
    String::from_utf8_lossy(&buf).into_owned()
}

#[derive(Serialize)]
struct ServerInfoJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
}

fn server_info_json(m: &Metrics, now_secs: u64) -> String {
    to_json(&ServerInfoJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_secs,
    })
}

#[derive(Serialize)]
struct CountersJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
    counters: Vec<CounterJson>,
}

#[derive(Serialize)]
struct CounterJson {
    location: &'static str,
    name: &'static str,
    value: u64,
}

fn counters_json(m: &Metrics, now_secs: u64) -> String {
    to_json(&CountersJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_secs,
        counters: Counter::ALL
            .iter()
            .map(|&c| CounterJson {
                location: COUNTER_LOCATION,
                name: c.name(),
                value: m.get(c),
            })
            .collect(),
    })
}

#[derive(Serialize)]
struct MetadataFetchTimeJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
    last_updated: u64,
    last_modified: u64,
}

fn metadata_fetch_time_json(m: &Metrics, now_ms: u64) -> String {
    let (last_updated, last_modified) = m.metadata_times_ms();
    to_json(&MetadataFetchTimeJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_ms,
        last_updated,
        last_modified,
    })
}

#[derive(Serialize)]
struct QueuesJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
    sending: Vec<QueueTopicJson>,
    new: i64,
}

#[derive(Serialize)]
struct QueueTopicJson {
    topic: String,
    batch: i64,
    send_wait: i64,
    ack_wait: i64,
}

fn queues_json(m: &Metrics, now_secs: u64) -> String {
    let q = queues(m);
    to_json(&QueuesJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_secs,
        sending: q
            .sending
            .into_iter()
            .map(|(topic, batch, send_wait, ack_wait)| QueueTopicJson {
                topic,
                batch,
                send_wait,
                ack_wait,
            })
            .collect(),
        new: q.totals[0],
    })
}

#[derive(Serialize)]
struct DiscardsJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
    interval: u64,
    unfinished_report: ReportJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_report: Option<ReportJson>,
}

#[derive(Serialize)]
struct ReportJson {
    id: u64,
    start_time: u64,
    malformed_msg_count: u64,
    unix_stream_unclean_disconnect_count: u64,
    tcp_unclean_disconnect_count: u64,
    unsupported_api_key_msg_count: u64,
    unsupported_version_msg_count: u64,
    bad_topic_msg_count: u64,
    recent_malformed: Vec<String>,
    unix_stream_unclean_disconnect: Vec<String>,
    tcp_unclean_disconnect: Vec<String>,
    unsupported_msg_version: Vec<VersionCountJson>,
    recent_bad_topic: Vec<String>,
    recent_too_long_msg: Vec<String>,
    rate_limit_discard: Vec<TopicCountJson>,
    discard_topic: Vec<TopicRangeJson>,
    possible_duplicate_topic: Vec<TopicRangeJson>,
}

#[derive(Serialize)]
struct VersionCountJson {
    version: i16,
    count: u64,
}

#[derive(Serialize)]
struct TopicCountJson {
    topic: String,
    count: u64,
}

#[derive(Serialize)]
struct TopicRangeJson {
    topic: String,
    min_timestamp: i64,
    max_timestamp: i64,
    count: u64,
}

impl ReportJson {
    fn new(r: &DiscardReport) -> Self {
        let b64 = |v: &[Box<[u8]>]| v.iter().map(|p| BASE64.encode(p)).collect();
        let lossy = |t: &[u8]| String::from_utf8_lossy(t).into_owned();
        let ranges = |v: &[(Arc<[u8]>, TopicRange)]| {
            v.iter()
                .map(|(t, r)| TopicRangeJson {
                    topic: lossy(t),
                    min_timestamp: r.min_timestamp,
                    max_timestamp: r.max_timestamp,
                    count: r.count,
                })
                .collect()
        };
        ReportJson {
            id: r.id,
            start_time: r.start_secs,
            malformed_msg_count: r.malformed_count,
            unix_stream_unclean_disconnect_count: r.unix_stream_unclean_count,
            tcp_unclean_disconnect_count: r.tcp_unclean_count,
            unsupported_api_key_msg_count: r.unsupported_api_key_count,
            unsupported_version_msg_count: r.unsupported_version_count,
            bad_topic_msg_count: r.bad_topic_count,
            recent_malformed: b64(&r.recent_malformed),
            unix_stream_unclean_disconnect: b64(&r.recent_unix_stream_unclean),
            // Dory filled this from the UNIX stream list (quirk 12); this is the TCP list.
            tcp_unclean_disconnect: b64(&r.recent_tcp_unclean),
            unsupported_msg_version: r
                .unsupported_versions
                .iter()
                .map(|&(version, count)| VersionCountJson { version, count })
                .collect(),
            recent_bad_topic: r.recent_bad_topics.iter().map(|t| lossy(t)).collect(),
            recent_too_long_msg: b64(&r.recent_too_long),
            rate_limit_discard: r
                .rate_limit
                .iter()
                .map(|(t, count)| TopicCountJson {
                    topic: lossy(t),
                    count: *count,
                })
                .collect(),
            discard_topic: ranges(&r.discard_topics),
            possible_duplicate_topic: ranges(&r.possible_duplicate_topics),
        }
    }
}

fn discards_json(m: &Metrics, now_secs: u64) -> String {
    let reports = m.discard_reports(now_secs);
    to_json(&DiscardsJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_secs,
        interval: reports.interval.as_secs(),
        unfinished_report: ReportJson::new(&reports.current),
        finished_report: reports.finished.as_ref().map(ReportJson::new),
    })
}

// ----- health and Prometheus -----

fn health(m: &Metrics) -> Reply {
    match m.health() {
        Health::Ready => Reply::text(200, "ok\n".into()),
        Health::InputsOpen => Reply::text(
            503,
            "not ready: waiting for the first metadata fetch\n".into(),
        ),
        Health::Starting => Reply::text(503, "not ready: inputs not open yet\n".into()),
    }
}

/// A label value escaped per the text exposition format; non-UTF-8 bytes become U+FFFD.
fn label(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn prometheus(m: &Metrics) -> String {
    let topics = m.snapshot_topics();
    let labels: Vec<String> = topics.iter().map(|t| label(&t.name)).collect();
    let mut out = String::new();
    fn family(out: &mut String, name: &str, kind: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
    }

    family(&mut out, "dory_up", "gauge", "Whether the daemon is up.");
    out.push_str("dory_up 1\n");

    let per_topic = [
        (
            "dory_messages_received_total",
            "counter",
            "Messages received from clients, per topic (\"\" = no parsable topic).",
        ),
        (
            "dory_messages_delivered_total",
            "counter",
            "Messages acknowledged by Kafka, per topic.",
        ),
    ];
    for (i, (name, kind, help)) in per_topic.into_iter().enumerate() {
        family(&mut out, name, kind, help);
        for (t, l) in topics.iter().zip(&labels) {
            let v = if i == 0 { t.received } else { t.delivered };
            let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {v}");
        }
    }

    let name = "dory_messages_discarded_total";
    family(
        &mut out,
        name,
        "counter",
        "Messages discarded, per topic and reason.",
    );
    for (t, l) in topics.iter().zip(&labels) {
        for reason in DiscardReason::ALL {
            let v = t.discarded(reason);
            if v != 0 {
                let r = reason.as_str();
                let _ = writeln!(out, "{name}{{topic=\"{l}\",reason=\"{r}\"}} {v}");
            }
        }
    }

    let name = "dory_messages_in_flight";
    family(
        &mut out,
        name,
        "gauge",
        "Messages received but neither delivered nor discarded yet, per topic.",
    );
    for (t, l) in topics.iter().zip(&labels) {
        let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {}", t.in_flight);
    }

    let name = "dory_possible_duplicates_total";
    family(
        &mut out,
        name,
        "counter",
        "Messages sent again after an unacknowledged send, per topic.",
    );
    for (t, l) in topics.iter().zip(&labels) {
        let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {}", t.possible_duplicates);
    }

    let (capacity, used) = m.pool();
    family(&mut out, "dory_pool_bytes", "gauge", "Message pool bytes.");
    let _ = writeln!(out, "dory_pool_bytes{{state=\"used\"}} {used}");
    let _ = writeln!(out, "dory_pool_bytes{{state=\"capacity\"}} {capacity}");
    out
}

// ----- index -----

fn index_html() -> String {
    let mut out = String::from(
        "<!DOCTYPE html>\n<html>\n<head><title>dory</title></head>\n<body>\n<h1>dory</h1>\n<ul>\n",
    );
    for (path, what) in [
        ("server_info", "server info"),
        ("counters", "counters"),
        ("discards", "discard reports"),
        ("queues", "queued messages"),
        ("metadata_fetch_time", "metadata fetch time"),
    ] {
        let _ = writeln!(
            out,
            "<li>{what}: <a href=\"/{path}/plain\">plain</a> <a href=\"/{path}/json\">json</a></li>"
        );
    }
    out.push_str("<li><a href=\"/health\">health</a></li>\n");
    out.push_str("<li><a href=\"/metrics\">metrics (Prometheus)</a></li>\n");
    out.push_str(
        "</ul>\n<form action=\"/metadata_update\" method=\"post\">\n\
         <input type=\"submit\" value=\"Update metadata\">\n</form>\n</body>\n</html>\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::metrics::{MetricsConfig, QueueState, NO_TOPIC};
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn populated() -> Metrics {
        let m = Metrics::new(MetricsConfig {
            discard_report_interval: Duration::from_secs(600),
            bad_msg_prefix_size: 4,
            max_topics: 100,
            version: "1.2.3-test".into(),
        });
        let t = m.topic_id(b"zeta").unwrap();
        let q = m.topic_id(b"al\"pha\n\\").unwrap();
        m.received(t, 10);
        m.delivered(t, 3);
        m.discarded(t, DiscardReason::RateLimit, 2, 100, 200);
        m.discarded(q, DiscardReason::BadTopic, 1, 5, 5);
        m.received(q, 1);
        m.possible_duplicates(t, 1, 150, 150);
        m.received(NO_TOPIC, 3);
        m.input_discard(DiscardReason::Malformed, b"\x01\x02\x03\x04\x05");
        m.unclean_disconnect(false, b"ab");
        m.unclean_disconnect(true, b"tcp!");
        m.queue_add(t, QueueState::New, 2);
        m.queue_add(t, QueueState::Batch, 3);
        m.queue_add(t, QueueState::AckWait, 1);
        m.inc(Counter::MsgCreate);
        m.set_pool(1024, 256);
        m
    }

    fn control() -> (StatusControl, crossbeam_channel::Receiver<StatusRequest>) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        (StatusControl::new(tx), rx)
    }

    fn expected_header(m: &Metrics, now: u64) -> String {
        let s = m.start_secs();
        format!(
            "pid: {}\nversion: 1.2.3-test\nsince: {s} {}\nnow: {now} {}\n",
            std::process::id(),
            ctime(s),
            ctime(now)
        )
    }

    #[test]
    fn ctime_has_c_shape() {
        let s = ctime(1_408_656_417);
        assert_eq!(s.len(), 24, "{s:?}");
        let parts: Vec<&str> = s.split(' ').filter(|p| !p.is_empty()).collect();
        assert_eq!(parts.len(), 5, "{s:?}");
        assert!(["Wed", "Thu", "Fri"].contains(&parts[0]));
        assert_eq!(parts[1], "Aug");
        assert_eq!(parts[4], "2014");
        assert_eq!(&s[13..14], ":");
        // %e pads single-digit days with a space, as ctime does.
        let feb5 = ctime(86_400 * 35 + 43_200);
        assert_eq!(&feb5[4..10], "Feb  5", "{feb5:?}");
    }

    #[test]
    fn server_info_shapes() {
        let m = populated();
        let now = m.start_secs() + 1;
        assert_eq!(header_plain(&m, now), expected_header(&m, now));
        let json: serde_json::Value = serde_json::from_str(&server_info_json(&m, now)).unwrap();
        let text = server_info_json(&m, now);
        assert!(text.starts_with("{\n    \"pid\": "), "{text}");
        assert_order(&text, &["\"pid\"", "\"version\"", "\"since\"", "\"now\""]);
        assert_eq!(json["version"], "1.2.3-test");
        assert_eq!(json["now"], now);
    }

    fn assert_order(text: &str, keys: &[&str]) {
        let mut at = 0;
        for k in keys {
            let found = text[at..].find(k);
            assert!(found.is_some(), "{k} missing or out of order in {text}");
            at += found.unwrap_or(0) + k.len();
        }
    }

    #[test]
    fn counters_shapes() {
        let m = populated();
        let now = m.start_secs() + 1;
        let plain = counters_plain(&m, now);
        let expected_start = format!("{}\n[dory, 0].MsgCreate=1\n", expected_header(&m, now));
        assert!(plain.starts_with(&expected_start), "{plain}");
        assert!(plain.contains("\n[dory, 0].AckErrorUndocumented=0\n"));
        assert_eq!(plain.lines().count(), 5 + Counter::COUNT);
        let text = counters_json(&m, now);
        assert_order(
            &text,
            &[
                "\"pid\"",
                "\"version\"",
                "\"since\"",
                "\"now\"",
                "\"counters\"",
            ],
        );
        assert_order(&text, &["\"location\"", "\"name\"", "\"value\""]);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let counters = json["counters"].as_array().unwrap();
        assert_eq!(counters.len(), Counter::COUNT);
        assert_eq!(counters[0]["name"], "MsgCreate");
        assert_eq!(counters[0]["value"], 1);
        assert_eq!(counters[0]["location"], "[dory, 0]");
    }

    #[test]
    fn discards_plain_shape() {
        let m = populated();
        let now = m.start_secs() + 1;
        let s = m.start_secs();
        let expected = format!(
            "{}report interval in seconds: 600\n\
             \n\
             current (unfinished) reporting period:\n\
             \x20   report ID: 0\n\
             \x20   start time: {s} {}\n\
             \x20   malformed msg count: 1\n\
             \x20   UNIX stream unclean disconnect count: 1\n\
             \x20   TCP unclean disconnect count: 1\n\
             \x20   unsupported API key msg count: 0\n\
             \x20   unsupported version msg count: 0\n\
             \x20   bad topic msg count: 1\n\
             \n\
             \x20   recent malformed msg: 8[AQIDBA==]\n\
             \n\
             \x20   recent UNIX stream unclean disconnect msg: 4[YWI=]\n\
             \n\
             \x20   recent TCP unclean disconnect msg: 8[dGNwIQ==]\n\
             \n\
             \x20   recent bad topic: 8[al\"pha\n\\]\n\
             \n\
             \x20   rate limit discard topic: 4[zeta] count 2\n\
             \n\
             \x20   discard topic: 4[zeta] begin [100] end [200] count 2\n\
             \n\
             \x20   possible duplicate topic: 4[zeta] begin [150] end [150] count 1\n",
            expected_header(&m, now),
            ctime(s)
        );
        assert_eq!(discards_plain(&m, now), expected);
    }

    #[test]
    fn discards_plain_with_finished_period() {
        let m = populated();
        let now = m.start_secs() + 600;
        let text = discards_plain(&m, now);
        assert!(text.contains(
            "    bad topic msg count: 0\n\nlatest finished reporting period:\n    report ID: 0\n"
        ));
        assert!(text.contains("current (unfinished) reporting period:\n    report ID: 1\n"));
    }

    #[test]
    fn discards_json_shape() {
        let m = populated();
        let now = m.start_secs() + 1;
        let text = discards_json(&m, now);
        assert_order(
            &text,
            &[
                "\"pid\"",
                "\"version\"",
                "\"since\"",
                "\"now\"",
                "\"interval\"",
                "\"unfinished_report\"",
            ],
        );
        assert_order(
            &text,
            &[
                "\"id\"",
                "\"start_time\"",
                "\"malformed_msg_count\"",
                "\"unix_stream_unclean_disconnect_count\"",
                "\"tcp_unclean_disconnect_count\"",
                "\"unsupported_api_key_msg_count\"",
                "\"unsupported_version_msg_count\"",
                "\"bad_topic_msg_count\"",
                "\"recent_malformed\"",
                "\"unix_stream_unclean_disconnect\"",
                "\"tcp_unclean_disconnect\"",
                "\"unsupported_msg_version\"",
                "\"recent_bad_topic\"",
                "\"recent_too_long_msg\"",
                "\"rate_limit_discard\"",
                "\"discard_topic\"",
                "\"possible_duplicate_topic\"",
            ],
        );
        assert_order(
            &text,
            &[
                "\"topic\"",
                "\"min_timestamp\"",
                "\"max_timestamp\"",
                "\"count\"",
            ],
        );
        assert!(!text.contains("\"finished_report\""));
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let r = &json["unfinished_report"];
        assert_eq!(json["interval"], 600);
        assert_eq!(r["id"], 0);
        assert_eq!(r["start_time"], m.start_secs());
        assert_eq!(r["recent_malformed"][0], "AQIDBA==");
        assert_eq!(r["unix_stream_unclean_disconnect"][0], "YWI=");
        assert_eq!(r["tcp_unclean_disconnect"][0], "dGNwIQ==");
        assert_eq!(r["recent_bad_topic"][0], "al\"pha\n\\");
        assert_eq!(r["rate_limit_discard"][0]["topic"], "zeta");
        assert_eq!(r["rate_limit_discard"][0]["count"], 2);
        assert_eq!(r["discard_topic"][0]["min_timestamp"], 100);
        assert_eq!(r["discard_topic"][0]["max_timestamp"], 200);
        assert_eq!(r["possible_duplicate_topic"][0]["count"], 1);
        assert_eq!(r["unsupported_msg_version"], serde_json::json!([]));

        let text = discards_json(&m, m.start_secs() + 600);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["finished_report"]["id"], 0);
        assert_eq!(json["finished_report"]["malformed_msg_count"], 1);
        assert_eq!(json["unfinished_report"]["id"], 1);
    }

    #[test]
    fn unsupported_versions_listed() {
        let m = populated();
        m.received(NO_TOPIC, 2);
        m.unsupported_version(7, b"");
        m.unsupported_version(2, b"");
        let now = m.start_secs() + 1;
        let plain = discards_plain(&m, now);
        assert!(plain.contains(
            "\n\n    unsupported msg version: 2 count: 1\n    unsupported msg version: 7 count: 1\n"
        ));
        let json: serde_json::Value = serde_json::from_str(&discards_json(&m, now)).unwrap();
        assert_eq!(
            json["unfinished_report"]["unsupported_msg_version"],
            serde_json::json!([{"version": 2, "count": 1}, {"version": 7, "count": 1}])
        );
    }

    #[test]
    fn queues_shapes() {
        let m = populated();
        let now = m.start_secs() + 1;
        let expected = format!(
            "{}\nbatch: {:>10}  send_wait: {:>10}  ack_wait: {:>10}  topic: [zeta]\n\n\
             {:>10} total new\n{:>10} total batch\n{:>10} total send_wait\n\
             {:>10} total ack_wait\n\
             {:>10} total (all states: new + batch + send_wait + ack_wait)\n",
            expected_header(&m, now),
            3,
            0,
            1,
            2,
            3,
            0,
            1,
            6
        );
        assert_eq!(queues_plain(&m, now), expected);
        let text = queues_json(&m, now);
        assert_order(
            &text,
            &[
                "\"pid\"",
                "\"version\"",
                "\"since\"",
                "\"now\"",
                "\"sending\"",
                "\"new\"",
            ],
        );
        assert_order(
            &text,
            &["\"topic\"", "\"batch\"", "\"send_wait\"", "\"ack_wait\""],
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json["sending"],
            serde_json::json!([{"topic": "zeta", "batch": 3, "send_wait": 0, "ack_wait": 1}])
        );
        assert_eq!(json["new"], 2);

        let empty = Metrics::new(MetricsConfig::default());
        let text = queues_plain(&empty, 5);
        assert!(!text.contains("topic:"));
        assert!(text.contains(&format!("\n\n{:>10} total new\n", 0)));
    }

    #[test]
    fn metadata_fetch_time_shapes() {
        let m = populated();
        let now_ms = m.start_secs() * 1000 + 1234;
        let plain = metadata_fetch_time_plain(&m, now_ms);
        let s = m.start_secs();
        let expected = format!(
            "pid: {}\nversion: 1.2.3-test\nsince: {s} {}\n\
             now (milliseconds since epoch): {now_ms} {}\n\
             metadata last updated at (milliseconds since epoch): 0 {}\n\
             metadata last modified at (milliseconds since epoch): 0 {}\n",
            std::process::id(),
            ctime(s),
            ctime(now_ms / 1000),
            ctime(0),
            ctime(0)
        );
        assert_eq!(plain, expected);
        m.metadata_updated(true);
        let text = metadata_fetch_time_json(&m, now_ms);
        assert_order(
            &text,
            &[
                "\"pid\"",
                "\"version\"",
                "\"since\"",
                "\"now\"",
                "\"last_updated\"",
                "\"last_modified\"",
            ],
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["now"], now_ms);
        assert!(json["last_updated"].as_u64().unwrap() > 0);
        assert_eq!(json["last_updated"], json["last_modified"]);
    }

    #[test]
    fn prometheus_shape() {
        let m = populated();
        let text = prometheus(&m);
        for line in [
            "# TYPE dory_up gauge\ndory_up 1\n",
            "# TYPE dory_messages_received_total counter\n",
            "dory_messages_received_total{topic=\"\"} 3\n",
            "dory_messages_received_total{topic=\"zeta\"} 10\n",
            "dory_messages_received_total{topic=\"al\\\"pha\\n\\\\\"} 1\n",
            "dory_messages_delivered_total{topic=\"zeta\"} 3\n",
            "dory_messages_discarded_total{topic=\"zeta\",reason=\"rate_limit\"} 2\n",
            "dory_messages_discarded_total{topic=\"al\\\"pha\\n\\\\\",reason=\"bad_topic\"} 1\n",
            "dory_messages_discarded_total{topic=\"\",reason=\"malformed\"} 1\n",
            "dory_messages_discarded_total{topic=\"\",reason=\"unclean_disconnect\"} 2\n",
            "dory_messages_in_flight{topic=\"zeta\"} 5\n",
            "dory_messages_in_flight{topic=\"\"} 0\n",
            "dory_possible_duplicates_total{topic=\"zeta\"} 1\n",
            "dory_pool_bytes{state=\"used\"} 256\n",
            "dory_pool_bytes{state=\"capacity\"} 1024\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("reason=\"shutdown\""));
        for line in text.lines() {
            assert!(
                line.starts_with("# ") || line.starts_with("dory_"),
                "{line}"
            );
        }
        assert_eq!(label(b"a\xffb"), "a\u{fffd}b");
    }

    #[test]
    fn routing_and_status_codes() {
        let m = populated();
        let (c, rx) = control();
        let now = m.start_secs() * 1000 + 5;
        let r = handle(&m, &c, "GET", "/", now);
        assert_eq!((r.status, r.content_type), (200, HTML));
        assert!(r
            .body
            .contains("action=\"/metadata_update\" method=\"post\""));
        assert!(r.body.contains("href=\"/discards/json\""));
        assert_eq!(handle(&m, &c, "GET", "/nonsense", now).content_type, HTML);
        let r = handle(&m, &c, "GET", "/counters/json?x=1", now);
        assert_eq!((r.status, r.content_type), (200, JSON));
        let r = handle(&m, &c, "POST", "/metadata_update", now);
        let secs = now / 1000;
        assert_eq!(
            r.body,
            format!("Metadata update initiated at {secs} {}\n", ctime(secs))
        );
        assert_eq!(rx.try_recv(), Ok(StatusRequest::MetadataUpdate));
        // Channel full: still answered.
        assert_eq!(handle(&m, &c, "POST", "/metadata_update", now).status, 200);
        assert_eq!(handle(&m, &c, "POST", "/metadata_update", now).status, 200);
        let r = handle(&m, &c, "POST", "/counters/json", now);
        assert_eq!(
            (r.status, r.body.as_str()),
            (404, "[not found: try /metadata_update]")
        );
        let r = handle(&m, &c, "DELETE", "/", now);
        assert_eq!(
            (r.status, r.body.as_str()),
            (501, "[request method DELETE not implemented]")
        );
        let r = handle(&m, &c, "GET", "/msg_debug/get_topics", now);
        assert_eq!(r.status, 404);
        assert_eq!(r.body, "message debug logging is not configured\n");
        assert_eq!(handle(&m, &c, "GET", "/health", now).status, 503);
        m.set_health(Health::Ready);
        let r = handle(&m, &c, "GET", "/health", now);
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
        assert_eq!(m.get(Counter::MongooseHttpRequest), 11);
        assert_eq!(m.get(Counter::MongooseGetCountersRequest), 1);
    }

    #[test]
    fn discard_query_is_recorded() {
        let m = populated();
        let (c, _rx) = control();
        let later = m.start_secs() + 1000;
        assert!(m.check_discard_query(later));
        handle(&m, &c, "GET", "/discards/plain", later * 1000);
        assert!(!m.check_discard_query(later));
        assert_eq!(m.get(Counter::MongooseGetDiscardsRequest), 1);
    }

    /// Minimal HTTP/1.1 client: one request, read to EOF. Returns (status, headers, body).
    fn fetch(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_string(), body.to_string())
    }

    #[test]
    fn http_server_end_to_end() {
        let m: &'static Metrics = Box::leak(Box::new(populated()));
        let (c, rx) = control();
        let h = spawn("127.0.0.1:0".parse().unwrap(), m, c).unwrap();
        let addr = h.local_addr();
        assert_ne!(addr.port(), 0);
        // The port is taken: binding it again is a start-up error.
        let (c2, _rx2) = control();
        assert!(spawn(addr, m, c2).is_err());

        let cases: [(&str, &str, u16, &str, &str); 14] = [
            ("GET", "/", 200, "text/html", "<form"),
            (
                "GET",
                "/server_info/plain",
                200,
                "text/plain",
                "version: 1.2.3-test\n",
            ),
            (
                "GET",
                "/server_info/json",
                200,
                "application/json",
                "\"version\": \"1.2.3-test\"",
            ),
            (
                "GET",
                "/counters/plain",
                200,
                "text/plain",
                "[dory, 0].MsgCreate=1\n",
            ),
            (
                "GET",
                "/counters/json",
                200,
                "application/json",
                "\"counters\": [",
            ),
            (
                "GET",
                "/discards/plain",
                200,
                "text/plain",
                "report interval in seconds: 600\n",
            ),
            (
                "GET",
                "/discards/json",
                200,
                "application/json",
                "\"unfinished_report\": {",
            ),
            ("GET", "/queues/plain", 200, "text/plain", " total new\n"),
            (
                "GET",
                "/queues/json",
                200,
                "application/json",
                "\"sending\": [",
            ),
            (
                "GET",
                "/metadata_fetch_time/plain",
                200,
                "text/plain",
                "metadata last updated at",
            ),
            (
                "GET",
                "/metadata_fetch_time/json",
                200,
                "application/json",
                "\"last_modified\": 0",
            ),
            (
                "GET",
                "/metrics",
                200,
                "text/plain; version=0.0.4",
                "dory_up 1\n",
            ),
            (
                "POST",
                "/metadata_update",
                200,
                "text/plain",
                "Metadata update initiated at ",
            ),
            (
                "PUT",
                "/x",
                501,
                "text/plain",
                "[request method PUT not implemented]",
            ),
        ];
        for (method, path, status, ctype, needle) in cases {
            let (got, head, body) = fetch(addr, method, path);
            assert_eq!(got, status, "{method} {path}: {head}\n{body}");
            assert!(
                head.contains(&format!("Content-Type: {ctype}")),
                "{method} {path}: {head}"
            );
            assert!(body.contains(needle), "{method} {path}: {body}");
        }
        assert_eq!(rx.try_recv(), Ok(StatusRequest::MetadataUpdate));
        assert_eq!(fetch(addr, "POST", "/nope").0, 404);
        assert_eq!(fetch(addr, "GET", "/health").0, 503);
        assert_eq!(fetch(addr, "GET", "/msg_debug/add_all_topics").0, 404);
        m.set_health(Health::Ready);
        assert_eq!(fetch(addr, "GET", "/health").2, "ok\n");
        assert_eq!(m.get(Counter::MongooseHttpRequest), 18);
        h.stop();
        assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1))
            .and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(1)))?;
                s.write_all(b"GET / HTTP/1.1\r\n\r\n")?;
                let mut buf = [0u8; 1];
                s.read(&mut buf)
            })
            .map_or(true, |n| n == 0));
    }
}
