//! The pipeline: what the user writes (TOML, parsed strictly in `parse`
//! and resolved into a [`Pipeline`] before anything runs) and its source
//! schema ([`schema`]).

use std::path::{Path, PathBuf};

use datafusion::arrow::datatypes::SchemaRef;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::storage::Location;

mod parse;
pub mod schema;
pub mod types;

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

impl SourceFormat {
    /// The name as written in a pipeline file.
    pub fn name(self) -> &'static str {
        match self {
            SourceFormat::Parquet => "parquet",
            SourceFormat::Csv => "csv",
            SourceFormat::Jsonl => "jsonl",
        }
    }
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
    /// The source is another Sluice pipeline's sink: read only its
    /// committed batches, through its manifests, with the manifest number
    /// as the offset.
    Manifests,
    /// A Kafka topic (`kafka://...`): each partition's offsets are the
    /// cursor; a run reads up to the end offsets its first plan found.
    Kafka,
    /// A Kinesis data stream (`kinesis://...`): each shard's last sequence
    /// number read is the cursor; a run reads up to the last record each
    /// shard held when its first plan looked, parents before children.
    Kinesis,
    /// A Delta table (`format = "delta"`): its snapshot, then the files
    /// each new version adds, with the log position as the cursor.
    Delta,
}

impl DiscoveryMode {
    /// The name as written in a pipeline file.
    pub fn name(self) -> &'static str {
        match self {
            DiscoveryMode::List => "list",
            DiscoveryMode::Ordered => "ordered",
            DiscoveryMode::Notify => "notify",
            DiscoveryMode::Manifests => "manifests",
            DiscoveryMode::Kafka => "kafka",
            DiscoveryMode::Kinesis => "kinesis",
            DiscoveryMode::Delta => "delta",
        }
    }
}

/// A column of a declared source schema.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    /// Column name.
    pub name: String,
    /// The type: a SQL name (`bigint`, `double`, `string`, `timestamp`,
    /// `decimal(10,2)`), or Arrow's (`Int64`, `Utf8View`); see
    /// [`types`].
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

/// What a run does with an input file that cannot be read at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BadFilePolicy {
    /// The batch fails naming the file; nothing is committed.
    #[default]
    Fail,
    /// The file is recorded with the reason and left out; the batch
    /// commits the rest, and the file waits for `sluice retry-quarantined`.
    Quarantine,
}

impl BadFilePolicy {
    fn is_fail(&self) -> bool {
        *self == BadFilePolicy::Fail
    }
}

/// What a run does with a malformed row of a CSV or JSON Lines file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BadRowPolicy {
    /// The batch fails naming the file; nothing is committed.
    #[default]
    Fail,
    /// The row is recorded (key, line, raw text, reason) and left out.
    Quarantine,
    /// Each bad field becomes null and the row is kept.
    Null,
}

impl BadRowPolicy {
    fn is_fail(&self) -> bool {
        *self == BadRowPolicy::Fail
    }
}

/// What a run does with an input file whose columns differ from the
/// schema in force (new, missing or renamed columns, a type that does not
/// cast without loss, CSV columns in another order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchemaChangePolicy {
    /// The batch fails naming the file, the columns and both types.
    #[default]
    Fail,
    /// New columns join the schema (nullable) from the batch that first
    /// holds them on, as a new schema version; missing columns read as
    /// null. A changed type still fails.
    AddColumns,
    /// The schema stays; what does not fit it (new columns, values a
    /// changed type cannot hold) goes into the `_rescued` column as JSON.
    Rescue,
}

impl SchemaChangePolicy {
    fn is_fail(&self) -> bool {
        *self == SchemaChangePolicy::Fail
    }
}

/// The column that holds, under `on_schema_change = "rescue"`, each row's
/// fields that do not fit the schema, as a JSON object (with the file's key
/// under `_file`); null where nothing was rescued.
pub const RESCUED: &str = "_rescued";

/// The column that holds, under `on_bad_row = "null"` with
/// `corrupt_record = true`, the raw text of each row that had fields made
/// null (Spark's `_corrupt_record`); null for rows read whole.
pub const CORRUPT_RECORD: &str = "_corrupt_record";

/// Columns Sluice fills rather than reads from a file, last in the schema
/// in this order when the pipeline asks for them.
pub const DERIVED: [&str; 2] = [CORRUPT_RECORD, RESCUED];

/// How many of `schema`'s last columns are [`DERIVED`].
pub(crate) fn derived_count(schema: &datafusion::arrow::datatypes::Schema) -> usize {
    schema
        .fields()
        .iter()
        .rev()
        .take_while(|f| DERIVED.contains(&f.name().as_str()))
        .count()
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
    /// Types for some columns of an inferred schema (Auto Loader's schema
    /// hints): column name -> type name; the other columns are inferred.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub schema_hints: std::collections::BTreeMap<String, String>,
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
    /// What to do with a file that cannot be read.
    #[serde(default, skip_serializing_if = "BadFilePolicy::is_fail")]
    pub on_bad_file: BadFilePolicy,
    /// What to do with a malformed row (CSV, JSON Lines).
    #[serde(default, skip_serializing_if = "BadRowPolicy::is_fail")]
    pub on_bad_row: BadRowPolicy,
    /// What to do with a file whose columns differ from the schema.
    #[serde(default, skip_serializing_if = "SchemaChangePolicy::is_fail")]
    pub on_schema_change: SchemaChangePolicy,
    /// Under `on_bad_row = "null"`: keep each repaired row's raw text in
    /// [`CORRUPT_RECORD`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub corrupt_record: bool,
    /// A record stream: where a new pipeline starts.
    #[serde(default, skip_serializing_if = "StartingOffsets::is_earliest")]
    pub starting_offsets: StartingOffsets,
    /// A Kinesis source's `starting_position` as a date: a new pipeline
    /// reads the shards it finds from the first record that arrived at or
    /// after it (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_at_ms: Option<i64>,
    /// A record stream: what to do when records were removed (retention)
    /// before they were read.
    #[serde(default, skip_serializing_if = "DataLossPolicy::is_fail")]
    pub on_data_loss: DataLossPolicy,
    /// A Delta source: skip versions that remove or rewrite files
    /// (Spark's `skipChangeCommits`) instead of failing on them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_changes: bool,
    /// A Kafka source: how the brokers are reached (Kafka's
    /// `security.protocol`). Credentials and certificates come from the
    /// environment, never the pipeline file.
    #[serde(default, skip_serializing_if = "SecurityProtocol::is_plaintext")]
    pub security_protocol: SecurityProtocol,
    /// A Kafka source under SASL: the mechanism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl_mechanism: Option<SaslMechanism>,
    /// A record stream read as Spark's Kafka columns (`format = "raw"` in
    /// the pipeline file: [`RAW_COLUMNS`]), not its values as JSON.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub raw: bool,
}

/// The columns of a record stream read raw: Spark's Kafka source's (its
/// `timestampType` and `headers` left out).
pub const RAW_COLUMNS: [(&str, &str); 6] = [
    ("key", "binary"),
    ("value", "binary"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),
];

/// The columns of a Kinesis stream read raw (`format = "raw"`): each
/// record as GetRecords gives it.
pub const KINESIS_RAW_COLUMNS: [(&str, &str); 5] = [
    ("data", "binary"),
    ("partition_key", "string"),
    ("sequence_number", "string"),
    ("shard_id", "string"),
    ("approximate_arrival_timestamp", "timestamp"),
];

/// How a Kafka source reaches its brokers, by Kafka's names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    /// No TLS, no authentication.
    #[default]
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL authentication without TLS.
    SaslPlaintext,
    /// SASL authentication over TLS (MSK's SASL/SCRAM listener).
    SaslSsl,
}

impl SecurityProtocol {
    fn is_plaintext(&self) -> bool {
        *self == SecurityProtocol::Plaintext
    }

    /// Whether connections use TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether connections authenticate with SASL.
    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// A SASL mechanism, by Kafka's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

/// Where a new record-stream pipeline starts reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartingOffsets {
    /// Every record the topic still holds.
    #[default]
    Earliest,
    /// Only records that arrive after the first run looked.
    Latest,
}

impl StartingOffsets {
    fn is_earliest(&self) -> bool {
        *self == StartingOffsets::Earliest
    }
}

/// What a run does when records it had yet to read are gone (the topic's
/// retention removed them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataLossPolicy {
    /// Refuse the batch, naming the partition and the lost offsets.
    #[default]
    Fail,
    /// Go on from the earliest record left; the commit records the loss.
    Skip,
}

impl DataLossPolicy {
    fn is_fail(&self) -> bool {
        *self == DataLossPolicy::Fail
    }
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

    /// Whether `key` names an input file: the right ending in any case
    /// (`.csv`, `.CSV`: uploads from some tools are upper case), and no
    /// hidden or underscore-prefixed segment (temporary files, markers,
    /// metadata).
    pub(crate) fn is_input(&self, key: &str) -> bool {
        let ext = self.extension();
        key.len() >= ext.len()
            && key.is_char_boundary(key.len() - ext.len())
            && key[key.len() - ext.len()..].eq_ignore_ascii_case(&ext)
            && !key
                .split('/')
                .any(|s| s.starts_with('.') || s.starts_with('_'))
    }

    /// The declared schema as Arrow, if declared. A spec read back from a
    /// checkpoint was not parsed from a file, so its types are checked here
    /// too.
    pub(crate) fn declared_schema(
        &self,
    ) -> std::result::Result<Option<SchemaRef>, schema::BadColumn> {
        self.schema.as_deref().map(schema::schema_of).transpose()
    }

    /// The types `schema_hints` gives, by column name (checked when the
    /// pipeline file was read).
    pub(crate) fn hints(&self) -> Vec<(String, datafusion::arrow::datatypes::DataType)> {
        self.schema_hints
            .iter()
            .filter_map(|(name, t)| Some((name.clone(), types::parse_type(t).ok()?)))
            .collect()
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
    /// A stateful query's state is split into this many partitions by a
    /// hash of the group key, each merged by its own task (fixed once
    /// state exists).
    #[serde(
        default = "default_state_partitions",
        skip_serializing_if = "is_default_state_partitions"
    )]
    pub state_partitions: u32,
    /// A record stream: a batch takes about this many records in all
    /// (Spark's `maxOffsetsPerTrigger`), split across partitions in
    /// proportion to what waits.
    #[serde(
        default = "default_max_records_per_batch",
        skip_serializing_if = "is_default_max_records_per_batch"
    )]
    pub max_records_per_batch: u64,
    /// A record stream: a task reads at most this many records.
    #[serde(
        default = "default_max_records_per_task",
        skip_serializing_if = "is_default_max_records_per_task"
    )]
    pub max_records_per_task: u64,
    /// Files: cut tasks so each takes about this many seconds at the pace
    /// the operator's tasks measured over recent batches (control's
    /// [`TaskPace`](crate::checkpoint::TaskPace)), never past
    /// `max_bytes_per_task`; `None`: by `max_bytes_per_task` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_seconds: Option<u64>,
}

fn default_max_records_per_batch() -> u64 {
    100_000
}

fn is_default_max_records_per_batch(n: &u64) -> bool {
    *n == default_max_records_per_batch()
}

fn default_max_records_per_task() -> u64 {
    20_000
}

fn is_default_max_records_per_task(n: &u64) -> bool {
    *n == default_max_records_per_task()
}

fn default_state_partitions() -> u32 {
    4
}

fn is_default_state_partitions(n: &u32) -> bool {
    *n == default_state_partitions()
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
            state_partitions: default_state_partitions(),
            max_records_per_batch: default_max_records_per_batch(),
            max_records_per_task: default_max_records_per_task(),
            task_seconds: None,
        }
    }
}

/// Microseconds in a Spark-style duration: `15 minutes`, `1 hour 30
/// minutes`, `30 seconds`, `500 milliseconds`, `2 days`; or written short,
/// `5m`, `1h30m`, `30s`, `500ms`.
pub fn duration_us(text: &str) -> Result<i64, String> {
    // Split "1h30m" into "1", "h", "30", "m" (and "5 minutes" as it is).
    let mut words: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        let mut current = String::new();
        for c in word.chars() {
            let boundary = current
                .chars()
                .last()
                .is_some_and(|p| p.is_ascii_digit() != c.is_ascii_digit());
            if boundary {
                words.push(std::mem::take(&mut current));
            }
            current.push(c);
        }
        words.push(current);
    }
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    if words.is_empty() || !words.len().is_multiple_of(2) {
        return Err(format!(
            "\"{text}\" is not a duration: write e.g. \"15 minutes\" or \"1 hour 30 minutes\""
        ));
    }
    let mut total: i64 = 0;
    for pair in words.chunks(2) {
        let n: i64 = pair[0]
            .parse()
            .map_err(|_| format!("\"{text}\": \"{}\" is not a whole number", pair[0]))?;
        let unit: i64 = match pair[1].to_ascii_lowercase().as_str() {
            "ms" | "millisecond" | "milliseconds" => 1_000,
            "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000,
            "h" | "hour" | "hours" => 3_600_000_000,
            "d" | "day" | "days" => 86_400_000_000,
            "w" | "week" | "weeks" => 7 * 86_400_000_000,
            other => {
                return Err(format!(
                    "\"{text}\": unknown unit \"{other}\" (use milliseconds, seconds, minutes, \
                     hours, days or weeks; months vary in length)"
                ));
            }
        };
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("\"{text}\" is too long"))?;
    }
    if total <= 0 {
        return Err(format!("\"{text}\": a window must be longer than zero"));
    }
    Ok(total)
}

/// How a stateful query's results reach the sink (`[sink] mode`), as in
/// Spark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputMode {
    /// Each window once, by the batch whose watermark passes its end.
    #[default]
    Append,
    /// The groups each batch changed (a change log).
    Update,
    /// The whole result, every batch (each manifest a complete snapshot).
    Complete,
}

impl OutputMode {
    fn is_append(&self) -> bool {
        *self == OutputMode::Append
    }
}

/// How the sink's committed output is laid out (`[sink] format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkFormat {
    /// Parquet parts under `batch=N/`, with a manifest per batch.
    #[default]
    Parquet,
    /// The same parts, also committed to a Delta table in the sink folder
    /// (one Delta commit per batch).
    Delta,
}

impl SinkFormat {
    fn is_parquet(&self) -> bool {
        *self == SinkFormat::Parquet
    }
}

/// `[watermark]`: the event time of a stateful query.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Watermark {
    /// The event-time column (a timestamp).
    pub column: String,
    /// How late a row may arrive, microseconds: the watermark after a batch
    /// is the largest event time seen minus this.
    pub delay_us: i64,
    /// Beyond Spark: at each run the watermark also advances to the wall
    /// clock minus this (microseconds), so a run with no new data closes
    /// windows whose data can no longer arrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wallclock_bound_us: Option<i64>,
    /// Late rows are dropped (counted), or also written, as read, under the
    /// sink's `_late/batch=N/`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub late_side_output: bool,
}

/// `[deduplicate]`: drop a row whose key was already seen (Spark's
/// `dropDuplicatesWithinWatermark`), before the query.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Deduplicate {
    /// The columns that identify a row (source columns).
    pub key: Vec<String>,
    /// No `[watermark]`: keys are never forgotten (`keep = "forever"`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forever: bool,
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
    /// Event time, for a stateful query over windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<Watermark>,
    /// Drop rows whose key was already seen, before the query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deduplicate: Option<Deduplicate>,
    /// How a stateful query's results reach the sink.
    #[serde(default, skip_serializing_if = "OutputMode::is_append")]
    pub output_mode: OutputMode,
    /// The sink's layout.
    #[serde(default, skip_serializing_if = "SinkFormat::is_parquet")]
    pub sink_format: SinkFormat,
    /// A Delta sink writes a log checkpoint every this many versions
    /// (`[sink] delta_checkpoint_interval`; the default when `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_checkpoint_interval: Option<u64>,
    /// The output columns whose values name the parts' folders
    /// (`[sink] partition_by`: Hive-style `col=value/`, and a Delta
    /// table's partition columns).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_by: Vec<String>,
    /// Static tables the query may join the input with (`[[static]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statics: Vec<StaticTable>,
}

/// A static table (`[[static]]`): files the query joins the input with,
/// read whole as they stand when each batch is planned (the plan pins
/// their keys, sizes and entity tags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaticTable {
    /// Its name in the query.
    pub table: String,
    /// Its folder or prefix.
    #[serde(with = "location_serde")]
    pub location: Location,
    /// Its files' format (a Delta table's are Parquet).
    pub format: SourceFormat,
    /// A Delta table: its files and schema come from its log.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delta: bool,
    /// CSV: whether the first line names the columns.
    pub header: bool,
    /// Refused above this many bytes (every task reads it whole).
    pub max_bytes: u64,
}

mod location_serde {
    use super::Location;

    pub(crate) fn serialize<S: serde::Serializer>(l: &Location, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&l.display())
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Location, D::Error> {
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

    /// A stable hash of the resolved spec: equal hashes mean the spec that
    /// was validated and registered is the one being run.
    pub fn spec_hash(&self) -> String {
        let json = serde_json::to_vec(self).expect("a pipeline serializes");
        format!("{:016x}", crate::hash::fnv1a(&json))
    }
}
