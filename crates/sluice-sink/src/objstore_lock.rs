//! The output's lock on an object store (see [`crate::lock`] for the protocol): created only
//! if absent, refreshed by a heartbeat task with conditional writes, taken over from a run
//! whose heartbeat stopped.

use crate::layout::LOCK;
use crate::lock::{HEARTBEAT, LockHolder, OutputLock, STALE_AFTER, held_by};
use crate::objstore::Shared;
use crate::objstore_versions::{Version, create, read, replace};
use async_trait::async_trait;
use object_store::ObjectStoreExt;
use sluice_core::{Error, Result, Retry};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What the holder and its heartbeat task share.
struct Inner {
    shared: Arc<Shared>,
    shown: String,
    holder: Mutex<LockHolder>,
    version: Mutex<Version>,
    lost: AtomicBool,
}

impl Inner {
    /// Rewrite the lock with a new heartbeat. False once the lock was taken over.
    async fn refresh(&self) -> bool {
        let bytes = match self.holder.lock() {
            Ok(mut h) => {
                h.heartbeat = chrono::Utc::now().to_rfc3339();
                h.to_bytes()
            }
            Err(_) => return true,
        };
        let Ok(current) = self.version.lock().map(|v| v.clone()) else {
            return true;
        };
        match replace(&self.shared, &self.shown, LOCK, bytes, &current).await {
            Ok(Some(v)) => {
                if let Ok(mut slot) = self.version.lock() {
                    *slot = v;
                }
                true
            }
            Ok(None) => {
                self.lost.store(true, Ordering::SeqCst);
                tracing::error!(
                    "another run took over the lock of {}; this run will not write its manifest",
                    self.shown
                );
                false
            }
            Err(e) => {
                tracing::warn!("refreshing the lock of {} failed: {e}", self.shown);
                true
            }
        }
    }
}

/// A held object-store lock.
struct StoreLock {
    inner: Arc<Inner>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    heartbeat: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

#[async_trait]
impl OutputLock for StoreLock {
    fn check(&self) -> Result<()> {
        if self.inner.lost.load(Ordering::SeqCst) {
            return Err(Error::destination(
                Retry::Permanent,
                format!(
                    "another run took over {} after this run's lock was not refreshed for {} s \
                     (the run was stalled); this run stops without writing manifest.json. Let \
                     the other run finish; --resume then finishes what is missing.",
                    self.inner.shown,
                    STALE_AFTER.as_secs()
                ),
            ));
        }
        Ok(())
    }

    async fn release(&self) {
        if let Ok(mut stop) = self.stop.lock() {
            stop.take();
        }
        let Some(heartbeat) = self.heartbeat.lock().await.take() else {
            return;
        };
        let _ = heartbeat.await;
        if !self.inner.lost.load(Ordering::SeqCst) {
            let s = &self.inner.shared;
            let key = s.key(LOCK);
            let outcome = match &s.gcs {
                Some(g) => g.delete(&key).await,
                None => match s.store.delete(&key).await {
                    Err(object_store::Error::NotFound { .. }) => Ok(()),
                    r => r,
                },
            };
            if outcome.is_err() {
                tracing::warn!(
                    "could not remove the lock of {}; the next run takes it over after {} s",
                    self.inner.shown,
                    STALE_AFTER.as_secs()
                );
            }
        }
    }
}

impl Drop for StoreLock {
    /// A lock dropped without `release` (a failed run unwinding) stops refreshing at once;
    /// its object is left, and the next run takes it over when it is stale.
    fn drop(&mut self) {
        if let Ok(mut stop) = self.stop.lock() {
            stop.take();
        }
    }
}

/// Take the lock of the output at `shared` for `holder` (see [`crate::lock`]).
pub(crate) async fn acquire(
    shared: Arc<Shared>,
    shown: &str,
    holder: &LockHolder,
) -> Result<Arc<dyn OutputLock>> {
    let bytes = holder.to_bytes();
    let mut last: Option<LockHolder> = None;
    for _ in 0..3 {
        let version = match create(&shared, shown, LOCK, bytes.clone()).await? {
            Some(v) => v,
            None => {
                let Some((data, version)) = read(&shared, LOCK).await? else {
                    continue; // released meanwhile
                };
                let other = LockHolder::from_bytes(&data);
                let alive = other.as_ref().is_some_and(|h| {
                    !h.is_dead_here() && h.heartbeat_age().is_some_and(|age| age < STALE_AFTER)
                });
                if alive {
                    let age = other
                        .as_ref()
                        .and_then(LockHolder::heartbeat_age)
                        .map(|a| a.as_secs())
                        .unwrap_or(0);
                    return Err(held_by(
                        shown,
                        other.as_ref(),
                        &format!(
                            " Its lock was last refreshed {age} s ago; if that run died on \
                             another machine, the lock is taken over once it is {} s old.",
                            STALE_AFTER.as_secs()
                        ),
                    ));
                }
                match replace(&shared, shown, LOCK, bytes.clone(), &version).await? {
                    Some(v) => {
                        if let Some(dead) = &other {
                            tracing::info!(
                                "took over the lock of {}, which is no longer running",
                                dead.describe()
                            );
                        }
                        v
                    }
                    None => {
                        last = other;
                        continue; // another run took it over first
                    }
                }
            }
        };
        let inner = Arc::new(Inner {
            shared,
            shown: shown.to_string(),
            holder: Mutex::new(holder.clone()),
            version: Mutex::new(version),
            lost: AtomicBool::new(false),
        });
        let (stop, mut stopped) = oneshot::channel::<()>();
        let beat = inner.clone();
        let heartbeat = tokio::spawn(async move {
            let mut tick = tokio::time::interval(HEARTBEAT);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => {
                        if !beat.refresh().await {
                            break;
                        }
                    }
                }
            }
        });
        return Ok(Arc::new(StoreLock {
            inner,
            stop: Mutex::new(Some(stop)),
            heartbeat: tokio::sync::Mutex::new(Some(heartbeat)),
        }));
    }
    Err(held_by(shown, last.as_ref(), ""))
}
