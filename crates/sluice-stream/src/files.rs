//! Where change files go and what they keep (`--layout`, `--ops`, `--before-images`).
//!
//! ```text
//! flat: <table>/changes/<POS>-<SEQ>.<ext>
//! date: <table>/changes/YYYY/MM/DD/HH/<POS>-<SEQ>.<ext>
//! hive: <table>/changes/dt=YYYY-MM-DD/hr=HH/<POS>-<SEQ>.<ext>
//! ```
//!
//! A batch's files share one partition: the hour (UTC) of the commit time of the batch's first
//! transaction, as the source logged it. With a partitioned layout a batch is cut before a
//! transaction of another hour, so a reader listing one hour's prefix gets exactly that hour's
//! changes. Inside a partition names sort in log order as in the flat layout. A retried batch
//! takes its files' paths from the intent that recorded them (the state), not from a clock,
//! so it rewrites the same names even where the source gave no commit time.

use chrono::{DateTime, Datelike, Timelike, Utc};
use sluice_core::change::ChangeOp;
use sluice_core::{Error, Result};
use sluice_sink::layout::dataset_dir;

/// How change files are laid out under `<table>/changes/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChangeLayout {
    /// All files in `changes/` (the default).
    #[default]
    Flat,
    /// `changes/YYYY/MM/DD/HH/` (the layout of Rigatoni and most S3 sinks).
    Date,
    /// `changes/dt=YYYY-MM-DD/hr=HH/` (Hive-style partitions for Athena, Spark, Trino).
    Hive,
}

impl ChangeLayout {
    /// The partition of a commit at `micros` since 1970 (UTC): `""` for the flat layout,
    /// else the folders with a trailing `/`.
    pub fn partition(self, micros: i64) -> String {
        let t = DateTime::<Utc>::from_timestamp_micros(micros).unwrap_or_default();
        let (y, m, d, h) = (t.year(), t.month(), t.day(), t.hour());
        match self {
            ChangeLayout::Flat => String::new(),
            ChangeLayout::Date => format!("{y:04}/{m:02}/{d:02}/{h:02}/"),
            ChangeLayout::Hive => format!("dt={y:04}-{m:02}-{d:02}/hr={h:02}/"),
        }
    }
}

/// The operations change files keep (`--ops`); the others are counted and left out. Their
/// `_seq` numbers are still taken, so a filtered stream's `_seq` has gaps where they were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpFilter(u8);

const OPS: [ChangeOp; 4] = [
    ChangeOp::Insert,
    ChangeOp::Update,
    ChangeOp::Delete,
    ChangeOp::Truncate,
];

fn bit(op: ChangeOp) -> u8 {
    match op {
        ChangeOp::Insert => 1,
        ChangeOp::Update => 2,
        ChangeOp::Delete => 4,
        ChangeOp::Truncate => 8,
    }
}

impl Default for OpFilter {
    fn default() -> Self {
        OpFilter(15)
    }
}

impl OpFilter {
    /// Parse `insert,update,delete,truncate` (any non-empty subset, in any order).
    pub fn parse(text: &str) -> Result<OpFilter> {
        let mut mask = 0;
        for word in text.split(',').map(str::trim) {
            let op = ChangeOp::parse(&word.to_ascii_lowercase()).ok_or_else(|| {
                Error::config(format!(
                    "--ops {text:?}: {word:?} is not an operation; list some of insert, update, \
                     delete, truncate separated by commas, e.g. --ops insert,update."
                ))
            })?;
            mask |= bit(op);
        }
        Ok(OpFilter(mask))
    }

    /// Whether changes of `op` are written.
    pub fn keeps(self, op: ChangeOp) -> bool {
        self.0 & bit(op) != 0
    }

    /// True when every operation is kept (no filter).
    pub fn all(self) -> bool {
        self == OpFilter::default()
    }

    /// The kept operations, `insert,update,delete,truncate` order.
    pub fn describe(self) -> String {
        OPS.iter()
            .filter(|o| self.keeps(**o))
            .map(|o| o.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// How a stream writes its change files: layout and operations kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChangeFiles {
    /// Folders under `changes/`.
    pub layout: ChangeLayout,
    /// Operations written.
    pub ops: OpFilter,
    /// Write each update's and delete's whole old row as a `_before` struct column
    /// (`--before-images`; the source must log old rows, see
    /// [`sluice_core::change::ChangeSource::check_before_images`]).
    pub before_images: bool,
}

/// The name of a change file whose first change is at `pos`, `_seq` `seq`.
fn file_name(pos: &str, seq: u64, ext: &str) -> String {
    format!("{pos}-{seq:020}.{ext}")
}

/// The path of a dataset's change file: the one `recorded` (an interrupted batch's intent)
/// holds under the same name, else the one in `partition`.
pub(crate) fn change_path(
    dataset: &str,
    partition: &str,
    recorded: &[String],
    pos: &str,
    seq: u64,
    ext: &str,
) -> String {
    let dir = format!("{}/changes/", dataset_dir(dataset));
    let name = file_name(pos, seq, ext);
    recorded
        .iter()
        .find(|f| {
            f.strip_prefix(&dir)
                .and_then(|rest| rest.strip_suffix(&name))
                .is_some_and(|part| part.is_empty() || part.ends_with('/'))
        })
        .cloned()
        .unwrap_or_else(|| format!("{dir}{partition}{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_and_recorded_paths() {
        // 2030-01-02 10:59:59.999999 and one microsecond later.
        let t = 1_893_581_999_999_999;
        assert_eq!(ChangeLayout::Flat.partition(t), "");
        assert_eq!(ChangeLayout::Date.partition(t), "2030/01/02/10/");
        assert_eq!(ChangeLayout::Hive.partition(t + 1), "dt=2030-01-02/hr=11/");
        let p = change_path("s.t", "2030/01/02/10/", &[], "A", 7, "jsonl");
        assert_eq!(p, "s.t/changes/2030/01/02/10/A-00000000000000000007.jsonl");
        // A retry finds the recorded partition whatever the clock says now.
        let rec = vec![
            p.clone(),
            "u.v/changes/x/A-00000000000000000007.jsonl".into(),
        ];
        assert_eq!(
            change_path("s.t", "2031/05/05/05/", &rec, "A", 7, "jsonl"),
            p
        );
        assert_eq!(
            change_path("s.t", "", &rec, "A", 8, "jsonl"),
            "s.t/changes/A-00000000000000000008.jsonl"
        );
    }

    #[test]
    fn ops_parse_and_refuse() {
        let f = OpFilter::parse("update, INSERT").unwrap();
        assert!(f.keeps(ChangeOp::Insert) && !f.keeps(ChangeOp::Delete));
        assert_eq!(f.describe(), "insert,update");
        assert!(OpFilter::default().all());
        let e = OpFilter::parse("insert,upsert").unwrap_err().to_string();
        assert!(e.contains("upsert") && e.contains("--ops"), "{e}");
    }
}
