//! [`ByteSize`]: a size setting (`--memory`, `--chunk-size`, `batch_bytes:` …), read into a
//! byte count where it is given (clap's parse of the flag, the `-c` file's or the Python
//! keywords' deserialization), so a wrong size fails there (naming the flag, or in the `-c`
//! file the key and its line), and nothing after that handles its text.

use clap::builder::{TypedValueParser, ValueParserFactory};
use serde::de::{self, Deserialize, Deserializer, Visitor};
use sluice_core::size::parse_size;
use std::ffi::OsStr;
use std::fmt;

/// A size in bytes, as users write it: a positive number of bytes, or one with KB, MB or GB
/// in powers of 1024 (KiB, MiB, GiB too; see [`parse_size`]); a YAML or JSON number is bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(u64);

impl ByteSize {
    /// The size `text` gives; `what` names the setting in the error (`--chunk-size`), which
    /// says what is accepted.
    fn parse(text: &str, what: &str) -> sluice_core::Result<ByteSize> {
        parse_size(text, what).map(ByteSize)
    }

    /// The number of bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// The largest unit that divides the size (`64KB`, `5MB`), as the flags are written, or bytes.
impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = [(30, "GB"), (20, "MB"), (10, "KB")]
            .into_iter()
            .find(|(shift, _)| self.0 != 0 && self.0.is_multiple_of(1 << shift));
        match unit {
            Some((shift, name)) => write!(f, "{}{name}", self.0 >> shift),
            None => write!(f, "{}", self.0),
        }
    }
}

/// The flag's parser: its error names the flag (`--memory "12XB" is not a size: …`).
#[derive(Debug, Clone, Copy)]
pub struct ByteSizeParser;

impl TypedValueParser for ByteSizeParser {
    type Value = ByteSize;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<ByteSize, clap::Error> {
        let flag = arg
            .and_then(|a| a.get_long())
            .map_or_else(|| "a size".to_string(), |long| format!("--{long}"));
        let text = value.to_string_lossy();
        ByteSize::parse(&text, &flag).map_err(|e| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("{}\n", e.message()),
            )
            .with_cmd(cmd)
        })
    }
}

impl ValueParserFactory for ByteSize {
    type Parser = ByteSizeParser;
    fn value_parser() -> ByteSizeParser {
        ByteSizeParser
    }
}

/// A number of bytes or a text with a unit. The key is named by whoever reads the map (the
/// YAML file's path or line, see `config.rs`).
impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Size;
        impl Visitor<'_> for Size {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a size: a positive number of bytes, or a text with KB, MB or GB (e.g. 128MB)",
                )
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                // The message starts with what it is given to ("--memory"): here, the value.
                ByteSize::parse(v, "")
                    .map_err(|e| E::custom(e.message().trim_start().trim_end_matches('.')))
            }
        }
        d.deserialize_any(Size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Flags {
        #[arg(long)]
        chunk_size: Option<ByteSize>,
    }

    fn flag(text: &str) -> Result<Option<ByteSize>, String> {
        use clap::Parser;
        Flags::try_parse_from(["t", "--chunk-size", text])
            .map(|f| f.chunk_size)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn flags_are_read_into_bytes_and_a_wrong_one_is_named() {
        assert_eq!(flag("128MB").unwrap(), Some(ByteSize(128 << 20)));
        assert_eq!(flag("4096").unwrap(), Some(ByteSize(4096)));
        assert_eq!(flag("2 GiB").unwrap(), Some(ByteSize(2 << 30)));
        for bad in ["12XB", "0", "1.5MB", "MB"] {
            let e = flag(bad).unwrap_err();
            assert!(
                e.contains(&format!("--chunk-size {bad:?} is not a size"))
                    && e.contains("KB, MB or GB"),
                "{bad}: {e}"
            );
        }
        let e = flag("99999999999GB").unwrap_err();
        assert!(e.contains("--chunk-size") && e.contains("too large"), "{e}");
    }

    #[test]
    fn yaml_and_json_give_numbers_or_text() {
        let yaml = |t: &str| yaml_serde::from_str::<ByteSize>(t).map_err(|e| e.to_string());
        assert_eq!(yaml("1048576").unwrap(), ByteSize(1 << 20));
        assert_eq!(yaml("64KB").unwrap(), ByteSize(64 << 10));
        for bad in ["12XB", "0", "-5", "1.5", "[1]"] {
            let e = yaml(bad).unwrap_err();
            assert!(
                e.contains("not a size") || e.contains("a size:"),
                "{bad}: {e}"
            );
        }
        let json = |v: serde_json::Value| serde_json::from_value::<ByteSize>(v);
        assert_eq!(json(serde_json::json!(4096)).unwrap(), ByteSize(4096));
        assert_eq!(json(serde_json::json!("8MiB")).unwrap(), ByteSize(8 << 20));
        assert!(json(serde_json::json!(-1)).is_err());
    }

    #[test]
    fn shown_in_the_largest_unit_that_divides_it() {
        for (bytes, shown) in [
            (64 << 10, "64KB"),
            (5 << 20, "5MB"),
            (3 << 30, "3GB"),
            (1536 << 10, "1536KB"),
            (1000, "1000"),
        ] {
            assert_eq!(ByteSize(bytes).to_string(), shown);
        }
    }
}
