//! Reading JSON Lines and Avro output back with readers that are not sluice's writers
//! (`serde_json`, the `apache-avro` crate, `flate2` and `zstd` for compressed text), and
//! comparing each value with the Arrow value of the same row read from Parquet, type by type.
//!
//! The comparisons decode what the file holds (a base64 string to bytes, an ISO 8601 time to
//! microseconds, an Avro decimal's two's complement to the unscaled integer) rather than
//! matching text, so they check meaning, not the writer's spelling.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, TimeUnit};
use base64::Engine;
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime};
use serde_json::Value as Json;
use std::io::Read;
use std::path::Path;

/// A value the Avro reader gives (for tests that look into records).
pub use apache_avro::types::Value as AvroValue;

/// The bytes of a file, gzip or zstd decompressed when its name ends `.gz` or `.zst`.
pub fn decompressed(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let name = path.to_string_lossy();
    let mut out = Vec::new();
    if name.ends_with(".gz") {
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .expect("gzip");
    } else if name.ends_with(".zst") {
        zstd::stream::read::Decoder::new(&raw[..])
            .expect("zstd")
            .read_to_end(&mut out)
            .expect("zstd");
    } else {
        out = raw;
    }
    out
}

/// One JSON object of a JSON Lines file, its keys in file order.
pub type JsonRow = Vec<(String, Json)>;

/// The rows of a JSON Lines file (compressed or not), each key in the order written.
pub fn jsonl_rows(path: &Path) -> Vec<JsonRow> {
    let text = String::from_utf8(decompressed(path)).expect("JSON Lines is UTF-8");
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "{}: last line not ended",
        path.display()
    );
    text.lines()
        .map(|l| {
            let o: Ordered =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display()));
            o.0
        })
        .collect()
}

/// A JSON object read with its keys in order (`serde_json`'s map sorts them).
struct Ordered(JsonRow);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Ordered, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Json>()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The records of an Avro object container file, read by the `apache-avro` crate with the
/// schema the file's header holds; also returns that schema as JSON.
pub fn avro_rows(path: &Path) -> (Json, Vec<Vec<(String, apache_avro::types::Value)>>) {
    let bytes = std::fs::read(path).expect("read avro");
    let reader = apache_avro::Reader::new(&bytes[..]).expect("an Avro container file");
    let schema: Json =
        serde_json::from_str(&reader.writer_schema().canonical_form()).expect("schema JSON");
    let rows = reader
        .map(|r| match r.expect("an Avro record") {
            apache_avro::types::Value::Record(fields) => fields,
            other => panic!("not a record: {other:?}"),
        })
        .collect();
    (schema, rows)
}

fn same_f64(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

fn special(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// Microseconds of an ISO 8601 time of day.
fn time_micros(s: &str) -> Option<i64> {
    let t = NaiveTime::parse_from_str(s, "%H:%M:%S%.f").ok()?;
    Some(
        (t - NaiveTime::MIN)
            .num_microseconds()
            .expect("a day in microseconds"),
    )
}

/// `(months, days, micros)` of an ISO 8601 duration as sluice writes intervals.
fn duration(s: &str) -> Option<(i32, i32, i64)> {
    let rest = s.strip_prefix('P')?;
    let (date, time) = rest.split_once('T').unwrap_or((rest, ""));
    let (mut months, mut days, mut micros) = (0i32, 0i32, 0i64);
    let mut num = String::new();
    for c in date.chars() {
        match c {
            'Y' => months += num.parse::<i32>().ok()? * 12,
            'M' => months += num.parse::<i32>().ok()?,
            'D' => days += num.parse::<i32>().ok()?,
            _ => {
                num.push(c);
                continue;
            }
        }
        num.clear();
    }
    for c in time.chars() {
        match c {
            'H' => micros += num.parse::<i64>().ok()? * 3_600_000_000,
            'M' => micros += num.parse::<i64>().ok()? * 60_000_000,
            'S' => {
                let neg = num.starts_with('-');
                let (i, f) = num
                    .trim_start_matches('-')
                    .split_once('.')
                    .unwrap_or((&num, ""));
                let i = i.trim_start_matches('-');
                let frac: i64 = format!("{f:0<6}").parse().ok()?;
                let v = i.parse::<i64>().ok()? * 1_000_000 + frac;
                micros += if neg { -v } else { v };
            }
            _ => {
                num.push(c);
                continue;
            }
        }
        num.clear();
    }
    Some((months, days, micros))
}

/// Whether the JSON value `j` holds the Arrow value at `row` of `a` (`Err` says how not).
pub fn json_matches(a: &ArrayRef, row: usize, j: &Json) -> Result<(), String> {
    let bad = || Err(format!("{:?} row {row}: JSON {j}", a.data_type()));
    if a.is_null(row) {
        return if j.is_null() { Ok(()) } else { bad() };
    }
    let display = || {
        arrow_cast::display::ArrayFormatter::try_new(a.as_ref(), &Default::default())
            .expect("formatter")
            .value(row)
            .to_string()
    };
    let ok = match a.data_type() {
        DataType::Boolean => j.as_bool() == Some(a.as_boolean().value(row)),
        t if t.is_integer() => j.as_number().is_some_and(|n| n.to_string() == display()),
        DataType::Float32 | DataType::Float64 => {
            let v = match a.data_type() {
                DataType::Float32 => a.as_primitive::<Float32Type>().value(row) as f64,
                _ => a.as_primitive::<Float64Type>().value(row),
            };
            let got = match j {
                Json::Number(n) => n.as_f64(),
                Json::String(s) => special(s),
                _ => None,
            };
            got.is_some_and(|g| match a.data_type() {
                DataType::Float32 => same_f64(g as f32 as f64, v),
                _ => same_f64(g, v),
            })
        }
        DataType::Decimal128(..) | DataType::Decimal256(..) => j.as_str() == Some(&display()),
        DataType::Utf8 => j.as_str() == Some(a.as_string::<i32>().value(row)),
        DataType::Binary => j.as_str().is_some_and(|s| {
            base64::engine::general_purpose::STANDARD.decode(s).ok()
                == Some(a.as_binary::<i32>().value(row).to_vec())
        }),
        DataType::FixedSizeBinary(16) => j.as_str().is_some_and(|s| {
            let hex: String = a
                .as_fixed_size_binary()
                .value(row)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            s.len() == 36 && s.replace('-', "") == hex
        }),
        DataType::Date32 => {
            let d = a.as_primitive::<Date32Type>().value(row);
            let want = match d {
                i32::MAX => "infinity".to_string(),
                i32::MIN => "-infinity".to_string(),
                d => (NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch")
                    + chrono::Duration::days(d as i64))
                .format("%Y-%m-%d")
                .to_string(),
            };
            j.as_str() == Some(&want)
        }
        DataType::Time64(TimeUnit::Microsecond) => {
            j.as_str().and_then(time_micros)
                == Some(a.as_primitive::<Time64MicrosecondType>().value(row))
        }
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            let v = a.as_primitive::<TimestampMicrosecondType>().value(row);
            let got = j.as_str().and_then(|s| match s {
                "infinity" => Some(i64::MAX),
                "-infinity" => Some(i64::MIN),
                s if tz.is_some() => DateTime::parse_from_rfc3339(s)
                    .ok()
                    .map(|t| t.timestamp_micros()),
                s => NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
                    .ok()
                    .map(|t| t.and_utc().timestamp_micros()),
            });
            got == Some(v)
        }
        DataType::Struct(fields) if j.is_object() => {
            // A record of columns (`_before`): each member by name, none extra.
            let (s, members) = (a.as_struct(), j.as_object().expect("an object"));
            for (i, f) in fields.iter().enumerate() {
                let m = members
                    .get(f.name())
                    .ok_or(format!("no member {}", f.name()))?;
                json_matches(s.column(i), row, m).map_err(|e| format!("{}: {e}", f.name()))?;
            }
            members.len() == fields.len()
        }
        DataType::Struct(_) => {
            // The interval struct, written as an ISO 8601 duration.
            let s = a.as_struct();
            let want = (
                s.column(0).as_primitive::<Int32Type>().value(row),
                s.column(1).as_primitive::<Int32Type>().value(row),
                s.column(2).as_primitive::<Int64Type>().value(row),
            );
            j.as_str().and_then(duration) == Some(want)
        }
        DataType::List(_) => {
            let items = a.as_list::<i32>().value(row);
            match j.as_array() {
                Some(js) if js.len() == items.len() => {
                    for (i, jv) in js.iter().enumerate() {
                        json_matches(&items, i, jv)?;
                    }
                    true
                }
                _ => false,
            }
        }
        _ => j.as_str() == Some(&display()),
    };
    if ok { Ok(()) } else { bad() }
}

/// A decimal's unscaled value as 32 big-endian two's-complement bytes.
fn wide(bytes: &[u8]) -> [u8; 32] {
    let fill = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
        0xff
    } else {
        0
    };
    let mut out = [fill; 32];
    out[32 - bytes.len()..].copy_from_slice(bytes);
    out
}

/// Whether the Avro value `v` holds the Arrow value at `row` of `a` (`Err` says how not).
pub fn avro_matches(a: &ArrayRef, row: usize, v: &apache_avro::types::Value) -> Result<(), String> {
    use apache_avro::types::Value as V;
    let v = match v {
        V::Union(_, inner) => inner.as_ref(),
        v => v,
    };
    let bad = || Err(format!("{:?} row {row}: Avro {v:?}", a.data_type()));
    if a.is_null(row) {
        return if matches!(v, V::Null) { Ok(()) } else { bad() };
    }
    let ok = match (a.data_type(), v) {
        (DataType::Boolean, V::Boolean(b)) => *b == a.as_boolean().value(row),
        (t, V::Int(_) | V::Long(_)) if t.is_integer() => {
            let got = match v {
                V::Int(i) => *i as i64,
                V::Long(i) => *i,
                _ => unreachable!("matched above"),
            };
            let want =
                arrow_cast::display::ArrayFormatter::try_new(a.as_ref(), &Default::default())
                    .expect("formatter")
                    .value(row)
                    .to_string();
            got.to_string() == want
        }
        (DataType::Float32, V::Float(f)) => {
            same_f64(*f as f64, a.as_primitive::<Float32Type>().value(row) as f64)
        }
        (DataType::Float64, V::Double(f)) => {
            same_f64(*f, a.as_primitive::<Float64Type>().value(row))
        }
        (DataType::Decimal128(..), V::Decimal(d)) => {
            let bytes = Vec::<u8>::try_from(d).map_err(|e| e.to_string())?;
            wide(&bytes) == wide(&a.as_primitive::<Decimal128Type>().value(row).to_be_bytes())
        }
        (DataType::UInt64, V::Decimal(d)) => {
            let bytes = Vec::<u8>::try_from(d).map_err(|e| e.to_string())?;
            wide(&bytes) == wide(&(a.as_primitive::<UInt64Type>().value(row) as i128).to_be_bytes())
        }
        (DataType::Decimal256(..), V::Decimal(d)) => {
            let bytes = Vec::<u8>::try_from(d).map_err(|e| e.to_string())?;
            wide(&bytes) == a.as_primitive::<Decimal256Type>().value(row).to_be_bytes()
        }
        (DataType::Utf8, V::String(s)) => s == a.as_string::<i32>().value(row),
        (DataType::Binary, V::Bytes(b)) => b == a.as_binary::<i32>().value(row),
        (DataType::FixedSizeBinary(16), V::Uuid(u)) => {
            u.as_bytes() == a.as_fixed_size_binary().value(row)
        }
        (DataType::Date32, V::Date(d)) => *d == a.as_primitive::<Date32Type>().value(row),
        (DataType::Duration(TimeUnit::Microsecond), V::Long(t)) => {
            *t == a.as_primitive::<DurationMicrosecondType>().value(row)
        }
        (DataType::Time64(TimeUnit::Microsecond), V::TimeMicros(t)) => {
            *t == a.as_primitive::<Time64MicrosecondType>().value(row)
        }
        (
            DataType::Timestamp(TimeUnit::Microsecond, _),
            V::TimestampMicros(t) | V::LocalTimestampMicros(t),
        ) => *t == a.as_primitive::<TimestampMicrosecondType>().value(row),
        (DataType::Struct(_), V::Record(fields)) => {
            let s = a.as_struct();
            if fields.len() != s.num_columns() {
                return bad();
            }
            for (i, (_, f)) in fields.iter().enumerate() {
                avro_matches(s.column(i), row, f)?;
            }
            true
        }
        (DataType::List(_), V::Array(items)) => {
            let want = a.as_list::<i32>().value(row);
            if items.len() != want.len() {
                return bad();
            }
            for (i, it) in items.iter().enumerate() {
                avro_matches(&want, i, it)?;
            }
            true
        }
        _ => false,
    };
    if ok { Ok(()) } else { bad() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(
            duration("P1Y2M3DT4H5.5S"),
            Some((14, 3, 4 * 3_600_000_000 + 5_500_000))
        );
        assert_eq!(duration("P-1MT-1M"), Some((-1, 0, -60_000_000)));
        assert_eq!(duration("PT0S"), Some((0, 0, 0)));
        assert_eq!(time_micros("01:02:03.000001"), Some(3_723_000_001));
    }
}
