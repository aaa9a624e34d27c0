//! Splitting a dataset into chunks by key range.
//!
//! MySQL has no physical row address to range-scan (no ctid), so tables split on a key:
//! - **integer key**: `[min, max]` is cut into many equal sub-ranges, the optimizer's row
//!   estimate for each (`EXPLAIN`, answered from index dives, no rows read) is taken, and
//!   adjacent sub-ranges are merged into chunks of about equal rows — even by value where the
//!   key is dense, adapted to the rows actually present where it has gaps.
//! - **any other key** (text, dates, decimals, binary, composite): boundaries are found by
//!   stepping through the key's index in order (`… WHERE key >= previous ORDER BY key LIMIT 1
//!   OFFSET step`), one ordered pass over the key that reads no row twice; the boundaries are
//!   rows of the table, so chunks hold about `step` rows each.
//! - **whole**: views, queries, `--chunk-by none`, and tables with neither a primary key nor a
//!   unique key over NOT NULL columns are read in one piece.
//!
//! First and last ranges are open, so rows inserted outside the planned span are still read.
//! Keys whose sort order differs from their comparison order (`enum`, `set`) or that cannot be
//! compared (`json`, geometry, blobs) are not split on.

use crate::error::{Phase, classify};
use crate::sql::{quote_ident, quote_table};
use arrow_schema::DataType;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::table::TableRef;
use sluice_core::{
    Chunk, ChunkBounds, ChunkRequest, ChunkStrategy, ColumnDesc, Dataset, DatasetKind, Error,
    Result,
};

/// Sub-ranges per planned chunk used to adapt integer ranges to the rows present.
const SUBRANGES_PER_CHUNK: u64 = 8;

/// The FROM clause that reads `ds`.
pub fn from_clause(ds: &Dataset, relation: Option<&TableRef>) -> Result<String> {
    if let Some(rel) = relation {
        return Ok(quote_table(rel));
    }
    match (ds.kind, &ds.object, &ds.query) {
        (DatasetKind::Table | DatasetKind::Partitioned | DatasetKind::View, Some(t), _) => {
            Ok(quote_table(t))
        }
        (DatasetKind::Query, _, Some(sql)) => Ok(format!("({sql}) AS q")),
        _ => Err(Error::internal(format!(
            "dataset {} has nothing to read from",
            ds.name
        ))),
    }
}

fn whole(ds: &Dataset) -> Vec<Chunk> {
    vec![Chunk::whole(ds)]
}

fn parts_for(bytes: u64, target: u64) -> u64 {
    bytes.div_ceil(target.max(1)).max(1)
}

/// True for an integer column that can be split by value (not `bit`, not `year`).
pub fn is_integer_key(c: &ColumnDesc) -> bool {
    c.cast.is_none()
        && !c.source_type.starts_with("bit")
        && !c.source_type.starts_with("year")
        && matches!(
            c.field.data_type(),
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
                | DataType::UInt64
        )
}

/// True when rows can be ranged on this column: its ORDER BY order is its comparison order.
fn splittable(c: &ColumnDesc) -> bool {
    let t = c.source_type.to_ascii_lowercase();
    // ENUM and SET sort by their index but compare as text; TEXT and BLOB sort on a prefix
    // (max_sort_length); JSON and geometry do not compare as values.
    let unordered = [
        "enum",
        "set",
        "json",
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multi",
    ]
    .iter()
    .any(|p| t.starts_with(p))
        || t.contains("blob")
        || t.contains("text");
    c.cast.is_none() && !unordered && !matches!(c.field.data_type(), DataType::Boolean)
}

/// Plan the chunks of `ds`; `split_key` is its primary key or unique NOT NULL key (or empty).
pub async fn plan(
    conn: &mut Conn,
    ds: &Dataset,
    split_key: &[String],
    req: &ChunkRequest,
    target: &str,
) -> Result<Vec<Chunk>> {
    let table = matches!(ds.kind, DatasetKind::Table | DatasetKind::Partitioned);
    match &req.strategy {
        ChunkStrategy::None => Ok(whole(ds)),
        ChunkStrategy::Physical => Err(Error::config(format!(
            "--chunk-by ctid is PostgreSQL's physical split; MySQL/MariaDB has no row address to \
             range over. Use --chunk-by key (the primary key), --chunk-by key:<column>, or \
             --chunk-by auto for {}.",
            ds.name
        ))),
        ChunkStrategy::Auto if table && !split_key.is_empty() => {
            key_ranges(conn, ds, split_key, req.target_bytes, target).await
        }
        ChunkStrategy::Auto => Ok(whole(ds)),
        ChunkStrategy::Key(cols) => {
            let cols = match cols {
                Some(c) => c.clone(),
                None if !split_key.is_empty() => split_key.to_vec(),
                None => {
                    tracing::warn!(
                        "{} has neither a primary key nor a unique key over NOT NULL columns to \
                         split on; it is read as one chunk (name a key column with --chunk-by \
                         key:<column>)",
                        ds.name
                    );
                    return Ok(whole(ds));
                }
            };
            key_ranges(conn, ds, &cols, req.target_bytes, target).await
        }
    }
}

fn key_columns<'a>(ds: &'a Dataset, cols: &[String]) -> Result<Vec<&'a ColumnDesc>> {
    cols.iter()
        .map(|c| {
            ds.columns.iter().find(|d| &d.name == c).ok_or_else(|| {
                Error::config(format!(
                    "key column {c:?} is not a column of {} (columns: {}).",
                    ds.name,
                    ds.columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })
        .collect()
}

async fn key_ranges(
    conn: &mut Conn,
    ds: &Dataset,
    cols: &[String],
    target_bytes: u64,
    target: &str,
) -> Result<Vec<Chunk>> {
    let key = key_columns(ds, cols)?;
    let nullable = key.iter().any(|c| c.field.is_nullable());
    if let Some(bad) = key.iter().find(|c| !splittable(c)) {
        tracing::warn!(
            "{}: key column {} ({}) cannot be split into ranges (its sort order is not its \
             comparison order, or it is not comparable); read as one chunk",
            ds.name,
            bad.name,
            bad.source_type
        );
        return Ok(whole(ds));
    }
    let n = parts_for(ds.estimate.bytes, target_bytes);
    let from = from_clause(ds, None)?;
    let bounds: Vec<Vec<String>> = if n <= 1 {
        Vec::new()
    } else if key.len() == 1 && is_integer_key(key[0]) {
        integer_bounds(conn, &from, key[0], n, target).await?
    } else {
        stepped_bounds(conn, ds, &from, &key, n, target).await?
    };
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
        out.push(Chunk::new(
            ds,
            i,
            b,
            share(ds.estimate.bytes),
            share(ds.estimate.rows),
        ));
        lower = upper;
    }
    if nullable {
        out.push(Chunk::new(
            ds,
            out.len(),
            ChunkBounds::KeyNulls { columns },
            0,
            0,
        ));
    }
    Ok(out)
}

/// Boundaries of an integer key: even sub-ranges between min and max, refined where rows
/// cluster, merged by estimated rows.
async fn integer_bounds(
    conn: &mut Conn,
    from: &str,
    key: &ColumnDesc,
    n: u64,
    target: &str,
) -> Result<Vec<Vec<String>>> {
    let err = |e| classify(e, Phase::Catalog, target);
    let k = quote_ident(&key.name);
    let row: Option<(Option<String>, Option<String>)> = conn
        .query_first(format!("SELECT MIN({k}), MAX({k}) FROM {from}"))
        .await
        .map_err(err)?;
    let Some((Some(lo), Some(hi))) = row else {
        return Ok(Vec::new());
    };
    let (Ok(lo), Ok(hi)) = (lo.parse::<i128>(), hi.parse::<i128>()) else {
        return Ok(Vec::new());
    };
    // Sub-ranges [start, end) with the optimizer's row estimate; a sub-range holding more than
    // a chunk's share is cut again, so clustered keys (a dense run in a vast key space) still
    // split evenly by rows. Bounded: at most MAX_EXPLAINS estimates.
    let mut ranges: Vec<(i128, i128, Option<u64>)> =
        split_even(lo, hi + 1, n * SUBRANGES_PER_CHUNK)
            .into_iter()
            .map(|(a, b)| (a, b, None))
            .collect();
    let mut explains = 0usize;
    loop {
        for r in ranges.iter_mut().filter(|r| r.2.is_none()) {
            explains += 1;
            let sql = format!(
                "EXPLAIN SELECT 1 FROM {from} WHERE {k} >= {} AND {k} < {}",
                r.0, r.1
            );
            match explain_rows(conn, &sql).await {
                Some(w) => r.2 = Some(w),
                None => return Ok(even_bounds(lo, hi, n)),
            }
        }
        let total: u64 = ranges.iter().map(|r| r.2.unwrap_or(0)).sum();
        let per = (total / n.max(1)).max(1);
        let heavy = ranges
            .iter()
            .any(|r| r.2.unwrap_or(0) > per && r.1 - r.0 > 1);
        if !heavy || explains >= MAX_EXPLAINS {
            break;
        }
        ranges = ranges
            .into_iter()
            .flat_map(|r| {
                if r.2.unwrap_or(0) > per && r.1 - r.0 > 1 {
                    split_even(r.0, r.1, SUBRANGES_PER_CHUNK)
                        .into_iter()
                        .map(|(a, b)| (a, b, None))
                        .collect::<Vec<_>>()
                } else {
                    vec![r]
                }
            })
            .collect();
    }
    let weights: Vec<u64> = ranges.iter().map(|r| r.2.unwrap_or(0)).collect();
    if weights.iter().all(|w| *w == 0) {
        return Ok(even_bounds(lo, hi, n));
    }
    let mut edges: Vec<i128> = ranges.iter().map(|r| r.0).collect();
    edges.push(hi + 1);
    Ok(merge_by_weight(&edges, &weights, n)
        .into_iter()
        .map(|b| vec![b.to_string()])
        .collect())
}

/// Most optimizer estimates one integer key's planning may ask for.
const MAX_EXPLAINS: usize = 2_000;

/// `[start, end)` cut into at most `parts` non-empty ranges of equal width.
fn split_even(start: i128, end: i128, parts: u64) -> Vec<(i128, i128)> {
    let span = end - start;
    let m = (parts as i128).min(span).max(1);
    let edges: Vec<i128> = (0..=m).map(|i| start + span * i / m).collect();
    edges.windows(2).map(|w| (w[0], w[1])).collect()
}

/// `n` ranges of equal width between `lo` and `hi` (used when no estimate is available).
fn even_bounds(lo: i128, hi: i128, n: u64) -> Vec<Vec<String>> {
    split_even(lo, hi + 1, n)
        .into_iter()
        .skip(1)
        .map(|(a, _)| vec![a.to_string()])
        .collect()
}

/// Cut `edges` (m + 1 of them, sub-range i is `[edges[i], edges[i+1])`) into about `n` ranges
/// of equal total weight; returns the inner boundaries.
pub fn merge_by_weight(edges: &[i128], weights: &[u64], n: u64) -> Vec<i128> {
    let total: u64 = weights.iter().sum();
    let per = (total / n.max(1)).max(1);
    let mut out = Vec::new();
    let mut acc = 0u64;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        let last = i + 1 == weights.len();
        if acc >= per && !last && (out.len() as u64) < n - 1 {
            out.push(edges[i + 1]);
            acc = 0;
        }
    }
    out
}

/// The optimizer's `rows` estimate of an EXPLAIN (first row), if it gives one.
async fn explain_rows(conn: &mut Conn, sql: &str) -> Option<u64> {
    let rows: Vec<Row> = conn.query(sql).await.ok()?;
    let first = rows.first()?;
    let idx = first
        .columns_ref()
        .iter()
        .position(|c| c.name_str().eq_ignore_ascii_case("rows"))?;
    Some(crate::catalog::number(first, idx))
}

/// SQL that reads a key column as text for a boundary (binary keys as hex).
fn key_text(c: &ColumnDesc) -> String {
    let q = quote_ident(&c.name);
    if matches!(c.field.data_type(), DataType::Binary) {
        format!("HEX({q})")
    } else {
        format!("CAST({q} AS CHAR CHARACTER SET utf8mb4)")
    }
}

/// Boundaries of any key, by stepping through its index `step` rows at a time.
async fn stepped_bounds(
    conn: &mut Conn,
    ds: &Dataset,
    from: &str,
    key: &[&ColumnDesc],
    n: u64,
    target: &str,
) -> Result<Vec<Vec<String>>> {
    let step = (ds.estimate.rows / n).max(1);
    let names: Vec<String> = key.iter().map(|c| c.name.clone()).collect();
    let order = key
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let select = key
        .iter()
        .map(|c| key_text(c))
        .collect::<Vec<_>>()
        .join(", ");
    let not_null: Vec<String> = key
        .iter()
        .filter(|c| c.field.is_nullable())
        .map(|c| format!("{} IS NOT NULL", quote_ident(&c.name)))
        .collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    while (out.len() as u64) < n - 1 {
        let mut conds = not_null.clone();
        if let Some(prev) = out.last() {
            conds.push(crate::read::at_least(ds, &names, prev)?);
        }
        let filter = if conds.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conds.join(" AND "))
        };
        let sql =
            format!("SELECT {select} FROM {from}{filter} ORDER BY {order} LIMIT 1 OFFSET {step}");
        let row: Option<Row> = conn
            .query_first(sql)
            .await
            .map_err(|e| classify(e, Phase::Catalog, target))?;
        let Some(row) = row else { break };
        let values: Vec<String> = (0..key.len())
            .map(|i| crate::catalog::text(&row, i))
            .collect();
        if out.last() == Some(&values) {
            break;
        }
        out.push(values);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_adapt_ranges_to_rows() {
        // 8 sub-ranges of 10 values; all rows sit in the first two.
        let edges: Vec<i128> = (0..=8).map(|i| i * 10).collect();
        let weights = [50, 50, 0, 0, 0, 0, 0, 0];
        assert_eq!(merge_by_weight(&edges, &weights, 2), vec![10]);
        // Even weights give even ranges.
        assert_eq!(merge_by_weight(&edges, &[1; 8], 4), vec![20, 40, 60]);
        // Never more than n ranges.
        assert!(merge_by_weight(&edges, &[100; 8], 2).len() <= 1);
        assert_eq!(split_even(0, 3, 8), vec![(0, 1), (1, 2), (2, 3)]);
        assert_eq!(
            even_bounds(1, 100, 4),
            vec![vec!["26".to_string()], vec!["51".into()], vec!["76".into()]]
        );
    }
}
