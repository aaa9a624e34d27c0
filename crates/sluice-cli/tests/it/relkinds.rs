#![allow(clippy::unwrap_used)]
//! Relations other than plain tables, in snapshot consistency: materialized views and foreign
//! tables (which `LOCK TABLE` rejects) export, and a partitioned table's foreign partitions are
//! read (not dropped) and marked as outside the snapshot.

use crate::common::*;

/// `host` and `port` of a `postgres://user@host:port/db` URL.
fn host_port(url: &str) -> (String, String) {
    let rest = url.split('@').nth(1).unwrap();
    let hostport = rest.split('/').next().unwrap();
    let (h, p) = hostport.rsplit_once(':').unwrap();
    (h.to_string(), p.to_string())
}

#[tokio::test]
async fn materialized_views_foreign_tables_and_foreign_partitions_export() {
    let db = TestDb::new().await;
    let (host, port) = host_port(&db.url);
    db.exec(&format!(
        "CREATE EXTENSION postgres_fdw;
         CREATE SERVER loopback FOREIGN DATA WRAPPER postgres_fdw
           OPTIONS (host '{host}', port '{port}', dbname '{}');
         CREATE USER MAPPING FOR CURRENT_USER SERVER loopback OPTIONS (user 'postgres');
         CREATE TABLE remote_src (k int NOT NULL, v text);
         INSERT INTO remote_src SELECT g, 'remote ' || g FROM generate_series(300, 399) g;
         CREATE TABLE parts (k int NOT NULL, v text) PARTITION BY RANGE (k);
         CREATE TABLE parts_local PARTITION OF parts FOR VALUES FROM (0) TO (300);
         INSERT INTO parts SELECT g, 'local ' || g FROM generate_series(0, 299) g;
         CREATE FOREIGN TABLE parts_remote PARTITION OF parts FOR VALUES FROM (300) TO (400)
           SERVER loopback OPTIONS (table_name 'remote_src');
         CREATE FOREIGN TABLE ft (k int, v text) SERVER loopback OPTIONS (table_name 'remote_src');
         CREATE MATERIALIZED VIEW mv AS SELECT k, upper(v) AS v FROM parts_local WHERE k < 50;
         ANALYZE parts_local;",
        db.name
    ))
    .await;
    let want_parts = db.row_strings("SELECT k, v FROM parts").await;
    assert_eq!(want_parts.len(), 400);
    let want_mv = db.row_strings("SELECT k, v FROM mv").await;
    let want_ft = db.row_strings("SELECT k, v FROM ft").await;

    for consistency in ["snapshot", "chunk"] {
        let out = tempdir();
        let run = export(
            &db.url,
            out.path(),
            &[
                "--table",
                "parts",
                "--table",
                "mv",
                "--table",
                "ft",
                "--consistency",
                consistency,
            ],
        );
        run.ok();
        for (dir, want) in [
            ("public.parts", &want_parts),
            ("public.mv", &want_mv),
            ("public.ft", &want_ft),
        ] {
            let got = files::row_strings(&files::dataset_batches(&out.path().join(dir)));
            files::assert_same_rows(&got, want, &format!("{consistency}: {dir}"));
        }
        let m = files::manifest(out.path());
        let ds = |name: &str| files::manifest_dataset(&m, name);
        assert_eq!(
            ds("public.parts")["outside_snapshot"],
            serde_json::json!(["public.parts_remote"]),
            "{consistency}"
        );
        assert_eq!(
            ds("public.ft")["outside_snapshot"],
            serde_json::json!(["public.ft"])
        );
        assert!(ds("public.mv").get("outside_snapshot").is_none());
        assert!(
            run.stderr
                .contains("public.parts: rows of public.parts_remote (foreign)"),
            "{}",
            run.stderr
        );
        if consistency == "snapshot" {
            // Both partitions are parts of their own; the foreign one is read whole.
            let parts = ds("public.parts")["parts"].as_array().unwrap().clone();
            assert!(
                parts
                    .iter()
                    .any(|p| p["range"] == "all rows" && p["rows"] == 100),
                "{parts:?}"
            );
        }
    }
}
