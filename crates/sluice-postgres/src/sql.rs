//! Quoting: the only place SQL text is built from names and values.
//!
//! Identifiers always go through [`quote_ident`] and values through [`quote_literal`]; nothing
//! is pasted into SQL unquoted. Sessions run with `standard_conforming_strings = on`, so a
//! literal needs only its single quotes doubled.

use sluice_core::table::TableRef;

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
