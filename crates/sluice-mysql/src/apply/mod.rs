//! Applying replicated changes to a MySQL/MariaDB target (`sluice replicate`).
//!
//! | file         | what it does                                                          |
//! |--------------|-----------------------------------------------------------------------|
//! | `mod.rs`     | the target: sessions, errors                                           |
//! | `bookkeeping.rs` | database `sluice`: positions, state, followed columns, the run's lock |
//! | `ddl.rs`     | column types, `CREATE TABLE`, the column barrier's `ALTER TABLE`       |
//! | `render.rs`  | Arrow values → SQL literals                                           |
//! | `session.rs` | apply sessions: the round trip under the shared planner, barriers      |
//! | `dialect.rs` | the apply statements as MySQL spells them (the planner's dialect)      |
//! | `load.rs`    | the initial load: multi-row `INSERT`s sized under `max_allowed_packet` |
//! | `tests.rs`   | the statements units become, as text                                   |
//!
//! Bookkeeping lives in database `sluice` (`bookkeeping.rs`). MySQL DDL commits by itself, so
//! barriers are written to be idempotent and a session commits what precedes a barrier with
//! its position first (see [`sluice_core::apply::ApplySession::barrier`]).
//!
//! Sessions connect with the source's URL options (`ssl-mode`, `ssl-ca`, client certificates,
//! `socket`) and run read committed, `innodb_lock_wait_timeout = 2` (a lock held by a later
//! unit waiting for its turn to commit becomes a conflict, not a hang), no statement time limit,
//! idle timeouts off, UTC, utf8mb4 and a strict `sql_mode` (a value that does not fit fails
//! instead of being truncated; `NO_AUTO_VALUE_ON_ZERO` keeps an explicit 0 in an
//! auto-increment column).

mod bookkeeping;
mod ddl;
mod dialect;
mod load;
pub mod render;
mod session;
#[cfg(test)]
mod tests;

use crate::catalog::{Flavor, ServerInfo, server_info, text};
use crate::connect::{MyTarget, Sessions};
use crate::error::code;
use crate::sql::{quote_ident, quote_table};
use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::apply::{
    AppliedPosition, ApplySession, ApplyTarget, BulkLoad, Engine, ForeignKey, ReplicationLock,
    SourceColumn, TargetTable,
};
use sluice_core::table::TableRef;
use sluice_core::{Error, ErrorKind, Result, Retry};

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
            target: MyTarget::parse(url)
                .map_err(Error::as_target)?
                .with_found_rows(),
            sessions: Sessions::default(),
        })
    }

    fn display(&self) -> &str {
        self.target.display()
    }

    /// A session with the apply settings; `lock_wait`: `innodb_lock_wait_timeout` in seconds.
    async fn open(&self, lock_wait: u32) -> Result<(Conn, ServerInfo)> {
        let mut conn = self
            .target
            .connect(&self.sessions)
            .await
            .map_err(Error::as_target)?;
        let server = server_info(&mut conn, self.display()).await?;
        let limits = match server.flavor {
            Flavor::Mariadb if server.at_least((10, 3, 0)) => {
                "max_statement_time = 0, idle_transaction_timeout = 0, \
                 idle_write_transaction_timeout = 0"
            }
            Flavor::Mariadb => "max_statement_time = 0",
            Flavor::Mysql => "max_execution_time = 0",
        };
        // An apply session's DDL (a barrier) waits at most this long for a metadata lock
        // another session holds (the server's default is a year): it gives up, names the
        // holder and is retried, rather than hang unseen.
        let mdl = if lock_wait <= 2 { 10 } else { 31_536_000 };
        let sql = format!(
            "{SESSION_COMMON}, innodb_lock_wait_timeout = {lock_wait}, lock_wait_timeout = {mdl}; \
             SET SESSION {limits}"
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
                1062 | 1586 | 1451 | 1452 | 1216 | 1217 | 1213 | 1020 => {
                    Error::apply_conflict(msg).with_cause(e)
                }
                // A lock wait given up: another session holds what the change needs.
                1205 => Error::apply_blocked(msg).with_cause(e),
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
pub(super) fn denied(e: &mysql_async::Error) -> bool {
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
pub(super) fn grantee(server: &ServerInfo) -> String {
    let (u, h) = server.user.rsplit_once('@').unwrap_or((&server.user, "%"));
    format!("'{}'@'{}'", u.replace('\'', "''"), h.replace('\'', "''"))
}

/// A privilege error with the `GRANT` that fixes it.
pub(super) fn needs_grant(e: mysql_async::Error, target: &str, what: &str, grant: String) -> Error {
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

pub(super) async fn exists_schema(conn: &mut Conn, db: &str, target: &str) -> Result<bool> {
    let r: Option<Row> = conn
        .exec_first(
            "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
            (db,),
        )
        .await
        .map_err(|e| fail(e, target, "reading the catalog of"))?;
    Ok(r.is_some())
}

pub(super) async fn exists_table(conn: &mut Conn, t: &TableRef, target: &str) -> Result<bool> {
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
    fn engine(&self) -> sluice_core::apply::Engine {
        sluice_core::apply::Engine::Mysql
    }

    fn display_url(&self) -> String {
        self.display().to_string()
    }

    async fn create_tables(&self, tables: &[TargetTable]) -> Result<Vec<String>> {
        let (mut conn, server) = self.plain().await?;
        let d = self.display();
        let mut notes = Vec::new();
        for t in tables {
            let same = t.source_engine == Engine::Mysql;
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

    async fn add_foreign_keys(&self, keys: &[(TableRef, ForeignKey)]) -> Result<Vec<String>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let (mut conn, _) = self.plain().await?;
        ddl::add_foreign_keys(&mut conn, keys, self.display()).await
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

    async fn prepare(&self) -> Result<()> {
        let (mut conn, server) = self.plain().await?;
        bookkeeping::prepare(&mut conn, &server, self.display()).await
    }

    async fn load_state(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let (mut conn, _) = self.plain().await?;
        bookkeeping::load_state(&mut conn, self.display(), name).await
    }

    async fn save_state(&self, name: &str, state: &[u8]) -> Result<()> {
        let (mut conn, _) = self.plain().await?;
        bookkeeping::save_state(&mut conn, self.display(), name, state).await
    }

    async fn clear_state(&self, name: &str) -> Result<()> {
        let (mut conn, _) = self.plain().await?;
        bookkeeping::clear_state(&mut conn, self.display(), name).await
    }

    async fn followed_columns(&self, name: &str) -> Result<Vec<(TableRef, Vec<SourceColumn>)>> {
        let (mut conn, _) = self.plain().await?;
        bookkeeping::followed_columns(&mut conn, self.display(), name).await
    }

    async fn save_columns(
        &self,
        name: &str,
        tables: &[(TableRef, Vec<SourceColumn>)],
    ) -> Result<()> {
        let (mut conn, _) = self.plain().await?;
        bookkeeping::save_columns(&mut conn, self.display(), name, tables).await
    }

    async fn applied(&self, name: &str) -> Result<Option<AppliedPosition>> {
        let (mut conn, _) = self.plain().await?;
        bookkeeping::applied(&mut conn, self.display(), name).await
    }

    async fn lock(&self, name: &str) -> Result<Box<dyn ReplicationLock>> {
        let (conn, _) = self.plain().await?;
        bookkeeping::lock(conn, self.display(), name).await
    }

    fn default_schema(&self) -> Option<String> {
        let db = self.target.database();
        (!db.is_empty()).then(|| db.to_string())
    }

    fn identity(&self) -> String {
        self.target.identity()
    }

    async fn session(&self, name: &str, worker: u32) -> Result<Box<dyn ApplySession>> {
        let (conn, server) = self.open(2).await?;
        Ok(Box::new(session::new(
            conn,
            self.display().to_string(),
            name,
            worker,
            server.flavor == Flavor::Mysql,
        )))
    }
}
