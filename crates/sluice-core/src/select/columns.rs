//! `--columns TABLE:COL,COL` applied to a described dataset: the picked columns kept, in the
//! table's order, each typed name matched as table names are (exactly, as the engine folds
//! it, in any case), the primary key required.

use super::{Folding, rank};
use crate::error::{Error, Result};
use crate::table::{ColumnPick, Dataset};
use std::collections::HashSet;

/// Keep only the columns `pick` names of `ds` (in the table's order); each name must match one
/// column (as table names match: exactly, as folded, in any case), and the same table may be
/// picked once.
pub(super) fn keep_columns(ds: &mut Dataset, pick: &ColumnPick, folding: Folding) -> Result<()> {
    if ds.columns_picked {
        return Err(Error::config(format!(
            "--columns names {} twice; list all its columns in one --columns.",
            ds.name
        )));
    }
    let mut keep = HashSet::new();
    for part in &pick.columns {
        let mut ranked: Vec<(u8, &str)> = ds
            .columns
            .iter()
            .filter_map(|c| Some((rank(part, &c.name, folding)?, c.name.as_str())))
            .collect();
        if let Some(best) = ranked.iter().map(|(r, _)| *r).min() {
            ranked.retain(|(r, _)| *r == best);
        }
        match ranked.as_slice() {
            [(_, name)] => {
                keep.insert(name.to_string());
            }
            [] => {
                let names: Vec<&str> = ds.columns.iter().map(|c| c.name.as_str()).collect();
                return Err(Error::config(format!(
                    "--columns: {} has no column {:?}; its columns are {}.",
                    ds.name,
                    part.text,
                    names.join(", ")
                )));
            }
            many => {
                let names: Vec<&str> = many.iter().map(|(_, n)| *n).collect();
                return Err(Error::config(format!(
                    "--columns: {:?} matches several columns of {} ({}); double-quote it to \
                     match one exactly.",
                    part.text,
                    ds.name,
                    names.join(", ")
                )));
            }
        }
    }
    // Tables are split into chunks, and change files keyed, by the primary key: its columns
    // stay (a pick without them would fail later, far from its cause).
    let left_out: Vec<&str> = ds
        .primary_key
        .iter()
        .filter(|k| !keep.contains(*k))
        .map(String::as_str)
        .collect();
    if !left_out.is_empty() {
        return Err(Error::config(format!(
            "--columns leaves out {} of {}'s primary key, by which the table is split and its \
             changes keyed; add {} to its --columns.",
            left_out.join(", "),
            ds.name,
            if left_out.len() == 1 { "it" } else { "them" }
        )));
    }
    ds.columns.retain(|c| keep.contains(&c.name));
    ds.columns_picked = true;
    Ok(())
}
