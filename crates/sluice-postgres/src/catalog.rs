//! Introspection: resolving what the user named, and describing it.
//!
//! Everything here reads `pg_catalog` with bound parameters (no SQL built from names), so it
//! runs the same inside the coordinator's snapshot (where it sees the schema as of the
//! snapshot) and in a plain session (for `sluice plan`).
//!
//! Longer than 500 lines because describing a relation is one sequence of catalog reads —
//! privileges, columns and types, keys, partitions, row-level security, sizes — that must run
//! in this order (nothing may read a policed table before the row-level security check).

use crate::error::{Phase, classify};
use crate::sql::{quote_ident, quote_table};
use crate::types::{PgType, TypeMap, map_column};
use async_trait::async_trait;
use sluice_core::select::Catalog;
use sluice_core::select::{Candidate, Folding, Naming};
use sluice_core::table::TableRef;
use sluice_core::{
    ColumnDesc, Dataset, DatasetKind, Error, NamedQuery, QualifiedName, Relation, Result,
    SizeEstimate,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use tokio_postgres::Client;

/// What the server is.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `server_version_num`, e.g. 150018.
    pub version_num: i32,
    /// Short version, e.g. `PostgreSQL 15.18`.
    pub version: String,
    /// True on a standby.
    pub in_recovery: bool,
    /// Fraction digits of money under the server's `lc_monetary`.
    pub money_scale: i8,
    /// The session user.
    pub user: String,
}

/// A catalog object the selection resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// `pg_class.oid`.
    pub oid: u32,
    /// Exact schema and name.
    pub table: TableRef,
    /// `relkind`: r table, p partitioned, v view, m materialized view, f foreign.
    pub relkind: char,
}

fn catalog_err(target: &str) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
    move |e| classify(e, Phase::Catalog, target)
}

/// Read the server's version and settings sluice depends on.
pub async fn server_info(client: &Client, target: &str) -> Result<ServerInfo> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int4, \
                    current_setting('server_version'), pg_is_in_recovery(), \
                    scale('0'::money::numeric)::int4, current_user::text",
            &[],
        )
        .await
        .map_err(catalog_err(target))?;
    let scale: i32 = row.get(3);
    Ok(ServerInfo {
        version_num: row.get(0),
        version: format!("PostgreSQL {}", row.get::<_, String>(1)),
        in_recovery: row.get(2),
        money_scale: scale.clamp(0, 18) as i8,
        user: row.get(4),
    })
}

/// How PostgreSQL names look and how its messages advise (see `sluice_core::select`).
pub const NAMING: Naming = Naming {
    engine: "PostgreSQL",
    folding: Folding::Lower,
    schemas: true,
    queries: true,
    pattern_target: "schema.table, e.g. --tables 'public\\.order_.*'",
    check: "the spelling and the schema (psql: \\dt *.*)",
    list: "psql's \\dt *.* and adjust the pattern (it must match all of schema.table)",
};

fn resolved(r: &tokio_postgres::Row, visible: bool) -> Candidate<Resolved> {
    let table = TableRef {
        schema: r.get(1),
        name: r.get(2),
    };
    let kind: String = r.get(3);
    Candidate {
        object: Resolved {
            oid: r.get(0),
            table: table.clone(),
            relkind: kind.chars().next().unwrap_or('r'),
        },
        table,
        unqualified: visible,
    }
}

/// The relations a user-typed name may mean: every readable relation whose name (and schema,
/// if given) equals the typed one in any case; `unqualified` when it is visible on the
/// search path.
pub async fn candidates(
    client: &Client,
    name: &QualifiedName,
    target: &str,
) -> Result<Vec<Candidate<Resolved>>> {
    let rows = client
        .query(
            "SELECT c.oid, n.nspname::text, c.relname::text, c.relkind::text, \
                    pg_table_is_visible(c.oid) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r','p','v','m','f') AND lower(c.relname) = lower($1) \
               AND ($2::text IS NULL OR lower(n.nspname) = lower($2))",
            &[
                &name.name.text,
                &name.schema.as_ref().map(|s| s.text.clone()),
            ],
        )
        .await
        .map_err(catalog_err(target))?;
    Ok(rows.iter().map(|r| resolved(r, r.get(4))).collect())
}

/// Tables `--tables` and `--schema` choose from: ordinary and partitioned tables that are
/// not partitions, outside the system schemas.
pub async fn tables(client: &Client, target: &str) -> Result<Vec<Candidate<Resolved>>> {
    let rows = client
        .query(
            "SELECT c.oid, n.nspname::text, c.relname::text, c.relkind::text \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r','p') AND NOT c.relispartition \
               AND n.nspname NOT IN ('pg_catalog','information_schema') \
               AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%' \
             ORDER BY 2, 3",
            &[],
        )
        .await
        .map_err(catalog_err(target))?;
    Ok(rows.iter().map(|r| resolved(r, false)).collect())
}

/// The coordinator's session as `sluice_core::select::discover` sees it. Describing records
/// the `relkind` of every relation found (objects and leaf partitions), which the snapshot
/// needs to choose how to lock each.
pub struct PgCatalog<'a> {
    /// The session (inside the snapshot in snapshot consistency).
    pub client: &'a Client,
    /// Server facts.
    pub server: &'a ServerInfo,
    /// Types loaded so far.
    pub types: &'a mut TypeMap,
    /// The redacted URL.
    pub target: &'a str,
    /// `--enable-row-security`.
    pub enable_row_security: bool,
    /// `relkind` of every relation described.
    pub relkinds: &'a mut HashMap<TableRef, char>,
}

#[async_trait]
impl Catalog for PgCatalog<'_> {
    type Object = Resolved;

    const NAMING: Naming = NAMING;

    fn target(&self) -> String {
        self.target.to_string()
    }

    fn unqualified_scope(&self) -> Option<String> {
        Some("looked on the search_path; add the schema".into())
    }

    async fn candidates(&mut self, name: &QualifiedName) -> Result<Vec<Candidate<Resolved>>> {
        candidates(self.client, name, self.target).await
    }

    async fn tables(&mut self) -> Result<Vec<Candidate<Resolved>>> {
        tables(self.client, self.target).await
    }

    async fn describe(&mut self, c: &Candidate<Resolved>) -> Result<Dataset> {
        let obj = &c.object;
        let ds = describe(
            self.client,
            obj,
            self.server,
            self.types,
            self.target,
            self.enable_row_security,
        )
        .await?;
        self.relkinds.insert(obj.table.clone(), obj.relkind);
        for rel in &ds.relations {
            let foreign = ds.outside_snapshot.contains(&rel.table.to_string());
            let kind = if foreign { 'f' } else { 'r' };
            self.relkinds.entry(rel.table.clone()).or_insert(kind);
        }
        Ok(ds)
    }

    async fn describe_query(&mut self, q: &NamedQuery) -> Result<Dataset> {
        describe_query(self.client, q, self.server, self.types, self.target).await
    }
}

/// Load `pg_type` rows for `oids` and, transitively, their element and base types.
pub async fn load_types(
    client: &Client,
    oids: &[u32],
    types: &mut TypeMap,
    target: &str,
) -> Result<()> {
    let mut want: Vec<u32> = oids
        .iter()
        .copied()
        .filter(|o| !types.contains_key(o))
        .collect();
    while !want.is_empty() {
        want.sort_unstable();
        want.dedup();
        let rows = client
            .query(
                "SELECT t.oid, t.typname::text, t.typtype::text, t.typcategory::text, t.typelem, \
                        t.typbasetype, t.typtypmod, t.typlen::int4, t.typsend::regproc::text \
                 FROM pg_type t WHERE t.oid = ANY($1)",
                &[&want],
            )
            .await
            .map_err(catalog_err(target))?;
        let mut next = Vec::new();
        for r in rows {
            let byte = |i: usize| r.get::<_, String>(i).bytes().next().unwrap_or(b' ');
            let send: String = r.get(8);
            let t = PgType {
                oid: r.get(0),
                name: r.get(1),
                typtype: byte(2),
                category: byte(3),
                elem: r.get(4),
                base: r.get(5),
                typmod: r.get(6),
                len: r.get::<_, i32>(7) as i16,
                send: send.rsplit('.').next().unwrap_or_default().to_string(),
            };
            for dep in [t.elem, t.base] {
                if dep != 0 && !types.contains_key(&dep) {
                    next.push(dep);
                }
            }
            types.insert(t.oid, t);
        }
        want = next;
    }
    Ok(())
}

struct RawColumn {
    name: String,
    type_oid: u32,
    typmod: i32,
    not_null: bool,
    dims: i32,
    display: String,
}

fn build_columns(raw: Vec<RawColumn>, types: &TypeMap, money_scale: i8) -> Vec<ColumnDesc> {
    raw.into_iter()
        .map(|c| {
            map_column(types, c.type_oid, c.typmod, c.dims, money_scale).column(
                c.name,
                c.display,
                !c.not_null,
            )
        })
        .collect()
}

/// Describe a resolved table, partitioned table or view as a dataset.
///
/// Row-level security: with `enable_row_security` false (the default, as in pg_dump), a table
/// whose policies would hide rows from the user (`row_security_active`) is refused here, before
/// anything is read, naming the table and the fix; every session also runs with
/// `row_security = off`, so a policy that escapes this check fails the read instead of
/// filtering it. With it true the dataset is marked filtered.
pub async fn describe(
    client: &Client,
    obj: &Resolved,
    server: &ServerInfo,
    types: &mut TypeMap,
    target: &str,
    enable_row_security: bool,
) -> Result<Dataset> {
    let err = catalog_err(target);
    let name = obj.table.dataset_name();
    let privilege = client
        .query_one(
            "SELECT has_table_privilege($1::oid, 'SELECT') \
                 OR NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = $1::oid AND a.attnum > 0 \
                     AND NOT a.attisdropped AND NOT has_column_privilege($1::oid, a.attnum, 'SELECT'))",
            &[&obj.oid],
        )
        .await
        .map_err(&err)?;
    if !privilege.get::<_, bool>(0) {
        return Err(Error::source_permanent(format!(
            "user {} has no SELECT privilege on {name} in {target}. Grant it (GRANT SELECT ON {} \
             TO {}; and USAGE on schema {}), or connect as a user that has it.",
            server.user,
            quote_table(&obj.table),
            quote_ident(&server.user),
            quote_ident(&obj.table.schema)
        )));
    }
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, a.atttypmod, a.attnotnull, a.attndims::int4, \
                    format_type(a.atttypid, a.atttypmod) \
             FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&obj.oid],
        )
        .await
        .map_err(&err)?;
    let raw: Vec<RawColumn> = rows
        .iter()
        .map(|r| RawColumn {
            name: r.get(0),
            type_oid: r.get(1),
            typmod: r.get(2),
            not_null: r.get(3),
            dims: r.get(4),
            display: r.get(5),
        })
        .collect();
    if raw.is_empty() {
        return Err(Error::config(format!(
            "{name} has no columns; there is nothing to export."
        )));
    }
    load_types(
        client,
        &raw.iter().map(|c| c.type_oid).collect::<Vec<_>>(),
        types,
        target,
    )
    .await?;
    let columns = build_columns(raw, types, server.money_scale);

    // The primary key, else the narrowest unique index over NOT NULL columns (a valid,
    // non-partial index on plain columns): either identifies a row, so key ranges over it hold
    // every row exactly once. INCLUDE columns are not part of the key.
    let pk_rows = client
        .query(
            "SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i \
             CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indpred IS NULL \
               AND i.indexprs IS NULL AND k.ord <= i.indnkeyatts \
             GROUP BY i.indexrelid, i.indisprimary HAVING bool_and(a.attnotnull) \
             ORDER BY i.indisprimary DESC, count(*), i.indexrelid LIMIT 1",
            &[&obj.oid],
        )
        .await
        .map_err(&err)?;
    let primary_key: Vec<String> = pk_rows
        .first()
        .map(|r| r.get::<_, Vec<String>>(0))
        .unwrap_or_default();

    // Leaf partitions, foreign ones too: a plan of plain partitions only would drop their rows.
    let leaves: Vec<(u32, TableRef, bool)> = if obj.relkind == 'p' {
        client
            .query(
                "SELECT c.oid, n.nspname::text, c.relname::text, c.relkind = 'f' \
                 FROM pg_partition_tree($1::oid) t \
                 JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE t.isleaf AND c.relkind IN ('r', 'f') ORDER BY 2, 3",
                &[&obj.oid],
            )
            .await
            .map_err(&err)?
            .iter()
            .map(|l| {
                let t = TableRef {
                    schema: l.get(1),
                    name: l.get(2),
                };
                (l.get(0), t, l.get(3))
            })
            .collect()
    } else {
        Vec::new()
    };
    // Before anything reads the table: with row_security = off even the planner's estimate
    // of a policed table fails.
    let mut policed = Vec::new();
    if rls_active(client, obj.oid, target).await? {
        policed.push(obj.table.to_string());
    }
    for (oid, t, _) in &leaves {
        if rls_active(client, *oid, target).await? {
            policed.push(t.to_string());
        }
    }
    if !policed.is_empty() && !enable_row_security {
        return Err(Error::source_permanent(format!(
            "row-level security policies on {} would hide rows of {name} from user {} in \
             {target}, so the export would be silently incomplete. Connect as the table's owner \
             or a role with BYPASSRLS (ALTER ROLE {} BYPASSRLS; pg_dump needs the same), or \
             pass --enable-row-security to export only the rows {} may see (the manifest then \
             marks the dataset as filtered).",
            policed.join(", "),
            server.user,
            quote_ident(&server.user),
            server.user
        )));
    }
    let mut outside_snapshot = Vec::new();
    let (kind, relations) = match obj.relkind {
        'r' | 'm' => (
            DatasetKind::Table,
            vec![relation_size(client, obj.oid, &obj.table, target).await?],
        ),
        'p' => {
            let mut rels = Vec::new();
            for (oid, t, foreign) in &leaves {
                if *foreign {
                    outside_snapshot.push(t.to_string());
                }
                rels.push(relation_size(client, *oid, t, target).await?);
            }
            (DatasetKind::Partitioned, rels)
        }
        'f' => {
            outside_snapshot.push(obj.table.to_string());
            (DatasetKind::View, Vec::new())
        }
        _ => (DatasetKind::View, Vec::new()),
    };
    let estimate = if relations.is_empty() {
        explain_estimate(
            client,
            &format!("SELECT * FROM {}", quote_table(&obj.table)),
            target,
        )
        .await?
    } else {
        SizeEstimate {
            rows: relations.iter().map(|r| r.rows).sum(),
            bytes: relations.iter().map(|r| r.bytes).sum(),
        }
    };
    Ok(Dataset {
        name,
        kind,
        object: Some(obj.table.clone()),
        relations,
        query: None,
        columns,
        primary_key,
        estimate,
        outside_snapshot,
        row_security_filtered: !policed.is_empty(),
        columns_picked: false,
        row_filter: Vec::new(),
    })
}

/// Whether row-level security policies apply to the current user on `oid` (the table has
/// RLS enabled and the user is neither its owner — unless FORCE — nor BYPASSRLS nor superuser).
/// `row_security_active` answers that whatever the session's `row_security` setting.
async fn rls_active(client: &Client, oid: u32, target: &str) -> Result<bool> {
    let r = client
        .query_one("SELECT row_security_active($1::oid)", &[&oid])
        .await
        .map_err(catalog_err(target))?;
    Ok(r.get(0))
}

async fn relation_size(
    client: &Client,
    oid: u32,
    table: &TableRef,
    target: &str,
) -> Result<Relation> {
    let r = client
        .query_one(
            "SELECT pg_relation_size($1::oid)::int8, current_setting('block_size')::int8, \
                    pg_table_size($1::oid)::int8, c.reltuples::float8 \
             FROM pg_class c WHERE c.oid = $1::oid",
            &[&oid],
        )
        .await
        .map_err(catalog_err(target))?;
    let heap: i64 = r.get(0);
    let block: i64 = r.get(1);
    let total: i64 = r.get(2);
    let reltuples: f64 = r.get(3);
    let rows = if reltuples >= 0.0 {
        reltuples as u64
    } else {
        // Never analyzed: ask the planner, which extrapolates from the page count.
        explain_estimate(
            client,
            &format!("SELECT * FROM ONLY {}", quote_table(table)),
            target,
        )
        .await?
        .rows
    };
    Ok(Relation {
        table: table.clone(),
        pages: (heap / block.max(1)) as u64,
        page_bytes: block as u64,
        rows,
        bytes: total.max(0) as u64,
    })
}

/// The planner's row and width estimate for a query (no rows are read).
pub async fn explain_estimate(client: &Client, sql: &str, target: &str) -> Result<SizeEstimate> {
    // Simple-query protocol returns the plan as text, whatever the json type's driver support.
    let messages = client
        .simple_query(&format!("EXPLAIN (FORMAT JSON) {sql}"))
        .await
        .map_err(catalog_err(target))?;
    let text = messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default();
    let grab = |key: &str| -> f64 {
        text.find(key)
            .and_then(|i| {
                let rest = text[i + key.len()..].trim_start_matches([':', ' ', '"']);
                let end = rest
                    .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '+'))
                    .unwrap_or(rest.len());
                rest[..end].parse::<f64>().ok()
            })
            .unwrap_or(0.0)
    };
    let rows = grab("\"Plan Rows\"");
    let width = grab("\"Plan Width\"");
    Ok(SizeEstimate {
        rows: rows as u64,
        bytes: (rows * width) as u64,
    })
}

/// Describe a user query as a dataset, from its prepared row description.
pub async fn describe_query(
    client: &Client,
    q: &NamedQuery,
    server: &ServerInfo,
    types: &mut TypeMap,
    target: &str,
) -> Result<Dataset> {
    let stmt = client.prepare(&q.sql).await.map_err(|e| {
        classify(e, Phase::Catalog, target)
            .context(format!("query {:?} could not be prepared", q.name))
    })?;
    let mut seen = HashSet::new();
    let mut raw = Vec::new();
    for c in stmt.columns() {
        if !seen.insert(c.name().to_string()) {
            return Err(Error::config(format!(
                "query {:?} returns two columns named {:?}; give them distinct aliases (AS …).",
                q.name,
                c.name()
            )));
        }
        raw.push(RawColumn {
            name: c.name().to_string(),
            type_oid: c.type_().oid(),
            typmod: c.type_modifier(),
            not_null: false,
            dims: 0,
            display: String::new(),
        });
    }
    if raw.is_empty() {
        return Err(Error::config(format!(
            "query {:?} returns no columns.",
            q.name
        )));
    }
    let oids: Vec<u32> = raw.iter().map(|c| c.type_oid).collect();
    load_types(client, &oids, types, target).await?;
    let mut displays: BTreeMap<(u32, i32), String> = BTreeMap::new();
    for c in &raw {
        if let std::collections::btree_map::Entry::Vacant(e) =
            displays.entry((c.type_oid, c.typmod))
        {
            let r = client
                .query_one("SELECT format_type($1, $2)", &[&c.type_oid, &c.typmod])
                .await
                .map_err(catalog_err(target))?;
            e.insert(r.get(0));
        }
    }
    for c in &mut raw {
        c.display = displays[&(c.type_oid, c.typmod)].clone();
    }
    let estimate = explain_estimate(client, &q.sql, target).await?;
    let columns = build_columns(raw, types, server.money_scale);
    Ok(Dataset::query(&q.name, &q.sql, columns, estimate))
}
