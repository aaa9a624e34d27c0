//! Change tables, units and a planner run for the dialects' SQL-text tests: each adapter's
//! `apply/tests.rs` and the planner's own tests build the same small table `d.t (id, v)` and
//! read what a unit becomes, so the fixture lives here once, beside [`Recorder`].
//!
//! Not for production paths: the values are whatever a test asks for, and the rows carry a
//! placeholder position (`p`).

use super::{ApplyDialect, Planner, Recorder};
use crate::apply::{ApplyUnit, Engine, UnitTable};
use crate::change::change_schema;
use crate::columns::field;
use crate::table::{ColumnDesc, TableRef};
use crate::{Error, Result};
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
