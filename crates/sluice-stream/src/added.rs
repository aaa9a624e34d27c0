//! Tables that join or leave a running stream (`--discover-every`).
//!
//! Every `--discover-every` seconds the run looks the selection up again (`changed`, from the
//! read loop in `drive.rs`). When a table matching it was created, or a captured one dropped
//! (or, on PostgreSQL, left the publication), the run notes the source's current position,
//! writes and commits every change up to it, stops reading, and takes the tables in here:
//!
//! - **dropped**: everything the table logged is now in its change files, so a final marker,
//!   `<table>/_dropped.json`, says so, and the state keeps the table as dropped;
//! - **created**: recorded in the state (its snapshot not done), published (PostgreSQL: added
//!   to the publication, see `publication.rs` in `sluice-postgres`), then read under a new
//!   snapshot hand-off exactly as an interrupted initial snapshot is finished (`snapshot.rs`
//!   says why that is exact): its parts go to its directory, its manifest beside the initial
//!   one (`_sluice/added/<id>/manifest.json`, `added/beside.rs`), and the snapshot's position
//!   becomes its `snapshot_position`. Reading resumes at the committed position, which is
//!   before that snapshot: the table's changes before it are in the snapshot and left out,
//!   the later ones written.
//!
//! A run killed while a table's snapshot is read finds it unfinished in the state and reads it
//! again (its finished tables kept) before it streams. A table dropped and created again under
//! a captured name cannot continue the old table's directory and stops the run with the fix.

mod beside;

use crate::job::{StreamJob, blocking, check_tables, discover, note_missing, whole};
use crate::metrics::Metrics;
use crate::snapshot::{clear_unfinished, table_positions};
use crate::state::{Added, Dropped, StreamState, TableState};
use beside::Beside;
use serde::Serialize;
use sluice_core::change::{CaptureNames, ChangeSource};
use sluice_core::ident::{NamePart, QualifiedName};
use sluice_core::table::{ColumnPick, TableRef};
use sluice_core::{Dataset, Error, Result, Selection, StreamPos};
use sluice_engine::manifest::Manifest;
use sluice_sink::layout::{MANIFEST, dataset_dir};
use sluice_sink::{Destination, OutputLock};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::watch;

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

/// What the run did when the selection's tables changed.
pub(crate) struct TakenIn {
    /// The captured tables now, as the change stream decodes them.
    pub datasets: Vec<Dataset>,
    pub added: Vec<AddedTable>,
    /// Dropped tables, with whether their changes are complete.
    pub dropped: Vec<(String, bool)>,
}

/// The selection's tables now, compared with the state's.
struct Seen {
    found: Vec<Dataset>,
    created: Vec<String>,
    gone: Vec<String>,
}

impl Seen {
    async fn now(
        source: &dyn ChangeSource,
        names: &CaptureNames,
        selection: &Selection,
        state: &StreamState,
    ) -> Result<Seen> {
        let mut found = discover(source, selection).await?;
        found.retain(|d| d.object.is_some());
        let published = match source.server_objects() {
            Some(o) => Some(o.published(names).await?),
            None => None,
        };
        let created = found
            .iter()
            .filter(|d| {
                state
                    .tables
                    .get(&d.name)
                    .is_none_or(|t| t.dropped.is_some())
            })
            .map(|d| d.name.clone())
            .collect();
        let gone = state
            .tables
            .iter()
            .filter(|(_, t)| t.dropped.is_none())
            .filter(|(n, t)| {
                !found.iter().any(|d| &d.name == *n)
                    || published.as_ref().is_some_and(|p| !p.contains(&t.table))
            })
            .map(|(n, _)| n.clone())
            .collect();
        Ok(Seen {
            found,
            created,
            gone,
        })
    }

    fn describe(&self) -> Option<String> {
        let mut what = Vec::new();
        if !self.created.is_empty() {
            what.push(format!("created: {}", self.created.join(", ")));
        }
        if !self.gone.is_empty() {
            what.push(format!("dropped: {}", self.gone.join(", ")));
        }
        (!what.is_empty()).then(|| format!("tables of the selection {}", what.join("; ")))
    }
}

/// What changed among the selection's tables since `state` took them in, in words; `None`
/// when nothing did.
pub(crate) async fn changed(
    source: &dyn ChangeSource,
    names: &CaptureNames,
    selection: &Selection,
    state: &StreamState,
) -> Result<Option<String>> {
    Ok(Seen::now(source, names, selection, state).await?.describe())
}

async fn save(job: &StreamJob, state: &StreamState) -> Result<()> {
    let store = job.state.clone();
    let s = state.clone();
    blocking(move || store.save(&s)).await
}

/// Take in what changed among the selection's tables, the run having written every change
/// up to the position where the change was seen (`datasets`: the tables it read).
pub(crate) async fn take_in(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    state: &mut StreamState,
    datasets: &[Dataset],
    metrics: &Metrics,
    cancel: &watch::Receiver<bool>,
) -> Result<TakenIn> {
    // A layout change since the last check first, so the layout taken below hides none.
    crate::layout::check(
        job.source.as_ref(),
        datasets,
        state,
        job.partition_changes,
        "sluice stream",
    )
    .await?;
    let seen = Seen::now(job.source.as_ref(), &state.names, &job.selection, state).await?;
    for name in &seen.gone {
        let complete = job.source.describes_rows() || datasets.iter().any(|d| &d.name == name);
        end_table(job, state, name, complete).await?;
        metrics.tables_dropped.fetch_add(1, Ordering::Relaxed);
    }
    if !seen.gone.is_empty() {
        save(job, state).await?;
    }
    let created: Vec<Dataset> = seen
        .found
        .iter()
        .filter(|d| seen.created.contains(&d.name))
        .cloned()
        .collect();
    if let Some(d) = created.iter().find(|d| state.tables.contains_key(&d.name)) {
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
    let added = add(job, lock, state, &created, metrics, cancel).await?;
    let live: Vec<Dataset> = seen
        .found
        .into_iter()
        .filter(|d| {
            state
                .tables
                .get(&d.name)
                .is_some_and(|t| t.dropped.is_none())
        })
        .collect();
    state.layout = job.source.layout(&live).await?;
    save(job, state).await?;
    Ok(TakenIn {
        datasets: whole(job, live).await?,
        dropped: seen
            .gone
            .iter()
            .map(|n| {
                let complete = state.tables[n].dropped.as_ref().is_some_and(|d| d.complete);
                (n.clone(), complete)
            })
            .collect(),
        added,
    })
}

/// Write the final marker of dropped table `name` and keep it in the state as dropped.
/// `complete`: its changes were decoded up to the drop (see [`Dropped::complete`]).
async fn end_table(
    job: &StreamJob,
    state: &mut StreamState,
    name: &str,
    complete: bool,
) -> Result<()> {
    let dropped = Dropped {
        before: state.committed.restart.clone(),
        found_at: chrono::Utc::now().to_rfc3339(),
        last_seq: state.committed.written_through,
        complete,
    };
    let Some(t) = state.tables.get_mut(name) else {
        return Ok(());
    };
    let why = if complete {
        "the table no longer exists on the source (or is no longer published): every change \
         it logged is in this directory's change files, and none will follow"
    } else {
        "the table was dropped while no stream ran, and this source decodes a table's \
         changes with its columns from the catalog: its changes between the stream's last \
         committed position before the drop and the drop are NOT in the change files"
    };
    let marker = serde_json::json!({
        "table": t.table.to_string(),
        "dropped": true,
        "complete": complete,
        "changes_before": dropped.before,
        "last_seq": dropped.last_seq,
        "found_at": dropped.found_at,
        "why": why,
    });
    let path = format!("{}/_dropped.json", dataset_dir(name));
    let bytes = serde_json::to_vec_pretty(&marker)
        .map_err(|e| Error::internal(format!("the drop marker cannot be written: {e}")))?;
    job.destination.put(&path, bytes).await?;
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
    Ok(())
}

/// Capture `created` from now on and read their snapshots.
async fn add(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    state: &mut StreamState,
    created: &[Dataset],
    metrics: &Metrics,
    cancel: &watch::Receiver<bool>,
) -> Result<Vec<AddedTable>> {
    if created.is_empty() {
        return Ok(Vec::new());
    }
    job.source.check(created).await?;
    let unlogged = check_tables(job, created).await?;
    let now = chrono::Utc::now();
    let snapshot = format!("_sluice/added/{}/", now.format("%Y%m%dT%H%M%S%6fZ"));
    for d in created {
        let Some(table) = d.object.clone() else {
            continue;
        };
        state.tables.insert(
            d.name.clone(),
            TableState {
                table,
                snapshot_position: None,
                versions: Vec::new(),
                missing: Vec::new(),
                columns: d
                    .columns_picked
                    .then(|| d.columns.iter().map(|c| c.name.clone()).collect()),
                added: Some(Added {
                    found_at: now.to_rfc3339(),
                    snapshot: snapshot.clone(),
                    snapshot_done: false,
                }),
                dropped: None,
            },
        );
    }
    note_missing(job, &unlogged, state);
    // In the state before the source captures them: a run killed from here on reads their
    // snapshot again before it streams.
    save(job, state).await?;
    finish(job, lock, state, metrics, cancel).await
}

/// Publish the tables that joined the stream and read every snapshot of them not done yet
/// (at a restart: the ones a killed run left unfinished).
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
    let mut added = Vec::new();
    for (prefix, names) in pending {
        if let Some(objects) = job.source.server_objects() {
            let tables: Vec<TableRef> = names
                .iter()
                .map(|n| state.tables[n].table.clone())
                .collect();
            objects
                .publish(&state.names, state.publication_created, &tables)
                .await?;
        }
        added.extend(snapshot(job, lock, state, &prefix, &names, cancel).await?);
        metrics
            .tables_added
            .fetch_add(names.len() as u64, Ordering::Relaxed);
    }
    Ok(added)
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
    let handoff = job.source.handoff().await?;
    let (held, hold) = state.take_handoff(handoff);
    save(job, state).await?;
    let mut export = (job.export)(job.source.export_source(held.as_ref()));
    export.destination = dest.clone();
    export.resume = true;
    export.held_lock = Some(lock.clone());
    export.selection = exactly(state, names);
    let result = sluice_engine::run_export(export, job.progress.clone(), cancel.clone()).await;
    if let Some(hold) = hold {
        let _ = hold.release().await;
    }
    result.map_err(|e| {
        e.then(format!(
            "The snapshot of {}, which joined the stream, is unfinished: run the same sluice \
             stream command again to finish it before the stream goes on. {}",
            names.join(", "),
            job.source.while_stopped(&state.names, "sluice stream")
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
    table_positions(job.source.as_ref(), state, &manifest)?;
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
            "{name} joined the stream: {rows} rows in its snapshot ({}manifest.json); its \
             changes from position {} on go to {}/changes/",
            prefix,
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

/// A selection of exactly the tables `names` of the state, with the columns `--columns` kept
/// of them.
fn exactly(state: &StreamState, names: &[String]) -> Selection {
    let exact = |text: &str| NamePart {
        text: text.to_string(),
        quoted: true,
    };
    let mut selection = Selection::default();
    for n in names {
        let Some(t) = state.tables.get(n) else {
            continue;
        };
        let table = QualifiedName {
            schema: Some(exact(&t.table.schema)),
            name: exact(&t.table.name),
        };
        if let Some(cols) = &t.columns {
            selection.columns.push(ColumnPick {
                table: table.clone(),
                columns: cols.iter().map(|c| exact(c)).collect(),
            });
        }
        selection.tables.push(table);
    }
    selection
}
