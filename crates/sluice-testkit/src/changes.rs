//! Replaying change files over a snapshot, as a warehouse MERGE would, with strict checks: the
//! common proof of every change-capture test (PostgreSQL, MySQL/MariaDB, and the replicator).
//!
//! Rows are compared as text (Arrow's display form, NULL as `∅`), like
//! [`crate::files::row_strings`]. Replay by `_seq`:
//! - `insert` adds a row; a key that is already there is an **overlap** (a change the snapshot
//!   already holds, or a change written twice) and panics;
//! - `update` changes the row in place, keeping the columns listed in `_absent`; a missing row is
//!   a **gap** and panics;
//! - `delete` removes the row of the change's key; a missing row is a gap and panics;
//! - with before-images (`_before`), an update or a delete finds its row by its before-image
//!   (after checking the image equals the row), so a table replayed by every column (one
//!   without a key) replays too;
//! - `truncate` removes every row;
//! - an `insert` right after a `delete` (a key update) takes its `_absent` columns from the
//!   deleted row.
//!
//! A `_seq` seen twice panics too: no change may be visible twice.

use crate::files::{parquet_batches, part_files};
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{Array, RecordBatch};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One change read back.
#[derive(Debug, Clone)]
pub struct Change {
    /// `_seq`.
    pub seq: u64,
    /// `_op`.
    pub op: String,
    /// `_pos`.
    pub pos: String,
    /// The table's columns as text (NULL as `∅`).
    pub cells: Vec<String>,
    /// Their names (the columns of the change's schema version).
    pub columns: Arc<Vec<String>>,
    /// `_absent`.
    pub absent: Vec<String>,
    /// `_before` (`--before-images`): the old row's cells, in the order of `columns`; `None`
    /// where the change has none (or the files carry no before-images).
    pub before: Option<Vec<String>>,
}

/// What a replay produced.
#[derive(Debug, Default)]
pub struct Replayed {
    /// The table's column names.
    pub columns: Vec<String>,
    /// The rows after replay, `v1|v2|…`, sorted.
    pub rows: Vec<String>,
    /// Every change, in `_seq` order.
    pub changes: Vec<Change>,
}

impl Replayed {
    /// How many key updates the files hold that `also` accepts: a delete followed by the
    /// insert of the same source change (consecutive `_seq`, one `_pos`), the shape a change
    /// of a row's key (or a move between partitions) is written in.
    pub fn key_updates(&self, also: impl Fn(&Change, &Change) -> bool) -> usize {
        self.changes
            .windows(2)
            .filter(|w| {
                w[0].op == "delete"
                    && w[1].op == "insert"
                    && w[0].seq + 1 == w[1].seq
                    && w[0].pos == w[1].pos
                    && also(&w[0], &w[1])
            })
            .count()
    }
}

fn cells(b: &RecordBatch, r: usize, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let c = crate::files::displayable(b.column(i));
            if c.is_null(r) {
                "∅".to_string()
            } else {
                arrow_cast::display::ArrayFormatter::try_new(c.as_ref(), &Default::default())
                    .expect("formatter")
                    .value(r)
                    .to_string()
            }
        })
        .collect()
}

/// The change files (Parquet or JSON Lines, compressed or not) of a dataset directory, in
/// any partition of any layout, in path order (hidden temporaries excluded).
pub fn change_files(dataset_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dataset_dir.join("changes")];
    while let Some(dir) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for p in rd.filter_map(|e| e.ok().map(|e| e.path())) {
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                !n.starts_with('.')
                    && (n.ends_with(".parquet")
                        || n.ends_with(".jsonl")
                        || n.ends_with(".jsonl.gz")
                        || n.ends_with(".jsonl.zst"))
            }) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A JSON value as the text [`cells`] gives the same Arrow value, for the plain types replay
/// tests use (numbers, text, booleans); NULL as `∅`.
fn json_cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "∅".into(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The changes of a JSON Lines change file.
fn jsonl_changes(path: &Path, columns: &mut Vec<String>, out: &mut Vec<Change>) {
    for row in crate::formats::jsonl_rows(path) {
        let n = row
            .iter()
            .position(|(k, _)| k == "_op")
            .expect("a change has _op");
        *columns = row[..n].iter().map(|(k, _)| k.clone()).collect();
        let field = |name: &str| &row.iter().find(|(k, _)| k == name).expect(name).1;
        out.push(Change {
            seq: field("_seq").as_u64().expect("_seq is a number"),
            op: json_cell(field("_op")),
            pos: json_cell(field("_pos")),
            cells: row[..n].iter().map(|(_, v)| json_cell(v)).collect(),
            columns: Arc::new(columns.clone()),
            absent: field("_absent")
                .as_array()
                .map(|a| a.iter().map(json_cell).collect())
                .unwrap_or_default(),
            before: row
                .iter()
                .find(|(k, _)| k == "_before")
                .and_then(|(_, v)| v.as_object())
                .map(|old| {
                    columns
                        .iter()
                        .map(|c| json_cell(old.get(c).expect("_before has every column")))
                        .collect()
                }),
        });
    }
}

/// Every change of a dataset directory, sorted by `_seq` (duplicates kept, for the caller to
/// see).
pub fn read_changes(dataset_dir: &Path) -> (Vec<String>, Vec<Change>) {
    let mut columns = Vec::new();
    let mut out = Vec::new();
    for f in change_files(dataset_dir) {
        if !f.to_string_lossy().ends_with(".parquet") {
            jsonl_changes(&f, &mut columns, &mut out);
            continue;
        }
        for b in parquet_batches(&f) {
            let schema = b.schema();
            let n = schema
                .fields()
                .iter()
                .position(|f| f.name() == "_op")
                .expect("a change file has _op");
            columns = schema.fields()[..n]
                .iter()
                .map(|f| f.name().clone())
                .collect();
            let names = Arc::new(columns.clone());
            let op = b.column(n).as_string::<i32>();
            let pos = b.column(n + 1).as_string::<i32>();
            let seq = b.column(n + 2).as_primitive::<UInt64Type>();
            let absent = b.column(n + 5).as_list::<i32>();
            let before = b.column_by_name("_before").map(|c| {
                let s = c.as_struct();
                let fields = s.fields().clone();
                let schema = Arc::new(arrow_schema::Schema::new(fields));
                RecordBatch::try_new(schema, s.columns().to_vec()).expect("the old rows")
            });
            for r in 0..b.num_rows() {
                let a = absent.value(r);
                let a = a.as_string::<i32>();
                out.push(Change {
                    seq: seq.value(r),
                    op: op.value(r).to_string(),
                    pos: pos.value(r).to_string(),
                    cells: cells(&b, r, n),
                    columns: names.clone(),
                    absent: (0..a.len()).map(|i| a.value(i).to_string()).collect(),
                    before: before.as_ref().and_then(|old| {
                        let valid = b.column_by_name("_before").is_some_and(|c| c.is_valid(r));
                        valid.then(|| cells(old, r, n))
                    }),
                });
            }
        }
    }
    out.sort_by_key(|c| c.seq);
    (columns, out)
}

/// The key text of a row's cells.
fn key_of(key_idx: &[usize], cells: &[String]) -> String {
    key_idx
        .iter()
        .map(|i| cells[*i].as_str())
        .collect::<Vec<_>>()
        .join("|")
}

/// Replay the change files of `dataset_dir` over its snapshot parts (Parquet, or JSON Lines when
/// there is no Parquet part), keyed by the
/// columns `key`. Panics on a repeated `_seq`, an overlap or a gap (see the module doc).
pub fn replay(dataset_dir: &Path, key: &[&str]) -> Replayed {
    let mut table: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let snapshot: Vec<RecordBatch> = part_files(dataset_dir, "parquet")
        .iter()
        .flat_map(|p| parquet_batches(p))
        .collect();
    let mut columns: Vec<String> = snapshot
        .first()
        .map(|b| {
            b.schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect()
        })
        .unwrap_or_default();
    let (change_columns, changes) = read_changes(dataset_dir);
    if columns.is_empty() {
        columns = change_columns;
    }
    let mut rows: Vec<Vec<String>> = snapshot
        .iter()
        .flat_map(|b| (0..b.num_rows()).map(|r| cells(b, r, columns.len())))
        .collect();
    if snapshot.is_empty() {
        // A snapshot written as JSON Lines (the stream's --format jsonl).
        for ext in ["jsonl", "jsonl.gz", "jsonl.zst"] {
            for p in part_files(dataset_dir, ext) {
                for row in crate::formats::jsonl_rows(&p) {
                    if columns.is_empty() {
                        columns = row.iter().map(|(k, _)| k.clone()).collect();
                    }
                    rows.push(row.iter().map(|(_, v)| json_cell(v)).collect());
                }
            }
        }
    }
    let key_idx: Vec<usize> = key
        .iter()
        .map(|k| {
            columns
                .iter()
                .position(|c| c == k)
                .unwrap_or_else(|| panic!("no key column {k} in {columns:?}"))
        })
        .collect();
    for c in rows {
        let k = key_of(&key_idx, &c);
        assert!(
            table.insert(k.clone(), c).is_none(),
            "the snapshot holds key {k} twice"
        );
    }
    let mut last_seq = None;
    let mut deleted: Option<(u64, Vec<String>)> = None;
    for ch in &changes {
        assert!(
            last_seq.is_none_or(|l| ch.seq > l),
            "_seq {} is written more than once",
            ch.seq
        );
        last_seq = Some(ch.seq);
        // A schema version with a new column: every row so far has it NULL.
        for c in ch.columns.iter() {
            if !columns.contains(c) {
                columns.push(c.clone());
                table.values_mut().for_each(|r| r.push("∅".into()));
                if let Some((_, d)) = deleted.as_mut() {
                    d.push("∅".into());
                }
            }
        }
        // The change's cells laid out over every column seen (a dropped column stays NULL).
        let mut full = vec!["∅".to_string(); columns.len()];
        for (name, v) in ch.columns.iter().zip(&ch.cells) {
            let i = columns
                .iter()
                .position(|c| c == name)
                .expect("known column");
            full[i] = v.clone();
        }
        let absent: Vec<usize> = ch
            .absent
            .iter()
            .map(|a| columns.iter().position(|c| c == a).expect("absent column"))
            .collect();
        let kept = |i: usize| absent.contains(&i) || !ch.columns.contains(&columns[i]);
        let k = key_of(&key_idx, &full);
        // The row an update or a delete changes: where its before-image says (a table whose
        // replay key is not a key of the source's, e.g. every column of a table without one),
        // else where its key is.
        let mut at = k.clone();
        if let Some(old) = &ch.before {
            // A before-image is the row as the changes so far left it.
            let mut old_full = vec!["∅".to_string(); columns.len()];
            for (name, v) in ch.columns.iter().zip(old) {
                let i = columns
                    .iter()
                    .position(|c| c == name)
                    .expect("known column");
                old_full[i] = v.clone();
            }
            let old_key = key_of(&key_idx, &old_full);
            at = old_key.clone();
            let now = table.get(&old_key).unwrap_or_else(|| {
                panic!(
                    "{} _seq {} has the before-image {old:?} of key {old_key}, which is not there",
                    ch.op, ch.seq
                )
            });
            for name in ch.columns.iter() {
                let i = columns
                    .iter()
                    .position(|c| c == name)
                    .expect("known column");
                assert_eq!(
                    old_full[i], now[i],
                    "{} _seq {} (pos {}): the before-image's {name} differs from the row the \
                     changes so far left",
                    ch.op, ch.seq, ch.pos
                );
            }
        }
        match ch.op.as_str() {
            "insert" => {
                let mut row = full.clone();
                if !absent.is_empty() {
                    let (s, old) = deleted
                        .as_ref()
                        .filter(|(s, _)| *s + 1 == ch.seq)
                        .unwrap_or_else(|| {
                            panic!("insert {} has absent columns but follows no delete", ch.seq)
                        });
                    assert_eq!(*s + 1, ch.seq);
                    for i in &absent {
                        row[*i] = old[*i].clone();
                    }
                }
                assert!(
                    table.insert(k.clone(), row).is_none(),
                    "insert _seq {} (pos {}) of key {k}, which is already there: a change \
                     written twice or already in the snapshot",
                    ch.seq,
                    ch.pos
                );
            }
            "update" => {
                let mut row = table.remove(&at).unwrap_or_else(|| {
                    panic!(
                        "update _seq {} (pos {}) of key {at}, which is not there: a change is \
                         missing",
                        ch.seq, ch.pos
                    )
                });
                for (i, v) in full.iter().enumerate() {
                    if !kept(i) {
                        row[i] = v.clone();
                    }
                }
                assert!(
                    table.insert(key_of(&key_idx, &row), row).is_none(),
                    "update _seq {} (pos {}) makes a row equal to another one under the \
                     replay's key",
                    ch.seq,
                    ch.pos
                );
            }
            "delete" => {
                let old = table.remove(&at).unwrap_or_else(|| {
                    panic!(
                        "delete _seq {} (pos {}) of key {at}, which is not there: a change is \
                         missing",
                        ch.seq, ch.pos
                    )
                });
                deleted = Some((ch.seq, old));
            }
            "truncate" => table.clear(),
            other => panic!("unknown _op {other}"),
        }
    }
    let mut rows: Vec<String> = table.into_values().map(|c| c.join("|")).collect();
    rows.sort();
    Replayed {
        columns,
        rows,
        changes,
    }
}

/// Replay the change files of dataset `dataset` in the stream output `to` keyed by `key`, and
/// compare the rows with `want` (the source table as its server reads it now, sorted `v1|v2|…`
/// strings): the one proof every change-capture test ends with. On a difference, the changes
/// that touched the differing rows, the change files and the stream's state are printed before
/// the assertion fails, since a replay failure is hard to read from the rows alone.
pub fn assert_replay_equals(to: &Path, dataset: &str, key: &[&str], want: &[String]) -> Replayed {
    let dir = to.join(dataset);
    let r = replay(&dir, key);
    if r.rows != want {
        let got: std::collections::BTreeSet<&String> = r.rows.iter().collect();
        let w: std::collections::BTreeSet<&String> = want.iter().collect();
        for row in w.difference(&got).chain(got.difference(&w)).take(6) {
            let id = row.split('|').next().unwrap_or_default();
            eprintln!("row {row}:");
            for c in r.changes.iter().filter(|c| c.cells[0] == id) {
                eprintln!(
                    "  change _seq {} {} at {} {:?}",
                    c.seq, c.op, c.pos, c.cells
                );
            }
        }
        for f in change_files(&dir) {
            eprintln!("file {}", f.display());
        }
        let st = std::fs::read_to_string(to.join("_sluice/stream.json")).unwrap_or_default();
        eprintln!("{}", &st[st.len().saturating_sub(3000)..]);
    }
    crate::files::assert_same_rows(
        &r.rows,
        want,
        &format!("{dataset}: snapshot + changes replayed by _seq"),
    );
    r
}
