//! Sampling the harm a run does to PostgreSQL, from a session of its own.
//!
//! Our sessions are found by the backend pids recorded under the run's tag when they connected
//! ([`PgTarget::sessions`]), narrowed to our `application_name` so a pid the server has since
//! given to another client's session is not counted. (`application_name` alone cannot tell
//! two runs apart: it is `sluice`, or what the user set.) A sample reads
//! `pg_stat_activity` in its own autocommit statement — statistics views are frozen per
//! transaction, so the probe must not sit in one.

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
    /// connections).
    pub async fn open(pg: &PgTarget, tag: &str) -> Result<Self> {
        Ok(PgHarmProbe {
            client: pg.connect(tag).await?,
            pg: pg.clone(),
            tag: tag.to_string(),
            target: pg.display().to_string(),
        })
    }
}

#[async_trait]
impl HarmProbe for PgHarmProbe {
    async fn sample(&mut self) -> Result<HarmSample> {
        let r = self
            .client
            .query_one(
                "SELECT count(*)::int4, \
                        max(age(backend_xmin)) FILTER (WHERE pid <> pg_backend_pid())::int8, \
                        coalesce(extract(epoch FROM max(clock_timestamp() - xact_start) \
                            FILTER (WHERE pid <> pg_backend_pid())), 0)::float8, \
                        coalesce(extract(epoch FROM max(clock_timestamp() - query_start) \
                            FILTER (WHERE state = 'active' AND pid <> pg_backend_pid())), 0)::float8 \
                 FROM pg_stat_activity WHERE pid = ANY($1) AND application_name = $2",
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

            ..HarmSample::default()
        })
    }
}
