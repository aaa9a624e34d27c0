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
//!   ─▶ a table created in the selection: everything before it applied ─▶ created on the
//!      target, loaded under its own snapshot ─▶ streaming goes on with it
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
//! | `added`    | tables created on the source later, taken in and loaded            |
//! | `throttle` | `--max-target-lag`: the apply held while the target's replicas lag  |
//!
//! State: the runner's state (the capture's names, tables, snapshot progress) is the stream's
//! [`StreamState`], kept in the target by [`ApplyTarget::save_state`]; the applied position
//! is not in it but in the target's position rows, written with the rows they cover.
//!
//! Length: about 540 lines: the job, the report and the run's phases in order (checks,
//! target tables, first start or restart, load, foreign keys for cascades, streaming); each
//! phase's work lives in its own module.

mod added;
mod collect;
mod load;
mod metrics;
mod name;
mod plan;
mod pump;
mod schedule;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_collect;
#[cfg(test)]
mod tests_plan;
mod throttle;
mod worker;
mod writeset;

use crate::job::{ExportBuilder, Initial, Stopped, discover};
use crate::state::StreamState;
pub use load::template_output;
use serde::Serialize;
use sluice_core::apply::{ApplyTarget, TableKeys};
use sluice_core::change::CaptureNames;
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Error, Result, StreamPos};
use sluice_engine::Report;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
pub use throttle::TargetLag;
use tokio::sync::watch;
pub use worker::ApplyCounters;

/// Source transactions in one unit at most, unless the job says otherwise (units grow only
/// while every worker is busy).
pub const MAX_GROUPED: u64 = 10_000;

/// A validated `sluice replicate` request.
pub struct ReplicateJob {
    /// The source, the selection and when the run stops.
    pub capture: crate::job::Capture,
    /// The target database.
    pub target: Arc<dyn ApplyTarget>,
    /// Initial load or not.
    pub initial: Initial,
    /// The replication's name: the replication slot on PostgreSQL and the key of the state
    /// and position rows on the target. `None`: derived from the source, the target, the
    /// target schema and the selection (see `name.rs`), so running the same command again
    /// continues the same replication and two targets are two replications.
    pub name: Option<String>,
    /// The schema (PostgreSQL) or database (MySQL) every table goes into on the target;
    /// `None`: the source's when both are of one engine, else the target's default
    /// ([`ApplyTarget::default_schema`]: the database a MySQL/MariaDB target URL names).
    pub target_schema: Option<String>,
    /// Publication (PostgreSQL); `None`: the name.
    pub publication: Option<String>,
    /// Target sessions applying in parallel (and loading the snapshot).
    pub parallel: usize,
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
    /// Serve Prometheus metrics of [`Self::counters`] here (`--metrics-addr`).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Wait while another run holds the replication and take over when its target session
    /// ends (`--standby`), instead of refusing.
    pub standby: bool,
    /// Hold the apply while a replica of the target lags more (`--max-target-lag`).
    pub target_lag: Option<TargetLag>,
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
    /// The schema (PostgreSQL) or database (MySQL/MariaDB) the tables are in on the target;
    /// `None`: each table's source schema.
    pub target_schema: Option<String>,
    /// The initial load's export report, when this run loaded.
    pub snapshot: Option<Report>,
    /// What the target did not get from the source's definitions (foreign keys, defaults…).
    pub not_carried: Vec<String>,
    /// Foreign keys this run created on the target so it applies cascades the source's log
    /// leaves out (MySQL/MariaDB `ON DELETE CASCADE`, `SET NULL`).
    pub foreign_keys: Vec<String>,
    /// Tables created on the source that the selection matches, taken in by this run: each
    /// loaded under a snapshot of its own, its changes applied from that snapshot's position.
    pub added: Vec<crate::added::AddedTable>,
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
    /// Updates and deletes that matched no row on the target: rows the source changed that
    /// the target does not hold (the target diverged; 0 on a faithful copy).
    pub unmatched: u64,
    /// Units that applied their rows free of earlier units first and the rest once those
    /// committed (a hot row held back only its own rows).
    pub split_units: u64,
    /// Parallel apply sessions.
    pub parallel: usize,
    /// The applied source position (restart form) at the end.
    pub position: StreamPos,
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
    /// What the source keeps for the replication until it runs again, in the engine's words.
    pub while_stopped: String,
    /// Changed values applied as NULL because their type could not hold them
    /// (`--bad-values null`).
    pub nulled_values: u64,
    /// Changes of tables the run does not capture (a captured table renamed on the source),
    /// left out.
    pub ignored_changes: u64,
    /// Tables the replication carries that the selection no longer finds on the source
    /// (dropped or renamed there, or left out of the selection): their rows stay on the
    /// target as they were.
    pub gone: Vec<String>,
    /// What `--max-target-lag` did: the replicas' lag signals read, every hold of the apply
    /// with its reason, and the seconds held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_lag: Option<sluice_engine::governor::BrakeRecord>,
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

/// `job` with its target schema resolved: the target's default schema when the engines
/// differ and none was given (a PostgreSQL source's `public` is no MySQL database).
fn resolved(mut job: ReplicateJob) -> ReplicateJob {
    if job.target_schema.is_none() && job.capture.source.engine() != job.target.engine() {
        job.target_schema = job.target.default_schema();
    }
    job
}

pub(crate) async fn save_state(job: &ReplicateJob, state: &StreamState) -> Result<()> {
    let mut s = state.clone();
    s.updated_at = chrono::Utc::now().to_rfc3339();
    let bytes = serde_json::to_vec(&s)
        .map_err(|e| Error::internal(format!("the replication state cannot be written: {e}")))?;
    job.target.save_state(&state.names.name, &bytes).await
}

/// The selected tables, their keys, and the foreign keys whose cascades the source's log
/// leaves out (the target applies them).
type Inspected = (
    Vec<Dataset>,
    Vec<sluice_core::apply::TableKeys>,
    Vec<(TableRef, sluice_core::apply::ForeignKey)>,
);

/// What [`Inspected`] holds, refusing what cannot be replicated.
async fn inspect(job: &ReplicateJob) -> Result<Inspected> {
    let datasets = discover(job.capture.source.as_ref(), &job.capture.selection).await?;
    if let Some(d) = datasets.iter().find(|d| d.object.is_none()) {
        return Err(Error::config(format!(
            "{} is not a table: sluice replicate applies the changes of tables. Leave it out \
             of the selection.",
            d.name
        )));
    }
    let keys = job.capture.source.table_keys(&datasets).await?;
    job.capture.source.check_whole_rows().await?;
    let unlogged = crate::cascades::unlogged(job.capture.source.as_ref(), &keys);
    let captured: Vec<TableRef> = datasets.iter().filter_map(|d| d.object.clone()).collect();
    crate::cascades::check_replicate(job.capture.source.as_ref(), &unlogged, &captured)?;
    Ok((datasets, keys, unlogged))
}

/// Run the replication until `--until-current`'s point or `cancel`.
pub async fn run_replicate(
    job: ReplicateJob,
    cancel: watch::Receiver<bool>,
) -> Result<ReplicateReport> {
    let started = Instant::now();
    let job = resolved(job);
    if let Some(addr) = job.metrics_addr {
        let counters = job.counters.clone() as Arc<dyn crate::metrics::Render>;
        let bound = crate::metrics::serve(addr, counters).await?;
        tracing::info!("metrics at http://{bound}/metrics");
    }
    let (mut datasets, mut keys, mut unlogged) = inspect(&job).await?;
    // Read from the start: a target whose replicas cannot be read is refused before any load.
    let brake = match &job.target_lag {
        Some(lag) => Some(throttle::start(lag).await?),
        None => None,
    };
    job.target.prepare().await?;
    let name = name::resolve(&job).await?;
    // Held to the end of the run (released when the run ends however it ends: the lock
    // lives in a target session of its own).
    let (lock, waited) = crate::standby::replication_lock(&job, &name, &cancel).await?;
    if waited {
        // A standby that took over: the source as it is now, not as it was when it started.
        (datasets, keys, unlogged) = inspect(&job).await?;
    }
    match &job.target_schema {
        Some(s) => tracing::info!(
            "replication {name}: tables go into {s} on {}",
            job.target.display_url()
        ),
        None => tracing::info!(
            "replication {name}: tables keep their source schema on {}",
            job.target.display_url()
        ),
    }
    let names = CaptureNames {
        publication: job.publication.clone().unwrap_or_else(|| name.clone()),
        name: name.clone(),
    };
    same_target_names(&job, &datasets)?;
    let wanted = added::target_tables(&job, &datasets, &keys, &unlogged);
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
    let mut added = Vec::new();
    let state = match saved {
        None => {
            let (s, r) = first_start(&job, &names, &datasets, &keys, &cancel).await?;
            snapshot = r;
            s
        }
        Some(mut s) => {
            if let Some(objects) = job.capture.source.server_objects()
                && !objects.exists(&names).await?
            {
                return Err(Error::source_permanent(format!(
                    "the replication {name} on {} names {}, which no longer exists on {}: the \
                     changes since the applied position are lost. Start over: remove the \
                     target's tables and sluice's state there (sluice replicate --drop), then \
                     run again.",
                    job.target.display_url(),
                    objects.describe(&names),
                    job.capture.source.display_url()
                )));
            }
            if !s.snapshot.done {
                let tables: Vec<_> = s.tables.values().map(|t| job.on_target(&t.table)).collect();
                tracing::info!(
                    "the initial load was interrupted: emptying {} tables and loading again",
                    tables.len()
                );
                job.target.truncate(&tables).await?;
                let handoff = job.capture.source.handoff().await?;
                snapshot = Some(load::load(&job, &mut s, &keys, handoff, None, &cancel).await?);
            }
            // Tables that joined a run killed before their load was done.
            added = added::finish(&job, &mut s, &datasets, &keys, &unlogged, &cancel).await?;
            s
        }
    };
    // At every start, not only the first: a key exists by its name and is left, and one a
    // killed run did not get to (after a joining table's load) is created now.
    let foreign_keys = added::add_foreign_keys(&job, &unlogged, |_| true).await?;
    let mut state = state;
    let gone = gone(&job, &state, &datasets);
    if crate::layout::check(
        job.capture.source.as_ref(),
        &datasets,
        &mut state,
        job.capture.partition_changes,
        "sluice replicate",
    )
    .await?
    {
        save_state(&job, &state).await?;
    }
    let streamed = Instant::now();
    let (stopped, position, joined) = pump::stream(
        &job,
        &state,
        &datasets,
        (keys, unlogged),
        brake.as_ref(),
        &cancel,
    )
    .await?;
    added.extend(joined);
    let target_lag = match brake {
        Some(b) => Some(b.finish().await),
        None => None,
    };
    lock.release().await?;
    let c = &job.counters;
    let transactions = c.transactions.load(Ordering::Relaxed);
    let elapsed = streamed.elapsed().as_secs_f64().max(1e-3);
    Ok(ReplicateReport {
        source: job.capture.source.display_url(),
        target: job.target.display_url(),
        while_stopped: job.capture.source.while_stopped(&names, "sluice replicate"),
        nulled_values: job.capture.source.nulled_values(),
        ignored_changes: c.ignored.load(Ordering::Relaxed),
        gone,
        target_lag,
        name,
        target_schema: job.target_schema.clone(),
        snapshot,
        not_carried,
        foreign_keys,
        added,
        transactions,
        changes: c.changes.load(Ordering::Relaxed),
        units: c.units.load(Ordering::Relaxed),
        conflicts: c.conflicts.load(Ordering::Relaxed),
        aborts: c.aborts.load(Ordering::Relaxed),
        unmatched: c.unmatched.load(Ordering::Relaxed),
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

/// The tables `state` carries that the selection no longer finds on the source (`datasets`),
/// each said in a warning: a replication whose pattern no longer matches a dropped table
/// would otherwise go on without a word while the target keeps the table's last rows.
fn gone(job: &ReplicateJob, state: &StreamState, datasets: &[Dataset]) -> Vec<String> {
    let mut gone: Vec<String> = state
        .tables
        .values()
        .filter(|t| !datasets.iter().any(|d| d.object.as_ref() == Some(&t.table)))
        .map(|t| t.table.to_string())
        .collect();
    gone.sort();
    for t in &gone {
        tracing::warn!(
            "{t} is replicated by {} but the selection no longer finds it on {} (dropped or \
             renamed there, or left out of the selection): its rows stay on the target as they \
             were, and nothing of it is applied any more",
            state.names.name,
            job.capture.source.display_url()
        );
    }
    gone
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
    keys: &[TableKeys],
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
    let occupied = |what| {
        Error::config(format!(
            "{what} already exists on {} but {} holds no state of replication {}: it belongs \
             to another replication (another target, or this target with another \
             --target-schema), or to a stream. To start a replication of your own beside it, \
             pass --slot with a new name. Only if nothing reads it any more (a replication \
             removed without --drop), remove it with sluice replicate --drop and the \
             arguments that created it — dropping what a replication still uses ends that \
             replication for good.",
            job.capture.source.display_url(),
            job.target.display_url(),
            names.name,
        ))
    };
    let (created, mut state) =
        crate::start::create(&job.capture, names, datasets, snapshot, "", occupied).await?;
    // The columns the target tables follow from here: the change stream's.
    let followed = added::followed(job, datasets, keys);
    let saved = match save_state(job, &state).await {
        Ok(()) => job.target.save_columns(&names.name, &followed).await,
        Err(e) => Err(e),
    };
    if let Err(e) = saved {
        crate::start::abandon(job.capture.source.as_ref(), names, created).await;
        return Err(e);
    }
    let report = match created.handoff {
        Some(h) => Some(load::load(job, &mut state, keys, h, None, cancel).await?),
        None => None,
    };
    Ok((state, report))
}

/// `sluice replicate --drop`: remove the replication slot, the publication sluice created and
/// the replication's state and positions on the target (the target's tables stay).
pub async fn drop_replication(job: ReplicateJob) -> Result<Vec<String>> {
    let job = resolved(job);
    let name = name::resolve(&job).await?;
    // A running replication keeps its lock: it is refused rather than pulled from under it.
    let lock = job.target.lock(&name).await?;
    let saved = match job.target.load_state(&name).await? {
        Some(b) => Some(crate::state::parse(&b, &job.target.display_url())?),
        None => None,
    };
    let names = match &saved {
        Some(s) => s.names.clone(),
        None => CaptureNames {
            publication: job.publication.clone().unwrap_or_else(|| name.clone()),
            name: name.clone(),
        },
    };
    let publication = saved.as_ref().is_some_and(|s| s.publication_created);
    let mut removed = match job.capture.source.server_objects() {
        Some(objects) => objects.remove(&names, publication).await?,
        None => Vec::new(),
    };
    if saved.is_some() || job.target.applied(&name).await?.is_some() {
        job.target.clear_state(&name).await?;
        removed.push(format!(
            "the state of replication {name} on {}",
            job.target.display_url()
        ));
    }
    lock.release().await?;
    Ok(removed)
}
