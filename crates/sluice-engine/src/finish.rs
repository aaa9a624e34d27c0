//! The end of a run: the manifest (from the plan and every receipt, written last), with what
//! each dataset's rows are guaranteed to be; then the report (`report.rs`).

use crate::job::ExportJob;
use crate::manifest::{
    ConvergedRecord, DatasetRecord, Guarantee, HarmRecord, MANIFEST_VERSION, Manifest,
    MergedRecord, PartRecord, SourceRecord,
};
use crate::output;
use crate::phase::PhaseTimer;
use crate::planning::now_rfc3339;
use crate::prepare::Prepared;
use crate::report::{Outcome, Report};
use crate::worker::WorkerContext;
use sluice_core::{Chunk, ChunkBounds, Consistency, Error, Result};
use sluice_sink::destination::on_blocking;
use sluice_sink::layout::{self, MANIFEST};
use sluice_sink::table::{TableCommit, TableFile};
use sluice_sink::{OutputLock, merge};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What a run that read everything hands to [`finish`].
pub(crate) struct Finished {
    pub prepared: Prepared,
    pub ctx: Arc<WorkerContext>,
    pub harm: HarmRecord,
    pub run_id: String,
    pub server_version: String,
    pub started: Instant,
    /// How a converged run reached its point in time (`--consistency converged` only).
    pub converged: Option<ConvergedRecord>,
}

impl Finished {
    /// What [`finish`] needs of a run whose workers are done and whose coordinator wound down.
    pub(crate) fn new(
        prepared: Prepared,
        ctx: Arc<WorkerContext>,
        harm: HarmRecord,
        run_id: String,
        server_version: String,
        started: Instant,
    ) -> Finished {
        Finished {
            prepared,
            ctx,
            harm,
            run_id,
            server_version,
            started,
            converged: None,
        }
    }
}

/// What the rows of a dataset are guaranteed to be, from how its chunks were planned and which
/// snapshot each part was read under (see [`Guarantee`]).
pub fn guarantee(consistency: Consistency, chunks: &[&Chunk], parts: &[PartRecord]) -> Guarantee {
    let first = parts.first().map(|p| p.snapshot).unwrap_or(0);
    if consistency == Consistency::Snapshot && parts.iter().all(|p| p.snapshot == first) {
        return Guarantee::Snapshot { snapshot: first };
    }
    if chunks.len() <= 1 {
        return Guarantee::Transaction;
    }
    if chunks.iter().any(|c| c.is_physical()) {
        return Guarantee::PhysicalRanges;
    }
    let key = chunks
        .iter()
        .find_map(|c| match &c.bounds {
            ChunkBounds::Keys { columns, .. } | ChunkBounds::KeyNulls { columns } => {
                Some(columns.clone())
            }
            _ => None,
        })
        .unwrap_or_default();
    Guarantee::KeyRanges { key }
}

/// Write the manifest from the plan and every receipt (merging first with `--merge`), and
/// build the report.
pub(crate) async fn finish(
    job: &ExportJob,
    lock: &Arc<dyn OutputLock>,
    run: Finished,
    phases: &mut PhaseTimer,
) -> Result<Report> {
    phases.enter(if job.merge { "merge" } else { "manifest" });
    let dest = job.destination.clone();
    let all = output::receipts(dest.as_ref()).await?;
    let state = &run.prepared.state;
    let receipts = output::matching(&all, &state.chunks);
    let mut datasets = Vec::new();
    for rec in &state.datasets {
        let mut parts: Vec<PartRecord> = receipts
            .iter()
            .filter(|r| r.dataset == rec.name)
            .map(|r| (*r).clone())
            .collect();
        parts.sort_by_key(|p| p.ordinal);
        let chunks: Vec<&Chunk> = state
            .chunks
            .iter()
            .filter(|c| c.dataset == rec.name)
            .collect();
        if parts.len() != chunks.len() {
            return Err(Error::internal(format!(
                "{}: {} of {} parts have receipts after all workers finished",
                rec.name,
                parts.len(),
                chunks.len()
            )));
        }
        let rows: u64 = parts.iter().map(|p| p.rows).sum();
        let merged = if job.merge {
            let target = layout::merged_path(&rec.name, job.format.extension());
            let files: Vec<(String, u64)> =
                parts.iter().map(|p| (p.file.clone(), p.bytes)).collect();
            let (d, f, t) = (dest.clone(), job.format.clone(), target.clone());
            sluice_core::failpoint::hit("export.before_merge")?;
            let stats = on_blocking(move || merge::merge(&d, &f, &files, rows, &t)).await?;
            Some(MergedRecord {
                file: target,
                rows,
                bytes: stats.bytes,
                xxh3_128: stats.xxh3_128,
            })
        } else {
            None
        };
        let mut outside_snapshot = rec.outside_snapshot.clone();
        let mut outside_snapshot_reason = rec.outside_snapshot_reason.clone();
        if let Some(why) = run.prepared.outside_snapshot.get(&rec.name) {
            outside_snapshot = vec![rec.name.clone()];
            outside_snapshot_reason = Some(why.clone());
        } else if !outside_snapshot.is_empty() && outside_snapshot_reason.is_none() {
            outside_snapshot_reason = Some(
                "foreign tables: their rows were read from their server or file when their part \
                 was read, not as of the snapshot"
                    .into(),
            );
        }
        datasets.push(DatasetRecord {
            rows,
            outside_snapshot,
            outside_snapshot_reason,
            bytes: merged
                .as_ref()
                .map(|m| m.bytes)
                .unwrap_or_else(|| parts.iter().map(|p| p.bytes).sum()),
            guarantee: Some(match &run.converged {
                Some(c) => Guarantee::Converged { end: c.end.clone() },
                None => guarantee(job.consistency, &chunks, &parts),
            }),
            parts,
            merged,
            ..rec.clone()
        });
    }
    if job.format.is_table() {
        phases.enter("commit");
        commit_tables(job, &run, &datasets).await?;
    }
    let manifest = Manifest {
        manifest_version: MANIFEST_VERSION,
        tool: format!("sluice {}", env!("CARGO_PKG_VERSION")),
        run_id: run.run_id.clone(),
        source: SourceRecord {
            engine: job.source.engine().to_string(),
            url: job.source.display_url(),
            server_version: run.server_version.clone(),
        },
        consistency: job.consistency.to_string(),
        request: job.request(),
        snapshots: state.snapshots.clone(),
        format: job.format.describe(),
        started_at: state.started_at.clone(),
        finished_at: now_rfc3339(),
        datasets: datasets.clone(),
        harm: run.harm.clone(),
        converged: run.converged.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::internal(e.to_string()))?;
    if job.merge {
        phases.enter("manifest");
    }
    sluice_core::failpoint::hit("export.before_manifest")?;
    // Another run may have taken the output over if this one looked dead (object stores):
    // then this run must not declare the output complete.
    lock.check()?;
    dest.put(MANIFEST, bytes).await?;
    if job.merge {
        // The merged files and the manifest are durable: the parts are no longer needed.
        for d in &datasets {
            for p in &d.parts {
                dest.delete(&p.file).await?;
            }
        }
    }
    let committed = run
        .ctx
        .committed
        .lock()
        .map(|c| c.clone())
        .unwrap_or_default();
    let position = state
        .snapshots
        .last()
        .map(|s| s.position.to_string())
        .unwrap_or_default();
    Ok(Report::build(
        Outcome {
            job,
            run_id: run.run_id,
            server_version: run.server_version,
            started: run.started,
            position,
            already_complete: false,
            counters: Some(&run.ctx.counters),
            committed,
            skipped: run.prepared.skipped,
            workers: run.prepared.workers,
            batch_bytes: run.prepared.budget.batch_bytes,
            predicted_peak_rss: run.prepared.predicted_peak_rss,
            retries: run.ctx.retries.load(Ordering::Relaxed),
            harm: run.harm,
            datasets: &datasets,
            notes: run.prepared.notes,
        },
        phases,
    ))
}

/// One table commit per dataset (a table format), before the manifest: a run killed between
/// the two is resumed, finds its commit by the export's id, and does not make it twice.
async fn commit_tables(job: &ExportJob, run: &Finished, datasets: &[DatasetRecord]) -> Result<()> {
    let committer = job
        .table
        .as_ref()
        .ok_or_else(|| Error::internal("a table format without a table committer"))?;
    let state = &run.prepared.state;
    let position = state
        .snapshots
        .last()
        .map(|s| s.position.to_string())
        .unwrap_or_default();
    for d in datasets {
        let dir = layout::dataset_dir(&d.name);
        let files = d
            .parts
            .iter()
            .map(|p| TableFile {
                path: p
                    .file
                    .strip_prefix(&format!("{dir}/"))
                    .unwrap_or(&p.file)
                    .to_string(),
                bytes: p.bytes,
                rows: p.rows,
            })
            .collect();
        let mut properties = BTreeMap::new();
        properties.insert("sluice.run_id".into(), state.run_id.clone());
        properties.insert(
            "sluice.source.engine".into(),
            job.source.engine().to_string(),
        );
        properties.insert("sluice.source.position".into(), position.clone());
        properties.insert("sluice.consistency".into(), job.consistency.to_string());
        if let Some(g) = &d.guarantee {
            properties.insert("sluice.guarantee".into(), g.describe());
        }
        properties.insert("sluice.dataset".into(), d.name.clone());
        properties.insert("sluice.rows".into(), d.rows.to_string());
        sluice_core::failpoint::hit("export.before_table_commit")?;
        let done = committer
            .commit(TableCommit {
                dir,
                dataset: d.name.clone(),
                key: run.prepared.keys.get(&d.name).cloned().unwrap_or_default(),
                files,
                export_id: state.run_id.clone(),
                properties,
            })
            .await?;
        sluice_core::failpoint::hit("export.after_table_commit")?;
        tracing::info!(
            "{}: table version {}{}{}",
            d.name,
            done.version,
            if done.made {
                ""
            } else {
                " (committed by the interrupted run)"
            },
            if done.removed > 0 {
                format!(", {} file(s) of the earlier version replaced", done.removed)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// The report of a run that found the same request already complete.
pub(crate) fn already_complete(
    job: &ExportJob,
    run_id: String,
    started: Instant,
    phases: &mut PhaseTimer,
) -> Report {
    Report::build(
        Outcome {
            job,
            run_id,
            server_version: String::new(),
            started,
            position: String::new(),
            already_complete: true,
            counters: None,
            committed: Vec::new(),
            skipped: 0,
            workers: 0,
            batch_bytes: 0,
            predicted_peak_rss: 0,
            retries: 0,
            harm: HarmRecord::default(),
            datasets: &[],
            notes: Vec::new(),
        },
        phases,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(snapshot: u32) -> PartRecord {
        PartRecord {
            dataset: "d".into(),
            ordinal: 0,
            file: String::new(),
            rows: 0,
            bytes: 0,
            xxh3_128: String::new(),
            snapshot,
            range: String::new(),
        }
    }

    fn chunk(bounds: ChunkBounds) -> Chunk {
        Chunk {
            dataset: "d".into(),
            ordinal: 0,
            relation: None,
            bounds,
            est_bytes: 0,
            est_rows: 0,
        }
    }

    #[test]
    fn guarantees_follow_how_parts_were_read() {
        let pages = chunk(ChunkBounds::Pages {
            first: 0,
            end: None,
        });
        let keys = chunk(ChunkBounds::Keys {
            columns: vec!["id".into()],
            lower: None,
            upper: None,
        });
        let whole = chunk(ChunkBounds::Whole);
        let snap = Consistency::Snapshot;
        assert_eq!(
            guarantee(snap, &[&pages, &pages], &[part(1), part(1)]),
            Guarantee::Snapshot { snapshot: 1 }
        );
        assert_eq!(
            guarantee(snap, &[&keys, &keys], &[part(0), part(1)]),
            Guarantee::KeyRanges {
                key: vec!["id".into()]
            }
        );
        assert_eq!(
            guarantee(Consistency::Chunk, &[&whole], &[part(0)]),
            Guarantee::Transaction
        );
        assert_eq!(
            guarantee(Consistency::Chunk, &[&pages, &pages], &[part(0), part(0)]),
            Guarantee::PhysicalRanges
        );
    }
}
