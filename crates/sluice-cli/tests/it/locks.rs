#![allow(clippy::unwrap_used)]
//! Locks, the source's and the output's: DDL queued behind the export's ACCESS SHARE lock gets
//! a message naming it and the way out (not a `lock_timeout` loop); sessions blocked by the
//! export show in the harm figures; a second run on one output is refused, naming the first.
//! Every situation is placed with a `wait` failpoint, never with sleeps.

use crate::common::Failpoints;
use crate::common::*;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

fn spawn_export(
    url: &str,
    out: &std::path::Path,
    args: &[&str],
    fp: &Failpoints,
    spec: &str,
) -> Child {
    let mut cmd = sluice();
    cmd.arg("export")
        .arg("--source")
        .arg(url)
        .arg("--to")
        .arg(out)
        .args(args);
    fp.arm(&mut cmd, spec);
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

async fn wait_child(child: Child) -> Run {
    let output = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Start `sql` on its own session (it will block); returns its backend pid once it waits for
/// a lock, and the task running it.
async fn blocked_statement(db: &TestDb, sql: &str) -> (i32, tokio::task::JoinHandle<()>) {
    let c = sluice_testkit::pg::connect(&db.url).await;
    let pid: i32 = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let text = sql.to_string();
    let task = tokio::spawn(async move {
        c.batch_execute(&text).await.unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waiting: bool = db
            .client
            .query_one(
                "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) \
                 FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting {
            return (pid, task);
        }
        assert!(Instant::now() < deadline, "{sql} never waited for a lock");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn ddl_queued_behind_the_export_is_named_with_the_way_out() {
    let db = TestDb::new().await;
    db.numbered("q", 50_000).await;
    let out = tempdir();
    let args = ["--table", "q", "--parallel", "2", "--chunk-size", "512KB"];
    let fp = Failpoints::new();
    // The snapshot is taken and the coordinator holds its lock; no worker has read yet.
    let mut child = spawn_export(&db.url, out.path(), &args, &fp, "export.after_plan=wait");
    fp.reached("export.after_plan", &mut child).await;
    let alter = "ALTER TABLE q ADD COLUMN extra int";
    let (pid, ddl) = blocked_statement(&db, alter).await;
    fp.release("export.after_plan");
    let run = wait_child(child).await;
    run.refused(
        3,
        &[
            &format!("pid {pid}"),
            alter,
            "ACCESS EXCLUSIVE",
            "--resume",
            &format!("pg_cancel_backend({pid})"),
            "--consistency chunk",
        ],
    );
    assert!(
        !run.stderr.contains("retrying"),
        "no lock_timeout retries: {}",
        run.stderr
    );
    // The export released its locks, so the ALTER went through.
    tokio::time::timeout(Duration::from_secs(60), ddl)
        .await
        .expect("the ALTER finishes once the export stopped")
        .unwrap();
    // As the message says: --resume finishes the export (the changed table read again).
    let mut resume = args.to_vec();
    resume.push("--resume");
    let run = export(&db.url, out.path(), &resume);
    run.ok();
    let m = files::manifest(out.path());
    assert_eq!(m["datasets"][0]["rows"], 50000);
    assert_eq!(m["datasets"][0]["columns"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn sessions_blocked_by_the_export_show_in_the_harm_figures() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE h (id int PRIMARY KEY, v text);
         INSERT INTO h SELECT g, g::text FROM generate_series(1, 1000) g;",
    )
    .await;
    let out = tempdir();
    let fp = Failpoints::new();
    // A part is read (its session holds the table's lock, as the coordinator does) and waits
    // before its commit; the harm monitor keeps sampling.
    let mut child = spawn_export(
        &db.url,
        out.path(),
        &["--table", "h", "--parallel", "1"],
        &fp,
        "export.before_commit=wait@1",
    );
    fp.reached("export.before_commit", &mut child).await;
    let (pid, ddl) = blocked_statement(&db, "ALTER TABLE h ADD COLUMN z int").await;
    // Wait until the harm probe has taken a sample since the ALTER began to wait.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sampled: bool = db
            .client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity p, pg_locks l \
                   WHERE p.application_name = 'sluice' AND p.datname = current_database() \
                     AND p.query LIKE 'WITH ours%' \
                     AND p.state = 'idle' AND l.pid = $1 AND NOT l.granted \
                     AND p.query_start > l.waitstart)",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if sampled {
            break;
        }
        assert!(Instant::now() < deadline, "the harm probe took no sample");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fp.release("export.before_commit");
    let run = wait_child(child).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    tokio::time::timeout(Duration::from_secs(60), ddl)
        .await
        .expect("the ALTER finishes once the export ended")
        .unwrap();
    let m = files::manifest(out.path());
    assert!(
        m["harm"]["peak_blocked_sessions"].as_u64().unwrap() >= 1,
        "{}",
        m["harm"]
    );
    assert!(m["harm"]["longest_blocked_wait_seconds"].as_f64().unwrap() > 0.0);
    assert!(
        run.stderr
            .contains("other session(s) waited on this run's locks"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn a_second_run_on_one_output_is_refused_naming_the_first() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE o (id int); INSERT INTO o SELECT generate_series(1, 100)")
        .await;
    let out = tempdir();
    let fp = Failpoints::new();
    let mut first = spawn_export(
        &db.url,
        out.path(),
        &["--table", "o"],
        &fp,
        "export.after_plan=wait",
    );
    fp.reached("export.after_plan", &mut first).await;
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("_sluice/run.json")).unwrap())
            .unwrap();
    let run_id = state["run_id"].as_str().unwrap().to_string();
    let second = export(&db.url, out.path(), &["--table", "o", "--resume"]);
    assert_eq!(second.code, 2, "{}", second.stderr);
    for needle in [
        "another sluice run is writing".to_string(),
        format!("run {run_id}"),
        format!("pid {}", first.id()),
    ] {
        assert!(
            second.stderr.contains(&needle),
            "{needle}: {}",
            second.stderr
        );
    }
    fp.release("export.after_plan");
    wait_child(first).await.ok();
    assert_eq!(files::manifest(out.path())["datasets"][0]["rows"], 100);

    // A run that died holding the lock does not block the next one.
    let out = tempdir();
    let fp = Failpoints::new();
    let child = spawn_export(
        &db.url,
        out.path(),
        &["--table", "o"],
        &fp,
        "export.after_plan=exit",
    );
    let died = wait_child(child).await;
    assert_ne!(died.code, 0);
    let lock = std::fs::read_to_string(out.path().join("_sluice/lock.json")).unwrap();
    assert!(
        lock.contains("\"pid\""),
        "the dead run's lock is there: {lock}"
    );
    export(&db.url, out.path(), &["--table", "o", "--resume"]).ok();
}
