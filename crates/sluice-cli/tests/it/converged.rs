#![allow(clippy::unwrap_used)]
//! `--consistency converged`: chunks read in short transactions at different times, made equal
//! to the tables at one log position T.
//!
//! The oracle is independent of sluice: a `test_decoding` slot created while nothing writes,
//! with the tables copied at that moment, then the slot's decoded changes up to T (read with
//! `pg_logical_slot_peek_changes`) applied to the copies in commit order. While the export
//! reads its chunks, a writer grows rows (non-HOT updates move them to other pages, so chunks
//! read at different times catch a row twice or not at all), moves keys (`UPDATE … SET id`),
//! deletes and inserts, and inserts into a second table, which the test truncates mid-run; it
//! moves rows between the partitions of a third (whose key includes the partition's column)
//! and updates rows of a fourth without touching their out-of-line (TOAST) documents, which the
//! log then leaves out; a fifth's key is declared in another order than its columns (the log
//! spells keys in the key's order, a part's columns come in the table's); a parent with a
//! generated column (which pgoutput leaves out of the log) has children whose foreign key
//! cascades its deletes and key updates (changes no statement names). Parts hold small row
//! groups, so a part's rewrite both copies row groups without a changed key and encodes the
//! others again.

use crate::common::writer::Background;
use crate::common::*;
use std::sync::atomic::Ordering;

const ROWS: i64 = 40_000;
/// Rows of the partitioned table, whose key is (id, k) and whose partition is k's.
const PT_ROWS: i64 = 10_000;
/// Rows of the table whose documents are stored out of line (TOAST), never updated.
const BIG_ROWS: i64 = 500;
/// Rows of the table whose key is (b, a) while its columns are (a, b, v).
const CK_ROWS: i64 = 5_000;
/// Rows of the parent table with a generated column; each has three children whose foreign
/// key cascades deletes and key updates.
const PAR_ROWS: i64 = 2_000;

/// The writer's changes, one transaction per loop.
fn start_writer(url: &str) -> impl std::future::Future<Output = Background> {
    let url = url.to_string();
    async move {
        let c = sluice_testkit::pg::connect(&url).await;
        let w = Background::spawn(|stop, commits| async move {
            let mut i: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let grow: Vec<String> = (0..10)
                    .map(|k| (((i * 10 + k) * 7919) % ROWS + 1).to_string())
                    .collect();
                let moved = (i * 104_729) % ROWS + 1;
                let gone = (i * 15_485_863) % ROWS + 1;
                c.batch_execute(&format!(
                    "BEGIN;
                     UPDATE conv SET v = v + 1, pad = left(pad || repeat('x', 60), 1200)
                      WHERE id IN ({});
                     UPDATE conv SET id = id + 10000000 WHERE id = {moved};
                     DELETE FROM conv WHERE id = {gone};
                     INSERT INTO conv VALUES ({}, -1, 'new') ON CONFLICT (id) DO UPDATE SET v = -2;
                     INSERT INTO side VALUES ({i}, 'after');
                     UPDATE pt SET v = v + 1 WHERE id = {moved} % {PT_ROWS};
                     UPDATE pt SET k = 1 - k WHERE id = {gone} % {PT_ROWS};
                     UPDATE big SET v = v + 1 WHERE id = {moved} % {BIG_ROWS};
                     UPDATE ck SET v = v + 1 WHERE a = {moved} % {CK_ROWS};
                     UPDATE ck SET b = b || 'x' WHERE a = {gone} % {CK_ROWS};
                     UPDATE par SET v = v + 1 WHERE id = {moved} % {PAR_ROWS};
                     UPDATE par SET id = id + {i}000000 WHERE id = ({moved} + 7) % {PAR_ROWS};
                     DELETE FROM par WHERE id = {gone} % {PAR_ROWS};
                     INSERT INTO par (id, v) VALUES ({gone} % {PAR_ROWS}, -1);
                     INSERT INTO kid SELECT {gone} % {PAR_ROWS} * 10 + k, {gone} % {PAR_ROWS}, -1
                       FROM generate_series(0, 2) k
                       ON CONFLICT (id) DO UPDATE SET par_id = EXCLUDED.par_id, v = -1;
                     COMMIT;",
                    grow.join(","),
                    ROWS + i
                ))
                .await
                .unwrap();
                commits.fetch_add(1, Ordering::Relaxed);
            }
        });
        w.wait_for(5).await;
        w
    }
}

/// The tables and the oracle's starting point, taken while nothing writes.
async fn create(db: &TestDb) {
    db.exec(&format!(
        "CREATE TABLE conv (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL);
         CREATE INDEX ON conv (v);
         INSERT INTO conv SELECT g, 0, md5(g::text) FROM generate_series(1, {ROWS}) g;
         CREATE TABLE side (id bigint PRIMARY KEY, note text);
         INSERT INTO side SELECT -g, 'before' FROM generate_series(1, 5000) g;
         CREATE TABLE pt (id bigint, k int, v int NOT NULL, PRIMARY KEY (id, k))
          PARTITION BY LIST (k);
         CREATE TABLE pt_0 PARTITION OF pt FOR VALUES IN (0);
         CREATE TABLE pt_1 PARTITION OF pt FOR VALUES IN (1);
         INSERT INTO pt SELECT g, g % 2, 0 FROM generate_series(0, {PT_ROWS} - 1) g;
         CREATE TABLE big (id bigint PRIMARY KEY, v int NOT NULL, doc text NOT NULL);
         ALTER TABLE big ALTER doc SET STORAGE EXTERNAL;
         INSERT INTO big SELECT g, 0, repeat(md5(g::text), 100) FROM generate_series(0, {BIG_ROWS} - 1) g;
         CREATE TABLE ck (a int NOT NULL, b text NOT NULL, v int NOT NULL, PRIMARY KEY (b, a));
         INSERT INTO ck SELECT g, 'k' || (g % 7), 0 FROM generate_series(0, {CK_ROWS} - 1) g;
         CREATE TABLE par (id bigint PRIMARY KEY, gen bigint GENERATED ALWAYS AS (id * 2 + v) STORED,
                           v int NOT NULL);
         INSERT INTO par (id, v) SELECT g, 0 FROM generate_series(0, {PAR_ROWS} - 1) g;
         CREATE TABLE kid (id bigint PRIMARY KEY,
                           par_id bigint NOT NULL REFERENCES par ON DELETE CASCADE ON UPDATE CASCADE,
                           v int NOT NULL);
         INSERT INTO kid SELECT g * 10 + k, g, 0
           FROM generate_series(0, {PAR_ROWS} - 1) g, generate_series(0, 2) k;
         ANALYZE;"
    ))
    .await;
    // Slots are the server's, not the database's: named after the database.
    db.exec("SELECT pg_create_logical_replication_slot(current_database() || '_oracle', 'test_decoding')")
        .await;
    db.exec(
        "CREATE TABLE oracle_conv AS SELECT * FROM conv;
         ALTER TABLE oracle_conv ADD PRIMARY KEY (id);
         CREATE TABLE oracle_side AS SELECT * FROM side;
         ALTER TABLE oracle_side ADD PRIMARY KEY (id);
         CREATE TABLE oracle_pt AS SELECT * FROM pt;
         ALTER TABLE oracle_pt ADD PRIMARY KEY (id, k);
         CREATE TABLE oracle_big AS SELECT * FROM big;
         ALTER TABLE oracle_big ADD PRIMARY KEY (id);
         CREATE TABLE oracle_ck AS SELECT * FROM ck;
         ALTER TABLE oracle_ck ADD PRIMARY KEY (b, a);
         CREATE TABLE oracle_par AS SELECT * FROM par;
         ALTER TABLE oracle_par ADD PRIMARY KEY (id);
         CREATE TABLE oracle_kid AS SELECT * FROM kid;
         ALTER TABLE oracle_kid ADD PRIMARY KEY (id);",
    )
    .await;
}

/// A database with the tables and the oracle's start, and the writer going.
async fn tables_under_a_writer() -> (TestDb, Background) {
    let db = TestDb::new().await;
    create(&db).await;
    let writer = start_writer(&db.url).await;
    (db, writer)
}

/// Drop the oracle's slot: slots are the server's, and other tests need theirs.
async fn drop_oracle(db: &TestDb) {
    db.exec("SELECT pg_drop_replication_slot(current_database() || '_oracle')")
        .await;
}

/// One value of a `test_decoding` column (`name[type]:value`) as SQL.
fn value(token: &str) -> (String, String) {
    let (name, rest) = token.split_once('[').unwrap();
    let (_, v) = rest.split_once("]:").unwrap();
    (name.to_string(), v.to_string())
}

/// Apply the oracle slot's changes before `lsn` to the oracle tables — those an earlier call
/// did not apply (they are consumed), so a test may compare at several end points in turn.
async fn replay_to(db: &TestDb, lsn: &str) -> usize {
    // In log order (row_strings would sort them).
    let c = sluice_testkit::pg::connect(&db.url).await;
    let lines: Vec<String> = c
        .query(
            &format!(
                "SELECT data FROM pg_logical_slot_get_changes(current_database() || '_oracle', \
                 '{lsn}'::pg_lsn, NULL)"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let tokens = |t: &str| -> Vec<(String, String)> { t.split(' ').map(value).collect() };
    let matching = |cols: &[(String, String)]| -> String {
        let eqs: Vec<String> = cols.iter().map(|(n, v)| format!("{n} = {v}")).collect();
        eqs.join(" AND ")
    };
    let mut sql = Vec::new();
    for line in &lines {
        let Some(rest) = line.strip_prefix("table public.") else {
            continue;
        };
        let (table, rest) = rest.split_once(": ").unwrap();
        // The partitions' changes are the partitioned table's.
        let (oracle, key) = match table {
            "conv" | "side" | "par" | "kid" => (format!("oracle_{table}"), &["id"][..]),
            "pt_0" | "pt_1" => ("oracle_pt".to_string(), &["id", "k"][..]),
            "big" => ("oracle_big".to_string(), &["id"][..]),
            "ck" => ("oracle_ck".to_string(), &["b", "a"][..]),
            _ => continue,
        };
        let (op, rest) = rest.split_once(':').unwrap();
        let rest = rest.trim();
        match op {
            "INSERT" => {
                let vals: Vec<String> = tokens(rest).into_iter().map(|(_, v)| v).collect();
                sql.push(format!(
                    "INSERT INTO {oracle} VALUES ({});",
                    vals.join(", ")
                ));
            }
            "UPDATE" => {
                let (old, new) = match rest.strip_prefix("old-key: ") {
                    Some(r) => {
                        let (old, new) = r.split_once(" new-tuple: ").unwrap();
                        (Some(tokens(old)), new)
                    }
                    None => (None, rest),
                };
                let cols = tokens(new);
                let old = old.unwrap_or_else(|| {
                    cols.iter()
                        .filter(|(n, _)| key.contains(&n.as_str()))
                        .cloned()
                        .collect()
                });
                // An out-of-line value the update left alone is not in the log.
                let set: Vec<String> = cols
                    .iter()
                    .filter(|(_, v)| v != "unchanged-toast-datum")
                    .map(|(n, v)| format!("{n} = {v}"))
                    .collect();
                sql.push(format!(
                    "UPDATE {oracle} SET {} WHERE {};",
                    set.join(", "),
                    matching(&old)
                ));
            }
            "DELETE" => {
                sql.push(format!(
                    "DELETE FROM {oracle} WHERE {};",
                    matching(&tokens(rest))
                ));
            }
            "TRUNCATE" => sql.push(format!("DELETE FROM {oracle};")),
            other => panic!("unexpected change {other:?} in {line:?}"),
        }
    }
    db.exec(&sql.join("\n")).await;
    sql.len()
}

/// A position as the manifest writes it (16 hex digits) as an LSN (`X/Y`).
fn lsn(pos: &str) -> String {
    let n = u64::from_str_radix(pos, 16).unwrap();
    format!("{:X}/{:X}", n >> 32, n & 0xffff_ffff)
}

/// The columns the oracle compares, per table.
const COLUMNS: [(&str, &str); 7] = [
    ("conv", "id, v, pad"),
    ("side", "id, note"),
    ("pt", "id, k, v"),
    ("big", "id, v, doc"),
    ("ck", "a, b, v"),
    ("par", "id, gen, v"),
    ("kid", "id, par_id, v"),
];

/// Replay the oracle to the end point of the export in `out` (its manifest's `converged.end`),
/// then compare each of `tables` there with the oracle's copy; returns the manifest and the
/// changes replayed.
async fn assert_at_end_point(
    db: &TestDb,
    out: &std::path::Path,
    tables: &[&str],
    what: &str,
) -> (serde_json::Value, usize) {
    let m = files::manifest(out);
    let replayed = replay_to(db, &lsn(m["converged"]["end"].as_str().unwrap())).await;
    for table in tables {
        let (_, columns) = COLUMNS.iter().find(|(t, _)| t == table).unwrap();
        let want = db
            .row_strings(&format!("SELECT {columns} FROM oracle_{table}"))
            .await;
        let got = files::row_strings(&files::dataset_batches(
            &out.join(format!("public.{table}")),
        ));
        files::assert_same_rows(&got, &want, &format!("{what}: {table} vs. the table at T"));
    }
    (m, replayed)
}

/// Slots and publications of this database's converged runs still on the source.
async fn left_on_source(db: &TestDb) -> Vec<String> {
    db.row_strings(
        "SELECT slot_name FROM pg_replication_slots
          WHERE database = current_database() AND slot_name LIKE 'sluice_%'
         UNION ALL SELECT pubname FROM pg_publication",
    )
    .await
}

/// Rounds of the whole scenario (`SLUICE_CONVERGED_ROUNDS`, default 8: a 1-in-10 race shows
/// in more than half of the suite's runs; `bench/converged/stress` runs 50).
fn rounds() -> usize {
    std::env::var("SLUICE_CONVERGED_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(8)
}

#[tokio::test]
async fn converged_output_equals_the_tables_at_its_end_point_under_writes() {
    for round in 0..rounds() {
        let (db, writer) = tables_under_a_writer().await;
        let out = tempdir();
        let args = words(
            "--table conv --table side --table pt --table big --table ck --table par --table kid \
             --consistency converged \
             --parallel 4 --chunk-size 256KB --batch-size 256KB --row-group-size 32KB",
        );
        let paused = harness()
            .paused_at(&db.url, out.path(), &args, "export.after_receipt@2")
            .await;
        // Chunks are being read, each in its own transaction: let the writer work between
        // them, and truncate the side table (the writer goes on inserting into it).
        writer.wait_for(100).await;
        db.exec("TRUNCATE side").await;
        writer.wait_for(50).await;
        paused.release().await.ok();
        let commits = writer.stop().await;

        let tables = COLUMNS.map(|(t, _)| t);
        let (m, replayed) =
            assert_at_end_point(&db, out.path(), &tables, &format!("round {round}")).await;
        assert_eq!(m["consistency"], "converged");
        let c = &m["converged"];
        assert!(replayed > 100, "round {round}: {replayed} changes before T");
        for table in tables {
            let ds = files::manifest_dataset(&m, &format!("public.{table}"));
            assert_eq!(ds["guarantee"]["kind"], "converged", "{ds}");
        }
        // The run meant something: keys changed while it read, parts were rewritten, the
        // writer went on after T, and the side table was truncated during the run.
        assert!(c["changed_keys"].as_u64().unwrap() > 100, "{c}");
        assert!(c["parts_rewritten"].as_u64().unwrap() > 0, "{c}");
        assert!(c["rows_removed"].as_u64().unwrap() > 0, "{c}");
        let encoded = c["reencoded_bytes"].as_u64().unwrap();
        assert!(
            encoded > 0 && encoded <= c["rewritten_bytes"].as_u64().unwrap(),
            "{c}"
        );
        assert_eq!(c["truncated"], serde_json::json!(["public.side"]), "{c}");
        assert!(commits > 150, "{commits}");
        // Nothing is left on the source.
        let left = left_on_source(&db).await;
        assert!(left.is_empty(), "round {round}: left behind {left:?}");
        drop_oracle(&db).await;
    }
}

#[tokio::test]
async fn converged_refuses_what_it_cannot_do_before_writing() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE k (id int PRIMARY KEY, f float8);
         CREATE TABLE nokey (a int);
         CREATE TABLE fkey (f float8 PRIMARY KEY);
         CREATE TABLE gkey (a int NOT NULL, g int GENERATED ALWAYS AS (a * 2) STORED PRIMARY KEY);",
    )
    .await;
    for (args, says) in [
        (
            &["--table", "k", "--format", "csv"][..],
            &["converged writes Parquet only", "--format parquet"][..],
        ),
        (
            &["--table", "nokey"][..],
            &[
                "public.nokey",
                "needs a primary key",
                "--consistency snapshot",
            ][..],
        ),
        (
            &["--table", "fkey"][..],
            &["public.fkey", "key column \"f\"", "cannot be matched"][..],
        ),
        (
            &["--table", "gkey"][..],
            &[
                "public.gkey",
                "generated column \"g\"",
                "--consistency snapshot",
            ][..],
        ),
        (
            &["--query", "q=SELECT 1 AS a"][..],
            &["reads tables only"][..],
        ),
    ] {
        let out = tempdir();
        let mut a = args.to_vec();
        a.extend(["--consistency", "converged"]);
        export(&db.url, out.path(), &a).refused(2, says);
        assert!(
            !out.path().join("_sluice/run.json").exists(),
            "{args:?}: refused after writing its plan"
        );
    }
    let left = left_on_source(&db).await;
    assert!(left.is_empty(), "{left:?}");
}

/// An export with failpoints `spec` armed, paused after a worker's second part while the
/// writer commits 30 transactions (so keys change between chunks) and `during` runs.
async fn while_writing(
    db: &TestDb,
    out: impl AsRef<std::ffi::OsStr>,
    args: &[&str],
    spec: &str,
    writer: &Background,
    during: &str,
) -> Run {
    let fp = Failpoints::new();
    let mut cmd = sluice();
    cmd.args(["export", "--source", &db.url, "--to"])
        .arg(out)
        .args(args);
    let pause = "export.after_receipt=wait@2";
    match spec {
        "" => fp.arm(&mut cmd, pause),
        _ => fp.arm(&mut cmd, &format!("{pause},{spec}")),
    };
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    fp.reached("export.after_receipt", &mut child).await;
    writer.wait_for(30).await;
    if !during.is_empty() {
        db.exec(during).await;
        writer.wait_for(10).await;
    }
    fp.release("export.after_receipt");
    tokio::task::spawn_blocking(move || finish(child).into())
        .await
        .unwrap()
}

/// The export `args` run to its end on a blocking thread, so the writer goes on meanwhile.
async fn export_while_writing(db: &TestDb, out: &std::path::Path, args: &[&str]) -> Run {
    let (url, out) = (db.url.clone(), out.to_path_buf());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        export(&url, &out, &args)
    })
    .await
    .unwrap()
}

/// Killed (as by `kill -9`) in every phase — reading chunks, holding the end point, rewriting
/// parts, before the manifest — or failed in a way a retry may cure: no manifest, the slot
/// kept (the failure says so); `--resume`, with the writer still going, follows the log again
/// from the first run's C, reads only the chunks without a receipt, and converges to the
/// tables at its own end point, leaving nothing on the source. A failed read at the end point
/// is taken again at a later one. A resume whose slot was removed or advanced, whose table was
/// rewritten (VACUUM FULL) or given another primary key since the first run's start, is refused with the
/// way out; an `--overwrite` with snapshot consistency removes the slot the unfinished run kept.
#[tokio::test]
async fn killed_converged_exports_resume_to_the_tables_at_their_end_point() {
    let (db, writer) = tables_under_a_writer().await;
    let base = "--table conv --table side --consistency converged --parallel 2 --chunk-size 256KB";
    let (first, resume) = (format!("{base} --overwrite"), format!("{base} --resume"));
    let (first, resume) = (words(&first), words(&resume));
    let ours = "SELECT slot_name FROM pg_replication_slots
                 WHERE database = current_database() AND slot_name LIKE 'sluice_converged_%'";
    let out = tempdir();
    for point in [
        "export.before_receipt=exit@5",
        "converge.end_point=exit@1",
        "converge.after_rewrite=error@1",
        "converge.after_rewrite=exit@2",
        "export.before_manifest=exit@1",
    ] {
        let run = while_writing(&db, out.path(), &first, point, &writer, "").await;
        assert_ne!(run.code, 0, "{point}: {}", run.stderr);
        if point.contains("error") {
            run.failed(&["for --resume to finish this run", "sluice_converged_"]);
        }
        assert!(!out.path().join("manifest.json").exists(), "{point}");
        assert_eq!(db.row_strings(ours).await.len(), 1, "{point}: the slot");
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.path().join("_sluice/run.json")).unwrap())
                .unwrap();
        let c = state["converged"]["position"].as_str().unwrap().to_string();
        writer.wait_for(30).await;
        let resumed = export_while_writing(&db, out.path(), &resume).await;
        resumed.ok();
        // The first run's parts are kept (pages read in another transaction are as good).
        assert!(
            resumed.stderr.contains(" already done"),
            "{point}: {}",
            resumed.stderr
        );
        let what = format!("{point}, resumed");
        let (m, _) = assert_at_end_point(&db, out.path(), &["conv", "side"], &what).await;
        let conv = &m["converged"];
        assert_eq!(
            conv["start"], c,
            "{point}: followed from the first run's C: {conv}"
        );
        assert!(
            conv["changed_keys"].as_u64().unwrap() > 0,
            "{point}: {conv}"
        );
        assert!(
            db.row_strings(ours).await.is_empty(),
            "{point}: a slot was left"
        );
    }
    // The read at the end point failing (as when a TRUNCATE queues behind its locks): the
    // changed keys are read at a later end point, and the output is the tables at that one.
    let run = while_writing(
        &db,
        out.path(),
        &first,
        "converge.end_point=error@1",
        &writer,
        "",
    )
    .await;
    run.ok().says(&["at a later end point (attempt 2 of 3)"]);
    assert_at_end_point(
        &db,
        out.path(),
        &["conv"],
        "read again at a later end point",
    )
    .await;
    // The slot removed by hand while the run was unfinished: the log from C is gone.
    // An unfinished run: killed at the end point, every chunk read.
    let unfinished = || {
        let end_point = "converge.end_point=exit@1";
        while_writing(&db, out.path(), &first, end_point, &writer, "")
    };
    unfinished().await;
    // Once the server has seen the killed run's session go.
    let idle = format!("{ours} AND NOT active");
    let idle_slot = || async {
        for _ in 0..100 {
            if db.row_strings(&idle).await.len() == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        db.row_strings(&idle).await
    };
    for slot in idle_slot().await {
        db.exec(&format!("SELECT pg_drop_replication_slot('{slot}')"))
            .await;
    }
    assert!(
        db.row_strings(ours).await.is_empty(),
        "the slot was not dropped"
    );
    export(&db.url, out.path(), &resume).refused(2, &["is gone", "--overwrite"]);
    // A table rewritten between the runs: its rows moved unseen by the log.
    unfinished().await;
    db.exec("VACUUM FULL conv").await;
    export_while_writing(&db, out.path(), &resume)
        .await
        .failed(&["public.conv was rewritten", "--overwrite"]);
    assert!(db.row_strings(ours).await.is_empty(), "a slot was left");
    // The slot advanced past C by hand: the server would skip the changes in between.
    unfinished().await;
    for slot in idle_slot().await {
        db.exec(&format!(
            "SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"
        ))
        .await;
    }
    export(&db.url, out.path(), &resume).refused(2, &["was advanced to", "--overwrite"]);
    // A primary key changed between the runs: the parts' rows are matched by the old one.
    unfinished().await;
    db.exec(
        "CREATE UNIQUE INDEX conv_id ON conv (id);
         ALTER TABLE conv DROP CONSTRAINT conv_pkey, ADD PRIMARY KEY (id, v);",
    )
    .await;
    export(&db.url, out.path(), &resume).refused(
        2,
        &[
            "public.conv changed its primary key",
            "(id, v) now",
            "--overwrite",
        ],
    );
    assert_eq!(
        db.row_strings(ours).await.len(),
        1,
        "the refusal kept the slot"
    );
    // Replaced by an export of another consistency: the slot kept for --resume goes too.
    let snapshot = words("--table conv --table side --parallel 2 --overwrite");
    export(&db.url, out.path(), &snapshot)
        .ok()
        .says(&["removed what the replaced unfinished converged export kept"]);
    assert!(db.row_strings(ours).await.is_empty(), "a slot was left");
    writer.stop().await;
    drop_oracle(&db).await;
}

/// A table rewritten or given a column while its chunks are read: the run stops with the
/// reason, leaves no manifest and nothing on the source.
#[tokio::test]
async fn rewrites_and_column_changes_mid_run_stop_a_converged_export() {
    let (db, writer) = tables_under_a_writer().await;
    let args = words("--table conv --consistency converged --parallel 2 --chunk-size 256KB");
    // The plan forecasts what the writer's pace would cost a run.
    let plan = run(sluice().args(["plan", "--source", &db.url]).args(&args));
    plan.ok();
    assert!(
        plan.stdout.contains("converged: public.conv changes")
            && plan.stdout.contains("changed keys"),
        "{}",
        plan.stdout
    );
    for (during, says) in [
        (
            "VACUUM FULL conv",
            &[
                "public.conv was rewritten",
                "VACUUM FULL",
                "Run the export again",
            ][..],
        ),
        (
            "ALTER TABLE conv ADD COLUMN extra int",
            &["public.conv: its columns changed", "Run the export again"][..],
        ),
    ] {
        let out = tempdir();
        let run = while_writing(&db, out.path(), &args, "", &writer, during).await;
        assert_ne!(run.code, 0, "{during}: {}", run.stderr);
        run.failed(says);
        assert!(!out.path().join("manifest.json").exists(), "{during}");
        let left = left_on_source(&db).await;
        assert!(left.is_empty(), "{during}: left behind {left:?}");
    }
    writer.stop().await;
    drop_oracle(&db).await;
}

/// On object stores (S3, GCS and Azure emulators) parts are rewritten through the store: read
/// back in ranges, written again as uploads under the same names, which replace them only when
/// complete.
#[tokio::test]
async fn converged_output_on_object_stores_equals_the_table_at_t() {
    use crate::objstore_common::{download, memory_for};
    use sluice_testkit::objstore::{Store, test_url};
    let (db, writer) = tables_under_a_writer().await;
    for store in [Store::S3, Store::Gcs, Store::Azure] {
        let url = test_url(store);
        let mut args =
            words("--table conv --consistency converged --parallel 2 --chunk-size 256KB");
        args.extend(memory_for(&url));
        while_writing(&db, &url, &args, "", &writer, "").await.ok();
        let local = tempdir();
        download(&url, local.path()).await;
        let what = format!("{store:?}");
        let (m, _) = assert_at_end_point(&db, local.path(), &["conv"], &what).await;
        let c = &m["converged"];
        assert!(c["parts_rewritten"].as_u64().unwrap() > 0, "{what}: {c}");
    }
    writer.stop().await;
    drop_oracle(&db).await;
}

/// A session left idle in a transaction that holds an id when the run starts: a logical
/// slot's creation waits for it to end. The run says which session it waits for and what
/// ends the wait, then goes on once it is committed, to the tables at its end point.
#[tokio::test]
async fn a_slot_waiting_for_an_open_transaction_names_it_then_goes_on_or_gives_up_at_slot_wait() {
    let (db, writer) = tables_under_a_writer().await;
    let open = sluice_testkit::pg::connect(&db.url).await;
    open.batch_execute(
        "SET application_name = 'left_open';
         BEGIN;
         UPDATE side SET note = note WHERE id = -1;",
    )
    .await
    .unwrap();
    let pid: i32 = open
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let out = tempdir();
    let log = out.path().join("stderr.txt");
    let mut child = sluice()
        .args(["export", "--source", &db.url, "--to"])
        .arg(out.path().join("export"))
        .args(words(
            "--table conv --consistency converged --parallel 2 --chunk-size 256KB",
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let said = |needle: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(needle)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !said("transactions that were running when it began") {
        assert!(child.try_wait().unwrap().is_none(), "ended while waiting");
        assert!(
            std::time::Instant::now() < deadline,
            "the wait was never named"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        said(&format!("pid {pid} ")) && said("\"left_open\"") && said("idle in transaction"),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    open.batch_execute("COMMIT").await.unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    writer.stop().await;
    assert_at_end_point(&db, &out.path().join("export"), &["conv"], "after the wait").await;
    drop_oracle(&db).await;
    // With --slot-wait the wait is given up past it, naming the transaction, and nothing is
    // left on the source — not even once the transaction ends.
    open.batch_execute("BEGIN; UPDATE side SET note = note WHERE id = -1;")
        .await
        .unwrap();
    let bounded = tempdir();
    export(
        &db.url,
        bounded.path(),
        &words("--table conv --consistency converged --slot-wait 2s"),
    )
    .failed(&[
        "waited 2 s (--slot-wait)",
        &format!("pid {pid} "),
        "no slot is left",
    ]);
    open.batch_execute("COMMIT").await.unwrap();
    // Once no session of the run is left (a creation still waiting would finish now).
    let senders = "SELECT pid::text FROM pg_stat_activity
                    WHERE backend_type = 'walsender' AND datname = current_database()";
    for _ in 0..100 {
        if db.row_strings(senders).await.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let left = left_on_source(&db).await;
    assert!(left.is_empty(), "left behind {left:?}");
}
