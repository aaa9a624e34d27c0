//! Running the engine from Python: one runtime for the process, a run per call, its batches
//! handed to the calling thread through a bounded channel, and the wait for them done with the
//! GIL released and Ctrl-C checked.
//!
//! A run is the engine's `run_export` with [`FormatOptions::Arrow`](sluice_sink::FormatOptions)
//! over a [`MemoryDestination`](sluice_sink::MemoryDestination) (see `sluice_sink::memory`):
//! the same snapshot shared by every worker, chunking, retries, memory budget and report as an
//! export. The channel holds one event, so a reader that is not consumed stops the workers
//! (the engine's own one-batch channels do the rest) and memory stays within the budget.
//!
//! Interruption: the calling thread waits in slices of [`TICK`] (or until a batch), and after
//! each wait runs Python's signal handlers (`check_signals`). When one raises (Ctrl-C:
//! KeyboardInterrupt), the run is cancelled through the engine's cancellation channel — the
//! path the CLI's SIGINT handling takes — and the call waits, still draining batches, until
//! the run has closed its sessions; then the exception propagates.

use pyo3::prelude::*;
use sluice_core::{Error, Result};
use sluice_engine::{ExportJob, Report, Silent};
use sluice_sink::{ArrowOutput, BatchConsumer, PartKey};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

/// How often a waiting call looks at Python's signals.
const TICK: Duration = Duration::from_millis(50);

/// The process's runtime, started on first use; its threads serve every run.
pub fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("sluice")
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Error::internal(format!("cannot start the async runtime: {e}")))
}

/// What a run tells the calling thread.
pub enum Event {
    /// A part starts, with its schema.
    Open(PartKey, SchemaRef),
    /// A batch of a part.
    Batch(PartKey, RecordBatch),
    /// A part was read whole.
    Finished,
    /// A part failed after delivering this many batches (it may be read again).
    Aborted(PartKey, u64),
}

/// The engine's [`BatchConsumer`]: forwards to the calling thread, waiting for room.
struct Forward(mpsc::Sender<Event>);

impl Forward {
    fn send(&self, e: Event) -> Result<()> {
        // Called on the engine's blocking writer threads, never on a runtime thread.
        self.0
            .blocking_send(e)
            .map_err(|_| Error::interrupted("the reader was closed before the run finished"))
    }
}

impl BatchConsumer for Forward {
    fn open(&self, part: &PartKey, schema: &SchemaRef) -> Result<()> {
        self.send(Event::Open(part.clone(), schema.clone()))
    }

    fn deliver(&self, part: &PartKey, batch: RecordBatch) -> Result<()> {
        self.send(Event::Batch(part.clone(), batch))
    }

    fn finished(&self, _part: &PartKey, _rows: u64) {
        let _ = self.send(Event::Finished);
    }

    fn aborted(&self, part: &PartKey, delivered: u64) {
        let _ = self.send(Event::Aborted(part.clone(), delivered));
    }
}

/// One run of the engine, seen from the calling thread.
pub struct Run {
    events: mpsc::Receiver<Event>,
    task: Option<JoinHandle<Result<Report>>>,
    cancel: watch::Sender<bool>,
    result: Option<Result<Report>>,
    closed: bool,
}

/// What one wait ended with. (One exists at a time: its size does not matter.)
#[allow(clippy::large_enum_variant)]
enum Got {
    /// An event, or `None`: every sender is gone.
    Event(Option<Event>),
    /// The run's task ended.
    Done(std::result::Result<Result<Report>, tokio::task::JoinError>),
    /// Nothing within [`TICK`].
    Nothing,
}

/// What [`Run::next`] returns. (One exists at a time: its size does not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Step {
    /// An event.
    Event(Event),
    /// The run ended: every event was returned before this.
    Done(Result<Report>),
}

impl Run {
    /// The consumer a job's format must hold for [`Run::start`], and the channel it feeds.
    pub fn output() -> (ArrowOutput, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(1);
        (ArrowOutput(Arc::new(Forward(tx))), rx)
    }

    /// Start `job`, whose format holds the sender of `events` (a file export: a channel whose
    /// sender is already dropped).
    pub fn start(job: ExportJob, events: mpsc::Receiver<Event>) -> Result<Run> {
        let (cancel, cancel_rx) = watch::channel(false);
        let task = runtime()?.spawn(sluice_engine::run_export(job, Arc::new(Silent), cancel_rx));
        Ok(Run {
            events,
            task: Some(task),
            cancel,
            result: None,
            closed: false,
        })
    }

    /// Stop the run (parts in flight are discarded; sessions are closed).
    pub fn cancel(&self) {
        let _ = self.cancel.send(true);
    }

    /// Wait for the next event or the end, with the GIL released, running Python's signal
    /// handlers every [`TICK`]. If one raises (KeyboardInterrupt), the run is cancelled and
    /// waited for, and the handler's exception is returned.
    pub fn next(&mut self, py: Python<'_>) -> PyResult<Step> {
        loop {
            let step = self.poll(py);
            // After every wait, not only the idle ones: while batches keep coming, a wait
            // never times out, and Ctrl-C would be seen only once the read is over.
            if let Err(e) = py.check_signals() {
                self.cancel();
                self.finish(py);
                return Err(e);
            }
            match step {
                Ok(Some(step)) => return Ok(step),
                Ok(None) => {}
                Err(e) => return Err(crate::errors::to_py(py, &e)),
            }
        }
    }

    /// One wait of at most [`TICK`]: an event, the end, or nothing yet. Events sent before
    /// the run ended are all returned before its end (its writers finish before it does).
    fn poll(&mut self, py: Python<'_>) -> Result<Option<Step>> {
        if let Some(result) = self.result.take() {
            return Ok(Some(match self.events.try_recv() {
                Ok(e) => {
                    self.result = Some(result);
                    Step::Event(e)
                }
                Err(_) => Step::Done(result),
            }));
        }
        let rt = runtime()?;
        let Some(task) = self.task.as_mut() else {
            return Err(Error::internal("the run's result was already taken"));
        };
        let events = &mut self.events;
        let closed = self.closed;
        let got = py.detach(|| {
            rt.block_on(async {
                tokio::select! {
                    biased;
                    e = events.recv(), if !closed => Got::Event(e),
                    r = task => Got::Done(r),
                    _ = tokio::time::sleep(TICK) => Got::Nothing,
                }
            })
        });
        Ok(match got {
            Got::Event(Some(e)) => Some(Step::Event(e)),
            Got::Event(None) => {
                self.closed = true;
                None
            }
            Got::Done(r) => {
                self.task = None;
                self.result = Some(
                    r.map_err(|e| Error::internal(format!("the run failed: {e}")))
                        .and_then(|r| r),
                );
                return self.poll(py);
            }
            Got::Nothing => None,
        })
    }

    /// Wait for the run to end, discarding its batches (after a cancel, or when the reader
    /// is abandoned). Signals are not checked: the run is already stopping.
    pub fn finish(&mut self, py: Python<'_>) -> Option<Result<Report>> {
        let rt = runtime().ok()?;
        let task = self.task.take()?;
        let events = &mut self.events;
        let joined = py.detach(|| {
            rt.block_on(async {
                let mut task = task;
                loop {
                    tokio::select! {
                        e = events.recv() => if e.is_none() { break (&mut task).await; },
                        r = &mut task => break r,
                    }
                }
            })
        });
        Some(
            joined
                .map_err(|e| Error::internal(format!("the run failed: {e}")))
                .and_then(|r| r),
        )
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // An abandoned reader: stop the run; it winds down on the runtime (its writers fail
        // to send once the channel below is dropped).
        if self.task.is_some() {
            let _ = self.cancel.send(true);
        }
    }
}
