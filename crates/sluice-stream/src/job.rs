//! A stream's request and its report, and the small pieces every phase of a run uses (the
//! selection's datasets, blocking calls off the async runtime, the warning for changes of a
//! table the run does not capture). Kept apart from `run.rs`, which orders the phases, so the
//! phases depend on it and not on each other.

use crate::metrics::Metrics;
use crate::state::StateStore;
use serde::Serialize;
use sluice_core::change::ChangeSource;
use sluice_core::table::TableRef;
use sluice_core::{
    Consistency, Dataset, Error, Result, Selection, Source, SourceOptions, StreamPos,
};
use sluice_engine::{ExportJob, Report};
use sluice_sink::{Destination, FormatOptions};
use std::net::SocketAddr;
use std::sync::Arc;

/// What the stream starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initial {
    /// Export every table under the slot's snapshot first (the default).
    Snapshot,
    /// Only changes from the slot's creation on.
    None,
    /// Export every table in short transactions, one per chunk, made one point in time T
    /// from the slot's own log (`--consistency converged`, PostgreSQL); the changes after T
    /// follow. No snapshot is held longer than a chunk.
    Converged,
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

/// What a capture reads and when it stops: the part of the request that `sluice stream` and
/// `sluice replicate` share (the capture lifecycle reads only this; each command's own
/// options stay in its job).
pub struct Capture {
    /// The source.
    pub source: Arc<dyn ChangeSource>,
    /// What to capture.
    pub selection: Selection,
    /// Stop once everything committed on the source before the start is written or applied.
    pub until_current: bool,
    /// What a partition truncated, detached or dropped on the source does to the run
    /// (`--partition-changes`; see `layout.rs`).
    pub partition_changes: crate::layout::LayoutChanges,
}

/// A validated `sluice stream` request.
pub struct StreamJob {
    /// The source, the selection and when the run stops.
    pub capture: Capture,
    /// Where files go.
    pub destination: Arc<dyn Destination>,
    /// Where the state is kept.
    pub state: Arc<dyn StateStore>,
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
    /// Wait for the running stream's claim on the state and take over when it ends
    /// (`--standby`; the state store must fence its writes, see
    /// [`crate::StateStore::fenced`]), instead of refusing.
    pub standby: bool,
    /// Change files' layout and the operations they keep (`--layout`, `--ops`).
    pub files: crate::files::ChangeFiles,
    /// How often the selection is looked up again for tables created or dropped on the
    /// source (`--discover-every`; `None`: the tables are those of the start).
    pub discover_every: Option<std::time::Duration>,
    /// Merge every batch into its dataset's table, which the snapshot made (`--format
    /// delta`; `sluice-lake`); `None`: change files only.
    pub table: Option<Arc<dyn sluice_sink::table::TableCommitter>>,
    /// With a table: delete the data files no version newer than this needs, at the first
    /// batch of a run and then hourly (`--vacuum-retention`; `None`: never).
    pub vacuum_retention: Option<std::time::Duration>,
}

/// Why the stream stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopped {
    /// `--until-current`: everything committed before the start is written.
    UntilCurrent,
    /// SIGINT or SIGTERM.
    Signal,
    /// Tables matching the selection were created or dropped on the source: everything up to
    /// the position where that was seen is written. The run takes them in and goes on (never
    /// the end of a run).
    Tables,
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
    /// The capture's name (PostgreSQL: its replication slot; MySQL/MariaDB: the name its state
    /// is kept under). Called `slot` because reports already carry that key.
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
    pub position: StreamPos,
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
    /// The operations change files keep (`--ops`; all four without it).
    pub ops: String,
    /// Changes of the other operations, counted and not written.
    pub filtered_changes: u64,
    /// Updates and deletes carry their old row (`--before-images`).
    pub before_images: bool,
    /// Tables that joined the stream during this run, with their snapshot.
    pub added_tables: Vec<crate::added::AddedTable>,
    /// Captured tables dropped on the source during this run (their final marker written),
    /// with whether their change files hold every change they logged.
    pub dropped_tables: Vec<(String, bool)>,
    /// `--format delta`: table versions the merges committed, and the data files they added
    /// and removed (all zero otherwise).
    pub table_versions: u64,
    /// See [`StreamReport::table_versions`].
    pub table_files_added: u64,
    /// See [`StreamReport::table_versions`].
    pub table_files_removed: u64,
    /// Data files of older versions deleted by `--vacuum-retention`.
    pub table_files_vacuumed: u64,
}

/// The warning for changes of a table the run does not capture: a captured table renamed on
/// the source (its changes now arrive under the new name), whose changes are left out.
pub(crate) fn uncaptured(table: &str) -> String {
    format!(
        "the source sends changes of {table}, which this run does not capture: a captured \
         table renamed on the source (its changes arrive under its new name). They are left \
         out and counted (ignored changes in the report and metrics); to follow the table \
         under its new name, select it and take a new snapshot of it"
    )
}

/// Save `state` in the job's store, off the async runtime.
pub(crate) async fn save(job: &StreamJob, state: &crate::state::StreamState) -> Result<()> {
    let store = job.state.clone();
    let s = state.clone();
    blocking(move || store.save(&s)).await
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("a blocking task failed: {e}")))?
}

/// A coordinator session on the source, for catalog lookups outside any snapshot.
async fn catalog_session(source: &dyn ChangeSource) -> Result<Box<dyn sluice_core::Coordinator>> {
    let options = SourceOptions {
        session_tag: "stream".into(),
        consistency: Consistency::Chunk,
        enable_row_security: false,
    };
    source.export_source(None).open_coordinator(&options).await
}

pub(crate) async fn discover(
    source: &dyn ChangeSource,
    selection: &Selection,
) -> Result<Vec<Dataset>> {
    let mut c = catalog_session(source).await?;
    let found = c.discover(selection).await;
    let _ = c.release().await;
    found
}

/// The selection's tables and every table of the source now, by name only (cheap enough for
/// a running stream to repeat).
pub(crate) async fn tables_now(
    source: &dyn ChangeSource,
    selection: &Selection,
    captured: &[TableRef],
) -> Result<sluice_core::select::TablesNow> {
    let mut c = catalog_session(source).await?;
    let found = c.table_names(selection, captured).await;
    let _ = c.release().await;
    found
}

/// The checks a table passes before it is captured, at the start and when it joins a running
/// stream: generated columns the log leaves out (warned), foreign-key actions whose changes
/// the log leaves out (refused unless accepted), old rows for `--before-images`. Returns the
/// foreign keys whose actions' changes the files will miss.
pub(crate) async fn check_tables(
    job: &StreamJob,
    datasets: &[Dataset],
) -> Result<Vec<(TableRef, sluice_core::apply::ForeignKey)>> {
    let keys = job.capture.source.table_keys(datasets).await?;
    if !job.capture.source.sends_generated() {
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
    let unlogged = crate::cascades::unlogged(job.capture.source.as_ref(), &keys);
    crate::cascades::check_stream(
        job.capture.source.as_ref(),
        &unlogged,
        job.accept_missing_cascades,
    )?;
    if job.table.is_some() {
        for d in datasets {
            sluice_sink::columns::table_schema(
                sluice_sink::columns::Kind::Delta,
                &d.name,
                &d.arrow_schema(),
            )?;
        }
        check_mergeable(job, &keys, &unlogged)?;
    }
    if job.files.before_images {
        job.capture.source.check_before_images(datasets).await?;
    }
    Ok(unlogged)
}

/// A table merged by key (`--format delta`) must be one whose every change the log carries
/// and identifies by its primary key; anything else is refused before the snapshot, with the
/// fix, since the table would silently drift from the source.
fn check_mergeable(
    job: &StreamJob,
    keys: &[sluice_core::apply::TableKeys],
    unlogged: &[(TableRef, sluice_core::apply::ForeignKey)],
) -> Result<()> {
    for k in keys {
        let refuse = |why: String| {
            Err(Error::config(format!(
                "{}: {why} --format delta keeps a table equal to the source by its primary \
                 key. Otherwise stream this table as change files (--format parquet), or leave \
                 it out of the selection.",
                k.table
            )))
        };
        if k.primary.is_empty() {
            return refuse("has no primary key.".into());
        }
        if !k.match_by.is_empty() && k.match_by != k.primary {
            return refuse(format!(
                "its old rows are identified by ({}), not its primary key (REPLICA IDENTITY \
                 USING INDEX): set REPLICA IDENTITY DEFAULT or FULL.",
                k.match_by.join(", ")
            ));
        }
        if !job.capture.source.sends_generated() && !k.generated.is_empty() {
            let names: Vec<&str> = k.generated.iter().map(|g| g.name.as_str()).collect();
            return refuse(format!(
                "its generated column(s) {} are not in the source's log, so the table would \
                 keep their snapshot values: leave them out with --columns.",
                names.join(", ")
            ));
        }
    }
    if let Some((table, fk)) = unlogged.first() {
        return Err(Error::config(format!(
            "{table}: the changes of its foreign key's action ({}) are not in the source's log, \
             so its Delta table would keep rows the source removed (--accept-missing-cascades \
             cannot apply to a table format). Stream it as change files, or leave it out.",
            fk.describe()
        )));
    }
    Ok(())
}

/// Note in each table's state the changes its files miss (`unlogged`, from [`check_tables`]).
pub(crate) fn note_missing(
    job: &StreamJob,
    unlogged: &[(TableRef, sluice_core::apply::ForeignKey)],
    state: &mut crate::state::StreamState,
) {
    for t in state.tables.values_mut() {
        for (_, fk) in unlogged.iter().filter(|(child, _)| *child == t.table) {
            let note = crate::cascades::missing_note(job.capture.source.as_ref(), fk);
            if !t.missing.contains(&note) {
                t.missing.push(note);
            }
        }
    }
}

/// The datasets the change stream decodes: the log carries every column, so the stream
/// decodes the tables whole and the batcher leaves out what `--columns` did not pick
/// (`TableState::columns`).
pub(crate) async fn whole(job: &StreamJob, datasets: Vec<Dataset>) -> Result<Vec<Dataset>> {
    if datasets.iter().any(|d| d.columns_picked) {
        let mut all = job.capture.selection.clone();
        all.columns.clear();
        let mut whole = discover(job.capture.source.as_ref(), &all).await?;
        whole.retain(|w| datasets.iter().any(|d| d.name == w.name));
        // A table the source no longer lists (dropped, its last changes still to be read)
        // keeps the description it had.
        for d in &datasets {
            if !whole.iter().any(|w| w.name == d.name) {
                whole.push(d.clone());
            }
        }
        Ok(whole)
    } else {
        Ok(datasets)
    }
}
