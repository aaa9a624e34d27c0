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
//! Memory is bounded by bytes: each worker holds at most one batch being decoded, one in the
//! channel and one being encoded, plus the writer's open row group. The prediction is
//! `BASE + workers × (3 × batch + row group + WORKER_OVERHEAD)`.

use sluice_core::Dataset;
use std::time::Duration;

/// Client CPU per row (decode, encode), seconds.
pub const ROW_COST: f64 = 150e-9;
/// Client CPU per source byte (copy, encode, compress), seconds.
pub const BYTE_COST: f64 = 2e-9;
/// Estimated work that justifies one more worker.
pub const WORK_PER_WORKER: Duration = Duration::from_secs(1);
/// Memory of the process before any data: runtime, drivers, allocator.
pub const BASE_RSS: u64 = 16 << 20;
/// Per-worker memory besides batches and the row group (socket buffers, page buffers).
pub const WORKER_OVERHEAD: u64 = 4 << 20;
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
    /// Batch byte budget.
    pub batch_bytes: usize,
    /// Parquet row group byte budget (0 for formats that hold no row group).
    pub row_group_bytes: usize,
    /// Cores of this machine.
    pub cores: usize,
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

/// Predicted peak resident memory for `workers`.
pub fn predicted_peak_rss(workers: usize, inputs: &PlanInputs) -> u64 {
    BASE_RSS
        + workers as u64
            * (3 * inputs.batch_bytes as u64 + inputs.row_group_bytes as u64 + WORKER_OVERHEAD)
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
        }
    }

    fn inputs(cores: usize) -> PlanInputs {
        PlanInputs {
            parallel: None,
            chunk_bytes: None,
            batch_bytes: 8 << 20,
            row_group_bytes: 16 << 20,
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
    fn memory_prediction_grows_with_workers() {
        let i = inputs(2);
        assert!(predicted_peak_rss(2, &i) > predicted_peak_rss(1, &i));
    }
}
