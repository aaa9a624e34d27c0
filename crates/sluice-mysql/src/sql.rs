//! Quoting: the only place SQL text is built from names and values; and reading the names in
//! other sessions' statement text (for the lock guard and the harm probe).
//!
//! Identifiers always go through [`quote_ident`] and values through [`quote_literal`] (or are
//! bound as parameters); nothing is pasted into SQL unquoted. Literals escape backslashes as
//! well as quotes, so they are safe whether or not the session runs with
//! `NO_BACKSLASH_ESCAPES`.

use arrow_schema::DataType;
use sluice_core::clause::Dialect;
use sluice_core::keyrange::{Boundaries, KeyDialect};
use sluice_core::table::{ColumnDesc, Dataset, TableRef};
use sluice_core::{Error, Result};

/// Quote an identifier: wrap in backticks, double any inner backtick. Always quotes, so case,
/// reserved words and special characters survive exactly.
pub fn quote_ident(name: &str) -> String {
    sluice_core::ident::enclose(name, '`')
}

/// `` `database`.`table` ``.
pub fn quote_table(t: &TableRef) -> String {
    format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.name))
}

/// Quote a string literal as a utf8mb4 hexadecimal literal (`_utf8mb4 X'…'`).
///
/// A hex literal contains no quote and no backslash whatever the value, so it is immune to the
/// session's `sql_mode` (`NO_BACKSLASH_ESCAPES`, `ANSI_QUOTES`); the `_utf8mb4` introducer makes
/// it a text literal that is *coercible*, so compared with a column it takes the column's
/// collation (as a plain `'…'` literal would) and never raises "illegal mix of collations".
pub fn quote_literal(value: &str) -> String {
    format!("_utf8mb4 {}", hex_literal(value.as_bytes()))
}

/// `X'…'`: bytes as a hexadecimal literal (a binary string).
pub fn hex_literal(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut s = String::with_capacity(bytes.len() * 2 + 3);
    s.push_str("X'");
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s.push('\'');
    s
}

/// MySQL/MariaDB's SQL for the chunk clauses and key-range planning of `sluice_core`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MyDialect;

fn is_numeric_text(v: &str) -> bool {
    let body = v.strip_prefix('-').unwrap_or(v);
    !body.is_empty()
        && body
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-'))
        && body.bytes().next().is_some_and(|c| c.is_ascii_digit())
}

impl Dialect for MyDialect {
    fn engine(&self) -> &'static str {
        "MySQL/MariaDB"
    }

    fn quote_ident(&self, name: &str) -> String {
        quote_ident(name)
    }

    /// Numbers validated and written bare, binary keys (carried as hex) as `X'…'`, everything
    /// else as a utf8mb4 text literal the server converts to the column's type.
    fn key_literal(&self, c: &ColumnDesc, v: &str) -> Result<String> {
        let bad = || {
            Error::config(format!(
                "key bound {v:?} is not a valid value of column {:?} ({}); the run state may \
                 have been edited: use --overwrite to plan again",
                c.name, c.source_type
            ))
        };
        match c.field.data_type() {
            dt if dt.is_integer() => v.parse::<i128>().map(|n| n.to_string()).map_err(|_| bad()),
            DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(..)
            | DataType::Decimal256(..) => {
                if is_numeric_text(v) {
                    Ok(v.to_string())
                } else {
                    Err(bad())
                }
            }
            DataType::Binary => {
                if !v.len().is_multiple_of(2) || !v.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return Err(bad());
                }
                let bytes: Vec<u8> = (0..v.len())
                    .step_by(2)
                    .filter_map(|i| u8::from_str_radix(&v[i..i + 2], 16).ok())
                    .collect();
                Ok(hex_literal(&bytes))
            }
            _ => Ok(quote_literal(v)),
        }
    }

    fn row_in_list(&self) -> bool {
        true
    }
}

impl KeyDialect for MyDialect {
    /// Binary keys as hex, everything else as utf8mb4 text.
    fn key_text(&self, c: &ColumnDesc) -> String {
        let q = quote_ident(&c.name);
        if matches!(c.field.data_type(), DataType::Binary) {
            format!("HEX({q})")
        } else {
            format!("CAST({q} AS CHAR CHARACTER SET utf8mb4)")
        }
    }

    /// ENUM and SET sort by their index but compare as text; TEXT and BLOB sort on a prefix
    /// (`max_sort_length`); JSON and geometry do not compare as values.
    fn splittable(&self, c: &ColumnDesc) -> bool {
        let t = c.source_type.to_ascii_lowercase();
        let unordered = [
            "enum",
            "set",
            "json",
            "geometry",
            "point",
            "linestring",
            "polygon",
            "multi",
        ]
        .iter()
        .any(|p| t.starts_with(p))
            || t.contains("blob")
            || t.contains("text");
        c.cast.is_none() && !unordered && !matches!(c.field.data_type(), DataType::Boolean)
    }

    /// Integers, but not `bit` or `year`.
    fn integer_key(&self, c: &ColumnDesc) -> bool {
        c.cast.is_none()
            && !c.source_type.starts_with("bit")
            && !c.source_type.starts_with("year")
            && c.field.data_type().is_integer()
    }

    /// Stepping through the key's index: MySQL has no cheap block sample.
    fn boundaries(&self, _: &Dataset, _: &str, _: u64) -> Boundaries {
        Boundaries::Step
    }
}

/// A token of SQL text, for reading the statements of other sessions.
#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Dot,
    Other,
}

/// Split `sql` into identifiers (bare or backtick-quoted, unquoted), dots and everything else;
/// string literals are one token and comments are dropped.
fn tokens(sql: &str) -> Vec<Tok> {
    let mut toks = Vec::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' => {
                let mut id = String::new();
                while let Some(c) = chars.next() {
                    if c == '`' {
                        if chars.peek() == Some(&'`') {
                            chars.next();
                            id.push('`');
                        } else {
                            break;
                        }
                    } else {
                        id.push(c);
                    }
                }
                toks.push(Tok::Ident(id));
            }
            '\'' | '"' => {
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == c {
                        if chars.peek() == Some(&c) {
                            chars.next();
                        } else {
                            break;
                        }
                    }
                }
                toks.push(Tok::Other);
            }
            '.' => toks.push(Tok::Dot),
            c if c.is_alphanumeric() || c == '_' || c == '$' => {
                let mut id = c.to_string();
                while let Some(&d) = chars.peek() {
                    if d.is_alphanumeric() || d == '_' || d == '$' {
                        id.push(d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                toks.push(Tok::Ident(id));
            }
            '/' if chars.peek() == Some(&'*') => {
                let mut prev = ' ';
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            '#' => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            c if c.is_whitespace() => {}
            _ => toks.push(Tok::Other),
        }
    }
    toks
}

/// The identifiers in `sql` (unquoted), e.g. to look up which of them are tables.
pub fn identifiers(sql: &str) -> Vec<String> {
    tokens(sql)
        .into_iter()
        .filter_map(|t| match t {
            Tok::Ident(s) => Some(s),
            _ => None,
        })
        .collect()
}

/// The first keyword of `sql`, upper-cased (after comments and opening parentheses).
pub fn first_keyword(sql: &str) -> String {
    tokens(sql)
        .into_iter()
        .find_map(|t| match t {
            Tok::Ident(s) => Some(s.to_ascii_uppercase()),
            _ => None,
        })
        .unwrap_or_default()
}

/// What a DDL statement does to the tables it names, by its leading keywords.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableDdl {
    /// `DROP TABLE`.
    Drop,
    /// `CREATE TABLE` (also `IF NOT EXISTS`, which may change nothing).
    Create,
    /// MariaDB's `CREATE OR REPLACE TABLE`: a drop and a create in one statement.
    Replace,
    /// Anything else.
    Other,
}

/// The [`TableDdl`] of `sql` (comments skipped, case ignored).
pub fn table_ddl(sql: &str) -> TableDdl {
    let words: Vec<String> = tokens(sql)
        .into_iter()
        .take(4)
        .map(|t| match t {
            Tok::Ident(s) => s.to_ascii_uppercase(),
            _ => String::new(),
        })
        .collect();
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    match w.as_slice() {
        ["DROP", "TABLE", ..] => TableDdl::Drop,
        ["CREATE", "OR", "REPLACE", "TABLE"] => TableDdl::Replace,
        ["CREATE", "TABLE", ..] => TableDdl::Create,
        _ => TableDdl::Other,
    }
}

/// Whether `sql`, run with default database `db`, names table `t` — from another session's
/// statement text, so approximate: identifiers are compared without regard to case (a column
/// named like the table also matches), string literals and comments are skipped.
pub fn names_table(sql: &str, db: &str, t: &TableRef) -> bool {
    let toks = tokens(sql);
    let same = |a: &str, b: &str| a.to_lowercase() == b.to_lowercase();
    for (i, tok) in toks.iter().enumerate() {
        let Tok::Ident(name) = tok else { continue };
        if !same(name, &t.name) {
            continue;
        }
        let before = |k: usize| i.checked_sub(k).map(|j| &toks[j]);
        let qualified_by = match (before(2), before(1)) {
            (Some(Tok::Ident(schema)), Some(Tok::Dot)) => Some(schema.as_str()),
            (_, Some(Tok::Dot)) => continue,
            _ => None,
        };
        match qualified_by {
            Some(schema) if same(schema, &t.schema) => return true,
            Some(_) => {}
            // `name.column` is a column of a table or alias called `name`, not this table.
            None if same(db, &t.schema) && toks.get(i + 1) != Some(&Tok::Dot) => return true,
            None => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {

    #[test]
    fn table_ddl_tells_drops_creates_and_replaces() {
        assert_eq!(
            table_ddl("DROP TABLE `t` /* generated by server */"),
            TableDdl::Drop
        );
        assert_eq!(table_ddl("/* c */ drop table if exists t"), TableDdl::Drop);
        assert_eq!(table_ddl("CREATE TABLE t (id int)"), TableDdl::Create);
        assert_eq!(
            table_ddl("create or replace table t (id int)"),
            TableDdl::Replace
        );
        for other in [
            "DROP INDEX i ON t",
            "CREATE INDEX i ON t (v)",
            "ALTER TABLE t ADD c int",
        ] {
            assert_eq!(table_ddl(other), TableDdl::Other, "{other}");
        }
    }
    use super::*;

    #[test]
    fn idents_are_always_quoted() {
        assert_eq!(quote_ident("orders"), "`orders`");
        assert_eq!(quote_ident("weird `name`"), "`weird ``name```");
        assert_eq!(quote_ident("select"), "`select`");
        let t = TableRef {
            schema: "shop".into(),
            name: "a.b".into(),
        };
        assert_eq!(quote_table(&t), "`shop`.`a.b`");
    }

    #[test]
    fn key_literals_are_validated() {
        use sluice_core::columns::field;
        let col = |dt: DataType| ColumnDesc {
            name: "k".into(),
            source_type: "x".into(),
            field: field("k", dt),
            cast: None,
            as_text_fallback: false,
        };
        let d = MyDialect;
        assert_eq!(d.key_literal(&col(DataType::Int64), "-7").unwrap(), "-7");
        assert!(d.key_literal(&col(DataType::Int64), "1 OR 1=1").is_err());
        assert!(d.key_literal(&col(DataType::Float64), "1e5").is_ok());
        assert!(d.key_literal(&col(DataType::Float64), "e5").is_err());
        assert_eq!(
            d.key_literal(&col(DataType::Binary), "00ff").unwrap(),
            "X'00FF'"
        );
        assert!(d.key_literal(&col(DataType::Binary), "0g").is_err());
        assert_eq!(
            d.key_literal(&col(DataType::Utf8), "a'b").unwrap(),
            quote_literal("a'b")
        );
    }

    #[test]
    fn literals_cannot_break_out() {
        assert_eq!(quote_literal("it's"), "_utf8mb4 X'69742773'");
        assert_eq!(hex_literal(b"\\'\x00"), "X'5C2700'");
        assert_eq!(hex_literal(b""), "X''");
    }

    fn t(schema: &str, name: &str) -> TableRef {
        TableRef {
            schema: schema.into(),
            name: name.into(),
        }
    }

    #[test]
    fn statements_are_matched_to_tables() {
        let orders = t("shop", "orders");
        assert!(names_table("ALTER TABLE orders ADD c int", "shop", &orders));
        assert!(names_table(
            "alter table `Orders` add c int",
            "shop",
            &orders
        ));
        assert!(names_table("SELECT * FROM shop.orders", "other", &orders));
        assert!(names_table(
            "select 1 from `shop` . `orders` o",
            "",
            &orders
        ));
        assert!(names_table("TRUNCATE /* x */ orders", "shop", &orders));
        assert!(!names_table(
            "ALTER TABLE orders ADD c int",
            "other",
            &orders
        ));
        assert!(!names_table("SELECT * FROM other.orders", "shop", &orders));
        assert!(!names_table("SELECT 'orders' FROM t", "shop", &orders));
        assert!(!names_table("SELECT o.orders FROM o", "shop", &orders));
        assert!(!names_table("SELECT * FROM orders_2024", "shop", &orders));
        assert!(names_table(
            "SELECT * FROM `we``ird`",
            "shop",
            &t("shop", "we`ird")
        ));
    }

    #[test]
    fn keywords_and_identifiers() {
        assert_eq!(first_keyword("  /* x */ (select 1)"), "SELECT");
        assert_eq!(first_keyword("-- c\nupdate m set v = 1"), "UPDATE");
        assert_eq!(first_keyword(""), "");
        assert_eq!(
            identifiers("UPDATE `d`.`m` SET v = 'x'"),
            ["UPDATE", "d", "m", "SET", "v"]
        );
    }
}
