//! Taking the run's snapshot once the plan is known, and recording it: the sessions the run
//! will read with are reserved (engines whose workers must start under the snapshot's lock
//! connect them now, outside it), the snapshot is pinned, its position joins the run state's
//! list of snapshots, and `_sluice/run.json` is written before any part is read.

use crate::job::ExportJob;
use crate::manifest::{RunState, SnapshotRecord};
use sluice_core::{Coordinator, Dataset, Error, Result};
use sluice_sink::layout::RUN_STATE;

/// Pin the snapshot `workers` readers will read `datasets` under (reading nothing when
/// `workers` is 0: a resumed run whose parts are all written), record it in `state` and write
/// the run state. Returns the index parts of this run record as their snapshot.
pub async fn pin(
    job: &ExportJob,
    coordinator: &mut dyn Coordinator,
    state: &mut RunState,
    datasets: &[Dataset],
    workers: usize,
) -> Result<u32> {
    if workers > 0 {
        coordinator.reserve_readers(workers).await?;
    }
    let snapshot = coordinator.pin_snapshot(datasets).await?;
    let index = state.snapshots.len() as u32;
    state.snapshots.push(SnapshotRecord {
        index,
        id: snapshot.id,
        position: snapshot.position,
        taken_at: snapshot.taken_at,
        consistency: job.consistency.to_string(),
    });
    write_state(job, state).await?;
    sluice_core::failpoint::hit("export.after_plan")?;
    Ok(index)
}

/// Write `_sluice/run.json`.
pub async fn write_state(job: &ExportJob, state: &RunState) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| Error::internal(e.to_string()))?;
    job.destination.put(RUN_STATE, bytes).await
}
