//! The read loop and the restart loop every capture runs, whatever its output: change files
//! (`sluice stream`, `pump.rs`), a target database (`sluice replicate`, `apply/pump.rs`), and
//! any later output.
//!
//! An [`Output`] is what differs: the sink the source decodes into, when a batch or unit is
//! due, what "advance to the source's position" and "finish" mean, which position is durable
//! and may be confirmed, its state for the layout checks, and its figures. [`Attempts`] is how
//! one attempt starts (the restart position, the output built for it) and ends (workers
//! stopped, progress judged). The loops here own the rest, once: opening the stream at the
//! restart position, `--until-current`'s target (taken once, at the first open), the harm
//! probe every 5 s, the layout check every minute (`layout.rs`), the selection's tables
//! watched for new and dropped ones (`added.rs`), stops on a signal or at the
//! target, confirming, and restarts after transient errors with backoff — reset by progress, at
//! most [`MAX_RETRIES`] in a row.

use crate::job::{Capture, Stopped};
use crate::state::StreamState;
use async_trait::async_trait;
use sluice_core::change::{
    CaptureHarm, CaptureNames, ChangeSink, ChangeSource, ChangeStream, Step,
};
use sluice_core::{Dataset, Error, Result, StreamPos};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Consecutive failed attempts without progress (a committed batch, an applied transaction)
/// before a transient error ends a run (waits of 1, 2, 4, … 32 s between them, see
/// [`backoff`]).
pub(crate) const MAX_RETRIES: u32 = 8;

/// How often the source's harm (log kept, lag) is probed.
const HARM_EVERY: Duration = Duration::from_secs(5);

/// How often a loop whose output holds new work back looks again.
const HELD_WAIT: Duration = Duration::from_millis(250);

/// Wait before restart attempt `failures` (1-based) after `e`, saying in the log what restarts
/// from where (`restarting`: "the stream from its committed position").
pub(crate) async fn backoff(e: &Error, failures: u32, restarting: &str) {
    let wait = Duration::from_secs(1 << (failures - 1).min(5));
    tracing::warn!(
        "{e} — restarting {restarting} in {} s (attempt {failures} of {MAX_RETRIES})",
        wait.as_secs()
    );
    tokio::time::sleep(wait).await;
}

/// Where a running capture's changes go (see the module documentation).
#[async_trait]
pub(crate) trait Output: Send {
    /// The sink the source's stream decodes into.
    fn sink(&mut self) -> &mut dyn ChangeSink;

    /// How long the next read may wait for the source.
    fn wait(&self) -> Duration;

    /// A failure of work running apart from the loop (apply workers).
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// True while new work is held back (`sluice replicate --max-target-lag`): the loop then
    /// reads nothing, keeps the source's connection alive, confirms what was applied, and
    /// looks again shortly.
    fn held(&self) -> bool {
        false
    }

    /// After a read (`step`): cut what is due, move the position on while the source is idle
    /// (`received`: where it has sent, outside a transaction), hand work on, hold back when
    /// full.
    async fn after_read(&mut self, step: Step, received: Option<StreamPos>) -> Result<()>;

    /// Make everything pending durable and move the position to `received` (the source's
    /// position outside a transaction), for a stop. `signal`: stopped on request, so an open
    /// source transaction is dropped (read again at the next start).
    async fn finish(&mut self, received: Option<StreamPos>, signal: bool) -> Result<()>;

    /// A durable position the source may now release the log before, when one is due
    /// (`now`: at a stop, whatever the output's cadence).
    fn confirmable(&mut self, now: bool) -> Result<Option<StreamPos>>;

    /// The source was told `pos` is durable.
    fn confirmed(&mut self, pos: &StreamPos, source: &dyn ChangeSource);

    /// After each read: lag and other figures.
    fn observe(&mut self, step: Step);

    /// What the capture costs the source now.
    fn harm(&mut self, harm: CaptureHarm);

    /// The state the layout check compares and notes into.
    fn layout_state(&mut self) -> &mut StreamState;

    /// The layout check changed the state (notes, a new layout).
    async fn layout_changed(&mut self) -> Result<()>;
}

/// How one attempt of a run starts and ends.
#[async_trait]
pub(crate) trait Attempts: Send {
    /// The output of an attempt.
    type Out: Output;

    /// The position to open the stream at and the output to feed.
    async fn begin(&mut self) -> Result<(StreamPos, Self::Out)>;

    /// The attempt ended with `result` (its output's workers stop here). Returns the result to
    /// judge (a worker's own error rather than the loop's copy of it) and whether the attempt
    /// made progress (resets the count of failed attempts).
    async fn end(&mut self, out: Self::Out, result: Result<Stopped>) -> (Result<Stopped>, bool);

    /// A failed attempt is about to be retried (for the run's figures).
    fn retrying(&mut self) {}

    /// `sluice stream` or `sluice replicate`, for messages.
    const COMMAND: &'static str;
    /// What a restart restarts, for the log ("the stream from its committed position").
    const RESTARTING: &'static str;
}

/// What a run reads and how it stops.
pub(crate) struct Run<'a> {
    /// The source, the selection and when to stop.
    pub capture: &'a Capture,
    pub names: &'a CaptureNames,
    pub datasets: &'a [Dataset],
    /// Watch the selection's tables (`sluice stream`): when tables are created or dropped,
    /// stop at the source's current position with [`Stopped::Tables`] (`added.rs`).
    pub tables: Option<TableWatch>,
}

impl Run<'_> {
    /// What the table watch saw when the run stopped with [`Stopped::Tables`] (taken: a second
    /// call gives `None`).
    pub(crate) fn take_seen(&self) -> Option<crate::added::Seen> {
        self.tables
            .as_ref()
            .and_then(|w| w.seen.lock().unwrap_or_else(|p| p.into_inner()).take())
    }
}

/// How a run watches the selection's tables.
pub(crate) struct TableWatch {
    /// How often (`--discover-every`).
    pub every: Duration,
    /// What was seen when the run noted the position it stopped at ([`Stopped::Tables`]).
    pub seen: std::sync::Mutex<Option<crate::added::Seen>>,
    /// Stop only for created tables and captured ones that left the publication (`sluice
    /// replicate`, which takes the first in, stops for the second and leaves a dropped
    /// table's rows on the target as they were).
    pub created_only: bool,
}

impl TableWatch {
    /// Look the selection up every `every`; `created_only` as [`TableWatch::created_only`].
    pub(crate) fn new(every: Duration, created_only: bool) -> Self {
        TableWatch {
            every,
            seen: std::sync::Mutex::default(),
            created_only,
        }
    }
}

/// Read the source into the outputs `attempts` builds until `--until-current`'s target or a
/// signal, restarting after transient errors.
pub(crate) async fn run<A: Attempts>(
    run: &Run<'_>,
    attempts: &mut A,
    cancel: &watch::Receiver<bool>,
) -> Result<Stopped> {
    let mut target: Option<Option<StreamPos>> = None;
    let mut failures = 0u32;
    loop {
        let attempt = async {
            let (from, out) = attempts.begin().await.map_err(|e| (e, None))?;
            let stream = run
                .capture
                .source
                .open(run.names, run.datasets, &from)
                .await;
            let stream = match stream {
                Ok(s) => s,
                Err(e) => return Err((e, Some(out))),
            };
            if let Err(e) = sluice_core::failpoint::hit("stream.opened") {
                return Err((e, Some(out)));
            }
            if target.is_none() {
                target = Some(match run.capture.until_current {
                    true => match run.capture.source.current_position().await {
                        Ok(p) => Some(p),
                        Err(e) => return Err((e, Some(out))),
                    },
                    false => None,
                });
            }
            Ok((stream, out))
        };
        let (result, progressed) = match attempt.await {
            Ok((mut stream, mut out)) => {
                let until = target.clone().flatten();
                let r = read::<A>(run, stream.as_mut(), &mut out, cancel, until.as_ref()).await;
                // A stream that ended well must close well; after a failure the close is
                // best effort.
                let closed = stream.close().await;
                let r = match (r, closed) {
                    (Ok(_), Err(e)) => Err(e),
                    (r, _) => r,
                };
                attempts.end(out, r).await
            }
            Err((e, Some(out))) => attempts.end(out, Err(e)).await,
            Err((e, None)) => (Err(e), false),
        };
        match result {
            Ok(stopped) => return Ok(stopped),
            Err(e) => {
                if progressed {
                    failures = 0;
                }
                failures += 1;
                if !e.is_transient() || failures > MAX_RETRIES || *cancel.borrow() {
                    return Err(e);
                }
                attempts.retrying();
                backoff(&e, failures, A::RESTARTING).await;
            }
        }
    }
}

/// One attempt's read loop.
async fn read<A: Attempts>(
    run: &Run<'_>,
    stream: &mut dyn ChangeStream,
    out: &mut A::Out,
    cancel: &watch::Receiver<bool>,
    target: Option<&StreamPos>,
) -> Result<Stopped> {
    let mut last_harm: Option<Instant> = None;
    let mut last_layout = Instant::now();
    let mut last_tables: Option<Instant> = None;
    // The source's position when the selection's tables were seen to change: the run stops
    // once everything before it is written.
    let mut tables_at: Option<(StreamPos, crate::added::Seen)> = None;
    let received = |stream: &dyn ChangeStream, out: &mut A::Out| {
        (!out.sink().in_tx())
            .then(|| stream.received_through())
            .flatten()
    };
    loop {
        if last_layout.elapsed() >= crate::layout::CHECK_EVERY {
            last_layout = Instant::now();
            if crate::layout::check(
                run.capture.source.as_ref(),
                run.datasets,
                out.layout_state(),
                run.capture.partition_changes,
                A::COMMAND,
            )
            .await?
            {
                out.layout_changed().await?;
            }
        }
        if let Some(w) = &run.tables
            && tables_at.is_none()
            && last_tables.is_none_or(|t| t.elapsed() >= w.every)
        {
            last_tables = Some(Instant::now());
            if let Some((what, seen)) = crate::added::changed(
                run.capture.source.as_ref(),
                run.names,
                &run.capture.selection,
                out.layout_state(),
            )
            .await?
                && (!w.created_only || !seen.created().is_empty() || !seen.unpublished().is_empty())
            {
                let at = run.capture.source.current_position().await?;
                tracing::info!(
                    "{what}: writing the changes up to position {at}, then taking the tables in"
                );
                tables_at = Some((at, seen));
            }
        }
        if last_harm.is_none_or(|t| t.elapsed() >= HARM_EVERY) {
            last_harm = Some(Instant::now());
            if let Ok(Some(h)) = run.capture.source.harm(run.names).await {
                out.harm(h);
            }
        }
        if *cancel.borrow() {
            let at = received(stream, out);
            out.finish(at, true).await?;
            confirm(run.capture.source.as_ref(), stream, out, true).await?;
            return Ok(Stopped::Signal);
        }
        out.check()?;
        if out.held() {
            stream.keep_alive().await?;
            confirm(run.capture.source.as_ref(), stream, out, false).await?;
            tokio::time::sleep(HELD_WAIT).await;
            continue;
        }
        let wait = out.wait();
        let step = stream.next(out.sink(), wait).await?;
        let at = received(stream, out);
        out.after_read(step, at).await?;
        confirm(run.capture.source.as_ref(), stream, out, false).await?;
        out.observe(step);
        if let (Some((t, _)), Some(r)) = (&tables_at, received(stream, out))
            && r >= *t
        {
            out.finish(Some(r), false).await?;
            confirm(run.capture.source.as_ref(), stream, out, true).await?;
            if let (Some(w), Some((_, seen))) = (&run.tables, tables_at.take()) {
                *w.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(seen);
            }
            return Ok(Stopped::Tables);
        }
        // Tables seen to change are taken in before a stop at --until-current's target.
        if let (Some(t), Some(r), None) = (target, received(stream, out), &tables_at)
            && r >= *t
        {
            out.finish(Some(r), false).await?;
            confirm(run.capture.source.as_ref(), stream, out, true).await?;
            return Ok(Stopped::UntilCurrent);
        }
    }
}

async fn confirm<O: Output>(
    source: &dyn ChangeSource,
    stream: &mut dyn ChangeStream,
    out: &mut O,
    now: bool,
) -> Result<()> {
    if let Some(pos) = out.confirmable(now)? {
        stream.confirm(&pos).await?;
        out.confirmed(&pos, source);
    }
    Ok(())
}
