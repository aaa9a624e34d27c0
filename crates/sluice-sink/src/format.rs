//! Output formats and the part writer interface.

use crate::destination::{CountingWriter, ObjectWriter};
use crate::memory::{ArrowOutput, ArrowPart, PartKey};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use serde::{Deserialize, Serialize};
use sluice_core::{Error, Result};
use std::fmt;

/// Parquet compression codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// Zstandard at a level (1 fastest … 22 smallest).
    Zstd(i32),
    /// Snappy: fast, larger files.
    Snappy,
    /// No compression.
    None,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::Zstd(l) => write!(f, "zstd({l})"),
            Compression::Snappy => f.write_str("snappy"),
            Compression::None => f.write_str("none"),
        }
    }
}

/// Parquet options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetOptions {
    /// Codec for every column.
    pub compression: Compression,
    /// A row group is closed when its buffered, encoded size reaches this many bytes. This is
    /// what bounds the writer's memory; rows per group follow from row width.
    pub row_group_bytes: usize,
}

impl Default for ParquetOptions {
    fn default() -> Self {
        ParquetOptions {
            compression: Compression::Zstd(1),
            row_group_bytes: 16 << 20,
        }
    }
}

/// CSV options. RFC 4180: fields containing the delimiter, a quote, CR or LF are quoted with
/// quotes doubled; an empty string is written `""` so it differs from NULL when NULL is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// Field delimiter (one ASCII byte).
    pub delimiter: u8,
    /// What NULL is written as (default: nothing).
    pub null: String,
    /// Whether to write a header line with the column names.
    pub header: bool,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            delimiter: b',',
            null: String::new(),
            header: true,
        }
    }
}

/// The output format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatOptions {
    /// Apache Parquet.
    Parquet(ParquetOptions),
    /// Comma-separated values.
    Csv(CsvOptions),
    /// Arrow batches handed to a consumer in this process, not encoded (see [`crate::memory`]);
    /// used with a [`crate::MemoryDestination`].
    Arrow(ArrowOutput),
}

impl FormatOptions {
    /// File extension without the dot.
    pub fn extension(&self) -> &'static str {
        match self {
            FormatOptions::Parquet(_) => "parquet",
            FormatOptions::Csv(_) => "csv",
            FormatOptions::Arrow(_) => "arrow",
        }
    }

    /// The options for part `ordinal`: when merging CSV, only the first part carries the
    /// header, so merging is concatenation.
    pub fn for_part(&self, ordinal: u32, merge: bool) -> FormatOptions {
        match self {
            FormatOptions::Csv(c) if merge && ordinal > 0 => FormatOptions::Csv(CsvOptions {
                header: false,
                ..c.clone()
            }),
            other => other.clone(),
        }
    }

    /// Short description for reports, e.g. `parquet zstd(1)`.
    pub fn describe(&self) -> String {
        match self {
            FormatOptions::Parquet(p) => format!("parquet {}", p.compression),
            FormatOptions::Csv(c) => format!("csv delimiter {:?}", c.delimiter as char),
            FormatOptions::Arrow(_) => "arrow (in memory)".to_string(),
        }
    }
}

/// What one committed part holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartStats {
    /// Rows written.
    pub rows: u64,
    /// Bytes of the file.
    pub bytes: u64,
    /// xxh3-128 of the file's bytes, 32 hex digits (`xxhsum -H2` prints the same).
    pub xxh3_128: String,
}

/// Writes one part file. Dropping it without `finish` aborts the file.
pub trait PartWriter: Send {
    /// Append a batch (its schema must be the part's).
    fn write(&mut self, batch: &RecordBatch) -> Result<()>;
    /// Close the format, commit the file, and report what it holds.
    fn finish(self: Box<Self>) -> Result<PartStats>;
    /// Discard the file.
    fn abort(self: Box<Self>);
}

/// Open a part writer for part `part` with `schema`, writing to `out` (whose path is `path`,
/// for messages).
pub fn open_part(
    format: &FormatOptions,
    part: PartKey,
    schema: SchemaRef,
    out: Box<dyn ObjectWriter>,
    path: &str,
) -> Result<Box<dyn PartWriter>> {
    let counting = CountingWriter::new(out, path);
    match format {
        FormatOptions::Parquet(o) => Ok(Box::new(crate::parquet::ParquetPart::new(
            schema, counting, o, path,
        )?)),
        FormatOptions::Csv(o) => Ok(Box::new(crate::csv::CsvPart::new(
            schema,
            counting,
            o.clone(),
            path,
        )?)),
        FormatOptions::Arrow(a) => Ok(Box::new(ArrowPart::new(
            a.0.clone(),
            part,
            &schema,
            counting,
        )?)),
    }
}

/// Prefer the destination's own I/O error (disk full, permission) over the format library's
/// flattened text.
pub(crate) fn write_error(first_io: Option<Error>, what: impl fmt::Display, path: &str) -> Error {
    first_io.unwrap_or_else(|| Error::internal(format!("could not encode {path}: {what}")))
}
