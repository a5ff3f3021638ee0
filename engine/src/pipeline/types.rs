//! Type names: how a person writes a column's type (in `source.schema` and
//! `source.schema_hints`) and how Sluice prints one (in `show`, errors and
//! `pipeline.json`).
//!
//! SQL names, as Spark, DuckDB and Trino spell them: `bigint`, `double`,
//! `string`, `timestamp`, `decimal(10,2)`, `array<string>`,
//! `struct<a: int, b: string>`. Arrow's own names (`Int64`,
//! `Timestamp(Microsecond, None)`, `Utf8View`) are still read, so pipeline
//! files and pins written before keep working; everything Sluice prints
//! uses the SQL name. The precision of a timestamp is written as SQL's
//! fractional digits: `timestamp` holds microseconds (Spark's and DuckDB's
//! timestamp), `timestamp(0)` seconds, `timestamp(3)` milliseconds,
//! `timestamp(9)` nanoseconds; `timestamptz` is a timestamp in UTC.

use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields, TimeUnit};

/// The SQL names this module reads, for error messages.
pub const EXAMPLES: &str = "boolean, int, bigint, double, string, binary, date, timestamp, \
                            timestamp(3), timestamptz, decimal(10,2), array<string>, \
                            struct<a: int, b: string>";

/// The type `text` names: a SQL name (any case), else an Arrow name.
pub fn parse_type(text: &str) -> Result<DataType, String> {
    let mut p = Parser {
        s: text.trim(),
        pos: 0,
    };
    match p.ty() {
        Ok(t) if p.rest().is_empty() => Ok(t),
        sql => DataType::from_str(text.trim()).map_err(|_| match sql {
            Err(e) => format!("{e}; write a SQL type such as {EXAMPLES}"),
            Ok(_) => format!(
                "unexpected \"{}\" after the type; write a SQL type such as {EXAMPLES}",
                p.rest()
            ),
        }),
    }
}

/// The SQL name of `t`, as Sluice prints it. String and binary types of
/// every Arrow layout print as `string` and `binary`; a type SQL has no
/// name for prints as Arrow's.
pub fn type_name(t: &DataType) -> String {
    use DataType::*;
    match t {
        Boolean => "boolean".into(),
        Int8 => "tinyint".into(),
        Int16 => "smallint".into(),
        Int32 => "int".into(),
        Int64 => "bigint".into(),
        UInt8 => "utinyint".into(),
        UInt16 => "usmallint".into(),
        UInt32 => "uinteger".into(),
        UInt64 => "ubigint".into(),
        Float32 => "float".into(),
        Float64 => "double".into(),
        Utf8 | LargeUtf8 | Utf8View => "string".into(),
        Binary | LargeBinary | BinaryView => "binary".into(),
        Date32 => "date".into(),
        Time64(TimeUnit::Microsecond) => "time".into(),
        Timestamp(unit, tz) => {
            let base = match tz.as_deref() {
                None => "timestamp",
                Some("UTC" | "+00:00") => "timestamptz",
                Some(_) => return t.to_string(),
            };
            match unit {
                TimeUnit::Microsecond => base.to_string(),
                u => format!("{base}({})", digits(*u)),
            }
        }
        Decimal128(p, s) | Decimal256(p, s) => format!("decimal({p},{s})"),
        List(f) | LargeList(f) | ListView(f) | LargeListView(f) | FixedSizeList(f, _) => {
            format!("array<{}>", type_name(f.data_type()))
        }
        // For a person only (`show`, errors): a pin of these keeps
        // Arrow's name, as `pipeline.json` must read back the exact type.
        Map(entries, _) => match entries.data_type() {
            Struct(kv) if kv.len() == 2 => format!(
                "map<{}, {}>",
                type_name(kv[0].data_type()),
                type_name(kv[1].data_type())
            ),
            _ => t.to_string(),
        },
        Interval(_) => "interval".into(),
        Struct(fields) => format!(
            "struct<{}>",
            fields
                .iter()
                .map(|f| format!("{}: {}", field_name(f.name()), type_name(f.data_type())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Null => "null".into(),
        other => other.to_string(),
    }
}

/// The name `pipeline.json` records for `t`: the SQL name where it reads
/// back as exactly `t`, else Arrow's (a pin must keep the exact type).
pub fn pin_name(t: &DataType) -> String {
    let name = type_name(t);
    if parse_type(&name).as_ref() == Ok(t) {
        name
    } else {
        t.to_string()
    }
}

fn digits(u: TimeUnit) -> u8 {
    match u {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 3,
        TimeUnit::Microsecond => 6,
        TimeUnit::Nanosecond => 9,
    }
}

fn field_name(name: &str) -> String {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        name.to_string()
    } else {
        format!("`{}`", name.replace('`', "``"))
    }
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        self.s[self.pos..].trim_start()
    }

    fn skip_ws(&mut self) {
        self.pos = self.s.len() - self.s[self.pos..].trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.s[self.pos..].starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char, what: &str) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected '{c}' {what}"))
        }
    }

    fn word(&mut self) -> String {
        self.skip_ws();
        let rest = &self.s[self.pos..];
        let n = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        self.pos += n;
        rest[..n].to_ascii_lowercase()
    }

    fn number(&mut self, what: &str) -> Result<u64, String> {
        self.skip_ws();
        let rest = &self.s[self.pos..];
        let n = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let v = rest[..n]
            .parse()
            .map_err(|_| format!("expected a number for {what}"))?;
        self.pos += n;
        Ok(v)
    }

    /// Optional `(digits)` after a timestamp.
    fn unit(&mut self) -> Result<TimeUnit, String> {
        if !self.eat('(') {
            return Ok(TimeUnit::Microsecond);
        }
        let d = self.number("the timestamp's fractional digits")?;
        self.expect(')', "after the timestamp's fractional digits")?;
        Ok(match d {
            0 => TimeUnit::Second,
            3 => TimeUnit::Millisecond,
            6 => TimeUnit::Microsecond,
            9 => TimeUnit::Nanosecond,
            d => {
                return Err(format!(
                    "timestamp({d}): a timestamp holds 0 (seconds), 3 (milliseconds), 6 \
                     (microseconds, the default) or 9 (nanoseconds) fractional digits"
                ));
            }
        })
    }

    /// `with time zone` / `without time zone` after a timestamp, if there.
    fn zone(&mut self) -> Result<Option<bool>, String> {
        let save = self.pos;
        let w = self.word();
        if w != "with" && w != "without" {
            self.pos = save;
            return Ok(None);
        }
        if self.word() != "time" || self.word() != "zone" {
            return Err(format!("expected \"{w} time zone\""));
        }
        Ok(Some(w == "with"))
    }

    fn ty(&mut self) -> Result<DataType, String> {
        let w = self.word();
        use DataType::*;
        Ok(match w.as_str() {
            "boolean" | "bool" => Boolean,
            "tinyint" | "byte" => Int8,
            "smallint" | "short" => Int16,
            "int" | "integer" => Int32,
            "bigint" | "long" => Int64,
            "utinyint" => UInt8,
            "usmallint" => UInt16,
            "uinteger" | "uint" => UInt32,
            "ubigint" => UInt64,
            "float" | "real" => Float32,
            "double" => {
                let save = self.pos;
                if self.word() != "precision" {
                    self.pos = save;
                }
                Float64
            }
            "string" | "text" | "varchar" | "char" => {
                // varchar(n): the length is not enforced (as in Spark and
                // DuckDB, whose strings have none).
                if self.eat('(') {
                    self.number("the length")?;
                    self.expect(')', "after the length")?;
                }
                Utf8
            }
            "binary" | "varbinary" | "blob" | "bytea" => Binary,
            "date" => Date32,
            "time" => Time64(TimeUnit::Microsecond),
            "timestamp" | "timestamp_ntz" | "datetime" => {
                let unit = self.unit()?;
                match self.zone()? {
                    Some(true) => Timestamp(unit, Some("UTC".into())),
                    _ => Timestamp(unit, None),
                }
            }
            "timestamptz" | "timestamp_ltz" => Timestamp(self.unit()?, Some("UTC".into())),
            "decimal" | "numeric" => self.decimal()?,
            "array" | "list" => {
                self.expect('<', "after array")?;
                let item = self.ty()?;
                self.expect('>', "to close array<...>")?;
                List(Arc::new(Field::new_list_field(item, true)))
            }
            "struct" => self.struct_type()?,
            "" => return Err("no type name".into()),
            other => return Err(format!("unknown type \"{other}\"")),
        })
    }

    /// What follows `decimal`: optional `(precision[, scale])`, Spark's
    /// and Hive's `(10,0)` when absent; 128-bit up to 38 digits, else 256.
    fn decimal(&mut self) -> Result<DataType, String> {
        let (p, s) = if self.eat('(') {
            let p = self.number("the decimal's precision")?;
            let s = if self.eat(',') {
                self.number("the decimal's scale")?
            } else {
                0
            };
            self.expect(')', "after the decimal's precision and scale")?;
            (p, s)
        } else {
            // Spark's and Hive's default.
            (10, 0)
        };
        if p == 0 || p > 76 || s > p {
            return Err(format!(
                "decimal({p},{s}): the precision is 1 to 76 digits and the scale at \
                 most the precision"
            ));
        }
        if p <= 38 {
            Ok(DataType::Decimal128(p as u8, s as i8))
        } else {
            Ok(DataType::Decimal256(p as u8, s as i8))
        }
    }

    /// What follows `struct`: `<name: type, ...>`, every field nullable.
    fn struct_type(&mut self) -> Result<DataType, String> {
        self.expect('<', "after struct")?;
        let mut fields = Vec::new();
        loop {
            let name = self.field_name()?;
            self.eat(':');
            let t = self.ty()?;
            fields.push(Field::new(name, t, true));
            if !self.eat(',') {
                break;
            }
        }
        self.expect('>', "to close struct<...>")?;
        Ok(DataType::Struct(Fields::from(fields)))
    }

    fn field_name(&mut self) -> Result<String, String> {
        self.skip_ws();
        if self.eat('`') {
            let mut name = String::new();
            loop {
                let rest = &self.s[self.pos..];
                match rest.find('`') {
                    None => return Err("unclosed ` in a struct field name".into()),
                    Some(i) => {
                        name.push_str(&rest[..i]);
                        self.pos += i + 1;
                        if self.s[self.pos..].starts_with('`') {
                            name.push('`');
                            self.pos += 1;
                        } else {
                            return Ok(name);
                        }
                    }
                }
            }
        }
        let save = self.pos;
        let w = self.word();
        if w.is_empty() {
            return Err("expected a struct field name".into());
        }
        // Keep the name's case as written.
        Ok(self.s[save..self.pos].trim().to_string())
    }
}

/// Whether a CSV column can be read as `t`: CSV holds text, and its
/// reader parses numbers, decimals, booleans, dates, times, timestamps
/// and text; nested and binary types it cannot.
pub fn csv_readable(t: &DataType) -> bool {
    use DataType::*;
    match t {
        Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float16
        | Float32 | Float64 | Decimal32(..) | Decimal64(..) | Decimal128(..) | Decimal256(..)
        | Date32 | Date64 | Timestamp(..) | Utf8 | Utf8View | Null => true,
        Time32(u) => matches!(u, TimeUnit::Second | TimeUnit::Millisecond),
        Time64(u) => matches!(u, TimeUnit::Microsecond | TimeUnit::Nanosecond),
        Dictionary(k, v) => k.is_integer() && **v == Utf8,
        _ => false,
    }
}

/// The refusal of type `t` for a CSV column: what to use instead.
pub fn not_csv_readable(t: &DataType) -> String {
    format!(
        "a CSV column holds text and cannot be read as {}: use string (and parse it in \
         query.sql), or a number, decimal, boolean, date, time or timestamp type",
        type_name(t)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use DataType::*;

    #[test]
    fn sql_names_read_as_their_arrow_types() {
        let us = TimeUnit::Microsecond;
        for (text, t) in [
            ("bigint", Int64),
            ("BIGINT", Int64),
            ("int", Int32),
            ("integer", Int32),
            ("smallint", Int16),
            ("tinyint", Int8),
            ("double", Float64),
            ("double precision", Float64),
            ("float", Float32),
            ("string", Utf8),
            ("varchar(20)", Utf8),
            ("boolean", Boolean),
            ("date", Date32),
            ("binary", Binary),
            ("timestamp", Timestamp(us, None)),
            ("timestamp(3)", Timestamp(TimeUnit::Millisecond, None)),
            ("timestamp(0)", Timestamp(TimeUnit::Second, None)),
            ("timestamp(9)", Timestamp(TimeUnit::Nanosecond, None)),
            ("timestamptz", Timestamp(us, Some("UTC".into()))),
            (
                "timestamp with time zone",
                Timestamp(us, Some("UTC".into())),
            ),
            ("timestamp without time zone", Timestamp(us, None)),
            ("decimal(10,2)", Decimal128(10, 2)),
            ("DECIMAL(10, 2)", Decimal128(10, 2)),
            ("decimal", Decimal128(10, 0)),
            ("decimal(50,4)", Decimal256(50, 4)),
            (
                "array<string>",
                List(Arc::new(Field::new_list_field(Utf8, true))),
            ),
            (
                "struct<a: int, `b c`: array<double>>",
                Struct(Fields::from(vec![
                    Field::new("a", Int32, true),
                    Field::new(
                        "b c",
                        List(Arc::new(Field::new_list_field(Float64, true))),
                        true,
                    ),
                ])),
            ),
            // Arrow's names, as pipeline files and pins wrote them before.
            ("Int64", Int64),
            ("Int8", Int8),
            ("Utf8View", Utf8View),
            ("Timestamp(Microsecond, None)", Timestamp(us, None)),
        ] {
            assert_eq!(parse_type(text), Ok(t), "{text}");
        }
    }

    #[test]
    fn a_wrong_name_says_what_to_write() {
        for bad in [
            "bigjnt",
            "timestamp(4)",
            "decimal(80,2)",
            "decimal(4,6)",
            "array<int",
            "int int",
        ] {
            let e = parse_type(bad).unwrap_err();
            assert!(
                e.contains("bigint") || e.contains("fractional digits") || e.contains("precision"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn printed_names_read_back_as_the_same_type() {
        let types = [
            Boolean,
            Int8,
            Int16,
            Int32,
            Int64,
            UInt8,
            UInt16,
            UInt32,
            UInt64,
            Float32,
            Float64,
            Utf8,
            Binary,
            Date32,
            Time64(TimeUnit::Microsecond),
            Timestamp(TimeUnit::Second, None),
            Timestamp(TimeUnit::Millisecond, None),
            Timestamp(TimeUnit::Microsecond, None),
            Timestamp(TimeUnit::Nanosecond, None),
            Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            Decimal128(10, 2),
            Decimal256(60, 10),
            List(Arc::new(Field::new_list_field(Int64, true))),
            Struct(Fields::from(vec![Field::new("x y", Utf8, true)])),
        ];
        for t in types {
            let name = type_name(&t);
            assert_eq!(parse_type(&name), Ok(t.clone()), "{name}");
            assert_eq!(pin_name(&t), name);
        }
        // One name for every layout of text; the pin keeps the layout.
        assert_eq!(type_name(&Utf8View), "string");
        assert_eq!(pin_name(&Utf8View), "Utf8View");
        assert_eq!(parse_type(&pin_name(&Utf8View)), Ok(Utf8View));
        let paris = Timestamp(TimeUnit::Second, Some("Europe/Paris".into()));
        assert_eq!(parse_type(&pin_name(&paris)), Ok(paris));
        // Types `show` printed in Arrow's words (a Parquet map or interval
        // column added under add-columns): SQL names for a person, and
        // pins that still read back exactly.
        let map = Map(
            Arc::new(Field::new(
                "key_value",
                Struct(Fields::from(vec![
                    Field::new("key", Utf8, false),
                    Field::new("value", Int32, true),
                ])),
                false,
            )),
            false,
        );
        let interval = Interval(datafusion::arrow::datatypes::IntervalUnit::DayTime);
        assert_eq!(type_name(&map), "map<string, int>");
        assert_eq!(type_name(&interval), "interval");
        for t in [map, interval] {
            assert_eq!(parse_type(&pin_name(&t)), Ok(t.clone()), "{t}");
        }
    }
}
