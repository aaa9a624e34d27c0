#![allow(clippy::unwrap_used)]
//! Kill a run at named failpoints, then `--resume`, while a writer moves rows between pages,
//! deletes and inserts the whole time; ids are compared exactly. Then what a resume refuses
//! (a different request, named option by option) and what it does when the catalog changed in
//! between.

use crate::common::writer::{Writer, create_table, exported_ids};
use crate::common::*;
use sluice_testkit::process::receipts;
use std::path::Path;

const ROWS: i64 = 150_000;

/// Run an export that dies at `spec` (an `exit` failpoint): nothing complete-looking remains.
fn killed(url: &str, out: &Path, args: &[&str], spec: &str) {
    harness().killed_at(url, out, args, spec);
}

/// `--resume`, stopping right after the new snapshot is planned to read, as the oracle, the ids
/// the table has in that snapshot (the coordinator holds it until the run ends).
async fn resume_with_oracle(db: &TestDb, out: &Path, args: &[&str]) -> (Run, Vec<i64>) {
    let mut all = args.to_vec();
    all.push("--resume");
    let paused = harness()
        .paused_at(&db.url, out, &all, "export.after_plan")
        .await;
    let ids = ids_in_run_snapshot(&db.url, out).await;
    let run = paused.release().await;
    (run, ids)
}

#[tokio::test]
async fn kill_at_failpoints_then_resume_reads_every_row_once_under_writes() {
    let db = TestDb::new().await;
    create_table(&db, "r", ROWS).await;
    let writer = Writer::start(&db.url, "r", ROWS).await;
    let rounds = [
        ("ctid", "export.after_receipt=exit@3"),
        ("ctid", "export.before_commit=exit@5"),
        ("ctid", "export.before_receipt=exit@2"),
        ("key", "export.after_receipt=exit@4"),
        ("key", "export.before_receipt=exit@6"),
        ("key", "export.before_commit=exit@2"),
    ];
    for (i, (chunking, spec)) in rounds.into_iter().enumerate() {
        let what = format!("{chunking}, killed at {spec}");
        let out = tempdir();
        let args = [
            "--table",
            "r",
            "--parallel",
            "2",
            "--chunk-size",
            "1MB",
            "--batch-size",
            "256KB",
            "--chunk-by",
            chunking,
        ];
        let mark = writer.mark();
        killed(&db.url, out.path(), &args, spec);
        let done_before = receipts(out.path());
        if spec.starts_with("export.after_receipt") {
            assert!(
                done_before > 0,
                "{what}: receipts are durable before the kill"
            );
        }
        // What a kill in the middle of a write leaves: hidden temporaries of a receipt and of a
        // part.
        let leftovers = [
            "_sluice/parts/public.r/.part-00099.json.0123456789abcdef.tmp",
            "public.r/.part-00098.parquet.0123456789abcdef.tmp",
        ];
        for f in leftovers {
            std::fs::create_dir_all(out.path().join(f).parent().unwrap()).unwrap();
            std::fs::write(out.path().join(f), b"partial").unwrap();
        }
        if i == 0 {
            let refused = export(&db.url, out.path(), &args);
            refused.refused(2, &["--resume"]);
        }
        // The writer keeps going between the two runs.
        writer.wait_for(20).await;
        let (resumed, oracle) = resume_with_oracle(&db, out.path(), &args).await;
        resumed.ok();
        let changes = writer.since(&mark);

        let mut ids = exported_ids(&out.path().join("public.r"));
        let changed = changes.assert_key_guarantee(&ids, &what);
        let m = files::manifest(out.path());
        let ds = &m["datasets"][0];
        let parts = ds["parts"].as_array().unwrap();
        let from_first = parts.iter().filter(|p| p["snapshot"] == 0).count();
        assert_eq!(m["snapshots"].as_array().unwrap().len(), 2, "{what}");
        if chunking == "ctid" {
            // Page ranges read under two snapshots cannot be trusted: the dataset was read
            // again, whole, under the second, and is exactly the table as of it.
            ids.sort_unstable();
            assert_eq!(
                ids, oracle,
                "{what}: the export is the table as of snapshot 1"
            );
            assert_eq!(from_first, 0, "{what}");
            assert_eq!(ds["guarantee"]["kind"], "snapshot", "{what}");
            assert_eq!(ds["guarantee"]["snapshot"], 1, "{what}");
            // Partly read, it was planned again; not read at all, its plan stood.
            assert_eq!(
                resumed.stderr.contains("read whole under the new snapshot"),
                done_before > 0,
                "{what}: {}",
                resumed.stderr
            );
        } else {
            // Key ranges resume per chunk: the parts of the killed run are kept.
            assert_eq!(from_first, done_before, "{what}");
            if done_before > 0 {
                assert_eq!(ds["guarantee"]["kind"], "key_ranges", "{what}");
                assert_eq!(ds["guarantee"]["key"], serde_json::json!(["id"]), "{what}");
                assert!(
                    resumed.stderr.contains("already done"),
                    "{}",
                    resumed.stderr
                );
            }
        }
        assert!(
            changed > 0 || chunking == "key",
            "{what}: the writer changed nothing read"
        );
        let left: Vec<String> = files_under(out.path())
            .into_iter()
            .filter(|f| f.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{what}: temporaries left: {left:?}");
        let on_disk = files::part_files(&out.path().join("public.r"), "parquet").len();
        assert_eq!(
            on_disk,
            parts.len(),
            "{what}: only the manifest's parts remain"
        );
    }
    let commits = writer.stop().await;
    assert!(commits > 100, "the writer made {commits} transactions");
}

#[tokio::test]
async fn resume_and_reruns_check_the_request_option_by_option() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE t (id int PRIMARY KEY, v text);
         INSERT INTO t SELECT g, CASE WHEN g % 3 = 0 THEN NULL ELSE g::text END
           FROM generate_series(1, 1000) g;
         CREATE TABLE other (id int); INSERT INTO other VALUES (1);",
    )
    .await;
    let out = tempdir();
    let args = ["--table", "t", "--format", "csv", "--csv-null", "NULL"];
    killed(&db.url, out.path(), &args, "export.after_plan=exit");
    let run = export(
        &db.url,
        out.path(),
        &words("--table t --format csv --csv-null \\N --consistency chunk --resume"),
    );
    run.refused(
        2,
        &[
            "same request",
            r#"--csv-null: "NULL" → "\\N""#,
            r#"--consistency: "snapshot" → "chunk""#,
        ],
    );
    let mut resume = args.to_vec();
    resume.push("--resume");
    export(&db.url, out.path(), &resume).ok();
    let m = files::manifest(out.path());
    assert_eq!(m["request"]["csv_null"], "NULL");
    assert_eq!(m["request"]["tables"], serde_json::json!(["t"]));
    assert_eq!(m["datasets"][0]["rows"], 1000);

    // The same request on the complete output: nothing to do.
    let again = export(&db.url, out.path(), &resume);
    again.ok();
    assert!(again.stderr.contains("nothing to do"), "{}", again.stderr);
    // A cron job that added a table must not be told all is done.
    let mut more = resume.clone();
    more.extend(["--table", "other"]);
    let run = export(&db.url, out.path(), &more);
    run.refused(2, &[r#"--table: ["t"] → ["t","other"]"#]);
    // A plain run is refused either way, and says why.
    let run = export(&db.url, out.path(), &["--table", "t"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--overwrite"), "{}", run.stderr);
    assert!(run.stderr.contains("format"), "{}", run.stderr);
    // --overwrite starts over and replaces the old parts.
    export(&db.url, out.path(), &["--table", "other", "--overwrite"]).ok();
    let m = files::manifest(out.path());
    assert_eq!(m["datasets"].as_array().unwrap().len(), 1);
    assert_eq!(m["datasets"][0]["name"], "public.other");
    assert!(
        !out.path().join("public.t").exists()
            || files_under(&out.path().join("public.t")).is_empty(),
        "old parts removed"
    );
}

#[tokio::test]
async fn resume_after_the_catalog_changed() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE pat_big (id int PRIMARY KEY, v text);
         INSERT INTO pat_big SELECT g, md5(g::text) FROM generate_series(1, 500) g;
         CREATE TABLE pat_small (id int); INSERT INTO pat_small VALUES (1), (2), (3);
         CREATE TABLE pt (k int NOT NULL, v text) PARTITION BY RANGE (k);
         CREATE TABLE pt1 PARTITION OF pt FOR VALUES FROM (0) TO (100);
         CREATE TABLE pt2 PARTITION OF pt FOR VALUES FROM (100) TO (200);
         INSERT INTO pt SELECT g, 'x' FROM generate_series(0, 199, 10) g;
         CREATE TABLE pt3 (k int NOT NULL, v text);
         INSERT INTO pt3 SELECT g, 'y' FROM generate_series(200, 204) g;",
    )
    .await;
    let args = ["--tables", r"public\.(pat_.*|pt)"];

    // Nothing read yet; then a table starts matching and a partition is attached.
    let out = tempdir();
    killed(&db.url, out.path(), &args, "export.after_plan=exit");
    db.exec(
        "CREATE TABLE pat_new (id int); INSERT INTO pat_new VALUES (7), (8);
         ALTER TABLE pt ATTACH PARTITION pt3 FOR VALUES FROM (200) TO (300);",
    )
    .await;
    let mut resume = args.to_vec();
    resume.push("--resume");
    let run = export(&db.url, out.path(), &resume);
    run.ok();
    assert_eq!(
        files::manifest_rows(out.path()),
        [
            ("public.pat_big".to_string(), 500),
            ("public.pat_small".to_string(), 3),
            ("public.pt".to_string(), 25),
            ("public.pat_new".to_string(), 2),
        ],
        "the new table is exported and the attached partition read"
    );
    assert!(
        run.stderr.contains("public.pat_new was read whole") && run.stderr.contains("is new"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("partitions changed"), "{}", run.stderr);

    // Everything read, the manifest not yet written; then a table is dropped, a partition
    // detached, a column added: complete datasets are kept as they were read.
    let out = tempdir();
    killed(&db.url, out.path(), &args, "export.before_manifest=exit");
    db.exec(
        "DROP TABLE pat_small;
         ALTER TABLE pt DETACH PARTITION pt3;
         ALTER TABLE pat_big ADD COLUMN extra int;",
    )
    .await;
    let run = export(&db.url, out.path(), &resume);
    run.ok();
    assert_eq!(
        files::manifest_rows(out.path()),
        [
            ("public.pat_big".to_string(), 500),
            ("public.pat_new".to_string(), 2),
            ("public.pat_small".to_string(), 3),
            ("public.pt".to_string(), 25),
        ]
    );
    assert!(
        run.stderr
            .contains("public.pat_small is no longer in the source"),
        "{}",
        run.stderr
    );
    let m = files::manifest(out.path());
    assert_eq!(
        m["datasets"][0]["columns"].as_array().unwrap().len(),
        2,
        "pat_big as it was read"
    );

    // Nothing read yet; then a selected table is dropped: the resume cannot finish it.
    let out = tempdir();
    killed(&db.url, out.path(), &args, "export.after_plan=exit");
    db.exec("DROP TABLE pat_new").await;
    let run = export(&db.url, out.path(), &resume);
    run.refused(2, &["cannot finish public.pat_new", "--overwrite"]);
}
