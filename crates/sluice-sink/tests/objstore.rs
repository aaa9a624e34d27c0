#![allow(clippy::unwrap_used)]
//! The object-store destination against each emulator (`sluice-testkit run --s3 --gcs
//! --azure`): uploads over several parts, visibility only on commit, aborts, reads.

use sluice_sink::{Destination, ObjectStoreDestination};
use sluice_testkit::objstore::{Store, test_url};
use std::io::Write;

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

fn check(store: Store) {
    let url = test_url(store);
    let d = ObjectStoreDestination::open(&url).unwrap();
    d.check_writable().unwrap();
    assert!(d.list("").unwrap().is_empty(), "the probe is removed");

    // 11 MiB in 64 KiB writes: three 5 MiB parts on S3 and Azure, one PUT on GCS.
    let want = data(11 << 20);
    let mut w = d.create("ds/part-00000.bin").unwrap();
    for chunk in want.chunks(64 << 10) {
        w.write_all(chunk).unwrap();
    }
    assert!(
        d.get("ds/part-00000.bin").unwrap().is_none(),
        "invisible before commit"
    );
    w.commit().unwrap();
    assert_eq!(
        d.size("ds/part-00000.bin").unwrap(),
        Some(want.len() as u64)
    );
    assert!(d.get("ds/part-00000.bin").unwrap().unwrap() == want);
    let tail = d
        .read_range("ds/part-00000.bin", want.len() as u64 - 10, 100)
        .unwrap();
    assert_eq!(
        tail,
        want[want.len() - 10..],
        "a range past the end is clamped"
    );

    // Dropped after more than one part: nothing appears.
    {
        let mut w = d.create("ds/part-00001.bin").unwrap();
        w.write_all(&want[..6 << 20]).unwrap();
    }
    let mut w = d.create("ds/part-00002.bin").unwrap();
    w.write_all(b"abc").unwrap();
    w.abort();
    let listed: Vec<String> = d.list("ds").unwrap().into_iter().map(|o| o.path).collect();
    assert_eq!(listed, ["ds/part-00000.bin"]);

    // Small objects, missing objects, deletes.
    d.put("_sluice/run.json", b"{}").unwrap();
    assert_eq!(d.get("_sluice/run.json").unwrap().unwrap(), b"{}");
    assert!(d.get("nope.json").unwrap().is_none());
    assert!(d.size("nope.json").unwrap().is_none());
    d.delete("nope.json").unwrap();
    assert_eq!(d.list("").unwrap().len(), 2);
    d.delete("_sluice/run.json").unwrap();
    d.delete("ds/part-00000.bin").unwrap();
    assert!(d.list("").unwrap().is_empty());
}

#[test]
fn s3_uploads_reads_and_aborts() {
    check(Store::S3);
}

#[test]
fn gcs_uploads_reads_and_aborts() {
    check(Store::Gcs);
}

#[test]
fn azure_uploads_reads_and_aborts() {
    check(Store::Azure);
}
