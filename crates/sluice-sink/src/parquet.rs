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
use crate::format::{
    Compression, ParquetEncodings, ParquetOptions, PartStats, PartWriter, write_error,
};
use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::basic::{Compression as PqCompression, Encoding, Type, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesBuilder};
use parquet::schema::types::{ColumnDescPtr, ColumnPath};
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
/// page statistics. Text and binary columns have larger pages ([`TEXT_PAGE_MAX`]).
pub const DATA_PAGE_MAX: usize = 96 << 10;

/// Largest data page of a text or binary column (byte arrays), uncompressed. Such a column's
/// page is compressed on its own, so the page is zstd's whole view of the column: text that
/// repeats across rows (templated messages, JSON documents, an e-mail's domain) compresses
/// only as far as the repeats fall within one page. Measured on the lab's wide table (seven
/// text columns): 200 KB pages at zstd level 1 made 211 MB of them, 2 MB pages at level 3
/// 98 MB with 12% less CPU (docs/perf/encodings.md). The buffers of pages this large are
/// mapped fresh for every page (see [`DATA_PAGE_MAX`]), a cost spread over 2 MB of values.
pub const TEXT_PAGE_MAX: usize = 2 << 20;

/// Data page limit of the text and binary columns for a row group of `row_group_bytes` with
/// `text_columns` of them: each buffers one page until it is full, and those buffers count in
/// the row group's memory, so together they take at most half of it; between 64 KB and
/// [`TEXT_PAGE_MAX`].
pub fn text_page_limit(row_group_bytes: usize, text_columns: usize) -> usize {
    (row_group_bytes / (2 * text_columns.max(1))).clamp(64 << 10, TEXT_PAGE_MAX)
}

/// A zstd level as the Parquet writer takes it, checked.
fn zstd(level: i32) -> Result<PqCompression> {
    Ok(PqCompression::ZSTD(ZstdLevel::try_new(level).map_err(
        |_| {
            Error::config(format!(
                "zstd level {level} is out of range: use 1 (fastest) to 22 (smallest)."
            ))
        },
    )?))
}

/// The leaf columns of `schema` as the Arrow writer lays them out in Parquet.
fn leaves(schema: &Schema) -> Result<Vec<ColumnDescPtr>> {
    let parquet = ArrowSchemaConverter::new()
        .convert(schema)
        .map_err(|e| Error::internal(format!("the Parquet schema of {schema:?}: {e}")))?;
    Ok(parquet.columns().to_vec())
}

/// Whether a leaf column is text or binary to the writer (Parquet byte arrays: text, binary,
/// JSON, in lists and structs too): the columns with [`TEXT_PAGE_MAX`] pages.
fn is_text(c: &ColumnDescPtr) -> bool {
    c.physical_type() == Type::BYTE_ARRAY
}

/// Whether the writer would give `schema` any text or binary column (the planner counts their
/// pages' flush). A schema the writer cannot lay out counts as having one (the larger estimate).
pub fn has_text_columns(schema: &Schema) -> bool {
    leaves(schema).map_or(true, |l| l.iter().any(is_text))
}

fn builder(options: &ParquetOptions, schema: &Schema) -> Result<WriterPropertiesBuilder> {
    let page = page_limit(options.row_group_bytes, schema.fields().len());
    let compression = match options.compression {
        Compression::Zstd(level) => zstd(level)?,
        Compression::Snappy => PqCompression::SNAPPY,
        Compression::None => PqCompression::UNCOMPRESSED,
    };
    let leaves = leaves(schema)?;
    let mut b = WriterProperties::builder();
    let text: Vec<&ColumnDescPtr> = leaves.iter().filter(|c| is_text(c)).collect();
    let text_page = text_page_limit(options.row_group_bytes, text.len());
    let text_level = match (options.compression, options.text_zstd_level) {
        (Compression::Zstd(_), Some(level)) => Some(zstd(level)?),
        _ => None,
    };
    for c in text {
        b = b.set_column_data_page_size_limit(c.path().clone(), text_page);
        if let Some(level) = text_level {
            b = b.set_column_compression(c.path().clone(), level);
        }
    }
    if options.encodings == ParquetEncodings::Delta {
        for c in leaves
            .iter()
            .filter(|c| matches!(c.physical_type(), Type::INT32 | Type::INT64))
        {
            // A column with a dictionary keeps it; this is then what it falls back to.
            b = b.set_column_encoding(c.path().clone(), Encoding::DELTA_BINARY_PACKED);
        }
    }
    Ok(b.set_compression(compression)
        .set_statistics_enabled(EnabledStatistics::Page)
        // Rows per group are decided by bytes (see ParquetPart::write), not by a row count.
        .set_max_row_group_row_count(None)
        .set_data_page_size_limit(page)
        // The dictionary limit decides when a column falls back to plain encoding: it keeps
        // the scaled size, so dictionaries are not given up earlier than the budget allows.
        .set_dictionary_page_size_limit(page)
        .set_created_by(format!("sluice {}", env!("CARGO_PKG_VERSION"))))
}

/// Parquet writer properties for `options` and `schema`, with dictionaries tried on every
/// column (the writer's default).
pub fn writer_properties(options: &ParquetOptions, schema: &Schema) -> Result<WriterProperties> {
    Ok(builder(options, schema)?.build())
}

/// Writer properties for a part whose first batch is `first`: as [`writer_properties`], with
/// the dictionary turned off for the columns `cardinality::plain_columns` picks.
pub fn writer_properties_for(
    options: &ParquetOptions,
    first: &RecordBatch,
) -> Result<WriterProperties> {
    let columns = first.num_columns();
    let mut b = builder(options, &first.schema())?;
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
        None => writer_properties(options, schema)?,
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
        writer_properties(options, &schema)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::FormatOptions;
    use arrow_schema::{DataType, Field, TimeUnit};
    use std::sync::Arc;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("price", DataType::Float64, true),
            Field::new("body", DataType::Utf8, true),
            Field::new("blob", DataType::Binary, true),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
        ])
    }

    fn col(path: &str) -> ColumnPath {
        ColumnPath::from(path.split('.').map(str::to_string).collect::<Vec<_>>())
    }

    /// Text and binary columns, lists of text included, get the larger pages and level 3 by
    /// default; fixed-width ones keep the codec's level; a level the user chose (no text level)
    /// applies to every column.
    #[test]
    fn text_columns_get_large_pages_and_their_own_zstd_level() {
        let options = ParquetOptions {
            row_group_bytes: 8 << 20,
            ..Default::default()
        };
        let props = writer_properties(&options, &schema()).unwrap();
        let level3 = PqCompression::ZSTD(ZstdLevel::try_new(3).unwrap());
        let level1 = PqCompression::ZSTD(ZstdLevel::try_new(1).unwrap());
        let text_page = text_page_limit(8 << 20, 3);
        assert_eq!(text_page, (8 << 20) / 6);
        for text in ["body", "blob", "tags.list.item"] {
            assert_eq!(props.compression(&col(text)), level3, "{text}");
            assert_eq!(
                props.column_data_page_size_limit(&col(text)),
                text_page,
                "{text}"
            );
        }
        for fixed in ["id", "at", "price"] {
            assert_eq!(props.compression(&col(fixed)), level1, "{fixed}");
            assert!(props.column_data_page_size_limit(&col(fixed)) < text_page);
        }
        let chosen = ParquetOptions {
            compression: Compression::Zstd(5),
            text_zstd_level: None,
            ..options
        };
        let props = writer_properties(&chosen, &schema()).unwrap();
        let level5 = PqCompression::ZSTD(ZstdLevel::try_new(5).unwrap());
        assert_eq!(props.compression(&col("body")), level5);
        assert_eq!(props.compression(&col("id")), level5);
        assert_eq!(
            FormatOptions::Parquet(chosen.clone()).describe(),
            "parquet zstd(5)"
        );
        assert_eq!(
            FormatOptions::Parquet(ParquetOptions::default()).describe(),
            "parquet zstd(1), text zstd(3)"
        );
    }

    /// Text pages share half the row group, never below 64 KB nor above [`TEXT_PAGE_MAX`].
    #[test]
    fn text_pages_are_bounded() {
        assert_eq!(text_page_limit(4 << 20, 100), 64 << 10);
        assert_eq!(text_page_limit(1 << 30, 1), TEXT_PAGE_MAX);
        assert_eq!(text_page_limit(16 << 20, 0), TEXT_PAGE_MAX);
    }

    /// Delta encodings touch the integer-backed columns only; the default touches none.
    #[test]
    fn delta_encodings_apply_to_integer_backed_columns() {
        let delta = ParquetOptions {
            encodings: ParquetEncodings::Delta,
            ..Default::default()
        };
        let props = writer_properties(&delta, &schema()).unwrap();
        for c in ["id", "at"] {
            assert_eq!(
                props.encoding(&col(c)),
                Some(Encoding::DELTA_BINARY_PACKED),
                "{c}"
            );
        }
        for c in ["price", "body", "blob", "tags.list.item"] {
            assert_eq!(props.encoding(&col(c)), None, "{c}");
        }
        let props = writer_properties(&ParquetOptions::default(), &schema()).unwrap();
        assert_eq!(props.encoding(&col("id")), None);
    }
}
