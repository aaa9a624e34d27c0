//! A database of the test servers seen the same way for every engine, for the suites of
//! [`crate::scenario`]: a table of numbered rows, its rows read back as sluice exported them,
//! the sessions of a run that are reading, a way to kill one, a writer that inserts while a
//! run goes on.

use crate::files;
use mysql_async::prelude::Queryable;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The engines the suites run over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// PostgreSQL (`SLUICE_TEST_PG_URL`).
    Postgres,
    /// MariaDB (`SLUICE_TEST_MYSQL_URL`).
    Mariadb,
    /// Firebird, embedded (`SLUICE_TEST_FIREBIRD_DIR`).
    Firebird,
    /// Oracle's MySQL 9 (`SLUICE_TEST_MYSQL9_URL`): a database on it is a MySQL one like
    /// MariaDB's, the server differs (its GTIDs, its binary log events).
    Mysql9,
}

enum Db {
    Pg(crate::pg::TestDb),
    My(crate::mysql::TestDb),
    Fb(crate::firebird::TestFdb),
}

/// A fresh database on one engine's test server.
pub struct Source {
    db: Db,
    engine: Engine,
    /// The URL sluice reads.
    pub url: String,
}

/// The numbered table every scenario exports: `id` 1..=rows and a text column, `table` being
/// its name as typed after `--table`.
pub const TABLE: &str = "r";

impl Source {
    /// A new database on `engine`'s test server.
    pub async fn new(engine: Engine) -> Source {
        let db = match engine {
            Engine::Postgres => Db::Pg(crate::pg::TestDb::new().await),
            Engine::Mariadb => Db::My(crate::mysql::TestDb::new().await),
            Engine::Firebird => Db::Fb(crate::firebird::TestFdb::new()),
            Engine::Mysql9 => Db::My(crate::mysql9::test_db().await),
        };
        let url = match &db {
            Db::Pg(d) => d.url.clone(),
            Db::My(d) => d.url.clone(),
            Db::Fb(d) => d.url.clone(),
        };
        Source { db, engine, url }
    }

    /// The engine.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Create [`TABLE`] with `rows` rows of about `width` bytes each.
    pub async fn numbered_table(&mut self, rows: u64, width: usize) {
        let md5s = width.div_ceil(32).max(1);
        match &mut self.db {
            Db::Pg(d) => {
                d.exec(&format!(
                    "CREATE TABLE r (id bigint PRIMARY KEY, v text);
                     INSERT INTO r SELECT g, repeat(md5(g::text), {md5s})
                       FROM generate_series(1, {rows}) g;
                     ANALYZE r;"
                ))
                .await
            }
            Db::My(d) => {
                d.exec(&format!(
                    "SET SESSION max_recursive_iterations = {rows};
                     CREATE TABLE r (id bigint PRIMARY KEY, v varchar({}));
                     INSERT INTO r WITH RECURSIVE g(n) AS
                       (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows})
                       SELECT n, REPEAT(MD5(n), {md5s}) FROM g;
                     ANALYZE TABLE r;",
                    md5s * 32
                ))
                .await
            }
            Db::Fb(d) => d.exec(&format!(
                "CREATE TABLE R (ID BIGINT NOT NULL PRIMARY KEY, V VARCHAR({}))
                 ;;
                 EXECUTE BLOCK AS DECLARE I BIGINT = 1; DECLARE K INTEGER; DECLARE S VARCHAR({0});
                 BEGIN
                   WHILE (I <= {rows}) DO BEGIN
                     S = ''; K = 0;
                     WHILE (K < {md5s}) DO BEGIN S = S || UUID_TO_CHAR(GEN_UUID()); K = K + 1; END
                     INSERT INTO R VALUES (:I, :S);
                     I = I + 1;
                   END
                 END",
                md5s * 36
            )),
        }
    }

    /// The rows of [`TABLE`] as sorted `id|v` strings, as the export's are compared.
    pub async fn rows(&mut self) -> Vec<String> {
        match &mut self.db {
            Db::Pg(d) => d.row_strings("SELECT id, v FROM r").await,
            Db::My(d) => d.row_strings("SELECT id, v FROM r").await,
            Db::Fb(d) => d.row_strings("SELECT ID, V FROM R"),
        }
    }

    /// The name sluice gives [`TABLE`]'s dataset (its directory).
    pub fn dataset(&self) -> String {
        match &self.db {
            Db::Pg(_) => "public.r".into(),
            Db::My(d) => format!("{}.r", d.name),
            Db::Fb(_) => "R".into(),
        }
    }

    /// The exported rows of [`TABLE`] in `out`, as sorted `id|v` strings.
    pub fn exported(&self, out: &Path) -> Vec<String> {
        files::row_strings(&files::dataset_batches(&out.join(self.dataset())))
    }

    /// The sessions of a running export that are inside a chunk of [`TABLE`] (their statement
    /// reads it), by the engine's session id.
    pub async fn reading_sessions(&mut self) -> Vec<u64> {
        match &mut self.db {
            Db::Pg(d) => d
                .client
                .query(
                    "SELECT pid::int8 FROM pg_stat_activity WHERE datname = current_database() \
                     AND pid <> pg_backend_pid() AND query LIKE 'COPY%' ORDER BY pid",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .iter()
                .map(|r| r.get::<_, i64>(0) as u64)
                .collect(),
            Db::My(d) => {
                let like = format!("SELECT %FROM `{}`.`r`%", d.name);
                d.conn
                    .exec::<u64, _, _>(
                        "SELECT ID FROM information_schema.PROCESSLIST \
                         WHERE INFO LIKE ? AND ID <> CONNECTION_ID() ORDER BY ID",
                        (like,),
                    )
                    .await
                    .expect("PROCESSLIST")
            }
            Db::Fb(d) => d
                .row_strings(
                    "SELECT DISTINCT s.MON$ATTACHMENT_ID FROM MON$STATEMENTS s \
                     WHERE s.MON$STATE > 0 AND s.MON$SQL_TEXT CONTAINING 'FROM \"R\"' \
                       AND s.MON$ATTACHMENT_ID <> CURRENT_CONNECTION",
                )
                .iter()
                .map(|r| r.parse().expect("an attachment id"))
                .collect(),
        }
    }

    /// Kill the session `id` of a run, as a DBA (or a dropped network) would.
    pub async fn kill(&mut self, id: u64) {
        match &mut self.db {
            Db::Pg(d) => d.exec(&format!("SELECT pg_terminate_backend({id})")).await,
            Db::My(d) => d.conn.query_drop(format!("KILL {id}")).await.expect("KILL"),
            Db::Fb(d) => d.exec(&format!(
                "DELETE FROM MON$ATTACHMENTS WHERE MON$ATTACHMENT_ID = {id}"
            )),
        }
    }
}

/// A writer inserting rows `first`, `first + 1`, … into [`TABLE`], one transaction each, on a
/// session of its own, until stopped: what a resume must cope with, the table growing while
/// it runs.
pub struct Inserts {
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Inserts {
    /// Stop; returns how many rows were inserted. Fails when none was: the scenario must have
    /// run with the table changing.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the writer task");
        let n = self.committed.load(Ordering::Relaxed);
        assert!(n > 0, "the writer committed during the runs");
        n
    }
}

impl Source {
    /// Start inserting rows after `after` into [`TABLE`], with `v = 'w'`; returns once the
    /// first is committed. `None` on Firebird, whose concurrent writer must be a process of
    /// its own (`firebird_writer`; the embedded engine is shared by every attachment of a
    /// process), which the Firebird consistency tests run.
    pub async fn start_inserts(&self, after: u64) -> Option<Inserts> {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicU64::new(0));
        let (url, s, c) = (self.url.clone(), stop.clone(), committed.clone());
        let task = match self.db {
            Db::Pg(_) => tokio::spawn(async move {
                let conn = crate::pg::connect(&url).await;
                let mut i = 0;
                while !s.load(Ordering::Relaxed) {
                    i += 1;
                    let id = (after + i) as i64;
                    conn.execute("INSERT INTO r VALUES ($1, 'w')", &[&id])
                        .await
                        .expect("insert");
                    c.store(i, Ordering::Relaxed);
                }
            }),
            Db::My(_) => tokio::spawn(async move {
                let mut conn = crate::mysql::connect(&url).await;
                let mut i = 0;
                while !s.load(Ordering::Relaxed) {
                    i += 1;
                    conn.exec_drop("INSERT INTO r VALUES (?, 'w')", (after + i,))
                        .await
                        .expect("insert");
                    c.store(i, Ordering::Relaxed);
                }
            }),
            Db::Fb(_) => return None,
        };
        while committed.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        Some(Inserts {
            stop,
            committed,
            task,
        })
    }
}

/// `got` (sorted `id|v` rows) is the table's `want` rows plus the writer's rows `first`,
/// `first + 1`, … up to some point: the table as of one moment of a writer that only inserts.
pub fn assert_table_plus_inserts(got: &[String], want: &[String], first: u64, what: &str) {
    let id = |r: &String| -> u64 {
        r.split('|')
            .next()
            .and_then(|i| i.parse().ok())
            .expect("an id")
    };
    let (old, new): (Vec<String>, Vec<String>) = got.iter().cloned().partition(|r| id(r) < first);
    files::assert_same_rows(&old, want, what);
    let mut ids: Vec<u64> = new.iter().map(id).collect();
    ids.sort_unstable();
    let expected: Vec<u64> = (first..first + ids.len() as u64).collect();
    assert!(
        ids == expected,
        "{what}: the inserted rows are not a prefix of the writer's ({} of them)",
        ids.len()
    );
    assert!(
        new.iter().all(|r| r.ends_with("|w")),
        "{what}: inserted values"
    );
}
