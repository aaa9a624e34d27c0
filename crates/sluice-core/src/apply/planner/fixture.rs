//! Change tables, units and a planner run for the dialects' SQL-text tests: each adapter's
//! `apply/tests.rs` and the planner's own tests build the same small table `d.t (id, v)` and
//! read what a unit becomes, so the fixture lives here once, beside [`Recorder`].
//!
//! Not for production paths: the values are whatever a test asks for, and the rows carry a
//! placeholder position (`p`).

use super::{ApplyDialect, Planner, Recorder};
use crate::apply::{AppliedPosition, ApplyUnit, Engine, SourceColumn, UnitTable};
use crate::change::change_schema;
use crate::columns::field;
use crate::table::{ColumnDesc, TableRef};
use crate::{Error, Result, StreamPos};
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{
    ArrayRef, Int32Array, RecordBatch, StringArray, TimestampMicrosecondArray, UInt64Array,
};
use arrow_schema::{DataType, Field};
use std::sync::Arc;

/// One row of `d.t`: operation (`insert`, `update`, `delete`), id, v, absent columns.
pub type Row<'a> = (&'a str, Option<i32>, Option<&'a str>, &'a [&'a str]);

/// Table `d.t (id integer, v)` keyed by `key` (empty: keyless), its column `v` described by
/// `v_type` (the source type text) and `v` (its Arrow field: text, or text with an extension
/// type such as JSON), rows from `engine`, one change per [`Row`].
pub fn table(
    key: &[&str],
    v_type: &str,
    v: Field,
    engine: Engine,
    rows: &[Row<'_>],
) -> Result<UnitTable> {
    let t = TableRef {
        schema: "d".into(),
        name: "t".into(),
    };
    let cols: Vec<ColumnDesc> = [("integer", field("id", DataType::Int32)), (v_type, v)]
        .into_iter()
        .map(|(ty, f)| ColumnDesc {
            name: f.name().clone(),
            source_type: ty.into(),
            field: f,
            cast: None,
            as_text_fallback: false,
        })
        .collect();
    let n = rows.len();
    let mut absent = ListBuilder::new(StringBuilder::new());
    for r in rows {
        for a in r.3 {
            absent.values().append_value(a);
        }
        absent.append(true);
    }
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(vec!["p"; n])),
        Arc::new(UInt64Array::from((0..n as u64).collect::<Vec<_>>())),
        Arc::new(TimestampMicrosecondArray::from(vec![None; n]).with_timezone("UTC")),
        Arc::new(StringArray::from(vec![None::<&str>; n])),
        Arc::new(absent.finish()),
    ];
    let batch = RecordBatch::try_new(change_schema(&t, &cols)?, arrays)
        .map_err(|e| Error::internal(format!("a test table cannot be built: {e}")))?;
    Ok(UnitTable {
        table: t,
        columns: Arc::new(cols),
        key: Arc::new(key.iter().map(|k| k.to_string()).collect()),
        batch,
        source_engine: engine,
        sole_key: false,
    })
}

/// A unit of `t`'s rows in order, in `batches` (end offsets, as in [`ApplyUnit::batches`];
/// empty: a row each).
pub fn unit(t: UnitTable, batches: &[u32]) -> ApplyUnit {
    let n = t.batch.num_rows() as u32;
    ApplyUnit {
        tables: vec![t],
        order: (0..n).map(|r| (0, r)).collect(),
        batches: batches.to_vec(),
    }
}

/// What `unit` becomes in one transaction on `dialect`: each buffer sent, in order.
pub async fn sent<D: ApplyDialect>(dialect: D, unit: &ApplyUnit) -> Result<Vec<String>> {
    let mut plan = Planner::new(dialect, "r", 2);
    let mut link = Recorder::default();
    plan.begin();
    plan.apply(unit, &mut link).await?;
    plan.commit(&mut link).await?;
    Ok(link.sent)
}

/// What `unit` becomes on `dialect` when it is one round trip: the statements between the
/// dialect's `BEGIN` and `COMMIT` (an error when it took more than one, or is not one
/// transaction).
pub async fn script<D: ApplyDialect>(dialect: D, unit: &ApplyUnit) -> Result<String> {
    let sent = sent(dialect, unit).await?;
    let [one] = &sent[..] else {
        return Err(Error::internal(format!(
            "{} round trips, not one",
            sent.len()
        )));
    };
    one.strip_prefix(D::BEGIN)
        .and_then(|s| s.strip_prefix(D::END))
        .and_then(|s| s.strip_suffix(D::COMMIT))
        .map(str::to_string)
        .ok_or_else(|| Error::internal(format!("not one transaction: {one}")))
}

/// The position of unit 7 a bookkeeping test records: `restart` and `pos` as an adapter
/// writes them, one change to skip.
pub fn position(restart: &str, pos: &str, commit_ts: Option<i64>) -> AppliedPosition {
    AppliedPosition {
        unit: 7,
        restart: StreamPos::from_adapter(restart),
        pos: StreamPos::from_adapter(pos),
        commit_ts,
        skip: 1,
    }
}

/// Rows every dialect's SQL-text suite writes out, each in its own text, and what the text
/// must show.
pub struct Scenario {
    /// The key of `d.t` (empty: none).
    pub key: &'static [&'static str],
    /// The changes to `d.t`, one row each.
    pub rows: &'static [Row<'static>],
    /// The unit's batches (as [`ApplyUnit::batches`]).
    pub batches: &'static [u32],
    /// What the statements must show (the assertion's message).
    pub why: &'static str,
}

/// Inserts of one column set, an update of absent columns only, an update of a value that
/// needs quoting, an insert of fewer columns and a delete.
pub const A_UNIT: Scenario = Scenario {
    key: &["id"],
    batches: &[],
    rows: &[
        ("insert", Some(1), Some("a"), &[]),
        ("insert", Some(2), None, &[]),
        ("update", Some(1), None, &["v"]),
        ("update", Some(2), Some("it's"), &[]),
        ("insert", Some(3), None, &["v"]),
        ("delete", Some(1), None, &["v"]),
    ],
    why: "consecutive inserts with the same columns share a statement; an update of absent \
          columns only has nothing to set",
};

/// A table without a key: a delete, an update of both columns, an update whose `id` is
/// absent.
pub const KEYLESS: Scenario = Scenario {
    key: &[],
    batches: &[],
    rows: &[
        ("delete", Some(1), None, &[]),
        ("update", Some(2), Some("b"), &[]),
        ("update", Some(3), Some("c"), &["id"]),
    ],
    why: "every carried column is matched, one row at most; an absent column is neither set \
          nor matched",
};

/// Batched as `[3, 5, 8]`: three updates (one carrying only its key), two deletes, inserts
/// of two column sets.
pub const A_BATCH: Scenario = Scenario {
    key: &["id"],
    batches: &[3, 5, 8],
    rows: &[
        ("update", Some(1), Some("a"), &[]),
        ("update", Some(2), None, &["v"]),
        ("update", Some(3), None, &[]),
        ("delete", Some(4), None, &[]),
        ("delete", Some(5), None, &[]),
        ("insert", Some(6), Some("f"), &[]),
        ("insert", Some(7), None, &["v"]),
        ("insert", Some(8), Some("h"), &[]),
    ],
    why: "grouped by the columns carried; an update carrying only its key sets nothing",
};

impl Scenario {
    /// Panics unless the scenario's rows, in a table `table` builds from the key and the
    /// rows, become `expected` between `BEGIN` and `COMMIT` on `dialect` in one round trip.
    pub async fn check<D: ApplyDialect>(
        &self,
        dialect: D,
        table: fn(&[&str], &[Row<'_>]) -> UnitTable,
        expected: &str,
    ) {
        let unit = unit(table(self.key, self.rows), self.batches);
        match script(dialect, &unit).await {
            Ok(script) => assert_eq!(script, expected, "{}", self.why),
            Err(e) => panic!("{e}"),
        }
    }
}

/// Two inserts that carry no column.
pub const EMPTY_INSERTS: &[Row<'static>] = &[
    ("insert", None, None, &["id", "v"]),
    ("insert", None, None, &["id", "v"]),
];

/// Four inserts of `v` each: a unit past the flush bound when `v` is a third of it.
pub fn inserts_of(v: &str) -> Vec<Row<'_>> {
    (0..4)
        .map(|i| ("insert", Some(i), Some(v), &[][..]))
        .collect()
}

/// The bookkeeping of a unit on `dialect` as replication `name`, worker 2: its `position`
/// and the source columns of `d.t` (`id` of `source_type`), committed. What was sent, and the
/// columns' JSON.
pub async fn bookkeeping<D: ApplyDialect>(
    dialect: D,
    name: &str,
    position: &AppliedPosition,
    source_type: &str,
) -> Result<(Vec<String>, String)> {
    let mut plan = Planner::new(dialect, name, 2);
    let mut link = Recorder::default();
    plan.begin();
    plan.record(position);
    let columns = [SourceColumn {
        name: "id".into(),
        source_type: source_type.into(),
    }];
    let json = SourceColumn::list_json(&columns);
    plan.followed(&TableRef::new("d", "t"), &json);
    plan.commit(&mut link).await?;
    Ok((link.sent, json))
}
