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
use arrow_array::builder::*;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::i256;
use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;
use arrow_schema::{DataType, SchemaRef, TimeUnit};
use mysql_async::Value;
use sluice_core::ColumnDesc;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A value that could not be decoded. The reader adds the column and row position.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeError(pub String);

type DResult<T> = Result<T, DecodeError>;

fn err<T>(msg: impl Into<String>) -> DResult<T> {
    Err(DecodeError(msg.into()))
}

/// One column's builder, chosen by Arrow type.
enum Col {
    Bool(BooleanBuilder),
    I8(Int8Builder),
    I16(Int16Builder),
    I32(Int32Builder),
    I64(Int64Builder),
    U8(UInt8Builder),
    U16(UInt16Builder),
    U32(UInt32Builder),
    U64(UInt64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    Dec128(Decimal128Builder, i8),
    Dec256(Decimal256Builder, i8),
    Utf8(StringBuilder),
    Binary(BinaryBuilder),
    Date(Date32Builder),
    Ts(TimestampMicrosecondBuilder),
    Dur(DurationMicrosecondBuilder),
}

/// Source facts that change how bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Plain,
    /// `bit(n)`: big-endian bytes.
    Bit,
    /// Geometry: SRID (u32 LE) + WKB.
    Geometry,
}

impl Col {
    fn new(dt: &DataType) -> DResult<Col> {
        Ok(match dt {
            DataType::Boolean => Col::Bool(BooleanBuilder::new()),
            DataType::Int8 => Col::I8(Int8Builder::new()),
            DataType::Int16 => Col::I16(Int16Builder::new()),
            DataType::Int32 => Col::I32(Int32Builder::new()),
            DataType::Int64 => Col::I64(Int64Builder::new()),
            DataType::UInt8 => Col::U8(UInt8Builder::new()),
            DataType::UInt16 => Col::U16(UInt16Builder::new()),
            DataType::UInt32 => Col::U32(UInt32Builder::new()),
            DataType::UInt64 => Col::U64(UInt64Builder::new()),
            DataType::Float32 => Col::F32(Float32Builder::new()),
            DataType::Float64 => Col::F64(Float64Builder::new()),
            DataType::Decimal128(p, s) => Col::Dec128(
                Decimal128Builder::new()
                    .with_precision_and_scale(*p, *s)
                    .map_err(|e| DecodeError(e.to_string()))?,
                *s,
            ),
            DataType::Decimal256(p, s) => Col::Dec256(
                Decimal256Builder::new()
                    .with_precision_and_scale(*p, *s)
                    .map_err(|e| DecodeError(e.to_string()))?,
                *s,
            ),
            DataType::Utf8 => Col::Utf8(StringBuilder::new()),
            DataType::Binary => Col::Binary(BinaryBuilder::new()),
            DataType::Date32 => Col::Date(Date32Builder::new()),
            DataType::Timestamp(TimeUnit::Microsecond, tz) => {
                Col::Ts(TimestampMicrosecondBuilder::new().with_timezone_opt(tz.clone()))
            }
            DataType::Duration(TimeUnit::Microsecond) => {
                Col::Dur(DurationMicrosecondBuilder::new())
            }
            other => return err(format!("no decoder for Arrow type {other}")),
        })
    }

    fn append_null(&mut self) {
        match self {
            Col::Bool(b) => b.append_null(),
            Col::I8(b) => b.append_null(),
            Col::I16(b) => b.append_null(),
            Col::I32(b) => b.append_null(),
            Col::I64(b) => b.append_null(),
            Col::U8(b) => b.append_null(),
            Col::U16(b) => b.append_null(),
            Col::U32(b) => b.append_null(),
            Col::U64(b) => b.append_null(),
            Col::F32(b) => b.append_null(),
            Col::F64(b) => b.append_null(),
            Col::Dec128(b, _) => b.append_null(),
            Col::Dec256(b, _) => b.append_null(),
            Col::Utf8(b) => b.append_null(),
            Col::Binary(b) => b.append_null(),
            Col::Date(b) => b.append_null(),
            Col::Ts(b) => b.append_null(),
            Col::Dur(b) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Col::Bool(b) => Arc::new(b.finish()),
            Col::I8(b) => Arc::new(b.finish()),
            Col::I16(b) => Arc::new(b.finish()),
            Col::I32(b) => Arc::new(b.finish()),
            Col::I64(b) => Arc::new(b.finish()),
            Col::U8(b) => Arc::new(b.finish()),
            Col::U16(b) => Arc::new(b.finish()),
            Col::U32(b) => Arc::new(b.finish()),
            Col::U64(b) => Arc::new(b.finish()),
            Col::F32(b) => Arc::new(b.finish()),
            Col::F64(b) => Arc::new(b.finish()),
            Col::Dec128(b, _) => Arc::new(b.finish()),
            Col::Dec256(b, _) => Arc::new(b.finish()),
            Col::Utf8(b) => Arc::new(b.finish()),
            Col::Binary(b) => Arc::new(b.finish()),
            Col::Date(b) => Arc::new(b.finish()),
            Col::Ts(b) => Arc::new(b.finish()),
            Col::Dur(b) => Arc::new(b.finish()),
        }
    }
}

/// An integer from a driver value: binary `Int`/`UInt`, text digits, or `bit` bytes.
fn int_of(v: &Value, src: Source) -> DResult<i128> {
    match v {
        Value::Int(i) => Ok(*i as i128),
        Value::UInt(u) => Ok(*u as i128),
        Value::Bytes(b) if src == Source::Bit => {
            if b.len() > 8 {
                return err("bit value wider than 64 bits");
            }
            Ok(b.iter().fold(0u64, |acc, x| (acc << 8) | *x as u64) as i128)
        }
        Value::Bytes(b) => parse_int(b),
        other => err(format!("expected an integer, got {other:?}")),
    }
}

fn parse_int(b: &[u8]) -> DResult<i128> {
    let (neg, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 20 {
        return err(format!(
            "{:?} is not an integer",
            String::from_utf8_lossy(b)
        ));
    }
    let mut n: i128 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return err(format!(
                "{:?} is not an integer",
                String::from_utf8_lossy(b)
            ));
        }
        n = n * 10 + (c - b'0') as i128;
    }
    Ok(if neg { -n } else { n })
}

fn fits<T: TryFrom<i128>>(n: i128, what: &str) -> DResult<T> {
    T::try_from(n).map_err(|_| DecodeError(format!("{n} does not fit {what}")))
}

fn float_of(v: &Value) -> DResult<f64> {
    match v {
        Value::Float(f) => Ok(*f as f64),
        Value::Double(f) => Ok(*f),
        Value::Int(i) => Ok(*i as f64),
        Value::UInt(u) => Ok(*u as f64),
        Value::Bytes(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .ok_or_else(|| {
                DecodeError(format!("{:?} is not a number", String::from_utf8_lossy(b)))
            }),
        other => err(format!("expected a number, got {other:?}")),
    }
}

/// Decimal text (`-123.4500`) as an integer scaled by 10^scale, generic over i128 / i256.
/// Extra fraction digits must be zeros: nothing is silently rounded.
macro_rules! decimal_from_text {
    ($name:ident, $t:ty, $from:expr, $zero:expr) => {
        fn $name(b: &[u8], scale: i8) -> DResult<$t> {
            let bad = || DecodeError(format!("{:?} is not a decimal", String::from_utf8_lossy(b)));
            let overflow = || DecodeError("decimal does not fit the column's precision".into());
            let (neg, rest) = match b.first() {
                Some(b'-') => (true, &b[1..]),
                _ => (false, b),
            };
            let (int, frac) = match rest.iter().position(|c| *c == b'.') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &rest[rest.len()..]),
            };
            if int.is_empty() && frac.is_empty() {
                return Err(bad());
            }
            let ten: $t = $from(10);
            let mut acc: $t = $zero;
            let scale = scale.max(0) as usize;
            for (i, &c) in int.iter().chain(frac.iter()).enumerate() {
                if !c.is_ascii_digit() {
                    return Err(bad());
                }
                if i >= int.len() + scale {
                    if c != b'0' {
                        return Err(DecodeError(
                            "decimal has more fraction digits than the column's scale".into(),
                        ));
                    }
                    continue;
                }
                acc = acc
                    .checked_mul(ten)
                    .and_then(|a| a.checked_add($from((c - b'0') as i128)))
                    .ok_or_else(overflow)?;
            }
            for _ in frac.len()..scale {
                acc = acc.checked_mul(ten).ok_or_else(overflow)?;
            }
            Ok(if neg {
                acc.checked_neg().ok_or_else(overflow)?
            } else {
                acc
            })
        }
    };
}
decimal_from_text!(decimal_i128, i128, |x: i128| x, 0i128);
decimal_from_text!(decimal_i256, i256, i256::from_i128, i256::ZERO);

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// A date-time split into parts, as both protocols can give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    y: i64,
    mo: u32,
    d: u32,
    h: u32,
    mi: u32,
    s: u32,
    us: u32,
}

fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || b.len() > 9 {
        return None;
    }
    b.iter().try_fold(0u32, |acc, c| {
        c.is_ascii_digit().then(|| acc * 10 + (c - b'0') as u32)
    })
}

/// Fraction digits (`5` → 500000 µs).
fn micros_of_fraction(b: &[u8]) -> Option<u32> {
    if b.is_empty() || b.len() > 6 {
        return None;
    }
    let v = digits(b)?;
    Some(v * 10u32.pow(6 - b.len() as u32))
}

/// Parse `YYYY-MM-DD[ HH:MM:SS[.ffffff]]`.
fn parse_civil(b: &[u8]) -> Option<Civil> {
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let mut c = Civil {
        y: digits(&b[0..4])? as i64,
        mo: digits(&b[5..7])?,
        d: digits(&b[8..10])?,
        h: 0,
        mi: 0,
        s: 0,
        us: 0,
    };
    if b.len() > 10 {
        let t = &b[11..];
        if t.len() < 8 || t[2] != b':' || t[5] != b':' {
            return None;
        }
        c.h = digits(&t[0..2])?;
        c.mi = digits(&t[3..5])?;
        c.s = digits(&t[6..8])?;
        if t.len() > 8 {
            if t[8] != b'.' {
                return None;
            }
            c.us = micros_of_fraction(&t[9..])?;
        }
    }
    Some(c)
}

fn civil_of(v: &Value) -> DResult<Civil> {
    match v {
        Value::Date(y, mo, d, h, mi, s, us) => Ok(Civil {
            y: *y as i64,
            mo: *mo as u32,
            d: *d as u32,
            h: *h as u32,
            mi: *mi as u32,
            s: *s as u32,
            us: *us,
        }),
        Value::Bytes(b) => parse_civil(b)
            .ok_or_else(|| DecodeError(format!("{:?} is not a date", String::from_utf8_lossy(b)))),
        other => err(format!("expected a date, got {other:?}")),
    }
}

/// Days since 1970 for a valid date, `None` for a zero, partial-zero or invalid one.
fn valid_days(c: &Civil) -> Option<i64> {
    if c.mo == 0 || c.mo > 12 || c.d == 0 || c.d > days_in_month(c.y, c.mo) {
        return None;
    }
    Some(days_from_civil(c.y, c.mo, c.d))
}

/// Microseconds of a signed MySQL `time` (`-838:59:59.000000`).
fn duration_of(v: &Value) -> DResult<i64> {
    match v {
        Value::Time(neg, days, h, m, s, us) => {
            let secs = ((*days as i64 * 24 + *h as i64) * 60 + *m as i64) * 60 + *s as i64;
            let t = secs * 1_000_000 + *us as i64;
            Ok(if *neg { -t } else { t })
        }
        Value::Bytes(b) => {
            let bad = || DecodeError(format!("{:?} is not a time", String::from_utf8_lossy(b)));
            let (neg, rest) = match b.first() {
                Some(b'-') => (true, &b[1..]),
                _ => (false, &b[..]),
            };
            let (hms, frac) = match rest.iter().position(|c| *c == b'.') {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            };
            let mut parts = hms.split(|c| *c == b':');
            let h = parts.next().and_then(digits).ok_or_else(bad)? as i64;
            let m = parts.next().and_then(digits).ok_or_else(bad)? as i64;
            let s = parts.next().and_then(digits).ok_or_else(bad)? as i64;
            if parts.next().is_some() {
                return Err(bad());
            }
            let us = match frac {
                Some(f) => micros_of_fraction(f).ok_or_else(bad)? as i64,
                None => 0,
            };
            let t = ((h * 60 + m) * 60 + s) * 1_000_000 + us;
            Ok(if neg { -t } else { t })
        }
        other => err(format!("expected a time, got {other:?}")),
    }
}

fn bytes_of(v: &Value) -> DResult<&[u8]> {
    match v {
        Value::Bytes(b) => Ok(b),
        other => err(format!("expected bytes, got {other:?}")),
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

/// Decodes rows of one schema into record batches.
pub struct RowDecoder {
    schema: SchemaRef,
    cols: Vec<(Col, Source)>,
    rows: usize,
    bytes: usize,
    zero_dates: ZeroDates,
    adjustments: Adjustments,
    failed_column: Option<usize>,
}

impl RowDecoder {
    /// A decoder for `columns` (whose fields make `schema`).
    pub fn new(schema: SchemaRef, columns: &[ColumnDesc], zero_dates: ZeroDates) -> DResult<Self> {
        let cols = columns
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
                Col::new(c.field.data_type()).map(|col| (col, src))
            })
            .collect::<DResult<_>>()?;
        Ok(RowDecoder {
            schema,
            cols,
            rows: 0,
            bytes: 0,
            zero_dates,
            adjustments: Adjustments::default(),
            failed_column: None,
        })
    }

    /// Rows buffered since the last batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Value bytes buffered since the last batch: the batch's approximate Arrow size.
    pub fn buffered_bytes(&self) -> usize {
        self.bytes
    }

    /// Index of the column whose value failed last.
    pub fn failed_column(&self) -> Option<usize> {
        self.failed_column
    }

    /// What was changed so far (zero dates, stripped SRIDs).
    pub fn adjustments(&self) -> &Adjustments {
        &self.adjustments
    }

    /// Append one row's values (in column order). Returns the row's value bytes, a measure of
    /// what was received.
    pub fn append(&mut self, values: Vec<Option<Value>>) -> DResult<usize> {
        if values.len() != self.cols.len() {
            return err(format!(
                "a row has {} values, expected {}",
                values.len(),
                self.cols.len()
            ));
        }
        let mut row_bytes = 0;
        for (i, v) in values.into_iter().enumerate() {
            let v = v.unwrap_or(Value::NULL);
            row_bytes += match &v {
                Value::Bytes(b) => b.len() + 1,
                Value::NULL => 1,
                _ => 8,
            };
            if let Err(e) = self.append_value(i, v) {
                self.failed_column = Some(i);
                return Err(e);
            }
        }
        self.rows += 1;
        self.bytes += row_bytes;
        Ok(row_bytes)
    }

    fn zero_date(&mut self, i: usize, c: &Civil) -> DResult<()> {
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
        self.cols[i].0.append_null();
        Ok(())
    }

    fn append_value(&mut self, i: usize, v: Value) -> DResult<()> {
        if v == Value::NULL {
            self.cols[i].0.append_null();
            return Ok(());
        }
        let src = self.cols[i].1;
        match &mut self.cols[i].0 {
            Col::Bool(b) => b.append_value(int_of(&v, src)? != 0),
            Col::I8(b) => b.append_value(fits(int_of(&v, src)?, "Int8")?),
            Col::I16(b) => b.append_value(fits(int_of(&v, src)?, "Int16")?),
            Col::I32(b) => b.append_value(fits(int_of(&v, src)?, "Int32")?),
            Col::I64(b) => b.append_value(fits(int_of(&v, src)?, "Int64")?),
            Col::U8(b) => b.append_value(fits(int_of(&v, src)?, "UInt8")?),
            Col::U16(b) => b.append_value(fits(int_of(&v, src)?, "UInt16")?),
            Col::U32(b) => b.append_value(fits(int_of(&v, src)?, "UInt32")?),
            Col::U64(b) => b.append_value(fits(int_of(&v, src)?, "UInt64")?),
            Col::F32(b) => match v {
                Value::Float(f) => b.append_value(f),
                other => b.append_value(float_of(&other)? as f32),
            },
            Col::F64(b) => b.append_value(float_of(&v)?),
            Col::Dec128(b, s) => {
                let s = *s;
                b.append_value(decimal_i128(bytes_of(&v)?, s)?)
            }
            Col::Dec256(b, s) => {
                let s = *s;
                b.append_value(decimal_i256(bytes_of(&v)?, s)?)
            }
            Col::Utf8(b) => match std::str::from_utf8(bytes_of(&v)?) {
                Ok(s) => b.append_value(s),
                Err(e) => return err(format!("text is not valid UTF-8 ({e})")),
            },
            Col::Binary(b) => {
                let bytes = bytes_of(&v)?;
                if src == Source::Geometry {
                    if bytes.len() < 5 {
                        return err("geometry value shorter than its SRID prefix");
                    }
                    let srid = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                    b.append_value(&bytes[4..]);
                    if srid != 0 {
                        *self
                            .adjustments
                            .srids
                            .entry(i)
                            .or_default()
                            .entry(srid)
                            .or_default() += 1;
                    }
                } else {
                    b.append_value(bytes)
                }
            }
            Col::Date(b) => {
                let c = civil_of(&v)?;
                match valid_days(&c) {
                    Some(d) => b.append_value(
                        i32::try_from(d).map_err(|_| DecodeError("date out of range".into()))?,
                    ),
                    None => return self.zero_date(i, &c),
                }
            }
            Col::Ts(b) => {
                let c = civil_of(&v)?;
                match valid_days(&c) {
                    Some(d) => b.append_value(
                        ((d * 24 + c.h as i64) * 60 + c.mi as i64) * 60_000_000
                            + c.s as i64 * 1_000_000
                            + c.us as i64,
                    ),
                    None => return self.zero_date(i, &c),
                }
            }
            Col::Dur(b) => b.append_value(duration_of(&v)?),
        }
        Ok(())
    }

    /// Build a batch from the buffered rows and reset the buffers.
    pub fn finish_batch(&mut self) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let arrays: Vec<ArrayRef> = self.cols.iter_mut().map(|(c, _)| c.finish()).collect();
        let rows = self.rows;
        self.rows = 0;
        self.bytes = 0;
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_from_text_are_exact() {
        assert_eq!(decimal_i128(b"123.45", 2).unwrap(), 12345);
        assert_eq!(decimal_i128(b"-0.005", 3).unwrap(), -5);
        assert_eq!(decimal_i128(b"7", 2).unwrap(), 700);
        assert_eq!(decimal_i128(b"1.50", 1).unwrap(), 15);
        assert!(decimal_i128(b"1.55", 1).is_err());
        assert!(decimal_i128(b"abc", 1).is_err());
        let big = format!("-{}", "9".repeat(65));
        assert!(decimal_i256(big.as_bytes(), 0).is_ok());
        assert!(decimal_i128(big.as_bytes(), 0).is_err());
    }

    #[test]
    fn dates_and_times() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(0, 1, 1), -719_528);
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
