//! `sluice stream` from the MariaDB binary log (the test kit's server: log-bin, ROW format):
//! the snapshot hand-off with a writer running multi-table transactions (key updates included),
//! kills at every failpoint of a batch with restarts, the types the export maps, MINIMAL and
//! NOBLOB row images, DDL and TRUNCATE, and refusals (no key, no privilege, statement-based
//! changes, STATEMENT format, a purged binary log). Every check replays the change files over
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
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

async fn create_tables(db: &mut TestDb, rows: i64) {
    db.exec(&tables_sql(rows)).await;
}

/// `acct` with `rows` rows and an empty `hist` (the writer's tables).
fn tables_sql(rows: i64) -> String {
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
struct ChangeWriter;

impl ChangeWriter {
    async fn start(url: &str, rows: i64) -> Background {
        Self::start_from(url, rows, 10_000_000).await
    }

    /// A writer whose inserted keys start at `next` (one after another writer's).
    async fn start_from(url: &str, rows: i64, mut next: i64) -> Background {
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

fn stream(url: &str, tables: &[&str], to: &Path, extra: &[&str]) -> Command {
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

fn state(to: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(to.join("_sluice/stream.json")).unwrap()).unwrap()
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
    fp.arm(&mut cmd, "export.after_receipt=wait@1");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    fp.reached("export.after_receipt", &mut child).await;
    writer.wait_for(40).await;
    fp.release("export.after_receipt");
    let out = common::finish(child);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    writer.wait_for(20).await;
    let commits = writer.stop().await;
    run(&mut stream(
        &db.url,
        &["acct", "hist"],
        to.path(),
        &["--until-current"],
    ))
    .ok();
    let r = assert_replay_equals(
        &mut db,
        to.path(),
        "acct",
        &["id"],
        "SELECT id, v, pad FROM acct",
    )
    .await;
    let h = assert_replay_equals(
        &mut db,
        to.path(),
        "hist",
        &["id"],
        "SELECT id, acct, amount FROM hist",
    )
    .await;
    assert!(
        r.changes.len() as u64 >= commits,
        "{} changes",
        r.changes.len()
    );
    let ops = |op: &str| r.changes.iter().filter(|c| c.op == op).count();
    assert!(ops("insert") > 0 && ops("update") > 0 && ops("delete") > 0);
    let key_updates = r
        .changes
        .windows(2)
        .filter(|w| {
            w[0].op == "delete"
                && w[1].op == "insert"
                && w[0].seq + 1 == w[1].seq
                && w[0].pos == w[1].pos
                && w[1].cells[1] != "-1"
        })
        .count();
    assert!(key_updates > 0, "no key update written as delete + insert");
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
    assert_eq!(
        st["snapshot"]["positions"].as_array().unwrap().len(),
        2,
        "{st}"
    );
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
    let r = assert_replay_equals(
        &mut db,
        to.path(),
        "acct",
        &["id"],
        "SELECT id, v, pad FROM acct",
    )
    .await;
    assert!(r.changes.len() > 100, "only {} changes", r.changes.len());
    assert_replay_equals(
        &mut db,
        to.path(),
        "hist",
        &["id"],
        "SELECT id, acct, amount FROM hist",
    )
    .await;
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
    let server = tokio::task::spawn_blocking(|| {
        sluice_testkit::mariadb::MariadbServer::start_with_settings("binlog_format=STATEMENT\n")
    })
    .await
    .unwrap()
    .expect("a second MariaDB");
    let url = sluice_testkit::mysql::with_database(&server.url(), "cdc");
    let mut admin = connect(&server.url()).await;
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
        let file: String = admin
            .query_first::<mysql_async::Row, _>("SHOW MASTER STATUS")
            .await
            .unwrap()
            .unwrap()
            .get(0)
            .unwrap();
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

/// Purge `admin`'s server's binary log files up to sequence number `seq` (not later ones),
/// retrying while MariaDB keeps them (until its binlog checkpoint passes them).
async fn purge_through(admin: &mut mysql_async::Conn, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let file: String = admin
        .query_first::<mysql_async::Row, _>("SHOW MASTER STATUS")
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap();
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

/// A stream whose saved binary log file was purged while it was stopped (after it had read
/// it) resumes after its saved GTID position in the files that remain: no change lost or
/// repeated, with a writer running before, between and after, and a kill inside a batch right
/// after the switch. Positions read after it start a new epoch, which sorts after the old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_file_resumes_by_gtid_without_gap_or_repeat() {
    let server = tokio::task::spawn_blocking(|| {
        sluice_testkit::mariadb::MariadbServer::start_with_settings("")
    })
    .await
    .unwrap()
    .expect("a second MariaDB");
    let url = sluice_testkit::mysql::with_database(&server.url(), "cdc");
    let mut admin = connect(&server.url()).await;
    admin.query_drop("CREATE DATABASE cdc").await.unwrap();
    let mut c = connect(&url).await;
    c.query_drop(tables_sql(2_000)).await.unwrap();
    let to = tempdir();
    let tables = ["acct", "hist"];
    let small = ["--until-current", "--batch-bytes", "64KB"];
    let writer = ChangeWriter::start(&url, 2_000).await;
    run(&mut stream(&url, &tables, to.path(), &small)).ok();
    writer.wait_for(20).await;
    writer.stop().await;
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
    let fp = Failpoints::new();
    let mut cmd = stream(&url, &tables, to.path(), &small);
    fp.arm(&mut cmd, "stream.after_files=exit@1");
    let r = run(&mut cmd);
    assert_ne!(r.code, 0, "the run did not die:\n{}", r.stderr);
    assert!(
        r.stderr.contains("Resuming after GTID") && r.stderr.contains("failpoint"),
        "{}",
        r.stderr
    );
    writer.wait_for(20).await;
    writer.stop().await;
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
    for (table, select) in [
        ("acct", "SELECT id, v, pad FROM acct"),
        ("hist", "SELECT id, acct, amount FROM hist"),
    ] {
        let r = replay(&to.path().join(format!("cdc.{table}")), &["id"]);
        let want = sluice_testkit::mysql::rows_as_strings(&mut c, select).await;
        assert_same_rows(
            &r.rows,
            &want,
            &format!("{table}: snapshot + changes by _seq"),
        );
        assert!(
            r.changes.iter().any(|c| c.pos.starts_with('g')),
            "{table}: no change read after the switch"
        );
        assert!(r.changes.iter().any(|c| !c.pos.starts_with('g')));
    }
}

/// On an idle server with short idle and network limits: `--until-current` ends at once, with
/// the end of the log (and its GTID position) saved; a running stream with nothing to read
/// keeps its sessions past those limits (heartbeats on the dump, its own idle limit on the
/// others) and writes the next changes, a DDL's new schema version included, without a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_finishes_and_outlives_the_servers_timeouts() {
    let server = tokio::task::spawn_blocking(|| {
        sluice_testkit::mariadb::MariadbServer::start_with_settings(
            "wait_timeout=2\ninteractive_timeout=2\nnet_read_timeout=2\nnet_write_timeout=2\n",
        )
    })
    .await
    .unwrap()
    .expect("a second MariaDB");
    let url = sluice_testkit::mysql::with_database(&server.url(), "cdc");
    let mut admin = connect(&server.url()).await;
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
        run(&mut stream(&url, &["t"], to.path(), &["--until-current"])).ok();
        let restart = state(to.path())["committed"]["restart"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(restart.starts_with(&at_end), "{restart} vs {at_end}");
    }
    let sessions = || async {
        let mut c = connect(&server.url()).await;
        let ids: Vec<u64> = c
            .query(
                "SELECT ID FROM information_schema.PROCESSLIST \
                 WHERE USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1) AND ID <> CONNECTION_ID()",
            )
            .await
            .unwrap();
        c.disconnect().await.unwrap();
        ids.into_iter().collect::<std::collections::BTreeSet<u64>>()
    };
    let mut child = stream(&url, &["t"], to.path(), &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
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
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
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
    writer.wait_for(20).await;
    writer.stop().await;
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
    let fp = Failpoints::new();
    let mut cmd = stream(&on_replica, &tables, to.path(), &small);
    fp.arm(&mut cmd, "stream.after_files=exit@1");
    let r = run(&mut cmd);
    assert_ne!(r.code, 0, "the run did not die:\n{}", r.stderr);
    assert!(
        r.stderr.contains("Resuming after GTID") && r.stderr.contains("failpoint"),
        "{}",
        r.stderr
    );
    writer.wait_for(20).await;
    writer.stop().await;
    run(&mut stream(&on_replica, &tables, to.path(), &small)).ok();
    let mut c = connect(&on_replica).await;
    for (table, select) in [
        ("acct", "SELECT id, v, pad FROM acct"),
        ("hist", "SELECT id, acct, amount FROM hist"),
    ] {
        let r = replay(&to.path().join(format!("cdc.{table}")), &["id"]);
        let want = sluice_testkit::mysql::rows_as_strings(&mut c, select).await;
        assert_same_rows(
            &r.rows,
            &want,
            &format!("{table}: snapshot + changes by _seq"),
        );
        assert!(r.changes.iter().any(|c| c.pos.starts_with('g')));
        assert!(r.changes.iter().any(|c| !c.pos.starts_with('g')));
    }
}
