//! Target tables: column types, `CREATE TABLE`, and the column barrier's `ALTER TABLE`.
//!
//! A PostgreSQL source's columns are created with their own type text (`format_type` on the
//! source), so a copy keeps `numeric(12,2)`, domains, enums and arrays exactly — when the type
//! exists on the target. Columns of another engine, and PostgreSQL types the target lacks (an
//! enum, domain or extension type not created there), are mapped from the Arrow type the
//! export reads (the table in `docs/replicate/types.md`), and each such column is noted.

use super::render::Kind;
use crate::sql::{quote_ident, quote_table};
use arrow_schema::extension::{ExtensionType, Json};
use arrow_schema::{DataType, Field};
use sluice_core::apply::{Engine, ForeignKey, SourceColumn, TargetTable};
use sluice_core::table::{ColumnDesc, TableRef};
use sluice_core::{Error, Result};
use std::collections::{HashMap, HashSet};
use tokio_postgres::Client;

/// The PostgreSQL type a column of Arrow type `field` lands in when its source type cannot be
/// used (another engine, or a type missing on the target).
pub fn mapped_type(field: &Field) -> String {
    let json = field.extension_type_name() == Some(Json::NAME);
    match field.data_type() {
        DataType::Boolean => "boolean".into(),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint".into(),
        DataType::Int32 | DataType::UInt16 => "integer".into(),
        DataType::Int64 | DataType::UInt32 => "bigint".into(),
        DataType::UInt64 => "numeric(20,0)".into(),
        DataType::Float16 | DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) if *s >= 0 => {
            format!("numeric({p},{s})")
        }
        DataType::Decimal128(..) | DataType::Decimal256(..) => "numeric".into(),
        DataType::Utf8 | DataType::LargeUtf8 if json => "jsonb".into(),
        DataType::Utf8 | DataType::LargeUtf8 => "text".into(),
        DataType::FixedSizeBinary(16) if Kind::of(field).ok() == Some(Kind::Uuid) => "uuid".into(),
        DataType::Binary | DataType::LargeBinary | DataType::FixedSizeBinary(_) => "bytea".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Time32(_) | DataType::Time64(_) => "time".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        DataType::Timestamp(_, Some(_)) => "timestamptz".into(),
        DataType::Duration(_) => "interval".into(),
        DataType::Struct(_) if Kind::of(field).ok() == Some(Kind::Interval) => "interval".into(),
        DataType::List(item) => format!("{}[]", mapped_type(item)),
        _ => "text".into(),
    }
}

/// Which of `types` (type texts) name a type on the target (`to_regtype`).
pub async fn known_types(
    client: &Client,
    types: &[String],
    display: &str,
) -> Result<HashSet<String>> {
    let rows = client
        .query(
            "SELECT t FROM unnest($1::text[]) AS t WHERE to_regtype(t) IS NOT NULL",
            &[&types],
        )
        .await
        .map_err(|e| super::failed(e, display, "checking the target's types"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The target type of `c`: its own type text for a same-engine column whose type the target
/// knows, else the mapped type (with a note for the report).
pub fn column_type(
    table: &TableRef,
    c: &ColumnDesc,
    same_engine: bool,
    known: &HashSet<String>,
    notes: &mut Vec<String>,
) -> String {
    if same_engine && known.contains(&c.source_type) {
        return c.source_type.clone();
    }
    let mapped = mapped_type(&c.field);
    if same_engine {
        notes.push(format!(
            "{table}.{}: type {} does not exist on the target; created as {mapped}",
            c.name, c.source_type
        ));
    } else if c.as_text_fallback {
        notes.push(format!(
            "{table}.{}: source type {} has no PostgreSQL counterpart; created as {mapped} \
             holding its text",
            c.name, c.source_type
        ));
    }
    mapped
}

/// The target's columns of `table` (name → `format_type`), or `None` when the table is missing.
pub async fn target_columns(
    client: &Client,
    table: &TableRef,
    display: &str,
) -> Result<Option<Vec<(String, String)>>> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 \
               AND NOT a.attisdropped \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p') \
             ORDER BY a.attnum",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(|e| super::failed(e, display, &format!("reading the columns of {table}")))?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        rows.iter()
            .filter_map(|r| Some((r.get::<_, Option<String>>(0)?, r.get(1))))
            .collect(),
    ))
}

/// Whether the target creates column `name` of `t`: every column but a generated one of
/// another engine's source, whose expression is not PostgreSQL's (the change stream does not
/// carry generated columns, so a plain column would go stale).
pub fn carried(t: &TargetTable, name: &str) -> bool {
    t.source_engine == Engine::Postgres || !t.keys.is_generated(name)
}

/// The quoted names `cols`, separated by commas.
fn list(cols: &[String]) -> String {
    let quoted: Vec<String> = cols.iter().map(|c| quote_ident(c)).collect();
    quoted.join(", ")
}

/// `CREATE TABLE` for `t` with the given column types: not-null, primary key, unique keys,
/// and a PostgreSQL source's generated columns with their expression.
pub fn create_sql(t: &TargetTable, types: &[String]) -> String {
    let mut parts: Vec<String> = t
        .columns
        .iter()
        .zip(types)
        .filter(|(c, _)| carried(t, &c.name))
        .map(|(c, ty)| {
            let not_null = if c.field.is_nullable() {
                ""
            } else {
                " NOT NULL"
            };
            let generated = t
                .keys
                .generated
                .iter()
                .find(|g| g.name == c.name)
                .map(|g| format!(" GENERATED ALWAYS AS ({}) STORED", g.expression))
                .unwrap_or_default();
            format!("{} {ty}{generated}{not_null}", quote_ident(&c.name))
        })
        .collect();
    if !t.keys.primary.is_empty() {
        parts.push(format!("PRIMARY KEY ({})", list(&t.keys.primary)));
    }
    for u in &t.keys.unique {
        parts.push(format!("UNIQUE ({})", list(u)));
    }
    format!(
        "CREATE TABLE {} ({})",
        quote_table(&t.table),
        parts.join(", ")
    )
}

/// Create the missing tables of `tables` (and their schemas), check the existing ones; the
/// notes say what was not carried.
pub async fn create_tables(
    client: &Client,
    tables: &[TargetTable],
    display: &str,
    user: &str,
    db: &str,
) -> Result<Vec<String>> {
    // Only a PostgreSQL source's type texts are looked up: another engine's (`int(10)
    // unsigned`) are not PostgreSQL syntax, and `to_regtype` fails on those.
    let mut wanted: Vec<String> = tables
        .iter()
        .filter(|t| t.source_engine == Engine::Postgres)
        .flat_map(|t| t.columns.iter().map(|c| c.source_type.clone()))
        .collect();
    wanted.sort();
    wanted.dedup();
    let known = known_types(client, &wanted, display).await?;
    let mut notes = Vec::new();
    let mut created_any = false;
    for t in tables {
        if let Some(existing) = target_columns(client, &t.table, display).await? {
            let have: HashSet<&str> = existing.iter().map(|(n, _)| n.as_str()).collect();
            if let Some(c) = t
                .columns
                .iter()
                .find(|c| !have.contains(c.name.as_str()) && !t.keys.is_generated(&c.name))
            {
                return Err(Error::config(format!(
                    "table {} on the target {display} has no column {}, which the source \
                     sends: add it (ALTER TABLE … ADD COLUMN) or drop the target table so \
                     sluice creates it",
                    t.table, c.name
                )));
            }
            continue;
        }
        let same = t.source_engine == Engine::Postgres;
        let types: Vec<String> = t
            .columns
            .iter()
            .map(|c| column_type(&t.table, c, same, &known, &mut notes))
            .collect();
        // The schema may exist without the right to create one: only create it when missing.
        let mut sql = String::new();
        let schema = quote_ident(&t.table.schema);
        let (exists, may) = may_create(client, &t.table.schema, display).await?;
        if !may {
            let grant = if exists {
                format!(
                    "GRANT USAGE, CREATE ON SCHEMA {schema} TO {}",
                    quote_ident(user)
                )
            } else {
                format!(
                    "GRANT CREATE ON DATABASE {} TO {}",
                    quote_ident(db),
                    quote_ident(user)
                )
            };
            return Err(Error::destination(
                sluice_core::Retry::Permanent,
                format!(
                    "user {user} cannot create table {} on the target {display}: run                      {grant}; (as its owner or a superuser), create the table yourself, or                      connect as a user that can",
                    t.table
                ),
            ));
        }
        if !exists {
            sql = format!("CREATE SCHEMA IF NOT EXISTS {schema}; ");
        }
        sql.push_str(&create_sql(t, &types));
        client.batch_execute(&sql).await.map_err(|e| {
            super::failed(
                e,
                display,
                &format!("creating table {} on the target", t.table),
            )
        })?;
        created_any = true;
        for g in t.keys.generated.iter().filter(|g| !carried(t, &g.name)) {
            notes.push(format!(
                "{}.{}: a generated column of the source ({}), which its change stream does \
                 not carry and whose expression is not PostgreSQL's: not created",
                t.table, g.name, g.expression
            ));
        }
        for fk in &t.keys.foreign {
            notes.push(format!(
                "{}: foreign key ({}) → {} ({}) not created (parallel loading and applying \
                 would trip it; the source enforces it)",
                t.table,
                fk.columns.join(", "),
                fk.parent,
                fk.parent_columns.join(", ")
            ));
        }
    }
    if created_any {
        notes.push(
            "created tables carry columns, types, NOT NULL, primary and unique keys and a \
             PostgreSQL source's generated columns only: defaults, check constraints, \
             triggers, other indexes, comments and grants are not carried"
                .into(),
        );
    }
    Ok(notes)
}

/// Whether `schema` exists, and whether the session may create a table in it (or the schema
/// itself when it is missing).
async fn may_create(client: &Client, schema: &str, display: &str) -> Result<(bool, bool)> {
    let row = client
        .query_one(
            "SELECT n.oid IS NOT NULL, CASE WHEN n.oid IS NULL \
               THEN has_database_privilege(current_database(), 'CREATE') \
               ELSE has_schema_privilege(n.oid, 'USAGE') \
                 AND has_schema_privilege(n.oid, 'CREATE') END \
             FROM (SELECT 1) AS one LEFT JOIN pg_namespace n ON n.nspname = $1",
            &[&schema],
        )
        .await
        .map_err(|e| super::failed(e, display, "reading the target's schemas"))?;
    Ok((row.get(0), row.get(1)))
}

/// The statements that carry the source's column change from `before` to `columns` over to
/// `table`: a column the source added and the target lacks is added; one the source dropped
/// (in `before`, not in `columns`) is dropped where the target has it; one the source retyped
/// (its type differs between `before` and `columns`) is retyped where the target's differs.
/// Columns the source never sent — the target's own, generated ones — are left alone, and so
/// is a type the target chose for a column the source did not retype. Compared with the
/// target's current columns, so a barrier applied twice changes nothing the second time.
/// `same_engine` as in [`column_type`].
pub async fn alter_sql(
    client: &Client,
    table: &TableRef,
    before: &[SourceColumn],
    columns: &[ColumnDesc],
    same_engine: bool,
    display: &str,
) -> Result<(String, Vec<String>)> {
    let existing = target_columns(client, table, display)
        .await?
        .ok_or_else(|| {
            Error::config(format!(
                "table {table} does not exist on the target {display}: it was dropped there \
             while replicating; recreate it or start the replication over"
            ))
        })?;
    let known = if same_engine {
        let types: Vec<String> = columns.iter().map(|c| c.source_type.clone()).collect();
        known_types(client, &types, display).await?
    } else {
        HashSet::new()
    };
    let have: HashMap<&str, &str> = existing
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let mut notes = Vec::new();
    let mut actions = Vec::new();
    let was: HashMap<&str, &SourceColumn> = before.iter().map(|c| (c.name.as_str(), c)).collect();
    for c in columns {
        let ty = column_type(table, c, same_engine, &known, &mut notes);
        let retyped = was
            .get(c.name.as_str())
            .is_some_and(|b| b.source_type != c.source_type);
        match have.get(c.name.as_str()) {
            None => actions.push(format!("ADD COLUMN {} {ty}", quote_ident(&c.name))),
            Some(cur) if retyped && !same_type(cur, &ty) => actions.push(format!(
                "ALTER COLUMN {0} TYPE {ty} USING {0}::text::{ty}",
                quote_ident(&c.name)
            )),
            Some(_) => {}
        }
    }
    let wanted: HashSet<&str> = columns.iter().map(|c| c.name.as_str()).collect();
    for (name, _) in &existing {
        if was.contains_key(name.as_str()) && !wanted.contains(name.as_str()) {
            actions.push(format!("DROP COLUMN {}", quote_ident(name)));
        }
    }
    if actions.is_empty() {
        return Ok((String::new(), notes));
    }
    Ok((
        format!("ALTER TABLE {} {};", quote_table(table), actions.join(", ")),
        notes,
    ))
}

/// True when the target's `format_type` text and a wanted type text name the same type (the
/// mapped names are PostgreSQL's short spellings of what `format_type` prints long).
fn same_type(current: &str, wanted: &str) -> bool {
    let long = |t: &str| -> String {
        let (base, arr) = match t.strip_suffix("[]") {
            Some(b) => (b, "[]"),
            None => (t, ""),
        };
        let base = match base {
            "timestamp" => "timestamp without time zone",
            "timestamptz" => "timestamp with time zone",
            "time" => "time without time zone",
            "int" | "int4" => "integer",
            "int8" => "bigint",
            "int2" => "smallint",
            "bool" => "boolean",
            "float8" => "double precision",
            "float4" => "real",
            other => other,
        };
        format!("{base}{arr}")
    };
    long(current) == long(wanted)
}

/// The name a foreign key gets on a target: the source's, else one derived from the child and
/// its columns (PostgreSQL names are at most 63 bytes).
fn foreign_key_name(child: &TableRef, fk: &ForeignKey) -> String {
    let name = if fk.name.is_empty() {
        format!("{}_{}_fkey", child.name, fk.columns.join("_"))
    } else {
        fk.name.clone()
    };
    let mut end = name.len().min(63);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// Create the foreign keys a target must hold to apply cascades itself (see
/// `ApplyTarget::add_foreign_keys`); one that exists by its name is left.
pub async fn add_foreign_keys(
    client: &Client,
    keys: &[(TableRef, ForeignKey)],
    display: &str,
) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    for (child, fk) in keys {
        let name = foreign_key_name(child, fk);
        let exists = client
            .query_opt(
                "SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2",
                &[&quote_table(child), &name],
            )
            .await
            .map_err(|e| super::failed(e, display, &format!("reading the keys of {child}")))?;
        if exists.is_some() {
            continue;
        }
        // NOT VALID: rows already on the target are not checked. A table that joined a
        // running replication is loaded from a later snapshot than its parents' applied rows,
        // so a child may briefly name a parent still to come; the key's actions apply from now.
        let sql = format!(
            "{} NOT VALID",
            fk.add_sql(child, &name, quote_table, quote_ident)
        );
        client.batch_execute(&sql).await.map_err(|e| {
            super::failed(
                e,
                display,
                &format!("creating {} on the target", fk.describe()),
            )
        })?;
        notes.push(format!(
            "{child}: {} created on the target, so it applies the cascades the source's log \
             leaves out",
            fk.describe()
        ));
    }
    Ok(notes)
}

/// `TRUNCATE` of `tables` in one statement.
pub fn truncate_sql(tables: &[TableRef]) -> String {
    let list: Vec<String> = tables.iter().map(quote_table).collect();
    format!("TRUNCATE {};", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::TimeUnit;
    use std::sync::Arc;

    #[test]
    fn arrow_types_map_to_postgres() {
        let f = |dt| Field::new("c", dt, true);
        assert_eq!(mapped_type(&f(DataType::UInt64)), "numeric(20,0)");
        assert_eq!(
            mapped_type(&f(DataType::Decimal128(12, 2))),
            "numeric(12,2)"
        );
        assert_eq!(
            mapped_type(&f(DataType::Timestamp(
                TimeUnit::Microsecond,
                Some("UTC".into())
            ))),
            "timestamptz"
        );
        assert_eq!(
            mapped_type(&f(DataType::List(Arc::new(Field::new(
                "item",
                DataType::Int32,
                true
            ))))),
            "integer[]"
        );
        let json = f(DataType::Utf8).with_extension_type(Json::default());
        assert_eq!(mapped_type(&json), "jsonb");
        assert!(same_type("timestamp without time zone", "timestamp"));
        assert!(!same_type("integer", "bigint"));
    }
}
