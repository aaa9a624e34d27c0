#![allow(clippy::unwrap_used)]
//! `--resume` after every part was written: the run died during `--merge`
//! (`export.before_merge=exit`) or before writing the manifest (`export.before_manifest=exit`).
//! The resumed run reads nothing — on MySQL/MariaDB it takes no global lock — and finishes the
//! merge and the manifest, on PostgreSQL, MariaDB and Firebird. A writer inserts rows during
//! both runs (PostgreSQL, MariaDB): the output holds the initial rows plus exactly the inserts
//! committed before the first run's snapshot.

mod common;

use common::{files, files_under, sluice, tempdir};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

const N: i64 = 20_000;

/// The ids of `dataset` in `out` (from the merged file when `merged`).
fn exported_ids(out: &Path, dataset: &str, merged: bool) -> Vec<i64> {
    let batches = if merged {
        files::parquet_batches(&out.join(format!("{dataset}.parquet")))
    } else {
        files::dataset_batches(&out.join(dataset))
    };
    let mut ids: Vec<i64> = files::row_strings(&batches)
        .iter()
        .map(|r| r.split('|').next().unwrap().parse().unwrap())
        .collect();
    ids.sort();
    ids
}

/// The initial rows 1..=N plus inserts N+1..=N+k for some k: a snapshot of the writer's table.
fn assert_snapshot_of_inserts(ids: &[i64], what: &str) {
    let extra = ids.len() as i64 - N;
    assert!(
        extra >= 0,
        "{what}: {} rows, fewer than the {N} initial",
        ids.len()
    );
    let want: Vec<i64> = (1..=N + extra).collect();
    assert!(
        ids == want,
        "{what}: not the initial rows plus a prefix of the inserts"
    );
}

/// Kill the export at each commit point after the last part, resume it, check the output.
fn kill_after_last_part_then_resume(
    url: &str,
    table: &str,
    dataset: &str,
    extra: &[&str],
    mysql: bool,
    check: impl Fn(&[i64], &str),
) {
    for (failpoint, merge) in [
        ("export.before_merge", true),
        ("export.before_manifest", false),
    ] {
        let out = tempdir();
        let data = out.path().join("data");
        let mut args = vec!["--table", table, "--parallel", "2", "--chunk-size", "128KB"];
        args.extend_from_slice(extra);
        if merge {
            args.push("--merge");
        }
        let first = common::run(
            sluice()
                .env("SLUICE_FAILPOINTS", format!("{failpoint}=exit"))
                .args(["export", "--source", url, "--to"])
                .arg(&data)
                .args(&args),
        );
        assert_ne!(first.code, 0, "{failpoint}: {}", first.stderr);
        assert!(
            first
                .stderr
                .contains(&format!("failpoint {failpoint}: exit")),
            "{failpoint}: {}",
            first.stderr
        );
        assert!(!data.join("manifest.json").exists());
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(data.join("_sluice/run.json")).unwrap()).unwrap();
        let planned = state["chunks"].as_array().unwrap().len();
        assert!(planned >= 2, "{failpoint}: the table spans several parts");

        let report = out.path().join("report.json");
        let resumed = common::run(
            sluice()
                .args(["export", "--source", url, "--to"])
                .arg(&data)
                .args(&args)
                .arg("--resume")
                .arg("--report-json")
                .arg(&report),
        );
        resumed.ok();
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        assert_eq!(
            r["parts_written"], 0,
            "{failpoint}: nothing read again: {r}"
        );
        assert_eq!(r["parts_skipped"], planned as u64, "{failpoint}: {r}");
        let m = files::manifest(&data);
        assert_eq!(m["datasets"][0]["parts"].as_array().unwrap().len(), planned);
        if mysql {
            assert!(
                m["harm"]["global_lock_seconds"].is_null(),
                "{failpoint}: no global lock with nothing to read: {}",
                m["harm"]
            );
        }
        if merge {
            assert_eq!(
                m["datasets"][0]["merged"]["file"],
                format!("{dataset}.parquet")
            );
            assert!(
                files_under(&data)
                    .iter()
                    .all(|f| f.starts_with("_sluice") || !f.contains("part-")),
                "{failpoint}: parts removed after merging"
            );
        }
        let ids = exported_ids(&data, dataset, merge);
        assert_eq!(m["datasets"][0]["rows"], ids.len() as u64);
        check(&ids, failpoint);
    }
}

/// Insert rows N+1, N+2, … one transaction each until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    async fn finish(self) -> i64 {
        assert!(
            self.committed.load(Ordering::Relaxed) > 0,
            "the writer committed during the runs"
        );
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        self.committed.load(Ordering::Relaxed)
    }
}

async fn wait_for_first_insert(committed: &AtomicI64) {
    while committed.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_resume_after_the_last_part() {
    let db = common::TestDb::new().await;
    db.exec(&format!(
        "CREATE TABLE r (id bigint PRIMARY KEY, v text);
         INSERT INTO r SELECT g, repeat(md5(g::text), 2) FROM generate_series(1, {N}) g;
         ANALYZE r;"
    ))
    .await;
    let (stop, committed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicI64::new(0)),
    );
    let task = {
        let (url, stop, committed) = (db.url.clone(), stop.clone(), committed.clone());
        tokio::spawn(async move {
            let c = sluice_testkit::pg::connect(&url).await;
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                c.execute("INSERT INTO r VALUES ($1, 'w')", &[&(N + i)])
                    .await
                    .unwrap();
                committed.store(i, Ordering::Relaxed);
            }
        })
    };
    wait_for_first_insert(&committed).await;
    let writer = Writer {
        stop,
        committed,
        task,
    };
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || {
        kill_after_last_part_then_resume(
            &url,
            "r",
            "public.r",
            &[],
            false,
            assert_snapshot_of_inserts,
        )
    })
    .await
    .unwrap();
    writer.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_resume_after_the_last_part_takes_no_lock() {
    use mysql_async::prelude::Queryable;
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    db.exec(&format!(
        "CREATE TABLE r (id bigint PRIMARY KEY, v varchar(100));
         INSERT INTO r SELECT seq, REPEAT(MD5(seq), 2) FROM seq_1_to_{N};
         ANALYZE TABLE r;"
    ))
    .await;
    let (stop, committed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicI64::new(0)),
    );
    let task = {
        let (url, stop, committed) = (db.url.clone(), stop.clone(), committed.clone());
        tokio::spawn(async move {
            let mut c = sluice_testkit::mysql::connect(&url).await;
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                c.exec_drop("INSERT INTO r VALUES (?, 'w')", (N + i,))
                    .await
                    .unwrap();
                committed.store(i, Ordering::Relaxed);
            }
        })
    };
    wait_for_first_insert(&committed).await;
    let writer = Writer {
        stop,
        committed,
        task,
    };
    let (url, dataset) = (db.url.clone(), format!("{}.r", db.name));
    tokio::task::spawn_blocking(move || {
        kill_after_last_part_then_resume(&url, "r", &dataset, &[], true, assert_snapshot_of_inserts)
    })
    .await
    .unwrap();
    writer.finish().await;
}

#[test]
fn firebird_resume_after_the_last_part() {
    let db = sluice_testkit::firebird::TestFdb::new();
    db.exec(&format!(
        "CREATE TABLE R (ID BIGINT NOT NULL PRIMARY KEY, V VARCHAR(100))
         ;;
         EXECUTE BLOCK AS DECLARE I INTEGER = 1; BEGIN
           WHILE (I <= {N}) DO BEGIN
             INSERT INTO R VALUES (:I, UUID_TO_CHAR(GEN_UUID()) || UUID_TO_CHAR(GEN_UUID()));
             I = I + 1;
           END
         END"
    ));
    let want: Vec<i64> = (1..=N).collect();
    // A table this small fits one pointer page: split it on its key instead.
    let key = ["--chunk-by", "key"];
    kill_after_last_part_then_resume(&db.url, "R", "R", &key, false, |ids, what| {
        assert!(ids == want, "{what}: the table's rows exactly once")
    });
}
