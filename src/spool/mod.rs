//! The durable spool: a write-ahead log of spooled topics' messages, so a daemon crash
//! loses none of them and a machine crash only those inside the fsync window.
//!
//! Owns: the spool directory (an exclusive `lock` file and fixed-size, preallocated
//! segment files, see `segment.rs` and the format in [`format`](mod@format)), the writer state behind
//! one mutex (`writer.rs`), each segment's count of unresolved messages, and the
//! `spool-sync` thread (group commit every `spool.fsync_interval_ms`, reclamation of
//! resolved segments). Recovery at start is in `recovery.rs`.
//!
//! How a message moves through it: an input encodes a spooled topic's message into its own
//! buffer as it accepts it, appends the batch's records before counting them received
//! ([`Spool::append`]; with `fsync_interval_ms = 0` it also waits for the sync,
//! [`Spool::sync_to`]), and each message carries a [`SpoolRef`] on its segment. Dropping
//! the message (delivered, or discarded through the one discard path) drops the ref, which
//! counts the segment's message as resolved; a sealed segment with none left is reused.
//!
//! Channels: none with the pipeline; the sync thread has a stop channel from the supervisor.
//!
//! Imports: settings, the pipeline types (topic ids, [`SpoolRef`]) and
//! [`crate::latency`]. Nothing of [`crate::report`]: the spool reports its figures through
//! [`SpoolReport`], which the metrics implement. Nothing of [`crate::input`],
//! [`crate::route`], [`crate::deliver`] or [`crate::kafka`]: the spool knows files and
//! records, not where messages go. (`tests/structure.rs` checks every role's imports.)

pub mod format;
pub mod recovery;
pub mod segment;
mod stats;
mod writer;

pub use stats::{SpoolReport, SpoolSnapshot, SpoolStats};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, tick, Sender};

use crate::config::SpoolConfig;
use crate::pipeline::{SpoolRef, TopicId};
use writer::{sync_files, Writer};
pub use writer::{AppendError, Appended};

/// How often the sync thread reclaims segments when it does not sync on a timer
/// (`fsync_interval_ms = 0`: inputs sync themselves).
const RECLAIM_INTERVAL: Duration = Duration::from_millis(100);

/// How long the `spool-sync` thread may go without a heartbeat (an `fdatasync` can take
/// long on a busy disk) before the watchdog counts it as stuck.
pub const SYNC_QUIET_MAX: Duration = Duration::from_secs(120);

/// Errors opening the spool: fatal at start-up.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("cannot create the spool directory {path} (spool.dir): {source}")]
    Dir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot lock the spool directory {path} (spool.dir; is another dory using it?): {source}"
    )]
    Lock {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read the spool directory {path}: {source}")]
    List {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the spool-sync thread: {0}")]
    Thread(std::io::Error),
}

/// The spool, shared by the inputs, recovery and the sync thread (`&'static`).
pub struct Spool {
    cfg: SpoolConfig,
    report: &'static dyn SpoolReport,
    /// Unresolved messages per segment slot.
    slots: &'static [AtomicU64],
    writer: Mutex<Writer>,
    /// Serialises group commits; `synced` is the logical position they reached.
    sync_lock: Mutex<()>,
    synced: AtomicU64,
    _lock: std::fs::File,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool").field("dir", &self.cfg.dir).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section leaves the state consistent between its steps.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Spool {
    /// Opens (creating) and locks the spool directory and reads what is there: the spool,
    /// and what recovery must replay before the inputs open.
    pub fn open(
        cfg: &SpoolConfig,
        report: &'static dyn SpoolReport,
    ) -> Result<(&'static Spool, recovery::Recovery), SpoolError> {
        let dir = cfg.dir.clone();
        std::fs::create_dir_all(&dir).map_err(|source| SpoolError::Dir {
            path: dir.clone(),
            source,
        })?;
        let lock_file = segment::lock_dir(&dir).map_err(|source| SpoolError::Lock {
            path: dir.clone(),
            source,
        })?;
        report.spool_stats().enable();
        let mut plan =
            recovery::Recovery::plan(cfg, report).map_err(|source| SpoolError::List {
                path: dir.clone(),
                source,
            })?;
        let max_segments = (cfg.max_bytes / cfg.segment_bytes).max(2);
        let slots_n = usize::try_from(max_segments)
            .unwrap_or(usize::MAX)
            .saturating_add(plan.live_count())
            .saturating_add(2);
        let slots: &'static [AtomicU64] =
            Box::leak((0..slots_n).map(|_| AtomicU64::new(0)).collect());
        let mut w = Writer::new(dir, cfg.segment_bytes, max_segments, slots_n);
        plan.prepare(&mut w);
        let spool: &'static Spool = Box::leak(Box::new(Spool {
            cfg: cfg.clone(),
            report,
            slots,
            writer: Mutex::new(w),
            sync_lock: Mutex::new(()),
            synced: AtomicU64::new(0),
            _lock: lock_file,
        }));
        {
            let mut w = lock(&spool.writer);
            if let Err(e) = w.open_active(slots) {
                spool.write_failed(&e);
            }
            w.publish_gauges(report.spool_stats());
        }
        Ok((spool, plan))
    }

    pub fn config(&self) -> &SpoolConfig {
        &self.cfg
    }

    /// Whether messages of `topic` go through the spool.
    pub fn spooled(&self, topic: &[u8]) -> bool {
        self.cfg.spooled(topic)
    }

    /// With `fsync_interval_ms = 0` an input syncs each batch itself before handing it on.
    pub fn sync_each_batch(&self) -> bool {
        self.cfg.fsync_interval.is_zero()
    }

    /// Appends a batch of encoded records (see [`format::encode_record`]); `keys` has each
    /// record's topic and tracking key, in order. Pushes one [`SpoolRef`] per written
    /// record onto `tickets`. Records after the first that could not be written are not
    /// written (the error is counted and logged here; the caller discards them).
    pub fn append(
        &self,
        buf: &mut [u8],
        keys: &[(TopicId, i64)],
        tickets: &mut Vec<SpoolRef>,
    ) -> Appended {
        let mut w = lock(&self.writer);
        let (done, err) = w.append(buf, keys, self.slots, tickets, self.report);
        if let Some(e) = err {
            self.write_failed(&e);
        }
        w.publish_gauges(self.report.spool_stats());
        done
    }

    fn write_failed(&self, e: &AppendError) {
        static LAST_LOG: Mutex<Option<Instant>> = Mutex::new(None);
        if !matches!(e, AppendError::Full(_)) {
            SpoolStats::add(&self.report.spool_stats().write_errors, 1);
        }
        // Rate-limited: a full spool refuses every batch until something resolves.
        let mut last = lock(&LAST_LOG);
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            log::error!("spool: {e}; new messages of spooled topics are discarded as spool_full");
        }
    }

    /// Returns once everything appended up to `seq` is on disk (a group commit: one caller
    /// syncs for all that wait).
    pub fn sync_to(&self, seq: u64) {
        let _g = lock(&self.sync_lock);
        if self.synced.load(Ordering::Acquire) >= seq {
            return;
        }
        self.sync_locked();
    }

    /// A group commit, `sync_lock` held.
    fn sync_locked(&self) {
        let Some((files, upto, window)) = lock(&self.writer).begin_sync() else {
            return;
        };
        let t0 = Instant::now();
        let result = sync_files(&files);
        self.report.spool_stats().synced(writer::since(t0));
        let mut w = lock(&self.writer);
        match result {
            Ok(()) => {
                w.end_sync(window, self.report);
                self.synced.fetch_max(upto, Ordering::Release);
            }
            Err(e) => {
                SpoolStats::add(&self.report.spool_stats().sync_errors, 1);
                log::error!("spool: fdatasync failed: {e}");
                w.sync_failed(files, window);
            }
        }
    }

    /// One group commit now (the sync thread's tick, and shutdown).
    pub fn sync_now(&self) {
        let _g = lock(&self.sync_lock);
        self.sync_locked();
    }

    /// Reuses segments whose messages are all resolved.
    pub fn reclaim(&self) {
        let mut w = lock(&self.writer);
        w.reclaim(self.slots);
        w.publish_gauges(self.report.spool_stats());
    }

    /// Starts the `spool-sync` thread. It calls `beat` on every tick: the watchdog's
    /// heartbeat, which should allow [`SYNC_QUIET_MAX`] between beats (a sync blocks on
    /// the disk).
    pub fn spawn_sync(
        &'static self,
        beat: impl Fn() + Send + 'static,
    ) -> Result<SyncThread, SpoolError> {
        let (stop_tx, stop_rx) = bounded::<()>(1);
        let every = if self.sync_each_batch() {
            RECLAIM_INTERVAL
        } else {
            self.cfg.fsync_interval
        };
        let handle = std::thread::Builder::new()
            .name("spool-sync".into())
            .spawn(move || {
                let ticker = tick(every);
                let mut last_reclaim = Instant::now();
                loop {
                    select! {
                        recv(stop_rx) -> _ => break,
                        recv(ticker) -> _ => {
                            beat();
                            self.sync_now();
                            if last_reclaim.elapsed() >= RECLAIM_INTERVAL {
                                self.reclaim();
                                last_reclaim = Instant::now();
                            }
                        }
                    }
                }
                self.sync_now();
                self.reclaim();
            })
            .map_err(SpoolError::Thread)?;
        Ok(SyncThread {
            stop: stop_tx,
            handle,
        })
    }
}

/// The running `spool-sync` thread.
pub struct SyncThread {
    stop: Sender<()>,
    handle: std::thread::JoinHandle<()>,
}

impl SyncThread {
    /// Stops it after a last sync and reclamation.
    pub fn stop(self) {
        let _ = self.stop.send(());
        if self.handle.join().is_err() {
            log::error!("spool-sync thread panicked");
        }
    }
}

#[cfg(test)]
impl Spool {
    /// Releases the directory lock, so a test can open the same directory again.
    fn unlock_for_test(&self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on our own open descriptor.
        unsafe { libc::flock(self._lock.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::format::{encode_record, RecordRef};
    use super::*;
    use std::collections::HashMap;

    fn cfg(dir: &std::path::Path, interval_ms: u64) -> SpoolConfig {
        SpoolConfig {
            dir: dir.to_path_buf(),
            fsync_interval: Duration::from_millis(interval_ms),
            max_bytes: 4 * 65_536,
            segment_bytes: 65_536,
            default_spooled: true,
            topics: HashMap::new(),
        }
    }

    /// What the spool reported: its figures and the synced points it set.
    #[derive(Default)]
    struct Reported {
        stats: SpoolStats,
        points: Mutex<HashMap<TopicId, i64>>,
    }

    impl SpoolReport for Reported {
        fn spool_stats(&self) -> &SpoolStats {
            &self.stats
        }
        fn set_synced_point(&self, topic: TopicId, point: i64) {
            lock(&self.points).insert(topic, point);
        }
    }

    impl Reported {
        fn spool_snapshot(&self) -> Option<SpoolSnapshot> {
            self.stats.snapshot()
        }
        fn synced_point(&self, t: TopicId) -> Option<i64> {
            lock(&self.points).get(&t).copied()
        }
    }

    fn metrics() -> &'static Reported {
        Box::leak(Box::default())
    }

    const T: TopicId = 1;

    /// Appends `n` records of 1000 value bytes, one batch; returns the holds.
    fn append(spool: &Spool, t: TopicId, first: u32, n: u32) -> (Appended, Vec<SpoolRef>) {
        let mut buf = Vec::new();
        let mut keys = Vec::new();
        for i in first..first + n {
            let value = vec![i as u8; 1000];
            let rec = RecordRef {
                partition_key: None,
                timestamp: i64::from(i),
                topic: b"t",
                key: &i.to_be_bytes(),
                value: &value,
            };
            assert!(encode_record(&rec, &mut buf));
            keys.push((t, i64::from(i)));
        }
        let mut holds = Vec::new();
        let done = spool.append(&mut buf, &keys, &mut holds);
        assert_eq!(holds.len(), done.written);
        (done, holds)
    }

    fn replay_keys(spool: &'static Spool, r: recovery::Recovery) -> (Vec<u32>, Vec<SpoolRef>) {
        let mut keys = Vec::new();
        let mut holds = Vec::new();
        r.replay(spool, |rec, hold| {
            keys.push(u32::from_be_bytes(rec.key.try_into().expect("4-byte key")));
            holds.push(hold);
        });
        (keys, holds)
    }

    #[test]
    fn segments_fill_up_to_max_bytes_are_reused_when_resolved_and_replay_what_is_left() {
        let dir = tempfile::tempdir().expect("temp dir");
        let m = metrics();
        let t = T;
        let (spool, r) = Spool::open(&cfg(dir.path(), 5), m).expect("open");
        assert_eq!(replay_keys(spool, r).0.len(), 0);
        // About 62 records of ~1040 bytes per 64 KiB segment; four segments at most.
        let (a, first) = append(spool, t, 0, 100);
        assert_eq!(a.written, 100);
        let (b, mut second) = append(spool, t, 100, 200);
        assert!(
            b.written < 200 && b.written > 100,
            "the budget stops it: {b:?}"
        );
        assert_eq!(m.spool_snapshot().expect("on").segments, 4);
        spool.sync_now();
        let s = m.spool_snapshot().expect("on");
        assert_eq!(s.appended_records, s.synced_records);
        assert_eq!(
            m.synced_point(t),
            Some(i64::from(100 + b.written as u32 - 1))
        );

        // Resolving the first batch frees its segments (all but the one shared with the
        // second batch); new records then fit again.
        drop(first);
        spool.reclaim();
        let s = m.spool_snapshot().expect("on");
        assert!(s.live_segments < 4, "{s:?}");
        let (c, third) = append(spool, t, 1000, 20);
        assert_eq!(c.written, 20);

        // A crash now: everything not yet reused is replayed, in order, from the oldest
        // segment still held (resolved records of it included: possible duplicates).
        spool.sync_now();
        spool.unlock_for_test();
        let m2 = metrics();
        let (spool2, r) = Spool::open(&cfg(dir.path(), 5), m2).expect("reopen");
        let (keys, holds) = replay_keys(spool2, r);
        let held: Vec<u32> = (100..100 + b.written as u32).chain(1000..1020).collect();
        assert!(keys.ends_with(&held), "{keys:?}");
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "in order: {keys:?}");
        assert!(
            keys.len() < 100 + held.len(),
            "reused segments are not replayed"
        );
        assert_eq!(m2.spool_snapshot().expect("on").corrupt_bytes, 0);

        // Everything resolved and a clean stop: nothing is replayed next time.
        drop(holds);
        second.clear();
        drop(third);
        let sync = spool2.spawn_sync(|| ()).expect("thread");
        sync.stop();
        spool2.unlock_for_test();
        let (spool3, r) = Spool::open(&cfg(dir.path(), 5), metrics()).expect("reopen");
        assert_eq!(r.live_count(), 0);
        assert_eq!(replay_keys(spool3, r).0, Vec::<u32>::new());
        spool3.unlock_for_test();
    }

    #[test]
    fn sync_each_batch_syncs_before_returning() {
        let dir = tempfile::tempdir().expect("temp dir");
        let m = metrics();
        let t = T;
        let (spool, _r) = Spool::open(&cfg(dir.path(), 0), m).expect("open");
        assert!(spool.sync_each_batch());
        let (a, _holds) = append(spool, t, 0, 10);
        spool.sync_to(a.seq);
        let s = m.spool_snapshot().expect("on");
        assert_eq!((s.appended_records, s.synced_records), (10, 10));
        assert_eq!(s.sync_latency.count(), 1);
        spool.sync_to(a.seq);
        assert_eq!(
            m.spool_snapshot().expect("on").sync_latency.count(),
            1,
            "already synced"
        );
        spool.unlock_for_test();
    }

    #[test]
    fn a_second_daemon_cannot_open_the_same_spool() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (spool, _r) = Spool::open(&cfg(dir.path(), 5), metrics()).expect("open");
        assert!(matches!(
            Spool::open(&cfg(dir.path(), 5), metrics()),
            Err(SpoolError::Lock { .. })
        ));
        spool.unlock_for_test();
    }
}
