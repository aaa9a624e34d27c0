//! Parquet part writer.
//!
//! Row groups are sized by bytes: after each batch the writer checks the memory its open row
//! group holds (encoded pages plus buffers) and closes the row group at [`crate::ParquetOptions::row_group_bytes`]. That, not
//! a row count, bounds its memory whatever the row width. Statistics are on (page level), and
//! canonical extension types map to Parquet logical types (UUID, JSON).
//!
//! The file's writer is created when the first batch arrives, because that batch decides which
//! columns are written without a dictionary (see `cardinality.rs`): a column of unique
//! values would otherwise be interned into a dictionary in every row group only to fall back
//! to plain encoding.

use crate::cardinality;
use crate::destination::{CountingWriter, FirstIoError};
use crate::format::{Compression, ParquetOptions, PartStats, PartWriter, write_error};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression as PqCompression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesBuilder};
use parquet::schema::types::ColumnPath;
use sluice_core::{Error, Result};

/// Data and dictionary page limit for a row group of `row_group_bytes` over `columns` columns.
///
/// Each column writer buffers up to one data page and one dictionary page before they are
/// encoded into the row group; with the usual 1 MB limits a 20-column table would hold 40 MB
/// of page buffers whatever the row-group budget. Page limits are therefore scaled to the
/// budget: `row_group_bytes / (4 × columns)`, between 64 KB and 1 MB.
pub fn page_limit(row_group_bytes: usize, columns: usize) -> usize {
    (row_group_bytes / (4 * columns.max(1))).clamp(64 << 10, 1 << 20)
}

/// Largest data page of a fixed-width column (numbers, dates, times), uncompressed. Every buffer the Parquet writer allocates per page (the
/// encoded values, the page with its levels, the compressed copy) is then smaller than the
/// allocator's mmap threshold (256 KB, `sluice-cli/src/alloc.rs`), so it is carved from the heap
/// and reused page after page. Larger pages are mapped fresh and unmapped for every page: in
/// the benchmark lab a third of the client's CPU went to the kernel, mostly page faults.
/// Pages of this size cost fixed-width columns nothing in compression (measured on the lab's
/// narrow table: files 5% smaller with unique columns written plain) and give readers finer
/// page statistics. Text and binary columns keep the scaled page size: zstd finds more
/// repetition in larger pages of prose.
pub const DATA_PAGE_MAX: usize = 96 << 10;

fn builder(options: &ParquetOptions, columns: usize) -> Result<WriterPropertiesBuilder> {
    let page = page_limit(options.row_group_bytes, columns);
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
        // The dictionary limit decides when a column falls back to plain encoding: it keeps
        // the scaled size, so dictionaries are not given up earlier than the budget allows.
        .set_dictionary_page_size_limit(page)
        .set_created_by(format!("sluice {}", env!("CARGO_PKG_VERSION"))))
}

/// Parquet writer properties for `options` and a schema of `columns` columns, with
/// dictionaries tried on every column (the writer's default).
pub fn writer_properties(options: &ParquetOptions, columns: usize) -> Result<WriterProperties> {
    Ok(builder(options, columns)?.build())
}

/// Writer properties for a part whose first batch is `first`: as [`writer_properties`], with
/// the dictionary turned off for the columns `cardinality::plain_columns` picks.
pub fn writer_properties_for(
    options: &ParquetOptions,
    first: &RecordBatch,
) -> Result<WriterProperties> {
    let columns = first.num_columns();
    let mut b = builder(options, columns)?;
    let rows = first.num_rows().max(1);
    let row_bytes = (first.get_array_memory_size() / rows).max(1);
    let row_group_rows = (options.row_group_bytes / row_bytes).max(rows);
    for f in first.schema().fields() {
        if f.data_type().is_primitive() {
            b = b.set_column_data_page_size_limit(
                ColumnPath::from(f.name().clone()),
                page_limit(options.row_group_bytes, columns).min(DATA_PAGE_MAX),
            );
        }
    }
    for name in cardinality::plain_columns(
        first,
        row_group_rows,
        page_limit(options.row_group_bytes, columns),
    ) {
        b = b.set_column_dictionary_enabled(ColumnPath::from(name), false);
    }
    Ok(b.build())
}

/// The writer of a part with `schema` into `out`, with properties chosen from its first batch
/// `first` (the defaults when it has none) and sluice's own schema metadata as Parquet
/// key-value metadata too (readers that do not decode the Arrow schema see it).
pub(crate) fn arrow_writer(
    schema: &SchemaRef,
    out: CountingWriter,
    options: &ParquetOptions,
    first: Option<&RecordBatch>,
    path: &str,
) -> Result<ArrowWriter<CountingWriter>> {
    let mut props = match first {
        Some(b) => writer_properties_for(options, b)?,
        None => writer_properties(options, schema.fields().len())?,
    };
    let own: Vec<KeyValue> = schema
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("sluice."))
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    if !own.is_empty() {
        props = props
            .into_builder()
            .set_key_value_metadata(Some(own))
            .build();
    }
    ArrowWriter::try_new(out, schema.clone(), Some(props))
        .map_err(|e| Error::internal(format!("cannot write Parquet for {path}: {e}")))
}

/// One Parquet part file being written.
pub struct ParquetPart {
    /// The output until the first batch creates the writer.
    out: Option<CountingWriter>,
    schema: SchemaRef,
    options: ParquetOptions,
    writer: Option<ArrowWriter<CountingWriter>>,
    errors: FirstIoError,
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
        // Fail on bad options now rather than at the first batch.
        writer_properties(options, schema.fields().len())?;
        Ok(ParquetPart {
            out: Some(out),
            schema,
            options: options.clone(),
            writer: None,
            errors,
            rows: 0,
            path: path.to_string(),
        })
    }

    /// The writer, created on first use with properties chosen from `first` (or the defaults
    /// when the part has no batch).
    fn writer(&mut self, first: Option<&RecordBatch>) -> Result<&mut ArrowWriter<CountingWriter>> {
        if self.writer.is_none() {
            let out = self
                .out
                .take()
                .ok_or_else(|| Error::internal("write after finish"))?;
            let w = arrow_writer(&self.schema, out, &self.options, first, &self.path)?;
            self.writer = Some(w);
        }
        self.writer
            .as_mut()
            .ok_or_else(|| Error::internal("no Parquet writer"))
    }
}

impl PartWriter for ParquetPart {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let row_group_bytes = self.options.row_group_bytes;
        let w = self.writer(Some(batch))?;
        let flush = w.write(batch).and_then(|()| {
            if w.memory_size() >= row_group_bytes {
                w.flush().map(|()| true)
            } else {
                Ok(false)
            }
        });
        if flush.map_err(|e| write_error(self.errors.take(), e, &self.path))? {
            // The row group's pages were just freed: give them back (see sluice_core::memory).
            sluice_core::memory::release();
        }
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<PartStats> {
        self.writer(None)?;
        let w = self
            .writer
            .take()
            .ok_or_else(|| Error::internal("finish twice"))?;
        let out = w
            .into_inner()
            .map_err(|e| write_error(self.errors.take(), e, &self.path))?;
        sluice_core::memory::release();
        out.commit(self.rows)
    }

    fn abort(mut self: Box<Self>) {
        // Dropping the inner writer aborts the object.
        drop(self.writer.take());
        if let Some(out) = self.out.take() {
            out.abort();
        }
    }
}
