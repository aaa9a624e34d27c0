//! sluice's bookkeeping on a MySQL/MariaDB target, in database `sluice`: `applied` (one row
//! per replication and worker: the last unit that worker committed, written in the unit's own
//! transaction), `state` (one row per replication: the runner's JSON), `columns` (one row per
//! replication and target table: the source columns the table follows, written with each
//! column barrier), and the named lock a run holds on its replication.

use super::{columns_of, denied, exists_schema, exists_table, fail, grantee, needs_grant};
use crate::catalog::{ServerInfo, text};
use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::apply::{AppliedPosition, ReplicationLock, SourceColumn};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result, Retry, StreamPos};

/// The database sluice keeps its bookkeeping in.
pub const BOOKKEEPING_DB: &str = "sluice";

/// The applied-position table: one row per (replication, worker).
const CREATE_APPLIED: &str = "CREATE TABLE IF NOT EXISTS `sluice`.`applied` (\
     `name` varchar(190) NOT NULL, `worker` int unsigned NOT NULL, \
     `unit` bigint unsigned NOT NULL, `restart` text NOT NULL, `pos` text NOT NULL, \
     `commit_ts` bigint NULL, `updated` datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
     `skip` bigint unsigned NOT NULL DEFAULT 0, \
     PRIMARY KEY (`name`, `worker`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// The source columns each target table follows: one row per (replication, table).
const CREATE_COLUMNS: &str = "CREATE TABLE IF NOT EXISTS `sluice`.`columns` (\
     `name` varchar(190) NOT NULL, `table_schema` varchar(64) NOT NULL, \
     `table_name` varchar(64) NOT NULL, `columns` longtext NOT NULL, \
     `updated` datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
     PRIMARY KEY (`name`, `table_schema`, `table_name`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// Records the source columns a target table follows (name, schema, table, JSON).
pub(crate) const COLUMNS_UPSERT: &str = "INSERT INTO `sluice`.`columns` (`name`, \
     `table_schema`, `table_name`, `columns`) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
     `columns` = VALUES(`columns`), `updated` = CURRENT_TIMESTAMP(6)";

/// Bookkeeping created by an earlier release gains what later ones record (MySQL has no
/// `ADD COLUMN IF NOT EXISTS`: the catalog is asked first).
const ADD_SKIP: &str =
    "ALTER TABLE `sluice`.`applied` ADD COLUMN `skip` bigint unsigned NOT NULL DEFAULT 0";

/// The state table: one row per replication.
const CREATE_STATE: &str = "CREATE TABLE IF NOT EXISTS `sluice`.`state` (\
     `name` varchar(190) NOT NULL PRIMARY KEY, `state` longblob NOT NULL, \
     `updated` datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) \
     ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// The session holding a replication's named lock; its end releases the lock.
struct Locked(Conn);

#[async_trait]
impl ReplicationLock for Locked {
    async fn release(mut self: Box<Self>) -> Result<()> {
        let _ = self.0.query_drop("DO RELEASE_ALL_LOCKS()").await;
        let _ = self.0.disconnect().await;
        Ok(())
    }
}

/// The named lock of replication `name` (at most 64 characters: a long name is hashed).
fn lock_name(name: &str) -> String {
    let full = format!("sluice.replicate.{name}");
    if full.chars().count() <= 64 {
        return full;
    }
    format!(
        "sluice.replicate.{:016x}",
        xxhash_rust::xxh3::xxh3_64(name.as_bytes())
    )
}

/// Create what is missing of the bookkeeping (the database, its tables, columns later
/// releases added) and check that the session may write it; a missing privilege fails with
/// the `GRANT`.
pub(super) async fn prepare(conn: &mut Conn, server: &ServerInfo, d: &str) -> Result<()> {
    let grant = format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `{BOOKKEEPING_DB}`.* TO {}",
        grantee(server)
    );
    let what = "creating sluice's bookkeeping (database sluice) on";
    if !exists_schema(conn, BOOKKEEPING_DB, d).await? {
        conn.query_drop("CREATE DATABASE IF NOT EXISTS `sluice` CHARACTER SET utf8mb4")
            .await
            .map_err(|e| match denied(&e) {
                true => needs_grant(e, d, what, grant.clone()),
                false => fail(e, d, what),
            })?;
    }
    for (table, sql) in [
        ("applied", CREATE_APPLIED),
        ("state", CREATE_STATE),
        ("columns", CREATE_COLUMNS),
    ] {
        let t = TableRef {
            schema: BOOKKEEPING_DB.into(),
            name: table.into(),
        };
        if !exists_table(conn, &t, d).await? {
            conn.query_drop(sql).await.map_err(|e| match denied(&e) {
                true => needs_grant(e, d, what, grant.clone()),
                false => fail(e, d, what),
            })?;
        }
    }
    let applied = TableRef {
        schema: BOOKKEEPING_DB.into(),
        name: "applied".into(),
    };
    if !columns_of(conn, &applied, d)
        .await?
        .iter()
        .any(|c| c.name == "skip")
    {
        conn.query_drop(ADD_SKIP)
            .await
            .map_err(|e| match denied(&e) {
                true => needs_grant(e, d, what, grant.clone()),
                false => fail(e, d, what),
            })?;
    }
    // The privileges every unit needs on the bookkeeping, tried in a transaction that is
    // rolled back.
    let probe = "START TRANSACTION; \
         INSERT INTO `sluice`.`state` (`name`, `state`) VALUES ('', '') \
         ON DUPLICATE KEY UPDATE `state` = VALUES(`state`); \
         DELETE FROM `sluice`.`state` WHERE `name` = ''; \
         SELECT 1 FROM `sluice`.`applied` LIMIT 0; \
         UPDATE `sluice`.`applied` SET `unit` = `unit` WHERE `name` = '' LIMIT 0";
    let probed = conn.query_drop(probe).await;
    let rolled = conn.query_drop("ROLLBACK").await;
    probed.map_err(|e| match denied(&e) {
        true => needs_grant(e, d, "checking the privileges on database sluice of", grant),
        false => fail(e, d, "checking the privileges on database sluice of"),
    })?;
    rolled.map_err(|e| fail(e, d, "checking the privileges on database sluice of"))?;
    Ok(())
}

/// The replication's saved state.
pub(super) async fn load_state(conn: &mut Conn, d: &str, name: &str) -> Result<Option<Vec<u8>>> {
    let r: Option<Row> = conn
        .exec_first(
            "SELECT `state` FROM `sluice`.`state` WHERE `name` = ?",
            (name,),
        )
        .await
        .map_err(|e| fail(e, d, "reading the replication state on"))?;
    Ok(r.and_then(|r| r.get::<Vec<u8>, _>(0)))
}

/// Save the replication's state.
pub(super) async fn save_state(conn: &mut Conn, d: &str, name: &str, state: &[u8]) -> Result<()> {
    conn.exec_drop(
        "INSERT INTO `sluice`.`state` (`name`, `state`) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE `state` = VALUES(`state`), `updated` = CURRENT_TIMESTAMP(6)",
        (name, state),
    )
    .await
    .map_err(|e| fail(e, d, "saving the replication state on"))
}

/// Forget the replication: state, positions, followed columns.
pub(super) async fn clear_state(conn: &mut Conn, d: &str, name: &str) -> Result<()> {
    conn.exec_drop("DELETE FROM `sluice`.`state` WHERE `name` = ?", (name,))
        .await
        .and(Ok(()))
        .map_err(|e| fail(e, d, "clearing the replication state on"))?;
    conn.exec_drop("DELETE FROM `sluice`.`applied` WHERE `name` = ?", (name,))
        .await
        .map_err(|e| fail(e, d, "clearing the replication state on"))?;
    conn.exec_drop("DELETE FROM `sluice`.`columns` WHERE `name` = ?", (name,))
        .await
        .map_err(|e| fail(e, d, "clearing the replication state on"))
}

/// The source columns each target table follows.
pub(super) async fn followed_columns(
    conn: &mut Conn,
    d: &str,
    name: &str,
) -> Result<Vec<(TableRef, Vec<SourceColumn>)>> {
    let rows: Vec<(String, String, String)> = conn
        .exec(
            "SELECT `table_schema`, `table_name`, `columns` FROM `sluice`.`columns` \
             WHERE `name` = ?",
            (name,),
        )
        .await
        .map_err(|e| fail(e, d, "reading sluice.columns on"))?;
    rows.into_iter()
        .map(|(schema, table, json)| {
            let columns = serde_json::from_str(&json).map_err(|e| {
                Error::destination(
                    Retry::Permanent,
                    format!("sluice.columns on {} cannot be read: {e}", d),
                )
            })?;
            Ok((TableRef::new(schema, table), columns))
        })
        .collect()
}

/// Record the source columns target tables follow.
pub(super) async fn save_columns(
    conn: &mut Conn,
    d: &str,
    name: &str,
    tables: &[(TableRef, Vec<SourceColumn>)],
) -> Result<()> {
    for (t, columns) in tables {
        conn.exec_drop(
            COLUMNS_UPSERT,
            (name, &t.schema, &t.name, SourceColumn::list_json(columns)),
        )
        .await
        .map_err(|e| fail(e, d, "writing sluice.columns on"))?;
    }
    Ok(())
}

/// The applied position: the highest unit any worker recorded.
pub(super) async fn applied(
    conn: &mut Conn,
    d: &str,
    name: &str,
) -> Result<Option<AppliedPosition>> {
    let r: Option<Row> = conn
        .exec_first(
            "SELECT `unit`, `restart`, `pos`, `commit_ts`, `skip` FROM `sluice`.`applied` \
             WHERE `name` = ? ORDER BY `unit` DESC LIMIT 1",
            (name,),
        )
        .await
        .map_err(|e| fail(e, d, "reading the applied position on"))?;
    Ok(r.map(|r| AppliedPosition {
        unit: crate::catalog::number(&r, 0),
        restart: StreamPos::from_adapter(text(&r, 1)),
        pos: StreamPos::from_adapter(text(&r, 2)),
        commit_ts: r.get::<Option<i64>, _>(3).flatten(),
        skip: crate::catalog::number(&r, 4),
    }))
}

/// Hold replication `name` on this session (a named lock) for the run; refused, naming
/// the holder, when another session holds it.
pub(super) async fn lock(mut conn: Conn, d: &str, name: &str) -> Result<Box<dyn ReplicationLock>> {
    let key = lock_name(name);
    let got: Option<Option<i64>> = conn
        .exec_first("SELECT GET_LOCK(?, 0)", (key.as_str(),))
        .await
        .map_err(|e| fail(e, d, "locking the replication on"))?;
    if got.flatten() == Some(1) {
        return Ok(Box::new(Locked(conn)));
    }
    let holder: Option<(u64, String, u64)> = conn
        .exec_first(
            "SELECT ID, HOST, TIME FROM information_schema.PROCESSLIST \
             WHERE ID = IS_USED_LOCK(?)",
            (key.as_str(),),
        )
        .await
        .map_err(|e| fail(e, d, "looking up who runs the replication on"))?;
    let holder = holder
        .map(|(id, host, time)| format!(" (connection {id} from {host}, {time} s)"))
        .unwrap_or_default();
    Err(Error::config(format!(
        "replication {name} is already running against {d}{holder}: one run applies a \
         replication at a time. Wait for that run to end (or stop it); to run a separate \
         replication, pass another --slot."
    )))
}
