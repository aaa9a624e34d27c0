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
    let out = tempdir();
    export(
        &db.url,
        out.path(),
        &[
            "--table",
            r#"public."weird ""name""""#,
            "--table",
            r#""My Schema"."MixedCase""#,
            "--table",
            "PUBLIC.Lower_Only",
            "--chunk-by",
            "key",
        ],
    )
    .ok();
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
    let m = files::manifest(out.path());
    let got: Vec<(String, u64)> = m["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_string(),
                d["rows"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [(r#""a.b".c"#.to_string(), 1), (r#"a."b.c""#.to_string(), 2)]
    );
    for (dir, rows) in [(r#""a.b".c"#, 1), (r#"a."b.c""#, 2)] {
        let batches = files::dataset_batches(&out.path().join(dir));
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), rows);
    }
}
