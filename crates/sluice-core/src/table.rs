//! What is exported: datasets, their physical relations and columns.

use crate::error::{Error, Result};
use crate::ident::{NamePart, QualifiedName};
use arrow_schema::{Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// A resolved, exactly spelled table in the source (after case and quote handling).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TableRef {
    /// Schema (PostgreSQL), database (MySQL) or empty (Firebird, which has no schemas).
    pub schema: String,
    /// Table name, exactly as stored in the catalog.
    pub name: String,
}

impl TableRef {
    /// The relation `name` in `schema` (empty on Firebird), both as stored in the catalog.
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> TableRef {
        TableRef {
            schema: schema.into(),
            name: name.into(),
        }
    }

    /// The dataset name of this relation: `schema.name` as [`fmt::Display`] prints it when
    /// neither part contains a `.` or a `"` (so plain names stay plain), and otherwise with such
    /// a part in double quotes, inner quotes doubled — `"a.b".c` and `a."b.c"` — the way users
    /// type it for `--table`. Why: the plain form is ambiguous for names with dots, and two
    /// datasets must never share a name (they would share a directory). Never used for SQL.
    pub fn dataset_name(&self) -> String {
        fn part(p: &str) -> String {
            if p.contains(['.', '"']) {
                crate::ident::enclose(p, '"')
            } else {
                p.to_string()
            }
        }
        if self.schema.is_empty() {
            part(&self.name)
        } else {
            format!("{}.{}", part(&self.schema), part(&self.name))
        }
    }
}

impl fmt::Display for TableRef {
    /// `schema.name`, unquoted: for messages and name patterns, never for SQL (and not a
    /// dataset name: see [`TableRef::dataset_name`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.schema.is_empty() {
            write!(f, "{}", self.name)
        } else {
            write!(f, "{}.{}", self.schema, self.name)
        }
    }
}

/// A physical relation to read rows from. A plain table has one; a partitioned table has one
/// per leaf partition; a view or query has none (it is read as a whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The relation's exact name.
    pub table: TableRef,
    /// Size on disk in the engine's pages (heap pages for PostgreSQL), 0 when unknown.
    pub pages: u64,
    /// Page size in bytes.
    pub page_bytes: u64,
    /// Estimated live rows (from the engine's statistics, not a count).
    pub rows: u64,
    /// Estimated bytes of row data, including out-of-line (TOAST) storage.
    pub bytes: u64,
}

/// What kind of object a dataset comes from; decides which chunking strategies apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetKind {
    /// An ordinary table.
    Table,
    /// A partitioned table, exported as one dataset read from its leaf partitions.
    Partitioned,
    /// A view (or materialized view): read as one unit unless a key is given.
    View,
    /// A user query (`--query`): read as one unit unless a key is given.
    Query,
}

/// One output column: its source name and type, its Arrow field, and how it is read.
#[derive(Debug, Clone)]
pub struct ColumnDesc {
    /// Column name exactly as in the source.
    pub name: String,
    /// The source's type as the database prints it (e.g. `numeric(12,2)`, `integer[]`).
    pub source_type: String,
    /// The Arrow field the column becomes (type, nullability, extension metadata).
    pub field: Field,
    /// An engine-specific cast applied when reading (e.g. `text`), or `None` to read natively.
    /// A cast to text is how types without a native mapping are exported instead of failing.
    pub cast: Option<String>,
    /// True when the column is read as text because its type has no native mapping; such
    /// columns are listed in the report.
    pub as_text_fallback: bool,
}

/// Size estimate of a dataset from catalog statistics, before reading any row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeEstimate {
    /// Estimated rows.
    pub rows: u64,
    /// Estimated bytes of row data on disk (heap + TOAST).
    pub bytes: u64,
}

impl SizeEstimate {
    /// Average row width in bytes (0 for an empty estimate).
    pub fn avg_row_bytes(&self) -> u64 {
        self.bytes.checked_div(self.rows).unwrap_or(0)
    }
}

/// A unit of output: one table, partitioned table, view or query, written to its own directory.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Output name, `schema.table` (or the query's name); also its directory name.
    pub name: String,
    /// Where the rows come from.
    pub kind: DatasetKind,
    /// The object the user named (for views and tables), resolved.
    pub object: Option<TableRef>,
    /// Physical relations to read; empty for views and queries.
    pub relations: Vec<Relation>,
    /// The SQL text for [`DatasetKind::Query`].
    pub query: Option<String>,
    /// Columns in output order.
    pub columns: Vec<ColumnDesc>,
    /// Primary key columns in key order (empty if none).
    pub primary_key: Vec<String>,
    /// Size estimate from statistics.
    pub estimate: SizeEstimate,
    /// Relations of this dataset (or the dataset itself) whose rows the run's snapshot does not
    /// cover, by exact name: PostgreSQL foreign tables are read from their server (or file)
    /// when the chunk is read. Recorded in the manifest so nobody mistakes them for snapshot
    /// data.
    pub outside_snapshot: Vec<String>,
    /// True when the source filtered this dataset's rows by row-level security policies (the
    /// user opted in to exporting only the rows visible to them): the dataset may be a subset.
    pub row_security_filtered: bool,
    /// True when `--columns` chose its columns (the others are not read): a change stream
    /// leaves them out of its change files too.
    pub columns_picked: bool,
    /// Filters every chunk's rows must meet, all of them (a read's pushed filters, see
    /// [`crate::filter`]); empty: every row.
    pub row_filter: Vec<crate::filter::RowFilter>,
}

impl Relation {
    /// `table` with `pages` pages of `page_bytes` bytes holding about `rows` rows in `bytes`
    /// bytes (estimates from the engine's statistics).
    pub fn new(table: TableRef, pages: u64, page_bytes: u64, rows: u64, bytes: u64) -> Relation {
        Relation {
            table,
            pages,
            page_bytes,
            rows,
            bytes,
        }
    }
}

impl Dataset {
    /// The dataset of a `--query`: read as a whole, through no relation. Why one constructor:
    /// every adapter describes a query the same way, only its columns and estimate differ.
    pub fn query(
        name: &str,
        sql: &str,
        columns: Vec<ColumnDesc>,
        estimate: SizeEstimate,
    ) -> Dataset {
        Dataset {
            name: name.to_string(),
            kind: DatasetKind::Query,
            object: None,
            relations: Vec::new(),
            query: Some(sql.to_string()),
            columns,
            primary_key: Vec::new(),
            estimate,
            outside_snapshot: Vec::new(),
            row_security_filtered: false,
            columns_picked: false,
            row_filter: Vec::new(),
        }
    }

    /// A plain table read from its one `relation`, estimated by it: no key, nothing outside
    /// the snapshot. Why: the shape a chunk planner starts from (planners' tests build it);
    /// a catalog adds keys and partitions to what it describes.
    pub fn table(relation: Relation, columns: Vec<ColumnDesc>) -> Dataset {
        Dataset {
            name: relation.table.dataset_name(),
            kind: DatasetKind::Table,
            object: Some(relation.table.clone()),
            estimate: SizeEstimate {
                rows: relation.rows,
                bytes: relation.bytes,
            },
            relations: vec![relation],
            query: None,
            columns,
            primary_key: Vec::new(),
            outside_snapshot: Vec::new(),
            row_security_filtered: false,
            columns_picked: false,
            row_filter: Vec::new(),
        }
    }

    /// The Arrow schema every part of this dataset is written with.
    pub fn arrow_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns
                .iter()
                .map(|c| c.field.clone())
                .collect::<Vec<_>>(),
        ))
    }
}

/// A query the user asked to export as a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedQuery {
    /// Dataset name (output directory).
    pub name: String,
    /// The SELECT to run. Sent as the user wrote it: it is the user's own SQL.
    pub sql: String,
}

/// What the user asked to export. Tables named explicitly must exist; patterns may match
/// nothing only if something else was selected.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Tables named with `--table`.
    pub tables: Vec<QualifiedName>,
    /// Regular expressions over `schema.table` (`--tables`).
    pub patterns: Vec<String>,
    /// Whole schemas (`--schema`).
    pub schemas: Vec<String>,
    /// Queries (`--query`).
    pub queries: Vec<NamedQuery>,
    /// Columns kept of some of the selected tables (`--columns`).
    pub columns: Vec<ColumnPick>,
    /// Filters every selected dataset's rows must meet, all of them (a read's pushed filters;
    /// see [`crate::filter`]): each is checked against every dataset at discovery.
    pub row_filter: Vec<crate::filter::RowFilter>,
}

/// `--columns TABLE:COL,COL`: the columns kept of one selected table (the others are not read,
/// in the snapshot or in change files). Columns keep the table's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnPick {
    /// The table, named as `--table` names it.
    pub table: QualifiedName,
    /// The columns as typed (a quoted one matches only exactly, as table names do).
    pub columns: Vec<NamePart>,
}

impl ColumnPick {
    /// Parse `table:col,col` (`schema.table` and the columns may be double-quoted; a quoted
    /// part may hold `:`, `,` and `"` doubled).
    pub fn parse(input: &str) -> Result<ColumnPick> {
        let bad = |why: &str| {
            Error::config(format!(
                "--columns {input:?}: {why}. Write it as table:column,column (e.g. --columns \
                 'public.orders:id,status,\"Amount\"'), once per table."
            ))
        };
        let parts = split_unquoted(input, ':');
        let [table, columns] = parts.as_slice() else {
            return Err(bad("it needs one ':' between the table and its columns"));
        };
        let table = QualifiedName::parse(table)?;
        let mut out = Vec::new();
        for c in split_unquoted(columns, ',') {
            let c = c.trim();
            let part = match c.strip_prefix('"').and_then(|c| c.strip_suffix('"')) {
                Some(inner) if !inner.is_empty() => NamePart {
                    text: inner.replace("\"\"", "\""),
                    quoted: true,
                },
                _ if c.is_empty() || c.contains('"') => {
                    return Err(bad("a column name is empty or badly quoted"));
                }
                _ => NamePart {
                    text: c.to_string(),
                    quoted: false,
                },
            };
            out.push(part);
        }
        Ok(ColumnPick {
            table,
            columns: out,
        })
    }
}

/// `text` split at each `sep` outside double quotes.
fn split_unquoted(text: &str, sep: char) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for ch in text.chars() {
        if ch == '"' {
            quoted = !quoted;
        }
        if ch == sep && !quoted {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    out.push(cur);
    out
}

impl Selection {
    /// True when nothing at all was selected.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
            && self.patterns.is_empty()
            && self.schemas.is_empty()
            && self.queries.is_empty()
    }
}

#[cfg(test)]
mod column_pick_tests {
    use super::*;

    #[test]
    fn column_picks_parse_with_quotes() {
        let p = ColumnPick::parse(r#"public."Or:ders":id, "A,b" ,x"#).unwrap();
        assert_eq!(p.table.name.text, "Or:ders");
        let cols: Vec<(&str, bool)> = p
            .columns
            .iter()
            .map(|c| (c.text.as_str(), c.quoted))
            .collect();
        assert_eq!(cols, [("id", false), ("A,b", true), ("x", false)]);
        for bad in ["orders", "orders:", "orders:a,,b", "a:b:c"] {
            let e = ColumnPick::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--columns"), "{bad}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(schema: &str, name: &str) -> TableRef {
        TableRef::new(schema, name)
    }

    #[test]
    fn dataset_names_are_plain_when_they_can_be_and_never_collide() {
        assert_eq!(t("public", "orders").dataset_name(), "public.orders");
        assert_eq!(t("", "ORDERS").dataset_name(), "ORDERS");
        assert_eq!(t("My Schema", "x y").dataset_name(), "My Schema.x y");
        let a = t("a.b", "c").dataset_name();
        let b = t("a", "b.c").dataset_name();
        assert_eq!(a, "\"a.b\".c");
        assert_eq!(b, "a.\"b.c\"");
        assert_ne!(a, b);
        assert_eq!(t("s", "say \"hi\"").dataset_name(), "s.\"say \"\"hi\"\"\"");
        assert_ne!(t("\"a\"", "b").dataset_name(), t("a", "b").dataset_name());
    }
}
