//! `sluice stream`: change data capture into change files.
//!
//! Its settings (defined in `args.rs`) are the export's [`Options`] (one definition: flag,
//! YAML key and job; they apply to the initial snapshot and to the change files' format and
//! destination) and the stream's own [`StreamOptions`], each a flag and a YAML key of the same
//! name with `_` for `-` (`initial`, `slot`, `publication`, `batch_bytes`, `batch_seconds`,
//! `until_current`, `state`, `metrics_addr`, …), read from the same `-c` file.

use sluice_cli::args::{ConsistencyArg, InitialArg, LogFormat, Options, StreamArgs, StreamOptions};
use sluice_cli::settings::Given;
use sluice_cli::{config, registry};
use sluice_core::{Error, Result};
use sluice_stream::{Capture, Initial, OutputState, StreamJob, StreamReport};
use std::sync::Arc;

/// The settings of a `sluice stream` run: the `-c` file's, with the flags `given` laid over
/// them.
pub fn merged(args: &StreamArgs, given: &Given) -> Result<(Options, StreamOptions)> {
    config::merge_with(&args.options, &args.stream, given)
}

/// The default `--batch-bytes`.
const DEFAULT_BATCH_BYTES: u64 = 64 << 20;
/// The default `--batch-seconds`.
const DEFAULT_BATCH_SECONDS: f64 = 60.0;
/// `--vacuum-retention`'s default: Delta's own (`delta.deletedFileRetentionDuration`).
const DEFAULT_VACUUM_RETENTION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// How often a stream looks its selection up again for tables created or dropped (seconds).
const DEFAULT_DISCOVER_EVERY: f64 = 30.0;

fn job(o: &Options, s: &StreamOptions) -> Result<StreamJob> {
    if !o.query.is_empty() {
        return Err(Error::config(
            "sluice stream captures tables: --query has no change log. Name tables with \
             --table, --tables or --schema.",
        ));
    }
    if o.consistency == Some(ConsistencyArg::Chunk) {
        return Err(Error::config(
            "sluice stream reads its initial snapshot under the replication slot's snapshot: \
             --consistency chunk would break the hand-off (--consistency converged keeps it \
             with short transactions). Remove it.",
        ));
    }
    let converged = o.consistency == Some(ConsistencyArg::Converged);
    if converged {
        let what = match (s.initial, o.format) {
            (Some(InitialArg::None), _) => Some("--initial none takes no snapshot"),
            (_, Some(f)) if f != sluice_cli::args::FormatArg::Parquet => {
                Some("the snapshot is written as Parquet parts, rewritten at its end point")
            }
            _ => None,
        };
        if let Some(why) = what {
            return Err(Error::config(format!(
                "--consistency converged makes the initial snapshot one point in time from short \
                 transactions, and {why}: drop one of them (converged snapshots are written \
                 with --format parquet, the default)."
            )));
        }
    }
    for (set, flag, why) in [
        (
            o.merge,
            "--merge",
            "change files are one per batch and table",
        ),
        (
            o.resume,
            "--resume",
            "an interrupted stream resumes by itself when run again",
        ),
        (
            o.overwrite,
            "--overwrite",
            "a stream continues its output; --drop ends a stream",
        ),
    ] {
        if set {
            return Err(Error::config(format!(
                "{flag} does not apply to sluice stream ({why}). Remove it."
            )));
        }
    }
    // The export's job, every setting checked as for export: the template of the initial
    // snapshot's export, whose source the stream replaces with its slot's snapshot.
    if o.format == Some(sluice_cli::args::FormatArg::Iceberg) {
        return Err(Error::config(
            "sluice stream --format iceberg is not available: keeping an Iceberg table equal to \
             the source needs commits that delete or replace rows, and the Iceberg library \
             sluice commits with (iceberg 0.10) commits appends only. Stream into a Delta table \
             (--format delta), or into change files (--format parquet) and merge them with an \
             engine; sluice export --format iceberg makes the table of a snapshot.",
        ));
    }
    let delta = o.format == Some(sluice_cli::args::FormatArg::Delta);
    if delta {
        // A table equal to the source needs every change of every table.
        let why = "a Delta table is kept equal to the source, which needs every change";
        if s.ops.is_some() {
            return Err(Error::config(format!(
                "--ops does not apply to --format delta ({why}). Remove it, or stream change \
                 files (--format parquet) to keep some operations only."
            )));
        }
        if s.accept_missing_cascades {
            return Err(Error::config(format!(
                "--accept-missing-cascades does not apply to --format delta ({why}; a \
                 cascade the log leaves out would leave rows in the table). Remove it."
            )));
        }
    }
    let template = config::job(o, true)?;
    let initial = match converged {
        true => Initial::Converged,
        false => initial(s.initial),
    };
    // Merging into a table holds a batch's change rows while the table's files are rewritten:
    // by default a batch is then a quarter of --memory.
    let default_batch = if delta {
        (template.memory / 4).clamp(4 << 20, DEFAULT_BATCH_BYTES)
    } else {
        DEFAULT_BATCH_BYTES
    };
    let batch_bytes = s
        .batch_bytes
        .map_or(default_batch, sluice_cli::size::ByteSize::bytes);
    if batch_bytes < 64 << 10 {
        return Err(Error::config("--batch-bytes must be at least 64KB."));
    }
    let batch_seconds = s.batch_seconds.unwrap_or(DEFAULT_BATCH_SECONDS);
    if !(batch_seconds > 0.0 && batch_seconds.is_finite()) {
        return Err(Error::config(
            "--batch-seconds must be a positive number of seconds.",
        ));
    }
    let discover_every = s.discover_every.unwrap_or(DEFAULT_DISCOVER_EVERY);
    if !(discover_every >= 0.0 && discover_every.is_finite()) {
        return Err(Error::config(
            "--discover-every must be a number of seconds (0: the stream's tables stay those \
             of its start).",
        ));
    }
    let vacuum_retention = match (s.vacuum_retention.as_deref(), delta) {
        (Some(_), false) => {
            return Err(Error::config(
                "--vacuum-retention applies to --format delta (the files of a table's older \
                 versions): remove it.",
            ));
        }
        (None, true) => Some(DEFAULT_VACUUM_RETENTION),
        (Some("off"), true) | (None, false) => None,
        (Some(text), true) => Some(sluice_engine::governor::parse_duration(
            text,
            "--vacuum-retention",
        )?),
    };
    let metrics_addr = metrics_addr(s.metrics_addr.as_deref())?;
    let destination = template.destination.clone();
    let state: Arc<dyn sluice_stream::StateStore> = match s.state.as_deref() {
        None | Some("output") => Arc::new(OutputState::new(destination.clone())),
        Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
            Arc::new(sluice_stream::RedisState::new(
                url,
                &format!("sluice:stream:{}", destination.display()),
            )?)
        }
        Some(other) => {
            return Err(Error::config(format!(
                "--state {}: keep the stream state with the output (omit --state or --state \
                 output) or in Redis (--state redis://host:port[/db][?key=NAME]).",
                sluice_core::redact::redact_url(other)
            )));
        }
    };
    let capture = capture(
        o,
        template.selection.clone(),
        s.server_id,
        s.bad_values,
        s.until_current,
        s.partition_changes,
    )?;
    let (format, memory) = (template.format.clone(), template.memory);
    let table = template.table.clone();
    let export = sluice_stream::export_builder(template);
    Ok(StreamJob {
        capture,
        destination,
        state,
        format,
        initial,
        slot: s.slot.clone(),
        publication: s.publication.clone(),
        batch_bytes,
        batch_seconds,
        memory,
        metrics_addr,
        export,
        progress: Arc::new(sluice_engine::Silent),
        metrics: Arc::default(),
        accept_missing_cascades: s.accept_missing_cascades,
        standby: s.standby,
        files: sluice_stream::ChangeFiles {
            layout: sluice_cli::args::LayoutArg::layout(s.layout),
            ops: match &s.ops {
                Some(ops) => sluice_stream::OpFilter::parse(ops)?,
                None => sluice_stream::OpFilter::default(),
            },
            before_images: s.before_images,
        },
        discover_every: (discover_every > 0.0)
            .then(|| std::time::Duration::from_secs_f64(discover_every)),
        table,
        vacuum_retention,
    })
}

/// What `sluice stream` and `sluice replicate` capture: `o`'s source (its snapshot locked as
/// the export's settings say), the export's `selection`, and when the run stops.
pub(crate) fn capture(
    o: &Options,
    selection: sluice_core::Selection,
    server_id: Option<u32>,
    bad_values: Option<sluice_cli::args::BadValuesArg>,
    until_current: bool,
    partition_changes: Option<sluice_cli::args::PartitionChangesArg>,
) -> Result<Capture> {
    let source = registry::open_change_source(
        o.source.as_deref().unwrap_or_default(),
        server_id,
        config::locking(o, sluice_core::Consistency::Snapshot)?,
        sluice_cli::args::BadValuesArg::policy(bad_values),
        config::slot_wait(o)?,
    )?;
    Ok(Capture {
        source,
        selection,
        until_current,
        partition_changes: sluice_cli::args::PartitionChangesArg::policy(partition_changes),
    })
}

/// `--metrics-addr` (of `sluice stream` and `sluice replicate`): an IP address and port.
pub(crate) fn metrics_addr(addr: Option<&str>) -> Result<Option<std::net::SocketAddr>> {
    addr.map(|a| {
        a.parse().map_err(|_| {
            Error::config(format!(
                "--metrics-addr {a:?} is not HOST:PORT with an IP address, e.g. 127.0.0.1:9187."
            ))
        })
    })
    .transpose()
}

/// `--initial` (of `sluice stream` and `sluice replicate`): a snapshot unless `none`.
pub(crate) fn initial(arg: Option<InitialArg>) -> Initial {
    match arg {
        Some(InitialArg::None) => Initial::None,
        Some(InitialArg::Snapshot) | None => Initial::Snapshot,
    }
}

/// Run `sluice stream` (or `--drop`).
pub async fn run(
    args: StreamArgs,
    given: &Given,
    quiet: bool,
    format: LogFormat,
) -> anyhow::Result<()> {
    let (options, own) = merged(&args, given)?;
    let job = job(&options, &own)?;
    if args.drop {
        let removed = sluice_stream::drop_stream(&job).await?;
        crate::print_dropped(&removed, quiet);
        return Ok(());
    }
    let mut job = job;
    job.progress = Arc::new(crate::display::Display::new(
        quiet,
        format == LogFormat::Text,
    ));
    let spinner = progress(job.metrics.clone());
    let report = crate::supervised(quiet, format, spinner, |cancel_rx| {
        sluice_stream::run_stream(job, cancel_rx)
    })
    .await?;
    let json = options.report_json.as_deref();
    crate::emit_report(&report, report_text, json, quiet, format, "sluice stream")
}

/// A spinner line on a terminal while changes stream (the batch log lines go above it).
async fn progress(m: Arc<sluice_stream::Metrics>) {
    use std::sync::atomic::Ordering::Relaxed;
    let bar = indicatif::ProgressBar::new_spinner();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        if m.streaming.load(Relaxed) == 0 {
            continue;
        }
        bar.set_message(format!(
            "{} changes, {} batches, _seq {}, lag {:.1} s, WAL retained {:.1} MB",
            m.changes.load(Relaxed),
            m.batches.load(Relaxed),
            m.committed_seq.load(Relaxed),
            m.lag_millis.load(Relaxed) as f64 / 1000.0,
            m.retained_bytes.load(Relaxed) as f64 / (1u64 << 20) as f64,
        ));
        bar.tick();
    }
}

fn report_text(r: &StreamReport) -> String {
    let mut s = String::new();
    if r.engine == "postgres" {
        s.push_str(&format!(
            "stream {} → {} (slot {}, publication {})\n",
            r.source, r.destination, r.slot, r.publication
        ));
    } else {
        s.push_str(&format!("stream {} → {}\n", r.source, r.destination));
    }
    if let Some(snap) = &r.snapshot {
        // A converged snapshot's point is its end point, which its note gives.
        let converged = snap
            .notes
            .iter()
            .find(|n| n.starts_with("consistency converged"));
        match converged {
            Some(note) => s.push_str(&format!(
                "  initial snapshot: {} rows in {} parts; {note}; the changes follow from that \
                 position\n",
                snap.rows, snap.parts_written
            )),
            None => s.push_str(&format!(
                "  initial snapshot: {} rows in {} parts at {}\n",
                snap.rows, snap.parts_written, snap.position
            )),
        }
    }
    s.push_str(&format!(
        "  changes: {} in {} transactions, {} batches, {} files, {} bytes\n",
        r.changes, r.transactions, r.batches, r.files, r.bytes_written
    ));
    if r.table_versions > 0 {
        s.push_str(&format!(
            "  Delta tables: {} version(s) merged, {} file(s) added, {} removed, {} of older \
             versions vacuumed\n",
            r.table_versions, r.table_files_added, r.table_files_removed, r.table_files_vacuumed
        ));
    }
    s.push_str(&format!(
        "  position: {} (_seq {}), state in {}\n",
        r.position, r.last_seq, r.state
    ));
    s.push_str(&format!(
        "  harm: peak {} {:.1} MB, peak lag {:.1} s, last confirmed {:.1} s before the end\n",
        if r.engine == "postgres" {
            "WAL retained by the slot"
        } else {
            "binary log still needed"
        },
        r.peak_retained_bytes as f64 / (1u64 << 20) as f64,
        r.peak_lag_seconds,
        r.seconds_since_confirm
    ));
    s.push_str(&format!(
        "  {:.1} s, peak RSS {} MB; stopped: {}\n",
        r.wall_seconds,
        r.peak_rss_bytes >> 20,
        match r.stopped {
            sluice_stream::Stopped::UntilCurrent => "caught up (--until-current)",
            sluice_stream::Stopped::Signal => "signal",
            sluice_stream::Stopped::Tables => "tables changed",
        }
    ));
    for a in &r.added_tables {
        s.push_str(&format!("  joined the stream: {}\n", a.describe()));
    }
    for (d, complete) in &r.dropped_tables {
        s.push_str(&format!(
            "  dropped on the source: {d} ({}; {}/_dropped.json marks its end)\n",
            if *complete {
                "its changes are complete"
            } else {
                "ERROR: dropped while no stream ran, its last changes are missing"
            },
            sluice_sink::layout::dataset_dir(d)
        ));
    }
    s.push_str(&crate::display::capture_warnings(
        r.nulled_values,
        "written",
        r.ignored_changes,
    ));
    if r.filtered_changes > 0 {
        s.push_str(&format!(
            "  {} change(s) of operations --ops {} leaves out were not written\n",
            r.filtered_changes, r.ops
        ));
    }
    s.push_str(&format!("  {}\n", r.while_stopped));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings `argv` gives, laid over the file it names.
    fn merged_argv(argv: &[&str]) -> Result<(Options, StreamOptions)> {
        let (cli, given) = sluice_cli::args::Cli::try_parse_given_from(argv).unwrap();
        let Some(sluice_cli::args::Command::Stream(args)) = cli.command else {
            unreachable!("a stream command line")
        };
        merged(&args, &given)
    }

    #[test]
    fn one_file_holds_the_export_and_stream_keys_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("stream.yaml");
        std::fs::write(
            &file,
            "source: postgres://u@h/d\ntable: [public.a]\nto: ./cdc\nformat: csv\n\
             initial: none\nslot: s1\npublication: p1\nbatch_bytes: 1048576\n\
             batch_seconds: 5\nuntil_current: true\nstate: output\n\
             metrics_addr: 127.0.0.1:9187\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let (o, s) = merged_argv(&["sluice", "stream", "-c", path, "--slot", "s2"]).unwrap();
        assert_eq!(o.table, ["public.a"]);
        assert_eq!(o.format, Some(sluice_cli::args::FormatArg::Csv));
        assert_eq!(s.slot.as_deref(), Some("s2"), "the flag wins");
        assert_eq!(s.publication.as_deref(), Some("p1"));
        assert_eq!(s.initial, Some(InitialArg::None));
        assert_eq!(
            s.batch_bytes.map(sluice_cli::size::ByteSize::bytes),
            Some(1 << 20),
            "a number is a size"
        );
        assert_eq!(s.batch_seconds, Some(5.0));
        assert!(s.until_current);
        assert_eq!(s.state.as_deref(), Some("output"));
        assert_eq!(s.metrics_addr.as_deref(), Some("127.0.0.1:9187"));
        // A key neither the export nor the stream knows is refused, named.
        std::fs::write(&file, "source: postgres://u@h/d\nslots: s1\n").unwrap();
        let e = merged_argv(&["sluice", "stream", "-c", path]).unwrap_err();
        assert!(e.message().contains("slots"), "{e}");
        // Export options that make no sense for a stream are refused, not ignored.
        let (mut o, s) = merged_argv(&[
            "sluice",
            "stream",
            "--source",
            "postgres://u@h/d",
            "--table",
            "a",
        ])
        .unwrap();
        o.merge = true;
        let e = job(&o, &s).err().unwrap();
        assert!(e.message().contains("--merge"), "{e}");
    }
}
