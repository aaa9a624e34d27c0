#![allow(clippy::unwrap_used)]
//! kill -9 at a random moment, then --resume: every row exactly once, parts from two
//! snapshots recorded as such. Plus the refusals that keep two exports from mixing.

mod common;

use common::*;
use std::time::{Duration, Instant};

fn receipts(dir: &std::path::Path) -> usize {
    files_under(dir)
        .iter()
        .filter(|f| f.starts_with("_sluice/parts/") && f.ends_with(".json"))
        .count()
}

async fn table(db: &TestDb) {
    db.exec(
        "CREATE TABLE r (id bigint PRIMARY KEY, v text);
         INSERT INTO r SELECT g, repeat(md5(g::text), 3) FROM generate_series(1, 300000) g;
         ANALYZE r;",
    )
    .await;
}

#[tokio::test]
async fn kill_9_then_resume_gives_every_row_once() {
    let db = TestDb::new().await;
    table(&db).await;
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
    // Kill after a random number of committed parts (1..=8 of ~40).
    let kill_after = 1 + (rand::random::<u64>() % 8) as usize;
    for (round, chunking) in [("ctid", "ctid"), ("key", "key")] {
        let out = tempdir();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--chunk-by", chunking]);
        let mut child = sluice()
            .arg("export")
            .arg("--source")
            .arg(&db.url)
            .arg("--to")
            .arg(out.path())
            .args(&all)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while receipts(out.path()) < kill_after {
            assert!(Instant::now() < deadline, "{round}: too slow");
            assert!(
                child.try_wait().unwrap().is_none(),
                "{round}: finished before it could be killed"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!out.path().join("manifest.json").exists(), "{round}");
        let done_before = receipts(out.path());

        // A plain rerun refuses to mix with the unfinished export.
        let refused = export(&db.url, out.path(), &all);
        assert_eq!(refused.code, 2, "{}", refused.stderr);
        assert!(refused.stderr.contains("--resume"), "{}", refused.stderr);

        all.push("--resume");
        let resumed = export(&db.url, out.path(), &all);
        resumed.ok();
        assert!(
            resumed.stderr.contains("already done"),
            "{}",
            resumed.stderr
        );

        let got = files::row_strings(&files::dataset_batches(&out.path().join("public.r")));
        files::assert_same_rows(&got, &want, round);
        let m = files::manifest(out.path());
        assert_eq!(
            m["snapshots"].as_array().unwrap().len(),
            2,
            "{round}: two snapshots recorded"
        );
        let parts = m["datasets"][0]["parts"].as_array().unwrap();
        let from_first = parts.iter().filter(|p| p["snapshot"] == 0).count();
        assert!(
            from_first >= done_before,
            "{round}: parts of the killed run are kept and attributed to snapshot 0"
        );
        assert!(
            parts.iter().any(|p| p["snapshot"] == 1),
            "{round}: the resumed run read the rest under snapshot 1"
        );
        assert!(
            files_under(out.path()).iter().all(|f| !f.ends_with(".tmp")),
            "{round}: temporaries removed"
        );

        // Resuming a complete export does nothing; a new export there is refused.
        let again = export(&db.url, out.path(), &all);
        again.ok();
        assert!(
            again.stderr.contains("already holds a complete export"),
            "{}",
            again.stderr
        );
        let refused = export(&db.url, out.path(), &["--table", "r"]);
        assert_eq!(refused.code, 2);
        assert!(refused.stderr.contains("--overwrite"), "{}", refused.stderr);
    }
}

#[tokio::test]
async fn resume_refuses_a_different_request_and_overwrite_replaces() {
    let db = TestDb::new().await;
    table(&db).await;
    db.exec("CREATE TABLE other (id int); INSERT INTO other VALUES (1)")
        .await;
    let out = tempdir();
    // Fabricate an unfinished run by killing it immediately after its plan is written.
    let mut child = sluice()
        .args([
            "export",
            "--source",
            &db.url,
            "--table",
            "r",
            "--chunk-size",
            "1MB",
            "--to",
        ])
        .arg(out.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    while !out.path().join("_sluice/run.json").exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    if out.path().join("manifest.json").exists() {
        panic!("the export finished before it could be killed");
    }
    let run = export(
        &db.url,
        out.path(),
        &[
            "--table",
            "r",
            "--chunk-size",
            "1MB",
            "--format",
            "csv",
            "--resume",
        ],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("same request"), "{}", run.stderr);
    // --overwrite starts over and replaces the old parts.
    export(&db.url, out.path(), &["--table", "other", "--overwrite"]).ok();
    let m = files::manifest(out.path());
    assert_eq!(m["datasets"].as_array().unwrap().len(), 1);
    assert_eq!(m["datasets"][0]["name"], "public.other");
    assert!(
        !out.path().join("public.r").exists()
            || files_under(&out.path().join("public.r")).is_empty(),
        "old parts removed"
    );
}
