//! The running governor: one task per adapter signal reading it at its interval, and one task
//! that every 250 ms turns the readings into the law's step, publishes the gate, says what
//! changed (log and progress line) and records the timeline.
//!
//! The signals themselves (their values, fail-closed reading, their tasks) are `slots.rs`'s.

use super::gate::GateState;
use super::law::{Law, Worst};
use super::slots::{
    FIRST_READING, Slot, blind_for, keep_worst, read_loop, show, slots, starting, value_of,
};
use super::timeline::{Pause, Point, Timeline};
use super::{Gate, XminLimit};
use crate::harm::HarmLatest;
use crate::job::ExportJob;
use crate::progress::Progress;
use sluice_core::budget::SignalReader;
use sluice_core::{Consistency, ReadCounters, Result, SourceOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the law steps.
pub(super) const TICK: Duration = Duration::from_millis(250);

/// What the governor needs from the run.
pub(crate) struct Inputs {
    /// The run's workers.
    pub workers: usize,
    /// Rows and bytes read.
    pub counters: Arc<ReadCounters>,
    /// Parts committed.
    pub parts_done: Arc<AtomicU64>,
    /// The harm monitor's latest sample.
    pub harm: HarmLatest,
    /// When the snapshot was taken.
    pub snapshot_since: Instant,
    /// Where to say what changed.
    pub progress: Arc<dyn Progress>,
}

/// A running governor.
pub struct Governor {
    gate: Gate,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Timeline>>,
    readers: Vec<JoinHandle<()>>,
}

/// The state the stepping task carries.
struct Stepper {
    slots: Vec<Slot>,
    law: Law,
    inputs: Inputs,
    started: Instant,
    gate: watch::Sender<GateState>,
    timeline: Timeline,
    /// Counters at the last point.
    last: (Instant, u64, u64),
    /// The pause under way: since when, why.
    pause: Option<(f64, String)>,
}

impl Stepper {
    fn step(&mut self) {
        let now = Instant::now();
        let mut worst: Option<Worst> = None;
        let mut blind = None;
        let mut stop = None;
        let mut values = Vec::with_capacity(self.slots.len());
        for slot in &self.slots {
            let value = value_of(slot, &self.inputs.harm, self.inputs.snapshot_since);
            if blind.is_none() {
                blind = blind_for(slot, &value, self.started);
            }
            let v = value.ok().flatten();
            values.push(v);
            let Some(v) = v else { continue };
            if slot.bounds_run {
                if let Some(why) = self.bound_exceeded(slot, v) {
                    stop.get_or_insert(why);
                }
                continue;
            }
            keep_worst(&mut worst, slot, v);
        }
        let before = (self.law.active(), self.law.paused().map(str::to_string));
        self.law.step(now, worst.as_ref(), blind);
        self.announce(before, stop.as_deref());
        let t = self.started.elapsed().as_secs_f64();
        match (&self.pause, self.law.paused().filter(|w| !starting(w))) {
            (None, Some(why)) => self.pause = Some((t, why.to_string())),
            (Some((from, why)), None) => {
                self.timeline.pauses.push(Pause {
                    from: *from,
                    to: t,
                    reason: why.clone(),
                });
                self.pause = None;
            }
            _ => {}
        }
        self.gate.send_if_modified(|g| {
            let new = GateState {
                active: self.law.active(),
                paused: self.law.paused().map(str::to_string),
                stop: g.stop.clone().or_else(|| stop.clone()),
            };
            let changed = *g != new;
            *g = new;
            changed
        });
        if now.duration_since(self.last.0) >= Duration::from_secs(1) {
            self.record(now, t, values);
        }
    }

    /// Why the run must stop before the next chunk, if `slot` (a bound on the run) would be
    /// exceeded by then: its value plus one chunk's average time (for a time bound) reaches
    /// the limit.
    fn bound_exceeded(&self, slot: &Slot, value: f64) -> Option<String> {
        let limit = slot.info.limit;
        let ahead = if slot.info.unit == "s" {
            let parts = self.inputs.parts_done.load(Ordering::Relaxed).max(1) as f64;
            self.started.elapsed().as_secs_f64() * self.law.active() as f64 / parts
        } else {
            0.0
        };
        (value + ahead >= limit).then(|| {
            format!(
                "harm budget: {} is {} and --max-xmin-age is {}: stopping before the next \
                 chunk would exceed it. The parts read so far are kept: run the same command \
                 with --resume to continue under a new snapshot (each dataset's guarantee in \
                 manifest.json then says what its rows are), or use --consistency chunk.",
                slot.info.name,
                show(value, &slot.info.unit),
                show(limit, &slot.info.unit)
            )
        })
    }

    /// Log and show what changed.
    fn announce(&self, before: (usize, Option<String>), stop: Option<&str>) {
        let (active, paused) = (self.law.active(), self.law.paused());
        let max = self.inputs.workers;
        if let Some(why) = stop
            && self.gate.borrow().stop.is_none()
        {
            tracing::warn!("{why}");
        }
        let loud = |why: &Option<String>| why.clone().filter(|w| !starting(w));
        match (loud(&before.1), paused.filter(|w| !starting(w))) {
            (None, Some(why)) => tracing::warn!("harm budget: paused: {why}"),
            (Some(was), Some(why)) if was != why && !same_signal(&was, why) => {
                tracing::warn!("harm budget: paused: {why}")
            }
            (Some(was), None) if paused.is_none() => tracing::warn!(
                "harm budget: resumed after {was}; {active} of {max} workers may start chunks"
            ),
            _ => {}
        }
        if before.0 != active {
            tracing::info!("harm budget: {active} of {max} workers may start chunks");
        }
        self.inputs.progress.governed(paused, active, max);
    }

    fn record(&mut self, now: Instant, t: f64, signals: Vec<Option<f64>>) {
        let rows = self.inputs.counters.rows.load(Ordering::Relaxed);
        let bytes = self.inputs.counters.bytes.load(Ordering::Relaxed);
        let secs = now.duration_since(self.last.0).as_secs_f64().max(1e-3);
        self.timeline.points.push(Point {
            t: (t * 10.0).round() / 10.0,
            rows_per_second: rows.saturating_sub(self.last.1) as f64 / secs,
            bytes_per_second: bytes.saturating_sub(self.last.2) as f64 / secs,
            workers: self.law.active(),
            signals,
            paused: self.law.paused().map(str::to_string),
        });
        self.timeline.min_workers = self.timeline.min_workers.min(self.law.active());
        self.last = (now, rows, bytes);
    }

    fn finish(mut self) -> Timeline {
        let t = self.started.elapsed().as_secs_f64();
        let values = self
            .slots
            .iter()
            .map(|s| {
                value_of(s, &self.inputs.harm, self.inputs.snapshot_since)
                    .ok()
                    .flatten()
            })
            .collect();
        self.record(Instant::now(), t, values);
        if let Some((from, reason)) = self.pause.take() {
            self.timeline.pauses.push(Pause {
                from,
                to: t,
                reason,
            });
        }
        self.timeline.paused_seconds = self
            .timeline
            .pauses
            .iter()
            .fold(0.0, |sum, p| sum + (p.to - p.from));
        self.timeline
    }
}

/// Two pause reasons about the same signal (only the figure moved): not worth a new line.
fn same_signal(a: &str, b: &str) -> bool {
    let name = |s: &str| {
        s.split(|c: char| c.is_ascii_digit())
            .next()
            .map(str::to_string)
    };
    name(a) == name(b)
}

impl Governor {
    /// Start governing: `readers` are the adapter's signals for `job`'s budget. A budget that
    /// governs nothing starts only the timeline (throughput and workers). Fails with a
    /// configuration error when the budget needs a signal the source cannot give.
    pub(crate) fn start(
        job: &ExportJob,
        readers: Vec<Box<dyn SignalReader>>,
        inputs: Inputs,
    ) -> Result<Governor> {
        let (slots, tasks) = slots(&job.budget, job.consistency, readers, job.source.engine())?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let governs = !slots.is_empty();
        let first = GateState {
            active: inputs.workers,
            paused: governs.then(|| format!("{FIRST_READING} the harm budget's signals")),
            stop: None,
        };
        let (gate_tx, gate_rx) = watch::channel(first);
        let rate = job.budget.max_rate.map(|r| (r, inputs.counters.clone()));
        let gate = if governs || rate.is_some() {
            Gate::new(gate_rx, rate)
        } else {
            Gate::open()
        };
        let readers = tasks
            .into_iter()
            .map(|(reader, readings)| tokio::spawn(read_loop(reader, readings, stop_rx.clone())))
            .collect();
        let now = Instant::now();
        let mut stepper = Stepper {
            timeline: Timeline {
                signals: slots.iter().map(|s| s.info.clone()).collect(),
                min_workers: inputs.workers,
                ..Timeline::default()
            },
            law: Law::new(inputs.workers),
            slots,
            started: now,
            gate: gate_tx,
            last: (now, 0, 0),
            pause: None,
            inputs,
        };
        let mut stopped = stop_rx;
        let task = tokio::spawn(async move {
            loop {
                if governs {
                    stepper.step();
                } else if stepper.last.0.elapsed() >= Duration::from_secs(1) {
                    let t = stepper.started.elapsed().as_secs_f64();
                    stepper.record(Instant::now(), t, Vec::new());
                }
                tokio::select! {
                    _ = tokio::time::sleep(TICK) => {}
                    _ = stopped.changed() => break,
                }
            }
            stepper.finish()
        });
        Ok(Governor {
            gate,
            stop: stop_tx,
            task: Some(task),
            readers,
        })
    }

    /// The workers' side.
    pub fn gate(&self) -> Gate {
        self.gate.clone()
    }

    /// Stop every task and return the timeline.
    pub async fn finish(mut self) -> Timeline {
        let _ = self.stop.send(true);
        for r in self.readers.drain(..) {
            let _ = r.await;
        }
        match self.task.take() {
            Some(t) => t.await.unwrap_or_default(),
            None => Timeline::default(),
        }
    }
}

/// `sluice plan`'s look at the budget: each signal `job`'s budget needs, read once, with its
/// value or why it could not be read. Empty when the budget governs nothing.
pub async fn probe_signals(job: &ExportJob) -> Vec<String> {
    if !job.budget.governs() {
        return Vec::new();
    }
    let options = SourceOptions {
        session_tag: "sluice-plan".into(),
        consistency: Consistency::Chunk,
        enable_row_security: job.enable_row_security,
    };
    let mut probe = match job.source.open_harm_probe(&options).await {
        Ok(p) => p,
        Err(e) => return vec![format!("no signal could be read: {e}")],
    };
    let mut out = Vec::new();
    for mut r in probe.open_signals(&job.budget.request()) {
        let read = tokio::time::timeout(Duration::from_secs(5), r.read()).await;
        let unit = r.kind().unit();
        out.push(match read {
            Ok(Ok(v)) => format!("{}: {} (readable)", r.name(), show(v, unit)),
            Ok(Err(e)) => format!("{}: could not be read: {e}", r.name()),
            Err(_) => format!("{}: could not be read within 5 s", r.name()),
        });
    }
    if let Some(x) = job.budget.max_xmin_age {
        out.push(match x {
            XminLimit::Time(_) => "snapshot / transaction age: measured by the run".into(),
            XminLimit::Xids(_) => "xmin age: sampled from the run's own sessions".into(),
        });
    }
    out
}
