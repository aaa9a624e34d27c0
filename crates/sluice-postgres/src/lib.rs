//! PostgreSQL adapter of sluice.
//!
//! Reads tables, partitioned tables, views and queries as Arrow batches, many workers at once,
//! all seeing one snapshot. The files here have the same names in every adapter:
//!
//! | file          | what it does                                                         |
//! |---------------|----------------------------------------------------------------------|
//! | `connect.rs`  | URL, credentials, session settings                                   |
//! | `catalog.rs`  | resolve names, describe columns, keys and sizes                      |
//! | `types.rs`    | PostgreSQL types → Arrow, one table                                  |
//! | `snapshot.rs` | the coordinator: exported snapshot, table locks, worker sessions    |
//! | `chunking.rs` | ctid page ranges, key ranges                                         |
//! | `read.rs`     | one chunk as `COPY … (FORMAT binary)`                                |
//! | `decode.rs`   | binary COPY bytes → Arrow builders                                   |
//! | `harm.rs`     | what the run costs the server; who holds or waits for a lock in its way |
//! | `replication/` | change capture: replication protocol, pgoutput, slot, stream   |
//! | `apply/`      | replication target: tables, bulk load, apply sessions           |
//! | `error.rs`    | SQLSTATE → transient / permanent, with the fix                       |
//! | `sql.rs`      | identifier and literal quoting                                       |

pub mod apply;
pub mod catalog;
pub mod chunking;
pub mod connect;
pub mod decode;
pub mod error;
pub mod harm;
pub mod read;
pub mod replication;
pub mod snapshot;
pub mod sql;
pub mod types;

use async_trait::async_trait;
use sluice_core::{Coordinator, HarmProbe, Result, Source, SourceOptions};
use std::sync::Arc;

pub use apply::PgApplyTarget;
pub use connect::PgTarget;

/// A PostgreSQL source.
#[derive(Debug, Clone)]
pub struct PgSource {
    target: PgTarget,
    /// A snapshot to read under instead of exporting one (change capture's slot snapshot).
    imported: Option<sluice_core::SnapshotInfo>,
}

impl PgSource {
    /// Parse the URL; no connection is made yet.
    pub fn new(url: &str) -> Result<Self> {
        Ok(PgSource {
            target: PgTarget::parse(url)?,
            imported: None,
        })
    }

    /// True for URLs this adapter serves.
    pub fn handles(url: &str) -> bool {
        url.starts_with("postgres://") || url.starts_with("postgresql://")
    }
}

#[async_trait]
impl Source for PgSource {
    fn engine(&self) -> &'static str {
        "postgres"
    }

    fn display_url(&self) -> String {
        self.target.display().to_string()
    }

    async fn open_coordinator(&self, options: &SourceOptions) -> Result<Box<dyn Coordinator>> {
        let target = self
            .target
            .clone()
            .with_row_security(options.enable_row_security);
        let c = snapshot::PgCoordinator::open_with(target, options, self.imported.as_ref()).await?;
        Ok(Box::new(c))
    }

    async fn open_harm_probe(&self, options: &SourceOptions) -> Result<Box<dyn HarmProbe>> {
        Ok(Box::new(
            harm::PgHarmProbe::open(&self.target, &options.session_tag).await?,
        ))
    }

    async fn change_counts(
        &self,
        datasets: &[sluice_core::Dataset],
    ) -> Result<Option<std::collections::BTreeMap<String, u64>>> {
        let client = self.target.connect("sluice-plan").await?;
        let mut out = std::collections::BTreeMap::new();
        for d in datasets {
            let Some(t) = &d.object else { continue };
            let row = client
                .query_one(
                    "SELECT coalesce(sum(s.n_tup_ins + s.n_tup_upd + s.n_tup_del), 0)::int8 \
                     FROM pg_stat_user_tables s \
                     WHERE s.relid = to_regclass($1) \
                        OR s.relid IN (SELECT relid FROM pg_partition_tree(to_regclass($1)))",
                    &[&sql::quote_table(t)],
                )
                .await
                .map_err(|e| error::classify(e, error::Phase::Catalog, self.target.display()))?;
            out.insert(d.name.clone(), row.get::<_, i64>(0).max(0) as u64);
        }
        Ok(Some(out))
    }

    /// `SET TRANSACTION SNAPSHOT` works from any host while the exporting transaction lives.
    fn importing(&self, snapshot: &sluice_core::SnapshotInfo) -> Result<Arc<dyn Source>> {
        if snapshot.id.is_none() {
            return Err(sluice_core::Error::config(
                "a shared snapshot without a name cannot be imported",
            ));
        }
        Ok(Arc::new(PgSource {
            target: self.target.clone(),
            imported: Some(snapshot.clone()),
        }))
    }
}
