//! `--format iceberg`: the Parquet parts an export wrote into a dataset's directory become one
//! snapshot of an Apache Iceberg table, registered in a catalog and committed by Apache
//! Iceberg's own Rust library (`iceberg`) — sluice writes the data files (with Iceberg's field
//! ids, `sluice_sink::columns`) and leaves table metadata, manifests, the snapshot and the
//! catalog's compare-and-swap to the library.
//!
//! Catalogs: an SQL catalog (the schema Iceberg's JDBC catalog and PyIceberg's `SqlCatalog`
//! share) in a SQLite file (`--catalog sqlite:///path/catalog.db`; without `--catalog`, the
//! file `catalog.db` at a local `--to`) or a PostgreSQL database
//! (`--catalog postgres://user@host/db`). The catalog's name is `sluice` unless the URL's
//! query says `catalog_name=…` (PyIceberg opens it as `SqlCatalog("sluice", uri=…)`).
//! Tables: namespace `--namespace`, created when missing; the table's name is the dataset's
//! last part (`public.orders` → `orders`); its location is the dataset's directory under a
//! local `--to` (object stores are refused: the library reaches them through another storage
//! stack than sluice's files, not linked here).
//!
//! One commit per dataset at the end of the run:
//! - no table: created from the first part's schema (field ids and all, so the files and the
//!   table agree; the dataset's key becomes the identifier fields), then one append of every
//!   part, whose snapshot summary carries `sluice.export-id` and the source position;
//! - the table's current snapshot carries this run's export id: a run killed after its commit
//!   and resumed does not commit twice;
//! - another export's table at the same location (`--overwrite`): the library commits appends
//!   only (it has no overwrite or delete yet), so the table is dropped from the catalog with
//!   its files (the earlier export's parts, manifests and metadata) and created again with the
//!   new parts. Between the two a reader finds no table; readers never see a mix of the two
//!   exports. A table of that name at another location is never touched.

use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, ListType, NestedField,
    NestedFieldRef, PrimitiveType, Schema as IcebergSchema, StructType, Type,
};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{
    Catalog, CatalogBuilder, ErrorKind, NamespaceIdent, TableCreation, TableIdent,
    io::LocalFsStorageFactory,
};
use iceberg_catalog_sql::{SQL_CATALOG_PROP_BIND_STYLE, SqlBindStyle, SqlCatalogBuilder};
use parquet::arrow::parquet_to_arrow_schema;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use sluice_core::error::Retry;
use sluice_core::{Error, Result};
use sluice_sink::columns::FIELD_ID_KEY;
use sluice_sink::table::{
    ChangeMerge, Merged, TableCommit, TableCommitted, TableCommitter, TableFile,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::OnceCell;

/// The snapshot summary key naming the export whose parts a snapshot added.
const EXPORT_ID: &str = "sluice.export-id";

/// The catalog's name when the URL does not give one.
const CATALOG_NAME: &str = "sluice";

/// Commits exports into Iceberg tables of one catalog, with data under a local directory.
pub struct IcebergCommitter {
    /// The catalog's URL for the SQL driver (secrets included: never printed).
    uri: String,
    /// The same, redacted, for messages.
    shown: String,
    name: String,
    bind: SqlBindStyle,
    namespace: NamespaceIdent,
    root: PathBuf,
    catalog: OnceCell<Arc<dyn Catalog>>,
}

impl IcebergCommitter {
    /// A committer into `catalog` (`None`: a SQLite catalog file `catalog.db` in `to`), with
    /// tables in `namespace` and data in the local directory `to`. Refuses what cannot work
    /// before anything is read: a missing namespace, an unknown catalog scheme, an object
    /// store `--to`.
    pub fn new(catalog: Option<&str>, namespace: Option<&str>, to: &str) -> Result<Self> {
        let namespace = namespace.filter(|n| !n.trim().is_empty()).ok_or_else(|| {
            Error::config(
                "--format iceberg needs --namespace NAME: the catalog namespace the tables are \
                 created in (created when missing).",
            )
        })?;
        let dir = match to.strip_prefix("file://") {
            Some(p) => p,
            None if to.contains("://") => {
                return Err(Error::config(format!(
                    "--format iceberg writes tables under a local --to in this release; {} is \
                     an object store, which the Iceberg library reaches through a storage stack \
                     sluice does not link: use a local --to, or --format delta for S3.",
                    sluice_core::redact::redact_url(to)
                )));
            }
            None => to,
        };
        let root =
            std::path::absolute(dir).map_err(|e| Error::config(format!("--to {dir}: {e}")))?;
        let given = catalog
            .map(str::to_string)
            .unwrap_or_else(|| format!("sqlite://{}", root.join("catalog.db").display()));
        let shown = sluice_core::redact::redact_url(&given);
        let (uri, name) = take_name(&given);
        let bind = if uri.starts_with("sqlite:") {
            SqlBindStyle::QMark
        } else if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
            SqlBindStyle::DollarNumeric
        } else {
            return Err(Error::config(format!(
                "--catalog {shown}: not a catalog sluice can use. Give an SQL catalog: \
                 sqlite:///path/catalog.db (a file, created when missing) or \
                 postgres://user@host/db (the tables of Iceberg's JDBC catalog)."
            )));
        };
        let uri = match uri.strip_prefix("sqlite://") {
            Some(path) if !path.contains("mode=") => {
                let sep = if path.contains('?') { '&' } else { '?' };
                format!("sqlite://{path}{sep}mode=rwc")
            }
            _ => uri,
        };
        Ok(IcebergCommitter {
            uri,
            shown,
            name,
            bind,
            namespace: NamespaceIdent::from_strs(namespace.split('.'))
                .map_err(|e| Error::config(format!("--namespace {namespace}: {e}")))?,
            root,
            catalog: OnceCell::new(),
        })
    }

    /// The catalog, connected on first use (its namespace created when missing).
    async fn catalog(&self) -> Result<&Arc<dyn Catalog>> {
        self.catalog
            .get_or_try_init(|| async {
                let mut props = HashMap::new();
                props.insert("uri".to_string(), self.uri.clone());
                props.insert(
                    "warehouse".to_string(),
                    format!("file://{}", self.root.display()),
                );
                props.insert(
                    SQL_CATALOG_PROP_BIND_STYLE.to_string(),
                    self.bind.to_string(),
                );
                let catalog = SqlCatalogBuilder::default()
                    .with_storage_factory(Arc::new(LocalFsStorageFactory))
                    .load(self.name.clone(), props)
                    .await
                    .map_err(|e| self.error("cannot open the catalog", e))?;
                if !catalog
                    .namespace_exists(&self.namespace)
                    .await
                    .map_err(|e| self.error("cannot read the catalog", e))?
                {
                    catalog
                        .create_namespace(&self.namespace, HashMap::new())
                        .await
                        .map_err(|e| self.error("cannot create the namespace", e))?;
                }
                Ok(Arc::new(catalog) as Arc<dyn Catalog>)
            })
            .await
    }

    fn error(&self, what: &str, e: iceberg::Error) -> Error {
        let retry = if e.retryable() || e.kind() == ErrorKind::CatalogCommitConflicts {
            Retry::Transient
        } else {
            Retry::Permanent
        };
        Error::destination(
            retry,
            format!("Iceberg catalog {}: {what}: {e}", self.shown),
        )
    }

    /// [`read_parts`] of `commit`, off the runtime's threads.
    async fn read_parts(
        &self,
        dir: &Path,
        commit: &TableCommit,
    ) -> Result<(IcebergSchema, Vec<DataFile>)> {
        let (dir, files, key) = (dir.to_path_buf(), commit.files.clone(), commit.key.clone());
        tokio::task::spawn_blocking(move || read_parts(&dir, &files, &key))
            .await
            .map_err(|e| Error::internal(format!("reading the parts' footers: {e}")))?
    }

    fn ident(&self, dataset: &str) -> TableIdent {
        let name = dataset.rsplit('.').next().unwrap_or(dataset);
        TableIdent::new(self.namespace.clone(), name.to_string())
    }

    /// `sluice doctor`'s check: the catalog opens, its namespace exists or can be made; the
    /// line to print.
    pub async fn probe(&self) -> Result<String> {
        let catalog = self.catalog().await?;
        let tables = catalog
            .list_tables(&self.namespace)
            .await
            .map_err(|e| self.error("cannot list the namespace's tables", e))?;
        Ok(format!(
            "Iceberg catalog {} (catalog name {}): namespace {} holds {} table(s)",
            self.shown,
            self.name,
            self.namespace.join("."),
            tables.len()
        ))
    }
}

/// The URL without its `catalog_name` query parameter, and that name (default `sluice`).
fn take_name(url: &str) -> (String, String) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), CATALOG_NAME.to_string());
    };
    let mut name = CATALOG_NAME.to_string();
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.strip_prefix("catalog_name=") {
            Some(n) => {
                name = n.to_string();
                false
            }
            None => true,
        })
        .collect();
    if rest.is_empty() {
        (base.to_string(), name)
    } else {
        (format!("{base}?{}", rest.join("&")), name)
    }
}

/// The Iceberg schema of a part's Arrow schema (field ids from the Parquet schema), with the
/// key's columns as identifier fields.
fn iceberg_schema(arrow: &arrow_schema::Schema, key: &[String]) -> Result<IcebergSchema> {
    let fields = arrow
        .fields()
        .iter()
        .map(|f| nested(f))
        .collect::<Result<Vec<NestedFieldRef>>>()?;
    let ids: Vec<i32> = key
        .iter()
        .filter_map(|k| fields.iter().find(|f| &f.name == k && f.required))
        .map(|f| f.id)
        .collect();
    // A key is identifier fields only when every column of it is (required, primitive).
    let ids = if ids.len() == key.len() {
        ids
    } else {
        Vec::new()
    };
    IcebergSchema::builder()
        .with_fields(fields)
        .with_identifier_field_ids(ids)
        .build()
        .map_err(|e| Error::internal(format!("Iceberg schema: {e}")))
}

fn field_id(f: &arrow_schema::Field) -> Result<i32> {
    f.metadata()
        .get(FIELD_ID_KEY)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            Error::data(format!(
                "column {:?} has no Iceberg field id in the part's Parquet schema: the part was \
                 not written for an Iceberg table; export again with --overwrite",
                f.name()
            ))
        })
}

fn nested(f: &arrow_schema::Field) -> Result<NestedFieldRef> {
    let id = field_id(f)?;
    let t = iceberg_type(f)?;
    Ok(Arc::new(if f.is_nullable() {
        NestedField::optional(id, f.name(), t)
    } else {
        NestedField::required(id, f.name(), t)
    }))
}

fn iceberg_type(f: &arrow_schema::Field) -> Result<Type> {
    use PrimitiveType as P;
    use arrow_schema::DataType as D;
    let uuid = f
        .metadata()
        .get(arrow_schema::extension::EXTENSION_TYPE_NAME_KEY)
        .is_some_and(|e| e == "arrow.uuid");
    Ok(Type::Primitive(match f.data_type() {
        D::Boolean => P::Boolean,
        D::Int32 => P::Int,
        D::Int64 => P::Long,
        D::Float32 => P::Float,
        D::Float64 => P::Double,
        D::Decimal128(p, s) => P::Decimal {
            precision: u32::from(*p),
            scale: u32::try_from(*s)
                .map_err(|_| Error::data(format!("column {:?}: a negative scale", f.name())))?,
        },
        D::Date32 => P::Date,
        D::Time64(_) => P::Time,
        D::Timestamp(_, Some(_)) => P::Timestamptz,
        D::Timestamp(_, None) => P::Timestamp,
        D::Utf8 | D::LargeUtf8 | D::Utf8View => P::String,
        D::Binary | D::LargeBinary | D::BinaryView => P::Binary,
        D::FixedSizeBinary(16) if uuid => P::Uuid,
        D::FixedSizeBinary(n) => P::Fixed(*n as u64),
        D::Struct(fields) => {
            return Ok(Type::Struct(StructType::new(
                fields
                    .iter()
                    .map(|f| nested(f))
                    .collect::<Result<Vec<_>>>()?,
            )));
        }
        D::List(item) | D::LargeList(item) => {
            let element = NestedField::list_element(
                field_id(item)?,
                iceberg_type(item)?,
                !item.is_nullable(),
            );
            return Ok(Type::List(ListType::new(Arc::new(element))));
        }
        other => {
            return Err(Error::internal(format!(
                "column {:?}: {other} in an Iceberg part",
                f.name()
            )));
        }
    }))
}

/// A part's footer, read from the local file.
fn footer(path: &Path) -> Result<ParquetMetaData> {
    let file =
        std::fs::File::open(path).map_err(|e| Error::data(format!("{}: {e}", path.display())))?;
    ParquetMetaDataReader::new()
        .parse_and_finish(&file)
        .map_err(|e| Error::data(format!("{}: not a Parquet file: {e}", path.display())))
}

/// The Iceberg type whose single-value serialization is the Parquet statistics' bytes of
/// `physical` (little-endian integers, UTF-8 text): the types a column's bounds are given for.
/// Decimals (big-endian in Iceberg, little-endian integers in Parquet for small precisions),
/// floats (NaN) and the rest get none — bounds are optional, a reader then reads the file.
fn bounded(t: &PrimitiveType, physical: parquet::basic::Type) -> bool {
    use PrimitiveType as P;
    use parquet::basic::Type as Phys;
    matches!(
        (t, physical),
        (P::Int | P::Date, Phys::INT32)
            | (
                P::Long | P::Time | P::Timestamp | P::Timestamptz,
                Phys::INT64
            )
            | (P::String, Phys::BYTE_ARRAY)
    )
}

/// `into` widened to hold `value` (the smaller when `low`, else the larger).
fn widen(into: &mut HashMap<i32, Datum>, id: i32, value: Datum, low: bool) {
    use std::cmp::Ordering::{Greater, Less};
    let keep = into.get(&id).is_some_and(|d| {
        d.partial_cmp(&value)
            .is_some_and(|o| o == if low { Less } else { Greater })
            || d == &value
    });
    if !keep {
        into.insert(id, value);
    }
}

/// The table's schema (from the first part's footer) and every part's data file entry, each
/// footer read once; a part whose size is not its receipt's is refused (changed after the run
/// wrote it). Blocking file reads: run off the runtime's threads.
fn read_parts(
    dir: &Path,
    files: &[TableFile],
    key: &[String],
) -> Result<(IcebergSchema, Vec<DataFile>)> {
    let mut footers = Vec::with_capacity(files.len());
    for file in files {
        let path = dir.join(&file.path);
        let size = std::fs::metadata(&path)
            .map_err(|e| Error::data(format!("{}: {e}", path.display())))?
            .len();
        if size != file.bytes {
            return Err(Error::data(format!(
                "{}: {size} bytes where the part's receipt says {}: the file was changed after \
                 the run wrote it; use --overwrite to export again",
                path.display(),
                file.bytes
            )));
        }
        footers.push((footer(&path)?, path));
    }
    let (first, first_path) = footers.first().ok_or_else(|| {
        Error::internal(format!("{}: a table commit without parts", dir.display()))
    })?;
    let file_meta = first.file_metadata();
    let arrow = parquet_to_arrow_schema(file_meta.schema_descr(), file_meta.key_value_metadata())
        .map_err(|e| Error::data(format!("{}: {e}", first_path.display())))?;
    let schema = iceberg_schema(&arrow, key)?;
    let entries = footers
        .iter()
        .zip(files)
        .map(|((meta, path), file)| data_file(path, file, meta, &schema))
        .collect::<Result<Vec<DataFile>>>()?;
    Ok((schema, entries))
}

/// The data file entry of one part: its size checked against the receipt, its row count,
/// and per column (by field id) its bytes, values and nulls from the footer, and for integer,
/// date, time, timestamp and text columns its lower and upper bounds (so that readers skip
/// the files a filter on them excludes: each part of a key-range export holds one range).
fn data_file(
    path: &Path,
    file: &TableFile,
    meta: &ParquetMetaData,
    schema: &IcebergSchema,
) -> Result<DataFile> {
    let mut sizes: HashMap<i32, u64> = HashMap::new();
    let mut values: HashMap<i32, u64> = HashMap::new();
    let mut nulls: HashMap<i32, u64> = HashMap::new();
    let mut lower: HashMap<i32, Datum> = HashMap::new();
    let mut upper: HashMap<i32, Datum> = HashMap::new();
    // A column with a row group without bounds has none for the file.
    let mut unbounded: std::collections::HashSet<i32> = std::collections::HashSet::new();
    for rg in meta.row_groups() {
        for c in rg.columns() {
            let descr = c.column_descr();
            // Top-level columns only: a nested leaf's counts are not its field's.
            if descr.path().parts().len() != 1 {
                continue;
            }
            let info = descr.self_type().get_basic_info();
            if !info.has_id() {
                continue;
            }
            let id = info.id();
            *sizes.entry(id).or_default() += c.compressed_size().max(0) as u64;
            *values.entry(id).or_default() += c.num_values().max(0) as u64;
            if let Some(n) = c.statistics().and_then(|s| s.null_count_opt()) {
                *nulls.entry(id).or_default() += n;
            }
            let t = schema
                .field_by_id(id)
                .and_then(|f| f.field_type.as_primitive_type())
                .filter(|t| bounded(t, descr.physical_type()));
            let (Some(t), Some(stats)) = (t, c.statistics()) else {
                unbounded.insert(id);
                continue;
            };
            let datum =
                |bytes: Option<&[u8]>| bytes.and_then(|b| Datum::try_from_bytes(b, t.clone()).ok());
            match (datum(stats.min_bytes_opt()), datum(stats.max_bytes_opt())) {
                (Some(lo), Some(hi)) => {
                    widen(&mut lower, id, lo, true);
                    widen(&mut upper, id, hi, false);
                }
                // A row group of NULLs only has no bounds, and narrows nothing.
                _ if stats.null_count_opt() == Some(rg.num_rows().max(0) as u64) => {}
                _ => {
                    unbounded.insert(id);
                }
            }
        }
    }
    DataFileBuilder::default()
        .content(DataContentType::Data)
        .file_path(format!("file://{}", path.display()))
        .file_format(DataFileFormat::Parquet)
        .record_count(file.rows)
        .file_size_in_bytes(file.bytes)
        .column_sizes(sizes)
        .value_counts(values)
        .null_value_counts(nulls)
        .lower_bounds(
            lower
                .into_iter()
                .filter(|(id, _)| !unbounded.contains(id))
                .collect(),
        )
        .upper_bounds(
            upper
                .into_iter()
                .filter(|(id, _)| !unbounded.contains(id))
                .collect(),
        )
        .build()
        .map_err(|e| Error::internal(format!("{}: data file entry: {e}", path.display())))
}

#[async_trait::async_trait]
impl TableCommitter for IcebergCommitter {
    async fn check(&self, datasets: &[String]) -> Result<()> {
        let mut seen: HashMap<String, &String> = HashMap::new();
        for d in datasets {
            let table = self.ident(d).name().to_string();
            if let Some(other) = seen.insert(table.clone(), d) {
                return Err(Error::config(format!(
                    "{other} and {d} would both be the Iceberg table {}.{table} (a table is \
                     named after its dataset's last part): export them to different \
                     --namespace values in two runs, or rename one with --query NAME=SELECT ….",
                    self.namespace.join(".")
                )));
            }
        }
        self.catalog().await.map(|_| ())
    }

    async fn merge(&self, merge: ChangeMerge) -> Result<Merged> {
        Err(Error::config(format!(
            "{}: merging changes into an Iceberg table needs a commit that removes or deletes \
             rows, which the Iceberg library cannot make yet (it commits appends only): stream \
             with --format delta, or --format parquet change files.",
            merge.dataset
        )))
    }

    async fn commit(&self, commit: TableCommit) -> Result<TableCommitted> {
        let catalog = self.catalog().await?;
        let ident = self.ident(&commit.dataset);
        let dir = self.root.join(&commit.dir);
        let location = format!("file://{}", dir.display());
        let shown = format!("{}.{}", self.namespace.join("."), ident.name());
        let mut removed = 0;
        let mut parts = None;
        if catalog
            .table_exists(&ident)
            .await
            .map_err(|e| self.error("cannot read the catalog", e))?
        {
            let table = catalog
                .load_table(&ident)
                .await
                .map_err(|e| self.error(&format!("cannot load table {shown}"), e))?;
            let metadata = table.metadata();
            if let Some(s) = metadata.current_snapshot()
                && s.summary().additional_properties.get(EXPORT_ID) == Some(&commit.export_id)
            {
                return Ok(TableCommitted {
                    version: metadata.last_sequence_number().max(0) as u64,
                    made: false,
                    removed: 0,
                });
            }
            if metadata.location().trim_end_matches('/') != location {
                return Err(Error::config(format!(
                    "the catalog's table {shown} lives at {}, not at this export's {location}: \
                     sluice replaces only tables it made at its own output. Choose another \
                     --namespace, or drop that table first.",
                    metadata.location()
                )));
            }
            // The parts are read before the table they replace is dropped.
            parts = Some(self.read_parts(&dir, &commit).await?);
            removed = metadata
                .current_snapshot()
                .and_then(|s| s.summary().additional_properties.get("total-data-files"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            // Dropped with its files (data, manifests, metadata): no snapshot of the new table
            // will reference them, and nothing else may.
            catalog
                .purge_table(&ident)
                .await
                .map_err(|e| self.error(&format!("cannot drop table {shown}"), e))?;
        }
        let (schema, files) = match parts {
            Some(p) => p,
            None => self.read_parts(&dir, &commit).await?,
        };
        let mut properties: HashMap<String, String> = commit
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let creation = TableCreation::builder()
            .name(ident.name().to_string())
            .location(location.clone())
            .schema(schema.clone())
            .properties(properties.clone())
            .build();
        let table = catalog
            .create_table(&self.namespace, creation)
            .await
            .map_err(|e| self.error(&format!("cannot create table {shown}"), e))?;
        if table.metadata().current_schema().as_struct() != schema.as_struct() {
            return Err(Error::internal(format!(
                "table {shown}: the catalog numbered the columns otherwise than the parts"
            )));
        }
        properties.insert(EXPORT_ID.to_string(), commit.export_id.clone());
        let tx = Transaction::new(&table);
        let tx = tx
            .fast_append()
            .add_data_files(files)
            .set_snapshot_properties(properties)
            .apply(tx)
            .map_err(|e| self.error(&format!("cannot append to table {shown}"), e))?;
        let table = tx
            .commit(catalog.as_ref())
            .await
            .map_err(|e| self.error(&format!("cannot commit table {shown}"), e))?;
        Ok(TableCommitted {
            version: table.metadata().last_sequence_number().max(0) as u64,
            made: true,
            removed,
        })
    }
}
