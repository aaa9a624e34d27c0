#![allow(clippy::unwrap_used)]
//! `sluice replicate` between real databases (PostgreSQL and MariaDB, each pair): an
//! OLTP writer (transfers between accounts with a constant total, an append-only ledger with
//! a unique key, parent/child rows with foreign keys, key updates, deletes) runs during the
//! initial load and the streaming; the target must equal the source table by table, and every
//! state of the target a reader can see — each applied position — must keep the total.
//! Kills at the commit points of the applier and during the initial load, a hot-row workload
//! and a DDL in the middle of the stream, and the errors a user meets first.
//!
//! Over 500 lines: each test is one whole scenario against real servers (writer, kills,
//! checksums), and they share the workload's schema and checks.

use crate::common::writer::Background;
use crate::common::{Failpoints, run, sluice};
use crate::replicate_faults::replicate_cmd;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const ACCOUNTS: i64 = 100;
const BALANCE: i64 = 1000;
const TABLES: [(&str, &str); 4] = [
    ("accounts", "SELECT id, balance FROM accounts"),
    ("ledger", "SELECT id, ref, account, amount FROM ledger"),
    ("parent", "SELECT id, name FROM parent"),
    ("child", "SELECT id, parent_id, v FROM child"),
];

/// A test database of either engine.
pub(crate) enum Db {
    Pg(sluice_testkit::pg::TestDb),
    My(tokio::sync::Mutex<sluice_testkit::mysql::TestDb>),
}

impl Db {
    pub(crate) async fn new(pg: bool) -> Db {
        match pg {
            true => Db::Pg(sluice_testkit::pg::TestDb::new().await),
            false => Db::My(tokio::sync::Mutex::new(
                sluice_testkit::mysql::TestDb::new().await,
            )),
        }
    }

    pub(crate) async fn url(&self) -> String {
        match self {
            Db::Pg(d) => d.url.clone(),
            Db::My(d) => d.lock().await.url.clone(),
        }
    }

    pub(crate) async fn name(&self) -> String {
        match self {
            Db::Pg(d) => d.name.clone(),
            Db::My(d) => d.lock().await.name.clone(),
        }
    }

    pub(crate) async fn exec(&self, sql: &str) {
        match self {
            Db::Pg(d) => d.exec(sql).await,
            Db::My(d) => d.lock().await.exec(sql).await,
        }
    }

    pub(crate) async fn rows(&self, sql: &str) -> Vec<String> {
        match self {
            Db::Pg(d) => d.row_strings(sql).await,
            Db::My(d) => d.lock().await.row_strings(sql).await,
        }
    }

    /// The schema (PostgreSQL) or database (MariaDB) the tables are in.
    pub(crate) async fn schema(&self) -> String {
        match self {
            Db::Pg(_) => "public".into(),
            Db::My(_) => self.name().await,
        }
    }
}

/// A session that runs the writer's SQL on either engine.
pub(crate) enum Session {
    Pg(tokio_postgres::Client),
    My(mysql_async::Conn),
}

impl Session {
    pub(crate) async fn open(db: &Db) -> Session {
        match db {
            Db::Pg(d) => Session::Pg(sluice_testkit::pg::connect(&d.url).await),
            Db::My(d) => {
                let url = d.lock().await.url.clone();
                Session::My(sluice_testkit::mysql::connect(&url).await)
            }
        }
    }

    async fn try_exec(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Session::Pg(c) => c.batch_execute(sql).await.map_err(|e| e.to_string()),
            Session::My(c) => {
                use mysql_async::prelude::Queryable;
                c.query_drop(sql).await.map_err(|e| e.to_string())
            }
        }
    }

    /// Run a transaction as an application would: rolled back and tried again when the
    /// server gives up on it (a deadlock or a lock wait against another test's session).
    pub(crate) async fn exec(&mut self, sql: &str) {
        let mut last = String::new();
        for _ in 0..5 {
            match self.try_exec(sql).await {
                Ok(()) => return,
                Err(e) => {
                    last = e;
                    let _ = self.try_exec("ROLLBACK").await;
                }
            }
        }
        panic!("{sql}: {last}");
    }

    async fn rows(&mut self, sql: &str) -> Option<Vec<String>> {
        match self {
            Session::Pg(c) => {
                let rows = c.simple_query(sql).await.ok()?;
                Some(
                    rows.iter()
                        .filter_map(|m| match m {
                            tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                                (0..r.len())
                                    .map(|i| r.get(i).unwrap_or("∅").to_string())
                                    .collect::<Vec<_>>()
                                    .join("|"),
                            ),
                            _ => None,
                        })
                        .collect(),
                )
            }
            Session::My(c) => {
                use mysql_async::prelude::Queryable;
                let rows: Vec<mysql_async::Row> = c.query(sql).await.ok()?;
                Some(
                    rows.iter()
                        .map(|r| {
                            (0..r.len())
                                .map(|i| match r.as_ref(i) {
                                    Some(mysql_async::Value::Bytes(b)) => {
                                        String::from_utf8_lossy(b).into_owned()
                                    }
                                    Some(mysql_async::Value::Int(v)) => v.to_string(),
                                    Some(mysql_async::Value::UInt(v)) => v.to_string(),
                                    _ => "∅".into(),
                                })
                                .collect::<Vec<_>>()
                                .join("|")
                        })
                        .collect(),
                )
            }
        }
    }
}

async fn create_schema(db: &Db) {
    let seed: String = (1..=ACCOUNTS)
        .map(|i| format!("({i}, {BALANCE})"))
        .collect::<Vec<_>>()
        .join(",");
    let ledger: String = (1..=3000)
        .map(|i| format!("(-{i}, 'S{i}', {}, 0)", i % ACCOUNTS + 1))
        .collect::<Vec<_>>()
        .join(",");
    db.exec(&format!(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO accounts VALUES {seed};
         CREATE TABLE ledger (id bigint PRIMARY KEY, ref varchar(40) NOT NULL UNIQUE,
                              account int NOT NULL, amount bigint NOT NULL,
                              FOREIGN KEY (account) REFERENCES accounts (id));
         INSERT INTO ledger VALUES {ledger};
         CREATE TABLE parent (id bigint PRIMARY KEY, name varchar(40) NOT NULL);
         CREATE TABLE child (id bigint PRIMARY KEY, parent_id bigint NOT NULL, v int NOT NULL,
                             FOREIGN KEY (parent_id) REFERENCES parent (id));"
    ))
    .await;
}

/// The OLTP writer: transfers (some on three hot accounts, all of them with `hot`), ledger
/// inserts, a unique-key update, parent/child inserts, a child key update, deletes.
async fn start_writer(db: &Db, hot: bool) -> Background {
    let mut s = Session::open(db).await;
    let w = Background::spawn(|stop, commits| async move {
        let mut families: std::collections::VecDeque<(i64, i64)> = Default::default();
        let mut i = 0i64;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let r = (i * 7919) % 1000;
            let sql = match i % 5 {
                0..=2 => {
                    let (a, b) = if hot || r < 300 {
                        (r % 3 + 1, (r + 1) % 3 + 1)
                    } else {
                        (r % ACCOUNTS + 1, (r * 31 + 7) % ACCOUNTS + 1)
                    };
                    let x = i % 50 + 1;
                    format!(
                        "BEGIN;
                         UPDATE accounts SET balance = balance - {x} WHERE id = {a};
                         UPDATE accounts SET balance = balance + {x} WHERE id = {b};
                         INSERT INTO ledger VALUES ({}, 'L{}', {a}, -{x}), ({}, 'L{}', {b}, {x});
                         COMMIT;",
                        2 * i,
                        2 * i,
                        2 * i + 1,
                        2 * i + 1
                    )
                }
                3 => {
                    families.push_back((i, i));
                    format!(
                        "BEGIN; INSERT INTO parent (id, name) VALUES ({i}, 'p{i}');
                         INSERT INTO child (id, parent_id, v) VALUES ({i}, {i}, 0); COMMIT;"
                    )
                }
                _ if families.len() > 3 && i % 2 == 0 => {
                    let (p, c) = families.pop_front().unwrap();
                    families.push_back((p, c + 100_000_000));
                    format!(
                        "BEGIN; UPDATE child SET id = {}, v = v + 1 WHERE id = {c};
                         UPDATE ledger SET ref = CONCAT(ref, 'x') WHERE id = {}; COMMIT;",
                        c + 100_000_000,
                        2 * (i - 20)
                    )
                }
                _ if families.len() > 3 => {
                    let (p, _) = families.pop_front().unwrap();
                    format!(
                        "BEGIN; DELETE FROM child WHERE parent_id = {p};
                         DELETE FROM parent WHERE id = {p};
                         DELETE FROM ledger WHERE id = {}; COMMIT;",
                        2 * (i - 40) + 1
                    )
                }
                _ => "BEGIN; UPDATE accounts SET balance = balance WHERE id = 1; COMMIT;".into(),
            };
            s.exec(&sql).await;
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    w.wait_for(20).await;
    w
}

/// Reads the target's accounts while the replication runs: every complete state a reader
/// sees must keep the total (each is an applied position: commits are whole and in order).
struct Sampler {
    stop: Arc<AtomicBool>,
    seen: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Sampler {
    async fn start(target: &Db) -> Sampler {
        let mut s = Session::open(target).await;
        let (stop, seen) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (st, sn) = (stop.clone(), seen.clone());
        let task = tokio::spawn(async move {
            let mut bad = Vec::new();
            while !st.load(Ordering::Relaxed) {
                if let Some(rows) = s
                    .rows("SELECT count(*), CAST(sum(balance) AS DECIMAL(30, 0)) FROM accounts")
                    .await
                    && let Some(row) = rows.first()
                    && row.starts_with(&format!("{ACCOUNTS}|"))
                {
                    sn.fetch_add(1, Ordering::Relaxed);
                    if *row != format!("{ACCOUNTS}|{}", ACCOUNTS * BALANCE) {
                        bad.push(row.clone());
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            bad
        });
        Sampler { stop, seen, task }
    }

    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let bad = self.task.await.unwrap();
        (self.seen.load(Ordering::Relaxed), bad)
    }
}

pub(crate) async fn replicate(source: &Db, target: &Db, extra: &[&str]) -> Command {
    let schemas = [source.schema().await, target.schema().await];
    let mut c = replicate_cmd(source, target, &["--schema", &schemas[0]]).await;
    c.args(["--target-schema", &schemas[1]]).args(extra);
    c
}

async fn assert_same(source: &Db, target: &Db) {
    for (name, sql) in TABLES {
        let (s, t) = (source.rows(sql).await, target.rows(sql).await);
        assert_eq!(s.len(), t.len(), "{name}: row counts differ");
        if s != t {
            let diff: Vec<_> = s.iter().zip(&t).filter(|(a, b)| a != b).take(5).collect();
            panic!("{name}: the target differs from the source: {diff:?}");
        }
    }
}

pub(crate) async fn drop_replication(source: &Db, target: &Db) {
    let r = run(&mut replicate(source, target, &["--drop"]).await);
    r.ok();
}

async fn writer_during_load_and_stream(source_pg: bool, target_pg: bool) {
    let source = Db::new(source_pg).await;
    let target = Db::new(target_pg).await;
    create_schema(&source).await;
    let writer = start_writer(&source, false).await;
    let sampler = Sampler::start(&target).await;
    let fp = Failpoints::new();
    let mut cmd = replicate(
        &source,
        &target,
        &["--parallel", "4", "--until-current", "--chunk-size", "64KB"],
    )
    .await;
    // The writer commits while the initial load reads: after its first part.
    let r: crate::common::Run = fp
        .run_paused_at(&mut cmd, "export.after_receipt", writer.wait_for(50))
        .await
        .into();
    r.ok();
    assert!(r.stderr.contains("applied:"), "{}", r.stderr);
    let commits = writer.stop_after(200).await;
    let r = run(&mut replicate(&source, &target, &["--parallel", "4", "--until-current"]).await);
    r.ok();
    let (seen, bad) = sampler.finish().await;
    assert!(
        bad.is_empty(),
        "{} states with another total: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert!(seen > 0, "the sampler never saw the accounts");
    assert!(commits > 250, "only {commits} transactions");
    assert_same(&source, &target).await;
    drop_replication(&source, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_writer_during_load_and_stream_target_equals_source() {
    writer_during_load_and_stream(true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_to_mariadb_with_a_writer_target_equals_source() {
    writer_during_load_and_stream(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_to_pg_with_a_writer_target_equals_source() {
    writer_during_load_and_stream(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_writer_during_load_and_stream_target_equals_source() {
    writer_during_load_and_stream(false, false).await;
}

async fn killed_and_restarted(pg: bool) {
    let source = Db::new(pg).await;
    let target = Db::new(pg).await;
    create_schema(&source).await;
    let writer = start_writer(&source, false).await;
    // Each run dies at one point; the next continues from what the target holds.
    for spec in [
        "export.after_receipt=exit@2",
        "replicate.before_commit=exit@1",
        "replicate.after_commit=exit@1",
        "replicate.before_commit=exit@2",
        "replicate.after_commit=exit@2",
    ] {
        writer.wait_for(40).await;
        let fp = Failpoints::new();
        // At most 5 transactions a target transaction: the 40 of each run are several, so
        // every commit point is reached.
        let mut cmd = replicate(
            &source,
            &target,
            &[
                "--parallel",
                "3",
                "--until-current",
                "--chunk-size",
                "64KB",
                "--max-grouped",
                "5",
            ],
        )
        .await;
        fp.arm(&mut cmd, spec);
        let r = run(&mut cmd);
        assert_ne!(r.code, 0, "{spec}: the run did not die:\n{}", r.stderr);
    }
    writer.stop_after(40).await;
    let r = run(&mut replicate(&source, &target, &["--parallel", "3", "--until-current"]).await);
    r.ok();
    assert_same(&source, &target).await;
    drop_replication(&source, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_killed_at_commit_points_restarts_exactly() {
    killed_and_restarted(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_killed_at_commit_points_restarts_exactly() {
    killed_and_restarted(false).await;
}

async fn hot_rows_and_ddl(pg: bool) {
    let source = Db::new(pg).await;
    let target = Db::new(pg).await;
    create_schema(&source).await;
    run(&mut replicate(&source, &target, &["--parallel", "4", "--until-current"]).await).ok();
    let writer = start_writer(&source, true).await;
    writer.wait_for(100).await;
    // DDL beside the writer, retried as an application would if the server gives up on it.
    let mut ddl = Session::open(&source).await;
    ddl.exec("ALTER TABLE parent ADD COLUMN note varchar(20)")
        .await;
    ddl.exec("INSERT INTO parent VALUES (-5, 'after ddl', 'noted')")
        .await;
    writer.wait_for(50).await;
    ddl.exec("TRUNCATE TABLE ledger").await;
    writer.stop_after(50).await;
    let r = run(&mut replicate(&source, &target, &["--parallel", "4", "--until-current"]).await);
    r.ok();
    assert_same(&source, &target).await;
    let sql = "SELECT id, name, note FROM parent";
    assert_eq!(source.rows(sql).await, target.rows(sql).await);
    drop_replication(&source, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_hot_rows_a_column_added_and_a_truncate_mid_stream() {
    hot_rows_and_ddl(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_hot_rows_a_column_added_and_a_truncate_mid_stream() {
    hot_rows_and_ddl(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_problem_and_the_fix() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    create_schema(&source).await;
    // A target that does not answer.
    let mut cmd = sluice();
    cmd.args(["replicate", "--source", &source.url().await])
        .args([
            "--target",
            "postgres://u:secret@127.0.0.1:1/x",
            "--table",
            "accounts",
        ]);
    let r = run(&mut cmd);
    assert_ne!(r.code, 0);
    assert!(!r.stderr.contains("secret"), "{}", r.stderr);
    // Settings about files are refused by name.
    let r = run(&mut replicate(&source, &target, &["--to", "/tmp/x"]).await);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("to"), "{}", r.stderr);
    // No --target.
    let mut cmd = sluice();
    cmd.args([
        "replicate",
        "--source",
        &source.url().await,
        "--table",
        "accounts",
    ]);
    let r = run(&mut cmd);
    r.refused(2, &["--target"]);
    // A target table that already holds rows is not loaded into.
    target
        .exec("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL); INSERT INTO accounts VALUES (1, 1);")
        .await;
    let r = run(&mut replicate(&source, &target, &[]).await);
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("already hold rows") && r.stderr.contains("--initial none"),
        "{}",
        r.stderr
    );
    // Nothing was created on the source for the refused run.
    let slots = source
        .rows("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()")
        .await;
    assert_eq!(slots, vec!["0".to_string()]);
}

/// A lock the writesets cannot see (held on the target by another session) makes the unit wait
/// past the target's lock limit: it is rolled back and applied again, the stream does not
/// fail, nothing commits out of order, and a transaction whose unique key's old value the
/// source did not send (PostgreSQL's default replica identity) still lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unpredicted_lock_wait_is_retried_in_order() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE u (id int PRIMARY KEY, code text NOT NULL UNIQUE);
             INSERT INTO u SELECT g, 'c' || g FROM generate_series(1, 20) g;",
        )
        .await;
    let base = ["--table", "public.u", "--parallel", "3", "--until-current"];
    run(&mut replicate(&source, &target, &base).await).ok();
    // The code of row 1 moves to row 21's insert: disjoint writesets, one order on the target.
    source
        .exec(
            "UPDATE u SET code = 'moved' WHERE id = 1;
             INSERT INTO u VALUES (21, 'c1');
             UPDATE u SET code = code || 'x' WHERE id BETWEEN 2 AND 20;",
        )
        .await;
    let blocker = sluice_testkit::pg::connect(&target.url().await).await;
    blocker
        .batch_execute("BEGIN; SELECT * FROM u WHERE id = 1 FOR UPDATE;")
        .await
        .unwrap();
    let report = crate::common::tempdir();
    let path = report.path().join("r.json");
    let port = sluice_testkit::server::free_port().unwrap();
    let mut cmd = replicate(&source, &target, &base).await;
    cmd.arg("--report-json").arg(&path);
    cmd.arg("--metrics-addr").arg(format!("127.0.0.1:{port}"));
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for an apply session blocked by our lock, then for the run to count the unit
    // rolled back at the lock limit (which session runs it again is the scheduler's choice).
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE application_name = 'sluice' AND wait_event_type = 'Lock'";
    let monitor = sluice_testkit::pg::connect(&target.url().await).await;
    // A deadline, so a replication that never blocks (or never retries) fails the test
    // rather than hanging the suite.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut waited = |what: &str| {
        assert!(
            std::time::Instant::now() < deadline,
            "no apply session {what} within 120 s"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the replication ended ({status}) before an apply session {what}");
        }
    };
    while sluice_testkit::pg::rows_as_strings(&monitor, waiting).await == ["0"] {
        waited("waited for the lock");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    loop {
        let text = crate::stream_metrics::scrape(port).unwrap_or_default();
        if text.contains("sluice_replicate_conflicts_total ")
            && crate::stream_metrics::metric(&text, "sluice_replicate_conflicts_total") >= 1.0
        {
            break;
        }
        waited("gave up at the lock limit");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    blocker.batch_execute("COMMIT").await.unwrap();
    let r: crate::common::Run = crate::common::finish(child).into();
    r.ok();
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(report["conflicts"].as_u64().unwrap() >= 1, "{report}");
    let sql = "SELECT id, code FROM u";
    assert_eq!(source.rows(sql).await, target.rows(sql).await);
    drop_replication(&source, &target).await;
}

/// Rows of one kind are gathered into one statement, moved past rows they share no known key
/// with; a unique value the source did not log (the old code of an update under PostgreSQL's
/// default replica identity) can make such a move fail on the target. The unit is then rolled
/// back and applied again in source order: the stream neither fails nor loses the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gathered_row_that_meets_an_unlogged_unique_value_lands_in_source_order() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE u (id int PRIMARY KEY, code text NOT NULL UNIQUE);
             INSERT INTO u SELECT g, 'c' || g FROM generate_series(1, 5) g;",
        )
        .await;
    let base = ["--table", "public.u", "--parallel", "1", "--until-current"];
    run(&mut replicate(&source, &target, &base).await).ok();
    // One transaction, so one unit: the insert of 21 would join the insert of 30 ahead of the
    // update that frees code 'c1'.
    source
        .exec(
            "BEGIN; INSERT INTO u VALUES (30, 'c30');
             UPDATE u SET code = 'moved' WHERE id = 1;
             INSERT INTO u VALUES (21, 'c1'); COMMIT;",
        )
        .await;
    let report = crate::common::tempdir();
    let path = report.path().join("r.json");
    let mut cmd = replicate(&source, &target, &base).await;
    cmd.arg("--report-json").arg(&path);
    run(&mut cmd).ok();
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(report["conflicts"].as_u64(), Some(1), "{report}");
    let sql = "SELECT id, code FROM u";
    assert_eq!(source.rows(sql).await, target.rows(sql).await);
    drop_replication(&source, &target).await;
}

/// `--initial none`: tables that already hold the source's rows get only the changes made
/// from the start on (the refusal above names this option).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_none_applies_only_changes_from_now_on() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    let table = "CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL);
                 INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g;";
    source.exec(table).await;
    target.exec(table).await;
    let args = [
        "--table",
        "public.t",
        "--initial",
        "none",
        "--until-current",
    ];
    run(&mut replicate(&source, &target, &args).await).ok();
    source
        .exec("UPDATE t SET v = 'changed' WHERE id <= 10; DELETE FROM t WHERE id > 45; INSERT INTO t VALUES (100, 'new');")
        .await;
    let r = run(&mut replicate(&source, &target, &args).await);
    r.ok();
    assert!(!r.stderr.contains("initial load"), "{}", r.stderr);
    let sql = "SELECT id, v FROM t";
    assert_eq!(source.rows(sql).await, target.rows(sql).await);
    drop_replication(&source, &target).await;
}
