//! `sluice plan`: what an export would do, without reading a row.
//!
//! Opens the coordinator without a snapshot (nothing is held), discovers the datasets, plans
//! their chunks, and applies the same sizing as a real run.

use crate::export::plan_inputs;
use crate::job::ExportJob;
use crate::plan::{self, budget, predicted_peak_rss};
use serde::{Deserialize, Serialize};
use sluice_core::{ChunkBounds, Consistency, Result};

/// The plan of one dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetPlan {
    /// Dataset name.
    pub name: String,
    /// Estimated rows (statistics, not a count).
    pub est_rows: u64,
    /// Estimated bytes on disk (heap + TOAST).
    pub est_bytes: u64,
    /// Average row width in bytes.
    pub avg_row_bytes: u64,
    /// How it is split (`ctid pages`, `key (id)`, `whole`).
    pub strategy: String,
    /// Number of chunks (= part files).
    pub chunks: usize,
    /// Columns exported as text because their type has no native mapping.
    pub text_columns: Vec<String>,
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    /// Source engine and redacted URL.
    pub source: String,
    /// Server version.
    pub server_version: String,
    /// `snapshot` or `chunk`.
    pub consistency: String,
    /// Workers a run would use.
    pub workers: usize,
    /// Why that many.
    pub workers_reason: String,
    /// Estimated client work, seconds of CPU.
    pub work_seconds: f64,
    /// Target chunk size, bytes.
    pub chunk_bytes: u64,
    /// Batch byte budget.
    pub batch_bytes: usize,
    /// Predicted peak resident memory, bytes.
    pub predicted_peak_rss_bytes: u64,
    /// Connections a run would open (workers, coordinator, harm monitor).
    pub connections: usize,
    /// Cores the workers would keep busy (the client's, and the server's when it runs on this
    /// machine).
    pub cores_needed: f64,
    /// Cores of this machine.
    pub cores: usize,
    /// Whether the server runs on this machine (loopback or Unix socket), sharing its cores.
    pub server_local: bool,
    /// Warnings: a worker count past what the cores can feed, memory a run would refuse.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Per dataset.
    pub datasets: Vec<DatasetPlan>,
    /// The harm budget's signals, each read once: its value, or why it could not be read
    /// (a run would then pause until it can). Empty without a budget.
    #[serde(default)]
    pub signals: Vec<String>,
}

fn strategy_of(bounds: &ChunkBounds) -> String {
    match bounds {
        ChunkBounds::Whole => "whole".into(),
        ChunkBounds::Pages { .. } => "ctid pages".into(),
        ChunkBounds::Keys { columns, .. }
        | ChunkBounds::KeyNulls { columns }
        | ChunkBounds::KeySet { columns, .. } => {
            format!("key ({})", columns.join(", "))
        }
    }
}

/// Plan `job` without reading data or holding a snapshot.
pub async fn plan_export(job: &ExportJob) -> Result<PlanReport> {
    let crate::distributed::ReadPlan {
        datasets,
        chunks,
        sizing,
        server_version,
    } = crate::distributed::plan_read(job).await?;
    let inputs = plan_inputs(job).with_columns_of(&datasets);
    {
        let workers = sizing.workers.min(chunks.len()).max(1);
        let plans = datasets
            .iter()
            .map(|d| {
                let mine: Vec<_> = chunks.iter().filter(|c| c.dataset == d.name).collect();
                DatasetPlan {
                    name: d.name.clone(),
                    est_rows: d.estimate.rows,
                    est_bytes: d.estimate.bytes,
                    avg_row_bytes: d.estimate.avg_row_bytes(),
                    strategy: mine
                        .first()
                        .map(|c| strategy_of(&c.bounds))
                        .unwrap_or_default(),
                    chunks: mine.len(),
                    text_columns: d
                        .columns
                        .iter()
                        .filter(|c| c.as_text_fallback)
                        .map(|c| format!("{} ({})", c.name, c.source_type))
                        .collect(),
                }
            })
            .collect();
        let snapshot_connection = usize::from(job.consistency == Consistency::Snapshot);
        let mut notes = sizing.notes.clone();
        // The same decision as the export's, which is taken before the catalog is read.
        if let Some(why) = plan::request_refusal(&plan_inputs(job)) {
            notes.push(format!("an export would refuse to start: {why}"));
        }
        let predicted = predicted_peak_rss(workers, &budget(workers, &inputs), &inputs);
        notes.extend(plan::memory_note(workers, predicted, &inputs));
        if job.consistency == Consistency::Converged {
            let refusal = match &job.converge {
                Some(log) => crate::converge::check(job, log.as_ref(), &datasets)
                    .await
                    .err(),
                None => Some(sluice_core::Error::config(
                    "this build of sluice has no change log for --consistency converged",
                )),
            };
            match refusal {
                Some(e) => notes.push(format!("an export would refuse to start: {e}")),
                None => {
                    let seconds = sizing.work_seconds / workers as f64;
                    notes.extend(crate::converge::forecast(job, &datasets, &chunks, seconds).await);
                }
            }
        }
        if let Some(kind) = job.format.table_kind() {
            match crate::prepare::table_notes(kind, &datasets) {
                Ok(n) => notes.extend(n),
                Err(e) => notes.push(format!("an export would refuse to start: {e}")),
            }
        }
        Ok(PlanReport {
            source: format!("{} {}", job.source.engine(), job.source.display_url()),
            server_version,
            consistency: job.consistency.to_string(),
            workers,
            workers_reason: sizing.reason,
            work_seconds: sizing.work_seconds,
            chunk_bytes: sizing.chunk_bytes,
            batch_bytes: budget(workers, &inputs).batch_bytes,
            predicted_peak_rss_bytes: predicted,
            connections: workers + snapshot_connection + 1,
            cores_needed: plan::cores_per_worker(&datasets, inputs.server_local) * workers as f64,
            cores: inputs.cores,
            server_local: inputs.server_local,
            notes,
            datasets: plans,
            signals: crate::governor::probe_signals(job).await,
        })
    }
}
