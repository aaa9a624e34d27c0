//! The worker pool against a recording target: what each session sends, in which order, and
//! when — the protocol the target adapters rely on (free rows sent before a unit waits, late
//! rows only after the units they depend on committed, commits in source order). The target
//! adapters' SQL is tested against real servers in the CLI's integration tests. The
//! collector's grouping is tested here too, with the helpers that build the rows of a unit
//! (`tests_plan.rs` and `tests_collect.rs` use them).

#![allow(clippy::unwrap_used)]

use super::collect::{Piece, Ready, Work};
use super::worker::{ApplyCounters, Pool};
use super::writeset::RowKeys;
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray, UInt64Array,
};
use arrow_schema::DataType;
use async_trait::async_trait;
use sluice_core::apply::{
    AppliedPosition, ApplySession, ApplyTarget, ApplyUnit, Barrier, BulkLoad, ForeignKey,
    ReplicationLock, SourceColumn, TargetTable, UnitTable,
};
use sluice_core::change::change_schema;
use sluice_core::columns::field;
use sluice_core::table::{ColumnDesc, TableRef};
use sluice_core::{Error, Result, StreamPos};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// What the sessions did, in order (see [`Session::line`]).
#[derive(Default)]
pub(super) struct Log {
    lines: Mutex<Vec<String>>,
    /// Signalled at every line.
    changed: Notify,
    /// The first commit of this unit waits until a line contains this text.
    hold: Mutex<Option<(u64, String)>>,
}

impl Log {
    fn push(&self, line: String) {
        self.lines.lock().unwrap().push(line);
        self.changed.notify_waiters();
    }

    pub(super) fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    async fn wait_for(&self, text: &str) {
        loop {
            let notified = self.changed.notified();
            if self.lines().iter().any(|l| l.contains(text)) {
                return;
            }
            notified.await;
        }
    }
}

pub(super) struct Recorder {
    pub(super) log: Arc<Log>,
}

struct Session {
    log: Arc<Log>,
    buffered: Vec<i64>,
    unit: u64,
}

#[async_trait]
impl ApplyTarget for Recorder {
    fn engine(&self) -> sluice_core::apply::Engine {
        sluice_core::apply::Engine::Postgres
    }
    fn display_url(&self) -> String {
        "recorder".into()
    }
    async fn prepare(&self) -> Result<()> {
        Ok(())
    }
    async fn create_tables(&self, _: &[TargetTable]) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    async fn add_foreign_keys(&self, _: &[(TableRef, ForeignKey)]) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    async fn non_empty(&self, _: &[TableRef]) -> Result<Vec<TableRef>> {
        Ok(Vec::new())
    }
    async fn truncate(&self, _: &[TableRef]) -> Result<()> {
        Ok(())
    }
    async fn loader(&self) -> Result<Box<dyn BulkLoad>> {
        Err(Error::internal("the recorder loads nothing"))
    }
    async fn load_state(&self, _: &str) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
    async fn save_state(&self, _: &str, _: &[u8]) -> Result<()> {
        Ok(())
    }
    async fn clear_state(&self, _: &str) -> Result<()> {
        Ok(())
    }
    async fn applied(&self, _: &str) -> Result<Option<AppliedPosition>> {
        Ok(None)
    }
    async fn followed_columns(&self, _: &str) -> Result<Vec<(TableRef, Vec<SourceColumn>)>> {
        Ok(Vec::new())
    }
    async fn save_columns(&self, _: &str, _: &[(TableRef, Vec<SourceColumn>)]) -> Result<()> {
        Ok(())
    }
    async fn lock(&self, _: &str) -> Result<Box<dyn ReplicationLock>> {
        Ok(Box::new(NoLock))
    }
    fn default_schema(&self) -> Option<String> {
        None
    }
    fn identity(&self) -> String {
        "recorder".into()
    }
    async fn session(&self, _: &str, _: u32) -> Result<Box<dyn ApplySession>> {
        Ok(Box::new(Session {
            log: self.log.clone(),
            buffered: Vec::new(),
            unit: 0,
        }))
    }
}

impl Session {
    /// `send [ids]` (the unit is not known before `record`) or `commit <unit> [ids]`.
    fn line(&mut self, what: &str) -> String {
        let ids: Vec<String> = self.buffered.drain(..).map(|i| i.to_string()).collect();
        match what {
            "send" => format!("send [{}]", ids.join(",")),
            _ => format!("{what} {} [{}]", self.unit, ids.join(",")),
        }
    }
}

#[async_trait]
impl ApplySession for Session {
    async fn begin(&mut self) -> Result<()> {
        self.buffered.clear();
        Ok(())
    }
    async fn apply(&mut self, unit: &ApplyUnit) -> Result<()> {
        for &(t, r) in &unit.order {
            let ids = unit.tables[t as usize]
                .batch
                .column(0)
                .as_primitive::<Int64Type>();
            self.buffered.push(ids.value(r as usize));
        }
        Ok(())
    }
    async fn barrier(&mut self, _: &Barrier, _: &AppliedPosition) -> Result<bool> {
        let l = self.line("barrier");
        self.log.push(l);
        Ok(false)
    }
    async fn send(&mut self) -> Result<()> {
        let l = self.line("send");
        self.log.push(l);
        Ok(())
    }
    async fn record(&mut self, p: &AppliedPosition) -> Result<()> {
        self.unit = p.unit;
        Ok(())
    }
    async fn commit(&mut self) -> Result<()> {
        let hold = self.log.hold.lock().unwrap().take();
        match hold {
            Some((unit, text)) if unit == self.unit => {
                tokio::time::timeout(Duration::from_secs(10), self.log.wait_for(&text))
                    .await
                    .map_err(|_| Error::internal(format!("no line with {text}")))?;
            }
            Some(other) => *self.log.hold.lock().unwrap() = Some(other),
            None => {}
        }
        let l = self.line("commit");
        self.log.push(l);
        Ok(())
    }
    async fn rollback(&mut self) -> Result<()> {
        self.buffered.clear();
        Ok(())
    }
    fn unmatched(&self) -> u64 {
        0
    }
    async fn columns(&mut self, _: &TableRef, _: &[SourceColumn]) -> Result<()> {
        Ok(())
    }
}

struct NoLock;

#[async_trait]
impl ReplicationLock for NoLock {
    async fn release(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// Table `s.<name> (id bigint)`, keyed by `id` or not, with the changes `rows`
/// (`1 insert, 2 update, …`).
pub(super) fn table(name: &str, rows: &str, keyed: bool) -> UnitTable {
    let rows = changes(rows);
    let (table, columns) = (TableRef::new("s", name), id_column());
    let n = rows.len();
    let mut absent = ListBuilder::new(StringBuilder::new());
    for _ in 0..n {
        absent.append(true);
    }
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(vec!["0"; n])),
        Arc::new(UInt64Array::from((0..n as u64).collect::<Vec<_>>())),
        Arc::new(TimestampMicrosecondArray::from(vec![None; n]).with_timezone("UTC")),
        Arc::new(StringArray::from(vec![None::<&str>; n])),
        Arc::new(absent.finish()),
    ];
    let batch = RecordBatch::try_new(change_schema(&table, &columns).unwrap(), arrays).unwrap();
    UnitTable {
        table,
        columns: Arc::new(columns),
        key: Arc::new(if keyed { vec!["id".into()] } else { Vec::new() }),
        batch,
        source_engine: sluice_core::apply::Engine::Postgres,
        sole_key: false,
    }
}

/// The columns of the tables here: `id bigint`.
fn id_column() -> Vec<ColumnDesc> {
    vec![ColumnDesc {
        name: "id".into(),
        source_type: "bigint".into(),
        field: field("id", DataType::Int64),
        cast: None,
        as_text_fallback: false,
    }]
}

/// Changes written `1 insert, 2 update, …`: (id, operation) each.
fn changes(text: &str) -> Vec<(i64, &str)> {
    text.split(", ")
        .map(|c| {
            let (id, op) = c.split_once(' ').expect("id and operation");
            (id.parse().expect("a number"), op)
        })
        .collect()
}

/// Keys of rows, one list per row.
/// A unit of `tables`' rows in `order` (table, row), one batch a row.
pub(super) fn unbatched(tables: Vec<UnitTable>, order: Vec<(u32, u32)>) -> ApplyUnit {
    ApplyUnit {
        tables,
        order,
        batches: Vec::new(),
    }
}

pub(super) fn row_keys(rows: &[&[u64]]) -> RowKeys {
    let mut keys = RowKeys::default();
    for k in rows {
        keys.keys.extend_from_slice(k);
        keys.ends.push(keys.keys.len() as u32);
    }
    keys
}

/// A unit inserting rows `ids` into one table, each row touching the keys given with it.
fn unit(rows: &[(i64, &[u64])]) -> Ready {
    let n = rows.len();
    let ins: Vec<String> = rows.iter().map(|r| format!("{} insert", r.0)).collect();
    let keys = row_keys(&rows.iter().map(|r| r.1).collect::<Vec<_>>());
    let piece = unbatched(
        vec![table("t", &ins.join(", "), true)],
        (0..n as u32).map(|r| (0, r)).collect(),
    );
    Ready {
        work: Arc::new(Work {
            pieces: vec![Piece::Rows(piece)],
            more: None,
            position: Some(AppliedPosition {
                unit: 0,
                restart: StreamPos::from_adapter("r"),
                pos: StreamPos::from_adapter("p"),
                commit_ts: None,
                skip: 0,
            }),
            bytes: 0,
            transactions: 1,
            changes: n as u64,
            commit_ts: None,
            rows: keys,
        }),
        exclusive: false,
    }
}

async fn run(workers: usize, units: Vec<Ready>, log: &Arc<Log>) -> Arc<ApplyCounters> {
    let target: Arc<dyn ApplyTarget> = Arc::new(Recorder { log: log.clone() });
    let counters = Arc::new(ApplyCounters::default());
    let pool = Pool::start(&target, "r", workers, 0, counters.clone())
        .await
        .unwrap();
    pool.add(units);
    tokio::time::timeout(
        Duration::from_secs(20),
        pool.wait_until(|p| p.unfinished() == 0),
    )
    .await
    .unwrap()
    .unwrap();
    pool.stop().await.unwrap();
    counters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_rows_run_before_the_unit_they_wait_for_commits() {
    let log = Arc::new(Log::default());
    // Unit 1 cannot commit until unit 2 has sent its free row (id 2): only a unit that starts
    // before its dependency commits gets there.
    *log.hold.lock().unwrap() = Some((1, "send [2]".into()));
    let counters = run(
        2,
        vec![
            unit(&[(1, &[100])]),
            // Row 10 shares key 100 with unit 1 (late); row 2 touches key 200 only (free);
            // row 11 shares key 300 with the late row 10 (late too).
            unit(&[(10, &[100, 300]), (2, &[200]), (11, &[300])]),
        ],
        &log,
    )
    .await;
    assert_eq!(
        log.lines(),
        ["send [2]", "commit 1 [1]", "commit 2 [10,11]"],
        "unit 2's free row first, its late rows after unit 1's commit, commits in order"
    );
    assert_eq!(counters.split.load(Ordering::Relaxed), 1);
    assert_eq!(counters.units.load(Ordering::Relaxed), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_stay_in_source_order_whoever_finishes_first() {
    let log = Arc::new(Log::default());
    // Unit 1 is held until unit 3 has sent its rows: units 2 and 3 are independent and run
    // meanwhile, but no commit may pass unit 1's.
    *log.hold.lock().unwrap() = Some((1, "send [3]".into()));
    run(
        3,
        vec![unit(&[(1, &[1])]), unit(&[(2, &[2])]), unit(&[(3, &[3])])],
        &log,
    )
    .await;
    let commits: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("commit"))
        .collect();
    assert_eq!(commits, ["commit 1 [1]", "commit 2 []", "commit 3 []"]);
}

/// A collector of one table `s.t (id bigint primary key)` whose workers are `busy` or not.
pub(super) fn collector(
    busy: bool,
    transactions: u64,
) -> (super::collect::Collector, TableRef, Vec<ColumnDesc>) {
    lingering(busy, transactions, std::time::Duration::ZERO)
}

/// As [`collector`], with a linger time.
pub(super) fn lingering(
    busy: bool,
    transactions: u64,
    linger: std::time::Duration,
) -> (super::collect::Collector, TableRef, Vec<ColumnDesc>) {
    let (table, columns) = (TableRef::new("s", "t"), id_column());
    let limits = limits(transactions, 64 << 20, linger);
    let mut c = collector_of(&table, &columns, &["id"], limits);
    c.set_busy(Arc::new(move |_| busy));
    (c, table, columns)
}

/// A collector of `table` with `columns`, its key `key` (empty: a table without one).
pub(super) fn collector_of(
    table: &TableRef,
    columns: &[ColumnDesc],
    key: &[&str],
    limits: super::collect::Limits,
) -> super::collect::Collector {
    super::collect::Collector::new(
        vec![super::collect::Captured {
            table: table.clone(),
            target: table.clone(),
            known: None,
            columns: columns.to_vec(),
            snapshot_position: None,
        }],
        vec![sluice_core::apply::TableKeys::primary_only(
            table.clone(),
            key.iter().map(|k| k.to_string()).collect(),
        )],
        limits,
        sluice_core::apply::Engine::Postgres,
    )
}

/// A collector's limits: units of `transactions` and 1 MB at most, transactions streamed
/// from `stream_bytes`, a unit's first transaction waiting `linger` for others.
pub(super) fn limits(
    transactions: u64,
    stream_bytes: usize,
    linger: std::time::Duration,
) -> super::collect::Limits {
    super::collect::Limits {
        transactions,
        bytes: 1 << 20,
        stream_bytes,
        linger,
    }
}

/// Source transaction `n` inserting rows `ids`.
pub(super) fn transaction(
    c: &mut super::collect::Collector,
    table: &TableRef,
    columns: &[ColumnDesc],
    n: u64,
    ids: &[i64],
) {
    use sluice_core::change::{ChangeOp, ChangeSink, TxMeta};
    let pos = StreamPos::from_adapter(format!("{n:08}"));
    c.begin(TxMeta {
        pos: pos.clone(),
        xid: n.to_string(),
        commit_ts: None,
    })
    .unwrap();
    let h = c.relation(table, columns).unwrap();
    for id in ids {
        let rows = c.row(h, ChangeOp::Insert).unwrap().unwrap();
        rows.columns()[0].push_i64(*id).unwrap();
        c.row_done().unwrap();
    }
    c.commit(&pos).unwrap();
}

#[test]
fn a_caught_up_stream_applies_each_transaction_at_once() {
    let (mut c, t, cols) = collector(false, 100);
    for n in 1..=4 {
        transaction(&mut c, &t, &cols, n, &[n as i64]);
    }
    let sizes: Vec<u64> = c.ready.iter().map(|r| r.work.transactions).collect();
    assert_eq!(
        sizes,
        [1, 1, 1, 1],
        "a free worker gets every transaction at once"
    );
}

#[test]
fn a_free_worker_waits_for_the_linger_or_a_quiet_source() {
    let (mut c, t, cols) = lingering(false, 100, std::time::Duration::from_secs(3600));
    for n in 1..=3 {
        transaction(&mut c, &t, &cols, n, &[n as i64]);
    }
    c.cut_due(false).unwrap();
    assert!(
        c.ready.is_empty(),
        "held for the linger while the source sends"
    );
    assert!(
        c.due_in()
            .is_some_and(|d| d > std::time::Duration::from_secs(3000))
    );
    c.cut_due(true).unwrap();
    let sizes: Vec<u64> = c.ready.iter().map(|r| r.work.transactions).collect();
    assert_eq!(sizes, [3], "handed over when the source went quiet");
    assert_eq!(c.due_in(), None);
}

#[test]
fn busy_workers_let_units_grow_to_their_cap() {
    let (mut c, t, cols) = collector(true, 3);
    for n in 1..=5 {
        transaction(&mut c, &t, &cols, n, &[2 * n as i64, 2 * n as i64 + 1]);
    }
    c.cut_due(true).unwrap();
    let units: Vec<(u64, usize, Option<String>)> = c
        .ready
        .iter()
        .map(|r| {
            let w = &r.work;
            (
                w.transactions,
                w.rows.len(),
                w.position.as_ref().map(|p| p.pos.as_str().to_string()),
            )
        })
        .collect();
    assert_eq!(
        units,
        [
            (3, 6, Some("00000003".into())),
            (2, 4, Some("00000005".into()))
        ],
        "units of three transactions while the workers are busy, the rest when the source is idle; \
         every row with its keys"
    );
    let rows = &c.ready[0].work.rows;
    assert!(
        (0..rows.len()).all(|i| rows.row(i).len() == 1),
        "one key (the primary key) per row"
    );
}
