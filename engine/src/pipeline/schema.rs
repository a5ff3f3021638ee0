//! Source schemas: the column lists a pipeline file declares and
//! `pipeline.json` pins, turned into Arrow schemas in one place, and the
//! check of a declared schema against the pinned one.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::ColumnSpec;

/// A column whose type is not an Arrow type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadColumn {
    /// Its position in the list.
    pub index: usize,
    /// Its name.
    pub name: String,
    /// The type as written.
    pub data_type: String,
    /// Arrow's complaint.
    pub message: String,
}

impl fmt::Display for BadColumn {
    /// Reads after the list's name: `source.schema[3] (column x): ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] (column {}): type \"{}\" is not an Arrow type ({}); write e.g. Int64, \
             Float64, Utf8, Timestamp(Microsecond, None)",
            self.index, self.name, self.data_type, self.message
        )
    }
}

/// The Arrow schema of `cols`; a type that does not parse is an error
/// naming the column, never a silent fallback.
pub(crate) fn schema_of(cols: &[ColumnSpec]) -> Result<SchemaRef, BadColumn> {
    let fields = cols
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let t = DataType::from_str(&c.data_type).map_err(|e| BadColumn {
                index,
                name: c.name.clone(),
                data_type: c.data_type.clone(),
                message: e.to_string(),
            })?;
            Ok(Field::new(&c.name, t, c.nullable))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

/// The column list of an Arrow schema (names, types, nullability only:
/// file metadata does not belong in a pin).
pub(crate) fn columns_of(schema: &Schema) -> Vec<ColumnSpec> {
    schema
        .fields()
        .iter()
        .map(|f| ColumnSpec {
            name: f.name().clone(),
            data_type: f.data_type().to_string(),
            nullable: f.is_nullable(),
        })
        .collect()
}

/// The first difference between a pinned schema and a declared one, if any.
pub(crate) fn schema_change(old: &Schema, new: &Schema) -> Option<String> {
    for f in old.fields() {
        match new.field_with_name(f.name()) {
            Err(_) => return Some(format!("column {} removed", f.name())),
            Ok(n) if n.data_type() != f.data_type() => {
                return Some(format!(
                    "column {}: {} -> {}",
                    f.name(),
                    f.data_type(),
                    n.data_type()
                ));
            }
            _ => {}
        }
    }
    for f in new.fields() {
        if old.field_with_name(f.name()).is_err() {
            return Some(format!("column {} added", f.name()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, t: &str) -> ColumnSpec {
        ColumnSpec {
            name: name.into(),
            data_type: t.into(),
            nullable: true,
        }
    }

    #[test]
    fn a_type_that_does_not_parse_is_named_not_replaced() {
        let e = schema_of(&[col("a", "Int64"), col("fare", "Flaot64")]).unwrap_err();
        assert_eq!((e.index, e.name.as_str()), (1, "fare"));
        let text = format!("schema{e}");
        assert!(
            text.starts_with("schema[1] (column fare): type \"Flaot64\""),
            "{text}"
        );
    }

    #[test]
    fn pins_round_trip() {
        let s = schema_of(&[col("a", "Int64"), col("t", "Timestamp(Microsecond, None)")]).unwrap();
        assert_eq!(schema_of(&columns_of(&s)).unwrap(), s);
    }
}
