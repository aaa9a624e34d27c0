//! The `-c` file and the settings laid over it: the file's keys are the flags' names with `_`
//! for `-`:
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
//! others read (`slot`, `target`, …). The merge is generated from the settings' definitions
//! (`settings.rs`); which flags were given is clap's value source. `config.rs` then turns the
//! settings into the engine's job.

use crate::args::{Options, ReplicateOptions, StreamOptions};
use crate::settings::{Given, Settings};
use serde::de::DeserializeOwned;
use sluice_core::{Error, Result};
use std::path::Path;
use yaml_serde::{Mapping, Value};

/// The keys that only `sluice stream` or only `sluice replicate` read: a file shared by the
/// commands holds them, and each command sets aside those of the others.
fn others_keys(own: &[&str]) -> Vec<&'static str> {
    let mut all: Vec<&'static str> = StreamOptions::KEYS
        .iter()
        .chain(ReplicateOptions::KEYS)
        .copied()
        .collect();
    all.sort_unstable();
    all.dedup();
    all.retain(|k| !own.contains(k));
    all
}

/// Read the `-c` file: the export's settings, and those of `T` (a command's own, read apart
/// from the export's). Keys only another command reads (`slot`, `target`, …) are set aside, so
/// one file can serve `export`, `stream` and `replicate`. A file without such keys is read
/// straight from its text, so every error carries its line and column; otherwise the key an
/// error is about is found by its name.
fn load<T: Settings + DeserializeOwned>(path: &Path) -> Result<(Options, T)> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::config(format!(
            "cannot read config file {}: {e}. Check the path given to -c.",
            path.display()
        ))
    })?;
    let file = File { path, text: &text };
    // A file of comments only is no settings, as for the flags' own parse.
    let mut all: Mapping = match yaml_serde::from_str(&text).map_err(|e| file.invalid(&e, None))? {
        Value::Null => Mapping::new(),
        v => yaml_serde::from_value(v).map_err(|e| file.invalid(&e, None))?,
    };
    let mut apart = Mapping::new();
    for key in T::KEYS {
        if let Some(v) = all.remove(*key) {
            apart.insert((*key).into(), v);
        }
    }
    let mut aside = false;
    for key in others_keys(T::KEYS) {
        aside |= all.remove(key).is_some();
    }
    let options = if apart.is_empty() && !aside {
        yaml_serde::from_str(&text).map_err(|e| file.invalid(&e, None))?
    } else {
        file.read::<Options>(all)?
    };
    Ok((options, file.read::<T>(apart)?))
}

/// The `-c` file, to say where in it an error is.
struct File<'a> {
    path: &'a Path,
    text: &'a str,
}

impl File<'_> {
    /// `T` from the keys of the file in `map`.
    fn read<T: DeserializeOwned>(&self, map: Mapping) -> Result<T> {
        yaml_serde::from_value(Value::Mapping(map.clone())).map_err(|e| {
            // A value read apart from the text carries no position: the key is the first
            // that fails alone.
            let key = map.into_iter().find_map(|(k, v)| {
                let alone = Mapping::from_iter([(k.clone(), v)]);
                yaml_serde::from_value::<T>(Value::Mapping(alone))
                    .is_err()
                    .then(|| k.as_str().map(str::to_string))
                    .flatten()
            });
            self.invalid(&e, key.as_deref())
        })
    }

    /// `e`, with its line and column, or the line of `key`, which it is about.
    fn invalid(&self, e: &yaml_serde::Error, key: Option<&str>) -> Error {
        let message = e.to_string();
        // An unknown key is named by the message; a wrong value is prefixed with its key.
        let unknown = message
            .split("unknown field `")
            .nth(1)
            .and_then(|rest| rest.split('`').next());
        let at = e
            .location()
            .map(|l| (l.line(), l.column()))
            .or_else(|| key_line(self.text, unknown.or(key)?).map(|line| (line, 1)))
            .map(|(line, column)| format!(" at line {line} column {column}"))
            .unwrap_or_default();
        let prefix = match key {
            Some(key) if unknown.is_none() => format!("{key}: "),
            _ => String::new(),
        };
        Error::config(format!(
            "config file {} is not valid{at}: {prefix}{message}. Keys are the flag names with _ \
             for - (see sluice export --help).",
            self.path.display()
        ))
    }
}

/// The line of the top-level key `key`.
fn key_line(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}

/// The settings of a run: the `-c` file's, with every setting the caller gave laid over it
/// (`given`: the flags typed on the command line). A flag replaces the file's value (a
/// repeated flag the whole list), except `--storage-option`, which adds to the file's map
/// (later entries win).
pub fn merge(flags: &Options, given: &Given) -> Result<Options> {
    let Some(path) = &flags.config else {
        return Ok(flags.clone());
    };
    let (file, NoOwn {}) = load(path)?;
    Ok(lay_over(flags, file, given))
}

/// [`merge`] for settings given as keywords, of which only the set ones are passed (the
/// Python package's).
pub fn merged(flags: &Options) -> Result<Options> {
    merge(flags, &Given::Set)
}

/// [`merge`] for a command with settings of its own besides [`Options`] (`sluice stream`,
/// `sluice replicate`): the `-c` file's keys of `T` are read into the file's `T`, the others
/// as for export, and `own` (the flags) is laid over it in the same way.
pub fn merge_with<T>(flags: &Options, own: &T, given: &Given) -> Result<(Options, T)>
where
    T: Settings + DeserializeOwned + Clone,
{
    let Some(path) = &flags.config else {
        return Ok((flags.clone(), own.clone()));
    };
    let (file, own_file) = load::<T>(path)?;
    Ok((
        lay_over(flags, file, given),
        own.clone().lay_over(own_file, given),
    ))
}

/// The export's settings `flags` laid over the file's.
fn lay_over(flags: &Options, mut file: Options, given: &Given) -> Options {
    // `--storage-option` adds to the file's map instead of replacing it.
    let file_storage = std::mem::take(&mut file.storage_option);
    let mut options = flags.clone().lay_over(file, given);
    options.storage_option = file_storage
        .into_iter()
        .chain(options.storage_option)
        .collect();
    options
}

/// The settings of a command that has none besides the export's: no keys are set apart.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoOwn {}

impl Settings for NoOwn {
    const KEYS: &'static [&'static str] = &[];
    fn lay_over(self, _: Self, _: &Given) -> Self {
        self
    }
    fn has(&self, _: &str) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command, InitialArg, LogFormat, Pair};
    use crate::size::ByteSize;

    /// The export's (or plan's) settings and the stream's and replication's own, as `argv`
    /// gives them, laid over the file it names.
    fn merged_argv(argv: &[&str]) -> Result<(Options, StreamOptions, ReplicateOptions)> {
        let (cli, given) = Cli::try_parse_given_from(argv).unwrap();
        Ok(match cli.command {
            Some(Command::Export(o)) => {
                (merge(&o, &given)?, Default::default(), Default::default())
            }
            Some(Command::Stream(a)) => {
                let (o, s) = merge_with(&a.options, &a.stream, &given)?;
                (o, s, Default::default())
            }
            Some(Command::Replicate(a)) => {
                let (o, r) = merge_with(&a.options, &a.replicate, &given)?;
                (o, Default::default(), r)
            }
            _ => unreachable!("export, stream or replicate"),
        })
    }

    fn write(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.yaml");
        std::fs::write(&file, text).unwrap();
        let path = file.to_str().unwrap().to_string();
        (dir, path)
    }

    #[test]
    fn a_flag_wins_over_the_file_which_wins_over_the_default() {
        let (_dir, path) = write(
            "source: postgres://u@h/d\ntable: [a, b]\nchunk_size: 4096\nmemory: 1GB\n\
             merge: true\nquery:\n  q: SELECT 1\nstorage_option:\n  region: eu\n\
             log_format: json\nslot: s1\nbatch_bytes: 1MB\nuntil_current: true\n",
        );
        let export = ["sluice", "export", "-c", &path];
        let flags = [
            "--table",
            "c",
            "--memory",
            "32MB",
            "--storage-option",
            "endpoint=http://x",
        ];
        let (o, _, _) = merged_argv(&[&export[..], &flags].concat()).unwrap();
        assert_eq!(o.source.as_deref(), Some("postgres://u@h/d"), "the file's");
        assert_eq!(o.table, ["c"], "a repeated flag replaces the file's list");
        assert_eq!(o.memory.map(ByteSize::bytes), Some(32 << 20), "the flag's");
        assert_eq!(o.chunk_size.map(ByteSize::bytes), Some(4096), "a number");
        assert!(o.merge, "a flag not given leaves the file's true");
        assert_eq!(o.parallel, None, "neither: the default");
        assert_eq!(o.query, [Pair::Entry("q".into(), "SELECT 1".into())]);
        assert_eq!(
            o.storage_option,
            [
                Pair::Entry("region".into(), "eu".into()),
                Pair::Typed("endpoint=http://x".into())
            ],
            "storage options add up, the flags' last"
        );
        assert_eq!(o.log_format, Some(LogFormat::Json));

        // The stream's own settings, the same way; the global --log-format is no setting's.
        let (o, s, _) = merged_argv(&[
            "sluice",
            "--log-format",
            "text",
            "stream",
            "-c",
            &path,
            "--slot",
            "s2",
            "--initial",
            "none",
        ])
        .unwrap();
        assert_eq!(o.log_format, Some(LogFormat::Json), "the file's log_format");
        assert_eq!(s.slot.as_deref(), Some("s2"), "the flag's");
        assert_eq!(
            s.batch_bytes.map(ByteSize::bytes),
            Some(1 << 20),
            "the file's"
        );
        assert_eq!(s.initial, Some(InitialArg::None), "the flag's");
        assert!(s.until_current, "the file's");
        assert_eq!(s.batch_seconds, None, "the default");

        // The file alone; the flags alone.
        let (o, _, _) = merged_argv(&export).unwrap();
        assert_eq!(o.table, ["a", "b"]);
        assert_eq!(o.memory.map(ByteSize::bytes), Some(1 << 30));
        let (o, _, _) = merged_argv(&["sluice", "export", "--table", "t"]).unwrap();
        assert_eq!(
            (o.table, o.source, o.merge),
            (vec!["t".into()], None, false)
        );
    }

    #[test]
    fn keywords_given_are_those_set() {
        let (_dir, path) = write("source: postgres://u@h/d\ntable: a\nmerge: true\nparallel: 3\n");
        let keywords = Options {
            config: Some(path.into()),
            parallel: Some(5),
            ..Options::default()
        };
        let o = merged(&keywords).unwrap();
        assert_eq!(o.parallel, Some(5), "the keyword's");
        assert_eq!(o.table, ["a"], "the file's");
        assert!(o.merge, "a keyword left false is not given");
    }

    #[test]
    fn one_file_serves_export_stream_and_replicate() {
        let shared = "source: postgres://u@h/d\ntable: [a]\nto: ./out\nslot: s1\n\
                      batch_seconds: 5\ntarget: postgres://u@t/d\nmax_grouped: 9\n";
        let (_dir, path) = write(shared);
        let (o, _, _) = merged_argv(&["sluice", "export", "-c", &path]).unwrap();
        assert_eq!(o.table, ["a"]);
        let (o, s, _) = merged_argv(&["sluice", "stream", "-c", &path]).unwrap();
        assert_eq!(o.source.as_deref(), Some("postgres://u@h/d"));
        assert_eq!(
            (s.slot.as_deref(), s.batch_seconds),
            (Some("s1"), Some(5.0))
        );
        let (_, _, r) = merged_argv(&["sluice", "replicate", "-c", &path]).unwrap();
        assert_eq!(r.target.as_deref(), Some("postgres://u@t/d"));
        assert_eq!((r.slot.as_deref(), r.max_grouped), (Some("s1"), Some(9)));

        std::fs::write(&path, format!("{shared}paralell: 3\n")).unwrap();
        for command in ["export", "stream"] {
            let e = merged_argv(&["sluice", command, "-c", &path])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("line 8 column 1") && e.contains("unknown field `paralell`"),
                "{command}: {e}"
            );
        }
        std::fs::write(&path, "# nothing yet\n").unwrap();
        let (o, _, _) = merged_argv(&["sluice", "export", "-c", &path]).unwrap();
        assert!(o.table.is_empty());
    }

    #[test]
    fn a_wrong_value_in_the_file_names_its_key_and_line() {
        // Read from the text (export keys only), and read apart (a stream key in the file).
        for (text, line, key) in [
            ("table: a\nchunk_size: 12XB\n", 2, "chunk_size"),
            ("table: a\nslot: s\nmemory: 0\n", 3, "memory"),
            ("table: a\nbatch_bytes: lots\n", 2, "batch_bytes"),
        ] {
            let (_dir, path) = write(text);
            let e = merged_argv(&["sluice", "stream", "-c", &path])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("at line {line} column"))
                    && e.contains(&format!("{key}: "))
                    && e.contains("is not a size"),
                "{text:?}: {e}"
            );
        }
    }
}
