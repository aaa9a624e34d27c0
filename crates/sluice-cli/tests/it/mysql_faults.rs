#![allow(clippy::unwrap_used)]
//! Faults on MariaDB: two workers' connections killed mid-chunk (`KILL <id>`); the statement
//! time limit; a user without the privilege the global lock needs; wrong credentials and names.
//!
//! One killed worker (either consistency mode) is the shared scenario in `scenarios.rs`: in
//! snapshot consistency it continues on the spare session that began the same snapshot under
//! the lock. With the spare used up, a second killed worker cannot rejoin (MySQL cannot join a
//! snapshot later): the run fails cleanly saying so, and `--resume` finishes it under a new
//! snapshot with every row exactly once.

use crate::common::{export, files, sluice, tempdir, words};
use mysql_async::prelude::Queryable;
use sluice_testkit::mysql::TestDb;
use std::time::{Duration, Instant};

async fn big_table(db: &mut TestDb) {
    db.exec(
        "SET SESSION max_recursive_iterations = 1000000;
         CREATE TABLE f (id bigint PRIMARY KEY, v varchar(300));
         INSERT INTO f WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 300000)
           SELECT n, REPEAT(MD5(n), 4) FROM g;
         ANALYZE TABLE f;",
    )
    .await;
}

/// Start an export of `f` and kill the connections of `kills` workers, one after the other,
/// each while it streams rows.
async fn export_and_kill(
    db: &mut TestDb,
    to: &std::path::Path,
    extra: &[&str],
    kills: usize,
) -> crate::common::Run {
    let mut cmd = sluice();
    cmd.args(["export", "--source", &db.url, "--table", "f"])
        .args(words("--parallel 2 --chunk-size 4MB --batch-size 256KB"))
        .args(extra)
        .arg("--to")
        .arg(to);
    let child = tokio::task::spawn_blocking(move || crate::common::run(&mut cmd));
    let deadline = Instant::now() + Duration::from_secs(60);
    let needle = format!("SELECT `id`, `v` FROM `{}`.`f`%", db.name);
    let mut killed: Vec<u64> = Vec::new();
    while killed.len() < kills {
        let not_in = std::iter::once("0".to_string())
            .chain(killed.iter().map(u64::to_string))
            .collect::<Vec<_>>()
            .join(",");
        let id: Option<u64> = db
            .conn
            .exec_first(
                format!(
                    "SELECT ID FROM information_schema.PROCESSLIST \
                     WHERE COMMAND IN ('Query', 'Execute') AND INFO LIKE ? \
                     AND ID <> CONNECTION_ID() AND ID NOT IN ({not_in}) LIMIT 1"
                ),
                (needle.clone(),),
            )
            .await
            .unwrap();
        if let Some(id) = id {
            db.conn.query_drop(format!("KILL {id}")).await.unwrap();
            killed.push(id);
            continue;
        }
        assert!(
            Instant::now() < deadline && !child.is_finished(),
            "only {} of {kills} worker queries could be killed",
            killed.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.await.unwrap()
}

fn chunk_args(extra: &[&'static str]) -> Vec<&'static str> {
    let mut a = vec![
        "--table",
        "f",
        "--parallel",
        "2",
        "--chunk-size",
        "4MB",
        "--batch-size",
        "256KB",
    ];
    a.extend_from_slice(extra);
    a
}

#[tokio::test]
async fn two_killed_workers_in_snapshot_mode_fail_cleanly_and_resume_finishes() {
    let mut db = TestDb::new().await;
    big_table(&mut db).await;
    let want = db.row_strings("SELECT id, v FROM f").await;
    let out = tempdir();
    let run = export_and_kill(&mut db, out.path(), &[], 2).await;
    run.refused(3, &["cannot join a consistent snapshot", "--resume"]);
    assert!(!out.path().join("manifest.json").exists());
    let resumed = export(&db.url, out.path(), &chunk_args(&["--resume"]));
    resumed.ok();
    let got = files::row_strings(&files::dataset_batches(
        &out.path().join(format!("{}.f", db.name)),
    ));
    files::assert_same_rows(&got, &want, "after killed workers and --resume");
    let m = files::manifest(out.path());
    assert_eq!(m["snapshots"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn statement_time_limit_fails_at_once_with_guidance() {
    let mut db = TestDb::new().await;
    big_table(&mut db).await;
    let user = format!("u{}", &db.name[2..12]);
    db.exec(&format!(
        "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw' WITH MAX_STATEMENT_TIME 0.05;
         GRANT SELECT, RELOAD ON *.* TO '{user}'@'127.0.0.1';"
    ))
    .await;
    let out = tempdir();
    let run = export(
        &db.url_as(&user, "pw"),
        out.path(),
        &["--table", "f", "--chunk-by", "none"],
    );
    run.refused(3, &["1969", "max_statement_time", "--chunk-size"]);
    assert!(!run.stderr.contains("retrying"), "{}", run.stderr);
    assert!(!out.path().join("manifest.json").exists());
}

#[tokio::test]
async fn missing_lock_privilege_offers_chunk_consistency() {
    let mut db = TestDb::new().await;
    db.exec("CREATE TABLE p (id int PRIMARY KEY); INSERT INTO p VALUES (1), (2);")
        .await;
    let user = format!("u{}", &db.name[2..12]);
    db.exec(&format!(
        "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 's3cret-pw';
         GRANT SELECT ON `{}`.* TO '{user}'@'127.0.0.1';",
        db.name
    ))
    .await;
    let url = db.url_as(&user, "s3cret-pw");
    let out = tempdir();
    let run = export(&url, &out.path().join("a"), &["--table", "p"]);
    run.refused(3, &["RELOAD", "--consistency chunk"]);
    assert!(!run.stderr.contains("s3cret-pw"), "{}", run.stderr);
    let ok = export(
        &url,
        &out.path().join("b"),
        &["--table", "p", "--consistency", "chunk"],
    );
    ok.ok();
    let rows = files::row_strings(&files::dataset_batches(
        &out.path().join(format!("b/{}.p", db.name)),
    ));
    assert_eq!(rows, ["1", "2"]);
}

#[tokio::test]
async fn wrong_password_and_unknown_table_are_clear() {
    let db = TestDb::new().await;
    let out = tempdir();
    let bad = db.url_as(
        sluice_testkit::mariadb::MariadbServer::USER,
        "not-the-password",
    );
    let run = export(&bad, out.path(), &["--table", "x"]);
    run.refused(3, &["1045"]);
    assert!(!run.stderr.contains("not-the-password"), "{}", run.stderr);
    let run = export(&db.url, out.path(), &["--table", "missing"]);
    run.refused(2, &["does not exist"]);
}
