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
use arrow_array::{Array, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::DataType;
use std::collections::HashSet;
use std::io::Write;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

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
    let formatters = formatters(batch, columns, &options)?;
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

/// A formatter per key column of `batch`.
fn formatters<'a>(
    batch: &'a RecordBatch,
    columns: &[usize],
    options: &'a FormatOptions<'a>,
) -> Result<Vec<(&'a dyn Array, ArrayFormatter<'a>)>> {
    columns
        .iter()
        .map(|&i| {
            let array = batch.columns().get(i).ok_or_else(|| {
                Error::internal(format!(
                    "key column {i} of a batch of {}",
                    batch.num_columns()
                ))
            })?;
            ArrayFormatter::try_new(array.as_ref(), options)
                .map(|f| (array.as_ref(), f))
                .map_err(|e| Error::internal(format!("key column {i}: {e}")))
        })
        .collect()
}

/// A set of keys to find among the rows of part files — what a converged export removes.
///
/// Why not a set of [`key_texts`]: that builds a `Vec<String>` per row, and a rewrite looks up
/// every row of every part holding a changed key (on a 2 M-row table that was a tenth of the
/// rewrite's time). Here each row's key is spelled into one reused buffer (each column's text
/// followed by its length, so `("a,b")` and `("a", "b")` differ) and looked up by an xxh3
/// hash: no allocation per row.
pub struct KeySet {
    encoded: HashSet<Vec<u8>, Xxh3DefaultBuilder>,
    everything: bool,
}

impl KeySet {
    /// The keys given, one text per key column each (see the module).
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a Vec<String>>) -> Self {
        let mut encoded = HashSet::with_hasher(Xxh3DefaultBuilder);
        for key in keys {
            encoded.insert(encode(key));
        }
        KeySet {
            encoded,
            everything: false,
        }
    }

    /// Every key (a truncated table: every row read before the truncate is gone).
    pub fn everything() -> Self {
        KeySet {
            encoded: HashSet::with_hasher(Xxh3DefaultBuilder),
            everything: true,
        }
    }
}

impl KeyLookup for KeySet {
    fn rows_in(&self, batch: &RecordBatch, columns: &[usize]) -> Result<Vec<bool>> {
        if self.everything {
            return Ok(vec![true; batch.num_rows()]);
        }
        if self.encoded.is_empty() {
            return Ok(vec![false; batch.num_rows()]);
        }
        rows_matching(batch, columns, |key| Ok(self.encoded.contains(key)))
    }
}

/// Keys to find among the rows of part files: a [`KeySet`] in memory, or a set kept on disk
/// (a converged export's changed keys past their share of `--memory`).
pub trait KeyLookup: Send + Sync {
    /// For each row of `batch`: whether its key (the batch's `columns`) is in the set. A NULL
    /// in a key column is an error, as in [`key_texts`].
    fn rows_in(&self, batch: &RecordBatch, columns: &[usize]) -> Result<Vec<bool>>;
}

/// For each row of `batch`: `found` of its key spelled as [`encode`] spells it (into one
/// reused buffer: no allocation per row). A NULL in a key column is an error.
pub fn rows_matching(
    batch: &RecordBatch,
    columns: &[usize],
    mut found: impl FnMut(&[u8]) -> Result<bool>,
) -> Result<Vec<bool>> {
    let options = FormatOptions::default();
    let formatters = formatters(batch, columns, &options)?;
    let mut buf = Vec::with_capacity(64);
    let mut out = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        buf.clear();
        for (array, f) in &formatters {
            if array.is_null(row) {
                return Err(Error::internal("a NULL in a key column"));
            }
            let start = buf.len();
            write!(buf, "{}", f.value(row))
                .map_err(|e| Error::internal(format!("a key's text: {e}")))?;
            end_column(&mut buf, start);
        }
        out.push(found(&buf)?);
    }
    Ok(out)
}

/// A key (one text per column) as one byte string: each column's text followed by its length
/// (4 bytes, little-endian), so column boundaries are part of the key. [`decode`] reverses it.
pub fn encode(key: &[String]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(key.iter().map(|t| t.len() + 4).sum());
    for text in key {
        let start = buf.len();
        buf.extend_from_slice(text.as_bytes());
        end_column(&mut buf, start);
    }
    buf
}

/// The texts of a key [`encode`] spelled, or why these bytes are not one.
pub fn decode(mut encoded: &[u8]) -> Result<Vec<String>> {
    let bad = || Error::internal("a changed key's spelling is damaged");
    let mut out = Vec::new();
    while !encoded.is_empty() {
        let (rest, len) = encoded
            .split_at_checked(encoded.len().saturating_sub(4))
            .ok_or_else(bad)?;
        let len = u32::from_le_bytes(len.try_into().map_err(|_| bad())?) as usize;
        let (rest, text) = rest
            .split_at_checked(rest.len().checked_sub(len).ok_or_else(bad)?)
            .ok_or_else(bad)?;
        out.push(String::from_utf8(text.to_vec()).map_err(|_| bad())?);
        encoded = rest;
    }
    out.reverse();
    Ok(out)
}

/// Close a key column's text in an [`encode`] spelling: the text written from `start` is
/// followed by its length, so column boundaries are part of the key.
fn end_column(buf: &mut Vec<u8>, start: usize) {
    let len = (buf.len() - start) as u32;
    buf.extend_from_slice(&len.to_le_bytes());
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
    }

    #[test]
    fn key_sets_find_exactly_their_keys() {
        let batch = RecordBatch::try_from_iter([
            (
                "a",
                Arc::new(StringArray::from(vec!["x,y", "x", "x"])) as ArrayRef,
            ),
            (
                "b",
                Arc::new(StringArray::from(vec!["", "y", ",y"])) as ArrayRef,
            ),
        ])
        .unwrap();
        let keys = [vec!["x".to_string(), "y".to_string()]];
        assert_eq!(
            KeySet::new(&keys).rows_in(&batch, &[0, 1]).unwrap(),
            vec![false, true, false]
        );
        // The same keys as key_texts spells them are found.
        let all = key_texts(&batch, &[0, 1]).unwrap();
        assert_eq!(
            KeySet::new(&all).rows_in(&batch, &[0, 1]).unwrap(),
            vec![true; 3]
        );
        assert_eq!(
            KeySet::everything().rows_in(&batch, &[0]).unwrap(),
            vec![true; 3]
        );
        assert!(KeySet::new(&keys).rows_in(&batch, &[2]).is_err());
        assert!(!supported(&DataType::Binary));
    }

    #[test]
    fn encoded_keys_decode_to_their_texts() {
        for key in [
            vec!["x,y".to_string(), String::new()],
            vec!["é".into(), "12".into(), "\u{0}\u{4}".into()],
            vec![],
        ] {
            assert_eq!(decode(&encode(&key)).unwrap(), key);
        }
        assert!(decode(b"ab").is_err());
        assert!(decode(&[b'a', 9, 0, 0, 0]).is_err());
    }
}
