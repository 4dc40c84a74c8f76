//! SASL for broker connections: the PLAIN message, the SCRAM-SHA-256/512 client (RFC 5802,
//! RFC 7677), and the SaslHandshake and SaslAuthenticate requests (through the
//! `kafka-protocol` crate, as in `control.rs`). Pure: bytes in, bytes out; the exchange itself
//! runs in `connection.rs`. Server messages are untrusted input: the parsers here are fuzzed
//! (`fuzz/fuzz_targets/scram.rs`).

use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::digest::core_api::BlockSizeUser;
use hmac::digest::Digest;
use hmac::{Mac, SimpleHmac};
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use sha2::{Sha256, Sha512};

use super::control::{self, ControlError};
use super::VersionRange;

pub const API_KEY_SASL_HANDSHAKE: i16 = 17;
pub const API_KEY_SASL_AUTHENTICATE: i16 = 36;
/// SaslHandshake v1 (Kafka 1.0+) announces that the tokens travel inside SaslAuthenticate;
/// v0's raw tokens on the socket are not spoken.
pub const SASL_HANDSHAKE_VERSIONS: VersionRange = VersionRange { min: 1, max: 1 };
/// v1 adds the session lifetime (ignored: dory reconnects when the broker closes), v2 is
/// the flexible encoding.
pub const SASL_AUTHENTICATE_VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };
/// Kafka accepts 4096 to 16384 iterations; anything far above is a server making us burn CPU.
pub const MAX_SCRAM_ITERATIONS: u32 = 100_000;

/// A SASL mechanism dory can authenticate with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 3] = [
        Mechanism::Plain,
        Mechanism::ScramSha256,
        Mechanism::ScramSha512,
    ];

    /// The name as Kafka spells it (and as the config file does).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    pub fn parse(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// A password: `Debug` and `Display` print `***`, so it cannot reach a log line or a status
/// page by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Secret {
        Secret(s)
    }
    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// What a connection authenticates with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub mechanism: Mechanism,
    pub username: String,
    pub password: Secret,
}

/// A SCRAM exchange that cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    #[error("malformed SCRAM server-first-message: {0}")]
    BadServerFirst(&'static str),
    #[error("the server's SCRAM nonce does not extend ours")]
    NonceMismatch,
    #[error("the server asks for {0} SCRAM iterations (1..={MAX_SCRAM_ITERATIONS} accepted)")]
    Iterations(u64),
    #[error("the server refused the SCRAM proof: {0}")]
    ServerError(String),
    #[error("malformed SCRAM server-final-message")]
    BadServerFinal,
    #[error("the server's SCRAM signature does not match: it does not know the password")]
    BadServerSignature,
}

/// The PLAIN message (RFC 4616): no authorization id, the username, the password.
pub fn plain_message(username: &str, password: &Secret) -> Vec<u8> {
    let mut m = Vec::with_capacity(2 + username.len() + password.0.len());
    m.push(0);
    m.extend_from_slice(username.as_bytes());
    m.push(0);
    m.extend_from_slice(password.0.as_bytes());
    m
}

/// `saslname` of RFC 5802: `=` and `,` escaped.
fn sasl_name(username: &str) -> String {
    username.replace('=', "=3D").replace(',', "=2C")
}

/// The fields of a server-first-message.
#[derive(Debug, PartialEq, Eq)]
pub struct ServerFirst<'a> {
    pub nonce: &'a str,
    pub salt: Vec<u8>,
    pub iterations: u32,
}

/// Parses `r=<nonce>,s=<salt>,i=<iterations>[,extensions]`. A mandatory extension (`m=`) is
/// refused, as RFC 5802 requires of a client that knows none.
pub fn parse_server_first(msg: &[u8]) -> Result<ServerFirst<'_>, ScramError> {
    let text = std::str::from_utf8(msg).map_err(|_| ScramError::BadServerFirst("not UTF-8"))?;
    let mut fields = text.split(',');
    let mut field = |key: &'static str, what: &'static str| {
        fields
            .next()
            .and_then(|f| f.strip_prefix(key))
            .ok_or(ScramError::BadServerFirst(what))
    };
    let nonce = field("r=", "no nonce (r=) first")?;
    let salt = field("s=", "no salt (s=) second")?;
    let iterations = field("i=", "no iteration count (i=) third")?;
    if nonce.is_empty()
        || !nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(ScramError::BadServerFirst("nonce is not printable"));
    }
    let salt = B64
        .decode(salt)
        .map_err(|_| ScramError::BadServerFirst("salt is not base64"))?;
    if salt.is_empty() {
        return Err(ScramError::BadServerFirst("empty salt"));
    }
    if iterations.is_empty() || !iterations.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ScramError::BadServerFirst(
            "iteration count is not a number",
        ));
    }
    let n: u64 = iterations.parse().unwrap_or(u64::MAX);
    let iterations = u32::try_from(n)
        .ok()
        .filter(|i| (1..=MAX_SCRAM_ITERATIONS).contains(i))
        .ok_or(ScramError::Iterations(n))?;
    Ok(ServerFirst {
        nonce,
        salt,
        iterations,
    })
}

/// What a server-final-message says.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerFinal {
    /// `v=`: the server's signature.
    Verifier(Vec<u8>),
    /// `e=`: the server's reason for refusing.
    Error(String),
}

/// Parses `v=<base64>[,extensions]` or `e=<error>[,extensions]`.
pub fn parse_server_final(msg: &[u8]) -> Result<ServerFinal, ScramError> {
    let text = std::str::from_utf8(msg).map_err(|_| ScramError::BadServerFinal)?;
    let first = text.split(',').next().unwrap_or("");
    if let Some(e) = first.strip_prefix("e=") {
        // The server's words go into a log line: bounded, printable.
        let e: String = e.chars().take(200).filter(|c| !c.is_control()).collect();
        return Ok(ServerFinal::Error(e));
    }
    let v = first.strip_prefix("v=").ok_or(ScramError::BadServerFinal)?;
    B64.decode(v)
        .map(ServerFinal::Verifier)
        .map_err(|_| ScramError::BadServerFinal)
}

/// The client side of one SCRAM exchange, after client-first-message was sent.
pub struct ScramClient {
    mechanism: Mechanism,
    password: Secret,
    client_nonce: String,
    client_first_bare: String,
}

/// Checks the server-final-message of an exchange.
pub struct ScramVerifier {
    server_signature: Vec<u8>,
}

impl ScramClient {
    /// Starts an exchange with `nonce_bytes` of fresh randomness (base64 makes them a
    /// printable nonce without commas). `mechanism` must be a SCRAM one.
    pub fn new(
        mechanism: Mechanism,
        username: &str,
        password: &Secret,
        nonce_bytes: &[u8],
    ) -> ScramClient {
        ScramClient::with_nonce(mechanism, username, password, B64.encode(nonce_bytes))
    }

    fn with_nonce(
        mechanism: Mechanism,
        username: &str,
        password: &Secret,
        client_nonce: String,
    ) -> ScramClient {
        let client_first_bare = format!("n={},r={client_nonce}", sasl_name(username));
        ScramClient {
            mechanism,
            password: password.clone(),
            client_nonce,
            client_first_bare,
        }
    }

    /// client-first-message: no channel binding, no authorization id.
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// Answers the server-first-message with client-final-message (carrying the proof) and
    /// returns what checks the server's final answer.
    pub fn client_final(self, server_first: &[u8]) -> Result<(Vec<u8>, ScramVerifier), ScramError> {
        let sf = parse_server_first(server_first)?;
        if sf.nonce.len() <= self.client_nonce.len() || !sf.nonce.starts_with(&self.client_nonce) {
            return Err(ScramError::NonceMismatch);
        }
        // "biws" is base64 of the gs2 header "n,,".
        let without_proof = format!("c=biws,r={}", sf.nonce);
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare,
            // Checked UTF-8 by the parser.
            String::from_utf8_lossy(server_first)
        );
        let password = self.password.expose().as_bytes();
        let (proof, server_signature) = match self.mechanism {
            Mechanism::ScramSha512 => {
                scram_proof::<Sha512>(password, &sf.salt, sf.iterations, auth_message.as_bytes())
            }
            // PLAIN never gets here; SHA-256 is the safe reading of anything else.
            _ => scram_proof::<Sha256>(password, &sf.salt, sf.iterations, auth_message.as_bytes()),
        };
        let message = format!("{without_proof},p={}", B64.encode(proof));
        Ok((message.into_bytes(), ScramVerifier { server_signature }))
    }
}

impl ScramVerifier {
    /// Accepts the server-final-message only if it proves the server knows the password.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), ScramError> {
        match parse_server_final(server_final)? {
            ServerFinal::Error(e) => Err(ScramError::ServerError(e)),
            ServerFinal::Verifier(v) => {
                // Not secret (the server sent it), so a plain comparison is fine.
                if v == self.server_signature {
                    Ok(())
                } else {
                    Err(ScramError::BadServerSignature)
                }
            }
        }
    }
}

fn hmac<D: Digest + BlockSizeUser + Clone>(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <SimpleHmac<D> as Mac>::new_from_slice(key)
        .expect("invariant: HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// ClientProof and ServerSignature of RFC 5802 §3 for hash `D`.
fn scram_proof<D: Digest + BlockSizeUser + Clone + Sync>(
    password: &[u8],
    salt: &[u8],
    iterations: u32,
    auth_message: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    let mut salted = vec![0u8; <D as Digest>::output_size()];
    pbkdf2::pbkdf2::<SimpleHmac<D>>(password, salt, iterations, &mut salted)
        .expect("invariant: HMAC takes keys of any length");
    let client_key = hmac::<D>(&salted, b"Client Key");
    let stored_key = D::digest(&client_key);
    let client_signature = hmac::<D>(&stored_key, auth_message);
    let proof = client_key
        .iter()
        .zip(&client_signature)
        .map(|(k, s)| k ^ s)
        .collect();
    let server_key = hmac::<D>(&salted, b"Server Key");
    (proof, hmac::<D>(&server_key, auth_message))
}

/// The salted password a SCRAM credential is stored from (for tests that create users).
pub fn salted_password(
    mechanism: Mechanism,
    password: &[u8],
    salt: &[u8],
    iterations: u32,
) -> Vec<u8> {
    fn salted<D: Digest + BlockSizeUser + Clone + Sync>(p: &[u8], s: &[u8], i: u32) -> Vec<u8> {
        let mut out = vec![0u8; <D as Digest>::output_size()];
        pbkdf2::pbkdf2::<SimpleHmac<D>>(p, s, i, &mut out)
            .expect("invariant: HMAC takes keys of any length");
        out
    }
    match mechanism {
        Mechanism::ScramSha512 => salted::<Sha512>(password, salt, iterations),
        _ => salted::<Sha256>(password, salt, iterations),
    }
}

/// Appends a SaslHandshake request for `mechanism`.
pub fn encode_handshake(
    buf: &mut Vec<u8>,
    version: i16,
    correlation_id: i32,
    client_id: Option<&str>,
    mechanism: Mechanism,
) -> Result<(), ControlError> {
    let body =
        SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism.name()));
    control::encode_request(
        buf,
        "SaslHandshake",
        API_KEY_SASL_HANDSHAKE,
        version,
        correlation_id,
        client_id,
        &body,
    )
}

/// A SaslHandshake answer: its error code and the mechanisms the broker enables.
pub fn decode_handshake(
    frame: &[u8],
    version: i16,
    correlation_id: i32,
) -> Result<(i16, Vec<String>), ControlError> {
    let r: SaslHandshakeResponse =
        control::decode_response(frame, "SaslHandshake", version, correlation_id)?;
    Ok((
        r.error_code,
        r.mechanisms.iter().map(|m| m.to_string()).collect(),
    ))
}

/// Appends a SaslAuthenticate request carrying `auth_bytes`.
pub fn encode_authenticate(
    buf: &mut Vec<u8>,
    version: i16,
    correlation_id: i32,
    client_id: Option<&str>,
    auth_bytes: &[u8],
) -> Result<(), ControlError> {
    let body = SaslAuthenticateRequest::default().with_auth_bytes(auth_bytes.to_vec().into());
    control::encode_request(
        buf,
        "SaslAuthenticate",
        API_KEY_SASL_AUTHENTICATE,
        version,
        correlation_id,
        client_id,
        &body,
    )
}

/// A SaslAuthenticate answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticateAnswer {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub auth_bytes: Vec<u8>,
}

pub fn decode_authenticate(
    frame: &[u8],
    version: i16,
    correlation_id: i32,
) -> Result<AuthenticateAnswer, ControlError> {
    let r: SaslAuthenticateResponse =
        control::decode_response(frame, "SaslAuthenticate", version, correlation_id)?;
    Ok(AuthenticateAnswer {
        error_code: r.error_code,
        error_message: r.error_message.map(|m| m.to_string()),
        auth_bytes: r.auth_bytes.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::RequestHeader;
    use kafka_protocol::messages::ResponseHeader;
    use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Message};

    fn secret(s: &str) -> Secret {
        Secret::new(s.into())
    }

    /// RFC 7677 §3: the SCRAM-SHA-256 example exchange, byte for byte.
    #[test]
    fn rfc7677_example() {
        let c = ScramClient::with_nonce(
            Mechanism::ScramSha256,
            "user",
            &secret("pencil"),
            "rOprNGfwEbeRWgbNEkqO".into(),
        );
        assert_eq!(c.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let (client_final, verifier) = c
            .client_final(
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                  s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            )
            .unwrap();
        assert_eq!(
            String::from_utf8(client_final).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        verifier
            .verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert_eq!(
            verifier.verify(b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
            Err(ScramError::BadServerSignature)
        );
        assert_eq!(
            verifier.verify(b"e=invalid-proof"),
            Err(ScramError::ServerError("invalid-proof".into()))
        );
    }

    /// A server built from the stored credential (RFC 5802 §3) accepts our proof, for both
    /// hashes, and its signature is what we expect.
    #[test]
    fn sha512_proof_checks_against_stored_key() {
        let salt = b"0123456789abcdef";
        let c =
            ScramClient::with_nonce(Mechanism::ScramSha512, "a=b,c", &secret("pw"), "abc".into());
        assert_eq!(c.client_first(), b"n,,n=a=3Db=2Cc,r=abc");
        let server_first = format!("r=abcdef,s={},i=4096", B64.encode(salt));
        let (cf, verifier) = c.client_final(server_first.as_bytes()).unwrap();
        let cf = String::from_utf8(cf).unwrap();
        let (without_proof, proof) = cf.rsplit_once(",p=").unwrap();
        let proof = B64.decode(proof).unwrap();
        let salted = salted_password(Mechanism::ScramSha512, b"pw", salt, 4096);
        let stored_key = Sha512::digest(hmac::<Sha512>(&salted, b"Client Key"));
        let auth = format!("n=a=3Db=2Cc,r=abc,{server_first},{without_proof}");
        let signature = hmac::<Sha512>(&stored_key, auth.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        assert_eq!(Sha512::digest(&client_key), stored_key);
        let server_key = hmac::<Sha512>(&salted, b"Server Key");
        let v = format!(
            "v={}",
            B64.encode(hmac::<Sha512>(&server_key, auth.as_bytes()))
        );
        verifier.verify(v.as_bytes()).unwrap();
    }

    #[test]
    fn server_first_is_checked() {
        let ok = parse_server_first(b"r=xyz,s=QUJD,i=10,ext=1").unwrap();
        assert_eq!(
            (ok.nonce, &ok.salt[..], ok.iterations),
            ("xyz", &b"ABC"[..], 10)
        );
        for (bad, want) in [
            (&b"m=ext,r=x,s=QUJD,i=1"[..], "no nonce (r=) first"),
            (b"r=x,i=1,s=QUJD", "no salt (s=) second"),
            (b"r=x,s=QUJD", "no iteration count (i=) third"),
            (b"r=x,s=!!,i=1", "salt is not base64"),
            (b"r=x,s=,i=1", "empty salt"),
            (b"r=,s=QUJD,i=1", "nonce is not printable"),
            (b"r=x,s=QUJD,i=-1", "iteration count is not a number"),
            (b"r=\xff,s=QUJD,i=1", "not UTF-8"),
        ] {
            assert_eq!(
                parse_server_first(bad),
                Err(ScramError::BadServerFirst(want))
            );
        }
        assert_eq!(
            parse_server_first(b"r=x,s=QUJD,i=0"),
            Err(ScramError::Iterations(0))
        );
        assert_eq!(
            parse_server_first(b"r=x,s=QUJD,i=99999999999999999999999"),
            Err(ScramError::Iterations(u64::MAX))
        );
        let c = ScramClient::with_nonce(Mechanism::ScramSha256, "u", &secret("p"), "abc".into());
        assert_eq!(
            c.client_final(b"r=abd123,s=QUJD,i=1").err(),
            Some(ScramError::NonceMismatch)
        );
        let c = ScramClient::with_nonce(Mechanism::ScramSha256, "u", &secret("p"), "abc".into());
        assert_eq!(
            c.client_final(b"r=abc,s=QUJD,i=1").err(),
            Some(ScramError::NonceMismatch),
            "the server must add its own part"
        );
    }

    #[test]
    fn server_final_errors_are_bounded() {
        let long = format!("e={}\n", "x".repeat(1000));
        match parse_server_final(long.as_bytes()).unwrap() {
            ServerFinal::Error(e) => assert_eq!(e.len(), 200),
            v => panic!("{v:?}"),
        }
        assert_eq!(parse_server_final(b"x=1"), Err(ScramError::BadServerFinal));
        assert_eq!(parse_server_final(b"v=!"), Err(ScramError::BadServerFinal));
    }

    #[test]
    fn secrets_do_not_print() {
        let c = Credentials {
            mechanism: Mechanism::Plain,
            username: "alice".into(),
            password: secret("hunter2"),
        };
        let shown = format!("{c:?} {}", c.password);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
        assert_eq!(plain_message("alice", &c.password), b"\0alice\0hunter2");
    }

    #[test]
    fn mechanism_names() {
        for m in Mechanism::ALL {
            assert_eq!(Mechanism::parse(m.name()), Some(m));
        }
        assert_eq!(Mechanism::parse("scram-sha-256"), None);
    }

    #[test]
    fn requests_round_trip_and_answers_decode() {
        let mut buf = Vec::new();
        encode_handshake(&mut buf, 1, 2, Some("dory"), Mechanism::ScramSha512).unwrap();
        let mut body = &buf[4..];
        let h = RequestHeader::decode(&mut body, SaslHandshakeRequest::header_version(1)).unwrap();
        assert_eq!(
            (h.request_api_key, h.correlation_id),
            (API_KEY_SASL_HANDSHAKE, 2)
        );
        let r = SaslHandshakeRequest::decode(&mut body, 1).unwrap();
        assert_eq!(r.mechanism.as_str(), "SCRAM-SHA-512");
        for version in SASL_AUTHENTICATE_VERSIONS.min..=SASL_AUTHENTICATE_VERSIONS.max {
            let mut buf = Vec::new();
            encode_authenticate(&mut buf, version, 3, None, b"n,,n=u,r=x").unwrap();
            let mut body = &buf[4..];
            RequestHeader::decode(&mut body, SaslAuthenticateRequest::header_version(version))
                .unwrap();
            let r = SaslAuthenticateRequest::decode(&mut body, version).unwrap();
            assert_eq!(&r.auth_bytes[..], b"n,,n=u,r=x");
            assert!(body.is_empty());

            let mut frame = Vec::new();
            ResponseHeader::default()
                .with_correlation_id(3)
                .encode(
                    &mut frame,
                    SaslAuthenticateResponse::header_version(version),
                )
                .unwrap();
            SaslAuthenticateResponse::default()
                .with_error_code(58)
                .with_error_message(Some(StrBytes::from_static_str("bad")))
                .encode(&mut frame, version)
                .unwrap();
            let a = decode_authenticate(&frame, version, 3).unwrap();
            assert_eq!(a.error_code, 58);
            assert_eq!(a.error_message.as_deref(), Some("bad"));
            for cut in 0..frame.len() {
                assert!(decode_authenticate(&frame[..cut], version, 3).is_err());
            }
        }
        const { assert!(SaslAuthenticateRequest::VERSIONS.max >= SASL_AUTHENTICATE_VERSIONS.max) };
    }
}
