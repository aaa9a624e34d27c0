//! A batch of change rows reduced to what it does to a table keyed by its primary key, for the
//! table formats' copy-on-write merge (`sluice-lake`, `sluice stream --format delta`).
//!
//! For every key the batch touched, the table holds at the batch's end the key's last image,
//! or no row (deleted); a truncate removes every row that came before it. The merge then
//! rewrites each table file holding a touched key without it ([`Upserts::rewrite`]) and writes
//! the final images into one new file ([`Upserts::finish`]): one table commit swaps them.
//!
//! Columns a change does not carry (`_absent`: PostgreSQL's unchanged TOAST values, MySQL's
//! minimal row images) keep the value the row had: the batch's earlier image of the key, the
//! row a key update deleted just before its insert half (consecutive `_seq`), or the table's
//! own row, taken while the files are rewritten (a file holding a touched key is always read).
//!
//! Small files can be taken whole into the file of the final rows ([`Upserts::absorb`]), so a
//! table a stream merges into often does not end as thousands of small files.
//!
//! Memory: the batch's change rows (they are the final images' cells) and the rows of touched
//! files one file at a time; a transaction is never split across two merges, so a transaction
//! larger than memory is the limit.

use crate::columns::{Kind, TableSchema, table_schema};
use crate::format::ParquetOptions;
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, new_null_array};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::SchemaRef;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::parquet_to_arrow_schema;
use parquet::file::metadata::ParquetMetaDataReader;
use sluice_core::change::{ABSENT, BEFORE, CHANGE_COLUMNS, OP, SEQ};
use sluice_core::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// Where one cell of a final row comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    /// Change batch, row.
    Change(u32, u32),
    /// The table's row under the key with this id in `Upserts::table_keys`.
    Table(u32),
    Null,
}

/// A key's row at some point of the batch.
#[derive(Debug, Clone)]
enum Image {
    /// Every cell from one change row.
    Row(u32, u32),
    /// Cell by cell (some columns were absent).
    Cells(Arc<[Cell]>),
    /// The table's row, untouched so far.
    Table(u32),
}

/// What a rewrite did to one table file.
#[derive(Debug)]
pub enum Rewrite {
    /// No touched key in it: it stays.
    Untouched,
    /// Every row of it was touched (or truncated): it goes.
    Removed,
    /// It goes, and a file of its untouched rows replaces it.
    Replaced {
        /// The new file's Parquet bytes.
        bytes: Vec<u8>,
        /// Its rows.
        rows: u64,
    },
}

/// A batch's changes of one table, reduced to the table's rows at its end.
pub struct Upserts {
    table: TableSchema,
    /// The table's columns' positions in the change batches.
    data: Vec<usize>,
    /// The key columns' positions among the table's columns.
    key: Vec<usize>,
    keys: RowConverter,
    /// Change batches' table columns, in the table's types.
    batches: Vec<RecordBatch>,
    /// Each touched key's row at the batch's end (`None`: no row).
    touched: HashMap<Box<[u8]>, Option<Image>>,
    /// A truncate came: every row the table held before it is gone.
    truncated: bool,
    /// Keys whose table row a final image takes cells from, by id.
    table_keys: Vec<Box<[u8]>>,
    table_ids: HashMap<Box<[u8]>, u32>,
    /// Those rows as found in the files (id → row of `found_rows`).
    found: HashMap<u32, (u32, u32)>,
    found_rows: Vec<RecordBatch>,
    parquet: ParquetOptions,
    /// The file [`Upserts::finish`] writes, holding absorbed files' rows so far.
    out: Option<ArrowWriter<Vec<u8>>>,
    out_rows: u64,
    /// Changes reduced.
    pub changes: u64,
    /// The first key column's value of every key a change named (row form, sorted), to pass
    /// over files whose statistics exclude them all; `None` where the first key column's
    /// type has no total order statistics can be trusted for (floats).
    first: Option<(RowConverter, Vec<Box<[u8]>>)>,
}

fn internal(what: impl std::fmt::Display) -> Error {
    Error::internal(format!("merging changes: {what}"))
}

impl Upserts {
    /// Reduce `changes` (change rows of `dataset` as the stream writes them, in `_seq` order)
    /// for a table keyed by `key`, whose files are written with `parquet`.
    pub fn new(
        dataset: &str,
        changes: &[RecordBatch],
        key: &[String],
        parquet: &ParquetOptions,
    ) -> Result<Self> {
        let first = changes
            .first()
            .ok_or_else(|| internal(format!("{dataset}: no change rows")))?;
        let schema = first.schema();
        let data: Vec<usize> = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| !CHANGE_COLUMNS.contains(&f.name().as_str()) && f.name() != BEFORE)
            .map(|(i, _)| i)
            .collect();
        let projected = Arc::new(
            schema
                .project(&data)
                .map_err(|e| internal(format!("{dataset}: {e}")))?,
        );
        let table = table_schema(Kind::Delta, dataset, &projected)?;
        let mut key_at = Vec::with_capacity(key.len());
        for k in key {
            let at = table.schema.index_of(k).map_err(|_| {
                Error::config(format!(
                    "{dataset}: its key column {k:?} is not among the columns the stream keeps \
                     (--columns): a table kept by key needs its key; keep it."
                ))
            })?;
            key_at.push(at);
        }
        if key_at.is_empty() {
            return Err(Error::config(format!(
                "{dataset} has no primary key: a table format's rows are replaced by key, so \
                 sluice cannot merge its changes. Add a primary key, or stream it as change \
                 files (--format parquet)."
            )));
        }
        let fields = key_at
            .iter()
            .map(|&i| SortField::new(table.schema.field(i).data_type().clone()))
            .collect();
        let keys = RowConverter::new(fields).map_err(internal)?;
        let mut up = Upserts {
            table,
            data,
            key: key_at,
            keys,
            batches: Vec::with_capacity(changes.len()),
            touched: HashMap::new(),
            truncated: false,
            table_keys: Vec::new(),
            table_ids: HashMap::new(),
            found: HashMap::new(),
            found_rows: Vec::new(),
            parquet: parquet.clone(),
            out: None,
            out_rows: 0,
            changes: 0,
            first: None,
        };
        let first_type = up.table.schema.field(up.key[0]).data_type().clone();
        let mut first = (!first_type.is_floating())
            .then(|| RowConverter::new(vec![SortField::new(first_type)]).map(|c| (c, Vec::new())))
            .transpose()
            .map_err(internal)?;
        // The insert half of a key update takes its absent cells from the row deleted just
        // before it: (its `_seq`, that row).
        let mut deleted: Option<(u64, Option<Image>)> = None;
        for batch in changes {
            let b = up.batches.len() as u32;
            let columns: Vec<ArrayRef> = up.data.iter().map(|&i| batch.column(i).clone()).collect();
            let plain = RecordBatch::try_new(projected.clone(), columns).map_err(internal)?;
            let converted = up.table.convert(&plain)?;
            let rows = up.key_rows(&converted)?;
            if let Some((conv, keys)) = first.as_mut() {
                let column = converted.column(up.key[0]).clone();
                let firsts = conv.convert_columns(&[column]).map_err(internal)?;
                keys.extend(firsts.iter().map(|r| Box::<[u8]>::from(r.as_ref())));
            }
            let ops = column(batch, OP)?.as_string::<i32>().clone();
            let seqs = column(batch, SEQ)?.as_primitive::<UInt64Type>().clone();
            let absent = column(batch, ABSENT)?.as_list::<i32>().clone();
            up.batches.push(converted);
            for r in 0..batch.num_rows() {
                up.changes += 1;
                let k: Box<[u8]> = rows.row(r).as_ref().into();
                let seq = seqs.value(r);
                match ops.value(r) {
                    "truncate" => {
                        up.touched.clear();
                        up.truncated = true;
                        deleted = None;
                    }
                    "delete" => {
                        let before = up.current(&k);
                        up.touched.insert(k, None);
                        deleted = Some((seq, before));
                    }
                    "insert" | "update" => {
                        let missing = absent.value(r);
                        let missing = missing.as_string::<i32>();
                        let image = if missing.is_empty() {
                            Image::Row(b, r as u32)
                        } else {
                            let base = match &deleted {
                                Some((s, before)) if *s + 1 == seq && ops.value(r) == "insert" => {
                                    before.clone()
                                }
                                _ => up.current(&k),
                            };
                            let names: Vec<&str> = missing.iter().flatten().collect();
                            let cells = up
                                .table
                                .schema
                                .fields()
                                .iter()
                                .enumerate()
                                .map(|(c, f)| {
                                    if names.contains(&f.name().as_str()) {
                                        cell_of(base.as_ref(), c)
                                    } else {
                                        Cell::Change(b, r as u32)
                                    }
                                })
                                .collect();
                            Image::Cells(cells)
                        };
                        up.touched.insert(k, Some(image));
                    }
                    other => {
                        return Err(Error::data(format!(
                            "{dataset}: a change row with _op {other:?}, which no stream writes"
                        )));
                    }
                }
            }
        }
        if let Some((_, keys)) = first.as_mut() {
            keys.sort_unstable();
            keys.dedup();
        }
        up.first = first;
        Ok(up)
    }

    /// False when the table file whose Parquet footer is `footer` cannot hold a touched key:
    /// no row group's range of the first key column (its statistics) holds one. True where
    /// the statistics cannot tell (absent, another type, a float key).
    pub fn may_hold(&self, footer: &[u8]) -> Result<bool> {
        if self.truncated {
            return Ok(true);
        }
        if self.touched.is_empty() {
            return Ok(false);
        }
        let Some((conv, keys)) = &self.first else {
            return Ok(true);
        };
        let Ok(meta) = ParquetMetaDataReader::decode_metadata(footer) else {
            return Ok(true);
        };
        let file = meta.file_metadata();
        let Ok(arrow) = parquet_to_arrow_schema(file.schema_descr(), file.key_value_metadata())
        else {
            return Ok(true);
        };
        let field = self.table.schema.field(self.key[0]);
        let Ok(stats) = StatisticsConverter::try_new(field.name(), &arrow, file.schema_descr())
        else {
            return Ok(true);
        };
        let bounds = |a: parquet::errors::Result<ArrayRef>| {
            a.ok()
                .and_then(|a| arrow_cast::cast(&a, field.data_type()).ok())
                .filter(|a| a.null_count() == 0)
                .and_then(|a| conv.convert_columns(&[a]).ok())
        };
        let (Some(lo), Some(hi)) = (
            bounds(stats.row_group_mins(meta.row_groups().iter())),
            bounds(stats.row_group_maxes(meta.row_groups().iter())),
        ) else {
            return Ok(true);
        };
        Ok((0..lo.num_rows()).any(|g| {
            let (l, h) = (lo.row(g), hi.row(g));
            let at = keys.partition_point(|k| k.as_ref() < l.as_ref());
            keys.get(at).is_some_and(|k| k.as_ref() <= h.as_ref())
        }))
    }

    /// The table's schema (the columns and types the table's files hold).
    pub fn schema(&self) -> &SchemaRef {
        &self.table.schema
    }

    /// Keys touched (rows replaced or removed).
    pub fn touched(&self) -> usize {
        self.touched.len()
    }

    /// True when a truncate removed every row the table held before it.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    fn key_rows(&self, batch: &RecordBatch) -> Result<Rows> {
        let columns: Vec<ArrayRef> = self.key.iter().map(|&i| batch.column(i).clone()).collect();
        self.keys.convert_columns(&columns).map_err(internal)
    }

    /// Key `k`'s row now: the batch's image, none, or (untouched) the table's row.
    fn current(&mut self, k: &[u8]) -> Option<Image> {
        match self.touched.get(k) {
            Some(image) => image.clone(),
            None if self.truncated => None,
            None => {
                let next = self.table_keys.len() as u32;
                let id = *self.table_ids.entry(k.into()).or_insert(next);
                if id == next {
                    self.table_keys.push(k.into());
                }
                Some(Image::Table(id))
            }
        }
    }

    /// The table file `file` (Parquet) without the touched keys; the rows final images take
    /// cells from are kept aside.
    pub fn rewrite(&mut self, file: Bytes) -> Result<Rewrite> {
        if self.truncated {
            return Ok(Rewrite::Removed);
        }
        if self.touched.is_empty() {
            return Ok(Rewrite::Untouched);
        }
        // The key columns first: most files hold no touched key.
        let builder = ParquetRecordBatchReaderBuilder::try_new(file.clone())
            .map_err(|e| Error::data(format!("a table file: {e}")))?;
        let names: Vec<&str> = self
            .key
            .iter()
            .map(|&i| self.table.schema.field(i).name().as_str())
            .collect();
        let mask = ProjectionMask::columns(builder.parquet_schema(), names.iter().copied());
        let mut hit = false;
        for batch in builder.with_projection(mask).build().map_err(internal)? {
            let batch = self.in_table_types(&batch.map_err(internal)?, &names)?;
            let rows = self.key_rows(&batch)?;
            if (0..rows.num_rows()).any(|r| self.touched.contains_key(rows.row(r).as_ref())) {
                hit = true;
                break;
            }
        }
        if !hit {
            return Ok(Rewrite::Untouched);
        }
        let mut out = None;
        let rows = self.filter_into(file, &mut out)?;
        match out {
            None => Ok(Rewrite::Removed),
            Some(w) => Ok(Rewrite::Replaced {
                bytes: w.into_inner().map_err(internal)?,
                rows,
            }),
        }
    }

    /// Take the table file `file` (Parquet) into the file [`Upserts::finish`] writes, without
    /// the touched keys: small files are compacted so, while the merge rewrites the table.
    pub fn absorb(&mut self, file: Bytes) -> Result<()> {
        if self.truncated {
            return Ok(());
        }
        let mut out = self.out.take();
        self.out_rows += self.filter_into(file, &mut out)?;
        self.out = out;
        Ok(())
    }

    /// The rows of `file` without the touched keys, written into `out` (made at the first
    /// row kept); the rows final images take cells from are kept aside. Returns the rows kept.
    fn filter_into(&mut self, file: Bytes, out: &mut Option<ArrowWriter<Vec<u8>>>) -> Result<u64> {
        let all: Vec<&str> = self
            .table
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| Error::data(format!("a table file: {e}")))?;
        let mut kept_rows = 0u64;
        for batch in reader {
            let batch = self.in_table_types(&batch.map_err(internal)?, &all)?;
            let rows = self.key_rows(&batch)?;
            let mut keep = Vec::with_capacity(batch.num_rows());
            for r in 0..batch.num_rows() {
                let k = rows.row(r);
                keep.push(!self.touched.contains_key(k.as_ref()));
                if let Some(&id) = self.table_ids.get(k.as_ref()) {
                    self.found.insert(id, (self.found_rows.len() as u32, 0));
                    self.found_rows.push(batch.slice(r, 1));
                }
            }
            let kept = arrow_select::filter::filter_record_batch(&batch, &BooleanArray::from(keep))
                .map_err(internal)?;
            if kept.num_rows() == 0 {
                continue;
            }
            kept_rows += kept.num_rows() as u64;
            let w = match out.as_mut() {
                Some(w) => w,
                None => out.insert(self.writer()?),
            };
            w.write(&kept).map_err(internal)?;
        }
        Ok(kept_rows)
    }

    /// The rows of `names` in the table's types, by name (a file another writer wrote may
    /// order or type them otherwise; a column it lacks is NULL).
    fn in_table_types(&self, batch: &RecordBatch, names: &[&str]) -> Result<RecordBatch> {
        let mut fields = Vec::with_capacity(names.len());
        let mut columns = Vec::with_capacity(names.len());
        for name in names {
            let field = self.table.schema.field_with_name(name).map_err(internal)?;
            let column = match batch.column_by_name(name) {
                Some(c) if c.data_type() == field.data_type() => c.clone(),
                Some(c) => arrow_cast::cast(c, field.data_type()).map_err(|e| {
                    Error::data(format!(
                        "column {name:?} of a table file is {}, where the table's is {}: {e}",
                        c.data_type(),
                        field.data_type()
                    ))
                })?,
                None => new_null_array(field.data_type(), batch.num_rows()),
            };
            fields.push(Arc::new(field.clone().with_nullable(true)));
            columns.push(column);
        }
        RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), columns).map_err(internal)
    }

    fn writer(&self) -> Result<ArrowWriter<Vec<u8>>> {
        let props = crate::parquet::writer_properties(&self.parquet, &self.table.schema)?;
        ArrowWriter::try_new(Vec::new(), self.table.schema.clone(), Some(props)).map_err(internal)
    }

    /// The file of the rows the touched keys hold at the batch's end (`None`: no row), and
    /// its row count. Call after every file holding one was given to [`Upserts::rewrite`].
    pub fn finish(mut self) -> Result<Option<(Vec<u8>, u64)>> {
        let out = self.out.take();
        let images: Vec<&Image> = self.touched.values().flatten().collect();
        if images.is_empty() {
            return match out {
                Some(w) => Ok(Some((w.into_inner().map_err(internal)?, self.out_rows))),
                None => Ok(None),
            };
        }
        let n_batches = self.batches.len();
        let null_source = n_batches + self.found_rows.len();
        let resolve = |cell: Cell| -> (usize, usize) {
            match cell {
                Cell::Change(b, r) => (b as usize, r as usize),
                Cell::Table(id) => match self.found.get(&id) {
                    Some(&(f, r)) => (n_batches + f as usize, r as usize),
                    None => (null_source, 0),
                },
                Cell::Null => (null_source, 0),
            }
        };
        let mut columns = Vec::with_capacity(self.table.schema.fields().len());
        for (c, field) in self.table.schema.fields().iter().enumerate() {
            let nulls = new_null_array(field.data_type(), 1);
            let sources: Vec<&dyn Array> = self
                .batches
                .iter()
                .map(|b| b.column(c).as_ref())
                .chain(self.found_rows.iter().map(|b| b.column(c).as_ref()))
                .chain(std::iter::once(nulls.as_ref()))
                .collect();
            let picks: Vec<(usize, usize)> = images
                .iter()
                .map(|image| resolve(cell_of(Some(image), c)))
                .collect();
            columns.push(arrow_select::interleave::interleave(&sources, &picks).map_err(internal)?);
        }
        let batch = RecordBatch::try_new(self.table.schema.clone(), columns).map_err(|e| {
            Error::data(format!(
                "the merged rows do not fit the table's columns ({e}): a change left a column \
                 out whose value the table did not hold"
            ))
        })?;
        let mut w = match out {
            Some(w) => w,
            None => self.writer()?,
        };
        w.write(&batch).map_err(internal)?;
        let rows = self.out_rows + batch.num_rows() as u64;
        Ok(Some((w.into_inner().map_err(internal)?, rows)))
    }
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| internal(format!("change rows without {name}")))
}

/// Cell `c` of `image` (`None`: no row, so NULL).
fn cell_of(image: Option<&Image>, c: usize) -> Cell {
    match image {
        None => Cell::Null,
        Some(Image::Row(b, r)) => Cell::Change(*b, *r),
        Some(Image::Cells(cells)) => cells[c],
        Some(Image::Table(id)) => Cell::Table(*id),
    }
}

#[cfg(test)]
mod tests;
