//! Writesets: the keys a row change touches, as hashes, and a unit's keys row by row
//! ([`RowKeys`], what the schedule, the late-row split and the batching read).
//!
//! A row touches, in the values it carries: its primary key, every unique key whose columns
//! are all present and not NULL, and for every foreign key the target holds (those a
//! replication creates for cascades: `Collector::set_target_foreign_keys`) with all columns
//! set the parent's referenced key (so a child insert waits for the parent's insert, and a
//! parent delete for the children written before it). A foreign key only the source has
//! constrains nothing on the target and is left out: it would make every child row of one
//! parent wait for the others. A key is hashed as (table, column names sorted, values
//! in that order), so a foreign key and the parent's own key meet whatever the column order of
//! either constraint. A key update arrives as delete + insert, so both images are counted.
//!
//! What a writeset cannot see — the old value of a unique column an update changed, when the
//! source logs only the key (PostgreSQL's default replica identity) — is caught on the target
//! as a conflict and retried in order (see `schedule.rs`). Hash collisions only add waits.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use sluice_core::apply::TableKeys;
use sluice_core::table::{ColumnDesc, TableRef};
use std::collections::hash_map::DefaultHasher;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// One key of a table: where its values are and what identifies it.
#[derive(Debug, Clone)]
struct KeySpec {
    ident: u64,
    columns: Vec<usize>,
}

/// The keys of one table (one schema version), resolved to column positions.
#[derive(Debug, Clone, Default)]
pub(crate) struct TableKeySpecs {
    keys: Vec<KeySpec>,
}

fn ident(table: &TableRef, names: &[&str]) -> u64 {
    let mut h = DefaultHasher::new();
    table.hash(&mut h);
    names.hash(&mut h);
    h.finish()
}

/// The positions in `cols` of `columns`, ordered by the sorted names of `by` (the key's
/// identifying names: the parent's for a foreign key), with those sorted names; `None` when a
/// column is missing from this schema version.
fn resolve<'a>(
    cols: &[ColumnDesc],
    columns: &[String],
    by: &'a [String],
) -> Option<(Vec<usize>, Vec<&'a str>)> {
    let mut pairs: Vec<(&str, &str)> = by
        .iter()
        .map(String::as_str)
        .zip(columns.iter().map(String::as_str))
        .collect();
    pairs.sort();
    let positions = pairs
        .iter()
        .map(|(_, c)| cols.iter().position(|d| d.name == *c))
        .collect::<Option<Vec<_>>>()?;
    Some((positions, pairs.iter().map(|(n, _)| *n).collect()))
}

impl TableKeySpecs {
    /// The specs of `table`'s keys over the columns `cols` of one schema version.
    pub fn new(table: &TableRef, cols: &[ColumnDesc], keys: Option<&TableKeys>) -> Self {
        let mut specs = Vec::new();
        let mut own = |parent: &TableRef, columns: &[String], by: &[String]| {
            if columns.is_empty() {
                return;
            }
            if let Some((positions, names)) = resolve(cols, columns, by) {
                specs.push(KeySpec {
                    ident: ident(parent, &names),
                    columns: positions,
                });
            }
        };
        if let Some(k) = keys {
            own(table, &k.primary, &k.primary);
            for u in &k.unique {
                own(table, u, u);
            }
            for f in &k.foreign {
                own(&f.parent, &f.columns, &f.parent_columns);
            }
        }
        TableKeySpecs { keys: specs }
    }

    /// Append the hashes of the keys row `row` of `arrays` (the table's columns) carries.
    pub fn hashes(&self, arrays: &[ArrayRef], row: usize, out: &mut Vec<u64>) {
        'key: for k in &self.keys {
            let mut h = DefaultHasher::new();
            k.ident.hash(&mut h);
            for &c in &k.columns {
                let Some(a) = arrays.get(c) else {
                    continue 'key;
                };
                if a.is_null(row) {
                    continue 'key;
                }
                hash_value(a.as_ref(), row, &mut h);
            }
            out.push(h.finish());
        }
    }
}

/// Hash one value in a form that is the same for equal values of related types (an `int4`
/// foreign key referencing an `int8` key).
fn hash_value(a: &dyn Array, row: usize, h: &mut DefaultHasher) {
    let int = |v: i128, h: &mut DefaultHasher| {
        0u8.hash(h);
        v.hash(h);
    };
    match a.data_type() {
        DataType::Int8 => int(a.as_primitive::<Int8Type>().value(row).into(), h),
        DataType::Int16 => int(a.as_primitive::<Int16Type>().value(row).into(), h),
        DataType::Int32 => int(a.as_primitive::<Int32Type>().value(row).into(), h),
        DataType::Int64 => int(a.as_primitive::<Int64Type>().value(row).into(), h),
        DataType::UInt8 => int(a.as_primitive::<UInt8Type>().value(row).into(), h),
        DataType::UInt16 => int(a.as_primitive::<UInt16Type>().value(row).into(), h),
        DataType::UInt32 => int(a.as_primitive::<UInt32Type>().value(row).into(), h),
        DataType::UInt64 => int(a.as_primitive::<UInt64Type>().value(row).into(), h),
        DataType::Utf8 => {
            1u8.hash(h);
            a.as_string::<i32>().value(row).hash(h);
        }
        DataType::LargeUtf8 => {
            1u8.hash(h);
            a.as_string::<i64>().value(row).hash(h);
        }
        DataType::Binary => {
            2u8.hash(h);
            a.as_binary::<i32>().value(row).hash(h);
        }
        DataType::LargeBinary => {
            2u8.hash(h);
            a.as_binary::<i64>().value(row).hash(h);
        }
        DataType::FixedSizeBinary(_) => {
            2u8.hash(h);
            a.as_fixed_size_binary().value(row).hash(h);
        }
        _ => {
            // Rarer key types (decimals, dates, times): their display text is canonical
            // within one type.
            3u8.hash(h);
            match arrow_cast::display::ArrayFormatter::try_new(a, &Default::default()) {
                Ok(f) => f.value(row).to_string().hash(h),
                Err(_) => row.hash(h),
            }
        }
    }
}

/// Hashes a key hash as itself: the keys are already [`DefaultHasher`] outputs, and hashing
/// them again cost the planner and the schedule a SipHash round per row and lookup.
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed (`write_u64`); anything else folds in bytewise.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A map keyed by key hashes.
pub(crate) type KeyMap<V> = std::collections::HashMap<u64, V, BuildHasherDefault<KeyHasher>>;
/// A set of key hashes.
pub(crate) type KeySet = std::collections::HashSet<u64, BuildHasherDefault<KeyHasher>>;

/// The keys each row of a unit touches, rows in application order (over the unit's `Rows`
/// pieces in order): row `i`'s keys are `keys[ends[i - 1]..ends[i]]`.
#[derive(Debug, Default, Clone)]
pub(crate) struct RowKeys {
    /// Key hashes, row after row.
    pub keys: Vec<u64>,
    /// End offset in `keys` of each row.
    pub ends: Vec<u32>,
}

impl RowKeys {
    /// The rows.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The keys of row `i`.
    pub fn row(&self, i: usize) -> &[u64] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.keys[start..self.ends[i] as usize]
    }

    /// Split off the first `n` rows (all of them when there are fewer).
    pub fn take_front(&mut self, n: usize) -> RowKeys {
        let n = n.min(self.ends.len());
        let cut = if n == 0 { 0 } else { self.ends[n - 1] };
        let keys: Vec<u64> = self.keys.drain(..cut as usize).collect();
        let ends: Vec<u32> = self.ends.drain(..n).collect();
        for e in &mut self.ends {
            *e -= cut;
        }
        RowKeys { keys, ends }
    }
}
