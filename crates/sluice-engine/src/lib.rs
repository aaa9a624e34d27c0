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
//! | `request`   | the request's fingerprint: options that decide the output, differences |
//! | `plan`      | the cost and memory model                                   |
//! | `preview`   | `sluice plan`: the plan without reading                     |
//! | `converge`  | `--consistency converged`: the change log, delta parts, rewrites |
//! | `distributed` | a plan read by other processes; a snapshot held for them  |
//! | `export`    | one run from start to manifest, in order                    |
//! | `output`    | what the output already holds; removing what nothing vouches for |
//! | `policy`    | fresh, resume or overwrite: what a run does with the output |
//! | `prepare`   | before reading: datasets, plan, snapshot, budgets           |
//! | `planning`  | which chunks a fresh run reads; dataset records             |
//! | `resume`    | which chunks a resumed run reads (again)                    |
//! | `snapshot`  | pinning the snapshot and writing run.json                   |
//! | `worker`    | chunk → part → receipt, with retries; part writers tracked  |
//! | `queue`     | the work queue, largest chunk first                         |
//! | `finish`    | after reading: merge, manifest, guarantees                  |
//! | `manifest`  | the run's bookkeeping: manifest, run state, receipts, harm  |
//! | `report`    | the end-of-run report and its wording                       |
//! | `retry`     | bounded backoff with jitter                                 |
//! | `harm`      | the harm monitor                                            |
//! | `governor`  | the harm budget: signals, the control law, the timeline     |
//! | `html`      | the report as a self-contained HTML page                    |
//! | `phase`     | where the time went: numbered phases with durations         |
//! | `progress`  | progress callbacks                                          |

pub mod converge;
pub mod distributed;
pub mod export;
pub mod finish;
pub mod governor;
pub mod harm;
pub mod html;
pub mod job;
pub mod manifest;
pub mod output;
pub mod phase;
pub mod plan;
pub mod planning;
pub mod policy;
mod prepare;
pub mod preview;
pub mod progress;
pub mod queue;
pub mod report;
pub mod request;
pub mod resume;
pub mod retry;
pub mod rss;
pub mod snapshot;
pub mod worker;

pub use export::run_export;
pub use job::ExportJob;
pub use phase::{EXPORT_PHASES, PhaseRecord, PhaseTimer};
pub use plan::DEFAULT_MEMORY;
pub use preview::{PlanReport, plan_export};
pub use progress::{Progress, ProgressStart, ProgressTick, Silent};
pub use report::Report;
pub use retry::RetryPolicy;
