//! Introspection: resolving what the user named, and describing it.
//!
//! Everything reads the `RDB$` system tables with bound parameters (no SQL built from names),
//! inside the coordinator's transaction — in snapshot consistency that is the shared snapshot,
//! so the schema described is the schema the workers read. Firebird (up to 5) has no schemas:
//! a table's dataset name is its name.

use crate::connect::{FbConn, Session, as_i64, as_text};
use crate::error::{Phase, classify};
use crate::types::{FbField, map_field};
use async_trait::async_trait;
use rsfbclient_core::{FbError, SqlType};
use sluice_core::select::{Candidate, Catalog, Folding, Naming};
use sluice_core::table::TableRef;
use sluice_core::{
    Dataset, DatasetKind, Error, NamedQuery, QualifiedName, Relation, Result, SizeEstimate,
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

/// How Firebird names look and how its messages advise (see `sluice_core::select`).
pub const NAMING: Naming = Naming {
    engine: "Firebird",
    folding: Folding::Upper,
    schemas: false,
    queries: false,
    pattern_target: "the whole table name, e.g. --tables 'ORDER_.*'",
    check: "the spelling (SELECT RDB$RELATION_NAME FROM RDB$RELATIONS lists them)",
    list: "SELECT RDB$RELATION_NAME FROM RDB$RELATIONS WHERE RDB$SYSTEM_FLAG = 0 and adjust \
           the pattern (it must match the whole name; unquoted names are upper case)",
};

fn candidate(r: Resolved) -> Candidate<Resolved> {
    Candidate {
        table: TableRef {
            schema: String::new(),
            name: r.name.clone(),
        },
        unqualified: true,
        object: r,
    }
}

/// The coordinator's attachment as `sluice_core::select::discover` sees it; every catalog
/// read runs on the attachment's thread, inside the coordinator's transaction.
pub struct FbCatalog<'a> {
    /// The coordinator's session.
    pub session: &'a Session,
    /// Server facts.
    pub server: &'a ServerInfo,
}

#[async_trait]
impl Catalog for FbCatalog<'_> {
    type Object = Resolved;

    const NAMING: Naming = NAMING;

    fn target(&self) -> String {
        self.session.display().to_string()
    }

    /// Every table and view: Firebird databases hold few enough to match names here.
    async fn candidates(&mut self, _: &QualifiedName) -> Result<Vec<Candidate<Resolved>>> {
        let target = self.target();
        let all = self
            .session
            .call(move |c| relations(c, true, &target))
            .await??;
        Ok(all.into_iter().map(candidate).collect())
    }

    /// Regular user tables: no system tables, views, global temporary or external tables.
    async fn tables(&mut self) -> Result<Vec<Candidate<Resolved>>> {
        let target = self.target();
        let all = self
            .session
            .call(move |c| relations(c, false, &target))
            .await??;
        Ok(all.into_iter().map(candidate).collect())
    }

    async fn describe(&mut self, c: &Candidate<Resolved>) -> Result<Dataset> {
        let (obj, server) = (c.object.clone(), self.server.clone());
        self.session
            .call(move |conn| describe(conn, &obj, &server))
            .await?
    }

    async fn describe_query(&mut self, q: &NamedQuery) -> Result<Dataset> {
        Err(Error::internal(format!(
            "query {:?} reached a Firebird catalog, which reads no queries",
            q.name
        )))
    }
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
        let (m, shown) = map_field(&ftype).map_err(|why| {
            Error::config(format!(
                "column {name:?} of {} cannot be exported: {why}. Export a view that leaves it \
                 out or converts it.",
                obj.name
            ))
        })?;
        columns.push(m.column(name, shown, int(9) == 0));
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
        columns_picked: false,
        row_filter: Vec::new(),
    })
}
