//! The run's own changes of the lease: hand-over, heartbeat, release. Each
//! goes through the checkpoint's one compare-and-swap loop on
//! `control.json` (`Checkpoint::change_control`); the decisions themselves
//! are the checkpoint's pure functions.

use super::context::Context;
use super::payloads::{PlanOutcome, RunState};
use crate::checkpoint::{self, RunStatus};
use crate::error::Result;

/// Give the lease back (`Idle`) unless a trigger set `requested` since the
/// last discovery: then clear the flag and return `false`, and the run
/// discovers again. So every file that existed when a trigger returned is
/// seen by a discovery that started after it.
pub(crate) async fn release_idle(ctx: &Context, run: &RunState) -> Result<bool> {
    let now = ctx.now();
    let spec_hash = ctx.pipeline.spec_hash();
    let again = ctx
        .checkpoint
        .change_control(|read| {
            let (mut c, again) =
                checkpoint::end_of_run(ctx.checkpoint.owned(read, run.epoch)?, now, &spec_hash);
            if !again {
                let end = super::usage::run_end(false, now);
                let requests = ending_requests(ctx);
                c.totals.runs += 1;
                c.totals.run_ends = c.totals.run_ends.plus(&end);
                c.totals.run_end_requests = c.totals.run_end_requests.plus(&requests);
                c.totals.plan_ends += 1;
                c.totals.plan_end_usage = c.totals.plan_end_usage.plus(&end);
                c.totals.plan_end_requests = c.totals.plan_end_requests.plus(&requests);
                if run.batches == 0 {
                    c.totals.idle_runs += 1;
                    c.totals.idle_ends = c.totals.idle_ends.plus(&end);
                    c.totals.idle_end_requests = c.totals.idle_end_requests.plus(&requests);
                }
            }
            Ok((c, again))
        })
        .await?;
    if again {
        tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, "a trigger asked again; discovering once more");
    } else {
        tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, "lease released");
    }
    Ok(!again)
}

/// End this execution at its batch budget: give the lease back with
/// `requested` set, so whoever wakes the pipeline next (the state machine's
/// Continue step, or any event) starts the execution that resumes the
/// batches already planned.
pub(crate) async fn continue_run(ctx: &Context, run: RunState) -> Result<PlanOutcome> {
    let now = ctx.now();
    let end = super::usage::run_end(true, now);
    ctx.checkpoint
        .update_control(run.epoch, &|c| {
            c.status = RunStatus::Idle;
            c.requested = true;
            c.resume = true;
            // A stream's end this run captured holds for its next
            // execution. (An end a dead run captured does not: this run
            // took over and hands over before it looked, as an Express
            // execution does with a batch left unfinished; the next
            // execution finishes the batch and looks anew.)
            if let Some(u) = c.stream_until.as_mut().filter(|u| u.epoch == run.epoch) {
                u.handed_over = true;
            }
            c.heartbeat_ms = Some(now);
            c.totals.runs += 1;
            c.totals.run_ends = c.totals.run_ends.plus(&end);
            c.totals.run_end_requests = c.totals.run_end_requests.plus(&ending_requests(ctx));
        })
        .await?;
    tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, batches = run.batches, events = run.events, "batch or history budget of this execution used; handing over");
    Ok(PlanOutcome::Continue { run })
}

/// The requests of the Plan invocation that ends a run (its context counts
/// its own), this control write included.
fn ending_requests(ctx: &Context) -> crate::storage::RequestCounts {
    let mut r = ctx.counts();
    r.put_update += 1;
    r
}

/// Refresh this run's heartbeat, proving it still holds `run.epoch`.
pub async fn heartbeat(ctx: &Context, run: &RunState) -> Result<()> {
    let now = ctx.now();
    ctx.checkpoint
        .update_control(run.epoch, &|c| c.heartbeat_ms = Some(now))
        .await?;
    Ok(())
}

/// Give the lease back with `status` (`Idle` once no planned batch is left
/// uncommitted). A run that fails otherwise keeps the lease: the next run
/// takes it over when the owner is gone or its heartbeat expired, and
/// recovers.
pub async fn release(ctx: &Context, run: &RunState, status: RunStatus) -> Result<()> {
    let now = ctx.now();
    let spec_hash = ctx.pipeline.spec_hash();
    ctx.checkpoint
        .update_control(run.epoch, &|c| {
            c.status = status;
            c.heartbeat_ms = Some(now);
            // pipeline.json holds this spec since the lease was taken.
            c.spec_hash = spec_hash.clone();
        })
        .await?;
    tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, "lease released");
    Ok(())
}
