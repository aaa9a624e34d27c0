//! A capture's first start, the same for every output: the source's checks, its capture objects
//! created (PostgreSQL: slot and publication, the snapshot exported), the state every output
//! keeps built from what was created, and everything undone when the state cannot be saved.
//! What differs — where the state is saved, what the snapshot is written into — stays with
//! the caller (`run.rs` for change files, `apply/mod.rs` for a target database).

use crate::job::Capture;
use crate::state::{Committed, STATE_VERSION, SnapshotState, StreamState, TableState};
use sluice_core::change::{CaptureNames, ChangeSource, Created, Handoff};
use sluice_core::{Dataset, Error, Result};
use std::collections::BTreeMap;

/// Check the source and start the capture (its server objects created, where it keeps any),
/// and the state of the capture just created ([`new_state`]; `extension`: the change files',
/// empty for an output without files). `occupied`: the error for server objects that exist
/// already with no state of this run (another run's), worded by the caller around the
/// objects' description.
pub(crate) async fn create(
    capture: &Capture,
    names: &CaptureNames,
    datasets: &[Dataset],
    snapshot: bool,
    extension: &str,
    occupied: impl FnOnce(String) -> Error,
) -> Result<(Created, StreamState)> {
    let source = capture.source.as_ref();
    source.check(datasets).await?;
    if let Some(objects) = source.server_objects()
        && objects.exists(names).await?
    {
        return Err(occupied(objects.describe(names)));
    }
    let created = source.start(names, datasets, snapshot).await?;
    let state = new_state(source, names, datasets, &created, snapshot, extension).await?;
    Ok((created, state))
}

/// The state of a capture just `created`: every table from the capture's position (its
/// snapshot's, when there is one), nothing written yet.
async fn new_state(
    source: &dyn ChangeSource,
    names: &CaptureNames,
    datasets: &[Dataset],
    created: &Created,
    snapshot: bool,
    extension: &str,
) -> Result<StreamState> {
    let tables: BTreeMap<String, TableState> = datasets
        .iter()
        .filter_map(|d| {
            let t = d.object.clone()?;
            Some((
                d.name.clone(),
                TableState {
                    table: t,
                    snapshot_position: snapshot.then(|| created.position.clone()),
                    versions: Vec::new(),
                    missing: Vec::new(),
                    columns: None,
                    added: None,
                    dropped: None,
                },
            ))
        })
        .collect();
    Ok(StreamState {
        version: STATE_VERSION,
        engine: source.engine(),
        source: source.display_url(),
        names: names.clone(),
        publication_created: created.publication_created,
        extension: extension.to_string(),
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
        layout: source.layout(datasets).await?,
        ops: None,
        before_images: false,
    })
}

/// Undo a first start whose state could not be saved: a failed first start leaves no capture
/// object behind (a slot nobody reads would keep the source's log).
pub(crate) async fn abandon(source: &dyn ChangeSource, names: &CaptureNames, created: Created) {
    if let Some(Handoff::Held(h)) = created.handoff {
        let _ = h.hold.release().await;
    }
    if let Some(objects) = source.server_objects() {
        let _ = objects.remove(names, created.publication_created).await;
    }
}
