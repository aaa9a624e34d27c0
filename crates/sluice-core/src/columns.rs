//! Column builders that recycle their memory.
//!
//! Arrow's builders allocate fresh buffers for every batch and grow them by doubling. At tens of
//! megabytes per second per worker that churn, freed on another thread (the writer), leaves the
//! allocator holding as much freed memory as the batches themselves — a byte budget on batches
//! then says little about the process's resident memory. These builders instead keep plain
//! `Vec`s, hand them to Arrow without copying, and take them back when the writer returns the
//! batch ([`BatchBuilder::recycle`]), so a worker's two batches are allocated once and reused
//! for the whole run.
//!
//! Readers append native values (`push_*`), already converted from the wire format; the builder
//! knows the Arrow type. Variable-length text is validated as UTF-8 once per batch, when the
//! array is built.
//!
//! Length: about 440 lines of code plus its unit tests; appending (columns/push.rs) and handing
//! buffers to Arrow and back (columns/arrays.rs) are in sub-modules.

use crate::error::{Error, Result};
use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions, make_array};
use arrow_buffer::{BooleanBufferBuilder, Buffer, NullBuffer, i256};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, FieldRef, Fields, SchemaRef};

mod arrays;
mod push;

/// Validity bits; no buffer is produced when every value is valid.
///
/// Bits are only kept once a NULL arrives: until then a count is enough, so columns without
/// NULLs (most of them, and every NOT NULL column) pay one increment per value instead of a
/// bit append. The first NULL writes the bits of the valid values before it.
#[derive(Debug)]
struct Validity {
    bits: BooleanBufferBuilder,
    len: usize,
    nulls: usize,
}

impl Validity {
    fn new(capacity: usize) -> Self {
        Validity {
            bits: BooleanBufferBuilder::new(capacity),
            len: 0,
            nulls: 0,
        }
    }

    #[inline]
    fn push(&mut self, valid: bool) {
        if self.nulls > 0 {
            self.bits.append(valid);
        } else if !valid {
            self.bits.append_n(self.len, true);
            self.bits.append(false);
        }
        self.len += 1;
        self.nulls += usize::from(!valid);
    }

    fn len(&self) -> usize {
        self.len
    }

    fn finish(&mut self) -> Option<NullBuffer> {
        let nulls = std::mem::take(&mut self.nulls);
        self.len = 0;
        // `finish` leaves the builder empty (its memory is kept only when no NULL came).
        (nulls > 0).then(|| NullBuffer::new(self.bits.finish()))
    }
}

/// Native values of a fixed-width column.
#[derive(Debug)]
enum Values {
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    I128(Vec<i128>),
    I256(Vec<i256>),
}

macro_rules! each_values {
    ($v:expr, $x:ident => $body:expr) => {
        match $v {
            Values::I8($x) => $body,
            Values::I16($x) => $body,
            Values::I32($x) => $body,
            Values::I64($x) => $body,
            Values::U8($x) => $body,
            Values::U16($x) => $body,
            Values::U32($x) => $body,
            Values::U64($x) => $body,
            Values::F32($x) => $body,
            Values::F64($x) => $body,
            Values::I128($x) => $body,
            Values::I256($x) => $body,
        }
    };
}

impl Values {
    fn for_type(dt: &DataType, capacity: usize) -> Option<Values> {
        use DataType::*;
        Some(match dt {
            Int8 => Values::I8(Vec::with_capacity(capacity)),
            Int16 => Values::I16(Vec::with_capacity(capacity)),
            Int32 | Date32 | Time32(_) => Values::I32(Vec::with_capacity(capacity)),
            Int64 | Date64 | Time64(_) | Timestamp(..) | Duration(_) => {
                Values::I64(Vec::with_capacity(capacity))
            }
            UInt8 => Values::U8(Vec::with_capacity(capacity)),
            UInt16 => Values::U16(Vec::with_capacity(capacity)),
            UInt32 => Values::U32(Vec::with_capacity(capacity)),
            UInt64 => Values::U64(Vec::with_capacity(capacity)),
            Float32 => Values::F32(Vec::with_capacity(capacity)),
            Float64 => Values::F64(Vec::with_capacity(capacity)),
            Decimal128(..) => Values::I128(Vec::with_capacity(capacity)),
            Decimal256(..) => Values::I256(Vec::with_capacity(capacity)),
            _ => return None,
        })
    }

    fn push_default(&mut self) {
        each_values!(self, v => v.push(Default::default()))
    }

    fn take_buffer(&mut self) -> Buffer {
        each_values!(self, v => Buffer::from_vec(std::mem::take(v)))
    }

    /// Take `buffer`'s memory back if it is ours alone (else keep what we have).
    fn reclaim(&mut self, buffer: Buffer) {
        each_values!(self, v => {
            if let Ok(mut back) = buffer.into_vec() {
                back.clear();
                *v = back;
            }
        })
    }
}

/// One column's builder.
#[derive(Debug)]
pub struct ColumnBuilder {
    kind: Kind,
}

/// The builder's storage, by Arrow layout.
#[derive(Debug)]
enum Kind {
    /// Booleans.
    Bool {
        /// Value bits.
        values: BooleanBufferBuilder,
        /// Validity.
        validity: Validity,
    },
    /// Fixed-width native values (integers, floats, decimals, dates, times, timestamps).
    Fixed {
        /// The Arrow type produced.
        data_type: DataType,
        /// Values.
        values: Values,
        /// Validity.
        validity: Validity,
    },
    /// Utf8 or Binary with 32-bit offsets.
    Var {
        /// True for Utf8.
        utf8: bool,
        /// Offsets (one more than values).
        offsets: Vec<i32>,
        /// Bytes.
        data: Vec<u8>,
        /// Validity.
        validity: Validity,
    },
    /// FixedSizeBinary.
    FixedBinary {
        /// Bytes per value.
        width: usize,
        /// Bytes.
        data: Vec<u8>,
        /// Validity.
        validity: Validity,
    },
    /// A struct of child columns.
    Struct {
        /// Child fields.
        fields: Fields,
        /// Child builders.
        children: Vec<ColumnBuilder>,
        /// Validity.
        validity: Validity,
    },
    /// A list with 32-bit offsets.
    List {
        /// Item field.
        field: FieldRef,
        /// Offsets.
        offsets: Vec<i32>,
        /// Items.
        child: Box<ColumnBuilder>,
        /// Validity.
        validity: Validity,
    },
}

fn unsupported(dt: &DataType) -> Error {
    Error::internal(format!("no column builder for Arrow type {dt}"))
}

fn offsets_with_zero(capacity: usize) -> Vec<i32> {
    let mut o = Vec::with_capacity(capacity + 1);
    o.push(0);
    o
}

impl ColumnBuilder {
    /// A builder for `dt` with room for `rows` values and `bytes` of variable-length data.
    pub fn new(dt: &DataType, rows: usize, bytes: usize) -> Result<Self> {
        let kind = match dt {
            DataType::Boolean => Kind::Bool {
                values: BooleanBufferBuilder::new(rows),
                validity: Validity::new(rows),
            },
            DataType::Utf8 | DataType::Binary => Kind::Var {
                utf8: matches!(dt, DataType::Utf8),
                offsets: offsets_with_zero(rows),
                data: Vec::with_capacity(bytes),
                validity: Validity::new(rows),
            },
            DataType::FixedSizeBinary(w) => Kind::FixedBinary {
                width: *w as usize,
                data: Vec::with_capacity(rows * *w as usize),
                validity: Validity::new(rows),
            },
            DataType::Struct(fields) => Kind::Struct {
                children: fields
                    .iter()
                    .map(|f| ColumnBuilder::new(f.data_type(), rows, 0))
                    .collect::<Result<_>>()?,
                fields: fields.clone(),
                validity: Validity::new(rows),
            },
            DataType::List(field) => Kind::List {
                field: field.clone(),
                offsets: offsets_with_zero(rows),
                child: Box::new(ColumnBuilder::new(field.data_type(), rows, bytes)?),
                validity: Validity::new(rows),
            },
            other => Kind::Fixed {
                data_type: other.clone(),
                values: Values::for_type(other, rows).ok_or_else(|| unsupported(other))?,
                validity: Validity::new(rows),
            },
        };
        Ok(ColumnBuilder { kind })
    }

    /// Values appended since the last batch.
    pub fn len(&self) -> usize {
        match &self.kind {
            Kind::Bool { validity, .. }
            | Kind::Fixed { validity, .. }
            | Kind::Var { validity, .. }
            | Kind::FixedBinary { validity, .. }
            | Kind::Struct { validity, .. }
            | Kind::List { validity, .. } => validity.len(),
        }
    }

    /// True when nothing was appended since the last batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Append NULL.
    pub fn push_null(&mut self) {
        match &mut self.kind {
            Kind::Bool { values, validity } => {
                values.append(false);
                validity.push(false);
            }
            Kind::Fixed {
                values, validity, ..
            } => {
                values.push_default();
                validity.push(false);
            }
            Kind::Var {
                offsets,
                data,
                validity,
                ..
            } => {
                offsets.push(data.len() as i32);
                validity.push(false);
            }
            Kind::FixedBinary {
                width,
                data,
                validity,
            } => {
                data.resize(data.len() + *width, 0);
                validity.push(false);
            }
            Kind::Struct {
                children, validity, ..
            } => {
                children.iter_mut().for_each(ColumnBuilder::push_null);
                validity.push(false);
            }
            Kind::List {
                offsets, validity, ..
            } => {
                offsets.push(*offsets.last().unwrap_or(&0));
                validity.push(false);
            }
        }
    }

    /// Bytes of variable-length data held (text, binary; lists: their items'), for sizing.
    pub fn var_bytes(&self) -> usize {
        match &self.kind {
            Kind::Var { data, .. } => data.len(),
            Kind::List { child, .. } => child.var_bytes(),
            _ => 0,
        }
    }

    /// The list's item builder; `push_list_end` closes the list after its items were pushed.
    pub fn list_items(&mut self) -> Option<&mut ColumnBuilder> {
        match &mut self.kind {
            Kind::List { child, .. } => Some(child),
            _ => None,
        }
    }

    /// Close a list value whose items were pushed through [`Self::list_items`]. Fails when
    /// the batch's items exceed 32-bit offsets.
    pub fn push_list_end(&mut self) -> Result<()> {
        if let Kind::List {
            offsets,
            child,
            validity,
            ..
        } = &mut self.kind
        {
            let end = i32::try_from(child.len()).map_err(|_| {
                Error::data("a batch holds more than 2^31 list items; lower --batch-size")
            })?;
            offsets.push(end);
            validity.push(true);
        }
        Ok(())
    }

    /// A struct's child builders; `push_struct_valid` marks the value valid after the children
    /// were pushed.
    pub fn struct_children(&mut self) -> Option<&mut [ColumnBuilder]> {
        match &mut self.kind {
            Kind::Struct { children, .. } => Some(children),
            _ => None,
        }
    }

    /// Mark a struct value valid (its children already pushed).
    pub fn push_struct_valid(&mut self) {
        if let Kind::Struct { validity, .. } = &mut self.kind {
            validity.push(true);
        }
    }
}

/// The builders of a whole batch, with the row count and the byte budget bookkeeping.
#[derive(Debug)]
pub struct BatchBuilder {
    schema: SchemaRef,
    columns: Vec<ColumnBuilder>,
    rows: usize,
}

impl BatchBuilder {
    /// Builders for `schema`, sized for a first batch of `rows`.
    pub fn new(schema: SchemaRef, rows: usize) -> Result<Self> {
        let columns = schema
            .fields()
            .iter()
            .map(|f| ColumnBuilder::new(f.data_type(), rows, rows * 16))
            .collect::<Result<_>>()?;
        Ok(BatchBuilder {
            schema,
            columns,
            rows: 0,
        })
    }

    /// The column builders, in schema order.
    pub fn columns(&mut self) -> &mut [ColumnBuilder] {
        &mut self.columns
    }

    /// The schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Count one complete row (every column appended once).
    #[inline]
    pub fn row_done(&mut self) {
        self.rows += 1;
    }

    /// Rows since the last batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Build the batch of the rows so far; the builders keep their memory for the next one.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let arrays = self
            .columns
            .iter_mut()
            .map(ColumnBuilder::finish)
            .collect::<Result<Vec<_>>>()?;
        let rows = std::mem::take(&mut self.rows);
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?)
    }

    /// Take back the memory of a batch this builder produced (see [`ColumnBuilder::recycle`]).
    pub fn recycle(&mut self, batch: RecordBatch) {
        let columns: Vec<ArrayRef> = batch.columns().to_vec();
        drop(batch);
        self.recycle_columns(columns);
    }

    /// [`Self::recycle`] for the columns of a batch taken apart (a struct's children).
    pub fn recycle_columns(&mut self, columns: Vec<ArrayRef>) {
        for (b, a) in self.columns.iter_mut().zip(columns) {
            b.recycle(a);
        }
    }
}

/// A field for tests and adapters: `name` of `dt`, nullable.
pub fn field(name: &str, dt: DataType) -> Field {
    Field::new(name, dt, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, TimestampMicrosecondType};
    use arrow_schema::{Schema, TimeUnit};
    use std::sync::Arc;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            field("i", DataType::Int64),
            field("s", DataType::Utf8),
            field(
                "t",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ),
            field(
                "l",
                DataType::List(Arc::new(field("item", DataType::Int64))),
            ),
        ]))
    }

    fn fill(b: &mut BatchBuilder, n: i64) {
        for i in 0..n {
            let c = b.columns();
            c[0].push_i64(i).unwrap();
            if i % 3 == 0 {
                c[1].push_null()
            } else {
                c[1].push_bytes(format!("v{i}").as_bytes()).unwrap()
            }
            c[2].push_i64(i * 1_000_000).unwrap();
            let items = c[3].list_items().unwrap();
            items.push_i64(i).unwrap();
            items.push_null();
            c[3].push_list_end().unwrap();
            b.row_done();
        }
    }

    #[test]
    fn builds_and_reuses_memory() {
        let mut b = BatchBuilder::new(schema(), 16).unwrap();
        fill(&mut b, 1000);
        let batch = b.finish().unwrap();
        assert_eq!(batch.num_rows(), 1000);
        assert_eq!(batch.column(0).as_primitive::<Int64Type>().value(999), 999);
        assert!(batch.column(1).is_null(0));
        assert_eq!(batch.column(1).as_string::<i32>().value(1), "v1");
        assert_eq!(
            batch
                .column(2)
                .as_primitive::<TimestampMicrosecondType>()
                .value(2),
            2_000_000
        );
        assert_eq!(
            batch.column(2).data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
        assert_eq!(batch.column(3).as_list::<i32>().value(5).len(), 2);
        let ptr = batch.column(0).to_data().buffers()[0].as_ptr();
        b.recycle(batch);
        fill(&mut b, 10);
        let again = b.finish().unwrap();
        assert_eq!(again.num_rows(), 10);
        assert_eq!(
            again.column(0).to_data().buffers()[0].as_ptr(),
            ptr,
            "the same memory is reused"
        );
        assert_eq!(again.column(1).as_string::<i32>().value(2), "v2");
    }

    #[test]
    fn invalid_utf8_is_a_data_error() {
        let s = Arc::new(Schema::new(vec![field("s", DataType::Utf8)]));
        let mut b = BatchBuilder::new(s, 4).unwrap();
        b.columns()[0].push_bytes(&[0xff, 0xfe]).unwrap();
        b.row_done();
        let e = b.finish().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
    }
}
