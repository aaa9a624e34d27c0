//! One `sluice stream` run, in order.
//!
//! ```text
//! discover ─▶ first start: check ─▶ publication + slot (snapshot exported) ─▶ state saved
//!              ─▶ export under the slot's snapshot ─▶ per-table snapshot positions saved
//!           interrupted snapshot: unfinished tables cleared ─▶ export resumed under a new
//!              exact snapshot (temporary slot) ─▶ per-table positions from the manifest
//!   ─▶ stream from the committed position: batches ─▶ files ─▶ state ─▶ confirm
//!   ─▶ stop at --until-current's position or on SIGINT/SIGTERM, after committing the batch
//! ```
//!
//! The initial snapshot is in `snapshot.rs` (with why the hand-off is exact), streaming in
//! `pump.rs`.

use crate::claim::{Keeper, unless_lost};
use crate::job::{Initial, StreamJob, StreamReport, blocking, discover};
use crate::metrics::{Metrics, serve};
use crate::pump::stream;
use crate::snapshot::{resume_snapshot, snapshot_phase};
use crate::state::StreamState;
use sluice_core::change::{CaptureNames, Handoff};
use sluice_core::{Dataset, Error, Result, failpoint};
use sluice_engine::Report;
use sluice_sink::OutputLock;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

fn names_of(job: &StreamJob, saved: Option<&StreamState>) -> Result<CaptureNames> {
    if let Some(s) = saved {
        for (flag, given, have) in [
            ("--slot", &job.slot, &s.names.name),
            ("--publication", &job.publication, &s.names.publication),
        ] {
            if let Some(g) = given
                && g != have
            {
                return Err(Error::config(format!(
                    "{flag} {g} differs from the {have} this stream was started with (state in \
                     {}). Drop the flag to continue the stream, or stream into another output.",
                    job.state.describe()
                )));
            }
        }
        return Ok(s.names.clone());
    }
    let name = job
        .slot
        .clone()
        .unwrap_or_else(|| format!("sluice_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff));
    let publication = job.publication.clone().unwrap_or_else(|| name.clone());
    Ok(CaptureNames { name, publication })
}

/// Run the stream until `--until-current`'s point or `cancel`.
pub async fn run_stream(job: StreamJob, cancel: watch::Receiver<bool>) -> Result<StreamReport> {
    let started = Instant::now();
    let metrics = job.metrics.clone();
    if let Some(addr) = job.metrics_addr {
        let bound = serve(addr, metrics.clone() as Arc<dyn crate::metrics::Render>).await?;
        tracing::info!("metrics at http://{bound}/metrics");
    }
    job.destination.check_writable().await?;
    let holder = sluice_sink::LockHolder::now(&format!("stream-{}", std::process::id()));
    if job.standby {
        crate::standby::claim(&job, &holder.describe(), &cancel).await?;
    } else {
        let store = job.state.clone();
        let who = holder.describe();
        blocking(move || store.acquire(&who)).await?;
    }
    // The claim is kept alive from now on, a standby's while it waits for the output's lock
    // too (an object store's is free two minutes after its holder died, past the claim's life).
    let (keeper, cancel) = Keeper::start(job.state.clone(), cancel);
    // The output's lock before anything of it is inspected or removed (an interrupted
    // snapshot's unfinished parts), kept across the snapshot (the export uses it) and the
    // streaming: a second run on this output is refused before it can touch the first's files.
    let lock = match crate::standby::output_lock(&job, &holder, &cancel).await {
        Ok(l) => l,
        Err(e) => {
            let e = unless_lost(Err(e), keeper.stop().await);
            release(&job).await;
            return e;
        }
    };
    let result = claimed(&job, &lock, metrics, cancel, started).await;
    let result = unless_lost(result, keeper.stop().await);
    lock.release().await;
    release(&job).await;
    result
}

/// Give the state store's claim up.
async fn release(job: &StreamJob) {
    let store = job.state.clone();
    let _ = blocking(move || {
        store.release();
        Ok(())
    })
    .await;
}

async fn claimed(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    metrics: Arc<Metrics>,
    cancel: watch::Receiver<bool>,
    started: Instant,
) -> Result<StreamReport> {
    let datasets = discover(job.capture.source.as_ref(), &job.capture.selection).await?;
    let unlogged = crate::job::check_tables(job, &datasets).await?;
    let store = job.state.clone();
    let saved = blocking(move || store.load()).await?;
    let names = names_of(job, saved.as_ref())?;
    let mut snapshot_report = None;
    let mut state = match saved {
        None => {
            let (state, report) = first_start(job, lock, &names, &datasets, &cancel).await?;
            snapshot_report = report;
            state
        }
        Some(mut s) => {
            same_tables(job, &s, &datasets)?;
            not_narrowed(job, &s, &datasets).await?;
            if let Some(objects) = job.capture.source.server_objects()
                && !objects.exists(&names).await?
            {
                return Err(Error::source_permanent(format!(
                    "the stream state in {} names {}, which no longer exists on {}: the changes \
                     since the saved position are lost. Start over with a new output (and \
                     sluice stream --drop to remove the old state).",
                    job.state.describe(),
                    objects.describe(&names),
                    job.capture.source.display_url()
                )));
            }
            // Saved at once: a run that took the output over from one that was only paused
            // fences it from here on (its next save names a version this one replaced).
            crate::job::save(job, &s).await?;
            if !s.snapshot.done {
                snapshot_report = Some(resume_snapshot(job, lock, &mut s, &cancel).await?);
            }
            s
        }
    };
    state.source = job.capture.source.display_url();
    // Tables the selection matches that the stream does not capture yet join it once it
    // streams (`added.rs`); dropped ones are ended there too.
    let mut datasets = datasets;
    datasets.retain(|d| {
        state
            .tables
            .get(&d.name)
            .is_some_and(|t| t.dropped.is_none())
    });
    crate::layout::check(
        job.capture.source.as_ref(),
        &datasets,
        &mut state,
        job.capture.partition_changes,
        "sluice stream",
    )
    .await?;
    crate::job::note_missing(job, &unlogged, &mut state);
    let whole = crate::job::whole(job, datasets).await?;
    let result = stream(
        job,
        lock,
        state,
        whole,
        metrics,
        cancel,
        started,
        snapshot_report,
    )
    .await;
    // An object store's lock may have been taken over while the run was away (its refresh
    // stopped): say so rather than report a stream that could not keep its output.
    result.and_then(|r| lock.check().map(|()| r))
}

fn same_tables(job: &StreamJob, s: &StreamState, datasets: &[Dataset]) -> Result<()> {
    if s.extension != job.format.extension() {
        return Err(Error::config(format!(
            "the stream in {} writes {} change files; --format {} would mix formats. Use the \
             stream's format, or stream into another output.",
            job.destination.display(),
            s.extension,
            job.format.extension()
        )));
    }
    if s.before_images != job.files.before_images {
        let (with, without) = if s.before_images {
            ("with", "without")
        } else {
            ("without", "with")
        };
        return Err(Error::config(format!(
            "the stream in {} writes its change files {with} before-images (_before); \
             running it {without} --before-images would mix the two shapes under one schema \
             version. Run it as it was started, or stream into another output.",
            job.destination.display()
        )));
    }
    // What --columns keeps may not change either: a column left out would reappear (or one
    // kept would vanish) in the middle of the change files' history.
    for ds in datasets {
        let picked = ds.columns_picked.then(|| {
            ds.columns
                .iter()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>()
        });
        if let Some(t) = s.tables.get(&ds.name)
            && t.columns != picked
        {
            let shown = |c: &Option<Vec<String>>| match c {
                Some(c) => format!("--columns '{}:{}'", ds.name, c.join(",")),
                None => "all its columns (no --columns)".to_string(),
            };
            return Err(Error::config(format!(
                "the stream in {} writes {} of {}; this run asks for {}. Run it with the \
                 columns it was started with, or stream into another output.",
                job.destination.display(),
                shown(&t.columns),
                ds.name,
                shown(&picked)
            )));
        }
    }
    let new: Vec<&str> = datasets
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| !s.tables.contains_key(*n))
        .collect();
    if !new.is_empty() && !s.snapshot.done {
        return Err(Error::config(format!(
            "the selection now also matches {}, but the initial snapshot of the stream in {} is \
             unfinished: finish it with the selection it was started with; tables created \
             since then join the stream once it streams.",
            new.join(", "),
            job.destination.display()
        )));
    }
    if !new.is_empty() && job.discover_every.is_none() {
        return Err(Error::config(format!(
            "the selection now also matches {}, which the stream in {} was not started with, \
             and --discover-every 0 keeps the stream's tables as they were at its start. Run \
             it without --discover-every 0 (new tables join with a snapshot of their own), \
             narrow the selection, or start another stream (another --to) for the new tables.",
            new.join(", "),
            job.destination.display()
        )));
    }
    Ok(())
}

/// Refuse a selection that leaves out tables the stream captures and the source still has: a
/// table leaves a stream when it is dropped (its marker then ends its files), not when the
/// selection changes — its files would stop without a word.
async fn not_narrowed(job: &StreamJob, s: &StreamState, datasets: &[Dataset]) -> Result<()> {
    // A table still joining (its snapshot not done) is given up when no longer selected.
    let missing: Vec<&crate::state::TableState> = s
        .tables
        .iter()
        .filter(|(n, t)| t.dropped.is_none() && !datasets.iter().any(|d| &d.name == *n))
        .filter(|(_, t)| t.added.as_ref().is_none_or(|a| a.snapshot_done))
        .map(|(_, t)| t)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let asked: Vec<sluice_core::table::TableRef> =
        missing.iter().map(|t| t.table.clone()).collect();
    let now =
        crate::job::tables_now(job.capture.source.as_ref(), &job.capture.selection, &asked).await?;
    let left_out: Vec<String> = missing
        .iter()
        .filter(|t| now.existing.contains(&t.table))
        .map(|t| t.table.to_string())
        .collect();
    if left_out.is_empty() {
        return Ok(());
    }
    Err(Error::config(format!(
        "the stream in {} captures {}, which this run's selection leaves out although the \
         source still has {}. Run it with the selection it was started with (a table leaves \
         a stream when it is dropped), or start another stream (another --to) for the \
         narrower selection.",
        job.destination.display(),
        left_out.join(", "),
        if left_out.len() == 1 { "it" } else { "them" }
    )))
}

async fn first_start(
    job: &StreamJob,
    lock: &Arc<dyn OutputLock>,
    names: &CaptureNames,
    datasets: &[Dataset],
    cancel: &watch::Receiver<bool>,
) -> Result<(StreamState, Option<Report>)> {
    // An output another run completed is not a stream's to take: refused before the capture's
    // server objects exist (the export would refuse it only after).
    if let sluice_engine::output::Prior::Complete(_) =
        sluice_engine::output::inspect(job.destination.as_ref()).await?
    {
        return Err(Error::config(format!(
            "{} already holds a complete export (manifest.json) and no stream state: a stream \
             starts into an output of its own. Choose another --to, or remove what is there \
             (sluice stream --drop removes a stream's state and server objects, not its files).",
            job.destination.display()
        )));
    }
    let snapshot = job.initial == Initial::Snapshot;
    let occupied = |what| {
        Error::config(format!(
            "{what} already exists on {} but {} holds no stream state for it. Pass another \
             --slot, or remove it (sluice stream --drop with the arguments that created it) — \
             a slot nobody reads keeps WAL on the server.",
            job.capture.source.display_url(),
            job.state.describe()
        ))
    };
    let ext = job.format.extension();
    if job.initial == Initial::Converged {
        // Refused before the capture exists, as an export refuses before it writes.
        crate::snapshot::check_converged(job, names, datasets).await?;
    }
    let (created, mut state) =
        crate::start::create(&job.capture, names, datasets, snapshot, ext, occupied).await?;
    if job.initial == Initial::Converged {
        crate::snapshot::converged_state(&mut state);
    }
    state.before_images = job.files.before_images;
    for ds in datasets {
        if let Some(t) = state.tables.get_mut(&ds.name) {
            t.columns = ds
                .columns_picked
                .then(|| ds.columns.iter().map(|c| c.name.clone()).collect());
        }
    }
    let saved = {
        let store = job.state.clone();
        let s = state.clone();
        blocking(move || {
            failpoint::hit_as("stream.first_state", sluice_core::ErrorKind::Destination)?;
            store.save(&s)
        })
        .await
    };
    if let Err(e) = saved {
        crate::start::abandon(job.capture.source.as_ref(), names, created).await;
        return Err(e);
    }
    if let Some(objects) = job.capture.source.server_objects() {
        tracing::info!(
            "created {} and {} publication {} on {}; the slot keeps WAL until the stream \
             confirms it (sluice stream --drop removes both)",
            objects.describe(names),
            if created.publication_created {
                "the"
            } else {
                "uses the existing"
            },
            names.publication,
            job.capture.source.display_url()
        );
    } else {
        tracing::info!(
            "stream {} starts at position {} on {}",
            names.name,
            created.position,
            job.capture.source.display_url()
        );
    }
    let handoff = match (created.handoff, job.initial) {
        (Some(h), _) => Some(h),
        // The export reads chunk by chunk and converges on the slot's own log.
        (None, Initial::Converged) => Some(Handoff::FromExportManifest),
        (None, _) => None,
    };
    let report = match handoff {
        Some(h) => Some(snapshot_phase(job, lock, &mut state, h, false, cancel).await?),
        None => None,
    };
    Ok((state, report))
}

/// `sluice stream --drop`: remove the slot, the publication sluice created, and the state.
pub async fn drop_stream(job: &StreamJob) -> Result<Vec<String>> {
    let store = job.state.clone();
    let saved = blocking(move || store.load()).await?;
    let names = names_of(job, saved.as_ref())?;
    if saved.is_none() && job.slot.is_none() {
        return Err(Error::config(format!(
            "{} holds no stream state, so there is no slot to drop: pass --slot (and \
             --publication) to name them.",
            job.state.describe()
        )));
    }
    let publication = saved
        .as_ref()
        .map(|s| s.publication_created)
        .unwrap_or(job.publication.is_some());
    let mut removed = match job.capture.source.server_objects() {
        Some(objects) => objects.remove(&names, publication).await?,
        None => Vec::new(),
    };
    if saved.is_some() {
        let store = job.state.clone();
        blocking(move || store.clear()).await?;
        removed.push(format!("stream state {}", job.state.describe()));
    }
    Ok(removed)
}
