//! `sluice stream --standby`: a second instance that waits while the running stream holds the
//! state's claim, and takes over when that stream stops or dies.
//!
//! The claim lives in a store that fences its writes (Redis: a lock key with a time to live,
//! refreshed by the holder; every state save checks, on the server and in the same step, that
//! the lock still names the saving run; the output itself: its lock, and on an object store
//! state writes conditional on the version the run last read or wrote, see
//! [`crate::OutputState`]). When the holder dies its claim expires within
//! `claim_ttl`; the standby takes it, then the output's lock (a local output's `flock` is
//! released by the kernel when the holder's process ends; an object store's lock once its
//! heartbeat is stale), and continues from the last committed batch like any restart: the
//! batch the dead holder had not committed is rewritten under the names its intent recorded.
//! A holder that was only paused (SIGSTOP, a long GC pause of its VM) and wakes after the
//! takeover finds its next save refused: before a batch's intent it commits no file; after
//! it, the files it may still finish are the ones the standby rewrote for that intent — the
//! same names, the same changes — and its commit is refused.
//!
//! `sluice replicate --standby` waits on the replication's lock on the target instead: a
//! session-level lock, released by the server when the holder's session ends.

use crate::job::{StreamJob, blocking};
use sluice_core::{Error, ErrorKind, Result, Retry};
use sluice_sink::{LockHolder, OutputLock};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often a standby looks at a lock it waits for, at most.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// Take the state's claim for `who`: at once when free, else (`--standby`) when its holder's
/// claim ends. Fails when the store cannot fence a holder that lost its claim.
pub(crate) async fn claim(
    job: &StreamJob,
    who: &str,
    cancel: &watch::Receiver<bool>,
) -> Result<()> {
    if !job.state.fenced() {
        return Err(Error::config(format!(
            "--standby needs a state store that refuses the writes of a stream that lost it \
             (Redis, or the output on local disk or an object store): {} does not fence a \
             paused stream's writes.",
            job.state.describe()
        )));
    }
    let every = job
        .state
        .claim_ttl()
        .map_or(LOOK_EVERY, |t| (t / 4).min(LOOK_EVERY));
    let mut told = false;
    loop {
        let (store, w) = (job.state.clone(), who.to_string());
        match blocking(move || store.try_acquire(&w)).await {
            // A standby outlives a store that is away for a while.
            Err(e) if e.retry() == Retry::Transient => {
                tracing::warn!("standby: {e}; trying again");
            }
            Err(e) => return Err(e),
            Ok(None) => {
                if told {
                    tracing::info!(
                        "standby: took over the stream state {}",
                        job.state.describe()
                    );
                }
                return Ok(());
            }
            Ok(Some(by)) if !told => {
                tracing::info!(
                    "standby: {by} holds the stream state {}; taking over when its claim ends",
                    job.state.describe()
                );
                told = true;
            }
            Ok(Some(_)) => {}
        }
        wait(every, cancel).await?;
    }
}

/// The output's lock; a standby waits while another run holds it (the claim's holder died
/// moments ago and its output lock is not free yet). Without `--standby` a held output is
/// refused at once.
pub(crate) async fn output_lock(
    job: &StreamJob,
    holder: &LockHolder,
    cancel: &watch::Receiver<bool>,
) -> Result<Arc<dyn OutputLock>> {
    let mut told = false;
    loop {
        match job.destination.lock(holder).await {
            // A held output is the lock's only configuration error.
            Err(e) if job.standby && e.kind() == ErrorKind::Config => {
                if !told {
                    tracing::info!("standby: waiting for the output's lock ({e})");
                    told = true;
                }
                wait(LOOK_EVERY, cancel).await?;
            }
            Err(e) if job.standby && e.retry() == Retry::Transient => {
                tracing::warn!("standby: {e}; trying again");
                wait(LOOK_EVERY, cancel).await?;
            }
            Ok(lock) => {
                if told {
                    tracing::info!(
                        "standby: took over the output {}",
                        job.destination.display()
                    );
                }
                return Ok(lock);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The replication's lock on the target (`sluice replicate --standby`): a session-level lock
/// the server releases when the holder's session ends, so a standby takes over when the
/// running replication stops or dies, and waits as long as it is alive (paused included).
/// Also says whether it waited (what the run read of the source before may be stale).
pub(crate) async fn replication_lock(
    job: &crate::apply::ReplicateJob,
    name: &str,
    cancel: &watch::Receiver<bool>,
) -> Result<(Box<dyn sluice_core::apply::ReplicationLock>, bool)> {
    let mut told = false;
    loop {
        match job.target.lock(name).await {
            // A replication held by another run is the lock's only configuration error.
            Err(e) if job.standby && e.kind() == ErrorKind::Config => {
                if !told {
                    tracing::info!("standby: {e}; taking over when that run ends");
                    told = true;
                }
                wait(LOOK_EVERY, cancel).await?;
            }
            Ok(lock) => {
                if told {
                    tracing::info!("standby: took over replication {name}");
                }
                return Ok((lock, told));
            }
            Err(e) if job.standby && e.retry() == Retry::Transient => {
                tracing::warn!("standby: {e}; trying again");
                wait(LOOK_EVERY, cancel).await?;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn wait(every: Duration, cancel: &watch::Receiver<bool>) -> Result<()> {
    let mut cancel = cancel.clone();
    if *cancel.borrow() {
        return Err(Error::interrupted("stopped while standing by"));
    }
    tokio::select! {
        _ = tokio::time::sleep(every) => Ok(()),
        _ = cancel.changed() => Err(Error::interrupted("stopped while standing by")),
    }
}
