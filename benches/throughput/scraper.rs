//! The scraper of target `sink-scraped`: a thread that fetches dory's `/metrics` once a
//! second while the sender runs, as Prometheus would (it asks for gzip), and times each
//! scrape from connecting to the last byte of the body.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::http_get_raw;

/// What the scrapes of one run measured.
#[derive(Debug, Default)]
pub struct Scrapes {
    /// Each scrape's duration in milliseconds, connect to last byte.
    pub ms: Vec<f64>,
    /// The largest reply body seen (as sent: gzipped when dory compressed it).
    pub max_body_bytes: usize,
    /// Whether every reply was gzipped.
    pub all_gzip: bool,
    /// Failed scrapes (not 200, or an error), with the first error.
    pub failed: u64,
    pub first_error: Option<String>,
}

/// A scraper thread, stopped by [`Scraper::finish`].
pub struct Scraper {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Scrapes>,
}

impl Scraper {
    /// Starts scraping `status` every `every`, the first at once.
    pub fn start(status: SocketAddr, every: Duration) -> io::Result<Scraper> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new().name("scraper".into()).spawn({
            let stop = stop.clone();
            move || {
                let mut s = Scrapes {
                    all_gzip: true,
                    ..Scrapes::default()
                };
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < next {
                        // Short naps so that `finish` is not kept waiting a second.
                        std::thread::sleep((next - now).min(Duration::from_millis(20)));
                        continue;
                    }
                    next += every;
                    let t0 = Instant::now();
                    match scrape(status) {
                        Ok((200, gzip, len)) => {
                            s.ms.push(t0.elapsed().as_secs_f64() * 1e3);
                            s.max_body_bytes = s.max_body_bytes.max(len);
                            s.all_gzip &= gzip;
                        }
                        Ok((code, _, _)) => {
                            s.failed += 1;
                            s.first_error.get_or_insert(format!("answered {code}"));
                        }
                        Err(e) => {
                            s.failed += 1;
                            s.first_error.get_or_insert(e.to_string());
                        }
                    }
                }
                s
            }
        })?;
        Ok(Scraper { stop, thread })
    }

    /// Stops the scraper and returns what it measured.
    pub fn finish(self) -> Scrapes {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// One `GET /metrics` accepting gzip, read to the end (dory closes the connection):
/// (status code, whether the body was gzipped, body length as sent).
fn scrape(status: SocketAddr) -> io::Result<(u16, bool, usize)> {
    let r = http_get_raw(
        status,
        "/metrics",
        &[("Accept-Encoding", "gzip")],
        Duration::from_secs(5),
    )?;
    let gzip = r
        .header("content-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    Ok((r.code, gzip, r.body.len()))
}
