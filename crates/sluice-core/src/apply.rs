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
//!
//! How a unit becomes SQL text is written once, in [`planner`]: each target adapter supplies
//! only its dialect (how values, statements and transactions are spelled) and the round trip
//! to its server.
//!
//! Length: about 580 lines, nearly all type declarations with the documentation of what each
//! field promises (engines, keys, foreign keys and their actions, generated columns, units,
//! barriers, positions, the target trait); adapters and the runner read them as one
//! vocabulary.

pub mod planner;

use crate::error::{Error, Result};
use crate::position::StreamPos;
use crate::table::{ColumnDesc, TableRef};
use arrow_array::RecordBatch;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// A database engine rows come from: a target compares it with its own to tell a same-engine
/// copy (the source's type text and generated-column expressions carry over) from a
/// cross-engine one (types mapped from Arrow).
///
/// Serialized as its [`Engine::as_str`] name (`postgres`, `mysql`, `firebird`), the text that
/// saved state and reports already hold. MariaDB is [`Engine::Mysql`]: one adapter serves both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// PostgreSQL.
    Postgres,
    /// MySQL or MariaDB.
    Mysql,
    /// Firebird.
    Firebird,
}

impl Engine {
    /// The engine's name as state files, reports and messages print it.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Postgres => "postgres",
            Engine::Mysql => "mysql",
            Engine::Firebird => "firebird",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a foreign key does to the rows referencing a parent row that is deleted, or whose key
/// is updated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefAction {
    /// Refuse it while references exist (checked at the statement's end).
    #[default]
    NoAction,
    /// Refuse it while references exist (checked at once).
    Restrict,
    /// Delete or update the referencing rows with it.
    Cascade,
    /// Set the referencing columns to NULL.
    SetNull,
    /// Set the referencing columns to their default.
    SetDefault,
}

impl RefAction {
    /// The action a catalog's rule names (`CASCADE`, `SET NULL`, … as in
    /// `information_schema.REFERENTIAL_CONSTRAINTS`; PostgreSQL's one-letter codes `a r c n
    /// d`).
    pub fn parse(rule: &str) -> RefAction {
        match rule.trim().to_ascii_uppercase().as_str() {
            "CASCADE" | "C" => RefAction::Cascade,
            "SET NULL" | "N" => RefAction::SetNull,
            "SET DEFAULT" | "D" => RefAction::SetDefault,
            "RESTRICT" | "R" => RefAction::Restrict,
            _ => RefAction::NoAction,
        }
    }

    /// The SQL of the action.
    pub fn sql(self) -> &'static str {
        match self {
            RefAction::NoAction => "NO ACTION",
            RefAction::Restrict => "RESTRICT",
            RefAction::Cascade => "CASCADE",
            RefAction::SetNull => "SET NULL",
            RefAction::SetDefault => "SET DEFAULT",
        }
    }

    /// True when the action changes referencing rows (rather than refuse the parent's change).
    pub fn changes_children(self) -> bool {
        matches!(
            self,
            RefAction::Cascade | RefAction::SetNull | RefAction::SetDefault
        )
    }
}

/// A foreign key of a captured table: its rows reference `parent`'s `parent_columns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignKey {
    /// The constraint's name (for messages).
    #[serde(default)]
    pub name: String,
    /// Referencing columns of this table, in the constraint's order.
    pub columns: Vec<String>,
    /// The referenced table.
    pub parent: TableRef,
    /// Referenced columns (the parent's primary key or a unique key), in the same order.
    pub parent_columns: Vec<String>,
    /// What a delete of the parent row does to this table's rows.
    #[serde(default)]
    pub on_delete: RefAction,
    /// What an update of the parent's key does to this table's rows.
    #[serde(default)]
    pub on_update: RefAction,
}

impl ForeignKey {
    /// The actions of this key that change this table's rows, as SQL (`ON DELETE CASCADE`),
    /// empty when none does.
    pub fn child_actions(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.on_delete.changes_children() {
            out.push(format!("ON DELETE {}", self.on_delete.sql()));
        }
        if self.on_update.changes_children() {
            out.push(format!("ON UPDATE {}", self.on_update.sql()));
        }
        out
    }

    /// `ALTER TABLE child ADD CONSTRAINT name FOREIGN KEY (…) REFERENCES parent (…)` with the
    /// actions that change the child's rows: the statement a target runs to apply cascades
    /// itself, every identifier quoted by the target engine's `table` and `ident`.
    pub fn add_sql(
        &self,
        child: &TableRef,
        name: &str,
        table: impl Fn(&TableRef) -> String,
        ident: impl Fn(&str) -> String,
    ) -> String {
        let list = |cols: &[String]| {
            let quoted: Vec<String> = cols.iter().map(|c| ident(c)).collect();
            quoted.join(", ")
        };
        format!(
            "ALTER TABLE {} ADD CONSTRAINT {} FOREIGN KEY ({}) REFERENCES {} ({}) {}",
            table(child),
            ident(name),
            list(&self.columns),
            table(&self.parent),
            list(&self.parent_columns),
            self.child_actions().join(" ")
        )
    }

    /// How the key reads in messages: `name (cols) → parent (cols) ON DELETE CASCADE`.
    pub fn describe(&self) -> String {
        let actions = self.child_actions();
        format!(
            "foreign key {}({}) → {} ({}){}",
            if self.name.is_empty() {
                String::new()
            } else {
                format!("{} ", self.name)
            },
            self.columns.join(", "),
            self.parent,
            self.parent_columns.join(", "),
            if actions.is_empty() {
                String::new()
            } else {
                format!(" {}", actions.join(" "))
            }
        )
    }
}

/// A column as the source described it when the target last followed it: what a column
/// barrier compares, and what the target keeps (see [`ApplySession::columns`]) so a restart
/// knows the columns the target follows even when the source's catalog has moved on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceColumn {
    /// The column.
    pub name: String,
    /// The source's type text (`ColumnDesc::source_type`): a change is a retype.
    pub source_type: String,
}

impl SourceColumn {
    /// The columns as the target's bookkeeping keeps them (a JSON list).
    pub fn list_json(columns: &[SourceColumn]) -> String {
        // A list of plain structs of strings: serializing it cannot fail.
        serde_json::to_string(columns).unwrap_or_else(|_| "[]".into())
    }

    /// The columns `columns` as a barrier compares them.
    pub fn of(columns: &[ColumnDesc]) -> Vec<SourceColumn> {
        columns
            .iter()
            .map(|c| SourceColumn {
                name: c.name.clone(),
                source_type: c.source_type.clone(),
            })
            .collect()
    }
}

/// A column the source computes from the row's other columns (`GENERATED ALWAYS AS (…)
/// STORED` on PostgreSQL; stored or virtual generated columns on MySQL/MariaDB).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratedColumn {
    /// The column.
    pub name: String,
    /// Its expression as the source prints it (`pg_get_expr`, `GENERATION_EXPRESSION`): only a
    /// target of the same engine can create the column with it.
    pub expression: String,
    /// Stored on the source (a virtual column is computed when read).
    pub stored: bool,
}

/// What the source's catalog says about one captured table that its change stream does not:
/// the keys writesets hash, the key updates and deletes are matched by, and the columns the
/// source computes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableKeys {
    /// The table.
    pub table: TableRef,
    /// Primary key columns in key order (empty: no primary key; the table's updates and
    /// deletes are barriers).
    pub primary: Vec<String>,
    /// Every other unique constraint or unique index without a predicate, columns in order.
    pub unique: Vec<Vec<String>>,
    /// Foreign keys whose parent is any table (captured or not).
    pub foreign: Vec<ForeignKey>,
    /// The columns an update or delete is matched by on the target when they are not the
    /// primary key: the source's log identifies old rows by them (PostgreSQL's `REPLICA
    /// IDENTITY USING INDEX` on another unique index, whose old tuples carry only its
    /// columns). Empty: the primary key.
    #[serde(default)]
    pub match_by: Vec<String>,
    /// Generated columns. The change stream leaves them out (PostgreSQL's logical
    /// replication does not send them), so a target computes them itself: a same-engine
    /// target creates them with the source's expression, another leaves them out (noted).
    #[serde(default)]
    pub generated: Vec<GeneratedColumn>,
}

impl TableKeys {
    /// Keys known from the primary key alone (sources that cannot list the others).
    pub fn primary_only(table: TableRef, primary: Vec<String>) -> Self {
        TableKeys {
            table,
            primary,
            unique: Vec::new(),
            foreign: Vec::new(),
            match_by: Vec::new(),
            generated: Vec::new(),
        }
    }

    /// The columns updates and deletes are matched by: [`TableKeys::match_by`], else the
    /// primary key.
    pub fn apply_key(&self) -> &[String] {
        if self.match_by.is_empty() {
            &self.primary
        } else {
            &self.match_by
        }
    }

    /// True when `column` is generated on the source.
    pub fn is_generated(&self, column: &str) -> bool {
        self.generated.iter().any(|g| g.name == column)
    }
}

/// A table as the target must hold it: what to create when it is missing.
#[derive(Debug, Clone)]
pub struct TargetTable {
    /// The name on the source; the target uses the same schema (database) and table name.
    pub table: TableRef,
    /// Columns in source order, with the source's type text (`ColumnDesc::source_type`) and
    /// Arrow field (nullability included). Generated columns are among them
    /// ([`TableKeys::generated`] says which).
    pub columns: Vec<ColumnDesc>,
    /// Keys to create (primary and unique; foreign keys are not created, see
    /// [`ApplyTarget::create_tables`]).
    pub keys: TableKeys,
    /// The source engine, so a target can tell a same-engine copy from a cross-engine one
    /// when it maps types.
    pub source_engine: Engine,
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
    /// The source engine, as in [`TargetTable::source_engine`].
    pub source_engine: Engine,
    /// [`UnitTable::key`] is the table's only key (no other unique key, no foreign key to a
    /// parent): changes of different rows never constrain each other on the target, so an
    /// update that a later change of the same row in the same target transaction replaces
    /// may be left out (`sluice-stream`'s `apply/plan.rs`). False when not known.
    pub sole_key: bool,
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
    /// A table's columns changed on the source ([`ColumnChange`]).
    Columns(ColumnChange),
}

/// `table` has these columns from now on (columns added, dropped or retyped on the source):
/// the target alters its table to match before later rows arrive.
#[derive(Debug, Clone)]
pub struct ColumnChange {
    /// The table.
    pub table: TableRef,
    /// Its columns until now, as the source sent them: a target drops only a column the
    /// source had and no longer has, never one the source never sent (a column of the
    /// target's own, a generated column), and retypes only a column whose source type
    /// changed.
    pub before: Vec<SourceColumn>,
    /// Its columns from now on.
    pub columns: Vec<ColumnDesc>,
    /// The source engine: a same-engine target keeps the source's type text, another maps
    /// the Arrow type (as for [`TargetTable::source_engine`]).
    pub source_engine: Engine,
}

/// What the target records in the same transaction as a unit's rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedPosition {
    /// Units committed so far over the replication's life: strictly increasing, so the
    /// highest recorded by any worker is the applied position (commits are in source order).
    pub unit: u64,
    /// The source position a restarted stream resumes from so that it begins with the next
    /// transaction (as given to `ChangeSink::commit`).
    pub restart: StreamPos,
    /// The `_pos` of the last source transaction in the unit.
    pub pos: StreamPos,
    /// Commit time of that transaction on the source, microseconds since 1970 (UTC).
    pub commit_ts: Option<i64>,
    /// Changes of the transaction after `restart` already applied, when a unit was committed
    /// in two target transactions around a barrier whose DDL commits by itself (see
    /// [`ApplySession::barrier`]); `pos` is then that transaction's. 0 between transactions.
    /// A restart skips that many changes of that transaction (and the barriers among them).
    #[serde(default)]
    pub skip: u64,
}

/// A target database that replicated changes are applied to. Implemented per engine.
///
/// Every session sets what the applier relies on: read committed isolation, a short lock wait
/// (so a lock held by a later transaction that is waiting for its turn to commit surfaces as a
/// conflict instead of a hang), and the session settings that make literal values
/// unambiguous.
#[async_trait]
pub trait ApplyTarget: Send + Sync {
    /// The target's engine (MariaDB is [`Engine::Mysql`]).
    fn engine(&self) -> Engine;

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

    /// Create foreign keys with their actions (`(child, key)`, names as on the target), where
    /// the target must apply cascades the source's log leaves out (see `ChangeSource::
    /// logs_cascades`); one that exists by its name is left as it is. Called once the initial
    /// load is in, so the parallel load does not trip them. Returns a note per key created.
    async fn add_foreign_keys(&self, keys: &[(TableRef, ForeignKey)]) -> Result<Vec<String>>;

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

    /// Forget the replication: its state, applied positions and followed columns.
    async fn clear_state(&self, name: &str) -> Result<()>;

    /// The source columns each target table of replication `name` follows (recorded by
    /// [`ApplyTarget::save_columns`] after the initial load and by [`ApplySession::columns`]
    /// with every column barrier); empty for a replication that recorded none.
    async fn followed_columns(&self, name: &str) -> Result<Vec<(TableRef, Vec<SourceColumn>)>>;

    /// Record the source columns the target tables follow (after the initial load).
    async fn save_columns(
        &self,
        name: &str,
        tables: &[(TableRef, Vec<SourceColumn>)],
    ) -> Result<()>;

    /// Hold the replication `name` for this run: a second run of the same replication (any
    /// host) is refused, naming the holder, until the returned lock is released or its
    /// session ends (a run that dies releases it). Needed because a MySQL/MariaDB source keeps
    /// no server-side object that only one reader can use (a PostgreSQL slot does).
    async fn lock(&self, name: &str) -> Result<Box<dyn ReplicationLock>>;

    /// Where tables go when the source is of another engine and no target schema was
    /// given: MySQL/MariaDB, the database the URL names (a PostgreSQL source's `public` is no
    /// database there); `None` keeps each table's source schema.
    fn default_schema(&self) -> Option<String>;

    /// The target's identity for the replication's default name: engine, hosts and ports,
    /// database — what decides where rows land, not how the URL spells it (no user, no TLS
    /// options, no parameter order).
    fn identity(&self) -> String;

    /// The applied position: the highest recorded for `name` by any worker, or `None`.
    async fn applied(&self, name: &str) -> Result<Option<AppliedPosition>>;

    /// An apply session for worker `worker` of replication `name` (each worker records its
    /// position in a row of its own, so parallel commits do not wait on one row).
    async fn session(&self, name: &str, worker: u32) -> Result<Box<dyn ApplySession>>;
}

/// A replication held by one run (see [`ApplyTarget::lock`]).
#[async_trait]
pub trait ReplicationLock: Send {
    /// Let another run take the replication.
    async fn release(self: Box<Self>) -> Result<()>;
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

    /// Apply a barrier inside the open transaction. `before` is the position once every
    /// change before the barrier is applied. A target whose DDL commits by itself (MySQL,
    /// MariaDB) first records `before` and commits what the transaction holds, so an
    /// implicit commit never makes changes durable without their position; it returns `true`
    /// then, and the unit may not be rolled back and applied again in place (a restart from
    /// `before` continues it). A target with transactional DDL applies it in the transaction
    /// and returns `false`.
    async fn barrier(&mut self, barrier: &Barrier, before: &AppliedPosition) -> Result<bool>;

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

    /// Record, inside the open transaction, that target table `table` now follows the source
    /// columns `columns` (after a column barrier): a restart compares the source's next
    /// column change with these, not with the source's catalog, which may be ahead.
    async fn columns(&mut self, table: &TableRef, columns: &[SourceColumn]) -> Result<()>;

    /// Updates and deletes of the last committed transaction that matched no row on the
    /// target: the source changed a row the target does not hold, so the target has
    /// diverged (rows changed or removed there, or a load that missed them). Counted in the
    /// report; not an error, since applying it again cannot help.
    fn unmatched(&self) -> u64;
}
