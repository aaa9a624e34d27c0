//! Catalog selection: turning what the user selected (`--table`, `--tables`, `--schema`,
//! `--query`) into datasets, the same way on every source.
//!
//! An adapter implements [`Catalog`] — its catalog queries and how it describes a table — and
//! [`discover`] does the rest: names resolved exactly or in another case (the engine's
//! [`Folding`] decides the middle step), the "ambiguous" and "does not exist" errors, pattern and
//! schema matching, duplicates removed, query names checked. What differs between engines is
//! data ([`Naming`]), not code.
//!
//! Matching a typed name part against a catalog name, best first:
//! 1. the same text (a part in double quotes matches only this way);
//! 2. the text as the engine folds unquoted names (PostgreSQL: lower case; Firebird: upper
//!    case; MySQL keeps the case, so it has no such step);
//! 3. the same text in any case.
//!
//! Only candidates of the best rank found are kept, so `orders` finds `orders` even when
//! `ORDERS` exists too; two candidates of the best rank are ambiguous, and the error lists them.

use crate::error::{Error, Result};
use crate::ident::{NamePart, QualifiedName};
use crate::table::{Dataset, NamedQuery, Selection, TableRef};

mod columns;
mod names;
use async_trait::async_trait;
use columns::keep_columns;
pub use names::{TablesNow, table_names};
use std::collections::HashSet;

/// How an engine stores identifiers written without quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Folding {
    /// In lower case (PostgreSQL).
    Lower,
    /// In upper case (Firebird, the SQL standard).
    Upper,
    /// As typed; whether case matters is the server's setting (MySQL's
    /// `lower_case_table_names`), so a name is matched exactly, else in any case.
    Preserve,
}

impl Folding {
    /// `text` as the engine would store it unquoted, or `None` when it keeps the case.
    pub fn fold(self, text: &str) -> Option<String> {
        match self {
            Folding::Lower => Some(text.to_lowercase()),
            Folding::Upper => Some(text.to_uppercase()),
            Folding::Preserve => None,
        }
    }
}

/// What an engine's names look like and how its messages point the user to a fix. Plain data,
/// one constant per adapter.
#[derive(Debug, Clone, Copy)]
pub struct Naming {
    /// The engine, for messages (`Firebird`).
    pub engine: &'static str,
    /// How unquoted names are stored.
    pub folding: Folding,
    /// Whether tables live in schemas (MySQL: databases). Firebird (to 5.0) has none: a
    /// schema-qualified name or `--schema` is refused.
    pub schemas: bool,
    /// Whether `--query` is supported.
    pub queries: bool,
    /// What a `--tables` pattern is matched against, with an example, e.g. `schema.table, e.g.
    /// --tables 'public\.order_.*'`.
    pub pattern_target: &'static str,
    /// How the user lists tables, for "does not exist": e.g. `the spelling and the schema
    /// (psql: \dt *.*)`.
    pub check: &'static str,
    /// How the user lists tables, for "no table matches", and what a pattern must match: e.g.
    /// `psql's \dt *.* and adjust the pattern (it must match all of schema.table)`.
    pub list: &'static str,
}

/// A catalog object that may be what a typed name means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<T> {
    /// Its exact name.
    pub table: TableRef,
    /// True when a name typed without schema finds it (PostgreSQL: visible on the search
    /// path; MySQL: in the URL's database; engines without schemas: always).
    pub unqualified: bool,
    /// What the adapter needs to describe it (an OID, a relation id, the kind).
    pub object: T,
}

/// The catalog side of discovery, implemented by each adapter on its coordinator session.
#[async_trait]
pub trait Catalog: Send {
    /// The adapter's handle on one catalog object.
    type Object: Clone + Send + Sync;

    /// How names are stored and how messages advise.
    const NAMING: Naming;

    /// The source, redacted, for messages.
    fn target(&self) -> String;

    /// Where a name typed without schema is looked up, for "does not exist" (e.g. `looked on
    /// the search_path; add the schema`); `None` when there is nothing to say.
    fn unqualified_scope(&self) -> Option<String> {
        None
    }

    /// Objects that may be what `name` means: at least every object whose name parts equal the
    /// typed ones in any case (more do no harm). Tables, views and whatever else can be read.
    async fn candidates(&mut self, name: &QualifiedName) -> Result<Vec<Candidate<Self::Object>>>;

    /// The tables `--tables` and `--schema` choose from (no views, no system tables, no
    /// partitions of a partitioned table), in a stable order.
    async fn tables(&mut self) -> Result<Vec<Candidate<Self::Object>>>;

    /// Describe one resolved object as a dataset (columns, keys, sizes).
    async fn describe(&mut self, object: &Candidate<Self::Object>) -> Result<Dataset>;

    /// Describe a user query as a dataset. Called only when [`Naming::queries`] is true.
    async fn describe_query(&mut self, query: &NamedQuery) -> Result<Dataset>;
}

/// How well `part` matches the catalog name `actual`: 0 exactly, 1 as the engine folds it, 2
/// in any case; `None` when it does not (a quoted part matches only exactly).
pub fn rank(part: &NamePart, actual: &str, folding: Folding) -> Option<u8> {
    if part.text == actual {
        Some(0)
    } else if part.quoted {
        None
    } else if folding.fold(&part.text).as_deref() == Some(actual) {
        Some(1)
    } else if part.text.to_lowercase() == actual.to_lowercase() {
        Some(2)
    } else {
        None
    }
}

/// Whether `--schema wanted` selects the schema named `actual`: exactly, or as the engine folds
/// unquoted names (in any case where it keeps the case).
pub fn schema_matches(wanted: &str, actual: &str, folding: Folding) -> bool {
    wanted == actual
        || match folding.fold(wanted) {
            Some(folded) => folded == actual,
            None => wanted.to_lowercase() == actual.to_lowercase(),
        }
}

/// Pick the object a typed name means among `candidates` (see the module documentation).
pub fn resolve<T>(
    name: &QualifiedName,
    candidates: Vec<Candidate<T>>,
    naming: &Naming,
    target: &str,
    unqualified_scope: Option<&str>,
) -> Result<Candidate<T>> {
    let mut ranked: Vec<(u8, Candidate<T>)> = candidates
        .into_iter()
        .filter_map(|c| {
            let by_name = rank(&name.name, &c.table.name, naming.folding)?;
            let by_schema = match &name.schema {
                Some(s) => rank(s, &c.table.schema, naming.folding)?,
                None if c.unqualified => 0,
                None => return None,
            };
            Some((by_name.max(by_schema), c))
        })
        .collect();
    if let Some(best) = ranked.iter().map(|(r, _)| *r).min() {
        ranked.retain(|(r, _)| *r == best);
    }
    match ranked.len() {
        1 => Ok(ranked.remove(0).1),
        0 => Err(Error::config(format!(
            "table {name} does not exist in {target}{}. Check {}; names typed without double \
             quotes match in any case.",
            match (&name.schema, unqualified_scope) {
                (None, Some(scope)) => format!(" ({scope})"),
                _ => String::new(),
            },
            naming.check
        ))),
        _ => Err(Error::config(format!(
            "table name {name} is ambiguous in {target}: it matches {}. Put the name in double \
             quotes to match its exact case.",
            ranked
                .iter()
                .map(|(_, c)| c.table.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The tables of `tables` that `--schema` or a `--tables` pattern of `selection` selects.
pub fn select_tables<T>(
    tables: Vec<Candidate<T>>,
    selection: &Selection,
    naming: &Naming,
) -> Result<Vec<Candidate<T>>> {
    let patterns = selection
        .patterns
        .iter()
        .map(|p| {
            regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                Error::config(format!(
                    "--tables pattern {p:?} is not a valid regular expression ({e}). It is \
                     matched against {}.",
                    naming.pattern_target
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(tables
        .into_iter()
        .filter(|c| {
            let full = c.table.to_string();
            selection
                .schemas
                .iter()
                .any(|s| schema_matches(s, &c.table.schema, naming.folding))
                || patterns.iter().any(|p| p.is_match(&full))
        })
        .collect())
}

/// Refuse what an engine cannot select: schemas where it has none, queries where it reads
/// none.
fn check_supported(selection: &Selection, naming: &Naming) -> Result<()> {
    if !naming.schemas {
        if let Some(s) = selection.schemas.first() {
            return Err(Error::config(format!(
                "--schema {s:?}: {} has no schemas; select tables with --tables REGEX (matched \
                 against the table name) or --table NAME.",
                naming.engine
            )));
        }
        if let Some(t) = selection.tables.iter().find(|t| t.schema.is_some()) {
            return Err(Error::config(format!(
                "table {t}: {} has no schemas; name the table alone (--table NAME).",
                naming.engine
            )));
        }
    }
    if !naming.queries
        && let Some(q) = selection.queries.first()
    {
        return Err(Error::config(format!(
            "--query {:?}: queries are not supported on {} sources yet; create a view and \
             export it with --table.",
            q.name, naming.engine
        )));
    }
    Ok(())
}

/// Resolve `selection` against `catalog` and describe every dataset it names: named tables
/// first, in the order given, then the tables patterns and schemas select, then the queries.
/// An object named twice is described once; two datasets may not share a name.
pub async fn discover<C: Catalog + ?Sized>(
    catalog: &mut C,
    selection: &Selection,
) -> Result<Vec<Dataset>> {
    let naming = C::NAMING;
    let target = catalog.target();
    check_supported(selection, &naming)?;
    let scope = catalog.unqualified_scope();
    let mut objects = Vec::new();
    for name in &selection.tables {
        let candidates = catalog.candidates(name).await?;
        objects.push(resolve(
            name,
            candidates,
            &naming,
            &target,
            scope.as_deref(),
        )?);
    }
    if !selection.patterns.is_empty() || !selection.schemas.is_empty() {
        let many = select_tables(catalog.tables().await?, selection, &naming)?;
        if many.is_empty() && selection.tables.is_empty() && selection.queries.is_empty() {
            return Err(Error::config(format!(
                "no table in {target} matches --tables {:?}{}. List the tables with {}.",
                selection.patterns,
                if naming.schemas {
                    format!(" / --schema {:?}", selection.schemas)
                } else {
                    String::new()
                },
                naming.list
            )));
        }
        objects.extend(many);
    }
    let mut seen = HashSet::new();
    let mut datasets = Vec::new();
    for object in objects {
        if seen.insert(object.table.clone()) {
            datasets.push(catalog.describe(&object).await?);
        }
    }
    let mut names: HashSet<String> = datasets.iter().map(|d| d.name.clone()).collect();
    for q in &selection.queries {
        if !names.insert(q.name.clone()) {
            return Err(Error::config(format!(
                "two datasets are named {:?}; give each --query a distinct name.",
                q.name
            )));
        }
        datasets.push(catalog.describe_query(q).await?);
    }
    for pick in &selection.columns {
        let candidates = catalog.candidates(&pick.table).await?;
        let table = resolve(&pick.table, candidates, &naming, &target, scope.as_deref())?.table;
        let ds = datasets
            .iter_mut()
            .find(|d| d.object.as_ref() == Some(&table))
            .ok_or_else(|| {
                Error::config(format!(
                    "--columns names {table}, which the selection does not include; select it \
                     (--table {}) or leave its --columns out.",
                    pick.table
                ))
            })?;
        keep_columns(ds, pick, naming.folding)?;
    }
    for ds in &mut datasets {
        for f in &selection.row_filter {
            f.check(ds)?;
        }
        ds.row_filter = selection.row_filter.clone();
    }
    Ok(datasets)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMING: Naming = Naming {
        engine: "Test",
        folding: Folding::Lower,
        schemas: true,
        queries: true,
        pattern_target: "schema.table",
        check: "the spelling",
        list: "a listing",
    };

    fn c(schema: &str, name: &str, unqualified: bool) -> Candidate<()> {
        Candidate {
            table: TableRef {
                schema: schema.into(),
                name: name.into(),
            },
            unqualified,
            object: (),
        }
    }

    fn pick(typed: &str, cands: Vec<Candidate<()>>, naming: &Naming) -> Result<String> {
        let name = QualifiedName::parse(typed)?;
        resolve(&name, cands, naming, "db", Some("on the path")).map(|c| c.table.to_string())
    }

    #[test]
    fn exact_then_folded_then_any_case() {
        let all = || {
            vec![
                c("public", "Orders", true),
                c("public", "orders", true),
                c("public", "ORDERS", true),
            ]
        };
        assert_eq!(pick("Orders", all(), &NAMING).unwrap(), "public.Orders");
        assert_eq!(pick("oRdErS", all(), &NAMING).unwrap(), "public.orders");
        let upper = Naming {
            folding: Folding::Upper,
            ..NAMING
        };
        assert_eq!(pick("oRdErS", all(), &upper).unwrap(), "public.ORDERS");
        let keep = Naming {
            folding: Folding::Preserve,
            ..NAMING
        };
        let e = pick("oRdErS", all(), &keep).unwrap_err();
        assert!(e.message().contains("is ambiguous"), "{e}");
        assert!(e.message().contains("public.ORDERS"), "{e}");
        // A quoted part matches only exactly.
        let e = pick("\"oRdErS\"", all(), &NAMING).unwrap_err();
        assert!(
            e.message().contains("does not exist in db (on the path)"),
            "{e}"
        );
    }

    #[test]
    fn unqualified_names_find_only_what_the_engine_would() {
        let cands = || vec![c("a", "t", false), c("b", "t", true)];
        assert_eq!(pick("t", cands(), &NAMING).unwrap(), "b.t");
        assert_eq!(pick("a.t", cands(), &NAMING).unwrap(), "a.t");
        assert_eq!(pick("A.T", cands(), &NAMING).unwrap(), "a.t");
        let e = pick("c.t", cands(), &NAMING).unwrap_err();
        assert!(!e.message().contains("on the path"), "{e}");
    }

    #[test]
    fn schemas_and_patterns_select_tables() {
        let tables = || {
            vec![
                c("public", "a", false),
                c("Sales", "b", false),
                c("sales", "c", false),
            ]
        };
        let sel = |schemas: &[&str], patterns: &[&str]| Selection {
            schemas: schemas.iter().map(|s| s.to_string()).collect(),
            patterns: patterns.iter().map(|s| s.to_string()).collect(),
            ..Selection::default()
        };
        let names = |v: Vec<Candidate<()>>| v.into_iter().map(|c| c.table.name).collect::<Vec<_>>();
        assert_eq!(
            names(select_tables(tables(), &sel(&["SALES"], &[]), &NAMING).unwrap()),
            ["c"]
        );
        let keep = Naming {
            folding: Folding::Preserve,
            ..NAMING
        };
        assert_eq!(
            names(select_tables(tables(), &sel(&["SALES"], &[]), &keep).unwrap()),
            ["b", "c"]
        );
        assert_eq!(
            names(select_tables(tables(), &sel(&[], &["public\\..*"]), &NAMING).unwrap()),
            ["a"]
        );
        let e = select_tables(tables(), &sel(&[], &["("]), &NAMING).unwrap_err();
        assert!(e.message().contains("matched against schema.table"), "{e}");
    }

    #[test]
    fn engines_without_schemas_or_queries_refuse_them() {
        let naming = Naming {
            schemas: false,
            queries: false,
            ..NAMING
        };
        let mut sel = Selection {
            schemas: vec!["PUBLIC".into()],
            ..Selection::default()
        };
        let e = check_supported(&sel, &naming).unwrap_err();
        assert!(e.message().contains("Test has no schemas"), "{e}");
        sel.schemas.clear();
        sel.queries.push(NamedQuery {
            name: "q".into(),
            sql: "SELECT 1".into(),
        });
        let e = check_supported(&sel, &naming).unwrap_err();
        assert!(e.message().contains("not supported on Test"), "{e}");
    }
}
