//! The `sluice` command: flags and YAML → a validated job → run → report, and an exit code
//! that tells configuration, source and destination failures apart.

mod alloc;
mod args;
mod config;
mod display;
mod registry;

use anyhow::Context;
use args::{Cli, Command};
use clap::Parser;
use sluice_core::ErrorKind;
use sluice_engine::{ExportJob, Progress};
use std::process::ExitCode;
use std::sync::Arc;

/// Exit codes (also in `sluice --help`).
mod exit {
    pub const INTERNAL: u8 = 1;
    pub const CONFIG: u8 = 2;
    pub const SOURCE: u8 = 3;
    pub const DESTINATION: u8 = 4;
    pub const DATA: u8 = 5;
    pub const INTERRUPTED: u8 = 130;
}

fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<sluice_core::Error>().map(|e| e.kind()) {
        Some(ErrorKind::Config) => exit::CONFIG,
        Some(ErrorKind::Source) => exit::SOURCE,
        Some(ErrorKind::Destination) => exit::DESTINATION,
        Some(ErrorKind::Data) => exit::DATA,
        Some(ErrorKind::Interrupted) => exit::INTERRUPTED,
        _ => exit::INTERNAL,
    }
}

fn init_logging(cli: &Cli) {
    let default = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "warn,sluice_engine=info,sluice=info",
        (false, 1) => "info,sluice_engine=debug,sluice_postgres=debug",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    alloc::tune();
    let cli = Cli::parse();
    init_logging(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sluice: cannot start the async runtime: {e}");
            return ExitCode::from(exit::INTERNAL);
        }
    };
    let result = runtime.block_on(run(cli));
    // Every task (and the database sessions it held) is dropped before the libraries shut down.
    drop(runtime);
    let code = match result {
        Ok(()) => 0,
        Err(e) => {
            // sluice's own errors already carry the driver's detail in their one paragraph.
            match e.downcast_ref::<sluice_core::Error>() {
                Some(own) => eprintln!("sluice: error: {own}"),
                None => eprintln!("sluice: error: {e:#}"),
            }
            exit_code(&e)
        }
    };
    if registry::release_process_resources() {
        leave_now(code);
    }
    ExitCode::from(code)
}

/// Exit without running the exit handlers of libraries that were already shut down (see
/// [`registry::release_process_resources`]); output is flushed first, and every file was
/// committed (fsync + rename) before this point.
#[allow(unsafe_code)]
fn leave_now(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process at once; nothing after this runs.
    unsafe { libc::_exit(i32::from(code)) }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Export(args) => export(*args, cli.quiet).await,
        Command::Plan(args) => plan(*args).await,
    }
}

fn job_from(resolved: &config::Resolved, to: &str) -> anyhow::Result<ExportJob> {
    let source = registry::open_source(&resolved.source, resolved.locking)?;
    let destination = registry::open_destination(to, resolved.fsync, &resolved.storage_options)?;
    let mut job = ExportJob::new(
        source,
        destination,
        resolved.selection.clone(),
        resolved.format.clone(),
    );
    job.chunking = resolved.chunking.clone();
    job.chunk_bytes = resolved.chunk_bytes;
    job.consistency = resolved.consistency;
    job.parallel = resolved.parallel;
    job.memory = resolved.memory;
    job.batch_bytes = resolved.batch_bytes;
    job.row_group_bytes = resolved.row_group_bytes;
    job.resume = resolved.resume;
    job.overwrite = resolved.overwrite;
    job.merge = resolved.merge;
    Ok(job)
}

async fn export(args: args::ExportArgs, quiet: bool) -> anyhow::Result<()> {
    let resolved = config::resolve(&args.select, Some(&args))?;
    let to = resolved.to.clone().ok_or_else(|| {
        sluice_core::Error::config("no output location: pass --to DIR (or to: in the -c file).")
    })?;
    let job = job_from(&resolved, &to)?;
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = cancel_tx.send(true);
    });
    let display = Arc::new(display::Display::new(quiet));
    let report =
        sluice_engine::run_export(job, display.clone() as Arc<dyn Progress>, cancel_rx).await?;
    if let Some(path) = &resolved.report_json {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    if !quiet {
        eprint!("{}", display::report_text(&report));
    }
    Ok(())
}

async fn plan(args: args::PlanArgs) -> anyhow::Result<()> {
    let resolved = config::resolve(&args.select, None)?;
    let job = job_from(&resolved, resolved.to.as_deref().unwrap_or("."))?;
    let report = sluice_engine::plan_export(&job).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", display::plan_text(&report));
    }
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
