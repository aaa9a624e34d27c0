#![allow(clippy::unwrap_used)]
//! The object-store destination against each emulator (`sluice-testkit run --s3 --gcs
//! --azure`): uploads over several parts, visibility only on commit, aborts, reads.

use sluice_sink::{Destination, ObjectStoreDestination};
use sluice_testkit::objstore::{Store, test_url};
use std::io::Write;
use std::sync::Arc;

fn data(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Run `f` with a part writer of `d` on a blocking thread, where format encoders use them.
async fn on_writer_thread<T: Send + 'static>(
    d: &Arc<ObjectStoreDestination>,
    f: impl FnOnce(&ObjectStoreDestination) -> T + Send + 'static,
) -> T {
    let d = d.clone();
    tokio::task::spawn_blocking(move || f(&d)).await.unwrap()
}

async fn check(store: Store) {
    let url = test_url(store);
    let d = Arc::new(ObjectStoreDestination::open(&url).unwrap());
    d.check_writable().await.unwrap();
    assert!(d.list("").await.unwrap().is_empty(), "the probe is removed");

    // 11 MiB in 64 KiB writes: three 5 MiB parts on S3 and Azure, one PUT on GCS.
    let want = data(11 << 20);
    let w = {
        let want = want.clone();
        on_writer_thread(&d, move |d| {
            let mut w = d.create("ds/part-00000.bin").unwrap();
            for chunk in want.chunks(64 << 10) {
                w.write_all(chunk).unwrap();
            }
            w
        })
        .await
    };
    assert!(
        d.get("ds/part-00000.bin").await.unwrap().is_none(),
        "invisible before commit"
    );
    tokio::task::spawn_blocking(move || w.commit())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        d.size("ds/part-00000.bin").await.unwrap(),
        Some(want.len() as u64)
    );
    assert!(d.get("ds/part-00000.bin").await.unwrap().unwrap() == want);
    let len = want.len() as u64;
    let tail = on_writer_thread(&d, move |d| {
        d.read_range("ds/part-00000.bin", len - 10, 100).unwrap()
    })
    .await;
    assert_eq!(
        tail,
        want[want.len() - 10..],
        "a range past the end is clamped"
    );

    // Dropped after more than one part: nothing appears.
    let six = want[..6 << 20].to_vec();
    on_writer_thread(&d, move |d| {
        let mut w = d.create("ds/part-00001.bin").unwrap();
        w.write_all(&six).unwrap();
        let mut w = d.create("ds/part-00002.bin").unwrap();
        w.write_all(b"abc").unwrap();
        w.abort();
    })
    .await;
    let listed: Vec<String> = d
        .list("ds")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.path)
        .collect();
    assert_eq!(listed, ["ds/part-00000.bin"]);

    // Small objects, missing objects, deletes.
    d.put("_sluice/run.json", b"{}".to_vec()).await.unwrap();
    assert_eq!(d.get("_sluice/run.json").await.unwrap().unwrap(), b"{}");
    assert!(d.get("nope.json").await.unwrap().is_none());
    assert!(d.size("nope.json").await.unwrap().is_none());
    d.delete("nope.json").await.unwrap();
    assert_eq!(d.list("").await.unwrap().len(), 2);
    d.delete("_sluice/run.json").await.unwrap();
    d.delete("ds/part-00000.bin").await.unwrap();
    assert!(d.list("").await.unwrap().is_empty());
}

#[tokio::test]
async fn s3_uploads_reads_and_aborts() {
    check(Store::S3).await;
}

#[tokio::test]
async fn gcs_uploads_reads_and_aborts() {
    check(Store::Gcs).await;
}

#[tokio::test]
async fn azure_uploads_reads_and_aborts() {
    check(Store::Azure).await;
}
