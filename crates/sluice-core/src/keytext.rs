//! Keys as text: how a converged export recognises the same row in a part file it wrote, in
//! the change log, and in the SQL that reads the row again.
//!
//! One spelling for all three: Arrow's display of the key column's value. Part files and
//! change rows carry the same Arrow types for a column (both come from the source's type
//! mapping), so the same key gives the same text in both; the adapter's
//! [`crate::clause::Dialect::key_literal`] turns the text back into a literal of the column's
//! type. Only types whose display is also a literal the databases read back are allowed:
//! integers, text, decimals, dates, timestamps and UUIDs — not floating point (display rounds)
//! nor binary (display is bare hex).

use crate::error::{Error, Result};
use arrow_array::RecordBatch;
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::DataType;

/// True when keys of type `dt` can be recognised by their text (see the module).
pub fn supported(dt: &DataType) -> bool {
    dt.is_integer()
        || matches!(
            dt,
            DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Decimal128(..)
                | DataType::Decimal256(..)
                | DataType::Date32
                | DataType::Timestamp(..)
                | DataType::FixedSizeBinary(16)
        )
}

/// The key of every row of `batch`, one text per column of `columns` (indices into the
/// batch). A NULL in a key column is an error: a key that identifies a row has none.
pub fn key_texts(batch: &RecordBatch, columns: &[usize]) -> Result<Vec<Vec<String>>> {
    let options = FormatOptions::default();
    let formatters = columns
        .iter()
        .map(|&i| {
            let array = batch.columns().get(i).ok_or_else(|| {
                Error::internal(format!(
                    "key column {i} of a batch of {}",
                    batch.num_columns()
                ))
            })?;
            ArrayFormatter::try_new(array.as_ref(), &options)
                .map(|f| (array, f))
                .map_err(|e| Error::internal(format!("key column {i}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut keys = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let mut key = Vec::with_capacity(columns.len());
        for (array, f) in &formatters {
            if array.is_null(row) {
                return Err(Error::internal("a NULL in a key column"));
            }
            key.push(f.value(row).to_string());
        }
        keys.push(key);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, FixedSizeBinaryArray, Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn keys_read_as_text_and_nulls_refused() {
        let uuid = FixedSizeBinaryArray::try_from_iter([[0xabu8; 16]].into_iter()).unwrap();
        let batch = RecordBatch::try_from_iter([
            ("a", Arc::new(Int64Array::from(vec![-3])) as ArrayRef),
            ("b", Arc::new(StringArray::from(vec!["x y"])) as ArrayRef),
            ("c", Arc::new(uuid) as ArrayRef),
        ])
        .unwrap();
        let keys = key_texts(&batch, &[0, 1, 2]).unwrap();
        assert_eq!(
            keys,
            vec![vec!["-3".to_string(), "x y".into(), "ab".repeat(16)]]
        );
        let nulls = RecordBatch::try_from_iter([(
            "a",
            Arc::new(Int64Array::from(vec![None::<i64>])) as ArrayRef,
        )])
        .unwrap();
        assert!(key_texts(&nulls, &[0]).is_err());
        assert!(supported(&DataType::Int32) && !supported(&DataType::Float64));
        assert!(!supported(&DataType::Binary));
    }
}
