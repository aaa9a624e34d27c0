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
use crate::sql::PgDialect;
use async_trait::async_trait;
use sluice_core::keyrange::{self, KeyQueries, page_runs, parts_for};
use sluice_core::table::TableRef;
use sluice_core::{
    Chunk, ChunkBounds, ChunkRequest, ChunkStrategy, Consistency, Dataset, DatasetKind, Error,
    Result,
};
use tokio_postgres::{Client, SimpleQueryMessage};

/// TID range scans arrived in PostgreSQL 14; before that a ctid range is a full scan per chunk.
pub const TID_RANGE_SCAN_VERSION: i32 = 140_000;

/// Key-range planning's queries, on the coordinator's session (inside its snapshot).
struct PgKeys<'a> {
    client: &'a Client,
    target: &'a str,
}

#[async_trait]
impl KeyQueries for PgKeys<'_> {
    /// Over the simple-query protocol, which returns every value as its text.
    async fn text_rows(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
        let messages = self
            .client
            .simple_query(sql)
            .await
            .map_err(|e| classify(e, Phase::Catalog, self.target))?;
        Ok(messages
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                }
                _ => None,
            })
            .collect())
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
            .map(|(i, r)| Chunk {
                relation: Some(r.table.clone()),
                ..Chunk::new(ds, i, ChunkBounds::Whole, r.bytes, r.rows)
            })
            .collect();
    }
    vec![Chunk::whole(ds)]
}

fn physical(ds: &Dataset, target: u64) -> Vec<Chunk> {
    let mut out = Vec::new();
    for rel in &ds.relations {
        let leaf: Option<&TableRef> = Some(&rel.table);
        if ds.outside_snapshot.contains(&rel.table.to_string()) {
            // A foreign partition has no pages here: it is read whole, from its server.
            out.push(Chunk {
                relation: Some(rel.table.clone()),
                ..Chunk::new(ds, out.len(), ChunkBounds::Whole, rel.bytes, rel.rows)
            });
            continue;
        }
        let n = parts_for(rel.bytes, target).min(rel.pages.max(1));
        let step = rel.pages.div_ceil(n).max(1);
        let first = out.len();
        out.extend(page_runs(
            ds,
            leaf,
            rel.pages,
            step,
            (rel.bytes, rel.rows),
            first,
        ));
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
    let keyed = matches!(ds.kind, DatasetKind::Table | DatasetKind::Partitioned)
        && !ds.primary_key.is_empty();
    let mut keys = PgKeys { client, target };
    let keys = &mut keys;
    let by_key = async |cols: Vec<String>, keys: &mut PgKeys<'_>| {
        keyrange::key_ranges(&PgDialect, keys, ds, &cols, req.target_bytes).await
    };
    match &req.strategy {
        // One transaction per chunk: a partitioned table's rows can move between partitions,
        // so it is read through its parent in one piece.
        ChunkStrategy::None if per_chunk => Ok(vec![Chunk::whole(ds)]),
        ChunkStrategy::None => Ok(whole(ds)),
        ChunkStrategy::Auto if per_chunk && keyed => by_key(ds.primary_key.clone(), keys).await,
        ChunkStrategy::Auto if per_chunk => Ok(vec![Chunk::whole(ds)]),
        ChunkStrategy::Auto if physical_ok && tid_ok => Ok(physical(ds, req.target_bytes)),
        ChunkStrategy::Auto if keyed => by_key(ds.primary_key.clone(), keys).await,
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
            match keyrange::requested_key(ds, cols.as_ref(), &ds.primary_key) {
                Some(cols) => by_key(cols, keys).await,
                None if per_chunk => Ok(vec![Chunk::whole(ds)]),
                None => Ok(whole(ds)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Relation;

    /// `public.t`: `pages` full 8 KB pages of 10 rows each.
    fn table_of(pages: u64) -> Dataset {
        let relation = Relation::new(TableRef::new("public", "t"), pages, 8192, pages * 10, 0);
        Dataset::table(
            Relation {
                bytes: pages * 8192,
                ..relation
            },
            Vec::new(),
        )
    }

    #[test]
    fn page_ranges_cover_everything_once_and_end_open() {
        let ds = table_of(1000);
        let chunks = physical(&ds, 100 * 8192);
        // Ten runs of 100 pages in order, the last one open.
        let want = (0..10).map(|i| ChunkBounds::Pages {
            first: i * 100,
            end: (i < 9).then_some((i + 1) * 100),
        });
        assert!(
            chunks
                .iter()
                .map(|c| &c.bounds)
                .eq(want.collect::<Vec<_>>().iter())
        );
        assert!(
            chunks
                .iter()
                .enumerate()
                .all(|(i, c)| c.ordinal as usize == i)
        );
        assert_eq!(chunks.iter().map(|c| c.est_rows).sum::<u64>(), 10_000);
    }

    #[test]
    fn empty_and_tiny_tables_get_one_open_chunk() {
        for pages in [0, 1] {
            let chunks = physical(&table_of(pages), 1 << 20);
            let open = ChunkBounds::Pages {
                first: 0,
                end: None,
            };
            assert!(matches!(&chunks[..], [c] if c.bounds == open), "{chunks:?}");
        }
    }
}
