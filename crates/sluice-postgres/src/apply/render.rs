//! Arrow values → PostgreSQL input text: the SQL literals of the apply statements and the
//! fields of the bulk load's text `COPY`.
//!
//! Every value is written as the text PostgreSQL's input function of the column's type reads,
//! then quoted for where it goes: a SQL string literal (an *unknown*-typed constant, which
//! PostgreSQL resolves to the column's own type, so one rendering serves every target type) or a
//! `COPY` text field. One table per Arrow type the exports produce:
//!
//! | Arrow (extension)                       | text                                   |
//! |-----------------------------------------|----------------------------------------|
//! | Boolean                                 | `t` / `f`                              |
//! | Int*, UInt*                             | decimal                                |
//! | Float32 / Float64                       | shortest round-trip decimal, `NaN`, `Infinity`, `-Infinity` |
//! | Decimal128 / Decimal256 (p, s)          | exact decimal                          |
//! | Utf8 (JSON, text fallbacks too)         | as is (a NUL byte is refused: PostgreSQL text cannot hold it) |
//! | Binary, FixedSizeBinary                 | `\x` + hex (bytea's hex format)        |
//! | FixedSizeBinary(16) + `arrow.uuid`      | `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` |
//! | Date32 (i32::MAX / MIN)                 | `YYYY-MM-DD` (`… BC`), `infinity` / `-infinity` |
//! | Time32 / Time64                         | `HH:MM:SS.ffffff` (`24:00:00` kept)    |
//! | Timestamp (i64::MAX / MIN at µs)        | `YYYY-MM-DD HH:MM:SS.ffffff[+00][ BC]`, `±infinity` |
//! | Duration (MySQL `time`)                 | `[-]H:MM:SS.ffffff` (an interval)      |
//! | Struct{months, days, microseconds} (`sluice.interval`) | `M mons D days [-]H:MM:SS.ffffff` |
//! | List(element)                           | array literal `{"…","…",NULL}`         |
//!
//! Length: about 470 lines of code plus unit tests: one writer per Arrow type family, kept
//! beside the table above.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef};
use arrow_schema::extension::{ExtensionType, Uuid};
use arrow_schema::{DataType, Field, TimeUnit};
use sluice_core::{Error, Result};
use std::fmt::Write;

/// How one column's values are written, worked out once per column from its Arrow field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Boolean.
    Bool,
    /// Any integer type.
    Int,
    /// Float32 or Float64.
    Float,
    /// A decimal with this scale.
    Decimal(i8),
    /// Utf8 / LargeUtf8.
    Text,
    /// Binary / LargeBinary / FixedSizeBinary as bytea hex.
    Bytes,
    /// FixedSizeBinary(16) with the uuid extension.
    Uuid,
    /// Date32 / Date64.
    Date,
    /// Time of day.
    Time(TimeUnit),
    /// A timestamp; true with a time zone.
    Timestamp(TimeUnit, bool),
    /// A signed duration (an interval of hours, minutes and seconds).
    Duration(TimeUnit),
    /// The interval struct.
    Interval,
    /// A one-dimensional array of the element kind.
    List(Box<Kind>),
}

impl Kind {
    /// The kind of `field`, or an error naming the type when no rendering exists.
    pub fn of(field: &Field) -> Result<Kind> {
        Ok(match field.data_type() {
            DataType::Boolean => Kind::Bool,
            t if t.is_integer() => Kind::Int,
            DataType::Float32 | DataType::Float64 => Kind::Float,
            DataType::Decimal128(_, s) | DataType::Decimal256(_, s) => Kind::Decimal(*s),
            DataType::Utf8 | DataType::LargeUtf8 => Kind::Text,
            DataType::FixedSizeBinary(16) if is_uuid(field) => Kind::Uuid,
            DataType::Binary | DataType::LargeBinary | DataType::FixedSizeBinary(_) => Kind::Bytes,
            DataType::Date32 => Kind::Date,
            DataType::Time32(u) | DataType::Time64(u) => Kind::Time(*u),
            DataType::Timestamp(u, tz) => Kind::Timestamp(*u, tz.is_some()),
            DataType::Duration(u) => Kind::Duration(*u),
            DataType::Struct(f)
                if f.len() == 3
                    && f[0].name() == "months"
                    && f[1].name() == "days"
                    && f[2].name() == "microseconds"
                    && f[0].data_type() == &DataType::Int32
                    && f[1].data_type() == &DataType::Int32
                    && f[2].data_type() == &DataType::Int64 =>
            {
                Kind::Interval
            }
            DataType::List(item) => Kind::List(Box::new(Kind::of(item)?)),
            other => {
                return Err(Error::data(format!(
                    "column {} has Arrow type {other}, which sluice cannot write to PostgreSQL",
                    field.name()
                )));
            }
        })
    }
}

fn is_uuid(field: &Field) -> bool {
    field.extension_type_name() == Some(Uuid::NAME)
}

/// Write the input text of row `i` of `a` to `out`; false (nothing written) for NULL.
pub fn text(kind: &Kind, a: &dyn Array, i: usize, out: &mut String) -> Result<bool> {
    if a.is_null(i) {
        return Ok(false);
    }
    match kind {
        Kind::Bool => out.push_str(if a.as_boolean().value(i) { "t" } else { "f" }),
        Kind::Int => int(a, i, out),
        Kind::Float => float(a, i, out),
        Kind::Decimal(s) => decimal(&decimal_digits(a, i), *s, out),
        Kind::Text => out.push_str(text_value(a, i)?),
        Kind::Bytes => {
            let b = bytes_value(a, i);
            out.push_str("\\x");
            hex(b, out);
        }
        Kind::Uuid => {
            let b = a.as_fixed_size_binary().value(i);
            for (n, x) in b.iter().enumerate() {
                if matches!(n, 4 | 6 | 8 | 10) {
                    out.push('-');
                }
                let _ = write!(out, "{x:02x}");
            }
        }
        Kind::Date => date(a.as_primitive::<Date32Type>().value(i), out)?,
        Kind::Time(u) => {
            let (secs, frac) = split(temporal(a, i), *u);
            let _ = write!(
                out,
                "{:02}:{:02}:{:02}.{frac:09}",
                secs / 3600,
                secs / 60 % 60,
                secs % 60
            );
        }
        Kind::Timestamp(u, tz) => {
            timestamp(temporal(a, i), *u, *tz, out)?;
        }
        Kind::Duration(u) => {
            clock(temporal(a, i), *u, out);
        }
        Kind::Interval => {
            let s = a.as_struct();
            let months = s.column(0).as_primitive::<Int32Type>().value(i);
            let days = s.column(1).as_primitive::<Int32Type>().value(i);
            let micros = s.column(2).as_primitive::<Int64Type>().value(i);
            let _ = write!(out, "{months} mons {days} days ");
            clock(micros, TimeUnit::Microsecond, out);
        }
        Kind::List(item) => {
            let l = a.as_list::<i32>();
            array(item, &l.value(i), out)?;
        }
    }
    Ok(true)
}

/// An array literal: every element double-quoted (backslash and quote escaped), NULL bare.
fn array(kind: &Kind, values: &ArrayRef, out: &mut String) -> Result<()> {
    out.push('{');
    let mut el = String::new();
    for j in 0..values.len() {
        if j > 0 {
            out.push(',');
        }
        el.clear();
        if !text(kind, values.as_ref(), j, &mut el)? {
            out.push_str("NULL");
            continue;
        }
        out.push('"');
        for c in el.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
    out.push('}');
    Ok(())
}

/// The text of row `i` of the string column `a` (`Utf8` or `LargeUtf8`), for both the text and
/// the binary COPY form; an error for a NUL byte, which PostgreSQL text cannot store.
pub(crate) fn text_value(a: &dyn Array, i: usize) -> Result<&str> {
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
    Ok(s)
}

/// The bytes of row `i` of the binary column `a` (`Binary`, `LargeBinary`, `FixedSizeBinary`).
pub(crate) fn bytes_value(a: &dyn Array, i: usize) -> &[u8] {
    match a.data_type() {
        DataType::LargeBinary => a.as_binary::<i64>().value(i),
        DataType::FixedSizeBinary(_) => a.as_fixed_size_binary().value(i),
        _ => a.as_binary::<i32>().value(i),
    }
}

/// The unscaled integer of decimal row `i` as decimal digits (`-` first when negative).
pub(crate) fn decimal_digits(a: &dyn Array, i: usize) -> String {
    match a.data_type() {
        DataType::Decimal128(..) => a.as_primitive::<Decimal128Type>().value(i).to_string(),
        _ => a.as_primitive::<Decimal256Type>().value(i).to_string(),
    }
}

/// The integer behind a time, timestamp or duration value, in its array's unit.
pub(crate) fn temporal(a: &dyn Array, i: usize) -> i64 {
    use TimeUnit::*;
    match a.data_type() {
        DataType::Time32(Second) => i64::from(a.as_primitive::<Time32SecondType>().value(i)),
        DataType::Time32(_) => i64::from(a.as_primitive::<Time32MillisecondType>().value(i)),
        DataType::Time64(Nanosecond) => a.as_primitive::<Time64NanosecondType>().value(i),
        DataType::Time64(_) => a.as_primitive::<Time64MicrosecondType>().value(i),
        DataType::Timestamp(Second, _) => a.as_primitive::<TimestampSecondType>().value(i),
        DataType::Timestamp(Millisecond, _) => {
            a.as_primitive::<TimestampMillisecondType>().value(i)
        }
        DataType::Timestamp(Microsecond, _) => {
            a.as_primitive::<TimestampMicrosecondType>().value(i)
        }
        DataType::Timestamp(Nanosecond, _) => a.as_primitive::<TimestampNanosecondType>().value(i),
        DataType::Duration(Second) => a.as_primitive::<DurationSecondType>().value(i),
        DataType::Duration(Millisecond) => a.as_primitive::<DurationMillisecondType>().value(i),
        DataType::Duration(Microsecond) => a.as_primitive::<DurationMicrosecondType>().value(i),
        _ => a.as_primitive::<DurationNanosecondType>().value(i),
    }
}

fn int(a: &dyn Array, i: usize, out: &mut String) {
    let _ = match a.data_type() {
        DataType::Int8 => write!(out, "{}", a.as_primitive::<Int8Type>().value(i)),
        DataType::Int16 => write!(out, "{}", a.as_primitive::<Int16Type>().value(i)),
        DataType::Int32 => write!(out, "{}", a.as_primitive::<Int32Type>().value(i)),
        DataType::Int64 => write!(out, "{}", a.as_primitive::<Int64Type>().value(i)),
        DataType::UInt8 => write!(out, "{}", a.as_primitive::<UInt8Type>().value(i)),
        DataType::UInt16 => write!(out, "{}", a.as_primitive::<UInt16Type>().value(i)),
        DataType::UInt32 => write!(out, "{}", a.as_primitive::<UInt32Type>().value(i)),
        _ => write!(out, "{}", a.as_primitive::<UInt64Type>().value(i)),
    };
}

/// Rust's `Display` of a float is the shortest text that reads back as the same value, which
/// is what PostgreSQL's `float4in`/`float8in` read back exactly.
fn float(a: &dyn Array, i: usize, out: &mut String) {
    let v = match a.data_type() {
        DataType::Float32 => {
            let v = a.as_primitive::<Float32Type>().value(i);
            if v.is_finite() {
                let _ = write!(out, "{v}");
                return;
            }
            f64::from(v)
        }
        _ => a.as_primitive::<Float64Type>().value(i),
    };
    if v.is_nan() {
        out.push_str("NaN");
    } else if v == f64::INFINITY {
        out.push_str("Infinity");
    } else if v == f64::NEG_INFINITY {
        out.push_str("-Infinity");
    } else {
        let _ = write!(out, "{v}");
    }
}

/// The unscaled integer's `digits` (with a leading `-` when negative) as a decimal of `scale`.
pub(crate) fn decimal(digits: &str, scale: i8, out: &mut String) {
    let (neg, d) = match digits.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, digits),
    };
    if neg {
        out.push('-');
    }
    if scale <= 0 {
        out.push_str(d);
        if d != "0" {
            out.extend(std::iter::repeat_n('0', usize::from(scale.unsigned_abs())));
        }
        return;
    }
    let s = usize::from(scale.unsigned_abs());
    if d.len() <= s {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', s - d.len()));
        out.push_str(d);
    } else {
        out.push_str(&d[..d.len() - s]);
        out.push('.');
        out.push_str(&d[d.len() - s..]);
    }
}

fn hex(b: &[u8], out: &mut String) {
    const H: &[u8; 16] = b"0123456789abcdef";
    out.reserve(b.len() * 2);
    for x in b {
        out.push(char::from(H[usize::from(x >> 4)]));
        out.push(char::from(H[usize::from(x & 15)]));
    }
}

/// Whole seconds and nanoseconds of a value in `unit` (the fraction always non-negative).
fn split(v: i64, unit: TimeUnit) -> (i64, i64) {
    let per = match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    };
    let secs = v.div_euclid(per);
    (secs, v.rem_euclid(per) * (1_000_000_000 / per))
}

/// `[-]H:MM:SS.fffffffff` of a signed duration.
fn clock(v: i64, unit: TimeUnit, out: &mut String) {
    let neg = v < 0;
    let (secs, frac) = split(v.unsigned_abs().min(i64::MAX as u64) as i64, unit);
    if neg {
        out.push('-');
    }
    let _ = write!(
        out,
        "{}:{:02}:{:02}.{frac:09}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
}

fn out_of_range(what: &str) -> Error {
    Error::data(format!(
        "a {what} value is outside the range sluice can write to PostgreSQL"
    ))
}

/// Days since 1970 as a date; the export's ±infinity sentinels as infinity.
fn date(days: i32, out: &mut String) -> Result<()> {
    match days {
        i32::MAX => out.push_str("infinity"),
        i32::MIN => out.push_str("-infinity"),
        _ => {
            let d = chrono::NaiveDate::from_num_days_from_ce_opt(days.saturating_add(719_163))
                .ok_or_else(|| out_of_range("date"))?;
            ymd(&d, out);
            if chrono::Datelike::year(&d) <= 0 {
                out.push_str(" BC");
            }
        }
    }
    Ok(())
}

/// `YYYY-MM-DD` with the year counted PostgreSQL's way (1 BC is year 0 in chrono).
fn ymd(d: &chrono::NaiveDate, out: &mut String) {
    use chrono::Datelike;
    let y = d.year();
    let y = if y <= 0 { 1 - y } else { y };
    let _ = write!(out, "{y:04}-{:02}-{:02}", d.month(), d.day());
}

fn timestamp(v: i64, unit: TimeUnit, tz: bool, out: &mut String) -> Result<()> {
    if unit == TimeUnit::Microsecond && v == i64::MAX {
        out.push_str("infinity");
        return Ok(());
    }
    if unit == TimeUnit::Microsecond && v == i64::MIN {
        out.push_str("-infinity");
        return Ok(());
    }
    let (secs, nanos) = split(v, unit);
    let dt = chrono::DateTime::from_timestamp(secs, nanos as u32)
        .ok_or_else(|| out_of_range("timestamp"))?
        .naive_utc();
    ymd(&dt.date(), out);
    let _ = write!(out, " {}.{nanos:09}", dt.time().format("%H:%M:%S"));
    if tz {
        out.push_str("+00");
    }
    if chrono::Datelike::year(&dt.date()) <= 0 {
        out.push_str(" BC");
    }
    Ok(())
}

/// Append `s` as a SQL string literal. Injection-proof because every session of the apply
/// runs with `standard_conforming_strings = on` (set in the startup packet, and no statement
/// sluice sends changes it): inside `'…'` a backslash is an ordinary character and the only
/// character that ends the literal is `'`, which is doubled here; the client encoding is UTF-8
/// (tokio-postgres insists), so no multi-byte sequence can hide a quote; and NUL, which would
/// cut the query text short, is refused by [`text`].
pub fn push_literal(s: &str, out: &mut String) {
    out.reserve(s.len() + 2);
    out.push('\'');
    for (n, part) in s.split('\'').enumerate() {
        if n > 0 {
            out.push_str("''");
        }
        out.push_str(part);
    }
    out.push('\'');
}

/// Append row `i` of `a` as a SQL literal (`NULL` or a quoted constant); `scratch` is reused.
pub fn push_sql(
    kind: &Kind,
    a: &dyn Array,
    i: usize,
    scratch: &mut String,
    out: &mut String,
) -> Result<()> {
    scratch.clear();
    if text(kind, a, i, scratch)? {
        push_literal(scratch, out);
    } else {
        out.push_str("NULL");
    }
    Ok(())
}

/// Append row `i` of `a` as a field of `COPY … (FORMAT text)`: `\N` for NULL, backslash,
/// newline, carriage return and tab escaped.
pub fn push_copy(
    kind: &Kind,
    a: &dyn Array,
    i: usize,
    scratch: &mut String,
    out: &mut Vec<u8>,
) -> Result<()> {
    scratch.clear();
    if !text(kind, a, i, scratch)? {
        out.extend_from_slice(b"\\N");
        return Ok(());
    }
    for b in scratch.bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => out.push(b),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_place_the_point() {
        let d = |digits: &str, s: i8| {
            let mut o = String::new();
            decimal(digits, s, &mut o);
            o
        };
        assert_eq!(d("12345", 2), "123.45");
        assert_eq!(d("-5", 3), "-0.005");
        assert_eq!(d("0", 2), "0.00");
        assert_eq!(d("7", -2), "700");
        assert_eq!(d("-123", 0), "-123");
    }

    #[test]
    fn literals_double_quotes_only() {
        let mut o = String::new();
        push_literal(r"it's \x'", &mut o);
        assert_eq!(o, r"'it''s \x'''");
    }

    #[test]
    fn dates_and_times() {
        let mut o = String::new();
        date(0, &mut o).unwrap();
        assert_eq!(o, "1970-01-01");
        o.clear();
        // 0044-03-15 BC is chrono year -43.
        let d = chrono::NaiveDate::from_ymd_opt(-43, 3, 15).unwrap();
        let days = (d - chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()).num_days();
        date(days as i32, &mut o).unwrap();
        assert_eq!(o, "0044-03-15 BC");
        o.clear();
        timestamp(-1, TimeUnit::Microsecond, true, &mut o).unwrap();
        assert_eq!(o, "1969-12-31 23:59:59.999999000+00");
        o.clear();
        clock(-3_723_000_001, TimeUnit::Microsecond, &mut o);
        assert_eq!(o, "-1:02:03.000001000");
    }
}
