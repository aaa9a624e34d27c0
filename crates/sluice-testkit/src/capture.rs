//! One suite body for every change source: the scenarios `sluice stream` must pass whatever
//! the database — the snapshot hand-off with a writer running, a kill at every failpoint of a
//! batch and the restarts, a schema change, a truncate, `--initial none`, changes made while
//! stopped — written once ([`suite`]) and run over PostgreSQL, MariaDB and MySQL 9 by
//! `tests/it/capture_suite.rs`, one test per scenario and engine.
//!
//! A [`Capture`] is a database of the test servers seen the same way for every engine: the
//! suite's tables created, a writer that keeps changing them, the table read back, the stream
//! run over it, and the one proof every scenario ends with, [`Capture::assert_replay_equals`]:
//! the change files replayed over the snapshot (`crate::changes::replay`, which panics on a
//! repeated `_seq`, an overlap or a gap) equal the table as the server reads it now. The
//! oracle is always the source table, never something sluice wrote.
//!
//! Only the SQL differs per engine, and it is kept here, next to the one place that picks it.

mod lake;
pub mod suite;
mod tables;

pub use crate::source::Engine;
pub use crate::writer::Background;

use crate::changes::{Replayed, assert_replay_equals};
use crate::process::{self, Run};
use crate::scenario::Sluice;
use mysql_async::prelude::Queryable;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;

enum Db {
    Pg(crate::pg::TestDb),
    My(crate::mysql::TestDb),
}

/// A fresh database on one engine's test server, with the binary under test to stream it.
pub struct Capture {
    db: Db,
    engine: Engine,
    sluice: Sluice,
    /// The URL sluice reads.
    pub url: String,
}

/// The columns of the writer's tables, in the order the replay compares them.
pub const ACCT: &str = "id, v, pad";
/// See [`ACCT`].
pub const HIST: &str = "id, acct, amount";

/// The SQL that creates `acct` with `rows` rows and an empty `hist` (the writer's tables,
/// both with a key) on `engine`. Public for the engine-specific tests that run the same writer.
pub fn tables_sql(engine: Engine, rows: i64) -> String {
    match engine {
        Engine::Postgres => format!(
            "CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL);
             INSERT INTO acct SELECT g, 0, md5(g::text) FROM generate_series(1, {rows}) g;
             CREATE TABLE hist (id bigserial PRIMARY KEY, acct bigint NOT NULL,
                                amount numeric(12,2) NOT NULL);
             ANALYZE acct;"
        ),
        Engine::Mariadb | Engine::Mysql9 => {
            // The recursion bound of a CTE has another name on each server.
            let depth = match engine {
                Engine::Mariadb => "max_recursive_iterations",
                _ => "cte_max_recursion_depth",
            };
            format!(
                "SET SESSION {depth} = 1000000;
                 CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL,
                                    pad varchar(200) NOT NULL);
                 INSERT INTO acct WITH RECURSIVE g(n) AS
                   (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows})
                   SELECT n, 0, LPAD(n, 32, 'p') FROM g;
                 CREATE TABLE hist (id bigint PRIMARY KEY AUTO_INCREMENT, acct bigint NOT NULL,
                                    amount decimal(12,2) NOT NULL);
                 ANALYZE TABLE acct;"
            )
        }
        Engine::Firebird => panic!("Firebird has no change capture"),
    }
}

/// One transaction of the writer: updates of three rows, a delete, an insert of key `next`
/// and a key update to `next + 1` in `acct`, an insert in `hist` (and every fifth transaction
/// a delete there), so one transaction spans both tables.
fn writer_sql(engine: Engine, rows: i64, next: i64, n: u64) -> String {
    // Rows from a random point of the key on: PostgreSQL has no `LIMIT` on UPDATE and DELETE.
    let (three, one, trim) = match engine {
        Engine::Postgres => {
            let from = format!("SELECT id FROM acct WHERE id >= (random() * {rows})::bigint");
            (
                format!("id IN ({from} ORDER BY id LIMIT 3)"),
                format!("id = ({from} ORDER BY id LIMIT 1)"),
                "DELETE FROM hist WHERE id = (SELECT min(id) FROM hist);",
            )
        }
        _ => {
            let from = format!("id >= FLOOR(RAND() * {rows}) ORDER BY id");
            (
                format!("{from} LIMIT 3"),
                format!("{from} LIMIT 1"),
                "DELETE FROM hist ORDER BY id LIMIT 1;",
            )
        }
    };
    format!(
        "START TRANSACTION;
         UPDATE acct SET v = v + 1, pad = CONCAT(LEFT(pad, 150), 'u') WHERE {three};
         DELETE FROM acct WHERE {one};
         INSERT INTO acct VALUES ({next}, -1, 'new');
         UPDATE acct SET id = {} WHERE {one};
         INSERT INTO hist (acct, amount) VALUES ({n}, {n} * 0.25);
         {}
         COMMIT;",
        next + 1,
        if n % 5 == 4 { trim } else { "" }
    )
}

/// A session of the writer, on either kind of server.
enum WriterConn {
    Pg(tokio_postgres::Client),
    My(mysql_async::Conn),
}

impl WriterConn {
    async fn open(engine: Engine, url: &str) -> WriterConn {
        match engine {
            Engine::Postgres => WriterConn::Pg(crate::pg::connect(url).await),
            _ => WriterConn::My(crate::mysql::connect(url).await),
        }
    }

    /// Run the statements `sql` (a whole transaction).
    async fn batch(&mut self, sql: &str) {
        match self {
            WriterConn::Pg(c) => c.batch_execute(sql).await.expect("a writer transaction"),
            WriterConn::My(c) => c.query_drop(sql).await.expect("a writer transaction"),
        }
    }
}

/// Start the writer of [`tables_sql`]'s tables on `url`, its inserted keys from `next` on
/// (one after another writer's); returns once it has committed five transactions.
pub async fn start_writer(engine: Engine, url: &str, rows: i64, mut next: i64) -> Background {
    let mut c = WriterConn::open(engine, url).await;
    let w = Background::spawn(|stop, commits| async move {
        while !stop.load(Ordering::Relaxed) {
            let n = commits.load(Ordering::Relaxed);
            c.batch(&writer_sql(engine, rows, next, n)).await;
            next += 2;
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    w.wait_for(5).await;
    w
}

/// PostgreSQL's replication slots of `db`'s database and the server's publications: what a
/// stream keeps on the server, which `--drop` and a failed first start must remove.
pub async fn slots_and_publications(db: &crate::pg::TestDb) -> (i64, i64) {
    let row = db
        .client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_replication_slots
                      WHERE database = current_database()),
                    (SELECT count(*) FROM pg_publication)",
            &[],
        )
        .await
        .expect("slots and publications");
    (row.get(0), row.get(1))
}

impl Capture {
    /// A new database on `engine`'s test server (MySQL 9 checked to be MySQL 9: a URL
    /// pointing at MariaDB would pass without testing what the row is for).
    pub async fn new(sluice: &Sluice, engine: Engine) -> Capture {
        let db = match engine {
            Engine::Postgres => Db::Pg(crate::pg::TestDb::new().await),
            Engine::Mariadb => Db::My(crate::mysql::TestDb::new().await),
            Engine::Mysql9 => Db::My(crate::mysql9::test_db().await),
            Engine::Firebird => panic!("Firebird has no change capture"),
        };
        let url = match &db {
            Db::Pg(d) => d.url.clone(),
            Db::My(d) => d.url.clone(),
        };
        let mut c = Capture {
            db,
            engine,
            sluice: *sluice,
            url,
        };
        if engine == Engine::Mysql9 {
            let version = c
                .scalar("SELECT CONCAT(VERSION(), ' ', @@version_comment)")
                .await;
            assert!(
                version.starts_with("9.") && !version.contains("MariaDB"),
                "{} is not MySQL 9: {version}",
                crate::mysql9::URL_VAR
            );
        }
        c
    }

    /// The engine.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// `pg` on PostgreSQL, `my` on MariaDB and MySQL: the suite's SQL where dialects differ.
    pub fn sql<'a>(&self, pg: &'a str, my: &'a str) -> &'a str {
        if self.engine == Engine::Postgres {
            pg
        } else {
            my
        }
    }

    /// Run `sql` (several statements allowed).
    pub async fn exec(&mut self, sql: &str) {
        match &mut self.db {
            Db::Pg(d) => d.exec(sql).await,
            Db::My(d) => d.exec(sql).await,
        }
    }

    /// The first column of the first row of `sql`, as text.
    pub async fn scalar(&mut self, sql: &str) -> String {
        match &mut self.db {
            Db::Pg(d) => crate::pg::rows_as_strings(&d.client, sql).await.remove(0),
            Db::My(d) => d.scalar(sql).await.unwrap_or_default(),
        }
    }

    /// `SELECT columns FROM table` as sorted `v1|v2|…` rows (NULL as `∅`): the oracle.
    pub async fn rows(&mut self, table: &str, columns: &str) -> Vec<String> {
        let sql = format!("SELECT {columns} FROM {table}");
        match &mut self.db {
            Db::Pg(d) => d.row_strings(&sql).await,
            Db::My(d) => d.row_strings(&sql).await,
        }
    }

    /// The name sluice gives `table`'s dataset (its directory, its `--table` argument and its
    /// key in the stream's state).
    pub fn dataset(&self, table: &str) -> String {
        match &self.db {
            Db::Pg(_) => format!("public.{table}"),
            Db::My(d) => format!("{}.{table}", d.name),
        }
    }

    /// Create the writer's tables, `acct` with `rows` rows and an empty `hist`.
    pub async fn create_accounts(&mut self, rows: i64) {
        self.exec(&tables_sql(self.engine, rows)).await;
    }

    /// Start the writer over the tables of [`Capture::create_accounts`] (`rows` rows).
    pub async fn start_writer(&self, rows: i64) -> Background {
        start_writer(self.engine, &self.url, rows, 10_000_000).await
    }

    /// `sluice stream --source URL --table T… --to TO --batch-seconds 0.2 EXTRA…`.
    pub fn stream(&self, tables: &[&str], to: &Path, extra: &[&str]) -> Command {
        let mut c = (self.sluice.command)();
        c.arg("stream").arg("--source").arg(&self.url);
        for t in tables {
            c.arg("--table").arg(self.dataset(t));
        }
        c.arg("--to")
            .arg(to)
            .args(["--batch-seconds", "0.2"])
            .args(extra);
        c
    }

    /// [`Capture::stream`] to its end.
    pub fn run(&self, tables: &[&str], to: &Path, extra: &[&str]) -> Run {
        process::run(&mut self.stream(tables, to, extra))
    }

    /// Replay `table`'s change files in `to` over its snapshot and compare with `SELECT
    /// columns FROM table`, the first column being the key
    /// ([`crate::changes::assert_replay_equals`]); returns the replay.
    pub async fn assert_replay_equals(
        &mut self,
        to: &Path,
        table: &str,
        columns: &str,
    ) -> Replayed {
        let key = columns.split(',').next().expect("a key column").trim();
        let want = self.rows(table, columns).await;
        assert_replay_equals(to, &self.dataset(table), &[key], &want)
    }

    /// PostgreSQL's replication slots of this database and publications, `None` on engines
    /// that keep nothing on the server.
    pub async fn server_objects(&mut self) -> Option<(i64, i64)> {
        match &self.db {
            Db::Pg(d) => Some(slots_and_publications(d).await),
            Db::My(_) => None,
        }
    }

    /// `--drop` ends the stream: on PostgreSQL its slot and publication are gone after it.
    pub async fn drop_stream(&mut self, tables: &[&str], to: &Path) {
        self.run(tables, to, &["--drop"]).ok();
        if let Some(objects) = self.server_objects().await {
            assert_eq!(objects, (0, 0), "--drop leaves no slot or publication");
        }
    }
}

/// The stream's state in `to` (`_sluice/stream.json`).
pub fn state(to: &Path) -> serde_json::Value {
    let text = std::fs::read(to.join("_sluice/stream.json")).expect("the stream's state");
    serde_json::from_slice(&text).expect("the state is JSON")
}

/// What the writer's `commits` transactions must leave in the change files of its `acct`
/// table, replayed as `r`: at least a change per transaction, inserts, updates and deletes,
/// and each key update written as the delete of the old key and the insert of the new one,
/// back to back in one transaction.
pub fn assert_writer_changes(r: &Replayed, commits: u64) {
    assert!(
        r.changes.len() as u64 >= commits,
        "{} changes for {commits} writer transactions",
        r.changes.len()
    );
    let ops = |op: &str| r.changes.iter().filter(|c| c.op == op).count();
    assert!(ops("insert") > 0 && ops("update") > 0 && ops("delete") > 0);
    let key_updates = r.key_updates(|_, insert| insert.cells[1] != "-1");
    assert!(key_updates > 0, "no key update written as delete + insert");
}
