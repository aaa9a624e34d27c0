//! The Python package's keyword arguments (`python/sluice/__init__.py` and its stub
//! `__init__.pyi`) are the export's settings ([`Options`]'s YAML keys, which the package's
//! native module deserializes them into): an option added to one side only fails here.

use crate::args::Options;
use crate::config::FILE_SETTINGS;
use crate::settings::Settings;
use std::collections::BTreeSet;
use std::path::Path;

/// The package's functions, each taking the export's settings as keywords.
const FUNCTIONS: [&str; 4] = ["read_arrow", "read_batches", "export", "plan"];

/// Settings that are no keyword of any function: the file's log format is the command line's.
const NOT_KEYWORDS: &[&str] = &["log_format"];

/// The settings about files `plan` takes: they change its parts or the memory it predicts.
const PLANNED_FILE_SETTINGS: &[&str] = &[
    "to",
    "format",
    "row_group_size",
    "part_size",
    "upload_concurrency",
    "storage_option",
];

/// Settings `plan` leaves out besides the other settings about files: they change neither
/// the plan nor its memory.
const NOT_PLANNED: &[&str] = &[
    "slot_wait",
    "lock_wait_timeout",
    "long_query_guard",
    "long_query_wait",
    "lock_non_transactional",
];

/// Settings a read leaves out besides those about files: a read names one table or query, and
/// makes no replication slot.
const NOT_READ: &[&str] = &["tables", "schema", "slot_wait"];

/// The parameters of every top-level public function in the Python source `text`.
fn signatures(text: &str) -> Vec<(String, BTreeSet<String>)> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .strip_prefix("def ")
            .and_then(|rest| rest.split('(').next())
            .filter(|name| !name.starts_with('_'))
        else {
            continue;
        };
        let params = lines
            .by_ref()
            .take_while(|l| !l.starts_with(')'))
            .filter_map(|l| l.trim().split(':').next())
            .filter(|p| p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        out.push((name.to_string(), params));
    }
    out
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// What `function` should take: the settings, less those it leaves out.
fn expected(function: &str) -> BTreeSet<String> {
    let settings = &names(Options::KEYS) - &names(NOT_KEYWORDS);
    match function {
        "export" => settings,
        "plan" => {
            let unplanned_files = &names(FILE_SETTINGS) - &names(PLANNED_FILE_SETTINGS);
            &(&settings - &unplanned_files) - &names(NOT_PLANNED)
        }
        _ => &(&settings - &names(FILE_SETTINGS)) - &names(NOT_READ),
    }
}

#[test]
fn the_python_keywords_are_the_cli_settings() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/sluice");
    for file in ["__init__.py", "__init__.pyi"] {
        let text = std::fs::read_to_string(python.join(file)).unwrap();
        let found = signatures(&text);
        let functions: Vec<&str> = found.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(functions, FUNCTIONS, "{file}'s public functions");
        for (function, params) in &found {
            let want = expected(function);
            let only_python: Vec<_> = params.difference(&want).collect();
            let only_cli: Vec<_> = want.difference(params).collect();
            assert!(
                only_python.is_empty() && only_cli.is_empty(),
                "{file} {function}(): keywords that are no CLI setting: {only_python:?}; CLI \
                 settings that are no keyword: {only_cli:?} (a setting a function leaves out \
                 belongs in this test's lists of those)"
            );
        }
    }
}

#[test]
fn the_lists_of_settings_left_out_name_settings() {
    for list in [
        FILE_SETTINGS,
        NOT_KEYWORDS,
        PLANNED_FILE_SETTINGS,
        NOT_PLANNED,
        NOT_READ,
    ] {
        for key in list {
            assert!(Options::KEYS.contains(key), "{key} is no setting");
        }
    }
}
