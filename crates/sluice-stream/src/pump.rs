//! Streaming: open the source's stream at the committed position, feed the batcher, cut,
//! confirm, and restart from the committed position after a transient error.

use crate::batch::{Batcher, Budgets};
use crate::metrics::Metrics;
use crate::run::{Stopped, StreamJob, StreamReport, blocking};
use crate::state::StreamState;
use sluice_core::change::{CaptureNames, ChangeStream, Step};
use sluice_core::{Dataset, Error, Result, failpoint};
use sluice_engine::Report;
use sluice_sink::layout::dataset_dir;
use sluice_sink::{Destination, FormatOptions, ParquetOptions};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Consecutive failed attempts without progress (a committed batch, an applied transaction)
/// before a transient error ends a stream or a replication (waits of 1, 2, 4, … 32 s between
/// them, see [`backoff`]).
pub(crate) const MAX_RETRIES: u32 = 8;

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

async fn cleanup(dest: &dyn Destination, state: &StreamState) -> Result<()> {
    let keep: Vec<String> = state
        .intent
        .as_ref()
        .map(|i| i.files.clone())
        .unwrap_or_default();
    for name in state.tables.keys() {
        for f in dest
            .list(&format!("{}/changes/", dataset_dir(name)))
            .await?
        {
            let file = f.path.rsplit('/').next().unwrap_or_default();
            let seq = file
                .split(['-', '.'])
                .nth(1)
                .and_then(|s| s.parse::<u64>().ok());
            let stale = file.starts_with('.')
                || (seq.is_some_and(|s| s > state.committed.written_through)
                    && !keep.contains(&f.path));
            if stale {
                dest.delete(&f.path).await?;
            }
        }
    }
    Ok(())
}

fn budgets(job: &StreamJob) -> (Budgets, FormatOptions) {
    let flush = (job.memory / 16).clamp(256 << 10, 8 << 20) as usize;
    let row_group = (job.memory / 8).clamp(1 << 20, 64 << 20) as usize;
    let format = match &job.format {
        FormatOptions::Parquet(p) => FormatOptions::Parquet(ParquetOptions {
            row_group_bytes: row_group,
            ..p.clone()
        }),
        other => other.clone(),
    };
    (
        Budgets {
            batch_bytes: job.batch_bytes,
            batch_time: Duration::from_secs_f64(job.batch_seconds.max(0.01)),
            flush_bytes: flush,
        },
        format,
    )
}

pub(crate) async fn stream(
    job: &StreamJob,
    mut state: StreamState,
    datasets: &[Dataset],
    metrics: Arc<Metrics>,
    cancel: watch::Receiver<bool>,
    started: Instant,
    snapshot: Option<Report>,
) -> Result<StreamReport> {
    let names = state.names.clone();
    metrics.streaming.store(1, Ordering::Relaxed);
    let mut target: Option<Option<String>> = None;
    let mut failures = 0u32;
    let (mut stream, batcher, stopped) = loop {
        let attempt = async {
            cleanup(job.destination.as_ref(), &state).await?;
            let stream = job
                .source
                .open(&names, datasets, &state.committed.restart)
                .await?;
            if target.is_none() {
                target = Some(match job.until_current {
                    true => Some(job.source.current_position().await?),
                    false => None,
                });
            }
            Ok::<_, Error>(stream)
        };
        let (budgets, format) = budgets(job);
        let mut batcher = Batcher::new(
            job.destination.clone(),
            format,
            job.state.clone(),
            state.clone(),
            budgets,
            metrics.clone(),
        );
        let (r, stream) = match attempt.await {
            Ok(mut stream) => {
                let until = target.clone().flatten();
                let r = pump(
                    job,
                    &names,
                    datasets,
                    stream.as_mut(),
                    &mut batcher,
                    &metrics,
                    &cancel,
                    until.as_deref(),
                )
                .await;
                (r, Some(stream))
            }
            Err(e) => (Err(e), None),
        };
        match r {
            Ok(stopped) => match stream {
                Some(s) => break (s, batcher, stopped),
                None => return Err(Error::internal("a stream stopped without a session")),
            },
            Err(e) => {
                batcher.abort();
                metrics.errors.fetch_add(1, Ordering::Relaxed);
                if let Some(mut s) = stream {
                    let _ = s.close().await;
                }
                if batcher.state.committed != state.committed {
                    failures = 0;
                }
                failures += 1;
                if !e.is_transient() || failures > MAX_RETRIES || *cancel.borrow() {
                    return Err(e);
                }
                metrics.retries.fetch_add(1, Ordering::Relaxed);
                backoff(&e, failures, "the stream from its committed position").await;
                let store = job.state.clone();
                state = blocking(move || store.load())
                    .await?
                    .ok_or_else(|| Error::internal("the stream state vanished while streaming"))?;
            }
        }
    };
    stream.close().await?;
    let c = &batcher.state.committed;
    tracing::info!(
        "stream stopped ({}): {} changes in {} batches this run; position {}, _seq {}",
        match stopped {
            Stopped::UntilCurrent => "caught up with --until-current",
            Stopped::Signal => "signal",
        },
        metrics.changes.load(Ordering::Relaxed),
        metrics.batches.load(Ordering::Relaxed),
        c.restart,
        c.written_through
    );
    Ok(StreamReport {
        source: job.source.display_url(),
        destination: job.destination.display(),
        state: job.state.describe(),
        slot: names.slot.clone(),
        publication: names.publication.clone(),
        snapshot,
        changes: metrics.changes.load(Ordering::Relaxed),
        transactions: metrics.transactions.load(Ordering::Relaxed),
        batches: metrics.batches.load(Ordering::Relaxed),
        files: metrics.files.load(Ordering::Relaxed),
        bytes_written: metrics.bytes_written.load(Ordering::Relaxed),
        position: c.restart.clone(),
        last_seq: c.written_through,
        peak_retained_bytes: metrics.retained_bytes.load(Ordering::Relaxed),
        peak_lag_seconds: metrics.peak_lag_millis.load(Ordering::Relaxed) as f64 / 1000.0,
        seconds_since_confirm: metrics.since_confirm_millis.load(Ordering::Relaxed) as f64 / 1000.0,
        stopped,
        wall_seconds: started.elapsed().as_secs_f64(),
        peak_rss_bytes: sluice_engine::rss::peak_rss_bytes(),
        engine: job.source.engine().to_string(),
        while_stopped: job.source.while_stopped(&names, "sluice stream"),
        nulled_values: job.source.nulled_values(),
        ignored_changes: metrics.ignored_changes.load(Ordering::Relaxed),
    })
}

#[allow(clippy::too_many_arguments)]
async fn pump(
    job: &StreamJob,
    names: &CaptureNames,
    datasets: &[Dataset],
    stream: &mut dyn ChangeStream,
    batcher: &mut Batcher,
    metrics: &Metrics,
    cancel: &watch::Receiver<bool>,
    target: Option<&str>,
) -> Result<Stopped> {
    let wait = Duration::from_secs_f64(job.batch_seconds.clamp(0.05, 1.0));
    let mut last_confirm = Instant::now();
    let mut last_advance = Instant::now();
    let budget_time = Duration::from_secs_f64(job.batch_seconds.max(0.01));
    let mut last_harm: Option<Instant> = None;
    let mut last_layout = Instant::now();
    let mut peak_retained = 0u64;
    loop {
        if *cancel.borrow() {
            if !batcher.replaying() {
                log_cut(batcher.cut()?);
            }
            confirm(stream, batcher, &mut last_confirm, (job.source.as_ref(), metrics)).await?;
            return Ok(Stopped::Signal);
        }
        let step = stream.next(batcher, wait).await?;
        if batcher.due() {
            log_cut(batcher.cut()?);
        } else if step == Step::Idle || last_advance.elapsed() >= budget_time {
            last_advance = Instant::now();
            batcher.advance_to(stream.received_through())?;
        }
        confirm(stream, batcher, &mut last_confirm, (job.source.as_ref(), metrics)).await?;
        let now_us = chrono::Utc::now().timestamp_micros();
        let lag = match (step, batcher.last_commit_ts) {
            (Step::Data, Some(ts)) => (now_us - ts).max(0) as u64 / 1000,
            _ => 0,
        };
        metrics.lag_millis.store(lag, Ordering::Relaxed);
        metrics.peak_lag_millis.fetch_max(lag, Ordering::Relaxed);
        metrics
            .since_confirm_millis
            .store(last_confirm.elapsed().as_millis() as u64, Ordering::Relaxed);
        if last_layout.elapsed() >= crate::layout::CHECK_EVERY {
            last_layout = Instant::now();
            // Noted changes reach the state at the next cut.
            crate::layout::check(
                job.source.as_ref(),
                datasets,
                &mut batcher.state,
                job.partition_changes,
                "sluice stream",
            )
            .await?;
        }
        if last_harm.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            last_harm = Some(Instant::now());
            if let Ok(Some(h)) = job.source.harm(names).await {
                peak_retained = peak_retained.max(h.retained_bytes);
                metrics
                    .retained_bytes
                    .store(peak_retained, Ordering::Relaxed);
                metrics.lag_bytes.store(h.lag_bytes, Ordering::Relaxed);
            }
        }
        if let (Some(t), Some(r)) = (target, stream.received_through())
            && !batcher.in_tx()
            && r.as_str() >= t
        {
            log_cut(batcher.cut()?);
            batcher.advance_to(stream.received_through())?;
            confirm(stream, batcher, &mut last_confirm, (job.source.as_ref(), metrics)).await?;
            return Ok(Stopped::UntilCurrent);
        }
    }
}

/// Tell the source the committed position is durable (it may release the log before it), and
/// show it in the metrics.
async fn confirm(
    stream: &mut dyn ChangeStream,
    batcher: &mut Batcher,
    last: &mut Instant,
    (source, metrics): (&dyn sluice_core::change::ChangeSource, &Metrics),
) -> Result<()> {
    if let Some(pos) = batcher.to_confirm.take() {
        failpoint::hit("stream.before_confirm")?;
        stream.confirm(&pos).await?;
        *last = Instant::now();
        if let Some(n) = source.position_number(&pos) {
            metrics.committed_position.store(n, Ordering::Relaxed);
        }
    }
    Ok(())
}

fn log_cut(cut: Option<crate::batch::CutInfo>) {
    if let Some(c) = cut {
        tracing::info!(
            "batch committed: {} changes in {} files, _seq {}..{}",
            c.changes,
            c.files,
            c.seqs.0,
            c.seqs.1
        );
    }
}
