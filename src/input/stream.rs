//! The stream inputs: a UNIX stream socket and TCP on 127.0.0.1, both carrying Dory's
//! messages back to back. An acceptor thread per socket, one thread per connection (as
//! Dory does), up to [`MAX_CONNECTIONS`] per socket. A connection's thread sleeps in the
//! kernel until its client sends, so a client that sends nothing, or stalls half way
//! through a message, costs the others no CPU; it holds no read buffer either (one is
//! taken when data arrives and given back after a second of silence, keeping only a
//! partial message). A client that sends a bad size field is counted and disconnected; a
//! client that disconnects mid-message is counted too.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::wire::{FrameError, StreamFramer};
use super::{is_poll_timeout, remove_stale, set_mode, InputCtx, InputError, Source, STOP_POLL};
use crate::config::UnixSocketConfig;
use crate::pipeline::{INPUT_BATCH_MAX, NO_TOPIC};
use crate::report::discard_log::DiscardInfo;
use crate::report::liveness::{Heartbeat, QUIET_MAX};
use crate::report::metrics::{Counter, DiscardReason};

/// Most simultaneous connections per stream input; more are refused (and counted).
pub const MAX_CONNECTIONS: usize = 1024;

/// A connection that sends nothing for this many read timeouts ([`STOP_POLL`] each: 1 s)
/// gives its read buffer back, keeping only a partial message if it stalled in one.
const IDLE_RELEASE_POLLS: u32 = 10;

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Conn {
    /// Waits up to `timeout` for data (or end of stream, or an error) to read.
    fn readable_within(&self, timeout: Duration) -> bool {
        let fd = match self {
            Conn::Unix(s) => s.as_fd(),
            Conn::Tcp(s) => s.as_fd(),
        };
        let timeout =
            PollTimeout::try_from(timeout.as_millis() as i32).unwrap_or(PollTimeout::NONE);
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        // An error (EINTR) counts as readable: the read that follows tells what it was.
        poll(&mut fds, timeout).map_or(true, |n| n > 0)
    }

    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_read_timeout(d),
            Conn::Tcp(s) => s.set_read_timeout(d),
        }
    }
}

/// A running stream input.
pub struct StreamInput {
    path: Option<PathBuf>,
    thread: JoinHandle<()>,
}

impl StreamInput {
    /// Binds the UNIX stream socket (replacing a stale file) and starts accepting.
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
        let thread = spawn_acceptor("input-stream", Listener::Unix(l), max_msg_size, ctx)?;
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
        let thread = spawn_acceptor("input-tcp", Listener::Tcp(l), max_msg_size, ctx)?;
        Ok(StreamInput { path: None, thread })
    }

    /// Waits for the acceptor and every connection thread (the stop flag is set).
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

fn spawn_acceptor(
    name: &str,
    l: Listener,
    max_msg_size: usize,
    ctx: InputCtx,
) -> Result<JoinHandle<()>, InputError> {
    let nonblocking = match &l {
        Listener::Unix(u) => u.set_nonblocking(true),
        Listener::Tcp(t) => t.set_nonblocking(true),
    };
    nonblocking.map_err(InputError::Thread)?;
    std::thread::Builder::new()
        .name(name.into())
        .spawn({
            let heartbeat = ctx.metrics.liveness().register(name, QUIET_MAX);
            move || accept_loop(l, max_msg_size, ctx, &heartbeat)
        })
        .map_err(InputError::Thread)
}

fn accept_loop(l: Listener, max_msg_size: usize, ctx: InputCtx, heartbeat: &Heartbeat) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let tcp = matches!(l, Listener::Tcp(_));
    let timeout = PollTimeout::try_from(STOP_POLL.as_millis() as i32).unwrap_or(PollTimeout::NONE);
    while !ctx.stopping() {
        heartbeat.beat();
        let ready = {
            let fd = match &l {
                Listener::Unix(u) => u.as_fd(),
                Listener::Tcp(t) => t.as_fd(),
            };
            let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
            poll(&mut fds, timeout).unwrap_or(0)
        };
        workers.retain(|w| !w.is_finished());
        if ready == 0 {
            continue;
        }
        let conn = match &l {
            Listener::Unix(u) => u.accept().map(|(s, _)| Conn::Unix(s)),
            Listener::Tcp(t) => t.accept().map(|(s, _)| Conn::Tcp(s)),
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                log::warn!("stream input: accept failed: {e}");
                continue;
            }
        };
        ctx.metrics.inc(if tcp {
            Counter::NewTcpClient
        } else {
            Counter::NewUnixClient
        });
        if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            log::warn!("stream input: {MAX_CONNECTIONS} connections open; refusing a new one");
            continue;
        }
        live.fetch_add(1, Ordering::Relaxed);
        let (ctx2, live2) = (ctx.clone(), live.clone());
        let name = if tcp {
            "input-tcp-conn"
        } else {
            "input-stream-conn"
        };
        let conn_heartbeat = ctx.metrics.liveness().register(name, QUIET_MAX);
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                serve(conn, tcp, max_msg_size, &ctx2, &conn_heartbeat);
                live2.fetch_sub(1, Ordering::Relaxed);
            });
        match spawned {
            Ok(h) => workers.push(h),
            Err(e) => {
                live.fetch_sub(1, Ordering::Relaxed);
                log::error!("stream input: cannot start connection thread: {e}");
            }
        }
    }
    for w in workers {
        if w.join().is_err() {
            log::error!("stream connection thread panicked");
        }
    }
}

/// Reads one connection until the client closes it, sends garbage, or we stop.
fn serve(mut conn: Conn, tcp: bool, max_msg_size: usize, ctx: &InputCtx, heartbeat: &Heartbeat) {
    let m = ctx.metrics;
    let source = if tcp { Source::Tcp } else { Source::UnixStream };
    if let Err(e) = conn.set_read_timeout(Some(STOP_POLL)) {
        log::warn!("stream input: {e}");
        return;
    }
    let mut framer = StreamFramer::new(max_msg_size);
    let mut out = Vec::with_capacity(INPUT_BATCH_MAX);
    // Read timeouts in a row; at IDLE_RELEASE_POLLS the framer's buffer is given back.
    let mut idle_polls = 0u32;
    loop {
        heartbeat.beat();
        // A connection without a buffer (new, or idle for a while) waits until it is
        // readable before taking one: a client that sends nothing costs no memory.
        if framer.needs_room() && !conn.readable_within(STOP_POLL) {
            if ctx.stopping() {
                if !framer.buffered().is_empty() {
                    unclean(ctx, tcp, framer.buffered());
                }
                break;
            }
            continue;
        }
        let read = framer.read_from(&mut conn);
        if !matches!(&read, Err(e) if is_poll_timeout(e)) {
            idle_polls = 0;
        }
        match read {
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
                break;
            }
            Ok(_) => {
                m.inc(if tcp {
                    Counter::TcpInputSocketRead
                } else {
                    Counter::UnixStreamInputSocketRead
                });
                loop {
                    match framer.next_frame() {
                        Ok(Some(frame)) => {
                            ctx.accept(frame, source, &mut out);
                            if out.len() >= INPUT_BATCH_MAX {
                                ctx.flush(&mut out);
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            ctx.flush(&mut out);
                            bad_size(ctx, tcp, &e, framer.buffered());
                            return;
                        }
                    }
                }
                ctx.flush(&mut out);
            }
            Err(e) if is_poll_timeout(&e) => {
                idle_polls += 1;
                if idle_polls == IDLE_RELEASE_POLLS {
                    framer.release_idle();
                }
                if ctx.stopping() {
                    if !framer.buffered().is_empty() {
                        unclean(ctx, tcp, framer.buffered());
                    }
                    break;
                }
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
                break;
            }
        }
    }
    ctx.flush(&mut out);
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
