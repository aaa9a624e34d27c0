//! Introspection: resolving what the user named, and describing it.
//!
//! Everything reads the `RDB$` system tables with bound parameters (no SQL built from names),
//! inside the coordinator's transaction — in snapshot consistency that is the shared snapshot,
//! so the schema described is the schema the workers read. Firebird (up to 5) has no schemas:
//! a table's dataset name is its name.

use crate::connect::{FbConn, as_i64, as_text};
use crate::error::{Phase, classify};
use crate::types::{FbField, map_field};
use rsfbclient_core::{FbError, SqlType};
use sluice_core::table::TableRef;
use sluice_core::{
    ColumnDesc, Dataset, DatasetKind, Error, QualifiedName, Relation, Result, Selection,
    SizeEstimate,
};

/// What the server is.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `ENGINE_VERSION`, e.g. `5.0.4`.
    pub version: String,
    /// Its major number.
    pub major: u32,
    /// Database page size in bytes.
    pub page_size: u64,
}

impl ServerInfo {
    /// True when the engine can share a snapshot by number and address pointer pages with
    /// `MAKE_DBKEY` (Firebird 4.0 and later).
    pub fn has_shared_snapshots(&self) -> bool {
        self.major >= 4
    }
}

/// A table the selection resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// `RDB$RELATION_ID`.
    pub id: i64,
    /// Exact name.
    pub name: String,
    /// True for a view.
    pub view: bool,
}

fn catalog(target: &str) -> impl Fn(FbError) -> Error + '_ {
    move |e| classify(e, Phase::Catalog, target)
}

/// Read the engine version and page size.
pub fn server_info(conn: &mut FbConn) -> Result<ServerInfo> {
    let target = conn.display().to_string();
    let rows = conn
        .query(
            "SELECT RDB$GET_CONTEXT('SYSTEM', 'ENGINE_VERSION'), \
                    (SELECT MON$PAGE_SIZE FROM MON$DATABASE) FROM RDB$DATABASE",
            vec![],
        )
        .map_err(catalog(&target))?;
    let row = rows
        .first()
        .ok_or_else(|| Error::internal("RDB$DATABASE is empty"))?;
    let version = row.first().and_then(as_text).unwrap_or_default();
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    Ok(ServerInfo {
        major,
        page_size: row.get(1).and_then(as_i64).unwrap_or(8192).max(1024) as u64,
        version,
    })
}

/// User tables (and views, when `views`): id, name, is-view, sorted by name.
fn relations(conn: &mut FbConn, views: bool, target: &str) -> Result<Vec<Resolved>> {
    let rows = conn
        .query(
            "SELECT r.RDB$RELATION_ID, TRIM(r.RDB$RELATION_NAME), \
                    CASE WHEN r.RDB$VIEW_BLR IS NULL THEN 0 ELSE 1 END \
             FROM RDB$RELATIONS r \
             WHERE COALESCE(r.RDB$SYSTEM_FLAG, 0) = 0 AND r.RDB$EXTERNAL_FILE IS NULL \
               AND COALESCE(r.RDB$RELATION_TYPE, 0) IN (0, 1) \
             ORDER BY 2",
            vec![],
        )
        .map_err(catalog(target))?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            Some(Resolved {
                id: as_i64(r.first()?)?,
                name: as_text(r.get(1)?)?,
                view: as_i64(r.get(2)?)? == 1,
            })
        })
        .filter(|r| views || !r.view)
        .collect())
}

/// Resolve one user-typed table name: a quoted name matches exactly; a bare name matches
/// exactly, else in upper case (how Firebird stores unquoted names), else case-insensitively.
pub fn resolve_name(conn: &mut FbConn, name: &QualifiedName) -> Result<Resolved> {
    let target = conn.display().to_string();
    if name.schema.is_some() {
        return Err(Error::config(format!(
            "table {name}: Firebird has no schemas; name the table alone (--table NAME)."
        )));
    }
    let all = relations(conn, true, &target)?;
    let want = &name.name.text;
    let pick = |f: &dyn Fn(&Resolved) -> bool| all.iter().filter(|r| f(r)).cloned().collect();
    let mut found: Vec<Resolved> = pick(&|r| &r.name == want);
    if found.is_empty() && !name.name.quoted {
        found = pick(&|r| r.name == want.to_uppercase());
        if found.is_empty() {
            found = pick(&|r| r.name.to_lowercase() == want.to_lowercase());
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::config(format!(
            "table {name} does not exist in {target}. Check the spelling (SELECT \
             RDB$RELATION_NAME FROM RDB$RELATIONS lists them); names typed without double \
             quotes match in any case."
        ))),
        _ => Err(Error::config(format!(
            "table name {name} is ambiguous in {target}: it matches {}. Put the name in double \
             quotes to match its exact case.",
            found
                .iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Regular user tables (no system tables, views, global temporary or external tables)
/// whose name matches one of the patterns.
pub fn resolve_many(conn: &mut FbConn, selection: &Selection) -> Result<Vec<Resolved>> {
    let target = conn.display().to_string();
    if let Some(s) = selection.schemas.first() {
        return Err(Error::config(format!(
            "--schema {s:?}: Firebird has no schemas; select tables with --tables REGEX (matched \
             against the table name) or --table NAME."
        )));
    }
    if selection.patterns.is_empty() {
        return Ok(Vec::new());
    }
    let patterns = selection
        .patterns
        .iter()
        .map(|p| {
            regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                Error::config(format!(
                    "--tables pattern {p:?} is not a valid regular expression ({e}). It is \
                     matched against the whole table name, e.g. --tables 'ORDER_.*'."
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(relations(conn, false, &target)?
        .into_iter()
        .filter(|r| patterns.iter().any(|p| p.is_match(&r.name)))
        .collect())
}

/// Data pages one pointer page addresses: its page number array plus one byte of flags per
/// slot fill the page after a 32-byte header (ODS 12 and 13).
pub fn data_pages_per_pointer_page(page_size: u64) -> u64 {
    (page_size.saturating_sub(32) / 5).max(1)
}

/// Describe a resolved table or view as a dataset.
pub fn describe(conn: &mut FbConn, obj: &Resolved, server: &ServerInfo) -> Result<Dataset> {
    let target = conn.display().to_string();
    let err = catalog(&target);
    let rows = conn
        .query(
            "SELECT TRIM(rf.RDB$FIELD_NAME), f.RDB$FIELD_TYPE, COALESCE(f.RDB$FIELD_SUB_TYPE, 0), \
                    COALESCE(f.RDB$FIELD_SCALE, 0), COALESCE(f.RDB$FIELD_PRECISION, 0), \
                    COALESCE(f.RDB$CHARACTER_LENGTH, 0), COALESCE(f.RDB$CHARACTER_SET_ID, 0), \
                    TRIM(COALESCE(cs.RDB$CHARACTER_SET_NAME, '')), COALESCE(f.RDB$DIMENSIONS, 0), \
                    COALESCE(rf.RDB$NULL_FLAG, f.RDB$NULL_FLAG, 0) \
             FROM RDB$RELATION_FIELDS rf \
             JOIN RDB$FIELDS f ON f.RDB$FIELD_NAME = rf.RDB$FIELD_SOURCE \
             LEFT JOIN RDB$CHARACTER_SETS cs ON cs.RDB$CHARACTER_SET_ID = f.RDB$CHARACTER_SET_ID \
             WHERE rf.RDB$RELATION_NAME = CAST(? AS VARCHAR(252)) \
             ORDER BY rf.RDB$FIELD_POSITION",
            vec![SqlType::Text(obj.name.clone())],
        )
        .map_err(&err)?;
    let mut columns = Vec::new();
    for r in &rows {
        let int = |i: usize| r.get(i).and_then(as_i64).unwrap_or(0);
        let name = r.first().and_then(as_text).unwrap_or_default();
        let ftype = FbField {
            field_type: int(1) as i16,
            sub_type: int(2) as i16,
            scale: int(3) as i16,
            precision: int(4) as i16,
            char_length: int(5) as i32,
            charset_id: int(6) as i16,
            charset: r.get(7).and_then(as_text).unwrap_or_default(),
            dimensions: int(8) as i16,
        };
        let m = map_field(&ftype).map_err(|why| {
            Error::config(format!(
                "column {name:?} of {} cannot be exported: {why}. Export a view that leaves it \
                 out or converts it.",
                obj.name
            ))
        })?;
        columns.push(ColumnDesc {
            field: crate::types::field(&name, &m, int(9) == 0),
            name,
            source_type: m.display,
            cast: m.cast,
            as_text_fallback: false,
        });
    }
    if columns.is_empty() {
        return Err(Error::config(format!(
            "{} has no columns; there is nothing to export.",
            obj.name
        )));
    }
    let pk = conn
        .query(
            "SELECT TRIM(s.RDB$FIELD_NAME) FROM RDB$RELATION_CONSTRAINTS rc \
             JOIN RDB$INDEX_SEGMENTS s ON s.RDB$INDEX_NAME = rc.RDB$INDEX_NAME \
             WHERE rc.RDB$RELATION_NAME = CAST(? AS VARCHAR(252)) \
               AND rc.RDB$CONSTRAINT_TYPE = 'PRIMARY KEY' \
             ORDER BY s.RDB$FIELD_POSITION",
            vec![SqlType::Text(obj.name.clone())],
        )
        .map_err(&err)?;
    let primary_key = pk
        .iter()
        .filter_map(|r| r.first().and_then(as_text))
        .collect();
    let table = TableRef {
        schema: String::new(),
        name: obj.name.clone(),
    };
    let row_width: u64 = columns
        .iter()
        .map(|c| match c.field.data_type() {
            arrow_schema::DataType::Utf8 | arrow_schema::DataType::Binary => 32,
            _ => 8,
        })
        .sum::<u64>()
        + 16;
    let (kind, relations) = if obj.view {
        (DatasetKind::View, Vec::new())
    } else {
        let pps = conn
            .query(
                "SELECT COUNT(*) FROM RDB$PAGES WHERE RDB$RELATION_ID = ? AND RDB$PAGE_TYPE = 4",
                vec![SqlType::Integer(obj.id)],
            )
            .map_err(&err)?
            .first()
            .and_then(|r| r.first())
            .and_then(as_i64)
            .unwrap_or(0)
            .max(0) as u64;
        // Every pointer page but the last is assumed full, the last half full.
        let data_pages = (pps * data_pages_per_pointer_page(server.page_size))
            .saturating_sub(data_pages_per_pointer_page(server.page_size) / 2);
        let bytes = data_pages * server.page_size;
        (
            DatasetKind::Table,
            vec![Relation {
                table: table.clone(),
                pages: pps,
                page_bytes: server.page_size * data_pages_per_pointer_page(server.page_size),
                rows: bytes / row_width,
                bytes,
            }],
        )
    };
    let estimate = SizeEstimate {
        rows: relations.iter().map(|r| r.rows).sum(),
        bytes: relations.iter().map(|r| r.bytes).sum(),
    };
    Ok(Dataset {
        name: obj.name.clone(),
        kind,
        object: Some(table),
        relations,
        query: None,
        columns,
        primary_key,
        estimate,
        outside_snapshot: Vec::new(),
        row_security_filtered: false,
    })
}
