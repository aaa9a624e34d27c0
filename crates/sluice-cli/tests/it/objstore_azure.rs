#![allow(clippy::unwrap_used)]
//! Exports to Azure Blob Storage, against Azurite (`sluice-testkit run --azure`).

use crate::common::*;
use crate::objstore_common::*;
use sluice_testkit::objstore::{Store, test_url};

#[tokio::test]
async fn parquet_and_merged_csv_round_trip() {
    round_trip(Store::Azure).await;
}

#[tokio::test]
async fn killed_export_leaves_no_manifest_and_resumes() {
    kill_then_resume(Store::Azure).await;
}

#[tokio::test]
async fn output_lock_is_exclusive_and_taken_over_when_stale() {
    output_lock(Store::Azure).await;
}

#[tokio::test]
async fn missing_container_is_named() {
    missing_bucket(Store::Azure).await;
}

/// A wrong account key: access denied at once (exit 4), with the fix, and the key given in the
/// URL never appears in the message.
#[tokio::test]
async fn wrong_key_is_denied_without_leaking_it() {
    let db = TestDb::new().await;
    table(&db, 10).await;
    // A well-formed key that is not the account's.
    let key = "c2x1aWNlLXdyb25nLWtleS1zbHVpY2Utd3Jvbmcta2V5LXNsdWljZS13cm9uZy1rZXk=";
    let url = format!("{}?azure_storage_account_key={key}", test_url(Store::Azure));
    let r = export_to(&db.url, &url, &["--table", "o"]);
    r.refused(4, &["denied", "AZURE_STORAGE_ACCOUNT_KEY"]);
    assert!(!r.stderr.contains(key), "{}", r.stderr);
}
