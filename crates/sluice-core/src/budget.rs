//! The harm budget's vocabulary: the signals of *foreign* load an export steers its pace by
//! (replica lag, a canary query's latency, other sessions' activity), as an adapter reads them.
//!
//! An adapter's [`crate::HarmProbe`] opens the readers a budget asks for
//! ([`crate::HarmProbe::open_signals`]); the engine reads each on its own task at the
//! reader's [`SignalReader::interval`], keeps the readings, and decides between chunks. A
//! reader never counts the run's own sessions (they are tagged), so the export's own reads do
//! not steer it: a governor reading its own load strangles itself.
//!
//! A reader that cannot read (a replica that is unreachable, a role that may not see other
//! sessions) returns an error from [`SignalReader::read`]; the engine then pauses new chunks
//! (fail closed) and says why. Readers connect lazily and reconnect on the next read, so a
//! replica that comes back is read again.

use crate::error::Result;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What a signal measures, which fixes its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalKind {
    /// How far a replica's replay is behind, seconds.
    ReplicaLag,
    /// The canary query's latency, seconds (the engine keeps its 95th percentile).
    Latency,
    /// Foreground sessions of others running a statement right now.
    Active,
}

impl SignalKind {
    /// The unit of its values, as shown next to them.
    pub fn unit(self) -> &'static str {
        match self {
            SignalKind::ReplicaLag | SignalKind::Latency => "s",
            SignalKind::Active => "sessions",
        }
    }

    /// How often a signal of this kind is read: the canary every 250 ms (its percentile needs
    /// samples), the others every second.
    pub fn interval(self) -> Duration {
        match self {
            SignalKind::Latency => Duration::from_millis(250),
            SignalKind::ReplicaLag | SignalKind::Active => Duration::from_secs(1),
        }
    }
}

/// Which signals a budget needs read, and where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignalRequest {
    /// Read replica lag: on the source (PostgreSQL's `pg_stat_replication`) and on each of
    /// `replicas`.
    pub replica_lag: bool,
    /// Replica URLs read directly (PostgreSQL: the replica's own replay timestamp;
    /// MySQL/MariaDB: `SHOW REPLICA STATUS`). Credentials stay in the reader, never in names.
    pub replicas: Vec<String>,
    /// Run a canary query and time it.
    pub latency: bool,
    /// The canary's statement (default: a cheap indexed catalog lookup).
    pub probe_sql: Option<String>,
    /// Count other sessions' running statements.
    pub active: bool,
}

/// One signal of foreign load, read on a session of its own.
#[async_trait]
pub trait SignalReader: Send {
    /// What it measures.
    fn kind(&self) -> SignalKind;

    /// Its name in messages and charts: `replica lag (127.0.0.1:5433)`, `canary latency`.
    /// Never carries a secret.
    fn name(&self) -> String;

    /// How often to read it; unreadable for longer than this pauses new chunks.
    fn interval(&self) -> Duration {
        self.kind().interval()
    }

    /// Read it once, in the unit of [`SignalReader::kind`]. An error means "unknown now":
    /// the engine fails closed while it lasts.
    async fn read(&mut self) -> Result<f64>;
}
