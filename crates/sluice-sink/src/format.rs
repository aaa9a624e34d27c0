//! Output formats and the part writer interface.

use crate::columns::Kind;
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

/// Compression of a text format's whole stream (CSV, JSON Lines). Compressed files stay
/// concatenable: gzip members and zstd frames may follow one another in one file, which every
/// reader of the formats decodes as one stream, so `--merge` joins them as it joins plain ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TextCompression {
    /// Plain text.
    #[default]
    None,
    /// gzip (deflate) at the default level, `.gz`.
    Gzip,
    /// Zstandard at a level, `.zst`.
    Zstd(i32),
}

impl fmt::Display for TextCompression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextCompression::None => f.write_str("none"),
            TextCompression::Gzip => f.write_str("gzip"),
            TextCompression::Zstd(l) => write!(f, "zstd({l})"),
        }
    }
}

/// Codec of an Avro object container file's blocks (the codecs the Avro specification names;
/// the file's header says which, so readers need no option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AvroCodec {
    /// `null`: blocks as encoded.
    None,
    /// `deflate`: the codec every Avro reader has.
    Deflate,
    /// `snappy` (each block followed by its CRC-32).
    Snappy,
    /// `zstandard`, at the library's default level (3).
    #[default]
    Zstd,
}

impl fmt::Display for AvroCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AvroCodec::None => "none",
            AvroCodec::Deflate => "deflate",
            AvroCodec::Snappy => "snappy",
            AvroCodec::Zstd => "zstd",
        })
    }
}

/// JSON Lines options: one JSON object per row, `\n` after each (see `jsonl.rs` for how each
/// type is written).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JsonlOptions {
    /// Compression of the whole file.
    pub compression: TextCompression,
}

/// Avro options: one object container file per part, its schema derived from the Arrow
/// schema (see `avro.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AvroOptions {
    /// Codec of the file's blocks.
    pub codec: AvroCodec,
}

/// Parquet options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetOptions {
    /// Codec for every column (text and binary columns: see `text_zstd_level`).
    pub compression: Compression,
    /// With zstd, the level of the text and binary columns when it differs from
    /// `compression`'s: their pages are large ([`crate::parquet::TEXT_PAGE_MAX`]) and often
    /// repetitive, where level 3 finds what level 1 does not at little more CPU (on the lab's
    /// wide table, half the bytes), while fixed-width columns gain little from it. `None`: the
    /// one level for every column (a `--zstd-level` the user chose).
    pub text_zstd_level: Option<i32>,
    /// A row group is closed when its buffered, encoded size reaches this many bytes. This is
    /// what bounds the writer's memory; rows per group follow from row width.
    pub row_group_bytes: usize,
    /// Which value encodings the writer may use.
    pub encodings: ParquetEncodings,
}

impl Default for ParquetOptions {
    fn default() -> Self {
        ParquetOptions {
            compression: Compression::Zstd(1),
            text_zstd_level: Some(TEXT_ZSTD_LEVEL),
            row_group_bytes: 16 << 20,
            encodings: ParquetEncodings::Compatible,
        }
    }
}

/// The default zstd level of text and binary columns (see
/// [`ParquetOptions::text_zstd_level`]).
pub const TEXT_ZSTD_LEVEL: i32 = 3;

impl ParquetOptions {
    /// The codecs and encodings in a report's words: `zstd(1)`, `zstd(1), text zstd(3)`,
    /// `zstd(1), text zstd(3), delta encodings`.
    pub fn describe_compression(&self) -> String {
        let codecs = match (self.compression, self.text_zstd_level) {
            (Compression::Zstd(l), Some(t)) if t != l => format!("zstd({l}), text zstd({t})"),
            (c, _) => c.to_string(),
        };
        format!("{codecs}{}", self.encodings_suffix(", "))
    }

    /// What a request record adds for the encodings: nothing for the default (so a run
    /// recorded before the option existed still matches), `{sep}delta encodings` otherwise,
    /// so a resume with other encodings is refused rather than mixing files readers treat
    /// differently.
    fn encodings_suffix(&self, sep: &str) -> String {
        match self.encodings {
            ParquetEncodings::Compatible => String::new(),
            ParquetEncodings::Delta => format!("{sep}delta encodings"),
        }
    }
}

/// The value encodings a Parquet file may use (`--parquet-encodings`).
///
/// Why a choice: Parquet's delta encoding of integers (`DELTA_BINARY_PACKED`, in the format
/// since 2.0) makes integer, date and timestamp columns smaller and cheaper to write than
/// plain values under zstd (a serial key almost vanishes; a random 64-bit column is packed to
/// its bit width instead of zstd's whole bytes), but not every reader decodes it: Apache
/// Spark before 3.3 (vectorized reader), Apache Iceberg's own Java readers, and some
/// non-JVM libraries refuse such files. So the default writes what every reader reads, and
/// the smaller files are asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ParquetEncodings {
    /// Dictionary, plain and RLE only: what every Parquet reader decodes (default).
    #[default]
    Compatible,
    /// Integer-backed columns (integers, dates, times, timestamps, decimals of up to 18
    /// digits) as `DELTA_BINARY_PACKED` where they are not dictionary-encoded; everything
    /// else as with [`ParquetEncodings::Compatible`].
    Delta,
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
    /// Compression of the whole file.
    pub compression: TextCompression,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            delimiter: b',',
            null: String::new(),
            header: true,
            compression: TextCompression::None,
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
    /// JSON Lines: one JSON object per row.
    Jsonl(JsonlOptions),
    /// Apache Avro object container files.
    Avro(AvroOptions),
    /// A Delta Lake table per dataset: Parquet parts in types Delta has (see [`crate::columns`]),
    /// added by one table commit at the end of the run.
    Delta(ParquetOptions),
    /// An Apache Iceberg table per dataset, registered in a catalog: Parquet parts in types
    /// Iceberg has, with Iceberg's field ids (see [`crate::columns`]), added by one table
    /// commit at the end of the run.
    Iceberg(ParquetOptions),
    /// Arrow batches handed to a consumer in this process, not encoded (see [`crate::memory`]);
    /// used with a [`crate::MemoryDestination`].
    Arrow(ArrowOutput),
}

impl FormatOptions {
    /// File extension without the first dot: the format's, then the compression's
    /// (`parquet`, `csv`, `csv.gz`, `jsonl.zst`, `avro`).
    pub fn extension(&self) -> &'static str {
        use TextCompression as T;
        match self {
            FormatOptions::Parquet(_) | FormatOptions::Delta(_) | FormatOptions::Iceberg(_) => {
                "parquet"
            }
            FormatOptions::Csv(c) => match c.compression {
                T::None => "csv",
                T::Gzip => "csv.gz",
                T::Zstd(_) => "csv.zst",
            },
            FormatOptions::Jsonl(j) => match j.compression {
                T::None => "jsonl",
                T::Gzip => "jsonl.gz",
                T::Zstd(_) => "jsonl.zst",
            },
            FormatOptions::Avro(_) => "avro",
            FormatOptions::Arrow(_) => "arrow",
        }
    }

    /// The format as the request record (run state, manifest) names it: a resume must write
    /// the same. `parquet zstd(1)`, `csv`, `csv gzip`, `jsonl zstd(3)`, `avro deflate`.
    pub fn request_name(&self) -> String {
        match self {
            FormatOptions::Parquet(p) => {
                format!("parquet {}{}", p.compression, p.encodings_suffix(" "))
            }
            FormatOptions::Delta(p) => {
                format!("delta {}{}", p.compression, p.encodings_suffix(" "))
            }
            FormatOptions::Iceberg(p) => format!("iceberg {}", p.compression),
            FormatOptions::Csv(c) if c.compression == TextCompression::None => "csv".into(),
            FormatOptions::Csv(c) => format!("csv {}", c.compression),
            FormatOptions::Jsonl(j) if j.compression == TextCompression::None => "jsonl".into(),
            FormatOptions::Jsonl(j) => format!("jsonl {}", j.compression),
            FormatOptions::Avro(a) => format!("avro {}", a.codec),
            FormatOptions::Arrow(_) => "arrow".into(),
        }
    }

    /// True for a table format: each dataset's directory is a table, made by one commit at
    /// the end of the run (see [`crate::table`]).
    pub fn is_table(&self) -> bool {
        self.table_kind().is_some()
    }

    /// The table format's columns, for a table format.
    pub fn table_kind(&self) -> Option<Kind> {
        match self {
            FormatOptions::Delta(_) => Some(Kind::Delta),
            FormatOptions::Iceberg(_) => Some(Kind::Iceberg),
            _ => None,
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
            FormatOptions::Parquet(p) => format!("parquet {}", p.describe_compression()),
            FormatOptions::Delta(p) => format!("delta (parquet {})", p.describe_compression()),
            FormatOptions::Iceberg(p) => {
                format!("iceberg (parquet {})", p.describe_compression())
            }
            FormatOptions::Csv(c) if c.compression == TextCompression::None => {
                format!("csv delimiter {:?}", c.delimiter as char)
            }
            FormatOptions::Csv(c) => {
                format!("csv delimiter {:?} {}", c.delimiter as char, c.compression)
            }
            FormatOptions::Jsonl(j) => format!("jsonl {}", j.compression),
            FormatOptions::Avro(a) => format!("avro {}", a.codec),
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
        FormatOptions::Jsonl(o) => Ok(Box::new(crate::jsonl::JsonlPart::new(counting, o, path)?)),
        FormatOptions::Avro(o) => Ok(Box::new(crate::avro::AvroPart::new(
            &schema, counting, o, path,
        )?)),
        FormatOptions::Delta(o) => Ok(Box::new(crate::table::TablePart::new(
            Kind::Delta,
            &schema,
            counting,
            o,
            path,
        )?)),
        FormatOptions::Iceberg(o) => Ok(Box::new(crate::table::TablePart::new(
            Kind::Iceberg,
            &schema,
            counting,
            o,
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
