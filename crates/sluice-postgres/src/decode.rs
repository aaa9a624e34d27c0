//! Binary COPY → Arrow, straight from the wire bytes.
//!
//! `COPY … TO STDOUT (FORMAT binary)` sends a header, then one tuple per row: a field count,
//! then per field a length (-1 for NULL) and the value in the type's binary send format. The
//! [`TupleDecoder`] appends each value directly into a column builder: no per-row or per-value
//! heap allocation, no intermediate row type. Tuples are usually one per CopyData message, but
//! the protocol does not promise it, so a tuple split across messages is carried over.
//!
//! Longer than 500 lines: one decoder per binary wire format (numerics, arrays, intervals,
//! times) with the unit tests that pin each format down; split, the formats would scatter.
//!
//! Which decoder a column gets follows from its Arrow type alone (see `types.rs`): every column
//! that is cast when read is cast to a type whose binary form is what its Arrow type expects.

use arrow_array::RecordBatch;
use arrow_buffer::i256;
use arrow_schema::{DataType, Field, SchemaRef, TimeUnit};
use sluice_core::columns::{BatchBuilder, ColumnBuilder};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Microseconds in a day. PostgreSQL's `time` reaches `24:00:00` (this value); Arrow's Time64
/// ends one microsecond before it.
const DAY_MICROS: i64 = 86_400_000_000;

/// Days from 1970-01-01 (Arrow's epoch) to 2000-01-01 (PostgreSQL's).
const PG_EPOCH_DAYS: i32 = 10_957;
/// Microseconds from 1970-01-01 to 2000-01-01.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
/// The binary COPY signature.
const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";

/// A value that could not be decoded. The reader adds the column and row position.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeError(pub String);

type DResult<T> = Result<T, DecodeError>;

fn err<T>(msg: impl Into<String>) -> DResult<T> {
    Err(DecodeError(msg.into()))
}

fn fixed<const N: usize>(v: &[u8]) -> DResult<[u8; N]> {
    v.try_into()
        .map_err(|_| DecodeError(format!("expected {N} bytes, got {}", v.len())))
}

/// How a column's wire value becomes its native value; chosen by Arrow type.
#[derive(Debug)]
enum Wire {
    Bool,
    I16,
    I32,
    I64,
    Oid,
    F32,
    F64,
    /// Text, binary, json: the bytes as they are (text is validated per batch).
    Bytes,
    Uuid,
    Date,
    Time,
    Timestamp,
    Dec128(i8),
    Dec256(i8),
    Interval,
    List(Box<Wire>),
}

impl Wire {
    fn for_type(dt: &DataType) -> DResult<Wire> {
        Ok(match dt {
            DataType::Boolean => Wire::Bool,
            DataType::Int16 => Wire::I16,
            DataType::Int32 => Wire::I32,
            DataType::Int64 => Wire::I64,
            DataType::UInt32 => Wire::Oid,
            DataType::Float32 => Wire::F32,
            DataType::Float64 => Wire::F64,
            DataType::Utf8 | DataType::Binary => Wire::Bytes,
            DataType::FixedSizeBinary(16) => Wire::Uuid,
            DataType::Date32 => Wire::Date,
            DataType::Time64(TimeUnit::Microsecond) => Wire::Time,
            DataType::Timestamp(TimeUnit::Microsecond, _) => Wire::Timestamp,
            DataType::Decimal128(_, s) => Wire::Dec128(*s),
            DataType::Decimal256(_, s) => Wire::Dec256(*s),
            DataType::Struct(f) if f.len() == 3 && f[0].name() == "months" => Wire::Interval,
            DataType::List(item) => Wire::List(Box::new(Wire::for_type(item.data_type())?)),
            other => return err(format!("no binary decoder for Arrow type {other}")),
        })
    }

    /// Arrow bytes per value besides variable-length data, and whether the type has
    /// variable-length data (counted from the wire length).
    fn width(&self) -> (usize, bool) {
        match self {
            Wire::Bool => (1, false),
            Wire::I16 => (2, false),
            Wire::I32 | Wire::Oid | Wire::F32 | Wire::Date => (4, false),
            Wire::I64 | Wire::F64 | Wire::Time | Wire::Timestamp => (8, false),
            Wire::Uuid | Wire::Dec128(_) | Wire::Interval => (16, false),
            Wire::Dec256(_) => (32, false),
            // Offsets, plus the data itself (≈ its wire length).
            Wire::Bytes | Wire::List(_) => (4, true),
        }
    }

    /// Decode one non-NULL value into `col`.
    #[inline]
    fn append(&self, col: &mut ColumnBuilder, v: &[u8]) -> DResult<()> {
        let r = match self {
            Wire::Bool => col.push_bool(fixed::<1>(v)?[0] != 0),
            Wire::I16 => col.push_i16(i16::from_be_bytes(fixed(v)?)),
            Wire::I32 => col.push_i32(i32::from_be_bytes(fixed(v)?)),
            Wire::I64 => col.push_i64(i64::from_be_bytes(fixed(v)?)),
            Wire::Oid => col.push_u32(u32::from_be_bytes(fixed(v)?)),
            Wire::F32 => col.push_f32(f32::from_be_bytes(fixed(v)?)),
            Wire::F64 => col.push_f64(f64::from_be_bytes(fixed(v)?)),
            Wire::Bytes => col.push_bytes(v),
            Wire::Uuid => col.push_bytes(&fixed::<16>(v)?),
            Wire::Date => col.push_i32(date(i32::from_be_bytes(fixed(v)?))),
            Wire::Time => col.push_i64(time(i64::from_be_bytes(fixed(v)?))),
            Wire::Timestamp => col.push_i64(timestamp(i64::from_be_bytes(fixed(v)?))?),
            Wire::Dec128(scale) => col.push_i128(numeric_to_i128(v, *scale)?),
            Wire::Dec256(scale) => col.push_i256(numeric_to_i256(v, *scale)?),
            Wire::Interval => {
                let raw = fixed::<16>(v)?;
                let children = col
                    .struct_children()
                    .ok_or_else(|| DecodeError("interval column is not a struct".into()))?;
                let months = i32::from_be_bytes(fixed(&raw[12..16])?);
                let days = i32::from_be_bytes(fixed(&raw[8..12])?);
                let micros = i64::from_be_bytes(fixed(&raw[0..8])?);
                children[0].push_i32(months).map_err(own)?;
                children[1].push_i32(days).map_err(own)?;
                children[2].push_i64(micros).map_err(own)?;
                col.push_struct_valid();
                Ok(())
            }
            Wire::List(item) => {
                let items = col
                    .list_items()
                    .ok_or_else(|| DecodeError("array column is not a list".into()))?;
                decode_array(v, item, items)?;
                col.push_list_end()
            }
        };
        r.map_err(own)
    }
}

/// A builder error as a decode error.
fn own(e: sluice_core::Error) -> DecodeError {
    DecodeError(e.message().to_string())
}

/// PostgreSQL date (days since 2000-01-01, ±infinity as i32 extremes) → Date32.
fn date(days: i32) -> i32 {
    match days {
        i32::MAX | i32::MIN => days,
        d => d + PG_EPOCH_DAYS,
    }
}

/// PostgreSQL time (µs since midnight, up to and including `24:00:00`) → Time64(µs), whose
/// range ends at `23:59:59.999999`: `24:00:00` becomes `23:59:59.999999` (the latest time
/// Arrow can hold, one microsecond earlier), and the report counts such values per column.
/// Why not NULL or an error: the value is a real end-of-day time; the nearest representable
/// time keeps its meaning (and its order), as ±infinity timestamps become the type's extremes.
fn time(us: i64) -> i64 {
    us.clamp(0, DAY_MICROS - 1)
}

/// How many values of `v` (a value of `wire`) [`time`] moves: `24:00:00`s.
fn midnights(wire: &Wire, v: &[u8]) -> u64 {
    match wire {
        Wire::Time => u64::from(v.len() == 8 && v == DAY_MICROS.to_be_bytes()),
        Wire::List(item) if matches!(**item, Wire::Time) => {
            // One-dimensional array: 20 header bytes, then (length, value) pairs.
            let mut n = 0;
            let mut at = 20;
            while at + 4 <= v.len() {
                let len = i32::from_be_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
                at += 4;
                if len == 8 && v.get(at..at + 8) == Some(&DAY_MICROS.to_be_bytes()[..]) {
                    n += 1;
                }
                at += len.max(0) as usize;
            }
            n
        }
        _ => 0,
    }
}

/// Values the decoder had to change to fit their Arrow type (today: `time '24:00:00'`), counted
/// per dataset and column by every reader of a run and reported by its coordinator.
#[derive(Debug, Clone, Default)]
pub struct Findings(Arc<Mutex<BTreeMap<(String, String), u64>>>);

impl Findings {
    /// Count `n` values of `column` in `dataset`.
    pub fn add(&self, dataset: &str, column: &str, n: u64) {
        if n == 0 {
            return;
        }
        if let Ok(mut m) = self.0.lock() {
            *m.entry((dataset.to_string(), column.to_string()))
                .or_default() += n;
        }
    }

    /// One report line per column.
    pub fn notes(&self) -> Vec<String> {
        let Ok(m) = self.0.lock() else {
            return Vec::new();
        };
        m.iter()
            .map(|((ds, col), n)| {
                format!(
                    "{ds}.{col}: {n} time value(s) 24:00:00 written as 23:59:59.999999 (Arrow's \
                     time of day ends one microsecond before midnight)"
                )
            })
            .collect()
    }
}

/// PostgreSQL timestamp (µs since 2000-01-01, ±infinity as i64 extremes) → µs since 1970.
fn timestamp(us: i64) -> DResult<i64> {
    match us {
        i64::MAX | i64::MIN => Ok(us),
        t => t.checked_add(PG_EPOCH_MICROS).ok_or_else(|| {
            DecodeError("timestamp is beyond the range of a 64-bit microsecond timestamp".into())
        }),
    }
}

/// Parsed header of a binary numeric: digits are base 10000, most significant first.
struct NumericParts<'a> {
    digits: &'a [u8],
    weight: i32,
    negative: bool,
}

fn numeric_parts(v: &[u8]) -> DResult<NumericParts<'_>> {
    if v.len() < 8 {
        return err("numeric value shorter than its header");
    }
    let ndigits = u16::from_be_bytes([v[0], v[1]]) as usize;
    let weight = i16::from_be_bytes([v[2], v[3]]) as i32;
    let sign = u16::from_be_bytes([v[4], v[5]]);
    let digits = &v[8..];
    if digits.len() != ndigits * 2 {
        return err("numeric digit count does not match its length");
    }
    match sign {
        0x0000 => Ok(NumericParts {
            digits,
            weight,
            negative: false,
        }),
        0x4000 => Ok(NumericParts {
            digits,
            weight,
            negative: true,
        }),
        0xC000 => err("NaN cannot be stored in a decimal column"),
        0xD000 | 0xF000 => err("Infinity cannot be stored in a decimal column"),
        s => err(format!("unknown numeric sign {s:#x}")),
    }
}

/// Convert base-10000 digits into an integer scaled by 10^scale, generically over i128/i256.
///
/// Digit group `i` is worth `d × 10^(4 × (weight − i))`; scaled, `d × 10^e` with
/// `e = 4 × (weight − i) + scale`. Horner's scheme runs over the groups that carry digits at or
/// above the scale; a group straddling it contributes only its leading digits (the rest must
/// be zero), and groups wholly below it must be zero — so no intermediate ever exceeds the
/// final value's magnitude, and nothing is silently rounded.
macro_rules! numeric_to {
    ($name:ident, $t:ty, $from:expr, $zero:expr) => {
        fn $name(v: &[u8], scale: i8) -> DResult<$t> {
            let overflow =
                || DecodeError("numeric value does not fit the column's precision".into());
            let too_fine = || {
                DecodeError("numeric value has more fraction digits than the column's scale".into())
            };
            let p = numeric_parts(v)?;
            let pow10 = |n: i32| -> DResult<$t> {
                let mut x: $t = $from(1);
                for _ in 0..n {
                    x = x.checked_mul($from(10)).ok_or_else(overflow)?;
                }
                Ok(x)
            };
            let mut acc: $t = $zero;
            let mut last_e: Option<i32> = None;
            for (i, pair) in p.digits.chunks_exact(2).enumerate() {
                let d = u16::from_be_bytes([pair[0], pair[1]]) as i128;
                let e = 4 * (p.weight - i as i32) + scale as i32;
                if e <= -4 {
                    if d != 0 {
                        return Err(too_fine());
                    }
                    continue;
                }
                let (step, add, e_after) = if e < 0 {
                    let q = 10i128.pow((-e) as u32);
                    if d % q != 0 {
                        return Err(too_fine());
                    }
                    (4 + e, d / q, 0)
                } else {
                    (4, d, e)
                };
                acc = acc
                    .checked_mul(pow10(step)?)
                    .and_then(|a| a.checked_add($from(add)))
                    .ok_or_else(overflow)?;
                last_e = Some(e_after);
            }
            if let Some(e) = last_e {
                acc = acc.checked_mul(pow10(e)?).ok_or_else(overflow)?;
            }
            Ok(if p.negative {
                acc.checked_neg().ok_or_else(overflow)?
            } else {
                acc
            })
        }
    };
}
numeric_to!(numeric_to_i128, i128, |x: i128| x, 0i128);
numeric_to!(numeric_to_i256, i256, i256::from_i128, i256::ZERO);

/// Decode a one-dimensional binary array, pushing its items into `items`.
fn decode_array(v: &[u8], item: &Wire, items: &mut ColumnBuilder) -> DResult<()> {
    let int = |at: usize| -> DResult<i32> {
        v.get(at..at + 4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| DecodeError("array header is truncated".into()))
    };
    let ndim = int(0)?;
    if ndim == 0 {
        return Ok(());
    }
    if ndim != 1 {
        return err(format!(
            "a {ndim}-dimensional array was found; sluice exports one-dimensional arrays as \
             lists. Export this column as text (cast it in a view or --query)"
        ));
    }
    let len = usize::try_from(int(12)?).map_err(|_| DecodeError("negative array size".into()))?;
    let mut at = 20;
    for _ in 0..len {
        let n = int(at)?;
        at += 4;
        if n < 0 {
            items.push_null();
        } else {
            let end = at + n as usize;
            let el = v
                .get(at..end)
                .ok_or_else(|| DecodeError("array element is truncated".into()))?;
            item.append(items, el)?;
            at = end;
        }
    }
    Ok(())
}

/// Outcome of feeding bytes to the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fed {
    /// More data expected.
    More,
    /// The end-of-data marker was seen.
    Done,
}

/// Decodes a binary COPY stream into record batches of one schema.
pub struct TupleDecoder {
    batch: BatchBuilder,
    wires: Vec<Wire>,
    header_seen: bool,
    carry: Vec<u8>,
    bytes: usize,
    /// Arrow bytes per row besides variable-length data.
    fixed_row_bytes: usize,
    /// Which columns have variable-length data.
    variable: Vec<bool>,
    /// Index of the column whose value failed, for the error message.
    failed_column: Option<usize>,
    /// Per column, values changed to fit the Arrow type (see [`time`]).
    adjusted: Vec<u64>,
    /// Whether a column's values can be changed at all.
    adjustable: Vec<bool>,
}

impl TupleDecoder {
    /// A decoder for rows of `schema`.
    pub fn new(schema: SchemaRef) -> DResult<Self> {
        let wires = schema
            .fields()
            .iter()
            .map(|f| Wire::for_type(f.data_type()))
            .collect::<DResult<Vec<_>>>()?;
        let widths: Vec<(usize, bool)> = wires.iter().map(Wire::width).collect();
        let batch = BatchBuilder::new(schema, 1024).map_err(own)?;
        Ok(TupleDecoder {
            batch,
            header_seen: false,
            carry: Vec::new(),
            bytes: 0,
            fixed_row_bytes: widths.iter().map(|w| w.0).sum(),
            variable: widths.iter().map(|w| w.1).collect(),
            failed_column: None,
            adjusted: vec![0; wires.len()],
            adjustable: wires
                .iter()
                .map(|w| match w {
                    Wire::Time => true,
                    Wire::List(item) => matches!(**item, Wire::Time),
                    _ => false,
                })
                .collect(),
            wires,
        })
    }

    /// Per column index, values changed to fit the Arrow type so far.
    pub fn adjusted(&self) -> &[u64] {
        &self.adjusted
    }

    /// Rows buffered since the last [`TupleDecoder::finish_batch`].
    pub fn rows(&self) -> usize {
        self.batch.rows()
    }

    /// Arrow bytes buffered since the last batch: the batch's size in memory (values, offsets
    /// and variable-length data; validity bits are not counted).
    pub fn buffered_bytes(&self) -> usize {
        self.bytes
    }

    /// The column whose value failed to decode last.
    pub fn failed_column(&self) -> Option<&Field> {
        self.failed_column.map(|i| self.batch.schema().field(i))
    }

    /// Feed one CopyData message.
    pub fn feed(&mut self, data: &[u8]) -> DResult<Fed> {
        if self.carry.is_empty() {
            let (used, fed) = self.parse(data)?;
            if fed == Fed::More && used < data.len() {
                self.carry.extend_from_slice(&data[used..]);
            }
            return Ok(fed);
        }
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(data);
        let (used, fed) = self.parse(&buf)?;
        if fed == Fed::More && used < buf.len() {
            buf.drain(..used);
            self.carry = buf;
        }
        Ok(fed)
    }

    /// True when bytes of an incomplete tuple are waiting for more data.
    pub fn has_partial(&self) -> bool {
        !self.carry.is_empty()
    }

    /// Parse as many complete items as `buf` holds; return bytes consumed.
    fn parse(&mut self, buf: &[u8]) -> DResult<(usize, Fed)> {
        let mut at = 0;
        if !self.header_seen {
            if buf.len() < 19 {
                return Ok((0, Fed::More));
            }
            if &buf[..11] != SIGNATURE {
                return err("the COPY stream does not start with the binary signature");
            }
            let ext = u32::from_be_bytes([buf[15], buf[16], buf[17], buf[18]]) as usize;
            if buf.len() < 19 + ext {
                return Ok((0, Fed::More));
            }
            at = 19 + ext;
            self.header_seen = true;
        }
        let ncols = self.wires.len();
        while at + 2 <= buf.len() {
            let nfields = i16::from_be_bytes([buf[at], buf[at + 1]]);
            if nfields == -1 {
                return Ok((at + 2, Fed::Done));
            }
            if nfields as usize != ncols {
                return err(format!("a row has {nfields} fields, expected {ncols}"));
            }
            // Check the tuple is complete before appending anything, so a split tuple is
            // never half-appended.
            let start = at;
            let mut p = at + 2;
            for _ in 0..ncols {
                if p + 4 > buf.len() {
                    return Ok((start, Fed::More));
                }
                let len = i32::from_be_bytes([buf[p], buf[p + 1], buf[p + 2], buf[p + 3]]);
                p += 4 + len.max(0) as usize;
                if p > buf.len() {
                    return Ok((start, Fed::More));
                }
            }
            let mut q = at + 2;
            let mut var_bytes = 0;
            let columns = self.batch.columns();
            for (i, (col, wire)) in columns.iter_mut().zip(&self.wires).enumerate() {
                let len = i32::from_be_bytes([buf[q], buf[q + 1], buf[q + 2], buf[q + 3]]);
                q += 4;
                if len < 0 {
                    col.push_null();
                } else {
                    let end = q + len as usize;
                    if let Err(e) = wire.append(col, &buf[q..end]) {
                        self.failed_column = Some(i);
                        return Err(e);
                    }
                    if self.adjustable[i] {
                        self.adjusted[i] += midnights(wire, &buf[q..end]);
                    }
                    if self.variable[i] {
                        var_bytes += len as usize;
                    }
                    q = end;
                }
            }
            self.batch.row_done();
            self.bytes += self.fixed_row_bytes + var_bytes;
            at = p;
        }
        Ok((at, Fed::More))
    }

    /// Build a batch from the buffered rows. The builders keep their memory; hand the batch
    /// back with [`TupleDecoder::recycle`] once written to reuse its memory too.
    pub fn finish_batch(&mut self) -> sluice_core::Result<RecordBatch> {
        self.bytes = 0;
        self.batch.finish()
    }

    /// Take back the memory of a written batch.
    pub fn recycle(&mut self, batch: RecordBatch) {
        self.batch.recycle(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use arrow_schema::Schema;
    use std::sync::Arc;

    fn numeric_bytes(ndigits: &[u16], weight: i16, sign: u16, dscale: u16) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend((ndigits.len() as u16).to_be_bytes());
        v.extend(weight.to_be_bytes());
        v.extend(sign.to_be_bytes());
        v.extend(dscale.to_be_bytes());
        for d in ndigits {
            v.extend(d.to_be_bytes());
        }
        v
    }

    #[test]
    fn midnight_becomes_the_last_microsecond_and_is_counted() {
        assert_eq!(time(DAY_MICROS), DAY_MICROS - 1);
        assert_eq!(time(0), 0);
        assert_eq!(time(45_000_000), 45_000_000);
        assert_eq!(midnights(&Wire::Time, &DAY_MICROS.to_be_bytes()), 1);
        assert_eq!(midnights(&Wire::Time, &1i64.to_be_bytes()), 0);
        // time[] '{24:00:00,NULL,01:00:00}'
        let mut v = Vec::new();
        for x in [1i32, 0, 1083, 3, 1] {
            v.extend(x.to_be_bytes());
        }
        v.extend(8i32.to_be_bytes());
        v.extend(DAY_MICROS.to_be_bytes());
        v.extend((-1i32).to_be_bytes());
        v.extend(8i32.to_be_bytes());
        v.extend(3_600_000_000i64.to_be_bytes());
        assert_eq!(midnights(&Wire::List(Box::new(Wire::Time)), &v), 1);
        let f = Findings::default();
        f.add("public.t", "c", 2);
        f.add("public.t", "c", 1);
        assert!(f.notes()[0].starts_with("public.t.c: 3 time value(s) 24:00:00"));
    }

    #[test]
    fn numerics_rescale_exactly() {
        // 1234.5 = digits [1234, 5000], weight 0.
        let v = numeric_bytes(&[1234, 5000], 0, 0, 1);
        assert_eq!(numeric_to_i128(&v, 2).unwrap(), 123450);
        assert_eq!(numeric_to_i128(&v, 1).unwrap(), 12345);
        // -0.0001 = digits [1], weight -1.
        let v = numeric_bytes(&[1], -1, 0x4000, 4);
        assert_eq!(numeric_to_i128(&v, 4).unwrap(), -1);
        // 12300 stored for numeric(5,-2) = digits [1, 2300], weight 1.
        let v = numeric_bytes(&[1, 2300], 1, 0, 0);
        assert_eq!(numeric_to_i128(&v, 0).unwrap(), 12300);
        // 38 digits with fraction groups padded past the scale still fit i128.
        let v = numeric_bytes(
            &[9999, 9999, 9999, 9999, 9999, 9999, 9999, 9999, 9999, 9900],
            6,
            0x4000,
            10,
        );
        assert_eq!(numeric_to_i128(&v, 10).unwrap(), -(10i128.pow(38) - 1));
        // Zero has no digits.
        assert_eq!(numeric_to_i128(&numeric_bytes(&[], 0, 0, 2), 2).unwrap(), 0);
        // NaN is refused with a reason.
        assert!(
            numeric_to_i128(&numeric_bytes(&[], 0, 0xC000, 0), 2)
                .unwrap_err()
                .0
                .contains("NaN")
        );
        // Too many fraction digits for the scale is an error, not a silent rounding.
        let v = numeric_bytes(&[1234, 5678], 0, 0, 4);
        assert!(numeric_to_i128(&v, 2).is_err());
        // 10^40 overflows i128 with scale 0 only past 38 digits; i256 holds it.
        let big = numeric_bytes(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 10, 0, 0);
        assert_eq!(
            numeric_to_i256(&big, 0).unwrap(),
            i256::from_i128(10i128.pow(20)).wrapping_mul(i256::from_i128(10i128.pow(20)))
        );
    }

    fn tuple(fields: &[Option<&[u8]>]) -> Vec<u8> {
        let mut v = (fields.len() as i16).to_be_bytes().to_vec();
        for f in fields {
            match f {
                None => v.extend((-1i32).to_be_bytes()),
                Some(b) => {
                    v.extend((b.len() as i32).to_be_bytes());
                    v.extend(*b);
                }
            }
        }
        v
    }

    #[test]
    fn split_tuples_and_trailer() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Utf8, true),
        ]));
        let mut d = TupleDecoder::new(schema).unwrap();
        let mut stream = SIGNATURE.to_vec();
        stream.extend([0u8; 8]);
        stream.extend(tuple(&[
            Some(&7i32.to_be_bytes()),
            Some("héllo".as_bytes()),
        ]));
        stream.extend(tuple(&[None, None]));
        stream.extend((-1i16).to_be_bytes());
        // Feed in awkward 3-byte pieces.
        let mut last = Fed::More;
        for piece in stream.chunks(3) {
            last = d.feed(piece).unwrap();
        }
        assert_eq!(last, Fed::Done);
        let batch = d.finish_batch().unwrap();
        assert_eq!(batch.num_rows(), 2);
        let a = batch.column(0).as_primitive::<Int32Type>();
        assert_eq!(a.value(0), 7);
        assert!(a.is_null(1));
        assert_eq!(batch.column(1).as_string::<i32>().value(0), "héllo");
    }

    #[test]
    fn epochs_and_infinity() {
        assert_eq!(date(0), PG_EPOCH_DAYS);
        assert_eq!(date(i32::MAX), i32::MAX);
        assert_eq!(timestamp(0).unwrap(), PG_EPOCH_MICROS);
        assert_eq!(timestamp(i64::MIN).unwrap(), i64::MIN);
    }
}
