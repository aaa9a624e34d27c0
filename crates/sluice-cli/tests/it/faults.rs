#![allow(clippy::unwrap_used)]
//! Faults on PostgreSQL: a statement timeout fails at once with guidance and no retries. (A
//! worker's backend terminated mid-chunk is the shared scenario in `scenarios.rs`.)

use crate::common::*;
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
    let run = export(
        &db.url_as(&role, Some("pw")),
        out.path(),
        &["--table", "slow", "--chunk-by", "none"],
    );
    run.refused(3, &["57014", "statement_timeout", "smaller chunks"]);
    // Permanent: no retry was attempted. Every retry logs the error with "retrying", and
    // giving up after several says so; the error is reported exactly once, by the final message.
    assert!(
        !run.stderr.contains("retrying") && !run.stderr.contains("gave up after"),
        "a timeout is not retried: {}",
        run.stderr
    );
    assert_eq!(
        run.stderr.matches("57014").count(),
        1,
        "one failed statement, reported once: {}",
        run.stderr
    );
    assert!(!out.path().join("manifest.json").exists());
}
