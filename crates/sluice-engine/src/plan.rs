//! The planner: how many workers, how big a chunk, how much memory — before any row is read.
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
//! **Memory** is bounded by bytes: each worker holds at most two batches (one being decoded, one
//! being encoded) plus the writer's open row group (its encoded pages and page buffers). The
//! user gives one number, the memory target (`--memory`, default [`DEFAULT_MEMORY`]); the
//! planner splits what is left after [`BASE_RSS`] among the workers and derives the batch and
//! row-group budgets from it, so more workers get smaller batches rather than more memory:
//! `peak ≈ BASE + workers × (2 × batch + ROW_GROUP_FACTOR × row group + WORKER_OVERHEAD + writer
//! buffers)`, where the writer buffers are an object store's upload parts in flight (none for
//! local files) and [`ROW_GROUP_FACTOR`] covers what the Parquet writer holds besides the row
//! group's encoded pages.
//! Row groups never go below [`MIN_ROW_GROUP`] (smaller ones make files slow to read), nor
//! batches below [`MIN_BATCH`]: when the workers requested cannot fit the target with those,
//! the default picks fewer workers, and an explicit `--parallel` is refused with the memory it
//! needs ([`memory_needed`]).

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
/// What a Parquet writer is counted to hold per byte of its row-group budget. The writer holds
/// more (the row group is closed only after the batch that crosses the budget, and each column
/// keeps an open page, its dictionary and compression buffers): in the benchmark lab the
/// narrow table at 8 workers with 8 MB row groups peaked 36 MB above a one-to-one prediction,
/// and the 2-worker runs 2–6 MB above the 64 MB target. Counting 1.5 would hold the target,
/// but the row groups it leaves made the wide table's files 4% larger (more, smaller row
/// groups), so it stays at 1 until the writer's own buffers shrink.
pub const ROW_GROUP_FACTOR: f64 = 1.0;
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
    /// Destination buffers per worker's open file (object-store upload parts), bytes.
    pub writer_buffer_bytes: u64,
    /// Cores of this machine.
    pub cores: usize,
    /// Whether the database server runs on this machine (and so competes for its cores).
    pub server_local: bool,
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
    let share = if inputs.holds_row_group { 4 } else { 2 };
    // Batches give way first: the smallest row group (with its buffers) is kept.
    let room = if inputs.holds_row_group && inputs.row_group_bytes.is_none() {
        per_worker.saturating_sub((MIN_ROW_GROUP as f64 * ROW_GROUP_FACTOR) as usize) / 2
    } else {
        usize::MAX
    };
    let batch_bytes = inputs
        .batch_bytes
        .unwrap_or((per_worker / share).min(room).clamp(MIN_BATCH, MAX_BATCH));
    let row_group_bytes = match (inputs.holds_row_group, inputs.row_group_bytes) {
        (false, _) => 0,
        (true, Some(r)) => r,
        (true, None) => ((per_worker.saturating_sub(2 * batch_bytes) as f64 / ROW_GROUP_FACTOR)
            as usize)
            .max(MIN_ROW_GROUP),
    };
    Budget {
        batch_bytes,
        row_group_bytes,
    }
}

/// Memory one worker needs at least: two of the smallest batches (or `--batch-size`), the
/// smallest row group (or `--row-group-size`), its buffers.
pub fn min_worker_bytes(inputs: &PlanInputs) -> u64 {
    let batch = inputs.batch_bytes.unwrap_or(MIN_BATCH) as u64;
    let row_group = match (inputs.holds_row_group, inputs.row_group_bytes) {
        (false, _) => 0,
        (true, Some(r)) => r as u64,
        (true, None) => MIN_ROW_GROUP as u64,
    };
    let row_group = (row_group as f64 * ROW_GROUP_FACTOR) as u64;
    2 * batch + row_group + WORKER_OVERHEAD + inputs.writer_buffer_bytes
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

/// The most workers this machine's cores can feed (at least 1).
pub fn workers_for_cores(datasets: &[Dataset], inputs: &PlanInputs) -> usize {
    ((inputs.cores.max(1) as f64 / cores_per_worker(datasets, inputs.server_local)).floor()
        as usize)
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
                     {}; past about {fed} worker(s) more are slower, not faster",
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
        format!(
            ", a row group of {} MB (with its page buffers, {:.0} MB)",
            inputs.row_group_bytes.unwrap_or(MIN_ROW_GROUP) >> 20,
            (inputs.row_group_bytes.unwrap_or(MIN_ROW_GROUP) >> 20) as f64 * ROW_GROUP_FACTOR
        )
    } else {
        String::new()
    };
    Some(format!(
        "{workers} worker(s) need at least {} MB but --memory is {} MB: each holds two batches \
         of {} KB{row_group}{uploads} and {} MB of buffers, besides {} MB for the process. Raise \
         --memory to {}MB{lower}.",
        need.div_ceil(1 << 20),
        inputs.memory >> 20,
        inputs.batch_bytes.unwrap_or(MIN_BATCH) >> 10,
        WORKER_OVERHEAD >> 20,
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

/// Predicted peak resident memory for `workers` with `budget`, each worker's open file
/// holding `writer_buffer_bytes` of destination buffers.
pub fn predicted_peak_rss(workers: usize, budget: &Budget, writer_buffer_bytes: u64) -> u64 {
    BASE_RSS
        + workers as u64
            * (2 * budget.batch_bytes as u64
                + (budget.row_group_bytes as f64 * ROW_GROUP_FACTOR) as u64
                + WORKER_OVERHEAD
                + writer_buffer_bytes)
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
            writer_buffer_bytes: 0,
            cores,
            server_local: false,
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
                predicted_peak_rss(workers, &b, 0) <= DEFAULT_MEMORY,
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
        assert!(l.cores_needed <= 16.0 + 1e-9, "{l:?}");
        assert!(l.notes.is_empty(), "{l:?}");
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
