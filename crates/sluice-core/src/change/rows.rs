//! The Arrow builders a change source appends each changed row into ([`ChangeRows`]): the
//! table's columns, the change columns and, with before-images, the old row as one struct
//! column ([`super::BEFORE`]).

use super::{BEFORE, ChangeOp, TxMeta};
use crate::columns::{BatchBuilder, ColumnBuilder};
use crate::error::{Error, Result};
use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, RecordBatch, StructArray};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer};
use arrow_schema::{DataType, Fields, Schema, SchemaRef};
use std::sync::Arc;

/// The rows of one table (one schema version) waiting to be written: Arrow builders for the
/// table's columns and the change columns, recycled between batches.
#[derive(Debug)]
pub struct ChangeRows {
    /// The whole schema, `_before` included.
    schema: SchemaRef,
    builder: BatchBuilder,
    table_columns: usize,
    fixed_row_bytes: usize,
    before: Option<Before>,
    /// The table columns kept in the batches ([`Self::project`]); `None`: all.
    keep: Option<Vec<bool>>,
}

/// The builders of the before-image struct: one per table column, and whether each change has
/// an old row (its validity).
#[derive(Debug)]
struct Before {
    fields: Fields,
    builder: BatchBuilder,
    valid: BooleanBufferBuilder,
    /// The current change's old row was appended ([`ChangeRows::before`]).
    set: bool,
}

impl ChangeRows {
    /// Builders for `schema` (a [`super::change_schema`], or one with
    /// [`super::with_before_images`]) whose first `table_columns` fields are the table's.
    pub fn new(schema: SchemaRef, table_columns: usize) -> Result<Self> {
        let (main, before) = match schema.fields().last() {
            Some(f) if f.name() == BEFORE => {
                let DataType::Struct(fields) = f.data_type() else {
                    return Err(Error::internal("the _before column is not a struct"));
                };
                let main = Schema::new(schema.fields()[..schema.fields().len() - 1].to_vec())
                    .with_metadata(schema.metadata().clone());
                let before = Before {
                    fields: fields.clone(),
                    builder: BatchBuilder::new(Arc::new(Schema::new(fields.clone())), 256)?,
                    valid: BooleanBufferBuilder::new(256),
                    set: false,
                };
                (Arc::new(main), Some(before))
            }
            _ => (schema.clone(), None),
        };
        let width = |f: &arrow_schema::FieldRef| f.data_type().primitive_width().unwrap_or(8);
        let fixed_row_bytes = main.fields().iter().map(width).sum::<usize>()
            + before
                .as_ref()
                .map_or(0, |b| b.fields.iter().map(width).sum::<usize>() + 1);
        Ok(ChangeRows {
            schema,
            builder: BatchBuilder::new(main, 256)?,
            table_columns,
            fixed_row_bytes,
            before,
            keep: None,
        })
    }

    /// Keep only the table columns whose `keep` is true in the batches (`--columns`): the
    /// adapter still appends every column, the others are dropped when a batch is built, from
    /// `_absent` and from `_before` too.
    pub fn project(&mut self, keep: Vec<bool>) -> Result<()> {
        if keep.len() != self.table_columns {
            return Err(Error::internal("a projection of another width"));
        }
        let fields = self.schema.fields();
        let mut out: Vec<arrow_schema::FieldRef> = fields[..self.table_columns]
            .iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(f, _)| f.clone())
            .collect();
        for f in &fields[self.table_columns..] {
            match f.data_type() {
                DataType::Struct(inner) if f.name() == BEFORE => {
                    let inner: Fields = inner
                        .iter()
                        .zip(&keep)
                        .filter(|(_, k)| **k)
                        .map(|(f, _)| f.clone())
                        .collect();
                    out.push(Arc::new(
                        f.as_ref().clone().with_data_type(DataType::Struct(inner)),
                    ));
                }
                _ => out.push(f.clone()),
            }
        }
        self.schema = Arc::new(Schema::new(out).with_metadata(self.schema.metadata().clone()));
        if let Some(b) = self.before.as_mut()
            && let Some(DataType::Struct(inner)) =
                self.schema.fields().last().map(|f| f.data_type().clone())
        {
            b.fields = inner;
        }
        self.keep = Some(keep);
        Ok(())
    }

    /// How many table columns the adapter appends per change (kept or not).
    pub fn width(&self) -> usize {
        self.table_columns
    }

    /// The table columns kept ([`Self::project`]; `None`: all).
    pub fn projection(&self) -> Option<&[bool]> {
        self.keep.as_deref()
    }

    /// Whether table column `index` reaches the batches: an adapter appends a NULL for a
    /// column left out instead of decoding its value (nor is a bad value there reported).
    pub fn kept(&self, index: usize) -> bool {
        self.keep.as_ref().is_none_or(|k| k[index])
    }

    /// The name of table column `index` as the adapter appends it (kept or not), for
    /// messages. ([`Self::schema`] is the projected one.)
    pub fn column_name(&self, index: usize) -> &str {
        self.builder.schema().field(index).name()
    }

    /// The schema the rows are built with.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The table's column builders, in schema order: the adapter appends one value (or NULL)
    /// to each for every change, then names the absent ones with [`Self::absent`].
    pub fn columns(&mut self) -> &mut [ColumnBuilder] {
        let n = self.table_columns;
        &mut self.builder.columns()[..n]
    }

    /// True when the rows carry before-images (`--before-images`).
    pub fn before_images(&self) -> bool {
        self.before.is_some()
    }

    /// The builders of the current change's old row when the stream writes before-images
    /// (`None` when it does not): calling it says the change has one, and the adapter then
    /// appends one value (or NULL) to each. A change that does not call it (an insert, a
    /// truncate) gets a NULL `_before`.
    pub fn before(&mut self) -> Option<&mut [ColumnBuilder]> {
        let b = self.before.as_mut()?;
        b.set = true;
        Some(b.builder.columns())
    }

    /// Record that column `index` of the current change is absent (its cell must be NULL).
    pub fn absent(&mut self, index: usize) -> Result<()> {
        if self.keep.as_ref().is_some_and(|k| !k[index]) {
            return Ok(());
        }
        let name = self.builder.schema().field(index).name().clone();
        let at = self.table_columns + 5;
        let items = self.builder.columns()[at]
            .list_items()
            .ok_or_else(|| Error::internal("the _absent column is not a list"))?;
        items.push_bytes(name.as_bytes())
    }

    /// Finish the current change: its table columns and absent names are appended; this adds
    /// the change columns (and a NULL old row where none was appended).
    pub fn finish_row(&mut self, op: ChangeOp, tx: &TxMeta, seq: u64) -> Result<()> {
        let n = self.table_columns;
        let cols = &mut self.builder.columns()[n..];
        cols[0].push_bytes(op.as_str().as_bytes())?;
        cols[1].push_bytes(tx.pos.as_str().as_bytes())?;
        cols[2].push_u64(seq)?;
        match tx.commit_ts {
            Some(t) => cols[3].push_i64(t)?,
            None => cols[3].push_null(),
        }
        cols[4].push_bytes(tx.xid.as_bytes())?;
        cols[5].push_list_end()?;
        self.builder.row_done();
        if let Some(b) = self.before.as_mut() {
            if !b.set {
                for c in b.builder.columns() {
                    c.push_null();
                }
            }
            b.valid.append(b.set);
            b.builder.row_done();
            b.set = false;
        }
        Ok(())
    }

    /// Changes buffered since the last batch.
    pub fn rows(&self) -> usize {
        self.builder.rows()
    }

    /// Arrow bytes buffered (values, offsets and variable-length data), for the byte budget.
    pub fn bytes(&mut self) -> usize {
        let rows = self.builder.rows();
        let mut var: usize = self.builder.columns().iter().map(|c| c.var_bytes()).sum();
        if let Some(b) = self.before.as_mut() {
            var += b
                .builder
                .columns()
                .iter()
                .map(|c| c.var_bytes())
                .sum::<usize>();
        }
        rows * self.fixed_row_bytes + var
    }

    /// Build the batch of the buffered changes; the builders keep their memory.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let main = self.builder.finish()?;
        let kept = |columns: &[ArrayRef], n: usize| -> Vec<ArrayRef> {
            match &self.keep {
                None => columns.to_vec(),
                Some(keep) => columns
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i >= n || keep[*i])
                    .map(|(_, c)| c.clone())
                    .collect(),
            }
        };
        let mut columns = kept(main.columns(), self.table_columns);
        if let Some(b) = self.before.as_mut() {
            let old = b.builder.finish()?;
            let valid = NullBuffer::new(b.valid.finish());
            let n = old.num_columns();
            let before =
                StructArray::try_new(b.fields.clone(), kept(old.columns(), n), Some(valid))?;
            columns.push(Arc::new(before));
        } else if self.keep.is_none() {
            return Ok(main);
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }

    /// Take back the memory of a written batch.
    pub fn recycle(&mut self, batch: RecordBatch) {
        if self.keep.is_some() {
            // Its columns no longer line up with the builders: dropped, not reused.
            return;
        }
        let Some(b) = self.before.as_mut() else {
            return self.builder.recycle(batch);
        };
        let before: Option<ArrayRef> = batch.columns().last().cloned();
        self.builder.recycle(batch);
        if let Some(before) = before {
            let s: StructArray = before.as_struct().clone();
            drop(before);
            let (_, columns, _) = s.into_parts();
            b.builder.recycle_columns(columns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{TxMeta, change_schema, with_before_images};
    use super::*;
    use crate::table::{ColumnDesc, TableRef};
    use arrow_array::Array;
    use arrow_array::types::{Int64Type, UInt64Type};
    use arrow_schema::Field;

    fn columns() -> (TableRef, Vec<ColumnDesc>) {
        let col = |name: &str, dt: DataType| ColumnDesc {
            name: name.into(),
            source_type: "t".into(),
            field: Field::new(name, dt, false),
            cast: None,
            as_text_fallback: false,
        };
        let t = TableRef {
            schema: "s".into(),
            name: "t".into(),
        };
        (
            t,
            vec![col("id", DataType::Int64), col("v", DataType::Utf8)],
        )
    }

    fn tx() -> TxMeta {
        TxMeta {
            pos: crate::StreamPos::from_adapter("0000000001000000"),
            xid: "7".into(),
            commit_ts: Some(1),
        }
    }

    #[test]
    fn rows_carry_change_columns_and_absent_names() {
        let (t, cols) = columns();
        let schema = change_schema(&t, &cols).unwrap();
        assert!(schema.field(0).is_nullable());
        let mut rows = ChangeRows::new(schema, 2).unwrap();
        assert!(rows.before().is_none());
        rows.columns()[0].push_i64(1).unwrap();
        rows.columns()[1].push_null();
        rows.absent(1).unwrap();
        rows.finish_row(ChangeOp::Update, &tx(), 42).unwrap();
        rows.columns()[0].push_i64(2).unwrap();
        rows.columns()[1].push_bytes(b"x").unwrap();
        rows.finish_row(ChangeOp::Insert, &tx(), 43).unwrap();
        assert!(rows.bytes() > 0);
        let b = rows.finish().unwrap();
        assert_eq!(b.num_rows(), 2);
        assert_eq!(b.column(2).as_string::<i32>().value(0), "update");
        assert_eq!(b.column(4).as_primitive::<UInt64Type>().value(1), 43);
        let absent = b.column(7).as_list::<i32>();
        assert_eq!(absent.value(0).as_string::<i32>().value(0), "v");
        assert_eq!(absent.value(1).len(), 0);
    }

    #[test]
    fn before_images_are_a_struct_null_where_a_change_has_no_old_row() {
        let (t, cols) = columns();
        let schema = with_before_images(&t, &change_schema(&t, &cols).unwrap(), 2).unwrap();
        let mut rows = ChangeRows::new(schema.clone(), 2).unwrap();
        for round in 0..2 {
            // An insert: no old row.
            rows.columns()[0].push_i64(1).unwrap();
            rows.columns()[1].push_bytes(b"new").unwrap();
            rows.finish_row(ChangeOp::Insert, &tx(), 1).unwrap();
            // An update: the old row, one of its values NULL.
            rows.columns()[0].push_i64(1).unwrap();
            rows.columns()[1].push_bytes(b"newer").unwrap();
            let old = rows.before().unwrap();
            old[0].push_i64(1).unwrap();
            old[1].push_null();
            rows.finish_row(ChangeOp::Update, &tx(), 2).unwrap();
            let b = rows.finish().unwrap();
            assert_eq!(b.schema(), schema, "round {round}");
            let before = b.column(8).as_struct();
            assert!(before.is_null(0) && before.is_valid(1), "round {round}");
            assert_eq!(before.column(0).as_primitive::<Int64Type>().value(1), 1);
            assert!(before.column(1).is_null(1));
            rows.recycle(b);
        }
    }

    #[test]
    fn a_projection_drops_columns_from_rows_absent_names_and_before_images() {
        let (t, cols) = columns();
        let schema = with_before_images(&t, &change_schema(&t, &cols).unwrap(), 2).unwrap();
        let mut rows = ChangeRows::new(schema, 2).unwrap();
        rows.project(vec![true, false]).unwrap();
        rows.columns()[0].push_i64(1).unwrap();
        rows.columns()[1].push_null();
        rows.absent(1).unwrap();
        let old = rows.before().unwrap();
        old[0].push_i64(1).unwrap();
        old[1].push_bytes(b"secret").unwrap();
        rows.finish_row(ChangeOp::Update, &tx(), 1).unwrap();
        let b = rows.finish().unwrap();
        let schema = b.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "id",
                "_op",
                "_pos",
                "_seq",
                "_commit_ts",
                "_xid",
                "_absent",
                "_before"
            ]
        );
        assert_eq!(b.schema(), *rows.schema());
        assert_eq!(
            b.column(6).as_list::<i32>().value(0).len(),
            0,
            "v is not named absent"
        );
        assert_eq!(
            b.column(7).as_struct().num_columns(),
            1,
            "v is not in _before"
        );
        rows.recycle(b);
    }

    #[test]
    fn a_column_named_like_the_before_image_is_refused() {
        let (t, mut cols) = columns();
        cols[1].name = BEFORE.into();
        cols[1].field = Field::new(BEFORE, DataType::Utf8, true);
        let schema = change_schema(&t, &cols).unwrap();
        let e = with_before_images(&t, &schema, 2).unwrap_err().to_string();
        assert!(
            e.contains("_before") && e.contains("--before-images"),
            "{e}"
        );
    }
}
