//! Splitting a dataset into chunks.
//!
//! - **ctid page ranges** (default for tables on PostgreSQL ≥ 14): `ctid >= '(p,0)' AND
//!   ctid < '(q,0)'` is a TID range scan — no key, no index, no sort, each page read once. The
//!   last range is open-ended so pages added after planning are still read.
//! - **key ranges**: an integer key is split evenly between its min and max; any other key
//!   (text, uuid, composite) is split at boundaries sampled with `TABLESAMPLE SYSTEM` and
//!   compared as a row value, which a btree index serves. First and last ranges are open.
//! - **whole**: views, queries and `--chunk-by none` are read in one piece (per partition for
//!   a partitioned table in snapshot consistency). A foreign partition is always one piece.
//!
//! With `--consistency chunk` every chunk is its own transaction, so the plan must not depend on
//! where rows are stored: an UPDATE that moves a row to another page (or partition) between two
//! chunk reads would make it appear twice or not at all. There `auto` splits on the primary
//! key (or a unique NOT NULL key), a table without one is read as one chunk (through the parent
//! for a partitioned table), and `--chunk-by ctid` is refused. Key ranges read in separate
//! transactions give every row whose key does not change exactly once.

use crate::catalog::ServerInfo;
use crate::error::{Phase, classify};
use crate::sql::{quote_ident, quote_table};
use arrow_schema::DataType;
use sluice_core::table::TableRef;
use sluice_core::{
    Chunk, ChunkBounds, ChunkRequest, ChunkStrategy, Consistency, Dataset, DatasetKind, Error,
    Result,
};
use tokio_postgres::Client;

/// TID range scans arrived in PostgreSQL 14; before that a ctid range is a full scan per chunk.
pub const TID_RANGE_SCAN_VERSION: i32 = 140_000;

/// The FROM clause that reads `chunk` of `ds`.
pub fn from_clause(ds: &Dataset, relation: Option<&TableRef>) -> Result<String> {
    if let Some(rel) = relation {
        return Ok(format!("ONLY {}", quote_table(rel)));
    }
    match (ds.kind, &ds.object, &ds.query) {
        (DatasetKind::Table, Some(t), _) => Ok(format!("ONLY {}", quote_table(t))),
        (DatasetKind::Partitioned | DatasetKind::View, Some(t), _) => Ok(quote_table(t)),
        (DatasetKind::Query, _, Some(sql)) => Ok(format!("({sql}) AS q")),
        _ => Err(Error::internal(format!(
            "dataset {} has nothing to read from",
            ds.name
        ))),
    }
}

fn chunk(
    ds: &Dataset,
    ordinal: usize,
    relation: Option<TableRef>,
    bounds: ChunkBounds,
    bytes: u64,
    rows: u64,
) -> Chunk {
    Chunk {
        relation,
        ..Chunk::new(ds, ordinal, bounds, bytes, rows)
    }
}

/// Whether rows may be read from the dataset's physical relations (pages, leaf partitions)
/// rather than through the object the user named. Not for a partitioned table whose rows are
/// filtered by row-level security: its parent's policies apply only through the parent.
fn leaves_ok(ds: &Dataset) -> bool {
    match ds.kind {
        DatasetKind::Table => true,
        DatasetKind::Partitioned => !ds.row_security_filtered && !ds.relations.is_empty(),
        DatasetKind::View | DatasetKind::Query => false,
    }
}

fn whole(ds: &Dataset) -> Vec<Chunk> {
    if ds.kind == DatasetKind::Partitioned && leaves_ok(ds) {
        return ds
            .relations
            .iter()
            .enumerate()
            .map(|(i, r)| {
                chunk(
                    ds,
                    i,
                    Some(r.table.clone()),
                    ChunkBounds::Whole,
                    r.bytes,
                    r.rows,
                )
            })
            .collect();
    }
    vec![Chunk::whole(ds)]
}

fn parts_for(bytes: u64, target: u64) -> u64 {
    bytes.div_ceil(target.max(1)).max(1)
}

fn physical(ds: &Dataset, target: u64) -> Vec<Chunk> {
    let mut out = Vec::new();
    for rel in &ds.relations {
        if ds.outside_snapshot.contains(&rel.table.to_string()) {
            // A foreign partition has no pages here: it is read whole, from its server.
            out.push(chunk(
                ds,
                out.len(),
                Some(rel.table.clone()),
                ChunkBounds::Whole,
                rel.bytes,
                rel.rows,
            ));
            continue;
        }
        let n = parts_for(rel.bytes, target).min(rel.pages.max(1));
        let step = rel.pages.div_ceil(n).max(1);
        let mut first = 0;
        loop {
            let end = first + step;
            let last = end >= rel.pages;
            let span = if last {
                rel.pages.saturating_sub(first)
            } else {
                step
            };
            let share = |total: u64| (total * span).checked_div(rel.pages).unwrap_or(total);
            let bounds = ChunkBounds::Pages {
                first,
                end: if last { None } else { Some(end) },
            };
            out.push(chunk(
                ds,
                out.len(),
                Some(rel.table.clone()),
                bounds,
                share(rel.bytes),
                share(rel.rows),
            ));
            if last {
                break;
            }
            first = end;
        }
    }
    if out.is_empty() {
        return whole(ds);
    }
    out
}

/// Plan the chunks of `ds`.
pub async fn plan(
    client: &Client,
    ds: &Dataset,
    req: &ChunkRequest,
    server: &ServerInfo,
    target: &str,
) -> Result<Vec<Chunk>> {
    let physical_ok = leaves_ok(ds);
    let tid_ok = server.version_num >= TID_RANGE_SCAN_VERSION;
    let per_chunk = req.consistency == Consistency::Chunk;
    match &req.strategy {
        // One transaction per chunk: a partitioned table's rows can move between partitions,
        // so it is read through its parent in one piece.
        ChunkStrategy::None if per_chunk => Ok(vec![Chunk::whole(ds)]),
        ChunkStrategy::None => Ok(whole(ds)),
        ChunkStrategy::Auto if per_chunk => {
            if matches!(ds.kind, DatasetKind::Table | DatasetKind::Partitioned)
                && !ds.primary_key.is_empty()
            {
                key_ranges(client, ds, &ds.primary_key, req.target_bytes, target).await
            } else {
                Ok(vec![Chunk::whole(ds)])
            }
        }
        ChunkStrategy::Auto if physical_ok && tid_ok => Ok(physical(ds, req.target_bytes)),
        ChunkStrategy::Auto
            if matches!(ds.kind, DatasetKind::Table | DatasetKind::Partitioned)
                && !ds.primary_key.is_empty() =>
        {
            key_ranges(client, ds, &ds.primary_key, req.target_bytes, target).await
        }
        ChunkStrategy::Auto => Ok(whole(ds)),
        ChunkStrategy::Physical => {
            if per_chunk {
                return Err(Error::config(format!(
                    "--chunk-by ctid cannot be used with --consistency chunk ({}): each chunk \
                     would be read in its own transaction, and an UPDATE that moves a row to \
                     another page between two chunk reads makes it appear twice or not at all. \
                     Use --chunk-by auto or key (ranges of the primary key, exact for every row \
                     whose key does not change), or --consistency snapshot, where ctid chunks \
                     share one snapshot.",
                    ds.name
                )));
            }
            if !physical_ok {
                return Err(Error::config(format!(
                    "--chunk-by ctid needs a table, but {} is {}: use --chunk-by key:<column> or \
                     --chunk-by none.",
                    ds.name,
                    match ds.kind {
                        DatasetKind::Query => "a query",
                        DatasetKind::Partitioned => {
                            "a partitioned table filtered by row-level security (read through \
                             its parent, where the policies apply)"
                        }
                        _ => "a view",
                    }
                )));
            }
            if !tid_ok {
                return Err(Error::config(format!(
                    "--chunk-by ctid needs PostgreSQL 14 or later (TID range scans); the server \
                     runs {}. Use --chunk-by key or --chunk-by auto.",
                    server.version
                )));
            }
            Ok(physical(ds, req.target_bytes))
        }
        ChunkStrategy::Key(cols) => {
            let cols = match cols {
                Some(c) => c.clone(),
                None if !ds.primary_key.is_empty() => ds.primary_key.clone(),
                None => {
                    tracing::warn!(
                        "{} has no primary key or unique NOT NULL key to split on; it is read as \
                         one chunk (name a key column with --chunk-by key:<column>)",
                        ds.name
                    );
                    return Ok(if per_chunk {
                        vec![Chunk::whole(ds)]
                    } else {
                        whole(ds)
                    });
                }
            };
            key_ranges(client, ds, &cols, req.target_bytes, target).await
        }
    }
}

async fn key_ranges(
    client: &Client,
    ds: &Dataset,
    cols: &[String],
    target_bytes: u64,
    target: &str,
) -> Result<Vec<Chunk>> {
    let mut key = Vec::new();
    for c in cols {
        let desc = ds.columns.iter().find(|d| &d.name == c).ok_or_else(|| {
            Error::config(format!(
                "key column {c:?} is not a column of {} (columns: {}).",
                ds.name,
                ds.columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        key.push(desc);
    }
    let from = from_clause(ds, None)?;
    let err = |e| classify(e, Phase::Catalog, target);
    let n = parts_for(ds.estimate.bytes, target_bytes);
    let nullable = key.iter().any(|c| c.field.is_nullable());
    let mut bounds: Vec<Vec<String>> = Vec::new();
    let is_int = key.len() == 1
        && key[0].cast.is_none()
        && matches!(
            key[0].field.data_type(),
            DataType::Int16 | DataType::Int32 | DataType::Int64
        );
    if n > 1 && is_int {
        let k = quote_ident(&key[0].name);
        let r = client
            .query_one(
                &format!("SELECT min({k})::int8, max({k})::int8 FROM {from}"),
                &[],
            )
            .await
            .map_err(err)?;
        if let (Some(lo), Some(hi)) = (r.get::<_, Option<i64>>(0), r.get::<_, Option<i64>>(1)) {
            let span = (hi as i128) - (lo as i128) + 1;
            let mut last = None;
            for i in 1..n as i128 {
                let b = (lo as i128 + span * i / n as i128) as i64;
                if last != Some(b) && b > lo {
                    bounds.push(vec![b.to_string()]);
                    last = Some(b);
                }
            }
        }
    } else if n > 1 {
        let list = key
            .iter()
            .map(|c| quote_ident(&c.name))
            .collect::<Vec<_>>()
            .join(", ");
        let texts = key
            .iter()
            .map(|c| format!("{}::text", quote_ident(&c.name)))
            .collect::<Vec<_>>()
            .join(", ");
        let not_null = key
            .iter()
            .map(|c| format!("{} IS NOT NULL", quote_ident(&c.name)))
            .collect::<Vec<_>>()
            .join(" AND ");
        let want = (n * 50).clamp(1_000, 100_000) as f64;
        let pct = if ds.estimate.rows == 0 {
            100.0
        } else {
            (want / ds.estimate.rows as f64 * 100.0).clamp(0.001, 100.0)
        };
        let sample = if matches!(ds.kind, DatasetKind::Table | DatasetKind::Partitioned) {
            format!("{from} TABLESAMPLE SYSTEM ({pct}) WHERE {not_null}")
        } else {
            format!("{from} WHERE {not_null} AND random() < {}", pct / 100.0)
        };
        let rows = client
            .query(
                &format!("SELECT {texts} FROM {sample} ORDER BY {list}"),
                &[],
            )
            .await
            .map_err(err)?;
        let values: Vec<Vec<String>> = rows
            .iter()
            .map(|r| (0..key.len()).map(|i| r.get::<_, String>(i)).collect())
            .collect();
        for i in 1..n as usize {
            let at = i * values.len() / n as usize;
            if let Some(v) = values.get(at)
                && at > 0
                && bounds.last() != Some(v)
            {
                bounds.push(v.clone());
            }
        }
    }
    let columns: Vec<String> = cols.to_vec();
    let ranges = bounds.len() + 1;
    let share = |total: u64| total / ranges as u64;
    let mut out = Vec::new();
    let mut lower: Option<Vec<String>> = None;
    for i in 0..ranges {
        let upper = bounds.get(i).cloned();
        let b = ChunkBounds::Keys {
            columns: columns.clone(),
            lower: lower.clone(),
            upper: upper.clone(),
        };
        out.push(chunk(
            ds,
            i,
            None,
            b,
            share(ds.estimate.bytes),
            share(ds.estimate.rows),
        ));
        lower = upper;
    }
    if nullable {
        out.push(chunk(
            ds,
            out.len(),
            None,
            ChunkBounds::KeyNulls { columns },
            0,
            0,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Relation, SizeEstimate};

    fn table(pages: u64, bytes: u64) -> Dataset {
        let t = TableRef {
            schema: "public".into(),
            name: "t".into(),
        };
        Dataset {
            name: "public.t".into(),
            kind: DatasetKind::Table,
            object: Some(t.clone()),
            relations: vec![Relation {
                table: t,
                pages,
                page_bytes: 8192,
                rows: pages * 10,
                bytes,
            }],
            query: None,
            columns: Vec::new(),
            primary_key: Vec::new(),
            estimate: SizeEstimate {
                rows: pages * 10,
                bytes,
            },
            outside_snapshot: Vec::new(),
            row_security_filtered: false,
        }
    }

    #[test]
    fn page_ranges_cover_everything_once_and_end_open() {
        let ds = table(1000, 1000 * 8192);
        let chunks = physical(&ds, 100 * 8192);
        assert_eq!(chunks.len(), 10);
        let mut next = 0;
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.ordinal as usize, i);
            match c.bounds {
                ChunkBounds::Pages { first, end } => {
                    assert_eq!(first, next);
                    match end {
                        Some(e) => next = e,
                        None => assert_eq!(i, chunks.len() - 1, "only the last range is open"),
                    }
                }
                _ => panic!("not a page range"),
            }
        }
        assert_eq!(chunks.iter().map(|c| c.est_rows).sum::<u64>(), 10_000);
    }

    #[test]
    fn empty_and_tiny_tables_get_one_open_chunk() {
        for pages in [0, 1] {
            let chunks = physical(&table(pages, pages * 8192), 1 << 20);
            assert_eq!(chunks.len(), 1);
            assert_eq!(
                chunks[0].bounds,
                ChunkBounds::Pages {
                    first: 0,
                    end: None
                }
            );
        }
    }
}
