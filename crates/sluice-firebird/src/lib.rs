//! Firebird adapter of sluice.
//!
//! Reads Firebird tables as Arrow batches, many workers at once, all seeing one snapshot
//! (Firebird 4+: shared by snapshot number, each worker's join checked, see `snapshot.rs`),
//! tables split by pointer pages. The client
//! library (`libfbclient.so.2`) is loaded at run time, either a server's client or an
//! embedded engine (see `connect.rs` for URLs and the environment). The files here have the
//! same names in every adapter:
//!
//! | file          | what it does                                                         |
//! |---------------|----------------------------------------------------------------------|
//! | `connect.rs`  | URL, client library, one thread per attachment                       |
//! | `catalog.rs`  | resolve names, describe columns, keys and sizes                      |
//! | `types.rs`    | Firebird types → Arrow, one table                                    |
//! | `snapshot.rs` | the coordinator: snapshot number, worker attachments, exact joins    |
//! | `chunking.rs` | pointer-page runs (`MAKE_DBKEY`), key ranges                          |
//! | `read.rs`     | one chunk as a SELECT, batches handed over one at a time             |
//! | `decode.rs`   | fetched rows → Arrow builders                                        |
//! | `harm.rs`     | what the run costs the database (MON$ tables)                        |
//! | `error.rs`    | SQLCODE → transient / permanent, with the fix                        |
//! | `sql.rs`      | identifier and literal quoting                                       |

pub mod catalog;
pub mod chunking;
pub mod connect;
pub mod decode;
pub mod error;
pub mod harm;
pub mod read;
pub mod snapshot;
pub mod sql;
pub mod types;

use async_trait::async_trait;
use sluice_core::{Coordinator, HarmProbe, Result, Source, SourceOptions};

pub use connect::{FbTarget, shutdown};

/// A Firebird source.
#[derive(Debug, Clone)]
pub struct FbSource {
    target: FbTarget,
}

impl FbSource {
    /// Parse the URL; nothing is loaded or attached yet.
    pub fn new(url: &str) -> Result<Self> {
        Ok(FbSource {
            target: FbTarget::parse(url)?,
        })
    }

    /// True for URLs this adapter serves (`firebird://…`).
    pub fn handles(url: &str) -> bool {
        url.starts_with("firebird://")
    }
}

#[async_trait]
impl Source for FbSource {
    fn engine(&self) -> &'static str {
        "firebird"
    }

    fn display_url(&self) -> String {
        self.target.display().to_string()
    }

    async fn open_coordinator(&self, options: &SourceOptions) -> Result<Box<dyn Coordinator>> {
        Ok(Box::new(
            snapshot::FbCoordinator::open(
                self.target.clone(),
                options.session_tag.clone(),
                options.consistency,
            )
            .await?,
        ))
    }

    async fn open_harm_probe(&self, options: &SourceOptions) -> Result<Box<dyn HarmProbe>> {
        Ok(Box::new(
            harm::FbHarmProbe::open(&self.target, &options.session_tag).await?,
        ))
    }
}
