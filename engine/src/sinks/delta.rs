//! Delta Lake publishing (`sink.format = "delta"`). The parts a batch
//! commits are the Parquet sink's, published the same way (copied from
//! staging to `batch=N/...`); the Delta commit is the last publish step:
//! one log entry `_delta_log/<version>.json` naming those parts as `add`
//! actions (with their row counts and column statistics), the
//! application transaction `txn {appId: <pipeline>-<history>, version:
//! <batch>}` and the commit's info. It is written create-only (S3
//! `If-None-Match`, no lock table), after the batch's Sluice commit
//! record, so it only ever names committed output.
//!
//! Exactly once: before writing, the log is read back from its latest
//! entry to the last one of this history (its `txn`) or the last
//! `metaData`; a `txn` version at or past the batch means the batch is in
//! the table already (recovery, or a run that lost its lease) and nothing
//! is written. A version taken meanwhile (another writer's blind append)
//! makes the commit read again and go to the next version.
//!
//! Fencing: the table's `metaData.configuration` names the pipeline and
//! the history whose commits it holds (`sluice.pipeline`,
//! `sluice.history`). A run appends only on a log whose newest `metaData`
//! or `txn` of a Sluice history is its own; `sluice reset` retires the
//! sink's owner record, then writes a commit that removes every live file
//! and marks the table retired (an empty history). A run stopped past its
//! lease and resumed after a reset therefore either finds the version it
//! read taken (and, reading again, the retired mark: it stops), or reads
//! the retired mark and finds the owner record no longer its own. The log
//! is never deleted: a deleted log would let such a run write a version
//! far past the new history's, a gap no reader can read.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{Array, ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::scalar::ScalarValue;
use serde_json::{Value, json};

use crate::checkpoint::{Commit, OutputFile};
use crate::error::{Error, ErrorClass, Result};
use crate::storage::{PutMode, PutOutcome, Store};

/// The log's folder in the table.
pub(crate) const LOG_PREFIX: &str = "_delta_log/";

/// The table configuration keys that name the pipeline and history whose
/// commits the table holds.
const PIPELINE_KEY: &str = "sluice.pipeline";
const HISTORY_KEY: &str = "sluice.history";

/// The log entry of `version`.
pub(crate) fn commit_key(version: u64) -> String {
    format!("{LOG_PREFIX}{version:020}.json")
}

/// The version of log entry `key`, if it is a commit (not a checkpoint or
/// a temporary file).
pub(crate) fn version_of(key: &str) -> Option<u64> {
    let digits = key.strip_prefix(LOG_PREFIX)?.strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// How a pipeline's batches are committed to its Delta table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaSettings {
    /// A log checkpoint is written once this many versions followed the
    /// newest one (`[sink] delta_checkpoint_interval`; Delta's
    /// `delta.checkpointInterval`, whose default is 10 too).
    pub checkpoint_interval: u64,
    /// Each batch replaces the table's content (`sink.mode = "complete"`):
    /// its commit removes every live file and adds the batch's parts.
    pub complete: bool,
    /// The table's partition columns (`sink.partition_by`).
    pub partition_by: Vec<String>,
}

impl Default for DeltaSettings {
    fn default() -> Self {
        DeltaSettings {
            checkpoint_interval: 10,
            complete: false,
            partition_by: Vec::new(),
        }
    }
}

/// The hint readers start from: the version of the newest checkpoint.
const LAST_CHECKPOINT: &str = "_delta_log/_last_checkpoint";

/// How long a removed file stays in checkpoints as a tombstone (Delta's
/// default `delta.deletedFileRetentionDuration`, a week).
const TOMBSTONE_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;

/// The (single-part) log checkpoint of `version`.
pub(crate) fn checkpoint_key(version: u64) -> String {
    format!("{LOG_PREFIX}{version:020}.checkpoint.parquet")
}

/// The version of single-part checkpoint `key`.
fn checkpoint_version_of(key: &str) -> Option<u64> {
    let digits = key
        .strip_prefix(LOG_PREFIX)?
        .strip_suffix(".checkpoint.parquet")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The part of the log that holds the table's state: its newest
/// checkpoint, and the entries after it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Segment {
    checkpoint: Option<u64>,
    /// The entries after the checkpoint (all of them without one),
    /// ascending and without gaps.
    versions: Vec<u64>,
}

impl Segment {
    pub(crate) fn latest(&self) -> Option<u64> {
        self.versions.last().copied().or(self.checkpoint)
    }

    /// How many versions up to `version` the newest checkpoint misses.
    fn since_checkpoint(&self, version: u64) -> u64 {
        match self.checkpoint {
            Some(c) => version.saturating_sub(c),
            None => version + 1,
        }
    }
}

/// A table's state at a version: what replaying its log gives.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) protocol: Option<Value>,
    pub(crate) meta: Option<Value>,
    /// The live files' `add` actions, by path.
    pub(crate) live: BTreeMap<String, Value>,
    /// The removed files' `remove` actions, by path.
    tombstones: BTreeMap<String, Value>,
    /// The newest `txn` of each application.
    txns: BTreeMap<String, Value>,
}

impl Snapshot {
    fn apply(&mut self, a: &Value) {
        if let Some(add) = a.get("add")
            && let Some(p) = add.get("path").and_then(Value::as_str)
        {
            self.tombstones.remove(p);
            self.live.insert(p.to_string(), add.clone());
        }
        if let Some(rm) = a.get("remove")
            && let Some(p) = rm.get("path").and_then(Value::as_str)
        {
            self.live.remove(p);
            self.tombstones.insert(p.to_string(), rm.clone());
        }
        if let Some(m) = a.get("metaData") {
            self.meta = Some(m.clone());
        }
        if let Some(p) = a.get("protocol") {
            self.protocol = Some(p.clone());
        }
        if let Some(t) = a.get("txn")
            && let Some(app) = t.get("appId").and_then(Value::as_str)
        {
            self.txns.insert(app.to_string(), t.clone());
        }
    }
}

/// The Arrow schema of a log checkpoint (the spec's, for the actions
/// Sluice keeps: `txn`, `add`, `remove`, `metaData`, `protocol`).
fn checkpoint_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, true);
    let long = |n: &str| Field::new(n, DataType::Int64, true);
    let int = |n: &str| Field::new(n, DataType::Int32, true);
    let flag = |n: &str| Field::new(n, DataType::Boolean, true);
    let map = |n: &str| {
        Field::new_map(
            n,
            "key_value",
            Field::new("key", DataType::Utf8, false),
            Field::new("value", DataType::Utf8, true),
            false,
            true,
        )
    };
    let list = |n: &str| Field::new_list(n, Field::new("element", DataType::Utf8, true), true);
    let record = |n: &str, f: Vec<Field>| Field::new(n, DataType::Struct(f.into()), true);
    Arc::new(Schema::new(vec![
        record(
            "txn",
            vec![s("appId"), long("version"), long("lastUpdated")],
        ),
        record(
            "add",
            vec![
                s("path"),
                map("partitionValues"),
                long("size"),
                long("modificationTime"),
                flag("dataChange"),
                s("stats"),
            ],
        ),
        record(
            "remove",
            vec![
                s("path"),
                long("deletionTimestamp"),
                flag("dataChange"),
                flag("extendedFileMetadata"),
                map("partitionValues"),
                long("size"),
            ],
        ),
        record(
            "metaData",
            vec![
                s("id"),
                s("name"),
                s("description"),
                record("format", vec![s("provider"), map("options")]),
                s("schemaString"),
                list("partitionColumns"),
                map("configuration"),
                long("createdTime"),
            ],
        ),
        record(
            "protocol",
            vec![
                int("minReaderVersion"),
                int("minWriterVersion"),
                list("readerFeatures"),
                list("writerFeatures"),
            ],
        ),
    ]))
}

/// The checkpoint Parquet of a snapshot taken at `now_ms`, and how many
/// actions it holds.
fn checkpoint_parquet(snap: &Snapshot, now_ms: i64) -> std::result::Result<(Bytes, u64), String> {
    let mut rows: Vec<Value> = Vec::new();
    if let Some(p) = &snap.protocol {
        rows.push(json!({ "protocol": p }));
    }
    if let Some(m) = &snap.meta {
        rows.push(json!({ "metaData": m }));
    }
    for t in snap.txns.values() {
        rows.push(json!({ "txn": t }));
    }
    for a in snap.live.values() {
        let mut a = a.clone();
        a["dataChange"] = json!(false);
        rows.push(json!({ "add": a }));
    }
    let keep_after = now_ms - TOMBSTONE_RETENTION_MS;
    for r in snap.tombstones.values() {
        if r.get("deletionTimestamp")
            .and_then(Value::as_i64)
            .is_none_or(|t| t >= keep_after)
        {
            rows.push(json!({ "remove": r }));
        }
    }
    let schema = checkpoint_schema();
    let mut decoder = datafusion::arrow::json::ReaderBuilder::new(schema.clone())
        .build_decoder()
        .map_err(|e| e.to_string())?;
    decoder.serialize(&rows).map_err(|e| e.to_string())?;
    let batch = decoder
        .flush()
        .map_err(|e| e.to_string())?
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone()));
    let mut buf = Vec::new();
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(&mut buf, schema, None)
        .map_err(|e| e.to_string())?;
    w.write(&batch).map_err(|e| e.to_string())?;
    w.close().map_err(|e| e.to_string())?;
    Ok((Bytes::from(buf), rows.len() as u64))
}

/// The actions a checkpoint Parquet holds, as JSON (as a log entry's).
fn checkpoint_rows(bytes: Bytes) -> std::result::Result<Vec<Value>, String> {
    use datafusion::parquet::arrow::ProjectionMask;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| e.to_string())?;
    // Only the actions a table's state is made of (a checkpoint may also
    // hold parsed statistics, sidecars and more).
    let wanted = ["txn", "add", "remove", "metaData", "protocol"];
    let roots: Vec<usize> = builder
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| wanted.contains(&f.name().as_str()))
        .map(|(i, _)| i)
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| e.to_string())?;
        let mut w = datafusion::arrow::json::LineDelimitedWriter::new(Vec::new());
        w.write(&batch).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
        for line in w.into_inner().split(|b| *b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let v: Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
            // A row of a column this reader dropped.
            if v.as_object().is_some_and(|o| !o.is_empty()) {
                out.push(v);
            }
        }
    }
    Ok(out)
}

/// The table features a protocol lists under `key` (`readerFeatures`,
/// `writerFeatures`).
pub(crate) fn features(protocol: &Value, key: &str) -> Vec<String> {
    protocol[key]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Why Sluice cannot write to a table of this protocol and metadata, if
/// it cannot: a feature it would have to honour and does not.
fn unsupported(protocol: Option<&Value>, meta: Option<&Value>) -> Option<String> {
    if let Some(p) = protocol {
        let reader = p["minReaderVersion"].as_u64().unwrap_or(1);
        let writer = p["minWriterVersion"].as_u64().unwrap_or(2);
        let names = |k: &str| features(p, k);
        // Features Sluice honours (invariants: refused below when the
        // schema has any), and variantType while no column is a variant
        // (delta-rs lists it on every table it alters).
        let variant = meta
            .and_then(|m| m["schemaString"].as_str())
            .is_some_and(|s| s.contains("variant"));
        let honoured = |f: &str| {
            matches!(f, "timestampNtz" | "appendOnly" | "invariants")
                || (f == "variantType" && !variant)
        };
        let unknown: Vec<String> = match writer {
            0..=2 => Vec::new(),
            7 => names("writerFeatures")
                .into_iter()
                .filter(|f| !honoured(f))
                .collect(),
            3 => vec!["checkConstraints".to_string()],
            4 => vec!["changeDataFeed or generatedColumns".to_string()],
            5 => vec!["columnMapping".to_string()],
            _ => vec![format!("writer version {writer}")],
        };
        let unknown_reader: Vec<String> = match reader {
            0..=1 => Vec::new(),
            2 => vec!["columnMapping".to_string()],
            3 => names("readerFeatures")
                .into_iter()
                .filter(|f| !honoured(f) || f == "appendOnly" || f == "invariants")
                .collect(),
            _ => vec![format!("reader version {reader}")],
        };
        let mut all = unknown;
        all.extend(unknown_reader);
        all.sort();
        all.dedup();
        if !all.is_empty() {
            return Some(format!(
                "another writer raised the Delta table's protocol to features Sluice does not \
                 implement ({}), and writing on would break them",
                all.join(", ")
            ));
        }
    }
    if let Some(m) = meta
        && m["schemaString"]
            .as_str()
            .is_some_and(|s| s.contains("delta.invariants"))
    {
        return Some(
            "the Delta table's schema has column invariants (delta.invariants), which Sluice \
             does not check"
                .to_string(),
        );
    }
    None
}

/// What to do about a table another writer gave a feature Sluice does not
/// honour (a table feature is never removed from a table's protocol).
const UNWRITABLE: &str = "Sluice cannot write this table any more (a Delta table keeps the \
                          features its protocol lists, even once unused): run `sluice reset` \
                          on the pipeline file, then point sink.uri at a new folder before the \
                          next run (the reset leaves this table's rows in its history)";

/// `sluice reset` refused on an append-only table.
fn append_only_reset(store: &dyn Store) -> Error {
    Error::Spec {
        file: store.describe(),
        message: "the sink's Delta table is append-only (delta.appendOnly = true, set by another \
                  writer), and `sluice reset` would remove its files: unset it, or move the \
                  table away, then run `sluice reset` again"
            .into(),
    }
}

/// `protocol` (a new table's when `None`) raised to read and write
/// timestamps without a zone, keeping every feature it has (a legacy
/// version's implied features listed, as table features require); `None`
/// when it has them already.
fn with_ntz(protocol: Option<&Value>) -> Option<Value> {
    let p = protocol
        .cloned()
        .unwrap_or_else(|| json!({"minReaderVersion": 1, "minWriterVersion": 2}));
    let reader = p["minReaderVersion"].as_u64().unwrap_or(1);
    let writer = p["minWriterVersion"].as_u64().unwrap_or(2);
    let listed = |k: &str| features(&p, k);
    let mut readers = if reader >= 3 {
        listed("readerFeatures")
    } else if reader == 2 {
        vec!["columnMapping".to_string()]
    } else {
        Vec::new()
    };
    let mut writers = if writer >= 7 {
        listed("writerFeatures")
    } else {
        // What each legacy writer version implies.
        [
            (2, "appendOnly"),
            (2, "invariants"),
            (3, "checkConstraints"),
            (4, "changeDataFeed"),
            (4, "generatedColumns"),
            (5, "columnMapping"),
            (6, "identityColumns"),
        ]
        .into_iter()
        .filter(|(v, _)| writer >= *v)
        .map(|(_, f)| f.to_string())
        .collect()
    };
    let ntz = "timestampNtz".to_string();
    if reader >= 3 && writer >= 7 && readers.contains(&ntz) && writers.contains(&ntz) {
        return None;
    }
    for list in [&mut readers, &mut writers] {
        if !list.contains(&ntz) {
            list.push(ntz.clone());
        }
    }
    Some(json!({
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": readers,
        "writerFeatures": writers,
    }))
}

/// Whether the table's settings forbid removing files.
fn append_only(meta: Option<&Value>) -> bool {
    meta.and_then(|m| m["configuration"].get("delta.appendOnly"))
        .and_then(Value::as_str)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The application id of a pipeline's history in the table's `txn`
/// actions (Spark's streaming sink uses its query id the same way).
pub(crate) fn app_id(pipeline: &str, history: &str) -> String {
    format!("{pipeline}-{history}")
}

/// The type a column is written as in a Delta table's parts, where the
/// Arrow type has no Delta type of its own but a wider one holds every
/// value: unsigned integers widen, half floats become floats, nanosecond
/// timestamps become microseconds (Delta's unit; nanoseconds are cut),
/// millisecond dates become timestamps.
pub(crate) fn delta_physical(dt: &DataType) -> Option<DataType> {
    Some(match dt {
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 => DataType::Int64,
        DataType::UInt64 => DataType::Decimal128(20, 0),
        DataType::Float16 => DataType::Float32,
        DataType::Timestamp(TimeUnit::Nanosecond, tz) => {
            DataType::Timestamp(TimeUnit::Microsecond, tz.clone())
        }
        DataType::Date64 => DataType::Timestamp(TimeUnit::Millisecond, None),
        DataType::Dictionary(_, v) => delta_physical(v).unwrap_or_else(|| v.as_ref().clone()),
        _ => return None,
    })
}

/// The Delta type of an Arrow type (as written, after
/// [`delta_physical`]), or why there is none.
fn delta_type(dt: &DataType) -> std::result::Result<Value, String> {
    Ok(match dt {
        DataType::Boolean => json!("boolean"),
        DataType::Int8 => json!("byte"),
        DataType::Int16 => json!("short"),
        DataType::Int32 => json!("integer"),
        DataType::Int64 => json!("long"),
        DataType::Float32 => json!("float"),
        DataType::Float64 => json!("double"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => json!("string"),
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => json!("binary"),
        DataType::Date32 => json!("date"),
        DataType::Timestamp(_, Some(_)) => json!("timestamp"),
        DataType::Timestamp(_, None) => json!("timestamp_ntz"),
        DataType::Decimal128(p, s) if *p <= 38 && *s >= 0 => json!(format!("decimal({p},{s})")),
        DataType::Struct(fields) => json!({
            "type": "struct",
            "fields": fields.iter().map(|f| delta_field(f)).collect::<std::result::Result<Vec<_>, _>>()?,
        }),
        DataType::List(f) | DataType::LargeList(f) | DataType::ListView(f) => json!({
            "type": "array",
            "elementType": delta_type(f.data_type())?,
            "containsNull": f.is_nullable(),
        }),
        DataType::Map(entries, _) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return Err(format!("{dt}"));
            };
            json!({
                "type": "map",
                "keyType": delta_type(kv[0].data_type())?,
                "valueType": delta_type(kv[1].data_type())?,
                "valueContainsNull": kv[1].is_nullable(),
            })
        }
        other => return Err(format!("{other}")),
    })
}

/// The Arrow type of a Delta type (a `schemaString` field's `type`), as
/// DataFusion reads the column from the table's Parquet files: top-level
/// strings and binaries in their view layout (`top`), timestamps in
/// microseconds (Delta's unit; `timestamp` is an instant, held in UTC),
/// maps with Parquet's `key_value` entries. `Err`: the type as written,
/// which a Delta source does not read (`variant`, an unknown name).
pub(crate) fn arrow_type(t: &Value, top: bool) -> std::result::Result<DataType, String> {
    if let Some(name) = t.as_str() {
        return Ok(match name {
            "boolean" => DataType::Boolean,
            "byte" => DataType::Int8,
            "short" => DataType::Int16,
            "integer" => DataType::Int32,
            "long" => DataType::Int64,
            "float" => DataType::Float32,
            "double" => DataType::Float64,
            "string" if top => DataType::Utf8View,
            "string" => DataType::Utf8,
            "binary" if top => DataType::BinaryView,
            "binary" => DataType::Binary,
            "date" => DataType::Date32,
            "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            "timestamp_ntz" => DataType::Timestamp(TimeUnit::Microsecond, None),
            d => {
                let (p, s) = d
                    .strip_prefix("decimal(")
                    .and_then(|r| r.strip_suffix(')'))
                    .and_then(|r| r.split_once(','))
                    .ok_or_else(|| d.to_string())?;
                let p: u8 = p.trim().parse().map_err(|_| d.to_string())?;
                let s: i8 = s.trim().parse().map_err(|_| d.to_string())?;
                if p == 0 || p > 38 || s < 0 || s as u8 > p {
                    return Err(d.to_string());
                }
                DataType::Decimal128(p, s)
            }
        });
    }
    let nested = |v: &Value| arrow_type(v, false);
    match t["type"].as_str() {
        Some("struct") => Ok(DataType::Struct(
            t["fields"]
                .as_array()
                .ok_or_else(|| t.to_string())?
                .iter()
                .map(|f| arrow_field(f, false))
                .collect::<std::result::Result<Vec<_>, _>>()?
                .into(),
        )),
        Some("array") => Ok(DataType::List(Arc::new(Field::new(
            "element",
            nested(&t["elementType"])?,
            t["containsNull"].as_bool() != Some(false),
        )))),
        Some("map") => Ok(DataType::Map(
            Arc::new(Field::new(
                "key_value",
                DataType::Struct(
                    vec![
                        Field::new("key", nested(&t["keyType"])?, false),
                        Field::new(
                            "value",
                            nested(&t["valueType"])?,
                            t["valueContainsNull"].as_bool() != Some(false),
                        ),
                    ]
                    .into(),
                ),
                false,
            )),
            false,
        )),
        _ => Err(t.to_string()),
    }
}

/// A `schemaString` field as an Arrow field (see [`arrow_type`]); `Err`
/// names the field and its type.
fn arrow_field(f: &Value, top: bool) -> std::result::Result<Field, String> {
    let name = f["name"].as_str().unwrap_or_default();
    let t = arrow_type(&f["type"], top).map_err(|t| format!("column \"{name}\" of type {t}"))?;
    Ok(Field::new(name, t, f["nullable"].as_bool() != Some(false)))
}

/// The Arrow schema of a Delta table's `schemaString`, or the column a
/// Delta source cannot read (its type).
pub(crate) fn arrow_schema(schema_string: &str) -> std::result::Result<Schema, String> {
    let v: Value = serde_json::from_str(schema_string).map_err(|e| format!("{e}"))?;
    let fields = v["fields"]
        .as_array()
        .ok_or("no fields")?
        .iter()
        .map(|f| arrow_field(f, true))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Schema::new(fields))
}

fn delta_field(f: &Field) -> std::result::Result<Value, String> {
    Ok(json!({
        "name": f.name(),
        "type": delta_type(f.data_type())?,
        "nullable": f.is_nullable(),
        "metadata": {},
    }))
}

/// The Delta schema (`schemaString`) of the parts' Arrow schema, or the
/// column whose type Delta has none for and what to do.
pub(crate) fn schema_string(schema: &SchemaRef) -> std::result::Result<String, String> {
    // Delta's column names are case-insensitive: readers refuse a table
    // with two names that differ only in case.
    let mut seen: std::collections::BTreeMap<String, &str> = Default::default();
    for f in schema.fields() {
        if let Some(other) = seen.insert(f.name().to_lowercase(), f.name()) {
            return Err(format!(
                "columns \"{other}\" and \"{}\" differ only in case, and a Delta table's column \
                 names are case-insensitive (its readers refuse such a table); rename one with AS \
                 in query.sql",
                f.name()
            ));
        }
    }
    let mut fields = Vec::new();
    for f in schema.fields() {
        fields.push(delta_field(f).map_err(|t| {
            format!(
                "column \"{}\" has type {t}, which a Delta table cannot hold; CAST it in \
                 query.sql to a type Delta has (boolean, integers, float, double, decimal, \
                 string, binary, date, timestamp, struct, array, map)",
                f.name()
            )
        })?);
    }
    Ok(json!({"type": "struct", "fields": fields}).to_string())
}

/// Whether a Delta schema holds a `timestamp_ntz` column anywhere (the
/// table then needs the `timestampNtz` reader and writer feature).
fn has_ntz(schema_string: &str) -> bool {
    schema_string.contains("\"timestamp_ntz\"")
}

/// Strings longer than this get no min/max statistics (a cut maximum
/// would be below the real one, and readers would skip files they need).
const MAX_STAT_STRING: usize = 32;

/// Column statistics of one part, gathered batch by batch as it is
/// written: row count, nulls per column, and min/max for the top-level
/// columns whose values order as readers order them.
pub(crate) struct PartStats {
    rows: u64,
    columns: Vec<ColumnStats>,
}

struct ColumnStats {
    name: String,
    /// Nested columns (structs, lists, maps) get no null count: Delta's
    /// is an object per struct field, and a number there makes deltalake
    /// refuse the table.
    nested: bool,
    nulls: u64,
    min: Option<datafusion::functions_aggregate::min_max::MinAccumulator>,
    max: Option<datafusion::functions_aggregate::min_max::MaxAccumulator>,
}

/// Whether min/max statistics are kept for a column of this type: numbers,
/// strings, dates and zoned timestamps (readers compare those as written).
fn has_min_max(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Date32
            | DataType::Timestamp(_, Some(_))
    )
}

impl PartStats {
    /// Statistics of a part of `schema` (as written), none gathered yet.
    pub(crate) fn new(schema: &SchemaRef) -> PartStats {
        use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
        PartStats {
            rows: 0,
            columns: schema
                .fields()
                .iter()
                .map(|f| {
                    let dt = f.data_type();
                    let keep = has_min_max(dt);
                    ColumnStats {
                        name: f.name().clone(),
                        nested: dt.is_nested(),
                        nulls: 0,
                        min: keep.then(|| MinAccumulator::try_new(dt).ok()).flatten(),
                        max: keep.then(|| MaxAccumulator::try_new(dt).ok()).flatten(),
                    }
                })
                .collect(),
        }
    }

    /// Take one record batch (of the part's schema) into the statistics.
    pub(crate) fn update(&mut self, columns: &[ArrayRef]) -> Result<()> {
        use datafusion::logical_expr::Accumulator;
        let fail = |e: datafusion::error::DataFusionError| Error::Service {
            service: "delta",
            message: format!("column statistics: {e}"),
            class: ErrorClass::Fatal,
        };
        if let Some(c) = columns.first() {
            self.rows += c.len() as u64;
        }
        for (s, c) in self.columns.iter_mut().zip(columns) {
            s.nulls += c.null_count() as u64;
            if let Some(m) = &mut s.min {
                m.update_batch(std::slice::from_ref(c)).map_err(fail)?;
            }
            if let Some(m) = &mut s.max {
                m.update_batch(std::slice::from_ref(c)).map_err(fail)?;
            }
        }
        Ok(())
    }

    /// Delta's `stats` JSON of the part.
    pub(crate) fn finish(mut self) -> String {
        use datafusion::logical_expr::Accumulator;
        let mut min_values = serde_json::Map::new();
        let mut max_values = serde_json::Map::new();
        let mut null_count = serde_json::Map::new();
        for s in &mut self.columns {
            if !s.nested {
                null_count.insert(s.name.clone(), json!(s.nulls));
            }
            let (Some(min), Some(max)) = (&mut s.min, &mut s.max) else {
                continue;
            };
            let (Ok(lo), Ok(hi)) = (min.evaluate(), max.evaluate()) else {
                continue;
            };
            if let (Some(lo), Some(hi)) = (stat_value(&lo), stat_value(&hi)) {
                min_values.insert(s.name.clone(), lo);
                max_values.insert(s.name.clone(), hi);
            }
        }
        json!({
            "numRecords": self.rows,
            "minValues": min_values,
            "maxValues": max_values,
            "nullCount": null_count,
        })
        .to_string()
    }
}

/// A min or max as Delta's statistics write it; `None` where it is not
/// kept (no value, NaN or infinite floats, long strings).
fn stat_value(v: &ScalarValue) -> Option<Value> {
    let finite = |f: f64| f.is_finite().then(|| json!(f));
    match v {
        ScalarValue::Int8(Some(n)) => Some(json!(n)),
        ScalarValue::Int16(Some(n)) => Some(json!(n)),
        ScalarValue::Int32(Some(n)) => Some(json!(n)),
        ScalarValue::Int64(Some(n)) => Some(json!(n)),
        ScalarValue::Float32(Some(f)) => finite(f64::from(*f)),
        ScalarValue::Float64(Some(f)) => finite(*f),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => {
            (s.chars().count() <= MAX_STAT_STRING).then(|| json!(s))
        }
        ScalarValue::Date32(Some(d)) => chrono::DateTime::from_timestamp(i64::from(*d) * 86_400, 0)
            .map(|t| json!(t.format("%Y-%m-%d").to_string())),
        ScalarValue::TimestampSecond(Some(t), Some(_)) => micros_iso(t.checked_mul(1_000_000)?),
        ScalarValue::TimestampMillisecond(Some(t), Some(_)) => micros_iso(t.checked_mul(1_000)?),
        ScalarValue::TimestampMicrosecond(Some(t), Some(_)) => micros_iso(*t),
        _ => None,
    }
}

/// A UTC instant in microseconds as Delta's statistics write timestamps
/// (milliseconds, `Z`). A maximum with sub-millisecond digits would be
/// cut below the real one, so it is left out.
fn micros_iso(us: i64) -> Option<Value> {
    if us % 1_000 != 0 {
        return None;
    }
    let t = chrono::DateTime::from_timestamp_micros(us)?;
    Some(json!(t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()))
}

/// The newest state of the log that a commit decides on.
#[derive(Debug, Default)]
struct Tip {
    /// The latest version; `None` when there is no table yet.
    latest: Option<u64>,
    /// This history's `txn` version, if one was met reading back.
    committed: Option<u64>,
    /// The newest `metaData` met reading back before any `txn` of this
    /// history: its configuration names the history the table is for.
    meta: Option<Value>,
    /// The table schema this history's last commit left (the hash its
    /// commit info records), if that commit was met and says.
    schema_hash: Option<String>,
    /// The newest `protocol` met reading back.
    protocol: Option<Value>,
    /// The entries read back, newest first.
    entries: Vec<Vec<Value>>,
    /// Whether the read stopped at a complete-mode commit of this history
    /// (so the entries read hold every live file).
    complete_stop: bool,
    /// The log's checkpoint and entries.
    segment: Segment,
    /// Whether `committed` and `meta` were read from the checkpoint (no
    /// entry after it was this history's or had metaData). A checkpoint
    /// keeps every history's last `txn` and says nothing of their order:
    /// then the metaData alone says whose the table is.
    from_checkpoint: bool,
}

/// The hash a commit records of the table schema it leaves.
fn schema_hash(schema: &str) -> String {
    format!("{:016x}", crate::hash::fnv1a(schema.as_bytes()))
}

/// The table schema after adding parts of schema `parts` to a table of
/// schema `table` (both Delta `schemaString`s): the table's columns as they
/// are (nullable where the parts hold them nullable), then the parts' new
/// columns, nullable (older files lack them). A column the parts hold in
/// another type, or lack while the table says it is never null, cannot be
/// written: the message says which.
fn merged_schema(table: &str, parts: &str) -> std::result::Result<String, String> {
    let fields = |s: &str| -> Vec<Value> {
        serde_json::from_str::<Value>(s)
            .ok()
            .and_then(|v| v.get("fields").and_then(Value::as_array).cloned())
            .unwrap_or_default()
    };
    let (table, parts) = (fields(table), fields(parts));
    let name = |f: &Value| f["name"].as_str().unwrap_or_default().to_string();
    let mut out = Vec::new();
    for t in &table {
        let mut t = t.clone();
        match parts.iter().find(|p| name(p) == name(&t)) {
            Some(p) if p["type"] != t["type"] => {
                return Err(format!(
                    "column \"{}\" is {} in the Delta table, and the query now gives it {}",
                    name(&t),
                    t["type"],
                    p["type"]
                ));
            }
            Some(p) if p["nullable"] == json!(true) => t["nullable"] = json!(true),
            Some(_) => {}
            None if t["nullable"] != json!(true) => {
                return Err(format!(
                    "column \"{}\" is never null in the Delta table, and the query no longer \
                     gives it",
                    name(&t)
                ));
            }
            None => {}
        }
        out.push(t);
    }
    for p in &parts {
        if !table.iter().any(|t| name(t) == name(p)) {
            let mut p = p.clone();
            p["nullable"] = json!(true);
            out.push(p);
        }
    }
    Ok(json!({"type": "struct", "fields": out}).to_string())
}

/// One log entry's actions.
pub(crate) fn actions(bytes: &[u8], key: &str, pipeline: &str) -> Result<Vec<Value>> {
    let text = std::str::from_utf8(bytes).map_err(|_| broken(pipeline, key, "not UTF-8"))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).map_err(|e| broken(pipeline, key, &format!("not JSON: {e}")))
        })
        .collect()
}

fn broken(pipeline: &str, key: &str, what: &str) -> Error {
    Error::Checkpoint {
        pipeline: pipeline.to_string(),
        key: key.to_string(),
        message: format!(
            "the Delta log entry is unreadable ({what}); the table was changed outside Sluice"
        ),
    }
}

/// The Delta log of a table that a pipeline's sink holds.
pub(crate) struct DeltaLog<'a> {
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) pipeline: &'a str,
    pub(crate) settings: DeltaSettings,
}

/// What [`DeltaLog::commit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Published {
    /// The batch's entry is this version.
    Written(u64),
    /// The table has the batch already (its txn version is at or past it).
    Already,
    /// The batch wrote nothing and there is no table to record it in.
    Nothing,
}

impl DeltaLog<'_> {
    fn conflict(&self, message: String) -> Error {
        Error::Run {
            pipeline: self.pipeline.to_string(),
            message,
            class: ErrorClass::Conflict,
        }
    }

    fn refused(&self, why: String, batch: u64, fix: &str) -> Error {
        Error::Execution {
            pipeline: self.pipeline.to_string(),
            batch,
            task: None,
            message: format!("batch {batch} cannot be added to the Delta table: {why}. {fix}"),
            class: ErrorClass::InvalidInput,
        }
    }

    /// The log's newest checkpoint and the entries after it: a read of
    /// the `_last_checkpoint` hint and one listing from there (the whole
    /// log when the hint is missing or names no checkpoint).
    pub(crate) async fn segment(&self) -> Result<Segment> {
        let hint = match self.store.get(LAST_CHECKPOINT).await? {
            Some(o) => serde_json::from_slice::<Value>(&o.bytes)
                .ok()
                .and_then(|v| v.get("version").and_then(Value::as_u64)),
            None => None,
        };
        let after = hint.filter(|v| *v > 0).map(|v| commit_key(v - 1));
        let mut listed = self.store.list(LOG_PREFIX, after.as_deref()).await?;
        if let Some(h) = hint
            && !listed.iter().any(|m| m.key == checkpoint_key(h))
        {
            listed = self.store.list(LOG_PREFIX, None).await?;
        }
        self.segment_of(&listed, None)
    }

    /// The log's segment that holds version `upto`: its newest checkpoint
    /// at or before it, and the entries after that up to it (one listing
    /// of the whole log).
    pub(crate) async fn segment_upto(&self, upto: u64) -> Result<Segment> {
        let listed = self.store.list(LOG_PREFIX, None).await?;
        self.segment_of(&listed, Some(upto))
    }

    /// The segment a listing of the log holds (up to version `upto`).
    fn segment_of(
        &self,
        listed: &[crate::storage::ObjectMeta],
        upto: Option<u64>,
    ) -> Result<Segment> {
        let within = |v: &u64| upto.is_none_or(|u| *v <= u);
        let mut json: Vec<u64> = listed
            .iter()
            .filter_map(|m| version_of(&m.key))
            .filter(within)
            .collect();
        json.sort_unstable();
        let checkpoint = listed
            .iter()
            .filter_map(|m| checkpoint_version_of(&m.key))
            .filter(within)
            .max();
        let versions: Vec<u64> = json
            .into_iter()
            .filter(|v| checkpoint.is_none_or(|c| *v > c))
            .collect();
        let first = checkpoint.map_or(0, |c| c + 1);
        for (i, v) in versions.iter().enumerate() {
            let want = first + i as u64;
            if *v != want {
                return Err(Error::Spec {
                    file: self.store.describe(),
                    message: if checkpoint.is_none() && i == 0 {
                        format!(
                            "the Delta table's log starts at version {v} without a checkpoint \
                             Sluice reads (its first entries were cleaned up, and its \
                             checkpoints are multi-part or v2 ones): write to a new table"
                        )
                    } else {
                        format!(
                            "the Delta table's log lacks version {want} (it has {v}): the log \
                             was changed outside Delta's rules; write to a new table"
                        )
                    },
                });
            }
        }
        Ok(Segment {
            checkpoint,
            versions,
        })
    }

    /// One log entry's actions.
    async fn entry_actions(&self, version: u64) -> Result<Vec<Value>> {
        let key = commit_key(version);
        let Some(obj) = self.store.get(&key).await? else {
            return Err(broken(self.pipeline, &key, "listed, then gone"));
        };
        actions(&obj.bytes, &key, self.pipeline)
    }

    /// A checkpoint's actions.
    async fn checkpoint_actions(&self, version: u64) -> Result<Vec<Value>> {
        let key = checkpoint_key(version);
        let Some(obj) = self.store.get(&key).await? else {
            return Err(broken(self.pipeline, &key, "listed, then gone"));
        };
        checkpoint_rows(obj.bytes).map_err(|e| {
            broken(
                self.pipeline,
                &key,
                &format!("not a checkpoint Sluice reads: {e}"),
            )
        })
    }

    /// The table's state at version `upto` (the segment's latest when
    /// `None`): its checkpoint, then its entries.
    pub(crate) async fn snapshot(&self, segment: &Segment, upto: Option<u64>) -> Result<Snapshot> {
        let mut snap = Snapshot::default();
        if let Some(c) = segment.checkpoint {
            for a in self.checkpoint_actions(c).await? {
                snap.apply(&a);
            }
        }
        for v in &segment.versions {
            if upto.is_some_and(|u| *v > u) {
                break;
            }
            for a in self.entry_actions(*v).await? {
                snap.apply(&a);
            }
        }
        Ok(snap)
    }

    /// The table's latest version, if there is a table.
    pub(crate) async fn latest(&self) -> Result<Option<u64>> {
        Ok(self.segment().await?.latest())
    }

    /// Read the log back from its latest entry until this history's last
    /// `txn` or a `metaData` of another history (usually one entry: the
    /// history's previous commit), then, if neither was met, its
    /// checkpoint.
    async fn tip(&self, app: &str, history: &str) -> Result<Tip> {
        let segment = self.segment().await?;
        let mut tip = Tip {
            latest: segment.latest(),
            ..Tip::default()
        };
        let read = |tip: &mut Tip, entry: &[Value], from_log: bool| {
            for a in entry {
                if let Some(t) = a.get("txn")
                    && t.get("appId").and_then(Value::as_str) == Some(app)
                {
                    let version = t.get("version").and_then(Value::as_u64).unwrap_or(0);
                    tip.committed = Some(tip.committed.map_or(version, |c| c.max(version)));
                    tip.schema_hash = entry.iter().find_map(|a| {
                        a.pointer("/commitInfo/sluice/schema")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    });
                    tip.complete_stop = from_log
                        && entry.iter().any(|a| {
                            a.pointer("/commitInfo/operationParameters/outputMode")
                                .and_then(Value::as_str)
                                == Some("Complete")
                        });
                }
                if let Some(m) = a.get("metaData")
                    && tip.meta.is_none()
                {
                    tip.meta = Some(m.clone());
                }
                if let Some(p) = a.get("protocol")
                    && tip.protocol.is_none()
                {
                    tip.protocol = Some(p.clone());
                }
            }
        };
        for v in segment.versions.iter().rev() {
            let entry = self.entry_actions(*v).await?;
            read(&mut tip, &entry, true);
            tip.entries.push(entry);
            // A metaData of this history (another writer's change of a
            // setting keeps Sluice's marks) does not say whether the batch
            // is in the table: read on to the history's last txn.
            let others = tip.meta.as_ref().is_some_and(|m| {
                m["configuration"].get(HISTORY_KEY).and_then(Value::as_str) != Some(history)
            });
            if tip.committed.is_some() || others {
                break;
            }
        }
        if tip.committed.is_none()
            && tip.meta.is_none()
            && let Some(c) = segment.checkpoint
        {
            let rows = self.checkpoint_actions(c).await?;
            read(&mut tip, &rows, false);
            tip.from_checkpoint = true;
        }
        tip.segment = segment;
        Ok(tip)
    }

    /// Why the table in the sink is not this pipeline's to write, if it is
    /// not: created by another writer, or by another pipeline. `None`
    /// without a table. (Read back to its newest `metaData`.)
    pub(crate) async fn foreign(&self) -> Result<Option<String>> {
        let segment = self.segment().await?;
        let Some(meta) = self.newest_meta(&segment).await? else {
            return Ok(None);
        };
        Ok(
            match meta["configuration"]
                .get(PIPELINE_KEY)
                .and_then(Value::as_str)
            {
                Some(p) if p == self.pipeline => {
                    // A table's partition columns never change (a retired one
                    // takes the next history's).
                    let columns: Vec<String> = meta["partitionColumns"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|c| c.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default();
                    let retired = meta["configuration"]
                        .get(HISTORY_KEY)
                        .and_then(Value::as_str)
                        == Some("");
                    (!retired && columns != self.settings.partition_by).then(|| {
                        format!(
                            "it holds this pipeline's Delta table, partitioned by {columns:?}, and \
                         sink.partition_by is {:?}: a Delta table's partition columns do not \
                         change. Restore sink.partition_by, or run `sluice reset` to start the \
                         table over",
                            self.settings.partition_by
                        )
                    })
                }
                Some(p) => Some(format!(
                    "it holds the Delta table of pipeline \"{p}\"; give this one its own sink.uri"
                )),
                None => Some(
                    "it holds a Delta table that Sluice did not create, and a Delta sink writes \
                     only to a table it created: name a new folder"
                        .to_string(),
                ),
            },
        )
    }

    /// The newest `protocol` of the log (read back from the latest entry,
    /// then the checkpoint).
    async fn newest_protocol(&self, segment: &Segment) -> Result<Option<Value>> {
        self.newest(segment, "protocol").await
    }

    /// The newest `metaData` of the log (read back from the latest entry,
    /// then the checkpoint).
    pub(crate) async fn newest_meta(&self, segment: &Segment) -> Result<Option<Value>> {
        self.newest(segment, "metaData").await
    }

    /// The newest action of kind `kind` in the log: read back from the
    /// latest entry, then the checkpoint.
    async fn newest(&self, segment: &Segment, kind: &str) -> Result<Option<Value>> {
        Ok(self.newest_of(segment, &[kind]).await?.remove(0))
    }

    /// The newest action of each of `kinds` in the log, in one read back
    /// from the latest entry (then the checkpoint) until each is found.
    async fn newest_of(&self, segment: &Segment, kinds: &[&str]) -> Result<Vec<Option<Value>>> {
        let mut found: Vec<Option<Value>> = vec![None; kinds.len()];
        let fill = |found: &mut Vec<Option<Value>>, actions: &[Value]| {
            for (i, kind) in kinds.iter().enumerate() {
                if found[i].is_none() {
                    found[i] = actions.iter().find_map(|a| a.get(*kind)).cloned();
                }
            }
        };
        for v in segment.versions.iter().rev() {
            fill(&mut found, &self.entry_actions(*v).await?);
            if found.iter().all(Option::is_some) {
                return Ok(found);
            }
        }
        if let Some(c) = segment.checkpoint {
            fill(&mut found, &self.checkpoint_actions(c).await?);
        }
        Ok(found)
    }

    /// The files live at the tip's latest version: from the entries the
    /// tip read when they reach back to a complete-mode commit of this
    /// history (which removed everything before it), else by replaying
    /// the log.
    async fn live_at(&self, tip: &Tip) -> Result<BTreeMap<String, Value>> {
        if tip.complete_stop {
            let mut snap = Snapshot::default();
            for entry in tip.entries.iter().rev() {
                for a in entry {
                    snap.apply(a);
                }
            }
            return Ok(snap.live);
        }
        Ok(self.snapshot(&tip.segment, tip.latest).await?.live)
    }

    /// Make `record`'s batch one Delta commit, exactly once: see the
    /// module's comment. `owned` gives the history's first batch when
    /// the sink's owner record names `record`'s history now (read after
    /// the log: needed to take over a table that `sluice reset` retired,
    /// or to create one). Then, when enough versions followed the newest
    /// log checkpoint, a new one.
    pub(crate) async fn commit<F, Fut>(&self, record: &Commit, owned: F) -> Result<Published>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Option<u64>>>,
    {
        let app = app_id(self.pipeline, &record.history);
        for _ in 0..16 {
            let tip = self.tip(&app, &record.history).await?;
            if tip.committed.is_some_and(|v| v >= record.batch) {
                if let Some(latest) = tip.latest {
                    self.checkpoint_if_due(&tip.segment, latest, record.committed_ms)
                        .await?;
                }
                return Ok(Published::Already);
            }
            if let Some(why) = unsupported(tip.protocol.as_ref(), tip.meta.as_ref()) {
                return Err(self.refused(why, record.batch, UNWRITABLE));
            }
            // (A batch without parts: the schema its rows would have.)
            let parts_schema = record
                .outputs
                .iter()
                .find_map(|o| o.delta.as_ref().map(|d| d.schema.clone()))
                .or_else(|| record.table_schema.clone());
            // Whether this commit must (re)write the table's metaData:
            // creating it, taking over a retired one, or new columns.
            let mut meta: Option<Value> = None;
            let stale = || {
                self.conflict(format!(
                    "the Delta table is not history {}'s any more (a `sluice reset` or a newer \
                     run took it over): batch {} is not published; this run stops",
                    record.history, record.batch
                ))
            };
            let own_commit = tip.committed.filter(|_| !tip.from_checkpoint);
            match (&own_commit, &tip.meta) {
                // The history's own previous commit is the newest Sluice
                // mark: the table is this history's.
                (Some(_), _) => {
                    // A metaData since (or in) the history's last commit:
                    // another writer may have changed the table's schema
                    // or settings; the parts must fit what it says now.
                    if let Some(m) = &tip.meta {
                        meta = Some(m.clone());
                    }
                    // Parts of another schema than the table's (the query
                    // changed, or new columns joined): the table's metaData
                    // changes with them.
                    else if let Some(parts) = &parts_schema
                        && tip.schema_hash.as_deref() != Some(schema_hash(parts).as_str())
                    {
                        meta = self.newest_meta(&tip.segment).await?;
                    }
                }
                (None, Some(m)) => {
                    let config = &m["configuration"];
                    let history = config.get(HISTORY_KEY).and_then(Value::as_str);
                    if config.get(PIPELINE_KEY).and_then(Value::as_str).is_none() {
                        return Err(Error::Spec {
                            file: self.store.describe(),
                            message: "sink.uri holds a Delta table that Sluice did not create; \
                                      a Delta sink writes only to a table it created: name a new \
                                      folder"
                                .into(),
                        });
                    }
                    match history {
                        Some(h) if h == record.history => meta = Some(m.clone()),
                        // Retired by `sluice reset`: the history the owner
                        // record names takes it over, with its first batch
                        // that wrote rows (its schema).
                        Some("") => {
                            if owned().await?.is_none() {
                                return Err(stale());
                            }
                            if parts_schema.is_none() {
                                return Ok(Published::Nothing);
                            }
                            meta = Some(m.clone());
                        }
                        _ => return Err(stale()),
                    }
                }
                (None, None) => {
                    if tip.latest.is_some() {
                        return Err(Error::Spec {
                            file: self.store.describe(),
                            message: "sink.uri holds a Delta log without table metadata; name a \
                                      new folder"
                                .into(),
                        });
                    }
                    if parts_schema.is_none() {
                        // Nothing to create a table with yet.
                        return Ok(Published::Nothing);
                    }
                    let Some(first) = owned().await? else {
                        return Err(stale());
                    };
                    // Earlier batches of this history wrote rows, yet there
                    // is no table: its log was deleted. A new one would
                    // miss them.
                    if let Some(b) = self.earlier_rows(first, record.batch).await? {
                        return Err(Error::Incompatible {
                            pipeline: self.pipeline.to_string(),
                            message: format!(
                                "the sink's Delta table is gone (no {LOG_PREFIX}), yet batch {b} \
                                 of this history committed rows into it: a table made now would \
                                 miss them, so batch {} is not published. Restore {LOG_PREFIX}, \
                                 or run `sluice reset` to start over",
                                record.batch
                            ),
                        });
                    }
                }
            }
            let version = tip.latest.map_or(0, |v| v + 1);
            // The schema the table has after this commit, and whether its
            // metaData must say so.
            let current = meta
                .as_ref()
                .and_then(|m| m.get("schemaString").and_then(Value::as_str))
                .map(str::to_string);
            // A table a reset retired is replaced: its schema is the new
            // history's, not merged with the old one's.
            let taking_over = meta.as_ref().is_some_and(|m| {
                m["configuration"].get(HISTORY_KEY).and_then(Value::as_str)
                    != Some(record.history.as_str())
            });
            let after = match (&current, &parts_schema) {
                (Some(t), Some(p)) if !taking_over => Some(merged_schema(t, p).map_err(|why| {
                    self.conflict(format!(
                        "batch {} cannot be added to the Delta table: {why}. Its readers could \
                         not read the table: restore query.sql, or run `sluice reset` to start \
                         the table over",
                        record.batch
                    ))
                })?),
                (t, None) => t.clone(),
                (_, p) => p.clone(),
            };
            if !taking_over && current.is_some() && current == after {
                // The table's schema holds the parts: no metaData.
                meta = None;
            }
            // Complete mode: the batch's parts replace every live file.
            let removes: Vec<Value> = if self.settings.complete && tip.latest.is_some() {
                let live = self.live_at(&tip).await?;
                if !live.is_empty() {
                    let newest_meta = match (&meta, &tip.meta) {
                        (Some(m), _) | (None, Some(m)) => Some(m.clone()),
                        (None, None) => self.newest_meta(&tip.segment).await?,
                    };
                    if append_only(newest_meta.as_ref()) {
                        return Err(self.refused(
                            "the table is append-only (delta.appendOnly = true), and a \
                             complete-mode batch replaces its files"
                                .to_string(),
                            record.batch,
                            "Unset the property (ALTER TABLE ... UNSET TBLPROPERTIES \
                             ('delta.appendOnly')), then run again",
                        ));
                    }
                }
                live.into_values().collect()
            } else {
                Vec::new()
            };
            let hash = after
                .as_deref()
                .map(schema_hash)
                .or(tip.schema_hash.clone());
            // Raising an existing table's protocol for timestamps without
            // a zone keeps every feature it has.
            let protocol = match (&meta, after.as_deref()) {
                (Some(_), Some(a)) if version > 0 && has_ntz(a) => {
                    let current = match &tip.protocol {
                        Some(p) => Some(p.clone()),
                        None => self.newest_protocol(&tip.segment).await?,
                    };
                    with_ntz(current.as_ref())
                }
                _ => None,
            };
            let body = self.entry(
                record,
                &app,
                version,
                meta.as_ref(),
                after.as_deref(),
                hash.as_deref(),
                &removes,
                protocol.as_ref(),
            );
            match self
                .store
                .put(&commit_key(version), Bytes::from(body), PutMode::Create)
                .await?
            {
                PutOutcome::Written(_) => {
                    let mut segment = tip.segment.clone();
                    segment.versions.push(version);
                    self.checkpoint_if_due(&segment, version, record.committed_ms)
                        .await?;
                    return Ok(Published::Written(version));
                }
                // Another writer took the version: read again.
                PutOutcome::Conflict => continue,
            }
        }
        Err(Error::Execution {
            pipeline: self.pipeline.to_string(),
            batch: record.batch,
            task: None,
            message: "the Delta log kept moving under this commit (16 versions taken by other \
                      writers in a row); the step is retried"
                .into(),
            class: ErrorClass::Retryable,
        })
    }

    /// Write the log checkpoint of `version` (its Parquet, then the
    /// `_last_checkpoint` hint) when at least the interval's versions
    /// followed the newest one. A checkpoint is the table's state at a
    /// version, a function of log entries that never change: any run may
    /// write it, a stale one too, and a write that fails is made again by
    /// the retry (which finds the batch in the table and the checkpoint
    /// still due).
    async fn checkpoint_if_due(&self, segment: &Segment, version: u64, now_ms: i64) -> Result<()> {
        if segment.since_checkpoint(version) < self.settings.checkpoint_interval {
            return Ok(());
        }
        let snap = self.snapshot(segment, Some(version)).await?;
        let (bytes, size) = checkpoint_parquet(&snap, now_ms).map_err(|e| Error::Run {
            pipeline: self.pipeline.to_string(),
            message: format!("the Delta log checkpoint of version {version} was not made: {e}"),
            class: ErrorClass::Fatal,
        })?;
        self.store
            .put(&checkpoint_key(version), bytes, PutMode::Overwrite)
            .await?;
        let hint = json!({"version": version, "size": size}).to_string();
        self.store
            .put(LAST_CHECKPOINT, Bytes::from(hint), PutMode::Overwrite)
            .await?;
        Ok(())
    }

    /// The log entry that commits `record` as `version`: commit info,
    /// protocol and metaData when the table is created (or its metaData
    /// changes: `meta` is the current one; `raised`, the existing table's
    /// protocol raised), `removes` (a complete-mode batch's: the files it
    /// replaces), the parts as `add` actions, and the history's `txn`.
    #[allow(clippy::too_many_arguments)]
    fn entry(
        &self,
        record: &Commit,
        app: &str,
        version: u64,
        meta: Option<&Value>,
        schema: Option<&str>,
        hash: Option<&str>,
        removes: &[Value],
        raised: Option<&Value>,
    ) -> Vec<u8> {
        let now = record.committed_ms;
        let complete = self.settings.complete;
        let mut lines: Vec<Value> = vec![json!({"commitInfo": {
            "timestamp": now,
            "operation": "STREAMING UPDATE",
            "operationParameters": {
                "outputMode": if complete { "Complete" } else { "Append" },
                "queryId": app,
                "epochId": record.batch.to_string(),
            },
            "isBlindAppend": meta.is_none() && version > 0 && !complete,
            "engineInfo": concat!("sluice/", env!("CARGO_PKG_VERSION")),
            "sluice": {
                "pipeline": self.pipeline,
                "batch": record.batch,
                "epoch": record.epoch,
                "schema": hash,
            },
        }})];
        if version == 0 || meta.is_some() {
            let schema = schema.unwrap_or_default();
            // A new table's protocol; an existing one's is only raised
            // (`raised`: to read timestamps without a zone, with every
            // feature it had), never lowered.
            if version == 0 {
                lines.push(
                    json!({ "protocol": with_ntz(None).filter(|_| has_ntz(schema))
                    .unwrap_or_else(|| json!({"minReaderVersion": 1, "minWriterVersion": 2})) }),
                );
            } else if let Some(p) = raised {
                lines.push(json!({ "protocol": p }));
            }
            // An existing table's metaData is kept but for its schema and
            // Sluice's marks (another writer's settings stay); the id is
            // kept too (a reset gave a retired table a new one).
            let mut m = meta.cloned().unwrap_or_else(|| {
                json!({
                    "id": uuid::Uuid::new_v4().to_string(),
                    "format": {"provider": "parquet", "options": {}},
                    "partitionColumns": [],
                    "configuration": {
                        "delta.checkpointInterval":
                            self.settings.checkpoint_interval.to_string(),
                    },
                    "createdTime": now,
                })
            });
            m["schemaString"] = json!(schema);
            m["partitionColumns"] = json!(self.settings.partition_by);
            if !m["configuration"].is_object() {
                m["configuration"] = json!({});
            }
            m["configuration"][PIPELINE_KEY] = json!(self.pipeline);
            m["configuration"][HISTORY_KEY] = json!(record.history);
            lines.push(json!({ "metaData": m }));
        }
        for r in removes {
            let mut rm = json!({
                "path": r["path"],
                "deletionTimestamp": now,
                "dataChange": true,
                "extendedFileMetadata": true,
                "partitionValues": r.get("partitionValues").cloned().unwrap_or(json!({})),
            });
            if let Some(size) = r.get("size") {
                rm["size"] = size.clone();
            }
            lines.push(json!({ "remove": rm }));
        }
        for o in &record.outputs {
            lines.push(add_action(o, now));
        }
        lines.push(json!({"txn": {"appId": app, "version": record.batch, "lastUpdated": now}}));
        let mut out = Vec::new();
        for l in lines {
            serde_json::to_writer(&mut out, &l).expect("JSON values serialize");
            out.push(b'\n');
        }
        out
    }

    /// The first batch from `first` (the history's first) up to `before`
    /// whose manifest names parts, if one does.
    async fn earlier_rows(&self, first: u64, before: u64) -> Result<Option<u64>> {
        if before <= first {
            return Ok(None);
        }
        for m in self
            .store
            .list(crate::paths::sink::MANIFEST_PREFIX, None)
            .await?
        {
            let Some(b) = crate::paths::sink::manifest_batch(&m.key) else {
                continue;
            };
            if b < first || b >= before {
                continue;
            }
            if let Some(obj) = self.store.get(&m.key).await?
                && let Ok(manifest) =
                    serde_json::from_slice::<crate::checkpoint::Manifest>(&obj.bytes)
                && !manifest.files.is_empty()
            {
                return Ok(Some(b));
            }
        }
        Ok(None)
    }

    /// Whether parts of Delta schema `parts` can be added to the table (a
    /// table a reset retired takes any), and (complete mode) whether the
    /// table lets a batch replace its files.
    pub(crate) async fn check_schema(&self, parts: &str) -> Result<()> {
        let segment = self.segment().await?;
        let mut newest = self.newest_of(&segment, &["metaData", "protocol"]).await?;
        let protocol = newest.pop().flatten();
        let Some(meta) = newest.pop().flatten() else {
            return Ok(());
        };
        // Another writer's feature Sluice cannot honour: refused before a
        // batch is committed that could not be published.
        if meta["configuration"].get(PIPELINE_KEY).is_some()
            && let Some(why) = unsupported(protocol.as_ref(), Some(&meta))
        {
            return Err(Error::Incompatible {
                pipeline: self.pipeline.to_string(),
                message: format!(
                    "the sink's Delta table cannot take more batches: {why}. {UNWRITABLE}"
                ),
            });
        }
        if self.settings.complete && append_only(Some(&meta)) {
            return Err(Error::Incompatible {
                pipeline: self.pipeline.to_string(),
                message: "the sink's Delta table is append-only (delta.appendOnly = true, set \
                          by another writer), and sink.mode = \"complete\" replaces the \
                          table's files with each batch: unset the property (ALTER TABLE ... \
                          UNSET TBLPROPERTIES ('delta.appendOnly')), or write another table"
                    .into(),
            });
        }
        let history = meta["configuration"]
            .get(HISTORY_KEY)
            .and_then(Value::as_str);
        if history.is_none_or(str::is_empty) {
            return Ok(());
        }
        let Some(table) = meta["schemaString"].as_str() else {
            return Ok(());
        };
        merged_schema(table, parts).map(|_| ()).map_err(|why| Error::Incompatible {
            pipeline: self.pipeline.to_string(),
            message: format!(
                "the query's rows cannot be added to the sink's Delta table: {why}. Its readers \
                 could not read the table: restore query.sql (or CAST the column back), or run \
                 `sluice reset` to start the table over"
            ),
        })
    }

    /// Before `sluice reset` changes anything: refused when this
    /// pipeline's table holds files and another writer made it
    /// append-only (the reset would have to remove them).
    pub(crate) async fn check_reset(&self) -> Result<()> {
        let segment = self.segment().await?;
        if segment.latest().is_none() {
            return Ok(());
        }
        let snap = self.snapshot(&segment, None).await?;
        let owner = snap
            .meta
            .as_ref()
            .and_then(|m| m["configuration"].get(PIPELINE_KEY))
            .and_then(Value::as_str);
        if snap.meta.is_some() && owner != Some(self.pipeline) {
            return Err(Error::Spec {
                file: self.store.describe(),
                message: format!(
                    "sink.uri holds {}, and `sluice reset` of pipeline \"{}\" would change it: \
                     nothing was changed. Point sink.uri at this pipeline's own sink",
                    match owner {
                        Some(p) => format!("the Delta table of pipeline \"{p}\""),
                        None => "a Delta table that Sluice did not create".to_string(),
                    },
                    self.pipeline
                ),
            });
        }
        let ours = owner == Some(self.pipeline);
        if ours && !snap.live.is_empty() && append_only(snap.meta.as_ref()) {
            return Err(append_only_reset(self.store.as_ref()));
        }
        Ok(())
    }

    /// `sluice reset`: replace the table's content with nothing, as one
    /// commit that removes every live file and marks the table retired (a
    /// new id, an empty history), so the next history takes the table over
    /// and a run of the old history stops (see the module's comment).
    /// Without a table, a retired empty one is created, so that a run of
    /// the old history cannot create one later. Returns the files it
    /// removed from the table; nothing is written when the table is
    /// retired and empty already, or when a history other than `retired`
    /// holds it now. Called after the sink's owner record was retired.
    pub(crate) async fn retire(&self, now_ms: i64, retired: &str) -> Result<Vec<String>> {
        for _ in 0..16 {
            let segment = self.segment().await?;
            let next = segment.latest().map_or(0, |v| v + 1);
            let snap = self.snapshot(&segment, None).await?;
            let live: Vec<String> = snap.live.keys().cloned().collect();
            // No table yet: a retired empty one, so that a run of the old
            // history cannot create one after this reset.
            let mut meta = snap.meta.clone().unwrap_or_else(|| {
                json!({
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": json!({"type": "struct", "fields": []}).to_string(),
                    "partitionColumns": [],
                    "configuration": {PIPELINE_KEY: self.pipeline},
                    "createdTime": now_ms,
                })
            });
            // A table another writer (or another pipeline) created is not
            // this reset's to empty.
            if meta["configuration"]
                .get(PIPELINE_KEY)
                .and_then(Value::as_str)
                != Some(self.pipeline)
            {
                tracing::warn!(pipeline = %self.pipeline, "the sink's Delta table is not this pipeline's: left as it is");
                return Ok(Vec::new());
            }
            let marked = meta["configuration"]
                .get(HISTORY_KEY)
                .and_then(Value::as_str)
                .unwrap_or_default();
            if marked.is_empty() && live.is_empty() {
                return Ok(Vec::new());
            }
            // Another history took the table over since (a reset that
            // finished this one, then a run): it is not this reset's.
            if !marked.is_empty() && marked != retired {
                return Ok(Vec::new());
            }
            if !live.is_empty() && append_only(snap.meta.as_ref()) {
                return Err(append_only_reset(self.store.as_ref()));
            }
            meta["id"] = json!(uuid::Uuid::new_v4().to_string());
            meta["configuration"][HISTORY_KEY] = json!("");
            let protocol = snap
                .protocol
                .clone()
                .unwrap_or_else(|| json!({"minReaderVersion": 1, "minWriterVersion": 2}));
            let mut lines = vec![json!({"commitInfo": {
                "timestamp": now_ms,
                "operation": "REPLACE TABLE",
                "operationParameters": {"reason": "sluice reset"},
                "isBlindAppend": false,
                "engineInfo": concat!("sluice/", env!("CARGO_PKG_VERSION")),
            }})];
            lines.push(json!({"protocol": protocol}));
            lines.push(json!({"metaData": meta}));
            for path in &live {
                lines.push(json!({"remove": {
                    "path": path,
                    "deletionTimestamp": now_ms,
                    "dataChange": true,
                }}));
            }
            let mut body = Vec::new();
            for l in lines {
                serde_json::to_writer(&mut body, &l).expect("JSON values serialize");
                body.push(b'\n');
            }
            if let PutOutcome::Written(_) = self
                .store
                .put(&commit_key(next), Bytes::from(body), PutMode::Create)
                .await?
            {
                let mut segment = segment;
                segment.versions.push(next);
                self.checkpoint_if_due(&segment, next, now_ms).await?;
                return Ok(live
                    .into_iter()
                    .map(|p| {
                        percent_encoding::percent_decode_str(&p)
                            .decode_utf8_lossy()
                            .into_owned()
                    })
                    .collect());
            }
        }
        Err(self
            .conflict("the Delta log kept moving under `sluice reset`; run it again".to_string()))
    }
}

/// Characters a Delta `add` path escapes (it is a relative URI).
const PATH_ESCAPES: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'/')
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'=');

/// The `add` action of a committed part.
fn add_action(o: &OutputFile, now: i64) -> Value {
    let mut add = json!({
        "path": percent_encoding::utf8_percent_encode(&o.key, PATH_ESCAPES).to_string(),
        "partitionValues": o.delta.as_ref().map_or(json!({}), |d| json!(d.partition_values)),
        "size": o.bytes,
        "modificationTime": now,
        "dataChange": true,
    });
    if let Some(d) = &o.delta {
        add["stats"] = json!(d.stats);
    }
    json!({ "add": add })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::Schema;

    #[test]
    fn log_keys_are_twenty_digit_versions() {
        assert_eq!(commit_key(7), "_delta_log/00000000000000000007.json");
        assert_eq!(version_of(&commit_key(123)), Some(123));
        assert_eq!(
            version_of("_delta_log/00000000000000000010.checkpoint.parquet"),
            None
        );
        assert_eq!(version_of("_delta_log/_last_checkpoint"), None);
        assert_eq!(version_of("_delta_log/7.json"), None);
    }

    #[test]
    fn schemas_map_to_delta_types_and_refuse_what_delta_lacks() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("fare", DataType::Float64, true),
            Field::new("zone", DataType::Utf8, true),
            Field::new("day", DataType::Date32, true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("amount", DataType::Decimal128(10, 2), true),
            Field::new_list("tags", Field::new("item", DataType::Utf8, true), true),
        ]));
        let s: Value = serde_json::from_str(&schema_string(&schema).unwrap()).unwrap();
        let types: Vec<Value> = s["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["type"].clone())
            .collect();
        assert_eq!(
            types,
            vec![
                json!("long"),
                json!("double"),
                json!("string"),
                json!("date"),
                json!("timestamp"),
                json!("decimal(10,2)"),
                json!({"type": "array", "elementType": "string", "containsNull": true}),
            ]
        );
        assert_eq!(s["fields"][0]["nullable"], json!(false));
        let bad = Arc::new(Schema::new(vec![Field::new(
            "t",
            DataType::Time64(TimeUnit::Microsecond),
            true,
        )]));
        let e = schema_string(&bad).unwrap_err();
        assert!(e.contains("\"t\"") && e.contains("CAST"), "{e}");
        let ntz = Arc::new(Schema::new(vec![Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        )]));
        assert!(has_ntz(&schema_string(&ntz).unwrap()));
        let cased = Arc::new(Schema::new(vec![
            Field::new("Total", DataType::Float64, true),
            Field::new("total", DataType::Float64, true),
        ]));
        let e = schema_string(&cased).unwrap_err();
        assert!(
            e.contains("\"Total\" and \"total\" differ only in case"),
            "{e}"
        );
    }

    #[test]
    fn a_tables_schema_reads_as_the_arrow_types_its_files_hold() {
        let schema = arrow_schema(
            r#"{"type":"struct","fields":[
            {"name":"s","type":"string","nullable":true,"metadata":{}},
            {"name":"t","type":"timestamp","nullable":false,"metadata":{}},
            {"name":"n","type":"timestamp_ntz","nullable":true,"metadata":{}},
            {"name":"d","type":"decimal(10,2)","nullable":true,"metadata":{}},
            {"name":"a","type":{"type":"array","elementType":"string","containsNull":false},"nullable":true,"metadata":{}},
            {"name":"m","type":{"type":"map","keyType":"string","valueType":"long","valueContainsNull":true},"nullable":true,"metadata":{}},
            {"name":"st","type":{"type":"struct","fields":[{"name":"x","type":"integer","nullable":false,"metadata":{}}]},"nullable":true,"metadata":{}}
            ]}"#,
        )
        .unwrap();
        let t = |i: usize| schema.field(i).data_type().clone();
        assert_eq!(t(0), DataType::Utf8View);
        assert_eq!(
            t(1),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
        assert!(!schema.field(1).is_nullable());
        assert_eq!(t(2), DataType::Timestamp(TimeUnit::Microsecond, None));
        assert_eq!(t(3), DataType::Decimal128(10, 2));
        assert_eq!(
            t(4),
            DataType::List(Arc::new(Field::new("element", DataType::Utf8, false)))
        );
        assert!(matches!(t(5), DataType::Map(..)));
        assert!(matches!(t(6), DataType::Struct(ref f) if !f[0].is_nullable()));
        // What Sluice writes reads back as the same Delta types.
        let back = schema_string(&Arc::new(schema)).unwrap();
        assert_eq!(arrow_schema(&back).unwrap().fields().len(), 7);
        let e = arrow_schema(
            r#"{"type":"struct","fields":[{"name":"v","type":"variant","nullable":true,"metadata":{}}]}"#,
        )
        .unwrap_err();
        assert!(e.contains("\"v\"") && e.contains("variant"), "{e}");
    }

    #[test]
    fn statistics_are_counted_over_every_batch_of_a_part() {
        let point = DataType::Struct(vec![Field::new("x", DataType::Int64, true)].into());
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("fare", DataType::Float64, true),
            Field::new("zone", DataType::Utf8, true),
            Field::new("at", point, true),
        ]));
        let points = |n: usize| -> ArrayRef {
            Arc::new(datafusion::arrow::array::StructArray::from(vec![(
                Arc::new(Field::new("x", DataType::Int64, true)),
                Arc::new(Int64Array::from(vec![Some(1); n])) as ArrayRef,
            )]))
        };
        let mut s = PartStats::new(&schema);
        s.update(&[
            Arc::new(Int64Array::from(vec![Some(5), None, Some(-2)])),
            Arc::new(Float64Array::from(vec![Some(1.5), Some(9.0), None])),
            Arc::new(StringArray::from(vec![
                Some("b"),
                Some("a"),
                Some(&"x".repeat(40)[..]),
            ])),
            points(3),
        ])
        .unwrap();
        s.update(&[
            Arc::new(Int64Array::from(vec![Some(11)])),
            Arc::new(Float64Array::from(vec![Some(f64::NAN)])),
            Arc::new(StringArray::from(vec![Some("c")])),
            points(1),
        ])
        .unwrap();
        let v: Value = serde_json::from_str(&s.finish()).unwrap();
        assert_eq!(v["numRecords"], json!(4));
        assert_eq!(v["minValues"]["id"], json!(-2));
        assert_eq!(v["maxValues"]["id"], json!(11));
        // A struct column has no null count (a number there makes
        // deltalake refuse the table).
        assert_eq!(v["nullCount"], json!({"id": 1, "fare": 1, "zone": 0}));
        // A NaN maximum, and a string longer than 32 characters: no
        // min/max, rather than a wrong one.
        assert!(v["maxValues"].get("fare").is_none(), "{v}");
        assert!(v["maxValues"].get("zone").is_none(), "{v}");
    }

    #[test]
    fn add_paths_are_escaped_as_uris() {
        let o = OutputFile {
            key: "batch=0000000001/part-00000-00000-e1.parquet".into(),
            rows: 3,
            bytes: 10,
            delta: None,
            etag: None,
        };
        assert_eq!(
            add_action(&o, 1)["add"]["path"],
            json!("batch=0000000001/part-00000-00000-e1.parquet")
        );
        let o = OutputFile {
            key: "a b/c%.parquet".into(),
            ..o
        };
        assert_eq!(
            add_action(&o, 1)["add"]["path"],
            json!("a%20b/c%25.parquet")
        );
    }

    /// A commit record of `history`'s batch `batch` with one part.
    fn record(history: &str, batch: u64) -> Commit {
        let schema = json!({"type": "struct", "fields": [
            {"name": "x", "type": "long", "nullable": true, "metadata": {}}
        ]})
        .to_string();
        serde_json::from_value(json!({
            "format_version": crate::checkpoint::FORMAT_VERSION,
            "batch": batch,
            "epoch": 1,
            "history": history,
            "committed_ms": 1_000,
            "files": 1,
            "bytes_read": 10,
            "rows_in": 1,
            "rows_out": 1,
            "outputs": [{
                "key": format!("batch={batch:010}/part-00000-00000-e1.parquet"),
                "rows": 1,
                "bytes": 10,
                "delta": {"schema": schema, "stats": "{\"numRecords\":1}"},
            }],
            "durations": serde_json::to_value(crate::checkpoint::Durations::default()).unwrap(),
            "requests": serde_json::to_value(crate::storage::RequestCounts::default()).unwrap(),
            "input_keys": [],
        }))
        .unwrap()
    }

    async fn entry_of(store: &Arc<dyn Store>, version: u64) -> Vec<Value> {
        let key = commit_key(version);
        let obj = store.get(&key).await.unwrap().expect("the entry exists");
        actions(&obj.bytes, &key, "p").unwrap()
    }

    /// The log protocol on its own: a table created by the first batch,
    /// a batch committed once however often it is published, a version
    /// taken by an outside writer passed over, a reset's retired mark that
    /// only the history the owner record names may take over, and a
    /// history that is not the table's stopped.
    #[tokio::test]
    async fn each_batch_is_committed_once_and_only_by_the_tables_history() {
        let store: Arc<dyn Store> = Arc::new(crate::storage::MemoryStore::new());
        let log = DeltaLog {
            store: &store,
            pipeline: "p",
            settings: DeltaSettings::default(),
        };
        let yes = || async { Ok(Some(0)) };
        let no = || async { Ok(None) };
        // Without the owner record, not even a new table is made.
        assert!(log.commit(&record("h1", 0), no).await.is_err());
        assert_eq!(
            log.commit(&record("h1", 0), yes).await.unwrap(),
            Published::Written(0)
        );
        let first = entry_of(&store, 0).await;
        assert!(first.iter().any(|a| a.get("protocol").is_some()));
        let meta = first.iter().find_map(|a| a.get("metaData")).unwrap();
        assert_eq!(meta["configuration"][HISTORY_KEY], json!("h1"));
        // Published again (recovery): nothing written.
        assert_eq!(
            log.commit(&record("h1", 0), yes).await.unwrap(),
            Published::Already
        );
        // An outside writer's blind append takes version 1.
        store
            .put(
                &commit_key(1),
                Bytes::from_static(b"{\"add\":{\"path\":\"other.parquet\",\"partitionValues\":{},\"size\":1,\"modificationTime\":1,\"dataChange\":true}}\n"),
                PutMode::Create,
            )
            .await
            .unwrap();
        assert_eq!(
            log.commit(&record("h1", 1), yes).await.unwrap(),
            Published::Written(2)
        );
        let txn = entry_of(&store, 2)
            .await
            .into_iter()
            .find_map(|a| a.get("txn").cloned())
            .unwrap();
        assert_eq!(txn["appId"], json!("p-h1"));
        assert_eq!(txn["version"], json!(1));
        // A reset: every live file removed, the table marked retired.
        let removed = log.retire(5_000, "h1").await.unwrap();
        assert_eq!(removed.len(), 3, "{removed:?}");
        // A run of the retired history, stopped past its lease, publishes
        // nothing: the owner record is not its own.
        let e = log.commit(&record("h1", 2), no).await.unwrap_err();
        assert_eq!(e.class(), ErrorClass::Conflict, "{e}");
        assert_eq!(log.segment().await.unwrap().versions, vec![0, 1, 2, 3]);
        // The next history takes the table over.
        assert_eq!(
            log.commit(&record("h2", 7), yes).await.unwrap(),
            Published::Written(4)
        );
        let meta = entry_of(&store, 4)
            .await
            .into_iter()
            .find_map(|a| a.get("metaData").cloned())
            .unwrap();
        assert_eq!(meta["configuration"][HISTORY_KEY], json!("h2"));
        // And the old one stays out even when it thinks it owns the sink.
        let e = log.commit(&record("h1", 3), yes).await.unwrap_err();
        assert_eq!(e.class(), ErrorClass::Conflict, "{e}");
        // A reset that finds another history holding the table (another
        // reset finished first, then a run) leaves it alone.
        assert!(log.retire(6_000, "h1").await.unwrap().is_empty());
        assert_eq!(log.segment().await.unwrap().versions, vec![0, 1, 2, 3, 4]);
    }

    /// Another writer's change of a setting (a metaData entry keeping
    /// Sluice's marks) after a batch's commit: recovering that batch still
    /// finds it in the table (before, the read back stopped at that
    /// metaData and committed the batch twice).
    #[tokio::test]
    async fn a_batch_in_the_table_is_found_past_another_writers_metadata() {
        let store: Arc<dyn Store> = Arc::new(crate::storage::MemoryStore::new());
        let log = DeltaLog {
            store: &store,
            pipeline: "p",
            settings: DeltaSettings::default(),
        };
        let yes = || async { Ok(Some(0)) };
        assert_eq!(
            log.commit(&record("h1", 0), yes).await.unwrap(),
            Published::Written(0)
        );
        let mut meta = entry_of(&store, 0)
            .await
            .into_iter()
            .find_map(|a| a.get("metaData").cloned())
            .unwrap();
        meta["configuration"]["delta.logRetentionDuration"] = json!("interval 60 days");
        let body = format!(
            "{}\n{}\n",
            json!({"commitInfo": {"operation": "SET TBLPROPERTIES"}}),
            json!({ "metaData": meta })
        );
        store
            .put(&commit_key(1), Bytes::from(body), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(
            log.commit(&record("h1", 0), yes).await.unwrap(),
            Published::Already
        );
        assert_eq!(
            log.commit(&record("h1", 1), yes).await.unwrap(),
            Published::Written(2)
        );
    }

    /// [`record`] whose part has the columns `fields` (name, Delta type).
    fn record_of(history: &str, batch: u64, fields: &[(&str, &str)]) -> Commit {
        let mut r = record(history, batch);
        let schema = json!({"type": "struct", "fields": fields.iter().map(|(n, t)| json!({
            "name": n, "type": t, "nullable": true, "metadata": {}
        })).collect::<Vec<_>>()})
        .to_string();
        r.outputs[0].delta.as_mut().unwrap().schema = schema;
        r
    }

    /// The schema of the newest metaData of the log, as (name, type).
    async fn table_columns(store: &Arc<dyn Store>) -> Vec<(String, String)> {
        let log = DeltaLog {
            store,
            pipeline: "p",
            settings: DeltaSettings::default(),
        };
        let meta = log
            .newest_meta(&log.segment().await.unwrap())
            .await
            .unwrap()
            .unwrap();
        let schema: Value = serde_json::from_str(meta["schemaString"].as_str().unwrap()).unwrap();
        schema["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["name"].as_str().unwrap().into(), f["type"].to_string()))
            .collect()
    }

    /// A query whose output changes: new columns join the table's schema
    /// (in a metaData that keeps what another writer set), a column whose
    /// type changes is refused naming it, and the table is left as it was.
    #[tokio::test]
    async fn new_columns_join_the_table_and_a_changed_type_is_refused() {
        let store: Arc<dyn Store> = Arc::new(crate::storage::MemoryStore::new());
        let log = DeltaLog {
            store: &store,
            pipeline: "p",
            settings: DeltaSettings::default(),
        };
        let yes = || async { Ok(Some(0)) };
        log.commit(&record_of("h", 0, &[("v", "long")]), yes)
            .await
            .unwrap();
        // Same schema again: no metaData in the entry.
        log.commit(&record_of("h", 1, &[("v", "long")]), yes)
            .await
            .unwrap();
        assert!(
            entry_of(&store, 1)
                .await
                .iter()
                .all(|a| a.get("metaData").is_none())
        );
        // Another writer sets a property (a metaData of its own).
        let mut meta = log
            .newest_meta(&log.segment().await.unwrap())
            .await
            .unwrap()
            .unwrap();
        meta["configuration"]["team.owner"] = json!("rides");
        store
            .put(
                &commit_key(2),
                Bytes::from(format!("{}\n", json!({ "metaData": meta }))),
                PutMode::Create,
            )
            .await
            .unwrap();
        log.commit(&record_of("h", 2, &[("v", "long"), ("tip", "double")]), yes)
            .await
            .unwrap();
        assert_eq!(
            table_columns(&store).await,
            vec![
                ("v".to_string(), "\"long\"".to_string()),
                ("tip".into(), "\"double\"".into())
            ]
        );
        let meta = log
            .newest_meta(&log.segment().await.unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(meta["configuration"]["team.owner"], json!("rides"));
        assert_eq!(meta["configuration"][HISTORY_KEY], json!("h"));
        // A part without `tip` (nullable) fits; `v` as text does not.
        log.commit(&record_of("h", 3, &[("v", "long")]), yes)
            .await
            .unwrap();
        let e = log
            .commit(
                &record_of("h", 4, &[("v", "string"), ("tip", "double")]),
                yes,
            )
            .await
            .unwrap_err();
        assert!(
            e.class() == ErrorClass::Conflict && e.to_string().contains("column \"v\" is \"long\""),
            "{e}"
        );
        assert_eq!(log.segment().await.unwrap().versions, vec![0, 1, 2, 3, 4]);
    }

    /// A table another writer created is not written to.
    #[tokio::test]
    async fn a_table_sluice_did_not_create_is_refused() {
        let store: Arc<dyn Store> = Arc::new(crate::storage::MemoryStore::new());
        let body = json!({"metaData": {"id": "x", "format": {"provider": "parquet", "options": {}},
            "schemaString": "{}", "partitionColumns": [], "configuration": {}}})
        .to_string();
        store
            .put(&commit_key(0), Bytes::from(body), PutMode::Create)
            .await
            .unwrap();
        let log = DeltaLog {
            store: &store,
            pipeline: "p",
            settings: DeltaSettings::default(),
        };
        let e = log
            .commit(&record("h1", 0), || async { Ok(Some(0)) })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("did not create"), "{e}");
    }
}
