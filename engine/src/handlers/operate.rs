//! The operate step: one task of a batch, its result left in the
//! checkpoint for the committer; a refused input left where `settle` finds
//! it.

use super::context::Context;
use super::payloads::{INLINE_RESULTS_BYTES, Refusal, RunState, TaskRequest};
use crate::checkpoint::{Control, TaskId};
use crate::error::{Error, Result};
use crate::operators::{SqlOperator, Task, TaskResult};
use crate::paths;

/// Operate step: run one task of a batch, and leave its result in the
/// checkpoint for the committer (`work/N/task-T-eE.json`).
pub async fn operate(ctx: &Context, run: &RunState, batch: u64, task: u32) -> Result<TaskResult> {
    Ok(operate_as(ctx, run, batch, task, false).await?.0)
}

/// [`operate`], as the operator function runs it: with `inline`, a task
/// of a batch the inline Map runs whose result fits its share of
/// [`INLINE_RESULTS_BYTES`] hands it back instead of writing it (the
/// state machine passes it to the commit; one PUT and one GET fewer).
/// Returns the result and whether it travels in the payload.
pub(super) async fn operate_as(
    ctx: &Context,
    run: &RunState,
    batch: u64,
    task: u32,
    inline: bool,
) -> Result<(TaskResult, bool)> {
    let started = std::time::Instant::now();
    let ctx = &ctx.counted();
    ctx.check_spec(run)?;
    let off = ctx
        .planned(
            batch,
            run.epoch,
            &format!("while run epoch {} operates on it", run.epoch),
        )
        .await?;
    let plan = off.tasks.iter().find(|t| t.task == task).ok_or_else(|| {
        ctx.broken(
            paths::checkpoint::offsets(batch),
            format!("has no task {task}"),
        )
    })?;
    // Fenced: a run that lost its lease writes nothing more. (What a task
    // of such a run still writes after this check stays staged, and is
    // never published: the commit publishes only what its record names.)
    let (control, etag) = ctx.checkpoint.owned_control(run.epoch).await?;
    super::commit::check_plan(ctx, &off, &control)?;
    beat_if_due(ctx, &control, &etag).await?;
    // The plan names the schema its batch reads with (plans of older
    // builds do not: `pipeline.json`'s).
    let schema = match &off.schema {
        Some(v) => super::schema::arrow_of(ctx, v, paths::checkpoint::offsets(batch))?,
        None => ctx.schema().await?,
    };
    // A first attempt has no earlier parts of its own to remove.
    let mut op = SqlOperator::new(ctx.pipeline.clone(), schema.clone())
        .with_retried(!super::usage::first_attempt());
    if !ctx.pipeline.statics.is_empty() {
        op = op.with_statics(off.statics.clone(), Some(ctx.static_stores()?));
    }
    // This invocation's context counts its requests (`ctx.counted()`).
    let sink = &ctx.sink;
    let id = TaskId {
        epoch: run.epoch,
        batch,
        task,
    };
    // A record stream's planned units, read into memory as the files the
    // operator scans (`discovery::Source::read_units`).
    let mut shard_reads = Vec::new();
    let (source, inputs, plan) = match &off.stream {
        Some(s) => {
            let read = crate::discovery::Source::of(&ctx.pipeline)
                .read_units(&ctx.pipeline, s, plan, &schema)
                .await?;
            op = op.with_shapes(read.shapes);
            shard_reads = read.shard_reads;
            (read.store, read.files, read.plan)
        }
        None => (ctx.source.clone(), off.inputs.clone(), plan.clone()),
    };
    let source = source.as_ref();
    let task = Task {
        id,
        inputs: &inputs,
        plan: &plan,
    };
    let q = op.stateful().await?;
    let dedup = op.deduplicating()?.cloned();
    let mut result = match (q, dedup) {
        (None, None) => op.run(source, sink, task).await?,
        (q, d) => {
            // The watermark in force is the last commit's: the batch
            // before this one (batches commit in order).
            if control.next_batch() != batch {
                return Err(ctx.broken(
                    paths::checkpoint::offsets(batch),
                    format!(
                        "task of batch {batch} while the last committed batch is {:?}",
                        control.last_committed
                    ),
                ));
            }
            let state = crate::operators::TaskState {
                watermark_us: crate::state::watermark::in_force(&control),
                partitions: ctx.pipeline.limits.state_partitions,
            };
            match (&q, &d) {
                (_, Some(_)) => {
                    op.run_dedup_partial(source, sink, &ctx.checkpoint, task, q.as_ref(), &state)
                        .await?
                }
                (Some(q), None) => {
                    op.run_partial(source, sink, &ctx.checkpoint, task, q, &state)
                        .await?
                }
                (None, None) => unreachable!("matched above"),
            }
        }
    };
    result.shard_reads = shard_reads;
    // Every request of this invocation (and the result's write below, if
    // it is written).
    result.requests = ctx.counts();
    result.millis = super::usage::billed_ms(started);
    result.cpu_ms = super::usage::invocation_cpu_ms();
    result.memory_mb = crate::deploy::memory_mb(crate::deploy::OPERATOR);
    result.retries = super::usage::retries();
    let tasks = off.tasks.len().max(1);
    let carried = inline
        && tasks as u64 <= ctx.pipeline.limits.max_inline_tasks
        && serde_json::to_vec(&result).map_or(usize::MAX, |b| b.len() + 64)
            <= INLINE_RESULTS_BYTES / tasks;
    if !carried {
        result.requests.put += 1;
        ctx.checkpoint.put_task_result(id, &result).await?;
    }
    tracing::debug!(pipeline = %ctx.pipeline.name, batch, task = id.task, rows = result.rows_out, carried, "task done");
    Ok((result, carried))
}

/// Renew the run's heartbeat from a task once a third of the TTL has
/// passed since the last one: between Plan and Commit only tasks run, and
/// a batch longer than the TTL must not look dead. At most one write per
/// third of the TTL (a task that loses the race to another writer leaves
/// it; the lease stays this run's, or the next step finds out).
async fn beat_if_due(ctx: &Context, control: &Control, etag: &str) -> Result<()> {
    let now = ctx.now();
    if now - control.heartbeat_ms.unwrap_or(0) < ctx.ttl_ms() / 3 {
        return Ok(());
    }
    let mut next = control.clone();
    next.heartbeat_ms = Some(now);
    ctx.checkpoint.swap_control(&next, Some(etag)).await?;
    Ok(())
}

/// Leave the refusal where `settle` finds it. Best effort: without it a
/// Distributed Map's failure keeps the lease instead of abandoning the batch
/// (the inline Map sees the error name itself).
pub(super) async fn record_refusal(ctx: &Context, req: &TaskRequest, e: &Error) {
    let r = Refusal {
        task: req.task,
        message: e.to_string(),
    };
    let id = TaskId {
        epoch: req.run.epoch,
        batch: req.batch,
        task: req.task,
    };
    if let Err(w) = ctx.checkpoint.put_refusal(id, &r).await {
        let key = paths::checkpoint::refusal(id.batch, id.task, id.epoch);
        tracing::warn!(key, error = %w, "could not record the task's refusal");
    }
}

/// The result task `id` handed back in `run` (the inline Map's answers)
/// or recorded; an error when it did not finish under its run.
pub(super) async fn finished_task(ctx: &Context, run: &RunState, id: TaskId) -> Result<TaskResult> {
    let TaskId { epoch, batch, task } = id;
    let carried = run
        .results
        .iter()
        .filter_map(|a| a.result.as_ref())
        .find(|r| r.task == task);
    if let Some(r) = carried {
        return Ok(r.clone());
    }
    match ctx.checkpoint.task_result(id).await? {
        Some(result) => Ok(result),
        None => Err(Error::Execution {
            pipeline: ctx.pipeline.name.clone(),
            batch,
            task: Some(task),
            message: format!(
                "no result at {}: the task did not finish under this run; run again",
                paths::checkpoint::work(batch, task, epoch)
            ),
            class: crate::error::ErrorClass::Fatal,
        }),
    }
}
