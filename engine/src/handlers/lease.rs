//! Every change a run makes to `control.json`, through one
//! compare-and-swap helper ([`swap_control`]): read, decide, write if
//! nothing changed in between, else decide again. The decisions themselves
//! are the checkpoint's pure functions.

use super::context::Context;
use super::payloads::{PlanOutcome, RunState};
use crate::checkpoint::{self, Control, RunStatus};
use crate::error::Result;

/// Read `control.json`, let `decide` say what to write (and what to return
/// once it is written), and write it with
/// compare-and-swap (create when absent); when another writer (a trigger,
/// a command) changed it in between, read and decide again.
pub(crate) async fn swap_control<T>(
    ctx: &Context,
    mut decide: impl FnMut(Option<&Control>) -> Result<(Control, T)>,
) -> Result<T> {
    for _ in 0..16 {
        let read = ctx.checkpoint.control().await?;
        let (next, value) = decide(read.as_ref().map(|(c, _)| c))?;
        let etag = read.as_ref().map(|(_, e)| e.as_str());
        if ctx.checkpoint.swap_control(&next, etag).await?.is_some() {
            return Ok(value);
        }
    }
    Err(ctx.conflict("control.json keeps changing under this run; it stops".into()))
}

/// `control` if the run with `epoch` still holds the lease in it.
fn owned<'a>(ctx: &Context, control: Option<&'a Control>, epoch: u64) -> Result<&'a Control> {
    match control {
        Some(c) if checkpoint::owns(c, epoch) => Ok(c),
        Some(c) => Err(ctx.conflict(format!(
            "this run (epoch {epoch}) lost the lease to epoch {} ({}); it stops without writing",
            c.epoch,
            c.owner.as_deref().unwrap_or_default()
        ))),
        None => Err(ctx.conflict("control.json is missing; this run stops".into())),
    }
}

/// Read control and check this run still holds `epoch`.
pub(crate) async fn owned_control(ctx: &Context, epoch: u64) -> Result<(Control, String)> {
    let read = ctx.checkpoint.control().await?;
    let c = owned(ctx, read.as_ref().map(|(c, _)| c), epoch)?.clone();
    Ok((c, read.map(|(_, e)| e).unwrap_or_default()))
}

/// Change control while this run holds `epoch`.
pub(crate) async fn update_control(
    ctx: &Context,
    epoch: u64,
    change: &(dyn Fn(&mut Control) + Send + Sync),
) -> Result<Control> {
    swap_control(ctx, |read| {
        let mut c = owned(ctx, read, epoch)?.clone();
        change(&mut c);
        Ok((c.clone(), c))
    })
    .await
}

/// Give the lease back (`Idle`) unless a trigger set `requested` since the
/// last discovery: then clear the flag and return `false`, and the run
/// discovers again. So every file that existed when a trigger returned is
/// seen by a discovery that started after it.
pub(crate) async fn release_idle(ctx: &Context, run: &RunState) -> Result<bool> {
    let now = ctx.now();
    let spec_hash = ctx.pipeline.spec_hash();
    let again = swap_control(ctx, |read| {
        let (mut c, again) = checkpoint::end_of_run(owned(ctx, read, run.epoch)?, now, &spec_hash);
        if !again {
            c.totals.runs += 1;
            c.totals.run_ends = c.totals.run_ends.plus(&super::usage::run_end(false));
            c.totals.run_end_requests = c.totals.run_end_requests.plus(&ending_requests(ctx));
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
    let end = super::usage::run_end(true);
    update_control(ctx, run.epoch, &|c| {
        c.status = RunStatus::Idle;
        c.requested = true;
        c.resume = true;
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
    update_control(ctx, run.epoch, &|c| c.heartbeat_ms = Some(now)).await?;
    Ok(())
}

/// Give the lease back with `status` (`Idle` once no planned batch is left
/// uncommitted). A run that fails otherwise keeps the lease: the next run
/// takes it over when the owner is gone or its heartbeat expired, and
/// recovers.
pub async fn release(ctx: &Context, run: &RunState, status: RunStatus) -> Result<()> {
    let now = ctx.now();
    let spec_hash = ctx.pipeline.spec_hash();
    update_control(ctx, run.epoch, &|c| {
        c.status = status;
        c.heartbeat_ms = Some(now);
        // pipeline.json holds this spec since the lease was taken.
        c.spec_hash = spec_hash.clone();
    })
    .await?;
    tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, "lease released");
    Ok(())
}
