#![allow(clippy::unwrap_used)]
//! `sluice stream` against a real PostgreSQL with wal_level=logical, what only PostgreSQL has:
//! TOAST, partitioned tables, the server's idle limits, refusals, a large
//! transaction, state in Redis and change files on an object store (moto's S3). The scenarios
//! every change source passes (hand-off with a writer, kills at every failpoint of a batch,
//! schema versions, truncate, `--initial none`) are `capture_suite`'s PostgreSQL rows. Every
//! check replays the change files over the snapshot by `_seq`
//! (`sluice_testkit::changes::assert_replay_equals`) and compares the result with the table.
//! Metrics and signals: `stream_metrics.rs`.
//!
//! Over 500 lines: each test is one whole scenario against a real server (failpoints,
//! restarts, replay), and they share this file's table and replay checks.

use crate::common::{self, Failpoints, TestDb, run, sluice, tempdir};
use crate::objstore_common;
use sluice_testkit::changes::replay;
use sluice_testkit::files::assert_same_rows;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const TABLE: &str = "public.acct";

pub(crate) async fn create_acct(db: &TestDb, rows: i64) {
    db.exec(&format!(
        "CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL);
         INSERT INTO acct SELECT g, 0, md5(g::text) FROM generate_series(1, {rows}) g;
         CREATE SEQUENCE acct_new START 10000000;
         ANALYZE acct;"
    ))
    .await;
}

pub(crate) fn stream(url: &str, to: &Path, extra: &[&str]) -> Command {
    let mut c = sluice();
    c.arg("stream")
        .arg("--source")
        .arg(url)
        .arg("--table")
        .arg(TABLE)
        .arg("--to")
        .arg(to)
        .args(["--batch-seconds", "0.2"])
        .args(extra);
    c
}

/// Replay the output over its snapshot and compare with the table; returns the replay.
pub(crate) async fn assert_replay_equals_table(
    db: &TestDb,
    to: &Path,
) -> sluice_testkit::changes::Replayed {
    assert_replay_equals(db, to, "SELECT id, v, pad FROM acct").await
}

async fn assert_replay_equals(
    db: &TestDb,
    to: &Path,
    select: &str,
) -> sluice_testkit::changes::Replayed {
    let want = db.row_strings(select).await;
    sluice_testkit::changes::assert_replay_equals(to, TABLE, &["id"], &want)
}

pub(crate) use sluice_testkit::capture::slots_and_publications;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_toast_values_are_marked_absent_not_null() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL);
         INSERT INTO acct SELECT g, 0, (SELECT string_agg(md5(g::text || k::text), '')
                                        FROM generate_series(1, 400) k)
         FROM generate_series(1, 20) g;",
    )
    .await;
    let to = tempdir();
    run(&mut stream(&db.url, to.path(), &["--until-current"])).ok();
    db.exec(
        "UPDATE acct SET v = 1 WHERE id = 1;
         UPDATE acct SET id = 100 WHERE id = 2;
         DELETE FROM acct WHERE id = 3;
         UPDATE acct SET pad = 'short' WHERE id = 4;",
    )
    .await;
    run(&mut stream(&db.url, to.path(), &["--until-current"])).ok();
    let r = assert_replay_equals_table(&db, to.path()).await;
    let update = r.changes.iter().find(|c| c.op == "update").unwrap();
    assert_eq!(
        update.absent,
        ["pad"],
        "the unchanged TOAST value is absent"
    );
    assert_eq!(update.cells[2], "∅", "an absent cell holds NULL");
    let delete = r.changes.iter().find(|c| c.op == "delete").unwrap();
    assert_eq!(delete.absent, ["v", "pad"], "a delete carries the key only");
    run(&mut stream(&db.url, to.path(), &["--drop"])).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_fix_and_leave_no_slot_behind() {
    let db = TestDb::new().await;
    // A role of this test's own: a server kept between runs may hold one a killed run left.
    let norepl = format!("norepl_{}", db.name);
    db.exec(&format!(
        "CREATE TABLE nokey (a int, b text);
         CREATE TABLE ranges (id int PRIMARY KEY, r int4range);
         CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL);
         CREATE ROLE {norepl} LOGIN PASSWORD 'pw';
         GRANT SELECT ON ALL TABLES IN SCHEMA public TO {norepl};"
    ))
    .await;
    let to = tempdir();
    let one = |table: &str, url: &str, extra: &[&str]| {
        let mut c = sluice();
        c.args(["stream", "--source", url, "--table", table, "--to"])
            .arg(to.path())
            .args(["--until-current"])
            .args(extra);
        run(&mut c)
    };
    let r = one("public.nokey", &db.url, &[]);
    r.refused(2, &["REPLICA IDENTITY FULL"]);
    let r = one("public.ranges", &db.url, &[]);
    r.refused(2, &["ranges.r", "cannot decode"]);
    let r = one("public.acct", &db.url_as(&norepl, Some("pw")), &[]);
    r.refused(3, &[&format!("ALTER ROLE \"{norepl}\" REPLICATION")]);
    let r = one("public.acct", &db.url, &["--query", "q=SELECT 1"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    // A first start that fails after creating the slot removes slot and publication again.
    let fp = Failpoints::new();
    let mut c = stream(&db.url, to.path(), &["--until-current"]);
    fp.arm(&mut c, "stream.first_state=fatal");
    let r = run(&mut c);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert_eq!(slots_and_publications(&db).await, (0, 0), "{}", r.stderr);
    assert!(!to.path().join("_sluice/stream.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_transaction_streams_within_the_memory_budget() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL)")
        .await;
    let to = tempdir();
    run(&mut stream(&db.url, to.path(), &["--until-current"])).ok();
    // About 150 MB of rows in one transaction (the benchmark streams 1 GB).
    let rows = 400_000;
    db.exec(&format!(
        "INSERT INTO acct SELECT g, g, repeat(md5(g::text), 10) FROM generate_series(1, {rows}) g"
    ))
    .await;
    let budget: u64 = 48 << 20;
    let report = to.path().join("report.json");
    run(&mut stream(
        &db.url,
        to.path(),
        &[
            "--until-current",
            "--memory",
            "48MB",
            "--batch-bytes",
            "32MB",
            "--report-json",
            report.to_str().unwrap(),
        ],
    ))
    .ok();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["changes"], rows, "{r}");
    assert_eq!(r["transactions"], 1, "{r}");
    assert!(
        r["batches"].as_u64().unwrap() >= 2,
        "one transaction spans batches: {r}"
    );
    let peak = r["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        peak > 0 && peak <= budget,
        "peak RSS {} MB is over the 48 MB budget",
        peak >> 20
    );
    let files = sluice_testkit::changes::change_files(&to.path().join(TABLE));
    assert!(files.len() >= 2, "{files:?}");
}

pub(crate) fn redis_get(url: &str, key: &str) -> Option<String> {
    use std::io::{BufRead, BufReader, Read, Write};
    let addr = url.trim_start_matches("redis://");
    let mut s = BufReader::new(std::net::TcpStream::connect(addr).unwrap());
    let cmd = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
    s.get_mut().write_all(cmd.as_bytes()).unwrap();
    let mut line = String::new();
    s.read_line(&mut line).unwrap();
    let n: i64 = line.trim_end()[1..].parse().unwrap();
    if n < 0 {
        return None;
    }
    let mut buf = vec![0u8; n as usize + 2];
    s.read_exact(&mut buf).unwrap();
    buf.truncate(n as usize);
    Some(String::from_utf8(buf).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_in_redis_survives_a_kill_and_refuses_a_second_stream() {
    let redis = sluice_testkit::redis::server_url();
    let db = TestDb::new().await;
    create_acct(&db, 2_000).await;
    let to = tempdir();
    let key = format!("stream-test-{}", db.name);
    let state = format!("{redis}/0?key={key}");
    let args = [
        "--until-current",
        "--state",
        state.as_str(),
        "--batch-bytes",
        "64KB",
    ];
    run(&mut stream(&db.url, to.path(), &args)).ok();
    assert!(
        !to.path().join("_sluice/stream.json").exists(),
        "the state is not in the output"
    );
    let saved = redis_get(&redis, &key).expect("the state is in Redis");
    assert!(saved.contains("\"done\":true"), "{saved}");
    db.exec("UPDATE acct SET v = v + 1 WHERE id <= 500; DELETE FROM acct WHERE id > 1900;")
        .await;
    let fp = Failpoints::new();
    let mut cmd = stream(&db.url, to.path(), &args);
    fp.arm(&mut cmd, "stream.after_intent=exit@1");
    assert_ne!(run(&mut cmd).code, 0);
    // The killed run's claim on the state is still there: another stream on it is refused
    // until the claim expires.
    let r = run(&mut stream(&db.url, to.path(), &args));
    r.refused(2, &["another stream is running"]);
    // Release the dead run's claim as an operator would after checking it is gone.
    {
        use std::io::Write;
        let addr = redis.trim_start_matches("redis://");
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let lock = format!("{key}:lock");
        s.write_all(format!("*2\r\n$3\r\nDEL\r\n${}\r\n{lock}\r\n", lock.len()).as_bytes())
            .unwrap();
        let mut b = [0u8; 8];
        let _ = std::io::Read::read(&mut s, &mut b);
    }
    run(&mut stream(&db.url, to.path(), &args)).ok();
    let r = assert_replay_equals_table(&db, to.path()).await;
    assert_eq!(r.changes.len(), 600);
    run(&mut stream(
        &db.url,
        to.path(),
        &["--drop", "--state", state.as_str()],
    ))
    .ok();
    assert_eq!(redis_get(&redis, &key), None, "--drop removes the state");
    assert_eq!(slots_and_publications(&db).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_logical_wal_is_refused_with_the_fix() {
    let server = tokio::task::spawn_blocking(|| {
        sluice_testkit::server::PgServer::start_with_settings("wal_level = replica\n")
    })
    .await
    .unwrap()
    .expect("a second PostgreSQL");
    let url = server.url();
    let c = sluice_testkit::pg::connect(&url).await;
    c.batch_execute("CREATE TABLE acct (id int PRIMARY KEY)")
        .await
        .unwrap();
    let to = tempdir();
    let r = run(&mut stream(&url, to.path(), &["--until-current"]));
    r.refused(3, &["wal_level = logical"]);
    let slots: i64 = c
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0);
}

/// A partitioned table streams under its own name (the publication sends its partitions'
/// changes as the table's: publish_via_partition_root), its snapshot read partition by
/// partition under the slot's snapshot while changes are committed; a row that moves to
/// another partition is a delete and an insert. A publication that names the partitions
/// instead, and a partition whose changes cannot be keyed, are refused with the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_streams_under_its_own_name_moves_between_partitions_included() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE parts (id bigint NOT NULL, region int NOT NULL, v int NOT NULL,
                             pad text NOT NULL, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         CREATE TABLE parts_0 PARTITION OF parts FOR VALUES IN (0);
         CREATE TABLE parts_1 PARTITION OF parts FOR VALUES IN (1);
         CREATE TABLE parts_2 PARTITION OF parts FOR VALUES IN (2);
         INSERT INTO parts SELECT g, g % 3, 0, md5(g::text) FROM generate_series(1, 6000) g;
         ANALYZE parts;",
    )
    .await;
    let changes = |k: i64| {
        format!(
            "UPDATE parts SET v = v + 1 WHERE id % 50 = {k};
             UPDATE parts SET region = (region + 1) % 3 WHERE id % 70 = {k} + 1;
             DELETE FROM parts WHERE id % 90 = {k} + 2;
             INSERT INTO parts SELECT g, g % 3, -1, 'new' FROM generate_series({k} * 1000 + 10001, {k} * 1000 + 10100) g;
             UPDATE parts SET id = id + 100000 WHERE id % 110 = {k} + 3;"
        )
    };
    let parts = |to: &Path, extra: &[&str]| {
        let mut c = common::stream(&db.url, "public.parts", to);
        c.args(["--batch-seconds", "0.2", "--until-current"])
            .args(extra);
        c
    };
    let to = tempdir();
    let fp = Failpoints::new();
    let mut cmd = parts(to.path(), &["--chunk-size", "64KB"]);
    fp.run_paused_at(&mut cmd, "export.after_receipt", db.exec(&changes(0)))
        .await;
    db.exec(&changes(5)).await;
    let streamed = run(&mut parts(to.path(), &[]));
    streamed.ok();
    // The source describes the partitions too as it sends their changes under the table:
    // nothing is left out, and nothing says so.
    assert!(
        !streamed.stderr.contains("does not capture"),
        "{}",
        streamed.stderr
    );
    let r = replay(&to.path().join("public.parts"), &["id", "region"]);
    let want = db.row_strings("SELECT id, region, v, pad FROM parts").await;
    assert_same_rows(
        &r.rows,
        &want,
        "partitioned: snapshot + changes replayed by _seq",
    );
    let moves = r.key_updates(|d, i| d.cells[0] == i.cells[0] && d.cells[1] != i.cells[1]);
    assert!(moves > 0, "no row moved between partitions");
    let dirs: Vec<String> = std::fs::read_dir(to.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("public."))
        .collect();
    assert_eq!(
        dirs,
        ["public.parts"],
        "changes and snapshot under the table"
    );
    run(&mut parts(to.path(), &["--drop"])).ok();
    assert_eq!(slots_and_publications(&db).await, (0, 0));

    db.exec(
        "CREATE PUBLICATION leafpub FOR TABLE parts;
         CREATE TABLE loose (a int NOT NULL, b text) PARTITION BY LIST (a);
         ALTER TABLE loose REPLICA IDENTITY FULL;
         CREATE TABLE loose_1 PARTITION OF loose FOR VALUES IN (1);",
    )
    .await;
    let other = tempdir();
    let r = run(&mut parts(
        other.path(),
        &["--publication", "leafpub", "--slot", "leafslot"],
    ));
    r.refused(2, &["publish_via_partition_root = true"]);
    let mut c = common::stream(&db.url, "public.loose", other.path());
    c.arg("--until-current");
    let r = run(&mut c);
    r.refused(2, &["partition loose_1", "REPLICA IDENTITY FULL"]);
    assert_eq!(slots_and_publications(&db).await, (0, 1), "only leafpub");
}

/// Change files and the stream's state on an object store: a run killed after a batch's
/// objects are written and before its position is saved is continued by the next, which
/// rewrites the same objects; the replay from what the store holds equals the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_files_and_state_on_an_object_store_survive_a_kill() {
    use sluice_testkit::objstore::{Store, test_url};
    let db = TestDb::new().await;
    create_acct(&db, 2_000).await;
    let url = test_url(Store::S3);
    let s3 = |extra: &[&str]| {
        let mut c = sluice();
        c.args([
            "stream", "--source", &db.url, "--table", TABLE, "--to", &url,
        ])
        .args(["--batch-seconds", "0.2", "--batch-bytes", "64KB"])
        .args(extra);
        c
    };
    run(&mut s3(&["--until-current"])).ok();
    db.exec(
        "UPDATE acct SET v = v + 1 WHERE id <= 500;
         DELETE FROM acct WHERE id > 1900;
         UPDATE acct SET id = id + 5000 WHERE id BETWEEN 600 AND 609;",
    )
    .await;
    let fp = Failpoints::new();
    let mut cmd = s3(&["--until-current"]);
    fp.arm(&mut cmd, "stream.after_files=exit@1");
    let r = run(&mut cmd);
    assert_ne!(r.code, 0, "the run did not die:\n{}", r.stderr);
    run(&mut s3(&["--until-current"])).ok();
    let local = tempdir();
    let names = objstore_common::download(&url, local.path()).await;
    assert!(
        names.iter().any(|n| n == "_sluice/stream.json"),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n.contains(".tmp")),
        "temporaries left: {names:?}"
    );
    let r = assert_replay_equals_table(&db, local.path()).await;
    assert_eq!(r.changes.len(), 620);
    run(&mut s3(&["--drop"])).ok();
    assert_eq!(slots_and_publications(&db).await, (0, 0));
}

/// The backend pids of `role`'s sessions.
async fn sessions_of(db: &TestDb, role: &str) -> std::collections::BTreeSet<i32> {
    db.client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE usename = $1",
            &[&role],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// With the server's idle limits at one second for the stream's user, no session of the
/// stream is ended while it waits: not the one holding the slot's exported snapshot while the
/// export is held, not the export's, not the stream's own while nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_idle_limits_end_no_session_of_the_stream() {
    let db = TestDb::new().await;
    create_acct(&db, 2_000).await;
    let role = format!("idle_{}", db.name);
    db.exec(&format!(
        "CREATE ROLE {role} LOGIN SUPERUSER PASSWORD 'pw';
         ALTER ROLE {role} SET idle_session_timeout = '1s';
         ALTER ROLE {role} SET idle_in_transaction_session_timeout = '1s';"
    ))
    .await;
    let url = db.url_as(&role, Some("pw"));
    let to = tempdir();
    let fp = Failpoints::new();
    let mut cmd = stream(
        &url,
        to.path(),
        &["--until-current", "--chunk-size", "64KB"],
    );
    // While the stream holds the slot's snapshot for the export, its sessions stay open past
    // both idle limits.
    fp.run_paused_at(&mut cmd, "export.after_receipt", async {
        let before = sessions_of(&db, &role).await;
        let walsenders: i64 = db
            .client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND backend_type = 'walsender'",
                &[&role],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(walsenders, 1, "the session holding the slot's snapshot");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let after = sessions_of(&db, &role).await;
        assert!(
            before.is_subset(&after),
            "sessions ended while idle: {:?}",
            before.difference(&after).collect::<Vec<_>>()
        );
        db.exec("UPDATE acct SET v = v + 1 WHERE id <= 10").await;
    })
    .await;
    // A running stream with nothing to do: its sessions wait past both limits. (Without the
    // table watch, whose catalog session lives for one listing and ends by itself.)
    let mut child = common::spawn(&mut stream(&url, to.path(), &["--discover-every", "0"]));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let active: bool = db
            .client
            .query_one(
                "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots \
                 WHERE database = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if active {
            break;
        }
        assert!(Instant::now() < deadline, "the stream did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = sessions_of(&db, &role).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    db.exec("ALTER TABLE acct ADD COLUMN note text; UPDATE acct SET note = 'n' WHERE id <= 5;")
        .await;
    let state = to.path().join("_sluice/stream.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&state).is_ok_and(|s| s.contains("\"since_seq\": 11")) {
        assert!(
            Instant::now() < deadline,
            "the schema change was not written"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the stream ended ({status})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = sessions_of(&db, &role).await;
    assert!(
        before.is_subset(&after),
        "sessions ended while idle: {:?}",
        before.difference(&after).collect::<Vec<_>>()
    );
    let stderr = common::stop(child);
    assert!(!stderr.contains("restarting"), "{stderr}");
    assert_replay_equals(&db, to.path(), "SELECT id, v, pad, note FROM acct").await;
    run(&mut stream(&db.url, to.path(), &["--drop"])).ok();
}
