//! The discard log file (Dory's `<discardLogging>`): one line per discarded or possibly
//! duplicated message, with size-based rotation and pruning of old archives. It runs on its
//! own thread fed by a bounded channel, so no hot path ever waits for the disk; a full
//! channel drops the line (the discard itself is counted elsewhere) and counts the drop.
//!
//! Archive pruning runs inline on the log thread right after a rotation (and once at
//! open): rotations are rare (one per `max_file_size` bytes) and only this thread waits.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use thiserror::Error;

/// Why a message was discarded, as the log's `info:` field spells it (Dory §10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiscardInfo {
    Malformed,
    /// Unsupported client API key.
    ApiKey(i16),
    /// Unsupported client API version.
    Version(i16),
    /// Partial message at an unclean disconnect of a UNIX stream client.
    UncleanUnix,
    /// Partial message at an unclean disconnect of a TCP client.
    UncleanTcp,
    NoMem,
    BadTopic,
    LongMsg,
    NoAvailablePartitions,
    RateLimit,
    TopicAutocreateFail,
    KafkaErrorAck,
    DeliveryAttemptLimit,
    ServerShutdown,
    /// The durable spool could not take a spooled topic's message (not a Dory reason).
    SpoolFull,
}

impl DiscardInfo {
    fn write_to(self, out: &mut Vec<u8>) {
        let name: &str = match self {
            DiscardInfo::Malformed => "MALFORMED",
            DiscardInfo::ApiKey(n) => return put_fmt(out, format_args!("API_KEY({n})")),
            DiscardInfo::Version(n) => return put_fmt(out, format_args!("VERSION({n})")),
            DiscardInfo::UncleanUnix => "UNCLEAN_U",
            DiscardInfo::UncleanTcp => "UNCLEAN_T",
            DiscardInfo::NoMem => "NO_MEM",
            DiscardInfo::BadTopic => "BAD_TOPIC",
            DiscardInfo::LongMsg => "LONG_MSG",
            DiscardInfo::NoAvailablePartitions => "NO_AVAILABLE_PARTITIONS",
            DiscardInfo::RateLimit => "RATE_LIMIT",
            DiscardInfo::TopicAutocreateFail => "TOPIC_AUTOCREATE_FAIL",
            DiscardInfo::KafkaErrorAck => "KAFKA_ERROR_ACK",
            DiscardInfo::DeliveryAttemptLimit => "DELIVERY_ATTEMPT_LIMIT",
            DiscardInfo::ServerShutdown => "SERVER_SHUTDOWN",
            DiscardInfo::SpoolFull => "SPOOL_FULL",
        };
        out.extend_from_slice(name.as_bytes());
    }
}

/// A discard (`event: DISC`) or a possible duplicate (`event: DUP`, `info: NONE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiscardKind {
    Discard(DiscardInfo),
    PossibleDuplicate,
}

/// One line of the discard log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscardEvent {
    /// When dory discarded the message (the line's `now:`).
    pub at: SystemTime,
    /// The client's timestamp (epoch ms, as sent); for input-side events without a parsed
    /// message, the current time.
    pub client_ts: i64,
    pub kind: DiscardKind,
    /// Empty for input-side events without a parsed message.
    pub topic: Vec<u8>,
    pub key: Vec<u8>,
    /// The value, or for input-side events without a parsed message, the raw bytes.
    pub value: Vec<u8>,
}

impl DiscardEvent {
    /// An input-side event without a parsed message (MALFORMED, API_KEY, VERSION,
    /// UNCLEAN_*): `ts` is the current time, topic and key are empty, and `msg` holds (a
    /// prefix of) the raw bytes.
    pub fn input(at: SystemTime, info: DiscardInfo, raw: &[u8]) -> DiscardEvent {
        DiscardEvent {
            at,
            client_ts: i64::try_from(epoch_ms(at)).unwrap_or(i64::MAX),
            kind: DiscardKind::Discard(info),
            topic: Vec::new(),
            key: Vec::new(),
            value: raw.to_vec(),
        }
    }
}

#[derive(Debug, Error)]
pub enum DiscardLogError {
    #[error("discard log path {0} has no file name")]
    InvalidPath(PathBuf),
    #[error("cannot create discard log directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("cannot open discard log {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("discard log {0} is not a regular file")]
    NotRegular(PathBuf),
    #[error("cannot rotate discard log {path}: {source}")]
    Rotate { path: PathBuf, source: io::Error },
    #[error("cannot write discard log {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// The discard log file. `write` never panics and never returns an error: the first I/O
/// error disables the log with one warning (the daemon keeps running).
#[derive(Debug)]
pub struct DiscardLog {
    path: PathBuf,
    dir: PathBuf,
    base_name: OsString,
    max_file_size: u64,
    max_archive_size: u64,
    max_msg_prefix: Option<usize>,
    /// `None` once disabled.
    file: Option<File>,
    size: u64,
    last_archive_ms: u128,
    line: Vec<u8>,
}

impl DiscardLog {
    /// Creates the directory (`mkdir -p`), opens (or creates, mode 0660) the log for
    /// appending, rotates it if already over `max_file_size`, and prunes archives.
    /// `max_msg_prefix`: keys and values are cut to this many bytes before base64
    /// (`None` = whole).
    pub fn open(
        path: &Path,
        max_file_size: u64,
        max_archive_size: u64,
        max_msg_prefix: Option<usize>,
    ) -> Result<DiscardLog, DiscardLogError> {
        let base_name = path
            .file_name()
            .ok_or_else(|| DiscardLogError::InvalidPath(path.to_owned()))?
            .to_owned();
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&dir).map_err(|source| DiscardLogError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        let (file, size) = open_append(path)?;
        let mut log = DiscardLog {
            path: path.to_owned(),
            dir,
            base_name,
            max_file_size,
            max_archive_size,
            max_msg_prefix,
            file: Some(file),
            size,
            last_archive_ms: 0,
            line: Vec::new(),
        };
        if log.size > log.max_file_size {
            log.rotate()?;
        } else {
            log.prune();
        }
        Ok(log)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// False once an I/O error has disabled the log.
    pub fn is_enabled(&self) -> bool {
        self.file.is_some()
    }

    /// Appends one line, rotating first if the line would take the file past
    /// `max_file_size` (an empty file is never rotated, so a line longer than the limit is
    /// still written).
    pub fn write(&mut self, event: &DiscardEvent) {
        if self.file.is_none() {
            return;
        }
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        format_line(event, self.max_msg_prefix, &mut line);
        if let Err(e) = self.write_line(&line) {
            log::warn!("discard log disabled: {e}");
            self.file = None;
        }
        self.line = line;
    }

    fn write_line(&mut self, line: &[u8]) -> Result<(), DiscardLogError> {
        let len = u64::try_from(line.len()).unwrap_or(u64::MAX);
        if self.size > 0 && self.size.saturating_add(len) > self.max_file_size {
            self.rotate()?;
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        file.write_all(line)
            .map_err(|source| DiscardLogError::Write {
                path: self.path.clone(),
                source,
            })?;
        self.size = self.size.saturating_add(len);
        Ok(())
    }

    /// Renames the log to `<path>.<epoch ms>` (a later millisecond if that name is taken),
    /// opens a new one and prunes the archives.
    fn rotate(&mut self) -> Result<(), DiscardLogError> {
        let rotate_err = |source| DiscardLogError::Rotate {
            path: self.path.clone(),
            source,
        };
        let mut ms = epoch_ms(SystemTime::now()).max(self.last_archive_ms + 1);
        let archive = loop {
            let mut name = self.path.clone().into_os_string();
            name.push(format!(".{ms}"));
            let candidate = PathBuf::from(name);
            match fs::symlink_metadata(&candidate) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => break candidate,
                Err(e) => return Err(rotate_err(e)),
                Ok(_) => ms += 1,
            }
        };
        fs::rename(&self.path, &archive).map_err(rotate_err)?;
        self.last_archive_ms = ms;
        let (file, size) = open_append(&self.path)?;
        self.file = Some(file);
        self.size = size;
        self.prune();
        Ok(())
    }

    fn prune(&self) {
        if let Err(e) = prune_archives(&self.dir, &self.base_name, self.max_archive_size) {
            log::warn!(
                "cannot prune discard log archives in {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// Opens `path` for appending (created with mode 0660), refusing anything but a regular
/// file (a FIFO would block the open). Returns the file and its current size.
fn open_append(path: &Path) -> Result<(File, u64), DiscardLogError> {
    let open_err = |source| DiscardLogError::Open {
        path: path.to_owned(),
        source,
    };
    match fs::metadata(path) {
        Ok(m) if !m.is_file() => return Err(DiscardLogError::NotRegular(path.to_owned())),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(open_err(e)),
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o660)
        .open(path)
        .map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    if !meta.is_file() {
        return Err(DiscardLogError::NotRegular(path.to_owned()));
    }
    Ok((file, meta.len()))
}

/// Deletes archives (regular files named `<base_name>.<digits>` in `dir`), oldest first by
/// the numeric suffix, while their total size exceeds `max_total`. Returns the removed
/// paths.
pub fn prune_archives(
    dir: &Path,
    base_name: &std::ffi::OsStr,
    max_total: u64,
) -> io::Result<Vec<PathBuf>> {
    let prefix = base_name.as_bytes();
    let mut archives = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(suffix) = name
            .as_bytes()
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix(b"."))
        else {
            continue;
        };
        if suffix.is_empty() || !suffix.iter().all(u8::is_ascii_digit) {
            continue;
        }
        let meta = entry.metadata()?;
        if !meta.is_file() {
            continue;
        }
        // Up to 39 digits fit; longer suffixes sort last.
        let order = std::str::from_utf8(suffix)
            .ok()
            .and_then(|s| s.parse::<u128>().ok())
            .unwrap_or(u128::MAX);
        archives.push((order, meta.len(), entry.path()));
    }
    archives.sort();
    let mut total: u64 = archives.iter().map(|a| a.1).sum();
    let mut removed = Vec::new();
    for (_, len, path) in archives {
        if total <= max_total {
            break;
        }
        fs::remove_file(&path)?;
        total -= len;
        removed.push(path);
    }
    Ok(removed)
}

/// Formats one line, exactly:
/// `now: <ms> ts: <client ts> event: <DISC|DUP> info: <INFO> topic: <len>[<topic>]
/// key: <b64len>[<b64>] msg: <b64len>[<b64>]\n` (one line), key and value cut to
/// `max_msg_prefix` bytes before base64.
pub fn format_line(event: &DiscardEvent, max_msg_prefix: Option<usize>, out: &mut Vec<u8>) {
    put_fmt(
        out,
        format_args!(
            "now: {} ts: {} event: ",
            epoch_ms(event.at),
            event.client_ts
        ),
    );
    match event.kind {
        DiscardKind::Discard(info) => {
            out.extend_from_slice(b"DISC info: ");
            info.write_to(out);
        }
        DiscardKind::PossibleDuplicate => out.extend_from_slice(b"DUP info: NONE"),
    }
    put_fmt(out, format_args!(" topic: {}[", event.topic.len()));
    out.extend_from_slice(&event.topic);
    out.extend_from_slice(b"] key: ");
    put_base64(out, prefix(&event.key, max_msg_prefix));
    out.extend_from_slice(b" msg: ");
    put_base64(out, prefix(&event.value, max_msg_prefix));
    out.push(b'\n');
}

/// `<base64 length>[<base64>]`, as Dory's discard and debug logs write keys and values.
pub fn put_base64(out: &mut Vec<u8>, raw: &[u8]) {
    let b64_len = base64::encoded_len(raw.len(), true).unwrap_or(0);
    put_fmt(out, format_args!("{b64_len}["));
    let start = out.len();
    out.resize(start + b64_len, 0);
    // The buffer is exactly the encoded length, so this cannot fail.
    let written = BASE64
        .encode_slice(raw, &mut out[start..])
        .unwrap_or_default();
    out.truncate(start + written);
    out.push(b']');
}

fn put_fmt(out: &mut Vec<u8>, args: std::fmt::Arguments<'_>) {
    // Writing to a Vec cannot fail.
    let _ = out.write_fmt(args);
}

fn prefix(bytes: &[u8], max: Option<usize>) -> &[u8] {
    match max {
        Some(n) if n < bytes.len() => &bytes[..n],
        _ => bytes,
    }
}

fn epoch_ms(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// The sending end of the discard log thread's channel. Cheap to clone; never blocks.
#[derive(Debug, Clone)]
pub struct DiscardLogSender {
    to_log: Sender<DiscardEvent>,
    max_msg_prefix: Option<usize>,
    dropped: Arc<AtomicU64>,
}

impl DiscardLogSender {
    /// Queues an event, copying at most `max_msg_prefix` bytes of key and value (so huge
    /// messages cost no more than their logged prefix). If the channel is full (or the log
    /// thread is gone) the line is dropped and counted; returns whether it was queued.
    pub fn log(
        &self,
        at: SystemTime,
        client_ts: i64,
        kind: DiscardKind,
        topic: &[u8],
        key: &[u8],
        value: &[u8],
    ) -> bool {
        self.send(DiscardEvent {
            at,
            client_ts,
            kind,
            topic: topic.to_vec(),
            key: prefix(key, self.max_msg_prefix).to_vec(),
            value: prefix(value, self.max_msg_prefix).to_vec(),
        })
    }

    /// Queues an input-side event without a parsed message (see `DiscardEvent::input`),
    /// copying at most `max_msg_prefix` bytes of `raw`; see `log`.
    pub fn log_input(&self, at: SystemTime, info: DiscardInfo, raw: &[u8]) -> bool {
        self.send(DiscardEvent::input(
            at,
            info,
            prefix(raw, self.max_msg_prefix),
        ))
    }

    /// Queues a prepared event (key and value are cut when written); see `log`.
    pub fn send(&self, event: DiscardEvent) -> bool {
        match self.to_log.try_send(event) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Lines queued and not yet written.
    pub fn pending(&self) -> usize {
        self.to_log.len()
    }

    /// How many bytes of key and value are logged (`None`: all).
    pub fn max_msg_prefix(&self) -> Option<usize> {
        self.max_msg_prefix
    }

    /// Lines dropped because the channel was full or the log thread had stopped.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn channel(
    capacity: usize,
    max_msg_prefix: Option<usize>,
) -> (DiscardLogSender, Receiver<DiscardEvent>) {
    let (to_log, from_senders) = crossbeam_channel::bounded(capacity);
    let sender = DiscardLogSender {
        to_log,
        max_msg_prefix,
        dropped: Arc::new(AtomicU64::new(0)),
    };
    (sender, from_senders)
}

/// Starts the `discard-log` thread writing `log`, fed by a channel of `capacity` events.
/// The thread ends when every sender is dropped, after writing what was queued.
pub fn spawn(
    mut log: DiscardLog,
    capacity: usize,
) -> io::Result<(DiscardLogSender, JoinHandle<()>)> {
    let (sender, from_senders) = channel(capacity, log.max_msg_prefix);
    let handle = thread::Builder::new()
        .name("discard-log".into())
        .spawn(move || {
            for event in from_senders {
                log.write(&event);
            }
        })?;
    Ok((sender, handle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn event(info: DiscardInfo, topic: &[u8], key: &[u8], value: &[u8]) -> DiscardEvent {
        DiscardEvent {
            at: at(1_700_000_000_123),
            client_ts: 1_699_999_999_000,
            kind: DiscardKind::Discard(info),
            topic: topic.to_vec(),
            key: key.to_vec(),
            value: value.to_vec(),
        }
    }

    fn line(e: &DiscardEvent, max: Option<usize>) -> String {
        let mut out = Vec::new();
        format_line(e, max, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn line_format_is_dorys() {
        let e = event(DiscardInfo::RateLimit, b"events", b"k1", b"hello");
        assert_eq!(
            line(&e, None),
            "now: 1700000000123 ts: 1699999999000 event: DISC info: RATE_LIMIT \
             topic: 6[events] key: 4[azE=] msg: 8[aGVsbG8=]\n"
        );
        let dup = DiscardEvent {
            kind: DiscardKind::PossibleDuplicate,
            ..event(DiscardInfo::Malformed, b"t", b"", b"")
        };
        assert_eq!(
            line(&dup, None),
            "now: 1700000000123 ts: 1699999999000 event: DUP info: NONE \
             topic: 1[t] key: 0[] msg: 0[]\n"
        );
    }

    #[test]
    fn key_and_value_are_cut_before_base64() {
        let e = event(DiscardInfo::LongMsg, b"t", b"abcdef", b"hello world");
        assert_eq!(
            line(&e, Some(3)),
            "now: 1700000000123 ts: 1699999999000 event: DISC info: LONG_MSG \
             topic: 1[t] key: 4[YWJj] msg: 4[aGVs]\n"
        );
        assert!(line(&e, Some(0)).ends_with("key: 0[] msg: 0[]\n"));
        assert_eq!(line(&e, Some(100)), line(&e, None));
    }

    #[test]
    fn every_info_string() {
        let cases = [
            (DiscardInfo::Malformed, "MALFORMED"),
            (DiscardInfo::ApiKey(300), "API_KEY(300)"),
            (DiscardInfo::Version(-2), "VERSION(-2)"),
            (DiscardInfo::UncleanUnix, "UNCLEAN_U"),
            (DiscardInfo::UncleanTcp, "UNCLEAN_T"),
            (DiscardInfo::NoMem, "NO_MEM"),
            (DiscardInfo::BadTopic, "BAD_TOPIC"),
            (DiscardInfo::LongMsg, "LONG_MSG"),
            (
                DiscardInfo::NoAvailablePartitions,
                "NO_AVAILABLE_PARTITIONS",
            ),
            (DiscardInfo::RateLimit, "RATE_LIMIT"),
            (DiscardInfo::TopicAutocreateFail, "TOPIC_AUTOCREATE_FAIL"),
            (DiscardInfo::KafkaErrorAck, "KAFKA_ERROR_ACK"),
            (DiscardInfo::DeliveryAttemptLimit, "DELIVERY_ATTEMPT_LIMIT"),
            (DiscardInfo::ServerShutdown, "SERVER_SHUTDOWN"),
        ];
        for (info, text) in cases {
            let l = line(&event(info, b"", b"", b""), None);
            assert!(l.contains(&format!(" info: {text} topic: ")), "{l}");
        }
    }

    #[test]
    fn input_events_have_no_topic_or_key_and_the_raw_bytes() {
        let e = DiscardEvent::input(at(5_000), DiscardInfo::ApiKey(999), b"\x00\x01raw");
        assert_eq!(
            line(&e, None),
            "now: 5000 ts: 5000 event: DISC info: API_KEY(999) topic: 0[] key: 0[] \
             msg: 8[AAFyYXc=]\n"
        );
    }

    #[test]
    fn topic_is_written_raw_with_its_byte_length() {
        let e = event(DiscardInfo::BadTopic, "tö pic".as_bytes(), b"", b"");
        assert!(line(&e, None).contains(" topic: 7[tö pic] key: "));
    }

    #[test]
    fn open_creates_the_directory_and_appends() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a/b/discard.log");
        let e = event(DiscardInfo::NoMem, b"t", b"", b"v");
        {
            let mut log = DiscardLog::open(&path, 1 << 20, 1 << 20, None).unwrap();
            log.write(&e);
        }
        let mut log = DiscardLog::open(&path, 1 << 20, 1 << 20, None).unwrap();
        log.write(&e);
        assert!(log.is_enabled());
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text, line(&e, None).repeat(2));
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o660, 0, "no more than 0660: {mode:o}");
    }

    fn archives(dir: &Path) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().into_string().unwrap(),
                    fs::read_to_string(e.path()).unwrap(),
                )
            })
            .filter(|(n, _)| n.starts_with("discard.log."))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn rotates_when_the_next_line_would_not_fit() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("discard.log");
        let e = event(DiscardInfo::BadTopic, b"topic", b"", b"0123456789");
        let len = line(&e, None).len() as u64;
        // Room for exactly two lines.
        let mut log = DiscardLog::open(&path, 2 * len, 1 << 20, None).unwrap();
        for _ in 0..5 {
            log.write(&e);
        }
        assert!(log.is_enabled());
        let archived = archives(tmp.path());
        assert_eq!(archived.len(), 2, "{archived:?}");
        for (name, text) in &archived {
            let suffix = name.strip_prefix("discard.log.").unwrap();
            assert!(suffix.bytes().all(|b| b.is_ascii_digit()), "{name}");
            assert_eq!(text, &line(&e, None).repeat(2));
        }
        assert_ne!(archived[0].0, archived[1].0);
        assert_eq!(fs::read_to_string(&path).unwrap(), line(&e, None));
    }

    #[test]
    fn oversized_file_is_rotated_at_open_and_long_lines_still_written() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("discard.log");
        fs::write(&path, "x".repeat(100)).unwrap();
        let mut log = DiscardLog::open(&path, 50, 1 << 20, None).unwrap();
        assert_eq!(archives(tmp.path()).len(), 1);
        assert_eq!(fs::metadata(&path).unwrap().len(), 0);
        // A line longer than the limit goes into the (empty) file, no empty archive.
        let e = event(DiscardInfo::LongMsg, b"t", b"", &[7u8; 100]);
        log.write(&e);
        assert_eq!(archives(tmp.path()).len(), 1);
        assert_eq!(fs::read_to_string(&path).unwrap(), line(&e, None));
    }

    #[test]
    fn pruning_deletes_oldest_archives_by_numeric_suffix() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        for name in ["discard.log.900", "discard.log.1000", "discard.log.20"] {
            fs::write(dir.join(name), [0u8; 10]).unwrap();
        }
        // Not archives: must survive.
        for name in [
            "discard.log.old",
            "discard.log.12a",
            "other.log.5",
            "discard.log.",
        ] {
            fs::write(dir.join(name), [0u8; 50]).unwrap();
        }
        fs::create_dir(dir.join("discard.log.5")).unwrap();
        let removed = prune_archives(dir, "discard.log".as_ref(), 25).unwrap();
        // 20 < 900 < 1000 numerically (not as strings).
        assert_eq!(removed, [dir.join("discard.log.20")]);
        let removed = prune_archives(dir, "discard.log".as_ref(), 10).unwrap();
        assert_eq!(removed, [dir.join("discard.log.900")]);
        let removed = prune_archives(dir, "discard.log".as_ref(), 10).unwrap();
        assert!(removed.is_empty());
        let mut left: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "discard.log.",
                "discard.log.1000",
                "discard.log.12a",
                "discard.log.5",
                "discard.log.old",
                "other.log.5"
            ]
        );
    }

    #[test]
    fn rotation_prunes_archives() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("discard.log");
        let e = event(DiscardInfo::BadTopic, b"topic", b"", b"0123456789");
        let len = line(&e, None).len() as u64;
        // One line per file, archives capped at two lines.
        let mut log = DiscardLog::open(&path, len, 2 * len, None).unwrap();
        for _ in 0..6 {
            log.write(&e);
        }
        let archived = archives(tmp.path());
        assert_eq!(archived.len(), 2, "{archived:?}");
    }

    #[test]
    fn a_non_regular_path_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("discard.log");
        fs::create_dir(&path).unwrap();
        assert!(matches!(
            DiscardLog::open(&path, 100, 100, None),
            Err(DiscardLogError::NotRegular(_))
        ));
        assert!(matches!(
            DiscardLog::open(Path::new("/"), 100, 100, None),
            Err(DiscardLogError::InvalidPath(_))
        ));
    }

    #[test]
    fn a_rotation_failure_disables_the_log_without_panicking() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("logs");
        let path = dir.join("discard.log");
        let e = event(DiscardInfo::BadTopic, b"topic", b"", b"v");
        let mut log = DiscardLog::open(&path, 10, 1 << 20, None).unwrap();
        log.write(&e);
        fs::remove_dir_all(&dir).unwrap();
        log.write(&e); // needs a rotation: the rename fails
        assert!(!log.is_enabled());
        log.write(&e); // a no-op now
        assert!(!dir.exists());
    }

    #[test]
    fn thread_writes_what_was_queued_and_stops_when_senders_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("discard.log");
        let log = DiscardLog::open(&path, 1 << 20, 1 << 20, Some(4)).unwrap();
        let (sender, handle) = spawn(log, 1024).unwrap();
        let other = sender.clone();
        assert!(sender.log(
            at(1),
            2,
            DiscardKind::Discard(DiscardInfo::KafkaErrorAck),
            b"t",
            b"key-longer-than-4",
            b"value"
        ));
        assert!(other.log(at(3), 4, DiscardKind::PossibleDuplicate, b"u", b"", b"v"));
        assert!(other.log_input(at(6), DiscardInfo::UncleanTcp, b"\x00\x00\x00\x09abc"));
        drop(sender);
        drop(other);
        handle.join().unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "now: 1 ts: 2 event: DISC info: KAFKA_ERROR_ACK topic: 1[t] key: 8[a2V5LQ==] \
             msg: 8[dmFsdQ==]\n\
             now: 3 ts: 4 event: DUP info: NONE topic: 1[u] key: 0[] msg: 4[dg==]\n\
             now: 6 ts: 6 event: DISC info: UNCLEAN_T topic: 0[] key: 0[] msg: 8[AAAACQ==]\n"
        );
    }

    #[test]
    fn a_full_channel_drops_and_counts() {
        let (sender, from_senders) = channel(2, None);
        let e = event(DiscardInfo::RateLimit, b"t", b"", b"");
        let sent: Vec<bool> = (0..5).map(|_| sender.send(e.clone())).collect();
        assert_eq!(sent, [true, true, false, false, false]);
        assert_eq!(sender.dropped(), 3);
        drop(from_senders);
        assert!(!sender.send(e));
        assert_eq!(sender.clone().dropped(), 4, "clones share the counter");
    }
}
