//! Lakehouse table formats for sluice: the Parquet parts an export wrote into a dataset's
//! directory become one version of a Delta Lake table, committed by the `deltalake` library
//! (delta-rs) — sluice writes the data files with its own writer and leaves the table
//! protocol (log, actions, protocol versions, conflict checks) to the library. A stream's
//! batches are merged into the table one version each (`merge.rs`).
//!
//! One commit per dataset, at the end of the run (`sluice-engine`'s `finish`, before the
//! manifest):
//! - the table does not exist: it is created from the parts' schema (read from the first
//!   part's footer, so the table's schema is exactly what the files hold) with every part
//!   added, in one version (0);
//! - it exists (`--overwrite`, or an earlier run's table): one version removes every file of
//!   the current version and adds the export's parts; a changed schema is written in the same
//!   version. Readers see the old contents or the new, never a mix.
//!
//! The commit carries an application transaction (`txn`: app id `sluice-export-<run id>`,
//! version 1): a run killed after its commit and resumed finds it and does not commit twice.
//! The commit's `commitInfo` carries the source position and guarantee (`sluice.*` keys), so
//! a reader can tell which point in time a version shows.
//!
//! Where: a local directory, or S3 (`s3://`, the bucket's client built here from the same
//! settings as the export's files, commits by conditional put — see `ConditionalPutLogStores`).
//! GCS and Azure are refused by the CLI: their clients are not linked in the library's
//! version of the object-store crate here.
//! Statistics: each file's row count (`numRecords`); no per-column min/max (readers then do
//! not skip files by value, which costs time, never correctness).

mod iceberg;
mod merge;
mod probe;

pub use iceberg::IcebergCommitter;

use async_trait::async_trait;
use deltalake_core::DeltaResult;
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake_core::kernel::{Action, Add, MetadataExt, StructType, Transaction};
use deltalake_core::logstore::object_store::ObjectStoreExt;
use deltalake_core::logstore::object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use deltalake_core::logstore::{
    LogStoreFactory, LogStoreRef, ObjectStoreRef, StorageConfig, default_logstore,
    logstore_factories,
};
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::parquet::arrow::parquet_to_arrow_schema;
use deltalake_core::parquet::file::metadata::ParquetMetaDataReader;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::{DeltaTable, DeltaTableBuilder, DeltaTableError, ObjectStore, Path};
use futures_util::TryStreamExt;
use serde_json::{Value, json};
use sluice_core::error::Retry;
use sluice_core::{Error, Result};
use sluice_sink::table::{ChangeMerge, Merged, TableCommit, TableCommitted, TableCommitter};
use std::collections::HashMap;
use std::sync::Arc;
use url::Url;

/// Version of the application transaction an export commits with.
const EXPORT_TXN_VERSION: i64 = 1;

/// Commits exports into Delta tables under one output location: a local directory, or an
/// S3 prefix.
pub struct DeltaCommitter {
    root: Url,
    /// The bucket's store (S3), `None` for a local directory (the library opens those).
    store: Option<Arc<dyn ObjectStore>>,
}

/// Commit files on S3 through the library's default log store: each version's file is
/// written with a conditional put (`If-None-Match`), so of two writers of one version one
/// fails instead of both succeeding. S3 (since 2024), MinIO and moto honour it; a store that
/// ignores it could lose a concurrent commit, which is why the library does not register this
/// for `s3://` by itself.
#[derive(Debug)]
struct ConditionalPutLogStores;

impl LogStoreFactory for ConditionalPutLogStores {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> DeltaResult<LogStoreRef> {
        Ok(default_logstore(
            prefixed_store,
            root_store,
            location,
            options,
        ))
    }
}

/// Options of sluice's object-store URLs that are sluice's own, not the S3 client's.
const SLUICE_ONLY: &[&str] = &["part_size", "upload_concurrency"];

impl DeltaCommitter {
    /// A committer for the output directory `dir` (absolute, or relative to the working
    /// directory); refuses what the library cannot write here (object stores).
    pub fn local(dir: &std::path::Path) -> Result<Self> {
        let abs = std::path::absolute(dir)
            .map_err(|e| Error::config(format!("--to {}: {e}", dir.display())))?;
        let root = Url::from_directory_path(&abs).map_err(|()| {
            Error::config(format!(
                "--to {}: not a directory path a Delta table can live in",
                dir.display()
            ))
        })?;
        Ok(DeltaCommitter { root, store: None })
    }

    /// A committer for `to`: a local directory or `file://` URL, or `s3://bucket/prefix`
    /// with the same client settings the export's files were written with (the environment's
    /// `AWS_*`, the URL's query and `options`). Other object stores are refused, naming what
    /// works.
    pub fn for_output(to: &str, options: &[(String, String)]) -> Result<Self> {
        if let Some(path) = to.strip_prefix("file://") {
            return Self::local(std::path::Path::new(path));
        }
        if !to.contains("://") {
            return Self::local(std::path::Path::new(to));
        }
        let shown = sluice_core::redact::redact_url(to);
        let url =
            Url::parse(to).map_err(|e| Error::config(format!("--to {shown} is not a URL: {e}")))?;
        if url.scheme() != "s3" {
            return Err(Error::config(format!(
                "--format delta writes tables in a local directory or on S3 (s3://) in this \
                 release; {shown} is another object store, which the Delta commit does not \
                 reach yet: use a local --to or s3://, or --format parquet."
            )));
        }
        let bucket = url.host_str().unwrap_or_default();
        let mut b = AmazonS3Builder::from_env().with_url(format!("s3://{bucket}"));
        let pairs = url
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .chain(options.iter().cloned());
        for (k, v) in pairs {
            if SLUICE_ONLY.contains(&k.as_str()) {
                continue;
            }
            let key: AmazonS3ConfigKey = k
                .parse()
                .map_err(|_| Error::config(format!("--to {shown}: {k:?} is not an S3 setting")))?;
            b = b.with_config(key, v);
        }
        let store = b.build().map_err(|e| {
            Error::config(format!(
                "--to {shown}: cannot set up the S3 client for Delta: {e}"
            ))
        })?;
        let prefix = url.path().trim_matches('/');
        let root = Url::parse(&format!(
            "s3://{bucket}/{}",
            if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            }
        ))
        .map_err(|e| Error::config(format!("--to {shown}: {e}")))?;
        let factories = logstore_factories();
        let scheme = Url::parse("s3://").map_err(|e| Error::internal(e.to_string()))?;
        if !factories.contains_key(&scheme) {
            factories.insert(scheme, Arc::new(ConditionalPutLogStores));
        }
        Ok(DeltaCommitter {
            root,
            store: Some(Arc::new(store)),
        })
    }

    /// `sluice doctor`'s check of the output: a throwaway table made and committed there, and
    /// a conditional put refused the second time (see `probe.rs`); the line to print.
    pub async fn probe(&self) -> Result<String> {
        probe::probe(&self.root, self.store.as_ref()).await
    }

    fn table_url(&self, dir: &str) -> Result<Url> {
        self.root
            .join(&format!("{dir}/"))
            .map_err(|e| Error::internal(format!("table directory {dir:?} as a URL: {e}")))
    }
}

/// A library error as sluice's: conflicts with a concurrent writer and storage failures may
/// pass on a retry; the rest will not.
fn delta_error(table: &Url, e: DeltaTableError) -> Error {
    let retry = match &e {
        DeltaTableError::ObjectStore { .. } | DeltaTableError::Io { .. } => Retry::Transient,
        DeltaTableError::Transaction { .. } | DeltaTableError::VersionAlreadyExists(_) => {
            Retry::Transient
        }
        _ => Retry::Permanent,
    };
    Error::destination(retry, format!("Delta table {table}: {e}"))
}

/// The table at `url`, loaded, or `None` where there is none yet.
async fn open(url: &Url, store: Option<&Arc<dyn ObjectStore>>) -> Result<(DeltaTable, bool)> {
    let mut table = DeltaTableBuilder::from_url(url.clone())
        .map(|b| match store {
            Some(s) => b.with_storage_backend(s.clone(), url.clone()),
            None => b,
        })
        .and_then(|b| b.build())
        .map_err(|e| delta_error(url, e))?;
    if !table
        .verify_deltatable_existence()
        .await
        .map_err(|e| delta_error(url, e))?
    {
        return Ok((table, false));
    }
    table.load().await.map_err(|e| delta_error(url, e))?;
    Ok((table, true))
}

/// The Parquet footer (the file's metadata, without the trailing length and magic) of the
/// file at `path`, `size` bytes long (`None`: ask the store).
async fn footer(
    store: &dyn ObjectStore,
    url: &Url,
    path: &str,
    size: Option<u64>,
) -> Result<bytes::Bytes> {
    let location = Path::from(path);
    let size = match size {
        Some(s) => s,
        None => {
            store
                .head(&location)
                .await
                .map_err(|e| delta_error(url, e.into()))?
                .size
        }
    };
    let bad = |what: &str| Error::data(format!("{url}{path}: {what}"));
    if size < 8 {
        return Err(bad("too short to be a Parquet file"));
    }
    let tail = store
        .get_range(&location, size - 8..size)
        .await
        .map_err(|e| delta_error(url, e.into()))?;
    let len = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) as u64;
    if &tail[4..] != b"PAR1" || len + 8 > size {
        return Err(bad("no Parquet footer"));
    }
    store
        .get_range(&location, size - 8 - len..size - 8)
        .await
        .map_err(|e| delta_error(url, e.into()))
}

/// The Delta schema of a part, from its footer (the Arrow schema sluice's writer embeds).
async fn file_schema(store: &dyn ObjectStore, url: &Url, path: &str) -> Result<StructType> {
    let footer = footer(store, url, path, None).await?;
    let bad = |what: &str| Error::data(format!("{url}{path}: {what}"));
    let parquet =
        ParquetMetaDataReader::decode_metadata(&footer).map_err(|e| bad(&e.to_string()))?;
    let file = parquet.file_metadata();
    let arrow = parquet_to_arrow_schema(file.schema_descr(), file.key_value_metadata())
        .map_err(|e| bad(&e.to_string()))?;
    (&arrow)
        .try_into_kernel()
        .map_err(|e| bad(&format!("no Delta schema for its columns: {e}")))
}

/// A table partitioned by another writer: sluice's parts are not partitioned, and adding them
/// to such a table would leave a table its readers cannot read, so its contents are not
/// replaced (the kernel's accessor for the partition columns is not public; the metadata's
/// own serialization says them).
fn refuse_partitioned(url: &Url, metadata: &deltalake_core::kernel::Metadata) -> Result<()> {
    let json = serde_json::to_value(metadata).unwrap_or_default();
    let columns: Vec<&str> = json["partitionColumns"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if columns.is_empty() {
        return Ok(());
    }
    Err(Error::config(format!(
        "{url} is a Delta table partitioned by ({}), and sluice writes unpartitioned tables: it \
         will not replace that table's contents. Export to another --to, or remove the table \
         first.",
        columns.join(", ")
    )))
}

/// The `add` action of one part: its size and modification time as the store reports them
/// (a size other than the receipt's means the file is not the one the run wrote).
async fn add_action(
    store: &dyn ObjectStore,
    url: &Url,
    file: &sluice_sink::table::TableFile,
) -> Result<Add> {
    let meta = store
        .head(&Path::from(file.path.as_str()))
        .await
        .map_err(|e| delta_error(url, e.into()))?;
    if meta.size != file.bytes {
        return Err(Error::data(format!(
            "{url}{}: {} bytes where the part's receipt says {}: the file was changed after the \
             run wrote it; use --overwrite to export again",
            file.path, meta.size, file.bytes
        )));
    }
    Ok(add(
        file.path.clone(),
        meta.size as i64,
        meta.last_modified.timestamp_millis(),
        file.rows,
    ))
}

/// The `add` action of a data file sluice wrote: unpartitioned, its row count as statistics.
fn add(path: String, size: i64, modification_time: i64, rows: u64) -> Add {
    Add {
        path,
        partition_values: HashMap::new(),
        size,
        modification_time,
        data_change: true,
        stats: Some(json!({ "numRecords": rows }).to_string()),
        ..Default::default()
    }
}

fn properties(commit: &TableCommit, app_id: &str) -> CommitProperties {
    let metadata: HashMap<String, Value> = commit
        .properties
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    CommitProperties::default()
        .with_metadata(metadata)
        .with_application_transaction(Transaction::new(app_id, EXPORT_TXN_VERSION))
}

#[async_trait]
impl TableCommitter for DeltaCommitter {
    async fn merge(&self, merge: ChangeMerge) -> Result<Merged> {
        merge::merge(&self.root, self.store.as_ref(), merge).await
    }

    /// Delta's VACUUM in its lite mode: the files `remove` actions of the log tombstoned more
    /// than `retention` ago are deleted (files no version references are not looked for).
    /// The table's own minimum retention (`delta.deletedFileRetentionDuration`, 7 days by
    /// default) is not enforced: the user chose `retention`.
    async fn vacuum(&self, dir: &str, retention: std::time::Duration) -> Result<u64> {
        let url = self.table_url(dir)?;
        let (table, exists) = open(&url, self.store.as_ref()).await?;
        if !exists {
            return Ok(0);
        }
        let retention = chrono::Duration::from_std(retention)
            .map_err(|e| Error::config(format!("--vacuum-retention: {e}")))?;
        let (_, metrics) = table
            .vacuum()
            .with_retention_period(retention)
            .with_enforce_retention_duration(false)
            .await
            .map_err(|e| delta_error(&url, e))?;
        Ok(metrics.files_deleted.len() as u64)
    }

    async fn commit(&self, commit: TableCommit) -> Result<TableCommitted> {
        let url = self.table_url(&commit.dir)?;
        let app_id = format!("sluice-export-{}", commit.export_id);
        let (table, exists) = open(&url, self.store.as_ref()).await?;
        let log: LogStoreRef = table.log_store();
        let store = log.object_store(None);
        if exists {
            let state = table.snapshot().map_err(|e| delta_error(&url, e))?;
            if state
                .transaction_version(log.as_ref(), &app_id)
                .await
                .map_err(|e| delta_error(&url, e))?
                .is_some_and(|v| v >= EXPORT_TXN_VERSION)
            {
                return Ok(TableCommitted {
                    version: table.version().unwrap_or_default(),
                    made: false,
                    removed: 0,
                });
            }
        }
        let first = commit.files.first().ok_or_else(|| {
            Error::internal(format!("{}: a table commit without parts", commit.dir))
        })?;
        let schema = file_schema(store.as_ref(), &url, &first.path).await?;
        let mut adds = Vec::with_capacity(commit.files.len());
        for f in &commit.files {
            adds.push(Action::Add(add_action(store.as_ref(), &url, f).await?));
        }
        if !exists {
            let table = CreateBuilder::new()
                .with_log_store(log)
                .with_columns(schema.fields().cloned())
                .with_save_mode(SaveMode::ErrorIfExists)
                .with_actions(adds)
                .with_commit_properties(properties(&commit, &app_id))
                .await
                .map_err(|e| delta_error(&url, e))?;
            return Ok(TableCommitted {
                version: table.version().unwrap_or_default(),
                made: true,
                removed: 0,
            });
        }
        let state = table.snapshot().map_err(|e| delta_error(&url, e))?;
        refuse_partitioned(&url, state.metadata())?;
        let mut actions: Vec<Action> = Vec::new();
        if state.schema().as_ref() != &schema {
            let metadata = state
                .metadata()
                .clone()
                .with_schema(&schema)
                .map_err(|e| delta_error(&url, e.into()))?;
            actions.push(Action::Metadata(metadata));
        }
        let removes: Vec<Action> = state
            .snapshot()
            .file_views(log.as_ref(), None)
            .map_ok(|f| Action::Remove(f.remove_action(true)))
            .try_collect()
            .await
            .map_err(|e| delta_error(&url, e))?;
        let removed = removes.len() as u64;
        actions.extend(removes);
        actions.extend(adds);
        let done = CommitBuilder::from(properties(&commit, &app_id))
            .with_actions(actions)
            .build(
                Some(state),
                log.clone(),
                DeltaOperation::Write {
                    mode: SaveMode::Overwrite,
                    partition_by: None,
                    predicate: None,
                },
            )
            .await
            .map_err(|e| delta_error(&url, e))?;
        Ok(TableCommitted {
            version: done.version(),
            made: true,
            removed,
        })
    }
}
