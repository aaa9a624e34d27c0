//! The run's bookkeeping, as written to the output: the manifest (written last; marks the
//! output complete), the run plan a resumed run follows (`_sluice/run.json`), one receipt per
//! committed part, and the harm figures. The engine keeps them; the sink only stores bytes.
//!
//! Every part records which snapshot it was read under, because a resumed run cannot rejoin a
//! dead snapshot: its parts come from a new one, and the manifest says so.

use crate::request::RequestRecord;
use serde::{Deserialize, Serialize};
use sluice_core::{Chunk, Position};

/// Version of the manifest layout. 2: the request, per-dataset guarantees and caveats.
pub const MANIFEST_VERSION: u32 = 2;

/// One snapshot a run read under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// Index used by parts to refer to this snapshot.
    pub index: u32,
    /// The engine's snapshot id (e.g. PostgreSQL's exported snapshot name), if any.
    pub id: Option<String>,
    /// The source position of the snapshot.
    pub position: Position,
    /// When it was taken (RFC 3339).
    pub taken_at: String,
    /// `snapshot` or `chunk`.
    pub consistency: String,
}

/// One column of a dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnRecord {
    /// Column name.
    pub name: String,
    /// Arrow type as Arrow prints it (`Decimal128(12, 2)`).
    pub arrow_type: String,
    /// Source type as the database prints it.
    pub source_type: String,
    /// Whether NULLs may occur.
    pub nullable: bool,
    /// True when read as text because the type has no native mapping.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub text_fallback: bool,
}

/// A committed part: the receipt a worker writes after the file is committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    /// Dataset name.
    pub dataset: String,
    /// Part number.
    pub ordinal: u32,
    /// Path relative to the output root.
    pub file: String,
    /// Rows in the file.
    pub rows: u64,
    /// Bytes of the file.
    pub bytes: u64,
    /// xxh3-128 of the file's bytes.
    pub xxh3_128: String,
    /// Index of the snapshot it was read under (see [`SnapshotRecord::index`]).
    pub snapshot: u32,
    /// The rows it covers, as the chunk planner described them.
    pub range: String,
}

/// What a dataset's rows are guaranteed to be, given how its parts were read. Computed from
/// the plan and the receipts when the manifest is written, so it states what happened, not
/// what was asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Guarantee {
    /// Every part was read under one snapshot: the dataset is exactly the table as of that
    /// snapshot (rows of `outside_snapshot` relations excepted).
    Snapshot {
        /// Index into the manifest's `snapshots`.
        snapshot: u32,
    },
    /// The dataset was read as one part in one transaction of its own (chunk consistency): it
    /// is the table as of one point in time, not the same point as other datasets.
    Transaction,
    /// Parts are key ranges read in different transactions or snapshots. Every row whose key
    /// did not change during the run appears exactly once (in the state of the read of its
    /// range); a row inserted or deleted during the run appears at most once; a row whose key
    /// changed may appear under its old key, its new key, both or neither.
    KeyRanges {
        /// The key columns.
        key: Vec<String>,
    },
    /// Physical parts (page ranges or partitions) read in different transactions: a row that
    /// an UPDATE moved between parts during the run may be missing or repeated. sluice's
    /// PostgreSQL adapter never produces this; it marks engines that still plan so.
    PhysicalRanges,
    /// Parts read in short transactions at different times, then made equal to one point of
    /// the source's change log (`--consistency converged`): the dataset is the table after
    /// every transaction committed before `end` (see [`ConvergedRecord`]).
    Converged {
        /// The end point T, in the change log's position form.
        end: String,
    },
}

impl Guarantee {
    /// One line for the report.
    pub fn describe(&self) -> String {
        match self {
            Guarantee::Snapshot { snapshot } => format!("exactly as of snapshot {snapshot}"),
            Guarantee::Transaction => "exactly as of its own transaction".into(),
            Guarantee::KeyRanges { key } => format!(
                "key ranges on ({}) read at different times: each row whose key did not change \
                 exactly once",
                key.join(", ")
            ),
            Guarantee::PhysicalRanges => "physical ranges read at different times: rows moved \
                 during the run may be missing or repeated"
                .into(),
            Guarantee::Converged { end } => format!(
                "exactly as of log position {end}: every transaction committed before it, none \
                 after"
            ),
        }
    }
}

/// One dataset of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetRecord {
    /// Dataset name (`schema.table` or the query's name).
    pub name: String,
    /// What it was read from (`table`, `partitioned`, `view`, `query`).
    pub kind: String,
    /// Columns in order.
    pub columns: Vec<ColumnRecord>,
    /// The physical relations read (a partitioned table's leaf partitions), by name; a resume
    /// compares them with the catalog to notice partitions attached or detached since.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relations: Vec<String>,
    /// Relations whose rows the snapshot does not cover (foreign tables, read from their
    /// server or file when their part was read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside_snapshot: Vec<String>,
    /// Why the relations of `outside_snapshot` are not at the snapshot's point in time (a
    /// PostgreSQL foreign table is read from its server when its part is read; a MySQL table
    /// in a non-transactional engine such as MyISAM is not covered by a consistent snapshot:
    /// each part is one consistent read, the whole table is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside_snapshot_reason: Option<String>,
    /// True when row-level security policies filtered the rows (`--enable-row-security`):
    /// the dataset may be a subset of the table.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub row_security_filtered: bool,
    /// True when `--columns` chose the columns: the dataset holds a subset of the table's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub columns_picked: bool,
    /// The filters its rows met at the source (a read's pushed filters): the dataset holds
    /// the table's rows that meet all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub row_filter: Vec<sluice_core::filter::RowFilter>,
    /// What the rows are guaranteed to be (set in the manifest; absent in the run state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee: Option<Guarantee>,
    /// Total rows.
    pub rows: u64,
    /// Total bytes of its files.
    pub bytes: u64,
    /// Its part files, in part order. With `merged`, these files were removed after merging
    /// and the list records where the merged file's rows came from.
    pub parts: Vec<PartRecord>,
    /// The single file of a `--merge` export.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<MergedRecord>,
}

/// The one file of a merged dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedRecord {
    /// Path relative to the output root.
    pub file: String,
    /// Rows.
    pub rows: u64,
    /// Bytes.
    pub bytes: u64,
    /// xxh3-128 of the file's bytes.
    pub xxh3_128: String,
}

/// What sluice read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRecord {
    /// Engine name.
    pub engine: String,
    /// URL with secrets redacted.
    pub url: String,
    /// Server product and version.
    pub server_version: String,
}

/// Peak harm to the source during the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HarmRecord {
    /// Longest time a snapshot was held, seconds.
    pub snapshot_held_seconds: f64,
    /// Peak age in transactions of the oldest xmin our sessions held (PostgreSQL).
    pub peak_xmin_age: Option<u64>,
    /// Longest open transaction among our sessions, seconds.
    pub longest_transaction_seconds: f64,
    /// Longest statement among our sessions, seconds.
    pub longest_statement_seconds: f64,
    /// Peak number of connections the run held.
    pub peak_connections: u32,
    /// How long a server-wide lock was held to start the snapshot, seconds (MySQL/MariaDB:
    /// `BACKUP STAGE BLOCK_COMMIT` or `FLUSH TABLES WITH READ LOCK`); absent where none is
    /// taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_lock_seconds: Option<f64>,
    /// How long the run waited to be granted that lock, seconds (writes on the server may
    /// queue behind a waiting request; bounded by `--lock-wait-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_lock_wait_seconds: Option<f64>,
    /// Peak number of other sessions waiting on a lock our sessions held.
    #[serde(default)]
    pub peak_blocked_sessions: u32,
    /// Longest wait of a session blocked by our locks, seconds.
    #[serde(default)]
    pub longest_blocked_wait_seconds: f64,
    /// Samples taken.
    pub samples: u64,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Layout version ([`MANIFEST_VERSION`]).
    pub manifest_version: u32,
    /// `sluice <version>`.
    pub tool: String,
    /// Identifier of the run that completed the output.
    pub run_id: String,
    /// Where the data came from.
    pub source: SourceRecord,
    /// `snapshot` (one point in time) or `chunk` (per-chunk transactions: not one point).
    pub consistency: String,
    /// Every option that decides what the output holds; a later run on this output compares
    /// its own request with it.
    pub request: RequestRecord,
    /// Every snapshot parts were read under; more than one after a resume.
    pub snapshots: Vec<SnapshotRecord>,
    /// Output format, e.g. `parquet zstd(1)`.
    pub format: String,
    /// When the first run of this output started (RFC 3339).
    pub started_at: String,
    /// When it finished.
    pub finished_at: String,
    /// The datasets.
    pub datasets: Vec<DatasetRecord>,
    /// Harm to the source in the run that finished the output.
    pub harm: HarmRecord,
    /// How a converged export reached its point in time (`--consistency converged` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converged: Option<ConvergedRecord>,
}

/// How a converged export (`--consistency converged`) reached its one point in time: what the
/// change log said changed while the chunks were read, and what that cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConvergedRecord {
    /// The change log position C followed from, taken before the first chunk was read.
    pub start: String,
    /// The end point T: the output is the tables after every transaction committed before it.
    pub end: String,
    /// Distinct keys changed between C and (at least) T, read again under the snapshot at T.
    pub changed_keys: u64,
    /// Datasets whose table was truncated during the run: every part read before was emptied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<String>,
    /// Rows read again at T (the changed keys still alive there).
    pub reread_rows: u64,
    /// Parts rewritten without the changed keys, and the bytes they had before.
    pub parts_rewritten: u64,
    /// Bytes of the parts rewritten, as first written.
    pub rewritten_bytes: u64,
    /// Bytes of every part read before the end point, as first written: what
    /// `rewritten_bytes` is a share of.
    pub chunk_bytes: u64,
    /// Bytes (as written before) of the row groups decoded and encoded again without their
    /// changed rows; the rest of the rewritten parts was copied as encoded, or left out.
    #[serde(default)]
    pub reencoded_bytes: u64,
    /// Rows removed from parts (older copies of changed keys).
    pub rows_removed: u64,
    /// The longest a chunk's transaction lived (its read), in seconds.
    pub longest_chunk_seconds: f64,
    /// How long the snapshot at T was held: following the log up to T, then reading the
    /// changed keys.
    pub end_snapshot_seconds: f64,
    /// Bytes of log from C to T, which the source kept for the run (PostgreSQL: WAL held by
    /// the run's replication slot), when positions are byte offsets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_bytes: Option<u64>,
}

/// `_sluice/run.json`: the plan a resumed run must follow, so part numbers mean the same rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// Layout version.
    pub manifest_version: u32,
    /// Identifier of the first run.
    pub run_id: String,
    /// When the first run started.
    pub started_at: String,
    /// Every output-affecting option of the request; a resume with a different request is
    /// refused, naming each difference. `None` in run states of older versions.
    #[serde(default)]
    pub request: Option<RequestRecord>,
    /// `snapshot` or `chunk`.
    pub consistency: String,
    /// File extension of the parts.
    pub extension: String,
    /// Snapshots used so far (one per run of this output).
    pub snapshots: Vec<SnapshotRecord>,
    /// The datasets and their columns as first planned; a resume whose source schema differs
    /// is refused.
    pub datasets: Vec<DatasetRecord>,
    /// Every chunk of every dataset.
    pub chunks: Vec<Chunk>,
    /// A converged run's start in the change log, recorded once the log is followed and
    /// before any chunk is read: a resume follows the log again from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converged: Option<ConvergedStart>,
}

/// Where a converged run follows the change log from, kept in `_sluice/run.json` so that a
/// resumed run reads the same log again (the source keeps it for the run: PostgreSQL's slot
/// is never confirmed past C until the manifest is written).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConvergedStart {
    /// The position C, as the change log writes positions.
    pub position: String,
    /// Where each dataset's rows were stored at C (see `ChangeSource::storage`): a resume
    /// refuses a table rewritten since, whose rows moved between its physical chunks unseen by
    /// the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<std::collections::BTreeMap<String, String>>,
    /// Each dataset's primary key at C: the parts' rows are matched with the changed keys by
    /// these columns, so a resume refuses a dataset whose key changed since.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub keys: std::collections::BTreeMap<String, Vec<String>>,
}
