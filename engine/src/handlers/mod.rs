//! The steps of a run, shared by the local runner and the Lambda
//! functions: each entry point takes its dependencies as a [`Context`] and
//! a request payload, and returns a payload.
//!
//! - [`handle_plan`] (`plan`): claim the lease, recover what a dead run
//!   left, resume a planned batch or discover and plan new input;
//! - [`handle_task`] (`operate`): run one task of a batch;
//! - [`handle_commit`] (`commit`): make a batch visible and advance the
//!   checkpoint, or abandon / settle a batch whose input was refused;
//! - `lease`: every change of `control.json` a run makes, through one
//!   compare-and-swap helper.
//!
//! Payloads between steps (`payloads`) carry references only; data and
//! plans live in storage.

mod commit;
mod context;
mod dedup;
mod lease;
mod merge;
mod operate;
mod ownership;
mod payloads;
mod plan;
mod schema;
mod state;
pub(crate) mod usage;

pub(crate) use commit::abandon;
pub use commit::commit;
pub use context::{Context, Contexts};
pub use dedup::{DedupResult, dedup, restore_dedup_state};
pub use lease::{heartbeat, release};
pub use merge::{MergeResult, StateSize, merge, restore_state};
pub use operate::operate;
pub(crate) use ownership::check_sink_ownership;
pub use payloads::{
    BatchRef, CommitAction, CommitRequest, CommitSummary, PlanOutcome, PlanRequest, Refusal,
    RunState, TaskAck, TaskList, TaskRequest,
};
pub use plan::plan;
pub(crate) use schema::{HintCheck, arrow_of, check_against_hints, in_force, resolve_schema};
pub(crate) use state::check_state_shape;

use crate::error::{ErrorClass, Result};
use commit::settle;
use operate::record_refusal;

/// A boxed handler future. Boxing here, where lifetimes are concrete, lets
/// callers that need `Send` for every lifetime (the state machine's task
/// invoker) hold it: rustc cannot prove that through nested async fns.
pub(crate) type HandlerFuture<'a, T> = futures::future::BoxFuture<'a, Result<T>>;

/// The planner function's entry point.
pub fn handle_plan(ctx: &Context, req: PlanRequest) -> HandlerFuture<'_, PlanOutcome> {
    Box::pin(async move {
        let now = ctx.now();
        usage::timed(req.retries, async move {
            ctx.check_pipeline(&req.pipeline)?;
            let ctx = &ctx.counted();
            // (Boxed: a debug build's plan future is large, and moving it
            // into the scope below would copy it through the stack.)
            let planned = Box::pin(plan(ctx, req.run.clone()));
            let mut outcome = usage::in_execution(&req, now, planned).await?;
            // The invocation that hands out a batch is billed to it (the
            // commit reads this from the run it is given).
            if let PlanOutcome::Batch { run, .. } = &mut outcome {
                run.plan_ms = usage::invocation_ms();
                run.plan_cpu_ms = usage::invocation_cpu_ms();
                run.plan_memory_mb = crate::deploy::memory_mb(crate::deploy::PLANNER);
                run.plan_requests = ctx.counts();
                run.plan_retries = req.retries;
            }
            Ok(outcome)
        })
        .await
    })
}

/// The operator function's entry point.
pub fn handle_task(ctx: &Context, req: TaskRequest) -> HandlerFuture<'_, TaskAck> {
    Box::pin(usage::timed(req.retries, async move {
        ctx.check_pipeline(&req.pipeline)?;
        if let Some(partition) = req.dedup {
            let d = dedup(ctx, &req.run, req.batch, partition).await?;
            return Ok(TaskAck {
                task: partition,
                rows_out: d.rows_out,
                files: d.outputs.len() as u64,
                result: None,
            });
        }
        if let Some(partition) = req.merge {
            let m = merge(ctx, &req.run, req.batch, partition).await?;
            return Ok(TaskAck {
                task: partition,
                rows_out: m.rows_out,
                files: m.outputs.len() as u64,
                result: None,
            });
        }
        let (r, carried) =
            match operate::operate_as(ctx, &req.run, req.batch, req.task, req.carry).await {
                Ok(r) => r,
                Err(e) => {
                    if e.class() == ErrorClass::InvalidInput {
                        record_refusal(ctx, &req, &e).await;
                    }
                    return Err(e);
                }
            };
        Ok(TaskAck {
            task: r.task,
            rows_out: r.rows_out,
            files: r.outputs.len() as u64,
            result: carried.then_some(r),
        })
    }))
}

/// The committer function's entry point.
pub fn handle_commit(ctx: &Context, req: CommitRequest) -> HandlerFuture<'_, CommitSummary> {
    let now = ctx.now();
    Box::pin(usage::timed(req.retries, async move {
        ctx.check_pipeline(&req.pipeline)?;
        match req.action {
            CommitAction::Commit => {
                let committed =
                    usage::in_commit(&req, now, commit::commit_as(ctx, &req.run, req.batch));
                let (record, ended) = committed.await?;
                Ok(CommitSummary {
                    ended,
                    pipeline: req.pipeline.clone(),
                    // (The batch's task answers are not the next one's.)
                    run: Some(RunState {
                        results: Vec::new(),
                        ..req.run.clone()
                    }),
                    ..CommitSummary::from(&record)
                })
            }
            CommitAction::Abandon => {
                abandon(ctx, &req.run, req.batch).await?;
                Ok(CommitSummary {
                    batch: req.batch,
                    ..CommitSummary::default()
                })
            }
            CommitAction::Settle => Err(settle(ctx, &req.run, req.batch).await),
        }
    }))
}
