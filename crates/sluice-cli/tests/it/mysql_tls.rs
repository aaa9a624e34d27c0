#![allow(clippy::unwrap_used)]
//! MariaDB over TLS against the test kit's server with `require_secure_transport=ON`
//! (`--mariadb-tls`), whose certificate is valid only for `db.sluice.test`: each `ssl-mode`,
//! a wrong CA, a client certificate login, and no secret in any output.

use crate::common::*;
use mysql_async::prelude::Queryable;
use sluice_testkit::mariadb::MARIADB_PASSWORD;
use sluice_testkit::tls::{CLIENT_USER, NAMED_HOST, TestPki};
use std::path::Path;

/// `127.0.0.1:PORT` of the TLS server.
fn host_port() -> String {
    tls_host_port("SLUICE_TEST_MYSQL_TLS_URL", "--mariadb-tls")
}

/// A fresh database with table `t`, set up as root through the Unix socket.
async fn database() -> (String, Vec<String>) {
    let socket = std::env::var("SLUICE_TEST_MYSQL_TLS_SOCKET_URL").unwrap();
    let name = format!("t_{:016x}", rand::random::<u64>());
    let mut conn = sluice_testkit::mysql::connect(&socket).await;
    conn.query_drop(format!(
        "CREATE DATABASE `{name}`; CREATE TABLE `{name}`.t (id int PRIMARY KEY, v varchar(40)); \
         INSERT INTO `{name}`.t SELECT seq, md5(seq) FROM seq_1_to_500;"
    ))
    .await
    .unwrap();
    let rows: Vec<(i32, String)> = conn
        .query(format!("SELECT id, v FROM `{name}`.t"))
        .await
        .unwrap();
    let mut rows: Vec<String> = rows.iter().map(|(i, v)| format!("{i}|{v}")).collect();
    rows.sort();
    (name, rows)
}

fn url(user: &str, db: &str, query: &str) -> String {
    format!("mysql://{user}@{}/{db}?{query}", host_port())
}

fn password_url(db: &str, query: &str) -> String {
    url(&format!("sluice:{MARIADB_PASSWORD}"), db, query)
}

fn assert_exported(out: &Path, db: &str, rows: &[String]) {
    let got = files::row_strings(&files::dataset_batches(&out.join(format!("{db}.t"))));
    files::assert_same_rows(&got, rows, "t");
}

fn failed(run: &Run, needles: &[&str]) {
    assert_eq!(run.code, 3, "exit code; stderr:\n{}", run.stderr);
    for n in needles {
        assert!(
            run.stderr.contains(n),
            "stderr lacks {n:?}:\n{}",
            run.stderr
        );
    }
    assert!(!run.stderr.contains(MARIADB_PASSWORD), "{}", run.stderr);
}

#[tokio::test]
async fn ssl_modes_against_require_secure_transport() {
    let (db, rows) = database().await;
    let ca = TestPki::from_env().ca().display().to_string();
    // VERIFY_CA: the chain is verified; the certificate names another host, which VERIFY_CA
    // does not check.
    let out = tempdir();
    let run = export(
        &password_url(&db, &format!("ssl-mode=VERIFY_CA&ssl-ca={ca}")),
        out.path(),
        &["--table", "t", "--parallel", "2"],
    );
    run.ok();
    assert_exported(out.path(), &db, &rows);
    assert!(!run.stdout.contains(MARIADB_PASSWORD) && !run.stderr.contains(MARIADB_PASSWORD));
    for f in files_under(out.path()) {
        let text =
            String::from_utf8_lossy(&std::fs::read(out.path().join(&f)).unwrap()).into_owned();
        assert!(!text.contains(MARIADB_PASSWORD), "{f} holds the password");
    }
    // The default (PREFERRED) and REQUIRED encrypt without verifying.
    for query in ["", "ssl-mode=REQUIRED"] {
        let out = tempdir();
        export(&password_url(&db, query), out.path(), &["--table", "t"]).ok();
        assert_exported(out.path(), &db, &rows);
    }
    // DISABLED: the server refuses insecure transport.
    let out = tempdir();
    let run = export(
        &password_url(&db, "ssl-mode=DISABLED"),
        out.path(),
        &["--table", "t"],
    );
    failed(
        &run,
        &["ssl-mode=DISABLED", "require_secure_transport", "TLS"],
    );
    assert!(!out.path().join("manifest.json").exists());
    // VERIFY_IDENTITY: the certificate is not for 127.0.0.1.
    let run = export(
        &password_url(&db, &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")),
        out.path(),
        &["--table", "t"],
    );
    failed(&run, &["host name mismatch", NAMED_HOST, "VERIFY_CA"]);
    // A CA that did not sign the server's certificate.
    let other = TestPki::from_env().other_ca().display().to_string();
    let run = export(
        &password_url(&db, &format!("ssl-ca={other}")),
        out.path(),
        &["--table", "t"],
    );
    failed(&run, &["unknown CA", "ssl-ca"]);
    // A Unix socket is secure transport without TLS, whatever ssl-mode says.
    let socket = std::env::var("SLUICE_TEST_MYSQL_TLS_SOCKET_URL").unwrap();
    let out = tempdir();
    export(
        &format!(
            "{}&ssl-mode=VERIFY_IDENTITY",
            socket.replacen("/mysql?", &format!("/{db}?"), 1)
        ),
        out.path(),
        &["--table", "t"],
    )
    .ok();
    assert_exported(out.path(), &db, &rows);
}

#[tokio::test]
async fn client_certificate_login() {
    let (db, rows) = database().await;
    let pki = TestPki::from_env();
    let query = format!(
        "ssl-mode=VERIFY_CA&ssl-ca={}&ssl-cert={}&ssl-key={}",
        pki.ca().display(),
        pki.client_cert().display(),
        pki.client_key().display()
    );
    let out = tempdir();
    export(
        &url(CLIENT_USER, &db, &query),
        out.path(),
        &["--table", "t"],
    )
    .ok();
    assert_exported(out.path(), &db, &rows);
    // Without the certificate the account (REQUIRE X509) is refused.
    let out = tempdir();
    let run = export(
        &url(CLIENT_USER, &db, &format!("ssl-ca={}", pki.ca().display())),
        out.path(),
        &["--table", "t"],
    );
    failed(&run, &["Access denied"]);
}
