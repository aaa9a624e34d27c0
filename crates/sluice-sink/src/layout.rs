//! Names of things in the output.
//!
//! ```text
//! <to>/manifest.json                       written last: the dataset is complete
//! <to>/<dataset>/part-00000.parquet        one file per chunk
//! <to>/<dataset>/.part-00001.parquet.<nonce>.tmp   being written (hidden)
//! <to>/_sluice/run.json                    the plan of the run, for --resume
//! <to>/_sluice/parts/<dataset>/part-00000.json     receipt: the part is committed
//! <to>/_sluice/lock.json                   who is writing the output now
//! ```
//! Names starting with `.` or `_` are ignored by Spark, Hive, DuckDB and pyarrow datasets, so
//! a reader globbing `*.parquet` never picks up bookkeeping or half-written files.

/// The manifest's path.
pub const MANIFEST: &str = "manifest.json";
/// The run plan's path.
pub const RUN_STATE: &str = "_sluice/run.json";
/// Where part receipts live.
pub const RECEIPTS: &str = "_sluice/parts";
/// The output's lock: held by the run writing the output, and says who that is.
pub const LOCK: &str = "_sluice/lock.json";

/// A dataset name made safe as one path segment: `/`, `\`, `%` and control characters are
/// percent-encoded, and a leading `.` or `_` (which would hide it) too.
pub fn dataset_dir(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, c) in name.chars().enumerate() {
        let hide = i == 0 && (c == '.' || c == '_');
        if hide || matches!(c, '/' | '\\' | '%') || c.is_control() {
            let mut b = [0u8; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `part-00042.<ext>`.
pub fn part_file(ordinal: u32, extension: &str) -> String {
    format!("part-{ordinal:05}.{extension}")
}

/// `<dataset>/part-00042.<ext>`.
pub fn part_path(dataset: &str, ordinal: u32, extension: &str) -> String {
    format!("{}/{}", dataset_dir(dataset), part_file(ordinal, extension))
}

/// `<dataset>/part-00042-<tag>.parquet`: a part of a table format's export. The directory is
/// the table, whose earlier versions still reference the parts of earlier exports: the tag
/// (the export's run id) keeps this export's names from replacing theirs before its commit.
pub fn table_part_path(dataset: &str, ordinal: u32, tag: &str) -> String {
    format!("{}/part-{ordinal:05}-{tag}.parquet", dataset_dir(dataset))
}

/// The directory of a table format's log inside a dataset's directory (Delta's `_delta_log`).
pub const TABLE_LOG: &str = "_delta_log";

/// True for a file of a dataset directory that sluice's bookkeeping may remove: every file of
/// a file format's directory; of a table's directory only hidden temporaries and the parts
/// named with `tag` (this export's), never the table's log or the parts of earlier versions.
pub fn owned_by_export(path: &str, table_tag: Option<Option<&str>>) -> bool {
    let Some(tag) = table_tag else {
        return true;
    };
    if path.split('/').any(|s| s == TABLE_LOG) {
        return false;
    }
    is_temporary(path)
        || tag.is_some_and(|t| {
            path.rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with("part-") && f.ends_with(&format!("-{t}.parquet")))
        })
}

/// `<dataset>.<ext>`: the single file of a merged dataset.
pub fn merged_path(dataset: &str, extension: &str) -> String {
    format!("{}.{extension}", dataset_dir(dataset))
}

/// The receipt of a part.
pub fn receipt_path(dataset: &str, ordinal: u32) -> String {
    format!("{RECEIPTS}/{}/part-{ordinal:05}.json", dataset_dir(dataset))
}

/// True for hidden temporaries left by an interrupted write.
pub fn is_temporary(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|f| f.starts_with('.') && f.ends_with(".tmp"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tables_log_and_earlier_versions_are_never_the_exports() {
        let files = |p: &str| owned_by_export(p, None);
        assert!(files("public.t/part-00000.parquet") && files("public.t/_delta_log/x.json"));
        let this = |p: &str| owned_by_export(p, Some(Some("abc")));
        assert!(this("public.t/part-00003-abc.parquet"));
        assert!(this("public.t/.part-00003-abc.parquet.x1.tmp"));
        assert!(
            !this("public.t/part-00003-old.parquet"),
            "an earlier version's part"
        );
        assert!(!this("public.t/_delta_log/00000000000000000000.json"));
        assert!(!this("public.t/_delta_log/.0.json.tmp"));
        let none = |p: &str| owned_by_export(p, Some(None));
        assert!(none("public.t/.part-00000-x.parquet.n.tmp"));
        assert!(!none("public.t/part-00000-abc.parquet"));
        assert_eq!(
            table_part_path("public.t", 7, "abc"),
            "public.t/part-00007-abc.parquet"
        );
    }

    #[test]
    fn names_are_safe_segments() {
        assert_eq!(dataset_dir("public.orders"), "public.orders");
        assert_eq!(dataset_dir("a/b"), "a%2Fb");
        assert_eq!(dataset_dir(".hidden"), "%2Ehidden");
        assert_eq!(
            dataset_dir("public.weird \"name\""),
            "public.weird \"name\""
        );
        assert_eq!(part_path("s.t", 42, "csv"), "s.t/part-00042.csv");
        assert!(is_temporary("s.t/.part-00001.parquet.0123456789abcdef.tmp"));
        assert!(!is_temporary("s.t/part-00001.parquet"));
    }
}
