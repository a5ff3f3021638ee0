//! One task of a stateful query: read the task's files (late rows
//! dropped, windows assigned), aggregate them partially, and write the
//! partial states to the checkpoint, split into the state partitions by a
//! stable hash of the group key. Nothing goes to the sink: the merges of
//! the batch write it (`crate::state::merge`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use super::aggregate::{Staged, session};
use super::event_time::{EventTally, EventTimeTable};
use super::scan::BatchTable;
use super::{PartialFile, Readable, SqlOperator, StatefulQuery, Task, TaskResult};
use crate::checkpoint::{Checkpoint, InputFile, TaskId};
use crate::error::{Error, Result};
use crate::sinks::ParquetSink;
use crate::storage::{RequestCounts, ScanAccess, Store};

/// What a stateful task reads with, from the last commit.
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskState {
    /// The watermark in force: rows at or below it are late.
    pub watermark_us: Option<i64>,
    /// State partitions.
    pub partitions: u32,
}

/// How a task reads event time.
pub(super) struct EventTime<'a> {
    /// The event-time column (none: rows are read as they are).
    pub column: Option<&'a str>,
    /// The window assigned as rows are read.
    pub window: Option<crate::operators::window::WindowSpec>,
    /// `[watermark]`, if any: late rows are dropped (or kept aside).
    pub watermark: Option<&'a crate::pipeline::Watermark>,
    /// The watermark in force.
    pub watermark_us: Option<i64>,
    /// A row without an event time is late even without a window.
    pub untimed_late: bool,
}

/// A task's partial aggregation, run.
pub(super) struct Partials {
    /// The aggregate in stages.
    staged: Staged,
    /// The partial stage's plan (its leaves count the rows read).
    plan: Arc<dyn ExecutionPlan>,
    /// The partial states.
    states: Vec<RecordBatch>,
}

impl SqlOperator {
    /// The query planned over an empty input in a staging session: its
    /// aggregate in stages (what merges and finishes states).
    pub(crate) async fn staged(&self, q: &StatefulQuery) -> Result<Staged> {
        let schema = self.windowed_schema(q.window.as_ref())?;
        let ctx = session(1);
        let empty = MemTable::try_new(schema, vec![vec![]]).map_err(|e| self.sql_err(e))?;
        ctx.register_table(self.pipeline.source.table.as_str(), Arc::new(empty))
            .map_err(|e| self.sql_err(e))?;
        self.register_statics_empty(&ctx)?;
        let plan = ctx
            .sql(&q.sql)
            .await
            .map_err(|e| self.sql_err(e))?
            .create_physical_plan()
            .await
            .map_err(|e| self.sql_err(e))?;
        Ok(Staged::of(plan)
            .map_err(|e| self.sql_err(e))?
            .ok_or_else(|| self.sql_err("the query's aggregate was planned away"))?
            .with_window(q.window.as_ref()))
    }

    /// Run one task of a stateful query: read, aggregate partially, and
    /// write the partial states to the checkpoint
    /// (`work/N/partials/p=P/task-T-eE.arrow`); late rows, when the
    /// watermark keeps them, are staged for the sink's `_late/`.
    pub(crate) async fn run_partial(
        &self,
        source: &dyn Store,
        sink: &ParquetSink,
        checkpoint: &Checkpoint,
        task: Task<'_>,
        q: &StatefulQuery,
        state: &TaskState,
    ) -> Result<TaskResult> {
        let id = task.id;
        let started = std::time::Instant::now();
        let Readable {
            access,
            files,
            deferred,
            mut gone,
        } = self.readable(source, task).await?;
        gone.extend(self.partial_gone(&access, id.batch, &files).await?);
        let files: Vec<&InputFile> = files.iter().filter(|f| !gone.contains(&f.key)).collect();
        let column = q
            .watermark
            .as_ref()
            .map(|w| w.column.clone())
            .or_else(|| q.window.as_ref().map(|w| w.column.clone()));
        let (provider, tally) = self.event_time_input(
            &access,
            &files,
            EventTime {
                column: column.as_deref(),
                window: q.window.clone(),
                watermark: q.watermark.as_ref(),
                watermark_us: state.watermark_us,
                untimed_late: false,
            },
        )?;
        let ctx = session(self.partitions);
        ctx.register_object_store(access.url.as_ref(), access.store.clone());
        ctx.register_table(self.pipeline.source.table.as_str(), provider)
            .map_err(|e| self.sql_err(e))?;
        self.register_statics(&ctx)?;
        let partial = match self.aggregate_partially(&ctx, id, q).await {
            // Input that does not read: name it (a record of a stream by
            // its shard and sequence number) and say what can be done.
            Err(e) => Err(self.unreadable_in_state(&access, id.batch, &files, e).await),
            read => read,
        };
        let partial = self.statics_unchanged(id.batch, partial).await?;
        let partials = self
            .write_partials(checkpoint, id, &partial, state.partitions.max(1), None)
            .await?;
        let late: Vec<RecordBatch> = tally
            .late_rows
            .as_ref()
            .map(|m| std::mem::take(&mut *m.lock().expect("not poisoned")))
            .unwrap_or_default();
        let late_file = if late.is_empty() {
            None
        } else {
            Some(sink.write_late(id, self.schema.clone(), &late).await?)
        };
        Ok(TaskResult {
            late_file,
            task: id.task,
            rows_in: super::leaf_rows(&partial.plan),
            rows_out: 0,
            bytes_read: files.iter().map(|f| f.size).sum(),
            outputs: Vec::new(),
            millis: started.elapsed().as_millis() as u64,
            cpu_ms: 0,
            memory_mb: 0,
            retries: 0,
            requests: source.counts().plus(&RequestCounts {
                put: partials.len() as u64,
                ..Default::default()
            }),
            deferred,
            gone,
            quarantined: Vec::new(),
            rejected: None,
            nulled_fields: 0,
            rescued_fields: 0,
            partials,
            late_rows: tally.late.load(Ordering::Relaxed),
            max_event_us: tally.max_event_us(),
            duplicates: 0,
            shard_reads: Vec::new(),
        })
    }

    /// A stateful read of `files` failed with `e`: the input at fault, if
    /// one of them does not read whole with the pinned schema (its first
    /// bad line or record), with what a stateful query allows, else `e`.
    pub(super) async fn unreadable_in_state(
        &self,
        access: &ScanAccess,
        batch: u64,
        files: &[&InputFile],
        e: Error,
    ) -> Error {
        if e.class() == crate::error::ErrorClass::Retryable {
            return e;
        }
        let Some(c) = self.culprit(access, files).await.filter(|c| c.unreadable) else {
            return e;
        };
        let advice = if self.pipeline.source.location.is_stream() {
            "its records cannot be changed, and a stateful query takes no on_bad_row policy \
             yet: read the source with a row-by-row pipeline that sets source.on_bad_row = \
             \"quarantine\" and run this query on that pipeline's sink"
        } else {
            "a stateful query takes no on_bad_row or on_bad_file policy yet: fix or replace \
             the file, then run again"
        };
        Error::Input {
            pipeline: self.pipeline.name.clone(),
            batch: Some(batch),
            key: c.key,
            message: format!("{}; {advice}", c.why),
        }
    }

    /// Check the task's files against the pinned schema before a stateful
    /// read: a file that does not read, or whose columns differ, refuses
    /// the task (a stateful query takes neither bad files nor drift yet);
    /// the keys of files gone since the plan.
    pub(super) async fn partial_gone(
        &self,
        access: &ScanAccess,
        batch: u64,
        files: &[InputFile],
    ) -> Result<Vec<String>> {
        let refs: Vec<&InputFile> = files.iter().collect();
        let scan = self.scan_session(access);
        let checked = self.check_drift(&scan, access, batch, &refs).await?;
        if let Some((f, reason)) = checked.unreadable.first() {
            return Err(self.unreadable(access, batch, f, reason).await);
        }
        if let Some((f, _)) = checked.adapted.first() {
            return Err(Error::Input {
                pipeline: self.pipeline.name.clone(),
                batch: Some(batch),
                key: f.key.clone(),
                message: "its columns differ from the schema, which a stateful query does not \
                          take yet (on_schema_change applies to row-by-row queries)"
                    .into(),
            });
        }
        Ok(checked.gone.iter().map(|f| f.key.clone()).collect())
    }

    /// The task's files as the table its query reads: through the
    /// event-time filter (late rows dropped and counted, or kept for the
    /// side output; windows assigned) when the query has event time.
    pub(super) fn event_time_input(
        &self,
        access: &ScanAccess,
        files: &[&InputFile],
        event: EventTime<'_>,
    ) -> Result<(Arc<dyn TableProvider>, Arc<EventTally>)> {
        let table = BatchTable::over(
            self.schema.clone(),
            Self::format(&self.pipeline),
            access.url.clone(),
            files
                .iter()
                .map(|f| (Self::object_meta(access, f), *f))
                .collect(),
            self.partitions,
        )
        .map_err(|e| self.sql_err(e))?;
        let side_output = event.watermark.is_some_and(|w| w.late_side_output);
        let tally = Arc::new(if side_output {
            EventTally::keeping_late()
        } else {
            EventTally::default()
        });
        let provider: Arc<dyn TableProvider> = match event.column {
            Some(c) => Arc::new(
                EventTimeTable::new(
                    Arc::new(table),
                    c,
                    event.window,
                    event.watermark.and(event.watermark_us),
                    tally.clone(),
                )
                .map_err(|e| self.sql_err(e))?
                .untimed_late(event.untimed_late),
            ),
            None => Arc::new(table),
        };
        Ok((provider, tally))
    }

    /// Plan the query in `ctx` (its table registered) and run its partial
    /// aggregate; session windows are merged within the task first, so the
    /// partials hold sessions, not rows.
    pub(super) async fn aggregate_partially(
        &self,
        ctx: &SessionContext,
        id: TaskId,
        q: &StatefulQuery,
    ) -> Result<Partials> {
        let exec = self.exec_err(id);
        let plan = ctx
            .sql(&q.sql)
            .await
            .map_err(exec)?
            .create_physical_plan()
            .await
            .map_err(exec)?;
        let staged = Staged::of(plan)
            .map_err(|e| self.sql_err(e))?
            .ok_or_else(|| self.sql_err("the query's aggregate was planned away"))?
            .with_window(q.window.as_ref());
        let partial = staged.partial().map_err(exec)?;
        let mut states = datafusion::physical_plan::collect(partial.clone(), ctx.task_ctx())
            .await
            .map_err(exec)?;
        if q.window.as_ref().is_some_and(|w| w.session) {
            let merged = staged.merge_sessions(states).map_err(exec)?;
            states = datafusion::physical_plan::collect(
                staged.reduce(merged).map_err(exec)?,
                ctx.task_ctx(),
            )
            .await
            .map_err(exec)?;
        }
        Ok(Partials {
            staged,
            plan: partial,
            states,
        })
    }

    /// Split the partial states into `n` state partitions by a stable hash
    /// of the group key and write each non-empty one to the checkpoint.
    /// `dedup`: written by the Dedup step of that partition (named for it),
    /// not by task `id.task`.
    pub(super) async fn write_partials(
        &self,
        checkpoint: &Checkpoint,
        id: TaskId,
        partial: &Partials,
        n: u32,
        dedup: Option<u32>,
    ) -> Result<Vec<PartialFile>> {
        let exec = self.exec_err(id);
        let keys = partial.staged.partition_columns().map_err(exec)?;
        let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); n as usize];
        for b in &partial.states {
            for (p, piece) in super::partition::split(b, &keys, n)
                .map_err(|e| self.sql_err(e))?
                .into_iter()
                .enumerate()
            {
                if piece.num_rows() > 0 {
                    parts[p].push(piece);
                }
            }
        }
        let mut partials = Vec::new();
        for (p, batches) in parts.into_iter().enumerate() {
            if batches.is_empty() {
                continue;
            }
            let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
            let bytes = partial.staged.write_state(&batches).map_err(exec)?;
            let key = match dedup {
                None => checkpoint.put_partial(id, p as u32, bytes).await?,
                Some(q) => {
                    let key =
                        crate::paths::checkpoint::dedup_partial(id.batch, p as u32, q, id.epoch);
                    checkpoint
                        .store()
                        .put(&key, bytes.into(), crate::storage::PutMode::Overwrite)
                        .await?;
                    key
                }
            };
            partials.push(PartialFile {
                partition: p as u32,
                key,
                rows,
            });
        }
        Ok(partials)
    }
}
