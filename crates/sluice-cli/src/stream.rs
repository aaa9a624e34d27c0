//! `sluice stream`: change data capture into change files.
//!
//! Flags have YAML keys of the same name with `_` for `-` (`initial`, `slot`, `publication`,
//! `batch_bytes`, `batch_seconds`, `until_current`, `state`, `metrics_addr`), next to the
//! export's keys that apply (source, selection, `to`, format, memory, workers of the initial
//! snapshot, object-store options).

use crate::args::{CompressionArg, ExportArgs, LogFormat, SelectArgs};
use crate::config::{self, Resolved};
use crate::{log, registry};
use anyhow::Context;
use clap::{Args, ValueEnum};
use sluice_core::{Consistency, Error, Result};
use sluice_engine::ExportJob;
use sluice_stream::{Initial, OutputState, StreamJob, StreamReport};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

/// What the stream starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InitialArg {
    /// Export every table under the slot's snapshot first, then stream from exactly there.
    Snapshot,
    /// Stream only changes committed from now on.
    None,
}

/// `sluice stream`.
#[derive(Debug, Clone, Args)]
pub struct StreamArgs {
    /// What to capture and how to connect (the initial snapshot uses the export's options).
    #[command(flatten)]
    pub select: SelectArgs,
    /// Output directory or object-store URL: the snapshot as an export writes it, changes under <table>/changes/.
    #[arg(long, value_name = "DIR|URL")]
    pub to: Option<String>,
    /// snapshot (default): export every table under the slot's snapshot first; none: changes from now on.
    #[arg(long, value_enum)]
    pub initial: Option<InitialArg>,
    /// Replication slot name (default on the first start: sluice_<random>, kept in the state).
    #[arg(long, value_name = "NAME")]
    pub slot: Option<String>,
    /// Publication name (default: the slot's name); an existing one must publish every selected table.
    #[arg(long, value_name = "NAME")]
    pub publication: Option<String>,
    /// MySQL/MariaDB: the replica server id of the binary log session (default: a random one per session in 4026531840-4294967294, which IP-derived replica ids never use).
    #[arg(long, value_name = "N")]
    pub server_id: Option<u32>,
    /// Cut a batch when its changes reach this many bytes (default 64MB).
    #[arg(long, value_name = "BYTES")]
    pub batch_bytes: Option<String>,
    /// Cut a batch this many seconds after its first change (default 60).
    #[arg(long, value_name = "N")]
    pub batch_seconds: Option<f64>,
    /// Stop once everything committed before the command started is written.
    #[arg(long)]
    pub until_current: bool,
    /// Where the stream's position is kept: output (default, <to>/_sluice/stream.json) or redis://[user:password@]host:port[/db][?key=NAME].
    #[arg(long, value_name = "URL")]
    pub state: Option<String>,
    /// Serve Prometheus metrics on HOST:PORT (path /metrics).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Remove the stream's replication slot, the publication it created and its state, then exit. A stopped stream's slot keeps WAL on the server until this is run.
    #[arg(long)]
    pub drop: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub report_json: Option<PathBuf>,
    /// Parquet compression (default zstd).
    #[arg(long, value_enum)]
    pub compression: Option<CompressionArg>,
    /// Zstandard level, 1 to 22 (default 1).
    #[arg(long, value_name = "N")]
    pub zstd_level: Option<i32>,
    /// Skip fsync of written files (faster, not crash-safe: a crash may then lose committed batches).
    #[arg(long)]
    pub no_fsync: bool,
    /// Object stores: a client setting as KEY=VALUE (as for export). Repeatable.
    #[arg(long, value_name = "KEY=VALUE")]
    pub storage_option: Vec<String>,
}

impl StreamArgs {
    /// The export flags this command shares, for the common resolution.
    pub fn as_export(&self) -> ExportArgs {
        ExportArgs {
            select: self.select.clone(),
            to: self.to.clone(),
            compression: self.compression,
            zstd_level: self.zstd_level,
            row_group_size: None,
            csv_delimiter: None,
            csv_null: None,
            csv_no_header: false,
            merge: false,
            resume: false,
            overwrite: false,
            report_json: self.report_json.clone(),
            no_fsync: self.no_fsync,
            lock_wait_timeout: None,
            long_query_guard: None,
            long_query_wait: None,
            lock_non_transactional: false,
            part_size: None,
            upload_concurrency: None,
            storage_option: self.storage_option.clone(),
        }
    }
}

/// The default `--batch-bytes`.
const DEFAULT_BATCH_BYTES: u64 = 64 << 20;
/// The default `--batch-seconds`.
const DEFAULT_BATCH_SECONDS: f64 = 60.0;

fn job(args: &StreamArgs, r: &Resolved) -> Result<StreamJob> {
    if !r.selection.queries.is_empty() {
        return Err(Error::config(
            "sluice stream captures tables: --query has no change log. Name tables with \
             --table, --tables or --schema.",
        ));
    }
    if r.consistency == Consistency::Chunk {
        return Err(Error::config(
            "sluice stream reads its initial snapshot under the replication slot's snapshot: \
             --consistency chunk would break the hand-off. Remove it.",
        ));
    }
    let to = r.to.clone().ok_or_else(|| {
        Error::config("no output location: pass --to DIR (or to: in the -c file).")
    })?;
    let k = &r.stream;
    let initial = match (args.initial, k.initial.as_deref()) {
        (Some(InitialArg::Snapshot), _) | (None, None | Some("snapshot")) => Initial::Snapshot,
        (Some(InitialArg::None), _) | (None, Some("none")) => Initial::None,
        (None, Some(other)) => {
            return Err(Error::config(format!(
                "initial: {other:?} in the config file is not snapshot or none."
            )));
        }
    };
    let batch_bytes = match args.batch_bytes.clone().or(k.batch_bytes.clone()) {
        Some(s) => config::parse_size(&s, "--batch-bytes")?,
        None => DEFAULT_BATCH_BYTES,
    };
    if batch_bytes < 64 << 10 {
        return Err(Error::config("--batch-bytes must be at least 64KB."));
    }
    let batch_seconds = args
        .batch_seconds
        .or(k.batch_seconds)
        .unwrap_or(DEFAULT_BATCH_SECONDS);
    if !(batch_seconds > 0.0 && batch_seconds.is_finite()) {
        return Err(Error::config(
            "--batch-seconds must be a positive number of seconds.",
        ));
    }
    let metrics_addr = match args.metrics_addr.clone().or(k.metrics_addr.clone()) {
        Some(a) => Some(a.parse().map_err(|_| {
            Error::config(format!(
                "--metrics-addr {a:?} is not HOST:PORT with an IP address, e.g. 127.0.0.1:9187."
            ))
        })?),
        None => None,
    };
    let destination = registry::open_destination(&to, r.fsync, &r.storage_options)?;
    let state: Arc<dyn sluice_stream::StateStore> =
        match args.state.clone().or(k.state.clone()).as_deref() {
            None | Some("output") => Arc::new(OutputState::new(destination.clone())),
            Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                Arc::new(sluice_stream::RedisState::new(
                    url,
                    &format!("sluice:stream:{}", destination.display()),
                )?)
            }
            Some(other) => {
                return Err(Error::config(format!(
                    "--state {}: keep the stream state with the output (omit --state or \
                     --state output) or in Redis (--state redis://host:port[/db][?key=NAME]).",
                    sluice_core::redact::redact_url(other)
                )));
            }
        };
    let source = registry::open_change_source(&r.source, args.server_id, r.locking)?;
    let (selection, format) = (r.selection.clone(), r.format.clone());
    let (chunking, chunk_bytes, parallel, memory) =
        (r.chunking.clone(), r.chunk_bytes, r.parallel, r.memory);
    let (batch, row_group, rls) = (r.batch_bytes, r.row_group_bytes, r.enable_row_security);
    let dest = destination.clone();
    let sel = selection.clone();
    let fmt = format.clone();
    let export: sluice_stream::ExportBuilder = Arc::new(move |src| {
        let mut j = ExportJob::new(src, dest.clone(), sel.clone(), fmt.clone());
        j.chunking = chunking.clone();
        j.chunk_bytes = chunk_bytes;
        j.parallel = parallel;
        j.memory = memory;
        j.batch_bytes = batch;
        j.row_group_bytes = row_group;
        j.enable_row_security = rls;
        j
    });
    Ok(StreamJob {
        source,
        destination,
        state,
        selection,
        format,
        initial,
        slot: args.slot.clone().or(k.slot.clone()),
        publication: args.publication.clone().or(k.publication.clone()),
        batch_bytes,
        batch_seconds,
        until_current: args.until_current || k.until_current.unwrap_or(false),
        memory: r.memory,
        metrics_addr,
        export,
        progress: Arc::new(sluice_engine::Silent),
        metrics: Arc::default(),
    })
}

/// Run `sluice stream` (or `--drop`).
pub async fn run(
    args: StreamArgs,
    resolved: Resolved,
    quiet: bool,
    format: LogFormat,
) -> anyhow::Result<()> {
    let job = job(&args, &resolved)?;
    if args.drop {
        let removed = sluice_stream::drop_stream(&job).await?;
        if !quiet {
            if removed.is_empty() {
                eprintln!("sluice: nothing to drop (no slot, publication or state was found)");
            }
            for r in removed {
                eprintln!("sluice: dropped {r}");
            }
        }
        return Ok(());
    }
    let mut job = job;
    job.progress = Arc::new(crate::display::Display::new(
        quiet,
        format == LogFormat::Text,
    ));
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        crate::wait_for_signal().await;
        let _ = cancel_tx.send(true);
    });
    let spinner = (!quiet && format == LogFormat::Text && std::io::stderr().is_terminal())
        .then(|| tokio::spawn(progress(job.metrics.clone())));
    let report = sluice_stream::run_stream(job, cancel_rx).await;
    if let Some(s) = spinner {
        s.abort();
    }
    let report = report?;
    if let Some(path) = &resolved.report_json {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    match format {
        _ if quiet => {}
        LogFormat::Text => eprint!("{}", report_text(&report)),
        LogFormat::Json => {
            let mut fields = serde_json::Map::new();
            fields.insert("report".into(), serde_json::to_value(&report)?);
            eprintln!(
                "{}",
                log::json_line("INFO", "sluice stream finished", fields)
            );
        }
    }
    Ok(())
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
    s.push_str(&format!(
        "stream {} → {} (slot {}, publication {})\n",
        r.source, r.destination, r.slot, r.publication
    ));
    if let Some(snap) = &r.snapshot {
        s.push_str(&format!(
            "  initial snapshot: {} rows in {} parts at {}\n",
            snap.rows, snap.parts_written, snap.position
        ));
    }
    s.push_str(&format!(
        "  changes: {} in {} transactions, {} batches, {} files, {} bytes\n",
        r.changes, r.transactions, r.batches, r.files, r.bytes_written
    ));
    s.push_str(&format!(
        "  position: {} (_seq {}), state in {}\n",
        r.position, r.last_seq, r.state
    ));
    s.push_str(&format!(
        "  harm: peak WAL retained by the slot {:.1} MB, peak lag {:.1} s, last confirmed {:.1} s \
         before the end\n",
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
        }
    ));
    s.push_str(
        "  The slot keeps WAL on the server until the stream runs again; sluice stream --drop \
         removes it.\n",
    );
    s
}
