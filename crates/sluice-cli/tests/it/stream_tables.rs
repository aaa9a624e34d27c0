//! Tables joining and leaving a stream (`--discover-every`), the cases the capture suite's
//! `new_table` and `dropped_table` scenarios do not cover: a table created again under a
//! dropped one's name, a publication the user manages, a MariaDB table dropped while no stream
//! ran (its marker says its last changes are missing), `--discover-every 0` and bad values.

use crate::common::{self, Run, TestDb, run, sluice, tempdir};
use std::path::Path;

/// `sluice stream --tables PATTERN --until-current EXTRA…` into `to` (`--discover-every 0.2`
/// unless `extra` gives it), not started.
fn command(url: &str, tables: &str, to: &Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = sluice();
    cmd.args(["stream", "--source", url, "--tables", tables, "--to"])
        .arg(to)
        .args(["--until-current", "--batch-seconds", "0.2"])
        .args(extra);
    if !extra.contains(&"--discover-every") {
        cmd.args(["--discover-every", "0.2"]);
    }
    cmd
}

/// [`command`], run to its end.
fn stream(url: &str, tables: &str, to: &Path, extra: &[&str]) -> Run {
    run(&mut command(url, tables, to, extra))
}

fn json(path: &Path) -> serde_json::Value {
    sluice_testkit::files::json(path)
}

/// PostgreSQL: a captured table dropped and created again between runs ends with its marker,
/// and the new table of that name stops the stream with the fix (its directory is the old
/// table's); leaving it out of the selection lets the stream go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_created_again_under_a_dropped_name_stops_the_stream_with_the_fix() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE keep (id int PRIMARY KEY, v int); INSERT INTO keep VALUES (1, 1);
         CREATE TABLE again (id int PRIMARY KEY, v int); INSERT INTO again VALUES (1, 1);",
    )
    .await;
    let to = tempdir();
    let both = r"public\.(keep|again)";
    stream(&db.url, both, to.path(), &[]).ok();
    db.exec(
        "UPDATE again SET v = 2; DROP TABLE again;
         CREATE TABLE again (id int PRIMARY KEY, v int); INSERT INTO again VALUES (7, 7);",
    )
    .await;
    let r = stream(&db.url, both, to.path(), &[]);
    r.refused(
        2,
        &["public.again was dropped", "another output", "--tables"],
    );
    let marker = json(&to.path().join("public.again/_dropped.json"));
    assert_eq!(marker["complete"], true, "{marker}");
    let changes = sluice_testkit::changes::replay(&to.path().join("public.again"), &["id"]);
    assert_eq!(
        changes.rows,
        ["1|2"],
        "the update before the drop is written"
    );
    db.exec("INSERT INTO keep VALUES (2, 2);").await;
    stream(&db.url, r"public\.keep", to.path(), &[]).ok();
    let kept = sluice_testkit::changes::replay(&to.path().join("public.keep"), &["id"]);
    assert_eq!(kept.rows, ["1|1", "2|2"]);
    stream(&db.url, r"public\.keep", to.path(), &["--drop"]).ok();
}

/// PostgreSQL with a publication the user manages (`--publication`): a new table it does not
/// publish stops the stream naming the `ALTER PUBLICATION` to run, nothing of the table
/// written; once published it joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_table_outside_a_users_publication_is_refused_naming_the_alter() {
    let db = TestDb::new().await;
    let publication = format!("pub_{}", db.name);
    db.exec(&format!(
        "CREATE TABLE a (id int PRIMARY KEY); INSERT INTO a VALUES (1);
         CREATE PUBLICATION {publication} FOR TABLE a;"
    ))
    .await;
    let to = tempdir();
    let tables = r"public\.(a|b)";
    let with = ["--publication", publication.as_str()];
    stream(&db.url, tables, to.path(), &with).ok();
    db.exec("CREATE TABLE b (id int PRIMARY KEY); INSERT INTO b VALUES (1), (2);")
        .await;
    let r = stream(&db.url, tables, to.path(), &with);
    r.refused(
        2,
        &[&format!(
            r#"ALTER PUBLICATION "{publication}" ADD TABLE "public"."b""#
        )],
    );
    assert!(
        !to.path().join("public.b").exists(),
        "nothing of b is written"
    );
    db.exec(&format!("ALTER PUBLICATION {publication} ADD TABLE b;"))
        .await;
    let r = stream(&db.url, tables, to.path(), &with);
    r.ok();
    assert!(
        r.stderr.contains("joined the stream: public.b (2 rows"),
        "{}",
        r.stderr
    );
    stream(
        &db.url,
        tables,
        to.path(),
        &["--drop", "--publication", publication.as_str()],
    )
    .ok();
    db.exec(&format!("DROP PUBLICATION {publication};")).await;
}

/// MariaDB decodes a table's changes with the catalog's columns: a captured table dropped
/// while no stream ran cannot have its last changes decoded, and its marker, the report and
/// the log say so instead of claiming it complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_table_dropped_while_stopped_is_marked_incomplete() {
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    db.exec(
        "CREATE TABLE keep (id int PRIMARY KEY, v int); INSERT INTO keep VALUES (1, 1);
         CREATE TABLE gone (id int PRIMARY KEY, v int); INSERT INTO gone VALUES (1, 1);",
    )
    .await;
    let to = tempdir();
    let tables = format!(r"{}\.(keep|gone)", db.name);
    stream(&db.url, &tables, to.path(), &[]).ok();
    db.exec("UPDATE gone SET v = 2; DROP TABLE gone;").await;
    let r = stream(&db.url, &tables, to.path(), &[]);
    r.ok();
    assert!(
        r.stderr.contains("ERROR: dropped while no stream ran"),
        "{}",
        r.stderr
    );
    let marker = json(&to.path().join(format!("{}.gone/_dropped.json", db.name)));
    assert_eq!(marker["complete"], false, "{marker}");
}

/// MariaDB: a captured table dropped and created again under its name while no stream ran.
/// The binary log's DROP is where the old table's rows left, without a delete event each, so
/// the new table's rows cannot continue its change files (a reader replaying them would keep
/// the old rows): the stream stops naming the table, the drop and the fix, and writes none of
/// the new table's rows; the update before the drop is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_table_created_again_under_its_name_stops_the_stream() {
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    db.exec(
        "CREATE TABLE keep (id int PRIMARY KEY, v int); INSERT INTO keep VALUES (1, 1);
         CREATE TABLE again (id int PRIMARY KEY, v int); INSERT INTO again VALUES (1, 1);",
    )
    .await;
    let to = tempdir();
    let tables = format!(r"{}\.(keep|again)", db.name);
    stream(&db.url, &tables, to.path(), &[]).ok();
    db.exec(
        "UPDATE again SET v = 2; DROP TABLE again;
         CREATE TABLE again (id int PRIMARY KEY, v int); INSERT INTO again VALUES (7, 7);",
    )
    .await;
    let r = stream(&db.url, &tables, to.path(), &[]);
    assert_ne!(r.code, 0, "{}", r.stderr);
    r.says(&["again", "dropped", "--drop"]);
    let changes =
        sluice_testkit::changes::replay(&to.path().join(format!("{}.again", db.name)), &["id"]);
    assert!(
        !changes.rows.iter().any(|r| r.starts_with("7|")),
        "the new table's row reached the old table's change files: {:?}",
        changes.rows
    );
}

/// `--discover-every 0` keeps the tables of the start: a new table the selection matches is
/// refused at a restart, naming the flag; an interval that is not a number of seconds is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_every_zero_keeps_the_tables_and_bad_values_are_refused() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE a (id int PRIMARY KEY);").await;
    let to = tempdir();
    let tables = r"public\.(a|b)";
    stream(&db.url, tables, to.path(), &["--discover-every", "0"]).ok();
    db.exec("CREATE TABLE b (id int PRIMARY KEY);").await;
    let r = stream(&db.url, tables, to.path(), &["--discover-every", "0"]);
    r.refused(2, &["--discover-every 0"]);
    let r = stream(&db.url, tables, to.path(), &["--discover-every", "inf"]);
    r.refused(2, &["--discover-every must be"]);
    stream(&db.url, tables, to.path(), &["--drop"]).ok();
}

/// A run with a selection that leaves out a table the stream captures, which the source still
/// has, is refused (the table is not taken for dropped); the selection it started with goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrower_selection_is_refused_not_taken_for_a_drop() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY);")
        .await;
    let to = tempdir();
    let both = r"public\.(a|b)";
    stream(&db.url, both, to.path(), &[]).ok();
    let r = stream(&db.url, r"public\.a", to.path(), &[]);
    r.refused(2, &["captures public.b", "leaves out"]);
    assert!(!to.path().join("public.b/_dropped.json").exists());
    db.exec("INSERT INTO b VALUES (1);").await;
    stream(&db.url, both, to.path(), &[]).ok();
    let b = sluice_testkit::changes::replay(&to.path().join("public.b"), &["id"]);
    assert_eq!(b.rows, ["1"]);
    stream(&db.url, both, to.path(), &["--drop"]).ok();
}

/// A table whose joining snapshot a killed run left unfinished, dropped before the next run,
/// is given up by it: its parts and the snapshot's bookkeeping removed, the state without it,
/// the stream going on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_table_dropped_before_its_snapshot_is_done_is_given_up() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE a (id int PRIMARY KEY); INSERT INTO a VALUES (1);")
        .await;
    let to = tempdir();
    let both = r"public\.(a|b)";
    stream(&db.url, both, to.path(), &[]).ok();
    db.exec(
        "CREATE TABLE b (id int PRIMARY KEY, pad text);
         INSERT INTO b SELECT g, repeat('x', 200) FROM generate_series(1, 3000) g; ANALYZE b;",
    )
    .await;
    let fp = crate::common::Failpoints::new();
    let mut cmd = command(&db.url, both, to.path(), &["--chunk-size", "64KB"]);
    fp.arm(&mut cmd, "export.after_receipt=exit@1");
    let r = run(&mut cmd);
    assert_ne!(r.code, 0, "the run did not die:\n{}", r.stderr);
    let st = json(&to.path().join("_sluice/stream.json"));
    assert_eq!(
        st["tables"]["public.b"]["added"]["snapshot_done"], false,
        "{st}"
    );
    db.exec("DROP TABLE b; INSERT INTO a VALUES (2);").await;
    let r = stream(&db.url, both, to.path(), &[]);
    r.ok();
    assert!(r.stderr.contains("given up"), "{}", r.stderr);
    let st = json(&to.path().join("_sluice/stream.json"));
    assert!(st["tables"].get("public.b").is_none(), "{st}");
    let left = sluice_testkit::process::files_under(to.path());
    assert!(
        !left
            .iter()
            .any(|f| f.starts_with("public.b/") || f.starts_with("_sluice/added/")),
        "{left:?}"
    );
    let a = sluice_testkit::changes::replay(&to.path().join("public.a"), &["id"]);
    assert_eq!(a.rows, ["1", "2"]);
    stream(&db.url, both, to.path(), &["--drop"]).ok();
}

/// A dropped partitioned table ends with its marker like any table: its partitions gone with
/// it are not taken for partitions detached from a table still captured (which stops a
/// stream), and the other tables stream on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_partitioned_table_ends_with_its_marker() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE a (id int PRIMARY KEY);
         CREATE TABLE p (id int NOT NULL, r int NOT NULL, PRIMARY KEY (id, r)) PARTITION BY LIST (r);
         CREATE TABLE p_0 PARTITION OF p FOR VALUES IN (0);
         CREATE TABLE p_1 PARTITION OF p FOR VALUES IN (1);
         INSERT INTO p VALUES (1, 0), (2, 1);",
    )
    .await;
    let to = tempdir();
    let both = r"public\.(a|p)";
    stream(&db.url, both, to.path(), &[]).ok();
    db.exec("DELETE FROM p WHERE id = 2; DROP TABLE p; INSERT INTO a VALUES (1);")
        .await;
    let r = stream(&db.url, both, to.path(), &[]);
    r.ok();
    let marker = json(&to.path().join("public.p/_dropped.json"));
    assert_eq!(marker["complete"], true, "{marker}");
    let p = sluice_testkit::changes::replay(&to.path().join("public.p"), &["id", "r"]);
    assert_eq!(p.rows, ["1|0"], "the delete before the drop is written");
    let a = sluice_testkit::changes::replay(&to.path().join("public.a"), &["id"]);
    assert_eq!(a.rows, ["1"]);
    stream(&db.url, both, to.path(), &["--drop"]).ok();
}

/// A table a pattern would not list but `--table` can name (a partition) is not taken for
/// dropped by the watch: its changes keep coming, no marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_partition_is_not_taken_for_dropped() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE p (id int NOT NULL, r int NOT NULL, PRIMARY KEY (id, r)) PARTITION BY LIST (r);
         CREATE TABLE p_0 PARTITION OF p FOR VALUES IN (0);
         INSERT INTO p VALUES (1, 0);",
    )
    .await;
    let to = tempdir();
    let named = |extra: &[&str]| {
        let mut c = common::stream(&db.url, "public.p_0", to.path());
        c.args([
            "--until-current",
            "--batch-seconds",
            "0.2",
            "--discover-every",
            "0.2",
        ])
        .args(extra);
        run(&mut c)
    };
    named(&[]).ok();
    db.exec("INSERT INTO p VALUES (2, 0);").await;
    named(&[]).ok();
    assert!(!to.path().join("public.p_0/_dropped.json").exists());
    let r = sluice_testkit::changes::replay(&to.path().join("public.p_0"), &["id", "r"]);
    assert_eq!(r.rows, ["1|0", "2|0"]);
    named(&["--drop"]).ok();
}
