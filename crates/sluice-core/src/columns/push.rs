//! Appending values: one typed `push_*` per native type, bytes for the variable-length kinds.

use super::*;

/// Typed appends for the fixed-width variants. Pushing a value of the wrong native type is a
/// bug in the adapter's type table and is reported as an internal error.
macro_rules! push_fns {
    ($($name:ident($t:ty) => $variant:ident),* $(,)?) => {$(
        impl ColumnBuilder {
            #[doc = concat!("Append a `", stringify!($t), "`.")]
            #[inline]
            pub fn $name(&mut self, v: $t) -> Result<()> {
                match &mut self.kind {
                    Kind::Fixed {
                        values: Values::$variant(values),
                        validity,
                        ..
                    } => {
                        values.push(v);
                        validity.push(true);
                        Ok(())
                    }
                    _ => Err(Error::internal(concat!(
                        "a ",
                        stringify!($t),
                        " was pushed into a column of another type"
                    ))),
                }
            }
        }
    )*};
}
push_fns! {
    push_i8(i8) => I8, push_i16(i16) => I16, push_i32(i32) => I32, push_i64(i64) => I64,
    push_u8(u8) => U8, push_u16(u16) => U16, push_u32(u32) => U32, push_u64(u64) => U64,
    push_f32(f32) => F32, push_f64(f64) => F64, push_i128(i128) => I128, push_i256(i256) => I256,
}

impl ColumnBuilder {
    /// Append a boolean.
    #[inline]
    pub fn push_bool(&mut self, v: bool) -> Result<()> {
        match &mut self.kind {
            Kind::Bool { values, validity } => {
                values.append(v);
                validity.push(true);
                Ok(())
            }
            _ => Err(Error::internal(
                "a bool was pushed into a column of another type",
            )),
        }
    }

    /// Append text or binary bytes (text is validated for the whole batch when it is built),
    /// or a FixedSizeBinary value of the right width.
    #[inline]
    pub fn push_bytes(&mut self, v: &[u8]) -> Result<()> {
        match &mut self.kind {
            Kind::Var {
                offsets,
                data,
                validity,
                ..
            } => {
                data.extend_from_slice(v);
                let end = i32::try_from(data.len()).map_err(|_| {
                    Error::data(
                        "a batch holds more than 2 GB of text or binary; lower --batch-size",
                    )
                })?;
                offsets.push(end);
                validity.push(true);
                Ok(())
            }
            Kind::FixedBinary {
                width,
                data,
                validity,
            } if v.len() == *width => {
                data.extend_from_slice(v);
                validity.push(true);
                Ok(())
            }
            Kind::FixedBinary { width, .. } => Err(Error::data(format!(
                "a value of {} bytes does not fit a fixed-size binary of {width}",
                v.len()
            ))),
            _ => Err(Error::internal(
                "bytes were pushed into a column of another type",
            )),
        }
    }
}
