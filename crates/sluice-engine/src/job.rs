//! The validated request the engine runs. The CLI builds it from flags and YAML; a library user
//! builds it directly.

use crate::converge::ChangeLog;
use crate::governor::HarmBudget;
use crate::retry::RetryPolicy;
use sluice_core::{Chunk, ChunkStrategy, Consistency, Selection, Source};
use sluice_sink::table::TableCommitter;
use sluice_sink::{Destination, FormatOptions, OutputLock};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// An export to run.
#[derive(Clone)]
pub struct ExportJob {
    /// Where to read.
    pub source: Arc<dyn Source>,
    /// Where to write.
    pub destination: Arc<dyn Destination>,
    /// What to read.
    pub selection: Selection,
    /// Output format.
    pub format: FormatOptions,
    /// How to split datasets.
    pub chunking: ChunkStrategy,
    /// Target chunk size in source bytes; `None` lets the planner choose (64–256 MB).
    pub chunk_bytes: Option<u64>,
    /// Snapshot or per-chunk consistency.
    pub consistency: Consistency,
    /// Worker count; `None` lets the planner choose.
    pub parallel: Option<usize>,
    /// Memory target for the whole process; batch and row-group budgets are derived from it
    /// (see `plan::budget`).
    pub memory: u64,
    /// Batch byte budget, overriding the one derived from `memory`.
    pub batch_bytes: Option<usize>,
    /// Parquet row-group memory, overriding the one derived from `memory`.
    pub row_group_bytes: Option<usize>,
    /// Finish an interrupted export.
    pub resume: bool,
    /// Replace a previous export at the destination.
    pub overwrite: bool,
    /// Write one file per dataset (`<dataset>.<ext>`) instead of one per chunk.
    pub merge: bool,
    /// Export only the rows row-level security policies let the user see, instead of failing
    /// on a table whose policies would filter rows (`--enable-row-security`).
    pub enable_row_security: bool,
    /// Retry bounds for transient failures.
    pub retry: RetryPolicy,
    /// How often the harm monitor samples.
    pub harm_interval: Duration,
    /// The output's lock, already held by the caller (a stream locks its output before it
    /// inspects it and keeps it across its initial snapshot and the streaming after it): the
    /// export uses it instead of taking its own, and leaves releasing it to the caller.
    pub held_lock: Option<Arc<dyn OutputLock>>,
    /// The harm budget: limits on foreign-load signals the run keeps to by changing its pace
    /// between chunks (see `crate::governor`). The default governs nothing.
    pub budget: HarmBudget,
    /// Also render the report as a self-contained HTML page to this local file.
    pub report_html: Option<PathBuf>,
    /// Makes the table commit of a table format (`FormatOptions::Delta`, `FormatOptions::Iceberg`): required with one,
    /// unused otherwise. Given by the caller so that the engine does not link a table
    /// library (the CLI passes `sluice-lake`'s).
    pub table: Option<Arc<dyn TableCommitter>>,
    /// Read exactly these chunks, planned by another process ([`crate::distributed`]),
    /// instead of planning: a distributed engine's task reads its share of one plan. Every
    /// chunk must belong to a dataset the selection holds. `None`: plan as usual.
    pub chunks: Option<Vec<Chunk>>,
    /// The tag the run's sessions carry, which the harm monitor finds them by; `None`:
    /// `sluice-<run id>`. A distributed read's tasks take their snapshot holder's, so the
    /// holder's monitor sees every session that reads under its snapshot.
    pub session_tag: Option<String>,
    /// Open no harm probe of its own: a distributed read's task, whose sessions the shared
    /// snapshot's holder samples under their common tag — a probe per task would add a
    /// session and a query every 100 ms per executor to the source it is meant to spare.
    pub harm_sampled_elsewhere: bool,
    /// The source's change log, for `Consistency::Converged` (required with it, unused
    /// otherwise). Given by the caller so that the engine does not link change capture (the
    /// CLI passes the stream crate's).
    pub converge: Option<Arc<dyn ChangeLog>>,
}

impl ExportJob {
    /// A job with defaults for everything but what and where.
    pub fn new(
        source: Arc<dyn Source>,
        destination: Arc<dyn Destination>,
        selection: Selection,
        format: FormatOptions,
    ) -> Self {
        ExportJob {
            source,
            destination,
            selection,
            format,
            chunking: ChunkStrategy::Auto,
            chunk_bytes: None,
            consistency: Consistency::Snapshot,
            parallel: None,
            memory: crate::plan::DEFAULT_MEMORY,
            batch_bytes: None,
            row_group_bytes: None,
            resume: false,
            overwrite: false,
            merge: false,
            enable_row_security: false,
            retry: RetryPolicy::default(),
            harm_interval: Duration::from_millis(100),
            held_lock: None,
            budget: HarmBudget::default(),
            report_html: None,
            table: None,
            chunks: None,
            session_tag: None,
            harm_sampled_elsewhere: false,
            converge: None,
        }
    }
}
