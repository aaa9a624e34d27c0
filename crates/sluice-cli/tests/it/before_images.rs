//! `--before-images` on the schema features real PostgreSQL databases have, with a writer
//! running through the snapshot and after it: cascading foreign keys (the cascaded deletes and
//! key moves), a partitioned table whose rows move between partitions, a generated column, a
//! TOASTed value left unchanged by updates, and a table without a key. Each table's change files
//! replayed over its snapshot equal the table, and every before-image is checked against the
//! row the snapshot and the earlier changes left (the replay's oracle), which for the table
//! without a key is also how its updates and deletes find their row.

use crate::common::{Failpoints, TestDb, run, sluice, tempdir};
use sluice_testkit::changes::{Replayed, assert_replay_equals};
use sluice_testkit::writer::Background;
use std::path::Path;
use std::sync::atomic::Ordering;

const TABLES: [&str; 6] = ["parent", "child", "ev", "gen", "big", "bag"];

fn stream(url: &str, to: &Path, extra: &[&str]) -> std::process::Command {
    let mut c = sluice();
    c.args(["stream", "--source", url, "--to"]).arg(to);
    for t in TABLES {
        c.args(["--table", t]);
    }
    c.args([
        "--before-images",
        "--until-current",
        "--batch-seconds",
        "0.2",
    ])
    .args(extra);
    c
}

/// One transaction touching every table: a child updated, the parent of ten transactions ago
/// deleted (its child cascades), a parent and a child inserted, the previous new parent's key
/// changed (its child follows, ON UPDATE CASCADE), a row moved to the other partition and one updated in place,
/// a generated column's input changed, a TOASTed row's other column updated, a keyless row
/// updated, the one inserted ten transactions ago deleted and one inserted.
fn writer_sql(n: i64) -> String {
    format!(
        "BEGIN;
         UPDATE child SET v = v + 1 WHERE id = {c};
         DELETE FROM parent WHERE id = {p};
         INSERT INTO parent VALUES ({np}, 'p{n}');
         INSERT INTO child VALUES ({nc}, {np}, 0);
         UPDATE parent SET id = {moved} WHERE id = {prev};
         UPDATE ev SET region = 1 - region WHERE id = {e1};
         UPDATE ev SET v = v + 1 WHERE id = {e2};
         UPDATE gen SET a = a + 1 WHERE id = {g};
         UPDATE big SET v = v + 1 WHERE id = {b};
         UPDATE bag SET b = b || 'x' WHERE a = {k1};
         DELETE FROM bag WHERE a = {k2};
         INSERT INTO bag VALUES ({nk}, 'new');
         COMMIT;",
        c = (n * 7) % 300 + 1,
        p = 50_000 + n - 10,
        np = 1_000 + n,
        nc = 10_000 + n,
        moved = 50_000 + n,
        prev = 1_000 + n - 1,
        e1 = (n * 11) % 1_000 + 1,
        e2 = (n * 13) % 1_000 + 1,
        g = n % 50 + 1,
        b = n % 20 + 1,
        k1 = n % 100 + 1,
        k2 = 10_000 + n - 10,
        nk = 10_000 + n,
    )
}

async fn start_writer(url: &str) -> Background {
    let client = sluice_testkit::pg::connect(url).await;
    let w = Background::spawn(|stop, commits| async move {
        while !stop.load(Ordering::Relaxed) {
            let n = commits.load(Ordering::Relaxed) as i64;
            client
                .batch_execute(&writer_sql(n))
                .await
                .expect("a writer transaction");
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    w.wait_for(5).await;
    w
}

/// The replayed rows keeping only `keep` of its columns, sorted (as `want`'s `SELECT`).
fn project(r: &Replayed, keep: &[&str]) -> Vec<String> {
    let idx: Vec<usize> = keep
        .iter()
        .map(|k| {
            r.columns
                .iter()
                .position(|c| c == k)
                .expect("a replayed column")
        })
        .collect();
    let mut rows: Vec<String> = r
        .rows
        .iter()
        .map(|row| {
            let cells: Vec<&str> = row.split('|').collect();
            idx.iter().map(|i| cells[*i]).collect::<Vec<_>>().join("|")
        })
        .collect();
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_images_on_cascades_partitions_generated_toast_and_keyless_tables() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE parent (id int PRIMARY KEY, name text NOT NULL);
         CREATE TABLE child (id int PRIMARY KEY,
                             parent_id int REFERENCES parent ON DELETE CASCADE ON UPDATE CASCADE,
                             v int NOT NULL);
         INSERT INTO parent SELECT g, 'p' || g FROM generate_series(1, 100) g;
         INSERT INTO child SELECT g, (g - 1) % 100 + 1, 0 FROM generate_series(1, 300) g;
         CREATE TABLE ev (id bigint NOT NULL, region int NOT NULL, v int NOT NULL,
                          PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         CREATE TABLE ev_0 PARTITION OF ev FOR VALUES IN (0);
         CREATE TABLE ev_1 PARTITION OF ev FOR VALUES IN (1);
         INSERT INTO ev SELECT g, g % 2, 0 FROM generate_series(1, 1000) g;
         CREATE TABLE gen (id int PRIMARY KEY, a int NOT NULL,
                           b int GENERATED ALWAYS AS (a * 2) STORED);
         INSERT INTO gen (id, a) SELECT g, g FROM generate_series(1, 50) g;
         CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL, body text NOT NULL);
         INSERT INTO big SELECT g, 0, (SELECT string_agg(md5(g::text || k::text), '')
                                       FROM generate_series(1, 600) k)
           FROM generate_series(1, 20) g;
         CREATE TABLE bag (a int NOT NULL, b text NOT NULL);
         INSERT INTO bag SELECT g, 'b' || g FROM generate_series(1, 200) g;
         ALTER TABLE parent REPLICA IDENTITY FULL; ALTER TABLE child REPLICA IDENTITY FULL;
         ALTER TABLE ev REPLICA IDENTITY FULL; ALTER TABLE ev_0 REPLICA IDENTITY FULL;
         ALTER TABLE ev_1 REPLICA IDENTITY FULL; ALTER TABLE gen REPLICA IDENTITY FULL;
         ALTER TABLE big REPLICA IDENTITY FULL; ALTER TABLE bag REPLICA IDENTITY FULL;
         ANALYZE;",
    )
    .await;
    let writer = start_writer(&db.url).await;
    let to = tempdir();
    let fp = Failpoints::new();
    let mut cmd = stream(&db.url, to.path(), &["--chunk-size", "64KB"]);
    fp.run_paused_at(&mut cmd, "export.after_receipt", writer.wait_for(30))
        .await;
    writer.stop_after(30).await;
    run(&mut stream(&db.url, to.path(), &[])).ok();

    let replay = |table: &str, key: &[&str], want: Vec<String>| {
        assert_replay_equals(to.path(), &format!("public.{table}"), key, &want)
    };
    replay(
        "parent",
        &["id"],
        db.row_strings("SELECT id, name FROM parent").await,
    );
    let child = replay(
        "child",
        &["id"],
        db.row_strings("SELECT id, parent_id, v FROM child").await,
    );
    replay(
        "ev",
        &["id", "region"],
        db.row_strings("SELECT id, region, v FROM ev").await,
    );
    let big = replay(
        "big",
        &["id"],
        db.row_strings("SELECT id, v, body FROM big").await,
    );
    replay(
        "bag",
        &["a", "b"],
        db.row_strings("SELECT a, b FROM bag").await,
    );
    // PostgreSQL 15 does not publish generated columns: compare the columns the log carries.
    let gen_dir = to.path().join("public.gen");
    let generated = sluice_testkit::changes::replay(&gen_dir, &["id"]);
    assert_eq!(
        project(&generated, &["id", "a"]),
        db.row_strings("SELECT id, a FROM gen").await
    );

    // The cascaded deletes carry the child's whole old row; the cascaded key moves too.
    let cascaded = child
        .changes
        .iter()
        .filter(|c| c.op == "delete" && c.before.as_ref().is_some_and(|b| b[2] != "∅"))
        .count();
    assert!(
        cascaded > 0,
        "no cascaded delete with its old row: {:?}",
        child
            .changes
            .iter()
            .map(|c| c.op.as_str())
            .collect::<std::collections::BTreeSet<_>>()
    );
    assert!(
        child
            .changes
            .iter()
            .any(|c| c.op == "update" && c.before.as_ref().is_some_and(|b| b[1] != c.cells[1])),
        "no cascaded parent_id update with its old value"
    );
    // An update of `v` leaves the TOASTed body unchanged: it is neither absent nor missing
    // from the old row.
    let update = big
        .changes
        .iter()
        .find(|c| c.op == "update")
        .expect("an update of big");
    assert!(update.absent.is_empty(), "{:?}", update.absent);
    let old = update.before.as_ref().expect("a before-image");
    assert_eq!(
        old[2].len(),
        600 * 32,
        "the whole TOASTed body in the old row"
    );
    run(&mut stream(&db.url, to.path(), &["--drop"])).ok();
}
