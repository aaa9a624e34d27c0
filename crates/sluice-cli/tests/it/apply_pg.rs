#![allow(clippy::unwrap_used)]
//! PostgreSQL as a replication target, through the library (`sluice_postgres::PgApplyTarget`):
//! tables created from a discovered source table, the initial load's `COPY`, apply units
//! (inserts, updates with absent columns, deletes, key updates, keyless tables), the applied
//! position, conflicts, idempotent barriers, privileges; and the source's table keys.
//!
//! Length: the hand-built change batches (table columns plus change columns) are shared by
//! every scenario, and the scenarios read best next to them.

use crate::common::*;
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{
    ArrayRef, Int32Array, RecordBatch, StringArray, TimestampMicrosecondArray, UInt64Array,
};
use arrow_schema::{Field, Schema};
use sluice_core::apply::{
    AppliedPosition, ApplySession, ApplyTarget, ApplyUnit, Barrier, SourceColumn, TableKeys,
    TargetTable, UnitTable,
};
use sluice_core::change::{ChangeSource, change_fields};
use sluice_core::ident::QualifiedName;
use sluice_core::table::{Dataset, Selection, TableRef};
use sluice_core::{Consistency, Source, SourceOptions};
use sluice_postgres::PgApplyTarget;
use std::sync::Arc;

/// The datasets of `tables` on the PostgreSQL at `url`, as a replication discovers them.
async fn discover(url: &str, tables: &[&str]) -> Vec<Dataset> {
    discover_in(&sluice_postgres::PgSource::new(url).unwrap(), tables).await
}

/// The datasets of `tables` in `source`, as a replication discovers them.
async fn discover_in(source: &dyn Source, tables: &[&str]) -> Vec<Dataset> {
    let options = SourceOptions {
        session_tag: "test".into(),
        consistency: Consistency::Chunk,
        enable_row_security: false,
    };
    let mut c = source.open_coordinator(&options).await.unwrap();
    let selection = Selection {
        tables: tables
            .iter()
            .map(|t| QualifiedName::parse(t).unwrap())
            .collect(),
        ..Default::default()
    };
    let found = c.discover(&selection).await.unwrap();
    c.release().await.unwrap();
    found
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

/// A unit of the tables' rows in order: every row of table 0, then of table 1, …
fn unit(tables: Vec<UnitTable>) -> ApplyUnit {
    let order = tables
        .iter()
        .enumerate()
        .flat_map(|(t, u)| (0..u.batch.num_rows() as u32).map(move |r| (t as u32, r)))
        .collect();
    ApplyUnit {
        tables,
        order,
        batches: Vec::new(),
    }
}

fn position(unit: u64) -> AppliedPosition {
    AppliedPosition {
        unit,
        restart: sluice_core::StreamPos::from_adapter(format!("{unit:016X}")),
        pos: sluice_core::StreamPos::from_adapter(format!("{:016X}", unit + 1)),
        commit_ts: Some(1_700_000_000_000_000 + unit as i64),
        skip: 0,
    }
}

/// Apply `u` and record `unit` in one transaction, committed.
async fn apply_commit(s: &mut Box<dyn ApplySession>, u: &ApplyUnit, unit_no: u64) {
    s.begin().await.unwrap();
    s.apply(u).await.unwrap();
    s.record(&position(unit_no)).await.unwrap();
    s.commit().await.unwrap();
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
    assert!(
        target
            .non_empty(std::slice::from_ref(&table))
            .await
            .unwrap()
            .is_empty()
    );
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
    assert_eq!(
        target
            .non_empty(std::slice::from_ref(&table))
            .await
            .unwrap(),
        vec![table.clone()]
    );
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

fn acct_fields() -> Vec<Field> {
    use arrow_schema::DataType::*;
    vec![
        Field::new("id", Int32, false),
        Field::new("name", Utf8, false),
        Field::new("note", Utf8, true),
        Field::new("n", Int32, true),
    ]
}

/// Rows of `acct`: (id, name, note, n).
fn acct_rows(rows: &[(i32, &str, Option<&str>, Option<i32>)]) -> Vec<ArrayRef> {
    vec![
        Arc::new(Int32Array::from(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        )),
        Arc::new(Int32Array::from(
            rows.iter().map(|r| r.3).collect::<Vec<_>>(),
        )),
    ]
}

fn bag_table(d: &Dataset, rows: &[(Option<i32>, Option<&str>)], ops: &[&str]) -> UnitTable {
    use arrow_schema::DataType::*;
    unit_table(
        d,
        &[],
        vec![Field::new("a", Int32, true), Field::new("b", Utf8, true)],
        vec![
            Arc::new(Int32Array::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
        ],
        ops,
        &[],
    )
}

#[tokio::test]
async fn units_apply_in_order_and_record_their_position() {
    let (_src, ds, dst, target) = accounts().await;
    let (acct, bag) = (&ds[0], &ds[1]);
    assert!(target.applied("r").await.unwrap().is_none());
    let mut s0 = target.session("r", 0).await.unwrap();
    let mut s1 = target.session("r", 1).await.unwrap();

    // Inserts (merged into one statement), an update that leaves an absent column alone, a
    // delete, a key update (delete + insert), NULLs, quotes and backslashes.
    let ins = unit_table(
        acct,
        &["id"],
        acct_fields(),
        acct_rows(&[
            (1, "o'neil", Some("keep me"), Some(1)),
            (2, "back\\slash", None, Some(2)),
            (
                3,
                "'); DROP TABLE bag; --",
                Some("\\'); DROP TABLE bag; --"),
                None,
            ),
        ]),
        &["insert"; 3],
        &[],
    );
    apply_commit(&mut s0, &unit(vec![ins]), 1).await;
    // Quotes and backslashes are data, never SQL.
    assert_eq!(
        dst.row_strings("SELECT name, note FROM acct WHERE id = 3")
            .await,
        ["'); DROP TABLE bag; --|\\'); DROP TABLE bag; --"]
    );
    let changes = unit_table(
        acct,
        &["id"],
        acct_fields(),
        acct_rows(&[
            (1, "o'neil 2", None, Some(10)),
            (3, "", None, None),
            (2, "", None, None),
            (20, "back\\slash", Some("moved"), Some(2)),
        ]),
        &["update", "delete", "delete", "insert"],
        &[&["note"], &["name", "note", "n"], &["name", "note", "n"]],
    );
    let keyless = bag_table(
        bag,
        &[
            (Some(1), Some("x")),
            (Some(1), Some("x")),
            (None, Some("n")),
            (Some(1), Some("x")),
        ],
        &["insert", "insert", "insert", "delete"],
    );
    let mut both = unit(vec![changes, keyless]);
    // Interleave the two tables' rows: acct 0, bag 0..2, acct 1..3, bag 3.
    both.order = vec![
        (0, 0),
        (1, 0),
        (1, 1),
        (1, 2),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 3),
    ];
    apply_commit(&mut s1, &both, 2).await;
    assert_eq!(
        dst.row_strings("SELECT * FROM acct").await,
        ["1|o'neil 2|keep me|10", "20|back\\slash|moved|2"]
    );
    assert_eq!(dst.row_strings("SELECT * FROM bag").await, ["1|x", "∅|n"]);
    // A keyless update or delete touches one row even when several match.
    let dup = bag_table(
        bag,
        &[(Some(1), Some("x")), (Some(1), Some("x"))],
        &["insert", "insert"],
    );
    apply_commit(&mut s0, &unit(vec![dup]), 3).await;
    let del = bag_table(
        bag,
        &[(None, Some("n")), (Some(1), Some("x"))],
        &["delete", "delete"],
    );
    apply_commit(&mut s1, &unit(vec![del]), 4).await;
    assert_eq!(dst.row_strings("SELECT * FROM bag").await, ["1|x", "1|x"]);

    // The applied position is the highest unit of any worker; each worker has its row.
    assert_eq!(target.applied("r").await.unwrap(), Some(position(4)));
    assert_eq!(
        dst.row_strings("SELECT name, worker, unit FROM sluice.applied")
            .await,
        ["r|0|3", "r|1|4"]
    );
    // A rolled-back unit leaves nothing, its position included — also one larger than the
    // buffer, whose first statements were sent before `record`.
    let names: Vec<String> = (0..3000)
        .map(|i| format!("{i:04}{}", "x".repeat(400)))
        .collect();
    let big: Vec<(i32, &str, Option<&str>, Option<i32>)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (1000 + i as i32, n.as_str(), None, None))
        .collect();
    let gone = unit_table(
        acct,
        &["id"],
        acct_fields(),
        acct_rows(&big),
        &vec!["insert"; big.len()],
        &[],
    );
    s0.begin().await.unwrap();
    s0.apply(&unit(vec![gone])).await.unwrap();
    assert_eq!(
        dst.row_strings("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database()")
            .await,
        ["1"],
        "the first megabyte is sent, in the open transaction"
    );
    s0.record(&position(5)).await.unwrap();
    s0.rollback().await.unwrap();
    assert_eq!(target.applied("r").await.unwrap(), Some(position(4)));
    assert_eq!(
        dst.row_strings("SELECT count(*) FROM acct WHERE id >= 1000")
            .await,
        ["0"]
    );

    // State: saved, replaced, cleared with the positions.
    assert_eq!(target.load_state("r").await.unwrap(), None);
    target.save_state("r", b"{\"a\":1}").await.unwrap();
    target.save_state("r", b"{\"a\":2}").await.unwrap();
    assert_eq!(
        target.load_state("r").await.unwrap().as_deref(),
        Some(&b"{\"a\":2}"[..])
    );
    target.clear_state("r").await.unwrap();
    assert_eq!(target.load_state("r").await.unwrap(), None);
    assert_eq!(target.applied("r").await.unwrap(), None);
}

#[tokio::test]
async fn conflicts_are_reported_as_conflicts() {
    let (_src, ds, dst, target) = accounts().await;
    let acct = &ds[0];
    let row = |id, name| {
        unit(vec![unit_table(
            acct,
            &["id"],
            acct_fields(),
            acct_rows(&[(id, name, None, None)]),
            &["insert"],
            &[],
        )])
    };
    let mut a = target.session("c", 0).await.unwrap();
    let mut b = target.session("c", 1).await.unwrap();
    apply_commit(&mut a, &row(1, "one"), 1).await;

    // A unique violation (the primary key, then another unique key).
    for u in [row(1, "uno"), row(2, "one")] {
        b.begin().await.unwrap();
        b.apply(&u).await.unwrap();
        b.record(&position(2)).await.unwrap();
        let e = b.send().await.unwrap_err();
        assert!(e.is_apply_conflict(), "{e}");
        b.rollback().await.unwrap();
    }
    // A later unit waiting on a row an earlier, uncommitted one holds: the short lock wait
    // turns it into a conflict instead of a hang.
    a.begin().await.unwrap();
    a.apply(&row(3, "three")).await.unwrap();
    a.record(&position(3)).await.unwrap();
    a.send().await.unwrap();
    b.begin().await.unwrap();
    b.apply(&row(3, "drei")).await.unwrap();
    b.record(&position(4)).await.unwrap();
    let e = b.send().await.unwrap_err();
    assert!(e.is_apply_conflict(), "{e}");
    assert!(e.to_string().contains("acct"), "{e}");
    b.rollback().await.unwrap();
    a.commit().await.unwrap();
    assert_eq!(
        dst.row_strings("SELECT id, name FROM acct").await,
        ["1|one", "3|three"]
    );
    assert_eq!(target.applied("c").await.unwrap(), Some(position(3)));

    // Anything else is permanent and names the table.
    dst.exec("ALTER TABLE acct ADD CONSTRAINT small CHECK (id < 100)")
        .await;
    b.begin().await.unwrap();
    b.apply(&row(100, "big")).await.unwrap();
    b.record(&position(5)).await.unwrap();
    let e = b.send().await.unwrap_err();
    assert!(!e.is_apply_conflict() && !e.is_transient(), "{e}");
    assert!(e.to_string().contains("public.acct"), "{e}");
    b.rollback().await.unwrap();

    // A lost connection is transient, not a conflict, and its message has no password.
    b.begin().await.unwrap();
    dst.exec(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
           AND application_name = 'sluice'",
    )
    .await;
    b.apply(&row(7, "seven")).await.unwrap();
    b.record(&position(6)).await.unwrap();
    let e = b.send().await.unwrap_err();
    assert!(e.is_transient() && !e.is_apply_conflict(), "{e}");
    assert_eq!(e.kind(), sluice_core::ErrorKind::Destination, "{e}");
}

#[tokio::test]
async fn barriers_applied_twice_give_the_same_result() {
    let (src, ds, dst, target) = accounts().await;
    let acct = &ds[0];
    let table = acct.object.clone().unwrap();
    let mut s = target.session("b", 0).await.unwrap();
    let ins = unit_table(
        acct,
        &["id"],
        acct_fields(),
        acct_rows(&[(1, "one", Some("n"), Some(1))]),
        &["insert"],
        &[],
    );
    apply_commit(&mut s, &unit(vec![ins]), 1).await;

    // The source gains a column, loses one, retypes one; the barrier brings the target along.
    src.exec("ALTER TABLE acct ADD COLUMN extra numeric(8,2), DROP COLUMN note, ALTER COLUMN n TYPE bigint")
        .await;
    let now = discover(&src.url, &["public.acct"]).await;
    let barrier = Barrier::Columns {
        table: table.clone(),
        before: SourceColumn::of(&acct.columns),
        columns: now[0].columns.clone(),
        source_engine: sluice_core::apply::Engine::Postgres,
    };
    let columns = "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute \
                   WHERE attrelid = 'acct'::regclass AND attnum > 0 AND NOT attisdropped";
    let mut after = Vec::new();
    for round in 0..2u64 {
        s.begin().await.unwrap();
        assert!(!s.barrier(&barrier, &position(1)).await.unwrap());
        s.record(&position(2 + round)).await.unwrap();
        s.commit().await.unwrap();
        after.push(dst.row_strings(columns).await);
    }
    assert_eq!(
        after[0],
        ["extra|numeric(8,2)", "id|integer", "name|text", "n|bigint"]
    );
    assert_eq!(after[0], after[1]);
    assert_eq!(dst.row_strings("SELECT * FROM acct").await, ["1|one|1|∅"]);

    let truncate = Barrier::Truncate(vec![table.clone()]);
    for round in 0..2u64 {
        s.begin().await.unwrap();
        assert!(!s.barrier(&truncate, &position(3)).await.unwrap());
        s.record(&position(4 + round)).await.unwrap();
        s.commit().await.unwrap();
        assert_eq!(dst.row_strings("SELECT count(*) FROM acct").await, ["0"]);
    }
    assert_eq!(target.applied("b").await.unwrap(), Some(position(5)));
    // The initial load's truncate, for an interrupted load.
    dst.exec("INSERT INTO bag VALUES (1, 'x')").await;
    target
        .truncate(&[ds[1].object.clone().unwrap()])
        .await
        .unwrap();
    assert_eq!(dst.row_strings("SELECT count(*) FROM bag").await, ["0"]);
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
    target.prepare().await.unwrap();
    let notes = target
        .create_tables(std::slice::from_ref(&t))
        .await
        .unwrap();
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

/// Bookkeeping an earlier release created (no `skip` column, no `sluice.columns`) is brought up
/// to date by the next run, its rows kept: a replication continues across the upgrade.
#[tokio::test]
async fn bookkeeping_of_an_earlier_release_is_brought_up_to_date() {
    let dst = TestDb::new().await;
    dst.exec(
        "CREATE SCHEMA sluice;
         CREATE TABLE sluice.applied (name text NOT NULL, worker integer NOT NULL,
           unit bigint NOT NULL, restart text NOT NULL, pos text NOT NULL, commit_ts bigint,
           updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (name, worker));
         CREATE TABLE sluice.state (name text PRIMARY KEY, state bytea NOT NULL,
           updated_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO sluice.applied (name, worker, unit, restart, pos)
           VALUES ('r', 0, 4, '0000000000000010', '000000000000000F');",
    )
    .await;
    let target = PgApplyTarget::new(&dst.url).unwrap();
    target.prepare().await.unwrap();
    let applied = target.applied("r").await.unwrap().unwrap();
    assert_eq!((applied.unit, applied.skip), (4, 0));
    assert!(target.followed_columns("r").await.unwrap().is_empty());
    let followed = vec![(
        TableRef::new("public", "t"),
        vec![SourceColumn {
            name: "id".into(),
            source_type: "integer".into(),
        }],
    )];
    target.save_columns("r", &followed).await.unwrap();
    assert_eq!(target.followed_columns("r").await.unwrap(), followed);
}
