//! The settings of a run (the `-c` file with the flags laid over it: `file.rs`, whose merge
//! is re-exported here) turned into the engine's job, for files or for rows handed to the
//! caller (the Python package's reads), every setting checked and each error naming its flag.

pub use crate::file::{merge, merge_with, merged};

use crate::args::{ConsistencyArg, HarmBudgetArg, Options, Pair};
use crate::registry;
use crate::settings::Settings;
use crate::size::ByteSize;
use sluice_core::{
    ChunkStrategy, ColumnPick, Consistency, Error, NamedQuery, QualifiedName, Result, Selection,
};
use sluice_engine::ExportJob;
use sluice_engine::governor::HarmBudget;
use sluice_sink::{ArrowOutput, Destination, FormatOptions, MemoryDestination};
use std::sync::Arc;

fn parse_chunk_by(text: &str) -> Result<ChunkStrategy> {
    let t = text.trim();
    Ok(match t {
        "auto" => ChunkStrategy::Auto,
        "ctid" | "physical" | "pages" => ChunkStrategy::Physical,
        "key" => ChunkStrategy::Key(None),
        "none" => ChunkStrategy::None,
        _ if t.starts_with("key:") => {
            let cols: Vec<String> = t[4..]
                .split(',')
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect();
            if cols.is_empty() {
                return Err(Error::config(
                    "--chunk-by key: needs column names, e.g. key:id or key:region,id.",
                ));
            }
            ChunkStrategy::Key(Some(cols))
        }
        _ => {
            return Err(Error::config(format!(
                "--chunk-by {t:?} is not a strategy: use auto, ctid, key, key:<column>[,<column>…] or none."
            )));
        }
    })
}

/// The selection: `--table` names parsed, `--query NAME=SQL` split.
fn selection(o: &Options) -> Result<Selection> {
    let mut selection = Selection::default();
    for t in &o.table {
        selection.tables.push(QualifiedName::parse(t)?);
    }
    selection.patterns = o.tables.clone();
    selection.schemas = o.schema.clone();
    for q in &o.query {
        let query = match q {
            Pair::Entry(name, sql) => NamedQuery {
                name: name.clone(),
                sql: sql.clone(),
            },
            Pair::Typed(q) => {
                let (name, sql) = q
                    .split_once('=')
                    .filter(|(n, s)| !n.trim().is_empty() && !s.trim().is_empty())
                    .ok_or_else(|| {
                        Error::config(format!(
                            "--query {q:?} must be NAME=SQL, e.g. --query 'recent=SELECT * FROM \
                             orders'."
                        ))
                    })?;
                NamedQuery {
                    name: name.trim().to_string(),
                    sql: sql.trim().to_string(),
                }
            }
        };
        selection.queries.push(query);
    }
    for c in &o.columns {
        selection.columns.push(ColumnPick::parse(c)?);
    }
    if selection.is_empty() {
        return Err(Error::config(
            "nothing to export: name tables with --table, --tables (regex) or --schema, or a \
             query with --query.",
        ));
    }
    Ok(selection)
}

/// A size setting's bytes, as the engine counts them.
/// A size setting in bytes.
pub(crate) fn bytes(size: Option<ByteSize>) -> Option<usize> {
    size.map(|s| s.bytes() as usize)
}

/// The job `o` describes, its source and destination opened (no connection yet). `need_to`:
/// fail without `--to` (an export; `sluice plan` plans for the current directory then).
/// Settings are checked in the order the user reads them, each error naming its flag.
pub fn job(o: &Options, need_to: bool) -> Result<ExportJob> {
    build(o, Output::Files { need_to })
}

/// The settings about files: a run whose rows go to the caller refuses them.
pub const FILE_SETTINGS: &[&str] = &[
    "to",
    "catalog",
    "namespace",
    "format",
    "compression",
    "zstd_level",
    "parquet_encodings",
    "row_group_size",
    "csv_delimiter",
    "csv_null",
    "csv_no_header",
    "merge",
    "resume",
    "overwrite",
    "report_json",
    "no_fsync",
    "part_size",
    "upload_concurrency",
    "storage_option",
];

/// The job `o` describes with its rows handed to `consumer` in this process instead of
/// written to files (the Python package's reads): the same source, selection, consistency,
/// chunking and memory settings as [`job`], checked the same way; the settings about files
/// are refused, naming each, rather than ignored.
pub fn memory_job(o: &Options, consumer: ArrowOutput) -> Result<ExportJob> {
    let file_settings: Vec<&str> = FILE_SETTINGS
        .iter()
        .copied()
        .filter(|key| o.has(key))
        .collect();
    if !file_settings.is_empty() {
        return Err(Error::config(format!(
            "{} only apply to files, and this run hands its rows to the caller: remove them, or \
             export to files instead.",
            file_settings.join(", ")
        )));
    }
    build(o, Output::Memory(consumer))
}

/// Where a job's rows go.
enum Output {
    /// Files at `--to`, in `--format`.
    Files { need_to: bool },
    /// Arrow batches to a consumer in this process.
    Memory(ArrowOutput),
}

fn build(o: &Options, output: Output) -> Result<ExportJob> {
    let source = o.source.clone().ok_or_else(|| {
        Error::config(
            "no source given: pass --source postgres://user@host:port/database (or source: in \
             the -c file).",
        )
    })?;
    let selection = selection(o)?;
    let chunking = match &o.chunk_by {
        Some(c) => parse_chunk_by(c)?,
        None => ChunkStrategy::Auto,
    };
    let chunk_bytes = o.chunk_size.map(ByteSize::bytes);
    if o.parallel == Some(0) {
        return Err(Error::config("--parallel must be at least 1."));
    }
    let consistency = consistency(o.consistency);
    let memory = o
        .memory
        .map_or(sluice_engine::DEFAULT_MEMORY, ByteSize::bytes);
    if memory < 16 << 20 {
        return Err(Error::config(format!(
            "--memory {memory} bytes is too small to run: give at least 16MB."
        )));
    }
    let batch_bytes = bytes(o.batch_size);
    let format = match &output {
        Output::Files { .. } => crate::formats::format(o)?,
        Output::Memory(consumer) => FormatOptions::Arrow(consumer.clone()),
    };
    let row_group_bytes = bytes(o.row_group_size);
    let storage_options = storage_options(o)?;
    let locking = locking(o, consistency)?;
    let to = match (&output, &o.to) {
        (Output::Memory(_), _) => None,
        (Output::Files { .. }, Some(to)) => Some(to.clone()),
        (Output::Files { need_to: true }, None) => {
            return Err(Error::config(
                "no output location: pass --to DIR (or to: in the -c file).",
            ));
        }
        (Output::Files { need_to: false }, None) => Some(".".to_string()),
    };
    let table = match &to {
        Some(to) => crate::formats::table_committer(&format, to, &storage_options, o)?,
        None => None,
    };
    let source = registry::open_source(&source, locking)?;
    let destination: Arc<dyn Destination> = match to {
        Some(to) => registry::open_destination(&to, !o.no_fsync, &storage_options)?,
        None => Arc::new(MemoryDestination::new()),
    };
    let mut job = ExportJob::new(source, destination, selection, format);
    job.chunking = chunking;
    job.chunk_bytes = chunk_bytes;
    job.consistency = consistency;
    job.parallel = o.parallel;
    job.memory = memory;
    job.batch_bytes = batch_bytes;
    job.row_group_bytes = row_group_bytes;
    job.resume = o.resume;
    job.overwrite = o.overwrite;
    job.merge = o.merge;
    job.enable_row_security = o.enable_row_security;
    job.budget = budget(o)?;
    job.report_html = o.report_html.clone();
    job.table = table;
    // A converged run follows the log; an --overwrite of any other kind may have to remove
    // what an unfinished converged run on the same output kept on the source (its slot holds
    // the source's log until removed). Neither connects until it is used.
    let converged = consistency == Consistency::Converged;
    if converged || o.overwrite {
        let changes = registry::open_change_source(
            o.source.as_deref().unwrap_or_default(),
            None,
            None,
            crate::args::BadValuesArg::policy(None),
            slot_wait(o)?,
        );
        let changes = match changes {
            Ok(c) => Some(c),
            Err(e) if converged => return Err(e),
            // A source without a change log never kept anything.
            Err(_) => None,
        };
        let output = job.destination.display();
        job.converge = changes.map(|changes| -> Arc<dyn sluice_engine::converge::ChangeLog> {
            Arc::new(sluice_stream::ConvergeLog::new(changes, &output, memory))
        });
    }
    Ok(job)
}

/// `sluice export`'s job ([`job`] into files), refusing `--slot-wait` where the export makes
/// no replication slot rather than ignoring it.
pub fn export_job(o: &Options) -> Result<ExportJob> {
    let job = job(o, true)?;
    if o.slot_wait.is_some() && job.consistency != Consistency::Converged {
        return Err(Error::config(
            "--slot-wait bounds the creation of a replication slot, which sluice export makes \
             only with --consistency converged: remove it (sluice stream and sluice replicate \
             take it too).",
        ));
    }
    Ok(job)
}

/// `--slot-wait`: the longest a replication slot's creation may wait (no limit by default).
pub fn slot_wait(o: &Options) -> Result<Option<std::time::Duration>> {
    o.slot_wait
        .as_deref()
        .map(|t| sluice_engine::governor::parse_duration(t, "--slot-wait"))
        .transpose()
}

/// `--consistency`: snapshot unless another is asked for.
pub fn consistency(arg: Option<ConsistencyArg>) -> Consistency {
    match arg {
        Some(ConsistencyArg::Chunk) => Consistency::Chunk,
        Some(ConsistencyArg::Converged) => Consistency::Converged,
        Some(ConsistencyArg::Snapshot) | None => Consistency::Snapshot,
    }
}

/// The harm budget from `harm_budget`, the `max_…` limits, `replica` and `probe_sql`, each
/// error naming its flag.
pub fn budget(o: &Options) -> Result<HarmBudget> {
    use sluice_engine::governor::{self, Preset};
    let duration = |v: &Option<String>, flag: &str| {
        v.as_deref()
            .map(|t| governor::parse_duration(t, flag))
            .transpose()
    };
    let given = HarmBudget {
        max_replica_lag: duration(&o.max_replica_lag, "--max-replica-lag")?,
        max_latency: duration(&o.max_latency, "--max-latency")?,
        max_xmin_age: o
            .max_xmin_age
            .as_deref()
            .map(governor::parse_xmin_limit)
            .transpose()?,
        max_active: o.max_active,
        max_rate: o
            .max_rate
            .as_deref()
            .map(governor::parse_rate)
            .transpose()?,
        replicas: o.replica.clone(),
        probe_sql: o.probe_sql.clone(),
    };
    let preset = o.harm_budget.map(|p| match p {
        HarmBudgetArg::Gentle => Preset::Gentle,
        HarmBudgetArg::Normal => Preset::Normal,
        HarmBudgetArg::None => Preset::None,
    });
    given.with_preset(preset)
}

/// The MySQL/MariaDB lock settings from `lock_wait_timeout`, `long_query_guard`,
/// `long_query_wait` and `lock_non_transactional` (flag over file), or `None` when none is
/// given.
pub fn locking(o: &Options, consistency: Consistency) -> Result<Option<sluice_mysql::Locking>> {
    let wait = o.lock_wait_timeout;
    let guard = o.long_query_guard;
    let guard_wait = o.long_query_wait;
    let lock_nt = o.lock_non_transactional;
    if wait.is_none() && guard.is_none() && guard_wait.is_none() && !lock_nt {
        return Ok(None);
    }
    if lock_nt && consistency == Consistency::Chunk {
        return Err(Error::config(
            "--lock-non-transactional keeps non-transactional tables at the snapshot's moment, \
             and --consistency chunk takes no snapshot: drop one of them.",
        ));
    }
    let mut l = sluice_mysql::Locking {
        lock_non_transactional: lock_nt,
        ..sluice_mysql::Locking::default()
    };
    if let Some(w) = wait {
        if !(1..=31_536_000).contains(&w) {
            return Err(Error::config(format!(
                "--lock-wait-timeout {w} is out of range: give 1 to 31536000 seconds."
            )));
        }
        l.wait_timeout = std::time::Duration::from_secs(w);
    }
    if let Some(g) = guard {
        l.long_query_guard = (g > 0).then(|| std::time::Duration::from_secs(g));
    }
    if let Some(w) = guard_wait {
        if l.long_query_guard.is_none() {
            return Err(Error::config(
                "--long-query-wait needs the long-query guard: drop --long-query-guard 0, or \
                 drop --long-query-wait.",
            ));
        }
        l.long_query_wait = std::time::Duration::from_secs(w);
    }
    Ok(Some(l))
}

/// Object-store options: the `storage_option` entries (the file's, then the flags'), then
/// `part_size` and `upload_concurrency`; later entries win.
fn storage_options(o: &Options) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    for kv in &o.storage_option {
        match kv {
            Pair::Entry(k, v) => out.push((k.clone(), v.clone())),
            Pair::Typed(kv) => {
                let (k, v) = kv
                    .split_once('=')
                    .filter(|(k, _)| !k.trim().is_empty())
                    .ok_or_else(|| {
                        // Not shown: the text may be a secret.
                        Error::config(
                            "a --storage-option is not KEY=VALUE (its text is not shown, it may \
                             hold a secret): write e.g. --storage-option \
                             endpoint=http://127.0.0.1:9000.",
                        )
                    })?;
                out.push((k.trim().to_string(), v.to_string()));
            }
        }
    }
    if let Some(size) = o.part_size {
        let bytes = size.bytes();
        if bytes < 1 << 20 {
            return Err(Error::config(format!(
                "--part-size {size} is too small: give at least 1MB (S3 needs 5MB)."
            )));
        }
        out.push(("part_size".into(), bytes.to_string()));
    }
    if let Some(n) = o.upload_concurrency {
        if n == 0 {
            return Err(Error::config("--upload-concurrency must be at least 1."));
        }
        out.push(("upload_concurrency".into(), n.to_string()));
    }
    let to = o.to.as_deref();
    if !out.is_empty() && !to.is_some_and(sluice_sink::ObjectStoreDestination::handles) {
        return Err(Error::config(format!(
            "--part-size, --upload-concurrency and --storage-option ({}) apply to object stores \
             only, and --to is {}: remove them or write to s3://, gs:// or az://.",
            out.iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            to.map(sluice_core::redact::redact_url)
                .unwrap_or_else(|| "not given".into())
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_strategies() {
        assert_eq!(
            parse_chunk_by("key:a, b").unwrap(),
            ChunkStrategy::Key(Some(vec!["a".into(), "b".into()]))
        );
        assert_eq!(parse_chunk_by("ctid").unwrap(), ChunkStrategy::Physical);
        assert!(parse_chunk_by("key:").is_err());
        assert!(parse_chunk_by("rows").is_err());
    }

    fn export_flags(extra: &[&str]) -> Result<Option<sluice_mysql::Locking>> {
        let mut argv = vec![
            "sluice",
            "export",
            "--source",
            "mysql://u@h/d",
            "--table",
            "t",
        ];
        argv.extend_from_slice(extra);
        let (cli, given) = crate::args::Cli::try_parse_given_from(argv).unwrap();
        let Some(crate::args::Command::Export(args)) = cli.command else {
            unreachable!("an export command line")
        };
        let o = merge(&args, &given)?;
        locking(&o, consistency(o.consistency))
    }

    #[test]
    fn mysql_lock_settings() {
        assert!(export_flags(&[]).unwrap().is_none());
        let l = export_flags(&["--lock-wait-timeout", "3", "--long-query-guard", "0"])
            .unwrap()
            .unwrap();
        assert_eq!(l.wait_timeout, std::time::Duration::from_secs(3));
        assert_eq!(l.long_query_guard, None);
        let l = export_flags(&["--long-query-wait", "60", "--lock-non-transactional"])
            .unwrap()
            .unwrap();
        assert_eq!(l.long_query_wait, std::time::Duration::from_secs(60));
        assert!(l.lock_non_transactional);
        for (bad, says) in [
            (vec!["--lock-wait-timeout", "0"], "out of range"),
            (
                vec!["--long-query-guard", "0", "--long-query-wait", "5"],
                "needs the long-query guard",
            ),
            (
                vec!["--lock-non-transactional", "--consistency", "chunk"],
                "--consistency chunk",
            ),
        ] {
            let e = export_flags(&bad).err().unwrap();
            assert_eq!(e.kind(), sluice_core::ErrorKind::Config);
            assert!(e.message().contains(says), "{bad:?}: {e}");
        }
        // Refused, not ignored, for other sources.
        let e = crate::registry::open_source("postgres://u@h/d", Some(l))
            .err()
            .unwrap();
        assert!(
            e.message().contains("MySQL and MariaDB sources only"),
            "{e}"
        );
    }
}
