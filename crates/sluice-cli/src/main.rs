//! The `sluice` command: flags over YAML (one definition, `args::Options`) → a validated job →
//! run → report, and an exit code that tells configuration, source and destination failures
//! apart.

mod alloc;
mod display;
mod doctor;
mod log;
mod replicate;
mod stream;
mod version;

use sluice_cli::{args, config, registry};

use anyhow::Context;
use args::{Cli, Command, LogFormat, Options};
use clap::CommandFactory;
use sluice_cli::settings::Given;
use sluice_core::ErrorKind;
use sluice_engine::Progress;
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

fn main() -> ExitCode {
    alloc::tune();
    let (cli, given) = Cli::parse_given();
    if cli.version {
        print!(
            "{}",
            if cli.verbose > 0 {
                version::long()
            } else {
                version::line()
            }
        );
        return ExitCode::SUCCESS;
    }
    let Some(command) = cli.command else {
        Cli::command()
            .error(
                clap::error::ErrorKind::MissingSubcommand,
                "no command given: use sluice export, plan, stream, replicate, doctor, completions or man \
                 (sluice --help lists them)",
            )
            .exit();
    };
    // The configuration is resolved before logging starts: its `log_format` key decides the
    // form of every line (the flag wins over it). Its errors are reported below, once logging
    // is set up.
    let options = match &command {
        Command::Export(o) => Some(config::merge(o, &given)),
        Command::Plan(a) => Some(config::merge(&a.options, &given)),
        Command::Stream(a) => Some(stream::merged(a, &given).map(|(o, _)| o)),
        Command::Replicate(a) => Some(replicate::merged(a, &given).map(|(o, _)| o)),
        _ => None,
    };
    let format = cli
        .log_format
        .or_else(|| options.as_ref()?.as_ref().ok()?.log_format)
        .unwrap_or(LogFormat::Text);
    log::init(format, cli.quiet, cli.verbose);
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
    let result = runtime.block_on(run(command, &given, options, cli.quiet, format));
    // Every task (and the database sessions it held) is dropped before the libraries shut down.
    drop(runtime);
    let code = match result {
        Ok(()) => 0,
        Err(e) => {
            let code = exit_code(&e);
            // sluice's own errors already carry the driver's detail in their one paragraph.
            let own = e.downcast_ref::<sluice_core::Error>();
            let message = match own {
                Some(own) => own.to_string(),
                None => format!("{e:#}"),
            };
            match format {
                LogFormat::Text => eprintln!("sluice: error: {message}"),
                LogFormat::Json => {
                    let mut fields = serde_json::Map::new();
                    let kind = own.map_or(ErrorKind::Internal, |o| o.kind());
                    fields.insert("kind".into(), kind.to_string().into());
                    fields.insert("exit_code".into(), code.into());
                    eprintln!("{}", log::json_line("ERROR", &message, fields));
                }
            }
            code
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

async fn run(
    command: Command,
    given: &Given,
    options: Option<sluice_core::Result<Options>>,
    quiet: bool,
    format: LogFormat,
) -> anyhow::Result<()> {
    match (command, options) {
        (Command::Export(_), Some(o)) => export(o?, quiet, format).await,
        (Command::Plan(args), Some(o)) => plan(o?, args.json).await,
        (Command::Stream(args), Some(o)) => {
            o?;
            stream::run(*args, given, quiet, format).await
        }
        (Command::Replicate(args), Some(o)) => {
            o?;
            replicate::run(*args, given, quiet, format).await
        }
        (
            Command::Export(_) | Command::Plan(_) | Command::Stream(_) | Command::Replicate(_),
            None,
        ) => Err(
            sluice_core::Error::internal("the configuration was not resolved before the run")
                .into(),
        ),
        (Command::Doctor(args), _) => doctor::run(args).await,
        (Command::Completions { shell }, _) => {
            clap_complete::generate(shell, &mut Cli::command(), "sluice", &mut std::io::stdout());
            Ok(())
        }
        (Command::Man { out_dir }, _) => man(out_dir),
    }
}

/// `sluice man`: the man page generated from the same definitions as `--help`.
fn man(out_dir: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let cmd = Cli::command();
    match out_dir {
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd).render(&mut out)?;
            Ok(())
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .and_then(|()| clap_mangen::generate_to(cmd, &dir))
                .map_err(|e| {
                    sluice_core::Error::destination(
                        sluice_core::Retry::Permanent,
                        format!(
                            "could not write the man pages into {}: {e}. Choose a writable \
                             --out-dir.",
                            dir.display()
                        ),
                    )
                })?;
            Ok(())
        }
    }
}

async fn export(options: Options, quiet: bool, format: LogFormat) -> anyhow::Result<()> {
    let job = config::export_job(&options)?;
    let cancel_rx = cancel_on_signal();
    let display = Arc::new(display::Display::new(quiet, format == LogFormat::Text));
    let report =
        sluice_engine::run_export(job, display.clone() as Arc<dyn Progress>, cancel_rx).await?;
    emit_report(
        &report,
        display::report_text,
        options.report_json.as_deref(),
        quiet,
        format,
        "sluice export",
    )
}

async fn plan(options: Options, json: bool) -> anyhow::Result<()> {
    let job = config::job(&options, false)?;
    let report = sluice_engine::plan_export(&job).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", display::plan_text(&report));
    }
    Ok(())
}

/// A cancel flag that turns true on SIGINT or SIGTERM (the run then stops cleanly).
pub(crate) fn cancel_on_signal() -> tokio::sync::watch::Receiver<bool> {
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = cancel_tx.send(true);
    });
    cancel_rx
}

/// Say what `--drop` removed (`sluice stream`, `sluice replicate`), unless `quiet`.
pub(crate) fn print_dropped(removed: &[String], quiet: bool) {
    if quiet {
        return;
    }
    if removed.is_empty() {
        eprintln!("sluice: nothing to drop (no slot, publication or state was found)");
    }
    for r in removed {
        eprintln!("sluice: dropped {r}");
    }
}

/// Run the long-lived command `work` (`sluice stream`, `sluice replicate`): it is given the
/// channel that says a signal asked it to stop; the spinner line `spinner` runs on stderr
/// meanwhile when stderr is a terminal showing text logs and not `quiet` (a spinner would
/// garble JSON logs and files).
pub(crate) async fn supervised<T, W: std::future::Future<Output = T>>(
    quiet: bool,
    format: LogFormat,
    spinner: impl std::future::Future<Output = ()> + Send + 'static,
    work: impl FnOnce(tokio::sync::watch::Receiver<bool>) -> W,
) -> T {
    use std::io::IsTerminal;
    let work = work(cancel_on_signal());
    let spinner = (!quiet && format == LogFormat::Text && std::io::stderr().is_terminal())
        .then(|| tokio::spawn(spinner));
    let result = work.await;
    if let Some(s) = spinner {
        s.abort();
    }
    result
}

/// Write a finished run's report: to `--report-json` when given, and on stderr as text or as
/// one JSON log line (`what`: `sluice export`, …) unless `quiet`.
pub(crate) fn emit_report<T: serde::Serialize>(
    report: &T,
    text: impl FnOnce(&T) -> String,
    path: Option<&std::path::Path>,
    quiet: bool,
    format: LogFormat,
    what: &str,
) -> anyhow::Result<()> {
    if let Some(path) = path {
        let json = serde_json::to_vec_pretty(report)?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    match format {
        _ if quiet => {}
        LogFormat::Text => eprint!("{}", text(report)),
        LogFormat::Json => {
            let mut fields = serde_json::Map::new();
            fields.insert("report".into(), serde_json::to_value(report)?);
            eprintln!(
                "{}",
                log::json_line("INFO", &format!("{what} finished"), fields)
            );
        }
    }
    Ok(())
}

pub(crate) async fn wait_for_signal() {
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
