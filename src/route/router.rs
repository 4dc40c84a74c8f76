//! The router: owns metadata, validates topics, chooses partitions, batches, hands batches
//! to the dispatcher of each partition's leader, and takes back what dispatchers could not
//! deliver (retry, backoff, reroute after a metadata refresh).
//!
//! It never blocks on the network: metadata is fetched by a helper thread, and a full
//! dispatcher queue is absorbed by a per-broker backlog. Every message that enters is
//! counted as received by the input; the router counts each discard it decides on.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select_biased, Receiver, Sender, TrySendError};

use crate::config::policy::{BatchAction, Partitioner, TopicPolicy};
use crate::config::BatchLimits;
use crate::config::Config;
use crate::deliver::backoff::{retry_delay, Backoff, Rng};
use crate::deliver::dispatcher::{self, DispatcherConfig, DispatcherHandle};
use crate::fasthash::FastMap;
use crate::pipeline::{
    Batch, Control, MetaRequest, MetaResponse, Msg, Outcome, ReturnReason, DISPATCH_CHANNEL_CAP,
};
use crate::report::metrics::{DiscardReason, Metrics, QueueState, TopicId};
use crate::report::msg_debug::DebugFile;
use crate::report::status::StatusRequest;
use crate::route::batcher::{OpenBatch, KAFKA_MSG_OVERHEAD};
use crate::route::cluster::{Cluster, TopicView};
use crate::route::partitioner::java_partition;
use crate::route::rate_limit::RateLimiter;

/// How often the router looks at the clock while shutting down.
const SHUTDOWN_TICK: Duration = Duration::from_millis(20);
/// How soon a topic that turned out bad is looked up again (messages meanwhile are
/// discarded at once rather than each triggering a metadata fetch).
const BAD_TOPIC_MEMORY: Duration = Duration::from_secs(5);
/// Pause between lookups of a topic being auto-created.
const TOPIC_LOOKUP_RETRY: Duration = Duration::from_millis(300);
/// Metadata refresh pacing while partitions of topics in use lack a usable leader.
const DEGRADED_REFRESH_MIN: Duration = Duration::from_millis(250);
const DEGRADED_REFRESH_MAX: Duration = Duration::from_secs(5);
/// Minimum time between two metadata refreshes caused by errors.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(250);
/// How long dispatcher threads may take to stop after the shutdown deadline before the
/// router stops waiting for them.
const DISPATCHER_JOIN_GRACE: Duration = Duration::from_secs(2);

/// The router's channel ends.
pub struct RouterChannels {
    pub from_inputs: Receiver<Vec<Msg>>,
    /// Emptied input batches go back to the inputs for reuse.
    pub spare_batches: Sender<Vec<Msg>>,
    pub from_control: Receiver<Control>,
    pub from_status: Receiver<StatusRequest>,
    pub to_meta: Sender<MetaRequest>,
    pub from_meta: Receiver<MetaResponse>,
    pub to_router: Sender<Outcome>,
    pub from_dispatchers: Receiver<Outcome>,
}

/// What the router knows about a topic it has seen messages for.
#[derive(Default)]
struct TopicSlot {
    name: Option<Arc<[u8]>>,
    /// The view as of `generation`; refreshed lazily when the cluster view changes.
    view: Option<TopicView>,
    generation: u64,
    rr: usize,
    lookup: Option<Lookup>,
    /// Until when the topic counts as bad without asking again.
    bad_until: Option<Instant>,
    /// Batching, compression, rate limit and partitioner of the topic (resolved once).
    policy: Option<TopicPolicy>,
    limiter: Option<RateLimiter>,
    /// Round-robin counter for combined-topics batches.
    rr_combined: usize,
}

/// Messages held while a topic is looked up (or auto-created).
struct Lookup {
    /// When we first asked about the topic; `None` while waiting for the first metadata.
    asked_at: Option<Instant>,
    /// When to ask (again); `None` while a question is outstanding or before the first
    /// metadata.
    next_try: Option<Instant>,
    /// Without auto-creation: the all-topics fetch whose answer settles the question (a
    /// fetch sent before we asked may predate the topic).
    answer_seq: u64,
    msgs: Vec<Msg>,
}

impl Lookup {
    fn expired(&self, now: Instant, wait: Duration) -> bool {
        self.asked_at.is_some_and(|a| now >= a + wait)
    }
}

/// No batching limit: each message goes on its own.
const NO_LIMITS: BatchLimits = BatchLimits {
    time: None,
    messages: None,
    bytes: None,
};

/// An open per-topic (or per-partition) batch with the limits of its topic.
struct Open {
    batch: OpenBatch,
    limits: BatchLimits,
}

/// Batching key: AnyPartition messages of a topic share one batch (its partition is chosen
/// when the batch completes); PartitionKey messages batch per partition.
type BatchKey = (TopicId, Option<i32>);

struct Broker {
    handle: DispatcherHandle,
    up: bool,
    /// Batches in the dispatcher's channel.
    queued: usize,
    backlog: VecDeque<Batch>,
}

enum Event {
    Control(Control),
    Outcome(Outcome),
    Meta(MetaResponse),
    Input(Vec<Msg>),
    InputsClosed,
    Status(StatusRequest),
    Tick,
}

pub struct Router {
    cfg: Arc<Config>,
    dcfg: Arc<DispatcherConfig>,
    metrics: &'static Metrics,
    ch: RouterChannels,
    inputs_open: bool,
    cluster: Cluster,
    have_metadata: bool,
    topics: Vec<TopicSlot>,
    batches: FastMap<BatchKey, Open>,
    /// Combined-topics batches, per destination broker.
    combined: HashMap<i32, OpenBatch>,
    /// Reused buffer for message keys (murmur2).
    scratch: Vec<u8>,
    next_batch_expiry: Option<Instant>,
    brokers: HashMap<i32, Broker>,
    /// Batches waiting out a retry backoff.
    delayed: Vec<(Instant, Batch)>,
    /// Batches waiting for fresh metadata before they are routed again.
    awaiting_metadata: Vec<Batch>,
    /// A full metadata fetch is outstanding.
    full_fetch_in_flight: bool,
    /// Sequence number of the last all-topics fetch sent.
    full_fetch_seq: u64,
    /// A full fetch is wanted at this time.
    full_fetch_at: Option<Instant>,
    last_full_fetch: Option<Instant>,
    fetch_backoff: Backoff,
    /// Refresh pacing while some partitions are unusable.
    degraded_backoff: Backoff,
    next_periodic_refresh: Instant,
    shutdown: Option<Instant>,
    rng: Rng,
}

impl Router {
    pub fn new(cfg: Arc<Config>, metrics: &'static Metrics, ch: RouterChannels) -> Router {
        let dcfg = Arc::new(DispatcherConfig::from_config(&cfg));
        let now = Instant::now();
        let mut rng = Rng::from_entropy();
        let next_periodic_refresh =
            now + jittered(cfg.delivery.metadata_refresh_interval, &mut rng);
        Router {
            degraded_backoff: Backoff::new(DEGRADED_REFRESH_MIN, DEGRADED_REFRESH_MAX),
            fetch_backoff: Backoff::new(cfg.delivery.retry_backoff, cfg.delivery.retry_backoff_max),
            cfg,
            dcfg,
            metrics,
            ch,
            inputs_open: true,
            cluster: Cluster::default(),
            have_metadata: false,
            topics: Vec::new(),
            batches: FastMap::default(),
            combined: HashMap::new(),
            scratch: Vec::new(),
            next_batch_expiry: None,
            brokers: HashMap::new(),
            delayed: Vec::new(),
            awaiting_metadata: Vec::new(),
            full_fetch_in_flight: false,
            full_fetch_seq: 0,
            full_fetch_at: Some(now),
            last_full_fetch: None,
            next_periodic_refresh,
            shutdown: None,
            rng,
        }
    }

    /// Runs until shutdown completes: inputs closed and everything delivered or discarded.
    pub fn run(mut self) {
        loop {
            self.start_due_fetches();
            let ev = self.next_event();
            match ev {
                Event::Control(Control::Shutdown { deadline }) => {
                    log::info!("router: shutting down, delivering until the deadline");
                    self.shutdown = Some(deadline);
                }
                Event::Outcome(o) => self.on_outcome(o),
                Event::Meta(m) => self.on_metadata(m),
                Event::Input(msgs) => self.on_input(msgs),
                Event::InputsClosed => {
                    self.inputs_open = false;
                    self.flush_all_batches();
                }
                Event::Status(StatusRequest::MetadataUpdate) => {
                    self.want_full_fetch(Instant::now());
                }
                Event::Tick => {}
            }
            self.on_timers();
            if self.shutdown_finished() {
                break;
            }
        }
        self.stop_dispatchers();
    }

    fn next_event(&mut self) -> Event {
        let timeout = self.next_wakeup().saturating_duration_since(Instant::now());
        let timer = crossbeam_channel::after(timeout);
        let inputs = if self.inputs_open {
            self.ch.from_inputs.clone()
        } else {
            crossbeam_channel::never()
        };
        select_biased! {
            recv(self.ch.from_control) -> c => match c {
                Ok(c) => Event::Control(c),
                // The supervisor is gone: treat as a shutdown with the configured delay.
                Err(_) => {
                    self.ch.from_control = crossbeam_channel::never();
                    Event::Control(Control::Shutdown { deadline: Instant::now() + self.cfg.delivery.shutdown_max_delay })
                }
            },
            recv(self.ch.from_dispatchers) -> o => match o {
                Ok(o) => Event::Outcome(o),
                Err(_) => Event::Tick,
            },
            recv(self.ch.from_meta) -> m => match m {
                Ok(m) => Event::Meta(m),
                Err(_) => Event::Tick,
            },
            recv(inputs) -> i => match i {
                Ok(msgs) => Event::Input(msgs),
                Err(_) => Event::InputsClosed,
            },
            recv(self.ch.from_status) -> s => match s {
                Ok(s) => Event::Status(s),
                Err(_) => {
                    self.ch.from_status = crossbeam_channel::never();
                    Event::Tick
                }
            },
            recv(timer) -> _ => Event::Tick,
        }
    }

    fn next_wakeup(&self) -> Instant {
        let now = Instant::now();
        let mut t = self.next_periodic_refresh;
        let mut consider = |x: Option<Instant>| {
            if let Some(x) = x {
                t = t.min(x);
            }
        };
        consider(self.next_batch_expiry);
        consider(self.delayed.iter().map(|(at, _)| *at).min());
        consider(self.full_fetch_at);
        for slot in &self.topics {
            if let Some(l) = &slot.lookup {
                consider(l.next_try);
                consider(l.asked_at.map(|a| a + self.cfg.delivery.unknown_topic_wait));
            }
        }
        if let Some(deadline) = self.shutdown {
            consider(Some(deadline));
            consider(Some(now + SHUTDOWN_TICK));
        }
        t.max(now)
    }

    // ----- input -----

    fn slot(&mut self, t: TopicId) -> &mut TopicSlot {
        let i = t as usize;
        if self.topics.len() <= i {
            self.topics.resize_with(i + 1, TopicSlot::default);
        }
        &mut self.topics[i]
    }

    /// The topic's current view, refreshed from the cluster if it changed.
    fn view(&mut self, t: TopicId) -> Option<&TopicView> {
        let generation = self.cluster.generation;
        let metrics = self.metrics;
        let i = t as usize;
        if self.topics.len() <= i {
            self.topics.resize_with(i + 1, TopicSlot::default);
        }
        let slot = &mut self.topics[i];
        if slot.generation != generation || slot.view.is_none() {
            let name = slot.name.get_or_insert_with(|| metrics.topic_name(t));
            slot.view = self.cluster.topics.get(&**name).cloned();
            slot.generation = generation;
        }
        slot.view.as_ref()
    }

    fn on_input(&mut self, mut msgs: Vec<Msg>) {
        let now = Instant::now();
        for m in msgs.drain(..) {
            self.accept(m, now);
        }
        // Full (inputs are not taking them): let it go.
        let _ = self.ch.spare_batches.try_send(msgs);
    }

    /// Validates a new message and batches it (or holds it while its topic is looked up).
    fn accept(&mut self, m: Msg, now: Instant) {
        let t = m.topic;
        self.metrics.queue_add(t, QueueState::New, -1);
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
            let name = self.metrics.topic_name(t);
            let mut sample = Vec::with_capacity(m.value_len().min(256));
            m.payload
                .copy_to(m.key_len(), m.value_len().min(256), &mut sample);
            self.metrics.too_long_sample(&name, &sample);
            self.discard_msgs(vec![m], DiscardReason::TooLong);
            return;
        }
        self.route_new(m, now);
    }

    /// The topic's policy, resolved from the config once.
    fn policy(&mut self, t: TopicId) -> TopicPolicy {
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
            .map(|r| RateLimiter::new(r.interval, r.max_count));
        p
    }

    /// The partition a message must go to, if its key decides it: PartitionKey messages
    /// by Dory's rule, AnyPartition messages with a key under the murmur2 partitioner as
    /// the Java client would. `None`: any partition (round robin).
    fn keyed_partition(&mut self, t: TopicId, m: &Msg, policy: &TopicPolicy) -> Option<i32> {
        if let Some(k) = m.partition_key {
            return self.view(t)?.partition_for_key(k);
        }
        if policy.partitioner != Partitioner::Murmur2 || m.key_len() == 0 {
            return None;
        }
        let count = self.view(t)?.partition_count;
        self.scratch.clear();
        m.payload.copy_to(0, m.key_len(), &mut self.scratch);
        let p = java_partition(&self.scratch, count)?;
        self.view(t)?.usable_at_or_after(i32::try_from(p).ok()?)
    }

    /// Batches a validated message for a known topic.
    fn route_new(&mut self, m: Msg, now: Instant) {
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
                self.add_combined(m, partition, now);
                return;
            }
            BatchAction::CombinedTopics | BatchAction::Disable => NO_LIMITS,
        };
        let key = (t, partition);
        let max_kafka = self.cfg.batching.message_max_bytes;
        self.metrics.queue_add(t, QueueState::Batch, 1);
        let open = self.batches.entry(key).or_insert_with(|| Open {
            batch: OpenBatch::default(),
            limits,
        });
        let was_empty = open.batch.is_empty();
        let emit = open.batch.add(m, &limits, max_kafka, now);
        if was_empty || open.batch.is_empty() {
            if let Some(d) = open.batch.deadline(&limits) {
                self.next_batch_expiry = Some(self.next_batch_expiry.map_or(d, |x| x.min(d)));
            }
        }
        if let Some(msgs) = emit.batch {
            self.emit(key, msgs);
        }
        if let Some(m) = emit.alone {
            self.emit(key, vec![m]);
        }
    }

    /// Adds a message to the combined-topics batch of its destination broker.
    fn add_combined(&mut self, m: Msg, partition: Option<i32>, now: Instant) {
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
        let was_empty = open.is_empty();
        let emit = open.add(m, &limits, max_kafka, now);
        if was_empty || open.is_empty() {
            if let Some(d) = open.deadline(&limits) {
                self.next_batch_expiry = Some(self.next_batch_expiry.map_or(d, |x| x.min(d)));
            }
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
    fn emit_combined(&mut self, broker: i32, msgs: Vec<Msg>) {
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
    fn partition_led_by(&mut self, t: TopicId, broker: i32) -> Option<i32> {
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

    fn debug_log(&mut self, file: DebugFile, m: &Msg) {
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
    fn hold_for_lookup(&mut self, m: Msg, now: Instant) {
        let t = m.topic;
        let ask = self.have_metadata;
        self.metrics.queue_add(t, QueueState::New, 1);
        let slot = self.slot(t);
        match slot.lookup.as_mut() {
            Some(l) => l.msgs.push(m),
            None => {
                slot.lookup = Some(Lookup {
                    asked_at: None,
                    next_try: ask.then_some(now),
                    answer_seq: 0,
                    msgs: vec![m],
                })
            }
        }
    }

    // ----- batches and dispatch -----

    /// A completed batch: choose the partition (AnyPartition) and send it to its leader.
    fn emit(&mut self, key: BatchKey, msgs: Vec<Msg>) {
        let (t, partition) = key;
        let n = msgs.len() as i64;
        self.metrics.queue_add(t, QueueState::Batch, -n);
        let partition = match partition {
            Some(p) => Some(p),
            None => self.round_robin(t),
        };
        match partition {
            Some(p) => {
                self.metrics.queue_add(t, QueueState::SendWait, n);
                self.dispatch(Batch {
                    topic: t,
                    partition: p,
                    msgs,
                });
            }
            None => self.discard_msgs(msgs, DiscardReason::NoAvailablePartitions),
        }
    }

    fn round_robin(&mut self, t: TopicId) -> Option<i32> {
        let up: HashMap<i32, bool> = self.brokers.iter().map(|(id, b)| (*id, b.up)).collect();
        self.view(t)?;
        let slot = &mut self.topics[t as usize];
        let view = slot.view.as_ref()?;
        view.next_round_robin(&mut slot.rr, |b| up.get(&b).copied().unwrap_or(true))
    }

    /// Sends a batch (already counted as SendWait) to its partition's leader, or holds it.
    fn dispatch(&mut self, batch: Batch) {
        let leader = self
            .view(batch.topic)
            .and_then(|v| v.leader_of(batch.partition));
        let Some(leader) = leader else {
            // The partition vanished: route it again with fresh metadata.
            self.awaiting_metadata.push(batch);
            self.want_full_fetch(Instant::now());
            return;
        };
        if !self.brokers.contains_key(&leader) {
            let Some(info) = self.cluster.brokers.get(&leader).cloned() else {
                self.awaiting_metadata.push(batch);
                self.want_full_fetch(Instant::now());
                return;
            };
            let handle = dispatcher::spawn(
                leader,
                info.host,
                info.port,
                self.dcfg.clone(),
                self.metrics,
                self.ch.to_router.clone(),
            );
            self.brokers.insert(
                leader,
                Broker {
                    handle,
                    up: true,
                    queued: 0,
                    backlog: VecDeque::new(),
                },
            );
        }
        let b = self.brokers.get_mut(&leader).expect("inserted above");
        if !b.up || !b.backlog.is_empty() || b.queued >= DISPATCH_CHANNEL_CAP {
            b.backlog.push_back(batch);
            return;
        }
        match b.handle.try_send(batch) {
            Ok(()) => b.queued += 1,
            Err(TrySendError::Full(batch)) => b.backlog.push_back(batch),
            Err(TrySendError::Disconnected(batch)) => {
                // The dispatcher thread ended (it only does so when told to stop).
                log::error!("dispatcher for broker {leader} is gone; rerouting");
                self.brokers.remove(&leader);
                self.awaiting_metadata.push(batch);
                self.want_full_fetch(Instant::now());
            }
        }
    }

    fn flush_backlog(&mut self, broker: i32) {
        let Some(b) = self.brokers.get_mut(&broker) else {
            return;
        };
        while b.up && b.queued < DISPATCH_CHANNEL_CAP {
            let Some(batch) = b.backlog.pop_front() else {
                break;
            };
            match b.handle.try_send(batch) {
                Ok(()) => b.queued += 1,
                Err(TrySendError::Full(batch)) | Err(TrySendError::Disconnected(batch)) => {
                    b.backlog.push_front(batch);
                    break;
                }
            }
        }
    }

    fn flush_all_batches(&mut self) {
        let keys: Vec<BatchKey> = self.batches.keys().copied().collect();
        for key in keys {
            let msgs = self.batches.get_mut(&key).map(|o| o.batch.take());
            if let Some(msgs) = msgs.filter(|m| !m.is_empty()) {
                self.emit(key, msgs);
            }
        }
        let brokers: Vec<i32> = self.combined.keys().copied().collect();
        for b in brokers {
            let msgs = self.combined.get_mut(&b).map(OpenBatch::take);
            if let Some(msgs) = msgs.filter(|m| !m.is_empty()) {
                self.emit_combined(b, msgs);
            }
        }
        self.next_batch_expiry = None;
    }

    // ----- outcomes from dispatchers -----

    fn on_outcome(&mut self, o: Outcome) {
        match o {
            Outcome::Finished { broker, n } => {
                if let Some(b) = self.brokers.get_mut(&broker) {
                    b.queued = b.queued.saturating_sub(n);
                }
                self.flush_backlog(broker);
            }
            Outcome::Connection { broker, up } => {
                if let Some(b) = self.brokers.get_mut(&broker) {
                    b.up = up;
                }
                if up {
                    self.flush_backlog(broker);
                } else {
                    self.want_full_fetch(Instant::now());
                }
            }
            Outcome::Returned {
                broker,
                reason,
                batches,
            } => {
                for batch in batches {
                    self.on_returned(reason, batch);
                }
                self.flush_backlog(broker);
            }
        }
    }

    fn on_returned(&mut self, reason: ReturnReason, mut batch: Batch) {
        let now = Instant::now();
        if self.shutdown.is_some_and(|d| now >= d) {
            self.discard_batch(batch, DiscardReason::Shutdown);
            return;
        }
        if batch.msgs.iter().any(|m| m.maybe_sent) {
            let (dups, rest): (Vec<Msg>, Vec<Msg>) =
                batch.msgs.into_iter().partition(|m| m.maybe_sent);
            crate::report::discards::possible_duplicates(self.metrics, &dups);
            batch.msgs = rest;
            batch.msgs.extend(dups.into_iter().map(|mut m| {
                m.maybe_sent = false;
                m
            }));
        }
        match reason {
            ReturnReason::Retry => self.dispatch(batch),
            ReturnReason::Backoff => {
                let attempts = batch
                    .msgs
                    .iter()
                    .map(|m| m.failed_attempts)
                    .max()
                    .unwrap_or(1);
                let d = retry_delay(
                    attempts,
                    self.cfg.delivery.retry_backoff,
                    self.cfg.delivery.retry_backoff_max,
                    &mut self.rng,
                );
                self.delayed.push((now + d, batch));
            }
            ReturnReason::Reroute | ReturnReason::ConnectionLost | ReturnReason::Stopped => {
                self.awaiting_metadata.push(batch);
                self.want_full_fetch(now);
            }
        }
    }

    /// Routes a returned batch again under the current metadata: AnyPartition messages to
    /// a fresh round-robin choice, PartitionKey messages by their key.
    fn reroute(&mut self, batch: Batch) {
        let t = batch.topic;
        match self.view(t).map(|v| v.has_usable()) {
            None => {
                self.discard_batch(batch, DiscardReason::BadTopic);
                return;
            }
            Some(false) => {
                self.discard_batch(batch, DiscardReason::NoAvailablePartitions);
                return;
            }
            Some(true) => {}
        }
        let policy = self.policy(t);
        let mut any = Vec::new();
        let mut keyed: Vec<(i32, Vec<Msg>)> = Vec::new();
        for m in batch.msgs {
            let keyed_by = m.partition_key.is_some()
                || (policy.partitioner == Partitioner::Murmur2 && m.key_len() > 0);
            if !keyed_by {
                any.push(m);
                continue;
            }
            let p = self
                .keyed_partition(t, &m, &policy)
                .unwrap_or(batch.partition);
            match keyed.iter_mut().find(|(q, _)| *q == p) {
                Some((_, v)) => v.push(m),
                None => keyed.push((p, vec![m])),
            }
        }
        if !any.is_empty() {
            match self.round_robin(t) {
                Some(p) => self.dispatch(Batch {
                    topic: t,
                    partition: p,
                    msgs: any,
                }),
                None => self.discard_staged(
                    any,
                    DiscardReason::NoAvailablePartitions,
                    QueueState::SendWait,
                ),
            }
        }
        for (p, msgs) in keyed {
            self.dispatch(Batch {
                topic: t,
                partition: p,
                msgs,
            });
        }
    }

    // ----- metadata -----

    fn want_full_fetch(&mut self, at: Instant) {
        let earliest = self
            .last_full_fetch
            .map_or(at, |l| at.max(l + MIN_REFRESH_GAP));
        self.full_fetch_at = Some(self.full_fetch_at.map_or(earliest, |x| x.min(earliest)));
    }

    fn start_due_fetches(&mut self) {
        let now = Instant::now();
        if !self.full_fetch_in_flight && self.full_fetch_at.is_some_and(|t| now >= t) {
            let req = MetaRequest {
                topics: None,
                autocreate: false,
                seq: self.full_fetch_seq + 1,
            };
            if self.ch.to_meta.try_send(req).is_ok() {
                self.full_fetch_seq += 1;
                self.full_fetch_in_flight = true;
                self.full_fetch_at = None;
                self.last_full_fetch = Some(now);
            }
        }
        if !self.have_metadata {
            return;
        }
        // Topic lookups: with auto-creation, ask for the topics themselves (which asks the
        // broker to create them); without, the next all-topics fetch answers the question.
        let autocreate = self.cfg.delivery.topic_autocreate;
        let answer_seq = self.full_fetch_seq + 1;
        let mut wanted: Vec<Arc<[u8]>> = Vec::new();
        for (i, slot) in self.topics.iter_mut().enumerate() {
            let Some(l) = slot.lookup.as_mut() else {
                continue;
            };
            if l.next_try.is_none_or(|t| now < t) {
                continue;
            }
            l.next_try = None;
            l.asked_at.get_or_insert(now);
            l.answer_seq = answer_seq;
            let name = slot
                .name
                .get_or_insert_with(|| self.metrics.topic_name(i as TopicId))
                .clone();
            wanted.push(name);
        }
        if wanted.is_empty() {
            return;
        }
        if !autocreate {
            self.want_full_fetch(now);
            return;
        }
        let req = MetaRequest {
            topics: Some(wanted.clone()),
            autocreate: true,
            seq: 0,
        };
        if self.ch.to_meta.try_send(req).is_err() {
            // The fetcher is busy: ask again shortly.
            for slot in &mut self.topics {
                if slot.name.as_ref().is_some_and(|n| wanted.contains(n)) {
                    if let Some(l) = slot.lookup.as_mut() {
                        l.next_try = Some(now + TOPIC_LOOKUP_RETRY);
                    }
                }
            }
        }
    }

    fn on_metadata(&mut self, resp: MetaResponse) {
        let now = Instant::now();
        let full = resp.request.topics.is_none();
        if full {
            self.full_fetch_in_flight = false;
        }
        let md = match resp.result {
            Ok(md) => md,
            Err(e) => {
                log::warn!("metadata fetch failed: {e}");
                if full {
                    let d = self.fetch_backoff.next_delay();
                    self.full_fetch_at = Some(now + d);
                }
                self.retry_lookups(&resp.request, now);
                return;
            }
        };
        self.fetch_backoff.reset();
        let changed = if full {
            self.cluster.install_full(&md)
        } else {
            self.cluster.install_partial(&md)
        };
        self.metrics
            .metadata_updated(changed || !self.have_metadata);
        if full {
            self.next_periodic_refresh =
                now + jittered(self.cfg.delivery.metadata_refresh_interval, &mut self.rng);
            if !self.have_metadata {
                // /health turns 200 from this (and the inputs being open).
                self.have_metadata = true;
                log::info!(
                    "metadata: {} brokers, {} topics",
                    self.cluster.brokers.len(),
                    self.cluster.topics.len()
                );
            }
        }
        if changed {
            self.update_broker_addresses();
        }
        // While a topic in use has partitions without a usable leader (a broker left,
        // a leader election is under way), look again soon, backing off, so a broker
        // that returns gets its partitions back within seconds, not at the next
        // periodic refresh.
        if full {
            if self.degraded() {
                let d = self.degraded_backoff.next_delay();
                self.next_periodic_refresh = self.next_periodic_refresh.min(now + d);
            } else {
                self.degraded_backoff.reset();
            }
        }
        self.resolve_lookups(&resp.request, now);
        // Everything waiting for fresh metadata goes out again.
        for batch in std::mem::take(&mut self.awaiting_metadata) {
            self.reroute(batch);
        }
        // Backlogs of brokers that are down may now belong elsewhere.
        let down: Vec<i32> = self
            .brokers
            .iter()
            .filter(|(_, b)| !b.up && !b.backlog.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in down {
            let held: Vec<Batch> = self
                .brokers
                .get_mut(&id)
                .map(|b| b.backlog.drain(..).collect())
                .unwrap_or_default();
            for batch in held {
                let leader = self
                    .view(batch.topic)
                    .and_then(|v| v.leader_of(batch.partition));
                if leader == Some(id) {
                    if let Some(b) = self.brokers.get_mut(&id) {
                        b.backlog.push_back(batch);
                    }
                } else {
                    self.reroute(batch);
                }
            }
        }
    }

    /// Whether a topic we route to has partitions that cannot take writes.
    fn degraded(&self) -> bool {
        self.topics.iter().any(|slot| {
            slot.name
                .as_ref()
                .and_then(|n| self.cluster.topics.get(n))
                .is_some_and(|v| v.usable.len() < v.partition_count)
        })
    }

    /// A dispatcher's broker changed address: stop it; a new one starts on next use.
    fn update_broker_addresses(&mut self) {
        let stale: Vec<i32> = self
            .brokers
            .iter()
            .filter(|(id, b)| {
                self.cluster
                    .brokers
                    .get(id)
                    .is_none_or(|i| i.host != b.handle.host || i.port != b.handle.port)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            if let Some(b) = self.brokers.remove(&id) {
                log::info!("broker {id} left the metadata or moved; stopping its dispatcher");
                for batch in b.backlog {
                    self.awaiting_metadata.push(batch);
                }
                // Dropping the handle closes its channel; the dispatcher returns what it
                // holds as Stopped, which is rerouted.
                b.handle.detach();
            }
        }
    }

    /// Whether `req` asked about the topic in `slot`.
    fn asked(req: &MetaRequest, slot: &TopicSlot) -> bool {
        match &req.topics {
            None => slot
                .lookup
                .as_ref()
                .is_some_and(|l| l.answer_seq <= req.seq),
            Some(names) => slot.name.as_ref().is_some_and(|n| names.contains(n)),
        }
    }

    /// A fetch failed: the topics it asked about are asked again shortly.
    fn retry_lookups(&mut self, req: &MetaRequest, now: Instant) {
        for slot in &mut self.topics {
            if !Self::asked(req, slot) {
                continue;
            }
            if let Some(l) = slot.lookup.as_mut() {
                if l.asked_at.is_some() && l.next_try.is_none() {
                    l.next_try = Some(now + TOPIC_LOOKUP_RETRY);
                }
            }
        }
    }

    /// After metadata arrived: release held messages of topics now known; discard those
    /// whose topic is definitely unknown; keep asking for topics being created.
    fn resolve_lookups(&mut self, req: &MetaRequest, now: Instant) {
        let autocreate = self.cfg.delivery.topic_autocreate;
        let wait = self.cfg.delivery.unknown_topic_wait;
        for i in 0..self.topics.len() {
            if self.topics[i].lookup.is_none() {
                continue;
            }
            let t = i as TopicId;
            if self.view(t).is_some() {
                let lookup = self.topics[i].lookup.take().expect("checked above");
                for m in lookup.msgs {
                    // Through the normal checks (size, availability); `accept` expects
                    // the message in the New state, where it is.
                    self.accept(m, now);
                }
                continue;
            }
            let asked = Self::asked(req, &self.topics[i]);
            let slot = &mut self.topics[i];
            let l = slot.lookup.as_mut().expect("checked above");
            if l.asked_at.is_none() {
                // Held before the first metadata: ask now.
                if l.next_try.is_none() {
                    l.next_try = Some(now);
                }
                continue;
            }
            if !asked {
                continue;
            }
            if autocreate && !l.expired(now, wait) {
                // Being created: brokers answer LEADER_NOT_AVAILABLE or list the topic
                // without leaders for a moment. Keep asking until the wait runs out.
                l.next_try = Some(now + TOPIC_LOOKUP_RETRY);
                continue;
            }
            self.give_up_lookup(i, now);
        }
    }

    /// The topic is unknown (or could not be created): discard what was held for it.
    fn give_up_lookup(&mut self, i: usize, now: Instant) {
        let Some(lookup) = self.topics[i].lookup.take() else {
            return;
        };
        self.topics[i].bad_until = Some(now + BAD_TOPIC_MEMORY);
        let reason = if self.cfg.delivery.topic_autocreate {
            DiscardReason::AutocreateFailed
        } else {
            DiscardReason::BadTopic
        };
        let name = self.metrics.topic_name(i as TopicId);
        log::warn!(
            "discarding {} message(s) for unknown topic [{}] ({})",
            lookup.msgs.len(),
            String::from_utf8_lossy(&name),
            reason.as_str()
        );
        self.discard_staged(lookup.msgs, reason, QueueState::New);
    }

    // ----- timers -----

    fn on_timers(&mut self) {
        let now = Instant::now();
        if now >= self.next_periodic_refresh {
            self.next_periodic_refresh =
                now + jittered(self.cfg.delivery.metadata_refresh_interval, &mut self.rng);
            self.want_full_fetch(now);
        }
        if self.next_batch_expiry.is_some_and(|t| now >= t) {
            self.expire_batches(now);
        }
        if self.delayed.iter().any(|(at, _)| now >= *at) {
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.delayed)
                .into_iter()
                .partition(|(at, _)| now >= *at);
            self.delayed = later;
            for (_, batch) in due {
                self.dispatch(batch);
            }
        }
        // Lookups that waited too long: the topic does not exist (or was not created).
        let wait = self.cfg.delivery.unknown_topic_wait;
        let expired: Vec<usize> = (0..self.topics.len())
            .filter(|&i| {
                self.topics[i]
                    .lookup
                    .as_ref()
                    .is_some_and(|l| l.expired(now, wait))
            })
            .collect();
        for i in expired {
            self.give_up_lookup(i, now);
        }
        if let Some(deadline) = self.shutdown {
            if !self.inputs_open && now >= deadline {
                self.discard_everything_held();
            }
        }
    }

    fn expire_batches(&mut self, now: Instant) {
        let due: Vec<BatchKey> = self
            .batches
            .iter()
            .filter(|(_, o)| o.batch.deadline(&o.limits).is_some_and(|d| now >= d))
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            let msgs = self.batches.get_mut(&key).map(|o| o.batch.take());
            if let Some(msgs) = msgs.filter(|m| !m.is_empty()) {
                self.emit(key, msgs);
            }
        }
        let combined_limits = self.cfg.policies.combined.unwrap_or(NO_LIMITS);
        let due: Vec<i32> = self
            .combined
            .iter()
            .filter(|(_, b)| b.deadline(&combined_limits).is_some_and(|d| now >= d))
            .map(|(k, _)| *k)
            .collect();
        for broker in due {
            let msgs = self.combined.get_mut(&broker).map(OpenBatch::take);
            if let Some(msgs) = msgs.filter(|m| !m.is_empty()) {
                self.emit_combined(broker, msgs);
            }
        }
        self.batches.retain(|_, o| !o.batch.is_empty());
        self.combined.retain(|_, b| !b.is_empty());
        let per_topic = self
            .batches
            .values()
            .filter_map(|o| o.batch.deadline(&o.limits));
        let combined = self
            .combined
            .values()
            .filter_map(|b| b.deadline(&combined_limits));
        self.next_batch_expiry = per_topic.chain(combined).min();
    }

    // ----- shutdown -----

    fn shutdown_finished(&mut self) -> bool {
        let Some(deadline) = self.shutdown else {
            return false;
        };
        if self.inputs_open {
            return false;
        }
        if Instant::now() >= deadline {
            return true;
        }
        // Done when nothing is in flight anywhere (counted by the metrics).
        self.metrics.total_in_flight() == 0
    }

    /// Past the deadline: everything the router holds is discarded as `shutdown`.
    fn discard_everything_held(&mut self) {
        for key in self.batches.keys().copied().collect::<Vec<_>>() {
            if let Some(msgs) = self.batches.get_mut(&key).map(|o| o.batch.take()) {
                self.discard_staged(msgs, DiscardReason::Shutdown, QueueState::Batch);
            }
        }
        for b in self.combined.keys().copied().collect::<Vec<_>>() {
            if let Some(msgs) = self.combined.get_mut(&b).map(OpenBatch::take) {
                self.discard_staged(msgs, DiscardReason::Shutdown, QueueState::Batch);
            }
        }
        for i in 0..self.topics.len() {
            if let Some(l) = self.topics[i].lookup.take() {
                self.discard_staged(l.msgs, DiscardReason::Shutdown, QueueState::New);
            }
        }
        for (_, b) in std::mem::take(&mut self.delayed) {
            self.discard_batch(b, DiscardReason::Shutdown);
        }
        for b in std::mem::take(&mut self.awaiting_metadata) {
            self.discard_batch(b, DiscardReason::Shutdown);
        }
        let backlogs: Vec<Batch> = self
            .brokers
            .values_mut()
            .flat_map(|b| b.backlog.drain(..))
            .collect();
        for b in backlogs {
            self.discard_batch(b, DiscardReason::Shutdown);
        }
    }

    /// Stops every dispatcher: closes their queues, aborts their connections if the
    /// deadline has passed, and takes back (and discards) what they return.
    fn stop_dispatchers(&mut self) {
        let deadline = self.shutdown.unwrap_or_else(Instant::now);
        let brokers: Vec<Broker> = self.brokers.drain().map(|(_, b)| b).collect();
        let mut handles = Vec::new();
        for b in brokers {
            for batch in b.backlog {
                self.discard_batch(batch, DiscardReason::Shutdown);
            }
            handles.push(b.handle.close());
        }
        loop {
            let now = Instant::now();
            if now >= deadline {
                for h in &handles {
                    h.abort();
                }
            }
            while let Ok(o) = self.ch.from_dispatchers.try_recv() {
                if let Outcome::Returned { batches, .. } = o {
                    for b in batches {
                        self.discard_batch(b, DiscardReason::Shutdown);
                    }
                }
            }
            if handles.iter().all(|h| h.is_finished()) {
                break;
            }
            if now >= deadline + DISPATCHER_JOIN_GRACE {
                log::error!("dispatchers did not stop in time; leaving them");
                break;
            }
            if let Ok(Outcome::Returned { batches, .. }) =
                self.ch.from_dispatchers.recv_timeout(SHUTDOWN_TICK)
            {
                for b in batches {
                    self.discard_batch(b, DiscardReason::Shutdown);
                }
            }
        }
        for h in handles {
            h.join();
        }
        while let Ok(o) = self.ch.from_dispatchers.try_recv() {
            if let Outcome::Returned { batches, .. } = o {
                for b in batches {
                    self.discard_batch(b, DiscardReason::Shutdown);
                }
            }
        }
        self.discard_everything_held();
        let left = self.metrics.total_in_flight();
        if left != 0 {
            log::error!("{left} message(s) still counted in flight at exit");
        }
    }

    // ----- discards -----

    /// Discards a batch that is in the SendWait state.
    fn discard_batch(&mut self, b: Batch, reason: DiscardReason) {
        self.discard_staged(b.msgs, reason, QueueState::SendWait);
    }

    /// Discards messages not in any queue state (just taken from the input, or taken
    /// out of their state by the caller).
    fn discard_msgs(&mut self, msgs: Vec<Msg>, reason: DiscardReason) {
        crate::report::discards::discard(self.metrics, msgs, reason);
    }

    fn discard_staged(&mut self, msgs: Vec<Msg>, reason: DiscardReason, state: QueueState) {
        for m in &msgs {
            self.metrics.queue_add(m.topic, state, -1);
        }
        self.discard_msgs(msgs, reason);
    }
}

/// ±20 % jitter, as Dory does for its refresh timer.
fn jittered(d: Duration, rng: &mut Rng) -> Duration {
    let ms = d.as_millis() as u64;
    Duration::from_millis(rng.range(ms - ms / 5, ms + ms / 5))
}
