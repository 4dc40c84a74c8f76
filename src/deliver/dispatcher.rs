//! One dispatcher per broker: owns the connection, packs batches into Produce requests,
//! pipelines them, and settles each partition's outcome.
//!
//! A dispatcher is two threads sharing one connection, because blocking I/O cannot wait
//! on a socket and a channel at once: the *sender* (`dispatcher-<id>`) connects, takes
//! batches from the router, encodes and writes requests; the *receiver*
//! (`dispatcher-<id>-acks`, one per connection) reads responses in order. The sender hands
//! each written request to the receiver through a bounded channel, which bounds the
//! requests in flight. Delivered and discarded messages are counted here; whatever must be
//! sent again goes back to the router with the reason.
//!
//! This file holds what both threads share: the settings, the handle the router keeps,
//! the request in flight, and handing messages back. The threads are in
//! `dispatcher/sender.rs` and `dispatcher/acks.rs`.

mod acks;
mod sender;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Sender, TrySendError};

use crate::config::policy::Policies;
use crate::config::Config;
use crate::fasthash::FastMap;
use crate::kafka::connection::{Connection, Security};
use crate::pipeline::{Batch, Msg, Outcome, ReturnReason, Seq, TopicId, DISPATCH_CHANNEL_CAP};
use crate::report::metrics::{Metrics, QueueState};
use crate::report::msg_debug::DebugFile;

/// The dispatcher's slice of the configuration.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub client_id: Option<String>,
    pub acks: i16,
    pub replication_timeout_ms: i32,
    pub connect_timeout: Duration,
    pub socket_timeout: Duration,
    pub max_in_flight: usize,
    pub request_data_limit: usize,
    pub message_max_bytes: usize,
    pub max_failed_attempts: u32,
    pub reconnect_backoff: Duration,
    pub reconnect_backoff_max: Duration,
    pub policies: Policies,
    /// TLS and SASL for the connection.
    pub security: Security,
    /// What to take a broker for that closes the connection on ApiVersions.
    pub broker_version: Option<crate::kafka::api_versions::BrokerVersion>,
    /// Run the thread `SCHED_BATCH` (`delivery.batch_scheduling`).
    pub batch_scheduling: bool,
}

impl DispatcherConfig {
    /// How long a dispatcher thread may go without a heartbeat: a connect, a handshake and
    /// a request's write and read may each block for their timeout.
    pub fn io_quiet_max(&self) -> Duration {
        self.connect_timeout + self.socket_timeout * 4 + crate::report::liveness::QUIET_MAX
    }

    pub fn from_config(c: &Config) -> DispatcherConfig {
        DispatcherConfig {
            client_id: c.kafka.client_id.clone(),
            acks: c.kafka.acks,
            replication_timeout_ms: i32::try_from(c.kafka.replication_timeout.as_millis())
                .unwrap_or(i32::MAX),
            connect_timeout: c.kafka.connect_timeout,
            socket_timeout: c.kafka.socket_timeout,
            max_in_flight: c.kafka.max_in_flight_requests,
            request_data_limit: c.batching.produce_request_data_limit,
            message_max_bytes: c.batching.message_max_bytes,
            max_failed_attempts: c.delivery.max_failed_delivery_attempts,
            reconnect_backoff: c.delivery.retry_backoff,
            reconnect_backoff_max: c.delivery.retry_backoff_max,
            policies: c.policies.clone(),
            security: c.kafka.security.clone(),
            broker_version: c.kafka.broker_version,
            batch_scheduling: c.delivery.batch_scheduling,
        }
    }
}

/// What the router and the dispatcher threads share: the abort switch and the live
/// connection, so an abort can cut a blocked read or write at once.
#[derive(Default)]
struct Shared {
    abort: AtomicBool,
    conn: Mutex<Option<Connection>>,
}

impl Shared {
    fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        if let Ok(guard) = self.conn.lock() {
            if let Some(c) = guard.as_ref() {
                let _ = c.shutdown();
            }
        }
    }
    fn aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }
    fn set_conn(&self, c: Option<Connection>) {
        if let Ok(mut guard) = self.conn.lock() {
            *guard = c;
        }
    }
}

/// The router's end of a dispatcher.
pub struct DispatcherHandle {
    pub host: String,
    pub port: u16,
    tx: Sender<Batch>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A dispatcher whose queue is closed: it finishes what it holds, then stops.
pub struct ClosingDispatcher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl DispatcherHandle {
    pub fn try_send(&self, b: Batch) -> Result<(), TrySendError<Batch>> {
        self.tx.try_send(b)
    }

    /// Closes the queue; the dispatcher sends what it holds and stops.
    pub fn close(self) -> ClosingDispatcher {
        let DispatcherHandle { shared, thread, .. } = self;
        ClosingDispatcher { shared, thread }
    }

    /// Closes the queue and lets the threads end on their own.
    pub fn detach(self) {
        drop(self.close());
    }
}

impl ClosingDispatcher {
    /// Cuts the connection: whatever is unacknowledged comes back to the router.
    pub fn abort(&self) {
        self.shared.abort();
    }
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("a dispatcher thread panicked");
            }
        }
    }
}

/// Starts the dispatcher for broker `id` at `host:port`.
pub fn spawn(
    id: i32,
    host: String,
    port: u16,
    cfg: Arc<DispatcherConfig>,
    metrics: &'static Metrics,
    to_router: Sender<Outcome>,
) -> DispatcherHandle {
    let (tx, rx) = bounded(DISPATCH_CHANNEL_CAP);
    let shared = Arc::new(Shared::default());
    let quiet_max = cfg.io_quiet_max();
    let batch = cfg.batch_scheduling;
    let sender = sender::Sender_ {
        id,
        host: host.clone(),
        port,
        cfg,
        metrics,
        from_router: rx,
        to_router,
        shared: shared.clone(),
        carry: VecDeque::new(),
        correlation_id: 0,
        buf: Vec::new(),
        scratch: Vec::new(),
        part_index: FastMap::default(),
        zstd_warned: AtomicBool::new(false),
        heartbeat: metrics
            .liveness()
            .register(format!("dispatcher-{id}"), quiet_max),
    };
    let thread = std::thread::Builder::new()
        .name(format!("dispatcher-{id}"))
        .spawn(move || {
            if batch {
                // The acknowledgement reader it starts inherits the policy.
                crate::pipeline::batch_scheduling("dispatcher");
            }
            sender.run()
        })
        .map_err(|e| log::error!("cannot start dispatcher thread for broker {id}: {e}"))
        .ok();
    DispatcherHandle {
        host,
        port,
        tx,
        shared,
        thread,
    }
}

/// Messages for one partition within one request.
struct Part {
    topic: TopicId,
    name: Arc<[u8]>,
    partition: i32,
    msgs: Vec<Msg>,
    kafka_bytes: usize,
    /// The sealed batch's identity (idempotence): the part is that batch alone.
    seq: Option<Seq>,
}

impl Part {
    fn into_batch(self) -> Batch {
        Batch {
            topic: self.topic,
            partition: self.partition,
            msgs: self.msgs,
            seq: self.seq,
        }
    }
}

/// A request written to the broker, waiting for its response.
struct InFlight {
    correlation_id: i32,
    version: i16,
    parts: Vec<Part>,
}

/// Routes a set of batches back to the router (their messages are in the SendWait state).
fn give_back(to_router: &Sender<Outcome>, broker: i32, reason: ReturnReason, batches: Vec<Batch>) {
    if batches.is_empty() {
        return;
    }
    let n = batches.len();
    if to_router
        .send(Outcome::Returned {
            broker,
            reason,
            batches,
        })
        .is_err()
    {
        // The router is gone only at the very end of shutdown, after it stopped waiting
        // for us; the messages are dropped with the process. Log them so the loss shows.
        log::error!("router gone; {n} batch(es) not returned");
    }
}

/// A request whose fate is unknown (written, connection lost before the answer): its
/// messages go back for rerouting, flagged as possible duplicates.
fn fail_in_flight(to_router: &Sender<Outcome>, metrics: &Metrics, broker: i32, entry: InFlight) {
    let batches: Vec<Batch> = entry
        .parts
        .into_iter()
        .map(|mut p| {
            let n = p.msgs.len() as i64;
            metrics.queue_add(p.topic, QueueState::AckWait, -n);
            metrics.queue_add(p.topic, QueueState::SendWait, n);
            for m in &mut p.msgs {
                m.maybe_sent = true;
            }
            p.into_batch()
        })
        .collect();
    give_back(to_router, broker, ReturnReason::ConnectionLost, batches);
}

/// Writes the messages to a message debug file, if debug logging is on for the topic.
fn debug_log(metrics: &Metrics, file: DebugFile, topic: &[u8], msgs: &[Msg]) {
    let Some(d) = metrics.msg_debug().filter(|d| d.active()) else {
        return;
    };
    if !d.enabled_for(topic) {
        return;
    }
    let (mut key, mut value) = (Vec::new(), Vec::new());
    for m in msgs {
        key.clear();
        value.clear();
        m.payload.copy_to(0, m.key_len(), &mut key);
        m.payload.copy_to(m.key_len(), m.value_len(), &mut value);
        d.log(file, m.timestamp, topic, &key, &value);
    }
}
