//! Which columns of a table the target gets and matches rows by, and the rows it cannot take.

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use sluice_core::apply::TableKeys;
use sluice_core::change::ChangeOp;
use sluice_core::table::{ColumnDesc, TableRef};
use sluice_core::{Error, Result};

/// The columns updates and deletes of a table are matched by on the target (see
/// [`TableKeys::apply_key`]); empty when a column of the key is missing from this schema
/// version (its changes are then matched by whole rows).
pub(super) fn key_of(columns: &[ColumnDesc], keys: Option<&TableKeys>) -> Vec<String> {
    let pk = keys.map(|k| k.apply_key().to_vec()).unwrap_or_default();
    if pk.iter().all(|c| columns.iter().any(|d| &d.name == c)) {
        pk
    } else {
        Vec::new()
    }
}

/// The columns of `columns` applied to the target (generated ones left out), and when some
/// are left out, the batch columns to keep: theirs, then the change columns.
/// See `UnitTable::sole_key`: a primary key that updates and deletes are matched by, and no
/// other unique or foreign key.
pub(super) fn sole_key(keys: Option<&TableKeys>) -> bool {
    keys.is_some_and(|k| {
        !k.primary.is_empty()
            && k.match_by.is_empty()
            && k.unique.is_empty()
            && k.foreign.is_empty()
    })
}

pub(super) fn applied_columns(
    columns: &[ColumnDesc],
    keys: Option<&TableKeys>,
) -> (Vec<ColumnDesc>, Option<Vec<usize>>) {
    let generated = |c: &ColumnDesc| keys.is_some_and(|k| k.is_generated(&c.name));
    if !columns.iter().any(generated) {
        return (columns.to_vec(), None);
    }
    let mut keep: Vec<usize> = (0..columns.len())
        .filter(|&i| !generated(&columns[i]))
        .collect();
    keep.extend(columns.len()..columns.len() + sluice_core::change::CHANGE_COLUMNS.len());
    let applied = columns.iter().filter(|c| !generated(c)).cloned().collect();
    (applied, Some(keep))
}

/// True when rows of `b` are built like rows of `a`.
pub(super) fn same_columns(a: &[ColumnDesc], b: &[ColumnDesc]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.name == y.name
                && x.field.data_type() == y.field.data_type()
                && x.source_type == y.source_type
        })
}

/// An insert that does not carry every column cannot be applied: there is no earlier value to
/// keep (a key update of a row whose large value was unchanged, under PostgreSQL's default
/// replica identity).
pub(super) fn insert_with_absent(
    table: &TableRef,
    batch: &RecordBatch,
    columns: usize,
) -> Result<()> {
    let (op, absent) = (batch.column(columns), batch.column(columns + 5));
    let (op, absent) = (op.as_string::<i32>(), absent.as_list::<i32>());
    for r in 0..batch.num_rows() {
        if op.value(r) == ChangeOp::Insert.as_str() && !absent.value(r).is_empty() {
            return Err(Error::data(format!(
                "{table}: the source sent a new row without the values of some of its columns \
                 (its key changed, and the source's log did not carry the row's other values: \
                 on PostgreSQL a value stored out of line under the default replica identity, \
                 on MySQL/MariaDB a session writing binlog_row_image=MINIMAL or NOBLOB), so it \
                 cannot be inserted on the target. PostgreSQL: set REPLICA IDENTITY FULL on the \
                 source table; MySQL/MariaDB: set binlog_row_image=FULL globally and reconnect \
                 the writers. Then start the replication over (sluice replicate --drop)."
            )));
        }
    }
    Ok(())
}
