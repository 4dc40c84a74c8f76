//! The stream load generator (targets `stream-one` and `stream-many`): the same messages
//! as the datagram sender (`sender.rs`), written back to back (the stream framing is each
//! message's own Size field) by many clients at once, each a thread of its own with one
//! connection, to dory's UNIX stream socket and its TCP port.
//!
//! Every client connects first; then all start together (a barrier) and each writes its
//! share, `per_call` messages per `write`, as fast as dory reads. Client `c` of `C` sends
//! messages `c, c + C, c + 2C, …`, so the topics stay round robin overall. Each client's
//! rate is its messages over its own sending time: the spread between the slowest and the
//! fastest client shows whether dory serves them fairly.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::sender::{now_ms, stamp, templates, Load, Sent};
use crate::thread_usage::{thread_cpu_s, thread_switches};

/// How many clients of each kind.
#[derive(Clone, Copy, Debug)]
pub struct Clients {
    pub unix: usize,
    pub tcp: usize,
}

impl Clients {
    pub fn total(self) -> usize {
        self.unix + self.tcp
    }
}

/// What the clients did together: the overall send (first start to last end, CPU and
/// switches summed over clients) and each client's own rate.
pub struct StreamSent {
    pub sent: Sent,
    /// Messages per second of each client over its own sending time, UNIX clients first.
    pub per_client: Vec<f64>,
}

/// One client's result.
struct ClientRun {
    start: Instant,
    end: Instant,
    count: u64,
    writes: u64,
    cpu_s: f64,
    switches: (u64, u64),
}

enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Conn::Unix(s) => s.write_all(b),
            Conn::Tcp(s) => s.write_all(b),
        }
    }
}

/// Sends the whole load from `clients`, split between them. A client whose `write` stays
/// blocked for `stall` fails the run (dory stopped reading it).
pub fn send(
    unix_path: &Path,
    tcp: SocketAddr,
    load: &Load,
    clients: Clients,
    stall: Duration,
) -> io::Result<StreamSent> {
    let n = clients.total();
    assert!(n > 0 && !load.topics.is_empty() && load.per_call > 0);
    let templates = Arc::new(templates(load));
    // Connect every client before any sends: dory's acceptor is not part of the rate.
    let mut conns = Vec::with_capacity(n);
    for c in 0..n {
        let conn = if c < clients.unix {
            let s = UnixStream::connect(unix_path)?;
            s.set_write_timeout(Some(stall))?;
            small_send_buffer(s.as_raw_fd())?;
            Conn::Unix(s)
        } else {
            let s = TcpStream::connect_timeout(&tcp, stall)?;
            s.set_write_timeout(Some(stall))?;
            s.set_nodelay(true)?;
            small_send_buffer(s.as_raw_fd())?;
            Conn::Tcp(s)
        };
        conns.push(conn);
    }
    let barrier = Arc::new(Barrier::new(n));
    let mut threads = Vec::with_capacity(n);
    for (c, conn) in conns.into_iter().enumerate() {
        let (barrier, templates, load) = (barrier.clone(), templates.clone(), load.clone());
        let t = std::thread::Builder::new()
            .name(format!("client-{c}"))
            .stack_size(256 << 10)
            .spawn(move || client(conn, c as u64, n as u64, &load, &templates, &barrier))?;
        threads.push(t);
    }
    let mut runs = Vec::with_capacity(n);
    let mut first_err = None;
    for t in threads {
        match t.join() {
            Ok(Ok(r)) => runs.push(r),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(io::Error::other("a client thread panicked"));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let start = runs.iter().map(|r| r.start).min().expect("n > 0 clients");
    let end = runs.iter().map(|r| r.end).max().expect("n > 0 clients");
    let per_client = runs
        .iter()
        .map(|r| r.count as f64 / r.end.duration_since(r.start).as_secs_f64().max(1e-9))
        .collect();
    Ok(StreamSent {
        sent: Sent {
            start,
            end,
            calls: runs.iter().map(|r| r.writes).sum(),
            cpu_s: runs.iter().map(|r| r.cpu_s).sum(),
            switches: runs
                .iter()
                .fold((0, 0), |a, r| (a.0 + r.switches.0, a.1 + r.switches.1)),
        },
        per_client,
    })
}

/// What a client may have written that dory has not read yet, at most: the kernel's send
/// buffer, kept small so that a client's rate is dory's reading of it, not how fast the
/// kernel buffers its share (the default buffers would hold a whole share of a short run).
const SEND_BUFFER: libc::c_int = 32 << 10;

fn small_send_buffer(fd: RawFd) -> io::Result<()> {
    // SAFETY: setsockopt reads a c_int we own, of the size we pass.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&SEND_BUFFER as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Client `c` of `of`: messages `c, c + of, …` below `load.count`, `per_call` per write.
fn client(
    mut conn: Conn,
    c: u64,
    of: u64,
    load: &Load,
    templates: &[Vec<u8>],
    barrier: &Barrier,
) -> io::Result<ClientRun> {
    let size = load.datagram_size();
    let topic_len = load.topics[0].len();
    let mut buf = vec![0u8; size * load.per_call];
    barrier.wait();
    let cpu0 = thread_cpu_s();
    let switches0 = thread_switches();
    let start = Instant::now();
    let (mut i, mut count, mut writes) = (c, 0u64, 0u64);
    while i < load.count {
        let ts = now_ms();
        let mut len = 0;
        while len < buf.len() && i < load.count {
            let msg = &mut buf[len..len + size];
            msg.copy_from_slice(&templates[(i % templates.len() as u64) as usize]);
            stamp(msg, topic_len, load.value_size, ts, i);
            len += size;
            i += of;
            count += 1;
        }
        conn.write_all(&buf[..len]).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("client {c}: write blocked or failed after {count} messages: {e}"),
            )
        })?;
        writes += 1;
    }
    let end = Instant::now();
    let s1 = thread_switches();
    Ok(ClientRun {
        start,
        end,
        count,
        writes,
        cpu_s: thread_cpu_s() - cpu0,
        switches: (s1.0 - switches0.0, s1.1 - switches0.1),
    })
}
