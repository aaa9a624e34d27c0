//! `sluice export --format delta`: each dataset a Delta Lake table, read back by readers
//! sluice did not write — DuckDB's delta extension (Delta Kernel) for the values, the
//! `deltalake` Python package for versions, history and time travel. Kills at the table
//! commit's failpoints while a writer changes the table, `--resume`, `--overwrite` as one
//! new version, and what is refused before anything is read.

use crate::common::writer::{Writer, create_table};
use crate::common::*;
use sluice_testkit::lake;
use sluice_testkit::process::Failpoints;
use std::path::Path;
use std::process::Stdio;

const ROWS: i64 = 60_000;

/// Every type of the PostgreSQL type table: DuckDB reads the Delta table's values as it reads
/// the Parquet export of the same rows (the two exports' text forms compared column by
/// column); the columns Delta has no type for are the ones the report names.
#[tokio::test]
async fn every_type_reads_back_from_the_table_as_from_the_parquet_export() {
    let (db, _cols) = crate::types::setup().await;
    let out = tempdir();
    let pq = out.path().join("pq");
    let dl = out.path().join("delta");
    export(&db.url, &pq, &["--table", "public.all_types"]).ok();
    let report = out.path().join("report.json");
    let run = export(
        &db.url,
        &dl,
        &with_report("--table public.all_types --format delta", &report),
    );
    run.ok();
    let notes = files::json(&report)["notes"].to_string();
    let table = lake::duckdb_delta(&dl.join("public.all_types"));
    let parquet = lake::duckdb_parquet(&pq.join("public.all_types/*.parquet"));
    assert_eq!(table.columns, parquet.columns);
    assert_eq!(table.rows.len(), 6);
    let mut differing = Vec::new();
    for (c, name) in table.columns.iter().enumerate() {
        let a: Vec<&Option<String>> = table.rows.iter().map(|r| &r[c]).collect();
        let b: Vec<&Option<String>> = parquet.rows.iter().map(|r| &r[c]).collect();
        if a != b {
            differing.push(name.clone());
            // A column whose form changed must be one the report says was converted.
            assert!(
                notes.contains(&format!("public.all_types.{name}:")),
                "{name}: table {a:?} vs parquet {b:?}, not named in the notes {notes}"
            );
        }
    }
    // Types Delta lacks are named; the rest kept their DuckDB type.
    for (c, name) in table.columns.iter().enumerate() {
        if !notes.contains(&format!("public.all_types.{name}:")) {
            assert_eq!(
                table.types[c], parquet.types[c],
                "{name}: a type Delta has changed without a note"
            );
        }
    }
    let view = lake::delta_view(&dl.join("public.all_types"), None);
    assert_eq!(view.ids, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(view.version, 0);
    eprintln!("columns in another form in the table: {differing:?}");
}

/// Start an export armed with `spec` plus a pause after planning; returns the ids of the
/// snapshot it reads (the oracle, read while it is paused) and the finished run.
async fn export_with_oracle(db: &TestDb, out: &Path, args: &[&str], spec: &str) -> (Run, Vec<i64>) {
    let fp = Failpoints::new();
    let mut cmd = sluice();
    cmd.arg("export")
        .arg("--source")
        .arg(&db.url)
        .arg("--to")
        .arg(out)
        .args(args);
    let armed = if spec.is_empty() {
        "export.after_plan=wait@1".to_string()
    } else {
        format!("export.after_plan=wait@1,{spec}")
    };
    fp.arm(&mut cmd, &armed);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    fp.reached("export.after_plan", &mut child).await;
    let ids = ids_in_run_snapshot(&db.url, out).await;
    fp.release("export.after_plan");
    let run = tokio::task::spawn_blocking(move || finish(child).into())
        .await
        .unwrap();
    (run, ids)
}

fn duckdb_ids(table: &Path) -> Vec<i64> {
    let mut ids: Vec<i64> = lake::duckdb_delta(table)
        .rows
        .iter()
        .map(|r| r[0].as_deref().unwrap().parse().unwrap())
        .collect();
    ids.sort_unstable();
    ids
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
    assert_eq!(duckdb_ids(&table_of(out.path())), oracle);
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
    assert_eq!(duckdb_ids(&table_of(out.path())), oracle3);
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
    run_export_to(&db.url, &to, &args).ok();
    let table = format!("{to}/public.r");
    let v = lake::delta_view_at(&table, None);
    let want: Vec<i64> = (1..=5_000).collect();
    assert_eq!((v.version, v.ids.clone()), (0, want));
    assert!(v.files >= 2, "{} files", v.files);
    db.exec("DELETE FROM r WHERE id <= 1000").await;
    let mut over = args.clone();
    over.push("--overwrite");
    run_export_to(&db.url, &to, &over).ok();
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
    let run = run_export_to(
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
    let run = sluice_testkit::process::run(
        sluice()
            .args(["stream", "--source", &db.url, "--to"])
            .arg(out.path())
            .args(words("--table odd --format delta")),
    );
    // A stream into a table refuses it before its slot or snapshot is made.
    run.refused(2, &["\"a b\"", "--format parquet"]);
    let slots = db
        .row_strings(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()",
        )
        .await;
    assert!(slots.is_empty(), "{slots:?}");
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

fn run_export_to(url: &str, to: &str, args: &[&str]) -> Run {
    sluice_testkit::process::run(
        sluice()
            .args(["export", "--source", url, "--to", to])
            .args(args),
    )
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
