//! The router's state behind a lock, shared by the router thread and the inputs.
//!
//! The router thread waits on its channels (inputs, dispatchers' outcomes, metadata,
//! control, status) and on its timers, then takes the lock to handle what came. An input
//! with a batch ready first tries the lock itself ([`SharedRouter::try_route`]): when the
//! router is idle and has nothing from the inputs still queued, the input routes the batch
//! on its own thread, so a steady flood wakes nobody per batch. On a small machine the
//! wake-up (a futex, a context switch, often an interrupt to the other CPU) cost more than
//! the routing itself (doc/performance.md, round four). Otherwise, the lock being held by
//! the router or earlier batches still queued, the batch goes through the channel as
//! before.
//!
//! Order: a batch is routed inline only when every batch sent through the channel before
//! it has been routed (`queued` against the router's own count, both read under the
//! lock), so one input's messages keep their order whichever path each batch took.
//!
//! Timers: the router thread sleeps until its next deadline, computed under the lock. A
//! batch routed inline can open a batch with an earlier deadline; the input then nudges
//! the router thread so it sleeps again with the new one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crossbeam_channel::{bounded, select_biased, Receiver, Sender};

use super::{Event, Router};
use crate::pipeline::{Control, FetchResponse, Msg, Outcome, StatusRequest};
use crate::report::liveness::QUIET_MAX;

/// The router's state and what the inputs need to route on their own thread.
pub struct SharedRouter {
    state: Mutex<Router>,
    /// Input batches sent through the router's channel so far (by any input).
    queued: AtomicU64,
    /// Wakes the router thread when a batch routed inline moved its next deadline earlier.
    nudge_tx: Sender<()>,
    nudge_rx: Receiver<()>,
    /// Whether inputs may route inline (off: every batch goes through the channel).
    inline: bool,
}

/// The channels only the router thread waits on (outside the lock), handed to
/// [`SharedRouter::run`].
pub struct RouterEvents {
    pub from_inputs: Receiver<Vec<Msg>>,
    pub from_control: Receiver<Control>,
    pub from_status: Receiver<StatusRequest>,
    pub from_meta: Receiver<FetchResponse>,
}

/// Everything the router thread waits on.
struct Waits {
    ev: RouterEvents,
    from_dispatchers: Receiver<Outcome>,
    nudge: Receiver<()>,
}

impl SharedRouter {
    /// `inline`: whether inputs may route their batches on their own thread.
    pub fn new(router: Router, inline: bool) -> SharedRouter {
        let (nudge_tx, nudge_rx) = bounded(1);
        SharedRouter {
            state: Mutex::new(router),
            queued: AtomicU64::new(0),
            nudge_tx,
            nudge_rx,
            inline,
        }
    }

    /// The router thread's lock: a panic while routing (on whichever thread) ends the
    /// router, as it did when only the router thread ran that code.
    fn lock(&self) -> MutexGuard<'_, Router> {
        self.state
            .lock()
            .expect("router state poisoned by a panic while routing")
    }

    /// Runs the router thread until shutdown completes: inputs closed and everything
    /// delivered or discarded.
    pub fn run(&self, events: RouterEvents) {
        let (heartbeat, mut waits) = {
            let r = self.lock();
            let heartbeat = r.metrics.liveness().register("router", QUIET_MAX);
            let waits = Waits {
                ev: events,
                from_dispatchers: r.ch.from_dispatchers.clone(),
                nudge: self.nudge_rx.clone(),
            };
            (heartbeat, waits)
        };
        loop {
            heartbeat.beat();
            let (timeout, inputs_open, shutdown_delay) = {
                let mut r = self.lock();
                r.start_due_fetches();
                r.request_producer_id();
                let now = Instant::now();
                let t = r.next_wakeup_at(now);
                r.asleep_until = Some(t);
                (
                    t.saturating_duration_since(now),
                    r.inputs_open,
                    r.cfg.delivery.shutdown_max_delay,
                )
            };
            let ev = waits.next(timeout, inputs_open, shutdown_delay);
            let mut r = self.lock();
            r.asleep_until = None;
            r.input_waiting = !waits.ev.from_inputs.is_empty();
            if r.handle(ev) {
                break;
            }
        }
        self.lock().stop_dispatchers();
    }

    /// Routes `out` on the calling thread if the router is idle and nothing sent through
    /// the channel is still waiting to be routed; `out` is then empty (its capacity kept)
    /// and the call returns true. Otherwise `out` is untouched and the caller counts it in
    /// the `new` queue state and sends it through the channel, calling
    /// [`SharedRouter::queue`] first. (Routed here, the messages never wait in `new`, so
    /// they are not counted there.)
    pub fn try_route(&self, out: &mut Vec<Msg>) -> bool {
        if !self.inline {
            return false;
        }
        let Ok(mut r) = self.state.try_lock() else {
            return false;
        };
        if r.channel_batches_done != self.queued.load(Ordering::Acquire) {
            return false;
        }
        r.route_batch(out, false, Instant::now());
        r.pump_sequence();
        if r.asleep_until.is_some_and(|t| r.next_wakeup() < t) {
            // Full: a nudge is pending already.
            let _ = self.nudge_tx.try_send(());
        }
        true
    }

    /// Counts a batch about to be sent through the router's channel.
    pub fn queue(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }
}

impl Waits {
    /// The next event, waiting `timeout` at most.
    fn next(
        &mut self,
        timeout: std::time::Duration,
        inputs_open: bool,
        shutdown_delay: std::time::Duration,
    ) -> Event {
        let closed = crossbeam_channel::never();
        let ev = &mut self.ev;
        let inputs = if inputs_open {
            &ev.from_inputs
        } else {
            &closed
        };
        select_biased! {
            recv(ev.from_control) -> c => match c {
                Ok(c) => Event::Control(c),
                // The supervisor is gone: treat as a shutdown with the configured delay.
                Err(_) => {
                    ev.from_control = crossbeam_channel::never();
                    Event::Control(Control::Shutdown { deadline: Instant::now() + shutdown_delay })
                }
            },
            recv(self.from_dispatchers) -> o => match o {
                Ok(o) => Event::Outcome(o),
                Err(_) => Event::Tick,
            },
            recv(ev.from_meta) -> m => match m {
                Ok(FetchResponse::Metadata(m)) => Event::Meta(m),
                Ok(FetchResponse::ProducerId(r)) => Event::ProducerId(r),
                Err(_) => Event::Tick,
            },
            recv(inputs) -> i => match i {
                Ok(msgs) => Event::Input(msgs),
                Err(_) => Event::InputsClosed,
            },
            recv(ev.from_status) -> s => match s {
                Ok(s) => Event::Status(s),
                Err(_) => {
                    ev.from_status = crossbeam_channel::never();
                    Event::Tick
                }
            },
            recv(self.nudge) -> _ => Event::Tick,
            default(timeout) => Event::Tick,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Overrides, RawConfig};
    use crate::pipeline::{FetchRequest, Outcome};
    use crate::pool::Pool;
    use crate::report::metrics::{Metrics, MetricsConfig};
    use crate::route::RouterChannels;
    use std::sync::Arc;

    /// A router with no broker reachable (none is contacted: nothing here starts a fetch),
    /// and both ends of the inputs' channel (no router thread runs: tests take from it).
    fn shared(inline: bool) -> (SharedRouter, Channel, &'static Pool) {
        let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new(MetricsConfig::default())));
        // Topics 1 and 2 of the tests.
        assert_eq!(metrics.topic_id(b"one"), Some(1));
        assert_eq!(metrics.topic_id(b"two"), Some(2));
        let ov = Overrides {
            brokers: vec!["127.0.0.1:9".into()],
            tcp_port: Some(9),
            ..Overrides::default()
        };
        let cfg = Arc::new(Config::from_parts(RawConfig::default(), false, &ov).expect("config"));
        let inputs = bounded(4);
        let (spare_batches, _spare_rx) = bounded(4);
        let (to_meta, _meta_rx) = bounded::<FetchRequest>(4);
        let (to_router, from_dispatchers) = bounded::<Outcome>(1);
        let router = Router::new(
            cfg,
            metrics,
            RouterChannels {
                spare_batches,
                to_meta,
                to_router,
                from_dispatchers,
            },
        );
        let pool = Pool::new_static(1 << 20).expect("pool");
        (SharedRouter::new(router, inline), inputs, pool)
    }

    /// The inputs' channel to the router.
    type Channel = (Sender<Vec<Msg>>, Receiver<Vec<Msg>>);

    fn batch(pool: &'static Pool, topic: u32, n: usize) -> Vec<Msg> {
        (0..n)
            .map(|i| Msg::for_test(pool, topic, i as i64, 10, Instant::now()))
            .collect()
    }

    /// Messages the router holds for topic `t` while it is looked up.
    fn held(s: &SharedRouter, t: u32) -> usize {
        let r = s.lock();
        r.topics
            .get(t as usize)
            .and_then(|slot| slot.lookup.as_ref())
            .map_or(0, |l| l.msgs.len())
    }

    #[test]
    fn an_idle_router_routes_on_the_callers_thread() {
        let (s, _inputs, pool) = shared(true);
        let mut out = batch(pool, 1, 3);
        assert!(s.try_route(&mut out));
        assert!(out.is_empty(), "the batch was taken");
        assert_eq!(held(&s, 1), 3);
    }

    #[test]
    fn a_batch_still_queued_keeps_later_ones_off_the_inline_path() {
        let (s, (to_router, from_inputs), pool) = shared(true);
        // An earlier batch went through the channel and is not routed yet.
        s.queue();
        to_router.send(batch(pool, 1, 2)).expect("queued");
        let mut out = batch(pool, 1, 1);
        assert!(!s.try_route(&mut out), "would overtake the queued batch");
        assert_eq!(out.len(), 1, "left to the caller");
        // The router thread takes the queued batch; then the inline path opens again.
        let queued = from_inputs.try_recv().expect("the queued batch");
        assert!(!s.lock().handle(Event::Input(queued)));
        assert!(s.try_route(&mut out));
        assert_eq!(held(&s, 1), 3);
        let r = s.lock();
        let order: Vec<i64> = r.topics[1]
            .lookup
            .as_ref()
            .expect("held")
            .msgs
            .iter()
            .map(|m| m.timestamp)
            .collect();
        assert_eq!(
            order,
            [0, 1, 0],
            "the queued batch first, then the inline one"
        );
    }

    #[test]
    fn a_busy_or_disabled_router_leaves_the_batch_to_the_channel() {
        let (s, _inputs, pool) = shared(true);
        let mut out = batch(pool, 1, 2);
        {
            let _busy = s.lock();
            assert!(!s.try_route(&mut out));
        }
        assert_eq!(out.len(), 2);
        let (off, _inputs, pool) = shared(false);
        let mut out = batch(pool, 1, 2);
        assert!(!off.try_route(&mut out));
        assert_eq!(out.len(), 2);
        assert_eq!(held(&off, 1), 0);
    }

    #[test]
    fn batches_whose_time_is_up_wait_while_more_input_is_queued() {
        let (s, _inputs, pool) = shared(true);
        let mut r = s.lock();
        // Topic 1's open batch, its time limit long past (adding never sends it on time).
        let long_ago = Instant::now() - std::time::Duration::from_secs(1);
        let limits = crate::config::BatchLimits {
            time: Some(std::time::Duration::from_millis(5)),
            messages: None,
            bytes: None,
        };
        r.batch_into((1, None), Msg::for_test(pool, 1, 0, 10, long_ago), &limits);
        let is_open = |r: &Router| r.topics[1].open.deadline().is_some();
        // More input waiting: the batch stays open, EXPIRY_DEFER_MAX times in a row.
        r.input_waiting = true;
        for _ in 0..super::super::EXPIRY_DEFER_MAX {
            r.on_timers();
            assert!(is_open(&r), "sent while input was still queued");
        }
        // Then it goes, input waiting or not (here: discarded, the router has no metadata).
        r.on_timers();
        assert!(!is_open(&r), "deferred past the limit");
        // Nothing queued: a batch whose time is up goes at once.
        r.batch_into((1, None), Msg::for_test(pool, 1, 1, 10, long_ago), &limits);
        assert!(is_open(&r));
        r.input_waiting = false;
        r.on_timers();
        assert!(!is_open(&r));
    }

    #[test]
    fn a_sleeping_router_is_nudged_only_for_an_earlier_deadline() {
        let (s, _inputs, pool) = shared(true);
        {
            // As if metadata had come and no fetch were due: the router sleeps until its
            // heartbeat tick.
            let mut r = s.lock();
            r.have_metadata = true;
            r.full_fetch_at = None;
            let t = r.next_wakeup();
            r.asleep_until = Some(t);
        }
        // A message for a topic the metadata lacks: a lookup is due now.
        let mut out = batch(pool, 1, 1);
        assert!(s.try_route(&mut out));
        assert!(
            s.nudge_rx.try_recv().is_ok(),
            "the router must wake for the lookup"
        );
        // Asleep again until that deadline: another message for the same topic adds none.
        {
            let mut r = s.lock();
            let t = r.next_wakeup();
            r.asleep_until = Some(t);
        }
        let mut out = batch(pool, 1, 1);
        assert!(s.try_route(&mut out));
        assert!(
            s.nudge_rx.try_recv().is_err(),
            "no earlier deadline, no nudge"
        );
        // Awake (handling an event): never nudged.
        s.lock().asleep_until = None;
        let mut out = batch(pool, 2, 1);
        assert!(s.try_route(&mut out));
        assert!(s.nudge_rx.try_recv().is_err());
        assert_eq!((held(&s, 1), held(&s, 2)), (2, 1));
    }
}
