//! `sluice replicate` on the schema features production databases have: two targets fed from
//! one source, generated columns and columns only the target has, keyless tables with
//! REPLICA IDENTITY FULL and out-of-line values, a replica identity on another unique index,
//! an insert-only keyless table beside hot rows (pgbench's history), a target that diverged,
//! and an idle replication on a busy server. Each compares the target with its source.

use super::replicate::{Db, Session};
use super::replicate_faults::{catch_up, drop_replication, replicate_cmd, report, same, ticker};
use crate::common::{Failpoints, Run, finish, run, tempdir};
use std::process::Stdio;

/// Two targets fed from one source (two schemas of one PostgreSQL database) are two
/// replications: each gets its initial load and every change, neither takes the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_two_target_schemas_are_two_replications() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL);
             INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g;",
        )
        .await;
    target.exec("CREATE SCHEMA a; CREATE SCHEMA b;").await;
    let into = |schema: &'static str| {
        [
            "--table",
            "public.t",
            "--until-current",
            "--target-schema",
            schema,
        ]
    };
    for s in ["a", "b"] {
        run(&mut replicate_cmd(&source, &target, &into(s)).await).ok();
    }
    let mut writer = Session::open(&source).await;
    writer
        .exec("UPDATE t SET v = 'x' WHERE id <= 5; DELETE FROM t WHERE id > 18; INSERT INTO t VALUES (30, 'new');")
        .await;
    run(&mut replicate_cmd(&source, &target, &into("b")).await).ok();
    writer.exec("UPDATE t SET v = 'y' WHERE id = 30").await;
    for s in ["a", "b"] {
        run(&mut replicate_cmd(&source, &target, &into(s)).await).ok();
    }
    let want = source.rows("SELECT id, v FROM public.t ORDER BY id").await;
    for s in ["a", "b"] {
        let got = target
            .rows(&format!("SELECT id, v FROM {s}.t ORDER BY id"))
            .await;
        assert_eq!(got, want, "schema {s}");
    }
    let slots = source
        .rows("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()")
        .await;
    assert_eq!(slots, ["2"], "one slot per replication");
    for s in ["a", "b"] {
        drop_replication(&source, &target, &into(s)).await;
    }
}

/// A PostgreSQL source into two MariaDB databases, no --target-schema: each replication's
/// tables go into the database its target URL names (not a database called `public`; the
/// comparisons read the URL's database), and the two stay apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_to_two_mariadb_databases_land_in_each_urls_database() {
    let source = Db::new(true).await;
    let targets = [Db::new(false).await, Db::new(false).await];
    source
        .exec(
            "CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL);
             INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g;",
        )
        .await;
    let args = ["--table", "public.t", "--until-current"];
    for t in &targets {
        let r = run(&mut replicate_cmd(&source, t, &args).await);
        r.ok();
        assert!(r.stderr.contains(&t.name().await), "{}", r.stderr);
    }
    source
        .exec("UPDATE t SET v = 'x' WHERE id = 1; INSERT INTO t VALUES (11, 'eleven');")
        .await;
    for t in &targets {
        run(&mut replicate_cmd(&source, t, &args).await).ok();
        same(&source, t, "SELECT id, v FROM t ORDER BY id").await;
    }
    for t in &targets {
        drop_replication(&source, t, &args).await;
    }
}

/// A generated column stays generated on a PostgreSQL target (logical replication does not
/// send it: its absence is no column change), a column only the target has stays, column
/// types keep their modifiers, and a column the source adds is added.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_generated_and_target_only_columns_survive_column_changes() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE items (id int PRIMARY KEY, price numeric(10,2) NOT NULL,
                                 qty int NOT NULL,
                                 total numeric GENERATED ALWAYS AS (price * qty) STORED);
             INSERT INTO items (id, price, qty) VALUES (1, 2.50, 2), (2, 1.25, 4), (3, 9.99, 1);
             CREATE TABLE tick (id int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO tick VALUES (1, 0);",
        )
        .await;
    let args = [
        "--table",
        "public.items",
        "--table",
        "public.tick",
        "--until-current",
    ];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    target
        .exec("ALTER TABLE items ADD COLUMN note text DEFAULT 'mine'")
        .await;
    let writer = ticker(&source).await;
    source
        .exec(
            "UPDATE items SET qty = qty + 1 WHERE id = 1;
             ALTER TABLE items ADD COLUMN color text;
             UPDATE items SET color = 'red' WHERE id = 2;
             INSERT INTO items (id, price, qty, color) VALUES (4, 1.50, 2, 'blue');",
        )
        .await;
    writer.stop_after(10).await;
    catch_up(
        &source,
        &target,
        &args,
        &[
            "SELECT id, price, qty, total, color FROM items ORDER BY id",
            "SELECT n FROM tick",
        ],
    )
    .await;
    assert_eq!(
        target.rows("SELECT DISTINCT note FROM items").await,
        ["mine"]
    );
    let columns =
        "SELECT attname, format_type(atttypid, atttypmod), attgenerated FROM pg_attribute \
                   WHERE attrelid = 'items'::regclass AND attname IN ('price', 'total')
                   ORDER BY attname";
    assert_eq!(
        target.rows(columns).await,
        ["price|numeric(10,2)|", "total|numeric|s"]
    );
    drop_replication(&source, &target, &args).await;
}

/// Into MariaDB a PostgreSQL generated column is not created (its expression is
/// PostgreSQL's; the stream does not carry it): noted, and everything else applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_to_mariadb_a_generated_column_is_left_out_and_said() {
    let source = Db::new(true).await;
    let target = Db::new(false).await;
    source
        .exec(
            "CREATE TABLE items (id int PRIMARY KEY, price numeric(10,2) NOT NULL,
                                 qty int NOT NULL,
                                 total numeric GENERATED ALWAYS AS (price * qty) STORED);
             INSERT INTO items (id, price, qty) VALUES (1, 2.50, 2), (2, 1.25, 4);",
        )
        .await;
    let args = ["--table", "public.items", "--until-current"];
    let r = run(&mut replicate_cmd(&source, &target, &args).await);
    r.ok();
    assert!(
        r.stderr.contains("total") && r.stderr.contains("not created"),
        "{}",
        r.stderr
    );
    source
        .exec("UPDATE items SET qty = 7 WHERE id = 1; INSERT INTO items (id, price, qty) VALUES (3, 1, 1);")
        .await;
    catch_up(
        &source,
        &target,
        &args,
        &["SELECT id, price, qty FROM items ORDER BY id"],
    )
    .await;
}

/// A MariaDB source logs its generated columns' values; the target computes them instead:
/// into MariaDB they are created generated (stored or virtual, as on the source), into
/// PostgreSQL they are left out, and in both every other column follows.
async fn mariadb_generated_columns(target_pg: bool) {
    let source = Db::new(false).await;
    let target = Db::new(target_pg).await;
    source
        .exec(
            "CREATE TABLE g (id int PRIMARY KEY, a int NOT NULL, b int AS (a * 2) VIRTUAL,
                             c int AS (a * 3) PERSISTENT);
             INSERT INTO g (id, a) VALUES (1, 1), (2, 2);",
        )
        .await;
    let table = format!("{}.g", source.name().await);
    let schema = target.schema().await;
    let args = [
        "--table",
        &table,
        "--until-current",
        "--target-schema",
        &schema,
    ];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    source
        .exec("UPDATE g SET a = 10 WHERE id = 1; INSERT INTO g (id, a) VALUES (3, 3); DELETE FROM g WHERE id = 2;")
        .await;
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    if target_pg {
        same(&source, &target, "SELECT id, a FROM g ORDER BY id").await;
        let columns = target
            .rows("SELECT count(*) FROM information_schema.columns WHERE table_name = 'g'")
            .await;
        assert_eq!(columns, ["2"], "generated columns left out");
    } else {
        same(&source, &target, "SELECT id, a, b, c FROM g ORDER BY id").await;
        let generated = target
            .rows(&format!(
                "SELECT COLUMN_NAME, EXTRA FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = '{schema}' AND TABLE_NAME = 'g' AND EXTRA LIKE '%GENERATED' \
                 ORDER BY COLUMN_NAME"
            ))
            .await;
        assert_eq!(generated, ["b|VIRTUAL GENERATED", "c|STORED GENERATED"]);
    }
    drop_replication(&source, &target, &args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_generated_columns_are_generated_on_a_mariadb_target() {
    mariadb_generated_columns(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_generated_columns_are_left_out_on_a_pg_target() {
    mariadb_generated_columns(true).await;
}

/// A keyless table with REPLICA IDENTITY FULL: an update that leaves an out-of-line value
/// unchanged is applied (the old row carries the value), and rows that are equal stay as many.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_keyless_full_identity_with_an_unchanged_large_value() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE audit (k int, note text, body text);
             ALTER TABLE audit REPLICA IDENTITY FULL;
             ALTER TABLE audit ALTER COLUMN body SET STORAGE EXTERNAL;
             INSERT INTO audit SELECT g % 3, 'n', repeat(md5(g::text), 200)
               FROM generate_series(1, 6) g;",
        )
        .await;
    let args = ["--table", "public.audit", "--until-current"];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    source
        .exec(
            "UPDATE audit SET note = 'changed' WHERE k = 1;
             DELETE FROM audit WHERE k = 2 AND note = 'n' AND body LIKE md5('2') || '%';
             INSERT INTO audit VALUES (9, 'new', repeat('z', 9000));",
        )
        .await;
    catch_up(
        &source,
        &target,
        &args,
        &["SELECT k, note, md5(body) FROM audit ORDER BY k, note, md5(body)"],
    )
    .await;
    drop_replication(&source, &target, &args).await;
}

/// REPLICA IDENTITY USING INDEX on a unique key other than the primary key: old rows come
/// with that key's columns only, so updates and deletes are matched by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_replica_identity_on_another_unique_index() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE users (id bigint PRIMARY KEY, email text NOT NULL UNIQUE, name text);
             ALTER TABLE users REPLICA IDENTITY USING INDEX users_email_key;
             INSERT INTO users VALUES (1, 'a@x', 'A'), (2, 'b@x', 'B'), (3, 'c@x', 'C');",
        )
        .await;
    let args = ["--table", "public.users", "--until-current"];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    source
        .exec(
            "DELETE FROM users WHERE id = 1;
             UPDATE users SET id = 20 WHERE id = 2;
             UPDATE users SET email = 'c2@x', name = 'C2' WHERE id = 3;",
        )
        .await;
    let dir = tempdir();
    let path = dir.path().join("r.json");
    let mut cmd = replicate_cmd(&source, &target, &args).await;
    cmd.arg("--report-json").arg(&path);
    run(&mut cmd).ok();
    same(
        &source,
        &target,
        "SELECT id, email, name FROM users ORDER BY id",
    )
    .await;
    assert_eq!(report(&path)["unmatched"].as_u64(), Some(0));
    drop_replication(&source, &target, &args).await;
}

/// pgbench's shape: every transaction updates keyed rows (some hot) and inserts into a keyless
/// history table. The inserts commute, so transactions group into few target transactions
/// instead of one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_keyless_inserts_beside_hot_rows_group_into_few_units() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE acct (id int PRIMARY KEY, bal bigint NOT NULL);
             INSERT INTO acct SELECT g, 0 FROM generate_series(1, 50) g;
             CREATE TABLE branch (id int PRIMARY KEY, bal bigint NOT NULL);
             INSERT INTO branch VALUES (1, 0), (2, 0);
             CREATE TABLE history (aid int NOT NULL, delta int NOT NULL, mtime timestamptz);
             ALTER TABLE history REPLICA IDENTITY FULL;",
        )
        .await;
    let args = [
        "--table",
        "public.acct",
        "--table",
        "public.branch",
        "--table",
        "public.history",
        "--until-current",
        "--parallel",
        "4",
    ];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    let mut s = Session::open(&source).await;
    let transactions = 600;
    for i in 0..transactions {
        let (aid, delta) = (i % 50 + 1, i % 7 - 3);
        s.exec(&format!(
            "BEGIN; UPDATE acct SET bal = bal + {delta} WHERE id = {aid};
             UPDATE branch SET bal = bal + {delta} WHERE id = {};
             INSERT INTO history VALUES ({aid}, {delta}, now()); COMMIT;",
            i % 2 + 1
        ))
        .await;
    }
    let dir = tempdir();
    let path = dir.path().join("r.json");
    let mut cmd = replicate_cmd(&source, &target, &args).await;
    cmd.arg("--report-json").arg(&path);
    run(&mut cmd).ok();
    let r = report(&path);
    let (units, applied) = (
        r["units"].as_u64().unwrap(),
        r["transactions"].as_u64().unwrap(),
    );
    assert!(applied >= transactions as u64, "{r}");
    assert!(
        units * 4 <= applied,
        "{units} target transactions for {applied} source transactions: {r}"
    );
    same(&source, &target, "SELECT id, bal FROM acct ORDER BY id").await;
    same(&source, &target, "SELECT id, bal FROM branch ORDER BY id").await;
    same(
        &source,
        &target,
        "SELECT aid, delta, mtime FROM history ORDER BY aid, delta, mtime",
    )
    .await;
    drop_replication(&source, &target, &args).await;
}

/// Rows the target no longer holds (removed there by hand): the source's update and delete of
/// them match nothing, and the report counts them, loudly, on either target engine.
async fn unmatched_changes_are_counted(target_pg: bool) {
    let source = Db::new(true).await;
    let target = Db::new(target_pg).await;
    source
        .exec(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL);
             INSERT INTO t SELECT g, g FROM generate_series(1, 10) g;",
        )
        .await;
    let args = ["--table", "public.t", "--until-current"];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    target.exec("DELETE FROM t WHERE id IN (3, 4)").await;
    source
        .exec("UPDATE t SET v = 0 WHERE id IN (3, 5); DELETE FROM t WHERE id = 4;")
        .await;
    let dir = tempdir();
    let path = dir.path().join("r.json");
    let mut cmd = replicate_cmd(&source, &target, &args).await;
    cmd.arg("--report-json").arg(&path);
    let r = run(&mut cmd);
    r.ok();
    assert_eq!(report(&path)["unmatched"].as_u64(), Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("matched no row"), "{}", r.stderr);
    drop_replication(&source, &target, &args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_unmatched_updates_and_deletes_are_counted() {
    unmatched_changes_are_counted(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_to_mariadb_unmatched_updates_and_deletes_are_counted() {
    unmatched_changes_are_counted(false).await;
}

/// An idle replication on a server busy in another database (a stream of keepalives with new
/// WAL positions) records its position now and then, not at every keepalive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_an_idle_replication_commits_its_position_rarely() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    let busy = Db::new(true).await;
    source
        .exec("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1);")
        .await;
    busy.exec("CREATE TABLE churn (id bigserial PRIMARY KEY, pad text)")
        .await;
    let args = ["--table", "public.t", "--until-current"];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    let dir = tempdir();
    let path = dir.path().join("r.json");
    let mut cmd = replicate_cmd(&source, &target, &["--table", "public.t"]).await;
    cmd.arg("--report-json").arg(&path);
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Another database's transactions: the slot decodes and skips them, and the server
    // sends keepalives with its new position as it goes.
    let mut churn = Session::open(&busy).await;
    for _ in 0..10 {
        churn
            .exec("INSERT INTO churn (pad) SELECT repeat('x', 200) FROM generate_series(1, 20000)")
            .await;
    }
    crate::common::signal(&child, libc::SIGTERM);
    let r: Run = finish(child).into();
    r.ok();
    let rep = report(&path);
    let (units, wall) = (
        rep["units"].as_u64().unwrap(),
        rep["wall_seconds"].as_f64().unwrap(),
    );
    assert!(
        (units as f64) <= 2.0 + wall / 5.0,
        "{units} target transactions in {wall:.1} s of an idle replication: {rep}"
    );
    same(&source, &target, "SELECT id FROM t").await;
    drop_replication(&source, &target, &args).await;
}

/// Tables created on the source that the replication's pattern matches join it: created on
/// the target, loaded under a snapshot of their own and followed from its position — exactly
/// once under a writer inserting into the new table throughout, with the run killed (SIGKILL)
/// once right after a new table is recorded and once in the middle of its load, and a second
/// table created while no run is going; a table dropped on the source is reported.
async fn created_tables_join_the_replication(source_pg: bool, target_pg: bool) {
    let source = Db::new(source_pg).await;
    let target = Db::new(target_pg).await;
    source
        .exec(
            "CREATE TABLE a (id int PRIMARY KEY, v varchar(20));
             INSERT INTO a VALUES (1, 'x'), (2, 'y');
             CREATE TABLE tick (id int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO tick VALUES (1, 0);",
        )
        .await;
    let schema = source.schema().await;
    let pattern = format!("{schema}\\..*");
    // Into PostgreSQL the tables go into public; into MariaDB, the target URL's database.
    let mut args = vec![
        "--tables",
        &pattern,
        "--until-current",
        "--chunk-size",
        "64KB",
    ];
    if target_pg {
        args.extend(["--target-schema", "public"]);
    }
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    source
        .exec("CREATE TABLE b (id int PRIMARY KEY, v varchar(40) NOT NULL)")
        .await;
    let fill = if source_pg {
        "INSERT INTO b SELECT g, repeat('p', 30) FROM generate_series(1, 20000) g"
    } else {
        "INSERT INTO b SELECT seq, REPEAT('p', 30) FROM seq_1_to_20000"
    };
    source.exec(fill).await;
    let writer = inserts_into_b(&source).await;
    for point in ["replicate.after_take_in_recorded", "export.after_receipt"] {
        let fp = Failpoints::new();
        let mut cmd = replicate_cmd(&source, &target, &args).await;
        fp.arm(&mut cmd, &format!("{point}=wait@1"));
        let mut child = crate::common::spawn(&mut cmd);
        fp.reached(point, &mut child).await;
        crate::common::signal(&child, libc::SIGKILL);
        let killed: Run = finish(child).into();
        assert_ne!(killed.code, 0, "{}", killed.stderr);
    }
    let r = run(&mut replicate_cmd(&source, &target, &args).await);
    r.ok();
    let b = format!("{schema}.b");
    assert!(r.stderr.contains(&format!("joined: {b} (")), "{}", r.stderr);
    // A table created while no run goes joins at the next start.
    source
        .exec("CREATE TABLE c (id int PRIMARY KEY); INSERT INTO c VALUES (1), (2);")
        .await;
    let inserted = writer.stop_after(20).await;
    assert!(inserted > 20, "the writer inserted into b throughout");
    let dir = tempdir();
    let path = dir.path().join("r.json");
    let mut cmd = replicate_cmd(&source, &target, &args).await;
    cmd.arg("--report-json").arg(&path);
    run(&mut cmd).ok();
    let added = report(&path)["added"].clone();
    assert_eq!(added[0]["table"], format!("{schema}.c"), "{added}");
    for sql in [
        "SELECT id, v FROM a ORDER BY id",
        "SELECT id, v FROM b ORDER BY id",
        "SELECT id FROM c ORDER BY id",
    ] {
        same(&source, &target, sql).await;
    }
    // A table dropped on the source is said, not passed over: its rows stay on the target.
    source.exec("DROP TABLE c").await;
    let mut cmd = replicate_cmd(&source, &target, &args).await;
    cmd.arg("--report-json").arg(&path);
    let r = run(&mut cmd);
    r.ok();
    let c = format!("{schema}.c");
    assert!(
        r.stderr
            .contains(&format!("WARNING: {c} is no longer on the source")),
        "{}",
        r.stderr
    );
    assert_eq!(report(&path)["gone"], serde_json::json!([c]));
    assert_eq!(
        target.rows("SELECT id FROM c ORDER BY id").await,
        ["1", "2"]
    );
    // A table recorded to join (the run killed before its load) and dropped before the next
    // run is given up, not a reason for every later run to fail.
    source.exec("CREATE TABLE d (id int PRIMARY KEY)").await;
    let fp = Failpoints::new();
    let mut cmd = replicate_cmd(&source, &target, &args).await;
    fp.arm(&mut cmd, "replicate.after_take_in_recorded=wait@1");
    let mut child = crate::common::spawn(&mut cmd);
    fp.reached("replicate.after_take_in_recorded", &mut child)
        .await;
    crate::common::signal(&child, libc::SIGKILL);
    let _: Run = finish(child).into();
    source.exec("DROP TABLE d").await;
    let r = run(&mut replicate_cmd(&source, &target, &args).await);
    r.ok();
    assert!(r.stderr.contains("given up"), "{}", r.stderr);
    drop_replication(&source, &target, &args).await;
}

/// Inserts into `b` from id 100001 on, one row a transaction, until stopped.
async fn inserts_into_b(db: &Db) -> crate::common::writer::Background {
    let mut s = Session::open(db).await;
    let w = crate::common::writer::Background::spawn(|stop, commits| async move {
        let mut id = 100_000;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            id += 1;
            s.exec(&format!("INSERT INTO b VALUES ({id}, 'during')"))
                .await;
            commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    w.wait_for(5).await;
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_created_tables_join_the_replication() {
    created_tables_join_the_replication(true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_created_tables_join_the_replication() {
    created_tables_join_the_replication(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_to_mariadb_created_tables_join_the_replication() {
    created_tables_join_the_replication(true, false).await;
}

/// A replicated table dropped and created again under its name on PostgreSQL leaves the
/// publication sluice created, so its changes would stop arriving: the replication stops,
/// naming it, instead of letting the target's copy fall behind without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_a_table_created_again_under_its_name_stops_the_replication() {
    let source = Db::new(true).await;
    let target = Db::new(true).await;
    source
        .exec(
            "CREATE TABLE a (id int PRIMARY KEY, v text); INSERT INTO a VALUES (1, 'x');
             CREATE TABLE tick (id int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO tick VALUES (1, 0);",
        )
        .await;
    let args = ["--tables", "public\\..*", "--until-current"];
    run(&mut replicate_cmd(&source, &target, &args).await).ok();
    let writer = ticker(&source).await;
    source
        .exec("DROP TABLE a; CREATE TABLE a (id int PRIMARY KEY, v text); INSERT INTO a VALUES (2, 'y');")
        .await;
    writer.wait_for(5).await;
    let r = run(&mut replicate_cmd(&source, &target, &args).await);
    writer.stop().await;
    r.failed(&[
        "public.a is replicated by",
        "no longer in its publication",
        "--slot",
    ]);
    // Everything before the stop is applied: the other table followed.
    assert!(
        target.rows("SELECT n FROM tick").await[0]
            .parse::<u64>()
            .unwrap()
            >= 5
    );
    // The way on the message gives: this replication without the table, and the table in a
    // replication of its own into an emptied table.
    let name = r
        .stderr
        .split("--slot ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the message names the replication")
        .to_string();
    let rest = ["--slot", &name, "--table", "public.tick", "--until-current"];
    let on = run(&mut replicate_cmd(&source, &target, &rest).await);
    on.ok();
    assert!(
        on.stderr.contains("WARNING: public.a is no longer"),
        "{}",
        on.stderr
    );
    target.exec("DELETE FROM a").await;
    let own = [
        "--slot",
        "a_again",
        "--table",
        "public.a",
        "--until-current",
    ];
    catch_up(&source, &target, &own, &["SELECT id, v FROM a ORDER BY id"]).await;
    drop_replication(&source, &target, &own).await;
    drop_replication(&source, &target, &rest).await;
}
