//! Running an export from start to finish.
//!
//! ```text
//! lock output ─▶ inspect output ─▶ open coordinator (snapshot taken) ─▶ discover
//!   ─▶ plan chunks (or reconcile the unfinished plan) ─▶ pin (locks) ─▶ write run.json
//!   ─▶ N workers × (chunk ─▶ part ─▶ receipt) ─▶ release snapshot
//!   ─▶ manifest.json (last) ─▶ report ─▶ unlock output
//! ```
//! The run is timed in phases (`crate::phase::EXPORT_PHASES`: connect, plan, snapshot, read,
//! merge, manifest), logged as each ends and listed in the report.
//! The manifest is written only after every part of the plan has a receipt, so its presence
//! means the output is complete. Any failure leaves no manifest, and at most hidden
//! temporaries and unreceipted parts, which `--resume` removes before finishing what is
//! missing (`prepare.rs`, `resume.rs`).

use crate::finish::{Finished, already_complete, finish};
use crate::harm::HarmMonitor;
use crate::job::ExportJob;
use crate::phase::{EXPORT_PHASES, PhaseTimer};
use crate::plan::{self, Budget, PlanInputs};
use crate::prepare::prepare;
use crate::progress::{Progress, ProgressStart, ProgressTick};
use crate::queue::WorkQueue;
use crate::report::Report;
use crate::resume::{self, Prior};
use crate::worker::{self, WorkerContext, blocking};
use sluice_core::{
    Chunk, ChunkRequest, Consistency, Coordinator, Dataset, DatasetKind, Error, ReadCounters,
    Result, SourceOptions,
};
use sluice_sink::manifest::ColumnRecord;
use sluice_sink::{FormatOptions, LockHolder, OutputLock, ParquetOptions};
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
        columns: 0,
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

pub(crate) fn kind_name(kind: DatasetKind) -> String {
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
        consistency: job.consistency,
    };
    let mut chunks = Vec::new();
    for ds in datasets {
        chunks.extend(coordinator.plan_chunks(ds, &request).await?);
    }
    Ok(chunks)
}

/// Run `job`. `cancel` turning true stops the run (parts in flight are aborted, no manifest).
pub async fn run_export(
    job: ExportJob,
    progress: Arc<dyn Progress>,
    cancel: watch::Receiver<bool>,
) -> Result<Report> {
    let mut phases = PhaseTimer::new(EXPORT_PHASES);
    let result = timed_export(job, progress, cancel, &mut phases).await;
    if result.is_err() {
        // Logs the phase the run stopped in and how long it had run.
        phases.abandon();
    }
    result
}

async fn timed_export(
    job: ExportJob,
    progress: Arc<dyn Progress>,
    cancel: watch::Receiver<bool>,
    phases: &mut PhaseTimer,
) -> Result<Report> {
    let started = Instant::now();
    // A worker count that cannot fit --memory is refused before anything is touched: no
    // output checked, locked or cleared (--overwrite), no session opened. Fewer chunks than
    // workers would use fewer, but a request that needs more than its target is a mistake
    // worth naming whatever the table.
    if let Some(why) = plan::request_refusal(&plan_inputs(&job)) {
        return Err(Error::config(why));
    }
    phases.enter("connect");
    let dest = job.destination.clone();
    {
        let d = dest.clone();
        blocking(move || d.check_writable()).await?;
    }
    let run_id = new_run_id();
    // One run at a time per output: a second one would remove the first one's temporaries.
    let lock = {
        let d = dest.clone();
        let holder = LockHolder::now(&run_id);
        blocking(move || d.lock(&holder)).await?
    };
    let result = locked(&job, &lock, run_id, started, progress, cancel, phases).await;
    let _ = blocking(move || {
        lock.release();
        Ok(())
    })
    .await;
    result
}

/// [`run_export`] once the output's lock is held.
async fn locked(
    job: &ExportJob,
    lock: &Arc<dyn OutputLock>,
    run_id: String,
    started: Instant,
    progress: Arc<dyn Progress>,
    cancel: watch::Receiver<bool>,
    phases: &mut PhaseTimer,
) -> Result<Report> {
    let dest = job.destination.clone();
    let prior = {
        let d = dest.clone();
        blocking(move || resume::inspect(d.as_ref())).await?
    };
    if let Prior::Complete(manifest) = &prior
        && !job.overwrite
    {
        let request = job.request();
        let differences = manifest.as_ref().map(|m| m.request.differences(&request));
        return match (job.resume, differences) {
            (true, Some(d)) if d.is_empty() => Ok(already_complete(job, run_id, started, phases)),
            (true, Some(d)) => Err(Error::config(format!(
                "{} holds a complete export of a different request: {}. --resume only finishes \
                 the same request; use --overwrite to replace the export with this one, or \
                 choose another --to.",
                dest.display(),
                d.join("; ")
            ))),
            (true, None) => Err(Error::config(format!(
                "{} holds a complete export whose manifest.json this version of sluice cannot \
                 read, so it cannot tell whether it is the same request. Use --overwrite to \
                 replace it, or choose another --to.",
                dest.display()
            ))),
            (false, d) => Err(Error::config(format!(
                "{} already holds a complete export (manifest.json){}. Use --overwrite to \
                 replace it, or choose another --to.",
                dest.display(),
                match d {
                    Some(d) if !d.is_empty() => {
                        format!(" made with a different request ({})", d.join("; "))
                    }
                    _ => String::new(),
                }
            ))),
        };
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
        enable_row_security: job.enable_row_security,
    };
    let mut coordinator = job.source.open_coordinator(&options).await?;
    let snapshot_since = Instant::now();
    let server_version = coordinator.server_version();
    phases.enter("plan");
    let prepared = prepare(job, coordinator.as_mut(), prior, &run_id, phases).await;
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
    phases.enter("read");
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
    harm.global_lock_wait_seconds = facts.global_lock_wait.map(|d| d.as_secs_f64());
    prepared.notes.extend(facts.notes);
    prepared.outside_snapshot = facts.outside_snapshot;
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
    let finished = Finished {
        prepared,
        ctx,
        harm,
        run_id,
        server_version,
        started,
    };
    finish(job, lock, finished, phases).await
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
