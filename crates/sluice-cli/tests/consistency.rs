#![allow(clippy::unwrap_used)]
//! Consistency under load: while 4 workers export, another session inserts, updates (growing
//! rows so they move to other pages, across ctid chunk boundaries) and deletes. The export must
//! equal the table exactly as of the run's snapshot, which the test reads by importing the same
//! snapshot (its id is in the run state) while the coordinator still holds it.

mod common;

use common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    let child = sluice()
        .args([
            "export",
            "--source",
            &db.url,
            "--table",
            "hot",
            "--parallel",
            "4",
            "--chunk-size",
            "1MB",
            "--batch-size",
            "256KB",
            "--to",
        ])
        .arg(out.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // Join the run's snapshot from its run state while the coordinator holds it.
    let run_state = out.path().join("_sluice/run.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    let snapshot_id = loop {
        if let Ok(text) = std::fs::read_to_string(&run_state)
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
        {
            break v["snapshots"][0]["id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no run state within 60 s");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let oracle = sluice_testkit::pg::connect(&db.url).await;
    oracle
        .batch_execute(&format!("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_id}'"))
        .await
        .expect("importing the export's snapshot (the export must still be running)");
    let changes_at_snapshot = changes.load(Ordering::Relaxed);
    let want = sluice_testkit::pg::rows_as_strings(&oracle, "SELECT id, v, pad FROM hot").await;

    let output = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
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
