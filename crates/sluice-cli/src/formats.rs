//! The output format of a run: `--format` with its `--compression` (which codecs each format
//! has: a combination that does not exist is refused, naming the ones that do), the CSV
//! options and `--merge`'s limits.

use crate::args::{CompressionArg, FormatArg, Options, ParquetEncodingsArg};
use crate::config::bytes;
use sluice_core::{Error, Result};
use sluice_sink::columns::Kind;
use sluice_sink::table::TableCommitter;
use sluice_sink::{
    AvroCodec, AvroOptions, Compression, CsvOptions, FormatOptions, JsonlOptions, ParquetEncodings,
    ParquetOptions, TextCompression,
};
use std::sync::Arc;

fn parse_delimiter(text: &str) -> Result<u8> {
    match text {
        "\\t" | "tab" | "\t" => Ok(b'\t'),
        t if t.len() == 1 && t.is_ascii() => Ok(t.as_bytes()[0]),
        t => Err(Error::config(format!(
            "--csv-delimiter {t:?} must be exactly one ASCII character (or '\\t' for tab)."
        ))),
    }
}

/// `--csv-null`: the text must not contain what CSV gives meaning to, or a NULL would read
/// back as something else (or break the row).
fn check_csv_null(null: &str, delimiter: u8) -> Result<()> {
    if null
        .bytes()
        .any(|b| b == delimiter || matches!(b, b'"' | b'\r' | b'\n'))
    {
        return Err(Error::config(format!(
            "--csv-null {null:?} contains the delimiter {:?}, a double quote or a line break, so \
             NULL could not be told apart from data (or would break the row): choose a text \
             without them, e.g. --csv-null NULL or --csv-null '\\N'.",
            delimiter as char
        )));
    }
    Ok(())
}

/// The `--zstd-level` in force (default 1), checked.
fn zstd_level(o: &Options) -> Result<i32> {
    let level = o.zstd_level.unwrap_or(1);
    if !(1..=22).contains(&level) {
        return Err(Error::config(format!(
            "--zstd-level {level} is out of range: use 1 to 22."
        )));
    }
    Ok(level)
}

/// `--compression` that `format` has no codec for: refused, naming what it takes.
fn no_codec(format: &str, c: CompressionArg, takes: &str) -> Error {
    let name = format!("{c:?}").to_lowercase();
    Error::config(format!(
        "--compression {name} does not apply to --format {format}: use --compression {takes}."
    ))
}

/// Compression of a text format's whole file (CSV, JSON Lines).
fn text_compression(o: &Options, name: &str) -> Result<TextCompression> {
    Ok(match o.compression.unwrap_or(CompressionArg::None) {
        CompressionArg::None => TextCompression::None,
        CompressionArg::Gzip => TextCompression::Gzip,
        CompressionArg::Zstd => TextCompression::Zstd(zstd_level(o)?),
        c => return Err(no_codec(name, c, "gzip, zstd or none")),
    })
}

/// Parquet's options (`--format parquet`, and the parts of `--format delta`).
fn parquet(o: &Options, name: &str) -> Result<ParquetOptions> {
    Ok(ParquetOptions {
        compression: match o.compression.unwrap_or(CompressionArg::Zstd) {
            CompressionArg::Zstd => Compression::Zstd(zstd_level(o)?),
            CompressionArg::Snappy => Compression::Snappy,
            CompressionArg::None => Compression::None,
            c => return Err(no_codec(name, c, "zstd, snappy or none")),
        },
        // A level the user chose applies to every column; other codecs have none.
        text_zstd_level: match (o.zstd_level, o.compression.unwrap_or(CompressionArg::Zstd)) {
            (None, CompressionArg::Zstd) => Some(sluice_sink::format::TEXT_ZSTD_LEVEL),
            _ => None,
        },
        // The engine replaces this with the budget it derives from --memory.
        row_group_bytes: bytes(o.row_group_size)
            .unwrap_or(ParquetOptions::default().row_group_bytes),
        encodings: match o.parquet_encodings {
            None | Some(ParquetEncodingsArg::Compatible) => ParquetEncodings::Compatible,
            Some(ParquetEncodingsArg::Delta) => ParquetEncodings::Delta,
        },
    })
}

/// `--parquet-encodings` given for a format that writes no Parquet: refused rather than
/// ignored.
fn no_parquet(o: &Options, format: &str) -> Result<()> {
    match o.parquet_encodings {
        Some(_) => Err(Error::config(format!(
            "--parquet-encodings applies to Parquet output (--format parquet, delta or \
             iceberg), not --format {format}: remove it."
        ))),
        None => Ok(()),
    }
}

/// The committer of a table format's runs into `to` (`sluice-lake`: a local directory or S3,
/// with the export's storage options); other object stores are refused there, naming what
/// works.
pub(crate) fn table_committer(
    format: &FormatOptions,
    to: &str,
    storage_options: &[(String, String)],
    o: &Options,
) -> Result<Option<Arc<dyn TableCommitter>>> {
    if format.table_kind() != Some(Kind::Iceberg) {
        for (set, flag) in [
            (o.catalog.is_some(), "--catalog"),
            (o.namespace.is_some(), "--namespace"),
        ] {
            if set {
                return Err(Error::config(format!(
                    "{flag} applies to --format iceberg only: remove it, or add --format iceberg."
                )));
            }
        }
    }
    Ok(match format.table_kind() {
        None => None,
        Some(Kind::Delta | Kind::Spark) => Some(Arc::new(sluice_lake::DeltaCommitter::for_output(
            to,
            storage_options,
        )?)),
        Some(Kind::Iceberg) => Some(Arc::new(sluice_lake::IcebergCommitter::new(
            o.catalog.as_deref(),
            o.namespace.as_deref(),
            to,
        )?)),
    })
}

/// The output format `o` asks for, every combination of format and compression checked.
pub(crate) fn format(o: &Options) -> Result<FormatOptions> {
    Ok(match o.format.unwrap_or(FormatArg::Parquet) {
        FormatArg::Parquet => FormatOptions::Parquet(parquet(o, "parquet")?),
        FormatArg::Delta => {
            if o.merge {
                return Err(Error::config(
                    "--merge writes one file per dataset, and a Delta table is its log plus its \
                     part files: drop --merge (the table is one dataset to its readers anyway).",
                ));
            }
            FormatOptions::Delta(parquet(o, "delta")?)
        }
        FormatArg::Iceberg => {
            if o.merge {
                return Err(Error::config(
                    "--merge writes one file per dataset, and an Iceberg table is its metadata \
                     plus its part files: drop --merge.",
                ));
            }
            let p = parquet(o, "iceberg")?;
            if p.encodings == ParquetEncodings::Delta {
                return Err(Error::config(
                    "--parquet-encodings delta does not apply to --format iceberg: Apache \
                     Iceberg's vectorized Java readers (Spark's and Flink's Iceberg sources) \
                     before release 1.10 do not decode delta-encoded Parquet, so the table \
                     would fail there. Drop --parquet-encodings, or write --format parquet or \
                     delta.",
                ));
            }
            FormatOptions::Iceberg(p)
        }
        FormatArg::Csv => {
            no_parquet(o, "csv")?;
            let delimiter = match &o.csv_delimiter {
                Some(d) => parse_delimiter(d)?,
                None => b',',
            };
            let null = o.csv_null.clone().unwrap_or_default();
            check_csv_null(&null, delimiter)?;
            FormatOptions::Csv(CsvOptions {
                delimiter,
                null,
                header: !o.csv_no_header,
                compression: text_compression(o, "csv")?,
            })
        }
        FormatArg::Jsonl => {
            no_parquet(o, "jsonl")?;
            FormatOptions::Jsonl(JsonlOptions {
                compression: text_compression(o, "jsonl")?,
            })
        }
        FormatArg::Avro => {
            no_parquet(o, "avro")?;
            if o.merge {
                return Err(Error::config(
                    "--merge joins parts by concatenation, and Avro container files cannot be \
                     concatenated (each has its own header): drop --merge, or use --format \
                     parquet, csv or jsonl.",
                ));
            }
            FormatOptions::Avro(AvroOptions {
                codec: match o.compression.unwrap_or(CompressionArg::Zstd) {
                    CompressionArg::None => AvroCodec::None,
                    CompressionArg::Deflate => AvroCodec::Deflate,
                    CompressionArg::Snappy => AvroCodec::Snappy,
                    CompressionArg::Zstd => AvroCodec::Zstd,
                    c => return Err(no_codec("avro", c, "zstd, deflate, snappy or none")),
                },
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_null_cannot_hold_what_csv_gives_meaning_to() {
        for ok in ["", "NULL", "\\N", "n/a"] {
            assert!(check_csv_null(ok, b',').is_ok(), "{ok}");
        }
        for bad in [",", "a,b", "\"", "x\ny", "\r"] {
            let e = check_csv_null(bad, b',').unwrap_err();
            assert!(e.to_string().contains("--csv-null"), "{e}");
        }
        assert!(check_csv_null(";", b';').is_err());
        assert!(check_csv_null(";", b',').is_ok());
    }
}
