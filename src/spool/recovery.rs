//! Recovery at start: every segment file left by the previous run is read in segment id
//! order and every record in it replayed, in order, before the inputs open. Nothing read
//! from disk is trusted: headers and records are checked (`format`), a torn or corrupt
//! tail is zeroed (truncated) and its bytes counted, a corrupt record in the middle is
//! skipped (counted) and reading resumes at the next valid record, and a file that is not
//! a segment this dory can read (a future format version, a bad header) is moved aside
//! as `<name>.unreadable`, counted and logged. Recovery never panics on what it reads.
//!
//! Which records are replayed: all of each segment not yet reused. Resolution is not
//! written to disk (that would cost a write per acknowledgement), so a segment's records
//! that were delivered before the crash are replayed too; this is why every replayed
//! message counts as a possible duplicate. The duplicates are bounded: a segment is
//! reused (and its records no longer replayed) as soon as all its messages are resolved.

use std::path::Path;

use super::format::{scan, FormatError, RecordRef, Scan, SegmentHeader, FREE_SEGMENT, HEADER_LEN};
use super::segment::{self, SegmentFile};
use super::writer::{Live, Writer};
use super::{lock, Spool, SpoolReport, SpoolStats};
use crate::config::SpoolConfig;
use crate::pipeline::SpoolRef;

/// Largest segment file recovery reads (the configured maximum segment size).
const MAX_READ: u64 = 1 << 30;

/// What the previous run left: segments to replay, spares to reuse.
pub struct Recovery {
    /// (segment id, file, slot), sorted by id.
    live: Vec<(u64, SegmentFile, usize)>,
    spares: Vec<SegmentFile>,
    max_file: u64,
    report: &'static dyn SpoolReport,
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    pub segments: usize,
    pub records: u64,
    pub corrupt_bytes: u64,
}

impl Recovery {
    /// Lists the spool directory and reads every segment header.
    pub(super) fn plan(
        cfg: &SpoolConfig,
        report: &'static dyn SpoolReport,
    ) -> std::io::Result<Recovery> {
        let (files, max_file) = segment::list(&cfg.dir)?;
        let mut live = Vec::new();
        let mut spares = Vec::new();
        let mut header = [0u8; HEADER_LEN];
        for path in files {
            let seg = match SegmentFile::open(path.clone()) {
                Ok(s) => s,
                Err(e) => {
                    log::error!("spool: cannot open {}: {e}; left alone", path.display());
                    continue;
                }
            };
            let len = seg.file.metadata().map(|m| m.len()).unwrap_or(0);
            let read = {
                use std::os::unix::fs::FileExt;
                let mut at = 0;
                loop {
                    match seg.file.read_at(&mut header[at..], at as u64) {
                        Ok(0) => break Ok(at),
                        Ok(n) => {
                            at += n;
                            if at == HEADER_LEN {
                                break Ok(at);
                            }
                        }
                        Err(e) => break Err(e),
                    }
                }
            };
            let decoded = match read {
                Ok(n) => SegmentHeader::decode(&header[..n]),
                Err(e) => {
                    log::error!("spool: cannot read {}: {e}; left alone", path.display());
                    continue;
                }
            };
            match decoded {
                Ok(h) if h.id == FREE_SEGMENT && len == cfg.segment_bytes => spares.push(seg),
                Ok(h) if h.id == FREE_SEGMENT => {
                    // A spare of another segment size: not worth keeping.
                    let _ = std::fs::remove_file(&seg.path);
                }
                Ok(h) => live.push((h.id, seg, usize::MAX)),
                Err(e) => set_aside(report, &path, len, &e),
            }
        }
        live.sort_by_key(|l| l.0);
        Ok(Recovery {
            live,
            spares,
            max_file,
            report,
        })
    }

    /// Segments to replay.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Gives the writer the spares and the file and id counters, and reserves a slot for
    /// each segment to replay.
    pub(super) fn prepare(&mut self, w: &mut Writer) {
        w.files = (self.live.len() + self.spares.len()) as u64;
        w.spares = std::mem::take(&mut self.spares);
        w.next_file = self.max_file + 1;
        w.next_id = self.live.last().map_or(1, |l| l.0 + 1);
        for l in &mut self.live {
            l.2 = w
                .free_slots
                .pop()
                .expect("slots are sized for every live segment");
        }
    }

    /// Replays every record, segment by segment in id order, calling `each` with the record
    /// and the message's hold on its segment. Then the segments join the writer's sealed
    /// ones, reused once their messages are resolved.
    pub fn replay(
        self,
        spool: &'static Spool,
        mut each: impl FnMut(RecordRef<'_>, SpoolRef),
    ) -> Replayed {
        let mut done = Replayed::default();
        let mut buf = Vec::new();
        let mut adopted = Vec::new();
        let stats = self.report.spool_stats();
        for (id, seg, slot) in self.live {
            done.segments += 1;
            if let Err(e) = seg.read_all(&mut buf, MAX_READ) {
                log::error!(
                    "spool: cannot read {}: {e}; its records are not replayed",
                    seg.path.display()
                );
                continue;
            }
            let counter = &spool.slots[slot];
            let area = buf.get(HEADER_LEN..).unwrap_or(&[]);
            let mut tail: Option<(usize, usize)> = None;
            let mut n = 0u64;
            scan(area, id, |s| match s {
                Scan::Record { rec, .. } => {
                    tail = None;
                    n += 1;
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    each(rec, SpoolRef::new(counter));
                }
                Scan::Skipped { offset, len, error } => {
                    done.corrupt_bytes += len as u64;
                    SpoolStats::add(&stats.corrupt_bytes, len as u64);
                    log::warn!(
                        "spool: {}: skipped {len} byte(s) at record offset {offset}: {error}",
                        seg.path.display()
                    );
                    tail = Some((offset, len));
                }
            });
            if let Some((offset, len)) = tail {
                // A torn tail: truncate it, so the next recovery does not count it again.
                if let Err(e) = seg.zero(offset as u64, len as u64) {
                    log::warn!("spool: cannot truncate {}: {e}", seg.path.display());
                }
            }
            log::info!(
                "spool: replayed {n} message(s) from segment {id} ({})",
                seg.path.display()
            );
            done.records += n;
            adopted.push(Live {
                id,
                slot,
                seg: std::sync::Arc::new(seg),
                used: 0,
            });
        }
        let mut w = lock(&spool.writer);
        w.sealed.extend(adopted);
        w.publish_gauges(stats);
        done
    }
}

/// Moves an unreadable file aside, counted and logged.
fn set_aside(report: &dyn SpoolReport, path: &Path, len: u64, e: &FormatError) {
    let stats = report.spool_stats();
    SpoolStats::add(&stats.unreadable_segments, 1);
    if !matches!(e, FormatError::FutureVersion(_)) {
        SpoolStats::add(&stats.corrupt_bytes, len);
    }
    match SegmentFile::move_aside(path) {
        Ok(to) => log::error!(
            "spool: {}: {e}; moved aside to {} (not replayed)",
            path.display(),
            to.display()
        ),
        Err(m) => log::error!(
            "spool: {}: {e}; cannot move it aside ({m}); ignored",
            path.display()
        ),
    }
}
