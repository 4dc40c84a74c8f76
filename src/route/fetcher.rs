//! The metadata fetcher: a helper thread of the router that asks brokers for cluster
//! metadata (and, for the idempotent producer, a producer id), so the router never blocks
//! on the network. Each fetch opens a fresh connection (as Dory does), negotiates versions,
//! and tries known brokers in turn.

use std::collections::HashMap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::config::{BrokerAddr, Config};
use crate::deliver::backoff::Rng;
use crate::deliver::refusal;
use crate::kafka::connection::{ConnError, Connection, Negotiated, Security};
use crate::kafka::control::{self, API_KEY_INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSIONS};
use crate::kafka::errors::error_name;
use crate::kafka::{metadata, negotiate, MetadataResponse, API_KEY_METADATA, METADATA_VERSIONS};
use crate::pipeline::{
    FetchRequest, FetchResponse, IdRequest, MetaRequest, MetaResponse, ProducerIdError,
};
use crate::report::liveness::{Heartbeat, QUIET_MAX, TICK as HEARTBEAT_TICK};
use crate::report::metrics::{Counter, Metrics};

/// Minimum interval between two log lines about the same broker refusing us (TLS, SASL).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// Largest metadata response we accept: enough for very large clusters.
const MAX_METADATA_SIZE: usize = 64 << 20;

pub struct Fetcher {
    bootstrap: Vec<BrokerAddr>,
    /// Brokers from the last successful response, tried first.
    known: Vec<BrokerAddr>,
    client_id: Option<String>,
    connect_timeout: Duration,
    socket_timeout: Duration,
    security: Security,
    broker_version: Option<crate::kafka::api_versions::BrokerVersion>,
    metrics: &'static Metrics,
    /// When each refusing broker (TLS, SASL) was last logged: once per interval each.
    refusals_logged: HashMap<String, Instant>,
    rng: Rng,
    correlation_id: i32,
    heartbeat: Heartbeat,
}

impl Fetcher {
    pub fn new(cfg: &Config, metrics: &'static Metrics) -> Fetcher {
        Fetcher {
            bootstrap: cfg.kafka.brokers.clone(),
            known: Vec::new(),
            client_id: cfg.kafka.client_id.clone(),
            connect_timeout: cfg.kafka.connect_timeout,
            socket_timeout: cfg.kafka.socket_timeout,
            security: cfg.kafka.security.clone(),
            broker_version: cfg.kafka.broker_version,
            metrics,
            refusals_logged: HashMap::new(),
            rng: Rng::from_entropy(),
            correlation_id: 0,
            // Beats between brokers: one try may block for a connect and for the reads
            // and writes of a handshake and two requests.
            heartbeat: metrics.liveness().register(
                "metadata",
                cfg.kafka.connect_timeout + cfg.kafka.socket_timeout * 6 + QUIET_MAX,
            ),
        }
    }

    fn run(mut self, from_router: Receiver<FetchRequest>, to_router: Sender<FetchResponse>) {
        loop {
            self.heartbeat.beat();
            let request = match from_router.recv_timeout(HEARTBEAT_TICK) {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let request = match request {
                FetchRequest::Metadata(r) => r,
                FetchRequest::ProducerId(r) => {
                    let result = self.init_producer_id(r);
                    if to_router.send(FetchResponse::ProducerId(result)).is_err() {
                        return;
                    }
                    continue;
                }
            };
            let result = self.fetch(&request);
            if let Ok(md) = &result {
                if request.topics.is_none() {
                    self.known = md
                        .brokers
                        .iter()
                        .filter_map(|b| {
                            Some(BrokerAddr {
                                host: b.host.clone(),
                                port: u16::try_from(b.port).ok().filter(|p| *p != 0)?,
                            })
                        })
                        .collect();
                }
            }
            if to_router
                .send(FetchResponse::Metadata(MetaResponse { request, result }))
                .is_err()
            {
                return;
            }
        }
    }

    /// Known brokers, then bootstrap brokers, each list from a random start.
    fn candidates(&mut self) -> Vec<BrokerAddr> {
        let mut candidates: Vec<BrokerAddr> = Vec::new();
        let start = self.rng.range(0, self.known.len().max(1) as u64 - 1) as usize;
        for i in 0..self.known.len() {
            candidates.push(self.known[(start + i) % self.known.len()].clone());
        }
        let start = self.rng.range(0, self.bootstrap.len().max(1) as u64 - 1) as usize;
        for i in 0..self.bootstrap.len() {
            let b = &self.bootstrap[(start + i) % self.bootstrap.len()];
            if !candidates.contains(b) {
                candidates.push(b.clone());
            }
        }
        candidates
    }

    /// Tries every known broker, then every bootstrap broker, from a random start.
    pub fn fetch(&mut self, req: &MetaRequest) -> Result<MetadataResponse, String> {
        let candidates = self.candidates();
        let mut errors = Vec::new();
        for b in &candidates {
            self.heartbeat.beat();
            match self.fetch_from(b, req) {
                Ok(md) => {
                    self.metrics.inc(Counter::GetMetadataSuccess);
                    self.metrics.metadata_fetch_succeeded();
                    return Ok(md);
                }
                Err(e) => errors.push(format!("{b}: {e}")),
            }
        }
        self.metrics.inc(Counter::GetMetadataFail);
        let why = errors.join("; ");
        self.metrics.metadata_fetch_failed(&why);
        Err(why)
    }

    /// Asks the brokers in turn for a producer id (or an epoch bump). Any broker answers
    /// InitProducerId for an idempotent producer. A broker that lacks the API, or refuses
    /// it outright, settles it for the cluster: [`ProducerIdError::Unsupported`].
    fn init_producer_id(&mut self, req: IdRequest) -> Result<(i64, i16), ProducerIdError> {
        let mut errors = Vec::new();
        for b in &self.candidates() {
            self.heartbeat.beat();
            match self.init_producer_id_from(b, req) {
                Ok(Ok(id)) => return Ok(id),
                Ok(Err(ProducerIdError::Unsupported(e))) => {
                    return Err(ProducerIdError::Unsupported(format!("{b}: {e}")))
                }
                Ok(Err(ProducerIdError::Transient(e))) => errors.push(format!("{b}: {e}")),
                Err(e) => errors.push(format!("{b}: {e}")),
            }
        }
        Err(ProducerIdError::Transient(errors.join("; ")))
    }

    fn init_producer_id_from(
        &mut self,
        b: &BrokerAddr,
        req: IdRequest,
    ) -> Result<Result<(i64, i16), ProducerIdError>, ConnError> {
        let (mut conn, neg) = self.open(b, false)?;
        let Some(version) = negotiate(
            INIT_PRODUCER_ID_VERSIONS,
            neg.api_versions.get(API_KEY_INIT_PRODUCER_ID),
        ) else {
            return Ok(Err(ProducerIdError::Unsupported(
                "the broker does not offer InitProducerId (Kafka 0.11 or later is needed)".into(),
            )));
        };
        let mut current = match req {
            IdRequest::Bump { producer_id, epoch } if version >= 3 => Some((producer_id, epoch)),
            _ => None,
        };
        let mut frame = Vec::new();
        // At most twice: a bump the coordinator refuses falls back to a new id.
        for _ in 0..2 {
            self.correlation_id = self.correlation_id.wrapping_add(1);
            let mut buf = Vec::new();
            control::encode_init_producer_id(
                &mut buf,
                version,
                self.correlation_id,
                self.client_id.as_deref(),
                current,
            )
            .map_err(|e| ConnError::Io(std::io::Error::other(e.to_string())))?;
            conn.request(&buf, &mut frame, control::MAX_CONTROL_RESPONSE)?;
            let r = control::decode_init_producer_id(&frame, version, self.correlation_id)
                .map_err(|e| ConnError::Io(std::io::Error::other(e.to_string())))?;
            let name = error_name(r.error_code);
            return Ok(match r.error_code {
                0 if r.producer_id >= 0 && r.epoch >= 0 => Ok((r.producer_id, r.epoch)),
                0 => Err(ProducerIdError::Transient(format!(
                    "InitProducerId answered producer id {} epoch {}",
                    r.producer_id, r.epoch
                ))),
                // INVALID_PRODUCER_EPOCH, INVALID_PRODUCER_ID_MAPPING, UNKNOWN_PRODUCER_ID,
                // PRODUCER_FENCED: the coordinator will not bump that id; take a new one.
                47 | 49 | 59 | 90 if current.is_some() => {
                    current = None;
                    continue;
                }
                // CLUSTER_AUTHORIZATION_FAILED (no IDEMPOTENT_WRITE permission),
                // UNSUPPORTED_VERSION, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, SECURITY_DISABLED.
                31 | 35 | 53 | 54 => Err(ProducerIdError::Unsupported(format!(
                    "InitProducerId refused: {name} ({})",
                    r.error_code
                ))),
                code => Err(ProducerIdError::Transient(format!(
                    "InitProducerId: {name} ({code})"
                ))),
            });
        }
        Ok(Err(ProducerIdError::Transient(
            "InitProducerId: a new producer id was refused too".into(),
        )))
    }

    /// A fresh connection to `b`, handshake (TLS, ApiVersions, SASL) done. A refusal for
    /// TLS or SASL reasons is counted and shown on `/health` (the router logs the error).
    fn open(
        &mut self,
        b: &BrokerAddr,
        for_metadata: bool,
    ) -> Result<(Connection, Negotiated), ConnError> {
        let addr = b.to_string();
        let result = Connection::connect(&b.host, b.port, self.connect_timeout, &self.security)
            .inspect(|_| {
                if for_metadata {
                    self.metrics.inc(Counter::ConnectSuccessOnTryGetMetadata);
                }
            })
            .inspect_err(|e| {
                if for_metadata && e.security_failure().is_none() {
                    self.metrics.inc(Counter::ConnectFailOnTryGetMetadata);
                }
            })
            .and_then(|conn| {
                conn.set_timeouts(Some(self.socket_timeout), Some(self.socket_timeout))?;
                conn.handshake_or_assume(
                    self.client_id.as_deref(),
                    self.socket_timeout,
                    self.broker_version,
                    || {
                        let c = Connection::connect(
                            &b.host,
                            b.port,
                            self.connect_timeout,
                            &self.security,
                        )?;
                        c.set_timeouts(Some(self.socket_timeout), Some(self.socket_timeout))?;
                        Ok(c)
                    },
                )
            });
        match &result {
            Ok(_) => refusal::passed(self.metrics, &addr),
            Err(e) => {
                if let Some(sentence) =
                    refusal::note(self.metrics, &format!("broker {addr}"), &addr, e)
                {
                    let last = self.refusals_logged.get(&addr);
                    if last.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_INTERVAL) {
                        log::error!("{sentence}");
                        self.refusals_logged.insert(addr, Instant::now());
                    }
                }
            }
        }
        result
    }

    fn fetch_from(
        &mut self,
        b: &BrokerAddr,
        req: &MetaRequest,
    ) -> Result<MetadataResponse, ConnError> {
        let (mut conn, neg) = self.open(b, true)?;
        let version = negotiate(METADATA_VERSIONS, neg.api_versions.get(API_KEY_METADATA))
            .ok_or_else(|| {
                ConnError::Io(std::io::Error::other(
                    "broker supports no Metadata version we speak",
                ))
            })?;
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let names: Vec<&[u8]> = req.topics.iter().flatten().map(|t| &t[..]).collect();
        let mut buf = Vec::new();
        metadata::encode_request(
            &mut buf,
            version,
            self.correlation_id,
            self.client_id.as_deref(),
            req.topics.as_ref().map(|_| names.as_slice()),
            req.autocreate,
        );
        self.metrics.inc(Counter::StartSendMetadataRequest);
        conn.send(&buf)?;
        let mut frame = Vec::new();
        conn.recv_frame(&mut frame, MAX_METADATA_SIZE)?;
        let md = metadata::decode_response(&frame, version)?;
        if md.correlation_id != self.correlation_id {
            return Err(ConnError::CorrelationMismatch {
                expected: self.correlation_id,
                got: md.correlation_id,
            });
        }
        if md.brokers.is_empty() {
            self.metrics.inc(Counter::MetadataHasEmptyBrokerList);
            return Err(ConnError::Io(std::io::Error::other(
                "metadata lists no brokers",
            )));
        }
        Ok(md)
    }
}

/// Starts the fetcher thread. It ends when the router drops its request channel.
pub fn spawn(
    cfg: &Config,
    metrics: &'static Metrics,
    from_router: Receiver<FetchRequest>,
    to_router: Sender<FetchResponse>,
) -> std::io::Result<JoinHandle<()>> {
    let f = Fetcher::new(cfg, metrics);
    std::thread::Builder::new()
        .name("metadata".into())
        .spawn(move || f.run(from_router, to_router))
}
