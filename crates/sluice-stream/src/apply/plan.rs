//! The order a unit's rows are applied in, and which of them a target may merge into one
//! statement.
//!
//! A statement per row costs the target a parse, a plan and an executor start for every
//! change; one statement for many rows of a table (a multi-row `INSERT`, an `UPDATE … FROM
//! (VALUES …)`, a `DELETE … USING`) costs them once: with it the replication lab's drain at
//! `--parallel 1` went from 21.0 to 10.3 s (PostgreSQL) and from 35.9 to 11.4 s (MariaDB)
//! (`bench/results/replicate-2026-11-27-0714` and `-0744`). So the rows
//! of a unit are gathered into *batches*: rows of one table and one operation that share no
//! key with each other.
//!
//! Rows may be moved only past rows they share no key with (primary, unique or foreign-key
//! parent, as the writeset hashes them): those commute. Batches are emitted in the order they
//! are opened; a row joins the latest batch of its kind when every earlier row sharing a key
//! with it sits in an earlier batch (so it moves back only past rows it commutes with, and the
//! rows of a batch share no key), else it opens a new batch at the end. A row of a table
//! without a key never moves and is a batch of its own.
//!
//! What keys cannot see (the old value of a unique column the source did not log, a foreign
//! key that exists only on the target) can make a moved row fail on the target; the unit is
//! then rolled back and retried in source order (`reorder` off), where only consecutive
//! inserts into one table share a statement — the order a single session would have used.

use super::writeset::RowKeys;
use arrow_array::cast::AsArray;
use sluice_core::apply::ApplyUnit;
use sluice_core::change::{ChangeOp, OP};
use std::collections::HashMap;

/// What a row does, for batching: its table (index in the unit) and operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Kind {
    table: u32,
    op: Option<ChangeOp>,
}

/// The rows of `unit` that `pick` selects (by position in `unit.order`), ordered and batched
/// as the module documentation says; `keys` holds the keys of every row of `unit`, in order.
pub(crate) fn plan(
    unit: &ApplyUnit,
    keys: &RowKeys,
    first: usize,
    pick: impl Fn(usize) -> bool,
    reorder: bool,
) -> ApplyUnit {
    let ops: Vec<Option<&arrow_array::StringArray>> = unit
        .tables
        .iter()
        .map(|t| {
            t.batch
                .schema()
                .index_of(OP)
                .ok()
                .and_then(|i| t.batch.column(i).as_string_opt::<i32>())
        })
        .collect();
    let kind = |(t, r): (u32, u32)| -> Option<Kind> {
        let table = unit.tables.get(t as usize)?;
        if table.key.is_empty() {
            return None;
        }
        let op = ops.get(t as usize).copied().flatten()?;
        Some(Kind {
            table: t,
            op: ChangeOp::parse(op.value(r as usize)),
        })
    };
    let mut batches: Vec<Vec<(u32, u32)>> = Vec::new();
    let mut open: HashMap<Kind, usize> = HashMap::new();
    let mut last: HashMap<u64, usize> = HashMap::new();
    for (i, &at) in unit.order.iter().enumerate() {
        if !pick(i) {
            continue;
        }
        let row_keys = keys.row(first + i);
        let k = kind(at);
        let after = row_keys.iter().filter_map(|x| last.get(x).copied()).max();
        let join = k.and_then(|k| open.get(&k).copied()).filter(|&b| {
            after.is_none_or(|a| a < b)
                && (reorder
                    || (b + 1 == batches.len()
                        && k.is_some_and(|k| k.op == Some(ChangeOp::Insert))))
        });
        let b = match join {
            Some(b) => b,
            None => {
                batches.push(Vec::new());
                let b = batches.len() - 1;
                if let Some(k) = k {
                    open.insert(k, b);
                }
                b
            }
        };
        batches[b].push(at);
        for x in row_keys {
            last.insert(*x, b);
        }
    }
    let mut order = Vec::with_capacity(batches.iter().map(Vec::len).sum());
    let mut ends = Vec::with_capacity(batches.len());
    for b in batches {
        order.extend(b);
        ends.push(order.len() as u32);
    }
    ApplyUnit {
        tables: unit.tables.clone(),
        order,
        batches: ends,
    }
}
