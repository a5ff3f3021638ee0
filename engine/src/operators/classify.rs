//! Which queries a micro-batch operator may run: those whose per-batch
//! results add up to the one-shot result. Accepted: projections, filters,
//! expressions, `UNION ALL` of branches that each read the input, derived
//! tables and CTEs over the input, and subqueries that do not read the
//! input (`x IN (SELECT 1)`, `IN (VALUES ...)`, a scalar subquery over
//! `generate_series`), and joins of the input with a relation that reads
//! no input (a static table, `[[static]]`: the same for every row of a
//! batch), inner, or outer/semi/anti with the input on the side kept
//! whole. Refused, by name: anything that combines rows across a batch
//! (aggregation, DISTINCT, windows, LIMIT, a join of the input with
//! itself, a FULL join or one that keeps the static side whole), a subquery over
//! the input (`IN`, `EXISTS`, scalar: each batch would see only its own
//! rows), and a branch that reads no input (`SELECT 1`, `VALUES`, a table
//! function such as `generate_series`, `UNION ALL SELECT 42.0`: its rows
//! would be emitted once per batch). The same holds for the input of a
//! stateful query's one aggregation: a branch that reads no input would be
//! counted once per batch.

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::LogicalPlan;

const ROW_BY_ROW: &str = "use a row-by-row query (SELECT, WHERE, expressions, UNION ALL of \
                          branches over the input, joins with static tables), or one GROUP BY \
                          (a stateful query: see docs/stateful.md)";

/// Why a plan's per-batch results would not add up to the one-shot result,
/// if they would not (`input`: the pipeline's table). A failed traversal is
/// an error, never a pass.
pub(crate) fn not_batch_equivalent(
    plan: &LogicalPlan,
    input: &str,
) -> Result<Option<String>, DataFusionError> {
    // Operators of the main query. (A subquery that reads the input is
    // refused below whatever it does; one that does not is the same in
    // every batch, so it may aggregate; so may the static side of a join.)
    let mut reason = stream_apply(plan, input, &mut |node| {
        Ok(operator_reason(node).map(str::to_string))
    })?;
    if reason.is_none() {
        reason = main_query_reason(plan, input)?;
    }
    Ok(reason.map(|w| format!("{w}; {ROW_BY_ROW}")))
}

/// Which side of a join reads the input (`true`: the left), when the
/// join gives, batch by batch, the rows the one-shot query gives: a join
/// of the input with a relation that reads no input (a static table's,
/// the same in every batch), where the join type keeps only the input's
/// side whole. `Err`: why not. `Ok(None)`: neither side reads input (its
/// leaves say why).
fn join_side(
    join: &datafusion::logical_expr::Join,
    input: &str,
) -> Result<Result<Option<bool>, String>, DataFusionError> {
    use datafusion::logical_expr::JoinType::*;
    let (left, right) = (
        reads_input(&join.left, input)?,
        reads_input(&join.right, input)?,
    );
    if left && right {
        return Ok(Err(
            "a join of the input with itself sees one micro-batch on each \
                       side, not all input; join the input with a static table \
                       ([[static]])"
                .into(),
        ));
    }
    if !left && !right {
        return Ok(Ok(None));
    }
    let kept_whole = match join.join_type {
        Inner => None,
        Left | LeftSemi | LeftAnti | LeftMark => Some(true),
        Right | RightSemi | RightAnti | RightMark => Some(false),
        Full => {
            return Ok(Err(
                "a FULL OUTER join with a static table would emit the static \
                           table's unmatched rows once per micro-batch; use an inner, left \
                           outer, semi or anti join with the input on the left"
                    .into(),
            ));
        }
    };
    Ok(match kept_whole {
        Some(input_kept) if input_kept != left => Err(format!(
            "a {} join keeps the static table's rows whole and would emit its unmatched rows \
             once per micro-batch; put the input on the {} side (or use an inner join)",
            join.join_type,
            if input_kept { "left" } else { "right" }
        )),
        _ => Ok(Some(left)),
    })
}

/// Visit the main query's nodes that process the input's rows, in
/// pre-order, until `f` gives a reason (returned): every node, except the
/// static side of a join of the input with a relation that reads no input
/// (the same in every batch, so it may aggregate), which is not entered.
/// A join that is not batch equivalent is itself the reason.
fn stream_apply(
    plan: &LogicalPlan,
    input: &str,
    f: &mut dyn FnMut(&LogicalPlan) -> Result<Option<String>, DataFusionError>,
) -> Result<Option<String>, DataFusionError> {
    if let LogicalPlan::Join(j) = plan {
        match join_side(j, input)? {
            Err(why) => return Ok(Some(why)),
            Ok(Some(left)) => {
                let stream = if left { &j.left } else { &j.right };
                return stream_apply(stream, input, f);
            }
            Ok(None) => {}
        }
    }
    if let Some(why) = f(plan)? {
        return Ok(Some(why));
    }
    for child in plan.inputs() {
        if let Some(why) = stream_apply(child, input, f)? {
            return Ok(Some(why));
        }
    }
    Ok(None)
}

/// How many aggregations process the input's rows: those of the main
/// query, not of a subquery or of a join's static side (the same in every
/// batch: a static table aggregated before the join is no GROUP BY of the
/// stream).
pub(crate) fn stream_aggregates(plan: &LogicalPlan, input: &str) -> Result<usize, DataFusionError> {
    let mut n = 0;
    stream_apply(plan, input, &mut |node| {
        if matches!(node, LogicalPlan::Aggregate(_)) {
            n += 1;
        }
        Ok(None)
    })?;
    Ok(n)
}

/// Why the main query (not its subqueries) would not add up: a leaf that
/// reads no input, or an expression holding a subquery that reads it.
fn main_query_reason(plan: &LogicalPlan, input: &str) -> Result<Option<String>, DataFusionError> {
    stream_apply(plan, input, &mut |node| {
        let mut reason = leaf_reason(node, input);
        if reason.is_none() {
            node.apply_subqueries(|sub| {
                if reads_input(sub, input)? {
                    reason = Some(
                        "a subquery over the input (IN, EXISTS or a scalar subquery) sees only \
                         its own micro-batch's rows, not all input"
                            .to_string(),
                    );
                }
                Ok(stop_if(&reason))
            })?;
        }
        Ok(reason)
    })
}

/// Why a leaf of the main query reads no input: its rows would be emitted
/// (or counted) once per micro-batch.
fn leaf_reason(node: &LogicalPlan, input: &str) -> Option<String> {
    match node {
        LogicalPlan::EmptyRelation(e) if e.produce_one_row => Some(
            "a SELECT without FROM (or a UNION ALL branch without one) emits its row once per \
             micro-batch"
                .to_string(),
        ),
        LogicalPlan::Values(_) => Some(
            "VALUES rows (or a UNION ALL branch of them) are emitted once per micro-batch"
                .to_string(),
        ),
        LogicalPlan::TableScan(t) if !is_input(t, input) => Some(format!(
            "{} reads no input: its rows (or a UNION ALL branch of them) are emitted once per \
             micro-batch",
            t.table_name
        )),
        _ => None,
    }
}

/// Why a stateful query's plan (one aggregation, which runs in stages)
/// would not give the one-shot answer, if it would not: the operators a
/// row-by-row query may not use, except the aggregation (joins with
/// static tables included, before it); a branch that reads no input
/// (counted once per batch); subqueries over the input.
pub(crate) fn not_stateful_equivalent(
    plan: &LogicalPlan,
    input: &str,
) -> Result<Option<String>, DataFusionError> {
    let reason = stream_apply(plan, input, &mut |node| {
        Ok(match node {
            LogicalPlan::Aggregate(_) => None,
            LogicalPlan::Distinct(_) => Some(
                "SELECT DISTINCT over a GROUP BY is a second aggregation; one GROUP BY per query"
                    .into(),
            ),
            LogicalPlan::Window(_) => Some(
                "window functions (OVER) are not supported in a stateful query; group by \
                 window(...) for event-time windows"
                    .into(),
            ),
            other => operator_reason(other).map(str::to_string),
        })
    })?;
    if reason.is_some() {
        return Ok(reason);
    }
    main_query_reason(plan, input)
}

fn operator_reason(node: &LogicalPlan) -> Option<&'static str> {
    match node {
        LogicalPlan::Aggregate(_) | LogicalPlan::Distinct(_) => Some(
            "aggregation (GROUP BY, DISTINCT, count, sum, ...) over a micro-batch gives \
             per-batch results, not the answer over all input",
        ),
        LogicalPlan::Window(_) => Some("window functions (OVER) see one micro-batch at a time"),
        LogicalPlan::Limit(_) => Some("LIMIT/OFFSET would apply to each micro-batch"),
        LogicalPlan::Join(_) => None,
        LogicalPlan::RecursiveQuery(_) => Some("recursive queries are not supported"),
        LogicalPlan::Dml(_)
        | LogicalPlan::Ddl(_)
        | LogicalPlan::Copy(_)
        | LogicalPlan::Statement(_)
        | LogicalPlan::Explain(_)
        | LogicalPlan::Analyze(_)
        | LogicalPlan::DescribeTable(_) => Some("query.sql must be a SELECT query"),
        _ => None,
    }
}

/// Whether scan `t` reads the pipeline's input table `input` (other scans
/// are table functions such as `generate_series`).
fn is_input(t: &datafusion::logical_expr::TableScan, input: &str) -> bool {
    // Parsed as `register_table` parses the name it is registered under.
    let input = datafusion::common::TableReference::from(input);
    t.table_name.table() == input.table() && t.table_name.schema() == input.schema()
}

/// Whether `plan` scans the input table.
fn reads_input(plan: &LogicalPlan, input: &str) -> Result<bool, DataFusionError> {
    let mut found = false;
    plan.apply_with_subqueries(|n| {
        found |= matches!(n, LogicalPlan::TableScan(t) if is_input(t, input));
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    Ok(found)
}

fn stop_if(reason: &Option<String>) -> TreeNodeRecursion {
    if reason.is_some() {
        TreeNodeRecursion::Stop
    } else {
        TreeNodeRecursion::Continue
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;

    use super::*;

    async fn verdict(sql: &str) -> Option<String> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("PULocationID", DataType::Int64, true),
            Field::new("DOLocationID", DataType::Int64, true),
            Field::new("fare_amount", DataType::Float64, true),
        ]));
        let ctx = SessionContext::new();
        let empty = MemTable::try_new(schema, vec![vec![]]).unwrap();
        ctx.register_table("trips", Arc::new(empty)).unwrap();
        let zones = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("zone", DataType::Utf8, true),
        ]));
        let empty = MemTable::try_new(zones, vec![vec![]]).unwrap();
        ctx.register_table("zones", Arc::new(empty)).unwrap();
        let plan = ctx.state().create_logical_plan(sql).await.unwrap();
        not_batch_equivalent(&plan, "trips").unwrap()
    }

    /// Joins of the input with a static table: those whose rows add up
    /// over batches pass; a self-join, a FULL join, and an outer join that
    /// keeps the static side whole are refused by name.
    #[tokio::test]
    async fn joins_with_static_tables_pass_when_the_input_side_is_kept_whole() {
        for sql in [
            "SELECT t.*, z.zone FROM trips t JOIN zones z ON t.\"PULocationID\" = z.id",
            "SELECT t.*, z.zone FROM zones z JOIN trips t ON t.\"PULocationID\" = z.id",
            "SELECT t.*, z.zone FROM trips t LEFT JOIN zones z ON t.\"PULocationID\" = z.id",
            "SELECT t.*, z.zone FROM zones z RIGHT JOIN trips t ON t.\"PULocationID\" = z.id",
            "SELECT * FROM trips t WHERE t.\"PULocationID\" IN (SELECT id FROM zones)",
            "SELECT * FROM trips t LEFT SEMI JOIN zones z ON t.\"PULocationID\" = z.id",
            "SELECT * FROM trips t LEFT ANTI JOIN zones z ON t.\"PULocationID\" = z.id",
            // The static side may aggregate: it is the same in every batch.
            "SELECT t.fare_amount, c.n FROM trips t JOIN (SELECT id, count(*) AS n FROM zones \
             GROUP BY id) c ON t.\"PULocationID\" = c.id",
            // Two static tables, one after the other.
            "SELECT t.fare_amount, a.zone, b.zone FROM trips t JOIN zones a ON \
             t.\"PULocationID\" = a.id LEFT JOIN zones b ON t.\"DOLocationID\" = b.id",
            "SELECT t.fare_amount, z.zone FROM trips t, zones z WHERE t.\"PULocationID\" = z.id",
        ] {
            assert_eq!(verdict(sql).await, None, "{sql}");
        }
        for (sql, says) in [
            (
                "SELECT * FROM trips a JOIN trips b ON a.\"PULocationID\" = b.\"DOLocationID\"",
                "with itself",
            ),
            (
                "SELECT * FROM trips t FULL JOIN zones z ON t.\"PULocationID\" = z.id",
                "FULL",
            ),
            (
                "SELECT * FROM zones z LEFT JOIN trips t ON t.\"PULocationID\" = z.id",
                "put the input on the left",
            ),
            (
                "SELECT * FROM trips t RIGHT JOIN zones z ON t.\"PULocationID\" = z.id",
                "put the input on the right",
            ),
            // A static table alone, or a branch of it, reads no input.
            ("SELECT * FROM zones", "reads no input"),
            (
                "SELECT fare_amount AS v FROM trips UNION ALL SELECT id AS v FROM zones",
                "reads no input",
            ),
            // Aggregation after the join combines rows across the batch.
            (
                "SELECT z.zone, count(*) FROM trips t JOIN zones z ON t.\"PULocationID\" = \
                 z.id GROUP BY z.zone",
                "aggregation",
            ),
        ] {
            let got = verdict(sql)
                .await
                .unwrap_or_else(|| panic!("passed: {sql}"));
            assert!(got.contains(says), "{sql}: {got}");
        }
    }

    async fn stateful_verdict(sql: &str) -> Option<String> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let ctx = SessionContext::new();
        let empty = MemTable::try_new(schema, vec![vec![]]).unwrap();
        ctx.register_table("t", Arc::new(empty)).unwrap();
        let plan = ctx.state().create_logical_plan(sql).await.unwrap();
        not_stateful_equivalent(&plan, "t").unwrap()
    }

    #[tokio::test]
    async fn row_by_row_queries_pass() {
        for sql in [
            "SELECT * FROM trips WHERE fare_amount > 1",
            "SELECT \"PULocationID\" * 2 AS x FROM trips",
            "SELECT fare_amount FROM trips UNION ALL SELECT fare_amount * 2 FROM trips",
            "WITH t AS (SELECT * FROM trips WHERE fare_amount > 1) SELECT * FROM t",
            "SELECT * FROM (SELECT fare_amount FROM trips) s WHERE fare_amount < 9",
            "SELECT * FROM trips WHERE \"PULocationID\" IN (SELECT 1)",
            "SELECT * FROM trips WHERE \"PULocationID\" IN (VALUES (1), (2))",
            "SELECT 1 AS one FROM trips",
            // A subquery that does not read the input: the same every batch.
            "SELECT fare_amount - (SELECT max(value) FROM generate_series(1, 10)) FROM trips",
            "SELECT * FROM trips WHERE \"PULocationID\" IN (SELECT value FROM range(3))",
        ] {
            assert_eq!(verdict(sql).await, None, "{sql}");
        }
    }

    /// The review's cases: table functions counted as input (3 constant
    /// rows added per batch; a query of nothing but `generate_series`
    /// emitting per batch), and stateful queries over a branch that reads
    /// no input (`('const', 2)` after two batches where the one-shot query
    /// gives 1).
    #[tokio::test]
    async fn branches_that_read_no_input_are_refused_in_both_kinds_of_query() {
        for sql in [
            "SELECT value FROM generate_series(1, 3)",
            "SELECT \"PULocationID\" AS id, fare_amount AS v FROM trips UNION ALL SELECT value \
             AS id, 0 AS v FROM generate_series(1, 3)",
            "SELECT * FROM range(5)",
        ] {
            let got = verdict(sql)
                .await
                .unwrap_or_else(|| panic!("passed: {sql}"));
            assert!(got.contains("reads no input"), "{sql}: {got}");
        }
        for (sql, says) in [
            (
                "SELECT k, count(*) FROM (SELECT k FROM t UNION ALL SELECT 'const') GROUP BY k",
                "without FROM",
            ),
            (
                "SELECT k, count(*) FROM (SELECT k FROM t UNION ALL VALUES ('const')) GROUP BY k",
                "VALUES",
            ),
            (
                "SELECT value % 2 AS k, count(*) FROM generate_series(1, 10) GROUP BY value % 2",
                "reads no input",
            ),
        ] {
            let got = stateful_verdict(sql)
                .await
                .unwrap_or_else(|| panic!("passed: {sql}"));
            assert!(got.contains(says), "{sql}: {got}");
        }
        assert_eq!(
            stateful_verdict("SELECT k, count(*) FROM t GROUP BY k").await,
            None
        );
        // Enrich, then group: a join with a relation that reads no input.
        assert_eq!(
            stateful_verdict(
                "SELECT s.name, count(*) FROM t JOIN (VALUES ('a', 'A')) s(k, name) ON t.k = s.k \
                 GROUP BY s.name"
            )
            .await,
            None
        );
        let got =
            stateful_verdict("SELECT a.k, count(*) FROM t a JOIN t b ON a.k = b.k GROUP BY a.k")
                .await
                .expect("a self-join is refused");
        assert!(got.contains("itself"), "{got}");
        assert_eq!(
            stateful_verdict(
                "SELECT k, sum(v) FROM (SELECT k, v FROM t UNION ALL SELECT k, v * 2 FROM t) \
                 GROUP BY k"
            )
            .await,
            None
        );
    }

    /// The review's queries: each gave other rows than the one-shot query
    /// (11,765 vs 12,000; 7,491 vs 7,499; rows once per batch).
    #[tokio::test]
    async fn queries_that_are_not_batch_equivalent_are_refused_by_name() {
        for (sql, says) in [
            (
                "SELECT * FROM trips WHERE \"PULocationID\" IN \
                 (SELECT \"DOLocationID\" FROM trips WHERE fare_amount > 50)",
                "subquery over the input",
            ),
            (
                "SELECT * FROM trips t WHERE EXISTS (SELECT 1 FROM trips u \
                 WHERE u.\"DOLocationID\" = t.\"PULocationID\")",
                "subquery over the input",
            ),
            (
                "SELECT fare_amount - (SELECT min(fare_amount) FROM trips) FROM trips",
                "subquery over the input",
            ),
            ("SELECT 1", "without FROM"),
            ("VALUES (1, 2)", "VALUES"),
            (
                "SELECT fare_amount FROM trips UNION ALL SELECT 42.0",
                "without FROM",
            ),
            (
                "SELECT fare_amount FROM trips UNION ALL VALUES (42.0)",
                "VALUES",
            ),
            ("SELECT count(*) FROM trips", "aggregation"),
            ("SELECT DISTINCT fare_amount FROM trips", "aggregation"),
            ("SELECT * FROM trips LIMIT 3", "LIMIT"),
            (
                "SELECT row_number() OVER (ORDER BY fare_amount) FROM trips",
                "window",
            ),
        ] {
            let got = verdict(sql)
                .await
                .unwrap_or_else(|| panic!("passed: {sql}"));
            assert!(got.contains(says), "{sql}: {got}");
        }
    }
}
