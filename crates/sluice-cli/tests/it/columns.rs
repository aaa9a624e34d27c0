//! `--columns TABLE:COL,COL`: an export of PostgreSQL and MariaDB reads only the picked
//! columns (named in any case, a quoted one exactly), in the table's order, equal to the
//! source's `SELECT` of them, and the manifest says the dataset is a column subset; bad picks
//! exit 2 naming the fix before anything is written; `sluice replicate` refuses the flag and
//! `sluice stream` a pick without the key. Change files of picked columns are the capture
//! suite's `columns` scenario.

use crate::common::{self, TestDb, files, run, sluice, tempdir};
use std::path::Path;

fn columns_of(dir: &Path) -> Vec<String> {
    let batches = files::dataset_batches(dir);
    batches[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

/// `sluice stream` of table `t` into `to`, run to its end.
fn stream_t(url: &str, to: &Path, extra: &[&str]) -> common::Run {
    run(sluice()
        .args(["stream", "--source", url, "--table", "t", "--to"])
        .arg(to)
        .args(extra))
}

fn manifest(to: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(to.join("manifest.json")).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_export_reads_only_the_picked_columns() {
    let db = TestDb::new().await;
    db.exec(
        r#"CREATE TABLE people (id int PRIMARY KEY, "Name" text, secret text, amount numeric(8,2));
           INSERT INTO people SELECT g, 'n' || g, 'pw' || g, g * 1.25 FROM generate_series(1, 5000) g;
           CREATE TABLE other (id int PRIMARY KEY, x int);
           INSERT INTO other VALUES (1, 1);"#,
    )
    .await;
    let to = tempdir();
    common::export(
        &db.url,
        to.path(),
        &[
            "--table",
            "people",
            "--table",
            "other",
            "--columns",
            r#"people:AMOUNT,"Name",id"#,
            "--chunk-size",
            "64KB",
        ],
    )
    .ok();
    let dir = to.path().join("public.people");
    assert_eq!(
        columns_of(&dir),
        ["id", "Name", "amount"],
        "the table's order"
    );
    let got = files::row_strings(&files::dataset_batches(&dir));
    let want = db
        .row_strings(r#"SELECT id, "Name", amount FROM people"#)
        .await;
    files::assert_same_rows(&got, &want, "picked columns");
    assert_eq!(columns_of(&to.path().join("public.other")), ["id", "x"]);
    let m = manifest(to.path());
    let picked: Vec<(String, bool)> = m["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let p = d.get("columns_picked").and_then(|v| v.as_bool());
            (d["name"].as_str().unwrap().to_string(), p.unwrap_or(false))
        })
        .collect();
    assert!(
        picked.contains(&("public.people".into(), true)),
        "{picked:?}"
    );
    assert!(
        picked.contains(&("public.other".into(), false)),
        "{picked:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_export_reads_only_the_picked_columns() {
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    db.exec(
        "CREATE TABLE people (id int PRIMARY KEY, name varchar(20), secret varchar(20), \
         amount decimal(8,2));
         INSERT INTO people VALUES (1, 'a', 'pw1', 1.25), (2, 'b', 'pw2', 2.50);",
    )
    .await;
    let to = tempdir();
    let table = format!("{}.people", db.name);
    common::export(
        &db.url,
        to.path(),
        &[
            "--table",
            &table,
            "--columns",
            &format!("{table}:id,amount"),
        ],
    )
    .ok();
    let dir = to.path().join(&table);
    assert_eq!(columns_of(&dir), ["id", "amount"]);
    let got = files::row_strings(&files::dataset_batches(&dir));
    let want = db.row_strings("SELECT id, amount FROM people").await;
    files::assert_same_rows(&got, &want, "picked columns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_picks_exit_2_naming_the_fix_and_write_nothing() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE t (id int PRIMARY KEY, a int, \"A\" int, b int);
         INSERT INTO t VALUES (1, 2, 3, 4);
         CREATE TABLE u (id int PRIMARY KEY);",
    )
    .await;
    for (args, says) in [
        (
            vec!["--table", "t", "--columns", "t:id,nope"],
            "its columns are id, a, A, b",
        ),
        (
            vec!["--table", "t", "--columns", "u:id"],
            "does not include",
        ),
        (
            vec!["--table", "t", "--columns", "t:id", "--columns", "t:a"],
            "twice",
        ),
        (vec!["--table", "t", "--columns", "t"], "one ':'"),
        (
            vec!["--table", "t", "--columns", "t:id,\"B\""],
            "no column \"B\"",
        ),
        (
            vec!["--table", "t", "--columns", "t:a,b"],
            "leaves out id of public.t's primary key",
        ),
    ] {
        let to = tempdir();
        let r = common::export(&db.url, to.path(), &args);
        assert_eq!(r.code, 2, "{args:?}:\n{}", r.stderr);
        assert!(
            r.stderr.contains(says),
            "{args:?} says {says:?}:\n{}",
            r.stderr
        );
        // The output lock's file (released) is all there is.
        let left = common::files_under(to.path());
        assert!(
            left.iter().all(|f| f == "_sluice/lock.json"),
            "{args:?} wrote {left:?}"
        );
    }
    // Unquoted names match in any case, but "a" could be a or A: the exact one is taken.
    let to = tempdir();
    common::export(
        &db.url,
        to.path(),
        &["--table", "t", "--columns", "t:id,a,\"A\""],
    )
    .ok();
    assert_eq!(columns_of(&to.path().join("public.t")), ["id", "a", "A"]);
    let stream = stream_t(&db.url, tempdir().path(), &["--columns", "t:a,b"]);
    stream.refused(2, &["leaves out id of public.t's primary key"]);
    let replicate =
        run(common::replicate(&db.url, &db.url).args(["--table", "t", "--columns", "t:id"]));
    replicate.refused(2, &["--columns is not supported"]);
    assert_eq!(
        sluice_testkit::capture::slots_and_publications(&db).await,
        (0, 0),
        "the refused stream created nothing"
    );
}

/// A stream keeps the shape it started with: restarted without its `--columns`, or with
/// `--before-images` switched on, it is refused (exit 2) naming what it was started with,
/// rather than change the change files' columns in the middle of their history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_restarted_with_other_columns_or_images_is_refused() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE t (id int PRIMARY KEY, a int, secret text);
         ALTER TABLE t REPLICA IDENTITY FULL;
         INSERT INTO t VALUES (1, 2, 'pw');",
    )
    .await;
    let to = tempdir();
    let stream =
        |extra: &[&str]| stream_t(&db.url, to.path(), &[&["--until-current"], extra].concat());
    stream(&["--columns", "t:id,a"]).ok();
    let r = stream(&[]);
    r.refused(2, &["--columns 'public.t:id,a'", "all its columns"]);
    let r = stream(&["--columns", "t:id,a", "--before-images"]);
    r.refused(2, &["without before-images"]);
    stream(&["--columns", "t:id,a"]).ok();
    stream_t(&db.url, to.path(), &["--drop"]).ok();
}
