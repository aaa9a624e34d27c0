//! `sluice replicate --max-target-lag`: the apply of new changes held while a replica of the
//! *target* replays too far behind it. Applying faster than the target's replicas replay only
//! moves the lag from sluice to them (and to whoever reads them), so the brake reads their
//! lag on sessions of its own and holds between source transactions — never inside one —
//! with the export governor's rules (hold at once over the limit, go on below 70 % of it, hold
//! while a signal cannot be read). While held, the source is not read: PostgreSQL keeps the
//! replication connection alive with status messages; a MySQL/MariaDB binary log connection
//! the server closes for silence is opened again from the applied position when the hold ends.
//! The initial load is not held by it (it is paced by the source's harm budget).

use sluice_core::budget::{SignalKind, SignalRequest};
use sluice_core::{Consistency, Error, Result, Source, SourceOptions};
use sluice_engine::governor::Brake;
use std::sync::Arc;
use std::time::Duration;

/// `--max-target-lag` and where the target's replicas are read.
#[derive(Clone)]
pub struct TargetLag {
    /// The most replay lag any replica of the target may have before the apply holds.
    pub limit: Duration,
    /// The target, opened as a source of signals: a PostgreSQL target lists its replicas'
    /// lag in `pg_stat_replication`.
    pub target: Arc<dyn Source>,
    /// Replicas of the target read directly (`--target-replica`).
    pub replicas: Vec<String>,
}

/// Start reading the target's replicas' lag. Refused, with the fix, when the target offers
/// no lag to read (a MySQL/MariaDB target without `--target-replica`).
pub(crate) async fn start(lag: &TargetLag) -> Result<Brake> {
    let options = SourceOptions {
        session_tag: "sluice-target-lag".into(),
        consistency: Consistency::Chunk,
        enable_row_security: false,
    };
    let mut probe = lag.target.open_harm_probe(&options).await?;
    let readers: Vec<_> = probe
        .open_signals(&SignalRequest {
            replica_lag: true,
            replicas: lag.replicas.clone(),
            ..SignalRequest::default()
        })
        .into_iter()
        .filter(|r| r.kind() == SignalKind::ReplicaLag)
        .collect();
    if readers.is_empty() {
        return Err(Error::config(format!(
            "--max-target-lag: {} lists no replicas' lag of its own (a MySQL/MariaDB server's \
             replicas are read on the replicas): name each replica of the target with \
             --target-replica URL.",
            lag.target.display_url()
        )));
    }
    Ok(Brake::start(readers, lag.limit.as_secs_f64(), "target lag"))
}
