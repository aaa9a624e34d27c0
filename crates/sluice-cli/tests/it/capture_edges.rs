#![allow(clippy::unwrap_used)]
//! What the source's log does not carry, or carries in a shape a stream used to trip on:
//! partition maintenance (PostgreSQL publishes no truncate of one partition under its root and
//! no change for a detach), XA transactions rolled back after their prepare (MariaDB logs the
//! prepared group first), values the export's type cannot hold (PostgreSQL NaN in a
//! `numeric(p,s)`), and captured tables renamed or dropped while a stream is stopped. Each is
//! either carried exactly or stops / warns and counts — never dropped in silence. Writers run
//! on the source while the streams read; replays are compared with the source's tables.

use crate::common::writer::Background;
use crate::common::{TestDb, run, sluice, tempdir};
use mysql_async::prelude::Queryable;
use sluice_testkit::changes::replay;
use sluice_testkit::files::assert_same_rows;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;

fn stream(url: &str, table: &str, to: &Path, extra: &[&str]) -> Command {
    let mut c = crate::common::stream(url, table, to);
    c.args(["--until-current", "--batch-seconds", "0.2"])
        .args(extra);
    c
}

fn state(to: &Path) -> String {
    std::fs::read_to_string(to.join("_sluice/stream.json")).unwrap()
}

/// Inserts into `ev_2025` one transaction after another.
async fn ev_writer(url: &str) -> Background {
    let c = sluice_testkit::pg::connect(url).await;
    let w = Background::spawn(|stop, commits| async move {
        while !stop.load(Ordering::Relaxed) {
            c.batch_execute(
                "INSERT INTO ev VALUES (nextval('ev_new'), date '2025-03-01', 1);
                 UPDATE ev SET v = v + 1 WHERE id = 1",
            )
            .await
            .unwrap();
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    w.wait_for(5).await;
    w
}

/// A truncated partition stops the stream with the fix; `--partition-changes keep` goes on
/// and says what the change files keep; a new partition is said and streams; a detached one
/// stops the stream again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_maintenance_stops_the_stream_unless_kept() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE ev (id int, at date NOT NULL, v int NOT NULL, PRIMARY KEY (id, at))
           PARTITION BY RANGE (at);
         CREATE TABLE ev_2024 PARTITION OF ev FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
         CREATE TABLE ev_2025 PARTITION OF ev FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
         CREATE SEQUENCE ev_new START 100000;
         INSERT INTO ev SELECT g, CASE WHEN g % 2 = 0 THEN date '2024-06-01'
                                       ELSE date '2025-06-01' END, 0
           FROM generate_series(1, 1000) g;",
    )
    .await;
    let to = tempdir();
    let run_stream = |extra: &[&str]| run(&mut stream(&db.url, "public.ev", to.path(), extra));
    let select = "SELECT id, at, v FROM ev";
    run_stream(&[]).ok();
    let writer = ev_writer(&db.url).await;
    db.exec("TRUNCATE ev_2024").await;
    let r = run_stream(&[]);
    r.refused(3, &["ev_2024 was truncated", "--partition-changes"]);
    let r = run_stream(&["--partition-changes", "keep"]);
    r.ok();
    assert!(state(to.path()).contains("ev_2024 was truncated"));
    // The files keep exactly the truncated partition's rows; everything else is the table.
    let kept = replay(&to.path().join("public.ev"), &["id"]);
    let ids = |rows: &[String]| -> std::collections::BTreeSet<String> {
        rows.iter()
            .map(|r| r.split('|').next().unwrap().to_string())
            .collect()
    };
    let want = ids(&db.row_strings(select).await);
    let extra: Vec<&String> = kept
        .rows
        .iter()
        .filter(|r| !want.contains(r.split('|').next().unwrap()))
        .collect();
    assert_eq!(extra.len(), 500, "the truncated partition's rows");
    assert!(extra.iter().all(|r| r.contains("2024-06-01")), "{extra:?}");
    // Taken as the new layout: the next run goes on without the flag.
    run_stream(&[]).ok();
    db.exec(
        "CREATE TABLE ev_2026 PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
         INSERT INTO ev VALUES (5000, date '2026-02-01', 7);",
    )
    .await;
    let r = run_stream(&[]);
    r.ok();
    assert!(r.stderr.contains("ev_2026 is new"), "{}", r.stderr);
    let after = replay(&to.path().join("public.ev"), &["id"]);
    assert!(after.rows.iter().any(|r| r.starts_with("5000|")));
    writer.stop().await;
    db.exec("ALTER TABLE ev DETACH PARTITION ev_2025").await;
    let r = run_stream(&[]);
    r.refused(3, &["ev_2025 was detached"]);
    run_stream(&["--drop"]).ok();
}

/// `sluice replicate` stops at a truncated partition, naming it, instead of keeping its rows
/// on the target in silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_partition_stops_replicate() {
    let source = TestDb::new().await;
    let target = TestDb::new().await;
    source
        .exec(
            "CREATE TABLE ev (id int, at date NOT NULL, v int NOT NULL, PRIMARY KEY (id, at))
               PARTITION BY RANGE (at);
             CREATE TABLE ev_2024 PARTITION OF ev FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
             CREATE TABLE ev_2025 PARTITION OF ev FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
             CREATE SEQUENCE ev_new START 100000;
             INSERT INTO ev SELECT g, date '2024-01-01' + (g % 700), 0
               FROM generate_series(1, 1000) g;",
        )
        .await;
    let replicate = |extra: &[&str]| {
        let mut c = sluice();
        c.args([
            "replicate",
            "--source",
            &source.url,
            "--target",
            &target.url,
        ])
        .args(["--table", "public.ev", "--until-current"])
        .args(extra);
        run(&mut c)
    };
    replicate(&[]).ok();
    let writer = ev_writer(&source.url).await;
    source.exec("TRUNCATE ev_2024").await;
    let r = replicate(&[]);
    r.refused(3, &["ev_2024 was truncated"]);
    writer.stop().await;
    replicate(&["--drop"]).ok();
}

/// MariaDB writes an XA transaction's changes at its `XA PREPARE`: one rolled back later
/// leaves no row in the change files, and one committed after the stream stopped and
/// restarted arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xa_rolled_back_leaves_nothing_and_committed_after_a_restart_arrives() {
    // Alone: a prepared XA transaction holds its tables until it ends, so every other test's
    // snapshot (its global read lock) would wait for it.
    let mut db = sluice_testkit::mysql::TestDb::alone().await;
    db.exec(
        "CREATE TABLE x (id int PRIMARY KEY, v int NOT NULL);
         INSERT INTO x VALUES (1, 0);",
    )
    .await;
    let table = format!("{}.x", db.name);
    let to = tempdir();
    let run_stream = || run(&mut stream(&db.url, &table, to.path(), &[]));
    run_stream().ok();
    let mut writer_conn = sluice_testkit::mysql::connect(&db.url).await;
    let writer = Background::spawn(|stop, commits| async move {
        while !stop.load(Ordering::Relaxed) {
            writer_conn
                .query_drop("UPDATE x SET v = v + 1 WHERE id = 1")
                .await
                .unwrap();
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    writer.wait_for(5).await;
    let mut c = sluice_testkit::mysql::connect(&db.url).await;
    let xa = |xid: &str, id: i32| {
        format!(
            "XA START '{xid}'; INSERT INTO x VALUES ({id}, {id}); UPDATE x SET v = -1 WHERE id \
             = 1 AND v < 0; XA END '{xid}'; XA PREPARE '{xid}';"
        )
    };
    c.query_drop(xa("gone", 10)).await.unwrap();
    c.query_drop("XA ROLLBACK 'gone'").await.unwrap();
    c.query_drop(xa("late", 20)).await.unwrap();
    // Prepared, not committed: this run streams past it.
    run_stream().ok();
    c.query_drop("XA COMMIT 'late'").await.unwrap();
    writer.stop().await;
    run_stream().ok();
    let r = replay(&to.path().join(&table), &["id"]);
    assert_same_rows(
        &r.rows,
        &db.row_strings("SELECT id, v FROM x").await,
        "snapshot + changes replayed by _seq",
    );
    assert!(
        r.changes.iter().all(|c| c.cells[0] != "10"),
        "a phantom row"
    );
    assert!(r.changes.iter().any(|c| c.cells[0] == "20"));
    run(&mut stream(&db.url, &table, to.path(), &["--drop"])).ok();
}

/// NaN in a `numeric(10,2)` has no decimal: the stream stops naming the column and the flag;
/// with `--bad-values null` it is written as NULL and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_the_export_cannot_hold_stops_or_is_nulled_and_counted() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE price (id int PRIMARY KEY, amount numeric(10,2));
         INSERT INTO price SELECT g, g FROM generate_series(1, 100) g;",
    )
    .await;
    let to = tempdir();
    let run_stream = |extra: &[&str]| run(&mut stream(&db.url, "public.price", to.path(), extra));
    run_stream(&[]).ok();
    db.exec(
        "UPDATE price SET amount = 'NaN' WHERE id = 7; UPDATE price SET amount = 8.5 WHERE id = 8",
    )
    .await;
    let r = run_stream(&[]);
    r.refused(5, &["amount", "--bad-values null"]);
    let report = to.path().join("report.json");
    let r = run_stream(&[
        "--bad-values",
        "null",
        "--report-json",
        report.to_str().unwrap(),
    ]);
    r.ok();
    assert!(r.stderr.contains("NaN"), "{}", r.stderr);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["nulled_values"], 1, "{report}");
    let got = replay(&to.path().join("public.price"), &["id"]);
    let want = db
        .row_strings("SELECT id, CASE WHEN amount = 'NaN' THEN NULL ELSE amount END FROM price")
        .await;
    assert_same_rows(&got.rows, &want, "NaN replayed as NULL");
    run_stream(&["--drop"]).ok();
}

/// A captured table renamed while the stream is stopped: its changes arrive under the new
/// name, which the run does not capture; they are left out loudly and counted. A captured
/// table dropped while stopped: its changes before the drop are still written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_tables_are_counted_and_dropped_tables_changes_arrive() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE a (id int PRIMARY KEY, v int NOT NULL);
         CREATE TABLE b (id int PRIMARY KEY, v int NOT NULL);
         CREATE TABLE c (id int PRIMARY KEY, v int NOT NULL);
         INSERT INTO a SELECT g, 0 FROM generate_series(1, 100) g;
         INSERT INTO c SELECT g, 0 FROM generate_series(1, 100) g;
         INSERT INTO b SELECT g, 0 FROM generate_series(1, 100) g;",
    )
    .await;
    let to = tempdir();
    let run_stream = |extra: &[&str]| {
        let mut c = sluice();
        c.args([
            "stream",
            "--source",
            &db.url,
            "--tables",
            "public\\.(a|b|c)",
        ])
        .args(["--until-current", "--batch-seconds", "0.2"])
        .arg("--to")
        .arg(to.path())
        .args(extra);
        run(&mut c)
    };
    run_stream(&[]).ok();
    db.exec(
        "UPDATE b SET v = 1 WHERE id <= 10;
         CREATE TABLE b_before_drop AS SELECT * FROM b;
         DROP TABLE b;
         ALTER TABLE a RENAME TO a_old;
         UPDATE a_old SET v = 2 WHERE id <= 5;
         UPDATE c SET v = 3 WHERE id <= 7;",
    )
    .await;
    let report = to.path().join("report.json");
    let r = run_stream(&["--report-json", report.to_str().unwrap()]);
    r.ok();
    assert!(r.stderr.contains("public.a_old"), "{}", r.stderr);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["ignored_changes"], 5, "{report}");
    let b = replay(&to.path().join("public.b"), &["id"]);
    assert_same_rows(
        &b.rows,
        &db.row_strings("SELECT id, v FROM b_before_drop").await,
        "the dropped table's changes",
    );
    let c = replay(&to.path().join("public.c"), &["id"]);
    assert_same_rows(
        &c.rows,
        &db.row_strings("SELECT id, v FROM c").await,
        "table c",
    );
    run_stream(&["--drop"]).ok();
}

/// MariaDB logs `ALTER TABLE … TRUNCATE PARTITION` as a statement without its rows: the
/// stream stops there, naming it, instead of keeping the partition's rows in its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_mariadb_partition_stops_the_stream() {
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    db.exec(
        "CREATE TABLE ev (id int PRIMARY KEY, v int NOT NULL)
           PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN (100),
                                    PARTITION p1 VALUES LESS THAN MAXVALUE);
         INSERT INTO ev SELECT seq, 0 FROM seq_1_to_300;",
    )
    .await;
    let table = format!("{}.ev", db.name);
    let to = tempdir();
    run(&mut stream(&db.url, &table, to.path(), &[])).ok();
    db.exec("UPDATE ev SET v = 1 WHERE id = 150; ALTER TABLE ev TRUNCATE PARTITION p0;")
        .await;
    let r = run(&mut stream(&db.url, &table, to.path(), &[]));
    r.refused(2, &["TRUNCATE PARTITION", "new snapshot"]);
    run(&mut stream(&db.url, &table, to.path(), &["--drop"])).ok();
}

/// A MariaDB session writing `binlog_row_image=MINIMAL` changes a row's key: the insert half
/// lacks the row's other values. `sluice replicate` stops naming the setting rather than
/// inserting a row of NULLs on the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicate_stops_at_a_key_update_without_the_whole_row() {
    use super::replicate::{Db, Session};
    use super::replicate_faults::{drop_replication, into_public, replicate_cmd};
    let source = Db::new(false).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE m (id int PRIMARY KEY, a int NOT NULL, b varchar(20) NOT NULL);
             INSERT INTO m VALUES (1, 1, 'one'), (2, 2, 'two');",
        )
        .await;
    let name = source.name().await;
    let table = format!("{name}.m");
    let args = into_public(&table);
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    let mut s = Session::open(&source).await;
    s.exec("SET SESSION binlog_row_image = 'MINIMAL'; UPDATE m SET id = 3 WHERE id = 1")
        .await;
    let r = run(&mut replicate_cmd(&source, &target, &args).await);
    r.failed(&["binlog_row_image=FULL"]);
    assert_eq!(
        target
            .rows("SELECT id, a, b FROM public.m ORDER BY id")
            .await,
        ["1|1|one", "2|2|two"],
        "nothing half-applied"
    );
    drop_replication(&source, &target, &args).await;
}
