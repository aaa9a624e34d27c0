//! The native half of `sluice.spark` (`python/sluice/spark.py`): a read planned in one
//! process and carried out chunk by chunk in others, optionally under one snapshot that a
//! third process holds (see `sluice_engine::distributed`).
//!
//! - `plan_read(snapshot=None, **kw)`: the dataset's schema in Spark's types, its name, its
//!   chunks (each as JSON, the form they travel in to a task) and the guarantee a read gives.
//! - `read_chunks(chunks, snapshot=None, **kw)`: the batches of those chunks, in Spark's types.
//! - `hold_snapshot(**kw)`: a [`Holder`] whose `token` the reads take and whose `release()`
//!   ends the snapshot and returns what holding it cost, as JSON.
//! - `begin_export(**kw)`: a distributed export's [`Driver`] (its `spec` and `chunks` go to the
//!   tasks; `finish(results)` writes the manifest) — or the report of an output already
//!   complete; `write_chunks(chunks, spec, **kw)`: one task, returning its account as JSON.
//!
//! The snapshot travels as its token, a JSON text (Spark options are text). It names the
//! snapshot, the tables its holder locked and the holder's session tag; no URL, no secret.

use crate::arrow::Schema;
use crate::run::{self, Run};
use crate::{Stream, py_err};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_core::{Chunk, Consistency, Error, Result};
use sluice_engine::distributed::{self, Held, SharedSnapshot, export};

/// The shared snapshot a token names; a malformed one is a configuration error.
fn shared(token: Option<&str>) -> Result<Option<SharedSnapshot>> {
    token
        .map(|t| {
            serde_json::from_str(t).map_err(|e| {
                Error::config(format!(
                    "the snapshot option is not a token of sluice.spark.snapshot ({e}): pass the \
                     object the with-block gives (option(\"snapshot\", snap))."
                ))
            })
        })
        .transpose()
}

/// Run `f` on the runtime with the GIL released.
fn block<T: Send + 'static>(
    py: Python<'_>,
    f: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let rt = run::runtime()?;
    let handle = rt.spawn(f);
    py.detach(|| {
        rt.block_on(handle)
            .map_err(|e| Error::internal(format!("the call failed: {e}")))
            .and_then(|r| r)
    })
}

/// The plan of a read as Python gets it: (schema in Spark's types, dataset, chunks as JSON,
/// guarantee, notes on types).
type ReadPlan = (Schema, String, Vec<String>, String, Vec<String>);

/// The plan of a read: see [`ReadPlan`].
#[pyfunction]
#[pyo3(signature = (snapshot=None, **kwargs))]
fn plan_read(
    py: Python<'_>,
    snapshot: Option<String>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<ReadPlan> {
    let planned = || -> Result<_> {
        let shared = shared(snapshot.as_deref())?;
        let (mut job, _) = crate::read_job(py, kwargs)?;
        if shared.is_some() && job.consistency == Consistency::Chunk && explicit(kwargs) {
            return Err(Error::config(
                "consistency=\"chunk\" and a shared snapshot contradict each other: leave out \
                 the snapshot option for per-chunk reads, or consistency for the snapshot's.",
            ));
        }
        if shared.is_none() && job.consistency == Consistency::Snapshot && explicit(kwargs) {
            return Err(Error::config(
                "consistency=\"snapshot\" across Spark tasks needs one shared snapshot: read \
                 inside `with sluice.spark.snapshot(spark, source=…, tables=…) as snap:` with \
                 .option(\"snapshot\", snap). Without it each chunk is its own transaction \
                 (consistency \"chunk\").",
            ));
        }
        job.consistency = if shared.is_some() {
            Consistency::Snapshot
        } else {
            Consistency::Chunk
        };
        let plan = block(py, {
            let job = job.clone();
            async move { distributed::plan_read(&job).await }
        })?;
        let [dataset] = plan.datasets.as_slice() else {
            return Err(Error::config(format!(
                "a Spark read returns one table, but the selection holds {} datasets ({}): \
                 name one table (option(\"table\", …)) or one query.",
                plan.datasets.len(),
                plan.datasets
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let guarantee = match &shared {
            Some(s) => {
                if !s.datasets.contains(&dataset.name) {
                    return Err(distributed::unprotected(&dataset.name, s));
                }
                format!(
                    "snapshot: every partition reads the snapshot taken at {} ({})",
                    s.position_text, s.snapshot.taken_at
                )
            }
            None => "chunk: each partition is its own transaction; rows changed during the \
                     read may be seen in either state"
                .to_string(),
        };
        let spark = sluice_sink::columns::table_schema(
            sluice_sink::columns::Kind::Spark,
            &dataset.name,
            &dataset.arrow_schema(),
        )?;
        let chunks = plan
            .chunks
            .iter()
            .map(|c| serde_json::to_string(c).map_err(|e| Error::internal(e.to_string())))
            .collect::<Result<Vec<_>>>()?;
        Ok((
            Schema(spark.schema.clone()),
            dataset.name.clone(),
            chunks,
            guarantee,
            spark.notes,
        ))
    };
    planned().map_err(|e| py_err(py, e))
}

/// Whether the caller named a consistency (rather than taking the default).
fn explicit(kwargs: Option<&Bound<'_, PyDict>>) -> bool {
    kwargs.is_some_and(|k| k.contains("consistency").unwrap_or(false))
}

/// The batches of `chunks` (JSON, as `plan_read` gave them), in Spark's types, read under the
/// snapshot `snapshot` names or each chunk in its own transaction; only the rows that meet
/// every one of `filters` (JSON, `sluice_core::filter::RowFilter`s: Spark's pushed filters)
/// are read.
#[pyfunction]
#[pyo3(signature = (chunks, snapshot=None, filters=None, **kwargs))]
fn read_chunks(
    py: Python<'_>,
    chunks: Vec<String>,
    snapshot: Option<String>,
    filters: Option<String>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Stream> {
    let started = || -> Result<Run> {
        let shared = shared(snapshot.as_deref())?;
        let chunks = chunks
            .iter()
            .map(|c| {
                serde_json::from_str::<Chunk>(c).map_err(|e| {
                    Error::config(format!("a chunk to read is not one plan_read gave: {e}"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (mut job, events) = crate::read_job(py, kwargs)?;
        if let Some(f) = filters.as_deref() {
            job.selection.row_filter = serde_json::from_str(f).map_err(|e| {
                Error::config(format!("the row filters to push are not sluice's: {e}"))
            })?;
        }
        let job = distributed::task(job, chunks, shared.as_ref())?;
        Run::start(job, events)
    };
    let run = started().map_err(|e| py_err(py, e))?;
    Stream::open(py, run, true)
}

/// A snapshot held for the reads of a `with sluice.spark.snapshot(…)` block.
#[pyclass(module = "sluice._sluice")]
struct Holder {
    /// In a mutex only because a Python class must be shareable between threads; Python
    /// calls reach it one at a time.
    held: std::sync::Mutex<Option<Held>>,
    token: String,
}

/// Take and hold a snapshot of the selection the keywords name.
#[pyfunction]
#[pyo3(signature = (**kwargs))]
fn hold_snapshot(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Holder> {
    let held = || -> Result<Holder> {
        let (job, _) = crate::read_job(py, kwargs)?;
        let held = block(py, async move { distributed::hold(&job).await })?;
        let token =
            serde_json::to_string(held.shared()).map_err(|e| Error::internal(e.to_string()))?;
        Ok(Holder {
            held: std::sync::Mutex::new(Some(held)),
            token,
        })
    };
    held().map_err(|e| py_err(py, e))
}

#[pymethods]
impl Holder {
    /// What a read needs to join the snapshot (JSON text).
    #[getter]
    fn token(&self) -> String {
        self.token.clone()
    }

    /// End the snapshot; what holding it cost, as JSON. A second call returns None.
    fn release(&mut self, py: Python<'_>) -> PyResult<Option<String>> {
        let Some(held) = self.held.lock().ok().and_then(|mut h| h.take()) else {
            return Ok(None);
        };
        let report = block(py, async move { held.release().await }).map_err(|e| py_err(py, e))?;
        serde_json::to_string(&report)
            .map(Some)
            .map_err(|e| py_err(py, Error::internal(e.to_string())))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // A holder dropped without release (the block's process ends): end the snapshot on
        // the runtime rather than leave its session open until the server notices.
        let held = self.held.get_mut().ok().and_then(|h| h.take());
        if let (Some(held), Ok(rt)) = (held, run::runtime()) {
            rt.spawn(async move {
                let _ = held.release().await;
            });
        }
    }
}

/// The job of a file export from keyword arguments (`sluice export`'s options).
fn export_job(
    kwargs: Option<&Bound<'_, PyDict>>,
    py: Python<'_>,
) -> Result<sluice_engine::ExportJob> {
    let empty = PyDict::new(py);
    let options = crate::options::from_kwargs(kwargs.unwrap_or(&empty))?;
    sluice_cli::config::job(&options, true)
}

/// The driver of a distributed export, between its plan and its manifest.
#[pyclass(module = "sluice._sluice")]
struct Driver {
    /// In a mutex only because a Python class must be shareable between threads.
    driver: std::sync::Mutex<Option<export::Driver>>,
    spec: String,
    chunks: Vec<String>,
}

/// Start a distributed export: `(None, report JSON)` when the output is already complete,
/// else `(driver, None)`.
#[pyfunction]
#[pyo3(signature = (**kwargs))]
fn begin_export(
    py: Python<'_>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Option<Driver>, Option<String>)> {
    let begun = || -> Result<(Option<Driver>, Option<String>)> {
        let job = export_job(kwargs, py)?;
        match block(py, async move { export::begin(job).await })? {
            export::Begun::Complete(report) => Ok((
                None,
                Some(serde_json::to_string(&report).map_err(|e| Error::internal(e.to_string()))?),
            )),
            export::Begun::Ready(driver) => {
                let spec = serde_json::to_string(driver.spec())
                    .map_err(|e| Error::internal(e.to_string()))?;
                let chunks = driver
                    .chunks()
                    .iter()
                    .map(|c| serde_json::to_string(c).map_err(|e| Error::internal(e.to_string())))
                    .collect::<Result<Vec<_>>>()?;
                Ok((
                    Some(Driver {
                        driver: std::sync::Mutex::new(Some(*driver)),
                        spec,
                        chunks,
                    }),
                    None,
                ))
            }
        }
    };
    begun().map_err(|e| py_err(py, e))
}

impl Driver {
    fn take(&self) -> Result<export::Driver> {
        self.driver
            .lock()
            .ok()
            .and_then(|mut d| d.take())
            .ok_or_else(|| {
                Error::config("this distributed export was already finished or abandoned")
            })
    }
}

#[pymethods]
impl Driver {
    /// What every task is given (JSON).
    #[getter]
    fn spec(&self) -> String {
        self.spec.clone()
    }

    /// The chunks the tasks must write, each as JSON.
    #[getter]
    fn chunks(&self) -> Vec<String> {
        self.chunks.clone()
    }

    /// Write the manifest from every receipt; `results` are the tasks' JSON accounts.
    /// Returns the report as JSON.
    fn finish(&self, py: Python<'_>, results: Vec<String>) -> PyResult<String> {
        let done = || -> Result<String> {
            let results = results
                .iter()
                .map(|r| {
                    serde_json::from_str::<export::TaskResult>(r)
                        .map_err(|e| Error::internal(format!("a task's result: {e}")))
                })
                .collect::<Result<Vec<_>>>()?;
            let driver = self.take()?;
            let report = block(py, async move { driver.finish(results).await })?;
            serde_json::to_string(&report).map_err(|e| Error::internal(e.to_string()))
        };
        done().map_err(|e| py_err(py, e))
    }

    /// Give up: release the snapshot and the output's lock, write no manifest.
    fn abandon(&self, py: Python<'_>) {
        if let Ok(driver) = self.take() {
            let _ = block(py, async move {
                driver.abandon().await;
                Ok(())
            });
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let driver = self.driver.get_mut().ok().and_then(|d| d.take());
        if let (Some(driver), Ok(rt)) = (driver, run::runtime()) {
            rt.spawn(driver.abandon());
        }
    }
}

/// A task of a distributed export: write `chunks` (JSON, from the driver) as parts with their
/// receipts under the driver's `spec`; returns the task's account as JSON.
#[pyfunction]
#[pyo3(signature = (chunks, spec, **kwargs))]
fn write_chunks(
    py: Python<'_>,
    chunks: Vec<String>,
    spec: String,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let written = || -> Result<String> {
        let spec: export::TaskSpec = serde_json::from_str(&spec)
            .map_err(|e| Error::config(format!("not a distributed export's task spec: {e}")))?;
        let chunks = chunks
            .iter()
            .map(|c| {
                serde_json::from_str::<Chunk>(c)
                    .map_err(|e| Error::config(format!("not a chunk of the driver's plan: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let job = export_job(kwargs, py)?;
        let result = block(
            py,
            async move { export::write_parts(job, &spec, chunks).await },
        )?;
        serde_json::to_string(&result).map_err(|e| Error::internal(e.to_string()))
    };
    written().map_err(|e| py_err(py, e))
}

/// Add this module's functions and classes to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Holder>()?;
    m.add_class::<Driver>()?;
    m.add_function(wrap_pyfunction!(begin_export, m)?)?;
    m.add_function(wrap_pyfunction!(write_chunks, m)?)?;
    m.add_function(wrap_pyfunction!(plan_read, m)?)?;
    m.add_function(wrap_pyfunction!(read_chunks, m)?)?;
    m.add_function(wrap_pyfunction!(hold_snapshot, m)?)?;
    Ok(())
}
