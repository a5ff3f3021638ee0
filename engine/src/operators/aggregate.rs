//! Aggregation in stages whose intermediate results merge: how a stateful
//! (GROUP BY) query runs across operator tasks and batches.
//!
//! A query's aggregate is planned once by DataFusion; its group and
//! aggregate expressions are then run in three modes: `Partial` over a
//! task's rows (one row per group holding each accumulator's state fields,
//! such as `avg`'s count and sum), `PartialReduce` over states (states
//! merged into states: last batch's state plus this batch's partials), and
//! `Final` over states, with whatever the query does above the aggregate
//! (HAVING, the SELECT's expressions) put back on top. States travel as
//! Arrow IPC, which keeps their exact types (Parquet read-back would turn
//! Utf8 into Utf8View).

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::prelude::{SessionConfig, SessionContext};

/// A session for planning and running a query in stages, with
/// `partitions` partitions. Two of DataFusion's defaults break staging:
/// the `aggregate_statistics` rule answers `count(*)`, `min` and `max` from
/// the input's statistics, which are one batch's, and removes the
/// aggregate (its answer would be that batch's, not a state to merge); and
/// the probe that stops a partial aggregate from aggregating when most rows
/// are distinct groups would emit one state row per input row.
pub(crate) fn session(partitions: usize) -> SessionContext {
    let config = SessionConfig::new()
        .with_target_partitions(partitions)
        .with_information_schema(false)
        .set(
            "datafusion.execution.skip_partial_aggregation_probe_ratio_threshold",
            &datafusion::scalar::ScalarValue::Float64(Some(2.0)),
        );
    let defaults = SessionStateBuilder::new().with_default_features().build();
    let rules = defaults
        .physical_optimizers()
        .iter()
        .filter(|r| r.name() != "aggregate_statistics")
        .cloned()
        .collect();
    let state = SessionStateBuilder::new_from_existing(defaults)
        .with_config(config)
        .with_physical_optimizer_rules(rules)
        .build();
    SessionContext::new_with_state(state)
}

/// The aggregate of a planned query, run in stages.
#[derive(Debug, Clone)]
pub(crate) struct Staged {
    /// The query as planned.
    plan: Arc<dyn ExecutionPlan>,
    /// Its top aggregate node (the one whose output the rest of the plan
    /// reads), as it sits in `plan`.
    top: Arc<dyn ExecutionPlan>,
    /// The aggregate that reads the raw rows (`Partial` or `Single`): its
    /// expressions and input are what the stages run.
    first: AggregateExec,
    /// The window columns are session windows: merged per key wherever
    /// states meet ([`Self::merge_sessions`]).
    sessions: bool,
    /// The window columns are stagger windows: cut per key in the merge
    /// ([`Self::stagger_windows`]).
    stagger: bool,
}

impl Staged {
    /// The staged form of `plan`'s aggregate; `None` without one. A query
    /// with more than one aggregation (an aggregate over an aggregate) is
    /// refused by name.
    pub(crate) fn of(plan: Arc<dyn ExecutionPlan>) -> std::result::Result<Option<Staged>, String> {
        let mut found: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        collect_aggregates(&plan, &mut found);
        let aggregate = |n: &Arc<dyn ExecutionPlan>| {
            n.downcast_ref::<AggregateExec>()
                .expect("collected as an aggregate")
                .clone()
        };
        let Some(top) = found.first().cloned() else {
            return Ok(None);
        };
        // A Final aggregate reads its Partial; a Single one the rows.
        let (first, stages) = match aggregate(&top).mode() {
            AggregateMode::Single | AggregateMode::SinglePartitioned => (aggregate(&top), 1),
            AggregateMode::Final | AggregateMode::FinalPartitioned => match found.get(1) {
                Some(p) if *aggregate(p).mode() == AggregateMode::Partial => (aggregate(p), 2),
                _ => return Err(shape(&found)),
            },
            _ => return Err(shape(&found)),
        };
        if found.len() > stages {
            return Err(
                "the query aggregates more than once (an aggregate over an aggregate, or \
                 DISTINCT with GROUP BY): one GROUP BY per query"
                    .into(),
            );
        }
        Ok(Some(Staged {
            plan,
            top,
            first,
            sessions: false,
            stagger: false,
        }))
    }

    /// Why an aggregate of this query cannot run in stages, if one cannot:
    /// a DISTINCT aggregate or one that depends on the order of its input
    /// (`array_agg(x ORDER BY y)`, ordered-set aggregates), named.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.first.aggr_expr().iter().find_map(|a| {
            if a.is_distinct() {
                Some(format!(
                    "{}: a DISTINCT aggregate is not supported in a stateful query (its state \
                     is every distinct value); use approx_distinct(...) or group by the column",
                    a.name()
                ))
            } else if !a.order_bys().is_empty() {
                Some(format!(
                    "{}: an aggregate over ordered input is not supported in a stateful query \
                     (batches arrive in any order)",
                    a.name()
                ))
            } else {
                None
            }
        })
    }

    /// The states' group-key columns (the first ones), by index.
    pub(crate) fn key_columns(&self) -> Vec<usize> {
        (0..self.first.group_expr().expr().len()).collect()
    }

    /// Its window columns are `window`'s kind: session windows (see
    /// [`Self::merge_sessions`]) or stagger windows (see
    /// [`Self::stagger_windows`]).
    pub(crate) fn with_window(mut self, window: Option<&super::window::WindowSpec>) -> Staged {
        self.sessions = window.is_some_and(|w| w.session);
        self.stagger = window.is_some_and(|w| w.stagger);
        self
    }

    /// Its windows are stagger windows.
    pub(crate) fn staggered(&self) -> bool {
        self.stagger
    }

    /// Stagger windows: `states` (one row per key and event time) with
    /// each row's window replaced by the stagger window it falls in (see
    /// [`super::window::stagger_windows`]). Other queries: as they are.
    pub(crate) fn stagger_windows(&self, states: &RecordBatch) -> Result<RecordBatch> {
        let Some((start, end)) = self.window_columns()?.filter(|_| self.stagger) else {
            return Ok(states.clone());
        };
        let keys = self.partition_columns()?;
        Ok(super::window::stagger_windows(states, &keys, start, end)?)
    }

    /// The window columns' indices in the state schema, if it has them.
    fn window_columns(&self) -> Result<Option<(usize, usize)>> {
        use super::window::{WINDOW_END, WINDOW_START};
        let schema = self.state_schema()?;
        Ok(schema
            .index_of(WINDOW_START)
            .ok()
            .zip(schema.index_of(WINDOW_END).ok()))
    }

    /// What states are hash-partitioned by: the group keys, without the
    /// window columns when those are session or stagger windows (their
    /// bounds change as states meet, so the key alone must say where it
    /// lives).
    pub(crate) fn partition_columns(&self) -> Result<Vec<usize>> {
        let keys = self.key_columns();
        match self.window_columns()? {
            Some((start, end)) if self.sessions || self.stagger => Ok(keys
                .into_iter()
                .filter(|k| *k != start && *k != end)
                .collect()),
            _ => Ok(keys),
        }
    }

    /// Session windows: `states` with the windows of each key that touch
    /// merged into one session (see [`super::window::merge_sessions`]), so
    /// a `PartialReduce` merges their states. Other queries: as they are.
    pub(crate) fn merge_sessions(&self, states: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let Some((start, end)) = self.window_columns()?.filter(|_| self.sessions) else {
            return Ok(states);
        };
        let schema = self.state_schema()?;
        let all = datafusion::arrow::compute::concat_batches(&schema, &states)?;
        let keys = self.partition_columns()?;
        Ok(vec![super::window::merge_sessions(
            &all, &keys, start, end,
        )?])
    }

    /// The schema of the states (group columns, then each aggregate's state
    /// fields).
    pub(crate) fn state_schema(&self) -> Result<SchemaRef> {
        Ok(self.partial()?.schema())
    }

    /// `Partial` over the aggregate's own input: the rows of one task.
    pub(crate) fn partial(&self) -> Result<Arc<dyn ExecutionPlan>> {
        let f = &self.first;
        Ok(Arc::new(AggregateExec::try_new(
            AggregateMode::Partial,
            f.group_expr().clone(),
            f.aggr_expr().to_vec(),
            f.filter_expr().to_vec(),
            f.input().clone(),
            f.input_schema(),
        )?))
    }

    /// `mode` (`PartialReduce` or `Final`) over `states`.
    fn over_states(
        &self,
        mode: AggregateMode,
        states: Vec<RecordBatch>,
    ) -> Result<Arc<AggregateExec>> {
        let schema = self.state_schema()?;
        let input = MemorySourceConfig::try_new_exec(&[states], schema, None)?;
        let f = &self.first;
        Ok(Arc::new(AggregateExec::try_new(
            mode,
            f.group_expr().as_final(),
            f.aggr_expr().to_vec(),
            // Filters (`FILTER (WHERE ...)`) applied in the partial stage.
            vec![None; f.aggr_expr().len()],
            input,
            f.input_schema(),
        )?))
    }

    /// States merged into states, one row per group.
    pub(crate) fn reduce(&self, states: Vec<RecordBatch>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self.over_states(AggregateMode::PartialReduce, states)?)
    }

    /// States merged and finished, with the query's plan above the
    /// aggregate (HAVING, the SELECT's expressions) over them.
    pub(crate) fn finish(&self, states: Vec<RecordBatch>) -> Result<Arc<dyn ExecutionPlan>> {
        let last = self.over_states(AggregateMode::Final, states)?;
        if last.schema() != self.top.schema() {
            return Err(DataFusionError::Internal(format!(
                "the final aggregate's schema {:?} is not the planned one {:?}",
                last.schema(),
                self.top.schema()
            )));
        }
        let top = self.top.clone();
        let replaced = self.plan.clone().transform_down(|node| {
            Ok(if Arc::ptr_eq(&node, &top) {
                Transformed::yes(last.clone() as Arc<dyn ExecutionPlan>)
            } else {
                Transformed::no(node)
            })
        })?;
        Ok(replaced.data)
    }
}

fn shape(found: &[Arc<dyn ExecutionPlan>]) -> String {
    let modes: Vec<String> = found
        .iter()
        .filter_map(|n| n.downcast_ref::<AggregateExec>())
        .map(|a| format!("{:?}", a.mode()))
        .collect();
    format!(
        "the query's aggregate was planned in a shape Sluice cannot run in stages \
         (aggregate modes, top down: {})",
        modes.join(", ")
    )
}

/// The aggregate nodes of `plan`, top-down.
fn collect_aggregates(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<Arc<dyn ExecutionPlan>>) {
    if plan.is::<AggregateExec>() {
        out.push(plan.clone());
    }
    for c in plan.children() {
        collect_aggregates(c, out);
    }
}

/// Schema metadata of a state file: the aggregate it holds states of.
const STATE_AGGREGATE: &str = "sluice.state.aggregate";
/// Schema metadata of a state file: the DataFusion that wrote it.
const STATE_DATAFUSION: &str = "sluice.state.datafusion";

impl Staged {
    /// The aggregate as text: its group keys and aggregate functions with
    /// their arguments. A state written for another one cannot be merged.
    pub(crate) fn signature(&self) -> String {
        let f = &self.first;
        let keys: Vec<String> = f
            .group_expr()
            .expr()
            .iter()
            .map(|(e, name)| format!("{name}={e}"))
            .collect();
        let aggs: Vec<String> = f.aggr_expr().iter().map(|a| a.name().to_string()).collect();
        format!("GROUP BY {} AGGREGATE {}", keys.join(", "), aggs.join(", "))
    }

    /// `states` as a state file: Arrow IPC whose schema records the
    /// aggregate and the DataFusion version.
    pub(crate) fn write_state(&self, states: &[RecordBatch]) -> Result<Vec<u8>> {
        let schema = self.state_schema()?;
        let mut meta = schema.metadata().clone();
        meta.insert(STATE_AGGREGATE.into(), self.signature());
        meta.insert(
            STATE_DATAFUSION.into(),
            datafusion::DATAFUSION_VERSION.into(),
        );
        let schema = Arc::new(schema.as_ref().clone().with_metadata(meta));
        let batches = states
            .iter()
            .map(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        to_ipc(&schema, &batches)
    }

    /// The states of a state file (`key` names it in errors). A file
    /// written for another aggregate, or whose state columns are not this
    /// query's (another DataFusion's accumulators), is refused: merging it
    /// would give wrong answers.
    pub(crate) fn read_state(
        &self,
        key: &str,
        bytes: &[u8],
    ) -> std::result::Result<Vec<RecordBatch>, String> {
        let r = StreamReader::try_new(std::io::Cursor::new(bytes), None)
            .map_err(|e| format!("state {key} is not Arrow IPC: {e}"))?;
        let found = r.schema();
        let meta = found.metadata();
        let written = meta.get(STATE_AGGREGATE).cloned().unwrap_or_default();
        let by = meta.get(STATE_DATAFUSION).cloned().unwrap_or_default();
        let want = self.state_schema().map_err(|e| e.to_string())?;
        let fields_match = found.fields().len() == want.fields().len()
            && found
                .fields()
                .iter()
                .zip(want.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if written != self.signature() || !fields_match {
            return Err(format!(
                "state {key} was written for another aggregate or by another DataFusion \
                 ({written}, DataFusion {by}; this query: {}, DataFusion {}): merging it would \
                 give wrong answers. Restore the query, or run `sluice reset` on the pipeline \
                 file to start the state over",
                self.signature(),
                datafusion::DATAFUSION_VERSION
            ));
        }
        let want = Arc::new(want.as_ref().clone());
        r.map(|b| {
            b.and_then(|b| RecordBatch::try_new(want.clone(), b.columns().to_vec()))
                .map_err(|e| format!("state {key}: {e}"))
        })
        .collect()
    }
}

/// States as Arrow IPC (stream format).
pub(crate) fn to_ipc(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new(&mut out, schema)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()?;
    drop(w);
    Ok(out)
}

/// States read back from [`to_ipc`]'s bytes.
pub(crate) fn from_ipc(bytes: &[u8]) -> Result<Vec<RecordBatch>> {
    let r = StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    Ok(r.collect::<std::result::Result<Vec<_>, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::physical_plan::collect;
    use proptest::prelude::*;

    /// count(*), count(col), sum, min, max, avg, a filter before and HAVING
    /// and an expression over aggregates after the GROUP BY; a null key.
    const SQL: &str = "SELECT k, count(*) AS c, count(x) AS cx, sum(n) AS s, min(x) AS mn, \
                       max(n) AS mx, avg(x) AS a, sum(x) / count(*) AS per FROM t WHERE n <> 3 \
                       GROUP BY k HAVING count(*) > 1";

    type Row = (Option<u8>, Option<i8>, i64);

    fn batch(rows: &[Row]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("x", DataType::Float64, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let k: StringArray = rows
            .iter()
            .map(|r| r.0.map(|k| ["a", "b", "c"][k as usize % 3]))
            .collect();
        // Multiples of 0.25: every sum is exact, whatever the order.
        let x: Float64Array = rows.iter().map(|r| r.1.map(|x| x as f64 / 4.0)).collect();
        let n: Int64Array = rows.iter().map(|r| Some(r.2)).collect();
        RecordBatch::try_new(schema, vec![Arc::new(k), Arc::new(x), Arc::new(n)]).unwrap()
    }

    use crate::operators::testing::render;

    async fn planned(rows: &[Row], partitions: usize) -> (SessionContext, Arc<dyn ExecutionPlan>) {
        planned_sql(rows, partitions, SQL).await
    }

    async fn planned_sql(
        rows: &[Row],
        partitions: usize,
        sql: &str,
    ) -> (SessionContext, Arc<dyn ExecutionPlan>) {
        let ctx = session(partitions);
        let b = batch(rows);
        let table = MemTable::try_new(b.schema(), vec![vec![b]]).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        (ctx, plan)
    }

    /// The query over every row at once, by plain DataFusion: the oracle.
    async fn one_shot(rows: &[Row]) -> Vec<String> {
        let (ctx, plan) = planned(rows, 1).await;
        render(&collect(plan, ctx.task_ctx()).await.unwrap())
    }

    /// The same rows arriving in `chunks`: a partial per chunk, split by
    /// group key into `parts` partitions and kept as IPC, folded into each
    /// partition's running state every `fold` partials (PartialReduce),
    /// each partition finished once at the end.
    async fn staged(
        rows: &[Row],
        chunks: &[usize],
        fold: usize,
        partitions: usize,
        parts: u32,
    ) -> Vec<String> {
        let n = parts as usize;
        let mut state: Vec<Vec<RecordBatch>> = vec![Vec::new(); n];
        let mut pending: Vec<Vec<RecordBatch>> = vec![Vec::new(); n];
        let mut folded = 0;
        let mut at = 0;
        let mut last = None;
        for size in chunks {
            let end = (at + size).min(rows.len());
            let (ctx, plan) = planned(&rows[at..end], partitions).await;
            at = end;
            let staged = Staged::of(plan).unwrap().expect("an aggregate");
            let schema = staged.state_schema().unwrap();
            let keys = staged.key_columns();
            for b in collect(staged.partial().unwrap(), ctx.task_ctx())
                .await
                .unwrap()
            {
                for (p, piece) in crate::operators::partition::split(&b, &keys, parts)
                    .unwrap()
                    .into_iter()
                    .enumerate()
                {
                    pending[p].extend(from_ipc(&to_ipc(&schema, &[piece]).unwrap()).unwrap());
                }
            }
            folded += 1;
            if folded >= fold {
                folded = 0;
                for p in 0..n {
                    let mut all = std::mem::take(&mut state[p]);
                    all.append(&mut pending[p]);
                    let reduced = collect(staged.reduce(all).unwrap(), ctx.task_ctx())
                        .await
                        .unwrap();
                    state[p] = from_ipc(&to_ipc(&schema, &reduced).unwrap()).unwrap();
                }
            }
            last = Some((ctx, staged));
        }
        let (ctx, staged) = last.expect("at least one chunk");
        let mut out = Vec::new();
        for p in 0..n {
            let mut all = std::mem::take(&mut state[p]);
            all.append(&mut pending[p]);
            if all.iter().all(|b| b.num_rows() == 0) {
                continue;
            }
            let done = collect(staged.finish(all).unwrap(), ctx.task_ctx())
                .await
                .unwrap();
            out.extend(render(&done));
        }
        out.sort();
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// However rows are split into batches, states into hash
        /// partitions (1 to 8) and partials folded, and however many
        /// partitions DataFusion plans with, the staged result equals the
        /// one-shot GROUP BY.
        #[test]
        fn staged_aggregation_equals_the_one_shot_query(
            rows in proptest::collection::vec(
                (proptest::option::of(0u8..3), proptest::option::of(-20i8..20), 0i64..6),
                1..120,
            ),
            chunks in proptest::collection::vec(1usize..40, 1..8),
            fold in 1usize..4,
            partitions in 1usize..4,
            parts in 1u32..9,
        ) {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let mut chunks = chunks;
            let covered: usize = chunks.iter().sum();
            if covered < rows.len() {
                chunks.push(rows.len() - covered);
            }
            let want = rt.block_on(one_shot(&rows));
            let got = rt.block_on(staged(&rows, &chunks, fold, partitions, parts));
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn an_aggregate_over_an_aggregate_is_refused() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let ctx = session(1);
            let b = batch(&[(Some(0), Some(1), 1)]);
            let table = MemTable::try_new(b.schema(), vec![vec![b]]).unwrap();
            ctx.register_table("t", Arc::new(table)).unwrap();
            let plan = ctx
                .sql("SELECT count(*) FROM (SELECT k, count(*) AS c FROM t GROUP BY k)")
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let shown = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string();
            let e = match Staged::of(plan) {
                Err(e) => e,
                Ok(found) => panic!("not refused ({}): {shown}", found.is_some()),
            };
            assert!(e.contains("aggregates more than once"), "{e}");
        });
    }

    /// Without GROUP BY, DataFusion's default session answers `count(*)`
    /// from one batch's statistics and plans no aggregate at all;
    /// the staging session keeps the aggregate, and two batches' states
    /// merge to the answer over both.
    #[test]
    fn global_aggregates_are_not_answered_from_one_batchs_statistics() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let sql = "SELECT count(*) AS c FROM t";
            let rows: Vec<Row> = (0..10).map(|i| (Some(0), None, i)).collect();
            let plain = SessionContext::new();
            let b = batch(&rows[..5]);
            let table = MemTable::try_new(b.schema(), vec![vec![b]]).unwrap();
            plain.register_table("t", Arc::new(table)).unwrap();
            let plan = plain
                .sql(sql)
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            assert!(
                Staged::of(plan).unwrap().is_none(),
                "the default session kept the aggregate"
            );
            let mut states = Vec::new();
            let mut last = None;
            for part in [&rows[..5], &rows[5..]] {
                let (ctx, plan) = planned_sql(part, 1, sql).await;
                let staged = Staged::of(plan).unwrap().expect("an aggregate");
                states.extend(
                    collect(staged.partial().unwrap(), ctx.task_ctx())
                        .await
                        .unwrap(),
                );
                last = Some((ctx, staged));
            }
            let (ctx, staged) = last.unwrap();
            let got = render(
                &collect(staged.finish(states).unwrap(), ctx.task_ctx())
                    .await
                    .unwrap(),
            );
            assert_eq!(got, ["10"]);
        });
    }

    /// A state file holds its aggregate: read back by the same query it
    /// gives the states; read by another (a changed aggregate) it is
    /// refused, naming both.
    #[test]
    fn a_state_file_is_refused_by_another_aggregate() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let rows: Vec<Row> = (0..6).map(|i| (Some(i as u8 % 2), Some(1), i)).collect();
            let (ctx, plan) = planned(&rows, 1).await;
            let staged = Staged::of(plan).unwrap().unwrap();
            let states = collect(staged.partial().unwrap(), ctx.task_ctx())
                .await
                .unwrap();
            let bytes = staged.write_state(&states).unwrap();
            let back = staged.read_state("state/p=0/v=3.arrow", &bytes).unwrap();
            assert_eq!(render(&back), render(&states));
            let (_, other) = planned_sql(&rows, 1, "SELECT k, sum(x) AS s FROM t GROUP BY k").await;
            let other = Staged::of(other).unwrap().unwrap();
            let e = other.read_state("state/p=0/v=3.arrow", &bytes).unwrap_err();
            assert!(
                e.contains("state/p=0/v=3.arrow")
                    && e.contains("written for another aggregate")
                    && e.contains("sluice reset"),
                "{e}"
            );
        });
    }
}
