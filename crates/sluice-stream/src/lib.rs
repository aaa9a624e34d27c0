//! The change stream runner of sluice, the same for every source engine.
//!
//! An adapter implements [`sluice_core::change::ChangeSource`] (capture objects, snapshot
//! hand-off, the change stream); this crate does the rest: the initial snapshot through the
//! export engine, batches cut by bytes and time, change files committed atomically before the
//! position is saved and before the source may release its log, restart without loss or
//! visible duplicates, `--until-current`, stop on signals, metrics and the report.
//!
//! | module    | responsibility                                                     |
//! |-----------|--------------------------------------------------------------------|
//! | `run`     | one run in order: first start, snapshot (or its resume), streaming |
//! | `snapshot`| the initial snapshot through the export engine, and its resume      |
//! | `pump`    | streaming: batches, confirms, restarts after transient errors       |
//! | `batch`   | the change sink: builders, change files, batches, intents          |
//! | `state`   | the saved state and where it is kept (`redis`: in Redis)           |
//! | `claim`   | the state store's claim kept alive for the whole run               |
//! | `cascades`| foreign-key actions whose changes the source's log leaves out      |
//! | `layout`  | partition maintenance the source's log does not carry              |
//! | `metrics` | Prometheus metrics                                                 |
//! | `apply`   | `sluice replicate`: changes applied to a target database in parallel |

pub mod apply;
pub mod batch;
mod cascades;
mod claim;
pub mod layout;
pub mod metrics;
mod pump;
pub mod redis;
pub mod run;
mod snapshot;
pub mod state;

pub use layout::LayoutChanges;
pub use metrics::Metrics;
pub use redis::RedisState;
pub use run::{
    ExportBuilder, Initial, Stopped, StreamJob, StreamReport, drop_stream, export_builder,
    run_stream,
};
pub use state::{OutputState, STATE_PATH, StateStore, StreamState};
