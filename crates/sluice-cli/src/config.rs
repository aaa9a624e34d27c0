//! The YAML config file and how flags override it, producing the engine's job (for files, or
//! for rows handed to the caller: the Python package's reads). (Past 500 lines with its unit
//! tests, which stay beside the rules they check.)
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
//! whole list). Unknown keys are refused, with their line and column. One file may serve
//! `export`, `stream` and `replicate`: each reads its keys and sets aside the keys only the
//! others read (`slot`, `target`, …).
//!
//! Length: about 420 lines of code plus its unit tests: reading the file and merging it with
//! the flags is one step over the one options definition (args.rs).

use crate::args::{CompressionArg, ConsistencyArg, FormatArg, KEYS, Options, Pair, REPLICATE_KEYS};
use crate::registry;
use sluice_core::{
    ChunkStrategy, Consistency, Error, NamedQuery, QualifiedName, Result, Selection,
};
use sluice_engine::ExportJob;
use sluice_sink::{
    ArrowOutput, Compression, CsvOptions, Destination, FormatOptions, MemoryDestination,
    ParquetOptions,
};
use std::path::Path;
use std::sync::Arc;

/// The keys that only `sluice stream` or only `sluice replicate` read: a file shared by the
/// commands holds them, and each command sets aside those of the others.
fn others_keys(own: &[&str]) -> Vec<&'static str> {
    let mut all: Vec<&'static str> = KEYS.iter().chain(REPLICATE_KEYS).copied().collect();
    all.sort_unstable();
    all.dedup();
    all.retain(|k| !own.contains(k));
    all
}

/// Read the `-c` file: the export's settings, and the keys named in `own` set apart as YAML.
/// Keys only another command reads (`slot`, `target`, …) are set aside, so one file can serve
/// `export`, `stream` and `replicate`. A file without such keys is read straight from its text,
/// so every error carries its line and column; with them, an unknown key's line is found by
/// its name.
fn load(path: &Path, own: &[&str]) -> Result<(Options, yaml_serde::Mapping)> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::config(format!(
            "cannot read config file {}: {e}. Check the path given to -c.",
            path.display()
        ))
    })?;
    let invalid = |e: &yaml_serde::Error| {
        let at = e
            .location()
            .map(|l| (l.line(), l.column()))
            .or_else(|| key_line(&text, &e.to_string()).map(|line| (line, 1)))
            .map(|(line, column)| format!(" at line {line} column {column}"))
            .unwrap_or_default();
        Error::config(format!(
            "config file {} is not valid{at}: {e}. Keys are the flag names with _ for - (see \
             sluice export --help).",
            path.display()
        ))
    };
    // A file of comments only is no settings, as for the flags' own parse.
    let mut all: yaml_serde::Mapping = match yaml_serde::from_str(&text).map_err(|e| invalid(&e))? {
        yaml_serde::Value::Null => yaml_serde::Mapping::new(),
        v => yaml_serde::from_value(v).map_err(|e| invalid(&e))?,
    };
    let mut apart = yaml_serde::Mapping::new();
    for key in own {
        if let Some(v) = all.remove(*key) {
            apart.insert((*key).into(), v);
        }
    }
    let mut aside = false;
    for key in others_keys(own) {
        aside |= all.remove(key).is_some();
    }
    let file = if apart.is_empty() && !aside {
        yaml_serde::from_str(&text)
    } else {
        yaml_serde::from_value(yaml_serde::Value::Mapping(all))
    }
    .map_err(|e| invalid(&e))?;
    Ok((file, apart))
}

/// The line of the top-level key that an "unknown field `KEY`" message names.
fn key_line(text: &str, message: &str) -> Option<usize> {
    let key = message.split("unknown field `").nth(1)?.split('`').next()?;
    text.lines()
        .position(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}

/// The settings of a run: the `-c` file's, with every flag given on the command line laid
/// over it. A flag replaces the file's value (a repeated flag the whole list), except
/// `--storage-option`, which adds to the file's map (later entries win).
pub fn merged(flags: &Options) -> Result<Options> {
    Ok(merged_with_own(flags, &[])?.0)
}

/// [`merged`] for a command with settings of its own besides [`Options`] (`sluice stream`,
/// `sluice replicate`): the `-c` file's keys named in `own` are set apart and returned as YAML,
/// for the command to read into its own settings ([`read_own`]); the others are read as for
/// export.
pub fn merged_with_own(flags: &Options, own: &[&str]) -> Result<(Options, yaml_serde::Mapping)> {
    let Some(path) = &flags.config else {
        return Ok((flags.clone(), yaml_serde::Mapping::new()));
    };
    let (file, apart) = load(path, own)?;
    Ok((flags.clone().over(file), apart))
}

/// Read the keys [`merged_with_own`] set apart into a command's own settings.
pub fn read_own<T: serde::de::DeserializeOwned>(
    own: yaml_serde::Mapping,
    path: Option<&Path>,
) -> Result<T> {
    yaml_serde::from_value(yaml_serde::Value::Mapping(own)).map_err(|e| {
        Error::config(format!(
            "config file {} is not valid: {e}.",
            path.map(|p| p.display().to_string()).unwrap_or_default()
        ))
    })
}

impl Options {
    /// `self` (the flags) laid over `file`.
    fn over(self, file: Options) -> Options {
        fn list<T>(flag: Vec<T>, file: Vec<T>) -> Vec<T> {
            if flag.is_empty() { file } else { flag }
        }
        Options {
            config: self.config,
            source: self.source.or(file.source),
            table: list(self.table, file.table),
            tables: list(self.tables, file.tables),
            schema: list(self.schema, file.schema),
            query: list(self.query, file.query),
            chunk_by: self.chunk_by.or(file.chunk_by),
            chunk_size: self.chunk_size.or(file.chunk_size),
            parallel: self.parallel.or(file.parallel),
            consistency: self.consistency.or(file.consistency),
            memory: self.memory.or(file.memory),
            batch_size: self.batch_size.or(file.batch_size),
            format: self.format.or(file.format),
            enable_row_security: self.enable_row_security || file.enable_row_security,
            to: self.to.or(file.to),
            compression: self.compression.or(file.compression),
            zstd_level: self.zstd_level.or(file.zstd_level),
            row_group_size: self.row_group_size.or(file.row_group_size),
            csv_delimiter: self.csv_delimiter.or(file.csv_delimiter),
            csv_null: self.csv_null.or(file.csv_null),
            csv_no_header: self.csv_no_header || file.csv_no_header,
            merge: self.merge || file.merge,
            resume: self.resume || file.resume,
            overwrite: self.overwrite || file.overwrite,
            report_json: self.report_json.or(file.report_json),
            no_fsync: self.no_fsync || file.no_fsync,
            lock_wait_timeout: self.lock_wait_timeout.or(file.lock_wait_timeout),
            long_query_guard: self.long_query_guard.or(file.long_query_guard),
            long_query_wait: self.long_query_wait.or(file.long_query_wait),
            lock_non_transactional: self.lock_non_transactional || file.lock_non_transactional,
            part_size: self.part_size.or(file.part_size),
            upload_concurrency: self.upload_concurrency.or(file.upload_concurrency),
            storage_option: file
                .storage_option
                .into_iter()
                .chain(self.storage_option)
                .collect(),
            log_format: self.log_format.or(file.log_format),
        }
    }
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
    if selection.is_empty() {
        return Err(Error::config(
            "nothing to export: name tables with --table, --tables (regex) or --schema, or a \
             query with --query.",
        ));
    }
    Ok(selection)
}

/// A size setting, parsed.
fn size(text: &Option<String>, what: &str) -> Result<Option<u64>> {
    text.as_deref().map(|t| parse_size(t, what)).transpose()
}

/// The output format.
fn format(o: &Options) -> Result<FormatOptions> {
    Ok(match o.format.unwrap_or(FormatArg::Parquet) {
        FormatArg::Parquet => {
            let level = o.zstd_level.unwrap_or(1);
            let row_group_bytes = size(&o.row_group_size, "--row-group-size")?;
            FormatOptions::Parquet(ParquetOptions {
                compression: match o.compression.unwrap_or(CompressionArg::Zstd) {
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
                row_group_bytes: row_group_bytes
                    .map(|b| b as usize)
                    .unwrap_or(ParquetOptions::default().row_group_bytes),
            })
        }
        FormatArg::Csv => {
            let delimiter = match &o.csv_delimiter {
                Some(d) => parse_delimiter(d)?,
                None => b',',
            };
            let null = o.csv_null.clone().unwrap_or_default();
            check_csv_null(&null, delimiter)?;
            FormatOptions::Csv(CsvOptions {
                delimiter,
                null,
                header: !o.csv_no_header,
            })
        }
    })
}

/// The job `o` describes, its source and destination opened (no connection yet). `need_to`:
/// fail without `--to` (an export; `sluice plan` plans for the current directory then).
/// Settings are checked in the order the user reads them, each error naming its flag.
pub fn job(o: &Options, need_to: bool) -> Result<ExportJob> {
    build(o, Output::Files { need_to })
}

/// The job `o` describes with its rows handed to `consumer` in this process instead of
/// written to files (the Python package's reads): the same source, selection, consistency,
/// chunking and memory settings as [`job`], checked the same way; the settings about files
/// are refused, naming each, rather than ignored.
pub fn memory_job(o: &Options, consumer: ArrowOutput) -> Result<ExportJob> {
    let file_settings: Vec<&str> = [
        ("to", o.to.is_some()),
        ("format", o.format.is_some()),
        ("compression", o.compression.is_some()),
        ("zstd_level", o.zstd_level.is_some()),
        ("row_group_size", o.row_group_size.is_some()),
        ("csv_delimiter", o.csv_delimiter.is_some()),
        ("csv_null", o.csv_null.is_some()),
        ("csv_no_header", o.csv_no_header),
        ("merge", o.merge),
        ("resume", o.resume),
        ("overwrite", o.overwrite),
        ("report_json", o.report_json.is_some()),
        ("no_fsync", o.no_fsync),
        ("part_size", o.part_size.is_some()),
        ("upload_concurrency", o.upload_concurrency.is_some()),
        ("storage_option", !o.storage_option.is_empty()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
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
    let chunk_bytes = size(&o.chunk_size, "--chunk-size")?;
    if o.parallel == Some(0) {
        return Err(Error::config("--parallel must be at least 1."));
    }
    let consistency = match o.consistency {
        Some(ConsistencyArg::Chunk) => Consistency::Chunk,
        _ => Consistency::Snapshot,
    };
    let memory = size(&o.memory, "--memory")?.unwrap_or(sluice_engine::DEFAULT_MEMORY);
    if memory < 16 << 20 {
        return Err(Error::config(format!(
            "--memory {memory} bytes is too small to run: give at least 16MB."
        )));
    }
    let batch_bytes = size(&o.batch_size, "--batch-size")?.map(|b| b as usize);
    let format = match &output {
        Output::Files { .. } => format(o)?,
        Output::Memory(consumer) => FormatOptions::Arrow(consumer.clone()),
    };
    let row_group_bytes = size(&o.row_group_size, "--row-group-size")?.map(|b| b as usize);
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
    Ok(job)
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
    if let Some(size) = &o.part_size {
        let bytes = parse_size(size, "--part-size")?;
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

    fn export_flags(extra: &[&str]) -> Result<Option<sluice_mysql::Locking>> {
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
        let o = merged(&args)?;
        let consistency = match o.consistency {
            Some(ConsistencyArg::Chunk) => Consistency::Chunk,
            _ => Consistency::Snapshot,
        };
        locking(&o, consistency)
    }

    #[test]
    fn one_file_serves_export_stream_and_replicate() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.yaml");
        let path = file.to_str().unwrap();
        let shared = "source: postgres://u@h/d\ntable: [a]\nto: ./out\nslot: s1\n\
                      batch_seconds: 5\ntarget: postgres://u@t/d\nmax_grouped: 9\n";
        std::fs::write(&file, shared).unwrap();
        let flags = |argv: &[&str]| crate::args::Cli::try_parse_from(argv).unwrap().command;
        let Some(crate::args::Command::Export(export)) = flags(&["sluice", "export", "-c", path])
        else {
            unreachable!("an export command line")
        };
        let o = merged(&export).unwrap();
        assert_eq!(o.table, ["a"]);
        let (o, own) = merged_with_own(&export, KEYS).unwrap();
        assert_eq!(o.source.as_deref(), Some("postgres://u@h/d"));
        assert_eq!(
            own.len(),
            2,
            "slot and batch_seconds are the stream's: {own:?}"
        );
        let (_, own) = merged_with_own(&export, REPLICATE_KEYS).unwrap();
        assert_eq!(own.len(), 3, "target, max_grouped and slot: {own:?}");

        std::fs::write(&file, format!("{shared}paralell: 3\n")).unwrap();
        let e = merged(&export).unwrap_err().to_string();
        assert!(
            e.contains("line 8 column 1") && e.contains("unknown field `paralell`"),
            "{e}"
        );
        std::fs::write(&file, "# nothing yet\n").unwrap();
        assert!(merged(&export).unwrap().table.is_empty());
    }

    #[test]
    fn flags_lay_over_the_file_key_by_key() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.yaml");
        std::fs::write(
            &file,
            "source: postgres://u@h/d\ntable: [a, b]\nchunk_size: 4096\nmerge: true\n\
             query:\n  q: SELECT 1\nstorage_option:\n  region: eu\nlog_format: json\n",
        )
        .unwrap();
        let cli = crate::args::Cli::try_parse_from([
            "sluice",
            "export",
            "-c",
            file.to_str().unwrap(),
            "--table",
            "c",
            "--memory",
            "32MB",
            "--storage-option",
            "endpoint=http://x",
        ])
        .unwrap();
        let Some(crate::args::Command::Export(flags)) = cli.command else {
            unreachable!("an export command line")
        };
        let o = merged(&flags).unwrap();
        assert_eq!(o.source.as_deref(), Some("postgres://u@h/d"));
        assert_eq!(o.table, ["c"], "a repeated flag replaces the file's list");
        assert_eq!(o.chunk_size.as_deref(), Some("4096"), "a number is a size");
        assert_eq!(o.memory.as_deref(), Some("32MB"));
        assert!(o.merge);
        assert_eq!(o.query, [Pair::Entry("q".into(), "SELECT 1".into())]);
        assert_eq!(
            o.storage_option,
            [
                Pair::Entry("region".into(), "eu".into()),
                Pair::Typed("endpoint=http://x".into())
            ],
            "storage options add up, the flags' last"
        );
        assert_eq!(o.log_format, Some(crate::args::LogFormat::Json));
        let sel = selection(&o).unwrap();
        assert_eq!(sel.queries[0].sql, "SELECT 1");
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
