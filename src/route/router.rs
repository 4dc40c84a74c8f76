//! The router: owns metadata, validates topics, chooses partitions, batches, hands batches
//! to the dispatcher of each partition's leader, and takes back what dispatchers could not
//! deliver (retry, backoff, reroute after a metadata refresh).
//!
//! It never blocks on the network: metadata is fetched by a helper thread, and a full
//! dispatcher queue is absorbed by a per-broker backlog. Every message that enters is
//! counted as received by the input; the router counts each discard it decides on.
//!
//! This file holds the router's state, its event loop, timers and discards. The other
//! concerns of the same `impl Router` are child modules in `router/`: `accept.rs` (taking
//! messages in), `dispatch.rs` (batches to dispatchers), `outcomes.rs` (what dispatchers
//! hand back), `topics.rs` (metadata and topic lookups), `sequence.rs` (the idempotent
//! producer's sequencing), `shutdown.rs`, and `shared.rs` (the router thread's loop, and
//! inputs routing their own batches while the router is idle).

mod accept;
mod dispatch;
mod outcomes;
mod sequence;
mod shared;
mod shutdown;
mod topics;

pub use shared::{RouterEvents, SharedRouter};

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::config::policy::TopicPolicy;
use crate::config::BatchLimits;
use crate::config::Config;
use crate::deliver::backoff::{Backoff, Rng};
use crate::deliver::dispatcher::{DispatcherConfig, DispatcherHandle};
use crate::deliver::idempotence::Sequencer;
use crate::fasthash::FastMap;
use crate::pipeline::{
    Batch, Control, FetchRequest, MetaResponse, Msg, Outcome, PartKey, ProducerIdError,
    StatusRequest, TopicId,
};
use crate::report::liveness::TICK as HEARTBEAT_TICK;
use crate::report::metrics::{DiscardReason, Idempotence, Metrics, QueueState};
use crate::route::batcher::OpenBatch;
use crate::route::cluster::{Cluster, TopicView};
use crate::route::deadlines::Deadlines;
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
/// Most input batches (of up to `INPUT_BATCH_MAX` messages) routed in a row, while more
/// wait, before batches whose time is up are sent anyway.
const EXPIRY_DEFER_MAX: u32 = 64;

/// The router state's channel ends (the ones only the router thread waits on are
/// [`RouterEvents`]).
pub struct RouterChannels {
    /// Emptied input batches go back to the inputs for reuse.
    pub spare_batches: Sender<Vec<Msg>>,
    pub to_meta: Sender<FetchRequest>,
    pub to_router: Sender<Outcome>,
    /// Also waited on by the router thread; drained at shutdown.
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
    lookup: Option<Box<Lookup>>,
    /// Until when the topic counts as bad without asking again.
    bad_until: Option<Instant>,
    /// Batching, compression, rate limit and partitioner of the topic (resolved once).
    policy: Option<TopicPolicy>,
    limiter: Option<Box<RateLimiter>>,
    /// Round-robin counter for combined-topics batches.
    rr_combined: usize,
    /// Listed in `Router::lookups`.
    listed: bool,
    /// The open batch of the topic's AnyPartition messages (batching key `(t, None)`),
    /// kept here rather than in a map: one message, one slot to touch.
    open: OpenBatch,
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
    ProducerId(Result<(i64, i16), ProducerIdError>),
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
    /// Slots that hold (or held) a lookup, so timers look at those rather than at every
    /// topic: with thousands of topics a scan per wake-up cost more than the messages.
    /// Cleaned lazily ([`Router::prune_lookups`]).
    lookups: Vec<usize>,
    /// Open batches of PartitionKey messages, per (topic, partition) (the AnyPartition
    /// ones are in the topic's slot: [`Router::open_batch`]).
    keyed: FastMap<(TopicId, i32), OpenBatch>,
    /// When per-topic batches expire, earliest first: (deadline, key) queued whenever a
    /// batch gets a new deadline; an entry whose batch was sent or got a later deadline
    /// since is skipped when it comes up.
    expiries: Deadlines<BatchKey>,
    /// Combined-topics batches, per destination broker.
    combined: FastMap<i32, OpenBatch>,
    /// Reused buffer for message keys (murmur2).
    scratch: Vec<u8>,
    /// Reused for grouping input batches by topic.
    groups: crate::pipeline::TopicGroups,
    /// Reused for an input batch's runs of one topic: (topic, length).
    runs: Vec<(TopicId, usize)>,
    next_batch_expiry: Option<Instant>,
    brokers: FastMap<i32, Broker>,
    /// Counts changes to `brokers` (added, removed, up or down): with the cluster view's
    /// generation, tells the sequencer when partitions it parked may be sendable again.
    broker_changes: u64,
    /// `(cluster generation, broker_changes)` and the time of the last unpark.
    seq_unparked: ((u64, u64), Instant),
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
    /// The idempotent producer's sequencing (mode `Off` without idempotence).
    seq: Sequencer<Batch>,
    /// When to ask for a producer id again after a failed request.
    id_retry_at: Option<Instant>,
    id_backoff: Backoff,
    /// Failed producer-id requests in a row (for log pacing).
    id_failures: u32,
    /// Reused buffers for the batches the sequencer releases and the partitions it asks
    /// about.
    sealed: Vec<Batch>,
    dirty_scan: Vec<PartKey>,
    sendable: FastMap<PartKey, ()>,
    /// Input batches taken from the channel and routed (see [`SharedRouter`]).
    channel_batches_done: u64,
    /// More input batches wait in the channel behind the event being handled.
    input_waiting: bool,
    /// Times in a row batches whose time is up waited for the queued input.
    expiry_deferred: u32,
    /// While the router thread waits: until when (an input routing a batch that needs it
    /// awake earlier nudges it).
    asleep_until: Option<Instant>,
}

impl Router {
    pub fn new(cfg: Arc<Config>, metrics: &'static Metrics, ch: RouterChannels) -> Router {
        let dcfg = Arc::new(DispatcherConfig::from_config(&cfg));
        let now = Instant::now();
        let mut rng = Rng::from_entropy();
        let next_periodic_refresh =
            now + jittered(cfg.delivery.metadata_refresh_interval, &mut rng);
        let mut seq = Sequencer::new();
        if !cfg.kafka.idempotence {
            seq.disable(&mut Vec::new(), |_| {});
            metrics.set_idempotence(Idempotence::Disabled, -1, -1);
        }
        Router {
            seq,
            id_retry_at: None,
            id_backoff: Backoff::new(cfg.delivery.retry_backoff, cfg.delivery.retry_backoff_max),
            id_failures: 0,
            sealed: Vec::new(),
            dirty_scan: Vec::new(),
            sendable: FastMap::default(),
            channel_batches_done: 0,
            input_waiting: false,
            expiry_deferred: 0,
            asleep_until: None,
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
            lookups: Vec::new(),
            keyed: FastMap::default(),
            expiries: Deadlines::default(),
            combined: FastMap::default(),
            scratch: Vec::new(),
            groups: Default::default(),
            runs: Vec::new(),
            next_batch_expiry: None,
            brokers: FastMap::default(),
            broker_changes: 0,
            seq_unparked: ((0, 0), now),
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

    /// Handles one event and what follows it (timers, the sequencer, gauges); true when
    /// shutdown is complete.
    fn handle(&mut self, ev: Event) -> bool {
        let brokers_may_change = !matches!(ev, Event::Input(_));
        // The clock is read once for an input batch: its timers are checked at the instant
        // it was routed (microseconds early at most; the next wait catches up).
        let mut read_at = None;
        match ev {
            Event::Control(Control::Shutdown { deadline }) => {
                log::info!("router: shutting down, delivering until the deadline");
                self.shutdown = Some(deadline);
            }
            Event::Outcome(o) => self.on_outcome(o),
            Event::Meta(m) => self.on_metadata(m),
            Event::ProducerId(r) => self.on_producer_id(r),
            Event::Input(msgs) => {
                let now = Instant::now();
                self.on_input(msgs, now);
                self.channel_batches_done += 1;
                read_at = Some(now);
            }
            Event::InputsClosed => {
                self.inputs_open = false;
                self.flush_all_batches();
            }
            Event::Status(StatusRequest::MetadataUpdate) => {
                self.want_full_fetch(Instant::now());
            }
            Event::Tick => {}
        }
        self.on_timers_at(read_at.unwrap_or_else(Instant::now));
        self.pump_sequence();
        if brokers_may_change {
            self.publish_brokers();
        }
        self.shutdown_finished()
    }

    /// Publishes the broker gauges (brokers in metadata, dispatchers connected).
    fn publish_brokers(&self) {
        let up = self.brokers.values().filter(|b| b.up).count();
        self.metrics.set_brokers(self.cluster.brokers.len(), up);
    }

    fn next_wakeup(&self) -> Instant {
        self.next_wakeup_at(Instant::now())
    }

    /// When the router must wake next, as seen at `now` (never before it).
    fn next_wakeup_at(&self, now: Instant) -> Instant {
        // Wakes at least every heartbeat tick, so an idle router still proves it is alive.
        let mut t = self.next_periodic_refresh.min(now + HEARTBEAT_TICK);
        let mut consider = |x: Option<Instant>| {
            if let Some(x) = x {
                t = t.min(x);
            }
        };
        consider(self.next_batch_expiry);
        consider(self.delayed.iter().map(|(at, _)| *at).min());
        consider(self.full_fetch_at);
        consider(self.seq.next_due());
        consider(self.id_retry_at);
        for &i in &self.lookups {
            if let Some(l) = &self.topics[i].lookup {
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

    // ----- timers -----

    #[cfg(test)]
    fn on_timers(&mut self) {
        self.on_timers_at(Instant::now());
    }

    fn on_timers_at(&mut self, now: Instant) {
        if now >= self.next_periodic_refresh {
            self.next_periodic_refresh =
                now + jittered(self.cfg.delivery.metadata_refresh_interval, &mut self.rng);
            self.want_full_fetch(now);
        }
        if self.next_batch_expiry.is_some_and(|t| now >= t) {
            // Input already queued joins the open batches first, as Dory routed "all
            // currently queued" before completing batches by time: when the router is
            // behind, every message is late, and sending each input batch's share alone
            // would make batches small just when they should be large (see
            // route::batcher).
            if self.input_waiting && self.expiry_deferred < EXPIRY_DEFER_MAX {
                self.expiry_deferred += 1;
            } else {
                self.expiry_deferred = 0;
                self.expire_batches(now);
            }
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
        self.prune_lookups();
        let expired: Vec<usize> = self
            .lookups
            .iter()
            .copied()
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
        while let Some((_, key)) = self.expiries.pop_due(now) {
            let Some(o) = self.open_batch_if_any(key) else {
                continue;
            };
            // Sent since, or refilled with a later deadline (queued on its own): skip.
            if o.deadline().is_some_and(|d| d <= now) {
                let msgs = o.take();
                self.emit(key, msgs);
            }
        }
        let due: Vec<i32> = self
            .combined
            .iter()
            .filter(|(_, b)| b.deadline().is_some_and(|d| now >= d))
            .map(|(k, _)| *k)
            .collect();
        for broker in due {
            let msgs = self.combined.get_mut(&broker).map(OpenBatch::take);
            if let Some(msgs) = msgs.filter(|m| !m.is_empty()) {
                self.emit_combined(broker, msgs);
            }
        }
        self.combined.retain(|_, b| !b.is_empty());
        self.set_next_batch_expiry();
    }

    /// The earliest deadline of an open batch (the per-topic ones from the queue).
    fn set_next_batch_expiry(&mut self) {
        let per_topic = self.expiries.next();
        let combined = self.combined.values().filter_map(OpenBatch::deadline);
        self.next_batch_expiry = per_topic.into_iter().chain(combined).min();
    }

    /// The open batch of `key`, created empty if there is none.
    fn open_batch(&mut self, key: BatchKey) -> &mut OpenBatch {
        match key {
            (t, None) => &mut self.slot(t).open,
            (t, Some(p)) => self.keyed.entry((t, p)).or_default(),
        }
    }

    /// The open batch of `key`, if one was ever made.
    fn open_batch_if_any(&mut self, key: BatchKey) -> Option<&mut OpenBatch> {
        match key {
            (t, None) => self.topics.get_mut(t as usize).map(|s| &mut s.open),
            (t, Some(p)) => self.keyed.get_mut(&(t, p)),
        }
    }

    /// The keys of every non-empty open per-topic batch.
    fn open_batch_keys(&self) -> Vec<BatchKey> {
        let unkeyed = self
            .topics
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.open.is_empty());
        let unkeyed = unkeyed.filter_map(|(i, _)| Some((TopicId::try_from(i).ok()?, None)));
        let keyed = self.keyed.iter().filter(|(_, o)| !o.is_empty());
        unkeyed
            .chain(keyed.map(|(&(t, p), _)| (t, Some(p))))
            .collect()
    }

    /// A per-topic batch of batch time `time` got deadline `at`.
    fn queue_expiry(&mut self, time: Duration, at: Instant, key: BatchKey) {
        self.expiries.push(time, at, key);
        self.next_batch_expiry = Some(self.next_batch_expiry.map_or(at, |x| x.min(at)));
    }

    /// Drops the slots that no longer hold a lookup from `lookups`.
    fn prune_lookups(&mut self) {
        let topics = &mut self.topics;
        self.lookups.retain(|&i| {
            let keep = topics[i].lookup.is_some();
            topics[i].listed = keep;
            keep
        });
    }

    // ----- discards -----

    /// Discards a batch that is in the SendWait state.
    fn discard_batch(&mut self, b: Batch, reason: DiscardReason) {
        // In doubt (out on a lost connection, or answered after the append): discarded,
        // yet perhaps stored, so counted as possibly delivered too.
        if b.seq.is_some_and(|s| s.uncertain) {
            crate::report::discards::possible_duplicates(self.metrics, &b.msgs);
        } else if b.msgs.iter().any(|m| m.maybe_sent) {
            let (doubt, rest): (Vec<Msg>, Vec<Msg>) =
                b.msgs.into_iter().partition(|m| m.maybe_sent);
            crate::report::discards::possible_duplicates(self.metrics, &doubt);
            self.discard_staged(doubt, reason, QueueState::SendWait);
            self.discard_staged(rest, reason, QueueState::SendWait);
            return;
        }
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
