//! Target tables: the column types to create, `CREATE TABLE`, and the column barrier's
//! `ALTER TABLE`.
//!
//! Same engine: a column is created with the source catalog's own type text
//! (`ColumnDesc::source_type`, e.g. `decimal(12,2) unsigned`, `enum('a','b')`). Another engine:
//! the type follows from the Arrow type the export reads (the table in
//! `docs/replicate/types.md`, MySQL/MariaDB section). Tables are InnoDB in utf8mb4; date and
//! time columns are created nullable whatever the source says, since the export reads zero
//! dates as NULL.
//!
//! Length: about 550 lines with its unit tests: the type table, table creation, column
//! barriers and foreign keys all render DDL from the same column and key descriptions.

use super::render::Kind;
use crate::sql::{quote_ident, quote_table};
use arrow_schema::{DataType, TimeUnit};
use sluice_core::apply::{ForeignKey, SourceColumn, TargetTable};
use sluice_core::table::{ColumnDesc, TableRef};

/// InnoDB's limit on one index's key, in bytes (DYNAMIC and COMPRESSED row formats).
const KEY_BYTES: usize = 3072;

/// A column's type on the target, and a note when it is not the source's own type.
pub struct Typed {
    /// Type text for `CREATE TABLE` / `ALTER TABLE`, without nullability.
    pub sql: String,
    /// What changed, for the run's notes.
    pub note: Option<String>,
}

fn is_text_type(t: &str) -> bool {
    let t = t.to_ascii_lowercase();
    t.starts_with("char")
        || t.starts_with("varchar")
        || t.ends_with("text")
        || t.starts_with("enum")
        || t.starts_with("set")
}

/// A character or byte string type written without the length MySQL requires.
fn lacks_length(t: &str) -> bool {
    let t = t.trim().to_ascii_lowercase();
    ["varchar", "varbinary", "char", "binary"].contains(&t.as_str())
}

fn is_lob(t: &str) -> bool {
    let t = t.to_ascii_lowercase();
    t.ends_with("text") || t.ends_with("blob") || t == "json"
}

/// The declared length in a source type such as `character varying(40)` or `varchar(40)`.
fn declared_length(source_type: &str) -> Option<usize> {
    let t = source_type.to_ascii_lowercase();
    if !(t.starts_with("character") || t.starts_with("varchar") || t.starts_with("bpchar")) {
        return None;
    }
    let open = t.find('(')?;
    let close = t[open..].find(')')? + open;
    t[open + 1..close].trim().parse().ok()
}

/// The target type of `c`. `key_chars`: the longest text a key column may hold (its share of
/// InnoDB's key limit), `None` for a column in no key.
pub fn column_type(c: &ColumnDesc, same_engine: bool, key_chars: Option<usize>) -> Typed {
    let kind = Kind::of(&c.field);
    if same_engine {
        let mut sql = c.source_type.clone();
        // MariaDB's JSON is longtext with a check; `json` recreates the check.
        if kind == Kind::Json && sql.eq_ignore_ascii_case("longtext") {
            sql = "json".into();
        }
        // A text type in the binary character set holds bytes (its type text does not say so).
        if matches!(c.field.data_type(), DataType::Binary) && is_text_type(&sql) {
            sql.push_str(" CHARACTER SET binary");
        }
        return Typed { sql, note: None };
    }
    let mapped = |sql: &str, why: &str| Typed {
        sql: sql.to_string(),
        note: Some(format!(
            "column {} ({}) is created as {sql}: {why}",
            quote_ident(&c.name),
            c.source_type
        )),
    };
    let plain = |sql: String| Typed { sql, note: None };
    let text = |bytes_type: bool| -> Typed {
        let (var, lob) = if bytes_type {
            ("varbinary", "longblob")
        } else {
            ("varchar", "longtext")
        };
        match (declared_length(&c.source_type), key_chars) {
            (Some(n), Some(k)) if n <= k => plain(format!("{var}({n})")),
            (_, Some(k)) => mapped(
                &format!("{var}({k})"),
                "a key column must fit InnoDB's 3072-byte key; longer values fail to load",
            ),
            (Some(n), None) if n <= 255 => plain(format!("{var}({n})")),
            _ => plain(lob.to_string()),
        }
    };
    match (kind, c.field.data_type()) {
        (Kind::Json, _) => plain("json".into()),
        (Kind::Wkb, _) => plain("geometry".into()),
        (Kind::Uuid, _) => mapped("char(36)", "MySQL has no uuid type; the text form is kept"),
        (Kind::Interval, _) => mapped(
            "varchar(64)",
            "MySQL has no interval type; ISO 8601 text (P1M2DT3.5S) is kept",
        ),
        (_, DataType::Boolean) => plain("tinyint(1)".into()),
        (_, DataType::Int8) => plain("tinyint".into()),
        (_, DataType::Int16) => plain("smallint".into()),
        (_, DataType::Int32) => plain("int".into()),
        (_, DataType::Int64) => plain("bigint".into()),
        (_, DataType::UInt8) => plain("tinyint unsigned".into()),
        (_, DataType::UInt16) => plain("smallint unsigned".into()),
        (_, DataType::UInt32) => plain("int unsigned".into()),
        (_, DataType::UInt64) => plain("bigint unsigned".into()),
        (_, DataType::Float32) => plain("float".into()),
        (_, DataType::Float64) => plain("double".into()),
        (_, DataType::Decimal128(p, s) | DataType::Decimal256(p, s))
            if *p <= 65 && *s >= 0 && *s <= 30 =>
        {
            plain(format!("decimal({p},{s})"))
        }
        (_, DataType::Decimal128(..) | DataType::Decimal256(..)) => mapped(
            "longtext",
            "its precision or scale exceeds MySQL's decimal(65,30); the exact text is kept",
        ),
        (_, DataType::Date32 | DataType::Date64) => plain("date".into()),
        (_, DataType::Timestamp(_, None)) => plain("datetime(6)".into()),
        (_, DataType::Timestamp(_, Some(_))) => mapped(
            "datetime(6)",
            "MySQL's timestamp stops in 2038; the value is kept in UTC",
        ),
        (_, DataType::Time32(_) | DataType::Time64(_)) => plain("time(6)".into()),
        (_, DataType::Duration(TimeUnit::Second)) => plain("time".into()),
        (_, DataType::Duration(_)) => plain("time(6)".into()),
        (_, DataType::FixedSizeBinary(n)) => plain(format!("binary({n})")),
        (_, DataType::Binary | DataType::LargeBinary | DataType::BinaryView) => text(true),
        (_, DataType::List(_) | DataType::LargeList(_)) => mapped(
            "json",
            "MySQL has no arrays; the array is kept as a JSON array",
        ),
        _ => text(false),
    }
}

/// `CREATE TABLE IF NOT EXISTS` for `t`, and the notes of what it does not carry.
pub fn create_table(t: &TargetTable, same_engine: bool) -> (String, Vec<String>) {
    let mut notes = Vec::new();
    let name = quote_table(&t.table);
    // Each key's text columns share InnoDB's key limit (utf8mb4: 4 bytes a character).
    let mut key_chars: std::collections::HashMap<&str, usize> = Default::default();
    let keys: Vec<&Vec<String>> = std::iter::once(&t.keys.primary)
        .filter(|k| !k.is_empty())
        .chain(t.keys.unique.iter())
        .collect();
    for k in &keys {
        let share = KEY_BYTES / 4 / k.len().max(1);
        for col in k.iter() {
            let e = key_chars.entry(col.as_str()).or_insert(share);
            *e = (*e).min(share);
        }
    }
    let mut defs = Vec::new();
    let mut lobs = std::collections::HashSet::new();
    for c in &t.columns {
        let generated = t.keys.generated.iter().find(|g| g.name == c.name);
        if generated.is_some() && !same_engine {
            notes.push(format!(
                "{}.{}: a generated column of the source, which its change stream does not \
                 carry and whose expression is not MySQL's: not created",
                t.table, c.name
            ));
            continue;
        }
        let typed = column_type(c, same_engine, key_chars.get(c.name.as_str()).copied());
        if let Some(n) = typed.note {
            notes.push(format!("{}: {n}", t.table));
        }
        if is_lob(&typed.sql) {
            lobs.insert(c.name.as_str());
        }
        let null = if c.field.is_nullable() {
            "NULL"
        } else {
            "NOT NULL"
        };
        let generated = generated
            .map(|g| {
                let kind = if g.stored { "STORED" } else { "VIRTUAL" };
                format!(" GENERATED ALWAYS AS ({}) {kind}", g.expression)
            })
            .unwrap_or_default();
        // A generated column takes no NOT NULL in MariaDB; its expression decides.
        let null = if generated.is_empty() { null } else { "" };
        defs.push(format!(
            "{} {}{generated} {null}",
            quote_ident(&c.name),
            typed.sql
        ));
    }
    // A text or blob column is indexed on a prefix; the key then compares prefixes only.
    let key_cols = |k: &[String]| -> String {
        let share = KEY_BYTES / 4 / k.len().max(1);
        k.iter()
            .map(|c| {
                if lobs.contains(c.as_str()) {
                    format!("{}({share})", quote_ident(c))
                } else {
                    quote_ident(c)
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    for k in &keys {
        if k.iter().any(|c| lobs.contains(c.as_str())) {
            notes.push(format!(
                "{}: the key ({}) is created on a prefix of its text/blob columns: values that \
                 share the prefix collide",
                t.table,
                k.join(", ")
            ));
        }
    }
    if !t.keys.primary.is_empty() {
        defs.push(format!("PRIMARY KEY ({})", key_cols(&t.keys.primary)));
    }
    for u in &t.keys.unique {
        defs.push(format!("UNIQUE ({})", key_cols(u)));
    }
    for fk in &t.keys.foreign {
        notes.push(format!(
            "{}: foreign key ({}) → {} is not created (parallel load and apply would trip it)",
            t.table,
            fk.columns.join(", "),
            fk.parent
        ));
    }
    notes.push(format!(
        "{}: column defaults, checks and triggers are not carried",
        t.table
    ));
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS {name} ({}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        defs.join(", ")
    );
    (sql, notes)
}

/// One target column as `information_schema.COLUMNS` describes it.
pub struct Existing {
    /// Column name.
    pub name: String,
    /// `COLUMN_TYPE`.
    pub column_type: String,
    /// True when nullable.
    pub nullable: bool,
}

fn normalise(t: &str) -> String {
    let t = t.to_ascii_lowercase().replace(' ', "");
    // MySQL 8 drops the integer display widths that MariaDB prints (but keeps `tinyint(1)`,
    // the boolean).
    for r in ["tinyint", "smallint", "mediumint", "int", "bigint"] {
        if let Some(rest) = t.strip_prefix(r)
            && let Some(after) = rest.strip_prefix('(')
            && let Some(close) = after.find(')')
            && !(r == "tinyint" && &after[..close] == "1")
        {
            return format!("{r}{}", &after[close + 1..]);
        }
    }
    t
}

/// The type family of a type text: text and byte strings of any length are one family each.
fn family(t: &str) -> String {
    let t = normalise(t);
    let base = t.split(['(', ' ']).next().unwrap_or_default();
    match base {
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => "text".into(),
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => "bytes".into(),
        _ => t,
    }
}

/// The `ALTER TABLE` that gives `table` the columns `wanted`, from `existing`; `None` when
/// nothing differs (so applying the barrier twice changes nothing the second time).
///
/// Columns a change stream describes (a binary log table map, a PostgreSQL relation) carry no
/// nullability and, without full row metadata, not every length: an existing column is
/// retyped only when its type family changes (`int` to `bigint`, text to a number), keeping
/// its nullability, and a new column whose type lacks the length MySQL needs (`varchar`) is
/// created as the mapped type.
pub fn alter_columns(
    table: &TableRef,
    existing: &[Existing],
    before: &[SourceColumn],
    wanted: &[ColumnDesc],
    same_engine: bool,
) -> Option<String> {
    let was = |name: &str| before.iter().find(|b| b.name.eq_ignore_ascii_case(name));
    let mut parts = Vec::new();
    let mut prev: Option<&str> = None;
    for c in wanted {
        let mut typed = column_type(c, same_engine, None);
        if same_engine && lacks_length(&typed.sql) {
            typed = column_type(c, false, None);
        }
        let place = match prev {
            Some(p) => format!("AFTER {}", quote_ident(p)),
            None => "FIRST".to_string(),
        };
        match existing
            .iter()
            .find(|e| e.name.eq_ignore_ascii_case(&c.name))
        {
            None => parts.push(format!(
                "ADD COLUMN {} {} NULL {place}",
                quote_ident(&c.name),
                typed.sql
            )),
            Some(e)
                if !lacks_length(&c.source_type)
                    && was(&c.name).is_some_and(|b| b.source_type != c.source_type)
                    && family(&e.column_type) != family(&typed.sql) =>
            {
                // MariaDB's json is longtext: the same column, not a retype.
                let json_alias = typed.sql == "json" && e.column_type == "longtext";
                if !json_alias {
                    let null = if e.nullable { "NULL" } else { "NOT NULL" };
                    parts.push(format!(
                        "MODIFY COLUMN {} {} {null}",
                        quote_ident(&c.name),
                        typed.sql
                    ));
                }
            }
            Some(_) => {}
        }
        prev = Some(&c.name);
    }
    // Only what the source dropped: a column the source never sent (the target's own, a
    // generated one) stays.
    for e in existing {
        if was(&e.name).is_some() && !wanted.iter().any(|c| c.name.eq_ignore_ascii_case(&e.name)) {
            parts.push(format!("DROP COLUMN {}", quote_ident(&e.name)));
        }
    }
    (!parts.is_empty()).then(|| format!("ALTER TABLE {} {}", quote_table(table), parts.join(", ")))
}

/// Create the foreign keys a target must hold to apply cascades itself (see
/// `ApplyTarget::add_foreign_keys`); one that exists by its name is left.
pub async fn add_foreign_keys(
    conn: &mut mysql_async::Conn,
    keys: &[(TableRef, ForeignKey)],
    display: &str,
) -> sluice_core::Result<Vec<String>> {
    use mysql_async::prelude::Queryable;
    let mut notes = Vec::new();
    for (child, fk) in keys {
        // MySQL identifiers are at most 64 characters.
        let name: String = if fk.name.is_empty() {
            format!("{}_{}_fk", child.name, fk.columns.join("_"))
        } else {
            fk.name.clone()
        }
        .chars()
        .take(64)
        .collect();
        let exists: Option<u8> = conn
            .exec_first(
                "SELECT 1 FROM information_schema.TABLE_CONSTRAINTS WHERE TABLE_SCHEMA = ? \
                 AND TABLE_NAME = ? AND CONSTRAINT_NAME = ? AND CONSTRAINT_TYPE = 'FOREIGN KEY'",
                (child.schema.as_str(), child.name.as_str(), name.as_str()),
            )
            .await
            .map_err(|e| super::fail(e, display, &format!("reading the keys of {child} on")))?;
        if exists.is_some() {
            continue;
        }
        // Existing rows are not checked (foreign_key_checks off for this statement only): a
        // table that joined a running replication is loaded from a later snapshot than its
        // parents' applied rows, so a child may briefly name a parent still to come.
        let sql = format!(
            "SET SESSION foreign_key_checks = 0; {}; SET SESSION foreign_key_checks = 1",
            fk.add_sql(child, &name, quote_table, quote_ident)
        );
        conn.query_drop(sql)
            .await
            .map_err(|e| super::fail(e, display, &format!("creating {} on", fk.describe())))?;
        notes.push(format!(
            "{child}: {} created on the target, so it applies the cascades the source's log \
             leaves out",
            fk.describe()
        ));
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::apply::{Engine, TableKeys};
    use sluice_core::columns::field;

    fn col(name: &str, source_type: &str, dt: DataType, nullable: bool) -> ColumnDesc {
        ColumnDesc {
            name: name.into(),
            source_type: source_type.into(),
            field: field(name, dt).with_nullable(nullable),
            cast: None,
            as_text_fallback: false,
        }
    }

    fn t() -> TableRef {
        TableRef {
            schema: "shop".into(),
            name: "orders".into(),
        }
    }

    #[test]
    fn creates_with_source_types_or_mapped_ones() {
        let cols = vec![
            col("id", "bigint(20) unsigned", DataType::UInt64, false),
            col("title", "text", DataType::Utf8, true),
        ];
        let table = TargetTable {
            table: t(),
            columns: cols.clone(),
            keys: TableKeys {
                table: t(),
                primary: vec!["id".into()],
                unique: vec![vec!["title".into()]],
                foreign: vec![],
                match_by: vec![],
                generated: vec![],
            },
            source_engine: Engine::Mysql,
        };
        let (sql, notes) = create_table(&table, true);
        assert!(sql.contains("`id` bigint(20) unsigned NOT NULL"), "{sql}");
        assert!(sql.contains("UNIQUE (`title`(768))"), "{sql}");
        assert!(notes.iter().any(|n| n.contains("prefix")), "{notes:?}");
        let pg = vec![
            col("id", "integer", DataType::Int32, false),
            col("code", "character varying(40)", DataType::Utf8, false),
            col("body", "text", DataType::Utf8, true),
        ];
        let table = TargetTable {
            columns: pg,
            keys: TableKeys {
                table: t(),
                primary: vec!["id".into(), "code".into()],
                unique: vec![],
                foreign: vec![],
                match_by: vec![],
                generated: vec![],
            },
            source_engine: Engine::Postgres,
            ..table
        };
        let (sql, _) = create_table(&table, false);
        assert!(sql.contains("`code` varchar(40) NOT NULL"), "{sql}");
        assert!(sql.contains("`body` longtext NULL"), "{sql}");
    }

    #[test]
    fn alter_changes_only_the_difference() {
        let existing = vec![
            Existing {
                name: "id".into(),
                column_type: "int(11)".into(),
                nullable: false,
            },
            Existing {
                name: "old".into(),
                column_type: "text".into(),
                nullable: true,
            },
        ];
        let wanted = vec![
            col("id", "int(11)", DataType::Int32, false),
            col("new", "varchar(5)", DataType::Utf8, true),
        ];
        let before = vec![
            col("id", "int(11)", DataType::Int32, false),
            col("old", "text", DataType::Utf8, true),
        ];
        let before = SourceColumn::of(&before);
        let sql = alter_columns(&t(), &existing, &before, &wanted, true).unwrap();
        assert_eq!(
            sql,
            "ALTER TABLE `shop`.`orders` ADD COLUMN `new` varchar(5) NULL AFTER `id`, \
             DROP COLUMN `old`"
        );
        // A column the source never sent (the target's own) is not dropped.
        let sql = alter_columns(&t(), &existing, &before[..1], &wanted, true).unwrap();
        assert_eq!(
            sql,
            "ALTER TABLE `shop`.`orders` ADD COLUMN `new` varchar(5) NULL AFTER `id`"
        );
        let now = vec![
            Existing {
                name: "id".into(),
                column_type: "int".into(),
                nullable: false,
            },
            Existing {
                name: "new".into(),
                column_type: "varchar(5)".into(),
                nullable: true,
            },
        ];
        assert_eq!(alter_columns(&t(), &now, &before, &wanted, true), None);
        // Another engine: a key's varchar is the same text column as the longtext it maps to.
        let pg = vec![
            col("id", "integer", DataType::Int32, false),
            col("new", "text", DataType::Utf8, true),
        ];
        let keyed = vec![
            Existing {
                name: "id".into(),
                column_type: "int(11)".into(),
                nullable: false,
            },
            Existing {
                name: "new".into(),
                column_type: "varchar(768)".into(),
                nullable: true,
            },
        ];
        assert_eq!(
            alter_columns(&t(), &keyed, &SourceColumn::of(&pg), &pg, false),
            None
        );
    }
}
