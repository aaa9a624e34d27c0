//! Change capture from PostgreSQL logical replication (pgoutput).
//!
//! | file          | what it does                                                         |
//! |---------------|----------------------------------------------------------------------|
//! | `conn.rs`     | the replication-protocol session (startup, auth, TLS, CopyBoth)      |
//! | `pgoutput.rs` | the stream's messages, parsed without copying                        |
//! | `values.rs`   | replicated values → the export's Arrow values                        |
//! | `slot.rs`     | checks, slot, what the slot costs the server                         |
//! | `publication.rs` | the publication: created, tables added mid-stream, read back      |
//! | `stream.rs`   | messages → changes in the runner's column builders                   |
//! | `keys.rs`     | primary, unique and foreign keys of captured tables (for writesets)  |
//!
//! The hand-off: the slot is created with `EXPORT_SNAPSHOT` on a session that then stays idle
//! while the export reads every table under that snapshot ([`ChangeSource::start`]: a
//! [`Handoff::Held`], the snapshot handed to [`crate::PgSource`]); the stream starts at the
//! slot's consistent point.
//! The snapshot sees exactly the transactions whose commit record starts before that point and
//! the slot sends exactly those whose commit record starts at or after it (PostgreSQL's
//! `SnapBuildXactNeedsSkip`), so every committed change lands once.

pub mod conn;
mod fill;
pub mod keys;
pub mod partitions;
pub mod pgoutput;
pub mod publication;
pub mod slot;
pub mod stream;
pub mod values;
mod wait;

use crate::catalog::server_info;
use crate::connect::PgTarget;
use crate::sql::{quote_ident, quote_literal};
use crate::types::TypeMap;
use async_trait::async_trait;
use conn::{ConnError, ReplConn};
use sluice_core::apply::Engine;
use sluice_core::change::{
    BadValuePolicy, BadValues, CaptureHarm, CaptureNames, ChangeSource, ChangeStream, Created,
    Handoff, HeldSnapshot, ServerObjects, SnapshotHold,
};
use sluice_core::table::TableRef;
use sluice_core::{Dataset, DatasetKind, Error, Position, Result, SnapshotInfo, Source, StreamPos};
use std::collections::HashMap;
use std::sync::Arc;
use stream::{PgStream, pos_lsn, pos_text};
use tokio_postgres::Client;

/// The session tag of a stream's own sessions.
const TAG: &str = "stream";

/// Turns the server's idle limits off for one of the stream's sessions, as the export's
/// coordinator does for its own: the session that created the slot sits idle in the slot's
/// exported snapshot for as long as the initial snapshot takes to read (a walsender holding an
/// exported snapshot counts as idle in a transaction), and the catalog and probe sessions sit
/// idle between a stream's schema changes and samples. Ended by `idle_session_timeout` or
/// `idle_in_transaction_session_timeout`, the first would cost the snapshot (workers that
/// reconnect can no longer join it) and the others an error and a restart. Read through
/// `pg_settings`, so a server without one of the settings skips it (`idle_session_timeout`
/// is PostgreSQL 14's).
pub(crate) const TIMEOUTS_OFF: &str = "SELECT set_config(name, '0', false) FROM pg_settings \
     WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout')";

/// A PostgreSQL database as a change source.
#[derive(Clone)]
pub struct PgCapture {
    target: PgTarget,
    bad_values: BadValuePolicy,
    /// `--slot-wait`: the longest a slot's creation waits for running transactions.
    slot_wait: Option<std::time::Duration>,
    /// The session harm samples and position reads reuse (opened on first use, reopened
    /// after it broke).
    probe: Arc<tokio::sync::Mutex<Option<Client>>>,
}

impl std::fmt::Debug for PgCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        sluice_core::redact::debug_handle(f, "PgCapture", &self.target)
    }
}

impl PgCapture {
    /// Parse the URL; no connection is made yet.
    pub fn new(url: &str) -> Result<Self> {
        Ok(PgCapture {
            target: PgTarget::parse(url)?,
            bad_values: BadValuePolicy::default(),
            slot_wait: None,
            probe: Arc::default(),
        })
    }

    /// The longest a slot's creation may wait for the transactions running when it began
    /// (`--slot-wait`; `None`: no limit, they are named while it waits).
    pub fn with_slot_wait(mut self, limit: Option<std::time::Duration>) -> Self {
        self.slot_wait = limit;
        self
    }

    /// What the streams do with a value they cannot write (`--bad-values`).
    pub fn with_bad_values(mut self, policy: BadValues) -> Self {
        self.bad_values.policy = policy;
        self
    }

    async fn client(&self) -> Result<Client> {
        let client = self.target.connect(TAG).await?;
        client
            .batch_execute(TIMEOUTS_OFF)
            .await
            .map_err(|e| crate::error::classify(e, crate::error::Phase::Catalog, self.display()))?;
        Ok(client)
    }

    /// The probe session, connected if it is not.
    async fn probe(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>> {
        let mut g = self.probe.lock().await;
        if g.as_ref().is_none_or(|c| c.is_closed()) {
            *g = Some(self.client().await?);
        }
        Ok(g)
    }

    fn display(&self) -> &str {
        self.target.display()
    }
}

/// The idle session that keeps a slot's exported snapshot valid.
struct ConnHold(ReplConn);

#[async_trait]
impl SnapshotHold for ConnHold {
    async fn release(mut self: Box<Self>) -> Result<()> {
        self.0.close().await;
        Ok(())
    }
}

fn held(conn: ReplConn, created: slot::CreatedSlot) -> Result<HeldSnapshot> {
    let id = created
        .snapshot
        .ok_or_else(|| Error::internal("the slot exported no snapshot"))?;
    Ok(HeldSnapshot {
        snapshot: SnapshotInfo {
            id: Some(id),
            position: Position::Postgres {
                lsn: slot::format_lsn(created.consistent_point),
                exact: true,
            },
            taken_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        },
        position: pos_text(created.consistent_point),
        hold: Box::new(ConnHold(conn)),
    })
}

#[async_trait]
impl ChangeSource for PgCapture {
    fn engine(&self) -> Engine {
        Engine::Postgres
    }

    fn server_objects(&self) -> Option<&dyn ServerObjects> {
        Some(self)
    }

    fn display_url(&self) -> String {
        self.display().to_string()
    }

    fn identity(&self) -> String {
        self.target.identity()
    }

    fn describes_rows(&self) -> bool {
        true
    }

    fn sends_generated(&self) -> bool {
        false
    }

    fn position_number(&self, pos: &StreamPos) -> Option<u64> {
        pos_lsn(pos)
    }

    async fn layout(&self, datasets: &[Dataset]) -> Result<Option<String>> {
        let tables: Vec<TableRef> = datasets.iter().filter_map(|d| d.object.clone()).collect();
        let g = self.probe().await?;
        let client = g
            .as_ref()
            .ok_or_else(|| Error::internal("no probe session"))?;
        let layout = partitions::layout(client, &tables, self.display()).await?;
        if layout.is_empty() {
            return Ok(None);
        }
        serde_json::to_string(&layout)
            .map(Some)
            .map_err(|e| Error::internal(format!("the partition layout cannot be kept: {e}")))
    }

    async fn storage(
        &self,
        datasets: &[Dataset],
    ) -> Result<Option<std::collections::BTreeMap<String, String>>> {
        let client = self.client().await?;
        let mut out = std::collections::BTreeMap::new();
        for d in datasets {
            let Some(t) = &d.object else { continue };
            let files = partitions::files(&client, t, self.display()).await?;
            out.insert(d.name.clone(), files);
        }
        Ok(Some(out))
    }

    async fn layout_changes(
        &self,
        saved: &str,
        datasets: &[Dataset],
    ) -> Result<Vec<sluice_core::change::LayoutChange>> {
        let mut saved: partitions::Layout = serde_json::from_str(saved).map_err(|e| {
            Error::internal(format!("the saved partition layout cannot be read: {e}"))
        })?;
        let client = self.client().await?;
        let exist = partitions::partitioned_now(&client, self.display()).await?;
        saved.retain(|table, _| exist.contains(table));
        let now = match self.layout(datasets).await? {
            Some(l) => serde_json::from_str(&l).map_err(|e| {
                Error::internal(format!("the partition layout cannot be read: {e}"))
            })?,
            None => partitions::Layout::new(),
        };
        Ok(partitions::changes(&saved, &now))
    }

    fn nulled_values(&self) -> u64 {
        self.bad_values
            .nulled
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn while_stopped(&self, names: &CaptureNames, command: &str) -> String {
        format!(
            "The replication slot {} keeps WAL on {} until {command} runs again; {command} \
             --drop removes it.",
            names.name,
            self.display()
        )
    }

    fn export_source(&self, snapshot: Option<&SnapshotInfo>) -> Arc<dyn Source> {
        Arc::new(crate::PgSource {
            target: self.target.clone(),
            imported: snapshot.cloned(),
        })
    }

    async fn table_keys(&self, datasets: &[Dataset]) -> Result<Vec<sluice_core::apply::TableKeys>> {
        let client = self.client().await?;
        keys::table_keys(&client, datasets, self.display()).await
    }

    async fn check_before_images(&self, datasets: &[Dataset]) -> Result<()> {
        let client = self.client().await?;
        keys::check_before_images(&client, datasets, self.display()).await
    }

    async fn check(&self, datasets: &[Dataset]) -> Result<()> {
        let client = self.client().await?;
        let server = server_info(&client, self.display()).await?;
        let mut types = TypeMap::new();
        slot::preflight(&client, &server, datasets, &mut types, self.display()).await
    }

    async fn start(
        &self,
        names: &CaptureNames,
        datasets: &[Dataset],
        snapshot: bool,
    ) -> Result<Created> {
        let client = self.client().await?;
        let tables: Vec<TableRef> = datasets.iter().filter_map(|d| d.object.clone()).collect();
        let partitioned: Vec<TableRef> = datasets
            .iter()
            .filter(|d| d.kind == DatasetKind::Partitioned)
            .filter_map(|d| d.object.clone())
            .collect();
        let publication_created = publication::ensure_publication(
            &client,
            &names.publication,
            &tables,
            &partitioned,
            self.display(),
        )
        .await?;
        let made = async {
            let mut conn = ReplConn::connect(&self.target).await?;
            let created = wait::create_slot(
                &mut conn,
                &client,
                &names.name,
                false,
                snapshot,
                self.slot_wait,
            )
            .await?;
            Ok::<_, Error>((conn, created))
        }
        .await;
        let (mut conn, created) = match made {
            Ok(x) => x,
            Err(e) => {
                // Leave nothing behind a failed first start.
                if publication_created {
                    let _ =
                        publication::drop_publication(&client, &names.publication, self.display())
                            .await;
                }
                return Err(e);
            }
        };
        let position = pos_text(created.consistent_point);
        let snapshot = if snapshot {
            Some(held(conn, created)?)
        } else {
            conn.close().await;
            // Without its own snapshot, the caller's later snapshots must see every
            // transaction the stream leaves out.
            slot::settle(&client, self.display()).await?;
            None
        };
        Ok(Created {
            position,
            handoff: snapshot.map(Handoff::Held),
            publication_created,
        })
    }

    async fn handoff(&self) -> Result<Handoff> {
        let mut conn = ReplConn::connect(&self.target).await?;
        let client = self.client().await?;
        let name = format!("sluice_tmp_{:016x}", rand::random::<u64>());
        let created =
            wait::create_slot(&mut conn, &client, &name, true, true, self.slot_wait).await?;
        held(conn, created).map(Handoff::Held)
    }

    async fn open(
        &self,
        names: &CaptureNames,
        datasets: &[Dataset],
        from: &StreamPos,
    ) -> Result<Box<dyn ChangeStream>> {
        let start = pos_lsn(from)
            .ok_or_else(|| Error::internal(format!("{from:?} is not a stream position")))?;
        let client = self.client().await?;
        let server = server_info(&client, self.display()).await?;
        let mut conn = ReplConn::connect(&self.target).await?;
        let sql = format!(
            "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {}, \
             binary 'true')",
            quote_ident(&names.name),
            slot::format_lsn(start),
            quote_literal(&quote_ident(&names.publication))
        );
        let display = self.display().to_string();
        conn.start_copy_both(&sql).await.map_err(|e| match e {
            ConnError::Server(s) if s.code == "55006" => Error::config(format!(
                "replication slot {} on {display} is in use by another session: another stream \
                 is reading it. Stop that stream first; two streams cannot share a slot.",
                names.name
            )),
            ConnError::Server(s) if s.code == "42704" => Error::source_permanent(format!(
                "replication slot {} no longer exists on {display} ({s}); the changes since the \
                 saved position are lost. Start over: sluice stream --drop with the same \
                 arguments, then stream into a new output.",
                names.name
            )),
            ConnError::Server(s) if s.code == "55000" => Error::source_permanent(format!(
                "replication slot {} on {display} cannot be read: {s}. If it was invalidated \
                 (max_slot_wal_keep_size), the changes since the saved position are lost: start \
                 over with sluice stream --drop and a new output.",
                names.name
            )),
            other => other.into_error("START_REPLICATION", &display),
        })?;
        let keys: HashMap<TableRef, Vec<String>> = datasets
            .iter()
            .filter_map(|d| Some((d.object.clone()?, d.primary_key.clone())))
            .collect();
        Ok(Box::new(PgStream::new(
            conn,
            client,
            server.money_scale,
            keys,
            start,
            self.bad_values.clone(),
        )))
    }

    async fn current_position(&self) -> Result<StreamPos> {
        let g = self.probe().await?;
        let client = g
            .as_ref()
            .ok_or_else(|| Error::internal("no probe session"))?;
        let row = client
            // The insert position, not the write position: with asynchronous commit a
            // committed transaction's record may not be written yet, and the write position
            // would then stop --until-current before it.
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .map_err(|e| crate::error::classify(e, crate::error::Phase::Catalog, self.display()))?;
        let lsn: String = row.get(0);
        slot::parse_lsn(&lsn)
            .map(pos_text)
            .ok_or_else(|| Error::internal(format!("unreadable LSN {lsn}")))
    }

    async fn harm(&self, names: &CaptureNames) -> Result<Option<CaptureHarm>> {
        let g = self.probe().await?;
        let client = g
            .as_ref()
            .ok_or_else(|| Error::internal("no probe session"))?;
        Ok(slot::slot_harm(client, &names.name, self.display())
            .await?
            .map(|h| CaptureHarm {
                retained_bytes: h.retained_bytes,
                lag_bytes: h.lag_bytes,
            }))
    }
}

/// The replication slot and the publication.
#[async_trait]
impl ServerObjects for PgCapture {
    fn describe(&self, names: &CaptureNames) -> String {
        format!("replication slot {}", names.name)
    }

    async fn exists(&self, names: &CaptureNames) -> Result<bool> {
        let client = self.client().await?;
        let Some(info) = slot::slot_info(&client, &names.name, self.display()).await? else {
            return Ok(false);
        };
        if let Some(pid) = info.active_pid {
            return Err(Error::config(format!(
                "replication slot {} on {} is in use by another session (pid {pid}): another \
                 stream is reading it. Stop that stream first; two streams cannot share a slot.",
                names.name,
                self.display()
            )));
        }
        if info.plugin.as_deref() != Some("pgoutput") {
            return Err(Error::config(format!(
                "replication slot {} on {} is not a pgoutput logical slot ({}): name another \
                 --slot.",
                names.name,
                self.display(),
                info.plugin.as_deref().unwrap_or("physical")
            )));
        }
        if info.wal_status.as_deref() == Some("lost") {
            return Err(Error::source_permanent(format!(
                "replication slot {} on {} was invalidated (the server removed WAL it still \
                 needed, max_slot_wal_keep_size): changes since the saved position are lost. \
                 Start over: sluice stream --drop with the same arguments, then stream into a \
                 new output.",
                names.name,
                self.display()
            )));
        }
        Ok(true)
    }

    async fn confirmed(&self, names: &CaptureNames) -> Result<Option<StreamPos>> {
        let client = self.client().await?;
        let info = slot::slot_info(&client, &names.name, self.display()).await?;
        Ok(info.and_then(|i| i.confirmed_flush).map(pos_text))
    }

    async fn remove(&self, names: &CaptureNames, publication: bool) -> Result<Vec<String>> {
        let client = self.client().await?;
        let mut out = Vec::new();
        if let Some(pid) = slot::streaming_pid(&client, &names.name, self.display()).await? {
            return Err(Error::config(format!(
                "replication slot {} on {} is in use by pid {pid}; stop that stream before \
                 dropping it.",
                names.name,
                self.display()
            )));
        }
        if slot::drop_slot(&client, &names.name, self.display()).await? {
            out.push(format!("replication slot {}", names.name));
        }
        if publication {
            publication::drop_publication(&client, &names.publication, self.display()).await?;
            out.push(format!("publication {}", names.publication));
        }
        Ok(out)
    }

    async fn published(&self, names: &CaptureNames) -> Result<Vec<TableRef>> {
        let client = self.client().await?;
        publication::published(&client, &names.publication, self.display()).await
    }

    async fn publish(
        &self,
        names: &CaptureNames,
        publication_created: bool,
        tables: &[TableRef],
    ) -> Result<()> {
        let client = self.client().await?;
        publication::publish_more(
            &client,
            &names.publication,
            publication_created,
            tables,
            self.display(),
        )
        .await
    }
}
