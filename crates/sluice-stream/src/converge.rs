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
//! `close` stops the follower and removes the objects — or keeps them for `--resume`, which
//! `begin` then follows again from the C the unfinished run recorded. The log is never
//! confirmed, so the slot holds the source's log from C until it is removed: the run's report
//! says how much.
//!
//! `sluice stream --consistency converged` lends its own capture ([`ConvergeLog::borrowed`]):
//! its slot, created without an exported snapshot, is C; the log is followed from there and
//! neither created nor removed here, and the stream then reads on from C, leaving to the
//! snapshot every transaction before its end point T.
//!
//! Memory: the changed keys (their text) take at most half of the export's `--memory`; past
//! that the largest dataset's are written, sorted, to a file in the temporary directory
//! (`sluice_sink::overlay`), and an end point merges each dataset's into one sorted file, of
//! which only a filter and a sparse index stay in memory. Changes of a table whose columns change mid-run stop the run (a converged output
//! never mixes two schemas). A child of a foreign key whose action the source's log does not
//! carry (InnoDB's cascades) is refused in `check` (see `crate::cascades`).

mod keys;

use async_trait::async_trait;
use keys::{Keys, Seen};
use sluice_core::apply::{Engine, TableKeys};
use sluice_core::change::{CaptureNames, ChangeSink, ChangeSource, ChangeStream, Handoff};
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Error, Result, StreamPos};
use sluice_engine::converge::{ChangeLog, ChangedKeys, EndPoint, Until};
use sluice_engine::manifest::ConvergedStart;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

/// How long one read of the log waits for data.
const WAIT: Duration = Duration::from_millis(200);
/// How long `close` waits for the follower to end, and for the server to let go of its slot.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// A converged export's change log on `source`.
pub struct ConvergeLog {
    source: Arc<dyn ChangeSource>,
    names: CaptureNames,
    /// A stream's capture lent to its initial snapshot (`sluice stream --consistency
    /// converged`): followed from this position, never created nor removed here — the stream
    /// reads on from it after the snapshot.
    borrowed: Option<StreamPos>,
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
            borrowed: None,
            state: Mutex::new(State::default()),
        }
    }

    /// The log of a stream's initial snapshot: the stream's own capture `names`, created at
    /// `start` (C), followed from there and left to the stream, which writes the changes
    /// after the snapshot's end point T.
    pub fn borrowed(
        source: Arc<dyn ChangeSource>,
        names: CaptureNames,
        start: StreamPos,
        memory: u64,
    ) -> ConvergeLog {
        ConvergeLog {
            source,
            key_bytes: memory / 2,
            names,
            borrowed: Some(start),
            state: Mutex::new(State::default()),
        }
    }
}

impl ConvergeLog {
    /// C for a source that cannot hand a snapshot over (MySQL/MariaDB), `None` for the others
    /// (a PostgreSQL slot's consistent point is exact). The binary log's end read as such may
    /// already hold a transaction the storage engine has not committed yet (the log is
    /// written first): a chunk whose snapshot began before that commit would miss it, and the
    /// log from there would too. So C is the position of a snapshot lined up as a snapshot
    /// export's (under the same brief global lock, which lets commits under way finish):
    /// every transaction before it is committed, so every later chunk sees it.
    async fn exact_start(&self, datasets: &[Dataset]) -> Result<Option<StreamPos>> {
        if self.source.engine() != Engine::Mysql {
            return Ok(None);
        }
        let options = sluice_core::SourceOptions {
            session_tag: "sluice-converged-start".into(),
            consistency: sluice_core::Consistency::Snapshot,
            enable_row_security: false,
        };
        let mut coordinator = self
            .source
            .export_source(None)
            .open_coordinator(&options)
            .await?;
        let pinned = async {
            coordinator.reserve_readers(1).await?;
            coordinator.pin_snapshot(datasets).await
        }
        .await;
        let _ = coordinator.release().await;
        let at = pinned?.position;
        self.source
            .manifest_position(&at)?
            .map(Some)
            .ok_or_else(|| {
                Error::internal(format!("the start's snapshot ({at}) has no log position"))
            })
    }

    /// Follow the log of `datasets` from `start` in a background task that keeps the changed
    /// keys.
    async fn follow_from(
        &self,
        state: &mut State,
        datasets: &[Dataset],
        start: ConvergedStart,
    ) -> Result<ConvergedStart> {
        state.storage = start.storage.clone();
        state.datasets = datasets.to_vec();
        let position = StreamPos::from_adapter(start.position.clone());
        state.start = Some(position.clone());
        let stream = self.source.open(&self.names, datasets, &position).await?;
        let spill = tempfile::Builder::new()
            .prefix("sluice-converged-")
            .tempdir()
            .map_err(|e| {
                Error::destination(
                    sluice_core::Retry::Permanent,
                    format!(
                        "a temporary directory for the changed keys in {}: {e}; point TMPDIR at \
                         a writable directory.",
                        std::env::temp_dir().display()
                    ),
                )
            })?;
        let seen = Arc::new(StdMutex::new(Seen::new(Arc::new(spill))));
        let (tx, at) = watch::channel(Followed::default());
        let unlogged = self.unlogged(datasets).await?;
        let sink = Keys::new(datasets, seen.clone(), self.key_bytes, unlogged);
        let stop = Arc::new(AtomicBool::new(false));
        state.follow = Some(Follow {
            task: tokio::spawn(follow(stream, sink, tx, stop.clone())),
            stop,
            seen,
            at,
        });
        Ok(start)
    }

    /// Wait until the follower has everything before `t`, then what changed before it.
    /// `rewritten`: datasets whose storage changed since C (refused unless truncated).
    async fn until(
        &self,
        t: &StreamPos,
        start: Option<&StreamPos>,
        rewritten: Vec<String>,
    ) -> Result<Until> {
        let (seen, mut at) = match &self.state.lock().await.follow {
            Some(f) => (f.seen.clone(), f.at.clone()),
            None => return Err(Error::internal("the change log's end before its beginning")),
        };
        if let Some(f) = catch_up(&mut at, t).await {
            return Err(f.error());
        }
        // Merging the keys reads and writes their files: off the runtime's threads.
        let stop = t.clone();
        let changed = tokio::task::spawn_blocking(move || match seen.lock() {
            Ok(mut s) => changed_before(&mut s, &stop),
            Err(_) => Err(Error::internal("the change log's keys were poisoned")),
        })
        .await
        .map_err(|e| Error::internal(format!("the changed keys' merge: {e}")))??;
        // A truncated table's parts are emptied anyway; any other rewrite moved rows between
        // the chunks unseen by the log.
        let moved: Vec<String> = rewritten
            .into_iter()
            .filter(|d| !changed.get(d).is_some_and(|c| c.truncated))
            .collect();
        if !moved.is_empty() {
            return Err(Error::source_permanent(format!(
                "{} {} rewritten (VACUUM FULL, CLUSTER or a rewriting ALTER TABLE) while the \
                 converged export read {}: its rows moved between the chunks without a change \
                 in the log, so some could be missed or read twice. Run the export again with \
                 --overwrite once the rewrite is over.",
                moved.join(", "),
                if moved.len() == 1 { "was" } else { "were" },
                if moved.len() == 1 { "it" } else { "them" },
            )));
        }
        let number = |p: &StreamPos| self.source.position_number(p);
        let log_bytes = start
            .and_then(number)
            .zip(number(t))
            .map(|(c, t)| t.saturating_sub(c));
        Ok(Until {
            position: t.as_str().to_string(),
            changed,
            log_bytes,
        })
    }

    /// The generated columns the source's log leaves out of each table's rows (PostgreSQL
    /// before 18 does not publish them); none when it sends them.
    async fn unlogged(&self, datasets: &[Dataset]) -> Result<HashMap<TableRef, Vec<String>>> {
        if self.source.sends_generated() {
            return Ok(HashMap::new());
        }
        Ok(unlogged_generated(self.source.table_keys(datasets).await?))
    }
}

#[async_trait]
impl ChangeLog for ConvergeLog {
    async fn check(&self, datasets: &[Dataset]) -> Result<()> {
        if !matches!(self.source.engine(), Engine::Postgres | Engine::Mysql) {
            return Err(Error::config(format!(
                "--consistency converged reads PostgreSQL, MySQL and MariaDB ({} has no change \
                 log to follow); use --consistency snapshot.",
                self.source.display_url()
            )));
        }
        self.source.check(datasets).await?;
        let keys = self.source.table_keys(datasets).await?;
        crate::cascades::check_converged(
            self.source.as_ref(),
            &crate::cascades::unlogged(self.source.as_ref(), &keys),
        )?;
        let unlogged = match self.source.sends_generated() {
            true => HashMap::new(),
            false => unlogged_generated(keys),
        };
        for ds in datasets {
            let generated = ds.object.as_ref().and_then(|o| unlogged.get(o));
            if let Some(c) = ds
                .primary_key
                .iter()
                .find(|k| generated.is_some_and(|g| g.contains(k)))
            {
                return Err(Error::config(format!(
                    "{}: its primary key includes the generated column {c:?}, which {}'s change \
                     log leaves out, so a changed row could not be found by its key. Export it \
                     with --consistency snapshot.",
                    ds.name,
                    self.source.display_url()
                )));
            }
        }
        Ok(())
    }

    async fn begin(
        &self,
        datasets: &[Dataset],
        resume: Option<&ConvergedStart>,
    ) -> Result<ConvergedStart> {
        let mut state = self.state.lock().await;
        if let Some(c) = &self.borrowed {
            // The stream's capture: its start, or the one an interrupted snapshot recorded
            // (the same: the stream confirms nothing before its snapshot is done).
            let start = match resume {
                Some(r) => r.clone(),
                None => ConvergedStart {
                    position: match self.exact_start(datasets).await? {
                        Some(exact) => exact.as_str().to_string(),
                        None => c.as_str().to_string(),
                    },
                    storage: self.source.storage(datasets).await?,
                    keys: Default::default(),
                },
            };
            return self.follow_from(&mut state, datasets, start).await;
        }
        let objects = self.source.server_objects();
        let left = match &objects {
            Some(o) => match o.exists(&self.names).await {
                Ok(left) => left,
                // Invalidated (the server removed WAL it needed): gone for a resume, and
                // removed before a fresh start like any leftover.
                Err(e) if e.kind() == sluice_core::ErrorKind::Source => {
                    tracing::warn!("{e}");
                    resume.is_none()
                }
                Err(e) => return Err(e),
            },
            None => false,
        };
        let start = match (resume, objects) {
            (Some(recorded), Some(objects)) if left => {
                // The unfinished run's objects, kept since its C: follow the log again from
                // there — unless a reader confirmed changes past C (the run never does), which
                // the server would then skip.
                let c = StreamPos::from_adapter(recorded.position.clone());
                if let Some(confirmed) = objects.confirmed(&self.names).await?
                    && confirmed > c
                {
                    return Err(Error::config(format!(
                        "{} was advanced to {confirmed}, past the start ({c}) of the unfinished \
                         converged export it kept the log for (pg_replication_slot_advance, or \
                         another reader on it): the server no longer sends the changes between, \
                         so the parts read so far cannot be brought to one point in time. Use \
                         --overwrite to start over.",
                        objects.describe(&self.names)
                    )));
                }
                state.begun = true;
                state.publication_created = true;
                tracing::info!(
                    "resuming on {} from {}",
                    objects.describe(&self.names),
                    recorded.position
                );
                recorded.clone()
            }
            // MySQL/MariaDB keep nothing on the server: the binary log from C is read again
            // (opening it fails, naming the fix, when the server purged it).
            (Some(recorded), None) => recorded.clone(),
            (Some(recorded), objects) => {
                let what = objects
                    .map(|o| o.describe(&self.names))
                    .unwrap_or_else(|| "the capture".to_string());
                return Err(Error::config(format!(
                    "{what}, which kept the source's log from {} for this unfinished converged \
                     export, is gone (removed by hand, or invalidated by the server's \
                     max_slot_wal_keep_size): the parts read so far cannot be brought to one \
                     point in time. Use --overwrite to start over.",
                    recorded.position
                )));
            }
            (None, objects) => {
                if let Some(objects) = objects
                    && left
                {
                    let removed = objects.remove(&self.names, true).await?;
                    tracing::info!(
                        "removed what an interrupted converged export left: {}",
                        removed.join(", ")
                    );
                }
                let storage = self.source.storage(datasets).await?;
                let created = self.source.start(&self.names, datasets, false).await?;
                state.begun = true;
                state.publication_created = created.publication_created;
                let position = match self.exact_start(datasets).await? {
                    Some(exact) => exact,
                    None => created.position,
                };
                ConvergedStart {
                    position: position.as_str().to_string(),
                    storage,
                    keys: Default::default(),
                }
            }
        };
        self.follow_from(&mut state, datasets, start).await
    }

    async fn end(&self) -> Result<EndPoint> {
        let (start, datasets, storage) = match &*self.state.lock().await {
            State {
                follow: Some(_),
                start,
                datasets,
                storage,
                ..
            } => (start.clone(), datasets.clone(), storage.clone()),
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
                // MySQL/MariaDB: the run lines its readers' snapshots up itself, at an exact
                // position, and asks what changed up to it (`changed_until`).
                return Ok(EndPoint {
                    at: None,
                    source: self.source.export_source(None),
                    hold: Box::new(NoHold),
                    taken,
                });
            }
        };
        let t = held.position.clone();
        let until = match self.until(&t, start.as_ref(), rewritten).await {
            Ok(u) => u,
            Err(e) => {
                let _ = held.hold.release().await;
                return Err(e);
            }
        };
        Ok(EndPoint {
            at: Some(until),
            source: self.source.export_source(Some(&held.snapshot)),
            hold: held.hold,
            taken,
        })
    }

    async fn changed_until(&self, at: &sluice_core::Position) -> Result<Until> {
        let start = self.state.lock().await.start.clone();
        let t = self.source.manifest_position(at)?.ok_or_else(|| {
            Error::internal(format!(
                "the end point's snapshot ({at}) has no position in the change log"
            ))
        })?;
        self.until(&t, start.as_ref(), Vec::new()).await
    }

    async fn discard(&self) -> Result<Vec<String>> {
        if self.borrowed.is_some() {
            return Ok(Vec::new());
        }
        let Some(objects) = self.source.server_objects() else {
            return Ok(Vec::new());
        };
        match objects.exists(&self.names).await {
            Ok(false) => Ok(Vec::new()),
            Ok(true) => objects.remove(&self.names, true).await,
            // Invalidated: still there, holding nothing, removed like any leftover.
            Err(e) if e.kind() == sluice_core::ErrorKind::Source => {
                tracing::warn!("{e}");
                objects.remove(&self.names, true).await
            }
            Err(e) => Err(e),
        }
    }

    async fn close(&self, keep: bool) -> Result<Option<String>> {
        let mut state = self.state.lock().await;
        if let Some(mut f) = state.follow.take() {
            // Ended cleanly, so the server lets go of the slot; cut off if it does not end.
            f.stop.store(true, Ordering::Relaxed);
            if tokio::time::timeout(STOP_WAIT, &mut f.task).await.is_err() {
                f.task.abort();
            }
        }
        if !std::mem::take(&mut state.begun) || self.borrowed.is_some() {
            return Ok(None);
        }
        let Some(objects) = self.source.server_objects() else {
            return Ok(None);
        };
        if keep {
            let from = state.start.as_ref().map(|p| p.as_str()).unwrap_or_default();
            return Ok(Some(format!(
                "{} keeps the source's log from {from}",
                objects.describe(&self.names)
            )));
        }
        // The server may still hold the slot for the stream just ended, for a moment.
        let since = Instant::now();
        loop {
            match objects.remove(&self.names, state.publication_created).await {
                Ok(_) => return Ok(None),
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

/// Wait until the follower has everything before `t` (`None`) or failed, saying every
/// [`CATCH_UP_WORD`] how far it got and since when it has not moved — no deadline: a large
/// transaction arrives whole at its commit (PostgreSQL decodes it first), so standing still
/// for minutes can be progress.
async fn catch_up(at: &mut watch::Receiver<Followed>, t: &StreamPos) -> Option<Failed> {
    let mut last = at.borrow().at.clone();
    let mut moved = Instant::now();
    let mut said = Instant::now();
    loop {
        {
            let f = at.borrow_and_update();
            if let Some(failed) = &f.failed {
                return Some(failed.clone());
            }
            if f.at.as_ref().is_some_and(|a| a >= t) {
                return None;
            }
            if f.at != last {
                last = f.at.clone();
                moved = Instant::now();
            }
        }
        if said.elapsed() >= CATCH_UP_WORD {
            said = Instant::now();
            let seen = last.as_ref().map_or("its start", |p| p.as_str());
            tracing::info!(
                "reading the change log up to the end point {t}: at {seen} (there {} s)",
                moved.elapsed().as_secs()
            );
        }
        // Woken by the follower, or once a second to say how far it got.
        if let Ok(Err(_)) = tokio::time::timeout(Duration::from_secs(1), at.changed()).await {
            return Some(Failed::of(&Error::source_transient("the follower ended")));
        }
    }
}

/// How often a long catch-up to the end point is said.
const CATCH_UP_WORD: Duration = Duration::from_secs(30);

/// The hold of a snapshot the run takes itself (its coordinator ends it).
struct NoHold;

#[async_trait]
impl sluice_core::change::SnapshotHold for NoHold {
    async fn release(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// The generated columns of each table that has some, by name.
fn unlogged_generated(keys: Vec<TableKeys>) -> HashMap<TableRef, Vec<String>> {
    keys.into_iter()
        .filter(|k| !k.generated.is_empty())
        .map(|k| (k.table, k.generated.into_iter().map(|g| g.name).collect()))
        .collect()
}

/// The keys changed as the end point `t` sees them: every key seen (one changed only after
/// `t` is read again at `t` too, which gives the same row), but only the truncates committed
/// before `t` (a later one must not empty parts whose rows `t` still has). Each dataset's
/// keys are merged into one sorted file the follower goes on from.
fn changed_before(seen: &mut Seen, t: &StreamPos) -> Result<HashMap<String, ChangedKeys>> {
    let mut out: HashMap<String, ChangedKeys> = HashMap::new();
    for (ds, keys) in &mut seen.keys {
        out.entry(ds.clone()).or_default().keys = Some(keys.freeze()?);
    }
    for (ds, at) in &seen.truncates {
        if at.iter().any(|p| p <= t) {
            out.entry(ds.clone()).or_default().truncated = true;
        }
    }
    Ok(out)
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
