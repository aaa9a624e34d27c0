//! Change data capture: the vocabulary every change source and the stream runner share.
//!
//! A change source (PostgreSQL logical replication, later the MySQL/MariaDB binary log) decodes
//! its log and appends each changed row **straight into Arrow column builders** owned by the
//! runner ([`ChangeRows`]), with the same Arrow types the export gives the table, plus the
//! change columns:
//!
//! | column       | type                     | meaning |
//! |--------------|--------------------------|---------|
//! | `_op`        | Utf8                     | `insert`, `update`, `delete`, `truncate` |
//! | `_pos`       | Utf8                     | the commit position, written so that text order is log order (PostgreSQL: the commit LSN as 16 hex digits) |
//! | `_seq`       | UInt64                   | strictly increasing over the whole stream: order of changes within and across transactions |
//! | `_commit_ts` | Timestamp(µs, UTC)       | commit time |
//! | `_xid`       | Utf8                     | the source's transaction id (PostgreSQL xid; a GTID where the source has them) |
//! | `_absent`    | List(Utf8)               | columns this change does not carry (an unchanged TOAST value, a delete's non-key columns): their cells are NULL but mean "not sent", never "NULL" |
//! | `_before`    | Struct(the table's columns) | only with `--before-images`, after the others: the whole old row of an update or a delete; NULL for inserts and truncates |
//!
//! Replaying changes by `_seq` over a snapshot needs no special case: an update that changes the
//! key is a `delete` of the old key followed by an `insert` of the new row, and a column listed
//! in `_absent` keeps the value it had. One transaction may span files (its rows share
//! `_pos` and `_xid`).
//!
//! The adapter implements [`ChangeStream`] and feeds a [`ChangeSink`]; the runner implements the
//! sink (batching, files, state). Neither knows the other's side.
//!
//! Length: about 560 lines: the change columns, the source and sink traits with what each
//! method promises, and the small policies a source applies while decoding (bad values, layout
//! changes); one vocabulary that every capture adapter implements. The row builders are in
//! `change/rows.rs`.

use crate::error::{Error, Result};
use crate::position::{SnapshotInfo, StreamPos};
use crate::source::Source;
use crate::table::{ColumnDesc, Dataset, TableRef};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

mod rows;
pub use rows::ChangeRows;

/// Name of the operation column.
pub const OP: &str = "_op";
/// Name of the commit position column.
pub const POS: &str = "_pos";
/// Name of the sequence column.
pub const SEQ: &str = "_seq";
/// Name of the commit time column.
pub const COMMIT_TS: &str = "_commit_ts";
/// Name of the transaction id column.
pub const XID: &str = "_xid";
/// Name of the absent-columns column.
pub const ABSENT: &str = "_absent";
/// Name of the before-image column (`--before-images`), after the change columns.
pub const BEFORE: &str = "_before";
/// Every change column, in the order they follow the table's columns.
pub const CHANGE_COLUMNS: [&str; 6] = [OP, POS, SEQ, COMMIT_TS, XID, ABSENT];

/// One change of a captured table's layout that the source's log does not carry
/// ([`ChangeSource::layout_changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutChange {
    /// The captured table, `schema.table`.
    pub table: String,
    /// What happened, in words.
    pub what: String,
    /// Rows left the table without a change in the log (a partition truncated, detached or
    /// dropped): the run stops, or keeps them with a note. `false`: said only (a new
    /// partition, empty when created, fills through the log).
    pub missing: bool,
}

/// What a change stream does with a value the export's Arrow type cannot hold — PostgreSQL
/// `NaN` or `Infinity` in a `numeric(p,s)` column, which the export refuses too — met after
/// the snapshot, where refusing stops the stream at that change for good (`--bad-values`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BadValues {
    /// Stop, naming the table, the column and the value (the default).
    #[default]
    Stop,
    /// Write NULL in its place, warn, and count it ([`ChangeSource::nulled_values`]).
    Null,
}

/// How a stream applies [`BadValues`]: the policy and the count of values written as NULL.
#[derive(Debug, Clone, Default)]
pub struct BadValuePolicy {
    /// What to do.
    pub policy: BadValues,
    /// Values written as NULL so far (shared by the capture's streams).
    pub nulled: Arc<std::sync::atomic::AtomicU64>,
}

impl BadValuePolicy {
    /// A value of `what` (`table.column`) at `pos` cannot be written (`why`): `Ok(())` when it
    /// is to be written as NULL (counted, warned about), else the stream's error.
    pub fn handle(&self, what: &str, pos: &str, why: &str) -> Result<()> {
        match self.policy {
            BadValues::Stop => Err(Error::data(format!(
                "{what}: a changed value at position {pos} cannot be written: {why}. The \
                 export refuses such values too; to write them as NULL instead (counted in \
                 the report), run with --bad-values null."
            ))),
            BadValues::Null => {
                let n = self
                    .nulled
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n < 10 || n.is_power_of_two() {
                    tracing::warn!(
                        "{what}: a changed value at position {pos} cannot be written ({why}); \
                         written as NULL (--bad-values null), {} so far",
                        n + 1
                    );
                }
                Ok(())
            }
        }
    }
}

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeOp {
    /// A new row.
    Insert,
    /// A row changed in place (same key); absent columns kept their value.
    Update,
    /// A row removed; the row carries the key (the whole old row where the source logs it).
    Delete,
    /// Every row of the table removed; the row's table columns are all absent.
    Truncate,
}

impl ChangeOp {
    /// The `_op` text.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeOp::Insert => "insert",
            ChangeOp::Update => "update",
            ChangeOp::Delete => "delete",
            ChangeOp::Truncate => "truncate",
        }
    }

    /// The operation an `_op` text names ([`ChangeOp::as_str`] read back; `None` for any
    /// other text).
    pub fn parse(text: &str) -> Option<ChangeOp> {
        [
            ChangeOp::Insert,
            ChangeOp::Update,
            ChangeOp::Delete,
            ChangeOp::Truncate,
        ]
        .into_iter()
        .find(|op| op.as_str() == text)
    }
}

/// The Arrow fields of the change columns.
pub fn change_fields() -> Vec<Field> {
    vec![
        Field::new(OP, DataType::Utf8, false),
        Field::new(POS, DataType::Utf8, false),
        Field::new(SEQ, DataType::UInt64, false),
        Field::new(
            COMMIT_TS,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new(XID, DataType::Utf8, true),
        Field::new(
            ABSENT,
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            false,
        ),
    ]
}

/// The schema of a table's change files: its columns (as the export writes them, made
/// nullable, since a delete or truncate does not carry them all) followed by the change
/// columns. Fails when the table has a column named like a change column.
pub fn change_schema(table: &TableRef, columns: &[ColumnDesc]) -> Result<SchemaRef> {
    let mut fields = Vec::with_capacity(columns.len() + CHANGE_COLUMNS.len());
    for c in columns {
        if CHANGE_COLUMNS.contains(&c.name.as_str()) {
            return Err(Error::config(format!(
                "{table} has a column named {}, which change files use for change metadata; \
                 rename the column or leave the table out of the stream",
                c.name
            )));
        }
        fields.push(c.field.clone().with_nullable(true));
    }
    fields.extend(change_fields());
    Ok(Arc::new(Schema::new(fields)))
}

/// `schema` (a [`change_schema`] of `table`, whose first `table_columns` fields are the
/// table's) with the before-image column: a struct of the table's columns holding the old row
/// of an update or a delete, NULL where a change has none. Fails when the table has a column
/// named like it.
pub fn with_before_images(
    table: &TableRef,
    schema: &SchemaRef,
    table_columns: usize,
) -> Result<SchemaRef> {
    let own = &schema.fields()[..table_columns];
    if own.iter().any(|f| f.name() == BEFORE) {
        return Err(Error::config(format!(
            "{table} has a column named {BEFORE}, which --before-images uses for the old row; \
             rename the column, leave the table out, or stream without --before-images"
        )));
    }
    let mut fields = schema.fields().to_vec();
    fields.push(Arc::new(Field::new(
        BEFORE,
        DataType::Struct(own.to_vec().into()),
        true,
    )));
    Ok(Arc::new(
        Schema::new(fields).with_metadata(schema.metadata().clone()),
    ))
}

/// One transaction's facts, shared by its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxMeta {
    /// The commit position, written in `_pos` (its text order is log order).
    pub pos: StreamPos,
    /// The transaction id as written in `_xid`.
    pub xid: String,
    /// Commit time, microseconds since 1970 (UTC).
    pub commit_ts: Option<i64>,
}

/// Where a change source delivers what it decodes. Implemented by the stream runner.
///
/// Call order per transaction: [`ChangeSink::begin`], then per change [`ChangeSink::row`]
/// (append the values if it returned rows) and [`ChangeSink::row_done`], then
/// [`ChangeSink::commit`]. [`ChangeSink::relation`] may come at any point before a table's
/// first change and whenever its columns change.
pub trait ChangeSink: Send {
    /// A transaction starts.
    fn begin(&mut self, tx: TxMeta) -> Result<()>;

    /// `table` has these columns from now on (its first appearance, or a schema change).
    /// Returns the handle the source passes to [`ChangeSink::row`] for the table.
    fn relation(&mut self, table: &TableRef, columns: &[ColumnDesc]) -> Result<usize>;

    /// Where to append one change of the table with handle `table`, or `None` when this
    /// change is not written (the table's snapshot already holds it, or it was written before
    /// a restart); either way [`ChangeSink::row_done`] follows.
    fn row(&mut self, table: usize, op: ChangeOp) -> Result<Option<&mut ChangeRows>>;

    /// The change whose rows [`ChangeSink::row`] returned is complete.
    fn row_done(&mut self) -> Result<()>;

    /// The transaction committed; `restart` is the position a restarted stream resumes from
    /// so that it begins with the next transaction.
    fn commit(&mut self, restart: &StreamPos) -> Result<()>;

    /// Between [`ChangeSink::begin`] and [`ChangeSink::commit`]: a runner that stops or
    /// reaches its end waits for the commit (the source's position means nothing inside).
    fn in_tx(&self) -> bool;
}

/// What one call of [`ChangeStream::next`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Messages were handled (changes may have reached the sink).
    Data,
    /// Nothing arrived within the wait.
    Idle,
}

/// A source's change log, read from a restart position. Implemented per engine.
#[async_trait]
pub trait ChangeStream: Send {
    /// Handle what arrives within `wait` (at least one message if any), feeding `sink`.
    async fn next(&mut self, sink: &mut dyn ChangeSink, wait: Duration) -> Result<Step>;

    /// Everything before the restart position `restart` (as given to
    /// [`ChangeSink::commit`]) is durable at the destination: the source may release it.
    async fn confirm(&mut self, restart: &StreamPos) -> Result<()>;

    /// The position up to which the source has sent everything, when known (between
    /// transactions, in `_pos` form): used to tell when the stream has caught up.
    fn received_through(&self) -> Option<StreamPos>;

    /// Tell the source the reader is alive while it reads nothing (its output holds new
    /// work back), so the source does not end the stream for silence (PostgreSQL's
    /// `wal_sender_timeout`). Sources whose protocol has no such message do nothing: a
    /// connection the server then closes is reopened from the saved position on the next
    /// read, like any lost connection.
    async fn keep_alive(&mut self) -> Result<()> {
        Ok(())
    }

    /// End the stream cleanly.
    async fn close(&mut self) -> Result<()>;
}

/// The names a capture is known by: the key of its state and, on sources that keep
/// [`ServerObjects`], those objects' names (PostgreSQL: a replication slot and a publication;
/// MySQL/MariaDB keep nothing on the server, the binary log needs no object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureNames {
    /// The capture's name (PostgreSQL: its replication slot). Stream states of earlier
    /// releases call it `slot`.
    #[serde(alias = "slot")]
    pub name: String,
    /// The publication (PostgreSQL only; unused elsewhere).
    pub publication: String,
}

/// A snapshot whose position is exactly a stream position, held open for the export.
pub struct HeldSnapshot {
    /// The snapshot the export reads under (its position is exact).
    pub snapshot: SnapshotInfo,
    /// The stream position of the snapshot: the stream from here holds exactly the changes the
    /// snapshot does not see.
    pub position: StreamPos,
    /// Keeps the snapshot valid; released when the export is done.
    pub hold: Box<dyn SnapshotHold>,
}

/// Keeps an exported snapshot valid (PostgreSQL: the idle session that created the slot).
#[async_trait]
pub trait SnapshotHold: Send {
    /// End the hold; the snapshot cannot be joined any more.
    async fn release(self: Box<Self>) -> Result<()>;
}

/// How the initial snapshot's rows are tied to the stream's start, so every transaction lands
/// exactly once: in the snapshot or in the change files.
pub enum Handoff {
    /// The source hands a snapshot to the export at exactly a stream position (PostgreSQL: the
    /// snapshot a replication slot exports as it is created).
    Held(HeldSnapshot),
    /// The export takes its own snapshots, and its manifest records for each a source
    /// position read under the snapshot's lock, which [`ChangeSource::manifest_position`]
    /// turns into the stream position (MySQL/MariaDB: workers start consistent snapshots
    /// under a brief global lock; the binary log position read there is exact).
    FromExportManifest,
}

/// What [`ChangeSource::start`] made.
pub struct Created {
    /// Where the stream starts (PostgreSQL: the slot's consistent point; MySQL: the binary
    /// log position read before any snapshot of the export).
    pub position: StreamPos,
    /// The snapshot hand-off, when a snapshot was asked for.
    pub handoff: Option<Handoff>,
    /// True when the publication was created by this call (so `--drop` removes it).
    pub publication_created: bool,
}

/// What a capture costs the source now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureHarm {
    /// Log the source keeps for this capture (PostgreSQL: WAL retained by the slot).
    pub retained_bytes: u64,
    /// Bytes of log between the confirmed position and the source's current end.
    pub lag_bytes: u64,
}

/// A source that can capture changes. Implemented per engine; driven by the stream runner.
#[async_trait]
pub trait ChangeSource: Send + Sync {
    /// The source's engine (MariaDB is [`crate::apply::Engine::Mysql`]).
    fn engine(&self) -> crate::apply::Engine;

    /// The source location with secrets redacted.
    fn display_url(&self) -> String;

    /// Values written as NULL because they could not be written (see [`BadValues`]).
    fn nulled_values(&self) -> u64 {
        0
    }

    /// False when the source's log leaves out the rows a foreign key's action changes (a
    /// cascaded delete, `SET NULL`): InnoDB applies those inside the storage engine, and
    /// MySQL (before 9.6) and MariaDB write them to no binary log. The runner then refuses,
    /// or handles, captured tables with such keys (see [`crate::apply::ForeignKey`]).
    fn logs_cascades(&self) -> bool {
        true
    }

    /// False when the source's log leaves generated columns out of its rows (PostgreSQL
    /// before 18 does not publish them): change files then lack those columns, which the
    /// runner says at start, naming them (the snapshot has them; a reader computes them from
    /// the expression, which [`crate::apply::GeneratedColumn`] carries).
    fn sends_generated(&self) -> bool {
        true
    }

    /// True when the stream describes each table's rows itself (PostgreSQL: relation
    /// messages decoded under the log's own catalog), so it decodes the changes of a table
    /// dropped while no stream ran. False (MySQL/MariaDB) when a table's changes are decoded
    /// with its columns from the catalog: a table gone from it cannot be decoded, and the
    /// runner says its last changes are missing.
    fn describes_rows(&self) -> bool {
        false
    }

    /// The source's identity for a replication's default name: engine, hosts and ports,
    /// database — what decides which log is read, not how the URL spells it (no user, no TLS
    /// options, no parameter order).
    fn identity(&self) -> String;

    /// What the source keeps for a capture that is not running, in the engine's words, for
    /// the end of a run and for errors that leave it stopped (`command`: the command that
    /// continues it, `sluice stream` or `sluice replicate`).
    fn while_stopped(&self, names: &CaptureNames, command: &str) -> String;

    /// The source an export reads from, under `snapshot` when given (a snapshot taken by
    /// [`ChangeSource::start`] or [`ChangeSource::handoff`] — a [`Handoff::Held`] one).
    fn export_source(&self, snapshot: Option<&SnapshotInfo>) -> Arc<dyn Source>;

    /// The objects the capture keeps on the server, when it keeps any (PostgreSQL: a slot and
    /// a publication). `None` (MySQL/MariaDB): the position lives in the stream state only,
    /// and the runner skips its checks that the objects exist (absent on a first start,
    /// present on a restart).
    fn server_objects(&self) -> Option<&dyn ServerObjects> {
        None
    }

    /// The stream position of a snapshot the export took itself, from the position its
    /// manifest records ([`Handoff::FromExportManifest`]). `Ok(None)`: the source hands its
    /// snapshots over ([`Handoff::Held`]) and the runner recorded their positions itself.
    /// Fails when the position is not exact enough to hand off from.
    fn manifest_position(&self, snapshot: &crate::position::Position) -> Result<Option<StreamPos>> {
        let _ = snapshot;
        Ok(None)
    }

    /// The primary, unique and foreign keys of the datasets' tables, for the writesets of
    /// `sluice replicate` (see [`crate::apply`]). The default knows the primary key only.
    async fn table_keys(&self, datasets: &[Dataset]) -> Result<Vec<crate::apply::TableKeys>> {
        Ok(datasets
            .iter()
            .filter_map(|d| {
                d.object
                    .clone()
                    .map(|t| crate::apply::TableKeys::primary_only(t, d.primary_key.clone()))
            })
            .collect())
    }

    /// Refuse, with the fix, datasets or a server that cannot stream.
    async fn check(&self, datasets: &[Dataset]) -> Result<()>;

    /// What of the captured tables' layout changes without a change in the log, as the
    /// adapter's JSON, kept with the stream's state and compared by
    /// [`ChangeSource::layout_changes`] (PostgreSQL: each partitioned table's partitions and the
    /// file each is in — a truncate of one partition is not published under its root, a
    /// detach produces no change). `None`: nothing to watch.
    async fn layout(&self, datasets: &[Dataset]) -> Result<Option<String>> {
        let _ = datasets;
        Ok(None)
    }

    /// What happened since `saved` (a [`ChangeSource::layout`]) that the log does not carry;
    /// empty when nothing.
    async fn layout_changes(&self, saved: &str, datasets: &[Dataset]) -> Result<Vec<LayoutChange>> {
        let _ = (saved, datasets);
        Ok(Vec::new())
    }

    /// Where each dataset's rows are stored now, as text that changes when the table is
    /// rewritten (PostgreSQL: the `relfilenode` of the table and of each leaf partition, which
    /// VACUUM FULL, CLUSTER, TRUNCATE and rewriting ALTER TABLE replace). A converged export
    /// compares it before its first chunk and after its last: a rewrite in between moves
    /// every row between its physical chunks without a change in the log. `None` (the default)
    /// where chunks are not physical.
    async fn storage(&self, datasets: &[Dataset]) -> Result<Option<BTreeMap<String, String>>> {
        let _ = datasets;
        Ok(None)
    }

    /// Refuse, with the fix, a log whose row images may lack columns a target needs to apply
    /// them: a key update arrives as a delete and an insert, and an insert without its
    /// unchanged columns cannot be applied (MySQL/MariaDB `binlog_row_image=MINIMAL` or
    /// `NOBLOB`). `sluice replicate` asks this; change files mark such columns `_absent`.
    async fn check_whole_rows(&self) -> Result<()> {
        Ok(())
    }

    /// Refuse, with the fix, captured tables whose log does not carry the whole old row of an
    /// update or a delete (`--before-images`; PostgreSQL: a table or partition without
    /// REPLICA IDENTITY FULL; MySQL/MariaDB: `binlog_row_image` other than FULL). The stream
    /// still stops at a change that arrives without one (the setting changed while it ran).
    async fn check_before_images(&self, datasets: &[Dataset]) -> Result<()> {
        let _ = datasets;
        Err(Error::config(format!(
            "{} cannot log old rows; stream without --before-images",
            self.display_url()
        )))
    }

    /// Start a capture of `datasets`: create its server objects where it keeps any (a
    /// failure leaves nothing behind) and say where the stream starts, with a snapshot
    /// hand-off when `snapshot`.
    async fn start(
        &self,
        names: &CaptureNames,
        datasets: &[Dataset],
        snapshot: bool,
    ) -> Result<Created>;

    /// A new snapshot hand-off for finishing an interrupted initial snapshot (PostgreSQL: a
    /// temporary slot's exported snapshot).
    async fn handoff(&self) -> Result<Handoff>;

    /// Stream the capture's changes from the restart position `from`.
    async fn open(
        &self,
        names: &CaptureNames,
        datasets: &[Dataset],
        from: &StreamPos,
    ) -> Result<Box<dyn ChangeStream>>;

    /// The source's current end of log, as a position: what `--until-current` waits for.
    async fn current_position(&self) -> Result<StreamPos>;

    /// A restart position as one number for monitoring (the `committed_position` metric):
    /// PostgreSQL's LSN; MySQL/MariaDB the binary log file's sequence number × 2^40 plus the
    /// offset. `None` when the position has no such form.
    fn position_number(&self, pos: &StreamPos) -> Option<u64> {
        let _ = pos;
        None
    }

    /// What the capture costs the source now (`None` when its objects are gone or it has not
    /// confirmed a position yet).
    async fn harm(&self, names: &CaptureNames) -> Result<Option<CaptureHarm>>;
}

/// The objects a capture keeps on the source server between runs (PostgreSQL: its
/// replication slot, which holds WAL for it, and its publication).
#[async_trait]
pub trait ServerObjects: Send + Sync {
    /// The objects in the engine's words, for messages (`replication slot sluice_x`).
    fn describe(&self, names: &CaptureNames) -> String;

    /// True when the capture's objects exist; fails when another session is streaming from
    /// them.
    async fn exists(&self, names: &CaptureNames) -> Result<bool>;

    /// How far a reader of the capture's objects confirmed having handled the changes
    /// (PostgreSQL: the slot's `confirmed_flush_lsn`); the server skips what commits before it
    /// even when asked to read from earlier. `None` when the objects do not exist.
    async fn confirmed(&self, names: &CaptureNames) -> Result<Option<StreamPos>>;

    /// Remove the capture's objects; the publication only when `publication`. Returns what
    /// was removed, for the message.
    async fn remove(&self, names: &CaptureNames, publication: bool) -> Result<Vec<String>>;

    /// The tables the capture's objects publish now (PostgreSQL: the publication's tables,
    /// partitioned ones under their root). A captured table missing here was dropped (or
    /// dropped and created again under its name), and its changes no longer arrive.
    async fn published(&self, names: &CaptureNames) -> Result<Vec<TableRef>>;

    /// Capture `tables` too from now on, before a snapshot of them is taken with
    /// [`ChangeSource::handoff`] (PostgreSQL: added to the publication when sluice created it —
    /// under a brief SHARE lock, so no transaction writing them spans the change — or
    /// checked to be in a publication the user manages). Doing it again is harmless.
    async fn publish(
        &self,
        names: &CaptureNames,
        publication_created: bool,
        tables: &[TableRef],
    ) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, dt: DataType) -> ColumnDesc {
        ColumnDesc {
            name: name.into(),
            source_type: "t".into(),
            field: Field::new(name, dt, false),
            cast: None,
            as_text_fallback: false,
        }
    }

    #[test]
    fn a_column_named_like_a_change_column_is_refused() {
        let t = TableRef {
            schema: "s".into(),
            name: "t".into(),
        };
        let e = change_schema(&t, &[col("_seq", DataType::Int64)]).unwrap_err();
        assert!(e.to_string().contains("_seq"), "{e}");
    }

    #[test]
    fn capture_names_of_earlier_states_read_back() {
        let old: CaptureNames =
            serde_json::from_str(r#"{"slot":"sluice_a","publication":"p"}"#).unwrap();
        assert_eq!(old.name, "sluice_a");
        let now = serde_json::to_string(&old).unwrap();
        assert_eq!(now, r#"{"name":"sluice_a","publication":"p"}"#);
    }
}
