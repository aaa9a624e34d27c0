//! `sluice stream --format delta` on what only PostgreSQL has or what the writer of the
//! capture suite (`capture_suite::delta_table`, every engine, kills at every commit point)
//! does not do: unchanged TOAST values, NULLs, a key update carrying a large value, TRUNCATE;
//! kills at every commit point under a writer of a partitioned table with large values;
//! what a table merged by key cannot carry, refused before anything is created; a second
//! writer of the table; small files folded; a table on S3. Every check reads the table with DuckDB's delta extension (a reader
//! sluice did not write) and compares with the source table.

use crate::common::{TestDb, parquet_files_in, run, sluice, tempdir};
use sluice_testkit::lake;
use std::path::Path;

const SELECT: &str = "SELECT id, v, note, big FROM doc";

/// `sluice stream --format delta` of `selection` (`--table T`, `--tables P`) into `to`.
fn stream_to(
    url: &str,
    to: impl AsRef<std::ffi::OsStr>,
    selection: &[&str],
    extra: &[&str],
) -> std::process::Command {
    let mut c = sluice();
    c.args(["stream", "--source", url])
        .args(selection)
        .arg("--to")
        .arg(to)
        .args([
            "--format",
            "delta",
            "--batch-seconds",
            "0.2",
            "--until-current",
        ])
        .args(extra);
    c
}

fn stream(url: &str, to: &Path, table: &str, extra: &[&str]) -> std::process::Command {
    stream_to(url, to, &["--table", table], extra)
}

/// A database with [`create_doc`]'s table of `rows` rows, streamed into its Delta table in a
/// new output (the snapshot and whatever followed it).
async fn streamed_doc(rows: i64) -> (TestDb, tempfile::TempDir) {
    let db = TestDb::new().await;
    create_doc(&db, rows).await;
    let to = tempdir();
    run(&mut stream(&db.url, to.path(), "public.doc", &[])).ok();
    (db, to)
}

/// `doc` with `rows` rows of small values.
async fn create_doc(db: &TestDb, rows: i64) {
    db.exec(&format!(
        "CREATE TABLE doc (id bigint PRIMARY KEY, v int NOT NULL, note text, big text NOT NULL);
         INSERT INTO doc SELECT g, 0, NULL, 'b' || g FROM generate_series(1, {rows}) g;"
    ))
    .await;
}

async fn assert_table_equals_source(db: &TestDb, to: &Path) {
    let want = db.row_strings(SELECT).await;
    let got = lake::duckdb_delta_strings(&to.join("public.doc"));
    assert_eq!(got.len(), want.len(), "rows in the Delta table");
    assert!(got == want, "the Delta table differs from the source");
}

/// A large value an update leaves unchanged (PostgreSQL does not send it) keeps its value in
/// the table, also when the update moves the row's key; NULLs set and cleared land as NULLs;
/// a TRUNCATE empties the table in one version and what follows it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_toast_values_nulls_and_truncate_reach_the_table() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE doc (id bigint PRIMARY KEY, v int NOT NULL, note text,
                           big text NOT NULL);
         INSERT INTO doc SELECT g, 0, CASE WHEN g % 3 = 0 THEN NULL ELSE 'n' || g END,
           (SELECT string_agg(md5(g::text || k::text), '') FROM generate_series(1, 300) k)
         FROM generate_series(1, 200) g;",
    )
    .await;
    let to = tempdir();
    run(&mut stream(&db.url, to.path(), "public.doc", &[])).ok();
    assert_table_equals_source(&db, to.path()).await;
    db.exec(
        "UPDATE doc SET v = 1 WHERE id <= 50;
         UPDATE doc SET id = 1000 + id WHERE id BETWEEN 60 AND 64;
         UPDATE doc SET note = NULL WHERE id BETWEEN 70 AND 80;
         UPDATE doc SET note = 'back' WHERE id = 3;
         DELETE FROM doc WHERE id BETWEEN 90 AND 99;
         INSERT INTO doc VALUES (5000, 7, NULL, 'small');
         BEGIN; UPDATE doc SET v = 2 WHERE id = 1; UPDATE doc SET id = 6000 WHERE id = 1; COMMIT;",
    )
    .await;
    run(&mut stream(&db.url, to.path(), "public.doc", &[]))
        .ok()
        .says(&["Delta tables: 1 version(s) merged"]);
    assert_table_equals_source(&db, to.path()).await;
    let moved = db
        .row_strings("SELECT length(big) FROM doc WHERE id = 1060")
        .await;
    assert_eq!(moved, ["9600"], "the moved row keeps its large value");
    db.exec(
        "UPDATE doc SET v = 3 WHERE id = 2;
         TRUNCATE doc;
         INSERT INTO doc VALUES (1, 1, 'after', 'x'), (2, 2, NULL, 'y');",
    )
    .await;
    run(&mut stream(&db.url, to.path(), "public.doc", &[])).ok();
    assert_table_equals_source(&db, to.path()).await;
    let view = lake::delta_view(&to.path().join("public.doc"), None);
    assert_eq!(view.ids, vec![1, 2]);
    assert!(
        view.history[0]["sluice.source.position"].is_string(),
        "{:?}",
        view.history[0]
    );
    run(&mut stream(&db.url, to.path(), "public.doc", &["--drop"])).ok();
}

/// What a table kept by key cannot carry is refused (exit 2) before a slot, a snapshot or a
/// file is made, each naming the fix: a table without a key, a generated column the log does
/// not carry, old rows identified by another index, `--ops`, `--accept-missing-cascades`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_table_kept_by_key_cannot_carry_is_refused_before_anything_is_made() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE nokey (a int, b text);
         CREATE TABLE gen (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED);
         CREATE TABLE ident (id int PRIMARY KEY, code text NOT NULL);
         CREATE UNIQUE INDEX ident_code ON ident (code);
         ALTER TABLE ident REPLICA IDENTITY USING INDEX ident_code;
         CREATE TABLE doc (id int PRIMARY KEY);",
    )
    .await;
    let to = tempdir();
    for (table, extra, needles) in [
        (
            "public.nokey",
            &[][..],
            &["public.nokey", "no primary key", "--format parquet"][..],
        ),
        ("public.gen", &[], &["twice", "--columns"]),
        ("public.ident", &[], &["code", "REPLICA IDENTITY DEFAULT"]),
        ("public.doc", &["--ops", "insert"], &["--ops", "Remove it"]),
        (
            "public.doc",
            &["--accept-missing-cascades"],
            &["--accept-missing-cascades"],
        ),
    ] {
        run(&mut stream(&db.url, to.path(), table, extra)).refused(2, needles);
    }
    let slots = db
        .row_strings(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()",
        )
        .await;
    assert!(slots.is_empty(), "{slots:?}");
    // Only the output's lock (`_sluice/lock.json`): no table, no state, no change file.
    let written: Vec<String> = sluice_testkit::process::files_under(to.path())
        .into_iter()
        .filter(|f| !f.ends_with("lock.json"))
        .collect();
    assert!(written.is_empty(), "the refused runs wrote {written:?}");
}

/// Another writer commits to the table between the stream's merge files and its commit (a
/// compaction, as a Spark or delta-rs `OPTIMIZE` does): the stream's commit conflicts, the
/// batch is merged again on the new version, and nothing is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_committed_during_a_merge_makes_the_batch_merge_again() {
    let (db, to) = streamed_doc(500).await;
    // A few versions, so that the table has several small files to compact.
    for k in 0..3 {
        db.exec(&format!("UPDATE doc SET v = v + 1 WHERE id % 7 = {k}"))
            .await;
        run(&mut stream(&db.url, to.path(), "public.doc", &[])).ok();
    }
    db.exec("UPDATE doc SET v = v + 10 WHERE id % 5 = 0; DELETE FROM doc WHERE id % 11 = 0;")
        .await;
    let table = to.path().join("public.doc");
    let compact = format!(
        "from deltalake import DeltaTable; import os; \
         DeltaTable({:?}).optimize.compact(); os._exit(0)",
        table.to_str().unwrap()
    );
    let fp = sluice_testkit::process::Failpoints::new();
    let mut cmd = stream(&db.url, to.path(), "public.doc", &[]);
    let out = fp
        .run_paused_at(&mut cmd, "stream.after_table_files", async {
            let p = std::process::Command::new(lake::python())
                .args(["-c", &compact])
                .output()
                .unwrap();
            assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
        })
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("restarting"),
        "the conflict was not retried: {stderr}"
    );
    assert_table_equals_source(&db, to.path()).await;
    let view = lake::delta_view(&table, None);
    let ops: Vec<&str> = view
        .history
        .iter()
        .filter_map(|c| c["operation"].as_str())
        .collect();
    assert_eq!(ops[..2], ["MERGE", "OPTIMIZE"], "{ops:?}");
    run(&mut stream(&db.url, to.path(), "public.doc", &["--drop"])).ok();
}

/// A stream merging often adds a small file per batch: once the table holds sixteen small
/// files, a merge takes them into its own, so the count stays bounded while the rows stay
/// those of the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_are_compacted_by_the_merges() {
    let (db, to) = streamed_doc(100).await;
    let table = to.path().join("public.doc");
    let mut most = 0;
    for k in 0..24 {
        // An insert (a new small file) and an update of a row of an earlier one.
        db.exec(&format!(
            "INSERT INTO doc VALUES ({}, {k}, 'n', 'x'); UPDATE doc SET v = v + 1 WHERE id = {};",
            1000 + k,
            1 + k * 3
        ))
        .await;
        run(&mut stream(&db.url, to.path(), "public.doc", &[])).ok();
        most = most.max(lake::delta_view(&table, None).files);
    }
    assert!(most <= 17, "the table held {most} files");
    assert_table_equals_source(&db, to.path()).await;
    run(&mut stream(&db.url, to.path(), "public.doc", &["--drop"])).ok();
}

/// Merges rewrite files and leave the old ones for readers of older versions: with the
/// default retention (a week) they stay, with `--vacuum-retention 0s` the next run deletes
/// every file the current version does not need, and the table still equals the source;
/// the report counts them. `--vacuum-retention` without a table is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_of_older_versions_are_vacuumed_after_the_retention() {
    let (db, to) = streamed_doc(2_000).await;
    let table = to.path().join("public.doc");
    db.exec("UPDATE doc SET v = v + 1 WHERE id % 10 = 0").await;
    run(&mut stream(&db.url, to.path(), "public.doc", &[])).ok();
    let current = lake::delta_view(&table, None).files;
    assert!(
        parquet_files_in(&table) > current,
        "the merge left no file of the older version: {} files, {current} current",
        parquet_files_in(&table)
    );
    db.exec("UPDATE doc SET note = 'x' WHERE id % 7 = 0").await;
    let report = to.path().join("report.json");
    let done = run(&mut stream(
        &db.url,
        to.path(),
        "public.doc",
        &[
            "--vacuum-retention",
            "0s",
            "--report-json",
            report.to_str().unwrap(),
        ],
    ));
    done.ok();
    let view = lake::delta_view(&table, None);
    assert_eq!(
        parquet_files_in(&table),
        view.files,
        "files no version needs are left"
    );
    assert_table_equals_source(&db, to.path()).await;
    let vacuumed = sluice_testkit::files::json(&report)["table_files_vacuumed"]
        .as_u64()
        .unwrap();
    assert!(vacuumed > 0, "the report counts no vacuumed file");
    assert!(done.stderr.contains("vacuumed"), "{}", done.stderr);
    let refused = run(sluice()
        .args([
            "stream",
            "--source",
            &db.url,
            "--table",
            "public.doc",
            "--to",
        ])
        .arg(tempdir().path())
        .args(["--vacuum-retention", "1h"]));
    refused.refused(2, &["--format delta"]);
    run(&mut stream(&db.url, to.path(), "public.doc", &["--drop"])).ok();
}

/// On S3 (moto): the snapshot's table and each merge's version are committed by conditional
/// put, and the `deltalake` package reads the source's rows back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_on_s3_is_kept_equal_to_the_source() {
    let db = TestDb::new().await;
    create_doc(&db, 3000).await;
    let to = sluice_testkit::objstore::test_url(sluice_testkit::objstore::Store::S3);
    let once = |extra: &[&str]| {
        run(&mut stream_to(
            &db.url,
            &to,
            &["--table", "public.doc"],
            extra,
        ))
    };
    once(&[]).ok();
    db.exec(
        "DELETE FROM doc WHERE id <= 1000; UPDATE doc SET id = id + 10000 WHERE id > 2990;
         INSERT INTO doc SELECT g, 1, 'n', 'x' FROM generate_series(5001, 5100) g;",
    )
    .await;
    once(&[]).ok().says(&["Delta tables: 1 version(s) merged"]);
    let view = lake::delta_view_at(&format!("{to}/public.doc"), None);
    let want: Vec<i64> = db
        .row_strings("SELECT id FROM doc")
        .await
        .iter()
        .map(|s| s.parse().unwrap())
        .collect::<std::collections::BTreeSet<i64>>()
        .into_iter()
        .collect();
    assert_eq!(view.ids, want);
    assert_eq!(view.version, 1);
    once(&["--drop"]).ok();
}

/// A table created on the source that the selection matches joins the stream as a Delta table
/// of its own (its own snapshot, then its merges); one without a primary key is refused when
/// it appears, naming it and the fix, with the tables already kept left as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_created_later_joins_as_a_table_of_its_own() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE a1 (id int PRIMARY KEY, v text); INSERT INTO a1 VALUES (1, 'x');")
        .await;
    let to = tempdir();
    let all = |extra: &[&str]| {
        run(&mut stream_to(
            &db.url,
            to.path(),
            &["--tables", "public.a.*"],
            extra,
        ))
    };
    all(&[]).ok();
    db.exec(
        "CREATE TABLE a2 (id int PRIMARY KEY, v text); INSERT INTO a2 VALUES (1, 'y'), (2, 'z');
         UPDATE a1 SET v = 'w';",
    )
    .await;
    all(&[]).ok();
    db.exec("UPDATE a2 SET v = 'q' WHERE id = 2; INSERT INTO a2 VALUES (3, 'r');")
        .await;
    all(&[]).ok();
    for t in ["a1", "a2"] {
        let want = db.row_strings(&format!("SELECT id, v FROM {t}")).await;
        let got = lake::duckdb_delta_strings(&to.path().join(format!("public.{t}")));
        assert_eq!(got, want, "{t}");
    }
    db.exec("CREATE TABLE a3 (x int, v text); INSERT INTO a3 VALUES (1, 'k');")
        .await;
    all(&[]).refused(2, &["public.a3", "no primary key"]);
    assert!(!to.path().join("public.a3").exists());
    let want = db.row_strings("SELECT id, v FROM a2").await;
    assert_eq!(
        lake::duckdb_delta_strings(&to.path().join("public.a2")),
        want
    );
    all(&["--drop"]).ok();
}

/// A column added on the source stops the stream at the batch that first carries it, naming
/// the column and the way on; the table keeps every change before it and no version is made
/// with it. Run again, it stops the same way (nothing skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_added_on_the_source_stops_the_stream_naming_it() {
    let (db, to) = streamed_doc(50).await;
    db.exec("UPDATE doc SET v = 1 WHERE id <= 10").await;
    run(&mut stream(&db.url, to.path(), "public.doc", &[])).ok();
    let before = db.row_strings(SELECT).await;
    db.exec("ALTER TABLE doc ADD COLUMN extra int; UPDATE doc SET extra = 5 WHERE id = 1;")
        .await;
    for _ in 0..2 {
        run(&mut stream(&db.url, to.path(), "public.doc", &[])).failed(&[
            "public.doc",
            "added: [extra]",
            "--drop",
        ]);
        assert_eq!(
            lake::duckdb_delta_strings(&to.path().join("public.doc")),
            before
        );
    }
    run(&mut stream(&db.url, to.path(), "public.doc", &["--drop"])).ok();
}

/// A partitioned table (its changes published under the root) with a foreign key to a parent
/// whose delete cascades: the Delta table of the root follows rows that move between
/// partitions (a delete and an insert) and the rows the cascade removes (PostgreSQL logs them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_with_a_cascading_parent_is_kept_equal() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE owner (id int PRIMARY KEY);
         INSERT INTO owner SELECT g FROM generate_series(1, 10) g;
         CREATE TABLE ev (id bigint, part int, owner int REFERENCES owner ON DELETE CASCADE,
                          v text, PRIMARY KEY (id, part)) PARTITION BY LIST (part);
         CREATE TABLE ev_1 PARTITION OF ev FOR VALUES IN (1);
         CREATE TABLE ev_2 PARTITION OF ev FOR VALUES IN (2);
         INSERT INTO ev SELECT g, 1 + g % 2, 1 + g % 10, 'v' || g FROM generate_series(1, 300) g;",
    )
    .await;
    let to = tempdir();
    let sql = "SELECT id, part, owner, v FROM ev";
    run(&mut stream(&db.url, to.path(), "public.ev", &[])).ok();
    db.exec(
        "UPDATE ev SET part = 2 WHERE part = 1 AND id <= 40;
         DELETE FROM owner WHERE id = 3;
         UPDATE ev SET v = 'x' WHERE id > 250;",
    )
    .await;
    run(&mut stream(&db.url, to.path(), "public.ev", &[])).ok();
    let want = db.row_strings(sql).await;
    assert!(want.len() < 300, "the cascade removed rows");
    assert_eq!(
        lake::duckdb_delta_strings(&to.path().join("public.ev")),
        want
    );
    run(&mut stream(&db.url, to.path(), "public.ev", &["--drop"])).ok();
}

/// Kills at every commit point of the table path (the snapshot's commit, the change files, the
/// merge's files, the table commit, the confirmation) while a writer changes a partitioned
/// table with large values: updates that leave the large value unchanged (PostgreSQL does not
/// send it), rows moving between partitions (a delete and an insert), inserts and deletes.
/// After the last run the Delta table, read by DuckDB, equals the source table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_table_commit_point_with_large_values_and_partitions() {
    use std::sync::atomic::Ordering;
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE ev (id bigint, part int, v int NOT NULL, big text NOT NULL,
                          PRIMARY KEY (id, part)) PARTITION BY LIST (part);
         CREATE TABLE ev_1 PARTITION OF ev FOR VALUES IN (1);
         CREATE TABLE ev_2 PARTITION OF ev FOR VALUES IN (2);
         INSERT INTO ev SELECT g, 1 + g % 2, 0,
           (SELECT string_agg(md5(g::text || k::text), '') FROM generate_series(1, 200) k)
         FROM generate_series(1, 400) g;",
    )
    .await;
    let client = sluice_testkit::pg::connect(&db.url).await;
    let writer = sluice_testkit::writer::Background::spawn(|stop, commits| async move {
        while !stop.load(Ordering::Relaxed) {
            let n = commits.load(Ordering::Relaxed) as i64;
            let sql = format!(
                "BEGIN;
                 UPDATE ev SET v = v + 1 WHERE id = {a};
                 UPDATE ev SET part = 3 - part WHERE id = {b};
                 INSERT INTO ev VALUES ({new}, 1 + {new} % 2, 0, repeat(md5({new}::text), 100));
                 DELETE FROM ev WHERE id = {c};
                 COMMIT;",
                a = (n * 7) % 400 + 1,
                b = (n * 11) % 400 + 1,
                c = 1_000 + n - 5,
                new = 1_000 + n,
            );
            client
                .batch_execute(&sql)
                .await
                .expect("a writer transaction");
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    let to = tempdir();
    let extra = ["--batch-bytes", "64KB"];
    for spec in lake::TABLE_COMMIT_POINTS {
        writer.wait_for(10).await;
        sluice_testkit::process::run_dying_at(
            &mut stream(&db.url, to.path(), "public.ev", &extra),
            spec,
        );
    }
    writer.stop_after(10).await;
    run(&mut stream(&db.url, to.path(), "public.ev", &extra)).ok();
    let want = db.row_strings("SELECT id, part, v, big FROM ev").await;
    let got = lake::duckdb_delta_strings(&to.path().join("public.ev"));
    assert_eq!(got.len(), want.len(), "rows in the Delta table");
    assert!(got == want, "the Delta table differs from the source");
    run(&mut stream(&db.url, to.path(), "public.ev", &["--drop"])).ok();
}
