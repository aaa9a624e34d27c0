#![allow(clippy::unwrap_used)]
//! Consistency under load on MariaDB: while 4 workers export, another session commits small
//! transactions that update, delete and insert rows of `hot` and append their sequence number to
//! `ops` in the same transaction. Both tables are exported in one run; if every worker read the
//! same snapshot, `hot` as exported equals the initial table with exactly the exported `ops`
//! replayed — whichever worker read which chunk. The binary log position and the lock hold time
//! must be in the manifest, and the workers must report one shared binlog snapshot position
//! (the coordinator checks that, or fails the run).

use crate::common::{files, sluice, tempdir};
use mysql_async::prelude::Queryable;
use sluice_testkit::mysql::TestDb;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const N: i64 = 200_000;

fn upd(i: i64) -> i64 {
    (i * 7919) % N + 1
}

fn del(i: i64) -> i64 {
    (i * 13) % N + 1
}

#[tokio::test]
async fn four_workers_see_one_snapshot_under_concurrent_writes() {
    let mut db = TestDb::new().await;
    db.exec(&format!(
        "SET SESSION max_recursive_iterations = 1000000;
         CREATE TABLE hot (id bigint PRIMARY KEY, v int NOT NULL, pad varchar(400) NOT NULL);
         CREATE TABLE ops (seq bigint PRIMARY KEY);
         INSERT INTO hot
           WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {N})
           SELECT n, 0, CONCAT('p', n) FROM g;
         ANALYZE TABLE hot;"
    ))
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let writer = {
        let (url, stop, committed) = (db.url.clone(), stop.clone(), committed.clone());
        tokio::spawn(async move {
            let mut c = sluice_testkit::mysql::connect(&url).await;
            let mut i: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                c.query_drop(format!(
                    "START TRANSACTION;
                     UPDATE hot SET v = v + 1, pad = CONCAT(pad, 'x') WHERE id = {};
                     DELETE FROM hot WHERE id = {};
                     INSERT INTO hot VALUES ({}, -1, 'new');
                     INSERT INTO ops VALUES ({i});
                     COMMIT;",
                    upd(i),
                    del(i),
                    N + i
                ))
                .await
                .unwrap();
                committed.store(i as u64, Ordering::Relaxed);
            }
        })
    };
    while committed.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let out = tempdir();
    let report = out.path().join("report.json");
    let run = {
        let mut cmd = sluice();
        cmd.args([
            "export", "--source", &db.url, "--table", "hot", "--table", "ops",
        ])
        .args([
            "--parallel",
            "4",
            "--chunk-size",
            "1MB",
            "--batch-size",
            "256KB",
        ])
        .arg("--report-json")
        .arg(&report)
        .arg("--to")
        .arg(out.path().join("data"));
        tokio::task::spawn_blocking(move || crate::common::run(&mut cmd))
            .await
            .unwrap()
    };
    let after = committed.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    run.ok();

    // Replay the exported ops on the initial table.
    let dir = out.path().join("data");
    let ops: Vec<i64> = files::row_strings(&files::dataset_batches(
        &dir.join(format!("{}.ops", db.name)),
    ))
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let seen = ops.len() as i64;
    assert_eq!(
        ops.iter().max().copied().unwrap_or(0),
        seen,
        "ops are a prefix 1..=k"
    );
    let mut want: BTreeMap<i64, (i64, String)> =
        (1..=N).map(|n| (n, (0, format!("p{n}")))).collect();
    for i in 1..=seen {
        if let Some(r) = want.get_mut(&upd(i)) {
            r.0 += 1;
            r.1.push('x');
        }
        want.remove(&del(i));
        want.insert(N + i, (-1, "new".into()));
    }
    let mut want: Vec<String> = want
        .into_iter()
        .map(|(k, (v, p))| format!("{k}|{v}|{p}"))
        .collect();
    want.sort();
    let got = files::row_strings(&files::dataset_batches(
        &dir.join(format!("{}.hot", db.name)),
    ));
    files::assert_same_rows(&got, &want, "hot vs. initial rows + exported ops");

    // The table changed while the export ran, so the check above meant something.
    assert!(
        seen >= 20,
        "the snapshot saw the writer's first transactions"
    );
    assert!(
        (after as i64) > seen,
        "the writer committed after the snapshot ({after} vs {seen})"
    );

    let m = files::manifest(&dir);
    assert_eq!(m["consistency"], "snapshot");
    let pos = &m["snapshots"][0]["position"];
    assert_eq!(pos["engine"], "mysql", "{pos}");
    assert!(
        pos["file"].as_str().unwrap().starts_with("mariadb-bin."),
        "{pos}"
    );
    assert!(pos["pos"].as_u64().unwrap() > 0, "{pos}");
    assert!(pos["gtid"].as_str().unwrap().starts_with("0-1-"), "{pos}");
    assert!(m["datasets"][0]["parts"].as_array().unwrap().len() >= 4);
    assert!(
        m["harm"]["global_lock_seconds"].as_f64().unwrap() > 0.0,
        "lock hold time recorded: {}",
        m["harm"]
    );
    assert!(
        m["harm"]["peak_connections"].as_u64().unwrap() >= 5,
        "4 workers + coordinator: {}",
        m["harm"]
    );
    let r = files::json(&report);
    assert!(
        r["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("BACKUP STAGE BLOCK_COMMIT")),
        "{}",
        r["notes"]
    );
}
