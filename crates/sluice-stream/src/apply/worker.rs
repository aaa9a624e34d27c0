//! The apply workers: N target sessions taking units from the schedule, each committing only
//! when every earlier unit has committed, with the unit's position recorded in the same
//! target transaction.
//!
//! Every state change (a unit added, committed, rolled back) bumps one generation counter;
//! workers and the pump wait on it and look at the schedule again, so nobody polls.

use super::collect::{More, Piece, Ready, Work};
use super::plan::plan;
use super::schedule::{Schedule, Take, late_rows};
use super::writeset::RowKeys;
use sluice_core::apply::{AppliedPosition, ApplySession, ApplyTarget};
use sluice_core::{Error, Result, failpoint};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Conflicts of one unit before its error is the run's error (it ran alone the last times).
const MAX_ATTEMPTS: u32 = 6;

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
    /// Units that applied their rows free of earlier units first and the others after those
    /// units committed (instead of waiting whole).
    pub split: AtomicU64,
    /// Commit time on the source of the last applied transaction, µs.
    pub last_commit_ts: AtomicU64,
    /// The largest delay seen between a source commit and its application, ms.
    pub peak_lag_millis: AtomicU64,
    /// The most log the source kept for the replication, bytes.
    pub peak_retained_bytes: AtomicU64,
}

struct Shared {
    sched: Mutex<Schedule<Arc<Work>>>,
    generation: watch::Sender<u64>,
    bytes: AtomicUsize,
    failed: Mutex<Option<String>>,
    stopping: std::sync::atomic::AtomicBool,
    last: Mutex<Option<AppliedPosition>>,
    counters: Arc<ApplyCounters>,
}

impl Shared {
    fn bump(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule<Arc<Work>>> {
        self.sched.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// True when the workers must stop (an error or the end of the run).
    fn halted(&self) -> bool {
        self.stopping.load(Ordering::Relaxed) || self.failed().is_some()
    }

    fn fail(&self, e: &Error) {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e.message().to_string());
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
    Committed(AppliedPosition),
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
        if ready.is_empty() {
            return;
        }
        {
            let mut s = self.shared.lock();
            for r in ready {
                self.shared.bytes.fetch_add(r.work.bytes, Ordering::Relaxed);
                s.add(r.work.clone(), &r.work.rows, r.exclusive);
            }
        }
        self.shared.bump();
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

    /// The first worker error, as an error of the run.
    pub fn check(&self) -> Result<()> {
        match self.shared.failed() {
            Some(m) => Err(Error::destination(sluice_core::Retry::Transient, m)),
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
        let outcome = match run_unit(shared, session.as_mut(), &take, &mut rx).await {
            Ok(o) => o,
            Err(e) => {
                let _ = session.rollback().await;
                if shared.halted() {
                    return Ok(());
                }
                if e.is_apply_conflict() && !streamed && take.attempts + 1 < MAX_ATTEMPTS {
                    Outcome::Conflict(e)
                } else {
                    return Err(e);
                }
            }
        };
        match outcome {
            Outcome::Committed(pos) => {
                let c = &shared.counters;
                c.units.fetch_add(1, Ordering::Relaxed);
                c.transactions
                    .fetch_add(take.work.transactions, Ordering::Relaxed);
                c.changes.fetch_add(take.work.changes, Ordering::Relaxed);
                if let Some(ts) = pos.commit_ts.or(take.work.commit_ts) {
                    c.last_commit_ts.store(ts.max(0) as u64, Ordering::Relaxed);
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
) -> Result<Outcome> {
    let id = take.id;
    let reorder = take.attempts == 0;
    session.begin().await?;
    let work = &take.work;
    let late = late_rows(&work.rows, &take.deps, take.committed);
    if late.iter().any(|l| *l) {
        // Rows free of earlier units first, then, once those units committed, the others.
        shared.counters.split.fetch_add(1, Ordering::Relaxed);
        apply_pieces(session, &work.pieces, &work.rows, |i| !late[i], reorder).await?;
        session.send().await?;
        if !wait(shared, id, Until::Unblocked(take.wait_for), rx).await? {
            return Ok(Outcome::Aborted);
        }
        apply_pieces(session, &work.pieces, &work.rows, |i| late[i], reorder).await?;
    } else {
        apply_pieces(session, &work.pieces, &work.rows, |_| true, reorder).await?;
    }
    let mut position = take.work.position.clone();
    if let Some(more) = &take.work.more {
        let rx_more = more.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(mut more) = rx_more else {
            return Err(Error::internal("a streamed transaction was taken twice"));
        };
        while position.is_none() {
            match more.recv().await {
                Some(More::Piece(p, keys)) => {
                    apply_pieces(session, std::slice::from_ref(&p), &keys, |_| true, reorder)
                        .await?
                }
                Some(More::End(p)) => position = Some(p),
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
    failpoint::hit_as(
        "replicate.after_commit",
        sluice_core::ErrorKind::Destination,
    )?;
    Ok(Outcome::Committed(position))
}

/// Apply `pieces` in order: barriers as they are, the rows (`keys` holds theirs, over the
/// pieces' rows in order) that `pick` selects by their index, ordered and batched by
/// [`plan`].
async fn apply_pieces(
    session: &mut dyn ApplySession,
    pieces: &[Piece],
    keys: &RowKeys,
    pick: impl Fn(usize) -> bool,
    reorder: bool,
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
            Piece::Barrier(b) => session.barrier(b).await?,
        }
    }
    Ok(())
}
