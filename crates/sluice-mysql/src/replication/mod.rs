//! Change capture from the MySQL/MariaDB binary log (row-based).
//!
//! | file         | what it does                                                          |
//! |--------------|-----------------------------------------------------------------------|
//! | `conn.rs`    | the replica session: register, `COM_BINLOG_DUMP`, heartbeats, errors  |
//! | `binlog.rs`  | positions (`_pos`), MariaDB GTID events, statement kinds              |
//! | `gtid.rs`    | GTID state kept with restart positions, for resuming by GTID          |
//! | `values.rs`  | binary log values → the export's Arrow values                         |
//! | `server.rs`  | checks, binary log status, what a stream costs the server            |
//! | `stream.rs`  | events → changes in the runner's column builders                      |
//!
//! The hand-off: MySQL and MariaDB cannot hand a snapshot to other sessions, so the export
//! takes its own consistent snapshot as it always does (workers start `START TRANSACTION WITH
//! CONSISTENT SNAPSHOT` under a brief global lock) and records the binary log position read
//! under that lock — MariaDB's `binlog_snapshot_file/position` of the workers' snapshot, MySQL's
//! `SHOW MASTER STATUS` while commits are blocked — which is exact: the snapshot holds every
//! transaction written to the binary log before it and none after. The stream starts at the
//! position read when it was created, before the export, and keeps a table's changes from its
//! snapshot's position on ([`ChangeSource::manifest_position`]); see `sluice-stream`'s
//! `snapshot.rs` for why that is exact, also for a resumed snapshot.
//!
//! Nothing is created on the server: the position lives in the stream state only, and the
//! server keeps binary log files by age, not for this reader — a stream stopped for longer than
//! `binlog_expire_logs_seconds` loses its place (the error says how to start over).
//!
//! Resuming: from the saved file and offset when this server still has that file and (where
//! GTIDs are on) the file and offset still mean the saved GTID state (MariaDB
//! `BINLOG_GTID_POS`; MySQL: the same `server_uuid`); otherwise, where the saved position has a
//! GTID state, from that state (MariaDB `@slave_connect_state`, MySQL `COM_BINLOG_DUMP_GTID`):
//! the saved file was purged after the stream had read it, or the server is another one, such
//! as a replica promoted after a failover (it must log its replicated transactions:
//! `log_slave_updates`). Positions read after such a resume are of another log: they start a
//! new epoch (`binlog.rs`) so text order stays log order. Without a GTID state, or when the
//! server no longer has the transactions after it, the stream stops with the purged-log error
//! that says how to start over.
//!
//! The replica server id: `--server-id`, or by default a random one per session in
//! 4026531840–4294967294 (the integers of the reserved IPv4 block 240.0.0.0/4, which no
//! IP-derived replica id uses; hand-picked ids are small). A new id per session: a session that
//! registers with the id of a live one makes the server end the older one, and a restarted
//! stream's previous session (of a killed process) ends by itself when the server sees its
//! socket closed.
//!
//! Length: about 580 lines: the `ChangeSource` implementation, method by method (checks,
//! positions, resume by GTID, harm, keys); the event decoding lives in `stream.rs` and the
//! server checks in `server.rs`.

pub mod binlog;
pub mod conn;
pub mod gtid;
pub mod json;
pub mod rows;
pub mod server;
pub mod stream;
pub mod table_map;
pub mod values;
pub mod xa;

use crate::catalog::{Flavor, ServerInfo, server_info};
use crate::connect::{MyTarget, Sessions};
use crate::lock::Locking;
use async_trait::async_trait;
use binlog::{BinPos, Restart};
use conn::Start;
use futures_util::StreamExt;
use gtid::GtidState;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use sluice_core::apply::Engine;
use sluice_core::change::{
    BadValuePolicy, BadValues, CaptureHarm, CaptureNames, ChangeSource, ChangeStream, Created,
    Handoff,
};
use sluice_core::{Dataset, Error, Position, Result, SnapshotInfo, Source, StreamPos};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `wait_timeout` of the stream's sessions: a year, the server's maximum.
const IDLE_LIMIT_SECS: u64 = 31_536_000;

/// Where default replica server ids are taken from.
pub const SERVER_ID_RANGE: RangeInclusive<u32> = 4_026_531_840..=4_294_967_294;

/// A random replica server id in [`SERVER_ID_RANGE`].
pub fn random_server_id() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    let span = (*SERVER_ID_RANGE.end() - *SERVER_ID_RANGE.start()) as u64 + 1;
    *SERVER_ID_RANGE.start() + (h.finish() % span) as u32
}

/// A MySQL or MariaDB server as a change source.
#[derive(Clone)]
pub struct MyCapture {
    target: MyTarget,
    bad_values: BadValuePolicy,
    sessions: Sessions,
    locking: Locking,
    server_id: Option<u32>,
    confirmed: Arc<Mutex<Option<BinPos>>>,
    /// The epoch of the positions of the stream opened last (`binlog.rs`).
    epoch: Arc<AtomicU32>,
    probe: Arc<tokio::sync::Mutex<Option<(Conn, ServerInfo)>>>,
    /// Column facts as this process last read them, for its streams (`stream::FactsCache`).
    facts: stream::FactsCache,
}

impl std::fmt::Debug for MyCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        sluice_core::redact::debug_handle(f, "MyCapture", &self.target)
    }
}

/// Where and how an opened stream starts.
struct ResumePoint {
    start: Start,
    from: BinPos,
    gtid: Option<GtidState>,
    server_uuid: Option<String>,
}

impl MyCapture {
    /// Parse the URL; no connection is made yet. `server_id`: `--server-id`, else a random one
    /// per session.
    pub fn new(url: &str, server_id: Option<u32>) -> Result<Self> {
        if server_id == Some(0) {
            return Err(Error::config(
                "--server-id 0 is not a replica id (MySQL and MariaDB refuse it): pass 1 to \
                 4294967295, different from the server's own and every replica's",
            ));
        }
        Ok(MyCapture {
            target: MyTarget::parse(url)?,
            bad_values: BadValuePolicy::default(),
            sessions: Sessions::default(),
            locking: Locking::default(),
            server_id,
            confirmed: Arc::default(),
            epoch: Arc::default(),
            probe: Arc::default(),
            facts: Arc::default(),
        })
    }

    /// What the streams do with a value they cannot write (`--bad-values`).
    pub fn with_bad_values(mut self, policy: BadValues) -> Self {
        self.bad_values.policy = policy;
        self
    }

    /// Bound the initial snapshot's lock waits and guard its global lock (as for export).
    pub fn with_locking(mut self, locking: Locking) -> Self {
        self.locking = locking;
        self
    }

    fn display(&self) -> &str {
        self.target.display()
    }

    fn server_id(&self) -> u32 {
        self.server_id.unwrap_or_else(random_server_id)
    }

    /// A session of the stream: the catalog's (idle until a DDL in the log names a captured
    /// table) and the probe's. The server's `wait_timeout` would end them while the stream has
    /// nothing to do, so they set their own (the dump session is busy in its command, which
    /// that limit does not apply to, and heartbeats keep its socket in use).
    async fn session(&self) -> Result<(Conn, ServerInfo)> {
        let mut conn = self.target.connect(&self.sessions).await?;
        conn.query_drop(format!("SET SESSION wait_timeout = {IDLE_LIMIT_SECS}"))
            .await
            .map_err(|e| crate::error::classify(e, crate::error::Phase::Connect, self.display()))?;
        let server = server_info(&mut conn, self.display()).await?;
        Ok((conn, server))
    }

    /// The server's `binlog_row_image` (what a new session logs), upper case.
    async fn row_image(&self) -> Result<String> {
        let (mut conn, _) = self.session().await?;
        let vars = server::variables(&mut conn, self.display()).await?;
        Ok(vars
            .get("binlog_row_image")
            .map(|s| s.to_ascii_uppercase())
            .unwrap_or_default())
    }

    async fn position_now(&self) -> Result<BinPos> {
        let mut g = self.probe.lock().await;
        if g.is_none() {
            *g = Some(self.session().await?);
        }
        let (conn, server) = g
            .as_mut()
            .ok_or_else(|| Error::internal("no probe session"))?;
        match server::master_status(conn, server, self.target.display()).await {
            Ok((file, pos)) => BinPos::of_file(&file, pos).map(|p| BinPos {
                epoch: self.epoch.load(Ordering::Relaxed),
                ..p
            }),
            Err(e) => {
                *g = None;
                Err(e)
            }
        }
    }

    /// Where a stream saved at `saved` starts on this server (see the module documentation).
    async fn resume_point(
        &self,
        conn: &mut Conn,
        server: &ServerInfo,
        saved: &Restart,
        base: &str,
        end_file: &str,
        end: u64,
    ) -> Result<ResumePoint> {
        let display = self.display();
        let mariadb = server.flavor == Flavor::Mariadb;
        let file = binlog::file_name(base, saved.pos.seq);
        let present = server::binary_logs(conn, display)
            .await?
            .iter()
            .any(|(n, _)| *n == file);
        let parse = |g: &str| match mariadb {
            true => GtidState::parse_mariadb(g),
            false => GtidState::parse_mysql(g),
        };
        let saved_gtid = saved.gtid.as_deref().map(parse).transpose()?;
        // The GTID state at the saved coordinate on this server, and this server's identity.
        let (here, server_uuid) = if mariadb {
            let here = match present {
                true => server::gtid_at(conn, &file, saved.pos.offset, display).await?,
                false => None,
            };
            (here.as_deref().map(parse).transpose()?, None)
        } else {
            let (uuid, executed) = server::mysql_gtids(conn, display).await?;
            // Only at the end of the log is the executed set the set at the position.
            let at_end = file == end_file && saved.pos.offset == end;
            let here = match (executed, at_end) {
                (Some(x), true) => Some(parse(&x)?),
                _ => None,
            };
            (here, Some(uuid).filter(|u| !u.is_empty()))
        };
        let same_server = match (&saved.server, &server_uuid) {
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            _ => true,
        };
        let usable = present
            && same_server
            && match (&saved_gtid, mariadb) {
                (Some(s), true) => here.as_ref() == Some(s),
                _ => true,
            };
        if usable || saved_gtid.is_none() {
            // Without a GTID state an unusable file ends in the dump's purged-log error.
            let gtid = saved_gtid.or(here);
            return Ok(ResumePoint {
                start: Start::File {
                    base: base.to_string(),
                    at: saved.pos,
                },
                from: saved.pos,
                server_uuid: server_uuid.filter(|_| gtid.is_some()),
                gtid,
            });
        }
        let Some(state) = saved_gtid else {
            return Err(Error::internal("no GTID state to resume from"));
        };
        let why = match (present, same_server) {
            (false, _) => format!("its binary log file {file} is no longer on {display}"),
            (true, false) => format!("{display} is another server than the one it read"),
            (true, true) => format!(
                "{file} at offset {} on {display} is no longer at GTID {}",
                saved.pos.offset,
                state.text()
            ),
        };
        tracing::warn!(
            "the stream's saved position {} cannot be used as a file and offset: {why}. \
             Resuming after GTID {} instead; positions (_pos) start epoch {} (see the README)",
            saved.pos.text(),
            state.text(),
            saved.pos.epoch + 1
        );
        Ok(ResumePoint {
            start: Start::Gtid(state.clone()),
            from: BinPos {
                epoch: saved.pos.epoch + 1,
                seq: 0,
                offset: 0,
            },
            gtid: Some(state),
            server_uuid,
        })
    }
}

#[async_trait]
impl ChangeSource for MyCapture {
    fn engine(&self) -> Engine {
        Engine::Mysql
    }

    fn display_url(&self) -> String {
        self.display().to_string()
    }

    fn identity(&self) -> String {
        self.target.identity()
    }

    fn nulled_values(&self) -> u64 {
        self.bad_values
            .nulled
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// InnoDB applies foreign-key actions inside the storage engine, and MariaDB and MySQL up
    /// to 9.5 write the rows they change to no binary log (MySQL 9.6 moved them to the server
    /// layer, where they are logged, but sluice's tests have no MySQL 9.6: it is not relied
    /// on).
    fn logs_cascades(&self) -> bool {
        false
    }

    fn position_number(&self, pos: &StreamPos) -> Option<u64> {
        let p = binlog::Restart::parse(pos.as_str()).ok()?.pos;
        Some((p.seq << 40) | (p.offset & ((1 << 40) - 1)))
    }

    fn while_stopped(&self, names: &CaptureNames, command: &str) -> String {
        let _ = names;
        format!(
            "Nothing is kept on {} for it: {command} continues from its saved position only \
             while the server still holds the binary log files from there on (the server \
             purges them after binlog_expire_logs_seconds, expire_logs_days on older \
             MariaDB); past that it continues by GTID where the server's GTID state allows.",
            self.display()
        )
    }

    fn export_source(&self, snapshot: Option<&SnapshotInfo>) -> Arc<dyn Source> {
        // The export takes its own snapshot (see the module documentation).
        let _ = snapshot;
        Arc::new(crate::MySource {
            target: self.target.clone(),
            sessions: self.sessions.clone(),
            locking: self.locking,
        })
    }

    fn manifest_position(&self, snapshot: &Position) -> Result<Option<StreamPos>> {
        match snapshot {
            Position::Mysql { file, pos, .. } => {
                BinPos::of_file(file, *pos).map(|p| Some(StreamPos::from_adapter(p.text())))
            }
            _ => Err(Error::config(format!(
                "the initial snapshot of {} recorded no binary log position ({snapshot}), so \
                 the stream cannot start exactly after it. The account needs REPLICATION CLIENT \
                 (MariaDB 10.5+: BINLOG MONITOR) and the export snapshot consistency.",
                self.display()
            ))),
        }
    }

    async fn table_keys(&self, datasets: &[Dataset]) -> Result<Vec<sluice_core::apply::TableKeys>> {
        let (mut conn, _) = self.session().await?;
        crate::catalog::table_keys(&mut conn, datasets, self.display()).await
    }

    async fn check_whole_rows(&self) -> Result<()> {
        let image = self.row_image().await?;
        if image == "MINIMAL" || image == "NOBLOB" {
            return Err(Error::config(format!(
                "{} logs binlog_row_image={image}: an update of a primary key arrives as a \
                 delete and an insert that carry only the key and the changed columns, and the \
                 target cannot insert a row without its other values. Set \
                 binlog_row_image=FULL (SET GLOBAL and in the server's configuration; sessions \
                 started before keep their setting until they reconnect).",
                self.display()
            )));
        }
        Ok(())
    }

    async fn check_before_images(&self, _datasets: &[Dataset]) -> Result<()> {
        let image = self.row_image().await?;
        // MariaDB's FULL_NODUP logs whole before images too (only the after image is cut).
        if image != "FULL" && image != "FULL_NODUP" {
            return Err(Error::config(format!(
                "--before-images writes the whole old row of each update and delete, and {} \
                 logs binlog_row_image={image}, which leaves out the old values of {}. Set \
                 binlog_row_image=FULL (SET GLOBAL and in the server's configuration; sessions \
                 started before keep their setting until they reconnect), or stream without \
                 --before-images.",
                self.display(),
                if image == "NOBLOB" {
                    "unchanged BLOB and TEXT columns"
                } else {
                    "every column but the key"
                }
            )));
        }
        Ok(())
    }

    async fn check(&self, datasets: &[Dataset]) -> Result<()> {
        let (mut conn, server) = self.session().await?;
        server::preflight(
            &mut conn,
            &server,
            datasets,
            self.locking.lock_non_transactional,
            self.display(),
        )
        .await?;
        let (file, pos) = server::master_status(&mut conn, &server, self.display()).await?;
        let _ = conn.disconnect().await;
        // Prove the right to read the binary log (REPLICATION SLAVE) with a short dump from
        // the end, which the server ends at once.
        let (base, _) = binlog::split_file(&file)?;
        let at = BinPos::of_file(&file, pos)?;
        let probe_id = self.server_id();
        let start = Start::File {
            base: base.to_string(),
            at,
        };
        let mut dump = conn::open_dump(
            &self.target,
            &self.sessions,
            server.flavor == Flavor::Mariadb,
            probe_id,
            &start,
            true,
        )
        .await?;
        let read = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(e) = dump.next().await {
                e.map_err(|e| conn::dump_error(e, probe_id, &file, self.display()))?;
            }
            Ok::<_, Error>(())
        })
        .await;
        let _ = dump.close().await;
        match read {
            Ok(r) => r,
            Err(_) => Ok(()),
        }
    }

    async fn start(
        &self,
        names: &CaptureNames,
        datasets: &[Dataset],
        snapshot: bool,
    ) -> Result<Created> {
        // Nothing to create: the binary log needs no server object. The stream starts at the
        // position read now, before any snapshot of the export (each table then keeps its
        // changes from its own snapshot's position on).
        let _ = (names, datasets);
        Ok(Created {
            position: StreamPos::from_adapter(self.position_now().await?.text()),
            handoff: snapshot.then_some(Handoff::FromExportManifest),
            publication_created: false,
        })
    }

    async fn handoff(&self) -> Result<Handoff> {
        Ok(Handoff::FromExportManifest)
    }

    async fn open(
        &self,
        names: &CaptureNames,
        datasets: &[Dataset],
        from: &StreamPos,
    ) -> Result<Box<dyn ChangeStream>> {
        let _ = names;
        let saved = Restart::parse(from.as_str())?;
        let (mut catalog, server) = self.session().await?;
        let vars = server::variables(&mut catalog, self.display()).await?;
        server::log_retention(&vars, self.display());
        let (file, end) = server::master_status(&mut catalog, &server, self.display()).await?;
        let (base, _) = binlog::split_file(&file)?;
        let mut resume = self
            .resume_point(&mut catalog, &server, &saved, base, &file, end)
            .await?;
        // Prepared XA transactions named in the position: read from the oldest one's group on
        // (their events are kept until their commit; nothing else before the position is
        // handled again, `xa.rs`).
        let xa = match saved.xa.iter().map(|p| p.at).min() {
            None => None,
            Some(oldest) => {
                let readable = matches!(&resume.start, Start::File { .. })
                    && oldest.epoch == saved.pos.epoch
                    && server::binary_logs(&mut catalog, self.display())
                        .await?
                        .iter()
                        .any(|(n, _)| *n == binlog::file_name(base, oldest.seq));
                if !readable {
                    return Err(Error::source_permanent(format!(
                        "the stream's position names XA transactions prepared in {}'s binary                          log from {} on and not committed yet, whose events are needed at their                          commit, but that part of the log is gone. Stream the tables again from                          a new snapshot (sluice stream --drop, then a new output).",
                        self.display(),
                        oldest.text()
                    )));
                }
                resume.start = Start::File {
                    base: base.to_string(),
                    at: oldest,
                };
                resume.from = oldest;
                Some((saved.pos, saved.xa.clone()))
            }
        };
        if let Ok(mut g) = self.confirmed.lock() {
            *g = matches!(resume.start, Start::File { .. }).then_some(saved.pos);
        }
        self.epoch.store(resume.from.epoch, Ordering::Relaxed);
        let events = conn::open_dump(
            &self.target,
            &self.sessions,
            server.flavor == Flavor::Mariadb,
            self.server_id(),
            &resume.start,
            false,
        )
        .await?;
        let setup = stream::Setup {
            target: self.target.clone(),
            server,
            catalog,
            datasets: datasets.to_vec(),
            from: resume.from,
            gtid: resume.gtid,
            server_uuid: resume.server_uuid,
            base: base.to_string(),
            confirmed: self.confirmed.clone(),
            xa,
            bad_values: self.bad_values.clone(),
            facts: self.facts.clone(),
        };
        Ok(Box::new(stream::MyStream::new(events, setup).await?))
    }

    async fn current_position(&self) -> Result<StreamPos> {
        Ok(StreamPos::from_adapter(self.position_now().await?.text()))
    }

    async fn harm(&self, names: &CaptureNames) -> Result<Option<CaptureHarm>> {
        let _ = names;
        let Some(at) = self.confirmed.lock().ok().and_then(|g| *g) else {
            return Ok(None);
        };
        let mut g = self.probe.lock().await;
        if g.is_none() {
            *g = Some(self.session().await?);
        }
        let (conn, _) = g
            .as_mut()
            .ok_or_else(|| Error::internal("no probe session"))?;
        let files = match server::binary_logs(conn, self.target.display()).await {
            Ok(f) => f,
            Err(e) => {
                *g = None;
                return Err(e);
            }
        };
        let (retained_bytes, lag_bytes) = server::retained(&files, at);
        Ok(Some(CaptureHarm {
            retained_bytes,
            lag_bytes,
        }))
    }
}
