//! A table's columns as a table map event describes them (`binlog_row_metadata=FULL`).
//!
//! The catalog describes a table as it is now; the binary log may hold its rows under an older
//! definition (a stream stopped, the table altered, the stream restarted). With full row
//! metadata (MySQL 8.0.1+, MariaDB 10.5+) each table map carries the column names,
//! signedness, character sets, enum/set members and primary key, which is the catalog at that
//! position: the columns are then typed from it, through the export's own type mapping
//! ([`crate::types::map_type`]), so they get the same Arrow types as the export would have
//! given that definition. Limits: MariaDB's JSON alias is a plain `longtext` here (no JSON
//! extension type), and character sets other than binary, latin1 and ascii are taken as
//! UTF-8.

use super::values::{ColumnFacts, facts_of};
use crate::types::{MyType, map_type};
use mysql_async::binlog::events::{OptionalMetaExtractor, OptionalMetadataField, TableMapEvent};
use mysql_async::consts::ColumnType;
use sluice_core::table::TableRef;
use sluice_core::{ColumnDesc, Error, Result};

/// Columns read from a table map.
pub struct MapColumns {
    /// The columns as the export would describe them.
    pub columns: Vec<ColumnDesc>,
    /// Their binary log facts.
    pub facts: Vec<ColumnFacts>,
    /// Primary key column names.
    pub key: Vec<String>,
}

fn charset_name(id: u16) -> &'static str {
    match id {
        63 => "binary",
        5 | 8 | 15 | 31 | 47 | 48 | 49 | 94 => "latin1",
        11 | 65 => "ascii",
        _ => "utf8mb4",
    }
}

fn quoted(values: &[String]) -> String {
    values
        .iter()
        .map(|v| format!("'{}'", v.replace('\'', "''")))
        .collect::<Vec<_>>()
        .join(",")
}

fn bad(t: &TableRef, e: impl std::fmt::Display) -> Error {
    Error::source_permanent(format!(
        "the binary log's table map of {t} cannot be read: {e}"
    ))
}

/// The columns of `tme`, or `None` when it carries no column names (`binlog_row_metadata`
/// is not FULL).
pub fn columns(t: &TableRef, tme: &TableMapEvent<'_>) -> Result<Option<MapColumns>> {
    let mut names = Vec::new();
    let mut enums: Vec<Vec<String>> = Vec::new();
    let mut sets: Vec<Vec<String>> = Vec::new();
    for f in tme.iter_optional_meta() {
        match f.map_err(|e| bad(t, e))? {
            OptionalMetadataField::ColumnName(n) => {
                for name in n.iter_names() {
                    names.push(name.map_err(|e| bad(t, e))?.name().into_owned());
                }
            }
            OptionalMetadataField::EnumStrValue(v) => {
                for e in v.iter_values() {
                    let e = e.map_err(|x| bad(t, x))?;
                    enums.push(e.values().iter().map(|v| v.value().into_owned()).collect());
                }
            }
            OptionalMetadataField::SetStrValue(v) => {
                for s in v.iter_values() {
                    let s = s.map_err(|x| bad(t, x))?;
                    sets.push(s.values().iter().map(|v| v.value().into_owned()).collect());
                }
            }
            _ => {}
        }
    }
    let n = tme.columns_count() as usize;
    if names.len() != n {
        return Ok(None);
    }
    let extract = OptionalMetaExtractor::new(tme.iter_optional_meta()).map_err(|e| bad(t, e))?;
    let mut signed = extract.iter_signedness();
    let mut charsets = extract.iter_charset();
    let mut enum_charsets = extract.iter_enum_and_set_charset();
    let key: Vec<String> = extract
        .iter_primary_key()
        .filter_map(|k| k.ok())
        .filter_map(|k| names.get(k as usize).cloned())
        .collect();
    let (mut enums, mut sets) = (enums.into_iter(), sets.into_iter());
    let mut columns = Vec::with_capacity(n);
    let mut facts = Vec::with_capacity(n);
    for (i, name) in names.into_iter().enumerate() {
        let ty = tme
            .get_column_type(i)
            .map_err(|e| bad(t, e))?
            .ok_or_else(|| bad(t, format!("column {i} has no type")))?;
        let meta = tme.get_column_metadata(i).unwrap_or(&[]);
        let m = |k: usize| meta.get(k).copied().unwrap_or(0) as u32;
        let unsigned = if ty.is_numeric_type() {
            signed.next().unwrap_or(false)
        } else {
            false
        };
        let charset = if ty.is_character_type() {
            charset_name(
                charsets
                    .next()
                    .transpose()
                    .map_err(|e| bad(t, e))?
                    .unwrap_or(0),
            )
        } else if ty.is_enum_or_set_type() {
            let _ = enum_charsets.next();
            "utf8mb4"
        } else {
            ""
        };
        let binary = charset == "binary";
        use ColumnType::*;
        let data_type: &str;
        let (mut precision, mut scale, mut octets) = (0u32, 0u32, 0u64);
        let mut column_type = String::new();
        match ty {
            MYSQL_TYPE_TINY => data_type = "tinyint",
            MYSQL_TYPE_SHORT => data_type = "smallint",
            MYSQL_TYPE_INT24 => data_type = "mediumint",
            MYSQL_TYPE_LONG => data_type = "int",
            MYSQL_TYPE_LONGLONG => data_type = "bigint",
            MYSQL_TYPE_FLOAT => data_type = "float",
            MYSQL_TYPE_DOUBLE => data_type = "double",
            MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL => {
                data_type = "decimal";
                (precision, scale) = (m(0), m(1));
                column_type = format!("decimal({precision},{scale})");
            }
            MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => data_type = "timestamp",
            MYSQL_TYPE_DATETIME | MYSQL_TYPE_DATETIME2 => data_type = "datetime",
            MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => data_type = "time",
            MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => data_type = "date",
            MYSQL_TYPE_YEAR => data_type = "year",
            MYSQL_TYPE_BIT => {
                data_type = "bit";
                precision = m(1) * 8 + m(0);
                column_type = format!("bit({precision})");
            }
            MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING => {
                data_type = if binary { "varbinary" } else { "varchar" };
            }
            MYSQL_TYPE_STRING | MYSQL_TYPE_ENUM | MYSQL_TYPE_SET => {
                let real = if ty == MYSQL_TYPE_STRING {
                    m(0)
                } else {
                    ty as u32
                };
                if real == MYSQL_TYPE_ENUM as u32 {
                    data_type = "enum";
                    column_type = format!("enum({})", quoted(&enums.next().unwrap_or_default()));
                } else if real == MYSQL_TYPE_SET as u32 {
                    data_type = "set";
                    column_type = format!("set({})", quoted(&sets.next().unwrap_or_default()));
                } else {
                    data_type = if binary { "binary" } else { "char" };
                    let b0 = m(0) as u64;
                    octets = (((b0 & 0x30) ^ 0x30) << 4) | m(1) as u64;
                }
            }
            MYSQL_TYPE_TINY_BLOB
            | MYSQL_TYPE_MEDIUM_BLOB
            | MYSQL_TYPE_LONG_BLOB
            | MYSQL_TYPE_BLOB => {
                data_type = match (binary, m(0)) {
                    (true, 1) => "tinyblob",
                    (true, 3) => "mediumblob",
                    (true, 4) => "longblob",
                    (true, _) => "blob",
                    (false, 1) => "tinytext",
                    (false, 3) => "mediumtext",
                    (false, 4) => "longtext",
                    (false, _) => "text",
                };
            }
            MYSQL_TYPE_JSON => data_type = "json",
            MYSQL_TYPE_GEOMETRY => data_type = "geometry",
            other => {
                return Err(Error::config(format!(
                    "{t}.{name} has binary log type {other:?}, which sluice stream does not \
                     decode; leave the table out of the stream."
                )));
            }
        }
        if column_type.is_empty() {
            column_type = data_type.to_string();
        }
        if unsigned {
            column_type.push_str(" unsigned");
        }
        let my = MyType {
            data_type: data_type.to_string(),
            column_type: column_type.clone(),
            precision,
            scale,
            binary_charset: binary,
            json_check: false,
        };
        let mapping = map_type(&my);
        facts.push(facts_of(
            t,
            name.clone(),
            data_type,
            &column_type,
            charset,
            octets,
        )?);
        columns.push(ColumnDesc {
            field: mapping.field(&name, true),
            name,
            source_type: column_type,
            cast: mapping.cast,
            as_text_fallback: mapping.fallback,
        });
    }
    Ok(Some(MapColumns {
        columns,
        facts,
        key,
    }))
}

/// The type text without its parenthesized parts (lengths, display widths, precisions,
/// members): `bigint(20) unsigned` → `bigint unsigned`, as a table map writes it.
fn without_lengths(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    let (mut depth, mut quoted) = (0usize, false);
    for c in t.chars() {
        match c {
            '\'' if depth > 0 => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted && depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether the catalog's type text `catalog` is the table map's `map`: exactly where the table
/// map writes the parenthesized part (decimals, bits, enums, sets), else with the catalog's
/// lengths left out.
fn same_type(catalog: &str, map: &str) -> bool {
    if map.contains('(') {
        catalog.eq_ignore_ascii_case(map)
    } else {
        without_lengths(catalog).eq_ignore_ascii_case(map)
    }
}

/// Give the table map's columns the catalog's description where the catalog holds the same
/// column: same name, same binary log facts, same Arrow type and the same type once lengths
/// are left out.
///
/// A table map lacks what the catalog says beyond storage (`varchar(200)` is `varchar` there,
/// MariaDB's `bigint(20)` is `bigint`, nullability is unknown). The table map's definition is
/// used only where the catalog is ahead of the log (a column added or dropped later), and its
/// other columns are then the catalog's: described as the catalog describes them, the stream's
/// schema versions stay the same as those made from the catalog before (a restart does not
/// start a version whose columns did not change, and the later catalog-read version differs
/// only by what the log changed).
pub fn reconcile(m: &mut MapColumns, catalog: &[ColumnDesc], facts: &[ColumnFacts]) {
    for (c, f) in m.columns.iter_mut().zip(&m.facts) {
        let same = catalog.iter().zip(facts).find(|(k, kf)| {
            k.name == c.name
                && kf.fix == f.fix
                && k.field.data_type() == c.field.data_type()
                && same_type(&k.source_type, &c.source_type)
        });
        if let Some((k, _)) = same {
            *c = k.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{same_type, without_lengths};

    #[test]
    fn lengths_are_left_out_as_a_table_map_leaves_them() {
        assert_eq!(without_lengths("bigint(20) unsigned"), "bigint unsigned");
        assert_eq!(without_lengths("varchar(200)"), "varchar");
        assert_eq!(without_lengths("decimal(12,2)"), "decimal");
        assert_eq!(without_lengths("enum('a)','b')"), "enum");
        assert_eq!(without_lengths("int"), "int");
    }

    #[test]
    fn a_catalog_type_is_the_table_maps_up_to_what_the_map_leaves_out() {
        assert!(same_type("bigint(20)", "bigint"));
        assert!(same_type("int(10) unsigned", "int unsigned"));
        assert!(same_type("varchar(200)", "varchar"));
        assert!(same_type("decimal(12,2)", "decimal(12,2)"));
        assert!(!same_type("decimal(12,4)", "decimal(12,2)"));
        assert!(!same_type("int", "bigint"));
    }
}
