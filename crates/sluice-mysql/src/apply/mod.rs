//! Applying replicated changes to a MySQL/MariaDB target (`sluice replicate`).
//!
//! | file         | what it does                                                          |
//! |--------------|-----------------------------------------------------------------------|
//! | `mod.rs`     | the target: sessions, bookkeeping in database `sluice`, errors         |
//! | `ddl.rs`     | column types, `CREATE TABLE`, the column barrier's `ALTER TABLE`       |
//! | `render.rs`  | Arrow values → SQL literals                                           |
//! | `session.rs` | apply sessions: a unit's statements in at most two round trips        |
//! | `batch.rs`   | rows prepared for statements; many updates or deletes in one statement |
//! | `load.rs`    | the initial load: multi-row `INSERT`s sized under `max_allowed_packet` |
//!
//! Bookkeeping: database `sluice`, table `applied` (one row per replication name and worker:
//! the last unit that worker committed, written in the unit's own transaction) and table
//! `state` (one row per replication name: the runner's JSON). MySQL DDL commits by itself, so
//! barriers are written to be idempotent (see [`sluice_core::apply::Barrier`]).
//!
//! Sessions connect with the source's URL options (`ssl-mode`, `ssl-ca`, client certificates,
//! `socket`) and run read committed, `innodb_lock_wait_timeout = 2` (a lock held by a later
//! unit waiting for its turn to commit becomes a conflict, not a hang), no statement time limit,
//! idle timeouts off, UTC, utf8mb4 and a strict `sql_mode` (a value that does not fit fails
//! instead of being truncated; `NO_AUTO_VALUE_ON_ZERO` keeps an explicit 0 in an
//! auto-increment column).

mod batch;
mod ddl;
mod load;
pub mod render;
mod session;

use crate::catalog::{Flavor, ServerInfo, server_info, text};
use crate::connect::{MyTarget, Sessions};
use crate::error::code;
use crate::sql::{quote_ident, quote_table};
use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::apply::{AppliedPosition, ApplySession, ApplyTarget, BulkLoad, TargetTable};
use sluice_core::table::TableRef;
use sluice_core::{Error, ErrorKind, Result, Retry};

/// The database sluice keeps its bookkeeping in.
pub const BOOKKEEPING_DB: &str = "sluice";

/// The applied-position table: one row per (replication, worker).
const CREATE_APPLIED: &str = "CREATE TABLE IF NOT EXISTS `sluice`.`applied` (\
     `name` varchar(190) NOT NULL, `worker` int unsigned NOT NULL, \
     `unit` bigint unsigned NOT NULL, `restart` text NOT NULL, `pos` text NOT NULL, \
     `commit_ts` bigint NULL, `updated` datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
     PRIMARY KEY (`name`, `worker`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// The state table: one row per replication.
const CREATE_STATE: &str = "CREATE TABLE IF NOT EXISTS `sluice`.`state` (\
     `name` varchar(190) NOT NULL PRIMARY KEY, `state` longblob NOT NULL, \
     `updated` datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) \
     ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// What every apply and load session sets after connecting (besides the connection's UTC
/// and utf8mb4).
const SESSION_COMMON: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
     SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_AUTO_VALUE_ON_ZERO,NO_ENGINE_SUBSTITUTION', \
     wait_timeout = 31536000, autocommit = 1";

/// A MySQL or MariaDB database that replicated changes are applied to.
#[derive(Debug, Clone)]
pub struct MyApplyTarget {
    target: MyTarget,
    sessions: Sessions,
}

impl MyApplyTarget {
    /// Parse the URL (the same options as a source URL: `ssl-mode`, `ssl-ca`, `socket`, …);
    /// no connection is made yet.
    pub fn new(url: &str) -> Result<Self> {
        Ok(MyApplyTarget {
            target: MyTarget::parse(url)?,
            sessions: Sessions::default(),
        })
    }

    fn display(&self) -> &str {
        self.target.display()
    }

    /// A session with the apply settings; `lock_wait`: `innodb_lock_wait_timeout` in seconds.
    async fn open(&self, lock_wait: u32) -> Result<(Conn, ServerInfo)> {
        let mut conn = self.target.connect(&self.sessions).await?;
        let server = server_info(&mut conn, self.display()).await?;
        let limits = match server.flavor {
            Flavor::Mariadb if server.at_least((10, 3, 0)) => {
                "max_statement_time = 0, idle_transaction_timeout = 0, \
                 idle_write_transaction_timeout = 0"
            }
            Flavor::Mariadb => "max_statement_time = 0",
            Flavor::Mysql => "max_execution_time = 0",
        };
        let sql = format!(
            "{SESSION_COMMON}, innodb_lock_wait_timeout = {lock_wait}; SET SESSION {limits}"
        );
        conn.query_drop(sql)
            .await
            .map_err(|e| fail(e, self.display(), "setting up a session on"))?;
        Ok((conn, server))
    }

    async fn plain(&self) -> Result<(Conn, ServerInfo)> {
        self.open(50).await
    }
}

/// A driver error while applying: a conflict that running later may cure, a lost connection
/// (transient), a missing privilege (with the `GRANT`), or permanent. `what` says what was
/// being done (`applying a unit to`, `creating`), followed by the target.
pub(crate) fn fail(e: mysql_async::Error, target: &str, what: &str) -> Error {
    let text = format!("{what} {target}");
    match &e {
        mysql_async::Error::Server(s) => {
            let msg = format!(
                "MySQL error {} ({}) while {text}: {}.",
                s.code,
                s.state,
                s.message.trim_end_matches('.')
            );
            match s.code {
                // Duplicate key, foreign key parent missing or child present, deadlock, lock
                // wait timeout, MariaDB's "record changed since last read".
                1062 | 1586 | 1451 | 1452 | 1216 | 1217 | 1213 | 1205 | 1020 => {
                    Error::apply_conflict(msg).with_cause(e)
                }
                code::ER_DBACCESS_DENIED_ERROR
                | code::ER_TABLEACCESS_DENIED_ERROR
                | code::ER_COLUMNACCESS_DENIED_ERROR
                | code::ER_SPECIFIC_ACCESS_DENIED_ERROR => Error::new(
                    ErrorKind::Destination,
                    Retry::Permanent,
                    format!("{msg} Grant the target user the privilege the statement needs."),
                )
                .with_cause(e),
                code::ER_SERVER_SHUTDOWN
                | code::ER_CONNECTION_KILLED
                | code::ER_QUERY_INTERRUPTED
                | code::ER_NET_READ_ERROR
                | code::ER_NET_READ_INTERRUPTED
                | code::ER_NET_ERROR_ON_WRITE
                | code::ER_NET_WRITE_INTERRUPTED
                | code::ER_CON_COUNT_ERROR
                | code::CR_SERVER_GONE_ERROR
                | code::CR_SERVER_LOST => Error::destination(Retry::Transient, msg).with_cause(e),
                _ => Error::destination(
                    Retry::Permanent,
                    format!(
                        "{msg} Check that the target table matches the source (columns and \
                         types), or drop it so that it is created again with an initial load."
                    ),
                )
                .with_cause(e),
            }
        }
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => Error::destination(
            Retry::Transient,
            format!("the connection to the MySQL/MariaDB target was lost while {text}: {e}."),
        )
        .with_cause(e),
        _ => Error::destination(
            Retry::Permanent,
            format!("MySQL/MariaDB driver error while {text}: {e}."),
        )
        .with_cause(e),
    }
}

/// True for the privilege errors, which get a `GRANT` in their message.
fn denied(e: &mysql_async::Error) -> bool {
    matches!(
        crate::error::server_code(e),
        Some(
            code::ER_DBACCESS_DENIED_ERROR
                | code::ER_TABLEACCESS_DENIED_ERROR
                | code::ER_COLUMNACCESS_DENIED_ERROR
                | code::ER_SPECIFIC_ACCESS_DENIED_ERROR
                | code::ER_ACCESS_DENIED_ERROR
        )
    )
}

/// `'user'@'host'` from `CURRENT_USER()`'s `user@host`, for the `GRANT` in a message.
fn grantee(server: &ServerInfo) -> String {
    let (u, h) = server.user.rsplit_once('@').unwrap_or((&server.user, "%"));
    format!("'{}'@'{}'", u.replace('\'', "''"), h.replace('\'', "''"))
}

/// A privilege error with the `GRANT` that fixes it.
fn needs_grant(e: mysql_async::Error, target: &str, what: &str, grant: String) -> Error {
    let server = match &e {
        mysql_async::Error::Server(s) => format!(
            "MySQL error {} ({}): {}",
            s.code,
            s.state,
            s.message.trim_end_matches('.')
        ),
        other => other.to_string(),
    };
    Error::new(
        ErrorKind::Destination,
        Retry::Permanent,
        format!(
            "the target user may not do what {what} {target} needs ({server}). Run as an \
             administrator: {grant};"
        ),
    )
    .with_cause(e)
}

async fn exists_schema(conn: &mut Conn, db: &str, target: &str) -> Result<bool> {
    let r: Option<Row> = conn
        .exec_first(
            "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
            (db,),
        )
        .await
        .map_err(|e| fail(e, target, "reading the catalog of"))?;
    Ok(r.is_some())
}

async fn exists_table(conn: &mut Conn, t: &TableRef, target: &str) -> Result<bool> {
    let r: Option<Row> = conn
        .exec_first(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (t.schema.as_str(), t.name.as_str()),
        )
        .await
        .map_err(|e| fail(e, target, "reading the catalog of"))?;
    Ok(r.is_some())
}

/// The target's columns of `t`, in order.
pub(crate) async fn columns_of(
    conn: &mut Conn,
    t: &TableRef,
    target: &str,
) -> Result<Vec<ddl::Existing>> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (t.schema.as_str(), t.name.as_str()),
        )
        .await
        .map_err(|e| fail(e, target, "reading the catalog of"))?;
    Ok(rows
        .iter()
        .map(|r| ddl::Existing {
            name: text(r, 0),
            column_type: text(r, 1),
            nullable: text(r, 2) == "YES",
        })
        .collect())
}

#[async_trait]
impl ApplyTarget for MyApplyTarget {
    fn engine(&self) -> &'static str {
        "mysql"
    }

    fn display_url(&self) -> String {
        self.display().to_string()
    }

    async fn prepare(&self) -> Result<()> {
        let (mut conn, server) = self.plain().await?;
        let d = self.display();
        let grant = format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `{BOOKKEEPING_DB}`.* TO {}",
            grantee(&server)
        );
        let what = "creating sluice's bookkeeping (database sluice) on";
        if !exists_schema(&mut conn, BOOKKEEPING_DB, d).await? {
            conn.query_drop("CREATE DATABASE IF NOT EXISTS `sluice` CHARACTER SET utf8mb4")
                .await
                .map_err(|e| match denied(&e) {
                    true => needs_grant(e, d, what, grant.clone()),
                    false => fail(e, d, what),
                })?;
        }
        for (table, sql) in [("applied", CREATE_APPLIED), ("state", CREATE_STATE)] {
            let t = TableRef {
                schema: BOOKKEEPING_DB.into(),
                name: table.into(),
            };
            if !exists_table(&mut conn, &t, d).await? {
                conn.query_drop(sql).await.map_err(|e| match denied(&e) {
                    true => needs_grant(e, d, what, grant.clone()),
                    false => fail(e, d, what),
                })?;
            }
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

    async fn create_tables(&self, tables: &[TargetTable]) -> Result<Vec<String>> {
        let (mut conn, server) = self.plain().await?;
        let d = self.display();
        let mut notes = Vec::new();
        for t in tables {
            let same = t.source_engine == self.engine();
            let grant = |what: &str| {
                format!(
                    "GRANT {what}, SELECT, INSERT, UPDATE, DELETE, DROP, ALTER ON {}.* TO {}",
                    quote_ident(&t.table.schema),
                    grantee(&server)
                )
            };
            let what = format!("creating {} on", t.table);
            if !exists_schema(&mut conn, &t.table.schema, d).await? {
                conn.query_drop(format!(
                    "CREATE DATABASE IF NOT EXISTS {} CHARACTER SET utf8mb4",
                    quote_ident(&t.table.schema)
                ))
                .await
                .map_err(|e| match denied(&e) {
                    true => needs_grant(e, d, &what, grant("CREATE")),
                    false => fail(e, d, &what),
                })?;
            }
            if exists_table(&mut conn, &t.table, d).await? {
                let have = columns_of(&mut conn, &t.table, d).await?;
                let missing: Vec<&str> = t
                    .columns
                    .iter()
                    .filter(|c| !have.iter().any(|h| h.name.eq_ignore_ascii_case(&c.name)))
                    .map(|c| c.name.as_str())
                    .collect();
                if !missing.is_empty() {
                    return Err(Error::config(format!(
                        "the target table {} exists but lacks column(s) {} that the source \
                         has ({d}). Add them (ALTER TABLE … ADD COLUMN), or drop the table so \
                         that it is created from the source.",
                        quote_table(&t.table),
                        missing.join(", ")
                    )));
                }
                continue;
            }
            let (sql, n) = ddl::create_table(t, same);
            conn.query_drop(sql).await.map_err(|e| match denied(&e) {
                true => needs_grant(e, d, &what, grant("CREATE")),
                false => fail(e, d, &what),
            })?;
            notes.extend(n);
        }
        Ok(notes)
    }

    async fn non_empty(&self, tables: &[TableRef]) -> Result<Vec<TableRef>> {
        let (mut conn, _) = self.plain().await?;
        let mut out = Vec::new();
        for t in tables {
            let r: std::result::Result<Option<Row>, _> = conn
                .query_first(format!("SELECT 1 FROM {} LIMIT 1", quote_table(t)))
                .await;
            match r {
                Ok(Some(_)) => out.push(t.clone()),
                Ok(None) => {}
                Err(e) if crate::error::server_code(&e) == Some(code::ER_NO_SUCH_TABLE) => {}
                Err(e) => return Err(fail(e, self.display(), &format!("reading {t} on"))),
            }
        }
        Ok(out)
    }

    async fn truncate(&self, tables: &[TableRef]) -> Result<()> {
        let (mut conn, _) = self.plain().await?;
        for t in tables {
            conn.query_drop(format!("TRUNCATE TABLE {}", quote_table(t)))
                .await
                .map_err(|e| fail(e, self.display(), &format!("truncating {t} on")))?;
        }
        Ok(())
    }

    async fn loader(&self) -> Result<Box<dyn BulkLoad>> {
        let (conn, _) = self.plain().await?;
        Ok(Box::new(
            load::MyLoader::open(conn, self.display().to_string()).await?,
        ))
    }

    async fn load_state(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let (mut conn, _) = self.plain().await?;
        let r: Option<Row> = conn
            .exec_first(
                "SELECT `state` FROM `sluice`.`state` WHERE `name` = ?",
                (name,),
            )
            .await
            .map_err(|e| fail(e, self.display(), "reading the replication state on"))?;
        Ok(r.and_then(|r| r.get::<Vec<u8>, _>(0)))
    }

    async fn save_state(&self, name: &str, state: &[u8]) -> Result<()> {
        let (mut conn, _) = self.plain().await?;
        conn.exec_drop(
            "INSERT INTO `sluice`.`state` (`name`, `state`) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE `state` = VALUES(`state`), `updated` = CURRENT_TIMESTAMP(6)",
            (name, state),
        )
        .await
        .map_err(|e| fail(e, self.display(), "saving the replication state on"))
    }

    async fn clear_state(&self, name: &str) -> Result<()> {
        let (mut conn, _) = self.plain().await?;
        conn.exec_drop("DELETE FROM `sluice`.`state` WHERE `name` = ?", (name,))
            .await
            .and(Ok(()))
            .map_err(|e| fail(e, self.display(), "clearing the replication state on"))?;
        conn.exec_drop("DELETE FROM `sluice`.`applied` WHERE `name` = ?", (name,))
            .await
            .map_err(|e| fail(e, self.display(), "clearing the replication state on"))
    }

    async fn applied(&self, name: &str) -> Result<Option<AppliedPosition>> {
        let (mut conn, _) = self.plain().await?;
        let r: Option<Row> = conn
            .exec_first(
                "SELECT `unit`, `restart`, `pos`, `commit_ts` FROM `sluice`.`applied` \
                 WHERE `name` = ? ORDER BY `unit` DESC LIMIT 1",
                (name,),
            )
            .await
            .map_err(|e| fail(e, self.display(), "reading the applied position on"))?;
        Ok(r.map(|r| AppliedPosition {
            unit: crate::catalog::number(&r, 0),
            restart: text(&r, 1),
            pos: text(&r, 2),
            commit_ts: r.get::<Option<i64>, _>(3).flatten(),
        }))
    }

    async fn session(&self, name: &str, worker: u32) -> Result<Box<dyn ApplySession>> {
        let (conn, server) = self.open(2).await?;
        Ok(Box::new(session::MySession::new(
            conn,
            self.display().to_string(),
            name,
            worker,
            server.flavor == Flavor::Mysql,
        )))
    }
}
