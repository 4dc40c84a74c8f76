//! The UNIX datagram input, the main path: one message per datagram. The thread blocks in
//! `recv` (waking every [`STOP_POLL`] to look at the stop flag), then drains whatever else
//! is already queued without blocking, and hands the lot to the router in one send.
//!
//! Senders block when the socket's queue is full; on Linux that queue holds
//! `net.unix.max_dgram_qlen` datagrams (often only 10), so a slow daemon slows its clients
//! rather than losing their messages.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Instant;

use super::{is_poll_timeout, remove_stale, set_mode, InputCtx, InputError, Source, STOP_POLL};
use crate::config::UnixSocketConfig;
use crate::pipeline::INPUT_BATCH_MAX;

/// A bound datagram socket whose thread is running; stopping removes the socket file.
pub struct DatagramInput {
    path: PathBuf,
    thread: JoinHandle<()>,
}

impl DatagramInput {
    /// Binds the socket (replacing a stale file) and starts the thread.
    pub fn start(
        cfg: &UnixSocketConfig,
        max_msg_size: usize,
        ctx: InputCtx,
    ) -> Result<DatagramInput, InputError> {
        match check_datagram_size(max_msg_size) {
            DatagramCheck::Ok => {}
            DatagramCheck::NeedsLargerSendBuffer => log::warn!(
                "input.max_datagram_msg_size = {max_msg_size}: clients must raise SO_SNDBUF \
                 to send datagrams that large"
            ),
            DatagramCheck::TooLarge(e) => {
                return Err(InputError::DatagramSize {
                    size: max_msg_size,
                    reason: e,
                })
            }
        }
        remove_stale(&cfg.path)?;
        let sock = UnixDatagram::bind(&cfg.path).map_err(|source| InputError::Bind {
            what: "datagram socket",
            addr: cfg.path.display().to_string(),
            source,
        })?;
        set_mode(&cfg.path, cfg.mode)?;
        sock.set_read_timeout(Some(STOP_POLL))
            .map_err(|source| InputError::Bind {
                what: "datagram socket",
                addr: cfg.path.display().to_string(),
                source,
            })?;
        let thread = std::thread::Builder::new()
            .name("input-dgram".into())
            .spawn({
                let path = cfg.path.clone();
                move || run(sock, &path, max_msg_size, ctx)
            })
            .map_err(InputError::Thread)?;
        Ok(DatagramInput {
            path: cfg.path.clone(),
            thread,
        })
    }

    /// Waits for the thread (the caller has set the stop flag); the thread removes the
    /// socket file before it takes the last queued datagrams.
    pub fn join(self) {
        if self.thread.join().is_err() {
            log::error!("datagram input thread panicked");
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Most datagrams taken after the stop flag is seen (connected clients could otherwise
/// keep the drain going for ever).
const STOP_DRAIN_MAX: usize = 100_000;

/// Datagrams taken per `recvmmsg` call.
const RECV_BATCH: usize = 32;

/// Buffers for receiving up to [`RECV_BATCH`] datagrams with one `recvmmsg` call.
struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    iovecs: Vec<libc::iovec>,
    headers: Vec<libc::mmsghdr>,
}

impl RecvBatch {
    fn new(max_msg_size: usize) -> RecvBatch {
        let mut bufs: Vec<Vec<u8>> = (0..RECV_BATCH).map(|_| vec![0u8; max_msg_size]).collect();
        let iovecs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are a valid value
        // (null name, no control data); the iovec pointers are filled in by `recv`.
        let headers: Vec<libc::mmsghdr> = (0..RECV_BATCH)
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        RecvBatch {
            bufs,
            iovecs,
            headers,
        }
    }

    /// Receives up to [`RECV_BATCH`] datagrams: blocks (up to the socket's read timeout)
    /// for the first, then takes what is already queued. Returns how many arrived.
    fn recv(&mut self, fd: std::os::fd::RawFd, flags: libc::c_int) -> std::io::Result<usize> {
        for (h, iov) in self.headers.iter_mut().zip(self.iovecs.iter_mut()) {
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_len = 0;
        }
        // SAFETY: `headers` holds RECV_BATCH initialised mmsghdr entries whose single
        // iovec each points into a live buffer of `bufs` (owned by self, not moved or
        // resized after `new`) with its true length; the kernel writes at most that many
        // bytes per entry and sets `msg_len`. A null timeout means the socket's own
        // SO_RCVTIMEO applies.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.headers.as_mut_ptr(),
                RECV_BATCH as libc::c_uint,
                flags,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// The `i`th datagram of the last `recv` (truncated ones keep only what fitted, so
    /// they fail the size check as malformed).
    fn datagram(&self, i: usize) -> &[u8] {
        let len = (self.headers[i].msg_len as usize).min(self.bufs[i].len());
        &self.bufs[i][..len]
    }
}

fn run(sock: UnixDatagram, path: &std::path::Path, max_msg_size: usize, ctx: InputCtx) {
    let mut batch = RecvBatch::new(max_msg_size);
    let mut out = Vec::with_capacity(INPUT_BATCH_MAX);
    let fd = sock.as_raw_fd();
    loop {
        match batch.recv(fd, libc::MSG_WAITFORONE) {
            Ok(n) => {
                ctx.batch_clock.set(Some(Instant::now()));
                for i in 0..n {
                    ctx.accept(batch.datagram(i), Source::Datagram, &mut out);
                }
                // While datagrams keep coming (a full queue holds only
                // net.unix.max_dgram_qlen of them), gather more before waking the router:
                // fewer, larger hand-offs.
                while out.len() + RECV_BATCH <= INPUT_BATCH_MAX {
                    match batch.recv(fd, libc::MSG_DONTWAIT) {
                        Ok(n) if n > 0 => {
                            for i in 0..n {
                                ctx.accept(batch.datagram(i), Source::Datagram, &mut out);
                            }
                        }
                        _ => break,
                    }
                }
                ctx.flush(&mut out);
            }
            Err(e) if is_poll_timeout(&e) => {
                if ctx.stopping() {
                    break;
                }
            }
            Err(e) => {
                log::error!("datagram input: recvmmsg failed: {e}");
                if ctx.stopping() {
                    break;
                }
            }
        }
    }
    // Stopping: no new clients can find the socket, then take what clients already
    // queued, so nothing the kernel accepted is dropped unseen.
    if let Err(e) = std::fs::remove_file(path) {
        log::warn!("cannot remove {}: {e}", path.display());
    }
    let mut taken = 0;
    while taken < STOP_DRAIN_MAX {
        let Ok(n) = batch.recv(fd, libc::MSG_DONTWAIT) else {
            break;
        };
        if n == 0 {
            break;
        }
        for i in 0..n {
            ctx.accept(batch.datagram(i), Source::Datagram, &mut out);
        }
        ctx.flush(&mut out);
        taken += n;
    }
    ctx.flush(&mut out);
}

/// What the start-up datagram check found (reference §1.8).
#[derive(Debug, PartialEq, Eq)]
pub enum DatagramCheck {
    /// Clients can send datagrams of the configured maximum with default buffers.
    Ok,
    /// Only with a raised `SO_SNDBUF` on the client side.
    NeedsLargerSendBuffer,
    /// Not even then: the kernel refuses datagrams that large.
    TooLarge(String),
}

/// Sends one datagram of `max_msg_size` bytes over a socket pair to learn whether
/// clients can send messages that large.
pub fn check_datagram_size(max_msg_size: usize) -> DatagramCheck {
    let (a, b) = match UnixDatagram::pair() {
        Ok(p) => p,
        Err(e) => return DatagramCheck::TooLarge(e.to_string()),
    };
    let _ = b.set_nonblocking(true);
    let _ = a.set_nonblocking(true);
    let buf = vec![0u8; max_msg_size];
    match a.send(&buf) {
        Ok(_) => return DatagramCheck::Ok,
        Err(e) if e.raw_os_error() != Some(libc::EMSGSIZE) => {
            return DatagramCheck::TooLarge(e.to_string())
        }
        Err(_) => {}
    }
    let size = libc::c_int::try_from(max_msg_size).unwrap_or(libc::c_int::MAX);
    if let Err(e) =
        nix::sys::socket::setsockopt(&a, nix::sys::socket::sockopt::SndBuf, &(size as usize))
    {
        return DatagramCheck::TooLarge(e.to_string());
    }
    match a.send(&buf) {
        Ok(_) => DatagramCheck::NeedsLargerSendBuffer,
        Err(e) => DatagramCheck::TooLarge(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_datagram_limit_passes_the_check() {
        assert_eq!(check_datagram_size(64 << 10), DatagramCheck::Ok);
    }

    #[test]
    fn huge_datagrams_are_refused() {
        assert!(matches!(
            check_datagram_size(16 << 20),
            DatagramCheck::TooLarge(_)
        ));
    }
}
