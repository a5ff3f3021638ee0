//! The Parquet sink. Tasks write parts under `_sluice/staging/`, where no
//! reader that globs the sink looks, under keys that are a function of
//! (batch, task, part, epoch), so a retried task overwrites its own files
//! and a run that lost its lease never touches another's. The commit record
//! names the parts; publishing copies each to its final key
//! (`batch=N/part-...parquet`, server-side on S3, a hard link locally) and
//! writes the manifest `_sluice/manifest/N.json`, which names exactly the
//! committed files. Publishing is idempotent, so recovery finishes a
//! half-done one; staged parts of committed batches are then removed.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use futures::StreamExt;

use crate::checkpoint::{Commit, Manifest, OutputFile, SinkOwner, TaskId};
use crate::error::{Error, ErrorClass, Result};
use crate::paths;
use crate::storage::fanout::{concurrently, delete_all};
use crate::storage::{PutMode, PutOutcome, Store};

/// Roll to a new part file past this many encoded bytes.
const TARGET_PART_BYTES: usize = 256 << 20;

/// Parts of one output partition are numbered from `partition * PARTS_PER_PARTITION`.
const PARTS_PER_PARTITION: u32 = 1000;

/// How many partition folders one output partition of a task may write
/// to at once (each holds an open Parquet writer).
const MAX_OPEN_PARTITIONS: usize = 256;

/// Hive's folder name for a null (or empty) partition value.
const HIVE_NULL: &str = "__HIVE_DEFAULT_PARTITION__";

/// A partition value in a Hive folder name: the characters Hive and Spark
/// escape (`/`, `=`, `%`, `:`, quotes, wildcards, control characters...)
/// as `%XX`.
fn hive_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let escaped = (c as u32) < 0x20
            || matches!(
                c,
                '"' | '#'
                    | '%'
                    | '\''
                    | '*'
                    | '/'
                    | ':'
                    | '='
                    | '?'
                    | '\\'
                    | '\x7f'
                    | '{'
                    | '['
                    | ']'
                    | '^'
            );
        if escaped {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The Hive folders (`col=value/...`) of partition values `values`.
fn hive_dir(columns: &[String], values: &[Option<String>]) -> String {
    columns
        .iter()
        .zip(values)
        .map(|(c, v)| {
            format!(
                "{}={}/",
                hive_escape(c),
                v.as_deref().map_or(HIVE_NULL.to_string(), hive_escape)
            )
        })
        .collect()
}

/// Whether a column of this type can partition a sink: its values name
/// folders and a Delta table's partition values.
fn partitionable(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Date32
            | DataType::Boolean
    )
}

/// Whether a query whose output has `schema` can be partitioned by
/// `columns` (`sink.partition_by`): each must be an output column of a
/// type whose values name folders; what to do if not.
pub(crate) fn partition_check(
    schema: &SchemaRef,
    columns: &[String],
) -> std::result::Result<(), String> {
    for c in columns {
        let Some(f) = schema.fields().iter().find(|f| f.name() == c) else {
            let near = schema
                .fields()
                .iter()
                .find(|f| f.name().eq_ignore_ascii_case(c))
                .map(|f| format!(" (it has \"{}\": names are case-sensitive)", f.name()))
                .unwrap_or_default();
            return Err(format!(
                "sink.partition_by names \"{c}\", which the query's output does not have{near}: \
                 select it in query.sql, or change sink.partition_by"
            ));
        };
        if !partitionable(f.data_type()) {
            return Err(format!(
                "sink.partition_by: column \"{c}\" is {}, whose values cannot name folders: \
                 partition by a string, integer, boolean or date column (e.g. CAST(ts AS DATE) \
                 AS day in query.sql)",
                f.data_type()
            ));
        }
    }
    Ok(())
}

/// A partition value as text (`None` for null or empty, as Hive and Spark
/// write them).
fn partition_value(
    a: &datafusion::arrow::array::ArrayRef,
    row: usize,
) -> std::result::Result<Option<String>, String> {
    if a.is_null(row) {
        return Ok(None);
    }
    let v = datafusion::arrow::util::display::array_value_to_string(a, row)
        .map_err(|e| e.to_string())?;
    Ok((!v.is_empty()).then_some(v))
}

/// One partition folder's rows of a record batch: the folder, the
/// partition values, the rows.
type Split = (String, BTreeMap<String, Option<String>>, RecordBatch);

/// A part being written.
struct OpenPart {
    writer: ArrowWriter<Vec<u8>>,
    rows: u64,
    stats: Option<super::delta::PartStats>,
    values: BTreeMap<String, Option<String>>,
}

/// The type a column is written as, where Parquet has no logical type for
/// the Arrow one: a seconds timestamp or time (CSV and JSON inference gives
/// them) would be a bare INT64 or INT32 that DuckDB, Athena and Spark read
/// as integers, so it is written in milliseconds, losslessly.
fn readable_type(dt: &DataType) -> Option<DataType> {
    match dt {
        DataType::Timestamp(TimeUnit::Second, tz) => {
            Some(DataType::Timestamp(TimeUnit::Millisecond, tz.clone()))
        }
        DataType::Time32(TimeUnit::Second) => Some(DataType::Time32(TimeUnit::Millisecond)),
        _ => None,
    }
}

/// `schema` with each top-level column of a type readers cannot read as
/// written replaced by its [`readable_type`].
fn readable_schema(schema: &SchemaRef) -> SchemaRef {
    if !schema
        .fields()
        .iter()
        .any(|f| readable_type(f.data_type()).is_some())
    {
        return schema.clone();
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match readable_type(f.data_type()) {
            Some(t) => f.as_ref().clone().with_data_type(t),
            None => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// `rb` cast to `schema` (the [`readable_schema`] of its own).
fn as_readable(
    rb: RecordBatch,
    schema: &SchemaRef,
) -> std::result::Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    if rb.schema().fields() == schema.fields() {
        return Ok(rb);
    }
    let columns = rb
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| datafusion::arrow::compute::cast(c, f.data_type()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns)
}

/// `schema` with each top-level column of a type a Delta table has no
/// type for replaced by the wider one it is written as
/// ([`super::delta::delta_physical`]).
fn delta_schema_of(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match super::delta::delta_physical(f.data_type()) {
            Some(t) => f.as_ref().clone().with_data_type(t),
            None => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Whether a query whose output has `schema` can write a Delta table's
/// parts: the column whose type Delta lacks, and what to do, if not.
pub(crate) fn delta_check(schema: &SchemaRef) -> std::result::Result<(), String> {
    super::delta::schema_string(&delta_schema_of(&readable_schema(schema))).map(|_| ())
}

/// A Delta part's facts, from the batch's Delta schema, the part's
/// statistics and its partition values.
fn delta_part(
    schema: &Option<String>,
    stats: Option<super::delta::PartStats>,
    partition_values: BTreeMap<String, Option<String>>,
) -> Option<crate::checkpoint::DeltaPart> {
    Some(crate::checkpoint::DeltaPart {
        schema: schema.clone()?,
        stats: stats?.finish(),
        partition_values,
    })
}

/// The folder (prefix ending in `/`) a key is in.
fn folder_of(key: &str) -> String {
    key.rsplit_once('/')
        .map_or(String::new(), |(folder, _)| format!("{folder}/"))
}

/// How every Parquet file Sluice writes is written (parts, late rows).
fn writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("valid level"),
        ))
        .build()
}

/// A sink of Parquet files with a manifest per committed batch (and, as
/// Every file a batch's record names in the sink: its parts, its set-aside
/// rows, and a stateful query's late rows.
pub(crate) fn record_files(record: &Commit) -> Vec<&OutputFile> {
    let mut files: Vec<&OutputFile> = record.outputs.iter().collect();
    files.extend(record.rejected.iter());
    if let Some(s) = &record.stateful {
        files.extend(s.late_files.iter());
    }
    files
}

/// The most outputs a commit's check looks up one by one (a HEAD each)
/// rather than listing staging: eight HEADs cost less than one LIST.
pub(crate) const HEAD_MAX: usize = 8;

/// How a commit's check saw staging ([`ParquetSink::verify`]), which its
/// clean-up reuses ([`ParquetSink::remove_staged_through`]).
#[derive(Debug)]
pub(crate) enum Checked {
    /// Staging as listed then (what is staged after, besides the
    /// record's manifest, goes with a later batch's clean-up).
    Listed(Vec<crate::storage::ObjectMeta>),
    /// Each output looked up by name: the clean-up removes them by name;
    /// anything else staged for batches up to this one goes at the next
    /// sweep (every 64th batch lists staging).
    ByName,
    /// Not looked at: the clean-up lists staging.
    Unlisted,
}

/// a Delta sink, a Delta commit per batch).
#[derive(Debug, Clone)]
pub struct ParquetSink {
    store: Arc<dyn Store>,
    pipeline: String,
    delta: Option<super::delta::DeltaSettings>,
    /// `sink.partition_by`.
    partition_by: Vec<String>,
}

impl ParquetSink {
    /// A sink writing into `store`.
    pub fn new(store: Arc<dyn Store>, pipeline: &str) -> ParquetSink {
        ParquetSink {
            store,
            pipeline: pipeline.to_string(),
            delta: None,
            partition_by: Vec::new(),
        }
    }

    /// This sink, committing its batches to a Delta table too when
    /// `delta` is given: parts are written with Delta's types and
    /// statistics.
    pub fn with_delta(mut self, delta: Option<super::delta::DeltaSettings>) -> ParquetSink {
        self.delta = delta;
        self
    }

    /// Whether batches are committed to a Delta table too.
    pub fn delta(&self) -> bool {
        self.delta.is_some()
    }

    /// How batches are committed to a Delta table, for a Delta sink.
    pub fn delta_settings(&self) -> Option<super::delta::DeltaSettings> {
        self.delta.clone()
    }

    /// This sink, writing its parts in Hive-style folders of the values
    /// of `columns` (`sink.partition_by`).
    pub fn with_partition_by(mut self, columns: Vec<String>) -> ParquetSink {
        self.partition_by = columns;
        self
    }

    /// `sink.partition_by`.
    pub fn partition_by(&self) -> &[String] {
        &self.partition_by
    }

    /// A record batch cut by partition folder (one piece, with no folder,
    /// when the sink is not partitioned).
    fn split(&self, rb: RecordBatch) -> std::result::Result<Vec<Split>, String> {
        if self.partition_by.is_empty() {
            return Ok(vec![(String::new(), BTreeMap::new(), rb)]);
        }
        let schema = rb.schema();
        let cols = self
            .partition_by
            .iter()
            .map(|c| {
                schema
                    .index_of(c)
                    .map(|i| rb.column(i).clone())
                    .map_err(|_| {
                        format!("sink.partition_by: the query's output has no column \"{c}\"")
                    })
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut groups: BTreeMap<Vec<Option<String>>, Vec<u32>> = BTreeMap::new();
        for row in 0..rb.num_rows() {
            let key = cols
                .iter()
                .map(|a| partition_value(a, row))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            groups.entry(key).or_default().push(row as u32);
        }
        groups
            .into_iter()
            .map(|(key, rows)| {
                let idx = datafusion::arrow::array::UInt32Array::from(rows);
                let columns = rb
                    .columns()
                    .iter()
                    .map(|c| datafusion::arrow::compute::take(c, &idx, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let piece =
                    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())?;
                let dir = hive_dir(&self.partition_by, &key);
                let values = self.partition_by.iter().cloned().zip(key).collect();
                Ok((dir, values, piece))
            })
            .collect()
    }

    /// The pipeline whose output this sink holds.
    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn exec_err(&self, batch: u64, task: u32, message: String, class: ErrorClass) -> Error {
        Error::Execution {
            pipeline: self.pipeline.clone(),
            batch,
            task: Some(task),
            message,
            class,
        }
    }

    /// Write one output partition of a task as one or more Parquet parts.
    /// Returns the files written (none for an empty partition).
    pub(crate) async fn write_partition(
        &self,
        id: TaskId,
        partition: u32,
        schema: SchemaRef,
        mut stream: SendableRecordBatchStream,
    ) -> Result<Vec<OutputFile>> {
        let TaskId { batch, task, .. } = id;
        let props = writer_properties();
        let mut outputs = Vec::new();
        let fail = |m: String| self.exec_err(batch, task, m, ErrorClass::Fatal);
        let schema = readable_schema(&schema);
        // A Delta table's parts: Delta's types, a schema every part of the
        // batch shares, statistics per part.
        let (schema, delta_schema) = if self.delta.is_some() {
            let schema = delta_schema_of(&schema);
            // Checked when the query is checked; Fatal, not InvalidInput:
            // no input file is to blame.
            let delta = super::delta::schema_string(&schema)
                .map_err(|m| self.exec_err(batch, task, m, ErrorClass::Fatal))?;
            (schema, Some(delta))
        } else {
            (schema, None)
        };
        // The parts open now, by partition folder ("" unpartitioned), and
        // how many each folder has closed.
        let mut open: BTreeMap<String, OpenPart> = BTreeMap::new();
        let mut rolls: BTreeMap<String, u32> = BTreeMap::new();
        while let Some(rb) = stream.next().await {
            let rb = rb.map_err(|e| Error::Execution {
                pipeline: self.pipeline.clone(),
                batch,
                task: Some(task),
                message: e.to_string(),
                // Read errors are attributed to an input by the operator.
                class: ErrorClass::InvalidInput,
            })?;
            if rb.num_rows() == 0 {
                continue;
            }
            let rb =
                as_readable(rb, &schema).map_err(|e| fail(format!("cast for readers: {e}")))?;
            for (dir, values, rb) in self.split(rb).map_err(&fail)? {
                if !open.contains_key(&dir) {
                    if open.len() >= MAX_OPEN_PARTITIONS {
                        return Err(self.exec_err(
                            batch,
                            task,
                            format!(
                                "one task's output holds more than {MAX_OPEN_PARTITIONS} \
                                 values of sink.partition_by ({}): partition by a coarser \
                                 column, or lower limits.max_bytes_per_task",
                                self.partition_by.join(", ")
                            ),
                            ErrorClass::InvalidInput,
                        ));
                    }
                    let w = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(props.clone()))
                        .map_err(|e| fail(format!("parquet writer: {e}")))?;
                    open.insert(
                        dir.clone(),
                        OpenPart {
                            writer: w,
                            rows: 0,
                            stats: None,
                            values,
                        },
                    );
                }
                let o = open.get_mut(&dir).expect("opened above");
                o.writer
                    .write(&rb)
                    .map_err(|e| fail(format!("parquet write: {e}")))?;
                o.rows += rb.num_rows() as u64;
                if delta_schema.is_some() {
                    o.stats
                        .get_or_insert_with(|| super::delta::PartStats::new(&schema))
                        .update(rb.columns())?;
                }
                if o.writer.bytes_written() + o.writer.in_progress_size() >= TARGET_PART_BYTES {
                    let o = open.remove(&dir).expect("open");
                    let roll = rolls.entry(dir.clone()).or_insert(0);
                    outputs.push(
                        self.finish_part(id, partition, *roll, &dir, o, &delta_schema)
                            .await?,
                    );
                    *roll += 1;
                }
            }
        }
        for (dir, o) in open {
            let roll = rolls.get(&dir).copied().unwrap_or(0);
            outputs.push(
                self.finish_part(id, partition, roll, &dir, o, &delta_schema)
                    .await?,
            );
        }
        Ok(outputs)
    }

    /// Stage the malformed rows a task set aside, to be published as
    /// `_quarantine/batch=N/rows-TTTTT-eE.jsonl` (one JSON object a line:
    /// key, line, raw, reason) by the commit that names the file: a retried
    /// task of the same run rewrites its own; the rest is never published.
    pub(crate) async fn write_rejected<T: serde::Serialize>(
        &self,
        id: TaskId,
        rows: &[T],
    ) -> Result<OutputFile> {
        let mut body = Vec::new();
        for r in rows {
            serde_json::to_writer(&mut body, r).expect("plain records serialize");
            body.push(b'\n');
        }
        let key = paths::sink::rejected_rows(id.batch, id.task, id.epoch);
        let bytes = body.len() as u64;
        let written = self
            .store
            .put(
                &paths::sink::staged(&key),
                Bytes::from(body),
                PutMode::Overwrite,
            )
            .await?;
        Ok(OutputFile {
            key,
            rows: rows.len() as u64,
            bytes,
            delta: None,
            etag: written.etag(),
        })
    }

    /// Stage the late rows a task read, to be published as
    /// `_late/batch=N/late-T-eE.parquet` by the commit that names the file
    /// (a retried task of the same run rewrites its own; the rest is never
    /// published).
    pub(crate) async fn write_late(
        &self,
        id: TaskId,
        schema: SchemaRef,
        rows: &[datafusion::arrow::record_batch::RecordBatch],
    ) -> Result<OutputFile> {
        let key = paths::sink::late_rows(id.batch, id.task, id.epoch);
        let fail = |e: String| self.exec_err(id.batch, id.task, e, ErrorClass::Fatal);
        // The same writer settings as the sink's parts: types every reader
        // knows (a seconds timestamp would be a bare INT64), compressed.
        let schema = readable_schema(&schema);
        let mut w = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(writer_properties()))
            .map_err(|e| fail(format!("parquet open: {e}")))?;
        for b in rows {
            let b = as_readable(b.clone(), &schema)
                .map_err(|e| fail(format!("cast for readers: {e}")))?;
            w.write(&b)
                .map_err(|e| fail(format!("parquet write: {e}")))?;
        }
        let body = w
            .into_inner()
            .map_err(|e| fail(format!("parquet close: {e}")))?;
        let bytes = body.len() as u64;
        let written = self
            .store
            .put(
                &paths::sink::staged(&key),
                Bytes::from(body),
                PutMode::Overwrite,
            )
            .await?;
        Ok(OutputFile {
            key,
            rows: rows.iter().map(|b| b.num_rows() as u64).sum(),
            bytes,
            delta: None,
            etag: written.etag(),
        })
    }

    /// Close part `roll` of output partition `partition` of task `id`, in
    /// partition folder `dir`, and stage it.
    async fn finish_part(
        &self,
        id: TaskId,
        partition: u32,
        roll: u32,
        dir: &str,
        o: OpenPart,
        delta_schema: &Option<String>,
    ) -> Result<OutputFile> {
        let OpenPart {
            writer: w,
            rows,
            stats,
            values,
        } = o;
        let delta = delta_part(delta_schema, stats, values);
        let bytes = w.into_inner().map_err(|e| {
            self.exec_err(
                id.batch,
                id.task,
                format!("parquet close: {e}"),
                ErrorClass::Fatal,
            )
        })?;
        let part = partition * PARTS_PER_PARTITION + roll;
        let key = if dir.is_empty() {
            paths::sink::part(id.batch, id.task, part, id.epoch)
        } else {
            paths::sink::partitioned_part(id.batch, id.task, part, id.epoch, dir)
        };
        let size = bytes.len() as u64;
        let written = self
            .store
            .put(
                &paths::sink::staged(&key),
                Bytes::from(bytes),
                PutMode::Overwrite,
            )
            .await?;
        Ok(OutputFile {
            key,
            rows,
            bytes: size,
            delta,
            etag: written.etag(),
        })
    }

    /// Delete staged parts of a task that an earlier attempt of this run
    /// wrote and this attempt did not. Parts of other runs are left alone
    /// (the commit publishes only the parts its record names).
    pub(crate) async fn remove_stale_parts(&self, id: TaskId, keep: &[OutputFile]) -> Result<()> {
        let mine = paths::sink::epoch_suffix(id.epoch);
        // A partitioned sink's parts are in folders under the batch's.
        let prefix = if self.partition_by.is_empty() {
            paths::sink::staged_task_prefix(id.batch, id.task)
        } else {
            format!(
                "{}{}",
                paths::sink::STAGING_PREFIX,
                paths::sink::batch_prefix(id.batch)
            )
        };
        for meta in self.store.list(&prefix, None).await? {
            let Some(part) = paths::sink::published(&meta.key) else {
                continue;
            };
            if part.ends_with(&mine)
                && paths::sink::is_task_part(part, id.task)
                && !keep.iter().any(|o| o.key == part)
            {
                self.store.delete(&meta.key).await?;
            }
        }
        Ok(())
    }

    /// Check, before committing, that every file a batch's record will
    /// name (parts, late rows, set-aside rows) is staged with its size (or,
    /// for a commit retried after it published them, published with it).
    /// Returns how it saw staging, which the commit's clean-up reuses.
    ///
    /// `by_name`: only this run worked on the batch (its plan is this
    /// run's), so nothing else of the batch can be staged but what its own
    /// attempts wrote under the same names: up to [`HEAD_MAX`] files are
    /// looked up one by one (a HEAD is billed as a GET, a twelfth of a
    /// LIST), and the clean-up removes them by name. Otherwise staging is
    /// listed once.
    pub(crate) async fn verify(
        &self,
        batch: u64,
        files: &[&OutputFile],
        by_name: bool,
    ) -> Result<Checked> {
        if by_name && files.len() <= HEAD_MAX {
            for o in files {
                let staged = self.store.head(&paths::sink::staged(&o.key)).await?;
                if staged.is_some_and(|m| is_written(&m, o)) {
                    continue;
                }
                let published = self.store.head(&o.key).await?;
                if published.is_none_or(|m| m.size != o.bytes) {
                    return Err(self.missing(batch, &o.key));
                }
            }
            return Ok(Checked::ByName);
        }
        if files.is_empty() {
            return Ok(Checked::Unlisted);
        }
        let staged = self.store.list(paths::sink::STAGING_PREFIX, None).await?;
        let missing: Vec<&OutputFile> = files
            .iter()
            .copied()
            .filter(|o| {
                !staged
                    .iter()
                    .any(|m| paths::sink::published(&m.key) == Some(&o.key) && is_written(m, o))
            })
            .collect();
        let mut listed: Vec<(String, Vec<crate::storage::ObjectMeta>)> = Vec::new();
        for o in missing {
            let folder = folder_of(&o.key);
            if !listed.iter().any(|(f, _)| *f == folder) {
                let there = self.store.list(&folder, None).await?;
                listed.push((folder.clone(), there));
            }
            let (_, there) = listed.iter().find(|(f, _)| *f == folder).expect("listed");
            if !there.iter().any(|m| m.key == o.key && m.size == o.bytes) {
                return Err(self.missing(batch, &o.key));
            }
        }
        Ok(Checked::Listed(staged))
    }

    /// An output the commit's check did not find as its task wrote it.
    fn missing(&self, batch: u64, key: &str) -> Error {
        Error::Execution {
            pipeline: self.pipeline.clone(),
            batch,
            task: None,
            message: format!(
                "output {key} is missing, incomplete or written over before commit; the batch \
                 will be run again"
            ),
            class: ErrorClass::Retryable,
        }
    }

    /// Stage what the commit of `record` publishes besides the files its
    /// tasks and merges staged: the batch's `manifest`, and the record of
    /// the input files it set aside. The commit stages them before it
    /// checks its lease one last time and writes its record, so whoever
    /// publishes the record later copies exactly these, and a run stopped
    /// past its lease has nothing left to copy once a reset removed
    /// staging.
    pub(crate) async fn stage_commit(&self, record: &Commit, manifest: &Manifest) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(manifest).expect("a manifest serializes");
        self.store
            .put(
                &paths::sink::staged_manifest(record.batch, record.epoch),
                Bytes::from(bytes),
                PutMode::Overwrite,
            )
            .await?;
        if !record.quarantined.is_empty() {
            let body =
                serde_json::to_vec_pretty(&record.quarantined).expect("plain records serialize");
            self.store
                .put(
                    &paths::sink::staged_quarantined(record.batch, record.epoch),
                    Bytes::from(body),
                    PutMode::Overwrite,
                )
                .await?;
        }
        Ok(())
    }

    /// Publish a committed batch: copy every file its record names from
    /// staging to its final key (those already there with their size are
    /// kept), delete anything else under the batch's folder, then copy the
    /// staged manifest (and set-aside record) into place. Every write is a
    /// copy of a staged object, so it lands only while that object exists:
    /// a run stopped past its lease cannot publish after a reset removed
    /// staging. Idempotent: recovery runs it again after a crash part-way.
    ///
    /// `fresh`: the commit that has just written the record publishes it.
    /// Nothing can be in its batch's folders then (publishing needs the
    /// record, and a reset starts the new history at batch numbers no
    /// earlier history used), so it copies without listing them first.
    pub(crate) async fn publish(&self, record: &Commit, fresh: bool) -> Result<()> {
        let batch = record.batch;
        let files = record_files(record);
        let mut folders: Vec<String> = vec![paths::sink::batch_prefix(batch)];
        for f in &files {
            let folder = folder_of(&f.key);
            if !folders.contains(&folder) {
                folders.push(folder);
            }
        }
        let mut listed = Vec::new();
        if !fresh {
            for folder in &folders {
                listed.extend(self.store.list(folder, None).await?);
            }
        }
        let todo: Vec<String> = files
            .iter()
            .filter(|o| !listed.iter().any(|m| m.key == o.key && m.size == o.bytes))
            .map(|o| o.key.clone())
            .collect();
        let store = self.store.clone();
        let copied = concurrently(todo.clone(), move |key| {
            let store = store.clone();
            async move {
                let copied = store.copy(&paths::sink::staged(&key), &key).await?;
                Ok::<_, Error>(copied)
            }
        })
        .await?;
        let lost: Vec<&String> = todo
            .iter()
            .zip(copied)
            .filter(|(_, c)| !c)
            .map(|(k, _)| k)
            .collect();
        if !lost.is_empty() {
            // Another run publishing the same record may have copied them
            // and removed the staged copies meanwhile.
            let mut now = Vec::new();
            for folder in &folders {
                now.extend(self.store.list(folder, None).await?);
            }
            for key in lost {
                let size = files.iter().find(|f| &f.key == key).map(|f| f.bytes);
                if !now.iter().any(|m| &m.key == key && Some(m.size) == size) {
                    return Err(self.unpublishable(batch, key));
                }
            }
        }
        let stray: Vec<String> = listed
            .into_iter()
            .filter(|m| m.key.starts_with(&folders[0]))
            .filter(|m| !record.outputs.iter().any(|o| o.key == m.key))
            .map(|m| m.key)
            .collect();
        delete_all(&self.store, stray).await?;
        if !record.quarantined.is_empty() {
            self.publish_one(
                batch,
                &paths::sink::staged_quarantined(batch, record.epoch),
                &paths::sink::quarantined_files(batch),
            )
            .await?;
        }
        self.publish_one(
            batch,
            &paths::sink::staged_manifest(batch, record.epoch),
            &paths::sink::manifest(batch),
        )
        .await?;
        if self.delta.is_some() {
            // The last step: the Delta commit names only parts that are
            // published (above) and committed (the record).
            let log = self.delta_log();
            let owned = || async {
                Ok(self
                    .owner()
                    .await?
                    .filter(|o| o.history == record.history)
                    .map(|o| o.first_batch))
            };
            let done = log.commit(record, owned).await?;
            tracing::debug!(pipeline = %self.pipeline, batch, ?done, "delta commit");
        }
        Ok(())
    }

    /// The Delta log of the table in the sink's folder.
    fn delta_log(&self) -> super::delta::DeltaLog<'_> {
        super::delta::DeltaLog {
            store: &self.store,
            pipeline: &self.pipeline,
            settings: self.delta.clone().unwrap_or_default(),
        }
    }

    /// A Delta sink: why the table in its folder is not this pipeline's to
    /// write, if it is not (`None` for a Parquet sink, or no table yet).
    pub(crate) async fn delta_foreign(&self) -> Result<Option<String>> {
        if self.delta.is_none() {
            return Ok(None);
        }
        self.delta_log().foreign().await
    }

    /// A Delta sink's table version now (`None` before its first commit,
    /// and for a Parquet sink): one listing of its log.
    pub async fn delta_version(&self) -> Result<Option<u64>> {
        if self.delta.is_none() {
            return Ok(None);
        }
        self.delta_log().latest().await
    }

    /// A Delta sink: the Delta schema its parts of rows of `schema` have
    /// (`None` for a Parquet sink).
    pub(crate) fn delta_table_schema(&self, schema: &SchemaRef) -> Result<Option<String>> {
        if self.delta.is_none() {
            return Ok(None);
        }
        super::delta::schema_string(&delta_schema_of(&readable_schema(schema)))
            .map(Some)
            .map_err(|m| Error::Sql {
                pipeline: self.pipeline.clone(),
                message: m,
            })
    }

    /// A Delta sink: whether its table can take parts of a query whose
    /// output has `schema` (a changed query): refused naming the column,
    /// before a batch is committed that could not be published. One
    /// listing and the reads back to the newest metaData.
    pub(crate) async fn delta_schema_check(&self, schema: &SchemaRef) -> Result<()> {
        if self.delta.is_none() {
            return Ok(());
        }
        let parts = super::delta::schema_string(&delta_schema_of(&readable_schema(schema)))
            .map_err(|m| Error::Sql {
                pipeline: self.pipeline.clone(),
                message: m,
            })?;
        self.delta_log().check_schema(&parts).await
    }

    /// Before `sluice reset` of a Delta sink changes anything: whether
    /// the table lets it remove its files.
    pub(crate) async fn check_reset(&self) -> Result<()> {
        // Another pipeline's output (a copied pipeline file whose name
        // changed): a reset of this pipeline would delete it.
        if let Some(o) = self.owner().await?
            && o.pipeline != self.pipeline
        {
            return Err(Error::Spec {
                file: self.store.describe(),
                message: format!(
                    "sink.uri holds the output of pipeline \"{}\" (its owner record \
                     _sluice/sink.json), and `sluice reset` of pipeline \"{}\" would delete it: \
                     nothing was changed. Point sink.uri at this pipeline's own sink (or reset \
                     \"{}\" with its own pipeline file)",
                    o.pipeline, self.pipeline, o.pipeline
                ),
            });
        }
        if self.delta.is_none() {
            return Ok(());
        }
        self.delta_log().check_reset().await
    }

    /// `sluice reset` of a Delta sink, after its owner record was retired:
    /// one Delta commit that removes every live file and marks the table
    /// retired (see [`super::delta`]). Returns the parts it removed from
    /// the table.
    pub(crate) async fn retire_table(&self, now_ms: i64, retired: &str) -> Result<Vec<String>> {
        if self.delta.is_none() {
            return Ok(Vec::new());
        }
        self.delta_log().retire(now_ms, retired).await
    }

    /// Copy one staged record into place; if its staged copy is gone, the
    /// published one must be there already (a publish finished before).
    async fn publish_one(&self, batch: u64, staged: &str, key: &str) -> Result<()> {
        if self.store.copy(staged, key).await? || self.store.get(key).await?.is_some() {
            return Ok(());
        }
        Err(self.unpublishable(batch, key))
    }

    /// A committed file that is neither published nor staged: a reset (or
    /// a newer run that finished this batch) removed what this run was to
    /// publish, or the sink was changed outside Sluice.
    fn unpublishable(&self, batch: u64, key: &str) -> Error {
        Error::Execution {
            pipeline: self.pipeline.clone(),
            batch,
            task: None,
            message: format!(
                "committed output {key} is neither published nor staged: a `sluice reset` or a \
                 newer run removed it (this run lost its lease and stops), or the sink was \
                 changed outside Sluice (restore the file, or start over with `sluice reset`)"
            ),
            class: ErrorClass::Conflict,
        }
    }

    /// Delete the staged parts of batches up to `record`'s (all
    /// committed): the published copies are the output now, and whatever a
    /// run that lost its lease staged for them was never to be published.
    /// `listed`: staging as the commit's check listed it before it staged
    /// the record's manifest (`None`: list it now). What is staged after
    /// such a listing, besides that manifest, is removed by the next
    /// batch's commit.
    pub(crate) async fn remove_staged_through(
        &self,
        record: &Commit,
        checked: Checked,
    ) -> Result<()> {
        let batch = record.batch;
        let listed = match checked {
            Checked::Listed(l) => l,
            Checked::Unlisted => self.store.list(paths::sink::STAGING_PREFIX, None).await?,
            // The files the record names, staged (see `verify`).
            Checked::ByName => {
                let named = record_files(record).into_iter();
                let mut done: Vec<String> = named.map(|o| paths::sink::staged(&o.key)).collect();
                done.push(paths::sink::staged_manifest(batch, record.epoch));
                if !record.quarantined.is_empty() {
                    done.push(paths::sink::staged_quarantined(batch, record.epoch));
                }
                return delete_all(&self.store, done).await;
            }
        };
        let mut done: Vec<String> = listed
            .into_iter()
            .filter(|m| paths::sink::staged_batch(&m.key).is_none_or(|b| b <= batch))
            .map(|m| m.key)
            .collect();
        let mut own = vec![paths::sink::staged_manifest(batch, record.epoch)];
        if !record.quarantined.is_empty() {
            own.push(paths::sink::staged_quarantined(batch, record.epoch));
        }
        for key in own {
            if !done.contains(&key) {
                done.push(key);
            }
        }
        delete_all(&self.store, done).await
    }

    /// Delete what runs up to lease `epoch` staged for batches from
    /// `batch` on (batches abandoned before their commit). A newer run's
    /// staged files are left alone.
    pub(crate) async fn remove_staged_from(&self, batch: u64, epoch: u64) -> Result<()> {
        let keys: Vec<String> = self
            .store
            .list(paths::sink::STAGING_PREFIX, None)
            .await?
            .into_iter()
            .map(|m| m.key)
            .filter(|k| paths::sink::staged_batch(k).is_some_and(|b| b >= batch))
            .filter(|k| paths::epoch_of(k).is_none_or(|e| e <= epoch))
            .collect();
        delete_all(&self.store, keys).await
    }

    /// After a run that died: remove the temporary files its killed writes
    /// left in the sink's own folder (staging, manifests).
    pub(crate) async fn sweep(&self) -> Result<()> {
        let n = self.store.sweep_temp("_sluice/").await?;
        if n > 0 {
            tracing::info!(pipeline = %self.pipeline, files = n, "removed temporary files of killed writes from the sink");
        }
        Ok(())
    }

    /// The sink's owner record, if it has one.
    pub async fn owner(&self) -> Result<Option<SinkOwner>> {
        Ok(self.owner_tagged().await?.map(|(o, _)| o))
    }

    /// The owner record with its etag.
    async fn owner_tagged(&self) -> Result<Option<(SinkOwner, String)>> {
        let Some(obj) = self.store.get(paths::sink::OWNER).await? else {
            return Ok(None);
        };
        serde_json::from_slice(&obj.bytes)
            .map(|o| Some((o, obj.etag)))
            .map_err(|e| Error::Checkpoint {
                pipeline: self.pipeline.clone(),
                key: format!("{}/{}", self.store.describe(), paths::sink::OWNER),
                message: format!("unreadable sink owner record: {e}"),
            })
    }

    /// Record `owner` as the sink's owner: create-only, or in place of the
    /// record `sluice reset` left (this pipeline's, with no history), by
    /// compare-and-swap. Returns the record that is there after (ours, or
    /// one written first by someone else).
    pub(crate) async fn claim(&self, owner: &SinkOwner) -> Result<SinkOwner> {
        let bytes = Bytes::from(serde_json::to_vec_pretty(owner).expect("an owner serializes"));
        for _ in 0..4 {
            let mode = match self.owner_tagged().await? {
                None => PutMode::Create,
                // A reset's record: taken by a run of a later epoch, never
                // by one of the history it retired (stopped past its lease
                // and resumed after the reset).
                Some((o, etag))
                    if o.history.is_empty()
                        && o.pipeline == owner.pipeline
                        && owner.epoch > o.epoch =>
                {
                    PutMode::Update(etag)
                }
                Some((o, _)) => return Ok(o),
            };
            if let PutOutcome::Written(_) = self
                .store
                .put(paths::sink::OWNER, bytes.clone(), mode)
                .await?
            {
                return Ok(owner.clone());
            }
        }
        self.owner().await?.ok_or_else(|| Error::Checkpoint {
            pipeline: self.pipeline.clone(),
            key: paths::sink::OWNER.into(),
            message: "the owner record keeps changing under this run".into(),
        })
    }

    /// `sluice reset`: record that the sink's output up to `first_batch`
    /// is retired (this pipeline's record with no history, and the epoch
    /// the reset moved control to), by
    /// compare-and-swap on what was there, in place of the history
    /// `retired` or an older record, so a reset resumed late cannot undo
    /// the claim of the history that followed it. `false` when another
    /// record stays.
    pub(crate) async fn retire(
        &self,
        first_batch: u64,
        epoch: u64,
        retired: &str,
        checkpoint: &str,
    ) -> Result<bool> {
        let tomb = SinkOwner {
            pipeline: self.pipeline.clone(),
            history: String::new(),
            checkpoint: checkpoint.to_string(),
            first_batch,
            epoch,
        };
        let mode = match self.owner_tagged().await? {
            Some((o, _)) if o == tomb => return Ok(true),
            // The history this reset retires (`retired`, its checkpoint's
            // when the reset began): replaced.
            Some((o, etag)) if !o.history.is_empty() && o.history == retired => {
                PutMode::Update(etag)
            }
            // Another history (or a reset's record) from this reset's first
            // batch on: recorded after this reset decided its numbers, so
            // another reset finished first, and a run may have started the
            // next history. Left as it is.
            Some((o, _)) if o.first_batch >= first_batch => return Ok(false),
            Some((_, etag)) => PutMode::Update(etag),
            None => PutMode::Create,
        };
        let bytes = Bytes::from(serde_json::to_vec_pretty(&tomb).expect("an owner serializes"));
        Ok(matches!(
            self.store.put(paths::sink::OWNER, bytes, mode).await?,
            PutOutcome::Written(_)
        ))
    }

    /// The batch numbers of the manifests in the sink, ascending.
    pub(crate) async fn manifest_batches(&self) -> Result<Vec<u64>> {
        Ok(self
            .store
            .list(paths::sink::MANIFEST_PREFIX, None)
            .await?
            .iter()
            .filter_map(|m| paths::sink::manifest_batch(&m.key))
            .collect())
    }

    /// The manifest of batch `batch`, if there is one.
    pub(crate) async fn manifest(&self, batch: u64) -> Result<Option<Manifest>> {
        let key = paths::sink::manifest(batch);
        let Some(obj) = self.store.get(&key).await? else {
            return Ok(None);
        };
        serde_json::from_slice(&obj.bytes)
            .map(Some)
            .map_err(|e| Error::Checkpoint {
                pipeline: self.pipeline.clone(),
                key,
                message: format!("unreadable manifest: {e}"),
            })
    }

    /// Read the manifests of all committed batches of the sink's history,
    /// in batch order: from the owner record's first batch (one below it
    /// is retired: `sluice reset` removed it, or a run stopped past its
    /// lease published it late).
    pub async fn manifests(&self) -> Result<Vec<Manifest>> {
        let first = self.owner().await?.map_or(0, |o| o.first_batch);
        let mut out = Vec::new();
        for meta in self.store.list(paths::sink::MANIFEST_PREFIX, None).await? {
            if paths::sink::manifest_batch(&meta.key).is_some_and(|b| b < first) {
                continue;
            }
            if let Some(obj) = self.store.get(&meta.key).await? {
                let m: Manifest =
                    serde_json::from_slice(&obj.bytes).map_err(|e| Error::Checkpoint {
                        pipeline: self.pipeline.clone(),
                        key: meta.key.clone(),
                        message: format!("unreadable manifest: {e}"),
                    })?;
                out.push(m);
            }
        }
        Ok(out)
    }
}

/// Whether the staged object `m` is the file `o` as its task wrote it: its
/// size, and its entity tag where both the task's write and the check's
/// HEAD or listing gave one (a copy gets a new one; a published file is
/// checked by size only).
fn is_written(m: &crate::storage::ObjectMeta, o: &OutputFile) -> bool {
    m.size == o.bytes
        && match (&m.etag, &o.etag) {
            (Some(a), Some(b)) => a.trim_matches('"') == b.trim_matches('"'),
            _ => true,
        }
}

#[cfg(test)]
mod partition_tests {
    use super::*;

    #[test]
    /// Spark's set (ExternalCatalogUtils.escapePathName): not `}`.
    fn partition_folders_escape_what_hive_escapes() {
        assert_eq!(hive_escape("2026-12-01"), "2026-12-01");
        assert_eq!(hive_escape("a/b=c %"), "a%2Fb%3Dc %25");
        assert_eq!(
            hive_escape("x:y?*#'\"^[]{}"),
            "x%3Ay%3F%2A%23%27%22%5E%5B%5D%7B}"
        );
        assert_eq!(hive_escape("tab\tnl\n"), "tab%09nl%0A");
        assert_eq!(hive_escape("plain é"), "plain é");
        assert_eq!(
            hive_dir(
                &["day".to_string(), "tag".to_string()],
                &[Some("2026-12-01".to_string()), None]
            ),
            "day=2026-12-01/tag=__HIVE_DEFAULT_PARTITION__/"
        );
    }
}
