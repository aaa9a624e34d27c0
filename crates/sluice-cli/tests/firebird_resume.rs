#![allow(clippy::unwrap_used)]
//! Firebird: kill -9 in the middle of a parallel export, then --resume: every row exactly once,
//! and the resumed parts recorded under their own snapshot number. Plus the refusals and
//! errors a Firebird source gives for bad input.

mod common;

use common::*;
use sluice_testkit::firebird::TestFdb;
use std::time::{Duration, Instant};

fn receipts(dir: &std::path::Path) -> usize {
    files_under(dir)
        .iter()
        .filter(|f| f.starts_with("_sluice/parts/") && f.ends_with(".json"))
        .count()
}

#[test]
fn kill_9_then_resume_gives_every_row_once() {
    let db = TestFdb::new();
    db.exec(
        "CREATE TABLE R (ID INTEGER NOT NULL PRIMARY KEY, V VARCHAR(200))
         ;;
         EXECUTE BLOCK AS DECLARE I INTEGER = 1; BEGIN
           WHILE (I <= 60000) DO BEGIN
             INSERT INTO R VALUES (:I, UUID_TO_CHAR(GEN_UUID()) || UUID_TO_CHAR(GEN_UUID())
               || UUID_TO_CHAR(GEN_UUID()) || UUID_TO_CHAR(GEN_UUID()));
             I = I + 1;
           END
         END",
    );
    let want = db.row_strings("SELECT ID, V FROM R");
    let args = [
        "--table",
        "R",
        "--parallel",
        "2",
        "--chunk-size",
        "1MB",
        "--batch-size",
        "64KB",
    ];
    let out = tempdir();
    let mut child = sluice()
        .arg("export")
        .arg("--source")
        .arg(&db.url)
        .arg("--to")
        .arg(out.path())
        .args(args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while receipts(out.path()) < 1 {
        assert!(Instant::now() < deadline, "no part within 120 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the export ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = receipts(out.path());
    assert!(
        !out.path().join("manifest.json").exists(),
        "a killed run left a manifest"
    );

    let mut resume: Vec<&str> = args.to_vec();
    resume.push("--resume");
    export(&db.url, out.path(), &resume).ok();
    let got = files::row_strings(&files::dataset_batches(&out.path().join("R")));
    files::assert_same_rows(&got, &want, "after kill -9 and --resume");
    let m = files::manifest(out.path());
    let parts = m["datasets"][0]["parts"].as_array().unwrap();
    assert!(parts.len() > before, "the resumed run wrote no part");
    if before < parts.len() {
        assert_eq!(
            m["snapshots"].as_array().unwrap().len(),
            2,
            "parts from two runs must name two snapshots: {}",
            m["snapshots"]
        );
    }
}

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
