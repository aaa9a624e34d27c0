//! JSON Lines part writer: one JSON object per row, its keys the columns in schema order,
//! `\n` after each; optionally gzip or zstd compressed (`compress.rs`).
//!
//! Values are written so that nothing is lost and a reader needs no schema to tell types
//! apart where JSON's own types would lose something:
//!
//! | Arrow                        | JSON                                                        |
//! |------------------------------|-------------------------------------------------------------|
//! | NULL                         | `null`                                                      |
//! | Boolean                      | `true` / `false`                                            |
//! | integers (64-bit included)   | number, every digit (`9223372036854775807`)                 |
//! | floats                       | shortest exact number; `"NaN"`, `"Infinity"`, `"-Infinity"` |
//! | Decimal128/256               | string with the column's scale (`"12.50"`)                  |
//! | Utf8 (json/jsonb included)   | string                                                      |
//! | Binary                       | string, standard base64 with padding                        |
//! | FixedSizeBinary + arrow.uuid | string `8-4-4-4-12`                                         |
//! | Date32                       | string `YYYY-MM-DD`; `"infinity"`, `"-infinity"`            |
//! | Time64(µs)                   | string `HH:MM:SS[.ffffff]`                                  |
//! | Timestamp(µs, zone)          | string `YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00`                 |
//! | Timestamp(µs) without zone   | string `YYYY-MM-DDTHH:MM:SS[.ffffff]`                       |
//! | sluice.interval struct       | string, ISO 8601 duration (`"P1Y2M3DT4H5M6.5S"`)            |
//! | List                         | array of the items, each by these rules                     |
//! | any other Struct (`_before`) | object of its fields, each by these rules                   |
//! | anything else                | string, Arrow's display form                                |
//!
//! Numbers beyond 2^53 are exact in the text; a reader that parses every number as a double
//! (JavaScript) rounds them, as it would any JSON.

use crate::compress::{TextPart, TextRows, TextWriter};
use crate::destination::CountingWriter;
use crate::format::JsonlOptions;
use crate::render::{Render, bytes_as, json_object, json_string, member_key, renderer};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;
use arrow_schema::{DataType, Field};
use base64::Engine;
use sluice_core::Result;
use std::cell::RefCell;

/// One JSON Lines part file being written.
pub(crate) type JsonlPart = TextWriter<JsonlRows>;

/// JSON Lines' side of a part (it keeps nothing between batches).
pub(crate) struct JsonlRows;

impl JsonlPart {
    /// Start a part writing to `out` (which writes `path`).
    pub fn new(out: CountingWriter, options: &JsonlOptions, path: &str) -> Result<Self> {
        Ok(JsonlPart {
            text: TextPart::new(out, options.compression, path)?,
            format: JsonlRows,
        })
    }
}

impl TextRows for JsonlRows {
    fn rows(&mut self, batch: &RecordBatch, text: &mut TextPart) -> Result<()> {
        let schema = batch.schema();
        let keys: Vec<Vec<u8>> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let mut k = if i > 0 { vec![b','] } else { Vec::new() };
                k.extend(member_key(f));
                k
            })
            .collect();
        let values = batch
            .columns()
            .iter()
            .zip(schema.fields())
            .map(|(a, f)| json_value(a, f))
            .collect::<Result<Vec<_>>>()?;
        let columns = batch.columns();
        for row in 0..batch.num_rows() {
            text.buf.push(b'{');
            for (c, value) in values.iter().enumerate() {
                text.buf.extend_from_slice(&keys[c]);
                if columns[c].is_null(row) {
                    text.buf.extend_from_slice(b"null");
                } else {
                    value(row, &mut text.buf);
                }
            }
            text.buf.extend_from_slice(b"}\n");
            text.row_done()?;
        }
        Ok(())
    }
}

/// Text that needs no JSON escaping (digits, signs, separators) between quotes.
fn quoted(inner: Render<'_>) -> Render<'_> {
    Box::new(move |i, o| {
        o.push(b'"');
        inner(i, o);
        o.push(b'"');
    })
}

/// A writer of the JSON value at a row of `array` (not NULL; items of lists may be).
fn json_value<'a>(array: &'a ArrayRef, field: &Field) -> Result<Render<'a>> {
    let uuid = field
        .metadata()
        .get(EXTENSION_TYPE_NAME_KEY)
        .is_some_and(|e| e == "arrow.uuid");
    Ok(match array.data_type() {
        t if t == &DataType::Boolean || t.is_integer() => renderer(array, field)?,
        DataType::Float32 | DataType::Float64 => {
            let inner = renderer(array, field)?;
            Box::new(move |i, o| {
                let start = o.len();
                inner(i, o);
                // NaN and the infinities have no JSON number: they are written as strings.
                if matches!(o.get(start), Some(b'N' | b'I')) || o[start..].starts_with(b"-I") {
                    o.insert(start, b'"');
                    o.push(b'"');
                }
            })
        }
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            Box::new(move |i, o| json_string(o, a.value(i).as_bytes()))
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            Box::new(move |i, o| json_string(o, a.value(i).as_bytes()))
        }
        DataType::Binary | DataType::LargeBinary => bytes_as(array, base64),
        DataType::FixedSizeBinary(_) if !uuid => bytes_as(array, base64),
        DataType::Timestamp(..) => {
            let inner = renderer(array, field)?;
            Box::new(move |i, o| {
                let start = o.len();
                o.push(b'"');
                inner(i, o);
                // The CSV form `YYYY-MM-DD HH:MM:SS[.f][Z]` made ISO 8601 with an offset.
                if let Some(p) = o[start..].iter().position(|&b| b == b' ') {
                    o[start + p] = b'T';
                }
                if o.last() == Some(&b'Z') {
                    o.pop();
                    o.extend_from_slice(b"+00:00");
                }
                o.push(b'"');
            })
        }
        DataType::Decimal128(..)
        | DataType::Decimal256(..)
        | DataType::FixedSizeBinary(_)
        | DataType::Date32
        | DataType::Time64(_) => quoted(renderer(array, field)?),
        DataType::Struct(_)
            if field
                .metadata()
                .get(EXTENSION_TYPE_NAME_KEY)
                .is_some_and(|e| e == "sluice.interval") =>
        {
            quoted(renderer(array, field)?)
        }
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let members = fields
                .iter()
                .zip(s.columns())
                .map(|(f, c)| Ok((member_key(f), c, json_value(c, f)?)))
                .collect::<Result<Vec<_>>>()?;
            json_object(members)
        }
        DataType::List(item) => {
            let list = array.as_list::<i32>();
            let values = list.values();
            let inner = json_value(values, item)?;
            Box::new(move |i, o| {
                let offsets = list.value_offsets();
                o.push(b'[');
                for j in offsets[i] as usize..offsets[i + 1] as usize {
                    if j > offsets[i] as usize {
                        o.push(b',');
                    }
                    if values.is_null(j) {
                        o.extend_from_slice(b"null");
                    } else {
                        inner(j, o);
                    }
                }
                o.push(b']');
            })
        }
        _ => {
            let inner = renderer(array, field)?;
            let tmp = RefCell::new(Vec::new());
            Box::new(move |i, o| {
                let mut t = tmp.borrow_mut();
                t.clear();
                inner(i, &mut t);
                json_string(o, &t);
            })
        }
    })
}

fn base64(o: &mut Vec<u8>, bytes: &[u8]) {
    let e = &base64::engine::general_purpose::STANDARD;
    let start = o.len() + 1;
    o.push(b'"');
    o.resize(
        start + base64::encoded_len(bytes.len(), true).unwrap_or(0),
        0,
    );
    let n = e.encode_slice(bytes, &mut o[start..]).unwrap_or(0);
    o.truncate(start + n);
    o.push(b'"');
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use arrow_array::{Float64Array, TimestampMicrosecondArray};
    use std::sync::Arc;

    fn one(a: ArrayRef, f: Field, row: usize) -> String {
        let r = json_value(&a, &f).unwrap();
        let mut o = Vec::new();
        r(row, &mut o);
        String::from_utf8(o).unwrap()
    }

    #[test]
    fn values_are_json() {
        let ts: ArrayRef =
            Arc::new(TimestampMicrosecondArray::from(vec![1_500_000]).with_timezone("UTC"));
        let f = Field::new("t", ts.data_type().clone(), true);
        assert_eq!(one(ts, f, 0), "\"1970-01-01T00:00:01.5+00:00\"");
        let fl: ArrayRef = Arc::new(Float64Array::from(vec![f64::NAN, -f64::INFINITY, 0.5]));
        let f = Field::new("f", DataType::Float64, true);
        assert_eq!(one(fl.clone(), f.clone(), 0), "\"NaN\"");
        assert_eq!(one(fl.clone(), f.clone(), 1), "\"-Infinity\"");
        assert_eq!(one(fl, f, 2), "0.5");
        let b: ArrayRef = Arc::new(arrow_array::BinaryArray::from(vec![&b"\x00\xffa"[..]]));
        let f = Field::new("b", DataType::Binary, true);
        assert_eq!(one(b, f, 0), "\"AP9h\"");
    }

    #[test]
    fn a_record_of_columns_is_an_object_of_values() {
        let (s, f) = record();
        assert_eq!(
            one(s.clone(), f.clone(), 0),
            r#"{"id":1,"v":"a\"b","t":null}"#
        );
        assert_eq!(
            one(s, f, 1),
            r#"{"id":2,"v":null,"t":"1970-01-01T00:00:01+00:00"}"#
        );
    }

    /// A struct like a change file's `_before`: an integer, a text, a timestamp, with NULLs.
    pub(crate) fn record() -> (ArrayRef, Field) {
        let fields = vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
            Field::new(
                "t",
                DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ];
        let columns: Vec<ArrayRef> = vec![
            Arc::new(arrow_array::Int64Array::from(vec![1, 2])),
            Arc::new(arrow_array::StringArray::from(vec![Some("a\"b"), None])),
            Arc::new(
                TimestampMicrosecondArray::from(vec![None, Some(1_000_000)]).with_timezone("UTC"),
            ),
        ];
        let s = arrow_array::StructArray::new(fields.clone().into(), columns, None);
        let f = Field::new("_before", DataType::Struct(fields.into()), true);
        (Arc::new(s), f)
    }
}
