//! The README's first command: `scripts/demo` loads a sample table and exports it. Its inner
//! script (what `scripts/demo` runs once the release build and the throwaway server are up) is
//! run here with this build's binary, past the row count where the sample's arithmetic once
//! overflowed `int` (the load failed, psql went on, and an empty table was exported with exit
//! 0): the export must hold every sample row, counted by reading the files back.

use crate::common::{files, run, tempdir};
use std::path::Path;
use std::process::Command;

#[test]
fn the_demo_exports_every_sample_row() {
    let rows = 25_000u64;
    let out = tempdir();
    let db = format!("demo_{:016x}", rand::random::<u64>());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let r = run(Command::new("bash")
        .arg("scripts/lib/demo-inner.sh")
        .current_dir(&root)
        .env("SLUICE", env!("CARGO_BIN_EXE_sluice"))
        .env("ROWS", rows.to_string())
        .env("DEMO_DB", &db)
        .env("DEMO_OUT", out.path())
        .env("SLUICE_TEST_PG_URL", sluice_testkit::pg::server_url()));
    r.ok();
    assert!(!r.stderr.contains("ERROR"), "{}", r.stderr);
    let read: usize = files::dataset_batches(&out.path().join("public.orders"))
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(read as u64, rows, "rows in the demo's Parquet files");
}
