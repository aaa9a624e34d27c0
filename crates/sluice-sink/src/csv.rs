//! CSV part writer (RFC 4180 quoting, LF line ends), optionally gzip or zstd compressed
//! (`compress.rs`).
//!
//! Rows are rendered into a buffer and handed to the destination in blocks of about 1 MB. A
//! field is quoted when it contains the delimiter, a quote, CR or LF, or equals the NULL text;
//! an empty string is always quoted, so with the default empty NULL, `,,` is NULL and `,"",`
//! is an empty string — the same convention PostgreSQL's CSV uses.

use crate::compress::{TextPart, TextRows, TextWriter};
use crate::destination::CountingWriter;
use crate::format::CsvOptions;
use crate::render::renderer;
use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_buffer::NullBuffer;
use arrow_schema::SchemaRef;
use sluice_core::{Error, Result};

/// One CSV part file being written.
pub(crate) type CsvPart = TextWriter<CsvRows>;

/// CSV's side of a part: its options and a field rendered aside.
pub(crate) struct CsvRows {
    options: CsvOptions,
    field: Vec<u8>,
}

impl CsvPart {
    /// Start a part; writes the header if asked.
    pub fn new(
        schema: SchemaRef,
        out: CountingWriter,
        options: CsvOptions,
        path: &str,
    ) -> Result<Self> {
        if !options.delimiter.is_ascii() || matches!(options.delimiter, b'"' | b'\r' | b'\n') {
            return Err(Error::config(format!(
                "CSV delimiter {:?} cannot be used: choose one ASCII character other than a quote, \
                 CR or LF.",
                options.delimiter as char
            )));
        }
        if options
            .null
            .bytes()
            .any(|b| b == options.delimiter || matches!(b, b'"' | b'\r' | b'\n'))
        {
            return Err(Error::config(format!(
                "CSV NULL text {:?} contains the delimiter, a quote or a line break, so NULL \
                 could not be told apart from data: choose a text without them.",
                options.null
            )));
        }
        let mut part = CsvPart {
            text: TextPart::new(out, options.compression, path)?,
            format: CsvRows {
                options,
                field: Vec::new(),
            },
        };
        let (csv, buf) = (&mut part.format, &mut part.text.buf);
        if csv.options.header {
            for (i, f) in schema.fields().iter().enumerate() {
                if i > 0 {
                    buf.push(csv.options.delimiter);
                }
                csv.field.clear();
                csv.field.extend_from_slice(f.name().as_bytes());
                csv.push_field(buf, false, true);
            }
            buf.extend_from_slice(b"\n");
        }
        Ok(part)
    }
}

impl CsvRows {
    /// Append the rendered field, quoted if it must be. `scan` is false for columns whose text
    /// (numbers, dates, times) cannot contain the delimiter, a quote or a line break.
    fn push_field(&self, buf: &mut Vec<u8>, from_value: bool, scan: bool) {
        let d = self.options.delimiter;
        let needs = (from_value && self.field.is_empty())
            || (!self.options.null.is_empty() && self.field == self.options.null.as_bytes())
            || (scan
                && self
                    .field
                    .iter()
                    .any(|&c| c == d || c == b'"' || c == b'\r' || c == b'\n'));
        if needs {
            buf.push(b'"');
            for &c in &self.field {
                if c == b'"' {
                    buf.push(b'"');
                }
                buf.push(c);
            }
            buf.push(b'"');
        } else {
            buf.extend_from_slice(&self.field);
        }
    }

    /// Append a text value, quoted if it must be, without copying it aside first.
    fn push_text(&self, buf: &mut Vec<u8>, v: &[u8]) {
        let d = self.options.delimiter;
        let needs = v.is_empty()
            || (!self.options.null.is_empty() && v == self.options.null.as_bytes())
            || v.iter()
                .any(|&c| c == d || c == b'"' || c == b'\r' || c == b'\n');
        if needs {
            buf.push(b'"');
            for &c in v {
                if c == b'"' {
                    buf.push(b'"');
                }
                buf.push(c);
            }
            buf.push(b'"');
        } else {
            buf.extend_from_slice(v);
        }
    }
}

impl TextRows for CsvRows {
    fn rows(&mut self, batch: &RecordBatch, text: &mut TextPart) -> Result<()> {
        let columns = batch.columns();
        let schema = batch.schema();
        let renders = columns
            .iter()
            .zip(schema.fields())
            .map(|(a, f)| renderer(a, f))
            .collect::<Result<Vec<_>>>()?;
        // How each column's values reach the line: straight into it when the type's text can
        // need no quoting and cannot equal the NULL text; text columns are scanned where they
        // lie; anything else is rendered aside and then quoted if it must be.
        let null_is_plain = self.options.null.bytes().all(plain_byte);
        let ways: Vec<Way> = columns
            .iter()
            .zip(schema.fields())
            .map(|(a, f)| {
                if plain_text(f.data_type(), self.options.delimiter)
                    && (self.options.null.is_empty() || !null_is_plain)
                {
                    Way::Direct
                } else if let Some(s) = a.as_string_opt::<i32>() {
                    Way::Text(s)
                } else {
                    Way::Aside(!plain_text(f.data_type(), self.options.delimiter))
                }
            })
            .collect();
        let nulls: Vec<Option<&NullBuffer>> = columns.iter().map(|a| a.nulls()).collect();
        let delimiter = self.options.delimiter;
        for row in 0..batch.num_rows() {
            for (c, render) in renders.iter().enumerate() {
                if c > 0 {
                    text.buf.push(delimiter);
                }
                if nulls[c].is_some_and(|n| n.is_null(row)) {
                    text.buf.extend_from_slice(self.options.null.as_bytes());
                    continue;
                }
                match &ways[c] {
                    Way::Direct => render(row, &mut text.buf),
                    Way::Text(s) => self.push_text(&mut text.buf, s.value(row).as_bytes()),
                    Way::Aside(scan) => {
                        self.field.clear();
                        render(row, &mut self.field);
                        self.push_field(&mut text.buf, true, *scan);
                    }
                }
            }
            text.buf.push(b'\n');
            text.row_done()?;
        }
        Ok(())
    }
}

/// How a column's values are written (see [`CsvPart::write`]).
enum Way<'a> {
    /// Rendered straight into the line.
    Direct,
    /// Text scanned in place.
    Text(&'a arrow_array::StringArray),
    /// Rendered aside, then quoted if needed; `true` when the text must be scanned.
    Aside(bool),
}

/// Whether `b` can occur in the text of a [`plain_text`] type (digits, signs, separators and the
/// letters of `NaN`, `Infinity`, `true`, `false`, exponents and `Z`). A NULL text with any other
/// byte can never equal such a value.
fn plain_byte(b: u8) -> bool {
    b.is_ascii_digit() || b"+-.: eEZNaIinfinityrueals".contains(&b)
}

/// Whether values of this type always render as text free of the delimiter, quotes and line
/// breaks: digits, signs, `.`, `:`, `-`, spaces, letters of `NaN`/`Infinity`/`e`/`Z`/`true`.
/// Only for the usual delimiters; any other delimiter scans every field.
fn plain_text(dt: &arrow_schema::DataType, delimiter: u8) -> bool {
    use arrow_schema::DataType::*;
    matches!(delimiter, b',' | b'\t' | b';' | b'|')
        && matches!(
            dt,
            Boolean
                | Int8
                | Int16
                | Int32
                | Int64
                | UInt8
                | UInt16
                | UInt32
                | UInt64
                | Float32
                | Float64
                | Decimal128(..)
                | Decimal256(..)
                | Date32
                | Time64(_)
                | Timestamp(..)
        )
}
