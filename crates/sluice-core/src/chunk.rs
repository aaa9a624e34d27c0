//! Units of work: how a dataset is split so several workers can read it at once.
//!
//! A chunk is one part file. Its bounds are engine-neutral: physical page ranges (PostgreSQL
//! ctid pages, Firebird pointer pages) or key ranges (any engine). Key values travel as text and
//! the adapter casts them back to the column type inside its own quoting, so a chunk can be
//! saved in the run state and replayed by a resumed run.

use crate::source::Consistency;
use crate::table::{Dataset, TableRef};
use serde::{Deserialize, Serialize};
use std::fmt;

/// How the user wants datasets split (`--chunk-by`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkStrategy {
    /// Let the adapter choose: physical ranges where the engine has them, else the key.
    #[default]
    Auto,
    /// Physical page ranges (PostgreSQL ctid, Firebird pointer pages).
    Physical,
    /// Key ranges on the primary key, or on the named column(s).
    Key(Option<Vec<String>>),
    /// No split: one chunk per dataset (or per partition).
    None,
}

impl fmt::Display for ChunkStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkStrategy::Auto => f.write_str("auto"),
            ChunkStrategy::Physical => f.write_str("ctid"),
            ChunkStrategy::Key(None) => f.write_str("key"),
            ChunkStrategy::Key(Some(c)) => write!(f, "key:{}", c.join(",")),
            ChunkStrategy::None => f.write_str("none"),
        }
    }
}

/// The planner's request to an adapter: how to split and how big a chunk should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRequest {
    /// Strategy asked for.
    pub strategy: ChunkStrategy,
    /// Target size of one chunk in source bytes (on-disk heap + TOAST).
    pub target_bytes: u64,
    /// How the chunks will be read. With [`Consistency::Chunk`] each chunk is its own
    /// transaction, so a plan must not depend on where rows are stored (see
    /// [`Chunk::is_physical`]): physical chunks would lose or repeat rows that move. With
    /// [`Consistency::Converged`] they are read the same way, but a row that moves was changed,
    /// and every changed row is removed from every part and read again at the end: physical
    /// chunks are safe.
    pub consistency: Consistency,
}

/// The range of rows one chunk covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ChunkBounds {
    /// Every row of the relation (or query).
    Whole,
    /// Physical pages `[first, end)`; `end = None` means "to the end", so pages added after
    /// planning are still read.
    Pages {
        /// First page, inclusive.
        first: u64,
        /// End page, exclusive; `None` for open-ended.
        end: Option<u64>,
    },
    /// Keyset range `lower <= (columns) < upper` in the key's sort order; a missing bound is
    /// open. Values are text, cast back by the adapter.
    Keys {
        /// Key columns, in order.
        columns: Vec<String>,
        /// Inclusive lower bound, one text value per column.
        lower: Option<Vec<String>>,
        /// Exclusive upper bound, one text value per column.
        upper: Option<Vec<String>>,
    },
    /// Rows where any column of a nullable, user-chosen key is NULL. Key ranges over such a
    /// key exclude those rows explicitly, so every row lands in exactly one chunk.
    KeyNulls {
        /// The key columns.
        columns: Vec<String>,
    },
    /// Exactly the rows with these keys (a converged export's rows changed during the run,
    /// read again at its end). Values are text, cast back by the adapter, as for `Keys`.
    KeySet {
        /// Key columns, in order.
        columns: Vec<String>,
        /// The keys, one text value per column each.
        keys: Vec<Vec<String>>,
    },
}

impl fmt::Display for ChunkBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkBounds::Whole => f.write_str("all rows"),
            ChunkBounds::Pages {
                first,
                end: Some(e),
            } => write!(f, "pages {first}..{e}"),
            ChunkBounds::Pages { first, end: None } => write!(f, "pages {first}.."),
            ChunkBounds::Keys {
                columns,
                lower,
                upper,
            } => {
                let show = |v: &Option<Vec<String>>| match v {
                    Some(v) => format!("({})", v.join(", ")),
                    None => "∞".to_string(),
                };
                write!(
                    f,
                    "({}) in [{}, {})",
                    columns.join(", "),
                    show(lower),
                    show(upper)
                )
            }
            ChunkBounds::KeyNulls { columns } => write!(f, "NULL in ({})", columns.join(", ")),
            // Not the count: a delta chunk's list is read in only as its chunk starts.
            ChunkBounds::KeySet { columns, .. } => {
                write!(f, "changed keys of ({})", columns.join(", "))
            }
        }
    }
}

/// One unit of work, and one part file of output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// The dataset this chunk belongs to.
    pub dataset: String,
    /// Part number within the dataset; names the part file (`part-00042`).
    pub ordinal: u32,
    /// The physical relation to read (a leaf partition), or `None` for the dataset's own
    /// table, view or query.
    pub relation: Option<TableRef>,
    /// Which rows.
    pub bounds: ChunkBounds,
    /// Estimated source bytes, used to order the queue largest first.
    pub est_bytes: u64,
    /// Estimated rows.
    pub est_rows: u64,
}

impl Chunk {
    /// Chunk `ordinal` of `ds` over `bounds`, reading the dataset's own relation; every
    /// adapter's chunk planner builds its chunks through this (set `relation` for a leaf).
    pub fn new(ds: &Dataset, ordinal: usize, bounds: ChunkBounds, bytes: u64, rows: u64) -> Chunk {
        Chunk {
            dataset: ds.name.clone(),
            ordinal: ordinal as u32,
            relation: None,
            bounds,
            est_bytes: bytes,
            est_rows: rows,
        }
    }

    /// True when which rows this chunk covers depends on where rows are stored — a page range,
    /// or one partition of a partitioned table — rather than on their values. An UPDATE can
    /// move a row out of such a chunk into another, so chunks of one dataset read in different
    /// transactions (or snapshots) can miss or repeat that row; key ranges and whole-dataset
    /// chunks cannot.
    pub fn is_physical(&self) -> bool {
        matches!(self.bounds, ChunkBounds::Pages { .. }) || self.relation.is_some()
    }

    /// The whole of `ds` as one chunk, carrying the dataset's size estimate.
    pub fn whole(ds: &Dataset) -> Chunk {
        Chunk::new(
            ds,
            0,
            ChunkBounds::Whole,
            ds.estimate.bytes,
            ds.estimate.rows,
        )
    }
}
