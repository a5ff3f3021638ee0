//! Which GROUP BY queries a pipeline may run as a stateful query, checked
//! when the pipeline is checked: one aggregation (optionally over one
//! event-time window, Spark's `window(...)`), with aggregates whose partial
//! states merge, in an output mode that fits, with a `[watermark]` where
//! windows must close. Refusals name what is wrong and what to write.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::MemTable;

use super::SqlOperator;
use super::aggregate::{Staged, session};
use super::window::{WINDOW_END, WINDOW_START, WindowSpec, rewrite};
use crate::error::Result;
use crate::pipeline::{OutputMode, Watermark};

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
    /// The schema of the rows it writes.
    pub output: SchemaRef,
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
                "{name}({}, ...): the source has no column {}: {name}(...) takes a timestamp \
                 column of the source by name (a cast or an expression there, or a column of \
                 a derived table, is not supported); type the source column as timestamp with \
                 source.schema_hints (or in source.schema)",
                w.column,
                w.column,
                name = w.name()
            ))
        })?;
        let DataType::Timestamp(unit, _) = field.data_type() else {
            return Err(self.sql_err(format!(
                "{}({}, ...): the column is {}, not a timestamp: type it as timestamp \
                 with source.schema_hints = {{ {} = \"timestamp\" }} (or in source.schema; \
                 a cast in the query is not seen where windows are assigned)",
                w.name(),
                w.column,
                crate::pipeline::types::type_name(field.data_type()),
                w.column
            )));
        };
        // A duration the column's unit cannot hold is refused here, by
        // `sluice check`, not first by a run.
        super::window::check_unit(w, unit).map_err(|e| self.sql_err(e))?;
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
        self.register_statics(&ctx)?;
        let plan = ctx
            .state()
            .create_logical_plan(&w.sql)
            .await
            .map_err(|e| match &w.window {
                // The window's columns are added to the source's rows: a
                // query that groups a derived table by a window cannot see
                // them (the message would name the internal column).
                Some(win)
                    if e.to_string().contains(WINDOW_START)
                        || e.to_string().contains(WINDOW_END) =>
                {
                    self.sql_err(format!(
                        "{}({}, ...) groups a derived table or subquery: windows are assigned \
                         as the source is read, so group the source table itself by \
                         {}(<source timestamp column>, ...) (type the column with \
                         source.schema_hints instead of a cast)",
                        win.name(),
                        win.column,
                        win.name()
                    ))
                }
                _ => self.sql_err(format!("{e}\nfix query.sql in the pipeline file")),
            })?;
        // Aggregations of the stream (one over a subquery that does not
        // read the input, or over a static table before a join, is the
        // same in every batch).
        let aggregates = super::classify::stream_aggregates(&plan, &p.source.table)
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
        // The sink takes its rows: partition columns, Delta types.
        let output = physical.schema();
        crate::sinks::partition_check(&output, &p.partition_by).map_err(|m| self.sql_err(m))?;
        if p.sink_format == crate::pipeline::SinkFormat::Delta {
            crate::sinks::delta_check(&output)
                .map_err(|m| self.sql_err(format!("sink.format = \"delta\": {m}")))?;
        }
        let staged = Staged::of(physical)
            .map_err(|e| self.sql_err(e))?
            .ok_or_else(|| self.sql_err("the query's aggregate was planned away"))?;
        if let Some(reason) = staged.refusal() {
            return Err(self.sql_err(reason));
        }
        self.check_bad_input_policies("a stateful (GROUP BY) query")?;
        let q = StatefulQuery {
            sql: w.sql,
            window: w.window,
            mode: p.output_mode,
            watermark: p.watermark.clone(),
            output,
        };
        self.check_output_mode(&q)?;
        Ok(Some(q))
    }

    /// Refuses the bad-input settings on a stateful query: they apply to
    /// row-by-row queries for now.
    pub(super) fn check_bad_input_policies(&self, what: &str) -> Result<()> {
        let s = &self.pipeline.source;
        if s.on_bad_file != crate::pipeline::BadFilePolicy::Fail
            || s.on_bad_row != crate::pipeline::BadRowPolicy::Fail
            || s.on_schema_change != crate::pipeline::SchemaChangePolicy::Fail
            || s.corrupt_record
        {
            return Err(self.sql_err(format!(
                "on_bad_file, on_bad_row, on_schema_change and corrupt_record apply to \
                 row-by-row queries without [deduplicate] for now: {what} fails its batch on \
                 bad input; remove them"
            )));
        }
        Ok(())
    }

    /// Refuses an output mode that does not fit `q`'s window and watermark:
    /// append without a window, or with one but no `[watermark]`; a session
    /// window in update mode; a watermark on another column than the
    /// window's.
    fn check_output_mode(&self, q: &StatefulQuery) -> Result<()> {
        if q.mode == OutputMode::Complete
            && self.pipeline.deduplicate.is_none()
            && q.watermark
                .as_ref()
                .is_some_and(|w| w.wallclock_bound_us.is_some())
        {
            return Err(self.sql_err(
                "[watermark] wallclock_bound closes windows by the wall clock, and complete \
                 mode never closes one (it keeps every group and writes them all each batch): \
                 remove wallclock_bound, or use sink.mode = \"append\"",
            ));
        }
        match (&q.window, q.mode, &q.watermark) {
            (None, OutputMode::Append, _) => Err(self.sql_err(
                "sink.mode = \"append\" emits each group once, when it can no longer \
                 change, which only an event-time window closed by the watermark knows: \
                 group by window(<timestamp column>, '<size>') with [watermark], or set \
                 sink.mode = \"update\" (changed groups per batch) or \"complete\" (the \
                 whole result per batch)",
            )),
            (Some(w), OutputMode::Append, None) => Err(self.sql_err(format!(
                "{}({}, ...) in append mode needs [watermark] (column = \"{}\", delay = \
                 \"10 minutes\"): without it no window ever closes",
                w.name(),
                w.column,
                w.column
            ))),
            (Some(w), OutputMode::Update, _) if w.session => Err(self.sql_err(
                "session_window(...) in update mode is not supported (as in Spark: a \
                 session's bounds change as it merges, so an update could not say which \
                 earlier row it replaces): use sink.mode = \"append\" with [watermark], or \
                 \"complete\"",
            )),
            (Some(w), OutputMode::Update, _) if w.stagger => Err(self.sql_err(
                "stagger_window(...) in update mode is not supported: a key's windows are \
                 cut anew when a row with an earlier time arrives, so an update could not say \
                 which earlier row it replaces; use sink.mode = \"append\" with [watermark], \
                 or \"complete\"",
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
                "SELECT count(*) FROM trips GROUP BY stagger_window(tpep_pickup_datetime, '5 minutes')",
                update,
                "stagger_window(...) in update mode",
            ),
            (
                "SELECT count(*) FROM trips GROUP BY stagger_window(tpep_pickup_datetime, '5 minutes', '1 minute')",
                WM,
                "stagger_window(<timestamp column>, '<size>')",
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
        let bound = format!(
            "{WM}\nwallclock_bound = \"2 hours\"\n[sink]\nuri = \"out\"\nmode = \"complete\""
        );
        let e = op(pipeline(window, &bound))
            .analyse_stateful()
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("complete mode never closes one"), "{e}");
        let derived = "SELECT stagger_window.start, count(*) FROM (SELECT CAST(tpep_pickup_datetime AS TIMESTAMP) AS tpep_pickup_datetime FROM trips) GROUP BY stagger_window(tpep_pickup_datetime, '5 minutes')";
        let e = op(pipeline(derived, WM))
            .analyse_stateful()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("groups a derived table") && !e.contains("__window"),
            "{e}"
        );
        let other = "[watermark]\ncolumn = \"other\"\ndelay = \"1 minute\"";
        let e = op(pipeline(window, other))
            .analyse_stateful()
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("closes windows of its own column"), "{e}");
    }
}
