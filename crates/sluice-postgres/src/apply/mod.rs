//! PostgreSQL as the target of `sluice replicate`: [`PgApplyTarget`] implements
//! [`ApplyTarget`].
//!
//! | file         | what it does                                                          |
//! |--------------|-----------------------------------------------------------------------|
//! | `mod.rs`     | the target: sessions' settings, errors                                 |
//! | `bookkeeping.rs` | schema `sluice`: positions, state, followed columns, the run's lock |
//! | `ddl.rs`     | column types, `CREATE TABLE`, the column barrier's `ALTER TABLE`       |
//! | `render.rs`  | Arrow values → PostgreSQL input text (SQL literals, `COPY` fields)     |
//! | `session.rs` | apply sessions: the round trip under the shared planner, barriers      |
//! | `dialect.rs` | the apply statements as PostgreSQL spells them (the planner's dialect) |
//! | `encode.rs`  | Arrow values → binary `COPY` fields, for the target types it knows     |
//! | `load.rs`    | the initial load: one `COPY … FROM STDIN` per batch (binary or text)   |
//! | `tests.rs`   | the statements units become, as text                                   |
//!
//! Bookkeeping lives in schema `sluice` (`bookkeeping.rs`); DDL is transactional here, so a
//! barrier commits with the unit around it.
//!
//! Connections are made by [`PgTarget`], so a target URL means what it means to libpq (TLS,
//! `~/.pgpass`, `PG*` variables), as for sources.

mod bookkeeping;
mod ddl;
mod dialect;
mod encode;
mod load;
mod render;
mod session;
#[cfg(test)]
mod tests;

use crate::connect::PgTarget;
use async_trait::async_trait;
use sluice_core::apply::{
    AppliedPosition, ApplySession, ApplyTarget, BulkLoad, ForeignKey, ReplicationLock,
    SourceColumn, TargetTable,
};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result, Retry};
use tokio_postgres::Client;

pub use ddl::mapped_type;

/// The session tag of apply sessions (see [`PgTarget::sessions`]).
const TAG: &str = "apply";

/// What every apply session sets after connecting (on top of the settings every sluice session
/// gets in its startup packet: UTC, ISO dates, `standard_conforming_strings = on`, which the
/// literals of [`render`] rely on and which is repeated here so nothing can have changed it):
/// read committed; a lock wait of 2 s, so a row lock held by a later unit waiting for its turn
/// to commit fails this one as a conflict instead of hanging it; no statement timeout (a large
/// unit or `COPY` may take long); the idle limits off (a session waits idle in a transaction
/// for its unit's turn to commit).
const SETUP: &str = "SET standard_conforming_strings = on; SET lock_timeout = '2s'; \
     SET statement_timeout = 0; SET default_transaction_isolation = 'read committed'";

/// A PostgreSQL database that replicated changes are applied to.
#[derive(Debug, Clone)]
pub struct PgApplyTarget {
    target: PgTarget,
}

impl PgApplyTarget {
    /// Parse the URL (libpq's conventions); no connection is made yet.
    pub fn new(url: &str) -> Result<Self> {
        let target = PgTarget::parse(url).map_err(Error::as_target)?;
        Ok(PgApplyTarget { target })
    }

    fn display(&self) -> &str {
        self.target.display()
    }

    /// A session with the apply settings.
    async fn connect(&self) -> Result<Client> {
        let client = self.target.connect(TAG).await.map_err(Error::as_target)?;
        client
            .batch_execute(&format!("{SETUP}; {}", crate::replication::TIMEOUTS_OFF))
            .await
            .map_err(|e| failed(e, self.display(), "setting up the session"))?;
        Ok(client)
    }

    /// Who the sessions run as, and in which database (for the `GRANT`s of messages).
    async fn whoami(&self, client: &Client) -> Result<(String, String)> {
        let r = client
            .query_one("SELECT current_user::text, current_database()::text", &[])
            .await
            .map_err(|e| failed(e, self.display(), "reading the session's user"))?;
        Ok((r.get(0), r.get(1)))
    }
}

/// Classify a driver error of the target while doing `what` (which names the table where
/// there is one): a conflict that a later retry may cure, a lost connection (transient), or a
/// permanent failure with the fix.
pub(crate) fn failed(e: tokio_postgres::Error, display: &str, what: &str) -> Error {
    classify(&e, display, what).with_cause(e)
}

fn classify(e: &tokio_postgres::Error, display: &str, what: &str) -> Error {
    let Some(db) = e.as_db_error() else {
        let cause = std::error::Error::source(e)
            .map(|s| format!(": {s}"))
            .unwrap_or_default();
        return Error::destination(
            Retry::Transient,
            format!(
                "the connection to the target PostgreSQL ({display}) was lost while {what}: \
                 {e}{cause}"
            ),
        );
    };
    let code = db.code().code();
    let mut msg = format!(
        "PostgreSQL error {code} on the target {display} while {what}: {}.",
        db.message()
    );
    if let Some(d) = db.detail() {
        msg.push_str(&format!(" Detail: {d}."));
    }
    match code {
        // unique and foreign-key violations, serialization failure, deadlock, lock wait.
        "23505" | "23503" | "40001" | "40P01" => Error::apply_conflict(msg),
        "55P03" => Error::apply_blocked(msg),
        "57P01" | "57P02" | "57P03" => Error::destination(Retry::Transient, msg),
        c if c.starts_with("08") || c.starts_with("53") => {
            Error::destination(Retry::Transient, msg)
        }
        "42501" => Error::destination(
            Retry::Permanent,
            format!(
                "{msg} The target user lacks a privilege the apply needs: grant it, e.g. GRANT \
                 SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON the table TO the user (and USAGE \
                 on its schema)."
            ),
        ),
        _ if what.starts_with("applying") || what.starts_with("loading") => Error::destination(
            Retry::Permanent,
            format!(
                "{msg} The target table's definition may differ from the source's (a column \
                 type, a constraint or a trigger the source does not have): make it match, or \
                 drop the table so sluice creates it."
            ),
        ),
        _ => Error::destination(Retry::Permanent, msg),
    }
}

#[async_trait]
impl ApplyTarget for PgApplyTarget {
    fn engine(&self) -> sluice_core::apply::Engine {
        sluice_core::apply::Engine::Postgres
    }

    fn display_url(&self) -> String {
        self.display().to_string()
    }

    async fn create_tables(&self, tables: &[TargetTable]) -> Result<Vec<String>> {
        let client = self.connect().await?;
        let (user, db) = self.whoami(&client).await?;
        ddl::create_tables(&client, tables, self.display(), &user, &db).await
    }

    async fn add_foreign_keys(&self, keys: &[(TableRef, ForeignKey)]) -> Result<Vec<String>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.connect().await?;
        ddl::add_foreign_keys(&client, keys, self.display()).await
    }

    async fn non_empty(&self, tables: &[TableRef]) -> Result<Vec<TableRef>> {
        let client = self.connect().await?;
        let mut out = Vec::new();
        for t in tables {
            let sql = format!(
                "SELECT EXISTS (SELECT 1 FROM {})",
                crate::sql::quote_table(t)
            );
            let r = client
                .query_one(&sql, &[])
                .await
                .map_err(|e| failed(e, self.display(), &format!("reading {t}")))?;
            if r.get::<_, bool>(0) {
                out.push(t.clone());
            }
        }
        Ok(out)
    }

    async fn truncate(&self, tables: &[TableRef]) -> Result<()> {
        if tables.is_empty() {
            return Ok(());
        }
        let client = self.connect().await?;
        client
            .batch_execute(&ddl::truncate_sql(tables))
            .await
            .map_err(|e| failed(e, self.display(), &format!("emptying {}", names(tables))))
    }

    async fn loader(&self) -> Result<Box<dyn BulkLoad>> {
        Ok(Box::new(load::PgLoader::new(
            self.connect().await?,
            self.display().to_string(),
        )))
    }

    async fn prepare(&self) -> Result<()> {
        let client = self.connect().await?;
        let (user, db) = self.whoami(&client).await?;
        bookkeeping::prepare(&client, self.display(), &user, &db).await
    }

    async fn load_state(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let client = self.connect().await?;
        bookkeeping::load_state(&client, self.display(), name).await
    }

    async fn save_state(&self, name: &str, state: &[u8]) -> Result<()> {
        let client = self.connect().await?;
        bookkeeping::save_state(&client, self.display(), name, state).await
    }

    async fn clear_state(&self, name: &str) -> Result<()> {
        let client = self.connect().await?;
        bookkeeping::clear_state(client, self.display(), name).await
    }

    async fn applied(&self, name: &str) -> Result<Option<AppliedPosition>> {
        let client = self.connect().await?;
        bookkeeping::applied(&client, self.display(), name).await
    }

    async fn followed_columns(&self, name: &str) -> Result<Vec<(TableRef, Vec<SourceColumn>)>> {
        let client = self.connect().await?;
        bookkeeping::followed_columns(&client, self.display(), name).await
    }

    async fn save_columns(
        &self,
        name: &str,
        tables: &[(TableRef, Vec<SourceColumn>)],
    ) -> Result<()> {
        let client = self.connect().await?;
        bookkeeping::save_columns(&client, self.display(), name, tables).await
    }

    async fn lock(&self, name: &str) -> Result<Box<dyn ReplicationLock>> {
        let client = self.connect().await?;
        bookkeeping::lock(client, self.display(), name).await
    }

    fn default_schema(&self) -> Option<String> {
        None
    }

    fn identity(&self) -> String {
        self.target.identity()
    }

    async fn session(&self, name: &str, worker: u32) -> Result<Box<dyn ApplySession>> {
        Ok(Box::new(session::new(
            self.connect().await?,
            self.display().to_string(),
            name,
            worker,
        )))
    }
}

/// `a.b, c.d` for messages.
pub(crate) fn names(tables: &[TableRef]) -> String {
    tables
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
