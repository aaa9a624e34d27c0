//! Describing a resolved table, view or query: its columns and their types, its keys (the
//! split candidates), MariaDB's JSON columns (stored as text, told apart by their check
//! constraint), and the check that a role may select every column.

use super::*;

struct RawColumn {
    name: String,
    ty: MyType,
    not_null: bool,
}

fn columns_of(raw: Vec<RawColumn>) -> Vec<ColumnDesc> {
    raw.into_iter()
        .map(|c| map_type(&c.ty).column(c.name, c.ty.column_type, !c.not_null))
        .collect()
}

/// Describe a resolved table or view.
pub async fn describe(
    conn: &mut Conn,
    obj: &Resolved,
    server: &ServerInfo,
    target: &str,
) -> Result<Described> {
    let e = err(target);
    let t = &obj.table;
    let name = t.dataset_name();
    let rows: Vec<Row> = conn
        .exec(
            "SELECT COLUMN_NAME, LOWER(DATA_TYPE), COLUMN_TYPE, IS_NULLABLE, \
                    NUMERIC_PRECISION, NUMERIC_SCALE, CHARACTER_SET_NAME \
             FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
             ORDER BY ORDINAL_POSITION",
            (t.schema.clone(), t.name.clone()),
        )
        .await
        .map_err(&e)?;
    if rows.is_empty() {
        return Err(Error::config(format!(
            "{name} has no columns visible to {} in {target}; there is nothing to export (or \
             the user lacks SELECT on it).",
            server.user
        )));
    }
    let json_cols = if server.flavor == Flavor::Mariadb {
        mariadb_json_columns(conn, t, target).await?
    } else {
        HashSet::new()
    };
    let raw: Vec<RawColumn> = rows
        .iter()
        .map(|r| {
            let col = text(r, 0);
            let data_type = text(r, 1);
            let column_type = text(r, 2);
            // bit(n) reports its width as NUMERIC_PRECISION.
            RawColumn {
                ty: MyType {
                    precision: number(r, 4) as u32,
                    scale: number(r, 5) as u32,
                    binary_charset: text(r, 6) == "binary",
                    json_check: json_cols.contains(&col),
                    data_type,
                    column_type,
                },
                not_null: text(r, 3) == "NO",
                name: col,
            }
        })
        .collect();
    let not_null: HashSet<String> = raw
        .iter()
        .filter(|c| c.not_null)
        .map(|c| c.name.clone())
        .collect();
    let columns = columns_of(raw);

    let (primary_key, split_key) = if obj.view {
        (Vec::new(), Vec::new())
    } else {
        keys(conn, t, &not_null, target).await?
    };

    let size: Option<Row> = conn
        .exec_first(
            "SELECT t.TABLE_ROWS, t.DATA_LENGTH, t.ENGINE, e.TRANSACTIONS \
             FROM information_schema.TABLES t \
             LEFT JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE \
             WHERE t.TABLE_SCHEMA = ? AND t.TABLE_NAME = ?",
            (t.schema.clone(), t.name.clone()),
        )
        .await
        .map_err(&e)?;
    let (rows_est, bytes) = size
        .as_ref()
        .map(|r| (number(r, 0), number(r, 1)))
        .unwrap_or((0, 0));
    // Only an engine the server itself says has no transactions is flagged (a view has none).
    let non_transactional = size
        .as_ref()
        .filter(|r| !obj.view && text(r, 3).eq_ignore_ascii_case("NO"))
        .map(|r| text(r, 2));
    let kind = if obj.view {
        DatasetKind::View
    } else {
        DatasetKind::Table
    };
    let relations = if obj.view {
        Vec::new()
    } else {
        vec![Relation {
            table: t.clone(),
            pages: bytes / 16_384,
            page_bytes: 16_384,
            rows: rows_est,
            bytes,
        }]
    };
    Ok(Described {
        dataset: Dataset {
            name,
            kind,
            object: Some(t.clone()),
            relations,
            query: None,
            columns,
            primary_key,
            estimate: SizeEstimate {
                rows: rows_est,
                bytes,
            },
            outside_snapshot: Vec::new(),
            row_security_filtered: false,
            columns_picked: false,
            row_filter: Vec::new(),
        },
        split_key,
        non_transactional,
    })
}

/// MariaDB's `JSON` is `LONGTEXT` with an automatic `CHECK (json_valid(col))` named after the
/// column; find those columns. (MySQL has a real JSON type and reports it in `DATA_TYPE`.)
async fn mariadb_json_columns(
    conn: &mut Conn,
    t: &TableRef,
    target: &str,
) -> Result<HashSet<String>> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT CONSTRAINT_NAME, CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS \
             WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?",
            (t.schema.clone(), t.name.clone()),
        )
        .await
        .map_err(err(target))?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let (name, clause) = (text(r, 0), text(r, 1));
            let expected = format!("json_valid({})", crate::sql::quote_ident(&name));
            (clause.eq_ignore_ascii_case(&expected)).then_some(name)
        })
        .collect())
}

/// The primary key, and the key to split on: the primary key, else the unique index with the
/// fewest columns whose columns are all NOT NULL and indexed whole (no prefix).
async fn keys(
    conn: &mut Conn,
    t: &TableRef,
    not_null: &HashSet<String>,
    target: &str,
) -> Result<(Vec<String>, Vec<String>)> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT INDEX_NAME, COLUMN_NAME, SUB_PART FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND NON_UNIQUE = 0 \
             ORDER BY INDEX_NAME, SEQ_IN_INDEX",
            (t.schema.clone(), t.name.clone()),
        )
        .await
        .map_err(err(target))?;
    let mut indexes: Vec<(String, Vec<String>, bool)> = Vec::new();
    for r in &rows {
        let (index, column) = (text(r, 0), text(r, 1));
        let whole = matches!(r.as_ref(2), Some(Value::NULL) | None) && !column.is_empty();
        match indexes.last_mut() {
            Some((name, cols, ok)) if *name == index => {
                cols.push(column);
                *ok &= whole;
            }
            _ => indexes.push((index, vec![column], whole)),
        }
    }
    let primary = indexes
        .iter()
        .find(|(n, _, _)| n == "PRIMARY")
        .map(|(_, c, _)| c.clone())
        .unwrap_or_default();
    if !primary.is_empty() {
        return Ok((primary.clone(), primary));
    }
    let unique = indexes
        .into_iter()
        .filter(|(_, cols, whole)| *whole && cols.iter().all(|c| not_null.contains(c)))
        .min_by_key(|(name, cols, _)| (cols.len(), name.clone()))
        .map(|(_, c, _)| c)
        .unwrap_or_default();
    Ok((Vec::new(), unique))
}

/// Describe a user query as a dataset, from the column metadata of its prepared statement.
pub async fn describe_query(conn: &mut Conn, q: &NamedQuery, target: &str) -> Result<Dataset> {
    let stmt = conn.prep(q.sql.as_str()).await.map_err(|e| {
        classify(e, Phase::Catalog, target)
            .context(format!("query {:?} could not be prepared", q.name))
    })?;
    let mut seen = HashSet::new();
    let mut raw = Vec::new();
    for c in stmt.columns().iter() {
        let name = c.name_str().into_owned();
        if !seen.insert(name.clone()) {
            return Err(Error::config(format!(
                "query {:?} returns two columns named {name:?}; give them distinct aliases (AS …).",
                q.name
            )));
        }
        raw.push(RawColumn {
            ty: crate::types::from_column(c),
            not_null: false,
            name,
        });
    }
    let _ = conn.close(stmt).await;
    if raw.is_empty() {
        return Err(Error::config(format!(
            "query {:?} returns no columns.",
            q.name
        )));
    }
    let estimate = SizeEstimate::default();
    Ok(Dataset::query(&q.name, &q.sql, columns_of(raw), estimate))
}

/// Check the user may read every column of `t` now, so a missing privilege fails before the
/// snapshot with a clear message rather than mid-run.
pub async fn check_select(
    conn: &mut Conn,
    t: &TableRef,
    server: &ServerInfo,
    target: &str,
) -> Result<()> {
    let sql = format!("SELECT * FROM {} LIMIT 0", quote_table(t));
    match conn.query_drop(sql).await {
        Ok(()) => Ok(()),
        Err(e) if matches!(crate::error::server_code(&e), Some(1142 | 1143)) => {
            Err(Error::source_permanent(format!(
                "user {} has no SELECT privilege on {t} in {target}. Grant it (GRANT SELECT ON \
                 {} TO …), or connect as a user that has it.",
                server.user,
                quote_table(t)
            )))
        }
        Err(e) => Err(classify(e, Phase::Catalog, target)),
    }
}
