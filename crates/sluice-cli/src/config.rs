//! The YAML config file and how flags override it, producing the engine's job.
//!
//! Keys are the flags' names with `_` for `-`:
//! ```yaml
//! source: postgres://app@db.internal:5432/shop   # password: PGPASSWORD
//! table: [public.orders, public.customers]
//! tables: ['sales\..*']
//! query:
//!   recent: SELECT * FROM public.orders WHERE created_at > now() - interval '1 day'
//! to: ./out
//! format: parquet
//! parallel: 4
//! chunk_size: 128MB
//! log_format: json          # or --log-format; text by default
//! # object stores only:
//! part_size: 16MB
//! upload_concurrency: 4
//! # MySQL/MariaDB only (seconds):
//! lock_wait_timeout: 10
//! long_query_guard: 10
//! long_query_wait: 300
//! lock_non_transactional: true
//! storage_option:
//!   endpoint: http://127.0.0.1:9000
//!   allow_http: "true"
//! ```
//! A flag given on the command line replaces the file's value (a repeated flag replaces the
//! whole list). Unknown keys are refused, with their line and column.

use crate::args::{CompressionArg, ConsistencyArg, ExportArgs, FormatArg, LogFormat, SelectArgs};
use serde::Deserialize;
use sluice_core::{
    ChunkStrategy, Consistency, Error, NamedQuery, QualifiedName, Result, Selection,
};
use sluice_sink::{Compression, CsvOptions, FormatOptions, ParquetOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A value that may be written as one item or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A size written as a number of bytes or with a unit (`64MB`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

impl SizeValue {
    fn text(&self) -> String {
        match self {
            SizeValue::Bytes(b) => b.to_string(),
            SizeValue::Text(t) => t.clone(),
        }
    }
}

/// The YAML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    source: Option<String>,
    table: Option<OneOrMany>,
    tables: Option<OneOrMany>,
    schema: Option<OneOrMany>,
    query: Option<BTreeMap<String, String>>,
    chunk_by: Option<String>,
    chunk_size: Option<SizeValue>,
    parallel: Option<usize>,
    consistency: Option<ConsistencyArg>,
    memory: Option<SizeValue>,
    batch_size: Option<SizeValue>,
    format: Option<FormatArg>,
    enable_row_security: Option<bool>,
    to: Option<String>,
    compression: Option<CompressionArg>,
    zstd_level: Option<i32>,
    row_group_size: Option<SizeValue>,
    csv_delimiter: Option<String>,
    csv_null: Option<String>,
    csv_no_header: Option<bool>,
    merge: Option<bool>,
    resume: Option<bool>,
    overwrite: Option<bool>,
    report_json: Option<PathBuf>,
    no_fsync: Option<bool>,
    part_size: Option<SizeValue>,
    upload_concurrency: Option<usize>,
    storage_option: Option<BTreeMap<String, String>>,
    log_format: Option<LogFormat>,
    lock_wait_timeout: Option<u64>,
    long_query_guard: Option<u64>,
    long_query_wait: Option<u64>,
    lock_non_transactional: Option<bool>,
}

fn load(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::config(format!(
            "cannot read config file {}: {e}. Check the path given to -c.",
            path.display()
        ))
    })?;
    yaml_serde::from_str(&text).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!(" at line {} column {}", l.line(), l.column()))
            .unwrap_or_default();
        Error::config(format!(
            "config file {} is not valid{at}: {e}. Keys are the flag names with _ for - (see \
             sluice export --help).",
            path.display()
        ))
    })
}

pub use sluice_core::size::parse_size;

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

fn parse_delimiter(text: &str) -> Result<u8> {
    match text {
        "\\t" | "tab" | "\t" => Ok(b'\t'),
        t if t.len() == 1 && t.is_ascii() => Ok(t.as_bytes()[0]),
        t => Err(Error::config(format!(
            "--csv-delimiter {t:?} must be exactly one ASCII character (or '\\t' for tab)."
        ))),
    }
}

/// `--csv-null`: the text must not contain what CSV gives meaning to, or a NULL would read
/// back as something else (or break the row).
fn check_csv_null(null: &str, delimiter: u8) -> Result<()> {
    if null
        .bytes()
        .any(|b| b == delimiter || matches!(b, b'"' | b'\r' | b'\n'))
    {
        return Err(Error::config(format!(
            "--csv-null {null:?} contains the delimiter {:?}, a double quote or a line break, so \
             NULL could not be told apart from data (or would break the row): choose a text \
             without them, e.g. --csv-null NULL or --csv-null '\\N'.",
            delimiter as char
        )));
    }
    Ok(())
}

fn pick<T>(flag: Option<T>, file: Option<T>) -> Option<T> {
    flag.or(file)
}

fn pick_list(flag: &[String], file: Option<OneOrMany>) -> Vec<String> {
    if flag.is_empty() {
        file.map(OneOrMany::into_vec).unwrap_or_default()
    } else {
        flag.to_vec()
    }
}

/// Everything that selects and reads, resolved from flags over the file.
pub struct Resolved {
    /// Source URL.
    pub source: String,
    /// What to read.
    pub selection: Selection,
    /// Chunking strategy.
    pub chunking: ChunkStrategy,
    /// Chunk size override.
    pub chunk_bytes: Option<u64>,
    /// Worker override.
    pub parallel: Option<usize>,
    /// Consistency.
    pub consistency: Consistency,
    /// Memory target.
    pub memory: u64,
    /// Batch budget override.
    pub batch_bytes: Option<usize>,
    /// Row-group budget override.
    pub row_group_bytes: Option<usize>,
    /// Output format.
    pub format: FormatOptions,
    /// Export only rows visible under row-level security.
    pub enable_row_security: bool,
    /// Output location.
    pub to: Option<String>,
    /// Merge parts into one file per dataset.
    pub merge: bool,
    /// Resume.
    pub resume: bool,
    /// Overwrite.
    pub overwrite: bool,
    /// Report JSON path.
    pub report_json: Option<PathBuf>,
    /// fsync committed files.
    pub fsync: bool,
    /// Object-store client options (`part_size`, `upload_concurrency` and the builders' keys),
    /// applied after the `--to` URL's query.
    pub storage_options: Vec<(String, String)>,
    /// The file's `log_format` (the `--log-format` flag wins over it; see `main.rs`).
    pub log_format: Option<LogFormat>,
    /// MySQL/MariaDB lock bounds, when any of their flags or keys was given.
    pub locking: Option<sluice_mysql::Locking>,
}

/// Resolve the selection flags (shared by export and plan) and, for export, the output flags.
pub fn resolve(select: &SelectArgs, export: Option<&ExportArgs>) -> Result<Resolved> {
    let mut file = match &select.config {
        Some(p) => load(p)?,
        None => FileConfig::default(),
    };
    let source = pick(select.source.clone(), file.source.take()).ok_or_else(|| {
        Error::config("no source given: pass --source postgres://user@host:port/database (or source: in the -c file).")
    })?;
    let mut selection = Selection::default();
    for t in pick_list(&select.table, file.table.take()) {
        selection.tables.push(QualifiedName::parse(&t)?);
    }
    selection.patterns = pick_list(&select.tables, file.tables.take());
    selection.schemas = pick_list(&select.schema, file.schema.take());
    if select.query.is_empty() {
        for (name, sql) in file.query.take().unwrap_or_default() {
            selection.queries.push(NamedQuery { name, sql });
        }
    } else {
        for q in &select.query {
            let (name, sql) = q.split_once('=').filter(|(n, s)| !n.trim().is_empty() && !s.trim().is_empty()).ok_or_else(|| {
                Error::config(format!("--query {q:?} must be NAME=SQL, e.g. --query 'recent=SELECT * FROM orders'."))
            })?;
            selection.queries.push(NamedQuery {
                name: name.trim().to_string(),
                sql: sql.trim().to_string(),
            });
        }
    }
    if selection.is_empty() {
        return Err(Error::config(
            "nothing to export: name tables with --table, --tables (regex) or --schema, or a query with --query.",
        ));
    }
    let chunking = match pick(select.chunk_by.clone(), file.chunk_by.take()) {
        Some(c) => parse_chunk_by(&c)?,
        None => ChunkStrategy::Auto,
    };
    let chunk_bytes = match pick(
        select.chunk_size.clone(),
        file.chunk_size.take().map(|s| s.text()),
    ) {
        Some(s) => Some(parse_size(&s, "--chunk-size")?),
        None => None,
    };
    let parallel = pick(select.parallel, file.parallel);
    if parallel == Some(0) {
        return Err(Error::config("--parallel must be at least 1."));
    }
    let consistency = match pick(select.consistency, file.consistency) {
        Some(ConsistencyArg::Chunk) => Consistency::Chunk,
        _ => Consistency::Snapshot,
    };
    let memory = match pick(select.memory.clone(), file.memory.take().map(|s| s.text())) {
        Some(s) => parse_size(&s, "--memory")?,
        None => sluice_engine::DEFAULT_MEMORY,
    };
    if memory < 16 << 20 {
        return Err(Error::config(format!(
            "--memory {memory} bytes is too small to run: give at least 16MB."
        )));
    }
    let batch_bytes = match pick(
        select.batch_size.clone(),
        file.batch_size.take().map(|s| s.text()),
    ) {
        Some(s) => Some(parse_size(&s, "--batch-size")? as usize),
        None => None,
    };
    let format_kind = pick(select.format, file.format).unwrap_or(FormatArg::Parquet);
    let e = export;
    let compression =
        pick(e.and_then(|e| e.compression), file.compression).unwrap_or(CompressionArg::Zstd);
    let level = pick(e.and_then(|e| e.zstd_level), file.zstd_level).unwrap_or(1);
    let row_group_bytes = match pick(
        e.and_then(|e| e.row_group_size.clone()),
        file.row_group_size.take().map(|s| s.text()),
    ) {
        Some(s) => Some(parse_size(&s, "--row-group-size")? as usize),
        None => None,
    };
    let format = match format_kind {
        FormatArg::Parquet => FormatOptions::Parquet(ParquetOptions {
            compression: match compression {
                CompressionArg::Zstd => {
                    if !(1..=22).contains(&level) {
                        return Err(Error::config(format!(
                            "--zstd-level {level} is out of range: use 1 to 22."
                        )));
                    }
                    Compression::Zstd(level)
                }
                CompressionArg::Snappy => Compression::Snappy,
                CompressionArg::None => Compression::None,
            },
            // The engine replaces this with the budget it derives from --memory.
            row_group_bytes: row_group_bytes.unwrap_or(ParquetOptions::default().row_group_bytes),
        }),
        FormatArg::Csv => {
            let delimiter = match pick(
                e.and_then(|e| e.csv_delimiter.clone()),
                file.csv_delimiter.take(),
            ) {
                Some(d) => parse_delimiter(&d)?,
                None => b',',
            };
            let null =
                pick(e.and_then(|e| e.csv_null.clone()), file.csv_null.take()).unwrap_or_default();
            check_csv_null(&null, delimiter)?;
            FormatOptions::Csv(CsvOptions {
                delimiter,
                null,
                header: !(e.is_some_and(|e| e.csv_no_header)
                    || file.csv_no_header.unwrap_or(false)),
            })
        }
    };
    let flag = |f: fn(&ExportArgs) -> bool| e.is_some_and(f);
    let to = pick(e.and_then(|e| e.to.clone()), file.to.take());
    let storage_options = storage_options(e, &mut file, to.as_deref())?;
    let locking = locking(e, &file, consistency)?;
    Ok(Resolved {
        source,
        selection,
        chunking,
        chunk_bytes,
        parallel,
        consistency,
        memory,
        batch_bytes,
        row_group_bytes,
        format,
        enable_row_security: select.enable_row_security
            || file.enable_row_security.unwrap_or(false),
        to,
        merge: flag(|e| e.merge) || file.merge.unwrap_or(false),
        resume: flag(|e| e.resume) || file.resume.unwrap_or(false),
        overwrite: flag(|e| e.overwrite) || file.overwrite.unwrap_or(false),
        report_json: pick(
            e.and_then(|e| e.report_json.clone()),
            file.report_json.take(),
        ),
        fsync: !(flag(|e| e.no_fsync) || file.no_fsync.unwrap_or(false)),
        storage_options,
        log_format: file.log_format,
        locking,
    })
}

/// The MySQL/MariaDB lock settings from `lock_wait_timeout`, `long_query_guard`,
/// `long_query_wait` and `lock_non_transactional` (flag over file), or `None` when none is
/// given.
fn locking(
    e: Option<&ExportArgs>,
    file: &FileConfig,
    consistency: Consistency,
) -> Result<Option<sluice_mysql::Locking>> {
    let wait = pick(e.and_then(|e| e.lock_wait_timeout), file.lock_wait_timeout);
    let guard = pick(e.and_then(|e| e.long_query_guard), file.long_query_guard);
    let guard_wait = pick(e.and_then(|e| e.long_query_wait), file.long_query_wait);
    let lock_nt =
        e.is_some_and(|e| e.lock_non_transactional) || file.lock_non_transactional.unwrap_or(false);
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

/// Object-store options from the file's `storage_option` map, then `--storage-option` flags,
/// then `part_size` and `upload_concurrency` (flag over file); later entries win.
fn storage_options(
    e: Option<&ExportArgs>,
    file: &mut FileConfig,
    to: Option<&str>,
) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = file
        .storage_option
        .take()
        .unwrap_or_default()
        .into_iter()
        .collect();
    for kv in e.map(|e| e.storage_option.as_slice()).unwrap_or_default() {
        let (k, v) = kv
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .ok_or_else(|| {
                // Not shown: the text may be a secret.
                Error::config(
                    "a --storage-option is not KEY=VALUE (its text is not shown, it may hold a \
                     secret): write e.g. --storage-option endpoint=http://127.0.0.1:9000.",
                )
            })?;
        out.push((k.trim().to_string(), v.to_string()));
    }
    if let Some(size) = pick(
        e.and_then(|e| e.part_size.clone()),
        file.part_size.take().map(|s| s.text()),
    ) {
        let bytes = parse_size(&size, "--part-size")?;
        if bytes < 1 << 20 {
            return Err(Error::config(format!(
                "--part-size {size} is too small: give at least 1MB (S3 needs 5MB)."
            )));
        }
        out.push(("part_size".into(), bytes.to_string()));
    }
    if let Some(n) = pick(
        e.and_then(|e| e.upload_concurrency),
        file.upload_concurrency,
    ) {
        if n == 0 {
            return Err(Error::config("--upload-concurrency must be at least 1."));
        }
        out.push(("upload_concurrency".into(), n.to_string()));
    }
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

    #[test]
    fn csv_null_cannot_hold_what_csv_gives_meaning_to() {
        for ok in ["", "NULL", "\\N", "n/a"] {
            assert!(check_csv_null(ok, b',').is_ok(), "{ok}");
        }
        for bad in [",", "a,b", "\"", "x\ny", "\r"] {
            let e = check_csv_null(bad, b',').unwrap_err();
            assert!(e.to_string().contains("--csv-null"), "{e}");
        }
        assert!(check_csv_null(";", b';').is_err());
        assert!(check_csv_null(";", b',').is_ok());
    }

    fn export_flags(extra: &[&str]) -> Result<Resolved> {
        use clap::Parser;
        let mut argv = vec![
            "sluice",
            "export",
            "--source",
            "mysql://u@h/d",
            "--table",
            "t",
        ];
        argv.extend_from_slice(extra);
        let cli = crate::args::Cli::try_parse_from(argv).unwrap();
        let Some(crate::args::Command::Export(args)) = cli.command else {
            unreachable!("an export command line")
        };
        resolve(&args.select, Some(&args))
    }

    #[test]
    fn mysql_lock_settings() {
        assert!(export_flags(&[]).unwrap().locking.is_none());
        let l = export_flags(&["--lock-wait-timeout", "3", "--long-query-guard", "0"])
            .unwrap()
            .locking
            .unwrap();
        assert_eq!(l.wait_timeout, std::time::Duration::from_secs(3));
        assert_eq!(l.long_query_guard, None);
        let l = export_flags(&["--long-query-wait", "60", "--lock-non-transactional"])
            .unwrap()
            .locking
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
