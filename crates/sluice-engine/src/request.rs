//! Which options decide what an output holds, and how two requests differ: what a resume and
//! a rerun on a finished output compare (the request's fingerprint, recorded in the run state
//! and the manifest).

use crate::job::ExportJob;
use serde::{Deserialize, Serialize};
use sluice_sink::FormatOptions;

/// A query of the selection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryRecord {
    /// Dataset name.
    pub name: String,
    /// The SQL text.
    pub sql: String,
}

/// Every option of a request that decides what an output holds: what is read, how it is
/// split and read, and how it is written. Options that change only speed or memory (workers,
/// batch and row-group sizes, fsync, upload settings) are left out, so a resume may change
/// them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Source URL, password redacted.
    pub source: String,
    /// `--table` names, as typed.
    pub tables: Vec<String>,
    /// `--tables` patterns.
    pub table_patterns: Vec<String>,
    /// `--schema` names.
    pub schemas: Vec<String>,
    /// `--query` datasets.
    pub queries: Vec<QueryRecord>,
    /// `parquet zstd(1)`, `parquet snappy`, `csv`.
    pub format: String,
    /// CSV delimiter (CSV only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv_delimiter: Option<String>,
    /// CSV NULL text (CSV only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv_null: Option<String>,
    /// CSV header line (CSV only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv_header: Option<bool>,
    /// `snapshot` or `chunk`.
    pub consistency: String,
    /// `--chunk-by` as given (`auto`, `ctid`, `key:id`, `none`).
    pub chunk_by: String,
    /// `--chunk-size` in bytes, if given.
    pub chunk_size: Option<u64>,
    /// One file per dataset.
    pub merge: bool,
    /// Only rows visible under row-level security (`--enable-row-security`).
    pub enable_row_security: bool,
}

impl RequestRecord {
    /// Each option that differs from `new`, as `option: old → new`, in a fixed order.
    pub fn differences(&self, new: &RequestRecord) -> Vec<String> {
        fn show<T: serde::Serialize>(v: &T) -> String {
            serde_json::to_string(v).unwrap_or_else(|_| "?".into())
        }
        let mut out = Vec::new();
        let mut cmp = |name: &str, old: String, new: String| {
            if old != new {
                out.push(format!("{name}: {old} → {new}"));
            }
        };
        cmp("source", show(&self.source), show(&new.source));
        cmp("--table", show(&self.tables), show(&new.tables));
        cmp(
            "--tables",
            show(&self.table_patterns),
            show(&new.table_patterns),
        );
        cmp("--schema", show(&self.schemas), show(&new.schemas));
        let names = |q: &[QueryRecord]| q.iter().map(|q| q.name.clone()).collect::<Vec<_>>();
        if names(&self.queries) != names(&new.queries) {
            cmp(
                "--query",
                show(&names(&self.queries)),
                show(&names(&new.queries)),
            );
        } else {
            for (a, b) in self.queries.iter().zip(&new.queries) {
                cmp(&format!("--query {}", a.name), show(&a.sql), show(&b.sql));
            }
        }
        cmp("format", show(&self.format), show(&new.format));
        cmp(
            "--csv-delimiter",
            show(&self.csv_delimiter),
            show(&new.csv_delimiter),
        );
        cmp("--csv-null", show(&self.csv_null), show(&new.csv_null));
        cmp("CSV header", show(&self.csv_header), show(&new.csv_header));
        cmp(
            "--consistency",
            show(&self.consistency),
            show(&new.consistency),
        );
        cmp("--chunk-by", show(&self.chunk_by), show(&new.chunk_by));
        cmp(
            "--chunk-size",
            show(&self.chunk_size),
            show(&new.chunk_size),
        );
        cmp("--merge", show(&self.merge), show(&new.merge));
        cmp(
            "--enable-row-security",
            show(&self.enable_row_security),
            show(&new.enable_row_security),
        );
        out
    }
}

impl ExportJob {
    /// Every output-affecting option of this request, recorded in the run state and the
    /// manifest; a resume or a rerun on a finished output compares it with the recorded one.
    pub fn request(&self) -> RequestRecord {
        let s = &self.selection;
        let csv = match &self.format {
            FormatOptions::Csv(c) => Some(c),
            _ => None,
        };
        RequestRecord {
            source: self.source.display_url(),
            tables: s.tables.iter().map(|t| t.to_string()).collect(),
            table_patterns: s.patterns.clone(),
            schemas: s.schemas.clone(),
            queries: s
                .queries
                .iter()
                .map(|q| QueryRecord {
                    name: q.name.clone(),
                    sql: q.sql.clone(),
                })
                .collect(),
            format: self.format.request_name(),
            csv_delimiter: csv.map(|c| (c.delimiter as char).to_string()),
            csv_null: csv.map(|c| c.null.clone()),
            csv_header: csv.map(|c| c.header),
            consistency: self.consistency.to_string(),
            chunk_by: self.chunking.to_string(),
            chunk_size: self.chunk_bytes,
            merge: self.merge,
            enable_row_security: self.enable_row_security,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RequestRecord {
        RequestRecord {
            source: "postgres://u:***@h/db".into(),
            tables: vec!["public.t".into()],
            table_patterns: Vec::new(),
            schemas: Vec::new(),
            queries: Vec::new(),
            format: "csv".into(),
            csv_delimiter: Some(",".into()),
            csv_null: Some(String::new()),
            csv_header: Some(true),
            consistency: "snapshot".into(),
            chunk_by: "auto".into(),
            chunk_size: None,
            merge: false,
            enable_row_security: false,
        }
    }

    #[test]
    fn differences_name_each_option_old_and_new() {
        let a = request();
        assert!(a.differences(&a).is_empty());
        let mut b = a.clone();
        b.tables.push("public.u".into());
        b.csv_null = Some("NULL".into());
        b.consistency = "chunk".into();
        let d = a.differences(&b);
        assert_eq!(
            d,
            [
                "--table: [\"public.t\"] → [\"public.t\",\"public.u\"]",
                "--csv-null: \"\" → \"NULL\"",
                "--consistency: \"snapshot\" → \"chunk\"",
            ]
        );
    }
}
