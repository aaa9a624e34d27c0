#![allow(clippy::unwrap_used)]
//! `sluice replicate --max-target-lag`: replay paused on the kit's streaming replica — a
//! replica of the *target* (source and target are databases of the kit's primary) — holds the
//! apply of new changes and the run says why; once replay resumes the apply goes on, and the
//! target equals the source. A limit without a readable replica is refused up front.

use crate::common::{TestDb, replicate, run};
use crate::harm_budget::{REPLAY, Watched};
use sluice_testkit::pg::{connect, replica_url};
use std::time::{Duration, Instant};

/// Wait until `sql` on `db` returns `want` (the replication applies in the background; the
/// table may not exist yet).
async fn until_rows(db: &TestDb, sql: &str, want: &[&str], what: &str) {
    let c = connect(&db.url).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got: Option<Vec<String>> = c
            .query(sql, &[])
            .await
            .ok()
            .map(|rows| rows.iter().map(|r| r.get(0)).collect());
        if got.as_deref().is_some_and(|g| g == want) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lagging_target_replica_holds_the_apply_until_replay_resumes() {
    let _alone = REPLAY.lock().await;
    let (source, target) = (TestDb::new().await, TestDb::new().await);
    source
        .exec(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL);
             INSERT INTO t SELECT g, 0 FROM generate_series(1, 100) g;",
        )
        .await;
    let replica = connect(&replica_url()).await;
    replica
        .batch_execute("SELECT pg_wal_replay_resume()")
        .await
        .unwrap();
    let args = [
        "--table",
        "t",
        "--target-schema",
        "public",
        "--max-target-lag",
        "2s",
        "--target-replica",
        &replica_url(),
    ];
    let mut cmd = replicate(&source.url, &target.url);
    cmd.args(args);
    let mut run_ = Watched::spawn(cmd);
    let count = "SELECT count(*)::text FROM t";
    until_rows(&target, count, &["100"], "the initial load").await;
    source.exec("INSERT INTO t VALUES (101, 0)").await;
    until_rows(&target, count, &["101"], "streaming").await;

    // The target's replica stops replaying while the primary commits: it falls behind.
    replica
        .batch_execute("SELECT pg_wal_replay_pause()")
        .await
        .unwrap();
    target
        .exec("CREATE TABLE elsewhere (x int); INSERT INTO elsewhere VALUES (1);")
        .await;
    run_.wait_for("target lag: paused: replica lag").await;
    source.exec("INSERT INTO t VALUES (1000, 1)").await;
    let marker = "SELECT id::text FROM t WHERE id = 1000";
    // Held: the source is not even read while the replica lags.
    assert!(target.row_strings(marker).await.is_empty());
    replica
        .batch_execute("SELECT pg_wal_replay_resume()")
        .await
        .unwrap();
    run_.wait_for_after("target lag: paused", "target lag: resumed")
        .await;
    until_rows(&target, marker, &["1000"], "applied once replay resumed").await;

    let pid = run_.child.as_ref().unwrap().id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let (code, stderr) = run_.finish().await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("target lag: apply held 1 time(s)"),
        "{stderr}"
    );
    let all = "SELECT id::text || ':' || v::text FROM t ORDER BY id";
    assert_eq!(source.row_strings(all).await, target.row_strings(all).await);
    let mut drop = replicate(&source.url, &target.url);
    drop.args(["--table", "t", "--target-schema", "public", "--drop"]);
    run(&mut drop).ok();
}

#[tokio::test]
async fn a_target_lag_limit_needs_a_readable_lag() {
    let (source, target) = (TestDb::new().await, TestDb::new().await);
    source.exec("CREATE TABLE t (id int PRIMARY KEY)").await;
    // A replica named with no limit to keep.
    let mut cmd = replicate(&source.url, &target.url);
    cmd.args(["--table", "t", "--target-replica", &replica_url()]);
    run(&mut cmd).refused(2, &["--target-replica", "--max-target-lag"]);
    // A limit that is no duration.
    let mut cmd = replicate(&source.url, &target.url);
    cmd.args(["--table", "t", "--max-target-lag", "soon"]);
    run(&mut cmd).refused(2, &["--max-target-lag", "no duration"]);
    assert!(
        target
            .row_strings("SELECT tablename::text FROM pg_tables WHERE tablename = 't'")
            .await
            .is_empty(),
        "refused after creating tables"
    );
}
