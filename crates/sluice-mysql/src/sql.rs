//! Quoting: the only place SQL text is built from names and values.
//!
//! Identifiers always go through [`quote_ident`] and values through [`quote_literal`] (or are
//! bound as parameters); nothing is pasted into SQL unquoted. Literals escape backslashes as
//! well as quotes, so they are safe whether or not the session runs with
//! `NO_BACKSLASH_ESCAPES`.

use sluice_core::table::TableRef;

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

#[cfg(test)]
mod tests {
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
    fn literals_cannot_break_out() {
        assert_eq!(quote_literal("it's"), "_utf8mb4 X'69742773'");
        assert_eq!(hex_literal(b"\\'\x00"), "X'5C2700'");
        assert_eq!(hex_literal(b""), "X''");
    }
}
