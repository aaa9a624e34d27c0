//! Firebird types → Arrow, in one table.
//!
//! | Firebird (`RDB$FIELD_TYPE`)                  | Arrow                         | read as                     |
//! |----------------------------------------------|-------------------------------|-----------------------------|
//! | SMALLINT / INTEGER / BIGINT (7, 8, 16)       | Int16 / Int32 / Int64         | native                      |
//! | INT128 (26)                                  | Decimal128(38, 0)             | native                      |
//! | NUMERIC/DECIMAL(p, s), s > 0, any storage    | Decimal128(storage digits, s) | `CAST(… AS VARCHAR(64))`    |
//! | NUMERIC/DECIMAL(p, 0)                        | Decimal128(storage digits, 0) | native                      |
//! | FLOAT (10) / DOUBLE PRECISION (27)           | Float32 / Float64             | native                      |
//! | DECFLOAT(16) / DECFLOAT(34) (24, 25)         | Utf8, exact decimal text      | `CAST(… AS VARCHAR(64))`    |
//! | CHAR / VARCHAR (14, 37), any character set   | Utf8 (converted to UTF-8)     | native                      |
//! | CHAR / VARCHAR CHARACTER SET OCTETS          | Binary                        | `CAST(… AS BLOB SUB_TYPE BINARY)` |
//! | BLOB SUB_TYPE TEXT (261/1)                   | Utf8 (converted to UTF-8)     | native                      |
//! | BLOB SUB_TYPE BINARY and other sub-types     | Binary                        | native / `CAST(… AS BLOB SUB_TYPE BINARY)` |
//! | BOOLEAN (23)                                 | Boolean                       | native                      |
//! | DATE (12)                                    | Date32                        | native                      |
//! | TIME (13)                                    | Time64(µs)                    | native                      |
//! | TIMESTAMP (35)                               | Timestamp(µs)                 | native                      |
//! | TIMESTAMP WITH TIME ZONE (29)                | Timestamp(µs, "UTC")          | `CAST(… AT TIME ZONE 'UTC' AS TIMESTAMP)` |
//! | TIME WITH TIME ZONE (28)                     | Utf8 (`13:45:00.0000 +02:00`) | `CAST(… AS VARCHAR(64))`    |
//! | arrays, anything else                        | not exported: the table is refused with the column named |
//!
//! Choices that lose nothing:
//! - Firebird does not enforce a NUMERIC's declared precision: `NUMERIC(4,2)` is stored in a
//!   SMALLINT and holds up to 327.67. The Arrow precision is therefore the storage type's
//!   (5, 10, 19 or 38 digits), so every stored value fits. Scaled values are read as their
//!   exact decimal text, because the client library would hand them over as doubles.
//! - INT128 holds values up to ±1.7·10³⁸, one digit more than Decimal128(38); such a value
//!   fails the export naming the column rather than being written out of range.
//! - DECFLOAT has no Arrow type (its exponent range exceeds any decimal): exact text,
//!   including `Infinity` and `NaN`.
//! - Character data is converted to UTF-8 by the server (the attachment's character set is
//!   UTF8), whatever the column's character set (e.g. WIN1251). CHAR values keep their
//!   trailing pad spaces, as Firebird returns them.
//! - TIMESTAMP WITH TIME ZONE is exported as the UTC instant; the zone name is not kept.
//!   TIME WITH TIME ZONE has no instant without a date, so it is exported as text with its zone.
//! - Times and timestamps have 100 µs resolution in Firebird; Arrow's µs holds them exactly.

use arrow_schema::{DataType, TimeUnit};

/// Field type codes of `RDB$FIELDS.RDB$FIELD_TYPE`.
#[allow(missing_docs)]
pub mod code {
    pub const SMALLINT: i16 = 7;
    pub const INTEGER: i16 = 8;
    pub const FLOAT: i16 = 10;
    pub const DATE: i16 = 12;
    pub const TIME: i16 = 13;
    pub const CHAR: i16 = 14;
    pub const BIGINT: i16 = 16;
    pub const BOOLEAN: i16 = 23;
    pub const DECFLOAT16: i16 = 24;
    pub const DECFLOAT34: i16 = 25;
    pub const INT128: i16 = 26;
    pub const DOUBLE: i16 = 27;
    pub const TIME_TZ: i16 = 28;
    pub const TIMESTAMP_TZ: i16 = 29;
    pub const TIMESTAMP: i16 = 35;
    pub const VARCHAR: i16 = 37;
    pub const CSTRING: i16 = 40;
    pub const BLOB: i16 = 261;
}

/// `RDB$CHARACTER_SET_ID` of OCTETS (binary character data).
pub const OCTETS: i16 = 1;

/// What the catalog says about one column's type (a row of `RDB$FIELDS`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FbField {
    /// `RDB$FIELD_TYPE`.
    pub field_type: i16,
    /// `RDB$FIELD_SUB_TYPE`: 1 NUMERIC, 2 DECIMAL for exact numbers; the blob sub-type.
    pub sub_type: i16,
    /// `RDB$FIELD_SCALE` (≤ 0: digits after the point, negated).
    pub scale: i16,
    /// `RDB$FIELD_PRECISION` (declared; not enforced by Firebird).
    pub precision: i16,
    /// `RDB$CHARACTER_LENGTH` (characters of CHAR/VARCHAR).
    pub char_length: i32,
    /// `RDB$CHARACTER_SET_ID`.
    pub charset_id: i16,
    /// `RDB$CHARACTER_SET_NAME`, trimmed.
    pub charset: String,
    /// `RDB$DIMENSIONS`: non-zero for arrays.
    pub dimensions: i16,
}

pub use sluice_core::mapping::Mapping;

/// How one column is read (see [`select_expr`] for its cast), and its type as Firebird prints
/// it, for the manifest.
pub type Typed = (Mapping, String);

/// The cast marker for TIMESTAMP WITH TIME ZONE (read as the UTC instant).
pub const AT_UTC: &str = "AT TIME ZONE 'UTC'";
/// Text conversion of numbers and zoned times.
const AS_TEXT: &str = "VARCHAR(64)";
/// Binary conversion of OCTETS text and unusual blob sub-types.
const AS_BINARY: &str = "BLOB SUB_TYPE BINARY";

/// Arrow decimal precision that holds every value of an exact number's storage type.
fn storage_digits(field_type: i16) -> u8 {
    match field_type {
        code::SMALLINT => 5,
        code::INTEGER => 10,
        code::BIGINT => 19,
        _ => 38,
    }
}

fn native(data_type: DataType, display: String) -> Typed {
    (Mapping::native(data_type), display)
}

fn cast(data_type: DataType, cast: &str, display: String) -> Typed {
    (Mapping::cast(data_type, cast), display)
}

/// Map a column type, or say why it cannot be exported.
pub fn map_field(f: &FbField) -> Result<Typed, String> {
    use code::*;
    if f.dimensions > 0 {
        return Err("array columns cannot be read through SQL".into());
    }
    let scale = (-f.scale).max(0);
    let exact = matches!(f.field_type, SMALLINT | INTEGER | BIGINT | INT128);
    if exact && (f.sub_type == 1 || f.sub_type == 2 || f.scale < 0) {
        let name = if f.sub_type == 2 {
            "DECIMAL"
        } else {
            "NUMERIC"
        };
        let digits = storage_digits(f.field_type).max(scale as u8);
        let shown = format!("{name}({},{scale})", f.precision.max(scale));
        let dt = DataType::Decimal128(digits, scale as i8);
        return Ok(if scale > 0 {
            cast(dt, AS_TEXT, shown)
        } else {
            native(dt, shown)
        });
    }
    let charset = |base: String| {
        if f.charset.is_empty() {
            base
        } else {
            format!("{base} CHARACTER SET {}", f.charset)
        }
    };
    Ok(match f.field_type {
        SMALLINT => native(DataType::Int16, "SMALLINT".into()),
        INTEGER => native(DataType::Int32, "INTEGER".into()),
        BIGINT => native(DataType::Int64, "BIGINT".into()),
        INT128 => native(DataType::Decimal128(38, 0), "INT128".into()),
        FLOAT => native(DataType::Float32, "FLOAT".into()),
        DOUBLE => native(DataType::Float64, "DOUBLE PRECISION".into()),
        DECFLOAT16 => cast(DataType::Utf8, AS_TEXT, "DECFLOAT(16)".into()),
        DECFLOAT34 => cast(DataType::Utf8, AS_TEXT, "DECFLOAT(34)".into()),
        BOOLEAN => native(DataType::Boolean, "BOOLEAN".into()),
        DATE => native(DataType::Date32, "DATE".into()),
        TIME => native(DataType::Time64(TimeUnit::Microsecond), "TIME".into()),
        TIMESTAMP => native(
            DataType::Timestamp(TimeUnit::Microsecond, None),
            "TIMESTAMP".into(),
        ),
        TIMESTAMP_TZ => cast(
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            AT_UTC,
            "TIMESTAMP WITH TIME ZONE".into(),
        ),
        TIME_TZ => cast(DataType::Utf8, AS_TEXT, "TIME WITH TIME ZONE".into()),
        CHAR | VARCHAR | CSTRING => {
            let base = format!(
                "{}({})",
                if f.field_type == VARCHAR {
                    "VARCHAR"
                } else {
                    "CHAR"
                },
                f.char_length
            );
            if f.charset_id == OCTETS {
                cast(DataType::Binary, AS_BINARY, charset(base))
            } else {
                native(DataType::Utf8, charset(base))
            }
        }
        BLOB if f.sub_type == 1 => native(DataType::Utf8, charset("BLOB SUB_TYPE TEXT".into())),
        BLOB if f.sub_type == 0 => native(DataType::Binary, "BLOB SUB_TYPE BINARY".into()),
        BLOB => cast(
            DataType::Binary,
            AS_BINARY,
            format!("BLOB SUB_TYPE {}", f.sub_type),
        ),
        other => return Err(format!("type code {other} has no mapping")),
    })
}

/// The select-list expression reading column `quoted` (already quoted) with `cast`.
pub fn select_expr(quoted: &str, cast: Option<&str>) -> String {
    match cast {
        None => quoted.to_string(),
        Some(AT_UTC) => format!("CAST({quoted} AT TIME ZONE 'UTC' AS TIMESTAMP) AS {quoted}"),
        Some(t) => format!("CAST({quoted} AS {t}) AS {quoted}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(field_type: i16, sub_type: i16, scale: i16, precision: i16) -> FbField {
        FbField {
            field_type,
            sub_type,
            scale,
            precision,
            ..Default::default()
        }
    }

    #[test]
    fn table() {
        use code::*;
        let cases: Vec<(FbField, DataType, Option<&str>, &str)> = vec![
            (f(SMALLINT, 0, 0, 0), DataType::Int16, None, "SMALLINT"),
            (f(INTEGER, 0, 0, 0), DataType::Int32, None, "INTEGER"),
            (f(BIGINT, 0, 0, 0), DataType::Int64, None, "BIGINT"),
            (
                f(INT128, 0, 0, 0),
                DataType::Decimal128(38, 0),
                None,
                "INT128",
            ),
            (
                f(SMALLINT, 1, -2, 4),
                DataType::Decimal128(5, 2),
                Some(AS_TEXT),
                "NUMERIC(4,2)",
            ),
            (
                f(INTEGER, 2, -3, 9),
                DataType::Decimal128(10, 3),
                Some(AS_TEXT),
                "DECIMAL(9,3)",
            ),
            (
                f(BIGINT, 1, -2, 18),
                DataType::Decimal128(19, 2),
                Some(AS_TEXT),
                "NUMERIC(18,2)",
            ),
            (
                f(INT128, 1, -10, 38),
                DataType::Decimal128(38, 10),
                Some(AS_TEXT),
                "NUMERIC(38,10)",
            ),
            (
                f(BIGINT, 1, 0, 15),
                DataType::Decimal128(19, 0),
                None,
                "NUMERIC(15,0)",
            ),
            (f(FLOAT, 0, 0, 0), DataType::Float32, None, "FLOAT"),
            (
                f(DOUBLE, 0, 0, 0),
                DataType::Float64,
                None,
                "DOUBLE PRECISION",
            ),
            (
                f(DECFLOAT34, 0, 0, 34),
                DataType::Utf8,
                Some(AS_TEXT),
                "DECFLOAT(34)",
            ),
            (f(BOOLEAN, 0, 0, 0), DataType::Boolean, None, "BOOLEAN"),
            (f(DATE, 0, 0, 0), DataType::Date32, None, "DATE"),
            (
                f(TIME, 0, 0, 0),
                DataType::Time64(TimeUnit::Microsecond),
                None,
                "TIME",
            ),
            (
                f(TIMESTAMP_TZ, 0, 0, 0),
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                Some(AT_UTC),
                "TIMESTAMP WITH TIME ZONE",
            ),
            (
                f(TIME_TZ, 0, 0, 0),
                DataType::Utf8,
                Some(AS_TEXT),
                "TIME WITH TIME ZONE",
            ),
            (f(BLOB, 1, 0, 0), DataType::Utf8, None, "BLOB SUB_TYPE TEXT"),
            (
                f(BLOB, 0, 0, 0),
                DataType::Binary,
                None,
                "BLOB SUB_TYPE BINARY",
            ),
            (
                f(BLOB, 2, 0, 0),
                DataType::Binary,
                Some(AS_BINARY),
                "BLOB SUB_TYPE 2",
            ),
        ];
        for (field, dt, c, shown) in cases {
            let (m, display) = map_field(&field).unwrap();
            assert_eq!(m.data_type, dt, "{field:?}");
            assert_eq!(m.cast.as_deref(), c, "{field:?}");
            assert_eq!(display, shown);
        }
    }

    #[test]
    fn text_keeps_charset_and_octets_are_binary() {
        let mut v = f(code::VARCHAR, 0, 0, 0);
        v.char_length = 20;
        v.charset = "WIN1251".into();
        v.charset_id = 52;
        let (m, display) = map_field(&v).unwrap();
        assert_eq!(m.data_type, DataType::Utf8);
        assert_eq!(display, "VARCHAR(20) CHARACTER SET WIN1251");
        v.charset_id = OCTETS;
        v.charset = "OCTETS".into();
        assert_eq!(map_field(&v).unwrap().0.data_type, DataType::Binary);
    }

    #[test]
    fn arrays_are_refused() {
        let mut a = f(code::INTEGER, 0, 0, 0);
        a.dimensions = 1;
        assert!(map_field(&a).is_err());
    }

    #[test]
    fn select_expressions() {
        assert_eq!(select_expr("\"A\"", None), "\"A\"");
        assert_eq!(
            select_expr("\"A\"", Some(AT_UTC)),
            "CAST(\"A\" AT TIME ZONE 'UTC' AS TIMESTAMP) AS \"A\""
        );
    }
}
