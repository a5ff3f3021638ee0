//! One merge step of a stateful query for one state partition: the last
//! committed state and this batch's partial states merged
//! (`PartialReduce`), then split by the output mode into what the batch
//! emits (finished by `Final` and the query's projection) and what stays
//! as the next state. Spark's semantics, which users check against:
//!
//! - append (windowed queries): a window is emitted once, by the batch
//!   whose watermark has passed its end (end <= watermark), and leaves the
//!   state; open windows stay.
//! - update: the groups this batch changed are emitted (a change log);
//!   windows the watermark has passed leave the state.
//! - complete: the whole result is emitted; the state keeps every group.
//!
//! The watermark a merge uses is the one committed before its batch; rows
//! at or below it were dropped as late before their partials were made.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{Array, BooleanArray};
use datafusion::arrow::compute::kernels::cmp::lt_eq;
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::collect;
use datafusion::prelude::SessionContext;

use crate::operators::Staged;
use crate::operators::window::WINDOW_END;
pub(crate) use crate::pipeline::OutputMode;

/// What one merge gives.
#[derive(Debug, Default)]
pub(crate) struct Merged {
    /// Finished rows for the sink (the query's output schema).
    pub emit: Vec<RecordBatch>,
    /// The partition's next state (the state schema).
    pub state: Vec<RecordBatch>,
    /// The earliest window end left in that state, microseconds (none
    /// without windows or without state): the watermark that closes a
    /// window next.
    pub next_close_us: Option<i64>,
}

/// Merge `state` and `partials` of one partition under `mode`, closing
/// windows that end at or before `watermark` (microseconds since the
/// epoch; `None`: no watermark yet).
pub(crate) async fn merge(
    ctx: &SessionContext,
    staged: &Staged,
    state: Vec<RecordBatch>,
    partials: Vec<RecordBatch>,
    mode: OutputMode,
    watermark: Option<i64>,
) -> Result<Merged> {
    let schema = staged.state_schema()?;
    let changed_keys = keys_of(staged, &partials)?;
    let mut all = state;
    all.extend(partials);
    if all.iter().all(|b| b.num_rows() == 0) {
        return Ok(Merged::default());
    }
    let merged = collect(staged.reduce(staged.merge_sessions(all)?)?, ctx.task_ctx()).await?;
    let merged = concat_batches(&schema, &merged)?;
    if staged.staggered() {
        return stagger(ctx, staged, merged, mode, watermark).await;
    }
    let n = merged.num_rows();
    let closed: BooleanArray = match (schema.index_of(WINDOW_END).ok(), watermark) {
        (Some(end), Some(wm)) => {
            let wm = datafusion::arrow::array::Int64Array::new_scalar(wm);
            lt_eq(&window_ends_us(&merged, end)?, &wm)?
        }
        _ => BooleanArray::from(vec![false; n]),
    };
    let windowed = schema.index_of(WINDOW_END).is_ok();
    let open = datafusion::arrow::compute::not(&closed)?;
    let (emit_rows, keep) = match mode {
        OutputMode::Append => {
            if !windowed {
                return Err(DataFusionError::Plan(
                    "append mode emits a group once its window closes: group by window(...) \
                     with [watermark], or use mode = \"update\" or \"complete\""
                        .into(),
                ));
            }
            (
                filter_record_batch(&merged, &closed)?,
                filter_record_batch(&merged, &open)?,
            )
        }
        OutputMode::Update => {
            let changed = changed_rows(staged, &merged, changed_keys.as_ref())?;
            (
                filter_record_batch(&merged, &changed)?,
                filter_record_batch(&merged, &open)?,
            )
        }
        OutputMode::Complete => (merged.clone(), merged),
    };
    let emit = if emit_rows.num_rows() == 0 {
        Vec::new()
    } else {
        collect(staged.finish(vec![emit_rows])?, ctx.task_ctx()).await?
    };
    let next_close_us = match schema.index_of(WINDOW_END) {
        Ok(end) if keep.num_rows() > 0 => {
            datafusion::arrow::compute::min(&window_ends_us(&keep, end)?)
        }
        _ => None,
    };
    Ok(Merged {
        emit,
        state: vec![keep],
        next_close_us,
    })
}

/// The merge of stagger windows: `merged` holds one row per key and event
/// time (each a window `[t, t + size)`); cut into each key's stagger
/// windows, a window is emitted (append) once the watermark reaches its
/// end, and its rows leave the state, while the rows of open windows stay
/// as they are (a row with an earlier time may still cut them anew).
/// Complete mode emits every window and keeps every row.
async fn stagger(
    ctx: &SessionContext,
    staged: &Staged,
    merged: RecordBatch,
    mode: OutputMode,
    watermark: Option<i64>,
) -> Result<Merged> {
    let end = merged.schema().index_of(WINDOW_END)?;
    let cut = staged.stagger_windows(&merged)?;
    let ends = window_ends_us(&cut, end)?;
    let closed: BooleanArray = match watermark {
        Some(wm) => lt_eq(&ends, &datafusion::arrow::array::Int64Array::new_scalar(wm))?,
        None => BooleanArray::from(vec![false; cut.num_rows()]),
    };
    let open = datafusion::arrow::compute::not(&closed)?;
    let (emit_rows, keep) = match mode {
        OutputMode::Append => (
            filter_record_batch(&cut, &closed)?,
            filter_record_batch(&merged, &open)?,
        ),
        OutputMode::Complete => (cut, merged),
        OutputMode::Update => {
            return Err(DataFusionError::Plan(
                "stagger_window(...) in update mode is not supported: use mode = \"append\" \
                 or \"complete\""
                    .into(),
            ));
        }
    };
    let emit = if emit_rows.num_rows() == 0 {
        Vec::new()
    } else {
        collect(staged.finish(vec![emit_rows])?, ctx.task_ctx()).await?
    };
    let open_ends = datafusion::arrow::compute::filter(&ends, &open)?;
    let next_close_us = datafusion::arrow::compute::min(
        open_ends
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .expect("Int64"),
    );
    Ok(Merged {
        emit,
        state: vec![keep],
        next_close_us,
    })
}

/// The window ends (column `end` of `batch`), in microseconds.
fn window_ends_us(batch: &RecordBatch, end: usize) -> Result<datafusion::arrow::array::Int64Array> {
    let end = cast(
        batch.column(end),
        &DataType::Timestamp(TimeUnit::Microsecond, None),
    )?;
    let end = cast(&end, &DataType::Int64)?;
    Ok(end
        .as_any()
        .downcast_ref::<datafusion::arrow::array::Int64Array>()
        .expect("cast to Int64")
        .clone())
}

/// Which rows of `merged` hold groups the batch changed (`keys`, the
/// group keys of its partials; `None`: every row).
fn changed_rows(
    staged: &Staged,
    merged: &RecordBatch,
    keys: Option<&HashSet<Vec<u8>>>,
) -> Result<BooleanArray> {
    let n = merged.num_rows();
    Ok(match keys {
        None => BooleanArray::from(vec![true; n]),
        Some(keys) => {
            let converter = converter(staged, merged)?;
            let rows = converter.convert_columns(&key_columns(staged, merged))?;
            (0..n)
                .map(|i| Some(keys.contains(rows.row(i).as_ref())))
                .collect()
        }
    })
}

fn key_columns(staged: &Staged, batch: &RecordBatch) -> Vec<Arc<dyn Array>> {
    staged
        .key_columns()
        .iter()
        .map(|i| batch.column(*i).clone())
        .collect()
}

fn converter(staged: &Staged, batch: &RecordBatch) -> Result<RowConverter> {
    let fields = staged
        .key_columns()
        .iter()
        .map(|i| SortField::new(batch.schema().field(*i).data_type().clone()))
        .collect();
    Ok(RowConverter::new(fields)?)
}

/// The group keys present in `partials` (as row-format bytes, compared
/// within this process only); `None` for a query without group keys.
fn keys_of(staged: &Staged, partials: &[RecordBatch]) -> Result<Option<HashSet<Vec<u8>>>> {
    if staged.key_columns().is_empty() {
        return Ok(None);
    }
    let mut keys = HashSet::new();
    for b in partials {
        let converter = converter(staged, b)?;
        let rows = converter.convert_columns(&key_columns(staged, b))?;
        for r in rows.iter() {
            keys.insert(r.as_ref().to_vec());
        }
    }
    Ok(Some(keys))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::aggregate::session;
    use crate::operators::window::{assign, rewrite};
    use datafusion::arrow::array::{Float64Array, StringArray, TimestampMicrosecondArray};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::datasource::MemTable;
    use proptest::prelude::*;

    type Row = (i64, u8, i8);
    const MIN: i64 = 60_000_000;

    fn batch(rows: &[Row]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("zone", DataType::Utf8, true),
            Field::new("amount", DataType::Float64, true),
        ]));
        let ts: TimestampMicrosecondArray = rows.iter().map(|r| Some(r.0)).collect();
        let zone: StringArray = rows
            .iter()
            .map(|r| Some(["a", "b", "c"][r.1 as usize % 3]))
            .collect();
        let amount: Float64Array = rows.iter().map(|r| Some(r.2 as f64 / 4.0)).collect();
        RecordBatch::try_new(schema, vec![Arc::new(ts), Arc::new(zone), Arc::new(amount)]).unwrap()
    }

    use crate::operators::testing::render;

    /// Runs `sql` over `arrivals` (batches in order) the way a pipeline
    /// will: per batch, drop rows at or below the watermark committed
    /// before it, assign windows, make partials, merge them into the state
    /// and emit; the watermark after each batch is max(previous, max event
    /// time - delay); one more merge with no input at the end (the
    /// trailing no-data batch). Returns each batch's emitted rows.
    async fn pipeline(
        sql: &str,
        arrivals: &[Vec<Row>],
        mode: OutputMode,
        delay: i64,
    ) -> Vec<Vec<String>> {
        let w = rewrite(sql).unwrap();
        let ctx = session(2);
        let mut state: Vec<RecordBatch> = Vec::new();
        let mut watermark: Option<i64> = None;
        let mut emitted = Vec::new();
        for rows in arrivals.iter().map(Some).chain([None]) {
            // Only a query over event-time windows has late rows.
            let windowed = w.window.is_some();
            let rows: Vec<Row> = rows
                .map(|r| {
                    r.iter()
                        .filter(|r| !windowed || watermark.is_none_or(|wm| r.0 > wm))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            let input = match &w.window {
                Some(spec) => assign(&batch(&rows), spec).unwrap(),
                None => batch(&rows),
            };
            let table = MemTable::try_new(input.schema(), vec![vec![input]]).unwrap();
            let _ = ctx.deregister_table("t");
            ctx.register_table("t", Arc::new(table)).unwrap();
            let plan = ctx
                .sql(&w.sql)
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let s = Staged::of(plan)
                .unwrap()
                .unwrap()
                .with_window(w.window.as_ref());
            let partials = collect(s.partial().unwrap(), ctx.task_ctx()).await.unwrap();
            let m = merge(
                &ctx,
                &s,
                std::mem::take(&mut state),
                partials,
                mode,
                watermark,
            )
            .await
            .unwrap();
            emitted.push(render(&m.emit));
            state = m.state;
            if let Some(max) = rows.iter().map(|r| r.0).max() {
                watermark = Some(watermark.map_or(max - delay, |wm| wm.max(max - delay)));
            }
        }
        emitted
    }

    /// The expected append output, computed without Sluice's code: late
    /// rows (at or below the watermark before their batch) dropped, the
    /// final watermark from the arrivals, and a one-shot DataFusion
    /// `date_bin` GROUP BY over the rest, keeping windows that end at or
    /// before it.
    async fn expected_append(arrivals: &[Vec<Row>], delay: i64, size: i64) -> Vec<String> {
        let mut wm: Option<i64> = None;
        let mut kept = Vec::new();
        for rows in arrivals {
            kept.extend(rows.iter().filter(|r| wm.is_none_or(|w| r.0 > w)).cloned());
            if let Some(max) = rows.iter().map(|r| r.0).max() {
                wm = Some(wm.map_or(max - delay, |w| w.max(max - delay)));
            }
        }
        let Some(wm) = wm else { return Vec::new() };
        let ctx = SessionContext::new();
        let all = batch(&kept);
        let table = MemTable::try_new(all.schema(), vec![vec![all]]).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        let minutes = size / MIN;
        let sql = format!(
            "SELECT ws, we, zone, n, s FROM (SELECT date_bin(INTERVAL '{minutes} minutes', ts, \
             TIMESTAMP '1970-01-01T00:00:00') AS ws, date_bin(INTERVAL '{minutes} minutes', ts, \
             TIMESTAMP '1970-01-01T00:00:00') + INTERVAL '{minutes} minutes' AS we, zone, \
             count(*) AS n, sum(amount) AS s FROM t GROUP BY 1, 2, 3) \
             WHERE CAST(we AS BIGINT) <= {wm}"
        );
        render(&ctx.sql(&sql).await.unwrap().collect().await.unwrap())
    }

    /// Stagger windows of `size` computed from their definition, without
    /// Sluice's code: the rows not late on arrival, per zone in time
    /// order, a window opened by a zone's first row and by its first row at
    /// or past the open window's end; then a one-shot DataFusion GROUP BY
    /// over the rows labelled with their window. Append: the windows that
    /// end at or before the final watermark; complete (`all`): every one.
    async fn expected_stagger(
        arrivals: &[Vec<Row>],
        delay: i64,
        size: i64,
        all: bool,
    ) -> Vec<String> {
        let mut wm: Option<i64> = None;
        let mut kept: Vec<Row> = Vec::new();
        for rows in arrivals {
            kept.extend(rows.iter().filter(|r| wm.is_none_or(|w| r.0 > w)).cloned());
            if let Some(max) = rows.iter().map(|r| r.0).max() {
                wm = Some(wm.map_or(max - delay, |w| w.max(max - delay)));
            }
        }
        let zone = |r: &Row| r.1 % 3;
        kept.sort_by_key(|r| (zone(r), r.0));
        let mut starts = Vec::with_capacity(kept.len());
        let mut open: Option<(u8, i64)> = None;
        for r in &kept {
            let start = match open {
                Some((z, s)) if z == zone(r) && r.0 < s + size => s,
                _ => r.0,
            };
            open = Some((zone(r), start));
            starts.push(start);
        }
        let labelled = batch(&kept);
        let mut fields: Vec<Field> = labelled
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(
            "ws",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ));
        let mut columns = labelled.columns().to_vec();
        columns.push(Arc::new(TimestampMicrosecondArray::from(starts)));
        let labelled = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        let ctx = SessionContext::new();
        let table = MemTable::try_new(labelled.schema(), vec![vec![labelled]]).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        let close = match (all, wm) {
            (true, _) => String::new(),
            (false, Some(wm)) => format!("WHERE CAST(we AS BIGINT) <= {wm}"),
            (false, None) => "WHERE false".into(),
        };
        let sql = format!(
            "SELECT ws, we, zone, n, s FROM (SELECT ws, ws + INTERVAL '{} minutes' AS we, zone, \
             count(*) AS n, sum(amount) AS s FROM t GROUP BY 1, 2, 3) {close}",
            size / MIN
        );
        render(&ctx.sql(&sql).await.unwrap().collect().await.unwrap())
    }

    fn arrivals(rows: Vec<Row>, cuts: Vec<usize>) -> Vec<Vec<Row>> {
        let mut out = Vec::new();
        let mut rest = rows.as_slice();
        for c in cuts {
            let c = c.min(rest.len());
            out.push(rest[..c].to_vec());
            rest = &rest[c..];
        }
        out.push(rest.to_vec());
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// Append over tumbling windows: the union of every batch's output
        /// (the trailing no-data batch included) is each closed window
        /// exactly once, equal to the independent computation, whatever the
        /// arrival order and batch split.
        #[test]
        fn append_emits_each_closed_window_once(
            rows in proptest::collection::vec((0i64..180 * MIN, 0u8..3, -20i8..20), 0..60),
            cuts in proptest::collection::vec(0usize..20, 0..6),
            delay_min in 0i64..30,
        ) {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let arrivals = arrivals(rows, cuts);
            let delay = delay_min * MIN;
            let sql = "SELECT window.start AS ws, window.end AS we, zone, count(*) AS n, \
                       sum(amount) AS s FROM t GROUP BY window(ts, '15 minutes'), zone";
            let out = rt.block_on(pipeline(sql, &arrivals, OutputMode::Append, delay));
            let mut union: Vec<String> = out.into_iter().flatten().collect();
            union.sort();
            let want = rt.block_on(expected_append(&arrivals, delay, 15 * MIN));
            prop_assert_eq!(union, want);
        }

        /// Stagger windows, append: the union of every batch's output is
        /// each closed window exactly once; complete: the last batch's
        /// output is every window; both equal to the windows computed from
        /// the definition, whatever the arrival order and batch split (a
        /// row arriving after others of its zone with an earlier time cuts
        /// the zone's windows anew).
        #[test]
        fn stagger_windows_equal_their_definition_however_rows_arrive(
            rows in proptest::collection::vec((0i64..180 * MIN, 0u8..3, -20i8..20), 0..60),
            cuts in proptest::collection::vec(0usize..20, 0..6),
            delay_min in 0i64..40,
        ) {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let arrivals = arrivals(rows, cuts);
            let delay = delay_min * MIN;
            let sql = "SELECT stagger_window.start AS ws, stagger_window.end AS we, zone, \
                       count(*) AS n, sum(amount) AS s FROM t \
                       GROUP BY stagger_window(ts, '10 minutes'), zone";
            let out = rt.block_on(pipeline(sql, &arrivals, OutputMode::Append, delay));
            let mut union: Vec<String> = out.into_iter().flatten().collect();
            union.sort();
            let want = rt.block_on(expected_stagger(&arrivals, delay, 10 * MIN, false));
            prop_assert_eq!(union, want);
            let complete = rt.block_on(pipeline(sql, &arrivals, OutputMode::Complete, delay));
            let last = complete.last().cloned().unwrap_or_default();
            let want = rt.block_on(expected_stagger(&arrivals, delay, 10 * MIN, true));
            prop_assert_eq!(last, want);
        }

        /// Complete without a window: the last batch's output is the
        /// one-shot GROUP BY over every row. Update: the last row emitted
        /// per group is.
        #[test]
        fn complete_and_update_end_at_the_one_shot_result(
            rows in proptest::collection::vec((0i64..180 * MIN, 0u8..3, -20i8..20), 1..60),
            cuts in proptest::collection::vec(0usize..20, 0..6),
        ) {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let arrivals = arrivals(rows.clone(), cuts);
            let sql = "SELECT zone, count(*) AS n, sum(amount) AS s FROM t GROUP BY zone";
            let want = rt.block_on(async {
                let ctx = SessionContext::new();
                let all = batch(&rows);
                let table = MemTable::try_new(all.schema(), vec![vec![all]]).unwrap();
                ctx.register_table("t", Arc::new(table)).unwrap();
                render(&ctx.sql(sql).await.unwrap().collect().await.unwrap())
            });
            let complete = rt.block_on(pipeline(sql, &arrivals, OutputMode::Complete, 0));
            let last_nonempty = complete.iter().rev().find(|e| !e.is_empty()).cloned().unwrap();
            prop_assert_eq!(&last_nonempty, &want);
            let update = rt.block_on(pipeline(sql, &arrivals, OutputMode::Update, 0));
            let mut last: std::collections::BTreeMap<String, String> = Default::default();
            for emitted in update {
                for row in emitted {
                    let key = row.split('|').next().unwrap().to_string();
                    last.insert(key, row);
                }
            }
            let mut got: Vec<String> = last.into_values().collect();
            got.sort();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn append_without_a_window_is_refused() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let e = rt.block_on(async {
            let ctx = session(1);
            let input = batch(&[(0, 0, 1)]);
            let table = MemTable::try_new(input.schema(), vec![vec![input]]).unwrap();
            ctx.register_table("t", Arc::new(table)).unwrap();
            let plan = ctx
                .sql("SELECT zone, count(*) FROM t GROUP BY zone")
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let s = Staged::of(plan).unwrap().unwrap();
            let partials = collect(s.partial().unwrap(), ctx.task_ctx()).await.unwrap();
            merge(&ctx, &s, Vec::new(), partials, OutputMode::Append, None)
                .await
                .unwrap_err()
                .to_string()
        });
        assert!(e.contains("append mode") && e.contains("window"), "{e}");
    }
}
