//! `--consistency converged`: one point in time without a snapshot older than a chunk.
//!
//! ```text
//! check (before run.json) ─▶ begin: follow the change log from C ─▶ chunks, each in its own
//!   short transaction (the usual workers) ─▶ end: a snapshot at log position T, and every key
//!   changed from C up to at least T ─▶ read the changed keys again under that snapshot (delta
//!   parts) ─▶ release it ─▶ remove the changed keys from the parts read before ─▶ manifest
//! ```
//!
//! Why the output is the table at T: a key nobody changed after C reads the same in every
//! chunk's snapshot as at T, and lies in exactly one chunk (chunks do not overlap, and an
//! unchanged row does not move). A key that changed is removed from every part — however many
//! copies the chunks caught as the row moved — and read once at T. A truncate empties the
//! table's parts: every row alive at T was inserted after it, so it is a changed key. The
//! change log may run past T: a key changed only after T is read again at T too, which gives
//! the same row.
//!
//! The engine knows no change log; the stream crate implements [`ChangeLog`] for sources that
//! have one. This module is the order and the bookkeeping: the delta parts get the next
//! ordinals of their dataset and receipts like any part, so the manifest is written as usual,
//! last. Parquet output only for now: the parts must be read back to be filtered (CSV and the
//! other row formats would need a reader that writes rows back byte for byte).
//!
//! Resume: C is recorded in `_sluice/run.json` before the first chunk is read, and the source
//! keeps its log from C until the run ends (a killed run's, or a failed run's whose error a
//! retry may cure, for `--resume`). A resumed run follows the log again from C, reads the
//! chunks without a receipt — in new short transactions, which is as exact as the first run's:
//! a row that moved between the two runs' chunks moved by a change after C, so its key is
//! read again at T — and rewrites every part, the first run's too. A table rewritten since C
//! (no change in the log for its moved rows), a dataset whose columns or partitions changed,
//! or a selection that gained or lost a table is refused: `--overwrite` starts over. A part is
//! rewritten with its receipt removed first, so a run killed mid-rewrite leaves either the part
//! and its receipt as they were, or as rewritten, or a part without a receipt, which the
//! resume removes and reads again.

use crate::job::ExportJob;
use crate::manifest::{ConvergedRecord, ConvergedStart};
use crate::prepare::Prepared;
use crate::progress::Progress;
use crate::queue::WorkQueue;
use crate::worker::{WorkerContext, Writers};
mod forecast;
mod rewrite;

use async_trait::async_trait;
pub(crate) use forecast::forecast;
use sluice_core::change::SnapshotHold;
use sluice_core::keytext;
use sluice_core::{
    Chunk, ChunkBounds, Consistency, Dataset, DatasetKind, Error, ErrorKind, Result,
};
use sluice_core::{Source, SourceOptions};
use sluice_sink::FormatOptions;
use sluice_sink::layout;
use sluice_sink::overlay::Run;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::{Mutex, watch};

/// How many end points a run takes before it gives up reading the changed keys.
const END_ATTEMPTS: u32 = 3;

/// The row groups of a converged run's parts unless `--row-group-size` says otherwise: small,
/// because a part's rewrite copies the row groups without a changed key and encodes the others
/// again, so its cost follows the row groups touched; the 16 MB groups `--memory` gives held a
/// whole part of the lab's narrow table. Measured by `bench/converged/run` (2026-11-29
/// 02:36 UTC, `docs/converged/benchmarks.md`): with updates among the newest 1 % of a narrow
/// 2 M-row table, 4 % of the bytes were encoded again (33 % of them in rewritten parts) and
/// the run took 1.12x the snapshot export's wall, against 1.49x with one group per part.
pub const ROW_GROUP_BYTES: usize = 2 << 20;

/// Keys read again per delta chunk: one statement's `IN` list stays a few hundred kilobytes.
pub const KEYS_PER_CHUNK: usize = 2000;

/// What changed in one dataset's table while the chunks were read.
#[derive(Default, Clone)]
pub struct ChangedKeys {
    /// Every key inserted, updated or deleted (a key update changes its old and its new key),
    /// spelled as [`sluice_core::keytext::encode`] spells it, sorted in a file (see
    /// [`sluice_sink::overlay`]); `None` when only a truncate was seen.
    pub keys: Option<Arc<Run>>,
    /// The table was truncated: every row read before then is gone.
    pub truncated: bool,
}

impl ChangedKeys {
    /// How many keys changed.
    pub fn count(&self) -> u64 {
        self.keys.as_ref().map_or(0, |k| k.len())
    }
}

/// The end point of a converged run, from [`ChangeLog::end`].
pub struct EndPoint {
    /// The log position T, as the change log writes positions, with every key changed from C
    /// up to at least T. `None` for a source that cannot hand a snapshot over (MySQL/MariaDB):
    /// the run then takes one itself under `source` (its coordinator's shared snapshot, at an
    /// exact position) and asks [`ChangeLog::changed_until`] for the keys up to it.
    pub at: Option<Until>,
    /// Reads under the snapshot at T (or takes it).
    pub source: Arc<dyn Source>,
    /// Keeps that snapshot valid until released.
    pub hold: Box<dyn SnapshotHold>,
    /// When the snapshot was taken (its hold is reported).
    pub taken: Instant,
}

/// What the log says up to an end point T.
pub struct Until {
    /// T, as the change log writes positions.
    pub position: String,
    /// What changed, by dataset name; datasets without a change are absent.
    pub changed: HashMap<String, ChangedKeys>,
    /// Bytes of log from C to T, which the source kept for the run, when the log's
    /// positions are byte offsets (PostgreSQL's WAL).
    pub log_bytes: Option<u64>,
}

/// A source's change log as a converged export follows it. Implemented where changes are
/// captured (the stream crate), for sources that have a log.
#[async_trait]
pub trait ChangeLog: Send + Sync {
    /// Refuse, with the fix, a source or datasets whose changes cannot be followed — before
    /// anything is read or written.
    async fn check(&self, datasets: &[Dataset]) -> Result<()>;

    /// Start following the changes of `datasets`, before the first chunk is read; returns the
    /// start position C (and where the rows were stored then). With `resume`, the start an
    /// unfinished run recorded: follow the log again from there, or refuse, with the way out,
    /// when the source no longer keeps it.
    async fn begin(
        &self,
        datasets: &[Dataset],
        resume: Option<&ConvergedStart>,
    ) -> Result<ConvergedStart>;

    /// After the last chunk: a snapshot at a log position T, and every key changed from C up
    /// to at least T (or, for a source that cannot hand a snapshot over, the source the run
    /// takes its own under).
    async fn end(&self) -> Result<EndPoint>;

    /// Every key changed from C up to at least `at`, the exact position of a snapshot the
    /// run took itself (when [`EndPoint::at`] is `None`).
    async fn changed_until(&self, at: &sluice_core::Position) -> Result<Until>;

    /// Stop following the log and remove what [`ChangeLog::begin`] made on the source —
    /// unless `keep`, when it stays for `--resume` and what holds the log is returned, in
    /// words, for the run's error. Called however the run ends, and when nothing was begun.
    async fn close(&self, keep: bool) -> Result<Option<String>>;

    /// Remove what an unfinished converged run on this output kept on the source for
    /// `--resume` (a slot holds the source's log until removed), when the run is replaced by
    /// one of another consistency (`--overwrite`), which never calls [`ChangeLog::begin`].
    /// Returns what was removed, in words; nothing when nothing was left.
    async fn discard(&self) -> Result<Vec<String>>;
}

/// Refuse what a converged run cannot do, before run.json is written: a format whose parts
/// cannot be rewritten, datasets without a key of a type recognisable as text. Public for a
/// stream, which asks before it creates its capture.
pub async fn check(job: &ExportJob, log: &dyn ChangeLog, datasets: &[Dataset]) -> Result<()> {
    if !matches!(job.format, FormatOptions::Parquet(_)) {
        return Err(Error::config(format!(
            "--consistency converged writes Parquet only for now ({} was asked): its parts are \
             rewritten at the end. Use --format parquet, or --consistency snapshot.",
            job.format.describe()
        )));
    }
    for ds in datasets {
        key_columns(ds)?;
    }
    log.check(datasets).await
}

/// The positions of `ds`'s key columns, or why it cannot be converged.
fn key_columns(ds: &Dataset) -> Result<Vec<usize>> {
    let fallback = "export it with --consistency snapshot (one snapshot for the run) or chunk";
    if !matches!(ds.kind, DatasetKind::Table | DatasetKind::Partitioned) {
        return Err(Error::config(format!(
            "{}: --consistency converged reads tables only (their changes are in the log); {fallback}",
            ds.name
        )));
    }
    if ds.primary_key.is_empty() {
        return Err(Error::config(format!(
            "{}: --consistency converged needs a primary key to tell which rows changed; this \
             table has none: {fallback}",
            ds.name
        )));
    }
    ds.primary_key
        .iter()
        .map(|k| {
            let (i, c) = ds
                .columns
                .iter()
                .enumerate()
                .find(|(_, c)| &c.name == k)
                .ok_or_else(|| {
                    Error::config(format!(
                        "{}: --consistency converged needs the key column {k:?} among the \
                         exported columns (--columns)",
                        ds.name
                    ))
                })?;
            if !keytext::supported(c.field.data_type()) {
                return Err(Error::config(format!(
                    "{}: key column {k:?} ({}) cannot be matched by value across the log and \
                     the parts; {fallback}",
                    ds.name, c.source_type
                )));
            }
            Ok(i)
        })
        .collect()
}

/// What the run needs to finish converging.
pub(crate) struct Converging<'a> {
    pub job: &'a ExportJob,
    pub log: &'a dyn ChangeLog,
    pub start: String,
    pub options: &'a SourceOptions,
    pub progress: Arc<dyn Progress>,
    pub cancel: watch::Receiver<bool>,
}

/// After the last chunk: take the end point, read the changed keys under its snapshot,
/// release it, remove the changed keys from the earlier parts. Adds the delta chunks to the
/// plan and every receipt to `ctx`, so the manifest is written as for any run.
pub(crate) async fn reconcile(
    c: Converging<'_>,
    ctx: &Arc<WorkerContext>,
    prepared: &mut Prepared,
) -> Result<ConvergedRecord> {
    let longest_chunk = ctx.longest_read_ms.load(Ordering::Relaxed) as f64 / 1000.0;
    let mut attempt = 1;
    let (position, changed, delta, reread_rows, end_snapshot_seconds, log_bytes) = loop {
        // Taken apart at once: the hold is not shared between threads, the rest is.
        let EndPoint {
            at,
            source,
            hold,
            taken,
        } = c.log.end().await?;
        if let Some(at) = &at {
            tracing::info!(
                "end point {}: taken and followed up to in {:.2} s",
                at.position,
                taken.elapsed().as_secs_f64()
            );
        }
        let reading = Instant::now();
        let read = match sluice_core::failpoint::hit("converge.end_point") {
            Ok(()) => read_delta(&c, ctx, prepared, &source, at).await,
            Err(e) => Err(e),
        };
        let held = taken.elapsed().as_secs_f64();
        let released = hold.release().await;
        match read {
            Ok((
                Until {
                    position,
                    changed,
                    log_bytes,
                },
                delta,
                rows,
            )) => {
                released?;
                tracing::info!(
                    "{} changed keys read again at {position} in {} part(s) in {:.2} s",
                    changed.values().map(ChangedKeys::count).sum::<u64>(),
                    delta.len(),
                    reading.elapsed().as_secs_f64()
                );
                break (position, changed, delta, rows, held, log_bytes);
            }
            // DDL queued behind the read's locks (a TRUNCATE), a lost session: the snapshot
            // is let go, and the keys read again at a later end point.
            Err(e) if e.kind() == ErrorKind::Source && attempt < END_ATTEMPTS => {
                attempt += 1;
                tracing::warn!(
                    "{e} — reading the changed keys again at a later end point (attempt \
                     {attempt} of {END_ATTEMPTS})"
                );
                // Let what waited for the snapshot's locks go first.
                tokio::time::sleep(std::time::Duration::from_millis(250 * u64::from(attempt)))
                    .await;
            }
            Err(e) => return Err(e),
        }
    };
    prepared.state.chunks.extend(delta.iter().cloned());
    let mut record = ConvergedRecord {
        start: c.start,
        end: position,
        changed_keys: changed.values().map(ChangedKeys::count).sum(),
        truncated: changed
            .iter()
            .filter(|(_, k)| k.truncated)
            .map(|(d, _)| d.clone())
            .collect(),
        reread_rows,
        parts_rewritten: 0,
        rewritten_bytes: 0,
        chunk_bytes: 0,
        reencoded_bytes: 0,
        rows_removed: 0,
        longest_chunk_seconds: longest_chunk,
        end_snapshot_seconds,
        log_bytes,
    };
    record.truncated.sort();
    let rewriting = Instant::now();
    rewrite::remove_changed(c.job, ctx, prepared, &changed, &delta, &mut record).await?;
    tracing::info!(
        "{} part(s) rewritten without the changed keys in {:.2} s",
        record.parts_rewritten,
        rewriting.elapsed().as_secs_f64()
    );
    prepared.notes.push(note(&record));
    Ok(record)
}

/// The report's line on how the run converged.
fn note(r: &ConvergedRecord) -> String {
    let share = 100.0 * r.rewritten_bytes as f64 / r.chunk_bytes.max(1) as f64;
    let encoded = 100.0 * r.reencoded_bytes as f64 / r.chunk_bytes.max(1) as f64;
    let log = r
        .log_bytes
        .map(|b| {
            format!(
                "; the source kept {:.1} MB of log for the run",
                b as f64 / 1e6
            )
        })
        .unwrap_or_default();
    format!(
        "consistency converged: the output is the tables at log position {} — each chunk was \
         read in its own transaction (the longest {:.1} s), then the {} keys changed during the \
         run were read again under one snapshot held {:.1} s and their older copies removed from \
         {} part(s) ({share:.0}% of the bytes read before it rewritten, {encoded:.0}% encoded \
         again, the rest copied){log}",
        r.end, r.longest_chunk_seconds, r.changed_keys, r.end_snapshot_seconds, r.parts_rewritten,
    )
}

/// One chunk per [`KEYS_PER_CHUNK`] changed keys of each dataset, numbered after its plan's
/// last part. Their key lists are left empty: [`fill_keys`] reads each from the keys' file
/// as its chunk starts, so the lists never all sit in memory at once.
fn delta_chunks(prepared: &Prepared, changed: &HashMap<String, ChangedKeys>) -> Vec<Chunk> {
    let mut out = Vec::new();
    for ds in &prepared.datasets {
        let Some(count) = changed
            .get(&ds.name)
            .map(ChangedKeys::count)
            .filter(|n| *n > 0)
        else {
            continue;
        };
        let row_bytes = ds.estimate.bytes / ds.estimate.rows.max(1);
        let first = first_delta(prepared, &ds.name);
        for i in 0..count.div_ceil(KEYS_PER_CHUNK as u64) {
            let bounds = ChunkBounds::KeySet {
                columns: ds.primary_key.clone(),
                keys: Vec::new(),
            };
            let n = (count - i * KEYS_PER_CHUNK as u64).min(KEYS_PER_CHUNK as u64);
            out.push(Chunk::new(ds, first + i as usize, bounds, n * row_bytes, n));
        }
    }
    out
}

/// The ordinal of a dataset's first delta chunk: after every part its plan has.
fn first_delta(prepared: &Prepared, dataset: &str) -> usize {
    prepared
        .state
        .chunks
        .iter()
        .filter(|c| c.dataset == dataset && !is_delta(c))
        .map(|c| c.ordinal as usize + 1)
        .max()
        .unwrap_or(0)
}

fn is_delta(c: &Chunk) -> bool {
    matches!(c.bounds, ChunkBounds::KeySet { .. })
}

/// What fills a delta chunk's key list as a worker takes it (see [`delta_chunks`]).
fn fill_keys(prepared: &Prepared, changed: &HashMap<String, ChangedKeys>) -> crate::queue::Fill {
    let runs: HashMap<String, (usize, Arc<Run>)> = changed
        .iter()
        .filter_map(|(d, k)| Some((d.clone(), (first_delta(prepared, d), k.keys.clone()?))))
        .collect();
    Arc::new(move |chunk: &mut Chunk| {
        let (Some((first, run)), ChunkBounds::KeySet { keys, .. }) =
            (runs.get(&chunk.dataset), &mut chunk.bounds)
        else {
            return Ok(());
        };
        let group = (chunk.ordinal as usize)
            .checked_sub(*first)
            .ok_or_else(|| Error::internal("a delta chunk before its dataset's parts"))?;
        *keys = run.keys((group * KEYS_PER_CHUNK) as u64, KEYS_PER_CHUNK)?;
        Ok(())
    })
}

/// Read the delta chunks under the end snapshot with the run's workers' pipeline: the one
/// the log handed over (`at` known), or one taken here, whose exact position is T and up to
/// which the log is then asked what changed. Returns what the log says up to T, the delta
/// chunks and the rows read.
async fn read_delta(
    c: &Converging<'_>,
    ctx: &Arc<WorkerContext>,
    prepared: &Prepared,
    source: &Arc<dyn Source>,
    at: Option<Until>,
) -> Result<(Until, Vec<Chunk>, u64)> {
    let known = at.map(|u| {
        let delta = delta_chunks(prepared, &u.changed);
        (u, delta)
    });
    if let Some((u, delta)) = known.as_ref().filter(|(_, d)| d.is_empty()) {
        let u = Until {
            position: u.position.clone(),
            changed: u.changed.clone(),
            log_bytes: u.log_bytes,
        };
        return Ok((u, delta.clone(), 0));
    }
    let options = SourceOptions {
        consistency: Consistency::Snapshot,
        ..c.options.clone()
    };
    let mut coordinator = source.open_coordinator(&options).await?;
    let opened = async {
        // Workers are lined up before the snapshot is taken: as many as the plan's when the
        // changed keys are known only once it is.
        let workers = match &known {
            Some((_, delta)) => prepared.plan_workers.min(delta.len()).max(1),
            None => prepared.plan_workers.max(1),
        };
        let datasets: Vec<Dataset> = match &known {
            Some((_, delta)) => {
                let touched: HashSet<&str> = delta.iter().map(|d| d.dataset.as_str()).collect();
                prepared
                    .datasets
                    .iter()
                    .filter(|d| touched.contains(d.name.as_str()))
                    .cloned()
                    .collect()
            }
            None => prepared.datasets.clone(),
        };
        coordinator.reserve_readers(workers).await?;
        let info = coordinator.pin_snapshot(&datasets).await?;
        let (until, delta) = match known {
            Some(k) => k,
            None => {
                let u = c.log.changed_until(&info.position).await?;
                tracing::info!("end point {}: the snapshot taken there", u.position);
                let delta = delta_chunks(prepared, &u.changed);
                (u, delta)
            }
        };
        let readers = match delta.is_empty() {
            true => Vec::new(),
            false => coordinator.open_readers(workers).await?,
        };
        Ok::<_, Error>((until, delta, readers))
    }
    .await;
    let (until, delta, readers) = match opened {
        Ok(r) => r,
        Err(e) => {
            let _ = coordinator.release().await;
            return Err(e);
        }
    };
    if delta.is_empty() {
        let _ = coordinator.release().await;
        return Ok((until, delta, 0));
    }
    // Counted apart: the run's rows are the chunks'; these replace some of them.
    let counters = Arc::new(sluice_core::ReadCounters::default());
    let coordinator = Arc::new(Mutex::new(coordinator));
    let delta_ctx = Arc::new(WorkerContext {
        queue: WorkQueue::new(delta.to_vec()).with_fill(fill_keys(prepared, &until.changed)),
        datasets: ctx.datasets.clone(),
        coordinator: coordinator.clone(),
        destination: ctx.destination.clone(),
        format: ctx.format.clone(),
        merge: ctx.merge,
        batch_bytes: ctx.batch_bytes,
        retry: ctx.retry,
        snapshot_index: ctx.snapshot_index,
        counters: counters.clone(),
        parts_done: ctx.parts_done.clone(),
        gate: crate::governor::Gate::open(),
        retries: AtomicU64::new(0),
        committed: std::sync::Mutex::new(Vec::new()),
        writers: Writers::default(),
        longest_read_ms: AtomicU64::new(0),
        part_tag: ctx.part_tag.clone(),
    });
    let driven = crate::export::drive(
        delta_ctx.clone(),
        readers,
        c.progress.clone(),
        c.cancel.clone(),
    )
    .await;
    let _ = coordinator.lock().await.release().await;
    let records = delta_ctx
        .committed
        .lock()
        .map(|r| r.clone())
        .unwrap_or_default();
    if let Err(e) = driven {
        // Another end point reads them again: nothing of this one may stay.
        for r in &records {
            ctx.destination.delete(&r.file).await?;
            ctx.destination
                .delete(&layout::receipt_path(&r.dataset, r.ordinal))
                .await?;
        }
        return Err(e);
    }
    if let Ok(mut all) = ctx.committed.lock() {
        all.extend(records);
    }
    Ok((until, delta, counters.rows.load(Ordering::Relaxed)))
}
