//! Paths, ports and child processes: the `dory` binary, free ports, commands with a
//! timeout, and [`Proc`], a child stopped by PID from `Drop`.

use super::*;

/// The dory binary: cargo's `CARGO_BIN_EXE_dory` inside the dory crate, else `$DORY_BIN`
/// (so the same files can be compiled from another crate).
pub fn dory_bin() -> PathBuf {
    if let Some(p) = option_env!("CARGO_BIN_EXE_dory") {
        return PathBuf::from(p);
    }
    match std::env::var_os("DORY_BIN") {
        Some(p) => PathBuf::from(p),
        None => panic!("no dory binary: not built as part of the dory crate and DORY_BIN is unset"),
    }
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the manifest if relative),
/// else `<manifest>/target`.
pub fn target_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => manifest.join(d),
        None => manifest.join("target"),
    }
}

/// A free TCP port on 127.0.0.1 (bound once to let the kernel choose, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// Output of a finished helper command.
pub struct CmdOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to completion, killing it (by its PID) and panicking if it takes longer than
/// `timeout`.
pub fn run_command(cmd: &mut Command, timeout: Duration) -> CmdOutput {
    let described = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {described}: {e}"));
    let mut out = child.stdout.take().expect("stdout is piped");
    let mut err = child.stderr.take().expect("stderr is piped");
    let out_reader = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => thread::sleep(POLL_INTERVAL),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{described} did not finish within {timeout:?}; killed it");
            }
            Err(e) => panic!("waiting for {described}: {e}"),
        }
    };
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    CmdOutput {
        status,
        stdout,
        stderr,
    }
}

/// A child process we started, with stdout/stderr going to files. Dropping it kills the
/// child (SIGKILL to its PID) if still running, and prints its output if the thread is
/// panicking, so a failing test shows what the process said and leaks nothing.
pub struct Proc {
    name: String,
    child: Child,
    exit: Option<ExitStatus>,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    /// Spawns `cmd` with its output in `<log_dir>/<name>.stdout|stderr`.
    pub fn spawn(name: &str, cmd: &mut Command, log_dir: &Path) -> Proc {
        let stdout = log_dir.join(format!("{name}.stdout"));
        let stderr = log_dir.join(format!("{name}.stderr"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("create stdout log"))
            .stderr(File::create(&stderr).expect("create stderr log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Proc {
            name: name.to_string(),
            child,
            exit: None,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has exited (non-blocking).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("try_wait on own child");
        }
        self.exit
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_exit() {
                return Some(s);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }

    /// Sends SIGTERM to this child's PID.
    pub fn sigterm(&self) {
        let out = run_command(
            Command::new("kill").args(["-TERM", &self.pid().to_string()]),
            Duration::from_secs(10),
        );
        assert!(
            out.status.success(),
            "kill -TERM {} failed: {}",
            self.pid(),
            out.stderr
        );
    }

    /// Everything the process wrote so far.
    pub fn logs(&self) -> String {
        let read = |p: &Path| {
            fs::read(p)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_else(|e| format!("<cannot read {}: {e}>", p.display()))
        };
        format!(
            "----- {} (pid {}) stdout -----\n{}\n----- {} stderr -----\n{}\n\
             ----- end of {} output -----",
            self.name,
            self.pid(),
            read(&self.stdout),
            self.name,
            read(&self.stderr),
            self.name
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}
