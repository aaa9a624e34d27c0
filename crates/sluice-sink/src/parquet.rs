//! Parquet part writer.
//!
//! Row groups are sized by bytes: after each batch the writer checks the memory its open row
//! group holds (encoded pages plus buffers) and closes the row group at [`crate::ParquetOptions::row_group_bytes`]. That, not
//! a row count, bounds its memory whatever the row width. Statistics are on (page level), and
//! canonical extension types map to Parquet logical types (UUID, JSON).

use crate::destination::{CountingWriter, FirstIoError};
use crate::format::{Compression, ParquetOptions, PartStats, PartWriter, write_error};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression as PqCompression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use sluice_core::{Error, Result};

/// Parquet writer properties for `options` and a schema of `columns` columns.
///
/// Each column writer buffers up to one data page and one dictionary page before they are
/// encoded into the row group; with the usual 1 MB limits a 20-column table would hold 40 MB
/// of page buffers whatever the row-group budget. Page limits are therefore scaled to the
/// budget: `row_group_bytes / (4 × columns)`, between 64 KB and 1 MB.
pub fn writer_properties(options: &ParquetOptions, columns: usize) -> Result<WriterProperties> {
    let page = (options.row_group_bytes / (4 * columns.max(1))).clamp(64 << 10, 1 << 20);
    let compression = match options.compression {
        Compression::Zstd(level) => {
            PqCompression::ZSTD(ZstdLevel::try_new(level).map_err(|_| {
                Error::config(format!(
                    "zstd level {level} is out of range: use 1 (fastest) to 22 (smallest)."
                ))
            })?)
        }
        Compression::Snappy => PqCompression::SNAPPY,
        Compression::None => PqCompression::UNCOMPRESSED,
    };
    Ok(WriterProperties::builder()
        .set_compression(compression)
        .set_statistics_enabled(EnabledStatistics::Page)
        // Rows per group are decided by bytes (see ParquetPart::write), not by a row count.
        .set_max_row_group_row_count(None)
        .set_data_page_size_limit(page)
        .set_dictionary_page_size_limit(page)
        .set_created_by(format!("sluice {}", env!("CARGO_PKG_VERSION")))
        .build())
}

/// One Parquet part file being written.
pub struct ParquetPart {
    writer: Option<ArrowWriter<CountingWriter>>,
    errors: FirstIoError,
    row_group_bytes: usize,
    rows: u64,
    path: String,
}

impl ParquetPart {
    /// Start a part with `schema`.
    pub fn new(
        schema: SchemaRef,
        out: CountingWriter,
        options: &ParquetOptions,
        path: &str,
    ) -> Result<Self> {
        let errors = out.errors();
        let props = writer_properties(options, schema.fields().len())?;
        let writer = ArrowWriter::try_new(out, schema, Some(props))
            .map_err(|e| Error::internal(format!("cannot write Parquet for {path}: {e}")))?;
        Ok(ParquetPart {
            writer: Some(writer),
            errors,
            row_group_bytes: options.row_group_bytes,
            rows: 0,
            path: path.to_string(),
        })
    }
}

impl PartWriter for ParquetPart {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| Error::internal("write after finish"))?;
        w.write(batch)
            .map_err(|e| write_error(self.errors.take(), e, &self.path))?;
        self.rows += batch.num_rows() as u64;
        if w.memory_size() >= self.row_group_bytes {
            w.flush()
                .map_err(|e| write_error(self.errors.take(), e, &self.path))?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<PartStats> {
        let w = self
            .writer
            .take()
            .ok_or_else(|| Error::internal("finish twice"))?;
        let out = w
            .into_inner()
            .map_err(|e| write_error(self.errors.take(), e, &self.path))?;
        let (bytes, xxh3_128) = out.commit()?;
        Ok(PartStats {
            rows: self.rows,
            bytes,
            xxh3_128,
        })
    }

    fn abort(mut self: Box<Self>) {
        if let Some(w) = self.writer.take() {
            // Dropping the inner writer aborts the object.
            drop(w);
        }
    }
}
