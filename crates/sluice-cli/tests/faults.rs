#![allow(clippy::unwrap_used)]
//! Faults on the source: a worker's backend terminated mid-chunk is retried (rejoining the
//! snapshot), and the retry warning names its part once; a statement timeout fails at once with guidance and no retries.

mod common;

use common::*;
use std::time::{Duration, Instant};

#[tokio::test]
async fn terminated_worker_is_retried_and_the_export_is_exact() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE f (id bigint PRIMARY KEY, v text);
         INSERT INTO f SELECT g, repeat(md5(g::text), 4) FROM generate_series(1, 400000) g;
         ANALYZE f;",
    )
    .await;
    let want = db.row_strings("SELECT id, v FROM f").await;
    let out = tempdir();
    let report = out.path().join("report.json");
    let child = sluice()
        .args([
            "export",
            "--source",
            &db.url,
            "--table",
            "f",
            "--parallel",
            "2",
            "--chunk-size",
            "4MB",
            "--batch-size",
            "256KB",
            "--report-json",
        ])
        .arg(&report)
        .arg("--to")
        .arg(out.path().join("data"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Terminate a backend that is in the middle of a COPY.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let killed = db
            .client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = 'sluice' AND datname = current_database() \
                 AND query LIKE 'COPY%' AND state = 'active'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        if killed > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no COPY to terminate");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let output = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("retrying"),
        "the failure was retried: {stderr}"
    );
    // `public.f part 3: public.f part 3: the connection …` named its part twice once.
    assert_retries_name_their_part_once(&stderr, "public.f");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert!(r["retries"].as_u64().unwrap() >= 1);
    let got = files::row_strings(&files::dataset_batches(&out.path().join("data/public.f")));
    files::assert_same_rows(&got, &want, "after a terminated worker");
}

#[tokio::test]
async fn statement_timeout_fails_at_once_with_guidance() {
    let db = TestDb::new().await;
    let role = format!("r_{}", db.name);
    db.exec(&format!(
        "CREATE TABLE slow (id bigint, v text);
         INSERT INTO slow SELECT g, repeat(md5(g::text), 8) FROM generate_series(1, 300000) g;
         CREATE ROLE {role} LOGIN PASSWORD 'pw'; GRANT SELECT ON slow TO {role};
         ALTER ROLE {role} SET statement_timeout = '30ms';"
    ))
    .await;
    let out = tempdir();
    let started = Instant::now();
    let run = export(
        &db.url_as(&role, Some("pw")),
        out.path(),
        &["--table", "slow", "--chunk-by", "none"],
    );
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("57014"), "{}", run.stderr);
    assert!(
        run.stderr.contains("statement_timeout") && run.stderr.contains("smaller chunks"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("retrying"),
        "a timeout is not retried: {}",
        run.stderr
    );
    assert!(!out.path().join("manifest.json").exists());
    // Not a timing assertion on the product: a sanity bound that no retry loop ran.
    assert!(started.elapsed() < Duration::from_secs(30));
}
