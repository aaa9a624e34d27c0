//! What a resumed run reads again.
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
//!
//! A converged run (`--consistency converged`) reads every chunk in its own transaction and
//! reads again at its end point every key the log says changed after C, so a physical chunk
//! read by either run is as exact as a key range: nothing is read again for that. What the
//! log cannot vouch for is refused instead: changed columns or partitions (the output would
//! mix two shapes, or miss rows that entered unseen), a changed primary key (the parts' rows
//! are matched with the changed keys by it), and a dataset gone from or new in the selection
//! (the output would not be the selection at T).

use crate::job::ExportJob;
use crate::manifest::{DatasetRecord, PartRecord, RunState};
use crate::output;
use crate::planning::{plan_all, record_of};
use crate::policy::refuse_foreign_files;
use sluice_core::{Coordinator, Dataset, Error, Result};
use sluice_sink::layout;
use std::collections::{BTreeMap, HashSet};

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
    /// Why a converged run cannot be resumed, one reason per dataset.
    pub refused: Vec<String>,
    /// Remarks for the report.
    pub notes: Vec<String>,
}

/// Decide what a resume does with each dataset, from the unfinished run's plan, the receipts
/// that match it, and the datasets discovered now (as records: name, columns, relations).
pub fn reconcile(
    state: &RunState,
    done: &HashSet<(String, u32)>,
    now: &[DatasetRecord],
    converged: bool,
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
        if converged {
            let why = match current {
                None => Some("is no longer in the source's catalog or the selection"),
                Some(cur) if cur.columns != old.columns => Some("changed its columns"),
                Some(cur) if cur.relations != old.relations => Some("changed its partitions"),
                Some(_) => None,
            };
            out.refused
                .extend(why.map(|w| format!("{} {w} since the unfinished run began", old.name)));
            continue;
        }
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
            match converged {
                true => out.refused.push(format!(
                    "{} joined the selection since the unfinished run began",
                    cur.name
                )),
                false => out.replan.push((cur.name.clone(), Replan::New)),
            }
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

/// Datasets of a converged run whose primary key is not the one recorded at its start: the
/// parts' rows are matched with the changed keys by those columns.
fn key_changes(recorded: &BTreeMap<String, Vec<String>>, now: &[Dataset]) -> Vec<String> {
    now.iter()
        .filter_map(|d| {
            let old = recorded.get(&d.name)?;
            (*old != d.primary_key).then(|| {
                format!(
                    "{} changed its primary key since the unfinished run began (({}) then, ({}) \
                     now)",
                    d.name,
                    old.join(", "),
                    d.primary_key.join(", ")
                )
            })
        })
        .collect()
}

/// The unfinished run's plan made right for this run: refuses a different request, keeps what
/// receipts vouch for, re-plans what cannot be trusted or is new (see [`reconcile`]), and
/// removes everything else. Returns the plan and the chunks already done; remarks go to
/// `notes`.
pub async fn resume_plan(
    job: &ExportJob,
    coordinator: &mut dyn Coordinator,
    mut state: RunState,
    discovered: &[Dataset],
    chunk_bytes: u64,
    notes: &mut Vec<String>,
) -> Result<(RunState, HashSet<(String, u32)>)> {
    let dest = job.destination.as_ref();
    let shown = dest.display();
    let request = job.request();
    match &state.request {
        None => {
            return Err(Error::config(format!(
                "the unfinished export in {shown} was started by an older sluice that did not \
                 record its options, so --resume cannot check it is the same request. Use \
                 --overwrite to start over."
            )));
        }
        Some(old) => {
            let diffs = old.differences(&request);
            if !diffs.is_empty() {
                return Err(Error::config(format!(
                    "--resume needs the same request as the unfinished run in {shown}, but this \
                     one differs: {}. Repeat the original command with --resume, or use \
                     --overwrite to start over with this one.",
                    diffs.join("; ")
                )));
            }
        }
    }
    let all = output::receipts(dest).await?;
    let names: Vec<String> = state.datasets.iter().map(|r| r.name.clone()).collect();
    let existing: HashSet<String> = output::dataset_files(dest, &names, &state.extension)
        .await?
        .into_iter()
        .collect();
    let valid: Vec<PartRecord> = output::matching(&all, &state.chunks)
        .into_iter()
        .filter(|r| existing.contains(&r.file))
        .cloned()
        .collect();
    let mut done: HashSet<(String, u32)> = valid
        .iter()
        .map(|r| (r.dataset.clone(), r.ordinal))
        .collect();
    let records: Vec<DatasetRecord> = discovered.iter().map(record_of).collect();
    let converged = state.converged.is_some();
    if job.consistency == sluice_core::Consistency::Converged && !converged && !done.is_empty() {
        // Parts read with no start in the log recorded: the changes since they were read are
        // nowhere (a run.json of a sluice that could not resume converged runs).
        return Err(Error::config(format!(
            "the unfinished converged export in {shown} recorded no start in the change log, so \
             the changes since its parts were read cannot be followed. Use --overwrite to start \
             over."
        )));
    }
    let mut decided = reconcile(&state, &done, &records, converged);
    if let Some(c) = &state.converged {
        decided.refused.extend(key_changes(&c.keys, discovered));
    }
    if !decided.refused.is_empty() {
        return Err(Error::config(format!(
            "--resume cannot bring the converged export in {shown} to one point in time: {}. \
             Use --overwrite to start over.",
            decided.refused.join("; ")
        )));
    }
    if !decided.lost.is_empty() {
        return Err(Error::config(format!(
            "--resume cannot finish {}: the unfinished run had not read all of it, and the \
             source no longer has it (dropped or renamed, or no longer matching --tables / \
             --schema). Use --overwrite to start over.",
            decided.lost.join(", ")
        )));
    }
    let new: Vec<String> = decided
        .replan
        .iter()
        .filter(|(_, why)| *why == Replan::New)
        .map(|(n, _)| n.clone())
        .collect();
    refuse_foreign_files(job, &new).await?;
    for (name, _) in &decided.replan {
        let Some(ds) = discovered.iter().find(|d| &d.name == name) else {
            continue;
        };
        done.retain(|(dataset, _)| dataset != name);
        state.chunks.retain(|c| &c.dataset != name);
        let chunks = plan_all(coordinator, std::slice::from_ref(ds), job, chunk_bytes).await?;
        state.chunks.extend(chunks);
        let record = record_of(ds);
        match state.datasets.iter_mut().find(|r| &r.name == name) {
            Some(r) => *r = record,
            None => state.datasets.push(record),
        }
    }
    let kept: Vec<&PartRecord> = valid
        .iter()
        .filter(|r| done.contains(&(r.dataset.clone(), r.ordinal)))
        .collect();
    let files: HashSet<String> = kept.iter().map(|r| r.file.clone()).collect();
    let receipts: HashSet<String> = kept
        .iter()
        .map(|r| layout::receipt_path(&r.dataset, r.ordinal))
        .collect();
    let names: Vec<String> = state.datasets.iter().map(|r| r.name.clone()).collect();
    let tag = job.format.is_table().then_some(Some(state.run_id.as_str()));
    let removed = output::remove_unvouched(dest, &names, &receipts, &files, tag).await?;
    if removed > 0 {
        tracing::info!(
            "removed {removed} file(s) of the interrupted run that no receipt of this plan vouches \
             for (temporaries, parts without receipts, parts of datasets read again)"
        );
    }
    notes.extend(decided.notes);
    Ok((state, done))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::ColumnRecord;
    use crate::output::matching;
    use sluice_core::Chunk;
    use sluice_core::ChunkBounds;
    use sluice_core::table::TableRef;

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
            columns_picked: false,
            row_filter: Vec::new(),
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
            converged: None,
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
        let done = done(&[("a", 0), ("k", 0), ("c", 0)]);
        let r = reconcile(&s, &done, &now, false);
        assert_eq!(r.replan, [("a".to_string(), Replan::Physical)]);
        assert!(r.lost.is_empty());
        // Converged: every key changed after C is read again at T, pages or not.
        let r = reconcile(&s, &done, &now, true);
        assert!(r.replan.is_empty() && r.refused.is_empty(), "{r:?}");
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
        let done = done(&[
            ("cols", 0),
            ("parts", 0),
            ("gone_done", 0),
            ("gone_partial", 0),
            ("done_changed", 0),
        ]);
        let r = reconcile(&s, &done, &now, false);
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
        // Converged: none of it can be made one point in time; each is named, nothing planned.
        let r = reconcile(&s, &done, &now, true);
        assert!(r.replan.is_empty() && r.lost.is_empty(), "{r:?}");
        let named: Vec<&str> = r
            .refused
            .iter()
            .filter_map(|w| w.split(' ').next())
            .collect();
        assert_eq!(
            named,
            [
                "cols",
                "parts",
                "gone_done",
                "gone_partial",
                "done_changed",
                "fresh"
            ]
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
