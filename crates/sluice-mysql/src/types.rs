//! MySQL/MariaDB types → Arrow, in one table.
//!
//! | MySQL / MariaDB (`DATA_TYPE`)                | Arrow                                  | read as |
//! |----------------------------------------------|----------------------------------------|---------|
//! | tinyint / smallint / mediumint / int / bigint| Int8 / Int16 / Int32 / Int32 / Int64   | native  |
//! | the same `unsigned`                          | UInt8 / UInt16 / UInt32 / UInt32 / UInt64 | native |
//! | bool, boolean (= `tinyint(1)`)               | Int8 (it may hold any tinyint)         | native  |
//! | decimal(p,s), p ≤ 38 / p ≤ 65                | Decimal128(p,s) / Decimal256(p,s)      | native  |
//! | float / double                               | Float32 / Float64                      | native  |
//! | bit(1) / bit(n)                              | Boolean / UInt64                       | native  |
//! | year                                         | UInt16                                 | native  |
//! | date                                         | Date32, nullable (zero dates → NULL)   | native  |
//! | datetime(n)                                  | Timestamp(µs), nullable (zero dates)   | native  |
//! | timestamp(n)                                 | Timestamp(µs, "UTC"), nullable         | native  |
//! | time(n) (−838:59:59 … 838:59:59)             | Duration(µs)                           | native  |
//! | char, varchar, *text (any text charset)      | Utf8 (sessions use utf8mb4)            | native  |
//! | enum, set                                    | Utf8 (a set as `a,b`)                  | native  |
//! | json; MariaDB longtext `CHECK (json_valid)`  | Utf8 + `arrow.json` extension          | native  |
//! | binary, varbinary, *blob, `CHARACTER SET binary` | Binary                             | native  |
//! | geometry, point, linestring, polygon, multi*, geometrycollection | Binary (WKB) + `geoarrow.wkb` | native |
//! | anything else (inet4, inet6, uuid, vector …) | Utf8, listed in the report as a text fallback | `CAST(… AS CHAR)` |
//!
//! Choices:
//! - `BOOL` is `tinyint(1)` and stores any tinyint (`2` is legal), so it stays Int8: nothing is
//!   folded into true/false.
//! - `time` is a signed duration up to 838 hours, not a time of day: Duration(µs) holds all of it.
//! - Zero and partial-zero dates (`0000-00-00`, `2024-00-15`) exist only in MySQL: they become
//!   NULL and are counted in the report, or fail the export with `?zero_dates=error`. Date and
//!   time columns are therefore always nullable in the output.
//! - MySQL stores geometry as a 4-byte little-endian SRID followed by WKB. The prefix is stripped
//!   so the value is plain WKB (ISO/OGC, readable by GeoParquet tools); non-zero SRIDs seen are
//!   counted per column and named in the report, since WKB cannot carry them.
//! - Decimals keep the declared precision and scale; `decimal unsigned` is the same type.

use arrow_schema::extension::Json;
use arrow_schema::{DataType, TimeUnit};
use std::sync::Arc;

/// Extension name of WKB geometry columns.
pub const WKB_EXTENSION: &str = "geoarrow.wkb";

/// What the catalog (or a query's result metadata) says about one column's type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MyType {
    /// `DATA_TYPE`, lowercase (`int`, `varchar`, `decimal`, `point`).
    pub data_type: String,
    /// `COLUMN_TYPE` as the server prints it (`int(10) unsigned`, `enum('a','b')`); the
    /// column's source type in the manifest.
    pub column_type: String,
    /// Declared precision (decimal digits, bit width).
    pub precision: u32,
    /// Declared scale (decimal).
    pub scale: u32,
    /// True for text types in the `binary` character set (they hold bytes).
    pub binary_charset: bool,
    /// True for MariaDB's JSON alias (longtext with a `json_valid` check).
    pub json_check: bool,
}

impl MyType {
    fn unsigned(&self) -> bool {
        self.column_type.to_ascii_lowercase().contains("unsigned")
    }
}

pub use sluice_core::mapping::Mapping;

/// Arrow decimal type for `decimal(p,s)`; MySQL allows p ≤ 65, s ≤ 30.
pub use sluice_core::mapping::decimal_type;

/// True for the spatial types (stored as SRID + WKB).
pub fn is_geometry(data_type: &str) -> bool {
    matches!(
        data_type,
        "geometry"
            | "point"
            | "linestring"
            | "polygon"
            | "multipoint"
            | "multilinestring"
            | "multipolygon"
            | "geometrycollection"
            | "geomcollection"
    )
}

/// Map one column type.
pub fn map_type(t: &MyType) -> Mapping {
    let u = t.unsigned();
    let int = |s: DataType, us: DataType| Mapping::native(if u { us } else { s });
    let us = |tz: Option<&str>| DataType::Timestamp(TimeUnit::Microsecond, tz.map(Arc::from));
    match t.data_type.as_str() {
        "tinyint" => int(DataType::Int8, DataType::UInt8),
        "smallint" => int(DataType::Int16, DataType::UInt16),
        "mediumint" | "int" | "integer" => int(DataType::Int32, DataType::UInt32),
        "bigint" => int(DataType::Int64, DataType::UInt64),
        "decimal" | "numeric" => match decimal_type(t.precision, t.scale) {
            Some(dt) => Mapping::native(dt),
            None => text_fallback(),
        },
        "float" => Mapping::native(DataType::Float32),
        "double" | "real" => Mapping::native(DataType::Float64),
        "bit" if t.precision <= 1 => Mapping::native(DataType::Boolean),
        "bit" => Mapping::native(DataType::UInt64),
        "year" => Mapping::native(DataType::UInt16),
        "date" => dated(DataType::Date32),
        "datetime" => dated(us(None)),
        "timestamp" => dated(us(Some("UTC"))),
        "time" => Mapping::native(DataType::Duration(TimeUnit::Microsecond)),
        "json" => Mapping::native(DataType::Utf8).ext(Json::default()),
        "longtext" if t.json_check => Mapping::native(DataType::Utf8).ext(Json::default()),
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext"
            if t.binary_charset =>
        {
            Mapping::native(DataType::Binary)
        }
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "enum" | "set" => {
            Mapping::native(DataType::Utf8)
        }
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
            Mapping::native(DataType::Binary)
        }
        g if is_geometry(g) => Mapping::native(DataType::Binary).ext_named(WKB_EXTENSION),
        _ => text_fallback(),
    }
}

/// The [`MyType`] of a result column (for `--query` datasets), from the protocol's column
/// metadata: type code, flags, length, decimals and character set.
pub fn from_column(c: &mysql_async::Column) -> MyType {
    use mysql_async::consts::{ColumnFlags, ColumnType as T};
    let flags = c.flags();
    let unsigned = flags.contains(ColumnFlags::UNSIGNED_FLAG);
    let binary = c.character_set() == 63;
    let len = c.column_length();
    let scale = c.decimals() as u32;
    let (data_type, precision) = match c.column_type() {
        T::MYSQL_TYPE_TINY => ("tinyint", 0),
        T::MYSQL_TYPE_SHORT => ("smallint", 0),
        T::MYSQL_TYPE_INT24 => ("mediumint", 0),
        T::MYSQL_TYPE_LONG => ("int", 0),
        T::MYSQL_TYPE_LONGLONG => ("bigint", 0),
        T::MYSQL_TYPE_DECIMAL | T::MYSQL_TYPE_NEWDECIMAL => {
            let p = len - u32::from(scale > 0) - u32::from(!unsigned);
            ("decimal", p)
        }
        T::MYSQL_TYPE_FLOAT => ("float", 0),
        T::MYSQL_TYPE_DOUBLE => ("double", 0),
        T::MYSQL_TYPE_BIT => ("bit", len),
        T::MYSQL_TYPE_YEAR => ("year", 0),
        T::MYSQL_TYPE_DATE | T::MYSQL_TYPE_NEWDATE => ("date", 0),
        T::MYSQL_TYPE_DATETIME | T::MYSQL_TYPE_DATETIME2 => ("datetime", 0),
        T::MYSQL_TYPE_TIMESTAMP | T::MYSQL_TYPE_TIMESTAMP2 => ("timestamp", 0),
        T::MYSQL_TYPE_TIME | T::MYSQL_TYPE_TIME2 => ("time", 0),
        T::MYSQL_TYPE_JSON => ("json", 0),
        T::MYSQL_TYPE_GEOMETRY => ("geometry", 0),
        T::MYSQL_TYPE_ENUM => ("enum", 0),
        T::MYSQL_TYPE_SET => ("set", 0),
        _ if flags.contains(ColumnFlags::ENUM_FLAG) => ("enum", 0),
        _ if flags.contains(ColumnFlags::SET_FLAG) => ("set", 0),
        T::MYSQL_TYPE_STRING | T::MYSQL_TYPE_VAR_STRING | T::MYSQL_TYPE_VARCHAR => {
            (if binary { "varbinary" } else { "varchar" }, 0)
        }
        T::MYSQL_TYPE_TINY_BLOB
        | T::MYSQL_TYPE_MEDIUM_BLOB
        | T::MYSQL_TYPE_LONG_BLOB
        | T::MYSQL_TYPE_BLOB => (if binary { "longblob" } else { "longtext" }, 0),
        _ => ("unknown", 0),
    };
    let mut column_type = match data_type {
        "decimal" => format!("decimal({precision},{scale})"),
        "bit" => format!("bit({precision})"),
        other => other.to_string(),
    };
    if unsigned {
        column_type.push_str(" unsigned");
    }
    MyType {
        data_type: data_type.into(),
        column_type,
        precision,
        scale,
        binary_charset: false,
        json_check: false,
    }
}

/// A type read as text because it has no native mapping (listed in the report).
fn text_fallback() -> Mapping {
    Mapping::text_fallback("CHAR")
}

/// A date or time that may be a zero date, exported as NULL: nullable whatever the column says.
fn dated(data_type: DataType) -> Mapping {
    Mapping::native(data_type).nullable()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;

    fn t(data_type: &str, column_type: &str) -> MyType {
        MyType {
            data_type: data_type.into(),
            column_type: column_type.into(),
            ..MyType::default()
        }
    }

    #[test]
    fn mapping_table() {
        assert_eq!(
            map_type(&t("bigint", "bigint(20) unsigned")).data_type,
            DataType::UInt64
        );
        assert_eq!(
            map_type(&t("tinyint", "tinyint(1)")).data_type,
            DataType::Int8
        );
        let d = MyType {
            precision: 65,
            scale: 30,
            ..t("decimal", "decimal(65,30)")
        };
        assert_eq!(map_type(&d).data_type, DataType::Decimal256(65, 30));
        let bit1 = MyType {
            precision: 1,
            ..t("bit", "bit(1)")
        };
        assert_eq!(map_type(&bit1).data_type, DataType::Boolean);
        let date = map_type(&t("date", "date"));
        assert!(
            date.field("d", false).is_nullable(),
            "zero dates become NULL"
        );
        let vb = MyType {
            binary_charset: true,
            ..t("varchar", "varchar(10)")
        };
        assert_eq!(map_type(&vb).data_type, DataType::Binary);
        let j = MyType {
            json_check: true,
            ..t("longtext", "longtext")
        };
        assert!(map_type(&j).metadata.values().any(|v| v == "arrow.json"));
        let inet = map_type(&t("inet6", "inet6"));
        assert!(inet.fallback && inet.cast.as_deref() == Some("CHAR"));
        assert_eq!(
            map_type(&t("point", "point")).metadata[EXTENSION_TYPE_NAME_KEY],
            WKB_EXTENSION
        );
    }
}
