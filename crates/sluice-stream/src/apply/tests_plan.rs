//! The batching plan of a unit (`plan.rs`): which rows share a statement, which move past
//! others and which are left out, on units written as their changes in source order.

#![allow(clippy::unwrap_used)]

use super::tests::{row_keys, table, unbatched};
use super::writeset::RowKeys;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use sluice_core::apply::ApplyUnit;

/// A unit written as its changes in source order, `table:id op keys…` separated by `, `
/// (`p:1 insert 1, c:1 insert 11 1`): the tables in the order they first appear, keyed by
/// `id` unless named in `keyless`; each change touches the keys listed after it.
fn case(text: &str, keyless: &[&str]) -> (ApplyUnit, RowKeys) {
    let mut names: Vec<&str> = Vec::new();
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut order = Vec::new();
    let mut keys: Vec<Vec<u64>> = Vec::new();
    for change in text.split(", ") {
        let mut words = change.split(' ');
        let (name, id) = words.next().unwrap().split_once(':').unwrap();
        let op = words.next().unwrap();
        let t = match names.iter().position(|n| *n == name) {
            Some(t) => t,
            None => {
                names.push(name);
                rows.push(Vec::new());
                names.len() - 1
            }
        };
        order.push((t as u32, rows[t].len() as u32));
        rows[t].push(format!("{id} {op}"));
        keys.push(words.map(|k| k.parse().unwrap()).collect());
    }
    let tables = names
        .iter()
        .zip(&rows)
        .map(|(n, r)| table(n, &r.join(", "), !keyless.contains(n)))
        .collect();
    let keys: Vec<&[u64]> = keys.iter().map(Vec::as_slice).collect();
    (unbatched(tables, order), row_keys(&keys))
}

/// The planned batches, `table:id` of each row, batches separated by ` | `.
fn planned(unit: &ApplyUnit, keys: &RowKeys, reorder: bool) -> String {
    let p = super::plan::plan(unit, keys, 0, |_| true, reorder);
    let batches: Vec<String> = p
        .batch_ranges()
        .into_iter()
        .map(|r| {
            let rows: Vec<String> = p.order[r]
                .iter()
                .map(|&(t, row)| {
                    let u = &p.tables[t as usize];
                    let ids = u.batch.column(0).as_primitive::<Int64Type>();
                    format!("{}:{}", u.table.name, ids.value(row as usize))
                })
                .collect();
            rows.join(" ")
        })
        .collect();
    batches.join(" | ")
}

#[test]
fn rows_of_a_kind_gather_past_rows_they_share_no_key_with() {
    // Parent p1, its child c1 (keys: own id, parent's), parent p2, child c2, an update of
    // p1, then a delete of c1 and of p1.
    let (unit, keys) = case(
        "p:1 insert 1, c:1 insert 11 1, p:2 insert 2, c:2 insert 12 2, p:1 update 1, \
         c:1 delete 11 1, p:1 delete 1",
        &[],
    );
    assert_eq!(
        planned(&unit, &keys, true),
        "p:1 p:2 | c:1 c:2 | p:1 | c:1 | p:1",
        "inserts gather by table; every row on key 1 keeps its place after the one before"
    );
    assert_eq!(
        planned(&unit, &keys, false),
        "p:1 | c:1 | p:2 | c:2 | p:1 | c:1 | p:1",
        "in source order nothing moves"
    );
}

#[test]
fn consecutive_inserts_share_a_batch_in_source_order_too() {
    let (unit, keys) = case(
        "t:1 insert 1, t:2 insert 2, t:2 update 2, t:3 update 3",
        &[],
    );
    assert_eq!(planned(&unit, &keys, false), "t:1 t:2 | t:2 | t:3");
    assert_eq!(planned(&unit, &keys, true), "t:1 t:2 | t:2 t:3");
}

#[test]
fn rows_of_a_keyless_table_stay_alone_and_in_place() {
    let changes = "t:5 insert 5, k:1 delete, k:1 delete, t:6 insert 6, k:2 insert";
    let (unit, keys) = case(changes, &["k"]);
    assert_eq!(planned(&unit, &keys, true), "t:5 t:6 | k:1 | k:1 | k:2");
}

#[test]
fn an_update_a_later_change_of_its_row_replaces_is_left_out() {
    // A child row referencing b:2 sits between b:2's updates.
    let (mut unit, keys) = case(
        "b:1 update 1, b:2 update 2, b:1 update 1, c:9 insert 19 2, b:2 update 2, \
         b:1 delete 1, b:3 update 3, b:3 update 3",
        &[],
    );
    unit.tables[0].sole_key = true;
    assert_eq!(
        planned(&unit, &keys, true),
        "b:2 | c:9 | b:2 b:3 | b:1",
        "b:1's updates give way to its delete, b:3's first update to its second; b:2's first \
         update stays before the child that references it"
    );
    let rows = |unit: &ApplyUnit, reorder| planned(unit, &keys, reorder).matches(':').count();
    assert_eq!(
        rows(&unit, false),
        8,
        "in source order every row is applied"
    );
    unit.tables[0].sole_key = false;
    assert_eq!(
        rows(&unit, true),
        8,
        "a table with other keys keeps every row"
    );
}

#[test]
fn keyless_inserts_gather_but_never_pass_their_tables_deletes() {
    let changes = "k:1 insert, t:5 insert 5, k:2 insert, k:3 delete, k:4 insert, t:6 insert 6";
    let (unit, keys) = case(changes, &["k"]);
    assert_eq!(planned(&unit, &keys, true), "k:1 k:2 | t:5 t:6 | k:3 | k:4");
}
