//! `sluice replicate` where production hurts it: a source transaction larger than the memory
//! budget (it used to hang for ever), a second run of the same replication (it used to apply
//! the same transactions twice), a kill after a MySQL target's DDL committed part of a unit
//! (it used to stop the replication for good), and a long read on the target that blocks a
//! barrier (it used to end the replication). Writers run on the source throughout; every
//! target is compared with its source.

use super::replicate::{Db, Session};
use crate::common::writer::Background;
use crate::common::{Failpoints, Run, finish, run, sluice, tempdir};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;

/// `sluice replicate` from `source` into `target` (each table keeps its schema on a target of
/// the same engine), with `args`.
pub(crate) async fn replicate_cmd(source: &Db, target: &Db, args: &[&str]) -> Command {
    let mut c = crate::common::replicate(&source.url().await, &target.url().await);
    c.args(args);
    c
}

/// `--table TABLE --until-current --target-schema public`: one table, into the target's
/// `public` schema.
pub(crate) fn into_public(table: &str) -> [&str; 5] {
    [
        "--table",
        table,
        "--until-current",
        "--target-schema",
        "public",
    ]
}

/// Remove the replication `args` name (its slot and the target's bookkeeping): every test
/// leaves the server's replication slots as it found them.
pub(crate) async fn drop_replication(source: &Db, target: &Db, args: &[&str]) {
    let mut cmd = replicate_cmd(source, target, args).await;
    cmd.arg("--drop");
    run(&mut cmd).ok();
}

/// The report a run wrote with `--report-json`.
pub(crate) fn report(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A writer bumping one counter row of `tick (id, n)` on `db` until stopped.
pub(crate) async fn ticker(db: &Db) -> Background {
    let mut s = Session::open(db).await;
    let w = Background::spawn(|stop, commits| async move {
        while !stop.load(Ordering::Relaxed) {
            s.exec("UPDATE tick SET n = n + 1 WHERE id = 1").await;
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    w.wait_for(5).await;
    w
}

/// The rows of `sql` on both sides are the same.
pub(crate) async fn same(source: &Db, target: &Db, sql: &str) {
    let (s, t) = (source.rows(sql).await, target.rows(sql).await);
    assert_eq!(s.len(), t.len(), "{sql}: row counts differ");
    assert!(s == t, "{sql}: the target differs from the source");
}

/// Run the replication `args` (with `--until-current`), then assert that the target equals
/// the source by each of `queries`.
pub(crate) async fn catch_up(source: &Db, target: &Db, args: &[&str], queries: &[&str]) {
    run(&mut replicate_cmd(source, target, args).await).ok();
    for sql in queries {
        same(source, target, sql).await;
    }
}

async fn large_transaction(source_pg: bool, insert: &str, rows: u64) {
    let source = Db::new(source_pg).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE docs (id int PRIMARY KEY, a int NOT NULL, body text NOT NULL);
             CREATE TABLE tick (id int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO tick VALUES (1, 0);",
        )
        .await;
    let schema = source.schema().await;
    let (docs, tick) = (format!("{schema}.docs"), format!("{schema}.tick"));
    let args = [
        "--table",
        &docs,
        "--table",
        &tick,
        "--until-current",
        "--memory",
        "24MB",
        "--target-schema",
        "public",
    ];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    let writer = ticker(&source).await;
    // One transaction of many times the streaming threshold (--memory / 8), while the
    // writer commits small ones around it.
    source.exec(insert).await;
    let ticks = writer.stop_after(20).await;
    let dir = tempdir();
    let path = dir.path().join("r.json");
    let mut cmd = replicate_cmd(&source, &target, &args).await;
    cmd.arg("--report-json").arg(&path);
    run(&mut cmd).ok();
    let r = report(&path);
    let changes = r["changes"].as_u64().unwrap();
    assert!(
        changes >= rows + ticks.min(20),
        "the report counts {changes} changes for a transaction of {rows} rows: {r}"
    );
    let count = target.rows("SELECT count(*) FROM docs").await;
    assert_eq!(count, [rows.to_string()]);
    same(&source, &target, "SELECT id, a, body FROM docs ORDER BY id").await;
    same(&source, &target, "SELECT n FROM tick").await;
    drop_replication(&source, &target, &args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_a_transaction_many_times_the_memory_budget_is_applied_whole() {
    large_transaction(
        true,
        "INSERT INTO docs SELECT g, g, repeat(md5(g::text), 128) FROM generate_series(1, 10000) g",
        10_000,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_a_transaction_many_times_the_memory_budget_is_applied_whole() {
    large_transaction(
        false,
        "INSERT INTO docs SELECT seq, seq, md5(seq) FROM seq_1_to_100000",
        100_000,
    )
    .await;
}

/// A MySQL/MariaDB source keeps nothing only one reader can use (a PostgreSQL slot), so the
/// target holds the replication: a second run is refused, naming the first, and so is a
/// `--drop` under a running replication.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_run_of_one_replication_is_refused() {
    let source = Db::new(false).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL);
             INSERT INTO t SELECT seq, seq FROM seq_1_to_50;",
        )
        .await;
    let table = format!("{}.t", source.name().await);
    let args = into_public(&table);
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    let mut writer = Session::open(&source).await;
    for i in 1..=20 {
        writer
            .exec(&format!("UPDATE t SET v = v + 1 WHERE id = {i}"))
            .await;
    }
    let fp = Failpoints::new();
    let mut first = replicate_cmd(&source, &target, &args).await;
    fp.arm(&mut first, "replicate.before_commit=wait@1");
    let mut child = first
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    fp.reached("replicate.before_commit", &mut child).await;
    let second = run(&mut replicate_cmd(&source, &target, &args).await);
    second.refused(2, &["already running", "pid"]);
    let mut drop = replicate_cmd(&source, &target, &args).await;
    drop.arg("--drop");
    let dropped = run(&mut drop);
    assert_eq!(dropped.code, 2, "{}", dropped.stderr);
    fp.release("replicate.before_commit");
    let r: Run = finish(child).into();
    r.ok();
    // A MySQL/MariaDB source is worded as one: no slot, no WAL.
    assert!(
        !r.stderr.contains("slot") && r.stderr.contains("binary log"),
        "{}",
        r.stderr
    );
    same(&source, &target, "SELECT id, v FROM t ORDER BY id").await;
    drop_replication(&source, &target, &args).await;
}

/// On a MySQL/MariaDB target a barrier's DDL commits by itself: the changes of the unit before
/// it are committed with their position first, so a kill after the DDL restarts exactly
/// inside the source transaction instead of applying its first changes twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_to_mariadb_a_kill_after_a_barrier_restarts_inside_its_transaction() {
    let source = Db::new(true).await;
    let target = Db::new(false).await;
    source
        .exec(
            "CREATE TABLE a (id int PRIMARY KEY, v int NOT NULL);
             CREATE TABLE s (id int PRIMARY KEY, v int NOT NULL);
             CREATE TABLE tick (id int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO a VALUES (1, 1); INSERT INTO s VALUES (1, 1), (2, 2);
             INSERT INTO tick VALUES (1, 0);",
        )
        .await;
    let args = [
        "--table",
        "public.a",
        "--table",
        "public.s",
        "--table",
        "public.tick",
        "--until-current",
    ];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    let transactions = [
        "BEGIN; INSERT INTO a VALUES (100, 1); TRUNCATE s; INSERT INTO s VALUES (7, 7); COMMIT;",
        "BEGIN; INSERT INTO a VALUES (101, 2); ALTER TABLE s ADD COLUMN w int;
         INSERT INTO s VALUES (8, 8, 8); UPDATE a SET v = 5 WHERE id = 1; COMMIT;",
    ];
    for tx in transactions {
        let writer = ticker(&source).await;
        source.exec(tx).await;
        writer.stop_after(5).await;
        for n in 1..=3 {
            let fp = Failpoints::new();
            let mut cmd = replicate_cmd(&source, &target, &args).await;
            fp.arm(&mut cmd, &format!("replicate.before_commit=exit@{n}"));
            run(&mut cmd);
        }
        catch_up(
            &source,
            &target,
            &args,
            &["SELECT id, v FROM a ORDER BY id", "SELECT n FROM tick"],
        )
        .await;
    }
    same(&source, &target, "SELECT id, v, w FROM s ORDER BY id").await;
    drop_replication(&source, &target, &args).await;
}

/// A long read on the target holds a lock a barrier (a truncate) needs: the replication waits
/// for it, saying who holds it, past any number of lock timeouts, instead of ending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_barrier_blocked_by_a_reader_on_the_target_waits_for_it() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL);
             INSERT INTO t SELECT g, g FROM generate_series(1, 20) g;",
        )
        .await;
    let args = ["--table", "public.t", "--until-current"];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    source
        .exec("TRUNCATE t; INSERT INTO t VALUES (5, 5);")
        .await;
    let reader = sluice_testkit::pg::connect(&target.url().await).await;
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM t;")
        .await
        .unwrap();
    let child = replicate_cmd(&source, &target, &args)
        .await
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for more lock waits than a unit's conflict attempts, each a new transaction.
    let waiting = "SELECT xact_start::text FROM pg_stat_activity \
                   WHERE application_name = 'sluice' AND wait_event_type = 'Lock'";
    let monitor = sluice_testkit::pg::connect(&target.url().await).await;
    let mut seen = std::collections::HashSet::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while seen.len() < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "saw {} waits",
            seen.len()
        );
        for r in sluice_testkit::pg::rows_as_strings(&monitor, waiting).await {
            seen.insert(r);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    reader.batch_execute("COMMIT").await.unwrap();
    let r: Run = finish(child).into();
    r.ok();
    assert!(
        r.stderr.contains("waits") && r.stderr.contains("pid"),
        "the wait and its holder were not reported:\n{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("restarting"),
        "the replication restarted instead of waiting:\n{}",
        r.stderr
    );
    same(&source, &target, "SELECT id, v FROM t ORDER BY id").await;
    drop_replication(&source, &target, &args).await;
}

/// A MySQL/MariaDB target that refuses the connection is the target's error (exit 4), named
/// as the target, not the source's (exit 3).
#[tokio::test]
async fn an_unreachable_mysql_target_is_a_target_error() {
    let source = Db::new(true).await;
    source.exec("CREATE TABLE t (id int PRIMARY KEY)").await;
    let mut cmd = sluice();
    cmd.args(["replicate", "--source", &source.url().await])
        .args([
            "--target",
            "mysql://u:secret@127.0.0.1:1/x",
            "--table",
            "public.t",
        ]);
    let r = run(&mut cmd);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(!r.stderr.contains("secret"), "{}", r.stderr);
    assert!(!r.stderr.contains("source URL"), "{}", r.stderr);
}
