//! The stream inputs: a UNIX stream socket and TCP on 127.0.0.1, both carrying Dory's
//! messages back to back. One thread per socket serves every connection to it, up to
//! [`MAX_CONNECTIONS`], from one `epoll` set (Dory ran a thread per connection; hundreds
//! of clients then meant hundreds of runnable threads crowding out delivery, and a few
//! MiB of stack and buffers each).
//!
//! Fairness: each time round, every connection with data gets one read of at most
//! [`READ_CHUNK_SIZE`](super::wire::READ_CHUNK_SIZE), in the order the kernel reports them,
//! so no client can starve another. What all of them sent is handed on together, in
//! batches of up to [`INPUT_BATCH_MAX`], each connection's messages in their order.
//!
//! Memory: the connections of one input share one read buffer. Each read lends it to the
//! connection being read, and afterwards the connection keeps only the partial message the
//! read ended in, up to [`KEEP_PARTIAL_MAX`](super::wire::KEEP_PARTIAL_MAX) bytes
//! ([`StreamFramer::read_shared`]). A longer partial keeps the buffer it arrived in until
//! its message is whole, or gives all but the partial back after [`IDLE_RELEASE`] of
//! silence. So a thousand steady clients sending small messages hold a few hundred bytes
//! each, not a 64 KiB buffer each.
//!
//! A client that sends nothing, or stalls half way through a message, is never reported
//! ready, so it costs the others nothing. A client that sends a bad size field is counted
//! and disconnected; a client that disconnects mid-message is counted too. At shutdown,
//! what the clients had already sent is read (a bounded number of reads each), and a
//! partial message left over is counted as an unclean disconnect.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use super::wire::{FrameError, StreamFramer};
use super::{remove_stale, set_mode, InputCtx, InputError, Source, STOP_POLL};
use crate::config::UnixSocketConfig;
use crate::pipeline::{Msg, INPUT_BATCH_MAX, NO_TOPIC};
use crate::report::discard_log::DiscardInfo;
use crate::report::liveness::{Heartbeat, QUIET_MAX};
use crate::report::metrics::{Counter, DiscardReason};

/// Most simultaneous connections per stream input; more are refused (and counted).
pub const MAX_CONNECTIONS: usize = 1024;

/// A connection that sends nothing for this long gives back a read buffer it kept for a
/// long partial message, keeping only the partial.
pub const IDLE_RELEASE: Duration = Duration::from_secs(1);

/// How long accepting pauses after `accept` failed for another reason than "none
/// waiting" (out of descriptors, say): the listener stays readable, so retrying at once
/// would spin.
const ACCEPT_PAUSE: Duration = STOP_POLL;

/// Reads per connection at shutdown, for what its client had already sent.
const DRAIN_READS: usize = 16;

/// Readiness events taken per `epoll_wait`.
const EVENTS: usize = 256;

/// The listener's token in the epoll set; a connection's is its slot number.
const LISTENER: u64 = u64::MAX;

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Unix(u) => u.as_fd(),
            Listener::Tcp(t) => t.as_fd(),
        }
    }

    fn accept(&self) -> std::io::Result<Conn> {
        match self {
            Listener::Unix(u) => u.accept().map(|(s, _)| Conn::Unix(s)),
            Listener::Tcp(t) => t.accept().map(|(s, _)| Conn::Tcp(s)),
        }
    }
}

enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl std::io::Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Conn::Unix(s) => s.as_fd(),
            Conn::Tcp(s) => s.as_fd(),
        }
    }

    fn set_nonblocking(&self) -> std::io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_nonblocking(true),
            Conn::Tcp(s) => s.set_nonblocking(true),
        }
    }
}

/// One client's connection and what it has sent that is not yet a whole message.
struct Client {
    conn: Conn,
    framer: StreamFramer,
    /// When it last sent anything (or connected).
    last_data: Instant,
}

/// A running stream input.
pub struct StreamInput {
    path: Option<PathBuf>,
    thread: JoinHandle<()>,
}

impl StreamInput {
    /// Binds the UNIX stream socket (replacing a stale file) and starts serving it.
    pub fn start_unix(
        cfg: &UnixSocketConfig,
        max_msg_size: usize,
        ctx: InputCtx,
    ) -> Result<StreamInput, InputError> {
        remove_stale(&cfg.path)?;
        let l = UnixListener::bind(&cfg.path).map_err(|source| InputError::Bind {
            what: "stream socket",
            addr: cfg.path.display().to_string(),
            source,
        })?;
        set_mode(&cfg.path, cfg.mode)?;
        let thread = spawn("input-stream", Listener::Unix(l), max_msg_size, ctx)?;
        Ok(StreamInput {
            path: Some(cfg.path.clone()),
            thread,
        })
    }

    /// Binds TCP on 127.0.0.1 only: remote clients are deliberately impossible.
    pub fn start_tcp(
        port: u16,
        max_msg_size: usize,
        ctx: InputCtx,
    ) -> Result<StreamInput, InputError> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let l = TcpListener::bind(addr).map_err(|source| InputError::Bind {
            what: "TCP input",
            addr: addr.to_string(),
            source,
        })?;
        let thread = spawn("input-tcp", Listener::Tcp(l), max_msg_size, ctx)?;
        Ok(StreamInput { path: None, thread })
    }

    /// Waits for the input's thread (the stop flag is set).
    pub fn join(self) {
        if self.thread.join().is_err() {
            log::error!("stream input thread panicked");
        }
        if let Some(p) = self.path {
            if let Err(e) = std::fs::remove_file(&p) {
                log::warn!("cannot remove {}: {e}", p.display());
            }
        }
    }
}

fn spawn(
    name: &str,
    l: Listener,
    max_msg_size: usize,
    ctx: InputCtx,
) -> Result<JoinHandle<()>, InputError> {
    let os = |e: Errno| InputError::Thread(std::io::Error::from(e));
    let nonblocking = match &l {
        Listener::Unix(u) => u.set_nonblocking(true),
        Listener::Tcp(t) => t.set_nonblocking(true),
    };
    nonblocking.map_err(InputError::Thread)?;
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(os)?;
    epoll
        .add(l.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))
        .map_err(os)?;
    let tcp = matches!(l, Listener::Tcp(_));
    std::thread::Builder::new()
        .name(name.into())
        .spawn({
            let heartbeat = ctx.metrics.liveness().register(name, QUIET_MAX);
            move || {
                Server {
                    listener: l,
                    epoll,
                    tcp,
                    max_msg_size,
                    clients: Vec::new(),
                    free: Vec::new(),
                    live: 0,
                    accept_paused_until: None,
                    ctx: &ctx,
                    out: Vec::with_capacity(INPUT_BATCH_MAX),
                    shared: Vec::new(),
                }
                .run(&heartbeat)
            }
        })
        .map_err(InputError::Thread)
}

/// One stream input's thread: its listener, its connections and their epoll set.
struct Server<'a> {
    listener: Listener,
    epoll: Epoll,
    tcp: bool,
    max_msg_size: usize,
    /// Connections by slot (the epoll token); `None`: a free slot, listed in `free`.
    clients: Vec<Option<Client>>,
    free: Vec<usize>,
    live: usize,
    /// Set while accepting pauses after an `accept` error (the listener is out of the set).
    accept_paused_until: Option<Instant>,
    ctx: &'a InputCtx,
    /// Messages read this time round, handed on when full and at the end of the round.
    out: Vec<Msg>,
    /// The read buffer lent to each connection in turn ([`StreamFramer::read_shared`]).
    shared: Vec<u8>,
}

impl Server<'_> {
    fn run(mut self, heartbeat: &Heartbeat) {
        let mut events = [EpollEvent::empty(); EVENTS];
        let wait_ms = u16::try_from(STOP_POLL.as_millis()).unwrap_or(u16::MAX);
        let mut next_sweep = Instant::now() + IDLE_RELEASE;
        while !self.ctx.stopping() {
            heartbeat.beat();
            let ready = match self.epoll.wait(&mut events, wait_ms) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    // Cannot happen with a valid epoll descriptor and buffer; don't spin.
                    log::error!("stream input: epoll_wait failed: {e}");
                    std::thread::sleep(STOP_POLL);
                    0
                }
            };
            let now = Instant::now();
            // One clock read for every message of this round.
            self.ctx.batch_clock.set(Some(now));
            for ev in &events[..ready] {
                match ev.data() {
                    LISTENER => self.accept_all(now),
                    slot => self.serve(slot as usize, now),
                }
            }
            self.ctx.flush(&mut self.out);
            self.ctx.batch_clock.set(None);
            if self.accept_paused_until.is_some_and(|t| now >= t) {
                self.resume_accepting();
            }
            if now >= next_sweep {
                self.release_idle(now);
                next_sweep = now + IDLE_RELEASE;
            }
        }
        self.shut_down();
    }

    /// Takes every waiting connection, up to [`MAX_CONNECTIONS`] open.
    fn accept_all(&mut self, now: Instant) {
        let m = self.ctx.metrics;
        loop {
            let conn = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("stream input: accept failed: {e}; pausing accepts");
                    if self.epoll.delete(self.listener.as_fd()).is_ok() {
                        self.accept_paused_until = Some(now + ACCEPT_PAUSE);
                    }
                    return;
                }
            };
            m.inc(if self.tcp {
                Counter::NewTcpClient
            } else {
                Counter::NewUnixClient
            });
            if self.live >= MAX_CONNECTIONS {
                log::warn!("stream input: {MAX_CONNECTIONS} connections open; refusing a new one");
                continue;
            }
            if let Err(e) = conn.set_nonblocking() {
                log::warn!("stream input: {e}");
                continue;
            }
            let slot = self.free.pop().unwrap_or_else(|| {
                self.clients.push(None);
                self.clients.len() - 1
            });
            let ev = EpollEvent::new(EpollFlags::EPOLLIN, slot as u64);
            if let Err(e) = self.epoll.add(conn.as_fd(), ev) {
                log::warn!("stream input: cannot watch a new connection: {e}");
                self.free.push(slot);
                continue;
            }
            self.clients[slot] = Some(Client {
                conn,
                framer: StreamFramer::new(self.max_msg_size),
                last_data: now,
            });
            self.live += 1;
        }
    }

    fn resume_accepting(&mut self) {
        let ev = EpollEvent::new(EpollFlags::EPOLLIN, LISTENER);
        match self.epoll.add(self.listener.as_fd(), ev) {
            Ok(()) => self.accept_paused_until = None,
            Err(e) => {
                log::warn!("stream input: cannot watch the listener again: {e}");
                self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
            }
        }
    }

    /// One read for the connection in `slot`; closes it if it ended or must be dropped.
    fn serve(&mut self, slot: usize, now: Instant) {
        if self.read_slot(slot, now) == Some(Read::Closed) {
            self.close(slot);
        }
    }

    /// One read of the connection in `slot` through the shared read buffer (`None`: the
    /// slot is free).
    fn read_slot(&mut self, slot: usize, now: Instant) -> Option<Read> {
        let client = self.clients.get_mut(slot)?.as_mut()?;
        Some(read_once(
            client,
            self.tcp,
            self.ctx,
            &mut self.out,
            &mut self.shared,
            now,
        ))
    }

    fn close(&mut self, slot: usize) {
        if let Some(client) = self.clients.get_mut(slot).and_then(Option::take) {
            // Closing the descriptor removes it from the set anyway; this is explicit.
            let _ = self.epoll.delete(client.conn.as_fd());
            self.free.push(slot);
            self.live -= 1;
        }
    }

    /// Gives back the read buffers of connections silent for [`IDLE_RELEASE`].
    fn release_idle(&mut self, now: Instant) {
        for client in self.clients.iter_mut().flatten() {
            if now.duration_since(client.last_data) >= IDLE_RELEASE {
                client.framer.release_idle();
            }
        }
    }

    /// At stop: reads what each client had already sent, then counts what is left of a
    /// message as an unclean disconnect.
    fn shut_down(mut self) {
        let now = Instant::now();
        for slot in 0..self.clients.len() {
            let mut last = Read::Data;
            for _ in 0..DRAIN_READS {
                last = self.read_slot(slot, now).unwrap_or(Read::Closed);
                if last != Read::Data {
                    break;
                }
            }
            if let Some(client) = self.clients[slot].as_ref() {
                let partial = client.framer.buffered();
                if last != Read::Closed && !partial.is_empty() {
                    unclean(self.ctx, self.tcp, partial);
                }
            }
            self.close(slot);
        }
        self.ctx.flush(&mut self.out);
    }
}

/// What one read of a connection found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Bytes (their whole messages taken).
    Data,
    /// Nothing to read yet.
    Nothing,
    /// The connection is done: end of stream (clean or unclean), a socket error, or a bad
    /// size field, each counted.
    Closed,
}

/// One non-blocking read from `client` through the input's `shared` read buffer, its
/// whole messages appended to `out` (handed on when `out` is full).
fn read_once(
    client: &mut Client,
    tcp: bool,
    ctx: &InputCtx,
    out: &mut Vec<Msg>,
    shared: &mut Vec<u8>,
    now: Instant,
) -> Read {
    let got = client.framer.read_shared(&mut client.conn, shared);
    let read = take_frames(client, got, tcp, ctx, out, now);
    // On every outcome, closed included: the read buffer goes back to the input.
    client.framer.settle(shared);
    read
}

/// Classifies what one read returned and takes its whole messages.
fn take_frames(
    client: &mut Client,
    got: std::io::Result<usize>,
    tcp: bool,
    ctx: &InputCtx,
    out: &mut Vec<Msg>,
    now: Instant,
) -> Read {
    let m = ctx.metrics;
    let source = if tcp { Source::Tcp } else { Source::UnixStream };
    let framer = &mut client.framer;
    match got {
        Ok(0) => {
            if framer.buffered().is_empty() {
                m.inc(if tcp {
                    Counter::TcpInputCleanDisconnect
                } else {
                    Counter::UnixStreamInputCleanDisconnect
                });
            } else {
                unclean(ctx, tcp, framer.buffered());
            }
            Read::Closed
        }
        Ok(_) => {
            client.last_data = now;
            m.inc(if tcp {
                Counter::TcpInputSocketRead
            } else {
                Counter::UnixStreamInputSocketRead
            });
            loop {
                match framer.next_frame() {
                    Ok(Some(frame)) => {
                        ctx.accept(frame, source, out);
                        if out.len() >= INPUT_BATCH_MAX {
                            ctx.flush(out);
                        }
                    }
                    Ok(None) => return Read::Data,
                    Err(e) => {
                        ctx.flush(out);
                        bad_size(ctx, tcp, &e, framer.buffered());
                        return Read::Closed;
                    }
                }
            }
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) =>
        {
            Read::Nothing
        }
        Err(e) => {
            m.inc(if tcp {
                Counter::TcpInputSocketError
            } else {
                Counter::UnixStreamInputSocketError
            });
            log::warn!("stream input: connection lost: {e}");
            if !framer.buffered().is_empty() {
                unclean(ctx, tcp, framer.buffered());
            }
            Read::Closed
        }
    }
}

/// A client closed (or we stopped) with part of a message buffered: a counted discard.
fn unclean(ctx: &InputCtx, tcp: bool, partial: &[u8]) {
    let m = ctx.metrics;
    m.inc(if tcp {
        Counter::TcpInputUncleanDisconnect
    } else {
        Counter::UnixStreamInputUncleanDisconnect
    });
    m.received(NO_TOPIC, 1);
    m.unclean_disconnect(tcp, partial);
    if let Some(log) = m.discard_log() {
        let info = if tcp {
            DiscardInfo::UncleanTcp
        } else {
            DiscardInfo::UncleanUnix
        };
        log.log_input(std::time::SystemTime::now(), info, partial);
    }
    log::warn!(
        "{} client disconnected in the middle of a message ({} bytes buffered)",
        if tcp { "TCP" } else { "UNIX stream" },
        partial.len()
    );
}

/// An unusable size field: the stream cannot be resynchronised, so the client is
/// disconnected and what it sent is counted as one malformed message.
fn bad_size(ctx: &InputCtx, tcp: bool, e: &FrameError, buffered: &[u8]) {
    let m = ctx.metrics;
    m.inc(match (e, tcp) {
        (FrameError::TooLarge { .. }, true) => Counter::TcpInputMsgBodyTooLarge,
        (FrameError::TooLarge { .. }, false) => Counter::UnixStreamInputMsgBodyTooLarge,
        (_, true) => Counter::TcpInputInvalidSizeField,
        (_, false) => Counter::UnixStreamInputInvalidSizeField,
    });
    m.inc(Counter::InputAgentDiscardMsgMalformed);
    m.received(NO_TOPIC, 1);
    m.input_discard(DiscardReason::Malformed, buffered);
    if let Some(log) = m.discard_log() {
        log.log_input(
            std::time::SystemTime::now(),
            DiscardInfo::Malformed,
            buffered,
        );
    }
    log::warn!("stream input: {e}; disconnecting the client");
}
