//! Running an export from start to finish.
//!
//! ```text
//! inspect output ─▶ open coordinator (snapshot taken) ─▶ discover ─▶ plan chunks ─▶ pin (locks)
//!   ─▶ write run.json ─▶ N workers × (chunk ─▶ part ─▶ receipt) ─▶ release snapshot
//!   ─▶ manifest.json (last) ─▶ report
//! ```
//! The manifest is written only after every part of the plan has a receipt, so its presence
//! means the output is complete. Any failure leaves no manifest, and at most hidden
//! temporaries, which `--resume` removes before finishing the missing parts.

use crate::harm::HarmMonitor;
use crate::job::ExportJob;
use crate::plan::{self, Budget, PlanInputs};
use crate::progress::{Progress, ProgressStart, ProgressTick};
use crate::queue::WorkQueue;
use crate::report::{DatasetReport, Report};
use crate::resume::{self, Prior};
use crate::rss::peak_rss_bytes;
use crate::worker::{self, WorkerContext, blocking};
use sluice_core::{
    Chunk, ChunkRequest, Consistency, Coordinator, Dataset, DatasetKind, Error, ReadCounters,
    Result, SourceOptions,
};
use sluice_sink::layout::{self, MANIFEST, RUN_STATE};
use sluice_sink::manifest::{
    ColumnRecord, DatasetRecord, HarmRecord, MANIFEST_VERSION, Manifest, MergedRecord, PartRecord,
    RunState, SnapshotRecord, SourceRecord,
};
use sluice_sink::merge;
use sluice_sink::{FormatOptions, ParquetOptions};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, watch};

/// Current time as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn new_run_id() -> String {
    format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// Inputs to the planner for `job` on this machine.
pub fn plan_inputs(job: &ExportJob) -> PlanInputs {
    PlanInputs {
        parallel: job.parallel,
        chunk_bytes: job.chunk_bytes,
        memory: job.memory,
        batch_bytes: job.batch_bytes,
        row_group_bytes: job.row_group_bytes,
        holds_row_group: matches!(job.format, FormatOptions::Parquet(_)),
        writer_buffer_bytes: job.destination.buffer_bytes_per_writer(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        server_local: plan::server_is_local(&job.source.display_url()),
    }
}

/// The format with the row-group budget the planner chose.
pub fn format_with_budget(format: &FormatOptions, budget: &Budget) -> FormatOptions {
    match format {
        FormatOptions::Parquet(p) => FormatOptions::Parquet(ParquetOptions {
            row_group_bytes: budget.row_group_bytes,
            ..p.clone()
        }),
        other => other.clone(),
    }
}

/// The manifest description of a dataset's columns.
pub fn column_records(ds: &Dataset) -> Vec<ColumnRecord> {
    ds.columns
        .iter()
        .map(|c| ColumnRecord {
            name: c.name.clone(),
            arrow_type: c.field.data_type().to_string(),
            source_type: c.source_type.clone(),
            nullable: c.field.is_nullable(),
            text_fallback: c.as_text_fallback,
        })
        .collect()
}

fn kind_name(kind: DatasetKind) -> String {
    match kind {
        DatasetKind::Table => "table",
        DatasetKind::Partitioned => "partitioned",
        DatasetKind::View => "view",
        DatasetKind::Query => "query",
    }
    .to_string()
}

/// Plan every dataset's chunks.
pub async fn plan_all(
    coordinator: &mut dyn Coordinator,
    datasets: &[Dataset],
    job: &ExportJob,
    chunk_bytes: u64,
) -> Result<Vec<Chunk>> {
    let request = ChunkRequest {
        strategy: job.chunking.clone(),
        target_bytes: chunk_bytes,
    };
    let mut chunks = Vec::new();
    for ds in datasets {
        chunks.extend(coordinator.plan_chunks(ds, &request).await?);
    }
    Ok(chunks)
}

/// What the run decided before reading, carried to the report.
struct Prepared {
    datasets: Vec<Dataset>,
    state: RunState,
    remaining: Vec<Chunk>,
    skipped: usize,
    workers: usize,
    budget: Budget,
    /// The planner's predicted peak RSS for `workers` with `budget` and the destination's
    /// writer buffers (computed once, reported at the end).
    predicted_peak_rss: u64,
    notes: Vec<String>,
}

/// Run `job`. `cancel` turning true stops the run (parts in flight are aborted, no manifest).
pub async fn run_export(
    job: ExportJob,
    progress: Arc<dyn Progress>,
    cancel: watch::Receiver<bool>,
) -> Result<Report> {
    let started = Instant::now();
    let dest = job.destination.clone();
    {
        let d = dest.clone();
        blocking(move || d.check_writable()).await?;
    }
    let prior = {
        let d = dest.clone();
        blocking(move || resume::inspect(d.as_ref())).await?
    };
    let run_id = new_run_id();
    if matches!(prior, Prior::Complete) && !job.overwrite {
        if job.resume {
            return Ok(already_complete(&job, run_id, started));
        }
        return Err(Error::config(format!(
            "{} already holds a complete export (manifest.json). Use --overwrite to replace it, \
             or choose another --to.",
            dest.display()
        )));
    }
    if let Prior::Unfinished(_) = &prior
        && !job.resume
        && !job.overwrite
    {
        return Err(Error::config(format!(
            "{} holds an unfinished export (no manifest.json yet). Use --resume to finish the \
                 missing parts, or --overwrite to start over.",
            dest.display()
        )));
    }
    let options = SourceOptions {
        session_tag: format!("sluice-{run_id}"),
        consistency: job.consistency,
    };
    let mut coordinator = job.source.open_coordinator(&options).await?;
    let snapshot_since = Instant::now();
    let server_version = coordinator.server_version();
    let prepared = prepare(&job, coordinator.as_mut(), prior, &run_id).await;
    let mut prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            let _ = coordinator.release().await;
            return Err(e);
        }
    };
    let readers = if prepared.remaining.is_empty() {
        Vec::new()
    } else {
        match coordinator.open_readers(prepared.workers).await {
            Ok(r) => r,
            Err(e) => {
                let _ = coordinator.release().await;
                return Err(e);
            }
        }
    };
    let probe = match job.source.open_harm_probe(&options).await {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(format!("harm monitor unavailable: {e}"))),
    };
    let monitor = HarmMonitor::start(probe.0, job.harm_interval, probe.1);
    let est_rows: u64 = prepared.remaining.iter().map(|c| c.est_rows).sum();
    let coordinator = Arc::new(Mutex::new(coordinator));
    let snapshot_index = (prepared.state.snapshots.len() - 1) as u32;
    let ctx = Arc::new(WorkerContext {
        queue: WorkQueue::new(std::mem::take(&mut prepared.remaining)),
        datasets: prepared
            .datasets
            .iter()
            .map(|d| (d.name.clone(), d.clone()))
            .collect(),
        coordinator: coordinator.clone(),
        destination: dest.clone(),
        format: format_with_budget(&job.format, &prepared.budget),
        merge: job.merge,
        batch_bytes: prepared.budget.batch_bytes,
        retry: job.retry,
        snapshot_index,
        counters: Arc::new(ReadCounters::default()),
        parts_done: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        committed: std::sync::Mutex::new(Vec::new()),
    });
    let parts_total = ctx.queue.remaining() as u64;
    progress.begin(&ProgressStart {
        est_rows,
        parts: parts_total,
        workers: readers.len(),
    });
    let outcome = drive(ctx.clone(), readers, progress.clone(), cancel).await;
    progress.end();
    let (mut harm, harm_failed) = monitor.finish().await;
    let facts = coordinator.lock().await.run_facts();
    harm.global_lock_seconds = facts.global_lock_held.map(|d| d.as_secs_f64());
    prepared.notes.extend(facts.notes);
    let _ = coordinator.lock().await.release().await;
    if job.consistency == Consistency::Snapshot {
        harm.snapshot_held_seconds = snapshot_since.elapsed().as_secs_f64();
    }
    outcome?;
    if let Some(why) = harm_failed {
        prepared
            .notes
            .push(format!("harm figures are incomplete: {why}"));
    }
    finish(&job, prepared, ctx, harm, run_id, server_version, started).await
}

/// Resolve what to do: fresh plan or resumed plan, output checks, snapshot pin, run.json.
async fn prepare(
    job: &ExportJob,
    coordinator: &mut dyn Coordinator,
    prior: Prior,
    run_id: &str,
) -> Result<Prepared> {
    let dest = job.destination.clone();
    let datasets = coordinator.discover(&job.selection).await?;
    let inputs = plan_inputs(job);
    let sizing = plan::size(&datasets, &inputs);
    let mut notes = Vec::new();
    let ext = job.format.extension().to_string();
    let names: Vec<String> = datasets.iter().map(|d| d.name.clone()).collect();
    let records: Vec<DatasetRecord> = datasets
        .iter()
        .map(|d| DatasetRecord {
            name: d.name.clone(),
            kind: kind_name(d.kind),
            columns: column_records(d),
            rows: 0,
            bytes: 0,
            parts: Vec::new(),
            merged: None,
        })
        .collect();
    let resuming = match prior {
        Prior::Unfinished(state) if job.resume && !job.overwrite => Some(*state),
        Prior::Fresh => {
            let d = dest.clone();
            let n = names.clone();
            let e = ext.clone();
            let existing = blocking(move || resume::dataset_files(d.as_ref(), &n, &e)).await?;
            if let Some(f) = existing.first() {
                return Err(Error::config(format!(
                    "{}/{f} already exists and was not written by an unfinished sluice run. Choose \
                     an empty --to, or use --overwrite to replace the dataset directories.",
                    dest.display()
                )));
            }
            None
        }
        previous => {
            // --overwrite: forget the previous export, whatever datasets it had.
            let mut all: HashSet<String> = names.iter().cloned().collect();
            if let Prior::Unfinished(state) = &previous {
                all.extend(state.chunks.iter().map(|c| c.dataset.clone()));
            }
            if let Some(bytes) = blocking({
                let d = dest.clone();
                move || d.get(MANIFEST)
            })
            .await?
                && let Ok(m) = serde_json::from_slice::<Manifest>(&bytes)
            {
                all.extend(m.datasets.into_iter().map(|d| d.name));
            }
            let d = dest.clone();
            let e = ext.clone();
            blocking(move || resume::clear(d.as_ref(), &all.into_iter().collect::<Vec<_>>(), &e))
                .await?;
            None
        }
    };
    let (mut state, done) = match resuming {
        Some(state) => {
            if state.fingerprint != job.fingerprint() {
                return Err(Error::config(format!(
                    "--resume needs the same request as the unfinished run (source, tables, format, \
                     chunking), but this one differs. Repeat the original command with --resume, or \
                     use --overwrite to start over in {}.",
                    dest.display()
                )));
            }
            for rec in &state.datasets {
                let now = datasets.iter().find(|d| d.name == rec.name);
                if now.map(column_records).as_ref() != Some(&rec.columns) {
                    return Err(Error::config(format!(
                        "the columns of {} changed since the unfinished run started, so its parts \
                         would not match. Use --overwrite to export it again from scratch.",
                        rec.name
                    )));
                }
            }
            let d = dest.clone();
            let n = names.clone();
            let removed = blocking(move || resume::remove_temporaries(d.as_ref(), &n)).await?;
            if removed > 0 {
                tracing::info!("removed {removed} partial file(s) left by the interrupted run");
            }
            let d = dest.clone();
            let receipts = blocking(move || resume::receipts(d.as_ref())).await?;
            let done: HashSet<(String, u32)> = receipts
                .into_iter()
                .map(|r| (r.dataset, r.ordinal))
                .collect();
            (state, done)
        }
        None => {
            let chunks = plan_all(coordinator, &datasets, job, sizing.chunk_bytes).await?;
            let state = RunState {
                manifest_version: MANIFEST_VERSION,
                run_id: run_id.to_string(),
                started_at: now_rfc3339(),
                fingerprint: job.fingerprint(),
                consistency: job.consistency.to_string(),
                extension: ext.clone(),
                snapshots: Vec::new(),
                datasets: records,
                chunks,
            };
            (state, HashSet::new())
        }
    };
    // Engines whose workers must start their transactions under the snapshot's lock (MySQL)
    // open those sessions now, as many as the run will use (see `workers` below).
    let to_read = state
        .chunks
        .iter()
        .filter(|c| !done.contains(&(c.dataset.clone(), c.ordinal)))
        .count();
    // Refuse before anything is held or written when the workers cannot fit --memory.
    if let Some(why) = plan::memory_refusal(sizing.workers.min(to_read).max(1), &inputs) {
        return Err(Error::config(why));
    }
    if to_read > 0 {
        coordinator
            .reserve_readers(sizing.workers.min(to_read).max(1))
            .await?;
    }
    let snapshot = coordinator.pin_snapshot(&datasets).await?;
    state.snapshots.push(SnapshotRecord {
        index: state.snapshots.len() as u32,
        id: snapshot.id,
        position: snapshot.position,
        taken_at: snapshot.taken_at,
        consistency: job.consistency.to_string(),
    });
    let bytes = serde_json::to_vec_pretty(&state).map_err(|e| Error::internal(e.to_string()))?;
    let d = dest.clone();
    blocking(move || d.put(RUN_STATE, &bytes)).await?;
    sluice_core::failpoint::hit("export.after_plan")?;
    let remaining: Vec<Chunk> = state
        .chunks
        .iter()
        .filter(|c| !done.contains(&(c.dataset.clone(), c.ordinal)))
        .cloned()
        .collect();
    let skipped = state.chunks.len() - remaining.len();
    let workers = sizing.workers.min(remaining.len()).max(1);
    let budget = plan::budget(workers, &inputs);
    let predicted = plan::predicted_peak_rss(workers, &budget, inputs.writer_buffer_bytes);
    notes.extend(sizing.notes.iter().cloned());
    if job.consistency == Consistency::Chunk {
        notes.push(
            "consistency chunk: each part was read in its own transaction, so the output is not \
             one point in time; rows changed during the run may appear in either state"
                .into(),
        );
    }
    if state.snapshots.len() > 1 {
        notes.push(format!(
            "resumed: the parts come from {} snapshots (see manifest.json \"snapshots\" and each \
             part's \"snapshot\"); each part is consistent, the whole is not one point in time",
            state.snapshots.len()
        ));
    }
    Ok(Prepared {
        datasets,
        state,
        remaining,
        skipped,
        workers,
        budget,
        predicted_peak_rss: predicted,
        notes,
    })
}

/// Run the workers until all chunks are done, one fails, or the run is cancelled.
async fn drive(
    ctx: Arc<WorkerContext>,
    readers: Vec<Box<dyn sluice_core::ChunkReader>>,
    progress: Arc<dyn Progress>,
    mut cancel: watch::Receiver<bool>,
) -> Result<()> {
    let (stop_ticker, mut ticker_stopped) = watch::channel(false);
    let ticker = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            loop {
                progress.tick(ProgressTick {
                    rows: ctx.counters.rows.load(Ordering::Relaxed),
                    bytes: ctx.counters.bytes.load(Ordering::Relaxed),
                    parts_done: ctx.parts_done.load(Ordering::Relaxed),
                });
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = ticker_stopped.changed() => break,
                }
            }
        })
    };
    let mut set = tokio::task::JoinSet::new();
    for reader in readers {
        set.spawn(worker::run(ctx.clone(), reader));
    }
    let mut failure: Option<Error> = None;
    loop {
        tokio::select! {
            joined = set.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => {
                    failure.get_or_insert(e);
                    set.abort_all();
                }
                Some(Err(e)) if e.is_cancelled() => {}
                Some(Err(e)) => {
                    failure.get_or_insert(Error::internal(format!("a worker panicked: {e}")));
                    set.abort_all();
                }
            },
            changed = cancel.changed() => {
                if changed.is_err() || *cancel.borrow() {
                    failure.get_or_insert(Error::interrupted(
                        "interrupted: the export stopped before finishing; parts in flight were \
                         discarded and no manifest was written. Run the same command with --resume \
                         to finish it."));
                    set.abort_all();
                }
            }
        }
    }
    let _ = stop_ticker.send(true);
    let _ = ticker.await;
    // Parts in flight abort on their own threads once their channels close; wait a moment for
    // their temporaries to be removed before reporting.
    tokio::time::sleep(Duration::from_millis(20)).await;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Write the manifest from every receipt and build the report.
async fn finish(
    job: &ExportJob,
    prepared: Prepared,
    ctx: Arc<WorkerContext>,
    harm: HarmRecord,
    run_id: String,
    server_version: String,
    started: Instant,
) -> Result<Report> {
    let dest = job.destination.clone();
    let d = dest.clone();
    let receipts = blocking(move || resume::receipts(d.as_ref())).await?;
    let mut by_dataset: BTreeMap<String, Vec<PartRecord>> = BTreeMap::new();
    for r in receipts {
        by_dataset.entry(r.dataset.clone()).or_default().push(r);
    }
    let state = &prepared.state;
    let mut datasets = Vec::new();
    for ds in &prepared.datasets {
        let mut parts = by_dataset.remove(&ds.name).unwrap_or_default();
        parts.sort_by_key(|p| p.ordinal);
        let planned = state.chunks.iter().filter(|c| c.dataset == ds.name).count();
        if parts.len() != planned {
            return Err(Error::internal(format!(
                "{}: {} of {planned} parts have receipts after all workers finished",
                ds.name,
                parts.len()
            )));
        }
        let rows: u64 = parts.iter().map(|p| p.rows).sum();
        let merged = if job.merge {
            let target = layout::merged_path(&ds.name, job.format.extension());
            let files: Vec<String> = parts.iter().map(|p| p.file.clone()).collect();
            let (d, f, t) = (dest.clone(), job.format.clone(), target.clone());
            sluice_core::failpoint::hit("export.before_merge")?;
            let stats = blocking(move || merge::merge(&d, &f, &files, rows, &t)).await?;
            Some(MergedRecord {
                file: target,
                rows,
                bytes: stats.bytes,
                xxh3_128: stats.xxh3_128,
            })
        } else {
            None
        };
        datasets.push(DatasetRecord {
            name: ds.name.clone(),
            kind: kind_name(ds.kind),
            columns: column_records(ds),
            rows,
            bytes: merged
                .as_ref()
                .map(|m| m.bytes)
                .unwrap_or_else(|| parts.iter().map(|p| p.bytes).sum()),
            parts,
            merged,
        });
    }
    let source = SourceRecord {
        engine: job.source.engine().to_string(),
        url: job.source.display_url(),
        server_version: server_version.clone(),
    };
    let manifest = Manifest {
        manifest_version: MANIFEST_VERSION,
        tool: format!("sluice {}", env!("CARGO_PKG_VERSION")),
        run_id: run_id.clone(),
        source,
        consistency: job.consistency.to_string(),
        snapshots: state.snapshots.clone(),
        format: job.format.describe(),
        started_at: state.started_at.clone(),
        finished_at: now_rfc3339(),
        datasets: datasets.clone(),
        harm: harm.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::internal(e.to_string()))?;
    sluice_core::failpoint::hit("export.before_manifest")?;
    let d = dest.clone();
    blocking(move || d.put(MANIFEST, &bytes)).await?;
    if job.merge {
        // The merged files and the manifest are durable: the parts are no longer needed.
        let files: Vec<String> = datasets
            .iter()
            .flat_map(|d| d.parts.iter().map(|p| p.file.clone()))
            .collect();
        let d = dest.clone();
        blocking(move || files.iter().try_for_each(|f| d.delete(f))).await?;
    }

    let committed = ctx.committed.lock().map(|c| c.clone()).unwrap_or_default();
    let wall = started.elapsed().as_secs_f64();
    let rows = ctx.counters.rows.load(Ordering::Relaxed);
    let bytes_read = ctx.counters.bytes.load(Ordering::Relaxed);
    let mut text_fallback_columns = Vec::new();
    for ds in &prepared.datasets {
        for c in ds.columns.iter().filter(|c| c.as_text_fallback) {
            text_fallback_columns.push(format!("{}.{} ({})", ds.name, c.name, c.source_type));
        }
    }
    let position = state
        .snapshots
        .last()
        .map(|s| s.position.to_string())
        .unwrap_or_default();
    Ok(Report {
        run_id,
        source: format!("{} {}", job.source.engine(), job.source.display_url()),
        server_version,
        destination: dest.display(),
        format: job.format.describe(),
        consistency: job.consistency.to_string(),
        position,
        already_complete: false,
        rows,
        bytes_read,
        bytes_written: committed.iter().map(|p| p.bytes).sum(),
        wall_seconds: wall,
        rows_per_second: if wall > 0.0 { rows as f64 / wall } else { 0.0 },
        mb_per_second: if wall > 0.0 {
            bytes_read as f64 / 1e6 / wall
        } else {
            0.0
        },
        peak_rss_bytes: peak_rss_bytes(),
        predicted_peak_rss_bytes: prepared.predicted_peak_rss,
        batch_bytes: prepared.budget.batch_bytes,
        workers: prepared.workers,
        parts_written: committed.len(),
        parts_skipped: prepared.skipped,
        retries: ctx.retries.load(Ordering::Relaxed),
        harm,
        text_fallback_columns,
        datasets: datasets
            .iter()
            .map(|d| DatasetReport {
                name: d.name.clone(),
                rows: d.rows,
                bytes: d.bytes,
                parts: d.parts.len(),
            })
            .collect(),
        notes: prepared.notes,
    })
}

fn already_complete(job: &ExportJob, run_id: String, started: Instant) -> Report {
    Report {
        run_id,
        source: format!("{} {}", job.source.engine(), job.source.display_url()),
        server_version: String::new(),
        destination: job.destination.display(),
        format: job.format.describe(),
        consistency: job.consistency.to_string(),
        position: String::new(),
        already_complete: true,
        rows: 0,
        bytes_read: 0,
        bytes_written: 0,
        wall_seconds: started.elapsed().as_secs_f64(),
        rows_per_second: 0.0,
        mb_per_second: 0.0,
        peak_rss_bytes: peak_rss_bytes(),
        predicted_peak_rss_bytes: 0,
        batch_bytes: 0,
        workers: 0,
        parts_written: 0,
        parts_skipped: 0,
        retries: 0,
        harm: HarmRecord::default(),
        text_fallback_columns: Vec::new(),
        datasets: Vec::new(),
        notes: vec![
            "the output was already complete (manifest.json present); nothing to do".into(),
        ],
    }
}
