//! Rewriting a Parquet part without some of its rows: a converged export removes every row
//! whose key changed while it ran from the parts that hold it (the rows are read again, once,
//! at the export's end point).
//!
//! A part is read twice through the destination: first its key columns only, to learn
//! whether it holds any of the keys (most parts do not, and are left as written); then, when
//! it does, into a new part under the same name: its row groups without such a row copied as
//! encoded column chunks, the others decoded, filtered and encoded again with the same writer
//! settings. The new file replaces the old one only when it is complete (the destination's
//! writers commit by renaming or completing an upload), so a failure leaves the old part.

use crate::destination::{CountingWriter, Destination};
use crate::format::{FormatOptions, PartStats, write_error};
use crate::memory::PartKey;
use crate::merge::open_remote;
use crate::parquet::arrow_writer;
use arrow_array::{BooleanArray, RecordBatch};
use arrow_schema::SchemaRef;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::arrow_writer::compute_leaves;
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::PageIndexPolicy;
use sluice_core::keytext::KeyLookup;
use sluice_core::{Error, Result};
use std::ops::Range;
use std::sync::Arc;

/// The part to rewrite: where it is and what it holds.
pub struct Part<'a> {
    /// Dataset and ordinal, for the writer.
    pub key: PartKey,
    /// Its path in the destination, as its receipt records it.
    pub path: &'a str,
    /// Its size, as its receipt records it.
    pub bytes: u64,
    /// The dataset's schema (the part's).
    pub schema: SchemaRef,
    /// The key columns, as indices into the schema.
    pub key_columns: &'a [usize],
}

/// What [`without_rows`] did to a part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The new part.
    pub stats: PartStats,
    /// Rows removed.
    pub removed: u64,
    /// Bytes of the part's row groups decoded and encoded again (their compressed size in the
    /// part as it was); the rest was copied, or left out with every row.
    pub reencoded_bytes: u64,
}

/// The rows of `part` (a Parquet file) whose key is in `drop`, in file order, reading its key
/// columns only; `None` when it holds none (most parts). What [`without_rows`] removes: the
/// caller may act in between (a converged export withdraws the part's receipt first).
/// Synchronous: runs on a blocking thread.
pub fn rows_with_keys(
    dest: &Arc<dyn Destination>,
    part: &Part<'_>,
    drop: &dyn KeyLookup,
) -> Result<Option<Vec<bool>>> {
    let pq = |e| read_error(part, e);
    let source = (part.path.to_string(), part.bytes);
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(open_remote(dest, &source)).map_err(pq)?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), part.key_columns.iter().copied());
    // A projection keeps the schema's column order: where each key column landed in it.
    let mut projected = part.key_columns.to_vec();
    projected.sort_unstable();
    let positions: Vec<usize> = part
        .key_columns
        .iter()
        .filter_map(|c| projected.iter().position(|p| p == c))
        .collect();
    let mut hits = Vec::new();
    for batch in builder.with_projection(mask).build().map_err(pq)? {
        let batch = batch.map_err(|e| pq(e.into()))?;
        hits.extend(drop.rows_in(&batch, &positions)?);
    }
    Ok(hits.contains(&true).then_some(hits))
}

/// Write `part` again without the rows marked in `hits` (from [`rows_with_keys`]: the rows
/// are read in the same order, so no key is spelled again). A row group without a marked row
/// is copied as its encoded column chunks, as `--merge` copies them (nothing decoded or
/// compressed again: with changes concentrated on recent rows most of a part is copied); a
/// row group with one is decoded, filtered and encoded again with the part's writer settings
/// (chosen from its first batch, as when the part was written), and left out when every row
/// goes. Synchronous: runs on a blocking thread.
pub fn without_rows(
    dest: &Arc<dyn Destination>,
    format: &FormatOptions,
    part: &Part<'_>,
    hits: &[bool],
) -> Result<Rewritten> {
    let FormatOptions::Parquet(options) = format else {
        return Err(Error::config(format!(
            "{}: only Parquet parts can be rewritten ({} was asked)",
            part.path,
            format.describe()
        )));
    };
    let pq = |e| read_error(part, e);
    let file = open_remote(dest, &(part.path.to_string(), part.bytes));
    // With the page index, which the copied row groups keep.
    let read_options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    let meta = ArrowReaderMetadata::load(&file, read_options).map_err(pq)?;
    let groups = meta.metadata().row_groups();
    let mut spans = Vec::with_capacity(groups.len());
    for g in groups {
        let from = spans.last().map_or(0, |s: &Range<usize>| s.end);
        spans.push(from..from + g.num_rows() as usize);
    }
    if spans.last().map_or(0, |s| s.end) != hits.len() {
        return Err(Error::internal(format!(
            "{}: its row groups hold another number of rows than its key columns had ({})",
            part.path,
            hits.len()
        )));
    }
    let group_reader = |i: usize| {
        ParquetRecordBatchReaderBuilder::new_with_metadata(file.clone(), meta.clone())
            .with_row_groups(vec![i])
            .build()
            .map_err(pq)
    };
    let marked = |s: &Range<usize>| hits[s.clone()].contains(&true);
    // The writer's settings come from a first batch, as a part's do: the first re-encoded one.
    let first = match spans.iter().position(marked) {
        Some(i) => group_reader(i)?
            .next()
            .transpose()
            .map_err(|e| pq(e.into()))?,
        None => None,
    };
    let out = CountingWriter::new(dest.create(part.path)?, part.path);
    let errors = out.errors();
    let failed = |e: parquet::errors::ParquetError| write_error(errors.take(), e, part.path);
    // Copying a row group reads the old part: without a write error, the read failed.
    let copy_failed =
        |e: parquet::errors::ParquetError| errors.take().unwrap_or_else(|| read_error(part, e));
    let (mut writer, factory) =
        arrow_writer(&part.schema, out, options, first.as_ref(), part.path)?
            .into_serialized_writer()
            .map_err(failed)?;
    let (mut kept, mut written, mut reencoded) = (0u64, 0usize, 0u64);
    for (i, span) in spans.iter().enumerate() {
        let group = &hits[span.clone()];
        if !marked(span) {
            let mut rg = writer.next_row_group().map_err(failed)?;
            let index = meta.metadata().page_index_for_row_group(i);
            for (c, column) in groups[i].columns().iter().enumerate() {
                let close = ColumnCloseResult {
                    bytes_written: column.compressed_size() as u64,
                    rows_written: span.len() as u64,
                    metadata: column.clone(),
                    bloom_filter: None,
                    column_index: index.column_index(c).cloned(),
                    offset_index: index.offset_index(c).cloned(),
                };
                rg.append_column(&file, close).map_err(copy_failed)?;
            }
            rg.close().map_err(failed)?;
            (kept, written) = (kept + span.len() as u64, written + 1);
            continue;
        }
        if group.iter().all(|&hit| hit) {
            continue;
        }
        reencoded += groups[i].compressed_size() as u64;
        let mut columns = factory.create_column_writers(written).map_err(failed)?;
        let mut at = 0usize;
        for batch in group_reader(i)? {
            let b = batch.map_err(|e| pq(e.into()))?;
            let b = RecordBatch::try_new(part.schema.clone(), b.columns().to_vec())
                .map_err(|e| Error::internal(format!("{}: {e}", part.path)))?;
            let marks = group.get(at..at + b.num_rows()).ok_or_else(|| {
                Error::internal(format!("{}: more rows than its key columns had", part.path))
            })?;
            at += b.num_rows();
            let keep: BooleanArray = marks.iter().map(|&hit| Some(!hit)).collect();
            let b = arrow_select::filter::filter_record_batch(&b, &keep)
                .map_err(|e| Error::internal(format!("{}: {e}", part.path)))?;
            kept += b.num_rows() as u64;
            let mut leaves = columns.iter_mut();
            for (field, array) in part.schema.fields().iter().zip(b.columns()) {
                for leaf in compute_leaves(field, array).map_err(failed)? {
                    leaves
                        .next()
                        .ok_or_else(|| {
                            Error::internal(format!("{}: a column too many", part.path))
                        })?
                        .write(&leaf)
                        .map_err(failed)?;
                }
            }
        }
        if at != span.len() {
            return Err(Error::internal(format!(
                "{}: row group {i} read {at} rows of {}",
                part.path,
                span.len()
            )));
        }
        let mut rg = writer.next_row_group().map_err(failed)?;
        for column in columns {
            column
                .close()
                .and_then(|c| c.append_to_row_group(&mut rg))
                .map_err(failed)?;
        }
        rg.close().map_err(failed)?;
        written += 1;
        // The row group's pages were just freed: give them back (see sluice_core::memory).
        sluice_core::memory::release();
    }
    let stats = writer.into_inner().map_err(failed)?.commit(kept)?;
    Ok(Rewritten {
        stats,
        removed: hits.len() as u64 - kept,
        reencoded_bytes: reencoded,
    })
}

/// A part that cannot be read back: the store may answer next time.
fn read_error(part: &Part<'_>, e: parquet::errors::ParquetError) -> Error {
    Error::destination(
        sluice_core::error::Retry::Transient,
        format!("reading {} back: {e}", part.path),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalDestination;
    use crate::format::{ParquetOptions, open_part};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::file::metadata::ParquetMetaData;

    const GROUP: i64 = 1000;

    fn metadata(dest: &Arc<dyn Destination>, path: &str, len: u64) -> Arc<ParquetMetaData> {
        let file = open_remote(dest, &(path.to_string(), len));
        let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
        ArrowReaderMetadata::load(&file, options)
            .unwrap()
            .metadata()
            .clone()
    }

    /// Four row groups of 1,000 rows; rows marked in the second, all of the third: the first
    /// and the last are copied byte for byte, the third is left out, the second is encoded
    /// again without its marked rows.
    #[test]
    fn unmarked_row_groups_are_copied_and_wholly_marked_ones_left_out() {
        let root =
            std::env::temp_dir().join(format!("sluice-rewrite-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&root).unwrap();
        let dest: Arc<dyn Destination> = Arc::new(LocalDestination::new(&root, false));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("t", DataType::Utf8, false),
        ]));
        // Every batch closes its row group.
        let format = FormatOptions::Parquet(ParquetOptions {
            row_group_bytes: 1,
            ..Default::default()
        });
        let key = PartKey {
            dataset: "d".into(),
            ordinal: 0,
        };
        let path = "d/part-00000.parquet";
        let mut w = open_part(
            &format,
            key.clone(),
            schema.clone(),
            dest.create(path).unwrap(),
            path,
        )
        .unwrap();
        for g in 0..4 {
            let ids: Vec<i64> = (g * GROUP..(g + 1) * GROUP).collect();
            let texts: Vec<String> = ids.iter().map(|i| format!("row {i}")).collect();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(StringArray::from(texts)),
                ],
            )
            .unwrap();
            w.write(&batch).unwrap();
        }
        let written = w.finish().unwrap();
        let before = metadata(&dest, path, written.bytes);
        assert_eq!(before.num_row_groups(), 4);
        let marked = |id: i64| (1010..1020).contains(&id) || (2 * GROUP..3 * GROUP).contains(&id);
        let hits: Vec<bool> = (0..4 * GROUP).map(marked).collect();
        let part = Part {
            key,
            path,
            bytes: written.bytes,
            schema: schema.clone(),
            key_columns: &[0],
        };
        let r = without_rows(&dest, &format, &part, &hits).unwrap();
        assert_eq!(r.removed, 1010);
        assert_eq!(
            r.reencoded_bytes,
            before.row_group(1).compressed_size() as u64
        );
        assert_eq!(r.stats.rows, 2990);
        let after = metadata(&dest, path, r.stats.bytes);
        assert_eq!(after.num_row_groups(), 3);
        for (old, new) in [(0, 0), (3, 2)] {
            for c in 0..2 {
                let (o, n) = (
                    before.row_group(old).column(c),
                    after.row_group(new).column(c),
                );
                assert_eq!(
                    o.compressed_size(),
                    n.compressed_size(),
                    "group {old} column {c}"
                );
                assert_eq!(o.statistics(), n.statistics(), "group {old} column {c}");
                // The page index too, pointing into the new file.
                let (oi, ni) = (
                    before.page_index_for_row_group(old),
                    after.page_index_for_row_group(new),
                );
                assert_eq!(
                    oi.column_index(c),
                    ni.column_index(c),
                    "group {old} column {c}"
                );
                let pages = |m: &ParquetMetaData, g: usize| {
                    let first = m.row_group(g).column(c).data_page_offset();
                    let locations = m
                        .page_index_for_row_group(g)
                        .offset_index(c)
                        .unwrap()
                        .clone();
                    locations
                        .page_locations()
                        .iter()
                        .map(|l| (l.offset - first, l.compressed_page_size))
                        .collect::<Vec<_>>()
                };
                assert_eq!(
                    pages(&before, old),
                    pages(&after, new),
                    "group {old} column {c}"
                );
            }
        }
        let file = open_remote(&dest, &(path.to_string(), r.stats.bytes));
        let mut ids = Vec::new();
        for b in ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
        {
            let b = b.unwrap();
            ids.extend(
                b.column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .iter()
                    .copied(),
            );
        }
        let want: Vec<i64> = (0..4 * GROUP).filter(|&i| !marked(i)).collect();
        assert_eq!(ids, want);
        std::fs::remove_dir_all(root).unwrap();
    }
}
