//! PostgreSQL for tests: the server from the environment and a fresh database per test.

use tokio_postgres::{Client, NoTls};

/// The test server's superuser URL, from `SLUICE_TEST_PG_URL`.
///
/// # Panics
/// When the variable is not set: a test that needs a server fails loudly, it never skips.
pub fn server_url() -> String {
    std::env::var("SLUICE_TEST_PG_URL").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_PG_URL is not set, so there is no PostgreSQL to test against. Run \
             ./scripts/test, which starts a throwaway server, or set SLUICE_TEST_PG_URL to a \
             superuser URL of a disposable server."
        )
    })
}

/// The superuser URL of the test server's streaming replica, from `SLUICE_TEST_PG_REPLICA_URL`
/// (`sluice-testkit run --pg --pg-replica`).
///
/// # Panics
/// When the variable is not set: a test that needs the replica fails loudly, it never skips.
pub fn replica_url() -> String {
    std::env::var("SLUICE_TEST_PG_REPLICA_URL").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_PG_REPLICA_URL is not set, so there is no PostgreSQL replica to test \
             against. Run ./scripts/test, which starts one (sluice-testkit run --pg --pg-replica)."
        )
    })
}

/// Connect to `url`, driving the connection on the current runtime.
pub async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A database created for one test, on the test server.
pub struct TestDb {
    /// Database name.
    pub name: String,
    /// Superuser URL of the database.
    pub url: String,
    /// A superuser session on it.
    pub client: Client,
}

impl TestDb {
    /// Create a database with a random name.
    pub async fn new() -> TestDb {
        let server = server_url();
        let name = format!("t_{:016x}", rand::random::<u64>());
        let admin = connect(&server).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE: {e}"));
        let url = with_database(&server, &name);
        let client = connect(&url).await;
        TestDb { name, url, client }
    }

    /// Run SQL (several statements allowed).
    pub async fn exec(&self, sql: &str) {
        self.client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Table `name` (`id bigint PRIMARY KEY, v text`) of `rows` numbered rows, `v` the md5 of
    /// the id, analyzed (so plans size it).
    pub async fn numbered(&self, name: &str, rows: u64) {
        self.exec(&format!(
            "CREATE TABLE {name} (id bigint PRIMARY KEY, v text);
             INSERT INTO {name} SELECT g, md5(g::text) FROM generate_series(1, {rows}) g;
             ANALYZE {name};"
        ))
        .await;
    }

    /// The URL of this database for another user (and password).
    pub fn url_as(&self, user: &str, password: Option<&str>) -> String {
        let base = with_database(&server_url(), &self.name);
        let auth = match password {
            Some(p) => format!("{user}:{p}"),
            None => user.to_string(),
        };
        base.replacen("postgres@", &format!("{auth}@"), 1)
    }
}

/// `url` with its database replaced by `db`.
pub fn with_database(url: &str, db: &str) -> String {
    match url.rfind('/') {
        Some(i) => format!("{}/{db}", &url[..i]),
        None => format!("{url}/{db}"),
    }
}

impl TestDb {
    /// Rows of `sql` (selecting simple columns) as `v1|v2|…` (NULL as `∅`), sorted — the
    /// counterpart of [`crate::files::row_strings`].
    pub async fn row_strings(&self, sql: &str) -> Vec<String> {
        rows_as_strings(&self.client, sql).await
    }
}

/// Rows of `sql` on `client` as sorted `v1|v2|…` strings.
pub async fn rows_as_strings(client: &Client, sql: &str) -> Vec<String> {
    let wrapped = format!("SELECT * FROM ({sql}) AS q");
    let stmt = client
        .prepare(&wrapped)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let n = stmt.columns().len();
    let cols: Vec<String> = (0..n)
        .map(|i| format!("coalesce(q.{}::text, '∅')", quote(stmt.columns()[i].name())))
        .collect();
    let rows = client
        .query(
            &format!(
                "SELECT concat_ws('|', {}) FROM ({sql}) AS q",
                cols.join(", ")
            ),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut out: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    out.sort();
    out
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
