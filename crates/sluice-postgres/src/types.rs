//! PostgreSQL types → Arrow, in one table.
//!
//! | PostgreSQL                         | Arrow                                   | read as        |
//! |------------------------------------|-----------------------------------------|----------------|
//! | bool                               | Boolean                                 | binary         |
//! | int2 / int4 / int8                 | Int16 / Int32 / Int64                   | binary         |
//! | oid                                | UInt32                                  | binary         |
//! | float4 / float8 (NaN, ±Infinity)   | Float32 / Float64                       | binary         |
//! | numeric(p,s), p+max(0,-s) ≤ 38     | Decimal128(max(p,s), max(s,0))          | binary         |
//! | numeric(p,s), ≤ 76 digits          | Decimal256(…)                           | binary         |
//! | numeric (no typmod), > 76 digits   | Utf8, exact decimal text                | `::text`       |
//! | money                              | Decimal128(19, locale's fraction digits)| `::numeric`    |
//! | text, varchar, bpchar, name, citext, enums | Utf8                            | binary (text)  |
//! | json / jsonb                       | Utf8 + `arrow.json` extension           | text / `::text`|
//! | bytea                              | Binary                                  | binary         |
//! | uuid                               | FixedSizeBinary(16) + `arrow.uuid`      | binary         |
//! | date                               | Date32 (±infinity → i32::MAX / i32::MIN)| binary         |
//! | time                               | Time64(µs)                              | binary         |
//! | timestamp                          | Timestamp(µs) (±infinity → i64::MAX/MIN)| binary         |
//! | timestamptz                        | Timestamp(µs, "UTC") (same sentinels)   | binary         |
//! | interval                           | Struct{months i32, days i32, microseconds i64} + `sluice.interval` | binary |
//! | timetz, inet, cidr, macaddr(8), xml, "char" | Utf8                           | `::text`       |
//! | domain                             | its base type (with the domain's typmod)|                |
//! | 1-D array of any of the above      | List(element)                           | binary / `::T[]` |
//! | anything else (ranges, geometric, composite, tsvector, multi-dim arrays …) | Utf8, listed in the report as a text fallback | `::text` |
//!
//! Choices that lose nothing:
//! - Unconstrained `numeric` holds up to 131072 digits, more than any Arrow decimal: it is
//!   exported as its exact decimal text. Declared precisions map to decimals.
//! - `interval` has months, days and microseconds that do not convert into one another;
//!   Parquet has no lossless interval type, so it is a struct of the three.
//! - `timetz` has no Arrow type; its text (`13:45:00+02`) keeps the offset.
//! - `inet` is read through PostgreSQL's `text(inet)`, which always shows the netmask
//!   (`::1/128`, where psql shows `::1`): the unabbreviated form, the same for arrays.
//! - `±infinity` dates and timestamps become the type's extreme value, which no finite
//!   PostgreSQL date reaches; the CSV writer prints them as `infinity` / `-infinity`.
//! - NaN and ±Infinity in a declared `numeric(p,s)` column cannot be held by a decimal: the
//!   export fails naming the column (use an unconstrained type or a view that casts).

use arrow_schema::extension::{Json, Uuid};
use arrow_schema::{DataType, Field, Fields, TimeUnit};
use std::collections::HashMap;
use std::sync::Arc;

/// Extension name marking the interval struct, so writers can render it as an interval.
pub const INTERVAL_EXTENSION: &str = "sluice.interval";

/// Built-in type OIDs (stable across PostgreSQL versions).
#[allow(missing_docs)]
pub mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const CHAR: u32 = 18;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const XML: u32 = 142;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const MONEY: u32 = 790;
    pub const MACADDR8: u32 = 774;
    pub const MACADDR: u32 = 829;
    pub const INET: u32 = 869;
    pub const CIDR: u32 = 650;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const INTERVAL: u32 = 1186;
    pub const TIMETZ: u32 = 1266;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;
}

/// What the catalog says about one type (a row of `pg_type`).
#[derive(Debug, Clone)]
pub struct PgType {
    /// Type OID.
    pub oid: u32,
    /// `typname`.
    pub name: String,
    /// `typtype`: b base, d domain, e enum, c composite, r range, m multirange, p pseudo.
    pub typtype: u8,
    /// `typcategory` (`A` for arrays).
    pub category: u8,
    /// `typelem`: element type of an array, else 0.
    pub elem: u32,
    /// `typbasetype`: base type of a domain, else 0.
    pub base: u32,
    /// `typtypmod`: the domain's typmod, else -1.
    pub typmod: i32,
    /// `typlen`: -1 for varlena.
    pub len: i16,
    /// `typsend` function name (`textsend` for text-like types such as citext).
    pub send: String,
}

/// Types needed to map a table's columns, by OID.
pub type TypeMap = HashMap<u32, PgType>;

pub use sluice_core::mapping::Mapping;

/// A type read as its text because it has no native mapping (listed in the report).
fn text_fallback() -> Mapping {
    Mapping::text_fallback("text")
}

/// The interval struct type.
pub fn interval_type() -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new("months", DataType::Int32, false),
        Field::new("days", DataType::Int32, false),
        Field::new("microseconds", DataType::Int64, false),
    ]))
}

/// Arrow decimal type holding `numeric(precision, scale)` exactly, or `None` if too wide. A
/// negative scale (`numeric(3,-2)`: hundreds) needs `precision - scale` digits and no fraction.
pub fn decimal_type(precision: i32, scale: i32) -> Option<DataType> {
    let (p, s) = if scale < 0 {
        (precision - scale, 0)
    } else {
        (precision, scale)
    };
    sluice_core::mapping::decimal_type(u32::try_from(p).ok()?, u32::try_from(s).ok()?)
}

/// Precision and scale from a numeric typmod, or `None` for an unconstrained numeric.
pub fn numeric_typmod(typmod: i32) -> Option<(i32, i32)> {
    if typmod < 4 {
        return None;
    }
    let t = typmod - 4;
    Some(((t >> 16) & 0xffff, ((t & 0x7ff) ^ 1024) - 1024))
}

/// Map a built-in scalar type. `money_scale` is the fraction digits of `lc_monetary`.
fn scalar(oid: u32, typmod: i32, money_scale: i8) -> Option<Mapping> {
    use oid::*;
    let ts = |tz: Option<&str>| DataType::Timestamp(TimeUnit::Microsecond, tz.map(Arc::from));
    Some(match oid {
        BOOL => Mapping::native(DataType::Boolean),
        INT2 => Mapping::native(DataType::Int16),
        INT4 => Mapping::native(DataType::Int32),
        INT8 => Mapping::native(DataType::Int64),
        OID => Mapping::native(DataType::UInt32),
        FLOAT4 => Mapping::native(DataType::Float32),
        FLOAT8 => Mapping::native(DataType::Float64),
        NUMERIC => match numeric_typmod(typmod).and_then(|(p, s)| decimal_type(p, s)) {
            Some(dt) => Mapping::native(dt),
            None => Mapping::cast(DataType::Utf8, "text"),
        },
        MONEY => Mapping::cast(DataType::Decimal128(19, money_scale), "numeric"),
        TEXT | VARCHAR | BPCHAR | NAME => Mapping::native(DataType::Utf8),
        JSON => Mapping::native(DataType::Utf8).ext(Json::default()),
        JSONB => Mapping::cast(DataType::Utf8, "text").ext(Json::default()),
        BYTEA => Mapping::native(DataType::Binary),
        UUID => Mapping::native(DataType::FixedSizeBinary(16)).ext(Uuid),
        DATE => Mapping::native(DataType::Date32),
        TIME => Mapping::native(DataType::Time64(TimeUnit::Microsecond)),
        TIMESTAMP => Mapping::native(ts(None)),
        TIMESTAMPTZ => Mapping::native(ts(Some("UTC"))),
        INTERVAL => Mapping::native(interval_type()).ext_named(INTERVAL_EXTENSION),
        TIMETZ | INET | CIDR | MACADDR | MACADDR8 | XML | CHAR => {
            Mapping::cast(DataType::Utf8, "text")
        }
        _ => return None,
    })
}

/// Map a (non-array) type, following domains to their base type.
fn element(types: &TypeMap, oid: u32, typmod: i32, money_scale: i8) -> Mapping {
    let Some(t) = types.get(&oid) else {
        return text_fallback();
    };
    if t.typtype == b'd' {
        let typmod = if typmod >= 0 { typmod } else { t.typmod };
        return element(types, t.base, typmod, money_scale);
    }
    if let Some(m) = scalar(oid, typmod, money_scale) {
        return m;
    }
    // Enums and text-like extension types (citext) send their text in binary COPY.
    if t.typtype == b'e' || t.send == "textsend" || t.send == "citextsend" {
        return Mapping::native(DataType::Utf8);
    }
    text_fallback()
}

/// Map one column of type `oid` with `typmod`. `dims` is `pg_attribute.attndims` (declared
/// array dimensions; 0 when undeclared).
pub fn map_column(types: &TypeMap, oid: u32, typmod: i32, dims: i32, money_scale: i8) -> Mapping {
    // Resolve a domain over an array to the array.
    let mut t = types.get(&oid);
    let mut typmod = typmod;
    while let Some(d) = t.filter(|t| t.typtype == b'd') {
        if typmod < 0 {
            typmod = d.typmod;
        }
        t = types.get(&d.base);
    }
    let Some(t) = t else {
        return text_fallback();
    };
    let is_array = t.category == b'A' && t.elem != 0 && t.len == -1;
    if !is_array {
        return element(types, t.oid, typmod, money_scale);
    }
    if dims > 1 {
        return text_fallback();
    }
    let el = element(types, t.elem, typmod, money_scale);
    let item = Arc::new(Field::new("item", el.data_type.clone(), true).with_metadata(el.metadata));
    Mapping {
        data_type: DataType::List(item),
        metadata: HashMap::new(),
        cast: el.cast.map(|c| format!("{c}[]")),
        fallback: el.fallback,
        force_nullable: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(oid: u32, name: &str) -> PgType {
        PgType {
            oid,
            name: name.into(),
            typtype: b'b',
            category: b'N',
            elem: 0,
            base: 0,
            typmod: -1,
            len: 4,
            send: format!("{name}send"),
        }
    }

    fn types() -> TypeMap {
        let mut m = TypeMap::new();
        for (o, n) in [
            (oid::INT4, "int4"),
            (oid::NUMERIC, "numeric"),
            (oid::INET, "inet"),
        ] {
            m.insert(o, base(o, n));
        }
        m.insert(
            1007,
            PgType {
                category: b'A',
                elem: oid::INT4,
                len: -1,
                ..base(1007, "_int4")
            },
        );
        m.insert(
            1041,
            PgType {
                category: b'A',
                elem: oid::INET,
                len: -1,
                ..base(1041, "_inet")
            },
        );
        m.insert(
            9000,
            PgType {
                typtype: b'd',
                base: oid::NUMERIC,
                typmod: 0x000a_0002 + 4,
                ..base(9000, "money2")
            },
        );
        m.insert(
            9001,
            PgType {
                typtype: b'r',
                ..base(9001, "int4range")
            },
        );
        m.insert(
            9002,
            PgType {
                typtype: b'b',
                send: "citextsend".into(),
                len: -1,
                ..base(9002, "citext")
            },
        );
        m
    }

    #[test]
    fn numeric_typmods() {
        assert_eq!(numeric_typmod(-1), None);
        assert_eq!(numeric_typmod((10 << 16 | 2) + 4), Some((10, 2)));
        // numeric(5,-2): scale stored as 11-bit two's complement.
        assert_eq!(numeric_typmod((5 << 16 | (0x800 - 2)) + 4), Some((5, -2)));
        assert_eq!(decimal_type(38, 10), Some(DataType::Decimal128(38, 10)));
        assert_eq!(decimal_type(2, 4), Some(DataType::Decimal128(4, 4)));
        assert_eq!(decimal_type(5, -2), Some(DataType::Decimal128(7, 0)));
        assert_eq!(decimal_type(60, 3), Some(DataType::Decimal256(60, 3)));
        assert_eq!(decimal_type(1000, 3), None);
    }

    #[test]
    fn mapping_table() {
        let t = types();
        assert_eq!(
            map_column(&t, oid::INT4, -1, 0, 2),
            Mapping::native(DataType::Int32)
        );
        let unconstrained = map_column(&t, oid::NUMERIC, -1, 0, 2);
        assert_eq!(
            (unconstrained.data_type, unconstrained.cast.as_deref()),
            (DataType::Utf8, Some("text"))
        );
        // A domain over numeric(10,2) maps to the base with the domain's typmod.
        assert_eq!(
            map_column(&t, 9000, -1, 0, 2).data_type,
            DataType::Decimal128(10, 2)
        );
        // Arrays: native element read natively, cast element cast as an array.
        let ints = map_column(&t, 1007, -1, 1, 2);
        assert!(
            matches!(ints.data_type, DataType::List(ref f) if f.data_type() == &DataType::Int32)
        );
        assert_eq!(ints.cast, None);
        let inets = map_column(&t, 1041, -1, 1, 2);
        assert_eq!(inets.cast.as_deref(), Some("text[]"));
        // Multi-dimensional arrays and unknown kinds fall back to text and say so.
        assert!(map_column(&t, 1007, -1, 2, 2).fallback);
        assert!(map_column(&t, 9001, -1, 0, 2).fallback);
        assert!(map_column(&t, 424242, -1, 0, 2).fallback);
        assert_eq!(
            map_column(&t, 9002, -1, 0, 2),
            Mapping::native(DataType::Utf8)
        );
    }
}
