//! The coordinator: one attachment that plans the run and holds the shared snapshot.
//!
//! In snapshot consistency the coordinator starts a READ ONLY SNAPSHOT (concurrency)
//! transaction and reads its number, `RDB$GET_CONTEXT('SYSTEM', 'SNAPSHOT_NUMBER')`, before it
//! reads the catalog, so the schema it describes is the one the workers see. Each worker
//! starts its transaction with `SET TRANSACTION … SNAPSHOT AT NUMBER n` and sees exactly what
//! the coordinator sees; a worker that lost its attachment rejoins the same way, as long as
//! the coordinator's transaction (which keeps that snapshot alive) is open. The coordinator
//! holds it until `release`.
//!
//! Firebird 3 has neither snapshot numbers nor `MAKE_DBKEY`: snapshot consistency is refused
//! there with a message naming `--consistency chunk`, in which every chunk reads in its own
//! snapshot transaction (consistent per chunk, not across chunks) and tables are split by key.

use crate::catalog::{self, ServerInfo};
use crate::chunking;
use crate::connect::{FbTarget, Session, as_i64};
use crate::error::{Phase, classify};
use crate::read::FbReader;
use async_trait::async_trait;
use sluice_core::{
    Chunk, ChunkReader, ChunkRequest, Consistency, Coordinator, Dataset, Error, Position, Result,
    Selection, SnapshotInfo,
};
use std::collections::HashSet;

/// The transaction the coordinator plans in (and, in snapshot consistency, shares).
const COORDINATOR_TRANSACTION: &str = "SET TRANSACTION READ ONLY ISOLATION LEVEL SNAPSHOT";

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

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The coordinator session of one run.
pub struct FbCoordinator {
    target: FbTarget,
    tag: String,
    consistency: Consistency,
    session: Option<Session>,
    server: ServerInfo,
    snapshot: Option<SnapshotInfo>,
    number: Option<u64>,
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
        let shared = consistency == Consistency::Snapshot;
        let version = server.version.clone();
        let d = display.clone();
        let number = session
            .call(move |c| -> Result<Option<u64>> {
                c.begin(COORDINATOR_TRANSACTION)
                    .map_err(|e| classify(e, Phase::Snapshot, &d))?;
                if !shared {
                    return Ok(None);
                }
                let rows = c
                    .query(
                        "SELECT RDB$GET_CONTEXT('SYSTEM', 'SNAPSHOT_NUMBER') FROM RDB$DATABASE",
                        vec![],
                    )
                    .map_err(|e| {
                        if e.to_string().contains("SNAPSHOT_NUMBER") {
                            shared_snapshot_unsupported(&version, &d)
                        } else {
                            classify(e, Phase::Snapshot, &d)
                        }
                    })?;
                rows.first()
                    .and_then(|r| r.first())
                    .and_then(as_i64)
                    .map(|n| Some(n as u64))
                    .ok_or_else(|| Error::internal("SNAPSHOT_NUMBER was empty"))
            })
            .await??;
        let snapshot = number.map(|n| SnapshotInfo {
            id: Some(n.to_string()),
            position: Position::Firebird { snapshot_number: n },
            taken_at: now(),
        });
        Ok(FbCoordinator {
            target,
            tag,
            consistency,
            session: Some(session),
            server,
            snapshot,
            number,
        })
    }

    /// Server facts read at attach time.
    pub fn server(&self) -> &ServerInfo {
        &self.server
    }

    fn session(&self) -> Result<&Session> {
        self.session
            .as_ref()
            .ok_or_else(|| Error::internal("the coordinator session was already released"))
    }
}

#[async_trait]
impl Coordinator for FbCoordinator {
    fn server_version(&self) -> String {
        format!("Firebird {}", self.server.version)
    }

    async fn discover(&mut self, selection: &Selection) -> Result<Vec<Dataset>> {
        if let Some(q) = selection.queries.first() {
            return Err(Error::config(format!(
                "--query {:?}: queries are not supported on Firebird sources yet; create a view \
                 and export it with --table.",
                q.name
            )));
        }
        let selection = selection.clone();
        let server = self.server.clone();
        let display = self.target.display().to_string();
        self.session()?
            .call(move |c| {
                let mut objects = Vec::new();
                for name in &selection.tables {
                    objects.push(catalog::resolve_name(c, name)?);
                }
                let many = catalog::resolve_many(c, &selection)?;
                if many.is_empty() && selection.tables.is_empty() {
                    return Err(Error::config(format!(
                        "no table in {display} matches --tables {:?}. List the tables with \
                         SELECT RDB$RELATION_NAME FROM RDB$RELATIONS WHERE RDB$SYSTEM_FLAG = 0 \
                         and adjust the pattern (it must match the whole name; unquoted names \
                         are upper case).",
                        selection.patterns
                    )));
                }
                objects.extend(many);
                let mut seen = HashSet::new();
                let mut out = Vec::new();
                for o in objects {
                    if seen.insert(o.id) {
                        out.push(catalog::describe(c, &o, &server)?);
                    }
                }
                Ok(out)
            })
            .await?
    }

    async fn plan_chunks(
        &mut self,
        dataset: &Dataset,
        request: &ChunkRequest,
    ) -> Result<Vec<Chunk>> {
        let ds = dataset.clone();
        let req = request.clone();
        let server = self.server.clone();
        self.session()?
            .call(move |c| chunking::plan(c, &ds, &req, &server))
            .await?
    }

    async fn pin_snapshot(&mut self, _datasets: &[Dataset]) -> Result<SnapshotInfo> {
        if let Some(s) = &self.snapshot {
            return Ok(s.clone());
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
        for _ in 0..n {
            readers.push(Box::new(
                FbReader::open(&self.target, &self.tag, self.number).await?,
            ));
        }
        Ok(readers)
    }

    async fn reopen_reader(&mut self) -> Result<Box<dyn ChunkReader>> {
        if self.consistency == Consistency::Snapshot {
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
                    self.number.unwrap_or(0),
                    self.target.display()
                )));
            }
        }
        Ok(Box::new(
            FbReader::open(&self.target, &self.tag, self.number).await?,
        ))
    }

    async fn release(&mut self) -> Result<()> {
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
