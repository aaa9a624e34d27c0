#![allow(clippy::unwrap_used)]
//! Firebird: the refusals and errors a Firebird source gives for bad input (a missing table, a
//! schema, a missing database file, no client library). Its kill and resume scenarios are the
//! shared ones (`scenarios.rs`).

use crate::common::*;
use sluice_testkit::firebird::TestFdb;

#[test]
fn bad_input_is_refused_clearly() {
    let db = TestFdb::new();
    db.exec("CREATE TABLE T (ID INTEGER)");
    let out = tempdir();

    let r = export(&db.url, out.path(), &["--table", "NOPE"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("NOPE does not exist"), "{}", r.stderr);

    let r = export(&db.url, out.path(), &["--schema", "PUBLIC"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("Firebird has no schemas"), "{}", r.stderr);

    let missing = db.url.replace(".fdb", "-missing.fdb");
    let r = export(&missing, out.path(), &["--table", "T"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("check the path"), "{}", r.stderr);

    let r = run(sluice()
        .env_remove("FIREBIRD")
        .env_remove("FBCLIENT")
        .args(["export", "--source", &db.url, "--table", "T", "--to"])
        .arg(out.path()));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("set FIREBIRD"), "{}", r.stderr);
    assert!(!out.path().join("manifest.json").exists());
}
