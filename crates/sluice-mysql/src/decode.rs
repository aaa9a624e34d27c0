//! Row values → Arrow builders.
//!
//! The driver hands over each row as a vector of values: in the binary protocol numbers and
//! dates arrive already decoded (`Int`, `UInt`, `Double`, `Date`, `Time`), strings and decimals
//! as bytes; in the text protocol everything arrives as the server's text. [`RowDecoder`]
//! accepts either and appends each value straight into its column's builder — no intermediate
//! row type, no per-value parsing through `String`. Which decoder a column gets follows from its
//! Arrow type (see `types.rs`) plus two source facts: `bit(n)` arrives as big-endian bytes and
//! geometry carries a 4-byte SRID prefix.
//!
//! Zero and partial-zero dates become NULL and are counted per column (or fail, in strict mode);
//! non-zero SRIDs stripped from geometry are counted per column and SRID, so the report can
//! name what WKB could not carry.

use crate::connect::ZeroDates;
use crate::types::WKB_EXTENSION;
use arrow_array::RecordBatch;
use arrow_buffer::i256;
use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;
use arrow_schema::{DataType, SchemaRef, TimeUnit};
use mysql_async::Value;
use sluice_core::ColumnDesc;
use sluice_core::columns::{BatchBuilder, ColumnBuilder};
use sluice_core::values::micros_of_day;
use std::collections::BTreeMap;

mod value;
use value::*;

/// A value that could not be decoded. The reader adds the column and row position.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeError(pub String);

type DResult<T> = Result<T, DecodeError>;

fn err<T>(msg: impl Into<String>) -> DResult<T> {
    Err(DecodeError(msg.into()))
}

/// How one column's driver values become Arrow values, chosen by Arrow type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Conv {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F32,
    F64,
    /// Decimal with this scale.
    Dec128(i8),
    /// Decimal with this scale.
    Dec256(i8),
    /// Text or binary bytes.
    Bytes,
    Date,
    Ts,
    Dur,
}

impl Conv {
    fn for_type(dt: &DataType) -> DResult<Conv> {
        Ok(match dt {
            DataType::Boolean => Conv::Bool,
            DataType::Int8 => Conv::I8,
            DataType::Int16 => Conv::I16,
            DataType::Int32 => Conv::I32,
            DataType::Int64 => Conv::I64,
            DataType::UInt8 => Conv::U8,
            DataType::UInt16 => Conv::U16,
            DataType::UInt32 => Conv::U32,
            DataType::UInt64 => Conv::U64,
            DataType::Float32 => Conv::F32,
            DataType::Float64 => Conv::F64,
            DataType::Decimal128(_, s) => Conv::Dec128(*s),
            DataType::Decimal256(_, s) => Conv::Dec256(*s),
            DataType::Utf8 | DataType::Binary => Conv::Bytes,
            DataType::Date32 => Conv::Date,
            DataType::Timestamp(TimeUnit::Microsecond, _) => Conv::Ts,
            DataType::Duration(TimeUnit::Microsecond) => Conv::Dur,
            other => return err(format!("no decoder for Arrow type {other}")),
        })
    }

    /// Arrow bytes per value besides variable-length data (a text value's offset).
    fn width(self) -> usize {
        match self {
            Conv::Bool | Conv::I8 | Conv::U8 => 1,
            Conv::I16 | Conv::U16 => 2,
            Conv::I32 | Conv::U32 | Conv::F32 | Conv::Date | Conv::Bytes => 4,
            Conv::I64 | Conv::U64 | Conv::F64 | Conv::Ts | Conv::Dur => 8,
            Conv::Dec128(_) => 16,
            Conv::Dec256(_) => 32,
        }
    }
}

/// What the decoder had to change or drop, per column, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adjustments {
    /// Column index → zero, partial-zero or invalid dates exported as NULL.
    pub zero_dates: BTreeMap<usize, u64>,
    /// Column index → SRID → geometry values whose SRID prefix was stripped.
    pub srids: BTreeMap<usize, BTreeMap<u32, u64>>,
}

impl Adjustments {
    /// Add `other`'s counts to these.
    pub fn merge(&mut self, other: &Adjustments) {
        for (c, n) in &other.zero_dates {
            *self.zero_dates.entry(*c).or_default() += n;
        }
        for (c, m) in &other.srids {
            let mine = self.srids.entry(*c).or_default();
            for (s, n) in m {
                *mine.entry(*s).or_default() += n;
            }
        }
    }

    /// True when nothing was changed.
    pub fn is_empty(&self) -> bool {
        self.zero_dates.is_empty() && self.srids.is_empty()
    }
}

/// Decodes rows of one schema into record batches, in builders that keep their memory from
/// batch to batch (see `sluice_core::columns`).
pub struct RowDecoder {
    batch: BatchBuilder,
    values: ValueDecoder,
    /// Arrow bytes of one row besides variable-length data.
    fixed_row_bytes: usize,
    bytes: usize,
    failed_column: Option<usize>,
}

/// One value at a time into a column builder, by the column's Arrow type and source facts:
/// what [`RowDecoder`] does per value, for callers that own their builders (change capture
/// appends binary log values into the change rows' builders with it, so change files carry
/// exactly the export's values).
#[derive(Debug, Clone)]
pub struct ValueDecoder {
    cols: Vec<(Conv, Source)>,
    zero_dates: ZeroDates,
    adjustments: Adjustments,
}

/// A column builder's error as a decode error (its message, for the caller to place).
pub(crate) fn own(e: sluice_core::Error) -> DecodeError {
    DecodeError(e.message().to_string())
}

impl ValueDecoder {
    /// Decoders for `columns`, in order.
    pub fn new(columns: &[ColumnDesc], zero_dates: ZeroDates) -> DResult<Self> {
        let cols: Vec<(Conv, Source)> = columns
            .iter()
            .map(|c| {
                let src = if c.source_type.starts_with("bit") {
                    Source::Bit
                } else if c
                    .field
                    .metadata()
                    .get(EXTENSION_TYPE_NAME_KEY)
                    .map(String::as_str)
                    == Some(WKB_EXTENSION)
                {
                    Source::Geometry
                } else {
                    Source::Plain
                };
                Conv::for_type(c.field.data_type()).map(|conv| (conv, src))
            })
            .collect::<DResult<_>>()?;
        Ok(ValueDecoder {
            cols,
            zero_dates,
            adjustments: Adjustments::default(),
        })
    }

    /// What was changed so far (zero dates, stripped SRIDs).
    pub fn adjustments(&self) -> &Adjustments {
        &self.adjustments
    }

    /// The scale of column `i` when the export writes it as a 128-bit decimal.
    pub fn decimal128_scale(&self, i: usize) -> Option<i8> {
        match self.cols.get(i) {
            Some((Conv::Dec128(s), _)) => Some(*s),
            _ => None,
        }
    }

    /// True when column `i` takes text or binary bytes as they are (no geometry SRID to strip,
    /// no bit string to turn into a number).
    pub fn plain_bytes(&self, i: usize) -> bool {
        self.cols
            .get(i)
            .is_some_and(|(conv, src)| *conv == Conv::Bytes && *src == Source::Plain)
    }

    fn zero_date(&mut self, i: usize, col: &mut ColumnBuilder, c: &Civil) -> DResult<()> {
        if self.zero_dates == ZeroDates::Error {
            return err(format!(
                "the date {:04}-{:02}-{:02} is a zero, partial-zero or invalid date, which no \
                 Arrow or Parquet date can hold (strict mode: ?zero_dates=error). Remove \
                 zero_dates=error from the URL to export such dates as NULL (they are counted in \
                 the report), or fix the data",
                c.y, c.mo, c.d
            ));
        }
        *self.adjustments.zero_dates.entry(i).or_default() += 1;
        col.push_null();
        Ok(())
    }

    /// Append value `v` of column `i` to `col` (the column's builder). A zero date is NULL
    /// (counted) or an error in strict mode.
    pub fn push(&mut self, i: usize, col: &mut ColumnBuilder, v: Value) -> DResult<()> {
        if v == Value::NULL {
            col.push_null();
            return Ok(());
        }
        let (conv, src) = self.cols[i];
        let pushed = match conv {
            Conv::Bool => {
                let n = int_of(&v, src)?;
                col.push_bool(n != 0)
            }
            Conv::I8 => col.push_i8(fits(int_of(&v, src)?, "Int8")?),
            Conv::I16 => col.push_i16(fits(int_of(&v, src)?, "Int16")?),
            Conv::I32 => col.push_i32(fits(int_of(&v, src)?, "Int32")?),
            Conv::I64 => col.push_i64(fits(int_of(&v, src)?, "Int64")?),
            Conv::U8 => col.push_u8(fits(int_of(&v, src)?, "UInt8")?),
            Conv::U16 => col.push_u16(fits(int_of(&v, src)?, "UInt16")?),
            Conv::U32 => col.push_u32(fits(int_of(&v, src)?, "UInt32")?),
            Conv::U64 => col.push_u64(fits(int_of(&v, src)?, "UInt64")?),
            Conv::F32 => {
                let f = match v {
                    Value::Float(f) => f,
                    other => float_of(&other)? as f32,
                };
                col.push_f32(f)
            }
            Conv::F64 => col.push_f64(float_of(&v)?),
            Conv::Dec128(s) => col.push_i128(decimal::<i128>(bytes_of(&v)?, s)?),
            Conv::Dec256(s) => col.push_i256(decimal::<i256>(bytes_of(&v)?, s)?),
            Conv::Bytes if src == Source::Geometry => {
                let bytes = bytes_of(&v)?;
                if bytes.len() < 5 {
                    return err("geometry value shorter than its SRID prefix");
                }
                let srid = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                if srid != 0 {
                    *self
                        .adjustments
                        .srids
                        .entry(i)
                        .or_default()
                        .entry(srid)
                        .or_default() += 1;
                }
                col.push_bytes(&bytes[4..])
            }
            Conv::Bytes => col.push_bytes(bytes_of(&v)?),
            Conv::Date => {
                let c = civil_of(&v)?;
                match valid_days(&c) {
                    Some(d) => col.push_i32(
                        i32::try_from(d).map_err(|_| DecodeError("date out of range".into()))?,
                    ),
                    None => return self.zero_date(i, col, &c),
                }
            }
            Conv::Ts => {
                let c = civil_of(&v)?;
                match valid_days(&c) {
                    Some(d) => {
                        col.push_i64(d * 86_400_000_000 + micros_of_day(c.h, c.mi, c.s, c.us))
                    }
                    None => return self.zero_date(i, col, &c),
                }
            }
            Conv::Dur => col.push_i64(duration_of(&v)?),
        };
        pushed.map_err(own)
    }
}

impl RowDecoder {
    /// A decoder for `columns` (whose fields make `schema`).
    pub fn new(schema: SchemaRef, columns: &[ColumnDesc], zero_dates: ZeroDates) -> DResult<Self> {
        let values = ValueDecoder::new(columns, zero_dates)?;
        let cols = &values.cols;
        if cols.len() != schema.fields().len() {
            return err(format!(
                "{} columns for a schema of {} fields",
                cols.len(),
                schema.fields().len()
            ));
        }
        let batch = BatchBuilder::new(schema, 1024).map_err(own)?;
        Ok(RowDecoder {
            batch,
            fixed_row_bytes: cols.iter().map(|c| c.0.width()).sum(),
            values,
            bytes: 0,
            failed_column: None,
        })
    }

    /// Rows buffered since the last batch.
    pub fn rows(&self) -> usize {
        self.batch.rows()
    }

    /// Arrow bytes buffered since the last batch: the batch's size in memory (values, offsets
    /// and variable-length data; validity bits are not counted).
    pub fn buffered_bytes(&self) -> usize {
        self.bytes
    }

    /// Index of the column whose value failed last.
    pub fn failed_column(&self) -> Option<usize> {
        self.failed_column
    }

    /// What was changed so far (zero dates, stripped SRIDs).
    pub fn adjustments(&self) -> &Adjustments {
        self.values.adjustments()
    }

    /// Append one row's values (in column order). Returns the row's value bytes as received, a
    /// measure of what came over the wire.
    ///
    /// A row that fails part-way leaves the builders misaligned: the reader must abandon the
    /// chunk (it does: a data error ends the read).
    pub fn append(&mut self, values: Vec<Option<Value>>) -> DResult<usize> {
        if values.len() != self.values.cols.len() {
            return err(format!(
                "a row has {} values, expected {}",
                values.len(),
                self.values.cols.len()
            ));
        }
        let mut wire = 0;
        let mut var = 0;
        for (i, v) in values.into_iter().enumerate() {
            let v = v.unwrap_or(Value::NULL);
            match &v {
                Value::Bytes(b) => {
                    wire += b.len() + 1;
                    var += b.len();
                }
                Value::NULL => wire += 1,
                _ => wire += 8,
            }
            if let Err(e) = self.values.push(i, &mut self.batch.columns()[i], v) {
                self.failed_column = Some(i);
                return Err(e);
            }
        }
        self.batch.row_done();
        self.bytes += self.fixed_row_bytes + var;
        Ok(wire)
    }

    /// Build a batch from the buffered rows; the builders keep their memory for the next one.
    /// Text is checked to be UTF-8 here, once per batch.
    pub fn finish_batch(&mut self) -> sluice_core::Result<RecordBatch> {
        self.bytes = 0;
        self.batch.finish()
    }

    /// Take back the memory of a batch this decoder produced, once the writer is done with it.
    pub fn recycle(&mut self, batch: RecordBatch) {
        self.batch.recycle(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_times() {
        let c = parse_civil(b"2024-02-29 23:59:59.5").unwrap();
        assert_eq!((c.h, c.mi, c.s, c.us), (23, 59, 59, 500_000));
        assert!(valid_days(&c).is_some());
        for zero in [&b"0000-00-00"[..], b"2024-00-15", b"2023-02-29"] {
            assert_eq!(valid_days(&parse_civil(zero).unwrap()), None);
        }
        let t = |s: &str| duration_of(&Value::Bytes(s.as_bytes().to_vec())).unwrap();
        assert_eq!(t("-838:59:59"), -(838 * 3600 + 59 * 60 + 59) * 1_000_000);
        assert_eq!(t("100:00:00.000001"), 360_000_000_001);
        assert_eq!(
            duration_of(&Value::Time(true, 1, 2, 0, 0, 5)).unwrap(),
            -(26 * 3_600_000_000 + 5)
        );
    }

    #[test]
    fn integers_from_either_protocol() {
        assert_eq!(
            int_of(&Value::UInt(u64::MAX), Source::Plain).unwrap(),
            u64::MAX as i128
        );
        assert_eq!(
            int_of(
                &Value::Bytes(b"18446744073709551615".to_vec()),
                Source::Plain
            )
            .unwrap(),
            u64::MAX as i128
        );
        assert_eq!(int_of(&Value::Bytes(vec![1, 0]), Source::Bit).unwrap(), 256);
        assert!(fits::<u8>(256, "UInt8").is_err());
    }
}
