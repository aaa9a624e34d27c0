//! Rows from the client library → Arrow builders.
//!
//! The client library hands over each fetched row as values (integers as `i64`, INT128 as
//! `i128`, floats as `f64`, dates and times as a date-time, text already converted to UTF-8,
//! blobs as bytes). Which conversion a column gets follows from its Arrow type alone (see
//! `types.rs`); columns read through a cast arrive as text and are parsed here exactly.

use arrow_array::RecordBatch;
use arrow_schema::{DataType, SchemaRef, TimeUnit};
use chrono::{Datelike, NaiveDate, NaiveDateTime, Timelike};
use rsfbclient_core::{Column, SqlType};
use sluice_core::columns::{BatchBuilder, ColumnBuilder};
use sluice_core::values::{days_from_civil, fits_precision, micros_of_day, parse_decimal};
use sluice_core::{Error, Result};

/// How a column's value becomes its Arrow value.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Conv {
    Bool,
    I16,
    I32,
    I64,
    F32,
    F64,
    Dec(u8, i8),
    Bytes,
    Date,
    Time,
    Timestamp,
}

impl Conv {
    fn for_type(dt: &DataType) -> Result<Conv> {
        Ok(match dt {
            DataType::Boolean => Conv::Bool,
            DataType::Int16 => Conv::I16,
            DataType::Int32 => Conv::I32,
            DataType::Int64 => Conv::I64,
            DataType::Float32 => Conv::F32,
            DataType::Float64 => Conv::F64,
            DataType::Decimal128(p, s) => Conv::Dec(*p, *s),
            DataType::Utf8 | DataType::Binary => Conv::Bytes,
            DataType::Date32 => Conv::Date,
            DataType::Time64(TimeUnit::Microsecond) => Conv::Time,
            DataType::Timestamp(TimeUnit::Microsecond, _) => Conv::Timestamp,
            other => {
                return Err(Error::internal(format!(
                    "no Firebird decoder for Arrow type {other}"
                )));
            }
        })
    }

    /// Arrow bytes per value besides variable-length data.
    fn width(self) -> usize {
        match self {
            Conv::Bool => 1,
            Conv::I16 => 2,
            Conv::I32 | Conv::F32 | Conv::Date | Conv::Bytes => 4,
            Conv::I64 | Conv::F64 | Conv::Time | Conv::Timestamp => 8,
            Conv::Dec(..) => 16,
        }
    }
}

fn unexpected(v: &SqlType, what: &str) -> String {
    let kind = match v {
        SqlType::Text(_) => "text",
        SqlType::Integer(_) => "an integer",
        SqlType::Int128(_) => "an INT128",
        SqlType::Floating(_) => "a float",
        SqlType::Timestamp(_) => "a date-time",
        SqlType::Binary(_) => "bytes",
        SqlType::Boolean(_) => "a boolean",
        SqlType::Null => "NULL",
    };
    format!("expected {what}, the client library returned {kind}")
}

/// Days since 1970-01-01 of a client-library date.
fn days(d: NaiveDate) -> i32 {
    days_from_civil(i64::from(d.year()), d.month(), d.day()) as i32
}

/// Microseconds since midnight of a client-library time (100 µs resolution in Firebird).
fn micros(t: &NaiveDateTime) -> i64 {
    micros_of_day(t.hour(), t.minute(), t.second(), t.nanosecond() / 1_000)
}

fn append(conv: Conv, col: &mut ColumnBuilder, v: SqlType) -> std::result::Result<usize, String> {
    let int = |v: &SqlType| match v {
        SqlType::Integer(i) => Ok(*i),
        other => Err(unexpected(other, "an integer")),
    };
    let pushed = match conv {
        Conv::Bool => match v {
            SqlType::Boolean(b) => col.push_bool(b),
            other => return Err(unexpected(&other, "a boolean")),
        },
        Conv::I16 => col.push_i16(
            i16::try_from(int(&v)?).map_err(|_| "value out of SMALLINT range".to_string())?,
        ),
        Conv::I32 => col.push_i32(
            i32::try_from(int(&v)?).map_err(|_| "value out of INTEGER range".to_string())?,
        ),
        Conv::I64 => col.push_i64(int(&v)?),
        Conv::F32 => match v {
            SqlType::Floating(f) => col.push_f32(f as f32),
            other => return Err(unexpected(&other, "a float")),
        },
        Conv::F64 => match v {
            SqlType::Floating(f) => col.push_f64(f),
            other => return Err(unexpected(&other, "a float")),
        },
        Conv::Dec(precision, scale) => {
            let unscaled = match &v {
                SqlType::Integer(i) if scale == 0 => *i as i128,
                SqlType::Int128(i) if scale == 0 => *i,
                SqlType::Text(t) => parse_decimal::<i128>(t.as_bytes(), scale)?,
                other => return Err(unexpected(other, "an exact number")),
            };
            if !fits_precision(unscaled, precision) {
                return Err(format!(
                    "{unscaled} (unscaled) has more than the {precision} digits Arrow's decimal holds"
                ));
            }
            col.push_i128(unscaled)
        }
        Conv::Bytes => {
            let n = match &v {
                SqlType::Text(t) => {
                    col.push_bytes(t.as_bytes()).map_err(|e| e.to_string())?;
                    t.len()
                }
                SqlType::Binary(b) => {
                    col.push_bytes(b).map_err(|e| e.to_string())?;
                    b.len()
                }
                other => return Err(unexpected(other, "text or bytes")),
            };
            return Ok(n);
        }
        Conv::Date => match v {
            SqlType::Timestamp(t) => col.push_i32(days(t.date())),
            other => return Err(unexpected(&other, "a date")),
        },
        Conv::Time => match v {
            SqlType::Timestamp(t) => col.push_i64(micros(&t)),
            other => return Err(unexpected(&other, "a time")),
        },
        Conv::Timestamp => match v {
            SqlType::Timestamp(t) => col.push_i64(t.and_utc().timestamp_micros()),
            other => return Err(unexpected(&other, "a timestamp")),
        },
    };
    pushed.map_err(|e| e.to_string())?;
    Ok(0)
}

/// Appends rows to a batch and keeps count of its Arrow bytes.
pub struct RowDecoder {
    builder: BatchBuilder,
    convs: Vec<Conv>,
    row_width: usize,
    bytes: usize,
}

/// A value that could not be converted: which column (index) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeError {
    /// Index of the column in the schema.
    pub column: usize,
    /// What was wrong.
    pub message: String,
}

impl RowDecoder {
    /// A decoder for `schema`.
    pub fn new(schema: SchemaRef) -> Result<Self> {
        let convs = schema
            .fields()
            .iter()
            .map(|f| Conv::for_type(f.data_type()))
            .collect::<Result<Vec<_>>>()?;
        let row_width = convs.iter().map(|c| c.width()).sum();
        Ok(RowDecoder {
            builder: BatchBuilder::new(schema, 1024)?,
            convs,
            row_width,
            bytes: 0,
        })
    }

    /// Append one fetched row. Returns the bytes of variable-length data it carried (a
    /// measure of what was received).
    pub fn push_row(&mut self, row: Vec<Column>) -> std::result::Result<usize, DecodeError> {
        if row.len() != self.convs.len() {
            return Err(DecodeError {
                column: 0,
                message: format!(
                    "the query returned {} columns, {} were expected",
                    row.len(),
                    self.convs.len()
                ),
            });
        }
        let mut var = 0;
        let cols = self.builder.columns();
        for (i, (value, conv)) in row.into_iter().zip(&self.convs).enumerate() {
            if value.value.is_null() {
                cols[i].push_null();
                continue;
            }
            var += append(*conv, &mut cols[i], value.value)
                .map_err(|message| DecodeError { column: i, message })?;
        }
        self.builder.row_done();
        self.bytes += self.row_width + var;
        Ok(var + self.row_width)
    }

    /// Arrow bytes buffered since the last batch.
    pub fn buffered_bytes(&self) -> usize {
        self.bytes
    }

    /// Rows buffered since the last batch.
    pub fn rows(&self) -> usize {
        self.builder.rows()
    }

    /// Build the batch of the rows so far.
    pub fn finish_batch(&mut self) -> Result<RecordBatch> {
        self.bytes = 0;
        self.builder.finish()
    }

    /// Reuse the memory of a batch the writer has finished with.
    pub fn recycle(&mut self, batch: RecordBatch) {
        self.builder.recycle(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Date32Type, Decimal128Type, Time64MicrosecondType};
    use arrow_schema::{Field, Schema};
    use std::sync::Arc;

    #[test]
    fn rows_become_columns() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Decimal128(19, 2), true),
            Field::new("d", DataType::Date32, true),
            Field::new("t", DataType::Time64(TimeUnit::Microsecond), true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let mut dec = RowDecoder::new(schema).unwrap();
        let ts = NaiveDate::from_ymd_opt(2024, 2, 29)
            .unwrap()
            .and_hms_micro_opt(13, 45, 6, 700)
            .unwrap();
        let col = |v| Column::new("x", 0, v);
        dec.push_row(vec![
            col(SqlType::Text("-12.30".into())),
            col(SqlType::Timestamp(ts)),
            col(SqlType::Timestamp(ts)),
            col(SqlType::Text("Привет".into())),
        ])
        .unwrap();
        dec.push_row(vec![
            col(SqlType::Null),
            col(SqlType::Null),
            col(SqlType::Null),
            col(SqlType::Null),
        ])
        .unwrap();
        let e = dec
            .push_row(vec![
                col(SqlType::Integer(1)),
                col(SqlType::Null),
                col(SqlType::Null),
                col(SqlType::Null),
            ])
            .unwrap_err();
        assert_eq!(e.column, 0, "{e:?}");
        let b = dec.finish_batch().unwrap();
        assert_eq!(b.num_rows(), 2);
        assert_eq!(b.column(0).as_primitive::<Decimal128Type>().value(0), -1230);
        assert_eq!(b.column(1).as_primitive::<Date32Type>().value(0), 19782);
        assert_eq!(
            b.column(2).as_primitive::<Time64MicrosecondType>().value(0),
            (13 * 3600 + 45 * 60 + 6) * 1_000_000 + 700
        );
        assert_eq!(b.column(3).as_string::<i32>().value(0), "Привет");
        assert!(b.column(3).is_null(1));
    }
}
