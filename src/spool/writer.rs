//! The append side: inputs append encoded records under one mutex (one positioned write
//! per run of records that fits the active segment), and the group commit that syncs every
//! dirty segment and publishes what is now on disk. Reclamation of resolved segments and
//! the segment budget (`spool.max_bytes`) are here too.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::format::{encoded_record_len, seal_record, FREE_SEGMENT, HEADER_LEN};
use super::segment::SegmentFile;
use super::{SpoolReport, SpoolStats};
use crate::pipeline::{SpoolRef, TopicId};

/// Spare (free) segment files kept for reuse; more are deleted.
const MAX_SPARES: usize = 2;

/// A segment holding messages: the active one, or a sealed one with unresolved messages.
#[derive(Debug)]
pub(super) struct Live {
    pub(super) id: u64,
    pub(super) slot: usize,
    pub(super) seg: Arc<SegmentFile>,
    /// Bytes of records written (the active segment's append offset).
    pub(super) used: u64,
}

/// Why records could not be appended.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("spool.max_bytes reached ({0} segment files); nothing resolved yet to reuse")]
    Full(u64),
    #[error("cannot create a segment file: {0}")]
    Create(std::io::Error),
    #[error("cannot write to segment {id}: {source}")]
    Write { id: u64, source: std::io::Error },
    #[error("no free segment slot")]
    NoSlot,
}

/// What one append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Records written, from the first: the rest failed.
    pub written: usize,
    /// The spool's logical write position after them (for [`super::Spool::sync_to`]).
    pub seq: u64,
}

/// Per-topic tracking keys of records appended and not yet synced.
#[derive(Debug, Default)]
pub(super) struct Window {
    /// (topic, smallest key, largest key, records).
    topics: Vec<(TopicId, i64, i64, u64)>,
}

impl Window {
    fn add(&mut self, t: TopicId, key: i64) {
        match self.topics.iter_mut().find(|w| w.0 == t) {
            Some(w) => {
                w.1 = w.1.min(key);
                w.2 = w.2.max(key);
                w.3 += 1;
            }
            None => self.topics.push((t, key, key, 1)),
        }
    }

    fn min(&self, t: TopicId) -> Option<i64> {
        self.topics.iter().find(|w| w.0 == t).map(|w| w.1)
    }
}

/// The writer's state, behind the spool's mutex.
#[derive(Debug)]
pub(super) struct Writer {
    pub(super) dir: std::path::PathBuf,
    pub(super) segment_bytes: u64,
    pub(super) max_segments: u64,
    pub(super) active: Option<Live>,
    /// Sealed segments with unresolved messages (or not yet synced).
    pub(super) sealed: Vec<Live>,
    pub(super) spares: Vec<SegmentFile>,
    /// Segment files on disk (active, sealed, spare).
    pub(super) files: u64,
    pub(super) next_id: u64,
    pub(super) next_file: u64,
    pub(super) free_slots: Vec<usize>,
    /// Logical bytes appended since start.
    pub(super) written: u64,
    /// Segments written since the last sync (sealed ones; the active one is `active_dirty`).
    dirty: Vec<Arc<SegmentFile>>,
    active_dirty: bool,
    window: Window,
    /// The window handed back by the last sync, reused so appends do not allocate.
    spare_window: Window,
    /// Per topic: the largest key synced so far.
    synced_max: Vec<(TopicId, i64)>,
}

impl Writer {
    pub(super) fn new(
        dir: std::path::PathBuf,
        segment_bytes: u64,
        max_segments: u64,
        slots: usize,
    ) -> Writer {
        Writer {
            dir,
            segment_bytes,
            max_segments,
            active: None,
            sealed: Vec::new(),
            spares: Vec::new(),
            files: 0,
            next_id: 1,
            next_file: 1,
            free_slots: (0..slots).rev().collect(),
            written: 0,
            dirty: Vec::new(),
            active_dirty: false,
            window: Window::default(),
            spare_window: Window::default(),
            synced_max: Vec::new(),
        }
    }

    fn capacity(&self) -> u64 {
        self.segment_bytes - HEADER_LEN as u64
    }

    pub(super) fn publish_gauges(&self, stats: &SpoolStats) {
        SpoolStats::set(&stats.segments, self.files);
        SpoolStats::set(&stats.bytes, self.files * self.segment_bytes);
        SpoolStats::set(
            &stats.live_segments,
            self.sealed.len() as u64 + u64::from(self.active.is_some()),
        );
    }

    /// Makes a new active segment: a spare reused, or a new file within the budget.
    pub(super) fn open_active(&mut self, slots: &[AtomicU64]) -> Result<(), AppendError> {
        if let Some(old) = self.active.take() {
            if self.active_dirty {
                self.dirty.push(old.seg.clone());
                self.active_dirty = false;
            }
            self.sealed.push(old);
        }
        self.reclaim(slots);
        let slot = self.free_slots.pop().ok_or(AppendError::NoSlot)?;
        let seg = match self.spares.pop() {
            Some(s) => Ok(s),
            None if self.files < self.max_segments => {
                let n = self.next_file;
                self.next_file += 1;
                SegmentFile::create(&self.dir, n, self.segment_bytes)
                    .inspect(|_| self.files += 1)
                    .map_err(AppendError::Create)
            }
            None => Err(AppendError::Full(self.files)),
        };
        let seg = match seg {
            Ok(s) => s,
            Err(e) => {
                self.free_slots.push(slot);
                return Err(e);
            }
        };
        let id = self.next_id;
        if let Err(source) = seg.write_header(id, self.segment_bytes) {
            self.free_slots.push(slot);
            self.spares.push(seg);
            return Err(AppendError::Write { id, source });
        }
        self.next_id += 1;
        slots[slot].store(0, Ordering::Relaxed);
        self.active = Some(Live {
            id,
            slot,
            seg: Arc::new(seg),
            used: 0,
        });
        self.active_dirty = true;
        Ok(())
    }

    /// Turns sealed segments whose messages are all resolved (and that were synced) into
    /// spares: a free header, so recovery skips them.
    pub(super) fn reclaim(&mut self, slots: &[AtomicU64]) {
        // An active segment whose messages are all resolved (and synced) is retired too, so
        // a crash does not replay what was delivered; the next append opens another.
        if let Some(a) = &self.active {
            if !self.active_dirty && a.used > 0 && slots[a.slot].load(Ordering::Acquire) == 0 {
                self.sealed.extend(self.active.take());
            }
        }
        let mut i = 0;
        while i < self.sealed.len() {
            let l = &self.sealed[i];
            let synced = !self.dirty.iter().any(|d| Arc::ptr_eq(d, &l.seg));
            // A sync in progress holds the file too: wait for it to end.
            let shared = Arc::strong_count(&l.seg) > 1;
            if !synced || shared || slots[l.slot].load(Ordering::Acquire) != 0 {
                i += 1;
                continue;
            }
            let Live {
                id,
                slot,
                seg,
                used,
            } = self.sealed.swap_remove(i);
            // Not shared (checked above, and clones are only made under this lock).
            let seg = match Arc::try_unwrap(seg) {
                Ok(s) => s,
                Err(seg) => {
                    self.sealed.push(Live {
                        id,
                        slot,
                        seg,
                        used,
                    });
                    i += 1;
                    continue;
                }
            };
            self.free_slots.push(slot);
            let freed = seg.write_header(FREE_SEGMENT, self.segment_bytes);
            let full_size = seg.file.metadata().map(|m| m.len()).ok() == Some(self.segment_bytes);
            if freed.is_err() || !full_size || self.spares.len() >= MAX_SPARES {
                if let Err(e) = std::fs::remove_file(&seg.path) {
                    log::warn!("spool: cannot remove {}: {e}", seg.path.display());
                }
                self.files -= 1;
            } else {
                self.spares.push(seg);
            }
        }
    }

    /// Appends encoded records (`buf`, from [`super::format::encode_record`]; `keys` gives
    /// each record's topic and tracking key), pushing one ticket per written record.
    pub(super) fn append(
        &mut self,
        buf: &mut [u8],
        keys: &[(TopicId, i64)],
        slots: &'static [AtomicU64],
        tickets: &mut Vec<SpoolRef>,
        report: &dyn SpoolReport,
    ) -> (Appended, Option<AppendError>) {
        let mut at = 0;
        let mut n = 0;
        let mut err = None;
        while at < buf.len() {
            if self.active.is_none() {
                if let Err(e) = self.open_active(slots) {
                    err = Some(e);
                    break;
                }
            }
            let cap = self.capacity();
            let active = self.active.as_mut().expect("opened above");
            // The run of records that fits the active segment.
            let (start, first) = (at, n);
            let mut end = at;
            while end < buf.len() {
                let len = encoded_record_len(&buf[end..]);
                if active.used + (end - start + len) as u64 > cap {
                    break;
                }
                seal_record(&mut buf[end..end + len], active.id);
                end += len;
                n += 1;
            }
            if end == start {
                // Nothing more fits: seal it and go on in a new one (the configuration
                // guarantees one record fits an empty segment).
                if active.used == 0 {
                    err = Some(AppendError::Full(self.files));
                    break;
                }
                if let Err(e) = self.open_active(slots) {
                    err = Some(e);
                    break;
                }
                continue;
            }
            if let Err(source) = active.seg.write_records(&buf[start..end], active.used) {
                n = first;
                err = Some(AppendError::Write {
                    id: active.id,
                    source,
                });
                // The segment may hold part of the run: leave it to the next one.
                self.active_dirty = true;
                let _ = self.open_active(slots);
                break;
            }
            let slot = &slots[active.slot];
            slot.fetch_add((n - first) as u64, Ordering::Relaxed);
            for _ in first..n {
                tickets.push(SpoolRef::new(slot));
            }
            active.used += (end - start) as u64;
            self.written += (end - start) as u64;
            self.active_dirty = true;
            at = end;
        }
        for &(t, key) in &keys[..n] {
            self.window.add(t, key);
        }
        // Unsynced records lower their topic's synced point at once (under this lock, so
        // the sync cannot publish a stale value over it).
        for w in &self.window.topics {
            report.set_synced_point(w.0, self.point(w.0));
        }
        SpoolStats::add(&report.spool_stats().appended_records, n as u64);
        (
            Appended {
                written: n,
                seq: self.written,
            },
            err,
        )
    }

    /// Topic `t`'s synced point as of now.
    fn point(&self, t: TopicId) -> i64 {
        match self.window.min(t) {
            Some(k) => k.saturating_sub(1),
            None => self
                .synced_max
                .iter()
                .find(|s| s.0 == t)
                .map_or(i64::MIN, |s| s.1),
        }
    }

    /// Starts a group commit: what to sync, up to which position, and the records covered.
    pub(super) fn begin_sync(&mut self) -> Option<(Vec<Arc<SegmentFile>>, u64, Window)> {
        if self.window.topics.is_empty() && self.dirty.is_empty() && !self.active_dirty {
            return None;
        }
        let mut files = std::mem::take(&mut self.dirty);
        if self.active_dirty {
            if let Some(a) = &self.active {
                files.push(a.seg.clone());
            }
            self.active_dirty = false;
        }
        let spare = std::mem::take(&mut self.spare_window);
        Some((
            files,
            self.written,
            std::mem::replace(&mut self.window, spare),
        ))
    }

    /// Ends a group commit: the window's records are on disk.
    pub(super) fn end_sync(&mut self, mut synced: Window, report: &dyn SpoolReport) {
        let mut records = 0;
        for &(t, _, max, n) in &synced.topics {
            records += n;
            match self.synced_max.iter_mut().find(|s| s.0 == t) {
                Some(s) => s.1 = s.1.max(max),
                None => self.synced_max.push((t, max)),
            }
        }
        for &(t, ..) in &synced.topics {
            report.set_synced_point(t, self.point(t));
        }
        SpoolStats::add(&report.spool_stats().synced_records, records);
        synced.topics.clear();
        self.spare_window = synced;
    }

    /// A sync failed: its segments are dirty again (their data may not be on disk).
    pub(super) fn sync_failed(&mut self, files: Vec<Arc<SegmentFile>>, window: Window) {
        self.dirty.extend(files);
        for (t, lo, hi, n) in window.topics {
            match self.window.topics.iter_mut().find(|w| w.0 == t) {
                Some(w) => {
                    w.1 = w.1.min(lo);
                    w.2 = w.2.max(hi);
                    w.3 += n;
                }
                None => self.window.topics.push((t, lo, hi, n)),
            }
        }
    }
}

/// `fdatasync` of each file; the first error.
pub(super) fn sync_files(files: &[Arc<SegmentFile>]) -> std::io::Result<()> {
    for f in files {
        File::sync_data(&f.file)?;
    }
    Ok(())
}

/// How long a sync took, for the histogram.
pub(super) fn since(t0: Instant) -> std::time::Duration {
    t0.elapsed()
}
