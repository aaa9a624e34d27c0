//! Streaming into change files: the batcher as the read loop's output (`drive.rs`, which
//! opens the source at the committed position, confirms, and restarts after transient
//! errors), cut by bytes and time; stale files of an interrupted batch removed before each
//! attempt.

use crate::batch::{Batcher, Budgets, MergeInto};
use crate::drive::{self, Run, TableWatch};
use crate::job::{Stopped, StreamJob, StreamReport, blocking};
use crate::metrics::Metrics;
use crate::state::StreamState;
use async_trait::async_trait;
use sluice_core::change::{CaptureHarm, ChangeSink, ChangeSource, Step};
use sluice_core::{Dataset, Error, Result, StreamPos, failpoint};
use sluice_engine::Report;
use sluice_sink::layout::dataset_dir;
use sluice_sink::{Destination, FormatOptions, OutputLock, ParquetOptions};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;

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
        // A table format's change files are plain Parquet: its table is merged from them.
        FormatOptions::Parquet(p) | FormatOptions::Delta(p) | FormatOptions::Iceberg(p) => {
            FormatOptions::Parquet(ParquetOptions {
                row_group_bytes: row_group,
                ..p.clone()
            })
        }
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

#[allow(clippy::too_many_arguments)]
pub(crate) async fn stream(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    state: StreamState,
    datasets: Vec<Dataset>,
    metrics: Arc<Metrics>,
    cancel: watch::Receiver<bool>,
    started: Instant,
    snapshot: Option<Report>,
) -> Result<StreamReport> {
    let names = state.names.clone();
    // Tables that joined a run killed before their snapshot was done: read it first.
    let mut state = state;
    let mut added = crate::added::finish(job, lock, &mut state, &metrics, &cancel).await?;
    metrics.streaming.store(1, Ordering::Relaxed);
    let mut attempts = FileAttempts {
        job,
        state: Some(state),
        metrics: metrics.clone(),
        last: None,
        keys: keys_of(&datasets),
    };
    let mut datasets = datasets;
    let mut dropped = Vec::new();
    let mut take_in_failures = 0u32;
    let stopped = loop {
        let run = Run {
            capture: &job.capture,
            names: &names,
            datasets: &datasets,
            tables: job
                .discover_every
                .map(|every| TableWatch::new(every, false)),
        };
        let stopped = drive::run(&run, &mut attempts, &cancel).await?;
        if stopped != Stopped::Tables {
            break stopped;
        }
        let seen = run.take_seen().unwrap_or_default();
        let mut state = attempts
            .last
            .take()
            .ok_or_else(|| Error::internal("a stream stopped without its state"))?;
        let taken =
            crate::added::take_in(job, lock, &mut state, &datasets, &seen, &metrics, &cancel).await;
        match taken {
            Ok(taken) => {
                datasets = taken.datasets;
                attempts.keys = keys_of(&datasets);
                added.extend(taken.added);
                dropped.extend(taken.dropped);
                attempts.state = Some(state);
                take_in_failures = 0;
            }
            // Go on from the saved state (joining snapshots finished, the tables it captures
            // read); the next look at the tables takes in what is left.
            Err(mut e) => loop {
                take_in_failures += 1;
                if !e.is_transient() || take_in_failures > drive::MAX_RETRIES {
                    return Err(e);
                }
                drive::backoff(&e, take_in_failures, "taking the tables in").await;
                match crate::added::recover(job, lock, &datasets, &metrics, &cancel).await {
                    Ok((state, ds, more)) => {
                        attempts.state = Some(state);
                        datasets = ds;
                        attempts.keys = keys_of(&datasets);
                        added.extend(more);
                        break;
                    }
                    Err(again) => e = again,
                }
            },
        }
    };
    let c = attempts
        .last
        .map(|s| s.committed)
        .ok_or_else(|| Error::internal("a stream stopped without its state"))?;
    tracing::info!(
        "stream stopped ({}): {} changes in {} batches this run; position {}, _seq {}",
        match stopped {
            Stopped::UntilCurrent => "caught up with --until-current",
            Stopped::Signal => "signal",
            Stopped::Tables => "tables changed",
        },
        metrics.changes.load(Ordering::Relaxed),
        metrics.batches.load(Ordering::Relaxed),
        c.restart,
        c.written_through
    );
    Ok(StreamReport {
        source: job.capture.source.display_url(),
        destination: job.destination.display(),
        state: job.state.describe(),
        slot: names.name.clone(),
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
        engine: job.capture.source.engine().to_string(),
        while_stopped: job.capture.source.while_stopped(&names, "sluice stream"),
        nulled_values: job.capture.source.nulled_values(),
        ignored_changes: metrics.ignored_changes.load(Ordering::Relaxed),
        ops: job.files.ops.describe(),
        filtered_changes: metrics.filtered_changes.load(Ordering::Relaxed),
        before_images: job.files.before_images,
        added_tables: added,
        dropped_tables: dropped,
        table_versions: metrics.table_versions.load(Ordering::Relaxed),
        table_files_added: metrics.table_files_added.load(Ordering::Relaxed),
        table_files_removed: metrics.table_files_removed.load(Ordering::Relaxed),
        table_files_vacuumed: metrics.table_files_vacuumed.load(Ordering::Relaxed),
    })
}

/// The attempts of a stream: each opens at the committed position of the state (read back
/// from the store after a failure), with the output's stale files removed first.
struct FileAttempts<'a> {
    job: &'a StreamJob,
    /// The state the next attempt starts from (`None`: read it from the store).
    state: Option<StreamState>,
    metrics: Arc<Metrics>,
    /// The state a successful attempt ended with.
    last: Option<StreamState>,
    /// Each dataset's key columns, for a table merge.
    keys: std::collections::HashMap<String, Vec<String>>,
}

fn keys_of(datasets: &[Dataset]) -> std::collections::HashMap<String, Vec<String>> {
    datasets
        .iter()
        .map(|d| (d.name.clone(), d.primary_key.clone()))
        .collect()
}

#[async_trait]
impl drive::Attempts for FileAttempts<'_> {
    type Out = Files;
    const COMMAND: &'static str = "sluice stream";
    const RESTARTING: &'static str = "the stream from its committed position";

    async fn begin(&mut self) -> Result<(StreamPos, Files)> {
        let state = match self.state.take() {
            Some(s) => {
                // The saved state is still this run's (a store that fences refuses the read
                // otherwise) before stale files are removed below.
                let store = self.job.state.clone();
                blocking(move || store.load().map(|_| ())).await?;
                s
            }
            None => {
                let store = self.job.state.clone();
                blocking(move || store.load())
                    .await?
                    .ok_or_else(|| Error::internal("the stream state vanished while streaming"))?
            }
        };
        cleanup(self.job.destination.as_ref(), &state).await?;
        let (budgets, format) = budgets(self.job);
        let from = state.committed.restart.clone();
        let started_from = state.committed.clone();
        let batcher = Batcher::new(
            self.job.destination.clone(),
            format,
            self.job.state.clone(),
            state,
            budgets,
            self.metrics.clone(),
            self.job.files,
        );
        let batcher = match (&self.job.table, &self.job.format) {
            (Some(committer), FormatOptions::Delta(p)) => batcher.merging(MergeInto {
                committer: committer.clone(),
                keys: self.keys.clone(),
                parquet: p.clone(),
                vacuum: self.job.vacuum_retention,
                last_vacuum: None,
            }),
            _ => batcher,
        };
        let out = Files {
            batcher,
            started_from,
            metrics: self.metrics.clone(),
            wait: Duration::from_secs_f64(self.job.batch_seconds.clamp(0.05, 1.0)),
            budget_time: Duration::from_secs_f64(self.job.batch_seconds.max(0.01)),
            last_advance: Instant::now(),
            last_confirm: Instant::now(),
            peak_retained: 0,
        };
        Ok((from, out))
    }

    async fn end(&mut self, mut out: Files, result: Result<Stopped>) -> (Result<Stopped>, bool) {
        let progressed = out.batcher.state.committed != out.started_from;
        if result.is_err() {
            out.batcher.abort();
            self.metrics.errors.fetch_add(1, Ordering::Relaxed);
        } else {
            self.last = Some(out.batcher.state);
        }
        (result, progressed)
    }

    fn retrying(&mut self) {
        self.metrics.retries.fetch_add(1, Ordering::Relaxed);
    }
}

/// Change files: the batcher, cut by bytes and time, confirmed after each committed batch.
struct Files {
    batcher: Batcher,
    started_from: crate::state::Committed,
    metrics: Arc<Metrics>,
    wait: Duration,
    budget_time: Duration,
    last_advance: Instant,
    last_confirm: Instant,
    peak_retained: u64,
}

#[async_trait]
impl drive::Output for Files {
    fn sink(&mut self) -> &mut dyn ChangeSink {
        &mut self.batcher
    }

    fn wait(&self) -> Duration {
        self.wait
    }

    async fn after_read(&mut self, step: Step, received: Option<StreamPos>) -> Result<()> {
        if self.batcher.due() {
            log_cut(self.batcher.cut()?);
        } else if step == Step::Idle || self.last_advance.elapsed() >= self.budget_time {
            self.last_advance = Instant::now();
            self.batcher.advance_to(received)?;
        }
        Ok(())
    }

    async fn finish(&mut self, received: Option<StreamPos>, signal: bool) -> Result<()> {
        if signal {
            // A batch being written again after a restart is finished by the next run.
            if !self.batcher.replaying() {
                log_cut(self.batcher.cut()?);
            }
        } else {
            log_cut(self.batcher.cut()?);
            self.batcher.advance_to(received)?;
        }
        Ok(())
    }

    fn confirmable(&mut self, _now: bool) -> Result<Option<StreamPos>> {
        match self.batcher.to_confirm.take() {
            Some(pos) => {
                failpoint::hit("stream.before_confirm")?;
                Ok(Some(pos))
            }
            None => Ok(None),
        }
    }

    fn confirmed(&mut self, pos: &StreamPos, source: &dyn ChangeSource) {
        self.last_confirm = Instant::now();
        if let Some(n) = source.position_number(pos) {
            self.metrics.committed_position.store(n, Ordering::Relaxed);
        }
    }

    fn observe(&mut self, step: Step) {
        let now_us = chrono::Utc::now().timestamp_micros();
        let lag = match (step, self.batcher.last_commit_ts) {
            (Step::Data, Some(ts)) => (now_us - ts).max(0) as u64 / 1000,
            _ => 0,
        };
        let m = &self.metrics;
        m.lag_millis.store(lag, Ordering::Relaxed);
        m.peak_lag_millis.fetch_max(lag, Ordering::Relaxed);
        m.since_confirm_millis.store(
            self.last_confirm.elapsed().as_millis() as u64,
            Ordering::Relaxed,
        );
    }

    fn harm(&mut self, h: CaptureHarm) {
        self.peak_retained = self.peak_retained.max(h.retained_bytes);
        self.metrics
            .retained_bytes
            .store(self.peak_retained, Ordering::Relaxed);
        self.metrics.lag_bytes.store(h.lag_bytes, Ordering::Relaxed);
    }

    fn layout_state(&mut self) -> &mut StreamState {
        &mut self.batcher.state
    }

    async fn layout_changed(&mut self) -> Result<()> {
        // Noted changes reach the saved state at the next cut.
        Ok(())
    }
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
