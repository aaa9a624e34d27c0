//! MariaDB/MySQL for tests: the server from the environment and a fresh database per test.
//! [`TestDb::new`] uses the MariaDB of `SLUICE_TEST_MYSQL_URL`; [`TestDb::new_on`] any other
//! server, such as the MySQL 9 of [`crate::mysql9`].

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row, Value};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Turns on each test server (by URL), which every test of a process shares: a test that hurts
/// the whole server (a long MyISAM write holds back every global lock) runs [`TestDb::alone`],
/// the others [`TestDb::new`] side by side. All integration tests are one process, so this is
/// what keeps one topic's server-wide harm out of another topic's runs. One server's harm
/// does not reach another, so each server has turns of its own.
static SERVERS: LazyLock<Mutex<HashMap<String, Arc<RwLock<()>>>>> = LazyLock::new(Default::default);

fn turns(server: &str) -> Arc<RwLock<()>> {
    SERVERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry(server.to_string())
        .or_default()
        .clone()
}

/// A test's turn on the server, held as long as its database.
#[allow(dead_code)]
enum Turn {
    Shared(OwnedRwLockReadGuard<()>),
    Alone(OwnedRwLockWriteGuard<()>),
}

/// The test server's URL (a user with every privilege and a password), from
/// `SLUICE_TEST_MYSQL_URL`.
///
/// # Panics
/// When the variable is not set: a test that needs a server fails loudly, it never skips.
pub fn server_url() -> String {
    std::env::var("SLUICE_TEST_MYSQL_URL").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_MYSQL_URL is not set, so there is no MariaDB to test against. Run \
             ./scripts/test, which starts a throwaway server, or set SLUICE_TEST_MYSQL_URL to a \
             mysql://user:password@127.0.0.1:port/db URL of a disposable server whose user may \
             create databases."
        )
    })
}

/// The URL of the test server's replica (test user), from `SLUICE_TEST_MYSQL_REPLICA_URL`
/// (`sluice-testkit run --mariadb --mariadb-replica`).
///
/// # Panics
/// When the variable is not set: a test that needs the replica fails loudly, it never skips.
pub fn replica_url() -> String {
    std::env::var("SLUICE_TEST_MYSQL_REPLICA_URL").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_MYSQL_REPLICA_URL is not set, so there is no MariaDB replica to test \
             against. Run ./scripts/test, which starts one (sluice-testkit run --mariadb \
             --mariadb-replica)."
        )
    })
}

/// Connect to `url`.
pub async fn connect(url: &str) -> Conn {
    let opts = Opts::from_url(url).unwrap_or_else(|e| panic!("bad test URL: {e}"));
    Conn::new(opts)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test server: {e}"))
}

/// A database created for one test, on the test server.
pub struct TestDb {
    /// Database name.
    pub name: String,
    /// URL of the database (test user, with password).
    pub url: String,
    /// A session on it.
    pub conn: Conn,
    /// The server's URL (without this database).
    server: String,
    /// This test's turn on the shared server.
    _turn: Turn,
}

impl TestDb {
    /// Create a database with a random name; other tests' databases may be in use at the same
    /// time, but not one of a test running [`TestDb::alone`].
    pub async fn new() -> TestDb {
        TestDb::new_on(&server_url()).await
    }

    /// [`TestDb::new`] on the server of `server` (a URL like [`server_url`]'s).
    pub async fn new_on(server: &str) -> TestDb {
        let turn = Turn::Shared(turns(server).read_owned().await);
        TestDb::create(turn, server).await
    }

    /// Create a database with a random name for a test that hurts the whole server (a long
    /// write that every global lock must wait for): it waits until no other test uses the
    /// server, and none starts until it is done.
    pub async fn alone() -> TestDb {
        TestDb::alone_on(&server_url()).await
    }

    /// [`TestDb::alone`] on the server of `server`.
    pub async fn alone_on(server: &str) -> TestDb {
        let turn = Turn::Alone(turns(server).write_owned().await);
        TestDb::create(turn, server).await
    }

    async fn create(turn: Turn, server: &str) -> TestDb {
        let name = format!("t_{:016x}", rand::random::<u64>());
        let mut admin = connect(server).await;
        admin
            .query_drop(format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE: {e}"));
        let url = with_database(server, &name);
        let conn = connect(&url).await;
        TestDb {
            name,
            url,
            conn,
            server: server.to_string(),
            _turn: turn,
        }
    }

    /// Run SQL (several statements allowed).
    pub async fn exec(&mut self, sql: &str) {
        self.conn
            .query_drop(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The first column of the first row of `sql`, as text (`None` for NULL or no row).
    pub async fn scalar(&mut self, sql: &str) -> Option<String> {
        let rows: Vec<Row> = self
            .conn
            .query(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.into_iter()
            .next()
            .and_then(|r| r.as_ref(0).and_then(value_text))
    }

    /// Rows of `sql` as `v1|v2|…` (NULL as `∅`), sorted — the counterpart of
    /// [`crate::files::row_strings`] for simple types (integers, text).
    pub async fn row_strings(&mut self, sql: &str) -> Vec<String> {
        rows_as_strings(&mut self.conn, sql).await
    }

    /// The URL of this database for another user and password.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let base = with_database(&self.server, &self.name);
        let after = base.split_once('@').map(|(_, h)| h).unwrap_or(&base);
        format!("mysql://{user}:{password}@{after}")
    }
}

/// Rows of `sql` on `conn` as sorted `v1|v2|…` strings (text protocol: the server's own text).
pub async fn rows_as_strings(conn: &mut Conn, sql: &str) -> Vec<String> {
    let rows: Vec<Row> = conn
        .query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut out: Vec<String> = rows
        .into_iter()
        .map(|r| {
            (0..r.len())
                .map(|i| r.as_ref(i).and_then(value_text).unwrap_or("∅".into()))
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    out.sort();
    out
}

fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::NULL => None,
        Value::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Int(i) => Some(i.to_string()),
        Value::UInt(u) => Some(u.to_string()),
        Value::Float(f) => Some(f.to_string()),
        Value::Double(f) => Some(f.to_string()),
        other => Some(other.as_sql(true).trim_matches('\'').to_string()),
    }
}

/// `url` with its database replaced by `db`.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let base = match base.rfind('/') {
        Some(i) if i > base.find("://").map(|s| s + 2).unwrap_or(0) => &base[..i],
        _ => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}
