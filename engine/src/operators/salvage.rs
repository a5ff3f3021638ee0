//! Row-level reading of a CSV or JSON Lines file that the scan could not
//! read whole (`on_bad_row = "quarantine" | "null"`). Clean files never
//! come here: a task scans its files with DataFusion, and only a file that
//! fails is read again line by line, so bad rows cost nothing until there
//! are some.
//!
//! What counts as a bad row: a value that does not parse as its column's
//! type, a line with too many or too few fields, invalid UTF-8, a line that
//! is not a JSON object. Under `quarantine` the row is left out and
//! recorded (line number, raw text, reason); under `null` (Spark's
//! PERMISSIVE) each bad field becomes null and the row is kept (a line with
//! too few fields gets nulls, one with too many loses the extra ones; a
//! JSON line that does not parse at all has no fields to keep and is
//! quarantined either way).

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, PrimitiveArray, RecordBatch, StringArray,
};
use datafusion::arrow::compute::kernels::cast_utils::parse_decimal;
use datafusion::arrow::compute::{CastOptions, cast_with_options, filter_record_batch};
use datafusion::arrow::datatypes::{
    DataType, Decimal128Type, Decimal256Type, DecimalType, SchemaRef,
};
use datafusion::arrow::json::ReaderBuilder;

use crate::pipeline::BadRowPolicy;

/// One row set aside, as written to the quarantine.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BadRow {
    /// The source key.
    pub key: String,
    /// 1-based line number in the (decompressed) file.
    pub line: u64,
    /// The line as it was (lossily decoded if not UTF-8).
    pub raw: String,
    /// What is wrong with it.
    pub reason: String,
}

/// What a row-level read gave.
#[derive(Debug)]
pub(super) struct Salvaged {
    /// The rows kept, in the pinned schema.
    pub batch: RecordBatch,
    /// The rows set aside (`quarantine`, or JSON lines with no fields).
    pub bad: Vec<BadRow>,
    /// Fields made null (`null`).
    pub nulled: u64,
    /// Per kept row: its raw text if fields of it were made null.
    pub corrupt: Vec<Option<String>>,
}

fn trimmed(raw: &[u8]) -> String {
    let end = raw
        .iter()
        .rposition(|b| *b != b'\n' && *b != b'\r')
        .map_or(0, |i| i + 1);
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Read CSV `text` row by row against `schema` (by position; the header,
/// if any, is skipped: its names were checked before).
pub(super) fn csv(
    key: &str,
    text: &[u8],
    schema: &SchemaRef,
    header: bool,
    delimiter: u8,
    policy: BadRowPolicy,
) -> Result<Salvaged, String> {
    let mut read = csv_records(key, text, schema.fields().len(), header, delimiter, policy)?;
    read.field_names(schema);
    typed(key, read, schema, policy)
}

/// The rows of a CSV file as text, before typing: the fields of each row
/// kept (per column), each kept row's line and raw text, and the rows set
/// aside for their shape or encoding.
struct TextRows {
    cols: Vec<Vec<Option<String>>>,
    rows: Vec<(u64, String)>,
    /// Per row: kept with fields made null for its shape or encoding.
    flawed: Vec<bool>,
    bad: Vec<BadRow>,
    nulled: u64,
}

impl TextRows {
    /// Name the columns in reasons given by position.
    fn field_names(&mut self, schema: &SchemaRef) {
        for b in &mut self.bad {
            for (c, f) in schema.fields().iter().enumerate() {
                b.reason = b
                    .reason
                    .replace(&format!("column #{c}:"), &format!("column {}:", f.name()));
            }
        }
    }
}

/// CSV records, each with where it starts: its byte offset and (1-based)
/// line.
struct Records {
    records: Vec<::csv::ByteRecord>,
    starts: Vec<usize>,
    lines: Vec<u64>,
}

/// The records of CSV `text` (any number of fields each), placed where
/// each one's text starts.
fn records(text: &[u8], delimiter: u8) -> Result<Records, String> {
    let mut rdr = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .delimiter(delimiter)
        .flexible(true)
        .from_reader(text);
    let mut starts: Vec<usize> = Vec::new();
    let mut lines: Vec<u64> = Vec::new();
    let mut records = Vec::new();
    for rec in rdr.byte_records() {
        let rec = rec.map_err(|e| format!("not CSV: {e}"))?;
        let pos = rec.position();
        let mut start = pos.map_or(0, |p| p.byte() as usize);
        let mut line = pos.map_or(1, ::csv::Position::line);
        // A record after blank lines, or after a CRLF line end, is placed
        // where the previous one ended: its line and raw text start past
        // those line ends.
        while let Some(b @ (b'\r' | b'\n')) = text.get(start) {
            line += u64::from(*b == b'\n');
            start += 1;
        }
        starts.push(start);
        lines.push(line);
        records.push(rec);
    }
    Ok(Records {
        records,
        starts,
        lines,
    })
}

/// Split CSV `text` into rows of `ncols` text fields; a row with another
/// number of fields or invalid UTF-8 is set aside (`quarantine`) or kept
/// with those fields null (`null`).
fn csv_records(
    key: &str,
    text: &[u8],
    ncols: usize,
    header: bool,
    delimiter: u8,
    policy: BadRowPolicy,
) -> Result<TextRows, String> {
    let Records {
        records,
        starts,
        lines,
    } = records(text, delimiter)?;
    let mut out = TextRows {
        cols: vec![Vec::new(); ncols],
        rows: Vec::new(),
        flawed: Vec::new(),
        bad: Vec::new(),
        nulled: 0,
    };
    let skip = usize::from(header && !records.is_empty());
    for i in skip..records.len() {
        let rec = &records[i];
        if rec.len() == 1 && rec[0].is_empty() {
            continue; // a blank line
        }
        let end = starts.get(i + 1).copied().unwrap_or(text.len());
        let raw = trimmed(&text[starts[i]..end]);
        let line = lines[i];
        let mut reasons = Vec::new();
        if rec.len() != ncols {
            let fields = if rec.len() == 1 { "field" } else { "fields" };
            reasons.push(format!("{} {fields}, expected {ncols}", rec.len()));
        }
        let fields: Vec<Option<String>> = (0..ncols)
            .map(|c| match rec.get(c) {
                None | Some(b"") => None,
                Some(bytes) => match std::str::from_utf8(bytes) {
                    Ok(s) => Some(s.to_string()),
                    Err(_) => {
                        reasons.push(format!("column #{c}: invalid UTF-8"));
                        None
                    }
                },
            })
            .collect();
        if !reasons.is_empty() && policy == BadRowPolicy::Quarantine {
            out.bad.push(BadRow {
                key: key.to_string(),
                line,
                raw,
                reason: reasons.join("; "),
            });
            continue;
        }
        // Kept (null policy): its undecodable and missing fields are null.
        out.nulled += reasons.iter().filter(|r| r.ends_with("UTF-8")).count() as u64;
        out.nulled += ncols.saturating_sub(rec.len()) as u64;
        for (c, v) in fields.into_iter().enumerate() {
            out.cols[c].push(v);
        }
        out.rows.push((line, raw));
        out.flawed.push(!reasons.is_empty());
    }
    Ok(out)
}

/// Type the text rows: each column cast to its pinned type; a value the
/// cast turns into null does not parse as the type, and its row is set
/// aside (`quarantine`) or kept with the field null (`null`).
fn typed(
    key: &str,
    read: TextRows,
    schema: &SchemaRef,
    policy: BadRowPolicy,
) -> Result<Salvaged, String> {
    let TextRows {
        cols,
        rows,
        flawed,
        mut bad,
        mut nulled,
    } = read;
    let safe = CastOptions {
        safe: true,
        ..Default::default()
    };
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(cols.len());
    let mut row_reasons: Vec<Vec<String>> = vec![Vec::new(); rows.len()];
    for (c, values) in cols.iter().enumerate() {
        let field = schema.field(c);
        let text_col = StringArray::from(values.clone());
        let typed = match field.data_type() {
            DataType::Decimal128(p, sc) => decimals::<Decimal128Type>(values, *p, *sc)
                .map_err(|e| format!("column {}: {e}", field.name()))?,
            DataType::Decimal256(p, sc) => decimals::<Decimal256Type>(values, *p, *sc)
                .map_err(|e| format!("column {}: {e}", field.name()))?,
            other => cast_with_options(&text_col, other, &safe)
                .map_err(|e| format!("column {}: {e}", field.name()))?,
        };
        for (r, v) in values.iter().enumerate() {
            if let Some(v) = v
                && typed.is_null(r)
            {
                row_reasons[r].push(not_of_type("column", field, v));
            }
        }
        arrays.push(typed);
    }
    let all = RecordBatch::try_new(schema.clone(), arrays).map_err(|e| e.to_string())?;
    let keep: Vec<bool> = row_reasons
        .iter()
        .map(|r| r.is_empty() || policy == BadRowPolicy::Null)
        .collect();
    let corrupt: Vec<Option<String>> = (0..rows.len())
        .filter(|r| keep[*r])
        .map(|r| (flawed[r] || !row_reasons[r].is_empty()).then(|| rows[r].1.clone()))
        .collect();
    for (r, reasons) in row_reasons.into_iter().enumerate() {
        if reasons.is_empty() {
            continue;
        }
        if policy == BadRowPolicy::Null {
            nulled += reasons.len() as u64;
        } else {
            let (line, raw) = rows[r].clone();
            bad.push(BadRow {
                key: key.to_string(),
                line,
                raw,
                reason: reasons.join("; "),
            });
        }
    }
    let batch = filter_record_batch(&all, &BooleanArray::from(keep)).map_err(|e| e.to_string())?;
    bad.sort_by_key(|b| b.line);
    Ok(Salvaged {
        batch,
        bad,
        nulled,
        corrupt,
    })
}

/// Text `values` as decimals of precision `p` and scale `s`, parsed as the
/// CSV reader parses them (`1e2` is 100), not as a cast from text would
/// (which refuses exponents); a value that does not parse is null.
fn decimals<T: DecimalType>(
    values: &[Option<String>],
    p: u8,
    s: i8,
) -> Result<ArrayRef, datafusion::arrow::error::ArrowError> {
    let parsed: PrimitiveArray<T> = values
        .iter()
        .map(|v| v.as_deref().and_then(|v| parse_decimal::<T>(v, p, s).ok()))
        .collect();
    Ok(Arc::new(parsed.with_precision_and_scale(p, s)?))
}

/// Read JSON Lines `text` line by line against `schema`.
pub(super) fn jsonl(
    key: &str,
    text: &[u8],
    schema: &SchemaRef,
    policy: BadRowPolicy,
) -> Result<Salvaged, String> {
    let mut good: Vec<RecordBatch> = Vec::new();
    let mut corrupt = Vec::new();
    let mut bad = Vec::new();
    let mut nulled = 0u64;
    let decode = |line: &[u8]| -> Result<Option<RecordBatch>, String> {
        // JSON numbers and booleans in a text column are taken as written,
        // as the file reader's read-apart path takes them (and Spark and
        // DuckDB do).
        let mut d = ReaderBuilder::new(schema.clone())
            .with_coerce_primitive(true)
            .build_decoder()
            .map_err(|e| e.to_string())?;
        d.decode(line).map_err(|e| e.to_string())?;
        d.flush().map_err(|e| e.to_string())
    };
    for (i, raw_line) in text.split(|b| *b == b'\n').enumerate() {
        let line = i as u64 + 1;
        if raw_line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let raw = trimmed(raw_line);
        let reason = match std::str::from_utf8(raw_line) {
            Err(_) => "invalid UTF-8".to_string(),
            Ok(_) => match decode(raw_line) {
                Ok(Some(b)) if b.num_rows() == 1 => {
                    good.push(b);
                    corrupt.push(None);
                    continue;
                }
                Ok(_) => "not one JSON object".to_string(),
                Err(e) => match serde_json::from_slice::<serde_json::Value>(raw_line) {
                    Err(json) => not_json(&json),
                    Ok(serde_json::Value::Object(_)) => e,
                    Ok(_) => "not a JSON object".to_string(),
                },
            },
        };
        let fields = bad_fields(raw_line, schema, &decode);
        if policy == BadRowPolicy::Null
            && let Some((b, n)) = fields
                .as_ref()
                .and_then(|f| f.row.clone().map(|b| (b, f.bad.len())))
        {
            nulled += n as u64;
            good.push(b);
            corrupt.push(Some(raw));
            continue;
        }
        // Say which fields, with the SQL type each is not.
        let reason = match fields {
            Some(f) if !f.bad.is_empty() => f.bad.join("; "),
            _ => reason,
        };
        bad.push(BadRow {
            key: key.to_string(),
            line,
            raw,
            reason,
        });
    }
    let batch =
        datafusion::arrow::compute::concat_batches(schema, &good).map_err(|e| e.to_string())?;
    Ok(Salvaged {
        batch,
        bad,
        nulled,
        corrupt,
    })
}

/// Decodes one JSON line into a one-row batch.
type Decode<'a> = dyn Fn(&[u8]) -> Result<Option<RecordBatch>, String> + 'a;

/// A JSON line whose object parses: each field that does not decode as
/// its column's type (`field fare: "abc" is not decimal(10,2)`), and the
/// row with those fields made null (if it then decodes).
struct BadFields {
    bad: Vec<String>,
    row: Option<RecordBatch>,
}

fn bad_fields(raw: &[u8], schema: &SchemaRef, decode: &Decode) -> Option<BadFields> {
    let serde_json::Value::Object(mut map) = serde_json::from_slice(raw).ok()? else {
        return None;
    };
    let mut bad = Vec::new();
    for f in schema.fields() {
        let Some(v) = map.get(f.name()) else {
            continue;
        };
        let alone = serde_json::json!({ f.name(): v }).to_string();
        if decode(alone.as_bytes()).is_err() {
            let written = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            bad.push(not_of_type("field", f, &written));
            map.insert(f.name().clone(), serde_json::Value::Null);
        }
    }
    let fixed = serde_json::Value::Object(map).to_string();
    let row = decode(fixed.as_bytes())
        .ok()
        .flatten()
        .filter(|b| b.num_rows() == 1);
    Some(BadFields { bad, row })
}

/// `column fare: "abc" is not decimal(10,2)`: the SQL type name, as
/// `show` prints it.
fn not_of_type(what: &str, field: &datafusion::arrow::datatypes::Field, value: &str) -> String {
    let ty = crate::pipeline::types::type_name(field.data_type());
    format!("{what} {}: \"{value}\" is not {ty}", field.name())
}

/// A line that is not JSON at all: serde's reason and the column.
fn not_json(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let what = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(w, _)| w);
    format!("not valid JSON: {what} at column {}", e.column())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Decimal128Array;
    use datafusion::arrow::datatypes::{Field, Schema};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("price", DataType::Float64, true),
        ]))
    }

    #[test]
    fn csv_rows_of_each_kind_of_bad_are_named_with_their_line() {
        let text = b"id,name,price\n1,a,1.5\nx,b,2.0\n3,c\n4,d,4.0,extra\n5,\"e\",abc\n6,\xff,6.0\n7,g,7.5";
        let s = csv(
            "k.csv",
            text,
            &schema(),
            true,
            b',',
            BadRowPolicy::Quarantine,
        )
        .unwrap();
        assert_eq!(s.batch.num_rows(), 2); // lines 2 and 8
        let lines: Vec<u64> = s.bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, [3, 4, 5, 6, 7]);
        assert!(
            s.bad[0].reason.contains("column id: \"x\" is not bigint"),
            "{:?}",
            s.bad[0]
        );
        assert!(
            s.bad[1].reason.contains("2 fields, expected 3"),
            "{:?}",
            s.bad[1]
        );
        assert!(
            s.bad[2].reason.contains("4 fields, expected 3"),
            "{:?}",
            s.bad[2]
        );
        assert!(s.bad[3].reason.contains("price"), "{:?}", s.bad[3]);
        assert!(s.bad[4].reason.contains("invalid UTF-8"), "{:?}", s.bad[4]);
        assert_eq!(s.bad[0].raw, "x,b,2.0");

        let n = csv("k.csv", text, &schema(), true, b',', BadRowPolicy::Null).unwrap();
        assert_eq!(n.batch.num_rows(), 7);
        assert!(n.bad.is_empty());
        // x, the missing price, abc, the invalid name.
        assert_eq!(n.nulled, 4);
        // Lines 3 to 7 were repaired (the extra field dropped counts too).
        let corrupt: Vec<&str> = n.corrupt.iter().flatten().map(String::as_str).collect();
        assert_eq!(corrupt.len(), 5);
        assert_eq!(corrupt[0], "x,b,2.0");
        assert_eq!(corrupt[2], "4,d,4.0,extra");
        assert_eq!(n.corrupt.len(), n.batch.num_rows());
    }

    #[test]
    fn jsonl_bad_lines_are_named_and_null_keeps_what_parses() {
        let text = b"{\"id\":1,\"name\":\"a\",\"price\":1.5}\n{\"id\":\"x\",\"name\":\"b\"}\nnot json\n{\"id\":4}\n";
        let q = jsonl("k.jsonl", text, &schema(), BadRowPolicy::Quarantine).unwrap();
        assert_eq!(q.batch.num_rows(), 2);
        assert_eq!(q.bad.iter().map(|b| b.line).collect::<Vec<_>>(), [2, 3]);
        // Reasons a person reads: the field and its SQL type (not Arrow's
        // "Json error: whilst decoding field 'id': failed to parse "x" as
        // Int64"), and where a line stops being JSON.
        assert_eq!(q.bad[0].reason, "field id: \"x\" is not bigint");
        assert_eq!(
            q.bad[1].reason,
            "not valid JSON: expected ident at column 2"
        );
        let n = jsonl("k.jsonl", text, &schema(), BadRowPolicy::Null).unwrap();
        assert_eq!(n.batch.num_rows(), 3);
        assert_eq!(n.bad.iter().map(|b| b.line).collect::<Vec<_>>(), [3]);
        assert_eq!(n.nulled, 1);
        assert_eq!(
            n.corrupt,
            [
                None,
                Some("{\"id\":\"x\",\"name\":\"b\"}".to_string()),
                None
            ]
        );
    }

    /// Line numbers and raw text as an editor shows them after blank lines
    /// and with CRLF line ends (the record's position was where the line
    /// before it ended: line 3 and "\nzz,3" for the fourth line).
    #[test]
    fn csv_lines_count_past_blank_lines_and_crlf() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("b", DataType::Int64, true),
        ]));
        let q = |text: &[u8]| {
            csv("k.csv", text, &schema, true, b',', BadRowPolicy::Quarantine)
                .unwrap()
                .bad
                .into_iter()
                .map(|b| (b.line, b.raw))
                .collect::<Vec<_>>()
        };
        assert_eq!(q(b"id,b\r\n1,2\r\n2,3\r\nzz,3\r\n"), [(4, "zz,3".into())]);
        assert_eq!(q(b"id,b\n1,2\n\n2,3\n\nzz,3\n"), [(6, "zz,3".into())]);
        assert_eq!(
            q(b"id,b\r\n1,2\r\n\r\n\r\nzz,3\r\n7,x\r\n"),
            [(5, "zz,3".into()), (6, "7,x".into())]
        );
        // Repaired rows keep their own raw text (it is `_corrupt_record`).
        let n = csv(
            "k.csv",
            b"id,b\r\n1,2\r\n\r\nzz,3\r\n",
            &schema,
            true,
            b',',
            BadRowPolicy::Null,
        )
        .unwrap();
        assert_eq!(n.corrupt, [None, Some("zz,3".to_string())]);
        let few = q(b"id,b\n1\n");
        assert_eq!(few.len(), 1);
        let reasons = csv(
            "k.csv",
            b"id,b\n1\n",
            &schema,
            true,
            b',',
            BadRowPolicy::Quarantine,
        )
        .unwrap()
        .bad;
        assert_eq!(reasons[0].reason, "1 field, expected 2");
    }

    /// Read row by row, a JSON number or boolean in a text column is taken
    /// as written, as when the file reads whole (it was set aside as "not
    /// string" once another row forced the row-by-row read).
    #[test]
    fn jsonl_numbers_and_booleans_in_text_columns_are_kept_as_written() {
        let text = b"{\"id\":1,\"name\":5}\n{\"id\":2,\"name\":true}\n{\"id\":\"zz\"}\n";
        let q = jsonl("k.jsonl", text, &schema(), BadRowPolicy::Quarantine).unwrap();
        assert_eq!(q.bad.len(), 1);
        assert_eq!(q.bad[0].line, 3);
        let names = q
            .batch
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect::<Vec<_>>();
        assert_eq!(names, [Some("5".to_string()), Some("true".to_string())]);
    }

    /// The row-by-row read types values as the file reader does: a CSV
    /// decimal with an exponent (`1e2`) is 100.00 there (as in DuckDB), so
    /// it is here too, not a bad row; one too wide for its precision is
    /// bad, named with the SQL type.
    #[test]
    fn csv_decimals_read_as_the_reader_reads_them() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("fare", DataType::Decimal128(10, 2), true),
        ]));
        let text = b"id,fare\n1,1e2\n2,1.5E-1\n3,12345678901.5\n4,-2.50\n";
        let s = csv("k.csv", text, &schema, true, b',', BadRowPolicy::Quarantine).unwrap();
        let fares = s
            .batch
            .column(1)
            .as_any()
            .downcast_ref::<Decimal128Array>()
            .unwrap();
        assert_eq!(
            (0..fares.len())
                .map(|i| fares.value_as_string(i))
                .collect::<Vec<_>>(),
            ["100.00", "0.15", "-2.50"]
        );
        assert_eq!(s.bad.len(), 1);
        assert_eq!(s.bad[0].line, 4);
        assert_eq!(
            s.bad[0].reason,
            "column fare: \"12345678901.5\" is not decimal(10,2)"
        );
    }
}
