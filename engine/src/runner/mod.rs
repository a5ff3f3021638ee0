//! The local runner: drives the handler steps in-process, in the order the
//! state machine does (plan -> operate each task -> commit -> plan ...),
//! until the run is done.

pub mod asl;

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::checkpoint::Durations;
use crate::error::{ErrorClass, Result};
use crate::handlers::{self, Context, PlanOutcome};

/// One committed batch, as reported to the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchReport {
    /// Batch number.
    pub batch: u64,
    /// Input files.
    pub files: u64,
    /// Input bytes.
    pub bytes: u64,
    /// Rows read.
    pub rows_in: u64,
    /// Rows written.
    pub rows_out: u64,
    /// Output files.
    pub outputs: u64,
    /// Wall time of plan + tasks + commit, ms.
    pub millis: u64,
    /// Planned by an earlier run that did not finish it.
    pub resumed: bool,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunEnd {
    /// Nothing to do.
    Idle(String),
    /// Another run holds the lease.
    Busy(String),
    /// Batches were committed and the lease released.
    Done,
}

/// The result of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    /// How it ended.
    pub end: RunEnd,
    /// Committed batches, in order.
    pub batches: Vec<BatchReport>,
    /// Wall time, ms.
    pub millis: u64,
    /// Storage requests of the whole run.
    pub requests: crate::storage::RequestCounts,
}

/// Run the pipeline until everything available at the start is committed
/// (Spark's `Trigger.AvailableNow`). `on_batch` sees each committed batch.
pub async fn run(ctx: &Context, mut on_batch: impl FnMut(&BatchReport)) -> Result<RunSummary> {
    let started = Instant::now();
    let counts_at_start = ctx.counts();
    let mut batches = Vec::new();
    let mut state = None;
    loop {
        let batch_started = Instant::now();
        let counts_before = ctx.counts();
        let outcome = handlers::plan(ctx, state.take()).await?;
        let plan_ms = batch_started.elapsed().as_millis() as u64;
        let (run, batch) = match outcome {
            PlanOutcome::Idle { reason } => {
                return Ok(summary(
                    RunEnd::Idle(reason),
                    batches,
                    started,
                    ctx,
                    counts_at_start,
                ));
            }
            PlanOutcome::Busy {
                owner,
                heartbeat_age_s,
            } => {
                let why = format!("{owner} holds the lease (heartbeat {heartbeat_age_s}s ago)");
                return Ok(summary(
                    RunEnd::Busy(why),
                    batches,
                    started,
                    ctx,
                    counts_at_start,
                ));
            }
            PlanOutcome::Done { .. } => {
                return Ok(summary(
                    RunEnd::Done,
                    batches,
                    started,
                    ctx,
                    counts_at_start,
                ));
            }
            PlanOutcome::Batch { run, batch } => (run, batch),
        };

        let operate_started = Instant::now();
        let heartbeat = spawn_heartbeat(ctx, &run);
        let mut results = Vec::with_capacity(batch.tasks.len());
        for task in &batch.tasks {
            let done = handlers::operate(ctx, &run, batch.batch, *task).await;
            if done.is_err() {
                heartbeat.abort();
            }
            match done {
                Ok(r) => results.push(r),
                Err(e) => {
                    if e.class() == ErrorClass::InvalidInput {
                        // Nothing of this batch is committed: drop its plan
                        // so the next run plans afresh once the input is fixed.
                        if let Err(abandon_err) = handlers::abandon(ctx, &run, batch.batch).await {
                            tracing::warn!(error = %abandon_err, "could not abandon the batch; the next run resumes it");
                        }
                    }
                    return Err(e);
                }
            }
        }
        heartbeat.abort();
        let durations = Durations {
            plan_ms,
            operate_ms: operate_started.elapsed().as_millis() as u64,
            commit_ms: 0,
        };
        let record =
            handlers::commit(ctx, &run, batch.batch, &results, durations, counts_before).await?;
        let report = BatchReport {
            batch: record.batch,
            files: record.files,
            bytes: record.bytes_read,
            rows_in: record.rows_in,
            rows_out: record.rows_out,
            outputs: record.outputs.len() as u64,
            millis: batch_started.elapsed().as_millis() as u64,
            resumed: batch.resumed,
        };
        on_batch(&report);
        batches.push(report);
        state = Some(run);
    }
}

/// Keep the lease alive while tasks run: a heartbeat every third of the
/// lease TTL. Stops by itself if the lease is lost.
fn spawn_heartbeat(ctx: &Context, run: &handlers::RunState) -> tokio::task::JoinHandle<()> {
    let ctx = ctx.clone();
    let run = run.clone();
    let every = std::time::Duration::from_secs((ctx.pipeline.limits.lease_ttl_seconds / 3).max(1));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = handlers::heartbeat(&ctx, &run).await {
                tracing::warn!(error = %e, "heartbeat failed; the lease may expire");
                if e.class() == ErrorClass::Conflict {
                    return;
                }
            }
        }
    })
}

fn summary(
    end: RunEnd,
    batches: Vec<BatchReport>,
    started: Instant,
    ctx: &Context,
    counts_at_start: crate::storage::RequestCounts,
) -> RunSummary {
    RunSummary {
        end,
        batches,
        millis: started.elapsed().as_millis() as u64,
        requests: ctx.counts().since(&counts_at_start),
    }
}
