//! PostgreSQL as the target of `sluice replicate`: [`PgApplyTarget`] implements
//! [`ApplyTarget`].
//!
//! | file         | what it does                                                          |
//! |--------------|-----------------------------------------------------------------------|
//! | `mod.rs`     | the target: sessions' settings, bookkeeping in schema `sluice`, errors |
//! | `ddl.rs`     | column types, `CREATE TABLE`, the column barrier's `ALTER TABLE`       |
//! | `render.rs`  | Arrow values → PostgreSQL input text (SQL literals, `COPY` fields)     |
//! | `session.rs` | apply sessions: a unit's statements in one or two round trips         |
//! | `batch.rs`   | rows prepared for statements; many updates or deletes in one statement |
//! | `encode.rs`  | Arrow values → binary `COPY` fields, for the target types it knows     |
//! | `load.rs`    | the initial load: one `COPY … FROM STDIN` per batch (binary or text)   |
//!
//! Bookkeeping lives in schema `sluice`: `sluice.applied` holds one row per (replication,
//! worker) with the last unit that worker committed, written in the same transaction as the
//! unit's rows; `sluice.state` one row per replication with the runner's JSON.
//!
//! Connections are made by [`PgTarget`], so a target URL means what it means to libpq (TLS,
//! `~/.pgpass`, `PG*` variables), as for sources.

mod batch;
mod ddl;
mod encode;
mod load;
mod render;
mod session;

use crate::connect::PgTarget;
use async_trait::async_trait;
use sluice_core::apply::{AppliedPosition, ApplySession, ApplyTarget, BulkLoad, TargetTable};
use sluice_core::table::TableRef;
use sluice_core::{Error, ErrorKind, Result, Retry};
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
        let target = PgTarget::parse(url).map_err(|e| {
            Error::new(
                e.kind(),
                Retry::Permanent,
                e.message().replacen("source URL", "target URL", 1),
            )
        })?;
        Ok(PgApplyTarget { target })
    }

    fn display(&self) -> &str {
        self.target.display()
    }

    /// A session with the apply settings.
    async fn connect(&self) -> Result<Client> {
        let client =
            self.target.connect(TAG).await.map_err(|e| {
                Error::new(ErrorKind::Destination, e.retry(), e.message().to_string())
            })?;
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
    let Some(db) = e.as_db_error() else {
        let cause = std::error::Error::source(&e)
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
        "23505" | "23503" | "40001" | "40P01" | "55P03" => Error::apply_conflict(msg),
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

/// The bookkeeping tables.
const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS sluice.applied (
        name text NOT NULL, worker integer NOT NULL, unit bigint NOT NULL,
        restart text NOT NULL, pos text NOT NULL, commit_ts bigint,
        updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (name, worker));
     CREATE TABLE IF NOT EXISTS sluice.state (
        name text PRIMARY KEY, state bytea NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now())";

#[async_trait]
impl ApplyTarget for PgApplyTarget {
    fn engine(&self) -> &'static str {
        "postgres"
    }

    fn display_url(&self) -> String {
        self.display().to_string()
    }

    async fn prepare(&self) -> Result<()> {
        let client = self.connect().await?;
        let d = self.display();
        let (user, db) = self.whoami(&client).await?;
        let r = client
            .query_one(
                "SELECT has_database_privilege(current_database(), 'CREATE'), \
                   n.oid IS NOT NULL, \
                   n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'USAGE') \
                     AND has_schema_privilege(n.oid, 'CREATE'), \
                   n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'USAGE'), \
                   coalesce(b.n = 2, false), \
                   coalesce(b.n = 2 AND b.writable, false) \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN pg_namespace n ON n.nspname = 'sluice' \
                 LEFT JOIN LATERAL (SELECT count(*) AS n, bool_and( \
                     has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT') \
                     AND has_table_privilege(c.oid, 'UPDATE') \
                     AND has_table_privilege(c.oid, 'DELETE')) AS writable \
                   FROM pg_class c WHERE c.relnamespace = n.oid \
                     AND c.relname IN ('applied', 'state')) AS b ON true",
                &[],
            )
            .await
            .map_err(|e| failed(e, d, "checking privileges"))?;
        let (db_create, schema, schema_create, tables): (bool, bool, bool, bool) =
            (r.get(0), r.get(1), r.get(2), r.get(4));
        let user_q = crate::sql::quote_ident(&user);
        let missing = |grant: String, why: &str| {
            Error::destination(
                Retry::Permanent,
                format!(
                    "user {user} cannot {why} on the target {d}: run {grant} (as the database \
                     owner or a superuser), or connect as a user that can"
                ),
            )
        };
        if !schema && !db_create {
            return Err(missing(
                format!(
                    "GRANT CREATE ON DATABASE {} TO {user_q};",
                    crate::sql::quote_ident(&db)
                ),
                "create schema sluice (where replication keeps its applied position)",
            ));
        }
        if schema && !tables && !schema_create {
            return Err(missing(
                format!("GRANT USAGE, CREATE ON SCHEMA sluice TO {user_q};"),
                "create sluice's bookkeeping tables in schema sluice",
            ));
        }
        if tables {
            if !r.get::<_, bool>(5) || !r.get::<_, bool>(3) {
                return Err(missing(
                    format!(
                        "GRANT USAGE ON SCHEMA sluice TO {user_q}; GRANT SELECT, INSERT, \
                         UPDATE, DELETE ON sluice.applied, sluice.state TO {user_q};"
                    ),
                    "write sluice's bookkeeping tables",
                ));
            }
            return Ok(());
        }
        let sql = if schema {
            BOOKKEEPING.to_string()
        } else {
            format!("CREATE SCHEMA IF NOT EXISTS sluice; {BOOKKEEPING}")
        };
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| failed(e, d, "creating schema sluice and its tables"))
    }

    async fn create_tables(&self, tables: &[TargetTable]) -> Result<Vec<String>> {
        let client = self.connect().await?;
        let (user, db) = self.whoami(&client).await?;
        ddl::create_tables(&client, tables, self.display(), &user, &db).await
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

    async fn load_state(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let client = self.connect().await?;
        let row = client
            .query_opt("SELECT state FROM sluice.state WHERE name = $1", &[&name])
            .await
            .map_err(|e| failed(e, self.display(), "reading sluice.state"))?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn save_state(&self, name: &str, state: &[u8]) -> Result<()> {
        let client = self.connect().await?;
        client
            .execute(
                "INSERT INTO sluice.state (name, state) VALUES ($1, $2) ON CONFLICT (name) \
                 DO UPDATE SET state = excluded.state, updated_at = now()",
                &[&name, &state],
            )
            .await
            .map_err(|e| failed(e, self.display(), "writing sluice.state"))?;
        Ok(())
    }

    async fn clear_state(&self, name: &str) -> Result<()> {
        let mut client = self.connect().await?;
        let d = self.display().to_string();
        let tx = client
            .transaction()
            .await
            .map_err(|e| failed(e, &d, "clearing the replication's state"))?;
        for sql in [
            "DELETE FROM sluice.applied WHERE name = $1",
            "DELETE FROM sluice.state WHERE name = $1",
        ] {
            tx.execute(sql, &[&name])
                .await
                .map_err(|e| failed(e, &d, "clearing the replication's state"))?;
        }
        tx.commit()
            .await
            .map_err(|e| failed(e, &d, "clearing the replication's state"))
    }

    async fn applied(&self, name: &str) -> Result<Option<AppliedPosition>> {
        let client = self.connect().await?;
        let row = client
            .query_opt(
                "SELECT unit, restart, pos, commit_ts FROM sluice.applied WHERE name = $1 \
                 ORDER BY unit DESC LIMIT 1",
                &[&name],
            )
            .await
            .map_err(|e| failed(e, self.display(), "reading sluice.applied"))?;
        Ok(row.map(|r| AppliedPosition {
            unit: r.get::<_, i64>(0) as u64,
            restart: r.get(1),
            pos: r.get(2),
            commit_ts: r.get(3),
        }))
    }

    async fn session(&self, name: &str, worker: u32) -> Result<Box<dyn ApplySession>> {
        Ok(Box::new(session::PgSession::new(
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
