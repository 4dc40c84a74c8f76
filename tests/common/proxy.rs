//! A TCP proxy in front of one broker that loses answers the way a network and a dying
//! broker do: it forwards whole Kafka frames both ways and, on command, delays the broker's
//! answers (a round-trip time), drops every n-th Produce answer and cuts the connection
//! (the broker wrote the batch, the client never hears so), or goes *down*: every open
//! connection is cut with the answers it holds or the broker has yet to send lost, and new
//! connections are closed at once until it is *up* again. It can also close a connection
//! on ApiVersions, as Kafka 0.8–0.9 brokers do, and keep a copy of every Produce request.
//!
//! Used against Tansu, which deduplicates an idempotent producer's resends: the tests check
//! that what the proxy makes dory resend is stored once.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Frames larger than this end the connection (no broker answer here comes near it).
const MAX_FRAME: usize = 64 << 20;
/// How often a delayed answer, the accept loop and a waiting reader look at the flags.
const TICK: Duration = Duration::from_millis(5);

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    down: AtomicBool,
    /// Answers are held this long (milliseconds) after the broker sent them.
    delay_ms: AtomicU64,
    /// Every `lose_every`-th Produce request's answer is dropped and its connection cut,
    /// until `lose_max` answers were lost that way (0: never).
    lose_every: AtomicUsize,
    lose_max: AtomicUsize,
    produces: AtomicUsize,
    /// Answers dropped by `lose_every`, and connections that lost answers to `down` (an
    /// answer held back by the delay when the proxy went down; the ones behind it on the
    /// same connection are not read, so not counted).
    cut_answers: AtomicUsize,
    down_answers: AtomicUsize,
    /// Close a connection when its client asks for ApiVersions (a Kafka 0.8–0.9 broker).
    refuse_api_versions: AtomicBool,
    /// (API key, highest version) caps applied to the broker's ApiVersions answers.
    api_caps: Mutex<Vec<(i16, i16)>>,
    /// Every Produce request frame (size prefix included), in arrival order.
    produce_requests: Mutex<Vec<Vec<u8>>>,
    /// Both ends of every open connection, to cut them when going down.
    conns: Mutex<Vec<(TcpStream, TcpStream)>>,
}

/// The proxy; stops accepting when dropped.
pub struct FaultProxy {
    shared: Arc<Shared>,
}

/// Reads one length-prefixed Kafka frame (prefix included).
pub fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let n = usize::try_from(i32::from_be_bytes(len)).ok()?;
    if n > MAX_FRAME {
        return None;
    }
    let mut frame = len.to_vec();
    frame.resize(4 + n, 0);
    s.read_exact(&mut frame[4..]).ok()?;
    Some(frame)
}

impl FaultProxy {
    /// Serves on `listener` (bound before the broker started, so the broker can advertise
    /// it), forwarding to `127.0.0.1:upstream`; no fault until one is asked for.
    pub fn start(listener: TcpListener, upstream: u16) -> FaultProxy {
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let shared = Arc::new(Shared::default());
        let sh = shared.clone();
        thread::spawn(move || {
            while !sh.stop.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    thread::sleep(TICK);
                    continue;
                };
                if sh.down.load(Ordering::Relaxed) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                serve(&sh, client, server);
            }
        });
        FaultProxy { shared }
    }

    /// From now on every `every`-th Produce answer is dropped with its connection, `max`
    /// times in all.
    pub fn lose_answers(&self, every: usize, max: usize) {
        self.shared.lose_max.store(max, Ordering::Relaxed);
        self.shared.lose_every.store(every, Ordering::Relaxed);
    }

    /// Holds each answer `delay` after the broker sent it (`Duration::ZERO`: none).
    pub fn delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).expect("delay fits u64 ms");
        self.shared.delay_ms.store(ms, Ordering::Relaxed);
    }

    /// Cuts every connection, losing the answers not yet passed on; refuses new ones until
    /// [`FaultProxy::up`].
    pub fn down(&self) {
        self.shared.down.store(true, Ordering::Relaxed);
        let conns = std::mem::take(&mut *self.shared.conns.lock().expect("conns lock"));
        for (c, s) in conns {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub fn up(&self) {
        self.shared.down.store(false, Ordering::Relaxed);
    }

    /// Closes each connection whose client asks for ApiVersions, as brokers before Kafka
    /// 0.10 do.
    pub fn refuse_api_versions(&self) {
        self.shared
            .refuse_api_versions
            .store(true, Ordering::Relaxed);
    }

    /// Lowers the highest version of API `api_key` in the broker's ApiVersions answers to
    /// `max` (a Kafka 0.10 broker offers Produce v2 at most); a `max` below the lowest
    /// version offers the API at no version, as a broker without it would.
    pub fn cap_api_version(&self, api_key: i16, max: i16) {
        self.shared
            .api_caps
            .lock()
            .expect("api_caps lock")
            .push((api_key, max));
    }

    /// The Produce requests forwarded so far (whole frames).
    pub fn produce_requests(&self) -> Vec<Vec<u8>> {
        self.shared
            .produce_requests
            .lock()
            .expect("produce_requests lock")
            .clone()
    }

    /// Produce answers dropped by [`FaultProxy::lose_answers`].
    pub fn cut_answers(&self) -> usize {
        self.shared.cut_answers.load(Ordering::Relaxed)
    }

    /// Connections that lost an answer held back by the delay when the proxy went down.
    pub fn down_answers(&self) -> usize {
        self.shared.down_answers.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.down();
    }
}

/// Forwards one connection: a thread each way.
fn serve(sh: &Arc<Shared>, client: TcpStream, server: TcpStream) {
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    sh.conns.lock().expect("conns lock").push((c2, s2));
    let doomed: Arc<Mutex<HashSet<i32>>> = Arc::default();
    // Correlation ids of ApiVersions requests, with each one's version.
    let asked: Arc<Mutex<Vec<(i32, i16)>>> = Arc::default();
    let asked_in = asked.clone();
    let (Ok(mut c_in), Ok(mut s_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (sh1, d1) = (sh.clone(), doomed.clone());
    thread::spawn(move || {
        while let Some(f) = read_frame(&mut c_in) {
            let api_key = (f.len() >= 12).then(|| i16::from_be_bytes([f[4], f[5]]));
            if api_key == Some(18) && sh1.refuse_api_versions.load(Ordering::Relaxed) {
                break;
            }
            if api_key == Some(18) {
                let version = i16::from_be_bytes([f[6], f[7]]);
                let correlation = i32::from_be_bytes([f[8], f[9], f[10], f[11]]);
                asked_in
                    .lock()
                    .expect("asked lock")
                    .push((correlation, version));
            }
            if api_key == Some(0) {
                sh1.produce_requests
                    .lock()
                    .expect("produce_requests lock")
                    .push(f.clone());
            }
            if api_key == Some(0) {
                let correlation = i32::from_be_bytes([f[8], f[9], f[10], f[11]]);
                let k = sh1.produces.fetch_add(1, Ordering::Relaxed) + 1;
                let every = sh1.lose_every.load(Ordering::Relaxed);
                let pending = d1.lock().expect("doomed lock").len();
                if every > 0
                    && k % every == 0
                    && sh1.cut_answers.load(Ordering::Relaxed) + pending
                        < sh1.lose_max.load(Ordering::Relaxed)
                {
                    d1.lock().expect("doomed lock").insert(correlation);
                }
            }
            if s_out.write_all(&f).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Both);
    });
    let sh2 = sh.clone();
    let (mut s_in, mut c_out) = (server, client);
    thread::spawn(move || {
        while let Some(mut f) = read_frame(&mut s_in) {
            let due = Instant::now() + Duration::from_millis(sh2.delay_ms.load(Ordering::Relaxed));
            let mut lost = false;
            while Instant::now() < due {
                if sh2.down.load(Ordering::Relaxed) || sh2.stop.load(Ordering::Relaxed) {
                    lost = true;
                    break;
                }
                thread::sleep(TICK);
            }
            if lost || sh2.down.load(Ordering::Relaxed) {
                sh2.down_answers.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let Some(c) = f.get(4..8) else { break };
            let correlation = i32::from_be_bytes([c[0], c[1], c[2], c[3]]);
            let caps = sh2.api_caps.lock().expect("api_caps lock").clone();
            let version = {
                let mut a = asked.lock().expect("asked lock");
                let i = a.iter().position(|(c, _)| *c == correlation);
                i.map(|i| a.swap_remove(i).1)
            };
            if let Some(version) = version.filter(|_| !caps.is_empty()) {
                cap_api_versions(&mut f, version, &caps);
            }
            if doomed.lock().expect("doomed lock").remove(&correlation) {
                sh2.cut_answers.fetch_add(1, Ordering::Relaxed);
                break;
            }
            if c_out.write_all(&f).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Both);
        let _ = s_in.shutdown(Shutdown::Both);
    });
}

/// Applies `caps` (API key, highest version) to an ApiVersions answer `frame` (size prefix
/// included) of request version `version`, in place (no length changes). v3+ is flexible:
/// a compact array and a tag buffer per entry, assumed empty as brokers send it.
fn cap_api_versions(frame: &mut [u8], version: i16, caps: &[(i16, i16)]) {
    // size, correlation id, error code
    let mut at = 4 + 4 + 2;
    let flexible = version >= 3;
    let Some(&first) = frame.get(at) else { return };
    let count = if flexible {
        if first & 0x80 != 0 {
            return; // more than 127 APIs: not a broker answer this proxy knows
        }
        at += 1;
        usize::from(first).saturating_sub(1)
    } else {
        let Some(n) = frame.get(at..at + 4) else {
            return;
        };
        at += 4;
        usize::try_from(i32::from_be_bytes([n[0], n[1], n[2], n[3]])).unwrap_or(0)
    };
    let entry = if flexible { 7 } else { 6 };
    for _ in 0..count {
        let Some(e) = frame.get_mut(at..at + entry) else {
            return;
        };
        let key = i16::from_be_bytes([e[0], e[1]]);
        for &(_, max) in caps.iter().filter(|(k, _)| *k == key) {
            if i16::from_be_bytes([e[4], e[5]]) > max {
                e[4..6].copy_from_slice(&max.to_be_bytes());
            }
        }
        if flexible && e[6] != 0 {
            return; // a tagged field: the layout from here on is unknown
        }
        at += entry;
    }
}
