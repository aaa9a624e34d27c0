//! Parsing the table names users type.
//!
//! Users write `orders`, `public.orders`, `"Weird ""Name"""` or `sales."MixedCase"`. A part in
//! double quotes is taken exactly (a doubled quote is a literal quote); a bare part is matched
//! exactly first and, failing that, case-insensitively by the adapter's catalog lookup — so a
//! user need not know how the database folds case, yet a quoted name is never reinterpreted.
//! Quoting for SQL is the adapters' job (each has a `quote_ident`, built on [`enclose`]); this
//! module never produces SQL itself.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Wrap `text` in `quote`, doubling every `quote` inside it: the one escaping rule behind every
/// adapter's identifier quoting (`"…"`, `` `…` ``) and standard SQL string literals (`'…'`).
///
/// Why one function: quoting is where injection hides, so every engine shares one tested piece.
/// Limits: it knows no backslash escapes; an engine whose literals honour them (MySQL without
/// `NO_BACKSLASH_ESCAPES`) must not use it for literals.
pub fn enclose(text: &str, quote: char) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push(quote);
    for c in text.chars() {
        if c == quote {
            s.push(quote);
        }
        s.push(c);
    }
    s.push(quote);
    s
}

/// One part of a qualified name, with whether the user quoted it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NamePart {
    /// The text of the part with quotes removed and doubled quotes undone.
    pub text: String,
    /// True when the user wrote the part in double quotes: match it exactly.
    pub quoted: bool,
}

/// `[schema.]name` as typed by a user.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QualifiedName {
    /// The schema (or MySQL database), if given.
    pub schema: Option<NamePart>,
    /// The object name.
    pub name: NamePart,
}

impl QualifiedName {
    /// Parse `name`, `schema.name`, with either part optionally in double quotes.
    pub fn parse(input: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::config(format!(
                "table name {input:?} is not valid: {why}. Write it as name or schema.name; put \
                 a part containing dots, spaces or capitals you want kept exactly in double \
                 quotes, doubling any quote inside (e.g. --table 'public.\"Weird \"\"Name\"\"\"')."
            ))
        };
        let mut parts = Vec::new();
        let mut chars = input.trim().chars().peekable();
        loop {
            let mut text = String::new();
            let quoted = chars.peek() == Some(&'"');
            if quoted {
                chars.next();
                loop {
                    match chars.next() {
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            text.push('"');
                        }
                        Some('"') => break,
                        Some(c) => text.push(c),
                        None => return Err(bad("a double quote is not closed")),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == '.' {
                        break;
                    }
                    if c == '"' {
                        return Err(bad("a double quote appears inside an unquoted part"));
                    }
                    text.push(c);
                    chars.next();
                }
                if text.trim() != text {
                    return Err(bad("an unquoted part has spaces around it"));
                }
            }
            if text.is_empty() {
                return Err(bad("a part is empty"));
            }
            parts.push(NamePart { text, quoted });
            match chars.next() {
                None => break,
                Some('.') => continue,
                Some(_) => return Err(bad("text follows a closing quote")),
            }
        }
        match parts.len() {
            1 => Ok(QualifiedName {
                schema: None,
                name: parts.remove(0),
            }),
            2 => {
                let name = parts.remove(1);
                Ok(QualifiedName {
                    schema: Some(parts.remove(0)),
                    name,
                })
            }
            _ => Err(bad("it has more than two dot-separated parts")),
        }
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |p: &NamePart| {
            if p.quoted {
                format!("\"{}\"", p.text.replace('"', "\"\""))
            } else {
                p.text.clone()
            }
        };
        match &self.schema {
            Some(s) => write!(f, "{}.{}", show(s), show(&self.name)),
            None => write!(f, "{}", show(&self.name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enclose_doubles_only_its_own_quote() {
        assert_eq!(enclose(r#"a"b'c"#, '"'), r#""a""b'c""#);
        assert_eq!(enclose("it's", '\''), "'it''s'");
        assert_eq!(enclose("x`y", '`'), "`x``y`");
        assert_eq!(enclose("", '"'), "\"\"");
    }

    #[test]
    fn parses_plain_and_quoted() {
        let q = QualifiedName::parse("public.orders").unwrap();
        assert_eq!(q.schema.unwrap().text, "public");
        assert_eq!(q.name.text, "orders");
        assert!(!q.name.quoted);

        let q = QualifiedName::parse(r#"public."weird ""name""""#).unwrap();
        assert_eq!(q.name.text, r#"weird "name""#);
        assert!(q.name.quoted);

        let q = QualifiedName::parse(r#""a.b""#).unwrap();
        assert!(q.schema.is_none());
        assert_eq!(q.name.text, "a.b");
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", "a.", ".a", "a.b.c", "\"open", "a\"b", "\"x\"y"] {
            let e = QualifiedName::parse(bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{bad}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["public.orders", r#"public."weird ""name""""#, r#""Mixed""#] {
            assert_eq!(QualifiedName::parse(s).unwrap().to_string(), s);
        }
    }
}
