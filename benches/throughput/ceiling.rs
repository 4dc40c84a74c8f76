//! The raw ceiling: a receiver that does nothing but count datagrams, bound where the
//! daemon's socket would be, fed by the same sender. The ceiling the daemon is compared
//! with is `recvmmsg` (up to 64 datagrams per call) taken as fast as the socket allows:
//! non-blocking calls while datagrams keep coming, a spin of up to [`POLL_WINDOW`] when
//! the queue is empty, and only then a blocking call. On request, the same receiver
//! without the spin (every empty queue means sleeping and being woken) and a plain
//! blocking `recv` per datagram are measured too; on virtual machines where wake-ups are
//! expensive they are far slower, so they are not ceilings.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::sender::{self, Load};
use crate::thread_usage::{thread_cpu_s, thread_switches};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `recvmmsg`, polling briefly before sleeping: the ceiling.
    Recvmmsg,
    /// `recvmmsg` with `MSG_WAITFORONE`: sleeps whenever the queue is empty.
    RecvmmsgBlocking,
    /// One blocking `recv` per datagram.
    Recv,
}

/// How long the polling receiver spins on an empty queue before it blocks.
pub const POLL_WINDOW: Duration = Duration::from_micros(50);

#[derive(Clone, Debug)]
pub struct CeilingRun {
    pub received: u64,
    /// First send to last datagram received.
    pub secs: f64,
    /// CPU time of the receiving thread (user + system).
    pub receiver_cpu_s: f64,
    /// Context switches of the receiving thread: (voluntary, involuntary).
    pub receiver_switches: (u64, u64),
    pub sender_secs: f64,
    /// CPU time of the sending thread.
    pub sender_cpu_s: f64,
    pub sender_calls: u64,
    pub sender_switches: (u64, u64),
}

const VLEN: usize = 64;

/// Binds `path`, receives `load.count` datagrams sent by [`sender::send`] in another
/// thread, and times it. Fails if no datagram arrives for `stall`.
pub fn run(path: &Path, load: &Load, mode: Mode, stall: Duration) -> io::Result<CeilingRun> {
    let _ = std::fs::remove_file(path);
    let sock = UnixDatagram::bind(path)?;
    // Short receive timeout so a dead sender cannot hang the receiver.
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    let count = load.count;
    let dgram = load.datagram_size();

    let receiver = std::thread::Builder::new()
        .name("ceiling-recv".into())
        .spawn(move || receive(sock, count, dgram, mode, stall))?;
    let sender = {
        let path = path.to_path_buf();
        let load = load.clone();
        std::thread::Builder::new()
            .name("sender".into())
            .spawn(move || sender::send(&path, &load, stall))?
    };
    let sent = sender
        .join()
        .map_err(|_| io::Error::other("sender panicked"))?;
    let received = receiver
        .join()
        .map_err(|_| io::Error::other("receiver panicked"))?;
    let _ = std::fs::remove_file(path);
    let sent = sent?;
    let (received, last, cpu, switches) = received?;
    Ok(CeilingRun {
        received,
        secs: last.saturating_duration_since(sent.start).as_secs_f64(),
        receiver_cpu_s: cpu,
        receiver_switches: switches,
        sender_secs: (sent.end - sent.start).as_secs_f64(),
        sender_calls: sent.calls,
        sender_cpu_s: sent.cpu_s,
        sender_switches: sent.switches,
    })
}

/// Returns (datagrams, time of the last one, thread CPU seconds, context switches).
fn receive(
    sock: UnixDatagram,
    count: u64,
    dgram: usize,
    mode: Mode,
    stall: Duration,
) -> io::Result<(u64, Instant, f64, (u64, u64))> {
    let fd = sock.as_raw_fd();
    // Room for one byte more than expected, so a wrong size would show as truncation.
    let slot = (dgram + 1).next_power_of_two().max(2048);
    let mut bufs = vec![0u8; slot * VLEN];
    // SAFETY: all-zero iovec/mmsghdr are valid (null pointers, zero lengths).
    let mut iovs: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; VLEN];
    let mut hdrs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; VLEN];
    let base = bufs.as_mut_ptr();
    for j in 0..VLEN {
        // SAFETY: j * slot < bufs.len().
        iovs[j].iov_base = unsafe { base.add(j * slot) }.cast();
        iovs[j].iov_len = slot;
        hdrs[j].msg_hdr.msg_iov = &mut iovs[j];
        hdrs[j].msg_hdr.msg_iovlen = 1;
    }
    let cpu0 = thread_cpu_s();
    let switches0 = thread_switches();
    let mut got = 0u64;
    let mut bad = 0u64;
    let mut last = Instant::now();
    let mut empty_since: Option<Instant> = None;
    while got < count {
        let n = match mode {
            Mode::Recvmmsg => {
                // SAFETY: as below.
                let n = unsafe { recvmmsg(fd, &mut hdrs, libc::MSG_DONTWAIT) };
                if n > 0 {
                    empty_since = None;
                    n
                } else {
                    let now = Instant::now();
                    let since = *empty_since.get_or_insert(now);
                    if now.duration_since(since) < POLL_WINDOW {
                        std::hint::spin_loop();
                        continue;
                    }
                    empty_since = None;
                    // SAFETY: as below.
                    unsafe { recvmmsg(fd, &mut hdrs, libc::MSG_WAITFORONE) }
                }
            }
            // SAFETY: hdrs describe VLEN live buffers of `slot` bytes (`bufs` outlives the
            // loop and is not otherwise touched).
            Mode::RecvmmsgBlocking => unsafe { recvmmsg(fd, &mut hdrs, libc::MSG_WAITFORONE) },
            // SAFETY: the first slot is `slot` bytes long.
            Mode::Recv => unsafe { libc::recv(fd, base.cast(), slot, 0) as i32 },
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if last.elapsed() < stall => continue,
                io::ErrorKind::WouldBlock => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("ceiling receiver: nothing for {stall:?} after {got} datagrams"),
                    ))
                }
                _ => return Err(e),
            }
        }
        last = Instant::now();
        match mode {
            Mode::Recvmmsg | Mode::RecvmmsgBlocking => {
                for h in &hdrs[..n as usize] {
                    bad += u64::from(h.msg_len as usize != dgram);
                }
                got += n as u64;
            }
            Mode::Recv => {
                bad += u64::from(n as usize != dgram);
                got += 1;
            }
        }
    }
    let cpu = thread_cpu_s() - cpu0;
    let switches1 = thread_switches();
    let switches = (switches1.0 - switches0.0, switches1.1 - switches0.1);
    if bad > 0 {
        return Err(io::Error::other(format!(
            "ceiling receiver: {bad} datagrams of unexpected size"
        )));
    }
    Ok((got, last, cpu, switches))
}

/// One `recvmmsg` call into `hdrs` (no timeout argument: the socket's own applies).
///
/// # Safety
/// Every header must describe live, writable buffers of the lengths it states.
unsafe fn recvmmsg(fd: i32, hdrs: &mut [libc::mmsghdr], flags: libc::c_int) -> i32 {
    libc::recvmmsg(
        fd,
        hdrs.as_mut_ptr(),
        hdrs.len() as u32,
        flags,
        std::ptr::null_mut(),
    )
}
