//! `--layout date` and `hive` of change files: a MariaDB stream whose transactions commit in two
//! hours (their commit times set with `SET timestamp`, which the binary log records, so nothing
//! waits for a clock) writes into two partitions, each holding exactly its hour's changes; a run
//! killed at every failpoint of a batch is followed by one that rewrites the names the intent
//! recorded; replay equals the table.

use crate::common::{self, Failpoints, run, tempdir};
use crate::mysql_stream::stream;
use sluice_testkit::changes::{change_files, replay};
use sluice_testkit::formats::jsonl_rows;
use std::path::Path;

/// 2021-03-04 09:59:30 UTC, 30 s before the hour.
const BEFORE_HOUR: i64 = 1_614_851_970;

fn state(to: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(to.join("_sluice/stream.json")).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hive_layout_partitions_by_commit_hour_and_retries_rewrite_the_same_names() {
    by_commit_hour("hive", ["dt=2021-03-04/hr=09/", "dt=2021-03-04/hr=10/"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn date_layout_partitions_by_commit_hour_and_retries_rewrite_the_same_names() {
    by_commit_hour("date", ["2021/03/04/09/", "2021/03/04/10/"]).await;
}

/// A stream with `--layout layout` over transactions committed in two hours, killed at every
/// failpoint of a batch: each hour's changes in exactly its partition (`partitions`, 09:00 and
/// 10:00), retries under the names the intent recorded.
async fn by_commit_hour(layout: &str, partitions: [&str; 2]) {
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    db.exec("CREATE TABLE ev (id bigint PRIMARY KEY, v int NOT NULL)")
        .await;
    let to = tempdir();
    let args = [
        "--initial",
        "none",
        "--until-current",
        "--layout",
        layout,
        "--format",
        "jsonl",
        "--batch-bytes",
        "64KB",
    ];
    run(&mut stream(&db.url, &["ev"], to.path(), &args)).ok();
    // Transactions 30 s on either side of 10:00, the second hour's updating the first's rows.
    for i in 0..60i64 {
        let ts = BEFORE_HOUR + i;
        let update = if i >= 30 {
            format!("UPDATE ev SET v = v + 1 WHERE id = {};", i - 30)
        } else {
            String::new()
        };
        db.exec(&format!(
            "SET timestamp = {ts}; START TRANSACTION; INSERT INTO ev VALUES ({i}, {i}); {update} \
             COMMIT; SET timestamp = DEFAULT;"
        ))
        .await;
    }
    let dataset = to.path().join(format!("{}.ev", db.name));
    let mut recorded: Vec<String> = Vec::new();
    for spec in [
        "stream.after_flush=exit@1",
        "stream.before_intent=exit@1",
        "stream.after_intent=exit@2",
        "stream.after_files=exit@1",
    ] {
        let fp = Failpoints::new();
        let mut cmd = stream(&db.url, &["ev"], to.path(), &args);
        fp.arm(&mut cmd, spec);
        let r = run(&mut cmd);
        assert_ne!(r.code, 0, "{spec}: the run did not die:\n{}", r.stderr);
        if spec.starts_with("stream.after_intent") {
            let files = state(to.path())["intent"]["files"].clone();
            recorded = serde_json::from_value(files).unwrap();
            assert!(!recorded.is_empty(), "an intent with files");
            assert!(
                recorded.iter().all(|f| partitions
                    .iter()
                    .any(|p| f.contains(&format!("/changes/{p}")))),
                "{recorded:?}"
            );
        }
        if spec.starts_with("stream.after_files") {
            // The retried batch committed its files under the names its intent recorded.
            for f in &recorded {
                assert!(to.path().join(f).is_file(), "{f} rewritten");
            }
        }
    }
    let r = run(&mut stream(&db.url, &["ev"], to.path(), &args));
    r.ok();
    for f in &recorded {
        assert!(to.path().join(f).is_file(), "{f} kept");
    }
    // Every file lies in its commit hour's partition, each partition holds its hour's changes,
    // and the two hours are both there.
    let mut per_hour = std::collections::BTreeMap::new();
    for f in change_files(&dataset) {
        let rel = f
            .strip_prefix(&dataset)
            .unwrap()
            .to_string_lossy()
            .to_string();
        let hour = if rel.starts_with(&format!("changes/{}", partitions[0])) {
            "2021-03-04T09:"
        } else if rel.starts_with(&format!("changes/{}", partitions[1])) {
            "2021-03-04T10:"
        } else {
            panic!("{rel} is outside the two partitions")
        };
        for row in jsonl_rows(&f) {
            let ts = &row.iter().find(|(k, _)| k == "_commit_ts").unwrap().1;
            let ts = ts.as_str().unwrap();
            assert!(ts.starts_with(hour), "{rel}: a change committed at {ts}");
            *per_hour.entry(hour).or_insert(0) += 1;
        }
    }
    assert_eq!(
        per_hour.into_iter().collect::<Vec<_>>(),
        [("2021-03-04T09:", 30), ("2021-03-04T10:", 60)],
        "30 inserts before 10:00, 30 inserts and 30 updates after"
    );
    let replayed = replay(&dataset, &["id"]);
    let want = db.row_strings("SELECT id, v FROM ev").await;
    common::files::assert_same_rows(&replayed.rows, &want, "changes replayed by _seq");
    let left: Vec<String> = common::files_under(&dataset)
        .into_iter()
        .filter(|f| f.contains("/.") || f.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "temporaries left: {left:?}");
}
