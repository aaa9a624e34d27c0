//! MySQL/MariaDB adapter of sluice.
//!
//! Reads tables, views and queries as Arrow batches, many workers at once, all starting their
//! transactions on one snapshot under the briefest global lock. The files here have the same
//! names in every adapter:
//!
//! | file          | what it does                                                          |
//! |---------------|-----------------------------------------------------------------------|
//! | `connect.rs`  | URL, credentials, session settings, the run's session registry        |
//! | `catalog.rs`  | flavour and version, resolve names, describe columns, keys and sizes  |
//! | `types.rs`    | MySQL/MariaDB types → Arrow, one table                                |
//! | `snapshot.rs` | the coordinator: consistent-snapshot workers, position, run facts     |
//! | `lock.rs`     | the global lock: long-query guard, bounded wait, wait and hold times  |
//! | `non_transactional.rs` | MyISAM/Aria/MEMORY tables: marked, or read-locked for the run |
//! | `chunking.rs` | integer key ranges adapted to rows, stepped boundaries for other keys |
//! | `read.rs`     | one chunk as a streamed `SELECT`                                      |
//! | `decode.rs`   | row values → Arrow builders                                           |
//! | `harm.rs`     | what the run costs the server                                         |
//! | `error.rs`    | error number → transient / permanent, with the fix                    |
//! | `sql.rs`      | identifier (backtick) and literal quoting                             |
//! | `replication/`| change capture from the binary log (`sluice stream`)                  |
//! | `apply/`      | a replication target: tables, bulk load, units applied (`sluice replicate`) |

pub mod apply;
pub mod catalog;
pub mod chunking;
pub mod connect;
pub mod decode;
pub mod error;
pub mod harm;
pub mod lock;
pub mod non_transactional;
pub mod read;
pub mod replication;
pub mod snapshot;
pub mod sql;
pub mod types;

use async_trait::async_trait;
use sluice_core::{Coordinator, HarmProbe, Result, Source, SourceOptions};

pub use apply::MyApplyTarget;
pub use connect::{MyTarget, Sessions};
pub use lock::Locking;

/// A MySQL or MariaDB source.
#[derive(Debug, Clone)]
pub struct MySource {
    target: MyTarget,
    sessions: Sessions,
    locking: Locking,
}

impl MySource {
    /// Parse the URL; no connection is made yet.
    pub fn new(url: &str) -> Result<Self> {
        Ok(MySource {
            target: MyTarget::parse(url)?,
            sessions: Sessions::default(),
            locking: Locking::default(),
        })
    }

    /// Bound the run's lock waits and guard its global lock (see [`Locking`]).
    pub fn with_locking(mut self, locking: Locking) -> Self {
        self.locking = locking;
        self
    }

    /// True for URLs this adapter serves (`mysql://`, `mariadb://`).
    pub fn handles(url: &str) -> bool {
        url.starts_with("mysql://") || url.starts_with("mariadb://")
    }
}

#[async_trait]
impl Source for MySource {
    fn engine(&self) -> &'static str {
        "mysql"
    }

    fn display_url(&self) -> String {
        self.target.display().to_string()
    }

    async fn open_coordinator(&self, options: &SourceOptions) -> Result<Box<dyn Coordinator>> {
        let c = snapshot::MyCoordinator::open(
            self.target.clone(),
            self.sessions.clone(),
            options.consistency,
            self.locking,
        )
        .await?;
        Ok(Box::new(c))
    }

    async fn open_harm_probe(&self, options: &SourceOptions) -> Result<Box<dyn HarmProbe>> {
        let _ = options;
        Ok(Box::new(
            harm::MyHarmProbe::open(&self.target, self.sessions.clone()).await?,
        ))
    }
}
