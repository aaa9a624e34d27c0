//! The planner: how many workers, how big a chunk, how much memory — before any row is read.
//! (Past 500 lines because the second half is the unit tests that pin the model's constants
//! and decisions; they stay beside what they check.)
//!
//! Work is estimated from **bytes and rows**, not rows alone: decoding and encoding cost per row
//! (narrow tables with many rows) and per byte (wide rows, long text, compression). The run's
//! client work in seconds is `rows × ROW_COST + bytes × BYTE_COST`; a worker is added for every
//! [`WORK_PER_WORKER`] of it. The constants are calibrated from the benchmark lab (`bench/`);
//! they steer the choice, they do not promise a duration.
//!
//! **Cores.** A worker is one server backend streaming COPY plus two client threads (decode,
//! encode). It goes as fast as its slowest stage, and keeps the others partly busy: it needs
//! `(client + server on this machine) / slowest stage` cores, where the client's two threads
//! split its work. When the workers need more cores than the machine has, they share them,
//! and a higher worker count is slower, not faster (more connections, more switching, the
//! server starved of the cores the client takes). So the default stops at what the machine
//! can feed, and `sluice plan` says when a requested count is past it. Whether the server
//! shares the machine is judged from its host (loopback or a Unix socket).
//!
//! **Memory** is bounded by bytes: each worker holds its batches (one being decoded, one being
//! encoded, and the copies the Parquet writer makes of some columns) plus the writer's open row
//! group (its encoded pages and page buffers). The user gives one number, the memory target
//! (`--memory`, default [`DEFAULT_MEMORY`]); the planner splits what is left after
//! [`BASE_RSS`] and each worker's fixed costs among the workers and derives the batch and
//! row-group budgets from it, so more workers get smaller budgets rather than more memory:
//!
//! ```text
//! peak ≈ BASE_RSS + workers × (copies × batch + ROW_GROUP_FACTOR × row group
//!                              + WORKER_OVERHEAD + columns × COLUMN_OVERHEAD
//!                              + TEXT_PAGE_FLUSH if any text column + writer buffers)
//! ```
//!
//! where `copies` is [`BATCH_COPIES_PARQUET`] (Parquet) or 2 (CSV), the columns are the widest
//! dataset's (Parquet only, as [`TEXT_PAGE_FLUSH`]) and the writer buffers are an object store's upload parts in
//! flight (none for local files). Each constant's documentation gives the measurement behind
//! it; docs/perf/benchmarks.md ("Memory model") compares the sum with measured peaks.
//! Row groups never go below [`MIN_ROW_GROUP`] (smaller ones make files slow to read), nor
//! batches below [`MIN_BATCH`]: when the workers requested cannot fit the target with those,
//! the default picks fewer workers, and an explicit `--parallel` is refused with the memory it
//! needs ([`memory_needed`]), from the request alone, before the output or the source is
//! touched. The columns are known only once the catalog is read; when many columns push the
//! prediction past the target although the refusal let the run start, the plan and the report
//! say how much more it needs ([`memory_note`]).

use arrow_schema::Schema;
use sluice_core::Dataset;
use std::time::Duration;

/// Client CPU per row (decode, encode), seconds.
pub const ROW_COST: f64 = 150e-9;
/// Client CPU per source byte (copy, encode, compress), seconds.
pub const BYTE_COST: f64 = 2e-9;
/// Server CPU per row of a binary COPY (one backend), seconds.
pub const SERVER_ROW_COST: f64 = 290e-9;
/// Server CPU per source byte of a binary COPY (one backend), seconds.
pub const SERVER_BYTE_COST: f64 = 6e-9;
/// Estimated work that justifies one more worker.
pub const WORK_PER_WORKER: Duration = Duration::from_secs(1);
/// Memory of the process before any data: the binary's code that a run keeps resident (12 MB
/// of the release binary's text in the benchmark lab), shared libraries, the runtime, the
/// coordinator's session. Measured: a release run refused before it connects peaks at 13.9 MiB;
/// the coordinator's session, catalog and snapshot are counted as 2 MB more.
pub const BASE_RSS: u64 = 16 << 20;
/// Per-worker memory besides batches, the row group and the columns (session, socket and read
/// buffers, decoder). Checked against the narrow lab table at 1, 2, 4 and 8 workers
/// (docs/perf/benchmarks.md, "Memory model"): with 1 MB the model never under-predicted and
/// over-predicted by 6 MiB at 8 workers (under 1 MB per worker), so it is not set lower.
pub const WORKER_OVERHEAD: u64 = 1 << 20;
/// Per-worker memory for each column a Parquet writer writes, besides the row group: the
/// column writer's compression context, statistics and encoder state (measured: the 21-column
/// wide table costs about 4 MB more per worker than the 5-column narrow one).
pub const COLUMN_OVERHEAD: u64 = 256 << 10;
/// Per-worker memory of a Parquet writer with text or binary columns, besides the row group:
/// while a text page (up to 2 MB, `sluice_sink::parquet::TEXT_PAGE_MAX`) is flushed, its
/// compressed copy and the zstd context of level 3 for it. Measured on the lab's wide table at
/// 2 workers and the default --memory: peak RSS 5.3 MB higher with those pages than with the
/// earlier 220 KB pages at level 1 (docs/perf/encodings.md).
pub const TEXT_PAGE_FLUSH: u64 = 3 << 20;
/// Batches a Parquet worker holds, counted in batch budgets: the one being decoded, the one
/// being encoded, and the copies the Parquet writer makes of some columns while encoding
/// (timestamps are cast to 64-bit integers): measured 2.1 (wide) to 2.6 (narrow). CSV renders
/// from the batch itself: 2.
pub const BATCH_COPIES_PARQUET: f64 = 2.5;
/// Batches a worker holds, counted in batch budgets, when batches are handed to a consumer in
/// this process (the Python package's reads): the one being filled and the one waiting to be
/// taken, the consumer's (the one it processes, the one queued for it), and, since a batch the
/// consumer shares is never recycled, fresh buffers that grow by doubling (up to twice a
/// batch's Arrow bytes). Measured: 4 M narrow rows read with a 32 MB target and 2 workers
/// raised the interpreter's peak RSS by 27–31 MB with 4, by 34 MB with 3
/// (python/tests/test_memory.py).
pub const BATCH_COPIES_HANDED_OVER: f64 = 4.0;
/// Default memory target for the whole process.
pub const DEFAULT_MEMORY: u64 = 64 << 20;
/// Smallest batch the planner chooses.
pub const MIN_BATCH: usize = 256 << 10;
/// Largest batch the planner chooses.
pub const MAX_BATCH: usize = 16 << 20;
/// What a Parquet writer holds per byte of its row-group budget: the row group is closed after
/// the batch that crosses the budget, and its pages are small allocations with some slack
/// between them. Measured 0.9 (wide) to 1.16 (narrow, one worker), once the writer hands each
/// freed row group back to the system (`sluice_core::memory`); without that the narrow table
/// at 2 workers peaked 8 MB higher.
pub const ROW_GROUP_FACTOR: f64 = 1.1;
/// With a format that holds a row group, each of a worker's batches gets 1/this of its memory
/// and the row group the rest. Memory is worth more in the row group: it decides the file (in
/// the benchmark lab the wide table's files were 7% smaller with 16 MB row groups than with
/// 6 MB), while batches past a megabyte save no CPU (the narrow table at 2 workers spent the
/// same client CPU per row with 1, 3 and 6 MB batches, the wide one with 1 and 4 MB). Without
/// a row group (CSV) each batch gets half.
pub const BATCH_SHARE_WITH_ROW_GROUP: usize = 16;
/// Smallest row group the planner chooses: memory of the open row group (encoded pages and
/// page buffers), about that much of compressed column data in the file. Every row group of a
/// part but its last holds at least this much.
pub const MIN_ROW_GROUP: usize = 4 << 20;
/// Default chunk size bounds (source bytes).
pub const MIN_CHUNK: u64 = 64 << 20;
/// Largest default chunk.
pub const MAX_CHUNK: u64 = 256 << 20;
/// Most workers chosen automatically.
pub const MAX_AUTO_WORKERS: usize = 16;

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
    /// Python package's reads; see [`BATCH_COPIES_HANDED_OVER`]).
    pub hands_over: bool,
    /// Destination buffers per worker's open file (object-store upload parts), bytes.
    pub writer_buffer_bytes: u64,
    /// Cores of this machine.
    pub cores: usize,
    /// Whether the database server runs on this machine (and so competes for its cores).
    pub server_local: bool,
    /// Columns of the widest dataset (0 until the catalog is read): a Parquet writer's fixed
    /// cost per worker grows with them ([`COLUMN_OVERHEAD`]).
    pub columns: usize,
    /// Whether a dataset has a text or binary column (false until the catalog is read): a
    /// Parquet writer then flushes large text pages ([`TEXT_PAGE_FLUSH`]).
    pub has_text: bool,
}

impl PlanInputs {
    /// These inputs with the columns of the widest of `datasets`.
    pub fn with_columns_of(self, datasets: &[Dataset]) -> Self {
        PlanInputs {
            columns: datasets.iter().map(|d| d.columns.len()).max().unwrap_or(0),
            has_text: datasets.iter().any(|d| {
                sluice_sink::parquet::has_text_columns(&Schema::new(
                    d.columns
                        .iter()
                        .map(|c| c.field.clone())
                        .collect::<Vec<_>>(),
                ))
            }),
            ..self
        }
    }

    /// Batch budgets a worker holds at once (see [`BATCH_COPIES_PARQUET`] and
    /// [`BATCH_COPIES_HANDED_OVER`]).
    fn batch_copies(&self) -> f64 {
        if self.holds_row_group {
            BATCH_COPIES_PARQUET
        } else if self.hands_over {
            BATCH_COPIES_HANDED_OVER
        } else {
            2.0
        }
    }

    /// A worker's memory that no budget governs: its fixed overhead, its columns' (Parquet),
    /// the destination's upload buffers.
    fn worker_fixed(&self) -> u64 {
        let columns = if self.holds_row_group {
            self.columns as u64 * COLUMN_OVERHEAD + if self.has_text { TEXT_PAGE_FLUSH } else { 0 }
        } else {
            0
        };
        WORKER_OVERHEAD + columns + self.writer_buffer_bytes
    }
}

/// Byte budgets per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
        .saturating_sub(BASE_RSS + workers as u64 * inputs.worker_fixed())
        / workers.max(1) as u64) as usize;
    let copies = inputs.batch_copies();
    let share = if inputs.holds_row_group {
        BATCH_SHARE_WITH_ROW_GROUP
    } else {
        copies as usize
    };
    // Batches give way first: the smallest row group (with its buffers) is kept.
    let room = if inputs.holds_row_group && inputs.row_group_bytes.is_none() {
        (per_worker.saturating_sub((MIN_ROW_GROUP as f64 * ROW_GROUP_FACTOR) as usize) as f64
            / copies) as usize
    } else {
        usize::MAX
    };
    let batch_bytes = inputs
        .batch_bytes
        .unwrap_or((per_worker / share).min(room).clamp(MIN_BATCH, MAX_BATCH));
    let row_group_bytes = match (inputs.holds_row_group, inputs.row_group_bytes) {
        (false, _) => 0,
        (true, Some(r)) => r,
        (true, None) => (((per_worker as f64 - copies * batch_bytes as f64).max(0.0)
            / ROW_GROUP_FACTOR) as usize)
            .max(MIN_ROW_GROUP),
    };
    Budget {
        batch_bytes,
        row_group_bytes,
    }
}

/// Memory one worker needs at least: its batches at the smallest budget (or `--batch-size`),
/// the smallest row group (or `--row-group-size`), its fixed costs. Without the columns
/// (`inputs.columns` 0) this is what any table needs, which is what a refusal may rest on
/// before the catalog is read.
pub fn min_worker_bytes(inputs: &PlanInputs) -> u64 {
    let batch = inputs.batch_bytes.unwrap_or(MIN_BATCH) as f64;
    let row_group = match (inputs.holds_row_group, inputs.row_group_bytes) {
        (false, _) => 0.0,
        (true, Some(r)) => r as f64 * ROW_GROUP_FACTOR,
        (true, None) => MIN_ROW_GROUP as f64 * ROW_GROUP_FACTOR,
    };
    (inputs.batch_copies() * batch + row_group) as u64 + inputs.worker_fixed()
}

/// The smallest memory target under which `workers` workers fit.
pub fn memory_needed(workers: usize, inputs: &PlanInputs) -> u64 {
    BASE_RSS + workers as u64 * min_worker_bytes(inputs)
}

/// The most workers whose smallest budgets fit the memory target (0 when not even one does).
pub fn workers_for_memory(inputs: &PlanInputs) -> usize {
    (inputs.memory.saturating_sub(BASE_RSS) / min_worker_bytes(inputs)) as usize
}

/// Client and server CPU seconds of `datasets`.
fn cpu_seconds(datasets: &[Dataset]) -> (f64, f64) {
    datasets.iter().fold((0.0, 0.0), |(c, s), d| {
        let (rows, bytes) = (d.estimate.rows as f64, d.estimate.bytes as f64);
        (
            c + rows * ROW_COST + bytes * BYTE_COST,
            s + rows * SERVER_ROW_COST + bytes * SERVER_BYTE_COST,
        )
    })
}

/// Cores one worker keeps busy: its client work plus, when the server shares the machine, its
/// backend's, over the time of its slowest stage (the backend, or the busier of the two client
/// threads, taken as half the client's work). At least 1.
pub fn cores_per_worker(datasets: &[Dataset], server_local: bool) -> f64 {
    let (client, server) = cpu_seconds(datasets);
    let slowest = server.max(client / 2.0);
    if slowest <= 0.0 {
        return 1.0;
    }
    let used = client + if server_local { server } else { 0.0 };
    (used / slowest).max(1.0)
}

/// The workers this machine's cores can feed (at least 1): the cores over what one worker
/// keeps busy, rounded **up**. A worker's stages (the backend, the decoder, the encoder) are
/// not all busy all the time, so a fraction of a core left over is better used by one more
/// worker than left idle: measured 2026-11-28 on 2 cores with the server local
/// (`docs/perf/workers.md`), the model's 1.4–1.6 cores per worker gave 1 worker, 13–15 %
/// slower than 2 on the lab's narrow and wide tables, and 2 were within 5 % of the best count.
pub fn workers_for_cores(datasets: &[Dataset], inputs: &PlanInputs) -> usize {
    ((inputs.cores.max(1) as f64 / cores_per_worker(datasets, inputs.server_local)).ceil() as usize)
        .max(1)
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
    /// Cores the chosen workers would keep busy (client, and the server when it is local).
    pub cores_needed: f64,
    /// Warnings about the choice: a worker count the machine cannot feed, or memory.
    pub notes: Vec<String>,
}

/// Estimated client work for datasets, in seconds.
pub fn work_seconds(datasets: &[Dataset]) -> f64 {
    cpu_seconds(datasets).0
}

/// Choose workers and chunk size for `datasets`.
pub fn size(datasets: &[Dataset], inputs: &PlanInputs) -> Sizing {
    let work = work_seconds(datasets);
    let per_worker = cores_per_worker(datasets, inputs.server_local);
    let fed = workers_for_cores(datasets, inputs);
    let fit = workers_for_memory(inputs);
    let where_server = if inputs.server_local {
        "client and server share"
    } else {
        "the client has"
    };
    let mut notes = Vec::new();
    let (workers, reason) = match inputs.parallel {
        Some(n) => {
            let n = n.max(1);
            if n > fed {
                notes.push(format!(
                    "cores: {n} workers need about {:.0} cores ({per_worker:.1} each) but {where_server} \
                     {}; past about {fed} worker(s) more add little and may be slower",
                    per_worker * n as f64,
                    inputs.cores
                ));
            }
            (n, "set by --parallel".to_string())
        }
        None => {
            let by_work = (work / WORK_PER_WORKER.as_secs_f64()).ceil() as usize;
            let n = by_work.min(fed).min(fit).clamp(1, MAX_AUTO_WORKERS);
            let why = if n == by_work.max(1) {
                format!(
                    "~{work:.1} s of client work, one worker per {} s",
                    WORK_PER_WORKER.as_secs()
                )
            } else if n == fed {
                format!(
                    "~{work:.1} s of client work; {n} keep the {} cores {where_server} busy \
                     ({per_worker:.1} cores per worker)",
                    inputs.cores
                )
            } else if n == fit.max(1) {
                format!(
                    "~{work:.1} s of client work; capped at {n} by --memory {} MB",
                    inputs.memory >> 20
                )
            } else {
                format!("~{work:.1} s of client work; capped at {MAX_AUTO_WORKERS}")
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
        cores_needed: per_worker * workers as f64,
        notes,
    }
}

/// Why `workers` cannot run within the memory target, with what they need and the ways out;
/// `None` when they fit.
pub fn memory_refusal(workers: usize, inputs: &PlanInputs) -> Option<String> {
    let need = memory_needed(workers, inputs);
    if need <= inputs.memory {
        return None;
    }
    let fit = workers_for_memory(inputs);
    let lower = if fit >= 1 {
        format!(" or lower --parallel to {fit}")
    } else {
        String::new()
    };
    let uploads = if inputs.writer_buffer_bytes > 0 {
        format!(
            ", {} MB of upload parts (--part-size × (1 + --upload-concurrency))",
            inputs.writer_buffer_bytes >> 20
        )
    } else {
        String::new()
    };
    let row_group = if inputs.holds_row_group {
        let r = inputs.row_group_bytes.unwrap_or(MIN_ROW_GROUP);
        format!(
            ", a row group of {} MB (with its page buffers, {:.1} MB)",
            r >> 20,
            r as f64 * ROW_GROUP_FACTOR / (1 << 20) as f64
        )
    } else {
        String::new()
    };
    let fixed = inputs.worker_fixed() - inputs.writer_buffer_bytes;
    Some(format!(
        "{workers} worker(s) need at least {} MB but --memory is {} MB: each holds batches of \
         {} KB ({:.1} MB in all){row_group}{uploads} and {:.1} MB of buffers, besides {} MB for \
         the process. Raise --memory to {}MB{lower}.",
        need.div_ceil(1 << 20),
        inputs.memory >> 20,
        inputs.batch_bytes.unwrap_or(MIN_BATCH) >> 10,
        inputs.batch_copies() * inputs.batch_bytes.unwrap_or(MIN_BATCH) as f64 / (1 << 20) as f64,
        fixed as f64 / (1 << 20) as f64,
        BASE_RSS >> 20,
        need.div_ceil(1 << 20),
    ))
}

/// Why the request in `inputs` cannot start within its memory target (`None` when it can):
/// the workers it asks for (`--parallel`, else the one worker every run needs) must fit with
/// their smallest budgets. Only the request decides, never the data, so a run refuses before
/// it touches the output or the source, and `sluice plan` says the same beforehand.
pub fn request_refusal(inputs: &PlanInputs) -> Option<String> {
    memory_refusal(inputs.parallel.unwrap_or(1).max(1), inputs)
}

/// Predicted peak resident memory for `workers` with `budget` (the model in the module
/// documentation).
pub fn predicted_peak_rss(workers: usize, budget: &Budget, inputs: &PlanInputs) -> u64 {
    let per_worker = inputs.batch_copies() * budget.batch_bytes as f64
        + budget.row_group_bytes as f64 * ROW_GROUP_FACTOR;
    BASE_RSS + workers as u64 * (per_worker as u64 + inputs.worker_fixed())
}

/// When the prediction for `workers` exceeds the memory target although the request was not
/// refused (many columns, or budgets fixed by flag), what it needs and the ways out.
pub fn memory_note(workers: usize, predicted: u64, inputs: &PlanInputs) -> Option<String> {
    (predicted > inputs.memory).then(|| {
        format!(
            "memory: {workers} worker(s) need about {} MB with these budgets ({} columns at \
             most, {} KB each per worker{}), more than --memory {} MB; raise --memory or lower \
             --parallel",
            predicted.div_ceil(1 << 20),
            inputs.columns,
            if inputs.holds_row_group {
                COLUMN_OVERHEAD >> 10
            } else {
                0
            },
            if inputs.holds_row_group && inputs.has_text {
                format!(", {} MB for text pages", TEXT_PAGE_FLUSH >> 20)
            } else {
                String::new()
            },
            inputs.memory >> 20
        )
    })
}

/// Whether the server at `display_url` (a redacted URL) runs on this machine: a loopback host
/// or a Unix socket. Unknown forms count as remote.
pub fn server_is_local(display_url: &str) -> bool {
    let rest = display_url.split_once("://").map_or("", |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split([':', ',']).next().unwrap_or("")
    };
    let host = host.to_ascii_lowercase();
    host.is_empty()
        || host.starts_with('/')
        || host.starts_with("%2f")
        || host == "localhost"
        || host.starts_with("127.")
        || host == "::1"
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
            columns_picked: false,
            row_filter: Vec::new(),
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
            server_local: false,
            columns: 5,
            has_text: false,
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
        let fit = workers_for_memory(&i);
        assert!(fit >= 4, "{fit}");
        for workers in 1..=fit {
            let b = budget(workers, &i);
            assert!(
                predicted_peak_rss(workers, &b, &i) <= DEFAULT_MEMORY,
                "{workers} workers: {b:?}"
            );
            assert!(b.batch_bytes >= MIN_BATCH && b.row_group_bytes >= MIN_ROW_GROUP);
            assert!(memory_refusal(workers, &i).is_none());
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
        assert!(predicted_peak_rss(2, &budget(2, &upload), &upload) <= DEFAULT_MEMORY);
        // What the user fixes is kept.
        let fixed = PlanInputs {
            batch_bytes: Some(1 << 20),
            ..i
        };
        assert_eq!(budget(2, &fixed).batch_bytes, 1 << 20);
    }

    #[test]
    fn workers_past_the_memory_target_are_refused_or_not_chosen() {
        let many = PlanInputs {
            cores: 64,
            ..inputs(64)
        };
        let fit = workers_for_memory(&many);
        // The default never picks more than fit, however much work and however many cores.
        let s = size(&[ds(1 << 34, 1 << 42)], &many);
        assert_eq!(s.workers, fit, "{s:?}");
        assert!(s.reason.contains("--memory"), "{}", s.reason);
        // An explicit count that does not fit is refused with what it needs and the ways out.
        let why = memory_refusal(fit + 8, &many).expect("refused");
        let need = memory_needed(fit + 8, &many);
        assert!(need > DEFAULT_MEMORY);
        assert!(
            why.contains(&format!("--memory to {}MB", need.div_ceil(1 << 20)))
                && why.contains(&format!("--parallel to {fit}")),
            "{why}"
        );
        // Row groups are never shrunk below the minimum to make room.
        assert!(budget(fit + 8, &many).row_group_bytes >= MIN_ROW_GROUP);
        // More memory admits them.
        let roomy = PlanInputs {
            memory: need,
            ..many
        };
        assert!(memory_refusal(fit + 8, &roomy).is_none());
    }

    #[test]
    fn the_model_predicts_the_lab_peaks_and_fills_the_default_target() {
        // The lab's narrow table (5 columns) at 2 workers on the default target: the budgets
        // use the target without passing it, and the row group stays well above the minimum.
        let narrow = PlanInputs {
            parallel: Some(2),
            ..inputs(2)
        };
        let b = budget(2, &narrow);
        let predicted = predicted_peak_rss(2, &b, &narrow);
        assert!(
            predicted <= DEFAULT_MEMORY && predicted > DEFAULT_MEMORY - (2 << 20),
            "{predicted} {b:?}"
        );
        assert!(b.row_group_bytes >= 3 * MIN_ROW_GROUP, "{b:?}");
        // The prediction is the documented sum, term by term.
        let per_worker = BATCH_COPIES_PARQUET * b.batch_bytes as f64
            + ROW_GROUP_FACTOR * b.row_group_bytes as f64;
        assert_eq!(
            predicted,
            BASE_RSS + 2 * (per_worker as u64 + WORKER_OVERHEAD + 5 * COLUMN_OVERHEAD)
        );
        // CSV counts two batches and no column costs.
        let csv = PlanInputs {
            holds_row_group: false,
            ..narrow
        };
        let c = budget(2, &csv);
        assert_eq!(
            predicted_peak_rss(2, &c, &csv),
            BASE_RSS + 2 * (2 * c.batch_bytes as u64 + WORKER_OVERHEAD)
        );
        // Budgets fixed by flag are predicted as given, even past the target.
        let fixed = PlanInputs {
            row_group_bytes: Some(64 << 20),
            ..narrow
        };
        assert!(predicted_peak_rss(2, &budget(2, &fixed), &fixed) > 2 * (64 << 20));
    }

    #[test]
    fn the_refusal_itemises_what_a_worker_holds() {
        // --parallel 16 with the default target, before the catalog is read (no columns).
        let asked = PlanInputs {
            parallel: Some(16),
            columns: 0,
            ..inputs(16)
        };
        let why = request_refusal(&asked).expect("refused");
        let need = memory_needed(16, &asked);
        let fit = workers_for_memory(&asked);
        assert!((1..16).contains(&fit), "{fit}");
        for part in [
            format!("16 worker(s) need at least {} MB", need.div_ceil(1 << 20)),
            "--memory is 64 MB".to_string(),
            format!(
                "batches of {} KB ({:.1} MB in all)",
                MIN_BATCH >> 10,
                BATCH_COPIES_PARQUET * MIN_BATCH as f64 / (1 << 20) as f64
            ),
            format!(
                "a row group of {} MB (with its page buffers, {:.1} MB)",
                MIN_ROW_GROUP >> 20,
                MIN_ROW_GROUP as f64 * ROW_GROUP_FACTOR / (1 << 20) as f64
            ),
            format!("besides {} MB for the process", BASE_RSS >> 20),
            format!(
                "Raise --memory to {}MB or lower --parallel to {fit}.",
                need.div_ceil(1 << 20)
            ),
        ] {
            assert!(why.contains(&part), "{part:?} missing from: {why}");
        }
        // What is needed is the model's sum at the smallest budgets.
        assert_eq!(
            need,
            BASE_RSS
                + 16 * ((BATCH_COPIES_PARQUET * MIN_BATCH as f64
                    + ROW_GROUP_FACTOR * MIN_ROW_GROUP as f64) as u64
                    + WORKER_OVERHEAD)
        );
        // Upload parts are named with the flags that set them.
        let upload = PlanInputs {
            writer_buffer_bytes: 24 << 20,
            ..asked
        };
        let why = request_refusal(&upload).expect("refused");
        assert!(why.contains("24 MB of upload parts (--part-size"), "{why}");
        // The request that fits is not refused.
        assert!(
            request_refusal(&PlanInputs {
                parallel: Some(fit),
                ..asked
            })
            .is_none()
        );
    }

    #[test]
    fn the_default_picks_fewer_workers_for_wider_tables() {
        // Plenty of work and cores: memory decides, and a wide table's columns cost memory
        // per worker, so the same target feeds fewer of its workers.
        let big = [ds(1 << 34, 1 << 42)];
        let narrow = PlanInputs {
            memory: DEFAULT_MEMORY,
            ..inputs(64)
        };
        let wide = PlanInputs {
            columns: 21,
            ..narrow
        };
        let (n, w) = (size(&big, &narrow), size(&big, &wide));
        assert!(w.workers < n.workers, "{n:?} {w:?}");
        for (s, i) in [(&n, &narrow), (&w, &wide)] {
            assert_eq!(s.workers, workers_for_memory(i));
            assert!(s.reason.contains("capped at") && s.reason.contains("--memory 64 MB"));
            assert!(predicted_peak_rss(s.workers, &budget(s.workers, i), i) <= DEFAULT_MEMORY);
            assert!(
                memory_note(
                    s.workers,
                    predicted_peak_rss(s.workers, &budget(s.workers, i), i),
                    i
                )
                .is_none()
            );
        }
        // Without a row group (CSV) columns cost nothing: the same count for both.
        let csv = |i: &PlanInputs| PlanInputs {
            holds_row_group: false,
            ..*i
        };
        assert_eq!(
            size(&big, &csv(&narrow)).workers,
            size(&big, &csv(&wide)).workers
        );
    }

    #[test]
    fn columns_cost_memory_per_worker_and_are_said_not_refused() {
        let narrow = inputs(2);
        let wide = PlanInputs {
            columns: 21,
            ..narrow
        };
        // The same memory feeds fewer workers of a wide table, with a smaller row group each.
        assert!(workers_for_memory(&wide) < workers_for_memory(&narrow));
        assert!(budget(2, &wide).row_group_bytes < budget(2, &narrow).row_group_bytes);
        assert!(predicted_peak_rss(2, &budget(2, &wide), &wide) <= DEFAULT_MEMORY);
        // Hundreds of columns: the budgets bottom out and the prediction passes the target.
        // The run is not refused (the refusal rests on the request alone, before the catalog
        // is read), but the plan and the report say what it needs.
        let very_wide = PlanInputs {
            columns: 300,
            parallel: Some(2),
            ..narrow
        };
        let b = budget(2, &very_wide);
        assert_eq!(b.row_group_bytes, MIN_ROW_GROUP);
        let predicted = predicted_peak_rss(2, &b, &very_wide);
        assert!(predicted > DEFAULT_MEMORY);
        let note = memory_note(2, predicted, &very_wide).expect("a note");
        assert!(
            note.contains(&format!("about {} MB", predicted.div_ceil(1 << 20)))
                && note.contains("300 columns"),
            "{note}"
        );
        assert!(
            request_refusal(&PlanInputs {
                columns: 0,
                ..very_wide
            })
            .is_none()
        );
        assert!(
            memory_note(
                2,
                predicted_peak_rss(2, &budget(2, &narrow), &narrow),
                &narrow
            )
            .is_none()
        );
    }

    #[test]
    fn the_default_stops_at_the_cores_the_machine_can_feed() {
        let narrow = [ds(60_000_000, 3900 << 20)];
        let remote = PlanInputs {
            memory: 1 << 30,
            ..inputs(16)
        };
        let local = PlanInputs {
            server_local: true,
            ..remote
        };
        // A server on the same machine takes cores too: fewer workers are fed.
        let r = size(&narrow, &remote);
        let l = size(&narrow, &local);
        assert!(l.workers < r.workers, "{l:?} {r:?}");
        // Rounded up: at most one worker past the cores, none more.
        let per_worker = cores_per_worker(&narrow, true);
        assert!(l.cores_needed < 16.0 + per_worker, "{l:?}");
        assert!(l.cores_needed - per_worker < 16.0, "{l:?}");
        assert!(l.notes.is_empty(), "{l:?}");
        // Two cores shared with the server: two workers (measured faster than one).
        let two = size(
            &narrow,
            &PlanInputs {
                server_local: true,
                memory: 1 << 30,
                ..inputs(2)
            },
        );
        assert_eq!(two.workers, 2, "{two:?}");
        // Asking for more than that is allowed, and said to be slower.
        let asked = size(
            &narrow,
            &PlanInputs {
                parallel: Some(16),
                ..local
            },
        );
        assert_eq!(asked.workers, 16);
        assert!(
            asked.notes.iter().any(|n| n.contains("slower")),
            "{asked:?}"
        );
    }

    #[test]
    fn local_servers_are_recognised_by_host() {
        for local in [
            "postgres://u@127.0.0.1:5432/db",
            "postgres://localhost/db",
            "postgresql://u@[::1]:5/db",
            "postgres:///db?host=/run/postgresql",
            "mysql://root@127.0.0.1:3306/x",
        ] {
            assert!(server_is_local(local), "{local}");
        }
        for remote in [
            "postgres://u@db.example:5432/db",
            "postgres://u@10.0.0.5/db",
        ] {
            assert!(!server_is_local(remote), "{remote}");
        }
    }
}
