#![allow(clippy::unwrap_used)]
//! Helpers shared by the CLI's integration tests: run the real binary against the real test
//! server.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[allow(unused_imports)]
pub use sluice_testkit::files;
#[allow(unused_imports)]
pub use sluice_testkit::pg::TestDb;

/// The sluice binary built for these tests.
pub fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.env_remove("PGPASSWORD").env("SLUICE_LOG", "warn");
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

pub fn run(cmd: &mut Command) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("running sluice");
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
