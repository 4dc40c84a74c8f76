//! Senders for the three inputs (datagram, UNIX stream, TCP).

use super::*;

/// How long a sender may block before the test fails (a full daemon queue blocks datagram
/// senders: `net.unix.max_dgram_qlen` is small here).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends datagrams to the daemon's UNIX datagram socket, one message per datagram.
pub struct DgramSender {
    sock: UnixDatagram,
    path: PathBuf,
}

impl DgramSender {
    pub fn new(path: &Path) -> DgramSender {
        let sock = UnixDatagram::unbound().expect("unbound datagram socket");
        sock.set_write_timeout(Some(SEND_TIMEOUT))
            .expect("set datagram send timeout");
        DgramSender {
            sock,
            path: path.to_path_buf(),
        }
    }

    pub fn try_send(&self, datagram: &[u8]) -> io::Result<()> {
        let n = self.sock.send_to(datagram, &self.path)?;
        if n != datagram.len() {
            return Err(io::Error::other(format!(
                "short datagram send: {n} of {} bytes",
                datagram.len()
            )));
        }
        Ok(())
    }

    /// Sends one datagram; panics clearly if the daemon does not take it within
    /// [`SEND_TIMEOUT`].
    pub fn send(&self, datagram: &[u8]) {
        if let Err(e) = self.try_send(datagram) {
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => panic!(
                    "datagram send to {} blocked for more than {SEND_TIMEOUT:?}: the daemon is \
                     not draining its datagram socket",
                    self.path.display()
                ),
                _ => panic!(
                    "datagram send of {} bytes to {}: {e}",
                    datagram.len(),
                    self.path.display()
                ),
            }
        }
    }
}

/// Writes `bytes` to a stream input in chunks of pseudo-random sizes (mostly large, sometimes
/// a few bytes), so the daemon's reassembly of frames across reads is exercised.
fn write_chunked<W: Write>(w: &mut W, bytes: &[u8], rng: &mut XorShift, what: &str) {
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = if rng.percent(10) {
            rng.range(1, 16)
        } else {
            rng.range(1, 200_000)
        } as usize;
        let n = n.min(rest.len());
        if let Err(e) = w.write_all(&rest[..n]) {
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => panic!(
                    "{what}: write blocked for more than {SEND_TIMEOUT:?}: daemon not reading"
                ),
                _ => panic!("{what}: write: {e}"),
            }
        }
        rest = &rest[n..];
    }
}

/// One connection to the daemon's UNIX stream socket.
pub struct StreamSender {
    sock: UnixStream,
    what: String,
}

impl StreamSender {
    pub fn connect(path: &Path) -> StreamSender {
        let sock = UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", path.display()));
        sock.set_write_timeout(Some(SEND_TIMEOUT))
            .expect("set stream send timeout");
        StreamSender {
            sock,
            what: format!("UNIX stream {}", path.display()),
        }
    }
    /// Writes the bytes of one or more back-to-back messages.
    pub fn send(&mut self, bytes: &[u8]) {
        let what = self.what.clone();
        write_chunked(
            &mut self.sock,
            bytes,
            &mut XorShift::new(bytes.len() as u64),
            &what,
        );
    }
    pub fn send_chunked(&mut self, bytes: &[u8], rng: &mut XorShift) {
        let what = self.what.clone();
        write_chunked(&mut self.sock, bytes, rng, &what);
    }
    /// Closes the connection cleanly (the daemon never writes back).
    pub fn finish(self) {
        self.sock
            .shutdown(Shutdown::Both)
            .unwrap_or_else(|e| panic!("{}: shutdown: {e}", self.what));
    }
}

/// One connection to the daemon's TCP input on 127.0.0.1.
pub struct TcpSender {
    sock: TcpStream,
    what: String,
}

impl TcpSender {
    pub fn connect(port: u16) -> TcpSender {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        sock.set_write_timeout(Some(SEND_TIMEOUT))
            .expect("set tcp send timeout");
        TcpSender {
            sock,
            what: format!("TCP {addr}"),
        }
    }
    pub fn send(&mut self, bytes: &[u8]) {
        let what = self.what.clone();
        write_chunked(
            &mut self.sock,
            bytes,
            &mut XorShift::new(bytes.len() as u64),
            &what,
        );
    }
    pub fn send_chunked(&mut self, bytes: &[u8], rng: &mut XorShift) {
        let what = self.what.clone();
        write_chunked(&mut self.sock, bytes, rng, &what);
    }
    pub fn finish(self) {
        self.sock
            .shutdown(Shutdown::Both)
            .unwrap_or_else(|e| panic!("{}: shutdown: {e}", self.what));
    }
}
