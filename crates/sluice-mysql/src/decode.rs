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
use std::collections::BTreeMap;

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

/// Source facts that change how bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Plain,
    /// `bit(n)`: big-endian bytes.
    Bit,
    /// Geometry: SRID (u32 LE) + WKB.
    Geometry,
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

fn own(e: sluice_core::Error) -> DecodeError {
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
            Conv::Dec128(s) => col.push_i128(decimal_i128(bytes_of(&v)?, s)?),
            Conv::Dec256(s) => col.push_i256(decimal_i256(bytes_of(&v)?, s)?),
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
                    Some(d) => col.push_i64(
                        ((d * 24 + c.h as i64) * 60 + c.mi as i64) * 60_000_000
                            + c.s as i64 * 1_000_000
                            + c.us as i64,
                    ),
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
