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
//! compared (`json`, geometry, blobs) are not split on. The arithmetic and the boundary
//! bookkeeping are `sluice_core::keyrange`'s; this file supplies the queries (`MyKeys`) and
//! `sql.rs` the SQL (`MyDialect`).

use crate::error::{Phase, classify};
use crate::sql::MyDialect;
use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};
use sluice_core::keyrange::{self, KeyQueries};
use sluice_core::{Chunk, ChunkRequest, ChunkStrategy, Dataset, DatasetKind, Error, Result};
use std::ops::Range;

/// Key-range planning's queries, on the coordinator's session.
struct MyKeys<'a> {
    conn: &'a mut Conn,
    target: &'a str,
}

#[async_trait]
impl KeyQueries for MyKeys<'_> {
    async fn text_rows(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
        let rows: Vec<Row> = self
            .conn
            .query(sql)
            .await
            .map_err(|e| classify(e, Phase::Catalog, self.target))?;
        Ok(rows
            .iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| match r.as_ref(i) {
                        Some(Value::NULL) | None => None,
                        Some(_) => Some(crate::catalog::text(r, i)),
                    })
                    .collect()
            })
            .collect())
    }

    /// The `rows` column of `EXPLAIN` (answered from index dives, no rows read).
    async fn estimate_rows(&mut self, from: &str, key: &str, range: Range<i128>) -> Option<u64> {
        let (lower, upper) = (range.start, range.end);
        let sql =
            format!("EXPLAIN SELECT 1 FROM {from} WHERE {key} >= {lower} AND {key} < {upper}");
        let rows: Vec<Row> = self.conn.query(sql).await.ok()?;
        let first = rows.first()?;
        let idx = first
            .columns_ref()
            .iter()
            .position(|c| c.name_str().eq_ignore_ascii_case("rows"))?;
        Some(crate::catalog::number(first, idx))
    }
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
    let mut keys = MyKeys { conn, target };
    let key = match &req.strategy {
        ChunkStrategy::None => None,
        ChunkStrategy::Physical => {
            return Err(Error::config(format!(
                "--chunk-by ctid is PostgreSQL's physical split; MySQL/MariaDB has no row \
                 address to range over. Use --chunk-by key (the primary key), --chunk-by \
                 key:<column>, or --chunk-by auto for {}.",
                ds.name
            )));
        }
        ChunkStrategy::Auto if table && !split_key.is_empty() => Some(split_key.to_vec()),
        ChunkStrategy::Auto => None,
        ChunkStrategy::Key(cols) => keyrange::requested_key(ds, cols.as_ref(), split_key),
    };
    match key {
        Some(cols) => {
            keyrange::key_ranges(&MyDialect, &mut keys, ds, &cols, req.target_bytes).await
        }
        None => Ok(vec![Chunk::whole(ds)]),
    }
}
