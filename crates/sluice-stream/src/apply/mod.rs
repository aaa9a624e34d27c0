//! `sluice replicate`: the source's snapshot and change stream applied to a target database
//! in parallel, committed in source order.
//!
//! ```text
//! discover + keys ─▶ target: bookkeeping, missing tables created
//!   first start: capture created (snapshot exported) ─▶ state saved in the target
//!     ─▶ initial load (export engine ─▶ Arrow ─▶ bulk path, parallel) ─▶ per-table positions
//!   interrupted load: tables emptied ─▶ load again under a new exact snapshot
//!   ─▶ stream from the applied position: collect units ─▶ schedule ─▶ N workers ─▶ commit in
//!      order, position in the same transaction ─▶ source confirmed
//!   ─▶ stop at --until-current's position or on SIGINT/SIGTERM, after in-flight units commit
//! ```
//!
//! | module     | responsibility                                                     |
//! |------------|--------------------------------------------------------------------|
//! | `collect`  | the change sink: units, barriers, streamed large transactions      |
//! | `writeset` | the keys a row change touches, hashed                              |
//! | `plan`     | the order and batches a unit's rows are applied in                 |
//! | `schedule` | dependencies, no head-of-line blocking, commit order, conflict retries |
//! | `worker`   | the target sessions                                                |
//! | `pump`     | the stream from the applied position into the workers, restarts     |
//! | `load`     | the initial load through the export engine                         |
//!
//! State: the runner's state (the capture's names, tables, snapshot progress) is the stream's
//! [`StreamState`], kept in the target by [`ApplyTarget::save_state`]; the applied position
//! is not in it but in the target's position rows, written with the rows they cover.

mod collect;
mod load;
mod plan;
mod pump;
mod schedule;
#[cfg(test)]
mod tests;
mod worker;
mod writeset;

use crate::run::{ExportBuilder, Initial, Stopped, discover};
use crate::state::{Committed, STATE_VERSION, SnapshotState, StreamState, TableState};
pub use load::template_output;
use serde::Serialize;
use sluice_core::apply::{ApplyTarget, TargetTable};
use sluice_core::change::{CaptureNames, ChangeSource};
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Error, Result, Selection};
use sluice_engine::Report;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::watch;
pub use worker::ApplyCounters;

/// Source transactions in one unit at most, unless the job says otherwise (units grow only
/// while every worker is busy).
pub const MAX_GROUPED: u64 = 10_000;

/// A validated `sluice replicate` request.
pub struct ReplicateJob {
    /// The source.
    pub source: Arc<dyn ChangeSource>,
    /// The target database.
    pub target: Arc<dyn ApplyTarget>,
    /// What to replicate.
    pub selection: Selection,
    /// Initial load or not.
    pub initial: Initial,
    /// The replication's name: the replication slot on PostgreSQL and the key of the state
    /// and position rows on the target. `None`: derived from the source and the selection,
    /// so running the same command again continues the same replication.
    pub name: Option<String>,
    /// The schema (PostgreSQL) or database (MySQL) every table goes into on the target;
    /// `None`: the source's.
    pub target_schema: Option<String>,
    /// Publication (PostgreSQL); `None`: the name.
    pub publication: Option<String>,
    /// Target sessions applying in parallel (and loading the snapshot).
    pub parallel: usize,
    /// Stop once everything committed on the source before the start is applied.
    pub until_current: bool,
    /// Source transactions in one target transaction at most.
    pub max_grouped: u64,
    /// Memory target: units waiting or running hold at most a quarter of it.
    pub memory: u64,
    /// The initial load's export job (the CLI's export options).
    pub export: ExportBuilder,
    /// Progress of the initial load.
    pub progress: Arc<dyn sluice_engine::Progress>,
    /// Counters, readable while the run goes on.
    pub counters: Arc<ApplyCounters>,
}

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicateReport {
    /// Source, redacted.
    pub source: String,
    /// Target, redacted.
    pub target: String,
    /// The replication's name.
    pub name: String,
    /// The initial load's export report, when this run loaded.
    pub snapshot: Option<Report>,
    /// What the target did not get from the source's definitions (foreign keys, defaults…).
    pub not_carried: Vec<String>,
    /// Source transactions applied by this run.
    pub transactions: u64,
    /// Row changes applied by this run.
    pub changes: u64,
    /// Target transactions committed by this run.
    pub units: u64,
    /// Units rolled back and applied again because of a conflict the writesets did not
    /// predict.
    pub conflicts: u64,
    /// Units rolled back because an earlier one had to run alone.
    pub aborts: u64,
    /// Units that applied their rows free of earlier units first and the rest once those
    /// committed (a hot row held back only its own rows).
    pub split_units: u64,
    /// Parallel apply sessions.
    pub parallel: usize,
    /// The applied source position (restart form) at the end.
    pub position: String,
    /// The largest delay between a source commit and its application seen, seconds.
    pub peak_lag_seconds: f64,
    /// Source transactions received but not applied at the end (0 after `--until-current`).
    pub lag_transactions: u64,
    /// The most log the source kept for the replication while it ran (PostgreSQL: WAL
    /// retained by the slot; MySQL/MariaDB: binary log files still needed), bytes.
    pub peak_retained_bytes: u64,
    /// Why it stopped.
    pub stopped: Stopped,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
    /// Transactions applied per second while streaming.
    pub transactions_per_second: f64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: u64,
}

impl ReplicateJob {
    /// The name `table` has on the target.
    pub(crate) fn on_target(&self, table: &TableRef) -> TableRef {
        match &self.target_schema {
            Some(s) => TableRef {
                schema: s.clone(),
                name: table.name.clone(),
            },
            None => table.clone(),
        }
    }
}

fn default_name(source: &dyn ChangeSource, selection: &Selection) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.display_url().hash(&mut h);
    format!("{selection:?}").hash(&mut h);
    format!("sluice_r{:012x}", h.finish() & 0xffff_ffff_ffff)
}

pub(crate) async fn save_state(job: &ReplicateJob, state: &StreamState) -> Result<()> {
    let mut s = state.clone();
    s.updated_at = chrono::Utc::now().to_rfc3339();
    let bytes = serde_json::to_vec(&s)
        .map_err(|e| Error::internal(format!("the replication state cannot be written: {e}")))?;
    job.target.save_state(&state.names.slot, &bytes).await
}

/// Run the replication until `--until-current`'s point or `cancel`.
pub async fn run_replicate(
    job: ReplicateJob,
    cancel: watch::Receiver<bool>,
) -> Result<ReplicateReport> {
    let started = Instant::now();
    let datasets = discover(job.source.as_ref(), &job.selection).await?;
    if let Some(d) = datasets.iter().find(|d| d.object.is_none()) {
        return Err(Error::config(format!(
            "{} is not a table: sluice replicate applies the changes of tables. Leave it out \
             of the selection.",
            d.name
        )));
    }
    let keys = job.source.table_keys(&datasets).await?;
    job.target.prepare().await?;
    let name = job
        .name
        .clone()
        .unwrap_or_else(|| default_name(job.source.as_ref(), &job.selection));
    let names = CaptureNames {
        publication: job.publication.clone().unwrap_or_else(|| name.clone()),
        slot: name.clone(),
    };
    same_target_names(&job, &datasets)?;
    let wanted: Vec<TargetTable> = datasets
        .iter()
        .filter_map(|d| {
            let table = d.object.clone()?;
            let mut k = keys
                .iter()
                .find(|k| k.table == table)
                .cloned()
                .unwrap_or_else(|| {
                    sluice_core::apply::TableKeys::primary_only(
                        table.clone(),
                        d.primary_key.clone(),
                    )
                });
            k.table = job.on_target(&table);
            Some(TargetTable {
                keys: k,
                table: job.on_target(&table),
                columns: d.columns.clone(),
                source_engine: job.source.engine(),
            })
        })
        .collect();
    let saved = match job.target.load_state(&name).await? {
        Some(b) => Some(crate::state::parse(&b, &job.target.display_url())?),
        None => None,
    };
    // Tables are created (and existing ones checked) when the replication starts; on a restart
    // the target's tables follow the stream, which may be behind the source's catalog (a
    // column added on the source after the applied position arrives as a barrier).
    let not_carried = match saved {
        None => job.target.create_tables(&wanted).await?,
        Some(_) => Vec::new(),
    };
    for n in &not_carried {
        tracing::info!("not carried to the target: {n}");
    }
    let mut snapshot = None;
    let state = match saved {
        None => {
            let (s, r) = first_start(&job, &names, &datasets, &cancel).await?;
            snapshot = r;
            s
        }
        Some(mut s) => {
            if job.source.keeps_server_objects() && !job.source.exists(&names).await? {
                return Err(Error::source_permanent(format!(
                    "the replication {name} on {} names replication slot {}, which no longer \
                     exists on {}: the changes since the applied position are lost. Start \
                     over: remove the target's tables and sluice's state there (sluice \
                     replicate --drop), then run again.",
                    job.target.display_url(),
                    names.slot,
                    job.source.display_url()
                )));
            }
            if !s.snapshot.done {
                let tables: Vec<_> = s.tables.values().map(|t| job.on_target(&t.table)).collect();
                tracing::info!(
                    "the initial load was interrupted: emptying {} tables and loading again",
                    tables.len()
                );
                job.target.truncate(&tables).await?;
                let held = job.source.snapshot().await?;
                snapshot = Some(load::load(&job, &mut s, held, &cancel).await?);
            }
            s
        }
    };
    let streamed = Instant::now();
    let (stopped, position) = pump::stream(&job, &state, &datasets, keys, &cancel).await?;
    let c = &job.counters;
    let transactions = c.transactions.load(Ordering::Relaxed);
    let elapsed = streamed.elapsed().as_secs_f64().max(1e-3);
    Ok(ReplicateReport {
        source: job.source.display_url(),
        target: job.target.display_url(),
        name,
        snapshot,
        not_carried,
        transactions,
        changes: c.changes.load(Ordering::Relaxed),
        units: c.units.load(Ordering::Relaxed),
        conflicts: c.conflicts.load(Ordering::Relaxed),
        aborts: c.aborts.load(Ordering::Relaxed),
        split_units: c.split.load(Ordering::Relaxed),
        parallel: job.parallel,
        position,
        peak_lag_seconds: c.peak_lag_millis.load(Ordering::Relaxed) as f64 / 1000.0,
        lag_transactions: c
            .received
            .load(Ordering::Relaxed)
            .saturating_sub(transactions),
        peak_retained_bytes: c.peak_retained_bytes.load(Ordering::Relaxed),
        stopped,
        wall_seconds: started.elapsed().as_secs_f64(),
        transactions_per_second: transactions as f64 / elapsed,
        peak_rss_bytes: sluice_engine::rss::peak_rss_bytes(),
    })
}

/// Two source tables must not land on one target table (`--target-schema` with tables of
/// the same name in several source schemas).
fn same_target_names(job: &ReplicateJob, datasets: &[Dataset]) -> Result<()> {
    let mut seen: BTreeMap<TableRef, &TableRef> = BTreeMap::new();
    for t in datasets.iter().filter_map(|d| d.object.as_ref()) {
        if let Some(other) = seen.insert(job.on_target(t), t) {
            return Err(Error::config(format!(
                "{other} and {t} would both be {} on the target: narrow the selection to one \
                 schema per --target-schema, or replicate each schema in its own run.",
                job.on_target(t)
            )));
        }
    }
    Ok(())
}

async fn first_start(
    job: &ReplicateJob,
    names: &CaptureNames,
    datasets: &[Dataset],
    cancel: &watch::Receiver<bool>,
) -> Result<(StreamState, Option<Report>)> {
    let snapshot = job.initial == Initial::Snapshot;
    if snapshot {
        let tables: Vec<_> = datasets
            .iter()
            .filter_map(|d| d.object.as_ref().map(|t| job.on_target(t)))
            .collect();
        let full = job.target.non_empty(&tables).await?;
        if !full.is_empty() {
            let list: Vec<String> = full.iter().map(|t| t.to_string()).collect();
            return Err(Error::config(format!(
                "{} already hold rows on {}: the initial load copies the source's snapshot \
                 into empty tables. Empty them, or pass --initial none if they already hold \
                 the source's rows as of now.",
                list.join(", "),
                job.target.display_url()
            )));
        }
    }
    job.source.check(datasets).await?;
    if job.source.keeps_server_objects() && job.source.exists(names).await? {
        return Err(Error::config(format!(
            "replication slot {} already exists on {} but {} holds no replication state for \
             it. Pass another --slot, or remove the slot (sluice stream --drop --slot {}).",
            names.slot,
            job.source.display_url(),
            job.target.display_url(),
            names.slot
        )));
    }
    let created = job.source.create(names, datasets, snapshot).await?;
    let tables = datasets
        .iter()
        .filter_map(|d| {
            let t = d.object.clone()?;
            Some((
                d.name.clone(),
                TableState {
                    table: t,
                    snapshot_position: snapshot.then(|| created.position.clone()),
                    versions: Vec::new(),
                },
            ))
        })
        .collect::<BTreeMap<_, _>>();
    let mut state = StreamState {
        version: STATE_VERSION,
        engine: job.source.engine().to_string(),
        source: job.source.display_url(),
        names: names.clone(),
        publication_created: created.publication_created,
        extension: String::new(),
        tables,
        snapshot: SnapshotState {
            initial: if snapshot { "snapshot" } else { "none" }.into(),
            done: !snapshot,
            positions: Vec::new(),
        },
        committed: Committed {
            restart: created.position.clone(),
            restart_seq: 1,
            written_through: 0,
            batches: 0,
            changes: 0,
        },
        intent: None,
        updated_at: String::new(),
    };
    if let Err(e) = save_state(job, &state).await {
        if let Some(h) = created.snapshot {
            let _ = h.hold.release().await;
        }
        let _ = job.source.remove(names, created.publication_created).await;
        return Err(e);
    }
    let report = match created.snapshot {
        Some(held) => Some(load::load(job, &mut state, held, cancel).await?),
        None => None,
    };
    Ok((state, report))
}

/// `sluice replicate --drop`: remove the replication slot, the publication sluice created and
/// the replication's state and positions on the target (the target's tables stay).
pub async fn drop_replication(job: &ReplicateJob) -> Result<Vec<String>> {
    let name = job
        .name
        .clone()
        .unwrap_or_else(|| default_name(job.source.as_ref(), &job.selection));
    let saved = match job.target.load_state(&name).await? {
        Some(b) => Some(crate::state::parse(&b, &job.target.display_url())?),
        None => None,
    };
    let names = match &saved {
        Some(s) => s.names.clone(),
        None => CaptureNames {
            publication: job.publication.clone().unwrap_or_else(|| name.clone()),
            slot: name.clone(),
        },
    };
    let publication = saved.as_ref().is_some_and(|s| s.publication_created);
    let mut removed = Vec::new();
    if job.source.keeps_server_objects() {
        removed = job.source.remove(&names, publication).await?;
    }
    if saved.is_some() || job.target.applied(&name).await?.is_some() {
        job.target.clear_state(&name).await?;
        removed.push(format!(
            "the state of replication {name} on {}",
            job.target.display_url()
        ));
    }
    Ok(removed)
}
