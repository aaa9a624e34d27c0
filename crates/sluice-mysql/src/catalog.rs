//! Introspection: resolving what the user named, and describing it.
//!
//! Everything here reads `information_schema` with bound parameters (no SQL built from names),
//! so names with quotes, backticks or Unicode are looked up exactly. Catalog reads happen
//! before the snapshot (MySQL cannot export one to plan under), and nothing stops a DDL between
//! them and the snapshot: readers select the columns described here by name, so a column
//! dropped in between fails the read, and a table altered after the snapshot fails it with
//! error 1412 (see `snapshot.rs`).

use crate::error::{Phase, classify};
use crate::non_transactional::NonTransactional;
use crate::sql::quote_table;
use crate::types::{MyType, map_type};
use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};
use sluice_core::select::Catalog;
use sluice_core::select::{Candidate, Folding, Naming};
use sluice_core::table::TableRef;
use sluice_core::{
    ColumnDesc, Dataset, DatasetKind, Error, NamedQuery, QualifiedName, Relation, Result,
    SizeEstimate,
};
use std::collections::{HashMap, HashSet};

mod describe;
mod keys;
pub use describe::{check_select, describe, describe_query};
pub use keys::table_keys;

/// Which server family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// MariaDB.
    Mariadb,
    /// Oracle MySQL (and compatible forks such as Percona Server).
    Mysql,
}

/// What the server is.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// MariaDB or MySQL.
    pub flavor: Flavor,
    /// Version as (major, minor, patch).
    pub version: (u32, u32, u32),
    /// For reports, e.g. `MariaDB 10.11.6`.
    pub display: String,
    /// `CURRENT_USER()`.
    pub user: String,
}

impl ServerInfo {
    /// True when the server is at least `v`.
    pub fn at_least(&self, v: (u32, u32, u32)) -> bool {
        self.version >= v
    }
}

/// A catalog object the selection resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resolved {
    /// Exact database and name.
    pub table: TableRef,
    /// True for a view.
    pub view: bool,
}

/// A described dataset plus the key its chunks may split on.
#[derive(Debug, Clone)]
pub struct Described {
    /// The dataset.
    pub dataset: Dataset,
    /// Primary key, else the shortest unique key over NOT NULL columns; empty if neither.
    pub split_key: Vec<String>,
    /// The storage engine of a table whose engine has no transactions (MyISAM, Aria, MEMORY,
    /// …): a consistent snapshot does not cover it. `None` for transactional tables and views.
    pub non_transactional: Option<String>,
}

fn err(target: &str) -> impl Fn(mysql_async::Error) -> Error + '_ {
    move |e| classify(e, Phase::Catalog, target)
}

/// Column `i` of `row` as text (NULL → empty).
pub fn text(row: &Row, i: usize) -> String {
    match row.as_ref(i) {
        Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::Int(v)) => v.to_string(),
        Some(Value::UInt(v)) => v.to_string(),
        Some(Value::NULL) | None => String::new(),
        Some(other) => other.as_sql(true).trim_matches('\'').to_string(),
    }
}

/// Column `i` of `row` as an unsigned number (NULL or non-numbers → 0).
pub fn number(row: &Row, i: usize) -> u64 {
    match row.as_ref(i) {
        Some(Value::Int(v)) => (*v).max(0) as u64,
        Some(Value::UInt(v)) => *v,
        Some(Value::Double(v)) => v.max(0.0) as u64,
        Some(Value::Bytes(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .map(|f| f.max(0.0) as u64)
            .unwrap_or(0),
        _ => 0,
    }
}

fn parse_version(v: &str) -> (u32, u32, u32) {
    let mut it = v
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().unwrap_or(0));
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

/// Read the server's product and version.
pub async fn server_info(conn: &mut Conn, target: &str) -> Result<ServerInfo> {
    let row: Option<Row> = conn
        .query_first("SELECT VERSION(), @@version_comment, CURRENT_USER()")
        .await
        .map_err(err(target))?;
    let row = row.ok_or_else(|| Error::internal("SELECT VERSION() returned no row"))?;
    let version_text = text(&row, 0);
    let comment = text(&row, 1);
    let mariadb = version_text.to_ascii_lowercase().contains("mariadb")
        || comment.to_ascii_lowercase().contains("mariadb");
    // MariaDB 10 once prefixed `5.5.5-` for old clients; skip it if present.
    let clean = version_text.strip_prefix("5.5.5-").unwrap_or(&version_text);
    let version = parse_version(clean);
    let flavor = if mariadb {
        Flavor::Mariadb
    } else {
        Flavor::Mysql
    };
    Ok(ServerInfo {
        flavor,
        version,
        display: format!(
            "{} {}.{}.{}",
            if mariadb { "MariaDB" } else { "MySQL" },
            version.0,
            version.1,
            version.2
        ),
        user: text(&row, 2),
    })
}

const SYSTEM_SCHEMAS: &str = "('mysql','information_schema','performance_schema','sys')";

/// How MySQL/MariaDB names look and how its messages advise (see `sluice_core::select`).
pub const NAMING: Naming = Naming {
    engine: "MySQL/MariaDB",
    folding: Folding::Preserve,
    schemas: true,
    queries: true,
    pattern_target: "database.table, e.g. --tables 'shop\\.order_.*'",
    check: "the spelling and the database (SHOW TABLES FROM db)",
    list: "SHOW TABLES FROM <database> and adjust the pattern (it must match all of \
           database.table)",
};

/// The tables and views a user-typed name may mean: those whose name and database (the
/// typed one, else the URL's `default_db`) equal the typed ones in any case.
pub async fn candidates(
    conn: &mut Conn,
    name: &QualifiedName,
    default_db: &str,
    target: &str,
) -> Result<Vec<Candidate<Resolved>>> {
    let schema = name
        .schema
        .as_ref()
        .map(|s| s.text.clone())
        .unwrap_or_else(|| default_db.to_string());
    let rows: Vec<Row> = conn
        .exec(
            "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES \
             WHERE LOWER(TABLE_SCHEMA) = LOWER(?) AND LOWER(TABLE_NAME) = LOWER(?)",
            (schema, name.name.text.clone()),
        )
        .await
        .map_err(err(target))?;
    Ok(rows
        .iter()
        .map(|r| {
            let unqualified = text(r, 0) == default_db;
            candidate(r, unqualified, text(r, 2) == "VIEW")
        })
        .collect())
}

/// The candidate named by a row's `TABLE_SCHEMA`, `TABLE_NAME`.
fn candidate(r: &Row, unqualified: bool, view: bool) -> Candidate<Resolved> {
    let table = TableRef::new(text(r, 0), text(r, 1));
    Candidate {
        unqualified,
        object: Resolved {
            table: table.clone(),
            view,
        },
        table,
    }
}

/// Base tables outside the system databases, for `--tables` and `--schema`.
pub async fn tables(conn: &mut Conn, target: &str) -> Result<Vec<Candidate<Resolved>>> {
    let rows: Vec<Row> = conn
        .query(format!(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES \
             WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN {SYSTEM_SCHEMAS} \
             ORDER BY 1, 2"
        ))
        .await
        .map_err(err(target))?;
    Ok(rows.iter().map(|r| candidate(r, false, false)).collect())
}

/// The coordinator's session as `sluice_core::select::discover` sees it. Describing a table
/// checks the user may read it, and records its split key and whether its engine has
/// transactions.
pub struct MyCatalog<'a> {
    /// The coordinator's session.
    pub conn: &'a mut Conn,
    /// Server facts.
    pub server: &'a ServerInfo,
    /// The URL's database, where names without one are looked up.
    pub default_db: &'a str,
    /// The redacted URL.
    pub target: &'a str,
    /// Split keys of the datasets described, by dataset name.
    pub split_keys: &'a mut SplitKeys,
    /// Tables in engines without transactions.
    pub non_transactional: &'a mut NonTransactional,
}

#[async_trait]
impl Catalog for MyCatalog<'_> {
    type Object = Resolved;

    const NAMING: Naming = NAMING;

    fn target(&self) -> String {
        self.target.to_string()
    }

    fn unqualified_scope(&self) -> Option<String> {
        Some(format!(
            "looked in database {}, the one in the URL",
            self.default_db
        ))
    }

    async fn candidates(&mut self, name: &QualifiedName) -> Result<Vec<Candidate<Resolved>>> {
        candidates(self.conn, name, self.default_db, self.target).await
    }

    async fn tables(&mut self) -> Result<Vec<Candidate<Resolved>>> {
        tables(self.conn, self.target).await
    }

    async fn describe(&mut self, c: &Candidate<Resolved>) -> Result<Dataset> {
        let obj = &c.object;
        check_select(self.conn, &obj.table, self.server, self.target).await?;
        let d = describe(self.conn, obj, self.server, self.target).await?;
        self.split_keys.insert(d.dataset.name.clone(), d.split_key);
        if let Some(engine) = d.non_transactional {
            self.non_transactional
                .add(&d.dataset.name, &obj.table, engine);
        }
        Ok(d.dataset)
    }

    async fn describe_query(&mut self, q: &NamedQuery) -> Result<Dataset> {
        describe_query(self.conn, q, self.target).await
    }
}

/// Datasets described so far in this run, by name, with their split keys.
pub type SplitKeys = HashMap<String, Vec<String>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("10.11.6-MariaDB-0+deb12u1"), (10, 11, 6));
        assert_eq!(parse_version("8.0.36"), (8, 0, 36));
    }
}
