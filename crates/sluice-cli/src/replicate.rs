//! `sluice replicate`: the initial load and the change stream applied to a target database.
//!
//! Its settings (defined in `args.rs`) are the export's [`Options`] (what to replicate, the
//! source connection, the initial load's workers, chunks and memory; `--parallel` also sets
//! the apply sessions) and its own [`ReplicateOptions`] (`target`, `target_schema`, `initial`,
//! `slot`, `publication`, `server_id`, `until_current`, `max_grouped`, …), each a flag and a
//! YAML key of the same `-c` file. Settings about files (`--to`, `--format`, …) are refused by
//! name.

use sluice_cli::args::{ConsistencyArg, ReplicateOptions};
use sluice_cli::args::{LogFormat, Options, ReplicateArgs};
use sluice_cli::settings::Given;
use sluice_cli::{config, registry};
use sluice_core::{Error, Result};
use sluice_stream::Stopped;
use sluice_stream::apply::{ReplicateJob, ReplicateReport, TargetLag};
use std::sync::Arc;

/// The apply sessions without `--parallel`.
const DEFAULT_SESSIONS: usize = 4;

/// The most apply sessions `--parallel` may ask for. Each is a connection to the target
/// (PostgreSQL allows 100 by default, MySQL 151), and commits are made one after another in
/// source order, so sessions past this add connections and lock waits on the target, not
/// speed.
const MAX_SESSIONS: usize = 64;

/// The settings of a `sluice replicate` run: the `-c` file's, with the flags `given` laid over
/// them.
pub fn merged(args: &ReplicateArgs, given: &Given) -> Result<(Options, ReplicateOptions)> {
    config::merge_with(&args.options, &args.replicate, given)
}

/// `--parallel`: the apply sessions, refused past [`MAX_SESSIONS`] (0 is refused with the
/// export's settings).
fn sessions(parallel: Option<usize>) -> Result<usize> {
    match parallel {
        Some(n) if n > MAX_SESSIONS => Err(Error::config(format!(
            "--parallel {n} asks sluice replicate for more apply sessions than its limit of \
             {MAX_SESSIONS}: give {MAX_SESSIONS} or fewer. Each session is a connection to the \
             target (PostgreSQL allows 100 by default), and commits are made one after another \
             in source order, so sessions past {MAX_SESSIONS} add connections and lock waits on \
             the target, not speed."
        ))),
        Some(n) => Ok(n),
        None => Ok(DEFAULT_SESSIONS),
    }
}

fn job(o: &Options, r: &ReplicateOptions) -> Result<ReplicateJob> {
    if !o.query.is_empty() {
        return Err(Error::config(
            "sluice replicate copies tables: --query has no change log. Name tables with \
             --table, --tables or --schema.",
        ));
    }
    if !o.columns.is_empty() {
        return Err(Error::config(
            "sluice replicate copies whole tables and keeps their columns equal to the \
             source's: --columns is not supported here. Leave it out (sluice export and sluice \
             stream take it).",
        ));
    }
    if let Some(c @ (ConsistencyArg::Chunk | ConsistencyArg::Converged)) = o.consistency {
        return Err(Error::config(format!(
            "sluice replicate loads the target under one snapshot whose position starts the \
             change stream: --consistency {} would break the hand-off. Remove it.",
            sluice_cli::config::consistency(Some(c))
        )));
    }
    let target_url = r.target.as_deref().ok_or_else(|| {
        Error::config(
            "sluice replicate needs --target URL: the database to copy into (postgres://… or \
             mysql://…).",
        )
    })?;
    let parallel = sessions(o.parallel)?;
    let target = registry::open_apply_target(target_url)?;
    let mut load = o.clone();
    load.report_json = None;
    let template = config::memory_job(&load, sluice_stream::apply::template_output())?;
    let capture = crate::stream::capture(
        o,
        template.selection.clone(),
        r.server_id,
        r.bad_values,
        r.until_current,
        r.partition_changes,
    )?;
    let memory = template.memory;
    let export = sluice_stream::export_builder(template);
    Ok(ReplicateJob {
        capture,
        target,
        initial: crate::stream::initial(r.initial),
        name: r.slot.clone(),
        target_schema: r.target_schema.clone(),
        publication: r.publication.clone(),
        parallel,
        max_grouped: r.max_grouped.unwrap_or(sluice_stream::apply::MAX_GROUPED),
        memory,
        export,
        progress: Arc::new(sluice_engine::Silent),
        counters: Arc::default(),
        metrics_addr: crate::stream::metrics_addr(r.metrics_addr.as_deref())?,
        standby: r.standby,
        target_lag: target_lag(r, target_url)?,
    })
}

/// `--max-target-lag` with the target (and `--target-replica`s) to read it on; a replica
/// named without a limit is refused rather than read for nothing.
fn target_lag(r: &ReplicateOptions, target_url: &str) -> Result<Option<TargetLag>> {
    let Some(limit) = &r.max_target_lag else {
        if !r.target_replica.is_empty() {
            return Err(Error::config(
                "--target-replica names a replica whose lag --max-target-lag bounds, and no \
                 --max-target-lag was given: add it (e.g. --max-target-lag 10s) or drop \
                 --target-replica.",
            ));
        }
        return Ok(None);
    };
    Ok(Some(TargetLag {
        limit: sluice_engine::governor::parse_duration(limit, "--max-target-lag")?,
        target: registry::open_source(target_url, None)?,
        replicas: r.target_replica.clone(),
    }))
}

/// Run `sluice replicate` (or `--drop`).
pub async fn run(
    args: ReplicateArgs,
    given: &Given,
    quiet: bool,
    format: LogFormat,
) -> anyhow::Result<()> {
    let (options, own) = merged(&args, given)?;
    let mut job = job(&options, &own)?;
    if args.drop {
        let removed = sluice_stream::apply::drop_replication(job).await?;
        crate::print_dropped(&removed, quiet);
        return Ok(());
    }
    job.progress = Arc::new(crate::display::Display::new(
        quiet,
        format == LogFormat::Text,
    ));
    let spinner = progress(job.counters.clone());
    let report = crate::supervised(quiet, format, spinner, |cancel_rx| {
        sluice_stream::apply::run_replicate(job, cancel_rx)
    })
    .await?;
    let json = options.report_json.as_deref();
    crate::emit_report(
        &report,
        report_text,
        json,
        quiet,
        format,
        "sluice replicate",
    )
}

/// A spinner line on a terminal while changes are applied.
async fn progress(c: Arc<sluice_stream::apply::ApplyCounters>) {
    use std::sync::atomic::Ordering::Relaxed;
    let bar = indicatif::ProgressBar::new_spinner();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let applied = c.transactions.load(Relaxed);
        if applied == 0 {
            continue;
        }
        let ts = c.last_commit_ts.load(Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let lag = now.saturating_sub(ts) as f64 / 1e6;
        bar.set_message(format!(
            "applied {applied} transactions ({} changes), lag {lag:.1} s / {} transactions, \
             {} conflicts retried",
            c.changes.load(Relaxed),
            c.received.load(Relaxed).saturating_sub(applied),
            c.conflicts.load(Relaxed),
        ));
        bar.tick();
    }
}

fn report_text(r: &ReplicateReport) -> String {
    let mut s = format!("replicate {} → {} ({})\n", r.source, r.target, r.name);
    match &r.target_schema {
        Some(schema) => s.push_str(&format!("  tables on the target in {schema}\n")),
        None => s.push_str("  tables on the target in their source schemas\n"),
    }
    if let Some(snap) = &r.snapshot {
        s.push_str(&format!(
            "  initial load: {} rows at {}\n",
            snap.rows, snap.position
        ));
    }
    for n in &r.not_carried {
        s.push_str(&format!("  not carried: {n}\n"));
    }
    for n in &r.foreign_keys {
        s.push_str(&format!("  {n}\n"));
    }
    for a in &r.added {
        s.push_str(&format!("  joined: {}\n", a.describe()));
    }
    s.push_str(&format!(
        "  applied: {} transactions ({} changes) in {} target transactions on {} sessions, \
         {:.0} transactions/s; {} started before the units they depend on committed; {} \
         conflicts retried in order, {} rolled back for an earlier one\n",
        r.transactions,
        r.changes,
        r.units,
        r.parallel,
        r.transactions_per_second,
        r.split_units,
        r.conflicts,
        r.aborts
    ));
    if let Some(b) = &r.target_lag {
        let read: Vec<&str> = b.signals.iter().map(|s| s.name.as_str()).collect();
        s.push_str(&format!(
            "  target lag: apply held {} time(s), {:.1} s in all (read: {})\n",
            b.pauses.len(),
            b.paused_seconds,
            read.join(", ")
        ));
    }
    for t in &r.gone {
        s.push_str(&format!(
            "  WARNING: {t} is no longer on the source (dropped or renamed) or no longer \
             selected: its rows stay on the target as they were\n"
        ));
    }
    if r.unmatched > 0 {
        s.push_str(&format!(
            "  WARNING: {} update(s) or delete(s) matched no row on the target: it does not \
             hold rows the source changed, so it differs from the source\n",
            r.unmatched
        ));
    }
    s.push_str(&format!(
        "  position: {}; peak lag {:.1} s, {} transactions behind at the end; log retained on the \
         source at most {:.1} MB; {:.1} s, peak RSS {} MB; stopped: {}\n",
        r.position,
        r.peak_lag_seconds,
        r.lag_transactions,
        r.peak_retained_bytes as f64 / (1u64 << 20) as f64,
        r.wall_seconds,
        r.peak_rss_bytes >> 20,
        match r.stopped {
            Stopped::UntilCurrent => "caught up (--until-current)",
            Stopped::Signal => "signal",
            Stopped::Tables => "tables changed",
        }
    ));
    s.push_str(&crate::display::capture_warnings(
        r.nulled_values,
        "applied",
        r.ignored_changes,
    ));
    s.push_str(&format!("  {}\n", r.while_stopped));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replication `argv` asks for (its target is not contacted).
    fn job_of(argv: &[&str]) -> Result<ReplicateJob> {
        let (cli, given) = sluice_cli::args::Cli::try_parse_given_from(argv).unwrap();
        let Some(sluice_cli::args::Command::Replicate(args)) = cli.command else {
            unreachable!("a replicate command line")
        };
        let (o, r) = merged(&args, &given)?;
        job(&o, &r)
    }

    #[test]
    fn parallel_past_the_most_sessions_is_refused_not_capped() {
        let replicate = [
            "sluice",
            "replicate",
            "--source",
            "postgres://u@h/d",
            "--target",
            "postgres://u@t/d",
            "--table",
            "a",
            "--parallel",
        ];
        let e = job_of(&[&replicate[..], &["65"]].concat()).err().unwrap();
        assert_eq!(e.kind(), sluice_core::ErrorKind::Config);
        assert!(
            e.message().contains("--parallel 65") && e.message().contains("limit of 64"),
            "{e}"
        );
        assert_eq!(
            job_of(&[&replicate[..], &["64"]].concat())
                .unwrap()
                .parallel,
            64
        );
        assert_eq!(job_of(&replicate[..8]).unwrap().parallel, DEFAULT_SESSIONS);
        let e = job_of(&[&replicate[..], &["0"]].concat()).err().unwrap();
        assert!(e.message().contains("at least 1"), "{e}");
    }
}
