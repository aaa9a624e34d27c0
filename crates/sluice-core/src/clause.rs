//! The SQL that selects one chunk: FROM and WHERE clauses built once for every engine.
//!
//! An engine describes itself as a small [`Dialect`] — how it quotes identifiers, writes a key
//! bound as a literal of its column's type, compares row values, and addresses pages — and
//! [`from_clause`], [`where_clause`] and [`key_compare`] build the rest. Key bounds come back
//! from the saved plan of a resumed run (`_sluice/run.json`), so every literal goes through the
//! dialect, which validates or quotes it; nothing from a plan is pasted into SQL.

use crate::chunk::ChunkBounds;
use crate::error::{Error, Result};
use crate::table::{ColumnDesc, Dataset, DatasetKind, TableRef};

/// What the clause builder needs to know about an engine's SQL.
pub trait Dialect: Send + Sync {
    /// The engine, for messages (`MySQL/MariaDB`).
    fn engine(&self) -> &'static str;

    /// Quote an identifier (always quoted, so case and special characters survive).
    fn quote_ident(&self, name: &str) -> String;

    /// A relation as a FROM item. `this_table_only` asks for the table's own rows without
    /// those of tables that inherit from it (PostgreSQL's `ONLY`); most engines have no
    /// inheritance and ignore it.
    fn relation(&self, table: &TableRef, this_table_only: bool) -> String {
        let _ = this_table_only;
        if table.schema.is_empty() {
            self.quote_ident(&table.name)
        } else {
            format!(
                "{}.{}",
                self.quote_ident(&table.schema),
                self.quote_ident(&table.name)
            )
        }
    }

    /// `value` (a key bound as text) as an SQL literal of `column`'s type. Fails when the text
    /// is not a value of that type (a plan edited by hand).
    fn key_literal(&self, column: &ColumnDesc, value: &str) -> Result<String>;

    /// True when `(a, b) >= (x, y)` is written as one row comparison (PostgreSQL's btree
    /// serves it); false to spell it out as `a > x OR (a = x AND b >= y)`, which every range
    /// optimizer understands.
    fn row_values(&self) -> bool {
        false
    }

    /// True when a set of keys is best written `(a, b) IN ((x, y), …)`, a list the optimizer
    /// looks rows up in (MySQL and MariaDB: range access on the key, 5x faster than the same
    /// keys as an OR of conjunctions at two thousand keys, measured on MariaDB 10.11 on
    /// 2026-11-29). False (the default) spells every key out.
    fn row_in_list(&self) -> bool {
        false
    }

    /// True when a set of keys is best written `(a, b) IN (VALUES (x, y), …)`, a semi-join:
    /// PostgreSQL expands a list of row constructors into an OR that a bitmap scan checks again
    /// for every row it fetches. Takes precedence over [`Dialect::row_in_list`].
    fn key_set_values(&self) -> bool {
        false
    }

    /// The most key columns one range may have.
    fn max_key_columns(&self) -> usize {
        usize::MAX
    }

    /// The condition selecting pages `[first, end)` of `ds`'s relation (`end = None`: to the
    /// end). The default refuses: the engine has no physical row address.
    fn page_predicate(&self, ds: &Dataset, first: u64, end: Option<u64>) -> Result<String> {
        let _ = (first, end);
        Err(Error::config(format!(
            "{}: a page-range chunk cannot be read from {} (the run state comes from another \
             engine?); use --overwrite to plan again",
            ds.name,
            self.engine()
        )))
    }
}

/// The FROM item that reads `relation` (a leaf partition), or the dataset itself.
pub fn from_clause(d: &dyn Dialect, ds: &Dataset, relation: Option<&TableRef>) -> Result<String> {
    if let Some(rel) = relation {
        return Ok(d.relation(rel, true));
    }
    match (ds.kind, &ds.object, &ds.query) {
        (DatasetKind::Table, Some(t), _) => Ok(d.relation(t, true)),
        (DatasetKind::Partitioned | DatasetKind::View, Some(t), _) => Ok(d.relation(t, false)),
        (DatasetKind::Query, _, Some(sql)) => Ok(format!("({sql}) AS q")),
        _ => Err(Error::internal(format!(
            "dataset {} has nothing to read from",
            ds.name
        ))),
    }
}

/// The descriptions of key columns `columns` of `ds`, in key order.
pub fn key_columns<'a>(ds: &'a Dataset, columns: &[String]) -> Result<Vec<&'a ColumnDesc>> {
    columns
        .iter()
        .map(|c| {
            ds.columns.iter().find(|d| &d.name == c).ok_or_else(|| {
                Error::config(format!(
                    "key column {c:?} is not a column of {} (columns: {}).",
                    ds.name,
                    ds.columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })
        .collect()
}

/// A key comparison: `(columns) >= (values)` or `(columns) < (values)` in the key's
/// lexicographic order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `>=`: the inclusive lower bound of a range.
    AtLeast,
    /// `<`: the exclusive upper bound of a range.
    Below,
}

/// `(columns) >= (values)` or `(columns) < (values)` for `ds`, literals through the dialect.
pub fn key_compare(
    d: &dyn Dialect,
    ds: &Dataset,
    columns: &[String],
    values: &[String],
    bound: Bound,
) -> Result<String> {
    if columns.len() != values.len() {
        return Err(Error::internal(format!(
            "{}: a key bound has {} values for {} columns",
            ds.name,
            values.len(),
            columns.len()
        )));
    }
    if columns.is_empty() {
        return Err(Error::internal("a key bound with no columns"));
    }
    let descs = key_columns(ds, columns)?;
    let parts: Vec<(String, String)> = descs
        .iter()
        .zip(values)
        .map(|(c, v)| {
            let lit = d
                .key_literal(c, v)
                .map_err(|e| e.context(format!("{} key column {:?}", ds.name, c.name)))?;
            Ok((d.quote_ident(&c.name), lit))
        })
        .collect::<Result<_>>()?;
    let (last_op, strict) = match bound {
        Bound::AtLeast => (">=", ">"),
        Bound::Below => ("<", "<"),
    };
    if d.row_values() {
        let (cols, lits): (Vec<String>, Vec<String>) = parts.into_iter().unzip();
        return Ok(format!(
            "({}) {last_op} ({})",
            cols.join(", "),
            lits.join(", ")
        ));
    }
    let mut alternatives = Vec::new();
    for i in 0..parts.len() {
        let mut conj: Vec<String> = parts[..i]
            .iter()
            .map(|(c, v)| format!("{c} = {v}"))
            .collect();
        let op = if i + 1 == parts.len() {
            last_op
        } else {
            strict
        };
        conj.push(format!("{} {op} {}", parts[i].0, parts[i].1));
        alternatives.push(conj.join(" AND "));
    }
    Ok(if alternatives.len() == 1 {
        alternatives.remove(0)
    } else {
        format!("(({}))", alternatives.join(") OR ("))
    })
}

/// `(columns) IN ((k1), (k2), …)`: exactly the rows with these keys; spelled as equalities
/// joined by OR where the engine has no row values. An empty set selects nothing.
pub fn key_set(
    d: &dyn Dialect,
    ds: &Dataset,
    columns: &[String],
    keys: &[Vec<String>],
) -> Result<String> {
    let descs = key_columns(ds, columns)?;
    if descs.is_empty() {
        return Err(Error::internal("a key set with no columns"));
    }
    if keys.is_empty() {
        return Ok("1 = 0".into());
    }
    let names: Vec<String> = descs.iter().map(|c| d.quote_ident(&c.name)).collect();
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        if key.len() != descs.len() {
            return Err(Error::internal(format!(
                "{}: a key has {} values for {} columns",
                ds.name,
                key.len(),
                descs.len()
            )));
        }
        let lits = descs
            .iter()
            .zip(key)
            .map(|(c, v)| d.key_literal(c, v))
            .collect::<Result<Vec<_>>>()?;
        rows.push(lits);
    }
    Ok(if names.len() == 1 {
        let lits: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
        format!("{} IN ({})", names[0], lits.join(", "))
    } else if d.key_set_values() {
        // A list of VALUES, not of row constructors: PostgreSQL turns `(a, b) IN ((…), (…))`
        // into an OR of every pair, which a bitmap scan then checks again for each row it
        // fetches (two thousand keys: 2,000 × 2,000 comparisons, 0.2–1 s a chunk measured on
        // 2026-11-29); `IN (VALUES …)` is a semi-join on the key's index.
        let tuples: Vec<String> = rows.iter().map(|r| format!("({})", r.join(", "))).collect();
        format!("({}) IN (VALUES {})", names.join(", "), tuples.join(", "))
    } else if d.row_in_list() {
        let tuples: Vec<String> = rows.iter().map(|r| format!("({})", r.join(", "))).collect();
        format!("({}) IN ({})", names.join(", "), tuples.join(", "))
    } else {
        let alts: Vec<String> = rows
            .iter()
            .map(|r| {
                let eqs: Vec<String> = names
                    .iter()
                    .zip(r)
                    .map(|(n, v)| format!("{n} = {v}"))
                    .collect();
                format!("({})", eqs.join(" AND "))
            })
            .collect();
        format!("({})", alts.join(" OR "))
    })
}

/// `c IS NOT NULL` for each nullable column of `key`: key ranges hold only rows whose key has
/// no NULL (those are a chunk of their own, [`ChunkBounds::KeyNulls`]).
pub fn key_not_null(d: &dyn Dialect, key: &[&ColumnDesc]) -> Vec<String> {
    key.iter()
        .filter(|c| c.field.is_nullable())
        .map(|c| format!("{} IS NOT NULL", d.quote_ident(&c.name)))
        .collect()
}

/// The WHERE clause (with a leading space) that selects `bounds` of `ds` and its rows that meet
/// its row filters; empty for every row.
pub fn where_clause(d: &dyn Dialect, ds: &Dataset, bounds: &ChunkBounds) -> Result<String> {
    let conds: Vec<String> = match bounds {
        ChunkBounds::Whole => Vec::new(),
        ChunkBounds::Pages { first, end } => vec![d.page_predicate(ds, *first, *end)?],
        ChunkBounds::Keys {
            columns,
            lower,
            upper,
        } => {
            if columns.len() > d.max_key_columns() {
                return Err(Error::config(format!(
                    "{}: a saved key range over {} columns cannot be read from {}; re-run \
                     without --resume.",
                    ds.name,
                    columns.len(),
                    d.engine()
                )));
            }
            let mut conds = key_not_null(d, &key_columns(ds, columns)?);
            if let Some(l) = lower {
                conds.push(key_compare(d, ds, columns, l, Bound::AtLeast)?);
            }
            if let Some(u) = upper {
                conds.push(key_compare(d, ds, columns, u, Bound::Below)?);
            }
            conds
        }
        ChunkBounds::KeyNulls { columns } => {
            let any: Vec<String> = columns
                .iter()
                .map(|c| format!("{} IS NULL", d.quote_ident(c)))
                .collect();
            vec![format!("({})", any.join(" OR "))]
        }
        ChunkBounds::KeySet { columns, keys } => vec![key_set(d, ds, columns, keys)?],
    };
    let mut conds = conds;
    for f in &ds.row_filter {
        conds.push(format!("({})", f.sql(d, ds)?));
    }
    Ok(if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    })
}

/// `SELECT <columns> FROM <relation><where>` for one chunk, each column through `select`
/// (which applies the column's read cast and keeps its name).
pub fn select_chunk(
    d: &dyn Dialect,
    ds: &Dataset,
    relation: Option<&TableRef>,
    bounds: &ChunkBounds,
    select: impl Fn(&ColumnDesc) -> String,
) -> Result<String> {
    let cols: Vec<String> = ds.columns.iter().map(select).collect();
    Ok(format!(
        "SELECT {} FROM {}{}",
        cols.join(", "),
        from_clause(d, ds, relation)?,
        where_clause(d, ds, bounds)?
    ))
}

/// `sql` as a log line shows it: a converged export's key-set chunks list up to 2,000 keys,
/// which would bury `-v` output; past 600 characters the rest is counted, not shown.
pub fn for_log(sql: &str) -> std::borrow::Cow<'_, str> {
    match sql.char_indices().nth(LOGGED_SQL) {
        Some((cut, _)) => format!("{}… ({} more characters)", &sql[..cut], sql.len() - cut).into(),
        None => sql.into(),
    }
}

/// Characters of a chunk's SQL a log line shows (see [`for_log`]).
const LOGGED_SQL: usize = 600;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::field;
    use crate::table::SizeEstimate;
    use arrow_schema::DataType;

    struct Spelled;
    impl Dialect for Spelled {
        fn engine(&self) -> &'static str {
            "Spelled"
        }
        fn quote_ident(&self, name: &str) -> String {
            crate::ident::enclose(name, '`')
        }
        fn key_literal(&self, _: &ColumnDesc, value: &str) -> Result<String> {
            value
                .parse::<i64>()
                .map(|v| v.to_string())
                .map_err(|_| Error::config(format!("{value:?} is not an integer")))
        }
    }

    /// Spelled, but with key sets as lists of rows (MySQL's way).
    struct Listed;
    impl Dialect for Listed {
        fn engine(&self) -> &'static str {
            "Listed"
        }
        fn quote_ident(&self, name: &str) -> String {
            Spelled.quote_ident(name)
        }
        fn key_literal(&self, c: &ColumnDesc, value: &str) -> Result<String> {
            Spelled.key_literal(c, value)
        }
        fn row_in_list(&self) -> bool {
            true
        }
    }

    struct Rows;
    impl Dialect for Rows {
        fn engine(&self) -> &'static str {
            "Rows"
        }
        fn quote_ident(&self, name: &str) -> String {
            crate::ident::enclose(name, '"')
        }
        fn key_literal(&self, c: &ColumnDesc, value: &str) -> Result<String> {
            Ok(format!(
                "{}::{}",
                crate::ident::enclose(value, '\''),
                c.source_type
            ))
        }
        fn row_values(&self) -> bool {
            true
        }
        fn key_set_values(&self) -> bool {
            true
        }
        fn max_key_columns(&self) -> usize {
            2
        }
    }

    fn col(name: &str, nullable: bool) -> ColumnDesc {
        ColumnDesc {
            name: name.into(),
            source_type: "int8".into(),
            field: field(name, DataType::Int64).with_nullable(nullable),
            cast: None,
            as_text_fallback: false,
        }
    }

    fn ds() -> Dataset {
        let t = TableRef {
            schema: "s".into(),
            name: "t".into(),
        };
        Dataset {
            name: "s.t".into(),
            kind: DatasetKind::Table,
            object: Some(t),
            relations: Vec::new(),
            query: None,
            columns: vec![col("a", false), col("b", true)],
            primary_key: Vec::new(),
            estimate: SizeEstimate::default(),
            outside_snapshot: Vec::new(),
            row_security_filtered: false,
            columns_picked: false,
            row_filter: Vec::new(),
        }
    }

    fn keys(lower: Option<&[&str]>, upper: Option<&[&str]>) -> ChunkBounds {
        let v = |x: Option<&[&str]>| x.map(|x| x.iter().map(|s| s.to_string()).collect());
        ChunkBounds::Keys {
            columns: vec!["a".into(), "b".into()],
            lower: v(lower),
            upper: v(upper),
        }
    }

    #[test]
    fn long_sql_is_cut_for_the_log() {
        assert_eq!(for_log("SELECT 1"), "SELECT 1");
        let long = format!("SELECT * FROM t WHERE k IN ({})", "'é', ".repeat(500));
        let shown = for_log(&long);
        assert!(shown.chars().count() < 700, "{shown}");
        assert!(shown.ends_with(&format!(
            "… ({} more characters)",
            long.len() - shown.find('…').unwrap()
        )));
    }

    #[test]
    fn composite_bounds_spelled_out_or_as_row_values() {
        let b = keys(Some(&["1", "2"]), Some(&["3", "4"]));
        assert_eq!(
            where_clause(&Spelled, &ds(), &b).unwrap(),
            " WHERE `b` IS NOT NULL AND ((`a` > 1) OR (`a` = 1 AND `b` >= 2)) \
             AND ((`a` < 3) OR (`a` = 3 AND `b` < 4))"
        );
        assert_eq!(
            where_clause(&Rows, &ds(), &b).unwrap(),
            " WHERE \"b\" IS NOT NULL AND (\"a\", \"b\") >= ('1'::int8, '2'::int8) \
             AND (\"a\", \"b\") < ('3'::int8, '4'::int8)"
        );
        assert_eq!(
            key_compare(&Spelled, &ds(), &["a".into()], &["5".into()], Bound::Below).unwrap(),
            "`a` < 5"
        );
    }

    #[test]
    fn key_sets_spelled_out_or_as_row_values_and_checked() {
        let set = |columns: &[&str], keys: &[&[&str]]| ChunkBounds::KeySet {
            columns: columns.iter().map(|c| c.to_string()).collect(),
            keys: keys
                .iter()
                .map(|k| k.iter().map(|v| v.to_string()).collect())
                .collect(),
        };
        let two = set(&["a", "b"], &[&["1", "2"], &["3", "4"]]);
        assert_eq!(
            where_clause(&Spelled, &ds(), &two).unwrap(),
            " WHERE ((`a` = 1 AND `b` = 2) OR (`a` = 3 AND `b` = 4))"
        );
        assert_eq!(
            where_clause(&Rows, &ds(), &two).unwrap(),
            " WHERE (\"a\", \"b\") IN (VALUES ('1'::int8, '2'::int8), ('3'::int8, '4'::int8))"
        );
        assert_eq!(
            where_clause(&Listed, &ds(), &two).unwrap(),
            " WHERE (`a`, `b`) IN ((1, 2), (3, 4))"
        );
        assert_eq!(
            where_clause(&Rows, &ds(), &set(&["a"], &[&["7"], &["8"]])).unwrap(),
            " WHERE \"a\" IN ('7'::int8, '8'::int8)"
        );
        assert_eq!(
            where_clause(&Spelled, &ds(), &set(&["a"], &[])).unwrap(),
            " WHERE 1 = 0"
        );
        // Every value goes through the dialect, which refuses what is not a value.
        let bad = set(&["a"], &[&["1) OR (1=1"]]);
        assert!(where_clause(&Spelled, &ds(), &bad).is_err());
        assert!(where_clause(&Spelled, &ds(), &set(&["a", "b"], &[&["1"]])).is_err());
        assert!(where_clause(&Spelled, &ds(), &set(&["zz"], &[&["1"]])).is_err());
    }

    #[test]
    fn bad_bounds_and_foreign_plans_are_refused() {
        let e = where_clause(&Spelled, &ds(), &keys(Some(&["1 OR 1=1", "2"]), None)).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Config);
        assert!(e.message().contains("s.t key column \"a\""), "{e}");
        let e = where_clause(
            &Spelled,
            &ds(),
            &ChunkBounds::Pages {
                first: 0,
                end: None,
            },
        )
        .unwrap_err();
        assert!(e.message().contains("cannot be read from Spelled"), "{e}");
        let mut three = ds();
        three.columns.push(col("c", false));
        let b = ChunkBounds::Keys {
            columns: vec!["a".into(), "b".into(), "c".into()],
            lower: None,
            upper: None,
        };
        assert!(where_clause(&Rows, &three, &b).is_err());
        assert_eq!(
            where_clause(
                &Rows,
                &ds(),
                &ChunkBounds::KeyNulls {
                    columns: vec!["b".into()]
                }
            )
            .unwrap(),
            " WHERE (\"b\" IS NULL)"
        );
    }

    #[test]
    fn from_clauses() {
        let mut d = ds();
        assert_eq!(from_clause(&Spelled, &d, None).unwrap(), "`s`.`t`");
        d.kind = DatasetKind::Query;
        d.query = Some("SELECT 1".into());
        d.object = None;
        assert_eq!(from_clause(&Spelled, &d, None).unwrap(), "(SELECT 1) AS q");
    }
}
