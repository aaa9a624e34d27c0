#![allow(clippy::unwrap_used)]
//! `--consistency converged` whose changed keys outgrow their share of `--memory` (half): the
//! follower writes them, sorted, to files in the temporary directory and the run converges as
//! it does in memory. Mid-run (paused after the first parts), one transaction updates every
//! row of a table with a two-column text key and moves them (the updates grow the rows past
//! their pages), another deletes and inserts keys; the output must equal the table after both,
//! read by the server itself (nothing writes after them, so T follows them). Killed while
//! rewriting parts after such a spill, `--resume` spills again from the first run's start and
//! converges the same way.

use crate::common::*;
use std::process::Command;

const ROWS: i64 = 200_000;

/// The table, and `sluice export --consistency converged` of it into `dir` at a memory whose
/// half the changed keys outgrow (the spill logged at info).
async fn table_and_export(db: &TestDb, dir: &std::path::Path) -> Command {
    db.exec(&format!(
        "CREATE TABLE acct (tenant text, id bigint, v int NOT NULL, pad text NOT NULL,
           PRIMARY KEY (tenant, id));
         CREATE INDEX ON acct (v);
         INSERT INTO acct SELECT 'tenant-of-the-lab-' || (g % 97), g, 0, md5(g::text)
           FROM generate_series(1, {ROWS}) g;
         ANALYZE acct;"
    ))
    .await;
    let mut cmd = sluice();
    // The spill says so at info.
    cmd.env("SLUICE_LOG", "warn,sluice_stream=info");
    cmd.args(["export", "--source", &db.url, "--table", "acct", "--to"])
        .arg(dir)
        .args(["--consistency", "converged", "--parallel", "2"])
        .args(["--chunk-size", "8MB", "--memory", "24MB"]);
    cmd
}

/// Every row updated and moved, then keys deleted, inserted and changed in one transaction.
async fn changes(db: &TestDb) {
    db.exec("UPDATE acct SET v = v + 1, pad = pad || repeat('x', 40)")
        .await;
    db.exec(
        "BEGIN;
         DELETE FROM acct WHERE id % 10 = 3;
         INSERT INTO acct SELECT 'late-' || (g % 7), g, -1, 'new'
           FROM generate_series(1, 5000) g;
         UPDATE acct SET id = id + 1000000 WHERE id % 10 = 7;
         COMMIT;",
    )
    .await;
}

/// The output in `dir` is the table now, and its manifest counts every row as changed.
async fn assert_converged(db: &TestDb, dir: &std::path::Path, what: &str) {
    let want = db.row_strings("SELECT tenant, id, v, pad FROM acct").await;
    let got = files::row_strings(&files::dataset_batches(&dir.join("public.acct")));
    files::assert_same_rows(&got, &want, what);
    let m = files::manifest(dir);
    let changed = m["converged"]["changed_keys"].as_u64().unwrap();
    assert!(changed >= ROWS as u64, "{what}: {changed} changed keys");
}

fn assert_spilled(stderr: &[u8]) {
    let said = String::from_utf8_lossy(stderr);
    assert!(
        said.contains("spilled to disk"),
        "the keys did not outgrow memory: {said}"
    );
}

#[tokio::test]
async fn changed_keys_past_their_memory_share_spill_to_disk_and_converge() {
    let db = TestDb::new().await;
    let tmp = tempdir();
    let dir = tmp.path().join("data");
    let mut cmd = table_and_export(&db, &dir).await;
    let out = Failpoints::new()
        .run_paused_at(&mut cmd, "export.after_receipt", changes(&db))
        .await;
    assert_spilled(&out.stderr);
    assert_converged(&db, &dir, "acct vs. the table after the changes").await;
}

/// Killed (as by `kill -9`) after the first part's rewrite, its keys spilled to files: no
/// manifest; `--resume` follows the log from the first run's start again, spills again, and
/// its output is the table (rows changed again between the two runs included).
#[tokio::test]
async fn killed_after_a_spill_the_resumed_run_converges() {
    let db = TestDb::new().await;
    let tmp = tempdir();
    let dir = tmp.path().join("data");
    let fp = Failpoints::new();
    let mut cmd = table_and_export(&db, &dir).await;
    fp.arm(
        &mut cmd,
        "export.after_receipt=wait@1,converge.after_rewrite=exit@1",
    );
    let mut child = spawn(&mut cmd);
    fp.reached("export.after_receipt", &mut child).await;
    changes(&db).await;
    fp.release("export.after_receipt");
    let out = finish(child);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("failpoint converge.after_rewrite: exit"),
        "not killed at the rewrite: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_spilled(&out.stderr);
    assert!(!dir.join("manifest.json").exists());
    db.exec("UPDATE acct SET v = v * 2 WHERE id % 1000 = 1")
        .await;

    let mut resume = sluice();
    resume
        .env("SLUICE_LOG", "warn,sluice_stream=info")
        .args(["export", "--source", &db.url, "--table", "acct", "--to"])
        .arg(&dir)
        .args(["--consistency", "converged", "--parallel", "2"])
        .args(["--chunk-size", "8MB", "--memory", "24MB", "--resume"]);
    let out = resume.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_spilled(&out.stderr);
    assert_converged(&db, &dir, "acct after the kill and --resume").await;
    let slots = db
        .row_strings(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()",
        )
        .await;
    assert!(slots.is_empty(), "a slot was left: {slots:?}");
}
