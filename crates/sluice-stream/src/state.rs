//! The stream's saved state: where it is, what it promised, what it created.
//!
//! Stored with the output by default (`<to>/_sluice/stream.json`, written atomically, so it
//! works on object stores too), or in Redis (`--state redis://…`). The order of writes is what
//! makes files exactly-once across crashes:
//!
//! 1. the batch's range and files are recorded as an **intent**;
//! 2. the change files are committed (each atomically);
//! 3. the **committed** position replaces the intent;
//! 4. only then is the source told it may release the log before that position.
//!
//! A restart that finds an intent streams again from the committed position and cuts its first
//! batch exactly at the intent's last `_seq`, so the same changes go to the same file names;
//! files past the committed position that no intent covers are removed.

use serde::{Deserialize, Serialize};
use sluice_core::change::{CaptureNames, Handoff, SnapshotHold};
use sluice_core::ident::{NamePart, QualifiedName};
use sluice_core::table::{ColumnPick, TableRef};
use sluice_core::{Error, Position, Result, Selection, SnapshotInfo, StreamPos};
use sluice_sink::{Destination, ObjectVersion};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where the state lives in the output.
pub const STATE_PATH: &str = "_sluice/stream.json";
/// The state format's version.
pub const STATE_VERSION: u32 = 1;

/// One table's schema version: its columns from `since_seq` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaVersion {
    /// 1, 2, …
    pub version: u32,
    /// The first `_seq` written with it: a version starts at its first change, not where the
    /// source announced the columns (states of earlier releases may hold a version that
    /// starts before its first change).
    pub since_seq: u64,
    /// Position of the transaction of its first change.
    pub since_pos: StreamPos,
    /// Columns: name, Arrow type, source type.
    pub columns: Vec<(String, String, String)>,
}

/// A table of the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableState {
    /// The table.
    pub table: TableRef,
    /// Changes of transactions whose `_pos` is below this are in the table's snapshot and are
    /// not written (None: every change is written).
    pub snapshot_position: Option<StreamPos>,
    /// Schema versions, oldest first.
    pub versions: Vec<SchemaVersion>,
    /// Changes its change files miss, in words (a foreign key's cascades the source's log
    /// leaves out, streamed with `--accept-missing-cascades`); also in each Parquet change
    /// file's metadata as `sluice.missing_changes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// The columns `--columns` keeps in its change files, as of the last start (`None`: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
    /// Set for a table that joined the stream after it started (`added.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added: Option<Added>,
    /// Set once the table was dropped on the source and its final marker written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<Dropped>,
}

/// A table that joined a running stream: its snapshot is read under a snapshot of its own,
/// whose position becomes its [`TableState::snapshot_position`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Added {
    /// When it was found (RFC 3339).
    pub found_at: String,
    /// Where its snapshot's manifest and bookkeeping are (`_sluice/added/<id>/`); its parts
    /// are in its directory, as every table's.
    pub snapshot: String,
    /// Its snapshot is complete; until then a restart reads it again before streaming.
    pub snapshot_done: bool,
}

/// A captured table that no longer exists on the source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    /// A source position after the drop: every change of the table is before it.
    pub before: StreamPos,
    /// When the drop was found (RFC 3339).
    pub found_at: String,
    /// The last `_seq` written when its marker was (its changes all have a lower one).
    pub last_seq: u64,
    /// False when its last changes could not be decoded (dropped while no stream ran, on a
    /// source that decodes with the catalog's columns: see
    /// [`sluice_core::change::ChangeSource::describes_rows`]).
    pub complete: bool,
}

impl StreamState {
    /// Record `datasets` as tables joining after the start, their snapshots not done yet, the
    /// bookkeeping of those snapshots under `snapshot` (a stream's; empty for a replication).
    pub(crate) fn join(&mut self, datasets: &[sluice_core::Dataset], snapshot: &str) {
        let found_at = chrono::Utc::now().to_rfc3339();
        for d in datasets {
            let Some(table) = d.object.clone() else {
                continue;
            };
            let columns = d
                .columns_picked
                .then(|| d.columns.iter().map(|c| c.name.clone()).collect());
            let added = Added {
                found_at: found_at.clone(),
                snapshot: snapshot.to_string(),
                snapshot_done: false,
            };
            self.tables.insert(
                d.name.clone(),
                TableState {
                    table,
                    snapshot_position: None,
                    versions: Vec::new(),
                    missing: Vec::new(),
                    columns,
                    added: Some(added),
                    dropped: None,
                },
            );
        }
    }

    /// A selection of exactly the tables `names` of the state, with the columns `--columns` kept
    /// of them.
    pub(crate) fn exactly(&self, names: &[String]) -> Selection {
        let exact = |text: &str| NamePart {
            text: text.to_string(),
            quoted: true,
        };
        let mut selection = Selection::default();
        for n in names {
            let Some(t) = self.tables.get(n) else {
                continue;
            };
            let table = QualifiedName {
                schema: Some(exact(&t.table.schema)),
                name: exact(&t.table.name),
            };
            if let Some(cols) = &t.columns {
                selection.columns.push(ColumnPick {
                    table: table.clone(),
                    columns: cols.iter().map(|c| exact(c)).collect(),
                });
            }
            selection.tables.push(table);
        }
        selection
    }

    /// Records which stream position `held` stands at, before any part is read under it: the
    /// manifest names the snapshot each part came from, and this maps it to the position from
    /// which that table's changes are kept.
    /// Take a snapshot hand-off for an export: the snapshot the export joins and what keeps
    /// it valid until the export is done (both `None` when the export takes its own, whose
    /// positions its manifest records), a held snapshot's position recorded here.
    pub(crate) fn take_handoff(
        &mut self,
        handoff: Handoff,
    ) -> (Option<SnapshotInfo>, Option<Box<dyn SnapshotHold>>) {
        match handoff {
            Handoff::Held(held) => {
                self.snapshot
                    .positions
                    .push((held.snapshot.position.clone(), held.position.clone()));
                (Some(held.snapshot), Some(held.hold))
            }
            Handoff::FromExportManifest => (None, None),
        }
    }
}

/// Whether a change of a transaction at `pos` is left out for a table whose snapshot was read at
/// `snapshot_position` (a [`TableState::snapshot_position`]): the snapshot already holds it.
/// Both the change files of `sluice stream` and the apply of `sluice replicate` filter by this,
/// so the two agree on which changes a table's snapshot covers.
pub(crate) fn in_table_snapshot(snapshot_position: Option<&StreamPos>, pos: &StreamPos) -> bool {
    snapshot_position.is_some_and(|p| pos < p)
}

/// A committed point of the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Committed {
    /// The position a restarted stream resumes from (the end of the last transaction wholly
    /// written; the source may release the log before it).
    pub restart: StreamPos,
    /// The `_seq` the first change after `restart` gets.
    pub restart_seq: u64,
    /// The last `_seq` written (0 when none): changes after `restart` up to it are skipped
    /// on restart, since a batch may end inside a transaction.
    pub written_through: u64,
    /// Batches committed so far.
    pub batches: u64,
    /// Changes written so far.
    pub changes: u64,
}

/// A batch being committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// First `_seq` of the batch.
    pub first_seq: u64,
    /// Last `_seq` of the batch.
    pub last_seq: u64,
    /// Its files, relative to the output.
    pub files: Vec<String>,
    /// The committed point once the batch is durable.
    pub then: Committed,
}

/// The initial snapshot's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotState {
    /// `snapshot` or `none`.
    pub initial: String,
    /// True once every table's snapshot is written (always for `none`).
    pub done: bool,
    /// Each snapshot the export read under, with its stream position (the export's manifest
    /// names the snapshot each part came from).
    pub positions: Vec<(Position, StreamPos)>,
}

/// The whole state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Source engine.
    pub engine: sluice_core::apply::Engine,
    /// Source URL, redacted.
    pub source: String,
    /// Slot and publication.
    pub names: CaptureNames,
    /// True when sluice created the publication (`--drop` removes it then).
    pub publication_created: bool,
    /// File extension of change files (`parquet`, `csv`).
    pub extension: String,
    /// Tables by dataset name.
    pub tables: BTreeMap<String, TableState>,
    /// The initial snapshot.
    pub snapshot: SnapshotState,
    /// The last committed point.
    pub committed: Committed,
    /// The batch being committed, if a run stopped inside one.
    pub intent: Option<Intent>,
    /// When the state was written (RFC 3339).
    pub updated_at: String,
    /// The source's layout as last checked (`layout.rs`): what a partition truncated,
    /// detached or dropped is measured against. `None`: nothing to watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// The operations change files keep when `--ops` leaves some out (`insert,delete`), as of
    /// the last save; `None`: every operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<String>,
    /// Change files carry before-images (`--before-images`), as of the last save.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_images: bool,
}

/// Where the state is kept. Synchronous (the Redis store speaks over a blocking socket):
/// callers run it on a blocking thread, or from the batcher inside
/// [`tokio::task::block_in_place`].
pub trait StateStore: Send + Sync {
    /// Where, for messages (no secrets).
    fn describe(&self) -> String;
    /// The saved state, if any.
    fn load(&self) -> Result<Option<StreamState>>;
    /// Replace the saved state, atomically and durably.
    fn save(&self, state: &StreamState) -> Result<()>;
    /// Remove the saved state (`--drop`).
    fn clear(&self) -> Result<()>;
    /// Claim the state for one running stream, refusing a second (stores that are not the
    /// output, whose own lock does this).
    fn acquire(&self, holder: &str) -> Result<()> {
        let _ = holder;
        Ok(())
    }
    /// [`Self::acquire`] that says who holds the claim instead of failing when another stream
    /// does (`Ok(Some(holder))`), for a standby that waits for it (`--standby`).
    fn try_acquire(&self, holder: &str) -> Result<Option<String>> {
        self.acquire(holder).map(|()| None)
    }
    /// True when the store fences its writes: after a claim was taken over, the old holder's
    /// saves fail instead of overwriting the new holder's state (what `--standby` needs of
    /// a store).
    fn fenced(&self) -> bool {
        false
    }
    /// How long the claim lives without a refresh (`None`: the store holds no claim; the
    /// output's lock does it).
    fn claim_ttl(&self) -> Option<std::time::Duration> {
        None
    }
    /// Keep the claim alive; fails when it was lost.
    fn refresh(&self) -> Result<()> {
        Ok(())
    }
    /// Give the claim up.
    fn release(&self) {}
}

/// The state as a file of the output.
///
/// On an object store it is written with conditional writes, each naming the version this run
/// last read or wrote: a run that lost the output to another (its lock went stale while it was
/// paused, and a standby or a restart took over) finds its next save, or a load that sees
/// another run's version, refused instead of overwriting the new holder's state. A run that
/// takes the output over saves the state at once (`run.rs`), so an old holder is fenced from
/// its next save on. On local disk the output's lock is held as long as its holder's process
/// lives, so no other run writes meanwhile.
pub struct OutputState {
    dest: Arc<dyn Destination>,
    /// The state's version as this run last read or wrote it (`None`: not read yet;
    /// `Some(None)`: it did not exist).
    seen: std::sync::Mutex<Option<Option<ObjectVersion>>>,
    /// What this run last wrote: a write the store retried after it had landed reports a
    /// changed version, which is this run's own when the bytes are these.
    wrote: std::sync::Mutex<Option<Vec<u8>>>,
}

impl OutputState {
    /// The state in `dest`'s `_sluice/stream.json`.
    pub fn new(dest: Arc<dyn Destination>) -> Self {
        OutputState {
            dest,
            seen: std::sync::Mutex::default(),
            wrote: std::sync::Mutex::default(),
        }
    }

    fn lost(&self) -> Error {
        Error::config(format!(
            "the stream state {} was written by another run since this one last read it (the \
             output was taken over while this run was paused or cut off): stopping without \
             writing it",
            self.describe()
        ))
    }

    /// Note `now` (holding `bytes`) as the state's version; fails when this run saw another
    /// one before, unless the bytes are what this run last wrote (its own write, retried).
    fn seen_now(&self, now: Option<ObjectVersion>, bytes: Option<&[u8]>) -> Result<()> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(before) = &*seen
            && *before != now
            && !self.is_own(bytes)
        {
            return Err(self.lost());
        }
        *seen = Some(now);
        Ok(())
    }

    fn is_own(&self, bytes: Option<&[u8]>) -> bool {
        let wrote = self.wrote.lock().unwrap_or_else(|p| p.into_inner());
        matches!((wrote.as_deref(), bytes), (Some(w), Some(b)) if w == b)
    }
}

pub(crate) fn wait<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// Parse saved state bytes, naming `from` in errors.
pub fn parse(bytes: &[u8], from: &str) -> Result<StreamState> {
    let s: StreamState = serde_json::from_slice(bytes).map_err(|e| {
        Error::config(format!(
            "the stream state in {from} cannot be read ({e}); it was not written by this \
             version of sluice, or was edited. Move it away to start a new stream."
        ))
    })?;
    if s.version != STATE_VERSION {
        return Err(Error::config(format!(
            "the stream state in {from} has format version {}, this sluice reads {}",
            s.version, STATE_VERSION
        )));
    }
    Ok(s)
}

impl StateStore for OutputState {
    fn describe(&self) -> String {
        format!("{}/{STATE_PATH}", self.dest.display())
    }

    fn load(&self) -> Result<Option<StreamState>> {
        let bytes = match self.dest.versioned() {
            Some(v) => {
                let got = wait(v.get_versioned(STATE_PATH))?;
                let (bytes, version) = got.map_or((None, None), |(b, v)| (Some(b), Some(v)));
                self.seen_now(version, bytes.as_deref())?;
                bytes
            }
            None => wait(self.dest.get(STATE_PATH))?,
        };
        bytes.map(|b| parse(&b, &self.describe())).transpose()
    }

    fn save(&self, state: &StreamState) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(state)
            .map_err(|e| Error::internal(format!("cannot encode the stream state: {e}")))?;
        let Some(v) = self.dest.versioned() else {
            return wait(self.dest.put(STATE_PATH, bytes))
                .map_err(|e| e.context("saving the stream state"));
        };
        let expected = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .flatten();
        *self.wrote.lock().unwrap_or_else(|p| p.into_inner()) = Some(bytes.clone());
        let written = wait(v.put_if(STATE_PATH, bytes, expected.as_ref()))
            .map_err(|e| e.context("saving the stream state"))?;
        let now = match written {
            Some(now) => now,
            // Changed under us — or our own write, landed before the store retried it.
            None => match wait(v.get_versioned(STATE_PATH))? {
                Some((b, now)) if self.is_own(Some(&b)) => now,
                _ => return Err(self.lost()),
            },
        };
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(Some(now));
        Ok(())
    }

    fn clear(&self) -> Result<()> {
        wait(self.dest.delete(STATE_PATH))?;
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(None);
        Ok(())
    }

    fn fenced(&self) -> bool {
        self.dest.lock_lives_with_process() || self.dest.versioned().is_some()
    }
}
