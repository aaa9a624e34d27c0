//! `--parquet-encodings delta`: integer-backed columns delta-encoded, read back by a reader
//! sluice did not write (DuckDB) exactly as the default encodings' files of the same rows, and
//! smaller; what is refused (Iceberg tables, formats without Parquet) before the source is
//! touched.

use crate::common::*;
use sluice_testkit::lake;
use std::path::Path;

const ROWS: i64 = 20_000;

/// A table whose integer-backed columns are of every kind the option changes (a serial key,
/// random 64-bit integers, timestamps with and without zone, dates, times, short and long
/// decimals, NULLs), beside text and a repetitive integer that keeps its dictionary.
async fn table(db: &TestDb) {
    db.exec(
        "CREATE TABLE e (id bigint PRIMARY KEY, small smallint, qty int NOT NULL, \
         account bigint, at timestamptz NOT NULL, local timestamp, day date, tod time, \
         amount numeric(12,2), big numeric(30,4), note text)",
    )
    .await;
    db.exec(&format!(
        "INSERT INTO e SELECT g, (g % 30000 - 15000)::smallint, (g * 7) % 100, \
         CASE WHEN g % 11 = 0 THEN NULL ELSE (hashint8extended(g, 0) & 4503599627370495) END, \
         timestamptz '2021-03-04 05:06:07+00' + hashint4(g::int)::bigint * interval '1 millisecond', \
         CASE WHEN g % 7 = 0 THEN NULL ELSE timestamp '2020-01-01' + g * interval '1 minute' END, \
         date '2000-01-01' + (hashint4(g::int) & 8191), \
         time '00:00' + (g % 86400) * interval '1 second', \
         (hashint8extended(g, 1) & 67108863) / 100.0, \
         g * 12345.6789, 'row ' || g FROM generate_series(1, {ROWS}) g"
    ))
    .await;
}

/// Encodings of the columns of the parts under `dir`'s dataset `public.e`.
fn encodings(dir: &Path) -> std::collections::BTreeMap<String, Vec<String>> {
    lake::parquet_encodings(&dir.join("public.e/*.parquet"))
}

fn bytes_of(dir: &Path) -> u64 {
    files::part_files(&dir.join("public.e"), "parquet")
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// The same rows exported with the default encodings and with `delta`: DuckDB reads both the
/// same, every row of the source once; the delta files use DELTA_BINARY_PACKED on the
/// high-cardinality integer-backed columns and nowhere else, the default files nowhere; the
/// delta files are smaller. A Delta Lake table with delta-encoded parts reads back the same.
#[tokio::test]
async fn delta_encoded_parts_read_back_as_the_default_ones_and_are_smaller() {
    let db = TestDb::new().await;
    table(&db).await;
    let out = tempdir();
    let (plain, delta, lake_dir) = (
        out.path().join("plain"),
        out.path().join("delta"),
        out.path().join("lake"),
    );
    export(
        &db.url,
        &plain,
        &words("--table e --parallel 2 --chunk-size 256KB"),
    )
    .ok();
    export(
        &db.url,
        &delta,
        &words("--table e --parallel 2 --chunk-size 256KB --parquet-encodings delta"),
    )
    .ok();

    let expected = lake::duckdb_parquet(&plain.join("public.e/*.parquet"));
    let got = lake::duckdb_parquet(&delta.join("public.e/*.parquet"));
    assert_eq!(got.types, expected.types);
    assert_eq!(got.rows, expected.rows);
    assert_eq!(got.ids(), (1..=ROWS).collect::<Vec<_>>());

    let with_delta = |m: &std::collections::BTreeMap<String, Vec<String>>| -> Vec<String> {
        m.iter()
            .filter(|(_, e)| e.iter().any(|e| e == "DELTA_BINARY_PACKED"))
            .map(|(c, _)| c.clone())
            .collect()
    };
    assert_eq!(with_delta(&encodings(&plain)), Vec::<String>::new());
    let delta_columns = with_delta(&encodings(&delta));
    for c in ["id", "account", "at", "local", "amount"] {
        assert!(
            delta_columns.iter().any(|d| d == c),
            "{c} not delta-encoded: {delta_columns:?}"
        );
    }
    for c in ["big", "note", "qty"] {
        assert!(
            !delta_columns.iter().any(|d| d == c),
            "{c} delta-encoded: {delta_columns:?}"
        );
    }
    let (p, d) = (bytes_of(&plain), bytes_of(&delta));
    assert!(d < p, "delta-encoded parts {d} bytes, default {p}");

    export(
        &db.url,
        &lake_dir,
        &words("--table e --format delta --parquet-encodings delta"),
    )
    .ok();
    let table = lake::duckdb_delta(&lake_dir.join("public.e"));
    assert_eq!(table.rows.len(), ROWS as usize);
    assert_eq!(table.ids(), got.ids());
    let in_table = with_delta(&encodings(&lake_dir));
    assert!(in_table.iter().any(|c| c == "id"), "{in_table:?}");
}

/// Refused with exit 2 before the source is read, naming the reason and the fix: delta
/// encodings for an Iceberg table (its Java readers do not decode them), and the option for a
/// format that writes no Parquet.
#[tokio::test]
async fn delta_encodings_are_refused_where_they_do_not_apply() {
    let db = TestDb::new().await;
    table(&db).await;
    let out = tempdir();
    export(
        &db.url,
        out.path(),
        &words("--table e --format iceberg --namespace n --parquet-encodings delta"),
    )
    .refused(2, &["--parquet-encodings delta", "iceberg", "Java readers"]);
    export(
        &db.url,
        out.path(),
        &words("--table e --format csv --compression gzip --parquet-encodings compatible"),
    )
    .refused(2, &["--parquet-encodings applies to Parquet output"]);
    for format in ["csv", "jsonl", "avro"] {
        let args = format!("--table e --format {format} --parquet-encodings delta");
        export(&db.url, out.path(), &words(&args)).refused(
            2,
            &["--parquet-encodings applies to Parquet output", format],
        );
    }
    assert!(
        std::fs::read_dir(out.path()).unwrap().next().is_none(),
        "a refused run wrote something"
    );
}
