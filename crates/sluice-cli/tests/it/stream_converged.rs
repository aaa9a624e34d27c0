#![allow(clippy::unwrap_used)]
//! `sluice stream --consistency converged`: the initial snapshot read chunk by chunk, each in a
//! short transaction, while a writer grows rows (moving them between pages), moves keys,
//! deletes and inserts; made one point in time T from the stream's own slot; and the change
//! files from T on. Replayed over the snapshot, the files equal the table (a change before T
//! written too, or one after T missing, would show); the stream makes no second slot and
//! leaves none but its own. What a converged snapshot cannot do is refused before the slot
//! exists.

use crate::common::writer::Background;
use crate::common::{Failpoints, TestDb, files, run, tempdir};
use crate::stream::{assert_replay_equals_table, create_acct, slots_and_publications, stream};
use std::sync::atomic::Ordering;

const ROWS: i64 = 20_000;

/// A converged initial snapshot in small chunks, read by two workers, then the changes up to
/// the position current at the start.
const ARGS: [&str; 7] = [
    "--consistency",
    "converged",
    "--parallel",
    "2",
    "--chunk-size",
    "64KB",
    "--until-current",
];

/// Transactions that move rows between pages and change keys, one per loop.
async fn writer(url: &str) -> Background {
    let c = sluice_testkit::pg::connect(url).await;
    let w = Background::spawn(|stop, commits| async move {
        let mut i: i64 = 0;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let grow: Vec<String> = (0..10)
                .map(|k| (((i * 10 + k) * 7919) % ROWS + 1).to_string())
                .collect();
            c.batch_execute(&format!(
                "BEGIN;
                 UPDATE acct SET v = v + 1, pad = left(pad || repeat('x', 60), 1200)
                  WHERE id IN ({});
                 UPDATE acct SET id = nextval('acct_new') WHERE id = {};
                 DELETE FROM acct WHERE id = {};
                 INSERT INTO acct VALUES (nextval('acct_new'), -1, 'new');
                 COMMIT;",
                grow.join(","),
                (i * 104_729) % ROWS + 1,
                (i * 15_485_863) % ROWS + 1,
            ))
            .await
            .unwrap();
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    w.wait_for(5).await;
    w
}

#[tokio::test(flavor = "multi_thread")]
async fn a_converged_initial_snapshot_hands_off_to_the_changes_after_its_end_point() {
    let db = TestDb::new().await;
    create_acct(&db, ROWS).await;
    let w = writer(&db.url).await;
    let to = tempdir();
    let fp = Failpoints::new();
    // The writer commits between the snapshot's chunks.
    let mut cmd = stream(&db.url, to.path(), &ARGS);
    let first = fp
        .run_paused_at(&mut cmd, "export.after_receipt", w.wait_for(60))
        .await;
    let said = String::from_utf8_lossy(&first.stderr).to_string();
    let commits = w.stop().await;
    // Everything the writer committed after the first run's end.
    run(&mut stream(&db.url, to.path(), &ARGS)).ok();

    let m = files::manifest(to.path());
    assert_eq!(m["consistency"], "converged", "{m}");
    let c = &m["converged"];
    assert!(c["changed_keys"].as_u64().unwrap() > 0, "{c}");
    assert!(c["parts_rewritten"].as_u64().unwrap() > 0, "{c}");
    let r = assert_replay_equals_table(&db, to.path()).await;
    assert!(!r.changes.is_empty(), "no change after T: {said}");
    assert!(commits > 60, "{commits}");
    // One slot, the stream's: the snapshot followed it rather than a slot of its own.
    assert_eq!(slots_and_publications(&db).await, (1, 1));
    run(&mut stream(&db.url, to.path(), &["--drop"])).ok();
    assert_eq!(slots_and_publications(&db).await, (0, 0));
}

/// Killed while reading chunks, holding the end point, rewriting parts or before the
/// manifest, with the writer going: run again, the snapshot resumes on the stream's slot from
/// its C (only the chunks without a receipt are read), converges at a later T, and the changes
/// follow from that T.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_converged_snapshot_resumes_on_the_streams_slot() {
    for point in [
        "export.before_receipt=exit@4",
        "converge.end_point=exit@1",
        "converge.after_rewrite=exit@1",
        "export.before_manifest=exit@1",
    ] {
        let db = TestDb::new().await;
        create_acct(&db, ROWS).await;
        let w = writer(&db.url).await;
        let to = tempdir();
        let fp = Failpoints::new();
        let mut cmd = stream(&db.url, to.path(), &ARGS);
        fp.arm(&mut cmd, point);
        let killed = run(&mut cmd);
        assert_ne!(killed.code, 0, "{point}: {}", killed.stderr);
        let state = files::json(&to.path().join("_sluice/run.json"));
        let c = state["converged"]["position"].as_str().unwrap().to_string();
        w.wait_for(30).await;
        let resumed = run(&mut stream(&db.url, to.path(), &ARGS));
        resumed.ok();
        // Followed from the first run's C, on the stream's slot.
        let m = files::manifest(to.path());
        assert_eq!(m["converged"]["start"], c, "{point}");
        assert!(
            resumed
                .stdout
                .contains("the changes follow from that position")
                || resumed
                    .stderr
                    .contains("the changes follow from that position"),
            "{point}: {}",
            resumed.stderr
        );
        w.stop().await;
        run(&mut stream(&db.url, to.path(), &ARGS)).ok();
        assert_replay_equals_table(&db, to.path()).await;
        assert_eq!(slots_and_publications(&db).await, (1, 1), "{point}");
        run(&mut stream(&db.url, to.path(), &["--drop"])).ok();
    }
}

#[tokio::test]
async fn what_a_converged_snapshot_cannot_do_is_refused_before_the_slot_exists() {
    let db = TestDb::new().await;
    create_acct(&db, 100).await;
    db.exec("CREATE TABLE nokey (a int); INSERT INTO nokey VALUES (1);")
        .await;
    let to = tempdir();
    for (args, says) in [
        (
            &["--initial", "none"][..],
            &["--consistency converged", "--initial none"][..],
        ),
        (&["--format", "csv"][..], &["--format parquet"][..]),
        (
            &["--table", "public.nokey"][..],
            &["public.nokey", "needs a primary key"][..],
        ),
    ] {
        let mut a = vec!["--consistency", "converged", "--until-current"];
        a.extend_from_slice(args);
        run(&mut stream(&db.url, to.path(), &a)).refused(2, says);
        assert_eq!(slots_and_publications(&db).await, (0, 0), "{args:?}");
    }
}

/// The same hand-off on the schema features real databases have: a table partitioned by
/// range whose rows move between partitions, and a parent whose deletes and key updates
/// cascade into a child (changes no statement names). Replayed over the snapshot, each
/// table's change files equal it.
#[tokio::test(flavor = "multi_thread")]
async fn a_converged_snapshot_of_partitions_and_cascading_keys_hands_off_at_its_end_point() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE pt (id bigint, k int, v int NOT NULL, PRIMARY KEY (id, k))
           PARTITION BY RANGE (k);
         CREATE TABLE pt_low PARTITION OF pt FOR VALUES FROM (0) TO (50);
         CREATE TABLE pt_high PARTITION OF pt FOR VALUES FROM (50) TO (100);
         INSERT INTO pt SELECT g, g % 100, 0 FROM generate_series(1, 10000) g;
         CREATE TABLE par (id bigint PRIMARY KEY, name text NOT NULL);
         CREATE TABLE kid (id bigint PRIMARY KEY, n int NOT NULL,
           par_id bigint NOT NULL REFERENCES par (id) ON DELETE CASCADE ON UPDATE CASCADE);
         INSERT INTO par SELECT g, 'n' || g FROM generate_series(1, 3000) g;
         INSERT INTO kid SELECT g, 0, g FROM generate_series(1, 3000) g;
         ANALYZE pt, par, kid;",
    )
    .await;
    let c = sluice_testkit::pg::connect(&db.url).await;
    let w = Background::spawn(|stop, commits| async move {
        let mut i: i64 = 0;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            c.batch_execute(&format!(
                "BEGIN;
                 UPDATE pt SET k = (k + 50) % 100 WHERE id = {};
                 UPDATE pt SET v = v + 1 WHERE id = {};
                 DELETE FROM par WHERE id = {};
                 UPDATE par SET id = id + {} WHERE id = {};
                 INSERT INTO par VALUES ({n}, 'new');
                 INSERT INTO kid VALUES ({n}, {i}, {n});
                 COMMIT;",
                (i * 7919) % 10_000 + 1,
                (i * 104_729) % 10_000 + 1,
                (i * 13) % 3000 + 1,
                10_000_000 * i,
                (i * 31) % 3000 + 1,
                n = 3000 + i,
            ))
            .await
            .unwrap();
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    w.wait_for(5).await;
    let to = tempdir();
    let cmd = || {
        let mut c = crate::common::stream(&db.url, "public.pt", to.path());
        c.args(["--table", "public.par", "--table", "public.kid"])
            .args(["--batch-seconds", "0.2"])
            .args(ARGS);
        c
    };
    let fp = Failpoints::new();
    fp.run_paused_at(&mut cmd(), "export.after_receipt", w.wait_for(60))
        .await;
    w.stop().await;
    run(&mut cmd()).ok();
    let m = files::manifest(to.path());
    assert!(m["converged"]["changed_keys"].as_u64().unwrap() > 60, "{m}");
    for (t, key, select) in [
        ("pt", &["id", "k"][..], "SELECT id, k, v FROM pt"),
        ("par", &["id"][..], "SELECT id, name FROM par"),
        ("kid", &["id"][..], "SELECT id, n, par_id FROM kid"),
    ] {
        let want = db.row_strings(select).await;
        let r = sluice_testkit::changes::assert_replay_equals(
            to.path(),
            &format!("public.{t}"),
            key,
            &want,
        );
        assert!(!r.changes.is_empty(), "{t}: no change after T");
    }
    run(crate::common::stream(&db.url, "public.pt", to.path()).arg("--drop")).ok();
}
