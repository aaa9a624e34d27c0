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
//!
//! With `--consistency chunk` every chunk is read in its own transaction, so the plan must not
//! depend on where rows are stored. Firebird keeps a record's db_key across updates, but a row
//! deleted and re-inserted with the same key between two chunk reads (its slot reused after
//! garbage collection, or a new slot on a page not read yet) would appear twice or not at all.
//! There `auto` splits on a one-column primary key, a table without one is read as one chunk
//! (one transaction), and `--chunk-by pages` is refused. Key ranges read in separate
//! transactions give every row whose key does not change exactly once.

use crate::catalog::{ServerInfo, data_pages_per_pointer_page};
use crate::connect::{Session, as_text};
use crate::error::{Phase, classify};
use crate::sql::FbDialect;
use async_trait::async_trait;
use sluice_core::keyrange::{self, KeyQueries, page_runs};
use sluice_core::{
    Chunk, ChunkRequest, ChunkStrategy, Consistency, Dataset, DatasetKind, Error, Result,
};

/// Key-range planning's queries, on the coordinator's attachment (its thread).
struct FbKeys<'a> {
    session: &'a Session,
}

#[async_trait]
impl KeyQueries for FbKeys<'_> {
    async fn text_rows(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
        let (sql, display) = (sql.to_string(), self.session.display().to_string());
        let rows = self
            .session
            .call(move |c| c.query(&sql, vec![]))
            .await?
            .map_err(|e| classify(e, Phase::Catalog, &display))?;
        Ok(rows
            .iter()
            .map(|r| r.iter().map(as_text).collect())
            .collect())
    }
}

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
    page_runs(ds, None, rel.pages, per_run, (rel.bytes, rel.rows), 0)
}

/// Plan the chunks of `ds` on the coordinator's attachment.
pub async fn plan(
    session: &Session,
    ds: &Dataset,
    req: &ChunkRequest,
    server: &ServerInfo,
) -> Result<Vec<Chunk>> {
    let table = ds.kind == DatasetKind::Table;
    let dbkey_ok = server.has_shared_snapshots();
    let per_chunk = req.consistency == Consistency::Chunk;
    let key = match &req.strategy {
        ChunkStrategy::None => None,
        ChunkStrategy::Auto if table && dbkey_ok && !per_chunk => {
            return Ok(pointer_page_runs(ds, req.target_bytes, server.page_size));
        }
        ChunkStrategy::Auto if table && ds.primary_key.len() == 1 => Some(ds.primary_key.clone()),
        ChunkStrategy::Auto => None,
        ChunkStrategy::Physical => {
            if per_chunk {
                return Err(Error::config(format!(
                    "--chunk-by pages cannot be used with --consistency chunk ({}): each chunk \
                     would be read in its own transaction, and a row deleted and inserted again \
                     between two chunk reads can land on a page read before or after, so it \
                     appears twice or not at all. Use --chunk-by auto or key (ranges of the \
                     primary key, exact for every row whose key does not change), or \
                     --consistency snapshot, where page chunks share one snapshot.",
                    ds.name
                )));
            }
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
            return Ok(pointer_page_runs(ds, req.target_bytes, server.page_size));
        }
        ChunkStrategy::Key(cols) => keyrange::requested_key(ds, cols.as_ref(), &ds.primary_key),
    };
    match key {
        Some(cols) => {
            let mut keys = FbKeys { session };
            keyrange::key_ranges(&FbDialect, &mut keys, ds, &cols, req.target_bytes).await
        }
        None => Ok(whole(ds)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::clause::where_clause;
    use sluice_core::columns::field;
    use sluice_core::table::TableRef;
    use sluice_core::{ChunkBounds, ColumnDesc, Relation};

    fn table(pps: u64) -> Dataset {
        let (t, bytes) = (TableRef::new("", "T"), pps * 1000 * 8192);
        let id = ColumnDesc {
            name: "ID".into(),
            source_type: "INTEGER".into(),
            field: field("ID", arrow_schema::DataType::Int32),
            cast: None,
            as_text_fallback: false,
        };
        Dataset::table(
            Relation::new(t, pps, 8192 * 1632, pps * 1000, bytes),
            vec![id],
        )
    }

    /// The pointer-page runs `[first, end)` of `chunks`, in order.
    fn spans(chunks: &[Chunk]) -> Vec<(u64, Option<u64>)> {
        let span = |c: &Chunk| match c.bounds {
            ChunkBounds::Pages { first, end } => (first, end),
            ref other => panic!("not a pointer-page run: {other:?}"),
        };
        chunks.iter().map(span).collect()
    }

    #[test]
    fn runs_cover_every_pointer_page_once_and_end_open() {
        let pp_bytes = 8192 * data_pages_per_pointer_page(8192);
        let chunks = pointer_page_runs(&table(10), 3 * pp_bytes, 8192);
        let runs = [(0, Some(3)), (3, Some(6)), (6, Some(9)), (9, None)];
        assert_eq!(spans(&chunks), runs);
        assert_eq!(chunks.iter().map(|c| c.est_rows).sum::<u64>(), 10_000);
    }

    #[test]
    fn one_pointer_page_is_one_unit() {
        for pps in [0, 1] {
            let chunks = pointer_page_runs(&table(pps), 1, 8192);
            assert_eq!(spans(&chunks), [(0, None)]);
        }
    }

    #[test]
    fn predicates_quote_names() {
        let ds = table(3);
        let p = where_clause(
            &FbDialect,
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
        assert!(where_clause(&FbDialect, &ds, &bad).is_err());
    }
}
