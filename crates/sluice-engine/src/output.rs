//! What an output location already holds, read and cleaned through its destination: the
//! manifest, the unfinished run's plan, the receipts, and the files no receipt vouches for.
//! Which of these a run may touch is decided in `policy.rs`.

use crate::manifest::{Manifest, PartRecord, RunState};
use sluice_core::{Chunk, Error, Result};
use sluice_sink::Destination;
use sluice_sink::layout::{self, LOCK, MANIFEST, RECEIPTS, RUN_STATE};
use std::collections::{HashMap, HashSet};

/// What the output location holds.
#[derive(Debug)]
pub enum Prior {
    /// Nothing of a previous sluice run.
    Fresh,
    /// A complete export; its manifest, or `None` when it is not of this version's layout.
    Complete(Option<Box<Manifest>>),
    /// An unfinished export: its plan.
    Unfinished(Box<RunState>),
}

/// Inspect the output location.
pub async fn inspect(dest: &dyn Destination) -> Result<Prior> {
    if let Some(bytes) = dest.get(MANIFEST).await? {
        return Ok(Prior::Complete(
            serde_json::from_slice::<Manifest>(&bytes)
                .ok()
                .map(Box::new),
        ));
    }
    match dest.get(RUN_STATE).await? {
        Some(bytes) => {
            let state: RunState = serde_json::from_slice(&bytes).map_err(|e| {
                Error::config(format!(
                    "{}/{RUN_STATE} is not a run state this version of sluice can resume ({e}); \
                     use --overwrite to start over.",
                    dest.display()
                ))
            })?;
            Ok(Prior::Unfinished(Box::new(state)))
        }
        None => Ok(Prior::Fresh),
    }
}

/// Every receipt of committed parts (damaged ones are an error naming the file).
pub async fn receipts(dest: &dyn Destination) -> Result<Vec<PartRecord>> {
    let mut out = Vec::new();
    for obj in dest.list(RECEIPTS).await? {
        if layout::is_temporary(&obj.path) || !obj.path.ends_with(".json") {
            continue;
        }
        if let Some(bytes) = dest.get(&obj.path).await? {
            let rec: PartRecord = serde_json::from_slice(&bytes).map_err(|e| {
                Error::config(format!(
                    "receipt {}/{} is damaged ({e}); remove it to redo that part, or use --overwrite.",
                    dest.display(),
                    obj.path
                ))
            })?;
            out.push(rec);
        }
    }
    Ok(out)
}

/// The receipts that belong to `chunks`: same dataset, ordinal and range. A receipt of an
/// earlier plan of a dataset that was planned again is not one of them.
pub fn matching<'a>(receipts: &'a [PartRecord], chunks: &[Chunk]) -> Vec<&'a PartRecord> {
    let planned: HashMap<(&str, u32), String> = chunks
        .iter()
        .map(|c| ((c.dataset.as_str(), c.ordinal), c.bounds.to_string()))
        .collect();
    receipts
        .iter()
        .filter(|r| planned.get(&(r.dataset.as_str(), r.ordinal)) == Some(&r.range))
        .collect()
}

/// Files in the directories of `datasets` (and merged files), temporaries included.
pub async fn dataset_files(
    dest: &dyn Destination,
    datasets: &[String],
    extension: &str,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for d in datasets {
        for obj in dest.list(&layout::dataset_dir(d)).await? {
            out.push(obj.path);
        }
        let merged = layout::merged_path(d, extension);
        if dest.size(&merged).await?.is_some() {
            out.push(merged);
        }
    }
    Ok(out)
}

/// Remove what no receipt of the plan vouches for, receipts first (so a crash in between
/// leaves parts without receipts, which the next resume removes, never receipts without
/// parts): every receipt not in `keep_receipts`, then in each dataset directory every file not
/// in `keep_files` (hidden temporaries, parts committed without a receipt, parts of an earlier
/// plan), then hidden temporaries under `_sluice/` and at the top (the run state, merged files
/// and the manifest are written through temporaries too). Safe only while this run holds the
/// output's lock. Returns how many files were removed.
pub async fn remove_unvouched(
    dest: &dyn Destination,
    datasets: &[String],
    keep_receipts: &HashSet<String>,
    keep_files: &HashSet<String>,
    table_tag: Option<Option<&str>>,
) -> Result<usize> {
    let mut doomed = Vec::new();
    for obj in dest.list(RECEIPTS).await? {
        if !keep_receipts.contains(&obj.path) {
            doomed.push(obj.path);
        }
    }
    for d in datasets {
        for obj in dest.list(&layout::dataset_dir(d)).await? {
            if !keep_files.contains(&obj.path) && layout::owned_by_export(&obj.path, table_tag) {
                doomed.push(obj.path);
            }
        }
    }
    for obj in dest.list("_sluice").await? {
        if layout::is_temporary(&obj.path) {
            doomed.push(obj.path);
        }
    }
    for obj in dest.list("").await? {
        if !obj.path.contains('/') && layout::is_temporary(&obj.path) {
            doomed.push(obj.path);
        }
    }
    for path in &doomed {
        dest.delete(path).await?;
    }
    Ok(doomed.len())
}

/// Remove a previous export: the manifest first (so the output stops looking complete at once),
/// then its files and bookkeeping. Files not written by sluice outside dataset directories are
/// left alone, and so is the output's lock (held by this run).
///
/// A table format's directories are tables (`table` true): the table keeps its log and files,
/// and the export's commit replaces its contents in one version; only temporaries go.
pub async fn clear(
    dest: &dyn Destination,
    datasets: &[String],
    extension: &str,
    table: bool,
) -> Result<()> {
    dest.delete(MANIFEST).await?;
    let owner = table.then_some(None);
    for path in dataset_files(dest, datasets, extension).await? {
        if layout::owned_by_export(&path, owner) {
            dest.delete(&path).await?;
        }
    }
    for obj in dest.list("_sluice").await? {
        if obj.path != RUN_STATE && obj.path != LOCK {
            dest.delete(&obj.path).await?;
        }
    }
    dest.delete(RUN_STATE).await
}
