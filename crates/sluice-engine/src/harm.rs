//! The harm monitor: a task sampling the source on its own session every ~100 ms while the
//! export runs, keeping the peaks.
//!
//! Monitoring must never break an export: if the probe cannot connect or a sample fails, the
//! run goes on and the report says the figures are incomplete.

use crate::manifest::HarmRecord;
use sluice_core::{HarmProbe, HarmSample};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Peaks so far.
#[derive(Debug, Default, Clone)]
struct Peaks {
    record: HarmRecord,
    failed: Option<String>,
    /// The latest sample, for the harm budget's governor.
    last: Option<HarmSample>,
}

impl Peaks {
    fn add(&mut self, s: &HarmSample) {
        self.last = Some(*s);
        let r = &mut self.record;
        r.samples += 1;
        r.peak_connections = r.peak_connections.max(s.connections);
        r.peak_xmin_age = match (r.peak_xmin_age, s.xmin_age) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        r.longest_transaction_seconds = r
            .longest_transaction_seconds
            .max(s.longest_transaction.as_secs_f64());
        r.longest_statement_seconds = r
            .longest_statement_seconds
            .max(s.longest_statement.as_secs_f64());
        r.peak_blocked_sessions = r.peak_blocked_sessions.max(s.blocked_sessions);
        r.longest_blocked_wait_seconds = r
            .longest_blocked_wait_seconds
            .max(s.longest_blocked_wait.as_secs_f64());
    }
}

/// The monitor's latest sample, as the harm budget's governor reads it (the default: no
/// monitor, never a sample).
#[derive(Clone, Default)]
pub struct HarmLatest(Arc<Mutex<Peaks>>);

impl HarmLatest {
    /// The latest sample, `None` before the first (or when sampling failed).
    pub fn get(&self) -> Option<HarmSample> {
        self.0
            .lock()
            .ok()
            .and_then(|p| if p.failed.is_some() { None } else { p.last })
    }
}

/// A running monitor.
pub struct HarmMonitor {
    peaks: Arc<Mutex<Peaks>>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl HarmMonitor {
    /// Start sampling with `probe` every `interval`; `None` runs a monitor that records nothing
    /// (the probe could not be opened, say why in `why`).
    pub fn start(
        probe: Option<Box<dyn HarmProbe>>,
        interval: Duration,
        why: Option<String>,
    ) -> Self {
        let peaks = Arc::new(Mutex::new(Peaks {
            failed: why,
            ..Peaks::default()
        }));
        let (stop, mut stopped) = watch::channel(false);
        let task = probe.map(|mut probe| {
            let peaks = peaks.clone();
            tokio::spawn(async move {
                loop {
                    match probe.sample().await {
                        Ok(s) => {
                            if let Ok(mut p) = peaks.lock() {
                                p.add(&s);
                            }
                        }
                        Err(e) => {
                            if let Ok(mut p) = peaks.lock() {
                                p.failed.get_or_insert_with(|| e.to_string());
                            }
                            break;
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(interval) => {}
                        _ = stopped.changed() => break,
                    }
                }
            })
        });
        HarmMonitor { peaks, stop, task }
    }

    /// A handle on the latest sample.
    pub fn latest(&self) -> HarmLatest {
        HarmLatest(self.peaks.clone())
    }

    /// Stop and return the peaks, with the reason figures are incomplete if sampling failed.
    pub async fn finish(mut self) -> (HarmRecord, Option<String>) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        let p = self.peaks.lock().map(|p| p.clone()).unwrap_or_default();
        (p.record, p.failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_peaks() {
        let mut p = Peaks::default();
        p.add(&HarmSample {
            connections: 3,
            xmin_age: Some(5),
            longest_transaction: Duration::from_secs(2),
            longest_statement: Duration::from_secs(1),
            ..HarmSample::default()
        });
        p.add(&HarmSample {
            connections: 2,
            xmin_age: None,
            longest_transaction: Duration::from_secs(4),
            longest_statement: Duration::ZERO,
            blocked_sessions: 2,
            longest_blocked_wait: Duration::from_millis(1500),
        });
        assert_eq!(p.record.peak_connections, 3);
        assert_eq!(p.record.peak_xmin_age, Some(5));
        assert_eq!(p.record.longest_transaction_seconds, 4.0);
        assert_eq!(p.record.samples, 2);
        assert_eq!(p.record.peak_blocked_sessions, 2);
        assert_eq!(p.record.longest_blocked_wait_seconds, 1.5);
    }
}
