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
//! | `job`     | the request, the report, and what every phase uses                 |
//! | `run`     | one run in order: first start, snapshot (or its resume), streaming |
//! | `start`   | a capture's first start, for every output                          |
//! | `snapshot`| the initial snapshot through the export engine, and its resume      |
//! | `added`   | tables created or dropped on the source while a stream runs        |
//! | `drive`   | the read and restart loops every output runs under (`Output`)      |
//! | `pump`    | change files as an `Output`: batches cut by bytes and time          |
//! | `batch`   | the change sink: builders, change files, batches, intents          |
//! | `files`   | change files' layout (`--layout`) and operations kept (`--ops`)     |
//! | `state`   | the saved state and where it is kept (`redis`: in Redis)           |
//! | `claim`   | the state store's claim kept alive for the whole run               |
//! | `converge`| the change log of a converged export (`--consistency converged`) |
//! | `cascades`| foreign-key actions whose changes the source's log leaves out      |
//! | `layout`  | partition maintenance the source's log does not carry              |
//! | `metrics` | Prometheus metrics                                                 |
//! | `apply`   | `sluice replicate`: changes applied to a target database in parallel |

mod added;
pub mod apply;
pub mod batch;
mod cascades;
mod claim;
pub mod converge;
mod drive;
pub mod files;
mod job;
pub mod layout;
pub mod metrics;
mod pump;
pub mod redis;
pub mod run;
mod snapshot;
mod standby;
mod start;
pub mod state;

pub use added::AddedTable;
pub use converge::ConvergeLog;
pub use files::{ChangeFiles, ChangeLayout, OpFilter};
pub use job::{Capture, ExportBuilder, Initial, Stopped, StreamJob, StreamReport, export_builder};
pub use layout::LayoutChanges;
pub use metrics::Metrics;
pub use redis::RedisState;
pub use run::{drop_stream, run_stream};
pub use state::{OutputState, STATE_PATH, StateStore, StreamState};
