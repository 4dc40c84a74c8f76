//! The UNIX datagram input, the main path: one message per datagram. The thread blocks in
//! `recvmmsg` (waking every [`STOP_POLL`] to look at the stop flag), then takes whatever
//! else is queued without blocking, and hands messages to the router in batches of up to
//! [`INPUT_BATCH_MAX`]. While senders are ahead of it (a backlog), it polls an empty queue
//! for a short while before sleeping ([`BusyPoll`]). When a sender it woke is queued on
//! its own CPU and preempts it, it moves to another CPU (`input.avoid_sender_cpu`,
//! `input::unstack`).
//!
//! Senders block when the socket's queue is full; on Linux that queue holds
//! `net.unix.max_dgram_qlen` datagrams (often only 10), so a slow daemon slows its clients
//! rather than losing their messages.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::unstack::Unstack;
use super::{is_poll_timeout, remove_stale, set_mode, InputCtx, InputError, Source, STOP_POLL};
use crate::config::UnixSocketConfig;
use crate::pipeline::INPUT_BATCH_MAX;
use crate::report::liveness::QUIET_MAX;

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
        busy_poll: Duration,
        avoid_sender_cpu: bool,
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
                move || run(sock, &path, max_msg_size, busy_poll, avoid_sender_cpu, ctx)
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

/// How far each receive buffer starts past a multiple of the cache's set period: 5 lines.
const BUFFER_SHIFT: usize = 5 * 64;

/// A transparent huge page: [`RecvBatch`]'s region starts on one, so that its buffers,
/// 64 KiB apart by default, need one TLB entry rather than one each (only that first one
/// is asked for: at most 2 MiB of memory whatever the datagram limit).
const HUGE_PAGE: usize = 2 << 20;

/// Buffers for receiving up to [`RECV_BATCH`] datagrams with one `recvmmsg` call.
///
/// One region, a buffer of the largest datagram per slot, each starting [`BUFFER_SHIFT`]
/// bytes further past a 64-byte boundary than the one before. With buffers of 64 KiB (the
/// default largest datagram) laid out at a multiple of 4 KiB, every datagram began at
/// nearly the same offset within its page, so the lines a receive writes and the input
/// then reads fell into the same few cache sets, more of them than those sets hold. And
/// the region starts on a huge page and asks for huge pages (`MADV_HUGEPAGE`; where the
/// kernel allows them, as with `transparent_hugepage = madvise`), so 32 buffers on 32
/// pages do not take 32 TLB entries (doc/performance.md, "Round twenty-two").
struct RecvBatch {
    /// `start` bytes of padding (up to the first huge page boundary), then `RECV_BATCH`
    /// buffers of `max_msg_size` bytes, `stride` bytes apart.
    region: Vec<u8>,
    start: usize,
    stride: usize,
    max_msg_size: usize,
    iovecs: Vec<libc::iovec>,
    headers: Vec<libc::mmsghdr>,
}

impl RecvBatch {
    fn new(max_msg_size: usize) -> RecvBatch {
        let stride = max_msg_size.next_multiple_of(64) + BUFFER_SHIFT;
        let used = RECV_BATCH * stride;
        // Room to start on a huge page boundary; the padding before it is never touched.
        let mut region = vec![0u8; used + HUGE_PAGE];
        let start = region.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
        // The first huge page only: with larger datagram limits each buffer would
        // otherwise fault in a huge page of its own (32 × 2 MiB of memory).
        // SAFETY: the range lies within `region` (start + used.min(HUGE_PAGE) <=
        // region.len()), which this struct owns; MADV_HUGEPAGE only changes how the
        // kernel backs the pages, not their contents. Refused (no transparent huge
        // pages), nothing changes.
        unsafe {
            libc::madvise(
                region.as_mut_ptr().add(start).cast(),
                used.min(HUGE_PAGE),
                libc::MADV_HUGEPAGE,
            );
        }
        let iovecs: Vec<libc::iovec> = region[start..start + used]
            .chunks_exact_mut(stride)
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: max_msg_size,
            })
            .collect();
        // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are a valid value
        // (null name, no control data); the iovec pointers are filled in by `recv`.
        let headers: Vec<libc::mmsghdr> = (0..RECV_BATCH)
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        RecvBatch {
            region,
            start,
            stride,
            max_msg_size,
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
        // iovec each points into its own buffer of `region` (owned by self, not moved or
        // resized after `new`) with that buffer's true length; the kernel writes at most that many
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

    /// The first `n` datagrams of the last `recv` (truncated ones keep only what fitted,
    /// so they fail the size check as malformed).
    fn datagrams(&self, n: usize) -> impl Iterator<Item = &[u8]> {
        self.headers
            .iter()
            .zip(self.region[self.start..].chunks_exact(self.stride))
            .take(n)
            .map(|(h, b)| &b[..(h.msg_len as usize).min(self.max_msg_size)])
    }
}

fn run(
    sock: UnixDatagram,
    path: &std::path::Path,
    max_msg_size: usize,
    busy_poll: Duration,
    avoid_sender_cpu: bool,
    ctx: InputCtx,
) {
    let mut batch = RecvBatch::new(max_msg_size);
    let mut out = Vec::with_capacity(INPUT_BATCH_MAX);
    let fd = sock.as_raw_fd();
    let full = full_queue_len();
    let mut poller = BusyPoll::new(busy_poll, full);
    // Off, or pinned to one CPU: never moves.
    let mut unstack = avoid_sender_cpu.then(Unstack::new).flatten();
    // After each receive: one that found the queue full woke a blocked sender.
    let mut after_receive = |n: usize| {
        if let Some(u) = unstack.as_mut().filter(|_| n >= full) {
            u.after_full_receive();
        }
    };
    let heartbeat = ctx.metrics.liveness().register("input-dgram", QUIET_MAX);
    loop {
        heartbeat.beat();
        match batch.recv(fd, libc::MSG_WAITFORONE) {
            Ok(n) => {
                after_receive(n);
                let now = Instant::now();
                ctx.batch_clock.set(Some(now));
                ctx.accept_many(batch.datagrams(n), Source::Datagram, &mut out);
                poller.arrived(n, now);
                // Messages wait in `out` at most MAX_HOLD while the input polls.
                let mut held_since = (!out.is_empty()).then_some(now);
                // While datagrams keep coming, keep taking them without sleeping, and
                // hand them to the router in batches of up to INPUT_BATCH_MAX.
                loop {
                    if out.len() + RECV_BATCH > INPUT_BATCH_MAX {
                        ctx.flush(&mut out);
                        // Once per full batch: a steady flood never leaves this loop.
                        heartbeat.beat();
                        held_since = None;
                        if ctx.stopping() {
                            break;
                        }
                    }
                    match batch.recv(fd, libc::MSG_DONTWAIT) {
                        Ok(n) if n > 0 => {
                            after_receive(n);
                            let now = Instant::now();
                            ctx.batch_clock.set(Some(now));
                            ctx.accept_many(batch.datagrams(n), Source::Datagram, &mut out);
                            poller.arrived(n, now);
                            if held_since.is_none() && !out.is_empty() {
                                held_since = Some(now);
                            }
                        }
                        _ => {
                            let now = Instant::now();
                            if held_since.is_some_and(|h| now.duration_since(h) >= MAX_HOLD) {
                                ctx.flush(&mut out);
                                held_since = None;
                            }
                            if !poller.keep_polling(now) {
                                break;
                            }
                            // Poll by yielding rather than spinning: the kernel often
                            // wakes a blocked sender on this very CPU, and the router
                            // (SCHED_BATCH) waits for this thread to step aside; a
                            // spin would only keep both from running. With nothing
                            // else runnable here, the call returns at once.
                            // SAFETY: no arguments, no memory.
                            unsafe { libc::sched_yield() };
                        }
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
        if ctx.stopping() {
            break;
        }
    }
    if let Some(moves) = unstack.as_ref().map(Unstack::moves).filter(|&m| m > 0) {
        log::info!("datagram input: moved off its senders' CPU {moves} times");
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
        ctx.accept_many(batch.datagrams(n), Source::Datagram, &mut out);
        ctx.flush(&mut out);
        taken += n;
    }
    ctx.flush(&mut out);
}

/// Longest time accepted messages wait in the input while it keeps polling (a slow
/// trickle can keep it polling for up to [`BACKLOG_HOLD`] before a batch fills).
const MAX_HOLD: Duration = Duration::from_millis(1);

/// Decides whether the input keeps polling an empty socket rather than sleep.
///
/// When senders fill the socket's queue faster than the input takes from it, every empty
/// queue means the input sleeps, the next datagram wakes it, and the senders, blocked on
/// the full queue, sleep and are woken in turn: on a small virtual machine those wake-ups
/// cost more per datagram than the receive itself and cap intake at a fraction of what the
/// socket can carry. So while there is a backlog (a receive found the queue full in the
/// last [`BACKLOG_HOLD`]), the input keeps polling for up to `window` after the last
/// datagram before it sleeps. Without a backlog it never spins: a daemon that keeps up
/// costs nothing extra. A spin that finds nothing for a whole window (senders pausing
/// between bursts, or slow to wake) stops spinning for a cooldown that doubles while it
/// keeps happening, so bursty senders cost at most one window per [`COOLDOWN_MAX`]. The
/// cooldown goes back to [`COOLDOWN_MIN`] only while nearly every spin finds a datagram
/// ([`GOOD_SPIN_RATE`]): a sender that keeps the input busy, not one that half the time
/// leaves it spinning in vain while sleeping would keep up too.
#[derive(Debug)]
pub struct BusyPoll {
    window: Duration,
    /// A receive returning this many datagrams found the queue full.
    full: usize,
    /// Last time a datagram arrived.
    last_arrival: Option<Instant>,
    /// Last time a receive found the queue full.
    last_backlog: Option<Instant>,
    /// After a spin that found nothing, no spinning until then.
    cooldown_until: Option<Instant>,
    /// The next cooldown: doubles with every spin that finds nothing, back to
    /// [`COOLDOWN_MIN`] when one finds a datagram while spins mostly do.
    cooldown: Duration,
    /// Moving average of spin outcomes: 1 found a datagram, 0 found nothing.
    good_spins: f32,
    /// Polling an empty queue now (since the last datagram).
    spinning: bool,
}

/// How long one full queue keeps the input in polling mode.
pub const BACKLOG_HOLD: Duration = Duration::from_millis(10);
/// No spinning for this long after a spin that found nothing...
pub const COOLDOWN_MIN: Duration = Duration::from_micros(250);
/// ...doubling, up to this, while spins keep finding nothing.
pub const COOLDOWN_MAX: Duration = Duration::from_millis(20);
/// Share of spins that must find a datagram for the cooldown to shrink back.
pub const GOOD_SPIN_RATE: f32 = 0.9;
/// Weight of the newest spin in [`BusyPoll::good_spins`].
const SPIN_WEIGHT: f32 = 1.0 / 16.0;

impl BusyPoll {
    /// `window`: longest spin on an empty queue (zero: never spin); `full`: how many
    /// datagrams one receive returns when the queue was full.
    pub fn new(window: Duration, full: usize) -> BusyPoll {
        BusyPoll {
            window,
            full: full.max(1),
            last_arrival: None,
            last_backlog: None,
            cooldown_until: None,
            cooldown: COOLDOWN_MIN,
            good_spins: 1.0,
            spinning: false,
        }
    }

    /// Records a receive that returned `n > 0` datagrams at `now`.
    pub fn arrived(&mut self, n: usize, now: Instant) {
        self.last_arrival = Some(now);
        if self.spinning {
            self.spinning = false;
            self.good_spins += (1.0 - self.good_spins) * SPIN_WEIGHT;
            if self.good_spins >= GOOD_SPIN_RATE {
                self.cooldown = COOLDOWN_MIN;
            }
        }
        if n >= self.full {
            self.last_backlog = Some(now);
        }
    }

    /// Whether to poll again, at `now`, after a receive found the queue empty.
    pub(crate) fn keep_polling(&mut self, now: Instant) -> bool {
        let (Some(arrival), Some(backlog)) = (self.last_arrival, self.last_backlog) else {
            return false;
        };
        if self.cooldown_until.is_some_and(|u| now < u)
            || now.saturating_duration_since(backlog) >= BACKLOG_HOLD
        {
            return false;
        }
        if now.saturating_duration_since(arrival) < self.window {
            self.spinning = true;
            return true;
        }
        // A whole window without a datagram: the senders pause between bursts, or are
        // slow to wake, rather than wait on us. Spinning then only burns CPU, so not
        // again for a while, longer each time it happens in a row: while spins keep
        // finding nothing, at most one window per COOLDOWN_MAX is wasted.
        if self.spinning {
            self.spinning = false;
            self.good_spins -= self.good_spins * SPIN_WEIGHT;
            self.cooldown_until = Some(now + self.cooldown);
            self.cooldown = (self.cooldown * 2).min(COOLDOWN_MAX);
        }
        false
    }
}

/// How many datagrams one receive returns when the socket's queue was full: the kernel's
/// queue limit for UNIX datagram sockets (`net.unix.max_dgram_qlen`, read at start; 10
/// when unreadable), at most [`RECV_BATCH`].
fn full_queue_len() -> usize {
    std::fs::read_to_string("/proc/sys/net/unix/max_dgram_qlen")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(10)
        .clamp(1, RECV_BATCH)
}

/// What the start-up datagram check found (reference §1.8).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DatagramCheck {
    /// Clients can send datagrams of the configured maximum with default buffers.
    Ok,
    /// Only with a raised `SO_SNDBUF` on the client side.
    NeedsLargerSendBuffer,
    /// Not even then: the kernel refuses datagrams that large.
    TooLarge(String),
}

/// Sends one datagram of `max_msg_size` bytes over a socket pair to learn whether
/// clients can send messages that large.
pub(crate) fn check_datagram_size(max_msg_size: usize) -> DatagramCheck {
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

    /// Sends datagrams of `sizes` (each a distinct byte pattern) over a socket pair,
    /// receives them with one `RecvBatch` of `max`, and checks that they come out in order,
    /// whole, or cut at `max`.
    fn through_batch(max: usize, sizes: &[usize]) {
        let (tx, rx) = UnixDatagram::pair().expect("socket pair");
        let sent: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(d, &n)| (0..n).map(|i| (d * 31 + i * 7) as u8).collect())
            .collect();
        for d in &sent {
            tx.send(d).expect("send");
        }
        let mut batch = RecvBatch::new(max);
        assert_eq!(batch.region[batch.start..].as_ptr() as usize % HUGE_PAGE, 0);
        let n = batch
            .recv(rx.as_raw_fd(), libc::MSG_DONTWAIT)
            .expect("receive");
        assert_eq!(n, sizes.len(), "all queued datagrams in one receive");
        let got: Vec<&[u8]> = batch.datagrams(n).collect();
        let want: Vec<&[u8]> = sent.iter().map(|d| &d[..d.len().min(max)]).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn datagrams_come_out_whole_and_in_order() {
        through_batch(64 << 10, &[1, 100, 0, 5000, 64 << 10, (64 << 10) + 10, 7]);
        // A size that is no multiple of a cache line, and each buffer's last byte.
        through_batch(1000, &[1000, 999, 1001, 3, 64, 65]);
    }

    const W: Duration = Duration::from_micros(50);

    #[test]
    fn no_spin_without_a_backlog() {
        let t = Instant::now();
        let mut p = BusyPoll::new(W, 10);
        assert!(!p.keep_polling(t), "nothing arrived yet");
        for i in 0..1000 {
            p.arrived(9, t + Duration::from_micros(i));
        }
        assert!(!p.keep_polling(t + Duration::from_micros(1000)));
    }

    #[test]
    fn spins_within_the_window_after_a_full_queue() {
        let t = Instant::now();
        let mut p = BusyPoll::new(W, 10);
        p.arrived(10, t);
        assert!(p.keep_polling(t));
        assert!(p.keep_polling(t + Duration::from_micros(49)));
        assert!(!p.keep_polling(t + W), "window over");
        // Small receives keep it spinning while the backlog is recent...
        p.arrived(1, t + Duration::from_millis(5));
        assert!(p.keep_polling(t + Duration::from_millis(5) + Duration::from_micros(10)));
        // ...but not once the last full queue is older than BACKLOG_HOLD.
        let late = t + BACKLOG_HOLD + Duration::from_micros(5);
        p.arrived(1, late);
        assert!(!p.keep_polling(late));
    }

    #[test]
    fn fruitless_spins_back_off_and_a_fruitful_one_resets() {
        let us = Duration::from_micros;
        let t0 = Instant::now();
        let mut p = BusyPoll::new(W, 10);
        // A sender that fills the queue, then pauses longer than the window, repeatedly.
        let mut t = t0;
        let mut cooldowns = Vec::new();
        for _ in 0..8 {
            p.arrived(10, t);
            if p.keep_polling(t + us(1)) {
                assert!(!p.keep_polling(t + W + us(1)), "window over");
                let until = p
                    .cooldown_until
                    .expect("a fruitless spin starts a cooldown");
                cooldowns.push(until - (t + W + us(1)));
                assert!(
                    !p.keep_polling(until - us(1)),
                    "no spinning while cooling down"
                );
                t = until;
            } else {
                t += us(100);
            }
        }
        assert_eq!(cooldowns[0], COOLDOWN_MIN);
        assert!(cooldowns
            .windows(2)
            .all(|w| w[1] == (w[0] * 2).min(COOLDOWN_MAX)));
        assert_eq!(*cooldowns.last().unwrap(), COOLDOWN_MAX);
        // After eight spins in vain, one that finds a datagram is not enough...
        let fruitful_spin = |p: &mut BusyPoll, t: Instant| {
            p.arrived(10, t);
            assert!(p.keep_polling(t + us(1)));
            p.arrived(1, t + us(2));
        };
        fruitful_spin(&mut p, t);
        assert!(p.keep_polling(t + us(3)));
        assert!(!p.keep_polling(t + us(2) + W));
        assert_eq!(p.cooldown_until, Some(t + us(2) + W + COOLDOWN_MAX));
        // ...but a run of them, a sender that keeps the input busy, is.
        let mut t = t + us(2) + W + COOLDOWN_MAX;
        for _ in 0..40 {
            fruitful_spin(&mut p, t);
            t += us(10);
        }
        assert!(p.good_spins >= GOOD_SPIN_RATE, "{}", p.good_spins);
        let last = t - us(8);
        assert!(p.keep_polling(last + us(1)));
        assert!(!p.keep_polling(last + W));
        assert_eq!(p.cooldown_until, Some(last + W + COOLDOWN_MIN));
    }

    #[test]
    fn zero_window_never_spins() {
        let t = Instant::now();
        let mut p = BusyPoll::new(Duration::ZERO, 10);
        p.arrived(32, t);
        assert!(!p.keep_polling(t));
    }

    #[test]
    fn full_queue_len_is_within_one_receive() {
        assert!((1..=RECV_BATCH).contains(&full_queue_len()));
    }

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
