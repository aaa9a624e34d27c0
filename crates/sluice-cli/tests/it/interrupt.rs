#![allow(clippy::unwrap_used)]
//! A killed or interrupted export leaves nothing complete-looking: no manifest, and every file
//! under a final name is whole.

use crate::common::*;
use std::path::Path;
use std::time::{Duration, Instant};

async fn big_table(db: &TestDb) {
    db.exec(
        "CREATE TABLE big (id bigint PRIMARY KEY, a int, b text);
         INSERT INTO big SELECT g, g % 1000, repeat(md5(g::text), 4) FROM generate_series(1, 600000) g;
         ANALYZE big;",
    )
    .await;
}

/// Wait until a hidden temporary part appears (the export is mid-write).
fn wait_for_temporary(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if files_under(dir)
            .iter()
            .any(|f| f.contains("/.part-") && f.ends_with(".tmp"))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no part was being written within 60 s");
}

fn assert_nothing_complete_looking(dir: &Path) {
    assert!(
        !dir.join("manifest.json").exists(),
        "manifest written by a killed run"
    );
    for f in files_under(dir) {
        let name = f.rsplit('/').next().unwrap();
        if name.starts_with("part-") {
            // Under a final name: must be a whole Parquet file.
            let batches = files::parquet_batches(&dir.join(&f));
            assert!(
                batches.iter().map(|b| b.num_rows()).sum::<usize>() > 0,
                "{f} is empty"
            );
        }
    }
}

/// Start an export of `big` into `out`, two workers, parts of 8 MB.
fn start_export(
    db: &TestDb,
    out: &std::path::Path,
    stderr: std::process::Stdio,
) -> std::process::Child {
    sluice()
        .args([
            "export",
            "--source",
            &db.url,
            "--table",
            "big",
            "--parallel",
            "2",
            "--chunk-size",
            "8MB",
            "--batch-size",
            "1MB",
            "--to",
        ])
        .arg(out)
        .stderr(stderr)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn kill_9_midway_leaves_no_manifest_and_no_partial_final_file() {
    let db = TestDb::new().await;
    big_table(&db).await;
    let out = tempdir();
    let mut child = start_export(&db, out.path(), std::process::Stdio::null());
    wait_for_temporary(out.path());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_nothing_complete_looking(out.path());
}

#[tokio::test]
async fn sigterm_stops_cleanly_with_exit_130() {
    let db = TestDb::new().await;
    big_table(&db).await;
    let out = tempdir();
    let child = start_export(&db, out.path(), std::process::Stdio::piped());
    wait_for_temporary(out.path());
    crate::common::signal(&child, libc::SIGTERM);
    let output = finish(child);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    assert_nothing_complete_looking(out.path());
    let temporaries: Vec<String> = files_under(out.path())
        .into_iter()
        .filter(|f| f.ends_with(".tmp"))
        .collect();
    assert!(
        temporaries.is_empty(),
        "an orderly stop removes its temporaries: {temporaries:?}"
    );
}
