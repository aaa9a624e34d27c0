//! Quoting: the only place SQL text is built from names and values.
//!
//! Identifiers always go through [`quote_ident`] and values through [`quote_literal`]; nothing
//! is pasted into SQL unquoted. Sessions run with `standard_conforming_strings = on`, so a
//! literal needs only its single quotes doubled.

use sluice_core::Result;
use sluice_core::clause::Dialect;
use sluice_core::keyrange::{Boundaries, KeyDialect};
use sluice_core::table::{ColumnDesc, Dataset, DatasetKind, TableRef};

/// Quote an identifier for PostgreSQL: wrap in double quotes, double any inner double quote.
/// Always quotes, so case and special characters survive exactly.
pub fn quote_ident(name: &str) -> String {
    sluice_core::ident::enclose(name, '"')
}

/// `"schema"."name"`.
pub fn quote_table(t: &TableRef) -> String {
    format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.name))
}

/// Quote a string literal (standard_conforming_strings = on): wrap in single quotes, double
/// inner single quotes. NUL bytes cannot occur in PostgreSQL text, so none are handled.
pub fn quote_literal(value: &str) -> String {
    sluice_core::ident::enclose(value, '\'')
}

/// PostgreSQL's SQL for the chunk clauses and key-range planning of `sluice_core`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PgDialect;

impl Dialect for PgDialect {
    fn engine(&self) -> &'static str {
        "PostgreSQL"
    }

    fn quote_ident(&self, name: &str) -> String {
        quote_ident(name)
    }

    /// `ONLY "schema"."name"` for a table's own rows (not those of tables inheriting from it,
    /// nor, for a leaf partition read directly, anything else).
    fn relation(&self, table: &TableRef, this_table_only: bool) -> String {
        if this_table_only {
            format!("ONLY {}", quote_table(table))
        } else {
            quote_table(table)
        }
    }

    /// The text cast back to the column's own type: `'42'::int8`, `'a''b'::text`.
    fn key_literal(&self, column: &ColumnDesc, value: &str) -> Result<String> {
        Ok(format!("{}::{}", quote_literal(value), column.source_type))
    }

    fn row_values(&self) -> bool {
        true
    }

    fn key_set_values(&self) -> bool {
        true
    }

    /// A TID range: `ctid >= '(first,0)'::tid AND ctid < '(end,0)'::tid`.
    fn page_predicate(&self, _: &Dataset, first: u64, end: Option<u64>) -> Result<String> {
        let mut w = format!("ctid >= '({first},0)'::tid");
        if let Some(e) = end {
            w.push_str(&format!(" AND ctid < '({e},0)'::tid"));
        }
        Ok(w)
    }
}

impl KeyDialect for PgDialect {
    fn key_text(&self, c: &ColumnDesc) -> String {
        format!("{}::text", quote_ident(&c.name))
    }

    /// Every type: rows are compared as row values of the columns' own types, which their
    /// btree operators order.
    fn splittable(&self, _: &ColumnDesc) -> bool {
        true
    }

    /// A sample of about 50 rows per chunk (1,000 to 100,000): `TABLESAMPLE SYSTEM` on a
    /// table (whole pages, cheap), a random filter on a view or query.
    fn boundaries(&self, ds: &Dataset, from: &str, n: u64) -> Boundaries {
        let want = (n * 50).clamp(1_000, 100_000) as f64;
        let pct = if ds.estimate.rows == 0 {
            100.0
        } else {
            (want / ds.estimate.rows as f64 * 100.0).clamp(0.001, 100.0)
        };
        if matches!(ds.kind, DatasetKind::Table | DatasetKind::Partitioned) {
            Boundaries::Sample {
                from: format!("{from} TABLESAMPLE SYSTEM ({pct})"),
                has_where: false,
            }
        } else {
            Boundaries::Sample {
                from: format!("{from} WHERE random() < {}", pct / 100.0),
                has_where: true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idents_are_always_quoted() {
        assert_eq!(quote_ident("orders"), "\"orders\"");
        assert_eq!(quote_ident("weird \"name\""), "\"weird \"\"name\"\"\"");
        assert_eq!(quote_ident("MixedCase"), "\"MixedCase\"");
    }

    #[test]
    fn literals_double_single_quotes() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal(r"back\slash"), r"'back\slash'");
    }
}
