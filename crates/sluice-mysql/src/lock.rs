//! The server-wide lock that lines the workers' snapshots up, and what keeps it from hurting
//! the server.
//!
//! `FLUSH TABLES WITH READ LOCK` (MySQL, MariaDB < 10.4) and `BACKUP STAGE BLOCK_COMMIT`
//! (MariaDB ≥ 10.4) are brief once granted, but *waiting* for them is not harmless: the request
//! waits for statements that conflict with it, and every write on the server queues behind the
//! waiting request. What makes each wait (measured on MariaDB 10.11 and as MySQL documents):
//!
//! - `FLUSH TABLES WITH READ LOCK` on MySQL waits for every running statement that has tables
//!   open (long `SELECT`s included) and for every running write;
//! - `BACKUP STAGE BLOCK_COMMIT` waits for running writes to non-transactional tables (MyISAM)
//!   and commits in flight, and `BACKUP STAGE START` for some DDL (`CREATE TABLE … SELECT`);
//!   long `SELECT`s, InnoDB writes and even a copying `ALTER TABLE` of an InnoDB table do not
//!   make it wait.
//!
//! The servers' default `lock_wait_timeout` is a day (MariaDB) or a year (MySQL). So:
//!
//! 1. **Long-query guard** (`guard`): before locking, list the statements of other sessions
//!    that have run for `--long-query-guard` or longer and could make the lock wait (for
//!    `BACKUP STAGE`: writes naming a non-transactional table, and any statement that is
//!    neither a read nor such a plain write, e.g. DDL or `CALL`). If there are any, wait up to
//!    `--long-query-wait` for them to end (no lock is held meanwhile, so nothing queues), then
//!    refuse, naming them. Seeing other users' statements needs the `PROCESS` privilege;
//!    without it the guard sees only this user's and says so in the report.
//! 2. **Bounded wait** (`take`): the lock session's `lock_wait_timeout` is
//!    `--lock-wait-timeout`, so a lock that cannot be had fails within it (naming the
//!    statements running at that moment) instead of stalling every write for a day.
//! 3. The wait and the hold are measured apart and reported.
//!
//! Nothing here kills other sessions' statements (mydumper's `--kill-long-queries`): an export
//! must not destroy someone else's work; the message names them so a person can decide.
//!
//! Length: about 470 lines of code plus its unit tests: taking the lock, the long-query guard
//! before it and the bounded wait are one protocol, kept in one place.

use crate::catalog::{self, Flavor, ServerInfo};
use crate::error::{Phase, classify, code};
use crate::sql;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};
use std::time::{Duration, Instant};

/// Which global lock lines the workers' snapshots up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMethod {
    /// MariaDB ≥ 10.4.1: `BACKUP STAGE BLOCK_COMMIT`.
    BackupStage,
    /// `FLUSH TABLES WITH READ LOCK`.
    FlushTables,
}

impl LockMethod {
    /// The lock for this server.
    pub fn for_server(s: &ServerInfo) -> Self {
        if s.flavor == Flavor::Mariadb && s.at_least((10, 4, 1)) {
            LockMethod::BackupStage
        } else {
            LockMethod::FlushTables
        }
    }

    fn take(self) -> &'static str {
        match self {
            LockMethod::BackupStage => "BACKUP STAGE START; BACKUP STAGE BLOCK_COMMIT",
            LockMethod::FlushTables => "FLUSH TABLES WITH READ LOCK",
        }
    }

    /// The statement that releases the lock (also safe after a partly taken one).
    pub fn release(self) -> &'static str {
        match self {
            LockMethod::BackupStage => "BACKUP STAGE END",
            LockMethod::FlushTables => "UNLOCK TABLES",
        }
    }

    /// The lock's name for messages.
    pub fn name(self) -> &'static str {
        match self {
            LockMethod::BackupStage => "BACKUP STAGE BLOCK_COMMIT",
            LockMethod::FlushTables => "FLUSH TABLES WITH READ LOCK",
        }
    }
}

/// What a statement of another session is, as far as the global lock is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A read (`SELECT`, `WITH`, `SHOW`, …).
    Read,
    /// A plain row write (`INSERT`, `UPDATE`, `DELETE`, `REPLACE`, `LOAD`): `BACKUP STAGE`
    /// waits for it only if it writes a non-transactional table.
    RowWrite,
    /// Anything else (DDL, `CALL`, unknown): counted as able to block.
    Other,
}

fn kind(info: Option<&str>) -> Kind {
    match info.map(sql::first_keyword).as_deref() {
        Some("SELECT" | "WITH" | "SHOW" | "DESC" | "DESCRIBE" | "EXPLAIN" | "HELP" | "VALUES")
        | Some("TABLE") => Kind::Read,
        Some("INSERT" | "UPDATE" | "DELETE" | "REPLACE" | "LOAD") => Kind::RowWrite,
        _ => Kind::Other,
    }
}

/// How the run may wait for, and around, the global lock. Also bounds how long any of the
/// run's sessions waits for a metadata lock (a DDL queued on a table makes readers wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Locking {
    /// `lock_wait_timeout` of every session of the run (whole seconds, at least 1).
    pub wait_timeout: Duration,
    /// Refuse to lock while another session's statement that could block the lock has run
    /// this long; `None` turns the guard off.
    pub long_query_guard: Option<Duration>,
    /// How long to wait for such statements to end before refusing (zero: refuse at once).
    pub long_query_wait: Duration,
    /// Hold read locks on non-transactional tables from the snapshot to the end of the run
    /// (see `non_transactional.rs`) instead of marking them outside the snapshot.
    pub lock_non_transactional: bool,
}

impl Default for Locking {
    /// 10 s for both the wait bound and the guard: a statement that has already run as long as
    /// the run is willing to make writes wait is not expected to end in time.
    fn default() -> Self {
        Locking {
            wait_timeout: Duration::from_secs(10),
            long_query_guard: Some(Duration::from_secs(10)),
            long_query_wait: Duration::ZERO,
            lock_non_transactional: false,
        }
    }
}

impl Locking {
    /// `lock_wait_timeout` in whole seconds, as the server takes it.
    pub fn wait_seconds(&self) -> u64 {
        self.wait_timeout.as_secs().max(1)
    }

    /// The statement that sets up every session of the run: the lock wait bound, and an idle
    /// timeout of at least a week — the spare session and the session holding
    /// `--lock-non-transactional`'s locks sit idle for the whole run, and a server closing
    /// them at its `wait_timeout` (8 hours by default) would lose the spare or, silently, the
    /// locks. The `CAST`: MySQL 9 reads `@@wait_timeout` as `bigint unsigned`, makes the
    /// `GREATEST` a decimal and refuses to assign that to the variable (error 1232).
    pub fn session_sql(&self) -> String {
        format!(
            "SET SESSION lock_wait_timeout = {}, \
             SESSION wait_timeout = CAST(GREATEST(@@SESSION.wait_timeout, 604800) AS UNSIGNED)",
            self.wait_seconds()
        )
    }
}

/// A statement of another session, as the process list shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// Connection id (`KILL QUERY <id>` stops it).
    pub id: u64,
    /// Account.
    pub user: String,
    /// How long it has run.
    pub running: Duration,
    /// The server's state text.
    pub state: String,
    /// The statement, cut short.
    pub info: Option<String>,
}

impl std::fmt::Display for Statement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "session {} ({}, running {:.0} s{}): {}",
            self.id,
            self.user,
            self.running.as_secs_f64(),
            if self.state.is_empty() {
                String::new()
            } else {
                format!(", {}", self.state)
            },
            self.info.as_deref().unwrap_or("(statement not shown)")
        )
    }
}

fn list(statements: &[Statement]) -> String {
    statements
        .iter()
        .take(5)
        .map(|s| s.to_string())
        .chain((statements.len() > 5).then(|| format!("and {} more", statements.len() - 5)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The tables in non-transactional engines among those `statements` name.
async fn non_transactional_named(
    conn: &mut Conn,
    statements: &[&str],
    target: &str,
) -> Result<Vec<TableRef>> {
    let mut names: Vec<String> = statements
        .iter()
        .flat_map(|s| sql::identifiers(s))
        .map(|n| n.to_lowercase())
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let marks = vec!["?"; names.len()].join(",");
    let rows: Vec<Row> = conn
        .exec(
            format!(
                "SELECT t.TABLE_SCHEMA, t.TABLE_NAME FROM information_schema.TABLES t \
                 JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE \
                 WHERE e.TRANSACTIONS = 'NO' AND LOWER(t.TABLE_NAME) IN ({marks})"
            ),
            names,
        )
        .await
        .map_err(|e| classify(e, Phase::Snapshot, target))?;
    Ok(rows
        .iter()
        .map(|r| TableRef {
            schema: catalog::text(r, 0),
            name: catalog::text(r, 1),
        })
        .collect())
}

/// Whether this account can see other users' sessions (`PROCESS`, or `SUPER` on old
/// servers), judged from its own privileges; privileges through roles are not seen.
pub async fn sees_all_sessions(conn: &mut Conn) -> bool {
    let sql = "SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES \
               WHERE PRIVILEGE_TYPE IN ('PROCESS', 'SUPER') AND GRANTEE = CONCAT('''', \
               SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', \
               SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')";
    matches!(conn.query_first::<u64, _>(sql).await, Ok(Some(n)) if n > 0)
}

/// What the guard did, for the report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Guarded {
    /// How long it waited for long statements to end.
    pub waited: Duration,
    /// The statements it waited for.
    pub waited_for: Vec<Statement>,
}

/// The global lock one snapshot asks for: which lock, how long to wait for it and for long
/// statements, and the run's own sessions (never counted as blockers).
pub struct LockRequest<'a> {
    /// The server (its flavor decides which sessions can block the lock).
    pub server: &'a ServerInfo,
    /// The lock.
    pub method: LockMethod,
    /// The guard's and the wait's bounds.
    pub locking: &'a Locking,
    /// Connection ids of the run's sessions.
    pub ours: &'a [u32],
    /// The target, for messages.
    pub target: &'a str,
}

impl LockRequest<'_> {
    /// Statements of other sessions (not `ours`, not the server's own threads) that have run at
    /// least `min_age` and could make `method` wait, longest first.
    async fn blocking_statements(
        &self,
        conn: &mut Conn,
        min_age: Duration,
    ) -> Result<Vec<Statement>> {
        let millis = match self.server.flavor {
            Flavor::Mariadb => "TIME_MS",
            Flavor::Mysql => "TIME * 1000",
        };
        let not_ours = std::iter::once("CONNECTION_ID()".to_string())
            .chain(self.ours.iter().map(u32::to_string))
            .collect::<Vec<_>>()
            .join(",");
        let rows: Vec<Row> = conn
            .exec(
                format!(
                    "SELECT ID, USER, {millis}, COALESCE(STATE, ''), LEFT(INFO, 300), DB \
                     FROM information_schema.PROCESSLIST \
                     WHERE COMMAND IN ('Query', 'Execute') AND ID NOT IN ({not_ours}) \
                     AND USER NOT IN ('system user', 'event_scheduler') AND {millis} >= ? \
                     ORDER BY {millis} DESC"
                ),
                (min_age.as_millis() as u64,),
            )
            .await
            .map_err(|e| classify(e, Phase::Snapshot, self.target))?;
        let mut found: Vec<(Statement, Kind, String)> = rows
            .iter()
            .map(|r| {
                let info = catalog::text(r, 4);
                let info = (!info.is_empty())
                    .then(|| info.split_whitespace().collect::<Vec<_>>().join(" "));
                let k = kind(info.as_deref());
                let s = Statement {
                    id: catalog::number(r, 0),
                    user: catalog::text(r, 1),
                    running: Duration::from_millis(catalog::number(r, 2)),
                    state: catalog::text(r, 3),
                    info,
                };
                (s, k, catalog::text(r, 5))
            })
            .collect();
        if self.method == LockMethod::BackupStage {
            found.retain(|(_, k, _)| *k != Kind::Read);
            let writes: Vec<&str> = found
                .iter()
                .filter(|(_, k, _)| *k == Kind::RowWrite)
                .filter_map(|(s, _, _)| s.info.as_deref())
                .collect();
            let non_trans = non_transactional_named(conn, &writes, self.target).await?;
            found.retain(|(s, k, db)| {
                *k == Kind::Other
                    || non_trans
                        .iter()
                        .any(|t| sql::names_table(s.info.as_deref().unwrap_or(""), db, t))
            });
        }
        Ok(found.into_iter().map(|(s, _, _)| s).collect())
    }

    /// The long-query guard: return once no statement that could block `method` has run for the
    /// guard's time, waiting at most `locking.long_query_wait`; refuse with the statements named
    /// otherwise. Holds no lock.
    pub async fn guard(&self, conn: &mut Conn) -> Result<Guarded> {
        let target = self.target;
        let Some(age) = self.locking.long_query_guard else {
            return Ok(Guarded::default());
        };
        let started = Instant::now();
        let mut out = Guarded::default();
        loop {
            let long = self.blocking_statements(conn, age).await?;
            if long.is_empty() {
                out.waited = started.elapsed();
                return Ok(out);
            }
            for s in &long {
                if !out.waited_for.iter().any(|w| w.id == s.id) {
                    out.waited_for.push(s.clone());
                }
            }
            if started.elapsed() >= self.locking.long_query_wait {
                return Err(Error::source_permanent(format!(
                    "not taking the global lock ({}) on {target}: {} statement(s) of other \
                     sessions have run for {} s or longer and would make it wait, and every write \
                     on the server would queue behind the waiting lock: {}. Wait for them to end \
                     (--long-query-wait SECONDS waits up to that long before giving up), stop them \
                     if they are yours (KILL QUERY <id>), raise --long-query-guard, or export with \
                     --consistency chunk, which takes no global lock.",
                    self.method.name(),
                    long.len(),
                    age.as_secs(),
                    list(&long)
                )));
            }
            tracing::warn!(
                "waiting for {} long statement(s) to end before taking the global lock ({}): {}",
                long.len(),
                self.method.name(),
                list(&long)
            );
            sluice_core::failpoint::hit("mysql.long_query_wait")?;
            let left = self
                .locking
                .long_query_wait
                .saturating_sub(started.elapsed());
            tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        }
    }

    /// Take `method` on `conn`, waiting at most `locking.wait_timeout`; returns how long it
    /// waited. On failure nothing stays locked, and a timeout names the statements that were
    /// running (the likely blockers).
    pub async fn take(&self, conn: &mut Conn) -> Result<Duration> {
        let target = self.target;
        conn.query_drop(self.locking.session_sql())
            .await
            .map_err(|e| classify(e, Phase::Snapshot, self.target))?;
        let started = Instant::now();
        match conn.query_drop(self.method.take()).await {
            Ok(()) => Ok(started.elapsed()),
            Err(e) => {
                let waited = started.elapsed();
                // A BACKUP STAGE START that succeeded before BLOCK_COMMIT failed must end.
                let _ = conn.query_drop(self.method.release()).await;
                if crate::error::server_code(&e) != Some(code::ER_LOCK_WAIT_TIMEOUT) {
                    return Err(classify(e, Phase::Snapshot, self.target).context(format!(
                        "taking the global lock ({}) that lines the workers' snapshots up",
                        self.method.name()
                    )));
                }
                let running = self.blocking_statements(conn, waited / 2).await?;
                Err(Error::source_permanent(format!(
                    "the global lock ({}) on {target} could not be had within --lock-wait-timeout \
                     {} s, so the export gave up rather than make every write on the server wait \
                     longer. {}. Try again when they have ended, stop them if they are yours (KILL \
                     QUERY <id>), raise --lock-wait-timeout, or export with --consistency chunk, \
                     which takes no global lock.",
                    self.method.name(),
                    self.locking.wait_seconds(),
                    if running.is_empty() {
                        "No other session's statement is visible now (seeing other users' \
                         sessions needs the PROCESS privilege)"
                            .to_string()
                    } else {
                        format!("Statements running meanwhile: {}", list(&running))
                    }
                ))
                .with_cause(e))
            }
        }
    }
}

/// What taking the global lock cost, for the report.
#[derive(Debug, Clone)]
pub struct LockStats {
    /// Which lock.
    pub method: LockMethod,
    /// What the long-query guard waited for.
    pub guarded: Guarded,
    /// From sending the lock statement to its return.
    pub wait: Duration,
    /// From the grant to the release's return.
    pub held: Duration,
    /// Snapshot sessions started under it.
    pub sessions: usize,
}

impl LockStats {
    /// Report lines: the guard's wait (if any), the lock's wait and hold.
    pub fn notes(&self, locking: &Locking) -> Vec<String> {
        let mut notes = Vec::new();
        if !self.guarded.waited_for.is_empty() {
            notes.push(format!(
                "waited {:.1} s for {} long statement(s) of other sessions to end before taking \
                 the global lock: {}",
                self.guarded.waited.as_secs_f64(),
                self.guarded.waited_for.len(),
                self.guarded
                    .waited_for
                    .iter()
                    .map(|s| format!("session {}", s.id))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        notes.push(format!(
            "global lock ({}) waited {:.1} ms to be granted (writes on the server may queue \
             meanwhile; at most --lock-wait-timeout {} s), held {:.1} ms to start {} worker \
             snapshot(s)",
            self.method.name(),
            self.wait.as_secs_f64() * 1000.0,
            locking.wait_seconds(),
            self.held.as_secs_f64() * 1000.0,
            self.sessions
        ));
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_classified() {
        for read in [
            "SELECT SLEEP(10)",
            "  select * from t",
            "/* app */ SELECT 1",
            "(SELECT 1) UNION (SELECT 2)",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "SHOW PROCESSLIST",
        ] {
            assert_eq!(kind(Some(read)), Kind::Read, "{read}");
        }
        for write in [
            "UPDATE m SET v = SLEEP(5)",
            "insert into t select * from u",
            "-- note\nDELETE FROM t",
        ] {
            assert_eq!(kind(Some(write)), Kind::RowWrite, "{write}");
        }
        for other in [
            "ALTER TABLE t ENGINE=MyISAM",
            "CALL p()",
            "CREATE TABLE c SELECT 1",
        ] {
            assert_eq!(kind(Some(other)), Kind::Other, "{other}");
        }
        assert_eq!(kind(None), Kind::Other);
    }

    #[test]
    fn statements_are_listed_briefly() {
        let s = |id| Statement {
            id,
            user: "app".into(),
            running: Duration::from_secs(42),
            state: "User sleep".into(),
            info: Some("UPDATE m SET v = SLEEP(60)".into()),
        };
        let text = list(&(1..=7).map(s).collect::<Vec<_>>());
        assert!(text.starts_with("session 1 (app, running 42 s, User sleep): UPDATE m"));
        assert!(text.ends_with("and 2 more"), "{text}");
    }
}
