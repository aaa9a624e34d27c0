//! The streaming half of a replication: the collector and the worker pool as the read loop's
//! output (`drive.rs`, which opens the source at the applied position, confirms, and
//! restarts after transient errors): units collected, handed to the workers, the source read
//! no further while too much waits.

use super::ReplicateJob;
use super::collect::{Captured, Collector, Limits};
use super::worker::Pool;
use crate::added::AddedTable;
use crate::drive::{self, Run, TableWatch};
use crate::job::Stopped;
use crate::state::StreamState;
use async_trait::async_trait;
use sluice_core::apply::{ForeignKey, TableKeys};
use sluice_core::change::CaptureNames;
use sluice_core::change::{CaptureHarm, ChangeSink, ChangeSource, Step};
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Error, Result, StreamPos};
use sluice_engine::governor::Brake;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a read waits for the source when no unit is due sooner.
const READ_WAIT: Duration = Duration::from_millis(200);

/// How often the source is told what the target committed.
const CONFIRM_EVERY: Duration = Duration::from_secs(1);

/// How long a unit's first transaction waits for others while a worker is free (the most a
/// caught-up stream's transaction is held back).
const LINGER: Duration = Duration::from_millis(20);

/// How often a replication whose source sends nothing for its tables records how far the
/// source has sent (a unit that only moves the applied position, so the source may release
/// its log): not at every keepalive, which an idle target would pay for with a commit each —
/// a server busy in other databases sends many a second.
const POSITION_EVERY: Duration = Duration::from_secs(5);

/// Units waiting or running per worker before the source is read further (with the memory
/// budget, what bounds the schedule's work per dispatch).
const MAX_UNFINISHED_PER_WORKER: usize = 64;

/// Stream and apply until stopped, restarting from the applied position after transient
/// errors, taking in the tables created on the source that the selection matches. Returns
/// why it stopped, the applied position and the tables taken in.
pub(super) async fn stream(
    job: &ReplicateJob,
    state: &StreamState,
    datasets: &[Dataset],
    (keys, unlogged): (Vec<TableKeys>, Vec<(TableRef, ForeignKey)>),
    brake: Option<&Brake>,
    cancel: &watch::Receiver<bool>,
) -> Result<(Stopped, StreamPos, Vec<AddedTable>)> {
    let names = state.names.clone();
    let (mut state, mut datasets, mut keys, mut unlogged) =
        (state.clone(), datasets.to_vec(), keys, unlogged);
    let mut added = Vec::new();
    let (stopped, restart) = loop {
        // The foreign keys the target holds: those the replication created for cascades.
        let target_fks = unlogged
            .iter()
            .map(|(t, f)| (t.clone(), f.name.clone()))
            .collect();
        let mut attempts = TargetAttempts {
            job,
            state: &state,
            datasets: &datasets,
            keys: keys.clone(),
            target_fks,
            // The state as the layout checks update it (`layout.rs`), across attempts.
            watched: state.clone(),
            units_before: 0,
            restart: StreamPos::default(),
            brake,
        };
        let run = Run {
            capture: &job.capture,
            names: &names,
            datasets: &datasets,
            tables: Some(TableWatch::new(TABLES_EVERY, true)),
        };
        let stopped = drive::run(&run, &mut attempts, cancel).await?;
        let seen = run.take_seen();
        if let Some(t) = seen.as_ref().and_then(|s| s.unpublished().first()) {
            return Err(unpublished(job, &names, t));
        }
        let created: Vec<TableRef> = seen.map(|s| s.created().to_vec()).unwrap_or_default();
        if stopped != Stopped::Tables || created.is_empty() {
            break (stopped, attempts.restart);
        }
        // Every change before the noted position is applied: take the tables in and read on.
        let mut next = attempts.watched;
        let mut failures = 0;
        let taken = loop {
            match super::added::take_in(job, &mut next, &created, cancel).await {
                Ok(t) => break t,
                // A lock wait given up, a connection lost: taken in again (what was recorded
                // is loaded again into emptied tables).
                Err(e) if e.is_transient() && failures < drive::MAX_RETRIES => {
                    failures += 1;
                    drive::backoff(&e, failures, "taking the tables in").await;
                }
                Err(e) => return Err(e),
            }
        };
        added.extend(taken.added);
        (state, datasets, keys, unlogged) = (next, taken.datasets, taken.keys, taken.unlogged);
    };
    let position = job
        .target
        .applied(&names.name)
        .await?
        .map(|a| a.restart)
        .unwrap_or(restart);
    Ok((stopped, position, added))
}

/// The error that stops a replication when a table it carries still exists on the source
/// but left its publication (dropped and created again under its name, or taken out): its
/// changes no longer arrive, and going on would let its copy fall behind without a word.
fn unpublished(job: &ReplicateJob, names: &CaptureNames, t: &TableRef) -> Error {
    Error::source_permanent(format!(
        "{t} is replicated by {} but is no longer in its publication {} on {}, though the \
         table exists: it was dropped and created again, or taken out of the publication, so \
         its changes no longer arrive. The replication stopped here, every change before it \
         applied. To go on, leave {t} out of this replication (--slot {} and a --table for each \
         other table) and replicate it with a replication of its own into an emptied table.",
        names.name,
        names.publication,
        job.capture.source.display_url(),
        names.name
    ))
}

/// How often a running replication lists the selection's tables (and once at its start).
const TABLES_EVERY: Duration = Duration::from_secs(30);

/// The attempts of a replication: each opens at the position the target recorded last, with
/// a new collector and a new pool of target sessions.
struct TargetAttempts<'a> {
    job: &'a ReplicateJob,
    state: &'a StreamState,
    datasets: &'a [Dataset],
    keys: Vec<TableKeys>,
    target_fks: Vec<(TableRef, String)>,
    watched: StreamState,
    /// Units applied when the attempt began (more at its end: it made progress).
    units_before: u64,
    /// Where the last attempt opened the stream.
    restart: StreamPos,
    /// `--max-target-lag`'s brake.
    brake: Option<&'a Brake>,
}

#[async_trait]
impl<'a> drive::Attempts for TargetAttempts<'a> {
    type Out = Target<'a>;
    const COMMAND: &'static str = "sluice replicate";
    const RESTARTING: &'static str = "the replication from its applied position";

    async fn begin(&mut self) -> Result<(StreamPos, Target<'a>)> {
        let job = self.job;
        let slot = &self.state.names.name;
        let applied = job.target.applied(slot).await?;
        let (restart, unit) = match &applied {
            Some(a) => (a.restart.clone(), a.unit),
            None => (self.state.committed.restart.clone(), 0),
        };
        let pool = Pool::start(&job.target, slot, job.parallel, unit, job.counters.clone()).await?;
        // The columns each target table follows, where it recorded them.
        let followed: std::collections::HashMap<_, _> = job
            .target
            .followed_columns(slot)
            .await?
            .into_iter()
            .collect();
        let captured = self
            .state
            .tables
            .values()
            .map(|t| Captured {
                table: t.table.clone(),
                target: job.on_target(&t.table),
                columns: self
                    .datasets
                    .iter()
                    .find(|d| d.object.as_ref() == Some(&t.table))
                    .map(|d| d.columns.clone())
                    .unwrap_or_default(),
                known: followed.get(&job.on_target(&t.table)).cloned(),
                snapshot_position: t.snapshot_position.clone(),
            })
            .collect();
        let limits = unit_limits(job.memory, job.parallel, job.max_grouped);
        let engine = job.capture.source.engine();
        let mut collector = Collector::new(captured, self.keys.clone(), limits, engine);
        collector.set_target_foreign_keys(self.target_fks.clone());
        collector.set_busy(pool.busy_fn());
        collector.set_handoff(pool.handoff());
        collector.restart = Some(restart.clone());
        if let Some(a) = &applied {
            collector.resume_at(a);
        }
        self.units_before = job.counters.units.load(Ordering::Relaxed);
        self.restart = restart.clone();
        let out = Target {
            job,
            collector,
            pool,
            watched: std::mem::replace(&mut self.watched, self.state.clone()),
            received_before: job.counters.transactions.load(Ordering::Relaxed),
            ignored_before: job.counters.ignored.load(Ordering::Relaxed),
            confirmed: None,
            last_confirm: Instant::now(),
            last_advance: Instant::now(),
            brake: self.brake,
        };
        Ok((restart, out))
    }

    async fn end(&mut self, out: Target<'a>, result: Result<Stopped>) -> (Result<Stopped>, bool) {
        self.watched = out.watched;
        let stopped_pool = out.pool.stop().await;
        // A worker's own error (with its cause) rather than the loop's copy of it.
        let result = match (result, stopped_pool) {
            (r, Ok(())) => r,
            (_, Err(e)) => Err(e),
        };
        let progressed = self.job.counters.units.load(Ordering::Relaxed) > self.units_before;
        (result, progressed)
    }
}

/// A target database: the collector's units handed to the worker pool, the source confirmed
/// once a second up to the last committed unit.
struct Target<'a> {
    job: &'a ReplicateJob,
    collector: Collector,
    pool: Pool,
    watched: StreamState,
    received_before: u64,
    ignored_before: u64,
    confirmed: Option<StreamPos>,
    last_confirm: Instant,
    last_advance: Instant,
    brake: Option<&'a Brake>,
}

impl Target<'_> {
    /// Move the applied position to where the source has sent (a position-only unit).
    fn advance(&mut self, received: Option<StreamPos>) {
        if !self.collector.in_tx()
            && let Some(r) = received
        {
            self.collector.advance_to(&r);
        }
    }

    /// Everything collected applied and committed.
    async fn drain(&mut self, received: Option<StreamPos>) -> Result<()> {
        self.collector.cut()?;
        self.advance(received);
        self.pool.add(std::mem::take(&mut self.collector.ready));
        self.pool.wait_until(|p| p.unfinished() == 0).await
    }
}

#[async_trait]
impl drive::Output for Target<'_> {
    fn sink(&mut self) -> &mut dyn ChangeSink {
        &mut self.collector
    }

    fn wait(&self) -> Duration {
        // An open unit is due after its linger time: wait for the source no longer than that.
        self.collector
            .due_in()
            .map_or(READ_WAIT, |d| d.max(Duration::from_millis(1)))
    }

    fn check(&self) -> Result<()> {
        self.pool.check()
    }

    fn held(&self) -> bool {
        // Between source transactions only: an open one is read to its end first.
        !self.collector.in_tx() && self.brake.is_some_and(|b| b.held().is_some())
    }

    async fn after_read(&mut self, step: Step, received: Option<StreamPos>) -> Result<()> {
        let job = self.job;
        self.collector.cut_due(step == Step::Idle)?;
        if self.last_advance.elapsed() >= POSITION_EVERY {
            self.last_advance = Instant::now();
            self.advance(received);
        }
        self.pool.add(std::mem::take(&mut self.collector.ready));
        let c = &job.counters;
        c.received.store(
            self.received_before + self.collector.received,
            Ordering::Relaxed,
        );
        c.ignored.store(
            self.ignored_before + self.collector.ignored,
            Ordering::Relaxed,
        );
        let budget = (job.memory / 4).max(4 << 20) as usize;
        let most = MAX_UNFINISHED_PER_WORKER * job.parallel.max(1);
        if self.pool.bytes() > budget || self.pool.unfinished() > most {
            self.pool
                .wait_until(|p| p.bytes() <= budget && p.unfinished() <= most)
                .await?;
        }
        Ok(())
    }

    async fn finish(&mut self, received: Option<StreamPos>, signal: bool) -> Result<()> {
        if signal && self.collector.in_tx() {
            // Read again at the next start.
            self.collector.abandon();
        }
        self.drain(received).await
    }

    fn confirmable(&mut self, now: bool) -> Result<Option<StreamPos>> {
        if !now && self.last_confirm.elapsed() < CONFIRM_EVERY {
            return Ok(None);
        }
        self.last_confirm = Instant::now();
        Ok(self
            .pool
            .last()
            .map(|a| a.restart)
            .filter(|r| self.confirmed.as_ref() != Some(r)))
    }

    fn confirmed(&mut self, pos: &StreamPos, _source: &dyn ChangeSource) {
        self.confirmed = Some(pos.clone());
    }

    fn observe(&mut self, step: Step) {
        let c = &self.job.counters;
        let ts = c.last_commit_ts.load(Ordering::Relaxed);
        if ts > 0 && step == Step::Data {
            let lag = (chrono::Utc::now().timestamp_micros() as u64).saturating_sub(ts) / 1000;
            c.peak_lag_millis.fetch_max(lag, Ordering::Relaxed);
        }
    }

    fn harm(&mut self, h: CaptureHarm) {
        self.job
            .counters
            .peak_retained_bytes
            .fetch_max(h.retained_bytes, Ordering::Relaxed);
        self.job
            .counters
            .retained_bytes
            .store(h.retained_bytes, Ordering::Relaxed);
    }

    fn layout_state(&mut self) -> &mut StreamState {
        &mut self.watched
    }

    async fn layout_changed(&mut self) -> Result<()> {
        super::save_state(self.job, &self.watched).await
    }
}

/// A unit's caps: units waiting or running hold at most a quarter of `--memory` (the pump's
/// budget), so each may take its share with room for one being collected per worker; a large
/// transaction is streamed past an eighth of it (1–64 MB).
fn unit_limits(memory: u64, parallel: usize, max_grouped: u64) -> Limits {
    let budget = (memory / 4).max(4 << 20) as usize;
    Limits {
        transactions: max_grouped.max(1),
        bytes: (budget / (2 * parallel.max(1) + 2)).clamp(256 << 10, 8 << 20),
        stream_bytes: ((memory / 8) as usize).clamp(1 << 20, 64 << 20),
        linger: LINGER,
    }
}
