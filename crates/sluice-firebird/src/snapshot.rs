//! The coordinator: one attachment that plans the run and holds the shared snapshot.
//!
//! # Sharing a snapshot, and why every join is checked
//!
//! In snapshot consistency the coordinator starts a READ ONLY SNAPSHOT (concurrency)
//! transaction before it reads the catalog, so the schema it describes is the one the workers
//! see, and asks the server for the transaction's snapshot number and oldest interesting
//! transaction (`isc_transaction_info`). Workers start their transactions with
//! `SET TRANSACTION … SNAPSHOT AT NUMBER n`. Commit numbers and the list of active snapshots
//! live in memory shared by every engine instance on the database (`TipCache`), so `n`
//! denotes the same point in time in another attachment or another SuperClassic/Classic
//! process; that part holds.
//!
//! What does not hold is that a joined transaction sees only what snapshot `n` saw. A
//! transaction's visibility check (`TRA_snapshot_state`, jrd/tra.cpp, Firebird 4.0 to 6.0)
//! first treats every transaction numbered below the reader's *oldest interesting transaction*
//! as committed and visible, without looking at its commit number; the reader's OIT is read
//! from the header page when the reader's transaction starts. For an ordinary transaction
//! that is sound: whatever committed before it started is in its snapshot. A transaction
//! joining snapshot `n` later takes the OIT of *its* start: a writer transaction that was
//! still running at `n`, committed afterwards and fell below the OIT before the worker joined
//! is then visible to that worker and to no one else. Under a steady writer this happens
//! within milliseconds: an export whose workers join on either side of such a moment shows
//! part of a committed transaction (a bank table's total off by one transfer). Pointer-page
//! runs were the exposed ones because their workers join soon after the snapshot; with key
//! chunking the query for the key bounds (a scan) took long enough that all workers joined
//! late alike: consistent, but as of `n` plus that transaction. The server mode does not
//! matter (attachments of one process show it too), nor the version from 4.0 (tested on
//! 4.0.7 and 5.0.4). Firebird's own parallel backup (gbak `-parallel`) joins its workers the
//! same way. `crates/sluice-cli/tests/it/firebird_consistency.rs` reproduces both the engine
//! behaviour (one attachment sees a transfer the snapshot does not) and its effect on exports.
//!
//! Examined and not the cause: a scan bounded by `RDB$DB_KEY` is a full table scan that starts
//! and stops at record numbers (`FullTableScan`, `VIO_next_record`) and picks each record's
//! version with the same `VIO_chase_record_version` as a fetch through an index; an update
//! keeps a record's number (back versions move, the primary stays). Every statement of a
//! worker runs in the transaction that joined (a reader without it now fails instead of
//! starting one), and the coordinator reads its number inside its own transaction.
//!
//! So a join is checked (`read.rs`, [`FbReader::check`]): the worker reads its own
//! transaction's snapshot number (it must be `n`, else the run fails) and its OIT, and every
//! transaction numbered from the coordinator's OIT (below which everything committed before
//! `n` was taken) up to the worker's is looked up with `RDB$GET_TRANSACTION_CN`: one that
//! committed after `n` makes the join inexact. Joins happen back to back in
//! [`Coordinator::pin_snapshot`], for the workers and one spare session at once; when any is
//! inexact, all of them leave, the coordinator takes a new snapshot and they join again (up to
//! [`JOIN_ATTEMPTS`] times; the plan, whose chunks are open-ended, stays valid). The snapshot
//! number recorded in the manifest is the one every worker joined and checked.
//!
//! A worker that loses its attachment continues on the spare session; after that, a new
//! session joins only if its check passes, else the run fails with advice to resume. Garbage
//! collection keeps the snapshot's record versions only while the coordinator's own
//! transaction is active (its lock holds back the oldest snapshot; a worker's lock, taken
//! later, would not), so each worker checks after every chunk that it still is (`read.rs`).
//! The coordinator holds its transaction until `release`.
//!
//! Firebird 3 has neither snapshot numbers nor `MAKE_DBKEY`: snapshot consistency is refused
//! there with a message naming `--consistency chunk`, in which every chunk reads in its own
//! snapshot transaction (consistent per chunk, not across chunks) and tables are split by key.

use crate::catalog::{self, ServerInfo};
use crate::chunking;
use crate::connect::{FbTarget, Session};
use crate::error::{Phase, classify};
use crate::read::{FbReader, JoinCheck};
use async_trait::async_trait;
use sluice_core::{
    Chunk, ChunkReader, ChunkRequest, Consistency, Coordinator, Dataset, Error, Position, Result,
    RunFacts, Selection, SnapshotInfo,
};

/// The transaction the coordinator plans in (and, in snapshot consistency, shares).
const COORDINATOR_TRANSACTION: &str = "SET TRANSACTION READ ONLY ISOLATION LEVEL SNAPSHOT";

/// How many snapshots the coordinator takes at most before giving up on joining every worker
/// exactly (each attempt's window is the time the joins take, milliseconds).
pub const JOIN_ATTEMPTS: u32 = 10;

/// Sessions joined with the workers and kept for a worker that loses its attachment.
pub const SPARE_SESSIONS: usize = 1;

/// The snapshot a run shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedSnapshot {
    /// Its number (`SNAPSHOT_NUMBER`).
    pub number: u64,
    /// The coordinator transaction's oldest interesting transaction: everything numbered below
    /// it committed before the snapshot was taken.
    pub oldest: u64,
    /// The coordinator's transaction, whose lock keeps the snapshot's record versions.
    pub coordinator: u64,
}

/// The refusal of snapshot consistency on a Firebird without shared snapshots.
pub fn shared_snapshot_unsupported(version: &str, target: &str) -> Error {
    Error::config(format!(
        "{target} runs Firebird {version}, which cannot share one snapshot between connections \
         (SET TRANSACTION SNAPSHOT AT NUMBER arrived in Firebird 4.0), so a parallel export \
         cannot be consistent as of one point. Re-run with --consistency chunk: each chunk is \
         then read in its own snapshot transaction and rows changed during the run may appear \
         in either state; --parallel 1 --chunk-by none makes every table one such chunk."
    ))
}

/// The failure to join every worker exactly after [`JOIN_ATTEMPTS`] snapshots.
fn joins_kept_failing(target: &str, workers: usize, late: JoinCheck) -> Error {
    let detail = match late {
        JoinCheck::Late {
            first,
            count,
            oldest,
        } => format!(
            " (last attempt: {count} transaction(s) from {first} on committed after the \
             snapshot and were already below a worker's oldest interesting transaction \
             {oldest})"
        ),
        JoinCheck::Exact => String::new(),
    };
    Error::source_transient(format!(
        "could not start {workers} session(s) on {target} that all see one snapshot: in each of \
         {JOIN_ATTEMPTS} attempts a transaction that was running when the snapshot was taken \
         committed before every session had joined it, and Firebird then shows that \
         transaction to the sessions that join afterwards{detail}. Re-run (this depends on \
         timing), lower --parallel, or use --consistency chunk."
    ))
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Start the coordinator transaction on `session` and, when `shared`, read what makes it a
/// shared snapshot.
async fn begin_coordinator(
    session: &Session,
    shared: bool,
    version: &str,
    display: &str,
) -> Result<Option<SharedSnapshot>> {
    let (version, d) = (version.to_string(), display.to_string());
    session
        .call(move |c| -> Result<Option<SharedSnapshot>> {
            c.begin(COORDINATOR_TRANSACTION)
                .map_err(|e| classify(e, Phase::Snapshot, &d))?;
            if !shared {
                return Ok(None);
            }
            let info = c
                .transaction_info()
                .map_err(|e| classify(e, Phase::Snapshot, &d))?;
            let number = info
                .snapshot_number
                .ok_or_else(|| shared_snapshot_unsupported(&version, &d))?;
            Ok(Some(SharedSnapshot {
                number,
                oldest: info.oldest,
                coordinator: info.id,
            }))
        })
        .await?
}

/// The coordinator session of one run.
pub struct FbCoordinator {
    target: FbTarget,
    tag: String,
    consistency: Consistency,
    session: Option<Session>,
    server: ServerInfo,
    /// Snapshot consistency: the snapshot the workers join.
    shared: Option<SharedSnapshot>,
    taken_at: String,
    /// Worker sessions attached by `reserve_readers` (the workers', then the spares); joined
    /// and checked in `pin_snapshot`.
    reserved: Vec<FbReader>,
    /// Joined sessions kept for workers that lose theirs.
    spares: Vec<FbReader>,
    /// Snapshots taken again because a join was not exact.
    retakes: u32,
    spares_used: usize,
}

impl FbCoordinator {
    /// Attach; start the planning transaction and, in snapshot consistency, read its number.
    pub async fn open(target: FbTarget, tag: String, consistency: Consistency) -> Result<Self> {
        let session = target.open(&tag).await?;
        let server = session.call(catalog::server_info).await??;
        let display = target.display().to_string();
        if consistency == Consistency::Snapshot && !server.has_shared_snapshots() {
            return Err(shared_snapshot_unsupported(&server.version, &display));
        }
        let shared = begin_coordinator(
            &session,
            consistency == Consistency::Snapshot,
            &server.version,
            &display,
        )
        .await?;
        Ok(FbCoordinator {
            target,
            tag,
            consistency,
            session: Some(session),
            server,
            shared,
            taken_at: now(),
            reserved: Vec::new(),
            spares: Vec::new(),
            retakes: 0,
            spares_used: 0,
        })
    }

    /// Server facts read at attach time.
    pub fn server(&self) -> &ServerInfo {
        &self.server
    }

    /// The snapshot the workers join (snapshot consistency), as it stands now: `pin_snapshot`
    /// may take it again.
    pub fn shared_snapshot(&self) -> Option<SharedSnapshot> {
        self.shared
    }

    fn session(&self) -> Result<&Session> {
        self.session.as_ref().ok_or_else(Error::session_released)
    }

    fn shared(&self) -> Result<SharedSnapshot> {
        self.shared
            .ok_or_else(|| Error::internal("snapshot consistency without a shared snapshot"))
    }

    /// Join every reserved session to the snapshot, back to back, then check each; the first
    /// inexact join is returned.
    async fn join_reserved(&mut self) -> Result<JoinCheck> {
        let snapshot = self.shared()?;
        for r in &mut self.reserved {
            r.join(snapshot).await?;
        }
        for r in &mut self.reserved {
            let check = r.check(snapshot).await?;
            if check != JoinCheck::Exact {
                return Ok(check);
            }
        }
        Ok(JoinCheck::Exact)
    }

    /// Every session leaves the snapshot; the coordinator takes a new one.
    async fn retake(&mut self) -> Result<()> {
        for r in &mut self.reserved {
            r.leave().await?;
        }
        let display = self.target.display().to_string();
        let version = self.server.version.clone();
        let session = self.session()?;
        session
            .call(|c| c.commit())
            .await?
            .map_err(|e| classify(e, Phase::Snapshot, &display))?;
        self.shared = begin_coordinator(session, true, &version, &display).await?;
        self.taken_at = now();
        self.retakes += 1;
        Ok(())
    }

    /// A new session in the snapshot, if it can join exactly.
    async fn join_new(&mut self) -> Result<FbReader> {
        let snapshot = self.shared()?;
        let mut r = FbReader::attach(&self.target, &self.tag, true).await?;
        r.join(snapshot).await?;
        match r.check(snapshot).await? {
            JoinCheck::Exact => Ok(r),
            JoinCheck::Late { first, oldest, .. } => Err(Error::source_permanent(format!(
                "a new session on {} cannot join snapshot number {} exactly: transaction {first} \
                 committed after the snapshot and is already below the session's oldest \
                 interesting transaction {oldest}, and Firebird would show it to that session \
                 only. Re-run with --resume to read the missing parts under a new snapshot.",
                self.target.display(),
                snapshot.number
            ))),
        }
    }
}

#[async_trait]
impl Coordinator for FbCoordinator {
    fn server_version(&self) -> String {
        format!("Firebird {}", self.server.version)
    }

    async fn discover(&mut self, selection: &Selection) -> Result<Vec<Dataset>> {
        let mut catalog = catalog::FbCatalog {
            session: self.session()?,
            server: &self.server,
        };
        sluice_core::select::discover(&mut catalog, selection).await
    }

    async fn plan_chunks(
        &mut self,
        dataset: &Dataset,
        request: &ChunkRequest,
    ) -> Result<Vec<Chunk>> {
        chunking::plan(self.session()?, dataset, request, &self.server).await
    }

    async fn reserve_readers(&mut self, n: usize) -> Result<()> {
        if self.consistency != Consistency::Snapshot {
            return Ok(());
        }
        while self.reserved.len() < n + SPARE_SESSIONS {
            self.reserved
                .push(FbReader::attach(&self.target, &self.tag, true).await?);
        }
        Ok(())
    }

    async fn pin_snapshot(&mut self, _datasets: &[Dataset]) -> Result<SnapshotInfo> {
        if self.consistency == Consistency::Snapshot {
            let mut attempt = 1;
            loop {
                let check = self.join_reserved().await?;
                if check == JoinCheck::Exact {
                    break;
                }
                if attempt == JOIN_ATTEMPTS {
                    return Err(joins_kept_failing(
                        self.target.display(),
                        self.reserved.len(),
                        check,
                    ));
                }
                tracing::debug!(
                    target: "sluice::snapshot",
                    "snapshot {:?}: a worker's join was not exact ({check:?}); taking a new one",
                    self.shared
                );
                self.retake().await?;
                attempt += 1;
            }
            let s = self.shared()?;
            return Ok(SnapshotInfo {
                id: Some(s.number.to_string()),
                position: Position::Firebird {
                    snapshot_number: s.number,
                },
                taken_at: self.taken_at.clone(),
            });
        }
        // Chunk consistency: the planning transaction is no longer needed; holding it would
        // hold back garbage collection for the whole run.
        let display = self.target.display().to_string();
        self.session()?
            .call(|c| c.commit())
            .await?
            .map_err(|e| classify(e, Phase::Snapshot, &display))?;
        Ok(SnapshotInfo {
            id: None,
            position: Position::Unknown,
            taken_at: now(),
        })
    }

    async fn open_readers(&mut self, n: usize) -> Result<Vec<Box<dyn ChunkReader>>> {
        let mut readers: Vec<Box<dyn ChunkReader>> = Vec::with_capacity(n);
        if self.consistency != Consistency::Snapshot {
            for _ in 0..n {
                readers.push(Box::new(
                    FbReader::attach(&self.target, &self.tag, false).await?,
                ));
            }
            return Ok(readers);
        }
        let mut joined = std::mem::take(&mut self.reserved).into_iter();
        for r in joined.by_ref().take(n) {
            readers.push(Box::new(r));
        }
        self.spares.extend(joined);
        while readers.len() < n {
            readers.push(Box::new(self.join_new().await?));
        }
        Ok(readers)
    }

    async fn reopen_reader(&mut self) -> Result<Box<dyn ChunkReader>> {
        if self.consistency != Consistency::Snapshot {
            return Ok(Box::new(
                FbReader::attach(&self.target, &self.tag, false).await?,
            ));
        }
        if let Some(spare) = self.spares.pop() {
            self.spares_used += 1;
            tracing::warn!(
                "a worker lost its Firebird session; it continues on a spare session of \
                 snapshot number {}",
                self.shared()?.number
            );
            return Ok(Box::new(spare));
        }
        let alive = match &self.session {
            Some(s) => matches!(
                s.call(|c| c.query("SELECT 1 FROM RDB$DATABASE", vec![]))
                    .await,
                Ok(Ok(_))
            ),
            None => false,
        };
        if !alive {
            return Err(Error::source_permanent(format!(
                "the coordinator attachment holding snapshot number {} on {} was lost, so a \
                 worker that lost its attachment cannot rejoin the snapshot. Re-run with \
                 --resume to finish the missing parts under a new snapshot, or use \
                 --consistency chunk.",
                self.shared()?.number,
                self.target.display()
            )));
        }
        Ok(Box::new(self.join_new().await?))
    }

    fn run_facts(&self) -> RunFacts {
        let mut notes = Vec::new();
        if self.retakes > 0 {
            notes.push(format!(
                "Firebird: the snapshot was taken {} more time(s) before every worker could \
                 join it exactly (a transaction running at the snapshot committed while the \
                 workers joined)",
                self.retakes
            ));
        }
        if self.spares_used > 0 {
            notes.push(format!(
                "{} worker session(s) lost and replaced by spare sessions of the same snapshot",
                self.spares_used
            ));
        }
        RunFacts {
            notes,
            ..RunFacts::default()
        }
    }

    async fn release(&mut self) -> Result<()> {
        self.reserved.clear();
        self.spares.clear();
        if let Some(s) = self.session.take() {
            // The transaction only read; ending it releases the snapshot.
            let _ = s.call(|c| c.commit()).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn firebird_3_refusal_names_the_fallback() {
        let e = shared_snapshot_unsupported("3.0.11", "firebird://h//db.fdb");
        assert_eq!(e.kind(), sluice_core::ErrorKind::Config);
        let m = e.to_string();
        assert!(m.contains("Firebird 3.0.11"), "{m}");
        assert!(m.contains("--consistency chunk"), "{m}");
    }
}
