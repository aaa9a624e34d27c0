//! The harm budget's signals on MySQL/MariaDB, each on a session of its own opened at its
//! first read (and again after a failure), all of foreign load only:
//!
//! - **replica lag** on a replica (`--replica URL`): `Seconds_Behind_Source` (MySQL 8.0.22+,
//!   `SHOW REPLICA STATUS`) or `Seconds_Behind_Master` (MariaDB, older MySQL: `SHOW SLAVE
//!   STATUS`). NULL means the replica's SQL or I/O thread is stopped: the lag is unknown and
//!   growing, so it is an unreadable signal, not zero. The source itself knows nothing of its
//!   replicas' lag, so without `--replica` there is no replica lag to read.
//! - **canary latency**: a cheap indexed lookup in the catalog (or `--probe-sql`), timed.
//! - **active sessions** of others: `information_schema.PROCESSLIST` rows running a
//!   statement, the run's sessions excluded. A user without PROCESS sees only their own
//!   sessions: the count is then of those (documented, not detectable).

use crate::catalog;
use crate::connect::MyTarget;
use crate::error::{Phase, classify};
use crate::harm::Sessions;
use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::budget::{SignalKind, SignalReader, SignalRequest};
use sluice_core::{Error, Result};
use std::time::Instant;

/// The default canary: one row of the catalog by its key.
const CANARY: &str =
    "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = 'information_schema'";

/// What a reader reads.
enum What {
    ReplicaLag,
    Canary(String),
    Active,
}

/// One signal on its own, lazily opened session.
struct MySignal {
    what: What,
    target: Option<MyTarget>,
    /// The run's sessions (excluded from the active count; the source's signal sessions join
    /// them). A replica's reader has its own.
    sessions: Sessions,
    conn: Option<Conn>,
    /// Why the target could not even be parsed (a bad `--replica` URL).
    broken: Option<String>,
}

/// The readers `request` asks for, on `target` (the source) and each replica URL.
pub(super) fn open(
    target: &MyTarget,
    sessions: &Sessions,
    request: &SignalRequest,
) -> Vec<Box<dyn SignalReader>> {
    let mut out: Vec<Box<dyn SignalReader>> = Vec::new();
    let on =
        |what, target: Option<MyTarget>, sessions: Sessions, broken| -> Box<dyn SignalReader> {
            Box::new(MySignal {
                what,
                target,
                sessions,
                conn: None,
                broken,
            })
        };
    if request.replica_lag {
        for url in &request.replicas {
            out.push(match MyTarget::parse(url) {
                Ok(t) => on(What::ReplicaLag, Some(t), Sessions::default(), None),
                Err(e) => on(
                    What::ReplicaLag,
                    None,
                    Sessions::default(),
                    Some(format!("--replica: {e}")),
                ),
            });
        }
    }
    if request.latency {
        let sql = request.probe_sql.clone().unwrap_or_else(|| CANARY.into());
        out.push(on(
            What::Canary(sql),
            Some(target.clone()),
            sessions.clone(),
            None,
        ));
    }
    if request.active {
        out.push(on(
            What::Active,
            Some(target.clone()),
            sessions.clone(),
            None,
        ));
    }
    out
}

impl MySignal {
    fn display(&self) -> String {
        self.target
            .as_ref()
            .map_or_else(|| "--replica".into(), |t| t.display().to_string())
    }

    async fn conn(&mut self) -> Result<&mut Conn> {
        let target = match (&self.target, &self.broken) {
            (_, Some(why)) => return Err(Error::config(why.clone())),
            (Some(t), None) => t,
            (None, None) => return Err(Error::internal("a signal without a target")),
        };
        if self.conn.is_none() {
            self.conn = Some(target.connect(&self.sessions).await?);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| Error::internal("a signal session vanished"))
    }

    async fn read_once(&mut self) -> Result<f64> {
        let shown = self.display();
        let err = |e| classify(e, Phase::Catalog, &shown);
        match &self.what {
            What::ReplicaLag => {
                let conn = self.conn().await?;
                let row: Option<Row> = match conn.query_first("SHOW REPLICA STATUS").await {
                    Ok(r) => r,
                    Err(_) => conn.query_first("SHOW SLAVE STATUS").await.map_err(err)?,
                };
                let row = row.ok_or_else(|| {
                    Error::config(format!(
                        "--replica {shown} is not a replica (no replica status)"
                    ))
                })?;
                let lag = ["Seconds_Behind_Source", "Seconds_Behind_Master"]
                    .iter()
                    .find_map(|c| row.columns_ref().iter().position(|k| k.name_str() == *c));
                let Some(i) = lag else {
                    return Err(Error::source_permanent(format!(
                        "{shown}: the replica status has no Seconds_Behind_Source column"
                    )));
                };
                match catalog::text(&row, i).trim() {
                    "" => Err(Error::source_transient(format!(
                        "{shown}: replication is stopped (Seconds_Behind_Source is NULL: the \
                         SQL or I/O thread is not running), so its lag is unknown"
                    ))),
                    _ => Ok(catalog::number(&row, i) as f64),
                }
            }
            What::Canary(sql) => {
                let sql = sql.clone();
                let conn = self.conn().await?;
                let start = Instant::now();
                conn.query_drop(sql).await.map_err(err)?;
                Ok(start.elapsed().as_secs_f64())
            }
            What::Active => {
                let list = std::iter::once("CONNECTION_ID()".to_string())
                    .chain(self.sessions.ids().iter().map(u32::to_string))
                    .collect::<Vec<_>>()
                    .join(",");
                let sql = format!(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                     WHERE COMMAND NOT IN ('Sleep', 'Daemon', 'Binlog Dump', \
                                           'Binlog Dump GTID', 'Connect', 'Killed') \
                       AND ID NOT IN ({list})"
                );
                let conn = self.conn().await?;
                let row: Option<Row> = conn.query_first(sql).await.map_err(err)?;
                Ok(row.map_or(0, |r| catalog::number(&r, 0)) as f64)
            }
        }
    }
}

#[async_trait]
impl SignalReader for MySignal {
    fn kind(&self) -> SignalKind {
        match self.what {
            What::ReplicaLag => SignalKind::ReplicaLag,
            What::Canary(_) => SignalKind::Latency,
            What::Active => SignalKind::Active,
        }
    }

    fn name(&self) -> String {
        match self.what {
            What::ReplicaLag => format!("replica lag ({})", self.display()),
            What::Canary(_) => "canary latency".into(),
            What::Active => "active sessions of others".into(),
        }
    }

    async fn read(&mut self) -> Result<f64> {
        let r = self.read_once().await;
        if r.is_err() {
            // A failed session may be broken: the next read opens a new one.
            self.conn = None;
        }
        r
    }
}
