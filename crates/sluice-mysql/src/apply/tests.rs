//! The statements a unit becomes on MySQL/MariaDB, as text (no server: the planner sends into
//! a [`Recorder`]).

use super::dialect::MySql;
use arrow_schema::DataType;
use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;
use sluice_core::apply::planner::FLUSH_BYTES;
use sluice_core::apply::planner::fixture::{self, Row};
use sluice_core::apply::{Engine, UnitTable};
use sluice_core::columns::field;
use std::collections::HashMap;

/// Table `d.t (id int, v)` keyed by `key`, `v` text or, with `json`, JSON.
fn table_of(key: &[&str], json: bool, rows: &[Row<'_>]) -> UnitTable {
    let mut v = field("v", DataType::Utf8);
    if json {
        v = v.with_metadata(HashMap::from([(
            EXTENSION_TYPE_NAME_KEY.to_string(),
            "arrow.json".to_string(),
        )]));
    }
    fixture::table(key, "x", v, Engine::Mysql, rows).unwrap()
}

fn table(key: &[&str], rows: &[Row<'_>]) -> UnitTable {
    table_of(key, false, rows)
}

/// What `t`'s rows become in one unit on MySQL (`mysql_json`) or MariaDB, `batches` as in
/// `ApplyUnit::batches`: each buffer sent.
async fn sent_on(t: UnitTable, batches: &[u32], mysql_json: bool) -> Vec<String> {
    fixture::sent(MySql { mysql_json }, &fixture::unit(t, batches))
        .await
        .unwrap()
}

async fn script_on(t: UnitTable, batches: &[u32], mysql_json: bool) -> String {
    fixture::script(MySql { mysql_json }, &fixture::unit(t, batches))
        .await
        .unwrap()
}

async fn script(t: UnitTable, batches: &[u32]) -> String {
    script_on(t, batches, false).await
}

/// The dialect on MariaDB (JSON is text there).
const MARIADB: MySql = MySql { mysql_json: false };

fn x(s: &str) -> String {
    crate::sql::quote_literal(s)
}

#[tokio::test]
async fn a_unit_as_statements() {
    let expected = format!(
        "INSERT INTO `d`.`t` (`id`,`v`) VALUES (1,{}),(2,NULL);\
             UPDATE `d`.`t` SET `v`={} WHERE `id` = 2;\
             INSERT INTO `d`.`t` (`id`) VALUES (3);\
             DELETE FROM `d`.`t` WHERE `id` = 1;",
        x("a"),
        x("it's")
    );
    fixture::A_UNIT.check(MARIADB, table, &expected).await;
}

#[tokio::test]
async fn keyless_rows_and_null_keys() {
    let expected = format!(
        "DELETE FROM `d`.`t` WHERE `id` <=> 1 AND `v` IS NULL LIMIT 1;\
             UPDATE `d`.`t` SET `id`=2,`v`={b} WHERE `id` <=> 2 AND `v` <=> {b} LIMIT 1;\
             UPDATE `d`.`t` SET `v`={c} WHERE `v` <=> {c} LIMIT 1;",
        b = x("b"),
        c = x("c")
    );
    fixture::KEYLESS.check(MARIADB, table, &expected).await;
    let null_key = table(&["id", "v"], &[("delete", None, Some("a"), &[])]);
    assert_eq!(
        script(null_key, &[]).await,
        format!(
            "DELETE FROM `d`.`t` WHERE `id` IS NULL AND `v` = {};",
            x("a")
        )
    );
    let json = || table_of(&[], true, &[("delete", Some(1), Some("{}"), &[])]);
    assert_eq!(
        script_on(json(), &[], true).await,
        format!(
            "DELETE FROM `d`.`t` WHERE `id` <=> 1 AND `v` <=> CAST({} AS JSON) LIMIT 1;",
            x("{}")
        ),
        "MySQL compares JSON as JSON"
    );
    assert_eq!(
        script_on(json(), &[], false).await,
        format!(
            "DELETE FROM `d`.`t` WHERE `id` <=> 1 AND `v` <=> {} LIMIT 1;",
            x("{}")
        ),
        "MariaDB's JSON is text"
    );
}

#[tokio::test]
async fn a_batch_as_statements() {
    let expected = format!(
        "UPDATE `d`.`t` SET `v`=CASE WHEN (`id` = 1) THEN {} WHEN (`id` = 3) THEN NULL END \
             WHERE `id` IN (1,3);DELETE FROM `d`.`t` WHERE `id` IN (4,5);\
             INSERT INTO `d`.`t` (`id`,`v`) VALUES (6,{}),(8,{});\
             INSERT INTO `d`.`t` (`id`) VALUES (7);",
        x("a"),
        x("f"),
        x("h")
    );
    fixture::A_BATCH.check(MARIADB, table, &expected).await;
    let two = table(
        &["id", "v"],
        &[
            ("delete", Some(1), Some("a"), &[]),
            ("delete", Some(2), Some("b"), &[]),
        ],
    );
    assert_eq!(
        script(two, &[2]).await,
        format!(
            "DELETE FROM `d`.`t` WHERE (`id` = 1 AND `v` = {}) OR (`id` = 2 AND `v` = {});",
            x("a"),
            x("b")
        )
    );
}

#[tokio::test]
async fn batches_are_chunked_at_the_row_limits() {
    let rows = |op: &'static str, n: i32| -> Vec<Row<'static>> {
        (0..n).map(|i| (op, Some(i), Some("v"), &[][..])).collect()
    };
    let s = script(table(&["id"], &rows("update", 401)), &[401]).await;
    let whens: Vec<usize> = s
        .split_terminator(';')
        .map(|s| s.matches(" WHEN ").count())
        .collect();
    assert_eq!(whens, [200, 200, 1]);
    let s = script(table(&["id"], &rows("delete", 1001)), &[1001]).await;
    let keys: Vec<usize> = s
        .split_terminator(';')
        .map(|s| s.matches(',').count() + 1)
        .collect();
    assert_eq!(keys, [1000, 1]);
}

#[tokio::test]
async fn an_empty_insert_joins_the_multi_row_insert() {
    let t = table(&["id"], fixture::EMPTY_INSERTS);
    assert_eq!(script(t, &[]).await, "INSERT INTO `d`.`t` () VALUES (),();");
}

#[tokio::test]
async fn a_large_unit_is_sent_at_the_flush_bound() {
    let big = "x".repeat(FLUSH_BYTES / 6);
    let s = sent_on(table(&["id"], &fixture::inserts_of(&big)), &[4], false).await;
    assert_eq!(
        s.len(),
        2,
        "hex doubles the text: three rows pass the bound"
    );
    assert!(s[0].starts_with("START TRANSACTION;INSERT INTO") && s[0].ends_with("');"));
    assert!(s[0].len() > FLUSH_BYTES);
    assert!(s[1].starts_with("INSERT INTO `d`.`t` (`id`,`v`) VALUES (3,_utf8mb4 X'78"));
    assert!(s[1].ends_with("');COMMIT"));
}

#[tokio::test]
async fn bookkeeping_statements() {
    let at = fixture::position("f.1:4", "f.1:9", None);
    let mysql = MySql { mysql_json: false };
    let (sent, json) = fixture::bookkeeping(mysql, "r", &at, "int").await.unwrap();
    assert_eq!(
        sent,
        [format!(
            "START TRANSACTION;\
             INSERT INTO `sluice`.`applied` (`name`,`worker`,`unit`,`restart`,`pos`,\
             `commit_ts`,`skip`) VALUES ({},2,7,{},{},NULL,1) ON DUPLICATE KEY UPDATE \
             `unit`=VALUES(`unit`),`restart`=VALUES(`restart`),`pos`=VALUES(`pos`),\
             `commit_ts`=VALUES(`commit_ts`),`skip`=VALUES(`skip`),\
             `updated`=CURRENT_TIMESTAMP(6);\
             INSERT INTO `sluice`.`columns` (`name`,`table_schema`,`table_name`,`columns`) \
             VALUES ({},{},{},{}) ON DUPLICATE KEY UPDATE `columns`=VALUES(`columns`),\
             `updated`=CURRENT_TIMESTAMP(6);COMMIT",
            x("r"),
            x("f.1:4"),
            x("f.1:9"),
            x("r"),
            x("d"),
            x("t"),
            x(&json)
        )]
    );
}
