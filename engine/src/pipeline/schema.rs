//! Source schemas: the column lists a pipeline file declares and
//! `pipeline.json` pins, turned into Arrow schemas in one place, and the
//! check of a declared schema against the pinned one.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::ColumnSpec;
use super::types::{parse_type, pin_name, type_name};

/// A column whose type does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadColumn {
    /// Its position in the list.
    pub index: usize,
    /// Its name.
    pub name: String,
    /// The type as written.
    pub data_type: String,
    /// What is wrong, and what to write.
    pub message: String,
}

impl fmt::Display for BadColumn {
    /// Reads after the list's name: `source.schema[3] (column x): ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] (column {}): type \"{}\": {}",
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
            let t = parse_type(&c.data_type).map_err(|message| BadColumn {
                index,
                name: c.name.clone(),
                data_type: c.data_type.clone(),
                message,
            })?;
            Ok(Field::new(&c.name, t, c.nullable))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

/// The column list of an Arrow schema (names, types, nullability only:
/// file metadata does not belong in a pin), types by their SQL names where
/// those read back exactly.
pub(crate) fn columns_of(schema: &Schema) -> Vec<ColumnSpec> {
    schema
        .fields()
        .iter()
        .map(|f| ColumnSpec {
            name: f.name().clone(),
            data_type: pin_name(f.data_type()),
            nullable: f.is_nullable(),
        })
        .collect()
}

/// The names of `of`'s columns that `other` lacks, in `of`'s order.
pub(crate) fn lacking<'a>(of: &'a Schema, other: &Schema) -> Vec<&'a str> {
    of.fields()
        .iter()
        .filter(|f| other.field_with_name(f.name()).is_err())
        .map(|f| f.name().as_str())
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
                    type_name(f.data_type()),
                    type_name(n.data_type())
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

/// How one input file's columns differ from the pinned schema, where
/// reading it with the pinned schema would lose data or invent nulls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Drift {
    /// Pinned columns the file does not have, each with the file's column
    /// of the same name in another case, if there is one (renamed?).
    pub missing: Vec<(String, Option<String>)>,
    /// Columns of the file that are not pinned.
    pub added: Vec<String>,
    /// Columns whose type in the file does not cast to the pinned type
    /// without loss: (name, pinned, in the file).
    pub retyped: Vec<(String, DataType, DataType)>,
    /// CSV: the file's pinned columns, in the file's order, when that is
    /// not the pinned order (a CSV file is read by position).
    pub reordered: Option<Vec<String>>,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (name, other) in &self.missing {
            parts.push(match other {
                Some(o) => format!("column {name} is missing (the file has {o}: renamed?)"),
                None => format!("column {name} is missing"),
            });
        }
        for (name, pinned, found) in &self.retyped {
            parts.push(format!(
                "column {name} is {} in the file, pinned {} (the cast would lose data)",
                type_name(found),
                type_name(pinned)
            ));
        }
        for name in &self.added {
            parts.push(format!("column {name} is new"));
        }
        if let Some(order) = &self.reordered {
            parts.push(format!(
                "the columns are in another order ({}) than pinned",
                order.join(", ")
            ));
        }
        f.write_str(&parts.join("; "))
    }
}

/// What to compare of a file's inferred schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DriftCheck {
    /// Compare types too (Parquet, JSON), not only names (CSV, whose types
    /// are a property of each value).
    pub types: bool,
    /// A pinned column the file lacks reads as null by design (JSON omits
    /// keys whose value is null).
    pub absent_is_null: bool,
    /// The order of the columns matters (CSV is read by position).
    pub order: bool,
    /// The reader parses text into a pinned decimal, date or timestamp
    /// (JSON: `"2024-01-01T00:10:00"` into a column declared or hinted
    /// `timestamp`); a value that does not parse is a bad row.
    pub reads_text: bool,
    /// The pinned types are a table's (a Delta table's log types its
    /// columns): a file's timestamps finer than the table's unit read cut
    /// to it, as the table's readers cut them.
    pub table_units: bool,
}

/// Whether a reader that parses text (JSON's) reads a string value into
/// `t`: the types JSON inference never gives, so only a declared or hinted
/// column has them. (Text in a column of inferred numbers stays drift: the
/// schema-change policy decides, `rescue` keeps the text.)
fn parsed_from_text(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Timestamp(..)
            | DataType::Date32
            | DataType::Date64
            | DataType::Decimal128(..)
            | DataType::Decimal256(..)
    )
}

/// How `file` differs from `pinned`, if it does in a way that matters.
/// `user_typed`: the pinned columns whose type the pipeline file gives
/// (`source.schema`, or `schema_hints`): a reader that parses values
/// (`check.reads_text`, JSON) reads the file's values into that type, and
/// a value that does not fit is a bad row, not a schema change.
pub(crate) fn drift(
    pinned: &Schema,
    file: &Schema,
    check: DriftCheck,
    user_typed: &[String],
) -> Option<Drift> {
    let mut d = Drift::default();
    for p in pinned.fields() {
        match file.field_with_name(p.name()) {
            Ok(f) => {
                let parsed = check.reads_text
                    && (user_typed.iter().any(|n| n == p.name())
                        || matches!(
                            f.data_type(),
                            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                        ) && parsed_from_text(p.data_type()));
                let cut = check.table_units && cuts_to_unit(f.data_type(), p.data_type());
                if check.types && !casts_losslessly(f.data_type(), p.data_type()) && !parsed && !cut
                {
                    d.retyped.push((
                        p.name().clone(),
                        p.data_type().clone(),
                        f.data_type().clone(),
                    ));
                }
            }
            Err(_) if check.absent_is_null => {}
            Err(_) => {
                let other = file
                    .fields()
                    .iter()
                    .find(|f| f.name().eq_ignore_ascii_case(p.name()))
                    .map(|f| f.name().clone());
                d.missing.push((p.name().clone(), other));
            }
        }
    }
    for f in file.fields() {
        if pinned.field_with_name(f.name()).is_err() {
            d.added.push(f.name().clone());
        }
    }
    if check.order {
        let in_file: Vec<String> = file
            .fields()
            .iter()
            .filter(|f| pinned.field_with_name(f.name()).is_ok())
            .map(|f| f.name().clone())
            .collect();
        let in_pin: Vec<String> = pinned
            .fields()
            .iter()
            .filter(|p| file.field_with_name(p.name()).is_ok())
            .map(|p| p.name().clone())
            .collect();
        if in_file != in_pin {
            d.reordered = Some(in_file);
        }
    }
    (d != Drift::default()).then_some(d)
}

/// The type a text source's inferred column is pinned as: a timestamp
/// inferred in seconds or milliseconds (the first values happened to have
/// no finer digits) is pinned in microseconds, so a later value with
/// finer digits is read exactly, not truncated (`00:00:02.999` read as
/// `00:00:02`). Microseconds is what Spark and DuckDB hold; finer digits
/// than that are truncated, as they truncate them.
pub(crate) fn text_pin(t: &DataType) -> DataType {
    match t {
        DataType::Timestamp(TimeUnit::Second | TimeUnit::Millisecond, tz) => {
            DataType::Timestamp(TimeUnit::Microsecond, tz.clone())
        }
        other => other.clone(),
    }
}

/// Whether `from` is a timestamp finer than `to` (same zone, or both
/// zoned), read as `to` by cutting the finer digits; looks into lists,
/// structs and maps.
fn cuts_to_unit(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    match (from, to) {
        (Timestamp(_, fz), Timestamp(_, tz)) => fz.is_some() == tz.is_some(),
        (List(f) | LargeList(f), List(t) | LargeList(t)) => {
            cuts_to_unit(f.data_type(), t.data_type())
                || casts_losslessly(f.data_type(), t.data_type())
        }
        _ => false,
    }
}

/// Whether a value of type `from` reads as `to` without loss: the same
/// type, a wider integer or float, an integer as a float, text in another
/// encoding, a number, boolean, date or time as text, a coarser timestamp
/// as a finer one, lists, structs and maps of such, or a column that is
/// null throughout this file.
pub(crate) fn casts_losslessly(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    fn int_rank(t: &DataType) -> Option<(bool, u8)> {
        Some(match t {
            Int8 => (true, 1),
            Int16 => (true, 2),
            Int32 => (true, 4),
            Int64 => (true, 8),
            UInt8 => (false, 1),
            UInt16 => (false, 2),
            UInt32 => (false, 4),
            UInt64 => (false, 8),
            _ => return None,
        })
    }
    fn unit_rank(u: &datafusion::arrow::datatypes::TimeUnit) -> u8 {
        use datafusion::arrow::datatypes::TimeUnit::*;
        match u {
            Second => 0,
            Millisecond => 1,
            Microsecond => 2,
            Nanosecond => 3,
        }
    }
    if from == to || *from == Null {
        return true;
    }
    if let Dictionary(_, value) = from {
        return casts_losslessly(value, to);
    }
    match (from, to) {
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => true,
        // Any number, boolean, date or time reads as its text (as Spark and
        // DuckDB take them into a string column).
        (f, Utf8 | LargeUtf8 | Utf8View)
            if f.is_numeric()
                || matches!(
                    f,
                    Boolean | Date32 | Date64 | Timestamp(..) | Time32(_) | Time64(_)
                ) =>
        {
            true
        }
        (Float16, Float32 | Float64) | (Float32, Float64) => true,
        (f, Float32 | Float64) if int_rank(f).is_some() => true,
        (f, t) if int_rank(f).is_some() && int_rank(t).is_some() => {
            let ((fs, fw), (ts, tw)) = (int_rank(f).unwrap(), int_rank(t).unwrap());
            (fs == ts && fw <= tw) || (!fs && ts && fw < tw)
        }
        // Zoned timestamps are instants: another zone reads as the same
        // instant.
        (Timestamp(fu, fz), Timestamp(tu, tz)) => {
            (fz == tz || (fz.is_some() && tz.is_some())) && unit_rank(fu) <= unit_rank(tu)
        }
        // Lists whose values read losslessly, whatever their writer named
        // the element field (`element`, `item`).
        (List(f) | LargeList(f), List(t) | LargeList(t)) => {
            casts_losslessly(f.data_type(), t.data_type())
        }
        // Structs field by field (by name, in the same order), whatever
        // nullability their writer declared.
        (Struct(f), Struct(t)) => {
            f.len() == t.len()
                && f.iter().zip(t.iter()).all(|(a, b)| {
                    a.name() == b.name() && casts_losslessly(a.data_type(), b.data_type())
                })
        }
        // Maps whose keys and values read losslessly, whatever their writer
        // named the entries (`key_value`, `entries`) and their fields.
        (Map(f, fs), Map(t, ts)) if fs == ts => match (f.data_type(), t.data_type()) {
            (Struct(a), Struct(b)) if a.len() == 2 && b.len() == 2 => {
                casts_losslessly(a[0].data_type(), b[0].data_type())
                    && casts_losslessly(a[1].data_type(), b[1].data_type())
            }
            _ => false,
        },
        (Date32, Date64 | Timestamp(_, None)) => true,
        _ => false,
    }
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
    fn maps_and_structs_cast_losslessly_whatever_their_parts_are_named() {
        use datafusion::arrow::datatypes::{Field, Fields};
        let map = |entries: &str, k: &str, v: DataType| {
            DataType::Map(
                Arc::new(Field::new(
                    entries,
                    DataType::Struct(Fields::from(vec![
                        Field::new(k, DataType::Utf8, false),
                        Field::new("value", v, true),
                    ])),
                    false,
                )),
                false,
            )
        };
        assert!(casts_losslessly(
            &map("entries", "keys", DataType::Int32),
            &map("key_value", "key", DataType::Int64)
        ));
        assert!(!casts_losslessly(
            &map("entries", "key", DataType::Int64),
            &map("key_value", "key", DataType::Int32)
        ));
        let st = |name: &str, nullable: bool| {
            DataType::Struct(Fields::from(vec![Field::new(
                name,
                DataType::Int32,
                nullable,
            )]))
        };
        assert!(casts_losslessly(&st("x", false), &st("x", true)));
        assert!(!casts_losslessly(&st("x", true), &st("y", true)));
    }

    #[test]
    fn lists_cast_losslessly_whatever_their_element_is_named() {
        use datafusion::arrow::datatypes::Field;
        let list = |name: &str, t: DataType| DataType::List(Arc::new(Field::new(name, t, true)));
        assert!(casts_losslessly(
            &list("element", DataType::Int64),
            &list("item", DataType::Int64)
        ));
        assert!(casts_losslessly(
            &list("element", DataType::Int32),
            &list("item", DataType::Int64)
        ));
        assert!(!casts_losslessly(
            &list("element", DataType::Int64),
            &list("item", DataType::Int32)
        ));
        let tz = |z: &str| DataType::Timestamp(TimeUnit::Microsecond, Some(z.into()));
        assert!(casts_losslessly(&tz("America/New_York"), &tz("UTC")));
        assert!(!casts_losslessly(
            &DataType::Timestamp(TimeUnit::Microsecond, None),
            &tz("UTC")
        ));
    }

    #[test]
    fn a_type_that_does_not_parse_is_named_not_replaced() {
        let e = schema_of(&[col("a", "Int64"), col("fare", "duoble")]).unwrap_err();
        assert_eq!((e.index, e.name.as_str()), (1, "fare"));
        let text = format!("schema{e}");
        assert!(
            text.starts_with("schema[1] (column fare): type \"duoble\": unknown type")
                && text.contains("double"),
            "{text}"
        );
    }

    fn schema(cols: &[(&str, DataType)]) -> Schema {
        Schema::new(
            cols.iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn drift_names_missing_renamed_added_and_lossy_columns() {
        use DataType::*;
        let pinned = schema(&[
            ("PULocationID", Int64),
            ("passenger_count", Int64),
            ("fare_amount", Float64),
            (
                "t",
                Timestamp(datafusion::arrow::datatypes::TimeUnit::Microsecond, None),
            ),
        ]);
        let all = DriftCheck {
            types: true,
            absent_is_null: false,
            order: false,
            reads_text: false,
            table_units: false,
        };
        // Wider or equal types, and an all-null column, read as pinned.
        let fine = schema(&[
            ("PULocationID", Int32),
            ("passenger_count", Null),
            ("fare_amount", Int64),
            (
                "t",
                Timestamp(datafusion::arrow::datatypes::TimeUnit::Millisecond, None),
            ),
        ]);
        assert_eq!(drift(&pinned, &fine, all, &[]), None);
        let bad = schema(&[
            ("pulocationid", Int64),
            ("passenger_count", Float64),
            (
                "t",
                Timestamp(datafusion::arrow::datatypes::TimeUnit::Nanosecond, None),
            ),
            ("tip", Float64),
        ]);
        let d = drift(&pinned, &bad, all, &[]).unwrap();
        assert_eq!(
            d.missing,
            [
                ("PULocationID".to_string(), Some("pulocationid".to_string())),
                ("fare_amount".to_string(), None)
            ]
        );
        assert_eq!(d.added, ["pulocationid", "tip"]);
        assert_eq!(
            d.retyped.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
            ["passenger_count", "t"]
        );
        let text = d.to_string();
        assert!(
            text.contains("column passenger_count is double in the file, pinned bigint"),
            "{text}"
        );
        assert!(text.contains("renamed?"), "{text}");
        // Names only (CSV): types are not compared; JSON omits null keys.
        let names = DriftCheck {
            types: false,
            absent_is_null: false,
            order: false,
            reads_text: false,
            table_units: false,
        };
        assert_eq!(drift(&pinned, &bad, names, &[]).unwrap().retyped, []);
        let json = DriftCheck {
            types: true,
            absent_is_null: true,
            order: false,
            reads_text: false,
            table_units: false,
        };
        assert_eq!(drift(&pinned, &bad, json, &[]).unwrap().missing, []);
        assert!(!casts_losslessly(&Int64, &Int32));
        assert!(!casts_losslessly(&Utf8, &Int64));
        assert!(casts_losslessly(&UInt32, &Int64));
        assert!(!casts_losslessly(&UInt64, &Int64));
        // The review's case: numbers into a column pinned as text (from a
        // JSON column null in the first file) stopped the pipeline.
        assert!(casts_losslessly(&Int64, &Utf8));
        assert!(casts_losslessly(&Float64, &Utf8View));
        assert!(casts_losslessly(&Boolean, &Utf8));
        assert!(!casts_losslessly(&Float64, &Int64));
    }

    #[test]
    fn pins_round_trip() {
        let s = schema_of(&[col("a", "Int64"), col("t", "Timestamp(Microsecond, None)")]).unwrap();
        assert_eq!(schema_of(&columns_of(&s)).unwrap(), s);
    }
}
