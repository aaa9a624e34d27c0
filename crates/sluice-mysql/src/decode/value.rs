//! One driver value → a plain Rust value: integers (binary, text digits or `bit` bytes),
//! floats, exact decimals, dates and times (binary or the server's text, zero dates told
//! apart), durations, bytes. The row decoder in `decode.rs` appends the results to builders.

use super::{DResult, DecodeError, err};
use mysql_async::Value;
use sluice_core::values::{DecimalInt, parse_decimal, valid_date};

/// Source facts that change how bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Plain,
    /// `bit(n)`: big-endian bytes.
    Bit,
    /// Geometry: SRID (u32 LE) + WKB.
    Geometry,
}

/// An integer from a driver value: binary `Int`/`UInt`, text digits, or `bit` bytes.
pub(super) fn int_of(v: &Value, src: Source) -> DResult<i128> {
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

pub(super) fn parse_int(b: &[u8]) -> DResult<i128> {
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

pub(super) fn fits<T: TryFrom<i128>>(n: i128, what: &str) -> DResult<T> {
    T::try_from(n).map_err(|_| DecodeError(format!("{n} does not fit {what}")))
}

pub(super) fn float_of(v: &Value) -> DResult<f64> {
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

pub(super) fn decimal<T: DecimalInt>(b: &[u8], scale: i8) -> DResult<T> {
    parse_decimal(b, scale).map_err(DecodeError)
}

/// A date-time split into parts, as both protocols can give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Civil {
    pub(super) y: i64,
    pub(super) mo: u32,
    pub(super) d: u32,
    pub(super) h: u32,
    pub(super) mi: u32,
    pub(super) s: u32,
    pub(super) us: u32,
}

pub(super) fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || b.len() > 9 {
        return None;
    }
    b.iter().try_fold(0u32, |acc, c| {
        c.is_ascii_digit().then(|| acc * 10 + (c - b'0') as u32)
    })
}

/// Fraction digits (`5` → 500000 µs).
pub(super) fn micros_of_fraction(b: &[u8]) -> Option<u32> {
    if b.is_empty() || b.len() > 6 {
        return None;
    }
    let v = digits(b)?;
    Some(v * 10u32.pow(6 - b.len() as u32))
}

/// Parse `YYYY-MM-DD[ HH:MM:SS[.ffffff]]`.
pub(super) fn parse_civil(b: &[u8]) -> Option<Civil> {
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

pub(super) fn civil_of(v: &Value) -> DResult<Civil> {
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
pub(super) fn valid_days(c: &Civil) -> Option<i64> {
    valid_date(c.y, c.mo, c.d)
}

/// Microseconds of a signed MySQL `time` (`-838:59:59.000000`).
pub(super) fn duration_of(v: &Value) -> DResult<i64> {
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

pub(super) fn bytes_of(v: &Value) -> DResult<&[u8]> {
    match v {
        Value::Bytes(b) => Ok(b),
        other => err(format!("expected bytes, got {other:?}")),
    }
}
