//! Everything a run decides before it reads a row: the datasets, how the run starts with what
//! the output holds (`policy.rs`), which chunks it reads (`planning.rs`, `resume.rs`), the
//! snapshot (`snapshot.rs`), and the workers and memory budgets (`plan.rs`).

use crate::job::ExportJob;
use crate::manifest::RunState;
use crate::output::Prior;
use crate::phase::PhaseTimer;
use crate::plan::{self, Budget};
use crate::planning::{fresh, plan_inputs, refuse_duplicates};
use crate::policy::{self, Start};
use crate::{report, resume, snapshot};
use sluice_core::{Chunk, Consistency, Coordinator, Dataset, Error, Result};
use sluice_sink::columns::{Kind, table_schema};
use std::collections::{BTreeMap, HashSet};

/// What the run decided before reading, carried to the report.
pub(crate) struct Prepared {
    /// The datasets this run reads (those with chunks left; every one of the plan in a
    /// converged run, which rewrites them all).
    pub datasets: Vec<Dataset>,
    /// Every dataset's primary key as the catalog says now (the table formats' identifier
    /// fields), also of datasets an earlier run finished reading.
    pub keys: BTreeMap<String, Vec<String>>,
    /// The plan of the whole output, as written to `_sluice/run.json`.
    pub state: RunState,
    /// The chunks this run reads.
    pub remaining: Vec<Chunk>,
    /// Chunks already committed by an earlier run.
    pub skipped: usize,
    /// Index of the snapshot this run reads under.
    pub snapshot_index: u32,
    /// Workers.
    pub workers: usize,
    /// Workers the whole plan would get: what a converged run reads its changed keys again
    /// and rewrites its parts with, however few chunks a resumed run had left.
    pub plan_workers: usize,
    /// Byte budgets per worker.
    pub budget: Budget,
    /// The planner's predicted peak RSS for `workers` with `budget` and the destination's
    /// writer buffers (computed once, reported at the end).
    pub predicted_peak_rss: u64,
    /// Remarks for the report.
    pub notes: Vec<String>,
    /// Datasets the snapshot does not cover although the run reads under one, with why (from
    /// the coordinator's run facts, filled in after the workers finished).
    pub outside_snapshot: BTreeMap<String, String>,
}

/// What a table format does to the datasets' columns (for the report and `sluice plan`), or
/// the refusal of a column name it cannot hold — before anything is read.
pub(crate) fn table_notes(kind: Kind, datasets: &[Dataset]) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    for d in datasets {
        notes.extend(table_schema(kind, &d.name, &d.arrow_schema())?.notes);
    }
    Ok(notes)
}

/// `--overwrite` of an unfinished converged run by one of another consistency: what that run
/// kept on the source for `--resume` (a slot holding the source's log from its start) is
/// removed, or — without a change log to remove it with — named for the user to remove. A
/// converged run removes it itself when it begins.
async fn discard_converged(job: &ExportJob, previous: &Prior) -> Result<Vec<String>> {
    let Prior::Unfinished(state) = previous else {
        return Ok(Vec::new());
    };
    if state.converged.is_none() || job.consistency == Consistency::Converged {
        return Ok(Vec::new());
    }
    let Some(log) = &job.converge else {
        return Ok(vec![format!(
            "the replaced unfinished converged export may have kept a replication slot              (sluice_converged_…) on the source, which holds the source's log until it is              removed: drop it with pg_drop_replication_slot if it is there"
        )]);
    };
    let removed = log.discard().await?;
    if removed.is_empty() {
        return Ok(Vec::new());
    }
    let what = format!(
        "removed what the replaced unfinished converged export kept on the source: {}",
        removed.join(", ")
    );
    tracing::info!("{what}");
    Ok(vec![what])
}

/// Discover, plan (or reconcile the unfinished plan), pin the snapshot, write run.json.
pub(crate) async fn prepare(
    job: &ExportJob,
    coordinator: &mut dyn Coordinator,
    start: Start,
    run_id: &str,
    phases: &mut PhaseTimer,
) -> Result<Prepared> {
    let discovered = coordinator.discover(&job.selection).await?;
    refuse_duplicates(&discovered)?;
    match (&job.converge, job.consistency) {
        (Some(log), Consistency::Converged) => {
            crate::converge::check(job, log.as_ref(), &discovered).await?;
        }
        (None, Consistency::Converged) => {
            return Err(Error::config(
                "--consistency converged needs the source's change log, which this build of \
                 sluice was made without",
            ));
        }
        _ => {}
    }
    let names: Vec<String> = discovered.iter().map(|d| d.name.clone()).collect();
    let mut notes = Vec::new();
    if let Some(kind) = job.format.table_kind() {
        let Some(table) = &job.table else {
            return Err(Error::config(format!(
                "--format {} needs the table commit this build of sluice was made without",
                job.format.describe()
            )));
        };
        notes.extend(table_notes(kind, &discovered)?);
        table.check(&names).await?;
    }
    let inputs = plan_inputs(job).with_columns_of(&discovered);
    let sizing = plan::size(&discovered, &inputs);
    let (mut state, done) = match start {
        Start::Resume(state) => {
            resume::resume_plan(
                job,
                coordinator,
                *state,
                &discovered,
                sizing.chunk_bytes,
                &mut notes,
            )
            .await?
        }
        Start::AlreadyComplete => {
            return Err(Error::internal("a complete output reached planning"));
        }
        Start::Fresh => {
            policy::refuse_foreign_files(job, &names).await?;
            let state = fresh(job, coordinator, &discovered, run_id, sizing.chunk_bytes).await?;
            (state, HashSet::new())
        }
        Start::Overwrite(previous) => {
            notes.extend(discard_converged(job, &previous).await?);
            policy::clear_previous(job, &names, previous).await?;
            let state = fresh(job, coordinator, &discovered, run_id, sizing.chunk_bytes).await?;
            (state, HashSet::new())
        }
    };
    let remaining: Vec<Chunk> = state
        .chunks
        .iter()
        .filter(|c| !done.contains(&(c.dataset.clone(), c.ordinal)))
        .cloned()
        .collect();
    let reading: HashSet<&str> = remaining.iter().map(|c| c.dataset.as_str()).collect();
    let keys = discovered
        .iter()
        .map(|d| (d.name.clone(), d.primary_key.clone()))
        .collect();
    // A converged run follows and rewrites every dataset of the plan, read by this run or not.
    let converged = job.consistency == Consistency::Converged;
    let datasets: Vec<Dataset> = discovered
        .into_iter()
        .filter(|d| converged || reading.contains(d.name.as_str()))
        .collect();
    phases.enter("snapshot");
    let workers = sizing.workers.min(remaining.len()).max(1);
    let readers = if remaining.is_empty() { 0 } else { workers };
    let snapshot_index = snapshot::pin(job, coordinator, &mut state, &datasets, readers).await?;
    let skipped = state.chunks.len() - remaining.len();
    let budget = plan::budget(workers, &inputs);
    let predicted = plan::predicted_peak_rss(workers, &budget, &inputs);
    notes.extend(sizing.notes.iter().cloned());
    notes.extend(plan::memory_note(workers, predicted, &inputs));
    notes.extend(report::plan_notes(job, state.snapshots.len()));
    Ok(Prepared {
        datasets,
        keys,
        state,
        remaining,
        skipped,
        snapshot_index,
        workers,
        plan_workers: sizing.workers.max(1),
        budget,
        predicted_peak_rss: predicted,
        notes,
        outside_snapshot: BTreeMap::new(),
    })
}
