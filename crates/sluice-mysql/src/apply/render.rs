//! Arrow values → MySQL/MariaDB SQL literals, written straight into the statement text.
//!
//! Why literals and not bound parameters: a unit's statements travel as one multi-statement
//! text batch (one round trip), which the binary protocol cannot carry.
//!
//! Injection-proof by construction, whatever the session's `sql_mode` (`NO_BACKSLASH_ESCAPES`,
//! `ANSI_QUOTES`): every value is written either as a hexadecimal literal (`X'…'`, or text as
//! `_utf8mb4 X'…'`: only hex digits between the quotes), or as text this module formats itself
//! from numbers (digits, sign, `.`, `e`, `-`, `:`, space, between single quotes for dates and
//! times) — no quote, backslash or comment sequence can appear — or as the keyword `NULL`.
//! Identifiers go through [`crate::sql::quote_ident`].
//!
//! | Arrow (as the export reads it)             | literal                                  |
//! |--------------------------------------------|------------------------------------------|
//! | Boolean                                    | `1` / `0`                                |
//! | Int*, UInt*                                | the number                               |
//! | Float32 / Float64                          | shortest exact `…e…` (Float32 widened so that `<=>` matches the stored float); NaN and ±Inf fail |
//! | Decimal128 / Decimal256                    | the exact decimal text                   |
//! | Date32 / Date64                            | `'YYYY-MM-DD'`                           |
//! | Timestamp (any unit, with or without zone) | `'YYYY-MM-DD HH:MM:SS.ffffff'` in UTC (sessions run `time_zone = '+00:00'`) |
//! | Time32 / Time64                            | `'HH:MM:SS.ffffff'`                      |
//! | Duration (MySQL `time`, may be negative or past 24 h) | `'-838:59:59.000000'`         |
//! | Utf8 (text, enum, set, JSON, text fallbacks)| `_utf8mb4 X'…'` (JSON: `CAST(… AS JSON)` in comparisons on MySQL) |
//! | Binary, FixedSizeBinary                    | `X'…'`                                   |
//! | Binary + `geoarrow.wkb`                    | `ST_GeomFromWKB(X'…')`                   |
//! | FixedSizeBinary(16) + `arrow.uuid`         | `'xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx'`  |
//! | Struct + `sluice.interval`                 | ISO 8601 duration text (`'P1M2DT3.5S'`)  |
//! | List                                       | a JSON array as text                     |
//!
//! Length: about 420 lines of code plus unit tests: one writer per Arrow type family, which
//! read best next to the table above.

use crate::types::WKB_EXTENSION;
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef};
use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;
use arrow_schema::{DataType, Field, TimeUnit};
use sluice_core::{Error, Result};
use std::fmt::Write;

/// Extension name of PostgreSQL intervals (months, days, microseconds).
const INTERVAL_EXTENSION: &str = "sluice.interval";

/// How one column's values are written, decided once per column from its Arrow field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Anything written by its Arrow type alone.
    Plain,
    /// JSON text (compared as JSON on MySQL, whose JSON type does not compare with text).
    Json,
    /// WKB geometry.
    Wkb,
    /// 16 bytes written as the UUID's text.
    Uuid,
    /// PostgreSQL's interval struct.
    Interval,
}

impl Kind {
    /// The kind of `field`.
    pub fn of(field: &Field) -> Kind {
        match field
            .metadata()
            .get(EXTENSION_TYPE_NAME_KEY)
            .map(String::as_str)
        {
            Some("arrow.json") => Kind::Json,
            Some(WKB_EXTENSION) => Kind::Wkb,
            Some("arrow.uuid") if matches!(field.data_type(), DataType::FixedSizeBinary(16)) => {
                Kind::Uuid
            }
            Some(INTERVAL_EXTENSION) => Kind::Interval,
            _ => Kind::Plain,
        }
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_hex(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2 + 3);
    out.push_str("X'");
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    out.push('\'');
}

/// Text as a utf8mb4 hex literal (see `sql::quote_literal` for why it is coercible).
pub fn push_text(out: &mut String, s: &str) {
    out.push_str("_utf8mb4 ");
    push_hex(out, s.as_bytes());
}

fn bad(column: &str, why: &str) -> Error {
    Error::data(format!(
        "column {column:?}: {why}. Leave the column out of the replication or change its type \
         on the source"
    ))
}

fn float(out: &mut String, v: f64, column: &str) -> Result<()> {
    if !v.is_finite() {
        return Err(bad(
            column,
            &format!("MySQL/MariaDB cannot store the float {v} (NaN and ±Infinity have no value)"),
        ));
    }
    let _ = write!(out, "{v:e}");
    Ok(())
}

/// `digits` (an integer's text, maybe signed) with `scale` decimals.
fn decimal(out: &mut String, digits: &str, scale: i8) {
    let (neg, body) = match digits.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, digits),
    };
    if neg {
        out.push('-');
    }
    if scale <= 0 {
        out.push_str(body);
        for _ in 0..(-scale as i32) {
            out.push('0');
        }
        return;
    }
    let scale = scale as usize;
    if body.len() <= scale {
        out.push_str("0.");
        for _ in body.len()..scale {
            out.push('0');
        }
        out.push_str(body);
    } else {
        let (i, f) = body.split_at(body.len() - scale);
        out.push_str(i);
        out.push('.');
        out.push_str(f);
    }
}

fn micros_of(v: i64, unit: &TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => v.saturating_mul(1_000_000),
        TimeUnit::Millisecond => v.saturating_mul(1_000),
        TimeUnit::Microsecond => v,
        TimeUnit::Nanosecond => v.div_euclid(1_000),
    }
}

fn timestamp(out: &mut String, micros: i64, column: &str) -> Result<()> {
    let t = chrono::DateTime::from_timestamp_micros(micros)
        .filter(|t| {
            let y = chrono::Datelike::year(t);
            (0..=9999).contains(&y)
        })
        .ok_or_else(|| {
            bad(
                column,
                "the timestamp is outside MySQL's range (years 0000–9999; PostgreSQL's \
                 ±infinity has no MySQL value)",
            )
        })?;
    let _ = write!(out, "'{}'", t.naive_utc().format("%Y-%m-%d %H:%M:%S%.6f"));
    Ok(())
}

fn date(out: &mut String, days: i64, column: &str) -> Result<()> {
    let d = chrono::NaiveDate::from_yo_opt(1970, 1)
        .and_then(|e| e.checked_add_signed(chrono::TimeDelta::try_days(days)?))
        .filter(|d| (0..=9999).contains(&chrono::Datelike::year(d)))
        .ok_or_else(|| {
            bad(
                column,
                "the date is outside MySQL's range (years 0000–9999; PostgreSQL's ±infinity has \
                 no MySQL value)",
            )
        })?;
    let _ = write!(out, "'{}'", d.format("%Y-%m-%d"));
    Ok(())
}

/// A signed duration as MySQL `time` text (hours may pass 24).
fn duration(out: &mut String, micros: i64) {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    let (secs, f) = (m / 1_000_000, m % 1_000_000);
    let (h, min, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let _ = write!(out, "'{sign}{h}:{min:02}:{s:02}.{f:06}'");
}

fn interval(out: &mut String, months: i32, days: i32, micros: i64) {
    // ISO 8601 with signed components, as PostgreSQL's `intervalstyle = iso_8601` writes it.
    out.push_str("'P");
    if months != 0 {
        let _ = write!(out, "{months}M");
    }
    if days != 0 || (months == 0 && micros == 0) {
        let _ = write!(out, "{days}D");
    }
    if micros != 0 {
        let sign = if micros < 0 { "-" } else { "" };
        let m = micros.unsigned_abs();
        let _ = write!(out, "T{sign}{}.{:06}S", m / 1_000_000, m % 1_000_000);
    }
    out.push('\'');
}

fn uuid(out: &mut String, b: &[u8]) {
    out.push('\'');
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push((HEX[(x >> 4) as usize] as char).to_ascii_lowercase());
        out.push((HEX[(x & 15) as usize] as char).to_ascii_lowercase());
    }
    out.push('\'');
}

/// Write the value at `row` of `array` (a column of kind `kind`, named `column` in errors).
pub fn value(
    out: &mut String,
    kind: Kind,
    array: &ArrayRef,
    row: usize,
    column: &str,
) -> Result<()> {
    if array.is_null(row) {
        out.push_str("NULL");
        return Ok(());
    }
    match kind {
        Kind::Wkb => {
            out.push_str("ST_GeomFromWKB(");
            push_hex(out, binary(array, row, column)?);
            out.push(')');
            return Ok(());
        }
        Kind::Uuid => {
            uuid(out, array.as_fixed_size_binary().value(row));
            return Ok(());
        }
        Kind::Interval => {
            let s = array.as_struct();
            let field = |name: &str| s.column_by_name(name).cloned();
            match (field("months"), field("days"), field("microseconds")) {
                (Some(m), Some(d), Some(u)) => interval(
                    out,
                    m.as_primitive::<Int32Type>().value(row),
                    d.as_primitive::<Int32Type>().value(row),
                    u.as_primitive::<Int64Type>().value(row),
                ),
                _ => return Err(bad(column, "the interval struct lacks a field")),
            }
            return Ok(());
        }
        Kind::Plain | Kind::Json => {}
    }
    plain(out, array, row, column)
}

fn binary<'a>(array: &'a ArrayRef, row: usize, column: &str) -> Result<&'a [u8]> {
    Ok(match array.data_type() {
        DataType::Binary => array.as_binary::<i32>().value(row),
        DataType::LargeBinary => array.as_binary::<i64>().value(row),
        DataType::BinaryView => array.as_binary_view().value(row),
        DataType::FixedSizeBinary(_) => array.as_fixed_size_binary().value(row),
        other => return Err(bad(column, &format!("{other} is not binary"))),
    })
}

fn plain(out: &mut String, array: &ArrayRef, row: usize, column: &str) -> Result<()> {
    macro_rules! int {
        ($t:ty) => {{
            let _ = write!(out, "{}", array.as_primitive::<$t>().value(row));
        }};
    }
    match array.data_type() {
        DataType::Boolean => out.push(if array.as_boolean().value(row) {
            '1'
        } else {
            '0'
        }),
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        // Widened: the f64 nearest the stored f32, so a `<=>` against a FLOAT column matches.
        DataType::Float32 => float(
            out,
            f64::from(array.as_primitive::<Float32Type>().value(row)),
            column,
        )?,
        DataType::Float64 => float(out, array.as_primitive::<Float64Type>().value(row), column)?,
        DataType::Decimal128(_, s) => decimal(
            out,
            &array
                .as_primitive::<Decimal128Type>()
                .value(row)
                .to_string(),
            *s,
        ),
        DataType::Decimal256(_, s) => decimal(
            out,
            &array
                .as_primitive::<Decimal256Type>()
                .value(row)
                .to_string(),
            *s,
        ),
        DataType::Date32 => date(
            out,
            i64::from(array.as_primitive::<Date32Type>().value(row)),
            column,
        )?,
        DataType::Date64 => date(
            out,
            array
                .as_primitive::<Date64Type>()
                .value(row)
                .div_euclid(86_400_000),
            column,
        )?,
        DataType::Timestamp(unit, _) => {
            let v = match unit {
                TimeUnit::Second => array.as_primitive::<TimestampSecondType>().value(row),
                TimeUnit::Millisecond => {
                    array.as_primitive::<TimestampMillisecondType>().value(row)
                }
                TimeUnit::Microsecond => {
                    array.as_primitive::<TimestampMicrosecondType>().value(row)
                }
                TimeUnit::Nanosecond => array.as_primitive::<TimestampNanosecondType>().value(row),
            };
            timestamp(out, micros_of(v, unit), column)?
        }
        DataType::Duration(unit) => {
            let v = match unit {
                TimeUnit::Second => array.as_primitive::<DurationSecondType>().value(row),
                TimeUnit::Millisecond => array.as_primitive::<DurationMillisecondType>().value(row),
                TimeUnit::Microsecond => array.as_primitive::<DurationMicrosecondType>().value(row),
                TimeUnit::Nanosecond => array.as_primitive::<DurationNanosecondType>().value(row),
            };
            duration(out, micros_of(v, unit))
        }
        DataType::Time32(unit) => {
            let v = match unit {
                TimeUnit::Second => array.as_primitive::<Time32SecondType>().value(row),
                _ => array.as_primitive::<Time32MillisecondType>().value(row),
            };
            duration(out, micros_of(i64::from(v), unit))
        }
        DataType::Time64(unit) => {
            let v = match unit {
                TimeUnit::Nanosecond => array.as_primitive::<Time64NanosecondType>().value(row),
                _ => array.as_primitive::<Time64MicrosecondType>().value(row),
            };
            duration(out, micros_of(v, unit))
        }
        DataType::Utf8 => push_text(out, array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => push_text(out, array.as_string::<i64>().value(row)),
        DataType::Utf8View => push_text(out, array.as_string_view().value(row)),
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => push_hex(out, binary(array, row, column)?),
        DataType::List(_) | DataType::LargeList(_) => {
            let mut json = String::new();
            json_value(&mut json, array, row, column)?;
            push_text(out, &json);
        }
        other => {
            return Err(bad(
                column,
                &format!("values of Arrow type {other} cannot be written to MySQL/MariaDB"),
            ));
        }
    }
    Ok(())
}

/// The value as JSON (arrays of any exported element type).
fn json_value(out: &mut String, array: &ArrayRef, row: usize, column: &str) -> Result<()> {
    if array.is_null(row) {
        out.push_str("null");
        return Ok(());
    }
    let quoted = |out: &mut String, s: &str| {
        out.push_str(&serde_json::Value::String(s.to_string()).to_string());
    };
    match array.data_type() {
        DataType::List(_) | DataType::LargeList(_) => {
            let items = match array.data_type() {
                DataType::List(_) => array.as_list::<i32>().value(row),
                _ => array.as_list::<i64>().value(row),
            };
            out.push('[');
            for i in 0..items.len() {
                if i > 0 {
                    out.push(',');
                }
                json_value(out, &items, i, column)?;
            }
            out.push(']');
        }
        DataType::Boolean => out.push_str(if array.as_boolean().value(row) {
            "true"
        } else {
            "false"
        }),
        DataType::Float32 | DataType::Float64 => {
            let v = match array.data_type() {
                DataType::Float32 => f64::from(array.as_primitive::<Float32Type>().value(row)),
                _ => array.as_primitive::<Float64Type>().value(row),
            };
            if v.is_finite() {
                let _ = write!(out, "{v}");
            } else {
                // JSON has no NaN or infinity: kept as text.
                quoted(out, &v.to_string());
            }
        }
        dt if dt.is_integer()
            || matches!(dt, DataType::Decimal128(..) | DataType::Decimal256(..)) =>
        {
            plain(out, array, row, column)?
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let s = match array.data_type() {
                DataType::Utf8 => array.as_string::<i32>().value(row),
                DataType::LargeUtf8 => array.as_string::<i64>().value(row),
                _ => array.as_string_view().value(row),
            };
            quoted(out, s)
        }
        DataType::FixedSizeBinary(16) => {
            let mut s = String::new();
            uuid(&mut s, array.as_fixed_size_binary().value(row));
            out.push('"');
            out.push_str(s.trim_matches('\''));
            out.push('"');
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            let b = binary(array, row, column)?;
            out.push_str("\"\\\\x");
            for x in b {
                let _ = write!(out, "{x:02x}");
            }
            out.push('"');
        }
        _ => {
            // Dates, times and the rest: their SQL text, unquoted, as a JSON string.
            let mut s = String::new();
            plain(&mut s, array, row, column)?;
            quoted(out, s.trim_matches('\''));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{
        BooleanArray, Decimal128Array, DurationMicrosecondArray, Float32Array, Float64Array,
        ListArray, StringArray, TimestampMicrosecondArray,
    };
    use std::sync::Arc;

    fn one(a: ArrayRef, kind: Kind) -> String {
        let mut s = String::new();
        value(&mut s, kind, &a, 0, "c").unwrap();
        s
    }

    #[test]
    fn literals() {
        assert_eq!(
            one(Arc::new(BooleanArray::from(vec![true])), Kind::Plain),
            "1"
        );
        assert_eq!(
            one(Arc::new(Float64Array::from(vec![0.1])), Kind::Plain),
            "1e-1"
        );
        let f = one(Arc::new(Float32Array::from(vec![0.1f32])), Kind::Plain);
        assert_eq!(f.parse::<f64>().unwrap() as f32, 0.1f32);
        let d = Decimal128Array::from(vec![-5, 123456])
            .with_precision_and_scale(10, 3)
            .unwrap();
        let d: ArrayRef = Arc::new(d);
        let mut s = String::new();
        value(&mut s, Kind::Plain, &d, 0, "c").unwrap();
        s.push(' ');
        value(&mut s, Kind::Plain, &d, 1, "c").unwrap();
        assert_eq!(s, "-0.005 123.456");
        assert_eq!(
            one(
                Arc::new(DurationMicrosecondArray::from(vec![-3_019_999_000_000])),
                Kind::Plain
            ),
            "'-838:53:19.000000'"
        );
        assert_eq!(
            one(
                Arc::new(TimestampMicrosecondArray::from(vec![1_500_000])),
                Kind::Plain
            ),
            "'1970-01-01 00:00:01.500000'"
        );
        assert_eq!(
            one(Arc::new(StringArray::from(vec!["a'\\"])), Kind::Plain),
            "_utf8mb4 X'61275C'"
        );
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![
            Some(1),
            None,
            Some(3),
        ])]);
        assert_eq!(
            one(Arc::new(list), Kind::Plain),
            format!("_utf8mb4 X'{}'", "5B312C6E756C6C2C335D")
        );
    }

    #[test]
    fn non_finite_floats_fail_naming_the_column() {
        let a: ArrayRef = Arc::new(Float64Array::from(vec![f64::NAN]));
        let e = value(&mut String::new(), Kind::Plain, &a, 0, "ratio").unwrap_err();
        assert!(e.to_string().contains("ratio"), "{e}");
    }
}
