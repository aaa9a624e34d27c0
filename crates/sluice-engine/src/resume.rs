//! What an output directory already holds, and making it ready for this run.
//!
//! | found                         | plain run        | `--resume`            | `--overwrite`  |
//! |-------------------------------|------------------|-----------------------|----------------|
//! | nothing of ours               | export           | export                | export         |
//! | `manifest.json` (complete)    | refuse           | nothing to do         | replace        |
//! | `_sluice/run.json`, no manifest (a run died) | refuse | finish the missing parts | replace |
//! | files in a dataset directory, no state | refuse  | refuse                | replace        |
//!
//! Refusing is the default because silently mixing two exports is the worst outcome.

use sluice_core::{Error, Result};
use sluice_sink::Destination;
use sluice_sink::layout::{self, MANIFEST, RECEIPTS, RUN_STATE};
use sluice_sink::manifest::{PartRecord, RunState};

/// What the output location holds.
#[derive(Debug)]
pub enum Prior {
    /// Nothing of a previous sluice run.
    Fresh,
    /// A complete export (a manifest).
    Complete,
    /// An unfinished export: its plan.
    Unfinished(Box<RunState>),
}

/// Inspect the output location.
pub fn inspect(dest: &dyn Destination) -> Result<Prior> {
    if dest.get(MANIFEST)?.is_some() {
        return Ok(Prior::Complete);
    }
    match dest.get(RUN_STATE)? {
        Some(bytes) => {
            let state: RunState = serde_json::from_slice(&bytes).map_err(|e| {
                Error::config(format!(
                    "{}/{RUN_STATE} is not a sluice run state ({e}); remove it, or use --overwrite.",
                    dest.display()
                ))
            })?;
            Ok(Prior::Unfinished(Box::new(state)))
        }
        None => Ok(Prior::Fresh),
    }
}

/// Every receipt of committed parts.
pub fn receipts(dest: &dyn Destination) -> Result<Vec<PartRecord>> {
    let mut out = Vec::new();
    for obj in dest.list(RECEIPTS)? {
        if layout::is_temporary(&obj.path) || !obj.path.ends_with(".json") {
            continue;
        }
        if let Some(bytes) = dest.get(&obj.path)? {
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

/// Files in the directories of `datasets` (and merged files), temporaries included.
pub fn dataset_files(
    dest: &dyn Destination,
    datasets: &[String],
    extension: &str,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for d in datasets {
        for obj in dest.list(&layout::dataset_dir(d))? {
            out.push(obj.path);
        }
        let merged = layout::merged_path(d, extension);
        if dest.get(&merged)?.is_some() {
            out.push(merged);
        }
    }
    Ok(out)
}

/// Remove hidden temporaries that a killed run left in the dataset directories.
pub fn remove_temporaries(dest: &dyn Destination, datasets: &[String]) -> Result<usize> {
    let mut n = 0;
    for d in datasets {
        for obj in dest.list(&layout::dataset_dir(d))? {
            if layout::is_temporary(&obj.path) {
                dest.delete(&obj.path)?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Remove a previous export: the manifest first (so the output stops looking complete at once),
/// then its files and bookkeeping. Files not written by sluice outside dataset directories are
/// left alone.
pub fn clear(dest: &dyn Destination, datasets: &[String], extension: &str) -> Result<()> {
    dest.delete(MANIFEST)?;
    for path in dataset_files(dest, datasets, extension)? {
        dest.delete(&path)?;
    }
    for obj in dest.list("_sluice")? {
        if obj.path != RUN_STATE {
            dest.delete(&obj.path)?;
        }
    }
    dest.delete(RUN_STATE)?;
    Ok(())
}
