//! Row images of rows events, read with a table map's column layout worked out once.
//!
//! `mysql_common`'s row iterator re-reads the table map's optional metadata and builds a column
//! description (names, schema, flags: five allocations per column) for every row it returns,
//! then hands the values over in a fresh vector: most of a narrow change's client time. Here
//! a table map's layout (each column's type, metadata and signedness) is computed once per
//! table map, and each image is read value by value into a vector reused for the whole event;
//! the values themselves are decoded by `mysql_common` exactly as before
//! ([`BinlogValue`]'s own deserializer), so nothing about what a value becomes changes.
//!
//! Text and binary columns (`varchar`, `char`, `*text`, `*blob`) are not decoded at all: their
//! cell is the bytes as they lie in the event ([`Cell::Bytes`], their length prefix read from the
//! table map's metadata as the driver reads it), so a string costs no allocation; the caller
//! appends them as they are where the export would too, and hands them to the driver's value
//! type otherwise. Decimals of up to 38 digits are read from their binary form straight into
//! an integer at the column's scale ([`Cell::Decimal`]); the driver would write each as text
//! for the export's decoder to parse back.
//!
//! An image: a NULL bitmap over the columns the event's column bitmap marks present, then
//! those columns' values, NULLs left out. Partial JSON updates (MySQL's shared image) are
//! refused before a rows event gets here.

use mysql_async::binlog::events::{OptionalMetaExtractor, TableMapEvent};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_common::io::ParseBuf;
use std::io;

/// One column as a table map describes it.
#[derive(Debug, Clone, PartialEq)]
struct Col {
    ty: ColumnType,
    meta: Vec<u8>,
    unsigned: bool,
    /// For a text or binary column: the width of its values' length prefix.
    prefix: Option<u8>,
    /// For a decimal of at most 38 digits: its precision and scale.
    decimal: Option<(u8, u8)>,
}

/// One value of a row image.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell<'a> {
    /// A text or binary column's bytes, as stored.
    Bytes(&'a [u8]),
    /// A decimal of at most 38 digits: its digits as an integer, and its scale (the value is
    /// `unscaled / 10^scale`).
    Decimal {
        /// The digits, sign included.
        unscaled: i128,
        /// Digits after the point.
        scale: u8,
    },
    /// Any other value (NULL included), decoded by the driver.
    Value(BinlogValue<'a>),
}

/// Bytes of a group of 0–9 decimal digits in MySQL's binary decimal format.
const DIGIT_BYTES: [usize; 10] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4];

/// Precision and scale of a decimal column read by [`read_decimal`] (`None`: another column,
/// or more than 38 digits, left to the driver).
fn decimal_of(ty: ColumnType, meta: &[u8]) -> Option<(u8, u8)> {
    match (ty, meta) {
        (ColumnType::MYSQL_TYPE_NEWDECIMAL, &[p, s, ..]) if p <= 38 && s <= p => Some((p, s)),
        _ => None,
    }
}

/// Read a decimal in MySQL's binary format (`decimal2bin`): the integer digits then the
/// fraction digits, each side in big-endian groups of nine digits in 4 bytes, with a shorter
/// group of the leftover integer digits first and of the leftover fraction digits last; the
/// first byte's top bit is flipped, and every byte inverted for a negative value.
fn read_decimal(buf: &mut ParseBuf<'_>, precision: u8, scale: u8) -> io::Result<i128> {
    let (intg, frac) = (usize::from(precision - scale), usize::from(scale));
    let size = (intg / 9 + frac / 9) * 4 + DIGIT_BYTES[intg % 9] + DIGIT_BYTES[frac % 9];
    let raw: &[u8] = buf.parse(size)?;
    let negative = raw.first().is_some_and(|b| b & 0x80 == 0);
    let invert = if negative { 0xFF } else { 0 };
    let mut bytes = raw
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ invert ^ if i == 0 { 0x80 } else { 0 });
    // Digits per group, left to right.
    let groups = (intg % 9 > 0)
        .then_some(intg % 9)
        .into_iter()
        .chain(std::iter::repeat_n(9, intg / 9 + frac / 9))
        .chain((frac % 9 > 0).then_some(frac % 9));
    let mut v: i128 = 0;
    for digits in groups {
        let g = (&mut bytes)
            .take(DIGIT_BYTES[digits])
            .fold(0u32, |g, b| (g << 8) | u32::from(b));
        let base = 10u32.pow(digits as u32);
        if g >= base {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a decimal({precision},{scale}) value holds the digit group {g}"),
            ));
        }
        // At most 38 digits: no overflow.
        v = v * i128::from(base) + i128::from(g);
    }
    Ok(if negative { -v } else { v })
}

/// The length prefix of a text or binary column's values, as `mysql_common` reads it (`None`:
/// not such a column).
fn prefix_of(ty: ColumnType, meta: &[u8]) -> Option<u8> {
    let m = |i: usize| meta.get(i).copied().map(usize::from);
    match ty {
        ColumnType::MYSQL_TYPE_VARCHAR | ColumnType::MYSQL_TYPE_VAR_STRING => {
            let len = m(0)? | (m(1)? << 8);
            Some(if len < 256 { 1 } else { 2 })
        }
        ColumnType::MYSQL_TYPE_STRING => {
            let (b0, b1) = (m(0)?, m(1)?);
            if b0 == 0 {
                return None;
            }
            let len = if (b0 & 0x30) != 0x30 {
                b1 | (((b0 & 0x30) ^ 0x30) << 4)
            } else {
                b1
            };
            Some(if len < 256 { 1 } else { 2 })
        }
        ColumnType::MYSQL_TYPE_TINY_BLOB
        | ColumnType::MYSQL_TYPE_MEDIUM_BLOB
        | ColumnType::MYSQL_TYPE_LONG_BLOB
        | ColumnType::MYSQL_TYPE_BLOB => match m(0)? {
            n @ 1..=4 => Some(n as u8),
            _ => None,
        },
        _ => None,
    }
}

/// The columns of a table map, in table order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Layout {
    cols: Vec<Col>,
}

impl Layout {
    /// The layout of `tme`: its column types and metadata, and the signedness its optional
    /// metadata gives for numeric columns (as `mysql_common` reads it).
    pub fn of(tme: &TableMapEvent<'_>) -> io::Result<Layout> {
        let extractor = OptionalMetaExtractor::new(tme.iter_optional_meta())?;
        let mut signedness = extractor.iter_signedness();
        let n = tme.columns_count() as usize;
        let mut cols = Vec::with_capacity(n);
        for i in 0..n {
            let ty = tme
                .get_column_type(i)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no column type"))?;
            let unsigned = ty
                .is_numeric_type()
                .then(|| signedness.next())
                .flatten()
                .unwrap_or(false);
            let meta = tme.get_column_metadata(i).unwrap_or(&[]).to_vec();
            cols.push(Col {
                prefix: prefix_of(ty, &meta),
                decimal: decimal_of(ty, &meta),
                ty,
                meta,
                unsigned,
            });
        }
        Ok(Layout { cols })
    }

    /// Columns in the table map.
    pub fn columns(&self) -> usize {
        self.cols.len()
    }
}

/// Read one image from `buf`: `present` lists the columns it carries (the event's column
/// bitmap, as indexes in increasing order); `out` gets one entry per table column up to
/// `keep`, `None` for a column the image does not carry. Columns at `keep` or past it are
/// read and dropped.
pub fn read_image<'a>(
    buf: &mut ParseBuf<'a>,
    layout: &'a Layout,
    present: &[usize],
    keep: usize,
    out: &mut Vec<Option<Cell<'a>>>,
) -> io::Result<()> {
    out.clear();
    out.resize_with(keep, || None);
    let nulls: &[u8] = buf.parse(present.len().div_ceil(8))?;
    for (k, &i) in present.iter().enumerate() {
        let null = nulls[k / 8] & (1 << (k % 8)) != 0;
        let v = if null {
            Cell::Value(BinlogValue::Value(mysql_async::Value::NULL))
        } else {
            let c = layout.cols.get(i).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a row carries column {i}, which its table map lacks"),
                )
            })?;
            match (c.prefix, c.decimal) {
                (Some(width), _) => {
                    let len: &[u8] = buf.parse(usize::from(width))?;
                    let n = len
                        .iter()
                        .rev()
                        .fold(0usize, |n, b| (n << 8) | usize::from(*b));
                    Cell::Bytes(buf.parse(n)?)
                }
                (None, Some((precision, scale))) => Cell::Decimal {
                    unscaled: read_decimal(buf, precision, scale)?,
                    scale,
                },
                (None, None) => Cell::Value(buf.parse::<BinlogValue<'a>>((
                    c.ty,
                    &c.meta[..],
                    c.unsigned,
                    false,
                ))?),
            }
        };
        if let Some(slot) = out.get_mut(i) {
            *slot = Some(v);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_async::Value;

    fn layout() -> Layout {
        Layout {
            cols: vec![
                Col {
                    ty: ColumnType::MYSQL_TYPE_LONG,
                    meta: vec![],
                    unsigned: false,
                    prefix: None,
                    decimal: None,
                },
                Col {
                    ty: ColumnType::MYSQL_TYPE_VARCHAR,
                    meta: vec![40, 0],
                    unsigned: false,
                    prefix: prefix_of(ColumnType::MYSQL_TYPE_VARCHAR, &[40, 0]),
                    decimal: None,
                },
                Col {
                    ty: ColumnType::MYSQL_TYPE_LONGLONG,
                    meta: vec![],
                    unsigned: false,
                    prefix: None,
                    decimal: None,
                },
            ],
        }
    }

    #[test]
    fn images_with_nulls_and_absent_columns() {
        // Row 1: all three columns, the second NULL. Row 2: columns 0 and 2 only.
        let mut data = vec![0b010];
        data.extend(7i32.to_le_bytes());
        data.extend((-2i64).to_le_bytes());
        data.push(0b00);
        data.extend(9i32.to_le_bytes());
        data.extend(5i64.to_le_bytes());
        let mut buf = ParseBuf(&data);
        let l = layout();
        let mut out = Vec::new();
        read_image(&mut buf, &l, &[0, 1, 2], 3, &mut out).unwrap();
        assert_eq!(
            out,
            vec![
                Some(Cell::Value(BinlogValue::Value(Value::Int(7)))),
                Some(Cell::Value(BinlogValue::Value(Value::NULL))),
                Some(Cell::Value(BinlogValue::Value(Value::Int(-2)))),
            ]
        );
        read_image(&mut buf, &l, &[0, 2], 2, &mut out).unwrap();
        assert_eq!(
            out,
            vec![Some(Cell::Value(BinlogValue::Value(Value::Int(9)))), None]
        );
        assert!(buf.is_empty(), "the dropped column was read past");
    }

    #[test]
    fn strings_by_their_length_prefix() {
        let mut data = vec![0b000];
        data.extend(1i32.to_le_bytes());
        data.push(3);
        data.extend(b"abc");
        data.extend(0i64.to_le_bytes());
        let mut buf = ParseBuf(&data);
        let l = layout();
        let mut out = Vec::new();
        read_image(&mut buf, &l, &[0, 1, 2], 3, &mut out).unwrap();
        assert_eq!(out[1], Some(Cell::Bytes(b"abc")));
        let short = [0u8, 1];
        let e = read_image(&mut ParseBuf(&short), &l, &[0], 1, &mut out).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// `text` in the binary form of a decimal(p, s) column, as the server writes it.
    fn encode(text: &str, p: u8, s: u8) -> Vec<u8> {
        let (negative, digits) = match text.strip_prefix('-') {
            Some(t) => (true, t),
            None => (false, text),
        };
        let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let (intg, fracg) = (usize::from(p - s), usize::from(s));
        let int = format!("{:0>intg$}", int.trim_start_matches('0'));
        let frac = format!("{frac:0<fracg$}");
        let mut groups: Vec<&str> = Vec::new();
        let lead = intg % 9;
        if lead > 0 {
            groups.push(&int[..lead]);
        }
        groups.extend(
            int.as_bytes()[lead..]
                .chunks(9)
                .map(|c| std::str::from_utf8(c).unwrap()),
        );
        groups.extend(
            frac.as_bytes()
                .chunks(9)
                .map(|c| std::str::from_utf8(c).unwrap()),
        );
        let mut out: Vec<u8> = Vec::new();
        for g in groups {
            let v: u32 = g.parse().unwrap();
            out.extend(&v.to_be_bytes()[4 - DIGIT_BYTES[g.len()]..]);
        }
        if negative {
            out.iter_mut().for_each(|b| *b = !*b);
        }
        out[0] ^= 0x80;
        out
    }

    #[test]
    fn decimals_read_as_the_driver_reads_them() {
        use mysql_common::binlog::decimal::Decimal;
        let cases: &[(u8, u8, &[&str])] = &[
            (
                12,
                2,
                &[
                    "0.00",
                    "1.00",
                    "-1.00",
                    "1234567890.12",
                    "-9999999999.99",
                    "0.05",
                ],
            ),
            (10, 0, &["0", "7", "-7", "9999999999", "-1000000000"]),
            (38, 0, &["99999999999999999999999999999999999999", "-1"]),
            (
                38,
                38,
                &["0.00000000000000000000000000000000000001", "-0.5"],
            ),
            (
                38,
                10,
                &["1234567890123456789012345678.0123456789", "-0.0000000001"],
            ),
            (20, 7, &["1.5", "-1234567890123.1234567", "0.0000001"]),
            (3, 1, &["-99.9", "0.1", "12.3"]),
        ];
        for &(p, s, texts) in cases {
            for text in texts {
                let bin = encode(text, p, s);
                // The driver reads the same bytes as the same number.
                let driver = Decimal::read_bin(&bin[..], usize::from(p), usize::from(s), false)
                    .unwrap()
                    .to_string();
                let (ours, theirs) = (text.parse::<f64>().unwrap(), driver.parse::<f64>().unwrap());
                assert_eq!(
                    ours, theirs,
                    "{text} as decimal({p},{s}): the driver read {driver}"
                );
                let mut buf = ParseBuf(&bin);
                let got = read_decimal(&mut buf, p, s).unwrap();
                assert!(buf.is_empty(), "{text}: bytes left");
                let (int, frac) = driver.split_once('.').unwrap_or((&driver, ""));
                let want: i128 = format!("{int}{frac:0<w$}", w = usize::from(s))
                    .parse()
                    .unwrap();
                assert_eq!(got, want, "{text} as decimal({p},{s})");
            }
        }
        assert!(
            read_decimal(&mut ParseBuf(&[0x80]), 12, 2).is_err(),
            "too short"
        );
        let mut bad = encode("1.00", 12, 2);
        bad[5] = 0xFF; // a fraction group of 2 digits holding 255
        assert!(
            read_decimal(&mut ParseBuf(&bad), 12, 2).is_err(),
            "digit group out of range"
        );
        assert_eq!(
            decimal_of(ColumnType::MYSQL_TYPE_NEWDECIMAL, &[38, 2]),
            Some((38, 2))
        );
        assert_eq!(
            decimal_of(ColumnType::MYSQL_TYPE_NEWDECIMAL, &[39, 2]),
            None
        );
    }

    #[test]
    fn length_prefixes_as_the_driver_reads_them() {
        use ColumnType::*;
        assert_eq!(prefix_of(MYSQL_TYPE_VARCHAR, &[255, 0]), Some(1));
        assert_eq!(prefix_of(MYSQL_TYPE_VARCHAR, &[0, 1]), Some(2));
        // char(100) in utf8mb4 (400 bytes): the length's high bits ride in the first byte.
        assert_eq!(prefix_of(MYSQL_TYPE_STRING, &[0xEE, 0x90]), Some(2));
        assert_eq!(prefix_of(MYSQL_TYPE_STRING, &[0xFE, 40]), Some(1));
        assert_eq!(prefix_of(MYSQL_TYPE_BLOB, &[2]), Some(2));
        assert_eq!(prefix_of(MYSQL_TYPE_BLOB, &[9]), None);
        assert_eq!(prefix_of(MYSQL_TYPE_GEOMETRY, &[4]), None);
        assert_eq!(prefix_of(MYSQL_TYPE_NEWDECIMAL, &[10, 2]), None);
    }
}
