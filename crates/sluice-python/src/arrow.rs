//! Arrow data handed to Python through the Arrow PyCapsule interface: no pyarrow at build
//! time, no copy. A [`Table`] exports a finished read as a C stream (`__arrow_c_stream__`,
//! capsule `arrow_array_stream`), a [`Batch`] one record batch (`__arrow_c_array__`), a
//! [`Schema`] a schema (`__arrow_c_schema__`); pyarrow ≥ 15, polars, DuckDB and others import
//! them with their own constructors (`pyarrow.table(obj)`, `pyarrow.record_batch(obj)`).

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_array::{Array, RecordBatch, RecordBatchIterator, StructArray};
use arrow_schema::SchemaRef;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};

fn arrow_err(e: arrow_schema::ArrowError) -> PyErr {
    PyValueError::new_err(format!("cannot export Arrow data: {e}"))
}

fn schema_capsule<'py>(py: Python<'py>, schema: &SchemaRef) -> PyResult<Bound<'py, PyCapsule>> {
    let ffi = FFI_ArrowSchema::try_from(schema.as_ref()).map_err(arrow_err)?;
    PyCapsule::new_with_value(py, ffi, c"arrow_schema")
}

/// A finished read: its batches in part order, exported once as a C stream.
#[pyclass(module = "sluice._sluice")]
pub struct Table {
    schema: SchemaRef,
    batches: Option<Vec<RecordBatch>>,
}

impl Table {
    /// `batches` (of `schema`), in order.
    pub fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Table {
            schema,
            batches: Some(batches),
        }
    }
}

#[pymethods]
impl Table {
    /// The Arrow C stream of the batches (consumed: a second call fails).
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &mut self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The protocol lets a producer ignore a requested schema: the data is what it is.
        let _ = requested_schema;
        let batches = self
            .batches
            .take()
            .ok_or_else(|| PyValueError::new_err("this result was already imported"))?;
        let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), self.schema.clone());
        let stream = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new_with_value(py, stream, c"arrow_array_stream")
    }

    /// The schema (`__arrow_c_schema__`).
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        schema_capsule(py, &self.schema)
    }
}

/// A schema (`__arrow_c_schema__`).
#[pyclass(module = "sluice._sluice")]
pub struct Schema(pub SchemaRef);

#[pymethods]
impl Schema {
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        schema_capsule(py, &self.0)
    }
}

/// One record batch (`__arrow_c_array__`: a struct array with the batch's columns).
#[pyclass(module = "sluice._sluice")]
pub struct Batch {
    schema: SchemaRef,
    batch: Option<RecordBatch>,
}

impl Batch {
    /// `batch`, exported with `schema` (the stream's, metadata included).
    pub fn new(schema: SchemaRef, batch: RecordBatch) -> Self {
        Batch {
            schema,
            batch: Some(batch),
        }
    }
}

#[pymethods]
impl Batch {
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_array__<'py>(
        &mut self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema;
        let batch = self
            .batch
            .take()
            .ok_or_else(|| PyValueError::new_err("this batch was already imported"))?;
        let array = StructArray::from(batch);
        let data = array.to_data();
        let ffi_array = FFI_ArrowArray::new(&data);
        // The schema of a batch is a struct type whose children are the columns.
        let ffi_schema =
            FFI_ArrowSchema::try_from(arrow_schema::DataType::Struct(self.schema.fields().clone()))
                .map_err(arrow_err)?;
        let s = PyCapsule::new_with_value(py, ffi_schema, c"arrow_schema")?;
        let a = PyCapsule::new_with_value(py, ffi_array, c"arrow_array")?;
        PyTuple::new(py, [s.into_any(), a.into_any()])
    }
}
