//! JSON Lines, Avro and compressed text: exports and change files read back by readers other
//! than sluice's writers (`serde_json`, `apache-avro`, `flate2`, `zstd`; `sluice_testkit::formats`)
//! equal the Parquet output of the same rows, type by type (the PostgreSQL and MariaDB type
//! tables of `types.rs` and `mysql_types.rs`); JSON Lines change files replay to the table
//! under a writer; `--ops` filters and says so (report, state); `--merge` joins compressed
//! parts into one decodable file; bad combinations exit 2 before the source is touched.
//! `--layout`: `stream_layouts.rs`.

use crate::common::{self, files, run, sluice, tempdir, words};
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{Array, RecordBatch};
use sluice_testkit::formats::{
    AvroValue, avro_matches, avro_rows, decompressed, json_matches, jsonl_rows,
};
use std::path::{Path, PathBuf};

/// Every file under `dir` whose name ends with `ext`, sorted (hidden ones left out).
fn files_with(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = common::files_under(dir)
        .into_iter()
        .filter(|f| f.ends_with(ext) && !f.rsplit('/').next().unwrap().starts_with('.'))
        .map(|f| dir.join(f))
        .collect();
    out.sort();
    out
}

fn concat(batches: &[RecordBatch]) -> RecordBatch {
    arrow_select::concat::concat_batches(&batches[0].schema(), batches).unwrap()
}

/// The rows of `batch` in the order of its integer column `order` (what a reader sorts by).
fn order_of(batch: &RecordBatch, order: &str) -> Vec<usize> {
    let c = arrow_cast::cast(
        batch.column_by_name(order).unwrap(),
        &arrow_schema::DataType::Int64,
    )
    .unwrap();
    let c = c.as_primitive::<arrow_array::types::Int64Type>();
    let mut idx: Vec<usize> = (0..batch.num_rows()).collect();
    idx.sort_by_key(|&i| c.value(i));
    idx
}

/// The JSON Lines files under `dir` hold the rows of `want` (Parquet), value by value.
fn assert_jsonl_equals(want: &RecordBatch, dir: &Path, ext: &str, order: &str) {
    let files = files_with(dir, ext);
    assert!(!files.is_empty(), "no {ext} file under {}", dir.display());
    let mut rows: Vec<_> = files.iter().flat_map(|f| jsonl_rows(f)).collect();
    assert_eq!(rows.len(), want.num_rows(), "{ext}: rows");
    let key = |r: &Vec<(String, serde_json::Value)>| {
        r.iter()
            .find(|(k, _)| k == order)
            .unwrap()
            .1
            .as_i64()
            .unwrap()
    };
    rows.sort_by_key(key);
    let schema = want.schema();
    for (n, &i) in order_of(want, order).iter().enumerate() {
        let names: Vec<&str> = rows[n].iter().map(|(k, _)| k.as_str()).collect();
        let want_names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, want_names, "{ext}: keys in column order");
        for (c, (name, v)) in rows[n].iter().enumerate() {
            if let Err(e) = json_matches(want.column(c), i, v) {
                panic!("{ext}: column {name}: {e}");
            }
        }
    }
}

/// The Avro files under `dir` hold the rows of `want` (Parquet), value by value, and their
/// schemas carry the logical types.
fn assert_avro_equals(want: &RecordBatch, dir: &Path, order: &str) -> serde_json::Value {
    let files = files_with(dir, ".avro");
    assert!(!files.is_empty(), "no Avro file under {}", dir.display());
    let mut schema = serde_json::Value::Null;
    let mut rows = Vec::new();
    for f in &files {
        let (s, r) = avro_rows(f);
        schema = s;
        rows.extend(r);
    }
    assert_eq!(rows.len(), want.num_rows(), "avro: rows");
    let pos = want.schema().index_of(order).unwrap();
    let mut by_key = rows;
    by_key.sort_by_key(|r| {
        let v = match &r[pos].1 {
            AvroValue::Union(_, v) => v.as_ref().clone(),
            v => v.clone(),
        };
        match v {
            AvroValue::Int(i) => i as i64,
            AvroValue::Long(i) => i,
            // `_seq` (UInt64) is an Avro decimal(20, 0): its unsigned value's bytes.
            AvroValue::Decimal(d) => Vec::<u8>::try_from(&d)
                .unwrap()
                .iter()
                .fold(0, |a, b| a * 256 + *b as i64),
            other => panic!("key {other:?}"),
        }
    });
    for (n, &i) in order_of(want, order).iter().enumerate() {
        assert_eq!(by_key[n].len(), want.num_columns(), "avro: fields");
        for (c, (name, v)) in by_key[n].iter().enumerate() {
            assert_eq!(name, want.schema().field(c).name(), "avro: field order");
            if let Err(e) = avro_matches(want.column(c), i, v) {
                panic!("avro: column {name}: {e}");
            }
        }
    }
    schema
}

/// Export `dataset` of `url` in every format and compare each with the Parquet export.
fn every_format_equals_parquet(url: &str, table: &str, dataset: &str) {
    let out = tempdir();
    let ex = |dir: &str, args: &str| {
        let mut a = words(args);
        a.extend(["--table", table]);
        common::export(url, &out.path().join(dir), &a).ok();
        out.path().join(dir).join(dataset)
    };
    let pq = ex("pq", "--format parquet");
    let want = concat(&files::dataset_batches(&pq));
    assert!(want.num_rows() >= 6, "{} rows", want.num_rows());
    for (dir, args, ext) in [
        ("j", "--format jsonl", ".jsonl"),
        ("jgz", "--format jsonl --compression gzip", ".jsonl.gz"),
        (
            "jzst",
            "--format jsonl --compression zstd --zstd-level 5",
            ".jsonl.zst",
        ),
    ] {
        assert_jsonl_equals(&want, &ex(dir, args), ext, "id");
    }
    for codec in ["zstd", "deflate", "snappy", "none"] {
        let dir = ex(codec, &format!("--format avro --compression {codec}"));
        let schema = assert_avro_equals(&want, &dir, "id");
        // The canonical form keeps only types; the header's own codec says which was used.
        assert!(schema["fields"].is_array(), "{schema}");
        let raw = std::fs::read(&files_with(&dir, ".avro")[0]).unwrap();
        let header = String::from_utf8_lossy(&raw[..raw.len().min(8192)]).to_string();
        let named = if codec == "zstd" { "zstandard" } else { codec };
        let named = if named == "none" { "null" } else { named };
        assert!(header.contains(named), "{codec}: header {header:.300}");
        for logical in [
            "\"logicalType\":\"timestamp-micros\"",
            "\"logicalType\":\"date\"",
        ] {
            assert!(
                header.contains(logical),
                "{codec}: {logical} in {header:.2000}"
            );
        }
    }
    // Compressed CSV is the plain CSV, byte for byte, once decompressed; --merge concatenates
    // compressed parts into one valid stream.
    let plain = files_with(&ex("csv", "--format csv"), ".csv");
    let plain: Vec<u8> = plain
        .iter()
        .flat_map(|f| std::fs::read(f).unwrap())
        .collect();
    for (dir, args, ext) in [
        ("cgz", "--format csv --compression gzip", ".csv.gz"),
        ("czst", "--format csv --compression zstd", ".csv.zst"),
    ] {
        let got: Vec<u8> = files_with(&ex(dir, args), ext)
            .iter()
            .flat_map(|f| decompressed(f))
            .collect();
        assert_eq!(got, plain, "{args}");
    }
}

/// `--merge` of compressed text: parts written as gzip members (CSV) and zstd frames (JSON
/// Lines) and joined in order make one file that every reader decodes whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_compressed_parts_decode_as_one_file() {
    let db = common::TestDb::new().await;
    db.exec(
        "CREATE TABLE big AS SELECT g AS id, md5(g::text) AS s FROM generate_series(1, 20000) g;
         ALTER TABLE big ADD PRIMARY KEY (id); ANALYZE big;",
    )
    .await;
    let out = tempdir();
    let args = "--table public.big --chunk-size 128KB --parallel 2 --merge";
    for (dir, format, file) in [
        (
            "j",
            "--format jsonl --compression zstd",
            "public.big.jsonl.zst",
        ),
        ("c", "--format csv --compression gzip", "public.big.csv.gz"),
    ] {
        let to = out.path().join(dir);
        common::export(&db.url, &to, &words(&format!("{args} {format}"))).ok();
        let manifest = files::manifest(&to);
        let parts = files::manifest_dataset(&manifest, "public.big")["parts"]
            .as_array()
            .map_or(0, Vec::len);
        assert!(parts > 1, "{dir}: {parts} part(s): the merge joins several");
        let text = String::from_utf8(decompressed(&to.join(file))).unwrap();
        let ids: Vec<i64> = if dir == "j" {
            jsonl_rows(&to.join(file))
                .iter()
                .map(|r| r[0].1.as_i64().unwrap())
                .collect()
        } else {
            assert_eq!(
                text.lines().filter(|l| l.starts_with("id,")).count(),
                1,
                "one header"
            );
            text.lines()
                .skip(1)
                .map(|l| l.split(',').next().unwrap().parse().unwrap())
                .collect()
        };
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (1..=20000).collect::<Vec<i64>>(),
            "{dir}: every row once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_types_in_jsonl_avro_and_compressed_csv_equal_parquet() {
    let (db, _) = crate::types::setup().await;
    every_format_equals_parquet(&db.url, "public.all_types", "public.all_types");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_types_in_jsonl_avro_and_compressed_csv_equal_parquet() {
    let (db, _) = crate::mysql_types::setup().await;
    let table = format!("{}.all_types", db.name);
    every_format_equals_parquet(&db.url, &table, &table);
}

/// The change files of one stream's output, as one batch (Parquet).
fn parquet_changes(dataset_dir: &Path) -> RecordBatch {
    let files = sluice_testkit::changes::change_files(dataset_dir);
    assert!(
        !files.is_empty(),
        "no change file in {}",
        dataset_dir.display()
    );
    concat(
        &files
            .iter()
            .flat_map(|f| files::parquet_batches(f))
            .collect::<Vec<_>>(),
    )
}

/// The same changes of the PostgreSQL type table streamed as Parquet, JSON Lines and Avro
/// change files are the same values, the old rows of `--before-images` (every type in a
/// struct, an object, a record) included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_files_in_jsonl_and_avro_equal_parquet_change_files() {
    let (db, cols) = crate::types::setup().await;
    // Types a replication stream cannot decode (the export reads them through a cast, which
    // a stream cannot apply) are left out here; the export test above covers them.
    let unstreamable = ["c_inet_arr", "c_point", "c_range"];
    for c in unstreamable {
        db.exec(&format!("ALTER TABLE all_types DROP COLUMN {c}"))
            .await;
    }
    // Every type's old value too, as the `_before` record of updates and deletes.
    db.exec("ALTER TABLE all_types REPLICA IDENTITY FULL").await;
    let names: Vec<&str> = cols
        .iter()
        .map(|c| c.name)
        .filter(|n| !unstreamable.contains(n))
        .collect();
    let out = tempdir();
    let outputs = [
        ("pq", vec!["--format", "parquet"]),
        ("j", vec!["--format", "jsonl", "--compression", "zstd"]),
        ("a", vec!["--format", "avro", "--compression", "deflate"]),
    ];
    let stream = |dir: &str, extra: &[&str]| {
        let mut c = sluice();
        c.args(["stream", "--source", &db.url, "--table", "public.all_types"])
            .arg("--to")
            .arg(out.path().join(dir))
            .args([
                "--initial",
                "none",
                "--until-current",
                "--batch-seconds",
                "0.2",
                "--before-images",
            ])
            .args(extra);
        run(&mut c).ok();
    };
    for (dir, args) in &outputs {
        stream(dir, args);
    }
    db.exec(&format!(
        "INSERT INTO all_types (id, {cols}) SELECT id + 100, {cols} FROM all_types;
         UPDATE all_types SET c_int4 = 7 WHERE id = 2;
         DELETE FROM all_types WHERE id = 3;",
        cols = names.join(", ")
    ))
    .await;
    for (dir, args) in &outputs {
        stream(dir, args);
        run(sluice()
            .args([
                "stream",
                "--source",
                &db.url,
                "--table",
                "public.all_types",
                "--drop",
            ])
            .arg("--to")
            .arg(out.path().join(dir)))
        .ok();
    }
    let want = parquet_changes(&out.path().join("pq/public.all_types"));
    assert_eq!(want.num_rows(), 6 + 1 + 1, "changes");
    let seqs = want
        .column_by_name("_seq")
        .unwrap()
        .as_primitive::<UInt64Type>();
    assert!(seqs.null_count() == 0);
    let (ops, before) = (
        want.column_by_name("_op").unwrap().as_string::<i32>(),
        want.column_by_name("_before").unwrap(),
    );
    for r in 0..want.num_rows() {
        let old_row = matches!(ops.value(r), "update" | "delete");
        assert_eq!(before.is_valid(r), old_row, "{}: _before", ops.value(r));
    }
    assert_jsonl_equals(
        &want,
        &out.path().join("j/public.all_types/changes"),
        ".jsonl.zst",
        "_seq",
    );
    assert_avro_equals(
        &want,
        &out.path().join("a/public.all_types/changes"),
        "_seq",
    );
}

/// JSON Lines change files, compressed, replayed over the snapshot reproduce the tables under
/// a writer (MariaDB); `--ops` leaves operations out and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonl_change_files_replay_to_the_table_and_ops_filter() {
    use crate::mysql_stream::{ChangeWriter, stream, tables_sql};
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    db.exec(&tables_sql(2_000)).await;
    let writer = ChangeWriter::start(&db.url, 2_000).await;
    let (to, filtered) = (tempdir(), tempdir());
    let tables = ["acct", "hist"];
    let all = [
        "--until-current",
        "--format",
        "jsonl",
        "--compression",
        "gzip",
    ];
    let some = [
        "--until-current",
        "--format",
        "jsonl",
        "--initial",
        "none",
        "--ops",
        "insert,delete",
    ];
    run(&mut stream(&db.url, &tables, to.path(), &all)).ok();
    run(&mut stream(&db.url, &tables, filtered.path(), &some)).ok();
    writer.stop_after(30).await;
    run(&mut stream(&db.url, &tables, to.path(), &all)).ok();
    let r = run(&mut stream(&db.url, &tables, filtered.path(), &some));
    r.ok();
    for (table, select) in [
        ("acct", "SELECT id, v, pad FROM acct"),
        ("hist", "SELECT id, acct, amount FROM hist"),
    ] {
        let dir = to.path().join(format!("{}.{table}", db.name));
        assert!(
            !files_with(&dir, ".jsonl.gz").is_empty(),
            "{table}: gzip JSON Lines files"
        );
        let replayed = sluice_testkit::changes::replay(&dir, &["id"]);
        let want = db.row_strings(select).await;
        files::assert_same_rows(
            &replayed.rows,
            &want,
            "snapshot + JSON Lines changes by _seq",
        );
        if table == "acct" {
            assert!(
                replayed.changes.iter().any(|c| c.op == "update"),
                "updates written"
            );
        }
    }
    let (_, kept) =
        sluice_testkit::changes::read_changes(&filtered.path().join(format!("{}.acct", db.name)));
    assert!(kept.iter().any(|c| c.op == "insert"), "inserts kept");
    assert!(
        kept.iter().all(|c| c.op == "insert" || c.op == "delete"),
        "only insert and delete"
    );
    assert!(
        r.stderr.contains("--ops insert,delete leaves out"),
        "{}",
        r.stderr
    );
    // The state says which operations its files keep.
    assert_eq!(
        crate::mysql_stream::state(filtered.path())["ops"],
        "insert,delete"
    );
    assert!(crate::mysql_stream::state(to.path()).get("ops").is_none());
}

/// Column names Avro cannot hold are written as Avro names, the source's name as the field's
/// `doc`, and the values stay under them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_field_names_are_made_valid_and_keep_the_source_name() {
    let db = common::TestDb::new().await;
    db.exec(
        r#"CREATE TABLE names (id int PRIMARY KEY, "a b" int, "1x" text, a_b int);
           INSERT INTO names VALUES (1, 2, 'three', 4);"#,
    )
    .await;
    let out = tempdir();
    common::export(
        &db.url,
        out.path(),
        &words("--table public.names --format avro"),
    )
    .ok();
    let file = &files_with(&out.path().join("public.names"), ".avro")[0];
    let (schema, rows) = avro_rows(file);
    let fields: Vec<(String, String)> = schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["type"].to_string(),
            )
        })
        .collect();
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["id", "a_b", "_1x", "a_b_2"]);
    let raw = String::from_utf8_lossy(&std::fs::read(file).unwrap()).to_string();
    assert!(
        raw.contains(r#""doc":"a b""#) && raw.contains(r#""doc":"1x""#),
        "{raw:.600}"
    );
    let got: Vec<String> = rows[0].iter().map(|(n, v)| format!("{n}={v:?}")).collect();
    assert_eq!(
        got,
        [
            "id=Int(1)",
            "a_b=Union(1, Int(2))",
            "_1x=Union(1, String(\"three\"))",
            "a_b_2=Union(1, Int(4))"
        ]
    );
}

/// Combinations that do not exist exit 2 naming the fix, before the source is touched (the
/// source here accepts no connection).
#[test]
fn bad_combinations_exit_2_before_the_source_is_touched() {
    let to = tempdir();
    let source = "postgres://nobody@127.0.0.1:1/none";
    for (cmd, args, says) in [
        (
            "export",
            "--format csv --compression snappy",
            "gzip, zstd or none",
        ),
        (
            "export",
            "--format jsonl --compression deflate",
            "gzip, zstd or none",
        ),
        (
            "export",
            "--format parquet --compression gzip",
            "zstd, snappy or none",
        ),
        (
            "export",
            "--format avro --compression gzip",
            "zstd, deflate, snappy or none",
        ),
        ("export", "--format avro --merge", "drop --merge"),
        (
            "export",
            "--format jsonl --compression zstd --zstd-level 30",
            "1 to 22",
        ),
        ("stream", "--format jsonl --ops insert,upsert", "--ops"),
        ("stream", "--format avro --layout weekly", "weekly"),
    ] {
        let r = run(sluice()
            .args([cmd, "--source", source, "--table", "public.t", "--to"])
            .arg(to.path())
            .args(words(args)));
        assert_eq!(r.code, 2, "{cmd} {args}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{cmd} {args}: {}", r.stderr);
        assert!(
            !r.stderr.contains("127.0.0.1:1"),
            "{cmd} {args}: touched the source: {}",
            r.stderr
        );
    }
}
