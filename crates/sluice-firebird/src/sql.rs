//! Quoting: the only place SQL text is built from names and values.
//!
//! Identifiers always go through [`quote_ident`] and values through [`quote_literal`]; nothing
//! is pasted into SQL unquoted. Firebird (dialect 3) takes a delimited identifier in double
//! quotes and a string literal in single quotes, each with the quote character doubled; it has
//! no backslash escapes.

use sluice_core::clause::Dialect;
use sluice_core::keyrange::{Boundaries, KeyDialect};
use sluice_core::table::{ColumnDesc, Dataset};
use sluice_core::{Error, Result};

/// Quote an identifier: wrap in double quotes, double any inner double quote. Always quotes,
/// so case (Firebird stores unquoted names in upper case) and special characters survive.
pub fn quote_ident(name: &str) -> String {
    sluice_core::ident::enclose(name, '"')
}

/// Quote a string literal: wrap in single quotes, double inner single quotes.
pub fn quote_literal(value: &str) -> String {
    sluice_core::ident::enclose(value, '\'')
}

/// An integer key bound, re-parsed so that only digits and a sign reach the SQL text (chunk
/// bounds come back from the saved run plan of a resumed run).
pub fn integer_literal(value: &str) -> Option<String> {
    value.trim().parse::<i128>().ok().map(|v| v.to_string())
}

/// Firebird's SQL for the chunk clauses and key-range planning of `sluice_core`: ranges over
/// one integer key, pages addressed through `MAKE_DBKEY` (Firebird 4 and later).
#[derive(Debug, Clone, Copy, Default)]
pub struct FbDialect;

impl Dialect for FbDialect {
    fn engine(&self) -> &'static str {
        "Firebird"
    }

    fn quote_ident(&self, name: &str) -> String {
        quote_ident(name)
    }

    /// Integers only, re-parsed (see [`integer_literal`]).
    fn key_literal(&self, _: &ColumnDesc, value: &str) -> Result<String> {
        integer_literal(value).ok_or_else(|| {
            Error::config(format!(
                "key bound {value:?} of the saved plan is not an integer; use --overwrite to \
                 plan again"
            ))
        })
    }

    fn max_key_columns(&self) -> usize {
        1
    }

    /// `RDB$DB_KEY` between the first records of pointer pages `first` and `end`: a scan that
    /// starts and stops at record numbers, each data page read by one chunk.
    fn page_predicate(&self, ds: &Dataset, first: u64, end: Option<u64>) -> Result<String> {
        let table = ds
            .object
            .as_ref()
            .map(|t| quote_literal(&t.name))
            .ok_or_else(|| Error::internal(format!("dataset {} has no table", ds.name)))?;
        let dbkey = |pp: u64| format!("MAKE_DBKEY({table}, 0, 0, {pp})");
        let mut w = format!("RDB$DB_KEY >= {}", dbkey(first));
        if let Some(e) = end {
            w.push_str(&format!(" AND RDB$DB_KEY < {}", dbkey(e)));
        }
        Ok(w)
    }
}

impl KeyDialect for FbDialect {
    fn key_text(&self, c: &ColumnDesc) -> String {
        format!("CAST({} AS VARCHAR(64))", quote_ident(&c.name))
    }

    /// Only a single integer key is split (by value); any other key is read whole.
    fn boundaries(&self, _: &Dataset, _: &str, _: u64) -> Boundaries {
        Boundaries::Unsupported
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idents_are_always_quoted() {
        assert_eq!(quote_ident("ORDERS"), "\"ORDERS\"");
        assert_eq!(quote_ident("weird \"name\""), "\"weird \"\"name\"\"\"");
    }

    #[test]
    fn literals_double_single_quotes() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal(r"back\slash"), r"'back\slash'");
    }

    #[test]
    fn integer_bounds_are_reparsed() {
        assert_eq!(integer_literal(" -42 ").as_deref(), Some("-42"));
        assert_eq!(integer_literal("1; DROP TABLE T"), None);
    }
}
