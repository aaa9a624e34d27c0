//! Reads a distributed engine carries out (Spark, through the Python package): the plan is
//! made in one process, its chunks are read in others, possibly on other machines, and every
//! reader may share one snapshot that a third process holds.
//!
//! ```text
//! holder:   hold(job) ─▶ snapshot pinned, tables locked as an export locks them ─▶ … ─▶ release()
//! planner:  plan_read(job) ─▶ datasets + chunks (no rows read)
//! task k:   ExportJob { chunks: Some([chunk k]), session_tag: holder's, source: importing(snapshot) }
//!           ─▶ run_export as usual (a memory destination in the Python package)
//! ```
//! The pieces are the export's own — discovery, the chunk planner, the snapshot, the readers —
//! so a chunk read by a task is the part `sluice export` would have written for it. What this
//! module adds is the seams: a plan returned instead of read, a snapshot held on its own with
//! its harm sampled, and (in `ExportJob`) chunks given rather than planned.
//!
//! Limits: a shared snapshot can only be joined while its holder keeps it, so a task that
//! starts after [`Held::release`] fails (PostgreSQL: "invalid snapshot identifier"); engines
//! that cannot import a snapshot by name refuse to hold one (`Source::importing`).

pub mod export;

use crate::harm::HarmMonitor;
use crate::job::ExportJob;
use crate::manifest::HarmRecord;
use crate::plan;
use crate::planning::{plan_all, plan_inputs, refuse_duplicates};
use serde::{Deserialize, Serialize};
use sluice_core::{
    Chunk, Consistency, Coordinator, Dataset, Error, Result, SnapshotInfo, SourceOptions,
};
use std::time::{Duration, Instant};

/// How often a held snapshot's harm is sampled: it may be held for a long Spark job, and the
/// figures are peaks, so a sample a second is enough.
const SAMPLING: Duration = Duration::from_secs(1);

/// The datasets a read selects and the chunks they split into.
pub struct ReadPlan {
    /// The datasets, described (columns, Arrow schema, estimates).
    pub datasets: Vec<Dataset>,
    /// Their chunks, as an export of the same job would plan them.
    pub chunks: Vec<Chunk>,
    /// The workers and chunk size the plan was sized for, and why.
    pub sizing: plan::Sizing,
    /// The server's product and version.
    pub server_version: String,
}

/// Plan `job` without reading a row or taking a snapshot: what each task of a distributed
/// read is given, and what `sluice plan` shows. The chunks are planned for `job.consistency` (physical page ranges only
/// under a snapshot, where rows cannot move between chunks).
pub async fn plan_read(job: &ExportJob) -> Result<ReadPlan> {
    let options = SourceOptions {
        session_tag: "sluice-plan".into(),
        consistency: Consistency::Chunk,
        enable_row_security: job.enable_row_security,
    };
    let mut coordinator = job.source.open_coordinator(&options).await?;
    let result = async {
        let datasets = coordinator.discover(&job.selection).await?;
        let inputs = plan_inputs(job).with_columns_of(&datasets);
        let sizing = plan::size(&datasets, &inputs);
        let chunks = plan_all(coordinator.as_mut(), &datasets, job, sizing.chunk_bytes).await?;
        Ok(ReadPlan {
            datasets,
            chunks,
            sizing,
            server_version: coordinator.server_version(),
        })
    }
    .await;
    let _ = coordinator.release().await;
    result
}

/// What a held snapshot is, for the tasks that import it: enough to join it and to tell which
/// point in time a read shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SharedSnapshot {
    /// The source engine (`postgres`).
    pub engine: String,
    /// The snapshot: its name, position and time.
    pub snapshot: SnapshotInfo,
    /// Its position as people read it (`LSN 0/3B375D0 (insert position)`).
    pub position_text: String,
    /// The tag the tasks' sessions take, so the holder's harm monitor sees them.
    pub session_tag: String,
    /// The datasets the holder protects (locked as an export locks them, so no TRUNCATE or
    /// ALTER can make the snapshot show them wrongly); a read of another is refused.
    pub datasets: Vec<String>,
}

/// A snapshot held for readers in other processes, until [`Held::release`].
pub struct Held {
    coordinator: Box<dyn Coordinator>,
    monitor: HarmMonitor,
    since: Instant,
    shared: SharedSnapshot,
}

/// What holding the snapshot cost the source.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HoldReport {
    /// The snapshot that was shared.
    pub snapshot: SnapshotInfo,
    /// How long it was held, seconds.
    pub snapshot_held_seconds: f64,
    /// Peaks sampled on the source while it was held, over the holder's session and every
    /// task session that carried its tag.
    pub harm: HarmRecord,
    /// Why the harm figures are incomplete, when they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harm_incomplete: Option<String>,
}

/// The refusal of an engine whose snapshot other processes cannot join (`Source::importing`
/// asked with a placeholder), before any session opens.
pub(crate) fn refuse_unshareable(job: &ExportJob) -> Result<()> {
    let placeholder = SnapshotInfo {
        id: Some(String::new()),
        position: sluice_core::Position::Unknown,
        taken_at: String::new(),
    };
    job.source.importing(&placeholder).map(|_| ())
}

/// Take a snapshot of `job`'s selection and hold it: its datasets are discovered and locked
/// as an export's are, and a harm monitor samples the source until [`Held::release`].
/// Refused before any session opens on an engine that cannot share a snapshot by name.
pub async fn hold(job: &ExportJob) -> Result<Held> {
    refuse_unshareable(job)?;
    let session_tag = format!(
        "sluice-hold-{:012x}",
        rand::random::<u64>() & 0xffff_ffff_ffff
    );
    let options = SourceOptions {
        session_tag: session_tag.clone(),
        consistency: Consistency::Snapshot,
        enable_row_security: job.enable_row_security,
    };
    let mut coordinator = job.source.open_coordinator(&options).await?;
    let pinned = async {
        let datasets = coordinator.discover(&job.selection).await?;
        refuse_duplicates(&datasets)?;
        let snapshot = coordinator.pin_snapshot(&datasets).await?;
        if snapshot.id.is_none() {
            return Err(Error::internal("the held snapshot has no name to share"));
        }
        Ok((datasets, snapshot))
    }
    .await;
    let (datasets, snapshot) = match pinned {
        Ok(p) => p,
        Err(e) => {
            let _ = coordinator.release().await;
            return Err(e);
        }
    };
    let since = Instant::now();
    let monitor = match job.source.open_harm_probe(&options).await {
        Ok(p) => HarmMonitor::start(Some(p), SAMPLING, None),
        Err(e) => HarmMonitor::start(None, SAMPLING, Some(e.to_string())),
    };
    Ok(Held {
        coordinator,
        monitor,
        since,
        shared: SharedSnapshot {
            engine: job.source.engine().to_string(),
            position_text: snapshot.position.to_string(),
            snapshot,
            session_tag,
            datasets: datasets.into_iter().map(|d| d.name).collect(),
        },
    })
}

impl Held {
    /// What the tasks need to read under this snapshot.
    pub fn shared(&self) -> &SharedSnapshot {
        &self.shared
    }

    /// End the snapshot (tasks can no longer join it; those reading keep their own copy until
    /// they finish) and say what holding it cost.
    pub async fn release(mut self) -> Result<HoldReport> {
        let held = self.since.elapsed().as_secs_f64();
        let (harm, failed) = self.monitor.finish().await;
        self.coordinator.release().await?;
        Ok(HoldReport {
            snapshot: self.shared.snapshot,
            snapshot_held_seconds: held,
            harm: HarmRecord {
                snapshot_held_seconds: held,
                ..harm
            },
            harm_incomplete: failed,
        })
    }
}

/// `job` made into the task that reads `chunks` of a plan, under `shared` when given (the
/// holder's snapshot, imported; the holder's session tag) or else each chunk in its own
/// transaction.
pub fn task(
    mut job: ExportJob,
    chunks: Vec<Chunk>,
    shared: Option<&SharedSnapshot>,
) -> Result<ExportJob> {
    match shared {
        Some(s) => {
            if s.engine != job.source.engine() {
                return Err(Error::config(format!(
                    "the shared snapshot was taken on {}, but this read's source is {}: read \
                     from the source the snapshot was taken on.",
                    s.engine,
                    job.source.engine()
                )));
            }
            for c in &chunks {
                if !s.datasets.contains(&c.dataset) {
                    return Err(unprotected(&c.dataset, s));
                }
            }
            job.source = job.source.importing(&s.snapshot)?;
            job.consistency = Consistency::Snapshot;
            job.session_tag = Some(s.session_tag.clone());
            job.harm_sampled_elsewhere = true;
        }
        None => job.consistency = Consistency::Chunk,
    }
    job.chunks = Some(chunks);
    Ok(job)
}

/// The refusal of a read of `dataset` under a snapshot whose holder does not protect it.
pub fn unprotected(dataset: &str, s: &SharedSnapshot) -> Error {
    Error::config(format!(
        "{dataset} is read under a shared snapshot that does not hold it (it holds {}): the \
         holder locks the tables it holds so that no TRUNCATE or ALTER TABLE makes the snapshot \
         show them wrongly. Take the snapshot with the same tables= or schema= as the read.",
        if s.datasets.is_empty() {
            "no table".to_string()
        } else {
            s.datasets.join(", ")
        }
    ))
}
