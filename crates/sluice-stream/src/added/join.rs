//! A table joining a running stream: described, checked and published, recorded in the state
//! with its snapshot pending, then read under a snapshot hand-off of its own (see the parent
//! module for why that is exact); at a restart, pending snapshots are finished first, and a
//! pending table that is gone or no longer selected is given up.

use super::AddedTable;
use super::beside::Beside;
use crate::job::{StreamJob, check_tables, discover, note_missing, save, tables_now};
use crate::metrics::Metrics;
use crate::snapshot::{clear_unfinished, table_positions};
use crate::state::StreamState;
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Error, Result};
use sluice_engine::manifest::Manifest;
use sluice_sink::layout::{MANIFEST, dataset_dir};
use sluice_sink::{Destination, OutputLock};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::watch;

/// Where the bookkeeping of a snapshot of tables joining now goes.
fn new_prefix() -> String {
    format!(
        "_sluice/added/{}/",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%6fZ")
    )
}

/// Capture `created` (tables the selection matches now) from now on and read their snapshots.
pub(super) async fn add(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    state: &mut StreamState,
    created: &[TableRef],
    metrics: &Metrics,
    cancel: &watch::Receiver<bool>,
) -> Result<Vec<AddedTable>> {
    if created.is_empty() {
        return Ok(Vec::new());
    }
    // Described now (the watch only lists names); a table dropped again meanwhile makes the
    // description fail, which the next round settles.
    let found = discover(job.capture.source.as_ref(), &job.capture.selection)
        .await
        .map_err(|e| {
            Error::source_transient(format!(
                "describing the tables that joined the selection failed ({e}); trying again"
            ))
        })?;
    let new: Vec<Dataset> = found
        .into_iter()
        .filter(|d| d.object.as_ref().is_some_and(|t| created.contains(t)))
        .collect();
    if let Some(d) = new.iter().find(|d| state.tables.contains_key(&d.name)) {
        return Err(Error::config(format!(
            "{} was dropped (or left the publication) while the stream ran, and a table of that \
             name is in the selection again: its directory in {} holds the old table's \
             snapshot and changes (ended by {}/_dropped.json), which the new table's cannot \
             continue. Leave it out of the selection (--tables), or stream it into another \
             output.",
            d.name,
            job.destination.display(),
            dataset_dir(&d.name)
        )));
    }
    if new.is_empty() {
        return Ok(Vec::new());
    }
    job.capture.source.check(&new).await?;
    let unlogged = check_tables(job, &new).await?;
    // Published before it is recorded: a run killed in between finds the table again; one
    // that cannot be published leaves nothing behind.
    publish(
        job,
        state,
        &new.iter()
            .filter_map(|d| d.object.clone())
            .collect::<Vec<_>>(),
    )
    .await?;
    let prefix = new_prefix();
    state.join(&new, &prefix);
    note_missing(job, &unlogged, state);
    // In the state before its snapshot: a run killed from here on reads it again first.
    save(job, state).await?;
    finish(job, lock, state, metrics, cancel).await
}

async fn publish(job: &StreamJob, state: &StreamState, tables: &[TableRef]) -> Result<()> {
    match job.capture.source.server_objects() {
        Some(objects) => {
            objects
                .publish(&state.names, state.publication_created, tables)
                .await
        }
        None => Ok(()),
    }
}

/// The joined tables `added` as the stream decodes them (`--columns` applied).
pub(super) async fn described(
    job: &StreamJob,
    state: &StreamState,
    added: &[AddedTable],
) -> Result<Vec<Dataset>> {
    let names: Vec<String> = added.iter().map(|a| a.table.clone()).collect();
    discover(job.capture.source.as_ref(), &state.exactly(&names)).await
}

/// Read every snapshot of a joining table not done yet (at a restart: the ones a killed run
/// left unfinished), giving up the tables that are gone or no longer selected.
pub(crate) async fn finish(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    state: &mut StreamState,
    metrics: &Metrics,
    cancel: &watch::Receiver<bool>,
) -> Result<Vec<AddedTable>> {
    let mut pending: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, t) in &state.tables {
        if let Some(a) = &t.added
            && !a.snapshot_done
        {
            pending
                .entry(a.snapshot.clone())
                .or_default()
                .push(name.clone());
        }
    }
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    let now = tables_now(job.capture.source.as_ref(), &job.capture.selection, &[]).await?;
    let mut added = Vec::new();
    for (prefix, names) in pending {
        let (keep, gone): (Vec<String>, Vec<String>) = names
            .into_iter()
            .partition(|n| now.selected.contains(&state.tables[n].table));
        let prefix = if gone.is_empty() {
            prefix
        } else {
            give_up(job, state, &prefix, &keep, &gone).await?
        };
        if keep.is_empty() {
            continue;
        }
        let tables: Vec<TableRef> = keep.iter().map(|n| state.tables[n].table.clone()).collect();
        publish(job, state, &tables).await?;
        added.extend(snapshot(job, lock, state, &prefix, &keep, cancel).await?);
        metrics
            .tables_added
            .fetch_add(keep.len() as u64, Ordering::Relaxed);
    }
    Ok(added)
}

/// Give up pending tables `gone` of the snapshot at `prefix`: their parts, the snapshot's
/// bookkeeping (it names them) and their state go, and the tables it keeps (`keep`) start a
/// snapshot afresh under a new prefix, which is returned.
async fn give_up(
    job: &StreamJob,
    state: &mut StreamState,
    prefix: &str,
    keep: &[String],
    gone: &[String],
) -> Result<String> {
    tracing::warn!(
        "{} joined the stream but is gone or no longer selected before its snapshot was \
         done: given up (it joins again if it is selected again)",
        gone.join(", ")
    );
    let dest = job.destination.as_ref();
    for name in keep.iter().chain(gone) {
        for f in dest.list(&format!("{}/", dataset_dir(name))).await? {
            if !f.path.contains("/changes/") {
                dest.delete(&f.path).await?;
            }
        }
    }
    for f in dest.list(prefix).await? {
        dest.delete(&f.path).await?;
    }
    for name in gone {
        state.tables.remove(name);
    }
    let fresh = new_prefix();
    for name in keep {
        if let Some(a) = state.tables.get_mut(name).and_then(|t| t.added.as_mut()) {
            a.snapshot = fresh.clone();
        }
    }
    save(job, state).await?;
    Ok(fresh)
}

/// Read the snapshot of tables `names` (which joined the stream together) under a new
/// hand-off, their manifest and bookkeeping under `prefix`.
async fn snapshot(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    state: &mut StreamState,
    prefix: &str,
    names: &[String],
    cancel: &watch::Receiver<bool>,
) -> Result<Vec<AddedTable>> {
    let dest: Arc<dyn Destination> = Arc::new(Beside {
        inner: job.destination.clone(),
        prefix: prefix.to_string(),
    });
    let cleared = clear_unfinished(dest.as_ref(), &state.extension).await?;
    if !cleared.is_empty() {
        tracing::info!(
            "finishing the snapshot of tables that joined the stream: {} will be read again \
             whole under a new snapshot",
            cleared.join(", ")
        );
    }
    let handoff = job.capture.source.handoff().await?;
    let (held, hold) = state.take_handoff(handoff);
    save(job, state).await?;
    let mut export = (job.export)(job.capture.source.export_source(held.as_ref()));
    export.destination = dest.clone();
    export.resume = true;
    export.held_lock = Some(lock.clone());
    export.selection = state.exactly(names);
    let result = sluice_engine::run_export(export, job.progress.clone(), cancel.clone()).await;
    if let Some(hold) = hold {
        let _ = hold.release().await;
    }
    result.map_err(|e| {
        e.then(format!(
            "The snapshot of {}, which joined the stream, is unfinished: run the same sluice \
             stream command again to finish it before the stream goes on. {}",
            names.join(", "),
            job.capture
                .source
                .while_stopped(&state.names, "sluice stream")
        ))
    })?;
    let bytes = dest
        .get(MANIFEST)
        .await?
        .ok_or_else(|| Error::internal("a joining table's snapshot finished without a manifest"))?;
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
        Error::internal(format!(
            "a joining table's snapshot manifest cannot be read: {e}"
        ))
    })?;
    table_positions(job.capture.source.as_ref(), state, &manifest)?;
    let mut added = Vec::new();
    for name in names {
        let Some(t) = state.tables.get_mut(name) else {
            continue;
        };
        if let Some(a) = &mut t.added {
            a.snapshot_done = true;
        }
        let rows = manifest
            .datasets
            .iter()
            .find(|d| &d.name == name)
            .map(|d| d.rows)
            .unwrap_or(0);
        tracing::info!(
            "{name} joined the stream: {rows} rows in its snapshot ({prefix}manifest.json); its \
             changes from position {} on go to {}/changes/",
            t.snapshot_position
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_else(|| "its start".into()),
            dataset_dir(name)
        );
        added.push(AddedTable {
            table: name.clone(),
            rows,
            position: t.snapshot_position.clone(),
        });
    }
    save(job, state).await?;
    Ok(added)
}
