//! The metadata fetcher: a helper thread of the router that asks brokers for cluster
//! metadata, so the router never blocks on the network. Each fetch opens a fresh
//! connection (as Dory does), negotiates versions, and tries known brokers in turn.

use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::config::{BrokerAddr, Config};
use crate::deliver::backoff::Rng;
use crate::kafka::connection::{ConnError, Connection};
use crate::kafka::{metadata, negotiate, MetadataResponse, API_KEY_METADATA, METADATA_VERSIONS};
use crate::pipeline::{MetaRequest, MetaResponse};
use crate::report::metrics::{Counter, Metrics};

/// Largest metadata response we accept: enough for very large clusters.
const MAX_METADATA_SIZE: usize = 64 << 20;

pub struct Fetcher {
    bootstrap: Vec<BrokerAddr>,
    /// Brokers from the last successful response, tried first.
    known: Vec<BrokerAddr>,
    client_id: Option<String>,
    connect_timeout: Duration,
    socket_timeout: Duration,
    metrics: &'static Metrics,
    rng: Rng,
    correlation_id: i32,
}

impl Fetcher {
    pub fn new(cfg: &Config, metrics: &'static Metrics) -> Fetcher {
        Fetcher {
            bootstrap: cfg.kafka.brokers.clone(),
            known: Vec::new(),
            client_id: cfg.kafka.client_id.clone(),
            connect_timeout: cfg.kafka.connect_timeout,
            socket_timeout: cfg.kafka.socket_timeout,
            metrics,
            rng: Rng::from_entropy(),
            correlation_id: 0,
        }
    }

    fn run(mut self, from_router: Receiver<MetaRequest>, to_router: Sender<MetaResponse>) {
        for request in from_router {
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
            if to_router.send(MetaResponse { request, result }).is_err() {
                return;
            }
        }
    }

    /// Tries every known broker, then every bootstrap broker, from a random start.
    pub fn fetch(&mut self, req: &MetaRequest) -> Result<MetadataResponse, String> {
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
        let mut errors = Vec::new();
        for b in &candidates {
            match self.fetch_from(b, req) {
                Ok(md) => {
                    self.metrics.inc(Counter::GetMetadataSuccess);
                    return Ok(md);
                }
                Err(e) => errors.push(format!("{b}: {e}")),
            }
        }
        self.metrics.inc(Counter::GetMetadataFail);
        Err(errors.join("; "))
    }

    fn fetch_from(
        &mut self,
        b: &BrokerAddr,
        req: &MetaRequest,
    ) -> Result<MetadataResponse, ConnError> {
        let mut conn =
            Connection::connect(&b.host, b.port, self.connect_timeout).inspect_err(|_| {
                self.metrics.inc(Counter::ConnectFailOnTryGetMetadata);
            })?;
        self.metrics.inc(Counter::ConnectSuccessOnTryGetMetadata);
        conn.set_timeouts(Some(self.socket_timeout), Some(self.socket_timeout))?;
        let neg = conn.handshake(self.client_id.as_deref(), self.socket_timeout)?;
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
    from_router: Receiver<MetaRequest>,
    to_router: Sender<MetaResponse>,
) -> std::io::Result<JoinHandle<()>> {
    let f = Fetcher::new(cfg, metrics);
    std::thread::Builder::new()
        .name("metadata".into())
        .spawn(move || f.run(from_router, to_router))
}
