//! HTTP status interface (§11 of the reference): Dory's status endpoints with their exact
//! plain-text and JSON shapes, plus `/health` and Prometheus `/metrics`.
//!
//! One named thread serves requests one at a time through tiny_http, reading only `Metrics`;
//! its single action is asking the router for a metadata refresh.
//!
//! This file is the server: start and stop, routing a request to its page. The pages are
//! in `dory.rs` (Dory's plain and JSON shapes), `commit_points.rs` (the commit points, in
//! the same style), `prometheus.rs` (`/health` and `/metrics`) and `page.rs` (the live
//! status page at `/` and its `/status.json`).

mod commit_points;
mod dory;
mod page;
mod prometheus;
mod spool;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};

use crate::pipeline::StatusRequest;
use crate::report::metrics::{now_ms, Counter, Metrics};
use commit_points::{commit_points_json, commit_points_plain};
use dory::{
    counters_json, counters_plain, ctime, discards_json, discards_plain, header_plain,
    metadata_fetch_time_json, metadata_fetch_time_plain, queues_json, queues_plain,
    server_info_json,
};
use page::{page_html, status_json};
use prometheus::{health, prometheus, Scope};

const TEXT: &str = "text/plain";
const JSON: &str = "application/json";
const HTML: &str = "text/html";
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

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
    let heartbeat = metrics
        .liveness()
        .register("status", crate::report::liveness::QUIET_MAX);
    loop {
        heartbeat.beat();
        let request = match server.recv_timeout(crate::report::liveness::TICK) {
            Ok(Some(r)) => r,
            Ok(None) => {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                continue;
            }
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
        let gzip = reply.body.len() >= GZIP_MIN && accepts_gzip(request.headers());
        let body = if gzip {
            gzipped(reply.body.as_bytes())
        } else {
            reply.body.into_bytes()
        };
        let mut response = tiny_http::Response::from_data(body).with_status_code(reply.status);
        let mut headers = vec![("Content-Type", reply.content_type)];
        if gzip {
            headers.extend([("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")]);
        }
        for (name, value) in headers {
            if let Ok(h) = tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()) {
                response.add_header(h);
            }
        }
        if let Err(e) = request.respond(response) {
            log::debug!("status server: writing response: {e}");
        }
    }
}

/// Replies shorter than this go out uncompressed even when the client takes gzip.
const GZIP_MIN: usize = 1024;

/// Whether the request's `Accept-Encoding` allows gzip (Prometheus sends `gzip`).
fn accepts_gzip(headers: &[tiny_http::Header]) -> bool {
    headers
        .iter()
        .filter(|h| h.field.equiv("Accept-Encoding"))
        .flat_map(|h| h.value.as_str().split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .is_some_and(|q| q.parse::<f32>().is_ok_and(|q| q <= 0.0))
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// `body` gzip-compressed at the fastest level (a 10,000-topic scrape: a few ms).
fn gzipped(body: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing to a Vec cannot fail.
    let _ = enc.write_all(body);
    enc.finish().unwrap_or_default()
}

/// One HTTP response, before it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reply {
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

/// Routes one request (`url` may carry a query string: `/metrics?topic=NAME`; others
/// ignore it); `now_ms` is the request time in milliseconds since the epoch.
pub(crate) fn handle(
    m: &Metrics,
    control: &StatusControl,
    method: &str,
    url: &str,
    now_ms: u64,
) -> Reply {
    m.inc(Counter::MongooseHttpRequest);
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    match method {
        "GET" if path == "/metrics" => metrics(m, query),
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
        "/commit_points/plain" | "/commit_points/json" => match m.commit_points(Instant::now()) {
            Some(p) if path.ends_with("/plain") => {
                Reply::ok(TEXT, commit_points_plain(m, &p, now_ms))
            }
            Some(p) => Reply::ok(JSON, commit_points_json(m, &p, now_ms)),
            None => Reply::text(
                404,
                "commit points are off (commit_points.enable = false)\n".into(),
            ),
        },
        "/spool/plain" | "/spool/json" => match m.spool_snapshot() {
            Some(s) if path.ends_with("/plain") => Reply::ok(TEXT, spool::spool_plain(m, &s)),
            Some(s) => Reply::ok(JSON, spool::spool_json(m, &s)),
            None => Reply {
                status: 404,
                content_type: TEXT,
                body: "no spool is configured (spool.default / spool.topics)\n".into(),
            },
        },
        "/health" => health(m),
        "/status.json" => Reply::ok(JSON, status_json(m, now_ms)),
        p if p.starts_with("/msg_debug/") => match m.msg_debug().and_then(|d| d.handle_http(p)) {
            Some(r) => Reply::text(r.status, r.body),
            None => Reply::text(404, "message debug logging is not configured\n".into()),
        },
        _ => Reply::ok(HTML, page_html(m, now_ms)),
    }
}

/// `/metrics`, or with `topic=NAME` in the query every family for that topic alone.
fn metrics(m: &Metrics, query: &str) -> Reply {
    let topic = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("topic="))
        .map(percent_decode);
    let scope = match &topic {
        None => Scope::Configured,
        Some(Ok(name)) => Scope::Topic(name),
        Some(Err(e)) => return Reply::text(400, format!("topic: {e}\n")),
    };
    match prometheus(m, scope) {
        Some(text) => Reply::ok(PROMETHEUS, text),
        None => Reply::text(
            404,
            "no such topic: dory has received nothing for it\n".into(),
        ),
    }
}

/// A query value with `%XX` escapes decoded (`+` is kept: topic names have no spaces).
fn percent_decode(s: &str) -> Result<Vec<u8>, &'static str> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).ok_or("a % escape is cut short")?;
            let digit = |c: u8| (c as char).to_digit(16).ok_or("a % escape is not hex");
            out.push((digit(hex[0])? * 16 + digit(hex[1])?) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::NO_TOPIC;
    use crate::report::metrics::{
        BrokerProtocol, DiscardReason, Health, MetricsConfig, QueueState,
    };
    use crate::spool::SpoolStats;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    pub(super) fn populated() -> Metrics {
        let m = Metrics::new(MetricsConfig {
            discard_report_interval: Duration::from_secs(600),
            bad_msg_prefix_size: 4,
            max_topics: 100,
            version: "1.2.3-test".into(),
            commit_points: true,
            ..Default::default()
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
        m.set_health(Health::InputsOpen);
        m.metadata_fetch_failed("b1:9092: connection refused; b2:9092: timed out");
        m.metadata_fetch_failed("b1:9092: connection refused; b2:9092: timed out");
        let r = handle(&m, &c, "GET", "/health", now);
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                503,
                "not ready: waiting for the first metadata fetch\n2 fetches failed in a row, \
                 the last: b1:9092: connection refused; b2:9092: timed out\n"
            )
        );
        m.set_health(Health::Ready);
        let r = handle(&m, &c, "GET", "/health", now);
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
        assert_eq!(m.get(Counter::MongooseHttpRequest), 12);
        assert_eq!(m.get(Counter::MongooseGetCountersRequest), 1);
    }

    #[test]
    fn commit_points_pages_unless_switched_off() {
        let m = populated();
        let (c, _rx) = control();
        let now = m.start_secs() * 1000;
        let r = handle(&m, &c, "GET", "/commit_points/json", now);
        assert_eq!((r.status, r.content_type), (200, JSON));
        let r = handle(&m, &c, "GET", "/commit_points/plain", now);
        assert_eq!((r.status, r.content_type), (200, TEXT));
        assert!(r.body.contains("overall"), "{}", r.body);
        assert!(handle(&m, &c, "GET", "/", now)
            .body
            .contains("href=\"/commit_points/json\""));
        let off = Metrics::new(MetricsConfig {
            commit_points: false,
            ..MetricsConfig::default()
        });
        let r = handle(&off, &c, "GET", "/commit_points/plain", now);
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                404,
                "commit points are off (commit_points.enable = false)\n"
            )
        );
    }

    #[test]
    fn spool_pages_and_families_only_with_a_spool() {
        let m = populated();
        let (c, _rx) = control();
        let now = m.start_secs() * 1000;
        assert_eq!(handle(&m, &c, "GET", "/spool/json", now).status, 404);
        assert!(!handle(&m, &c, "GET", "/metrics", now)
            .body
            .contains("dory_spool_"));
        m.enable_spool();
        let t = m.topic_id(b"payments").expect("id");
        m.set_spooled(t);
        m.set_synced_point(t, 1_700_000_000_123);
        m.recovered(t, 7);
        SpoolStats::add(&m.spool().corrupt_bytes, 42);
        m.spool().synced(Duration::from_micros(700));
        let r = handle(&m, &c, "GET", "/spool/json", now);
        assert_eq!((r.status, r.content_type), (200, JSON));
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["corrupt_bytes"], 42);
        assert_eq!(v["syncs"], 1);
        assert_eq!(v["topics"][0]["topic"], "payments");
        assert_eq!(v["topics"][0]["synced_point"], 1_700_000_000_123i64);
        assert_eq!(v["topics"][0]["recovered"], 7);
        let r = handle(&m, &c, "GET", "/spool/plain", now);
        assert!(r.body.contains("corrupt_bytes: 42"), "{}", r.body);
        assert!(
            r.body.contains("recovered:          7  topic: [payments]"),
            "{}",
            r.body
        );
        let p = handle(&m, &c, "GET", "/metrics", now).body;
        for line in [
            "dory_spool_corrupt_bytes_total 42\n",
            "dory_spool_recovered_total 7\n",
            "dory_spool_synced_point_timestamp_seconds 1700000000.123\n",
            "dory_spool_sync_seconds_bucket{le=\"0.001\"} 1\n",
            "dory_spool_sync_seconds_count 1\n",
        ] {
            assert!(p.contains(line), "{line} missing:\n{p}");
        }
        let p = handle(&m, &c, "GET", "/metrics?topic=payments", now).body;
        for line in [
            "dory_spool_recovered_total{topic=\"payments\"} 7\n",
            "dory_spool_synced_point_timestamp_seconds{topic=\"payments\"} 1700000000.123\n",
        ] {
            assert!(p.contains(line), "{line} missing:\n{p}");
        }
        assert!(handle(&m, &c, "GET", "/", now)
            .body
            .contains("href=\"/spool/json\""));
    }

    #[test]
    fn status_page_and_json_routes() {
        let m = populated();
        let (c, _rx) = control();
        let now = m.start_secs() * 1000;
        let r = handle(&m, &c, "GET", "/status.json?t=1", now);
        assert_eq!((r.status, r.content_type), (200, JSON));
        let json: serde_json::Value = serde_json::from_str(&r.body).expect("JSON");
        assert_eq!(json["now_ms"], now);
        let r = handle(&m, &c, "GET", "/", now);
        assert!(r.body.contains("<table id=\"topics\">"), "{}", r.body);
        assert!(r.body.contains("fetch(\"/status.json\""), "{}", r.body);
        // Neither counts as a query of the discard reports.
        assert_eq!(m.get(Counter::MongooseGetDiscardsRequest), 0);
    }

    #[test]
    fn each_brokers_protocol_on_every_page() {
        let m = populated();
        let (c, _rx) = control();
        let now = m.start_secs() * 1000;
        let page = handle(&m, &c, "GET", "/", now).body;
        assert!(!page.contains("id=\"brokers\""), "no broker yet, no table");
        let json = |m: &Metrics| -> serde_json::Value {
            serde_json::from_str(&handle(m, &c, "GET", "/status.json", now).body).expect("JSON")
        };
        assert_eq!(json(&m)["brokers"], serde_json::json!([]));
        for (id, version, magic, assumed) in [(2, 1, 0, Some("0.9")), (1, 8, 2, None)] {
            m.broker_protocols().set(
                id,
                BrokerProtocol {
                    address: format!("b{id}:9092"),
                    produce_version: version,
                    magic,
                    assumed,
                },
            );
        }
        assert_eq!(
            json(&m)["brokers"],
            serde_json::json!([
                {"id": 1, "address": "b1:9092", "produce_version": 8,
                 "message_format": "RecordBatch v2", "found_by": "ApiVersions"},
                {"id": 2, "address": "b2:9092", "produce_version": 1,
                 "message_format": "MessageSet v0", "found_by": "kafka.broker_version = 0.9"},
            ])
        );
        let page = handle(&m, &c, "GET", "/", now).body;
        assert!(
            page.contains("<tr data-broker=\"2\"><td>2</td><td>b2:9092</td><td class=\"n\">1</td><td>MessageSet v0</td><td>kafka.broker_version = 0.9</td></tr>"),
            "{page}"
        );
        let metrics = handle(&m, &c, "GET", "/metrics", now).body;
        for line in [
            "dory_broker_produce_version{broker=\"1\"} 8",
            "dory_broker_produce_version{broker=\"2\"} 1",
            "dory_broker_message_format{broker=\"1\"} 2",
            "dory_broker_message_format{broker=\"2\"} 0",
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "{line} not in\n{metrics}"
            );
        }
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

    /// `fetch` with extra request headers; the body as bytes.
    fn fetch_raw(addr: SocketAddr, path: &str, headers: &str) -> (u16, String, Vec<u8>) {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let at = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("end of head");
        let head = String::from_utf8(raw[..at].to_vec()).unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head, raw[at + 4..].to_vec())
    }

    #[test]
    fn metrics_gzip_and_one_topic_over_http() {
        let m: &'static Metrics = Box::leak(Box::new(populated()));
        let (c, _rx) = control();
        let h = spawn("127.0.0.1:0".parse().unwrap(), m, c).unwrap();
        let addr = h.local_addr();
        let (status, head, plain) = fetch_raw(addr, "/metrics", "");
        assert_eq!(status, 200);
        assert!(
            !head.to_ascii_lowercase().contains("content-encoding"),
            "{head}"
        );
        for accept in ["gzip", "deflate, gzip;q=0.5", "*"] {
            let (status, head, zipped) =
                fetch_raw(addr, "/metrics", &format!("Accept-Encoding: {accept}\r\n"));
            assert_eq!(status, 200);
            assert!(head.contains("Content-Encoding: gzip"), "{accept}: {head}");
            assert!(
                zipped.len() < plain.len(),
                "{} vs {}",
                zipped.len(),
                plain.len()
            );
            let mut unzipped = Vec::new();
            flate2::read::GzDecoder::new(&zipped[..])
                .read_to_end(&mut unzipped)
                .expect("valid gzip");
            assert_eq!(
                String::from_utf8(unzipped).unwrap(),
                String::from_utf8(plain.clone()).unwrap()
            );
        }
        for refused in ["gzip;q=0", "identity", "br"] {
            let (_, head, body) =
                fetch_raw(addr, "/metrics", &format!("Accept-Encoding: {refused}\r\n"));
            assert!(!head.contains("Content-Encoding"), "{refused}: {head}");
            assert_eq!(body, plain);
        }
        let (status, _, body) = fetch_raw(addr, "/metrics?topic=zeta", "");
        let body = String::from_utf8(body).unwrap();
        assert_eq!(status, 200);
        assert!(
            body.contains("dory_possible_duplicates_total{topic=\"zeta\"} 1\n"),
            "{body}"
        );
        // An escaped name, a topic never seen, and a broken escape.
        let (status, _, body) = fetch_raw(addr, "/metrics?topic=al%22pha%0A%5C", "");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let (status, _, _) = fetch_raw(addr, "/metrics?topic=nope", "");
        assert_eq!(status, 404);
        let (status, _, body) = fetch_raw(addr, "/metrics?topic=a%zz", "");
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
        h.stop();
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb%20c+d"), Ok(b"a/b c+d".to_vec()));
        assert_eq!(percent_decode("%ff"), Ok(vec![0xff]));
        assert!(percent_decode("%").is_err());
        assert!(percent_decode("%4").is_err());
        assert!(percent_decode("%+1").is_err());
        assert!(percent_decode("%g0").is_err());
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
