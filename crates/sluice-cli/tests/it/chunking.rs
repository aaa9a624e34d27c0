#![allow(clippy::unwrap_used)]
//! Every chunking strategy yields exactly the table's rows, once each; many tables share one
//! queue; --merge writes one file per dataset; `sluice plan` describes all of it.

use crate::common::*;
use std::path::Path;

fn exported_rows(dir: &Path) -> Vec<String> {
    files::row_strings(&files::dataset_batches(dir))
}

fn part_count(out: &Path, dataset: &str) -> usize {
    files::part_files(&out.join(dataset), "parquet").len()
}

async fn check(db: &TestDb, table: &str, source_sql: &str, args: &[&str], min_parts: usize) {
    let out = tempdir();
    let mut all = vec!["--table", table];
    all.extend_from_slice(args);
    export(&db.url, out.path(), &all).ok();
    let name = format!("public.{table}");
    let got = exported_rows(&out.path().join(&name));
    let want = db.row_strings(source_sql).await;
    files::assert_same_rows(&got, &want, &format!("{table} {args:?}"));
    let parts = part_count(out.path(), &name);
    assert!(
        parts >= min_parts,
        "{table} {args:?}: only {parts} part(s), expected at least {min_parts}"
    );
    let m = files::manifest(out.path());
    let listed: u64 = m["datasets"][0]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rows"].as_u64().unwrap())
        .sum();
    assert_eq!(listed as usize, want.len(), "manifest row counts");
}

#[tokio::test]
async fn every_strategy_reads_every_row_once() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE ints (id bigint PRIMARY KEY, v text);
         INSERT INTO ints SELECT g * 3, repeat('x', g % 50) FROM generate_series(1, 20000) g;
         DELETE FROM ints WHERE id % 7 = 0;
         CREATE TABLE texts (k text PRIMARY KEY, v int);
         INSERT INTO texts SELECT md5(g::text), g FROM generate_series(1, 20000) g;
         CREATE TABLE uuids (k uuid PRIMARY KEY, v int);
         INSERT INTO uuids SELECT md5(g::text)::uuid, g FROM generate_series(1, 20000) g;
         CREATE TABLE composite (a int, b text, v int, PRIMARY KEY (a, b));
         INSERT INTO composite SELECT g % 10, md5(g::text), g FROM generate_series(1, 20000) g;
         CREATE TABLE nullable_key (k int, v text);
         INSERT INTO nullable_key SELECT CASE WHEN g % 10 = 0 THEN NULL ELSE g END, md5(g::text) FROM generate_series(1, 20000) g;
         CREATE TABLE empty (id int PRIMARY KEY, v text);
         CREATE TABLE parted (id int, region text, v text) PARTITION BY LIST (region);
         CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu');
         CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us');
         CREATE TABLE parted_empty PARTITION OF parted FOR VALUES IN ('none');
         INSERT INTO parted SELECT g, CASE WHEN g % 3 = 0 THEN 'eu' ELSE 'us' END, md5(g::text) FROM generate_series(1, 20000) g;
         CREATE VIEW ints_view AS SELECT id, v FROM ints WHERE id % 2 = 0;
         ANALYZE;",
    )
    .await;
    let small = ["--chunk-size", "64KB"];
    check(
        &db,
        "ints",
        "SELECT id, v FROM ints",
        &[&small[..], &["--chunk-by", "ctid"]].concat(),
        5,
    )
    .await;
    check(
        &db,
        "ints",
        "SELECT id, v FROM ints",
        &[&small[..], &["--chunk-by", "key"]].concat(),
        5,
    )
    .await;
    check(
        &db,
        "ints",
        "SELECT id, v FROM ints",
        &["--chunk-by", "none"],
        1,
    )
    .await;
    check(
        &db,
        "texts",
        "SELECT k, v FROM texts",
        &[&small[..], &["--chunk-by", "key"]].concat(),
        3,
    )
    .await;
    check(
        &db,
        "uuids",
        "SELECT replace(k::text, '-', ''), v FROM uuids",
        &[&small[..], &["--chunk-by", "key"]].concat(),
        3,
    )
    .await;
    check(
        &db,
        "composite",
        "SELECT a, b, v FROM composite",
        &[&small[..], &["--chunk-by", "key"]].concat(),
        3,
    )
    .await;
    check(
        &db,
        "nullable_key",
        "SELECT k, v FROM nullable_key",
        &[&small[..], &["--chunk-by", "key:k"]].concat(),
        3,
    )
    .await;
    check(&db, "empty", "SELECT id, v FROM empty", &small, 1).await;
    check(
        &db,
        "empty",
        "SELECT id, v FROM empty",
        &["--chunk-by", "key"],
        1,
    )
    .await;
    check(&db, "parted", "SELECT id, region, v FROM parted", &small, 3).await;
    check(
        &db,
        "parted",
        "SELECT id, region, v FROM parted",
        &[&small[..], &["--chunk-by", "key:id"]].concat(),
        3,
    )
    .await;
    check(&db, "ints_view", "SELECT id, v FROM ints_view", &[], 1).await;
    check(
        &db,
        "ints_view",
        "SELECT id, v FROM ints_view",
        &[&small[..], &["--chunk-by", "key:id"]].concat(),
        2,
    )
    .await;
    // ctid needs a table.
    let out = tempdir();
    let run = export(
        &db.url,
        out.path(),
        &["--table", "ints_view", "--chunk-by", "ctid"],
    );
    run.refused(2, &["--chunk-by ctid needs a table"]);
}

#[tokio::test]
async fn queries_many_tables_one_queue_and_merge() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE SCHEMA sales;
         CREATE TABLE sales.big (id int PRIMARY KEY, v text);
         INSERT INTO sales.big SELECT g, md5(g::text) FROM generate_series(1, 30000) g;
         CREATE TABLE sales.small_1 (id int); INSERT INTO sales.small_1 VALUES (1), (2);
         CREATE TABLE sales.small_2 (id int); INSERT INTO sales.small_2 VALUES (3);
         CREATE TABLE public.other (id int); INSERT INTO public.other VALUES (4);
         ANALYZE;",
    )
    .await;
    // A regex and a schema select into one run, plus a query; all chunks in one queue.
    let out = tempdir();
    export(
        &db.url,
        out.path(),
        &[
            "--tables",
            "sales\\.small_.*",
            "--schema",
            "sales",
            "--query",
            "odd=SELECT id, v FROM sales.big WHERE id % 2 = 1",
            "--chunk-size",
            "256KB",
            "--parallel",
            "3",
        ],
    )
    .ok();
    let m = files::manifest(out.path());
    let mut names: Vec<&str> = m["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["odd", "sales.big", "sales.small_1", "sales.small_2"]
    );
    files::assert_same_rows(
        &exported_rows(&out.path().join("odd")),
        &db.row_strings("SELECT id, v FROM sales.big WHERE id % 2 = 1")
            .await,
        "query dataset",
    );
    assert!(part_count(out.path(), "sales.big") > 2);

    // --merge: one file per dataset, rows in part order, parts removed.
    for format in ["parquet", "csv"] {
        let out = tempdir();
        export(
            &db.url,
            out.path(),
            &[
                "--table",
                "sales.big",
                "--chunk-size",
                "256KB",
                "--parallel",
                "2",
                "--merge",
                "--format",
                format,
            ],
        )
        .ok();
        let m = files::manifest(out.path());
        let ds = &m["datasets"][0];
        assert!(
            ds["parts"].as_array().unwrap().len() > 2,
            "{format}: chunks were merged"
        );
        assert_eq!(ds["merged"]["file"], format!("sales.big.{format}"));
        assert_eq!(ds["merged"]["rows"], 30000);
        let leftover = files_under(out.path())
            .into_iter()
            .filter(|f| f.contains("part-0") && !f.starts_with("_sluice"))
            .count();
        assert_eq!(leftover, 0, "{format}: parts removed after merging");
        let merged = out.path().join(format!("sales.big.{format}"));
        let ids: Vec<String> = if format == "parquet" {
            files::parquet_batches(&merged)
                .iter()
                .flat_map(|b| files::row_strings(std::slice::from_ref(b)))
                .collect()
        } else {
            let (header, rows) =
                files::csv_rows(&std::fs::read_to_string(&merged).unwrap(), b',', "");
            assert_eq!(header, ["id", "v"]);
            rows.iter()
                .map(|r| format!("{}|{}", r[0].as_ref().unwrap(), r[1].as_ref().unwrap()))
                .collect()
        };
        assert_eq!(ids.len(), 30000, "{format}");
        let mut sorted = ids.clone();
        sorted.sort();
        files::assert_same_rows(
            &sorted,
            &db.row_strings("SELECT id, v FROM sales.big").await,
            format,
        );
    }
}

#[tokio::test]
async fn plan_describes_without_reading() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE narrow (id bigint PRIMARY KEY, a int, b bigint, c float8, d timestamptz);
         INSERT INTO narrow SELECT g, g, g, g, now() FROM generate_series(1, 50000) g;
         CREATE TABLE wide (id int PRIMARY KEY, body text, p point);
         INSERT INTO wide SELECT g, repeat(md5(g::text), 60), point(g, g) FROM generate_series(1, 2000) g;
         ANALYZE;",
    )
    .await;
    let run = crate::common::run(sluice().args([
        "plan",
        "--source",
        &db.url,
        "--table",
        "narrow",
        "--table",
        "wide",
        "--json",
        "--chunk-size",
        "1MB",
    ]));
    run.ok();
    let p: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let ds = p["datasets"].as_array().unwrap();
    assert_eq!(ds[0]["name"], "public.narrow");
    assert!(ds[0]["est_rows"].as_u64().unwrap() >= 45000, "{p}");
    assert_eq!(ds[0]["strategy"], "ctid pages");
    assert!(ds[0]["chunks"].as_u64().unwrap() > 1);
    assert!(ds[1]["avg_row_bytes"].as_u64().unwrap() > ds[0]["avg_row_bytes"].as_u64().unwrap());
    assert_eq!(ds[1]["text_columns"][0], "p (point)");
    assert!(p["predicted_peak_rss_bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        p["connections"].as_u64().unwrap(),
        p["workers"].as_u64().unwrap() + 2
    );
    // The text form says the same.
    let run = crate::common::run(sluice().args(["plan", "--source", &db.url, "--table", "narrow"]));
    run.ok();
    assert!(
        run.stdout.contains("public.narrow") && run.stdout.contains("ctid pages"),
        "{}",
        run.stdout
    );
}
