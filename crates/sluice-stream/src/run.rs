//! One `sluice stream` run, in order.
//!
//! ```text
//! discover ─▶ first start: check ─▶ publication + slot (snapshot exported) ─▶ state saved
//!              ─▶ export under the slot's snapshot ─▶ per-table snapshot positions saved
//!           interrupted snapshot: unfinished tables cleared ─▶ export resumed under a new
//!              exact snapshot (temporary slot) ─▶ per-table positions from the manifest
//!   ─▶ lock output ─▶ stream from the committed position: batches ─▶ files ─▶ state ─▶ confirm
//!   ─▶ stop at --until-current's position or on SIGINT/SIGTERM, after committing the batch
//! ```
//!
//! Why a table's changes are filtered by its own snapshot position: a resumed snapshot reads
//! the unfinished tables under a later snapshot (exact position L2) while the slot still streams
//! from the first one's (L1). A table read at L has every transaction whose commit record
//! starts before L, and none from L on (both PostgreSQL snapshots are a slot's, whose
//! consistent point is exact); the stream from L1 holds every transaction from L1 on, in order.
//! Writing a table's changes of transactions at or after its L therefore writes each
//! transaction exactly once for it: the ones before L are in its snapshot, the ones after in
//! its change files.

use crate::batch::{Batcher, Budgets};
use crate::metrics::{Metrics, serve};
use crate::state::{Committed, SnapshotState, StateStore, StreamState, TableState};
use serde::Serialize;
use sluice_core::change::{CaptureNames, ChangeSource, ChangeStream, HeldSnapshot, Step};
use sluice_core::{
    Consistency, Dataset, Error, Position, Result, Selection, Source, SourceOptions, failpoint,
};
use sluice_engine::{ExportJob, Report};
use sluice_sink::layout::{MANIFEST, RUN_STATE, dataset_dir};
use sluice_sink::manifest::Manifest;
use sluice_sink::{Destination, FormatOptions, LockHolder, ParquetOptions};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Consecutive failed attempts without a committed batch before a transient error ends the
/// run (waits of 1, 2, 4, … 32 s between them).
const MAX_RETRIES: u32 = 8;

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
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("a blocking task failed: {e}")))?
}

async fn discover(source: &dyn ChangeSource, selection: &Selection) -> Result<Vec<Dataset>> {
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
    {
        let d = job.destination.clone();
        blocking(move || d.check_writable()).await?;
    }
    let holder = sluice_sink::LockHolder::now(&format!("stream-{}", std::process::id()));
    {
        let store = job.state.clone();
        let who = holder.describe();
        blocking(move || store.acquire(&who)).await?;
    }
    let result = claimed(&job, metrics, cancel, started).await;
    let store = job.state.clone();
    let _ = blocking(move || {
        store.release();
        Ok(())
    })
    .await;
    result
}

async fn claimed(
    job: &StreamJob,
    metrics: Arc<Metrics>,
    cancel: watch::Receiver<bool>,
    started: Instant,
) -> Result<StreamReport> {
    let datasets = discover(job.source.as_ref(), &job.selection).await?;
    let store = job.state.clone();
    let saved = blocking(move || store.load()).await?;
    let names = names_of(job, saved.as_ref())?;
    let mut snapshot_report = None;
    let mut state = match saved {
        None => {
            let (state, report) = first_start(job, &names, &datasets, &cancel).await?;
            snapshot_report = report;
            state
        }
        Some(mut s) => {
            same_tables(job, &s, &datasets)?;
            if !job.source.exists(&names).await? {
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
                snapshot_report = Some(resume_snapshot(job, &mut s, &cancel).await?);
            }
            s
        }
    };
    state.source = job.source.display_url();
    stream(
        job,
        state,
        &datasets,
        metrics,
        cancel,
        started,
        snapshot_report,
    )
    .await
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
    names: &CaptureNames,
    datasets: &[Dataset],
    cancel: &watch::Receiver<bool>,
) -> Result<(StreamState, Option<Report>)> {
    job.source.check(datasets).await?;
    if job.source.exists(names).await? {
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
    let report = match created.snapshot {
        Some(held) => Some(snapshot_phase(job, &mut state, held, false, cancel).await?),
        None => None,
    };
    Ok((state, report))
}

/// Remove the parts and receipts of datasets the interrupted export started but did not
/// finish, so the resumed export reads each of them whole under its new snapshot (a table's
/// rows must all come from one snapshot, whose position filters its changes).
fn clear_unfinished(dest: &dyn Destination, ext: &str) -> Result<Vec<String>> {
    let Some(plan) = dest.get(RUN_STATE)? else {
        return Ok(Vec::new());
    };
    let plan: serde_json::Value = serde_json::from_slice(&plan)
        .map_err(|e| Error::config(format!("{RUN_STATE} cannot be read: {e}")))?;
    let mut planned: HashMap<String, u64> = HashMap::new();
    for c in plan["chunks"].as_array().into_iter().flatten() {
        if let Some(d) = c["dataset"].as_str() {
            *planned.entry(d.to_string()).or_default() += 1;
        }
    }
    let mut cleared = Vec::new();
    for (ds, n) in planned {
        let dir = dataset_dir(&ds);
        let receipts = dest.list(&format!("_sluice/parts/{dir}/"))?;
        let done = receipts
            .iter()
            .filter(|r| r.path.ends_with(".json"))
            .count() as u64;
        if done == 0 || done == n {
            continue;
        }
        for r in &receipts {
            dest.delete(&r.path)?;
        }
        for f in dest.list(&format!("{dir}/"))? {
            let name = f.path.rsplit('/').next().unwrap_or_default();
            let part = name.starts_with("part-") || name.starts_with(".part-");
            if part && !f.path.contains("/changes/") && f.path.contains(ext) {
                dest.delete(&f.path)?;
            }
        }
        cleared.push(ds);
    }
    Ok(cleared)
}

async fn resume_snapshot(
    job: &StreamJob,
    state: &mut StreamState,
    cancel: &watch::Receiver<bool>,
) -> Result<Report> {
    let d = job.destination.clone();
    let ext = state.extension.clone();
    let cleared = blocking(move || clear_unfinished(d.as_ref(), &ext)).await?;
    if !cleared.is_empty() {
        tracing::info!(
            "resuming the initial snapshot: {} will be read again whole under a new snapshot",
            cleared.join(", ")
        );
    }
    let held = job.source.snapshot().await?;
    snapshot_phase(job, state, held, true, cancel).await
}

async fn snapshot_phase(
    job: &StreamJob,
    state: &mut StreamState,
    held: HeldSnapshot,
    resume: bool,
    cancel: &watch::Receiver<bool>,
) -> Result<Report> {
    // Record which stream position this snapshot is before any part is read under it.
    state
        .snapshot
        .positions
        .push((held.snapshot.position.clone(), held.position.clone()));
    {
        let store = job.state.clone();
        let s = state.clone();
        blocking(move || store.save(&s)).await?;
    }
    let source = job.source.export_source(Some(&held.snapshot));
    let mut export = (job.export)(source);
    export.destination = job.destination.clone();
    export.resume = resume;
    let result = sluice_engine::run_export(export, job.progress.clone(), cancel.clone()).await;
    let _ = held.hold.release().await;
    let report = result.map_err(|e| {
        let kind = e.kind();
        Error::new(
            kind,
            e.retry(),
            format!(
                "{} The initial snapshot is unfinished; the replication slot {} keeps WAL on \
                 the server meanwhile. Run the same sluice stream command again to finish it \
                 (only unfinished tables are read again), or sluice stream --drop to give up.",
                e.message(),
                state.names.slot
            ),
        )
    })?;
    let d = job.destination.clone();
    let bytes = blocking(move || d.get(MANIFEST))
        .await?
        .ok_or_else(|| Error::internal("the initial snapshot finished without a manifest"))?;
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| Error::internal(format!("the snapshot's manifest cannot be read: {e}")))?;
    for ds in &manifest.datasets {
        let Some(idx) = ds.parts.iter().map(|p| p.snapshot).max() else {
            continue;
        };
        let Some(snap) = manifest.snapshots.iter().find(|s| s.index == idx) else {
            continue;
        };
        let pos = state
            .snapshot
            .positions
            .iter()
            .find(|(p, _)| same_position(p, &snap.position))
            .map(|(_, pos)| pos.clone())
            .ok_or_else(|| {
                Error::internal(format!(
                    "{}: its parts come from snapshot {} ({}), which no stream position was \
                     recorded for",
                    ds.name, idx, snap.position
                ))
            })?;
        if let Some(t) = state.tables.get_mut(&ds.name) {
            t.snapshot_position = Some(pos);
        }
    }
    state.snapshot.done = true;
    let store = job.state.clone();
    let s = state.clone();
    blocking(move || store.save(&s)).await?;
    Ok(report)
}

fn same_position(a: &Position, b: &Position) -> bool {
    a == b
}

fn cleanup(dest: &dyn Destination, state: &StreamState) -> Result<()> {
    let keep: Vec<String> = state
        .intent
        .as_ref()
        .map(|i| i.files.clone())
        .unwrap_or_default();
    for name in state.tables.keys() {
        for f in dest.list(&format!("{}/changes/", dataset_dir(name)))? {
            let file = f.path.rsplit('/').next().unwrap_or_default();
            let seq = file
                .split(['-', '.'])
                .nth(1)
                .and_then(|s| s.parse::<u64>().ok());
            let stale = file.starts_with('.')
                || (seq.is_some_and(|s| s > state.committed.written_through)
                    && !keep.contains(&f.path));
            if stale {
                dest.delete(&f.path)?;
            }
        }
    }
    Ok(())
}

fn budgets(job: &StreamJob) -> (Budgets, FormatOptions) {
    let flush = (job.memory / 16).clamp(256 << 10, 8 << 20) as usize;
    let row_group = (job.memory / 8).clamp(1 << 20, 64 << 20) as usize;
    let format = match &job.format {
        FormatOptions::Parquet(p) => FormatOptions::Parquet(ParquetOptions {
            row_group_bytes: row_group,
            ..p.clone()
        }),
        other => other.clone(),
    };
    (
        Budgets {
            batch_bytes: job.batch_bytes,
            batch_time: Duration::from_secs_f64(job.batch_seconds.max(0.01)),
            flush_bytes: flush,
        },
        format,
    )
}

async fn stream(
    job: &StreamJob,
    state: StreamState,
    datasets: &[Dataset],
    metrics: Arc<Metrics>,
    cancel: watch::Receiver<bool>,
    started: Instant,
    snapshot: Option<Report>,
) -> Result<StreamReport> {
    let lock = {
        let d = job.destination.clone();
        let holder = LockHolder::now(&format!("stream-{}", state.names.slot));
        blocking(move || d.lock(&holder)).await?
    };
    let result = streaming(job, state, datasets, metrics, cancel, started, snapshot).await;
    let _ = blocking(move || {
        lock.release();
        Ok(())
    })
    .await;
    result
}

async fn streaming(
    job: &StreamJob,
    mut state: StreamState,
    datasets: &[Dataset],
    metrics: Arc<Metrics>,
    cancel: watch::Receiver<bool>,
    started: Instant,
    snapshot: Option<Report>,
) -> Result<StreamReport> {
    let names = state.names.clone();
    metrics.streaming.store(1, Ordering::Relaxed);
    let mut target: Option<Option<String>> = None;
    let mut failures = 0u32;
    let (mut stream, batcher, stopped) = loop {
        let attempt = async {
            {
                let d = job.destination.clone();
                let s = state.clone();
                blocking(move || cleanup(d.as_ref(), &s)).await?;
            }
            let stream = job
                .source
                .open(&names, datasets, &state.committed.restart)
                .await?;
            if target.is_none() {
                target = Some(match job.until_current {
                    true => Some(job.source.current_position().await?),
                    false => None,
                });
            }
            Ok::<_, Error>(stream)
        };
        let (budgets, format) = budgets(job);
        let mut batcher = Batcher::new(
            job.destination.clone(),
            format,
            job.state.clone(),
            state.clone(),
            budgets,
            metrics.clone(),
        );
        let (r, stream) = match attempt.await {
            Ok(mut stream) => {
                let until = target.clone().flatten();
                let r = pump(
                    job,
                    &names,
                    stream.as_mut(),
                    &mut batcher,
                    &metrics,
                    &cancel,
                    until.as_deref(),
                )
                .await;
                (r, Some(stream))
            }
            Err(e) => (Err(e), None),
        };
        match r {
            Ok(stopped) => match stream {
                Some(s) => break (s, batcher, stopped),
                None => return Err(Error::internal("a stream stopped without a session")),
            },
            Err(e) => {
                batcher.abort();
                metrics.errors.fetch_add(1, Ordering::Relaxed);
                if let Some(mut s) = stream {
                    let _ = s.close().await;
                }
                if batcher.state.committed != state.committed {
                    failures = 0;
                }
                failures += 1;
                if !e.is_transient() || failures > MAX_RETRIES || *cancel.borrow() {
                    return Err(e);
                }
                let wait = Duration::from_secs(1 << (failures - 1).min(5));
                tracing::warn!(
                    "{e} — restarting the stream from its committed position in {} s                      (attempt {failures} of {MAX_RETRIES})",
                    wait.as_secs()
                );
                metrics.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(wait).await;
                let store = job.state.clone();
                state = blocking(move || store.load())
                    .await?
                    .ok_or_else(|| Error::internal("the stream state vanished while streaming"))?;
            }
        }
    };
    stream.close().await?;
    let c = &batcher.state.committed;
    tracing::info!(
        "stream stopped ({}): {} changes in {} batches this run; position {}, _seq {}",
        match stopped {
            Stopped::UntilCurrent => "caught up with --until-current",
            Stopped::Signal => "signal",
        },
        metrics.changes.load(Ordering::Relaxed),
        metrics.batches.load(Ordering::Relaxed),
        c.restart,
        c.written_through
    );
    Ok(StreamReport {
        source: job.source.display_url(),
        destination: job.destination.display(),
        state: job.state.describe(),
        slot: names.slot.clone(),
        publication: names.publication.clone(),
        snapshot,
        changes: metrics.changes.load(Ordering::Relaxed),
        transactions: metrics.transactions.load(Ordering::Relaxed),
        batches: metrics.batches.load(Ordering::Relaxed),
        files: metrics.files.load(Ordering::Relaxed),
        bytes_written: metrics.bytes_written.load(Ordering::Relaxed),
        position: c.restart.clone(),
        last_seq: c.written_through,
        peak_retained_bytes: metrics.retained_bytes.load(Ordering::Relaxed),
        peak_lag_seconds: metrics.peak_lag_millis.load(Ordering::Relaxed) as f64 / 1000.0,
        seconds_since_confirm: metrics.since_confirm_millis.load(Ordering::Relaxed) as f64 / 1000.0,
        stopped,
        wall_seconds: started.elapsed().as_secs_f64(),
        peak_rss_bytes: sluice_engine::rss::peak_rss_bytes(),
    })
}

async fn pump(
    job: &StreamJob,
    names: &CaptureNames,
    stream: &mut dyn ChangeStream,
    batcher: &mut Batcher,
    metrics: &Metrics,
    cancel: &watch::Receiver<bool>,
    target: Option<&str>,
) -> Result<Stopped> {
    let wait = Duration::from_secs_f64(job.batch_seconds.clamp(0.05, 1.0));
    let mut last_confirm = Instant::now();
    let mut last_advance = Instant::now();
    let budget_time = Duration::from_secs_f64(job.batch_seconds.max(0.01));
    let mut last_harm: Option<Instant> = None;
    let mut peak_retained = 0u64;
    loop {
        if *cancel.borrow() {
            if !batcher.replaying() {
                log_cut(batcher.cut()?);
            }
            confirm(stream, batcher, &mut last_confirm).await?;
            return Ok(Stopped::Signal);
        }
        let step = stream.next(batcher, wait).await?;
        if batcher.due() {
            log_cut(batcher.cut()?);
        } else if step == Step::Idle || last_advance.elapsed() >= budget_time {
            last_advance = Instant::now();
            batcher.advance_to(stream.received_through())?;
        }
        confirm(stream, batcher, &mut last_confirm).await?;
        let now_us = chrono::Utc::now().timestamp_micros();
        let lag = match (step, batcher.last_commit_ts) {
            (Step::Data, Some(ts)) => (now_us - ts).max(0) as u64 / 1000,
            _ => 0,
        };
        metrics.lag_millis.store(lag, Ordering::Relaxed);
        metrics.peak_lag_millis.fetch_max(lag, Ordering::Relaxed);
        metrics
            .since_confirm_millis
            .store(last_confirm.elapsed().as_millis() as u64, Ordering::Relaxed);
        if last_harm.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            last_harm = Some(Instant::now());
            let store = job.state.clone();
            blocking(move || store.refresh()).await?;
            if let Ok(Some(h)) = job.source.harm(names).await {
                peak_retained = peak_retained.max(h.retained_bytes);
                metrics
                    .retained_bytes
                    .store(peak_retained, Ordering::Relaxed);
                metrics.lag_bytes.store(h.lag_bytes, Ordering::Relaxed);
            }
        }
        if let (Some(t), Some(r)) = (target, stream.received_through())
            && !batcher.in_tx()
            && r.as_str() >= t
        {
            log_cut(batcher.cut()?);
            batcher.advance()?;
            confirm(stream, batcher, &mut last_confirm).await?;
            return Ok(Stopped::UntilCurrent);
        }
    }
}

async fn confirm(
    stream: &mut dyn ChangeStream,
    batcher: &mut Batcher,
    last: &mut Instant,
) -> Result<()> {
    if let Some(pos) = batcher.to_confirm.take() {
        failpoint::hit("stream.before_confirm")?;
        stream.confirm(&pos).await?;
        *last = Instant::now();
    }
    Ok(())
}

fn log_cut(cut: Option<crate::batch::CutInfo>) {
    if let Some(c) = cut {
        tracing::info!(
            "batch committed: {} changes in {} files, _seq {}..{}",
            c.changes,
            c.files,
            c.seqs.0,
            c.seqs.1
        );
    }
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
