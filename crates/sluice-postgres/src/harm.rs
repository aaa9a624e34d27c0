//! What the run costs PostgreSQL, and who is in its way: sampling from a session of its own,
//! and naming the sessions involved when a lock cannot be taken.
//!
//! Our sessions are found by the backend pids recorded under the run's tag when they connected
//! ([`PgTarget::sessions`]), narrowed to our `application_name` so a pid the server has since
//! given to another client's session is not counted. (`application_name` alone cannot tell
//! two runs apart: it is `sluice`, or what the user set.) A sample reads
//! `pg_stat_activity` in its own autocommit statement — statistics views are frozen per
//! transaction, so the probe must not sit in one. Sessions blocked by ours are found with
//! `pg_blocking_pids`, asked only for sessions that wait on a lock (it is not free).
//!
//! The harm budget's signals of foreign load (replica lag, the canary, other sessions'
//! activity) are `signals.rs`'s.

mod signals;

use crate::connect::PgTarget;
use crate::error::{Phase, classify};
use async_trait::async_trait;
use sluice_core::{HarmProbe, HarmSample, Result};
use std::time::Duration;
use tokio_postgres::Client;

/// The harm probe session.
pub struct PgHarmProbe {
    client: Client,
    pg: PgTarget,
    tag: String,
    target: String,
}

impl PgHarmProbe {
    /// Open the probe's own session (tagged like the run, so it counts as one of its
    /// connections). The server's idle limits are turned off for it, as for the stream's
    /// sessions: the probe is idle between samples, and a sample delayed past a short
    /// `idle_session_timeout` (a loaded client, a worker held at a lock) would end it and lose
    /// the harm record for the rest of the run.
    pub async fn open(pg: &PgTarget, tag: &str) -> Result<Self> {
        let client = pg.connect(tag).await?;
        client
            .batch_execute(crate::replication::TIMEOUTS_OFF)
            .await
            .map_err(|e| classify(e, Phase::Connect, pg.display()))?;
        Ok(PgHarmProbe {
            client,
            pg: pg.clone(),
            tag: tag.to_string(),
            target: pg.display().to_string(),
        })
    }
}

/// How long a session has waited for its lock: `pg_locks.waitstart` (PostgreSQL 14+; read
/// through `to_jsonb` so the statement parses on older servers), else its statement's age.
const WAITED: &str = "extract(epoch FROM clock_timestamp() - coalesce(\
     (SELECT max((to_jsonb(l) ->> 'waitstart')::timestamptz) FROM pg_locks l \
      WHERE l.pid = w.pid AND NOT l.granted), w.query_start))";

#[async_trait]
impl HarmProbe for PgHarmProbe {
    async fn sample(&mut self) -> Result<HarmSample> {
        let r = self
            .client
            .query_one(
                &format!(
                    "WITH ours AS (SELECT pid, backend_xmin, xact_start, query_start, state \
                                   FROM pg_stat_activity \
                                   WHERE pid = ANY($1) AND application_name = $2), \
                          blocked AS (SELECT {WAITED} AS waited FROM pg_stat_activity w \
                                      WHERE NOT (w.pid = ANY(ARRAY(SELECT pid FROM ours))) \
                                        AND CASE WHEN w.wait_event_type = 'Lock' \
                                            THEN pg_blocking_pids(w.pid) && \
                                                 ARRAY(SELECT pid FROM ours) \
                                            ELSE false END) \
                     SELECT (SELECT count(*) FROM ours)::int4, \
                            (SELECT max(age(backend_xmin)) FROM ours \
                             WHERE pid <> pg_backend_pid())::int8, \
                            coalesce((SELECT extract(epoch FROM max(clock_timestamp() - xact_start)) \
                                      FROM ours WHERE pid <> pg_backend_pid()), 0)::float8, \
                            coalesce((SELECT extract(epoch FROM max(clock_timestamp() - query_start)) \
                                      FROM ours WHERE state = 'active' \
                                        AND pid <> pg_backend_pid()), 0)::float8, \
                            (SELECT count(*) FROM blocked)::int4, \
                            coalesce((SELECT max(waited) FROM blocked), 0)::float8"
                ),
                &[
                    &self.pg.sessions(&self.tag),
                    &self.pg.params().application_name,
                ],
            )
            .await
            .map_err(|e| classify(e, Phase::Catalog, &self.target))?;
        let secs = |v: f64| Duration::from_secs_f64(v.max(0.0));
        Ok(HarmSample {
            connections: r.get::<_, i32>(0).max(0) as u32,
            xmin_age: r.get::<_, Option<i64>>(1).map(|v| v.max(0) as u64),
            longest_transaction: secs(r.get(2)),
            longest_statement: secs(r.get(3)),
            blocked_sessions: r.get::<_, i32>(4).max(0) as u32,
            longest_blocked_wait: secs(r.get(5)),
        })
    }

    fn open_signals(
        &mut self,
        request: &sluice_core::budget::SignalRequest,
    ) -> Vec<Box<dyn sluice_core::budget::SignalReader>> {
        signals::open(&self.pg, &self.tag, request)
    }
}

/// A session holding or waiting for an ACCESS EXCLUSIVE lock, the only mode that conflicts
/// with the ACCESS SHARE lock an export takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Exclusive {
    /// Its backend pid.
    pub pid: i32,
    /// Its user.
    pub user: String,
    /// The relation, as `schema.name`.
    pub relation: String,
    /// True when it holds the lock, false when it waits for it.
    pub granted: bool,
    /// Seconds it has waited (or run, when it holds the lock).
    pub seconds: f64,
    /// Its statement, shortened.
    pub query: String,
}

impl Exclusive {
    /// `pid 4242 (user app, waiting 3.1 s): ALTER TABLE …`.
    pub fn describe(&self) -> String {
        format!(
            "pid {} (user {}, {} {:.1} s on {}): {}",
            self.pid,
            self.user,
            if self.granted {
                "holding it for"
            } else {
                "waiting"
            },
            self.seconds,
            self.relation,
            self.query
        )
    }
}

/// Other sessions holding or waiting for ACCESS EXCLUSIVE on any of `relations` (quoted
/// names), waiting ones first. Best effort: an error yields an empty list, since this only
/// explains another failure.
///
/// `ours` are the run's own backend pids ([`PgTarget::sessions`]), left out of the list.
pub async fn exclusive_lockers(
    client: &Client,
    relations: &[String],
    ours: &[i32],
) -> Vec<Exclusive> {
    let sql = format!(
        "SELECT w.pid, coalesce(w.usename::text, ''), \
                coalesce((SELECT n.nspname || '.' || c.relname FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = l.relation), \
                 l.relation::text), \
                l.granted, \
                coalesce({WAITED}, 0)::float8, \
                left(regexp_replace(coalesce(w.query, ''), '\\s+', ' ', 'g'), 200) \
         FROM pg_locks l JOIN pg_stat_activity w ON w.pid = l.pid \
         WHERE l.locktype = 'relation' AND l.mode = 'AccessExclusiveLock' \
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND l.relation = ANY (SELECT unnest($1::text[])::regclass) \
           AND w.pid <> pg_backend_pid() AND NOT (w.pid = ANY($2)) \
         ORDER BY l.granted, 5 DESC"
    );
    match client.query(&sql, &[&relations, &ours]).await {
        Ok(rows) => rows
            .iter()
            .map(|r| Exclusive {
                pid: r.get(0),
                user: r.get(1),
                relation: r.get(2),
                granted: r.get(3),
                seconds: r.get(4),
                query: r.get(5),
            })
            .collect(),
        Err(e) => {
            tracing::debug!("listing exclusive lockers failed: {e}");
            Vec::new()
        }
    }
}
