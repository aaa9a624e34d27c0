//! Tables in engines without transactions (MyISAM, Aria, MEMORY, …: any engine the server
//! lists with `TRANSACTIONS = NO`), which a consistent snapshot does not cover.
//!
//! Each chunk of such a table is one consistent read (the engine locks the table for the
//! statement), but the table is not at the snapshot's point in time, nor are its parts at one
//! moment. Two ways to export them, chosen by `--lock-non-transactional`:
//!
//! - **mark** (default): read them without extra locks, warn, name them in the report and
//!   mark them `outside_snapshot` in the manifest. Nothing on the server waits for them.
//! - **lock**: a session of its own takes `LOCK TABLES … READ` on them while the global lock
//!   is held, so they are frozen at the snapshot's moment, and keeps it until the run ends.
//!   Our own reads of them use `SELECT HIGH_PRIORITY`, so a writer queued for such a table
//!   (waiting for our lock) cannot make them wait in turn.
//!   Writes to *those tables* wait meanwhile (the rest of the server is not held up, unlike
//!   mydumper's way of reading them under the global lock, which stops every commit on the
//!   server for as long as they take to read); the harm probe counts the writers that wait and
//!   the report says how long the tables were locked.

use crate::connect::{MyTarget, Sessions};
use crate::error::{Phase, classify};
use crate::sql::quote_table;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use sluice_core::Result;
use sluice_core::table::TableRef;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The run's non-transactional tables and, with `--lock-non-transactional`, their read locks.
#[derive(Default)]
pub struct NonTransactional {
    /// Dataset name → (table, engine).
    tables: BTreeMap<String, (TableRef, String)>,
    /// Whether to lock them (`--lock-non-transactional`).
    lock: bool,
    /// The session connected to take the locks (before the global lock).
    session: Option<Conn>,
    /// Since when the locks are held, on `session`.
    since: Option<Instant>,
    /// How long they were held, once released.
    held: Option<Duration>,
}

impl NonTransactional {
    /// `lock`: hold read locks on them for the run instead of marking them.
    pub fn new(lock: bool) -> Self {
        NonTransactional {
            lock,
            ..Self::default()
        }
    }

    /// Record that dataset `name` is table `t` in the non-transactional `engine`.
    pub fn add(&mut self, name: &str, t: &TableRef, engine: String) {
        self.tables.insert(name.to_string(), (t.clone(), engine));
    }

    /// The datasets that are non-transactional tables.
    pub fn names(&self) -> std::sync::Arc<std::collections::HashSet<String>> {
        std::sync::Arc::new(self.tables.keys().cloned().collect())
    }

    /// Whether their read locks are held now.
    pub fn locked(&self) -> bool {
        self.since.is_some()
    }

    /// Connect the session that will lock them, if they are to be locked (outside any lock:
    /// connecting is slow).
    pub async fn prepare(
        &mut self,
        target: &MyTarget,
        sessions: &Sessions,
        setup: &str,
    ) -> Result<()> {
        if !self.lock || self.tables.is_empty() {
            return Ok(());
        }
        let mut conn = target.connect(sessions).await?;
        conn.query_drop(setup)
            .await
            .map_err(|e| classify(e, Phase::Connect, target.display()))?;
        self.session = Some(conn);
        Ok(())
    }

    /// Under the global lock: take the read locks (no-op unless prepared).
    pub async fn lock(&mut self, sessions: &Sessions, target: &str) -> Result<()> {
        let Some(conn) = self.session.as_mut() else {
            return Ok(());
        };
        let list = self
            .tables
            .values()
            .map(|(t, _)| format!("{} READ", quote_table(t)))
            .collect::<Vec<_>>()
            .join(", ");
        conn.query_drop(format!("LOCK TABLES {list}"))
            .await
            .map_err(|e| {
                classify(e, Phase::Snapshot, target)
                    .context("locking the non-transactional tables (--lock-non-transactional)")
            })?;
        self.since = Some(Instant::now());
        sessions.locks(|b| self.tables.values().for_each(|(t, _)| b.hold(t)));
        Ok(())
    }

    /// Let the tables go (end of run). Idempotent.
    pub async fn release(&mut self, sessions: &Sessions) {
        if let Some(mut conn) = self.session.take() {
            if let Some(since) = self.since.take() {
                let _ = conn.query_drop("UNLOCK TABLES").await;
                self.held = Some(since.elapsed());
                sessions.locks(|b| self.tables.values().for_each(|(t, _)| b.release(t)));
            }
            let _ = conn.disconnect().await;
        }
    }

    /// Warn, once the snapshot is taken, about tables it does not cover.
    pub fn warn(&self) {
        if self.since.is_some() {
            return;
        }
        for (name, (_, engine)) in &self.tables {
            tracing::warn!(
                "{name} is a {engine} table: {engine} has no transactions, so the snapshot does \
                 not cover it; it is read without a lock and marked outside_snapshot in the \
                 manifest (--lock-non-transactional locks it for the run instead)"
            );
        }
    }

    /// Report notes and the datasets the snapshot did not cover, with why. `snapshot`: the run
    /// read under a shared snapshot (in chunk consistency nothing is one point in time anyway).
    pub fn facts(&self, snapshot: bool) -> (Vec<String>, BTreeMap<String, String>) {
        let (mut notes, mut outside) = (Vec::new(), BTreeMap::new());
        if !snapshot || self.tables.is_empty() {
            return (notes, outside);
        }
        if self.lock && self.session.is_none() && self.held.is_none() {
            // Locks asked for, none taken: this run read nothing (a resumed run whose parts were
            // all written); its earlier runs locked what they read.
            return (notes, outside);
        }
        if let Some(held) = self.since.map(|s| s.elapsed()).or(self.held) {
            notes.push(format!(
                "non-transactional table(s) {} held under READ locks for {:.1} s, from the \
                 snapshot to the end of the run, so they match the snapshot; writes to them \
                 waited meanwhile",
                self.tables.keys().cloned().collect::<Vec<_>>().join(", "),
                held.as_secs_f64()
            ));
            return (notes, outside);
        }
        for (name, (_, engine)) in &self.tables {
            let why = format!(
                "{engine} table: the engine has no transactions, so the consistent snapshot \
                 does not cover it; each part is one consistent read, but the table is not at \
                 the snapshot's point in time and rows changed during the run may appear in \
                 either state (--lock-non-transactional holds it still instead)"
            );
            notes.push(format!("{name}: {why}"));
            outside.insert(name.clone(), why);
        }
        (notes, outside)
    }
}
