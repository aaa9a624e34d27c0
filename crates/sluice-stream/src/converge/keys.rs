//! The change sink of a converged export's log: the key of every change, per dataset, and the
//! positions of truncates; nothing else of the rows is kept.

use sluice_core::change::{ChangeOp, ChangeRows, ChangeSink, TxMeta, change_schema};
use sluice_core::keytext::{self, key_texts};
use sluice_core::table::TableRef;
use sluice_core::{ColumnDesc, Dataset, Error, Result, StreamPos};
use sluice_sink::overlay::Overlay;
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

/// Changes of one table buffered before their keys are taken.
const FLUSH_ROWS: usize = 4096;

/// What the log said so far, by dataset.
pub(super) struct Seen {
    pub(super) keys: HashMap<String, Overlay>,
    /// The commit positions of each dataset's truncates.
    pub(super) truncates: HashMap<String, Vec<StreamPos>>,
    /// Where the keys past the memory budget go.
    spill: Arc<tempfile::TempDir>,
}

impl Seen {
    pub(super) fn new(spill: Arc<tempfile::TempDir>) -> Seen {
        Seen {
            keys: HashMap::new(),
            truncates: HashMap::new(),
            spill,
        }
    }
}

/// One table's rows as the log describes them.
struct Table {
    /// The dataset's name (the table's, for a table the export does not read).
    dataset: String,
    /// `None` for a table the export does not read.
    rows: Option<ChangeRows>,
    key: Vec<usize>,
    columns: Vec<String>,
}

/// A [`ChangeSink`] that keeps the key of every change, per dataset.
pub(super) struct Keys {
    datasets: Vec<(TableRef, Dataset)>,
    tables: Vec<Table>,
    current: Option<(usize, ChangeOp)>,
    in_tx: bool,
    tx: Option<TxMeta>,
    seq: u64,
    seen: Arc<StdMutex<Seen>>,
    /// The most bytes the keys may take in memory (past it they spill to disk).
    limit: u64,
    /// Generated columns the log leaves out of its rows, per table.
    unlogged: HashMap<TableRef, Vec<String>>,
}

impl Keys {
    /// `unlogged`: the generated columns the log leaves out of each table's rows (not a
    /// change of the table's columns; never in a key, which `check` refuses).
    pub(super) fn new(
        datasets: &[Dataset],
        seen: Arc<StdMutex<Seen>>,
        limit: u64,
        unlogged: HashMap<TableRef, Vec<String>>,
    ) -> Keys {
        Keys {
            datasets: datasets
                .iter()
                .filter_map(|d| Some((d.object.clone()?, d.clone())))
                .collect(),
            tables: Vec::new(),
            current: None,
            in_tx: false,
            tx: None,
            seq: 0,
            seen,
            limit,
            unlogged,
        }
    }

    /// Take the keys of table `index`'s buffered changes.
    fn flush(&mut self, index: usize) -> Result<()> {
        let t = &mut self.tables[index];
        let Some(rows) = t.rows.as_mut().filter(|r| r.rows() > 0) else {
            return Ok(());
        };
        let batch = rows.finish()?;
        let keys = key_texts(&batch, &t.key)?;
        rows.recycle(batch);
        let dataset = t.dataset.clone();
        // The lock may wait for an end point's merge, and a spill writes a file: both off the
        // runtime's other tasks.
        crate::batch::io(|| self.remember(&dataset, keys))
    }

    /// Add `keys` to `dataset`'s; past the budget, the largest sets go to disk until the rest
    /// fits.
    fn remember(&self, dataset: &str, keys: Vec<Vec<String>>) -> Result<()> {
        let mut seen = self
            .seen
            .lock()
            .map_err(|_| Error::internal("the change log's keys were poisoned"))?;
        let Seen {
            keys: all, spill, ..
        } = &mut *seen;
        let set = all
            .entry(dataset.to_string())
            .or_insert_with(|| Overlay::new(spill.clone()));
        for key in keys {
            set.insert(keytext::encode(&key));
        }
        loop {
            let held: u64 = all.values().map(Overlay::memory_bytes).sum();
            let largest = all.iter_mut().max_by_key(|(_, o)| o.memory_bytes());
            match largest {
                Some((name, o)) if held > self.limit && o.memory_bytes() > 0 => {
                    o.spill()?;
                    tracing::info!(
                        "{name}: the changed keys passed their {} MB of memory (half of \
                         --memory); {} keys now spilled to disk",
                        self.limit >> 20,
                        o.spilled()
                    );
                }
                _ => break,
            }
        }
        Ok(())
    }

    pub(super) fn flush_all(&mut self) -> Result<()> {
        (0..self.tables.len()).try_for_each(|i| self.flush(i))
    }
}

impl ChangeSink for Keys {
    fn begin(&mut self, tx: TxMeta) -> Result<()> {
        self.in_tx = true;
        self.tx = Some(tx);
        Ok(())
    }

    fn relation(&mut self, table: &TableRef, columns: &[ColumnDesc]) -> Result<usize> {
        let Some((object, ds)) = self.datasets.iter().find(|(t, _)| t == table) else {
            // PostgreSQL describes a partition too when it sends a change of it under its
            // partitioned table: only a change under an unknown name is an error (`row`).
            self.tables.push(Table {
                dataset: table.to_string(),
                rows: None,
                key: Vec::new(),
                columns: Vec::new(),
            });
            return Ok(self.tables.len() - 1);
        };
        let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
        let unlogged = self.unlogged.get(object);
        let wanted: Vec<&str> = ds
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .filter(|c| !unlogged.is_some_and(|u| u.iter().any(|g| g == c)))
            .collect();
        let same = match ds.columns_picked {
            false => names.iter().map(String::as_str).eq(wanted.iter().copied()),
            true => wanted.iter().all(|w| names.iter().any(|n| n == w)),
        };
        let before = self
            .tables
            .iter()
            .find(|t| t.rows.is_some() && t.dataset == ds.name);
        if !same || before.is_some_and(|b| b.columns != names) {
            return Err(Error::source_permanent(format!(
                "{}: its columns changed while the converged export ran (now: {}); the output \
                 would mix two schemas. Run the export again with --overwrite.",
                ds.name,
                names.join(", ")
            )));
        }
        let key = ds
            .primary_key
            .iter()
            .map(|k| {
                names.iter().position(|n| n == k).ok_or_else(|| {
                    Error::source_permanent(format!(
                        "{}: the change log's rows lack key column {k:?}",
                        ds.name
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let rows = ChangeRows::new(change_schema(table, columns)?, columns.len())?;
        self.tables.push(Table {
            dataset: ds.name.clone(),
            rows: Some(rows),
            key,
            columns: names,
        });
        Ok(self.tables.len() - 1)
    }

    fn row(&mut self, table: usize, op: ChangeOp) -> Result<Option<&mut ChangeRows>> {
        let t = self
            .tables
            .get_mut(table)
            .ok_or_else(|| Error::internal(format!("a change of unknown table {table}")))?;
        if t.rows.is_none() {
            return Err(Error::source_permanent(format!(
                "the change log sent a change of {}, which the export does not read: a table \
                 renamed while the converged export ran? Its changes would be missed; run the \
                 export again.",
                t.dataset
            )));
        }
        if op == ChangeOp::Truncate {
            let pos = self
                .tx
                .as_ref()
                .ok_or_else(|| Error::internal("a truncate outside a transaction"))?
                .pos
                .clone();
            let mut seen = self
                .seen
                .lock()
                .map_err(|_| Error::internal("the change log's keys were poisoned"))?;
            seen.truncates
                .entry(t.dataset.clone())
                .or_default()
                .push(pos);
            self.current = None;
            return Ok(None);
        }
        self.current = Some((table, op));
        Ok(t.rows.as_mut())
    }

    fn row_done(&mut self) -> Result<()> {
        let Some((index, op)) = self.current.take() else {
            return Ok(());
        };
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| Error::internal("a change outside a transaction"))?;
        self.seq += 1;
        let Some(rows) = self.tables[index].rows.as_mut() else {
            return Ok(());
        };
        rows.finish_row(op, tx, self.seq)?;
        if rows.rows() >= FLUSH_ROWS {
            self.flush(index)?;
        }
        Ok(())
    }

    fn commit(&mut self, _restart: &StreamPos) -> Result<()> {
        self.in_tx = false;
        self.tx = None;
        Ok(())
    }

    fn in_tx(&self) -> bool {
        self.in_tx
    }
}
