//! One apply worker's session: a unit's rows as SQL statements, sent in as few round trips as
//! possible.
//!
//! What the statements are, how they are buffered and when they are sent is
//! [`sluice_core::apply::planner`]'s ([`Planner`]); their spelling is `PgSql`'s. This file
//! holds the round trip (`PgLink`): the buffer goes as one simple-query message (statements
//! separated by `;`, the transaction left open by its `BEGIN`), each statement's row count read
//! from its `CommandComplete`; and the barriers, whose DDL is transactional here, so they run
//! inside the unit's transaction.

use super::dialect::PgSql;
use super::{ddl, failed, names};
use async_trait::async_trait;
use sluice_core::Result;
use sluice_core::apply::planner::{ApplyLink, Barriers, PlannedSession, Planner};
use sluice_core::apply::{ColumnChange, Engine};
use sluice_core::table::TableRef;
use tokio_postgres::{Client, SimpleQueryMessage};

/// The session's connection, as the planner sends through it; with the planner, an apply
/// session (see the module documentation).
pub struct PgLink {
    client: Client,
    display: String,
}

/// A session over `client` (already set up) for worker `worker` of replication `name`.
pub fn new(
    client: Client,
    display: String,
    name: &str,
    worker: u32,
) -> PlannedSession<PgSql, PgLink> {
    PlannedSession::new(
        Planner::new(PgSql::default(), name, worker),
        PgLink { client, display },
    )
}

#[async_trait]
impl ApplyLink for PgLink {
    async fn send(&mut self, sql: &str, tables: &[TableRef]) -> Result<Vec<u64>> {
        let what = if tables.is_empty() {
            "applying changes".to_string()
        } else {
            format!("applying changes to {}", names(tables))
        };
        let msgs = self
            .client
            .simple_query(sql)
            .await
            .map_err(|e| failed(e, &self.display, &what))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::CommandComplete(n) => Some(*n),
                _ => None,
            })
            .collect())
    }

    async fn holders(&mut self, tables: &[TableRef]) -> String {
        holders(&self.client, tables).await
    }
}

#[async_trait]
impl Barriers<PgSql> for PgLink {
    const DDL_COMMITS: bool = false;

    async fn truncate(&mut self, plan: &mut Planner<PgSql>, tables: &[TableRef]) -> Result<()> {
        if tables.is_empty() {
            return Ok(());
        }
        plan.statement(&ddl::truncate_sql(tables));
        for t in tables {
            plan.touch(t);
        }
        Ok(())
    }

    async fn alter(&mut self, plan: &mut Planner<PgSql>, change: &ColumnChange) -> Result<()> {
        let same_engine = change.source_engine == Engine::Postgres;
        let (sql, notes) = ddl::alter_sql(
            &self.client,
            &change.table,
            &change.before,
            &change.columns,
            same_engine,
            &self.display,
        )
        .await?;
        for n in notes {
            tracing::info!("{n}");
        }
        if !sql.is_empty() {
            plan.statement(&sql);
            plan.touch(&change.table);
        }
        Ok(())
    }
}

/// Who holds locks on `tables` on the target (other sessions, with what they run and since
/// when), for the message of a lock wait that was given up.
async fn holders(client: &Client, tables: &[TableRef]) -> String {
    let names: Vec<String> = tables.iter().map(crate::sql::quote_table).collect();
    let rows = client
        .query(
            "SELECT DISTINCT a.pid::text, coalesce(a.usename::text, ''), \
               coalesce(a.application_name, ''), coalesce(a.state, ''), \
               coalesce(to_char(now() - a.xact_start, 'HH24:MI:SS'), ''), \
               left(coalesce(a.query, ''), 80) \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.granted AND l.pid <> pg_backend_pid() \
               AND l.relation = ANY (SELECT to_regclass(t)::oid FROM unnest($1::text[]) t)",
            &[&names],
        )
        .await;
    match rows {
        Ok(rows) if !rows.is_empty() => {
            let list: Vec<String> = rows
                .iter()
                .map(|r| {
                    format!(
                        "pid {} (user {}, application {:?}, {}, transaction open {}, last \
                         statement {:?})",
                        r.get::<_, String>(0),
                        r.get::<_, String>(1),
                        r.get::<_, String>(2),
                        r.get::<_, String>(3),
                        r.get::<_, String>(4),
                        r.get::<_, String>(5)
                    )
                })
                .collect();
            format!("Sessions holding locks on it: {}.", list.join("; "))
        }
        _ => "Another session holds the lock (pg_locks lists it while it waits).".into(),
    }
}
