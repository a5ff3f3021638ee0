//! Parsing and validating the pipeline file (TOML): every field checked,
//! every error naming the file, line and field and saying what to write.

use std::path::Path;

use serde::Deserialize;

use super::{
    BadFilePolicy, BadRowPolicy, ColumnSpec, Compression, DiscoveryMode, Limits, Pipeline,
    SchemaChangePolicy, Source, SourceFormat,
};
use crate::error::{Error, Result};
use crate::storage::Location;

/// A byte size written as a number or a string with a unit (`"256 MiB"`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
enum ByteSize {
    Number(u64),
    Text(String),
}

/// `[source]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceFile {
    uri: String,
    format: FormatName,
    compression: Option<Compression>,
    table: String,
    schema: Option<Vec<ColumnSpec>>,
    schema_hints: Option<std::collections::BTreeMap<String, String>>,
    discovery: Option<DiscoveryMode>,
    lookback: Option<u64>,
    reconcile_every: Option<u64>,
    header: Option<bool>,
    delimiter: Option<String>,
    on_bad_file: Option<BadFilePolicy>,
    on_bad_row: Option<BadRowPolicy>,
    on_schema_change: Option<SchemaChangePolicy>,
    corrupt_record: Option<bool>,
    starting_offsets: Option<super::StartingOffsets>,
    starting_position: Option<String>,
    on_data_loss: Option<super::DataLossPolicy>,
    security_protocol: Option<super::SecurityProtocol>,
    sasl_mechanism: Option<super::SaslMechanism>,
    ignore_changes: Option<bool>,
}

/// `source.format` as written: a file format, or a Delta table (whose
/// files are Parquet, found through its log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum FormatName {
    Parquet,
    Csv,
    Jsonl,
    Delta,
}

impl SourceFile {
    /// The format of the files read.
    fn file_format(&self) -> SourceFormat {
        match self.format {
            FormatName::Parquet | FormatName::Delta => SourceFormat::Parquet,
            FormatName::Csv => SourceFormat::Csv,
            FormatName::Jsonl => SourceFormat::Jsonl,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueryFile {
    sql: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SinkFile {
    uri: String,
    format: Option<String>,
    mode: Option<super::OutputMode>,
    delta_checkpoint_interval: Option<u64>,
    partition_by: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointFile {
    uri: String,
    retain_batches: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    max_files_per_batch: Option<u64>,
    max_bytes_per_batch: Option<ByteSize>,
    max_bytes_per_task: Option<ByteSize>,
    lease_ttl_seconds: Option<u64>,
    max_inline_tasks: Option<u64>,
    max_batches_per_execution: Option<u64>,
    state_partitions: Option<u64>,
    max_records_per_batch: Option<u64>,
    max_records_per_task: Option<u64>,
    task_seconds: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct WatermarkFile {
    column: String,
    delay: String,
    wallclock_bound: Option<String>,
    late: Option<String>,
}

/// `[deduplicate]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeduplicateFile {
    key: Vec<String>,
    keep: Option<String>,
}

/// A `[[static]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct StaticFile {
    table: String,
    uri: String,
    format: Option<String>,
    header: Option<bool>,
    max_bytes: Option<ByteSize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineFile {
    name: String,
    source: SourceFile,
    #[serde(default, rename = "static")]
    statics: Vec<StaticFile>,
    query: QueryFile,
    sink: SinkFile,
    checkpoint: CheckpointFile,
    #[serde(default)]
    limits: LimitsFile,
    watermark: Option<WatermarkFile>,
    deduplicate: Option<DeduplicateFile>,
}

/// `[deduplicate]`, checked against `[watermark]`: keys expire with the
/// watermark, or are kept forever when written so.
fn deduplicate(
    d: &DeduplicateFile,
    watermark: Option<&super::Watermark>,
) -> std::result::Result<super::Deduplicate, String> {
    if d.key.is_empty() {
        return Err(
            "deduplicate.key is empty: name the columns that identify a row, \
                    e.g. key = [\"ride_id\"]"
                .into(),
        );
    }
    let mut seen = std::collections::HashSet::new();
    for k in &d.key {
        if !seen.insert(k) {
            return Err(format!("deduplicate.key names \"{k}\" twice"));
        }
    }
    let forever = match (d.keep.as_deref(), watermark) {
        (Some("forever"), None) => true,
        (None, Some(_)) => false,
        (None, None) => {
            return Err(
                "[deduplicate] without [watermark] keeps every key forever: its state \
                        grows without bound. Add [watermark] (column, delay: a key is \
                        forgotten once the watermark passes its first event time plus the \
                        delay), or write keep = \"forever\" under [deduplicate] to accept that"
                    .into(),
            );
        }
        (Some("forever"), Some(_)) => {
            return Err(
                "deduplicate.keep = \"forever\" with [watermark]: the watermark \
                        forgets keys; remove keep, or remove [watermark]"
                    .into(),
            );
        }
        (Some(other), _) => {
            return Err(format!(
                "deduplicate.keep = \"{other}\": the only value is \"forever\" (without \
                 [watermark]); with [watermark] leave keep out"
            ));
        }
    };
    Ok(super::Deduplicate {
        key: d.key.clone(),
        forever,
    })
}

fn toml_message(e: &toml::de::Error) -> String {
    // toml's message names the line, column and field; keep it, one line per
    // part, and add what to do.
    let msg = e.to_string();
    let msg = msg.trim_end();
    format!("{msg}\nfix the pipeline file; see docs/pipeline.md \"Pipeline file\" for the fields")
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `inner` is `outer` or below it.
fn inside(inner: &Location, outer: &Location) -> bool {
    match (inner, outer) {
        (Location::Local(a), Location::Local(b)) => a.starts_with(b),
        (
            Location::S3 {
                bucket: ba,
                prefix: pa,
            },
            Location::S3 {
                bucket: bb,
                prefix: pb,
            },
        ) => ba == bb && (pb.is_empty() || pa == pb || pa.starts_with(&format!("{pb}/"))),
        _ => false,
    }
}

/// The largest static table read whole by every task, unless
/// `max_bytes` says otherwise.
const STATIC_MAX_BYTES: u64 = 512 << 20;

/// A `[[static]]` table (`field`: `static[i]`), checked against the
/// source and the tables before it.
fn static_table(
    field: &str,
    st: &StaticFile,
    location: Location,
    source: &Source,
    before: &[super::StaticTable],
) -> std::result::Result<super::StaticTable, String> {
    if !is_identifier(&st.table) {
        return Err(format!(
            "{field}.table = \"{}\": use a SQL identifier (letters, digits, _)",
            st.table
        ));
    }
    if st.table.eq_ignore_ascii_case(&source.table) {
        return Err(format!(
            "{field}.table = \"{}\" is the source's table name: give the static table another \
             name",
            st.table
        ));
    }
    if before
        .iter()
        .any(|b| b.table.eq_ignore_ascii_case(&st.table))
    {
        return Err(format!(
            "{field}.table = \"{}\" names two [[static]] tables: give each its own name",
            st.table
        ));
    }
    if location.is_stream() {
        return Err(format!(
            "{field}.uri: a static table is a folder or an s3:// prefix of files, not a stream"
        ));
    }
    // Its files would be read as input too (or the input as its rows).
    let (at, src) = (resolved(&location), resolved(&source.location));
    if inside(&at, &src) || inside(&src, &at) {
        return Err(format!(
            "{field}.uri ({}) overlaps source.uri ({}): the static table's files would be read \
             as input (or the input as the table). Keep them in separate folders or prefixes",
            location.display(),
            source.location.display()
        ));
    }
    let (format, delta) = match st.format.as_deref() {
        None | Some("parquet") => (SourceFormat::Parquet, false),
        Some("csv") => (SourceFormat::Csv, false),
        Some("jsonl") => (SourceFormat::Jsonl, false),
        Some("delta") => (SourceFormat::Parquet, true),
        Some(other) => {
            return Err(format!(
                "{field}.format = \"{other}\": use parquet (the default), csv, jsonl or delta"
            ));
        }
    };
    if st.header.is_some() && format != SourceFormat::Csv {
        return Err(format!("{field}.header applies to format = \"csv\" only"));
    }
    let max_bytes = match &st.max_bytes {
        None => STATIC_MAX_BYTES,
        Some(b) => parse_bytes(b).map_err(|e| format!("{field}.max_bytes: {e}"))?,
    };
    Ok(super::StaticTable {
        table: st.table.clone(),
        location,
        format,
        delta,
        header: st.header.unwrap_or(true),
        max_bytes,
    })
}

fn parse_bytes(b: &ByteSize) -> std::result::Result<u64, String> {
    let text = match b {
        ByteSize::Number(n) => return Ok(*n),
        ByteSize::Text(t) => t.trim(),
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let num: f64 = num.parse().map_err(|_| {
        format!("\"{text}\" is not a size; write e.g. 268435456, \"256 MiB\" or \"1 GB\"")
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "kib" | "k" => 1 << 10,
        "mb" => 1_000_000,
        "mib" | "m" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" | "g" => 1 << 30,
        other => {
            return Err(format!(
                "unit \"{other}\" in \"{text}\" is not known; use B, KiB, MiB, GiB, KB, MB or GB"
            ));
        }
    };
    Ok((num * mult as f64) as u64)
}

impl Pipeline {
    /// Parse and validate pipeline TOML; `file` names it in errors and `base`
    /// resolves relative paths.
    pub fn parse(text: &str, file: &str, base: &Path) -> Result<Pipeline> {
        let spec_err = |message: String| Error::Spec {
            file: file.to_string(),
            message,
        };
        let (raw, raw_records) = read_file(text).map_err(spec_err)?;
        check_name(&raw.name).map_err(spec_err)?;
        let at = |field: &str, uri: &str| -> Result<Location> {
            Location::parse(uri, base).map_err(|m| spec_err(format!("{field}: {m}")))
        };
        let source_loc = at("source.uri", &raw.source.uri)?;
        let sink = at("sink.uri", &raw.sink.uri)?;
        let checkpoint_root = at("checkpoint.uri", &raw.checkpoint.uri)?;
        let mut source = source(&raw.source, source_loc).map_err(spec_err)?;
        if raw_records {
            raw_source(&raw.source, &mut source).map_err(spec_err)?;
        }
        let sink_format = match raw.sink.format.as_deref() {
            None | Some("parquet") => super::SinkFormat::Parquet,
            Some("delta") => super::SinkFormat::Delta,
            Some(f) => {
                return Err(spec_err(format!(
                    "sink.format = \"{f}\": use \"parquet\" (the default) or \"delta\""
                )));
            }
        };
        if sink_format == super::SinkFormat::Delta
            && raw.sink.mode == Some(super::OutputMode::Update)
        {
            return Err(spec_err(
                "sink.format = \"delta\" takes sink.mode = \"append\" (the default) or \
                 \"complete\": update mode would rewrite, in every batch, the table's files \
                 that hold a changed group (a copy-on-write MERGE), which is not built. Use \
                 \"complete\" (each batch replaces the table's content in one commit), or \
                 sink.format = \"parquet\", whose manifests carry each batch's changed groups"
                    .to_string(),
            ));
        }
        let delta_checkpoint_interval = match (raw.sink.delta_checkpoint_interval, sink_format) {
            (None, _) => None,
            (Some(0), _) => {
                return Err(spec_err(
                    "sink.delta_checkpoint_interval = 0: give a number of versions of at least 1 \
                     (default 10)"
                        .to_string(),
                ));
            }
            (Some(n), super::SinkFormat::Delta) => Some(n),
            (Some(_), super::SinkFormat::Parquet) => {
                return Err(spec_err(
                    "sink.delta_checkpoint_interval applies to a Delta sink only: remove it, or \
                     set sink.format = \"delta\""
                        .to_string(),
                ));
            }
        };
        let partition_by = raw.sink.partition_by.clone().unwrap_or_default();
        for (i, c) in partition_by.iter().enumerate() {
            if c.trim().is_empty() {
                return Err(spec_err(
                    "sink.partition_by names an empty column: list the query's output columns \
                     to partition by"
                        .to_string(),
                ));
            }
            if partition_by[..i].iter().any(|d| d.eq_ignore_ascii_case(c)) {
                return Err(spec_err(format!(
                    "sink.partition_by names \"{c}\" twice: list each column once"
                )));
            }
        }
        if raw.sink.partition_by.as_ref().is_some_and(Vec::is_empty) {
            return Err(spec_err(
                "sink.partition_by = []: list at least one column, or remove it".to_string(),
            ));
        }
        check_locations(&source.location, &sink, &checkpoint_root).map_err(spec_err)?;
        let limits = limits(&raw.limits).map_err(spec_err)?;
        // A limit that does not apply to the source would be a silent no-op.
        let l = &raw.limits;
        let topic = source.location.is_stream();
        let not_here: Vec<&str> = if topic {
            [
                ("max_files_per_batch", l.max_files_per_batch.is_some()),
                ("max_bytes_per_batch", l.max_bytes_per_batch.is_some()),
                ("max_bytes_per_task", l.max_bytes_per_task.is_some()),
                ("task_seconds", l.task_seconds.is_some()),
            ]
            .into_iter()
            .filter_map(|(n, set)| set.then_some(n))
            .collect()
        } else {
            [
                ("max_records_per_batch", l.max_records_per_batch.is_some()),
                ("max_records_per_task", l.max_records_per_task.is_some()),
            ]
            .into_iter()
            .filter_map(|(n, set)| set.then_some(n))
            .collect()
        };
        if !not_here.is_empty() {
            return Err(spec_err(format!(
                "limits.{} {} not apply to a {} source: {}",
                not_here.join(", limits."),
                if not_here.len() == 1 { "does" } else { "do" },
                if topic { "record-stream" } else { "file" },
                if topic {
                    "a stream's batches and tasks are sized by limits.max_records_per_batch and \
                     max_records_per_task"
                } else {
                    "a folder's batches and tasks are sized by limits.max_files_per_batch, \
                     max_bytes_per_batch, max_bytes_per_task and task_seconds"
                }
            )));
        }
        if let Some(n) = raw.checkpoint.retain_batches {
            check_count("checkpoint.retain_batches", n, MAX_WINDOW).map_err(spec_err)?;
        }
        let mut statics = Vec::new();
        for (i, st) in raw.statics.iter().enumerate() {
            let field = format!("static[{i}]");
            let location = at(&format!("{field}.uri"), &st.uri)?;
            statics.push(static_table(&field, st, location, &source, &statics).map_err(spec_err)?);
        }
        let sql = raw.query.sql.trim().trim_end_matches(';').to_string();
        if sql.is_empty() {
            return Err(spec_err("query.sql is empty".to_string()));
        }
        let watermark = match &raw.watermark {
            None => None,
            Some(w) => Some(super::Watermark {
                column: w.column.clone(),
                delay_us: match super::duration_us(&w.delay) {
                    Ok(d) => d,
                    // "0 seconds" is a valid delay: no lateness allowed.
                    Err(_) if w.delay.split_whitespace().next() == Some("0") => 0,
                    Err(e) => return Err(spec_err(format!("watermark.delay: {e}"))),
                },
                late_side_output: match w.late.as_deref() {
                    None | Some("drop") => false,
                    Some("side-output") => true,
                    Some(other) => {
                        return Err(spec_err(format!(
                            "watermark.late = \"{other}\": use \"drop\" (default) or \
                             \"side-output\" (late rows also written under the sink's _late/)"
                        )));
                    }
                },
                wallclock_bound_us: match &w.wallclock_bound {
                    None => None,
                    Some(b) => Some(
                        super::duration_us(b)
                            .map_err(|e| spec_err(format!("watermark.wallclock_bound: {e}")))?,
                    ),
                },
            }),
        };
        let deduplicate = match &raw.deduplicate {
            None => None,
            Some(d) => Some(deduplicate(d, watermark.as_ref()).map_err(spec_err)?),
        };
        Ok(Pipeline {
            deduplicate,
            watermark,
            output_mode: raw.sink.mode.unwrap_or_default(),
            sink_format,
            delta_checkpoint_interval,
            partition_by,
            checkpoint: checkpoint_root.join(&raw.name),
            name: raw.name,
            source,
            sql,
            sink,
            retain_batches: raw.checkpoint.retain_batches.unwrap_or(100),
            limits,
            statics,
        })
    }
}

/// The pipeline file, and whether its source's format is `"raw"` (read
/// as `"jsonl"` here: [`raw_source`] makes it raw).
fn read_file(text: &str) -> std::result::Result<(PipelineFile, bool), String> {
    let is_raw = toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| {
            t.get("source")?
                .get("format")
                .map(|f| f.as_str() == Some("raw"))
        })
        .unwrap_or(false);
    if !is_raw {
        return toml::from_str(text)
            .map(|f| (f, false))
            .map_err(|e| toml_message(&e));
    }
    let mut table: toml::Table = toml::from_str(text).map_err(|e| toml_message(&e))?;
    if let Some(toml::Value::Table(source)) = table.get_mut("source") {
        source.insert("format".into(), toml::Value::String("jsonl".into()));
    }
    toml::Value::Table(table)
        .try_into()
        .map(|f| (f, true))
        .map_err(|e: toml::de::Error| e.message().to_string())
}

/// A source whose file says `format = "raw"`: a topic only, read as
/// [`super::RAW_COLUMNS`]; every record reads, so no schema, hints or
/// bad-row and schema-change policies apply.
fn raw_source(src: &SourceFile, source: &mut Source) -> std::result::Result<(), String> {
    let kinesis = source.discovery == DiscoveryMode::Kinesis;
    if source.discovery != DiscoveryMode::Kafka && !kinesis {
        return Err(
            "source.format = \"raw\" reads a kafka:// or kinesis:// source's records as they \
             are; for files use parquet, csv or jsonl"
                .to_string(),
        );
    }
    let given = [
        ("schema", src.schema.is_some()),
        ("schema_hints", src.schema_hints.is_some()),
        ("on_bad_row", src.on_bad_row.is_some()),
        ("on_schema_change", src.on_schema_change.is_some()),
        ("corrupt_record", src.corrupt_record.is_some()),
    ];
    if let Some((name, _)) = given.iter().find(|(_, set)| *set) {
        return Err(format!(
            "source.{name} does not apply to format = \"raw\": its columns are always {}, \
             and every record reads (use format = \"jsonl\" to read values as JSON objects)",
            if kinesis {
                "data (binary), partition_key, sequence_number, shard_id and \
                 approximate_arrival_timestamp"
            } else {
                "key, value (binary), topic, partition, offset and timestamp"
            }
        ));
    }
    source.raw = true;
    source.schema_hints = Default::default();
    let columns: &[(&str, &str)] = if kinesis {
        &super::KINESIS_RAW_COLUMNS
    } else {
        &super::RAW_COLUMNS
    };
    source.schema = Some(
        columns
            .iter()
            .map(|(name, ty)| ColumnSpec {
                name: name.to_string(),
                data_type: ty.to_string(),
                nullable: true,
            })
            .collect(),
    );
    Ok(())
}

/// The name names the checkpoint folder and the Step Functions executions.
fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || name.starts_with(['_', '-'])
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    {
        return Err(format!(
            "name = \"{name}\": use 1 to 64 characters of a-z, 0-9, - and _, starting with a \
             letter or digit (it names the checkpoint folder and the Step Functions executions)"
        ));
    }
    Ok(())
}

/// `[source]`, checked and resolved.
fn source(src: &SourceFile, location: Location) -> std::result::Result<Source, String> {
    if !is_identifier(&src.table) {
        return Err(format!(
            "source.table = \"{}\": use a plain SQL name (letters, digits, _; not starting \
             with a digit)",
            src.table
        ));
    }
    if src.compression.is_some() && src.file_format() == SourceFormat::Parquet {
        return Err(
            "source.compression: Parquet compresses inside the file; remove compression or \
             use format = \"csv\" or \"jsonl\""
                .to_string(),
        );
    }
    if src.file_format() != SourceFormat::Csv && (src.header.is_some() || src.delimiter.is_some()) {
        return Err(
            "source.header and source.delimiter apply to format = \"csv\" only".to_string(),
        );
    }
    let delimiter = delimiter(src.delimiter.as_deref())?;
    let discovery = discovery_of(src, &location)?;
    check_source_options(src, discovery)?;
    if let Some(cols) = &src.schema {
        check_declared_schema(cols, src.file_format())?;
    }
    let hints = src.schema_hints.clone().unwrap_or_default();
    if !hints.is_empty() && src.schema.is_some() {
        return Err(
            "source.schema_hints types columns of an inferred schema, and source.schema \
             declares them all: keep one (put the hinted types into source.schema)"
                .to_string(),
        );
    }
    if !hints.is_empty() && discovery == DiscoveryMode::Delta {
        return Err(
            "source.schema_hints types columns of a schema inferred from files, and a Delta \
             table's log types its columns: remove source.schema_hints (declare source.schema \
             to read the table with other types)"
                .to_string(),
        );
    }
    check_schema_hints(&hints, src.file_format())?;
    let (schema, hints) = if discovery == DiscoveryMode::Kafka {
        with_record_metadata(src.schema.clone(), hints, &RECORD_METADATA)
    } else if discovery == DiscoveryMode::Kinesis {
        with_record_metadata(src.schema.clone(), hints, &KINESIS_METADATA)
    } else {
        (src.schema.clone(), hints)
    };
    Ok(Source {
        location,
        format: src.file_format(),
        compression: src.compression,
        table: src.table.clone(),
        schema,
        schema_hints: hints,
        discovery,
        lookback: src.lookback.unwrap_or(100),
        reconcile_every: src
            .reconcile_every
            .unwrap_or_else(super::default_reconcile_every),
        header: src.header.unwrap_or(true),
        delimiter,
        on_bad_file: src.on_bad_file.unwrap_or_default(),
        on_bad_row: src.on_bad_row.unwrap_or_default(),
        on_schema_change: src.on_schema_change.unwrap_or_default(),
        corrupt_record: src.corrupt_record.unwrap_or(false),
        starting_offsets: match (src.starting_position.as_deref(), src.starting_offsets) {
            (Some(p), _) if p.eq_ignore_ascii_case("latest") => super::StartingOffsets::Latest,
            (_, o) => o.unwrap_or_default(),
        },
        starting_at_ms: starting_at_ms(src.starting_position.as_deref())?,
        security_protocol: src.security_protocol.unwrap_or_default(),
        sasl_mechanism: src.sasl_mechanism,
        raw: false,
        on_data_loss: src.on_data_loss.unwrap_or_default(),
        ignore_changes: src.ignore_changes.unwrap_or(false),
    })
}

/// A record's metadata columns and their types, as every record-stream
/// row has them.
const RECORD_METADATA: [(&str, &str); 5] = [
    ("_topic", "string"),
    ("_partition", "int"),
    ("_offset", "bigint"),
    ("_timestamp", "timestamp"),
    ("_key", "string"),
];

/// A Kinesis record's metadata columns and their types.
const KINESIS_METADATA: [(&str, &str); 4] = [
    ("_shard_id", "string"),
    ("_sequence_number", "string"),
    ("_arrival_timestamp", "timestamp"),
    ("_partition_key", "string"),
];

/// A record stream's schema with its metadata columns: appended to a
/// declared schema (unless declared), or typed by hints of an inferred
/// one (unless hinted).
fn with_record_metadata(
    schema: Option<Vec<ColumnSpec>>,
    mut hints: std::collections::BTreeMap<String, String>,
    metadata: &[(&str, &str)],
) -> (
    Option<Vec<ColumnSpec>>,
    std::collections::BTreeMap<String, String>,
) {
    match schema {
        Some(mut cols) => {
            for (name, ty) in metadata {
                if !cols.iter().any(|c| c.name == *name) {
                    cols.push(ColumnSpec {
                        name: name.to_string(),
                        data_type: ty.to_string(),
                        nullable: true,
                    });
                }
            }
            (Some(cols), hints)
        }
        None => {
            for (name, ty) in metadata {
                hints
                    .entry(name.to_string())
                    .or_insert_with(|| ty.to_string());
            }
            (None, hints)
        }
    }
}

/// `starting_position` as a date: ms since the epoch (`trim_horizon` and
/// `latest` are not dates).
fn starting_at_ms(written: Option<&str>) -> std::result::Result<Option<i64>, String> {
    // (Kinesis spells the positions in capitals: both are taken.)
    match written {
        None => Ok(None),
        Some(p) if p.eq_ignore_ascii_case("trim_horizon") || p.eq_ignore_ascii_case("latest") => {
            Ok(None)
        }
        Some(d) => chrono::DateTime::parse_from_rfc3339(d)
            .map(|t| Some(t.timestamp_millis()))
            .map_err(|_| {
                format!(
                    "source.starting_position = \"{d}\" is neither a position nor a date with \
                     its time and zone: write \"trim_horizon\" (the default), \"latest\" or a \
                     date such as \"2026-12-01T00:00:00Z\""
                )
            }),
    }
}

/// The discovery mode: `kafka` for a `kafka://` source (and only then),
/// else as written (`list` unless written).
fn discovery_of(
    src: &SourceFile,
    location: &Location,
) -> std::result::Result<DiscoveryMode, String> {
    let kafka = matches!(location, Location::Kafka { .. });
    let kinesis = matches!(location, Location::Kinesis { .. });
    match src.discovery {
        None | Some(DiscoveryMode::Kinesis) if kinesis && src.format != FormatName::Delta => {
            return Ok(DiscoveryMode::Kinesis);
        }
        Some(d) if kinesis => {
            return Err(format!(
                "source.discovery = \"{}\": a kinesis:// source reads its stream's shards: \
                 remove source.discovery",
                d.name()
            ));
        }
        Some(DiscoveryMode::Kinesis) => {
            return Err(
                "source.discovery = \"kinesis\" needs source.uri = \"kinesis://stream-name\""
                    .to_string(),
            );
        }
        _ => {}
    }
    if src.format == FormatName::Delta {
        return match src.discovery {
            _ if kafka || kinesis => Err(
                "source.format = \"delta\" reads a table in a folder or under s3://, not a \
                 kafka:// topic or kinesis:// stream"
                    .to_string(),
            ),
            None | Some(DiscoveryMode::Delta) => Ok(DiscoveryMode::Delta),
            Some(d) => Err(format!(
                "source.discovery = \"{}\" lists files; source.format = \"delta\" reads the \
                 table's log: remove source.discovery",
                d.name()
            )),
        };
    }
    if src.discovery == Some(DiscoveryMode::Delta) {
        return Err(
            "source.discovery = \"delta\": write source.format = \"delta\" to read a Delta table"
                .to_string(),
        );
    }
    match src.discovery {
        None if kafka => Ok(DiscoveryMode::Kafka),
        Some(DiscoveryMode::Kafka) if kafka => Ok(DiscoveryMode::Kafka),
        Some(d) if kafka => Err(format!(
            "source.discovery = \"{}\" lists files; a kafka:// source reads its topic's \
             offsets: remove source.discovery",
            d.name()
        )),
        Some(DiscoveryMode::Kafka) => Err(
            "source.discovery = \"kafka\" needs source.uri = \"kafka://host:port/topic\""
                .to_string(),
        ),
        d => Ok(d.unwrap_or(DiscoveryMode::List)),
    }
}

/// `source.delimiter` as the byte that separates CSV fields (`,` unless
/// written); one that cannot separate fields is refused.
fn delimiter(written: Option<&str>) -> std::result::Result<u8, String> {
    Ok(match written {
        None => b',',
        // A line break or the quote character cannot separate fields: a
        // file would read as rows of one empty field, committed as nothing.
        Some(d) if matches!(d, "\n" | "\r" | "\"") => {
            return Err(format!(
                "source.delimiter = {d:?} cannot separate fields (it ends lines or quotes \
                 them); use one other ASCII character, such as \",\", \";\", \"|\" or \"\\t\""
            ));
        }
        Some(d) if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
        Some(d) => {
            return Err(format!(
                "source.delimiter = \"{d}\": use one ASCII character, such as \",\" or \"|\""
            ));
        }
    })
}

/// The `[source]` settings that apply only with some discovery mode, format
/// or bad-row policy, checked against those; the counts bounded.
fn check_source_options(
    src: &SourceFile,
    discovery: DiscoveryMode,
) -> std::result::Result<(), String> {
    if src.lookback.is_some() && discovery != DiscoveryMode::Ordered {
        return Err("source.lookback applies to discovery = \"ordered\" only".to_string());
    }
    if src.reconcile_every.is_some() && discovery != DiscoveryMode::Notify {
        return Err("source.reconcile_every applies to discovery = \"notify\" only".to_string());
    }
    if discovery == DiscoveryMode::Manifests && src.file_format() != SourceFormat::Parquet {
        return Err(
            "discovery = \"manifests\" reads another Sluice pipeline's sink, which holds \
             Parquet: set source.format = \"parquet\""
                .to_string(),
        );
    }
    if src.on_bad_row.is_some_and(|p| p != BadRowPolicy::Fail)
        && src.file_format() == SourceFormat::Parquet
    {
        return Err(
            "source.on_bad_row applies to csv and jsonl (Parquet has no rows to tell apart: \
             use on_bad_file)"
                .to_string(),
        );
    }
    if src.corrupt_record == Some(true) && src.on_bad_row != Some(BadRowPolicy::Null) {
        return Err(
            "source.corrupt_record keeps the raw text of rows repaired under \
             on_bad_row = \"null\": set that policy too, or remove corrupt_record"
                .to_string(),
        );
    }
    if src.ignore_changes.is_some() && discovery != DiscoveryMode::Delta {
        return Err("source.ignore_changes applies to format = \"delta\" only".to_string());
    }
    let kinesis = discovery == DiscoveryMode::Kinesis;
    let stream = discovery == DiscoveryMode::Kafka || kinesis;
    if !stream && src.on_data_loss.is_some() {
        return Err(
            "source.on_data_loss applies to a kafka:// or kinesis:// source only".to_string(),
        );
    }
    if discovery != DiscoveryMode::Kafka
        && (src.starting_offsets.is_some()
            || src.security_protocol.is_some()
            || src.sasl_mechanism.is_some())
    {
        return Err(format!(
            "source.starting_offsets, security_protocol and sasl_mechanism apply to a kafka:// \
             source only{}",
            if kinesis {
                " (a kinesis:// source starts at source.starting_position: \"trim_horizon\", \
                 \"latest\" or a date; the AWS SDK's settings reach the stream)"
            } else {
                ""
            }
        ));
    }
    if !kinesis && src.starting_position.is_some() {
        return Err(format!(
            "source.starting_position applies to a kinesis:// source only{}",
            if stream {
                " (a kafka:// source starts at source.starting_offsets)"
            } else {
                ""
            }
        ));
    }
    let sasl = src.security_protocol.is_some_and(|p| p.sasl());
    if sasl != src.sasl_mechanism.is_some() {
        return Err(if sasl {
            "source.sasl_mechanism: a SASL security_protocol needs one: \"PLAIN\", \
             \"SCRAM-SHA-256\" or \"SCRAM-SHA-512\" (the credentials come from \
             SLUICE_KAFKA_SASL_USERNAME and SLUICE_KAFKA_SASL_PASSWORD)"
                .to_string()
        } else {
            "source.sasl_mechanism applies under security_protocol = \"sasl_ssl\" or \
             \"sasl_plaintext\""
                .to_string()
        });
    }
    if stream && src.file_format() != SourceFormat::Jsonl {
        return Err(format!(
            "source.format = \"{}\": a {} source reads each record's {} as one JSON object \
             (format = \"jsonl\") or each record as it is (format = \"raw\": {})",
            src.file_format().name(),
            if kinesis { "kinesis://" } else { "kafka://" },
            if kinesis { "data" } else { "value" },
            if kinesis {
                "data, partition_key, sequence_number, shard_id, approximate_arrival_timestamp"
            } else {
                "key, value, topic, partition, offset, timestamp"
            }
        ));
    }
    if stream && src.compression.is_some() {
        return Err(
            "source.compression: a stream's records are read as they were put; remove it"
                .to_string(),
        );
    }
    if stream && src.on_schema_change == Some(SchemaChangePolicy::AddColumns) {
        return Err(
            "source.on_schema_change = \"add-columns\" is not supported for a record-stream \
             source yet: use \"rescue\" (new fields go into _rescued) or \"fail\""
                .to_string(),
        );
    }
    if stream && src.on_bad_file.is_some() {
        return Err(
            "source.on_bad_file applies to files; a stream's bad records follow \
             source.on_bad_row"
                .to_string(),
        );
    }
    if let Some(n) = src.reconcile_every {
        check_count("source.reconcile_every", n, MAX_WINDOW)?;
    }
    if let Some(n) = src.lookback {
        check_count("source.lookback", n, MAX_WINDOW)?;
    }
    Ok(())
}

/// A declared `source.schema`: not empty, no column of type Null, every
/// type readable from CSV when the source is CSV, no column Sluice fills.
fn check_declared_schema(
    cols: &[ColumnSpec],
    format: SourceFormat,
) -> std::result::Result<(), String> {
    if cols.is_empty() {
        return Err("source.schema is empty; list the columns or remove it to infer".to_string());
    }
    let declared = super::schema::schema_of(cols).map_err(|e| format!("source.schema{e}"))?;
    // A column of type Null holds no value: every value read into it
    // would be stored as NULL.
    if let Some((i, f)) = declared
        .fields()
        .iter()
        .enumerate()
        .find(|(_, f)| f.data_type().is_null())
    {
        return Err(format!(
            "source.schema[{i}] (column {}): type Null holds no value, so every value of \
             the column would be stored as NULL; declare the column's type (string for \
             text)",
            f.name()
        ));
    }
    if format == SourceFormat::Csv
        && let Some((i, f)) = declared
            .fields()
            .iter()
            .enumerate()
            .find(|(_, f)| !super::types::csv_readable(f.data_type()))
    {
        return Err(format!(
            "source.schema[{i}] (column {}): {}",
            f.name(),
            super::types::not_csv_readable(f.data_type())
        ));
    }
    if let Some(c) = cols
        .iter()
        .find(|c| super::DERIVED.contains(&c.name.as_str()))
    {
        return Err(format!(
            "source.schema declares {}, a column Sluice fills (on_schema_change = \
             \"rescue\" adds _rescued, corrupt_record = true adds _corrupt_record): leave \
             it out",
            c.name
        ));
    }
    Ok(())
}

/// `source.schema_hints`: each a type that holds values, readable from CSV
/// when the source is CSV, and not a column Sluice fills.
fn check_schema_hints(
    hints: &std::collections::BTreeMap<String, String>,
    format: SourceFormat,
) -> std::result::Result<(), String> {
    for (name, t) in hints {
        let parsed = super::types::parse_type(t)
            .map_err(|e| format!("source.schema_hints.{name} = \"{t}\": {e}"))?;
        if parsed.is_null() {
            return Err(format!(
                "source.schema_hints.{name}: type null holds no value; hint the column's type \
                 (string for text)"
            ));
        }
        if format == SourceFormat::Csv && !super::types::csv_readable(&parsed) {
            return Err(format!(
                "source.schema_hints.{name} = \"{t}\": {}",
                super::types::not_csv_readable(&parsed)
            ));
        }
        if super::DERIVED.contains(&name.as_str()) {
            return Err(format!(
                "source.schema_hints names {name}, a column Sluice fills: leave it out"
            ));
        }
    }
    Ok(())
}

/// Sink and checkpoint may not overlap the source (output would be read
/// back as input) nor each other.
fn check_locations(
    source: &Location,
    sink: &Location,
    checkpoint: &Location,
) -> std::result::Result<(), String> {
    // Compared as the file system resolves them: a sink reached through a
    // symlink inside the source is inside the source.
    let (source_r, sink_r, checkpoint_r) = (resolved(source), resolved(sink), resolved(checkpoint));
    let (source, sink, checkpoint) = (&source_r, &sink_r, &checkpoint_r);
    for (field, loc) in [("sink.uri", sink), ("checkpoint.uri", checkpoint)] {
        if inside(loc, source) || inside(source, loc) {
            return Err(format!(
                "{field} ({}) overlaps source.uri ({}); outputs would be read back as \
                 input. Use separate folders or prefixes",
                loc.display(),
                source.display()
            ));
        }
    }
    if inside(sink, checkpoint) || inside(checkpoint, sink) {
        return Err(format!(
            "sink.uri ({}) and checkpoint.uri ({}) overlap; use separate folders or prefixes",
            sink.display(),
            checkpoint.display()
        ));
    }
    Ok(())
}

/// A local location with its symlinks resolved: the longest part of the
/// path that exists, canonicalised, then the rest (which does not exist
/// yet, so holds no link). S3 locations are themselves.
fn resolved(loc: &Location) -> Location {
    let Location::Local(path) = loc else {
        return loc.clone();
    };
    let mut existing = path.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            let mut out = real;
            out.extend(rest.iter().rev());
            return Location::Local(out);
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return loc.clone(),
        }
    }
}

/// `[limits]`, with defaults; every limit positive.
fn limits(l: &LimitsFile) -> std::result::Result<Limits, String> {
    let d = Limits::default();
    let bytes = |field: &str, v: &Option<ByteSize>, default: u64| match v {
        None => Ok(default),
        Some(b) => parse_bytes(b).map_err(|m| format!("limits.{field}: {m}")),
    };
    let limits = Limits {
        max_files_per_batch: l.max_files_per_batch.unwrap_or(d.max_files_per_batch),
        max_bytes_per_batch: bytes(
            "max_bytes_per_batch",
            &l.max_bytes_per_batch,
            d.max_bytes_per_batch,
        )?,
        max_bytes_per_task: bytes(
            "max_bytes_per_task",
            &l.max_bytes_per_task,
            d.max_bytes_per_task,
        )?,
        lease_ttl_seconds: l.lease_ttl_seconds.unwrap_or(d.lease_ttl_seconds),
        max_inline_tasks: l.max_inline_tasks.unwrap_or(d.max_inline_tasks),
        max_batches_per_execution: l
            .max_batches_per_execution
            .unwrap_or(d.max_batches_per_execution),
        state_partitions: d.state_partitions,
        max_records_per_batch: l.max_records_per_batch.unwrap_or(d.max_records_per_batch),
        max_records_per_task: l.max_records_per_task.unwrap_or(d.max_records_per_task),
        task_seconds: l.task_seconds,
    };
    if let Some(s) = l.task_seconds {
        check_count("limits.task_seconds", s, MAX_TASK_SECONDS)?;
    }
    let limits = Limits {
        state_partitions: match l.state_partitions {
            None => d.state_partitions,
            Some(n) => {
                check_count("limits.state_partitions", n, MAX_STATE_PARTITIONS)?;
                n as u32
            }
        },
        ..limits
    };
    for (field, v, max) in [
        (
            "max_files_per_batch",
            limits.max_files_per_batch,
            MAX_FILES_PER_BATCH,
        ),
        ("max_bytes_per_batch", limits.max_bytes_per_batch, MAX_BYTES),
        ("max_bytes_per_task", limits.max_bytes_per_task, MAX_BYTES),
        (
            "lease_ttl_seconds",
            limits.lease_ttl_seconds,
            MAX_LEASE_TTL_SECONDS,
        ),
        (
            "max_inline_tasks",
            limits.max_inline_tasks,
            MAX_INLINE_TASKS,
        ),
        (
            "max_batches_per_execution",
            limits.max_batches_per_execution,
            MAX_BATCHES_PER_EXECUTION,
        ),
        (
            "max_records_per_batch",
            limits.max_records_per_batch,
            MAX_RECORDS,
        ),
        (
            "max_records_per_task",
            limits.max_records_per_task,
            MAX_RECORDS,
        ),
    ] {
        check_count(&format!("limits.{field}"), v, max)?;
    }
    Ok(limits)
}

/// Upper bounds of the numeric settings: past them a value is a typo or
/// would overflow (a TTL in milliseconds), exceed what one plan record or
/// one execution's history holds, or make a run that never ends.
const MAX_FILES_PER_BATCH: u64 = 100_000;
/// A task must end well inside Lambda's 15 minutes.
const MAX_TASK_SECONDS: u64 = 600;
const MAX_BYTES: u64 = 1 << 50; // 1 PiB
const MAX_LEASE_TTL_SECONDS: u64 = 7 * 24 * 3600;
const MAX_INLINE_TASKS: u64 = 1_000;
const MAX_BATCHES_PER_EXECUTION: u64 = 1_000;
const MAX_WINDOW: u64 = 10_000_000;
const MAX_STATE_PARTITIONS: u64 = 1_024;
const MAX_RECORDS: u64 = 1_000_000_000;

/// A count setting must be positive and at most `max`.
fn check_count(field: &str, v: u64, max: u64) -> std::result::Result<(), String> {
    if v == 0 {
        return Err(format!("{field} = 0: use a positive value"));
    }
    if v > max {
        return Err(format!("{field} = {v} is too large: at most {max}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "taxi"
[source]
uri = "data/"
format = "parquet"
table = "trips"
discovery = "ordered"
lookback = 10
[query]
sql = "SELECT * FROM trips;"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_files_per_batch = 3
max_bytes_per_batch = "64 MiB"
"#;

    fn parse(text: &str) -> Result<Pipeline> {
        Pipeline::parse(text, "p.toml", Path::new("/w"))
    }

    #[test]
    fn parses_and_resolves() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.source.location, Location::Local("/w/data".into()));
        assert_eq!(
            p.checkpoint,
            Location::Local("/w/out/checkpoint/taxi".into())
        );
        assert_eq!(p.limits.max_bytes_per_batch, 64 << 20);
        assert_eq!(p.limits.max_files_per_batch, 3);
        assert_eq!(p.sql, "SELECT * FROM trips");
        assert_eq!(p.source.lookback, 10);
        assert_eq!(p.spec_hash(), parse(GOOD).unwrap().spec_hash());
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn names_unknown_field_with_line() {
        let e = err(&GOOD.replace("table = \"trips\"", "table = \"trips\"\ncolour = 1"));
        assert!(e.contains("colour"), "{e}");
        assert!(e.contains("line 7"), "{e}");
    }

    #[test]
    fn limits_that_do_not_apply_to_the_source_are_refused_by_name() {
        let e = err(&GOOD.replace(
            "max_bytes_per_batch",
            "max_records_per_batch = 5\nmax_bytes_per_batch",
        ));
        assert!(
            e.contains("limits.max_records_per_batch does not apply to a file"),
            "{e}"
        );
        let topic = GOOD
            .replace("uri = \"data/\"", "uri = \"kafka://b:9092/rides\"")
            .replace("format = \"parquet\"", "format = \"jsonl\"")
            .replace("discovery = \"ordered\"\nlookback = 10\n", "");
        let e = err(&topic);
        assert!(
            e.contains(
                "limits.max_files_per_batch, limits.max_bytes_per_batch do not apply to a record-stream"
            ),
            "{e}"
        );
        let ok = topic.replace(
            "max_files_per_batch = 3\nmax_bytes_per_batch = \"64 MiB\"",
            "max_records_per_batch = 10",
        );
        assert_eq!(parse(&ok).unwrap().limits.max_records_per_batch, 10);
    }

    #[test]
    fn a_kinesis_source_takes_its_own_settings_and_refuses_kafkas() {
        let stream = GOOD
            .replace("uri = \"data/\"", "uri = \"kinesis://rides\"")
            .replace("format = \"parquet\"", "format = \"jsonl\"")
            .replace("discovery = \"ordered\"\nlookback = 10\n", "")
            .replace(
                "max_files_per_batch = 3\nmax_bytes_per_batch = \"64 MiB\"",
                "max_records_per_batch = 10",
            );
        let p = parse(&stream).unwrap();
        assert_eq!(p.source.discovery, DiscoveryMode::Kinesis);
        assert_eq!(p.source.starting_at_ms, None);
        let with = |line: &str| {
            stream.replace(
                "table = \"trips\"\n",
                &format!("table = \"trips\"\n{line}\n"),
            )
        };
        let dated = parse(&with("starting_position = \"2026-12-01T00:00:00Z\"")).unwrap();
        assert_eq!(dated.source.starting_at_ms, Some(1_796_083_200_000));
        let latest = parse(&with("starting_position = \"latest\"")).unwrap();
        // Kinesis' own spelling is taken too.
        let upper = parse(&with("starting_position = \"LATEST\"")).unwrap();
        assert_eq!(
            upper.source.starting_offsets,
            latest.source.starting_offsets
        );
        let e = err(&with("starting_position = \"2026-12-01\""));
        assert!(
            e.contains("a date with its time and zone") && !e.contains("premature"),
            "{e}"
        );
        assert_eq!(
            latest.source.starting_offsets,
            super::super::StartingOffsets::Latest
        );
        for (line, want) in [
            (
                "starting_position = \"yesterday\"",
                "write \"trim_horizon\"",
            ),
            ("starting_offsets = \"latest\"", "starting_position"),
            (
                "security_protocol = \"ssl\"",
                "apply to a kafka:// source only",
            ),
            ("discovery = \"list\"", "reads its stream's shards"),
            ("compression = \"gzip\"", "read as they were put"),
        ] {
            let e = err(&with(line));
            assert!(e.contains(want), "{line}: {e}");
        }
        let e = err(&stream.replace("format = \"jsonl\"", "format = \"csv\""));
        assert!(
            e.contains("a kinesis:// source reads each record's data"),
            "{e}"
        );
        // Kafka's pipelines refuse Kinesis' setting.
        let topic = stream.replace("kinesis://rides", "kafka://b:9092/rides");
        let e = err(&topic.replace(
            "table = \"trips\"\n",
            "table = \"trips\"\nstarting_position = \"latest\"\n",
        ));
        assert!(
            e.contains("starting_position applies to a kinesis:// source only"),
            "{e}"
        );
    }

    #[test]
    fn names_missing_field() {
        let e = err(&GOOD.replace("table = \"trips\"\n", ""));
        assert!(e.contains("missing field `table`"), "{e}");
    }

    #[test]
    fn refuses_bad_values() {
        assert!(err(&GOOD.replace("\"parquet\"", "\"xls\"")).contains("xls"));
        assert!(
            err(&GOOD.replace("max_files_per_batch = 3", "max_files_per_batch = 0"))
                .contains("limits.max_files_per_batch = 0")
        );
        assert!(err(&GOOD.replace("\"64 MiB\"", "\"64 parsecs\"")).contains("parsecs"));
        assert!(err(&GOOD.replace("name = \"taxi\"", "name = \"Taxi Trips\"")).contains("name ="));
        assert!(err(&GOOD.replace("out/sink", "data/sink")).contains("overlaps source.uri"));
        assert!(
            err(&GOOD.replace("table = \"trips\"", "table = \"1trips\"")).contains("source.table")
        );
        let manifests = GOOD.replace(
            "discovery = \"ordered\"\nlookback = 10",
            "discovery = \"manifests\"",
        );
        assert_eq!(
            parse(&manifests).unwrap().source.discovery,
            DiscoveryMode::Manifests
        );
        let csv = manifests.replace("\"parquet\"", "\"csv\"");
        assert!(
            err(&csv).contains("source.format = \"parquet\""),
            "{}",
            err(&csv)
        );
    }

    /// The review's cases: settings that lost data silently. A declared
    /// type Null stored every value as NULL; `delimiter = "\n"` committed
    /// a file as 0 rows and marked it processed.
    #[test]
    fn refuses_settings_that_would_lose_every_value() {
        let csv = GOOD
            .replace("\"parquet\"", "\"csv\"")
            .replace("discovery = \"ordered\"\nlookback = 10", "");
        assert!(parse(&csv).is_ok(), "{}", err(&csv));
        let null = csv.replace(
            "table = \"trips\"",
            "table = \"trips\"\nschema = [{ name = \"a\", type = \"Int64\" }, { name = \"b\", type = \"Null\" }]",
        );
        let e = err(&null);
        assert!(
            e.contains("source.schema[1] (column b)") && e.contains("Null"),
            "{e}"
        );
        for d in ["\\n", "\\r", "\\\""] {
            let bad = csv.replace(
                "table = \"trips\"",
                &format!("table = \"trips\"\ndelimiter = \"{d}\""),
            );
            let e = err(&bad);
            assert!(e.contains("cannot separate fields"), "{d}: {e}");
        }
        let tab = csv.replace(
            "table = \"trips\"",
            "table = \"trips\"\ndelimiter = \"\\t\"",
        );
        assert_eq!(parse(&tab).unwrap().source.delimiter, b'\t');
    }

    /// The review's case: a TTL of 10^16 s overflowed to a negative TTL in
    /// milliseconds, so any run took a live lease. Every count is bounded.
    #[test]
    fn refuses_numbers_out_of_bounds() {
        let limits = |line: &str| err(&format!("{GOOD}{line}\n"));
        let e = limits("lease_ttl_seconds = 10000000000000000");
        assert!(
            e.contains("limits.lease_ttl_seconds = 10000000000000000 is too large: at most 604800"),
            "{e}"
        );
        assert!(limits("max_inline_tasks = 1001").contains("limits.max_inline_tasks"));
        assert!(
            limits("max_batches_per_execution = 0")
                .contains("limits.max_batches_per_execution = 0")
        );
        assert!(limits("max_bytes_per_task = \"2 PiB\"").contains("limits.max_bytes_per_task"));
        assert!(
            err(&GOOD.replace("max_files_per_batch = 3", "max_files_per_batch = 100001"))
                .contains("at most 100000")
        );
        assert!(
            err(&GOOD.replace("lookback = 10", "lookback = 0")).contains("source.lookback = 0")
        );
        assert!(
            err(&GOOD.replace(
                "uri = \"out/checkpoint\"",
                "uri = \"out/checkpoint\"\nretain_batches = 0"
            ))
            .contains("checkpoint.retain_batches = 0")
        );
        // At the bounds: accepted.
        assert!(
            parse(&format!(
                "{GOOD}lease_ttl_seconds = 604800\nmax_inline_tasks = 1000\n"
            ))
            .is_ok()
        );
    }

    /// The review's case: `ln -s data/outdir sinklink`, `sink.uri =
    /// "sinklink/"` passed the overlap check and every run read its own
    /// output back. Locations are compared resolved.
    #[test]
    fn a_sink_reached_through_a_symlink_into_the_source_overlaps_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("data/outdir")).unwrap();
        std::os::unix::fs::symlink(root.join("data/outdir"), root.join("sinklink")).unwrap();
        let text = GOOD.replace("uri = \"out/sink\"", "uri = \"sinklink/\"");
        let e = Pipeline::parse(&text, "p.toml", root)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sink.uri") && e.contains("overlaps source.uri"),
            "{e}"
        );
        // A link to a folder outside the source is fine, as is a sink
        // folder that does not exist yet.
        std::fs::create_dir_all(root.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), root.join("outlink")).unwrap();
        let ok = GOOD.replace("uri = \"out/sink\"", "uri = \"outlink/new/sink\"");
        assert!(Pipeline::parse(&ok, "p.toml", root).is_ok());
    }

    #[test]
    fn input_filter() {
        let p = parse(GOOD).unwrap();
        assert!(p.source.is_input("2024/01/a.parquet"));
        assert!(!p.source.is_input("2024/01/.a.parquet.tmp"));
        assert!(!p.source.is_input("_temporary/a.parquet"));
        assert!(!p.source.is_input("a.csv"));
        // The review's case: `UPPER.PARQUET` was ignored for its case.
        assert!(p.source.is_input("2024/01/UPPER.PARQUET"));
        assert!(p.source.is_input("b.Parquet"));
        assert!(!p.source.is_input("parquet"));
        assert!(!p.source.is_input("ü.parquetx"));
    }
}
