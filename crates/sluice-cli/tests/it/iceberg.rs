//! `sluice export --format iceberg`: each dataset an Apache Iceberg table in an SQL catalog,
//! read back by readers sluice did not write — PyIceberg through the same catalog (SQLite
//! file, or the test kit's PostgreSQL) for snapshots, summaries and identifier fields, and
//! DuckDB's iceberg extension for the values. Kills at the table commit's failpoints while a
//! writer changes the table, `--resume`, `--overwrite`, and what is refused before anything is
//! read.

use crate::common::writer::{Writer, create_table};
use crate::common::*;
use sluice_testkit::lake;
use std::path::Path;

const ROWS: i64 = 60_000;

/// The SQLite catalog an export into `out` makes without `--catalog`.
fn default_catalog(out: &Path) -> String {
    format!("sqlite://{}", out.join("catalog.db").display())
}

/// Every type of the PostgreSQL type table: DuckDB reads the Iceberg table's values as it
/// reads the Parquet export of the same rows (the two exports' text forms compared column by
/// column); the columns whose form changed are the ones the report names. PyIceberg finds
/// the table in the catalog with the key as identifier field and the source position in the
/// snapshot's summary.
#[tokio::test]
async fn every_type_reads_back_from_the_table_as_from_the_parquet_export() {
    let out = tempdir();
    let (notes, parquet) =
        all_types_as_table(out.path(), "--format iceberg --namespace lake").await;
    let catalog = default_catalog(&out.path().join("table"));
    let table = lake::duckdb_iceberg(&catalog, "lake.all_types");
    assert_eq!(table.rows.len(), 6);
    let differing = table.differing_from(&parquet, &notes, "public.all_types");
    let view = lake::iceberg_view(&catalog, "lake.all_types");
    assert_eq!(view.ids, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(view.snapshots, 1);
    assert_eq!(view.identifier, vec!["id".to_string()]);
    assert!(
        view.location.ends_with("/public.all_types"),
        "{}",
        view.location
    );
    assert!(
        view.summary["sluice.source.position"]
            .as_str()
            .is_some_and(|p| !p.is_empty()),
        "no source position in the snapshot: {}",
        view.summary
    );
    eprintln!("columns in another form in the table: {differing:?}");
}

/// Killed just before and just after the table commit while a writer moves rows: before, the
/// catalog has no table and `--resume` commits it; after, `--resume` finds the snapshot by the
/// export's id and makes no second one. Then `--overwrite` replaces the table's contents.
/// Each time the table holds exactly the ids of the snapshot its export read, once each, as
/// both readers see it. The catalog is the test kit's PostgreSQL (the SQL catalog's other
/// driver).
#[tokio::test]
async fn killed_at_the_commit_resumed_and_overwritten_the_table_is_the_snapshot() {
    let db = TestDb::new().await;
    let catalog_db = TestDb::new().await;
    create_table(&db, "r", ROWS).await;
    let writer = Writer::start(&db.url, "r", ROWS).await;
    let catalog = catalog_db.url.clone();
    let mut args = words(
        "--table r --format iceberg --namespace lake --parallel 2 --chunk-size 1MB \
         --batch-size 256KB --catalog",
    );
    args.push(&catalog);

    // Killed before the commit: parts on disk, no table in the catalog, no manifest.
    let out = tempdir();
    let (run, oracle) =
        export_with_oracle(&db, out.path(), &args, "export.before_table_commit=exit").await;
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(!out.path().join("manifest.json").exists());
    let tables = catalog_db
        .row_strings("SELECT table_name FROM iceberg_tables")
        .await;
    assert!(tables.is_empty(), "{tables:?}");
    let mut resume = args.clone();
    resume.push("--resume");
    export(&db.url, out.path(), &resume).ok();
    assert_eq!(lake::duckdb_iceberg(&catalog, "lake.r").ids(), oracle);
    let v = lake::iceberg_view(&catalog, "lake.r");
    assert_eq!((v.snapshots, v.ids.clone()), (1, oracle.clone()));
    // The resumed run read no chunk, and its table still has the key as identifier field.
    assert_eq!(v.identifier, vec!["id".to_string()]);
    assert!(v.files >= 2, "{} files", v.files);
    assert_eq!(v.summary["sluice.consistency"], "snapshot");
    writer.wait_for(50).await;

    // Killed after the commit: the resume makes no second snapshot.
    let out2 = tempdir();
    let mut args2 = args.clone();
    args2[5] = "lake2";
    let (run, oracle2) =
        export_with_oracle(&db, out2.path(), &args2, "export.after_table_commit=exit").await;
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(!out2.path().join("manifest.json").exists());
    let mut resume2 = args2.clone();
    resume2.push("--resume");
    export(&db.url, out2.path(), &resume2).ok();
    let v = lake::iceberg_view(&catalog, "lake2.r");
    assert_eq!(v.snapshots, 1, "a second snapshot for one export");
    assert_eq!(v.ids, oracle2);

    // A plain rerun is refused; --overwrite replaces the contents.
    export(&db.url, out.path(), &args).refused(2, &["--overwrite"]);
    writer.wait_for(50).await;
    let mut over = args.clone();
    over.push("--overwrite");
    let (run, oracle3) = export_with_oracle(&db, out.path(), &over, "").await;
    run.ok();
    assert_ne!(oracle3, oracle, "the writer changed nothing in between");
    let v = lake::iceberg_view(&catalog, "lake.r");
    assert_eq!(v.ids, oracle3);
    assert_eq!(lake::duckdb_iceberg(&catalog, "lake.r").ids(), oracle3);
    let on_disk = parquet_files_in(&out.path().join("public.r"));
    assert_eq!(
        on_disk, v.files,
        "the replaced export's parts are left on disk"
    );
    writer.stop().await;
}

/// A key-range export's parts each hold one range of ids, and the data files' column bounds
/// say so: PyIceberg's scan for low ids reads one file of many, and DuckDB reads every row.
#[tokio::test]
async fn column_bounds_let_readers_skip_files() {
    let db = TestDb::new().await;
    create_table(&db, "r", 20_000).await;
    let out = tempdir();
    let args = "--table r --format iceberg --namespace lake --chunk-by key --chunk-size 256KB";
    export(&db.url, out.path(), &words(args)).ok();
    let catalog = default_catalog(out.path());
    let v = lake::iceberg_view(&catalog, "lake.r");
    assert!(v.files >= 4, "{} files", v.files);
    assert_eq!(v.files_low_ids, 1, "of {} files", v.files);
    assert_eq!(v.ids, (1..=20_000).collect::<Vec<i64>>());
    assert_eq!(lake::duckdb_iceberg(&catalog, "lake.r").ids(), v.ids);
}

/// Refused before the source is read, exit 2, nothing written: no namespace, two datasets that
/// would be one table, a catalog that is not an SQL one, an object store, `--merge`, catalog flags without the format, a stream into
/// an Iceberg table (before its slot); and a table of that name the catalog keeps elsewhere is
/// never replaced.
#[tokio::test]
async fn what_an_iceberg_table_cannot_take_is_refused_with_the_fix() {
    let db = TestDb::new().await;
    create_table(&db, "t", 100).await;
    let out = tempdir();
    let refused = |args: &str, words_: &[&str]| {
        export(&db.url, out.path(), &words(args)).refused(2, words_);
        assert!(
            !out.path().join("public.t").exists(),
            "{:?}",
            files_under(out.path())
        );
    };
    refused("--table t --format iceberg", &["--namespace"]);
    db.exec("CREATE SCHEMA s2; CREATE TABLE s2.t (id int PRIMARY KEY)")
        .await;
    refused(
        "--table t --table s2.t --format iceberg --namespace n",
        &["public.t", "s2.t", "--namespace"],
    );
    refused(
        "--table t --format iceberg --namespace n --catalog thrift://hms:9083",
        &["sqlite:///", "postgres://"],
    );
    refused(
        "--table t --format iceberg --namespace n --merge",
        &["drop --merge"],
    );
    refused("--table t --namespace n", &["--format iceberg"]);
    export_at(
        &db.url,
        "s3://bucket/x",
        &words("--table t --format iceberg --namespace n"),
    )
    .refused(2, &["local --to", "--format delta"]);
    stream_refused_before_its_slot(
        &db,
        out.path(),
        "--table t --format iceberg --namespace n",
        &["--format delta", "appends only"],
    )
    .await;

    // A table `n.t` made by another export at another location: not replaced.
    let other = tempdir();
    let catalog = default_catalog(out.path());
    let mut args = words("--table t --format iceberg --namespace n --catalog");
    args.push(&catalog);
    export(&db.url, other.path(), &args).ok();
    let run = export(&db.url, out.path(), &args);
    run.refused(2, &["lives at", "--namespace"]);
    let v = lake::iceberg_view(&catalog, "n.t");
    assert!(
        v.location
            .starts_with(&format!("file://{}", other.path().display()))
    );
    assert_eq!(v.ids.len(), 100);
}

/// `sluice doctor --format iceberg` opens the catalog and says what its namespace holds; a
/// catalog it cannot use fails the check with the fix.
#[tokio::test]
async fn doctor_checks_the_iceberg_catalog() {
    let out = tempdir();
    let to = out.path().to_str().unwrap();
    let doctor = |extra: &[&str]| {
        sluice_testkit::process::run(
            sluice()
                .args([
                    "doctor",
                    "--to",
                    to,
                    "--format",
                    "iceberg",
                    "--namespace",
                    "lake",
                ])
                .args(extra),
        )
    };
    let run = doctor(&[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("namespace lake holds 0 table(s)"),
        "{}",
        run.stdout
    );
    let run = doctor(&["--catalog", "mysql://x@127.0.0.1/db"]);
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stdout.contains("FAIL") && run.stdout.contains("sqlite:///"),
        "{}",
        run.stdout
    );
}
