//! The initial load: the export engine reads the source under a snapshot whose stream
//! position is exact, and its Arrow batches go straight into the target's bulk path on
//! parallel sessions instead of into files.
//!
//! The export runs unchanged (shared snapshot, chunking, retries, memory bounded by bytes)
//! with the in-memory Arrow format; a one-batch channel between the engine's part writers and
//! the loaders gives back-pressure. A load is not resumable part by part: a part the engine
//! retries after some of its batches were loaded would load them twice, so the load fails
//! instead, and an interrupted load starts over (the runner empties the tables first).

use super::ReplicateJob;
use crate::state::StreamState;
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use sluice_core::apply::TableKeys;
use sluice_core::change::Handoff;
use sluice_core::table::TableRef;
use sluice_core::{Error, Result, Retry};
use sluice_engine::Report;
use sluice_engine::manifest::Manifest;
use sluice_sink::layout::MANIFEST;
use sluice_sink::{
    ArrowOutput, BatchConsumer, Destination, FormatOptions, MemoryDestination, PartKey,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, watch};

struct Consumer {
    tx: Mutex<Option<mpsc::Sender<(String, RecordBatch)>>>,
    reloaded: AtomicBool,
}

impl BatchConsumer for Consumer {
    fn open(&self, _: &PartKey, _: &SchemaRef) -> Result<()> {
        Ok(())
    }

    fn deliver(&self, part: &PartKey, batch: RecordBatch) -> Result<()> {
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| Error::interrupted("the initial load stopped"))?;
        tokio::task::block_in_place(|| tx.blocking_send((part.dataset.clone(), batch)))
            .map_err(|_| Error::destination(Retry::Permanent, "the initial load's loaders stopped"))
    }

    fn finished(&self, _: &PartKey, _: u64) {}

    fn aborted(&self, _: &PartKey, delivered: u64) {
        if delivered > 0 {
            self.reloaded.store(true, Ordering::Relaxed);
        }
    }
}

/// The in-memory format an export job built for a load is checked with; `load` gives each
/// load its own consumer.
pub fn template_output() -> ArrowOutput {
    ArrowOutput(Arc::new(Consumer {
        tx: Mutex::new(None),
        reloaded: AtomicBool::new(false),
    }))
}

/// Load every table with `handoff` (`only`: the tables of those names, which joined the
/// replication after it started), recording each table's stream position in `state`.
/// Generated columns (`keys`) are read but not loaded: the target computes them or lacks
/// them.
pub(crate) async fn load(
    job: &ReplicateJob,
    state: &mut StreamState,
    keys: &[TableKeys],
    handoff: Handoff,
    only: Option<&[String]>,
    cancel: &watch::Receiver<bool>,
) -> Result<Report> {
    let (snapshot, hold) = state.take_handoff(handoff);
    super::save_state(job, state).await?;
    let tables: HashMap<String, (TableRef, Vec<String>)> = state
        .tables
        .iter()
        .filter(|(n, _)| only.is_none_or(|o| o.contains(n)))
        .map(|(n, t)| {
            let generated = keys
                .iter()
                .find(|k| k.table == t.table)
                .map(|k| k.generated.iter().map(|g| g.name.clone()).collect())
                .unwrap_or_default();
            (n.clone(), (job.on_target(&t.table), generated))
        })
        .collect();
    let workers = job.parallel.max(1);
    let (tx, rx) = mpsc::channel::<(String, RecordBatch)>(workers);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let mut loaders = Vec::new();
    for _ in 0..workers {
        let mut session = job.target.loader().await?;
        let rx = rx.clone();
        let tables = tables.clone();
        loaders.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some((dataset, batch)) = next else {
                    return Ok::<_, Error>(());
                };
                let (table, generated) = tables.get(&dataset).ok_or_else(|| {
                    Error::internal(format!("the load read {dataset}, which is not captured"))
                })?;
                let batch = without(batch, generated)?;
                session.load(table, &batch).await?;
            }
        }));
    }
    let consumer = Arc::new(Consumer {
        tx: Mutex::new(Some(tx)),
        reloaded: AtomicBool::new(false),
    });
    let memory = Arc::new(MemoryDestination::new());
    let source = job.capture.source.export_source(snapshot.as_ref());
    let mut export = (job.export)(source);
    export.format = FormatOptions::Arrow(ArrowOutput(consumer.clone()));
    export.destination = memory.clone();
    if let Some(names) = only {
        export.selection = state.exactly(names);
    }
    let result = sluice_engine::run_export(export, job.progress.clone(), cancel.clone()).await;
    if let Some(hold) = hold {
        let _ = hold.release().await;
    }
    consumer.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    let mut load_error = None;
    for l in loaders {
        let r = l
            .await
            .map_err(|e| Error::internal(format!("a loader failed: {e}")))
            .and_then(|r| r);
        if let (Err(e), None) = (r, &load_error) {
            load_error = Some(e);
        }
    }
    let report = result?;
    if let Some(e) = load_error {
        return Err(e);
    }
    if consumer.reloaded.load(Ordering::Relaxed) {
        return Err(Error::destination(
            Retry::Transient,
            "a part of the initial load failed after some of its rows were loaded; run the \
             same command again: the load starts over into emptied tables",
        ));
    }
    let bytes = memory
        .get(MANIFEST)
        .await?
        .ok_or_else(|| Error::internal("the initial load finished without a manifest"))?;
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| Error::internal(format!("the load's manifest cannot be read: {e}")))?;
    crate::snapshot::table_positions(job.capture.source.as_ref(), state, &manifest)?;
    match only {
        None => state.snapshot.done = true,
        Some(names) => {
            for (_, t) in state.tables.iter_mut().filter(|(n, _)| names.contains(n)) {
                if let Some(a) = &mut t.added {
                    a.snapshot_done = true;
                }
            }
        }
    }
    super::save_state(job, state).await?;
    Ok(report)
}

/// `batch` without the columns named in `drop`.
fn without(batch: RecordBatch, drop: &[String]) -> Result<RecordBatch> {
    if drop.is_empty() {
        return Ok(batch);
    }
    let keep: Vec<usize> = (0..batch.num_columns())
        .filter(|&i| !drop.contains(batch.schema().field(i).name()))
        .collect();
    Ok(batch.project(&keep)?)
}
