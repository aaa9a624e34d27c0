//! Changes of the captured tables' layout that the source's log does not carry (PostgreSQL:
//! a partition truncated, detached or dropped — see `sluice-postgres`'s
//! `replication/partitions.rs`), watched from the layout kept with the state.
//!
//! At the first start the source's layout is saved with the state; at every start and every
//! minute while a run streams it is compared with the source's catalog. A change stops the run
//! with the fix (`--partition-changes stop`, the default: the change files or the target would
//! keep rows the source no longer has, and nothing in the log says when they left), or, with
//! `--partition-changes keep`, is warned about, noted with the table in the state (and in its
//! change files' metadata, as other changes they miss) and taken as the new layout.

use crate::state::StreamState;
use sluice_core::change::ChangeSource;
use sluice_core::{Dataset, Error, Result};
use std::time::Duration;

/// How often a running stream compares the layout with the source's.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(60);

/// What a run does when the layout changed (`--partition-changes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LayoutChanges {
    /// Stop with the fix (the default).
    #[default]
    Stop,
    /// Warn, note it with the table, and go on.
    Keep,
}

/// Compare `state`'s layout with the source's now. `Ok(true)` when `state` changed (notes
/// added, new layout): save it.
pub(crate) async fn check(
    source: &dyn ChangeSource,
    datasets: &[Dataset],
    state: &mut StreamState,
    policy: LayoutChanges,
    command: &str,
) -> Result<bool> {
    let Some(saved) = state.layout.clone() else {
        return Ok(false);
    };
    let changes = source.layout_changes(&saved, datasets).await?;
    if changes.is_empty() {
        return Ok(false);
    }
    let (missing, said): (Vec<_>, Vec<_>) = changes.into_iter().partition(|c| c.missing);
    if policy == LayoutChanges::Stop && !missing.is_empty() {
        let list: Vec<String> = missing
            .iter()
            .map(|c| format!("{}: {}", c.table, c.what))
            .collect();
        return Err(Error::source_permanent(format!(
            "{}. {command} cannot carry that: the change files or the target would keep rows \
             the source no longer has, and the log does not say when they left. Take a new \
             snapshot of the table ({command} --drop, then start again), or run with \
             --partition-changes keep to go on keeping those rows (said in the state and the \
             change files' metadata).",
            list.join("; ")
        )));
    }
    for c in &said {
        tracing::warn!("{}: {}", c.table, c.what);
    }
    for c in &missing {
        tracing::warn!("{}: {}; kept (--partition-changes keep)", c.table, c.what);
        if let Some(t) = state
            .tables
            .values_mut()
            .find(|t| t.table.to_string() == c.table)
            && !t.missing.contains(&c.what)
        {
            t.missing.push(c.what.clone());
        }
    }
    state.layout = source.layout(datasets).await?;
    Ok(true)
}
