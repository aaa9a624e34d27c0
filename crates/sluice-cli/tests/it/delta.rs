//! `sluice export --format delta`: each dataset a Delta Lake table, read back by readers
//! sluice did not write — DuckDB's delta extension (Delta Kernel) for the values, the
//! `deltalake` Python package for versions, history and time travel. Kills at the table
//! commit's failpoints while a writer changes the table, `--resume`, `--overwrite` as one
//! new version, and what is refused before anything is read.

use crate::common::writer::{Writer, create_table};
use crate::common::*;
use sluice_testkit::lake;
use std::path::Path;

const ROWS: i64 = 60_000;

/// Every type of the PostgreSQL type table: DuckDB reads the Delta table's values as it reads
/// the Parquet export of the same rows (the two exports' text forms compared column by
/// column); the columns Delta has no type for are the ones the report names.
#[tokio::test]
async fn every_type_reads_back_from_the_table_as_from_the_parquet_export() {
    let out = tempdir();
    let (notes, parquet) = all_types_as_table(out.path(), "--format delta").await;
    let dl = out.path().join("table");
    let table = lake::duckdb_delta(&dl.join("public.all_types"));
    assert_eq!(table.rows.len(), 6);
    let differing = table.differing_from(&parquet, &notes, "public.all_types");
    let view = lake::delta_view(&dl.join("public.all_types"), None);
    assert_eq!(view.ids, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(view.version, 0);
    eprintln!("columns in another form in the table: {differing:?}");
}

/// Killed just before and just after the table commit while a writer moves rows: before, the
/// directory is no table yet (no log) and `--resume` commits it; after, `--resume` finds the
/// commit by the export's id and makes no second version. Then `--overwrite` replaces the
/// table in one new version, the earlier version still readable (time travel). Each version
/// holds exactly the ids of the snapshot its export read, once each.
#[tokio::test]
async fn killed_at_the_commit_resumed_and_overwritten_the_table_is_the_snapshot() {
    let db = TestDb::new().await;
    create_table(&db, "r", ROWS).await;
    let writer = Writer::start(&db.url, "r", ROWS).await;
    let args = words("--table r --format delta --parallel 2 --chunk-size 1MB --batch-size 256KB");
    let table_of = |out: &Path| out.join("public.r");

    // Killed before the commit: parts on disk, no table, no manifest.
    let out = tempdir();
    let (run, oracle) =
        export_with_oracle(&db, out.path(), &args, "export.before_table_commit=exit").await;
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(!out.path().join("manifest.json").exists());
    assert!(!table_of(out.path()).join("_delta_log").exists());
    let mut resume = args.clone();
    resume.push("--resume");
    export(&db.url, out.path(), &resume).ok();
    assert_eq!(lake::duckdb_delta(&table_of(out.path())).ids(), oracle);
    let v = lake::delta_view(&table_of(out.path()), None);
    assert_eq!((v.version, v.ids.clone()), (0, oracle.clone()));
    let info = &v.history[0];
    assert!(
        info["sluice.source.position"]
            .as_str()
            .is_some_and(|p| !p.is_empty()),
        "no source position in the commit: {info}"
    );
    assert_eq!(info["sluice.consistency"], "snapshot");
    writer.wait_for(50).await;

    // Killed after the commit: the resume makes no second version.
    let out2 = tempdir();
    let (run, oracle2) =
        export_with_oracle(&db, out2.path(), &args, "export.after_table_commit=exit").await;
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(!out2.path().join("manifest.json").exists());
    export(&db.url, out2.path(), &resume).ok();
    let v = lake::delta_view(&table_of(out2.path()), None);
    assert_eq!(v.version, 0, "a second commit for one export");
    assert_eq!(v.ids, oracle2);
    assert!(
        files::manifest(out2.path())["datasets"][0]["rows"].as_u64() == Some(oracle2.len() as u64)
    );

    // A plain rerun is refused; --overwrite is one new version replacing every file.
    let again = export(&db.url, out.path(), &args);
    again.refused(2, &["--overwrite"]);
    writer.wait_for(50).await;
    let mut over = args.clone();
    over.push("--overwrite");
    let (run, oracle3) = export_with_oracle(&db, out.path(), &over, "").await;
    run.ok();
    assert_ne!(oracle3, oracle, "the writer changed nothing in between");
    let v1 = lake::delta_view(&table_of(out.path()), None);
    assert_eq!((v1.version, v1.ids.clone()), (1, oracle3.clone()));
    assert_eq!(lake::duckdb_delta(&table_of(out.path())).ids(), oracle3);
    let v0 = lake::delta_view(&table_of(out.path()), Some(0));
    assert_eq!(
        v0.ids, oracle,
        "version 0 is no longer what the first export committed"
    );
    writer.stop().await;
}

/// On S3 (moto): the table is committed by conditional put next to its parts, reads back
/// through the `deltalake` package, and `--overwrite` is one new version.
#[tokio::test]
async fn a_table_on_s3_reads_back_and_is_replaced_in_one_version() {
    let db = TestDb::new().await;
    create_table(&db, "r", 5_000).await;
    let to = sluice_testkit::objstore::test_url(sluice_testkit::objstore::Store::S3);
    let args = words("--table r --format delta --parallel 2 --chunk-size 256KB");
    export_at(&db.url, &to, &args).ok();
    let table = format!("{to}/public.r");
    let v = lake::delta_view_at(&table, None);
    let want: Vec<i64> = (1..=5_000).collect();
    assert_eq!((v.version, v.ids.clone()), (0, want));
    assert!(v.files >= 2, "{} files", v.files);
    db.exec("DELETE FROM r WHERE id <= 1000").await;
    let mut over = args.clone();
    over.push("--overwrite");
    export_at(&db.url, &to, &over).ok();
    let v = lake::delta_view_at(&table, None);
    assert_eq!(v.version, 1);
    assert_eq!(v.ids, (1001..=5_000).collect::<Vec<i64>>());
    assert_eq!(lake::delta_view_at(&table, Some(0)).ids.len(), 5_000);
}

/// Refused before the source is read, exit 2, nothing written: a column name Delta cannot
/// hold, an object store, `--merge`; a stream into a table with such a column, before its slot.
#[tokio::test]
async fn what_a_delta_table_cannot_take_is_refused_with_the_fix() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE odd (id int PRIMARY KEY, \"a b\" text); INSERT INTO odd VALUES (1, 'x')")
        .await;
    let out = tempdir();
    let run = export(&db.url, out.path(), &words("--table odd --format delta"));
    run.refused(2, &["\"a b\"", "--query"]);
    assert!(
        !out.path().join("public.odd").exists(),
        "{:?}",
        files_under(out.path())
    );
    // `sluice plan` says the same, reading no row.
    let plan = sluice_testkit::process::run(
        sluice()
            .args(["plan", "--source", &db.url])
            .args(words("--table odd --format delta")),
    );
    assert!(
        plan.stdout.contains("an export would refuse to start") && plan.stdout.contains("\"a b\""),
        "{}{}",
        plan.stdout,
        plan.stderr
    );
    let run = export_at(
        &db.url,
        "gs://bucket/x",
        &words("--table odd --format delta"),
    );
    run.refused(2, &["local --to or s3://"]);
    let run = export(
        &db.url,
        out.path(),
        &words("--table odd --format delta --merge"),
    );
    run.refused(2, &["drop --merge"]);
    // A stream into a table refuses it before its slot or snapshot is made.
    stream_refused_before_its_slot(
        &db,
        out.path(),
        "--table odd --format delta",
        &["\"a b\"", "--format parquet"],
    )
    .await;
}

/// A table another writer partitioned is not replaced by `--overwrite` (its readers could not
/// read unpartitioned parts added to it): exit 2 naming the partition column, the table
/// unchanged.
#[tokio::test]
async fn a_partitioned_table_is_not_replaced() {
    let db = TestDb::new().await;
    create_table(&db, "r", 100).await;
    let out = tempdir();
    let table = out.path().join("public.r");
    let made = std::process::Command::new(lake::python())
        .arg("-c")
        .arg(
            "import sys, pyarrow as pa; from deltalake import write_deltalake; \
             write_deltalake(sys.argv[1], pa.table({'id': [7], 'v': [1]}), partition_by=['v'])",
        )
        .arg(&table)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let run = export(
        &db.url,
        out.path(),
        &words("--table r --format delta --overwrite"),
    );
    run.refused(2, &["partitioned by (v)"]);
    let v = lake::delta_view(&table, None);
    assert_eq!((v.version, v.ids), (0, vec![7]));
}

/// `sluice doctor --to … --format delta`: a probe table is made and committed, a conditional
/// put is refused the second time, and the probe leaves nothing behind — in a local directory
/// and on S3 (moto); an object store the Delta commit does not reach fails the check.
#[tokio::test]
async fn doctor_checks_that_a_delta_table_can_be_committed_at_the_output() {
    let out = tempdir();
    let s3 = sluice_testkit::objstore::test_url(sluice_testkit::objstore::Store::S3);
    let local = out.path().to_str().unwrap().to_string();
    for to in [&local, &s3] {
        let run = sluice_testkit::process::run(
            sluice().args(["doctor", "--to", to, "--format", "delta"]),
        );
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        assert!(
            run.stdout
                .contains("--format delta: Delta tables can be created and committed")
                && run
                    .stdout
                    .contains("a second writer of one commit is refused"),
            "{}",
            run.stdout
        );
    }
    let left: Vec<String> = files_under(out.path())
        .into_iter()
        .filter(|f| f.contains("doctor"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!out.path().join("_sluice").read_dir().unwrap().any(|_| true));
    let run = sluice_testkit::process::run(sluice().args([
        "doctor",
        "--to",
        "gs://bucket/x",
        "--format",
        "delta",
    ]));
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stdout
            .contains("FAIL  --to gs://bucket/x --format delta")
            && run.stdout.contains("local --to or s3://"),
        "{}",
        run.stdout
    );
}
