//! Handing a builder's buffers to Arrow without copying ([`ColumnBuilder::finish`]) and taking
//! them back from a batch the writer is done with ([`ColumnBuilder::recycle`]), so the next
//! batch reuses the same memory.

use super::*;

impl ColumnBuilder {
    /// Build the array of the values appended since the last batch; the builder is left empty.
    pub fn finish(&mut self) -> Result<ArrayRef> {
        let data = match &mut self.kind {
            Kind::Bool { values, validity } => {
                let len = values.len();
                ArrayData::builder(DataType::Boolean)
                    .len(len)
                    .add_buffer(values.finish().into_inner())
                    .nulls(validity.finish())
                    .build()
            }
            Kind::Fixed {
                data_type,
                values,
                validity,
            } => {
                let len = validity.len();
                ArrayData::builder(data_type.clone())
                    .len(len)
                    .add_buffer(values.take_buffer())
                    .nulls(validity.finish())
                    .build()
            }
            Kind::Var {
                utf8,
                offsets,
                data,
                validity,
            } => {
                let len = validity.len();
                let dt = if *utf8 {
                    DataType::Utf8
                } else {
                    DataType::Binary
                };
                let offs = std::mem::take(offsets);
                ArrayData::builder(dt)
                    .len(len)
                    .add_buffer(Buffer::from_vec(offs))
                    .add_buffer(Buffer::from_vec(std::mem::take(data)))
                    .nulls(validity.finish())
                    .build()
            }
            Kind::FixedBinary {
                width,
                data,
                validity,
            } => {
                let len = validity.len();
                ArrayData::builder(DataType::FixedSizeBinary(*width as i32))
                    .len(len)
                    .add_buffer(Buffer::from_vec(std::mem::take(data)))
                    .nulls(validity.finish())
                    .build()
            }
            Kind::Struct {
                fields,
                children,
                validity,
            } => {
                let len = validity.len();
                let kids = children
                    .iter_mut()
                    .map(|c| c.finish().map(|a| a.to_data()))
                    .collect::<Result<Vec<_>>>()?;
                ArrayData::builder(DataType::Struct(fields.clone()))
                    .len(len)
                    .child_data(kids)
                    .nulls(validity.finish())
                    .build()
            }
            Kind::List {
                field,
                offsets,
                child,
                validity,
            } => {
                let len = validity.len();
                let items = child.finish()?.to_data();
                let offs = std::mem::take(offsets);
                ArrayData::builder(DataType::List(field.clone()))
                    .len(len)
                    .add_buffer(Buffer::from_vec(offs))
                    .child_data(vec![items])
                    .nulls(validity.finish())
                    .build()
            }
        };
        // Restore the leading zero offset for the next batch.
        match &mut self.kind {
            Kind::Var { offsets, .. } | Kind::List { offsets, .. } => offsets.push(0),
            _ => {}
        }
        let data = data.map_err(|e| match e {
            arrow_schema::ArrowError::InvalidArgumentError(m)
                if m.contains("utf-8") || m.contains("UTF8") || m.contains("utf8") =>
            {
                Error::data(format!("text is not valid UTF-8 ({m})"))
            }
            other => Error::from(other),
        })?;
        Ok(make_array(data))
    }

    /// Take back the memory of an array this builder produced, once its reader is done with it.
    /// Buffers still shared elsewhere are left alone (the builder then allocates anew).
    pub fn recycle(&mut self, array: ArrayRef) {
        let data = array.to_data();
        drop(array);
        let (_, _, _, _, mut buffers, children) = data.into_parts();
        match &mut self.kind {
            Kind::Fixed { values, .. } => {
                if let Some(b) = buffers.pop() {
                    values.reclaim(b);
                }
            }
            Kind::Var { offsets, data, .. } => {
                if let (Some(d), Some(o)) = (buffers.pop(), buffers.pop()) {
                    if let (true, Ok(mut v)) = (offsets.len() <= 1, o.into_vec::<i32>()) {
                        v.clear();
                        v.push(0);
                        *offsets = v;
                    }
                    if let (true, Ok(mut v)) = (data.is_empty(), d.into_vec::<u8>()) {
                        v.clear();
                        *data = v;
                    }
                }
            }
            Kind::FixedBinary { data, .. } => {
                if let (Some(d), true) = (buffers.pop(), data.is_empty())
                    && let Ok(mut v) = d.into_vec::<u8>()
                {
                    v.clear();
                    *data = v;
                }
            }
            Kind::Struct {
                children: builders, ..
            } => {
                for (b, c) in builders.iter_mut().zip(children) {
                    b.recycle(make_array(c));
                }
            }
            Kind::List { offsets, child, .. } => {
                if let (Some(o), true) = (buffers.pop(), offsets.len() <= 1)
                    && let Ok(mut v) = o.into_vec::<i32>()
                {
                    v.clear();
                    v.push(0);
                    *offsets = v;
                }
                if let Some(c) = children.into_iter().next() {
                    child.recycle(make_array(c));
                }
            }
            Kind::Bool { .. } => {}
        }
    }
}
