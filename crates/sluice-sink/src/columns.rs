//! The columns of a table format: what each Arrow type a source gives becomes in a Delta Lake
//! table, an Apache Iceberg table, or a Spark DataFrame (Delta's types are Spark SQL's), so
//! that any reader of the format reads the part files as the table's schema says.
//!
//! | Arrow (as sources give it)          | Delta / Spark                   | Iceberg                      |
//! |-------------------------------------|---------------------------------|------------------------------|
//! | Boolean, Int32/64, Float32/64       | boolean, integer, long, float, double | the same               |
//! | Int8, Int16                         | byte, short                     | int                          |
//! | UInt8, UInt16, UInt32               | short, integer, long (the next wider signed type) | int, int, long |
//! | UInt64                              | decimal(20, 0)                  | decimal(20, 0)               |
//! | Decimal128(p, s)                    | decimal(p, s)                   | decimal(p, s)                |
//! | Utf8 (JSON included), Binary        | string, binary                  | string, binary               |
//! | Date32                              | date                            | date                         |
//! | Time64 (time of day)                | string (Delta has no time type) | time (microseconds)          |
//! | Timestamp with a zone               | timestamp (µs, UTC)             | timestamptz (µs)             |
//! | Timestamp without a zone            | timestamp_ntz (table feature `timestampNtz`) | timestamp (µs)  |
//! | FixedSizeBinary(16) `arrow.uuid`    | string                          | uuid                         |
//! | other FixedSizeBinary(n)            | string                          | fixed(n)                     |
//! | sluice.interval struct, other structs | struct of the converted fields | struct                      |
//! | List of a type above                | array                           | list                         |
//! | anything else: MySQL `time`, Decimal256 (> 38 digits), lists of those | string, as the CSV output writes it (`render.rs`), named in the report's notes | the same |
//!
//! Column names: a Delta table without column mapping cannot hold a name with a space or one
//! of `,;{}()=`, a tab or a line break. Such a name is refused before anything is read, with
//! the fix (rename it in a `--query`); column mapping would lift that, and is not written.
//! Iceberg and Spark take any name.
//!
//! Iceberg identifies columns by number, not name: every field (nested ones and list
//! elements included) carries its field id in the Parquet schema, numbered as the Iceberg
//! library numbers a new table's schema (each level's fields first, then what they hold), so
//! the table created from the first part's schema and its files agree.

use crate::render::renderer;
use arrow_array::builder::StringBuilder;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef, TimeUnit};
use sluice_core::{Error, Result};
use std::sync::Arc;

/// Characters a Delta column name cannot hold without column mapping.
const FORBIDDEN: &[char] = &[' ', ',', ';', '{', '}', '(', ')', '\n', '\t', '='];

/// The metadata key of a field's id in a Parquet schema (written by the Parquet writer).
pub const FIELD_ID_KEY: &str = "PARQUET:field_id";

/// The extension name of a UUID column.
const UUID: &str = "arrow.uuid";

/// Whose columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A Delta Lake table.
    Delta,
    /// An Apache Iceberg table.
    Iceberg,
    /// A Spark DataFrame (Delta's types; any name).
    Spark,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Delta => "Delta",
            Kind::Iceberg => "Iceberg",
            Kind::Spark => "Spark",
        }
    }
}

/// What a column becomes in the table.
#[derive(Debug, Clone, PartialEq)]
enum Conversion {
    /// Written as it comes.
    Keep,
    /// Cast by Arrow to another type (a wider integer, microseconds, struct or list members).
    Cast(DataType),
    /// Written as text, as the CSV output writes it.
    Text,
}

/// The type of one Arrow type in a `kind` table, or `None` where the format has none (written
/// as text). Delta (and Spark) have 8- and 16-bit integers but no time of day, UUID or fixed;
/// Iceberg the other way round.
fn column_type(kind: Kind, t: &DataType) -> Option<DataType> {
    use DataType as D;
    let iceberg = kind == Kind::Iceberg;
    Some(match t {
        D::Boolean
        | D::Int32
        | D::Int64
        | D::Float32
        | D::Float64
        | D::Utf8
        | D::LargeUtf8
        | D::Binary
        | D::LargeBinary
        | D::Date32 => t.clone(),
        D::Int8 | D::Int16 if !iceberg => t.clone(),
        D::Int8 | D::Int16 | D::UInt16 => D::Int32,
        D::UInt8 if iceberg => D::Int32,
        D::UInt8 => D::Int16,
        D::UInt32 => D::Int64,
        D::UInt64 => D::Decimal128(20, 0),
        D::Float16 => D::Float32,
        D::Decimal128(p, s) if *p <= 38 => D::Decimal128(*p, *s),
        D::Timestamp(_, zone) => D::Timestamp(TimeUnit::Microsecond, zone.clone()),
        D::FixedSizeBinary(_) if iceberg => t.clone(),
        D::Time32(_) | D::Time64(_) if iceberg => D::Time64(TimeUnit::Microsecond),
        D::Struct(fields) => D::Struct(
            fields
                .iter()
                .map(|f| column_type(kind, f.data_type()).map(|t| plain(f, t)))
                .collect::<Option<Fields>>()?,
        ),
        D::List(item) | D::LargeList(item) => {
            D::List(plain(item, column_type(kind, item.data_type())?))
        }
        _ => return None,
    })
}

/// `t` with every nested field nullable, or `None` when it already is (or has none).
fn loosened(t: &DataType) -> Option<DataType> {
    let field = |f: &FieldRef| {
        let inner = loosened(f.data_type());
        (inner.is_some() || !f.is_nullable()).then(|| {
            Arc::new(Field::new(
                f.name(),
                inner.unwrap_or_else(|| f.data_type().clone()),
                true,
            ))
        })
    };
    match t {
        DataType::Struct(fields) => {
            let changed: Vec<Option<FieldRef>> = fields.iter().map(field).collect();
            changed.iter().any(Option::is_some).then(|| {
                DataType::Struct(
                    fields
                        .iter()
                        .zip(changed)
                        .map(|(f, c)| c.unwrap_or_else(|| f.clone()))
                        .collect::<Fields>(),
                )
            })
        }
        DataType::List(item) => field(item).map(DataType::List),
        _ => None,
    }
}

/// `f` with type `t` and no metadata (extension names such as `arrow.json` mean nothing to a
/// table reader; the table's schema is the type).
fn plain(f: &FieldRef, t: DataType) -> FieldRef {
    Arc::new(Field::new(f.name(), t, f.is_nullable()))
}

/// `fields` numbered from `next` as Iceberg numbers a new schema: this level's fields first,
/// then, field by field, what each holds (a list's element, then the element's own fields).
fn numbered(fields: &[Field], next: &mut i32) -> Vec<Field> {
    let ids: Vec<i32> = fields
        .iter()
        .map(|_| {
            *next += 1;
            *next
        })
        .collect();
    fields
        .iter()
        .zip(ids)
        .map(|(f, id)| {
            let t = numbered_type(f.data_type(), next);
            with_id(f.clone().with_data_type(t), id)
        })
        .collect()
}

fn numbered_type(t: &DataType, next: &mut i32) -> DataType {
    match t {
        DataType::Struct(fields) => {
            let plain: Vec<Field> = fields.iter().map(|f| f.as_ref().clone()).collect();
            DataType::Struct(numbered(&plain, next).into())
        }
        DataType::List(item) => {
            *next += 1;
            let id = *next;
            let inner = numbered_type(item.data_type(), next);
            DataType::List(Arc::new(with_id(
                item.as_ref().clone().with_data_type(inner),
                id,
            )))
        }
        other => other.clone(),
    }
}

fn with_id(f: Field, id: i32) -> Field {
    let mut metadata = f.metadata().clone();
    metadata.insert(FIELD_ID_KEY.to_string(), id.to_string());
    f.with_metadata(metadata)
}

/// The columns of a table for `schema`, and what each becomes.
#[derive(Debug, Clone)]
pub struct TableSchema {
    /// The schema the part files are written with: the table's.
    pub schema: SchemaRef,
    conversions: Vec<Conversion>,
    /// One line per column whose values change form (text or a wider type), for the report.
    pub notes: Vec<String>,
}

/// The `kind` table schema for a dataset's Arrow `schema`; a column name the format cannot
/// hold is refused, naming `dataset`, the column and the fix.
pub fn table_schema(kind: Kind, dataset: &str, schema: &Schema) -> Result<TableSchema> {
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut conversions = Vec::with_capacity(fields.capacity());
    let mut notes = Vec::new();
    let name = kind.name();
    for f in schema.fields() {
        if kind == Kind::Delta && (f.name().is_empty() || f.name().contains(FORBIDDEN)) {
            return Err(Error::config(format!(
                "{dataset}: column {:?} cannot be a Delta column name (a Delta table without \
                 column mapping holds no space, tab, line break or any of ,;{{}}()= in a name): \
                 rename it in a --query (SELECT … AS new_name), or use --format parquet.",
                f.name()
            )));
        }
        let uuid = kind == Kind::Iceberg
            && f.data_type() == &DataType::FixedSizeBinary(16)
            && f.metadata()
                .get(EXTENSION_TYPE_NAME_KEY)
                .map(String::as_str)
                == Some(UUID);
        let (t, c) = match column_type(kind, f.data_type()) {
            Some(t) if &t == f.data_type() => {
                if let Some(ext) = f.metadata().get(EXTENSION_TYPE_NAME_KEY).filter(|_| !uuid) {
                    notes.push(format!(
                        "{dataset}.{}: {ext} is written as {name}'s {} ({name} has no such type)",
                        f.name(),
                        t
                    ));
                }
                (t, Conversion::Keep)
            }
            Some(t) => {
                if !matches!(f.data_type(), DataType::Struct(_) | DataType::List(_)) {
                    notes.push(format!(
                        "{dataset}.{}: {} is written as {name}'s {}",
                        f.name(),
                        f.data_type(),
                        t
                    ));
                }
                (t.clone(), Conversion::Cast(t))
            }
            None => {
                notes.push(format!(
                    "{dataset}.{}: {} has no {name} type and is written as text (string), as \
                     --format csv writes it",
                    f.name(),
                    f.data_type()
                ));
                (DataType::Utf8, Conversion::Text)
            }
        };
        let (t, c) = match (kind, loosened(&t)) {
            // Spark's toArrow() cannot give back a NULL struct whose fields are declared
            // non-null (pyarrow refuses the view), so a DataFrame's nested fields are nullable.
            (Kind::Spark, Some(l)) => (l.clone(), Conversion::Cast(l)),
            _ => (t, c),
        };
        if kind == Kind::Iceberg && matches!(t, DataType::Time64(_)) {
            notes.push(format!(
                "{dataset}.{}: written as Iceberg's time, which Apache Spark cannot read (Spark \
                 has no time type and refuses the whole table): for Spark readers, cast it to \
                 text in a --query",
                f.name()
            ));
        }
        let field = Field::new(f.name(), t, f.is_nullable());
        // A UUID column keeps its extension name: the Parquet writer gives it the UUID type.
        fields.push(match uuid {
            true => field.with_metadata(f.metadata().clone()),
            false => field,
        });
        conversions.push(c);
    }
    if kind == Kind::Iceberg {
        fields = numbered(&fields, &mut 0);
        for ((f, c), source) in fields
            .iter()
            .zip(conversions.iter_mut())
            .zip(schema.fields())
        {
            // Nested fields now carry ids, which are part of their type: cast to that type.
            if *c != Conversion::Text && f.data_type() != source.data_type() {
                *c = Conversion::Cast(f.data_type().clone());
            }
        }
    }
    Ok(TableSchema {
        schema: Arc::new(Schema::new(fields)),
        conversions,
        notes,
    })
}

impl TableSchema {
    /// `batch` (in the dataset's schema) in the table's schema.
    pub fn convert(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        if self.conversions.iter().all(|c| *c == Conversion::Keep) {
            // Same arrays under the table's schema, whose fields carry no metadata (a JSON
            // column's extension name): `with_schema` would refuse a schema with less metadata.
            return RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec())
                .map_err(|e| Error::internal(format!("table schema: {e}")));
        }
        let source = batch.schema();
        let columns = batch
            .columns()
            .iter()
            .zip(&self.conversions)
            .zip(source.fields())
            .map(|((a, c), f)| convert(a, c, f))
            .collect::<Result<Vec<ArrayRef>>>()?;
        RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| Error::internal(format!("table schema: {e}")))
    }
}

fn convert(a: &ArrayRef, c: &Conversion, f: &Field) -> Result<ArrayRef> {
    match c {
        Conversion::Keep => Ok(a.clone()),
        Conversion::Cast(t) => arrow_cast::cast(a, t).map_err(|e| {
            Error::internal(format!(
                "column {:?}: {} to the table's {t}: {e}",
                f.name(),
                a.data_type()
            ))
        }),
        Conversion::Text => {
            let render = renderer(a, f)?;
            let mut out = StringBuilder::with_capacity(a.len(), a.len() * 16);
            let mut buf = Vec::with_capacity(64);
            for i in 0..a.len() {
                if a.is_null(i) {
                    out.append_null();
                    continue;
                }
                buf.clear();
                render(i, &mut buf);
                out.append_value(String::from_utf8_lossy(&buf));
            }
            Ok(Arc::new(out.finish()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{FixedSizeBinaryArray, Int64Array, UInt64Array};

    #[test]
    fn types_delta_lacks_are_widened_or_written_as_text() {
        let metadata: std::collections::HashMap<String, String> =
            [("ARROW:extension:name".to_string(), "arrow.uuid".to_string())].into();
        let uuid = Field::new("u", DataType::FixedSizeBinary(16), true).with_metadata(metadata);
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("n", DataType::UInt64, true),
            uuid,
        ]);
        let t = table_schema(Kind::Delta, "d", &schema).unwrap();
        assert_eq!(t.schema.field(0).data_type(), &DataType::Int64);
        assert_eq!(t.schema.field(1).data_type(), &DataType::Decimal128(20, 0));
        assert_eq!(t.schema.field(2).data_type(), &DataType::Utf8);
        assert_eq!(t.notes.len(), 2, "{:?}", t.notes);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(UInt64Array::from(vec![Some(u64::MAX), None])),
                Arc::new(
                    FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                        vec![Some([0xabu8; 16]), None].into_iter(),
                        16,
                    )
                    .unwrap(),
                ),
            ],
        )
        .unwrap();
        let out = t.convert(&batch).unwrap();
        let text = arrow_cast::display::array_value_to_string(out.column(1), 0).unwrap();
        assert_eq!(text, u64::MAX.to_string());
        assert!(out.column(1).is_null(1));
        let u = arrow_cast::display::array_value_to_string(out.column(2), 0).unwrap();
        assert_eq!(u, "abababab-abab-abab-abab-abababababab");
        assert!(out.column(2).is_null(1));
    }

    #[test]
    fn a_json_column_alone_is_written_as_plain_text() {
        let metadata: std::collections::HashMap<String, String> =
            [("ARROW:extension:name".to_string(), "arrow.json".to_string())].into();
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("j", DataType::Utf8, true).with_metadata(metadata),
        ]);
        let t = table_schema(Kind::Delta, "d", &schema).unwrap();
        assert_eq!(t.notes.len(), 1, "{:?}", t.notes);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![1])),
                Arc::new(arrow_array::StringArray::from(vec![Some("{}")])),
            ],
        )
        .unwrap();
        let out = t.convert(&batch).unwrap();
        assert!(out.schema().field(1).metadata().is_empty());
        assert_eq!(out.num_rows(), 1);
    }

    #[test]
    fn names_delta_cannot_hold_are_refused_with_the_fix() {
        for bad in ["a b", "x,y", "f(x)", "k=v", ""] {
            let schema = Schema::new(vec![Field::new(bad, DataType::Int32, true)]);
            let e = table_schema(Kind::Delta, "public.t", &schema)
                .unwrap_err()
                .to_string();
            assert!(e.contains("public.t") && e.contains("--query"), "{e}");
        }
        let ok = Schema::new(vec![Field::new("Ünïcode_ok-1", DataType::Int32, true)]);
        assert!(table_schema(Kind::Delta, "t", &ok).is_ok());
    }

    #[test]
    fn iceberg_field_ids_are_numbered_as_the_library_numbers_a_new_schema() {
        let inner = Field::new(
            "b",
            DataType::List(Arc::new(Field::new("item", DataType::Int16, true))),
            true,
        );
        let s = Field::new(
            "s",
            DataType::Struct(vec![Field::new("a", DataType::Int32, false), inner].into()),
            true,
        );
        let l = Field::new(
            "l",
            DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(vec![Field::new("x", DataType::Utf8, true)].into()),
                true,
            ))),
            true,
        );
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false), s, l]);
        let t = table_schema(Kind::Iceberg, "d", &schema).unwrap();
        let id = |f: &Field| f.metadata().get(FIELD_ID_KEY).cloned().unwrap();
        let top: Vec<String> = t.schema.fields().iter().map(|f| id(f)).collect();
        assert_eq!(top, ["1", "2", "3"]);
        let DataType::Struct(sf) = t.schema.field(1).data_type() else {
            panic!()
        };
        assert_eq!((id(&sf[0]), id(&sf[1])), ("4".into(), "5".into()));
        let DataType::List(b_item) = sf[1].data_type() else {
            panic!()
        };
        assert_eq!(id(b_item), "6");
        // Iceberg has no 16-bit integer: the list's elements are widened, and named in a note.
        assert_eq!(b_item.data_type(), &DataType::Int32);
        let DataType::List(l_item) = t.schema.field(2).data_type() else {
            panic!()
        };
        assert_eq!(id(l_item), "7");
        let DataType::Struct(xf) = l_item.data_type() else {
            panic!()
        };
        assert_eq!(id(&xf[0]), "8");
        // A batch in the source's types converts to the table's (ids and all).
        let batch = RecordBatch::new_empty(Arc::new(schema));
        let out = t.convert(&batch).unwrap();
        assert_eq!(out.schema(), t.schema);
    }
}
