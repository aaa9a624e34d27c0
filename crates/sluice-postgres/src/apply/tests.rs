//! The statements a unit becomes on PostgreSQL, as text (no server: the planner sends into a
//! [`Recorder`]).

use super::dialect::PgSql;
use arrow_schema::DataType;
use sluice_core::apply::planner::FLUSH_BYTES;
use sluice_core::apply::planner::fixture::{self, Row};
use sluice_core::apply::{Engine, UnitTable};
use sluice_core::columns::field;

/// Table `d.t (id int, v)` keyed by `key`, `v` of source type `v_type`.
fn table_of(key: &[&str], v_type: &str, rows: &[Row<'_>]) -> UnitTable {
    fixture::table(
        key,
        v_type,
        field("v", DataType::Utf8),
        Engine::Postgres,
        rows,
    )
    .unwrap()
}

fn table(key: &[&str], rows: &[Row<'_>]) -> UnitTable {
    table_of(key, "text", rows)
}

/// What `t`'s rows become in one unit, `batches` as in `ApplyUnit::batches`: each buffer sent.
async fn sent(t: UnitTable, batches: &[u32]) -> Vec<String> {
    fixture::sent(PgSql::default(), &fixture::unit(t, batches))
        .await
        .unwrap()
}

async fn script(t: UnitTable, batches: &[u32]) -> String {
    fixture::script(PgSql::default(), &fixture::unit(t, batches))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_unit_as_statements() {
    let expected = "INSERT INTO \"d\".\"t\" (\"id\", \"v\") VALUES\n('1', 'a'),\n('2', NULL);\n\
         UPDATE \"d\".\"t\" SET \"v\" = 'it''s' WHERE \"id\" = '2';\n\
         INSERT INTO \"d\".\"t\" (\"id\") VALUES\n('3');\n\
         DELETE FROM \"d\".\"t\" WHERE \"id\" = '1';\n";
    fixture::A_UNIT
        .check(PgSql::default(), table, expected)
        .await;
}

#[tokio::test]
async fn keyless_rows_and_null_keys() {
    let expected = "DELETE FROM \"d\".\"t\" WHERE ctid = (SELECT ctid FROM \"d\".\"t\" WHERE \"id\" = '1' \
         AND \"v\" IS NULL LIMIT 1);\n\
         UPDATE \"d\".\"t\" SET \"id\" = '2', \"v\" = 'b' WHERE ctid = (SELECT ctid FROM \
         \"d\".\"t\" WHERE \"id\" = '2' AND \"v\" = 'b' LIMIT 1);\n\
         UPDATE \"d\".\"t\" SET \"v\" = 'c' WHERE ctid = (SELECT ctid FROM \"d\".\"t\" WHERE \
         \"v\" = 'c' LIMIT 1);\n";
    fixture::KEYLESS
        .check(PgSql::default(), table, expected)
        .await;
    let json = table_of(&[], "json", &[("delete", Some(1), Some("{}"), &[])]);
    assert_eq!(
        script(json, &[]).await,
        "DELETE FROM \"d\".\"t\" WHERE ctid = (SELECT ctid FROM \"d\".\"t\" WHERE \"id\" = '1' \
         AND \"v\"::text = '{}' LIMIT 1);\n",
        "a type without equality compares as text"
    );
    let null_key = table(&["id", "v"], &[("delete", None, Some("a"), &[])]);
    assert_eq!(
        script(null_key, &[]).await,
        "DELETE FROM \"d\".\"t\" WHERE \"id\" IS NULL AND \"v\" = 'a';\n"
    );
}

#[tokio::test]
async fn a_batch_as_statements() {
    let expected = "UPDATE \"d\".\"t\" AS _t SET \"v\" = _v.\"v\" FROM (VALUES ((NULL::\"d\".\"t\").\"id\", \
         (NULL::\"d\".\"t\").\"v\"), ('1', 'a'), ('3', NULL)) AS _v(\"id\", \"v\") WHERE \
         _t.\"id\" = _v.\"id\";\n\
         DELETE FROM \"d\".\"t\" AS _t USING (VALUES ((NULL::\"d\".\"t\").\"id\"), ('4'), ('5')) \
         AS _v(\"id\") WHERE _t.\"id\" = _v.\"id\";\n\
         INSERT INTO \"d\".\"t\" (\"id\", \"v\") VALUES\n('6', 'f'),\n('8', 'h');\n\
         INSERT INTO \"d\".\"t\" (\"id\") VALUES\n('7');\n";
    fixture::A_BATCH
        .check(PgSql::default(), table, expected)
        .await;
}

#[tokio::test]
async fn batches_are_chunked_at_the_row_limit() {
    let rows: Vec<Row<'_>> = (0..2001)
        .map(|i| ("delete", Some(i), None, &[][..]))
        .collect();
    let s = script(table(&["id"], &rows), &[2001]).await;
    let statements: Vec<&str> = s.split_terminator(";\n").collect();
    assert_eq!(statements.len(), 3);
    let values = |s: &str| s.matches("), (").count();
    assert_eq!(
        statements.iter().map(|s| values(s)).collect::<Vec<_>>(),
        [1000, 1000, 1],
        "the typed first row and then the rows"
    );
}

#[tokio::test]
async fn an_empty_insert_is_default_values() {
    let t = table(&["id"], fixture::EMPTY_INSERTS);
    assert_eq!(
        script(t, &[]).await,
        "INSERT INTO \"d\".\"t\" DEFAULT VALUES;\nINSERT INTO \"d\".\"t\" DEFAULT VALUES;\n"
    );
}

#[tokio::test]
async fn a_large_unit_is_sent_at_the_flush_bound() {
    let big = "x".repeat(FLUSH_BYTES / 3);
    let s = sent(table(&["id"], &fixture::inserts_of(&big)), &[4]).await;
    assert_eq!(s.len(), 2);
    assert!(s[0].starts_with("BEGIN;\nINSERT INTO") && s[0].ends_with("');\n"));
    assert!(s[0].len() > FLUSH_BYTES);
    assert!(s[1].starts_with("INSERT INTO \"d\".\"t\" (\"id\", \"v\") VALUES\n('3', 'x"));
    assert!(s[1].ends_with("');\nCOMMIT"));
}

#[tokio::test]
async fn bookkeeping_statements() {
    let at = fixture::position("0/10", "0/20", Some(5));
    let (sent, _) = fixture::bookkeeping(PgSql::default(), "it's", &at, "integer")
        .await
        .unwrap();
    assert_eq!(
        sent,
        [r#"BEGIN;
INSERT INTO "sluice"."applied" ("name", "worker", "unit", "restart", "pos", "commit_ts", "skip") VALUES ('it''s', 2, 7, '0/10', '0/20', 5, 1) ON CONFLICT ("name", "worker") DO UPDATE SET "unit" = excluded."unit", "restart" = excluded."restart", "pos" = excluded."pos", "commit_ts" = excluded."commit_ts", "skip" = excluded."skip", updated_at = now();
INSERT INTO "sluice"."columns" ("name", "table_schema", "table_name", "columns") VALUES ('it''s', 'd', 't', '[{"name":"id","source_type":"integer"}]') ON CONFLICT ("name", "table_schema", "table_name") DO UPDATE SET "columns" = excluded."columns", updated_at = now();
COMMIT"#]
    );
}
