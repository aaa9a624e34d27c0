//! The database-neutral heart of sluice.
//!
//! Knows no particular database and no file format: it plans (how many workers, how big a
//! chunk, how much memory), hands chunks out one at a time from a single queue, runs bounded
//! reader → writer pipelines, retries what is transient, records every committed part so a
//! killed run can be resumed, samples the harm done to the source, and writes the manifest last.
//!
//! | module      | responsibility                                              |
//! |-------------|-------------------------------------------------------------|
//! | `job`       | the validated request                                       |
//! | `plan`      | the cost and memory model                                   |
//! | `preview`   | `sluice plan`: the plan without reading                     |
//! | `export`    | one run from start to manifest                              |
//! | `prepare`   | before reading: output checks, fresh or resumed plan, run.json |
//! | `finish`    | after reading: manifest, guarantees, report                 |
//! | `queue`     | the work queue, largest chunk first                         |
//! | `worker`    | chunk → part → receipt, with retries                        |
//! | `resume`    | what the output already holds                               |
//! | `retry`     | bounded backoff with jitter                                 |
//! | `harm`      | the harm monitor                                            |
//! | `phase`     | where the time went: numbered phases with durations         |
//! | `report`    | the end-of-run report                                       |
//! | `progress`  | progress callbacks                                          |

pub mod export;
pub mod finish;
pub mod harm;
pub mod job;
pub mod phase;
pub mod plan;
mod prepare;
pub mod preview;
pub mod progress;
pub mod queue;
pub mod report;
pub mod resume;
pub mod retry;
pub mod rss;
pub mod worker;

pub use export::run_export;
pub use job::ExportJob;
pub use phase::{EXPORT_PHASES, PhaseRecord, PhaseTimer};
pub use plan::DEFAULT_MEMORY;
pub use preview::{PlanReport, plan_export};
pub use progress::{Progress, ProgressStart, ProgressTick, Silent};
pub use report::Report;
pub use retry::RetryPolicy;
