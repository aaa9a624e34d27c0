//! Readers of lakehouse tables that sluice did not write: DuckDB with its `delta` extension
//! (Delta Kernel, an implementation independent of the Rust library sluice commits with) for
//! the rows, and the `deltalake` Python package for a table's versions, history and time
//! travel; for Iceberg, PyIceberg through the same SQL catalog, and DuckDB's `iceberg`
//! extension on the table's metadata file. Both run in the test kit's Python environment (`~/.cache/sluice/python-venv`,
//! installed by `scripts/lib/common.sh`; `SLUICE_TEST_PYTHON` names another interpreter);
//! a missing one fails the test with the fix, never skips it.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every commit point of a stream into a table, as failpoint specs that end the run there:
/// the snapshot's table commit, a batch's change files, its merge files, its table commit, the
/// confirmation of its position at the source.
pub const TABLE_COMMIT_POINTS: [&str; 5] = [
    "export.before_table_commit=exit@1",
    "stream.after_files=exit@1",
    "stream.after_table_files=exit@1",
    "stream.after_table_commit=exit@1",
    "stream.before_confirm=exit@2",
];

/// What the readers print, as JSON on one line.
const SCRIPT: &str = r#"
import sys, json, glob, os
mode, target = sys.argv[1], sys.argv[2]
def catalog(uri):
    from pyiceberg.catalog.sql import SqlCatalog
    # sluice's catalog URLs are the SQL driver's; SQLAlchemy spells them otherwise.
    if uri.startswith("sqlite://"):
        uri = "sqlite:///" + uri[len("sqlite://"):].split("?")[0]
    elif uri.startswith(("postgres://", "postgresql://")):
        uri = "postgresql+psycopg2://" + uri.split("://", 1)[1]
    return SqlCatalog("sluice", uri=uri)
if mode in ("duckdb", "parquet", "duckdb-iceberg"):
    import duckdb
    con = duckdb.connect()
    def load(name):
        ext = glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "duckdb_ext",
                                     "extensions", "*", "*", f"{name}.duckdb_extension"))
        if not ext:
            sys.exit(f"the duckdb-ext-{name} package is not installed: run scripts/test once")
        con.execute(f"INSTALL '{ext[0]}'")
    if mode == "duckdb-iceberg":
        load("avro")
        load("iceberg")
        con.execute("LOAD iceberg")
        location = catalog(target).load_table(sys.argv[3]).metadata_location
        source = f"iceberg_scan('{location}')"
    else:
        load("delta")
        con.execute("LOAD delta")
        source = f"delta_scan('{target}')" if mode == "duckdb" else f"read_parquet('{target}')"
    rel = con.sql(f"SELECT * FROM {source}")
    # Timestamps as microseconds since the epoch: DuckDB cannot print years past 294246
    # (PostgreSQL's infinity), and the number is the value itself.
    cols = ", ".join(f'CAST(epoch_us("{c}") AS VARCHAR)' if str(t).startswith("TIMESTAMP")
                     else f'CAST("{c}" AS VARCHAR)' for c, t in zip(rel.columns, rel.types))
    rows = con.sql(f"SELECT {cols} FROM {source} ORDER BY 1").fetchall()
    print(json.dumps({"columns": rel.columns, "types": [str(t) for t in rel.types],
                      "rows": [list(r) for r in rows]}))
elif mode == "encodings":
    import duckdb
    seen = {}
    for path, encodings in duckdb.sql(
            f"SELECT path_in_schema, encodings FROM parquet_metadata('{target}')").fetchall():
        seen.setdefault(path, set()).update(e.strip() for e in encodings.split(","))
    print(json.dumps({path: sorted(e) for path, e in seen.items()}))
elif mode == "iceberg":
    t = catalog(target).load_table(sys.argv[3])
    snap = t.current_snapshot()
    ids = sorted(t.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
    schema = t.schema()
    print(json.dumps({"ids": ids, "location": t.location(),
                      "snapshots": len(t.metadata.snapshots),
                      "files": len(list(t.scan().plan_files())),
                      "files_low_ids": len(list(t.scan(row_filter="id <= 100").plan_files())),
                      "summary": dict(snap.summary.additional_properties) if snap else {},
                      "identifier": [schema.find_column_name(i)
                                     for i in sorted(schema.identifier_field_ids)]},
                     default=str))
else:
    from deltalake import DeltaTable
    version = None if len(sys.argv) < 4 else int(sys.argv[3])
    opts = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    t = DeltaTable(target, version=version, storage_options=opts or None)
    ids = sorted(t.to_pyarrow_table(columns=["id"]).column("id").to_pylist())
    print(json.dumps({"version": t.version(), "files": len(t.file_uris()), "ids": ids,
                      "history": t.history(), "protocol": [t.protocol().min_reader_version,
                                                           t.protocol().min_writer_version]},
                     default=str))
# The S3 client's threads can abort the interpreter's teardown ("terminate called without an
# active exception"): the answer is printed, so leave without tearing down.
sys.stdout.flush()
os._exit(0)
"#;

/// The Python interpreter of the test environment.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let home = std::env::var("HOME").expect("HOME");
    let p = Path::new(&home).join(".cache/sluice/python-venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/test (it installs DuckDB and deltalake for these tests)",
        p.display()
    );
    p
}

fn read(args: &[&str]) -> Value {
    let out = Command::new(python())
        .arg("-c")
        .arg(SCRIPT)
        .args(args)
        .output()
        .expect("running the Python reader");
    assert!(
        out.status.success(),
        "reader {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the reader's JSON")
}

/// Rows read by DuckDB, every value as DuckDB's text of it (`None` for NULL; timestamps as
/// microseconds since the epoch), ordered by the first column.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    /// Column names.
    pub columns: Vec<String>,
    /// DuckDB's type of each column.
    pub types: Vec<String>,
    /// The rows.
    pub rows: Vec<Vec<Option<String>>>,
}

impl Rows {
    /// The first column's values as sorted integers (the `id` of the test tables).
    pub fn ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .rows
            .iter()
            .map(|r| {
                r[0].as_deref()
                    .expect("an id")
                    .parse()
                    .expect("an integer id")
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The columns whose values differ from `other`'s (the same rows read from another
    /// output): each must be one the report's `notes` name as converted (`<dataset>.<column>:`),
    /// and a column the notes do not name must have kept its type.
    pub fn differing_from(&self, other: &Rows, notes: &str, dataset: &str) -> Vec<String> {
        assert_eq!(self.columns, other.columns);
        assert_eq!(self.rows.len(), other.rows.len());
        let mut differing = Vec::new();
        for (c, name) in self.columns.iter().enumerate() {
            let named = notes.contains(&format!("{dataset}.{name}:"));
            let a: Vec<&Option<String>> = self.rows.iter().map(|r| &r[c]).collect();
            let b: Vec<&Option<String>> = other.rows.iter().map(|r| &r[c]).collect();
            if a != b {
                assert!(
                    named,
                    "{name}: {a:?} vs {b:?}, not named in the notes {notes}"
                );
                differing.push(name.clone());
            }
            if !named {
                assert_eq!(
                    self.types[c], other.types[c],
                    "{name}: a type changed without a note"
                );
            }
        }
        differing
    }
}

fn rows(v: Value) -> Rows {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("a list")
            .iter()
            .map(|s| s.as_str().expect("text").to_string())
            .collect()
    };
    Rows {
        columns: strings(&v["columns"]),
        types: strings(&v["types"]),
        rows: v["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| {
                r.as_array()
                    .expect("a row")
                    .iter()
                    .map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .collect(),
    }
}

/// The Delta table at `dir` as DuckDB's delta extension reads it.
pub fn duckdb_delta(dir: &Path) -> Rows {
    rows(read(&["duckdb", dir.to_str().expect("UTF-8 path")]))
}

/// The Delta table at `dir` as DuckDB reads it, as sorted `v1|v2|…` rows (NULL as `∅`): the
/// form of a source table's rows as the test kit's oracles give them (`row_strings`).
pub fn duckdb_delta_strings(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = duckdb_delta(dir)
        .rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| c.as_deref().unwrap_or("∅"))
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    out.sort();
    out
}

/// The Parquet files matching `glob` as DuckDB reads them (for comparison with a table).
pub fn duckdb_parquet(glob: &Path) -> Rows {
    rows(read(&["parquet", glob.to_str().expect("UTF-8 path")]))
}

/// The value encodings of each column of the Parquet files matching `glob`, as DuckDB reads
/// them from the files' metadata (every row group's, together).
pub fn parquet_encodings(glob: &Path) -> std::collections::BTreeMap<String, Vec<String>> {
    serde_json::from_value(read(&["encodings", glob.to_str().expect("UTF-8 path")]))
        .expect("column → encodings")
}

/// A Delta table as the `deltalake` Python package sees it (at `version`, or the latest).
#[derive(Debug, Clone)]
pub struct DeltaView {
    /// The version read.
    pub version: i64,
    /// Data files of that version.
    pub files: usize,
    /// The `id` column's values, sorted.
    pub ids: Vec<i64>,
    /// Every commit's `commitInfo`, newest first.
    pub history: Vec<Value>,
    /// The protocol's minimum reader and writer versions.
    pub protocol: (i64, i64),
}

/// The reader's `ids` list.
fn ids(v: &Value) -> Vec<i64> {
    v["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|i| i.as_i64().expect("an id"))
        .collect()
}

/// The table at `dir` through the `deltalake` package.
pub fn delta_view(dir: &Path, version: Option<i64>) -> DeltaView {
    delta_view_at(dir.to_str().expect("UTF-8 path"), version)
}

/// The table at `uri` (a path, or `s3://…` with the client settings of the environment's
/// `AWS_*` variables, which the test kit's S3 emulator sets) through the `deltalake` package.
pub fn delta_view_at(path: &str, version: Option<i64>) -> DeltaView {
    let v = match version {
        Some(n) => read(&["deltalake", path, &n.to_string()]),
        None => read(&["deltalake", path]),
    };
    DeltaView {
        version: v["version"].as_i64().expect("version"),
        files: v["files"].as_u64().expect("files") as usize,
        ids: ids(&v),
        history: v["history"].as_array().expect("history").clone(),
        protocol: (
            v["protocol"][0].as_i64().expect("reader version"),
            v["protocol"][1].as_i64().expect("writer version"),
        ),
    }
}

/// The Iceberg table `name` (`namespace.table`) of the SQL catalog at `catalog` (sluice's URL
/// form) as DuckDB's iceberg extension reads it, the table found through PyIceberg.
pub fn duckdb_iceberg(catalog: &str, name: &str) -> Rows {
    rows(read(&["duckdb-iceberg", catalog, name]))
}

/// An Iceberg table as PyIceberg sees it through its SQL catalog.
#[derive(Debug, Clone)]
pub struct IcebergView {
    /// The `id` column's values, sorted.
    pub ids: Vec<i64>,
    /// The table's location.
    pub location: String,
    /// Snapshots the table's metadata holds.
    pub snapshots: usize,
    /// Data files of the current snapshot.
    pub files: usize,
    /// Of those, the files a scan for `id <= 100` reads (the others pruned by the files'
    /// column bounds).
    pub files_low_ids: usize,
    /// The current snapshot's summary (the `sluice.*` keys among them).
    pub summary: Value,
    /// The identifier fields' names.
    pub identifier: Vec<String>,
}

/// The table `name` of the catalog at `catalog` through PyIceberg.
pub fn iceberg_view(catalog: &str, name: &str) -> IcebergView {
    let v = read(&["iceberg", catalog, name]);
    IcebergView {
        ids: ids(&v),
        location: v["location"].as_str().expect("location").to_string(),
        snapshots: v["snapshots"].as_u64().expect("snapshots") as usize,
        files: v["files"].as_u64().expect("files") as usize,
        files_low_ids: v["files_low_ids"].as_u64().expect("files_low_ids") as usize,
        summary: v["summary"].clone(),
        identifier: v["identifier"]
            .as_array()
            .expect("identifier")
            .iter()
            .map(|i| i.as_str().expect("a name").to_string())
            .collect(),
    }
}
