//! Command-line flags. Every export setting is one field of [`Options`], which is both its flag
//! and its YAML key (the flag's name with `_` for `-`, see `config.rs`); a flag given on the
//! command line overrides the file. `sluice stream` and `sluice replicate` take the same
//! [`Options`] plus their own settings, defined the same way in [`StreamOptions`] and
//! [`ReplicateOptions`]. Each is declared with `declare_settings!` (`settings.rs`), which
//! derives the YAML keys and the merge over the file from the fields.
//!
//! Length: about 640 lines, nearly all flag declarations with their help text; the three
//! commands' options share [`Options`], so splitting them apart would scatter one user-facing
//! list.

use crate::settings::{Given, declare_settings};
use crate::size::ByteSize;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use serde::Deserialize;
use std::path::PathBuf;

/// What a size flag (BYTES) accepts, said once and shown under `export --help` and `plan --help`
/// (the parser is [`ByteSize`]'s).
macro_rules! sizes_note {
    () => {
        "Sizes (BYTES) are a number of bytes, or a number with KB, MB or GB in powers of 1024: \
         1MB = 1024 × 1024 bytes (KiB, MiB, GiB are accepted too)."
    };
}

/// Move data out of relational databases fast, consistently and gently.
#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    // `--version` is ours: with `--verbose` it also prints the commit and what this build reads
    // and writes (see `version.rs`).
    disable_version_flag = true,
    arg_required_else_help = true,
    long_about = "Move data out of relational databases fast, consistently and gently.\n\n\
        sluice exports tables to Parquet or CSV with several workers reading one consistent \
        snapshot, memory bounded by bytes, and a report of what the run cost the source.",
    after_help = "Exit codes: 0 success, 2 bad configuration or usage, 3 source failure, \
        4 destination failure, 5 data that cannot be represented, 130 interrupted, \
        1 internal error.\n\nPasswords may come from the environment (PGPASSWORD, ~/.pgpass, \
        MYSQL_PWD, ISC_PASSWORD) instead of the URL; they never appear in messages, logs, \
        reports or manifests. TLS: ?sslmode=verify-full&sslrootcert=PATH (PostgreSQL, libpq's \
        options and PG* variables), ?ssl-mode=VERIFY_IDENTITY&ssl-ca=PATH (MySQL/MariaDB)."
)]
pub struct Cli {
    /// More log output from every part of sluice (repeat for more); SLUICE_LOG, if set, replaces it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Log lines as text (coloured on a terminal unless NO_COLOR is set) or as JSON, one object per line.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "FORMAT",
        env = "SLUICE_LOG_FORMAT"
    )]
    pub log_format: Option<LogFormat>,
    /// Print the version and commit; with --verbose also the sources, destinations and formats of this build.
    #[arg(short = 'V', long)]
    pub version: bool,
    /// The command.
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// The command line of this process parsed, and which of its command's settings it gave
    /// (to lay over the `-c` file); exits with clap's message on a usage error.
    pub fn parse_given() -> (Cli, Given) {
        Cli::try_parse_given_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// [`Cli::parse_given`] for `argv`.
    pub fn try_parse_given_from<I, T>(argv: I) -> Result<(Cli, Given), clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut cmd = Cli::command();
        let matches = cmd.try_get_matches_from_mut(argv)?;
        let cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
        let globals: Vec<&str> = cmd
            .get_arguments()
            .filter(|a| a.is_global_set())
            .map(|a| a.get_id().as_str())
            .collect();
        let given = match matches.subcommand() {
            Some((_, command)) => Given::command_line(command, &globals),
            None => Given::CommandLine(Vec::new()),
        };
        Ok((cli, given))
    }
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line: timestamp, level, target, message, fields.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Export tables, views or queries to Parquet or CSV files.
    #[command(after_help = EXPORT_EXAMPLES)]
    Export(Box<Options>),
    /// Show what an export would do — sizes, chunks, workers, memory — without reading rows.
    #[command(after_help = sizes_note!())]
    Plan(Box<PlanArgs>),
    /// Capture changes (PostgreSQL logical replication, the MySQL/MariaDB binary log) into batched change files, or Delta tables kept current, after an initial snapshot, without gap or overlap.
    #[command(after_help = STREAM_HELP)]
    Stream(Box<StreamArgs>),
    /// Copy tables into a target database and keep applying their changes in parallel, committed in source order.
    #[command(after_help = REPLICATE_HELP)]
    Replicate(Box<ReplicateArgs>),
    /// Show this build (version, commit, sources, destinations, formats) and check what a run needs.
    Doctor(DoctorArgs),
    /// Print a shell completion script: sluice completions bash > /etc/bash_completion.d/sluice.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), or write one page per command into a directory.
    Man {
        /// Write sluice.1, sluice-export.1, … into this directory instead of printing sluice.1.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

/// `sluice doctor`.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Also connect to this source as an export would (opens a session and a snapshot, reads no rows).
    #[arg(long, value_name = "URL")]
    pub source: Option<String>,
    /// Also check that this output location is writable (created if missing, as an export would).
    #[arg(long, value_name = "DIR|URL")]
    pub to: Option<String>,
    /// With --to: also check what this output format needs there (delta: a table can be created and committed, and the store refuses a second writer of one commit; iceberg: the catalog opens and the namespace exists or can be made).
    #[arg(long, value_enum, value_name = "FORMAT", requires = "to")]
    pub format: Option<FormatArg>,
    /// With --format iceberg: the catalog, as for sluice export.
    #[arg(long, value_name = "URL")]
    pub catalog: Option<String>,
    /// With --format iceberg: the namespace, as for sluice export.
    #[arg(long, value_name = "NAME")]
    pub namespace: Option<String>,
}

const EXPORT_EXAMPLES: &str = concat!(
    "Examples:\n  \
    sluice export --source postgres://app@db:5432/shop --table public.orders --to ./out\n  \
    sluice export --source postgres://app@db/shop --tables 'public\\.order_.*' --format csv --to ./csv\n  \
    sluice export -c sluice.yaml --parallel 4 --resume\n  \
    sluice export --source postgres://app@db/shop --table public.orders --to s3://bucket/exports \\\n    \
    --storage-option endpoint=http://127.0.0.1:9000 --storage-option allow_http=true --part-size 16MB\n\n\
    Output: <to>/<schema>.<table>/part-00000.parquet … and <to>/manifest.json, written last.\n\n",
    sizes_note!()
);

const STREAM_HELP: &str = concat!(
    "Examples:\n  \
    sluice stream --source postgres://app@db/shop --table public.orders --to ./cdc --until-current\n  \
    sluice stream -c stream.yaml --metrics-addr 127.0.0.1:9187\n  \
    sluice stream --source postgres://app@db/shop --table public.orders --to ./cdc --drop\n\n\
    Output: <to>/<schema>.<table>/part-*.parquet (the snapshot) and \
    <to>/<schema>.<table>/changes/<pos>-<seq>.parquet: the table's columns plus _op, _pos, _seq, \
    _commit_ts, _xid and _absent (columns a change does not carry). Replay by _seq. \
    The position is kept in <to>/_sluice/stream.json; run the same command again to continue.\n\n\
    A stopped stream's replication slot keeps WAL on the server until the stream runs again: \
    sluice stream --drop removes the slot and the publication it created.\n\n",
    sizes_note!()
);

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatArg {
    /// Apache Parquet (zstd by default).
    Parquet,
    /// CSV with a header line.
    Csv,
    /// JSON Lines: one JSON object per row.
    Jsonl,
    /// Avro object container files (schema in each file).
    Avro,
    /// A Delta Lake table per dataset (Parquet parts, one table commit at the end; sluice stream: each batch of changes merged into it as one version).
    Delta,
    /// An Apache Iceberg table per dataset in a catalog (--catalog, --namespace): Parquet parts, one snapshot committed at the end (sluice export only).
    Iceberg,
}

/// `--parquet-encodings`: which value encodings Parquet files may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParquetEncodingsArg {
    /// Dictionary, plain and RLE only: read by every Parquet reader (default).
    Compatible,
    /// Integer, date, time and timestamp columns delta-encoded (DELTA_BINARY_PACKED): smaller files written with less CPU, for readers that decode it (Spark 3.3+, DuckDB, pyarrow, Polars, Trino, delta-rs).
    Delta,
}

/// Compression: Parquet zstd, snappy or none; CSV and JSON Lines gzip, zstd or none; Avro
/// deflate, zstd, snappy or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressionArg {
    /// Zstandard (level with --zstd-level).
    Zstd,
    /// Snappy.
    Snappy,
    /// gzip (CSV and JSON Lines).
    Gzip,
    /// Deflate (Avro).
    Deflate,
    /// None.
    None,
}

/// Consistency mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsistencyArg {
    /// One snapshot shared by all workers: the output is one point in time.
    Snapshot,
    /// Each chunk in its own short transaction: less harm, not one point in time.
    Chunk,
    /// Each chunk in its own short transaction, then made one point in time from the change log (PostgreSQL, MySQL, MariaDB; Parquet): rows changed during the run are read again at its end.
    Converged,
}

/// `--harm-budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HarmBudgetArg {
    /// Replica lag 10s, canary p95 50ms, xmin age 15min.
    Gentle,
    /// Replica lag 60s, canary p95 250ms, xmin age 1h.
    Normal,
    /// No signal is read; nothing is governed.
    None,
}

declare_settings! {
/// Every setting of an export, in one definition: each field is a flag (`--chunk-size`) and a
/// YAML key of the `-c` file (`chunk_size`), with the same meaning and the same parser;
/// `config.rs` reads the file into this struct and lays the flags over it. `sluice plan`
/// takes the same settings: the ones about writing (format, sizes, the destination) change
/// the memory it predicts; the others it ignores, as it ignores their YAML keys.
#[derive(Debug, Clone, Default, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Options {
    /// YAML file with the same settings as the flags (flags override it).
    #[arg(short = 'c', long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Source database URL, e.g. postgres://user@host:5432/db?sslmode=verify-full (password: in
    /// the URL, PGPASSWORD or ~/.pgpass).
    #[arg(long, value_name = "URL")]
    pub source: Option<String>,
    /// A table to export, as name or schema.name; double-quote parts to match case exactly. Repeatable.
    #[arg(long, value_name = "NAME")]
    #[serde(deserialize_with = "yaml::one_or_many")]
    pub table: Vec<String>,
    /// Export every table whose schema.table matches this regular expression. Repeatable.
    #[arg(long, value_name = "REGEX")]
    #[serde(deserialize_with = "yaml::one_or_many")]
    pub tables: Vec<String>,
    /// Export every table of this schema. Repeatable.
    #[arg(long, value_name = "SCHEMA")]
    #[serde(deserialize_with = "yaml::one_or_many")]
    pub schema: Vec<String>,
    /// Export the result of a query as dataset NAME: --query 'NAME=SELECT …'. Repeatable.
    #[arg(long, value_name = "NAME=SQL")]
    #[serde(deserialize_with = "yaml::entries")]
    pub query: Vec<Pair>,
    /// Read only these columns of a selected table: --columns 'TABLE:COL,COL' (the table named as with --table; double-quote a part to match it exactly). Repeatable, once per table. sluice stream writes the same columns to change files (the key must be among them).
    #[arg(long, value_name = "TABLE:COLS")]
    #[serde(deserialize_with = "yaml::one_or_many")]
    pub columns: Vec<String>,
    /// How to split datasets: auto, ctid, key, key:<col>[,<col>…], none.
    #[arg(long, value_name = "STRATEGY")]
    pub chunk_by: Option<String>,
    /// Target chunk size in source bytes (e.g. 128MB; default: chosen, 64–256 MB).
    #[arg(long, value_name = "BYTES")]
    pub chunk_size: Option<ByteSize>,
    /// Workers, each with its own connection (default: chosen from table sizes and cores).
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
    /// snapshot (default): one consistent view; chunk: short transactions per chunk.
    #[arg(long, value_enum)]
    pub consistency: Option<ConsistencyArg>,
    /// Memory target for the whole process (default 64MB); batch and row-group sizes are derived from it and the worker count.
    #[arg(long, value_name = "BYTES")]
    pub memory: Option<ByteSize>,
    /// Bytes per Arrow batch, overriding the size derived from --memory; each worker holds two.
    #[arg(long, value_name = "BYTES")]
    pub batch_size: Option<ByteSize>,
    /// Output format.
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// PostgreSQL: export only the rows row-level security policies let this user see, instead of failing on a table whose policies would hide rows (pg_dump's flag of the same name). The manifest marks such datasets as filtered.
    #[arg(long)]
    pub enable_row_security: bool,
    /// Output directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub to: Option<String>,
    /// --format iceberg: the catalog the tables are registered in, an SQL catalog: sqlite:///path/catalog.db or postgres://user@host/db (default: the file catalog.db in --to). Add ?catalog_name=NAME for a catalog other than "sluice".
    #[arg(long, value_name = "URL")]
    pub catalog: Option<String>,
    /// --format iceberg: the catalog namespace of the tables (created when missing); a table is named after its dataset's last part.
    #[arg(long, value_name = "NAME")]
    pub namespace: Option<String>,
    /// Compression: Parquet zstd (default), snappy, none; CSV and JSON Lines gzip, zstd, none (default; files end .csv.gz, .jsonl.zst); Avro zstd (default), deflate, snappy, none.
    #[arg(long, value_enum)]
    pub compression: Option<CompressionArg>,
    /// Zstandard level, 1 (fastest) to 22, for every column (default: 1, and 3 for Parquet's text and binary columns).
    #[arg(long, value_name = "N")]
    pub zstd_level: Option<i32>,
    /// Parquet value encodings: compatible (default: dictionary, plain, RLE, which every reader decodes) or delta (integer, date and timestamp columns DELTA_BINARY_PACKED: smaller, cheaper to write; not for --format iceberg, whose older vectorized Java readers refuse it).
    #[arg(long, value_enum, value_name = "KIND")]
    pub parquet_encodings: Option<ParquetEncodingsArg>,
    /// Parquet row group size in bytes of memory, overriding the size derived from --memory.
    #[arg(long, value_name = "BYTES")]
    pub row_group_size: Option<ByteSize>,
    /// CSV delimiter, one ASCII character (default ,). Use '\t' for tab.
    #[arg(long, value_name = "CHAR")]
    pub csv_delimiter: Option<String>,
    /// Text written for NULL in CSV (default: empty; empty strings are then written as "").
    #[arg(long, value_name = "TEXT")]
    pub csv_null: Option<String>,
    /// Omit the CSV header line.
    #[arg(long)]
    pub csv_no_header: bool,
    /// One file per dataset (<to>/<dataset>.parquet or .csv, parts in order) instead of one per chunk.
    #[arg(long)]
    pub merge: bool,
    /// Finish an interrupted export in --to: only the missing parts are read.
    #[arg(long)]
    pub resume: bool,
    /// Replace an export already in --to.
    #[arg(long, conflicts_with = "resume")]
    pub overwrite: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub report_json: Option<PathBuf>,
    /// Also write the report as a self-contained HTML page (charts of throughput, workers and each harm-budget signal against its limit; no network resources) to this file.
    #[arg(long, value_name = "FILE")]
    pub report_html: Option<PathBuf>,
    /// Harm budget preset: gentle (replica lag 10s, canary p95 50ms, xmin age 15min), normal (60s, 250ms, 1h) or none (no signal is read). The --max-… limits given win over a preset's. Off by default.
    #[arg(long, value_enum, value_name = "PRESET")]
    pub harm_budget: Option<HarmBudgetArg>,
    /// Harm budget: pause new chunks while a replica's replay lag exceeds this DURATION (e.g. 10s); PostgreSQL reads pg_stat_replication, and each --replica directly.
    #[arg(long, value_name = "DURATION")]
    pub max_replica_lag: Option<String>,
    /// Harm budget: keep a canary query's p95 latency (--probe-sql, default a catalog lookup, every 250ms on its own session) under this DURATION (e.g. 20ms).
    #[arg(long, value_name = "DURATION")]
    pub max_latency: Option<String>,
    /// Harm budget: how far the run may hold back VACUUM, as a DURATION (30min) or PostgreSQL transactions (1000000). With --consistency snapshot the run stops before exceeding it; --resume continues under a new snapshot.
    #[arg(long, value_name = "DURATION|XIDS")]
    pub max_xmin_age: Option<String>,
    /// Harm budget: keep other sessions running a statement at most N.
    #[arg(long, value_name = "N")]
    pub max_active: Option<u32>,
    /// Harm budget: a plain cap on the read rate, ROWSrows/s (50000rows/s) or BYTES/s (64MB/s), kept on average between chunks.
    #[arg(long, value_name = "RATE")]
    pub max_rate: Option<String>,
    /// Harm budget: a replica whose replay lag --max-replica-lag bounds (PostgreSQL or MySQL/MariaDB URL; MySQL/MariaDB replicas are read only this way). Repeatable.
    #[arg(long, value_name = "URL")]
    #[serde(deserialize_with = "yaml::one_or_many")]
    pub replica: Vec<String>,
    /// Harm budget: the canary statement --max-latency times (default: a cheap indexed catalog lookup). Use a cheap, indexed query of your own.
    #[arg(long, value_name = "SQL")]
    pub probe_sql: Option<String>,
    /// Skip fsync of written files (faster, not crash-safe).
    #[arg(long)]
    pub no_fsync: bool,
    /// PostgreSQL: the longest the creation of a replication slot (a stream's or replication's first start, a converged export's start and end point) waits for the transactions that were running when it began, e.g. 5min. Default: no limit (they are named after 5s and every 30s); past it the run stops, naming them, and leaves no slot.
    #[arg(long, value_name = "DURATION")]
    pub slot_wait: Option<String>,
    /// MySQL/MariaDB: the longest wait, in seconds, for the global lock that lines the workers' snapshots up (every write on the server may queue behind a waiting lock) and for any metadata lock the run's sessions need (default 10).
    #[arg(long, value_name = "SECONDS")]
    pub lock_wait_timeout: Option<u64>,
    /// MySQL/MariaDB: do not take the global lock while another session's statement that would make it wait has run this many seconds or longer (default 10; 0 turns the guard off).
    #[arg(long, value_name = "SECONDS")]
    pub long_query_guard: Option<u64>,
    /// MySQL/MariaDB: wait up to this many seconds for such long statements to end before refusing (default 0: refuse at once). No lock is held meanwhile.
    #[arg(long, value_name = "SECONDS")]
    pub long_query_wait: Option<u64>,
    /// MySQL/MariaDB: hold READ locks on non-transactional tables (MyISAM, Aria, MEMORY) from the snapshot to the end of the run, so they match the snapshot; writes to them wait meanwhile. Without it they are read as they are and marked outside_snapshot in the manifest.
    #[arg(long)]
    pub lock_non_transactional: bool,
    /// Object stores: bytes per multipart-upload part (default 5MB; S3 needs at least 5MB); each open file holds up to (1 + --upload-concurrency) parts, counted in --memory.
    #[arg(long, value_name = "BYTES")]
    pub part_size: Option<ByteSize>,
    /// Object stores: parts of one file uploading at once (default 2).
    #[arg(long, value_name = "N")]
    pub upload_concurrency: Option<usize>,
    /// Object stores: a client setting as KEY=VALUE, e.g. endpoint=http://127.0.0.1:9000, region=eu-west-1, allow_http=true (the keys of the object_store crate's S3, GCS and Azure builders). Repeatable; wins over the --to URL's query. Values are never printed.
    #[arg(long, value_name = "KEY=VALUE")]
    #[serde(deserialize_with = "yaml::entries")]
    pub storage_option: Vec<Pair>,
    /// The file's log format (the global --log-format flag wins over it; see `main.rs`).
    #[arg(skip)]
    pub log_format: Option<LogFormat>,
}
}

/// `NAME=VALUE` as typed after a flag (`--query`, `--storage-option`), or one entry of the
/// YAML map of the same key. Split, and checked, where it is used, so a malformed flag gets a
/// message that names it (and never echoes a value that may be secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pair {
    /// The text after the flag.
    Typed(String),
    /// A YAML map entry.
    Entry(String, String),
}

impl std::str::FromStr for Pair {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Pair::Typed(s.to_string()))
    }
}

/// How the YAML file spells values the flags spell as text.
pub(crate) mod yaml {
    use super::Pair;
    use serde::{Deserialize, Deserializer};
    use std::collections::BTreeMap;

    /// `key: one` or `key: [one, two]`.
    pub fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        })
    }

    /// A map of names to values.
    pub fn entries<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Pair>, D::Error> {
        let map = BTreeMap::<String, String>::deserialize(d)?;
        Ok(map.into_iter().map(|(k, v)| Pair::Entry(k, v)).collect())
    }
}

/// `sluice plan`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Every setting, as for export.
    #[command(flatten)]
    pub options: Options,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What the stream starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InitialArg {
    /// Export every table under the slot's snapshot first, then stream from exactly there.
    Snapshot,
    /// Stream only changes committed from now on.
    None,
}

/// What a change stream does with a value the export's type cannot hold (`--bad-values`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BadValuesArg {
    /// Stop, naming the table, the column and the value.
    Stop,
    /// Write NULL in its place, warn, and count it in the report.
    Null,
}

impl BadValuesArg {
    /// The library's policy (`None`: the default, stop).
    pub fn policy(arg: Option<BadValuesArg>) -> sluice_core::change::BadValues {
        match arg {
            Some(BadValuesArg::Null) => sluice_core::change::BadValues::Null,
            Some(BadValuesArg::Stop) | None => sluice_core::change::BadValues::Stop,
        }
    }
}

/// What a change stream does when a captured partitioned table's partitions are truncated,
/// detached or dropped (`--partition-changes`): the log does not carry those rows leaving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionChangesArg {
    /// Stop, naming the partition and the fix.
    Stop,
    /// Warn, note it with the table (state, change files' metadata) and go on.
    Keep,
}

impl PartitionChangesArg {
    /// The library's policy (`None`: the default, stop).
    pub fn policy(arg: Option<PartitionChangesArg>) -> sluice_stream::LayoutChanges {
        match arg {
            Some(PartitionChangesArg::Keep) => sluice_stream::LayoutChanges::Keep,
            Some(PartitionChangesArg::Stop) | None => sluice_stream::LayoutChanges::Stop,
        }
    }
}

/// `sluice stream`.
#[derive(Debug, Clone, Args)]
pub struct StreamArgs {
    /// The export's settings: what to capture, how to connect, the output and its format, the
    /// initial snapshot's workers and chunks.
    #[command(flatten)]
    pub options: Options,
    /// The stream's own settings.
    #[command(flatten)]
    pub stream: StreamOptions,
    /// Remove the stream's replication slot, the publication it created and its state, then exit. A stopped stream's slot keeps WAL on the server until this is run.
    #[arg(long)]
    pub drop: bool,
}

declare_settings! {
/// The settings only `sluice stream` has, in one definition like [`Options`]: each field is a
/// flag and a YAML key of the `-c` file.
#[derive(Debug, Clone, Default, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamOptions {
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
    /// Cut a batch when its changes reach this many bytes (default 64MB; with --format delta, a quarter of --memory, at least 4MB).
    #[arg(long, value_name = "BYTES")]
    pub batch_bytes: Option<ByteSize>,
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
    /// MySQL/MariaDB: stream child tables of foreign keys with ON DELETE/UPDATE CASCADE or SET NULL although the binary log leaves out the rows those actions change (their change files then miss them; the state and the files' metadata say so). Refused without it.
    #[arg(long)]
    pub accept_missing_cascades: bool,
    /// stop (default): a changed value the export's type cannot hold (PostgreSQL NaN or Infinity in a numeric(p,s) column) stops the stream, naming it; null: it is written as NULL, warned about and counted in the report.
    #[arg(long, value_enum)]
    pub bad_values: Option<BadValuesArg>,
    /// PostgreSQL: stop (default) when a captured partitioned table's partition is truncated, detached or dropped (the log does not carry those rows leaving); keep: warn, note it with the table and go on.
    #[arg(long, value_enum)]
    pub partition_changes: Option<PartitionChangesArg>,
    /// Change files' folders under <table>/changes/: flat (default), date (YYYY/MM/DD/HH/) or hive (dt=YYYY-MM-DD/hr=HH/), by the commit hour (UTC) of each batch's first transaction.
    #[arg(long, value_enum)]
    pub layout: Option<LayoutArg>,
    /// Write only these operations to change files, e.g. insert,update (default: insert,update,delete,truncate); the others are counted in the report.
    #[arg(long, value_name = "OPS")]
    pub ops: Option<String>,
    /// Wait while another stream holds the state, and take over (from its last committed batch) when it stops or dies: with --state redis://… when its claim expires (claim_ttl after the holder stops refreshing it), with the state in the output when the output's lock is free (local: the holder's process ended; object store: its heartbeat is two minutes old). A holder that lost the state cannot write it any more. Without it a second stream is refused.
    #[arg(long)]
    pub standby: bool,
    /// Write the whole old row of each update and delete in a _before column (a struct in Parquet and Avro, an object in JSON Lines, a JSON object in CSV). PostgreSQL: every captured table (each partition) needs REPLICA IDENTITY FULL; MySQL/MariaDB: binlog_row_image=FULL. Refused, with the fix, otherwise.
    #[arg(long)]
    pub before_images: bool,
    /// --format delta: delete the table's data files that no version of the last DURATION needs (Delta's VACUUM: each merge rewrites files and leaves the old ones for readers of older versions), at the first batch of each run and then hourly. Default 168h (Delta's own retention); off: never. Readers of a version older than DURATION may fail.
    #[arg(long, value_name = "DURATION")]
    pub vacuum_retention: Option<String>,
    /// Look the selection up again every N seconds (default 30; 0: never). A table created on the source that --tables or --schema matches joins the stream with a snapshot of its own (PostgreSQL: added to the publication sluice created), its rows before that point in the snapshot and its changes after it in change files; a captured table dropped there ends with a marker, <table>/_dropped.json.
    #[arg(long, value_name = "SECONDS")]
    pub discover_every: Option<f64>,
}
}

/// Change files' folders (`--layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayoutArg {
    /// All files in <table>/changes/.
    Flat,
    /// <table>/changes/YYYY/MM/DD/HH/.
    Date,
    /// <table>/changes/dt=YYYY-MM-DD/hr=HH/.
    Hive,
}

impl LayoutArg {
    /// The library's layout (`None`: the default, flat).
    pub fn layout(arg: Option<LayoutArg>) -> sluice_stream::ChangeLayout {
        match arg {
            Some(LayoutArg::Date) => sluice_stream::ChangeLayout::Date,
            Some(LayoutArg::Hive) => sluice_stream::ChangeLayout::Hive,
            Some(LayoutArg::Flat) | None => sluice_stream::ChangeLayout::Flat,
        }
    }
}

const REPLICATE_HELP: &str = "\
Examples:
  sluice replicate --source postgres://app@db1/shop --target postgres://copy@db2/shop \\
      --schema public --parallel 8
  sluice replicate --source mysql://repl@db1/shop --target mysql://copy@db2 --tables 'shop\\..*' \\
      --until-current

The target's tables are created when missing (columns, not-null, primary and unique keys;
foreign keys, defaults and triggers are not carried: the report lists them), loaded from a
consistent snapshot with the target's bulk path, then the source's changes are applied on
--parallel sessions: transactions whose keys do not overlap run at once, every commit is in
source order, and the applied position is written in the same target transaction (schema or
database `sluice` on the target), so a restart never applies a transaction twice. Run the same
command again to continue; --drop removes the replication slot and the state.";

/// `sluice replicate`.
#[derive(Debug, Clone, Args)]
pub struct ReplicateArgs {
    /// The export's settings: what to replicate, how to connect, the initial load's workers,
    /// chunks and memory (`--parallel` also sets the apply sessions).
    #[command(flatten)]
    pub options: Options,
    /// The replication's own settings.
    #[command(flatten)]
    pub replicate: ReplicateOptions,
    /// Remove the replication slot, the publication it created and the replication's state on the target, then exit (the target's tables stay).
    #[arg(long)]
    pub drop: bool,
}

declare_settings! {
/// The settings only `sluice replicate` has, each a flag and a YAML key of the `-c` file.
#[derive(Debug, Clone, Default, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicateOptions {
    /// The target database: postgres://… or mysql://… / mariadb://… (TLS and credentials as for sources).
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// The schema (PostgreSQL) or database (MySQL/MariaDB) every table goes into on the target (default: the table's schema on the source; from PostgreSQL into MySQL/MariaDB, the target URL's database).
    #[arg(long, value_name = "NAME")]
    pub target_schema: Option<String>,
    /// snapshot (default): create and load the target's tables first; none: apply changes from now on to tables that already hold the source's rows.
    #[arg(long, value_enum)]
    pub initial: Option<InitialArg>,
    /// The replication's name: the replication slot on PostgreSQL and the key of its state on the target (default: derived from the source, the target, the target schema and the selection, so the same command continues the same replication).
    #[arg(long, value_name = "NAME")]
    pub slot: Option<String>,
    /// Publication name (PostgreSQL; default: the slot's name).
    #[arg(long, value_name = "NAME")]
    pub publication: Option<String>,
    /// MySQL/MariaDB: the replica server id of the binary log session (default: random in 4026531840-4294967294).
    #[arg(long, value_name = "N")]
    pub server_id: Option<u32>,
    /// Stop once everything committed on the source before the command started is applied.
    #[arg(long)]
    pub until_current: bool,
    /// Apply at most N source transactions in one target transaction (default 10000; they are grouped only while every session is busy). Lower it to keep target transactions short.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_grouped: Option<u64>,
    /// stop (default): a changed value the export's type cannot hold (PostgreSQL NaN or Infinity in a numeric(p,s) column) stops the replication, naming it; null: it is applied as NULL, warned about and counted in the report.
    #[arg(long, value_enum)]
    pub bad_values: Option<BadValuesArg>,
    /// PostgreSQL: stop (default) when a captured partitioned table's partition is truncated, detached or dropped (the log does not carry those rows leaving); keep: warn, note it with the table and go on.
    #[arg(long, value_enum)]
    pub partition_changes: Option<PartitionChangesArg>,
    /// Serve Prometheus metrics on HOST:PORT (path /metrics).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Wait while another run applies this replication, and take over (from its last applied position) when it stops or dies. Without it a second run is refused.
    #[arg(long)]
    pub standby: bool,
    /// Hold the apply of new changes while a replica of the target replays more than this DURATION behind it (e.g. 10s); it goes on once every replica is under 70% of it. A PostgreSQL target's replicas are read from its pg_stat_replication, and each --target-replica directly; an unreadable one holds too.
    #[arg(long, value_name = "DURATION")]
    pub max_target_lag: Option<String>,
    /// A replica of the target whose replay lag --max-target-lag bounds (PostgreSQL or MySQL/MariaDB URL; a MySQL/MariaDB target's replicas are read only this way). Repeatable.
    #[arg(long, value_name = "URL")]
    #[serde(deserialize_with = "yaml::one_or_many")]
    pub target_replica: Vec<String>,
}
}
