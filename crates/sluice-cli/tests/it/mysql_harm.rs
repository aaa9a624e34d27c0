#![allow(clippy::unwrap_used)]
//! Harm the source must never take silently, on MariaDB:
//!
//! - a long write to a MyISAM table (which `BACKUP STAGE BLOCK_COMMIT` must wait for, while
//!   every commit on the server would queue behind it): the long-query guard refuses and names
//!   it; with the guard off, the lock wait ends at `--lock-wait-timeout` and names it; with
//!   `--long-query-wait` the export waits for it (no lock held), then runs, and reports the
//!   wait and the lock's wait and hold;
//! - an `ALTER TABLE` and a query queued behind the metadata lock our snapshot holds: sampled
//!   by the harm probe and named in the report;
//! - MyISAM and Aria tables changed after the snapshot: read as they are, and marked
//!   `outside_snapshot` in the manifest, while the InnoDB table shows the snapshot;
//! - destination failures (injected in the part writer) keep the worker's session: two of them
//!   in one run, with one spare session, and the run still reads one snapshot.
//!
//! The tests run alone on the server (`TestDb::alone`): a long MyISAM write holds back every
//! other test's global lock.
//!
//! Length: four scenarios that each need their own long statement, lock waits and probes,
//! sharing the helpers at the top.

use crate::common::{files, harness, sluice, tempdir, with_report, words};
use mysql_async::prelude::Queryable;
use sluice_testkit::mysql::{TestDb, connect};
use sluice_testkit::scenario::Paused;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};
use tempfile::TempDir;

const MDL: &str = "Waiting for table metadata lock";

/// A statement running on its own session until stopped (also when the test fails).
struct LongStatement {
    id: u32,
    url: String,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl LongStatement {
    /// Start `sql` and return once it has run for `age`.
    async fn start(db: &mut TestDb, sql: &str, age: Duration) -> LongStatement {
        let mut conn = connect(&db.url).await;
        let id = conn.id();
        let sql = sql.to_string();
        let task = tokio::spawn(async move {
            // Ends with an error when the statement is stopped.
            let _ = conn.query_drop(sql).await;
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ms: Option<f64> = db
                .conn
                .exec_first(
                    "SELECT TIME_MS FROM information_schema.PROCESSLIST WHERE ID = ?",
                    (id,),
                )
                .await
                .unwrap();
            if ms.is_some_and(|ms| ms >= age.as_millis() as f64) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the long statement did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        LongStatement {
            id,
            url: db.url.clone(),
            task: Some(task),
        }
    }

    async fn is_running(&self, db: &mut TestDb) -> bool {
        let n: Option<u64> = db
            .conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE ID = ? AND COMMAND = 'Query'",
                (self.id,),
            )
            .await
            .unwrap();
        n == Some(1)
    }

    async fn stop(mut self, db: &mut TestDb) {
        db.exec(&format!("KILL QUERY {}", self.id)).await;
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }
}

impl Drop for LongStatement {
    fn drop(&mut self) {
        if self.task.is_none() {
            return;
        }
        let (url, id) = (self.url.clone(), self.id);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut c = connect(&url).await;
                let _ = c.query_drop(format!("KILL QUERY {id}")).await;
            });
        })
        .join();
    }
}

/// Wait until `n` sessions of `db` are in one of `states`, each for `ms` or longer.
async fn queued(db: &mut TestDb, states: [&str; 2], n: u64, ms: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: Option<u64> = db
            .conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE STATE IN (?, ?) AND DB = ? AND TIME_MS >= ?",
                (states[0], states[1], db.name.clone(), ms),
            )
            .await
            .unwrap();
        if waiting == Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "{n} session(s) did not queue");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn notes(report: &serde_json::Value) -> String {
    report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many rows the export in `dir` wrote of tables `i`, `m` and `a` of database `db`.
fn exported_rows(dir: &Path, db: &str) -> [usize; 3] {
    ["i", "m", "a"]
        .map(|t| files::row_strings(&files::dataset_batches(&dir.join(format!("{db}.{t}")))).len())
}

/// An export of `args` from `url` into `data` of a new directory, with its report in
/// `report.json` there, paused at failpoint `at`.
async fn paused_export(url: &str, args: &str, at: &str) -> (TempDir, Paused) {
    let out = tempdir();
    let report = out.path().join("report.json");
    let paused = harness()
        .paused_at(
            url,
            &out.path().join("data"),
            &with_report(args, &report),
            at,
        )
        .await;
    (out, paused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_write_to_myisam_is_guarded_and_the_lock_wait_bounded() {
    let mut db = TestDb::alone().await;
    db.exec(
        "CREATE TABLE t (id int PRIMARY KEY, v int) ENGINE=InnoDB;
         INSERT INTO t SELECT seq, seq FROM seq_1_to_1000;
         CREATE TABLE m (id int PRIMARY KEY, v int) ENGINE=MyISAM;
         INSERT INTO m VALUES (1, 1);",
    )
    .await;
    let long = LongStatement::start(
        &mut db,
        "UPDATE m SET v = SLEEP(60) WHERE id = 1",
        Duration::from_millis(1500),
    )
    .await;
    let session = format!("session {}", long.id);
    let out = tempdir();

    // The guard refuses, names the statement, and leaves it alone.
    let refused = crate::common::run(
        sluice()
            .args(["export", "--source", &db.url, "--table", "t"])
            .args(["--long-query-guard", "1", "--to"])
            .arg(out.path().join("a")),
    );
    refused.refused(
        3,
        &[
            "not taking the global lock (BACKUP STAGE BLOCK_COMMIT)",
            &session,
            "UPDATE m SET v = SLEEP(60)",
            "--long-query-wait",
            "--consistency chunk",
        ],
    );
    assert!(!out.path().join("a/manifest.json").exists());
    assert!(long.is_running(&mut db).await, "the guard did not stop it");

    // Without the guard, the lock waits at most --lock-wait-timeout, then names it.
    let timed_out = crate::common::run(
        sluice()
            .args(["export", "--source", &db.url, "--table", "t"])
            .args(words("--long-query-guard 0 --lock-wait-timeout 1 --to"))
            .arg(out.path().join("b")),
    );
    timed_out.refused(
        3,
        &["could not be had within --lock-wait-timeout 1 s", &session],
    );
    assert!(long.is_running(&mut db).await);
    // The server is not left locked: a commit goes through.
    db.exec("INSERT INTO t VALUES (1001, 1001)").await;

    // With --long-query-wait the export waits (holding nothing) until the statement ends.
    let report = out.path().join("report.json");
    let paused = harness()
        .paused_at(
            &db.url,
            &out.path().join("c"),
            &with_report(
                "--table t --long-query-guard 1 --long-query-wait 120",
                &report,
            ),
            "mysql.long_query_wait",
        )
        .await;
    long.stop(&mut db).await;
    let run = paused.release().await;
    run.ok();
    assert!(
        run.stderr.contains("waiting for 1 long statement"),
        "{}",
        run.stderr
    );
    let r = files::json(&report);
    let n = notes(&r);
    assert!(
        n.contains("long statement(s) of other sessions to end") && n.contains(&session),
        "{n}"
    );
    assert!(n.contains("waited") && n.contains("to be granted"), "{n}");
    let m = files::manifest(&out.path().join("c"));
    assert!(
        m["harm"]["global_lock_wait_seconds"].as_f64().is_some(),
        "{}",
        m["harm"]
    );
    assert!(
        m["harm"]["global_lock_seconds"].as_f64().unwrap() > 0.0,
        "{}",
        m["harm"]
    );
    assert_eq!(m["datasets"][0]["rows"], 1001);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_queued_behind_our_metadata_lock_are_reported() {
    let mut db = TestDb::alone().await;
    db.exec(
        "CREATE TABLE t (id int PRIMARY KEY, v varchar(40));
         INSERT INTO t SELECT seq, MD5(seq) FROM seq_1_to_2000;",
    )
    .await;
    let one_chunk = "--table t --parallel 1 --chunk-by none";
    let (out, paused) = paused_export(&db.url, one_chunk, "export.after_receipt").await;
    let report = out.path().join("report.json");
    // The part is written: the worker's snapshot transaction holds t's metadata lock.
    let mut alter_conn = connect(&db.url).await;
    let alter_id = alter_conn.id();
    let alter = tokio::spawn(async move {
        alter_conn
            .query_drop("ALTER TABLE t ADD COLUMN z int")
            .await
    });
    // The ALTER waits for our lock, then a query waits behind the ALTER, both for a while.
    queued(&mut db, [MDL, MDL], 1, 0).await;
    let mut reader_conn = connect(&db.url).await;
    let reader = tokio::spawn(async move {
        reader_conn
            .query_first::<u64, _>("SELECT COUNT(*) FROM t")
            .await
    });
    queued(&mut db, [MDL, MDL], 2, 1200).await;
    let run = paused.release().await;
    run.ok();
    assert!(
        run.stderr
            .contains(&format!("session {alter_id} waits for a metadata lock")),
        "warned while it happened: {}",
        run.stderr
    );
    // Released at the end of the run: the ALTER and the query go through.
    alter.await.unwrap().unwrap();
    assert_eq!(reader.await.unwrap().unwrap(), Some(2000));

    let m = files::manifest(&out.path().join("data"));
    let harm = &m["harm"];
    assert!(
        harm["peak_blocked_sessions"].as_u64().unwrap() >= 2,
        "{harm}"
    );
    assert!(
        harm["longest_blocked_wait_seconds"].as_f64().unwrap() >= 1.0,
        "{harm}"
    );
    let n = notes(&files::json(&report));
    assert!(
        n.contains(&format!("session {alter_id} for "))
            && n.contains("ALTER TABLE t ADD COLUMN z int")
            && n.contains(&format!("{}.t", db.name)),
        "{n}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_transactional_tables_are_marked_outside_the_snapshot() {
    let mut db = TestDb::alone().await;
    db.exec(
        "CREATE TABLE i (id int PRIMARY KEY) ENGINE=InnoDB;
         CREATE TABLE m (id int PRIMARY KEY) ENGINE=MyISAM;
         CREATE TABLE a (id int PRIMARY KEY) ENGINE=Aria;
         INSERT INTO i SELECT seq FROM seq_1_to_100;
         INSERT INTO m SELECT seq FROM seq_1_to_100;
         INSERT INTO a SELECT seq FROM seq_1_to_100;",
    )
    .await;
    let tables = "--table i --table m --table a";
    let (out, paused) = paused_export(&db.url, tables, "export.after_plan").await;
    // The snapshot is taken and nothing is read yet: a writer commits to all three tables.
    db.exec("INSERT INTO i VALUES (101); INSERT INTO m VALUES (101); INSERT INTO a VALUES (101);")
        .await;
    let run = paused.release().await;
    run.ok();

    let dir = out.path().join("data");
    // InnoDB as of the snapshot; MyISAM and Aria not covered by it.
    assert_eq!(exported_rows(&dir, &db.name), [100, 101, 101]);
    let m = files::manifest(&dir);
    assert_eq!(m["consistency"], "snapshot");
    for ds in m["datasets"].as_array().unwrap() {
        let name = ds["name"].as_str().unwrap();
        let mark = &ds["outside_snapshot_reason"];
        if name.ends_with(".i") {
            assert!(mark.is_null(), "{name}: {mark}");
            assert!(ds["outside_snapshot"].is_null(), "{name}");
        } else {
            assert_eq!(ds["outside_snapshot"][0], name, "{name}: the table itself");
            let engine = if name.ends_with(".m") {
                "MyISAM"
            } else {
                "Aria"
            };
            assert!(
                mark.as_str()
                    .unwrap()
                    .starts_with(&format!("{engine} table")),
                "{mark}"
            );
        }
    }
    let n = notes(&files::json(&out.path().join("report.json")));
    assert!(n.contains(&format!("{}.m: MyISAM table", db.name)), "{n}");
    assert!(run.stderr.contains("is a MyISAM table"), "{}", run.stderr);

    // --lock-non-transactional: they are held still from the snapshot to the end of the run;
    // a writer to the MyISAM table waits (and is counted), the InnoDB writer does not.
    let report = out.path().join("report-locked.json");
    let dir = out.path().join("locked");
    let paused = harness()
        .paused_at(
            &db.url,
            &dir,
            &with_report(
                "--table i --table m --table a --lock-non-transactional",
                &report,
            ),
            "export.after_plan",
        )
        .await;
    db.exec("INSERT INTO i VALUES (102)").await;
    let mut writer = connect(&db.url).await;
    let write = tokio::spawn(async move { writer.query_drop("INSERT INTO m VALUES (102)").await });
    // It waits for the table lock or, before that, for its metadata lock.
    queued(&mut db, [MDL, "Waiting for table level lock"], 1, 500).await;
    let run = paused.release().await;
    run.ok();
    write.await.unwrap().unwrap();
    // InnoDB as of the snapshot; MyISAM and Aria held at it.
    assert_eq!(exported_rows(&dir, &db.name), [101, 101, 101]);
    let m = files::manifest(&dir);
    for ds in m["datasets"].as_array().unwrap() {
        assert!(ds["outside_snapshot"].is_null(), "{ds}");
        assert!(ds["outside_snapshot_reason"].is_null(), "{ds}");
    }
    assert!(
        m["harm"]["peak_blocked_sessions"].as_u64().unwrap() >= 1,
        "{}",
        m["harm"]
    );
    let n = notes(&files::json(&report));
    assert!(n.contains("held under READ locks"), "{n}");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM m").await.as_deref(),
        Some("102")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_failures_keep_the_workers_snapshot_sessions() {
    const N: i64 = 100_000;
    let mut db = TestDb::alone().await;
    db.exec(&format!(
        "CREATE TABLE f (id bigint PRIMARY KEY, gen int NOT NULL, v varchar(64) NOT NULL);
         INSERT INTO f SELECT seq, 0, MD5(seq) FROM seq_1_to_{N};
         ANALYZE TABLE f;"
    ))
    .await;
    // Each transaction adds 1 to one row in each half of the table: in any one snapshot both
    // halves have the same sum.
    let (stop, committed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicI64::new(0)),
    );
    let writer = {
        let (url, stop, committed) = (db.url.clone(), stop.clone(), committed.clone());
        tokio::spawn(async move {
            let mut c = connect(&url).await;
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let lo = i % (N / 2) + 1;
                c.exec_drop(
                    "UPDATE f SET gen = gen + 1 WHERE id IN (?, ?)",
                    (lo, lo + N / 2),
                )
                .await
                .unwrap();
                committed.store(i, Ordering::Relaxed);
            }
        })
    };
    while committed.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let out = tempdir();
    let report = out.path().join("report.json");
    // One failure while a part streams (the worker's result set is still open) and one when a
    // part is complete; a run that threw the sessions away would need two spares.
    let (url, data, report_arg) = (db.url.clone(), out.path().join("data"), report.clone());
    let run = tokio::task::spawn_blocking(move || {
        harness().export_at(
            &url,
            &data,
            &with_report(
                "--table f --parallel 2 --chunk-size 1MB --batch-size 64KB",
                &report_arg,
            ),
            "export.after_batch=error@3,export.before_commit=error@2",
        )
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    run.ok();
    assert_eq!(
        run.stderr.matches("injected a transient failure").count(),
        2,
        "both failures were retried: {}",
        run.stderr
    );
    let r = files::json(&report);
    assert_eq!(r["retries"], 2, "{r}");
    assert!(
        !notes(&r).contains("spare"),
        "no spare session used: {}",
        notes(&r)
    );
    let m = files::manifest(&out.path().join("data"));
    assert_eq!(m["snapshots"].as_array().unwrap().len(), 1);
    assert!(m["datasets"][0]["parts"].as_array().unwrap().len() >= 4);
    let rows = files::row_strings(&files::dataset_batches(
        &out.path().join(format!("data/{}.f", db.name)),
    ));
    assert_eq!(rows.len() as i64, N);
    let (mut low, mut high) = (0i64, 0i64);
    for r in &rows {
        let mut f = r.split('|');
        let id: i64 = f.next().unwrap().parse().unwrap();
        let g: i64 = f.next().unwrap().parse().unwrap();
        if id <= N / 2 { low += g } else { high += g }
    }
    assert!(
        low >= 20,
        "the snapshot saw the writer's first transactions"
    );
    assert_eq!(low, high, "both halves of the table come from one snapshot");
}
