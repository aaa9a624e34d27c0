#![allow(clippy::unwrap_used)]
//! Every key shape on MariaDB splits into chunks that together hold every row exactly once:
//! integer (dense, sparse, unsigned up to u64::MAX), text with a case-insensitive collation,
//! composite, binary, datetime, decimal, a unique NOT NULL key instead of a primary key, a
//! nullable user-chosen key (its NULL rows in their own chunk), and the shapes that are not
//! split (no key, an enum key, a view).

use crate::common::{export, files, tempdir};
use sluice_testkit::mysql::TestDb;

/// Export `table` with small chunks; return (exported rows as strings, number of parts, the
/// manifest's part ranges).
fn export_rows(db: &TestDb, table: &str, extra: &[&str]) -> (Vec<String>, Vec<serde_json::Value>) {
    let out = tempdir();
    let mut args = vec!["--table", table, "--parallel", "3", "--batch-size", "64KB"];
    if !extra.contains(&"--chunk-size") {
        args.extend(["--chunk-size", "64KB"]);
    }
    args.extend(extra);
    export(&db.url, out.path(), &args).ok();
    let rows = files::row_strings(&files::dataset_batches(
        &out.path().join(format!("{}.{table}", db.name)),
    ));
    let m = files::manifest(out.path());
    let parts = m["datasets"][0]["parts"].as_array().unwrap().clone();
    (rows, parts)
}

async fn check(
    db: &mut TestDb,
    table: &str,
    oracle: &str,
    min_parts: usize,
    extra: &[&str],
) -> Vec<serde_json::Value> {
    db.exec(&format!("ANALYZE TABLE {table}")).await;
    let want = db.row_strings(oracle).await;
    let (got, parts) = export_rows(db, table, extra);
    files::assert_same_rows(&got, &want, table);
    assert!(
        parts.len() >= min_parts,
        "{table}: {} part(s), expected at least {min_parts}: {parts:?}",
        parts.len()
    );
    parts
}

const SEQ: &str = "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 20000)";

#[tokio::test]
async fn integer_keys_dense_sparse_and_unsigned() {
    let mut db = TestDb::new().await;
    db.exec(&format!(
        "SET SESSION max_recursive_iterations = 1000000;
         CREATE TABLE dense (id bigint PRIMARY KEY, v varchar(40));
         INSERT INTO dense {SEQ} SELECT n, CONCAT('v', n) FROM g;
         CREATE TABLE sparse (id int PRIMARY KEY, v varchar(40));
         INSERT INTO sparse {SEQ} SELECT IF(n <= 1000, n, 1000000000 + n), CONCAT('v', n) FROM g;
         CREATE TABLE unsigned_big (id bigint unsigned PRIMARY KEY, v varchar(40));
         INSERT INTO unsigned_big {SEQ} SELECT 18446744073709551615 - n * 1000, CONCAT('v', n) FROM g;
         INSERT INTO unsigned_big VALUES (0, 'zero');"
    ))
    .await;
    check(&mut db, "dense", "SELECT id, v FROM dense", 4, &[]).await;
    let parts = check(&mut db, "sparse", "SELECT id, v FROM sparse", 4, &[]).await;
    // Adapted to the rows: the empty middle of the key space does not make empty chunks that
    // leave one chunk with nearly everything.
    let rows: Vec<u64> = parts.iter().map(|p| p["rows"].as_u64().unwrap()).collect();
    let biggest = *rows.iter().max().unwrap();
    assert!(
        biggest * 2 < 20_000,
        "sparse key: one part holds {biggest} of 20000 rows: {rows:?}"
    );
    check(
        &mut db,
        "unsigned_big",
        "SELECT CAST(id AS CHAR), v FROM unsigned_big",
        4,
        &[],
    )
    .await;
}

#[tokio::test]
async fn text_composite_binary_datetime_and_decimal_keys() {
    let mut db = TestDb::new().await;
    db.exec(&format!(
        "SET SESSION max_recursive_iterations = 1000000;
         CREATE TABLE txt (k varchar(50) COLLATE utf8mb4_general_ci PRIMARY KEY, v int);
         INSERT INTO txt {SEQ} SELECT CONCAT(IF(n % 2 = 0, 'K', 'k'), LPAD(n, 6, '0'), IF(n % 7 = 0, 'é😀', '')), n FROM g;
         CREATE TABLE comp (a int, b varchar(20), v int, PRIMARY KEY (a, b));
         INSERT INTO comp {SEQ} SELECT n % 7, CONCAT('b', n), n FROM g;
         CREATE TABLE bin (k varbinary(16) PRIMARY KEY, v int);
         INSERT INTO bin {SEQ} SELECT UNHEX(MD5(n)), n FROM g;
         CREATE TABLE dt (k datetime(6) PRIMARY KEY, v int);
         INSERT INTO dt {SEQ} SELECT TIMESTAMPADD(SECOND, n * 37, '2020-01-01 00:00:00.123456'), n FROM g;
         CREATE TABLE dec_key (k decimal(20,4) PRIMARY KEY, v int);
         INSERT INTO dec_key {SEQ} SELECT n / 3, n FROM g;"
    ))
    .await;
    check(&mut db, "txt", "SELECT k, v FROM txt", 4, &[]).await;
    check(&mut db, "comp", "SELECT a, b, v FROM comp", 4, &[]).await;
    check(&mut db, "bin", "SELECT LOWER(HEX(k)), v FROM bin", 4, &[]).await;
    check(
        &mut db,
        "dt",
        "SELECT DATE_FORMAT(k, '%Y-%m-%dT%H:%i:%s.%f'), v FROM dt",
        4,
        &[],
    )
    .await;
    check(&mut db, "dec_key", "SELECT k, v FROM dec_key", 4, &[]).await;
}

#[tokio::test]
async fn unique_keys_nullable_keys_and_unsplittable_shapes() {
    let mut db = TestDb::new().await;
    db.exec(&format!(
        "SET SESSION max_recursive_iterations = 1000000;
         CREATE TABLE uniq (id int NOT NULL, code varchar(20) NOT NULL, v varchar(40),
                            UNIQUE KEY u_code (code), UNIQUE KEY u_id (id));
         INSERT INTO uniq {SEQ} SELECT n, CONCAT('c', n), CONCAT('v', n) FROM g;
         CREATE TABLE nokey (id int, v varchar(40));
         INSERT INTO nokey {SEQ} SELECT n, CONCAT('v', n) FROM g;
         CREATE TABLE nullable (id int PRIMARY KEY, grp int NULL, v varchar(40));
         INSERT INTO nullable {SEQ} SELECT n, IF(n % 5 = 0, NULL, n % 1000), CONCAT('v', n) FROM g;
         CREATE TABLE en (k enum('x','a','m') PRIMARY KEY, v int);
         INSERT INTO en VALUES ('x', 1), ('a', 2), ('m', 3);
         CREATE VIEW vw AS SELECT id, v FROM nokey WHERE id <= 100;"
    ))
    .await;
    // No primary key: the unique key over NOT NULL columns with the fewest columns (u_code and
    // u_id tie on one column; the name breaks the tie).
    let parts = check(&mut db, "uniq", "SELECT id, code, v FROM uniq", 4, &[]).await;
    assert!(
        parts[0]["range"].as_str().unwrap().starts_with("(code)"),
        "{}",
        parts[0]["range"]
    );
    let parts = check(&mut db, "nokey", "SELECT id, v FROM nokey", 1, &[]).await;
    assert_eq!(parts.len(), 1, "no key: one chunk");
    // A user-chosen nullable key: NULL rows in a chunk of their own.
    let parts = check(
        &mut db,
        "nullable",
        "SELECT id, grp, v FROM nullable",
        3,
        &["--chunk-by", "key:grp"],
    )
    .await;
    assert!(
        parts.last().unwrap()["range"]
            .as_str()
            .unwrap()
            .starts_with("NULL in"),
        "{parts:?}"
    );
    assert_eq!(parts.last().unwrap()["rows"], 4000);
    let parts = check(
        &mut db,
        "en",
        "SELECT k, v FROM en",
        1,
        &["--chunk-size", "1"],
    )
    .await;
    assert_eq!(parts.len(), 1, "enum keys are not split");
    let parts = check(&mut db, "vw", "SELECT id, v FROM vw", 1, &[]).await;
    assert_eq!(parts.len(), 1);
    // --chunk-by ctid is refused with the alternative.
    let out = tempdir();
    let run = export(
        &db.url,
        out.path(),
        &["--table", "uniq", "--chunk-by", "ctid"],
    );
    run.refused(2, &["--chunk-by key"]);
}

#[tokio::test]
async fn queries_and_names_that_need_quoting() {
    let mut db = TestDb::new().await;
    db.exec(
        "CREATE TABLE `we``ird.na me` (`sel``ect` int PRIMARY KEY, `from` varchar(10));
         INSERT INTO `we``ird.na me` VALUES (1, 'a'), (2, 'b');",
    )
    .await;
    let out = tempdir();
    export(
        &db.url,
        out.path(),
        &[
            "--table",
            "\"we`ird.na me\"",
            "--query",
            "q=SELECT `sel``ect` * 2 AS twice, CONCAT(`from`, '!') AS s FROM `we``ird.na me`",
        ],
    )
    .ok();
    let rows = files::row_strings(&files::dataset_batches(
        // A name holding a dot is quoted in the dataset name, so it cannot collide.
        &out.path().join(format!("{}.\"we`ird.na me\"", db.name)),
    ));
    assert_eq!(rows, ["1|a", "2|b"]);
    let q = files::row_strings(&files::dataset_batches(&out.path().join("q")));
    assert_eq!(q, ["2|a!", "4|b!"]);
}
