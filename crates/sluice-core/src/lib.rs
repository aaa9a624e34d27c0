//! The shared vocabulary of sluice.
//!
//! Every database adapter turns tables into Arrow record batches and every output consumes
//! them, so N databases and M formats need N + M adapters, never N × M. This crate holds the
//! nouns those adapters and the engine agree on — datasets, chunks, positions, errors — and the
//! small traits an adapter implements ([`Source`], [`Coordinator`], [`ChunkReader`],
//! [`HarmProbe`]). It depends on no database driver and no cloud SDK.
//!
//! # Flow of an export
//! ```text
//!  Source ──open_coordinator──▶ Coordinator ──discover/plan_chunks──▶ Datasets + Chunks
//!                                  │ pin_snapshot (one consistent view)
//!                                  └─open_readers(N)──▶ ChunkReader × N ──RecordBatch──▶ sinks
//! ```

pub mod apply;
pub mod batch;
pub mod budget;
pub mod change;
pub mod chunk;
pub mod clause;
pub mod columns;
pub mod error;
pub mod failpoint;
pub mod filter;
pub mod ident;
pub mod keyrange;
pub mod keytext;
pub mod mapping;
pub mod memory;
pub mod position;
pub mod redact;
pub mod select;
pub mod size;
pub mod source;
pub mod table;
pub mod tls;
pub mod values;

pub use batch::{BatchSender, Batching, Cut, Decoder, ReadCounters, ReadLoop};
pub use chunk::{Chunk, ChunkBounds, ChunkRequest, ChunkStrategy};
pub use error::{Error, ErrorKind, Result, Retry};
pub use ident::QualifiedName;
pub use position::{Position, SnapshotInfo, StreamPos};
pub use source::{
    ChunkReader, Consistency, Coordinator, HarmProbe, HarmSample, ReadStats, RunFacts, Source,
    SourceOptions,
};
pub use table::{
    ColumnDesc, ColumnPick, Dataset, DatasetKind, NamedQuery, Relation, Selection, SizeEstimate,
};
