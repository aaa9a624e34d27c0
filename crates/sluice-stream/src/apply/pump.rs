//! The streaming half of a replication: read the source from the applied position, collect
//! units, hand them to the workers, confirm the source, and restart after transient errors.

use super::ReplicateJob;
use super::collect::{Captured, Collector, Limits};
use super::worker::Pool;
use crate::pump::{MAX_RETRIES, backoff};
use crate::run::Stopped;
use crate::state::StreamState;
use sluice_core::change::{ChangeStream, Step};
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Error, Result};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What a transient error restarts, for the log.
const RESTARTING: &str = "the replication from its applied position";

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
/// errors. Returns why it stopped and the applied position.
pub(super) async fn stream(
    job: &ReplicateJob,
    state: &StreamState,
    datasets: &[Dataset],
    (keys, target_fks): (Vec<sluice_core::apply::TableKeys>, Vec<(TableRef, String)>),
    cancel: &watch::Receiver<bool>,
) -> Result<(Stopped, String)> {
    let names = &state.names;
    // The state as the layout checks update it (`layout.rs`).
    let mut watched = state.clone();
    let mut target: Option<Option<String>> = None;
    let mut failures = 0u32;
    loop {
        let applied = job.target.applied(&names.slot).await?;
        let (restart, unit) = match &applied {
            Some(a) => (a.restart.clone(), a.unit),
            None => (state.committed.restart.clone(), 0),
        };
        let attempt = async {
            let stream = job.source.open(names, datasets, &restart).await?;
            if target.is_none() {
                target = Some(match job.until_current {
                    true => Some(job.source.current_position().await?),
                    false => None,
                });
            }
            let pool = Pool::start(
                &job.target,
                &names.slot,
                job.parallel,
                unit,
                job.counters.clone(),
            )
            .await?;
            Ok::<_, Error>((stream, pool))
        };
        let (mut s, pool) = match attempt.await {
            Ok(x) => x,
            Err(e) => {
                failures += 1;
                if !e.is_transient() || failures > MAX_RETRIES || *cancel.borrow() {
                    return Err(e);
                }
                backoff(&e, failures, RESTARTING).await;
                continue;
            }
        };
        // The columns each target table follows, where it recorded them.
        let followed: std::collections::HashMap<_, _> = job
            .target
            .followed_columns(&names.slot)
            .await?
            .into_iter()
            .collect();
        let captured = state
            .tables
            .values()
            .map(|t| Captured {
                table: t.table.clone(),
                target: job.on_target(&t.table),
                columns: datasets
                    .iter()
                    .find(|d| d.object.as_ref() == Some(&t.table))
                    .map(|d| d.columns.clone())
                    .unwrap_or_default(),
                known: followed.get(&job.on_target(&t.table)).cloned(),
                snapshot_position: t.snapshot_position.clone(),
            })
            .collect();
        let limits = unit_limits(job.memory, job.parallel, job.max_grouped);
        let mut collector = Collector::new(captured, keys.clone(), limits, job.source.engine());
        collector.set_target_foreign_keys(target_fks.clone());
        collector.set_busy(pool.busy_fn());
        collector.set_handoff(pool.handoff());
        collector.restart = Some(restart.clone());
        if let Some(a) = &applied {
            collector.resume_at(a);
        }
        let until = target.clone().flatten();
        let before = job.counters.units.load(Ordering::Relaxed);
        let r = pump(
            job,
            (&mut watched, datasets),
            s.as_mut(),
            &mut collector,
            &pool,
            cancel,
            until.as_deref(),
        )
        .await;
        let stopped_pool = pool.stop().await;
        let _ = s.close().await;
        // A worker's own error (with its cause) rather than the pump's copy of it.
        let r = match (r, stopped_pool) {
            (Ok(st), Ok(())) => Ok(st),
            (Err(e), Ok(())) => Err(e),
            (_, Err(e)) => Err(e),
        };
        match r {
            Ok(stopped) => {
                let position = job
                    .target
                    .applied(&names.slot)
                    .await?
                    .map(|a| a.restart)
                    .unwrap_or(restart);
                return Ok((stopped, position));
            }
            Err(e) => {
                if job.counters.units.load(Ordering::Relaxed) > before {
                    failures = 0;
                }
                failures += 1;
                if !e.is_transient() || failures > MAX_RETRIES || *cancel.borrow() {
                    return Err(e);
                }
                backoff(&e, failures, RESTARTING).await;
            }
        }
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

#[allow(clippy::too_many_arguments)]
async fn pump(
    job: &ReplicateJob,
    (watched, datasets): (&mut StreamState, &[Dataset]),
    stream: &mut dyn ChangeStream,
    collector: &mut Collector,
    pool: &Pool,
    cancel: &watch::Receiver<bool>,
    target: Option<&str>,
) -> Result<Stopped> {
    let budget = (job.memory / 4).max(4 << 20) as usize;
    let received_before = job.counters.transactions.load(Ordering::Relaxed);
    let ignored_before = job.counters.ignored.load(Ordering::Relaxed);
    let wait = Duration::from_millis(200);
    let mut confirmed: Option<String> = None;
    let mut last_confirm = Instant::now();
    let mut last_advance = Instant::now();
    // Before stopping: the position-only unit that moves the applied position to where the
    // source has sent, so a caught-up replication ends at the source's position.
    let advance = |collector: &mut Collector, stream: &dyn ChangeStream| {
        if !collector.in_tx()
            && let Some(r) = stream.received_through()
        {
            collector.advance_to(&r);
        }
    };
    let mut last_harm: Option<Instant> = None;
    let mut last_layout = Instant::now();
    let names = &watched.names.clone();
    loop {
        if last_layout.elapsed() >= crate::layout::CHECK_EVERY {
            last_layout = Instant::now();
            if crate::layout::check(
                job.source.as_ref(),
                datasets,
                watched,
                job.partition_changes,
                "sluice replicate",
            )
            .await?
            {
                super::save_state(job, watched).await?;
            }
        }
        if last_harm.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            last_harm = Some(Instant::now());
            if let Ok(Some(h)) = job.source.harm(names).await {
                job.counters
                    .peak_retained_bytes
                    .fetch_max(h.retained_bytes, Ordering::Relaxed);
            }
        }
        if *cancel.borrow() {
            if collector.in_tx() {
                collector.abandon();
            }
            collector.cut()?;
            advance(collector, stream);
            let ready = std::mem::take(&mut collector.ready);
            pool.add(ready);
            pool.wait_until(|p| p.unfinished() == 0).await?;
            confirm(stream, pool, &mut confirmed).await?;
            return Ok(Stopped::Signal);
        }
        pool.check()?;
        // An open unit is due after its linger time: wait for the source no longer than that.
        let wait_now = collector
            .due_in()
            .map_or(wait, |d| d.max(Duration::from_millis(1)));
        let step = stream.next(collector, wait_now).await?;
        collector.cut_due(step == Step::Idle)?;
        if last_advance.elapsed() >= POSITION_EVERY {
            last_advance = Instant::now();
            advance(collector, stream);
        }
        let ready = std::mem::take(&mut collector.ready);
        pool.add(ready);
        job.counters
            .received
            .store(received_before + collector.received, Ordering::Relaxed);
        job.counters
            .ignored
            .store(ignored_before + collector.ignored, Ordering::Relaxed);
        let most = MAX_UNFINISHED_PER_WORKER * job.parallel.max(1);
        if pool.bytes() > budget || pool.unfinished() > most {
            pool.wait_until(|p| p.bytes() <= budget && p.unfinished() <= most)
                .await?;
        }
        if last_confirm.elapsed() >= Duration::from_secs(1) {
            last_confirm = Instant::now();
            confirm(stream, pool, &mut confirmed).await?;
            let ts = job.counters.last_commit_ts.load(Ordering::Relaxed);
            if ts > 0 && step == Step::Data {
                let lag = (chrono::Utc::now().timestamp_micros() as u64).saturating_sub(ts) / 1000;
                job.counters
                    .peak_lag_millis
                    .fetch_max(lag, Ordering::Relaxed);
            }
        }
        if let (Some(t), Some(r)) = (target, stream.received_through())
            && !collector.in_tx()
            && r.as_str() >= t
        {
            collector.cut()?;
            advance(collector, stream);
            pool.add(std::mem::take(&mut collector.ready));
            pool.wait_until(|p| p.unfinished() == 0).await?;
            confirm(stream, pool, &mut confirmed).await?;
            return Ok(Stopped::UntilCurrent);
        }
    }
}

/// Tell the source that everything up to the last committed unit is applied.
async fn confirm(
    stream: &mut dyn ChangeStream,
    pool: &Pool,
    confirmed: &mut Option<String>,
) -> Result<()> {
    if let Some(last) = pool.last()
        && confirmed.as_ref() != Some(&last.restart)
    {
        stream.confirm(&last.restart).await?;
        *confirmed = Some(last.restart);
    }
    Ok(())
}
