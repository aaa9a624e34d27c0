//! The collector's side of the fixes that keep a replication exact and moving: a transaction
//! far larger than the streaming threshold fed in one source read reaches the workers (it
//! used to wait for ever for a worker that could not take it), a barrier carries the position
//! of the changes before it, a restart inside a transaction passes over what is applied, and
//! inserts into a table without a key no longer make a unit exclusive.

#![allow(clippy::unwrap_used)]

use super::collect::{Collector, Piece};
use super::tests::{Log, Recorder, collector, collector_of, limits, transaction};
use super::worker::{ApplyCounters, Pool};
use arrow_schema::DataType;
use sluice_core::StreamPos;
use sluice_core::apply::{AppliedPosition, ApplyTarget, Barrier};
use sluice_core::change::{ChangeOp, ChangeSink, TxMeta};
use sluice_core::columns::field;
use sluice_core::table::{ColumnDesc, TableRef};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn tx(c: &mut Collector, n: u64) {
    c.begin(TxMeta {
        pos: StreamPos::from_adapter(format!("{n:08}")),
        xid: n.to_string(),
        commit_ts: None,
    })
    .unwrap();
}

/// A change of row `id` (the collector may pass over it: then no value is appended).
fn change(c: &mut Collector, h: usize, op: ChangeOp, id: i64) {
    if let Some(rows) = c.row(h, op).unwrap() {
        rows.columns()[0].push_i64(id).unwrap();
    }
    c.row_done().unwrap();
}

fn insert(c: &mut Collector, h: usize, id: i64) {
    change(c, h, ChangeOp::Insert, id);
}

fn truncate(c: &mut Collector, h: usize) {
    assert!(c.row(h, ChangeOp::Truncate).unwrap().is_none());
    c.row_done().unwrap();
}

/// What the ready units hold: `rows:N` per rows piece, `truncate@skip` per barrier.
fn pieces(c: &Collector) -> Vec<Vec<String>> {
    c.ready
        .iter()
        .map(|r| {
            r.work
                .pieces
                .iter()
                .map(|p| match p {
                    Piece::Rows(u) => format!("rows:{}", u.order.len()),
                    Piece::Barrier(Barrier::Truncate(_), at) => format!("truncate@{}", at.skip),
                    Piece::Barrier(_, at) => format!("columns@{}", at.skip),
                })
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_far_past_the_streaming_threshold_reaches_the_workers() {
    let log = Arc::new(Log::default());
    let target: Arc<dyn ApplyTarget> = Arc::new(Recorder { log: log.clone() });
    let counters = Arc::new(ApplyCounters::default());
    let pool = Pool::start(&target, "r", 2, 0, counters.clone())
        .await
        .unwrap();
    let (_, table, columns) = collector(false, 100);
    // A streaming threshold of a few rows: the transaction below is hundreds of pieces,
    // all fed before control returns, as one source read does.
    let mut c = collector_of(
        &table,
        &columns,
        &["id"],
        limits(100, 1 << 10, Duration::ZERO),
    );
    c.set_busy(pool.busy_fn());
    c.set_handoff(pool.handoff());
    let feed = tokio::spawn(async move {
        transaction(&mut c, &table, &columns, 1, &[-1]);
        tx(&mut c, 2);
        let h = c.relation(&table, &columns).unwrap();
        for id in 0..20_000 {
            insert(&mut c, h, id);
        }
        c.commit(&StreamPos::from_adapter("00000002")).unwrap();
        c
    });
    let mut c = tokio::time::timeout(Duration::from_secs(30), feed)
        .await
        .expect("the source read never returned: its pieces were not taken")
        .unwrap();
    c.cut().unwrap();
    pool.add(std::mem::take(&mut c.ready));
    tokio::time::timeout(
        Duration::from_secs(30),
        pool.wait_until(|p| p.unfinished() == 0),
    )
    .await
    .unwrap()
    .unwrap();
    pool.stop().await.unwrap();
    assert_eq!(counters.transactions.load(Ordering::Relaxed), 2);
    assert_eq!(counters.changes.load(Ordering::Relaxed), 20_001);
    assert!(log.lines().iter().any(|l| l.starts_with("commit")));
}

#[test]
fn a_barrier_carries_the_position_of_the_changes_before_it() {
    let (mut c, table, columns) = collector(true, 100);
    c.restart = Some(StreamPos::from_adapter("00000001"));
    tx(&mut c, 2);
    let h = c.relation(&table, &columns).unwrap();
    insert(&mut c, h, 10);
    insert(&mut c, h, 11);
    truncate(&mut c, h);
    insert(&mut c, h, 12);
    c.commit(&StreamPos::from_adapter("00000002")).unwrap();
    c.cut().unwrap();
    assert_eq!(pieces(&c), [["rows:2", "truncate@2", "rows:1"]]);
    let Piece::Barrier(_, at) = &c.ready[0].work.pieces[1] else {
        panic!("no barrier");
    };
    assert_eq!(
        (at.restart.as_str(), at.pos.as_str(), at.skip),
        ("00000001", "00000002", 2),
        "restart before the transaction, its position, and its changes before the barrier"
    );
}

/// The position of a target that stands inside source transaction 2 (restart at 1), its
/// first three changes applied.
fn inside_transaction_2() -> AppliedPosition {
    AppliedPosition {
        unit: 7,
        restart: StreamPos::from_adapter("00000001"),
        pos: StreamPos::from_adapter("00000002"),
        commit_ts: None,
        skip: 3,
    }
}

#[test]
fn a_restart_inside_a_transaction_passes_over_what_is_applied() {
    let (mut c, table, columns) = collector(true, 100);
    c.resume_at(&inside_transaction_2());
    // A transaction before it is applied whole; the one the target stands inside loses its
    // first three changes — two rows and the truncate among them — and keeps the rest (both
    // in one unit: the workers are busy).
    transaction(&mut c, &table, &columns, 1, &[1]);
    tx(&mut c, 2);
    let h = c.relation(&table, &columns).unwrap();
    insert(&mut c, h, 10);
    truncate(&mut c, h);
    insert(&mut c, h, 11);
    insert(&mut c, h, 12);
    truncate(&mut c, h);
    c.commit(&StreamPos::from_adapter("00000002")).unwrap();
    c.cut().unwrap();
    let all: Vec<String> = pieces(&c).into_iter().flatten().collect();
    assert_eq!(all, ["rows:2", "truncate@4"]);
    assert_eq!(
        c.ready[0].work.changes, 2,
        "row 1 of the first, row 12 of the second"
    );
}

#[test]
fn a_restart_whose_transaction_never_comes_fails_loudly() {
    let (mut c, _, _) = collector(true, 100);
    c.resume_at(&inside_transaction_2());
    let e = c
        .begin(TxMeta {
            pos: StreamPos::from_adapter("00000003"),
            xid: "3".into(),
            commit_ts: None,
        })
        .unwrap_err();
    assert!(e.to_string().contains("00000002"), "{e}");
}

#[test]
fn inserts_into_a_keyless_table_leave_a_unit_shared() {
    let table = TableRef::new("s", "log");
    let columns = vec![ColumnDesc {
        name: "v".into(),
        source_type: "bigint".into(),
        field: field("v", DataType::Int64),
        cast: None,
        as_text_fallback: false,
    }];
    let mut c = collector_of(&table, &columns, &[], limits(100, 64 << 20, Duration::ZERO));
    c.set_busy(Arc::new(|_| false));
    tx(&mut c, 1);
    let h = c.relation(&table, &columns).unwrap();
    insert(&mut c, h, 1);
    c.commit(&StreamPos::from_adapter("00000001")).unwrap();
    tx(&mut c, 2);
    change(&mut c, h, ChangeOp::Delete, 1);
    c.commit(&StreamPos::from_adapter("00000002")).unwrap();
    let exclusive: Vec<bool> = c.ready.iter().map(|r| r.exclusive).collect();
    assert_eq!(
        exclusive,
        [false, true],
        "an insert shares; a delete runs alone"
    );
}
