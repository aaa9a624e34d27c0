#![allow(clippy::unwrap_used)]
//! Identifiers are always quoted: odd and mixed-case names export exactly.

use crate::common::*;

#[tokio::test]
async fn weird_and_mixed_case_names_export() {
    let db = TestDb::new().await;
    db.exec(
        r#"CREATE SCHEMA "My Schema";
           CREATE TABLE public."weird ""name""" ("a ""col""" int PRIMARY KEY, "Select" text);
           INSERT INTO public."weird ""name""" VALUES (1, 'x'), (2, 'y');
           CREATE TABLE "My Schema"."MixedCase" (id int PRIMARY KEY, "Value" text);
           INSERT INTO "My Schema"."MixedCase" SELECT g, g::text FROM generate_series(1, 50) g;
           CREATE TABLE public.lower_only (id int); INSERT INTO lower_only VALUES (7);"#,
    )
    .await;
    // Names as a user types them: quoted where they need it, any case where they do not.
    let tables = [
        "--table",
        r#"public."weird ""name""""#,
        "--table",
        r#""My Schema"."MixedCase""#,
        "--table",
        "PUBLIC.Lower_Only",
        "--chunk-by",
        "key",
    ];
    let out = tempdir();
    export(&db.url, out.path(), &tables).ok();
    let m = files::manifest(out.path());
    let names: Vec<&str> = m["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            // A part with a dot or a quote is quoted in the dataset name, so that names stay
            // distinct (see the dots case below); plain names stay plain.
            r#"public."weird ""name""""#,
            "My Schema.MixedCase",
            "public.lower_only"
        ]
    );
    let rows: Vec<u64> = m["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["rows"].as_u64().unwrap())
        .collect();
    assert_eq!(rows, [2, 50, 1]);
    let weird = files::dataset_batches(&out.path().join(r#"public."weird ""name""""#));
    assert_eq!(weird[0].schema().field(0).name(), r#"a "col""#);
    // A bare name matches case-insensitively; a quoted one exactly.
    let out2 = tempdir();
    export(
        &db.url,
        out2.path(),
        &["--table", r#""My Schema".mixedcase"#],
    )
    .ok();
    let out4 = tempdir();
    let run = export(
        &db.url,
        out4.path(),
        &["--table", r#""my schema".mixedcase"#],
    );
    assert_eq!(
        run.code, 2,
        "a quoted schema matches exactly: {}",
        run.stderr
    );
    let out3 = tempdir();
    let run = export(
        &db.url,
        out3.path(),
        &["--table", r#""My Schema"."mixedcase""#],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
}

/// `"a.b".c` and `a."b.c"` are different tables; their datasets must not share a name (and a
/// directory).
#[tokio::test]
async fn names_with_dots_do_not_collide() {
    let db = TestDb::new().await;
    db.exec(
        r#"CREATE SCHEMA "a.b"; CREATE SCHEMA a;
           CREATE TABLE "a.b".c (id int); INSERT INTO "a.b".c VALUES (1);
           CREATE TABLE a."b.c" (id int); INSERT INTO a."b.c" VALUES (2), (3);"#,
    )
    .await;
    let out = tempdir();
    export(
        &db.url,
        out.path(),
        &["--table", r#""a.b".c"#, "--table", r#"a."b.c""#],
    )
    .ok();
    assert_datasets(
        out.path(),
        &[(r#""a.b".c"#.to_string(), 1), (r#"a."b.c""#.to_string(), 2)],
    );
}

/// The manifest lists exactly `want` (dataset name, rows), in order, and each dataset's
/// directory, named after it, holds its rows.
fn assert_datasets(out: &std::path::Path, want: &[(String, u64)]) {
    let got = files::manifest_rows(out);
    assert_eq!(got, want);
    for (dir, rows) in want {
        let batches = files::dataset_batches(&out.join(dir));
        assert_eq!(
            batches.iter().map(|b| b.num_rows() as u64).sum::<u64>(),
            *rows,
            "{dir}"
        );
    }
}

/// The same on MariaDB, whose databases play the part of schemas: database `D` with table
/// `b.c` and database `D.b` with table `c` are different tables, and so are `T` and `t` on a
/// server with case-sensitive table names; no two of them may share a dataset name.
#[tokio::test]
async fn mysql_names_with_dots_and_case_do_not_collide() {
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    let (d, other) = (db.name.clone(), format!("{}.b", db.name));
    db.exec(&format!(
        "CREATE TABLE `b.c` (id int); INSERT INTO `b.c` VALUES (1);
         CREATE DATABASE `{other}`;
         CREATE TABLE `{other}`.c (id int); INSERT INTO `{other}`.c VALUES (2), (3);
         CREATE TABLE `T` (id int); INSERT INTO `T` VALUES (4), (5), (6);
         CREATE TABLE t (id int); INSERT INTO t VALUES (7), (8), (9), (10);"
    ))
    .await;
    let case_sensitive = db.scalar("SELECT @@lower_case_table_names").await;
    assert_eq!(
        case_sensitive.as_deref(),
        Some("0"),
        "the test server folds table names"
    );
    let out = tempdir();
    let (dotted, schema_dotted) = (format!("{d}.\"b.c\""), format!("\"{other}\".c"));
    let (upper, lower) = (format!("{d}.\"T\""), format!("{d}.\"t\""));
    let run = export(
        &db.url,
        out.path(),
        &[
            "--table",
            &dotted,
            "--table",
            &schema_dotted,
            "--table",
            &upper,
            "--table",
            &lower,
        ],
    );
    db.exec(&format!("DROP DATABASE `{other}`")).await;
    run.ok();
    assert_datasets(
        out.path(),
        &[
            (format!("{d}.\"b.c\""), 1),
            (format!("\"{other}\".c"), 2),
            (format!("{d}.T"), 3),
            (format!("{d}.t"), 4),
        ],
    );
}
