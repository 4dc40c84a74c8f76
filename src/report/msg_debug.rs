//! Message debug logging (Dory's `<msgDebug>`): on request over HTTP, messages of selected
//! topics are written to `msg_receive`, `msg_send` and `msg_got_ack` in a directory, so one
//! can follow a message through dory. Unlike Dory, only the selected topics are logged.
//! Shared as `Arc<MsgDebug>` by the status server (control) and router/dispatchers (writes);
//! when nothing is being logged, the hot-path check is one atomic load.

use crate::config::MsgDebugConfig;
use crate::report::discard_log::put_base64;
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// Reply to requests when message debug logging is not configured.
pub(crate) const NOT_CONFIGURED: &str =
    "Message debug logging is not configured: set its directory in the config to use /msg_debug\n";

/// Which of the three files a line goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DebugFile {
    /// The router accepted the message.
    Receive = 0,
    /// The produce request carrying it was written.
    Send = 1,
    /// The broker acknowledged it.
    GotAck = 2,
}

impl DebugFile {
    pub const ALL: [DebugFile; 3] = [DebugFile::Receive, DebugFile::Send, DebugFile::GotAck];

    pub const fn file_name(self) -> &'static str {
        match self {
            DebugFile::Receive => "msg_receive",
            DebugFile::Send => "msg_send",
            DebugFile::GotAck => "msg_got_ack",
        }
    }
}

/// The HTTP status and text body of a `/msg_debug/...` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpReply {
    pub status: u16,
    pub body: String,
}

impl HttpReply {
    fn ok(body: String) -> HttpReply {
        HttpReply { status: 200, body }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum Selection {
    #[default]
    Nothing,
    Topics(BTreeSet<Vec<u8>>),
    All,
}

impl Selection {
    fn contains(&self, topic: &[u8]) -> bool {
        match self {
            Selection::Nothing => false,
            Selection::Topics(set) => set.contains(topic),
            Selection::All => true,
        }
    }
}

/// An enable episode: files open, clock and byte budget running.
#[derive(Debug)]
struct Episode {
    files: [File; 3],
    started: Instant,
    bytes_left: u64,
}

#[derive(Debug, Default)]
struct Inner {
    selection: Selection,
    /// `Some` while logging; a kill switch or write error ends the episode (the selection
    /// stays, and a new add request starts a new episode).
    episode: Option<Episode>,
    line: Vec<u8>,
}

/// Message debug logging state: the topic selection, the open files and the kill switches.
#[derive(Debug)]
pub struct MsgDebug {
    config: Option<MsgDebugConfig>,
    /// True iff an episode is running: lets `enabled_for` skip the lock otherwise.
    active: AtomicBool,
    inner: Mutex<Inner>,
}

impl MsgDebug {
    /// `None`: not configured; every control request is refused with `NOT_CONFIGURED`.
    pub fn new(config: Option<MsgDebugConfig>) -> MsgDebug {
        MsgDebug {
            config,
            active: AtomicBool::new(false),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Whether any topic is being logged now: one relaxed atomic load, for hot paths to
    /// skip even looking up the topic's name.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Whether messages of `topic` are being logged now. One relaxed atomic load when
    /// nothing is.
    pub fn enabled_for(&self, topic: &[u8]) -> bool {
        if !self.active.load(Ordering::Relaxed) {
            return false;
        }
        let inner = self.lock();
        inner.episode.is_some() && inner.selection.contains(topic)
    }

    /// Logs one message to `file` if its topic is selected:
    /// `ts: <client ts> topic: <len>[<topic>] key: <b64len>[<b64>] value: <b64len>[<b64>]\n`.
    pub fn log(&self, file: DebugFile, client_ts: i64, topic: &[u8], key: &[u8], value: &[u8]) {
        self.log_at(Instant::now(), file, client_ts, topic, key, value);
    }

    /// `log` with the current time given (for the time limit).
    pub(crate) fn log_at(
        &self,
        now: Instant,
        file: DebugFile,
        client_ts: i64,
        topic: &[u8],
        key: &[u8],
        value: &[u8],
    ) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        let Some(limit) = self.config.as_ref().map(|c| c.time_limit) else {
            return;
        };
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.selection.contains(topic) {
            return;
        }
        let Some(episode) = inner.episode.as_mut() else {
            return;
        };
        if now.saturating_duration_since(episode.started) >= limit {
            log::info!("message debug logging stopped: time limit reached");
            self.stop(inner);
            return;
        }
        inner.line.clear();
        format_line(&mut inner.line, client_ts, topic, key, value);
        let len = u64::try_from(inner.line.len()).unwrap_or(u64::MAX);
        if len > episode.bytes_left {
            log::info!("message debug logging stopped: byte limit reached");
            self.stop(inner);
            return;
        }
        if let Err(e) = episode.files[file as usize].write_all(&inner.line) {
            log::warn!(
                "message debug logging stopped: cannot write {}: {e}",
                file.file_name()
            );
            self.stop(inner);
            return;
        }
        episode.bytes_left -= len;
    }

    /// Handles `GET /msg_debug/<action>[/<topic>]`: `path` is the request path (a query
    /// string is ignored; the topic is percent-decoded). `None` if the path is not one of
    /// the `/msg_debug/` endpoints. Replies 200 with Dory's texts; 403 `NOT_CONFIGURED` if
    /// message debug logging is not configured; 400 for a malformed percent escape.
    pub(crate) fn handle_http(&self, path: &str) -> Option<HttpReply> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let action = path.strip_prefix("/msg_debug/")?;
        let (action, topic) = match action.split_once('/') {
            Some((a, t)) => (a, Some(t)),
            None => (action, None),
        };
        let known = matches!(
            (action, topic.is_some()),
            ("get_topics", false)
                | ("add_all_topics", false)
                | ("del_all_topics", false)
                | ("truncate_files", false)
                | ("add_topic", true)
                | ("del_topic", true)
        );
        if !known {
            return None;
        }
        if self.config.is_none() {
            return Some(HttpReply {
                status: 403,
                body: NOT_CONFIGURED.to_owned(),
            });
        }
        let topic = match topic.map(percent_decode) {
            Some(None) => {
                return Some(HttpReply {
                    status: 400,
                    body: "Invalid percent-encoding in topic\n".to_owned(),
                })
            }
            Some(Some(t)) => t,
            None => Vec::new(),
        };
        let body = match action {
            "get_topics" => self.get_topics(),
            "add_all_topics" => self.add_all_topics(),
            "del_all_topics" => self.del_all_topics(),
            "truncate_files" => self.truncate_files(),
            "add_topic" => self.add_topic(&topic),
            _ => self.del_topic(&topic),
        };
        Some(HttpReply::ok(body))
    }

    /// `/msg_debug/get_topics`.
    pub(crate) fn get_topics(&self) -> String {
        match &self.lock().selection {
            Selection::All => "All message debug topics are currently enabled\n".to_owned(),
            Selection::Nothing => "No message debug topics are currently enabled\n".to_owned(),
            Selection::Topics(set) => set
                .iter()
                .map(|t| format!("topic: [{}]\n", String::from_utf8_lossy(t)))
                .collect(),
        }
    }

    /// `/msg_debug/add_all_topics`: logs every topic, starting an episode if none runs.
    pub(crate) fn add_all_topics(&self) -> String {
        let mut inner = self.lock();
        let previous = std::mem::replace(&mut inner.selection, Selection::All);
        match self.ensure_running(&mut inner) {
            Ok(()) => "All message debug topics enabled\n".to_owned(),
            Err(e) => {
                inner.selection = previous;
                format!("Failed to enable all message debug topics: {e}\n")
            }
        }
    }

    /// `/msg_debug/del_all_topics`: selects nothing and stops logging.
    pub(crate) fn del_all_topics(&self) -> String {
        let mut inner = self.lock();
        inner.selection = Selection::Nothing;
        self.stop(&mut inner);
        "All message debug topics disabled\n".to_owned()
    }

    /// `/msg_debug/add_topic/<topic>`: fails if the topic is already selected or all
    /// topics are; otherwise selects it, starting an episode if none runs.
    pub(crate) fn add_topic(&self, topic: &[u8]) -> String {
        let shown = String::from_utf8_lossy(topic);
        let mut inner = self.lock();
        let mut set = match &inner.selection {
            Selection::All => return format!("Failed to enable debug topic [{shown}]\n"),
            Selection::Topics(set) if set.contains(topic) => {
                return format!("Failed to enable debug topic [{shown}]\n")
            }
            Selection::Topics(set) => set.clone(),
            Selection::Nothing => BTreeSet::new(),
        };
        set.insert(topic.to_vec());
        let previous = std::mem::replace(&mut inner.selection, Selection::Topics(set));
        match self.ensure_running(&mut inner) {
            Ok(()) => format!("Enabled debug topic [{shown}]\n"),
            Err(e) => {
                inner.selection = previous;
                format!("Failed to enable debug topic [{shown}]: {e}\n")
            }
        }
    }

    /// `/msg_debug/del_topic/<topic>`: fails if the topic is not selected or all topics
    /// are; removing the last topic stops logging.
    pub(crate) fn del_topic(&self, topic: &[u8]) -> String {
        let shown = String::from_utf8_lossy(topic);
        let mut inner = self.lock();
        let Selection::Topics(set) = &mut inner.selection else {
            return format!("Failed to disable debug topic [{shown}]\n");
        };
        if !set.remove(topic) {
            return format!("Failed to disable debug topic [{shown}]\n");
        }
        if set.is_empty() {
            inner.selection = Selection::Nothing;
            self.stop(&mut inner);
        }
        format!("Disabled debug topic [{shown}]\n")
    }

    /// `/msg_debug/truncate_files`: empties the three files; logging goes on.
    pub(crate) fn truncate_files(&self) -> String {
        let Some(config) = &self.config else {
            return NOT_CONFIGURED.to_owned();
        };
        let mut inner = self.lock();
        let result = match &mut inner.episode {
            Some(episode) => episode.files.iter().try_for_each(|f| f.set_len(0)),
            None => DebugFile::ALL.iter().try_for_each(|f| {
                match OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(config.dir.join(f.file_name()))
                {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            }),
        };
        match result {
            Ok(()) => "Message debug files truncated\n".to_owned(),
            Err(e) => format!("Failed to truncate message debug files: {e}\n"),
        }
    }

    /// Starts an episode unless one is running: creates the directory, recreates the three
    /// files empty, restarts the clock and the byte budget.
    fn ensure_running(&self, inner: &mut Inner) -> io::Result<()> {
        if inner.episode.is_some() {
            return Ok(());
        }
        let config = self
            .config
            .as_ref()
            .ok_or_else(|| io::Error::other("not configured"))?;
        fs::create_dir_all(&config.dir)?;
        // As Dory: the old files are removed and new ones created. Append mode, so writes
        // after `truncate_files` start at offset 0 again.
        let open = |f: DebugFile| {
            let path = config.dir.join(f.file_name());
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o660)
                .open(path)
        };
        let files = [
            open(DebugFile::Receive)?,
            open(DebugFile::Send)?,
            open(DebugFile::GotAck)?,
        ];
        inner.episode = Some(Episode {
            files,
            started: Instant::now(),
            bytes_left: config.byte_limit,
        });
        self.active.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn stop(&self, inner: &mut Inner) {
        inner.episode = None;
        self.active.store(false, Ordering::Relaxed);
    }

    /// The state stays consistent across a panic elsewhere, so a poisoned lock is used as
    /// is rather than spreading the panic.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn format_line(out: &mut Vec<u8>, client_ts: i64, topic: &[u8], key: &[u8], value: &[u8]) {
    let _ = write!(out, "ts: {client_ts} topic: {}[", topic.len());
    out.extend_from_slice(topic);
    out.extend_from_slice(b"] key: ");
    put_base64(out, key);
    out.extend_from_slice(b" value: ");
    put_base64(out, value);
    out.push(b'\n');
}

/// Decodes `%XX` escapes; `None` on a malformed escape.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    fn configured(dir: &Path, time_limit: Duration, byte_limit: u64) -> MsgDebug {
        MsgDebug::new(Some(MsgDebugConfig {
            dir: dir.join("debug"),
            time_limit,
            byte_limit,
        }))
    }

    fn read(dir: &Path, f: DebugFile) -> String {
        fs::read_to_string(dir.join("debug").join(f.file_name())).unwrap()
    }

    fn body(d: &MsgDebug, path: &str) -> String {
        let r = d.handle_http(path).unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        r.body
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn line_format() {
        let mut out = Vec::new();
        format_line(&mut out, 1_700_000_000_000, b"events", b"k1", b"hello");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ts: 1700000000000 topic: 6[events] key: 4[azE=] value: 8[aGVsbG8=]\n"
        );
        let mut out = Vec::new();
        format_line(&mut out, -1, b"", b"", b"");
        assert_eq!(out, b"ts: -1 topic: 0[] key: 0[] value: 0[]\n");
    }

    #[test]
    fn off_until_enabled_then_only_selected_topics_are_logged() {
        let tmp = tempfile::tempdir().unwrap();
        let d = configured(tmp.path(), HOUR, 1 << 20);
        assert!(!d.enabled_for(b"a"));
        d.log(DebugFile::Receive, 1, b"a", b"", b"x");
        assert!(
            !tmp.path().join("debug").exists(),
            "nothing created while off"
        );

        assert_eq!(
            body(&d, "/msg_debug/add_topic/a"),
            "Enabled debug topic [a]\n"
        );
        assert!(d.enabled_for(b"a"));
        assert!(!d.enabled_for(b"b"));
        d.log(DebugFile::Receive, 1, b"a", b"k", b"x");
        d.log(DebugFile::Receive, 2, b"b", b"k", b"y"); // not selected: the quirk is fixed
        d.log(DebugFile::Send, 3, b"a", b"", b"x");
        d.log(DebugFile::GotAck, 4, b"a", b"", b"");
        assert_eq!(
            read(tmp.path(), DebugFile::Receive),
            "ts: 1 topic: 1[a] key: 4[aw==] value: 4[eA==]\n"
        );
        assert_eq!(
            read(tmp.path(), DebugFile::Send),
            "ts: 3 topic: 1[a] key: 0[] value: 4[eA==]\n"
        );
        assert_eq!(
            read(tmp.path(), DebugFile::GotAck),
            "ts: 4 topic: 1[a] key: 0[] value: 0[]\n"
        );

        assert_eq!(
            body(&d, "/msg_debug/add_all_topics"),
            "All message debug topics enabled\n"
        );
        d.log(DebugFile::Receive, 5, b"b", b"", b"");
        assert!(read(tmp.path(), DebugFile::Receive)
            .ends_with("ts: 5 topic: 1[b] key: 0[] value: 0[]\n"));
    }

    #[test]
    fn control_replies_are_dorys() {
        let tmp = tempfile::tempdir().unwrap();
        let d = configured(tmp.path(), HOUR, 1 << 20);
        assert_eq!(
            body(&d, "/msg_debug/get_topics"),
            "No message debug topics are currently enabled\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/del_topic/x"),
            "Failed to disable debug topic [x]\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/add_topic/x"),
            "Enabled debug topic [x]\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/add_topic/x"),
            "Failed to enable debug topic [x]\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/add_topic/a%2Eb"),
            "Enabled debug topic [a.b]\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/get_topics"),
            "topic: [a.b]\ntopic: [x]\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/del_topic/x"),
            "Disabled debug topic [x]\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/add_all_topics?x=1"),
            "All message debug topics enabled\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/get_topics"),
            "All message debug topics are currently enabled\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/add_topic/y"),
            "Failed to enable debug topic [y]\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/del_topic/a.b"),
            "Failed to disable debug topic [a.b]\n"
        );
        assert_eq!(
            body(&d, "/msg_debug/del_all_topics"),
            "All message debug topics disabled\n"
        );
        assert!(!d.enabled_for(b"a.b"));
        assert_eq!(
            body(&d, "/msg_debug/get_topics"),
            "No message debug topics are currently enabled\n"
        );
        assert_eq!(d.handle_http("/msg_debug/nonsense"), None);
        assert_eq!(d.handle_http("/msg_debug/add_topic"), None);
        assert_eq!(d.handle_http("/counters/plain"), None);
        assert_eq!(
            d.handle_http("/msg_debug/add_topic/%zz").unwrap().status,
            400
        );
    }

    #[test]
    fn removing_the_last_topic_stops_logging() {
        let tmp = tempfile::tempdir().unwrap();
        let d = configured(tmp.path(), HOUR, 1 << 20);
        d.add_topic(b"a");
        d.add_topic(b"b");
        d.del_topic(b"a");
        assert!(d.enabled_for(b"b"));
        d.del_topic(b"b");
        assert!(!d.enabled_for(b"b"));
        assert!(!d.active.load(Ordering::Relaxed));
    }

    #[test]
    fn not_configured_rejects_requests() {
        let d = MsgDebug::new(None);
        for path in [
            "/msg_debug/get_topics",
            "/msg_debug/add_all_topics",
            "/msg_debug/add_topic/t",
            "/msg_debug/truncate_files",
        ] {
            let r = d.handle_http(path).unwrap();
            assert_eq!(r.status, 403);
            assert_eq!(r.body, NOT_CONFIGURED);
        }
        assert!(!d.enabled_for(b"t"));
        d.log(DebugFile::Receive, 0, b"t", b"", b"");
    }

    #[test]
    fn byte_budget_is_shared_and_ends_the_episode() {
        let tmp = tempfile::tempdir().unwrap();
        let one = "ts: 1 topic: 1[a] key: 0[] value: 0[]\n".len() as u64;
        let d = configured(tmp.path(), HOUR, 2 * one);
        d.add_all_topics();
        d.log(DebugFile::Receive, 1, b"a", b"", b"");
        d.log(DebugFile::Send, 1, b"a", b"", b"");
        assert!(d.enabled_for(b"a"));
        d.log(DebugFile::GotAck, 1, b"a", b"", b""); // over budget: stops
        assert!(!d.enabled_for(b"a"));
        assert_eq!(read(tmp.path(), DebugFile::GotAck), "");
        // The selection survives; a new add starts a new episode with fresh files.
        assert_eq!(
            d.get_topics(),
            "All message debug topics are currently enabled\n"
        );
        d.add_all_topics();
        assert!(d.enabled_for(b"a"));
        assert_eq!(read(tmp.path(), DebugFile::Receive), "", "files recreated");
        d.log(DebugFile::Receive, 1, b"a", b"", b"");
        assert_eq!(read(tmp.path(), DebugFile::Receive).len() as u64, one);
    }

    #[test]
    fn time_limit_ends_the_episode() {
        let tmp = tempfile::tempdir().unwrap();
        let d = configured(tmp.path(), Duration::from_secs(10), 1 << 20);
        d.add_topic(b"a");
        let t0 = Instant::now();
        d.log_at(
            t0 + Duration::from_secs(9),
            DebugFile::Receive,
            1,
            b"a",
            b"",
            b"",
        );
        assert!(d.enabled_for(b"a"));
        d.log_at(
            t0 + Duration::from_secs(11),
            DebugFile::Receive,
            2,
            b"a",
            b"",
            b"",
        );
        assert!(!d.enabled_for(b"a"));
        assert_eq!(
            read(tmp.path(), DebugFile::Receive),
            "ts: 1 topic: 1[a] key: 0[] value: 0[]\n"
        );
        // Re-adding after the stop: the topic is still selected, so that add fails;
        // add_all_topics (or del + add) starts a new episode.
        assert_eq!(d.add_topic(b"a"), "Failed to enable debug topic [a]\n");
        d.del_topic(b"a");
        assert_eq!(d.add_topic(b"a"), "Enabled debug topic [a]\n");
        assert!(d.enabled_for(b"a"));
    }

    #[test]
    fn truncate_empties_files_and_logging_goes_on() {
        let tmp = tempfile::tempdir().unwrap();
        let d = configured(tmp.path(), HOUR, 1 << 20);
        assert_eq!(d.truncate_files(), "Message debug files truncated\n");
        d.add_topic(b"a");
        d.log(DebugFile::Receive, 1, b"a", b"", b"");
        d.log(DebugFile::Send, 1, b"a", b"", b"");
        assert_eq!(
            body(&d, "/msg_debug/truncate_files"),
            "Message debug files truncated\n"
        );
        assert_eq!(read(tmp.path(), DebugFile::Receive), "");
        assert_eq!(read(tmp.path(), DebugFile::Send), "");
        d.log(DebugFile::Receive, 2, b"a", b"", b"");
        assert_eq!(
            read(tmp.path(), DebugFile::Receive),
            "ts: 2 topic: 1[a] key: 0[] value: 0[]\n",
            "no hole of zeros before the new line"
        );
        // Truncating while stopped works on the files on disk.
        d.log(DebugFile::Send, 3, b"a", b"", b"");
        d.del_all_topics();
        d.truncate_files();
        assert_eq!(read(tmp.path(), DebugFile::Send), "");
    }

    #[test]
    fn an_unusable_directory_leaves_logging_off() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("debug"), "a file, not a directory").unwrap();
        let d = configured(tmp.path(), HOUR, 1 << 20);
        let reply = d.add_topic(b"a");
        assert!(
            reply.starts_with("Failed to enable debug topic [a]: "),
            "{reply}"
        );
        assert!(!d.enabled_for(b"a"));
        assert_eq!(
            d.get_topics(),
            "No message debug topics are currently enabled\n"
        );
        assert!(d
            .add_all_topics()
            .starts_with("Failed to enable all message debug topics: "));
    }

    #[test]
    fn shared_between_threads() {
        let tmp = tempfile::tempdir().unwrap();
        let d = Arc::new(configured(tmp.path(), HOUR, 1 << 20));
        d.add_all_topics();
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let d = Arc::clone(&d);
                std::thread::spawn(move || {
                    for n in 0..100 {
                        d.log(DebugFile::Send, i * 1000 + n, b"t", b"key", b"value");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = read(tmp.path(), DebugFile::Send);
        assert_eq!(text.lines().count(), 400);
        assert!(text
            .lines()
            .all(|l| l.ends_with(" topic: 1[t] key: 4[a2V5] value: 8[dmFsdWU=]")));
    }
}
