//! Tables created on the source that a running replication's selection matches, taken in as
//! a stream takes joining tables in (`added/join.rs`): described and checked, created on the
//! target, published (PostgreSQL), recorded with their load pending, then loaded under a
//! snapshot hand-off of their own whose position becomes theirs — their changes before it are
//! in the load and passed over, those after it applied.
//!
//! Exact for the same reason as a stream's: the run stopped only once every change before the
//! position where it saw the tables was applied (`drive.rs`), the hand-off's snapshot is taken
//! after that, and the stream then restarts from the applied position, so each of the new
//! tables' changes is either in its load or after its position, never both, never neither. A
//! run killed before a load finished leaves it pending in the state; the next run empties
//! those tables and loads them again before it streams.

use super::{ReplicateJob, load, save_state};
use crate::added::AddedTable;
use crate::state::StreamState;
use sluice_core::apply::{ForeignKey, SourceColumn, TableKeys, TargetTable};
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Error, ErrorKind, Result};
use tokio::sync::watch;

/// What the replication reads after tables were taken in.
pub(super) struct TakenIn {
    /// The selection's tables, described now.
    pub datasets: Vec<Dataset>,
    /// Their keys.
    pub keys: Vec<TableKeys>,
    /// The foreign keys whose cascades the source's log leaves out (the target applies them).
    pub unlogged: Vec<(TableRef, ForeignKey)>,
    /// The tables loaded.
    pub added: Vec<AddedTable>,
}

/// Take `created` (tables the selection matches that the replication does not carry) in.
pub(super) async fn take_in(
    job: &ReplicateJob,
    state: &mut StreamState,
    created: &[TableRef],
    cancel: &watch::Receiver<bool>,
) -> Result<TakenIn> {
    let (datasets, keys, unlogged) = super::inspect(job).await?;
    let new: Vec<Dataset> = datasets
        .iter()
        .filter(|d| {
            d.object
                .as_ref()
                .is_some_and(|t| created.contains(t) && !state.tables.contains_key(&d.name))
        })
        .cloned()
        .collect();
    if !new.is_empty() {
        // As at the start: what the capture cannot carry is refused (on PostgreSQL, a table
        // without a key under the default replica identity, which publishing would make its
        // updates and deletes fail on the source).
        job.capture.source.check(&new).await?;
        record(job, state, &datasets, &new, &keys, &unlogged).await?;
        sluice_core::failpoint::hit_as("replicate.after_take_in_recorded", ErrorKind::Destination)?;
    }
    let added = finish(job, state, &datasets, &keys, &unlogged, cancel).await?;
    Ok(TakenIn {
        datasets,
        keys,
        unlogged,
        added,
    })
}

/// Create `new` on the target (or check the tables it has of those names, which must hold no
/// rows), publish them and record them with their load pending.
async fn record(
    job: &ReplicateJob,
    state: &mut StreamState,
    all: &[Dataset],
    new: &[Dataset],
    keys: &[TableKeys],
    unlogged: &[(TableRef, ForeignKey)],
) -> Result<()> {
    let tables = target_tables(job, new, keys, unlogged);
    let on_target: Vec<TableRef> = tables.iter().map(|t| t.table.clone()).collect();
    for n in job.target.create_tables(&tables).await? {
        tracing::info!("not carried to the target: {n}");
    }
    let full = job.target.non_empty(&on_target).await?;
    if !full.is_empty() {
        let list: Vec<String> = full.iter().map(|t| t.to_string()).collect();
        return Err(Error::config(format!(
            "{} joined the selection of replication {} but already hold rows on {}: its load \
             copies the source's rows into an empty table. Empty them, or leave the new tables \
             out of the selection (--table for each table it carries, with --slot {}).",
            list.join(", "),
            state.names.name,
            job.target.display_url(),
            state.names.name
        )));
    }
    let created: Vec<TableRef> = new.iter().filter_map(|d| d.object.clone()).collect();
    if let Some(objects) = job.capture.source.server_objects() {
        objects
            .publish(&state.names, state.publication_created, &created)
            .await?;
    }
    job.target
        .save_columns(&state.names.name, &followed(job, new, keys))
        .await?;
    state.join(new, "");
    // The partitions the layout checks watch include the new tables' from now on.
    let carried: Vec<Dataset> = all
        .iter()
        .filter(|d| {
            d.object
                .as_ref()
                .is_some_and(|t| state.tables.values().any(|s| &s.table == t))
        })
        .cloned()
        .collect();
    state.layout = job.capture.source.layout(&carried).await?;
    // In the state before its load: a run killed from here on loads it again first.
    save_state(job, state).await
}

/// Load the tables taken in whose load is pending (at a restart: those a killed run left),
/// into emptied target tables, under one new hand-off; then create the foreign keys their
/// cascades need on the target.
pub(super) async fn finish(
    job: &ReplicateJob,
    state: &mut StreamState,
    datasets: &[Dataset],
    keys: &[TableKeys],
    unlogged: &[(TableRef, ForeignKey)],
    cancel: &watch::Receiver<bool>,
) -> Result<Vec<AddedTable>> {
    let (pending, gone): (Vec<String>, Vec<String>) = state
        .tables
        .iter()
        .filter(|(_, t)| t.added.as_ref().is_some_and(|a| !a.snapshot_done))
        .map(|(n, _)| n.clone())
        .partition(|n| {
            let t = &state.tables[n].table;
            datasets.iter().any(|d| d.object.as_ref() == Some(t))
        });
    if !gone.is_empty() {
        // Gone from the source (or the selection) before its load was done: given up, as a
        // stream gives up a joining table; it joins again if it is selected again.
        tracing::warn!(
            "{} joined replication {} but is gone or no longer selected before its load was \
             done: given up (its table on the target stays, empty or part-loaded)",
            gone.join(", "),
            state.names.name
        );
        for n in &gone {
            state.tables.remove(n);
        }
        save_state(job, state).await?;
    }
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    let tables: Vec<TableRef> = pending
        .iter()
        .map(|n| job.on_target(&state.tables[n].table))
        .collect();
    job.target.truncate(&tables).await?;
    let handoff = job.capture.source.handoff().await?;
    let report = load::load(job, state, keys, handoff, Some(&pending), cancel)
        .await
        .map_err(|e| {
            e.then(format!(
                "The load of {}, which joined replication {}, is unfinished: run the same \
                 sluice replicate command again to finish it before the replication goes on.",
                pending.join(", "),
                state.names.name
            ))
        })?;
    let pending_tables: Vec<TableRef> = pending
        .iter()
        .map(|n| state.tables[n].table.clone())
        .collect();
    add_foreign_keys(job, unlogged, |child| pending_tables.contains(child)).await?;
    let mut added = Vec::new();
    for name in &pending {
        let rows = report
            .datasets
            .iter()
            .find(|d| &d.name == name)
            .map(|d| d.rows)
            .unwrap_or(0);
        let position = state.tables[name].snapshot_position.clone();
        tracing::info!(
            "{name} joined replication {}: {rows} rows loaded; its changes from position {} \
             on are applied",
            state.names.name,
            position
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_else(|| "its start".into()),
        );
        added.push(AddedTable {
            table: name.clone(),
            rows,
            position,
        });
    }
    Ok(added)
}

/// Create on the target the foreign keys of `unlogged` whose child `which` picks (those that
/// exist by name are left), each said in the log; returns what was created.
pub(super) async fn add_foreign_keys(
    job: &ReplicateJob,
    unlogged: &[(TableRef, ForeignKey)],
    which: impl Fn(&TableRef) -> bool,
) -> Result<Vec<String>> {
    let on_target: Vec<(TableRef, ForeignKey)> = unlogged
        .iter()
        .filter(|(child, _)| which(child))
        .map(|(child, fk)| {
            let mut fk = fk.clone();
            fk.parent = job.on_target(&fk.parent);
            (job.on_target(child), fk)
        })
        .collect();
    let created = job.target.add_foreign_keys(&on_target).await?;
    for n in &created {
        tracing::info!("{n}");
    }
    Ok(created)
}

/// `datasets` as the target holds them: columns, keys (named on the target), and the foreign
/// keys it will not get with their actions.
pub(super) fn target_tables(
    job: &ReplicateJob,
    datasets: &[Dataset],
    keys: &[TableKeys],
    unlogged: &[(TableRef, ForeignKey)],
) -> Vec<TargetTable> {
    let source_engine = job.capture.source.engine();
    datasets
        .iter()
        .filter_map(|d| {
            let table = d.object.clone()?;
            let mut k = keys
                .iter()
                .find(|k| k.table == table)
                .cloned()
                .unwrap_or_else(|| TableKeys::primary_only(table.clone(), d.primary_key.clone()));
            k.table = job.on_target(&table);
            // Keys the target will create with their action are not "not carried".
            k.foreign
                .retain(|f| !unlogged.iter().any(|(c, u)| *c == table && u == f));
            Some(TargetTable {
                keys: k,
                table: job.on_target(&table),
                columns: d.columns.clone(),
                source_engine,
            })
        })
        .collect()
}

/// The columns each target table of `datasets` follows from its load on: the change stream's
/// (generated columns are not sent).
pub(super) fn followed(
    job: &ReplicateJob,
    datasets: &[Dataset],
    keys: &[TableKeys],
) -> Vec<(TableRef, Vec<SourceColumn>)> {
    datasets
        .iter()
        .filter_map(|d| {
            let t = d.object.as_ref()?;
            let k = keys.iter().find(|k| &k.table == t);
            let sent: Vec<_> = d
                .columns
                .iter()
                .filter(|c| k.is_none_or(|k| !k.is_generated(&c.name)))
                .cloned()
                .collect();
            Some((job.on_target(t), SourceColumn::of(&sent)))
        })
        .collect()
}
