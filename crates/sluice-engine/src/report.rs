//! What a run reports when it ends: throughput, memory, and the harm done to the source.

use crate::phase::PhaseRecord;
use serde::{Deserialize, Serialize};
use sluice_sink::manifest::HarmRecord;

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
}
