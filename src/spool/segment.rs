//! Segment files: fixed-size, preallocated (`posix_fallocate`), written with positioned
//! writes, synced with `fdatasync`. A segment whose messages are all resolved gets a
//! "free" header and waits as a spare to be reused under a new id (its old records then
//! read as the end of the log: see `format`), so steady state creates no files.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::format::{SegmentHeader, FREE_SEGMENT, HEADER_LEN, VERSION};

/// File name suffix of segment files.
pub const SUFFIX: &str = "spool";
/// Suffix given to segment files recovery could not use, moving them out of the way.
pub const UNREADABLE_SUFFIX: &str = "unreadable";

/// One segment file, open for reading and writing.
#[derive(Debug)]
pub struct SegmentFile {
    pub path: PathBuf,
    pub file: File,
}

impl SegmentFile {
    /// Creates `dir/segment-<n>.spool` of `size` bytes, preallocated, with a free header.
    /// ENOSPC here is how a full disk shows up: before any record is written.
    pub fn create(dir: &Path, n: u64, size: u64) -> io::Result<SegmentFile> {
        let path = dir.join(format!("segment-{n:08}.{SUFFIX}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let len = libc::off_t::try_from(size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        // SAFETY: `file` is an open descriptor for the call's duration; posix_fallocate only
        // reads its arguments and returns an error number (it does not set errno).
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        if rc != 0 {
            let _ = std::fs::remove_file(&path);
            return Err(io::Error::from_raw_os_error(rc));
        }
        let seg = SegmentFile { path, file };
        if let Err(e) = seg.write_header(FREE_SEGMENT, size) {
            let _ = std::fs::remove_file(&seg.path);
            return Err(e);
        }
        Ok(seg)
    }

    /// Opens an existing segment file.
    pub fn open(path: PathBuf) -> io::Result<SegmentFile> {
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        Ok(SegmentFile { path, file })
    }

    pub fn write_header(&self, id: u64, size: u64) -> io::Result<()> {
        let h = SegmentHeader {
            version: VERSION,
            id,
            size,
        };
        self.file.write_all_at(&h.encode(), 0)
    }

    /// Writes record bytes at `offset` of the record area.
    pub fn write_records(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(bytes, HEADER_LEN as u64 + offset)
    }

    /// Zeroes `len` bytes of the record area from `offset` (truncating a torn tail).
    pub fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZEROS.len() as u64) as usize;
            self.write_records(&ZEROS[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Reads the whole file (header and records) into `buf`, at most `max` bytes.
    pub fn read_all(&self, buf: &mut Vec<u8>, max: u64) -> io::Result<()> {
        let len = self.file.metadata()?.len().min(max);
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "segment too large"))?;
        buf.clear();
        buf.resize(len, 0);
        let mut at = 0;
        while at < len {
            match self.file.read_at(&mut buf[at..], at as u64)? {
                0 => break,
                n => at += n,
            }
        }
        buf.truncate(at);
        Ok(())
    }

    /// Moves the file aside (`<name>.unreadable`), so it is kept for inspection but no
    /// longer read or counted as a segment.
    pub fn move_aside(path: &Path) -> io::Result<PathBuf> {
        let mut to = path.as_os_str().to_owned();
        to.push(".");
        to.push(UNREADABLE_SUFFIX);
        let to = PathBuf::from(to);
        std::fs::rename(path, &to)?;
        Ok(to)
    }
}

/// The segment files in `dir` (`*.spool`), and the highest file number among them.
pub fn list(dir: &Path) -> io::Result<(Vec<PathBuf>, u64)> {
    let mut files = Vec::new();
    let mut max_n = 0;
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().and_then(|x| x.to_str()) != Some(SUFFIX) {
            continue;
        }
        if let Some(n) = p
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix("segment-"))
            .and_then(|s| s.parse::<u64>().ok())
        {
            max_n = max_n.max(n);
        }
        files.push(p);
    }
    files.sort();
    Ok((files, max_n))
}

/// Takes an exclusive lock on `dir/lock`, so two daemons never share a spool.
pub fn lock_dir(dir: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    // SAFETY: `f` is an open descriptor; flock only takes the lock, released when the
    // descriptor closes.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}
