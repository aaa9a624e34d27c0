//! Reading exported files back.

use arrow_array::RecordBatch;
use std::path::{Path, PathBuf};

/// All batches of one Parquet file.
pub fn parquet_batches(path: &Path) -> Vec<RecordBatch> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap_or_else(|e| panic!("{} is not Parquet: {e}", path.display()))
        .build()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    reader
        .map(|b| b.unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

/// The part files of a dataset directory with extension `ext`, in part order.
pub fn part_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("part-") && n.ends_with(&format!(".{ext}")))
        })
        .collect();
    files.sort();
    files
}

/// Every batch of every Parquet part in a dataset directory.
pub fn dataset_batches(dir: &Path) -> Vec<RecordBatch> {
    part_files(dir, "parquet")
        .iter()
        .flat_map(|p| parquet_batches(p))
        .collect()
}

/// Parse CSV as sluice writes it (RFC 4180 quoting; an unquoted field equal to `null` is
/// NULL). Returns the header and the rows.
pub fn csv_rows(text: &str, delimiter: u8, null: &str) -> (Vec<String>, Vec<Vec<Option<String>>>) {
    let bytes = text.as_bytes();
    let mut rows: Vec<Vec<Option<String>>> = Vec::new();
    let mut row: Vec<Option<String>> = Vec::new();
    let mut i = 0;
    let mut field = Vec::new();
    let mut quoted = false;
    let mut at_field_start = true;
    let mut in_quotes = false;
    let end_field = |field: &mut Vec<u8>, quoted: bool, row: &mut Vec<Option<String>>| {
        let s = String::from_utf8(std::mem::take(field)).expect("CSV is UTF-8");
        row.push(if !quoted && s == null { None } else { Some(s) });
    };
    while i < bytes.len() {
        let c = bytes[i];
        if in_quotes {
            if c == b'"' {
                if bytes.get(i + 1) == Some(&b'"') {
                    field.push(b'"');
                    i += 1;
                } else {
                    in_quotes = false;
                }
            } else {
                field.push(c);
            }
        } else if c == b'"' && at_field_start {
            in_quotes = true;
            quoted = true;
        } else if c == delimiter {
            end_field(&mut field, quoted, &mut row);
            quoted = false;
            at_field_start = true;
            i += 1;
            continue;
        } else if c == b'\n' {
            end_field(&mut field, quoted, &mut row);
            rows.push(std::mem::take(&mut row));
            quoted = false;
            at_field_start = true;
            i += 1;
            continue;
        } else {
            field.push(c);
        }
        at_field_start = false;
        i += 1;
    }
    if !field.is_empty() || !row.is_empty() {
        end_field(&mut field, quoted, &mut row);
        rows.push(row);
    }
    let header = if rows.is_empty() {
        Vec::new()
    } else {
        rows.remove(0)
            .into_iter()
            .map(|h| h.unwrap_or_default())
            .collect()
    };
    (header, rows)
}

/// The manifest of an output directory.
pub fn manifest(dir: &Path) -> serde_json::Value {
    json(&dir.join("manifest.json"))
}

/// A JSON file (a report, the run state); unreadable or not JSON fails the test.
pub fn json(path: &Path) -> serde_json::Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// `c` in a form Arrow's display can format: a microsecond timestamp in the named zone `UTC`
/// (how the MySQL adapter types `timestamp`) is shown with the offset `+00:00` (the same
/// instants; named zones need a feature the tests do not build).
pub fn displayable(c: &arrow_array::ArrayRef) -> arrow_array::ArrayRef {
    use arrow_array::cast::AsArray;
    use arrow_array::types::TimestampMicrosecondType;
    match c.as_primitive_opt::<TimestampMicrosecondType>() {
        Some(t) if t.timezone() == Some("UTC") => {
            std::sync::Arc::new(t.clone().with_timezone("+00:00"))
        }
        _ => c.clone(),
    }
}

/// (dataset name, rows) of every dataset in `dir`'s manifest, in its order.
pub fn manifest_rows(dir: &Path) -> Vec<(String, u64)> {
    let rows = |d: &serde_json::Value| {
        let name = d["name"].as_str().expect("a dataset name");
        (name.to_string(), d["rows"].as_u64().expect("a row count"))
    };
    manifest(dir)["datasets"]
        .as_array()
        .expect("the manifest lists datasets")
        .iter()
        .map(rows)
        .collect()
}

/// The entry of dataset `name` in a `manifest` (see [`manifest`]); a missing one fails the test.
pub fn manifest_dataset(manifest: &serde_json::Value, name: &str) -> serde_json::Value {
    manifest["datasets"]
        .as_array()
        .expect("the manifest lists datasets")
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no dataset {name} in the manifest"))
        .clone()
}

/// Every row of `batches` as `v1|v2|…` in Arrow's display form (NULL as `∅`), sorted — to
/// compare with `SELECT concat_ws('|', …)` of simple types (integers, text).
pub fn row_strings(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let shown: Vec<_> = b.columns().iter().map(displayable).collect();
        let fmts: Vec<_> = shown
            .iter()
            .map(|c| {
                arrow_cast::display::ArrayFormatter::try_new(c.as_ref(), &Default::default())
                    .expect("formatter")
            })
            .collect();
        for r in 0..b.num_rows() {
            let cells: Vec<String> = b
                .columns()
                .iter()
                .zip(&fmts)
                .map(|(c, f)| {
                    if arrow_array::Array::is_null(c.as_ref(), r) {
                        "∅".to_string()
                    } else {
                        f.value(r).to_string()
                    }
                })
                .collect();
            out.push(cells.join("|"));
        }
    }
    out.sort();
    out
}

/// Assert two sorted row lists are equal, reporting counts and the first difference (not the
/// whole lists).
pub fn assert_same_rows(got: &[String], want: &[String], what: &str) {
    if got == want {
        return;
    }
    let first = got
        .iter()
        .zip(want)
        .position(|(g, w)| g != w)
        .unwrap_or(got.len().min(want.len()));
    panic!(
        "{what}: exported {} rows, source has {}; first difference at sorted row {first}: exported {:?}, source {:?}",
        got.len(),
        want.len(),
        got.get(first),
        want.get(first)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quoting_and_nulls() {
        let (h, rows) = csv_rows("a,b\n\"x,\"\"y\",\n\"\",z\n", b',', "");
        assert_eq!(h, ["a", "b"]);
        assert_eq!(rows[0], [Some("x,\"y".to_string()), None]);
        assert_eq!(rows[1], [Some(String::new()), Some("z".to_string())]);
    }
}
