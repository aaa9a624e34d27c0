//! The selection's tables by name only, for a running stream that compares them with the
//! tables it captures every few seconds: no table is described (no columns, keys or sizes
//! read), and a named table that no longer exists is left out rather than refused.

use super::{Catalog, resolve, select_tables};
use crate::error::Result;
use crate::ident::{NamePart, QualifiedName};
use crate::table::{Selection, TableRef};

/// What the source holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TablesNow {
    /// The tables the selection names or matches, in discovery order.
    pub selected: Vec<TableRef>,
    /// Every table the source has that a selection could choose (tables and partitioned
    /// tables, not views or partitions), the selected ones, and those of the captured tables
    /// asked about that exist.
    pub existing: Vec<TableRef>,
}

/// The tables `selection` selects in `catalog` now, and every table there is. `captured`:
/// tables whose existence matters although a selection by pattern would not list them (a
/// partition or another kind of table named with `--table`): each not among the others is
/// looked up by its exact name.
pub async fn table_names<C: Catalog + ?Sized>(
    catalog: &mut C,
    selection: &Selection,
    captured: &[TableRef],
) -> Result<TablesNow> {
    let naming = C::NAMING;
    let target = catalog.target();
    let scope = catalog.unqualified_scope();
    let mut selected = Vec::new();
    for name in &selection.tables {
        let candidates = catalog.candidates(name).await?;
        if let Ok(c) = resolve(name, candidates, &naming, &target, scope.as_deref()) {
            selected.push(c.table);
        }
    }
    let all = catalog.tables().await?;
    let existing: Vec<TableRef> = all.iter().map(|c| c.table.clone()).collect();
    if !selection.patterns.is_empty() || !selection.schemas.is_empty() {
        for c in select_tables(all, selection, &naming)? {
            if !selected.contains(&c.table) {
                selected.push(c.table);
            }
        }
    }
    let mut existing = existing;
    for t in captured {
        if existing.contains(t) || selected.contains(t) {
            continue;
        }
        let exact = QualifiedName {
            schema: Some(NamePart {
                text: t.schema.clone(),
                quoted: true,
            }),
            name: NamePart {
                text: t.name.clone(),
                quoted: true,
            },
        };
        if catalog
            .candidates(&exact)
            .await?
            .iter()
            .any(|c| c.table == *t)
        {
            existing.push(t.clone());
        }
    }
    for t in &selected {
        if !existing.contains(t) {
            existing.push(t.clone());
        }
    }
    Ok(TablesNow { selected, existing })
}
