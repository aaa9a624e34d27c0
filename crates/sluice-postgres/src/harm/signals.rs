//! The harm budget's signals on PostgreSQL, each on a session of its own opened at its first
//! read (and again after a failure), all of foreign load only:
//!
//! - **replica lag** on the source: `pg_stat_replication`'s `replay_lag` for every replica
//!   whose replay is behind the current WAL position (0 for one that has caught up, whose
//!   `replay_lag` keeps its last value). Its positions are hidden from a role without
//!   `pg_monitor` (or `pg_read_all_stats`): that is an unreadable signal, not zero.
//! - **replica lag** on a replica (`--replica URL`): `now() - pg_last_xact_replay_timestamp()`
//!   while WAL is received but not yet replayed, 0 when replay has caught up.
//! - **canary latency**: a cheap indexed catalog lookup (or `--probe-sql`), timed.
//! - **active sessions** of others: client backends running a statement, the run's own
//!   sessions (their pids recorded under its tag) excluded. Sessions of other users are hidden
//!   from a role without `pg_monitor`: unreadable, not zero.

use crate::connect::PgTarget;
use crate::error::{Phase, classify};
use async_trait::async_trait;
use sluice_core::budget::{SignalKind, SignalReader, SignalRequest};
use sluice_core::{Error, Result};
use std::time::Instant;
use tokio_postgres::Client;

/// The default canary: one row of `pg_class` by its primary key.
const CANARY: &str =
    "SELECT 1 FROM pg_catalog.pg_class WHERE oid = 'pg_catalog.pg_class'::regclass";

const PRIMARY_LAG: &str = "SELECT count(*) FILTER (WHERE state IS NULL)::int8, \
     coalesce(max(CASE WHEN pg_is_in_recovery() OR replay_lsn >= pg_current_wal_lsn() THEN 0 \
                       ELSE extract(epoch FROM coalesce(replay_lag, interval '0')) END), 0)::float8 \
     FROM pg_stat_replication";

const REPLICA_LAG: &str = "SELECT pg_is_in_recovery(), \
     CASE WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0 \
          ELSE coalesce(extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()), 0) \
     END::float8";

/// Other sessions' running statements, and the rows this role may not see (their
/// `backend_type` and `state` are NULL without `pg_monitor`).
const ACTIVE: &str = "SELECT count(*) FILTER (WHERE state = 'active' \
       AND backend_type = 'client backend' AND pid <> pg_backend_pid() \
       AND NOT (pid = ANY($1) AND application_name = $2))::int8, \
     count(*) FILTER (WHERE backend_type IS NULL)::int8 \
     FROM pg_stat_activity";

/// What a reader reads.
enum What {
    PrimaryLag,
    ReplicaLag,
    Canary(String),
    Active,
}

/// One signal on its own, lazily opened session.
struct PgSignal {
    what: What,
    pg: PgTarget,
    tag: String,
    client: Option<Client>,
    /// Why the target could not even be parsed (a bad `--replica` URL): every read says so.
    broken: Option<String>,
}

/// The readers `request` asks for, on `pg` (the source) and each replica URL.
pub(super) fn open(
    pg: &PgTarget,
    tag: &str,
    request: &SignalRequest,
) -> Vec<Box<dyn SignalReader>> {
    let on = |what, pg: &PgTarget| -> Box<dyn SignalReader> {
        Box::new(PgSignal {
            what,
            pg: pg.clone(),
            tag: tag.to_string(),
            client: None,
            broken: None,
        })
    };
    let mut out = Vec::new();
    if request.replica_lag {
        out.push(on(What::PrimaryLag, pg));
        for url in &request.replicas {
            match PgTarget::parse(url) {
                Ok(replica) => out.push(on(What::ReplicaLag, &replica)),
                Err(e) => out.push(Box::new(PgSignal {
                    what: What::ReplicaLag,
                    pg: pg.clone(),
                    tag: tag.to_string(),
                    client: None,
                    broken: Some(format!("--replica: {e}")),
                })),
            }
        }
    }
    if request.latency {
        let sql = request.probe_sql.clone().unwrap_or_else(|| CANARY.into());
        out.push(on(What::Canary(sql), pg));
    }
    if request.active {
        out.push(on(What::Active, pg));
    }
    out
}

impl PgSignal {
    async fn client(&mut self) -> Result<&Client> {
        if let Some(why) = &self.broken {
            return Err(Error::config(why.clone()));
        }
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let c = self.pg.connect(&self.tag).await?;
            // Idle between reads, and never given up on: a canary stuck behind a lock is a
            // slow canary (the engine counts the time it has been running), not a failure.
            c.batch_execute(crate::replication::TIMEOUTS_OFF)
                .await
                .and(
                    c.batch_execute("SET lock_timeout = 0; SET statement_timeout = 0")
                        .await,
                )
                .map_err(|e| classify(e, Phase::Connect, self.pg.display()))?;
            self.client = Some(c);
        }
        self.client
            .as_ref()
            .ok_or_else(|| Error::internal("a signal session vanished"))
    }

    async fn read_once(&mut self) -> Result<f64> {
        let target = self.pg.display().to_string();
        let err = |e| classify(e, Phase::Catalog, &target);
        let hidden = |n: i64, what: &str| {
            Error::source_permanent(format!(
                "{target} hides {n} {what} from this role: grant it pg_monitor (or \
                 pg_read_all_stats) so the harm budget can read them"
            ))
        };
        match &self.what {
            What::PrimaryLag => {
                let r = self
                    .client()
                    .await?
                    .query_one(PRIMARY_LAG, &[])
                    .await
                    .map_err(err)?;
                let hidden_rows: i64 = r.get(0);
                if hidden_rows > 0 {
                    return Err(hidden(hidden_rows, "replicas' positions"));
                }
                Ok(r.get(1))
            }
            What::ReplicaLag => {
                let r = self
                    .client()
                    .await?
                    .query_one(REPLICA_LAG, &[])
                    .await
                    .map_err(err)?;
                if !r.get::<_, bool>(0) {
                    return Err(Error::config(format!(
                        "--replica {target} is not a replica (not in recovery)"
                    )));
                }
                Ok(r.get(1))
            }
            What::Canary(sql) => {
                let sql = sql.clone();
                let client = self.client().await?;
                let start = Instant::now();
                client.simple_query(&sql).await.map_err(err)?;
                Ok(start.elapsed().as_secs_f64())
            }
            What::Active => {
                let ours = self.pg.sessions(&self.tag);
                let app = self.pg.params().application_name.clone();
                let r = self
                    .client()
                    .await?
                    .query_one(ACTIVE, &[&ours, &app])
                    .await
                    .map_err(err)?;
                let hidden_rows: i64 = r.get(1);
                if hidden_rows > 0 {
                    return Err(hidden(hidden_rows, "sessions' states"));
                }
                Ok(r.get::<_, i64>(0) as f64)
            }
        }
    }
}

#[async_trait]
impl SignalReader for PgSignal {
    fn kind(&self) -> SignalKind {
        match self.what {
            What::PrimaryLag | What::ReplicaLag => SignalKind::ReplicaLag,
            What::Canary(_) => SignalKind::Latency,
            What::Active => SignalKind::Active,
        }
    }

    fn name(&self) -> String {
        match self.what {
            What::PrimaryLag => "replica lag (pg_stat_replication)".into(),
            What::ReplicaLag => match &self.broken {
                Some(_) => "replica lag (--replica)".into(),
                None => format!("replica lag ({})", self.pg.display()),
            },
            What::Canary(_) => "canary latency".into(),
            What::Active => "active sessions of others".into(),
        }
    }

    async fn read(&mut self) -> Result<f64> {
        let r = self.read_once().await;
        if r.is_err() {
            // A failed session may be broken: the next read opens a new one.
            self.client = None;
        }
        r
    }
}
