//! Table formats (`--format delta`, `--format iceberg`): what a table commit is, and the
//! Parquet parts it adds. The parts are sluice's Parquet writer with every column in a type
//! the format has ([`crate::columns`]); the commit itself is made by the format's own library
//! in the crate `sluice-lake`, through [`TableCommitter`], so that this crate (and every crate
//! that writes files) does not link it.

use crate::columns::{Kind, TableSchema, table_schema};
use crate::destination::CountingWriter;
use crate::format::{ParquetOptions, PartStats, PartWriter};
use crate::parquet::ParquetPart;
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use sluice_core::Result;
use std::collections::BTreeMap;

/// One Parquet part of a table: the dataset's batches converted to the table's schema, then
/// written by the Parquet part writer.
pub struct TablePart {
    table: TableSchema,
    inner: Box<ParquetPart>,
}

impl TablePart {
    /// Start a part of a `kind` table for a dataset of `schema` (its name is only for messages).
    pub fn new(
        kind: Kind,
        schema: &SchemaRef,
        out: CountingWriter,
        options: &ParquetOptions,
        path: &str,
    ) -> Result<Self> {
        let table = table_schema(kind, path, schema)?;
        let inner = Box::new(ParquetPart::new(table.schema.clone(), out, options, path)?);
        Ok(TablePart { table, inner })
    }
}

impl PartWriter for TablePart {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let converted = self.table.convert(batch)?;
        self.inner.write(&converted)
    }

    fn finish(self: Box<Self>) -> Result<PartStats> {
        let TablePart { inner, .. } = *self;
        inner.finish()
    }

    fn abort(self: Box<Self>) {
        let TablePart { inner, .. } = *self;
        inner.abort()
    }
}

/// A part file of a table, as the commit adds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFile {
    /// Path relative to the table's directory.
    pub path: String,
    /// Bytes, as the part's receipt recorded them (the commit checks the file has them).
    pub bytes: u64,
    /// Rows, for the file's statistics.
    pub rows: u64,
}

/// One table commit: the table's contents become exactly `files`.
#[derive(Debug, Clone)]
pub struct TableCommit {
    /// The table's directory relative to the output root (the dataset's directory).
    pub dir: String,
    /// The dataset (an Iceberg table's name in its namespace is the dataset's last part).
    pub dataset: String,
    /// The dataset's key columns (an Iceberg table's identifier fields); empty without one.
    pub key: Vec<String>,
    /// Every part of the export, in part order.
    pub files: Vec<TableFile>,
    /// Names the export: a commit already made for it (a run killed after committing and
    /// resumed) is found and not made twice.
    pub export_id: String,
    /// Written into the commit's metadata: source engine and position, consistency, guarantee.
    pub properties: BTreeMap<String, String>,
}

/// What [`TableCommitter::commit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCommitted {
    /// The table version that holds the export.
    pub version: u64,
    /// False when the export's commit was already there (a resumed run).
    pub made: bool,
    /// Files of the earlier version the commit removed from the table (replaced contents).
    pub removed: u64,
}

/// Makes the commit that turns an export's parts into a table version; implemented by
/// `sluice-lake` with the format's own library, so that this crate (and every crate that
/// writes files) does not link it.
#[async_trait::async_trait]
pub trait TableCommitter: Send + Sync {
    /// Before anything is read, for the run's `datasets`: whatever the commits need that can
    /// fail early (a catalog that does not open, a namespace that cannot be made, two
    /// datasets that would be one table). Nothing to check by default.
    async fn check(&self, datasets: &[String]) -> Result<()> {
        let _ = datasets;
        Ok(())
    }

    /// Commit `commit`: one atomic table version whose contents are exactly its files
    /// (whatever the table held before is removed in the same version, so `--overwrite`
    /// replaces a table in one commit and readers never see half of it).
    async fn commit(&self, commit: TableCommit) -> Result<TableCommitted>;

    /// Merge one batch of a stream's changes into the table `merge.dir` (created by the
    /// stream's snapshot): one table version in which it equals the source table as of the
    /// batch's end, carrying the application transaction `(merge.app_id, merge.through_seq)`.
    /// A batch whose `through_seq` the table's transaction already reached is not merged
    /// again (a stream killed after the table commit and run again).
    async fn merge(&self, merge: ChangeMerge) -> Result<Merged>;

    /// Delete the data files of the table `dir` that no version newer than `retention` ago
    /// needs (Delta's VACUUM): a stream's copy-on-write merges leave every rewritten file
    /// behind for readers of older versions, and without this the table's directory grows
    /// for ever. Returns how many files were deleted. Readers of a version older than
    /// `retention` may then fail. Nothing to do by default.
    async fn vacuum(&self, dir: &str, retention: std::time::Duration) -> Result<u64> {
        let _ = (dir, retention);
        Ok(0)
    }
}

/// One batch of changes of one table, for [`TableCommitter::merge`].
#[derive(Debug, Clone)]
pub struct ChangeMerge {
    /// The table's directory relative to the output root (the dataset's directory).
    pub dir: String,
    /// The dataset, for messages.
    pub dataset: String,
    /// The application that writes the table: the stream.
    pub app_id: String,
    /// The batch's last `_seq`: the application transaction's version after the merge.
    pub through_seq: u64,
    /// The table's key columns.
    pub key: Vec<String>,
    /// The change rows, as the change files hold them, in `_seq` order.
    pub changes: Vec<RecordBatch>,
    /// Written into the commit's metadata: the source position the table equals.
    pub properties: BTreeMap<String, String>,
    /// How the merge's files are written.
    pub parquet: ParquetOptions,
    /// Make the table when there is none (a stream started with `--initial none`); otherwise
    /// a missing table is an error (it was removed: merging into a new one would lose rows).
    pub create: bool,
}

/// What [`TableCommitter::merge`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Merged {
    /// The table version that holds the batch (`None`: no version was needed).
    pub version: Option<u64>,
    /// False when the table already held the batch (a stream run again).
    pub made: bool,
    /// Files the version added.
    pub added: u64,
    /// Files removed (rewritten without the touched keys, or emptied).
    pub removed: u64,
    /// Rows the version wrote in new files (final rows plus rewritten ones).
    pub rows_written: u64,
}
