#![allow(clippy::unwrap_used)]
//! `--consistency converged` on MariaDB: chunks (key ranges) read each in its own
//! transaction while a writer updates, moves keys (`UPDATE … SET id`), deletes and inserts rows
//! of `hot` and appends its sequence number to `ops` in the same transaction; the changed keys
//! are read again under a snapshot the run lines its readers up on (an exact binary log
//! position T). If the output is the tables at one point, `hot` as exported equals the initial
//! table with exactly the exported `ops` replayed — computed here from the writer's rule, not
//! by sluice. Repeated (`SLUICE_CONVERGED_ROUNDS`, default 8: a 1-in-10 race shows in more
//! than half of the suite's runs) so a race shows.

use crate::common::writer::Background;
use crate::common::{Failpoints, files, sluice, tempdir};
use mysql_async::prelude::Queryable;
use sluice_testkit::mysql::TestDb;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

const N: i64 = 30_000;
/// Moved keys land past every other key.
const MOVED: i64 = 10_000_000;

/// The key among `n` rows that the writer's transaction `i` updates.
pub(crate) fn upd_in(n: i64, i: i64) -> i64 {
    (i * 7919) % n + 1
}

/// The key it moves past every other key.
pub(crate) fn mv_in(n: i64, i: i64) -> i64 {
    (i * 104_729) % n + 1
}

/// The key it deletes.
pub(crate) fn del_in(n: i64, i: i64) -> i64 {
    (i * 13) % n + 1
}

fn upd(i: i64) -> i64 {
    upd_in(N, i)
}

fn mv(i: i64) -> i64 {
    mv_in(N, i)
}

fn del(i: i64) -> i64 {
    del_in(N, i)
}

/// `hot` after the writer's transactions `1..=k`, as `id|v|pad`.
fn replayed(k: i64) -> Vec<String> {
    let mut t: BTreeMap<i64, (i64, String)> = (1..=N).map(|n| (n, (0, format!("p{n}")))).collect();
    for i in 1..=k {
        if let Some(r) = t.get_mut(&upd(i)) {
            r.0 += 1;
            r.1.push_str("xxxxxxxxxx");
        }
        if let Some(r) = t.remove(&mv(i)) {
            t.insert(mv(i) + MOVED * i, r);
        }
        t.remove(&del(i));
        t.insert(N + i, (-1, "new".into()));
    }
    let mut out: Vec<String> = t
        .into_iter()
        .map(|(k, (v, p))| format!("{k}|{v}|{p}"))
        .collect();
    out.sort();
    out
}

pub(crate) fn rounds() -> usize {
    std::env::var("SLUICE_CONVERGED_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}

/// `hot` with `N` rows and the empty `ops` log, on MariaDB or MySQL (each names its recursion
/// limit differently).
async fn create(db: &mut TestDb) {
    let version = db.scalar("SELECT VERSION()").await.unwrap_or_default();
    let depth = match version.contains("MariaDB") {
        true => "max_recursive_iterations",
        false => "cte_max_recursion_depth",
    };
    db.exec(&format!(
        "SET SESSION {depth} = 1000000;
         CREATE TABLE hot (id bigint PRIMARY KEY, v int NOT NULL, pad varchar(2000) NOT NULL);
         CREATE TABLE ops (seq bigint PRIMARY KEY);
         INSERT INTO hot
           WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {N})
           SELECT n, 0, CONCAT('p', n) FROM g;
         ANALYZE TABLE hot;"
    ))
    .await;
}

/// The writer whose transaction `i` [`replayed`] replays, each logged in `ops`.
fn start_writer(url: &str) -> Background {
    each_transaction(url, |i| {
        format!(
            "START TRANSACTION;
             UPDATE hot SET v = v + 1, pad = CONCAT(pad, 'xxxxxxxxxx') WHERE id = {};
             UPDATE hot SET id = id + {} WHERE id = {};
             DELETE FROM hot WHERE id = {};
             INSERT INTO hot VALUES ({}, -1, 'new');
             INSERT INTO ops VALUES ({i});
             COMMIT;",
            upd(i),
            MOVED * i,
            mv(i),
            del(i),
            N + i
        )
    })
}

/// A writer on `url` running `transaction(i)` for `i = 1, 2, …` until stopped, counting each.
pub(crate) fn each_transaction(
    url: &str,
    transaction: impl Fn(i64) -> String + Send + 'static,
) -> Background {
    let url = url.to_string();
    Background::spawn(|stop, commits| async move {
        let mut c = sluice_testkit::mysql::connect(&url).await;
        let mut i: i64 = 0;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            c.query_drop(transaction(i)).await.unwrap();
            commits.fetch_add(1, Ordering::Relaxed);
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn converged_output_equals_the_tables_at_one_point_under_writes() {
    for round in 0..rounds() {
        equal_at_one_point(TestDb::new().await, round).await;
    }
}

/// The same on MySQL 9 (the kit's `--mysql`), whose end snapshot is lined up by another lock.
#[tokio::test(flavor = "multi_thread")]
async fn converged_output_on_mysql_equals_the_tables_at_one_point() {
    equal_at_one_point(sluice_testkit::mysql9::test_db().await, 0).await;
}

async fn equal_at_one_point(mut db: TestDb, round: usize) {
    {
        create(&mut db).await;
        let writer = start_writer(&db.url);
        writer.wait_for(20).await;
        let out = tempdir();
        let dir = out.path().join("data");
        let fp = Failpoints::new();
        let mut cmd = sluice();
        cmd.args([
            "export", "--source", &db.url, "--table", "hot", "--table", "ops",
        ])
        .args(["--consistency", "converged", "--parallel", "4"])
        .args(["--chunk-size", "256KB", "--row-group-size", "64KB", "--to"])
        .arg(&dir);
        // The writer commits between the chunks' transactions.
        fp.run_paused_at(&mut cmd, "export.after_receipt", writer.wait_for(100))
            .await;
        let after = writer.commits();
        writer.stop().await;

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
            "round {round}: ops are a prefix 1..=k"
        );
        let got = files::row_strings(&files::dataset_batches(
            &dir.join(format!("{}.hot", db.name)),
        ));
        files::assert_same_rows(
            &got,
            &replayed(seen),
            &format!("round {round}: hot vs. the initial rows + the exported ops"),
        );
        // The run meant something: the writer went on while the chunks were read and after.
        let m = files::manifest(&dir);
        assert_eq!(m["consistency"], "converged", "{m}");
        let c = &m["converged"];
        assert!(c["changed_keys"].as_u64().unwrap() > 100, "{c}");
        assert!(c["parts_rewritten"].as_u64().unwrap() > 0, "{c}");
        assert!(seen > 100, "round {round}: {seen} transactions before T");
        assert!((after as i64) >= seen, "{after} vs {seen}");
    }
}

/// Killed while reading chunks, holding the end point or rewriting parts, with the writer
/// going: `--resume` reads the binary log again from the first run's C, reads only the chunks
/// without a receipt, and converges to one point.
#[tokio::test(flavor = "multi_thread")]
async fn killed_converged_exports_resume_to_one_point() {
    for point in [
        "export.before_receipt=exit@3",
        "converge.end_point=exit@1",
        "converge.after_rewrite=exit@1",
        "export.before_manifest=exit@1",
    ] {
        let mut db = TestDb::new().await;
        create(&mut db).await;
        let writer = start_writer(&db.url);
        let out = tempdir();
        let dir = out.path().join("data");
        let args = |extra: &str| {
            let mut cmd = sluice();
            cmd.args([
                "export", "--source", &db.url, "--table", "hot", "--table", "ops",
            ])
            .args(["--consistency", "converged", "--parallel", "2"])
            .args([
                "--chunk-size",
                "128KB",
                "--row-group-size",
                "64KB",
                extra,
                "--to",
            ])
            .arg(&dir);
            cmd
        };
        let fp = Failpoints::new();
        let mut first = args("--overwrite");
        fp.arm(&mut first, point);
        let killed = crate::common::run(&mut first);
        assert_ne!(killed.code, 0, "{point}: {}", killed.stderr);
        let state = files::json(&dir.join("_sluice/run.json"));
        let c = state["converged"]["position"].as_str().unwrap().to_string();
        // The writer goes on between the runs.
        writer.wait_for(30).await;
        crate::common::run(&mut args("--resume")).ok();
        writer.stop().await;
        let m = files::manifest(&dir);
        assert_eq!(
            m["converged"]["start"], c,
            "{point}: followed from the first C"
        );
        let ops = files::row_strings(&files::dataset_batches(
            &dir.join(format!("{}.ops", db.name)),
        ));
        let seen = ops.len() as i64;
        let got = files::row_strings(&files::dataset_batches(
            &dir.join(format!("{}.hot", db.name)),
        ));
        files::assert_same_rows(&got, &replayed(seen), &format!("{point}, resumed"));
    }
}

/// `sluice stream --consistency converged` on MariaDB: the initial snapshot converges on the
/// stream's own binary log from its start, the change files follow from T; replayed over the
/// snapshot they equal the table.
#[tokio::test(flavor = "multi_thread")]
async fn a_converged_stream_snapshot_hands_off_after_its_end_point() {
    let mut db = TestDb::new().await;
    create(&mut db).await;
    let writer = start_writer(&db.url);
    let out = tempdir();
    let stream = || {
        let mut cmd = sluice();
        cmd.args(["stream", "--source", &db.url, "--table", "hot", "--to"])
            .arg(out.path())
            .args(["--consistency", "converged", "--parallel", "2"])
            .args([
                "--chunk-size",
                "128KB",
                "--until-current",
                "--batch-seconds",
                "0.2",
            ]);
        cmd
    };
    let fp = Failpoints::new();
    fp.run_paused_at(&mut stream(), "export.after_receipt", writer.wait_for(100))
        .await;
    writer.stop().await;
    crate::common::run(&mut stream()).ok();
    let m = files::manifest(out.path());
    assert!(
        m["converged"]["changed_keys"].as_u64().unwrap() > 100,
        "{m}"
    );
    let want = db.row_strings("SELECT id, v, pad FROM hot").await;
    let r = sluice_testkit::changes::assert_replay_equals(
        out.path(),
        &format!("{}.hot", db.name),
        &["id"],
        &want,
    );
    assert!(!r.changes.is_empty(), "no change after T");
}
