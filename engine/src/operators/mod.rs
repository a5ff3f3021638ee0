//! Operators: run the pipeline's SQL with DataFusion over exactly one task's
//! input files and hand the rows to the sink.
//!
//! `classify` decides which queries may run as micro-batches; `scan` is
//! the input table, a table provider over a fixed list of files with their
//! planned sizes, so DataFusion never lists the source.

mod adapt;
pub(crate) mod aggregate;
mod attribute;
mod classify;
pub(crate) mod dedup;
mod drift;
mod event_time;
mod freshness;
mod partial;
mod partition;
mod salvage;
mod scan;
mod stateful;
pub(crate) mod statics;
pub(crate) mod window;

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::file_compression_type::FileCompressionType;
use datafusion::datasource::file_format::json::JsonFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_plan::{
    ExecutionPlan, SendableRecordBatchStream, execute_stream_partitioned,
};
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::checkpoint::{InputFile, OutputFile, Quarantined, TaskId, TaskPlan};
use crate::discovery::{Freshness, Source};
use crate::error::{Error, ErrorClass, Result};
use crate::pipeline::{
    BadFilePolicy, BadRowPolicy, CORRUPT_RECORD, Compression, Pipeline, SourceFormat, derived_count,
};
use crate::sinks::ParquetSink;
use crate::storage::{RequestCounts, ScanAccess, Store};
use attribute::is_not_found;
use freshness::Readable;
use scan::BatchTable;

/// Input bytes per output partition below which a task uses fewer partitions.
const SMALL_TASK_BYTES: u64 = 8 << 20;

/// One task as an operator runs it: which it is, and what it reads.
#[derive(Debug, Clone, Copy)]
pub struct Task<'a> {
    /// Which task, of which batch, under which run.
    pub id: TaskId,
    /// Its batch's planned inputs (the task's plan indexes into them).
    pub inputs: &'a [InputFile],
    /// The task's part of the batch.
    pub plan: &'a TaskPlan,
}

/// What one task did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskResult {
    /// Task number.
    pub task: u32,
    /// Files written.
    pub outputs: Vec<OutputFile>,
    /// Rows read from the inputs.
    pub rows_in: u64,
    /// Rows written.
    pub rows_out: u64,
    /// Input bytes.
    pub bytes_read: u64,
    /// Billed duration of the task's invocation, ms.
    pub millis: u64,
    /// CPU time of the process over the task's invocation, ms (see
    /// [`FunctionUsage::cpu_ms`](crate::checkpoint::FunctionUsage::cpu_ms)).
    #[serde(default)]
    pub cpu_ms: u64,
    /// The operator function's configured memory, MB.
    #[serde(default)]
    pub memory_mb: u64,
    /// Failed attempts of this task's step before the one that wrote this.
    #[serde(default)]
    pub retries: u64,
    /// Storage requests of this task.
    #[serde(default)]
    pub requests: RequestCounts,
    /// Inputs not read because they changed since they were listed or
    /// notified (a local file still being written), as the task found them:
    /// not part of the batch, left for the next run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deferred: Vec<InputFile>,
    /// Inputs deleted from the source since they were planned (keys).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gone: Vec<String>,
    /// Inputs that could not be read, set aside (`on_bad_file =
    /// "quarantine"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<Quarantined>,
    /// Malformed rows set aside (`on_bad_row = "quarantine"`): the
    /// quarantine file of this task (its `rows` is how many).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<OutputFile>,
    /// Fields made null (`on_bad_row = "null"`).
    #[serde(default)]
    pub nulled_fields: u64,
    /// Fields put into `_rescued` (`on_schema_change = "rescue"`).
    #[serde(default)]
    pub rescued_fields: u64,
    /// A stateful query: the partial states the task wrote, per state
    /// partition (only partitions it has groups for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partials: Vec<PartialFile>,
    /// A stateful query: rows dropped as late.
    #[serde(default)]
    pub late_rows: u64,
    /// A stateful query: the largest event time read (none if no row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_event_us: Option<i64>,
    /// `[deduplicate]`: a key's later rows within the task, dropped as
    /// duplicates before the Dedup step (which counts the rest).
    #[serde(default)]
    pub duplicates: u64,
    /// A stateful query with `late = "side-output"`: the late rows the task
    /// wrote under the sink's `_late/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_file: Option<OutputFile>,
    /// A Kinesis task: what it read of each of its shard units (the
    /// commit moves the shards' cursors by them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shard_reads: Vec<crate::checkpoint::ShardRead>,
}

/// Partial states a task wrote for one state partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartialFile {
    /// The state partition.
    pub partition: u32,
    /// Checkpoint key.
    pub key: String,
    /// Groups in it.
    pub rows: u64,
}

pub(crate) use aggregate::Staged;

/// What the operators' unit tests share.
#[cfg(test)]
pub(crate) mod testing {
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

    /// Batches as sorted `|`-joined text rows (a multiset), nulls as NULL.
    pub(crate) fn render(batches: &[RecordBatch]) -> Vec<String> {
        let opts = FormatOptions::default().with_null("NULL");
        let mut out = Vec::new();
        for b in batches {
            let f: Vec<_> = b
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts).expect("formattable"))
                .collect();
            for r in 0..b.num_rows() {
                out.push(
                    f.iter()
                        .map(|f| f.value(r).to_string())
                        .collect::<Vec<_>>()
                        .join("|"),
                );
            }
        }
        out.sort();
        out
    }
}
pub(crate) use partial::TaskState;
pub(crate) use stateful::StatefulQuery;

/// A session for merging and finishing states.
pub(crate) fn staging_session() -> SessionContext {
    aggregate::session(1)
}

/// `batches` as a stream.
pub(crate) fn batches_stream(
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> SendableRecordBatchStream {
    Box::pin(
        datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter(batches.into_iter().map(Ok)),
        ),
    )
}

/// The static tables as a batch reads them (its plan's pins), and the
/// stores to read them from (`None`: only checking the query).
type StaticInputs = (
    Vec<crate::checkpoint::StaticPin>,
    Option<Vec<Arc<dyn Store>>>,
);

/// Runs the pipeline's SQL over task inputs with DataFusion.
#[derive(Debug, Clone)]
pub struct SqlOperator {
    pipeline: Arc<Pipeline>,
    schema: SchemaRef,
    partitions: usize,
    /// Input keys whose columns the drift check infers from another file
    /// of the same store, of the same columns and far fewer lines (a
    /// record stream's shapes).
    shapes: std::collections::HashMap<String, InputFile>,
    /// The static tables as the batch reads them (`[[static]]`), and the
    /// stores to read them from (`None`: checking the query, no rows).
    statics: Arc<StaticInputs>,
    /// Whether an earlier attempt of the task may have staged parts this
    /// one does not write again (they are removed at the task's end). A
    /// first attempt leaves that to the commit, which removes everything
    /// staged for its batch, and saves the listing.
    retried: bool,
}

impl SqlOperator {
    /// An operator for `pipeline` reading its inputs with `schema`.
    pub fn new(pipeline: Arc<Pipeline>, schema: SchemaRef) -> SqlOperator {
        let partitions = std::thread::available_parallelism().map_or(2, |n| n.get());
        SqlOperator {
            pipeline,
            schema,
            partitions,
            shapes: Default::default(),
            statics: Default::default(),
            retried: true,
        }
    }

    /// The operator for the first attempt of its task (`retried` false):
    /// no earlier attempt staged parts for it.
    pub(crate) fn with_retried(mut self, retried: bool) -> SqlOperator {
        self.retried = retried;
        self
    }

    /// The operator, joining the static tables as `pins` say (read from
    /// `stores`, one per `[[static]]` table in order; `None` when only
    /// checking the query).
    pub(crate) fn with_statics(
        mut self,
        pins: Vec<crate::checkpoint::StaticPin>,
        stores: Option<Vec<Arc<dyn Store>>>,
    ) -> SqlOperator {
        self.statics = Arc::new((pins, stores));
        self
    }

    /// The error refusing batch `batch` when a static table's pinned file
    /// changed or went since the plan (one listing per table), if one did.
    /// `read`, a task's read of its input joined with the static tables,
    /// unless a static table's file was replaced since the plan: that
    /// fails the pinned read, or (a store without entity tags) is found
    /// after it; either way the batch is refused, and so planned again by
    /// the next run with the table as it stands then.
    pub(super) async fn statics_unchanged<T>(&self, batch: u64, read: Result<T>) -> Result<T> {
        if self.pipeline.statics.is_empty() {
            return read;
        }
        if let Some(changed) = self.static_changed(batch).await? {
            return Err(changed);
        }
        read
    }

    async fn static_changed(&self, batch: u64) -> Result<Option<Error>> {
        let (pins, Some(stores)) = self.statics.as_ref() else {
            return Ok(None);
        };
        for (t, store) in self.pipeline.statics.iter().zip(stores) {
            let Some(pin) = pins.iter().find(|p| p.table == t.table) else {
                continue;
            };
            let now = store.list("", None).await?;
            for f in &pin.files {
                // (A Delta table's files are named by its log, with
                // neither tag nor time: there, only their presence.)
                let same = now.iter().any(|m| {
                    m.key == f.key
                        && m.size == f.size
                        && (f.etag.is_none() || m.etag == f.etag)
                        && (f.modified_ms.is_none()
                            || m.last_modified.map(|t| t.timestamp_millis()) == f.modified_ms)
                });
                if !same {
                    return Ok(Some(Error::Input {
                        pipeline: self.pipeline.name.clone(),
                        batch: Some(batch),
                        key: format!("{}/{}", store.describe(), f.key),
                        message: format!(
                            "static table {} changed since the batch was planned (this file \
                             was replaced or deleted): the batch is given up, and the next run \
                             plans it again with the table as it stands then",
                            t.table
                        ),
                    }));
                }
            }
        }
        Ok(None)
    }

    /// Register the static tables in `ctx` with no rows (planning the
    /// query's stages).
    fn register_statics_empty(&self, ctx: &SessionContext) -> Result<()> {
        if self.pipeline.statics.is_empty() {
            return Ok(());
        }
        statics::register(ctx, &self.pipeline, &self.statics.0, None)
    }

    /// Register the static tables in `ctx` (with rows when the operator
    /// has their stores).
    fn register_statics(&self, ctx: &SessionContext) -> Result<()> {
        if self.pipeline.statics.is_empty() {
            return Ok(());
        }
        let (pins, stores) = self.statics.as_ref();
        statics::register(ctx, &self.pipeline, pins, stores.as_deref())
    }

    /// The operator, its drift check inferring each of `shapes`' keys'
    /// columns from the file it maps to, a file with one line of each
    /// shape of the key's lines: the same union of columns and types.
    pub(crate) fn with_shapes(
        self,
        shapes: std::collections::HashMap<String, InputFile>,
    ) -> SqlOperator {
        SqlOperator { shapes, ..self }
    }

    /// The batch's schema without the columns Sluice fills: what a file
    /// holds.
    fn file_schema(&self) -> datafusion::arrow::datatypes::Schema {
        let fields = self.schema.fields();
        let read = fields.len() - derived_count(&self.schema);
        datafusion::arrow::datatypes::Schema::new(fields[..read].to_vec())
    }

    /// The DataFusion file format of the pipeline's source.
    pub fn format(pipeline: &Pipeline) -> Arc<dyn FileFormat> {
        let s = &pipeline.source;
        let compression = match s.compression {
            None => FileCompressionType::UNCOMPRESSED,
            Some(Compression::Gzip) => FileCompressionType::GZIP,
            Some(Compression::Zstd) => FileCompressionType::ZSTD,
        };
        match s.format {
            SourceFormat::Parquet => Arc::new(ParquetFormat::default()),
            SourceFormat::Csv => Arc::new(
                CsvFormat::default()
                    .with_has_header(s.header)
                    .with_delimiter(s.delimiter)
                    .with_file_compression_type(compression),
            ),
            SourceFormat::Jsonl => {
                Arc::new(JsonFormat::default().with_file_compression_type(compression))
            }
        }
    }

    /// The file format for reading a file's own schema (the drift check,
    /// `add-columns` at planning): as [`SqlOperator::format`], except that
    /// JSON Lines is inferred from every line, not the first 1,000: a
    /// value or key that first appears further down must not slip past the
    /// check and be read truncated or dropped.
    pub(crate) fn inference_format(pipeline: &Pipeline) -> Arc<dyn FileFormat> {
        let s = &pipeline.source;
        if s.format != SourceFormat::Jsonl {
            return Self::format(pipeline);
        }
        let compression = match s.compression {
            None => FileCompressionType::UNCOMPRESSED,
            Some(Compression::Gzip) => FileCompressionType::GZIP,
            Some(Compression::Zstd) => FileCompressionType::ZSTD,
        };
        Arc::new(
            JsonFormat::default()
                .with_file_compression_type(compression)
                .with_schema_infer_max_rec(usize::MAX),
        )
    }

    fn session(&self) -> SessionContext {
        let config = SessionConfig::new()
            .with_target_partitions(self.partitions)
            .with_information_schema(false);
        SessionContext::new_with_config(config)
    }

    fn sql_err(&self, e: impl std::fmt::Display) -> Error {
        Error::Sql {
            pipeline: self.pipeline.name.clone(),
            message: e.to_string(),
        }
    }

    /// Check that the SQL plans against the schema and is a query whose
    /// micro-batch results add up to the one-shot result. Returns the
    /// logical plan.
    pub async fn check(&self) -> Result<LogicalPlan> {
        Ok(self.check_output().await?.0)
    }

    /// [`Self::check`], with the schema of the rows the query writes.
    pub async fn check_output(&self) -> Result<(LogicalPlan, Option<SchemaRef>)> {
        let p = &self.pipeline;
        if self.deduplicating()?.is_some() {
            self.check_bad_input_policies("[deduplicate]")?;
        }
        if let Some(q) = self.analyse_stateful().await? {
            // Planned and checked as a stateful query.
            return LogicalPlanBuilder::empty(false)
                .build()
                .map(|plan| (plan, Some(q.output)))
                .map_err(|e| self.sql_err(e));
        }
        if p.deduplicate.is_some() && p.output_mode != crate::pipeline::OutputMode::Append {
            return Err(self.sql_err(
                "sink.mode applies to a GROUP BY query (a stateful query); this query is row \
                 by row after [deduplicate]: each kept row is written once, so remove sink.mode",
            ));
        }
        if p.deduplicate.is_none()
            && (p.watermark.is_some() || p.output_mode != crate::pipeline::OutputMode::Append)
        {
            return Err(self.sql_err(
                "[watermark] and sink.mode apply to a GROUP BY query (a stateful query); this \
                 query is row by row: remove them",
            ));
        }
        let ctx = self.session();
        let empty =
            MemTable::try_new(self.schema.clone(), vec![vec![]]).map_err(|e| self.sql_err(e))?;
        ctx.register_table(self.pipeline.source.table.as_str(), Arc::new(empty))
            .map_err(|e| self.sql_err(e))?;
        self.register_statics(&ctx)?;
        let plan = ctx
            .state()
            .create_logical_plan(&self.pipeline.sql)
            .await
            .map_err(|e| self.sql_err(format!("{e}\nfix query.sql in the pipeline file")))?;
        let shape = classify::not_batch_equivalent(&plan, &self.pipeline.source.table)
            .map_err(|e| self.sql_err(format!("cannot inspect the query's plan: {e}")))?;
        if let Some(reason) = shape {
            return Err(self.sql_err(reason));
        }
        // Optimise and plan physically too: some errors (a literal that
        // cannot be cast) only show there.
        let physical = ctx
            .state()
            .create_physical_plan(&plan)
            .await
            .map_err(|e| self.sql_err(format!("{e}\nfix query.sql in the pipeline file")))?;
        crate::sinks::partition_check(&physical.schema(), &p.partition_by)
            .map_err(|m| self.sql_err(m))?;
        if p.sink_format == crate::pipeline::SinkFormat::Delta {
            crate::sinks::delta_check(&physical.schema())
                .map_err(|m| self.sql_err(format!("sink.format = \"delta\": {m}")))?;
        }
        Ok((plan, Some(physical.schema())))
    }

    async fn plan_query(
        &self,
        access: &ScanAccess,
        inputs: &[&InputFile],
        sql: &str,
    ) -> std::result::Result<(SessionContext, Arc<dyn ExecutionPlan>), DataFusionError> {
        self.plan_query_in(self.scan_session(access), access, inputs, sql)
            .await
    }

    /// A session that reads the source through `access`.
    fn scan_session(&self, access: &ScanAccess) -> SessionContext {
        let ctx = self.session();
        ctx.register_object_store(access.url.as_ref(), access.store.clone());
        ctx
    }

    /// The object meta DataFusion is given for an input: the planned size,
    /// and a fixed time (so the metadata cache holds across reads of it).
    fn object_meta(access: &ScanAccess, f: &InputFile) -> object_store::ObjectMeta {
        object_store::ObjectMeta {
            location: access.path(&f.key),
            last_modified: chrono::DateTime::UNIX_EPOCH,
            size: f.size,
            e_tag: None,
            version: None,
        }
    }

    /// [`Self::plan_query`] in `ctx` (a [`Self::scan_session`]).
    async fn plan_query_in(
        &self,
        ctx: SessionContext,
        access: &ScanAccess,
        inputs: &[&InputFile],
        sql: &str,
    ) -> std::result::Result<(SessionContext, Arc<dyn ExecutionPlan>), DataFusionError> {
        let table = BatchTable::over(
            self.schema.clone(),
            Self::format(&self.pipeline),
            access.url.clone(),
            inputs
                .iter()
                .map(|f| (Self::object_meta(access, f), *f))
                .collect(),
            self.partitions,
        )?;
        ctx.register_table(self.pipeline.source.table.as_str(), Arc::new(table))?;
        self.register_statics(&ctx)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let df = ctx.sql(sql).await?;
        let plan = df.create_physical_plan().await?;
        Ok((ctx, plan))
    }

    /// The task's input files, looked up by the indexes its plan names; an
    /// index past the plan's inputs means the stored plan is corrupt.
    fn planned_inputs<'a>(
        &self,
        batch: u64,
        inputs: &'a [InputFile],
        task: &TaskPlan,
    ) -> Result<Vec<&'a InputFile>> {
        task.inputs
            .iter()
            .map(|i| inputs.get(*i as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| Error::Checkpoint {
                pipeline: self.pipeline.name.clone(),
                key: crate::paths::checkpoint::offsets(batch),
                message: format!(
                    "task {} names an input index past the plan's {} inputs; the plan is \
                     corrupt: delete it (and the batch's uncommitted output) to plan afresh",
                    task.task,
                    inputs.len()
                ),
            })
    }

    /// Run one task of batch `batch` for the run holding lease `epoch`: read
    /// `task`'s inputs, run the SQL and write the result to `sink`. An input
    /// that cannot be read is named in the error, or, under
    /// `on_bad_file = "quarantine"`, set aside in the result and the rest
    /// read. In `list` mode a local file that changed since it was listed
    /// (still being written) is not read: the result names it as deferred,
    /// and the next run takes it.
    pub async fn run(
        &self,
        source: &dyn Store,
        sink: &ParquetSink,
        task: Task<'_>,
    ) -> Result<TaskResult> {
        let started = Instant::now();
        // Small tasks run as one partition: one output file, not one per core.
        let op = SqlOperator {
            partitions: self
                .partitions
                .min((task.plan.bytes / SMALL_TASK_BYTES).max(1) as usize),
            ..self.clone()
        };
        let Readable {
            access,
            files,
            deferred,
            mut gone,
        } = self.readable(source, task).await?;
        let read = self
            .statics_unchanged(
                task.id.batch,
                op.read_and_write(&access, sink, task, files).await,
            )
            .await?;
        gone.extend(read.gone);
        Ok(TaskResult {
            deferred,
            gone,
            task: task.id.task,
            rows_in: read.rows_in,
            rows_out: read.outputs.iter().map(|o| o.rows).sum(),
            bytes_read: read.bytes,
            outputs: read.outputs,
            millis: started.elapsed().as_millis() as u64,
            cpu_ms: 0,
            memory_mb: 0,
            retries: 0,
            // The scans' requests included (the access counts them).
            requests: source.counts().plus(&sink.store().counts()),
            quarantined: read.quarantined,
            rejected: read.rejected,
            nulled_fields: read.nulled,
            rescued_fields: read.rescued,
            partials: Vec::new(),
            late_rows: 0,
            max_event_us: None,
            late_file: None,
            duplicates: 0,
            shard_reads: Vec::new(),
        })
    }

    /// Read `files` and write the query's result: check each file's columns
    /// against the pinned schema (in the session that then scans them, so a
    /// Parquet footer is read once), run the query, write the parts. Under
    /// `on_bad_file = "quarantine"` a file that cannot be read is set aside
    /// and the task runs again without it (its parts are rewritten under the
    /// same names; leftovers are removed).
    async fn read_and_write(
        &self,
        access: &ScanAccess,
        sink: &ParquetSink,
        task: Task<'_>,
        mut files: Vec<InputFile>,
    ) -> Result<TaskRead> {
        let id = task.id;
        let mut sorted = Sorted::default();
        let exec = self.exec_err(id);
        let mut session = None;
        if !files.is_empty() {
            // Once: later rounds read a subset of the files checked.
            let checked_in = self.scan_session(access);
            self.sort_out_drift(&checked_in, access, id.batch, &mut files, &mut sorted)
                .await?;
            session = Some(checked_in);
        }
        loop {
            if files.is_empty() {
                // Every input was deferred, set aside or read row by row.
                let read = TaskRead {
                    quarantined: sorted.quarantined,
                    gone: sorted.gone,
                    ..TaskRead::default()
                };
                return self.finish_task(access, sink, id, read, sorted.apart).await;
            }
            let session = session.take().unwrap_or_else(|| self.scan_session(access));
            let refs: Vec<&InputFile> = files.iter().collect();
            let (ctx, plan) = self
                .plan_query_in(session, access, &refs, &self.pipeline.sql)
                .await
                .map_err(exec)?;
            let schema = plan.schema();
            let streams = execute_stream_partitioned(plan.clone(), ctx.task_ctx()).map_err(exec)?;
            let outputs = match write_partitions(sink, id, 0, schema, streams).await {
                Ok(outputs) => outputs,
                Err(e) if e.class() == ErrorClass::InvalidInput => {
                    self.take_out_culprit(access, id, &mut files, e, &mut sorted)
                        .await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let read = TaskRead {
                rows_in: leaf_rows(&plan),
                bytes: files.iter().map(|f| f.size).sum(),
                outputs,
                quarantined: sorted.quarantined,
                gone: sorted.gone,
                ..TaskRead::default()
            };
            return self.finish_task(access, sink, id, read, sorted.apart).await;
        }
    }

    /// Check `files`' columns against the pinned schema in `session` (the
    /// one that then scans them, so a Parquet footer is read once) and
    /// take out of `files` those the scan cannot read: gone, read row by
    /// row, set aside (`on_bad_file = "quarantine"`) or read apart by
    /// their own columns. A file that does not read is an error otherwise.
    async fn sort_out_drift(
        &self,
        session: &SessionContext,
        access: &ScanAccess,
        batch: u64,
        files: &mut Vec<InputFile>,
        sorted: &mut Sorted,
    ) -> Result<()> {
        let quarantine = self.pipeline.source.on_bad_file == BadFilePolicy::Quarantine;
        let refs: Vec<&InputFile> = files.iter().collect();
        let checked = self.check_drift(session, access, batch, &refs).await?;
        let mut keys: Vec<String> = Vec::new();
        for f in &checked.gone {
            self.warn_gone(batch, &f.key);
            keys.push(f.key.clone());
            sorted.gone.push(f.key.clone());
        }
        for (f, reason) in &checked.unreadable {
            keys.push(f.key.clone());
            match self.salvage(access, f).await? {
                Some(s) => sorted.apart.salvaged.push(((*f).clone(), s)),
                None if quarantine => {
                    let why = self.why_unreadable(access, f, reason).await;
                    sorted.set_aside(&self.pipeline.name, batch, f, why);
                }
                None => return Err(self.unreadable(access, batch, f, reason).await),
            }
        }
        for (f, found) in &checked.adapted {
            keys.push(f.key.clone());
            sorted.apart.adapted.push(((*f).clone(), found.clone()));
        }
        drop(checked);
        files.retain(|f| !keys.contains(&f.key));
        Ok(())
    }

    /// The scan of `files` failed with `e`, an input error: find the file
    /// at fault and take it out of `files` (read apart as text, gone, read
    /// row by row, or set aside), or return the error naming it (or the
    /// query) when the policies keep none of these.
    async fn take_out_culprit(
        &self,
        access: &ScanAccess,
        id: TaskId,
        files: &mut Vec<InputFile>,
        e: Error,
        sorted: &mut Sorted,
    ) -> Result<()> {
        let batch = id.batch;
        let refs: Vec<&InputFile> = files.iter().collect();
        let culprit = self.culprit(access, &refs).await;
        let Some(c) = culprit.as_ref().filter(|c| c.unreadable) else {
            return Err(self.attribute(id, culprit, e));
        };
        let f = files.iter().find(|f| f.key == c.key).expect("a task input");
        // JSON numbers or booleans in a column held as text: DataFusion's
        // reader refuses them; read apart, they are taken as written (as
        // Spark and DuckDB do). Under `rescue`, a CSV value its column's
        // type cannot hold: read apart (as text), it goes into `_rescued`.
        let source = &self.pipeline.source;
        let to_text = (source.format == SourceFormat::Jsonl
            && c.reason.contains("expected string got"))
            || (source.format == SourceFormat::Csv
                && source.on_schema_change == crate::pipeline::SchemaChangePolicy::Rescue
                && source.on_bad_row == BadRowPolicy::Fail
                && !c.gone);
        let found = if to_text {
            let schemas = self.file_schemas(access, std::slice::from_ref(f)).await?;
            schemas.into_iter().next().and_then(|(_, s)| s.ok())
        } else {
            None
        };
        if let Some(found) = found {
            sorted.apart.adapted.push((f.clone(), found));
        } else if c.gone {
            self.warn_gone(batch, &f.key);
            sorted.gone.push(f.key.clone());
        } else if let Some(s) = self.salvage(access, f).await? {
            sorted.apart.salvaged.push((f.clone(), s));
        } else if self.pipeline.source.on_bad_file == BadFilePolicy::Quarantine {
            sorted.set_aside(&self.pipeline.name, batch, f, c.why.clone());
        } else {
            return Err(self.attribute(id, culprit, e));
        }
        let key = f.key.clone();
        files.retain(|f| f.key != key);
        Ok(())
    }

    /// After the scan of the task's clean files: run the query over the
    /// rows kept from files read row by row and over the files read apart
    /// (output partitions numbered after the scan's), write the bad rows to
    /// the quarantine (`_quarantine/batch=N/rows-T-eE.jsonl`), and remove
    /// parts a failed attempt of this task left.
    async fn finish_task(
        &self,
        access: &ScanAccess,
        sink: &ParquetSink,
        id: TaskId,
        mut read: TaskRead,
        apart: Apart,
    ) -> Result<TaskRead> {
        let Apart { salvaged, adapted } = apart;
        if !adapted.is_empty() {
            self.write_adapted(access, sink, id, &mut read, adapted)
                .await?;
        }
        if !salvaged.is_empty() {
            let kept: Vec<RecordBatch> = salvaged.iter().map(|(_, s)| s.batch.clone()).collect();
            let rows: u64 = kept.iter().map(|b| b.num_rows() as u64).sum();
            let ctx = self.session();
            let table =
                MemTable::try_new(self.schema.clone(), vec![kept]).map_err(|e| self.sql_err(e))?;
            ctx.register_table(self.pipeline.source.table.as_str(), Arc::new(table))
                .map_err(|e| self.sql_err(e))?;
            let exec = self.exec_err(id);
            let plan = ctx
                .sql(&self.pipeline.sql)
                .await
                .map_err(exec)?
                .create_physical_plan()
                .await
                .map_err(exec)?;
            let streams = execute_stream_partitioned(plan.clone(), ctx.task_ctx()).map_err(exec)?;
            let first = self.partitions.max(1);
            let more = write_partitions(sink, id, first, plan.schema(), streams).await?;
            read.outputs.extend(more);
            read.rows_in += rows;
            read.bytes += salvaged.iter().map(|(f, _)| f.size).sum::<u64>();
            let bad: Vec<&salvage::BadRow> =
                salvaged.iter().flat_map(|(_, s)| s.bad.iter()).collect();
            read.nulled = salvaged.iter().map(|(_, s)| s.nulled).sum();
            if !bad.is_empty() {
                read.rejected = Some(sink.write_rejected(id, &bad).await?);
            }
        }
        if self.retried {
            sink.remove_stale_parts(id, &read.outputs).await?;
        }
        Ok(read)
    }

    /// Run the query over the files read apart (`adapt`) and write its
    /// parts, numbered after the scan's and the salvaged rows'. A file that
    /// fails to read is found by reading each alone, and set aside or named
    /// as the file policy says.
    async fn write_adapted(
        &self,
        access: &ScanAccess,
        sink: &ParquetSink,
        id: TaskId,
        read: &mut TaskRead,
        mut adapted: Vec<(InputFile, SchemaRef)>,
    ) -> Result<()> {
        let quarantine = self.pipeline.source.on_bad_file == BadFilePolicy::Quarantine;
        let exec = self.exec_err(id);
        let batch = id.batch;
        let run = |files: &[(InputFile, SchemaRef)], sql: &str| {
            let tally = Arc::new(adapt::Tally::default());
            let table = self.adapted_table(access, files, &tally);
            let ctx = self.session();
            let sql = sql.to_string();
            async move {
                ctx.register_table(self.pipeline.source.table.as_str(), Arc::new(table?))?;
                let plan = ctx.sql(&sql).await?.create_physical_plan().await?;
                Ok::<_, DataFusionError>((ctx, plan, tally))
            }
        };
        while !adapted.is_empty() {
            let (ctx, plan, tally) = run(&adapted, &self.pipeline.sql).await.map_err(exec)?;
            let streams = execute_stream_partitioned(plan.clone(), ctx.task_ctx()).map_err(exec)?;
            let first = 2 * self.partitions.max(1);
            let e = match write_partitions(sink, id, first, plan.schema(), streams).await {
                Ok(more) => {
                    read.outputs.extend(more);
                    read.rows_in += tally.rows.load(std::sync::atomic::Ordering::Relaxed);
                    read.rescued += tally.rescued.load(std::sync::atomic::Ordering::Relaxed);
                    read.bytes += adapted.iter().map(|(f, _)| f.size).sum::<u64>();
                    return Ok(());
                }
                Err(e) if e.class() == ErrorClass::InvalidInput => e,
                Err(e) => return Err(e),
            };
            // Which file: each read alone, whole.
            let read_all = format!("SELECT * FROM \"{}\"", self.pipeline.source.table);
            let mut culprit = None;
            for one in &adapted {
                let probe = async {
                    let (ctx, plan, _) = run(std::slice::from_ref(one), &read_all).await?;
                    datafusion::physical_plan::collect(plan, ctx.task_ctx()).await
                };
                if let Err(e) = probe.await {
                    culprit = Some((one.0.clone(), e.to_string().trim().to_string()));
                    break;
                }
            }
            match culprit {
                Some((f, reason)) if quarantine => {
                    let reason = self.why_unreadable(access, &f, &reason).await;
                    tracing::warn!(pipeline = %self.pipeline.name, batch, key = %f.key, %reason, "input file quarantined");
                    read.quarantined.push(Quarantined {
                        key: f.key.clone(),
                        size: f.size,
                        batch,
                        reason,
                    });
                    adapted.retain(|(a, _)| a.key != f.key);
                }
                Some((f, reason)) => return Err(self.unreadable(access, batch, &f, reason).await),
                None => return Err(self.attribute(id, None, e)),
            }
        }
        Ok(())
    }
}

/// What a task read and wrote.
#[derive(Default)]
struct TaskRead {
    rows_in: u64,
    bytes: u64,
    outputs: Vec<OutputFile>,
    quarantined: Vec<Quarantined>,
    /// Bad rows set aside, in one quarantine file.
    rejected: Option<OutputFile>,
    /// Fields made null (`on_bad_row = "null"`).
    nulled: u64,
    /// Fields put into `_rescued`.
    rescued: u64,
    /// Inputs deleted since they were planned.
    gone: Vec<String>,
}

/// A task's files not read by its scan, as they are sorted out.
#[derive(Default)]
struct Sorted {
    /// Set aside (`on_bad_file = "quarantine"`).
    quarantined: Vec<Quarantined>,
    /// Deleted since they were planned.
    gone: Vec<String>,
    /// Read row by row, or apart.
    apart: Apart,
}

impl Sorted {
    /// Set `f` aside for `reason`.
    fn set_aside(&mut self, pipeline: &str, batch: u64, f: &InputFile, reason: String) {
        tracing::warn!(pipeline = %pipeline, batch, key = %f.key, %reason, "input file quarantined");
        self.quarantined.push(Quarantined {
            key: f.key.clone(),
            size: f.size,
            batch,
            reason,
        });
    }
}

/// Files of a task not read by its scan: read row by row (`salvage`), or
/// read apart by their own columns (`adapt`).
#[derive(Default)]
struct Apart {
    salvaged: Vec<(InputFile, salvage::Salvaged)>,
    adapted: Vec<(InputFile, SchemaRef)>,
}

/// Rows produced by the leaves (the scans) of an executed plan.
fn leaf_rows(plan: &Arc<dyn ExecutionPlan>) -> u64 {
    if plan.children().is_empty() {
        // A static table's scan reads no input rows.
        let static_scan = plan
            .downcast_ref::<datafusion::datasource::source::DataSourceExec>()
            .and_then(|d| {
                d.data_source()
                    .downcast_ref::<datafusion::datasource::physical_plan::FileScanConfig>()
            })
            .is_some_and(|c| c.object_store_url.as_str().starts_with(statics::URL_SCHEME));
        if static_scan {
            return 0;
        }
        plan.metrics().and_then(|m| m.output_rows()).unwrap_or(0) as u64
    } else {
        plan.children().into_iter().map(leaf_rows).sum()
    }
}

/// Writes each output partition of the query from a tokio task of its own, so
/// decoding, the query and Parquet encoding of the partitions run on separate
/// cores. Returns every part written, or the first error.
async fn write_partitions(
    sink: &ParquetSink,
    id: TaskId,
    first: usize,
    schema: SchemaRef,
    streams: Vec<SendableRecordBatchStream>,
) -> Result<Vec<OutputFile>> {
    let writes: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(p, stream)| (p + first, stream))
        .map(|(p, stream)| {
            let sink = sink.clone();
            let schema = schema.clone();
            tokio::spawn(async move { sink.write_partition(id, p as u32, schema, stream).await })
        })
        .collect();
    let mut outputs = Vec::new();
    let mut first_err = None;
    for w in futures::future::join_all(writes).await {
        let w = w.unwrap_or_else(|e| {
            Err(Error::Execution {
                pipeline: sink.pipeline().to_string(),
                batch: id.batch,
                task: Some(id.task),
                message: format!("writer task failed: {e}"),
                class: ErrorClass::Fatal,
            })
        });
        match w {
            Ok(o) => outputs.extend(o),
            Err(e) if first_err.is_none() => first_err = Some(e),
            Err(_) => {}
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(outputs),
    }
}
