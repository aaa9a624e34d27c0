//! Splitting a dataset into chunks.
//!
//! - **Pointer pages** (default on Firebird ≥ 4): a table's data pages are listed on its
//!   pointer pages (`RDB$PAGES`, page type 4, numbered by `RDB$PAGE_SEQUENCE`). A chunk is a
//!   run of pointer pages `[lo, hi)` and reads `RDB$DB_KEY >= MAKE_DBKEY('T', 0, 0, lo) AND
//!   RDB$DB_KEY < MAKE_DBKEY('T', 0, 0, hi)`: no key, no index, no sort, each data page read
//!   by one chunk. Runs are sized to the chunk target (one pointer page addresses about
//!   page size / 5 data pages: 13 MB of 8 KB pages), and the engine's queue hands them out one
//!   at a time, so a worker that finishes early takes the next run. The last run is open-ended.
//! - **Key ranges** (`--chunk-by key`, or the fallback on Firebird 3): a single integer key is
//!   split evenly between its MIN and MAX (one indexed lookup each). Other keys are read whole.
//! - **Whole**: views and `--chunk-by none`.

use crate::catalog::{ServerInfo, data_pages_per_pointer_page};
use crate::connect::{FbConn, as_i64};
use crate::error::{Phase, classify};
use crate::sql::{integer_literal, quote_ident, quote_literal};
use arrow_schema::DataType;
use sluice_core::{
    Chunk, ChunkBounds, ChunkRequest, ChunkStrategy, Dataset, DatasetKind, Error, Result,
};

fn whole(ds: &Dataset) -> Vec<Chunk> {
    vec![Chunk::whole(ds)]
}

/// Runs of pointer pages of about `target` bytes each.
pub fn pointer_page_runs(ds: &Dataset, target: u64, page_size: u64) -> Vec<Chunk> {
    let Some(rel) = ds.relations.first() else {
        return whole(ds);
    };
    let pp_bytes = page_size * data_pages_per_pointer_page(page_size);
    let per_run = (target / pp_bytes.max(1)).max(1);
    let pps = rel.pages.max(1);
    let mut out = Vec::new();
    let mut first = 0;
    loop {
        let end = first + per_run;
        let last = end >= pps;
        let span = if last { pps - first } else { per_run };
        let share = |total: u64| (total * span) / pps;
        out.push(Chunk::new(
            ds,
            out.len(),
            ChunkBounds::Pages {
                first,
                end: (!last).then_some(end),
            },
            share(rel.bytes),
            share(rel.rows),
        ));
        if last {
            return out;
        }
        first = end;
    }
}

/// Plan the chunks of `ds` on the coordinator's attachment.
pub fn plan(
    conn: &mut FbConn,
    ds: &Dataset,
    req: &ChunkRequest,
    server: &ServerInfo,
) -> Result<Vec<Chunk>> {
    let table = ds.kind == DatasetKind::Table;
    let dbkey_ok = server.has_shared_snapshots();
    match &req.strategy {
        ChunkStrategy::None => Ok(whole(ds)),
        ChunkStrategy::Auto if table && dbkey_ok => {
            Ok(pointer_page_runs(ds, req.target_bytes, server.page_size))
        }
        ChunkStrategy::Auto if table && ds.primary_key.len() == 1 => {
            key_ranges(conn, ds, &ds.primary_key[0], req.target_bytes)
        }
        ChunkStrategy::Auto => Ok(whole(ds)),
        ChunkStrategy::Physical => {
            if !table {
                return Err(Error::config(format!(
                    "--chunk-by pages needs a table, but {} is a view: use --chunk-by none.",
                    ds.name
                )));
            }
            if !dbkey_ok {
                return Err(Error::config(format!(
                    "--chunk-by pages needs Firebird 4.0 or later (MAKE_DBKEY); the server runs \
                     {}. Use --chunk-by key or --chunk-by auto.",
                    server.version
                )));
            }
            Ok(pointer_page_runs(ds, req.target_bytes, server.page_size))
        }
        ChunkStrategy::Key(cols) => {
            let col = match cols.as_deref() {
                Some([c]) => c.clone(),
                None if ds.primary_key.len() == 1 => ds.primary_key[0].clone(),
                _ => {
                    tracing::warn!(
                        "{}: Firebird key chunking needs one integer key column; the table is \
                         read as one chunk (name one with --chunk-by key:<column>, or use the \
                         default pointer-page chunks)",
                        ds.name
                    );
                    return Ok(whole(ds));
                }
            };
            key_ranges(conn, ds, &col, req.target_bytes)
        }
    }
}

fn key_ranges(conn: &mut FbConn, ds: &Dataset, col: &str, target: u64) -> Result<Vec<Chunk>> {
    let desc = ds.columns.iter().find(|d| d.name == col).ok_or_else(|| {
        Error::config(format!(
            "key column {col:?} is not a column of {} (columns: {}).",
            ds.name,
            ds.columns
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let integer = matches!(
        desc.field.data_type(),
        DataType::Int16 | DataType::Int32 | DataType::Int64
    );
    let n = ds.estimate.bytes.div_ceil(target.max(1)).max(1);
    if !integer {
        tracing::warn!(
            "{}: key column {col:?} is not an integer; the table is read as one chunk",
            ds.name
        );
        return Ok(whole(ds));
    }
    let k = quote_ident(col);
    let from = from_clause(ds)?;
    let display = conn.display().to_string();
    let rows = conn
        .query(&format!("SELECT MIN({k}), MAX({k}) FROM {from}"), vec![])
        .map_err(|e| classify(e, Phase::Catalog, &display))?;
    let mut bounds = Vec::new();
    if let Some(r) = rows.first()
        && let (Some(lo), Some(hi)) = (r.first().and_then(as_i64), r.get(1).and_then(as_i64))
        && n > 1
    {
        let span = hi as i128 - lo as i128 + 1;
        for i in 1..n as i128 {
            let b = (lo as i128 + span * i / n as i128) as i64;
            if b > lo && bounds.last() != Some(&b) {
                bounds.push(b);
            }
        }
    }
    let ranges = bounds.len() + 1;
    let mut out = Vec::new();
    let mut lower: Option<Vec<String>> = None;
    for i in 0..ranges {
        let upper = bounds.get(i).map(|b| vec![b.to_string()]);
        out.push(Chunk::new(
            ds,
            i,
            ChunkBounds::Keys {
                columns: vec![col.to_string()],
                lower: lower.clone(),
                upper: upper.clone(),
            },
            ds.estimate.bytes / ranges as u64,
            ds.estimate.rows / ranges as u64,
        ));
        lower = upper;
    }
    if desc.field.is_nullable() {
        out.push(Chunk::new(
            ds,
            out.len(),
            ChunkBounds::KeyNulls {
                columns: vec![col.to_string()],
            },
            0,
            0,
        ));
    }
    Ok(out)
}

/// The FROM clause of `ds`.
pub fn from_clause(ds: &Dataset) -> Result<String> {
    match &ds.object {
        Some(t) => Ok(quote_ident(&t.name)),
        None => Err(Error::internal(format!(
            "dataset {} has nothing to read from",
            ds.name
        ))),
    }
}

/// The WHERE clause selecting `bounds` of `ds` (empty for every row).
pub fn predicate(ds: &Dataset, bounds: &ChunkBounds) -> Result<String> {
    let table = ds
        .object
        .as_ref()
        .map(|t| quote_literal(&t.name))
        .ok_or_else(|| Error::internal(format!("dataset {} has no table", ds.name)))?;
    let dbkey = |pp: u64| format!("MAKE_DBKEY({table}, 0, 0, {pp})");
    Ok(match bounds {
        ChunkBounds::Whole => String::new(),
        ChunkBounds::Pages { first, end } => {
            let mut w = format!(" WHERE RDB$DB_KEY >= {}", dbkey(*first));
            if let Some(e) = end {
                w.push_str(&format!(" AND RDB$DB_KEY < {}", dbkey(*e)));
            }
            w
        }
        ChunkBounds::Keys {
            columns,
            lower,
            upper,
        } => {
            let [col] = columns.as_slice() else {
                return Err(Error::config(format!(
                    "{}: a saved key range over {} columns cannot be read from Firebird; \
                     re-run without --resume.",
                    ds.name,
                    columns.len()
                )));
            };
            let k = quote_ident(col);
            let lit = |v: &Option<Vec<String>>| -> Result<Option<String>> {
                match v.as_deref() {
                    None => Ok(None),
                    Some([x]) => integer_literal(x).map(Some).ok_or_else(|| {
                        Error::config(format!(
                            "{}: key bound {x:?} of the saved plan is not an integer",
                            ds.name
                        ))
                    }),
                    Some(_) => Err(Error::internal("a key bound has the wrong arity")),
                }
            };
            let mut conds = vec![format!("{k} IS NOT NULL")];
            if let Some(l) = lit(lower)? {
                conds.push(format!("{k} >= {l}"));
            }
            if let Some(u) = lit(upper)? {
                conds.push(format!("{k} < {u}"));
            }
            format!(" WHERE {}", conds.join(" AND "))
        }
        ChunkBounds::KeyNulls { columns } => {
            let any: Vec<String> = columns
                .iter()
                .map(|c| format!("{} IS NULL", quote_ident(c)))
                .collect();
            format!(" WHERE ({})", any.join(" OR "))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::table::TableRef;
    use sluice_core::{Relation, SizeEstimate};

    fn table(pps: u64) -> Dataset {
        let t = TableRef {
            schema: String::new(),
            name: "T".into(),
        };
        let bytes = pps * 1000 * 8192;
        Dataset {
            name: "T".into(),
            kind: DatasetKind::Table,
            object: Some(t.clone()),
            relations: vec![Relation {
                table: t,
                pages: pps,
                page_bytes: 8192 * 1632,
                rows: pps * 1000,
                bytes,
            }],
            query: None,
            columns: Vec::new(),
            primary_key: Vec::new(),
            estimate: SizeEstimate {
                rows: pps * 1000,
                bytes,
            },
            outside_snapshot: Vec::new(),
            row_security_filtered: false,
        }
    }

    #[test]
    fn runs_cover_every_pointer_page_once_and_end_open() {
        let pp_bytes = 8192 * data_pages_per_pointer_page(8192);
        let chunks = pointer_page_runs(&table(10), 3 * pp_bytes, 8192);
        let spans: Vec<_> = chunks.iter().map(|c| c.bounds.clone()).collect();
        assert_eq!(
            spans,
            vec![
                ChunkBounds::Pages {
                    first: 0,
                    end: Some(3)
                },
                ChunkBounds::Pages {
                    first: 3,
                    end: Some(6)
                },
                ChunkBounds::Pages {
                    first: 6,
                    end: Some(9)
                },
                ChunkBounds::Pages {
                    first: 9,
                    end: None
                },
            ]
        );
        assert_eq!(chunks.iter().map(|c| c.est_rows).sum::<u64>(), 10_000);
    }

    #[test]
    fn one_pointer_page_is_one_unit() {
        for pps in [0, 1] {
            let chunks = pointer_page_runs(&table(pps), 1, 8192);
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

    #[test]
    fn predicates_quote_names() {
        let ds = table(3);
        let p = predicate(
            &ds,
            &ChunkBounds::Pages {
                first: 1,
                end: Some(2),
            },
        )
        .unwrap();
        assert_eq!(
            p,
            " WHERE RDB$DB_KEY >= MAKE_DBKEY('T', 0, 0, 1) AND RDB$DB_KEY < MAKE_DBKEY('T', 0, 0, 2)"
        );
        let bad = ChunkBounds::Keys {
            columns: vec!["ID".into()],
            lower: Some(vec!["1 OR 1=1".into()]),
            upper: None,
        };
        assert!(predicate(&ds, &bad).is_err());
    }
}
