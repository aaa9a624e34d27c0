//! A replication's name: the key of its state and position rows on the target and, on
//! PostgreSQL, its replication slot and publication.
//!
//! Without `--slot` the name is derived, so running the same command again continues the
//! same replication. It is derived from what decides which rows go where, written out in a
//! canonical form and hashed with a hash whose output is fixed by its specification (xxh3):
//! the source's and the target's identities (engine, hosts and ports, database — not the
//! user, TLS options or how the URL is spelt), the target schema, and the selection sorted.
//! So two targets fed from one source are two replications (each with its own slot), and
//! `postgres://` vs `postgresql://`, an added `?sslmode=`, the order of `--table` flags or a
//! new Rust release do not start a second one.
//!
//! Names derived before this rule (from the redacted URL and the selection only, through the
//! standard library's unspecified hasher) are still found: a target holding state under the
//! old name of the same request continues under it.

use super::ReplicateJob;
use sluice_core::Result;
use sluice_core::change::ChangeSource;
use sluice_core::table::Selection;

/// The canonical text of a selection: one line per table, pattern and schema, sorted.
fn selection_text(selection: &Selection) -> String {
    let mut lines: Vec<String> = selection
        .tables
        .iter()
        .map(|t| format!("table {t}"))
        .chain(selection.patterns.iter().map(|p| format!("tables {p}")))
        .chain(selection.schemas.iter().map(|s| format!("schema {s}")))
        .collect();
    lines.sort();
    lines.dedup();
    lines.join("\n")
}

/// The derived name of `job`'s replication (its target schema already resolved).
pub(super) fn derived(job: &ReplicateJob) -> String {
    let canonical = format!(
        "source {}\ntarget {}\ntarget schema {}\n{}",
        job.capture.source.identity(),
        job.target.identity(),
        job.target_schema.as_deref().unwrap_or(""),
        selection_text(&job.capture.selection)
    );
    let h = xxhash_rust::xxh3::xxh3_64(canonical.as_bytes());
    format!("sluice_r{:012x}", h & 0xffff_ffff_ffff)
}

/// The name the first releases derived (redacted URL and selection, standard hasher).
fn legacy(source: &dyn ChangeSource, selection: &Selection) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.display_url().hash(&mut h);
    format!("{selection:?}").hash(&mut h);
    format!("sluice_r{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// The replication's name: `--slot`, else the derived name, else the legacy name when the
/// target holds state under it (and none under the derived one).
pub(super) async fn resolve(job: &ReplicateJob) -> Result<String> {
    if let Some(n) = &job.name {
        return Ok(n.clone());
    }
    let name = derived(job);
    if job.target.load_state(&name).await?.is_some() {
        return Ok(name);
    }
    let old = legacy(job.capture.source.as_ref(), &job.capture.selection);
    if job.target.load_state(&old).await?.is_some() {
        tracing::info!(
            "continuing replication {old} (a name derived before names took the target into \
             account; pass --slot {old} to keep it whatever changes)"
        );
        return Ok(old);
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::ident::QualifiedName;

    fn sel(tables: &[&str]) -> Selection {
        Selection {
            tables: tables
                .iter()
                .map(|t| QualifiedName::parse(t).unwrap_or_else(|e| panic!("{e}")))
                .collect(),
            ..Selection::default()
        }
    }

    #[test]
    fn selection_order_does_not_change_the_name() {
        assert_eq!(
            selection_text(&sel(&["b", "a.c"])),
            selection_text(&sel(&["a.c", "b", "b"]))
        );
        assert_ne!(
            selection_text(&sel(&["a"])),
            selection_text(&sel(&["a", "b"]))
        );
    }

    #[test]
    fn the_hash_is_fixed_by_its_specification() {
        // XXH3-64 of the empty input, from its specification: a toolchain or crate upgrade
        // must not change a derived name.
        assert_eq!(
            format!("{:016x}", xxhash_rust::xxh3::xxh3_64(b"")),
            "2d06800538d394c2"
        );
    }
}
