//! Heartbeats: each long-lived role thread proves it is alive and making progress, so the
//! supervisor pings the systemd watchdog only while all of them are (`src/notify.rs`).
//!
//! A thread registers a [`Heartbeat`] and calls [`Heartbeat::beat`] once per loop
//! iteration or timer tick: one relaxed load and store of a counter only that thread
//! writes, never per message. Threads that block on a channel wake at least every
//! [`TICK`] to beat, so an idle daemon still proves it is alive. A thread that blocks on
//! the network is allowed to stay quiet for as long as its timeouts let it block
//! (`quiet_max` at registration). The supervisor calls [`Liveness::check`]: a counter
//! unchanged for longer than its `quiet_max` is a stuck thread; a heartbeat dropped while
//! its thread panics is a dead one. Dropping a heartbeat normally (the thread ended as
//! designed, e.g. a dispatcher for a broker that left the cluster) unregisters it.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a thread waiting on a channel wakes up just to beat.
pub const TICK: Duration = Duration::from_secs(1);

/// How long a thread that only waits on channels, the CPU and short locks may go without
/// a beat before it counts as stuck.
pub const QUIET_MAX: Duration = Duration::from_secs(20);

const RUNNING: u8 = 0;
const ENDED: u8 = 1;
const DIED: u8 = 2;

struct Slot {
    name: String,
    beats: AtomicU64,
    state: AtomicU8,
    quiet_max: Duration,
}

/// The supervisor's view of one slot: the count it saw last and since when.
struct Seen {
    slot: Arc<Slot>,
    beats: u64,
    since: Option<Instant>,
}

/// Every registered heartbeat. One per daemon, inside the metrics.
#[derive(Default)]
pub struct Liveness {
    slots: Mutex<Vec<Seen>>,
}

/// One thread's heartbeat. Owned by that thread (not `Clone`); dropping it ends it.
pub struct Heartbeat {
    slot: Arc<Slot>,
}

impl Heartbeat {
    /// Records progress. Cheap enough for every loop iteration.
    #[inline]
    pub fn beat(&self) {
        // Only the owning thread writes the counter, so a load and a store (no atomic
        // read-modify-write) are enough; the supervisor only compares values.
        let b = &self.slot.beats;
        b.store(b.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let state = if std::thread::panicking() {
            DIED
        } else {
            ENDED
        };
        self.slot.state.store(state, Ordering::Relaxed);
    }
}

/// What one check found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The thread panicked.
    Died { thread: String },
    /// No beat for `quiet` (more than its allowance).
    Stuck { thread: String, quiet: Duration },
}

impl Problem {
    /// The thread this is about.
    pub fn thread(&self) -> &str {
        match self {
            Problem::Died { thread } | Problem::Stuck { thread, .. } => thread,
        }
    }

    /// Whether two lists name the same problems of the same threads (however long each
    /// has been stuck).
    pub fn same(a: &[Problem], b: &[Problem]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                std::mem::discriminant(x) == std::mem::discriminant(y) && x.thread() == y.thread()
            })
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Died { thread } => write!(f, "thread {thread} died"),
            Problem::Stuck { thread, quiet } => {
                write!(
                    f,
                    "thread {thread} made no progress for {}s",
                    quiet.as_secs()
                )
            }
        }
    }
}

impl Liveness {
    pub fn new() -> Liveness {
        Liveness::default()
    }

    /// Registers a heartbeat for `thread`, which may go `quiet_max` without beating.
    pub fn register(&self, thread: impl Into<String>, quiet_max: Duration) -> Heartbeat {
        let slot = Arc::new(Slot {
            name: thread.into(),
            beats: AtomicU64::new(0),
            state: AtomicU8::new(RUNNING),
            quiet_max,
        });
        self.lock().push(Seen {
            slot: slot.clone(),
            beats: 0,
            since: None,
        });
        Heartbeat { slot }
    }

    /// Looks at every heartbeat at `now`: forgets those that ended normally and returns
    /// what is wrong (empty: every thread is alive and making progress). A heartbeat's
    /// quiet time counts from the first check that saw its current count.
    pub fn check(&self, now: Instant) -> Vec<Problem> {
        let mut slots = self.lock();
        slots.retain(|s| s.slot.state.load(Ordering::Relaxed) != ENDED);
        let mut problems = Vec::new();
        for s in slots.iter_mut() {
            if s.slot.state.load(Ordering::Relaxed) == DIED {
                problems.push(Problem::Died {
                    thread: s.slot.name.clone(),
                });
                continue;
            }
            let beats = s.slot.beats.load(Ordering::Relaxed);
            match s.since {
                Some(since) if beats == s.beats => {
                    let quiet = now.saturating_duration_since(since);
                    if quiet > s.slot.quiet_max {
                        problems.push(Problem::Stuck {
                            thread: s.slot.name.clone(),
                            quiet,
                        });
                    }
                }
                _ => {
                    s.beats = beats;
                    s.since = Some(now);
                }
            }
        }
        problems
    }

    /// How many threads have a heartbeat now (ended ones may still count until the next
    /// check).
    pub fn threads(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Seen>> {
        // A panic while holding this lock leaves the list consistent (pushes and
        // retains only), so a poisoned lock is used as is.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beating_threads_are_fine() {
        let l = Liveness::new();
        let a = l.register("a", Duration::from_secs(5));
        let t0 = Instant::now();
        assert!(l.check(t0).is_empty());
        for i in 1..10 {
            a.beat();
            assert!(l.check(t0 + Duration::from_secs(4 * i)).is_empty());
        }
    }

    #[test]
    fn a_stale_heartbeat_is_a_stuck_thread() {
        let l = Liveness::new();
        let a = l.register("a", Duration::from_secs(5));
        let _b = l.register("b", Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(l.check(t0).is_empty());
        a.beat();
        assert!(l.check(t0 + Duration::from_secs(1)).is_empty());
        // No beat since t0 + 1 s: within the allowance at 6 s, stuck at 7 s.
        assert!(l.check(t0 + Duration::from_secs(6)).is_empty());
        assert_eq!(
            l.check(t0 + Duration::from_secs(7)),
            vec![Problem::Stuck {
                thread: "a".into(),
                quiet: Duration::from_secs(6)
            }]
        );
        // Beating again clears it.
        a.beat();
        assert!(l.check(t0 + Duration::from_secs(8)).is_empty());
    }

    #[test]
    fn a_panicked_thread_is_dead_and_stays_dead() {
        let l = Arc::new(Liveness::new());
        let hb = l.register("router", QUIET_MAX);
        let t = std::thread::spawn(move || {
            let _hb = hb;
            panic!("boom (expected by the test)");
        });
        assert!(t.join().is_err());
        let want = vec![Problem::Died {
            thread: "router".into(),
        }];
        let now = Instant::now();
        assert_eq!(l.check(now), want);
        assert_eq!(l.check(now + Duration::from_secs(1)), want);
        assert_eq!(want[0].to_string(), "thread router died");
    }

    #[test]
    fn an_ended_thread_is_forgotten() {
        let l = Liveness::new();
        let hb = l.register("dispatcher-3", Duration::from_secs(1));
        assert_eq!(l.threads(), 1);
        drop(hb);
        let now = Instant::now();
        assert!(l.check(now).is_empty());
        assert!(l.check(now + Duration::from_secs(10)).is_empty());
        assert_eq!(l.threads(), 0);
    }
}
