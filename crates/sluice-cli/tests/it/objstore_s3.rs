#![allow(clippy::unwrap_used)]
//! Exports to S3, against moto's S3 server (`sluice-testkit run --s3`).

use crate::common::*;
use crate::objstore_common::*;
use sluice_testkit::objstore::{Store, test_url};

#[tokio::test]
async fn parquet_and_merged_csv_round_trip() {
    round_trip(Store::S3).await;
}

#[tokio::test]
async fn killed_export_leaves_no_manifest_and_resumes() {
    kill_then_resume(Store::S3).await;
}

#[tokio::test]
async fn output_lock_is_exclusive_and_taken_over_when_stale() {
    output_lock(Store::S3).await;
}

#[tokio::test]
async fn missing_bucket_is_named() {
    missing_bucket(Store::S3).await;
}

/// An endpoint nobody listens on: a destination error after bounded retries, saying what is
/// wrong; the secret key never appears.
#[tokio::test]
async fn unreachable_endpoint_fails_cleanly() {
    let db = TestDb::new().await;
    table(&db, 10).await;
    let port = sluice_testkit::server::free_port().unwrap();
    let url = format!("{}?endpoint=http://127.0.0.1:{port}", test_url(Store::S3));
    let r = export_to(&db.url, &url, &["--table", "o"]);
    r.refused(4, &["unreachable"]);
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    assert!(!r.stderr.contains(&secret), "{}", r.stderr);
}

/// Client settings and upload sizes from flags: with no endpoint in the environment, the
/// endpoint and credentials come from `--storage-option`, parts from `--part-size` and
/// `--upload-concurrency`; a merged CSV bigger than two parts reads back whole.
#[tokio::test]
async fn storage_options_and_part_size_from_flags() {
    let db = TestDb::new().await;
    table(&db, 100_000).await;
    let want = db.row_strings("SELECT id, v FROM o").await;
    let url = test_url(Store::S3);
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    let key = std::env::var("AWS_ACCESS_KEY_ID").unwrap();
    let r = run(sluice()
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_ACCESS_KEY_ID")
        .args(["export", "--source", &db.url, "--to", &url])
        .args(["--table", "o", "--format", "csv", "--merge"])
        .args(["--part-size", "5MB", "--upload-concurrency", "3"])
        .arg(format!("--storage-option=endpoint={endpoint}"))
        .arg(format!("--storage-option=access_key_id={key}"))
        .arg(format!("--storage-option=secret_access_key={secret}")));
    r.ok();
    assert!(!r.stderr.contains(&secret), "{}", r.stderr);
    let local = tempdir();
    download(&url, local.path()).await;
    let csv = std::fs::read_to_string(local.path().join("public.o.csv")).unwrap();
    assert!(
        csv.len() > 5 << 20,
        "more than one 5 MB part: {}",
        csv.len()
    );
    let mut got: Vec<String> = csv.lines().skip(1).map(|l| l.replace(',', "|")).collect();
    got.sort();
    files::assert_same_rows(&got, &want, "csv via flags");

    // A flag wins over the environment: an endpoint flag pointing nowhere fails the export
    // although AWS_ENDPOINT_URL names the emulator.
    let r = run(sluice()
        .args(["export", "--source", &db.url, "--to", &test_url(Store::S3)])
        .args([
            "--table",
            "o",
            "--storage-option",
            "endpoint=http://127.0.0.1:1",
        ]));
    assert_eq!(r.code, 4, "{}", r.stderr);
}

/// Object-store options with a local --to, or malformed, are refused before anything runs,
/// and a malformed option's value (maybe a secret) is not echoed.
#[tokio::test]
async fn storage_options_are_checked() {
    let db = TestDb::new().await;
    table(&db, 10).await;
    let out = tempdir();
    let r = export(&db.url, out.path(), &["--table", "o", "--part-size", "8MB"]);
    r.refused(2, &["object stores only"]);
    let url = test_url(Store::S3);
    let r = export_to(
        &db.url,
        &url,
        &["--table", "o", "--storage-option", "=hunter2"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("KEY=VALUE") && !r.stderr.contains("hunter2"),
        "{}",
        r.stderr
    );
    let r = export_to(&db.url, &url, &["--table", "o", "--part-size", "64KB"]);
    r.refused(2, &["too small"]);
    let r = export_to(
        &db.url,
        &url,
        &["--table", "o", "--storage-option", "no_such_key=hunter2"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("no_such_key") && !r.stderr.contains("hunter2"),
        "{}",
        r.stderr
    );
    assert!(files_under(out.path()).is_empty());
}
