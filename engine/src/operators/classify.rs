//! Which queries a micro-batch operator may run: those whose per-batch
//! results add up to the one-shot result.

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::LogicalPlan;

/// Why a plan's per-batch results would not add up to the one-shot result,
/// if they would not. A failed traversal is an error, never a pass.
pub(crate) fn not_batch_equivalent(plan: &LogicalPlan) -> Result<Option<String>, DataFusionError> {
    let mut reason = None;
    plan.apply_with_subqueries(|node| {
        let why = match node {
            LogicalPlan::Aggregate(_) | LogicalPlan::Distinct(_) => Some(
                "aggregation (GROUP BY, DISTINCT, count, sum, ...) over a micro-batch gives \
                 per-batch results, not the answer over all input",
            ),
            LogicalPlan::Window(_) => Some("window functions (OVER) see one micro-batch at a time"),
            LogicalPlan::Limit(_) => Some("LIMIT/OFFSET would apply to each micro-batch"),
            LogicalPlan::Join(_) => Some("joins see one micro-batch at a time"),
            LogicalPlan::RecursiveQuery(_) => Some("recursive queries are not supported"),
            LogicalPlan::Dml(_)
            | LogicalPlan::Ddl(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::Statement(_)
            | LogicalPlan::Explain(_)
            | LogicalPlan::Analyze(_)
            | LogicalPlan::DescribeTable(_) => Some("query.sql must be a SELECT query"),
            _ => None,
        };
        match why {
            Some(w) => {
                reason = Some(format!(
                    "{w}; use a row-by-row query (SELECT, WHERE, expressions, UNION ALL) until \
                     event-time windows land"
                ));
                Ok(TreeNodeRecursion::Stop)
            }
            None => Ok(TreeNodeRecursion::Continue),
        }
    })?;
    Ok(reason)
}
