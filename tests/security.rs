//! TLS and SASL to brokers, against independent peers:
//!
//! - Tansu behind stunnel (Debian's TLS terminator; Tansu 0.6.0 cannot serve TLS itself:
//!   its `--cert` and `--key` flags exclude each other). Tansu advertises stunnel's port.
//!   Between stunnel and Tansu sits a SASL gate written here: Tansu 0.6.0's own
//!   `--authentication` offers no PLAIN, and its SCRAM users cannot be created in memory
//!   storage (`tansu user create` and AlterUserScramCredentials are refused before
//!   authentication), so no client can ever log in to it. The gate answers SaslHandshake
//!   and SaslAuthenticate (PLAIN, SCRAM-SHA-256/512 per RFC 5802, checked against a stored
//!   key as a broker does) and then splices the connection to Tansu. librdkafka, a second
//!   client, logs in through the same gate and reads everything back over SASL_SSL.
//! - A wrong password and an untrusted CA each fail cleanly: no delivery, a log line naming
//!   the broker, a counter, `/health` 503 with the reason, dory keeps running and backs
//!   off, SIGTERM still ends it with every message accounted for. Tansu's own SASL
//!   (`--authentication`) refusing dory is a third such case.
//! - Three librdkafka mock brokers, each behind its own stunnel port (the mock is told to
//!   advertise those): multi-broker TLS, read back by librdkafka over TLS.
//!
//! Certificates are generated here (rcgen).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use std::io::Write as _;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use dory::kafka::sasl::{salted_password, Mechanism};
use hmac::digest::Digest;
use hmac::{Mac, SimpleHmac};
use kafka_protocol::messages::{
    RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sha2::{Sha256, Sha512};
use tempfile::TempDir;

const N: usize = 500;
const TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------------------------

/// A CA, a broker certificate it signed (for `localhost` and 127.0.0.1), a client
/// certificate it signed, and an unrelated CA with a broker certificate of its own, as PEM
/// files.
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = |name: &str| {
            let key = KeyPair::generate().expect("CA key");
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
            p.distinguished_name.push(DnType::CommonName, name);
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let cert = p.self_signed(&key).expect("self-sign CA");
            (cert, key)
        };
        let (ca_cert, ca_key) = ca("dory test CA");
        let (rogue_cert, rogue_key) = ca("somebody else's CA");
        let leaf = |names: &[&str],
                    usage: ExtendedKeyUsagePurpose,
                    by: &rcgen::Certificate,
                    by_key: &KeyPair| {
            let key = KeyPair::generate().expect("leaf key");
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            let mut p = CertificateParams::new(names).expect("leaf params");
            p.distinguished_name.push(DnType::CommonName, "dory test");
            p.extended_key_usages = vec![usage];
            let cert = p.signed_by(&key, by, by_key).expect("sign leaf");
            (cert.pem(), key.serialize_pem())
        };
        let broker = ["localhost", "127.0.0.1"];
        let server = ExtendedKeyUsagePurpose::ServerAuth;
        let (server_pem, server_key) = leaf(&broker, server.clone(), &ca_cert, &ca_key);
        let (rogue_pem, rogue_server_key) = leaf(&broker, server, &rogue_cert, &rogue_key);
        let client = ExtendedKeyUsagePurpose::ClientAuth;
        let (client, client_key) = leaf(&["dory-client"], client, &ca_cert, &ca_key);
        for (name, pem) in [
            ("ca.pem", ca_cert.pem()),
            ("rogue-ca.pem", rogue_cert.pem()),
            ("server.pem", server_pem),
            ("server.key", server_key),
            ("rogue-server.pem", rogue_pem),
            ("rogue-server.key", rogue_server_key),
            ("client.pem", client),
            ("client.key", client_key),
        ] {
            fs::write(dir.path().join(name), pem).expect("write PEM");
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

// ---------------------------------------------------------------------------------------------
// stunnel
// ---------------------------------------------------------------------------------------------

/// stunnel terminating TLS on each `(accept port, plaintext target port)`, killed on drop.
struct Stunnel {
    proc: Proc,
    _dir: TempDir,
}

fn stunnel_bin() -> &'static str {
    for b in ["stunnel4", "stunnel"] {
        if Command::new(b).arg("-version").output().is_ok() {
            return b;
        }
    }
    panic!("stunnel is not installed (Debian: apt-get install stunnel4; scripts/test.sh does it)");
}

impl Stunnel {
    fn start(pki: &Pki, routes: &[(u16, u16)], require_client_cert: bool) -> Stunnel {
        let routes: Vec<(u16, u16, &str)> = routes.iter().map(|&(a, c)| (a, c, "server")).collect();
        Stunnel::start_with(pki, &routes, require_client_cert)
    }

    /// Routes `(accept, connect, cert)`: `cert` names the PEM pair (`server`, `rogue-server`).
    fn start_with(pki: &Pki, routes: &[(u16, u16, &str)], require_client_cert: bool) -> Stunnel {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut conf = String::from("foreground = yes\npid =\ndebug = notice\n");
        for (i, (accept, connect, cert)) in routes.iter().enumerate() {
            conf += &format!(
                "[broker{i}]\naccept = 127.0.0.1:{accept}\nconnect = 127.0.0.1:{connect}\n\
                 cert = {}\nkey = {}\n",
                pki.path(&format!("{cert}.pem")).display(),
                pki.path(&format!("{cert}.key")).display()
            );
            if require_client_cert {
                conf += &format!(
                    "CAfile = {}\nverifyChain = yes\nrequireCert = yes\n",
                    pki.path("ca.pem").display()
                );
            }
        }
        let path = dir.path().join("stunnel.conf");
        fs::write(&path, conf).expect("write stunnel.conf");
        let mut proc = Proc::spawn(
            "stunnel",
            Command::new(stunnel_bin()).arg(&path),
            dir.path(),
        );
        for (accept, _, _) in routes {
            if let Err(e) = wait_for_port(*accept, Duration::from_secs(20), Some(&mut proc)) {
                panic!("stunnel did not start: {e}\n{}", proc.logs());
            }
        }
        Stunnel { proc, _dir: dir }
    }

    /// The services (`broker<i>`) that carried a connection to their broker.
    fn services_used(&self) -> std::collections::BTreeSet<String> {
        self.proc
            .logs()
            .lines()
            .filter(|l| l.contains("connected remote server"))
            .filter_map(|l| Some(l.split("Service [").nth(1)?.split(']').next()?.to_owned()))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Tansu with SASL behind stunnel
// ---------------------------------------------------------------------------------------------

/// Tansu reachable over TLS at `127.0.0.1:tls_port`, SASL required: by the gate below
/// (`Auth::Gate`, users as given), or by Tansu itself (`Auth::Tansu`, nobody can log in).
struct SecureTansu {
    _tansu: Tansu,
    _gate: Option<SaslGate>,
    _stunnel: Stunnel,
    tls_port: u16,
}

enum Auth<'a> {
    Gate(&'a [(&'a str, &'a str)]),
    Tansu,
}

impl SecureTansu {
    fn start(pki: &Pki, auth: Auth<'_>, require_client_cert: bool) -> SecureTansu {
        let tls_port = free_port();
        let (tansu, gate) = match auth {
            Auth::Gate(users) => {
                let tansu = Tansu::start_advertising(tls_port);
                let gate = SaslGate::start(tansu.port(), users);
                (tansu, Some(gate))
            }
            Auth::Tansu => (Tansu::start_authenticating(tls_port), None),
        };
        let target = gate.as_ref().map_or(tansu.port(), |g| g.port);
        let stunnel = Stunnel::start(pki, &[(tls_port, target)], require_client_cert);
        SecureTansu {
            _tansu: tansu,
            _gate: gate,
            _stunnel: stunnel,
            tls_port,
        }
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.tls_port)
    }
}

// ---------------------------------------------------------------------------------------------
// A SASL gate in front of a broker
// ---------------------------------------------------------------------------------------------

const SALT: &[u8] = b"dory-security-test-salt";
const ITERATIONS: u32 = 4096;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// Accepts plaintext Kafka connections, answers SaslHandshake and SaslAuthenticate itself
/// (PLAIN and SCRAM-SHA-256/512 for `users`), forwards ApiVersions before that, and once a
/// client is authenticated splices it to the broker at `upstream`. A failed login gets
/// SASL_AUTHENTICATION_FAILED and the connection closed, as Kafka does.
struct SaslGate {
    port: u16,
}

impl SaslGate {
    fn start(upstream: u16, users: &[(&str, &str)]) -> SaslGate {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind gate");
        let port = listener.local_addr().expect("gate addr").port();
        let users: Arc<BTreeMap<String, String>> = Arc::new(
            users
                .iter()
                .map(|(u, p)| (u.to_string(), p.to_string()))
                .collect(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let users = users.clone();
                std::thread::spawn(move || {
                    let _ = gate_connection(client, upstream, &users);
                });
            }
        });
        SaslGate { port }
    }
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as i32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// A response frame: header (with `correlation_id`) and `body`, size-prefixed.
fn response<R: Encodable + HeaderVersion>(correlation_id: i32, version: i16, body: &R) -> Vec<u8> {
    let mut b = Vec::new();
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut b, R::header_version(version))
        .expect("encode header");
    body.encode(&mut b, version).expect("encode body");
    framed(&b)
}

/// The SCRAM exchange the gate is in, after client-first.
struct ScramServer {
    mechanism: Mechanism,
    password: Option<String>,
    client_first_bare: String,
    server_first: String,
}

fn gate_connection(
    mut client: std::net::TcpStream,
    upstream: u16,
    users: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    let mut broker = std::net::TcpStream::connect(("127.0.0.1", upstream))?;
    let mut frame = Vec::new();
    let mut mechanism: Option<Mechanism> = None;
    let mut scram: Option<ScramServer> = None;
    loop {
        dory::kafka::connection::read_frame(&mut client, &mut frame, 1 << 20)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let api_key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        match api_key {
            18 => {
                // ApiVersions: the broker's own answer.
                broker.write_all(&framed(&frame))?;
                dory::kafka::connection::read_frame(&mut broker, &mut frame, 1 << 20)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                client.write_all(&framed(&frame))?;
            }
            17 => {
                let mut buf = &frame[..];
                let h =
                    RequestHeader::decode(&mut buf, SaslHandshakeRequest::header_version(version))
                        .map_err(|e| std::io::Error::other(e.to_string()))?;
                let r = SaslHandshakeRequest::decode(&mut buf, version)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                mechanism = Mechanism::parse(r.mechanism.as_str());
                let body = SaslHandshakeResponse::default()
                    .with_error_code(if mechanism.is_some() {
                        0
                    } else {
                        UNSUPPORTED_SASL_MECHANISM
                    })
                    .with_mechanisms(
                        Mechanism::ALL
                            .iter()
                            .map(|m| StrBytes::from_static_str(m.name()))
                            .collect(),
                    );
                client.write_all(&response(h.correlation_id, version, &body))?;
                if mechanism.is_none() {
                    return Ok(());
                }
            }
            36 => {
                let mut buf = &frame[..];
                let h = RequestHeader::decode(
                    &mut buf,
                    SaslAuthenticateRequest::header_version(version),
                )
                .map_err(|e| std::io::Error::other(e.to_string()))?;
                let r = SaslAuthenticateRequest::decode(&mut buf, version)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                let token = String::from_utf8_lossy(&r.auth_bytes).into_owned();
                let step = match (mechanism, scram.take()) {
                    (Some(Mechanism::Plain), _) => {
                        let mut parts = token.split('\0');
                        let (_authz, user, pw) = (parts.next(), parts.next(), parts.next());
                        match (user, pw) {
                            (Some(u), Some(p)) if users.get(u).map(String::as_str) == Some(p) => {
                                Ok((Vec::new(), true))
                            }
                            _ => Err("Authentication failed: Invalid username or password"),
                        }
                    }
                    (Some(m), None) => scram_first(m, &token, users).map(|(s, reply)| {
                        let reply = reply.into_bytes();
                        scram = Some(s);
                        (reply, false)
                    }),
                    (Some(_), Some(s)) => scram_final(&s, &token).map(|v| (v.into_bytes(), true)),
                    (None, _) => Err("SaslAuthenticate before SaslHandshake"),
                };
                let (code, message, bytes, done) = match step {
                    Ok((bytes, done)) => (0, None, bytes, done),
                    Err(why) => (SASL_AUTHENTICATION_FAILED, Some(why), Vec::new(), false),
                };
                let body = SaslAuthenticateResponse::default()
                    .with_error_code(code)
                    .with_error_message(message.map(StrBytes::from_static_str))
                    .with_auth_bytes(bytes.into());
                client.write_all(&response(h.correlation_id, version, &body))?;
                if code != 0 {
                    return Ok(());
                }
                if done {
                    break;
                }
            }
            // Anything else before authentication: Kafka closes the connection.
            _ => return Ok(()),
        }
    }
    // Authenticated: splice the two sockets.
    let (mut c2, mut b2) = (client.try_clone()?, broker.try_clone()?);
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c2, &mut b2);
        let _ = b2.shutdown(std::net::Shutdown::Both);
    });
    let _ = std::io::copy(&mut broker, &mut client);
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
    Ok(())
}

/// client-first-message → (state, server-first-message). An unknown user still gets a
/// server-first (with a password nobody has), as a broker does, and fails at the proof.
fn scram_first(
    mechanism: Mechanism,
    token: &str,
    users: &BTreeMap<String, String>,
) -> Result<(ScramServer, String), &'static str> {
    let bare = token.strip_prefix("n,,").ok_or("unsupported GS2 header")?;
    let mut user = None;
    let mut nonce = None;
    for attr in bare.split(',') {
        if let Some(u) = attr.strip_prefix("n=") {
            user = Some(u.replace("=2C", ",").replace("=3D", "="));
        } else if let Some(r) = attr.strip_prefix("r=") {
            nonce = Some(r.to_owned());
        }
    }
    let (user, nonce) = (user.ok_or("no user")?, nonce.ok_or("no nonce")?);
    let server_first = format!(
        "r={nonce}gate{:x},s={},i={ITERATIONS}",
        now_ms(),
        B64.encode(SALT)
    );
    Ok((
        ScramServer {
            mechanism,
            password: users.get(&user).cloned(),
            client_first_bare: bare.to_owned(),
            server_first: server_first.clone(),
        },
        server_first,
    ))
}

/// client-final-message → server-final-message, if the proof matches the stored key.
fn scram_final(s: &ScramServer, token: &str) -> Result<String, &'static str> {
    let (without_proof, proof) = token.rsplit_once(",p=").ok_or("no proof")?;
    let nonce = s.server_first.split(',').next().unwrap_or("");
    if !without_proof.contains(nonce) {
        return Err("nonce mismatch");
    }
    let proof = B64.decode(proof).map_err(|_| "proof is not base64")?;
    let auth = format!("{},{},{without_proof}", s.client_first_bare, s.server_first);
    let password = s.password.as_deref().unwrap_or("\0no such user\0");
    let salted = salted_password(s.mechanism, password.as_bytes(), SALT, ITERATIONS);
    fn keys<D: Digest + hmac::digest::core_api::BlockSizeUser + Clone>(
        salted: &[u8],
        auth: &[u8],
        proof: &[u8],
    ) -> Option<Vec<u8>> {
        let mac = |key: &[u8], data: &[u8]| {
            let mut m = <SimpleHmac<D> as Mac>::new_from_slice(key).expect("any key length");
            m.update(data);
            m.finalize().into_bytes().to_vec()
        };
        let stored_key = D::digest(mac(salted, b"Client Key")).to_vec();
        let signature = mac(&stored_key, auth);
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        (proof.len() == signature.len() && D::digest(&client_key).to_vec() == stored_key)
            .then(|| mac(&mac(salted, b"Server Key"), auth))
    }
    let verifier = match s.mechanism {
        Mechanism::ScramSha512 => keys::<Sha512>(&salted, auth.as_bytes(), &proof),
        _ => keys::<Sha256>(&salted, auth.as_bytes(), &proof),
    }
    .ok_or("Authentication failed during authentication due to invalid credentials with SASL mechanism")?;
    Ok(format!("v={}", B64.encode(verifier)))
}

// ---------------------------------------------------------------------------------------------
// dory and librdkafka settings
// ---------------------------------------------------------------------------------------------

fn dory_toml(
    pki: &Pki,
    ca: &str,
    sasl: Option<(Mechanism, &str, &str)>,
    client_cert: bool,
) -> String {
    let mut t = format!(
        "[delivery]\ntopic_autocreate = true\n\
         retry_backoff_ms = 200\nretry_backoff_max_ms = 1000\nshutdown_max_delay_ms = 2000\n\
         [kafka.tls]\nca_file = \"{}\"\n",
        pki.path(ca).display()
    );
    if client_cert {
        t += &format!(
            "cert_file = \"{}\"\nkey_file = \"{}\"\n",
            pki.path("client.pem").display(),
            pki.path("client.key").display()
        );
    }
    if let Some((m, user, password)) = sasl {
        // The password through a file, as an operator would keep it.
        let file = pki.path(&format!("password-{user}"));
        fs::write(&file, format!("{password}\n")).expect("write password file");
        t += &format!(
            "[kafka.sasl]\nmechanism = \"{}\"\nusername = \"{user}\"\npassword_file = \"{}\"\n",
            m.name(),
            file.display()
        );
    }
    t
}

/// librdkafka settings for the same security as dory's.
fn rdkafka_config(
    bootstrap: &str,
    pki: &Pki,
    sasl: Option<(Mechanism, &str, &str)>,
    client_cert: bool,
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set(
            "ssl.ca.location",
            pki.path("ca.pem").to_string_lossy().as_ref(),
        )
        .set("ssl.endpoint.identification.algorithm", "https");
    match sasl {
        Some((m, user, password)) => {
            c.set("security.protocol", "SASL_SSL")
                .set("sasl.mechanisms", m.name())
                .set("sasl.username", user)
                .set("sasl.password", password);
        }
        None => {
            c.set("security.protocol", "SSL");
        }
    }
    if client_cert {
        c.set(
            "ssl.certificate.location",
            pki.path("client.pem").to_string_lossy().as_ref(),
        )
        .set(
            "ssl.key.location",
            pki.path("client.key").to_string_lossy().as_ref(),
        );
    }
    c
}

/// Reads every partition of `topic` from the beginning until `expected` values arrived
/// (then a short grace poll for extras). Returns the values.
fn consume_secure(config: &ClientConfig, topic: &str, expected: usize) -> Vec<String> {
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", "dory-security-test")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("check.crcs", "true")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("create consumer");
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(20))
        .expect("metadata over TLS");
    let partitions = md.topics()[0].partitions().len();
    assert!(partitions > 0, "topic {topic} has no partitions");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p as i32, Offset::Beginning)
            .expect("add partition");
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    let mut grace: Option<Instant> = None;
    while Instant::now() < deadline && grace.is_none_or(|g| Instant::now() < g) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                out.push(String::from_utf8_lossy(m.payload().unwrap_or(b"")).into_owned())
            }
            Some(Err(e)) => panic!("consumer error after {} records: {e}", out.len()),
            None => {}
        }
        if out.len() >= expected && grace.is_none() {
            grace = Some(Instant::now() + Duration::from_millis(500));
        }
    }
    out
}

/// Sends `n` messages to `topic`; with `spread`, message i goes to partition i % spread.
fn send_to(dory: &Dory, topic: &str, n: usize, tag: &str, spread: Option<i32>) -> Vec<String> {
    let sender = DgramSender::new(dory.dgram_path());
    let values: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
    for (i, v) in values.iter().enumerate() {
        sender.send(&match spread {
            None => encode_any_partition(topic, now_ms(), b"", v.as_bytes()),
            Some(p) => encode_partition_key(i as i32 % p, topic, now_ms(), b"", v.as_bytes()),
        });
    }
    values
}

fn send(dory: &Dory, topic: &str, n: usize, tag: &str) -> Vec<String> {
    send_to(dory, topic, n, tag, None)
}

/// `dory_broker_connection_errors_total` by kind.
fn connection_errors(dory: &Dory) -> BTreeMap<String, u64> {
    let (_, text) = dory.http_get("/metrics");
    text.lines()
        .filter_map(|l| l.strip_prefix("dory_broker_connection_errors_total{kind=\""))
        .filter_map(|l| {
            let (kind, v) = l.split_once("\"} ")?;
            Some((kind.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Delivers `N` messages over SASL_SSL and reads them back with librdkafka over SASL_SSL.
fn deliver_over_sasl_ssl(mechanism: Mechanism, client_cert: bool) {
    let pki = Pki::new();
    let (user, password) = ("alice", "correct horse battery staple");
    let broker = SecureTansu::start(&pki, Auth::Gate(&[(user, password)]), client_cert);
    let sasl = Some((mechanism, user, password));
    let mut args = DoryArgs::new([broker.bootstrap()]);
    args.config_toml = Some(dory_toml(&pki, "ca.pem", sasl, client_cert));
    let mut dory = Dory::start(args);
    dory.wait_ready();
    let topic = format!("secure-{}", mechanism.name().to_lowercase());
    let sent = send(&dory, &topic, N, "v");
    let m = dory.wait_drained(TIMEOUT);
    assert_eq!(m.delivered(&topic), N as u64, "{}", dory.logs());
    assert_eq!(m.discarded_total(&topic), 0);
    let logs = dory.logs();
    assert!(
        !logs.contains(password),
        "the password reached the log:\n{logs}"
    );
    let (_, info) = dory.http_get("/server_info");
    assert!(
        !info.contains(password),
        "the password is on /server_info: {info}"
    );

    let mut got = consume_secure(
        &rdkafka_config(&broker.bootstrap(), &pki, sasl, client_cert),
        &topic,
        N,
    );
    got.sort();
    let mut want = sent;
    want.sort();
    assert_eq!(
        got, want,
        "librdkafka over SASL_SSL reads back what dory delivered"
    );
    println!(
        "{} over TLS{}: dory delivered {N}, librdkafka read back {} over SASL_SSL",
        mechanism.name(),
        if client_cert {
            " with a client certificate"
        } else {
            ""
        },
        got.len()
    );
    assert!(dory.terminate(TIMEOUT).success());
}

#[test]
fn sasl_ssl_scram_sha256_delivers() {
    deliver_over_sasl_ssl(Mechanism::ScramSha256, false);
}

#[test]
fn sasl_ssl_scram_sha512_with_client_certificate_delivers() {
    deliver_over_sasl_ssl(Mechanism::ScramSha512, true);
}

#[test]
fn sasl_ssl_plain_delivers() {
    deliver_over_sasl_ssl(Mechanism::Plain, false);
}

/// A broker that refuses dory: nothing delivered, the reason logged (naming the broker),
/// counted and on `/health`, no crash loop; SIGTERM ends it with everything accounted.
fn refused(dory_toml: String, bootstrap: &str, kind: &str, log_needle: &str) {
    let mut args = DoryArgs::new([bootstrap]);
    args.config_toml = Some(dory_toml);
    let mut dory = Dory::start(args);
    let (code, health) = poll_until("/health to name the refusal", TIMEOUT, || {
        let (code, body) = dory.http_get_result("/health").map_err(|e| e.to_string())?;
        if code == 503 && body.contains(log_needle) {
            Ok((code, body))
        } else {
            Err(format!("{code} {body}"))
        }
    });
    let topic = "refused";
    send(&dory, topic, 20, "x");
    // Long enough for several attempts: they are spaced by backoff, not a tight loop.
    std::thread::sleep(Duration::from_secs(4));
    assert!(dory.try_exit().is_none(), "dory exited:\n{}", dory.logs());
    let errors = connection_errors(&dory);
    let n = errors.get(kind).copied().unwrap_or(0);
    assert!(n > 0, "no {kind} error counted: {errors:?}");
    assert!(
        n < 100,
        "{n} {kind} errors in seconds: no backoff? {errors:?}"
    );
    let m = dory.metrics();
    assert_eq!(m.delivered(topic), 0);
    let logs = dory.logs();
    let line = logs
        .lines()
        .find(|l| l.contains(log_needle))
        .unwrap_or_else(|| panic!("no log line with {log_needle:?}:\n{logs}"));
    println!("{kind} refusal:\n  log: {line}\n  /health: {code} {}\n  dory_broker_connection_errors_total: {errors:?}", health.trim_end().replace('\n', " | "));
    assert!(dory.terminate(TIMEOUT).success());
}

/// dory with `sasl` and trusting `ca` against Tansu behind `auth`: refused, as `refused`
/// checks, with log lines starting `what` and the broker's address.
fn refused_by(auth: Auth<'_>, ca: &str, sasl: (Mechanism, &str, &str), kind: &str, what: &str) {
    let pki = Pki::new();
    let broker = SecureTansu::start(&pki, auth, false);
    let bootstrap = broker.bootstrap();
    refused(
        dory_toml(&pki, ca, Some(sasl), false),
        &bootstrap,
        kind,
        &format!("{what} {bootstrap}"),
    );
}

#[test]
fn wrong_password_fails_cleanly() {
    refused_by(
        Auth::Gate(&[("alice", "the right one")]),
        "ca.pem",
        (Mechanism::ScramSha256, "alice", "a wrong one"),
        "auth",
        "cannot authenticate to broker",
    );
}

#[test]
fn tansu_refusing_authentication_fails_cleanly() {
    refused_by(
        Auth::Tansu,
        "ca.pem",
        (Mechanism::ScramSha512, "alice", "any"),
        "auth",
        "cannot authenticate to broker",
    );
}

#[test]
fn untrusted_certificate_fails_cleanly() {
    refused_by(
        Auth::Gate(&[("alice", "pw")]),
        "rogue-ca.pem",
        (Mechanism::Plain, "alice", "pw"),
        "tls",
        "no TLS connection to broker",
    );
}

// ---------------------------------------------------------------------------------------------
// Three mock brokers behind stunnel
// ---------------------------------------------------------------------------------------------

/// Three mock brokers, broker i+1 reachable over TLS only at `tls_ports[i]` (stunnel) and
/// advertising it, with topic `topic` of 6 partitions, partition p led by broker p % 3 + 1.
/// Broker `rogue` (if any) shows a certificate from a CA dory does not trust.
struct MockTls {
    stunnel: Stunnel,
    tls_ports: Vec<u16>,
    // Dropped last: the cluster lives as long as this client.
    _owner: BaseProducer,
}

impl MockTls {
    fn start(pki: &Pki, topic: &str, rogue: Option<usize>) -> MockTls {
        use rdkafka::bindings as rd;
        // A mock cluster owned by a client handle, so its C handle is reachable: the
        // harness's `Mock` does not expose it, and the mock must advertise stunnel's ports.
        let owner: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", "3")
            .create()
            .expect("mock cluster");
        // SAFETY: `owner` is a live client created with test.mock.num.brokers, so it has a
        // mock cluster, valid as long as `owner` (kept in the returned value).
        let cluster = unsafe { rd::rd_kafka_handle_mock_cluster(owner.client().native_ptr()) };
        assert!(!cluster.is_null());
        // SAFETY: as above; the string is owned by the cluster and copied at once.
        let plain =
            unsafe { std::ffi::CStr::from_ptr(rd::rd_kafka_mock_cluster_bootstraps(cluster)) }
                .to_string_lossy()
                .into_owned();
        let plain_ports: Vec<u16> = plain
            .split(',')
            .map(|a| {
                a.rsplit_once(':')
                    .and_then(|(_, p)| p.parse().ok())
                    .expect("host:port")
            })
            .collect();
        assert_eq!(plain_ports.len(), 3, "{plain}");
        let tls_ports: Vec<u16> = plain_ports.iter().map(|_| free_port()).collect();
        let routes: Vec<(u16, u16, &str)> = (0..3)
            .map(|i| {
                let cert = if rogue == Some(i) {
                    "rogue-server"
                } else {
                    "server"
                };
                (tls_ports[i], plain_ports[i], cert)
            })
            .collect();
        let stunnel = Stunnel::start_with(pki, &routes, false);
        let host = std::ffi::CString::new("127.0.0.1").expect("no NUL");
        let topic_c = std::ffi::CString::new(topic).expect("no NUL");
        // SAFETY: as above; the strings are NUL-terminated and copied by librdkafka.
        unsafe {
            for (i, port) in tls_ports.iter().enumerate() {
                rd::rd_kafka_mock_broker_set_host_port(
                    cluster,
                    i as i32 + 1,
                    host.as_ptr(),
                    i32::from(*port),
                );
            }
            let err = rd::rd_kafka_mock_topic_create(cluster, topic_c.as_ptr(), 6, 3);
            assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
            for p in 0..6 {
                rd::rd_kafka_mock_partition_set_leader(cluster, topic_c.as_ptr(), p, p % 3 + 1);
            }
        }
        MockTls {
            stunnel,
            tls_ports,
            _owner: owner,
        }
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.tls_ports[0])
    }

    fn dory(&self, pki: &Pki) -> Dory {
        let mut args = DoryArgs::new([self.bootstrap()]);
        // Checked against the name, not the IP: the certificate lists both.
        args.config_toml =
            Some(dory_toml(pki, "ca.pem", None, false) + "server_name = \"localhost\"\n");
        Dory::start(args)
    }
}

#[test]
fn multi_broker_tls_through_stunnel() {
    let pki = Pki::new();
    let topic = "tls-multi";
    let mock = MockTls::start(&pki, topic, None);
    let mut dory = mock.dory(&pki);
    dory.wait_ready();
    // Every partition, so every broker, gets messages.
    let sent = send_to(&dory, topic, N, "m", Some(6));
    let m = dory.wait_drained(TIMEOUT);
    assert_eq!(m.delivered(topic), N as u64, "{}", dory.logs());
    let used = mock.stunnel.services_used();
    assert_eq!(used.len(), 3, "TLS to every broker expected: {used:?}");
    let config = rdkafka_config(&mock.bootstrap(), &pki, None, false);
    let mut got = consume_secure(&config, topic, N);
    got.sort();
    let mut want = sent;
    want.sort();
    assert_eq!(got, want);
    println!(
        "3 mock brokers behind stunnel: dory delivered {N} over TLS to 6 partitions, \
         librdkafka read back {}",
        got.len()
    );
    assert!(dory.terminate(TIMEOUT).success());
}

/// One broker of three shows an untrusted certificate: its dispatcher logs and counts the
/// refusal, the other brokers deliver, `/health` stays 200 (brokers are usable), and the
/// messages for the refusing broker's partitions wait, then end as counted discards.
#[test]
fn one_untrusted_broker_is_refused_by_its_dispatcher() {
    let pki = Pki::new();
    let topic = "tls-one-rogue";
    let mock = MockTls::start(&pki, topic, Some(1));
    let mut dory = mock.dory(&pki);
    dory.wait_ready();
    send_to(&dory, topic, 60, "r", Some(6));
    let needle = format!(
        "no TLS connection to broker 2 (127.0.0.1:{})",
        mock.tls_ports[1]
    );
    let line = poll_until("the dispatcher's log line", TIMEOUT, || {
        dory.logs()
            .lines()
            .find(|l| l.contains(&needle))
            .map(str::to_owned)
            .ok_or_else(|| "not yet".to_string())
    });
    // Partitions 0, 2, 3, 5 are led by brokers 1 and 3.
    dory.wait_metrics("the other brokers' messages delivered", TIMEOUT, |m| {
        if m.delivered(topic) == 40 {
            Ok(())
        } else {
            Err(format!("delivered {}", m.delivered(topic)))
        }
    });
    let errors = connection_errors(&dory);
    assert!(errors["tls"] > 0, "{errors:?}");
    let (code, health) = dory.http_get("/health");
    assert_eq!(code, 200, "{health}");
    println!("one rogue broker of three:\n  log: {line}\n  /health: {code} {}\n  dory_broker_connection_errors_total: {errors:?}", health.trim_end());
    let m = dory.assert_invariant();
    assert_eq!(m.in_flight(topic), 20, "broker 2's partitions wait");
    assert!(dory.terminate(TIMEOUT).success());
    let logs = dory.logs();
    assert!(
        logs.contains("received 60, delivered 40, discarded [shutdown=20]"),
        "{logs}"
    );
}

#[test]
fn config_errors_name_the_setting() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |toml: &str| {
        let path = dir.path().join("bad.toml");
        fs::write(&path, toml).expect("write config");
        let out = run_command(
            Command::new(dory_bin())
                .arg("--broker")
                .arg("127.0.0.1:9")
                .arg("--config")
                .arg(&path),
            Duration::from_secs(20),
        );
        assert!(!out.status.success(), "{toml}: started");
        out.stderr
    };
    let ca = pki.path("ca.pem").display().to_string();
    for (toml, want) in [
        ("[kafka.tls]\nca_file = \"/nonexistent/ca.pem\"\n".to_string(), "kafka.tls.ca_file"),
        (format!("[kafka.tls]\nca_file = \"{}\"\n", pki.path("server.key").display()), "kafka.tls.ca_file"),
        (format!("[kafka.tls]\nca_file = \"{ca}\"\ncert_file = \"{}\"\n", pki.path("client.pem").display()), "kafka.tls.key_file"),
        (format!("[kafka.tls]\nca_file = \"{ca}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n", pki.path("client.pem").display(), pki.path("server.key").display()), "kafka.tls.key_file"),
        ("[kafka.sasl]\nmechanism = \"GSSAPI\"\nusername = \"u\"\npassword = \"p\"\n".to_string(), "kafka.sasl.mechanism"),
        ("[kafka.sasl]\nmechanism = \"PLAIN\"\nusername = \"u\"\n".to_string(), "kafka.sasl.password"),
        ("[kafka.sasl]\nmechanism = \"PLAIN\"\nusername = \"u\"\npassword_file = \"/nonexistent\"\n".to_string(), "kafka.sasl.password_file"),
    ] {
        let toml = format!("[input]\ndgram_socket = \"{}\"\n{toml}", dir.path().join("d.sock").display());
        let err = run(&toml);
        assert!(err.contains(want), "{toml}\n-> {err}");
        assert!(!err.contains("\"p\""), "{err}");
    }
}
