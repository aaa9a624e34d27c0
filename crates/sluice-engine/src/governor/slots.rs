//! The governed signals: what each one's value is now (an adapter signal's latest reading, the
//! canary's p95 over the cooldown window with a probe still running counted as slow as it has
//! run, the harm monitor's sample, the snapshot's age), whether it is unreadable (fail closed),
//! and the task that reads an adapter signal at its interval.

use super::law::Worst;
use super::run::TICK;
use super::timeline::SignalInfo;
use super::{HarmBudget, XminLimit, show_seconds};
use crate::harm::HarmLatest;
use sluice_core::budget::{SignalKind, SignalReader};
use sluice_core::{Consistency, Error, HarmSample, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What one adapter signal's task has read.
#[derive(Debug, Default)]
pub(super) struct Readings {
    /// Recent values with their time (the canary's percentile window).
    window: VecDeque<(Instant, f64)>,
    /// Since when, and why, it cannot be read (cleared by a reading).
    failing: Option<(Instant, String)>,
    /// Since when a read has been running (a canary stuck behind a lock counts as slow).
    in_flight: Option<Instant>,
}

/// Where a slot's value comes from.
pub(super) enum Feed {
    /// An adapter signal read by its own task.
    Reader(SignalKind, Arc<Mutex<Readings>>),
    /// The harm monitor's sample (the run's own xmin age or transaction age, sessions
    /// waiting on its locks).
    Harm(fn(&HarmSample) -> Option<f64>),
    /// How long the snapshot has been held.
    SnapshotAge,
}

/// An adapter signal and where its task keeps its readings.
pub(super) type ReaderTask = (Box<dyn SignalReader>, Arc<Mutex<Readings>>);

/// One governed signal.
pub(super) struct Slot {
    pub(super) info: SignalInfo,
    pub(super) feed: Feed,
    pub(super) interval: Duration,
    /// The run stops before exceeding it instead of pausing (the xmin budget under a snapshot:
    /// pausing would only hold the snapshot longer).
    pub(super) bounds_run: bool,
}

/// The value of a feed now, `Err` when unreadable (with since when and why).
pub(super) fn value_of(slot: &Slot, harm: &HarmLatest, since: Instant) -> Result<Option<f64>> {
    match &slot.feed {
        Feed::SnapshotAge => Ok(Some(since.elapsed().as_secs_f64())),
        Feed::Harm(f) => match harm.get() {
            Some(s) => Ok(f(&s)),
            None => Err(Error::source_transient(
                "the harm monitor has no sample (its session could not be opened or failed)",
            )),
        },
        Feed::Reader(kind, r) => {
            let r = r
                .lock()
                .map_err(|_| Error::internal("a signal's readings lock was poisoned"))?;
            if let Some((_, why)) = &r.failing {
                return Err(Error::source_transient(why.clone()));
            }
            let stuck = r.in_flight.map(|t| t.elapsed().as_secs_f64());
            Ok(match kind {
                SignalKind::Latency => {
                    let mut v: Vec<f64> = r.window.iter().map(|(_, v)| *v).collect();
                    v.extend(stuck.filter(|s| *s > 0.0));
                    percentile(&mut v, 0.95)
                }
                SignalKind::ReplicaLag | SignalKind::Active => r.window.back().map(|(_, v)| *v),
            })
        }
    }
}

/// Whether the feed has been unreadable for longer than its interval: why, if so.
pub(super) fn blind_for(
    slot: &Slot,
    value: &Result<Option<f64>>,
    started: Instant,
) -> Option<String> {
    let waited_long = |since: Instant| since.elapsed() > slot.interval;
    match (value, &slot.feed) {
        (Err(e), Feed::Reader(_, r)) => {
            let (since, never_read) = r
                .lock()
                .map(|r| (r.failing.as_ref().map(|f| f.0), r.window.is_empty()))
                .unwrap_or((None, true));
            if never_read {
                // Never read at all: nothing vouches for the source yet.
                return Some(format!("{} unreadable: {e}", slot.info.name));
            }
            since.filter(|s| waited_long(*s)).map(|s| {
                format!(
                    "{} unreadable for {}: {e}",
                    slot.info.name,
                    show_seconds(s.elapsed().as_secs_f64())
                )
            })
        }
        (Err(e), _) => waited_long(started).then(|| format!("{} unreadable: {e}", slot.info.name)),
        (Ok(None), _) => Some(format!("{FIRST_READING} {}", slot.info.name)),
        (Ok(Some(_)), _) => None,
    }
}

/// The `q` quantile of `v` (sorted in place), `None` when empty.
pub(super) fn percentile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

/// `12.3 s`, `3 sessions`.
pub(super) fn show(value: f64, unit: &str) -> String {
    match unit {
        "s" => show_seconds(value),
        _ => format!("{value:.0} {unit}"),
    }
}

/// Read `reader` every interval until `stop`.
pub(super) async fn read_loop(
    mut reader: Box<dyn SignalReader>,
    readings: Arc<Mutex<Readings>>,
    mut stop: watch::Receiver<bool>,
) {
    let window = super::COOLDOWN;
    loop {
        if let Ok(mut r) = readings.lock() {
            r.in_flight = Some(Instant::now());
        }
        let read = tokio::select! {
            r = reader.read() => r,
            _ = stop.changed() => break,
        };
        if let Ok(mut r) = readings.lock() {
            r.in_flight = None;
            let now = Instant::now();
            match read {
                Ok(v) => {
                    r.failing = None;
                    r.window.push_back((now, v));
                    while r
                        .window
                        .front()
                        .is_some_and(|(t, _)| now.saturating_duration_since(*t) > window)
                        && r.window.len() > 1
                    {
                        r.window.pop_front();
                    }
                }
                Err(e) => {
                    let since = r.failing.as_ref().map_or(now, |f| f.0);
                    r.failing = Some((since, e.to_string()));
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(reader.interval()) => {}
            _ = stop.changed() => break,
        }
    }
}

/// The slots of `budget`: the adapter's readers, and what the harm monitor measures.
pub(super) fn slots(
    budget: &HarmBudget,
    consistency: Consistency,
    readers: Vec<Box<dyn SignalReader>>,
    engine: &str,
) -> Result<(Vec<Slot>, Vec<ReaderTask>)> {
    let mut slots = Vec::new();
    let mut tasks = Vec::new();
    let wanted = [
        (
            SignalKind::ReplicaLag,
            budget.max_replica_lag.map(|d| d.as_secs_f64()),
            "--max-replica-lag",
        ),
        (
            SignalKind::Latency,
            budget.max_latency.map(|d| d.as_secs_f64()),
            "--max-latency",
        ),
        (
            SignalKind::Active,
            budget.max_active.map(f64::from),
            "--max-active",
        ),
    ];
    for (kind, limit, flag) in wanted {
        if limit.is_some() && !readers.iter().any(|r| r.kind() == kind) {
            return Err(Error::config(format!(
                "{flag}: {engine} sources offer no such signal; drop the limit."
            )));
        }
    }
    for reader in readers {
        let limit = match reader.kind() {
            SignalKind::ReplicaLag => budget.max_replica_lag.map(|d| d.as_secs_f64()),
            SignalKind::Latency => budget.max_latency.map(|d| d.as_secs_f64()),
            SignalKind::Active => budget.max_active.map(f64::from),
        };
        let Some(limit) = limit else { continue };
        let readings = Arc::new(Mutex::new(Readings::default()));
        let name = match reader.kind() {
            SignalKind::Latency => format!("{} p95", reader.name()),
            _ => reader.name(),
        };
        slots.push(Slot {
            info: SignalInfo {
                name,
                unit: reader.kind().unit().into(),
                limit,
            },
            feed: Feed::Reader(reader.kind(), readings.clone()),
            interval: reader.interval().max(TICK),
            bounds_run: false,
        });
        tasks.push((reader, readings));
    }
    let snapshot = consistency == Consistency::Snapshot;
    match budget.max_xmin_age {
        Some(XminLimit::Time(d)) => slots.push(Slot {
            info: SignalInfo {
                name: if snapshot {
                    "snapshot held"
                } else {
                    "longest transaction"
                }
                .into(),
                unit: "s".into(),
                limit: d.as_secs_f64(),
            },
            feed: if snapshot {
                Feed::SnapshotAge
            } else {
                Feed::Harm(|s| Some(s.longest_transaction.as_secs_f64()))
            },
            interval: Duration::from_secs(1),
            bounds_run: snapshot,
        }),
        Some(XminLimit::Xids(n)) => {
            if engine != "postgres" {
                return Err(Error::config(format!(
                    "--max-xmin-age in transactions needs PostgreSQL ({engine} has no xmin \
                     horizon): give a duration instead (e.g. 30min)."
                )));
            }
            slots.push(Slot {
                info: SignalInfo {
                    name: "xmin age".into(),
                    unit: "xids".into(),
                    limit: n as f64,
                },
                feed: Feed::Harm(|s| Some(s.xmin_age.unwrap_or(0) as f64)),
                interval: Duration::from_secs(1),
                bounds_run: snapshot,
            });
        }
        None => {}
    }
    if budget.governs() && !snapshot {
        // A chunk's transaction holds its table's lock only while it runs: waiting lets a
        // DDL queued behind it through (under a snapshot the locks stay until the end, so
        // pausing would only make the wait longer).
        slots.push(Slot {
            info: SignalInfo {
                name: "sessions waiting on the run's locks".into(),
                unit: "sessions".into(),
                limit: 0.0,
            },
            feed: Feed::Harm(|s| Some(f64::from(s.blocked_sessions))),
            interval: Duration::from_secs(1),
            bounds_run: false,
        });
    }
    Ok((slots, tasks))
}

/// Keep in `worst` the reading `v` of `slot` when its share of the limit is the largest yet,
/// with what to say about it (`replica lag 12.3 s > 10 s`).
pub(super) fn keep_worst(worst: &mut Option<Worst>, slot: &Slot, v: f64) {
    let (limit, unit) = (slot.info.limit, slot.info.unit.as_str());
    let s = share(v, limit);
    if worst.as_ref().is_none_or(|w| s > w.share) {
        *worst = Some(Worst {
            share: s,
            says: format!(
                "{} {} > {}",
                slot.info.name,
                show(v, unit),
                show(limit, unit)
            ),
        });
    }
}

/// A value's share of its limit (a limit of 0 tolerates nothing).
pub(super) fn share(value: f64, limit: f64) -> f64 {
    if limit > 0.0 {
        value / limit
    } else if value > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// The wait for each signal's first reading, at the start: not worth a line or a pause of
/// the timeline (it lasts as long as a connection takes).
pub(super) fn starting(why: &str) -> bool {
    why.starts_with(FIRST_READING)
}

pub(super) const FIRST_READING: &str = "waiting for the first reading of";
