//! `sluice stream` from MariaDB where the saved file and offset cannot be used, and on an idle
//! server, each on throwaway servers of its own (the kit's shared server must keep its binary
//! log and limits): a purged file resumed by GTID, a failover to a promoted replica resumed by
//! GTID, and an idle stream past the server's short idle and network limits. Replays are
//! checked as in `mysql_stream` (`sluice_testkit::changes::replay` panics on a repeated `_seq`,
//! an overlap or a gap; the result must equal the table).

use crate::common::{self, Failpoints, run, tempdir};
use crate::mysql_stream::{
    ChangeWriter, binlog_file, own_mariadb, state, stream, tables_sql, until_current,
};
use mysql_async::prelude::Queryable;
use sluice_testkit::changes::replay;
use sluice_testkit::files::assert_same_rows;
use sluice_testkit::mysql::connect;
use std::time::{Duration, Instant};

/// Purge `admin`'s server's binary log files up to sequence number `seq` (not later ones),
/// retrying while MariaDB keeps them (until its binlog checkpoint passes them).
async fn purge_through(admin: &mut mysql_async::Conn, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let file = binlog_file(admin).await;
    let base = file.rsplit_once('.').unwrap().0;
    loop {
        admin
            .query_drop(format!("PURGE BINARY LOGS TO '{base}.{:06}'", seq + 1))
            .await
            .unwrap();
        let files: Vec<(String, u64)> = admin.query("SHOW BINARY LOGS").await.unwrap();
        let seq_of = |f: &str| f.rsplit_once('.').unwrap().1.parse::<u64>().unwrap();
        if files.iter().all(|(f, _)| seq_of(f) > seq) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "binary log files up to {seq} are not purged: {files:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Both tables' change files, replayed over their snapshot, equal the server's rows, and
/// hold changes read both before and after the switch to GTID positions (`g…`).
async fn assert_replays_across_the_switch(c: &mut mysql_async::Conn, to: &std::path::Path) {
    for (table, select) in [
        ("acct", "SELECT id, v, pad FROM acct"),
        ("hist", "SELECT id, acct, amount FROM hist"),
    ] {
        let r = replay(&to.join(format!("cdc.{table}")), &["id"]);
        let want = sluice_testkit::mysql::rows_as_strings(c, select).await;
        assert_same_rows(
            &r.rows,
            &want,
            &format!("{table}: snapshot + changes by _seq"),
        );
        assert!(
            r.changes.iter().any(|c| c.pos.starts_with('g')),
            "{table}: no change read after the switch"
        );
        assert!(
            r.changes.iter().any(|c| !c.pos.starts_with('g')),
            "{table}: no change read before the switch"
        );
    }
}

/// A stream run that resumes by GTID (its saved file is gone) and is killed right after its
/// first batch's files: it must say it resumed by GTID and die at the failpoint.
fn dies_after_resuming_by_gtid(url: &str, tables: &[&str], to: &std::path::Path, args: &[&str]) {
    let fp = Failpoints::new();
    let mut cmd = stream(url, tables, to, args);
    fp.arm(&mut cmd, "stream.after_files=exit@1");
    let r = run(&mut cmd);
    assert_ne!(r.code, 0, "the run did not die:\n{}", r.stderr);
    assert!(
        r.stderr.contains("Resuming after GTID") && r.stderr.contains("failpoint"),
        "{}",
        r.stderr
    );
}

/// A stream whose saved binary log file was purged while it was stopped (after it had read
/// it) resumes after its saved GTID position in the files that remain: no change lost or
/// repeated, with a writer running before, between and after, and a kill inside a batch right
/// after the switch. Positions read after it start a new epoch, which sorts after the old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_file_resumes_by_gtid_without_gap_or_repeat() {
    let (_server, url, mut admin) = own_mariadb("").await;
    admin.query_drop("CREATE DATABASE cdc").await.unwrap();
    let mut c = connect(&url).await;
    c.query_drop(tables_sql(2_000)).await.unwrap();
    let to = tempdir();
    let tables = ["acct", "hist"];
    let small = ["--until-current", "--batch-bytes", "64KB"];
    let writer = ChangeWriter::start(&url, 2_000).await;
    run(&mut stream(&url, &tables, to.path(), &small)).ok();
    writer.stop_after(20).await;
    // The stream reads its file to the end; then the log rotates.
    run(&mut stream(&url, &tables, to.path(), &small)).ok();
    let before = state(to.path())["committed"]["restart"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        before.contains("~0-1-"),
        "a GTID position is kept: {before}"
    );
    admin.query_drop("FLUSH BINARY LOGS").await.unwrap();
    // A writer goes on while the stream is stopped; the stream's file goes away.
    let writer = ChangeWriter::start_from(&url, 2_000, 20_000_000).await;
    purge_through(&mut admin, before[..10].parse().unwrap()).await;
    writer.wait_for(20).await;
    dies_after_resuming_by_gtid(&url, &tables, to.path(), &small);
    writer.stop_after(20).await;
    let r = run(&mut stream(&url, &tables, to.path(), &small));
    r.ok();
    let after = state(to.path())["committed"]["restart"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        after.starts_with("g000001_") && after > before,
        "{before} → {after}"
    );
    assert_replays_across_the_switch(&mut c, to.path()).await;
}

/// On an idle server with short idle and network limits: `--until-current` ends at once, with
/// the end of the log (and its GTID position) saved; a running stream with nothing to read
/// keeps its sessions past those limits (heartbeats on the dump, its own idle limit on the
/// others) and writes the next changes, a DDL's new schema version included, without a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_finishes_and_outlives_the_servers_timeouts() {
    let (server, url, mut admin) = own_mariadb(
        "wait_timeout=2\ninteractive_timeout=2\nnet_read_timeout=2\nnet_write_timeout=2\n",
    )
    .await;
    admin
        .query_drop(
            "CREATE DATABASE cdc; CREATE TABLE cdc.t (id int PRIMARY KEY, v int);
             INSERT INTO cdc.t VALUES (1, 1), (2, 2);",
        )
        .await
        .unwrap();
    let end = |row: mysql_async::Row| {
        let file: String = row.get(0).unwrap();
        let pos: u64 = row.get(1).unwrap();
        let seq: u64 = file.rsplit_once('.').unwrap().1.parse().unwrap();
        format!("{seq:010}_{pos:014}~")
    };
    let at_end = end(admin
        .query_first("SHOW MASTER STATUS")
        .await
        .unwrap()
        .unwrap());
    admin.disconnect().await.unwrap();
    let to = tempdir();
    for _ in 0..2 {
        until_current(&url, &["t"], to.path()).ok();
        let restart = state(to.path())["committed"]["restart"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(restart.starts_with(&at_end), "{restart} vs {at_end}");
    }
    // The stream's sessions (the test's own use another database until the stream runs).
    let sessions = || async {
        let mut c = connect(&server.url()).await;
        let ids: Vec<u64> = c
            .query(
                "SELECT ID FROM information_schema.PROCESSLIST \
                 WHERE DB = 'cdc'",
            )
            .await
            .unwrap();
        c.disconnect().await.unwrap();
        ids.into_iter().collect::<std::collections::BTreeSet<u64>>()
    };
    let mut child = crate::common::spawn(&mut stream(&url, &["t"], to.path(), &[]));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut c = connect(&server.url()).await;
        let dumps: Vec<u64> = c
            .query(
                "SELECT TIME FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'",
            )
            .await
            .unwrap();
        c.disconnect().await.unwrap();
        if dumps.len() == 1 && dumps[0] >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the stream did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The stream's dump has waited for a second (not the short one of its checks), and the
    // dumps of the runs before have ended (at their next heartbeat): its other sessions are
    // open.
    let before = sessions().await;
    // Past every limit of the server (2 s), twice.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut admin = connect(&url).await;
    admin
        .query_drop(
            "INSERT INTO t VALUES (3, 3); ALTER TABLE t ADD COLUMN note text;
             UPDATE t SET note = 'n', v = v + 1 WHERE id <= 2;",
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while state(to.path())["committed"]["changes"].as_u64() < Some(3) {
        assert!(Instant::now() < deadline, "the changes were not written");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the stream ended ({status})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = sessions().await;
    common::signal(&child, libc::SIGTERM);
    let out = common::finish(child);
    assert!(
        before.is_subset(&after),
        "sessions ended while idle: {before:?} → {after:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("restarting"), "{stderr}");
    let r = replay(&to.path().join("cdc.t"), &["id"]);
    let want =
        sluice_testkit::mysql::rows_as_strings(&mut admin, "SELECT id, v, note FROM t").await;
    assert_same_rows(&r.rows, &want, "t: snapshot + changes by _seq");
    assert!(
        std::fs::read_to_string(to.path().join("_sluice/stream.json"))
            .unwrap()
            .contains("\"version\": 2")
    );
}

/// The GTID position of `url`'s server: `gtid_binlog_pos` (what its binary log holds) or, for
/// a replica, `gtid_slave_pos` (what it applied).
async fn gtid_var(url: &str, var: &str) -> String {
    let mut c = connect(url).await;
    let v: Option<String> = c.query_first(format!("SELECT @@{var}")).await.unwrap();
    c.disconnect().await.unwrap();
    v.unwrap_or_default()
}

/// Failover: a stream of a primary goes on from its replica once that is promoted — another
/// server, whose binary log holds the same transactions under the same GTIDs but in files
/// and offsets of its own (and transactions of its own in another replication domain). The
/// stream resumes there after its saved GTID position, with a writer on the primary before
/// and on the promoted replica after, and a kill right after the switch: no change lost or
/// repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_stream_resumes_on_the_promoted_replica_by_gtid() {
    let (primary, replica) = tokio::task::spawn_blocking(|| {
        let p = sluice_testkit::mariadb::MariadbServer::start_with_settings("");
        let r = sluice_testkit::mariadb::MariadbServer::start_with_settings(
            "server-id=2\ngtid_domain_id=2\nlog_slave_updates=ON\n",
        );
        (p, r)
    })
    .await
    .unwrap();
    let (primary, replica) = (primary.expect("a MariaDB"), replica.expect("a MariaDB"));
    let on_primary = sluice_testkit::mysql::with_database(&primary.url(), "cdc");
    let on_replica = sluice_testkit::mysql::with_database(&replica.url(), "cdc");
    // The replica applies what the primary logs from now on.
    let start = gtid_var(&primary.url(), "gtid_binlog_pos").await;
    let mut admin = connect(&replica.url()).await;
    admin
        .query_drop(format!(
            "SET GLOBAL gtid_slave_pos = '{start}';
             CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = '{}',
               MASTER_PASSWORD = '{}', MASTER_USE_GTID = slave_pos;
             START SLAVE;",
            primary.port,
            sluice_testkit::mariadb::MariadbServer::USER,
            sluice_testkit::mariadb::MARIADB_PASSWORD,
        ))
        .await
        .unwrap();
    let mut c = connect(&primary.url()).await;
    c.query_drop("CREATE DATABASE cdc").await.unwrap();
    let mut c = connect(&on_primary).await;
    c.query_drop(tables_sql(2_000)).await.unwrap();
    let to = tempdir();
    let tables = ["acct", "hist"];
    let small = ["--until-current", "--batch-bytes", "64KB"];
    let writer = ChangeWriter::start(&on_primary, 2_000).await;
    run(&mut stream(&on_primary, &tables, to.path(), &small)).ok();
    writer.wait_for(20).await;
    run(&mut stream(&on_primary, &tables, to.path(), &small)).ok();
    writer.stop_after(20).await;
    // The replica catches up; the primary goes away; the replica is promoted.
    let done = gtid_var(&primary.url(), "gtid_binlog_pos").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while gtid_var(&replica.url(), "gtid_slave_pos").await != done {
        assert!(Instant::now() < deadline, "the replica did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(primary);
    admin
        .query_drop("STOP SLAVE; RESET SLAVE ALL;")
        .await
        .unwrap();
    let writer = ChangeWriter::start_from(&on_replica, 2_000, 30_000_000).await;
    dies_after_resuming_by_gtid(&on_replica, &tables, to.path(), &small);
    writer.stop_after(20).await;
    run(&mut stream(&on_replica, &tables, to.path(), &small)).ok();
    let mut c = connect(&on_replica).await;
    assert_replays_across_the_switch(&mut c, to.path()).await;
}
