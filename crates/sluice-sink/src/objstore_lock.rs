//! The output's lock on an object store (see [`crate::lock`] for the protocol): created only
//! if absent, refreshed by a heartbeat task with conditional writes, taken over from a run
//! whose heartbeat stopped.

use crate::layout::LOCK;
use crate::lock::{HEARTBEAT, LockHolder, OutputLock, STALE_AFTER, held_by};
use crate::objstore::Shared;
use async_trait::async_trait;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use sluice_core::{Error, Result, Retry};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The version of the lock object this run last wrote or read, for conditional writes.
#[derive(Debug, Clone)]
enum Version {
    /// ETag / version of S3 and Azure.
    Store(UpdateVersion),
    /// A GCS generation.
    Gcs(String),
}

fn unsupported(shown: &str, e: &object_store::Error) -> Error {
    Error::destination(
        Retry::Permanent,
        format!(
            "{shown} does not support conditional writes ({e}), which the output's lock needs so \
             that two runs never write one output. Use a store that supports them (AWS S3, \
             GCS, Azure, MinIO, R2 do)."
        ),
    )
}

/// Create the lock object if absent: the new version, or `None` if one exists.
async fn create(s: &Arc<Shared>, shown: &str, data: Vec<u8>) -> Result<Option<Version>> {
    let key = s.key(LOCK);
    if let Some(g) = &s.gcs {
        return g
            .put_if_generation(&key, data.into(), "0")
            .await
            .map(|v| v.map(Version::Gcs))
            .map_err(|e| s.error(&e, "lock", LOCK));
    }
    let opts = PutOptions::from(PutMode::Create);
    match s.store.put_opts(&key, PutPayload::from(data), opts).await {
        Ok(r) => Ok(Some(Version::Store(r.into()))),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(None),
        Err(e @ object_store::Error::NotImplemented { .. }) => Err(unsupported(shown, &e)),
        Err(e) => Err(s.error(&e, "lock", LOCK)),
    }
}

/// The lock object's content and version, or `None` if it does not exist.
async fn read(s: &Arc<Shared>) -> Result<Option<(Vec<u8>, Version)>> {
    let key = s.key(LOCK);
    if let Some(g) = &s.gcs {
        return g
            .get_with_generation(&key)
            .await
            .map(|v| v.map(|(b, g)| (b.to_vec(), Version::Gcs(g))))
            .map_err(|e| s.error(&e, "read", LOCK));
    }
    let got = async {
        match s.store.get(&key).await {
            Ok(r) => {
                let version = UpdateVersion {
                    e_tag: r.meta.e_tag.clone(),
                    version: r.meta.version.clone(),
                };
                r.bytes()
                    .await
                    .map(|b| Some((b.to_vec(), Version::Store(version))))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
    .await;
    got.map_err(|e| s.error(&e, "read", LOCK))
}

/// Replace the lock object if it is still at `version`: the new version, or `None` if it
/// changed.
async fn replace(
    s: &Arc<Shared>,
    shown: &str,
    data: Vec<u8>,
    version: &Version,
) -> Result<Option<Version>> {
    let key = s.key(LOCK);
    match version {
        Version::Gcs(generation) => {
            let g = s
                .gcs
                .as_ref()
                .ok_or_else(|| Error::internal("GCS version without GCS"))?;
            g.put_if_generation(&key, data.into(), generation)
                .await
                .map(|v| v.map(Version::Gcs))
                .map_err(|e| s.error(&e, "lock", LOCK))
        }
        Version::Store(v) => {
            let opts = PutOptions::from(PutMode::Update(v.clone()));
            match s.store.put_opts(&key, PutPayload::from(data), opts).await {
                Ok(r) => Ok(Some(Version::Store(r.into()))),
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::NotFound { .. }
                    | object_store::Error::AlreadyExists { .. },
                ) => Ok(None),
                Err(e @ object_store::Error::NotImplemented { .. }) => Err(unsupported(shown, &e)),
                Err(e) => Err(s.error(&e, "lock", LOCK)),
            }
        }
    }
}

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
        match replace(&self.shared, &self.shown, bytes, &current).await {
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
        let version = match create(&shared, shown, bytes.clone()).await? {
            Some(v) => v,
            None => {
                let Some((data, version)) = read(&shared).await? else {
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
                match replace(&shared, shown, bytes.clone(), &version).await? {
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
