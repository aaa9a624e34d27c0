//! How one source column becomes one Arrow column: the shape every adapter's type table
//! (`types.rs`) produces.
//!
//! A mapping says which Arrow type a column becomes, with which extension metadata, whether it
//! is read natively or through an SQL cast (the cast's spelling is the adapter's), whether that
//! cast is a text fallback for a type with no native mapping (listed in the report), and whether
//! the column must accept NULL whatever the source says (MySQL's zero dates become NULL).

use crate::table::ColumnDesc;
use arrow_schema::extension::{EXTENSION_TYPE_NAME_KEY, ExtensionType};
use arrow_schema::{DataType, Field};
use std::collections::HashMap;

/// How one column is exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    /// Arrow type.
    pub data_type: DataType,
    /// Arrow field metadata (extension type).
    pub metadata: HashMap<String, String>,
    /// The SQL type (or conversion) to read through, in the adapter's spelling; `None` to read
    /// natively.
    pub cast: Option<String>,
    /// True when read as text because no native mapping exists.
    pub fallback: bool,
    /// True when NULL must be allowed whatever the column says.
    pub force_nullable: bool,
}

impl Mapping {
    /// Read natively as `data_type`.
    pub fn native(data_type: DataType) -> Self {
        Mapping {
            data_type,
            metadata: HashMap::new(),
            cast: None,
            fallback: false,
            force_nullable: false,
        }
    }

    /// Read through the SQL conversion `cast` as `data_type`.
    pub fn cast(data_type: DataType, cast: &str) -> Self {
        Mapping {
            cast: Some(cast.to_string()),
            ..Self::native(data_type)
        }
    }

    /// Read as text through `cast` because the type has no native mapping (listed in the
    /// report).
    pub fn text_fallback(cast: &str) -> Self {
        Mapping {
            fallback: true,
            ..Self::cast(DataType::Utf8, cast)
        }
    }

    /// Allow NULL whatever the source column says.
    pub fn nullable(mut self) -> Self {
        self.force_nullable = true;
        self
    }

    /// Tag with a canonical Arrow extension type, with the metadata that type requires.
    pub fn ext<E: ExtensionType>(mut self, ext: E) -> Self {
        let mut field = Field::new("x", self.data_type.clone(), true);
        if field.try_with_extension_type(ext).is_ok() {
            self.metadata.extend(field.metadata().clone());
        }
        self
    }

    /// Tag with an extension name of sluice's own (no metadata).
    pub fn ext_named(mut self, name: &str) -> Self {
        self.metadata
            .insert(EXTENSION_TYPE_NAME_KEY.into(), name.into());
        self
    }

    /// The Arrow field for a column named `name`.
    pub fn field(&self, name: &str, nullable: bool) -> Field {
        Field::new(
            name,
            self.data_type.clone(),
            nullable || self.force_nullable,
        )
        .with_metadata(self.metadata.clone())
    }

    /// The column description of a column named `name` whose type the source prints as
    /// `source_type`.
    pub fn column(self, name: String, source_type: String, nullable: bool) -> ColumnDesc {
        ColumnDesc {
            field: self.field(&name, nullable),
            name,
            source_type,
            cast: self.cast,
            as_text_fallback: self.fallback,
        }
    }
}

/// The Arrow decimal holding every value of `precision` digits with `scale` after the point
/// exactly (`Decimal128` to 38 digits, `Decimal256` to 76), or `None` when none can. A scale
/// larger than the precision (`numeric(2,5)`: values below 0.001) widens the precision to it.
pub fn decimal_type(precision: u32, scale: u32) -> Option<DataType> {
    let p = precision.max(scale).max(1);
    match p {
        1..=38 => Some(DataType::Decimal128(p as u8, scale as i8)),
        39..=76 => Some(DataType::Decimal256(p as u8, scale as i8)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::extension::Json;

    #[test]
    fn decimals_by_digits() {
        assert_eq!(decimal_type(12, 2), Some(DataType::Decimal128(12, 2)));
        assert_eq!(decimal_type(2, 5), Some(DataType::Decimal128(5, 5)));
        assert_eq!(decimal_type(65, 30), Some(DataType::Decimal256(65, 30)));
        assert_eq!(decimal_type(77, 0), None);
    }

    #[test]
    fn columns_carry_cast_fallback_and_extension() {
        let c = Mapping::text_fallback("text").column("x".into(), "tsvector".into(), false);
        assert!(c.as_text_fallback);
        assert_eq!(c.cast.as_deref(), Some("text"));
        assert!(!c.field.is_nullable());
        let j = Mapping::native(DataType::Utf8)
            .ext(Json::default())
            .nullable();
        let f = j.field("j", false);
        assert!(f.is_nullable());
        assert_eq!(f.metadata()[EXTENSION_TYPE_NAME_KEY], "arrow.json");
        let n = Mapping::native(DataType::Binary).ext_named("geoarrow.wkb");
        assert_eq!(n.metadata[EXTENSION_TYPE_NAME_KEY], "geoarrow.wkb");
    }
}
