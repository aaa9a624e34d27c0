//! The keys of captured tables for `sluice replicate`'s writesets: primary key, every other
//! unique index, and foreign keys with the parent's columns and their actions (whose cascades
//! the binary log does not carry), and generated columns, read from `information_schema`
//! with the names bound as parameters.

use super::{err, text};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::apply::{ForeignKey, GeneratedColumn, RefAction, TableKeys};
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Result};

/// The keys of the datasets that are tables (queries and views have none and are left out).
///
/// Unique indexes include those over a column prefix (`UNIQUE (title(20))`): their columns are
/// listed whole, so a writeset may miss a conflict between two values that share the prefix;
/// the target then reports a duplicate key, which the runner retries after the earlier units.
pub async fn table_keys(
    conn: &mut Conn,
    datasets: &[Dataset],
    target: &str,
) -> Result<Vec<TableKeys>> {
    let mut out = Vec::new();
    for d in datasets {
        let Some(t) = d.object.clone() else { continue };
        if d.kind != sluice_core::DatasetKind::Table {
            continue;
        }
        out.push(keys_of(conn, t, target).await?);
    }
    Ok(out)
}

async fn keys_of(conn: &mut Conn, t: TableRef, target: &str) -> Result<TableKeys> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND NON_UNIQUE = 0 \
             ORDER BY INDEX_NAME = 'PRIMARY' DESC, INDEX_NAME, SEQ_IN_INDEX",
            (t.schema.clone(), t.name.clone()),
        )
        .await
        .map_err(err(target))?;
    let mut indexes: Vec<(String, Vec<String>)> = Vec::new();
    for r in &rows {
        let (index, column) = (text(r, 0), text(r, 1));
        match indexes.last_mut() {
            Some((name, cols)) if *name == index => cols.push(column),
            _ => indexes.push((index, vec![column])),
        }
    }
    let mut primary = Vec::new();
    let mut unique = Vec::new();
    for (name, cols) in indexes {
        // A functional index part has no column name: it is no key over columns.
        if cols.iter().any(String::is_empty) {
            continue;
        }
        if name == "PRIMARY" {
            primary = cols;
        } else if !unique.contains(&cols) && cols != primary {
            unique.push(cols);
        }
    }
    let rows: Vec<Row> = conn
        .exec(
            "SELECT k.CONSTRAINT_NAME, k.COLUMN_NAME, k.REFERENCED_TABLE_SCHEMA, \
                    k.REFERENCED_TABLE_NAME, k.REFERENCED_COLUMN_NAME, \
                    COALESCE(r.DELETE_RULE, ''), COALESCE(r.UPDATE_RULE, '') \
             FROM information_schema.KEY_COLUMN_USAGE k \
             LEFT JOIN information_schema.REFERENTIAL_CONSTRAINTS r \
               ON r.CONSTRAINT_SCHEMA = k.CONSTRAINT_SCHEMA \
              AND r.CONSTRAINT_NAME = k.CONSTRAINT_NAME AND r.TABLE_NAME = k.TABLE_NAME \
             WHERE k.TABLE_SCHEMA = ? AND k.TABLE_NAME = ? \
               AND k.REFERENCED_TABLE_NAME IS NOT NULL \
             ORDER BY k.CONSTRAINT_NAME, k.ORDINAL_POSITION",
            (t.schema.clone(), t.name.clone()),
        )
        .await
        .map_err(err(target))?;
    let mut foreign: Vec<(String, ForeignKey)> = Vec::new();
    for r in &rows {
        let name = text(r, 0);
        let parent = TableRef {
            schema: text(r, 2),
            name: text(r, 3),
        };
        match foreign.last_mut() {
            Some((n, fk)) if *n == name && fk.parent == parent => {
                fk.columns.push(text(r, 1));
                fk.parent_columns.push(text(r, 4));
            }
            _ => foreign.push((
                name.clone(),
                ForeignKey {
                    name,
                    columns: vec![text(r, 1)],
                    parent,
                    parent_columns: vec![text(r, 4)],
                    on_delete: RefAction::parse(&text(r, 5)),
                    on_update: RefAction::parse(&text(r, 6)),
                },
            )),
        }
    }
    // Generated columns with their expression (MySQL: '' for a plain column, MariaDB: NULL).
    let rows: Vec<Row> = conn
        .exec(
            "SELECT COLUMN_NAME, GENERATION_EXPRESSION, EXTRA FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
               AND COALESCE(GENERATION_EXPRESSION, '') <> '' ORDER BY ORDINAL_POSITION",
            (t.schema.clone(), t.name.clone()),
        )
        .await
        .map_err(err(target))?;
    let generated = rows
        .iter()
        .map(|r| GeneratedColumn {
            name: text(r, 0),
            expression: text(r, 1),
            stored: text(r, 2).to_ascii_uppercase().contains("STORED")
                || text(r, 2).to_ascii_uppercase().contains("PERSISTENT"),
        })
        .collect();
    Ok(TableKeys {
        table: t,
        primary,
        unique,
        foreign: foreign.into_iter().map(|(_, fk)| fk).collect(),
        match_by: Vec::new(),
        generated,
    })
}
