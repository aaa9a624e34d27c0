//! Binary log values → the export's Arrow values.
//!
//! Row events carry values in the storage format, which differs from what a `SELECT` returns in
//! ways the table map does not always say (`binlog_row_metadata=FULL` says some of it, and is
//! off by default). The catalog says the rest, so each column's facts are read from
//! `information_schema` and the value is first brought to what the export's decoder receives,
//! then appended by that very decoder ([`crate::decode::ValueDecoder`]), so change files hold
//! exactly the export's values:
//!
//! | binary log                                  | made into                                  |
//! |---------------------------------------------|--------------------------------------------|
//! | integer of an `unsigned` column, read as signed (no signedness metadata) | the unsigned value (two's complement of the column's width) |
//! | signed `mediumint`, read without its sign extended | the negative value                  |
//! | `enum`: the member's number (1-based, 0 = the empty error value) | the member's text       |
//! | `set`: a bit mask                           | the members' texts joined by `,`           |
//! | `timestamp`: seconds (and fraction) since 1970, UTC | the date-time in UTC (0 is the zero date) |
//! | `year`: 1900 + the stored byte              | the year; the zero year is 0               |
//! | `binary(n)`: trailing zero bytes stripped   | padded back to n bytes                     |
//! | text in `latin1` (MySQL's cp1252)           | UTF-8, as the export's utf8mb4 session gets it |
//! | MySQL `json`: the binary JSON format        | JSON text as MySQL prints it (`json.rs`)   |
//!
//! Other character sets than utf8mb3/utf8mb4/ascii/latin1/binary, and columns the export
//! reads through a cast (`inet6`, `uuid`, … as text), are refused when the stream starts, naming
//! the column. A partial JSON update (MySQL `binlog_row_value_options=PARTIAL_JSON`) carries a
//! diff, not a value: refused at start and, if one arrives anyway, an error.

use super::rows::Cell;
use crate::decode::{DecodeError, ValueDecoder, own};
use mysql_async::Value;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::columns::ColumnBuilder;
use sluice_core::table::TableRef;
use sluice_core::{ColumnDesc, Error, Result};

/// How a column's binary log value differs from its `SELECT` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    /// Nothing to do.
    None,
    /// An unsigned integer of this many bits.
    Unsigned(u32),
    /// A signed `mediumint`: the parser does not extend its sign (3 bytes read as a
    /// non-negative number).
    Signed24,
    /// Enum members, in order.
    Enum(Vec<String>),
    /// Set members, in bit order.
    Set(Vec<String>),
    /// `timestamp`.
    Timestamp,
    /// `year`.
    Year,
    /// `binary(n)`.
    Binary(usize),
    /// Text in latin1.
    Latin1,
    /// MySQL's binary JSON.
    Json,
}

/// One column's binary log facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnFacts {
    /// The column's name.
    pub name: String,
    /// What to do to its values.
    pub fix: Fix,
}

/// The members of an `enum(…)` or `set(…)` column type, unquoted.
pub fn members(column_type: &str) -> Vec<String> {
    let Some(open) = column_type.find('(') else {
        return Vec::new();
    };
    let body = &column_type[open + 1..];
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = body.chars().peekable();
    let mut inside = false;
    while let Some(c) = chars.next() {
        match (inside, c) {
            (false, '\'') => inside = true,
            (true, '\'') if chars.peek() == Some(&'\'') => {
                chars.next();
                cur.push('\'');
            }
            (true, '\'') => {
                inside = false;
                out.push(std::mem::take(&mut cur));
            }
            (true, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            (true, c) => cur.push(c),
            (false, ')') => break,
            _ => {}
        }
    }
    out
}

pub(crate) fn facts_of(
    table: &TableRef,
    name: String,
    data_type: &str,
    column_type: &str,
    charset: &str,
    octets: u64,
) -> Result<ColumnFacts> {
    let unsigned = column_type.to_ascii_lowercase().contains("unsigned");
    let fix = match data_type {
        "tinyint" if unsigned => Fix::Unsigned(8),
        "smallint" if unsigned => Fix::Unsigned(16),
        "mediumint" if unsigned => Fix::Unsigned(24),
        "mediumint" => Fix::Signed24,
        "int" | "integer" if unsigned => Fix::Unsigned(32),
        "bigint" if unsigned => Fix::Unsigned(64),
        "enum" => Fix::Enum(members(column_type)),
        "set" => Fix::Set(members(column_type)),
        "timestamp" => Fix::Timestamp,
        "year" => Fix::Year,
        "binary" => Fix::Binary(octets as usize),
        "json" => Fix::Json,
        _ => match charset {
            "" | "utf8mb4" | "utf8mb3" | "utf8" | "ascii" | "binary" => Fix::None,
            "latin1" => Fix::Latin1,
            other => {
                return Err(Error::config(format!(
                    "{table}.{name} is in character set {other}, whose binary log bytes sluice \
                     stream does not convert (it converts utf8mb4, utf8mb3, ascii and latin1). \
                     Convert the column (ALTER TABLE … MODIFY … CHARACTER SET utf8mb4) or leave \
                     the table out of the stream."
                )));
            }
        },
    };
    Ok(ColumnFacts { name, fix })
}

/// Read the binary log facts of `table`'s columns, in table order.
pub async fn column_facts(
    conn: &mut Conn,
    table: &TableRef,
    target: &str,
) -> Result<Vec<ColumnFacts>> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT COLUMN_NAME, LOWER(DATA_TYPE), COLUMN_TYPE, \
                    COALESCE(CHARACTER_SET_NAME, ''), COALESCE(CHARACTER_OCTET_LENGTH, 0) \
             FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
             ORDER BY ORDINAL_POSITION",
            (table.schema.clone(), table.name.clone()),
        )
        .await
        .map_err(|e| crate::error::classify(e, crate::error::Phase::Catalog, target))?;
    rows.iter()
        .map(|r| {
            facts_of(
                table,
                crate::catalog::text(r, 0),
                &crate::catalog::text(r, 1),
                &crate::catalog::text(r, 2),
                &crate::catalog::text(r, 3).to_ascii_lowercase(),
                crate::catalog::number(r, 4),
            )
        })
        .collect()
}

/// Refuse columns whose export reads them through a cast (the binary log has their storage
/// bytes, which the export never sees).
pub fn check_columns(table: &TableRef, columns: &[ColumnDesc]) -> Result<()> {
    if let Some(c) = columns.iter().find(|c| c.cast.is_some()) {
        return Err(Error::config(format!(
            "{table}.{} has type {}, which the export reads as text through a cast; its binary \
             log value is the storage format, which sluice stream does not decode. Leave the \
             table out of the stream, or change the column's type.",
            c.name, c.source_type
        )));
    }
    Ok(())
}

/// MySQL's latin1 is Windows-1252 with the five undefined bytes mapped to C1 controls.
const CP1252_HIGH: [u16; 32] = [
    0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160, 0x2039,
    0x0152, 0x008D, 0x017D, 0x008F, 0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
    0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178,
];

fn latin1_to_utf8(b: &[u8]) -> Vec<u8> {
    let mut s = String::with_capacity(b.len() + 8);
    for &c in b {
        let ch = match c {
            0x80..=0x9F => char::from_u32(CP1252_HIGH[(c - 0x80) as usize] as u32).unwrap_or('?'),
            _ => c as char,
        };
        s.push(ch);
    }
    s.into_bytes()
}

/// Civil date-time (UTC) of seconds since 1970.
fn civil_utc(secs: i64, micros: u32) -> Value {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let y = (yoe + era * 400 + i64::from(m <= 2)) as u16;
    Value::Date(
        y,
        m,
        d,
        (rem / 3600) as u8,
        (rem % 3600 / 60) as u8,
        (rem % 60) as u8,
        micros,
    )
}

fn bad(msg: impl Into<String>) -> DecodeError {
    DecodeError(msg.into())
}

/// Bring one binary log value to what a `SELECT` would have given.
pub fn normalize(fix: &Fix, v: BinlogValue<'_>) -> std::result::Result<Value, DecodeError> {
    let v = match v {
        BinlogValue::Value(v) => v,
        BinlogValue::Jsonb(j) => {
            let dom = j
                .parse()
                .map_err(|e| bad(format!("a binary JSON value cannot be read: {e}")))?;
            return Ok(Value::Bytes(super::json::text(&dom).into_bytes()));
        }
        BinlogValue::JsonDiff(_) => {
            return Err(bad(
                "a partial JSON update arrived (binlog_row_value_options=PARTIAL_JSON): it \
                 carries a diff, not the value; set binlog_row_value_options='' on the server",
            ));
        }
    };
    if v == Value::NULL {
        return Ok(v);
    }
    Ok(match (fix, v) {
        (Fix::Unsigned(bits), Value::Int(n)) if n < 0 => {
            Value::UInt((n as i128 + (1i128 << bits)) as u64)
        }
        (Fix::Signed24, Value::Int(n)) if n >= 1 << 23 => Value::Int(n - (1 << 24)),
        (Fix::Enum(m), Value::Int(k)) => {
            let text = match k {
                0 => String::new(),
                k => m
                    .get((k - 1) as usize)
                    .cloned()
                    .ok_or_else(|| bad(format!("enum member {k} is not in the column's type")))?,
            };
            Value::Bytes(text.into_bytes())
        }
        (Fix::Set(m), Value::Bytes(mask)) => {
            let mut out: Vec<&str> = Vec::new();
            for (i, name) in m.iter().enumerate() {
                if mask.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0) {
                    out.push(name);
                }
            }
            Value::Bytes(out.join(",").into_bytes())
        }
        (Fix::Timestamp, Value::Int(0)) => Value::Date(0, 0, 0, 0, 0, 0, 0),
        (Fix::Timestamp, Value::Int(s)) => civil_utc(s, 0),
        (Fix::Timestamp, Value::Bytes(b)) => {
            let t = std::str::from_utf8(&b).map_err(|_| bad("unreadable timestamp"))?;
            let (s, f) = t.split_once('.').unwrap_or((t, ""));
            let secs: i64 = s
                .parse()
                .map_err(|_| bad(format!("{t:?} is not a timestamp")))?;
            let micros: u32 = if f.is_empty() {
                0
            } else {
                format!("{f:0<6}")[..6]
                    .parse()
                    .map_err(|_| bad(format!("{t:?} is not a timestamp")))?
            };
            if secs == 0 && micros == 0 {
                Value::Date(0, 0, 0, 0, 0, 0, 0)
            } else {
                civil_utc(secs, micros)
            }
        }
        (Fix::Year, Value::Bytes(b)) => {
            let y: u64 = std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("unreadable year"))?;
            Value::UInt(if y == 1900 { 0 } else { y })
        }
        (Fix::Binary(n), Value::Bytes(mut b)) if b.len() < *n => {
            b.resize(*n, 0);
            Value::Bytes(b)
        }
        (Fix::Latin1, Value::Bytes(b)) => Value::Bytes(latin1_to_utf8(&b)),
        (_, v) => v,
    })
}

/// A table's decoders: binary log facts plus the export's value decoders.
pub struct Codec {
    /// Facts per column, in table order.
    pub facts: Vec<ColumnFacts>,
    /// The export's decoders for the same columns.
    pub decoder: ValueDecoder,
    /// Per column: its stored bytes are the value the export appends (text in UTF-8 or binary,
    /// nothing to convert), so a [`Cell::Bytes`] goes in as it is.
    stored_as_is: Vec<bool>,
    /// Per column: the scale the export writes a 128-bit decimal at, where a
    /// [`Cell::Decimal`] of that scale goes in as its integer.
    decimal_scale: Vec<Option<u8>>,
}

impl Codec {
    /// The decoders of a table whose columns have these facts and export decoders.
    pub fn new(facts: Vec<ColumnFacts>, decoder: ValueDecoder) -> Self {
        let stored_as_is = facts
            .iter()
            .enumerate()
            .map(|(i, f)| f.fix == Fix::None && decoder.plain_bytes(i))
            .collect();
        let decimal_scale = facts
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let s = decoder.decimal128_scale(i)?;
                (f.fix == Fix::None).then(|| u8::try_from(s).ok()).flatten()
            })
            .collect();
        Codec {
            facts,
            decoder,
            stored_as_is,
            decimal_scale,
        }
    }

    /// Append value `v` of column `i` to `col`.
    pub fn push(
        &mut self,
        i: usize,
        col: &mut ColumnBuilder,
        v: BinlogValue<'_>,
    ) -> std::result::Result<(), DecodeError> {
        let v = normalize(&self.facts[i].fix, v)?;
        self.decoder.push(i, col, v)
    }

    /// Append cell `c` of column `i` to `col`: stored bytes as they are where the export
    /// appends them so, through [`Codec::push`] otherwise.
    pub fn push_cell(
        &mut self,
        i: usize,
        col: &mut ColumnBuilder,
        c: Cell<'_>,
    ) -> std::result::Result<(), DecodeError> {
        match c {
            Cell::Bytes(b) if self.stored_as_is.get(i).copied().unwrap_or(false) => {
                col.push_bytes(b).map_err(own)
            }
            Cell::Bytes(b) => self.push(i, col, BinlogValue::Value(Value::Bytes(b.to_vec()))),
            Cell::Decimal { unscaled, scale }
                if self.decimal_scale.get(i).copied().flatten() == Some(scale) =>
            {
                col.push_i128(unscaled).map_err(own)
            }
            Cell::Decimal { unscaled, scale } => {
                let text = decimal_text(unscaled, scale).into_bytes();
                self.push(i, col, BinlogValue::Value(Value::Bytes(text)))
            }
            Cell::Value(v) => self.push(i, col, v),
        }
    }
}

/// A decimal's text as the driver writes it (`-12.50`), for a column the export does not
/// write as a 128-bit decimal of the same scale.
fn decimal_text(unscaled: i128, scale: u8) -> String {
    let s = usize::from(scale);
    let digits = format!("{:0>w$}", unscaled.unsigned_abs(), w = s + 1);
    let (int, frac) = digits.split_at(digits.len() - s);
    let sign = if unscaled < 0 { "-" } else { "" };
    if s == 0 {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_texts() {
        assert_eq!(decimal_text(-1250, 2), "-12.50");
        assert_eq!(decimal_text(5, 2), "0.05");
        assert_eq!(decimal_text(0, 0), "0");
        assert_eq!(decimal_text(-7, 0), "-7");
        assert_eq!(decimal_text(1, 38), format!("0.{}1", "0".repeat(37)));
    }

    #[test]
    fn enum_and_set_members() {
        assert_eq!(members("enum('a','b''c','d,e')"), vec!["a", "b'c", "d,e"]);
        let set = Fix::Set(members("set('x','y','z')"));
        let v = normalize(&set, BinlogValue::Value(Value::Bytes(vec![0b101]))).unwrap();
        assert_eq!(v, Value::Bytes(b"x,z".to_vec()));
        let e = Fix::Enum(members("enum('a','b')"));
        assert_eq!(
            normalize(&e, BinlogValue::Value(Value::Int(2))).unwrap(),
            Value::Bytes(b"b".to_vec())
        );
        assert_eq!(
            normalize(&e, BinlogValue::Value(Value::Int(0))).unwrap(),
            Value::Bytes(Vec::new())
        );
    }

    #[test]
    fn storage_formats_become_select_values() {
        let u = |bits, n| normalize(&Fix::Unsigned(bits), BinlogValue::Value(Value::Int(n)));
        assert_eq!(u(8, -1).unwrap(), Value::UInt(255));
        assert_eq!(u(64, -1).unwrap(), Value::UInt(u64::MAX));
        assert_eq!(u(32, 7).unwrap(), Value::Int(7));
        let m = |n| normalize(&Fix::Signed24, BinlogValue::Value(Value::Int(n))).unwrap();
        assert_eq!(m(8_388_608), Value::Int(-8_388_608));
        assert_eq!(m(16_777_215), Value::Int(-1));
        assert_eq!(m(8_388_607), Value::Int(8_388_607));
        let ts = |s: &str| {
            normalize(
                &Fix::Timestamp,
                BinlogValue::Value(Value::Bytes(s.as_bytes().to_vec())),
            )
            .unwrap()
        };
        assert_eq!(ts("0"), Value::Date(0, 0, 0, 0, 0, 0, 0));
        assert_eq!(
            ts("951782400.5"),
            Value::Date(2000, 2, 29, 0, 0, 0, 500_000)
        );
        let y = normalize(
            &Fix::Year,
            BinlogValue::Value(Value::Bytes(b"1900".to_vec())),
        );
        assert_eq!(y.unwrap(), Value::UInt(0));
        let b = normalize(&Fix::Binary(4), BinlogValue::Value(Value::Bytes(vec![1])));
        assert_eq!(b.unwrap(), Value::Bytes(vec![1, 0, 0, 0]));
        assert_eq!(latin1_to_utf8(&[0x80, b'a', 0xE9]), "€aé".as_bytes());
    }
}
