//! A brake outside an export: signals read on their own sessions, each against one limit,
//! holding back new work while any is over it — `sluice replicate`'s apply held while the
//! *target's* replicas lag (`--max-target-lag`). The same rules as the export's governor:
//! a signal over its limit holds at once, the hold ends only once every signal is back under
//! [`RESUME_BELOW`](super::RESUME_BELOW) of its limit (hysteresis), and a signal that cannot
//! be read holds too (fail closed). There is no worker count to move: work is held or not.

use super::law::{Law, Worst};
use super::run::TICK;
use super::slots::{Feed, Readings, Slot, blind_for, keep_worst, read_loop, starting, value_of};
use super::timeline::{Pause, SignalInfo};
use crate::harm::HarmLatest;
use sluice_core::budget::SignalReader;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a brake did over its life.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct BrakeRecord {
    /// The signals it read.
    pub signals: Vec<SignalInfo>,
    /// Every hold, in seconds since the brake started, with its first reason.
    pub pauses: Vec<Pause>,
    /// Seconds held in all.
    pub paused_seconds: f64,
}

/// A running brake.
pub struct Brake {
    held: watch::Receiver<Option<String>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<BrakeRecord>,
    readers: Vec<JoinHandle<()>>,
}

impl Brake {
    /// Read each of `readers` at its interval against `limit` (in the readers' unit);
    /// `label` starts each log line (`target lag`). Held until every signal was read once.
    pub fn start(readers: Vec<Box<dyn SignalReader>>, limit: f64, label: &'static str) -> Brake {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut slots = Vec::new();
        let mut tasks = Vec::new();
        for reader in readers {
            let readings = Arc::new(Mutex::new(Readings::default()));
            slots.push(Slot {
                info: SignalInfo {
                    name: reader.name(),
                    unit: reader.kind().unit().into(),
                    limit,
                },
                feed: Feed::Reader(reader.kind(), readings.clone()),
                interval: reader.interval().max(TICK),
                bounds_run: false,
            });
            tasks.push(tokio::spawn(read_loop(reader, readings, stop_rx.clone())));
        }
        let (held_tx, held_rx) = watch::channel(Some(format!(
            "{} {label}'s signals",
            super::slots::FIRST_READING
        )));
        let mut stopped = stop_rx;
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let harm = HarmLatest::default();
            let mut law = Law::new(1);
            let mut record = BrakeRecord {
                signals: slots.iter().map(|s| s.info.clone()).collect(),
                ..BrakeRecord::default()
            };
            let mut since: Option<(f64, String)> = None;
            loop {
                let now = Instant::now();
                let (mut worst, mut blind) = (None::<Worst>, None);
                for slot in &slots {
                    let value = value_of(slot, &harm, started);
                    if blind.is_none() {
                        blind = blind_for(slot, &value, started);
                    }
                    if let Ok(Some(v)) = value {
                        keep_worst(&mut worst, slot, v);
                    }
                }
                law.step(now, worst.as_ref(), blind);
                let t = started.elapsed().as_secs_f64();
                let loud = law.paused().filter(|w| !starting(w)).map(str::to_string);
                match (&since, &loud) {
                    (None, Some(why)) => {
                        tracing::warn!("{label}: paused: {why}");
                        since = Some((t, why.clone()));
                    }
                    (Some((from, why)), None) => {
                        tracing::warn!("{label}: resumed after {why}");
                        record.pauses.push(Pause {
                            from: *from,
                            to: t,
                            reason: why.clone(),
                        });
                        since = None;
                    }
                    _ => {}
                }
                held_tx.send_if_modified(|h| {
                    let new = law.paused().map(str::to_string);
                    let changed = *h != new;
                    *h = new;
                    changed
                });
                tokio::select! {
                    _ = tokio::time::sleep(TICK) => {}
                    _ = stopped.changed() => break,
                }
            }
            let t = started.elapsed().as_secs_f64();
            if let Some((from, reason)) = since {
                record.pauses.push(Pause {
                    from,
                    to: t,
                    reason,
                });
            }
            record.paused_seconds = record.pauses.iter().map(|p| p.to - p.from).sum();
            record
        });
        Brake {
            held: held_rx,
            stop: stop_tx,
            task,
            readers: tasks,
        }
    }

    /// Why new work waits now, if it does.
    pub fn held(&self) -> Option<String> {
        self.held.borrow().clone()
    }

    /// Stop reading and say what the brake did.
    pub async fn finish(self) -> BrakeRecord {
        let _ = self.stop.send(true);
        for r in self.readers {
            let _ = r.await;
        }
        self.task.await.unwrap_or_default()
    }
}
