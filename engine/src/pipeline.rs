//! The pipeline file (TOML): what the user writes, parsed strictly and
//! resolved into a [`Pipeline`] before anything runs.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::storage::Location;

/// File format of the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceFormat {
    /// Apache Parquet.
    Parquet,
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

/// Whole-file compression of a CSV or JSON Lines source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// gzip (`.gz`).
    Gzip,
    /// Zstandard (`.zst`).
    Zstd,
}

/// How new input is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiscoveryMode {
    /// List the whole prefix and diff against every processed key.
    List,
    /// Keys sort by arrival: list after a cursor, remember only a window.
    Ordered,
    /// Triggers record S3/SNS notifications in an inbox; runs read the inbox
    /// without listing the source, and list it every `reconcile_every` runs
    /// to find files whose notification was lost.
    Notify,
}

impl DiscoveryMode {
    /// The name as written in a pipeline file.
    pub fn name(self) -> &'static str {
        match self {
            DiscoveryMode::List => "list",
            DiscoveryMode::Ordered => "ordered",
            DiscoveryMode::Notify => "notify",
        }
    }
}

/// A column of a declared source schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    /// Column name.
    pub name: String,
    /// Arrow type as Arrow prints it: `Int64`, `Float64`, `Utf8`,
    /// `Timestamp(Microsecond, None)`.
    #[serde(rename = "type")]
    pub data_type: String,
    /// Whether nulls may appear (default true).
    #[serde(default = "yes")]
    pub nullable: bool,
}

fn yes() -> bool {
    true
}

fn default_reconcile_every() -> u64 {
    10
}

fn is_default_reconcile_every(n: &u64) -> bool {
    *n == default_reconcile_every()
}

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
    format: SourceFormat,
    compression: Option<Compression>,
    table: String,
    schema: Option<Vec<ColumnSpec>>,
    discovery: Option<DiscoveryMode>,
    lookback: Option<u64>,
    reconcile_every: Option<u64>,
    header: Option<bool>,
    delimiter: Option<String>,
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineFile {
    name: String,
    source: SourceFile,
    query: QueryFile,
    sink: SinkFile,
    checkpoint: CheckpointFile,
    #[serde(default)]
    limits: LimitsFile,
}

/// The source of a pipeline, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// Where input files land.
    #[serde(with = "location_serde")]
    pub location: Location,
    /// File format.
    pub format: SourceFormat,
    /// Whole-file compression (CSV and JSON Lines).
    pub compression: Option<Compression>,
    /// SQL name of the input table.
    pub table: String,
    /// Declared schema, if any (otherwise inferred and pinned).
    pub schema: Option<Vec<ColumnSpec>>,
    /// Discovery mode.
    pub discovery: DiscoveryMode,
    /// Ordered mode: how many most recent keys to remember for late arrivals.
    pub lookback: u64,
    /// Notify mode: list the source to reconcile every this many runs.
    #[serde(
        default = "default_reconcile_every",
        skip_serializing_if = "is_default_reconcile_every"
    )]
    pub reconcile_every: u64,
    /// CSV: whether the first line is a header.
    pub header: bool,
    /// CSV: field delimiter.
    pub delimiter: u8,
}

impl Source {
    /// The file-name ending that marks an input file of this source.
    pub fn extension(&self) -> String {
        let base = match self.format {
            SourceFormat::Parquet => ".parquet",
            SourceFormat::Csv => ".csv",
            SourceFormat::Jsonl => ".jsonl",
        };
        match self.compression {
            None => base.to_string(),
            Some(Compression::Gzip) => format!("{base}.gz"),
            Some(Compression::Zstd) => format!("{base}.zst"),
        }
    }

    /// Whether `key` names an input file: the right ending, and no hidden or
    /// underscore-prefixed segment (temporary files, markers, metadata).
    pub fn is_input(&self, key: &str) -> bool {
        key.ends_with(&self.extension())
            && !key
                .split('/')
                .any(|s| s.starts_with('.') || s.starts_with('_'))
    }

    /// The declared schema as Arrow, if declared.
    pub fn declared_schema(&self) -> Option<SchemaRef> {
        self.schema.as_ref().map(|cols| {
            Arc::new(Schema::new(
                cols.iter()
                    .map(|c| {
                        Field::new(
                            &c.name,
                            DataType::from_str(&c.data_type).expect("validated when parsed"),
                            c.nullable,
                        )
                    })
                    .collect::<Vec<_>>(),
            ))
        })
    }
}

/// Batch and task bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// A batch takes at most this many files (and at least one).
    pub max_files_per_batch: u64,
    /// A batch takes at most this many bytes (but at least one file).
    pub max_bytes_per_batch: u64,
    /// A task (one operator invocation) takes at most this many bytes (but at
    /// least one file).
    pub max_bytes_per_task: u64,
    /// A run whose heartbeat is older than this has lost its lease.
    pub lease_ttl_seconds: u64,
    /// A batch with more tasks than this fans out through a Distributed Map
    /// that reads the task list from the checkpoint (S3), so neither the
    /// payload nor the execution history grows with the task count.
    #[serde(default = "default_max_inline_tasks")]
    pub max_inline_tasks: u64,
    /// An execution hands the rest of its run to a new execution after this
    /// many batches, so it stays inside Step Functions' 25,000-event history
    /// (an inline batch of 40 tasks is about 300 events).
    #[serde(default = "default_max_batches_per_execution")]
    pub max_batches_per_execution: u64,
}

fn default_max_inline_tasks() -> u64 {
    40
}

fn default_max_batches_per_execution() -> u64 {
    50
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_files_per_batch: 1000,
            max_bytes_per_batch: 1 << 30,
            max_bytes_per_task: 256 << 20,
            lease_ttl_seconds: 900,
            max_inline_tasks: default_max_inline_tasks(),
            max_batches_per_execution: default_max_batches_per_execution(),
        }
    }
}

/// A pipeline, parsed, validated and with its locations resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pipeline {
    /// Pipeline id: names its checkpoint folder and its executions.
    pub name: String,
    /// Input.
    pub source: Source,
    /// The continuous query, over `source.table`.
    pub sql: String,
    /// Where output Parquet files and manifests go.
    #[serde(with = "location_serde")]
    pub sink: Location,
    /// The checkpoint folder of this pipeline (`<checkpoint uri>/<name>`).
    #[serde(with = "location_serde")]
    pub checkpoint: Location,
    /// How many committed batches keep their offsets and commit records.
    pub retain_batches: u64,
    /// Batch and task bounds.
    pub limits: Limits,
}

mod location_serde {
    use super::Location;

    pub fn serialize<S: serde::Serializer>(l: &Location, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&l.display())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Location, D::Error> {
        let s: String = serde::Deserialize::deserialize(d)?;
        Location::parse(&s, std::path::Path::new("/")).map_err(serde::de::Error::custom)
    }
}

impl Pipeline {
    /// Read and validate a pipeline file. Relative paths resolve against the
    /// file's folder.
    pub fn load(path: &Path) -> Result<Pipeline> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Spec {
            file: file.clone(),
            message: format!("cannot read the pipeline file: {e}"),
        })?;
        let base = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let base = std::path::absolute(&base).map_err(|e| Error::Spec {
            file: file.clone(),
            message: format!("cannot resolve the folder of the pipeline file: {e}"),
        })?;
        Pipeline::parse(&text, &file, &base)
    }

    /// Parse and validate pipeline TOML; `file` names it in errors and `base`
    /// resolves relative paths.
    pub fn parse(text: &str, file: &str, base: &Path) -> Result<Pipeline> {
        let spec_err = |message: String| Error::Spec {
            file: file.to_string(),
            message,
        };
        let raw: PipelineFile = toml::from_str(text).map_err(|e| spec_err(toml_message(&e)))?;

        let name = raw.name.clone();
        if name.is_empty()
            || name.len() > 64
            || name.starts_with(['_', '-'])
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        {
            return Err(spec_err(format!(
                "name = \"{name}\": use 1 to 64 characters of a-z, 0-9, - and _, starting with a \
                 letter or digit (it names the checkpoint folder and the Step Functions executions)"
            )));
        }

        let at = |field: &str, uri: &str| -> Result<Location> {
            Location::parse(uri, base).map_err(|m| spec_err(format!("{field}: {m}")))
        };
        let src = &raw.source;
        let source_loc = at("source.uri", &src.uri)?;
        let sink = at("sink.uri", &raw.sink.uri)?;
        let checkpoint_root = at("checkpoint.uri", &raw.checkpoint.uri)?;
        let checkpoint = checkpoint_root.join(&name);

        if !is_identifier(&src.table) {
            return Err(spec_err(format!(
                "source.table = \"{}\": use a plain SQL name (letters, digits, _; not starting \
                 with a digit)",
                src.table
            )));
        }
        if src.compression.is_some() && src.format == SourceFormat::Parquet {
            return Err(spec_err(
                "source.compression: Parquet compresses inside the file; remove compression or \
                 use format = \"csv\" or \"jsonl\""
                    .to_string(),
            ));
        }
        if src.format != SourceFormat::Csv && (src.header.is_some() || src.delimiter.is_some()) {
            return Err(spec_err(
                "source.header and source.delimiter apply to format = \"csv\" only".to_string(),
            ));
        }
        let delimiter = match &src.delimiter {
            None => b',',
            Some(d) if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
            Some(d) => {
                return Err(spec_err(format!(
                    "source.delimiter = \"{d}\": use one ASCII character, such as \",\" or \"|\""
                )));
            }
        };
        let discovery = src.discovery.unwrap_or(DiscoveryMode::List);
        if src.lookback.is_some() && discovery != DiscoveryMode::Ordered {
            return Err(spec_err(
                "source.lookback applies to discovery = \"ordered\" only".to_string(),
            ));
        }
        if src.reconcile_every.is_some() && discovery != DiscoveryMode::Notify {
            return Err(spec_err(
                "source.reconcile_every applies to discovery = \"notify\" only".to_string(),
            ));
        }
        if src.reconcile_every == Some(0) {
            return Err(spec_err(
                "source.reconcile_every = 0: use a positive number of runs".to_string(),
            ));
        }
        if let Some(cols) = &src.schema {
            if cols.is_empty() {
                return Err(spec_err(
                    "source.schema is empty; list the columns or remove it to infer".to_string(),
                ));
            }
            for (i, c) in cols.iter().enumerate() {
                if let Err(e) = DataType::from_str(&c.data_type) {
                    return Err(spec_err(format!(
                        "source.schema[{i}] (column {}): type \"{}\" is not an Arrow type ({e}); \
                         write e.g. Int64, Float64, Utf8, Timestamp(Microsecond, None)",
                        c.name, c.data_type
                    )));
                }
            }
        }
        if let Some(f) = &raw.sink.format
            && f != "parquet"
        {
            return Err(spec_err(format!(
                "sink.format = \"{f}\": only \"parquet\" is supported"
            )));
        }
        for (field, loc) in [("sink.uri", &sink), ("checkpoint.uri", &checkpoint_root)] {
            if inside(loc, &source_loc) || inside(&source_loc, loc) {
                return Err(spec_err(format!(
                    "{field} ({}) overlaps source.uri ({}); outputs would be read back as \
                     input. Use separate folders or prefixes",
                    loc.display(),
                    source_loc.display()
                )));
            }
        }
        if inside(&sink, &checkpoint_root) || inside(&checkpoint_root, &sink) {
            return Err(spec_err(format!(
                "sink.uri ({}) and checkpoint.uri ({}) overlap; use separate folders or prefixes",
                sink.display(),
                checkpoint_root.display()
            )));
        }

        let d = Limits::default();
        let l = &raw.limits;
        let bytes = |field: &str, v: &Option<ByteSize>, default: u64| -> Result<u64> {
            match v {
                None => Ok(default),
                Some(b) => parse_bytes(b).map_err(|m| spec_err(format!("limits.{field}: {m}"))),
            }
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
        };
        for (field, v) in [
            ("max_files_per_batch", limits.max_files_per_batch),
            ("max_bytes_per_batch", limits.max_bytes_per_batch),
            ("max_bytes_per_task", limits.max_bytes_per_task),
            ("lease_ttl_seconds", limits.lease_ttl_seconds),
            ("max_inline_tasks", limits.max_inline_tasks),
            (
                "max_batches_per_execution",
                limits.max_batches_per_execution,
            ),
        ] {
            if v == 0 {
                return Err(spec_err(format!(
                    "limits.{field} = 0: use a positive value"
                )));
            }
        }
        let sql = raw.query.sql.trim().trim_end_matches(';').to_string();
        if sql.is_empty() {
            return Err(spec_err("query.sql is empty".to_string()));
        }

        Ok(Pipeline {
            name,
            source: Source {
                location: source_loc,
                format: src.format,
                compression: src.compression,
                table: src.table.clone(),
                schema: src.schema.clone(),
                discovery,
                lookback: src.lookback.unwrap_or(100),
                reconcile_every: src.reconcile_every.unwrap_or_else(default_reconcile_every),
                header: src.header.unwrap_or(true),
                delimiter,
            },
            sql,
            sink,
            checkpoint,
            retain_batches: raw.checkpoint.retain_batches.unwrap_or(100).max(1),
            limits,
        })
    }

    /// A stable hash of the resolved spec: equal hashes mean the spec that
    /// was validated and registered is the one being run.
    pub fn spec_hash(&self) -> String {
        let json = serde_json::to_vec(self).expect("a pipeline serializes");
        format!("{:016x}", crate::discovery::fnv1a(&json))
    }
}

fn toml_message(e: &toml::de::Error) -> String {
    // toml's message names the line, column and field; keep it, one line per
    // part, and add what to do.
    let msg = e.to_string();
    let msg = msg.trim_end();
    format!("{msg}\nfix the pipeline file; see README \"Pipeline file\" for the fields")
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
    }

    #[test]
    fn input_filter() {
        let p = parse(GOOD).unwrap();
        assert!(p.source.is_input("2024/01/a.parquet"));
        assert!(!p.source.is_input("2024/01/.a.parquet.tmp"));
        assert!(!p.source.is_input("_temporary/a.parquet"));
        assert!(!p.source.is_input("a.csv"));
    }
}
