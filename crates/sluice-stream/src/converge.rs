//! The change log of a converged export (`sluice export --consistency converged`): the engine's
//! [`ChangeLog`] on any [`ChangeSource`] that hands over a snapshot at an exact position.
//!
//! `begin` creates the capture's objects (PostgreSQL: a slot and a publication named after the
//! output, so a killed run's leftovers are found and removed by the next run on that output)
//! and follows the log from the slot's consistent point C in a background task that keeps
//! only the *keys* of the changed rows, per table, and the positions of truncates. `end` takes
//! a snapshot at an exact position T (a temporary slot's exported snapshot), waits until the
//! follower has everything before T, and hands the keys over; the follower goes on, so `end`
//! may be called again for a later T (a read at T that had to give way to DDL is retried).
//! `close` stops the follower and removes the objects. The log is never confirmed, so
//! the slot holds the source's log from C until `close`: the run's report says how much.
//!
//! Memory: one entry per distinct changed key (its text), at most half of the export's
//! `--memory`; past that the run stops and says to raise it (keys are not spilled to disk
//! yet). Changes of a table whose columns change mid-run stop the run (a converged output
//! never mixes two schemas).

use async_trait::async_trait;
use sluice_core::apply::Engine;
use sluice_core::change::{
    CaptureNames, ChangeOp, ChangeRows, ChangeSink, ChangeSource, ChangeStream, Handoff, TxMeta,
    change_schema,
};
use sluice_core::keytext::key_texts;
use sluice_core::table::TableRef;
use sluice_core::{ColumnDesc, Dataset, Error, Result, StreamPos};
use sluice_engine::converge::{ChangeLog, ChangedKeys, EndPoint};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

/// How long one read of the log waits for data.
const WAIT: Duration = Duration::from_millis(200);
/// How long `close` waits for the follower to end, and for the server to let go of its slot.
const STOP_WAIT: Duration = Duration::from_secs(10);
/// Changes of one table buffered before their keys are taken.
const FLUSH_ROWS: usize = 4096;

/// A converged export's change log on `source`.
pub struct ConvergeLog {
    source: Arc<dyn ChangeSource>,
    names: CaptureNames,
    /// The most bytes the changed keys may take.
    key_bytes: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    start: Option<StreamPos>,
    /// The datasets and where their rows were stored when the log was begun.
    datasets: Vec<Dataset>,
    storage: Option<BTreeMap<String, String>>,
    publication_created: bool,
    begun: bool,
    follow: Option<Follow>,
}

/// The background task following the log, and what it has seen.
struct Follow {
    task: JoinHandle<()>,
    /// Tells the follower to end.
    stop: Arc<AtomicBool>,
    seen: Arc<StdMutex<Seen>>,
    at: watch::Receiver<Followed>,
}

/// What the log said so far, by dataset.
#[derive(Default)]
struct Seen {
    keys: HashMap<String, HashSet<Vec<String>>>,
    /// About what `keys` takes in memory.
    bytes: u64,
    /// The commit positions of each dataset's truncates.
    truncates: HashMap<String, Vec<StreamPos>>,
}

/// A follower's error, kept so that `end` returns it as it was (an error is not `Clone`).
#[derive(Clone)]
struct Failed {
    kind: sluice_core::ErrorKind,
    retry: sluice_core::error::Retry,
    message: String,
}

impl Failed {
    fn of(e: &Error) -> Failed {
        Failed {
            kind: e.kind(),
            retry: e.retry(),
            message: e.message().to_string(),
        }
    }

    fn error(&self) -> Error {
        Error::new(self.kind, self.retry, self.message.clone()).context("following the change log")
    }
}

/// How far the follower got.
#[derive(Default, Clone)]
struct Followed {
    /// Everything before this position is in [`Seen`].
    at: Option<StreamPos>,
    /// Why it stopped, when it failed.
    failed: Option<Failed>,
}

impl ConvergeLog {
    /// The log of `source`, with capture objects named after `output` (the export's
    /// destination as displayed): one converged run at a time per output, which the output's
    /// lock ensures, so a name per output finds what a killed run left.
    /// `memory` is the export's `--memory`: the changed keys may take half of it.
    pub fn new(source: Arc<dyn ChangeSource>, output: &str, memory: u64) -> ConvergeLog {
        let name = format!(
            "sluice_converged_{:016x}",
            xxhash_rust::xxh3::xxh3_64(output.as_bytes())
        );
        ConvergeLog {
            source,
            key_bytes: memory / 2,
            names: CaptureNames {
                name: name.clone(),
                publication: name,
            },
            state: Mutex::new(State::default()),
        }
    }
}

#[async_trait]
impl ChangeLog for ConvergeLog {
    async fn check(&self, datasets: &[Dataset]) -> Result<()> {
        if self.source.engine() != Engine::Postgres {
            return Err(Error::config(format!(
                "--consistency converged reads PostgreSQL only for now ({} cannot hand over a \
                 snapshot at an exact log position yet); use --consistency snapshot.",
                self.source.display_url()
            )));
        }
        self.source.check(datasets).await
    }

    async fn begin(&self, datasets: &[Dataset]) -> Result<String> {
        let mut state = self.state.lock().await;
        if let Some(objects) = self.source.server_objects()
            && objects.exists(&self.names).await?
        {
            let removed = objects.remove(&self.names, true).await?;
            tracing::info!(
                "removed what an interrupted converged export left: {}",
                removed.join(", ")
            );
        }
        state.storage = self.source.storage(datasets).await?;
        state.datasets = datasets.to_vec();
        let created = self.source.start(&self.names, datasets, false).await?;
        state.begun = true;
        state.publication_created = created.publication_created;
        state.start = Some(created.position.clone());
        let stream = self
            .source
            .open(&self.names, datasets, &created.position)
            .await?;
        let seen = Arc::new(StdMutex::new(Seen::default()));
        let (tx, at) = watch::channel(Followed::default());
        let sink = Keys::new(datasets, seen.clone(), self.key_bytes);
        let stop = Arc::new(AtomicBool::new(false));
        state.follow = Some(Follow {
            task: tokio::spawn(follow(stream, sink, tx, stop.clone())),
            stop,
            seen,
            at,
        });
        Ok(created.position.as_str().to_string())
    }

    async fn end(&self) -> Result<EndPoint> {
        let (seen, mut at, start, datasets, storage) = match &*self.state.lock().await {
            State {
                follow: Some(f),
                start,
                datasets,
                storage,
                ..
            } => (
                f.seen.clone(),
                f.at.clone(),
                start.clone(),
                datasets.clone(),
                storage.clone(),
            ),
            _ => return Err(Error::internal("the change log's end before its beginning")),
        };
        // Read before T: a rewrite after the last chunk is harmless, and is caught here too.
        let rewritten = match storage {
            Some(before) => match self.source.storage(&datasets).await? {
                Some(now) => before
                    .iter()
                    .filter(|(d, f)| now.get(*d) != Some(*f))
                    .map(|(d, _)| d.clone())
                    .collect(),
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        let taken = Instant::now();
        let held = match self.source.handoff().await? {
            Handoff::Held(h) => h,
            Handoff::FromExportManifest => {
                return Err(Error::internal(
                    "a converged export needs a snapshot at an exact log position",
                ));
            }
        };
        let t = held.position.clone();
        let reached = at
            .wait_for(|f| f.failed.is_some() || f.at.as_ref().is_some_and(|a| *a >= t))
            .await
            .map(|f| f.failed.clone())
            .unwrap_or_else(|_| Some(Failed::of(&Error::source_transient("the follower ended"))));
        if let Some(f) = reached {
            let _ = held.hold.release().await;
            return Err(f.error());
        }
        let changed = match seen.lock() {
            Ok(s) => changed_before(&s, &t),
            Err(_) => return Err(Error::internal("the change log's keys were poisoned")),
        };
        // A truncated table's parts are emptied anyway; any other rewrite moved rows between
        // the chunks unseen by the log.
        let moved: Vec<String> = rewritten
            .into_iter()
            .filter(|d| !changed.get(d).is_some_and(|c| c.truncated))
            .collect();
        if !moved.is_empty() {
            let _ = held.hold.release().await;
            return Err(Error::source_permanent(format!(
                "{} {} rewritten (VACUUM FULL, CLUSTER or a rewriting ALTER TABLE) while the \
                 converged export read {}: its rows moved between the chunks without a change \
                 in the log, so some could be missed or read twice. Run the export again once \
                 the rewrite is over.",
                moved.join(", "),
                if moved.len() == 1 { "was" } else { "were" },
                if moved.len() == 1 { "it" } else { "them" },
            )));
        }
        let number = |p: &StreamPos| self.source.position_number(p);
        let log_bytes = start
            .as_ref()
            .and_then(number)
            .zip(number(&t))
            .map(|(c, t)| t.saturating_sub(c));
        Ok(EndPoint {
            log_bytes,
            position: t.as_str().to_string(),
            source: self.source.export_source(Some(&held.snapshot)),
            hold: held.hold,
            taken,
            changed,
        })
    }

    async fn close(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        if let Some(mut f) = state.follow.take() {
            // Ended cleanly, so the server lets go of the slot; cut off if it does not end.
            f.stop.store(true, Ordering::Relaxed);
            if tokio::time::timeout(STOP_WAIT, &mut f.task).await.is_err() {
                f.task.abort();
            }
        }
        if !std::mem::take(&mut state.begun) {
            return Ok(());
        }
        let Some(objects) = self.source.server_objects() else {
            return Ok(());
        };
        // The server may still hold the slot for the stream just ended, for a moment.
        let since = Instant::now();
        loop {
            match objects.remove(&self.names, state.publication_created).await {
                Ok(_) => return Ok(()),
                Err(e) if since.elapsed() < STOP_WAIT => {
                    tracing::debug!(
                        "removing {}: {e}; trying again",
                        objects.describe(&self.names)
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The keys changed as the end point `t` sees them: every key seen (one changed only after
/// `t` is read again at `t` too, which gives the same row), but only the truncates committed
/// before `t` (a later one must not empty parts whose rows `t` still has).
fn changed_before(seen: &Seen, t: &StreamPos) -> HashMap<String, ChangedKeys> {
    let mut out: HashMap<String, ChangedKeys> = HashMap::new();
    for (ds, keys) in &seen.keys {
        out.entry(ds.clone()).or_default().keys = keys.clone();
    }
    for (ds, at) in &seen.truncates {
        if at.iter().any(|p| p <= t) {
            out.entry(ds.clone()).or_default().truncated = true;
        }
    }
    out
}

/// Read the log into `sink` until told to stop, saying after each read how far it got.
async fn follow(
    mut stream: Box<dyn ChangeStream>,
    mut sink: Keys,
    at: watch::Sender<Followed>,
    stop: Arc<AtomicBool>,
) {
    let failed = loop {
        if stop.load(Ordering::Relaxed) {
            let _ = stream.close().await;
            return;
        }
        if let Err(e) = stream.next(&mut sink, WAIT).await {
            break e;
        }
        if sink.in_tx() {
            continue;
        }
        match (sink.flush_all(), stream.received_through()) {
            (Err(e), _) => break e,
            (Ok(()), Some(r)) => at.send_modify(|f| f.at = Some(r)),
            (Ok(()), None) => {}
        }
    };
    let _ = stream.close().await;
    at.send_modify(|f| f.failed = Some(Failed::of(&failed)));
}

/// One table's rows as the log describes them.
struct Table {
    /// The dataset's name (the table's, for a table the export does not read).
    dataset: String,
    /// `None` for a table the export does not read.
    rows: Option<ChangeRows>,
    key: Vec<usize>,
    columns: Vec<String>,
}

/// A [`ChangeSink`] that keeps the key of every change, per dataset.
struct Keys {
    datasets: Vec<(TableRef, Dataset)>,
    tables: Vec<Table>,
    current: Option<(usize, ChangeOp)>,
    in_tx: bool,
    tx: Option<TxMeta>,
    seq: u64,
    seen: Arc<StdMutex<Seen>>,
    /// The most bytes the keys may take.
    limit: u64,
}

impl Keys {
    fn new(datasets: &[Dataset], seen: Arc<StdMutex<Seen>>, limit: u64) -> Keys {
        Keys {
            datasets: datasets
                .iter()
                .filter_map(|d| Some((d.object.clone()?, d.clone())))
                .collect(),
            tables: Vec::new(),
            current: None,
            in_tx: false,
            tx: None,
            seq: 0,
            seen,
            limit,
        }
    }

    /// Take the keys of table `index`'s buffered changes.
    fn flush(&mut self, index: usize) -> Result<()> {
        let t = &mut self.tables[index];
        let Some(rows) = t.rows.as_mut().filter(|r| r.rows() > 0) else {
            return Ok(());
        };
        let batch = rows.finish()?;
        let keys = key_texts(&batch, &t.key)?;
        rows.recycle(batch);
        let mut seen = self
            .seen
            .lock()
            .map_err(|_| Error::internal("the change log's keys were poisoned"))?;
        let Seen {
            keys: all, bytes, ..
        } = &mut *seen;
        let set = all.entry(t.dataset.clone()).or_default();
        for key in keys {
            // A hash set entry, a vector and a string per column, and the text.
            let size = 48 + key.iter().map(|v| 24 + v.len() as u64).sum::<u64>();
            if set.insert(key) {
                *bytes += size;
            }
        }
        if *bytes > self.limit {
            return Err(Error::config(format!(
                "the rows changed while the converged export ran take more than {} MB to \
                 remember (half of --memory): raise --memory, or export with --consistency \
                 snapshot.",
                self.limit >> 20
            )));
        }
        Ok(())
    }

    fn flush_all(&mut self) -> Result<()> {
        (0..self.tables.len()).try_for_each(|i| self.flush(i))
    }
}

impl ChangeSink for Keys {
    fn begin(&mut self, tx: TxMeta) -> Result<()> {
        self.in_tx = true;
        self.tx = Some(tx);
        Ok(())
    }

    fn relation(&mut self, table: &TableRef, columns: &[ColumnDesc]) -> Result<usize> {
        let Some((_, ds)) = self.datasets.iter().find(|(t, _)| t == table) else {
            // PostgreSQL describes a partition too when it sends a change of it under its
            // partitioned table: only a change under an unknown name is an error (`row`).
            self.tables.push(Table {
                dataset: table.to_string(),
                rows: None,
                key: Vec::new(),
                columns: Vec::new(),
            });
            return Ok(self.tables.len() - 1);
        };
        let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
        let wanted: Vec<&str> = ds.columns.iter().map(|c| c.name.as_str()).collect();
        let same = match ds.columns_picked {
            false => names.iter().map(String::as_str).eq(wanted.iter().copied()),
            true => wanted.iter().all(|w| names.iter().any(|n| n == w)),
        };
        let before = self
            .tables
            .iter()
            .find(|t| t.rows.is_some() && t.dataset == ds.name);
        if !same || before.is_some_and(|b| b.columns != names) {
            return Err(Error::source_permanent(format!(
                "{}: its columns changed while the converged export ran (now: {}); the output \
                 would mix two schemas. Run the export again.",
                ds.name,
                names.join(", ")
            )));
        }
        let key = ds
            .primary_key
            .iter()
            .map(|k| {
                names.iter().position(|n| n == k).ok_or_else(|| {
                    Error::source_permanent(format!(
                        "{}: the change log's rows lack key column {k:?}",
                        ds.name
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let rows = ChangeRows::new(change_schema(table, columns)?, columns.len())?;
        self.tables.push(Table {
            dataset: ds.name.clone(),
            rows: Some(rows),
            key,
            columns: names,
        });
        Ok(self.tables.len() - 1)
    }

    fn row(&mut self, table: usize, op: ChangeOp) -> Result<Option<&mut ChangeRows>> {
        let t = self
            .tables
            .get_mut(table)
            .ok_or_else(|| Error::internal(format!("a change of unknown table {table}")))?;
        if t.rows.is_none() {
            return Err(Error::source_permanent(format!(
                "the change log sent a change of {}, which the export does not read: a table \
                 renamed while the converged export ran? Its changes would be missed; run the \
                 export again.",
                t.dataset
            )));
        }
        if op == ChangeOp::Truncate {
            let pos = self
                .tx
                .as_ref()
                .ok_or_else(|| Error::internal("a truncate outside a transaction"))?
                .pos
                .clone();
            let mut seen = self
                .seen
                .lock()
                .map_err(|_| Error::internal("the change log's keys were poisoned"))?;
            seen.truncates
                .entry(t.dataset.clone())
                .or_default()
                .push(pos);
            self.current = None;
            return Ok(None);
        }
        self.current = Some((table, op));
        Ok(t.rows.as_mut())
    }

    fn row_done(&mut self) -> Result<()> {
        let Some((index, op)) = self.current.take() else {
            return Ok(());
        };
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| Error::internal("a change outside a transaction"))?;
        self.seq += 1;
        let Some(rows) = self.tables[index].rows.as_mut() else {
            return Ok(());
        };
        rows.finish_row(op, tx, self.seq)?;
        if rows.rows() >= FLUSH_ROWS {
            self.flush(index)?;
        }
        Ok(())
    }

    fn commit(&mut self, _restart: &StreamPos) -> Result<()> {
        self.in_tx = false;
        self.tx = None;
        Ok(())
    }

    fn in_tx(&self) -> bool {
        self.in_tx
    }
}
