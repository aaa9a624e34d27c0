//! The output's lock: one run writes an output at a time.
//!
//! Two runs on one output (a cron job overlapping a manual `--resume`, two `--resume`s) would
//! remove each other's temporaries and mix their plans. So a run takes `_sluice/lock.json`
//! before it inspects the output and keeps it until it ends; the lock says who holds it (host,
//! pid, run id, since), and a second run is refused with that information.
//!
//! - **Local disk**: an advisory `flock` on the lock file, taken without waiting. The kernel
//!   drops it when the holder's process ends in any way (`kill -9` included), so a lock left
//!   by a dead run is never in the way and needs no guessing. The file's content only names
//!   the holder.
//! - **Object stores** have no such thing: the lock object is created only if absent
//!   (`If-None-Match: *`, GCS `ifGenerationMatch=0`), and its holder rewrites it every
//!   [`HEARTBEAT`] with a conditional write on the version it last wrote. A lock whose
//!   heartbeat is older than [`STALE_AFTER`], or whose holder ran on this machine and is no
//!   longer running, belongs to a run that died; a new run takes it
//!   over with a conditional write on the version it read, so of two runs doing that at once
//!   one wins. A holder that finds its lock taken over (it was stalled past [`STALE_AFTER`])
//!   stops before writing the manifest ([`OutputLock::check`]). Limits: this trusts the
//!   clocks of the machines involved to agree within a minute or so.

use serde::{Deserialize, Serialize};
use sluice_core::{Error, Result};
use std::time::Duration;

/// How often an object-store lock is refreshed.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// An object-store lock not refreshed for this long belongs to a run that died.
pub const STALE_AFTER: Duration = Duration::from_secs(120);

/// Who holds an output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    /// Host name of the machine running the holder.
    pub host: String,
    /// Process id on that host.
    pub pid: u32,
    /// The holder's run id (`sluice-<run_id>` is its sessions' application name).
    pub run_id: String,
    /// When it took the lock (RFC 3339).
    pub since: String,
    /// When it last refreshed the lock (RFC 3339; object stores).
    #[serde(default)]
    pub heartbeat: String,
}

impl LockHolder {
    /// This process, for run `run_id`, taking the lock at `now` (RFC 3339).
    pub fn this_process(run_id: &str, now: &str) -> LockHolder {
        LockHolder {
            host: host_name(),
            pid: std::process::id(),
            run_id: run_id.to_string(),
            since: now.to_string(),
            heartbeat: now.to_string(),
        }
    }

    /// This process, for run `run_id`, taking the lock now.
    pub fn now(run_id: &str) -> LockHolder {
        Self::this_process(run_id, &chrono::Utc::now().to_rfc3339())
    }

    /// `run 0123abcd (pid 42 on db-export-1, since 2026-…)`.
    pub fn describe(&self) -> String {
        format!(
            "run {} (pid {} on {}, since {})",
            self.run_id, self.pid, self.host, self.since
        )
    }

    /// Seconds since the last heartbeat, if it can be read.
    pub fn heartbeat_age(&self) -> Option<Duration> {
        let at = chrono::DateTime::parse_from_rfc3339(&self.heartbeat).ok()?;
        let age = chrono::Utc::now().signed_duration_since(at);
        Some(age.to_std().unwrap_or(Duration::ZERO))
    }

    /// True when the holder ran on this machine and its process is gone (a run that was
    /// killed): its lock can be taken over at once. A reused pid only makes a dead holder look
    /// alive, which errs on the safe side.
    pub fn is_dead_here(&self) -> bool {
        self.host == host_name()
            && self.pid != std::process::id()
            && !std::path::Path::new(&format!("/proc/{}", self.pid)).exists()
    }

    /// The bytes stored in the lock.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Parse stored bytes (`None` for an empty or damaged lock).
    pub fn from_bytes(bytes: &[u8]) -> Option<LockHolder> {
        serde_json::from_slice(bytes).ok()
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown host".into())
}

/// The error for an output another run holds; `more` is appended (may be empty).
pub fn held_by(shown: &str, holder: Option<&LockHolder>, more: &str) -> Error {
    let who = holder
        .map(LockHolder::describe)
        .unwrap_or_else(|| "another run (it has not written its name yet)".into());
    Error::config(format!(
        "another sluice run is writing {shown}: {who}. Two runs on one output would remove each \
         other's files: wait for it to finish (or stop it), then run again. Its sessions on the \
         source are named sluice-<run id> (PostgreSQL application_name).{more}"
    ))
}

/// A held output lock. Released by [`OutputLock::release`] (and, as a fallback, when dropped).
#[async_trait::async_trait]
pub trait OutputLock: Send + Sync {
    /// Fails when this run no longer holds the lock (an object-store lock taken over by another
    /// run after this one stopped refreshing it); checked before the manifest is written.
    fn check(&self) -> Result<()>;
    /// Give the lock up. Idempotent.
    async fn release(&self);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_round_trips_and_ages() {
        let now = chrono::Utc::now().to_rfc3339();
        let h = LockHolder::this_process("abc", &now);
        assert_eq!(LockHolder::from_bytes(&h.to_bytes()), Some(h.clone()));
        assert!(h.heartbeat_age().is_some_and(|a| a < STALE_AFTER));
        assert!(LockHolder::from_bytes(b"").is_none());
        let e = held_by("/out", Some(&h), "");
        assert!(e.to_string().contains("run abc"), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("pid {}", std::process::id()))
        );
    }
}
