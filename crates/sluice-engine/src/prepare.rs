//! Everything a run decides before it reads a row: what the output holds, which chunks this run
//! reads (a fresh plan, or the unfinished plan reconciled with the catalog — see
//! [`crate::resume`]), the snapshot, and `_sluice/run.json`.

use crate::export::{column_records, kind_name, now_rfc3339, plan_all, plan_inputs};
use crate::job::ExportJob;
use crate::phase::PhaseTimer;
use crate::plan::{self, Budget};
use crate::resume::{self, Prior};
use crate::worker::blocking;
use sluice_core::{Chunk, Consistency, Coordinator, Dataset, Error, Result};
use sluice_sink::layout::{self, MANIFEST, RUN_STATE};
use sluice_sink::manifest::{DatasetRecord, MANIFEST_VERSION, Manifest, RunState, SnapshotRecord};
use std::collections::BTreeMap;
use std::collections::HashSet;

/// What the run decided before reading, carried to the report.
pub(crate) struct Prepared {
    /// The datasets this run reads (those with chunks left).
    pub datasets: Vec<Dataset>,
    /// The plan of the whole output, as written to `_sluice/run.json`.
    pub state: RunState,
    /// The chunks this run reads.
    pub remaining: Vec<Chunk>,
    /// Chunks already committed by an earlier run.
    pub skipped: usize,
    /// Workers.
    pub workers: usize,
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

/// The run-state record of a discovered dataset (no parts yet).
pub(crate) fn record_of(d: &Dataset) -> DatasetRecord {
    DatasetRecord {
        name: d.name.clone(),
        kind: kind_name(d.kind),
        columns: column_records(d),
        relations: if d.kind == sluice_core::DatasetKind::Partitioned {
            d.relations.iter().map(|r| r.table.to_string()).collect()
        } else {
            Vec::new()
        },
        outside_snapshot: d.outside_snapshot.clone(),
        outside_snapshot_reason: None,
        row_security_filtered: d.row_security_filtered,
        guarantee: None,
        rows: 0,
        bytes: 0,
        parts: Vec::new(),
        merged: None,
    }
}

fn duplicates(datasets: &[Dataset]) -> Result<()> {
    let mut seen = HashSet::new();
    for d in datasets {
        if !seen.insert(d.name.as_str()) {
            return Err(Error::config(format!(
                "two datasets are named {:?} (a query and a table, or two objects whose names \
                 differ only in a way the output cannot show); rename the --query, or select \
                 one of them.",
                d.name
            )));
        }
    }
    Ok(())
}

/// Resolve what to do: fresh plan or resumed plan, output checks, snapshot pin, run.json.
pub(crate) async fn prepare(
    job: &ExportJob,
    coordinator: &mut dyn Coordinator,
    prior: Prior,
    run_id: &str,
    phases: &mut PhaseTimer,
) -> Result<Prepared> {
    let dest = job.destination.clone();
    let discovered = coordinator.discover(&job.selection).await?;
    duplicates(&discovered)?;
    let inputs = plan_inputs(job).with_columns_of(&discovered);
    let sizing = plan::size(&discovered, &inputs);
    let mut notes = Vec::new();
    let ext = job.format.extension().to_string();
    let names: Vec<String> = discovered.iter().map(|d| d.name.clone()).collect();
    let records: Vec<DatasetRecord> = discovered.iter().map(record_of).collect();
    let resuming = match prior {
        Prior::Unfinished(state) if job.resume && !job.overwrite => Some(*state),
        Prior::Fresh => {
            refuse_foreign_files(job, &names).await?;
            None
        }
        previous => {
            // --overwrite: forget the previous export, whatever datasets it had.
            let mut all: HashSet<String> = names.iter().cloned().collect();
            if let Prior::Unfinished(state) = &previous {
                all.extend(state.datasets.iter().map(|d| d.name.clone()));
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
            resume_plan(
                job,
                coordinator,
                state,
                &discovered,
                &records,
                sizing.chunk_bytes,
                &mut notes,
            )
            .await?
        }
        None => {
            let chunks = plan_all(coordinator, &discovered, job, sizing.chunk_bytes).await?;
            let state = RunState {
                manifest_version: MANIFEST_VERSION,
                run_id: run_id.to_string(),
                started_at: now_rfc3339(),
                request: Some(job.request()),
                consistency: job.consistency.to_string(),
                extension: ext.clone(),
                snapshots: Vec::new(),
                datasets: records,
                chunks,
            };
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
    let datasets: Vec<Dataset> = discovered
        .into_iter()
        .filter(|d| reading.contains(d.name.as_str()))
        .collect();
    phases.enter("snapshot");
    // Engines whose workers must start their transactions under the snapshot's lock (MySQL)
    // open those sessions now, as many as the run will use (see `workers` below).
    if !remaining.is_empty() {
        coordinator
            .reserve_readers(sizing.workers.min(remaining.len()).max(1))
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
    let skipped = state.chunks.len() - remaining.len();
    let workers = sizing.workers.min(remaining.len()).max(1);
    let budget = plan::budget(workers, &inputs);
    let predicted = plan::predicted_peak_rss(workers, &budget, &inputs);
    notes.extend(sizing.notes.iter().cloned());
    notes.extend(plan::memory_note(workers, predicted, &inputs));
    if job.consistency == Consistency::Chunk {
        notes.push(
            "consistency chunk: each part was read in its own transaction, so the output is not \
             one point in time; each dataset's guarantee (below, and \"guarantee\" in \
             manifest.json) says what its rows are"
                .into(),
        );
    }
    if state.snapshots.len() > 1 {
        notes.push(format!(
            "resumed: the parts come from {} snapshots (see manifest.json \"snapshots\" and each \
             part's \"snapshot\"); each dataset's guarantee says what that means for its rows",
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
        outside_snapshot: BTreeMap::new(),
    })
}

/// A fresh run refuses to write into dataset directories that already hold files.
async fn refuse_foreign_files(job: &ExportJob, names: &[String]) -> Result<()> {
    let dest = job.destination.clone();
    let n = names.to_vec();
    let e = job.format.extension().to_string();
    let existing = blocking(move || resume::dataset_files(dest.as_ref(), &n, &e)).await?;
    if let Some(f) = existing.first() {
        return Err(Error::config(format!(
            "{}/{f} already exists and was not written by an unfinished sluice run. Choose an \
             empty --to, or use --overwrite to replace the dataset directories.",
            job.destination.display()
        )));
    }
    Ok(())
}

/// The unfinished run's plan made right for this run (see [`crate::resume`]): refuses a
/// different request, keeps what receipts vouch for, re-plans what cannot be trusted or is
/// new, and removes everything else. Returns the plan and the chunks already done.
async fn resume_plan(
    job: &ExportJob,
    coordinator: &mut dyn Coordinator,
    mut state: RunState,
    discovered: &[Dataset],
    records: &[DatasetRecord],
    chunk_bytes: u64,
    notes: &mut Vec<String>,
) -> Result<(RunState, HashSet<(String, u32)>)> {
    let dest = job.destination.clone();
    let shown = dest.display();
    let request = job.request();
    match &state.request {
        None => {
            return Err(Error::config(format!(
                "the unfinished export in {shown} was started by an older sluice that did not \
                 record its options, so --resume cannot check it is the same request. Use \
                 --overwrite to start over."
            )));
        }
        Some(old) => {
            let diffs = old.differences(&request);
            if !diffs.is_empty() {
                return Err(Error::config(format!(
                    "--resume needs the same request as the unfinished run in {shown}, but this \
                     one differs: {}. Repeat the original command with --resume, or use \
                     --overwrite to start over with this one.",
                    diffs.join("; ")
                )));
            }
        }
    }
    let all = {
        let d = dest.clone();
        blocking(move || resume::receipts(d.as_ref())).await?
    };
    let existing: HashSet<String> = {
        let d = dest.clone();
        let n: Vec<String> = state.datasets.iter().map(|r| r.name.clone()).collect();
        let e = state.extension.clone();
        blocking(move || resume::dataset_files(d.as_ref(), &n, &e))
            .await?
            .into_iter()
            .collect()
    };
    let valid: Vec<_> = resume::matching(&all, &state.chunks)
        .into_iter()
        .filter(|r| existing.contains(&r.file))
        .cloned()
        .collect();
    let mut done: HashSet<(String, u32)> = valid
        .iter()
        .map(|r| (r.dataset.clone(), r.ordinal))
        .collect();
    let decided = resume::reconcile(&state, &done, records);
    if !decided.lost.is_empty() {
        return Err(Error::config(format!(
            "--resume cannot finish {}: the unfinished run had not read all of it, and the \
             source no longer has it (dropped or renamed, or no longer matching --tables / \
             --schema). Use --overwrite to start over.",
            decided.lost.join(", ")
        )));
    }
    let new: Vec<String> = decided
        .replan
        .iter()
        .filter(|(_, why)| *why == resume::Replan::New)
        .map(|(n, _)| n.clone())
        .collect();
    refuse_foreign_files(job, &new).await?;
    for (name, _) in &decided.replan {
        let Some(ds) = discovered.iter().find(|d| &d.name == name) else {
            continue;
        };
        done.retain(|(dataset, _)| dataset != name);
        state.chunks.retain(|c| &c.dataset != name);
        let chunks = plan_all(coordinator, std::slice::from_ref(ds), job, chunk_bytes).await?;
        state.chunks.extend(chunks);
        let record = record_of(ds);
        match state.datasets.iter_mut().find(|r| &r.name == name) {
            Some(r) => *r = record,
            None => state.datasets.push(record),
        }
    }
    let kept: Vec<_> = valid
        .iter()
        .filter(|r| done.contains(&(r.dataset.clone(), r.ordinal)))
        .collect();
    let files: HashSet<String> = kept.iter().map(|r| r.file.clone()).collect();
    let receipts: HashSet<String> = kept
        .iter()
        .map(|r| layout::receipt_path(&r.dataset, r.ordinal))
        .collect();
    let d = dest.clone();
    let n: Vec<String> = state.datasets.iter().map(|r| r.name.clone()).collect();
    let removed =
        blocking(move || resume::remove_unvouched(d.as_ref(), &n, &receipts, &files)).await?;
    if removed > 0 {
        tracing::info!(
            "removed {removed} file(s) of the interrupted run that no receipt of this plan vouches \
             for (temporaries, parts without receipts, parts of datasets read again)"
        );
    }
    notes.extend(decided.notes);
    Ok((state, done))
}
