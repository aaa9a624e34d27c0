//! What a worker asks before it takes a chunk: may worker `i` start one now? The governor
//! publishes how many workers may, whether new chunks wait and why, and whether the run must
//! stop taking chunks (the xmin budget would be exceeded); a worker never asks mid-chunk.

use super::RateLimit;
use sluice_core::ReadCounters;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What the gate says now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GateState {
    /// Workers `0..active` may start a chunk.
    pub active: usize,
    /// Why new chunks wait, if they do.
    pub paused: Option<String>,
    /// Why no more chunks are started, if so (the run then fails with it).
    pub stop: Option<String>,
}

/// The workers' side of the governor. Cloned into each worker.
#[derive(Debug, Clone)]
pub struct Gate {
    state: Option<watch::Receiver<GateState>>,
    rate: Option<(RateLimit, Arc<ReadCounters>, Instant)>,
}

impl Gate {
    /// A gate that always admits (no budget).
    pub fn open() -> Gate {
        Gate {
            state: None,
            rate: None,
        }
    }

    pub(crate) fn new(
        state: watch::Receiver<GateState>,
        rate: Option<(RateLimit, Arc<ReadCounters>)>,
    ) -> Gate {
        Gate {
            state: Some(state),
            rate: rate.map(|(r, c)| (r, c, Instant::now())),
        }
    }

    /// Wait until worker `index` may start a chunk; `false` when the run takes no more, or
    /// `nothing_left` (checked while waiting: a worker held back must not outlive the queue).
    pub async fn admit(&self, index: usize, nothing_left: impl Fn() -> bool) -> bool {
        if let Some(rx) = &self.state {
            let mut rx = rx.clone();
            loop {
                if nothing_left() {
                    return false;
                }
                {
                    let s = rx.borrow_and_update();
                    if s.stop.is_some() {
                        return false;
                    }
                    if s.paused.is_none() && index < s.active {
                        break;
                    }
                }
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() {
                        // The governor is gone: the run is ending.
                        return false;
                    },
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
        }
        if let Some(wait) = self.rate_wait() {
            tokio::time::sleep(wait).await;
        }
        true
    }

    /// How long to wait so the run's average rate stays under `--max-rate` (a chunk-sized
    /// token bucket: the cap holds on average over the run, never inside a chunk).
    fn rate_wait(&self) -> Option<Duration> {
        let (limit, counters, since) = self.rate.as_ref()?;
        let (done, per_second) = match limit {
            RateLimit::Rows(r) => (counters.rows.load(Ordering::Relaxed) as f64, *r),
            RateLimit::Bytes(b) => (counters.bytes.load(Ordering::Relaxed) as f64, *b),
        };
        let due = Duration::try_from_secs_f64(done / per_second).ok()?;
        due.checked_sub(since.elapsed())
    }

    /// Why no more chunks are started, if the governor stopped the run.
    pub fn stopped(&self) -> Option<String> {
        self.state.as_ref().and_then(|rx| rx.borrow().stop.clone())
    }
}
