//! The scenarios of an apply target, each written once for every engine (see [`super`]).
//! What they check is read back from the target's tables and bookkeeping with SQL.

use super::{Engine, Target, apply_commit, change, ins, position, rows, unit, upd};
use sluice_core::apply::{Barrier, ColumnChange, SourceColumn};
use sluice_core::table::TableRef;

/// A delete of `acct`'s row `id`, carrying its key only.
fn del_acct(id: &str) -> super::Change {
    change(
        "delete",
        &[Some(id), None, None, None],
        &["name", "note", "n"],
    )
}

/// A delete of a `bag` row, matched by every column it carries.
fn del_bag(a: Option<&str>, b: Option<&str>) -> super::Change {
    change("delete", &[a, b], &[])
}

/// `rows` sorted, to compare with what the target reads back (sorted the same way).
fn sorted(rows: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
    v.sort();
    v
}

/// Inserts (quotes, backslashes and SQL in values stay data), an update that leaves an absent
/// column alone, deletes, a key update (delete + insert), and a keyless table whose delete
/// removes one of equal rows and matches NULL with NULL, interleaved with the keyed table's
/// rows, on two workers: the tables hold exactly that; the applied position is the highest
/// unit of any worker, each worker with its row; a rolled-back unit (one past the send
/// buffer too) leaves nothing, its position included; state is saved, replaced and cleared
/// with the positions.
pub async fn units_apply_in_order(engine: Engine) {
    let mut t = Target::new(engine).await;
    t.create().await;
    assert!(t.applied().await.is_none());
    let mut s0 = t.session(0).await;
    let mut s1 = t.session(1).await;
    let first = unit(vec![
        rows(
            &t.acct,
            &["id"],
            &[
                ins(&[Some("1"), Some("o'neil"), Some("keep me"), Some("1")]),
                ins(&[Some("2"), Some("back\\slash"), None, Some("2")]),
                ins(&[
                    Some("3"),
                    Some("'); DROP TABLE bag; --"),
                    Some("\\'); DROP TABLE bag; --"),
                    None,
                ]),
                ins(&[Some("4"), Some("it's \\ 😀"), Some("n4"), None]),
            ],
        ),
        rows(
            &t.bag,
            &[],
            &[
                ins(&[Some("1"), Some("x")]),
                ins(&[Some("1"), Some("x")]),
                ins(&[Some("2"), None]),
                ins(&[None, Some("n")]),
            ],
        ),
    ]);
    apply_commit(&mut s0, &first, 1).await;
    assert_eq!(t.applied().await, Some(position(1)));
    assert_eq!(
        t.target_rows("name, note", "acct", "WHERE id = 3").await,
        ["'); DROP TABLE bag; --|\\'); DROP TABLE bag; --"],
        "quotes and backslashes are data, never SQL"
    );
    let mut both = unit(vec![
        rows(
            &t.acct,
            &["id"],
            &[
                upd(&[Some("1"), Some("o'neil 2"), None, Some("10")], &["note"]),
                del_acct("3"),
                del_acct("2"),
                ins(&[Some("20"), Some("back\\slash"), Some("moved"), Some("2")]),
            ],
        ),
        rows(
            &t.bag,
            &[],
            &[del_bag(Some("1"), Some("x")), del_bag(Some("2"), None)],
        ),
    ]);
    // Interleave the two tables' rows: acct 0, bag 0, acct 1..2, bag 1, acct 3.
    both.order = vec![(0, 0), (1, 0), (0, 1), (0, 2), (1, 1), (0, 3)];
    apply_commit(&mut s1, &both, 2).await;
    assert_eq!(
        t.target_rows("*", "acct", "").await,
        sorted(&[
            "1|o'neil 2|keep me|10",
            "20|back\\slash|moved|2",
            "4|it's \\ 😀|n4|∅"
        ])
    );
    assert_eq!(t.target_rows("*", "bag", "").await, ["1|x", "∅|n"]);
    // A keyless update or delete touches one row even when several match.
    let dup = rows(
        &t.bag,
        &[],
        &[ins(&[Some("1"), Some("x")]), ins(&[Some("1"), Some("x")])],
    );
    apply_commit(&mut s0, &unit(vec![dup]), 3).await;
    let gone = rows(
        &t.bag,
        &[],
        &[del_bag(None, Some("n")), del_bag(Some("1"), Some("x"))],
    );
    apply_commit(&mut s1, &unit(vec![gone]), 4).await;
    assert_eq!(t.target_rows("*", "bag", "").await, ["1|x", "1|x"]);

    assert_eq!(t.applied().await, Some(position(4)));
    let workers = format!(
        "SELECT name, worker, unit FROM sluice.applied WHERE name = '{}'",
        t.name
    );
    assert_eq!(
        t.target_query(&workers).await,
        [format!("{}|0|3", t.name), format!("{}|1|4", t.name)]
    );
    let note = "x".repeat(400);
    let ids: Vec<(String, String)> = (0..3000)
        .map(|i| ((1000 + i).to_string(), format!("u{i:04}")))
        .collect();
    let big: Vec<super::Change> = ids
        .iter()
        .map(|(id, name)| ins(&[Some(id), Some(name), Some(&note), None]))
        .collect();
    s0.begin().await.expect("begin");
    s0.apply(&unit(vec![rows(&t.acct, &["id"], &big)]))
        .await
        .expect("apply");
    if engine == Engine::Postgres {
        assert_eq!(
            t.target_query(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' \
                 AND datname = current_database()"
            )
            .await,
            ["1"],
            "the first megabyte is sent, in the open transaction"
        );
    }
    s0.record(&position(5)).await.expect("record");
    s0.rollback().await.expect("rollback");
    assert_eq!(t.applied().await, Some(position(4)));
    assert_eq!(
        t.target_rows("count(*)", "acct", "WHERE id >= 1000").await,
        ["0"]
    );

    let name = t.name.clone();
    assert_eq!(t.target.load_state(&name).await.expect("load"), None);
    t.target
        .save_state(&name, b"{\"a\":1}")
        .await
        .expect("save");
    t.target
        .save_state(&name, b"{\"a\":2}")
        .await
        .expect("save");
    assert_eq!(
        t.target.load_state(&name).await.expect("load").as_deref(),
        Some(&b"{\"a\":2}"[..])
    );
    t.target.clear_state(&name).await.expect("clear");
    assert_eq!(t.target.load_state(&name).await.expect("load"), None);
    assert_eq!(t.applied().await, None, "cleared with the state");
}

/// A unit whose statements pass the send buffer's bound (1,000 rows of 3,000-byte notes) is
/// sent in pieces before its position and arrives whole.
pub async fn past_the_send_buffer(engine: Engine) {
    let mut t = Target::new(engine).await;
    t.create().await;
    let note = "n".repeat(3000);
    let ids: Vec<(String, String)> = (0..1000)
        .map(|i| (i.to_string(), format!("u{i}")))
        .collect();
    let changes: Vec<super::Change> = ids
        .iter()
        .map(|(id, name)| ins(&[Some(id), Some(name), Some(&note), Some("1")]))
        .collect();
    let mut s = t.session(0).await;
    apply_commit(&mut s, &unit(vec![rows(&t.acct, &["id"], &changes)]), 1).await;
    assert_eq!(
        t.target_rows("count(*), sum(length(note))", "acct", "")
            .await,
        ["1000|3000000"]
    );
}

/// A unique violation (the primary key, then another unique key) is a conflict; a later unit
/// waiting for a row an earlier, uncommitted one holds (an insert of its key, an update of
/// it) gets a conflict naming the table instead of a hang; anything else is permanent and
/// names the table; a lost connection is transient, not a conflict.
pub async fn conflicts(engine: Engine) {
    let mut t = Target::new(engine).await;
    t.create().await;
    let row = |t: &Target, id: &str, name: &str| {
        unit(vec![rows(
            &t.acct,
            &["id"],
            &[ins(&[Some(id), Some(name), None, None])],
        )])
    };
    let mut a = t.session(0).await;
    let mut b = t.session(1).await;
    apply_commit(&mut a, &row(&t, "1", "one"), 1).await;
    for u in [row(&t, "1", "uno"), row(&t, "2", "one")] {
        b.begin().await.expect("begin");
        b.apply(&u).await.expect("apply");
        b.record(&position(2)).await.expect("record");
        let e = b.send().await.expect_err("a unique violation");
        assert!(e.is_apply_conflict(), "{e}");
        assert!(e.to_string().contains("acct"), "names the table: {e}");
        b.rollback().await.expect("rollback");
    }
    a.begin().await.expect("begin");
    a.apply(&row(&t, "3", "three")).await.expect("apply");
    a.record(&position(3)).await.expect("record");
    a.send().await.expect("send");
    b.begin().await.expect("begin");
    b.apply(&row(&t, "3", "drei")).await.expect("apply");
    b.record(&position(4)).await.expect("record");
    let e = b.send().await.expect_err("a lock wait given up");
    assert!(e.is_apply_conflict(), "{e}");
    assert!(e.to_string().contains("acct"), "names the table: {e}");
    b.rollback().await.expect("rollback");
    a.commit().await.expect("commit");
    assert_eq!(
        t.target_rows("id, name", "acct", "").await,
        ["1|one", "3|three"]
    );
    assert_eq!(t.applied().await, Some(position(3)));
    let set_n = |t: &Target, n: &str| {
        unit(vec![rows(
            &t.acct,
            &["id"],
            &[upd(&[Some("1"), Some("one"), None, Some(n)], &["note"])],
        )])
    };
    a.begin().await.expect("begin");
    a.apply(&set_n(&t, "60")).await.expect("apply");
    a.record(&position(4)).await.expect("record");
    a.send().await.expect("send");
    b.begin().await.expect("begin");
    b.apply(&set_n(&t, "70")).await.expect("apply");
    b.record(&position(5)).await.expect("record");
    let e = b.send().await.expect_err("a lock wait given up");
    assert!(e.is_apply_conflict(), "{e}");
    b.rollback().await.expect("rollback");
    a.commit().await.expect("commit");
    assert_eq!(t.target_rows("n", "acct", "WHERE id = 1").await, ["60"]);
    assert_eq!(t.applied().await, Some(position(4)));

    let acct = t.on_target("acct");
    t.target_exec(&format!(
        "ALTER TABLE {acct} ADD CONSTRAINT small CHECK (id < 100)"
    ))
    .await;
    b.begin().await.expect("begin");
    b.apply(&row(&t, "100", "big")).await.expect("apply");
    b.record(&position(5)).await.expect("record");
    let e = b.send().await.expect_err("a check violation");
    assert!(!e.is_apply_conflict() && !e.is_transient(), "{e}");
    assert!(e.to_string().contains(&acct), "names the table: {e}");
    b.rollback().await.expect("rollback");

    b.begin().await.expect("begin");
    t.kill_target_sessions().await;
    b.apply(&row(&t, "7", "seven")).await.expect("apply");
    b.record(&position(6)).await.expect("record");
    let e = b.send().await.expect_err("a lost connection");
    assert!(e.is_transient() && !e.is_apply_conflict(), "{e}");
    assert_eq!(e.kind(), sluice_core::ErrorKind::Destination, "{e}");
}

/// The source gains a column, loses one and retypes one; the barrier that brings the target
/// along, applied twice, gives the source's columns both times and keeps the row; a truncate
/// barrier twice leaves the table empty; the initial load's truncate empties a table. A target
/// whose DDL commits by itself says so (the barrier commits what precedes it first).
pub async fn barriers_applied_twice(engine: Engine) {
    let mut t = Target::new(engine).await;
    t.create().await;
    let mut s = t.session(0).await;
    let first = rows(
        &t.acct,
        &["id"],
        &[ins(&[Some("1"), Some("one"), Some("n"), Some("1")])],
    );
    apply_commit(&mut s, &unit(vec![first]), 1).await;
    let alter = t.sql(
        "ALTER TABLE acct ADD COLUMN extra numeric(8,2), DROP COLUMN note,
           ALTER COLUMN n TYPE bigint",
        "ALTER TABLE acct DROP COLUMN note, ADD COLUMN extra decimal(8,2), MODIFY n bigint",
    );
    t.source_exec(alter).await;
    let columns = Barrier::Columns(ColumnChange {
        table: t.acct.table.clone(),
        before: SourceColumn::of(&t.acct.columns),
        columns: t.describe_again("acct").await,
        source_engine: t.acct.source_engine,
    });
    let commits_first = engine != Engine::Postgres;
    let mut shapes = Vec::new();
    for round in 0..2u64 {
        s.begin().await.expect("begin");
        let committed = s.barrier(&columns, &position(1)).await.expect("barrier");
        assert_eq!(
            committed, commits_first,
            "whether the barrier commits first"
        );
        s.record(&position(2 + round)).await.expect("record");
        s.commit().await.expect("commit");
        shapes.push(t.shape(true).await);
    }
    assert_eq!(shapes[0], shapes[1]);
    assert_eq!(shapes[0], t.shape(false).await, "the source's columns");
    assert_eq!(
        t.target_rows("id, name, n, extra", "acct", "").await,
        ["1|one|1|∅"]
    );
    let truncate = Barrier::Truncate(vec![t.acct.table.clone()]);
    for round in 0..2u64 {
        s.begin().await.expect("begin");
        let committed = s.barrier(&truncate, &position(3)).await.expect("barrier");
        assert_eq!(
            committed, commits_first,
            "whether the barrier commits first"
        );
        s.record(&position(4 + round)).await.expect("record");
        s.commit().await.expect("commit");
        assert_eq!(t.target_rows("count(*)", "acct", "").await, ["0"]);
        let full = t
            .target
            .non_empty(std::slice::from_ref(&t.acct.table))
            .await;
        assert!(full.expect("non_empty").is_empty());
    }
    assert_eq!(t.applied().await, Some(position(5)));
    let bag = t.on_target("bag");
    t.target_exec(&format!("INSERT INTO {bag} VALUES (1, 'x')"))
        .await;
    t.target
        .truncate(std::slice::from_ref(&t.bag.table))
        .await
        .expect("truncate");
    assert_eq!(t.target_rows("count(*)", "bag", "").await, ["0"]);
}

/// Bookkeeping an earlier release created (no `skip` column, no `columns` table) holding a
/// position is brought up to date by the next run, its rows kept: a replication continues
/// across the upgrade. MySQL/MariaDB's bookkeeping database is the server's, so the test takes the
/// server alone while it changes it.
pub async fn earlier_bookkeeping(engine: Engine) {
    let mut t = Target::alone(engine).await;
    let row = format!(
        "INSERT INTO sluice.applied (name, worker, unit, restart, pos)
           VALUES ('{}', 0, 4, '0000000000000010', '000000000000000F');",
        t.name
    );
    if engine == Engine::Postgres {
        t.target_exec(
            "CREATE SCHEMA sluice;
             CREATE TABLE sluice.applied (name text NOT NULL, worker integer NOT NULL,
               unit bigint NOT NULL, restart text NOT NULL, pos text NOT NULL, commit_ts bigint,
               updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (name, worker));
             CREATE TABLE sluice.state (name text PRIMARY KEY, state bytea NOT NULL,
               updated_at timestamptz NOT NULL DEFAULT now());",
        )
        .await;
    } else {
        t.target.prepare().await.expect("prepare");
        t.target_exec("ALTER TABLE sluice.applied DROP COLUMN skip; DROP TABLE sluice.columns")
            .await;
    }
    t.target_exec(&row).await;
    t.target.prepare().await.expect("prepare");
    let applied = t.applied().await.expect("the position is kept");
    assert_eq!((applied.unit, applied.skip), (4, 0));
    let name = t.name.clone();
    let followed = t.target.followed_columns(&name).await.expect("followed");
    assert!(followed.is_empty());
    let followed = vec![(
        TableRef::new("public", "t"),
        vec![SourceColumn {
            name: "id".into(),
            source_type: "integer".into(),
        }],
    )];
    t.target
        .save_columns(&name, &followed)
        .await
        .expect("save_columns");
    assert_eq!(
        t.target.followed_columns(&name).await.expect("followed"),
        followed
    );
    let shape = t
        .target_query(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS
             WHERE TABLE_SCHEMA = 'sluice' AND TABLE_NAME IN ('applied', 'columns')
               AND COLUMN_NAME IN ('skip', 'columns')",
        )
        .await;
    assert_eq!(shape, ["columns", "skip"]);
}
