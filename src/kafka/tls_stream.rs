//! TLS under a connection: the bytes on the wire are a plain `TcpStream` or a rustls
//! session over one. A rustls session cannot be cloned, so the handles of one connection
//! (one writing, one reading) share it behind a mutex, each with its own handle on the
//! socket. The lock is held only to move bytes in or out of the session, never across a
//! blocking socket call: the writer seals plaintext into records under the lock and writes
//! them after; the reader reads ciphertext without the lock and decrypts under it. A second
//! lock orders the writes of sealed records.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::ClientConnection;

use super::connection::{ConnError, TlsClient};

/// Ciphertext read from the socket at a time (a TLS record is at most ~16 KiB).
const TLS_READ_BUF: usize = 32 * 1024;
/// Plaintext sealed per lock of the session while writing.
const TLS_WRITE_CHUNK: usize = 64 * 1024;

/// The bytes on the wire.
#[derive(Debug)]
pub(super) enum Stream {
    Plain(TcpStream),
    Tls(TlsStream),
}

impl Stream {
    pub(super) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    pub(super) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Plain(s) => Stream::Plain(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(s.try_clone()?),
        })
    }
}

/// What the handles of one TLS connection share.
pub(super) struct TlsShared {
    session: Mutex<ClientConnection>,
    /// Held from taking sealed records out of the session until they are on the socket, so
    /// records reach the wire in the order the session sealed them (TLS numbers them).
    write_order: Mutex<()>,
}

/// One handle on a TLS connection: its own socket handle and buffers, the session shared.
pub(super) struct TlsStream {
    pub(super) sock: TcpStream,
    shared: Arc<TlsShared>,
    /// Sealed records taken from the session, to be written (writer side).
    out: Vec<u8>,
    /// Ciphertext read from the socket and not yet given to the session (reader side).
    raw: Vec<u8>,
    raw_start: usize,
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("sock", &self.sock)
            .finish()
    }
}

pub(super) fn poisoned() -> io::Error {
    io::Error::other("a thread panicked while holding the TLS session")
}

impl TlsStream {
    /// Runs the TLS handshake on `sock`, with `timeout` on each read and write.
    pub(super) fn handshake(
        sock: TcpStream,
        tls: &TlsClient,
        host: &str,
        timeout: Duration,
    ) -> Result<TlsStream, ConnError> {
        let name = match &tls.server_name {
            Some(n) => n.clone(),
            None => ServerName::try_from(host.to_owned()).map_err(|e| {
                ConnError::Tls(format!(
                    "`{host}` cannot be checked against a certificate: {e}"
                ))
            })?,
        };
        let mut session = ClientConnection::new(tls.config.clone(), name)
            .map_err(|e| ConnError::Tls(e.to_string()))?;
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let mut io = &sock;
        while session.is_handshaking() || session.wants_write() {
            session
                .complete_io(&mut io)
                .map_err(|e| ConnError::Tls(format!("handshake: {e}")))?;
        }
        sock.set_read_timeout(None)?;
        sock.set_write_timeout(None)?;
        Ok(TlsStream {
            sock,
            shared: Arc::new(TlsShared {
                session: Mutex::new(session),
                write_order: Mutex::new(()),
            }),
            out: Vec::new(),
            raw: Vec::new(),
            raw_start: 0,
        })
    }

    pub(super) fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream {
            sock: self.sock.try_clone()?,
            shared: self.shared.clone(),
            out: Vec::new(),
            raw: Vec::new(),
            raw_start: 0,
        })
    }

    fn session(&self) -> io::Result<MutexGuard<'_, ClientConnection>> {
        self.shared.session.lock().map_err(|_| poisoned())
    }

    /// Takes every sealed record out of the session into `out`. Call with `write_order` held.
    fn drain(session: &mut ClientConnection, out: &mut Vec<u8>) -> io::Result<()> {
        out.clear();
        while session.wants_write() {
            session.write_tls(out)?;
        }
        Ok(())
    }

    /// Seals `bytes` and writes the records, a chunk per lock of the session.
    pub(super) fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        let _order = self.shared.write_order.lock().map_err(|_| poisoned())?;
        let mut out = std::mem::take(&mut self.out);
        let result = (|| {
            while !bytes.is_empty() {
                {
                    let mut session = self.session()?;
                    let n = session
                        .writer()
                        .write(&bytes[..bytes.len().min(TLS_WRITE_CHUNK)])?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::WriteZero,
                            "the TLS session takes no more data",
                        ));
                    }
                    bytes = &bytes[n..];
                    TlsStream::drain(&mut session, &mut out)?;
                }
                (&self.sock).write_all(&out)?;
            }
            Ok(())
        })();
        self.out = out;
        result
    }

    /// Writes what the session wants to send after reading (a key update, an alert), unless
    /// the writer is busy: then its next write takes it along.
    fn flush_pending(&mut self) -> io::Result<()> {
        let Ok(_order) = self.shared.write_order.try_lock() else {
            return Ok(());
        };
        let mut out = std::mem::take(&mut self.out);
        TlsStream::drain(&mut *self.session()?, &mut out)?;
        let result = (&self.sock).write_all(&out);
        self.out = out;
        result
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let wants_write = {
                // The field, not `self.session()`: `raw_start` changes under the lock.
                let mut session = self.shared.session.lock().map_err(|_| poisoned())?;
                match session.reader().read(buf) {
                    // 0: the broker closed the session cleanly (close_notify).
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.raw_start < self.raw.len() {
                    let n = session.read_tls(&mut &self.raw[self.raw_start..])?;
                    self.raw_start += n;
                    session
                        .process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    if n == 0 {
                        // Only an empty input reads 0; never drop ciphertext unread.
                        return Err(io::Error::other("the TLS session refused ciphertext"));
                    }
                    continue;
                }
                session.wants_write()
            };
            if wants_write {
                self.flush_pending()?;
            }
            // The session needs more ciphertext: read it without holding the lock.
            self.raw.resize(TLS_READ_BUF, 0);
            self.raw_start = 0;
            let n = loop {
                match (&self.sock).read(&mut self.raw) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.raw.clear();
                        return Err(e);
                    }
                    Ok(n) => break n,
                }
            };
            self.raw.truncate(n);
            if n == 0 {
                // End of stream: the session says whether that was clean (close_notify read,
                // `Ok(0)` above) or a truncation (`UnexpectedEof`).
                let mut session = self.session()?;
                session.read_tls(&mut &[][..])?;
                session
                    .process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                return match session.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the broker closed the connection inside a TLS record",
                    )),
                    other => other,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::connection::tests::framed;
    use super::super::connection::{read_frame, Connection, Security, SecurityFailure};
    use super::*;
    use rustls::ClientConfig;
    use std::net::TcpListener;
    use std::thread;

    /// A CA and a server certificate for `names` it signed: (CA DER, cert DER, key DER).
    fn test_pki(names: &[&str]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        (ca.der().to_vec(), cert.der().to_vec(), key.serialize_der())
    }

    /// A TLS echo server: answers every frame with the same frame, until the client leaves.
    fn tls_echo_server(cert: Vec<u8>, key: Vec<u8>) -> (u16, thread::JoinHandle<usize>) {
        use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert)],
            PrivatePkcs8KeyDer::from(key).into(),
        )
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let session = rustls::ServerConnection::new(Arc::new(config)).unwrap();
            let mut tls = rustls::StreamOwned::new(session, sock);
            let mut frame = Vec::new();
            let mut echoed = 0;
            while read_frame(&mut tls, &mut frame, 1 << 24).is_ok() {
                if tls.write_all(&framed(&frame)).is_err() {
                    break;
                }
                echoed += 1;
            }
            echoed
        });
        (port, handle)
    }

    fn tls_security(ca: &[u8], server_name: Option<&str>) -> Security {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(ca.to_vec()))
            .unwrap();
        let config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        Security {
            tls: Some(TlsClient {
                config: Arc::new(config),
                server_name: server_name.map(|n| ServerName::try_from(n.to_owned()).unwrap()),
            }),
            sasl: None,
        }
    }

    /// One thread writes frames (some larger than a TLS write chunk) while another reads the
    /// echoes on a clone of the same TLS connection: every frame comes back intact, in order.
    #[test]
    fn tls_clones_write_and_read_concurrently() {
        let (ca, cert, key) = test_pki(&["localhost"]);
        let (port, server) = tls_echo_server(cert, key);
        let mut conn = Connection::connect(
            "localhost",
            port,
            Duration::from_secs(5),
            &tls_security(&ca, None),
        )
        .or_else(|_| {
            // "localhost" may resolve to ::1 first; the certificate names it either way.
            Connection::connect(
                "127.0.0.1",
                port,
                Duration::from_secs(5),
                &tls_security(&ca, Some("localhost")),
            )
        })
        .unwrap();
        conn.set_timeouts(Some(Duration::from_secs(10)), Some(Duration::from_secs(10)))
            .unwrap();
        let frame_of = |i: usize| -> Vec<u8> {
            let len = 4 + (i * 7919) % (3 * TLS_WRITE_CHUNK);
            (0..len).map(|j| (i + j) as u8).collect()
        };
        const FRAMES: usize = 60;
        let mut reader = conn.try_clone().unwrap();
        let read = thread::spawn(move || {
            let mut got = Vec::new();
            for i in 0..FRAMES {
                reader.recv_frame(&mut got, 1 << 24).unwrap();
                assert_eq!(got, frame_of(i), "frame {i}");
            }
        });
        for i in 0..FRAMES {
            conn.send(&framed(&frame_of(i))).unwrap();
        }
        read.join().unwrap();
        conn.shutdown().unwrap();
        assert_eq!(server.join().unwrap(), FRAMES);
    }

    #[test]
    fn untrusted_or_misnamed_certificates_are_tls_failures() {
        let (_, cert, key) = test_pki(&["localhost"]);
        let (other_ca, _, _) = test_pki(&["localhost"]);
        let (port, server) = tls_echo_server(cert.clone(), key.clone());
        let err = Connection::connect(
            "127.0.0.1",
            port,
            Duration::from_secs(5),
            &tls_security(&other_ca, Some("localhost")),
        )
        .unwrap_err();
        assert_eq!(err.security_failure(), Some(SecurityFailure::Tls), "{err}");
        // Both test CAs have the same (empty) name: the signature is what fails.
        assert!(
            err.to_string().contains("invalid peer certificate"),
            "{err}"
        );
        let _ = server.join();

        let (ca, cert, key) = test_pki(&["broker.example"]);
        let (port, server) = tls_echo_server(cert, key);
        let err = Connection::connect(
            "127.0.0.1",
            port,
            Duration::from_secs(5),
            &tls_security(&ca, None),
        )
        .unwrap_err();
        assert_eq!(err.security_failure(), Some(SecurityFailure::Tls), "{err}");
        assert!(err.to_string().contains("not valid for name"), "{err}");
        let _ = server.join();
    }
}
