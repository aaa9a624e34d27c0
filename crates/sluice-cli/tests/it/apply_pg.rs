#![allow(clippy::unwrap_used)]
//! PostgreSQL as a replication target, through the library (`sluice_postgres::PgApplyTarget`):
//! tables created from a discovered source table, the initial load's `COPY` and units for every
//! type, a MySQL table's mapped types, privileges; and the source's table keys. What every
//! apply target passes (units in order with their position, conflicts, barriers applied twice,
//! an earlier release's bookkeeping) is `apply_suite`'s PostgreSQL rows.

use crate::common::*;
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{
    ArrayRef, Int32Array, RecordBatch, StringArray, TimestampMicrosecondArray, UInt64Array,
};
use arrow_schema::{Field, Schema};
use sluice_core::apply::{ApplyTarget, ApplyUnit, TableKeys, TargetTable, UnitTable};
use sluice_core::change::{ChangeSource, change_fields};
use sluice_core::table::{Dataset, TableRef};
use sluice_postgres::PgApplyTarget;
use sluice_testkit::apply::{apply_commit, create, discover as discover_in, holds_rows, unit};
use std::sync::Arc;

/// The datasets of `tables` on the PostgreSQL at `url`, as a replication discovers them.
async fn discover(url: &str, tables: &[&str]) -> Vec<Dataset> {
    discover_in(&sluice_postgres::PgSource::new(url).unwrap(), tables).await
}

fn target_table(d: &Dataset, keys: TableKeys) -> TargetTable {
    TargetTable {
        table: d.object.clone().unwrap(),
        columns: d.columns.clone(),
        keys,
        source_engine: sluice_core::apply::Engine::Postgres,
    }
}

/// Rows of a unit table: the table's `columns` arrays followed by the change columns, one
/// change per row (`ops`), with `absent` column names per row.
fn unit_table(
    d: &Dataset,
    key: &[&str],
    fields: Vec<Field>,
    mut columns: Vec<ArrayRef>,
    ops: &[&str],
    absent: &[&[&str]],
) -> UnitTable {
    let n = ops.len();
    let mut list = ListBuilder::new(StringBuilder::new());
    for row in 0..n {
        for a in absent.get(row).copied().unwrap_or_default() {
            list.values().append_value(a);
        }
        list.append(true);
    }
    columns.extend([
        Arc::new(StringArray::from(ops.to_vec())) as ArrayRef,
        Arc::new(StringArray::from(vec!["0000000001000000"; n])),
        Arc::new(UInt64Array::from_iter_values(0..n as u64)),
        Arc::new(
            TimestampMicrosecondArray::from(vec![Some(1_700_000_000_000_000); n])
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from(vec!["42"; n])),
        Arc::new(list.finish()),
    ]);
    let mut all: Vec<Field> = fields.into_iter().map(|f| f.with_nullable(true)).collect();
    all.extend(change_fields());
    UnitTable {
        table: d.object.clone().unwrap(),
        columns: Arc::new(d.columns.clone()),
        key: Arc::new(key.iter().map(|k| k.to_string()).collect()),
        batch: RecordBatch::try_new(Arc::new(Schema::new(all)), columns).unwrap(),
        source_engine: sluice_core::apply::Engine::Postgres,
        sole_key: false,
    }
}

/// The exported `batches` of one table as one batch, with its fields (for [`unit_table`]).
fn one_batch(batches: &[RecordBatch]) -> (RecordBatch, Vec<Field>) {
    let batch = arrow_select::concat::concat_batches(&batches[0].schema(), batches).unwrap();
    let fields = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    (batch, fields)
}

/// Each column of `all_types` as text, by id, on `client`: what the source and target must agree on.
async fn all_types_text(db: &TestDb, cols: &[crate::types::Col]) -> Vec<String> {
    columns_text(db, cols.iter().map(|c| c.name), "all_types").await
}

/// `id` and `columns` of `table` as text, by id.
async fn columns_text<'a>(
    db: &TestDb,
    columns: impl Iterator<Item = &'a str>,
    table: &str,
) -> Vec<String> {
    let exprs: Vec<String> = columns.map(|c| format!("{c}::text")).collect();
    db.row_strings(&format!("SELECT id, {} FROM {table}", exprs.join(", ")))
        .await
}

/// The source side of the export's one lossy value: `time` 24:00:00 is exported as
/// 23:59:59.999999 (the report says so), so that is what a copy holds.
fn as_exported(rows: Vec<String>) -> Vec<String> {
    rows.into_iter()
        .map(|r| r.replace("|24:00:00|", "|23:59:59.999999|"))
        .collect()
}

/// Columns of `all_types` whose target type has no binary `COPY` encoder (or whose export type
/// is text: unconstrained numeric).
const TEXT_ONLY: [&str; 9] = [
    "c_numeric_free",
    "c_money",
    "c_timetz",
    "c_inet_arr",
    "c_inet",
    "c_cidr",
    "c_macaddr",
    "c_point",
    "c_range",
];

/// A target database on the same server with the source's enum, extension and one domain (the
/// other domain is left out, so its column takes the mapped type).
async fn target_db() -> TestDb {
    let t = TestDb::new().await;
    t.exec(
        "CREATE EXTENSION citext; CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
         CREATE DOMAIN price AS numeric(10,2);",
    )
    .await;
    t
}

#[tokio::test]
async fn every_type_loads_by_copy_and_applies_by_statements() {
    let (src, cols) = crate::types::setup().await;
    let ds = discover(&src.url, &["public.all_types"]).await;
    let d = &ds[0];
    let out = tempdir();
    export(&src.url, out.path(), &["--table", "public.all_types"]).ok();
    let batches = files::dataset_batches(&out.path().join("public.all_types"));
    let expected = as_exported(all_types_text(&src, &cols).await);
    let table = d.object.clone().unwrap();

    // Initial load: created (same-engine types; a domain missing on the target is mapped and
    // noted), loaded by COPY, equal to the source column by column.
    let dst = target_db().await;
    let target = PgApplyTarget::new(&dst.url).unwrap();
    target.prepare().await.unwrap();
    let keys = TableKeys::primary_only(table.clone(), vec!["id".into()]);
    let notes = target
        .create_tables(&[target_table(d, keys.clone())])
        .await
        .unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("c_domain") && n.contains("posint") && n.contains("integer")),
        "{notes:?}"
    );
    assert!(!holds_rows(&target, &table).await);
    let mut loader = target.loader().await.unwrap();
    for b in &batches {
        loader.load(&table, b).await.unwrap();
    }
    assert_eq!(all_types_text(&dst, &cols).await, expected);

    // The same values through binary COPY: a table of the columns whose target types have a
    // binary encoder (all_types also holds money, inet, points, ranges… and loads as text).
    let binary: Vec<&str> = cols
        .iter()
        .map(|c| c.name)
        .filter(|c| !TEXT_ONLY.contains(c))
        .collect();
    src.exec(&format!(
        "CREATE TABLE all_binary AS SELECT id, {} FROM all_types;
         ALTER TABLE all_binary ADD PRIMARY KEY (id)",
        binary.join(", ")
    ))
    .await;
    let bds = discover(&src.url, &["public.all_binary"]).await;
    let bin_table = bds[0].object.clone().unwrap();
    export(
        &src.url,
        &out.path().join("b"),
        &["--table", "public.all_binary"],
    )
    .ok();
    target
        .create_tables(&[target_table(
            &bds[0],
            TableKeys::primary_only(bin_table.clone(), vec!["id".into()]),
        )])
        .await
        .unwrap();
    for b in files::dataset_batches(&out.path().join("b/public.all_binary")) {
        loader.load(&bin_table, &b).await.unwrap();
    }
    assert_eq!(
        columns_text(&dst, binary.iter().copied(), "all_binary").await,
        as_exported(columns_text(&src, binary.iter().copied(), "all_binary").await)
    );
    assert!(holds_rows(&target, &table).await);
    let types = dst
        .row_strings(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = 'all_types'::regclass AND attname IN ('c_numeric_neg_scale', 'c_enum', 'c_int_arr')",
        )
        .await;
    assert_eq!(
        types,
        [
            "c_enum|mood",
            "c_int_arr|integer[]",
            "c_numeric_neg_scale|numeric(5,-2)"
        ]
    );

    // The same rows as apply units into a keyless copy: inserted as SQL literals, then rows
    // 1–3 deleted by matching every column (NULLs, NaN, arrays, json, points included), and
    // row 4 updated in place with row 5's values.
    let dst2 = target_db().await;
    let target2 = PgApplyTarget::new(&dst2.url).unwrap();
    target2.prepare().await.unwrap();
    target2
        .create_tables(&[target_table(
            d,
            TableKeys::primary_only(table.clone(), vec![]),
        )])
        .await
        .unwrap();
    let (batch, fields) = one_batch(&batches);
    let n = batch.num_rows();
    let ops = vec!["insert"; n];
    let inserts = unit_table(d, &[], fields.clone(), batch.columns().to_vec(), &ops, &[]);
    let mut s = target2.session("all", 0).await.unwrap();
    apply_commit(&mut s, &unit(vec![inserts]), 1).await;
    assert_eq!(all_types_text(&dst2, &cols).await, expected);
    let first3 = batch.slice(0, 3);
    let deletes = unit_table(
        d,
        &[],
        fields.clone(),
        first3.columns().to_vec(),
        &["delete"; 3],
        &[],
    );
    apply_commit(&mut s, &unit(vec![deletes]), 2).await;
    let left = all_types_text(&dst2, &cols).await;
    assert_eq!(left, expected[3..].to_vec());

    // Updates through the primary key: every column of row 4 set to row 5's (keeping id 4).
    let mut row5 = batch.slice(4, 1).columns().to_vec();
    row5[0] = Arc::new(Int32Array::from(vec![4]));
    let upd = unit_table(d, &["id"], fields.clone(), row5, &["update"], &[]);
    let mut s1 = target.session("all", 0).await.unwrap();
    apply_commit(&mut s1, &unit(vec![upd]), 1).await;
    let now = all_types_text(&dst, &cols).await;
    assert_eq!(
        now[3].split_once('|').unwrap().1,
        expected[4].split_once('|').unwrap().1
    );
    assert_eq!(now[4], expected[4]);

    // Batches: rows 1–3 set to rows 2–4's values (ids kept) by one UPDATE … FROM (VALUES …)
    // whose typed first row reads every literal as its column's type, then rows 5 and 6
    // deleted by one DELETE … USING.
    let mut next3 = batch.slice(1, 3).columns().to_vec();
    next3[0] = Arc::new(Int32Array::from(vec![1, 2, 3]));
    let upd = unit_table(d, &["id"], fields.clone(), next3, &["update"; 3], &[]);
    let last2 = batch.slice(4, 2).columns().to_vec();
    let del = unit_table(d, &["id"], fields, last2, &["delete"; 2], &[]);
    let batched = ApplyUnit {
        tables: vec![upd, del],
        order: vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)],
        batches: vec![3, 5],
    };
    apply_commit(&mut s1, &batched, 2).await;
    let now = all_types_text(&dst, &cols).await;
    assert_eq!(now.len(), 4, "rows 5 and 6 deleted: {now:?}");
    for i in 0..3 {
        assert_eq!(
            now[i].split_once('|').unwrap().1,
            expected[i + 1].split_once('|').unwrap().1,
            "row {} has row {}'s values",
            i + 1,
            i + 2
        );
    }
}

/// `acct` (keyed) and `bag` (keyless) on a source and a target database.
async fn accounts() -> (TestDb, Vec<Dataset>, TestDb, PgApplyTarget) {
    let src = TestDb::new().await;
    src.exec(
        "CREATE TABLE acct (id int PRIMARY KEY, name text NOT NULL UNIQUE, note text, n int);
         CREATE TABLE bag (a int, b text);",
    )
    .await;
    let ds = discover(&src.url, &["public.acct", "public.bag"]).await;
    let dst = TestDb::new().await;
    let target = PgApplyTarget::new(&dst.url).unwrap();
    target.prepare().await.unwrap();
    let keys = sluice_postgres::replication::PgCapture::new(&src.url)
        .unwrap()
        .table_keys(&ds)
        .await
        .unwrap();
    let tables: Vec<TargetTable> = ds
        .iter()
        .zip(keys)
        .map(|(d, k)| target_table(d, k))
        .collect();
    target.create_tables(&tables).await.unwrap();
    (src, ds, dst, target)
}

const SECRET: &str = "apply-pw-Zk4";

#[tokio::test]
async fn a_role_without_create_is_told_the_grant() {
    let (_src, ds, dst, _) = accounts().await;
    let role = format!("r_{}", dst.name);
    dst.exec(&format!("CREATE ROLE {role} LOGIN PASSWORD '{SECRET}'"))
        .await;
    let url = dst.url_as(&role, Some(SECRET));
    let target = PgApplyTarget::new(&url).unwrap();

    // No schema sluice yet in a fresh database: creating it needs CREATE on the database.
    let fresh = TestDb::new().await;
    let fresh_target = PgApplyTarget::new(&fresh.url_as(&role, Some(SECRET))).unwrap();
    let e = fresh_target.prepare().await.unwrap_err();
    let want = format!("GRANT CREATE ON DATABASE \"{}\" TO \"{role}\"", fresh.name);
    assert!(e.to_string().contains(&want), "{e}");
    assert!(!e.to_string().contains(SECRET), "{e}");
    fresh
        .exec(&format!(
            "GRANT CREATE ON DATABASE {} TO {role}",
            fresh.name
        ))
        .await;
    fresh_target.prepare().await.unwrap();

    // Schema sluice exists (made by another user): its tables need grants.
    let e = target.prepare().await.unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("GRANT USAGE ON SCHEMA sluice TO \"{role}\"")),
        "{e}"
    );
    dst.exec(&format!(
        "GRANT USAGE ON SCHEMA sluice TO {role};
         GRANT SELECT, INSERT, UPDATE, DELETE ON sluice.applied, sluice.state, sluice.columns
           TO {role}"
    ))
    .await;
    target.prepare().await.unwrap();

    // Creating a table in a schema it may not create in.
    dst.exec("CREATE SCHEMA other").await;
    let mut t = target_table(
        &ds[0],
        TableKeys::primary_only(TableRef::new("other", "acct"), vec![]),
    );
    t.table = TableRef::new("other", "acct");
    let e = target.create_tables(&[t]).await.unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "GRANT USAGE, CREATE ON SCHEMA \"other\" TO \"{role}\""
        )),
        "{e}"
    );
}

#[tokio::test]
async fn the_source_lists_primary_unique_and_foreign_keys() {
    let src = TestDb::new().await;
    src.exec(
        "CREATE TABLE parent (a int, b text, PRIMARY KEY (b, a), UNIQUE (a));
         CREATE TABLE child (
           id bigint PRIMARY KEY, code text NOT NULL, pa int, pb text, other int,
           CONSTRAINT code_u UNIQUE (code, other),
           CONSTRAINT to_parent FOREIGN KEY (pb, pa) REFERENCES parent (b, a),
           CONSTRAINT to_parent_a FOREIGN KEY (other) REFERENCES parent (a));
         CREATE UNIQUE INDEX child_pa ON child (pa) INCLUDE (other);
         CREATE UNIQUE INDEX child_partial ON child (other) WHERE other > 0;
         CREATE UNIQUE INDEX child_expr ON child (lower(code));
         CREATE INDEX child_plain ON child (pb);
         CREATE TABLE loose (x int);",
    )
    .await;
    let ds = discover(&src.url, &["public.child", "public.parent", "public.loose"]).await;
    let capture = sluice_postgres::replication::PgCapture::new(&src.url).unwrap();
    let keys = capture.table_keys(&ds).await.unwrap();
    let by = |name: &str| keys.iter().find(|k| k.table.name == name).unwrap().clone();
    let child = by("child");
    assert_eq!(child.primary, ["id"]);
    assert_eq!(
        child.unique,
        [vec!["code".to_string(), "other".into()], vec!["pa".into()]]
    );
    assert_eq!(child.foreign.len(), 2);
    assert_eq!(child.foreign[0].columns, ["pb", "pa"]);
    assert_eq!(child.foreign[0].parent, TableRef::new("public", "parent"));
    assert_eq!(child.foreign[0].parent_columns, ["b", "a"]);
    assert_eq!(child.foreign[1].columns, ["other"]);
    assert_eq!(child.foreign[1].parent_columns, ["a"]);
    let parent = by("parent");
    assert_eq!(parent.primary, ["b", "a"]);
    assert_eq!(parent.unique, [vec!["a".to_string()]]);
    assert!(parent.foreign.is_empty());
    let loose = by("loose");
    assert!(loose.primary.is_empty() && loose.unique.is_empty() && loose.foreign.is_empty());
}

/// Columns of the MySQL `all_types` whose MySQL text (`CAST(… AS CHAR)`, or the expression
/// given) is PostgreSQL's text of the mapped column.
const MYSQL_SAME_TEXT: [(&str, &str); 20] = [
    ("c_tinyint", ""),
    ("c_utinyint", ""),
    ("c_smallint", ""),
    ("c_usmallint", ""),
    ("c_mediumint", ""),
    ("c_umediumint", ""),
    ("c_int", ""),
    ("c_uint", ""),
    ("c_bigint", ""),
    ("c_ubigint", ""),
    ("c_bool", ""),
    ("c_decimal", ""),
    ("c_decimal_wide", ""),
    ("c_year", "c_year + 0"),
    ("c_char", ""),
    ("c_varchar", ""),
    ("c_text", ""),
    ("c_enum", ""),
    ("c_set", ""),
    ("c_bit64", "CAST(c_bit64 AS UNSIGNED)"),
];

/// MySQL → PostgreSQL: the mapped types, the load and the apply of every MySQL type.
#[tokio::test]
async fn a_mysql_table_lands_with_mapped_types() {
    let (mut my, _) = crate::mysql_types::setup().await;
    let qualified = format!("{}.all_types", my.name);
    let ds = discover_in(
        &sluice_mysql::MySource::new(&my.url).unwrap(),
        &[&qualified],
    )
    .await;
    let d = &ds[0];
    let table = d.object.clone().unwrap();
    let out = tempdir();
    export(&my.url, out.path(), &["--table", "all_types"]).ok();
    let batches = files::dataset_batches(&out.path().join(&qualified));

    let mut t = target_table(d, TableKeys::primary_only(table.clone(), vec!["id".into()]));
    t.source_engine = sluice_core::apply::Engine::Mysql;
    let dst = TestDb::new().await;
    let target = PgApplyTarget::new(&dst.url).unwrap();
    let notes = create(&target, std::slice::from_ref(&t)).await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("c_inet6") && n.contains("text")),
        "{notes:?}"
    );
    let rel = format!("\"{}\".all_types", my.name);
    let types = dst
        .row_strings(&format!(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = '{rel}'::regclass AND attname IN ('c_ubigint', 'c_uint', \
             'c_tinyint', 'c_year', 'c_bit64', 'c_decimal_wide', 'c_time', 'c_datetime', \
             'c_timestamp', 'c_json', 'c_geom', 'c_inet6')"
        ))
        .await;
    assert_eq!(
        types,
        [
            "c_bit64|numeric(20,0)",
            "c_datetime|timestamp without time zone",
            "c_decimal_wide|numeric(65,30)",
            "c_geom|bytea",
            "c_inet6|text",
            "c_json|jsonb",
            "c_timestamp|timestamp with time zone",
            "c_time|interval",
            "c_tinyint|smallint",
            "c_ubigint|numeric(20,0)",
            "c_uint|bigint",
            "c_year|integer",
        ]
    );
    let mut loader = target.loader().await.unwrap();
    for b in &batches {
        loader.load(&table, b).await.unwrap();
    }

    // The same rows applied as statements into a second target.
    let dst2 = TestDb::new().await;
    let target2 = PgApplyTarget::new(&dst2.url).unwrap();
    target2.prepare().await.unwrap();
    target2
        .create_tables(std::slice::from_ref(&t))
        .await
        .unwrap();
    let (batch, fields) = one_batch(&batches);
    let ops = vec!["insert"; batch.num_rows()];
    let rows = unit_table(d, &["id"], fields, batch.columns().to_vec(), &ops, &[]);
    let mut s = target2.session("my", 0).await.unwrap();
    apply_commit(&mut s, &unit(vec![rows]), 1).await;

    let my_exprs: Vec<String> = MYSQL_SAME_TEXT
        .iter()
        .map(|(c, e)| {
            if e.is_empty() {
                format!("CAST({c} AS CHAR)")
            } else {
                e.to_string()
            }
        })
        .collect();
    let want = my
        .row_strings(&format!(
            "SELECT id, {} FROM all_types",
            my_exprs.join(", ")
        ))
        .await;
    let pg_cols = MYSQL_SAME_TEXT.iter().map(|(c, _)| *c);
    let geo = format!(
        "SELECT id, encode(c_geom, 'hex') AS g, \
         to_char(c_datetime, 'YYYY-MM-DD HH24:MI:SS.US') AS dt, \
         to_char(c_timestamp AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS ts, \
         extract(epoch FROM c_time)::text AS t FROM {rel}"
    );
    for db in [&dst, &dst2] {
        assert_eq!(columns_text(db, pg_cols.clone(), &rel).await, want);
        let other = db.row_strings(&geo).await;
        assert_eq!(
            other[0],
            format!(
                "1|{}|2024-01-02 03:04:05.123456|2024-01-02 03:04:05.500000|-3020399.000000",
                my.scalar("SELECT LOWER(HEX(ST_AsBinary(c_geom))) FROM all_types WHERE id = 1")
                    .await
                    .unwrap()
            )
        );
        assert!(other[3].ends_with("|-1.500000"), "{other:?}");
        assert!(other[4].ends_with("|360000.000001"), "{other:?}");
    }
}
