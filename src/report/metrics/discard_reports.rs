//! Discard reports (§10.2 of the reference): per reporting period, counts and recent
//! examples of what was discarded, kept for `/discards`. The current period and the latest
//! finished one are kept; older ones are dropped.

use crate::pipeline::TopicId;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::topic_table::TopicTable;

/// How many entries each "recent ..." list of a discard report keeps.
pub const LRU_CAPACITY: usize = 25;

/// Count and client-timestamp range of the messages one report holds for one topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicRange {
    pub count: u64,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
}

impl TopicRange {
    pub(super) fn add(&mut self, n: u64, min_ts: i64, max_ts: i64) {
        self.count += n;
        self.min_timestamp = self.min_timestamp.min(min_ts);
        self.max_timestamp = self.max_timestamp.max(max_ts);
    }
}

/// One reporting period of discards (§10.2), copied out for rendering. Topic lists are sorted
/// by name; "recent" lists are most recent first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscardReport {
    pub id: u64,
    /// Period start, seconds since the epoch.
    pub start_secs: u64,
    pub malformed_count: u64,
    pub unix_stream_unclean_count: u64,
    pub tcp_unclean_count: u64,
    pub unsupported_api_key_count: u64,
    pub unsupported_version_count: u64,
    pub bad_topic_count: u64,
    pub recent_malformed: Vec<Box<[u8]>>,
    pub recent_unix_stream_unclean: Vec<Box<[u8]>>,
    pub recent_tcp_unclean: Vec<Box<[u8]>>,
    /// (version, count), sorted by version.
    pub unsupported_versions: Vec<(i16, u64)>,
    pub recent_bad_topics: Vec<Box<[u8]>>,
    pub recent_too_long: Vec<Box<[u8]>>,
    pub rate_limit: Vec<(Arc<[u8]>, u64)>,
    pub discard_topics: Vec<(Arc<[u8]>, TopicRange)>,
    pub possible_duplicate_topics: Vec<(Arc<[u8]>, TopicRange)>,
}

/// The current (unfinished) report and the latest finished one, if a period has completed.
#[derive(Clone, Debug)]
pub struct DiscardReports {
    pub interval: Duration,
    pub current: DiscardReport,
    pub finished: Option<DiscardReport>,
}

pub(super) fn add_range(
    map: &mut HashMap<TopicId, TopicRange>,
    t: TopicId,
    n: u64,
    lo: i64,
    hi: i64,
) {
    map.entry(t)
        .or_insert(TopicRange {
            count: 0,
            min_timestamp: lo,
            max_timestamp: hi,
        })
        .add(n, lo, hi);
}

/// Most-recent-first list of at most `LRU_CAPACITY` distinct entries.
#[derive(Debug, Default)]
pub(super) struct Lru {
    items: VecDeque<Box<[u8]>>,
}

impl Lru {
    pub(super) fn push(&mut self, item: &[u8]) {
        if let Some(pos) = self.items.iter().position(|x| **x == *item) {
            if let Some(existing) = self.items.remove(pos) {
                self.items.push_front(existing);
            }
            return;
        }
        if self.items.len() >= LRU_CAPACITY {
            self.items.pop_back();
        }
        self.items.push_front(item.into());
    }

    fn to_vec(&self) -> Vec<Box<[u8]>> {
        self.items.iter().cloned().collect()
    }
}

#[derive(Debug, Default)]
pub(super) struct Report {
    pub(super) id: u64,
    pub(super) start_secs: u64,
    pub(super) malformed: u64,
    pub(super) unix_stream_unclean: u64,
    pub(super) tcp_unclean: u64,
    pub(super) unsupported_api_key: u64,
    pub(super) unsupported_version: u64,
    pub(super) bad_topic: u64,
    pub(super) recent_malformed: Lru,
    pub(super) recent_unix_stream_unclean: Lru,
    pub(super) recent_tcp_unclean: Lru,
    pub(super) unsupported_versions: BTreeMap<i16, u64>,
    pub(super) recent_bad_topics: Lru,
    pub(super) recent_too_long: Lru,
    pub(super) rate_limit: HashMap<TopicId, u64>,
    pub(super) discards: HashMap<TopicId, TopicRange>,
    pub(super) duplicates: HashMap<TopicId, TopicRange>,
}

impl Report {
    fn empty(id: u64, start_secs: u64) -> Self {
        Report {
            id,
            start_secs,
            ..Report::default()
        }
    }

    pub(super) fn export(&self, topics: &TopicTable) -> DiscardReport {
        DiscardReport {
            id: self.id,
            start_secs: self.start_secs,
            malformed_count: self.malformed,
            unix_stream_unclean_count: self.unix_stream_unclean,
            tcp_unclean_count: self.tcp_unclean,
            unsupported_api_key_count: self.unsupported_api_key,
            unsupported_version_count: self.unsupported_version,
            bad_topic_count: self.bad_topic,
            recent_malformed: self.recent_malformed.to_vec(),
            recent_unix_stream_unclean: self.recent_unix_stream_unclean.to_vec(),
            recent_tcp_unclean: self.recent_tcp_unclean.to_vec(),
            unsupported_versions: self
                .unsupported_versions
                .iter()
                .map(|(&v, &n)| (v, n))
                .collect(),
            recent_bad_topics: self.recent_bad_topics.to_vec(),
            recent_too_long: self.recent_too_long.to_vec(),
            rate_limit: topics.sorted_by_name(&self.rate_limit),
            discard_topics: topics.sorted_by_name(&self.discards),
            possible_duplicate_topics: topics.sorted_by_name(&self.duplicates),
        }
    }
}

/// The current report and the latest finished one. Period k covers
/// `[start0 + k*interval, start0 + (k+1)*interval)` and has report id k.
#[derive(Debug)]
pub(super) struct Periods {
    start0: u64,
    interval_secs: u64,
    pub(super) current: Report,
    pub(super) finished: Option<Report>,
}

impl Periods {
    pub(super) fn new(start0: u64, interval_secs: u64) -> Self {
        Periods {
            start0,
            interval_secs,
            current: Report::empty(0, start0),
            finished: None,
        }
    }

    pub(super) fn advance(&mut self, now_secs: u64) {
        // A clock that went back (now < start0, or k < current id) keeps the current period.
        let k = now_secs.saturating_sub(self.start0) / self.interval_secs;
        let start = |k: u64| self.start0 + k * self.interval_secs;
        if k == self.current.id + 1 {
            let done = std::mem::replace(&mut self.current, Report::empty(k, start(k)));
            self.finished = Some(done);
        } else if k > self.current.id + 1 {
            // More than a period passed without any activity or query: whatever the current
            // report held is lost, as in the original (§10.2).
            self.finished = Some(Report::empty(k - 1, start(k - 1)));
            self.current = Report::empty(k, start(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_moves_duplicates_to_front_and_caps() {
        let mut l = Lru::default();
        for i in 0..30u8 {
            l.push(&[i]);
        }
        assert_eq!(l.items.len(), LRU_CAPACITY);
        assert_eq!(&*l.items[0], &[29]);
        assert_eq!(&*l.items[24], &[5]);
        l.push(&[10]);
        assert_eq!(l.items.len(), LRU_CAPACITY);
        assert_eq!(&*l.items[0], &[10]);
        assert_eq!(&*l.items[1], &[29]);
    }

    #[test]
    fn periods_roll_over() {
        let mut p = Periods::new(1000, 10);
        p.current.malformed = 1;
        p.advance(1009);
        assert_eq!((p.current.id, p.current.malformed), (0, 1));
        assert!(p.finished.is_none());
        p.advance(1010);
        assert_eq!(
            (p.current.id, p.current.start_secs, p.current.malformed),
            (1, 1010, 0)
        );
        let f = p.finished.as_ref().unwrap();
        assert_eq!((f.id, f.start_secs, f.malformed), (0, 1000, 1));
        p.current.malformed = 7;
        // Skipping a whole period loses both.
        p.advance(1035);
        assert_eq!(
            (p.current.id, p.current.start_secs, p.current.malformed),
            (3, 1030, 0)
        );
        let f = p.finished.as_ref().unwrap();
        assert_eq!((f.id, f.start_secs, f.malformed), (2, 1020, 0));
        // A clock going back changes nothing.
        p.advance(900);
        assert_eq!(p.current.id, 3);
    }
}
