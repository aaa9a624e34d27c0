//! One suite body for every source: the scenarios that must hold whatever the database —
//! a run killed at a commit point and resumed, a run that died after its last part, a worker
//! whose session is killed mid-chunk — written once and run over PostgreSQL, MariaDB and
//! Firebird. Moments are placed with failpoints (`sluice_core::failpoint`): the run stops at a
//! named place, the test acts, the run goes on, so nothing races the program with sleeps.
//!
//! A [`Source`] is a database of the test servers seen the same way for every engine: a table
//! of numbered rows, its rows read back, the sessions of a run that are reading, a way to kill
//! one. [`Sluice`] runs the binary under test (the caller supplies how to start it: only the
//! binary's own crate knows its path).

pub use crate::source::{Engine, Inserts, Source, TABLE, assert_table_plus_inserts};

use crate::files;
use crate::process::{self, Failpoints, Run, files_under, receipts};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Runs the `sluice` binary under test.
#[derive(Clone, Copy)]
pub struct Sluice {
    /// Starts a command of the binary, with the environment tests want.
    pub command: fn() -> Command,
}

/// A run stopped at a `wait` failpoint: the test acts, then lets it go on. Dropped without
/// [`Paused::release`] (a failing test), the run is killed rather than left waiting.
pub struct Paused {
    child: Option<Child>,
    failpoints: Failpoints,
    name: String,
}

impl Paused {
    /// Let the run go on and wait for its end (off the async threads, so tasks of the test
    /// keep running meanwhile).
    pub async fn release(mut self) -> Run {
        self.failpoints.release(&self.name);
        let child = self.child.take().expect("a paused run has its process");
        tokio::task::spawn_blocking(move || process::finish(child).into())
            .await
            .expect("waiting for sluice")
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Sluice {
    fn export_cmd(&self, url: &str, out: &Path, args: &[&str]) -> Command {
        let mut c = (self.command)();
        c.arg("export")
            .arg("--source")
            .arg(url)
            .arg("--to")
            .arg(out)
            .args(args);
        c
    }

    /// `sluice export --source URL --to OUT ARGS…` to its end.
    pub fn export(&self, url: &str, out: &Path, args: &[&str]) -> Run {
        process::run(&mut self.export_cmd(url, out, args))
    }

    /// An export to its end with failpoints `spec` armed (`name=action[@n],…`).
    pub fn export_at(&self, url: &str, out: &Path, args: &[&str], spec: &str) -> Run {
        let fp = Failpoints::new();
        let mut cmd = self.export_cmd(url, out, args);
        fp.arm(&mut cmd, spec);
        process::run(&mut cmd)
    }

    /// An export that dies at failpoint `spec` (an `exit` action, as `kill -9` would leave
    /// it): checks it died and left nothing complete-looking.
    pub fn killed_at(&self, url: &str, out: &Path, args: &[&str], spec: &str) -> Run {
        let run = self.export_at(url, out, args, spec);
        assert_ne!(run.code, 0, "{spec}: the run should have died");
        assert!(!out.join("manifest.json").exists(), "{spec}: no manifest");
        run
    }

    /// An export stopped at failpoint `name` (armed `wait`; `name@n`: at its `n`th hit):
    /// returns once it is there.
    pub async fn paused_at(&self, url: &str, out: &Path, args: &[&str], name: &str) -> Paused {
        let failpoints = Failpoints::new();
        let mut cmd = self.export_cmd(url, out, args);
        let (name, nth) = name.split_once('@').unwrap_or((name, "1"));
        failpoints.arm(&mut cmd, &format!("{name}=wait@{nth}"));
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running sluice");
        failpoints.reached(name, &mut child).await;
        Paused {
            child: Some(child),
            failpoints,
            name: name.to_string(),
        }
    }
}

/// Nothing hidden, no leftover temporaries.
fn assert_no_temporaries(out: &Path, what: &str) {
    let left: Vec<String> = files_under(out)
        .into_iter()
        .filter(|f| f.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{what}: temporaries left: {left:?}");
}

/// The number of snapshots and of parts per snapshot index in `out`'s manifest.
fn snapshots(out: &Path) -> (usize, Vec<u64>) {
    let m = files::manifest(out);
    let parts = m["datasets"][0]["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .map(|p| p["snapshot"].as_u64().expect("a snapshot index"))
        .collect();
    (m["snapshots"].as_array().expect("snapshots").len(), parts)
}

/// The arguments of every scenario's export: two workers, parts of about `chunk`, small
/// batches (so a part is several batches).
fn args<'a>(chunk: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--table",
        TABLE,
        "--parallel",
        "2",
        "--chunk-size",
        chunk,
        "--batch-size",
        "64KB",
    ];
    a.extend_from_slice(extra);
    a
}

/// Killed right after its second receipt (`export.after_receipt=exit@2`) while a writer
/// inserts rows: a plain rerun is refused and names `--resume`; `--resume` keeps the parts
/// that have receipts, reads the others under a new snapshot, and the output holds every row
/// of the table exactly once (and the writer's rows as of the snapshot that read them), its
/// manifest naming both snapshots. Key ranges, the chunks a resume continues part by part.
pub async fn kill_then_resume(sluice: &Sluice, mut src: Source) {
    const ROWS: u64 = 30_000;
    src.numbered_table(ROWS, 100).await;
    let want = src.rows().await;
    let writer = src.start_inserts(ROWS).await;
    let out = process::tempdir();
    let a = args("512KB", &["--chunk-by", "key"]);
    sluice.killed_at(&src.url, out.path(), &a, "export.after_receipt=exit@2");
    // The second receipt's failpoint kills the run; the other worker may have written a
    // receipt of its own between writing and reaching the failpoint, so at least two.
    let before = receipts(out.path());
    assert!(before >= 2, "{before} receipts durable before the kill");
    let refused = sluice.export(&src.url, out.path(), &a);
    refused.refused(2, &["--resume"]);
    let mut resume = a.clone();
    resume.push("--resume");
    let resumed = sluice.export(&src.url, out.path(), &resume);
    resumed.ok();
    if let Some(w) = writer {
        w.stop().await;
    }
    let got = src.exported(out.path());
    assert_table_plus_inserts(&got, &want, ROWS + 1, "after the kill and --resume");
    let (snapshots, parts) = snapshots(out.path());
    assert_eq!(snapshots, 2, "parts from two runs name two snapshots");
    let kept = parts.iter().filter(|s| **s == 0).count();
    assert_eq!(kept, before, "the receipted parts are kept: {parts:?}");
    assert!(
        resumed.stderr.contains("already done"),
        "{}",
        resumed.stderr
    );
    assert!(parts.contains(&1), "{parts:?}");
    assert_no_temporaries(out.path(), "after --resume");
}

/// Every part written, the run dies before the merge or before the manifest, while a writer
/// inserts rows: `--resume` reads nothing (on MariaDB it takes no global lock), finishes the
/// merge and the manifest, and the output is the table as of the first run's snapshot.
pub async fn resume_after_the_last_part(sluice: &Sluice, mut src: Source) {
    const ROWS: u64 = 20_000;
    src.numbered_table(ROWS, 64).await;
    let want = src.rows().await;
    let writer = src.start_inserts(ROWS).await;
    for (failpoint, merge) in [
        ("export.before_merge", true),
        ("export.before_manifest", false),
    ] {
        let out = process::tempdir();
        let mut a = args("256KB", &["--chunk-by", "key"]);
        if merge {
            a.push("--merge");
        }
        let first = sluice.killed_at(&src.url, out.path(), &a, &format!("{failpoint}=exit"));
        assert!(
            first
                .stderr
                .contains(&format!("failpoint {failpoint}: exit")),
            "{failpoint}: {}",
            first.stderr
        );
        let state: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.path().join("_sluice/run.json")).expect("run.json"),
        )
        .expect("run.json is JSON");
        let planned = state["chunks"].as_array().expect("chunks").len();
        assert!(planned >= 2, "{failpoint}: the table spans several parts");
        let report = out.path().join("report.json");
        let mut resume = a.clone();
        let report_arg = report.to_string_lossy().into_owned();
        resume.extend(["--resume", "--report-json", &report_arg]);
        sluice.export(&src.url, out.path(), &resume).ok();
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).expect("report")).expect("JSON");
        assert_eq!(
            r["parts_written"], 0,
            "{failpoint}: nothing read again: {r}"
        );
        assert_eq!(r["parts_skipped"], planned as u64, "{failpoint}: {r}");
        let m = files::manifest(out.path());
        assert_eq!(
            m["datasets"][0]["parts"].as_array().expect("parts").len(),
            planned
        );
        if src.engine() == Engine::Mariadb {
            assert!(
                m["harm"]["global_lock_seconds"].is_null(),
                "{failpoint}: no global lock with nothing to read: {}",
                m["harm"]
            );
        }
        let got = if merge {
            let merged = format!("{}.parquet", src.dataset());
            assert_eq!(m["datasets"][0]["merged"]["file"], merged.as_str());
            assert!(
                !out.path().join(src.dataset()).exists()
                    || files::part_files(&out.path().join(src.dataset()), "parquet").is_empty(),
                "{failpoint}: the parts are removed after the merge"
            );
            files::row_strings(&files::parquet_batches(&out.path().join(merged)))
        } else {
            src.exported(out.path())
        };
        assert_table_plus_inserts(&got, &want, ROWS + 1, failpoint);
        assert_no_temporaries(out.path(), failpoint);
    }
    if let Some(w) = writer {
        w.stop().await;
    }
}

/// Every worker stops after its first batch (`export.after_batch=wait`); the session of one
/// that is inside a chunk is killed; the run goes on. The chunk is read again on a session of
/// the same snapshot (PostgreSQL rejoins it; MariaDB and Firebird continue on a spare session
/// that began it), the retry warning names its part once, and the output is the table, once,
/// from one snapshot. `extra` adds arguments (`--consistency chunk`: the chunk is read again
/// in a transaction of its own).
pub async fn killed_worker_is_retried(sluice: &Sluice, mut src: Source, extra: &[&str]) {
    // A server streams rows until the socket buffers are full (several MB on loopback), so
    // its chunks are far larger: the killed session is mid-statement. Firebird's client
    // fetches, so a paused worker's statement is open whatever the size.
    let (rows, chunk) = match src.engine() {
        Engine::Firebird => (60_000, "2MB"),
        _ => (250_000, "16MB"),
    };
    src.numbered_table(rows, 128).await;
    let want = src.rows().await;
    let out = process::tempdir();
    let data = out.path().join("data");
    let report = out.path().join("report.json");
    let report_arg = report.to_string_lossy().into_owned();
    let mut a = args(chunk, extra);
    a.extend(["--report-json", &report_arg]);
    let paused = sluice
        .paused_at(&src.url, &data, &a, "export.after_batch")
        .await;
    let reading = src.reading_sessions().await;
    let victim = *reading
        .first()
        .unwrap_or_else(|| panic!("no session of the run is reading while its workers are paused"));
    src.kill(victim).await;
    let run = paused.release().await;
    run.ok();
    assert!(run.stderr.contains("retrying"), "{}", run.stderr);
    assert_retries_name_their_part_once(&run.stderr, &src.dataset());
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("report")).expect("JSON");
    assert!(r["retries"].as_u64().expect("retries") >= 1, "{r}");
    files::assert_same_rows(&src.exported(&data), &want, "after a killed worker");
    let (snapshots, _) = snapshots(&data);
    assert_eq!(snapshots, 1, "one snapshot");
}

/// Every retry warning in `stderr` names its part once: `<dataset> part <n>: … — retrying in …`
/// (the reader names the part; the worker that logs the warning adds no prefix of its own).
/// Fails when there is no retry warning at all.
pub fn assert_retries_name_their_part_once(stderr: &str, dataset: &str) {
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("retrying in"))
        .collect();
    assert!(!warnings.is_empty(), "no retry warning in:\n{stderr}");
    for w in warnings {
        assert_eq!(w.matches(" part ").count(), 1, "the part named once: {w}");
        let named = format!("{dataset} part ");
        assert_eq!(w.matches(&named).count(), 1, "{dataset} named once: {w}");
    }
}
