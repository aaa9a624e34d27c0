//! Sampling the harm a run does to MySQL/MariaDB, from a session of its own.
//!
//! The run's sessions are found by connection id (see `connect::Sessions`) in
//! `information_schema.PROCESSLIST`, which every user may read for their own sessions.
//! Statement age comes from MariaDB's `TIME_MS` or MySQL's whole-second `TIME`. The longest
//! transaction is the shared snapshot's age, known to the run itself (reading InnoDB's
//! transaction list would need the PROCESS privilege), or the longest statement in chunk
//! consistency, where each read is its own transaction.

use crate::catalog::{self, Flavor};
use crate::connect::{MyTarget, Sessions};
use crate::error::{Phase, classify};
use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::{HarmProbe, HarmSample, Result};
use std::time::Duration;

/// The harm probe session.
pub struct MyHarmProbe {
    conn: Conn,
    sessions: Sessions,
    flavor: Flavor,
    target: String,
}

impl MyHarmProbe {
    /// Open the probe's own session (registered like the run's, so it counts as one of its
    /// connections).
    pub async fn open(target: &MyTarget, sessions: Sessions) -> Result<Self> {
        let mut conn = target.connect(&sessions).await?;
        let flavor = catalog::server_info(&mut conn, target.display())
            .await?
            .flavor;
        Ok(MyHarmProbe {
            conn,
            sessions,
            flavor,
            target: target.display().to_string(),
        })
    }
}

#[async_trait]
impl HarmProbe for MyHarmProbe {
    async fn sample(&mut self) -> Result<HarmSample> {
        let ids = self.sessions.ids();
        let list = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let millis = match self.flavor {
            Flavor::Mariadb => "TIME_MS",
            Flavor::Mysql => "TIME * 1000",
        };
        let sql = format!(
            "SELECT COUNT(*), COALESCE(MAX(CASE WHEN COMMAND = 'Query' AND ID <> CONNECTION_ID() \
             THEN {millis} END), 0) FROM information_schema.PROCESSLIST WHERE ID IN ({list})"
        );
        let row: Option<Row> = self
            .conn
            .query_first(sql)
            .await
            .map_err(|e| classify(e, Phase::Catalog, &self.target))?;
        let (connections, statement_ms) = row
            .map(|r| (catalog::number(&r, 0), catalog::number(&r, 1)))
            .unwrap_or((0, 0));
        let longest_statement = Duration::from_millis(statement_ms);
        Ok(HarmSample {
            connections: connections.min(u32::MAX as u64) as u32,
            xmin_age: None,
            longest_transaction: self
                .sessions
                .snapshot_age()
                .unwrap_or_default()
                .max(longest_statement),
            longest_statement,
            ..HarmSample::default()
        })
    }
}
