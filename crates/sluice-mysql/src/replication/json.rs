//! MySQL's binary JSON (the `json` type's storage format, which its binary log carries) as the
//! text MySQL itself prints for it: what the export's `SELECT` returns for the same value, so
//! change files and snapshots agree value for value.
//!
//! The value is parsed by `mysql_common` into a document (scalars the binary format keeps
//! "opaque" included: the DECIMAL, DATE, TIME and DATETIME values SQL expressions put in a
//! document, `JSON_OBJECT('p', 12.50)`, which a conversion to `serde_json` refuses). The text
//! follows MySQL's printer: `", "` and `": "` separators, object keys in the order the binary
//! format stores them (by length, then bytes), decimals exact (`12.50`), doubles in their
//! shortest form with `.0` on integral values and an exponent past 1e17, date-times as strings
//! with six fractional digits, other opaque values as `base64:typeN:…`. Limits: MySQL prints
//! doubles with its own `%g`-like routine; a double whose shortest round-trip form differs
//! from it (rare) prints differently, with the same value.

use mysql_common::binlog::jsonb::{JsonContainer, JsonDom, JsonNumber, JsonScalar};
use std::fmt::Write;

/// The text MySQL prints for `dom`.
pub fn text(dom: &JsonDom) -> String {
    let mut out = String::new();
    push(dom, &mut out);
    out
}

fn push(dom: &JsonDom, out: &mut String) {
    match dom {
        JsonDom::Container(JsonContainer::Array(items)) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                push(v, out);
            }
            out.push(']');
        }
        JsonDom::Container(JsonContainer::Object(members)) => {
            let mut keys: Vec<&String> = members.keys().collect();
            keys.sort_by(|a, b| (a.len(), a.as_bytes()).cmp(&(b.len(), b.as_bytes())));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                string(k, out);
                out.push_str(": ");
                if let Some(v) = members.get(k) {
                    push(v, out);
                }
            }
            out.push('}');
        }
        JsonDom::Scalar(s) => scalar(s, out),
    }
}

fn scalar(s: &JsonScalar, out: &mut String) {
    match s {
        JsonScalar::Null => out.push_str("null"),
        JsonScalar::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        JsonScalar::String(v) => string(v, out),
        JsonScalar::Number(JsonNumber::Int(v)) => {
            let _ = write!(out, "{v}");
        }
        JsonScalar::Number(JsonNumber::Uint(v)) => {
            let _ = write!(out, "{v}");
        }
        JsonScalar::Number(JsonNumber::Decimal(d)) => {
            let _ = write!(out, "{d}");
        }
        JsonScalar::Number(JsonNumber::Double(v)) => double(*v, out),
        JsonScalar::DateTime(t) => {
            let _ = write!(out, "\"{t:.6}\"");
        }
        JsonScalar::Opaque(o) => {
            let _ = write!(out, "\"{o}\"");
        }
    }
}

/// Rust's shortest round-trip form; `Debug` writes `2.0` for an integral value and switches to
/// an exponent outside 1e-5..1e16, as MySQL does.
fn double(v: f64, out: &mut String) {
    let _ = write!(out, "{v:?}");
}

fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_common::binlog::jsonb::Value;
    use mysql_common::io::ParseBuf;
    use mysql_common::proto::MyDeserialize;

    fn parse(bytes: &[u8]) -> String {
        let v = Value::deserialize((), &mut ParseBuf(bytes)).unwrap_or_else(|e| panic!("{e}"));
        text(&v.parse().unwrap_or_else(|e| panic!("{e}")))
    }

    /// `JSON_OBJECT('p', 12.50)` as MySQL 8 stores it: a small object whose one value is an
    /// opaque DECIMAL (precision 4, scale 2, packed digits 0x8C 0x32), written by hand from
    /// the binary format (`json_binary.h`): element count, size, a key entry (offset, length),
    /// a value entry (type 0x0F opaque, offset), the key, the value (field type 246, length,
    /// data).
    const DECIMAL_OBJECT: [u8; 19] = [
        0x00, 0x01, 0x00, 0x12, 0x00, 0x0B, 0x00, 0x01, 0x00, 0x0F, 0x0C, 0x00, b'p', 0xF6, 0x04,
        0x04, 0x02, 0x8C, 0x32,
    ];

    #[test]
    fn an_opaque_decimal_is_printed_exactly() {
        assert_eq!(parse(&DECIMAL_OBJECT), r#"{"p": 12.50}"#);
    }

    #[test]
    fn keys_in_storage_order_and_mysql_separators() {
        let dom = JsonDom::Container(JsonContainer::Object(
            [
                (
                    "bb".to_string(),
                    JsonDom::Scalar(JsonScalar::Number(JsonNumber::Int(1))),
                ),
                (
                    "a".to_string(),
                    JsonDom::Container(JsonContainer::Array(vec![
                        JsonDom::Scalar(JsonScalar::Boolean(true)),
                        JsonDom::Scalar(JsonScalar::Null),
                        JsonDom::Scalar(JsonScalar::String("x\"y\n".into())),
                        JsonDom::Scalar(JsonScalar::Number(JsonNumber::Double(2.0))),
                        JsonDom::Scalar(JsonScalar::Number(JsonNumber::Double(1e20))),
                    ])),
                ),
            ]
            .into_iter()
            .collect(),
        ));
        assert_eq!(
            text(&dom),
            r#"{"a": [true, null, "x\"y\n", 2.0, 1e20], "bb": 1}"#
        );
    }
}
