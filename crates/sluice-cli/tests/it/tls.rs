#![allow(clippy::unwrap_used)]
//! PostgreSQL over TLS and libpq's conventions, against the test kit's TLS-only server
//! (`--pg-tls`: `ssl = on`, `hostssl` only; certificates generated for the run): what verifies,
//! what is refused and with which message, client certificates, `.pgpass` and `PG*`
//! variables, and that no secret reaches any output.

use crate::common::*;
use sluice_testkit::server::{TLS_PASSWORD, TLS_PASSWORD_USER};
use sluice_testkit::tls::{CLIENT_USER, TestPki};
use std::path::Path;
use std::process::Command;

/// `localhost:PORT` of the TLS server.
fn host_port() -> String {
    tls_host_port("SLUICE_TEST_PG_TLS_URL", "--pg-tls")
}

fn port() -> String {
    host_port().rsplit(':').next().unwrap().to_string()
}

/// A fresh database on the TLS server with table `t` (1000 rows), set up through the Unix
/// socket (the server refuses plaintext TCP).
struct TlsDb {
    name: String,
    rows: Vec<String>,
}

impl TlsDb {
    async fn new() -> TlsDb {
        let socket = std::env::var("SLUICE_TEST_PG_TLS_SOCKET_URL").unwrap();
        let name = format!("t_{:016x}", rand::random::<u64>());
        let admin = sluice_testkit::pg::connect(&socket).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let db_url = socket.replacen("/postgres?", &format!("/{name}?"), 1);
        let client = sluice_testkit::pg::connect(&db_url).await;
        client
            .batch_execute(
                "CREATE TABLE t (id int PRIMARY KEY, v text);
                 INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 1000) g;",
            )
            .await
            .unwrap();
        let rows = sluice_testkit::pg::rows_as_strings(&client, "SELECT id, v FROM t").await;
        TlsDb { name, rows }
    }

    /// `postgres://USER@HOST:PORT/DB?QUERY`.
    fn url(&self, user: &str, host: &str, query: &str) -> String {
        format!("postgres://{user}@{host}:{}/{}?{query}", port(), self.name)
    }

    fn assert_exported(&self, out: &Path) {
        let got = files::row_strings(&files::dataset_batches(&out.join("public.t")));
        files::assert_same_rows(&got, &self.rows, "public.t");
    }
}

fn ca() -> String {
    TestPki::from_env().ca().display().to_string()
}

fn failed(run: &Run, code: i32, needles: &[&str]) {
    assert_eq!(run.code, code, "exit code; stderr:\n{}", run.stderr);
    for n in needles {
        assert!(
            run.stderr.contains(n),
            "stderr lacks {n:?}:\n{}",
            run.stderr
        );
    }
}

/// Every file under `dir` and the run's output, checked for `secret`.
fn assert_no_secret(run: &Run, dir: &Path, secret: &str) {
    assert!(!run.stdout.contains(secret) && !run.stderr.contains(secret));
    for f in files_under(dir) {
        let bytes = std::fs::read(dir.join(&f)).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(secret),
            "{f} holds a secret"
        );
    }
}

#[tokio::test]
async fn verify_full_with_channel_binding_exports_and_leaks_nothing() {
    let db = TlsDb::new().await;
    let out = tempdir();
    let url = format!(
        "postgres://{TLS_PASSWORD_USER}:{TLS_PASSWORD}@localhost:{}/{}?sslmode=verify-full&\
         sslrootcert={}&channel_binding=require",
        port(),
        db.name,
        ca()
    );
    let run = export(&url, out.path(), &["--table", "t", "--parallel", "2"]);
    run.ok();
    db.assert_exported(out.path());
    assert_no_secret(&run, out.path(), TLS_PASSWORD);
}

#[tokio::test]
async fn refusals_name_the_problem_and_the_fix() {
    let db = TlsDb::new().await;
    let out = tempdir();
    // No TLS: the server has no entry for unencrypted sessions.
    let run = export(
        &db.url("postgres", "localhost", "sslmode=disable"),
        out.path(),
        &["--table", "t"],
    );
    failed(&run, 3, &["sslmode=disable", "TLS", "no encryption"]);
    // A CA that did not sign the server's certificate.
    let other = TestPki::from_env().other_ca().display().to_string();
    let run = export(
        &db.url(
            "postgres",
            "localhost",
            &format!("sslmode=verify-ca&sslrootcert={other}"),
        ),
        out.path(),
        &["--table", "t"],
    );
    failed(&run, 3, &["unknown CA", "sslrootcert", "sslmode=require"]);
    // The certificate is for localhost and 127.0.0.1, not for the name connected to.
    let wrong_name = db.url(
        "postgres",
        "db.invalid",
        &format!(
            "hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={}",
            ca()
        ),
    );
    let run = export(&wrong_name, out.path(), &["--table", "t"]);
    failed(
        &run,
        3,
        &["host name mismatch", "db.invalid", "localhost", "verify-ca"],
    );
    assert!(!out.path().join("manifest.json").exists());
    // verify-ca checks the chain but not the name: the same URL works.
    let run = export(
        &wrong_name.replace("verify-full", "verify-ca"),
        out.path(),
        &["--table", "t"],
    );
    run.ok();
    db.assert_exported(out.path());
    // sslnegotiation=direct needs PostgreSQL 17; the test server is older.
    let version =
        sluice_testkit::pg::connect(&std::env::var("SLUICE_TEST_PG_TLS_SOCKET_URL").unwrap())
            .await
            .query_one("SHOW server_version_num", &[])
            .await
            .unwrap()
            .get::<_, String>(0);
    let direct = db.url(
        "postgres",
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}&sslnegotiation=direct",
            ca()
        ),
    );
    let out2 = tempdir();
    let run = export(&direct, out2.path(), &["--table", "t"]);
    if version.parse::<u32>().unwrap() < 170000 {
        failed(&run, 3, &["sslnegotiation=direct", "PostgreSQL 17"]);
    } else {
        run.ok();
    }
}

#[tokio::test]
async fn client_certificate_login() {
    let db = TlsDb::new().await;
    let pki = TestPki::from_env();
    let out = tempdir();
    let url = db.url(
        CLIENT_USER,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", ca()),
    );
    // Certificate and key from libpq's variables.
    let run = run(sluice()
        .args(["export", "--table", "t", "--source", &url, "--to"])
        .arg(out.path())
        .env("PGSSLCERT", pki.client_cert())
        .env("PGSSLKEY", pki.client_key()));
    run.ok();
    db.assert_exported(out.path());
    // Without the certificate, the server refuses.
    let out2 = tempdir();
    let run = export(&url, out2.path(), &["--table", "t"]);
    failed(&run, 3, &["certificate"]);
    // A key others can read is refused before connecting, as libpq does.
    let loose = out2.path().join("loose.key");
    std::fs::copy(pki.client_key(), &loose).unwrap();
    set_mode(&loose, 0o644);
    let run = export(
        &format!(
            "{url}&sslcert={}&sslkey={}",
            pki.client_cert().display(),
            loose.display()
        ),
        out2.path(),
        &["--table", "t"],
    );
    failed(&run, 2, &["group or world access", "chmod 600"]);
    let key_text = std::fs::read_to_string(pki.client_key()).unwrap();
    let key_body = key_text.lines().nth(1).unwrap();
    assert!(!run.stderr.contains(key_body), "key material in a message");
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A sluice command with only libpq's variables naming the target, and `home` as HOME.
fn from_environment(db: &TlsDb, home: &Path, out: &Path) -> Command {
    let mut c = sluice();
    c.args(["export", "--table", "t", "--source", "postgres://", "--to"])
        .arg(out)
        .env("HOME", home)
        .env("PGHOST", "localhost")
        .env("PGPORT", port())
        .env("PGUSER", TLS_PASSWORD_USER)
        .env("PGDATABASE", &db.name)
        .env("PGSSLMODE", "verify-full")
        .env("PGSSLROOTCERT", ca())
        .env("PGAPPNAME", "nightly-copy")
        .env_remove("PGPASSFILE");
    c
}

#[tokio::test]
async fn pgpass_and_pg_variables_are_honoured() {
    let db = TlsDb::new().await;
    let home = tempdir();
    let pgpass = home.path().join(".pgpass");
    std::fs::write(
        &pgpass,
        format!(
            "# test\nlocalhost:{}:{}:{TLS_PASSWORD_USER}:{TLS_PASSWORD}\n",
            port(),
            db.name
        ),
    )
    .unwrap();
    set_mode(&pgpass, 0o600);
    let out = tempdir();
    let ok = run(&mut from_environment(&db, home.path(), out.path()));
    ok.ok();
    db.assert_exported(out.path());
    assert_no_secret(&ok, out.path(), TLS_PASSWORD);
    // A password file others can read is ignored with a warning, as libpq does.
    set_mode(&pgpass, 0o644);
    let out2 = tempdir();
    let run = run(&mut from_environment(&db, home.path(), out2.path()));
    failed(
        &run,
        3,
        &["group or world access", ".pgpass", "asks for a password"],
    );
    assert!(!run.stderr.contains(TLS_PASSWORD));
}

#[tokio::test]
async fn default_root_certificate_makes_require_verify_the_ca() {
    // libpq's quirk: with ~/.postgresql/root.crt present, sslmode=require verifies the chain.
    let db = TlsDb::new().await;
    let home = tempdir();
    std::fs::create_dir(home.path().join(".postgresql")).unwrap();
    let root = home.path().join(".postgresql/root.crt");
    std::fs::copy(TestPki::from_env().other_ca(), &root).unwrap();
    let url = db.url("postgres", "localhost", "sslmode=require");
    let out = tempdir();
    let attempt = |out: &Path| {
        run(sluice()
            .args(["export", "--table", "t", "--source", &url, "--to"])
            .arg(out)
            .env("HOME", home.path()))
    };
    failed(&attempt(out.path()), 3, &["unknown CA", "root.crt"]);
    std::fs::copy(TestPki::from_env().ca(), &root).unwrap();
    attempt(out.path()).ok();
    db.assert_exported(out.path());
}

#[tokio::test]
async fn host_lists_and_session_attributes() {
    let db = TlsDb::new().await;
    let dead = sluice_testkit::server::free_port().unwrap();
    let tls = format!("sslmode=verify-full&sslrootcert={}", ca());
    // The first host refuses connections; the second is the server.
    let list = format!(
        "postgres://postgres@127.0.0.1:{dead},localhost:{}/{}?{tls}&target_session_attrs=read-write",
        port(),
        db.name
    );
    let out = tempdir();
    export(&list, out.path(), &["--table", "t"]).ok();
    db.assert_exported(out.path());
    // The server is a primary, so no host of the list is read-only.
    let out = tempdir();
    let run = export(
        &list.replace("read-write", "read-only"),
        out.path(),
        &["--table", "t"],
    );
    failed(
        &run,
        3,
        &[
            "any PostgreSQL host",
            "target_session_attrs=read-only",
            "refused",
        ],
    );
}

#[tokio::test]
async fn unix_socket_host() {
    let db = TlsDb::new().await;
    let socket = std::env::var("SLUICE_TEST_PG_TLS_SOCKET_URL").unwrap();
    let dir = socket
        .split("host=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap();
    let out = tempdir();
    // TLS does not apply to Unix sockets, so even verify-full connects (as with libpq).
    let url = format!(
        "postgres:///{}?host={dir}&port={}&user=postgres&sslmode=verify-full&sslrootcert={}",
        db.name,
        port(),
        ca()
    );
    export(&url, out.path(), &["--table", "t"]).ok();
    db.assert_exported(out.path());
}

#[tokio::test]
async fn a_failed_part_cancels_its_copy_over_tls() {
    let db = TlsDb::new().await;
    let socket = std::env::var("SLUICE_TEST_PG_TLS_SOCKET_URL").unwrap();
    let client =
        sluice_testkit::pg::connect(&socket.replacen("/postgres?", &format!("/{}?", db.name), 1))
            .await;
    client
        .batch_execute(
            "CREATE TABLE big AS SELECT g AS id, repeat(md5(g::text), 3) AS v \
             FROM generate_series(1, 100000) g",
        )
        .await
        .unwrap();
    let out = tempdir();
    // The writer fails after its first batch, so the reader stops its COPY mid-stream with a
    // cancel request, which must travel over TLS like the session.
    let run = run(sluice()
        .args([
            "export",
            "--table",
            "big",
            "--batch-size",
            "1MB",
            "--source",
        ])
        .arg(db.url(
            "postgres",
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={}", ca()),
        ))
        .arg("--to")
        .arg(out.path())
        .env("SLUICE_FAILPOINTS", "export.after_batch=fatal")
        .env("SLUICE_LOG", "warn,sluice_postgres=debug"));
    // The injected failure is the writer's: a destination error (exit 4).
    failed(
        &run,
        4,
        &["export.after_batch", "sent a query cancel request"],
    );
    assert!(
        !run.stderr.contains("cancelling a COPY failed"),
        "{}",
        run.stderr
    );
}

/// The replication session honours `channel_binding` as libpq does: with `require`, a stream
/// over TLS authenticates with SCRAM-SHA-256-PLUS (bound to the server's certificate) and
/// runs; a login the server lets in without that binding (here trust) is refused before any
/// command, and is let in once binding is not required.
#[tokio::test]
async fn stream_with_channel_binding_required() {
    use sluice_postgres::connect::PgTarget;
    use sluice_postgres::replication::conn::ReplConn;
    let db = TlsDb::new().await;
    let socket = std::env::var("SLUICE_TEST_PG_TLS_SOCKET_URL").unwrap();
    let admin =
        sluice_testkit::pg::connect(&socket.replacen("/postgres?", &format!("/{}?", db.name), 1))
            .await;
    let role = format!("s_{}", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN SUPERUSER PASSWORD 'streampw'"
        ))
        .await
        .unwrap();
    let tls = format!("sslmode=verify-full&sslrootcert={}", ca());
    let url = db.url(
        &format!("{role}:streampw"),
        "localhost",
        &format!("{tls}&channel_binding=require"),
    );
    let out = tempdir();
    let stream = |extra: &[&str]| {
        let mut c = sluice();
        c.args(["stream", "--source", &url, "--table", "t", "--to"])
            .arg(out.path())
            .args(["--batch-seconds", "0.2"])
            .args(extra);
        run(&mut c)
    };
    stream(&["--until-current"]).ok();
    admin
        .batch_execute(
            "UPDATE t SET v = 'changed' WHERE id <= 10; DELETE FROM t WHERE id > 990;
             INSERT INTO t SELECT g, repeat(md5(g::text), 8) FROM generate_series(1001, 21000) g;",
        )
        .await
        .unwrap();
    // The insert is about 6 MB of stream: hundreds of TLS records, which the session reads
    // several at a time (its coalesced reads) and must frame exactly.
    let run = stream(&["--until-current"]);
    run.ok();
    assert_no_secret(&run, out.path(), "streampw");
    let r = sluice_testkit::changes::replay(&out.path().join("public.t"), &["id"]);
    assert_eq!(r.changes.len(), 20 + 20_000);
    let want = sluice_testkit::pg::rows_as_strings(&admin, "SELECT id, v FROM t").await;
    files::assert_same_rows(&r.rows, &want, "snapshot + changes over TLS");
    stream(&["--drop"]).ok();

    let trusted = |binding: &str| {
        PgTarget::parse(&db.url(
            "postgres",
            "localhost",
            &format!("{tls}&channel_binding={binding}"),
        ))
        .unwrap()
    };
    let refused = match ReplConn::connect(&trusted("require")).await {
        Ok(_) => panic!("a session without channel binding was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains("channel_binding=require") && refused.contains("without a password"),
        "{refused}"
    );
    ReplConn::connect(&trusted("prefer")).await.unwrap();
}
