//! The merge step of a stateful query: one per state partition, after the
//! batch's tasks and before its commit. It reads the partition's state in
//! force (the last commit's), the batch's partial states for the partition,
//! merges them under the output mode and the watermark in force, writes
//! what the batch emits as staged sink parts (published by the commit, like
//! a task's) and the partition's next state as a new state file, and leaves
//! its result for the committer (`work/N/merge-P-eE.json`). Every write is
//! under the batch's and the run's names, so a retried or re-run merge
//! rewrites the same files and the commit record names exactly one state
//! file per partition.

use serde::{Deserialize, Serialize};

use super::context::Context;
use super::payloads::RunState;
use crate::checkpoint::OutputFile;
use crate::error::{Error, ErrorClass, Result};
use crate::paths;
use crate::storage::{PutMode, RequestCounts, Store};
use datafusion::arrow::array::RecordBatch;

/// What the merge of one state partition of a batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeResult {
    /// The state partition.
    pub partition: u32,
    /// Staged sink parts with the rows it emitted.
    pub outputs: Vec<OutputFile>,
    /// Rows emitted.
    pub rows_out: u64,
    /// The partition's state after the batch (checkpoint key), if any.
    pub state: Option<String>,
    /// Groups in that state.
    pub state_rows: u64,
    /// The earliest window end in that state, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_close_us: Option<i64>,
    /// Billed duration of the merge's invocation, ms.
    pub millis: u64,
    /// The operator function's configured memory, MB.
    #[serde(default)]
    pub memory_mb: u64,
    /// Failed attempts of this merge's step before the one that wrote this.
    #[serde(default)]
    pub retries: u64,
    /// Storage requests it made, this result's write included.
    #[serde(default)]
    pub requests: RequestCounts,
}

/// Merge step: merge state partition `partition` of `batch`.
pub async fn merge(
    ctx: &Context,
    run: &RunState,
    batch: u64,
    partition: u32,
) -> Result<MergeResult> {
    let ctx = &ctx.counted();
    ctx.check_spec(run)?;
    let started = std::time::Instant::now();
    let p = &ctx.pipeline;
    let (off, before) = merging(ctx, run, batch).await?;
    let schema = match &off.schema {
        Some(v) => super::schema::arrow_of(ctx, v, paths::checkpoint::offsets(batch))?,
        None => ctx.schema().await?,
    };
    let (q, staged) = ctx
        .staged(schema, Some(&off.statics))
        .await?
        .ok_or_else(|| {
            ctx.broken(
                paths::checkpoint::offsets(batch),
                "a merge step for a query that does not aggregate",
            )
        })?;
    let (state, partials) = merge_inputs(ctx, run, &off, partition, &staged, &before).await?;
    let session = crate::operators::staging_session();
    let merged = crate::state::merge::merge(
        &session,
        &staged,
        state,
        partials,
        q.mode,
        before.watermark_us,
    )
    .await
    .map_err(|e| Error::Execution {
        pipeline: p.name.clone(),
        batch,
        task: None,
        message: format!("merging state partition {partition}: {e}"),
        class: ErrorClass::Fatal,
    })?;
    // A merge's parts are named as a task's, its partition the task (a
    // stateful query's tasks stage no parts of their own).
    let id = crate::checkpoint::TaskId {
        epoch: run.epoch,
        batch,
        task: partition,
    };
    let next_close_us = merged.next_close_us;
    let written = write_merged(ctx, id, &staged, merged).await?;
    // Every request of this invocation, and this result, written below.
    let mut requests = ctx.counts();
    requests.put += 1;
    let result = MergeResult {
        partition,
        rows_out: written.rows_out,
        outputs: written.outputs,
        state: written.state,
        state_rows: written.state_rows,
        next_close_us,
        millis: super::usage::billed_ms(started),
        memory_mb: crate::deploy::memory_mb(crate::deploy::OPERATOR),
        retries: super::usage::retries(),
        requests,
    };
    ctx.checkpoint
        .put_step_result(
            crate::checkpoint::PartitionStep::Merge,
            batch,
            partition,
            run.epoch,
            &result,
        )
        .await?;
    tracing::debug!(pipeline = %p.name, batch, partition, rows_out = result.rows_out, state_rows = result.state_rows, "merged");
    Ok(result)
}

/// The plan of the batch a merge of run `run` merges, and the state in
/// force: the last commit's, which for this batch is the one before it
/// (batches commit in order). Fenced: a run that lost its lease merges
/// nothing.
pub(super) async fn merging(
    ctx: &Context,
    run: &RunState,
    batch: u64,
) -> Result<(crate::checkpoint::Offsets, crate::checkpoint::StatefulState)> {
    let off = ctx
        .planned(
            batch,
            run.epoch,
            &format!("while run epoch {} merges it", run.epoch),
        )
        .await?;
    let (control, _) = ctx.checkpoint.owned_control(run.epoch).await?;
    super::commit::check_plan(ctx, &off, &control)?;
    if control.next_batch() != batch {
        return Err(ctx.broken(
            paths::checkpoint::offsets(batch),
            format!(
                "merge of batch {batch} while the last committed batch is {:?}",
                control.last_committed
            ),
        ));
    }
    Ok((off, control.stateful.clone().unwrap_or_default()))
}

/// What a merge of state partition `partition` merges: the partition's
/// state in force (`before`'s), and the partial states every task of the
/// batch wrote for it under this run.
async fn merge_inputs(
    ctx: &Context,
    run: &RunState,
    off: &crate::checkpoint::Offsets,
    partition: u32,
    staged: &crate::operators::Staged,
    before: &crate::checkpoint::StatefulState,
) -> Result<(Vec<RecordBatch>, Vec<RecordBatch>)> {
    let store = ctx.checkpoint.store();
    let mut state = Vec::new();
    if let Some(key) = before.state.get(partition as usize).cloned().flatten() {
        state = restore(ctx, store.as_ref(), staged, key).await?.0;
    }
    let mut partials = Vec::new();
    // A `[deduplicate]` pipeline's partial states are its Dedup steps',
    // made from the rows they kept; otherwise the tasks'.
    let mut files = Vec::new();
    if ctx.pipeline.deduplicate.is_some() {
        for q in crate::state::shape::partitions(&ctx.pipeline) {
            let d = super::dedup::finished(ctx, run, off.batch, q).await?;
            files.extend(d.partials);
        }
    } else {
        for t in &off.tasks {
            let id = crate::checkpoint::TaskId {
                epoch: run.epoch,
                batch: off.batch,
                task: t.task,
            };
            files.extend(super::operate::finished_task(ctx, run, id).await?.partials);
        }
    }
    for f in files.iter().filter(|f| f.partition == partition) {
        let obj = store
            .get(&f.key)
            .await?
            .ok_or_else(|| ctx.broken(f.key.clone(), "a task's partial states are missing"))?;
        let read = staged
            .read_state(&f.key, &obj.bytes)
            .map_err(|message| ctx.broken(f.key.clone(), message))?;
        partials.extend(read);
    }
    Ok((state, partials))
}

/// What a merge wrote.
struct Written {
    /// Staged sink parts with the rows it emitted.
    outputs: Vec<OutputFile>,
    /// Rows emitted.
    rows_out: u64,
    /// The partition's next state file, if the state holds any group.
    state: Option<String>,
    /// Groups in that state.
    state_rows: u64,
}

/// Stage what the merge of task-named `id` emits as sink parts (removing
/// parts an earlier attempt of this run left), and write the partition's
/// next state (`id.task` is the state partition).
async fn write_merged(
    ctx: &Context,
    id: crate::checkpoint::TaskId,
    staged: &crate::operators::Staged,
    merged: crate::state::merge::Merged,
) -> Result<Written> {
    let sink = &ctx.sink;
    let rows_out: u64 = merged.emit.iter().map(|b| b.num_rows() as u64).sum();
    let mut outputs = Vec::new();
    if rows_out > 0 {
        let schema = merged.emit[0].schema();
        let stream = crate::operators::batches_stream(schema.clone(), merged.emit);
        outputs = sink.write_partition(id, 0, schema, stream).await?;
    }
    sink.remove_stale_parts(id, &outputs).await?;
    let state_rows: u64 = merged.state.iter().map(|b| b.num_rows() as u64).sum();
    let state = if state_rows > 0 {
        let key = paths::checkpoint::state(id.task, id.batch, id.epoch);
        let bytes = staged
            .write_state(&merged.state)
            .map_err(|e| ctx.broken(key.clone(), e.to_string()))?;
        ctx.checkpoint
            .store()
            .put(&key, bytes.into(), PutMode::Overwrite)
            .await?;
        Some(key)
    } else {
        None
    };
    Ok(Written {
        outputs,
        rows_out,
        state,
        state_rows,
    })
}

/// Read and decode the state file `key` through `store`, checking it was
/// written by this query and this DataFusion version; also its size.
async fn restore(
    ctx: &Context,
    store: &dyn Store,
    staged: &crate::operators::Staged,
    key: String,
) -> Result<(Vec<datafusion::arrow::array::RecordBatch>, u64)> {
    let obj = store
        .get(&key)
        .await?
        .ok_or_else(|| ctx.broken(key.clone(), "the state in force is missing"))?;
    let batches = staged
        .read_state(&key, &obj.bytes)
        .map_err(|message| Error::Checkpoint {
            pipeline: ctx.pipeline.name.clone(),
            key,
            message,
        })?;
    Ok((batches, obj.bytes.len() as u64))
}

/// The state in force of a stateful pipeline, as a merge restores it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateSize {
    /// Partitions holding state.
    pub partitions: u32,
    /// Groups (open windows, or every group in complete mode).
    pub groups: u64,
    /// Bytes of the state files.
    pub bytes: u64,
}

/// Read and decode every partition's state in force, as the merges of the
/// next batch would (`sluice bench --query window` times this as the
/// restore; the query is planned once per context). A pipeline without
/// state gives zeros.
pub async fn restore_state(ctx: &Context) -> Result<StateSize> {
    let Some((control, _)) = ctx.checkpoint.control().await? else {
        return Ok(StateSize::default());
    };
    let Some(st) = control.stateful else {
        return Ok(StateSize::default());
    };
    let schema = match &control.schema {
        Some(v) => super::schema::arrow_of(ctx, v, paths::checkpoint::CONTROL.to_string())?,
        None => ctx.schema().await?,
    };
    let Some((_, staged)) = ctx.staged(schema, None).await? else {
        return Ok(StateSize::default());
    };
    let mut size = StateSize::default();
    for key in st.state.into_iter().flatten() {
        let (batches, bytes) = restore(ctx, ctx.checkpoint.store().as_ref(), &staged, key).await?;
        size.bytes += bytes;
        size.partitions += 1;
        size.groups += batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
    }
    Ok(size)
}
