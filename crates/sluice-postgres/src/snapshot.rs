//! The coordinator: one session that plans the run and holds the shared snapshot.
//!
//! In snapshot consistency the coordinator opens a REPEATABLE READ READ ONLY transaction and
//! exports its snapshot (`pg_export_snapshot()`) before it reads the catalog, so the schema it
//! describes is the schema as of the snapshot. It then takes ACCESS SHARE locks on the tables
//! (as pg_dump does): TRUNCATE and table rewrites are not MVCC-safe and would make an old
//! snapshot see an empty table; the lock makes them wait instead. Workers join with `SET
//! TRANSACTION SNAPSHOT`, and a worker that loses its connection can rejoin as long as the
//! coordinator still holds the snapshot. The coordinator is deliberately idle in transaction,
//! so it disables `idle_in_transaction_session_timeout` for its own session only.
//!
//! The position recorded is `pg_current_wal_lsn()` read in the same statement that exports the
//! snapshot: every transaction committed before the snapshot is at or before it. (An exact
//! snapshot LSN needs a replication slot; change data capture uses one.)

use crate::catalog::{self, ServerInfo};
use crate::chunking;
use crate::connect::PgTarget;
use crate::error::sqlstate;
use crate::error::{Phase, classify};
use crate::harm::exclusive_lockers;
use crate::read::PgReader;
use crate::sql::quote_table;
use crate::types::TypeMap;
use async_trait::async_trait;
use sluice_core::table::TableRef;
use sluice_core::{
    Chunk, ChunkReader, ChunkRequest, Consistency, Coordinator, Dataset, DatasetKind, Error,
    Position, Result, RunFacts, Selection, SnapshotInfo, SourceOptions,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio_postgres::Client;

/// The coordinator session of one run.
pub struct PgCoordinator {
    target: PgTarget,
    tag: String,
    consistency: Consistency,
    client: Option<Client>,
    server: ServerInfo,
    types: TypeMap,
    snapshot: Option<SnapshotInfo>,
    enable_row_security: bool,
    /// `relkind` of every relation discovered (objects and leaf partitions).
    relkinds: HashMap<TableRef, char>,
    /// Relations the workers lock with NOWAIT before reading (snapshot consistency).
    lockable: Arc<HashSet<TableRef>>,
    /// Values adjusted to fit their Arrow type, counted by the readers.
    findings: crate::decode::Findings,
}

impl PgCoordinator {
    /// The catalog over the coordinator's session (`display`: the target's).
    fn catalog<'a>(&'a mut self, display: &'a str) -> Result<catalog::PgCatalog<'a>> {
        let client = self.client.as_ref().ok_or_else(Error::session_released)?;
        Ok(catalog::PgCatalog {
            client,
            server: &self.server,
            types: &mut self.types,
            target: display,
            enable_row_security: self.enable_row_security,
            relkinds: &mut self.relkinds,
        })
    }

    /// Connect; in snapshot consistency, start the snapshot transaction and export it.
    pub async fn open(target: PgTarget, options: &SourceOptions) -> Result<Self> {
        Self::open_with(target, options, None).await
    }

    /// [`Self::open`], reading under `imported` (a snapshot exported by a replication slot,
    /// whose position is exact) instead of exporting a snapshot of its own: change capture
    /// hands its slot's snapshot to the export this way.
    pub async fn open_with(
        target: PgTarget,
        options: &SourceOptions,
        imported: Option<&SnapshotInfo>,
    ) -> Result<Self> {
        let tag = options.session_tag.clone();
        let consistency = options.consistency;
        let client = target.connect(&tag).await?;
        let display = target.display().to_string();
        let server = catalog::server_info(&client, &display).await?;
        let mut c = PgCoordinator {
            target,
            tag,
            consistency,
            client: Some(client),
            server,
            types: TypeMap::new(),
            snapshot: None,
            enable_row_security: options.enable_row_security,
            relkinds: HashMap::new(),
            lockable: Arc::new(HashSet::new()),
            findings: crate::decode::Findings::default(),
        };
        match imported {
            Some(info) if consistency == Consistency::Snapshot => c.import_snapshot(info).await?,
            _ if consistency == Consistency::Snapshot => c.export_snapshot().await?,
            _ => {}
        }
        Ok(c)
    }

    /// Server facts read at connect time.
    pub fn server(&self) -> &ServerInfo {
        &self.server
    }

    fn client(&self) -> Result<&Client> {
        self.client.as_ref().ok_or_else(Error::session_released)
    }

    fn lsn_sql(&self) -> &'static str {
        if self.server.in_recovery {
            "pg_last_wal_replay_lsn()::text"
        } else {
            "pg_current_wal_lsn()::text"
        }
    }

    async fn export_snapshot(&mut self) -> Result<()> {
        let display = self.target.display().to_string();
        let err = |e| classify(e, Phase::Snapshot, &display);
        let client = self.client()?;
        client
            .batch_execute(
                "SET idle_in_transaction_session_timeout = 0; \
                 BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            )
            .await
            .map_err(err)?;
        let row = client
            .query_one(
                &format!(
                    "SELECT pg_export_snapshot(), {}, \
                            to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
                    self.lsn_sql()
                ),
                &[],
            )
            .await
            .map_err(err)?;
        let lsn: Option<String> = row.get(1);
        self.snapshot = Some(SnapshotInfo {
            id: Some(row.get(0)),
            position: lsn
                .map(|lsn| Position::Postgres { lsn, exact: false })
                .unwrap_or(Position::Unknown),
            taken_at: row.get(2),
        });
        Ok(())
    }

    async fn import_snapshot(&mut self, info: &SnapshotInfo) -> Result<()> {
        let display = self.target.display().to_string();
        let id = info
            .id
            .as_deref()
            .ok_or_else(|| Error::internal("an imported snapshot without a name"))?;
        self.client()?
            .batch_execute(&format!(
                "SET idle_in_transaction_session_timeout = 0; \
                 BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; \
                 SET TRANSACTION SNAPSHOT {}",
                crate::sql::quote_literal(id)
            ))
            .await
            .map_err(|e| classify(e, Phase::Snapshot, &display))?;
        self.snapshot = Some(info.clone());
        Ok(())
    }

    async fn current_position(&self) -> Result<SnapshotInfo> {
        let display = self.target.display().to_string();
        let row = self
            .client()?
            .query_one(
                &format!(
                    "SELECT {}, to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
                    self.lsn_sql()
                ),
                &[],
            )
            .await
            .map_err(|e| classify(e, Phase::Snapshot, &display))?;
        let lsn: Option<String> = row.get(0);
        Ok(SnapshotInfo {
            id: None,
            position: lsn
                .map(|lsn| Position::Postgres { lsn, exact: false })
                .unwrap_or(Position::Unknown),
            taken_at: row.get(1),
        })
    }

    fn snapshot_id(&self) -> Option<String> {
        self.snapshot.as_ref().and_then(|s| s.id.clone())
    }

    /// A worker session on the run's snapshot `id` (none in chunk consistency).
    async fn reader(&self, id: Option<&str>) -> Result<PgReader> {
        PgReader::open(
            &self.target,
            &self.tag,
            id,
            Some(self.lockable.clone()),
            self.findings.clone(),
        )
        .await
    }
}

#[async_trait]
impl Coordinator for PgCoordinator {
    fn server_version(&self) -> String {
        self.server.version.clone()
    }

    async fn discover(&mut self, selection: &Selection) -> Result<Vec<Dataset>> {
        let display = self.target.display().to_string();
        sluice_core::select::discover(&mut self.catalog(&display)?, selection).await
    }

    async fn table_names(
        &mut self,
        selection: &Selection,
        captured: &[TableRef],
    ) -> Result<sluice_core::select::TablesNow> {
        let display = self.target.display().to_string();
        sluice_core::select::table_names(&mut self.catalog(&display)?, selection, captured).await
    }

    async fn plan_chunks(
        &mut self,
        dataset: &Dataset,
        request: &ChunkRequest,
    ) -> Result<Vec<Chunk>> {
        let (client, display) = (self.client()?, self.target.display());
        chunking::plan(client, dataset, request, &self.server, display).await
    }

    async fn pin_snapshot(&mut self, datasets: &[Dataset]) -> Result<SnapshotInfo> {
        if self.consistency == Consistency::Chunk {
            return self.current_position().await;
        }
        let display = self.target.display().to_string();
        let mut lock = Vec::new();
        let mut touch = Vec::new();
        for obj in datasets
            .iter()
            .filter(|d| d.kind != DatasetKind::Query)
            .filter_map(|d| d.object.as_ref())
        {
            match self.relkinds.get(obj) {
                Some('m' | 'f') => touch.push(obj.clone()),
                _ => lock.push(obj.clone()),
            }
        }
        let mut sql = String::from("SAVEPOINT sluice_lock; ");
        if !lock.is_empty() {
            let names: Vec<String> = lock.iter().map(quote_table).collect();
            sql.push_str(&format!(
                "LOCK TABLE {} IN ACCESS SHARE MODE; ",
                names.join(", ")
            ));
        }
        for t in &touch {
            sql.push_str(&format!("SELECT FROM {} WHERE false; ", quote_table(t)));
        }
        sql.push_str("RELEASE SAVEPOINT sluice_lock");
        if let Err(e) = self.client()?.batch_execute(&sql).await {
            let timed_out = sqlstate(&e) == Some("55P03");
            let mut err =
                classify(e, Phase::Snapshot, &display).context("locking the exported tables");
            if timed_out {
                let client = self.client()?;
                let _ = client
                    .batch_execute("ROLLBACK TO SAVEPOINT sluice_lock")
                    .await;
                let names: Vec<String> = lock.iter().chain(&touch).map(quote_table).collect();
                let who = exclusive_lockers(client, &names, &self.target.sessions(&self.tag)).await;
                if !who.is_empty() {
                    err = Error::new(
                        err.kind(),
                        err.retry(),
                        format!(
                            "{} In the way: {}.",
                            err.message(),
                            who.iter()
                                .map(|w| w.describe())
                                .collect::<Vec<_>>()
                                .join("; ")
                        ),
                    );
                }
            }
            return Err(err);
        }
        // Workers lock, without waiting, what LOCK TABLE accepts: the objects locked above and
        // their leaf partitions that are tables.
        let mut lockable: HashSet<TableRef> = lock.into_iter().collect();
        for d in datasets {
            for rel in &d.relations {
                if self.relkinds.get(&rel.table) == Some(&'r') {
                    lockable.insert(rel.table.clone());
                }
            }
        }
        self.lockable = Arc::new(lockable);
        self.snapshot
            .clone()
            .ok_or_else(|| Error::internal("snapshot consistency without a snapshot"))
    }

    async fn open_readers(&mut self, n: usize) -> Result<Vec<Box<dyn ChunkReader>>> {
        let id = self.snapshot_id();
        let opens = (0..n).map(|_| self.reader(id.as_deref()));
        let readers = futures_util::future::join_all(opens).await;
        readers
            .into_iter()
            .map(|r| r.map(|r| Box::new(r) as Box<dyn ChunkReader>))
            .collect()
    }

    async fn reopen_reader(&mut self) -> Result<Box<dyn ChunkReader>> {
        if self.consistency == Consistency::Snapshot {
            let alive = match &self.client {
                Some(c) => c.simple_query("SELECT 1").await.is_ok(),
                None => false,
            };
            if !alive {
                return Err(Error::source_permanent(format!(
                    "the coordinator session holding the export snapshot on {} was lost, so a \
                     worker that lost its connection cannot rejoin the snapshot. Re-run with \
                     --resume to finish the missing parts under a new snapshot, or use \
                     --consistency chunk.",
                    self.target.display()
                )));
            }
        }
        let id = self.snapshot_id();
        Ok(Box::new(self.reader(id.as_deref()).await?))
    }

    fn run_facts(&self) -> RunFacts {
        RunFacts {
            notes: self.findings.notes(),
            ..RunFacts::default()
        }
    }

    async fn release(&mut self) -> Result<()> {
        if let Some(client) = self.client.take()
            && self.consistency == Consistency::Snapshot
        {
            // The transaction only read; ending it releases the snapshot and the locks.
            let _ = client.batch_execute("COMMIT").await;
        }
        Ok(())
    }
}
