//! Row filters a read applies at the source, in every chunk's `WHERE`: the filters Apache
//! Spark pushes to the `sluice` data source (`df.filter(...)` on a read), so the rows Spark
//! would drop are never read, sent or decoded.
//!
//! Only predicates whose result is the same in every engine and in Spark are expressed:
//! comparisons of an integer column with integer literals, `IN` lists of integers, `IS [NOT]
//! NULL` on an integer column, and `NOT` of those (a NULL test on other types is left out:
//! MySQL's zero dates read as NULL but are not NULL at the source). Text is left out on purpose: engines compare and
//! order text by the column's collation (MySQL's default ones ignore case, PostgreSQL's order
//! by locale) and Spark by UTF-8 bytes, so a pushed text filter could drop rows Spark keeps.
//! NULL follows SQL's three-valued logic in the engines and in Spark alike (a comparison with
//! NULL is unknown, and the row is left out, negated or not).

use crate::clause::Dialect;
use crate::error::{Error, Result};
use crate::table::{ColumnDesc, Dataset};
use serde::{Deserialize, Serialize};

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cmp {
    /// `=`
    Eq,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Cmp {
    fn sql(self) -> &'static str {
        match self {
            Cmp::Eq => "=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
        }
    }
}

/// One predicate over a dataset's columns (a read's filters hold when all of them do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RowFilter {
    /// `column <cmp> value` on an integer column.
    Compare {
        /// The column's name, exactly as the dataset has it.
        column: String,
        /// How it compares.
        cmp: Cmp,
        /// The literal.
        value: i64,
    },
    /// `column IN (values)` on an integer column (never empty).
    In {
        /// The column's name, exactly as the dataset has it.
        column: String,
        /// The literals.
        values: Vec<i64>,
    },
    /// `column IS NULL`.
    IsNull {
        /// The column's name, exactly as the dataset has it.
        column: String,
    },
    /// `column IS NOT NULL`.
    IsNotNull {
        /// The column's name, exactly as the dataset has it.
        column: String,
    },
    /// `NOT (filter)`.
    Not {
        /// The filter negated.
        filter: Box<RowFilter>,
    },
}

impl RowFilter {
    /// The predicate as SQL of `d`'s engine over `ds`'s columns (quoted, the literals
    /// written by this code); fails as [`RowFilter::check`] does.
    pub fn sql(&self, d: &dyn Dialect, ds: &Dataset) -> Result<String> {
        self.check(ds)?;
        Ok(match self {
            RowFilter::Compare { column, cmp, value } => {
                format!("{} {} {value}", d.quote_ident(column), cmp.sql())
            }
            RowFilter::In { column, values } => {
                let list: Vec<String> = values.iter().map(i64::to_string).collect();
                format!("{} IN ({})", d.quote_ident(column), list.join(", "))
            }
            RowFilter::IsNull { column } => format!("{} IS NULL", d.quote_ident(column)),
            RowFilter::IsNotNull { column } => format!("{} IS NOT NULL", d.quote_ident(column)),
            RowFilter::Not { filter } => format!("NOT ({})", filter.sql(d, ds)?),
        })
    }

    /// Fails, naming the column and the fix, when `ds` has no column of the name, a
    /// comparison is on a column that is not an integer, or an `IN` list is empty.
    pub fn check(&self, ds: &Dataset) -> Result<()> {
        match self {
            RowFilter::Compare { column, .. } => integer_column(ds, column),
            RowFilter::In { column, values } => {
                if values.is_empty() {
                    return Err(Error::config(format!(
                        "a row filter's IN list on {}.{column} is empty.",
                        ds.name
                    )));
                }
                integer_column(ds, column)
            }
            RowFilter::IsNull { column } | RowFilter::IsNotNull { column } => {
                integer_column(ds, column)
            }
            RowFilter::Not { filter } => filter.check(ds),
        }
    }
}

fn find<'a>(ds: &'a Dataset, name: &str) -> Result<&'a ColumnDesc> {
    ds.columns.iter().find(|c| c.name == name).ok_or_else(|| {
        let names: Vec<&str> = ds.columns.iter().map(|c| c.name.as_str()).collect();
        Error::config(format!(
            "a row filter names column {name:?}, which {} does not have (its columns: {}).",
            ds.name,
            names.join(", ")
        ))
    })
}

/// Source types whose integers the engine does not compare as integers: PostgreSQL's `oid`
/// and `reg*` aliases (unsigned: `-1` reads as 4294967295) and MySQL's `YEAR` (a literal is
/// read as a year: `13` is 2013).
const NOT_COMPARED: [&str; 3] = ["oid", "reg", "year"];

fn integer_column(ds: &Dataset, name: &str) -> Result<()> {
    let c = find(ds, name)?;
    let ty = c.source_type.to_ascii_lowercase();
    if c.field.data_type().is_integer() && !NOT_COMPARED.iter().any(|n| ty.starts_with(n)) {
        return Ok(());
    }
    Err(Error::config(format!(
        "a row filter on {}.{name} ({}): only columns of integer types are filtered at the \
         source (a NULL test on another type may not match what the read gives: MySQL's zero \
         dates read as NULL). Leave the filter to Spark (register(spark, \
         filter_pushdown=False)).",
        ds.name, c.source_type
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::field;
    use crate::table::{Relation, TableRef};
    use arrow_schema::DataType;

    struct Quoted;
    impl Dialect for Quoted {
        fn engine(&self) -> &'static str {
            "Quoted"
        }
        fn quote_ident(&self, name: &str) -> String {
            crate::ident::enclose(name, '"')
        }
        fn key_literal(&self, _: &ColumnDesc, value: &str) -> Result<String> {
            Ok(value.to_string())
        }
    }

    fn ds() -> Dataset {
        let col = |name: &str, ty: &str, dt: DataType| ColumnDesc {
            name: name.into(),
            source_type: ty.into(),
            field: field(name, dt),
            cast: None,
            as_text_fallback: false,
        };
        Dataset::table(
            Relation::new(TableRef::new("s", "t"), 1, 8192, 1, 1),
            vec![
                col("id", "bigint", DataType::Int64),
                col("we\"ird", "integer", DataType::Int32),
                col("v", "text", DataType::Utf8),
            ],
        )
    }

    #[test]
    fn filters_as_sql() {
        let d = ds();
        let f = |j: &str| {
            serde_json::from_str::<RowFilter>(j)
                .unwrap()
                .sql(&Quoted, &d)
        };
        assert_eq!(
            f(r#"{"op":"compare","column":"id","cmp":"ge","value":-5}"#).unwrap(),
            "\"id\" >= -5"
        );
        assert_eq!(
            f(r#"{"op":"in","column":"we\"ird","values":[1,2]}"#).unwrap(),
            "\"we\"\"ird\" IN (1, 2)"
        );
        assert_eq!(
            f(r#"{"op":"not","filter":{"op":"is_null","column":"id"}}"#).unwrap(),
            "NOT (\"id\" IS NULL)"
        );
    }

    #[test]
    fn what_is_not_compared_at_the_source_is_refused() {
        let d = ds();
        let text = RowFilter::Compare {
            column: "v".into(),
            cmp: Cmp::Eq,
            value: 1,
        };
        let e = text.sql(&Quoted, &d).unwrap_err().to_string();
        assert!(e.contains("s.t.v (text)") && e.contains("integer"), "{e}");
        let missing = RowFilter::IsNull {
            column: "ID".into(),
        };
        let e = missing.sql(&Quoted, &d).unwrap_err().to_string();
        assert!(e.contains("\"ID\"") && e.contains("id, we\"ird, v"), "{e}");
        let null_text = RowFilter::IsNotNull { column: "v".into() };
        assert!(
            null_text.sql(&Quoted, &d).is_err(),
            "MySQL's zero dates read as NULL"
        );
        let mut oid = ds();
        oid.columns[1].source_type = "oid".into();
        let compare = RowFilter::Compare {
            column: "we\"ird".into(),
            cmp: Cmp::Gt,
            value: -1,
        };
        assert!(compare.sql(&Quoted, &oid).is_err(), "oid compares unsigned");
        let empty = RowFilter::In {
            column: "id".into(),
            values: Vec::new(),
        };
        assert!(empty.sql(&Quoted, &d).is_err());
    }
}
