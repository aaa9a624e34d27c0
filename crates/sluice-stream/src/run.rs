//! One `sluice stream` run, in order.
//!
//! ```text
//! discover ─▶ first start: check ─▶ publication + slot (snapshot exported) ─▶ state saved
//!              ─▶ export under the slot's snapshot ─▶ per-table snapshot positions saved
//!           interrupted snapshot: unfinished tables cleared ─▶ export resumed under a new
//!              exact snapshot (temporary slot) ─▶ per-table positions from the manifest
//!   ─▶ stream from the committed position: batches ─▶ files ─▶ state ─▶ confirm
//!   ─▶ stop at --until-current's position or on SIGINT/SIGTERM, after committing the batch
//! ```
//!
//! The initial snapshot is in `snapshot.rs` (with why the hand-off is exact), streaming in
//! `pump.rs`.

use crate::claim::{Keeper, unless_lost};
use crate::metrics::{Metrics, serve};
use crate::pump::stream;
use crate::snapshot::{resume_snapshot, snapshot_phase};
use crate::state::{Committed, SnapshotState, StateStore, StreamState, TableState};
use serde::Serialize;
use sluice_core::change::{CaptureNames, ChangeSource};
use sluice_core::table::TableRef;
use sluice_core::{
    Consistency, Dataset, Error, Result, Selection, Source, SourceOptions, failpoint,
};
use sluice_engine::{ExportJob, Report};
use sluice_sink::{Destination, FormatOptions, OutputLock};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// What the stream starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initial {
    /// Export every table under the slot's snapshot first (the default).
    Snapshot,
    /// Only changes from the slot's creation on.
    None,
}

/// Builds the export job of the initial snapshot from the source to read (the CLI's export
/// options: workers, memory, chunking).
pub type ExportBuilder = Arc<dyn Fn(Arc<dyn Source>) -> ExportJob + Send + Sync>;

/// The [`ExportBuilder`] that gives `template` (the CLI's export options, checked once) the
/// source each snapshot is read from: the source's snapshot is only known when the run takes it.
pub fn export_builder(template: ExportJob) -> ExportBuilder {
    Arc::new(move |src| {
        let mut j = template.clone();
        j.source = src;
        j
    })
}

/// A validated `sluice stream` request.
pub struct StreamJob {
    /// The source.
    pub source: Arc<dyn ChangeSource>,
    /// Where files go.
    pub destination: Arc<dyn Destination>,
    /// Where the state is kept.
    pub state: Arc<dyn StateStore>,
    /// What to capture.
    pub selection: Selection,
    /// Change file format.
    pub format: FormatOptions,
    /// Initial snapshot or not.
    pub initial: Initial,
    /// Slot and publication names; `None` picks `sluice_<random>` on the first start.
    pub slot: Option<String>,
    /// Publication name; `None`: the slot's name.
    pub publication: Option<String>,
    /// Cut a batch at this many bytes of change data.
    pub batch_bytes: u64,
    /// Cut a batch this long after its first change.
    pub batch_seconds: f64,
    /// Stop once everything committed before the start is written.
    pub until_current: bool,
    /// Memory target of the process.
    pub memory: u64,
    /// Serve Prometheus metrics here.
    pub metrics_addr: Option<SocketAddr>,
    /// The initial snapshot's export job.
    pub export: ExportBuilder,
    /// Progress of the initial snapshot's export.
    pub progress: Arc<dyn sluice_engine::Progress>,
    /// The stream's counters (also served by `--metrics-addr`, and read by a progress display).
    pub metrics: Arc<Metrics>,
    /// Stream child tables of foreign keys whose actions' changes the source's log leaves
    /// out (`--accept-missing-cascades`; see `cascades.rs`).
    pub accept_missing_cascades: bool,
    /// What a partition truncated, detached or dropped on the source does to the run
    /// (`--partition-changes`; see `layout.rs`).
    pub partition_changes: crate::layout::LayoutChanges,
}

/// Why the stream stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopped {
    /// `--until-current`: everything committed before the start is written.
    UntilCurrent,
    /// SIGINT or SIGTERM.
    Signal,
}

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    /// Source, redacted.
    pub source: String,
    /// Output.
    pub destination: String,
    /// Where the state is.
    pub state: String,
    /// Slot and publication.
    pub slot: String,
    /// Publication.
    pub publication: String,
    /// The initial snapshot's export report, when this run wrote (part of) it.
    pub snapshot: Option<Report>,
    /// Changes written by this run.
    pub changes: u64,
    /// Transactions seen by this run.
    pub transactions: u64,
    /// Batches committed by this run.
    pub batches: u64,
    /// Change files committed by this run.
    pub files: u64,
    /// Bytes of change files committed by this run.
    pub bytes_written: u64,
    /// The committed restart position.
    pub position: String,
    /// The last `_seq` written (over the whole stream).
    pub last_seq: u64,
    /// Peak WAL (or log) retained for the stream while it ran, bytes.
    pub peak_retained_bytes: u64,
    /// The largest delay seen between a transaction's commit and its reading, seconds.
    pub peak_lag_seconds: f64,
    /// Seconds since the source was last told a position is durable, at the end.
    pub seconds_since_confirm: f64,
    /// Why it stopped.
    pub stopped: Stopped,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: u64,
    /// The source engine (`postgres`, `mysql`).
    pub engine: String,
    /// What the source keeps for the stream until it runs again, in the engine's words.
    pub while_stopped: String,
    /// Changed values written as NULL because their type could not hold them
    /// (`--bad-values null`).
    pub nulled_values: u64,
    /// Changes of tables this run does not capture (a captured table renamed on the source),
    /// left out.
    pub ignored_changes: u64,
}

/// The warning for changes of a table the run does not capture: a captured table renamed on
/// the source (its changes now arrive under the new name), whose changes are left out.
pub(crate) fn uncaptured(table: &TableRef) -> String {
    format!(
        "the source sends changes of {table}, which this run does not capture: a captured \
         table renamed on the source (its changes arrive under its new name). They are left \
         out and counted (ignored changes in the report and metrics); to follow the table \
         under its new name, select it and take a new snapshot of it"
    )
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("a blocking task failed: {e}")))?
}

pub(crate) async fn discover(
    source: &dyn ChangeSource,
    selection: &Selection,
) -> Result<Vec<Dataset>> {
    let options = SourceOptions {
        session_tag: "stream".into(),
        consistency: Consistency::Chunk,
        enable_row_security: false,
    };
    let mut c = source
        .export_source(None)
        .open_coordinator(&options)
        .await?;
    let found = c.discover(selection).await;
    let _ = c.release().await;
    found
}

fn names_of(job: &StreamJob, saved: Option<&StreamState>) -> Result<CaptureNames> {
    if let Some(s) = saved {
        for (flag, given, have) in [
            ("--slot", &job.slot, &s.names.slot),
            ("--publication", &job.publication, &s.names.publication),
        ] {
            if let Some(g) = given
                && g != have
            {
                return Err(Error::config(format!(
                    "{flag} {g} differs from the {have} this stream was started with (state in \
                     {}). Drop the flag to continue the stream, or stream into another output.",
                    job.state.describe()
                )));
            }
        }
        return Ok(s.names.clone());
    }
    let slot = job
        .slot
        .clone()
        .unwrap_or_else(|| format!("sluice_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff));
    let publication = job.publication.clone().unwrap_or_else(|| slot.clone());
    Ok(CaptureNames { slot, publication })
}

/// Run the stream until `--until-current`'s point or `cancel`.
pub async fn run_stream(job: StreamJob, cancel: watch::Receiver<bool>) -> Result<StreamReport> {
    let started = Instant::now();
    let metrics = job.metrics.clone();
    if let Some(addr) = job.metrics_addr {
        let bound = serve(addr, metrics.clone()).await?;
        tracing::info!("metrics at http://{bound}/metrics");
    }
    job.destination.check_writable().await?;
    let holder = sluice_sink::LockHolder::now(&format!("stream-{}", std::process::id()));
    {
        let store = job.state.clone();
        let who = holder.describe();
        blocking(move || store.acquire(&who)).await?;
    }
    // The output's lock before anything of it is inspected or removed (an interrupted
    // snapshot's unfinished parts), kept across the snapshot (the export uses it) and the
    // streaming: a second run on this output is refused before it can touch the first's files.
    let lock = match job.destination.lock(&holder).await {
        Ok(l) => l,
        Err(e) => {
            release(&job).await;
            return Err(e);
        }
    };
    let (keeper, cancel) = Keeper::start(job.state.clone(), cancel);
    let result = claimed(&job, &lock, metrics, cancel, started).await;
    let result = unless_lost(result, keeper.stop().await);
    lock.release().await;
    release(&job).await;
    result
}

/// Give the state store's claim up.
async fn release(job: &StreamJob) {
    let store = job.state.clone();
    let _ = blocking(move || {
        store.release();
        Ok(())
    })
    .await;
}

async fn claimed(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    metrics: Arc<Metrics>,
    cancel: watch::Receiver<bool>,
    started: Instant,
) -> Result<StreamReport> {
    let datasets = discover(job.source.as_ref(), &job.selection).await?;
    let keys = job.source.table_keys(&datasets).await?;
    if !job.source.sends_generated() {
        for k in &keys {
            for g in &k.generated {
                tracing::warn!(
                    "{}.{} is a generated column ({}): the source's log does not carry it, so \
                     the change files leave it out (the snapshot has it)",
                    k.table,
                    g.name,
                    g.expression
                );
            }
        }
    }
    let unlogged = crate::cascades::unlogged(job.source.as_ref(), &keys);
    crate::cascades::check_stream(job.source.as_ref(), &unlogged, job.accept_missing_cascades)?;
    let store = job.state.clone();
    let saved = blocking(move || store.load()).await?;
    let names = names_of(job, saved.as_ref())?;
    let mut snapshot_report = None;
    let mut state = match saved {
        None => {
            let (state, report) = first_start(job, lock, &names, &datasets, &cancel).await?;
            snapshot_report = report;
            state
        }
        Some(mut s) => {
            same_tables(job, &s, &datasets)?;
            if job.source.keeps_server_objects() && !job.source.exists(&names).await? {
                return Err(Error::source_permanent(format!(
                    "the stream state in {} names replication slot {}, which no longer exists \
                     on {}: the changes since the saved position are lost. Start over with a \
                     new output (and sluice stream --drop to remove the old state).",
                    job.state.describe(),
                    names.slot,
                    job.source.display_url()
                )));
            }
            if !s.snapshot.done {
                snapshot_report = Some(resume_snapshot(job, lock, &mut s, &cancel).await?);
            }
            s
        }
    };
    state.source = job.source.display_url();
    crate::layout::check(
        job.source.as_ref(),
        &datasets,
        &mut state,
        job.partition_changes,
        "sluice stream",
    )
    .await?;
    for t in state.tables.values_mut() {
        for (_, fk) in unlogged.iter().filter(|(child, _)| *child == t.table) {
            let note = crate::cascades::missing_note(job.source.as_ref(), fk);
            if !t.missing.contains(&note) {
                t.missing.push(note);
            }
        }
    }
    let result = stream(
        job,
        state,
        &datasets,
        metrics,
        cancel,
        started,
        snapshot_report,
    )
    .await;
    // An object store's lock may have been taken over while the run was away (its refresh
    // stopped): say so rather than report a stream that could not keep its output.
    result.and_then(|r| lock.check().map(|()| r))
}

fn same_tables(job: &StreamJob, s: &StreamState, datasets: &[Dataset]) -> Result<()> {
    if s.extension != job.format.extension() {
        return Err(Error::config(format!(
            "the stream in {} writes {} change files; --format {} would mix formats. Use the \
             stream's format, or stream into another output.",
            job.destination.display(),
            s.extension,
            job.format.extension()
        )));
    }
    let new: Vec<&str> = datasets
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| !s.tables.contains_key(*n))
        .collect();
    if !new.is_empty() {
        return Err(Error::config(format!(
            "the selection now also matches {}, which the stream in {} was not started with. \
             A stream's tables are fixed when it starts: narrow the selection, or start another \
             stream (another --to) for the new tables.",
            new.join(", "),
            job.destination.display()
        )));
    }
    Ok(())
}

async fn first_start(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    names: &CaptureNames,
    datasets: &[Dataset],
    cancel: &watch::Receiver<bool>,
) -> Result<(StreamState, Option<Report>)> {
    job.source.check(datasets).await?;
    if job.source.keeps_server_objects() && job.source.exists(names).await? {
        return Err(Error::config(format!(
            "replication slot {} already exists on {} but {} holds no stream state for it. \
             Pass another --slot, or remove the slot (sluice stream --drop with the arguments \
             that created it) — a slot nobody reads keeps WAL on the server.",
            names.slot,
            job.source.display_url(),
            job.state.describe()
        )));
    }
    let snapshot = job.initial == Initial::Snapshot;
    let created = job.source.create(names, datasets, snapshot).await?;
    let mut tables = BTreeMap::new();
    for d in datasets {
        if let Some(t) = &d.object {
            tables.insert(
                d.name.clone(),
                TableState {
                    table: t.clone(),
                    snapshot_position: snapshot.then(|| created.position.clone()),
                    versions: Vec::new(),
                    missing: Vec::new(),
                },
            );
        }
    }
    let mut state = StreamState {
        version: crate::state::STATE_VERSION,
        engine: job.source.engine().to_string(),
        source: job.source.display_url(),
        names: names.clone(),
        publication_created: created.publication_created,
        extension: job.format.extension().to_string(),
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
        updated_at: chrono::Utc::now().to_rfc3339(),
        layout: job.source.layout(datasets).await?,
    };
    let saved = {
        let store = job.state.clone();
        let s = state.clone();
        blocking(move || {
            failpoint::hit_as("stream.first_state", sluice_core::ErrorKind::Destination)?;
            store.save(&s)
        })
        .await
    };
    if let Err(e) = saved {
        // A failed first start leaves no slot behind.
        if let Some(h) = created.snapshot {
            let _ = h.hold.release().await;
        }
        let _ = job.source.remove(names, created.publication_created).await;
        return Err(e);
    }
    if !job.source.keeps_server_objects() {
        tracing::info!(
            "stream {} starts at position {} on {}",
            names.slot,
            created.position,
            job.source.display_url()
        );
    } else {
        tracing::info!(
            "created replication slot {} and {} publication {} on {}; the slot keeps WAL until the \
         stream confirms it (sluice stream --drop removes both)",
            names.slot,
            if created.publication_created {
                "the"
            } else {
                "uses the existing"
            },
            names.publication,
            job.source.display_url()
        );
    }
    let report = match created.snapshot {
        Some(held) => Some(snapshot_phase(job, lock, &mut state, held, false, cancel).await?),
        None => None,
    };
    Ok((state, report))
}

/// `sluice stream --drop`: remove the slot, the publication sluice created, and the state.
pub async fn drop_stream(job: &StreamJob) -> Result<Vec<String>> {
    let store = job.state.clone();
    let saved = blocking(move || store.load()).await?;
    let names = names_of(job, saved.as_ref())?;
    if saved.is_none() && job.slot.is_none() {
        return Err(Error::config(format!(
            "{} holds no stream state, so there is no slot to drop: pass --slot (and \
             --publication) to name them.",
            job.state.describe()
        )));
    }
    let publication = saved
        .as_ref()
        .map(|s| s.publication_created)
        .unwrap_or(job.publication.is_some());
    let mut removed = job.source.remove(&names, publication).await?;
    if saved.is_some() {
        let store = job.state.clone();
        blocking(move || store.clear()).await?;
        removed.push(format!("stream state {}", job.state.describe()));
    }
    Ok(removed)
}
