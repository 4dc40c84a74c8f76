//! The one place in `kafka` that does I/O: a blocking connection to a broker (TCP, or TLS
//! over TCP) that sends encoded requests and reads size-prefixed response frames, plus the
//! handshake every connection starts with: TLS, ApiVersions (which Produce and Metadata
//! versions to use), then SASL when configured. A dispatcher owns one `Connection`;
//! `try_clone` lets one thread write while another reads.
//!
//! The bytes on the wire (a plain `TcpStream`, or a TLS session shared by a connection's
//! clones) are in `tls_stream.rs`, with the TLS tests.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use thiserror::Error;

use super::api_versions::{self, ApiVersionsResponse, BrokerVersion};
use super::errors::{error_name, NONE, UNSUPPORTED_VERSION};
use super::frame::{peek_correlation_id, request_correlation_id};
use super::primitives::DecodeError;
use super::sasl::{self, Credentials, Mechanism, ScramClient};
use super::tls_stream::{Stream, TlsStream};
use super::{
    negotiate, API_KEY_API_VERSIONS, API_KEY_METADATA, API_KEY_PRODUCE, API_VERSIONS_VERSIONS,
    METADATA_VERSIONS,
};

/// Frames are read in pieces of at most this size, so memory grows with bytes that really
/// arrived, never with a size field the peer may be lying about.
const READ_CHUNK: usize = 64 * 1024;
/// ApiVersions responses are a few KiB; anything near this is not a Kafka broker.
const HANDSHAKE_MAX_FRAME: usize = 1024 * 1024;

#[derive(Debug, Error)]
pub enum ConnError {
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("{host}:{port} resolved to no addresses")]
    NoAddress { host: String, port: u16 },
    #[error("malformed response: {0}")]
    Decode(#[from] DecodeError),
    #[error("response frame of {size} bytes exceeds the limit of {max}")]
    FrameTooLarge { size: usize, max: usize },
    #[error("invalid response frame size {0}")]
    BadFrameSize(i32),
    #[error("correlation id mismatch: expected {expected}, got {got}")]
    CorrelationMismatch { expected: i32, got: i32 },
    #[error("broker answered {api} with error {code} ({})", error_name(*code))]
    Broker { api: &'static str, code: i16 },
    /// The TLS handshake failed or the session broke: untrusted or mismatched certificate,
    /// a plaintext listener, a refused client certificate.
    #[error("TLS failed: {0}")]
    Tls(String),
    /// SASL did not authenticate us: wrong credentials, a mechanism the broker does not
    /// enable, a broker that cannot do SASL, a SCRAM server that does not prove itself.
    #[error("SASL authentication failed: {0}")]
    Auth(String),
}

/// Why a connection was refused for security reasons, as counted and shown on `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityFailure {
    Tls,
    Auth,
}

impl ConnError {
    /// `Some` for a TLS or SASL failure: retrying soon will not help, and an operator must act.
    pub fn security_failure(&self) -> Option<SecurityFailure> {
        match self {
            ConnError::Tls(_) => Some(SecurityFailure::Tls),
            ConnError::Auth(_) => Some(SecurityFailure::Auth),
            _ => None,
        }
    }

    /// An I/O error that rustls raised (a TLS alert, a bad record) becomes [`ConnError::Tls`].
    fn from_tls_io(e: ConnError) -> ConnError {
        match e {
            ConnError::Io(io) if io.get_ref().is_some_and(|i| i.is::<rustls::Error>()) => {
                ConnError::Tls(io.to_string())
            }
            e => e,
        }
    }
}

/// TLS settings for broker connections: the validated rustls configuration (trust roots,
/// client certificate) and the name to check the broker's certificate against when it is
/// not the broker's host name.
#[derive(Debug, Clone)]
pub struct TlsClient {
    pub config: Arc<ClientConfig>,
    pub server_name: Option<ServerName<'static>>,
}

/// Two TLS settings are equal when they share one loaded configuration (rustls's has no
/// equality of its own) and check the same name: settings loaded twice differ.
impl PartialEq for TlsClient {
    fn eq(&self, other: &TlsClient) -> bool {
        Arc::ptr_eq(&self.config, &other.config) && self.server_name == other.server_name
    }
}

impl Eq for TlsClient {}

/// How connections are secured: TLS, SASL, both or neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Security {
    pub tls: Option<TlsClient>,
    pub sasl: Option<Arc<Credentials>>,
}

/// Versions agreed with one broker. `None` means no version in common (e.g. a broker too
/// old for Produce v3): the caller must not send that API to this broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub produce: Option<i16>,
    pub metadata: Option<i16>,
    pub api_versions: ApiVersionsResponse,
    /// The broker closed the connection on ApiVersions and is taken to be this version
    /// (`kafka.broker_version`); `api_versions` is that version's table.
    pub assumed: Option<BrokerVersion>,
}

impl Negotiated {
    fn from_table(api_versions: ApiVersionsResponse, assumed: Option<BrokerVersion>) -> Self {
        Negotiated {
            produce: super::negotiate_produce(api_versions.get(API_KEY_PRODUCE)),
            metadata: negotiate(METADATA_VERSIONS, api_versions.get(API_KEY_METADATA)),
            api_versions,
            assumed,
        }
    }
}

/// A blocking connection to one broker.
#[derive(Debug)]
pub struct Connection {
    stream: Stream,
    peer: SocketAddr,
    sasl: Option<Arc<Credentials>>,
}

impl Connection {
    /// Resolves `host` and tries each address in turn with `timeout`, returning the first
    /// that connects (with TCP_NODELAY on) or the last error; with TLS, then completes the
    /// TLS handshake (also bounded by `timeout`), checking the broker's certificate against
    /// `host` (or the configured server name). SASL, if configured, runs in
    /// [`Connection::handshake`], after ApiVersions. Name resolution itself uses the system
    /// resolver and is not bounded by `timeout`.
    pub fn connect(
        host: &str,
        port: u16,
        timeout: Duration,
        security: &Security,
    ) -> Result<Connection, ConnError> {
        let (tcp, peer) = connect_tcp(host, port, timeout)?;
        let stream = match &security.tls {
            None => Stream::Plain(tcp),
            Some(tls) => Stream::Tls(TlsStream::handshake(tcp, tls, host, timeout)?),
        };
        Ok(Connection {
            stream,
            peer,
            sasl: security.sasl.clone(),
        })
    }

    /// The address we connected to.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Socket read and write timeouts; `None` blocks forever. A zero duration is rejected
    /// by the OS layer as invalid input.
    pub fn set_timeouts(
        &self,
        read: Option<Duration>,
        write: Option<Duration>,
    ) -> Result<(), ConnError> {
        self.stream.tcp().set_read_timeout(read)?;
        self.stream.tcp().set_write_timeout(write)?;
        Ok(())
    }

    /// Writes a whole encoded request.
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        match &mut self.stream {
            Stream::Plain(s) => s.write_all(bytes)?,
            Stream::Tls(s) => s.write_all(bytes)?,
        }
        Ok(())
    }

    /// Reads one size-prefixed response into `out` (cleared first, prefix not included).
    /// Sizes below 4 (no room for a correlation id) or above `max_size` are rejected before
    /// reading the body. After any error the stream position is unknown: drop the connection.
    pub fn recv_frame(&mut self, out: &mut Vec<u8>, max_size: usize) -> Result<(), ConnError> {
        match &mut self.stream {
            Stream::Plain(s) => read_frame(s, out, max_size),
            Stream::Tls(s) => read_frame(s, out, max_size),
        }
    }

    /// Sends `request` and reads its response into `scratch`, checking that the response
    /// carries the request's correlation id. Only for a connection with nothing else in
    /// flight (handshake, metadata); pipelined traffic uses `send` and `recv_frame`.
    pub fn request(
        &mut self,
        request: &[u8],
        scratch: &mut Vec<u8>,
        max_size: usize,
    ) -> Result<(), ConnError> {
        self.send(request)?;
        self.recv_frame(scratch, max_size)?;
        if let Some(expected) = request_correlation_id(request) {
            check_correlation(scratch, expected)?;
        }
        Ok(())
    }

    /// A second handle on the same socket (and TLS session), e.g. a reader thread beside a
    /// writer.
    pub fn try_clone(&self) -> Result<Connection, ConnError> {
        Ok(Connection {
            stream: self.stream.try_clone()?,
            peer: self.peer,
            sasl: self.sasl.clone(),
        })
    }

    /// Shuts both directions down, waking any thread blocked on the socket. An already
    /// disconnected socket is not an error.
    pub fn shutdown(&self) -> Result<(), ConnError> {
        match self.stream.tcp().shutdown(Shutdown::Both) {
            Err(e) if e.kind() != io::ErrorKind::NotConnected => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Asks the broker which versions it supports and picks ours, then authenticates when
    /// SASL is configured. Sends ApiVersions at our highest version; if the broker answers
    /// UNSUPPORTED_VERSION, retries once at the highest version it lists (capped to ours;
    /// v0 if it lists none). Socket timeouts are set to `timeout` for the exchange and
    /// restored afterwards.
    pub fn handshake(
        &mut self,
        client_id: Option<&str>,
        timeout: Duration,
    ) -> Result<Negotiated, ConnError> {
        let saved = (
            self.stream.tcp().read_timeout()?,
            self.stream.tcp().write_timeout()?,
        );
        self.set_timeouts(Some(timeout), Some(timeout))?;
        let result = self
            .exchange_api_versions(client_id)
            .and_then(|api_versions| {
                if let Some(creds) = self.sasl.clone() {
                    // Some brokers answer a refused login by closing the connection.
                    self.authenticate(&creds, &api_versions, client_id)
                        .map_err(|e| match ConnError::from_tls_io(e) {
                            ConnError::Io(io) => ConnError::Auth(format!(
                                "the connection ended during {} authentication: {io}",
                                creds.mechanism.name()
                            )),
                            e => e,
                        })?;
                }
                Ok(api_versions)
            });
        self.set_timeouts(saved.0, saved.1)?;
        let api_versions = result.map_err(ConnError::from_tls_io)?;
        Ok(Negotiated::from_table(api_versions, None))
    }

    /// [`Connection::handshake`]; but if the broker closes the connection on ApiVersions,
    /// as brokers before Kafka 0.10 do, and `fallback` says what broker to take it for,
    /// a new connection from `reconnect` speaking that version's table (no ApiVersions,
    /// no SASL: those brokers have neither).
    pub fn handshake_or_assume(
        mut self,
        client_id: Option<&str>,
        timeout: Duration,
        fallback: Option<BrokerVersion>,
        reconnect: impl FnOnce() -> Result<Connection, ConnError>,
    ) -> Result<(Connection, Negotiated), ConnError> {
        match self.handshake(client_id, timeout) {
            Ok(n) => Ok((self, n)),
            Err(ConnError::Io(e)) if fallback.is_some() && closed_by_peer(&e) => {
                let v = fallback.expect("checked");
                let conn = reconnect()?;
                Ok((conn, Negotiated::from_table(v.api_versions(), Some(v))))
            }
            Err(ConnError::Io(e)) if closed_by_peer(&e) => Err(ConnError::Io(io::Error::new(
                e.kind(),
                format!(
                    "{e}: the broker closed the connection on ApiVersions, as Kafka 0.8 and 0.9 do; if it is one, set kafka.broker_version = \"0.9\" (or \"0.8\")"
                ),
            ))),
            Err(e) => Err(e),
        }
    }

    /// SaslHandshake v1, then SaslAuthenticate: one round for PLAIN, two for SCRAM (whose
    /// final answer must prove the broker knows the password). Correlation ids 2 and up:
    /// ApiVersions used 0 and 1, nothing else is in flight.
    fn authenticate(
        &mut self,
        creds: &Credentials,
        api_versions: &ApiVersionsResponse,
        client_id: Option<&str>,
    ) -> Result<(), ConnError> {
        let handshake_version = negotiate(
            sasl::SASL_HANDSHAKE_VERSIONS,
            api_versions.get(sasl::API_KEY_SASL_HANDSHAKE),
        )
        .ok_or_else(|| {
            ConnError::Auth("the broker does not offer SaslHandshake v1 (Kafka 1.0+)".into())
        })?;
        let auth_version = negotiate(
            sasl::SASL_AUTHENTICATE_VERSIONS,
            api_versions.get(sasl::API_KEY_SASL_AUTHENTICATE),
        )
        .ok_or_else(|| ConnError::Auth("the broker does not offer SaslAuthenticate".into()))?;
        let control = |e: super::control::ControlError| ConnError::Auth(e.to_string());
        let mut request = Vec::with_capacity(256);
        let mut frame = Vec::new();
        let mut correlation_id = 2;

        sasl::encode_handshake(
            &mut request,
            handshake_version,
            correlation_id,
            client_id,
            creds.mechanism,
        )
        .map_err(control)?;
        self.request(&request, &mut frame, HANDSHAKE_MAX_FRAME)?;
        let (code, enabled) =
            sasl::decode_handshake(&frame, handshake_version, correlation_id).map_err(control)?;
        if code != NONE {
            return Err(ConnError::Auth(format!(
                "the broker does not enable {} ({}); it offers [{}]",
                creds.mechanism.name(),
                error_name(code),
                enabled.join(", ")
            )));
        }

        let mut round = |conn: &mut Connection, token: &[u8]| -> Result<Vec<u8>, ConnError> {
            correlation_id += 1;
            request.clear();
            sasl::encode_authenticate(&mut request, auth_version, correlation_id, client_id, token)
                .map_err(control)?;
            conn.request(&request, &mut frame, HANDSHAKE_MAX_FRAME)?;
            let a =
                sasl::decode_authenticate(&frame, auth_version, correlation_id).map_err(control)?;
            if a.error_code != NONE {
                let why = a
                    .error_message
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| error_name(a.error_code).to_string());
                return Err(ConnError::Auth(format!(
                    "{why} ({} as user {:?})",
                    creds.mechanism.name(),
                    creds.username
                )));
            }
            Ok(a.auth_bytes)
        };
        match creds.mechanism {
            Mechanism::Plain => {
                round(self, &sasl::plain_message(&creds.username, &creds.password))?;
            }
            Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                let mut nonce = [0u8; 24];
                rustls::crypto::ring::default_provider()
                    .secure_random
                    .fill(&mut nonce)
                    .map_err(|e| ConnError::Auth(format!("no randomness for a nonce: {e:?}")))?;
                let scram =
                    ScramClient::new(creds.mechanism, &creds.username, &creds.password, &nonce);
                let server_first = round(self, &scram.client_first())?;
                let (client_final, verifier) = scram
                    .client_final(&server_first)
                    .map_err(|e| ConnError::Auth(e.to_string()))?;
                let server_final = round(self, &client_final)?;
                verifier
                    .verify(&server_final)
                    .map_err(|e| ConnError::Auth(e.to_string()))?;
            }
        }
        Ok(())
    }

    fn exchange_api_versions(
        &mut self,
        client_id: Option<&str>,
    ) -> Result<ApiVersionsResponse, ConnError> {
        let mut request = Vec::with_capacity(64);
        let mut frame = Vec::new();
        let mut version = API_VERSIONS_VERSIONS.max;
        // Correlation ids 0 and 1: nothing else is in flight before the handshake ends.
        for correlation_id in 0..2 {
            request.clear();
            api_versions::encode_request(&mut request, version, correlation_id, client_id);
            self.request(&request, &mut frame, HANDSHAKE_MAX_FRAME)?;
            let response = api_versions::decode_response(&frame, version)?;
            match response.error_code {
                NONE => return Ok(response),
                UNSUPPORTED_VERSION if correlation_id == 0 => {
                    version = retry_version(&response).ok_or(ConnError::Broker {
                        api: "api_versions",
                        code: UNSUPPORTED_VERSION,
                    })?;
                }
                code => {
                    return Err(ConnError::Broker {
                        api: "api_versions",
                        code,
                    })
                }
            }
        }
        Err(ConnError::Broker {
            api: "api_versions",
            code: UNSUPPORTED_VERSION,
        })
    }
}

/// Whether `e` is the peer ending the connection (what a broker before Kafka 0.10 does on
/// ApiVersions), as opposed to a timeout or a local failure.
fn closed_by_peer(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// The ApiVersions version to retry with after UNSUPPORTED_VERSION: the highest the broker
/// lists that we also speak, v0 when it lists nothing (every broker with ApiVersions speaks
/// v0), `None` when its range and ours do not meet.
fn retry_version(response: &ApiVersionsResponse) -> Option<i16> {
    match response.get(API_KEY_API_VERSIONS) {
        None => Some(API_VERSIONS_VERSIONS.min),
        theirs => negotiate(API_VERSIONS_VERSIONS, theirs),
    }
}

/// Resolves `host` and connects to the first address that answers within `timeout`.
fn connect_tcp(
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr), ConnError> {
    let mut last_err = None;
    for addr in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok((stream, addr));
            }
            Err(e) => last_err = Some(e),
        }
    }
    Err(match last_err {
        Some(e) => ConnError::Io(e),
        None => ConnError::NoAddress {
            host: host.to_owned(),
            port,
        },
    })
}

/// Checks that a response frame answers the request with correlation id `expected`.
pub fn check_correlation(frame: &[u8], expected: i32) -> Result<(), ConnError> {
    let got = peek_correlation_id(frame)?;
    if got == expected {
        Ok(())
    } else {
        Err(ConnError::CorrelationMismatch { expected, got })
    }
}

/// Reads one size-prefixed frame from any reader (generic so it is testable without a
/// socket). See [`Connection::recv_frame`].
pub fn read_frame<R: Read>(
    reader: &mut R,
    out: &mut Vec<u8>,
    max_size: usize,
) -> Result<(), ConnError> {
    out.clear();
    let mut prefix = [0u8; 4];
    reader.read_exact(&mut prefix)?;
    let declared = i32::from_be_bytes(prefix);
    let size = usize::try_from(declared)
        .ok()
        .filter(|&n| n >= 4)
        .ok_or(ConnError::BadFrameSize(declared))?;
    if size > max_size {
        return Err(ConnError::FrameTooLarge {
            size,
            max: max_size,
        });
    }
    while out.len() < size {
        let filled = out.len();
        let chunk = (size - filled).min(READ_CHUNK);
        out.resize(filled + chunk, 0);
        match reader.read(&mut out[filled..]) {
            Ok(0) => {
                out.truncate(filled);
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a response frame",
                )
                .into());
            }
            Ok(n) => out.truncate(filled + n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => out.truncate(filled),
            Err(e) => {
                out.truncate(filled);
                return Err(e.into());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::kafka::primitives::{put_array_len, put_i16, put_i32, Reader};
    use std::io::Cursor;
    use std::net::TcpListener;
    use std::thread;

    pub(crate) fn framed(body: &[u8]) -> Vec<u8> {
        let mut v = (body.len() as i32).to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn reads_frames_back_to_back() {
        let mut input = framed(b"\0\0\0\x01abc");
        input.extend(framed(b"\0\0\0\x02"));
        let mut cursor = Cursor::new(input);
        let mut out = Vec::new();
        read_frame(&mut cursor, &mut out, 100).unwrap();
        assert_eq!(out, b"\0\0\0\x01abc");
        check_correlation(&out, 1).unwrap();
        read_frame(&mut cursor, &mut out, 100).unwrap();
        assert_eq!(out, b"\0\0\0\x02");
        assert!(matches!(
            check_correlation(&out, 1),
            Err(ConnError::CorrelationMismatch {
                expected: 1,
                got: 2
            })
        ));
    }

    #[test]
    fn rejects_bad_sizes() {
        let mut out = Vec::new();
        for size in [-1i32, 0, 3, i32::MIN] {
            let mut c = Cursor::new(size.to_be_bytes().to_vec());
            assert!(matches!(
                read_frame(&mut c, &mut out, 100),
                Err(ConnError::BadFrameSize(s)) if s == size
            ));
        }
        let mut c = Cursor::new(101i32.to_be_bytes().to_vec());
        assert!(matches!(
            read_frame(&mut c, &mut out, 100),
            Err(ConnError::FrameTooLarge {
                size: 101,
                max: 100
            })
        ));
    }

    #[test]
    fn lying_size_does_not_allocate_it() {
        // Claims ~2 GiB, delivers 10 bytes, then EOF.
        let mut input = i32::MAX.to_be_bytes().to_vec();
        input.extend_from_slice(&[7; 10]);
        let mut out = Vec::new();
        let err = read_frame(&mut Cursor::new(input), &mut out, usize::MAX).unwrap_err();
        assert!(matches!(err, ConnError::Io(ref e) if e.kind() == io::ErrorKind::UnexpectedEof));
        assert!(out.capacity() <= 2 * READ_CHUNK, "{}", out.capacity());
    }

    #[test]
    fn truncated_prefix_is_an_io_error() {
        let mut out = Vec::new();
        assert!(matches!(
            read_frame(&mut Cursor::new(vec![0, 0]), &mut out, 100),
            Err(ConnError::Io(_))
        ));
    }

    #[test]
    fn large_frames_arrive_in_chunks() {
        let body: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        read_frame(&mut Cursor::new(framed(&body)), &mut out, 1 << 20).unwrap();
        assert_eq!(out, body);
    }

    /// A fake broker: reads `replies.len()` requests, answering each with the given body
    /// (correlation id taken from the request). Returns the API versions it was asked for.
    fn fake_broker(replies: Vec<Vec<u8>>) -> (SocketAddr, thread::JoinHandle<Vec<i16>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let mut versions = Vec::new();
            let mut req = Vec::new();
            for body in replies {
                read_frame(&mut sock, &mut req, 1 << 20).unwrap();
                let mut r = Reader::new(&req);
                assert_eq!(r.i16().unwrap(), API_KEY_API_VERSIONS);
                versions.push(r.i16().unwrap());
                let corr = r.i32().unwrap();
                let mut resp = corr.to_be_bytes().to_vec();
                resp.extend_from_slice(&body);
                sock.write_all(&framed(&resp)).unwrap();
            }
            versions
        });
        (addr, handle)
    }

    /// ApiVersions v0-layout body with the given error code and `(key, min, max)` entries.
    fn v0_body(error_code: i16, keys: &[(i16, i16, i16)]) -> Vec<u8> {
        let mut b = Vec::new();
        put_i16(&mut b, error_code);
        put_array_len(&mut b, keys.len());
        for &(k, min, max) in keys {
            put_i16(&mut b, k);
            put_i16(&mut b, min);
            put_i16(&mut b, max);
        }
        b
    }

    /// v3 body (flexible, throttle time, no tagged fields).
    fn v3_body(keys: &[(i16, i16, i16)]) -> Vec<u8> {
        let mut b = Vec::new();
        put_i16(&mut b, 0);
        b.push(keys.len() as u8 + 1);
        for &(k, min, max) in keys {
            put_i16(&mut b, k);
            put_i16(&mut b, min);
            put_i16(&mut b, max);
            b.push(0);
        }
        put_i32(&mut b, 0);
        b.push(0);
        b
    }

    fn plain(host: &str, port: u16, timeout_s: u64) -> Result<Connection, ConnError> {
        Connection::connect(
            host,
            port,
            Duration::from_secs(timeout_s),
            &Security::default(),
        )
    }

    #[test]
    fn handshake_at_v3() {
        let (addr, broker) = fake_broker(vec![v3_body(&[(0, 0, 11), (3, 0, 12), (18, 0, 4)])]);
        let mut conn = plain("127.0.0.1", addr.port(), 5).unwrap();
        let n = conn
            .handshake(Some("dory"), Duration::from_secs(5))
            .unwrap();
        assert_eq!(n.produce, Some(8));
        assert_eq!(n.metadata, Some(12));
        assert_eq!(broker.join().unwrap(), vec![3]);
        assert_eq!(conn.stream.tcp().read_timeout().unwrap(), None);
    }

    #[test]
    fn handshake_retries_after_unsupported_version() {
        let (addr, broker) = fake_broker(vec![
            v0_body(UNSUPPORTED_VERSION, &[(18, 0, 2)]),
            // v2 layout: v0 plus throttle time.
            [v0_body(0, &[(0, 0, 2), (3, 0, 5), (18, 0, 2)]), vec![0; 4]].concat(),
        ]);
        let mut conn = plain("localhost", addr.port(), 5);
        // "localhost" may resolve to ::1 first; fall back to the literal address.
        if conn.is_err() {
            conn = plain("127.0.0.1", addr.port(), 5);
        }
        let mut conn = conn.unwrap();
        let n = conn.handshake(None, Duration::from_secs(5)).unwrap();
        assert_eq!(
            n.produce,
            Some(2),
            "a 0.10 broker: Produce v2 (MessageSet v1)"
        );
        assert_eq!(n.metadata, Some(5));
        assert_eq!(broker.join().unwrap(), vec![3, 2]);
    }

    #[test]
    fn handshake_gives_up_after_second_unsupported_version() {
        let (addr, broker) = fake_broker(vec![
            v0_body(UNSUPPORTED_VERSION, &[(18, 0, 1)]),
            v0_body(UNSUPPORTED_VERSION, &[(18, 0, 0)]),
        ]);
        let mut conn = plain("127.0.0.1", addr.port(), 5).unwrap();
        let err = conn.handshake(None, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(
            err,
            ConnError::Broker {
                code: UNSUPPORTED_VERSION,
                ..
            }
        ));
        assert_eq!(broker.join().unwrap(), vec![3, 1]);
    }

    #[test]
    fn retry_version_choice() {
        let resp = |keys: Vec<(i16, i16, i16)>| ApiVersionsResponse {
            correlation_id: 0,
            error_code: UNSUPPORTED_VERSION,
            api_keys: keys
                .into_iter()
                .map(|(k, min, max)| api_versions::ApiVersionRange {
                    api_key: k,
                    min_version: min,
                    max_version: max,
                })
                .collect(),
        };
        assert_eq!(retry_version(&resp(vec![(18, 0, 2)])), Some(2));
        assert_eq!(retry_version(&resp(vec![(18, 0, 9)])), Some(3));
        assert_eq!(retry_version(&resp(vec![])), Some(0));
        assert_eq!(retry_version(&resp(vec![(18, 5, 9)])), None);
    }

    #[test]
    fn connect_refused_is_an_error() {
        // Bind then drop to find a port nobody listens on.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        assert!(plain("127.0.0.1", port, 1).is_err());
    }

    #[test]
    fn request_checks_correlation_and_clone_shutdown_work() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            read_frame(&mut sock, &mut req, 1024).unwrap();
            // Answer with the wrong correlation id.
            sock.write_all(&framed(&77i32.to_be_bytes())).unwrap();
        });
        let mut conn = plain("127.0.0.1", port, 5).unwrap();
        conn.set_timeouts(Some(Duration::from_secs(5)), Some(Duration::from_secs(5)))
            .unwrap();
        let mut request = Vec::new();
        api_versions::encode_request(&mut request, 0, 5, None);
        let mut scratch = Vec::new();
        let err = conn.request(&request, &mut scratch, 1024).unwrap_err();
        assert!(matches!(
            err,
            ConnError::CorrelationMismatch {
                expected: 5,
                got: 77
            }
        ));
        server.join().unwrap();
        let reader = conn.try_clone().unwrap();
        conn.shutdown().unwrap();
        reader.shutdown().unwrap();
        assert_eq!(reader.peer(), conn.peer());
    }
}
