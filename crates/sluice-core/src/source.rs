//! The traits a database adapter implements.
//!
//! The split mirrors who holds what during an export:
//! - [`Source`] knows how to connect (URL, credentials) and opens sessions;
//! - [`Coordinator`] is the one session that resolves the selection, plans chunks, holds the
//!   shared snapshot for the whole run, and opens worker sessions under it;
//! - [`ChunkReader`] is one worker session that streams chunks as Arrow batches;
//! - [`HarmProbe`] is a separate session that samples what the run costs the source.
//!
//! Adapters never touch files: they produce batches. The engine never touches SQL: it hands out
//! chunks. That keeps each database in its own crate with the same file names.

use crate::batch::BatchSender;
use crate::chunk::{Chunk, ChunkRequest};
use crate::error::Result;
use crate::position::SnapshotInfo;
use crate::table::{Dataset, Selection};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How readers agree on what they see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// One snapshot shared by every worker: the output is the database as of one point. The
    /// snapshot is held (and, in PostgreSQL, VACUUM's horizon pinned) for the whole run.
    #[default]
    Snapshot,
    /// Each chunk in its own short transaction: far less harm to the source, but the output is
    /// not one point in time — rows changed during the run may be seen in either state.
    Chunk,
    /// Each chunk in its own short transaction, as [`Consistency::Chunk`], while the source's
    /// change log is followed from before the first chunk; at the end every row whose key
    /// changed during the run is read again under one snapshot at a log position T and
    /// replaces its copies, so the output is the table after every transaction committed
    /// before T. No snapshot lives longer than a chunk, except the one at T, which lives as
    /// long as reading the changed keys takes. Needs a source that can capture changes and a
    /// key on every table (see the engine's `converge` module).
    Converged,
}

impl Consistency {
    /// How the sessions of a run read: a converged run's chunks are read each in its own
    /// transaction, as with chunk consistency; only the engine knows the difference.
    pub fn at_source(self) -> Consistency {
        match self {
            Consistency::Converged => Consistency::Chunk,
            c => c,
        }
    }
}

impl std::fmt::Display for Consistency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Consistency::Snapshot => "snapshot",
            Consistency::Chunk => "chunk",
            Consistency::Converged => "converged",
        })
    }
}

/// Options every session of a run shares.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// A tag identifying this run's sessions, so the harm probe can find them: PostgreSQL
    /// records each session's backend pid under it, Firebird sets it as a session context
    /// variable (MySQL keeps connection ids instead).
    pub session_tag: String,
    /// How readers agree on what they see.
    pub consistency: Consistency,
    /// Export only the rows row-level security policies let the user see, instead of failing
    /// on a table whose policies would filter rows (PostgreSQL `row_security`; engines without
    /// row-level security ignore it).
    pub enable_row_security: bool,
}

/// What one chunk read produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Rows sent.
    pub rows: u64,
    /// Bytes received from the source.
    pub wire_bytes: u64,
}

/// One sample of the harm a run does to its source.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HarmSample {
    /// Connections the run holds right now.
    pub connections: u32,
    /// Age in transactions of the oldest xmin our sessions hold (PostgreSQL: how far VACUUM's
    /// horizon is pinned). `None` where the engine has no such notion.
    pub xmin_age: Option<u64>,
    /// Longest open transaction among our sessions.
    pub longest_transaction: Duration,
    /// Longest running statement among our sessions.
    pub longest_statement: Duration,
    /// Other sessions waiting right now on a lock one of our sessions holds (PostgreSQL:
    /// `pg_blocking_pids`; MySQL/MariaDB: metadata-lock waits). An `ALTER` queued behind our
    /// lock blocks every later query on its table, so this is harm the DBA must see.
    pub blocked_sessions: u32,
    /// Longest wait among those blocked sessions.
    pub longest_blocked_wait: Duration,
}

/// What only the adapter knows about a run, for its report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFacts {
    /// How long a server-wide lock was held to start the shared snapshot (MySQL), if one was.
    pub global_lock_held: Option<Duration>,
    /// How long the run waited to be granted that lock (every write on the server may queue
    /// behind a waiting lock request), if one was taken.
    pub global_lock_wait: Option<Duration>,
    /// Datasets whose rows are not at the snapshot's point in time although the run reads
    /// under one, by name, with the reason (MySQL: a MyISAM, Aria or MEMORY table is not
    /// transactional, so a consistent snapshot does not cover it). The manifest marks them.
    pub outside_snapshot: std::collections::BTreeMap<String, String>,
    /// Remarks for the report (e.g. values the adapter had to export as NULL, and why).
    pub notes: Vec<String>,
}

/// A database the run reads from. Cheap to share; sessions are opened on demand.
#[async_trait]
pub trait Source: Send + Sync {
    /// Engine name for reports (`postgres`, `mysql`, `firebird`).
    fn engine(&self) -> &'static str;

    /// The source location with secrets redacted, for messages and the manifest.
    fn display_url(&self) -> String;

    /// Open the coordinator session.
    async fn open_coordinator(&self, options: &SourceOptions) -> Result<Box<dyn Coordinator>>;

    /// Open a separate session that samples harm; it must not hold a snapshot itself.
    async fn open_harm_probe(&self, options: &SourceOptions) -> Result<Box<dyn HarmProbe>>;

    /// Rows of each dataset's table inserted, updated or deleted so far, by the server's own
    /// counters (PostgreSQL: `pg_stat_user_tables`, partitions summed): sampled twice by
    /// `sluice plan`, the difference is the recent change rate a converged export's forecast
    /// rests on. The counters lag by up to a second or so. `None` (the default) where the
    /// engine keeps none.
    async fn change_counts(
        &self,
        datasets: &[crate::Dataset],
    ) -> Result<Option<std::collections::BTreeMap<String, u64>>> {
        let _ = datasets;
        Ok(None)
    }

    /// This source, its sessions reading under `snapshot` — a snapshot another session holds
    /// and exported ([`Coordinator::pin_snapshot`]'s id), possibly in another process on
    /// another machine — instead of taking one of their own: how readers that a distributed
    /// engine (Spark) spreads over machines see one point in time. The snapshot is only
    /// joinable while its holder keeps it. Engines that cannot import a snapshot by name
    /// (MySQL/MariaDB) refuse with what a read can promise instead.
    fn importing(&self, snapshot: &SnapshotInfo) -> Result<std::sync::Arc<dyn Source>> {
        let _ = snapshot;
        Err(crate::Error::config(format!(
            "{} cannot share one snapshot between sessions (a session cannot join another's \
             snapshot by name), so reads spread over several processes are consistent per \
             chunk only: each chunk is one transaction, and rows changed meanwhile may be seen \
             in either state. Read without a shared snapshot, or use sluice export on one \
             machine for one point in time.",
            self.engine()
        )))
    }
}

/// The session that plans the run and holds its snapshot.
#[async_trait]
pub trait Coordinator: Send {
    /// Server product and version, e.g. `PostgreSQL 15.18`.
    fn server_version(&self) -> String;

    /// Resolve the user's selection into datasets with their columns and size estimates.
    /// Fails with a configuration error for a named table that does not exist.
    async fn discover(&mut self, selection: &Selection) -> Result<Vec<Dataset>>;

    /// The tables `selection` selects now and every table there is (`captured` looked up by
    /// exact name where a listing would not show them), by name only (nothing described, a
    /// missing named table left out): what a running stream compares with the tables it
    /// captures. Sources without change capture need not answer.
    async fn table_names(
        &mut self,
        selection: &Selection,
        captured: &[crate::table::TableRef],
    ) -> Result<crate::select::TablesNow> {
        let _ = (selection, captured);
        Err(crate::error::Error::config(
            "this source cannot list its tables for a running stream",
        ))
    }

    /// Split one dataset into chunks (at least one, even for an empty table, so every
    /// dataset has a part file carrying its schema).
    async fn plan_chunks(
        &mut self,
        dataset: &Dataset,
        request: &ChunkRequest,
    ) -> Result<Vec<Chunk>>;

    /// Take the shared snapshot for `datasets` (and, for snapshot consistency, protect the
    /// tables against changes that would make it lie, such as TRUNCATE). Call once, after
    /// discovery; readers opened afterwards see this snapshot.
    async fn pin_snapshot(&mut self, datasets: &[Dataset]) -> Result<SnapshotInfo>;

    /// Called before [`Coordinator::pin_snapshot`] with the number of workers the run will
    /// open, for engines whose workers must begin their transactions while the snapshot's lock
    /// is held (MySQL opens the sessions here, outside the lock). Engines that can join a
    /// snapshot later (PostgreSQL) keep the default, which does nothing.
    async fn reserve_readers(&mut self, n: usize) -> Result<()> {
        let _ = n;
        Ok(())
    }

    /// Open `n` worker sessions reading under the pinned snapshot.
    async fn open_readers(&mut self, n: usize) -> Result<Vec<Box<dyn ChunkReader>>>;

    /// Replace a worker session that was lost. Fails permanently when the snapshot can no
    /// longer be joined (the coordinator itself was lost, or the engine cannot rejoin one).
    async fn reopen_reader(&mut self) -> Result<Box<dyn ChunkReader>>;

    /// Figures and remarks for the report, read once after the workers finished (before
    /// [`Coordinator::release`]). The default has none.
    fn run_facts(&self) -> RunFacts {
        RunFacts::default()
    }

    /// End the snapshot and close. Idempotent.
    async fn release(&mut self) -> Result<()>;
}

/// A worker session.
#[async_trait]
pub trait ChunkReader: Send {
    /// Stream the rows of `chunk` of `dataset` into `out` as Arrow batches cut at
    /// `out.batch_bytes()`. On error the batches already sent must be discarded by the caller.
    ///
    /// Errors name the chunk once, as `<dataset> part <ordinal>: …` (the reader knows the row
    /// and column that failed, so it is the one that says which chunk); callers log and return
    /// them as they are, without a prefix of their own, so no message names its subject twice.
    async fn read(
        &mut self,
        dataset: &Dataset,
        chunk: &Chunk,
        out: &BatchSender,
    ) -> Result<ReadStats>;

    /// The server-side identifier of this session (PostgreSQL backend pid), for diagnostics
    /// and fault-injection tests.
    fn session_id(&self) -> Option<u64>;
}

/// Samples the harm a run does, on its own session.
#[async_trait]
pub trait HarmProbe: Send {
    /// Take one sample of the run's sessions (found by the session tag).
    async fn sample(&mut self) -> Result<HarmSample>;

    /// The readers of the foreign-load signals `request` asks for, each to be read on its own
    /// session (opened lazily; see [`crate::budget`]). The default has none: an engine without
    /// them reads no signal, and a budget that needs one says it could not be read.
    fn open_signals(
        &mut self,
        request: &crate::budget::SignalRequest,
    ) -> Vec<Box<dyn crate::budget::SignalReader>> {
        let _ = request;
        Vec::new()
    }
}
