//! The suite's scenarios of tables that join or leave a running stream (`--discover-every`):
//! a table created under a writer joins with a snapshot of its own (a run killed during it,
//! the next finishing it), and a captured table dropped ends with its marker. Like every
//! scenario they end with the replay compared with the source table.

use super::{ACCT, Capture, Engine, HIST, WriterConn, state};
use crate::process::{self, Failpoints};
use crate::scenario::Sluice;
use crate::writer::Background;
use std::path::Path;
use std::sync::atomic::Ordering;

/// `--tables` matching exactly `names` of the capture's schema (or database).
fn pattern(src: &Capture, names: &[&str]) -> String {
    let d = src.dataset("x");
    let schema = d.strip_suffix(".x").unwrap_or(&d);
    format!("{}\\.({})", regex_escape(schema), names.join("|"))
}

/// The arguments of a run over the tables `tables` matches that looks them up every 0.2 s.
fn watching(tables: &str) -> [&str; 5] {
    [
        "--tables",
        tables,
        "--until-current",
        "--discover-every",
        "0.2",
    ]
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// `CREATE TABLE name` (id, v, pad) with `rows` rows.
async fn create(src: &mut Capture, name: &str, rows: i64) {
    let sql = match src.engine() {
        Engine::Postgres => format!(
            "CREATE TABLE {name} (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL);
             INSERT INTO {name} SELECT g, 0, lpad(g::text, 200, 'p') FROM generate_series(1, {rows}) g;
             ANALYZE {name};"
        ),
        _ => format!(
            "SET SESSION {} = 1000000;
             CREATE TABLE {name} (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL);
             INSERT INTO {name} WITH RECURSIVE g(n) AS
               (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows})
               SELECT n, 0, LPAD(n, 200, 'p') FROM g;
             ANALYZE TABLE {name};",
            if src.engine() == Engine::Mariadb {
                "max_recursive_iterations"
            } else {
                "cte_max_recursion_depth"
            }
        ),
    };
    src.exec(&sql).await;
}

/// A writer of table `name` (of [`create`], `rows` rows): each transaction updates a row,
/// deletes one, inserts two.
async fn start_table_writer(src: &Capture, name: &str, rows: i64) -> Background {
    let mut c = WriterConn::open(src.engine(), &src.url).await;
    let name = name.to_string();
    let w = Background::spawn(|stop, commits| async move {
        let mut next = rows + 1;
        while !stop.load(Ordering::Relaxed) {
            let n = commits.load(Ordering::Relaxed) as i64;
            let (a, b) = ((n * 7) % rows + 1, (n * 13 + 3) % rows + 1);
            c.batch(&format!(
                "START TRANSACTION;
                 UPDATE {name} SET v = v + 1 WHERE id = {a};
                 DELETE FROM {name} WHERE id = {b};
                 INSERT INTO {name} VALUES ({next}, -1, 'new'), ({}, -2, 'new');
                 COMMIT;",
                next + 1
            ))
            .await;
            next += 2;
            commits.fetch_add(1, Ordering::Relaxed);
        }
    });
    w.wait_for(5).await;
    w
}

/// `--drop` with the scenario's `--tables`: nothing left on the server.
async fn drop_stream(src: &mut Capture, tables: &str, to: &Path) {
    src.run(&[], to, &["--tables", tables, "--drop"]).ok();
    if let Some(objects) = src.server_objects().await {
        assert_eq!(objects, (0, 0), "--drop leaves no slot or publication");
    }
}

/// The joined tables' snapshot manifests (`_sluice/added/*/manifest.json`).
fn added_manifests(to: &Path) -> Vec<serde_json::Value> {
    let dir = to.join("_sluice/added");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let p = e.ok()?.path().join("manifest.json");
            p.exists().then(|| crate::files::json(&p))
        })
        .collect()
}

/// A table created while the stream runs joins it: the writer keeps changing the stream's
/// tables and the new one; the first run that sees it dies after the first part of its
/// snapshot (`exit`, as `kill -9` would leave it), the state holding it unfinished; the next
/// finishes it under a new snapshot while the writer commits, and goes on streaming. The
/// replay of each table (its snapshot and change files) equals it, the new one's changes after
/// its snapshot are in its files, and a table created later that the selection does not
/// match stays out.
pub async fn new_table(sluice: &Sluice, engine: Engine) {
    let mut src = Capture::new(sluice, engine).await;
    src.create_accounts(2_000).await;
    let writer = src.start_writer(2_000).await;
    let to = process::tempdir();
    let tables = pattern(&src, &["acct", "hist", "fresh"]);
    let args = [&watching(&tables)[..], &["--chunk-size", "64KB"]].concat();
    src.run(&[], to.path(), &args).ok();
    assert!(added_manifests(to.path()).is_empty(), "nothing joined yet");

    create(&mut src, "fresh", 3_000).await;
    create(&mut src, "other", 10).await;
    let fresh = start_table_writer(&src, "fresh", 3_000).await;
    let fp = Failpoints::new();
    let mut cmd = src.stream(&[], to.path(), &args);
    fp.arm(&mut cmd, "export.after_receipt=exit@1");
    let r = process::run(&mut cmd);
    assert_ne!(r.code, 0, "the run did not die:\n{}", r.stderr);
    let name = src.dataset("fresh");
    let st = state(to.path());
    assert_eq!(
        st["tables"][&name]["added"]["snapshot_done"], false,
        "the joining table's snapshot is unfinished: {st}"
    );

    let mut cmd = src.stream(&[], to.path(), &args);
    let out = fp
        .run_paused_at(&mut cmd, "export.after_receipt", fresh.wait_for(30))
        .await;
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        report.contains(&format!("joined the stream: {name}")),
        "{report}"
    );
    fresh.wait_for(20).await;
    writer.wait_for(20).await;
    let fresh_commits = fresh.stop().await;
    let commits = writer.stop().await;
    src.run(&[], to.path(), &args).ok();

    let st = state(to.path());
    assert_eq!(st["tables"][&name]["added"]["snapshot_done"], true, "{st}");
    assert!(st["tables"][&name]["snapshot_position"].is_string(), "{st}");
    assert!(
        st["tables"].get(src.dataset("other")).is_none(),
        "a table the selection does not match stays out: {st}"
    );
    let manifests = added_manifests(to.path());
    assert_eq!(manifests.len(), 1, "one snapshot of the joining table");
    let listed: Vec<&str> = manifests[0]["datasets"]
        .as_array()
        .expect("datasets")
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(listed, [name.as_str()]);
    let f = src.assert_replay_equals(to.path(), "fresh", ACCT).await;
    // 50 of its writer's commits came after its snapshot, each inserting two rows.
    assert!(
        f.changes.len() >= 100,
        "{} changes of fresh for {fresh_commits} commits",
        f.changes.len()
    );
    let a = src.assert_replay_equals(to.path(), "acct", ACCT).await;
    src.assert_replay_equals(to.path(), "hist", HIST).await;
    super::assert_writer_changes(&a, commits);
    drop_stream(&mut src, &tables, to.path()).await;
}

/// A captured table dropped while the stream runs (its last changes made just before) ends
/// with `_dropped.json`: its change files replay to the table as it was just before the drop,
/// the state keeps it as dropped, the run goes on with the other tables, and a later run
/// neither refuses nor writes anything more for it.
pub async fn dropped_table(sluice: &Sluice, engine: Engine) {
    let mut src = Capture::new(sluice, engine).await;
    src.create_accounts(500).await;
    create(&mut src, "gone", 500).await;
    let writer = src.start_writer(500).await;
    let to = process::tempdir();
    let tables = pattern(&src, &["acct", "hist", "gone"]);
    let args = watching(&tables);
    src.run(&[], to.path(), &args).ok();
    let gone = start_table_writer(&src, "gone", 500).await;
    let fp = Failpoints::new();
    let mut cmd = src.stream(&[], to.path(), &args);
    // The drop happens while the run streams: its stream is open and the table captured.
    let dropped = async {
        gone.stop_after(10).await;
        let before = src.rows("gone", ACCT).await;
        src.exec("DROP TABLE gone;").await;
        before
    };
    let mut before = Vec::new();
    let out = fp
        .run_paused_at(&mut cmd, "stream.opened", async {
            before = dropped.await;
        })
        .await;
    let report = String::from_utf8_lossy(&out.stderr);
    let name = src.dataset("gone");
    assert!(
        report.contains(&format!("dropped on the source: {name}")),
        "{report}"
    );
    let marker = to.path().join(&name).join("_dropped.json");
    let m = crate::files::json(&marker);
    assert_eq!(m["dropped"], true, "{m}");
    assert_eq!(m["complete"], true, "dropped while the stream ran: {m}");
    let st = state(to.path());
    assert!(st["tables"][&name]["dropped"].is_object(), "{st}");
    let replayed = crate::changes::assert_replay_equals(to.path(), &name, &["id"], &before);
    assert!(!replayed.changes.is_empty(), "its last changes are written");
    let commits = writer.stop_after(10).await;
    src.run(&[], to.path(), &args).ok();
    let again = crate::changes::replay(&to.path().join(&name), &["id"]);
    assert_eq!(
        again.changes.len(),
        replayed.changes.len(),
        "nothing more is written for a dropped table"
    );
    let a = src.assert_replay_equals(to.path(), "acct", ACCT).await;
    super::assert_writer_changes(&a, commits);
    drop_stream(&mut src, &tables, to.path()).await;
}
