//! Sampling the harm a run does to Firebird, from an attachment of its own.
//!
//! Our attachments carry the run's tag in the session context variable `SLUICE_TAG`, which
//! `MON$CONTEXT_VARIABLES` shows. The MON$ tables are a snapshot per transaction, so every
//! sample runs in a fresh transaction. Firebird's cost of a long export is the **transaction
//! gap**: while our snapshot transaction is open, record versions newer than it cannot be
//! garbage collected; `xmin_age` reports next transaction − our oldest transaction.

use crate::connect::{FbTarget, Session, as_i64};
use crate::error::{Phase, classify};
use crate::sql::quote_literal;
use async_trait::async_trait;
use sluice_core::{HarmProbe, HarmSample, Result};
use std::time::Duration;

/// The harm probe session.
pub struct FbHarmProbe {
    session: Session,
    sql: String,
    target: String,
}

impl FbHarmProbe {
    /// Attach the probe (tagged like the run, so it counts as one of its connections).
    pub async fn open(target: &FbTarget, tag: &str) -> Result<Self> {
        let ours = format!(
            "SELECT v.MON$ATTACHMENT_ID FROM MON$CONTEXT_VARIABLES v \
             WHERE v.MON$VARIABLE_NAME = 'SLUICE_TAG' AND v.MON$VARIABLE_VALUE = {}",
            quote_literal(tag)
        );
        let sql = format!(
            "SELECT (SELECT COUNT(*) FROM ({ours}) o), \
                    (SELECT MON$NEXT_TRANSACTION FROM MON$DATABASE) - \
                      (SELECT MIN(t.MON$TRANSACTION_ID) FROM MON$TRANSACTIONS t \
                       WHERE t.MON$ATTACHMENT_ID IN ({ours}) AND t.MON$ATTACHMENT_ID <> CURRENT_CONNECTION), \
                    (SELECT DATEDIFF(MILLISECOND FROM MIN(t.MON$TIMESTAMP) TO CURRENT_TIMESTAMP) \
                       FROM MON$TRANSACTIONS t \
                       WHERE t.MON$ATTACHMENT_ID IN ({ours}) AND t.MON$ATTACHMENT_ID <> CURRENT_CONNECTION), \
                    (SELECT DATEDIFF(MILLISECOND FROM MIN(s.MON$TIMESTAMP) TO CURRENT_TIMESTAMP) \
                       FROM MON$STATEMENTS s \
                       WHERE s.MON$STATE = 1 AND s.MON$ATTACHMENT_ID IN ({ours}) \
                         AND s.MON$ATTACHMENT_ID <> CURRENT_CONNECTION) \
             FROM RDB$DATABASE"
        );
        Ok(FbHarmProbe {
            session: target.open(tag).await?,
            sql,
            target: target.display().to_string(),
        })
    }
}

#[async_trait]
impl HarmProbe for FbHarmProbe {
    async fn sample(&mut self) -> Result<HarmSample> {
        let sql = self.sql.clone();
        let row = self
            .session
            .call(move |c| {
                c.begin("SET TRANSACTION READ ONLY ISOLATION LEVEL SNAPSHOT")?;
                let r = c.query(&sql, vec![]);
                c.commit()?;
                r
            })
            .await?
            .map_err(|e| classify(e, Phase::Catalog, &self.target))?;
        let v = |i: usize| {
            row.first()
                .and_then(|r| r.get(i))
                .and_then(as_i64)
                .map(|v| v.max(0) as u64)
        };
        let ms = |i: usize| Duration::from_millis(v(i).unwrap_or(0));
        Ok(HarmSample {
            connections: v(0).unwrap_or(0) as u32,
            xmin_age: v(1),
            longest_transaction: ms(2),
            longest_statement: ms(3),

            ..HarmSample::default()
        })
    }
}
