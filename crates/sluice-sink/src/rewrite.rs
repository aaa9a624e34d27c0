//! Rewriting a Parquet part without some of its rows: a converged export removes every row
//! whose key changed while it ran from the parts that hold it (the rows are read again, once,
//! at the export's end point).
//!
//! A part is read twice through the destination: first its key columns only, to learn
//! whether it holds any of the keys (most parts do not, and are left as written); then, when
//! it does, every column, filtered batch by batch into a new part under the same name with the
//! same writer settings. The new file replaces the old one only when it is complete (the
//! destination's writers commit by renaming or completing an upload), so a failure leaves the
//! old part.

use crate::destination::Destination;
use crate::format::{FormatOptions, PartStats, open_part};
use crate::memory::PartKey;
use crate::merge::open_remote;
use arrow_array::{BooleanArray, RecordBatch};
use arrow_schema::SchemaRef;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sluice_core::keytext::KeySet;
use sluice_core::{Error, Result};
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
}

/// The rows of `part` (a Parquet file) whose key is in `drop`, in file order, reading its key
/// columns only; `None` when it holds none (most parts). What [`without_rows`] removes: the
/// caller may act in between (a converged export withdraws the part's receipt first).
/// Synchronous: runs on a blocking thread.
pub fn rows_with_keys(
    dest: &Arc<dyn Destination>,
    part: &Part<'_>,
    drop: &KeySet,
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
/// are read in the same order, so no key is spelled again). Synchronous: runs on a blocking
/// thread.
pub fn without_rows(
    dest: &Arc<dyn Destination>,
    format: &FormatOptions,
    part: &Part<'_>,
    hits: &[bool],
) -> Result<Rewritten> {
    if !matches!(format, FormatOptions::Parquet(_)) {
        return Err(Error::config(format!(
            "{}: only Parquet parts can be rewritten ({} was asked)",
            part.path,
            format.describe()
        )));
    }
    let pq = |e| read_error(part, e);
    let source = (part.path.to_string(), part.bytes);
    let removed = hits.iter().filter(|&&hit| hit).count() as u64;
    let reader = ParquetRecordBatchReaderBuilder::try_new(open_remote(dest, &source))
        .map_err(pq)?
        .build()
        .map_err(pq)?;
    let object = dest.create(part.path)?;
    let mut out = open_part(
        format,
        part.key.clone(),
        part.schema.clone(),
        object,
        part.path,
    )?;
    let mut rows = 0u64;
    let mut kept_total = 0u64;
    for batch in reader {
        let filtered = batch
            .map_err(|e| pq(e.into()))
            .and_then(|b| {
                let b = RecordBatch::try_new(part.schema.clone(), b.columns().to_vec())
                    .map_err(|e| Error::internal(format!("{}: {e}", part.path)))?;
                let (from, to) = (rows as usize, rows as usize + b.num_rows());
                let keep: BooleanArray = hits
                    .get(from..to)
                    .ok_or_else(|| {
                        Error::internal(format!(
                            "{}: more rows than its key columns had",
                            part.path
                        ))
                    })?
                    .iter()
                    .map(|&hit| Some(!hit))
                    .collect();
                rows += b.num_rows() as u64;
                arrow_select::filter::filter_record_batch(&b, &keep)
                    .map_err(|e| Error::internal(format!("{}: {e}", part.path)))
            })
            .and_then(|b| {
                kept_total += b.num_rows() as u64;
                out.write(&b)
            });
        if let Err(e) = filtered {
            out.abort();
            return Err(e);
        }
    }
    if rows as usize != hits.len() {
        out.abort();
        return Err(Error::internal(format!(
            "{}: {rows} rows read, its key columns had {}",
            part.path,
            hits.len()
        )));
    }
    let stats = out.finish()?;
    debug_assert_eq!(rows - kept_total, removed);
    Ok(Rewritten {
        stats,
        removed: rows - kept_total,
    })
}

/// A part that cannot be read back: the store may answer next time.
fn read_error(part: &Part<'_>, e: parquet::errors::ParquetError) -> Error {
    Error::destination(
        sluice_core::error::Retry::Transient,
        format!("reading {} back: {e}", part.path),
    )
}
