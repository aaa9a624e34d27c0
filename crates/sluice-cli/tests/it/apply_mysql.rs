#![allow(clippy::unwrap_used)]
//! MariaDB as a replication target (`sluice_mysql::MyApplyTarget`), through the library: tables
//! created from a source table's description and keys, the initial load's bulk path checked
//! value by value against the source for every type, PostgreSQL's types in their mapped
//! types, and the privilege errors with their `GRANT`. What every apply target passes (units
//! in order with their position, a unit past the send buffer, conflicts, barriers applied
//! twice, an earlier release's bookkeeping) is `apply_suite`'s MariaDB rows.

use crate::common::{export, files, tempdir};
use crate::mysql_types;
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray, UInt64Array};
use mysql_async::prelude::Queryable;
use sluice_core::apply::{
    ApplyTarget, ApplyUnit, Barrier, SourceColumn, TableKeys, TargetTable, UnitTable,
};
use sluice_core::change::{ChangeSource, change_schema};
use sluice_core::table::{ColumnDesc, TableRef};
use sluice_mysql::MyApplyTarget;
use sluice_mysql::replication::MyCapture;
use sluice_testkit::apply::{create, describe_mysql as describe, holds_rows, position};
use sluice_testkit::mysql::TestDb;
use std::sync::Arc;

fn table(schema: &str, name: &str) -> TableRef {
    TableRef {
        schema: schema.into(),
        name: name.into(),
    }
}

/// The source table `name` of `db` described, with its keys read through the change source,
/// as a target table named `into.name`.
async fn target_table(db: &TestDb, name: &str, into: &str) -> TargetTable {
    let d = describe(&db.url, &db.name, name).await;
    let keys = MyCapture::new(&db.url, None)
        .unwrap()
        .table_keys(std::slice::from_ref(&d))
        .await
        .unwrap()
        .remove(0);
    TargetTable {
        table: table(into, name),
        columns: d.columns,
        keys: TableKeys {
            table: table(into, name),
            ..keys
        },
        source_engine: sluice_core::apply::Engine::Mysql,
    }
}

#[tokio::test]
async fn every_type_loads_and_equals_the_source() {
    let (mut db, cols) = mysql_types::setup().await;
    let into = format!("{}_target", db.name);
    let t = target_table(&db, "all_types", &into).await;
    assert_eq!(t.keys.primary, ["id"]);

    let target = MyApplyTarget::new(&db.url).unwrap();
    let notes = create(&target, std::slice::from_ref(&t)).await;
    assert!(
        notes.iter().any(|n| n.contains("defaults")),
        "what is not carried is said: {notes:?}"
    );
    assert!(!holds_rows(&target, &t.table).await);

    // The export's batches, as the initial load receives them.
    let out = tempdir();
    export(&db.url, &out.path().join("pq"), &["--table", "all_types"]).ok();
    let batches = files::dataset_batches(&out.path().join(format!("pq/{}.all_types", db.name)));
    let mut loader = target.loader().await.unwrap();
    for b in &batches {
        loader.load(&t.table, b).await.unwrap();
    }
    assert!(holds_rows(&target, &t.table).await);

    // Value by value, through MariaDB's own rendering of both tables (zero dates arrive as
    // NULL, geometry without its SRID: the oracle reads both that way).
    let want = mysql_types::oracle_of(&mut db.conn, "all_types", &cols).await;
    let got = mysql_types::oracle_of(&mut db.conn, &format!("`{into}`.all_types"), &cols).await;
    assert_eq!(got.len(), 6);
    for (row, (g, w)) in got.iter().zip(&want).enumerate() {
        for (ci, c) in cols.iter().enumerate() {
            assert_eq!(g[ci], w[ci], "row {} column {}", row + 1, c.name);
        }
    }
    // Batches: rows 1–3 set to rows 2–4's values (ids kept) by one UPDATE … CASE, rows 5 and
    // 6 deleted by one DELETE … IN, every type rendered as a literal of the batch statements.
    let all = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
    let mut next3 = all.slice(1, 3).columns().to_vec();
    next3[0] = arrow_cast::cast(
        &(Arc::new(arrow_array::Int64Array::from(vec![1, 2, 3])) as ArrayRef),
        next3[0].data_type(),
    )
    .unwrap();
    let batched = ApplyUnit {
        tables: vec![
            exported(&t, next3, "update"),
            exported(&t, all.slice(4, 2).columns().to_vec(), "delete"),
        ],
        order: vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)],
        batches: vec![3, 5],
    };
    let mut s = target.session("every_type", 0).await.unwrap();
    s.begin().await.unwrap();
    s.apply(&batched).await.unwrap();
    s.record(&position(1)).await.unwrap();
    s.commit().await.unwrap();
    let got = mysql_types::oracle_of(&mut db.conn, &format!("`{into}`.all_types"), &cols).await;
    assert_eq!(got.len(), 4, "rows 5 and 6 deleted");
    for (row, g) in got.iter().take(3).enumerate() {
        for (ci, c) in cols.iter().enumerate().skip(1) {
            assert_eq!(
                g[ci],
                want[row + 1][ci],
                "row {} column {}",
                row + 1,
                c.name
            );
        }
    }
    assert_eq!(got[3], want[3], "row 4 untouched");

    // Same engine: the source's own column types.
    let types = |schema: String| {
        format!(
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = '{schema}' AND TABLE_NAME = 'all_types' ORDER BY ORDINAL_POSITION"
        )
    };
    let src = db.row_strings(&types(db.name.clone())).await;
    let dst = db.row_strings(&types(into.clone())).await;
    assert_eq!(src, dst);

    // Existing tables are checked, not recreated.
    assert!(
        target
            .create_tables(std::slice::from_ref(&t))
            .await
            .unwrap()
            .is_empty()
    );
    db.exec(&format!(
        "ALTER TABLE `{into}`.all_types DROP COLUMN c_json"
    ))
    .await;
    let e = target
        .create_tables(std::slice::from_ref(&t))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("c_json"), "{e}");
}

/// Exported `columns` of `t` as changes `op`, keyed by `id`.
fn exported(t: &TargetTable, mut columns: Vec<ArrayRef>, op: &'static str) -> UnitTable {
    let n = columns[0].len();
    let mut absent = ListBuilder::new(StringBuilder::new());
    for _ in 0..n {
        absent.append(true);
    }
    columns.extend([
        Arc::new(StringArray::from(vec![op; n])) as ArrayRef,
        Arc::new(StringArray::from(vec!["0000000000000001"; n])),
        Arc::new(UInt64Array::from((0..n as u64).collect::<Vec<_>>())),
        Arc::new(
            TimestampMicrosecondArray::from(vec![Some(1_700_000_000_000_000i64); n])
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from(vec![Some("x"); n])),
        Arc::new(absent.finish()),
    ]);
    UnitTable {
        table: t.table.clone(),
        columns: Arc::new(t.columns.clone()),
        key: Arc::new(vec!["id".into()]),
        batch: RecordBatch::try_new(change_schema(&t.table, &t.columns).unwrap(), columns).unwrap(),
        source_engine: sluice_core::apply::Engine::Mysql,
        sole_key: false,
    }
}

/// Source tables `acct` (keyed, a unique name) and `log` (no key), created on the target in
/// another database.
async fn accounts() -> (TestDb, String, MyApplyTarget, TargetTable, TargetTable) {
    let mut db = TestDb::new().await;
    db.exec(
        "CREATE TABLE acct (id int PRIMARY KEY, name varchar(20) NOT NULL UNIQUE, \
         balance decimal(12,2), note text); CREATE TABLE log (a int, b varchar(10))",
    )
    .await;
    let into = format!("{}_target", db.name);
    let acct = target_table(&db, "acct", &into).await;
    let log = target_table(&db, "log", &into).await;
    let target = MyApplyTarget::new(&db.url).unwrap();
    target.prepare().await.unwrap();
    target
        .create_tables(&[acct.clone(), log.clone()])
        .await
        .unwrap();
    (db, into, target, acct, log)
}

#[tokio::test]
async fn keys_of_the_source_are_read_whole() {
    let mut db = TestDb::new().await;
    db.exec(
        "CREATE TABLE parent (a int, b varchar(5), code int NOT NULL, PRIMARY KEY (a, b), \
         UNIQUE KEY u_code (code)); \
         CREATE TABLE child (id int PRIMARY KEY, pa int, pb varchar(5), x int, y int, \
         UNIQUE KEY u_xy (x, y), CONSTRAINT fk_p FOREIGN KEY (pa, pb) REFERENCES parent (a, b))",
    )
    .await;
    let d = describe(&db.url, &db.name, "child").await;
    let keys = MyCapture::new(&db.url, None)
        .unwrap()
        .table_keys(&[d])
        .await
        .unwrap();
    assert_eq!(keys.len(), 1);
    let k = &keys[0];
    assert_eq!(k.primary, ["id"]);
    assert_eq!(k.unique, [vec!["x".to_string(), "y".to_string()]]);
    assert_eq!(k.foreign.len(), 1);
    assert_eq!(k.foreign[0].columns, ["pa", "pb"]);
    assert_eq!(k.foreign[0].parent, table(&db.name, "parent"));
    assert_eq!(k.foreign[0].parent_columns, ["a", "b"]);
}

#[tokio::test]
async fn missing_privileges_fail_with_the_grant_that_fixes_them() {
    let (mut db, into, admin, acct, _) = accounts().await;
    let user = format!("u{}", &db.name[2..12]);
    db.exec(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY 'pw-secret'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON `{into}`.* TO '{user}'@'%'; \
         GRANT SELECT ON `{}`.* TO '{user}'@'%'",
        db.name
    ))
    .await;
    let _ = admin;
    let target = MyApplyTarget::new(&db.url_as(&user, "pw-secret")).unwrap();
    // No rights on the bookkeeping.
    let e = target.prepare().await.unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `sluice`.* TO '{user}'@'%'"
        )),
        "{msg}"
    );
    assert!(!msg.contains("pw-secret"), "{msg}");
    db.exec(&format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON `sluice`.* TO '{user}'@'%'"
    ))
    .await;
    target.prepare().await.unwrap();

    // No CREATE where a table must be created.
    let mut other = acct.clone();
    other.table = table(&into, "acct2");
    other.keys.table = other.table.clone();
    let e = target.create_tables(&[other]).await.unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("GRANT CREATE, SELECT, INSERT, UPDATE, DELETE, DROP, ALTER ON `{into}`.* TO '{user}'@'%'")),
        "{msg}"
    );
    assert!(!e.is_transient(), "{msg}");
    db.exec(&format!("DROP USER '{user}'@'%'")).await;
    let _ = db.conn.query_drop("SELECT 1").await;
}

fn pg_column(name: &str, source_type: &str, field: arrow_schema::Field) -> ColumnDesc {
    ColumnDesc {
        name: name.into(),
        source_type: source_type.into(),
        field,
        cast: None,
        as_text_fallback: false,
    }
}

fn ext(field: arrow_schema::Field, name: &str) -> arrow_schema::Field {
    field.with_metadata(
        [("ARROW:extension:name".to_string(), name.to_string())]
            .into_iter()
            .collect::<std::collections::HashMap<String, String>>(),
    )
}

#[tokio::test]
async fn postgres_types_land_in_their_mapped_types() {
    use arrow_array::builder::{Int32Builder, ListBuilder as LB};
    use arrow_array::{
        BinaryArray, BooleanArray, Decimal128Array, FixedSizeBinaryArray, Float64Array, Int32Array,
        Int64Array, StructArray, Time64MicrosecondArray,
    };
    use arrow_schema::{DataType as D, Field, Fields, TimeUnit};
    let mut db = TestDb::new().await;
    let into = format!("{}_target", db.name);
    let interval = Fields::from(vec![
        Field::new("months", D::Int32, false),
        Field::new("days", D::Int32, false),
        Field::new("microseconds", D::Int64, false),
    ]);
    let columns = vec![
        pg_column("id", "integer", Field::new("id", D::Int32, false)),
        pg_column(
            "code",
            "character varying(40)",
            Field::new("code", D::Utf8, false),
        ),
        pg_column(
            "u",
            "uuid",
            ext(Field::new("u", D::FixedSizeBinary(16), true), "arrow.uuid"),
        ),
        pg_column(
            "iv",
            "interval",
            ext(
                Field::new("iv", D::Struct(interval.clone()), true),
                "sluice.interval",
            ),
        ),
        pg_column(
            "arr",
            "integer[]",
            Field::new(
                "arr",
                D::List(Arc::new(Field::new("item", D::Int32, true))),
                true,
            ),
        ),
        pg_column(
            "t",
            "time without time zone",
            Field::new("t", D::Time64(TimeUnit::Microsecond), true),
        ),
        pg_column(
            "ts",
            "timestamp with time zone",
            Field::new(
                "ts",
                D::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ),
        pg_column(
            "j",
            "jsonb",
            ext(Field::new("j", D::Utf8, true), "arrow.json"),
        ),
        pg_column("b", "boolean", Field::new("b", D::Boolean, true)),
        pg_column(
            "n",
            "numeric(10,2)",
            Field::new("n", D::Decimal128(10, 2), true),
        ),
        pg_column("f", "double precision", Field::new("f", D::Float64, true)),
        pg_column("by", "bytea", Field::new("by", D::Binary, true)),
        pg_column("body", "text", Field::new("body", D::Utf8, true)),
    ];
    let t = TargetTable {
        table: table(&into, "pg"),
        columns: columns.clone(),
        keys: TableKeys {
            table: table(&into, "pg"),
            primary: vec!["id".into()],
            unique: vec![vec!["code".into()]],
            foreign: vec![],
            match_by: vec![],
            generated: vec![],
        },
        source_engine: sluice_core::apply::Engine::Postgres,
    };
    let target = MyApplyTarget::new(&db.url).unwrap();
    let notes = create(&target, std::slice::from_ref(&t)).await;
    for n in ["char(36)", "varchar(64)", "json"] {
        assert!(notes.iter().any(|x| x.contains(n)), "{n}: {notes:?}");
    }
    let types = db
        .row_strings(&format!(
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = '{into}' AND TABLE_NAME = 'pg'"
        ))
        .await;
    for want in [
        "code|varchar(40)",
        "u|char(36)",
        "iv|varchar(64)",
        "t|time(6)",
        "ts|datetime(6)",
        "n|decimal(10,2)",
        "by|longblob",
        "body|longtext",
    ] {
        assert!(types.iter().any(|t| t == want), "{want}: {types:?}");
    }

    let mut arr = LB::new(Int32Builder::new());
    arr.values().append_value(1);
    arr.values().append_null();
    arr.append(true);
    arr.append(false);
    let iv = StructArray::new(
        interval,
        vec![
            Arc::new(Int32Array::from(vec![14, 0])),
            Arc::new(Int32Array::from(vec![3, 0])),
            Arc::new(Int64Array::from(vec![4_500_000, 0])),
        ],
        Some(vec![true, false].into()),
    );
    let schema = Arc::new(arrow_schema::Schema::new(
        columns.iter().map(|c| c.field.clone()).collect::<Vec<_>>(),
    ));
    let uuid: [u8; 16] = *b"\x12\x34\x56\x78\x9a\xbc\xde\xf0\x01\x23\x45\x67\x89\xab\xcd\xef";
    let batch = |f: f64| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int32Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["a'b", "ü"])),
                Arc::new(
                    FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                        vec![Some(uuid), None].into_iter(),
                        16,
                    )
                    .unwrap(),
                ),
                Arc::new(iv.clone()),
                Arc::new(arr.finish_cloned()),
                Arc::new(Time64MicrosecondArray::from(vec![
                    Some(45_296_000_001),
                    None,
                ])),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![Some(-1_000_000), None])
                        .with_timezone("UTC"),
                ),
                Arc::new(StringArray::from(vec![Some("{\"k\": [1, \"😀\"]}"), None])),
                Arc::new(BooleanArray::from(vec![Some(true), None])),
                Arc::new(
                    Decimal128Array::from(vec![Some(-12345), None])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
                Arc::new(Float64Array::from(vec![Some(f), None])),
                Arc::new(BinaryArray::from(vec![Some(&b"\x00\xff"[..]), None])),
                Arc::new(StringArray::from(vec![Some("t"), None])),
            ],
        )
        .unwrap()
    };
    let mut loader = target.loader().await.unwrap();
    // NaN has no MySQL value: the batch fails naming the column, and nothing of it stays.
    let e = loader.load(&t.table, &batch(f64::NAN)).await.unwrap_err();
    assert!(e.to_string().contains("\"f\""), "{e}");
    assert!(!holds_rows(&target, &t.table).await);
    loader.load(&t.table, &batch(0.25)).await.unwrap();
    let got = db
        .row_strings(&format!(
            "SELECT id, code, u, iv, arr, t, ts, j, b, n, f, HEX(`by`), body \
             FROM `{into}`.pg"
        ))
        .await;
    assert_eq!(
        got,
        [
            "1|a'b|12345678-9abc-def0-0123-456789abcdef|P14M3DT4.500000S|[1,null]|12:34:56.000001|\
             1969-12-31 23:59:59.000000|{\"k\": [1, \"😀\"]}|1|-123.45|0.25|00FF|t",
            "2|ü|∅|∅|∅|∅|∅|∅|∅|∅|∅|∅|∅"
        ]
    );

    // A column added on the source: the barrier adds it and leaves the mapped types alone,
    // the second time too.
    let shape = format!(
        "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = '{into}' AND TABLE_NAME = 'pg' ORDER BY ORDINAL_POSITION"
    );
    let before = db.row_strings(&shape).await;
    let mut wider = columns.clone();
    wider.push(pg_column(
        "extra",
        "bigint",
        Field::new("extra", D::Int64, true),
    ));
    let name = format!("r_{}", db.name);
    let mut s = target.session(&name, 0).await.unwrap();
    for _ in 0..2 {
        s.begin().await.unwrap();
        s.barrier(
            &Barrier::Columns(sluice_core::apply::ColumnChange {
                table: t.table.clone(),
                before: SourceColumn::of(&columns),
                columns: wider.clone(),
                source_engine: sluice_core::apply::Engine::Postgres,
            }),
            &position(0),
        )
        .await
        .unwrap();
        s.record(&position(1)).await.unwrap();
        s.commit().await.unwrap();
        let mut want = before.clone();
        want.push("extra|bigint(20)|YES".into());
        want.sort();
        assert_eq!(db.row_strings(&shape).await, want);
    }
    target.clear_state(&name).await.unwrap();
}
