//! One apply worker's session: a unit's rows as SQL text, sent in at most two round trips.
//!
//! What the statements are, how they are buffered and when they are sent is
//! [`sluice_core::apply::planner`]'s ([`Planner`]); their spelling is `MySql`'s. This file
//! holds the round trip (`MyLink`): the buffer goes as one multi-statement batch, each
//! statement's affected rows read from its result (with `CLIENT_FOUND_ROWS`, the rows an
//! update matched); and the barriers, whose DDL commits by itself here.

use super::dialect::MySql;
use super::fail;
use crate::sql::quote_table;
use async_trait::async_trait;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use sluice_core::apply::planner::{ApplyLink, Barriers, PlannedSession, Planner};
use sluice_core::apply::{ColumnChange, Engine};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};

/// The session's connection, as the planner sends through it; with the planner, an apply
/// session (see the module documentation).
pub(super) struct MyLink {
    conn: Conn,
    display: String,
}

/// A session over `conn` (already set up) for worker `worker` of replication `name`.
pub(super) fn new(
    conn: Conn,
    display: String,
    name: &str,
    worker: u32,
    mysql_json: bool,
) -> PlannedSession<MySql, MyLink> {
    PlannedSession::new(
        Planner::new(MySql { mysql_json }, name, worker),
        MyLink { conn, display },
    )
}

#[async_trait]
impl ApplyLink for MyLink {
    async fn send(&mut self, sql: &str, tables: &[TableRef]) -> Result<Vec<u64>> {
        counted(&mut self.conn, sql).await.map_err(|e| {
            let what = match tables.len() {
                0 => "applying a unit to".to_string(),
                _ => {
                    let names: Vec<String> = tables.iter().map(ToString::to_string).collect();
                    format!("applying a unit ({}) to", names.join(", "))
                }
            };
            fail(e, &self.display, &what)
        })
    }

    async fn holders(&mut self, _tables: &[TableRef]) -> String {
        holders(&mut self.conn).await
    }
}

/// Run `sql` (statements separated by `;`) and return each statement's affected rows, in
/// order: with the session's `CLIENT_FOUND_ROWS`, the rows an update matched.
///
/// The server stops at the first statement that fails; its error is what this returns
/// (reading on past the last result set, as `drop_result` does, is what surfaces it).
async fn counted(conn: &mut Conn, sql: &str) -> mysql_async::Result<Vec<u64>> {
    let mut result = conn.query_iter(sql).await?;
    let mut counts = vec![result.affected_rows()];
    while !result.is_empty() {
        if result.next().await?.is_some() {
            continue;
        }
        counts.push(result.affected_rows());
    }
    result.drop_result().await?;
    Ok(counts)
}

/// Sessions in open transactions on the target (who may hold the lock a statement gave up
/// waiting for), for the message.
async fn holders(conn: &mut Conn) -> String {
    /// Connection id, user, host, seconds in its state, statement.
    type Holder = (u64, String, String, u64, String);
    let rows: std::result::Result<Vec<Holder>, _> = conn
        .query(
            "SELECT p.ID, p.USER, p.HOST, p.TIME, LEFT(COALESCE(p.INFO, ''), 80) \
             FROM information_schema.INNODB_TRX t \
             JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
             WHERE p.ID <> CONNECTION_ID() ORDER BY t.trx_started",
        )
        .await;
    match rows {
        Ok(rows) if !rows.is_empty() => {
            let list: Vec<String> = rows
                .iter()
                .map(|(id, user, host, time, info)| {
                    format!("id {id} ({user}@{host}, {time} s in its state, {info:?})")
                })
                .collect();
            format!("Sessions with open transactions: {}.", list.join("; "))
        }
        _ => "Another session holds the lock (SHOW PROCESSLIST lists it).".into(),
    }
}

#[async_trait]
impl Barriers<MySql> for MyLink {
    const DDL_COMMITS: bool = true;

    async fn truncate(&mut self, _plan: &mut Planner<MySql>, tables: &[TableRef]) -> Result<()> {
        for t in tables {
            // Truncating twice leaves the same empty table.
            self.conn
                .query_drop(format!("TRUNCATE TABLE {}", quote_table(t)))
                .await
                .map_err(|e| fail(e, &self.display, &format!("truncating {t} on")))?;
        }
        Ok(())
    }

    async fn alter(&mut self, _plan: &mut Planner<MySql>, change: &ColumnChange) -> Result<()> {
        let MyLink { conn, display } = self;
        let table = &change.table;
        let have = super::columns_of(conn, table, display).await?;
        if have.is_empty() {
            return Err(Error::config(format!(
                "the target table {table} is missing on {display}; drop the replication's \
                 state and start again with an initial load",
            )));
        }
        let same_engine = change.source_engine == Engine::Mysql;
        if let Some(sql) =
            super::ddl::alter_columns(table, &have, &change.before, &change.columns, same_engine)
        {
            conn.query_drop(sql)
                .await
                .map_err(|e| fail(e, display, &format!("altering {table} on")))?;
        }
        Ok(())
    }
}
