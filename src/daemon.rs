//! The supervisor: builds the pool, metrics and channels, starts every role (status,
//! inputs, then router with its metadata fetcher and dispatchers), waits for a signal or
//! a fatal error, and stops the roles upstream first so nothing disappears uncounted.
//! While it waits, it tells systemd about readiness, status and the role threads'
//! liveness ([`crate::notify`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{after, bounded, select, Receiver};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::config::Config;
use crate::input::datagram::DatagramInput;
use crate::input::stream::StreamInput;
use crate::input::{InputCtx, InputError};
use crate::notify::Agent;
use crate::pipeline::{
    Control, StatusRequest, INPUT_BATCH_MAX, INPUT_CHANNEL_CAP, META_CHANNEL_CAP,
    OUTCOME_CHANNEL_CAP, SPARE_BATCHES_CAP, STATUS_CHANNEL_CAP,
};
use crate::pool::{Pool, PoolError};
use crate::report::commit_points::{StateFile, StateWriter};
use crate::report::metrics::{Counter, Health, Metrics, MetricsConfig};
use crate::report::status::StatusControl;
use crate::route::{Router, RouterChannels, RouterEvents, SharedRouter};
use crate::spool::Spool;

/// Start-up failures; each ends the process with exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot allocate the message pool (input.msg_buffer_max = {bytes}): {source}")]
    Pool { bytes: usize, source: PoolError },
    #[error("cannot serve status on {addr} (status.addr; is another dory running?): {source}")]
    Status {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("cannot write the commit points state file {path} (commit_points.path): {source}")]
    CommitPointsFile {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Spool(#[from] crate::spool::SpoolError),
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("the router stopped unexpectedly")]
    RouterDied,
}

/// The running inputs, stopped together.
#[derive(Default)]
struct Inputs {
    dgram: Option<DatagramInput>,
    stream: Option<StreamInput>,
    tcp: Option<StreamInput>,
}

impl Inputs {
    fn start(cfg: &Config, ctx: &InputCtx) -> Result<Inputs, InputError> {
        let mut inputs = Inputs::default();
        let started = (|| {
            if let Some(d) = &cfg.input.dgram {
                inputs.dgram = Some(DatagramInput::start(
                    d,
                    cfg.input.max_datagram_msg_size,
                    cfg.input.busy_poll,
                    cfg.input.avoid_sender_cpu,
                    ctx.clone(),
                )?);
            }
            if let Some(s) = &cfg.input.stream {
                inputs.stream = Some(StreamInput::start_unix(
                    s,
                    cfg.input.max_stream_msg_size,
                    ctx.clone(),
                )?);
            }
            if let Some(p) = cfg.input.tcp_port {
                inputs.tcp = Some(StreamInput::start_tcp(
                    p,
                    cfg.input.max_stream_msg_size,
                    ctx.clone(),
                )?);
            }
            Ok(())
        })();
        match started {
            Ok(()) => Ok(inputs),
            Err(e) => {
                ctx.stop.store(true, Ordering::SeqCst);
                inputs.join();
                Err(e)
            }
        }
    }

    /// Joins every input thread (the stop flag is set); the socket files are removed.
    fn join(self) {
        if let Some(t) = self.tcp {
            t.join();
        }
        if let Some(s) = self.stream {
            s.join();
        }
        if let Some(d) = self.dgram {
            d.join();
        }
    }
}

/// Runs the daemon until SIGTERM or SIGINT, then shuts down within
/// `delivery.shutdown_max_delay`.
pub fn run(cfg: Config) -> Result<(), DaemonError> {
    let cfg = Arc::new(cfg);
    let pool = Pool::new_static(cfg.msg_buffer_max).map_err(|source| DaemonError::Pool {
        bytes: cfg.msg_buffer_max,
        source,
    })?;
    let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new(MetricsConfig {
        discard_report_interval: cfg.status.discard_report_interval,
        bad_msg_prefix_size: cfg.status.bad_msg_prefix_size,
        max_topics: cfg.input.max_topics,
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit_points: cfg.commit_points.enable,
        per_topic_metrics: cfg.status.per_topic_metrics,
    })));
    metrics.attach_pool(pool);
    metrics.attach_msg_debug(Arc::new(crate::report::msg_debug::MsgDebug::new(
        cfg.msg_debug.clone(),
    )));
    let discard_log = start_discard_log(&cfg, metrics);

    let (to_router, from_inputs) = bounded(INPUT_CHANNEL_CAP);
    let (spare_batches_tx, spare_batches) = bounded(SPARE_BATCHES_CAP);
    let (to_control, from_control) = bounded::<Control>(4);
    let (to_status_req, from_status) = bounded::<StatusRequest>(STATUS_CHANNEL_CAP);
    let (to_meta, from_router_meta) = bounded(META_CHANNEL_CAP);
    let (to_router_meta, from_meta) = bounded(META_CHANNEL_CAP);
    let (to_router_outcome, from_dispatchers) = bounded(OUTCOME_CHANNEL_CAP);

    // Status first: binding its port is also the single-instance guard.
    let status =
        crate::report::status::spawn(cfg.status.addr, metrics, StatusControl::new(to_status_req))
            .map_err(|source| DaemonError::Status {
            addr: cfg.status.addr,
            source,
        })?;
    // After the single-instance guard: a second dory must not touch the first one's file.
    let commit_points = match start_commit_points_file(&cfg, metrics) {
        Ok(w) => w,
        Err(e) => {
            status.stop();
            return Err(e);
        }
    };

    // Signals are watched from before the inputs open, so an early SIGTERM is not lost.
    let mut signals = Signals::new([SIGTERM, SIGINT]).map_err(DaemonError::Signals)?;
    let signal_handle = signals.handle();
    let (sig_tx, sig_rx) = bounded::<i32>(4);
    let sig_thread = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for s in signals.forever() {
                if sig_tx.send(s).is_err() {
                    break;
                }
            }
        })
        .map_err(DaemonError::Thread)?;

    // The spool, after the single-instance guard (it also locks its directory).
    let spool = match cfg
        .spool
        .as_ref()
        .map(|c| Spool::open(c, metrics))
        .transpose()
    {
        Ok(s) => s,
        Err(e) => {
            stop_early(signal_handle, sig_thread, commit_points, status);
            return Err(e.into());
        }
    };

    let sec = &cfg.kafka.security_summary;
    log::info!(
        "broker connections: {}{}",
        match (sec.tls, sec.mutual_tls) {
            (false, _) => "plaintext",
            (true, false) => "TLS",
            (true, true) => "TLS with a client certificate",
        },
        cfg.kafka
            .security
            .sasl
            .as_ref()
            .map_or(String::new(), |c| format!(
                ", SASL {} as user {:?}",
                c.mechanism.name(),
                c.username
            )),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let mut ctx = InputCtx {
        router: None,
        metrics,
        pool,
        to_router,
        spare_batches,
        stop: stop.clone(),
        topic_cache: Default::default(),
        groups: Default::default(),
        batch_clock: Default::default(),
        counts: Default::default(),
        spool: spool.as_ref().map(|s| s.0),
        spool_batch: Default::default(),
        leases: Default::default(),
    };

    // The router before the inputs: spool recovery hands it messages before they open.
    let fetcher = crate::route::fetcher::spawn(&cfg, metrics, from_router_meta, to_router_meta)
        .map_err(DaemonError::Thread)?;
    let (router_done_tx, router_done) = bounded::<()>(1);
    let shared_router = Arc::new(SharedRouter::new(
        Router::new(
            cfg.clone(),
            metrics,
            RouterChannels {
                spare_batches: spare_batches_tx,
                to_meta,
                to_router: to_router_outcome,
                from_dispatchers,
            },
        ),
        cfg.input.inline_routing,
    ));
    ctx.router = Some(shared_router.clone());
    if !cfg.input.inline_routing {
        log::info!("routing: every input batch goes through the router thread (input.inline_routing = false)");
    }
    let batch_scheduling = cfg.delivery.batch_scheduling;
    if !batch_scheduling {
        log::info!("scheduling: router and dispatchers at the default policy (delivery.batch_scheduling = false)");
    }
    let router = std::thread::Builder::new()
        .name("router".into())
        .spawn(move || {
            // Tells the supervisor when the router ends, even by panic.
            struct Done(crossbeam_channel::Sender<()>);
            impl Drop for Done {
                fn drop(&mut self) {
                    let _ = self.0.try_send(());
                }
            }
            let _done = Done(router_done_tx);
            if batch_scheduling {
                crate::pipeline::batch_scheduling("router");
            }
            shared_router.run(RouterEvents {
                from_inputs,
                from_control,
                from_status,
                from_meta,
            });
        })
        .map_err(DaemonError::Thread)?;

    // Every spooled message the last run left is replayed before any new input.
    let spool_sync = match spool {
        Some((spool, recovery)) => {
            let mut out = Vec::with_capacity(INPUT_BATCH_MAX);
            let done = recovery.replay(spool, |rec, hold| {
                ctx.replay(rec, hold, &mut out);
                if out.len() >= INPUT_BATCH_MAX {
                    ctx.flush(&mut out);
                }
            });
            ctx.flush(&mut out);
            if done.segments > 0 {
                log::info!(
                    "spool recovery: {} message(s) replayed from {} segment(s), {} corrupt \
                     byte(s) skipped",
                    done.records,
                    done.segments,
                    done.corrupt_bytes
                );
            }
            // A sync blocks on the disk: the watchdog allows the thread a long quiet time.
            let heartbeat = metrics
                .liveness()
                .register("spool-sync", crate::spool::SYNC_QUIET_MAX);
            Some(spool.spawn_sync(move || heartbeat.beat())?)
        }
        None => None,
    };

    let inputs = match Inputs::start(&cfg, &ctx) {
        Ok(i) => i,
        Err(e) => {
            // Nothing new came in: the router delivers what recovery gave it, then stops.
            let _ = to_control.send(Control::Shutdown {
                deadline: Instant::now() + cfg.delivery.shutdown_max_delay,
            });
            drop(ctx);
            let _ = router.join();
            if let Some(s) = spool_sync {
                s.stop();
            }
            stop_early(signal_handle, sig_thread, commit_points, status);
            return Err(e.into());
        }
    };
    // The inputs hold the only senders now: when they end, the router sees the channel
    // close.
    drop(ctx);
    metrics.set_health(Health::InputsOpen);
    log::info!(
        "inputs open:{}{}{}",
        cfg.input
            .dgram
            .as_ref()
            .map_or(String::new(), |d| format!(" datagram {}", d.path.display())),
        cfg.input
            .stream
            .as_ref()
            .map_or(String::new(), |s| format!(" stream {}", s.path.display())),
        cfg.input
            .tcp_port
            .map_or(String::new(), |p| format!(" tcp 127.0.0.1:{p}")),
    );

    let mut agent = Agent::from_env(Instant::now());
    let died = wait_for_stop(&sig_rx, &router_done, metrics, &mut agent);
    agent.stopping(metrics);

    // Stop upstream first: inputs, then the router drains and stops the dispatchers.
    let deadline = Instant::now() + cfg.delivery.shutdown_max_delay;
    let _ = to_control.send(Control::Shutdown { deadline });
    stop.store(true, Ordering::SeqCst);
    inputs.join();
    log::info!(
        "inputs closed; delivering what is held (up to {:?})",
        cfg.delivery.shutdown_max_delay
    );
    // A second signal meanwhile is only logged.
    let watcher = {
        let sig_rx = sig_rx.clone();
        std::thread::Builder::new()
            .name("signals-late".into())
            .spawn(move || {
                while let Ok(s) = sig_rx.recv() {
                    log::warn!(
                        "duplicate shutdown request (signal {s}) ignored; shutdown in progress"
                    );
                }
            })
            .ok()
    };
    if router.join().is_err() {
        log::error!("router thread panicked");
    }
    // Every message has ended: the last sync, and the resolved segments freed.
    if let Some(s) = spool_sync {
        s.stop();
    }
    // The fetcher ends when the router drops its channel; it holds no messages, so a
    // fetch stuck on a dead broker is not waited for.
    drop(fetcher);
    signal_handle.close();
    let _ = sig_thread.join();
    if let Some(w) = watcher {
        let _ = w.join();
    }
    let left = metrics.total_in_flight();
    if let Some(h) = discard_log {
        // The log thread drains its queue; the metrics keep a sender, so it is not
        // joined, only given a moment to write the last lines.
        if let Some(log) = metrics.discard_log() {
            let until = Instant::now() + std::time::Duration::from_secs(2);
            while log.pending() > 0 && Instant::now() < until && !h.is_finished() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
    // Every message has ended by now: the file gets the final commit points.
    if let Some(w) = commit_points {
        w.stop();
    }
    status.stop();
    if died {
        return Err(DaemonError::RouterDied);
    }
    let topics = metrics.snapshot_topics();
    let received: u64 = topics.iter().map(|t| t.received).sum();
    let delivered: u64 = topics.iter().map(|t| t.delivered).sum();
    let by_reason: Vec<String> = crate::report::metrics::DiscardReason::ALL
        .iter()
        .filter_map(|r| {
            let n: u64 = topics.iter().map(|t| t.discarded(*r)).sum();
            (n > 0).then(|| format!("{}={n}", r.as_str()))
        })
        .collect();
    log::info!(
        "stopped: received {received}, delivered {delivered}, discarded [{}], in flight {left}",
        by_reason.join(" ")
    );
    Ok(())
}

/// Start-up failed after the signal thread started: stops what was started before it
/// (the status server, the commit-points writer and the signal thread).
fn stop_early(
    signal_handle: signal_hook::iterator::Handle,
    sig_thread: std::thread::JoinHandle<()>,
    commit_points: Option<StateWriter>,
    status: crate::report::status::StatusHandle,
) {
    signal_handle.close();
    let _ = sig_thread.join();
    if let Some(w) = commit_points {
        w.stop();
    }
    status.stop();
}

/// Starts the commit points state file writer when `commit_points.path` is set. The file
/// must be writable now: a bad path is a start-up error.
fn start_commit_points_file(
    cfg: &Config,
    metrics: &'static Metrics,
) -> Result<Option<StateWriter>, DaemonError> {
    let Some(path) = &cfg.commit_points.file else {
        return Ok(None);
    };
    let file_error = |source| DaemonError::CommitPointsFile {
        path: path.clone(),
        source,
    };
    let file = StateFile::create(path, env!("CARGO_PKG_VERSION")).map_err(file_error)?;
    let writer = StateWriter::spawn(
        file,
        cfg.commit_points.write_interval,
        move || metrics.commit_points(Instant::now()).unwrap_or_default(),
        metrics.commit_points_file_errors(),
    )
    .map_err(DaemonError::Thread)?;
    Ok(Some(writer))
}

/// Opens the discard log and starts its thread; a failure only disables the log, as in
/// Dory (discards are still counted and reported over HTTP).
fn start_discard_log(
    cfg: &Config,
    metrics: &'static Metrics,
) -> Option<std::thread::JoinHandle<()>> {
    let d = cfg.discard_log.as_ref()?;
    let log = match crate::report::discard_log::DiscardLog::open(
        &d.path,
        d.max_file_size,
        d.max_archive_size,
        d.max_msg_prefix,
    ) {
        Ok(l) => l,
        Err(e) => {
            log::warn!("discard log disabled: {e}");
            return None;
        }
    };
    match crate::report::discard_log::spawn(log, 65_536) {
        Ok((sender, handle)) => {
            metrics.attach_discard_log(sender);
            Some(handle)
        }
        Err(e) => {
            log::warn!("discard log disabled: cannot start its thread: {e}");
            None
        }
    }
}

/// Blocks until SIGTERM/SIGINT (false) or the router's unexpected end (true); meanwhile
/// tells systemd about readiness, status and liveness when the agent says it is due.
fn wait_for_stop(
    sig_rx: &Receiver<i32>,
    router_done: &Receiver<()>,
    metrics: &Metrics,
    agent: &mut Agent,
) -> bool {
    loop {
        let now = Instant::now();
        let timer = after(agent.next_wakeup(now).saturating_duration_since(now));
        select! {
            recv(sig_rx) -> s => {
                metrics.inc(Counter::GotShutdownRequest);
                log::info!("signal {} received: shutting down", s.unwrap_or(0));
                return false;
            }
            recv(router_done) -> _ => {
                log::error!("router stopped unexpectedly; shutting down");
                return true;
            }
            recv(timer) -> _ => agent.tick(metrics, Instant::now()),
        }
    }
}
