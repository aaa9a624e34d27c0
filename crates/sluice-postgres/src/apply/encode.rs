//! Arrow values → PostgreSQL's binary `COPY` format, for the initial load.
//!
//! Binary is the cheaper format on both ends (no text to print or parse), but a value must be
//! sent in the exact binary form of the *target* column's type. So each column gets an
//! encoder only when its target type (recognised by its send function, which domains share
//! with their base type) and its Arrow type are a pair this file knows; a batch with any other
//! column is loaded in text format instead ([`super::render`]), which every type reads.
//!
//! | target type (send function)                          | Arrow                        |
//! |------------------------------------------------------|------------------------------|
//! | bool                                                 | Boolean                      |
//! | int2 / int4 / int8 / oid                             | integers that fit            |
//! | float4 / float8                                      | Float32 / Float32, Float64   |
//! | numeric                                              | Decimal128 / Decimal256      |
//! | text, varchar, bpchar, name, citext, enums, json     | Utf8                         |
//! | jsonb                                                | Utf8 (version 1 + text)      |
//! | bytea / uuid                                         | Binary / FixedSizeBinary(16) |
//! | date, time, timestamp, timestamptz                   | Date32, Time*, Timestamp*    |
//! | interval                                             | interval struct, Duration    |
//! | one-dimensional arrays of the above                  | List                         |

use super::render::{decimal_digits, temporal};
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, Field, TimeUnit};
use sluice_core::{Error, Result};

/// The binary `COPY` header: signature, flags, header extension length.
pub const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// The binary `COPY` trailer.
pub const TRAILER: &[u8] = &[0xff, 0xff];

/// Microseconds from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
const EPOCH_MICROS: i64 = 946_684_800_000_000;
/// Days from 1970-01-01 to 2000-01-01.
const EPOCH_DAYS: i32 = 10_957;

/// How one column is encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enc {
    /// bool.
    Bool,
    /// int2, int4, int8 or oid: the width in bytes (oid is 4, unsigned).
    Int(u8),
    /// float4.
    F4,
    /// float8.
    F8,
    /// numeric from a decimal of this scale.
    Numeric(i8),
    /// Text-like types: the UTF-8 bytes.
    Text,
    /// jsonb: version byte 1, then the text.
    Jsonb,
    /// bytea.
    Bytea,
    /// uuid.
    Uuid,
    /// date.
    Date,
    /// time.
    Time,
    /// timestamp or timestamptz.
    Timestamp,
    /// interval from the interval struct.
    Interval,
    /// interval from a duration.
    Duration,
    /// A one-dimensional array of the element type (its oid and encoder).
    Array(u32, Box<Enc>),
}

/// What the target's catalog says about a column's type: its send function, and for an array
/// its element type's oid and send function.
#[derive(Debug, Clone)]
pub struct TargetType {
    /// `typsend` of the column's type (for a domain, of its base type).
    pub send: String,
    /// `(typelem, its typsend)` when the type is an array.
    pub elem: Option<(u32, String)>,
}

/// The encoder for an Arrow `field` into a column of type `t`, or `None` when the pair is not
/// one this file knows (the batch is then loaded as text).
pub fn plan(t: &TargetType, field: &Field) -> Option<Enc> {
    use DataType::*;
    let dt = field.data_type();
    let int = |width: u8| -> Option<Enc> {
        let fits = match dt {
            Int8 | Int16 | UInt8 => true,
            Int32 | UInt16 => width >= 4,
            Int64 | UInt32 => width >= 8,
            _ => false,
        };
        fits.then_some(Enc::Int(width))
    };
    match (t.send.as_str(), dt) {
        ("boolsend", Boolean) => Some(Enc::Bool),
        ("int2send", _) => int(2),
        ("int4send", _) => int(4),
        ("int8send", _) => int(8),
        ("oidsend", UInt32) => Some(Enc::Int(4)),
        ("float4send", Float32) => Some(Enc::F4),
        ("float8send", Float32 | Float64) => Some(Enc::F8),
        ("numeric_send", Decimal128(_, s) | Decimal256(_, s)) => Some(Enc::Numeric(*s)),
        (
            "textsend" | "varcharsend" | "bpcharsend" | "namesend" | "enum_send" | "citextsend"
            | "json_send",
            Utf8 | LargeUtf8,
        ) => Some(Enc::Text),
        ("jsonb_send", Utf8 | LargeUtf8) => Some(Enc::Jsonb),
        ("byteasend", Binary | LargeBinary | FixedSizeBinary(_)) => Some(Enc::Bytea),
        ("uuid_send", FixedSizeBinary(16)) => Some(Enc::Uuid),
        ("date_send", Date32) => Some(Enc::Date),
        ("time_send", Time32(_) | Time64(_)) => Some(Enc::Time),
        ("timestamp_send" | "timestamptz_send", Timestamp(..)) => Some(Enc::Timestamp),
        ("interval_send", Struct(_))
            if super::render::Kind::of(field).ok() == Some(super::render::Kind::Interval) =>
        {
            Some(Enc::Interval)
        }
        ("interval_send", Duration(_)) => Some(Enc::Duration),
        ("array_send", List(item)) => {
            let (oid, send) = t.elem.as_ref()?;
            let elem = TargetType {
                send: send.clone(),
                elem: None,
            };
            Some(Enc::Array(*oid, Box::new(plan(&elem, item)?)))
        }
        _ => None,
    }
}

/// Append one field (length and value, or -1 for NULL) of row `i` of `a`.
pub fn field(enc: &Enc, a: &dyn Array, i: usize, out: &mut Vec<u8>) -> Result<()> {
    if a.is_null(i) {
        out.extend_from_slice(&(-1i32).to_be_bytes());
        return Ok(());
    }
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    value(enc, a, i, out)?;
    let len = i32::try_from(out.len() - at - 4)
        .map_err(|_| Error::data("a value is larger than PostgreSQL's 1 GB field limit"))?;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

fn value(enc: &Enc, a: &dyn Array, i: usize, out: &mut Vec<u8>) -> Result<()> {
    match enc {
        Enc::Bool => out.push(u8::from(a.as_boolean().value(i))),
        Enc::Int(width) => {
            let v: i64 = match a.data_type() {
                DataType::Int8 => a.as_primitive::<Int8Type>().value(i).into(),
                DataType::Int16 => a.as_primitive::<Int16Type>().value(i).into(),
                DataType::Int32 => a.as_primitive::<Int32Type>().value(i).into(),
                DataType::UInt8 => a.as_primitive::<UInt8Type>().value(i).into(),
                DataType::UInt16 => a.as_primitive::<UInt16Type>().value(i).into(),
                DataType::UInt32 => a.as_primitive::<UInt32Type>().value(i).into(),
                _ => a.as_primitive::<Int64Type>().value(i),
            };
            match width {
                2 => out.extend_from_slice(&(v as i16).to_be_bytes()),
                // An oid (UInt32) keeps its bits in four bytes.
                4 => out.extend_from_slice(&(v as u32).to_be_bytes()),
                _ => out.extend_from_slice(&v.to_be_bytes()),
            }
        }
        Enc::F4 => out.extend_from_slice(&a.as_primitive::<Float32Type>().value(i).to_be_bytes()),
        Enc::F8 => {
            let v = match a.data_type() {
                DataType::Float32 => f64::from(a.as_primitive::<Float32Type>().value(i)),
                _ => a.as_primitive::<Float64Type>().value(i),
            };
            out.extend_from_slice(&v.to_be_bytes());
        }
        Enc::Numeric(scale) => numeric(&decimal_digits(a, i), *scale, out),
        Enc::Text | Enc::Jsonb => {
            let s = match a.data_type() {
                DataType::LargeUtf8 => a.as_string::<i64>().value(i),
                _ => a.as_string::<i32>().value(i),
            };
            if s.contains('\0') {
                return Err(Error::data(
                    "a text value holds a NUL byte, which PostgreSQL text cannot store; \
                     remove it on the source or leave the column out",
                ));
            }
            if *enc == Enc::Jsonb {
                out.push(1);
            }
            out.extend_from_slice(s.as_bytes());
        }
        Enc::Bytea | Enc::Uuid => out.extend_from_slice(match a.data_type() {
            DataType::LargeBinary => a.as_binary::<i64>().value(i),
            DataType::FixedSizeBinary(_) => a.as_fixed_size_binary().value(i),
            _ => a.as_binary::<i32>().value(i),
        }),
        Enc::Date => {
            let d = a.as_primitive::<Date32Type>().value(i);
            // ±infinity are i32::MAX / MIN in both.
            let pg = match d {
                i32::MAX | i32::MIN => d,
                _ => d.checked_sub(EPOCH_DAYS).ok_or_else(|| range("date"))?,
            };
            out.extend_from_slice(&pg.to_be_bytes());
        }
        Enc::Time => out.extend_from_slice(&micros(a, i)?.to_be_bytes()),
        Enc::Timestamp => {
            let raw = temporal(a, i);
            let us = matches!(a.data_type(), DataType::Timestamp(TimeUnit::Microsecond, _));
            // ±infinity are i64::MAX / MIN in both.
            let pg = if us && (raw == i64::MAX || raw == i64::MIN) {
                raw
            } else {
                micros(a, i)?
                    .checked_sub(EPOCH_MICROS)
                    .ok_or_else(|| range("timestamp"))?
            };
            out.extend_from_slice(&pg.to_be_bytes());
        }
        Enc::Interval => {
            let s = a.as_struct();
            let months = s.column(0).as_primitive::<Int32Type>().value(i);
            let days = s.column(1).as_primitive::<Int32Type>().value(i);
            let us = s.column(2).as_primitive::<Int64Type>().value(i);
            out.extend_from_slice(&us.to_be_bytes());
            out.extend_from_slice(&days.to_be_bytes());
            out.extend_from_slice(&months.to_be_bytes());
        }
        Enc::Duration => {
            out.extend_from_slice(&micros(a, i)?.to_be_bytes());
            out.extend_from_slice(&[0; 8]);
        }
        Enc::Array(oid, elem) => array(*oid, elem, &a.as_list::<i32>().value(i), out)?,
    }
    Ok(())
}

fn range(what: &str) -> Error {
    Error::data(format!(
        "a {what} value is outside the range PostgreSQL can store"
    ))
}

/// A time, timestamp or duration value in microseconds (nanoseconds truncated).
fn micros(a: &dyn Array, i: usize) -> Result<i64> {
    let v = temporal(a, i);
    let unit = match a.data_type() {
        DataType::Time32(u)
        | DataType::Time64(u)
        | DataType::Timestamp(u, _)
        | DataType::Duration(u) => *u,
        _ => TimeUnit::Microsecond,
    };
    match unit {
        TimeUnit::Second => v.checked_mul(1_000_000),
        TimeUnit::Millisecond => v.checked_mul(1_000),
        TimeUnit::Microsecond => Some(v),
        TimeUnit::Nanosecond => Some(v.div_euclid(1_000)),
    }
    .ok_or_else(|| range("time"))
}

/// A one-dimensional array: dimensions, null flag, element type, then the elements.
fn array(oid: u32, elem: &Enc, values: &ArrayRef, out: &mut Vec<u8>) -> Result<()> {
    let n = values.len();
    let dims: i32 = if n == 0 { 0 } else { 1 };
    out.extend_from_slice(&dims.to_be_bytes());
    out.extend_from_slice(&i32::from(values.null_count() > 0).to_be_bytes());
    out.extend_from_slice(&oid.to_be_bytes());
    if n > 0 {
        let len = i32::try_from(n).map_err(|_| range("array"))?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes());
    }
    for j in 0..n {
        field(elem, values.as_ref(), j, out)?;
    }
    Ok(())
}

/// numeric's binary form from the unscaled integer's decimal `digits` and the `scale`: base
/// 10000 digits, the weight of the first, the sign and the display scale.
pub(crate) fn numeric(digits: &str, scale: i8, out: &mut Vec<u8>) {
    let (neg, d) = match digits.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, digits),
    };
    let s = usize::from(scale.max(0).unsigned_abs());
    let mut int = String::new();
    let mut frac = String::new();
    if scale <= 0 {
        int.push_str(d);
        int.extend(std::iter::repeat_n('0', usize::from(scale.unsigned_abs())));
    } else if d.len() > s {
        int.push_str(&d[..d.len() - s]);
        frac.push_str(&d[d.len() - s..]);
    } else {
        frac.extend(std::iter::repeat_n('0', s - d.len()));
        frac.push_str(d);
    }
    let int = int.trim_start_matches('0');
    let group = |chunk: &[u8]| -> i16 {
        chunk
            .iter()
            .fold(0i16, |acc, b| acc * 10 + i16::from(b - b'0'))
    };
    let mut groups: Vec<i16> = Vec::new();
    let lead = (4 - int.len() % 4) % 4;
    let padded_int = format!("{}{int}", "0".repeat(lead));
    groups.extend(padded_int.as_bytes().chunks(4).map(group));
    let mut weight = groups.len() as i16 - 1;
    let tail = (4 - frac.len() % 4) % 4;
    let padded_frac = format!("{frac}{}", "0".repeat(tail));
    groups.extend(padded_frac.as_bytes().chunks(4).map(group));
    let first = groups.iter().position(|g| *g != 0).unwrap_or(groups.len());
    groups.drain(..first);
    weight -= first as i16;
    while groups.last() == Some(&0) {
        groups.pop();
    }
    let sign: u16 = if neg && !groups.is_empty() { 0x4000 } else { 0 };
    if groups.is_empty() {
        weight = 0;
    }
    out.extend_from_slice(&(groups.len() as i16).to_be_bytes());
    out.extend_from_slice(&weight.to_be_bytes());
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&(s as i16).to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(digits: &str, scale: i8) -> Vec<i16> {
        let mut o = Vec::new();
        numeric(digits, scale, &mut o);
        o.chunks(2)
            .map(|c| i16::from_be_bytes([c[0], c[1]]))
            .collect()
    }

    #[test]
    fn numerics_in_base_10000() {
        // ndigits, weight, sign, dscale, digits…
        assert_eq!(num("12345", 2), [2, 0, 0, 2, 123, 4500]);
        assert_eq!(num("-5", 3), [1, -1, 0x4000, 3, 50]);
        assert_eq!(num("0", 2), [0, 0, 0, 2]);
        assert_eq!(num("7", -2), [1, 0, 0, 0, 700]);
        assert_eq!(num("100000000", 0), [1, 2, 0, 0, 1]);
        assert_eq!(num("123456789012", 10), [4, 0, 0, 10, 12, 3456, 7890, 1200]);
    }

    #[test]
    fn only_known_pairs_are_planned() {
        let t = |send: &str| TargetType {
            send: send.into(),
            elem: None,
        };
        let f = |dt| Field::new("c", dt, true);
        assert_eq!(plan(&t("int4send"), &f(DataType::Int32)), Some(Enc::Int(4)));
        assert_eq!(plan(&t("int2send"), &f(DataType::Int32)), None);
        assert_eq!(plan(&t("int8send"), &f(DataType::UInt64)), None);
        assert_eq!(plan(&t("inet_send"), &f(DataType::Utf8)), None);
        assert_eq!(plan(&t("cash_send"), &f(DataType::Decimal128(19, 2))), None);
        let arr = TargetType {
            send: "array_send".into(),
            elem: Some((23, "int4send".into())),
        };
        let list = DataType::List(std::sync::Arc::new(Field::new(
            "item",
            DataType::Int32,
            true,
        )));
        assert_eq!(
            plan(&arr, &f(list)),
            Some(Enc::Array(23, Box::new(Enc::Int(4))))
        );
    }
}
