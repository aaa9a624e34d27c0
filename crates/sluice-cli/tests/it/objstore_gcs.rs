#![allow(clippy::unwrap_used)]
//! Exports to Google Cloud Storage, against gcp-storage-emulator (`sluice-testkit run --gcs`).
//!
//! The emulator serves no XML multipart uploads, so these tests use a part size larger than
//! any file they write (see `sluice_testkit::objstore::test_url`): multipart uploads to GCS are
//! not covered here.

use crate::objstore_common::*;
use sluice_testkit::objstore::Store;

#[tokio::test]
async fn parquet_and_merged_csv_round_trip() {
    round_trip(Store::Gcs).await;
}

#[tokio::test]
async fn killed_export_leaves_no_manifest_and_resumes() {
    kill_then_resume(Store::Gcs).await;
}

#[tokio::test]
async fn missing_bucket_is_named() {
    missing_bucket(Store::Gcs).await;
}
