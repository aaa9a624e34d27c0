//! Partition maintenance the change stream does not carry.
//!
//! Partitioned tables are published under their root (`publish_via_partition_root`), and in
//! that mode PostgreSQL does not publish a `TRUNCATE` of one partition; `DETACH PARTITION` and
//! `DROP` of a partition produce no row changes in any mode. Their rows leave the table
//! without a change in the stream, so a change file replay or a replication target would keep
//! them. Nothing in the log marks the moment, so sluice keeps, with the stream's state, each
//! captured partitioned table's leaf partitions and the file each is stored in (the
//! *layout*, taken when the stream starts) and compares it with the catalog at every open of
//! the stream and every minute while it runs: a partition that is gone was detached or
//! dropped; a partition in another file was truncated — or rewritten with its rows kept
//! (`VACUUM FULL`, `CLUSTER`), which the catalog does not tell apart. A new partition is said
//! (a warning) and taken into the layout: one created empty (`CREATE TABLE … PARTITION OF`,
//! the usual way) fills through the stream, but the rows of one attached with rows already in
//! it are not in the log, and the catalog does not tell the two apart either.

use crate::error::{Phase, classify};
use crate::sql::quote_table;
use serde::{Deserialize, Serialize};
use sluice_core::Result;
use sluice_core::change::LayoutChange;
use sluice_core::table::TableRef;
use std::collections::BTreeMap;
use tokio_postgres::Client;

/// One partition: its name then, and the file it was in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leaf {
    /// Qualified name as the catalog printed it.
    pub name: String,
    /// `pg_class.relfilenode`.
    pub file: u32,
}

/// Per captured partitioned table (`schema.table`), its leaf partitions by oid.
pub type Layout = BTreeMap<String, BTreeMap<u32, Leaf>>;

/// The leaf partitions of those of `tables` that are partitioned.
pub async fn layout(client: &Client, tables: &[TableRef], display: &str) -> Result<Layout> {
    let mut out = Layout::new();
    for t in tables {
        let rows = client
            .query(
                "SELECT p.relid::oid, p.relid::regclass::text, c.relfilenode::oid \
                 FROM pg_class r \
                 CROSS JOIN LATERAL pg_partition_tree(r.oid) p \
                 JOIN pg_class c ON c.oid = p.relid \
                 WHERE r.oid = to_regclass($1) AND r.relkind = 'p' AND p.isleaf",
                &[&quote_table(t)],
            )
            .await
            .map_err(|e| classify(e, Phase::Catalog, display))?;
        if rows.is_empty() {
            continue;
        }
        out.insert(
            t.to_string(),
            rows.iter()
                .map(|r| {
                    (
                        r.get::<_, u32>(0),
                        Leaf {
                            name: r.get(1),
                            file: r.get(2),
                        },
                    )
                })
                .collect(),
        );
    }
    Ok(out)
}

/// The files `t` and its partitions are stored in now (`relfilenode`s, in partition order):
/// what a rewrite or a truncate replaces.
pub async fn files(client: &Client, t: &TableRef, display: &str) -> Result<String> {
    let row = client
        .query_one(
            "SELECT coalesce(string_agg(c.relfilenode::text, ',' ORDER BY c.oid), '') \
             FROM pg_class c \
             WHERE c.oid = to_regclass($1) \
                OR c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass($1)))",
            &[&quote_table(t)],
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, display))?;
    Ok(row.get(0))
}

/// What happened to the partitions of `saved` since; empty when nothing.
pub fn changes(saved: &Layout, now: &Layout) -> Vec<LayoutChange> {
    let mut out = Vec::new();
    let change = |table: &str, what: String, missing: bool| LayoutChange {
        table: table.to_string(),
        what,
        missing,
    };
    for (table, leaves) in saved {
        let current = now.get(table);
        for (oid, leaf) in leaves {
            match current.and_then(|c| c.get(oid)) {
                None => out.push(change(
                    table,
                    format!(
                        "partition {} was detached or dropped: its rows left {table} without a \
                         change in the stream",
                        leaf.name
                    ),
                    true,
                )),
                Some(l) if l.file != leaf.file => out.push(change(
                    table,
                    format!(
                        "partition {} was truncated, or rewritten (VACUUM FULL, CLUSTER): a \
                         truncate of one partition is not in the stream",
                        leaf.name
                    ),
                    true,
                )),
                Some(_) => {}
            }
        }
        for (oid, leaf) in current.into_iter().flatten() {
            if !leaves.contains_key(oid) {
                out.push(change(
                    table,
                    format!(
                        "partition {} is new: created empty, it fills through the stream; if \
                         it was attached with rows already in it, those rows are not in the \
                         stream (take a new snapshot of {table})",
                        leaf.name
                    ),
                    false,
                ));
            }
        }
    }
    out
}

/// The partitioned tables that exist now (as layout keys): a saved table missing from them was
/// dropped, which the stream's table watch ends with its marker rather than as partitions
/// detached one by one.
pub async fn partitioned_now(
    client: &Client,
    display: &str,
) -> Result<std::collections::BTreeSet<String>> {
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'p'",
            &[],
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, display))?;
    Ok(rows
        .iter()
        .map(|r| {
            TableRef {
                schema: r.get(0),
                name: r.get(1),
            }
            .to_string()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(name: &str, file: u32) -> Leaf {
        Leaf {
            name: name.into(),
            file,
        }
    }

    #[test]
    fn gone_and_refiled_partitions_miss_rows_new_ones_are_said() {
        let saved: Layout = [(
            "public.ev".to_string(),
            [(1, leaf("ev_2024", 10)), (2, leaf("ev_2025", 20))].into(),
        )]
        .into();
        let now: Layout = [(
            "public.ev".to_string(),
            [(2, leaf("ev_2025", 21)), (3, leaf("ev_2026", 30))].into(),
        )]
        .into();
        let c = changes(&saved, &now);
        assert_eq!(c.len(), 3);
        assert!(
            c[0].what.contains("ev_2024 was detached") && c[0].missing,
            "{c:?}"
        );
        assert!(
            c[1].what.contains("ev_2025 was truncated") && c[1].missing,
            "{c:?}"
        );
        assert!(
            c[2].what.contains("ev_2026 is new") && !c[2].missing,
            "{c:?}"
        );
        assert!(changes(&now, &now).is_empty());
    }
}
