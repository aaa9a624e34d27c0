//! The runner's side of the change sink: per-table builders, change files, batches.
//!
//! Changes go into each table's Arrow builders as the source decodes them; a table's builders
//! are handed to its open change file when they reach the flush budget, so memory holds at most
//! one flush budget plus one row group per table with changes in the batch, whatever the size
//! of a transaction. A batch is cut when its bytes reach `--batch-bytes`, when it is
//! `--batch-seconds` old, before a table's schema changes, and at a stop; a cut may fall inside
//! a transaction (the state then restarts at the transaction's start and skips what was
//! written, by `_seq`).
//!
//! Merging into tables (`--format delta`, `merge.rs`): the open batch's change rows are kept
//! per table, a batch ends only between transactions, and at the cut each table gets one
//! version after the change files are committed and before the state is saved.
//!
//! File names: `<dataset>/changes/[<partition>/]<POS>-<SEQ>.<ext>`, the `_pos` and `_seq` of
//! the file's first change, the partition by `--layout` (`files.rs`). A retried batch starts
//! with the same change, so it rewrites the same names (the partition as its intent recorded
//! it); the name is known before the first byte is written, as object stores need. Changes of
//! an operation `--ops` leaves out take their `_seq` and are counted, not written.
//!
//! Over 500 lines: the sink's callbacks, the batch's cut and the file naming share the
//! batcher's state and read best together.

use crate::files::{ChangeFiles, change_path};
use crate::metrics::{Metrics, TableMetrics, op_index};
use crate::state::{Committed, Intent, SchemaVersion, StateStore, StreamState, in_table_snapshot};
use arrow_array::cast::AsArray;
use sluice_core::change::{
    ChangeOp, ChangeRows, ChangeSink, TxMeta, change_schema, with_before_images,
};
use sluice_core::failpoint;
use sluice_core::table::TableRef;
use sluice_core::{ColumnDesc, Error, ErrorKind, Result, StreamPos};
use sluice_sink::{Destination, FormatOptions, PartKey, PartWriter, open_part};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

struct OpenFile {
    writer: Box<dyn PartWriter>,
    path: String,
}

struct Table {
    dataset: String,
    /// Not in the stream's selection (a shared publication): its changes are not written.
    ignored: bool,
    /// Sent by the source without being captured (a captured table renamed): its first
    /// change is reported. Not at its description: PostgreSQL describes a partition whenever
    /// it sends a change of it under its partitioned table, which is captured.
    unknown: bool,
    snapshot_position: Option<StreamPos>,
    /// The columns its builders were made for (name, Arrow type, source type).
    columns: Vec<(String, String, String)>,
    /// Their schema version in the state; 0 until a change is written with them, since a
    /// version starts at its first change, not at the source's announcement (which may come
    /// for changes that are not written, or be replaced before any is).
    version: u32,
    rows: Option<ChangeRows>,
    file: Option<OpenFile>,
    /// Its metrics; `pending`: changes per operation in the open batch, added at its cut.
    metrics: Arc<TableMetrics>,
    pending: [u64; 4],
    /// The columns `--columns` keeps (`None`: all).
    keep: Option<Vec<String>>,
    /// The open batch's change rows, for the table merge (`--format delta`).
    merge_rows: Vec<arrow_array::RecordBatch>,
}

struct Batch {
    first_seq: u64,
    last_seq: u64,
    started: Instant,
    bytes: usize,
    changes: u64,
    /// The folders of its files (`--layout`), from its first transaction's commit time.
    partition: String,
    /// Commit time of its oldest change (µs), for the commit → file latency.
    first_commit: Option<i64>,
    /// It reached `--batch-bytes` inside a transaction while merging: cut at the commit.
    full: bool,
}

/// Run I/O where the thread may block, telling a multi-threaded runtime to move its other
/// tasks off this thread meanwhile (`block_in_place`); on a single-threaded runtime, or none,
/// as is. The batcher is driven from the stream's async task (values are decoded straight
/// into it), and a destination's writer waits for its uploads on the runtime
/// (`Destination::create`); a converged export's change log spills keys to disk.
pub(crate) fn io<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Budgets of the batcher.
#[derive(Debug, Clone, Copy)]
pub struct Budgets {
    /// Cut a batch at this many bytes of change data.
    pub batch_bytes: u64,
    /// Cut a batch this long after its first change.
    pub batch_time: Duration,
    /// Hand a table's builders to its file at this many bytes.
    pub flush_bytes: usize,
}

/// The change files' metadata key that says which changes they miss.
pub const MISSING_KEY: &str = "sluice.missing_changes";

/// What the last cut committed, for the log line and the report.
#[derive(Debug, Clone, Default)]
pub struct CutInfo {
    /// Changes in the batch.
    pub changes: u64,
    /// Files committed.
    pub files: usize,
    /// `_seq` range.
    pub seqs: (u64, u64),
}

/// The change sink of one run.
pub struct Batcher {
    dest: Arc<dyn Destination>,
    format: FormatOptions,
    ext: String,
    store: Arc<dyn StateStore>,
    /// The state as last saved (plus schema versions seen since).
    pub state: StreamState,
    tables: Vec<Table>,
    by_ref: HashMap<TableRef, usize>,
    tx: TxMeta,
    in_tx: bool,
    cur: Option<(usize, ChangeOp, u64)>,
    next_seq: u64,
    skip_through: u64,
    restart: StreamPos,
    restart_seq: u64,
    batch: Option<Batch>,
    budgets: Budgets,
    force_cut_at: Option<u64>,
    /// A restart position whose batch is durable, for the source to be told.
    pub to_confirm: Option<StreamPos>,
    /// Commit time of the last transaction seen (µs since 1970).
    pub last_commit_ts: Option<i64>,
    metrics: Arc<Metrics>,
    files: ChangeFiles,
    /// Merge each batch into the tables; batches then end between transactions only.
    merge: Option<MergeInto>,
}

impl Batcher {
    /// A batcher continuing from `state` (its committed point and intent).
    pub fn new(
        dest: Arc<dyn Destination>,
        format: FormatOptions,
        store: Arc<dyn StateStore>,
        state: StreamState,
        budgets: Budgets,
        metrics: Arc<Metrics>,
        files: ChangeFiles,
    ) -> Self {
        let c = state.committed.clone();
        let mut tables = Vec::new();
        let mut by_ref = HashMap::new();
        for (name, t) in &state.tables {
            by_ref.insert(t.table.clone(), tables.len());
            tables.push(Table {
                dataset: name.clone(),
                // A dropped table's changes are complete; a table created again under its
                // name is not it (the next look at the selection refuses it).
                ignored: t.dropped.is_some(),
                unknown: false,
                snapshot_position: t.snapshot_position.clone(),
                columns: Vec::new(),
                version: 0,
                rows: None,
                file: None,
                metrics: metrics.table(name),
                pending: [0; 4],
                keep: t.columns.clone(),
                merge_rows: Vec::new(),
            });
        }
        Batcher {
            ext: format.extension().to_string(),
            dest,
            format,
            store,
            force_cut_at: state.intent.as_ref().map(|i| i.last_seq),
            tables,
            by_ref,
            tx: TxMeta {
                pos: c.restart.clone(),
                xid: String::new(),
                commit_ts: None,
            },
            in_tx: false,
            cur: None,
            next_seq: c.restart_seq,
            skip_through: c.written_through,
            restart: c.restart.clone(),
            restart_seq: c.restart_seq,
            batch: None,
            budgets,
            to_confirm: None,
            last_commit_ts: None,
            metrics,
            state,
            files,
            merge: None,
        }
    }

    /// Merge every batch into its tables too (`--format delta`): a batch then ends only
    /// between transactions, so a table version never shows part of one.
    pub fn merging(mut self, merge: MergeInto) -> Self {
        self.merge = Some(merge);
        self
    }

    /// True when a batch holds changes not yet committed.
    pub fn pending(&self) -> bool {
        self.batch.is_some()
    }

    /// True while the first batch must still reach an interrupted batch's exact range.
    pub fn replaying(&self) -> bool {
        self.force_cut_at.is_some()
    }

    /// True when the open batch is due by time.
    pub fn due(&self) -> bool {
        self.force_cut_at.is_none()
            && !(self.merge.is_some() && self.in_tx)
            && self
                .batch
                .as_ref()
                .is_some_and(|b| b.started.elapsed() >= self.budgets.batch_time)
    }

    fn flush(&mut self, h: usize) -> Result<()> {
        let t = &mut self.tables[h];
        let Some(rows) = t.rows.as_mut() else {
            return Ok(());
        };
        if rows.rows() == 0 {
            return Ok(());
        }
        let bytes = rows.bytes();
        let batch = rows.finish()?;
        if t.file.is_none() {
            let pos = batch
                .column_by_name(sluice_core::change::POS)
                .map(|c| c.as_string::<i32>().value(0).to_string())
                .unwrap_or_default();
            let seq = batch
                .column_by_name(sluice_core::change::SEQ)
                .map(|c| c.as_primitive::<arrow_array::types::UInt64Type>().value(0))
                .unwrap_or_default();
            let recorded = self.state.intent.as_ref().map_or(&[][..], |i| &i.files[..]);
            let partition = self.batch.as_ref().map_or("", |b| &b.partition[..]);
            let path = change_path(&t.dataset, partition, recorded, &pos, seq, &self.ext);
            let (dest, format) = (&self.dest, &self.format);
            // The key names the part for in-memory outputs only; change files go to files.
            let key = PartKey {
                dataset: t.dataset.clone(),
                ordinal: 0,
            };
            let writer = io(|| open_part(format, key, batch.schema(), dest.create(&path)?, &path))?;
            t.file = Some(OpenFile { writer, path });
        }
        if let Some(f) = t.file.as_mut() {
            io(|| f.writer.write(&batch))?;
        }
        if self.merge.is_some() {
            t.merge_rows.push(batch.clone());
        }
        rows.recycle(batch);
        if let Some(b) = self.batch.as_mut() {
            b.bytes += bytes;
        }
        failpoint::hit_as("stream.after_flush", ErrorKind::Destination)?;
        Ok(())
    }

    /// Commit the open batch: record the intent, commit its files, save the position.
    pub fn cut(&mut self) -> Result<Option<CutInfo>> {
        if self.batch.is_none() {
            return Ok(None);
        }
        // The batch stays open while its last rows go out: their files take its partition.
        for h in 0..self.tables.len() {
            self.flush(h)?;
        }
        let Some(b) = self.batch.take() else {
            return Ok(None);
        };
        failpoint::hit_as("stream.before_intent", ErrorKind::Destination)?;
        let then = Committed {
            restart: self.restart.clone(),
            restart_seq: self.restart_seq,
            written_through: b.last_seq,
            batches: self.state.committed.batches + 1,
            changes: self.state.committed.changes + b.changes,
        };
        let files: Vec<String> = self
            .tables
            .iter()
            .filter_map(|t| t.file.as_ref().map(|f| f.path.clone()))
            .collect();
        self.state.intent = Some(Intent {
            first_seq: b.first_seq,
            last_seq: b.last_seq,
            files: files.clone(),
            then: then.clone(),
        });
        self.save()?;
        failpoint::hit_as("stream.after_intent", ErrorKind::Destination)?;
        let mut written = 0u64;
        for t in &mut self.tables {
            if let Some(f) = t.file.take() {
                let stats = io(|| f.writer.finish())?;
                written += stats.bytes;
                self.metrics.files.fetch_add(1, Ordering::Relaxed);
                t.metrics.files.fetch_add(1, Ordering::Relaxed);
                t.metrics.bytes.fetch_add(stats.bytes, Ordering::Relaxed);
            }
        }
        failpoint::hit_as("stream.after_files", ErrorKind::Destination)?;
        self.merge_tables(b.last_seq)?;
        self.state.committed = then.clone();
        self.state.intent = None;
        self.save()?;
        self.force_cut_at = None;
        self.to_confirm = Some(then.restart.clone());
        self.metrics.batches.fetch_add(1, Ordering::Relaxed);
        self.metrics.changes.fetch_add(b.changes, Ordering::Relaxed);
        self.metrics
            .bytes_written
            .fetch_add(written, Ordering::Relaxed);
        self.metrics
            .committed_seq
            .store(b.last_seq, Ordering::Relaxed);
        for t in &mut self.tables {
            for (n, c) in t.pending.iter_mut().enumerate() {
                t.metrics.changes[n].fetch_add(std::mem::take(c), Ordering::Relaxed);
            }
        }
        self.metrics.batch_changes.observe(b.changes as f64);
        self.metrics.batch_bytes.observe(written as f64);
        if let Some(first) = b.first_commit {
            let now = chrono::Utc::now().timestamp_micros();
            self.metrics
                .commit_to_file
                .observe((now - first) as f64 / 1e6);
        }
        Ok(Some(CutInfo {
            changes: b.changes,
            files: files.len(),
            seqs: (b.first_seq, b.last_seq),
        }))
    }

    /// Between transactions with nothing pending: move the committed restart point up to the
    /// last transaction seen (changes the snapshot held, or none for our tables), so the source
    /// can release its log. Writes the state only when the point moved.
    pub fn advance(&mut self) -> Result<()> {
        if self.batch.is_some()
            || self.in_tx
            || self.force_cut_at.is_some()
            || self.restart == self.state.committed.restart
        {
            return Ok(());
        }
        self.state.committed.restart = self.restart.clone();
        self.state.committed.restart_seq = self.restart_seq;
        self.save()?;
        self.to_confirm = Some(self.restart.clone());
        Ok(())
    }

    /// Between transactions with nothing pending, the source has sent everything up to
    /// `received` and none of it is ours to write (PostgreSQL 15 and later send no empty
    /// transactions): the restart point may move there, so a stream whose tables are quiet
    /// does not pin the log of a busy server.
    pub fn advance_to(&mut self, received: Option<StreamPos>) -> Result<()> {
        if let Some(r) = received
            && self.batch.is_none()
            && !self.in_tx
            && self.force_cut_at.is_none()
            && r > self.restart
        {
            self.restart = r;
            self.restart_seq = self.next_seq;
        }
        self.advance()
    }

    fn save(&mut self) -> Result<()> {
        self.state.updated_at = chrono::Utc::now().to_rfc3339();
        self.state.ops = (!self.files.ops.all()).then(|| self.files.ops.describe());
        self.state.before_images = self.files.before_images;
        self.store.save(&self.state)
    }

    /// Abandon files being written (on an error or a stop without a cut).
    pub fn abort(&mut self) {
        for t in &mut self.tables {
            if let Some(f) = t.file.take() {
                io(|| f.writer.abort());
            }
            t.pending = [0; 4];
            t.merge_rows.clear();
        }
    }

    /// The schema version of table `h`'s current columns for a change written at `seq`,
    /// recorded in the state when it begins there.
    ///
    /// The version holding `seq` is the latest that began at or before it: it is kept when its
    /// columns are these (a replayed batch finds the versions it made the first time).
    /// Otherwise a version begins at `seq`, numbered after the last; versions recorded from
    /// `seq` on came from an attempt whose changes are being written again, so they give way
    /// (no two versions claim one `_seq`, and a version's columns are those of its files).
    fn version_for(&mut self, h: usize, seq: u64) -> u32 {
        let Table {
            dataset, columns, ..
        } = &self.tables[h];
        let pos = &self.tx.pos;
        let Some(ts) = self.state.tables.get_mut(dataset) else {
            return 0;
        };
        if let Some(v) = ts.versions.iter().rev().find(|v| v.since_seq <= seq)
            && v.columns == *columns
        {
            return v.version;
        }
        ts.versions.retain(|v| v.since_seq < seq);
        if let Some(v) = ts.versions.last()
            && v.columns == *columns
        {
            return v.version;
        }
        let version = ts.versions.last().map_or(1, |v| v.version + 1);
        if version > 1 {
            tracing::info!(
                "{dataset}: its columns changed at position {pos}: schema version {version} \
                 starts at _seq {seq} (a new change file)"
            );
        }
        ts.versions.push(SchemaVersion {
            version,
            since_seq: seq,
            since_pos: pos.clone(),
            columns: columns.clone(),
        });
        version
    }
}

/// A table's columns as its schema versions record them: name, Arrow type, source type.
fn describe(columns: &[ColumnDesc]) -> Vec<(String, String, String)> {
    columns
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                c.field.data_type().to_string(),
                c.source_type.clone(),
            )
        })
        .collect()
}

impl ChangeSink for Batcher {
    fn begin(&mut self, tx: TxMeta) -> Result<()> {
        // A partition holds one hour's changes: a transaction of another hour starts a batch.
        // A replayed batch is cut where its intent says (it was cut here the first time).
        if self.force_cut_at.is_none()
            && let Some(b) = self.batch.as_ref()
            && b.partition != self.files.layout.partition(commit_micros(tx.commit_ts))
        {
            self.cut()?;
        }
        self.tx = tx;
        self.in_tx = true;
        Ok(())
    }

    fn relation(&mut self, table: &TableRef, columns: &[ColumnDesc]) -> Result<usize> {
        let h = match self.by_ref.get(table) {
            Some(h) => *h,
            None => {
                self.by_ref.insert(table.clone(), self.tables.len());
                let dataset = table.dataset_name();
                self.tables.push(Table {
                    metrics: self.metrics.table(&dataset),
                    dataset,
                    ignored: true,
                    unknown: true,
                    snapshot_position: None,
                    columns: Vec::new(),
                    version: 0,
                    rows: None,
                    file: None,
                    pending: [0; 4],
                    keep: None,
                    merge_rows: Vec::new(),
                });
                return Ok(self.tables.len() - 1);
            }
        };
        if self.tables[h].ignored {
            return Ok(h);
        }
        // `--columns`: the files' columns, their schema versions included, are the kept ones.
        let keep: Option<Vec<bool>> = self.tables[h]
            .keep
            .as_ref()
            .map(|k| columns.iter().map(|c| k.contains(&c.name)).collect());
        let kept: Vec<ColumnDesc> = match &keep {
            Some(k) => columns
                .iter()
                .zip(k)
                .filter(|(_, k)| **k)
                .map(|(c, _)| c.clone())
                .collect(),
            None => columns.to_vec(),
        };
        let desc = describe(&kept);
        let t = &self.tables[h];
        // The builders take every column the source sends, by position: the same kept columns
        // at other positions (a left-out column added or dropped) still need new builders.
        if t.columns == desc
            && t.rows
                .as_ref()
                .is_some_and(|r| r.width() == columns.len() && r.projection() == keep.as_deref())
        {
            return Ok(h);
        }
        let busy = t.file.is_some() || t.rows.as_ref().is_some_and(|r| r.rows() > 0);
        if busy {
            // One schema per file: the changes so far go out with the old one.
            self.cut()?;
        }
        let mut schema = change_schema(table, columns)?;
        if self.files.before_images {
            schema = with_before_images(table, &schema, columns.len())?;
        }
        let missing = self
            .state
            .tables
            .get(&self.tables[h].dataset)
            .map(|t| t.missing.join("; "))
            .unwrap_or_default();
        if !missing.is_empty() {
            // Readers of the files see what they miss (Parquet key-value metadata).
            let meta = HashMap::from([(MISSING_KEY.to_string(), missing)]);
            schema = Arc::new(schema.as_ref().clone().with_metadata(meta));
        }
        let t = &mut self.tables[h];
        let mut rows = ChangeRows::new(schema, columns.len())?;
        if let Some(k) = keep {
            rows.project(k)?;
        }
        t.rows = Some(rows);
        t.columns = desc;
        // Its version is found at its first written change (`row`).
        t.version = 0;
        Ok(h)
    }

    fn row(&mut self, table: usize, op: ChangeOp) -> Result<Option<&mut ChangeRows>> {
        self.cur = None;
        let t = &mut self.tables[table];
        if std::mem::take(&mut t.unknown) {
            tracing::warn!("{}", crate::job::uncaptured(&t.dataset));
        }
        if t.ignored {
            self.metrics.ignored_changes.fetch_add(1, Ordering::Relaxed);
            t.metrics.ignored.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        if in_table_snapshot(t.snapshot_position.as_ref(), &self.tx.pos) {
            return Ok(None);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if seq <= self.skip_through {
            return Ok(None);
        }
        if self.force_cut_at.is_some_and(|f| seq > f) {
            self.cut()?;
        }
        if !self.files.ops.keeps(op) {
            self.metrics
                .filtered_changes
                .fetch_add(1, Ordering::Relaxed);
            self.tables[table].metrics.filtered[op_index(op)].fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        if self.tables[table].version == 0 && self.tables[table].rows.is_some() {
            self.tables[table].version = self.version_for(table, seq);
        }
        self.cur = Some((table, op, seq));
        Ok(self.tables[table].rows.as_mut())
    }

    fn row_done(&mut self) -> Result<()> {
        let Some((h, op, seq)) = self.cur.take() else {
            return Ok(());
        };
        let rows = self.tables[h]
            .rows
            .as_mut()
            .ok_or_else(|| Error::internal("a change for a table without columns"))?;
        rows.finish_row(op, &self.tx, seq)?;
        let pending = rows.bytes();
        let (layout, commit_ts) = (self.files.layout, self.tx.commit_ts);
        let b = self.batch.get_or_insert_with(|| Batch {
            first_seq: seq,
            last_seq: seq,
            started: Instant::now(),
            bytes: 0,
            changes: 0,
            partition: layout.partition(commit_micros(commit_ts)),
            first_commit: commit_ts,
            full: false,
        });
        b.last_seq = seq;
        b.changes += 1;
        self.tables[h].pending[op_index(op)] += 1;
        let total = b.bytes + pending;
        if pending >= self.budgets.flush_bytes {
            self.flush(h)?;
        }
        if self.force_cut_at.is_none() && total as u64 >= self.budgets.batch_bytes {
            // Merging, a batch ends between transactions: at this one's commit.
            match self.batch.as_mut() {
                Some(b) if self.merge.is_some() => b.full = true,
                _ => {
                    self.cut()?;
                }
            }
        }
        Ok(())
    }

    fn in_tx(&self) -> bool {
        self.in_tx
    }

    fn commit(&mut self, restart: &StreamPos) -> Result<()> {
        self.in_tx = false;
        self.restart = restart.clone();
        self.restart_seq = self.next_seq;
        self.last_commit_ts = self.tx.commit_ts;
        self.metrics.transactions.fetch_add(1, Ordering::Relaxed);
        if let (Some(f), Some(b)) = (self.force_cut_at, self.batch.as_ref())
            && b.last_seq == f
        {
            self.cut()?;
        }
        if self.force_cut_at.is_none() && self.batch.as_ref().is_some_and(|b| b.full) {
            self.cut()?;
        }
        Ok(())
    }
}

/// A transaction's commit time for its partition; the clock where the source gave none (a
/// retry then finds the partition in the intent, see `files.rs`).
fn commit_micros(commit_ts: Option<i64>) -> i64 {
    commit_ts.unwrap_or_else(|| chrono::Utc::now().timestamp_micros())
}

mod merge;
#[cfg(test)]
mod tests;

pub use merge::{MERGE_APP_ID, MergeInto};
