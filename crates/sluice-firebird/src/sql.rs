//! Quoting: the only place SQL text is built from names and values.
//!
//! Identifiers always go through [`quote_ident`] and values through [`quote_literal`]; nothing
//! is pasted into SQL unquoted. Firebird (dialect 3) takes a delimited identifier in double
//! quotes and a string literal in single quotes, each with the quote character doubled; it has
//! no backslash escapes.

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
