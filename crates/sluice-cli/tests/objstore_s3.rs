#![allow(clippy::unwrap_used)]
//! Exports to S3, against moto's S3 server (`sluice-testkit run --s3`).

mod common;
mod objstore_common;

use common::*;
use objstore_common::*;
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
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(r.stderr.contains("unreachable"), "{}", r.stderr);
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    assert!(!r.stderr.contains(&secret), "{}", r.stderr);
}
