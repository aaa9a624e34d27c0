//! Oracle's MySQL 9 (the test kit's `--mysql` server, `SLUICE_TEST_MYSQL9_URL`), next to the
//! MariaDB every other `mysql_*` topic runs on: an export of a table read back and compared
//! with the table, and what only MySQL's binary log has (binary JSON, compressed transactions,
//! XA), each stream replayed over its snapshot by `_seq` (`sluice_testkit::changes::replay`)
//! and compared with the table. The scenarios every change source passes are
//! `capture_suite`'s MySQL 9 rows. MySQL 9 differs from
//! MariaDB where sluice must notice: GTIDs of its own form, `SHOW BINARY LOG STATUS`,
//! `caching_sha2_password` only.

use crate::common::{files, run, sluice, tempdir};
use sluice_testkit::changes::replay;
use sluice_testkit::mysql::TestDb;

/// A fresh database on the MySQL 9 server, checked to be MySQL 9: a URL pointing at MariaDB
/// would pass these tests without testing what they are for.
async fn mysql9_db() -> TestDb {
    let mut db = sluice_testkit::mysql9::test_db().await;
    let version = db.scalar("SELECT VERSION()").await.unwrap_or_default();
    let comment = db
        .scalar("SELECT @@version_comment")
        .await
        .unwrap_or_default();
    assert!(
        version.starts_with("9.") && !format!("{version} {comment}").contains("MariaDB"),
        "{} is not MySQL 9 (VERSION() {version:?}, @@version_comment {comment:?})",
        sluice_testkit::mysql9::URL_VAR
    );
    db
}

const TABLE: &str = "CREATE TABLE t (id bigint PRIMARY KEY, v int NOT NULL, name varchar(40),
                                      amount decimal(12,2) NOT NULL);
     INSERT INTO t VALUES (1, 10, 'one', 1.50), (2, 20, NULL, -2.25), (3, 30, 'drei', 0.00),
                          (4, 40, 'ünïcödé 𝄞', 99999.99);";

const SELECT: &str = "SELECT id, v, name, amount FROM t";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_of_a_table_matches_the_table() {
    let mut db = mysql9_db().await;
    db.exec(TABLE).await;
    let to = tempdir();
    let table = format!("{}.t", db.name);
    run(sluice()
        .args(["export", "--source", &db.url, "--table", &table])
        .arg("--to")
        .arg(to.path()))
    .ok();
    let got = files::row_strings(&files::dataset_batches(&to.path().join(&table)));
    files::assert_same_rows(&got, &db.row_strings(SELECT).await, "MySQL 9 export of t");
}

/// `sluice stream --until-current` of `table` from `url` into `to`.
fn stream_cmd(url: &str, table: &str, to: &std::path::Path) -> std::process::Command {
    let mut c = crate::common::stream(url, table, to);
    c.arg("--until-current");
    c
}

/// MySQL's binary JSON keeps DECIMAL, DATE, DATETIME and TIME scalars as opaque values (a
/// stream used to stop for good on them): the changes carry the text the server itself gives
/// for the document, as the export reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_json_with_opaque_scalars_streams_as_the_server_prints_it() {
    let mut db = mysql9_db().await;
    db.exec(
        "CREATE TABLE j (id int PRIMARY KEY, doc json);
         INSERT INTO j VALUES (1, JSON_OBJECT('a', 1));",
    )
    .await;
    let to = tempdir();
    let table = format!("{}.j", db.name);
    run(&mut stream_cmd(&db.url, &table, to.path())).ok();
    db.exec(
        "INSERT INTO j VALUES (2, JSON_OBJECT(
             'd', CAST(1.50 AS DECIMAL(5,2)), 'dt', CAST('2024-01-02' AS DATE),
             'ts', CAST('2024-01-02 03:04:05.123456' AS DATETIME(6)),
             't', CAST('10:11:12' AS TIME), 'big', CAST(-12345678901234.5678 AS DECIMAL(30,4)),
             'n', JSON_ARRAY(1, 2.5, 'x', true, null, -7, 18446744073709551615),
             'nested', JSON_OBJECT('k', 'ünï \"q\"')));
         UPDATE j SET doc = JSON_ARRAY(CAST(-0.001 AS DECIMAL(4,3)), CAST('23:59:59.5' AS TIME(1)))
           WHERE id = 1;
         INSERT INTO j VALUES (3, NULL), (4, CAST('\"text\"' AS JSON)), (5, CAST('3.25e10' AS JSON));",
    )
    .await;
    run(&mut stream_cmd(&db.url, &table, to.path())).ok();
    let r = replay(&to.path().join(&table), &["id"]);
    files::assert_same_rows(
        &r.rows,
        &db.row_strings("SELECT id, doc FROM j").await,
        "binary JSON as the server prints it",
    );
}

/// A session with `binlog_transaction_compression=ON` writes its transactions as compressed
/// payload events whose inner events carry no position: they are read, at the payload's
/// position (they used to be passed over, the position moving past them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_transactions_are_read() {
    use mysql_async::prelude::Queryable;
    let mut db = mysql9_db().await;
    db.exec(TABLE).await;
    let to = tempdir();
    let table = format!("{}.t", db.name);
    run(&mut stream_cmd(&db.url, &table, to.path())).ok();
    let mut c = sluice_testkit::mysql::connect(&db.url).await;
    c.query_drop(
        "SET SESSION binlog_transaction_compression = ON;
         START TRANSACTION;
         INSERT INTO t VALUES (5, 50, 'five', 5.05), (6, 60, REPEAT('z', 30), 6.00);
         UPDATE t SET v = v + 1 WHERE id <= 2;
         DELETE FROM t WHERE id = 4;
         COMMIT;
         UPDATE t SET name = 'solo' WHERE id = 6;",
    )
    .await
    .unwrap();
    db.exec("UPDATE t SET v = 0 WHERE id = 3").await;
    run(&mut stream_cmd(&db.url, &table, to.path())).ok();
    let r = replay(&to.path().join(&table), &["id"]);
    files::assert_same_rows(
        &r.rows,
        &db.row_strings(SELECT).await,
        "compressed transactions replayed",
    );
    assert_eq!(r.changes.len(), 7, "{:?}", r.changes);
}

/// MySQL writes an XA transaction at `XA PREPARE` (after `XA START`): one rolled back leaves
/// nothing, one committed later arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xa_transactions_arrive_at_their_commit_only() {
    use mysql_async::prelude::Queryable;
    let mut db = sluice_testkit::mysql9::test_db_alone().await;
    db.exec(TABLE).await;
    let to = tempdir();
    let table = format!("{}.t", db.name);
    run(&mut stream_cmd(&db.url, &table, to.path())).ok();
    let mut c = sluice_testkit::mysql::connect(&db.url).await;
    for (xid, id) in [("gone", 10), ("kept", 20)] {
        c.query_drop(format!(
            "XA START '{xid}'; INSERT INTO t VALUES ({id}, {id}, 'xa', 1.00); XA END '{xid}';
             XA PREPARE '{xid}';"
        ))
        .await
        .unwrap();
    }
    c.query_drop("XA ROLLBACK 'gone'").await.unwrap();
    run(&mut stream_cmd(&db.url, &table, to.path())).ok();
    c.query_drop("XA COMMIT 'kept'").await.unwrap();
    run(&mut stream_cmd(&db.url, &table, to.path())).ok();
    let r = replay(&to.path().join(&table), &["id"]);
    files::assert_same_rows(&r.rows, &db.row_strings(SELECT).await, "XA on MySQL 9");
    assert!(
        r.changes.iter().all(|c| c.cells[0] != "10"),
        "a phantom row"
    );
}
