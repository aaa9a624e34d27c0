//! `--merge`: one file per dataset from its parts, in part order.
//!
//! - CSV parts after the first are written without a header, so merging is concatenation;
//!   JSON Lines parts are concatenated too. Compressed parts stay valid when concatenated
//!   (gzip members and zstd frames may follow one another; readers decode them as one stream).
//! - Avro container files cannot be concatenated (each has its header and sync marker):
//!   refused.
//! - Parquet parts are merged by copying their encoded column chunks into one file, row group
//!   by row group: nothing is decoded or recompressed, and memory holds one read block.
//!
//! Parts are read back through the destination in blocks, so merging works the same on local
//! disk and object storage.

use crate::destination::{CountingWriter, Destination, RangeReader};
use crate::format::{FormatOptions, PartStats};
use bytes::Bytes;
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::ParquetMetaDataReader;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::writer::SerializedFileWriter;
use sluice_core::{Error, Result};
use std::sync::Arc;

/// A part file read through a destination, for the Parquet reader.
#[derive(Clone)]
pub(crate) struct RemoteFile {
    dest: Arc<dyn Destination>,
    path: String,
    len: u64,
}

impl Length for RemoteFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for RemoteFile {
    type T = RangeReader;

    fn get_read(&self, start: u64) -> parquet::errors::Result<RangeReader> {
        Ok(RangeReader::new(
            self.dest.clone(),
            &self.path,
            start,
            self.len,
        ))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.dest
            .read_range(&self.path, start, length)
            .map(Bytes::from)
            .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
    }
}

pub(crate) fn open_remote(dest: &Arc<dyn Destination>, (path, len): &(String, u64)) -> RemoteFile {
    RemoteFile {
        dest: dest.clone(),
        path: path.clone(),
        len: *len,
    }
}

fn pq_err(path: &str) -> impl Fn(parquet::errors::ParquetError) -> Error + '_ {
    move |e| Error::internal(format!("merging {path}: {e}"))
}

/// Merge `parts` (paths with their sizes, in order, as their receipts record them) into
/// `target`; returns what the merged file holds. Synchronous: runs on a blocking thread.
pub fn merge(
    dest: &Arc<dyn Destination>,
    format: &FormatOptions,
    parts: &[(String, u64)],
    rows: u64,
    target: &str,
) -> Result<PartStats> {
    let object = dest.create(target)?;
    let mut out = CountingWriter::new(object, target);
    match format {
        FormatOptions::Arrow(_) => Err(Error::internal(
            "in-memory Arrow output has no files to merge",
        )),
        FormatOptions::Delta(_) | FormatOptions::Iceberg(_) => Err(Error::config(
            "a table is its metadata plus its part files, not one file: drop --merge",
        )),
        FormatOptions::Avro(_) => Err(Error::config(
            "Avro container files cannot be concatenated: drop --merge, or use --format parquet, \
             csv or jsonl",
        )),
        FormatOptions::Csv(_) | FormatOptions::Jsonl(_) => {
            for p in parts {
                let f = open_remote(dest, p);
                let mut r = RangeReader::new(dest.clone(), &f.path, 0, f.len);
                std::io::copy(&mut r, &mut out).map_err(|e| {
                    out.errors()
                        .take()
                        .unwrap_or_else(|| crate::destination::io_error(&e, "merge into", target))
                })?;
            }
            out.commit(rows)
        }
        FormatOptions::Parquet(_) => {
            let inputs = parts
                .iter()
                .map(|p| {
                    let f = open_remote(dest, p);
                    let meta = ParquetMetaDataReader::new()
                        .parse_and_finish(&f)
                        .map_err(pq_err(&p.0))?;
                    Ok((f, meta))
                })
                .collect::<Result<Vec<_>>>()?;
            let Some((_, first)) = inputs.first() else {
                return Err(Error::internal("merge of zero parts"));
            };
            let schema = first.file_metadata().schema_descr().root_schema_ptr();
            let props = WriterProperties::builder()
                .set_key_value_metadata(first.file_metadata().key_value_metadata().cloned())
                .set_created_by(format!("sluice {}", env!("CARGO_PKG_VERSION")))
                .build();
            let errors = out.errors();
            let mut writer =
                SerializedFileWriter::new(out, schema, Arc::new(props)).map_err(pq_err(target))?;
            for (input, meta) in &inputs {
                if meta.file_metadata().schema() != first.file_metadata().schema() {
                    return Err(Error::internal(format!(
                        "{} has a different schema from the first part",
                        input.path
                    )));
                }
                for rg in meta.row_groups() {
                    let mut rg_out = writer.next_row_group().map_err(pq_err(target))?;
                    for column in rg.columns() {
                        let close = ColumnCloseResult {
                            bytes_written: column.compressed_size() as u64,
                            rows_written: rg.num_rows() as u64,
                            metadata: column.clone(),
                            bloom_filter: None,
                            column_index: None,
                            offset_index: None,
                        };
                        rg_out
                            .append_column(input, close)
                            .map_err(|e| errors.take().unwrap_or_else(|| pq_err(target)(e)))?;
                    }
                    rg_out
                        .close()
                        .map_err(|e| errors.take().unwrap_or_else(|| pq_err(target)(e)))?;
                }
            }
            let out = writer
                .into_inner()
                .map_err(|e| errors.take().unwrap_or_else(|| pq_err(target)(e)))?;
            out.commit(rows)
        }
    }
}
