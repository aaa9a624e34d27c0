//! A stream's batch of changes merged into its Delta table: copy-on-write, one table version
//! per batch (`sluice stream --format delta`).
//!
//! The batch is reduced to the rows its touched keys hold at its end (`sluice_sink::upsert`).
//! Every file of the table's current version that holds a touched key is read and written
//! again without those keys; the final rows go into one new file; one commit removes the old
//! files and adds the new ones, with the application transaction `(app id, last _seq of the
//! batch)` and the source position in `commitInfo`. A batch the table's transaction already
//! reached is not merged again, so a stream killed after the commit and run again never
//! applies a batch twice; one killed before it leaves files no version references (named by
//! the batch, so the batch run again writes the same names) and merges again.
//!
//! Why copy-on-write, by hand on top of the library's commit: the `deltalake` crate's own
//! MERGE needs its DataFusion feature (a query engine this project does not link) and writes
//! no deletion vectors; sluice's merge is a key lookup, not a query. The protocol (log,
//! actions, conflict checks) stays the library's.
//!
//! Small files: once the table holds [`COMPACT_AT`] files under [`SMALL_FILE`], the merge takes
//! them whole into its new file (in the same version), so the file count stays bounded.
//!
//! Cost: each batch reads the footer of every file of the table, the key columns of those whose
//! key statistics (min/max of the first key column per row group) may hold a touched key, and
//! rewrites the files that do hold one.

use crate::{delta_error, open};
use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake_core::kernel::{Action, Add, Transaction};
use deltalake_core::logstore::LogStoreRef;
use deltalake_core::logstore::object_store::{ObjectStoreExt, PutPayload};
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::{ObjectStore, Path};
use futures_util::TryStreamExt;
use serde_json::Value;
use sluice_core::{Error, Result, failpoint};
use sluice_sink::table::{ChangeMerge, Merged};
use sluice_sink::upsert::{Rewrite, Upserts};
use std::collections::HashMap;
use std::sync::Arc;
use url::Url;

/// Files smaller than this count as small (a batch's final rows, a rewritten small file).
const SMALL_FILE: i64 = 8 << 20;
/// Once a table holds this many small files, a merge takes them all into its new file: a
/// table merged into every few seconds stays at a bounded number of files without a
/// compaction job of its own.
const COMPACT_AT: usize = 16;

/// Merge `m` into its table under `root` (see the module's notes).
pub(crate) async fn merge(
    root: &Url,
    store: Option<&Arc<dyn ObjectStore>>,
    m: ChangeMerge,
) -> Result<Merged> {
    let url = root
        .join(&format!("{}/", m.dir))
        .map_err(|e| Error::internal(format!("table directory {:?} as a URL: {e}", m.dir)))?;
    let (table, exists) = open(&url, store).await?;
    if !exists && !m.create {
        return Err(Error::destination(
            sluice_core::error::Retry::Permanent,
            format!(
                "{}: the Delta table at {url} is gone (its snapshot made it): the stream \
                 cannot merge into a table that is not there. Take a new snapshot (sluice \
                 stream --drop, remove the output, start again).",
                m.dataset
            ),
        ));
    }
    let log: LogStoreRef = table.log_store();
    let files = log.object_store(None);
    let state = if exists {
        Some(table.snapshot().map_err(|e| delta_error(&url, e))?)
    } else {
        None
    };
    if let Some(state) = &state {
        let done = state
            .transaction_version(log.as_ref(), &m.app_id)
            .await
            .map_err(|e| delta_error(&url, e))?;
        if done.is_some_and(|v| v >= m.through_seq as i64) {
            return Ok(Merged::default());
        }
    }
    // Reduced only once the table is known not to hold the batch (a run again after a kill).
    let mut up = Upserts::new(&m.dataset, &m.changes, &m.key, &m.parquet)?;
    let current = if let Some(state) = &state {
        same_columns(&m.dataset, &url, state.schema().as_ref(), up.schema())?;
        let current: Vec<(String, i64, Action)> = state
            .snapshot()
            .file_views(log.as_ref(), None)
            .map_ok(|f| {
                let remove = Action::Remove(f.remove_action(true));
                (f.path().to_string(), f.size(), remove)
            })
            .try_collect()
            .await
            .map_err(|e| delta_error(&url, e))?;
        current
    } else {
        Vec::new()
    };
    let mut actions: Vec<Action> = Vec::new();
    let mut merged = Merged {
        made: true,
        ..Merged::default()
    };
    let mut written = 0usize;
    let mut put = async |bytes: Vec<u8>, rows: u64, merged: &mut Merged| -> Result<Add> {
        let path = format!("merge-{:020}-{written:05}.parquet", m.through_seq);
        written += 1;
        let size = bytes.len() as i64;
        files
            .put(&Path::from(path.as_str()), PutPayload::from(bytes))
            .await
            .map_err(|e| delta_error(&url, e.into()))?;
        merged.added += 1;
        merged.rows_written += rows;
        Ok(crate::add(path, size, chrono_millis(), rows))
    };
    let compact = current.iter().filter(|f| f.1 < SMALL_FILE).count() >= COMPACT_AT;
    for (path, size, remove) in current {
        let absorb = compact && size < SMALL_FILE;
        if up.truncated() {
            // Every row of it is gone: removed unread.
            merged.removed += 1;
            actions.push(remove);
            continue;
        }
        // The key's statistics in the footer first: most files hold no touched key.
        if !absorb {
            let footer = crate::footer(files.as_ref(), &url, &path, Some(size as u64)).await?;
            if !up.may_hold(&footer)? {
                continue;
            }
        }
        let bytes = files
            .get(&Path::from(path.as_str()))
            .await
            .map_err(|e| delta_error(&url, e.into()))?
            .bytes()
            .await
            .map_err(|e| delta_error(&url, e.into()))?;
        if absorb {
            up.absorb(bytes)?;
        } else {
            match up.rewrite(bytes)? {
                Rewrite::Untouched => continue,
                Rewrite::Removed => {}
                Rewrite::Replaced { bytes, rows } => {
                    actions.push(Action::Add(put(bytes, rows, &mut merged).await?));
                }
            }
        }
        merged.removed += 1;
        actions.push(remove);
    }
    if let Some((bytes, rows)) = up.finish()? {
        actions.push(Action::Add(put(bytes, rows, &mut merged).await?));
    }
    failpoint::hit_as(
        "stream.after_table_files",
        sluice_core::ErrorKind::Destination,
    )?;
    if actions.is_empty() {
        // Deletes of rows the table did not hold: nothing changes, and merging the batch
        // again changes nothing either.
        return Ok(Merged::default());
    }
    let metadata: HashMap<String, Value> = m
        .properties
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let properties = CommitProperties::default()
        .with_metadata(metadata)
        .with_application_transaction(Transaction::new(&m.app_id, m.through_seq as i64));
    let operation = DeltaOperation::Merge {
        predicate: None,
        merge_predicate: None,
        matched_predicates: Vec::new(),
        not_matched_predicates: Vec::new(),
        not_matched_by_source_predicates: Vec::new(),
    };
    let version = match state {
        Some(state) => CommitBuilder::from(properties)
            .with_actions(actions)
            .build(Some(state), log.clone(), operation)
            .await
            .map_err(|e| delta_error(&url, e))?
            .version(),
        None => {
            // `--initial none`: the first changes make the table, its columns theirs (read
            // back from the file just written, as an export's table is made).
            let Some(Action::Add(first)) = actions.first() else {
                return Err(Error::internal("a table made without a file"));
            };
            let schema = crate::file_schema(files.as_ref(), &url, &first.path).await?;
            CreateBuilder::new()
                .with_log_store(log)
                .with_columns(schema.fields().cloned())
                .with_save_mode(SaveMode::ErrorIfExists)
                .with_actions(actions)
                .with_commit_properties(properties)
                .await
                .map_err(|e| delta_error(&url, e))?
                .version()
                .unwrap_or_default()
        }
    };
    merged.version = Some(version as u64);
    failpoint::hit_as(
        "stream.after_table_commit",
        sluice_core::ErrorKind::Destination,
    )?;
    Ok(merged)
}

fn chrono_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The table's columns are the changes' columns, by name and order: a column added to or
/// dropped from the source table stops the merge, naming it (the table keeps its schema).
fn same_columns(
    dataset: &str,
    url: &Url,
    table: &deltalake_core::kernel::StructType,
    changes: &arrow_schema::SchemaRef,
) -> Result<()> {
    let have: Vec<&str> = table.fields().map(|f| f.name().as_str()).collect();
    let want: Vec<&str> = changes.fields().iter().map(|f| f.name().as_str()).collect();
    if have == want {
        return Ok(());
    }
    let added: Vec<&str> = want.iter().filter(|c| !have.contains(c)).copied().collect();
    let gone: Vec<&str> = have.iter().filter(|c| !want.contains(c)).copied().collect();
    Err(Error::source_permanent(format!(
        "{dataset}: its columns changed on the source (added: [{}]; dropped: [{}]), and the \
         Delta table at {url} keeps the columns of its snapshot in this release. Take a new \
         snapshot (sluice stream --drop, remove the table, start again); the change files \
         under {dataset}/changes/ hold every change up to here.",
        added.join(", "),
        gone.join(", ")
    )))
}
