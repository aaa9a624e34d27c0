//! `sluice --version` and its long form: what a bug report needs to say which sluice ran.
//!
//! The commit, its date, the compiler, target and profile are recorded by `build.rs`; the
//! sources and destinations come from `registry` and the formats from the flags' own value
//! lists, so this cannot list something the binary does not do.

use crate::args::{CompressionArg, FormatArg};
use crate::registry;
use clap::ValueEnum;

/// The commit the binary was built from ("unknown" when built outside a git checkout and
/// without `SLUICE_BUILD_COMMIT`).
pub const COMMIT: &str = env!("SLUICE_COMMIT");
const COMMIT_DATE: &str = env!("SLUICE_COMMIT_DATE");
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn short_commit() -> &'static str {
    COMMIT.get(..12).unwrap_or(COMMIT)
}

/// One line: `sluice 0.1.0 (commit 070025a1b2c3, 2026-11-22)`.
pub fn line() -> String {
    let date = if COMMIT_DATE.is_empty() {
        String::new()
    } else {
        format!(", {COMMIT_DATE}")
    };
    format!("sluice {VERSION} (commit {}{date})\n", short_commit())
}

fn names<T: ValueEnum>() -> Vec<String> {
    T::value_variants()
        .iter()
        .filter_map(|v| v.to_possible_value())
        .map(|p| p.get_name().to_string())
        .collect()
}

/// The long form: version, full commit, build, and what this build reads and writes.
pub fn long() -> String {
    let mut out = format!("sluice {VERSION}\n");
    let row = |out: &mut String, k: &str, v: String| out.push_str(&format!("{k:<14}{v}\n"));
    row(
        &mut out,
        "commit",
        if COMMIT_DATE.is_empty() {
            COMMIT.to_string()
        } else {
            format!("{COMMIT} ({COMMIT_DATE})")
        },
    );
    row(
        &mut out,
        "build",
        format!(
            "{}, {} profile, {}",
            env!("SLUICE_TARGET"),
            env!("SLUICE_PROFILE"),
            env!("SLUICE_RUSTC")
        ),
    );
    for (i, s) in registry::SOURCES.iter().enumerate() {
        row(
            &mut out,
            if i == 0 { "sources" } else { "" },
            format!("{:<10}{} ({})", s.engine, s.schemes.join(", "), s.about),
        );
    }
    for (i, (what, forms)) in registry::DESTINATIONS.iter().enumerate() {
        row(
            &mut out,
            if i == 0 { "destinations" } else { "" },
            format!("{what}: {}", forms.join(", ")),
        );
    }
    for (i, f) in names::<FormatArg>().iter().enumerate() {
        let detail = match f.as_str() {
            "parquet" => format!(" (compression {})", names::<CompressionArg>().join(", ")),
            _ => String::new(),
        };
        row(
            &mut out,
            if i == 0 { "formats" } else { "" },
            format!("{f}{detail}"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_form_names_every_source_and_format() {
        let text = long();
        for s in registry::SOURCES {
            for scheme in s.schemes {
                assert!(text.contains(scheme), "{scheme} in {text}");
            }
        }
        for f in ["parquet", "csv", "zstd", "s3://", "gs://", "az://"] {
            assert!(text.contains(f), "{f} in {text}");
        }
        assert!(text.contains(COMMIT));
        assert!(line().contains(short_commit()));
    }
}
