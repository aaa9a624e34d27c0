#![allow(clippy::unwrap_used)]
//! `--consistency converged` on MariaDB with the schema features real databases have, under a
//! writer: a parent with a virtual generated column and large values, a child with a
//! two-column key whose foreign key has no action (the writer deletes children before their
//! parent; its changed keys are read again as a list of rows), a table partitioned
//! by hash whose keys move between partitions, and the writer's `ops` log. The oracle is the
//! initial rows with exactly the exported `ops` replayed by the writer's rule (computed here,
//! not by sluice). A child whose key cascades is refused: InnoDB writes the rows its action
//! changes to no binary log.

use super::converged_mariadb::{del_in, each_transaction, mv_in, upd_in};
use crate::common::writer::Background;
use crate::common::{Failpoints, files, run, sluice, tempdir};
use sluice_testkit::mysql::TestDb;
use std::collections::BTreeMap;

const M: i64 = 3000;
const MOVED: i64 = 10_000_000;

fn upd(i: i64) -> i64 {
    upd_in(M, i)
}
fn mv(i: i64) -> i64 {
    mv_in(M, i)
}
fn del(i: i64) -> i64 {
    del_in(M, i)
}
fn gone(i: i64) -> i64 {
    (i * 17) % M + 1
}
fn big(i: i64) -> i64 {
    (i * 31) % M + 1
}

/// A large value by the letter it repeats and its length (the rows are compared as
/// `letter×length`).
fn large(letter: char, len: i64) -> String {
    format!("{letter}×{len}")
}

/// The tables after the writer's transactions `1..=k`: `(par, kid, pt)` as sorted row strings.
fn replayed(k: i64) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut par: BTreeMap<i64, (String, Option<String>)> = (1..=M)
        .map(|n| {
            (
                n,
                (format!("n{n}"), (n % 100 == 0).then(|| large('b', 40_000))),
            )
        })
        .collect();
    let mut kid: BTreeMap<i64, (i64, i64)> = (1..=M).map(|n| (n, (n, 0))).collect();
    let mut pt: BTreeMap<i64, i64> = (1..=M).map(|n| (n, 0)).collect();
    for i in 1..=k {
        if let Some(v) = pt.get_mut(&upd(i)) {
            *v += 1;
        }
        if let Some(v) = pt.remove(&mv(i)) {
            pt.insert(mv(i) + MOVED * i, v);
        }
        pt.remove(&del(i));
        pt.insert(M + i, -1);
        kid.retain(|_, (p, _)| *p != gone(i));
        par.remove(&gone(i));
        par.insert(M + i, ("new".into(), Some(large('L', 70_000))));
        kid.insert(M + i, (M + i, i));
        if let Some(r) = par.get_mut(&big(i)) {
            let letter = char::from(b'A' + (i % 26) as u8);
            r.1 = Some(large(letter, 50_000 + i));
        }
    }
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    (
        sorted(
            par.into_iter()
                .map(|(id, (name, b))| {
                    format!("{id}|{name}|{}|{}", id * 2, b.unwrap_or("∅".into()))
                })
                .collect(),
        ),
        sorted(
            kid.into_iter()
                .map(|(id, (p, n))| format!("{id}|{p}|{n}"))
                .collect(),
        ),
        sorted(
            pt.into_iter()
                .map(|(id, v)| format!("{id}|{v}|{}", id * 3))
                .collect(),
        ),
    )
}

/// `par`'s exported rows with the large value shown as `letter×length`.
fn shown(rows: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = rows
        .into_iter()
        .map(|r| {
            let (head, b) = r.rsplit_once('|').unwrap();
            match b.chars().next() {
                Some(c) if b != "∅" => format!("{head}|{}", large(c, b.chars().count() as i64)),
                _ => r,
            }
        })
        .collect();
    out.sort();
    out
}

async fn create(db: &mut TestDb, action: &str) {
    db.exec(&format!(
        "SET SESSION max_recursive_iterations = 1000000;
         CREATE TABLE par (id bigint PRIMARY KEY, name varchar(40) NOT NULL,
           twice bigint AS (id * 2) VIRTUAL, big longtext);
         CREATE TABLE kid (id bigint, par_id bigint NOT NULL, n int NOT NULL,
           PRIMARY KEY (id, par_id),
           CONSTRAINT kid_par FOREIGN KEY (par_id) REFERENCES par (id) {action});
         CREATE TABLE pt (id bigint PRIMARY KEY, v int NOT NULL,
           thrice bigint AS (id * 3) STORED) PARTITION BY HASH (id) PARTITIONS 4;
         CREATE TABLE ops (seq bigint PRIMARY KEY);
         INSERT INTO par (id, name, big)
           WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {M})
           SELECT n, CONCAT('n', n), IF(n % 100 = 0, REPEAT('b', 40000), NULL) FROM g;
         INSERT INTO kid SELECT id, id, 0 FROM par;
         INSERT INTO pt (id, v) SELECT id, 0 FROM par;
         ANALYZE TABLE par, kid, pt;"
    ))
    .await;
}

fn start_writer(url: &str) -> Background {
    each_transaction(url, |i| {
        let letter = char::from(b'A' + (i % 26) as u8);
        format!(
            "START TRANSACTION;
             UPDATE pt SET v = v + 1 WHERE id = {};
             UPDATE pt SET id = id + {} WHERE id = {};
             DELETE FROM pt WHERE id = {};
             INSERT INTO pt (id, v) VALUES ({}, -1);
             DELETE FROM kid WHERE par_id = {g};
             DELETE FROM par WHERE id = {g};
             INSERT INTO par (id, name, big) VALUES ({n}, 'new', REPEAT('L', 70000));
             INSERT INTO kid VALUES ({n}, {n}, {i});
             UPDATE par SET big = REPEAT('{letter}', {}) WHERE id = {};
             INSERT INTO ops VALUES ({i});
             COMMIT;",
            upd(i),
            MOVED * i,
            mv(i),
            del(i),
            M + i,
            50_000 + i,
            big(i),
            g = gone(i),
            n = M + i,
        )
    })
}

fn export(db: &TestDb, consistency: &str, dir: &std::path::Path) -> std::process::Command {
    let mut cmd = sluice();
    cmd.args(["export", "--source", &db.url]);
    for t in ["par", "kid", "pt", "ops"] {
        cmd.args(["--table", t]);
    }
    cmd.args(["--consistency", consistency, "--parallel", "4"])
        .args(["--chunk-size", "256KB", "--row-group-size", "64KB", "--to"])
        .arg(dir);
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn converged_output_equals_generated_partitioned_and_related_tables_at_one_point() {
    for round in 0..super::converged_mariadb::rounds() {
        equal_at_one_point(round).await;
    }
}

async fn equal_at_one_point(round: usize) {
    let mut db = TestDb::new().await;
    create(&mut db, "").await;
    let writer = start_writer(&db.url);
    writer.wait_for(20).await;
    let out = tempdir();
    let dir = out.path().join("data");
    let fp = Failpoints::new();
    // The writer commits between the chunks' transactions.
    fp.run_paused_at(
        &mut export(&db, "converged", &dir),
        "export.after_receipt",
        writer.wait_for(60),
    )
    .await;
    writer.stop().await;
    let rows = |t: &str| {
        files::row_strings(&files::dataset_batches(
            &dir.join(format!("{}.{t}", db.name)),
        ))
    };
    let seen = rows("ops").len() as i64;
    let (par, kid, pt) = replayed(seen);
    let what = |t: &str| format!("round {round}: {t} vs. the replayed ops");
    files::assert_same_rows(&shown(rows("par")), &par, &what("par"));
    files::assert_same_rows(&rows("kid"), &kid, &what("kid"));
    files::assert_same_rows(&rows("pt"), &pt, &what("pt"));
    let m = files::manifest(&dir);
    let c = &m["converged"];
    assert!(c["changed_keys"].as_u64().unwrap() > 100, "{c}");
    assert!(c["parts_rewritten"].as_u64().unwrap() > 0, "{c}");
    assert!(seen > 60, "round {round}: {seen} transactions before T");
}

/// `sluice stream --consistency converged` on the same tables: the snapshot converges, the
/// change files follow from its end point, and replayed over it they equal each table.
#[tokio::test(flavor = "multi_thread")]
async fn a_converged_stream_of_these_tables_hands_off_after_its_end_point() {
    let mut db = TestDb::new().await;
    create(&mut db, "").await;
    let writer = start_writer(&db.url);
    let out = tempdir();
    let stream = || {
        let mut cmd = sluice();
        cmd.args(["stream", "--source", &db.url]);
        for t in ["par", "kid", "pt"] {
            cmd.args(["--table", t]);
        }
        cmd.arg("--to")
            .arg(out.path())
            .args(["--consistency", "converged", "--parallel", "2"])
            .args(["--chunk-size", "128KB", "--until-current"])
            .args(["--batch-seconds", "0.2"]);
        cmd
    };
    let fp = Failpoints::new();
    fp.run_paused_at(&mut stream(), "export.after_receipt", writer.wait_for(60))
        .await;
    writer.stop().await;
    run(&mut stream()).ok();
    let m = files::manifest(out.path());
    assert!(m["converged"]["changed_keys"].as_u64().unwrap() > 60, "{m}");
    for (t, columns) in [
        ("par", "id, name, twice, big"),
        ("kid", "id, par_id, n"),
        ("pt", "id, v, thrice"),
    ] {
        let want = db.row_strings(&format!("SELECT {columns} FROM {t}")).await;
        let r = sluice_testkit::changes::assert_replay_equals(
            out.path(),
            &format!("{}.{t}", db.name),
            &["id"],
            &want,
        );
        assert!(!r.changes.is_empty(), "{t}: no change after T");
    }
}

/// A child whose foreign key deletes it with its parent: the binary log never says which of
/// its rows the action removed, so a converged export is refused up front, naming the key and
/// the fallback — and nothing is written, on the source or in the output.
#[tokio::test(flavor = "multi_thread")]
async fn a_child_of_a_cascading_key_is_refused_for_converged() {
    let mut db = TestDb::new().await;
    create(&mut db, "ON DELETE CASCADE").await;
    let out = tempdir();
    let dir = out.path().join("data");
    let r = run(&mut export(&db, "converged", &dir));
    r.refused(2, &["kid_par", "--consistency snapshot", "binary log"]);
    assert!(
        files::part_files(out.path(), "parquet").is_empty(),
        "nothing written"
    );
    // The same tables export exactly under one snapshot.
    run(&mut export(&db, "snapshot", &dir)).ok();
    let want = db.row_strings("SELECT id, par_id, n FROM kid").await;
    let got = files::row_strings(&files::dataset_batches(
        &dir.join(format!("{}.kid", db.name)),
    ));
    files::assert_same_rows(&got, &want, "kid under --consistency snapshot");
}
