//! Tables that join or leave a running stream (`--discover-every`).
//!
//! Every `--discover-every` seconds the run lists the selection's tables and the source's by
//! name (`changed`, from the read loop in `drive.rs`; nothing is described). When a table
//! matching the selection was created, or a captured one no longer exists (or, on
//! PostgreSQL, left the publication), the run notes the source's current position, writes and
//! commits every change up to it, stops reading, and takes the tables in here:
//!
//! - **dropped** (seen gone at the noted position, and still gone): everything the table
//!   logged is now in its change files, so a final marker, `<table>/_dropped.json`, says so,
//!   and the state keeps the table as dropped (its later changes, of a table created again
//!   under its name, are left out). A table found gone only now is ended in the next round,
//!   after the changes up to a new position;
//! - **created**: described, published (PostgreSQL: added to the publication, see
//!   `publication.rs` in `sluice-postgres`), recorded in the state (its snapshot not done), then
//!   read under a new
//!   snapshot hand-off exactly as an interrupted initial snapshot is finished (`snapshot.rs`
//!   says why that is exact): its parts go to its directory, its manifest beside the initial
//!   one (`_sluice/added/<id>/manifest.json`, `added/beside.rs`), and the snapshot's position
//!   becomes its `snapshot_position`. Reading resumes at the committed position, which is
//!   before that snapshot: the table's changes before it are in the snapshot and left out,
//!   the later ones written.
//!
//! A run killed while a table's snapshot is read finds it unfinished in the state and reads it
//! again (its finished tables kept) before it streams (`added/join.rs`); one that is gone or no
//! longer selected by then is given up. A table published but not recorded (a kill in between)
//! is simply found again. A table dropped and created again under a captured name cannot
//! continue the old table's directory and stops the run with the fix. Tables that exist but no
//! longer match the selection are not "dropped": a restart with a narrower selection is
//! refused instead (`run.rs`).

mod beside;
mod join;

use crate::job::{StreamJob, blocking, save, tables_now};
use crate::metrics::Metrics;
use crate::state::{Dropped, StreamState};
use serde::Serialize;
use sluice_core::change::{CaptureNames, ChangeSource};
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Error, Result, Selection, StreamPos};
use sluice_sink::OutputLock;
use sluice_sink::layout::dataset_dir;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::watch;

pub(crate) use join::finish;

/// A table that joined the stream, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct AddedTable {
    /// Its dataset name.
    pub table: String,
    /// Rows of its snapshot.
    pub rows: u64,
    /// Its changes are written from this position on (its snapshot has the earlier ones).
    pub position: Option<StreamPos>,
}

impl AddedTable {
    /// How the report says it: the table, its snapshot's rows and where its changes start.
    pub fn describe(&self) -> String {
        let from = self
            .position
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_else(|| "its start".into());
        format!(
            "{} ({} rows in its own snapshot; its changes from position {from} on)",
            self.table, self.rows
        )
    }
}

/// What the run did when the selection's tables changed.
pub(crate) struct TakenIn {
    /// The captured tables now, as the change stream decodes them.
    pub datasets: Vec<Dataset>,
    pub added: Vec<AddedTable>,
    /// Dropped tables, with whether their changes are complete.
    pub dropped: Vec<(String, bool)>,
}

/// The selection's tables now, compared with the state's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    /// Tables the selection matches that the stream does not capture (or captured once and
    /// ended: created again under a dropped table's name).
    created: Vec<TableRef>,
    /// Captured tables (dataset names) that no longer exist, or left the publication.
    gone: Vec<String>,
    /// Captured tables the selection still matches that left the publication (dropped and
    /// created again under the same name, or taken out of it): their changes no longer arrive.
    unpublished: Vec<TableRef>,
}

impl Seen {
    async fn now(
        source: &dyn ChangeSource,
        names: &CaptureNames,
        selection: &Selection,
        state: &StreamState,
    ) -> Result<Seen> {
        let captured: Vec<TableRef> = state
            .tables
            .values()
            .filter(|t| t.dropped.is_none())
            .map(|t| t.table.clone())
            .collect();
        let now = tables_now(source, selection, &captured).await?;
        let published = match source.server_objects() {
            Some(o) => Some(o.published(names).await?),
            None => None,
        };
        let live = |t: &TableRef| {
            state
                .tables
                .values()
                .any(|s| s.table == *t && s.dropped.is_none())
        };
        let created = now.selected.iter().filter(|t| !live(t)).cloned().collect();
        let unpublished: Vec<TableRef> = state
            .tables
            .values()
            .filter(|t| t.dropped.is_none() && now.selected.contains(&t.table))
            .filter(|t| published.as_ref().is_some_and(|p| !p.contains(&t.table)))
            .map(|t| t.table.clone())
            .collect();
        let gone = state
            .tables
            .iter()
            .filter(|(_, t)| t.dropped.is_none())
            .filter(|(_, t)| !now.existing.contains(&t.table) || unpublished.contains(&t.table))
            .map(|(n, _)| n.clone())
            .collect();
        Ok(Seen {
            created,
            gone,
            unpublished,
        })
    }

    /// The tables the selection matches that are not captured (created since the start).
    pub(crate) fn created(&self) -> &[TableRef] {
        &self.created
    }

    /// Captured tables that exist but left the publication.
    pub(crate) fn unpublished(&self) -> &[TableRef] {
        &self.unpublished
    }

    fn describe(&self) -> Option<String> {
        let mut what = Vec::new();
        if !self.created.is_empty() {
            let names: Vec<String> = self.created.iter().map(|t| t.to_string()).collect();
            what.push(format!("created: {}", names.join(", ")));
        }
        if !self.gone.is_empty() {
            what.push(format!("dropped: {}", self.gone.join(", ")));
        }
        (!what.is_empty()).then(|| format!("tables of the selection {}", what.join("; ")))
    }
}

/// What changed among the selection's tables since `state` took them in: its description
/// and what was seen, `None` when nothing did.
pub(crate) async fn changed(
    source: &dyn ChangeSource,
    names: &CaptureNames,
    selection: &Selection,
    state: &StreamState,
) -> Result<Option<(String, Seen)>> {
    let seen = Seen::now(source, names, selection, state).await?;
    Ok(seen.describe().map(|d| (d, seen)))
}

/// Take in what changed among the selection's tables: `at_stop`, what was seen when the run
/// noted the position it has now written everything up to; `datasets`, the tables it read.
pub(crate) async fn take_in(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    state: &mut StreamState,
    datasets: &[Dataset],
    at_stop: &Seen,
    metrics: &Metrics,
    cancel: &watch::Receiver<bool>,
) -> Result<TakenIn> {
    // A layout change since the last check first, so the layout taken below hides none.
    crate::layout::check(
        job.capture.source.as_ref(),
        datasets,
        state,
        job.capture.partition_changes,
        "sluice stream",
    )
    .await?;
    let seen = Seen::now(
        job.capture.source.as_ref(),
        &state.names,
        &job.capture.selection,
        state,
    )
    .await?;
    // Only tables already gone at the noted position: their changes are all written.
    let gone: Vec<String> = seen
        .gone
        .iter()
        .filter(|n| at_stop.gone.contains(n))
        .cloned()
        .collect();
    let mut dropped = Vec::new();
    for name in &gone {
        let complete =
            job.capture.source.describes_rows() || datasets.iter().any(|d| &d.name == name);
        dropped.push((name.clone(), end_table(job, state, name, complete).await?));
        metrics.tables_dropped.fetch_add(1, Ordering::Relaxed);
    }
    if !gone.is_empty() {
        save(job, state).await?;
    }
    let added = join::add(job, lock, state, &seen.created, metrics, cancel).await?;
    let mut live: Vec<Dataset> = datasets
        .iter()
        .filter(|d| !gone.contains(&d.name))
        .cloned()
        .collect();
    if !added.is_empty() {
        let mut joined = join::described(job, state, &added).await?;
        live.append(&mut joined);
    }
    state.layout = job.capture.source.layout(&live).await?;
    save(job, state).await?;
    Ok(TakenIn {
        datasets: crate::job::whole(job, live).await?,
        added,
        dropped,
    })
}

/// After taking tables in failed part-way (a transient error): the state as saved, every
/// joining snapshot it holds finished, and the tables to read — the selection's that the state
/// captures, and those of `before` (the tables read until then) it still captures but the
/// source no longer lists (dropped, their last changes still to be read).
pub(crate) async fn recover(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    before: &[Dataset],
    metrics: &Metrics,
    cancel: &watch::Receiver<bool>,
) -> Result<(StreamState, Vec<Dataset>, Vec<AddedTable>)> {
    let store = job.state.clone();
    let mut state = blocking(move || store.load())
        .await?
        .ok_or_else(|| Error::internal("the stream state vanished while streaming"))?;
    let added = join::finish(job, lock, &mut state, metrics, cancel).await?;
    let live = |state: &StreamState, d: &Dataset| {
        state
            .tables
            .get(&d.name)
            .is_some_and(|t| t.dropped.is_none())
    };
    let mut datasets =
        crate::job::discover(job.capture.source.as_ref(), &job.capture.selection).await?;
    datasets.retain(|d| live(&state, d));
    for d in before {
        if live(&state, d) && !datasets.iter().any(|x| x.name == d.name) {
            datasets.push(d.clone());
        }
    }
    let datasets = crate::job::whole(job, datasets).await?;
    Ok((state, datasets, added))
}

/// Write the final marker of dropped table `name` and keep it in the state as dropped;
/// returns whether its changes are complete. `complete`: its changes were decoded up to the
/// drop (see [`Dropped::complete`]); a marker a killed run already wrote keeps its word.
async fn end_table(
    job: &StreamJob,
    state: &mut StreamState,
    name: &str,
    complete: bool,
) -> Result<bool> {
    let path = format!("{}/_dropped.json", dataset_dir(name));
    let written: Option<serde_json::Value> = job
        .destination
        .get(&path)
        .await?
        .and_then(|b| serde_json::from_slice(&b).ok());
    let complete = written
        .as_ref()
        .and_then(|m| m["complete"].as_bool())
        .unwrap_or(complete);
    let dropped = Dropped {
        before: state.committed.restart.clone(),
        found_at: chrono::Utc::now().to_rfc3339(),
        last_seq: state.committed.written_through,
        complete,
    };
    let Some(t) = state.tables.get_mut(name) else {
        return Ok(complete);
    };
    let why = if complete {
        "the table no longer exists on the source (or is no longer published): every change \
         it logged is in this directory's change files, and none will follow"
    } else {
        "the table was dropped while no stream ran, and this source decodes a table's \
         changes with its columns from the catalog: its changes between the stream's last \
         committed position before the drop and the drop are NOT in the change files"
    };
    if written.is_none() {
        let marker = serde_json::json!({
            "table": t.table.to_string(),
            "dropped": true,
            "complete": complete,
            "changes_before": dropped.before,
            "last_seq": dropped.last_seq,
            "found_at": dropped.found_at,
            "why": why,
        });
        let bytes = serde_json::to_vec_pretty(&marker)
            .map_err(|e| Error::internal(format!("the drop marker cannot be written: {e}")))?;
        job.destination.put(&path, bytes).await?;
    }
    if complete {
        tracing::warn!(
            "{name} was dropped on the source (or left the publication): its changes are \
             complete up to position {}, _seq {}; {path} marks its end",
            dropped.before,
            dropped.last_seq
        );
    } else {
        tracing::error!(
            "{name} was dropped on the source while no stream ran: {why}. {path} marks its \
             end and says so; take a new copy of the table from elsewhere if its last rows \
             matter"
        );
    }
    t.dropped = Some(dropped);
    Ok(complete)
}
