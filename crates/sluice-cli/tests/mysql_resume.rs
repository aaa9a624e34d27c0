#![allow(clippy::unwrap_used)]
//! MariaDB: kill -9 at a random moment, then --resume: every row exactly once, parts from two
//! snapshots recorded as such.

#[allow(unused_imports)]
mod common;

use common::{export, files, files_under, sluice, tempdir};
use sluice_testkit::mysql::TestDb;
use std::time::{Duration, Instant};

fn receipts(dir: &std::path::Path) -> usize {
    files_under(dir)
        .iter()
        .filter(|f| f.starts_with("_sluice/parts/") && f.ends_with(".json"))
        .count()
}

#[tokio::test]
async fn kill_9_then_resume_gives_every_row_once() {
    let mut db = TestDb::new().await;
    db.exec(
        "SET SESSION max_recursive_iterations = 1000000;
         CREATE TABLE r (id bigint PRIMARY KEY, v varchar(200));
         INSERT INTO r WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 300000)
           SELECT n, REPEAT(MD5(n), 3) FROM g;
         ANALYZE TABLE r;",
    )
    .await;
    let want = db.row_strings("SELECT id, v FROM r").await;
    let args = [
        "--table",
        "r",
        "--parallel",
        "2",
        "--chunk-size",
        "1MB",
        "--batch-size",
        "256KB",
    ];
    let kill_after = 1 + (rand::random::<u64>() % 8) as usize;
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
    while receipts(out.path()) < kill_after {
        assert!(Instant::now() < deadline, "too slow");
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.path().join("manifest.json").exists());
    let done_before = receipts(out.path());

    let refused = export(&db.url, out.path(), &args);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("--resume"), "{}", refused.stderr);

    let mut resume_args = args.to_vec();
    resume_args.push("--resume");
    let resumed = export(&db.url, out.path(), &resume_args);
    resumed.ok();
    assert!(
        resumed.stderr.contains("already done"),
        "{}",
        resumed.stderr
    );

    let got = files::row_strings(&files::dataset_batches(
        &out.path().join(format!("{}.r", db.name)),
    ));
    files::assert_same_rows(&got, &want, "after kill -9 and --resume");
    let m = files::manifest(out.path());
    assert_eq!(m["snapshots"].as_array().unwrap().len(), 2);
    let parts = m["datasets"][0]["parts"].as_array().unwrap();
    assert!(parts.iter().filter(|p| p["snapshot"] == 0).count() >= done_before);
    assert!(parts.iter().any(|p| p["snapshot"] == 1));
    assert!(files_under(out.path()).iter().all(|f| !f.ends_with(".tmp")));
}
