//! `sluice stream` from the MariaDB binary log (the test kit's server: log-bin, ROW format),
//! what only MySQL/MariaDB has: the types the export maps, MINIMAL and NOBLOB row images, and
//! refusals (no key, a table without transactions, no privilege, statement-based changes,
//! STATEMENT format, a purged binary log, with and without its GTID position). The scenarios
//! every change source passes (hand-off with a writer running multi-table transactions, kills
//! at every failpoint of a batch, DDL, TRUNCATE, `--initial none`) are `capture_suite`'s
//! MariaDB rows; resumes by GTID and idle streams: `mysql_positions`. The writer and the
//! helpers here are shared with `mysql_positions`, `stream_formats` and `stream_layouts`.

use crate::common::writer::Background;
use crate::common::{self, Run, run, sluice, tempdir};
use mysql_async::prelude::Queryable;
use sluice_testkit::capture::{self, Engine};
use sluice_testkit::changes::replay;
use sluice_testkit::files::{assert_same_rows, dataset_batches, row_strings};
use sluice_testkit::mysql::{TestDb, connect};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `acct` with `rows` rows and an empty `hist` (the writer's tables; the capture suite's).
pub(crate) fn tables_sql(rows: i64) -> String {
    capture::tables_sql(Engine::Mariadb, rows)
}

/// The capture suite's writer of multi-table transactions on MariaDB: updates, a delete, an
/// insert and a key update of `acct`, and an insert (sometimes a delete) in `hist`.
pub(crate) struct ChangeWriter;

impl ChangeWriter {
    pub(crate) async fn start(url: &str, rows: i64) -> Background {
        Self::start_from(url, rows, 10_000_000).await
    }

    /// A writer whose inserted keys start at `next` (one after another writer's).
    pub(crate) async fn start_from(url: &str, rows: i64, next: i64) -> Background {
        capture::start_writer(Engine::Mariadb, url, rows, next).await
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

/// `sluice stream --until-current` of `tables` from `url` into `to`, run to its end.
pub(crate) fn until_current(url: &str, tables: &[&str], to: &Path) -> Run {
    run(&mut stream(url, tables, to, &["--until-current"]))
}

pub(crate) fn state(to: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(to.join("_sluice/stream.json")).unwrap()).unwrap()
}

async fn assert_replay_equals(
    db: &mut TestDb,
    to: &Path,
    table: &str,
    key: &[&str],
    select: &str,
) -> sluice_testkit::changes::Replayed {
    let want = db.row_strings(select).await;
    sluice_testkit::changes::assert_replay_equals(to, &format!("{}.{table}", db.name), key, &want)
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
    until_current(&db.url, &["ty"], to.path()).ok();
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
    until_current(&db.url, &["ty"], to.path()).ok();
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
    let r = until_current(&db.url, &["nokey"], to.path());
    r.refused(2, &["no primary key"]);
    // A table without transactions: refused with the reason, unless the snapshot locks it.
    db.exec(
        "CREATE TABLE plain (id int PRIMARY KEY, v int) ENGINE=MyISAM;
         INSERT INTO plain VALUES (1, 1), (2, 2);",
    )
    .await;
    let r = until_current(&db.url, &["acct", "plain"], tempdir().path());
    r.refused(
        2,
        &[
            "MyISAM table, an engine without transactions",
            "--lock-non-transactional",
        ],
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
        let r = until_current(&url, &["acct"], tempdir().path());
        assert_eq!(r.code, 3, "{u}: {}", r.stderr);
        assert!(r.stderr.contains("REPLICATION SLAVE"), "{u}: {}", r.stderr);
    }
    // A statement-based change of a captured table (one session's binlog_format) stops the
    // stream with the fix rather than skipping the rows it cannot see.
    until_current(&db.url, &["acct"], to.path()).ok();
    db.exec(
        "SET SESSION binlog_format = 'STATEMENT';
         INSERT INTO acct VALUES (2, 2);
         SET SESSION binlog_format = 'ROW';",
    )
    .await;
    let r = until_current(&db.url, &["acct"], to.path());
    r.failed(&["statement-based"]);
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
    let r = until_current(&url, &["t"], to.path());
    r.refused(3, &["binlog_format=ROW"]);
    admin
        .query_drop("SET GLOBAL binlog_format = 'ROW'")
        .await
        .unwrap();
    drop(admin);
    let mut admin = connect(&server.url()).await;
    until_current(&url, &["t"], to.path()).ok();
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
    let r = until_current(&url, &["t"], to.path());
    r.failed(&["purged", "--drop"]);
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
    let r = until_current(&url, &["t"], to.path());
    r.failed(&["purged", "--drop"]);
}
