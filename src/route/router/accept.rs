//! Taking messages in: the topic slot and cluster view of a topic, the size, rate-limit and
//! availability checks, partition choice for keyed messages, and holding messages of an
//! unknown topic while it is looked up.

use super::{BatchKey, Lookup, Router, TopicSlot, NO_LIMITS};
use crate::config::policy::{BatchAction, Partitioner, TopicPolicy};
use crate::config::BatchLimits;
use crate::pipeline::{Msg, TopicId, KAFKA_MSG_OVERHEAD};
use crate::report::metrics::{DiscardReason, QueueState};
use crate::report::msg_debug::DebugFile;
use crate::route::cluster::TopicView;
use crate::route::partitioner::java_partition;
use crate::route::rate_limit::RateLimiter;
use std::time::Instant;

impl Router {
    /// Makes room for topic id `i`. The slots grow by an eighth (at least 1,024) rather
    /// than doubling: a slot is a few hundred bytes, and doubling left up to half of them
    /// unused (2 MB at 10,000 topics); an eighth still moves each slot only a few times.
    fn grow_topics(&mut self, i: usize) {
        let len = self.topics.len();
        if self.topics.capacity() <= i {
            let want = (i + 1).max(len + (len / 8).max(1024));
            self.topics.reserve_exact(want - len);
        }
        self.topics.resize_with(i + 1, TopicSlot::default);
    }

    /// Starts loading what routing a message of topic `t` touches first: its slot and its
    /// counters. With thousands of topics, a topic comes round again only after thousands
    /// of other messages, and all of it is cold by then (doc/performance.md, "Round
    /// fourteen"); an input batch's topics are hinted before the first is routed, so the
    /// loads overlap instead of each stalling in turn.
    #[inline]
    fn prefetch_topic(&self, t: TopicId) {
        if let Some(s) = self.topics.get(t as usize) {
            crate::prefetch::bytes(s, std::mem::size_of::<TopicSlot>());
        }
        self.metrics.prefetch_topic(t);
    }

    pub(super) fn slot(&mut self, t: TopicId) -> &mut TopicSlot {
        let i = t as usize;
        if self.topics.len() <= i {
            self.grow_topics(i);
        }
        &mut self.topics[i]
    }

    /// The topic's current view, refreshed from the cluster if it changed.
    pub(super) fn view(&mut self, t: TopicId) -> Option<&TopicView> {
        let generation = self.cluster.generation;
        let metrics = self.metrics;
        let i = t as usize;
        if self.topics.len() <= i {
            self.grow_topics(i);
        }
        let slot = &mut self.topics[i];
        if slot.generation != generation || slot.view.is_none() {
            let name = slot.name.get_or_insert_with(|| metrics.topic_name(t));
            slot.view = self.cluster.topics.get(&**name).cloned();
            slot.generation = generation;
        }
        slot.view.as_ref()
    }

    /// A batch from the inputs' channel; the emptied vector goes back to the inputs.
    pub(super) fn on_input(&mut self, mut msgs: Vec<Msg>, now: Instant) {
        self.route_batch(&mut msgs, true, now);
        // Full (inputs are not taking them): let it go.
        let _ = self.ch.spare_batches.try_send(msgs);
    }

    /// Routes a batch from an input, leaving `msgs` empty. `counted_new`: the input
    /// counted the messages in the `new` queue (they went through the channel); an input
    /// routing its own batch does not, as they leave that queue as soon as they enter it.
    pub(super) fn route_batch(&mut self, msgs: &mut Vec<Msg>, counted_new: bool, now: Instant) {
        if counted_new {
            // They leave the `new` queue: counted per topic for the batch (inputs send runs
            // of a few topics), not per message; whatever waits for a lookup is added back.
            self.groups.group(msgs);
            for (t, idx) in self.groups.iter() {
                self.metrics
                    .queue_add(t, QueueState::New, -(idx.len() as i64));
            }
        }
        // Runs of one topic, routed together.
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        for m in msgs.iter() {
            match runs.last_mut() {
                Some((t, n)) if *t == m.topic => *n += 1,
                _ => {
                    runs.push((m.topic, 1));
                    self.prefetch_topic(m.topic);
                }
            }
        }
        // Where each run's first message goes in its open batch, once the slots (above)
        // are on their way.
        for &(t, _) in &runs {
            if let Some(s) = self.topics.get(t as usize) {
                s.open.prefetch_next();
            }
        }
        let mut rest = msgs.drain(..);
        for &(t, n) in &runs {
            self.route_run(t, rest.by_ref().take(n), n, now);
        }
        drop(rest);
        self.runs = runs;
        // Batches whose time is up are sent by the router thread's timers once the input
        // queued behind this batch is routed too (see route::batcher): late messages fill
        // them together first. Routed inline, a passed deadline wakes the router thread
        // (`SharedRouter::try_route`).
    }

    /// Routes `n` new messages of topic `t` (taken off the `new` count). In the common
    /// case (topic known and usable, batched per topic, no rate limit, no message debug)
    /// what depends only on the topic is looked at once for the run; otherwise each message
    /// goes through [`Router::accept_new`].
    fn route_run(&mut self, t: TopicId, run: impl Iterator<Item = Msg>, n: usize, now: Instant) {
        let plain = self.have_metadata
            && self.slot(t).lookup.is_none()
            && self.view(t).is_some_and(TopicView::has_usable)
            && self.metrics.msg_debug().is_none_or(|d| !d.active());
        // What the run needs of the policy, read in place: a run is often one message,
        // and copying the whole policy out per run showed in profiles.
        let fast = plain
            .then(|| self.resolved_policy(t))
            .filter(|(p, limiter)| p.batching.action == BatchAction::PerTopic && !limiter)
            .map(|(p, _)| (p.batching.limits, p.partitioner == Partitioner::Murmur2));
        let Some((limits, murmur2)) = fast else {
            for m in run {
                self.accept_new(m, now);
            }
            return;
        };
        let max_kafka = self.cfg.batching.message_max_bytes;
        // Counted in the batch state for the run, before any of it is emitted (which
        // takes it off again); a message that does not get there is taken off by itself.
        self.metrics
            .queue_add(t, QueueState::Batch, i64::try_from(n).unwrap_or(i64::MAX));
        for m in run {
            if m.payload.len() + KAFKA_MSG_OVERHEAD > max_kafka {
                self.metrics.queue_add(t, QueueState::Batch, -1);
                self.discard_too_long(m);
                continue;
            }
            let partition = self.keyed_partition_by(t, &m, murmur2);
            self.batch_into((t, partition), m, &limits);
        }
    }

    /// Validates a new message and batches it (or holds it while its topic is looked up).
    pub(super) fn accept(&mut self, m: Msg, now: Instant) {
        self.metrics.queue_add(m.topic, QueueState::New, -1);
        self.accept_new(m, now);
    }

    /// [`Router::accept`] for a message already taken off the `new` queue count.
    fn accept_new(&mut self, m: Msg, now: Instant) {
        let t = m.topic;
        if let Some(l) = self.slot(t).lookup.as_mut() {
            l.msgs.push(m);
            self.metrics.queue_add(t, QueueState::New, 1);
            return;
        }
        if !self.have_metadata {
            self.hold_for_lookup(m, now);
            return;
        }
        if self.view(t).is_none() {
            if self.slot(t).bad_until.is_some_and(|u| now < u) {
                self.discard_msgs(vec![m], DiscardReason::BadTopic);
            } else {
                self.hold_for_lookup(m, now);
            }
            return;
        }
        if m.payload.len() + KAFKA_MSG_OVERHEAD > self.cfg.batching.message_max_bytes {
            self.discard_too_long(m);
            return;
        }
        self.route_new(m, now);
    }

    /// Discards a message larger than a broker takes (`message_max_bytes`), keeping a
    /// sample of its value for the status page.
    fn discard_too_long(&mut self, m: Msg) {
        let name = self.metrics.topic_name(m.topic);
        let mut sample = Vec::with_capacity(m.value_len().min(256));
        m.payload
            .copy_to(m.key_len(), m.value_len().min(256), &mut sample);
        self.metrics.too_long_sample(&name, &sample);
        self.discard_msgs(vec![m], DiscardReason::TooLong);
    }

    /// The topic's policy (resolved from the config once), in place, and whether it has a
    /// rate limiter.
    fn resolved_policy(&mut self, t: TopicId) -> (&TopicPolicy, bool) {
        if self.slot(t).policy.is_none() {
            self.policy(t);
        }
        let slot = &self.topics[t as usize];
        let policy = slot.policy.as_ref().expect("resolved just above");
        (policy, slot.limiter.is_some())
    }

    /// The topic's policy, resolved from the config once.
    pub(super) fn policy(&mut self, t: TopicId) -> TopicPolicy {
        if let Some(p) = self.slot(t).policy {
            return p;
        }
        let cfg = self.cfg.clone();
        let metrics = self.metrics;
        let slot = self.slot(t);
        let name = slot
            .name
            .get_or_insert_with(|| metrics.topic_name(t))
            .clone();
        let p = cfg.policies.for_topic(&name);
        slot.policy = Some(p);
        slot.limiter = p
            .rate_limit
            .map(|r| Box::new(RateLimiter::new(r.interval, r.max_count)));
        p
    }

    /// The partition a message must go to, if its key decides it: PartitionKey messages
    /// by Dory's rule, AnyPartition messages with a key under the murmur2 partitioner as
    /// the Java client would. `None`: any partition (round robin). Inlined: most messages
    /// have no key to place, and that answer needs no call.
    #[inline]
    pub(super) fn keyed_partition(
        &mut self,
        t: TopicId,
        m: &Msg,
        policy: &TopicPolicy,
    ) -> Option<i32> {
        self.keyed_partition_by(t, m, policy.partitioner == Partitioner::Murmur2)
    }

    /// [`Router::keyed_partition`] given whether the topic's partitioner is murmur2.
    #[inline]
    fn keyed_partition_by(&mut self, t: TopicId, m: &Msg, murmur2: bool) -> Option<i32> {
        if m.partition_key.is_none() && (!murmur2 || m.key_len() == 0) {
            return None;
        }
        self.placed_partition(t, m)
    }

    /// [`Router::keyed_partition`] for a message whose key decides its partition.
    #[inline(never)]
    fn placed_partition(&mut self, t: TopicId, m: &Msg) -> Option<i32> {
        if let Some(k) = m.partition_key {
            return self.view(t)?.partition_for_key(k);
        }
        let count = self.view(t)?.partition_count;
        self.scratch.clear();
        m.payload.copy_to(0, m.key_len(), &mut self.scratch);
        let p = java_partition(&self.scratch, count)?;
        self.view(t)?.usable_at_or_after(i32::try_from(p).ok()?)
    }

    /// Batches a validated message for a known topic.
    pub(super) fn route_new(&mut self, m: Msg, now: Instant) {
        let t = m.topic;
        match self.view(t) {
            None => {
                self.hold_for_lookup(m, now);
                return;
            }
            Some(v) if !v.has_usable() => {
                self.discard_msgs(vec![m], DiscardReason::NoAvailablePartitions);
                return;
            }
            Some(_) => {}
        }
        let policy = self.policy(t);
        if let Some(l) = self.topics[t as usize].limiter.as_mut() {
            if !l.allow(m.arrival) {
                self.discard_msgs(vec![m], DiscardReason::RateLimit);
                return;
            }
        }
        self.debug_log(DebugFile::Receive, &m);
        let partition = self.keyed_partition(t, &m, &policy);
        let limits = match policy.batching.action {
            BatchAction::PerTopic => policy.batching.limits,
            BatchAction::CombinedTopics if self.cfg.policies.combined.is_some() => {
                self.add_combined(m, partition);
                return;
            }
            BatchAction::CombinedTopics | BatchAction::Disable => NO_LIMITS,
        };
        self.metrics.queue_add(t, QueueState::Batch, 1);
        self.batch_into((t, partition), m, &limits);
    }

    /// Adds a message (already counted in the batch state) to the open batch of `key`,
    /// sending what that completes.
    pub(super) fn batch_into(&mut self, key: BatchKey, m: Msg, limits: &BatchLimits) {
        let max_kafka = self.cfg.batching.message_max_bytes;
        let open = self.open_batch(key);
        let emit = open.add(m, limits, max_kafka);
        if let Some(d) = open.take_new_deadline() {
            // A deadline comes only with a batch time.
            self.queue_expiry(limits.time.unwrap_or_default(), d, key);
        }
        if let Some(msgs) = emit.batch {
            self.emit(key, msgs);
        }
        if let Some(m) = emit.alone {
            self.emit(key, vec![m]);
        }
    }

    /// Adds a message to the combined-topics batch of its destination broker.
    pub(super) fn add_combined(&mut self, m: Msg, partition: Option<i32>) {
        let t = m.topic;
        let partition = partition.or_else(|| self.round_robin(t));
        let Some(broker) = partition.and_then(|p| self.view(t)?.leader_of(p)) else {
            self.discard_msgs(vec![m], DiscardReason::NoAvailablePartitions);
            return;
        };
        let limits = self.cfg.policies.combined.unwrap_or(NO_LIMITS);
        let max_kafka = self.cfg.batching.message_max_bytes;
        self.metrics.queue_add(t, QueueState::Batch, 1);
        let open = self.combined.entry(broker).or_default();
        let emit = open.add(m, &limits, max_kafka);
        if let Some(d) = open.take_new_deadline() {
            self.next_batch_expiry = Some(self.next_batch_expiry.map_or(d, |x| x.min(d)));
        }
        if let Some(msgs) = emit.batch {
            self.emit_combined(broker, msgs);
        }
        if let Some(m) = emit.alone {
            self.emit_combined(broker, vec![m]);
        }
    }

    /// A completed combined-topics batch for `broker`: keyed messages go to their
    /// partitions; each topic's other messages share one partition led by that broker
    /// (rotating per batch, as Dory's connectors do per request).
    pub(super) fn emit_combined(&mut self, broker: i32, msgs: Vec<Msg>) {
        let mut groups: Vec<(TopicId, Option<i32>, Vec<Msg>)> = Vec::new();
        for m in msgs {
            let t = m.topic;
            let policy = self.policy(t);
            let p = self.keyed_partition(t, &m, &policy);
            match groups.iter_mut().find(|(gt, gp, _)| *gt == t && *gp == p) {
                Some((_, _, v)) => v.push(m),
                None => groups.push((t, p, vec![m])),
            }
        }
        for (t, p, msgs) in groups {
            let p = p.or_else(|| self.partition_led_by(t, broker));
            self.emit((t, p), msgs);
        }
    }

    /// The next usable partition of `t` led by `broker`, rotating.
    pub(super) fn partition_led_by(&mut self, t: TopicId, broker: i32) -> Option<i32> {
        self.view(t)?;
        let slot = &mut self.topics[t as usize];
        let view = slot.view.as_ref()?;
        let led: Vec<i32> = view
            .usable
            .iter()
            .map(|&i| &view.partitions[i])
            .filter(|p| p.leader == broker)
            .map(|p| p.id)
            .collect();
        if led.is_empty() {
            return None;
        }
        slot.rr_combined = slot.rr_combined.wrapping_add(1);
        Some(led[slot.rr_combined % led.len()])
    }

    pub(super) fn debug_log(&mut self, file: DebugFile, m: &Msg) {
        let Some(d) = self.metrics.msg_debug().filter(|d| d.active()) else {
            return;
        };
        let name = self.metrics.topic_name(m.topic);
        if !d.enabled_for(&name) {
            return;
        }
        let (mut key, mut value) = (Vec::new(), Vec::new());
        m.payload.copy_to(0, m.key_len(), &mut key);
        m.payload.copy_to(m.key_len(), m.value_len(), &mut value);
        d.log(file, m.timestamp, &name, &key, &value);
    }

    /// Holds a message until its topic's metadata is known. Before the first metadata
    /// arrives it just waits; after, the topic is looked up (and maybe auto-created).
    pub(super) fn hold_for_lookup(&mut self, m: Msg, now: Instant) {
        let t = m.topic;
        let ask = self.have_metadata;
        self.metrics.queue_add(t, QueueState::New, 1);
        let slot = self.slot(t);
        match slot.lookup.as_mut() {
            Some(l) => l.msgs.push(m),
            None => {
                slot.lookup = Some(Box::new(Lookup {
                    asked_at: None,
                    next_try: ask.then_some(now),
                    answer_seq: 0,
                    msgs: vec![m],
                }));
                if !std::mem::replace(&mut slot.listed, true) {
                    self.lookups.push(t as usize);
                }
            }
        }
    }
}
