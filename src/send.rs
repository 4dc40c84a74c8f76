//! `dory send`: a tiny client that writes Dory-format messages to a running daemon, so
//! the daemon can be tried without writing a client.

use std::io::{BufRead, Write};
use std::net::TcpStream;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cli::SendArgs;
use crate::input::wire;

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("--partition-key {0} does not fit in 32 bits (use -2147483648..4294967295)")]
    PartitionKey(i64),
    #[error("message too large for Dory's format: {0}")]
    Encode(String),
    #[error("cannot send to {target}: {source}")]
    Io {
        target: String,
        source: std::io::Error,
    },
    #[error("cannot read standard input: {0}")]
    Stdin(std::io::Error),
}

enum Target {
    Dgram(UnixDatagram, std::path::PathBuf),
    Stream(Box<dyn Write>),
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Sends the messages; returns how many were sent.
pub fn run(args: &SendArgs) -> Result<u64, SendError> {
    let pkey = match args.partition_key {
        None => None,
        Some(k) if (i64::from(i32::MIN)..=i64::from(u32::MAX)).contains(&k) => Some(k as i32),
        Some(k) => return Err(SendError::PartitionKey(k)),
    };
    let target_name = args
        .socket
        .as_ref()
        .or(args.stream_socket.as_ref())
        .map(|p| p.display().to_string())
        .or(args.tcp_port.map(|p| format!("127.0.0.1:{p}")))
        .unwrap_or_default();
    let io = |source| SendError::Io {
        target: target_name.clone(),
        source,
    };
    let mut target = if let Some(p) = &args.socket {
        let s = UnixDatagram::unbound().map_err(io)?;
        s.set_write_timeout(Some(Duration::from_secs(10)))
            .map_err(io)?;
        Target::Dgram(s, p.clone())
    } else if let Some(p) = &args.stream_socket {
        Target::Stream(Box::new(UnixStream::connect(p).map_err(io)?))
    } else {
        let port = args.tcp_port.unwrap_or(0);
        Target::Stream(Box::new(
            TcpStream::connect(("127.0.0.1", port)).map_err(io)?,
        ))
    };
    let mut buf = Vec::new();
    let mut send_one = |value: &[u8], target: &mut Target| -> Result<(), SendError> {
        buf.clear();
        let r = match pkey {
            Some(k) => wire::encode_partition_key(
                &mut buf,
                k,
                args.topic.as_bytes(),
                now_ms(),
                args.key.as_bytes(),
                value,
            ),
            None => wire::encode_any_partition(
                &mut buf,
                args.topic.as_bytes(),
                now_ms(),
                args.key.as_bytes(),
                value,
            ),
        };
        r.map_err(|e| SendError::Encode(e.to_string()))?;
        match target {
            Target::Dgram(s, p) => s.send_to(&buf, p).map(|_| ()).map_err(io),
            Target::Stream(w) => w.write_all(&buf).map_err(io),
        }
    };
    let mut sent = 0;
    if args.stdin {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let line = line.map_err(SendError::Stdin)?;
            send_one(line.as_bytes(), &mut target)?;
            sent += 1;
        }
    } else {
        let value = args.value.clone().unwrap_or_default();
        for _ in 0..args.count {
            send_one(value.as_bytes(), &mut target)?;
            sent += 1;
        }
    }
    if let Target::Stream(w) = &mut target {
        w.flush().map_err(io)?;
    }
    Ok(sent)
}
