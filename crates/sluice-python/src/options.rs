//! Keyword arguments → the CLI's one options definition (`sluice_cli::args::Options`).
//!
//! Python keyword names are the YAML keys (the flags' names with `_` for `-`), so the mapping
//! is the YAML file's: the keywords become a JSON object deserialized into `Options`, with
//! the same parsers (sizes as numbers or text, lists or single names, maps for `query` and
//! `storage_option`) and the same refusal of unknown names. Every check after that is
//! `sluice_cli::config`'s, shared with the command line.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Value};
use sluice_cli::args::Options;
use sluice_core::{Error, Result};

/// One Python value as JSON; `None` for Python's None (the option is left unset).
fn value(key: &str, v: &Bound<'_, PyAny>) -> Result<Option<Value>> {
    if v.is_none() {
        return Ok(None);
    }
    if v.is_instance_of::<PyBool>() {
        return Ok(Some(Value::Bool(v.extract::<bool>().unwrap_or(false))));
    }
    if v.is_instance_of::<PyInt>() {
        return match v.extract::<i64>() {
            Ok(i) => Ok(Some(Value::from(i))),
            Err(_) => Err(Error::config(format!("{key}= is out of range."))),
        };
    }
    if v.is_instance_of::<PyFloat>() {
        return Err(Error::config(format!(
            "{key}= takes a whole number or a text such as \"64MB\", not a float."
        )));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(Some(Value::String(v.extract::<String>().map_err(|e| {
            Error::config(format!("{key}= is not valid text: {e}"))
        })?)));
    }
    if let Ok(path) = v.call_method0("__fspath__") {
        return value(key, &path);
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let mut out = Vec::new();
        for item in v
            .try_iter()
            .map_err(|e| Error::config(format!("{key}=: {e}")))?
        {
            let item = item.map_err(|e| Error::config(format!("{key}=: {e}")))?;
            if let Some(x) = value(key, &item)? {
                out.push(x);
            }
        }
        return Ok(Some(Value::Array(out)));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut out = Map::new();
        for (k, item) in d.iter() {
            let k: String = k
                .extract()
                .map_err(|_| Error::config(format!("{key}= must be a dict with text keys.")))?;
            // Map values are text in the YAML file (`allow_http: "true"`); numbers and
            // booleans are written the way the file would spell them.
            let text = match value(key, &item)? {
                Some(Value::String(s)) => s,
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => {
                    return Err(Error::config(format!(
                        "{key}= values must be text, numbers or booleans."
                    )));
                }
            };
            out.insert(k, Value::String(text));
        }
        return Ok(Some(Value::Object(out)));
    }
    let type_name = v
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    Err(Error::config(format!(
        "{key}= cannot be a {type_name}: give text, a number, a boolean, a list or a dict."
    )))
}

/// The options the keywords in `kwargs` give (unset ones left to their defaults), laid over
/// the YAML file `config` names, as the command line's flags are.
pub fn from_kwargs(kwargs: &Bound<'_, PyDict>) -> Result<Options> {
    let mut map = Map::new();
    let mut config = None;
    for (k, v) in kwargs.iter() {
        let key: String = k
            .extract()
            .map_err(|_| Error::internal("an option name is not text"))?;
        if key == "config" {
            if let Some(Value::String(path)) = value(&key, &v)? {
                config = Some(std::path::PathBuf::from(path));
            }
            continue;
        }
        if let Some(x) = value(&key, &v)? {
            map.insert(key, x);
        }
    }
    let mut options: Options =
        serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
            let key = e.path().to_string();
            let e = e.into_inner();
            let what = if key == "." {
                e.to_string()
            } else {
                format!("{key}: {e}")
            };
            Error::config(format!(
                "{what}. Options are the command line's settings with _ for - (see \
                 help(sluice))."
            ))
        })?;
    options.config = config;
    sluice_cli::config::merged(&options)
}
