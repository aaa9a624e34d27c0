//! The apply workers: N target sessions taking units from the schedule, each committing only
//! when every earlier unit has committed, with the unit's position recorded in the same
//! target transaction.
//!
//! Every state change (a unit added, committed, rolled back) bumps one generation counter;
//! workers and the pump wait on it and look at the schedule again, so nobody polls.
//!
//! A unit that conflicts is retried in place (see `schedule.rs`), except when part of it is
//! already committed (before a MySQL/MariaDB barrier's DDL): then the run restarts from the
//! applied position. A lock wait that a unit running alone gives up is another session's lock:
//! it is retried for as long as it takes, naming the holder every 30 s.
//!
//! Length: about 560 lines; the pool's shared state, the worker loop and one unit's run (its
//! waits, retries and position) read and change the one schedule, so they stay together.

use super::collect::{More, Piece, Ready, Work};
use super::plan::plan;
use super::schedule::{Schedule, Take, late_rows};
use super::writeset::RowKeys;
use arrow_array::cast::AsArray;
use sluice_core::apply::{AppliedPosition, ApplySession, ApplyTarget, Barrier, SourceColumn};
use sluice_core::change::ChangeOp;
use sluice_core::{Error, ErrorKind, Result, Retry, failpoint};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Conflicts of one unit before its error is the run's error (it ran alone the last times).
const MAX_ATTEMPTS: u32 = 6;

/// From this attempt on a unit that conflicted runs alone (see `schedule.rs`): a lock it
/// waits for is then held by a session that is not sluice's.
const ALONE: u32 = 2;

/// How often the warning about a unit waiting for another session's lock repeats.
const BLOCKED_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// How often the warning about updates and deletes that matched no row repeats.
const UNMATCHED_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Counters of an apply run.
#[derive(Debug, Default)]
pub struct ApplyCounters {
    /// Units committed.
    pub units: AtomicU64,
    /// Source transactions committed on the target.
    pub transactions: AtomicU64,
    /// Source transactions received (applied or waiting): the lag in transactions is this
    /// minus `transactions`.
    pub received: AtomicU64,
    /// Row changes committed on the target.
    pub changes: AtomicU64,
    /// Units rolled back and run again (conflicts the writesets did not predict).
    pub conflicts: AtomicU64,
    /// Units rolled back because an earlier one had to run alone.
    pub aborts: AtomicU64,
    /// Updates and deletes committed that matched no row on the target.
    pub unmatched: AtomicU64,
    /// Changes of tables the run does not capture (a captured table renamed), left out.
    pub ignored: AtomicU64,
    /// Units that applied their rows free of earlier units first and the others after those
    /// units committed (instead of waiting whole).
    pub split: AtomicU64,
    /// Commit time on the source of the last applied transaction, µs.
    pub last_commit_ts: AtomicU64,
    /// The largest delay seen between a source commit and its application, ms.
    pub peak_lag_millis: AtomicU64,
    /// The most log the source kept for the replication, bytes.
    pub peak_retained_bytes: AtomicU64,
    /// The log the source keeps for the replication now, bytes.
    pub retained_bytes: AtomicU64,
    /// Per unit: seconds from the source's commit of its last transaction to its commit on
    /// the target.
    pub apply_latency: crate::metrics::Histogram,
    /// Row changes of committed units per table (`schema.table`) and operation
    /// ([`crate::metrics::op_index`]); a streamed transaction's later pieces are counted in
    /// `changes` only.
    pub tables: Mutex<std::collections::BTreeMap<String, [u64; 4]>>,
}

impl ApplyCounters {
    /// Count the rows of `work`'s pieces per table and operation.
    fn count_tables(&self, work: &Work) {
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        for piece in &work.pieces {
            let Piece::Rows(unit) = piece else { continue };
            for t in &unit.tables {
                let Some(ops) = t.batch.column_by_name(sluice_core::change::OP) else {
                    continue;
                };
                let counts = tables.entry(t.table.to_string()).or_default();
                for op in ops.as_string::<i32>().iter().flatten() {
                    if let Some(op) = ChangeOp::parse(op) {
                        counts[crate::metrics::op_index(op)] += 1;
                    }
                }
            }
        }
    }
}

struct Shared {
    sched: Mutex<Schedule<Arc<Work>>>,
    generation: watch::Sender<u64>,
    bytes: AtomicUsize,
    /// The first worker error: its side, retry class and message (the error itself stays
    /// with the worker's task, returned by [`Pool::stop`]).
    failed: Mutex<Option<(ErrorKind, Retry, String)>>,
    stopping: std::sync::atomic::AtomicBool,
    last: Mutex<Option<AppliedPosition>>,
    counters: Arc<ApplyCounters>,
    /// When unmatched updates or deletes were last warned about.
    warned: Mutex<Option<std::time::Instant>>,
    /// When a unit blocked by another session's lock was last warned about.
    blocked: Mutex<Option<std::time::Instant>>,
}

impl Shared {
    fn bump(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule<Arc<Work>>> {
        self.sched.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self) -> Option<(ErrorKind, Retry, String)> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// True when the workers must stop (an error or the end of the run).
    fn halted(&self) -> bool {
        self.stopping.load(Ordering::Relaxed) || self.failed().is_some()
    }

    fn add(&self, ready: Vec<Ready>) {
        if ready.is_empty() {
            return;
        }
        {
            let mut s = self.lock();
            for r in ready {
                self.bytes.fetch_add(r.work.bytes, Ordering::Relaxed);
                s.add(r.work.clone(), &r.work.rows, r.exclusive);
            }
        }
        self.bump();
    }

    fn fail(&self, e: &Error) {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some((e.kind(), e.retry(), e.message().to_string()));
        }
        drop(f);
        self.bump();
    }
}

/// The workers of one streaming attempt.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: usize,
    tasks: Vec<JoinHandle<Result<()>>>,
}

enum Outcome {
    /// Committed at this position, with this many row changes besides `Work::changes` (those
    /// of a streamed transaction that arrived after its unit was handed over).
    Committed(AppliedPosition, u64),
    Conflict(Error),
    Aborted,
}

impl Pool {
    /// Open `workers` sessions on `target` for replication `name`, continuing after unit
    /// `applied`.
    pub async fn start(
        target: &Arc<dyn ApplyTarget>,
        name: &str,
        workers: usize,
        applied: u64,
        counters: Arc<ApplyCounters>,
    ) -> Result<Pool> {
        let (generation, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            sched: Mutex::new(Schedule::new(workers, applied)),
            generation,
            bytes: AtomicUsize::new(0),
            failed: Mutex::new(None),
            stopping: std::sync::atomic::AtomicBool::new(false),
            last: Mutex::new(None),
            counters,
            warned: Mutex::new(None),
            blocked: Mutex::new(None),
        });
        let mut sessions = Vec::with_capacity(workers);
        for w in 0..workers {
            sessions.push(target.session(name, w as u32).await?);
        }
        let tasks = sessions
            .into_iter()
            .map(|s| {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let r = work(&shared, s).await;
                    if let Err(e) = &r {
                        shared.fail(e);
                    }
                    r
                })
            })
            .collect();
        Ok(Pool {
            shared,
            workers,
            tasks,
        })
    }

    /// Hand closed units to the schedule, in source order.
    pub fn add(&self, ready: Vec<Ready>) {
        self.shared.add(ready);
    }

    /// [`Pool::add`] for the collector, which hands a streamed transaction's unit over from
    /// inside the source read.
    pub fn handoff(&self) -> super::collect::Handoff {
        let shared = self.shared.clone();
        Arc::new(move |ready| shared.add(ready))
    }

    /// Whether every worker has a unit when `more` units are about to be added, for the
    /// collector's grouping.
    pub fn busy_fn(&self) -> super::collect::Busy {
        let shared = self.shared.clone();
        let workers = self.workers;
        Arc::new(move |more: usize| shared.lock().unfinished() + more >= workers)
    }

    /// Bytes held by units not yet committed.
    pub fn bytes(&self) -> usize {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    /// Units added and not yet committed.
    pub fn unfinished(&self) -> usize {
        self.shared.lock().unfinished()
    }

    /// The position of the last committed unit.
    pub fn last(&self) -> Option<AppliedPosition> {
        self.shared
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The first worker error, as an error of the run: of its side and retry class, so a
    /// permanent failure (a value the target rejects, a missing privilege) is not retried.
    pub fn check(&self) -> Result<()> {
        match self.shared.failed() {
            Some((kind, retry, m)) => Err(Error::new(kind, retry, m)),
            None => Ok(()),
        }
    }

    /// Wait until `done` holds for the pool (checked after every change) or a worker fails.
    pub async fn wait_until(&self, mut done: impl FnMut(&Pool) -> bool) -> Result<()> {
        let mut rx = self.shared.generation.subscribe();
        loop {
            rx.borrow_and_update();
            self.check()?;
            if done(self) {
                return Ok(());
            }
            if rx.changed().await.is_err() {
                return Ok(());
            }
        }
    }

    /// Stop the workers (units not committed are rolled back by the target when the sessions
    /// close) and return the first worker error.
    pub async fn stop(self) -> Result<()> {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.shared.bump();
        let mut first = None;
        for t in self.tasks {
            match t.await {
                Ok(Err(e)) if first.is_none() => first = Some(e),
                Err(e) if first.is_none() => {
                    first = Some(Error::internal(format!("an apply worker failed: {e}")))
                }
                _ => {}
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

async fn work(shared: &Shared, mut session: Box<dyn ApplySession>) -> Result<()> {
    let mut rx = shared.generation.subscribe();
    loop {
        let take: Take<Arc<Work>> = loop {
            rx.borrow_and_update();
            if shared.halted() {
                return Ok(());
            }
            if let Some(t) = shared.lock().take() {
                break t;
            }
            if rx.changed().await.is_err() {
                return Ok(());
            }
        };
        let id = take.id;
        let streamed = take.work.more.is_some();
        let mut partial = false;
        let outcome = match run_unit(shared, session.as_mut(), &take, &mut rx, &mut partial).await {
            // Part of the unit is committed (before a barrier's DDL): it cannot be rolled
            // back and run again here; the replication restarts from the applied position,
            // which stands where that commit left it.
            Ok(Outcome::Aborted) if partial => {
                let _ = session.rollback().await;
                return Err(Error::destination(
                    Retry::Transient,
                    "a unit committed in part before a DDL statement had to give way to an \
                     earlier one; the replication continues from the applied position",
                ));
            }
            Ok(o) => o,
            Err(e) => {
                let _ = session.rollback().await;
                if shared.halted() {
                    return Ok(());
                }
                let retry_in_place = e.is_apply_conflict() && !streamed && !partial;
                if retry_in_place && e.is_apply_blocked() && take.attempts >= ALONE {
                    // Running alone, the lock's holder is not one of our units: wait for it
                    // (however long), saying who it is, rather than end the replication.
                    blocked_warning(shared, id, &e);
                    Outcome::Conflict(e)
                } else if retry_in_place && take.attempts + 1 < MAX_ATTEMPTS {
                    Outcome::Conflict(e)
                } else {
                    return Err(e);
                }
            }
        };
        match outcome {
            Outcome::Committed(pos, streamed) => {
                let c = &shared.counters;
                c.units.fetch_add(1, Ordering::Relaxed);
                c.transactions
                    .fetch_add(take.work.transactions, Ordering::Relaxed);
                // Per table first: a reader that sees the total sees its tables' counts.
                c.count_tables(&take.work);
                c.changes
                    .fetch_add(take.work.changes + streamed, Ordering::Relaxed);
                if let Some(ts) = pos.commit_ts.or(take.work.commit_ts) {
                    c.last_commit_ts.store(ts.max(0) as u64, Ordering::Relaxed);
                    let now = chrono::Utc::now().timestamp_micros();
                    c.apply_latency.observe((now - ts) as f64 / 1e6);
                }
                shared.bytes.fetch_sub(take.work.bytes, Ordering::Relaxed);
                *shared.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(pos);
                shared.lock().done(id);
            }
            Outcome::Conflict(e) => {
                tracing::debug!("unit {id} conflicted on the target ({e}); it runs again in order");
                shared.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                shared.lock().conflict(id);
            }
            Outcome::Aborted => {
                shared.counters.aborts.fetch_add(1, Ordering::Relaxed);
                let _ = session.rollback().await;
                shared.lock().aborted(id);
            }
        }
        shared.bump();
    }
}

/// Warn (at most every [`BLOCKED_WARN_EVERY`]) that unit `id` waits for a lock another
/// session holds; `e` names it.
fn blocked_warning(shared: &Shared, id: u64, e: &Error) {
    let mut last = shared.blocked.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_none_or(|t| t.elapsed() >= BLOCKED_WARN_EVERY) {
        *last = Some(std::time::Instant::now());
        tracing::warn!(
            "the replication waits: unit {id} needs a lock another session holds on the \
             target, and is tried again until it gets it. {}",
            e.message()
        );
    }
}

/// What a unit waits for while it holds its open transaction.
#[derive(Clone, Copy)]
enum Until {
    /// Everything its late rows depend on has committed.
    Unblocked(u64),
    /// Every earlier unit has committed: its turn to commit.
    Turn,
}

/// Wait until `until` holds. `Ok(false)`: the unit must roll back (an earlier one runs alone).
async fn wait(
    shared: &Shared,
    id: u64,
    until: Until,
    rx: &mut watch::Receiver<u64>,
) -> Result<bool> {
    loop {
        rx.borrow_and_update();
        if shared.halted() {
            return Err(Error::interrupted("the apply run is stopping"));
        }
        {
            let s = shared.lock();
            let ready = match until {
                Until::Unblocked(w) => s.unblocked(w),
                Until::Turn => s.turn(id),
            };
            if ready {
                return Ok(true);
            }
            if s.must_abort(id) {
                return Ok(false);
            }
        }
        if rx.changed().await.is_err() {
            return Err(Error::interrupted("the apply run is stopping"));
        }
    }
}

async fn run_unit(
    shared: &Shared,
    session: &mut dyn ApplySession,
    take: &Take<Arc<Work>>,
    rx: &mut watch::Receiver<u64>,
    partial: &mut bool,
) -> Result<Outcome> {
    let id = take.id;
    let reorder = take.attempts == 0;
    session.begin().await?;
    let work = &take.work;
    let late = late_rows(&work.rows, &take.deps, take.committed);
    if late.iter().any(|l| *l) {
        // Rows free of earlier units first, then, once those units committed, the others.
        shared.counters.split.fetch_add(1, Ordering::Relaxed);
        apply_pieces(
            session,
            &work.pieces,
            &work.rows,
            |i| !late[i],
            reorder,
            (id, partial),
        )
        .await?;
        session.send().await?;
        if !wait(shared, id, Until::Unblocked(take.wait_for), rx).await? {
            return Ok(Outcome::Aborted);
        }
        apply_pieces(
            session,
            &work.pieces,
            &work.rows,
            |i| late[i],
            reorder,
            (id, partial),
        )
        .await?;
    } else {
        apply_pieces(
            session,
            &work.pieces,
            &work.rows,
            |_| true,
            reorder,
            (id, partial),
        )
        .await?;
    }
    let mut position = take.work.position.clone();
    let mut streamed = 0;
    if let Some(more) = &take.work.more {
        let rx_more = more.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(mut more) = rx_more else {
            return Err(Error::internal("a streamed transaction was taken twice"));
        };
        while position.is_none() {
            match more.recv().await {
                Some(More::Piece(p, keys)) => {
                    apply_pieces(
                        session,
                        std::slice::from_ref(&p),
                        &keys,
                        |_| true,
                        reorder,
                        (id, partial),
                    )
                    .await?
                }
                Some(More::End(p, n)) => {
                    position = Some(p);
                    streamed = n;
                }
                None => {
                    return Err(Error::interrupted(
                        "the stream stopped inside a large transaction; it is applied again \
                         from its start when the replication runs again",
                    ));
                }
            }
        }
    }
    let mut position =
        position.ok_or_else(|| Error::internal("a unit without its end position"))?;
    position.unit = id;
    session.record(&position).await?;
    if !shared.lock().turn(id) {
        session.send().await?;
    }
    failpoint::hit_as(
        "replicate.before_commit",
        sluice_core::ErrorKind::Destination,
    )?;
    if !wait(shared, id, Until::Turn, rx).await? {
        return Ok(Outcome::Aborted);
    }
    session.commit().await?;
    let unmatched = session.unmatched();
    if unmatched > 0 {
        let total = shared
            .counters
            .unmatched
            .fetch_add(unmatched, Ordering::Relaxed)
            + unmatched;
        let mut last = shared.warned.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= UNMATCHED_WARN_EVERY) {
            *last = Some(std::time::Instant::now());
            tracing::warn!(
                "{total} update(s) or delete(s) so far matched no row on the target: it does \
                 not hold rows the source changed (changed or removed there, or never \
                 loaded), so it differs from the source; the report counts them"
            );
        }
    }
    failpoint::hit_as(
        "replicate.after_commit",
        sluice_core::ErrorKind::Destination,
    )?;
    Ok(Outcome::Committed(position, streamed))
}

/// Apply `pieces` in order: barriers as they are, the rows (`keys` holds theirs, over the
/// pieces' rows in order) that `pick` selects by their index, ordered and batched by
/// [`plan`].
///
/// `unit` is the unit's id, for the position a barrier records before its DDL; `partial`
/// becomes true once a barrier committed the changes before it (see
/// `ApplySession::barrier`): the unit may then no longer be rolled back and applied again.
async fn apply_pieces(
    session: &mut dyn ApplySession,
    pieces: &[Piece],
    keys: &RowKeys,
    pick: impl Fn(usize) -> bool,
    reorder: bool,
    (unit_id, partial): (u64, &mut bool),
) -> Result<()> {
    let mut at = 0usize;
    for piece in pieces {
        match piece {
            Piece::Rows(unit) => {
                let first = at;
                at += unit.order.len();
                let part = plan(unit, keys, first, |i| pick(first + i), reorder);
                if !part.order.is_empty() {
                    session.apply(&part).await?;
                }
            }
            Piece::Barrier(b, before) => {
                let mut before = before.clone();
                before.unit = unit_id;
                if session.barrier(b, &before).await? {
                    *partial = true;
                }
                if let Barrier::Columns(c) = b {
                    session
                        .columns(&c.table, &SourceColumn::of(&c.columns))
                        .await?;
                }
            }
        }
    }
    Ok(())
}
