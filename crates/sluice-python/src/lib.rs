//! `sluice._sluice`: the native half of the Python package (`python/sluice`).
//!
//! Every call takes the keyword arguments the Python functions were given, reads them into the
//! command line's one options definition (`options.rs`), builds the job with the command
//! line's own rules (`sluice_cli::config`), and runs the engine (`run.rs`): reads hand their
//! batches over in this process (`sluice_sink::memory`), exports write files exactly as
//! `sluice export` does. Arrow data leaves through the Arrow PyCapsule interface (`arrow.rs`),
//! errors as one exception class per error kind (`errors.rs`). The Python wrappers add the
//! signatures, docstrings and the conversion to pyarrow objects.

mod arrow;
mod distributed;
mod errors;
mod options;
mod run;

use arrow::{Batch, Schema, Table};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use run::{Event, Run, Step};
use sluice_core::{Error, Result};
use sluice_sink::PartKey;
use std::collections::BTreeMap;
use std::sync::Arc;

fn py_err(py: Python<'_>, e: Error) -> PyErr {
    errors::to_py(py, &e)
}

/// The job of a read from keyword arguments (the command line's options; none given: every
/// default), with the channel its batches come back through.
fn read_job(
    py: Python<'_>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> Result<(sluice_engine::ExportJob, tokio::sync::mpsc::Receiver<Event>)> {
    let empty = PyDict::new(py);
    let options = options::from_kwargs(kwargs.unwrap_or(&empty))?;
    let (output, events) = Run::output();
    let job = sluice_cli::config::memory_job(&options, output)?;
    Ok((job, events))
}

/// A run whose rows come back to this process, started from keyword arguments.
fn start_read(py: Python<'_>, kwargs: &Bound<'_, PyDict>) -> PyResult<Run> {
    let (job, events) = read_job(py, Some(kwargs)).map_err(|e| py_err(py, e))?;
    Run::start(job, events).map_err(|e| py_err(py, e))
}

/// A read must name one dataset: its batches form one table.
fn one_dataset(py: Python<'_>, first: &mut Option<String>, part: &PartKey) -> PyResult<()> {
    match first {
        None => {
            *first = Some(part.dataset.clone());
            Ok(())
        }
        Some(d) if *d == part.dataset => Ok(()),
        Some(d) => Err(py_err(
            py,
            Error::config(format!(
                "the selection holds more than one dataset ({d} and {}): a read returns one \
                 table, so name one table or one query (sluice.export writes many).",
                part.dataset
            )),
        )),
    }
}

/// `read_arrow`: the whole result, its parts in order (a table chunked by key comes back in
/// key order), as a [`Table`] for `pyarrow.table`. A part the engine reads again after a
/// failure replaces what it had delivered.
#[pyfunction]
#[pyo3(signature = (**kwargs))]
fn read(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<(Table, String)> {
    let empty = PyDict::new(py);
    let mut run = start_read(py, kwargs.unwrap_or(&empty))?;
    let mut parts: BTreeMap<PartKey, Vec<RecordBatch>> = BTreeMap::new();
    let mut schema: Option<SchemaRef> = None;
    let mut dataset = None;
    loop {
        match run.next(py)? {
            Step::Event(Event::Open(part, s)) => {
                if let Err(e) = one_dataset(py, &mut dataset, &part) {
                    run.cancel();
                    run.finish(py);
                    return Err(e);
                }
                schema.get_or_insert(s);
                parts.insert(part, Vec::new());
            }
            Step::Event(Event::Batch(part, b)) => parts.entry(part).or_default().push(b),
            Step::Event(Event::Aborted(part, _)) => {
                parts.remove(&part);
            }
            Step::Event(Event::Finished) => {}
            Step::Done(Ok(report)) => {
                let schema = schema.unwrap_or_else(|| Arc::new(arrow_schema::Schema::empty()));
                let batches = parts.into_values().flatten().collect();
                let report = serde_json::to_string(&report)
                    .map_err(|e| py_err(py, Error::internal(e.to_string())))?;
                return Ok((Table::new(schema, batches), report));
            }
            Step::Done(Err(e)) => return Err(py_err(py, e)),
        }
    }
}

/// `read_batches`: the batches as they are read, in the order workers deliver them.
#[pyclass(module = "sluice._sluice")]
struct Stream {
    run: Run,
    schema: SchemaRef,
    /// Each batch converted to Spark's types (a distributed read's task), or as read.
    spark: Option<sluice_sink::columns::TableSchema>,
    dataset: Option<String>,
    report: Option<String>,
    done: bool,
}

#[pyfunction]
#[pyo3(signature = (**kwargs))]
fn stream(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Stream> {
    let empty = PyDict::new(py);
    let run = start_read(py, kwargs.unwrap_or(&empty))?;
    Stream::open(py, run, false)
}

impl Stream {
    /// The stream of `run`'s batches, once its first part gave the schema (a reader needs it
    /// before any batch); in Spark's types when `spark`.
    fn open(py: Python<'_>, mut run: Run, spark: bool) -> PyResult<Stream> {
        loop {
            match run.next(py)? {
                Step::Event(Event::Open(part, schema)) => {
                    let (schema, spark) = if spark {
                        let t = sluice_sink::columns::table_schema(
                            sluice_sink::columns::Kind::Spark,
                            &part.dataset,
                            &schema,
                        )
                        .map_err(|e| py_err(py, e))?;
                        (t.schema.clone(), Some(t))
                    } else {
                        (schema, None)
                    };
                    return Ok(Stream {
                        run,
                        schema,
                        spark,
                        dataset: Some(part.dataset),
                        report: None,
                        done: false,
                    });
                }
                Step::Event(_) => {}
                Step::Done(Ok(report)) => {
                    return Ok(Stream {
                        run,
                        schema: Arc::new(arrow_schema::Schema::empty()),
                        spark: None,
                        dataset: None,
                        report: serde_json::to_string(&report).ok(),
                        done: true,
                    });
                }
                Step::Done(Err(e)) => return Err(py_err(py, e)),
            }
        }
    }

    /// Stop the run and wait for it, then fail with `e`.
    fn fail(&mut self, py: Python<'_>, e: PyErr) -> PyErr {
        self.done = true;
        self.run.cancel();
        self.run.finish(py);
        e
    }
}

#[pymethods]
impl Stream {
    /// The schema of every batch.
    #[getter]
    fn schema(&self) -> Schema {
        Schema(self.schema.clone())
    }

    /// The run's report as JSON, once the last batch was returned.
    #[getter]
    fn report(&self) -> Option<String> {
        self.report.clone()
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        if self.done {
            return Ok(None);
        }
        loop {
            let step = match self.run.next(py) {
                Ok(s) => s,
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            };
            match step {
                Step::Event(Event::Batch(_, b)) => {
                    let b = match &self.spark {
                        Some(t) => match t.convert(&b) {
                            Ok(b) => b,
                            Err(e) => return Err(self.fail(py, py_err(py, e))),
                        },
                        None => b,
                    };
                    return Ok(Some(Batch::new(self.schema.clone(), b)));
                }
                Step::Event(Event::Open(part, _)) => {
                    if let Err(e) = one_dataset(py, &mut self.dataset, &part) {
                        return Err(self.fail(py, e));
                    }
                }
                Step::Event(Event::Finished) => {}
                Step::Event(Event::Aborted(part, delivered)) if delivered > 0 => {
                    let e = Error::source_transient(format!(
                        "{} part {} failed after {delivered} of its batches were returned; \
                         the engine reads a failed part again from its start, which would \
                         return those rows twice, so this reader stops. Read again, or use \
                         read_arrow, which replaces a part read again.",
                        part.dataset, part.ordinal
                    ));
                    return Err(self.fail(py, py_err(py, e)));
                }
                Step::Event(Event::Aborted(..)) => {}
                Step::Done(Ok(report)) => {
                    self.done = true;
                    self.report = serde_json::to_string(&report).ok();
                    return Ok(None);
                }
                Step::Done(Err(e)) => {
                    self.done = true;
                    return Err(py_err(py, e));
                }
            }
        }
    }

    /// Stop reading: the run is cancelled and its sessions closed before this returns.
    fn close(&mut self, py: Python<'_>) {
        if !self.done {
            self.done = true;
            self.run.cancel();
            self.run.finish(py);
        }
    }
}

/// Run a job to its end from Python, checking signals; returns the report as JSON.
fn run_job(py: Python<'_>, job: sluice_engine::ExportJob) -> PyResult<sluice_engine::Report> {
    let (_, events) = Run::output();
    let mut run = Run::start(job, events).map_err(|e| py_err(py, e))?;
    loop {
        match run.next(py)? {
            Step::Event(_) => {}
            Step::Done(r) => return r.map_err(|e| py_err(py, e)),
        }
    }
}

/// `export`: `sluice export`, returning the report as JSON.
#[pyfunction]
#[pyo3(signature = (**kwargs))]
fn export(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let empty = PyDict::new(py);
    let options = options::from_kwargs(kwargs.unwrap_or(&empty)).map_err(|e| py_err(py, e))?;
    let job = sluice_cli::config::export_job(&options).map_err(|e| py_err(py, e))?;
    let report = run_job(py, job)?;
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| py_err(py, Error::internal(e.to_string())))?;
    if let Some(path) = &options.report_json {
        std::fs::write(path, &json).map_err(|e| {
            py_err(
                py,
                Error::destination(
                    sluice_core::Retry::Permanent,
                    format!("could not write the report to {}: {e}", path.display()),
                ),
            )
        })?;
    }
    Ok(json)
}

/// `plan`: `sluice plan --json`.
#[pyfunction]
#[pyo3(signature = (**kwargs))]
fn plan(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let empty = PyDict::new(py);
    let options = options::from_kwargs(kwargs.unwrap_or(&empty)).map_err(|e| py_err(py, e))?;
    let job = sluice_cli::config::job(&options, false).map_err(|e| py_err(py, e))?;
    let rt = run::runtime().map_err(|e| py_err(py, e))?;
    let handle = rt.spawn(async move { sluice_engine::plan_export(&job).await });
    let result: Result<sluice_engine::PlanReport> = py.detach(|| {
        rt.block_on(handle)
            .map_err(|e| Error::internal(format!("planning failed: {e}")))
            .and_then(|r| r)
    });
    let report = result.map_err(|e| py_err(py, e))?;
    serde_json::to_string_pretty(&report).map_err(|e| py_err(py, Error::internal(e.to_string())))
}

/// Release what sources hold for the whole process (the Firebird client library, whose own
/// exit-time shutdown can deadlock with an embedded engine); registered with `atexit`.
#[pyfunction]
fn shutdown() {
    sluice_cli::registry::release_process_resources();
}

/// Log lines on stderr when `SLUICE_LOG` is set (a filter, as for the command line:
/// `SLUICE_LOG=info`, `SLUICE_LOG=sluice=debug`): retries, harm warnings and phases are
/// otherwise silent in Python. Nothing is installed when the variable is unset or when the
/// process already has a global subscriber.
fn init_logging() {
    if let Ok(filter) = std::env::var("SLUICE_LOG")
        && let Ok(filter) = tracing_subscriber::EnvFilter::try_new(filter)
    {
        use std::io::IsTerminal;
        let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(colour)
            .try_init();
    }
}

/// The native module.
#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    errors::register(m)?;
    m.add_class::<Table>()?;
    m.add_class::<Stream>()?;
    m.add_class::<Batch>()?;
    m.add_class::<Schema>()?;
    m.add_function(wrap_pyfunction!(read, m)?)?;
    m.add_function(wrap_pyfunction!(stream, m)?)?;
    m.add_function(wrap_pyfunction!(export, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    distributed::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
