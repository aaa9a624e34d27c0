//! Arrow values as text, for CSV.
//!
//! Text forms are chosen to be exact and to load back into common tools:
//!
//! | Arrow                        | text                                                     |
//! |------------------------------|----------------------------------------------------------|
//! | Boolean                      | `true` / `false`                                         |
//! | integers                     | decimal                                                  |
//! | floats                       | shortest exact decimal; `NaN`, `Infinity`, `-Infinity`   |
//! | Decimal128/256               | exact decimal with the column's scale (`12.50`)          |
//! | Utf8                         | as is                                                    |
//! | Binary                       | `\x` + lowercase hex (PostgreSQL's bytea form)           |
//! | FixedSizeBinary + arrow.uuid | `8-4-4-4-12` hex                                         |
//! | Date32                       | `YYYY-MM-DD` (ISO 8601 years; year 0 = 1 BC); `infinity` |
//! | Time64(µs)                   | `HH:MM:SS[.ffffff]`                                      |
//! | Timestamp(µs[, tz])          | `YYYY-MM-DD HH:MM:SS[.ffffff]`, `Z` appended with a zone |
//! | sluice.interval struct       | ISO 8601 duration, e.g. `P1Y2M3DT4H5M6.5S`               |
//! | List                         | JSON array (`[1,2,null]`, strings quoted)                |
//! | any other Struct (`_before`) | JSON object of its fields' text forms, as in a List      |
//! | anything else                | Arrow's display form                                     |
//!
//! Over 500 lines: one renderer per Arrow type (a closure picked once per column, so a row
//! costs no type dispatch) with the calendar arithmetic they share, and their tests.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, StructArray};
use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;
use arrow_schema::{DataType, Field, TimeUnit};
use chrono::{DateTime, NaiveDate};
use sluice_core::Result;
use sluice_core::values::civil_from_days;
use std::io::Write;

/// Renders the value at a row into a buffer (the caller handles NULL).
pub(crate) type Render<'a> = Box<dyn Fn(usize, &mut Vec<u8>) + 'a>;

fn ext_name(field: &Field) -> Option<&str> {
    field
        .metadata()
        .get(EXTENSION_TYPE_NAME_KEY)
        .map(String::as_str)
}

/// Append `text` (a value's text form) to `out` inside a JSON array or object: bare when its
/// type renders as a JSON number or literal (`bare`) and the text is one — `NaN` and the
/// infinities have no JSON number — else as a JSON string.
fn json_item(out: &mut Vec<u8>, text: &[u8], bare: bool) {
    let special = matches!(text.first(), Some(b'N' | b'I')) || text.starts_with(b"-I");
    if bare && !special {
        out.extend_from_slice(text);
    } else {
        json_string(out, text);
    }
}

/// True when a value of this type renders as a JSON number or literal inside a list.
fn json_bare(dt: &DataType) -> bool {
    dt.is_integer()
        || dt.is_floating()
        || matches!(
            dt,
            DataType::Boolean | DataType::Decimal128(..) | DataType::Decimal256(..)
        )
}

fn float(out: &mut Vec<u8>, v: f64, as_f32: Option<f32>) {
    if v.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if v.is_infinite() {
        out.extend_from_slice(if v > 0.0 { b"Infinity" } else { b"-Infinity" });
    } else {
        let mut b = ryu::Buffer::new();
        let s = match as_f32 {
            Some(f) => b.format_finite(f),
            None => b.format_finite(v),
        };
        out.extend_from_slice(s.strip_suffix(".0").unwrap_or(s).as_bytes());
    }
}

/// Insert a decimal point `scale` digits from the right of an integer's digits.
fn decimal(out: &mut Vec<u8>, digits: &str, scale: i8) {
    let (neg, digits) = match digits.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, digits),
    };
    if neg {
        out.push(b'-');
    }
    if scale <= 0 {
        out.extend_from_slice(digits.as_bytes());
        out.extend(std::iter::repeat_n(b'0', (-scale) as usize));
        return;
    }
    let scale = scale as usize;
    if digits.len() <= scale {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', scale - digits.len()));
        out.extend_from_slice(digits.as_bytes());
    } else {
        let (int, frac) = digits.split_at(digits.len() - scale);
        out.extend_from_slice(int.as_bytes());
        out.push(b'.');
        out.extend_from_slice(frac.as_bytes());
    }
}

fn fraction(out: &mut Vec<u8>, micros: u32) {
    if micros != 0 {
        let mut digits = [b'0'; 6];
        let mut m = micros;
        for d in digits.iter_mut().rev() {
            *d = b'0' + (m % 10) as u8;
            m /= 10;
        }
        let used = 6 - digits.iter().rev().take_while(|&&d| d == b'0').count();
        out.push(b'.');
        out.extend_from_slice(&digits[..used]);
    }
}

/// Two digits of `v` (0..=99).
fn two(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&[b'0' + (v / 10) as u8, b'0' + (v % 10) as u8]);
}

/// `HH:MM:SS` of a second of the day.
fn hms(out: &mut Vec<u8>, secs: u32) {
    two(out, secs / 3600);
    out.push(b':');
    two(out, (secs / 60) % 60);
    out.push(b':');
    two(out, secs % 60);
}

/// `YYYY-MM-DD` for years 0..=9999 without going through a formatter; `false` outside them,
/// where the caller falls back to chrono's ISO 8601 form (sign and more digits).
fn ymd(out: &mut Vec<u8>, days: i64) -> bool {
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return false;
    }
    let y = y as u32;
    two(out, y / 100);
    two(out, y % 100);
    out.push(b'-');
    two(out, m);
    out.push(b'-');
    two(out, d);
    true
}

fn time_of_day(out: &mut Vec<u8>, micros: i64) {
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000) as u32;
    if (0..100 * 3600).contains(&secs) {
        hms(out, secs as u32);
    } else {
        let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
        let _ = write!(out, "{h:02}:{m:02}:{s:02}");
    }
    fraction(out, frac);
}

fn date(out: &mut Vec<u8>, days: i32) {
    match days {
        i32::MAX => out.extend_from_slice(b"infinity"),
        i32::MIN => out.extend_from_slice(b"-infinity"),
        d if ymd(out, d as i64) => {}
        d => match NaiveDate::from_ymd_opt(1970, 1, 1)
            .and_then(|e| e.checked_add_signed(chrono::Duration::days(d as i64)))
        {
            Some(nd) => {
                let _ = write!(out, "{}", nd.format("%Y-%m-%d"));
            }
            None => {
                let _ = write!(out, "{d}");
            }
        },
    }
}

fn timestamp(out: &mut Vec<u8>, micros: i64, zoned: bool) {
    match micros {
        i64::MAX => out.extend_from_slice(b"infinity"),
        i64::MIN => out.extend_from_slice(b"-infinity"),
        m => {
            let secs = m.div_euclid(1_000_000);
            let fast = ymd(out, secs.div_euclid(86_400));
            if fast {
                out.push(b' ');
                hms(out, secs.rem_euclid(86_400) as u32);
            } else {
                match DateTime::from_timestamp_micros(m) {
                    Some(dt) => {
                        let _ = write!(out, "{}", dt.format("%Y-%m-%d %H:%M:%S"));
                    }
                    None => {
                        let _ = write!(out, "{m}");
                        return;
                    }
                }
            }
            fraction(out, (m.rem_euclid(1_000_000)) as u32);
            if zoned {
                out.push(b'Z');
            }
        }
    }
}

fn interval(out: &mut Vec<u8>, months: i32, days: i32, micros: i64) {
    if months == 0 && days == 0 && micros == 0 {
        out.extend_from_slice(b"PT0S");
        return;
    }
    out.push(b'P');
    let (y, m) = (months / 12, months % 12);
    if y != 0 {
        let _ = write!(out, "{y}Y");
    }
    if m != 0 {
        let _ = write!(out, "{m}M");
    }
    if days != 0 {
        let _ = write!(out, "{days}D");
    }
    if micros != 0 {
        out.push(b'T');
        let neg = micros < 0;
        let abs = micros.unsigned_abs();
        let (h, rest) = (abs / 3_600_000_000, abs % 3_600_000_000);
        let (mi, rest) = (rest / 60_000_000, rest % 60_000_000);
        let sign = if neg { "-" } else { "" };
        if h != 0 {
            let _ = write!(out, "{sign}{h}H");
        }
        if mi != 0 {
            let _ = write!(out, "{sign}{mi}M");
        }
        if rest != 0 {
            let _ = write!(out, "{sign}{}", rest / 1_000_000);
            fraction(out, (rest % 1_000_000) as u32);
            out.push(b'S');
        }
    }
}

pub(crate) fn json_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for &c in s {
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            c if c < 0x20 => {
                let _ = write!(out, "\\u{c:04x}");
            }
            c => out.push(c),
        }
    }
    out.push(b'"');
}

/// A renderer for `array`, whose field is `field`.
pub(crate) fn renderer<'a>(array: &'a ArrayRef, field: &Field) -> Result<Render<'a>> {
    let ext = ext_name(field).map(str::to_string);
    Ok(match array.data_type() {
        DataType::Boolean => {
            let a = array.as_boolean();
            Box::new(move |i, o| o.extend_from_slice(if a.value(i) { b"true" } else { b"false" }))
        }
        DataType::Int8 => int::<Int8Type>(array),
        DataType::Int16 => int::<Int16Type>(array),
        DataType::Int32 => int::<Int32Type>(array),
        DataType::Int64 => int::<Int64Type>(array),
        DataType::UInt8 => int::<UInt8Type>(array),
        DataType::UInt16 => int::<UInt16Type>(array),
        DataType::UInt32 => int::<UInt32Type>(array),
        DataType::UInt64 => int::<UInt64Type>(array),
        DataType::Float32 => {
            let a = array.as_primitive::<Float32Type>();
            Box::new(move |i, o| float(o, a.value(i) as f64, Some(a.value(i))))
        }
        DataType::Float64 => {
            let a = array.as_primitive::<Float64Type>();
            Box::new(move |i, o| float(o, a.value(i), None))
        }
        DataType::Decimal128(_, s) => {
            let (a, s) = (array.as_primitive::<Decimal128Type>(), *s);
            Box::new(move |i, o| decimal(o, itoa::Buffer::new().format(a.value(i)), s))
        }
        DataType::Decimal256(_, s) => {
            let (a, s) = (array.as_primitive::<Decimal256Type>(), *s);
            Box::new(move |i, o| decimal(o, &a.value(i).to_string(), s))
        }
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            Box::new(move |i, o| o.extend_from_slice(a.value(i).as_bytes()))
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            Box::new(move |i, o| o.extend_from_slice(a.value(i).as_bytes()))
        }
        DataType::Binary | DataType::LargeBinary => bytes_as(array, hex),
        DataType::FixedSizeBinary(16) if ext.as_deref() == Some("arrow.uuid") => {
            let a = array.as_fixed_size_binary();
            Box::new(move |i, o| {
                for (n, b) in a.value(i).iter().enumerate() {
                    if matches!(n, 4 | 6 | 8 | 10) {
                        o.push(b'-');
                    }
                    let _ = write!(o, "{b:02x}");
                }
            })
        }
        DataType::FixedSizeBinary(_) => bytes_as(array, hex),
        DataType::Date32 => {
            let a = array.as_primitive::<Date32Type>();
            Box::new(move |i, o| date(o, a.value(i)))
        }
        DataType::Time64(TimeUnit::Microsecond) => {
            let a = array.as_primitive::<Time64MicrosecondType>();
            Box::new(move |i, o| time_of_day(o, a.value(i)))
        }
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            let (a, zoned) = (
                array.as_primitive::<TimestampMicrosecondType>(),
                tz.is_some(),
            );
            Box::new(move |i, o| timestamp(o, a.value(i), zoned))
        }
        DataType::Struct(_) if ext.as_deref() == Some("sluice.interval") => {
            let s: &StructArray = array.as_struct();
            let m = s.column(0).as_primitive::<Int32Type>();
            let d = s.column(1).as_primitive::<Int32Type>();
            let us = s.column(2).as_primitive::<Int64Type>();
            Box::new(move |i, o| interval(o, m.value(i), d.value(i), us.value(i)))
        }
        DataType::Struct(fields) => {
            // A record of columns (the `_before` of change files): a JSON object whose values
            // are these text forms, numbers and arrays bare, the others JSON strings.
            let s: &StructArray = array.as_struct();
            let members = fields
                .iter()
                .zip(s.columns())
                .map(|(f, c)| {
                    let bare =
                        json_bare(f.data_type()) || matches!(f.data_type(), DataType::List(_));
                    let (inner, tmp) = (renderer(c, f)?, std::cell::RefCell::new(Vec::new()));
                    let value: Render = Box::new(move |i, o| {
                        let mut tmp = tmp.borrow_mut();
                        tmp.clear();
                        inner(i, &mut tmp);
                        json_item(o, &tmp, bare);
                    });
                    Ok((member_key(f), c, value))
                })
                .collect::<Result<Vec<_>>>()?;
            json_object(members)
        }
        DataType::List(item) => {
            let list = array.as_list::<i32>();
            let values = list.values();
            let bare = json_bare(item.data_type());
            let inner = renderer(values, item)?;
            Box::new(move |i, o| {
                let offsets = list.value_offsets();
                let (start, end) = (offsets[i] as usize, offsets[i + 1] as usize);
                o.push(b'[');
                let mut tmp = Vec::new();
                for j in start..end {
                    if j > start {
                        o.push(b',');
                    }
                    if values.is_null(j) {
                        o.extend_from_slice(b"null");
                    } else {
                        tmp.clear();
                        inner(j, &mut tmp);
                        json_item(o, &tmp, bare);
                    }
                }
                o.push(b']');
            })
        }
        _ => {
            let f =
                arrow_cast::display::ArrayFormatter::try_new(array.as_ref(), &Default::default())
                    .map_err(sluice_core::Error::from)?;
            Box::new(move |i, o| {
                let _ = write!(o, "{}", f.value(i));
            })
        }
    })
}

/// `"name":` of a JSON object's member for field `f`.
pub(crate) fn member_key(f: &Field) -> Vec<u8> {
    let mut key = Vec::with_capacity(f.name().len() + 3);
    json_string(&mut key, f.name().as_bytes());
    key.push(b':');
    key
}

fn int<'a, T: ArrowPrimitiveType>(array: &'a ArrayRef) -> Render<'a>
where
    T::Native: itoa::Integer,
{
    let a = array.as_primitive::<T>();
    Box::new(move |i, o| o.extend_from_slice(itoa::Buffer::new().format(a.value(i)).as_bytes()))
}

/// A writer of a JSON object at a row: each member's key (as [`member_key`] writes it), then
/// `null` where its column is NULL at that row, else what its writer writes.
pub(crate) fn json_object<'a>(members: Vec<(Vec<u8>, &'a ArrayRef, Render<'a>)>) -> Render<'a> {
    Box::new(move |i, o| {
        o.push(b'{');
        for (n, (key, column, value)) in members.iter().enumerate() {
            if n > 0 {
                o.push(b',');
            }
            o.extend_from_slice(key);
            if column.is_null(i) {
                o.extend_from_slice(b"null");
            } else {
                value(i, o);
            }
        }
        o.push(b'}');
    })
}

/// A writer of the bytes at a row of the binary `array` (`Binary`, `LargeBinary` or
/// `FixedSizeBinary`) through `encode` (hex, base64).
pub(crate) fn bytes_as<'a>(array: &'a ArrayRef, encode: fn(&mut Vec<u8>, &[u8])) -> Render<'a> {
    match array.data_type() {
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            Box::new(move |i, o| encode(o, a.value(i)))
        }
        DataType::FixedSizeBinary(_) => {
            let a = array.as_fixed_size_binary();
            Box::new(move |i, o| encode(o, a.value(i)))
        }
        _ => {
            let a = array.as_binary::<i32>();
            Box::new(move |i, o| encode(o, a.value(i)))
        }
    }
}

fn hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(b"\\x");
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize]);
        out.push(DIGITS[(b & 15) as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn s(f: impl Fn(&mut Vec<u8>)) -> String {
        let mut v = Vec::new();
        f(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn non_finite_floats_in_lists_are_json_strings() {
        let list: ArrayRef = Arc::new(arrow_array::ListArray::from_iter_primitive::<
            Float64Type,
            _,
            _,
        >(vec![Some(vec![
            Some(1.5),
            Some(f64::NAN),
            Some(f64::NEG_INFINITY),
            None,
        ])]));
        let f = Field::new("l", list.data_type().clone(), true);
        let r = renderer(&list, &f).unwrap();
        let mut o = Vec::new();
        r(0, &mut o);
        assert_eq!(
            String::from_utf8(o).unwrap(),
            r#"[1.5,"NaN","-Infinity",null]"#
        );
    }

    #[test]
    fn a_record_of_columns_is_a_json_object_of_text_forms() {
        let (a, f) = crate::jsonl::tests::record();
        let r = renderer(&a, &f).unwrap();
        let text = |row| {
            let mut o = Vec::new();
            r(row, &mut o);
            String::from_utf8(o).unwrap()
        };
        assert_eq!(text(0), r#"{"id":1,"v":"a\"b","t":null}"#);
        assert_eq!(text(1), r#"{"id":2,"v":null,"t":"1970-01-01 00:00:01Z"}"#);
    }

    #[test]
    fn decimals_are_exact() {
        assert_eq!(s(|o| decimal(o, "12345", 2)), "123.45");
        assert_eq!(s(|o| decimal(o, "-5", 3)), "-0.005");
        assert_eq!(s(|o| decimal(o, "0", 2)), "0.00");
        assert_eq!(s(|o| decimal(o, "7", 0)), "7");
        assert_eq!(s(|o| decimal(o, "7", -2)), "700");
    }

    #[test]
    fn floats_and_specials() {
        assert_eq!(s(|o| float(o, f64::NAN, None)), "NaN");
        assert_eq!(s(|o| float(o, f64::NEG_INFINITY, None)), "-Infinity");
        assert_eq!(s(|o| float(o, 1.0, None)), "1");
        assert_eq!(s(|o| float(o, 0.1, None)), "0.1");
        assert_eq!(s(|o| float(o, 1e300, None)), "1e300");
        assert_eq!(s(|o| float(o, 0.1f32 as f64, Some(0.1f32))), "0.1");
    }

    #[test]
    fn dates_times_intervals() {
        assert_eq!(s(|o| date(o, 0)), "1970-01-01");
        assert_eq!(s(|o| date(o, i32::MAX)), "infinity");
        assert_eq!(
            s(|o| timestamp(o, 1_500_000, true)),
            "1970-01-01 00:00:01.5Z"
        );
        assert_eq!(s(|o| timestamp(o, -1, false)), "1969-12-31 23:59:59.999999");
        assert_eq!(s(|o| time_of_day(o, 3_723_000_001)), "01:02:03.000001");
        assert_eq!(
            s(|o| interval(o, 14, 3, 4 * 3_600_000_000 + 5_500_000)),
            "P1Y2M3DT4H5.5S"
        );
        assert_eq!(s(|o| interval(o, 0, 0, 0)), "PT0S");
        assert_eq!(s(|o| interval(o, -1, 0, -60_000_000)), "P-1MT-1M");
    }

    #[test]
    fn fast_calendar_matches_chrono() {
        // Every day from 0001-01-01 to 9999-12-31 in steps, plus the edges around them.
        let first = NaiveDate::from_ymd_opt(1, 1, 1).unwrap();
        let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap();
        let start = (first - epoch).num_days();
        let end = (NaiveDate::from_ymd_opt(9999, 12, 31).unwrap() - epoch).num_days();
        let mut d = start - 400;
        while d <= end + 400 {
            let want = (epoch + chrono::Duration::days(d))
                .format("%Y-%m-%d")
                .to_string();
            assert_eq!(s(|o| date(o, d as i32)), want, "day {d}");
            d += 37;
        }
        for m in [
            0i64,
            -1,
            86_399_999_999,
            951_782_400_123_456,
            -62_135_596_800_000_001,
        ] {
            let dt = DateTime::from_timestamp_micros(m).unwrap();
            let mut want = dt.format("%Y-%m-%d %H:%M:%S%.f").to_string();
            if want.contains('.') {
                want = want.trim_end_matches('0').to_string();
            }
            assert_eq!(s(|o| timestamp(o, m, false)), want, "micros {m}");
        }
    }

    #[test]
    fn json_strings_escape() {
        assert_eq!(s(|o| json_string(o, b"a\"b\\\n")), r#""a\"b\\\n""#);
    }
}
