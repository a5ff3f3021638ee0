//! Event-time windows as Spark spells them: `GROUP BY window(ts, '15
//! minutes')` (tumbling), `window(ts, '10 minutes', '5 minutes')`
//! (sliding), with `window.start` and `window.end` in the SELECT. The query
//! is rewritten to group by two columns, `__window_start` and
//! `__window_end`, that the engine adds to each input row ([`assign`]: one
//! copy of the row per window it falls in); DataFusion then runs it as any
//! GROUP BY. Session windows (`session_window(ts, '5 minutes')`, read as
//! `session_window.start` / `.end`) start as one window per row, `[t, t +
//! gap)`, and are merged with every other window of their key that
//! touches them ([`merge_sessions`], Spark's rule: a window starting at or
//! before a session's end joins it) wherever states meet: in a task over
//! its partial states, and in the merge over the state and the batch's
//! partials.

use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, UInt32Array};
use datafusion::arrow::compute::{cast, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, TimeUnit};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Ident, SetExpr, Statement,
    Value, visit_expressions_mut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::pipeline::duration_us;

/// The column holding each row's window start, added by [`assign`].
pub(crate) const WINDOW_START: &str = "__window_start";
/// The column holding each row's window end.
pub(crate) const WINDOW_END: &str = "__window_end";

/// A window of event time over a timestamp column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WindowSpec {
    /// The event-time column.
    pub column: String,
    /// Window length, microseconds.
    pub size_us: i64,
    /// Distance between window starts, microseconds (= size: tumbling).
    pub slide_us: i64,
    /// A session window: `size_us` is the gap; windows are `[t, t + gap)`
    /// per row, merged per key where they touch.
    pub session: bool,
    /// A stagger window: `size_us` is the length; a key's window opens at
    /// its first row's event time, and the first row of the key at or past
    /// the window's end opens the next ([`stagger_windows`]).
    pub stagger: bool,
}

impl WindowSpec {
    /// The function the query calls: `window`, `session_window` or
    /// `stagger_window`.
    pub(crate) fn name(&self) -> &'static str {
        if self.session {
            "session_window"
        } else if self.stagger {
            "stagger_window"
        } else {
            "window"
        }
    }
}

/// A query with its window, rewritten for DataFusion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Windowed {
    /// The SQL to run over the input with the window columns added.
    pub sql: String,
    /// The window, if the query groups by one.
    pub window: Option<WindowSpec>,
}

/// Find Spark's `window(...)` in the query's GROUP BY and rewrite the query
/// to group by [`WINDOW_START`] and [`WINDOW_END`] instead (and read
/// `window.start` / `window.end` from them). A query without one is
/// returned as it is. Refused with a message: two window functions, a
/// window whose arguments are not a column and literal durations, a slide
/// longer than the window, a session window.
pub(crate) fn rewrite(sql: &str) -> Result<Windowed, String> {
    // What this parser cannot read, DataFusion reports when it plans it.
    let Ok(mut statements) = Parser::parse_sql(&GenericDialect {}, sql) else {
        return Ok(Windowed {
            sql: sql.to_string(),
            window: None,
        });
    };
    let [Statement::Query(query)] = statements.as_mut_slice() else {
        return Ok(Windowed {
            sql: sql.to_string(),
            window: None,
        });
    };
    let SetExpr::Select(select) = query.body.as_mut() else {
        return Ok(Windowed {
            sql: sql.to_string(),
            window: None,
        });
    };
    let GroupByExpr::Expressions(keys, _) = &mut select.group_by else {
        return Ok(Windowed {
            sql: sql.to_string(),
            window: None,
        });
    };
    let mut found = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        if let Some(name) = window_call(k) {
            found.push((i, name));
        }
    }
    let Some((at, kind)) = found.first().cloned() else {
        return Ok(Windowed {
            sql: sql.to_string(),
            window: None,
        });
    };
    if found.len() > 1 {
        return Err(
            "the query groups by more than one window function: group by one window(...) \
             (Spark allows only one too)"
                .into(),
        );
    }
    let window = window_spec(&keys[at], &kind)?;
    // A session or stagger window's bounds are known only once its key's
    // windows are merged or cut, after the rows are grouped: a filter on
    // them would be pushed down to each row's own window and keep or drop
    // the wrong rows.
    if window.session || window.stagger {
        let mut filtered = false;
        for e in select.selection.iter().chain(select.having.iter()) {
            let _ = datafusion::sql::sqlparser::ast::visit_expressions(e, |e| {
                if let Expr::CompoundIdentifier(parts) = e
                    && parts.len() == 2
                    && parts[0].value.eq_ignore_ascii_case(&kind)
                {
                    filtered = true;
                }
                ControlFlow::<()>::Continue(())
            });
        }
        if filtered {
            return Err(format!(
                "{kind}.start and {kind}.end cannot be filtered on in WHERE or HAVING: a \
                 {kind}'s bounds are known only once its key's rows are grouped, and the \
                 filter would apply to each row's own window; select them and filter \
                 downstream"
            ));
        }
    }
    keys.splice(
        at..=at,
        [
            Expr::Identifier(Ident::new(WINDOW_START)),
            Expr::Identifier(Ident::new(WINDOW_END)),
        ],
    );
    // `window.start` and `window.end` (`session_window.start`, `.end`)
    // wherever the query names them.
    let _ = visit_expressions_mut(&mut statements, |e| {
        if let Expr::CompoundIdentifier(parts) = e
            && parts.len() == 2
            && parts[0].value.eq_ignore_ascii_case(&kind)
        {
            let column = match parts[1].value.to_ascii_lowercase().as_str() {
                "start" => Some(WINDOW_START),
                "end" => Some(WINDOW_END),
                _ => None,
            };
            if let Some(c) = column {
                *e = Expr::Identifier(Ident::new(c));
            }
        }
        ControlFlow::<()>::Continue(())
    });
    Ok(Windowed {
        sql: statements[0].to_string(),
        window: Some(window),
    })
}

/// `window` or `session_window` if `e` calls it.
fn window_call(e: &Expr) -> Option<String> {
    let Expr::Function(f) = e else {
        return None;
    };
    let name = f.name.to_string().to_ascii_lowercase();
    matches!(
        name.as_str(),
        "window" | "session_window" | "stagger_window"
    )
    .then_some(name)
}

/// The window a `window(col, 'size'[, 'slide'])`,
/// `session_window(col, 'gap')` or `stagger_window(col, 'size')` call
/// describes.
fn window_spec(e: &Expr, kind: &str) -> Result<WindowSpec, String> {
    let Expr::Function(f) = e else {
        unreachable!("a window call")
    };
    let session = kind == "session_window";
    let stagger = kind == "stagger_window";
    let usage = || match kind {
        "session_window" => session_usage(),
        "stagger_window" => stagger_usage(),
        _ => usage(),
    };
    let FunctionArguments::List(list) = &f.args else {
        return Err(usage());
    };
    let args: Vec<&Expr> = list
        .args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
            _ => Err(usage()),
        })
        .collect::<Result<_, _>>()?;
    let column = match args.first() {
        Some(Expr::Identifier(i)) => i.value.clone(),
        Some(Expr::CompoundIdentifier(parts)) => parts.last().expect("parts").value.clone(),
        _ => return Err(usage()),
    };
    let text = |e: &Expr| match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => Ok(s.clone()),
            _ => Err(usage()),
        },
        _ => Err(usage()),
    };
    let (size, slide) = match args.as_slice() {
        [_, _, _] if session || stagger => return Err(usage()),
        [_, size] => {
            let size = duration_us(&text(size)?).map_err(|e| format!("{e}; {}", usage()))?;
            (size, size)
        }
        [_, size, slide] => (
            duration_us(&text(size)?).map_err(|e| format!("{e}; {}", usage()))?,
            duration_us(&text(slide)?).map_err(|e| format!("{e}; {}", usage()))?,
        ),
        _ => return Err(usage()),
    };
    if slide > size {
        return Err(format!(
            "window(..., size, slide): the slide ({slide} us) is longer than the window \
             ({size} us), so some rows would fall in no window"
        ));
    }
    Ok(WindowSpec {
        column,
        size_us: size,
        slide_us: slide,
        session,
        stagger,
    })
}

fn stagger_usage() -> String {
    "write stagger_window(<timestamp column>, '<size>'), a size such as '10 minutes'".into()
}

fn session_usage() -> String {
    "write session_window(<timestamp column>, '<gap>'), a gap such as '5 minutes' (a gap \
     computed per row is not supported)"
        .into()
}

fn usage() -> String {
    "write window(<timestamp column>, '<duration>') or window(<column>, '<duration>', \
     '<slide>'), durations such as '15 minutes' or '1 hour 30 minutes'"
        .into()
}

/// Whether `spec`'s durations are whole numbers of the event-time
/// column's `unit`: a window of 1,500 ms over a seconds column would be
/// rounded to 1 s windows.
pub(crate) fn check_unit(spec: &WindowSpec, unit: &TimeUnit) -> Result<(), String> {
    let unit_us = match unit {
        TimeUnit::Second => 1_000_000,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond | TimeUnit::Nanosecond => 1,
    };
    let name = spec.name();
    for (what, us) in [("duration", spec.size_us), ("slide", spec.slide_us)] {
        if us <= 0 || us % unit_us != 0 {
            let unit_name = match unit {
                TimeUnit::Second => "seconds",
                TimeUnit::Millisecond => "milliseconds",
                TimeUnit::Microsecond => "microseconds",
                TimeUnit::Nanosecond => "nanoseconds",
            };
            return Err(format!(
                "{name}({}, ...): the {what} ({us} microseconds) is not a whole number of {unit_name}, \
                 the unit of the column, so windows would be rounded; use a {what} in whole \
                 {unit_name}, or declare the column with a finer unit in source.schema",
                spec.column
            ));
        }
    }
    Ok(())
}

/// `batch` with [`WINDOW_START`] and [`WINDOW_END`] added: each row once
/// per window of `spec` it falls in (tumbling: one; sliding: up to
/// size / slide), windows aligned to the Unix epoch as Spark aligns them.
/// A row whose event time is null falls in no window and is dropped.
pub(crate) fn assign(batch: &RecordBatch, spec: &WindowSpec) -> Result<RecordBatch, ArrowError> {
    let schema = batch.schema();
    let (i, field) = schema.column_with_name(&spec.column).ok_or_else(|| {
        ArrowError::InvalidArgumentError(format!("no column {} to window by", spec.column))
    })?;
    let DataType::Timestamp(unit, tz) = field.data_type() else {
        return Err(ArrowError::InvalidArgumentError(format!(
            "window({}, ...): the column is {}, not a timestamp: type it as timestamp \
             with source.schema_hints = {{ {} = \"timestamp\" }} (or in source.schema)",
            spec.column,
            crate::pipeline::types::type_name(field.data_type()),
            spec.column
        )));
    };
    check_unit(spec, unit).map_err(ArrowError::InvalidArgumentError)?;
    let per_us = |us: i64| -> i64 {
        match unit {
            TimeUnit::Second => us / 1_000_000,
            TimeUnit::Millisecond => us / 1_000,
            TimeUnit::Microsecond => us,
            TimeUnit::Nanosecond => us.saturating_mul(1_000),
        }
    };
    let (size, slide) = (per_us(spec.size_us), per_us(spec.slide_us));
    let ts = cast(batch.column(i), &DataType::Int64)?;
    let ts = ts.as_primitive::<Int64Type>();
    let mut rows: Vec<u32> = Vec::new();
    let mut starts: Vec<i64> = Vec::new();
    for r in 0..ts.len() {
        if ts.is_null(r) {
            continue;
        }
        let t = ts.value(r);
        if spec.session || spec.stagger {
            // `[t, t + gap)`, merged into sessions where states meet; or
            // `[t, t + size)`, cut into stagger windows where states meet.
            rows.push(r as u32);
            starts.push(t);
            continue;
        }
        // The last window start at or before t, then back by slides while
        // the window still covers t.
        let mut start = t - t.rem_euclid(slide);
        let mut mine = Vec::new();
        while start > t - size {
            mine.push(start);
            start -= slide;
        }
        for s in mine.into_iter().rev() {
            rows.push(r as u32);
            starts.push(s);
        }
    }
    // One window per row and no null event time: the rows as they are.
    let taken = if rows.len() == batch.num_rows() && (spec.session || spec.stagger || slide == size)
    {
        batch.clone()
    } else {
        take_record_batch(batch, &UInt32Array::from(rows))?
    };
    let ts_type = DataType::Timestamp(*unit, tz.clone());
    let start: ArrayRef = cast(&Int64Array::from(starts.clone()), &ts_type)?;
    let end: ArrayRef = cast(
        // (Saturating: a window past the last representable time ends
        // there rather than wrapping to the first.)
        &Int64Array::from(
            starts
                .iter()
                .map(|s| s.saturating_add(size))
                .collect::<Vec<_>>(),
        ),
        &ts_type,
    )?;
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(WINDOW_START, ts_type.clone(), false));
    fields.push(Field::new(WINDOW_END, ts_type, false));
    let mut columns = taken.columns().to_vec();
    columns.push(start);
    columns.push(end);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// `batch` (states: group keys, then the aggregates' state) with each
/// session window merged with the others of its key (the `keys` columns,
/// the window's own excluded) that it touches: sorted by key and start, a
/// window starting at or before the running session's end joins it and
/// extends it to its own end (Spark's `MergingSessionsIterator` rule).
/// Every row of a session gets the session's `start` and `end`; a
/// `PartialReduce` grouped by them then merges their states.
pub(crate) fn merge_sessions(
    batch: &RecordBatch,
    keys: &[usize],
    start: usize,
    end: usize,
) -> Result<RecordBatch, ArrowError> {
    cut_windows(batch, keys, start, end, Cut::Sessions)
}

/// `batch` (states, one row per key and event time: windows `[t, t +
/// size)`) with each row's window replaced by its stagger window: sorted by
/// key (the `keys` columns, the window's own excluded) and start, a key's
/// first row opens `[t, t + size)`, every row of the key that starts
/// before that end falls in it, and the first that starts at or past it
/// opens the next. The rows themselves are not merged: a row arriving
/// later with an earlier time cuts the key's windows anew, so the state
/// keeps one row per event time until its window is emitted.
pub(crate) fn stagger_windows(
    batch: &RecordBatch,
    keys: &[usize],
    start: usize,
    end: usize,
) -> Result<RecordBatch, ArrowError> {
    cut_windows(batch, keys, start, end, Cut::Stagger)
}

/// How [`cut_windows`] groups a key's windows, in order of start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// A window starting at or before the running session's end joins it
    /// and extends it to its own end.
    Sessions,
    /// A window starting before the open window's end falls in it; the
    /// open window keeps its bounds.
    Stagger,
}

/// `batch` with each row's window (columns `start`, `end`) replaced by the
/// window `cut` groups it into with the other windows of its key (the
/// `keys` columns), rows in their order.
fn cut_windows(
    batch: &RecordBatch,
    keys: &[usize],
    start: usize,
    end: usize,
    cut: Cut,
) -> Result<RecordBatch, ArrowError> {
    use datafusion::arrow::row::{RowConverter, SortField};
    let n = batch.num_rows();
    if n == 0 {
        return Ok(batch.clone());
    }
    let converter = RowConverter::new(
        keys.iter()
            .map(|i| SortField::new(batch.column(*i).data_type().clone()))
            .collect(),
    )?;
    let columns: Vec<ArrayRef> = keys.iter().map(|i| batch.column(*i).clone()).collect();
    let rows = converter.convert_columns(&columns)?;
    // Without a key (a window over the whole stream) every row is of one
    // key: the row format holds no row then.
    let key = |r: usize| {
        if keys.is_empty() {
            &[][..]
        } else {
            rows.row(r).data()
        }
    };
    let ty = batch.column(start).data_type().clone();
    let s = cast(batch.column(start), &DataType::Int64)?;
    let s = s.as_primitive::<Int64Type>();
    let e = cast(batch.column(end), &DataType::Int64)?;
    let e = e.as_primitive::<Int64Type>();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| key(a).cmp(key(b)).then(s.value(a).cmp(&s.value(b))));
    let (mut new_start, mut new_end) = (vec![0i64; n], vec![0i64; n]);
    let mut i = 0;
    while i < n {
        let first = order[i];
        let (from, mut to) = (s.value(first), e.value(first));
        let mut j = i + 1;
        while j < n && key(order[j]) == key(first) {
            let next = s.value(order[j]);
            match cut {
                Cut::Sessions if next <= to => to = to.max(e.value(order[j])),
                Cut::Stagger if next < to => {}
                _ => break,
            }
            j += 1;
        }
        for &r in &order[i..j] {
            new_start[r] = from;
            new_end[r] = to;
        }
        i = j;
    }
    let mut columns = batch.columns().to_vec();
    columns[start] = cast(&Int64Array::from(new_start), &ty)?;
    columns[end] = cast(&Int64Array::from(new_end), &ty)?;
    RecordBatch::try_new(batch.schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::TimestampMicrosecondArray;

    const TUMBLING: &str = r#"SELECT window.start AS window_start, window.end AS window_end, "PULocationID", count(*) AS trips, sum(total_amount) AS revenue, avg(trip_distance) AS avg_distance FROM trips GROUP BY window(tpep_pickup_datetime, '15 minutes'), "PULocationID""#;

    /// The sweep's cases: a stagger or session window without a key (over
    /// the whole stream) is cut as one key's (it panicked); a filter on
    /// its bounds in WHERE or HAVING is refused (it was applied to each
    /// row's own window, before the cut, and kept a window that does not
    /// exist); a window ending past the last representable time ends there.
    #[test]
    fn keyless_cuts_filters_on_merged_bounds_and_the_last_time() {
        let m = |minutes: i64| minutes * 60_000_000;
        let schema = Arc::new(Schema::new(vec![
            Field::new(WINDOW_START, DataType::Int64, false),
            Field::new(WINDOW_END, DataType::Int64, false),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![m(3), m(1), m(12)])),
                Arc::new(Int64Array::from(vec![m(13), m(11), m(22)])),
            ],
        )
        .unwrap();
        let bounds = |b: &RecordBatch| -> Vec<(i64, i64)> {
            let s = b.column(0).as_primitive::<Int64Type>();
            let e = b.column(1).as_primitive::<Int64Type>();
            (0..b.num_rows())
                .map(|i| (s.value(i) / m(1), e.value(i) / m(1)))
                .collect()
        };
        assert_eq!(
            bounds(&stagger_windows(&b, &[], 0, 1).unwrap()),
            [(1, 11), (1, 11), (12, 22)]
        );
        assert_eq!(
            bounds(&merge_sessions(&b, &[], 0, 1).unwrap()),
            [(1, 22), (1, 22), (1, 22)]
        );
        for (kind, clause) in [
            (
                "stagger_window",
                "HAVING stagger_window.end > TIMESTAMP '2024-01-01 00:21:00'",
            ),
            (
                "session_window",
                "HAVING session_window.start >= TIMESTAMP '2024-01-01 00:10:00'",
            ),
        ] {
            let sql = format!(
                "SELECT {kind}.start, count(*) FROM t GROUP BY {kind}(ts, '10 minutes'), k {clause}"
            );
            let e = rewrite(&sql).unwrap_err();
            assert!(
                e.contains("cannot be filtered on in WHERE or HAVING"),
                "{e}"
            );
            let sql = format!(
                "SELECT count(*) FROM t WHERE {kind}.start > TIMESTAMP '2024-01-01 00:10:00' \
                 GROUP BY {kind}(ts, '10 minutes')"
            );
            assert!(rewrite(&sql).is_err(), "{sql}");
        }
        // Tumbling windows' bounds are each row's: a filter on them stays.
        assert!(
            rewrite(
                "SELECT count(*) FROM t GROUP BY window(ts, '10 minutes') \
                 HAVING window.start > TIMESTAMP '2024-01-01 00:10:00'"
            )
            .is_ok()
        );
        let spec = WindowSpec {
            column: "ts".into(),
            size_us: 10,
            slide_us: 10,
            session: false,
            stagger: true,
        };
        let near = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            )])),
            vec![Arc::new(TimestampMicrosecondArray::from(vec![
                i64::MAX - 5,
            ]))],
        )
        .unwrap();
        let out = assign(&near, &spec).unwrap();
        let end = cast(out.column(2), &DataType::Int64).unwrap();
        assert_eq!(end.as_primitive::<Int64Type>().value(0), i64::MAX);
    }

    #[test]
    fn the_issues_tumbling_query_is_rewritten_to_group_by_window_columns() {
        let w = rewrite(TUMBLING).unwrap();
        assert_eq!(
            w.window,
            Some(WindowSpec {
                column: "tpep_pickup_datetime".into(),
                size_us: 15 * 60_000_000,
                slide_us: 15 * 60_000_000,
                session: false,
                stagger: false,
            })
        );
        assert!(
            w.sql
                .contains("SELECT __window_start AS window_start, __window_end AS window_end")
                && w.sql
                    .contains(r#"GROUP BY __window_start, __window_end, "PULocationID""#),
            "{}",
            w.sql
        );
        let sliding = rewrite(
            "SELECT window.start, count(*) FROM t GROUP BY window(ts, '10 minutes', '5 minutes')",
        )
        .unwrap();
        assert_eq!(sliding.window.unwrap().slide_us, 5 * 60_000_000);
        let session = rewrite(
            "SELECT session_window.start AS s, session_window.end AS e, k, count(*) FROM t \
             GROUP BY session_window(ts, '5 minutes'), k",
        )
        .unwrap();
        let spec = session.window.unwrap();
        assert!(spec.session && spec.size_us == 5 * 60_000_000, "{spec:?}");
        assert!(
            session
                .sql
                .contains("SELECT __window_start AS s, __window_end AS e, k")
                && session
                    .sql
                    .contains("GROUP BY __window_start, __window_end, k"),
            "{}",
            session.sql
        );
        let plain = rewrite("SELECT k, count(*) FROM t GROUP BY k").unwrap();
        assert_eq!(plain.window, None);
    }

    #[test]
    fn misuses_are_refused_with_what_to_write() {
        let two =
            rewrite("SELECT count(*) FROM t GROUP BY window(a, '1 hour'), window(b, '1 hour')")
                .unwrap_err();
        assert!(two.contains("more than one window"), "{two}");
        let session =
            rewrite("SELECT count(*) FROM t GROUP BY session_window(ts, '5 minutes', '1 minute')")
                .unwrap_err();
        assert!(
            session.contains("session_window(<timestamp column>, '<gap>')"),
            "{session}"
        );
        let unit = rewrite("SELECT count(*) FROM t GROUP BY window(ts, '1 month')").unwrap_err();
        assert!(unit.contains("unknown unit \"month\""), "{unit}");
        let slide =
            rewrite("SELECT count(*) FROM t GROUP BY window(ts, '5 minutes', '10 minutes')")
                .unwrap_err();
        assert!(slide.contains("slide"), "{slide}");
        assert_eq!(duration_us("1 hour 30 minutes").unwrap(), 5_400_000_000);
        assert_eq!(duration_us("500 ms").unwrap(), 500_000);
        // Written short (the first hour's ask), alone or run together.
        assert_eq!(duration_us("5m").unwrap(), 300_000_000);
        assert_eq!(duration_us("1h30m").unwrap(), 5_400_000_000);
        assert_eq!(duration_us("30s").unwrap(), 30_000_000);
        assert_eq!(duration_us("500ms").unwrap(), 500_000);
        assert_eq!(
            duration_us("2d 1h").unwrap(),
            2 * 86_400_000_000 + 3_600_000_000
        );
        assert!(duration_us("5").is_err());
        assert!(duration_us("m5").is_err());
        assert!(
            duration_us("5 fortnights")
                .unwrap_err()
                .contains("unknown unit")
        );
    }

    fn at(minute: i64, second: i64) -> i64 {
        (minute * 60 + second) * 1_000_000
    }

    /// Hand-computed: tumbling 15 minutes puts 00:14:59 in [00:00, 00:15)
    /// and 00:15:00 in [00:15, 00:30); sliding 10/5 puts 00:07:00 in
    /// [00:00, 00:10) and [00:05, 00:15), and 00:10:00 in [00:05, 00:15) and
    /// [00:10, 00:20); a null time is in no window; before 1970 works too.
    #[test]
    fn rows_fall_in_the_windows_spark_puts_them_in() {
        let times = TimestampMicrosecondArray::from(vec![
            Some(at(14, 59)),
            Some(at(15, 0)),
            None,
            Some(at(7, 0)),
            Some(at(10, 0)),
            Some(-at(1, 0)),
        ]);
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            times.data_type().clone(),
            true,
        )]));
        let b = RecordBatch::try_new(schema, vec![Arc::new(times)]).unwrap();
        let windows = |spec: &WindowSpec| -> Vec<(i64, i64, i64)> {
            let out = assign(&b, spec).unwrap();
            let col = |name: &str| {
                cast(out.column_by_name(name).unwrap(), &DataType::Int64)
                    .unwrap()
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            };
            let (t, s, e) = (col("ts"), col(WINDOW_START), col(WINDOW_END));
            (0..out.num_rows()).map(|r| (t[r], s[r], e[r])).collect()
        };
        let m = |minutes: i64| at(minutes, 0);
        let tumbling = WindowSpec {
            column: "ts".into(),
            size_us: m(15),
            slide_us: m(15),
            session: false,
            stagger: false,
        };
        assert_eq!(
            windows(&tumbling),
            [
                (at(14, 59), 0, m(15)),
                (m(15), m(15), m(30)),
                (m(7), 0, m(15)),
                (m(10), 0, m(15)),
                (-m(1), -m(15), 0),
            ]
        );
        let sliding = WindowSpec {
            column: "ts".into(),
            size_us: m(10),
            slide_us: m(5),
            session: false,
            stagger: false,
        };
        assert_eq!(
            windows(&sliding),
            [
                (at(14, 59), m(5), m(15)),
                (at(14, 59), m(10), m(20)),
                (m(15), m(10), m(20)),
                (m(15), m(15), m(25)),
                (m(7), 0, m(10)),
                (m(7), m(5), m(15)),
                (m(10), m(5), m(15)),
                (m(10), m(10), m(20)),
                (-m(1), -m(10), 0),
                (-m(1), -m(5), m(5)),
            ]
        );
        let e = assign(
            &RecordBatch::try_new(
                Arc::new(Schema::new(vec![Field::new("ts", DataType::Utf8, true)])),
                vec![Arc::new(datafusion::arrow::array::StringArray::from(vec![
                    "x",
                ]))],
            )
            .unwrap(),
            &tumbling,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a timestamp"), "{e}");
    }

    mod staged {
        use super::super::*;
        use crate::operators::aggregate::{Staged, session};
        use datafusion::arrow::array::{Float64Array, StringArray, TimestampMicrosecondArray};
        use datafusion::datasource::MemTable;
        use datafusion::physical_plan::collect;
        use proptest::prelude::*;

        fn batch(rows: &[(i64, u8, i8)]) -> RecordBatch {
            let schema = Arc::new(Schema::new(vec![
                Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
                Field::new("zone", DataType::Utf8, true),
                Field::new("amount", DataType::Float64, true),
            ]));
            let ts: TimestampMicrosecondArray = rows.iter().map(|r| Some(r.0)).collect();
            let zone: StringArray = rows
                .iter()
                .map(|r| Some(["a", "b"][r.1 as usize % 2]))
                .collect();
            let amount: Float64Array = rows.iter().map(|r| Some(r.2 as f64 / 4.0)).collect();
            RecordBatch::try_new(schema, vec![Arc::new(ts), Arc::new(zone), Arc::new(amount)])
                .unwrap()
        }

        use crate::operators::testing::render;

        async fn run(
            b: RecordBatch,
            sql: &str,
        ) -> (
            datafusion::prelude::SessionContext,
            Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        ) {
            let ctx = session(2);
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

        /// One chunk of rows as a task sees it: windows assigned, the
        /// query planned, its aggregate run `Partial`.
        async fn partials(
            rows: &[(i64, u8, i8)],
            w: &Windowed,
        ) -> (
            datafusion::prelude::SessionContext,
            Staged,
            Vec<RecordBatch>,
        ) {
            let spec = w.window.clone().unwrap();
            let (ctx, plan) = run(assign(&batch(rows), &spec).unwrap(), &w.sql).await;
            let staged = Staged::of(plan).unwrap().unwrap().with_window(Some(&spec));
            let partial = collect(staged.partial().unwrap(), ctx.task_ctx())
                .await
                .unwrap();
            (ctx, staged, partial)
        }

        /// Spark's spelling, staged over batches, against a one-shot
        /// DataFusion query that bins with `date_bin` (sliding: the union
        /// of the two bins each row falls in).
        async fn check(
            rows: &[(i64, u8, i8)],
            chunks: &[usize],
            sliding: bool,
        ) -> (Vec<String>, Vec<String>) {
            let window = if sliding {
                "'10 minutes', '5 minutes'"
            } else {
                "'15 minutes'"
            };
            let sql = format!(
                "SELECT window.start AS ws, window.end AS we, zone, count(*) AS n, sum(amount) AS s \
                 FROM t GROUP BY window(ts, {window}), zone"
            );
            let w = rewrite(&sql).unwrap();
            let mut states = Vec::new();
            let mut last = None;
            let mut at = 0;
            for size in chunks {
                let end = (at + size).min(rows.len());
                let (ctx, staged, partial) = partials(&rows[at..end], &w).await;
                at = end;
                states.extend(partial);
                last = Some((ctx, staged));
            }
            let (ctx, staged) = last.unwrap();
            let got = render(
                &collect(staged.finish(states).unwrap(), ctx.task_ctx())
                    .await
                    .unwrap(),
            );
            let origin = "TIMESTAMP '1970-01-01T00:00:00'";
            let oracle = if sliding {
                format!(
                    "SELECT ws, ws + INTERVAL '10 minutes' AS we, zone, count(*) AS n, sum(amount) AS s FROM (\
                     SELECT date_bin(INTERVAL '5 minutes', ts, {origin}) AS ws, zone, amount FROM t \
                     UNION ALL SELECT date_bin(INTERVAL '5 minutes', ts, {origin}) - INTERVAL '5 minutes' AS ws, zone, amount FROM t) \
                     GROUP BY ws, zone"
                )
            } else {
                format!(
                    "SELECT date_bin(INTERVAL '15 minutes', ts, {origin}) AS ws, \
                     date_bin(INTERVAL '15 minutes', ts, {origin}) + INTERVAL '15 minutes' AS we, \
                     zone, count(*) AS n, sum(amount) AS s FROM t GROUP BY 1, 2, 3"
                )
            };
            let ctx = datafusion::prelude::SessionContext::new();
            let all = batch(rows);
            let table = MemTable::try_new(all.schema(), vec![vec![all]]).unwrap();
            ctx.register_table("t", Arc::new(table)).unwrap();
            let want = render(&ctx.sql(&oracle).await.unwrap().collect().await.unwrap());
            (got, want)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(16))]
            #[test]
            fn windows_staged_over_batches_equal_date_bin_one_shot(
                rows in proptest::collection::vec((-3_600_000_000i64..7_200_000_000, 0u8..2, -20i8..20), 1..80),
                chunks in proptest::collection::vec(1usize..30, 1..5),
                sliding in any::<bool>(),
            ) {
                let rt = tokio::runtime::Runtime::new().unwrap();
                let mut chunks = chunks;
                let covered: usize = chunks.iter().sum();
                if covered < rows.len() {
                    chunks.push(rows.len() - covered);
                }
                let (got, want) = rt.block_on(check(&rows, &chunks, sliding));
                prop_assert_eq!(got, want);
            }
        }

        /// Session windows staged as the engine stages them (each chunk a
        /// task: one window per row, the task's sessions merged; then each
        /// chunk merged into the running state, as a merge step does)
        /// against a one-shot gaps-and-islands query in plain DataFusion
        /// SQL: a row starts a new session when it is more than the gap
        /// after the previous row of its zone; a session ends at its last
        /// row plus the gap.
        async fn check_sessions(
            rows: &[(i64, u8, i8)],
            chunks: &[usize],
        ) -> (Vec<String>, Vec<String>) {
            let sql = "SELECT session_window.start AS ws, session_window.end AS we, zone, \
                       count(*) AS n, sum(amount) AS s FROM t \
                       GROUP BY session_window(ts, '5 minutes'), zone";
            let w = rewrite(sql).unwrap();
            let mut state: Vec<RecordBatch> = Vec::new();
            let mut last = None;
            let mut at = 0;
            for size in chunks {
                let end = (at + size).min(rows.len());
                let (ctx, staged, partial) = partials(&rows[at..end], &w).await;
                at = end;
                let task = collect(
                    staged
                        .reduce(staged.merge_sessions(partial).unwrap())
                        .unwrap(),
                    ctx.task_ctx(),
                )
                .await
                .unwrap();
                state.extend(task);
                state = collect(
                    staged
                        .reduce(staged.merge_sessions(state).unwrap())
                        .unwrap(),
                    ctx.task_ctx(),
                )
                .await
                .unwrap();
                last = Some((ctx, staged));
            }
            let (ctx, staged) = last.unwrap();
            let got = render(
                &collect(staged.finish(state).unwrap(), ctx.task_ctx())
                    .await
                    .unwrap(),
            );
            let oracle = "SELECT min(ts) AS ws, max(ts) + INTERVAL '5 minutes' AS we, zone, \
                          count(*) AS n, sum(amount) AS s FROM (\
                            SELECT ts, zone, amount, sum(fresh) OVER (PARTITION BY zone ORDER BY ts \
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS session FROM (\
                              SELECT ts, zone, amount, CASE WHEN lag(ts) OVER (PARTITION BY zone ORDER BY ts) IS NULL \
                                OR ts > lag(ts) OVER (PARTITION BY zone ORDER BY ts) + INTERVAL '5 minutes' \
                                THEN 1 ELSE 0 END AS fresh FROM t)) \
                          GROUP BY zone, session";
            let ctx = datafusion::prelude::SessionContext::new();
            let all = batch(rows);
            let table = MemTable::try_new(all.schema(), vec![vec![all]]).unwrap();
            ctx.register_table("t", Arc::new(table)).unwrap();
            let want = render(&ctx.sql(oracle).await.unwrap().collect().await.unwrap());
            (got, want)
        }

        /// Hand-computed: gap 5 minutes, zone a at 00:00, 00:04, 00:09
        /// (each within 5 minutes of the last: one session [00:00,
        /// 00:14)), 00:20 (alone), and 00:25 exactly at the end of the
        /// 00:20 session, which joins it (Spark merges touching windows);
        /// zone b at 00:02 stays apart from zone a.
        #[tokio::test]
        async fn sessions_merge_where_windows_touch() {
            let m = |minutes: i64| minutes * 60_000_000;
            let rows = [
                (m(9), 0, 4),
                (m(0), 0, 4),
                (m(20), 0, 4),
                (m(2), 1, 4),
                (m(4), 0, 4),
                (m(25), 0, 4),
            ];
            let (got, want) = check_sessions(&rows, &[2, 1, 3]).await;
            assert_eq!(got, want);
            assert_eq!(
                got,
                [
                    "1970-01-01T00:00:00|1970-01-01T00:14:00|a|3|3.0",
                    "1970-01-01T00:02:00|1970-01-01T00:07:00|b|1|1.0",
                    "1970-01-01T00:20:00|1970-01-01T00:30:00|a|2|2.0",
                ]
            );
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(16))]
            #[test]
            fn sessions_staged_over_batches_equal_gaps_and_islands_one_shot(
                rows in proptest::collection::vec((0i64..7_200_000_000, 0u8..2, -20i8..20), 1..80),
                chunks in proptest::collection::vec(1usize..30, 1..5),
            ) {
                let rt = tokio::runtime::Runtime::new().unwrap();
                let mut chunks = chunks;
                let covered: usize = chunks.iter().sum();
                if covered < rows.len() {
                    chunks.push(rows.len() - covered);
                }
                let (got, want) = rt.block_on(check_sessions(&rows, &chunks));
                prop_assert_eq!(got, want);
            }
        }
    }
}
