//! `[deduplicate]` in a task and after the Dedup step.
//!
//! A task of a deduplicating pipeline does not run the query: it reads its
//! files one by one in the batch's planned order (late rows dropped and
//! counted by the watermark, as for a stateful query), tags each row with
//! its file's position among the batch's inputs and its position in the
//! file, and writes the rows to the checkpoint split into the state
//! partitions by a stable hash of the key (`work/N/partials/p=P/...`).
//! The Dedup step of each partition (`handlers::dedup`) keeps each key's
//! first row by that order, then runs the query over the kept rows: a
//! row-by-row query writes staged sink parts, a stateful one writes its
//! partial states for the Merge map.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::physical_plan::execute_stream_partitioned;

use super::partial::{EventTime, TaskState};
use super::{PartialFile, Readable, SqlOperator, StatefulQuery, Task, TaskResult};
use crate::checkpoint::{Checkpoint, InputFile, OutputFile, TaskId};
use crate::error::Result;
use crate::pipeline::Deduplicate;
use crate::sinks::ParquetSink;
use crate::storage::{RequestCounts, Store};

/// The column a task tags each row with: the position of its file among
/// the batch's planned inputs.
pub(crate) const FILE: &str = "__sluice_file";
/// The column a task tags each row with: its position within its file
/// (after late rows were dropped).
pub(crate) const ROW: &str = "__sluice_row";
/// The schema of rows as tasks ship them: the source's, then [`FILE`] and
/// [`ROW`].
pub(crate) fn tagged_schema(source: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = source.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(FILE, DataType::UInt32, false));
    fields.push(Field::new(ROW, DataType::UInt64, false));
    Arc::new(Schema::new(fields))
}

/// `batch` (of the source schema) tagged with file `file` and row numbers
/// from `first_row`.
pub(crate) fn tag(
    batch: &RecordBatch,
    file: u32,
    first_row: u64,
) -> Result<RecordBatch, ArrowError> {
    let n = batch.num_rows();
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(UInt32Array::from(vec![file; n])));
    columns.push(Arc::new(
        (first_row..first_row + n as u64).collect::<datafusion::arrow::array::UInt64Array>(),
    ));
    RecordBatch::try_new(tagged_schema(&batch.schema()), columns)
}

/// A key column as keys compare: floats with -0.0 made 0.0 and every NaN
/// one NaN (Spark's and SQL's equality; the row format orders them apart).
pub(crate) fn comparable(col: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Float32Type, Float64Type};
    Ok(match col.data_type() {
        DataType::Float64 => Arc::new(col.as_primitive::<Float64Type>().unary::<_, Float64Type>(
            |v| {
                if v == 0.0 {
                    0.0
                } else if v.is_nan() {
                    f64::NAN
                } else {
                    v
                }
            },
        )),
        DataType::Float32 => Arc::new(col.as_primitive::<Float32Type>().unary::<_, Float32Type>(
            |v| {
                if v == 0.0 {
                    0.0
                } else if v.is_nan() {
                    f32::NAN
                } else {
                    v
                }
            },
        )),
        DataType::Float16 => comparable(&cast(col, &DataType::Float64)?)?,
        _ => col.clone(),
    })
}

impl SqlOperator {
    /// The pipeline's `[deduplicate]`, checked against the source schema:
    /// its key columns exist and can be hashed into partitions; its event
    /// time (the watermark's column) is a timestamp.
    pub(crate) fn deduplicating(&self) -> Result<Option<&Deduplicate>> {
        let Some(d) = &self.pipeline.deduplicate else {
            return Ok(None);
        };
        for k in &d.key {
            let f = self.schema.field_with_name(k).map_err(|_| {
                self.sql_err(format!(
                    "deduplicate.key names \"{k}\", which is not a source column (the source \
                     has {}): name source columns, as read, before the query",
                    self.schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            let empty =
                RecordBatch::new_empty(Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
                    f.clone(),
                ])));
            super::partition::split(&empty, &[0], 1).map_err(|e| {
                self.sql_err(format!(
                    "deduplicate.key: {}",
                    e.to_string()
                        .replace("a group key of a stateful query", "a deduplication key")
                ))
            })?;
        }
        if let Some(w) = &self.pipeline.watermark {
            match self
                .schema
                .field_with_name(&w.column)
                .map(|f| f.data_type())
            {
                Ok(datafusion::arrow::datatypes::DataType::Timestamp(_, _)) => {}
                Ok(t) => {
                    return Err(self.sql_err(format!(
                        "[watermark] column = \"{}\" is {}, not a timestamp: type it with \
                         source.schema_hints = {{ {} = \"timestamp\" }} (or in source.schema)",
                        w.column,
                        crate::pipeline::types::type_name(t),
                        w.column
                    )));
                }
                Err(_) => {
                    return Err(self.sql_err(format!(
                        "[watermark] column = \"{}\" is not a source column: with \
                         [deduplicate] the watermark's column is the event time of the source \
                         rows",
                        w.column
                    )));
                }
            }
        }
        Ok(Some(d))
    }

    /// One task of a deduplicating pipeline: read, tag and split the rows
    /// into the state partitions (`work/N/partials/p=P/task-T-eE.arrow`);
    /// late rows, when the watermark keeps them, are staged for the sink's
    /// `_late/`.
    pub(crate) async fn run_dedup_partial(
        &self,
        source: &dyn Store,
        sink: &ParquetSink,
        checkpoint: &Checkpoint,
        task: Task<'_>,
        q: Option<&StatefulQuery>,
        state: &TaskState,
    ) -> Result<TaskResult> {
        let id = task.id;
        let started = std::time::Instant::now();
        let d = self
            .deduplicating()?
            .ok_or_else(|| self.sql_err("a deduplicating task without [deduplicate]"))?;
        let Readable {
            access,
            files,
            deferred,
            mut gone,
        } = self.readable(source, task).await?;
        gone.extend(self.partial_gone(&access, id.batch, &files).await?);
        let files: Vec<&InputFile> = files.iter().filter(|f| !gone.contains(&f.key)).collect();
        // One partition per scan: a file's rows come in its order.
        let one = SqlOperator {
            partitions: 1,
            ..self.clone()
        };
        let watermark = self.pipeline.watermark.as_ref();
        let column = watermark
            .map(|w| w.column.as_str())
            .or_else(|| q.and_then(|q| q.window.as_ref()).map(|w| w.column.as_str()));
        let exec = self.exec_err(id);
        let n = state.partitions.max(1);
        let key: Vec<usize> = d
            .key
            .iter()
            .map(|k| self.schema.index_of(k).map_err(|e| self.sql_err(e)))
            .collect::<Result<_>>()?;
        let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); n as usize];
        // A key's later rows in this task are duplicates whatever the
        // Dedup step decides of its first (kept, or dropped as held): they
        // are dropped and counted here, and only each key's first row in
        // the task is shipped.
        let converter = datafusion::arrow::row::RowConverter::new(
            key.iter()
                .map(|i| {
                    datafusion::arrow::row::SortField::new(
                        self.schema.field(*i).data_type().clone(),
                    )
                })
                .collect(),
        )
        .map_err(|e| exec(e.into()))?;
        let mut seen: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
        let mut duplicates = 0u64;
        let (mut rows_in, mut late, mut max_event_us) = (0u64, 0u64, None::<i64>);
        let mut late_rows: Vec<RecordBatch> = Vec::new();
        let session = one.session();
        // The source's store (an S3 bucket, a record stream's memory):
        // only local files are known to a session without it.
        session.register_object_store(access.url.as_ref(), access.store.clone());
        // The files are read at once, each in its own scan (one partition:
        // its rows in order), then taken in the batch's order.
        let scans = futures::future::try_join_all(files.iter().map(|f| {
            let (one, access, session) = (&one, &access, &session);
            async move {
                let ordinal = task
                    .inputs
                    .iter()
                    .position(|i| i.key == f.key)
                    .unwrap_or(usize::MAX) as u32;
                let (provider, tally) = one.event_time_input(
                    access,
                    &[*f],
                    EventTime {
                        column,
                        window: None,
                        watermark,
                        watermark_us: state.watermark_us,
                        // A row with no event time has no expiry: late,
                        // as a window query counts it.
                        untimed_late: true,
                    },
                )?;
                let plan = provider
                    .scan(&session.state(), None, &[], None)
                    .await
                    .map_err(exec)?;
                let read = datafusion::physical_plan::collect_partitioned(
                    plan.clone(),
                    session.task_ctx(),
                )
                .await
                .map_err(exec)?;
                Ok::<_, crate::error::Error>((ordinal, plan, read, tally))
            }
        }))
        .await?;
        let mut scans = scans;
        scans.sort_by_key(|(ordinal, ..)| *ordinal);
        for (ordinal, plan, read, tally) in scans {
            rows_in += super::leaf_rows(&plan);
            late += tally.late.load(Ordering::Relaxed);
            max_event_us = max_event_us.max(tally.max_event_us());
            if let Some(m) = tally.late_rows.as_ref() {
                late_rows.extend(std::mem::take(&mut *m.lock().expect("not poisoned")));
            }
            let mut row = 0u64;
            for b in read.into_iter().flatten() {
                let tagged = tag(&b, ordinal, row).map_err(|e| exec(e.into()))?;
                row += b.num_rows() as u64;
                let columns = key
                    .iter()
                    .map(|i| comparable(tagged.column(*i)))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| exec(e.into()))?;
                let rows = converter
                    .convert_columns(&columns)
                    .map_err(|e| exec(e.into()))?;
                let firsts: datafusion::arrow::array::BooleanArray = rows
                    .iter()
                    // (Looked up borrowed: only a new key is copied.)
                    .map(|r| Some(!seen.contains(r.as_ref()) && seen.insert(r.as_ref().to_vec())))
                    .collect();
                let tagged = datafusion::arrow::compute::filter_record_batch(&tagged, &firsts)
                    .map_err(|e| exec(e.into()))?;
                duplicates += (b.num_rows() - tagged.num_rows()) as u64;
                for (p, piece) in super::partition::split(&tagged, &key, n)
                    .map_err(|e| self.sql_err(e))?
                    .into_iter()
                    .enumerate()
                {
                    if piece.num_rows() > 0 {
                        parts[p].push(piece);
                    }
                }
            }
        }
        let schema = tagged_schema(&self.schema);
        let mut partials = Vec::new();
        for (p, batches) in parts.into_iter().enumerate() {
            if batches.is_empty() {
                continue;
            }
            let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
            let bytes = super::aggregate::to_ipc(&schema, &batches).map_err(exec)?;
            let key = checkpoint.put_partial(id, p as u32, bytes).await?;
            partials.push(PartialFile {
                partition: p as u32,
                key,
                rows,
            });
        }
        let late_file = if late_rows.is_empty() {
            None
        } else {
            Some(sink.write_late(id, self.schema.clone(), &late_rows).await?)
        };
        Ok(TaskResult {
            late_file,
            task: id.task,
            rows_in,
            rows_out: 0,
            bytes_read: files.iter().map(|f| f.size).sum(),
            millis: started.elapsed().as_millis() as u64,
            cpu_ms: 0,
            requests: source.counts().plus(&RequestCounts {
                put: partials.len() as u64,
                ..Default::default()
            }),
            deferred,
            gone,
            partials,
            late_rows: late,
            max_event_us,
            duplicates,
            ..TaskResult::default()
        })
    }

    /// The rows a Dedup step kept as the table the query reads.
    fn kept_table(&self, kept: RecordBatch) -> Result<Arc<MemTable>> {
        Ok(Arc::new(
            MemTable::try_new(self.schema.clone(), vec![vec![kept]])
                .map_err(|e| self.sql_err(e))?,
        ))
    }

    /// A row-by-row query over the rows the Dedup step of partition
    /// `id.task` kept, staged as sink parts named for it (leftovers of an
    /// earlier attempt removed).
    pub(crate) async fn write_kept(
        &self,
        sink: &ParquetSink,
        id: TaskId,
        kept: RecordBatch,
    ) -> Result<Vec<OutputFile>> {
        let exec = self.exec_err(id);
        let ctx = self.session();
        ctx.register_table(self.pipeline.source.table.as_str(), self.kept_table(kept)?)
            .map_err(|e| self.sql_err(e))?;
        self.register_statics(&ctx)?;
        let plan = ctx
            .sql(&self.pipeline.sql)
            .await
            .map_err(exec)?
            .create_physical_plan()
            .await
            .map_err(exec)?;
        let schema = plan.schema();
        let streams = execute_stream_partitioned(plan, ctx.task_ctx()).map_err(exec)?;
        let outputs = super::write_partitions(sink, id, 0, schema, streams).await?;
        sink.remove_stale_parts(id, &outputs).await?;
        Ok(outputs)
    }

    /// A stateful query over the rows the Dedup step of partition `id.task`
    /// kept: windows assigned, aggregated partially, and the partial states
    /// written per state partition for the Merge map.
    pub(crate) async fn partials_of_kept(
        &self,
        checkpoint: &Checkpoint,
        id: TaskId,
        q: &StatefulQuery,
        kept: RecordBatch,
        n: u32,
    ) -> Result<Vec<PartialFile>> {
        let table = self.kept_table(kept)?;
        let provider: Arc<dyn datafusion::datasource::TableProvider> = match &q.window {
            // Late rows and rows without event time were dropped by the
            // tasks: here only the windows are assigned.
            Some(w) => Arc::new(
                super::event_time::EventTimeTable::new(
                    table,
                    &w.column,
                    Some(w.clone()),
                    None,
                    Arc::new(super::event_time::EventTally::default()),
                )
                .map_err(|e| self.sql_err(e))?,
            ),
            None => table,
        };
        let ctx = super::aggregate::session(self.partitions);
        ctx.register_table(self.pipeline.source.table.as_str(), provider)
            .map_err(|e| self.sql_err(e))?;
        self.register_statics(&ctx)?;
        let partial = self.aggregate_partially(&ctx, id, q).await?;
        self.write_partials(checkpoint, id, &partial, n, Some(id.task))
            .await
    }
}
