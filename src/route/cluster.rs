//! The router's view of the cluster, derived from Kafka metadata: brokers, each topic's
//! partitions with their leaders, and partition choice. Pure logic, tested without sockets.

use std::collections::HashMap;
use std::sync::Arc;

use crate::kafka::{MetadataResponse, MetadataTopic};

/// Partition error codes under which the partition can still take writes: NONE and
/// REPLICA_NOT_AVAILABLE (a follower is missing, the leader is fine).
fn partition_usable(error_code: i16) -> bool {
    matches!(error_code, 0 | 9)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub host: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    pub id: i32,
    pub leader: i32,
    pub usable: bool,
}

/// One topic: partitions with a known leader, sorted by id, and the usable subset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicView {
    pub partitions: Vec<PartitionInfo>,
    /// Indexes into `partitions` of the usable ones.
    pub usable: Vec<usize>,
    /// Partitions the topic has in metadata, leaders known or not (the Java client's
    /// modulus for murmur2).
    pub partition_count: usize,
}

impl TopicView {
    fn from_metadata(t: &MetadataTopic, brokers: &HashMap<i32, BrokerInfo>) -> TopicView {
        let mut partitions: Vec<PartitionInfo> = t
            .partitions
            .iter()
            .filter(|p| p.partition >= 0 && brokers.contains_key(&p.leader))
            .map(|p| PartitionInfo {
                id: p.partition,
                leader: p.leader,
                usable: partition_usable(p.error_code),
            })
            .collect();
        partitions.sort_by_key(|p| p.id);
        partitions.dedup_by_key(|p| p.id);
        let usable = partitions
            .iter()
            .enumerate()
            .filter(|(_, p)| p.usable)
            .map(|(i, _)| i)
            .collect();
        TopicView {
            partitions,
            usable,
            partition_count: t.partitions.len(),
        }
    }

    pub fn has_usable(&self) -> bool {
        !self.usable.is_empty()
    }

    pub fn leader_of(&self, partition: i32) -> Option<i32> {
        self.partitions
            .binary_search_by_key(&partition, |p| p.id)
            .ok()
            .map(|i| self.partitions[i].leader)
    }

    /// Dory's PartitionKey rule (reference §4.2): `(u32)key % n` over the partitions with a
    /// known leader, sorted by id; if that one cannot take writes, the next usable one.
    /// (Dory walks to the next partition whose *broker* is in service, which may pick an
    /// errored partition; we walk to the next usable partition.)
    pub fn partition_for_key(&self, key: i32) -> Option<i32> {
        let n = self.partitions.len();
        if n == 0 {
            return None;
        }
        let i0 = (key as u32 as usize) % n;
        (0..n)
            .map(|k| &self.partitions[(i0 + k) % n])
            .find(|p| p.usable)
            .map(|p| p.id)
    }

    /// Partition `p` if usable, else the next usable one by id (wrapping).
    pub fn usable_at_or_after(&self, p: i32) -> Option<i32> {
        let ids = || self.usable.iter().map(|&i| self.partitions[i].id);
        ids().find(|&id| id >= p).or_else(|| ids().next())
    }

    /// Round robin over the usable partitions, preferring those whose leader `is_up`.
    pub fn next_round_robin(
        &self,
        counter: &mut usize,
        is_up: impl Fn(i32) -> bool,
    ) -> Option<i32> {
        let n = self.usable.len();
        if n == 0 {
            return None;
        }
        for k in 0..n {
            let p = &self.partitions[self.usable[(*counter + k) % n]];
            if is_up(p.leader) {
                *counter = (*counter + k + 1) % n;
                return Some(p.id);
            }
        }
        let p = &self.partitions[self.usable[*counter % n]];
        *counter = (*counter + 1) % n;
        Some(p.id)
    }
}

/// The whole view. `generation` changes whenever anything in it changes, so the router can
/// cache per-topic lookups.
#[derive(Debug, Default)]
pub struct Cluster {
    pub brokers: HashMap<i32, BrokerInfo>,
    pub topics: HashMap<Arc<[u8]>, TopicView>,
    pub generation: u64,
}

fn brokers_of(md: &MetadataResponse) -> HashMap<i32, BrokerInfo> {
    md.brokers
        .iter()
        .filter_map(|b| {
            let port = u16::try_from(b.port).ok().filter(|&p| p != 0)?;
            (b.node_id >= 0).then(|| {
                (
                    b.node_id,
                    BrokerInfo {
                        host: b.host.clone(),
                        port,
                    },
                )
            })
        })
        .collect()
}

/// Metadata topics without a topic-level error.
fn good_topics(md: &MetadataResponse) -> impl Iterator<Item = &MetadataTopic> {
    md.topics
        .iter()
        .filter(|t| t.error_code == 0 && !t.name.is_empty())
}

impl Cluster {
    /// Replaces everything with an all-topics response. Returns whether anything changed.
    pub fn install_full(&mut self, md: &MetadataResponse) -> bool {
        let brokers = brokers_of(md);
        let topics: HashMap<Arc<[u8]>, TopicView> = good_topics(md)
            .map(|t| {
                (
                    Arc::from(t.name.as_slice()),
                    TopicView::from_metadata(t, &brokers),
                )
            })
            .collect();
        let changed = brokers != self.brokers || topics != self.topics;
        if changed {
            self.brokers = brokers;
            self.topics = topics;
            self.generation += 1;
        }
        changed
    }

    /// Merges a response for some topics: their views are replaced, brokers added or
    /// updated. Topics with errors are left as they were. Returns whether anything changed.
    pub fn install_partial(&mut self, md: &MetadataResponse) -> bool {
        let mut changed = false;
        for (id, b) in brokers_of(md) {
            if self.brokers.get(&id) != Some(&b) {
                self.brokers.insert(id, b);
                changed = true;
            }
        }
        for t in good_topics(md) {
            let view = TopicView::from_metadata(t, &self.brokers);
            if self.topics.get(t.name.as_slice()) != Some(&view) {
                self.topics.insert(Arc::from(t.name.as_slice()), view);
                changed = true;
            }
        }
        if changed {
            self.generation += 1;
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::{MetadataBroker, MetadataPartition};

    fn md(parts: &[(i32, i32, i16)]) -> MetadataResponse {
        MetadataResponse {
            correlation_id: 0,
            brokers: (1..=3)
                .map(|id| MetadataBroker {
                    node_id: id,
                    host: "127.0.0.1".into(),
                    port: 9000 + id,
                })
                .collect(),
            controller_id: 1,
            topics: vec![MetadataTopic {
                error_code: 0,
                name: b"t".to_vec(),
                partitions: parts
                    .iter()
                    .map(|&(partition, leader, error_code)| MetadataPartition {
                        error_code,
                        partition,
                        leader,
                    })
                    .collect(),
            }],
        }
    }

    fn view(parts: &[(i32, i32, i16)]) -> TopicView {
        let mut c = Cluster::default();
        assert!(c.install_full(&md(parts)));
        c.topics.get(&b"t"[..]).cloned().expect("topic")
    }

    #[test]
    fn key_modulo_over_sorted_partitions() {
        let v = view(&[(2, 3, 0), (0, 1, 0), (1, 2, 0), (3, 1, 0)]);
        assert_eq!(v.partition_for_key(0), Some(0));
        assert_eq!(v.partition_for_key(5), Some(1));
        assert_eq!(v.partition_for_key(-2), Some(((-2i32) as u32 % 4) as i32));
    }

    #[test]
    fn key_walks_past_unusable_partition() {
        let v = view(&[(0, 1, 0), (1, 2, 5), (2, 3, 0)]);
        assert_eq!(v.partition_for_key(1), Some(2));
        // Partitions with unknown leaders are dropped entirely.
        let v = view(&[(0, 1, 0), (1, -1, 5), (2, 3, 0)]);
        assert_eq!(v.partitions.len(), 2);
        assert_eq!(v.partition_for_key(1), Some(2));
    }

    #[test]
    fn replica_not_available_is_usable() {
        let v = view(&[(0, 1, 9)]);
        assert!(v.has_usable());
    }

    #[test]
    fn round_robin_cycles_and_prefers_up_leaders() {
        let v = view(&[(0, 1, 0), (1, 2, 0), (2, 3, 0)]);
        let mut c = 0;
        let seq: Vec<_> = (0..6)
            .map(|_| v.next_round_robin(&mut c, |_| true))
            .collect();
        assert_eq!(seq, [0, 1, 2, 0, 1, 2].map(Some));
        let seq: Vec<_> = (0..4)
            .map(|_| v.next_round_robin(&mut c, |b| b != 2))
            .collect();
        assert!(seq.iter().all(|p| *p != Some(1)), "{seq:?}");
    }

    #[test]
    fn unchanged_metadata_is_not_a_change() {
        let mut c = Cluster::default();
        assert!(c.install_full(&md(&[(0, 1, 0)])));
        let g = c.generation;
        assert!(!c.install_full(&md(&[(0, 1, 0)])));
        assert_eq!(c.generation, g);
        assert!(c.install_full(&md(&[(0, 2, 0)])));
    }
}
