#![allow(clippy::unwrap_used)]
//! Shared checks of object-storage destinations, run against each emulator by
//! objstore_s3.rs, objstore_gcs.rs and objstore_azure.rs: export, read the objects back and
//! compare with the source; kill mid-export and resume; clear errors.
#![allow(dead_code)]

use crate::common::*;
use sluice_sink::{Destination, LockHolder, ObjectStoreDestination};
use sluice_testkit::objstore::{Store, test_url};
use std::path::Path;
use std::time::{Duration, Instant};

/// The store behind a test URL, as sluice itself opens it.
pub fn open(url: &str) -> ObjectStoreDestination {
    ObjectStoreDestination::open(url).unwrap_or_else(|e| panic!("opening {url}: {e}"))
}

/// The memory target a test URL's upload parts need: the GCS URL asks for 64 MiB parts (each
/// file one `PUT`, see `test_url`), and the (1 + upload concurrency) parts an open file may
/// hold count in `--memory`, so the default 64 MB target would refuse the run.
pub fn memory_for(url: &str) -> &'static [&'static str] {
    if url.contains("part_size=64MiB") {
        &["--memory", "512MB"]
    } else {
        &[]
    }
}

/// `sluice export --source SRC --to URL ARGS…`.
pub fn export_to(src: &str, url: &str, args: &[&str]) -> Run {
    run(sluice()
        .arg("export")
        .arg("--source")
        .arg(src)
        .arg("--to")
        .arg(url)
        .args(args)
        .args(memory_for(url)))
}

/// Copy every object under `url` into `dir`; returns the relative paths.
pub async fn download(url: &str, dir: &Path) -> Vec<String> {
    let d = open(url);
    let mut names = Vec::new();
    for o in d.list("").await.unwrap() {
        let bytes = d.get(&o.path).await.unwrap().unwrap();
        assert_eq!(bytes.len() as u64, o.size, "{}: listed size", o.path);
        let local = dir.join(&o.path);
        std::fs::create_dir_all(local.parent().unwrap()).unwrap();
        std::fs::write(&local, bytes).unwrap();
        names.push(o.path);
    }
    names
}

/// ~100k rows of 64 hex characters (≈ 7.5 MB as CSV: over one 5MB upload part when merged).
pub async fn table(db: &TestDb, rows: u32) {
    db.exec(&format!(
        "CREATE TABLE o (id bigint PRIMARY KEY, v text);
         INSERT INTO o SELECT g, md5(g::text) || md5((g * 7)::text)
           FROM generate_series(1, {rows}) g;
         ANALYZE o;"
    ))
    .await;
}

/// Parquet in parts, and CSV merged into one file (a multipart upload on S3 and Azure), each
/// read back and compared with the source; the manifest matches the stored objects.
pub async fn round_trip(store: Store) {
    let db = TestDb::new().await;
    table(&db, 100_000).await;
    let want = db.row_strings("SELECT id, v FROM o").await;

    let url = test_url(store);
    export_to(
        &db.url,
        &url,
        &["--table", "o", "--parallel", "2", "--chunk-size", "1MB"],
    )
    .ok();
    let local = tempdir();
    let names = download(&url, local.path()).await;
    assert!(
        names
            .iter()
            .all(|n| !n.rsplit('/').next().unwrap().starts_with('.')),
        "no hidden or probe objects remain: {names:?}"
    );
    let got = files::row_strings(&files::dataset_batches(&local.path().join("public.o")));
    files::assert_same_rows(&got, &want, "parquet");
    let m = files::manifest(local.path());
    let parts = m["datasets"][0]["parts"].as_array().unwrap();
    assert!(parts.len() >= 2, "several parts: {m}");
    let d = open(&url);
    for p in parts {
        let file = p["file"].as_str().unwrap();
        assert_eq!(
            d.size(file).await.unwrap(),
            p["bytes"].as_u64(),
            "{file}: stored size matches the manifest"
        );
    }

    let url = test_url(store);
    export_to(
        &db.url,
        &url,
        &words("--table o --format csv --merge --parallel 2 --chunk-size 1MB"),
    )
    .ok();
    let local = tempdir();
    let names = download(&url, local.path()).await;
    let merged = names
        .iter()
        .find(|n| n.ends_with(".csv") && !n.contains('/'))
        .unwrap_or_else(|| panic!("a merged CSV file: {names:?}"));
    let text = std::fs::read_to_string(local.path().join(merged)).unwrap();
    assert!(text.len() > 5 << 20, "the merged file spans several parts");
    let (header, rows) = files::csv_rows(&text, b',', "");
    assert_eq!(header, ["id", "v"]);
    let mut got: Vec<String> = rows
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|c| c.unwrap_or_else(|| "∅".into()))
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    got.sort();
    files::assert_same_rows(&got, &want, "merged csv");
}

async fn receipts(d: &ObjectStoreDestination) -> usize {
    d.list("_sluice/parts").await.map(|l| l.len()).unwrap_or(0)
}

/// kill -9 once a part is committed: no manifest, every part object is whole; `--resume`
/// finishes with every row exactly once.
pub async fn kill_then_resume(store: Store) {
    let db = TestDb::new().await;
    table(&db, 200_000).await;
    let want = db.row_strings("SELECT id, v FROM o").await;
    let url = test_url(store);
    let d = open(&url);
    let args = words("--table o --parallel 2 --chunk-size 1MB --batch-size 256KB");
    let mut child = sluice()
        .arg("export")
        .arg("--source")
        .arg(&db.url)
        .arg("--to")
        .arg(&url)
        .args(&args)
        .args(memory_for(&url))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while receipts(&d).await < 1 {
        assert!(Instant::now() < deadline, "no part committed within 120 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before it could be killed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        d.get("manifest.json").await.unwrap().is_none(),
        "no manifest"
    );
    let local = tempdir();
    download(&url, local.path()).await;
    // Every part under a final name is a whole Parquet file (reading it checks the footer).
    let killed_rows: usize = files::part_files(&local.path().join("public.o"), "parquet")
        .iter()
        .map(|f| {
            files::parquet_batches(f)
                .iter()
                .map(|b| b.num_rows())
                .sum::<usize>()
        })
        .sum();
    assert!(killed_rows < want.len(), "the kill left work to do");

    let mut all = args.to_vec();
    all.push("--resume");
    let resumed = export_to(&db.url, &url, &all);
    resumed.ok();
    let local = tempdir();
    download(&url, local.path()).await;
    let got = files::row_strings(&files::dataset_batches(&local.path().join("public.o")));
    files::assert_same_rows(&got, &want, "resumed");
    let m = files::manifest(local.path());
    assert_eq!(m["snapshots"].as_array().unwrap().len(), 2, "{m}");
}

/// A bucket that does not exist: exit 4 at once, naming the bucket and the fix.
pub async fn missing_bucket(store: Store) {
    let db = TestDb::new().await;
    table(&db, 10).await;
    let url = test_url(store);
    let (scheme, rest) = url.split_once("://").unwrap();
    let bucket = format!("sluice-missing-{:08x}", rand::random::<u32>());
    let rest = rest.split_once('/').map(|(_, r)| r).unwrap_or("");
    let bad = format!("{scheme}://{bucket}/{rest}");
    let r = export_to(&db.url, &bad, &["--table", "o"]);
    r.refused(4, &[&bucket, "does not exist", "create it"]);
}

/// The output's lock on a store: one holder at a time, named to the second; released, it is
/// gone; a lock whose heartbeat stopped (a run that died) is taken over. Not run against the
/// GCS emulator, which ignores `ifGenerationMatch` (every conditional write succeeds there).
pub async fn output_lock(store: Store) {
    let d = open(&test_url(store));
    let first = d.lock(&LockHolder::now("first")).await.unwrap();
    let refused = d.lock(&LockHolder::now("second")).await.err().unwrap();
    assert!(refused.to_string().contains("run first"), "{refused}");
    first.check().unwrap();
    first.release().await;
    assert!(
        d.get("_sluice/lock.json").await.unwrap().is_none(),
        "released"
    );

    let mut dead = LockHolder::now("dead");
    dead.heartbeat = "2000-01-01T00:00:00Z".into();
    d.put("_sluice/lock.json", dead.to_bytes()).await.unwrap();
    let taker = d.lock(&LockHolder::now("taker")).await.unwrap();
    let stored =
        LockHolder::from_bytes(&d.get("_sluice/lock.json").await.unwrap().unwrap()).unwrap();
    assert_eq!(stored.run_id, "taker");
    let refused = d.lock(&LockHolder::now("late")).await.err().unwrap();
    assert!(refused.to_string().contains("run taker"), "{refused}");
    taker.release().await;
}
