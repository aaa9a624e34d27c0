#![allow(clippy::unwrap_used)]
//! Helpers shared by the CLI's integration tests: run the real binary against the real test
//! server.
#![allow(dead_code)]

pub mod writer;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)]
pub use sluice_testkit::files;
#[allow(unused_imports)]
pub use sluice_testkit::pg::TestDb;

/// The sluice binary built for these tests.
pub fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.env_remove("PGPASSWORD")
        .env_remove("SLUICE_LOG_FORMAT")
        .env("SLUICE_LOG", "warn");
    c
}

/// Result of one run.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "sluice failed:\n{}", self.stderr);
        self
    }
}

/// How long a test lets one `sluice` run take before it kills it and fails: a hung export
/// fails its test with the output so far instead of stalling the whole suite.
/// `SLUICE_TEST_RUN_TIMEOUT` (seconds) overrides the default of 300.
fn run_timeout() -> Duration {
    let secs = std::env::var("SLUICE_TEST_RUN_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

/// Wait for a spawned `sluice` and collect its output (piped streams are read as it runs).
/// Past the run timeout the process is killed and the test fails, showing what it printed.
pub fn finish(mut child: Child) -> Output {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + run_timeout();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for sluice") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sluice (pid {}) did not finish within {:?} and was killed; it printed:\n{}{}",
                child.id(),
                run_timeout(),
                String::from_utf8_lossy(&out.join().unwrap_or_default()),
                String::from_utf8_lossy(&err.join().unwrap_or_default()),
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

pub fn run(cmd: &mut Command) -> Run {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running sluice");
    let Output {
        status,
        stdout,
        stderr,
    } = finish(child);
    Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// `sluice export --source URL --to DIR ARGS…`.
pub fn export(url: &str, to: &Path, args: &[&str]) -> Run {
    run(sluice()
        .arg("export")
        .arg("--source")
        .arg(url)
        .arg("--to")
        .arg(to)
        .args(args))
}

/// Every retry warning in `stderr` names its part once: `<dataset> part <n>: … — retrying in …`
/// (the reader names the part; the worker that logs the warning adds no prefix of its own).
/// Fails when there is no retry warning at all.
pub fn assert_retries_name_their_part_once(stderr: &str, dataset: &str) {
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("retrying in"))
        .collect();
    assert!(!warnings.is_empty(), "no retry warning in:\n{stderr}");
    for w in warnings {
        assert_eq!(w.matches(" part ").count(), 1, "the part named once: {w}");
        assert_eq!(w.matches(dataset).count(), 1, "{dataset} named once: {w}");
        assert!(w.contains(&format!("{dataset} part ")), "{w}");
    }
}

/// A fresh temporary directory (removed when dropped).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sluice-test-")
        .tempdir()
        .expect("tempdir")
}

/// Every file under `dir`, relative, sorted.
pub fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p: PathBuf = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}
