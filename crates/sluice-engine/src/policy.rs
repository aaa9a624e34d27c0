//! What a run does with what its output already holds: export afresh, finish an unfinished
//! run (`--resume`), replace it (`--overwrite`), or refuse.
//!
//! | found                         | plain run        | `--resume`            | `--overwrite`  |
//! |-------------------------------|------------------|-----------------------|----------------|
//! | nothing of ours               | export           | export                | export         |
//! | `manifest.json` (complete)    | refuse           | nothing to do if the request is the same, else refuse naming the differences | replace |
//! | `_sluice/run.json`, no manifest (a run died) | refuse | finish it if the request is the same, else refuse naming the differences | replace |
//! | files in a dataset directory, no state | refuse  | refuse                | replace        |
//!
//! Refusing is the default because silently mixing two exports is the worst outcome.
//!
//! The request a run compares is its fingerprint (`request.rs`); which chunks a resume reads
//! again is `resume.rs`'s decision.

use crate::job::ExportJob;
use crate::manifest::{Manifest, RunState};
use crate::output::{self, Prior};
use sluice_core::{Error, Result};
use sluice_sink::layout::MANIFEST;
use std::collections::HashSet;

/// How this run starts, given what the output holds.
#[derive(Debug)]
pub enum Start {
    /// The output is a complete export of the same request: nothing to do.
    AlreadyComplete,
    /// Nothing of an earlier run: plan afresh (files in a dataset directory are still refused).
    Fresh,
    /// Finish the unfinished run whose plan this is.
    Resume(Box<RunState>),
    /// `--overwrite`: remove what the earlier export left, then plan afresh.
    Overwrite(Prior),
}

/// Decide how the run starts, or refuse with the reason and the way out.
pub fn decide(job: &ExportJob, prior: Prior) -> Result<Start> {
    let shown = job.destination.display();
    if job.overwrite {
        // Even with nothing of ours there, files in the dataset directories are replaced (the
        // table above), not refused with advice to pass the --overwrite already given.
        return Ok(Start::Overwrite(prior));
    }
    match prior {
        Prior::Fresh => Ok(Start::Fresh),
        Prior::Unfinished(state) if job.resume => Ok(Start::Resume(state)),
        Prior::Unfinished(_) => Err(Error::config(format!(
            "{shown} holds an unfinished export (no manifest.json yet). Use --resume to finish \
             the missing parts, or --overwrite to start over."
        ))),
        Prior::Complete(manifest) => {
            let request = job.request();
            let differences = manifest.as_ref().map(|m| m.request.differences(&request));
            match (job.resume, differences) {
                (true, Some(d)) if d.is_empty() => Ok(Start::AlreadyComplete),
                (true, Some(d)) => Err(Error::config(format!(
                    "{shown} holds a complete export of a different request: {}. --resume only \
                     finishes the same request; use --overwrite to replace the export with this \
                     one, or choose another --to.",
                    d.join("; ")
                ))),
                (true, None) => Err(Error::config(format!(
                    "{shown} holds a complete export whose manifest.json this version of sluice \
                     cannot read, so it cannot tell whether it is the same request. Use \
                     --overwrite to replace it, or choose another --to."
                ))),
                (false, d) => Err(Error::config(format!(
                    "{shown} already holds a complete export (manifest.json){}. Use --overwrite \
                     to replace it, or choose another --to.",
                    match d {
                        Some(d) if !d.is_empty() => {
                            format!(" made with a different request ({})", d.join("; "))
                        }
                        _ => String::new(),
                    }
                ))),
            }
        }
    }
}

/// `--overwrite`: remove the earlier export, whatever datasets it had (`names` are this run's).
pub async fn clear_previous(job: &ExportJob, names: &[String], previous: Prior) -> Result<()> {
    let dest = job.destination.as_ref();
    let mut all: HashSet<String> = names.iter().cloned().collect();
    if let Prior::Unfinished(state) = &previous {
        all.extend(state.datasets.iter().map(|d| d.name.clone()));
        all.extend(state.chunks.iter().map(|c| c.dataset.clone()));
    }
    if let Some(bytes) = dest.get(MANIFEST).await?
        && let Ok(m) = serde_json::from_slice::<Manifest>(&bytes)
    {
        all.extend(m.datasets.into_iter().map(|d| d.name));
    }
    let all: Vec<String> = all.into_iter().collect();
    output::clear(dest, &all, job.format.extension(), job.format.is_table()).await
}

/// A run that plans `names` afresh refuses to write into dataset directories that already hold
/// files it did not write.
pub async fn refuse_foreign_files(job: &ExportJob, names: &[String]) -> Result<()> {
    let dest = job.destination.as_ref();
    let existing = output::dataset_files(dest, names, job.format.extension()).await?;
    if let Some(f) = existing.first() {
        return Err(Error::config(format!(
            "{}/{f} already exists and was not written by an unfinished sluice run. Choose an \
             empty --to, or use --overwrite to replace the dataset directories.",
            job.destination.display()
        )));
    }
    Ok(())
}
