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
use sluice_core::apply::planner::{ApplyLink, Planner};
use sluice_core::apply::{AppliedPosition, ApplySession, ApplyUnit, Barrier, Engine, SourceColumn};
use sluice_core::table::TableRef;
use tokio_postgres::{Client, SimpleQueryMessage};

/// An apply session (see the module documentation).
pub struct PgSession {
    link: PgLink,
    plan: Planner<PgSql>,
}

/// The session's connection, as the planner sends through it.
struct PgLink {
    client: Client,
    display: String,
}

impl PgSession {
    /// A session over `client` (already set up) for worker `worker` of replication `name`.
    pub fn new(client: Client, display: String, name: &str, worker: u32) -> Self {
        PgSession {
            link: PgLink { client, display },
            plan: Planner::new(PgSql::default(), name, worker),
        }
    }
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

    async fn rollback(&mut self) -> Result<()> {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .map_err(|e| failed(e, &self.display, "rolling back"))
    }

    async fn holders(&mut self, tables: &[TableRef]) -> String {
        holders(&self.client, tables).await
    }
}

#[async_trait]
impl ApplySession for PgSession {
    async fn begin(&mut self) -> Result<()> {
        self.plan.begin();
        Ok(())
    }

    async fn apply(&mut self, unit: &ApplyUnit) -> Result<()> {
        self.plan.apply(unit, &mut self.link).await
    }

    /// DDL is transactional here: the barrier runs inside the unit's transaction and nothing
    /// commits early (`before` is not needed).
    async fn barrier(&mut self, barrier: &Barrier, _before: &AppliedPosition) -> Result<bool> {
        self.plan.send(&mut self.link).await?;
        match barrier {
            Barrier::Truncate(tables) => {
                if tables.is_empty() {
                    return Ok(false);
                }
                self.plan.statement(&ddl::truncate_sql(tables));
                for t in tables {
                    self.plan.touch(t);
                }
            }
            Barrier::Columns {
                table,
                before,
                columns,
                source_engine,
            } => {
                let same = *source_engine == Engine::Postgres;
                let (sql, notes) = ddl::alter_sql(
                    &self.link.client,
                    table,
                    before,
                    columns,
                    same,
                    &self.link.display,
                )
                .await?;
                for n in notes {
                    tracing::info!("{n}");
                }
                if sql.is_empty() {
                    return Ok(false);
                }
                self.plan.statement(&sql);
                self.plan.touch(table);
            }
        }
        self.plan.send(&mut self.link).await?;
        Ok(false)
    }

    async fn record(&mut self, position: &AppliedPosition) -> Result<()> {
        self.plan.record(position);
        Ok(())
    }

    async fn send(&mut self) -> Result<()> {
        self.plan.send(&mut self.link).await
    }

    async fn commit(&mut self) -> Result<()> {
        self.plan.commit(&mut self.link).await
    }

    async fn rollback(&mut self) -> Result<()> {
        self.plan.rollback(&mut self.link).await
    }

    fn unmatched(&self) -> u64 {
        self.plan.unmatched()
    }

    async fn columns(&mut self, table: &TableRef, columns: &[SourceColumn]) -> Result<()> {
        self.plan
            .followed(table, &super::bookkeeping::columns_json(columns));
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
