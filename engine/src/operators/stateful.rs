//! Which GROUP BY queries a pipeline may run as a stateful query, checked
//! when the pipeline is checked: one aggregation (optionally over one
//! event-time window, Spark's `window(...)`), with aggregates whose partial
//! states merge, in an output mode that fits, with a `[watermark]` where
//! windows must close. Refusals name what is wrong and what to write.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::LogicalPlan;

use super::SqlOperator;
use super::aggregate::{Staged, session};
use super::event_time::{EventTally, EventTimeTable};
use super::scan::BatchTable;
use super::window::{WINDOW_END, WINDOW_START, WindowSpec, rewrite};
use crate::checkpoint::{InputFile, TaskPlan};
use crate::error::Result;
use crate::pipeline::{OutputMode, Watermark};
use crate::storage::ScanAccess;

/// A pipeline's query as a stateful query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatefulQuery {
    /// The query rewritten to read the window columns.
    pub sql: String,
    /// Its event-time window, if any.
    pub window: Option<WindowSpec>,
    /// How results reach the sink.
    pub mode: OutputMode,
    /// Event time, if declared.
    pub watermark: Option<Watermark>,
}

impl StatefulQuery {
    /// A hash of everything the state depends on: the rewritten SQL (the
    /// aggregate and its keys), the window, the watermark column, the
    /// output mode and the number of state partitions.
    pub(crate) fn shape(&self, partitions: u32) -> String {
        let text = format!(
            "{}|{:?}|{:?}|{:?}|{partitions}",
            self.sql,
            self.window,
            self.watermark.as_ref().map(|w| &w.column),
            self.mode
        );
        format!("{:016x}", crate::hash::fnv1a(text.as_bytes()))
    }
}

impl SqlOperator {
    /// The input schema a stateful query reads: the source's, plus the
    /// window columns (typed as the event-time column) when it has a window.
    pub(crate) fn windowed_schema(&self, window: Option<&WindowSpec>) -> Result<SchemaRef> {
        let Some(w) = window else {
            return Ok(self.schema.clone());
        };
        // Windows are assigned as the source is read, before the query's
        // own expressions: the column must be a source column, typed as a
        // timestamp by the source schema (a cast in the query, in a derived
        // table or inside window(...), is not seen there).
        let field = self.schema.field_with_name(&w.column).map_err(|_| {
            self.sql_err(format!(
                "window({}, ...): the source has no column {}: window(...) takes a timestamp \
                 column of the source by name (a cast or an expression there, or a column of \
                 a derived table, is not supported); type the source column as timestamp with \
                 source.schema_hints (or in source.schema)",
                w.column, w.column
            ))
        })?;
        let DataType::Timestamp(_, _) = field.data_type() else {
            return Err(self.sql_err(format!(
                "window({}, ...): the column is {}, not a timestamp: type it as timestamp \
                 with source.schema_hints = {{ {} = \"timestamp\" }} (or in source.schema; \
                 a cast in the query is not seen where windows are assigned)",
                w.column,
                crate::pipeline::types::type_name(field.data_type()),
                w.column
            )));
        };
        let mut fields: Vec<Field> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(WINDOW_START, field.data_type().clone(), false));
        fields.push(Field::new(WINDOW_END, field.data_type().clone(), false));
        Ok(Arc::new(Schema::new(fields)))
    }

    /// The pipeline's query as a stateful query, for a pipeline that passed
    /// its check ([`Self::analyse_stateful`]): one with neither
    /// `[watermark]` nor a `sink.mode` other than append is row by row (the
    /// check refuses a GROUP BY there), so the steps of a row-by-row
    /// pipeline (every task, plan and commit) do not parse and plan its
    /// query again to find that out.
    pub(crate) async fn stateful(&self) -> Result<Option<StatefulQuery>> {
        let p = &self.pipeline;
        if p.watermark.is_none() && p.output_mode == OutputMode::Append {
            return Ok(None);
        }
        self.analyse_stateful().await
    }

    /// The pipeline's query as a stateful query, if it aggregates (`None`:
    /// a row-by-row query). Refused, by name: anything that does not run in
    /// stages, a DISTINCT or ordered aggregate, append mode without a
    /// window, a window without `[watermark]` in append mode, a watermark on
    /// another column than the window's.
    pub(crate) async fn analyse_stateful(&self) -> Result<Option<StatefulQuery>> {
        let p = &self.pipeline;
        let w = rewrite(&p.sql).map_err(|e| self.sql_err(e))?;
        let schema = self.windowed_schema(w.window.as_ref())?;
        let ctx = session(1);
        let empty = MemTable::try_new(schema, vec![vec![]]).map_err(|e| self.sql_err(e))?;
        ctx.register_table(p.source.table.as_str(), Arc::new(empty))
            .map_err(|e| self.sql_err(e))?;
        let plan = ctx
            .state()
            .create_logical_plan(&w.sql)
            .await
            .map_err(|e| self.sql_err(format!("{e}\nfix query.sql in the pipeline file")))?;
        // Aggregations of the main query (one over a subquery that does not
        // read the input is the same in every batch).
        let mut aggregates = 0;
        datafusion::common::tree_node::TreeNode::apply(&plan, |n| {
            if matches!(n, LogicalPlan::Aggregate(_)) {
                aggregates += 1;
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .map_err(|e| self.sql_err(e))?;
        if aggregates == 0 {
            return Ok(None);
        }
        if let Some(reason) =
            super::classify::not_stateful_equivalent(&plan, &self.pipeline.source.table)
                .map_err(|e| self.sql_err(format!("cannot inspect the query's plan: {e}")))?
        {
            return Err(self.sql_err(reason));
        }
        let physical = ctx
            .state()
            .create_physical_plan(&plan)
            .await
            .map_err(|e| self.sql_err(format!("{e}\nfix query.sql in the pipeline file")))?;
        let staged = Staged::of(physical)
            .map_err(|e| self.sql_err(e))?
            .ok_or_else(|| self.sql_err("the query's aggregate was planned away"))?;
        if let Some(reason) = staged.refusal() {
            return Err(self.sql_err(reason));
        }
        self.check_bad_input_policies()?;
        let q = StatefulQuery {
            sql: w.sql,
            window: w.window,
            mode: p.output_mode,
            watermark: p.watermark.clone(),
        };
        self.check_output_mode(&q)?;
        Ok(Some(q))
    }

    /// Refuses the bad-input settings on a stateful query: they apply to
    /// row-by-row queries for now.
    fn check_bad_input_policies(&self) -> Result<()> {
        let s = &self.pipeline.source;
        if s.on_bad_file != crate::pipeline::BadFilePolicy::Fail
            || s.on_bad_row != crate::pipeline::BadRowPolicy::Fail
            || s.on_schema_change != crate::pipeline::SchemaChangePolicy::Fail
            || s.corrupt_record
        {
            return Err(self.sql_err(
                "on_bad_file, on_bad_row, on_schema_change and corrupt_record apply to \
                 row-by-row queries for now: a stateful (GROUP BY) query fails its batch on bad \
                 input; remove them",
            ));
        }
        Ok(())
    }

    /// Refuses an output mode that does not fit `q`'s window and watermark:
    /// append without a window, or with one but no `[watermark]`; a session
    /// window in update mode; a watermark on another column than the
    /// window's.
    fn check_output_mode(&self, q: &StatefulQuery) -> Result<()> {
        match (&q.window, q.mode, &q.watermark) {
            (None, OutputMode::Append, _) => Err(self.sql_err(
                "sink.mode = \"append\" emits each group once, when it can no longer \
                 change, which only an event-time window closed by the watermark knows: \
                 group by window(<timestamp column>, '<size>') with [watermark], or set \
                 sink.mode = \"update\" (changed groups per batch) or \"complete\" (the \
                 whole result per batch)",
            )),
            (Some(w), OutputMode::Append, None) => Err(self.sql_err(format!(
                "window({}, ...) in append mode needs [watermark] (column = \"{}\", delay = \
                 \"10 minutes\"): without it no window ever closes",
                w.column, w.column
            ))),
            (Some(w), OutputMode::Update, _) if w.session => Err(self.sql_err(
                "session_window(...) in update mode is not supported (as in Spark: a \
                 session's bounds change as it merges, so an update could not say which \
                 earlier row it replaces): use sink.mode = \"append\" with [watermark], or \
                 \"complete\"",
            )),
            (Some(w), _, Some(m)) if m.column != w.column => Err(self.sql_err(format!(
                "[watermark] column = \"{}\" but the window is over {}: the watermark \
                 closes windows of its own column, so name the window's",
                m.column, w.column
            ))),
            _ => Ok(()),
        }
    }
}

/// A task's rows aggregated partially: the query's aggregate in stages,
/// the partial plan that read them, and the partial states it gave.
struct PartialStates {
    staged: Staged,
    partial: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    states: Vec<RecordBatch>,
}

/// The steps of `run_partial`, below.
impl SqlOperator {
    /// Refuses a task's file that cannot be read, or whose columns differ
    /// from the schema (a stateful query does not take schema changes yet);
    /// files deleted since they were planned join `gone`.
    async fn check_stateful_inputs(
        &self,
        access: &ScanAccess,
        batch: u64,
        files: &[InputFile],
        gone: &mut Vec<String>,
    ) -> Result<()> {
        let refs: Vec<&crate::checkpoint::InputFile> = files.iter().collect();
        let scan = self.scan_session(access);
        let checked = self.check_drift(&scan, access, batch, &refs).await?;
        if let Some((f, reason)) = checked.unreadable.first() {
            return Err(self.unreadable(access, batch, f, reason).await);
        }
        if let Some((f, _)) = checked.adapted.first() {
            return Err(crate::error::Error::Input {
                pipeline: self.pipeline.name.clone(),
                batch,
                key: f.key.clone(),
                message: "its columns differ from the schema, which a stateful query does not \
                          take yet (on_schema_change applies to row-by-row queries)"
                    .into(),
            });
        }
        gone.extend(checked.gone.iter().map(|f| f.key.clone()));
        Ok(())
    }

    /// The table the task's `files` are read through: a scan of them, with
    /// late rows dropped and windows assigned (counted in `tally`) when the
    /// query has an event-time column.
    fn event_time_provider(
        &self,
        access: &ScanAccess,
        files: &[&InputFile],
        q: &StatefulQuery,
        state: &TaskState,
        tally: &Arc<EventTally>,
    ) -> Result<Arc<dyn datafusion::datasource::TableProvider>> {
        let table = BatchTable {
            schema: self.schema.clone(),
            format: Self::format(&self.pipeline),
            url: access.url.clone(),
            files: files
                .iter()
                .map(|f| {
                    datafusion::datasource::listing::PartitionedFile::new_from_meta(
                        Self::object_meta(access, f),
                    )
                })
                .collect(),
            partitions: self.partitions,
        };
        let column = q
            .watermark
            .as_ref()
            .map(|w| w.column.clone())
            .or_else(|| q.window.as_ref().map(|w| w.column.clone()));
        let provider: Arc<dyn datafusion::datasource::TableProvider> = match &column {
            Some(c) => Arc::new(
                EventTimeTable::new(
                    Arc::new(table),
                    c,
                    q.window.clone(),
                    q.watermark.as_ref().and(state.watermark_us),
                    tally.clone(),
                )
                .map_err(|e| self.sql_err(e))?,
            ),
            None => Arc::new(table),
        };
        Ok(provider)
    }

    /// Aggregate the task's rows, read through `provider`, partially; a
    /// session window's sessions merged first, so the partials hold
    /// sessions, not rows.
    async fn partial_states(
        &self,
        access: &ScanAccess,
        provider: Arc<dyn datafusion::datasource::TableProvider>,
        q: &StatefulQuery,
        batch: u64,
        task: &TaskPlan,
    ) -> Result<PartialStates> {
        let ctx = session(self.partitions);
        ctx.register_object_store(access.url.as_ref(), access.store.clone());
        ctx.register_table(self.pipeline.source.table.as_str(), provider)
            .map_err(|e| self.sql_err(e))?;
        let exec = self.exec_err(batch, task);
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
            .with_sessions(q.window.as_ref().is_some_and(|w| w.session));
        let partial = staged.partial().map_err(exec)?;
        let mut states = datafusion::physical_plan::collect(partial.clone(), ctx.task_ctx())
            .await
            .map_err(exec)?;
        if q.window.as_ref().is_some_and(|w| w.session) {
            // One window per row so far: merge the task's own sessions
            // first, so the partials it writes hold sessions, not rows.
            let merged = staged.merge_sessions(states).map_err(exec)?;
            states = datafusion::physical_plan::collect(
                staged.reduce(merged).map_err(exec)?,
                ctx.task_ctx(),
            )
            .await
            .map_err(exec)?;
        }
        Ok(PartialStates {
            staged,
            partial,
            states,
        })
    }

    /// `states` split into the state `partitions` by a stable hash of their
    /// group key; each part holds its non-empty pieces.
    fn partitioned(
        &self,
        staged: &Staged,
        states: &[RecordBatch],
        partitions: u32,
        batch: u64,
        task: &TaskPlan,
    ) -> Result<Vec<Vec<RecordBatch>>> {
        let exec = self.exec_err(batch, task);
        let keys = staged.partition_columns().map_err(exec)?;
        let n = partitions.max(1);
        let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); n as usize];
        for b in states {
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
        Ok(parts)
    }

    /// Write each non-empty part of `parts` as the task's partial state file
    /// of its partition (`work/N/partials/p=P/task-T-eE.arrow`).
    async fn write_partials(
        &self,
        checkpoint: &dyn crate::storage::Store,
        staged: &Staged,
        parts: Vec<Vec<RecordBatch>>,
        batch: u64,
        task: &TaskPlan,
        epoch: u64,
    ) -> Result<Vec<super::PartialFile>> {
        let exec = self.exec_err(batch, task);
        let mut partials = Vec::new();
        for (p, batches) in parts.into_iter().enumerate() {
            if batches.is_empty() {
                continue;
            }
            let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
            let key = crate::paths::checkpoint::partial(batch, p as u32, task.task, epoch);
            let bytes = staged.write_state(&batches).map_err(exec)?;
            checkpoint
                .put(&key, bytes.into(), crate::storage::PutMode::Overwrite)
                .await?;
            partials.push(super::PartialFile {
                partition: p as u32,
                key,
                rows,
            });
        }
        Ok(partials)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Pipeline;

    fn pipeline(sql: &str, extra: &str) -> Pipeline {
        let toml = format!(
            r#"name = "w"
[source]
uri = "in"
format = "parquet"
table = "trips"
[query]
sql = '''{sql}'''
{extra}
[checkpoint]
uri = "ck"
"#
        );
        let toml = if toml.contains("[sink]") {
            toml
        } else {
            toml.replace("[checkpoint]", "[sink]\nuri = \"out\"\n[checkpoint]")
        };
        Pipeline::parse(&toml, "w.toml", std::path::Path::new("/tmp")).unwrap()
    }

    fn op(p: Pipeline) -> SqlOperator {
        use datafusion::arrow::datatypes::TimeUnit;
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "tpep_pickup_datetime",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
            Field::new("PULocationID", DataType::Int64, true),
            Field::new("total_amount", DataType::Float64, true),
            Field::new("trip_distance", DataType::Float64, true),
            Field::new("store_and_fwd_flag", DataType::Utf8, true),
        ]));
        SqlOperator::new(Arc::new(p), schema)
    }

    const WM: &str = "[watermark]\ncolumn = \"tpep_pickup_datetime\"\ndelay = \"10 minutes\"";

    /// The issue's queries, as written.
    #[tokio::test]
    async fn the_issues_queries_are_accepted() {
        let tumbling = r#"SELECT window.start AS window_start, window.end AS window_end, "PULocationID", count(*) AS trips, sum(total_amount) AS revenue, avg(trip_distance) AS avg_distance FROM trips GROUP BY window(tpep_pickup_datetime, '15 minutes'), "PULocationID""#;
        let q = op(pipeline(tumbling, WM))
            .analyse_stateful()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(q.mode, OutputMode::Append);
        assert_eq!(q.window.unwrap().size_us, 15 * 60_000_000);
        let sliding = "SELECT window.start, window.end, count(*) AS n FROM trips \
                       WHERE total_amount > 0 GROUP BY window(tpep_pickup_datetime, '10 minutes', '5 minutes') \
                       HAVING count(*) > 1";
        assert!(
            op(pipeline(sliding, WM))
                .analyse_stateful()
                .await
                .unwrap()
                .is_some()
        );
        let per_zone = r#"SELECT "PULocationID", count(*) AS trips, sum(total_amount) / count(*) AS avg_fare FROM trips GROUP BY "PULocationID""#;
        for mode in ["update", "complete"] {
            let p = pipeline(
                per_zone,
                &format!("[sink]\nuri = \"out\"\nmode = \"{mode}\""),
            );
            assert!(op(p).analyse_stateful().await.unwrap().is_some(), "{mode}");
        }
        let row_by_row = op(pipeline("SELECT * FROM trips WHERE total_amount > 0", ""));
        assert_eq!(row_by_row.analyse_stateful().await.unwrap(), None);
    }

    /// Each misuse the issue lists, refused with what to write.
    #[tokio::test]
    async fn misuses_are_refused_by_name() {
        let window = "SELECT window.start, count(*) FROM trips GROUP BY window(tpep_pickup_datetime, '15 minutes')";
        let zone = r#"SELECT "PULocationID", count(*) FROM trips GROUP BY "PULocationID""#;
        let update = "[sink]\nuri = \"out\"\nmode = \"update\"";
        for (sql, extra, says) in [
            (window, "", "needs [watermark]"),
            (zone, "", "sink.mode = \"append\""),
            (
                "SELECT count(*) FROM trips GROUP BY window(tpep_pickup_datetime, '1 hour'), window(tpep_pickup_datetime, '2 hours')",
                WM,
                "more than one window",
            ),
            (
                r#"SELECT count(*) FROM trips GROUP BY window("PULocationID", '1 hour')"#,
                WM,
                "not a timestamp",
            ),
            (
                "SELECT count(*) FROM trips GROUP BY session_window(tpep_pickup_datetime, '5 minutes')",
                update,
                "session_window(...) in update mode",
            ),
            (
                r#"SELECT "PULocationID", count(DISTINCT store_and_fwd_flag) FROM trips GROUP BY "PULocationID""#,
                update,
                "DISTINCT",
            ),
            (
                r#"SELECT "PULocationID", count(*) FROM trips GROUP BY "PULocationID" LIMIT 3"#,
                update,
                "LIMIT",
            ),
            (
                r#"SELECT "PULocationID", count(*) OVER () FROM trips GROUP BY "PULocationID""#,
                update,
                "OVER",
            ),
            (
                r#"SELECT a."PULocationID", count(*) FROM trips a JOIN trips b ON a."PULocationID" = b."PULocationID" GROUP BY a."PULocationID""#,
                update,
                "join",
            ),
        ] {
            let e = op(pipeline(sql, extra))
                .analyse_stateful()
                .await
                .map(|q| format!("accepted: {q:?}"))
                .unwrap_or_else(|e| e.to_string());
            assert!(e.contains(says), "{sql}: want \"{says}\" in: {e}");
        }
        let other = "[watermark]\ncolumn = \"other\"\ndelay = \"1 minute\"";
        let e = op(pipeline(window, other))
            .analyse_stateful()
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("closes windows of its own column"), "{e}");
    }
}

/// What a stateful task reads with, from the last commit.
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskState {
    /// The watermark in force: rows at or below it are late.
    pub watermark_us: Option<i64>,
    /// State partitions.
    pub partitions: u32,
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
            .with_sessions(q.window.as_ref().is_some_and(|w| w.session)))
    }

    /// Run one task of a stateful query: read the task's files (late rows
    /// dropped, windows assigned), aggregate them partially, and write the
    /// partial states to the checkpoint, split into the state partitions
    /// by a stable hash of the group key
    /// (`work/N/partials/p=P/task-T-eE.arrow`). Nothing goes to the sink:
    /// the merges of the batch write it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run_partial(
        &self,
        source: &dyn crate::storage::Store,
        sink: &crate::sinks::ParquetSink,
        checkpoint: &dyn crate::storage::Store,
        epoch: u64,
        batch: u64,
        inputs: &[crate::checkpoint::InputFile],
        task: &crate::checkpoint::TaskPlan,
        q: &StatefulQuery,
        state: &TaskState,
    ) -> Result<super::TaskResult> {
        let started = std::time::Instant::now();
        let super::Readable {
            access,
            files,
            deferred,
            mut gone,
        } = self.readable(source, batch, inputs, task).await?;
        self.check_stateful_inputs(&access, batch, &files, &mut gone)
            .await?;
        let files: Vec<&crate::checkpoint::InputFile> =
            files.iter().filter(|f| !gone.contains(&f.key)).collect();
        let side_output = q.watermark.as_ref().is_some_and(|w| w.late_side_output);
        let tally = Arc::new(if side_output {
            EventTally::keeping_late()
        } else {
            EventTally::default()
        });
        let provider = self.event_time_provider(&access, &files, q, state, &tally)?;
        let PartialStates {
            staged,
            partial,
            states,
        } = self
            .partial_states(&access, provider, q, batch, task)
            .await?;
        let parts = self.partitioned(&staged, &states, state.partitions, batch, task)?;
        let partials = self
            .write_partials(checkpoint, &staged, parts, batch, task, epoch)
            .await?;
        let late: Vec<datafusion::arrow::record_batch::RecordBatch> = tally
            .late_rows
            .as_ref()
            .map(|m| std::mem::take(&mut *m.lock().expect("not poisoned")))
            .unwrap_or_default();
        let late_file = if late.is_empty() {
            None
        } else {
            Some(
                sink.write_late(epoch, batch, task.task, self.schema.clone(), &late)
                    .await?,
            )
        };
        Ok(super::TaskResult {
            late_file,
            task: task.task,
            rows_in: super::leaf_rows(&partial),
            rows_out: 0,
            bytes_read: files.iter().map(|f| f.size).sum(),
            outputs: Vec::new(),
            millis: started.elapsed().as_millis() as u64,
            memory_mb: 0,
            retries: 0,
            requests: source.counts().plus(&crate::storage::RequestCounts {
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
            late_rows: tally.late.load(std::sync::atomic::Ordering::Relaxed),
            max_event_us: tally.max_event_us(),
        })
    }
}
