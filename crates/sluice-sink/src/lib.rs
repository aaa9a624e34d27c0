//! The output side of sluice: formats over destinations.
//!
//! Knows no database. A [`Destination`] stores objects (local disk, or S3, GCS and Azure Blob
//! through [`ObjectStoreDestination`]) and makes each visible only when complete. A [`PartWriter`] turns
//! Arrow batches into one part file in a format (Parquet, CSV, JSON Lines or Avro; text
//! formats optionally gzip or zstd compressed). The `manifest` is written
//! last and is what marks a dataset complete: a reader that sees `manifest.json` sees every
//! part it lists, whole. A run can also keep its data in the process ([`memory`]): batches
//! handed to a consumer, bookkeeping in a [`MemoryDestination`].
//!
//! Writers are synchronous and run on blocking threads: encoding and compression are CPU work,
//! and keeping them off the async runtime lets decoding and encoding overlap.

pub mod avro;
mod cardinality;
pub mod columns;
mod compress;
pub mod csv;
pub mod destination;
pub mod format;
pub mod jsonl;
pub mod layout;
pub mod local;
pub mod lock;
pub mod memory;
pub mod merge;
pub mod objstore;
pub mod objstore_gcs;
mod objstore_lock;
pub mod objstore_url;
mod objstore_versions;
pub mod overlay;
pub mod parquet;
mod render;
pub mod rewrite;
pub mod table;
pub mod upsert;

pub use destination::{Destination, ObjectInfo, ObjectVersion, ObjectWriter, Versioned};
pub use format::{
    AvroCodec, AvroOptions, Compression, CsvOptions, FormatOptions, JsonlOptions, ParquetEncodings,
    ParquetOptions, PartStats, PartWriter, TextCompression, open_part,
};
pub use local::LocalDestination;
pub use lock::{LockHolder, OutputLock};
pub use memory::{ArrowOutput, BatchConsumer, MemoryDestination, PartKey};
pub use objstore::ObjectStoreDestination;
