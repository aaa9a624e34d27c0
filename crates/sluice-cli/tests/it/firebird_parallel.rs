#![allow(clippy::unwrap_used)]
//! Parallel Firebird export on the embedded engine: pointer-page chunks cover every row exactly
//! once; `--merge` equals a single-worker export; the export is the table as of one point
//! between its start and end while another process changes the table.

use crate::common::*;
use sluice_testkit::firebird::{FbConn, TestFdb};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A table of `rows` rows of ~140 incompressible bytes over several pointer pages (4 KB pages:
/// one pointer page addresses ~800 data pages, ~3 MB), plus a small second table.
fn big(db: &TestFdb, rows: u32) {
    db.exec(&format!(
        "CREATE TABLE BIG (ID INTEGER NOT NULL PRIMARY KEY, V INTEGER, PAD VARCHAR(200))
         ;;
         CREATE TABLE SMALL (K VARCHAR(10) NOT NULL PRIMARY KEY)
         ;;
         INSERT INTO SMALL VALUES ('a')
         ;;
         EXECUTE BLOCK AS DECLARE I INTEGER = 1; BEGIN
           WHILE (I <= {rows}) DO BEGIN
             INSERT INTO BIG VALUES (:I, 0, UUID_TO_CHAR(GEN_UUID()) || UUID_TO_CHAR(GEN_UUID())
               || UUID_TO_CHAR(GEN_UUID()) || UUID_TO_CHAR(GEN_UUID()));
             I = I + 1;
           END
         END"
    ));
}

fn pointer_pages(db: &TestFdb, table: &str) -> usize {
    let r = db.row_strings(&format!(
        "SELECT COUNT(*) FROM RDB$PAGES p JOIN RDB$RELATIONS r ON r.RDB$RELATION_ID = p.RDB$RELATION_ID \
         WHERE r.RDB$RELATION_NAME = '{table}' AND p.RDB$PAGE_TYPE = 4"
    ));
    r[0].parse().unwrap()
}

#[test]
fn pointer_page_chunks_cover_every_row_once_and_merge_equals_one_worker() {
    let db = TestFdb::new();
    big(&db, 60_000);
    let pps = pointer_pages(&db, "BIG");
    assert!(pps >= 3, "the table spans only {pps} pointer pages");
    let want = db.row_strings("SELECT ID, V, PAD FROM BIG");

    let out = tempdir();
    export(
        &db.url,
        out.path(),
        &words("--tables BIG|SMALL --parallel 2 --chunk-size 1MB --batch-size 64KB"),
    )
    .ok();
    let got = files::row_strings(&files::dataset_batches(&out.path().join("BIG")));
    files::assert_same_rows(&got, &want, "pointer-page chunks");
    let m = files::manifest(out.path());
    let big = files::manifest_dataset(&m, "BIG");
    assert_eq!(
        big["parts"].as_array().unwrap().len(),
        pps,
        "one part per pointer page"
    );
    assert_eq!(m["snapshots"][0]["position"]["engine"], "firebird");
    assert_eq!(
        files::row_strings(&files::dataset_batches(&out.path().join("SMALL"))),
        ["a"]
    );

    // Key ranges cover the same rows.
    let keys = tempdir();
    export(
        &db.url,
        keys.path(),
        &words("--table big --parallel 2 --chunk-by key --chunk-size 1MB"),
    )
    .ok();
    let got = files::row_strings(&files::dataset_batches(&keys.path().join("BIG")));
    files::assert_same_rows(&got, &want, "key-range chunks");

    // --merge of the parallel CSV parts (in page order) equals one worker reading the table.
    let merged = tempdir();
    export(
        &db.url,
        merged.path(),
        &words("--table BIG --format csv --merge --parallel 2 --chunk-size 1MB"),
    )
    .ok();
    let single = tempdir();
    export(
        &db.url,
        single.path(),
        &words("--table BIG --format csv --parallel 1 --chunk-by none"),
    )
    .ok();
    let a = std::fs::read(merged.path().join("BIG.csv")).unwrap();
    let b = std::fs::read(single.path().join("BIG/part-00000.csv")).unwrap();
    assert!(a.len() > 1_000_000);
    assert!(a == b, "the merged CSV differs from a single-worker export");
}

/// Writer transaction `i` (1-based): grow row f(i), delete row g(i), insert a new row.
fn writer_ops(i: i64) -> (i64, i64, i64) {
    let id = (i * 7919) % 40_000 + 1;
    (id, (id * 13) % 40_000 + 1, 40_000 + i)
}

/// Rows as `id|v|pad` keyed by id.
fn keyed(rows: &[String]) -> HashMap<i64, String> {
    rows.iter()
        .map(|r| (r.split('|').next().unwrap().parse().unwrap(), r.clone()))
        .collect()
}

/// The smallest number of writer transactions after which the table (starting from
/// `initial`) equals `exported`, if any: the export is then the table as of one point.
fn matching_point(initial: &[String], exported: &[String], max: i64) -> Option<i64> {
    let want = keyed(exported);
    let mut state = keyed(initial);
    let differs = |state: &HashMap<i64, String>, id: i64| state.get(&id) != want.get(&id);
    let ids: HashSet<i64> = state.keys().chain(want.keys()).copied().collect();
    let mut mismatched = ids.iter().filter(|id| differs(&state, **id)).count();
    for m in 0..=max {
        if mismatched == 0 {
            return Some(m);
        }
        let (grow, delete, insert) = writer_ops(m + 1);
        let mut touched = vec![grow, delete, insert];
        touched.sort_unstable();
        touched.dedup();
        for id in &touched {
            mismatched -= usize::from(differs(&state, *id));
        }
        if let Some(row) = state.get_mut(&grow) {
            let mut parts: Vec<String> = row.split('|').map(str::to_string).collect();
            parts[1] = (parts[1].parse::<i64>().unwrap() + 1).to_string();
            parts[2].push('x');
            *row = parts.join("|");
        }
        state.remove(&delete);
        state.insert(insert, format!("{insert}|-1|new"));
        for id in &touched {
            mismatched += usize::from(differs(&state, *id));
        }
    }
    None
}

#[test]
fn workers_share_one_snapshot_under_concurrent_writes() {
    let db = TestFdb::new();
    big(&db, 40_000);
    let initial = db.row_strings("SELECT ID, V, PAD FROM BIG");
    // The writer, in this (another) process: one transaction per step, counted once committed.
    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (path, stop, changes) = (db.path.clone(), stop.clone(), changes.clone());
        std::thread::spawn(move || {
            let mut c = FbConn::attach(&path);
            let mut i: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let (grow, delete, insert) = writer_ops(i);
                c.exec(&format!(
                    "EXECUTE BLOCK AS BEGIN
                       UPDATE BIG SET V = V + 1, PAD = PAD || 'x' WHERE ID = {grow};
                       DELETE FROM BIG WHERE ID = {delete};
                       INSERT INTO BIG VALUES ({insert}, -1, 'new');
                     END"
                ));
                changes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    while changes.load(Ordering::Relaxed) < 20 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = changes.load(Ordering::Relaxed) as i64;
    let out = tempdir();
    let output = sluice()
        .args([
            "export",
            "--source",
            &db.url,
            "--table",
            "BIG",
            "--parallel",
            "4",
            "--chunk-size",
            "1MB",
            "--batch-size",
            "64KB",
            "--to",
        ])
        .arg(out.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let output = finish(output);
    let after = changes.load(Ordering::Relaxed) as i64;
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        output.status.success(),
        "{}:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        after > before,
        "the writer made no change during the export"
    );

    let got = files::row_strings(&files::dataset_batches(&out.path().join("BIG")));
    let m = files::manifest(out.path());
    assert_eq!(m["consistency"], "snapshot");
    assert!(m["datasets"][0]["parts"].as_array().unwrap().len() >= 3);
    let point = matching_point(&initial, &got, after).unwrap_or_else(|| {
        panic!(
            "the export ({} rows, {} parts read by 4 workers) is not the table as of any one \
             point of the writer's {after} transactions",
            got.len(),
            m["datasets"][0]["parts"].as_array().unwrap().len()
        )
    });
    // Everything committed before the export started is in it; nothing after it ended.
    assert!(
        (before..=after).contains(&point),
        "the export shows the table after {point} writer transactions, outside [{before}, {after}]"
    );
}

/// With `--consistency chunk` every chunk is read in its own transaction, so Firebird plans
/// ranges of the primary key, never pointer pages: a row deleted and inserted again with the
/// same key between two chunk reads lands on another page (or a reused slot) and would be read
/// twice or not at all by page ranges. The export pauses after its first part (failpoint
/// `export.after_receipt`); a writer updates rows, deletes every tenth row and inserts it again
/// with the same key, across the whole table; the export then finishes with every key exactly
/// once, each row either as it was or as the writer left it, and the manifest says what holds
/// (`key_ranges` on `ID`). `--chunk-by pages` is refused with the reason, and a keyless table
/// is one chunk in one transaction.
#[tokio::test]
async fn chunk_consistency_reads_key_ranges_under_delete_and_reinsert() {
    const ROWS: i64 = 20_000;
    let db = TestFdb::new();
    big(&db, ROWS as u32);
    db.exec("CREATE TABLE NOKEY (K INTEGER)\n;;\nINSERT INTO NOKEY VALUES (1)");
    let args = words(
        "--tables BIG|NOKEY --consistency chunk --parallel 1 --chunk-size 256KB \
         --batch-size 64KB",
    );
    let out = tempdir();
    let mut pages = args.to_vec();
    pages.extend(["--chunk-by", "pages"]);
    let refused = export(&db.url, &out.path().join("pages"), &pages);
    refused.refused(
        2,
        &["--chunk-by pages cannot be used with --consistency chunk"],
    );

    let paused = harness()
        .paused_at(&db.url, out.path(), &args, "export.after_receipt")
        .await;
    db.exec(&format!(
        "UPDATE BIG SET V = 2 WHERE MOD(ID, 7) = 0
         ;;
         DELETE FROM BIG WHERE MOD(ID, 10) = 0
         ;;
         UPDATE BIG SET V = 3 WHERE MOD(ID, 10) = 1
         ;;
         EXECUTE BLOCK AS DECLARE I INTEGER = 10; BEGIN
           WHILE (I <= {ROWS}) DO BEGIN
             INSERT INTO BIG VALUES (:I, 1, UUID_TO_CHAR(GEN_UUID()));
             I = I + 10;
           END
         END"
    ));
    paused.release().await.ok();

    let mut seen: HashMap<i64, usize> = HashMap::new();
    for row in files::row_strings(&files::dataset_batches(&out.path().join("BIG"))) {
        let mut f = row.split('|');
        let id: i64 = f.next().unwrap().parse().unwrap();
        let v: i64 = f.next().unwrap().parse().unwrap();
        let allowed: &[i64] = match (id % 10, id % 7 == 0) {
            (0, true) => &[0, 2, 1],
            (0, false) => &[0, 1],
            (1, true) => &[0, 2, 3],
            (1, false) => &[0, 3],
            (_, true) => &[0, 2],
            _ => &[0],
        };
        assert!(allowed.contains(&v), "row {id} has V = {v}, never written");
        *seen.entry(id).or_default() += 1;
    }
    let wrong: Vec<(i64, usize)> = (1..=ROWS)
        .map(|id| (id, seen.get(&id).copied().unwrap_or(0)))
        .filter(|&(_, n)| n != 1)
        .collect();
    assert!(wrong.is_empty(), "keys not read exactly once: {wrong:?}");
    assert_eq!(seen.len() as i64, ROWS);

    let m = files::manifest(out.path());
    let ds = |name: &str| files::manifest_dataset(&m, name);
    let big = ds("BIG");
    assert!(big["parts"].as_array().unwrap().len() > 2, "{big}");
    assert_eq!(big["guarantee"]["kind"], "key_ranges");
    assert_eq!(big["guarantee"]["key"], serde_json::json!(["ID"]));
    let nokey = ds("NOKEY");
    assert_eq!(nokey["parts"].as_array().unwrap().len(), 1);
    assert_eq!(nokey["guarantee"]["kind"], "transaction");
}
