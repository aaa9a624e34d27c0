//! `sluice doctor`: what this build is, and whether what a run needs is there.
//!
//! Prints the long version (commit, sources, destinations, formats), then one line per check:
//! the Firebird client library when `FIREBIRD` or `FBCLIENT` names one, and, when given, a
//! connection to `--source` (a session and a snapshot, as an export's first step; no rows are
//! read) and a write into `--to` (with `--format delta`, a probe table made and committed
//! there, and a conditional put refused the second time). Every check runs even after one failed; the exit code is that
//! of the first failure (2 configuration, 3 source, 4 destination), 0 when all passed.

use crate::args::DoctorArgs;
use crate::{registry, version};
use sluice_core::{Consistency, Error, SourceOptions};

/// The outcome of one check.
struct Check {
    what: String,
    outcome: Result<String, Error>,
}

fn firebird_library() -> Option<Check> {
    let set: Vec<String> = ["FBCLIENT", "FIREBIRD"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(|x| format!("{v}={}", x.to_string_lossy())))
        .collect();
    let lib = sluice_firebird::connect::client_library_from_env()?;
    let what = format!("Firebird client library ({})", set.join(", "));
    let outcome = if lib.is_file() {
        Ok(format!("found {}", lib.display()))
    } else {
        Err(Error::config(format!(
            "{} does not exist: point FIREBIRD at the runtime directory that holds \
             libfbclient.so.2 (or lib/libfbclient.so.2), or FBCLIENT at the library itself.",
            lib.display()
        )))
    };
    Some(Check { what, outcome })
}

async fn source(url: &str) -> Check {
    let what = format!("source {}", sluice_core::redact::redact_url(url));
    let outcome = async {
        let source = registry::open_source(url, None)?;
        let options = SourceOptions {
            session_tag: "sluice-doctor".into(),
            consistency: Consistency::Snapshot,
            enable_row_security: false,
        };
        let mut coordinator = source.open_coordinator(&options).await?;
        let version = coordinator.server_version();
        coordinator.release().await?;
        Ok(format!("connected, {version}"))
    }
    .await;
    Check { what, outcome }
}

async fn destination(to: &str) -> Check {
    let what = format!("--to {}", sluice_core::redact::redact_url(to));
    let outcome = match registry::open_destination(to, true, &[]) {
        Ok(d) => {
            let shown = d.display();
            d.check_writable()
                .await
                .map(|()| format!("writable ({shown})"))
        }
        Err(e) => Err(e),
    };
    Check { what, outcome }
}

async fn delta(to: &str) -> Check {
    let what = format!(
        "--to {} --format delta",
        sluice_core::redact::redact_url(to)
    );
    let outcome = match sluice_lake::DeltaCommitter::for_output(to, &[]) {
        Ok(c) => c.probe().await,
        Err(e) => Err(e),
    };
    Check { what, outcome }
}

async fn iceberg(to: &str, catalog: Option<&str>, namespace: Option<&str>) -> Check {
    let what = format!(
        "--to {} --format iceberg",
        sluice_core::redact::redact_url(to)
    );
    let outcome = match sluice_lake::IcebergCommitter::new(catalog, namespace, to) {
        Ok(c) => c.probe().await,
        Err(e) => Err(e),
    };
    Check { what, outcome }
}

/// Run `sluice doctor`; the error returned is the first failed check's (for the exit code).
pub async fn run(args: DoctorArgs) -> anyhow::Result<()> {
    print!("{}", version::long());
    let mut checks: Vec<Check> = Vec::new();
    checks.extend(firebird_library());
    if let Some(url) = &args.source {
        checks.push(source(url).await);
    }
    if let Some(to) = &args.to {
        checks.push(destination(to).await);
        match args.format {
            Some(crate::args::FormatArg::Delta) => checks.push(delta(to).await),
            Some(crate::args::FormatArg::Iceberg) => {
                checks.push(iceberg(to, args.catalog.as_deref(), args.namespace.as_deref()).await)
            }
            _ => {}
        }
    }
    println!();
    if checks.is_empty() {
        println!(
            "checks        none asked for: add --source URL and --to DIR|URL to check a run's \
             connection and output (FIREBIRD or FBCLIENT, when set, are checked too)"
        );
    }
    let mut first_failure = None;
    for c in checks {
        match c.outcome {
            Ok(detail) => println!("ok    {}: {detail}", c.what),
            Err(e) => {
                println!("FAIL  {}: {e}", c.what);
                first_failure.get_or_insert(e);
            }
        }
    }
    match first_failure {
        Some(e) => Err(Error::new(e.kind(), e.retry(), "a check failed (see above)").into()),
        None => Ok(()),
    }
}
