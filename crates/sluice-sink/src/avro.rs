//! Avro part writer: one object container file per part, written by the `arrow-avro` crate
//! (Apache Arrow's own Avro writer, the workspace's Arrow version), its schema derived from the
//! part's Arrow schema and embedded in the file's header.
//!
//! | Arrow                        | Avro                                                   |
//! |------------------------------|--------------------------------------------------------|
//! | nullable column              | union `["null", T]`                                    |
//! | Boolean, Int32, Int64        | `boolean`, `int`, `long`                               |
//! | Int8, Int16, UInt8, UInt16   | `int`                                                  |
//! | UInt32                       | `long`                                                 |
//! | UInt64                       | `bytes` with logical type `decimal` (20, 0): Avro's `long` is signed |
//! | Float32, Float64             | `float`, `double`                                      |
//! | Decimal128/256(p, s)         | `bytes` with logical type `decimal` (p, s)             |
//! | Utf8                         | `string`                                               |
//! | Binary                       | `bytes`                                                |
//! | FixedSizeBinary + arrow.uuid | `string` with logical type `uuid`                      |
//! | Date32                       | `int` with logical type `date`                         |
//! | Time64(µs)                   | `long` with logical type `time-micros`                 |
//! | Timestamp(µs, zone)          | `long` with logical type `timestamp-micros`            |
//! | Timestamp(µs) without zone   | `long` with logical type `local-timestamp-micros`      |
//! | Duration(µs) (MySQL `time`)  | `long`, microseconds                                   |
//! | sluice.interval struct       | a `record` of `months`, `days`, `micros`               |
//! | List                         | `array`                                                |
//! | any other Struct (`_before`) | a `record` of its fields, each by these rules          |
//!
//! A column name Avro cannot hold (names are `[A-Za-z_][A-Za-z0-9_]*`) is written with every
//! other character as `_` and a `_` before a leading digit (`a b` → `a_b`, `1x` → `_1x`; a
//! name taken already gets `_2`, `_3`, …), the source's name kept as the field's `doc`.
//!
//! Each batch handed to the part becomes one block of the container, compressed with the
//! part's codec. Container files have a header and a sync marker of their own, so Avro parts
//! cannot be merged by concatenation (`--merge` refuses Avro).

use crate::destination::{CountingWriter, FirstIoError};
use crate::format::{AvroCodec, AvroOptions, PartStats, PartWriter, write_error};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_avro::compression::CompressionCodec;
use arrow_avro::writer::{AvroWriter, WriterBuilder};
use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use std::collections::HashSet;
use std::sync::Arc;

/// An unsigned 64-bit value as Avro holds it: a decimal of 20 digits.
const U64_AS: DataType = DataType::Decimal128(20, 0);
use sluice_core::{Error, Result};

/// One Avro part file being written.
pub struct AvroPart {
    /// The schema written: the part's, with UInt64 columns as decimals.
    schema: SchemaRef,
    writer: Option<AvroWriter<CountingWriter>>,
    errors: FirstIoError,
    rows: u64,
    path: String,
}

impl AvroPart {
    /// Start a part with `schema`: writes the container's header (schema, codec, sync marker).
    pub fn new(
        schema: &SchemaRef,
        out: CountingWriter,
        options: &AvroOptions,
        path: &str,
    ) -> Result<Self> {
        let errors = out.errors();
        let codec = match options.codec {
            AvroCodec::None => None,
            AvroCodec::Deflate => Some(CompressionCodec::Deflate),
            AvroCodec::Snappy => Some(CompressionCodec::Snappy),
            AvroCodec::Zstd => Some(CompressionCodec::ZStandard),
        };
        let written = Arc::new(Schema::new_with_metadata(
            avro_fields(schema.fields()),
            schema.metadata().clone(),
        ));
        let writer = WriterBuilder::new(written.as_ref().clone())
            .with_compression(codec)
            .build(out)
            .map_err(|e| match errors.take() {
                Some(io) => io,
                // The schema is the source's: a type or a name Avro cannot hold is the user's
                // to change (another format, or the column cast in a --query).
                None => Error::config(format!(
                    "cannot write {path} as Avro: {e}. Use --format parquet or jsonl, or select \
                     the column cast to another type with --query."
                )),
            })?;
        Ok(AvroPart {
            schema: written,
            writer: Some(writer),
            errors,
            rows: 0,
            path: path.to_string(),
        })
    }
}

impl PartWriter for AvroPart {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| Error::internal("write after finish"))?;
        let columns = batch
            .columns()
            .iter()
            .zip(self.schema.fields())
            .map(|(c, f)| avro_array(c, f))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let batch = RecordBatch::try_new(self.schema.clone(), columns).map_err(Error::from)?;
        w.write(&batch)
            .map_err(|e| write_error(self.errors.take(), e, &self.path))?;
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<PartStats> {
        let mut w = self
            .writer
            .take()
            .ok_or_else(|| Error::internal("finish twice"))?;
        w.finish()
            .map_err(|e| write_error(self.errors.take(), e, &self.path))?;
        w.into_inner().commit(self.rows)
    }

    fn abort(mut self: Box<Self>) {
        if let Some(w) = self.writer.take() {
            w.into_inner().abort();
        }
    }
}

/// `fields` as Avro holds them: names Avro accepts (the source's kept as `doc`), UInt64 as a
/// decimal, the fields of a record (a plain struct, the `_before` of change files) likewise.
fn avro_fields(fields: &Fields) -> Vec<Field> {
    let mut used = HashSet::new();
    fields
        .iter()
        .map(|f| {
            let f = match f.data_type() {
                DataType::UInt64 => f.as_ref().clone().with_data_type(U64_AS),
                DataType::Struct(inner) if !is_interval(f) => f
                    .as_ref()
                    .clone()
                    .with_data_type(DataType::Struct(avro_fields(inner).into())),
                _ => f.as_ref().clone(),
            };
            let name = avro_name(f.name(), &mut used);
            if &name == f.name() {
                return f;
            }
            let mut meta = f.metadata().clone();
            meta.insert("avro.doc".to_string(), f.name().clone());
            f.with_name(name).with_metadata(meta)
        })
        .collect()
}

/// A column as [`avro_fields`] made `written`, its field, declares it.
fn avro_array(c: &ArrayRef, written: &Field) -> Result<ArrayRef> {
    match (c.data_type(), written.data_type()) {
        (DataType::UInt64, _) => arrow_cast::cast(c, &U64_AS).map_err(Error::from),
        (DataType::Struct(_), DataType::Struct(fields)) if !is_interval(written) => {
            let s = c.as_struct();
            let columns = s
                .columns()
                .iter()
                .zip(fields)
                .map(|(c, f)| avro_array(c, f))
                .collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(StructArray::try_new(
                fields.clone(),
                columns,
                s.nulls().cloned(),
            )?))
        }
        _ => Ok(c.clone()),
    }
}

fn is_interval(f: &Field) -> bool {
    f.metadata()
        .get(EXTENSION_TYPE_NAME_KEY)
        .is_some_and(|e| e == "sluice.interval")
}

/// `name` as an Avro name, not one of `used` (which it joins).
fn avro_name(name: &str, used: &mut HashSet<String>) -> String {
    let mut base: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
        base.insert(0, '_');
    }
    let mut out = base.clone();
    let mut n = 1;
    while !used.insert(out.clone()) {
        n += 1;
        out = format!("{base}_{n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_avro_cannot_hold_are_rewritten_once_each() {
        let mut used = HashSet::new();
        let got: Vec<String> = ["id", "a b", "a_b", "1x", "Ünï", ""]
            .iter()
            .map(|n| avro_name(n, &mut used))
            .collect();
        assert_eq!(got, ["id", "a_b", "a_b_2", "_1x", "_n_", "_"]);
    }
}
