//! sluice's errors as Python exceptions: one class per [`ErrorKind`] under `SluiceError`,
//! with `retryable` (the error's [`Retry`]) and `kind` attributes. Messages are the engine's,
//! already free of secrets (adapters build them from redacted URLs).

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use sluice_core::{Error, ErrorKind, Retry};

pyo3::create_exception!(
    sluice,
    SluiceError,
    PyException,
    "Base class of every sluice error; `retryable` says whether running again can succeed."
);
pyo3::create_exception!(
    sluice,
    ConfigError,
    SluiceError,
    "The request is wrong (an option, the URL, an unknown table): fix the call."
);
pyo3::create_exception!(
    sluice,
    SourceError,
    SluiceError,
    "The source database refused or failed (connection, authentication, privilege, timeout)."
);
pyo3::create_exception!(
    sluice,
    DestinationError,
    SluiceError,
    "The output location refused or failed (permission, disk full, bucket missing)."
);
pyo3::create_exception!(
    sluice,
    DataError,
    SluiceError,
    "A value cannot be represented in the output as asked."
);
pyo3::create_exception!(
    sluice,
    Interrupted,
    SluiceError,
    "The run was stopped before it finished (its reader was closed early); nothing was left behind."
);
pyo3::create_exception!(
    sluice,
    InternalError,
    SluiceError,
    "A bug in sluice: a broken invariant. Please report it."
);

/// The Python exception for `e`.
pub fn to_py(py: Python<'_>, e: &Error) -> PyErr {
    let message = e.to_string();
    let err = match e.kind() {
        ErrorKind::Config => ConfigError::new_err(message),
        ErrorKind::Source => SourceError::new_err(message),
        ErrorKind::Destination => DestinationError::new_err(message),
        ErrorKind::Data => DataError::new_err(message),
        ErrorKind::Interrupted => Interrupted::new_err(message),
        _ => InternalError::new_err(message),
    };
    let value = err.value(py);
    let kind = match e.kind() {
        ErrorKind::Config => "config",
        ErrorKind::Source => "source",
        ErrorKind::Destination => "destination",
        ErrorKind::Data => "data",
        ErrorKind::Interrupted => "interrupted",
        _ => "internal",
    };
    // Setting attributes on a fresh exception object cannot fail in practice; if it did, the
    // exception is still raised, with the class's default.
    let _ = value.setattr("retryable", e.retry() == Retry::Transient);
    let _ = value.setattr("kind", kind);
    err
}

/// Register the classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for (name, class) in [
        ("SluiceError", py.get_type::<SluiceError>()),
        ("ConfigError", py.get_type::<ConfigError>()),
        ("SourceError", py.get_type::<SourceError>()),
        ("DestinationError", py.get_type::<DestinationError>()),
        ("DataError", py.get_type::<DataError>()),
        ("Interrupted", py.get_type::<Interrupted>()),
        ("InternalError", py.get_type::<InternalError>()),
    ] {
        m.add(name, class)?;
    }
    // Class defaults, so `except SluiceError as e: e.retryable` always works.
    let base = py.get_type::<SluiceError>();
    base.setattr("retryable", false)?;
    base.setattr("kind", "internal")?;
    Ok(())
}
