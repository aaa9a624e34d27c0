//! Running the real `sluice` binary in tests: its output collected as it runs, a time limit
//! that fails a hung run instead of stalling the suite, and failpoints that stop it at named
//! places (`sluice_core::failpoint`) so a test acts at an exact moment instead of racing it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// What one run printed and how it ended.
pub struct Run {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error (logs, the report, the error).
    pub stderr: String,
}

impl Run {
    /// Fail the test, showing stderr, unless the run succeeded.
    pub fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "sluice failed:\n{}", self.stderr);
        self
    }

    /// Fail the test unless the run exited with `code` and its stderr says every one of
    /// `needles` (a refusal's exit code and the words that name the problem and the fix).
    #[track_caller]
    pub fn refused(&self, code: i32, needles: &[&str]) -> &Self {
        assert_eq!(self.code, code, "{}", self.stderr);
        self.says(needles)
    }

    /// Fail the test unless the run failed (any exit code but 0) and its stderr says every
    /// one of `needles`.
    #[track_caller]
    pub fn failed(&self, needles: &[&str]) -> &Self {
        assert_ne!(self.code, 0, "{}", self.stderr);
        self.says(needles)
    }

    /// Fail the test unless stderr says every one of `needles`.
    #[track_caller]
    pub fn says(&self, needles: &[&str]) -> &Self {
        for needle in needles {
            assert!(
                self.stderr.contains(needle),
                "stderr does not say {needle:?}:\n{}",
                self.stderr
            );
        }
        self
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// How long one run may take before it is killed and the test fails:
/// `SLUICE_TEST_RUN_TIMEOUT` seconds, 300 by default.
fn run_timeout() -> Duration {
    let secs = std::env::var("SLUICE_TEST_RUN_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

/// Wait for a spawned process and collect its output (piped streams are read as it runs).
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

/// Run `cmd` armed with failpoint `spec` (an `exit` action, as `kill -9` would leave the
/// run): it must die there, saying so; fails the test otherwise.
#[track_caller]
pub fn run_dying_at(cmd: &mut Command, spec: &str) -> Run {
    let fp = Failpoints::new();
    fp.arm(cmd, spec);
    let r = run(cmd);
    assert_ne!(r.code, 0, "{spec}: the run did not die:\n{}", r.stderr);
    assert!(r.stderr.contains("failpoint"), "{spec}: {}", r.stderr);
    r
}

/// Run `cmd` to its end, output piped.
pub fn run(cmd: &mut Command) -> Run {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running sluice");
    finish(child).into()
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
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// The receipts of committed parts in an output directory.
pub fn receipts(dir: &Path) -> usize {
    files_under(dir)
        .iter()
        .filter(|f| f.starts_with("_sluice/parts/") && f.ends_with(".json"))
        .count()
}

/// Failpoints for one `sluice` process (see `sluice_core::failpoint`).
pub struct Failpoints {
    dir: tempfile::TempDir,
}

impl Default for Failpoints {
    fn default() -> Self {
        Failpoints { dir: tempdir() }
    }
}

impl Failpoints {
    /// A fresh signalling directory.
    pub fn new() -> Failpoints {
        Failpoints::default()
    }

    /// Arm `spec` (`name=action[@n],…`) on `cmd`.
    pub fn arm<'a>(&self, cmd: &'a mut Command, spec: &str) -> &'a mut Command {
        cmd.env("SLUICE_FAILPOINTS", spec)
            .env("SLUICE_FAILPOINT_DIR", self.dir.path())
    }

    fn path(&self, name: &str, what: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.{what}"))
    }

    /// Wait until the process blocks at `name` (armed with `wait`). The wait is for a file
    /// the process creates at that moment; the process ending first fails the test.
    pub async fn reached(&self, name: &str, child: &mut Child) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.path(name, "reached").exists() {
            if let Some(status) = child.try_wait().expect("waiting for sluice") {
                panic!("sluice ended ({status}) before reaching failpoint {name}");
            }
            assert!(Instant::now() < deadline, "failpoint {name} not reached");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Let the process go on from `name`.
    pub fn release(&self, name: &str) {
        std::fs::write(self.path(name, "release"), b"go").expect("releasing a failpoint");
    }

    /// Run `cmd` to its end with failpoint `name` armed `wait@1`: once the program waits there,
    /// `meanwhile` runs (writes to put at that exact point, checks of what the paused program
    /// holds), then the program goes on. Panics with its stderr when the program fails; returns
    /// its output.
    pub async fn run_paused_at(
        &self,
        cmd: &mut Command,
        name: &str,
        meanwhile: impl std::future::Future<Output = ()>,
    ) -> Output {
        self.arm(cmd, &format!("{name}=wait@1"));
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running sluice");
        self.reached(name, &mut child).await;
        meanwhile.await;
        self.release(name);
        let out = finish(child);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}
