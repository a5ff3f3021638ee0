//! The input of a stateful query as its operator task reads it: rows whose
//! event time is at or below the watermark committed before the batch are
//! late and dropped (counted), window columns are assigned
//! ([`super::window::assign`]), and the largest event time read is kept for
//! the watermark the batch's commit records (a task that reads no row
//! reports none, never 0).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use datafusion::arrow::array::{Array, AsArray, BooleanArray};
use datafusion::arrow::compute::{cast, filter_record_batch, max};
use datafusion::arrow::datatypes::{DataType, Int64Type, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

use super::window::{WINDOW_END, WINDOW_START, WindowSpec, assign};

/// What the event-time step saw, across a task's partitions.
#[derive(Debug)]
pub(crate) struct EventTally {
    /// Rows dropped as late.
    pub late: AtomicU64,
    /// The largest event time kept, microseconds since the epoch
    /// (`i64::MIN`: no row).
    pub max_event_us: AtomicI64,
    /// The late rows themselves, when they are to be written
    /// (`late = "side-output"`).
    pub late_rows: Option<std::sync::Mutex<Vec<RecordBatch>>>,
}

impl Default for EventTally {
    fn default() -> Self {
        EventTally {
            late: AtomicU64::new(0),
            max_event_us: AtomicI64::new(i64::MIN),
            late_rows: None,
        }
    }
}

impl EventTally {
    /// A tally that also keeps the late rows.
    pub(crate) fn keeping_late() -> EventTally {
        EventTally {
            late_rows: Some(std::sync::Mutex::new(Vec::new())),
            ..EventTally::default()
        }
    }

    /// The largest event time kept, if any row was.
    pub(crate) fn max_event_us(&self) -> Option<i64> {
        Some(self.max_event_us.load(Ordering::Relaxed)).filter(|m| *m != i64::MIN)
    }
}

/// The input with event time applied.
#[derive(Debug)]
pub(crate) struct EventTimeTable {
    inner: Arc<dyn TableProvider>,
    column: String,
    window: Option<WindowSpec>,
    watermark_us: Option<i64>,
    schema: SchemaRef,
    tally: Arc<EventTally>,
    /// A row without an event time is late even with no window to fall
    /// in ([`Self::untimed_late`]).
    untimed_late: bool,
}

impl EventTimeTable {
    /// `inner` read with event time from `column`, late rows (at or below
    /// `watermark_us`) dropped, and `window`'s columns added.
    pub(crate) fn new(
        inner: Arc<dyn TableProvider>,
        column: &str,
        window: Option<WindowSpec>,
        watermark_us: Option<i64>,
        tally: Arc<EventTally>,
    ) -> std::result::Result<EventTimeTable, String> {
        let base = inner.schema();
        let field = base
            .field_with_name(column)
            .map_err(|_| format!("[watermark] column = \"{column}\" is not a source column"))?;
        let DataType::Timestamp(unit, tz) = field.data_type() else {
            return Err(format!(
                "[watermark] column = \"{column}\" is {}, not a timestamp: type it with \
                 source.schema_hints = {{ {column} = \"timestamp\" }} (or in source.schema)",
                crate::pipeline::types::type_name(field.data_type())
            ));
        };
        if let Some(w) = &window {
            super::window::check_unit(w, unit)?;
        }
        let mut fields: Vec<_> = base.fields().iter().cloned().collect();
        if window.is_some() {
            let t = DataType::Timestamp(*unit, tz.clone());
            fields.push(Arc::new(datafusion::arrow::datatypes::Field::new(
                WINDOW_START,
                t.clone(),
                false,
            )));
            fields.push(Arc::new(datafusion::arrow::datatypes::Field::new(
                WINDOW_END, t, false,
            )));
        }
        Ok(EventTimeTable {
            inner,
            column: column.to_string(),
            window,
            watermark_us,
            schema: Arc::new(Schema::new(fields)),
            tally,
            untimed_late: false,
        })
    }

    /// A row without an event time is counted (and set aside) with the
    /// late rows even without a window: `[deduplicate]` needs its event
    /// time for the key's expiry.
    pub(crate) fn untimed_late(mut self, untimed_late: bool) -> Self {
        self.untimed_late = untimed_late;
        self
    }
}

#[async_trait::async_trait]
impl TableProvider for EventTimeTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // Read only the columns the query needs and the event time (the
        // window columns come after the source's); late rows kept as a
        // side output are written whole, so then read every column.
        let base = self.inner.schema();
        let n = base.fields().len();
        let (inner, exec_projection) = match projection {
            Some(p) if self.tally.late_rows.is_none() => {
                let event = base.index_of(&self.column)?;
                let mut need: Vec<usize> = p.iter().copied().filter(|i| *i < n).collect();
                need.push(event);
                need.sort_unstable();
                need.dedup();
                let at = |i: usize| {
                    if i < n {
                        need.iter().position(|x| *x == i).expect("needed")
                    } else {
                        need.len() + (i - n)
                    }
                };
                let out: Vec<usize> = p.iter().map(|i| at(*i)).collect();
                (Some(need), Some(out))
            }
            other => (None, other.cloned()),
        };
        let input = self.inner.scan(state, inner.as_ref(), &[], None).await?;
        let out = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(out.clone()),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Arc::new(EventTimeExec {
            input,
            column: self.column.clone(),
            window: self.window.clone(),
            watermark_us: self.watermark_us,
            projection: exec_projection,
            properties,
            tally: self.tally.clone(),
            untimed_late: self.untimed_late,
        }))
    }
}

/// [`EventTimeTable`]'s scan.
#[derive(Debug)]
struct EventTimeExec {
    input: Arc<dyn ExecutionPlan>,
    column: String,
    window: Option<WindowSpec>,
    watermark_us: Option<i64>,
    projection: Option<Vec<usize>>,
    properties: Arc<PlanProperties>,
    tally: Arc<EventTally>,
    untimed_late: bool,
}

impl DisplayAs for EventTimeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "EventTimeExec: column={}, watermark={:?}, window={:?}",
            self.column, self.watermark_us, self.window
        )
    }
}

impl ExecutionPlan for EventTimeExec {
    fn name(&self) -> &str {
        "EventTimeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(EventTimeExec {
            input: children.swap_remove(0),
            column: self.column.clone(),
            window: self.window.clone(),
            watermark_us: self.watermark_us,
            projection: self.projection.clone(),
            properties: self.properties.clone(),
            tally: self.tally.clone(),
            untimed_late: self.untimed_late,
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let (column, window, watermark, projection, tally) = (
            self.column.clone(),
            self.window.clone(),
            self.watermark_us,
            self.projection.clone(),
            self.tally.clone(),
        );
        let untimed_late = self.untimed_late;
        let stream = input.map(move |b| {
            let b = b?;
            let kept = apply(
                &b,
                &column,
                watermark,
                window.as_ref(),
                untimed_late,
                &tally,
            )
            .map_err(|e| DataFusionError::ArrowError(Box::new(e), None))?;
            match &projection {
                Some(p) => Ok(kept.project(p)?),
                None => Ok(kept),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.properties.eq_properties.schema().clone(),
            stream,
        )))
    }
}

/// One batch through the event-time step.
fn apply(
    batch: &RecordBatch,
    column: &str,
    watermark_us: Option<i64>,
    window: Option<&WindowSpec>,
    untimed_late: bool,
    tally: &EventTally,
) -> std::result::Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    let ts = batch.column_by_name(column).ok_or_else(|| {
        datafusion::arrow::error::ArrowError::SchemaError(format!("no column {column}"))
    })?;
    let us = cast(ts, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    let us = cast(&us, &DataType::Int64)?;
    // Without a window a row with no event time is kept, unless told.
    let windowed = window.is_some() || untimed_late;
    let kept = match watermark_us {
        None if !windowed || us.null_count() == 0 => batch.clone(),
        wm => {
            // A row with no event time falls in no window: counted with
            // the late rows (and kept with them under side-output), not
            // dropped unseen.
            let v = us.as_primitive::<Int64Type>();
            let on_time: BooleanArray = (0..v.len())
                .map(|i| {
                    Some(if v.is_null(i) {
                        !windowed
                    } else {
                        wm.is_none_or(|wm| v.value(i) > wm)
                    })
                })
                .collect();
            let late = on_time.iter().filter(|k| *k == Some(false)).count() as u64;
            tally.late.fetch_add(late, Ordering::Relaxed);
            if late > 0
                && let Some(kept) = &tally.late_rows
            {
                let rows = filter_record_batch(batch, &datafusion::arrow::compute::not(&on_time)?)?;
                kept.lock().expect("not poisoned").push(rows);
            }
            if late == 0 {
                batch.clone()
            } else {
                filter_record_batch(batch, &on_time)?
            }
        }
    };
    let kept_us = cast(
        &cast(
            kept.column_by_name(column).expect("kept"),
            &DataType::Timestamp(TimeUnit::Microsecond, None),
        )?,
        &DataType::Int64,
    )?;
    if let Some(m) = max(kept_us.as_primitive::<Int64Type>()) {
        tally.max_event_us.fetch_max(m, Ordering::Relaxed);
    }
    match window {
        Some(spec) => assign(&kept, spec),
        None => Ok(kept),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::window::rewrite;
    use datafusion::arrow::array::{StringArray, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::Field;
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;

    const MIN_MS: i64 = 60_000;

    use crate::operators::testing::render;

    /// Millisecond event times (the unit CSV inference gives), a watermark
    /// of 00:20: the rows at 00:05 and 00:20 are late (at or below it), the
    /// null one falls in no window and is counted with them (the review's
    /// case: it was dropped uncounted); the rest land in their 15-minute
    /// windows. Hand-computed.
    #[tokio::test]
    async fn late_rows_are_dropped_and_counted_and_windows_assigned() {
        let ts = TimestampMillisecondArray::from(vec![
            Some(5 * MIN_MS),
            Some(20 * MIN_MS),
            Some(21 * MIN_MS),
            Some(44 * MIN_MS),
            None,
            Some(46 * MIN_MS),
        ]);
        let zone = StringArray::from(vec!["a", "a", "a", "b", "b", "b"]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("ts", ts.data_type().clone(), true),
            Field::new("zone", DataType::Utf8, true),
        ]));
        let b = RecordBatch::try_new(schema.clone(), vec![Arc::new(ts), Arc::new(zone)]).unwrap();
        let inner = Arc::new(MemTable::try_new(schema, vec![vec![b]]).unwrap());
        let w = rewrite(
            "SELECT window.start AS ws, zone, count(*) AS n FROM t GROUP BY window(ts, '15 minutes'), zone",
        )
        .unwrap();
        let tally = Arc::new(EventTally::default());
        let table = EventTimeTable::new(
            inner,
            "ts",
            w.window.clone(),
            Some(20 * MIN_MS * 1_000),
            tally.clone(),
        )
        .unwrap();
        let ctx = SessionContext::new();
        ctx.register_table("t", Arc::new(table)).unwrap();
        let got = render(&ctx.sql(&w.sql).await.unwrap().collect().await.unwrap());
        assert_eq!(
            got,
            [
                "1970-01-01T00:15:00|a|1",
                "1970-01-01T00:30:00|b|1",
                "1970-01-01T00:45:00|b|1"
            ]
        );
        assert_eq!(tally.late.load(Ordering::Relaxed), 3);
        assert_eq!(tally.max_event_us(), Some(46 * MIN_MS * 1_000));
        let none = EventTally::default();
        assert_eq!(none.max_event_us(), None);
    }

    /// The review's cases: with no watermark yet (the first batch), a null
    /// event time was dropped uncounted by the window; and a window of
    /// 1,500 ms over a seconds column was rounded to 1 s windows.
    #[tokio::test]
    async fn null_event_times_are_counted_and_windows_finer_than_the_column_are_refused() {
        use datafusion::arrow::array::TimestampSecondArray;
        let ts = TimestampSecondArray::from(vec![Some(5), None, Some(7)]);
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            ts.data_type().clone(),
            true,
        )]));
        let b = RecordBatch::try_new(schema.clone(), vec![Arc::new(ts)]).unwrap();
        let table = || Arc::new(MemTable::try_new(schema.clone(), vec![vec![b.clone()]]).unwrap());
        let w = rewrite(
            "SELECT window.start AS ws, count(*) AS n FROM t GROUP BY window(ts, '2 seconds')",
        )
        .unwrap();
        let tally = Arc::new(EventTally::keeping_late());
        let t = EventTimeTable::new(table(), "ts", w.window.clone(), None, tally.clone()).unwrap();
        let ctx = SessionContext::new();
        ctx.register_table("t", Arc::new(t)).unwrap();
        let got = render(&ctx.sql(&w.sql).await.unwrap().collect().await.unwrap());
        assert_eq!(got, ["1970-01-01T00:00:04|1", "1970-01-01T00:00:06|1"]);
        assert_eq!(tally.late.load(Ordering::Relaxed), 1);
        let kept = tally.late_rows.as_ref().unwrap().lock().unwrap();
        assert_eq!(kept.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
        for sql in [
            "SELECT window.start AS ws, count(*) AS n FROM t GROUP BY window(ts, '1500 milliseconds')",
            "SELECT window.start AS ws, count(*) AS n FROM t GROUP BY window(ts, '2 seconds', '500 milliseconds')",
        ] {
            let w = rewrite(sql).unwrap();
            let e = EventTimeTable::new(table(), "ts", w.window, None, Arc::default()).unwrap_err();
            assert!(e.contains("not a whole number of seconds"), "{sql}: {e}");
        }
    }

    #[test]
    fn a_watermark_on_a_non_timestamp_column_is_refused() {
        let schema = Arc::new(Schema::new(vec![Field::new("ts", DataType::Utf8, true)]));
        let inner = Arc::new(MemTable::try_new(schema, vec![vec![]]).unwrap());
        let e = EventTimeTable::new(inner, "ts", None, None, Arc::default()).unwrap_err();
        assert!(e.contains("not a timestamp"), "{e}");
    }
}
