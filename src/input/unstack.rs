//! Keeps the datagram input off the CPU its senders are woken onto.
//!
//! A receive that frees room in a full socket queue wakes the blocked sender with a
//! "sync" wake-up: the kernel takes it as a hint that the waker is about to sleep and
//! queues the sender on the waker's own CPU, where it preempts the input at once, even
//! while the other CPU is idle. From then on the two take turns on one CPU: the sender
//! fills the queue and blocks, the input drains it and is preempted by the sender it
//! woke. The load balancer leaves them there, both being cache-hot.
//!
//! [`Unstack`] notices such a preemption (the thread's involuntary context switches,
//! read after a receive that found the queue full) and moves the input to another CPU it
//! is allowed on, then gives its full CPU set back, so it stays free to be balanced. The
//! sender's next wake-up then finds its previous CPU idle and goes back there.

use std::mem::MaybeUninit;

/// Moves the calling thread off its CPU when a sender it woke preempted it.
pub struct Unstack {
    /// Involuntary context switches at the last look.
    preempted: i64,
    /// Moves made so far.
    moves: u64,
}

impl Unstack {
    /// For the calling thread; `None` when it may run on one CPU only (pinned by the
    /// operator, or a one-CPU machine), or the kernel refuses to tell.
    pub fn new() -> Option<Unstack> {
        let allowed = affinity()?;
        // SAFETY: reads the set only.
        if unsafe { libc::CPU_COUNT(&allowed) } < 2 {
            return None;
        }
        Some(Unstack {
            preempted: involuntary_switches(),
            moves: 0,
        })
    }

    /// Called after a receive that found the socket's queue full (so it woke a blocked
    /// sender): if the thread was preempted since the last call, moves it to another of
    /// its CPUs.
    pub fn after_full_receive(&mut self) {
        let now = involuntary_switches();
        if now <= self.preempted {
            return;
        }
        if move_away() {
            self.moves += 1;
        }
        // The move itself counts as a switch: start afresh after it.
        self.preempted = involuntary_switches();
    }

    /// Moves made so far.
    pub fn moves(&self) -> u64 {
        self.moves
    }
}

/// The calling thread's CPU set, read afresh (an operator may change it at any time).
fn affinity() -> Option<libc::cpu_set_t> {
    let mut set = MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: `set` is a zeroed cpu_set_t of the size passed; the kernel writes the
    // calling thread's (pid 0) mask into it.
    let rc = unsafe {
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set.as_mut_ptr())
    };
    // SAFETY: initialised by zeroing, then by the kernel.
    (rc == 0).then(|| unsafe { set.assume_init() })
}

/// Moves the calling thread to another CPU of its set, then gives it its whole set back
/// (so the balancer stays free to move it). False when there is no other CPU to go to or
/// the kernel refused.
fn move_away() -> bool {
    let Some(allowed) = affinity() else {
        return false;
    };
    // SAFETY: no arguments; returns the CPU the caller runs on, or -1.
    let Ok(cpu) = usize::try_from(unsafe { libc::sched_getcpu() }) else {
        return false;
    };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let mut away = allowed;
    // SAFETY: CPU_CLR, CPU_COUNT and sched_setaffinity take a valid cpu_set_t of the
    // size given (CPU_CLR ignores a CPU number past the set); pid 0 is the calling thread.
    unsafe {
        libc::CPU_CLR(cpu, &mut away);
        if libc::CPU_COUNT(&away) == 0 || libc::sched_setaffinity(0, size, &away) != 0 {
            return false;
        }
        // Running elsewhere now: the whole set again.
        libc::sched_setaffinity(0, size, &allowed) == 0
    }
}

/// The calling thread's involuntary context switches so far (0 if unreadable).
fn involuntary_switches() -> i64 {
    let mut ru = MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a zeroed rusage the kernel fills for the calling thread.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: initialised by zeroing, then by the kernel.
    unsafe { ru.assume_init() }.ru_nivcsw
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(set: &libc::cpu_set_t) -> i32 {
        // SAFETY: reads the set only.
        unsafe { libc::CPU_COUNT(set) }
    }

    fn same(a: &libc::cpu_set_t, b: &libc::cpu_set_t) -> bool {
        // SAFETY: CPU_EQUAL reads both sets only.
        unsafe { libc::CPU_EQUAL(a, b) }
    }

    /// Runs `f` on a thread of its own, so affinity changes stay off the test runner's.
    fn on_own_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().expect("test thread");
    }

    #[test]
    fn moves_to_another_cpu_and_keeps_its_set() {
        on_own_thread(|| {
            let before = affinity().expect("readable");
            if count(&before) < 2 {
                // One CPU: nothing to move to, and no Unstack.
                assert!(Unstack::new().is_none());
                assert!(!move_away());
                return;
            }
            // SAFETY: no arguments.
            let from = unsafe { libc::sched_getcpu() };
            assert!(move_away());
            // SAFETY: no arguments.
            let to = unsafe { libc::sched_getcpu() };
            assert_ne!(from, to, "still on CPU {from}");
            assert!(same(&before, &affinity().expect("readable")));
        });
    }

    #[test]
    fn pinned_thread_is_left_alone() {
        on_own_thread(|| {
            // SAFETY: no arguments.
            let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).expect("a CPU");
            let one = MaybeUninit::<libc::cpu_set_t>::zeroed();
            // SAFETY: a zeroed set, then one CPU added; set on this thread only.
            let one = unsafe {
                let mut one = one.assume_init();
                libc::CPU_SET(cpu, &mut one);
                assert_eq!(
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one),
                    0
                );
                one
            };
            assert!(Unstack::new().is_none());
            assert!(!move_away());
            assert!(same(&one, &affinity().expect("readable")));
        });
    }

    #[test]
    fn no_move_without_a_preemption() {
        on_own_thread(|| {
            let Some(mut u) = Unstack::new() else {
                return;
            };
            // As if no switch had happened since the last look.
            u.preempted = i64::MAX;
            u.after_full_receive();
            assert_eq!(u.moves(), 0);
            // As if one had.
            u.preempted = -1;
            u.after_full_receive();
            assert_eq!(u.moves(), 1);
        });
    }
}
