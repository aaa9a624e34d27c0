//! Parquet parts of a Delta Lake table (`--format delta`): sluice's Parquet writer, with every
//! column in a type the Delta protocol has, so that any Delta reader (Spark, DuckDB, delta-rs,
//! Trino) reads the files as the table's schema says. The table commit that adds the parts is
//! not written here: the crate `sluice-lake` makes it with the `deltalake` library, through
//! [`TableCommitter`].
//!
//! | Arrow (as sources give it)                  | Delta column                             |
//! |---------------------------------------------|------------------------------------------|
//! | Boolean, Int8/16/32/64, Float32/64          | boolean, byte, short, integer, long, float, double |
//! | UInt8, UInt16, UInt32                       | short, integer, long (the next wider signed type) |
//! | UInt64                                      | decimal(20, 0)                           |
//! | Decimal128(p, s)                            | decimal(p, s)                            |
//! | Utf8 (JSON included), Binary                | string, binary                           |
//! | Date32                                      | date                                     |
//! | Timestamp with a zone                       | timestamp (microseconds, UTC)            |
//! | Timestamp without a zone                    | timestamp_ntz (table feature `timestampNtz`) |
//! | sluice.interval struct, other structs       | struct of the converted fields           |
//! | List of a type above                        | array                                    |
//! | anything else: UUID, time of day, MySQL `time`, Decimal256 (> 38 digits), lists of those | string, as the CSV output writes it (`render.rs`), named in the report's notes |
//!
//! Column names: a Delta table without column mapping cannot hold a name with a space or one
//! of `,;{}()=`, a tab or a line break. Such a name is refused before anything is read, with
//! the fix (rename it in a `--query`); column mapping would lift that, and is not written.

use crate::destination::CountingWriter;
use crate::format::{ParquetOptions, PartStats, PartWriter};
use crate::parquet::ParquetPart;
use crate::render::renderer;
use arrow_array::builder::StringBuilder;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::extension::EXTENSION_TYPE_NAME_KEY;
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef, TimeUnit};
use sluice_core::{Error, Result};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Characters a Delta column name cannot hold without column mapping.
const FORBIDDEN: &[char] = &[' ', ',', ';', '{', '}', '(', ')', '\n', '\t', '='];

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

/// The Delta type of one Arrow type, or `None` where Delta has none (written as text).
fn delta_type(t: &DataType) -> Option<DataType> {
    use DataType as D;
    Some(match t {
        D::Boolean
        | D::Int8
        | D::Int16
        | D::Int32
        | D::Int64
        | D::Float32
        | D::Float64
        | D::Utf8
        | D::LargeUtf8
        | D::Binary
        | D::LargeBinary
        | D::Date32 => t.clone(),
        D::UInt8 => D::Int16,
        D::UInt16 => D::Int32,
        D::UInt32 => D::Int64,
        D::UInt64 => D::Decimal128(20, 0),
        D::Float16 => D::Float32,
        D::Decimal128(p, s) if *p <= 38 => D::Decimal128(*p, *s),
        D::Timestamp(_, zone) => D::Timestamp(TimeUnit::Microsecond, zone.clone()),
        D::Struct(fields) => D::Struct(
            fields
                .iter()
                .map(|f| delta_type(f.data_type()).map(|t| plain(f, t)))
                .collect::<Option<Fields>>()?,
        ),
        D::List(item) | D::LargeList(item) => D::List(plain(item, delta_type(item.data_type())?)),
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
/// Delta reader; the table's schema is the type).
fn plain(f: &FieldRef, t: DataType) -> FieldRef {
    Arc::new(Field::new(f.name(), t, f.is_nullable()))
}

/// The columns of a Delta table for `schema`, and what each becomes.
#[derive(Debug, Clone)]
pub struct TableSchema {
    /// The schema the part files are written with: the table's.
    pub schema: SchemaRef,
    conversions: Vec<Conversion>,
    /// One line per column whose values change form (text or a wider type), for the report.
    pub notes: Vec<String>,
}

/// The Delta table schema for a dataset's Arrow `schema`; a column name Delta cannot hold is
/// refused, naming `dataset`, the column and the fix.
pub fn table_schema(dataset: &str, schema: &Schema) -> Result<TableSchema> {
    mapped(dataset, schema, true)
}

/// The same columns in the same types for a Spark DataFrame (Delta's types are Spark SQL's),
/// where any column name is allowed.
pub fn spark_schema(dataset: &str, schema: &Schema) -> Result<TableSchema> {
    mapped(dataset, schema, false)
}

fn mapped(dataset: &str, schema: &Schema, delta_names: bool) -> Result<TableSchema> {
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut conversions = Vec::with_capacity(fields.capacity());
    let mut notes = Vec::new();
    let kind = if delta_names { "Delta" } else { "Spark" };
    for f in schema.fields() {
        if delta_names && (f.name().is_empty() || f.name().contains(FORBIDDEN)) {
            return Err(Error::config(format!(
                "{dataset}: column {:?} cannot be a Delta column name (a Delta table without \
                 column mapping holds no space, tab, line break or any of ,;{{}}()= in a name): \
                 rename it in a --query (SELECT … AS new_name), or use --format parquet.",
                f.name()
            )));
        }
        let (t, c) = match delta_type(f.data_type()) {
            Some(t) if &t == f.data_type() => {
                if let Some(ext) = f.metadata().get(EXTENSION_TYPE_NAME_KEY) {
                    notes.push(format!(
                        "{dataset}.{}: {ext} is written as {kind}'s {} ({kind} has no such type)",
                        f.name(),
                        t
                    ));
                }
                (t, Conversion::Keep)
            }
            Some(t) => {
                if !matches!(f.data_type(), DataType::Struct(_) | DataType::List(_)) {
                    notes.push(format!(
                        "{dataset}.{}: {} is written as {kind}'s {}",
                        f.name(),
                        f.data_type(),
                        t
                    ));
                }
                (t.clone(), Conversion::Cast(t))
            }
            None => {
                notes.push(format!(
                    "{dataset}.{}: {} has no {kind} type and is written as text (string), as \
                     --format csv writes it",
                    f.name(),
                    f.data_type()
                ));
                (DataType::Utf8, Conversion::Text)
            }
        };
        let (t, c) = match (delta_names, loosened(&t)) {
            // Spark's toArrow() cannot give back a NULL struct whose fields are declared
            // non-null (pyarrow refuses the view), so a DataFrame's nested fields are nullable.
            (false, Some(l)) => (l.clone(), Conversion::Cast(l)),
            _ => (t, c),
        };
        fields.push(Field::new(f.name(), t, f.is_nullable()));
        conversions.push(c);
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
                .map_err(|e| Error::internal(format!("delta schema: {e}")));
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
            .map_err(|e| Error::internal(format!("delta schema: {e}")))
    }
}

fn convert(a: &ArrayRef, c: &Conversion, f: &Field) -> Result<ArrayRef> {
    match c {
        Conversion::Keep => Ok(a.clone()),
        Conversion::Cast(t) => arrow_cast::cast(a, t).map_err(|e| {
            Error::internal(format!(
                "column {:?}: {} to Delta's {t}: {e}",
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

/// One Parquet part of a Delta table: the dataset's batches converted to the table's schema,
/// then written by the Parquet part writer.
pub struct DeltaPart {
    table: TableSchema,
    inner: Box<ParquetPart>,
}

impl DeltaPart {
    /// Start a part for a dataset of `schema` (its name is only for messages).
    pub fn new(
        schema: &SchemaRef,
        out: CountingWriter,
        options: &ParquetOptions,
        path: &str,
    ) -> Result<Self> {
        let table = table_schema(path, schema)?;
        let inner = Box::new(ParquetPart::new(table.schema.clone(), out, options, path)?);
        Ok(DeltaPart { table, inner })
    }
}

impl PartWriter for DeltaPart {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let converted = self.table.convert(batch)?;
        self.inner.write(&converted)
    }

    fn finish(self: Box<Self>) -> Result<PartStats> {
        let DeltaPart { inner, .. } = *self;
        inner.finish()
    }

    fn abort(self: Box<Self>) {
        let DeltaPart { inner, .. } = *self;
        inner.abort()
    }
}

/// A part file of a table, as the commit adds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFile {
    /// Path relative to the table's directory.
    pub path: String,
    /// Bytes, as the part's receipt recorded them (the commit checks the file has them).
    pub bytes: u64,
    /// Rows, for the file's statistics.
    pub rows: u64,
}

/// One table commit: the table's contents become exactly `files`.
#[derive(Debug, Clone)]
pub struct TableCommit {
    /// The table's directory relative to the output root (the dataset's directory).
    pub dir: String,
    /// Every part of the export, in part order.
    pub files: Vec<TableFile>,
    /// Names the export: a commit already made for it (a run killed after committing and
    /// resumed) is found and not made twice.
    pub export_id: String,
    /// Written into the commit's metadata: source engine and position, consistency, guarantee.
    pub properties: BTreeMap<String, String>,
}

/// What [`TableCommitter::commit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCommitted {
    /// The table version that holds the export.
    pub version: u64,
    /// False when the export's commit was already there (a resumed run).
    pub made: bool,
    /// Files of the earlier version the commit removed from the table (replaced contents).
    pub removed: u64,
}

/// Makes the commit that turns an export's parts into a table version; implemented by
/// `sluice-lake` with the format's own library, so that this crate (and every crate that
/// writes files) does not link it.
#[async_trait::async_trait]
pub trait TableCommitter: Send + Sync {
    /// Commit `commit`: one atomic table version whose contents are exactly its files
    /// (whatever the table held before is removed in the same version, so `--overwrite`
    /// replaces a table in one commit and readers never see half of it).
    async fn commit(&self, commit: TableCommit) -> Result<TableCommitted>;

    /// Merge one batch of a stream's changes into the table `merge.dir` (created by the
    /// stream's snapshot): one table version in which it equals the source table as of the
    /// batch's end, carrying the application transaction `(merge.app_id, merge.through_seq)`.
    /// A batch whose `through_seq` the table's transaction already reached is not merged
    /// again (a stream killed after the table commit and run again).
    async fn merge(&self, merge: ChangeMerge) -> Result<Merged>;
}

/// One batch of changes of one table, for [`TableCommitter::merge`].
#[derive(Debug, Clone)]
pub struct ChangeMerge {
    /// The table's directory relative to the output root (the dataset's directory).
    pub dir: String,
    /// The dataset, for messages.
    pub dataset: String,
    /// The application that writes the table: the stream.
    pub app_id: String,
    /// The batch's last `_seq`: the application transaction's version after the merge.
    pub through_seq: u64,
    /// The table's key columns.
    pub key: Vec<String>,
    /// The change rows, as the change files hold them, in `_seq` order.
    pub changes: Vec<RecordBatch>,
    /// Written into the commit's metadata: the source position the table equals.
    pub properties: BTreeMap<String, String>,
    /// How the merge's files are written.
    pub parquet: ParquetOptions,
    /// Make the table when there is none (a stream started with `--initial none`); otherwise
    /// a missing table is an error (it was removed: merging into a new one would lose rows).
    pub create: bool,
}

/// What [`TableCommitter::merge`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Merged {
    /// The table version that holds the batch (`None`: no version was needed).
    pub version: Option<u64>,
    /// False when the table already held the batch (a stream run again).
    pub made: bool,
    /// Files the version added.
    pub added: u64,
    /// Files removed (rewritten without the touched keys, or emptied).
    pub removed: u64,
    /// Rows the version wrote in new files (final rows plus rewritten ones).
    pub rows_written: u64,
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
        let t = table_schema("d", &schema).unwrap();
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
        let t = table_schema("d", &schema).unwrap();
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
            let e = table_schema("public.t", &schema).unwrap_err().to_string();
            assert!(e.contains("public.t") && e.contains("--query"), "{e}");
        }
        let ok = Schema::new(vec![Field::new("Ünïcode_ok-1", DataType::Int32, true)]);
        assert!(table_schema("t", &ok).is_ok());
    }
}
