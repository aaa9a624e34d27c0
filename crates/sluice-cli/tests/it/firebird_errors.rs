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
    r.refused(2, &["NOPE does not exist"]);

    let r = export(&db.url, out.path(), &["--schema", "PUBLIC"]);
    r.refused(2, &["Firebird has no schemas"]);

    let missing = db.url.replace(".fdb", "-missing.fdb");
    let r = export(&missing, out.path(), &["--table", "T"]);
    r.refused(3, &["check the path"]);

    let r = run(sluice()
        .env_remove("FIREBIRD")
        .env_remove("FBCLIENT")
        .args(["export", "--source", &db.url, "--table", "T", "--to"])
        .arg(out.path()));
    r.refused(2, &["set FIREBIRD"]);
    assert!(!out.path().join("manifest.json").exists());
}
