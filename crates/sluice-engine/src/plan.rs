//! The planner: how many workers, how big a chunk, how much memory — before any row is read.
//!
//! Work is estimated from **bytes and rows**, not rows alone: decoding and encoding cost per row
//! (narrow tables with many rows) and per byte (wide rows, long text, compression). The run's
//! client work in seconds is `rows × ROW_COST + bytes × BYTE_COST`; a worker is added for every
//! [`WORK_PER_WORKER`] of it, up to the client's cores (and never more than there are chunks).
//! So a tiny table gets one worker and one connection, and a large one — narrow or wide — gets
//! as many as the machine can use. The constants are calibrated from the benchmark lab
//! (`bench/`) on a 2-core machine; they steer the choice, they do not promise a duration.
//!
//! Memory is bounded by bytes: each worker holds at most two batches (one being decoded, one
//! being encoded) plus the writer's open row group (its encoded pages and page buffers). The
//! user gives one number, the memory target (`--memory`, default [`DEFAULT_MEMORY`]); the
//! planner splits what is left after [`BASE_RSS`] among the workers and derives the batch and
//! row-group budgets from it, so more workers get smaller batches rather than more memory:
//! `peak ≈ BASE + workers × (2 × batch + row group + WORKER_OVERHEAD + writer buffers)`, where
//! the writer buffers are an object store's upload parts in flight (none for local files).

use sluice_core::Dataset;
use std::time::Duration;

/// Client CPU per row (decode, encode), seconds.
pub const ROW_COST: f64 = 150e-9;
/// Client CPU per source byte (copy, encode, compress), seconds.
pub const BYTE_COST: f64 = 2e-9;
/// Estimated work that justifies one more worker.
pub const WORK_PER_WORKER: Duration = Duration::from_secs(1);
/// Memory of the process before any data: runtime, drivers, allocator.
pub const BASE_RSS: u64 = 14 << 20;
/// Per-worker memory besides batches and the row group (socket and read buffers).
pub const WORKER_OVERHEAD: u64 = 2 << 20;
/// Default memory target for the whole process.
pub const DEFAULT_MEMORY: u64 = 64 << 20;
/// Smallest batch the planner chooses.
pub const MIN_BATCH: usize = 256 << 10;
/// Largest batch the planner chooses.
pub const MAX_BATCH: usize = 16 << 20;
/// Smallest row group the planner chooses.
pub const MIN_ROW_GROUP: usize = 1 << 20;
/// Default chunk size bounds (source bytes).
pub const MIN_CHUNK: u64 = 64 << 20;
/// Largest default chunk.
pub const MAX_CHUNK: u64 = 256 << 20;
/// Most workers chosen automatically.
pub const MAX_AUTO_WORKERS: usize = 8;

/// What the user fixed and what the machine offers.
#[derive(Debug, Clone, Copy)]
pub struct PlanInputs {
    /// `--parallel`, if given.
    pub parallel: Option<usize>,
    /// `--chunk-size`, if given.
    pub chunk_bytes: Option<u64>,
    /// Memory target for the process (`--memory`).
    pub memory: u64,
    /// `--batch-size`, if given.
    pub batch_bytes: Option<usize>,
    /// `--row-group-size`, if given.
    pub row_group_bytes: Option<usize>,
    /// Whether the format holds a row group in memory (Parquet does, CSV does not).
    pub holds_row_group: bool,
    /// Whether batches are handed to a consumer in this process instead of encoded (the
    /// Python package's reads). The consumer holds batches too (the one it processes, the
    /// one waiting for it), and a batch it shares cannot be recycled, so every batch is
    /// built in fresh buffers that grow by doubling (up to twice its Arrow bytes): batches
    /// are a quarter of a worker's share instead of half.
    pub hands_over: bool,
    /// Destination buffers per worker's open file (object-store upload parts), bytes.
    pub writer_buffer_bytes: u64,
    /// Cores of this machine.
    pub cores: usize,
}

/// Byte budgets per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Arrow bytes per batch.
    pub batch_bytes: usize,
    /// Memory of the writer's open row group (0 when the format holds none).
    pub row_group_bytes: usize,
}

/// Split the memory target among `workers`.
pub fn budget(workers: usize, inputs: &PlanInputs) -> Budget {
    let per_worker = (inputs
        .memory
        .saturating_sub(BASE_RSS + workers as u64 * (WORKER_OVERHEAD + inputs.writer_buffer_bytes))
        / workers.max(1) as u64) as usize;
    let share = match (inputs.holds_row_group, inputs.hands_over) {
        (true, _) => 4,
        (false, true) => 4,
        (false, false) => 2,
    };
    let batch_bytes = inputs
        .batch_bytes
        .unwrap_or((per_worker / share).clamp(MIN_BATCH, MAX_BATCH));
    let row_group_bytes = match (inputs.holds_row_group, inputs.row_group_bytes) {
        (false, _) => 0,
        (true, Some(r)) => r,
        (true, None) => per_worker
            .saturating_sub(2 * batch_bytes)
            .max(MIN_ROW_GROUP),
    };
    Budget {
        batch_bytes,
        row_group_bytes,
    }
}

/// The planner's decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Sizing {
    /// Workers (and worker connections).
    pub workers: usize,
    /// Target chunk size in source bytes.
    pub chunk_bytes: u64,
    /// Estimated client work, seconds.
    pub work_seconds: f64,
    /// Why this many workers, in words.
    pub reason: String,
}

/// Estimated client work for datasets, in seconds.
pub fn work_seconds(datasets: &[Dataset]) -> f64 {
    datasets
        .iter()
        .map(|d| d.estimate.rows as f64 * ROW_COST + d.estimate.bytes as f64 * BYTE_COST)
        .sum()
}

/// Choose workers and chunk size for `datasets`.
pub fn size(datasets: &[Dataset], inputs: &PlanInputs) -> Sizing {
    let work = work_seconds(datasets);
    let max_auto = inputs.cores.clamp(1, MAX_AUTO_WORKERS);
    let (workers, reason) = match inputs.parallel {
        Some(n) => (n.max(1), "set by --parallel".to_string()),
        None => {
            let n = ((work / WORK_PER_WORKER.as_secs_f64()).ceil() as usize).clamp(1, max_auto);
            let why = if n == max_auto && n > 1 {
                format!("~{work:.1} s of client work; capped at {max_auto} (cores)")
            } else {
                format!(
                    "~{work:.1} s of client work, one worker per {} s",
                    WORK_PER_WORKER.as_secs()
                )
            };
            (n, why)
        }
    };
    let total: u64 = datasets.iter().map(|d| d.estimate.bytes).sum();
    let chunk_bytes = inputs
        .chunk_bytes
        .unwrap_or_else(|| (total / (4 * workers as u64).max(1)).clamp(MIN_CHUNK, MAX_CHUNK));
    Sizing {
        workers,
        chunk_bytes,
        work_seconds: work,
        reason,
    }
}

/// Predicted peak resident memory for `workers` with `budget`, each worker's open file
/// holding `writer_buffer_bytes` of destination buffers.
pub fn predicted_peak_rss(workers: usize, budget: &Budget, writer_buffer_bytes: u64) -> u64 {
    BASE_RSS
        + workers as u64
            * (2 * budget.batch_bytes as u64
                + budget.row_group_bytes as u64
                + WORKER_OVERHEAD
                + writer_buffer_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{DatasetKind, SizeEstimate};

    fn ds(rows: u64, bytes: u64) -> Dataset {
        Dataset {
            name: "t".into(),
            kind: DatasetKind::Table,
            object: None,
            relations: vec![],
            query: None,
            columns: vec![],
            primary_key: vec![],
            estimate: SizeEstimate { rows, bytes },
            outside_snapshot: Vec::new(),
            row_security_filtered: false,
        }
    }

    fn inputs(cores: usize) -> PlanInputs {
        PlanInputs {
            parallel: None,
            chunk_bytes: None,
            memory: DEFAULT_MEMORY,
            batch_bytes: None,
            row_group_bytes: None,
            holds_row_group: true,
            hands_over: false,
            writer_buffer_bytes: 0,
            cores,
        }
    }

    #[test]
    fn small_tables_get_one_worker_big_ones_many() {
        assert_eq!(size(&[ds(1_000, 100_000)], &inputs(8)).workers, 1);
        // 10 M narrow rows (~650 MB) and 300 k wide rows (~1.2 GB): both worth several workers,
        // the narrow one for its rows, the wide one for its bytes.
        let narrow = size(&[ds(10_000_000, 650 << 20)], &inputs(8));
        let wide = size(&[ds(300_000, 1200 << 20)], &inputs(8));
        assert!(
            narrow.workers >= 2 && wide.workers >= 2,
            "{narrow:?} {wide:?}"
        );
        assert_eq!(size(&[ds(1_000_000_000, 1 << 40)], &inputs(2)).workers, 2);
    }

    #[test]
    fn parallel_flag_wins_and_chunks_stay_in_range() {
        let s = size(
            &[ds(10, 10)],
            &PlanInputs {
                parallel: Some(6),
                ..inputs(2)
            },
        );
        assert_eq!(s.workers, 6);
        assert_eq!(s.chunk_bytes, MIN_CHUNK);
        let big = size(&[ds(1 << 30, 1 << 40)], &inputs(2));
        assert_eq!(big.chunk_bytes, MAX_CHUNK);
    }

    #[test]
    fn budgets_fit_the_memory_target() {
        let i = inputs(2);
        for workers in [1, 2, 4, 8] {
            let b = budget(workers, &i);
            assert!(
                predicted_peak_rss(workers, &b, 0) <= DEFAULT_MEMORY,
                "{workers} workers: {b:?}"
            );
            assert!(b.batch_bytes >= MIN_BATCH && b.row_group_bytes >= MIN_ROW_GROUP);
        }
        // More workers share the same memory: smaller batches.
        assert!(budget(4, &i).batch_bytes < budget(1, &i).batch_bytes);
        // CSV holds no row group: batches get the room.
        let csv = PlanInputs {
            holds_row_group: false,
            ..i
        };
        assert_eq!(budget(2, &csv).row_group_bytes, 0);
        assert!(budget(2, &csv).batch_bytes > budget(2, &i).batch_bytes);
        // Handing batches over: room for the consumer's batches and unrecycled buffers.
        let handed = PlanInputs {
            hands_over: true,
            ..csv
        };
        assert_eq!(budget(2, &handed).row_group_bytes, 0);
        assert!(2 * budget(2, &handed).batch_bytes <= budget(2, &csv).batch_bytes + 1);
        // An object store's upload parts come out of the same target: smaller batches.
        let upload = PlanInputs {
            writer_buffer_bytes: 15 << 20,
            ..i
        };
        assert!(budget(2, &upload).batch_bytes < budget(2, &i).batch_bytes);
        assert!(predicted_peak_rss(2, &budget(2, &upload), 15 << 20) <= DEFAULT_MEMORY);
        // What the user fixes is kept.
        let fixed = PlanInputs {
            batch_bytes: Some(1 << 20),
            ..i
        };
        assert_eq!(budget(2, &fixed).batch_bytes, 1 << 20);
    }
}
