//! Apply: the vocabulary between the replication runner and a target database adapter.
//!
//! `sluice replicate` reads a source's changes (the same [`crate::change`] stream `sluice
//! stream` writes to files) and applies them to a live target database. The runner
//! (`sluice-stream`'s `apply` module) groups consecutive source transactions into
//! [`ApplyUnit`]s, works out which units touch the same keys, runs independent units on
//! parallel target sessions and commits them in source order. A target adapter
//! (`sluice-<engine>/src/apply/`) implements [`ApplyTarget`]: it creates the tables, bulk-loads
//! the initial snapshot, turns a unit's rows into statements, and keeps the applied position
//! in the same target transaction as the rows, so a crash never applies a transaction twice
//! or skips one.
//!
//! Rows reach the target as Arrow batches with the change columns of
//! [`crate::change::change_schema`] (`_op`, `_absent`, …), so the target reads values with the
//! export's Arrow types; a column named in `_absent` was not sent by the source (an unchanged
//! TOAST value) and must keep its value: an update leaves it out of its `SET` list.

use crate::error::{Error, Result};
use crate::table::{ColumnDesc, TableRef};
use arrow_array::RecordBatch;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A foreign key of a captured table: its rows reference `parent`'s `parent_columns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignKey {
    /// Referencing columns of this table, in the constraint's order.
    pub columns: Vec<String>,
    /// The referenced table.
    pub parent: TableRef,
    /// Referenced columns (the parent's primary key or a unique key), in the same order.
    pub parent_columns: Vec<String>,
}

/// The keys of one captured table, read from the source catalog: what writesets hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableKeys {
    /// The table.
    pub table: TableRef,
    /// Primary key columns in key order (empty: no primary key; the table's changes are
    /// barriers).
    pub primary: Vec<String>,
    /// Every other unique constraint or unique index without a predicate, columns in order.
    pub unique: Vec<Vec<String>>,
    /// Foreign keys whose parent is any table (captured or not).
    pub foreign: Vec<ForeignKey>,
}

impl TableKeys {
    /// Keys known from the primary key alone (sources that cannot list the others).
    pub fn primary_only(table: TableRef, primary: Vec<String>) -> Self {
        TableKeys {
            table,
            primary,
            unique: Vec::new(),
            foreign: Vec::new(),
        }
    }
}

/// A table as the target must hold it: what to create when it is missing.
#[derive(Debug, Clone)]
pub struct TargetTable {
    /// The name on the source; the target uses the same schema (database) and table name.
    pub table: TableRef,
    /// Columns in source order, with the source's type text (`ColumnDesc::source_type`) and
    /// Arrow field (nullability included).
    pub columns: Vec<ColumnDesc>,
    /// Keys to create (primary and unique; foreign keys are not created, see
    /// [`ApplyTarget::create_tables`]).
    pub keys: TableKeys,
    /// The source engine (`postgres`, `mysql`), so a target can tell a same-engine copy from a
    /// cross-engine one when it maps types.
    pub source_engine: &'static str,
}

/// One table's rows within an [`ApplyUnit`].
#[derive(Debug, Clone)]
pub struct UnitTable {
    /// The table (same name on the target).
    pub table: TableRef,
    /// The table's columns as the source sent them for these rows (one schema version).
    pub columns: Arc<Vec<ColumnDesc>>,
    /// Key columns an update or delete is matched by on the target: the primary key (or the
    /// replica identity's columns). Empty: the table has no key; its rows arrive in a unit of
    /// their own (a barrier) and the target matches whole rows.
    pub key: Arc<Vec<String>>,
    /// The rows: the table's columns followed by the change columns
    /// ([`crate::change::change_schema`]).
    pub batch: RecordBatch,
    /// The source engine (`postgres`, `mysql`), as in [`TargetTable::source_engine`].
    pub source_engine: &'static str,
}

impl UnitTable {
    /// The index in [`UnitTable::columns`] (and in the batch) of each key column, in key order:
    /// what an update or delete on the target is matched by. An error when a key column is not
    /// a column of the rows, which the collector never builds.
    pub fn key_positions(&self) -> Result<Vec<usize>> {
        self.key
            .iter()
            .map(|k| {
                self.columns
                    .iter()
                    .position(|c| &c.name == k)
                    .ok_or_else(|| {
                        Error::internal(format!("key column {k} is not a column of {}", self.table))
                    })
            })
            .collect()
    }
}

/// Consecutive source changes applied in one target transaction: one source transaction, or
/// several small ones grouped to amortise the target's commit. The runner hands them over in
/// an order and with batches (see [`ApplyUnit::batches`]) that let the target merge rows into
/// few statements.
#[derive(Debug, Clone, Default)]
pub struct ApplyUnit {
    /// Rows by table.
    pub tables: Vec<UnitTable>,
    /// `(index into tables, row in its batch)` in the order to apply them: source order, or
    /// an order that moves rows only past rows they share no key with.
    pub order: Vec<(u32, u32)>,
    /// End offsets in `order` of its *batches*: the rows of a batch are of one table and one
    /// operation and share no key (primary, unique or foreign-key parent) with each other, so
    /// a target may apply a batch as one statement per set of columns carried, in any order
    /// within it. Empty: every row is a batch of its own.
    pub batches: Vec<u32>,
}

impl ApplyUnit {
    /// The batches as ranges of `order` (each row alone when `batches` is empty).
    pub fn batch_ranges(&self) -> Vec<std::ops::Range<usize>> {
        if self.batches.is_empty() {
            return (0..self.order.len()).map(|i| i..i + 1).collect();
        }
        let mut start = 0;
        self.batches
            .iter()
            .map(|&end| {
                let r = start..end as usize;
                start = end as usize;
                r
            })
            .collect()
    }

    /// Number of row changes.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True without changes (a unit that only moves the position).
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// A statement that cannot be keyed, applied alone after everything before it committed.
///
/// A barrier must be idempotent on the target: on MySQL its DDL commits by itself, and a crash
/// before the position that follows it is recorded applies it again after the restart (an
/// `ALTER` compares the target's columns with the wanted ones and changes only the difference).
#[derive(Debug, Clone)]
pub enum Barrier {
    /// Every row of these tables removed.
    Truncate(Vec<TableRef>),
    /// `table` has these columns from now on (columns added, dropped or retyped on the
    /// source): the target alters its table to match before later rows arrive.
    Columns {
        /// The table.
        table: TableRef,
        /// Its columns from now on.
        columns: Vec<ColumnDesc>,
        /// The source engine (`postgres`, `mysql`): a same-engine target keeps the source's
        /// type text, another maps the Arrow type (as for [`TargetTable::source_engine`]).
        source_engine: &'static str,
    },
}

/// What the target records in the same transaction as a unit's rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedPosition {
    /// Units committed so far over the replication's life: strictly increasing, so the
    /// highest recorded by any worker is the applied position (commits are in source order).
    pub unit: u64,
    /// The source position a restarted stream resumes from so that it begins with the next
    /// transaction (as given to `ChangeSink::commit`).
    pub restart: String,
    /// The `_pos` of the last source transaction in the unit.
    pub pos: String,
    /// Commit time of that transaction on the source, microseconds since 1970 (UTC).
    pub commit_ts: Option<i64>,
}

/// A target database that replicated changes are applied to. Implemented per engine.
///
/// Every session sets what the applier relies on: read committed isolation, a short lock wait
/// (so a lock held by a later transaction that is waiting for its turn to commit surfaces as a
/// conflict instead of a hang), and the session settings that make literal values
/// unambiguous.
#[async_trait]
pub trait ApplyTarget: Send + Sync {
    /// Engine name (`postgres`, `mysql`).
    fn engine(&self) -> &'static str;

    /// The target location with secrets redacted.
    fn display_url(&self) -> String;

    /// Create sluice's bookkeeping (schema or database `sluice`: the applied-position table
    /// and the state table) when missing, and check the privileges the run needs; a missing
    /// privilege fails with the `GRANT` that fixes it.
    async fn prepare(&self) -> Result<()>;

    /// Create the tables that do not exist on the target (same schema and name, columns,
    /// not-null, primary and unique keys; the schema too when missing). Returns one note per
    /// thing not carried (foreign keys, defaults, triggers, checks, a type mapped to another),
    /// for the report. Existing tables are left as they are and checked: a missing column
    /// fails with its name.
    async fn create_tables(&self, tables: &[TargetTable]) -> Result<Vec<String>>;

    /// Tables among `tables` that hold rows (an initial load refuses to load into them).
    async fn non_empty(&self, tables: &[TableRef]) -> Result<Vec<TableRef>>;

    /// Remove every row of `tables` (an interrupted initial load starts over).
    async fn truncate(&self, tables: &[TableRef]) -> Result<()>;

    /// A session for the initial load's bulk path.
    async fn loader(&self) -> Result<Box<dyn BulkLoad>>;

    /// The replication's saved state (the runner's JSON), or `None`.
    async fn load_state(&self, name: &str) -> Result<Option<Vec<u8>>>;

    /// Save the replication's state (outside any unit: the snapshot's progress and the tables).
    async fn save_state(&self, name: &str, state: &[u8]) -> Result<()>;

    /// Forget the replication: its state and applied positions.
    async fn clear_state(&self, name: &str) -> Result<()>;

    /// The applied position: the highest recorded for `name` by any worker, or `None`.
    async fn applied(&self, name: &str) -> Result<Option<AppliedPosition>>;

    /// An apply session for worker `worker` of replication `name` (each worker records its
    /// position in a row of its own, so parallel commits do not wait on one row).
    async fn session(&self, name: &str, worker: u32) -> Result<Box<dyn ApplySession>>;
}

/// One target session of the initial load.
#[async_trait]
pub trait BulkLoad: Send {
    /// Load `batch` (the table's columns only, as the export reads them) into `table`, with
    /// the target's bulk path, committed when this returns.
    async fn load(&mut self, table: &TableRef, batch: &RecordBatch) -> Result<()>;
}

/// One apply worker's target session.
///
/// Calls per unit: [`ApplySession::begin`], [`ApplySession::apply`] (once or more: a
/// transaction larger than the memory budget arrives in pieces, and a unit's rows that must
/// wait for an earlier unit come after the others), [`ApplySession::send`] before the runner
/// waits (so what is buffered runs meanwhile), [`ApplySession::record`], then
/// [`ApplySession::commit`] when the unit's turn comes, or [`ApplySession::rollback`].
/// A session may buffer statements until `send` or `commit`, so a unit that is already next to
/// commit costs one round trip. A failure that ordering may explain is an
/// [`crate::Error::apply_conflict`].
#[async_trait]
pub trait ApplySession: Send {
    /// Start a target transaction.
    async fn begin(&mut self) -> Result<()>;

    /// Apply the rows of `unit` in order inside the open transaction.
    async fn apply(&mut self, unit: &ApplyUnit) -> Result<()>;

    /// Apply a barrier inside the open transaction (DDL may commit implicitly on MySQL; the
    /// runner records the position in a transaction of its own after it).
    async fn barrier(&mut self, barrier: &Barrier) -> Result<()>;

    /// Send the statements buffered so far, inside the open transaction, and wait for their
    /// results: the runner is about to wait (for an earlier unit, or for its turn to commit).
    async fn send(&mut self) -> Result<()>;

    /// Record `position` as this worker's applied position, inside the open transaction (it may
    /// only be buffered until `send` or `commit`).
    async fn record(&mut self, position: &AppliedPosition) -> Result<()>;

    /// Send what is buffered and commit the open transaction.
    async fn commit(&mut self) -> Result<()>;

    /// Roll the open transaction back (nothing of it stays).
    async fn rollback(&mut self) -> Result<()>;
}
