#![allow(clippy::unwrap_used)]
//! Helpers shared by the CLI's integration tests: run the real binary against the real test
//! server.
#![allow(dead_code)]

pub mod writer;

use std::path::Path;
use std::process::Command;

#[allow(unused_imports)]
pub use sluice_testkit::files;
#[allow(unused_imports)]
pub use sluice_testkit::pg::TestDb;
#[allow(unused_imports)]
pub use sluice_testkit::process::{Failpoints, Run, files_under, finish, run, tempdir};
#[allow(unused_imports)]
pub use sluice_testkit::scenario::assert_retries_name_their_part_once;

/// The sluice binary built for these tests.
pub fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.env_remove("PGPASSWORD")
        .env_remove("SLUICE_LOG_FORMAT")
        .env("SLUICE_LOG", "warn");
    c
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

/// The harness of every source's suites, starting this crate's binary.
pub fn harness() -> sluice_testkit::scenario::Sluice {
    sluice_testkit::scenario::Sluice { command: sluice }
}
