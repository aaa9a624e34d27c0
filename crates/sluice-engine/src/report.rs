//! What a run reports when it ends — throughput, memory, the harm done to the source, what each
//! dataset's rows are — built in one place (`Report::build`), with the wording of its notes.

use crate::governor::timeline::Timeline;
use crate::job::ExportJob;
use crate::manifest::{DatasetRecord, Guarantee, HarmRecord, PartRecord};
use crate::phase::{PhaseRecord, PhaseTimer};
use crate::rss::peak_rss_bytes;
use serde::{Deserialize, Serialize};
use sluice_core::{Consistency, ReadCounters};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Per-dataset figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetReport {
    /// Dataset name.
    pub name: String,
    /// Rows written (all parts, including parts of earlier runs when resuming).
    pub rows: u64,
    /// Bytes of its files.
    pub bytes: u64,
    /// Number of files.
    pub parts: usize,
    /// What its rows are guaranteed to be (the manifest's `guarantee`, in words).
    pub guarantee: String,
}

/// The end-of-run report (also written as JSON with `--report-json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Run identifier (also in the sessions' `application_name`: `sluice-<run_id>`).
    pub run_id: String,
    /// Source engine and redacted URL.
    pub source: String,
    /// Server version.
    pub server_version: String,
    /// Output location.
    pub destination: String,
    /// Output format.
    pub format: String,
    /// `snapshot` or `chunk`.
    pub consistency: String,
    /// The position of the snapshot this run read under.
    pub position: String,
    /// True when the output was already complete and nothing was done.
    pub already_complete: bool,
    /// Rows read in this run.
    pub rows: u64,
    /// Bytes received from the source in this run.
    pub bytes_read: u64,
    /// Bytes of files written in this run.
    pub bytes_written: u64,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
    /// Rows per second of wall time.
    pub rows_per_second: f64,
    /// Source megabytes read per second, MB being 2^20 bytes as in every size sluice reads or
    /// prints.
    pub mb_per_second: f64,
    /// Peak resident memory of the process, bytes.
    pub peak_rss_bytes: u64,
    /// The planner's prediction of the peak, bytes (see `plan::predicted_peak_rss`).
    pub predicted_peak_rss_bytes: u64,
    /// Batch byte budget used.
    pub batch_bytes: usize,
    /// Workers used.
    pub workers: usize,
    /// Parts written in this run.
    pub parts_written: usize,
    /// Parts already committed by an earlier run and skipped.
    pub parts_skipped: usize,
    /// Chunk reads retried after a transient error.
    pub retries: u64,
    /// Harm to the source.
    pub harm: HarmRecord,
    /// Columns exported as text because their type has no native mapping (`dataset.column
    /// (type)`).
    pub text_fallback_columns: Vec<String>,
    /// Per-dataset totals.
    pub datasets: Vec<DatasetReport>,
    /// Things the user should know (consistency caveats, resumed snapshots).
    pub notes: Vec<String>,
    /// Where the time went: each phase of the run with its duration, in order (see
    /// `crate::phase`). Absent from reports written before phases were timed.
    #[serde(default)]
    pub phases: Vec<PhaseRecord>,
    /// The run second by second: throughput, workers allowed, each harm-budget signal against
    /// its limit, and every pause with its reason. Absent when nothing was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
}

/// What a run knows when it ends, for [`Report::build`]: the one place a report is put
/// together, whether the run read everything or found the output already complete.
pub(crate) struct Outcome<'a> {
    /// The request.
    pub job: &'a ExportJob,
    /// This run's identifier.
    pub run_id: String,
    /// The server's version (empty when no session was opened).
    pub server_version: String,
    /// When the run started.
    pub started: Instant,
    /// The position of the snapshot read under (empty when none).
    pub position: String,
    /// True when the output was already complete.
    pub already_complete: bool,
    /// Rows and bytes read in this run.
    pub counters: Option<&'a ReadCounters>,
    /// Receipts of the parts this run wrote.
    pub committed: Vec<PartRecord>,
    /// Parts of earlier runs kept.
    pub skipped: usize,
    /// Workers, their batch budget and the predicted peak memory.
    pub workers: usize,
    /// Batch byte budget.
    pub batch_bytes: usize,
    /// Predicted peak RSS.
    pub predicted_peak_rss: u64,
    /// Retries taken.
    pub retries: u64,
    /// Harm to the source.
    pub harm: HarmRecord,
    /// The datasets as the manifest records them.
    pub datasets: &'a [DatasetRecord],
    /// Remarks so far.
    pub notes: Vec<String>,
}

impl Report {
    /// The report of `o`, with the time of every phase of `phases`.
    pub(crate) fn build(o: Outcome<'_>, phases: &mut PhaseTimer) -> Report {
        let wall = o.started.elapsed().as_secs_f64();
        let (rows, bytes_read) = o
            .counters
            .map(|c| {
                (
                    c.rows.load(Ordering::Relaxed),
                    c.bytes.load(Ordering::Relaxed),
                )
            })
            .unwrap_or_default();
        let mut notes = o.notes;
        let mut text_fallback_columns = Vec::new();
        for ds in o.datasets {
            for c in ds.columns.iter().filter(|c| c.text_fallback) {
                text_fallback_columns.push(format!("{}.{} ({})", ds.name, c.name, c.source_type));
            }
            notes.extend(caveats(ds));
        }
        if o.already_complete {
            notes.push(
                "the output was already complete (manifest.json present) for the same \
                 request; nothing to do"
                    .into(),
            );
        }
        let per_second = |n: f64| if wall > 0.0 { n / wall } else { 0.0 };
        Report {
            run_id: o.run_id,
            source: format!("{} {}", o.job.source.engine(), o.job.source.display_url()),
            server_version: o.server_version,
            destination: o.job.destination.display(),
            format: o.job.format.describe(),
            consistency: o.job.consistency.to_string(),
            position: o.position,
            already_complete: o.already_complete,
            rows,
            bytes_read,
            bytes_written: o.committed.iter().map(|p| p.bytes).sum(),
            wall_seconds: wall,
            rows_per_second: per_second(rows as f64),
            mb_per_second: per_second(bytes_read as f64 / (1u64 << 20) as f64),
            peak_rss_bytes: peak_rss_bytes(),
            predicted_peak_rss_bytes: o.predicted_peak_rss,
            batch_bytes: o.batch_bytes,
            workers: o.workers,
            parts_written: o.committed.len(),
            parts_skipped: o.skipped,
            retries: o.retries,
            harm: o.harm,
            text_fallback_columns,
            datasets: o
                .datasets
                .iter()
                .map(|d| DatasetReport {
                    name: d.name.clone(),
                    rows: d.rows,
                    bytes: d.bytes,
                    parts: d.parts.len(),
                    guarantee: d
                        .guarantee
                        .as_ref()
                        .map(Guarantee::describe)
                        .unwrap_or_default(),
                })
                .collect(),
            notes,
            phases: phases.finish(),
            timeline: None,
        }
    }
}

/// The notes of the plan that the report carries: chunk consistency, several snapshots (the
/// memory and cores notes are `plan.rs`'s).
pub(crate) fn plan_notes(job: &ExportJob, snapshots: usize) -> Vec<String> {
    let mut notes = Vec::new();
    if job.consistency == Consistency::Chunk {
        notes.push(
            "consistency chunk: each part was read in its own transaction, so the output is not \
             one point in time; each dataset's guarantee (below, and \"guarantee\" in \
             manifest.json) says what its rows are"
                .into(),
        );
    }
    if snapshots > 1 && job.consistency == Consistency::Converged {
        notes.push(format!(
            "resumed: the chunks were read by {snapshots} runs, and the changes from the first \
             run's start to the end point were followed again, so the output is still one point \
             in time"
        ));
    } else if snapshots > 1 {
        notes.push(format!(
            "resumed: the parts come from {snapshots} snapshots (see manifest.json \"snapshots\" \
             and each part's \"snapshot\"); each dataset's guarantee says what that means for its \
             rows"
        ));
    }
    notes
}

/// Caveats of a dataset's record, for the report.
fn caveats(d: &DatasetRecord) -> Vec<String> {
    let mut out = Vec::new();
    if !d.outside_snapshot.is_empty() {
        out.push(format!(
            "{}: rows of {} (foreign) were read from their server or file when their part was \
             read, not as of the snapshot",
            d.name,
            d.outside_snapshot.join(", ")
        ));
    }
    if d.row_security_filtered {
        out.push(format!(
            "{}: row-level security policies filtered its rows (--enable-row-security): only \
             the rows the user may see were exported",
            d.name
        ));
    }
    out
}
