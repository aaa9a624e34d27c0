//! What `sluice replicate` needs to know of captured tables beyond their columns: primary
//! key, unique constraints and unique indexes on plain columns (no predicate, no expression)
//! and foreign keys with the parent's columns (for writesets); the replica identity index
//! when it is not the primary key (old tuples carry only its columns, so the target matches
//! updates and deletes by them); stored generated columns with their expression (logical
//! replication does not send them). Names are passed as parameters and tables matched by oid.

use crate::error::{Phase, classify};
use sluice_core::apply::{ForeignKey, GeneratedColumn, RefAction, TableKeys};
use sluice_core::table::TableRef;
use sluice_core::{Dataset, Error, Result};
use std::collections::HashMap;
use tokio_postgres::Client;

/// Unique indexes (primary first) with their key columns in order; `INCLUDE` columns left out.
const UNIQUE: &str = "SELECT i.indrelid, i.indisprimary, \
       array_agg(a.attname::text ORDER BY k.ord), i.indisreplident \
     FROM pg_index i \
     CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
     WHERE i.indrelid = ANY($1::oid[]) AND i.indisunique AND i.indisvalid \
       AND i.indpred IS NULL AND i.indexprs IS NULL AND k.ord <= i.indnkeyatts \
     GROUP BY i.indrelid, i.indexrelid, i.indisprimary, i.indisreplident \
     ORDER BY i.indrelid, i.indisprimary DESC, i.indexrelid";

/// Foreign keys declared on the tables (not the copies PostgreSQL makes for partitions).
const FOREIGN: &str = "SELECT c.conrelid, pn.nspname::text, pc.relname::text, \
       (SELECT array_agg(a.attname::text ORDER BY k.ord) \
          FROM unnest(c.conkey) WITH ORDINALITY AS k(n, ord) \
          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n), \
       (SELECT array_agg(a.attname::text ORDER BY k.ord) \
          FROM unnest(c.confkey) WITH ORDINALITY AS k(n, ord) \
          JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n), \
       c.conname::text, c.confdeltype::text, c.confupdtype::text \
     FROM pg_constraint c \
     JOIN pg_class pc ON pc.oid = c.confrelid \
     JOIN pg_namespace pn ON pn.oid = pc.relnamespace \
     WHERE c.contype = 'f' AND c.conparentid = 0 AND c.conrelid = ANY($1::oid[]) \
     ORDER BY c.conrelid, c.conname";

/// Stored generated columns with their expression as the source prints it.
const GENERATED: &str = "SELECT a.attrelid, a.attname::text, pg_get_expr(d.adbin, d.adrelid) \
     FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
     WHERE a.attrelid = ANY($1::oid[]) AND a.attgenerated = 's' AND NOT a.attisdropped \
     ORDER BY a.attrelid, a.attnum";

/// The keys of every dataset that is a table.
pub async fn table_keys(
    client: &Client,
    datasets: &[Dataset],
    target: &str,
) -> Result<Vec<TableKeys>> {
    let err = |e| classify(e, Phase::Catalog, target);
    let mut oids: HashMap<u32, usize> = HashMap::new();
    let mut out: Vec<TableKeys> = Vec::new();
    for d in datasets {
        let Some(t) = &d.object else { continue };
        let row = client
            .query_opt(
                "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&t.schema, &t.name],
            )
            .await
            .map_err(err)?;
        if let Some(r) = row {
            oids.insert(r.get(0), out.len());
        }
        out.push(TableKeys {
            table: t.clone(),
            primary: Vec::new(),
            unique: Vec::new(),
            foreign: Vec::new(),
            match_by: Vec::new(),
            generated: Vec::new(),
        });
    }
    let list: Vec<u32> = oids.keys().copied().collect();
    for r in client.query(UNIQUE, &[&list]).await.map_err(err)? {
        let Some(&i) = oids.get(&r.get::<_, u32>(0)) else {
            continue;
        };
        let cols: Vec<String> = r.get(2);
        let k = &mut out[i];
        if r.get::<_, bool>(3) && !r.get::<_, bool>(1) {
            k.match_by = cols.clone();
        }
        if r.get::<_, bool>(1) {
            k.primary = cols;
        } else if cols != k.primary && !k.unique.contains(&cols) {
            k.unique.push(cols);
        }
    }
    for r in client.query(GENERATED, &[&list]).await.map_err(err)? {
        let Some(&i) = oids.get(&r.get::<_, u32>(0)) else {
            continue;
        };
        out[i].generated.push(GeneratedColumn {
            name: r.get(1),
            expression: r.get(2),
            stored: true,
        });
    }
    for k in out.iter().filter(|k| !k.match_by.is_empty()) {
        tracing::warn!(
            "{}: REPLICA IDENTITY USING INDEX on ({}): the source logs old rows by those \
             columns, so updates and deletes are matched by them on the target, not by the \
             primary key ({})",
            k.table,
            k.match_by.join(", "),
            k.primary.join(", ")
        );
    }
    for r in client.query(FOREIGN, &[&list]).await.map_err(err)? {
        let Some(&i) = oids.get(&r.get::<_, u32>(0)) else {
            continue;
        };
        out[i].foreign.push(ForeignKey {
            name: r.get(5),
            columns: r.get::<_, Option<Vec<String>>>(3).unwrap_or_default(),
            parent: TableRef::new(r.get::<_, String>(1), r.get::<_, String>(2)),
            parent_columns: r.get::<_, Option<Vec<String>>>(4).unwrap_or_default(),
            on_delete: RefAction::parse(r.get(6)),
            on_update: RefAction::parse(r.get(7)),
        });
    }
    // A table whose catalog lists no primary key keeps the one the dataset was described with.
    for (k, d) in out
        .iter_mut()
        .zip(datasets.iter().filter(|d| d.object.is_some()))
    {
        if k.primary.is_empty() {
            k.primary = d.primary_key.clone();
        }
    }
    Ok(out)
}

/// Refuse, naming each and its fix, captured tables or partitions without REPLICA IDENTITY
/// FULL: only under it does the log carry the whole old row of an update or a delete, which
/// `--before-images` writes.
pub async fn check_before_images(
    client: &Client,
    datasets: &[Dataset],
    display: &str,
) -> Result<()> {
    let mut lacking = Vec::new();
    for t in datasets.iter().filter_map(|d| d.object.as_ref()) {
        for (name, identity, _) in super::slot::leaves(client, t, display).await? {
            if identity != "f" {
                lacking.push(name);
            }
        }
    }
    if lacking.is_empty() {
        return Ok(());
    }
    let fix: Vec<String> = lacking
        .iter()
        .map(|n| format!("ALTER TABLE {n} REPLICA IDENTITY FULL;"))
        .collect();
    Err(Error::config(format!(
        "--before-images writes the whole old row of each update and delete, and {display} logs \
         it only for tables with REPLICA IDENTITY FULL, which {} lack{}. Run {} (it makes the \
         source log every column of each changed row), or stream without --before-images.",
        lacking.join(", "),
        if lacking.len() == 1 { "s" } else { "" },
        fix.join(" ")
    )))
}
