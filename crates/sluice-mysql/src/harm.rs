//! Sampling the harm a run does to MySQL/MariaDB, from a session of its own.
//!
//! The run's sessions are recorded by connection id in [`Sessions`] and found in
//! `information_schema.PROCESSLIST`, which every user may read for their own sessions.
//! Statement age comes from MariaDB's `TIME_MS` or MySQL's whole-second `TIME`. The longest
//! transaction is the shared snapshot's age, known to the run itself (reading InnoDB's
//! transaction list would need the PROCESS privilege), or the longest statement in chunk
//! consistency, where each read is its own transaction.
//!
//! **Sessions blocked by our metadata locks.** A worker's snapshot transaction keeps a shared
//! metadata lock on every table it has read until the transaction ends — the end of the run.
//! A DDL on such a table (`ALTER`, `TRUNCATE`, `RENAME`, `DROP`) waits for it, and every later
//! query on that table queues behind the waiting DDL. The readers record the tables they hold
//! in the [`LockBook`]; each sample counts the other sessions in the state `Waiting for table
//! metadata lock` (or `… table level lock`, MyISAM) whose statement names one of those
//! tables, and their longest wait. Neither
//! MySQL nor MariaDB shows which table a waiting session waits for without extra
//! instrumentation (`performance_schema.metadata_locks` is off by default on MariaDB, and
//! MariaDB's `METADATA_LOCK_INFO` plugin, not loaded by default, lists granted locks only), so
//! the statement's text is matched against the table names: a statement reaching a held table
//! only through a view or a stored routine is not counted. Seeing other users' sessions needs
//! the `PROCESS` privilege. The first time a session is seen waiting, a warning names it; the
//! report lists them.

mod signals;

use crate::catalog::{self, Flavor};
use crate::connect::MyTarget;
use crate::error::{Phase, classify};
use crate::sql::names_table;
use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::table::TableRef;
use sluice_core::{HarmProbe, HarmSample, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A session seen waiting for a metadata lock one of the run's sessions holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocked {
    /// Its statement, cut short.
    pub statement: String,
    /// The held tables it names.
    pub tables: Vec<TableRef>,
    /// The longest wait seen.
    pub waited: Duration,
}

/// Which tables the run's sessions hold metadata locks on, and who was seen waiting for them.
#[derive(Debug, Default)]
pub struct LockBook {
    held: BTreeMap<TableRef, usize>,
    blocked: BTreeMap<u64, Blocked>,
}

impl LockBook {
    /// A session of the run took a metadata lock on `t` (until [`LockBook::release`]).
    pub fn hold(&mut self, t: &TableRef) {
        *self.held.entry(t.clone()).or_default() += 1;
    }

    /// A session of the run let go of its lock on `t` (statement or transaction ended).
    pub fn release(&mut self, t: &TableRef) {
        if let Some(n) = self.held.get_mut(t) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(t);
            }
        }
    }

    /// The tables held now.
    pub fn held(&self) -> Vec<TableRef> {
        self.held.keys().cloned().collect()
    }

    /// Record a sighting; true the first time this session is seen.
    fn saw(&mut self, id: u64, b: Blocked) -> bool {
        match self.blocked.get_mut(&id) {
            Some(old) => {
                old.waited = old.waited.max(b.waited);
                false
            }
            None => {
                self.blocked.insert(id, b);
                true
            }
        }
    }

    /// The report line naming the sessions seen blocked (at most five), if any.
    pub fn notes(&self) -> Vec<String> {
        if self.blocked.is_empty() {
            return Vec::new();
        }
        let mut seen: Vec<String> = self
            .blocked
            .iter()
            .take(5)
            .map(|(id, b)| {
                format!(
                    "session {id} for {:.1} s on {} ({})",
                    b.waited.as_secs_f64(),
                    b.tables
                        .iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    b.statement
                )
            })
            .collect();
        if self.blocked.len() > 5 {
            seen.push(format!("and {} more", self.blocked.len() - 5));
        }
        vec![format!(
            "{} other session(s) waited for metadata locks held by this run's snapshot: {}. A \
             snapshot keeps a metadata lock on every table it has read until the run ends; a \
             DDL waiting for one makes every later query on that table wait too",
            self.blocked.len(),
            seen.join("; ")
        )]
    }
}

/// The harm probe session.
pub struct MyHarmProbe {
    conn: Conn,
    sessions: Sessions,
    flavor: Flavor,
    target: String,
    /// Where the harm budget's signal sessions connect.
    my: MyTarget,
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
            my: target.clone(),
        })
    }

    fn millis(&self) -> &'static str {
        match self.flavor {
            Flavor::Mariadb => "TIME_MS",
            Flavor::Mysql => "TIME * 1000",
        }
    }

    /// Other sessions waiting for a metadata lock on a table the run holds: (count, longest).
    async fn blocked(&mut self, list: &str) -> Result<(u32, Duration)> {
        let held = self.sessions.locks(|b| b.held()).unwrap_or_default();
        if held.is_empty() {
            return Ok((0, Duration::ZERO));
        }
        let sql = format!(
            "SELECT ID, {}, DB, LEFT(INFO, 300) FROM information_schema.PROCESSLIST \
             WHERE STATE IN ('Waiting for table metadata lock', 'Waiting for table level lock') \
             AND ID NOT IN ({list})",
            self.millis()
        );
        let rows: Vec<Row> = self
            .conn
            .query(sql)
            .await
            .map_err(|e| classify(e, Phase::Catalog, &self.target))?;
        let (mut count, mut longest) = (0u32, Duration::ZERO);
        for r in &rows {
            let (id, waited) = (
                catalog::number(r, 0),
                Duration::from_millis(catalog::number(r, 1)),
            );
            let (db, info) = (catalog::text(r, 2), catalog::text(r, 3));
            let tables: Vec<TableRef> = held
                .iter()
                .filter(|t| names_table(&info, &db, t))
                .cloned()
                .collect();
            if tables.is_empty() {
                continue;
            }
            count += 1;
            longest = longest.max(waited);
            let statement = info.split_whitespace().collect::<Vec<_>>().join(" ");
            let first = self.sessions.locks(|b| {
                b.saw(
                    id,
                    Blocked {
                        statement: statement.clone(),
                        tables: tables.clone(),
                        waited,
                    },
                )
            });
            if first == Some(true) {
                tracing::warn!(
                    "session {id} waits for a metadata lock on {} that this export's snapshot \
                     holds until the run ends ({statement}); later queries on the table queue \
                     behind it. Stop the export (Ctrl-C, then --resume) to let it through, or \
                     stop that statement.",
                    tables
                        .iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        Ok((count, longest))
    }
}

#[async_trait]
impl HarmProbe for MyHarmProbe {
    async fn sample(&mut self) -> Result<HarmSample> {
        let ids = self.sessions.ids();
        let list = std::iter::once("CONNECTION_ID()".to_string())
            .chain(ids.iter().map(u32::to_string))
            .collect::<Vec<_>>()
            .join(",");
        let sql = format!(
            "SELECT COUNT(*), COALESCE(MAX(CASE WHEN COMMAND = 'Query' AND ID <> CONNECTION_ID() \
             THEN {} END), 0) FROM information_schema.PROCESSLIST WHERE ID IN ({list})",
            self.millis()
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
        let (blocked_sessions, longest_blocked_wait) = self.blocked(&list).await?;
        Ok(HarmSample {
            // The probe's own session is counted through CONNECTION_ID() in the list.
            connections: connections.min(u32::MAX as u64) as u32,
            xmin_age: None,
            longest_transaction: self
                .sessions
                .snapshot_age()
                .unwrap_or_default()
                .max(longest_statement),
            longest_statement,
            blocked_sessions,
            longest_blocked_wait,
        })
    }

    fn open_signals(
        &mut self,
        request: &sluice_core::budget::SignalRequest,
    ) -> Vec<Box<dyn sluice_core::budget::SignalReader>> {
        signals::open(&self.my, &self.sessions, request)
    }
}

/// The connection ids of one run's sessions, and when its shared snapshot began; shared by the
/// coordinator, its readers and the harm probe (MySQL has no session tag to search for).
#[derive(Debug, Default)]
pub struct SessionState {
    /// Connection ids opened by the run (closed ones are simply no longer found).
    pub ids: BTreeSet<u32>,
    /// When the shared snapshot's transactions started, while they are open.
    pub snapshot_since: Option<Instant>,
    /// Tables whose metadata locks the run's sessions hold, and sessions seen waiting on them.
    pub locks: LockBook,
}

/// Shared handle on [`SessionState`].
#[derive(Debug, Clone, Default)]
pub struct Sessions(Arc<Mutex<SessionState>>);

impl Sessions {
    /// Record a new session.
    pub fn add(&self, id: u32) {
        if let Ok(mut s) = self.0.lock() {
            s.ids.insert(id);
        }
    }

    /// The ids recorded so far.
    pub fn ids(&self) -> Vec<u32> {
        self.0
            .lock()
            .map(|s| s.ids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Mark the shared snapshot as started now (`Some`) or ended (`None`).
    pub fn set_snapshot(&self, since: Option<Instant>) {
        if let Ok(mut s) = self.0.lock() {
            s.snapshot_since = since;
        }
    }

    /// Read or update the lock book (see [`LockBook`]).
    pub fn locks<R>(&self, f: impl FnOnce(&mut LockBook) -> R) -> Option<R> {
        self.0.lock().ok().map(|mut s| f(&mut s.locks))
    }

    /// How long the shared snapshot has been open, if it is.
    pub fn snapshot_age(&self) -> Option<Duration> {
        self.0
            .lock()
            .ok()
            .and_then(|s| s.snapshot_since.map(|t| t.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(schema: &str, name: &str) -> TableRef {
        TableRef::new(schema, name)
    }

    #[test]
    fn the_book_counts_holders_and_sightings() {
        let mut b = LockBook::default();
        let x = t("d", "x");
        b.hold(&x);
        b.hold(&x);
        b.release(&x);
        assert_eq!(b.held(), vec![x.clone()]);
        b.release(&x);
        assert!(b.held().is_empty());
        let seen = |ms| Blocked {
            statement: "ALTER TABLE x ADD c int".into(),
            tables: vec![x.clone()],
            waited: Duration::from_millis(ms),
        };
        assert!(b.saw(7, seen(100)));
        assert!(!b.saw(7, seen(900)));
        let notes = b.notes();
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].starts_with("1 other session(s) waited")
                && notes[0].contains("session 7 for 0.9 s on d.x (ALTER TABLE x ADD c int)"),
            "{notes:?}"
        );
    }
}
