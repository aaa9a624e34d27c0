//! The coordinator: plans the run and starts every worker's transaction on one snapshot.
//!
//! MySQL and MariaDB cannot export a snapshot for other sessions to join. Workers see the same
//! data only if they all begin `START TRANSACTION WITH CONSISTENT SNAPSHOT` while no transaction
//! can commit. So, in snapshot consistency:
//!
//! 1. `reserve_readers(n)`: the worker sessions (and a spare) are connected (outside any lock)
//!    and set to REPEATABLE READ — connecting is the slow part and must not happen under the
//!    lock.
//! 2. `pin_snapshot`: the long-query guard looks for statements that would make the lock wait
//!    (refusing, or waiting a bounded time for them, without holding anything), then the
//!    briefest lock that stops commits is taken with a bounded wait (`lock.rs`) —
//!    - MariaDB ≥ 10.4: `BACKUP STAGE START; BACKUP STAGE BLOCK_COMMIT` (commits and binary log
//!      writes wait; running queries and even long SELECTs do not, unlike FLUSH TABLES WITH READ
//!      LOCK, which on MySQL must wait for every running statement to close its tables);
//!    - MySQL, older MariaDB: `FLUSH TABLES WITH READ LOCK` (MySQL 8's `LOCK INSTANCE FOR
//!      BACKUP` only blocks DDL, not commits, so it cannot line snapshots up);
//!
//!    then every worker runs `START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY` (all at
//!    once), the GTID position is read, and the lock is released. The wait (sending the lock
//!    statement until it returns) and the hold (until the release returns) are measured apart
//!    and reported. With nothing left to read (a resumed run whose parts are all done) no lock
//!    is taken: the position is read as in chunk consistency.
//! 3. The binary log position is each worker's own `binlog_snapshot_file/position` on MariaDB
//!    (exact for its snapshot, no privilege needed); all workers must report the same one, which
//!    is checked — a cheap proof that they share one snapshot. On MySQL it is `SHOW MASTER
//!    STATUS` (`SHOW BINARY LOG STATUS` from 8.2) read under the lock.
//!
//! No snapshot can be joined after it was taken, so one spare session ([`SPARE_SESSIONS`])
//! begins its snapshot under the same lock and waits, idle: a worker that loses its session
//! (killed, network cut) continues on the spare and retries its chunk under the very same
//! snapshot. Once the spares are used up, `reopen_reader` fails permanently with advice:
//! `--resume` finishes the missing parts under a new snapshot (each part is exactly one key
//! range, read once), or `--consistency chunk`.
//!
//! **Metadata locks.** A snapshot transaction holds a shared metadata lock on every table it has
//! read until it ends, at the end of the run (no further locks are taken on purpose). A DDL on
//! such a table (`ALTER`, `TRUNCATE`, `RENAME`) waits until the run ends, and every later query
//! on that table queues behind the waiting DDL; the harm probe counts those sessions and the
//! report names them (`harm.rs`). A table altered *before* a worker first reads it fails that
//! read with error 1412 instead, which says to `--resume`.
//!
//! **Non-transactional tables** (MyISAM, Aria, MEMORY) are not covered by a consistent
//! snapshot: they are marked `outside_snapshot`, or held under read locks for the run with
//! `--lock-non-transactional` (`non_transactional.rs`).

use crate::catalog::{self, Flavor, ServerInfo};
use crate::chunking;
use crate::connect::{MyTarget, Sessions};
use crate::error::{Phase, classify};
use crate::lock::{self, LockMethod, LockStats, Locking};
use crate::non_transactional::NonTransactional;
use crate::read::{Findings, MyReader, ReaderSetup};
use async_trait::async_trait;
use futures_util::future::join_all;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::{
    Chunk, ChunkReader, ChunkRequest, Consistency, Coordinator, Dataset, Error, Position, Result,
    RunFacts, Selection, SnapshotInfo,
};
use std::collections::HashMap;
use std::time::Instant;

/// Sessions started on the shared snapshot beyond the workers, to replace a worker's lost
/// session without leaving the snapshot. Each costs one idle connection for the run.
pub const SPARE_SESSIONS: usize = 1;

/// The coordinator session of one run.
pub struct MyCoordinator {
    target: MyTarget,
    sessions: Sessions,
    consistency: Consistency,
    conn: Option<Conn>,
    server: ServerInfo,
    split_keys: HashMap<String, Vec<String>>,
    datasets: Vec<Dataset>,
    reserved: Vec<Conn>,
    locking: Locking,
    lock: Option<LockStats>,
    /// Tables in engines without transactions.
    non_transactional: NonTransactional,
    /// Whether this account could be checked to see other users' statements.
    sees_all: Option<bool>,
    spares_used: usize,
    findings: Findings,
}

impl MyCoordinator {
    /// The catalog over the coordinator's session (`display`, `db`: the target's).
    fn catalog<'a>(&'a mut self, display: &'a str, db: &'a str) -> Result<catalog::MyCatalog<'a>> {
        let conn = self.conn.as_mut().ok_or_else(Error::session_released)?;
        Ok(catalog::MyCatalog {
            conn,
            server: &self.server,
            default_db: db,
            target: display,
            split_keys: &mut self.split_keys,
            non_transactional: &mut self.non_transactional,
        })
    }

    /// Connect and read what the server is. `locking` bounds every lock wait of the run's
    /// sessions and guards the global lock.
    pub async fn open(
        target: MyTarget,
        sessions: Sessions,
        consistency: Consistency,
        locking: Locking,
    ) -> Result<Self> {
        let mut conn = target.connect(&sessions).await?;
        let server = catalog::server_info(&mut conn, target.display()).await?;
        conn.query_drop(locking.session_sql())
            .await
            .map_err(|e| classify(e, Phase::Connect, target.display()))?;
        Ok(MyCoordinator {
            target,
            sessions,
            consistency,
            conn: Some(conn),
            server,
            split_keys: HashMap::new(),
            datasets: Vec::new(),
            reserved: Vec::new(),
            locking,
            lock: None,
            non_transactional: NonTransactional::new(locking.lock_non_transactional),
            sees_all: None,
            spares_used: 0,
            findings: Findings::default(),
        })
    }

    /// Server facts read at connect time.
    pub fn server(&self) -> &ServerInfo {
        &self.server
    }

    fn conn(&mut self) -> Result<&mut Conn> {
        self.conn.as_mut().ok_or_else(Error::session_released)
    }

    fn reader(&self, conn: Conn) -> MyReader {
        MyReader::new(
            conn,
            ReaderSetup {
                target: self.target.display().to_string(),
                protocol: self.target.protocol,
                zero_dates: self.target.zero_dates,
                findings: self.findings.clone(),
                sessions: self.sessions.clone(),
                snapshot: self.consistency == Consistency::Snapshot,
                lock_wait_seconds: self.locking.wait_seconds(),
                non_transactional: self.non_transactional.names(),
                high_priority: self.non_transactional.locked(),
            },
        )
    }

    /// Open `n` reader sessions in parallel, each with the run's lock wait bound and, for a
    /// snapshot, REPEATABLE READ.
    async fn connect_many(&self, n: usize) -> Result<Vec<Conn>> {
        let display = self.target.display();
        let mut setup = vec![self.locking.session_sql()];
        if self.consistency == Consistency::Snapshot {
            setup.push("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ".into());
        }
        let setup = setup.join("; ");
        join_all((0..n).map(|_| async {
            let mut c = self.target.connect(&self.sessions).await?;
            c.query_drop(setup.as_str())
                .await
                .map_err(|e| classify(e, Phase::Connect, display))?;
            Ok(c)
        }))
        .await
        .into_iter()
        .collect()
    }

    /// The binary log position now (MySQL: `SHOW [MASTER | BINARY LOG] STATUS`), or `None`
    /// without binary logging or without the privilege to read it.
    async fn master_status(&mut self) -> Option<Position> {
        let sql = if self.server.flavor == Flavor::Mysql && self.server.at_least((8, 2, 0)) {
            "SHOW BINARY LOG STATUS"
        } else {
            "SHOW MASTER STATUS"
        };
        let row: Row = self.conn().ok()?.query_first(sql).await.ok()??;
        let file = catalog::text(&row, 0);
        if file.is_empty() {
            return None;
        }
        let gtid = (row.len() > 4)
            .then(|| catalog::text(&row, 4))
            .filter(|g| !g.trim().is_empty());
        Some(Position::Mysql {
            file,
            pos: catalog::number(&row, 1),
            gtid,
        })
    }

    /// Position of an open consistent-snapshot transaction on MariaDB (exact, unprivileged).
    async fn snapshot_position(conn: &mut Conn) -> Result<Option<(String, u64)>> {
        let rows: Vec<Row> = conn
            .query("SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
            .await
            .map_err(|e| classify(e, Phase::Snapshot, "the snapshot"))?;
        let get = |k: &str| {
            rows.iter()
                .find(|r| catalog::text(r, 0).eq_ignore_ascii_case(k))
                .map(|r| catalog::text(r, 1))
        };
        Ok(
            match (get("binlog_snapshot_file"), get("binlog_snapshot_position")) {
                (Some(f), Some(p)) if !f.is_empty() => Some((f, p.parse().unwrap_or(0))),
                _ => None,
            },
        )
    }

    fn now() -> String {
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    }

    /// Guard, lock, start every reserved session's snapshot, read the GTID position, unlock.
    async fn lock_and_start(&mut self) -> Result<(Option<String>, Option<Position>)> {
        let display = self.target.display().to_string();
        let method = LockMethod::for_server(&self.server);
        let mariadb = self.server.flavor == Flavor::Mariadb;
        let ours = self.sessions.ids();
        let (server, locking) = (self.server.clone(), self.locking);
        let conn = self.conn()?;
        if locking.long_query_guard.is_some() {
            let sees_all = lock::sees_all_sessions(conn).await;
            self.sees_all = Some(sees_all);
        }
        let conn = self.conn()?;
        let request = lock::LockRequest {
            server: &server,
            method,
            locking: &locking,
            ours: &ours,
            target: &display,
        };
        let guarded = request.guard(conn).await?;
        let wait = request.take(conn).await?;
        let granted = Instant::now();
        let mut reserved = std::mem::take(&mut self.reserved);
        // Under the lock: every worker begins its snapshot, all at once, and the
        // non-transactional tables are locked if asked.
        let (begun, table_locks) = futures_util::join!(
            join_all(reserved.iter_mut().map(|c| {
                c.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            }),),
            self.non_transactional.lock(&self.sessions, &display)
        );
        let gtid_sql = if mariadb {
            "SELECT @@gtid_binlog_pos"
        } else {
            "SELECT @@gtid_executed"
        };
        let conn = self.conn()?;
        let gtid: std::result::Result<Option<String>, _> = conn.query_first(gtid_sql).await;
        let status = if mariadb {
            None
        } else {
            self.master_status().await
        };
        let conn = self.conn()?;
        let released = conn.query_drop(method.release()).await;
        let held = granted.elapsed();
        self.reserved = reserved;
        released.map_err(|e| classify(e, Phase::Snapshot, &display))?;
        table_locks?;
        for b in begun {
            b.map_err(|e| classify(e, Phase::Snapshot, &display))?;
        }
        let gtid = gtid.ok().flatten().filter(|g| !g.trim().is_empty());
        self.lock = Some(LockStats {
            method,
            guarded,
            wait,
            held,
            sessions: self.reserved.len(),
        });
        Ok((gtid, status))
    }

    /// The position now, without a lock: a momentary consistent snapshot on MariaDB (exact and
    /// unprivileged), the binary log status on MySQL.
    async fn position_now(&mut self) -> Option<Position> {
        if self.server.flavor == Flavor::Mariadb {
            let conn = self.conn().ok()?;
            let _ = conn
                .query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                .await;
            let p = Self::snapshot_position(conn).await.ok().flatten();
            let _ = conn.query_drop("COMMIT").await;
            p.map(|(file, pos)| Position::Mysql {
                file,
                pos,
                gtid: None,
            })
        } else {
            self.master_status().await
        }
    }
}

#[async_trait]
impl Coordinator for MyCoordinator {
    fn server_version(&self) -> String {
        self.server.display.clone()
    }

    async fn discover(&mut self, selection: &Selection) -> Result<Vec<Dataset>> {
        let (display, db) = (self.target.display().to_string(), self.target.database());
        let db = db.to_string();
        let datasets =
            sluice_core::select::discover(&mut self.catalog(&display, &db)?, selection).await?;
        self.datasets = datasets.clone();
        Ok(datasets)
    }

    async fn table_names(
        &mut self,
        selection: &Selection,
        captured: &[sluice_core::table::TableRef],
    ) -> Result<sluice_core::select::TablesNow> {
        let (display, db) = (self.target.display().to_string(), self.target.database());
        let db = db.to_string();
        sluice_core::select::table_names(&mut self.catalog(&display, &db)?, selection, captured)
            .await
    }

    async fn plan_chunks(
        &mut self,
        dataset: &Dataset,
        request: &ChunkRequest,
    ) -> Result<Vec<Chunk>> {
        let display = self.target.display().to_string();
        let key = self
            .split_keys
            .get(&dataset.name)
            .cloned()
            .unwrap_or_default();
        chunking::plan(self.conn()?, dataset, &key, request, &display).await
    }

    async fn reserve_readers(&mut self, n: usize) -> Result<()> {
        if self.consistency != Consistency::Snapshot {
            return Ok(());
        }
        self.reserved = self.connect_many(n + SPARE_SESSIONS).await?;
        let setup = self.locking.session_sql();
        self.non_transactional
            .prepare(&self.target, &self.sessions, &setup)
            .await
    }

    async fn pin_snapshot(&mut self, datasets: &[Dataset]) -> Result<SnapshotInfo> {
        // No table locks: see the module documentation (DDL fails the readers loudly instead).
        let _ = datasets;
        // No reserved reader in snapshot consistency means nothing is left to read (a resumed
        // run whose parts are all written, finishing its merge or manifest): no worker needs
        // lining up, so no global lock is taken.
        if self.consistency == Consistency::Chunk || self.reserved.is_empty() {
            if self.consistency == Consistency::Snapshot {
                tracing::info!("nothing left to read: no global lock taken");
            }
            let position = self.position_now().await;
            return Ok(SnapshotInfo {
                id: None,
                position: position.unwrap_or(Position::Unknown),
                taken_at: Self::now(),
            });
        }
        let taken_at = Self::now();
        let (gtid, status) = self.lock_and_start().await?;
        let held = self.lock.as_ref().map(|l| l.held).unwrap_or_default();
        self.sessions.set_snapshot(Some(Instant::now() - held));
        let position = if self.server.flavor == Flavor::Mariadb {
            let mut seen = Vec::new();
            for c in self.reserved.iter_mut() {
                seen.push(Self::snapshot_position(c).await?);
            }
            if seen.windows(2).any(|w| w[0] != w[1]) {
                return Err(Error::internal(format!(
                    "the workers' snapshots do not share one binary log position ({seen:?}) \
                     although they began under {}",
                    LockMethod::for_server(&self.server).name()
                )));
            }
            match seen.into_iter().next().flatten() {
                Some((file, pos)) => Position::Mysql { file, pos, gtid },
                None => Position::Unknown,
            }
        } else {
            status.unwrap_or(Position::Unknown)
        };
        tracing::info!(
            "snapshot of {} taken: global lock held {:.1} ms, position {position}",
            self.target.display(),
            held.as_secs_f64() * 1000.0
        );
        self.non_transactional.warn();
        Ok(SnapshotInfo {
            id: None,
            position,
            taken_at,
        })
    }

    async fn open_readers(&mut self, n: usize) -> Result<Vec<Box<dyn ChunkReader>>> {
        let conns = if self.consistency == Consistency::Snapshot {
            if self.reserved.len() < n {
                return Err(Error::internal(format!(
                    "{n} readers asked for, {} reserved under the snapshot",
                    self.reserved.len()
                )));
            }
            self.reserved.drain(..n).collect()
        } else {
            self.connect_many(n).await?
        };
        Ok(conns
            .into_iter()
            .map(|c| Box::new(self.reader(c)) as Box<dyn ChunkReader>)
            .collect())
    }

    async fn reopen_reader(&mut self) -> Result<Box<dyn ChunkReader>> {
        if self.consistency == Consistency::Snapshot {
            // A spare began its transaction under the lock with the workers: same snapshot.
            if let Some(conn) = self.reserved.pop() {
                self.spares_used += 1;
                tracing::info!(
                    "a worker lost its session; it continues on a spare session of the same \
                     snapshot"
                );
                return Ok(Box::new(self.reader(conn)));
            }
            return Err(Error::source_permanent(format!(
                "a worker lost its session on {}, no spare session of the snapshot is left, and \
                 MySQL/MariaDB cannot join a consistent snapshot after it was taken. The parts \
                 already written are kept: run the same command again with --resume to read the \
                 missing parts under a new snapshot (the manifest records which snapshot each \
                 part comes from), or use --consistency chunk, where a lost session is simply \
                 replaced.",
                self.target.display()
            )));
        }
        let conn = self.connect_many(1).await?.remove(0);
        Ok(Box::new(self.reader(conn)))
    }

    fn run_facts(&self) -> RunFacts {
        let mut notes = Vec::new();
        if let Some(l) = &self.lock {
            notes.extend(l.notes(&self.locking));
        }
        if self.sees_all == Some(false) {
            notes.push(
                "the long-query guard saw only this user's statements: seeing other users' \
                 needs the PROCESS privilege (GRANT PROCESS ON *.* TO …)"
                    .into(),
            );
        }
        let (nt_notes, outside_snapshot) = self
            .non_transactional
            .facts(self.consistency == Consistency::Snapshot);
        notes.extend(nt_notes);
        notes.extend(self.sessions.locks(|b| b.notes()).unwrap_or_default());
        if self.spares_used > 0 {
            notes.push(format!(
                "{} worker session(s) lost and replaced by spare sessions of the same snapshot",
                self.spares_used
            ));
        }
        notes.extend(self.findings.notes(&self.datasets));
        RunFacts {
            global_lock_held: self.lock.as_ref().map(|l| l.held),
            global_lock_wait: self.lock.as_ref().map(|l| l.wait),
            outside_snapshot,
            notes,
        }
    }

    async fn release(&mut self) -> Result<()> {
        self.non_transactional.release(&self.sessions).await;
        self.sessions.set_snapshot(None);
        self.reserved.clear();
        if let Some(conn) = self.conn.take() {
            let _ = conn.disconnect().await;
        }
        Ok(())
    }
}
