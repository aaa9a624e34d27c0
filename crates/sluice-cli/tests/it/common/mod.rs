#![allow(clippy::unwrap_used)]
//! Helpers shared by the CLI's integration tests: run the real binary against the real test
//! server.
#![allow(dead_code)]

pub mod writer;

use std::path::Path;
use std::process::Command;

#[allow(unused_imports)]
pub use sluice_testkit::files;
#[allow(unused_imports)]
pub use sluice_testkit::pg::TestDb;
#[allow(unused_imports)]
pub use sluice_testkit::process::{Failpoints, Run, files_under, finish, run, tempdir};
#[allow(unused_imports)]
pub use sluice_testkit::scenario::assert_retries_name_their_part_once;

/// Arguments written as on a command line, split at spaces (no argument here holds one), so
/// a test's options read as the command a user would type.
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// [`words`] followed by `--report-json REPORT`.
pub fn with_report<'a>(line: &'a str, report: &'a Path) -> Vec<&'a str> {
    let mut args = words(line);
    args.extend(["--report-json", report.to_str().expect("a UTF-8 path")]);
    args
}

/// The sluice binary built for these tests.
pub fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.env_remove("PGPASSWORD")
        .env_remove("SLUICE_LOG_FORMAT")
        .env("SLUICE_LOG", "warn");
    c
}

/// Send signal `sig` (`libc::SIGTERM`, …) to a running sluice.
pub fn signal(child: &std::process::Child, sig: i32) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// Stop a running sluice with SIGTERM and wait for it: it must exit 0 (it commits what it
/// holds first). Returns what it printed on stderr.
pub fn stop(child: std::process::Child) -> String {
    signal(&child, libc::SIGTERM);
    let out = finish(child);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// Start `cmd` with its output captured (read it with [`finish`]).
pub fn spawn(cmd: &mut Command) -> std::process::Child {
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running sluice")
}

/// `HOST:PORT` of the test kit's TLS server whose URL is in `var` (started by
/// `sluice-testkit run FLAG`, as `./scripts/test` does); a missing server fails the test.
pub fn tls_host_port(var: &str, flag: &str) -> String {
    let url = std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set, so there is no TLS server to test against. \
             Run ./scripts/test, or sluice-testkit run {flag} -- …"
        )
    });
    let rest = url.rsplit('@').next().unwrap_or(&url);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// `CREATE TABLE all_types (id int PRIMARY KEY, …)` with a column of each `(name, type)`:
/// the type tables' table on every engine.
pub fn all_types_ddl<'a>(cols: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let defs: Vec<String> = cols
        .into_iter()
        .map(|(name, ty)| format!("{name} {ty}"))
        .collect();
    format!(
        "CREATE TABLE all_types (id int PRIMARY KEY, {})",
        defs.join(", ")
    )
}

/// `sluice stream --source URL --table TABLE --to DIR` (add the flags).
pub fn stream(url: &str, table: &str, to: &Path) -> Command {
    let mut c = sluice();
    c.args(["stream", "--source", url, "--table", table, "--to"])
        .arg(to);
    c
}

/// `sluice replicate --source SOURCE --target TARGET` (add the selection and flags).
pub fn replicate(source: &str, target: &str) -> Command {
    let mut c = sluice();
    c.args(["replicate", "--source", source, "--target", target]);
    c
}

/// `sluice export --source URL --to DIR ARGS…`.
/// The PostgreSQL type table (`crate::types`) exported twice: to Parquet under `<out>/pq`,
/// and with `args` (a table format) under `<out>/table`; returns the second run's report
/// notes and DuckDB's reading of the Parquet files, the oracle a table's reader must match.
pub async fn all_types_as_table(out: &Path, args: &str) -> (String, sluice_testkit::lake::Rows) {
    let (db, _cols) = crate::types::setup().await;
    let pq = out.join("pq");
    export(&db.url, &pq, &["--table", "public.all_types"]).ok();
    let report = out.join("report.json");
    let line = format!("--table public.all_types {args}");
    export(&db.url, &out.join("table"), &with_report(&line, &report)).ok();
    let notes = files::json(&report)["notes"].to_string();
    let parquet = sluice_testkit::lake::duckdb_parquet(&pq.join("public.all_types/*.parquet"));
    (notes, parquet)
}

/// `sluice export` into `to` given as text (an object store URL).
pub fn export_at(url: &str, to: &str, args: &[&str]) -> Run {
    run(sluice()
        .args(["export", "--source", url, "--to", to])
        .args(args))
}

/// `sluice stream` of PostgreSQL `db` into `to` with `args` is refused with exit 2, its
/// message holding each of `says`, before it made a replication slot.
pub async fn stream_refused_before_its_slot(db: &TestDb, to: &Path, args: &str, says: &[&str]) {
    let run = run(sluice()
        .args(["stream", "--source", &db.url, "--to"])
        .arg(to)
        .args(words(args)));
    run.refused(2, says);
    let slots = db
        .row_strings(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()",
        )
        .await;
    assert!(slots.is_empty(), "{slots:?}");
}

pub fn export(url: &str, to: &Path, args: &[&str]) -> Run {
    run(sluice()
        .arg("export")
        .arg("--source")
        .arg(url)
        .arg("--to")
        .arg(to)
        .args(args))
}

/// The harness of every source's suites, starting this crate's binary.
pub fn harness() -> sluice_testkit::scenario::Sluice {
    sluice_testkit::scenario::Sluice { command: sluice }
}

/// The sorted ids of table `r` as of the snapshot a paused run holds (the last one in its
/// `_sluice/run.json`), read by a separate session that imports it: the oracle an export's
/// output must equal.
pub async fn ids_in_run_snapshot(url: &str, out: &Path) -> Vec<i64> {
    let state = files::json(&out.join("_sluice/run.json"));
    let id = state["snapshots"].as_array().unwrap().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let oracle = sluice_testkit::pg::connect(url).await;
    oracle
        .batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{id}'"
        ))
        .await
        .unwrap();
    let mut ids: Vec<i64> = oracle
        .query("SELECT id FROM r", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    ids.sort_unstable();
    ids
}

/// Start an export of table `r` armed with `spec` plus a pause after planning; returns the ids of the
/// snapshot it reads (the oracle, read while it is paused) and the finished run.
pub async fn export_with_oracle(
    db: &TestDb,
    out: &Path,
    args: &[&str],
    spec: &str,
) -> (Run, Vec<i64>) {
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
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
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

/// How many Parquet files a table's directory holds (its log and metadata left out): the
/// files on disk, to compare with those its current version needs.
pub fn parquet_files_in(table: &Path) -> usize {
    std::fs::read_dir(table)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".parquet")
        })
        .count()
}
