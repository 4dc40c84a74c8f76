//! Child processes (dory, Tansu) and what the bench reads about them: `/proc/<pid>/stat`
//! CPU time (per process and per thread), `/proc/<pid>/status` peak RSS, and the machine's
//! CPU use meanwhile. (dory's `/health` and `/metrics` are read with the integration tests'
//! HTTP client and parser.) Only processes started here are signalled, by their PID.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process with stdout/stderr in `<dir>/<name>.log`; killed on drop if still running.
pub struct Proc {
    child: Child,
    log: PathBuf,
    exit: Option<ExitStatus>,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command, dir: &Path) -> io::Result<Proc> {
        let log = dir.join(format!("{name}.log"));
        let f = File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start {name} ({cmd:?}): {e}")))?;
        Ok(Proc {
            child,
            log,
            exit: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// SIGTERM, then waits up to `timeout`; SIGKILL after that. Returns the exit status
    /// and whether it had to be killed.
    pub fn terminate(&mut self, timeout: Duration) -> (Option<ExitStatus>, bool) {
        if let Some(s) = self.try_exit() {
            return (Some(s), false);
        }
        // SAFETY: plain kill(2) on our own child's PID, which has not been reaped yet.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.try_exit() {
                return (Some(s), false);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.exit = self.child.wait().ok();
        (self.exit, true)
    }

    /// The last `lines` lines of the process's output.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// utime + stime of the process so far (its exited threads included), in seconds.
    pub fn cpu_s(&self) -> io::Result<f64> {
        proc_cpu_s(self.pid())
    }

    /// VmHWM (peak resident set) in bytes.
    pub fn peak_rss(&self) -> io::Result<u64> {
        proc_status_kib(self.pid(), "VmHWM:").map(|k| k * 1024)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn proc_cpu_s(pid: u32) -> io::Result<f64> {
    stat_cpu_s(&fs::read_to_string(format!("/proc/{pid}/stat"))?)
}

/// What one look at a thread (or at all threads of one name) finds.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadStats {
    /// CPU seconds, utime + stime.
    pub cpu_s: f64,
    /// Context switches where the thread slept (a blocking read, a futex wait).
    pub voluntary: u64,
    /// Context switches where another thread was given its CPU (preempted or yielded).
    /// Both kinds are wake-ups or preemptions, the costly events on a small VM.
    pub involuntary: u64,
}

/// CPU time and context switches per thread name of a live process, threads of the same
/// name (one per broker, say) added together. Threads that already exited are missing.
pub fn threads_stats(pid: u32) -> io::Result<BTreeMap<String, ThreadStats>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = entry?.path();
        let (Ok(stat), Ok(status), Ok(comm)) = (
            fs::read_to_string(path.join("stat")),
            fs::read_to_string(path.join("status")),
            fs::read_to_string(path.join("comm")),
        ) else {
            continue; // exited meanwhile
        };
        let e: &mut ThreadStats = out.entry(thread_kind(&comm)).or_default();
        e.cpu_s += stat_cpu_s(&stat)?;
        e.voluntary += status_value(&status, "voluntary_ctxt_switches:").unwrap_or(0);
        e.involuntary += status_value(&status, "nonvoluntary_ctxt_switches:").unwrap_or(0);
    }
    Ok(out)
}

/// Makes `cmd`'s process (and so all its threads) run only on `cpus`.
pub fn set_cpus(cmd: &mut Command, cpus: &[usize]) {
    use std::os::unix::process::CommandExt;
    // SAFETY: cpu_set_t is a plain bit set for which all-zero bytes are the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET ignores numbers beyond the set's size.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: the closure only calls sched_setaffinity (async-signal-safe) on a set copied
    // into it; it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A thread's name with digits replaced: per-broker threads differ only by the broker id,
/// so all of them make one line.
fn thread_kind(comm: &str) -> String {
    comm.trim()
        .chars()
        .map(|c| if c.is_ascii_digit() { 'N' } else { c })
        .collect()
}

fn stat_cpu_s(stat: &str) -> io::Result<f64> {
    // Fields after the parenthesised command name (which may contain spaces): state is
    // field 3, utime field 14, stime field 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::other("bad /proc stat"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> io::Result<u64> {
        f.get(i)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other("bad /proc stat field"))
    };
    let total = ticks(11)? + ticks(12)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(total as f64 / hz)
}

fn proc_status_kib(pid: u32, key: &str) -> io::Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status_value(&status, key)
        .ok_or_else(|| io::Error::other(format!("no {key} in /proc/{pid}/status")))
}

/// The number after `key` (e.g. `"VmHWM:"`) in a `/proc/.../status` text.
fn status_value(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A free TCP port on 127.0.0.1 (bound once to let the kernel choose, then released).
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A scratch directory removed on drop.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> io::Result<ScratchDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p =
            std::env::temp_dir().join(format!("dory-bench-{tag}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&p)?;
        Ok(ScratchDir(p))
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::env::var_os("DORY_BENCH_KEEP").is_none() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// Machine-wide and own CPU use at one moment, to tell how much of the machine other
/// processes took during a measurement (the bench assumes a quiet machine).
#[derive(Clone, Copy, Debug)]
pub struct CpuSnapshot {
    at: Instant,
    /// user + nice + system of all CPUs, from /proc/stat.
    busy_s: f64,
    /// Time the hypervisor ran something else while a CPU wanted to run.
    steal_s: f64,
    /// utime + stime of this process and the given children.
    own_s: f64,
}

impl CpuSnapshot {
    pub fn take(pids: &[u32]) -> CpuSnapshot {
        let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
        let f: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0.0))
            .collect();
        let get = |i: usize| f.get(i).copied().unwrap_or(0.0);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let own: f64 = std::iter::once(std::process::id())
            .chain(pids.iter().copied())
            .filter_map(|p| proc_cpu_s(p).ok())
            .sum();
        CpuSnapshot {
            at: Instant::now(),
            busy_s: (get(0) + get(1) + get(2)) / hz,
            steal_s: get(7) / hz,
            own_s: own,
        }
    }

    /// Average cores used by other processes between `self` and `later`, and cores stolen.
    pub fn others_since(&self, later: &CpuSnapshot) -> (f64, f64) {
        let wall = (later.at - self.at).as_secs_f64().max(1e-3);
        let others = (later.busy_s - self.busy_s) - (later.own_s - self.own_s);
        if std::env::var_os("DORY_BENCH_DEBUG").is_some() {
            eprintln!(
                "cpu window {wall:.3} s: machine busy {:.2} s, ours {:.2} s, steal {:.2} s",
                later.busy_s - self.busy_s,
                later.own_s - self.own_s,
                later.steal_s - self.steal_s
            );
        }
        (
            (others / wall).max(0.0),
            ((later.steal_s - self.steal_s) / wall).max(0.0),
        )
    }
}
