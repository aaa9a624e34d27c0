//! Which Parquet columns are worth a dictionary, judged from the first batch of a part.
//!
//! The Parquet writer tries dictionary encoding on every column by default and falls back to
//! plain encoding once a row group's dictionary outgrows the dictionary page limit. On a column
//! of (nearly) unique values — keys, timestamps, amounts, hashes — that attempt is pure cost:
//! every value is hashed and interned until the limit is hit, in every row group, and the
//! pages written before the fallback are larger than plain ones. In the benchmark lab's narrow
//! table four of five columns are like that.
//!
//! The signal is cheap: up to [`SAMPLE`] values spread over the first batch are hashed, and the
//! share of values seen exactly once (`singletons / sampled`) estimates how many distinct values
//! a row group holds (for `n` draws from `D` equally likely values about `n·e^(−n/D)` are
//! singletons, so `D ≈ n / −ln(share)`). A column loses its dictionary only when
//! both hold:
//! - at least half of the sample are singletons (the column is dominated by rare values, where
//!   a dictionary saves little even when it fits), and
//! - the estimated dictionary of one row group (distinct values, at most the row group's rows,
//!   times the value width) is larger than the dictionary page limit, so the writer would have
//!   fallen back anyway.
//!
//! Every other column keeps the writer's default (dictionary first, fallback when it
//! overflows), so files are never larger than with dictionaries tried everywhere: a column
//! whose dictionary would have fitted keeps it. Booleans and nested columns (lists, structs)
//! are left alone. Limits: a part's later batches may differ from its first (a column that
//! starts unique and turns repetitive keeps plain encoding for that part, at zstd's ratio);
//! the estimate assumes values about equally frequent, which the second condition guards.

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use xxhash_rust::xxh3::xxh3_64;

/// Values hashed per column.
pub(crate) const SAMPLE: usize = 16_384;
/// Fewer non-NULL values than this in the sample say too little: the column keeps its
/// dictionary.
const MIN_SAMPLE: usize = 512;
/// Share of singletons from which a column counts as dominated by rare values.
const RARE_SHARE: f64 = 0.5;

/// Names of the top-level columns of `batch` that should be written without a dictionary, for
/// row groups of about `row_group_rows` rows and a dictionary page limit of `dictionary_limit`
/// bytes.
pub(crate) fn plain_columns(
    batch: &RecordBatch,
    row_group_rows: usize,
    dictionary_limit: usize,
) -> Vec<String> {
    let schema = batch.schema();
    schema
        .fields()
        .iter()
        .zip(batch.columns())
        .filter(|(_, a)| {
            sample(a.as_ref()).is_some_and(|s| s.overflows(row_group_rows, dictionary_limit))
        })
        .map(|(f, _)| f.name().clone())
        .collect()
}

/// What a column's sample showed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sampled {
    /// Non-NULL values hashed.
    values: usize,
    /// Values seen exactly once.
    singletons: usize,
    /// Average encoded width of a dictionary entry, bytes.
    width: f64,
}

impl Sampled {
    /// Whether a dictionary of one row group would outgrow `limit` bytes.
    fn overflows(&self, row_group_rows: usize, limit: usize) -> bool {
        if self.values < MIN_SAMPLE {
            return false;
        }
        let share = self.singletons as f64 / self.values as f64;
        if share < RARE_SHARE {
            return false;
        }
        let distinct = if share >= 1.0 {
            f64::INFINITY
        } else {
            self.values as f64 / -share.ln()
        };
        distinct.min(row_group_rows as f64) * self.width > limit as f64
    }
}

/// Hash up to [`SAMPLE`] values spread evenly over `array`; `None` for types left alone.
fn sample(array: &dyn Array) -> Option<Sampled> {
    let len = array.len();
    if len == 0 {
        return None;
    }
    let picks = len.min(SAMPLE);
    let rows = (0..picks).map(|k| k * len / picks);
    let mut bytes = 0usize;
    let mut hashes = Vec::with_capacity(picks);
    let mut take = |v: &[u8]| {
        bytes += v.len();
        hashes.push(xxh3_64(v));
    };
    match array.data_type() {
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            rows.filter(|&i| a.is_valid(i))
                .for_each(|i| take(a.value(i).as_bytes()));
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            rows.filter(|&i| a.is_valid(i))
                .for_each(|i| take(a.value(i).as_bytes()));
        }
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            rows.filter(|&i| a.is_valid(i))
                .for_each(|i| take(a.value(i)));
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            rows.filter(|&i| a.is_valid(i))
                .for_each(|i| take(a.value(i)));
        }
        DataType::FixedSizeBinary(_) => {
            let a = array.as_fixed_size_binary();
            rows.filter(|&i| a.is_valid(i))
                .for_each(|i| take(a.value(i)));
        }
        dt if dt.is_primitive() => {
            let width = dt.primitive_width()?;
            let data = array.to_data();
            let buf = data.buffers().first()?.as_slice();
            let offset = data.offset();
            rows.filter(|&i| array.is_valid(i)).for_each(|i| {
                let at = (offset + i) * width;
                if let Some(v) = buf.get(at..at + width) {
                    take(v);
                }
            });
        }
        _ => return None,
    }
    let values = hashes.len();
    if values == 0 {
        return None;
    }
    hashes.sort_unstable();
    let mut singletons = 0;
    let mut i = 0;
    while i < values {
        let mut j = i + 1;
        while j < values && hashes[j] == hashes[i] {
            j += 1;
        }
        singletons += usize::from(j - i == 1);
        i = j;
    }
    let variable = !array.data_type().is_primitive();
    // A byte array's dictionary entry carries a 4-byte length.
    let width = bytes as f64 / values as f64 + if variable { 4.0 } else { 0.0 };
    Some(Sampled {
        values,
        singletons,
        width,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int32Array, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};
    use std::sync::Arc;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns.into_iter().map(|(_, a)| a).collect(),
        )
        .unwrap()
    }

    #[test]
    fn unique_columns_lose_the_dictionary_repetitive_ones_keep_it() {
        let n = 100_000i64;
        let b = batch(vec![
            ("id", Arc::new(Int64Array::from_iter_values(0..n))),
            (
                "hash",
                Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64)),
                )),
            ),
            (
                "small",
                Arc::new(Int32Array::from_iter_values(
                    (0..n as i32).map(|i| i % 1000),
                )),
            ),
            (
                "status",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| ["new", "paid", "shipped"][i as usize % 3]),
                )),
            ),
            (
                "text",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("order {i} shipped")),
                )),
            ),
        ]);
        let plain = plain_columns(&b, 500_000, 512 << 10);
        assert_eq!(plain, vec!["id", "hash", "text"]);
    }

    #[test]
    fn a_dictionary_that_fits_is_kept() {
        // 4 000 distinct values, each seen 25 times in a 100 000-row batch: 4 000 × 8 bytes fit
        // the dictionary page. (A column whose repeats are farther apart than the sample cannot
        // be told from a unique one: it is written plain, as the writer's fallback would.)
        let b = batch(vec![(
            "v",
            Arc::new(Int64Array::from_iter_values(
                (0..100_000i64).map(|i| (i * 7919) % 4_000),
            )) as ArrayRef,
        )]);
        assert!(plain_columns(&b, 1_000_000, 1 << 20).is_empty());
        // A small row group cannot hold more distinct values than rows.
        assert!(plain_columns(&b, 10_000, 512 << 10).is_empty());
    }

    #[test]
    fn small_or_null_samples_decide_nothing() {
        let b = batch(vec![
            (
                "few",
                Arc::new(Int64Array::from_iter_values(0..100)) as ArrayRef,
            ),
            (
                "nulls",
                Arc::new(Int64Array::from(vec![None::<i64>; 100])) as ArrayRef,
            ),
        ]);
        assert!(plain_columns(&b, 1_000_000, 64 << 10).is_empty());
    }
}
