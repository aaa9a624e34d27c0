//! What an output directory already holds, and making it ready for this run.
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
//! # What a resume re-reads
//!
//! A resumed run reads under a new snapshot, so parts of one dataset may come from two
//! snapshots. That is exact only for chunks whose rows are chosen by value (key ranges): a row
//! whose key did not change is in the same range in both snapshots. A chunk chosen by place (a
//! page range, a partition) is not: an UPDATE between the snapshots can move a row from a page
//! range not yet read into one already read (lost) or the other way (read twice). So
//! [`reconcile`] decides per dataset of the unfinished plan:
//!
//! - complete (every chunk has a receipt): kept as it is, whatever changed since;
//! - incomplete and key-ranged, same columns and partitions: only the missing chunks are read;
//! - partly read and physical, or incomplete and its columns or partitions changed: its parts
//!   and receipts are dropped and it is planned and read again, whole, under the new snapshot
//!   (a physical dataset of which nothing was read keeps its plan: all of it is read under the
//!   new snapshot anyway);
//! - no longer in the catalog (dropped, or no longer matching `--tables`/`--schema`): kept if
//!   complete, else the resume is refused;
//! - newly in the catalog (a table created since that matches the selection): planned and read
//!   under the new snapshot.

use sluice_core::{Chunk, Error, Result};
use sluice_sink::Destination;
use sluice_sink::layout::{self, LOCK, MANIFEST, RECEIPTS, RUN_STATE};
use sluice_sink::manifest::{DatasetRecord, Manifest, PartRecord, RunState};
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
pub fn inspect(dest: &dyn Destination) -> Result<Prior> {
    if let Some(bytes) = dest.get(MANIFEST)? {
        return Ok(Prior::Complete(
            serde_json::from_slice::<Manifest>(&bytes)
                .ok()
                .map(Box::new),
        ));
    }
    match dest.get(RUN_STATE)? {
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

/// Remove what no receipt of the plan vouches for, receipts first (so a crash in between
/// leaves parts without receipts, which the next resume removes, never receipts without
/// parts): every receipt not in `keep_receipts`, then in each dataset directory every file not
/// in `keep_files` (hidden temporaries, parts committed without a receipt, parts of an earlier
/// plan), then hidden temporaries under `_sluice/` and at the top (the run state, merged files
/// and the manifest are written through temporaries too). Safe only while this run holds the
/// output's lock. Returns how many files were removed.
pub fn remove_unvouched(
    dest: &dyn Destination,
    datasets: &[String],
    keep_receipts: &HashSet<String>,
    keep_files: &HashSet<String>,
) -> Result<usize> {
    let mut n = 0;
    let mut drop = |path: &str| -> Result<()> {
        dest.delete(path)?;
        n += 1;
        Ok(())
    };
    for obj in dest.list(RECEIPTS)? {
        if !keep_receipts.contains(&obj.path) {
            drop(&obj.path)?;
        }
    }
    for d in datasets {
        for obj in dest.list(&layout::dataset_dir(d))? {
            if !keep_files.contains(&obj.path) {
                drop(&obj.path)?;
            }
        }
    }
    for obj in dest.list("_sluice")? {
        if layout::is_temporary(&obj.path) {
            drop(&obj.path)?;
        }
    }
    for obj in dest.list("")? {
        if !obj.path.contains('/') && layout::is_temporary(&obj.path) {
            drop(&obj.path)?;
        }
    }
    Ok(n)
}

/// Remove a previous export: the manifest first (so the output stops looking complete at once),
/// then its files and bookkeeping. Files not written by sluice outside dataset directories are
/// left alone, and so is the output's lock (held by this run).
pub fn clear(dest: &dyn Destination, datasets: &[String], extension: &str) -> Result<()> {
    dest.delete(MANIFEST)?;
    for path in dataset_files(dest, datasets, extension)? {
        dest.delete(&path)?;
    }
    for obj in dest.list("_sluice")? {
        if obj.path != RUN_STATE && obj.path != LOCK {
            dest.delete(&obj.path)?;
        }
    }
    dest.delete(RUN_STATE)?;
    Ok(())
}

/// Why a dataset of a resumed run is planned and read (again) under the new snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replan {
    /// It was not in the unfinished run's plan (created, or newly matching the selection).
    New,
    /// It is partly read and its chunks are physical (page ranges or partitions).
    Physical,
    /// It is incomplete and its columns changed.
    ColumnsChanged,
    /// It is incomplete and its partitions changed (attached, detached).
    PartitionsChanged,
}

impl Replan {
    fn why(&self) -> &'static str {
        match self {
            Replan::New => "it is new in the selection since the unfinished run",
            Replan::Physical => {
                "its parts are page or partition ranges, which rows may have left or entered \
                 since the first snapshot"
            }
            Replan::ColumnsChanged => "its columns changed since the unfinished run",
            Replan::PartitionsChanged => "its partitions changed since the unfinished run",
        }
    }
}

/// What a resume does with each dataset (see the module doc).
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Datasets to plan under the new snapshot, dropping whatever they had.
    pub replan: Vec<(String, Replan)>,
    /// Incomplete datasets the catalog no longer has: the resume cannot finish them.
    pub lost: Vec<String>,
    /// Remarks for the report.
    pub notes: Vec<String>,
}

/// Decide what a resume does with each dataset, from the unfinished run's plan, the receipts
/// that match it, and the datasets discovered now (as records: name, columns, relations).
pub fn reconcile(
    state: &RunState,
    done: &HashSet<(String, u32)>,
    now: &[DatasetRecord],
) -> Reconciled {
    let mut out = Reconciled::default();
    let first = |name: &str| {
        state
            .chunks
            .iter()
            .filter(|c| c.dataset == name)
            .collect::<Vec<_>>()
    };
    for old in &state.datasets {
        let chunks = first(&old.name);
        let complete = chunks
            .iter()
            .all(|c| done.contains(&(c.dataset.clone(), c.ordinal)));
        let current = now.iter().find(|d| d.name == old.name);
        match current {
            None if complete => out.notes.push(format!(
                "{} is no longer in the source's catalog (dropped, renamed, or no longer \
                 matching the selection); its parts, complete under an earlier snapshot, are kept",
                old.name
            )),
            None => out.lost.push(old.name.clone()),
            Some(cur) => {
                let columns = cur.columns != old.columns;
                let partitions = cur.relations != old.relations;
                if complete {
                    if columns || partitions {
                        out.notes.push(format!(
                            "{}: its {} changed since its parts were read; they are kept as \
                             they were read (complete under an earlier snapshot)",
                            old.name,
                            if columns { "columns" } else { "partitions" }
                        ));
                    }
                    continue;
                }
                let why = if columns {
                    Some(Replan::ColumnsChanged)
                } else if partitions {
                    Some(Replan::PartitionsChanged)
                } else if chunks.iter().any(|c| c.is_physical())
                    && chunks
                        .iter()
                        .any(|c| done.contains(&(c.dataset.clone(), c.ordinal)))
                {
                    // Partly read: the rest would come from another snapshot. (Nothing read:
                    // all of it comes from the new snapshot, so the plan stands.)
                    Some(Replan::Physical)
                } else {
                    None
                };
                if let Some(why) = why {
                    out.replan.push((old.name.clone(), why));
                }
            }
        }
    }
    for cur in now {
        if !state.datasets.iter().any(|d| d.name == cur.name) {
            out.replan.push((cur.name.clone(), Replan::New));
        }
    }
    for (name, why) in &out.replan {
        out.notes.push(format!(
            "{name} was read whole under the new snapshot: {}",
            why.why()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::ChunkBounds;
    use sluice_core::table::TableRef;
    use sluice_sink::manifest::ColumnRecord;

    fn record(name: &str, column: &str, relations: &[&str]) -> DatasetRecord {
        DatasetRecord {
            name: name.into(),
            kind: "table".into(),
            columns: vec![ColumnRecord {
                name: column.into(),
                arrow_type: "Int64".into(),
                source_type: "bigint".into(),
                nullable: false,
                text_fallback: false,
            }],
            relations: relations.iter().map(|r| r.to_string()).collect(),
            outside_snapshot: Vec::new(),
            outside_snapshot_reason: None,
            row_security_filtered: false,
            guarantee: None,
            rows: 0,
            bytes: 0,
            parts: Vec::new(),
            merged: None,
        }
    }

    fn chunk(ds: &str, ordinal: u32, bounds: ChunkBounds, leaf: Option<&str>) -> Chunk {
        Chunk {
            dataset: ds.into(),
            ordinal,
            relation: leaf.map(|l| TableRef {
                schema: "public".into(),
                name: l.into(),
            }),
            bounds,
            est_bytes: 0,
            est_rows: 0,
        }
    }

    fn keys(lower: Option<i64>, upper: Option<i64>) -> ChunkBounds {
        ChunkBounds::Keys {
            columns: vec!["id".into()],
            lower: lower.map(|v| vec![v.to_string()]),
            upper: upper.map(|v| vec![v.to_string()]),
        }
    }

    fn pages(first: u64, end: Option<u64>) -> ChunkBounds {
        ChunkBounds::Pages { first, end }
    }

    fn state(datasets: Vec<DatasetRecord>, chunks: Vec<Chunk>) -> RunState {
        RunState {
            manifest_version: 2,
            run_id: "r".into(),
            started_at: String::new(),
            request: None,
            consistency: "snapshot".into(),
            extension: "parquet".into(),
            snapshots: Vec::new(),
            datasets,
            chunks,
        }
    }

    fn done(items: &[(&str, u32)]) -> HashSet<(String, u32)> {
        items.iter().map(|(d, o)| (d.to_string(), *o)).collect()
    }

    #[test]
    fn partial_physical_datasets_are_read_again_key_ranges_resume_per_chunk() {
        let s = state(
            vec![
                record("a", "id", &["public.a"]),
                record("k", "id", &[]),
                record("c", "id", &["public.c"]),
                record("z", "id", &["public.z"]),
            ],
            vec![
                chunk("a", 0, pages(0, Some(10)), Some("a")),
                chunk("a", 1, pages(10, None), Some("a")),
                chunk("k", 0, keys(None, Some(5)), None),
                chunk("k", 1, keys(Some(5), None), None),
                chunk("c", 0, pages(0, None), Some("c")),
                chunk("z", 0, pages(0, Some(10)), Some("z")),
                chunk("z", 1, pages(10, None), Some("z")),
            ],
        );
        let now = s.datasets.clone();
        let r = reconcile(&s, &done(&[("a", 0), ("k", 0), ("c", 0)]), &now);
        assert_eq!(r.replan, [("a".to_string(), Replan::Physical)]);
        assert!(r.lost.is_empty());
    }

    #[test]
    fn catalog_changes_have_a_defined_outcome() {
        let s = state(
            vec![
                record("cols", "id", &[]),
                record("parts", "id", &["public.p1"]),
                record("gone_done", "id", &[]),
                record("gone_partial", "id", &[]),
                record("done_changed", "id", &[]),
            ],
            vec![
                chunk("cols", 0, keys(None, Some(5)), None),
                chunk("cols", 1, keys(Some(5), None), None),
                chunk("parts", 0, keys(None, None), None),
                chunk(
                    "parts",
                    1,
                    ChunkBounds::KeyNulls {
                        columns: vec!["id".into()],
                    },
                    None,
                ),
                chunk("gone_done", 0, ChunkBounds::Whole, None),
                chunk("gone_partial", 0, keys(None, Some(5)), None),
                chunk("gone_partial", 1, keys(Some(5), None), None),
                chunk("done_changed", 0, ChunkBounds::Whole, None),
            ],
        );
        let now = vec![
            record("cols", "id2", &[]),
            record("parts", "id", &["public.p1", "public.p2"]),
            record("done_changed", "other", &[]),
            record("fresh", "id", &[]),
        ];
        let r = reconcile(
            &s,
            &done(&[
                ("cols", 0),
                ("parts", 0),
                ("gone_done", 0),
                ("gone_partial", 0),
                ("done_changed", 0),
            ]),
            &now,
        );
        assert_eq!(
            r.replan,
            [
                ("cols".to_string(), Replan::ColumnsChanged),
                ("parts".to_string(), Replan::PartitionsChanged),
                ("fresh".to_string(), Replan::New),
            ]
        );
        assert_eq!(r.lost, ["gone_partial"]);
        assert!(
            r.notes
                .iter()
                .any(|n| n.starts_with("gone_done is no longer"))
        );
        assert!(
            r.notes
                .iter()
                .any(|n| n.starts_with("done_changed: its columns"))
        );
    }

    #[test]
    fn receipts_of_an_earlier_plan_do_not_match() {
        let chunks = vec![chunk("a", 0, keys(None, Some(5)), None)];
        let rec = |range: &str| PartRecord {
            dataset: "a".into(),
            ordinal: 0,
            file: "a/part-00000.parquet".into(),
            rows: 1,
            bytes: 1,
            xxh3_128: String::new(),
            snapshot: 0,
            range: range.into(),
        };
        let receipts = vec![rec("pages 0..10"), rec(&keys(None, Some(5)).to_string())];
        let m = matching(&receipts, &chunks);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].range, keys(None, Some(5)).to_string());
    }
}
