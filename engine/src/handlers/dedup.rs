//! The Dedup step of a `[deduplicate]` pipeline: one per state partition,
//! after the batch's tasks and before its merges (a stateful query) or its
//! commit. It reads the partition's keys seen in force (the last commit's)
//! and the rows every task wrote for the partition, keeps each key's first
//! row (`crate::state::dedup`), runs the query over the kept rows, writes
//! the partition's next keys seen, and leaves its result for the committer
//! (`work/N/dedup-P-eE.json`). Every write is under the batch's and the
//! run's names, so a retried or re-run step rewrites the same files and
//! the commit names exactly one state file per partition; a run that lost
//! its lease is refused before it writes.

use serde::{Deserialize, Serialize};

use super::context::Context;
use super::payloads::RunState;
use crate::checkpoint::{OutputFile, PartitionStep, TaskId};
use crate::error::{Error, ErrorClass, Result};
use crate::operators::PartialFile;
use crate::paths;
use crate::state::dedup::Expiry;
use crate::storage::{PutMode, RequestCounts};

/// What the Dedup step of one partition of a batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupResult {
    /// The state partition.
    pub partition: u32,
    /// A row-by-row query: staged sink parts with the rows it wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<OutputFile>,
    /// Rows written.
    pub rows_out: u64,
    /// A stateful query: the partial states of the kept rows, per state
    /// partition, for the Merge map.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partials: Vec<PartialFile>,
    /// The partition's keys seen after the batch (checkpoint key), if any.
    pub state: Option<String>,
    /// Keys in that state.
    pub keys: u64,
    /// Rows kept.
    pub kept: u64,
    /// Rows dropped as duplicates.
    pub dropped: u64,
    /// The earliest expiry in that state, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_expiry_us: Option<i64>,
    /// Billed duration of the invocation, ms.
    pub millis: u64,
    /// The operator function's configured memory, MB.
    #[serde(default)]
    pub memory_mb: u64,
    /// Failed attempts of this step before the one that wrote this.
    #[serde(default)]
    pub retries: u64,
    /// Storage requests it made, this result's write included.
    #[serde(default)]
    pub requests: RequestCounts,
}

/// The result the Dedup step of `partition` of `batch` recorded under
/// this run; an error when it did not finish under it.
pub(super) async fn finished(
    ctx: &Context,
    run: &RunState,
    batch: u64,
    partition: u32,
) -> Result<DedupResult> {
    match ctx
        .checkpoint
        .step_result::<DedupResult>(PartitionStep::Dedup, batch, partition, run.epoch)
        .await?
    {
        Some(r) => Ok(r),
        None => Err(Error::Execution {
            pipeline: ctx.pipeline.name.clone(),
            batch,
            task: None,
            message: format!(
                "no result at {}: the Dedup step of state partition {partition} did not finish \
                 under this run; run again",
                paths::checkpoint::dedup(batch, partition, run.epoch)
            ),
            class: ErrorClass::Fatal,
        }),
    }
}

/// Dedup step: deduplicate state partition `partition` of `batch`.
pub async fn dedup(
    ctx: &Context,
    run: &RunState,
    batch: u64,
    partition: u32,
) -> Result<DedupResult> {
    let ctx = &ctx.counted();
    ctx.check_spec(run)?;
    let started = std::time::Instant::now();
    let p = &ctx.pipeline;
    let d = p.deduplicate.clone().ok_or_else(|| {
        ctx.broken(
            paths::checkpoint::offsets(batch),
            "a Dedup step for a pipeline without [deduplicate]",
        )
    })?;
    let (off, before) = super::merge::merging(ctx, run, batch).await?;
    let schema = match &off.schema {
        Some(v) => super::schema::arrow_of(ctx, v, paths::checkpoint::offsets(batch))?,
        None => ctx.schema().await?,
    };
    let store = ctx.checkpoint.store();
    let state_schema = crate::state::dedup::state_schema(&schema, &d.key)
        .map_err(|e| ctx.broken(paths::checkpoint::offsets(batch), e.to_string()))?;
    let mut state = Vec::new();
    if let Some(key) = before.dedup.get(partition as usize).cloned().flatten() {
        let obj = store
            .get(&key)
            .await?
            .ok_or_else(|| ctx.broken(key.clone(), "the keys seen in force are missing"))?;
        let read = crate::operators::aggregate::from_ipc(&obj.bytes)
            .map_err(|e| ctx.broken(key.clone(), e.to_string()))?;
        if read.iter().any(|b| b.schema() != state_schema) {
            return Err(Error::Checkpoint {
                pipeline: p.name.clone(),
                key,
                message: "the keys seen were written for other key columns or types: run \
                          `sluice reset` to start over"
                    .into(),
            });
        }
        state = read;
    }
    let mut partials = Vec::new();
    for t in &off.tasks {
        let id = TaskId {
            epoch: run.epoch,
            batch,
            task: t.task,
        };
        let result = super::operate::finished_task(ctx, run, id).await?;
        for f in result.partials.iter().filter(|f| f.partition == partition) {
            let obj = store
                .get(&f.key)
                .await?
                .ok_or_else(|| ctx.broken(f.key.clone(), "a task's rows are missing"))?;
            partials.extend(
                crate::operators::aggregate::from_ipc(&obj.bytes)
                    .map_err(|e| ctx.broken(f.key.clone(), e.to_string()))?,
            );
        }
    }
    let failed = |e: &dyn std::fmt::Display| Error::Execution {
        pipeline: p.name.clone(),
        batch,
        task: None,
        message: format!("deduplicating state partition {partition}: {e}"),
        class: ErrorClass::Fatal,
    };
    let deduped = crate::state::dedup::dedup(
        &schema,
        &d.key,
        state,
        partials,
        Expiry {
            event: p
                .watermark
                .as_ref()
                .map(|w| (w.column.as_str(), w.delay_us)),
            watermark_us: before.watermark_us,
        },
    )
    .map_err(|e| failed(&e))?;
    let id = TaskId {
        epoch: run.epoch,
        batch,
        task: partition,
    };
    let kept = deduped.kept.num_rows() as u64;
    let mut op = crate::operators::SqlOperator::new(p.clone(), schema.clone());
    if !p.statics.is_empty() {
        op = op.with_statics(off.statics.clone(), Some(ctx.static_stores()?));
    }
    let (mut outputs, mut partial_files) = (Vec::new(), Vec::new());
    match op.stateful().await? {
        None => {
            let written = op.write_kept(&ctx.sink, id, deduped.kept).await;
            outputs = op.statics_unchanged(batch, written).await?;
        }
        Some(q) => {
            let n = p.limits.state_partitions.max(1);
            let written = op
                .partials_of_kept(&ctx.checkpoint, id, &q, deduped.kept, n)
                .await;
            partial_files = op.statics_unchanged(batch, written).await?;
        }
    }
    let keys = deduped.state.num_rows() as u64;
    let state = if keys > 0 {
        let key = paths::checkpoint::dedup_state(partition, batch, run.epoch);
        let bytes = crate::operators::aggregate::to_ipc(&state_schema, &[deduped.state])
            .map_err(|e| failed(&e))?;
        store.put(&key, bytes.into(), PutMode::Overwrite).await?;
        Some(key)
    } else {
        None
    };
    let mut requests = ctx.counts();
    requests.put += 1;
    let result = DedupResult {
        partition,
        rows_out: outputs.iter().map(|o| o.rows).sum(),
        outputs,
        partials: partial_files,
        state,
        keys,
        kept,
        dropped: deduped.dropped,
        next_expiry_us: deduped.next_expiry_us,
        millis: super::usage::billed_ms(started),
        memory_mb: crate::deploy::memory_mb(crate::deploy::OPERATOR),
        retries: super::usage::retries(),
        requests,
    };
    ctx.checkpoint
        .put_step_result(PartitionStep::Dedup, batch, partition, run.epoch, &result)
        .await?;
    tracing::debug!(pipeline = %p.name, batch, partition, kept, dropped = result.dropped, keys, "deduplicated");
    Ok(result)
}

/// Read and decode every partition's keys seen in force, as the Dedup
/// steps of the next batch would (`sluice bench --query dedup` times this
/// as the restore). A pipeline without them gives zeros.
pub async fn restore_dedup_state(ctx: &Context) -> Result<super::StateSize> {
    let Some((control, _)) = ctx.checkpoint.control().await? else {
        return Ok(super::StateSize::default());
    };
    let Some(st) = control.stateful else {
        return Ok(super::StateSize::default());
    };
    let mut size = super::StateSize::default();
    for key in st.dedup.into_iter().flatten() {
        let obj = ctx
            .checkpoint
            .store()
            .get(&key)
            .await?
            .ok_or_else(|| ctx.broken(key.clone(), "the keys seen in force are missing"))?;
        let batches = crate::operators::aggregate::from_ipc(&obj.bytes)
            .map_err(|e| ctx.broken(key.clone(), e.to_string()))?;
        size.bytes += obj.bytes.len() as u64;
        size.partitions += 1;
        size.groups += batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
    }
    Ok(size)
}
