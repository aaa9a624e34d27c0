//! The initial snapshot: written through the export engine under a snapshot whose stream
//! position is exact, and resumed table by table.
//!
//! Why a table's changes are filtered by its own snapshot position: a resumed snapshot reads
//! the unfinished tables under a later snapshot (exact position L2) while the slot still streams
//! from the first one's (L1). A table read at L has every transaction whose commit record
//! starts before L, and none from L on (both PostgreSQL snapshots are a slot's, whose
//! consistent point is exact); the stream from L1 holds every transaction from L1 on, in order.
//! Writing a table's changes of transactions at or after its L therefore writes each
//! transaction exactly once for it: the ones before L are in its snapshot, the ones after in
//! its change files.
//!
//! MySQL and MariaDB cannot hand a snapshot to the export: the export takes its own (every
//! worker starts a consistent snapshot under a brief global lock) and records the binary log
//! position read under that lock in its manifest, which is exact. The stream starts at the
//! position read before the export (never later than any snapshot's), and each table's changes
//! are kept from its snapshot's position on ([`ChangeSource::manifest_position`]); the argument
//! above holds unchanged, with "commit record" read as "the transaction's first binary log
//! event" (a transaction's events are written to the binary log together, at commit).
//!
//! A converged snapshot (`--consistency converged`, [`CONVERGED`]) holds no snapshot at all:
//! the stream's slot is created without one (its position C), the export reads each chunk in
//! a short transaction while following the slot's log from C ([`ConvergeLog::borrowed`]), and
//! makes every part equal to its table before the end point T it records in the manifest.
//! Every table's changes are then kept from T on, and the argument above holds with T as L.
//!
//! [`ChangeSource::manifest_position`]: sluice_core::change::ChangeSource::manifest_position
//! [`ConvergeLog::borrowed`]: crate::converge::ConvergeLog::borrowed

use crate::converge::ConvergeLog;
use crate::job::{StreamJob, save};
use crate::state::StreamState;
use sluice_core::change::{CaptureNames, ChangeSource, Handoff};
use sluice_core::{Consistency, Dataset, Error, Position, Result, StreamPos};
use sluice_engine::Report;
use sluice_engine::manifest::Manifest;
use sluice_engine::output::Prior;
use sluice_sink::layout::{MANIFEST, dataset_dir};
use sluice_sink::{Destination, OutputLock};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// Remove the parts and receipts of datasets the interrupted export started but did not
/// finish, so the resumed export reads each of them whole under its new snapshot (a table's
/// rows must all come from one snapshot, whose position filters its changes).
pub(crate) async fn clear_unfinished(dest: &dyn Destination, ext: &str) -> Result<Vec<String>> {
    let Prior::Unfinished(run) = sluice_engine::output::inspect(dest).await? else {
        return Ok(Vec::new());
    };
    let mut planned: HashMap<String, u64> = HashMap::new();
    for c in &run.chunks {
        *planned.entry(c.dataset.clone()).or_default() += 1;
    }
    let mut cleared = Vec::new();
    for (ds, n) in planned {
        let dir = dataset_dir(&ds);
        let receipts = dest.list(&format!("_sluice/parts/{dir}/")).await?;
        let done = receipts
            .iter()
            .filter(|r| r.path.ends_with(".json"))
            .count() as u64;
        if done == 0 || done == n {
            continue;
        }
        for r in &receipts {
            dest.delete(&r.path).await?;
        }
        for f in dest.list(&format!("{dir}/")).await? {
            let name = f.path.rsplit('/').next().unwrap_or_default();
            let part = name.starts_with("part-") || name.starts_with(".part-");
            if part && !f.path.contains("/changes/") && f.path.contains(ext) {
                dest.delete(&f.path).await?;
            }
        }
        cleared.push(ds);
    }
    Ok(cleared)
}

/// `StreamState::snapshot.initial` of a converged snapshot.
pub(crate) const CONVERGED: &str = "converged";

/// The state of a capture whose initial snapshot converges on its log: not done yet, each
/// table's position known only once the export has its end point.
pub(crate) fn converged_state(state: &mut StreamState) {
    state.snapshot.initial = CONVERGED.into();
    state.snapshot.done = false;
}

/// What an export would refuse of a converged snapshot of `datasets` (no key, a format whose
/// parts cannot be rewritten, a source without the log), asked before the capture is created.
pub(crate) async fn check_converged(
    job: &StreamJob,
    names: &CaptureNames,
    datasets: &[Dataset],
) -> Result<()> {
    let source = job.capture.source.clone();
    let export = (job.export)(source.export_source(None));
    let log = ConvergeLog::borrowed(source, names.clone(), StreamPos::default(), export.memory);
    sluice_engine::converge::check(&export, &log, datasets).await
}

pub(crate) async fn resume_snapshot(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    state: &mut StreamState,
    cancel: &watch::Receiver<bool>,
) -> Result<Report> {
    if state.snapshot.initial == CONVERGED {
        // The export resumes itself: its receipts, and the start its run.json recorded.
        return snapshot_phase(job, lock, state, Handoff::FromExportManifest, true, cancel).await;
    }
    let cleared = clear_unfinished(job.destination.as_ref(), &state.extension).await?;
    if !cleared.is_empty() {
        tracing::info!(
            "resuming the initial snapshot: {} will be read again whole under a new snapshot",
            cleared.join(", ")
        );
    }
    let handoff = job.capture.source.handoff().await?;
    snapshot_phase(job, lock, state, handoff, true, cancel).await
}

/// Write the initial snapshot (or finish an interrupted one) with `handoff`, with the output's
/// lock the run holds (`lock`).
pub(crate) async fn snapshot_phase(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    state: &mut StreamState,
    handoff: Handoff,
    resume: bool,
    cancel: &watch::Receiver<bool>,
) -> Result<Report> {
    let (snapshot, hold) = state.take_handoff(handoff);
    save(job, state).await?;
    let source = job.capture.source.export_source(snapshot.as_ref());
    let mut export = (job.export)(source);
    if state.snapshot.initial == CONVERGED {
        // The state decides, whatever this run's options say: the stream's own slot is C.
        export.consistency = Consistency::Converged;
        export.converge = Some(Arc::new(ConvergeLog::borrowed(
            job.capture.source.clone(),
            state.names.clone(),
            state.committed.restart.clone(),
            export.memory,
        )));
    } else if export.consistency == Consistency::Converged {
        export.consistency = Consistency::Snapshot;
        export.converge = None;
    }
    export.destination = job.destination.clone();
    export.resume = resume;
    export.held_lock = Some(lock.clone());
    let result = sluice_engine::run_export(export, job.progress.clone(), cancel.clone()).await;
    if let Some(hold) = hold {
        let _ = hold.release().await;
    }
    let report = result.map_err(|e| {
        e.then(format!(
            "The initial snapshot is unfinished: run the same sluice stream command again to \
             finish it (only unfinished tables are read again), or sluice stream --drop to give \
             up. {}",
            job.capture
                .source
                .while_stopped(&state.names, "sluice stream")
        ))
    })?;
    let d = job.destination.clone();
    let bytes = d
        .get(MANIFEST)
        .await?
        .ok_or_else(|| Error::internal("the initial snapshot finished without a manifest"))?;
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| Error::internal(format!("the snapshot's manifest cannot be read: {e}")))?;
    table_positions(job.capture.source.as_ref(), state, &manifest)?;
    state.snapshot.done = true;
    save(job, state).await?;
    Ok(report)
}

/// Each table's stream position from the snapshot its parts were read under (the export's
/// manifest): the exact position the source reports for it, or the one recorded when the
/// snapshot was taken.
pub(crate) fn table_positions(
    source: &dyn ChangeSource,
    state: &mut StreamState,
    manifest: &Manifest,
) -> Result<()> {
    if let Some(c) = &manifest.converged {
        // Every table equals its rows before T: its changes are kept from T on.
        let t = StreamPos::from_adapter(c.end.clone());
        for ds in &manifest.datasets {
            if let Some(table) = state.tables.get_mut(&ds.name) {
                table.snapshot_position = Some(t.clone());
            }
        }
        return Ok(());
    }
    for ds in &manifest.datasets {
        let Some(idx) = ds.parts.iter().map(|p| p.snapshot).max() else {
            continue;
        };
        let Some(snap) = manifest.snapshots.iter().find(|s| s.index == idx) else {
            continue;
        };
        let exact = source.manifest_position(&snap.position)?;
        let pos = exact
            .or_else(|| {
                state
                    .snapshot
                    .positions
                    .iter()
                    .find(|(p, _)| same_position(p, &snap.position))
                    .map(|(_, pos)| pos.clone())
            })
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
    Ok(())
}

fn same_position(a: &Position, b: &Position) -> bool {
    a == b
}
