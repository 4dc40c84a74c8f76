//! The commit points state file: the latest commit points on disk, replaced atomically
//! at a bounded rate by the `commit-points` thread, so that after a crash an operator can
//! read the last ones.

use std::fs::File;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select_biased, tick, Sender};
use serde::Serialize;

use super::Points;

/// The state file's content: the commit points only (ages and counts change all the time
/// and are for live monitoring).
#[derive(Debug, Serialize)]
struct StateJson<'a> {
    version: &'a str,
    pid: u32,
    /// When this file was written, ms since the epoch.
    written: u64,
    overall: Option<i64>,
    topics: Vec<StateTopicJson>,
}

#[derive(Debug, Serialize)]
struct StateTopicJson {
    topic: String,
    commit_point: Option<i64>,
}

/// What a state file holds apart from its write time, to tell whether it changed.
type StateKey = (Option<i64>, Vec<(Arc<[u8]>, Option<i64>)>);

fn state_key(p: &Points) -> StateKey {
    (
        p.overall,
        p.topics
            .iter()
            .map(|t| (Arc::clone(&t.name), t.commit_point))
            .collect(),
    )
}

/// The latest commit points on disk, replaced atomically (write `<path>.tmp`, fsync,
/// rename over `<path>`, fsync the directory), so a reader after a crash finds either the
/// previous or the new content, never a torn one.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    tmp: PathBuf,
    version: String,
    last: Option<StateKey>,
}

/// `<path><suffix>`, in the same directory (so a rename stays on one file system).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

impl StateFile {
    /// At start-up: keeps the previous run's file (if any) as `<path>.prev`, so the last
    /// commit point before a crash survives a restart, then writes an empty state. An
    /// error here means the path is unusable.
    pub fn create(path: &Path, version: &str) -> io::Result<StateFile> {
        if path.exists() {
            std::fs::rename(path, with_suffix(path, ".prev"))?;
        }
        let mut f = StateFile {
            path: path.to_path_buf(),
            tmp: with_suffix(path, ".tmp"),
            version: version.to_string(),
            last: None,
        };
        f.write(&Points::default(), 0)?;
        Ok(f)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `points` unless the commit points equal the last written ones; returns
    /// whether it wrote.
    pub fn write(&mut self, points: &Points, now_ms: u64) -> io::Result<bool> {
        let key = state_key(points);
        if self.last.as_ref() == Some(&key) {
            return Ok(false);
        }
        let doc = StateJson {
            version: &self.version,
            pid: std::process::id(),
            written: now_ms,
            overall: points.overall,
            topics: points
                .topics
                .iter()
                .map(|t| StateTopicJson {
                    topic: String::from_utf8_lossy(&t.name).into_owned(),
                    commit_point: t.commit_point,
                })
                .collect(),
        };
        let mut bytes = serde_json::to_vec_pretty(&doc).map_err(io::Error::other)?;
        bytes.push(b'\n');
        write_atomic(&self.path, &self.tmp, &bytes)?;
        self.last = Some(key);
        Ok(true)
    }
}

/// Replaces `path` with `bytes` through `tmp`: a reader sees the old or the new content.
fn write_atomic(path: &Path, tmp: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = File::create(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(tmp, path)?;
    // The rename is durable once the directory is.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Minimum interval between two log lines about state file errors.
const FILE_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The thread (`commit-points`) that writes the state file at its interval, when changed,
/// and once more when stopped.
pub struct StateWriter {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl StateWriter {
    /// Starts the thread. `points` reads the current state; `errors` counts failed writes.
    pub fn spawn(
        mut file: StateFile,
        interval: Duration,
        mut points: impl FnMut() -> Points + Send + 'static,
        errors: &'static AtomicU64,
    ) -> io::Result<StateWriter> {
        let (stop, stopped) = bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("commit-points".into())
            .spawn(move || {
                let ticks = tick(interval);
                let mut last_log: Option<Instant> = None;
                let mut write = |file: &mut StateFile| {
                    if let Err(e) = file.write(&points(), crate::report::metrics::now_ms()) {
                        errors.fetch_add(1, Ordering::Relaxed);
                        if last_log.is_none_or(|t| t.elapsed() >= FILE_ERROR_LOG_INTERVAL) {
                            log::error!(
                                "cannot write commit points to {}: {e}",
                                file.path().display()
                            );
                            last_log = Some(Instant::now());
                        }
                    }
                };
                loop {
                    select_biased! {
                        recv(stopped) -> _ => {
                            write(&mut file);
                            return;
                        }
                        recv(ticks) -> _ => write(&mut file),
                    }
                }
            })?;
        Ok(StateWriter {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Writes the final state (if changed) and waits for the thread to end.
    pub fn stop(mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("commit-points thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::commit_points::TopicPoint;

    fn point(name: &str, cp: Option<i64>) -> TopicPoint {
        TopicPoint {
            name: Arc::from(name.as_bytes()),
            commit_point: cp,
            unresolved: 0,
            oldest_unacked: Duration::ZERO,
            late_arrivals: 0,
        }
    }

    fn read_json(path: &Path) -> serde_json::Value {
        let text = std::fs::read_to_string(path).expect("state file readable");
        serde_json::from_str(&text).expect("state file is JSON")
    }

    #[test]
    fn state_file_keeps_the_previous_run_and_writes_only_changes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cp.json");
        std::fs::write(&path, "previous run\n").expect("seed an old file");
        let mut f = StateFile::create(&path, "9.9").expect("create");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cp.json.prev")).expect("prev kept"),
            "previous run\n"
        );
        let v = read_json(&path);
        assert_eq!(v["overall"], serde_json::Value::Null);
        assert_eq!(v["topics"], serde_json::json!([]));
        assert_eq!(v["version"], "9.9");

        let p = Points::new(
            vec![point("b", Some(200)), point("a", Some(100))],
            [(None, Some(200)), (None, Some(100))],
        );
        assert!(f.write(&p, 1234).expect("write"));
        let v = read_json(&path);
        assert_eq!(v["written"], 1234);
        assert_eq!(v["overall"], 200);
        assert_eq!(
            v["topics"],
            serde_json::json!([
                {"topic": "a", "commit_point": 100},
                {"topic": "b", "commit_point": 200},
            ])
        );
        assert!(
            !f.write(&p, 5678).expect("unchanged"),
            "nothing new to write"
        );
        assert_eq!(read_json(&path)["written"], 1234);
        let mut q = p.clone();
        q.topics[0].unresolved = 7;
        assert!(!f.write(&q, 5678).expect("unchanged"), "only T matters");
        q.topics[0].commit_point = Some(150);
        assert!(f.write(&q, 5678).expect("changed"));
        assert_eq!(read_json(&path)["topics"][0]["commit_point"], 150);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn state_file_in_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let e = StateFile::create(&dir.path().join("no/such/dir/cp.json"), "v").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn state_writer_writes_on_its_interval_and_at_stop() {
        static ERRORS: AtomicU64 = AtomicU64::new(0);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cp.json");
        let f = StateFile::create(&path, "v").expect("create");
        let cp = Arc::new(AtomicU64::new(10));
        let w = {
            let cp = Arc::clone(&cp);
            StateWriter::spawn(
                f,
                Duration::from_millis(10),
                move || {
                    let t = cp.load(Ordering::SeqCst) as i64;
                    Points::new(vec![point("a", Some(t))], [(None, Some(t))])
                },
                &ERRORS,
            )
            .expect("spawn")
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while read_json(&path)["overall"] != 10 {
            assert!(Instant::now() < deadline, "the writer never wrote");
            std::thread::sleep(Duration::from_millis(5));
        }
        cp.store(20, Ordering::SeqCst);
        w.stop();
        assert_eq!(
            read_json(&path)["overall"],
            20,
            "final state written at stop"
        );
        assert_eq!(ERRORS.load(Ordering::SeqCst), 0);
    }
}
