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
//! without a key never moves: its updates and deletes (matched by whole rows) are batches of
//! their own, its inserts share a batch only with the inserts right before them.
//!
//! An update that a later change of the same row in the unit replaces — a later update
//! carrying every column it carries, or a delete — is left out when the row's table has no key
//! but its primary key (`UnitTable::sole_key`): the unit is one target transaction, so no
//! reader sees the row in between, and with no other unique or foreign key no other row's
//! change depends on that state. A counter row bumped by every transaction (pgbench's
//! branches and tellers) is then written once per unit rather than once per transaction, and
//! the rows around it batch. Triggers on the target see the net change only.
//!
//! What keys cannot see (the old value of a unique column the source did not log, a foreign
//! key that exists only on the target) can make a moved row fail on the target; the unit is
//! then rolled back and retried in source order (`reorder` off), where only consecutive
//! inserts into one table share a statement — the order a single session would have used.

use super::writeset::{KeyMap, RowKeys};
use arrow_array::cast::AsArray;
use arrow_array::{Array, StringArray};
use sluice_core::apply::{ApplyUnit, UnitTable};
use sluice_core::change::{ABSENT, ChangeOp, OP};
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
    let keyless = |t: u32| unit.tables.get(t as usize).is_none_or(|t| t.key.is_empty());
    let kind = |(t, r): (u32, u32)| -> Option<Kind> {
        let op = ops.get(t as usize).copied().flatten()?;
        let op = ChangeOp::parse(op.value(r as usize));
        if keyless(t) && op != Some(ChangeOp::Insert) {
            return None;
        }
        Some(Kind { table: t, op })
    };
    let replaced = if reorder {
        replaced(unit, &ops, keys, first, &pick)
    } else {
        Vec::new()
    };
    let mut batches: Vec<Vec<(u32, u32)>> = Vec::new();
    let mut open: HashMap<Kind, usize> = HashMap::new();
    let mut last: KeyMap<usize> = KeyMap::default();
    // Per keyless table, the latest batch holding one of its updates or deletes.
    let mut keyless_matched: HashMap<u32, usize> = HashMap::new();
    for (i, &at) in unit.order.iter().enumerate() {
        if !pick(i) || replaced.get(i).copied().unwrap_or(false) {
            continue;
        }
        let row_keys = keys.row(first + i);
        let k = kind(at);
        let after = row_keys.iter().filter_map(|x| last.get(x).copied()).max();
        let last_batch = |b: usize| b + 1 == batches.len();
        let join = k.and_then(|k| open.get(&k).copied()).filter(|&b| {
            let consecutive_inserts =
                last_batch(b) && k.is_some_and(|k| k.op == Some(ChangeOp::Insert));
            if keyless(at.0) {
                // An insert into a keyless table moves back only past rows of other tables
                // and past its own table's inserts, never past an update or delete of it.
                let past_own = keyless_matched.get(&at.0).is_some_and(|&m| m >= b);
                return consecutive_inserts
                    || (reorder && !past_own && after.is_none_or(|a| a < b));
            }
            after.is_none_or(|a| a < b) && (reorder || consecutive_inserts)
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
        if keyless(at.0) && k.is_none() {
            keyless_matched.insert(at.0, b);
        }
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

/// Which picked rows of `unit` are updates that the next picked change of the same row
/// replaces (see the module documentation), by position in `unit.order`.
fn replaced(
    unit: &ApplyUnit,
    ops: &[Option<&StringArray>],
    keys: &RowKeys,
    first: usize,
    pick: &impl Fn(usize) -> bool,
) -> Vec<bool> {
    let n = unit.order.len();
    let mut out = vec![false; n];
    let op = |(t, r): (u32, u32)| {
        ops.get(t as usize)
            .copied()
            .flatten()
            .and_then(|o| ChangeOp::parse(o.value(r as usize)))
    };
    // The next row (by position) touching each key, over every row: a row of another table
    // sharing the key (a child referencing the row) stops the replacement too.
    let mut next: KeyMap<usize> = KeyMap::with_capacity_and_hasher(n, Default::default());
    for i in (0..n).rev() {
        let at = unit.order[i];
        let row_keys = keys.row(first + i);
        let solo = unit
            .tables
            .get(at.0 as usize)
            .filter(|t| t.sole_key && !t.key.is_empty());
        if let (Some(t), [k]) = (solo, row_keys)
            && pick(i)
            && op(at) == Some(ChangeOp::Update)
            && let Some(&j) = next.get(k)
        {
            let later = unit.order[j];
            out[i] = later.0 == at.0
                && pick(j)
                && same_key(t, at.1, later.1)
                && match op(later) {
                    Some(ChangeOp::Delete) => true,
                    Some(ChangeOp::Update) => carries_all(t, later.1, at.1),
                    _ => false,
                };
        }
        for k in row_keys {
            next.insert(*k, i);
        }
    }
    out
}

/// Rows `a` and `b` of `t` have the same key values (hashes may collide; values do not).
fn same_key(t: &UnitTable, a: u32, b: u32) -> bool {
    let Ok(positions) = t.key_positions() else {
        return false;
    };
    positions.iter().all(|&c| {
        let col = t.batch.column(c);
        col.slice(a as usize, 1).to_data() == col.slice(b as usize, 1).to_data()
    })
}

/// Row `later` of `t` carries every column row `earlier` carries (its absent columns are
/// absent from `earlier` too).
fn carries_all(t: &UnitTable, later: u32, earlier: u32) -> bool {
    let Some(absent) = t
        .batch
        .schema()
        .index_of(ABSENT)
        .ok()
        .and_then(|i| t.batch.column(i).as_list_opt::<i32>().cloned())
    else {
        return false;
    };
    let names = |r: u32| -> Vec<String> {
        let v = absent.value(r as usize);
        v.as_string_opt::<i32>()
            .map(|s| s.iter().flatten().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let before = names(earlier);
    names(later).iter().all(|c| before.contains(c))
}
