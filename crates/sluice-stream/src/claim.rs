//! Keeping a state store's claim alive for a whole run: a stream whose state lives outside the
//! output (Redis) holds a claim with a time to live, so a second stream on the same state is
//! refused. The claim must outlive the longest phase — an initial snapshot can take hours —
//! so it is refreshed from a task of its own, not from the streaming loop. A claim that cannot
//! be refreshed for most of its time to live (the store unreachable), or that another stream
//! took, stops the run: its cancel is raised, and the run ends with the keeper's error rather
//! than write state it no longer owns.

use crate::job::blocking;
use crate::state::StateStore;
use sluice_core::{Error, Result};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Refreshes per claim lifetime: a claim of 60 s is refreshed every 15 s.
const REFRESHES_PER_TTL: u32 = 4;
/// How much of the claim's lifetime refreshes may fail for a reason a retry can cure before
/// the run stops (2/3: nobody else can have taken it yet).
const GIVE_UP_SHARE: f64 = 2.0 / 3.0;
/// The wait before retrying a refresh that failed for a transient reason.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// A running keeper.
pub(crate) struct Keeper {
    task: JoinHandle<()>,
    lost: Arc<Mutex<Option<Error>>>,
    stop: watch::Sender<bool>,
}

impl Keeper {
    /// Refresh `store`'s claim until stopped. Returns the keeper and the cancel the run should
    /// use: `cancel` (the user's), raised as well when the claim is lost.
    pub fn start(
        store: Arc<dyn StateStore>,
        cancel: watch::Receiver<bool>,
    ) -> (Keeper, watch::Receiver<bool>) {
        let (run_tx, run_rx) = watch::channel(*cancel.borrow());
        let (stop, mut stopped) = watch::channel(false);
        let lost: Arc<Mutex<Option<Error>>> = Arc::default();
        let keeper_lost = lost.clone();
        // Without a claim there is nothing to refresh: the task only passes the user's
        // cancel on.
        let ttl = store.claim_ttl();
        let every = ttl.map_or(Duration::from_secs(3600), |t| t / REFRESHES_PER_TTL);
        let give_up = ttl.map_or(Duration::MAX, |t| t.mul_f64(GIVE_UP_SHARE));
        let task = tokio::spawn(async move {
            let mut user = Some(cancel);
            let mut last_ok = Instant::now();
            let mut wait = every;
            loop {
                let cancelled = async {
                    match user.as_mut() {
                        Some(u) => u.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    alive = cancelled => {
                        match user.as_ref() {
                            Some(u) if alive && *u.borrow() => {
                                let _ = run_tx.send(true);
                            }
                            // The user's side is gone: nothing more to pass on.
                            _ if !alive => user = None,
                            _ => {}
                        }
                        continue;
                    }
                    _ = stopped.changed() => return,
                }
                if ttl.is_none() {
                    continue;
                }
                let s = store.clone();
                match blocking(move || s.refresh()).await {
                    Ok(()) => {
                        last_ok = Instant::now();
                        wait = every;
                    }
                    Err(e) if e.is_transient() && last_ok.elapsed() < give_up => {
                        tracing::warn!("refreshing the stream's claim failed ({e}); retrying");
                        wait = RETRY_EVERY;
                    }
                    Err(e) => {
                        *keeper_lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        let _ = run_tx.send(true);
                        return;
                    }
                }
            }
        });
        (Keeper { task, lost, stop }, run_rx)
    }

    /// Stop refreshing; the error that stopped the run when the claim was lost.
    pub async fn stop(self) -> Option<Error> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// `result`, unless the claim was lost meanwhile: then the keeper's error (the run was
/// cancelled for it).
pub(crate) fn unless_lost<T>(result: Result<T>, lost: Option<Error>) -> Result<T> {
    match lost {
        Some(e) => Err(e),
        None => result,
    }
}
