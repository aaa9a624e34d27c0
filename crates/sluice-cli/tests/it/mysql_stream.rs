//! `sluice stream` from the MariaDB binary log (the test kit's server: log-bin, ROW format):
//! the snapshot hand-off with a writer running multi-table transactions (key updates included),
//! kills at every failpoint of a batch with restarts, the types the export maps, MINIMAL and
//! NOBLOB row images, DDL and TRUNCATE, and refusals (no key, a table without transactions, no
//! privilege, statement-based changes, STATEMENT format, a purged binary log, with and without
//! its GTID position). Resumes by GTID and idle streams: `mysql_positions`. Every check replays the change files over
//! the snapshot by `_seq` (`sluice_testkit::changes::replay`, which panics on a repeated
//! `_seq`, an overlap or a gap) and compares with the table.
//!
//! Over 500 lines: each test is one whole scenario against a real server (writer, failpoints,
//! restarts, replay), and they share this file's writer and replay checks.

use crate::common::writer::Background;
use crate::common::{self, Failpoints, run, sluice, tempdir};
use mysql_async::prelude::Queryable;
use sluice_testkit::changes::replay;
use sluice_testkit::files::{assert_same_rows, dataset_batches, row_strings};
use sluice_testkit::mysql::{TestDb, connect};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

async fn create_tables(db: &mut TestDb, rows: i64) {
    db.exec(&tables_sql(rows)).await;
}

/// `acct` with `rows` rows and an empty `hist` (the writer's tables).
pub(crate) fn tables_sql(rows: i64) -> String {
    format!(
        "SET SESSION max_recursive_iterations = 1000000;
         CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL, pad varchar(200) NOT NULL);
         INSERT INTO acct WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows})
           SELECT n, 0, MD5(n) FROM g;
         CREATE TABLE hist (id bigint PRIMARY KEY AUTO_INCREMENT, acct bigint NOT NULL,
                            amount decimal(12,2) NOT NULL);
         ANALYZE TABLE acct;"
    )
}

/// A writer of multi-table transactions: updates, a delete, an insert and a key update of
/// `acct`, and an insert (sometimes a delete) in `hist`, one transaction after another.
pub(crate) struct ChangeWriter;

impl ChangeWriter {
    pub(crate) async fn start(url: &str, rows: i64) -> Background {
        Self::start_from(url, rows, 10_000_000).await
    }

    /// A writer whose inserted keys start at `next` (one after another writer's).
    pub(crate) async fn start_from(url: &str, rows: i64, mut next: i64) -> Background {
        let mut c = connect(url).await;
        let w = Background::spawn(|stop, commits| async move {
            while !stop.load(Ordering::Relaxed) {
                let n = commits.load(Ordering::Relaxed);
                let pick = format!("id >= FLOOR(RAND() * {rows}) ORDER BY id LIMIT 1");
                let sql = format!(
                    "START TRANSACTION;
                         UPDATE acct SET v = v + 1, pad = CONCAT(LEFT(pad, 150), 'u')
                           WHERE id >= FLOOR(RAND() * {rows}) ORDER BY id LIMIT 3;
                         DELETE FROM acct WHERE {pick};
                         INSERT INTO acct VALUES ({}, -1, 'new');
                         UPDATE acct SET id = {} WHERE {pick};
                         INSERT INTO hist (acct, amount) VALUES ({n}, {n} / 4);
                         {}
                         COMMIT;",
                    next,
                    next + 1,
                    if n % 5 == 4 {
                        "DELETE FROM hist ORDER BY id LIMIT 1;"
                    } else {
                        ""
                    }
                );
                next += 2;
                c.query_drop(sql).await.unwrap();
                commits.fetch_add(1, Ordering::Relaxed);
            }
        });
        w.wait_for(5).await;
        w
    }
}

/// The binary log file the server writes now (`SHOW MASTER STATUS`).
pub(crate) async fn binlog_file(admin: &mut mysql_async::Conn) -> String {
    admin
        .query_first::<mysql_async::Row, _>("SHOW MASTER STATUS")
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap()
}

/// A MariaDB server of the test's own, started with the configuration lines `settings`, for a
/// test that changes server-wide settings or purges the binary log: the server, the URL of its
/// database `cdc` (created by the test) and an admin session.
pub(crate) async fn own_mariadb(
    settings: &'static str,
) -> (
    sluice_testkit::mariadb::MariadbServer,
    String,
    mysql_async::Conn,
) {
    let server = tokio::task::spawn_blocking(move || {
        sluice_testkit::mariadb::MariadbServer::start_with_settings(settings)
    })
    .await
    .unwrap()
    .expect("a second MariaDB");
    let url = sluice_testkit::mysql::with_database(&server.url(), "cdc");
    let admin = connect(&server.url()).await;
    (server, url, admin)
}

pub(crate) fn stream(url: &str, tables: &[&str], to: &Path, extra: &[&str]) -> Command {
    let mut c = sluice();
    c.arg("stream").arg("--source").arg(url);
    for t in tables {
        c.arg("--table").arg(t);
    }
    c.arg("--to")
        .arg(to)
        .args(["--batch-seconds", "0.2"])
        .args(extra);
    c
}

pub(crate) fn state(to: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(to.join("_sluice/stream.json")).unwrap()).unwrap()
}

/// [`assert_replay_equals`] for the writer's two tables, `acct` and `hist`.
async fn assert_acct_and_hist_replay(
    db: &mut TestDb,
    to: &Path,
) -> (
    sluice_testkit::changes::Replayed,
    sluice_testkit::changes::Replayed,
) {
    let r = assert_replay_equals(db, to, "acct", &["id"], "SELECT id, v, pad FROM acct").await;
    let h =
        assert_replay_equals(db, to, "hist", &["id"], "SELECT id, acct, amount FROM hist").await;
    (r, h)
}

async fn assert_replay_equals(
    db: &mut TestDb,
    to: &Path,
    table: &str,
    key: &[&str],
    select: &str,
) -> sluice_testkit::changes::Replayed {
    let r = replay(&to.join(format!("{}.{table}", db.name)), key);
    let want = db.row_strings(select).await;
    if r.rows != want {
        // Say which changes touched the rows that differ, for the failure message.
        let got: std::collections::BTreeSet<&String> = r.rows.iter().collect();
        let w: std::collections::BTreeSet<&String> = want.iter().collect();
        for m in w.difference(&got).chain(got.difference(&w)).take(6) {
            let id = m.split('|').next().unwrap();
            eprintln!("row {m}:");
            for c in r.changes.iter().filter(|c| c.cells[0] == id) {
                eprintln!(
                    "  change _seq {} {} at {} {:?}",
                    c.seq, c.op, c.pos, c.cells
                );
            }
        }
        let dir = to.join(format!("{}.{table}", db.name));
        for f in sluice_testkit::changes::change_files(&dir) {
            eprintln!("file {}", f.display());
        }
        let mut last: Option<&sluice_testkit::changes::Change> = None;
        for c in &r.changes {
            if last.is_some_and(|l| l.pos != c.pos) {
                eprintln!("  tx {} _seq {}", c.pos, c.seq);
            }
            last = Some(c);
        }
        let st = std::fs::read_to_string(to.join("_sluice/stream.json")).unwrap_or_default();
        eprintln!("{st}");
    }
    assert_same_rows(
        &r.rows,
        &want,
        &format!("{table}: snapshot + changes by _seq"),
    );
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_with_multi_table_transactions_during_the_snapshot_is_exact() {
    let mut db = TestDb::new().await;
    create_tables(&mut db, 20_000).await;
    let writer = ChangeWriter::start(&db.url, 20_000).await;
    let to = tempdir();
    let fp = Failpoints::new();
    // The writer commits while the export reads: after its first part, before the others.
    let mut cmd = stream(
        &db.url,
        &["acct", "hist"],
        to.path(),
        &[
            "--until-current",
            "--chunk-size",
            "256KB",
            "--parallel",
            "2",
        ],
    );
    fp.run_paused_at(&mut cmd, "export.after_receipt", writer.wait_for(40))
        .await;
    writer.wait_for(20).await;
    let commits = writer.stop().await;
    run(&mut stream(
        &db.url,
        &["acct", "hist"],
        to.path(),
        &["--until-current"],
    ))
    .ok();
    let (r, h) = assert_acct_and_hist_replay(&mut db, to.path()).await;
    common::assert_writer_changes(&r, commits);
    // One _seq sequence over both tables: no value twice, none missing.
    let mut seqs: Vec<u64> = r.changes.iter().chain(&h.changes).map(|c| c.seq).collect();
    seqs.sort();
    assert_eq!(seqs.first(), Some(&1), "_seq starts at 1");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "_seq has no holes"
    );
    // A transaction's changes in both tables share its _pos.
    let acct_pos: std::collections::HashSet<&String> = r.changes.iter().map(|c| &c.pos).collect();
    assert!(h.changes.iter().any(|c| acct_pos.contains(&c.pos)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_point_of_a_batch_the_restarted_stream_is_exact() {
    let mut db = TestDb::new().await;
    create_tables(&mut db, 10_000).await;
    let writer = ChangeWriter::start(&db.url, 10_000).await;
    let to = tempdir();
    let tables = ["acct", "hist"];
    let small = [
        "--until-current",
        "--batch-bytes",
        "64KB",
        "--chunk-size",
        "128KB",
    ];
    for spec in [
        "export.after_receipt=exit@2",
        "stream.after_flush=exit@1",
        "stream.before_intent=exit@1",
        "stream.after_intent=exit@1",
        "stream.after_files=exit@1",
        "stream.before_confirm=exit@2",
    ] {
        writer.wait_for(30).await;
        let fp = Failpoints::new();
        let mut cmd = stream(&db.url, &tables, to.path(), &small);
        fp.arm(&mut cmd, spec);
        let r = run(&mut cmd);
        assert_ne!(r.code, 0, "{spec}: the run did not die:\n{}", r.stderr);
        assert!(r.stderr.contains("failpoint"), "{spec}: {}", r.stderr);
        if spec.starts_with("export.") {
            assert_eq!(
                state(to.path())["snapshot"]["done"],
                false,
                "the snapshot is unfinished"
            );
        }
    }
    // The interrupted initial snapshot was finished under a second snapshot, whose binary log
    // position the tables it read use (the replay below proves the result exact).
    let st = state(to.path());
    assert_eq!(st["snapshot"]["done"], true);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(to.path().join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["snapshots"].as_array().unwrap().len(),
        2,
        "{manifest}"
    );
    for (name, t) in st["tables"].as_object().unwrap() {
        assert!(t["snapshot_position"].is_string(), "{name}: {st}");
    }
    writer.wait_for(30).await;
    let fp = Failpoints::new();
    let mut cmd = stream(&db.url, &tables, to.path(), &small);
    fp.arm(&mut cmd, "stream.after_files=error@1");
    let r = run(&mut cmd);
    r.ok();
    assert!(r.stderr.contains("restarting the stream"), "{}", r.stderr);
    writer.wait_for(30).await;
    writer.stop().await;
    run(&mut stream(&db.url, &tables, to.path(), &small)).ok();
    let (r, _) = assert_acct_and_hist_replay(&mut db, to.path()).await;
    assert!(r.changes.len() > 100, "only {} changes", r.changes.len());
}

/// Every type the export maps arrives in change files with the export's Arrow type and value:
/// the replayed table equals an export of the table taken afterwards. MINIMAL and NOBLOB row
/// images name the columns they do not carry in `_absent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn types_and_row_images_match_the_export() {
    let mut db = TestDb::new().await;
    db.exec(
        "SET SESSION sql_mode = '';
         CREATE TABLE ty (
           id int unsigned PRIMARY KEY, tu tinyint unsigned, su smallint unsigned,
           mu mediumint unsigned, iu int unsigned, bu bigint unsigned, ti tinyint, mi mediumint,
           d decimal(20,4), dn decimal(50,10), f float, dbl double,
           t time(3), dt datetime(6), ts timestamp(6) NULL DEFAULT NULL, da date, y year,
           j json, e enum('red','green','blue'), s set('a','b','c'),
           b1 bit(1), b10 bit(10), bin binary(4), vb varbinary(10), bl blob,
           l1 varchar(20) CHARACTER SET latin1, txt text) CHARACTER SET utf8mb4;
         INSERT INTO ty (id, tu, txt) VALUES (1, 1, 'in the snapshot');",
    )
    .await;
    let to = tempdir();
    run(&mut stream(
        &db.url,
        &["ty"],
        to.path(),
        &["--until-current"],
    ))
    .ok();
    db.exec(
        "SET SESSION sql_mode = '';
         INSERT INTO ty VALUES
          (2, 255, 65535, 16777215, 4294967295, 18446744073709551615, -128, -8388608,
           -1234567890123456.7891, 1234567890123456789012345678901234567890.0123456789,
           1.5, -2.25e300, '-838:59:59.999', '2024-02-29 23:59:59.123456',
           '2038-01-19 03:14:07.999999', '1000-01-01', 2155,
           '{\"a\": [1, 2.5, \"x\"], \"b\": null}', 'blue', 'a,c', b'1', b'1000000001',
           x'01', x'00ff', REPEAT('blob', 100), 'café €', 'ünïcødé ✓'),
          (3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '00:00:00', '0000-00-00 00:00:00',
           '0000-00-00 00:00:00', '0000-00-00', 0, '[]', '', '', b'0', b'0', x'', x'',
           '', '', ''),
          (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
          (5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, '01:02:03', '2001-02-03 04:05:06',
           '2001-02-03 04:05:06', '2001-02-03', 2001, '{}', 'red', 'b', b'1', b'11', x'0102',
           x'03', 'b', 'x', 'y');
         UPDATE ty SET dn = dn + 1, e = 'green' WHERE id = 2;
         UPDATE ty SET id = 20 WHERE id = 2;
         DELETE FROM ty WHERE id = 4;
         SET SESSION binlog_row_image = 'MINIMAL';
         UPDATE ty SET tu = 7 WHERE id = 5;
         DELETE FROM ty WHERE id = 3;
         SET SESSION binlog_row_image = 'NOBLOB';
         UPDATE ty SET su = 9 WHERE id = 20;
         SET SESSION binlog_row_image = 'FULL';",
    )
    .await;
    run(&mut stream(
        &db.url,
        &["ty"],
        to.path(),
        &["--until-current"],
    ))
    .ok();
    let ds = to.path().join(format!("{}.ty", db.name));
    let r = replay(&ds, &["id"]);
    let out = tempdir();
    common::export(&db.url, out.path(), &["--table", "ty"]).ok();
    let want = row_strings(&dataset_batches(
        &out.path().join(format!("{}.ty", db.name)),
    ));
    assert_same_rows(
        &r.rows,
        &want,
        "replayed change files vs an export of the table",
    );
    let minimal = r
        .changes
        .iter()
        .find(|c| c.op == "update" && c.cells[0] == "5")
        .unwrap();
    assert!(
        minimal.absent.len() > 20 && !minimal.absent.contains(&"tu".to_string()),
        "MINIMAL: only the key and the changed column are carried: {:?}",
        minimal.absent
    );
    let del = r
        .changes
        .iter()
        .find(|c| c.op == "delete" && c.cells[0] == "3")
        .unwrap();
    assert_eq!(
        del.absent.len(),
        26,
        "a MINIMAL delete carries the key only"
    );
    let noblob = r
        .changes
        .iter()
        .find(|c| c.op == "update" && c.cells[0] == "20")
        .unwrap();
    assert!(
        noblob.absent.contains(&"bl".to_string()) && noblob.absent.contains(&"txt".to_string()),
        "NOBLOB: unchanged blobs are absent: {:?}",
        noblob.absent
    );
    let i = noblob.columns.iter().position(|c| c == "bl").unwrap();
    assert_eq!(noblob.cells[i], "∅", "an absent cell holds NULL");
}

/// DDL in the binary log starts a new schema version (a new file); TRUNCATE is a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_starts_a_schema_version_and_truncate_is_a_change() {
    let mut db = TestDb::new().await;
    db.exec("CREATE TABLE sv (id int PRIMARY KEY, a varchar(10)); INSERT INTO sv VALUES (1, 'x');")
        .await;
    let to = tempdir();
    run(&mut stream(
        &db.url,
        &["sv"],
        to.path(),
        &["--until-current"],
    ))
    .ok();
    db.exec(
        "INSERT INTO sv VALUES (2, 'y');
         ALTER TABLE sv ADD COLUMN b int;
         INSERT INTO sv VALUES (3, 'z', 30);
         UPDATE sv SET b = 10 WHERE id = 1;
         TRUNCATE TABLE sv;
         INSERT INTO sv VALUES (4, 'w', 40);",
    )
    .await;
    run(&mut stream(
        &db.url,
        &["sv"],
        to.path(),
        &["--until-current"],
    ))
    .ok();
    let r =
        assert_replay_equals(&mut db, to.path(), "sv", &["id"], "SELECT id, a, b FROM sv").await;
    assert!(r.changes.iter().any(|c| c.op == "truncate"));
    let files = sluice_testkit::changes::change_files(&to.path().join(format!("{}.sv", db.name)));
    assert!(
        files.len() >= 2,
        "a new schema version starts a new file: {files:?}"
    );
    let state = std::fs::read_to_string(to.path().join("_sluice/stream.json")).unwrap();
    assert!(state.contains("\"version\": 2"), "{state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_fix() {
    let mut db = TestDb::new().await;
    let user = format!("u{:08x}", rand::random::<u32>());
    db.exec(&format!(
        "CREATE TABLE nokey (a int, b text);
         CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL);
         INSERT INTO acct VALUES (1, 1);
         CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw';
         GRANT SELECT ON `{db}`.* TO '{user}'@'127.0.0.1';
         CREATE USER '{user}c'@'127.0.0.1' IDENTIFIED BY 'pw';
         GRANT SELECT ON `{db}`.* TO '{user}c'@'127.0.0.1';
         GRANT REPLICATION CLIENT ON *.* TO '{user}c'@'127.0.0.1';",
        db = db.name
    ))
    .await;
    let to = tempdir();
    let r = run(&mut stream(
        &db.url,
        &["nokey"],
        to.path(),
        &["--until-current"],
    ));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("no primary key"), "{}", r.stderr);
    // A table without transactions: refused with the reason, unless the snapshot locks it.
    db.exec(
        "CREATE TABLE plain (id int PRIMARY KEY, v int) ENGINE=MyISAM;
         INSERT INTO plain VALUES (1, 1), (2, 2);",
    )
    .await;
    let r = run(&mut stream(
        &db.url,
        &["acct", "plain"],
        tempdir().path(),
        &["--until-current"],
    ));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("MyISAM table, an engine without transactions")
            && r.stderr.contains("--lock-non-transactional"),
        "{}",
        r.stderr
    );
    let locked = tempdir();
    let flags = ["--until-current", "--lock-non-transactional"];
    run(&mut stream(&db.url, &["plain"], locked.path(), &flags)).ok();
    db.exec("UPDATE plain SET v = 20 WHERE id = 2; INSERT INTO plain VALUES (3, 3);")
        .await;
    run(&mut stream(&db.url, &["plain"], locked.path(), &flags)).ok();
    let r = assert_replay_equals(
        &mut db,
        locked.path(),
        "plain",
        &["id"],
        "SELECT id, v FROM plain",
    )
    .await;
    assert_eq!(r.changes.len(), 2);
    for u in [user.clone(), format!("{user}c")] {
        let url = db.url_as(&u, "pw");
        let r = run(&mut stream(
            &url,
            &["acct"],
            tempdir().path(),
            &["--until-current"],
        ));
        assert_eq!(r.code, 3, "{u}: {}", r.stderr);
        assert!(r.stderr.contains("REPLICATION SLAVE"), "{u}: {}", r.stderr);
    }
    // A statement-based change of a captured table (one session's binlog_format) stops the
    // stream with the fix rather than skipping the rows it cannot see.
    run(&mut stream(
        &db.url,
        &["acct"],
        to.path(),
        &["--until-current"],
    ))
    .ok();
    db.exec(
        "SET SESSION binlog_format = 'STATEMENT';
         INSERT INTO acct VALUES (2, 2);
         SET SESSION binlog_format = 'ROW';",
    )
    .await;
    let r = run(&mut stream(
        &db.url,
        &["acct"],
        to.path(),
        &["--until-current"],
    ));
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("statement-based"), "{}", r.stderr);
    db.exec(&format!(
        "DROP USER '{user}'@'127.0.0.1'; DROP USER '{user}c'@'127.0.0.1';"
    ))
    .await;
}

/// On a server of its own: binlog_format=STATEMENT is refused; then, in ROW format, a stream
/// whose binary log was purged while it was stopped fails saying so and how to start over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_format_and_a_purged_binary_log_are_refused() {
    let (server, url, mut admin) = own_mariadb("binlog_format=STATEMENT\n").await;
    admin
        .query_drop("CREATE DATABASE cdc; CREATE TABLE cdc.t (id int PRIMARY KEY, v int)")
        .await
        .unwrap();
    let to = tempdir();
    let r = run(&mut stream(&url, &["t"], to.path(), &["--until-current"]));
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("binlog_format=ROW"), "{}", r.stderr);
    admin
        .query_drop("SET GLOBAL binlog_format = 'ROW'")
        .await
        .unwrap();
    drop(admin);
    let mut admin = connect(&server.url()).await;
    run(&mut stream(&url, &["t"], to.path(), &["--until-current"])).ok();
    admin
        .query_drop("INSERT INTO cdc.t VALUES (1, 1)")
        .await
        .unwrap();
    // MariaDB keeps a file until its binlog checkpoint is written: rotate and purge until the
    // stream's file is gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        admin.query_drop("FLUSH BINARY LOGS").await.unwrap();
        let file = binlog_file(&mut admin).await;
        admin
            .query_drop(format!("PURGE BINARY LOGS TO '{file}'"))
            .await
            .unwrap();
        let files: Vec<(String, u64)> = admin.query("SHOW BINARY LOGS").await.unwrap();
        if !files.iter().any(|f| f.0.ends_with(".000001")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first binary log file is not purged: {files:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = run(&mut stream(&url, &["t"], to.path(), &["--until-current"]));
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("purged") && r.stderr.contains("--drop"),
        "{}",
        r.stderr
    );
    // The state kept the GTID position, whose transactions after it are gone too (the
    // resume by GTID was refused above); a state without one (file and offset only) is
    // refused the same way.
    let path = to.path().join("_sluice/stream.json");
    let mut st = state(to.path());
    let restart = st["committed"]["restart"].as_str().unwrap().to_string();
    let (plain, gtid) = restart
        .split_once('~')
        .expect("a GTID position in the state");
    assert!(gtid.starts_with("0-1-"), "{restart}");
    st["committed"]["restart"] = plain.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&st).unwrap()).unwrap();
    let r = run(&mut stream(&url, &["t"], to.path(), &["--until-current"]));
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("purged") && r.stderr.contains("--drop"),
        "{}",
        r.stderr
    );
}
