//! Replicated values → the export's Arrow values.
//!
//! Columns the export reads natively arrive in the same binary send format as binary COPY and
//! go through the export's decoders ([`ValueDecoder`]). Columns the export casts (to `text`, or
//! `money` to `numeric`) arrive in their own binary format here, since a replication stream
//! cannot cast: the common ones are converted to what the cast gives (`jsonb`, unconstrained
//! `numeric`, `money`, `inet`/`cidr`, `macaddr`, `xml`, `"char"`, `timetz`); the others (ranges,
//! geometric types, composites, multi-dimensional arrays, arrays of cast types) are refused
//! when the stream starts, naming the column ([`Codec::unsupported`]). A value the server sends
//! as text (a type without a binary send function) is written as its text.

use super::pgoutput::Value;
use crate::decode::ValueDecoder;
use crate::types::{Mapping, TypeMap, oid};
use arrow_schema::DataType;
use sluice_core::columns::ColumnBuilder;
use std::fmt::Write;

/// How one replicated column becomes its Arrow value.
#[derive(Debug)]
pub enum Codec {
    /// The export's own binary decoder.
    Native(ValueDecoder),
    /// The binary form is the text (`xml`, `"char"`).
    TextBytes,
    /// `jsonb`: a version byte, then the text.
    Jsonb,
    /// Unconstrained `numeric` as exact decimal text.
    NumericText,
    /// `money` as Decimal128 in the smallest currency unit.
    Money,
    /// `inet` / `cidr` as `text(inet)` writes them (always with the mask).
    Inet,
    /// `macaddr` / `macaddr8`.
    Macaddr,
    /// `timetz` as its text.
    Timetz,
    /// Not convertible from its binary form; the type's name.
    Unsupported(String),
}

/// The base type of `oid`, following domains.
fn base(types: &TypeMap, mut oid: u32) -> u32 {
    while let Some(t) = types.get(&oid).filter(|t| t.typtype == b'd') {
        oid = t.base;
    }
    oid
}

impl Codec {
    /// The codec for a column of type `type_oid` that the export maps as `m`.
    pub fn for_column(types: &TypeMap, type_oid: u32, m: &Mapping) -> Codec {
        let name = || {
            types
                .get(&type_oid)
                .map(|t| t.name.clone())
                .unwrap_or_else(|| format!("type {type_oid}"))
        };
        if m.cast.is_none() {
            return match ValueDecoder::for_type(&m.data_type) {
                Ok(d) => Codec::Native(d),
                Err(_) => Codec::Unsupported(name()),
            };
        }
        if matches!(m.data_type, DataType::List(_)) {
            return Codec::Unsupported(name());
        }
        match base(types, type_oid) {
            oid::JSONB => Codec::Jsonb,
            oid::NUMERIC => Codec::NumericText,
            oid::MONEY => Codec::Money,
            oid::XML | oid::CHAR => Codec::TextBytes,
            oid::INET | oid::CIDR => Codec::Inet,
            oid::MACADDR | oid::MACADDR8 => Codec::Macaddr,
            oid::TIMETZ => Codec::Timetz,
            b => match types.get(&b) {
                // No binary send function: the server sends text, which is what the export's
                // `::text` gives.
                Some(t) if t.send.is_empty() || t.send == "-" => Codec::TextBytes,
                _ => Codec::Unsupported(name()),
            },
        }
    }

    /// The type name when this column cannot be streamed.
    pub fn unsupported(&self) -> Option<&str> {
        match self {
            Codec::Unsupported(n) => Some(n),
            _ => None,
        }
    }

    /// Append one non-NULL, sent value.
    pub fn append(&self, col: &mut ColumnBuilder, v: Value<'_>) -> Result<(), String> {
        let own = |e: sluice_core::Error| e.message().to_string();
        match (self, v) {
            (_, Value::Null | Value::Unchanged) => {
                col.push_null();
                Ok(())
            }
            (Codec::Native(d), Value::Binary(b)) => d.append(col, b).map_err(|e| e.0),
            (Codec::TextBytes | Codec::Unsupported(_), Value::Binary(b)) => {
                col.push_bytes(b).map_err(own)
            }
            (_, Value::Text(t)) => col.push_bytes(t).map_err(|_| {
                "the server sent this value as text, which only a text column can take".into()
            }),
            (Codec::Jsonb, Value::Binary(b)) => match b.split_first() {
                Some((1, text)) => col.push_bytes(text).map_err(own),
                _ => Err("unknown jsonb binary version".into()),
            },
            (Codec::NumericText, Value::Binary(b)) => {
                col.push_bytes(numeric_text(b)?.as_bytes()).map_err(own)
            }
            (Codec::Money, Value::Binary(b)) => {
                let a: [u8; 8] = b.try_into().map_err(|_| "money is not 8 bytes")?;
                col.push_i128(i64::from_be_bytes(a) as i128).map_err(own)
            }
            (Codec::Inet, Value::Binary(b)) => {
                col.push_bytes(inet_text(b)?.as_bytes()).map_err(own)
            }
            (Codec::Macaddr, Value::Binary(b)) => {
                let s: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
                col.push_bytes(s.join(":").as_bytes()).map_err(own)
            }
            (Codec::Timetz, Value::Binary(b)) => {
                col.push_bytes(timetz_text(b)?.as_bytes()).map_err(own)
            }
        }
    }
}

/// Binary `numeric` → its text (`numeric_out`): base-10000 digits, weight, sign, display scale.
pub fn numeric_text(v: &[u8]) -> Result<String, String> {
    if v.len() < 8 {
        return Err("numeric value shorter than its header".into());
    }
    let ndigits = u16::from_be_bytes([v[0], v[1]]) as usize;
    let weight = i16::from_be_bytes([v[2], v[3]]) as i32;
    let sign = u16::from_be_bytes([v[4], v[5]]);
    let dscale = u16::from_be_bytes([v[6], v[7]]) as usize;
    match sign {
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        _ => {}
    }
    if v.len() != 8 + 2 * ndigits {
        return Err("numeric digit count does not match its length".into());
    }
    let digit = |i: i32| -> u16 {
        if i < 0 || i as usize >= ndigits {
            0
        } else {
            let at = 8 + 2 * i as usize;
            u16::from_be_bytes([v[at], v[at + 1]])
        }
    };
    let mut s = String::new();
    if sign == 0x4000 {
        s.push('-');
    }
    if weight < 0 {
        s.push('0');
    } else {
        for i in 0..=weight {
            let d = digit(i);
            if i == 0 {
                let _ = write!(s, "{d}");
            } else {
                let _ = write!(s, "{d:04}");
            }
        }
    }
    if dscale > 0 {
        s.push('.');
        let mut frac = String::new();
        let mut i = weight + 1;
        while frac.len() < dscale {
            let _ = write!(frac, "{:04}", digit(i));
            i += 1;
        }
        frac.truncate(dscale);
        s.push_str(&frac);
    }
    Ok(s)
}

/// Binary `inet`/`cidr` → `text(inet)`: the address and its mask.
pub fn inet_text(v: &[u8]) -> Result<String, String> {
    if v.len() < 4 {
        return Err("inet value shorter than its header".into());
    }
    let (family, bits, n) = (v[0], v[1], v[3] as usize);
    let addr = v.get(4..4 + n).ok_or("inet address is truncated")?;
    let ip: std::net::IpAddr = match (family, n) {
        (2, 4) => std::net::Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]).into(),
        (3, 16) => {
            let mut a = [0u8; 16];
            a.copy_from_slice(addr);
            std::net::Ipv6Addr::from(a).into()
        }
        _ => return Err(format!("unknown inet family {family}")),
    };
    Ok(format!("{ip}/{bits}"))
}

/// Binary `timetz` (µs since midnight, zone in seconds west of UTC) → its text.
pub fn timetz_text(v: &[u8]) -> Result<String, String> {
    if v.len() != 12 {
        return Err("timetz is not 12 bytes".into());
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(&v[..8]);
    let us = i64::from_be_bytes(a);
    let west = i32::from_be_bytes([v[8], v[9], v[10], v[11]]);
    let (h, m, s, f) = (
        us / 3_600_000_000,
        us / 60_000_000 % 60,
        us / 1_000_000 % 60,
        us % 1_000_000,
    );
    let mut out = format!("{h:02}:{m:02}:{s:02}");
    if f != 0 {
        let frac = format!("{f:06}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    let east = -west;
    let sign = if east < 0 { '-' } else { '+' };
    let e = east.unsigned_abs();
    let _ = write!(out, "{sign}{:02}", e / 3600);
    if !e.is_multiple_of(3600) {
        let _ = write!(out, ":{:02}", e / 60 % 60);
        if !e.is_multiple_of(60) {
            let _ = write!(out, ":{:02}", e % 60);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(ndigits: &[u16], weight: i16, neg: bool, dscale: u16) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(ndigits.len() as u16).to_be_bytes());
        v.extend_from_slice(&weight.to_be_bytes());
        v.extend_from_slice(&(if neg { 0x4000u16 } else { 0 }).to_be_bytes());
        v.extend_from_slice(&dscale.to_be_bytes());
        for d in ndigits {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v
    }

    #[test]
    fn numeric_text_matches_numeric_out() {
        assert_eq!(
            numeric_text(&numeric(&[12, 3456, 7800], 1, false, 3)).unwrap(),
            "123456.780"
        );
        assert_eq!(
            numeric_text(&numeric(&[5], -1, true, 4)).unwrap(),
            "-0.0005"
        );
        assert_eq!(numeric_text(&numeric(&[], 0, false, 0)).unwrap(), "0");
        assert_eq!(
            numeric_text(&numeric(&[1], 2, false, 0)).unwrap(),
            "100000000"
        );
    }

    #[test]
    fn inet_and_timetz_text() {
        assert_eq!(
            inet_text(&[2, 24, 1, 4, 10, 0, 0, 0]).unwrap(),
            "10.0.0.0/24"
        );
        let mut v = vec![3, 128, 0, 16];
        v.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        assert_eq!(inet_text(&v).unwrap(), "::1/128");
        let mut t = (13 * 3_600_000_000i64 + 45 * 60_000_000)
            .to_be_bytes()
            .to_vec();
        t.extend_from_slice(&(-7200i32).to_be_bytes());
        assert_eq!(timetz_text(&t).unwrap(), "13:45:00+02");
    }
}
