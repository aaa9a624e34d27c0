//! Running an export from start to finish.
//!
//! ```text
//! lock output ─▶ inspect output (output.rs) ─▶ fresh / resume / overwrite (policy.rs)
//!   ─▶ open coordinator (snapshot taken) ─▶ discover ─▶ plan chunks (planning.rs), or
//!   reconcile the unfinished plan (resume.rs) ─▶ pin, write run.json (snapshot.rs)
//!   ─▶ N workers × (chunk ─▶ part ─▶ receipt) (worker.rs) ─▶ release snapshot
//!   ─▶ manifest.json, last (finish.rs) ─▶ report (report.rs) ─▶ unlock output
//! ```
//! Each worker asks the harm budget's gate before every chunk (`governor/`): how many workers
//! may start one, and whether new chunks wait, is the governor's decision, taken between
//! chunks only.
//! The run is timed in phases (`crate::phase::EXPORT_PHASES`: connect, plan, snapshot, read,
//! merge, manifest), logged as each ends and listed in the report.
//! The manifest is written only after every part of the plan has a receipt, so its presence
//! means the output is complete. Any failure leaves no manifest, and at most hidden
//! temporaries and unreceipted parts, which `--resume` removes before finishing what is
//! missing (`prepare.rs`, `resume.rs`).
//!
//! This file is the order of the run; each step's decisions live in the module named above.

use crate::converge;
use crate::finish::{Finished, already_complete, finish};
use crate::governor::{self, Governor};
use crate::harm::HarmMonitor;
use crate::job::ExportJob;
use crate::manifest::HarmRecord;
use crate::output;
use crate::phase::{EXPORT_PHASES, PhaseTimer};
use crate::plan;
use crate::planning::format_with_budget;
use crate::policy::{self, Start};
use crate::prepare::{Prepared, prepare};
use crate::progress::{Progress, ProgressStart, ProgressTick};
use crate::queue::WorkQueue;
use crate::report::Report;
use crate::snapshot;
use crate::worker::{self, WorkerContext, Writers};
use sluice_core::error::Retry;
use sluice_core::{Consistency, Error, ErrorKind, ReadCounters, Result, SourceOptions};
use sluice_sink::layout::MANIFEST;
use sluice_sink::{LockHolder, OutputLock};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, watch};

pub use crate::planning::{now_rfc3339, plan_all, plan_inputs};

pub(crate) fn new_run_id() -> String {
    format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
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
    job.destination.check_writable().await?;
    let run_id = new_run_id();
    // One run at a time per output: a second one would remove the first one's temporaries.
    let (lock, own) = match &job.held_lock {
        Some(l) => (l.clone(), false),
        None => (job.destination.lock(&LockHolder::now(&run_id)).await?, true),
    };
    let mut result = locked(&job, &lock, run_id, started, progress, cancel, phases).await;
    if let Some(log) = &job.converge {
        // What a retry may cure (a lost connection, an interruption) or a fix of the output
        // (a full disk) keeps the log for --resume; anything else would fail again the same
        // way, and once the manifest is written there is nothing left to resume.
        let keep = matches!(&result, Err(e)
            if e.retry() == Retry::Transient
                || matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::Destination))
            && !matches!(job.destination.get(MANIFEST).await, Ok(Some(_)));
        match log.close(keep).await {
            Ok(Some(kept)) => {
                result = result.map_err(|e| {
                    e.then(format!(
                        "({kept} for --resume to finish this run; --overwrite or a finished \
                         run removes it)"
                    ))
                })
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("{e}"),
        }
    }
    if own {
        lock.release().await;
    }
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
    let Opened {
        mut coordinator,
        mut prepared,
        options,
        snapshot_since,
        server_version,
    } = match open(job, &run_id, started, phases).await? {
        Opening::Complete(report) => return Ok(*report),
        Opening::Opened(o) => *o,
    };
    // A converged run follows the change log from before its first chunk is read.
    let converge_from = match &job.converge {
        Some(log) if job.consistency == Consistency::Converged => {
            let began = Instant::now();
            let recorded = prepared.state.converged.clone();
            let begun = match log.begin(&prepared.datasets, recorded.as_ref()).await {
                // Recorded before any chunk is read, for a resume to follow the log from C.
                Ok(mut c) if recorded.is_none() => {
                    c.keys = prepared
                        .datasets
                        .iter()
                        .map(|d| (d.name.clone(), d.primary_key.clone()))
                        .collect();
                    prepared.state.converged = Some(c.clone());
                    snapshot::write_state(job, &prepared.state)
                        .await
                        .map(|()| c)
                }
                other => other,
            };
            match begun {
                Ok(c) => {
                    tracing::info!(
                        "following the change log from position {} (set up in {:.2} s{})",
                        c.position,
                        began.elapsed().as_secs_f64(),
                        if recorded.is_some() {
                            ", as the unfinished run did"
                        } else {
                            ""
                        }
                    );
                    Some((log.as_ref(), c.position))
                }
                Err(e) => {
                    let _ = coordinator.release().await;
                    return Err(e);
                }
            }
        }
        _ => None,
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
    let mut probe = match job.harm_sampled_elsewhere {
        // A distributed read's task: the snapshot's holder samples every task's sessions.
        true => (
            None,
            Some("sampled by the shared snapshot's holder".to_string()),
        ),
        false => match job.source.open_harm_probe(&options).await {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(format!("harm monitor unavailable: {e}"))),
        },
    };
    let signals = match (&mut probe.0, job.budget.governs()) {
        (Some(p), true) => p.open_signals(&job.budget.request()),
        (None, true) => {
            // No session to read the budget's signals from: fail closed, before reading.
            let _ = coordinator.release().await;
            return Err(Error::source_transient(format!(
                "the harm budget cannot read its signals: {}",
                probe.1.unwrap_or_default()
            )));
        }
        _ => Vec::new(),
    };
    let monitor = HarmMonitor::start(probe.0, job.harm_interval, probe.1);
    let est_rows: u64 = prepared.remaining.iter().map(|c| c.est_rows).sum();
    let counters = Arc::new(ReadCounters::default());
    let parts_done = Arc::new(AtomicU64::new(0));
    let governor = Governor::start(
        job,
        signals,
        governor::Inputs {
            workers: readers.len(),
            counters: counters.clone(),
            parts_done: parts_done.clone(),
            harm: monitor.latest(),
            snapshot_since,
            progress: progress.clone(),
        },
    );
    let governor = match governor {
        Ok(g) => g,
        Err(e) => {
            let _ = monitor.finish().await;
            let _ = coordinator.release().await;
            return Err(e);
        }
    };
    let coordinator = Arc::new(Mutex::new(coordinator));
    let ctx = Arc::new(WorkerContext {
        queue: WorkQueue::new(std::mem::take(&mut prepared.remaining)),
        datasets: prepared
            .datasets
            .iter()
            .map(|d| (d.name.clone(), d.clone()))
            .collect(),
        coordinator: coordinator.clone(),
        destination: job.destination.clone(),
        format: format_with_budget(&job.format, &prepared.budget),
        merge: job.merge,
        batch_bytes: prepared.budget.batch_bytes,
        retry: job.retry,
        snapshot_index: prepared.snapshot_index,
        counters,
        parts_done,
        gate: governor.gate(),
        retries: AtomicU64::new(0),
        committed: std::sync::Mutex::new(Vec::new()),
        writers: Writers::default(),
        longest_read_ms: AtomicU64::new(0),
        part_tag: job.format.is_table().then(|| prepared.state.run_id.clone()),
    });
    let parts_total = ctx.queue.remaining() as u64;
    progress.begin(&ProgressStart {
        est_rows,
        parts: parts_total,
        workers: readers.len(),
    });
    let outcome = drive(ctx.clone(), readers, progress.clone(), cancel.clone()).await;
    progress.end();
    let timeline = governor.finish().await;
    // The budget stopped the run before exceeding it: the parts read are kept for --resume.
    let outcome = outcome.and_then(|()| match ctx.gate.stopped() {
        Some(why) => Err(Error::source_transient(why)),
        None => Ok(()),
    });
    let converged = match (outcome.is_ok(), converge_from) {
        (true, Some((log, start))) => {
            phases.enter("converge");
            let c = converge::Converging {
                job,
                log,
                start,
                options: &options,
                progress: progress.clone(),
                cancel: cancel.clone(),
            };
            match converge::reconcile(c, &ctx, &mut prepared).await {
                Ok(r) => Some(r),
                Err(e) => {
                    let mut session = coordinator.lock().await;
                    wind_down(
                        job,
                        session.as_mut(),
                        &mut prepared,
                        monitor,
                        snapshot_since,
                    )
                    .await;
                    return Err(e);
                }
            }
        }
        _ => None,
    };
    let harm = wind_down(
        job,
        coordinator.lock().await.as_mut(),
        &mut prepared,
        monitor,
        snapshot_since,
    )
    .await;
    outcome?;
    let mut harm = harm;
    if let Some(c) = &converged {
        // No snapshot lived longer than a chunk's read, or the one at the end point.
        harm.snapshot_held_seconds = c.longest_chunk_seconds.max(c.end_snapshot_seconds);
    }
    let mut finished = Finished::new(prepared, ctx, harm, run_id, server_version, started);
    finished.converged = converged;
    let mut report = finish(job, lock, finished, phases).await?;
    report.timeline = Some(timeline);
    if let Some(path) = &job.report_html {
        crate::html::write(path, &report)?;
    }
    Ok(report)
}

/// A run whose output lock is held, once its coordinator holds the snapshot and `run.json`
/// records the plan: what is left is reading the chunks and finishing.
pub(crate) struct Opened {
    pub coordinator: Box<dyn sluice_core::Coordinator>,
    pub prepared: Prepared,
    pub options: SourceOptions,
    pub snapshot_since: Instant,
    pub server_version: String,
}

/// What [`open`] found.
pub(crate) enum Opening {
    /// The output was already complete: nothing to read.
    Complete(Box<Report>),
    /// Ready to read.
    Opened(Box<Opened>),
}

/// The run up to its first read, with the output's lock held: what the output holds decides
/// fresh, resume or overwrite; the coordinator opens, the datasets are discovered and planned
/// (or the unfinished plan reconciled), the snapshot pinned and `run.json` written.
pub(crate) async fn open(
    job: &ExportJob,
    run_id: &str,
    started: Instant,
    phases: &mut PhaseTimer,
) -> Result<Opening> {
    let prior = output::inspect(job.destination.as_ref()).await?;
    let start = policy::decide(job, prior)?;
    if let Start::AlreadyComplete = start {
        return Ok(Opening::Complete(Box::new(already_complete(
            job,
            run_id.to_string(),
            started,
            phases,
        ))));
    }
    let options = SourceOptions {
        session_tag: job
            .session_tag
            .clone()
            .unwrap_or_else(|| format!("sluice-{run_id}")),
        consistency: job.consistency.at_source(),
        enable_row_security: job.enable_row_security,
    };
    let mut coordinator = job.source.open_coordinator(&options).await?;
    let snapshot_since = Instant::now();
    let server_version = coordinator.server_version();
    phases.enter("plan");
    match prepare(job, coordinator.as_mut(), start, run_id, phases).await {
        Ok(prepared) => Ok(Opening::Opened(Box::new(Opened {
            coordinator,
            prepared,
            options,
            snapshot_since,
            server_version,
        }))),
        Err(e) => {
            let _ = coordinator.release().await;
            Err(e)
        }
    }
}

/// Once the reads are over: the harm peaks with the coordinator's run facts (a global lock's
/// times, tables outside the snapshot, remarks) and how long the snapshot was held; the
/// coordinator released.
pub(crate) async fn wind_down(
    job: &ExportJob,
    coordinator: &mut dyn sluice_core::Coordinator,
    prepared: &mut Prepared,
    monitor: HarmMonitor,
    snapshot_since: Instant,
) -> HarmRecord {
    let (mut harm, harm_failed) = monitor.finish().await;
    let facts = coordinator.run_facts();
    harm.global_lock_seconds = facts.global_lock_held.map(|d| d.as_secs_f64());
    harm.global_lock_wait_seconds = facts.global_lock_wait.map(|d| d.as_secs_f64());
    prepared.notes.extend(facts.notes);
    prepared.outside_snapshot = facts.outside_snapshot;
    let _ = coordinator.release().await;
    if job.consistency == Consistency::Snapshot {
        harm.snapshot_held_seconds = snapshot_since.elapsed().as_secs_f64();
    }
    if let Some(why) = harm_failed {
        prepared
            .notes
            .push(format!("harm figures are incomplete: {why}"));
    }
    harm
}

/// Run the workers until all chunks are done, one fails, or the run is cancelled.
pub(crate) async fn drive(
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
    for (index, reader) in readers.into_iter().enumerate() {
        set.spawn(worker::run(ctx.clone(), index, reader));
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
    // Parts in flight abort on their writer threads once their channels close: wait for every
    // writer to end, so no temporary is left behind when the run reports.
    ctx.writers.idle().await;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
