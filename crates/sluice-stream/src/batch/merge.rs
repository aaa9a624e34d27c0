//! The cut's table merge (`sluice stream --format delta`): each table the batch changed gets
//! one version of its table, through the job's `TableCommitter` (`sluice-lake`), carrying the
//! batch's last `_seq` as the stream's application transaction.

use super::{Batcher, io};
use sluice_core::{Error, Result};
use sluice_sink::table::{ChangeMerge, TableCommitter};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Where each batch is also merged: the datasets' tables (`sluice stream --format delta`).
pub struct MergeInto {
    /// Makes the table commits (`sluice-lake`).
    pub committer: Arc<dyn TableCommitter>,
    /// Each dataset's key columns.
    pub keys: HashMap<String, Vec<String>>,
    /// How the merge's files are written.
    pub parquet: sluice_sink::ParquetOptions,
    /// Vacuum each table with this retention (`--vacuum-retention`), at the run's first cut
    /// and then hourly (`VACUUM_EVERY`).
    pub vacuum: Option<Duration>,
    /// When the tables were last vacuumed by this run.
    pub last_vacuum: Option<Instant>,
}

/// How often a running stream vacuums its tables: listing a table's files costs one listing
/// of its directory, cheap once an hour, wasteful every batch.
const VACUUM_EVERY: Duration = Duration::from_secs(3600);

/// The application id of a stream's table commits (Delta's `txn`), whose version is the last
/// `_seq` merged: one stream writes a table (its snapshot created it).
pub const MERGE_APP_ID: &str = "sluice-stream";

impl Batcher {
    /// Merge the batch that ends at `last_seq` into each table it changed: one table version
    /// each, carrying `last_seq` (a version already there is found and not made again).
    pub(super) fn merge_tables(&mut self, last_seq: u64) -> Result<()> {
        let Some(merge) = &self.merge else {
            return Ok(());
        };
        let guarantee = if self.state.snapshot.initial == "none" {
            "the changes of every transaction committed after the stream's start (--initial \
             none: rows from before it are not in the table) and at or before \
             sluice.source.position"
        } else {
            "equal to the source table after every transaction committed at or before \
             sluice.source.position"
        };
        for t in &mut self.tables {
            let changes = std::mem::take(&mut t.merge_rows);
            if changes.is_empty() {
                continue;
            }
            let key =
                merge.keys.get(&t.dataset).cloned().ok_or_else(|| {
                    Error::internal(format!("{}: merged without its key", t.dataset))
                })?;
            let job = ChangeMerge {
                dir: sluice_sink::layout::dataset_dir(&t.dataset),
                dataset: t.dataset.clone(),
                app_id: MERGE_APP_ID.to_string(),
                through_seq: last_seq,
                key,
                changes,
                properties: [
                    (
                        "sluice.source.position".to_string(),
                        self.tx.pos.to_string(),
                    ),
                    ("sluice.seq".to_string(), last_seq.to_string()),
                    ("sluice.guarantee".to_string(), guarantee.to_string()),
                ]
                .into(),
                parquet: merge.parquet.clone(),
                create: self.state.snapshot.initial == "none"
                    && self
                        .state
                        .tables
                        .get(&t.dataset)
                        .is_some_and(|s| s.added.is_none()),
            };
            let committer = merge.committer.clone();
            let done = io(|| tokio::runtime::Handle::current().block_on(committer.merge(job)))?;
            if done.made {
                let m = &self.metrics;
                m.table_versions.fetch_add(1, Ordering::Relaxed);
                m.table_files_added.fetch_add(done.added, Ordering::Relaxed);
                m.table_files_removed
                    .fetch_add(done.removed, Ordering::Relaxed);
                tracing::debug!(
                    "{}: table version {:?} (+{} files, -{} files)",
                    t.dataset,
                    done.version,
                    done.added,
                    done.removed
                );
            }
        }
        self.vacuum_tables()
    }

    /// Vacuum every table of the stream when it is due (the run's first cut, then hourly).
    fn vacuum_tables(&mut self) -> Result<()> {
        let Some(merge) = &mut self.merge else {
            return Ok(());
        };
        let Some(retention) = merge.vacuum else {
            return Ok(());
        };
        if merge
            .last_vacuum
            .is_some_and(|t| t.elapsed() < VACUUM_EVERY)
        {
            return Ok(());
        }
        merge.last_vacuum = Some(Instant::now());
        for t in &self.tables {
            let dir = sluice_sink::layout::dataset_dir(&t.dataset);
            let committer = merge.committer.clone();
            let deleted = io(|| {
                tokio::runtime::Handle::current().block_on(committer.vacuum(&dir, retention))
            })?;
            if deleted > 0 {
                tracing::info!(
                    "{}: {deleted} data file(s) no version of the last {} s needs deleted",
                    t.dataset,
                    retention.as_secs()
                );
            }
            self.metrics
                .table_files_vacuumed
                .fetch_add(deleted, Ordering::Relaxed);
        }
        Ok(())
    }
}
