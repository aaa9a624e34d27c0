//! A writer that keeps changing a table while an export runs, and failpoints that place the
//! test's actions at exact points of the export.
//!
//! The writer works on `<table> (id bigint PRIMARY KEY, v int, pad text)` with `v` indexed, so
//! every UPDATE is non-HOT, and each update grows `pad`, so the new row version rarely fits
//! its page: rows keep moving to other pages (out of their ctid range). It also deletes and
//! inserts rows, and records which ids it deleted and inserted, so a test can say exactly which
//! ids existed throughout.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Create `table` with ids `1..=rows` (and an index on `v`, so updates are not HOT).
pub async fn create_table(db: &super::TestDb, table: &str, rows: i64) {
    db.exec(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL);
         CREATE INDEX ON {table} (v);
         INSERT INTO {table} SELECT g, 0, md5(g::text) FROM generate_series(1, {rows}) g;
         ANALYZE {table};"
    ))
    .await;
}

pub use sluice_testkit::writer::Background;

/// A running writer.
pub struct Writer {
    background: Background,
    deleted: Arc<Mutex<HashSet<i64>>>,
    inserted: Arc<Mutex<HashSet<i64>>>,
    rows: i64,
}

impl Writer {
    /// Start changing `table` (created by [`create_table`] with `rows` rows) on `url`: each
    /// transaction moves 20 rows, deletes one and inserts one.
    pub async fn start(url: &str, table: &str, rows: i64) -> Writer {
        let deleted = Arc::new(Mutex::new(HashSet::new()));
        let inserted = Arc::new(Mutex::new(HashSet::new()));
        let c = sluice_testkit::pg::connect(url).await;
        let background = {
            let (deleted, inserted) = (deleted.clone(), inserted.clone());
            let table = table.to_string();
            Background::spawn(|stop, commits| async move {
                let mut i: i64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let moved: Vec<String> = (0..20)
                        .map(|k| (((i * 20 + k) * 7919) % rows + 1).to_string())
                        .collect();
                    let gone = (i * 104_729) % rows + 1;
                    let new = rows + i;
                    c.batch_execute(&format!(
                        "BEGIN;
                         UPDATE {table} SET v = v + 1, pad = pad || repeat('x', 40)
                          WHERE id IN ({});
                         DELETE FROM {table} WHERE id = {gone};
                         INSERT INTO {table} VALUES ({new}, -1, 'new');
                         COMMIT;",
                        moved.join(",")
                    ))
                    .await
                    .unwrap();
                    deleted.lock().unwrap().insert(gone);
                    inserted.lock().unwrap().insert(new);
                    commits.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let w = Writer {
            background,
            deleted,
            inserted,
            rows,
        };
        w.wait_for(20).await;
        w
    }

    /// Wait until the writer has committed `n` more transactions.
    pub async fn wait_for(&self, n: u64) {
        self.background.wait_for(n).await;
    }

    /// What the writer has done so far: call before an export starts.
    pub fn mark(&self) -> Mark {
        Mark {
            deleted: self.deleted.lock().unwrap().clone(),
            inserted: self.inserted.lock().unwrap().clone(),
        }
    }

    /// What changed since `before` (call after the export ended).
    pub fn since(&self, before: &Mark) -> Changes {
        let now = self.mark();
        Changes {
            during_deleted: now.deleted.difference(&before.deleted).copied().collect(),
            during_inserted: now.inserted.difference(&before.inserted).copied().collect(),
            before: before.clone(),
            rows: self.rows,
        }
    }

    /// Stop writing; returns the transactions committed.
    pub async fn stop(self) -> u64 {
        self.background.stop().await
    }

    /// Let the writer commit `n` more transactions, then stop it; returns the transactions
    /// committed.
    pub async fn stop_after(self, n: u64) -> u64 {
        self.background.stop_after(n).await
    }
}

/// The ids a writer had deleted and inserted at some moment.
#[derive(Clone)]
pub struct Mark {
    deleted: HashSet<i64>,
    inserted: HashSet<i64>,
}

/// What a writer changed while an export ran.
pub struct Changes {
    before: Mark,
    during_deleted: HashSet<i64>,
    during_inserted: HashSet<i64>,
    rows: i64,
}

impl Changes {
    /// Check the exactly-once-per-key guarantee on exported `ids`: no id twice; every id that
    /// existed throughout the export exactly once; ids deleted before it began never; ids
    /// inserted or deleted while it ran at most once; nothing else. Returns how many ids that
    /// changed during the export were exported.
    pub fn assert_key_guarantee(&self, ids: &[i64], what: &str) -> usize {
        let mut seen = HashSet::new();
        for id in ids {
            assert!(seen.insert(*id), "{what}: id {id} exported twice");
        }
        let changed =
            |id: &i64| self.during_deleted.contains(id) || self.during_inserted.contains(id);
        let throughout: Vec<i64> = (1..=self.rows)
            .chain(self.before.inserted.iter().copied())
            .filter(|id| !self.before.deleted.contains(id) && !changed(id))
            .collect();
        let missing: Vec<i64> = throughout
            .iter()
            .filter(|id| !seen.contains(id))
            .copied()
            .collect();
        assert!(
            missing.is_empty(),
            "{what}: {} id(s) that existed throughout the export are missing, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        let throughout: HashSet<i64> = throughout.into_iter().collect();
        let mut n = 0;
        for id in &seen {
            if changed(id) {
                n += 1;
            } else {
                assert!(
                    throughout.contains(id),
                    "{what}: id {id} did not exist during the export"
                );
            }
        }
        n
    }
}

/// The `id` column of every part of a dataset directory, unsorted (duplicates kept).
pub fn exported_ids(dir: &Path) -> Vec<i64> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    let mut out = Vec::new();
    for b in sluice_testkit::files::dataset_batches(dir) {
        let col = b.column_by_name("id").expect("an id column");
        out.extend(col.as_primitive::<Int64Type>().values().iter().copied());
    }
    out
}
