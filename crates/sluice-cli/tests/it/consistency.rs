#![allow(clippy::unwrap_used)]
//! Consistency under load: while 4 workers export, another session inserts, updates (growing
//! rows so they move to other pages, across ctid chunk boundaries) and deletes. The export must
//! equal the table exactly as of the run's snapshot, which the test reads by importing the same
//! snapshot (its id is in the run state) while the coordinator still holds it.

use crate::common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

#[tokio::test]
async fn four_workers_see_one_snapshot_under_concurrent_writes() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE hot (id bigint PRIMARY KEY, v int, pad text);
         INSERT INTO hot SELECT g, 0, md5(g::text) FROM generate_series(1, 400000) g;
         ANALYZE hot;",
    )
    .await;

    // The writer: small transactions until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (url, stop, changes) = (db.url.clone(), stop.clone(), changes.clone());
        tokio::spawn(async move {
            let c = sluice_testkit::pg::connect(&url).await;
            let mut i: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let id = (i * 7919) % 400_000 + 1;
                // Growing the row moves it to another page: it leaves its ctid chunk.
                c.batch_execute(&format!(
                    "BEGIN;
                     UPDATE hot SET v = v + 1, pad = pad || repeat('x', 200) WHERE id = {id};
                     DELETE FROM hot WHERE id = {};
                     INSERT INTO hot VALUES ({}, -1, 'new') ON CONFLICT (id) DO UPDATE SET v = -2;
                     COMMIT;",
                    (id * 13) % 400_000 + 1,
                    400_000 + i
                ))
                .await
                .unwrap();
                changes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Let the writer get going before the snapshot is taken.
    while changes.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let out = tempdir();
    let args = words("--table hot --parallel 4 --chunk-size 1MB --batch-size 256KB");
    // The snapshot is pinned and the plan written: join the snapshot (its id is in the run
    // state) while the coordinator holds it.
    let paused = harness()
        .paused_at(&db.url, out.path(), &args, "export.after_plan")
        .await;
    let run_state = files::json(&out.path().join("_sluice/run.json"));
    let snapshot_id = run_state["snapshots"][0]["id"].as_str().unwrap();
    let oracle = sluice_testkit::pg::connect(&db.url).await;
    oracle
        .batch_execute(&format!("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_id}'"))
        .await
        .expect("importing the export's snapshot (the export must still be running)");
    let changes_at_snapshot = changes.load(Ordering::Relaxed);
    let want = sluice_testkit::pg::rows_as_strings(&oracle, "SELECT id, v, pad FROM hot").await;

    paused.release().await.ok();
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();

    let got = files::row_strings(&files::dataset_batches(&out.path().join("public.hot")));
    files::assert_same_rows(&got, &want, "export vs. the table as of its snapshot");
    // The test means something only if the table changed while the export ran.
    assert!(
        changes.load(Ordering::Relaxed) > changes_at_snapshot + 10,
        "the writer made too few changes during the export"
    );
    let now = db.row_strings("SELECT id, v, pad FROM hot").await;
    assert_ne!(
        now, want,
        "the table should have changed since the snapshot"
    );
    let m = files::manifest(out.path());
    assert_eq!(m["consistency"], "snapshot");
    assert!(
        m["snapshots"][0]["position"]["lsn"]
            .as_str()
            .unwrap()
            .contains('/')
    );
    assert!(m["datasets"][0]["parts"].as_array().unwrap().len() >= 4);
    assert!(
        m["harm"]["peak_connections"].as_u64().unwrap() >= 5,
        "4 workers + coordinator: {}",
        m["harm"]
    );
}

/// `--consistency chunk` reads each chunk in its own transaction. Page ranges would lose or
/// repeat rows an UPDATE moves between two chunk reads, so the table is split on its key:
/// every row whose key does not change is read exactly once, whatever the writer does.
#[tokio::test]
async fn chunk_consistency_reads_every_unchanged_key_exactly_once_under_writes() {
    use crate::common::writer::{Writer, create_table, exported_ids};
    const ROWS: i64 = 150_000;
    let db = TestDb::new().await;
    create_table(&db, "c", ROWS).await;
    db.exec(
        "CREATE TABLE nokey (a int, b text);
         INSERT INTO nokey SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
         CREATE TABLE uk (code bigint NOT NULL UNIQUE, note text);
         INSERT INTO uk SELECT g * 3, md5(g::text) FROM generate_series(1, 20000) g;
         ANALYZE;",
    )
    .await;
    let writer = Writer::start(&db.url, "c", ROWS).await;
    let mark = writer.mark();
    let out = tempdir();
    let args = words(
        "--table c --table nokey --table uk --consistency chunk --parallel 4 \
         --chunk-size 256KB --batch-size 256KB",
    );
    let paused = harness()
        .paused_at(&db.url, out.path(), &args, "export.after_receipt@3")
        .await;
    // Parts are being read in their own transactions: let the writer move rows between them.
    writer.wait_for(100).await;
    paused.release().await.ok();
    let changes = writer.since(&mark);
    writer.stop().await;
    let ids = exported_ids(&out.path().join("public.c"));
    changes.assert_key_guarantee(&ids, "consistency chunk");

    let m = files::manifest(out.path());
    assert_eq!(m["consistency"], "chunk");
    let ds = |name: &str| files::manifest_dataset(&m, name);
    let c = ds("public.c");
    assert!(c["parts"].as_array().unwrap().len() >= 8, "{c}");
    assert_eq!(c["guarantee"]["kind"], "key_ranges");
    assert_eq!(c["guarantee"]["key"], serde_json::json!(["id"]));
    // A table without a key is read in one transaction; a unique NOT NULL key serves as one.
    let nokey = ds("public.nokey");
    assert_eq!(nokey["parts"].as_array().unwrap().len(), 1);
    assert_eq!(nokey["guarantee"]["kind"], "transaction");
    assert_eq!(nokey["rows"], 20000);
    let uk = ds("public.uk");
    assert!(uk["parts"].as_array().unwrap().len() > 1, "{uk}");
    assert_eq!(uk["guarantee"]["key"], serde_json::json!(["code"]));
    assert_eq!(uk["rows"], 20000);

    // Page ranges in separate transactions are refused, with the reason and the way out.
    let run = export(
        &db.url,
        tempdir().path(),
        &[
            "--table",
            "c",
            "--chunk-by",
            "ctid",
            "--consistency",
            "chunk",
        ],
    );
    run.refused(
        2,
        &[
            "--chunk-by ctid cannot be used with --consistency chunk",
            "twice or not at all",
        ],
    );
}
