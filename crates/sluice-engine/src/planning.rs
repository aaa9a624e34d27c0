//! Which chunks this run reads: the datasets discovered, their records in the run state, and
//! a fresh plan of every dataset's chunks (a resumed run reconciles the unfinished plan
//! instead, see `resume.rs`). The memory and worker model the plan is sized with is
//! `plan.rs`'s.

use crate::job::ExportJob;
use crate::manifest::{ColumnRecord, DatasetRecord, MANIFEST_VERSION, RunState};
use crate::plan::{self, Budget, PlanInputs};
use sluice_core::{
    Chunk, ChunkRequest, Consistency, Coordinator, Dataset, DatasetKind, Error, Result,
};
use sluice_sink::{FormatOptions, ParquetOptions};
use std::collections::HashSet;

/// Current time as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Inputs to the planner for `job` on this machine.
pub fn plan_inputs(job: &ExportJob) -> PlanInputs {
    PlanInputs {
        parallel: job.parallel,
        chunk_bytes: job.chunk_bytes,
        memory: job.memory,
        batch_bytes: job.batch_bytes,
        row_group_bytes: match (job.row_group_bytes, job.consistency) {
            (None, Consistency::Converged) => Some(crate::converge::ROW_GROUP_BYTES),
            (given, _) => given,
        },
        holds_row_group: matches!(
            job.format,
            FormatOptions::Parquet(_) | FormatOptions::Delta(_) | FormatOptions::Iceberg(_)
        ),
        hands_over: matches!(job.format, FormatOptions::Arrow(_)),
        writer_buffer_bytes: job.destination.buffer_bytes_per_writer(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        server_local: plan::server_is_local(&job.source.display_url()),
        columns: 0,
        has_text: false,
    }
}

/// The format with the row-group budget the planner chose.
pub fn format_with_budget(format: &FormatOptions, budget: &Budget) -> FormatOptions {
    match format {
        FormatOptions::Parquet(p) => FormatOptions::Parquet(ParquetOptions {
            row_group_bytes: budget.row_group_bytes,
            ..p.clone()
        }),
        FormatOptions::Delta(p) => FormatOptions::Delta(ParquetOptions {
            row_group_bytes: budget.row_group_bytes,
            ..p.clone()
        }),
        FormatOptions::Iceberg(p) => FormatOptions::Iceberg(ParquetOptions {
            row_group_bytes: budget.row_group_bytes,
            ..p.clone()
        }),
        other => other.clone(),
    }
}

/// The manifest description of a dataset's columns.
pub fn column_records(ds: &Dataset) -> Vec<ColumnRecord> {
    ds.columns
        .iter()
        .map(|c| ColumnRecord {
            name: c.name.clone(),
            arrow_type: c.field.data_type().to_string(),
            source_type: c.source_type.clone(),
            nullable: c.field.is_nullable(),
            text_fallback: c.as_text_fallback,
        })
        .collect()
}

/// How the manifest names a dataset's kind.
pub fn kind_name(kind: DatasetKind) -> String {
    match kind {
        DatasetKind::Table => "table",
        DatasetKind::Partitioned => "partitioned",
        DatasetKind::View => "view",
        DatasetKind::Query => "query",
    }
    .to_string()
}

/// The run-state record of a discovered dataset (no parts yet).
pub fn record_of(d: &Dataset) -> DatasetRecord {
    DatasetRecord {
        name: d.name.clone(),
        kind: kind_name(d.kind),
        columns: column_records(d),
        relations: if d.kind == DatasetKind::Partitioned {
            d.relations.iter().map(|r| r.table.to_string()).collect()
        } else {
            Vec::new()
        },
        outside_snapshot: d.outside_snapshot.clone(),
        outside_snapshot_reason: None,
        row_security_filtered: d.row_security_filtered,
        columns_picked: d.columns_picked,
        row_filter: d.row_filter.clone(),
        guarantee: None,
        rows: 0,
        bytes: 0,
        parts: Vec::new(),
        merged: None,
    }
}

/// Refuse two datasets of one name: they would share a directory.
pub fn refuse_duplicates(datasets: &[Dataset]) -> Result<()> {
    let mut seen = HashSet::new();
    for d in datasets {
        if !seen.insert(d.name.as_str()) {
            return Err(Error::config(format!(
                "two datasets are named {:?} (a query and a table, or two objects whose names \
                 differ only in a way the output cannot show); rename the --query, or select \
                 one of them.",
                d.name
            )));
        }
    }
    Ok(())
}

/// Plan every dataset's chunks.
pub async fn plan_all(
    coordinator: &mut dyn Coordinator,
    datasets: &[Dataset],
    job: &ExportJob,
    chunk_bytes: u64,
) -> Result<Vec<Chunk>> {
    let request = ChunkRequest {
        strategy: job.chunking.clone(),
        target_bytes: chunk_bytes,
        consistency: job.consistency,
    };
    let mut chunks = Vec::new();
    for ds in datasets {
        chunks.extend(coordinator.plan_chunks(ds, &request).await?);
    }
    Ok(chunks)
}

/// The run state of a fresh run: every discovered dataset planned, no snapshot yet.
pub async fn fresh(
    job: &ExportJob,
    coordinator: &mut dyn Coordinator,
    discovered: &[Dataset],
    run_id: &str,
    chunk_bytes: u64,
) -> Result<RunState> {
    Ok(RunState {
        manifest_version: MANIFEST_VERSION,
        run_id: run_id.to_string(),
        started_at: now_rfc3339(),
        request: Some(job.request()),
        consistency: job.consistency.to_string(),
        extension: job.format.extension().to_string(),
        snapshots: Vec::new(),
        datasets: discovered.iter().map(record_of).collect(),
        chunks: match &job.chunks {
            Some(given) => given_chunks(discovered, given)?,
            None => plan_all(coordinator, discovered, job, chunk_bytes).await?,
        },
        converged: None,
    })
}

/// The chunks another process planned ([`ExportJob::chunks`]), each checked to belong to a
/// dataset this run found: a plan made for another selection would read nothing of it.
fn given_chunks(discovered: &[Dataset], given: &[Chunk]) -> Result<Vec<Chunk>> {
    for c in given {
        if !discovered.iter().any(|d| d.name == c.dataset) {
            return Err(Error::config(format!(
                "a chunk of {} was given to read, but the selection does not hold that dataset \
                 (found: {}); plan and read with the same source and selection.",
                c.dataset,
                discovered
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(given.to_vec())
}
