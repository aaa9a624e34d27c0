//! An export whose chunks are read and written by tasks in other processes (Spark executors):
//! the driver does what the export does before and after its workers, the tasks do what its
//! workers do.
//!
//! ```text
//! driver  begin(job) ─▶ lock output ─▶ fresh / resume / overwrite ─▶ discover, plan (or
//!         reconcile) ─▶ pin snapshot ─▶ run.json            (export.rs `open`, unchanged)
//! task k  write_parts(job, spec, [chunk k]) ─▶ import the snapshot ─▶ worker loop ─▶ part + receipt
//! driver  Driver::finish(results) ─▶ release snapshot ─▶ manifest from every receipt (finish.rs)
//! ```
//! The parts, receipts, `run.json` and manifest are the ones `sluice export` writes, with the
//! same names and the same budgets (the tasks take the driver's per-worker batch and row-group
//! sizes), so the output of a distributed export and of `sluice export --parallel N` for the
//! same request and snapshot hold the same parts, and `--resume` finishes either. A task run
//! twice (Spark's retry, a speculative copy) writes the same part name with the same content.
//! A driver that dies leaves no manifest; its lock and `run.json` are what `--resume` expects.

use super::{SharedSnapshot, refuse_unshareable, task};
use crate::export::{Opened, Opening, drive, new_run_id, open, wind_down};
use crate::finish::{Finished, finish};
use crate::governor::Gate;
use crate::harm::HarmMonitor;
use crate::job::ExportJob;
use crate::manifest::{ColumnRecord, PartRecord};
use crate::phase::{EXPORT_PHASES, PhaseTimer};
use crate::plan::{self, Budget};
use crate::planning::{column_records, format_with_budget, plan_inputs};
use crate::progress::Silent;
use crate::queue::WorkQueue;
use crate::report::Report;
use crate::worker::{WorkerContext, Writers};
use serde::{Deserialize, Serialize};
use sluice_core::{Chunk, Consistency, Error, ReadCounters, Result, SnapshotInfo, SourceOptions};
use sluice_sink::{LockHolder, OutputLock};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::{Mutex, watch};

/// What every task of one distributed export is given besides its chunks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The id of the run whose plan the tasks carry out (a table format's part names carry
    /// it).
    pub run_id: String,
    /// Each dataset's columns as the driver planned it: a task that finds other columns
    /// (the table altered meanwhile, possible without a snapshot's locks) refuses to write
    /// parts that would not match the run's record.
    pub columns: BTreeMap<String, Vec<ColumnRecord>>,
    /// The snapshot the parts are read under, as the run state numbers it.
    pub snapshot_index: u32,
    /// The per-worker batch and row-group sizes the driver planned.
    pub budget: Budget,
    /// The snapshot to import, under snapshot consistency; `None` reads each chunk in its
    /// own transaction.
    pub shared: Option<SharedSnapshot>,
}

/// What one task did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TaskResult {
    /// The receipts of the parts it committed.
    pub parts: Vec<PartRecord>,
    /// Rows and source bytes it read.
    pub rows_read: u64,
    /// Source bytes it read.
    pub bytes_read: u64,
    /// Retries it took.
    pub retries: u64,
}

/// What [`begin`] found.
pub enum Begun {
    /// The output was already complete; nothing to read.
    Complete(Box<Report>),
    /// The plan is written and the snapshot held: hand [`Driver::chunks`] to tasks.
    Ready(Box<Driver>),
}

/// The driver of a distributed export between its plan and its manifest.
pub struct Driver {
    job: ExportJob,
    lock: Arc<dyn OutputLock>,
    opened: Opened,
    run_id: String,
    started: Instant,
    phases: PhaseTimer,
    monitor: HarmMonitor,
    spec: TaskSpec,
}

/// Lock the output, decide fresh, resume or overwrite, plan, take and hold the snapshot and
/// write `run.json`, as `sluice export` does before its workers start. Refused before
/// anything is touched when snapshot consistency is asked of an engine whose snapshot other
/// processes cannot join.
pub async fn begin(job: ExportJob) -> Result<Begun> {
    let started = Instant::now();
    if let Some(why) = plan::request_refusal(&plan_inputs(&job)) {
        return Err(Error::config(why));
    }
    if job.consistency == Consistency::Snapshot {
        refuse_unshareable(&job).map_err(|e| {
            e.then(
                "A distributed export can still read each chunk in its own transaction: \
                    consistency=\"chunk\".",
            )
        })?;
    }
    let mut phases = PhaseTimer::new(EXPORT_PHASES);
    phases.enter("connect");
    job.destination.check_writable().await?;
    let run_id = new_run_id();
    let lock = job.destination.lock(&LockHolder::now(&run_id)).await?;
    let mut opened = match open(&job, &run_id, started, &mut phases).await {
        Ok(Opening::Opened(o)) => *o,
        Ok(Opening::Complete(report)) => {
            lock.release().await;
            return Ok(Begun::Complete(report));
        }
        Err(e) => {
            lock.release().await;
            return Err(e);
        }
    };
    let spec = match spec_of(&job, &opened) {
        Ok(s) => s,
        Err(e) => {
            let _ = opened.coordinator.release().await;
            lock.release().await;
            return Err(e);
        }
    };
    let monitor = match job.source.open_harm_probe(&opened.options).await {
        Ok(p) => HarmMonitor::start(Some(p), job.harm_interval, None),
        Err(e) => HarmMonitor::start(None, job.harm_interval, Some(e.to_string())),
    };
    phases.enter("read");
    Ok(Begun::Ready(Box::new(Driver {
        job,
        lock,
        opened,
        run_id,
        started,
        phases,
        monitor,
        spec,
    })))
}

fn spec_of(job: &ExportJob, opened: &Opened) -> Result<TaskSpec> {
    let state = &opened.prepared.state;
    let snap = state
        .snapshots
        .iter()
        .find(|s| s.index == opened.prepared.snapshot_index)
        .ok_or_else(|| Error::internal("the pinned snapshot is not in the run state"))?;
    let shared = (job.consistency == Consistency::Snapshot).then(|| SharedSnapshot {
        engine: job.source.engine().to_string(),
        position_text: snap.position.to_string(),
        snapshot: SnapshotInfo {
            id: snap.id.clone(),
            position: snap.position.clone(),
            taken_at: snap.taken_at.clone(),
        },
        session_tag: opened.options.session_tag.clone(),
        datasets: opened
            .prepared
            .datasets
            .iter()
            .map(|d| d.name.clone())
            .collect(),
    });
    Ok(TaskSpec {
        // The plan's run, not this attempt's: a resumed run names its parts as the run it
        // finishes did (`sluice export --resume` does the same).
        run_id: state.run_id.clone(),
        columns: opened
            .prepared
            .datasets
            .iter()
            .map(|d| (d.name.clone(), column_records(d)))
            .collect(),
        snapshot_index: opened.prepared.snapshot_index,
        budget: opened.prepared.budget,
        shared,
    })
}

impl Driver {
    /// What every task is given.
    pub fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    /// The chunks the tasks must write (a resumed run's: only those without a receipt).
    pub fn chunks(&self) -> &[Chunk] {
        &self.opened.prepared.remaining
    }

    /// Release the snapshot and write the manifest from every receipt in the output (the
    /// tasks', and an earlier run's when resumed), as `sluice export` ends; `results` are the
    /// tasks' own accounts, for the report. Fails, writing no manifest, when a chunk has no
    /// receipt.
    pub async fn finish(self, results: Vec<TaskResult>) -> Result<Report> {
        let Driver {
            job,
            lock,
            opened,
            run_id,
            started,
            mut phases,
            monitor,
            spec: _,
        } = self;
        let Opened {
            mut coordinator,
            mut prepared,
            snapshot_since,
            server_version,
            ..
        } = opened;
        let harm = wind_down(
            &job,
            coordinator.as_mut(),
            &mut prepared,
            monitor,
            snapshot_since,
        )
        .await;
        prepared.notes.push(format!(
            "distributed: {} task(s) wrote the parts",
            results.len()
        ));
        let ctx = accounts(&job, &prepared, &results, coordinator);
        let finished = Finished::new(prepared, ctx, harm, run_id, server_version, started);
        let report = finish(&job, &lock, finished, &mut phases).await;
        lock.release().await;
        report
    }

    /// Give up (a task failed for good, or the caller stops): the snapshot is released and
    /// the output unlocked with no manifest; what the tasks committed stays for `--resume`.
    pub async fn abandon(self) {
        let Driver {
            lock,
            mut opened,
            monitor,
            mut phases,
            ..
        } = self;
        let _ = monitor.finish().await;
        let _ = opened.coordinator.release().await;
        phases.abandon();
        lock.release().await;
    }
}

/// The run's accounts in the shape `finish` reads them: the tasks' receipts, rows, bytes and
/// retries.
fn accounts(
    job: &ExportJob,
    prepared: &crate::prepare::Prepared,
    results: &[TaskResult],
    coordinator: Box<dyn sluice_core::Coordinator>,
) -> Arc<WorkerContext> {
    let counters = Arc::new(ReadCounters::default());
    counters
        .rows
        .store(results.iter().map(|r| r.rows_read).sum(), Ordering::Relaxed);
    counters.bytes.store(
        results.iter().map(|r| r.bytes_read).sum(),
        Ordering::Relaxed,
    );
    let parts: Vec<PartRecord> = results.iter().flat_map(|r| r.parts.clone()).collect();
    Arc::new(WorkerContext {
        queue: WorkQueue::new(Vec::new()),
        datasets: Default::default(),
        coordinator: Arc::new(Mutex::new(coordinator)),
        destination: job.destination.clone(),
        format: job.format.clone(),
        merge: job.merge,
        batch_bytes: prepared.budget.batch_bytes,
        retry: job.retry,
        snapshot_index: prepared.snapshot_index,
        counters,
        parts_done: Arc::new(AtomicU64::new(parts.len() as u64)),
        gate: Gate::open(),
        retries: AtomicU64::new(results.iter().map(|r| r.retries).sum()),
        committed: std::sync::Mutex::new(parts),
        writers: Writers::default(),
        longest_read_ms: AtomicU64::new(0),
        part_tag: None,
    })
}

/// A task: read `chunks` (of the plan [`Driver::chunks`] gave) under the driver's snapshot
/// and commit each as a part with its receipt, exactly as an export's worker does, with the
/// driver's budgets. Takes no lock and writes no run state: the driver holds both.
pub async fn write_parts(
    job: ExportJob,
    spec: &TaskSpec,
    chunks: Vec<Chunk>,
) -> Result<TaskResult> {
    let mut job = task(job, chunks.clone(), spec.shared.as_ref())?;
    job.chunks = None;
    let options = SourceOptions {
        session_tag: job
            .session_tag
            .clone()
            .unwrap_or_else(|| format!("sluice-{}", spec.run_id)),
        consistency: job.consistency,
        enable_row_security: job.enable_row_security,
    };
    let mut coordinator = job.source.open_coordinator(&options).await?;
    let opened = async {
        let discovered = coordinator.discover(&job.selection).await?;
        let datasets: Vec<_> = discovered
            .into_iter()
            .filter(|d| chunks.iter().any(|c| c.dataset == d.name))
            .collect();
        if let Some(c) = chunks
            .iter()
            .find(|c| !datasets.iter().any(|d| d.name == c.dataset))
        {
            return Err(Error::config(format!(
                "a chunk of {} was given, but the selection does not hold that dataset: give \
                 the tasks the driver's source and selection.",
                c.dataset
            )));
        }
        for d in &datasets {
            if spec.columns.get(&d.name) != Some(&column_records(d)) {
                return Err(Error::source_permanent(format!(
                    "{}: its columns are not the ones the driver planned the export with (the \
                     table was altered during the job); run the export again.",
                    d.name
                )));
            }
        }
        coordinator.pin_snapshot(&datasets).await?;
        let readers = coordinator.open_readers(1).await?;
        Ok((datasets, readers))
    }
    .await;
    let (datasets, readers) = match opened {
        Ok(o) => o,
        Err(e) => {
            let _ = coordinator.release().await;
            return Err(e);
        }
    };
    let ctx = Arc::new(WorkerContext {
        queue: WorkQueue::new(chunks),
        datasets: datasets.into_iter().map(|d| (d.name.clone(), d)).collect(),
        coordinator: Arc::new(Mutex::new(coordinator)),
        destination: job.destination.clone(),
        format: format_with_budget(&job.format, &spec.budget),
        merge: job.merge,
        batch_bytes: spec.budget.batch_bytes,
        retry: job.retry,
        snapshot_index: spec.snapshot_index,
        counters: Arc::new(ReadCounters::default()),
        parts_done: Arc::new(AtomicU64::new(0)),
        gate: Gate::open(),
        retries: AtomicU64::new(0),
        committed: std::sync::Mutex::new(Vec::new()),
        writers: Writers::default(),
        longest_read_ms: AtomicU64::new(0),
        part_tag: job.format.is_table().then(|| spec.run_id.clone()),
    });
    let (_cancel, cancel_rx) = watch::channel(false);
    let outcome = drive(ctx.clone(), readers, Arc::new(Silent), cancel_rx).await;
    let _ = ctx.coordinator.lock().await.release().await;
    outcome?;
    let parts = ctx
        .committed
        .lock()
        .map(|c| c.clone())
        .map_err(|_| Error::internal("a worker panicked while recording a part"))?;
    Ok(TaskResult {
        parts,
        rows_read: ctx.counters.rows.load(Ordering::Relaxed),
        bytes_read: ctx.counters.bytes.load(Ordering::Relaxed),
        retries: ctx.retries.load(Ordering::Relaxed),
    })
}
