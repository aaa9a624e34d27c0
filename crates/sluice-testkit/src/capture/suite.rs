//! The scenarios of change capture, each written once for every engine (see [`super`]). Each
//! ends by comparing the replayed change files with the source table; moments are placed with
//! failpoints, and the writer's progress is counted in commits, never waited for in time.

pub use super::lake::delta_table;
pub use super::tables::{dropped_table, new_table};
use super::{ACCT, Capture, Engine, HIST, assert_writer_changes, state};
use crate::process::{self, Failpoints, files_under};
use crate::scenario::Sluice;
use std::collections::HashSet;

/// The writer's two tables, streamed together so that one transaction spans both.
const TABLES: [&str; 2] = ["acct", "hist"];

/// A table's schema versions in the stream state, as `(version, since_seq, columns)`.
fn version_history(versions: &[serde_json::Value]) -> Vec<(u64, u64, usize)> {
    versions
        .iter()
        .map(|v| {
            (
                v["version"].as_u64().unwrap_or(0),
                v["since_seq"].as_u64().unwrap_or(0),
                v["columns"].as_array().map_or(0, Vec::len),
            )
        })
        .collect()
}

/// A database of `engine` with the writer's tables of `rows` accounts, the writer running
/// (five commits in), and an empty output directory.
async fn running(
    sluice: &Sluice,
    engine: Engine,
    rows: i64,
) -> (Capture, super::Background, tempfile::TempDir) {
    let mut src = Capture::new(sluice, engine).await;
    src.create_accounts(rows).await;
    let writer = src.start_writer(rows).await;
    (src, writer, process::tempdir())
}

/// A writer commits multi-table transactions (updates, deletes, inserts, key updates) while
/// the initial snapshot reads (the run waits after its first part until 40 more commits):
/// the snapshot plus the changes replayed equal both tables; `_seq` runs from 1 without a
/// hole over both; a transaction's changes in both tables share its `_pos`; `--drop` leaves
/// nothing on the server.
pub async fn handoff(sluice: &Sluice, engine: Engine) {
    let (mut src, writer, to) = running(sluice, engine, 20_000).await;
    let fp = Failpoints::new();
    let args = [
        "--until-current",
        "--chunk-size",
        "256KB",
        "--parallel",
        "2",
    ];
    let mut cmd = src.stream(&TABLES, to.path(), &args);
    fp.run_paused_at(&mut cmd, "export.after_receipt", writer.wait_for(40))
        .await;
    let commits = writer.stop_after(20).await;
    // Drain what was committed after the first run stopped.
    src.run(&TABLES, to.path(), &["--until-current"]).ok();
    let r = src.assert_replay_equals(to.path(), "acct", ACCT).await;
    let h = src.assert_replay_equals(to.path(), "hist", HIST).await;
    assert_writer_changes(&r, commits);
    let mut seqs: Vec<u64> = r.changes.iter().chain(&h.changes).map(|c| c.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs.first(), Some(&1), "_seq starts at 1");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "_seq has no holes within one stream"
    );
    let acct_pos: HashSet<&String> = r.changes.iter().map(|c| &c.pos).collect();
    assert!(
        h.changes.iter().any(|c| acct_pos.contains(&c.pos)),
        "a transaction's changes in both tables share its _pos"
    );
    src.drop_stream(&TABLES, to.path()).await;
}

/// Each run dies at one failpoint of the snapshot or of a batch (`exit`, as `kill -9` would
/// leave it) while the writer runs, the next continues from what the last left: the
/// interrupted snapshot is finished under a second snapshot whose position the tables it read
/// start from; a transient failure is retried within the run from the committed position; the
/// replay equals both tables (no gap, no duplicate) and nothing hidden is left.
pub async fn killed_at_every_point(sluice: &Sluice, engine: Engine) {
    let (mut src, writer, to) = running(sluice, engine, 10_000).await;
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
        process::run_dying_at(&mut src.stream(&TABLES, to.path(), &small), spec);
        if spec.starts_with("export.") {
            assert_eq!(
                state(to.path())["snapshot"]["done"],
                false,
                "the snapshot is unfinished"
            );
        }
    }
    let st = state(to.path());
    assert_eq!(st["snapshot"]["done"], true, "{st}");
    let manifest = crate::files::manifest(to.path());
    assert_eq!(
        manifest["snapshots"].as_array().expect("snapshots").len(),
        2,
        "the interrupted snapshot was finished under a second one: {manifest}"
    );
    for (name, t) in st["tables"].as_object().expect("tables") {
        assert!(t["snapshot_position"].is_string(), "{name}: {st}");
    }
    writer.wait_for(30).await;
    let fp = Failpoints::new();
    let mut cmd = src.stream(&TABLES, to.path(), &small);
    fp.arm(&mut cmd, "stream.after_files=error@1");
    let r = process::run(&mut cmd);
    r.ok();
    assert!(r.stderr.contains("restarting the stream"), "{}", r.stderr);
    writer.stop_after(30).await;
    src.run(&TABLES, to.path(), &small).ok();
    let r = src.assert_replay_equals(to.path(), "acct", ACCT).await;
    src.assert_replay_equals(to.path(), "hist", HIST).await;
    assert!(r.changes.len() > 100, "only {} changes", r.changes.len());
    for t in TABLES {
        let left: Vec<String> = files_under(&to.path().join(src.dataset(t)))
            .into_iter()
            .filter(|f| f.contains("/.") || f.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{t}: temporaries left: {left:?}");
    }
    src.drop_stream(&TABLES, to.path()).await;
}

/// A column added between two changes starts a new schema version in a new file: five
/// changes, two files, the state's second version from `_seq` 2 with four columns; rows the
/// new column was not set on replay as NULL.
pub async fn schema_change(sluice: &Sluice, engine: Engine) {
    let mut src = Capture::new(sluice, engine).await;
    src.create_accounts(100).await;
    let to = process::tempdir();
    src.run(&["acct"], to.path(), &["--until-current"]).ok();
    src.exec(
        "UPDATE acct SET v = 1 WHERE id = 1;
         ALTER TABLE acct ADD COLUMN note varchar(20);
         UPDATE acct SET note = CONCAT('n', id) WHERE id <= 3;
         INSERT INTO acct VALUES (1000, 0, 'p', 'new');",
    )
    .await;
    src.run(&["acct"], to.path(), &["--until-current"]).ok();
    let r = src
        .assert_replay_equals(to.path(), "acct", "id, v, pad, note")
        .await;
    assert_eq!(r.changes.len(), 5, "{:?}", r.changes);
    let files = crate::changes::change_files(&to.path().join(src.dataset("acct")));
    assert_eq!(files.len(), 2, "one file per schema version: {files:?}");
    let st = state(to.path());
    let versions = st["tables"][src.dataset("acct")]["versions"]
        .as_array()
        .expect("versions");
    // Each change carries the columns of its moment: the table's before the ALTER, then after.
    let widths: Vec<usize> = r.changes.iter().map(|c| c.columns.len()).collect();
    assert_eq!(widths, [3, 4, 4, 4, 4], "{:?}", r.changes);
    assert_eq!(versions.len(), 2, "{versions:?}");
    assert!(versions.iter().any(|v| v["version"] == 2), "{versions:?}");
    // The state's history of versions: each starts at the first change written with it (the
    // update before the ALTER, then the one after), numbered in that order, with the columns
    // its file holds. A restarted MySQL/MariaDB stream must not take the catalog's present
    // (already altered) for the log's position it resumes from.
    let history = version_history(versions);
    assert_eq!(history, [(1, 1, 3), (2, 2, 4)], "{versions:?}");
    // The columns the ALTER left alone are described alike in both versions (the binary log's
    // table map lacks the catalog's lengths; the older version must not be worded otherwise).
    assert_eq!(
        versions[0]["columns"].as_array().map(|c| &c[..]),
        versions[1]["columns"].as_array().map(|c| &c[..3]),
        "{versions:?}"
    );
    // A version's columns are those of the changes it holds (the latest version begun at or
    // before each change's `_seq`).
    for c in &r.changes {
        let held = versions
            .iter()
            .rev()
            .find(|v| v["since_seq"].as_u64().is_some_and(|s| s <= c.seq))
            .map(|v| {
                v["columns"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|col| col[0].as_str().map(str::to_string))
                    .collect::<Vec<_>>()
            });
        assert_eq!(
            held.as_ref(),
            Some(c.columns.as_ref()),
            "_seq {}: {versions:?}",
            c.seq
        );
    }
    src.drop_stream(&["acct"], to.path()).await;
}

/// A `TRUNCATE` between inserts is a change of its own, in order, and the stream goes on after
/// it: the replay (which empties the table at a truncate) equals the table.
pub async fn truncate(sluice: &Sluice, engine: Engine) {
    let mut src = Capture::new(sluice, engine).await;
    src.create_accounts(100).await;
    let to = process::tempdir();
    src.run(&["acct"], to.path(), &["--until-current"]).ok();
    src.exec(
        "INSERT INTO acct VALUES (1001, 1, 'a');
         TRUNCATE TABLE acct;
         INSERT INTO acct VALUES (1002, 2, 'b');",
    )
    .await;
    src.run(&["acct"], to.path(), &["--until-current"]).ok();
    src.exec("UPDATE acct SET v = 3 WHERE id = 1002;").await;
    src.run(&["acct"], to.path(), &["--until-current"]).ok();
    let r = src.assert_replay_equals(to.path(), "acct", ACCT).await;
    let ops: Vec<&str> = r.changes.iter().map(|c| c.op.as_str()).collect();
    assert_eq!(
        ops,
        ["insert", "truncate", "insert", "update"],
        "{:?}",
        r.changes
    );
    src.drop_stream(&["acct"], to.path()).await;
}

/// `--initial none` takes no snapshot and streams only what changes after its first start
/// (an update made before it is not there); its CSV change files carry the change columns
/// after the table's; a later run asking for another format is refused.
pub async fn initial_none(sluice: &Sluice, engine: Engine) {
    let mut src = Capture::new(sluice, engine).await;
    src.create_accounts(100).await;
    src.exec("UPDATE acct SET v = 5 WHERE id = 50;").await;
    let to = process::tempdir();
    let args = ["--until-current", "--initial", "none", "--format", "csv"];
    src.run(&["acct"], to.path(), &args).ok();
    assert!(!to.path().join("manifest.json").exists(), "no snapshot");
    src.exec("UPDATE acct SET v = 7 WHERE id <= 10;").await;
    let r = src.run(&["acct"], to.path(), &["--until-current"]);
    assert_eq!(r.code, 2, "a format change is refused: {}", r.stderr);
    assert!(r.stderr.contains("csv change files"), "{}", r.stderr);
    src.run(&["acct"], to.path(), &args).ok();
    let dir = to.path().join(src.dataset("acct")).join("changes");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .expect("a changes directory")
        .map(|e| e.expect("an entry").path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let text = std::fs::read_to_string(&files[0]).expect("the change file");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("id,v,pad,_op,_pos,_seq,_commit_ts,_xid,_absent")
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 10, "{text}");
    assert!(
        rows.iter()
            .all(|l| l.contains(",7,") && l.contains(",update,")),
        "{text}"
    );
    let mut ids: Vec<String> = rows
        .iter()
        .map(|l| l.split(',').next().unwrap_or_default().to_string())
        .collect();
    ids.sort();
    let updated = src.rows("acct WHERE v = 7", "id").await;
    assert_eq!(ids, updated, "the updated rows, and only them");
    src.drop_stream(&["acct"], to.path()).await;
}

/// Changes made while no stream runs (an insert, an update from and to NULL, a delete of a
/// table with NULLs, decimals and four-byte characters) arrive at the next run, in order, and
/// replay to the table; so do a change and a column added after it while stopped again, the
/// change keeping the table's schema version and the new column starting the next.
pub async fn changes_while_stopped(sluice: &Sluice, engine: Engine) {
    let mut src = Capture::new(sluice, engine).await;
    let charset = src.sql("", " CHARACTER SET utf8mb4");
    src.exec(&format!(
        "CREATE TABLE t (id bigint PRIMARY KEY, v int NOT NULL, name varchar(40),
                         amount decimal(12,2) NOT NULL){charset};
         INSERT INTO t VALUES (1, 10, 'one', 1.50), (2, 20, NULL, -2.25), (3, 30, 'drei', 0.00),
                              (4, 40, 'ünïcödé 𝄞', 99999.99);"
    ))
    .await;
    let to = process::tempdir();
    // The first run takes the snapshot and ends at the log's current position.
    src.run(&["t"], to.path(), &["--until-current"]).ok();
    src.exec(
        "INSERT INTO t VALUES (5, 50, 'five', 5.05);
         UPDATE t SET v = v + 1, name = 'two' WHERE id = 2;
         UPDATE t SET name = NULL WHERE id = 1;
         DELETE FROM t WHERE id = 3;",
    )
    .await;
    src.run(&["t"], to.path(), &["--until-current"]).ok();
    let r = src
        .assert_replay_equals(to.path(), "t", "id, v, name, amount")
        .await;
    let ops: Vec<&str> = r.changes.iter().map(|c| c.op.as_str()).collect();
    assert_eq!(
        ops,
        ["insert", "update", "update", "delete"],
        "{:?}",
        r.changes
    );
    // A change, then a column added, while stopped again: the next run reads the change under
    // the table's old definition (the catalog is already past it) and keeps its schema
    // version; the added column's version starts at the change after the ALTER.
    src.exec(
        "UPDATE t SET v = v + 1 WHERE id = 4;
         ALTER TABLE t ADD COLUMN extra int;
         UPDATE t SET extra = 7 WHERE id = 1;",
    )
    .await;
    src.run(&["t"], to.path(), &["--until-current"]).ok();
    let r = src
        .assert_replay_equals(to.path(), "t", "id, v, name, amount, extra")
        .await;
    let widths: Vec<usize> = r.changes.iter().map(|c| c.columns.len()).collect();
    assert_eq!(widths, [4, 4, 4, 4, 4, 5], "{:?}", r.changes);
    let st = state(to.path());
    let versions = st["tables"][src.dataset("t")]["versions"]
        .as_array()
        .expect("versions");
    let history = version_history(versions);
    assert_eq!(history, [(1, 1, 4), (2, 6, 5)], "{versions:?}");
    src.drop_stream(&["t"], to.path()).await;
}

/// `--before-images` with a writer running through the snapshot and the stream: each update's
/// and delete's `_before` is the row as the snapshot and the changes before it left it (the
/// replay checks every one against its own reconstruction), inserts have none, in Parquet and
/// in JSON Lines (an object). PostgreSQL refuses tables without REPLICA IDENTITY FULL before
/// anything is created, naming each table's fix. A change logged without its old row once the
/// stream runs (PostgreSQL: the identity set back to DEFAULT; MySQL/MariaDB: a session writing
/// `binlog_row_image=MINIMAL`) stops the stream with the fix, rather than write it without one.
pub async fn before_images(sluice: &Sluice, engine: Engine) {
    let mut src = Capture::new(sluice, engine).await;
    src.create_accounts(5_000).await;
    let (pq, jsonl) = (process::tempdir(), process::tempdir());
    let args = [
        "--until-current",
        "--before-images",
        "--batch-bytes",
        "64KB",
    ];
    let json_args = [&args[..], &["--format", "jsonl"]].concat();
    if engine == Engine::Postgres {
        let r = src.run(&TABLES, pq.path(), &args);
        assert_eq!(r.code, 2, "refused before start:\n{}", r.stderr);
        for fix in [
            "ALTER TABLE acct REPLICA IDENTITY FULL;",
            "ALTER TABLE hist REPLICA IDENTITY FULL;",
        ] {
            assert!(r.stderr.contains(fix), "names {fix}:\n{}", r.stderr);
        }
        assert_eq!(src.server_objects().await, Some((0, 0)), "nothing created");
        src.exec("ALTER TABLE acct REPLICA IDENTITY FULL; ALTER TABLE hist REPLICA IDENTITY FULL")
            .await;
    }
    let writer = src.start_writer(5_000).await;
    for _ in 0..2 {
        src.run(&TABLES, pq.path(), &args).ok();
        src.run(&TABLES, jsonl.path(), &json_args).ok();
        writer.wait_for(20).await;
    }
    let commits = writer.stop().await;
    src.run(&TABLES, pq.path(), &args).ok();
    src.run(&TABLES, jsonl.path(), &json_args).ok();
    for (to, format) in [(&pq, "parquet"), (&jsonl, "jsonl")] {
        let r = src.assert_replay_equals(to.path(), "acct", ACCT).await;
        if format == "parquet" {
            assert_writer_changes(&r, commits);
        }
        let h = src.assert_replay_equals(to.path(), "hist", HIST).await;
        let mut old_rows = [0, 0];
        for c in r.changes.iter().chain(&h.changes) {
            match c.op.as_str() {
                "update" | "delete" => {
                    assert!(
                        c.before.is_some(),
                        "{format}: {} _seq {} has no _before",
                        c.op,
                        c.seq
                    );
                    old_rows[usize::from(c.op == "delete")] += 1;
                }
                _ => assert!(
                    c.before.is_none(),
                    "{format}: {} _seq {} has a _before",
                    c.op,
                    c.seq
                ),
            }
        }
        assert!(
            old_rows[0] > 20 && old_rows[1] > 20,
            "{format}: updates and deletes with old rows: {old_rows:?}"
        );
    }
    // A row of its own (the writer deletes and moves others), updated without its old row
    // logged; on PostgreSQL the identity is FULL again by the restart, so the start's check
    // passes and the change itself stops the stream.
    let (lose, fix) = match engine {
        Engine::Postgres => (
            "INSERT INTO acct VALUES (9000000, 0, 'x');
             ALTER TABLE acct REPLICA IDENTITY DEFAULT;
             UPDATE acct SET v = 1 WHERE id = 9000000;
             ALTER TABLE acct REPLICA IDENTITY FULL",
            "REPLICA IDENTITY FULL",
        ),
        _ => (
            "INSERT INTO acct VALUES (9000000, 0, 'x');
             SET SESSION binlog_row_image = 'MINIMAL';
             UPDATE acct SET v = 1 WHERE id = 9000000;
             SET SESSION binlog_row_image = 'FULL'",
            "binlog_row_image=FULL",
        ),
    };
    src.exec(lose).await;
    let r = src.run(&TABLES, pq.path(), &args);
    assert_eq!(
        r.code, 5,
        "stops at the change without an old row:\n{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(fix) && r.stderr.contains("--before-images"),
        "names the fix:\n{}",
        r.stderr
    );
    src.run(&TABLES, jsonl.path(), &["--drop"]).ok();
    src.drop_stream(&TABLES, pq.path()).await;
}

/// `--columns` keeps some of a table's columns in the snapshot and the change files alike,
/// with a writer running and `--before-images` on: the replay equals the source's `SELECT` of
/// those columns (a file with another column would not), no change names a left-out column
/// (not even as absent), the old rows hold the kept columns only (and match the replay), and
/// the other table keeps all of its columns.
pub async fn columns(sluice: &Sluice, engine: Engine) {
    let (mut src, writer, to) = running(sluice, engine, 5_000).await;
    if engine == Engine::Postgres {
        src.exec("ALTER TABLE acct REPLICA IDENTITY FULL; ALTER TABLE hist REPLICA IDENTITY FULL")
            .await;
    }
    let pick = format!("{}:ID,v", src.dataset("acct"));
    let args = [
        "--until-current",
        "--batch-bytes",
        "64KB",
        "--columns",
        &pick,
        "--before-images",
    ];
    src.run(&TABLES, to.path(), &args).ok();
    let commits = writer.stop_after(20).await;
    src.run(&TABLES, to.path(), &args).ok();
    let r = src.assert_replay_equals(to.path(), "acct", "id, v").await;
    assert_writer_changes(&r, commits);
    for c in &r.changes {
        assert_eq!(c.columns.as_slice(), ["id", "v"], "_seq {}", c.seq);
        assert!(
            c.absent.iter().all(|a| a != "pad"),
            "_seq {} names pad",
            c.seq
        );
    }
    src.assert_replay_equals(to.path(), "hist", HIST).await;
    let st = state(to.path());
    assert_eq!(
        st["tables"][src.dataset("acct")]["columns"],
        serde_json::json!(["id", "v"])
    );
    src.drop_stream(&TABLES, to.path()).await;
}
