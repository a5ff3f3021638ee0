//! A stateful query's state, between its batches: the rules the run's
//! steps apply to it, with no I/O of their own.
//!
//! - [`shape`]: is the query stateful, and in what shape (computed once
//!   per plan from the query and the schema the batch reads, carried in
//!   the plan, and compared with the shape the state was built under);
//! - [`watermark`]: the watermark in force, how a batch advances it, and
//!   when a batch with no input is owed to close windows;
//! - [`merge`]: one state partition's merge of the last state and a
//!   batch's partial states under the output mode.
//!
//! The partial aggregation a task runs, and the event-time filter that
//! drops late rows as a task reads, are operators (`operators/`): they run
//! inside a task's scan. The merge handler (`handlers`) reads and writes
//! the state files; the commit names them.

pub(crate) mod dedup;
pub(crate) mod merge;
pub(crate) mod shape;
pub(crate) mod watermark;
