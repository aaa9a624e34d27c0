//! Planning chunks: key ranges and page runs, one algorithm for every engine.
//!
//! - **Key ranges.** A single integer key is cut between its MIN and MAX: evenly, or, where
//!   the engine can estimate rows per range cheaply ([`KeyQueries::estimate_rows`], MySQL's
//!   `EXPLAIN`), into ranges of about equal rows. Any other key (text, uuid, composite) is cut
//!   at boundaries the engine finds as it can ([`Boundaries`]): quantiles of a sample
//!   (PostgreSQL's `TABLESAMPLE`), or stepping through the key's index. First and last ranges
//!   are open, so rows inserted outside the planned span are still read; a nullable key gets a
//!   chunk of its own for rows with a NULL in it, so every row lands in exactly one chunk.
//! - **Page runs.** A relation of `pages` physical pages is cut into runs of consecutive
//!   pages; the last run is open-ended so pages added after planning are still read.
//!
//! The engine supplies only SQL text and a way to run it ([`KeyQueries`]); the arithmetic, the
//! boundary bookkeeping and the chunk estimates live here.
//!
//! Length: about 480 lines of code plus its unit tests: integer bounds, row-estimated ranges
//! and sampled boundaries share the range type and the open first and last ranges.

use crate::chunk::{Chunk, ChunkBounds};
use crate::clause::{Bound, Dialect, key_columns, key_compare, key_not_null};
use crate::error::Result;
use crate::table::{ColumnDesc, Dataset, TableRef};
use arrow_schema::DataType;
use async_trait::async_trait;
use std::ops::Range;

/// How many chunks of about `target` bytes `bytes` make; at least one.
pub fn parts_for(bytes: u64, target: u64) -> u64 {
    bytes.div_ceil(target.max(1)).max(1)
}

/// How an engine finds the boundaries of a key that is not a single integer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boundaries {
    /// Sort a sample of the key and take its quantiles. The text is a FROM item (with any
    /// condition it needs, without ORDER BY) that yields about `rows` sampled rows, e.g.
    /// `"t" TABLESAMPLE SYSTEM (0.5)`; the key's NOT NULL conditions are added here.
    Sample {
        /// The FROM item that samples the relation.
        from: String,
        /// True when `from` already has a WHERE clause (more conditions join with AND).
        has_where: bool,
    },
    /// Step through the key's index, `rows / n` rows at a time: one ordered pass that reads no
    /// row twice (`ORDER BY key LIMIT 1 OFFSET step`, resumed from the previous boundary).
    Step,
    /// The engine cannot split such a key: the dataset is read as one chunk.
    Unsupported,
}

/// The engine side of key-range planning: running SQL on the planning session.
#[async_trait]
pub trait KeyQueries: Send {
    /// Run `sql`, returning its rows with every value as text (`None` for NULL).
    async fn text_rows(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>>;

    /// The optimizer's estimate of the rows of `from` whose `key` lies in `range` (lower bound
    /// included, upper excluded), if the engine gives one cheaply (no rows read); `None`
    /// splits integer keys evenly by value.
    async fn estimate_rows(&mut self, from: &str, key: &str, range: Range<i128>) -> Option<u64> {
        let _ = (from, key, range);
        None
    }
}

/// What key-range planning needs of an engine's SQL, beyond the clause [`Dialect`].
pub trait KeyDialect: Dialect {
    /// The SQL expression that reads key column `c` as text that [`Dialect::key_literal`]
    /// turns back into a value (e.g. `"c"::text`, `HEX(c)` for binary keys).
    fn key_text(&self, c: &ColumnDesc) -> String;

    /// True when rows can be ranged on `c`: its sort order is its comparison order.
    fn splittable(&self, c: &ColumnDesc) -> bool {
        c.cast.is_none() && !matches!(c.field.data_type(), DataType::Boolean)
    }

    /// True for an integer key that can be cut by value.
    fn integer_key(&self, c: &ColumnDesc) -> bool {
        c.cast.is_none() && c.field.data_type().is_integer()
    }

    /// How boundaries of other keys are found, reading `from` (the dataset's FROM item) of
    /// `ds` for `n` chunks.
    fn boundaries(&self, ds: &Dataset, from: &str, n: u64) -> Boundaries;

    /// `LIMIT 1 OFFSET n`, or the engine's spelling of it.
    fn one_row_at(&self, offset: u64) -> String {
        format!("LIMIT 1 OFFSET {offset}")
    }
}

/// Sub-ranges per planned chunk used to adapt integer ranges to the rows present.
const SUBRANGES_PER_CHUNK: u64 = 8;

/// Most optimizer estimates one integer key's planning may ask for.
const MAX_ESTIMATES: usize = 2_000;

/// Chunk `ordinal` of `ds` over `bounds` reading `relation` (or the dataset's own object).
fn chunk(
    ds: &Dataset,
    ordinal: usize,
    relation: Option<&TableRef>,
    bounds: ChunkBounds,
    bytes: u64,
    rows: u64,
) -> Chunk {
    Chunk {
        relation: relation.cloned(),
        ..Chunk::new(ds, ordinal, bounds, bytes, rows)
    }
}

/// Runs of `per_run` pages over a relation of `pages` pages holding `bytes` and `rows`,
/// numbered from `first_ordinal`; the last run is open-ended. A relation of no pages is one
/// open run.
pub fn page_runs(
    ds: &Dataset,
    relation: Option<&TableRef>,
    pages: u64,
    per_run: u64,
    (bytes, rows): (u64, u64),
    first_ordinal: usize,
) -> Vec<Chunk> {
    let per_run = per_run.max(1);
    let mut out = Vec::new();
    let mut first = 0;
    loop {
        let end = first + per_run;
        let last = end >= pages;
        let span = if last {
            pages.saturating_sub(first)
        } else {
            per_run
        };
        let share = |total: u64| (total * span).checked_div(pages).unwrap_or(total);
        let bounds = ChunkBounds::Pages {
            first,
            end: (!last).then_some(end),
        };
        out.push(chunk(
            ds,
            first_ordinal + out.len(),
            relation,
            bounds,
            share(bytes),
            share(rows),
        ));
        if last {
            return out;
        }
        first = end;
    }
}

/// The key `--chunk-by key[:columns]` asks for: the named columns, else `default` (the
/// dataset's key). `None`, with a warning, when neither exists: the dataset is read whole.
pub fn requested_key(
    ds: &Dataset,
    named: Option<&Vec<String>>,
    default: &[String],
) -> Option<Vec<String>> {
    match named {
        Some(c) => Some(c.clone()),
        None if !default.is_empty() => Some(default.to_vec()),
        None => {
            tracing::warn!(
                "{} has no primary key or unique key over NOT NULL columns to split on; it is \
                 read as one chunk (name a key column with --chunk-by key:<column>)",
                ds.name
            );
            None
        }
    }
}

/// Chunks of `ds` by ranges of key `columns` of about `target_bytes` each, or the whole dataset
/// as one chunk when the key cannot be split (with a warning saying why).
pub async fn key_ranges<D: KeyDialect>(
    d: &D,
    q: &mut (dyn KeyQueries + '_),
    ds: &Dataset,
    columns: &[String],
    target_bytes: u64,
) -> Result<Vec<Chunk>> {
    let key = key_columns(ds, columns)?;
    let unsplittable = if key.len() > d.max_key_columns() {
        Some(format!(
            "{} keys of {} columns cannot be split into ranges",
            d.engine(),
            key.len()
        ))
    } else {
        key.iter().find(|c| !d.splittable(c)).map(|c| {
            format!(
                "key column {} ({}) cannot be split into ranges (its sort order is not its \
                 comparison order, or it is not comparable)",
                c.name, c.source_type
            )
        })
    };
    if let Some(why) = unsplittable {
        tracing::warn!("{}: {why}; read as one chunk", ds.name);
        return Ok(vec![Chunk::whole(ds)]);
    }
    let n = parts_for(ds.estimate.bytes, target_bytes);
    let from = crate::clause::from_clause(d, ds, None)?;
    let bounds: Vec<Vec<String>> = if n <= 1 {
        Vec::new()
    } else if key.len() == 1 && d.integer_key(key[0]) {
        integer_bounds(d, q, &from, key[0], n)
            .await?
            .into_iter()
            .map(|b| vec![b.to_string()])
            .collect()
    } else {
        match d.boundaries(ds, &from, n) {
            Boundaries::Sample { from, has_where } => {
                sampled_bounds(d, q, &key, &from, has_where, n).await?
            }
            Boundaries::Step => stepped_bounds(d, q, ds, &key, &from, n).await?,
            Boundaries::Unsupported => {
                tracing::warn!(
                    "{}: {} can split only a single integer key, not ({}); read as one chunk",
                    ds.name,
                    d.engine(),
                    columns.join(", ")
                );
                return Ok(vec![Chunk::whole(ds)]);
            }
        }
    };
    Ok(ranges(
        ds,
        columns,
        bounds,
        key.iter().any(|c| c.field.is_nullable()),
    ))
}

/// The chunks between consecutive `bounds` (first and last open), plus the NULL-key chunk of a
/// `nullable` key.
pub fn ranges(
    ds: &Dataset,
    columns: &[String],
    bounds: Vec<Vec<String>>,
    nullable: bool,
) -> Vec<Chunk> {
    let columns = columns.to_vec();
    let count = bounds.len() + 1;
    let share = |total: u64| total / count as u64;
    let mut out = Vec::new();
    let mut lower: Option<Vec<String>> = None;
    let mut uppers = bounds.into_iter().map(Some).chain(std::iter::once(None));
    for i in 0..count {
        let upper = uppers.next().flatten();
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
    out
}

/// `[start, end)` cut into at most `parts` non-empty ranges of equal width.
pub fn split_even(start: i128, end: i128, parts: u64) -> Vec<(i128, i128)> {
    let span = end - start;
    let m = (parts as i128).min(span).max(1);
    let edges: Vec<i128> = (0..=m).map(|i| start + span * i / m).collect();
    edges.windows(2).map(|w| (w[0], w[1])).collect()
}

/// The inner boundaries of `n` ranges of equal width between `lo` and `hi` (inclusive).
pub fn even_bounds(lo: i128, hi: i128, n: u64) -> Vec<i128> {
    split_even(lo, hi + 1, n)
        .into_iter()
        .skip(1)
        .map(|(a, _)| a)
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

/// Boundaries of an integer key: even sub-ranges between MIN and MAX, refined where the
/// engine's estimates show rows clustering, merged by estimated rows.
async fn integer_bounds<D: KeyDialect>(
    d: &D,
    q: &mut (dyn KeyQueries + '_),
    from: &str,
    key: &ColumnDesc,
    n: u64,
) -> Result<Vec<i128>> {
    let k = d.quote_ident(&key.name);
    let rows = q
        .text_rows(&format!("SELECT MIN({k}), MAX({k}) FROM {from}"))
        .await?;
    let span = rows.first().and_then(|r| {
        let lo = r.first()?.as_deref()?.trim().parse::<i128>().ok()?;
        let hi = r.get(1)?.as_deref()?.trim().parse::<i128>().ok()?;
        Some((lo, hi))
    });
    let Some((lo, hi)) = span else {
        return Ok(Vec::new());
    };
    // Sub-ranges [start, end) with the optimizer's row estimate; a sub-range holding more than
    // a chunk's share is cut again, so clustered keys (a dense run in a vast key space) still
    // split evenly by rows. Bounded: at most MAX_ESTIMATES estimates.
    let mut ranges: Vec<(i128, i128, Option<u64>)> =
        split_even(lo, hi + 1, n * SUBRANGES_PER_CHUNK)
            .into_iter()
            .map(|(a, b)| (a, b, None))
            .collect();
    let mut asked = 0usize;
    loop {
        for r in ranges.iter_mut().filter(|r| r.2.is_none()) {
            asked += 1;
            match q.estimate_rows(from, &k, r.0..r.1).await {
                Some(w) => r.2 = Some(w),
                None => return Ok(even_bounds(lo, hi, n)),
            }
        }
        let total: u64 = ranges.iter().map(|r| r.2.unwrap_or(0)).sum();
        let per = (total / n.max(1)).max(1);
        let heavy = |r: &(i128, i128, Option<u64>)| r.2.unwrap_or(0) > per && r.1 - r.0 > 1;
        if !ranges.iter().any(heavy) || asked >= MAX_ESTIMATES {
            break;
        }
        ranges = ranges
            .into_iter()
            .flat_map(|r| {
                if heavy(&r) {
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
    Ok(merge_by_weight(&edges, &weights, n))
}

fn texts(row: &[Option<String>], n: usize) -> Option<Vec<String>> {
    (0..n).map(|i| row.get(i).cloned().flatten()).collect()
}

/// The key's columns quoted (for ORDER BY) and as text (for SELECT), comma-separated.
fn key_lists<D: KeyDialect>(d: &D, key: &[&ColumnDesc]) -> (String, String) {
    let list = key.iter().map(|c| d.quote_ident(&c.name));
    let text = key.iter().map(|c| d.key_text(c));
    (
        list.collect::<Vec<_>>().join(", "),
        text.collect::<Vec<_>>().join(", "),
    )
}

/// Boundaries at the quantiles of a sorted sample of the key.
async fn sampled_bounds<D: KeyDialect>(
    d: &D,
    q: &mut (dyn KeyQueries + '_),
    key: &[&ColumnDesc],
    from: &str,
    has_where: bool,
    n: u64,
) -> Result<Vec<Vec<String>>> {
    let (list, select) = key_lists(d, key);
    let not_null = key
        .iter()
        .map(|c| format!("{} IS NOT NULL", d.quote_ident(&c.name)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let glue = if has_where { " AND " } else { " WHERE " };
    let rows = q
        .text_rows(&format!(
            "SELECT {select} FROM {from}{glue}{not_null} ORDER BY {list}"
        ))
        .await?;
    let values: Vec<Vec<String>> = rows.iter().filter_map(|r| texts(r, key.len())).collect();
    let mut bounds: Vec<Vec<String>> = Vec::new();
    for i in 1..n as usize {
        let at = i * values.len() / n as usize;
        if let Some(v) = values.get(at)
            && at > 0
            && bounds.last() != Some(v)
        {
            bounds.push(v.clone());
        }
    }
    Ok(bounds)
}

/// Boundaries found by stepping through the key's index `rows / n` rows at a time.
async fn stepped_bounds<D: KeyDialect>(
    d: &D,
    q: &mut (dyn KeyQueries + '_),
    ds: &Dataset,
    key: &[&ColumnDesc],
    from: &str,
    n: u64,
) -> Result<Vec<Vec<String>>> {
    let step = (ds.estimate.rows / n).max(1);
    let names: Vec<String> = key.iter().map(|c| c.name.clone()).collect();
    let (order, select) = key_lists(d, key);
    let not_null = key_not_null(d, key);
    let mut out: Vec<Vec<String>> = Vec::new();
    while (out.len() as u64) < n - 1 {
        let mut conds = not_null.clone();
        if let Some(prev) = out.last() {
            conds.push(key_compare(d, ds, &names, prev, Bound::AtLeast)?);
        }
        let filter = if conds.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conds.join(" AND "))
        };
        let rows = q
            .text_rows(&format!(
                "SELECT {select} FROM {from}{filter} ORDER BY {order} {}",
                d.one_row_at(step)
            ))
            .await?;
        let Some(values) = rows.first().and_then(|r| texts(r, key.len())) else {
            break;
        };
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
    use crate::table::Relation;

    fn table(pages: u64, bytes: u64) -> Dataset {
        let t = TableRef::new("public", "t");
        Dataset::table(Relation::new(t, pages, 8192, pages * 10, bytes), Vec::new())
    }

    #[test]
    fn page_runs_cover_everything_once_and_end_open() {
        let ds = table(1000, 1000 * 8192);
        let chunks = page_runs(&ds, None, 1000, 100, (1000 * 8192, 10_000), 0);
        assert_eq!(chunks.len(), 10);
        let mut next = 0;
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.ordinal as usize, i);
            match c.bounds {
                ChunkBounds::Pages { first, end } => {
                    assert_eq!(first, next);
                    match end {
                        Some(e) => next = e,
                        None => assert_eq!(i, chunks.len() - 1, "only the last run is open"),
                    }
                }
                _ => panic!("not a page run"),
            }
        }
        assert_eq!(chunks.iter().map(|c| c.est_rows).sum::<u64>(), 10_000);
        for pages in [0, 1] {
            let one = page_runs(&ds, None, pages, 7, (5, 5), 3);
            assert_eq!(one.len(), 1);
            assert_eq!(one[0].ordinal, 3);
            assert_eq!(
                one[0].bounds,
                ChunkBounds::Pages {
                    first: 0,
                    end: None
                }
            );
            assert_eq!(one[0].est_rows, 5);
        }
    }

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
        assert_eq!(even_bounds(1, 100, 4), vec![26, 51, 76]);
        assert_eq!(parts_for(0, 10), 1);
        assert_eq!(parts_for(21, 10), 3);
    }

    #[test]
    fn ranges_are_open_at_both_ends_with_a_null_chunk() {
        let ds = table(10, 300);
        let cols = vec!["k".to_string()];
        let chunks = ranges(&ds, &cols, vec![vec!["5".into()], vec!["9".into()]], true);
        assert_eq!(chunks.len(), 4);
        assert_eq!(
            chunks[0].bounds,
            ChunkBounds::Keys {
                columns: cols.clone(),
                lower: None,
                upper: Some(vec!["5".into()])
            }
        );
        assert_eq!(
            chunks[2].bounds,
            ChunkBounds::Keys {
                columns: cols.clone(),
                lower: Some(vec!["9".into()]),
                upper: None
            }
        );
        assert_eq!(chunks[3].bounds, ChunkBounds::KeyNulls { columns: cols });
        assert_eq!(chunks[1].est_bytes, 100);
    }
}
