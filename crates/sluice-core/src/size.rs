//! Byte sizes as users write them (`128MB`, `4096`, `2 GiB`), read the same way everywhere:
//! flags, YAML keys and URL parameters (an object store's `part_size`).
//!
//! Units are powers of 1024, as in PostgreSQL's settings: 1MB = 1,048,576 bytes, and `KiB`,
//! `MiB`, `GiB` mean the same. Every size sluice prints uses these units too.

use crate::error::{Error, Result};

/// Parse a size: a positive whole number with an optional unit B, K/KB/KiB, M/MB/MiB,
/// G/GB/GiB (any case, spaces allowed before the unit). `what` names the setting in the error
/// (`--chunk-size`), which says what is accepted.
pub fn parse_size(text: &str, what: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => 0,
    };
    match num.parse::<u64>() {
        Ok(n) if mult > 0 && n > 0 => n
            .checked_mul(mult)
            .ok_or_else(|| Error::config(format!("{what} {text:?} is too large."))),
        _ => Err(Error::config(format!(
            "{what} {text:?} is not a size: write a positive number of bytes, optionally with \
             KB, MB or GB (e.g. 128MB)."
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128MB", "x").unwrap(), 128 << 20);
        assert_eq!(parse_size("4096", "x").unwrap(), 4096);
        assert_eq!(parse_size("2 GiB", "x").unwrap(), 2 << 30);
        assert_eq!(parse_size("8mib", "x").unwrap(), 8 << 20);
        for bad in ["", "MB", "0", "-1", "12XB", "1.5MB", "8 parsecs"] {
            let e = parse_size(bad, "--chunk-size").unwrap_err();
            assert!(e.message().starts_with("--chunk-size"), "{bad}: {e}");
        }
    }
}
