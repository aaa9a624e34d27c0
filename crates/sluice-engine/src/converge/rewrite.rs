//! The last step of a converged run: every part read before the end point that holds a
//! changed key is written again without it (`sluice_sink::rewrite`), on blocking threads, as
//! many at once as the plan has workers (a resumed run too, however few chunks it read), each
//! with its receipt withdrawn first.

use super::{ChangedKeys, key_columns};
use crate::job::ExportJob;
use crate::manifest::{ConvergedRecord, PartRecord};
use crate::prepare::Prepared;
use crate::worker::WorkerContext;
use futures_util::StreamExt;
use sluice_core::keytext::{KeyLookup, KeySet};
use sluice_core::{Chunk, Error, Result};
use sluice_sink::PartKey;
use sluice_sink::destination::on_blocking;
use sluice_sink::layout;
use sluice_sink::rewrite::{Part, rows_with_keys, without_rows};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Rewrite every part read before the end point that holds a changed key (all of a truncated
/// table's), and its receipt — an earlier run's parts too, when resumed.
pub(super) async fn remove_changed(
    job: &ExportJob,
    ctx: &Arc<WorkerContext>,
    prepared: &Prepared,
    changed: &HashMap<String, ChangedKeys>,
    delta: &[Chunk],
    record: &mut ConvergedRecord,
) -> Result<()> {
    let fresh: HashSet<(&str, u32)> = delta
        .iter()
        .map(|c| (c.dataset.as_str(), c.ordinal))
        .collect();
    // From the receipts, not this run's list: a resumed run's plan has parts of earlier runs.
    let receipts = crate::output::receipts(job.destination.as_ref()).await?;
    let parts: Vec<PartRecord> = crate::output::matching(&receipts, &prepared.state.chunks)
        .into_iter()
        .cloned()
        .collect();
    // One set to look rows up in per dataset, shared by its parts' rewrites.
    let mut sets: HashMap<String, Arc<dyn KeyLookup>> = HashMap::new();
    record.chunk_bytes = parts
        .iter()
        .filter(|p| !fresh.contains(&(p.dataset.as_str(), p.ordinal)))
        .map(|p| p.bytes)
        .sum();
    // Each part on a blocking thread, as many at once as the plan has workers (each holds a
    // row group, as a worker does).
    let mut rewrites = Vec::with_capacity(parts.len());
    for part in parts {
        let ds = prepared.datasets.iter().find(|d| d.name == part.dataset);
        let todo = match (ds, changed.get(&part.dataset)) {
            (Some(ds), Some(keys)) if !fresh.contains(&(part.dataset.as_str(), part.ordinal)) => {
                Some((ds, keys.truncated))
            }
            _ => None,
        };
        let Some((ds, truncated)) = todo else {
            rewrites.push(futures_util::future::Either::Left(std::future::ready(Ok(
                (part, None),
            ))));
            continue;
        };
        let drop = sets
            .entry(part.dataset.clone())
            .or_insert_with(|| match changed.get(&part.dataset).map(|c| &c.keys) {
                _ if truncated => Arc::new(KeySet::everything()),
                Some(Some(run)) => run.clone(),
                _ => Arc::new(KeySet::new(&[])),
            })
            .clone();
        let target = Arc::new(Target {
            part: part.clone(),
            schema: ds.arrow_schema(),
            columns: key_columns(ds)?,
        });
        let (dest, format) = (
            job.destination.clone(),
            ctx.format.for_part(part.ordinal, ctx.merge),
        );
        rewrites.push(futures_util::future::Either::Right(async move {
            let (t, d) = (target.clone(), dest.clone());
            let hits = on_blocking(move || rows_with_keys(&d, &t.part(), drop.as_ref())).await?;
            let Some(hits) = hits else {
                return Ok((part, None));
            };
            // Killed from here until the new receipt is written: the part is unvouched, and a
            // resume reads its chunk again rather than trust a receipt of another file.
            dest.delete(&layout::receipt_path(&part.dataset, part.ordinal))
                .await?;
            let d = dest.clone();
            let r = on_blocking(move || without_rows(&d, &format, &target.part(), &hits)).await?;
            Ok::<_, Error>((part, Some(r)))
        }));
    }
    let mut done = futures_util::stream::iter(rewrites).buffered(prepared.plan_workers.max(1));
    let mut updated = Vec::new();
    while let Some(result) = done.next().await {
        let (mut part, rewritten) = result?;
        if let Some(r) = rewritten {
            record.parts_rewritten += 1;
            record.rewritten_bytes += part.bytes;
            record.rows_removed += r.removed;
            record.reencoded_bytes += r.reencoded_bytes;
            part.rows = r.stats.rows;
            part.bytes = r.stats.bytes;
            part.xxh3_128 = r.stats.xxh3_128;
            let receipt =
                serde_json::to_vec_pretty(&part).map_err(|e| Error::internal(e.to_string()))?;
            job.destination
                .put(&layout::receipt_path(&part.dataset, part.ordinal), receipt)
                .await?;
            sluice_core::failpoint::hit("converge.after_rewrite")?;
        }
        updated.push(part);
    }
    // This run's parts as rewritten (the report counts what this run committed).
    let updated: HashMap<(String, u32), PartRecord> = updated
        .into_iter()
        .map(|p| ((p.dataset.clone(), p.ordinal), p))
        .collect();
    if let Ok(mut mine) = ctx.committed.lock() {
        for part in mine.iter_mut() {
            if let Some(u) = updated.get(&(part.dataset.clone(), part.ordinal)) {
                *part = u.clone();
            }
        }
    }
    Ok(())
}

/// A part to rewrite, owned, for the blocking threads.
struct Target {
    part: PartRecord,
    schema: arrow_schema::SchemaRef,
    columns: Vec<usize>,
}

impl Target {
    fn part(&self) -> Part<'_> {
        Part {
            key: PartKey {
                dataset: self.part.dataset.clone(),
                ordinal: self.part.ordinal,
            },
            path: &self.part.file,
            bytes: self.part.bytes,
            schema: self.schema.clone(),
            key_columns: &self.columns,
        }
    }
}
