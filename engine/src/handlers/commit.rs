//! The commit step: check a batch's outputs, write its commit record
//! (create-only), publish its manifest, advance the index and control; or,
//! after a refused input, drop the batch's plan (`abandon`, `settle`).

use super::context::Context;
use super::lease::release;
use super::payloads::{Refusal, RunState};
use crate::checkpoint::{self, Commit, Durations, FunctionUsage, Manifest, RunStatus, Usage};
use crate::discovery;
use crate::error::{Error, ErrorClass, Result};
use crate::operators::TaskResult;
use crate::paths;
use crate::sinks::Checked;
use crate::storage::RequestCounts;

/// Commit step: collect the task results, check the outputs, stage the
/// manifest, check the lease once more, write `commits/N` (create-only),
/// then publish and advance the index and control. Returns the commit
/// record.
///
/// The protocol's stages, each a function below, in order:
/// `prepare` (gather what the tasks and merges left, build the record,
/// verify the outputs, stage the manifest), `fence` (the last lease
/// check), `write_record` (the record's usage and requests, then the
/// create-only write that commits), and `finish_commit` (publish,
/// settle the source, advance control, prune). Recovery re-enters at the
/// last: a Plan that finds a record control does not name yet, or a
/// commit whose batch another run already committed, finishes it.
///
/// Fencing: every write before the record is staged or carries this run's
/// epoch (inert until a record names it); the lease is checked after the
/// last of them, and everything after the record publishes by copying
/// what was staged before that check, or is a compare-and-swap. A run
/// stopped past its lease therefore changes nothing a reader or a later
/// run sees: a newer run made the same record (or its own) the truth, and
/// a reset removed what was staged.
pub async fn commit(ctx: &Context, run: &RunState, batch: u64) -> Result<Commit> {
    Ok(commit_as(ctx, run, batch).await?.0)
}

/// [`commit`], as the committer function runs it: in an Express
/// execution, the commit of the run's last batch also ends the run when
/// it can (see [`may_end_run`]). Returns the record, and whether the run
/// ended.
pub(super) async fn commit_as(ctx: &Context, run: &RunState, batch: u64) -> Result<(Commit, bool)> {
    let ctx = &ctx.counted();
    ctx.check_spec(run)?;
    let started = std::time::Instant::now();
    let (control, _) = ctx.checkpoint.owned_control(run.epoch).await?;
    let (record, written, fresh) = match prepare(ctx, run, &control, batch).await? {
        Prepared::Ready(p) => {
            fence(ctx, run).await?;
            let (record, fresh) = write_record(ctx, run, *p, started).await?;
            (record, true, fresh)
        }
        Prepared::Committed(record) => (*record, false, None),
    };
    let ended = finish_commit(
        ctx,
        run,
        &control,
        &record,
        Charge::AfterCommit,
        fresh,
        true,
    )
    .await?;
    // The batch's metrics, once: by the commit that wrote (or raced to
    // write) its record, not by one that found it committed.
    if written {
        ctx.metric(|| crate::metrics::batch_line(&record, &ctx.pipeline.name));
    }
    if ended {
        tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, batch, "last batch committed; lease released");
    }
    Ok((record, ended))
}

/// Whether the commit of `record` may end the run, as the Plan after it
/// would (`plan`: nothing planned left, release): in an Express execution
/// (whose `Committed` choice ends it), once the run has discovered, with
/// no later batch planned, for a source whose end of run is only that
/// (files and manifests: a record stream's and a stateful query's Plan
/// may still have a batch to plan). Whether a trigger asked again is
/// decided in the write itself.
async fn may_end_run(
    ctx: &Context,
    run: &RunState,
    control: &crate::checkpoint::Control,
    record: &Commit,
) -> Result<bool> {
    if !run.express
        || super::usage::express_started().is_none()
        || !run.discovered
        || record.stream.is_some()
        || record.stateful.is_some()
    {
        return Ok(false);
    }
    let next = ctx
        .checkpoint
        .offsets_of(record.batch + 1, &control.history, run.epoch)
        .await?;
    Ok(next.is_none())
}

/// What [`prepare`] leaves for the record's write.
enum Prepared {
    /// The record to write, its outputs verified and its manifest staged.
    Ready(Box<Ready>),
    /// The batch is committed already (by a run that lost its lease after
    /// its record, or an earlier attempt of this step): its record.
    Committed(Box<Commit>),
}

/// A record ready to be written, with what its usage is counted from.
struct Ready {
    record: Commit,
    off: crate::checkpoint::Offsets,
    results: Vec<TaskResult>,
    merged: Option<Merged>,
    /// How the check of the outputs saw the sink's staging.
    staged: Checked,
}

/// What the commit that has just written a batch's record knows of it,
/// which spares [`finish_commit`] listings: no earlier publish of the
/// batch, the staging its check listed, and (`work`) every work file the
/// batch has when this run planned it and only its tasks wrote any.
pub(super) struct Fresh {
    staged: Checked,
    work: Option<Vec<String>>,
}

/// Stage 1: gather the results the tasks (and merges) of `batch` left under
/// this run, build the record, verify every output it names and stage its
/// manifest. Every write here is staged or carries this run's epoch.
async fn prepare(
    ctx: &Context,
    run: &RunState,
    control: &crate::checkpoint::Control,
    batch: u64,
) -> Result<Prepared> {
    let started_ms = ctx.now();
    let off = ctx.planned(batch, run.epoch, "at commit").await?;
    check_plan(ctx, &off, control)?;
    let gathered = async {
        let results = task_results(ctx, run, batch, &off).await?;
        let merged = merge_results(ctx, run, &off, control, &results).await?;
        Ok::<_, Error>((results, merged))
    };
    let (results, merged) = match gathered.await {
        Ok(r) => r,
        // A run that lost its lease may have committed this very batch
        // and removed this run's results with the rest of the batch's
        // work files: its record is the truth.
        Err(e) => match ctx.checkpoint.commit(batch).await? {
            Some(record) => return Ok(Prepared::Committed(Box::new(record))),
            None => return Err(e),
        },
    };
    let record = build_record(
        ctx,
        run,
        control,
        &off,
        &results,
        merged.as_ref(),
        started_ms,
    );
    let files = crate::sinks::record_files(&record);
    // A plan of this run's own: only its attempts staged anything for it.
    let staged = ctx
        .sink
        .verify(batch, &files, off.epoch == run.epoch)
        .await?;
    ctx.sink
        .stage_commit(&record, &manifest_of(ctx, &record))
        .await?;
    Ok(Prepared::Ready(Box::new(Ready {
        record,
        off,
        results,
        merged,
        staged,
    })))
}

/// Stage 2, the last check: from here on this run writes its record and
/// copies what it staged; a reset removes those, a newer run finds the
/// record (or makes its own).
async fn fence(ctx: &Context, run: &RunState) -> Result<()> {
    ctx.checkpoint.owned_control(run.epoch).await?;
    Ok(())
}

/// Stage 3: the record's durations, usage and requests, then its
/// create-only write, which commits the batch. Returns the record that is
/// the truth: this one (with what this commit knows of it), or the one a
/// retried or another run's commit wrote first.
async fn write_record(
    ctx: &Context,
    run: &RunState,
    ready: Ready,
    started: std::time::Instant,
) -> Result<(Commit, Option<Fresh>)> {
    let Ready {
        mut record,
        off,
        results,
        merged,
        staged,
    } = ready;
    let batch = record.batch;
    record.durations.commit_ms = super::usage::billed_ms(started);
    let commit_cpu_ms = super::usage::invocation_cpu_ms();
    record.usage = batch_usage(run, &off, &results, merged.as_ref(), &record, commit_cpu_ms);
    // Planner, tasks and this committer (its context counts this
    // invocation's requests, loading the context included), including the
    // commit write itself.
    let mut own = ctx.counts();
    own.put_create += 1;
    // The Plan invocation that handed the batch out (a payload of an older
    // build carries none: the planning invocation's, from the plan).
    let plan_requests = if run.plan_requests.is_empty() {
        off.plan_requests
    } else {
        run.plan_requests
    };
    let task_requests = results
        .iter()
        .fold(RequestCounts::default(), |acc, r| acc.plus(&r.requests))
        .plus(&merged.as_ref().map(|m| m.requests).unwrap_or_default());
    record.requests = plan_requests.plus(&task_requests).plus(&own);
    // A Distributed Map's ItemReader read the task list: one GET, made by
    // Step Functions and billed to the bucket's owner.
    if off.tasks.len() as u64 > ctx.pipeline.limits.max_inline_tasks {
        record.requests.get += 1;
    }
    if !ctx.checkpoint.create_commit(&record).await? {
        // A retried commit, or another run's: the record that won is the
        // truth.
        record = ctx.checkpoint.commit(batch).await?.ok_or_else(|| {
            ctx.broken(
                paths::checkpoint::commit(batch),
                "create-only write lost, yet no record is there",
            )
        })?;
        return Ok((record, None));
    }
    // A plan this run made, of a row-by-row query whose tasks ran in the
    // state machine's inline Map: the results its tasks wrote (those that
    // did not travel in the payload) are the batch's only work files
    // (older runs never saw the plan; a retried task rewrites its own).
    let carried = |task: u32| {
        run.results
            .iter()
            .any(|a| a.result.as_ref().is_some_and(|r| r.task == task))
    };
    let work = (off.epoch == run.epoch
        && merged.is_none()
        && off.tasks.len() as u64 <= ctx.pipeline.limits.max_inline_tasks)
        .then(|| {
            off.tasks
                .iter()
                .filter(|t| !carried(t.task))
                .map(|t| paths::checkpoint::work(batch, t.task, run.epoch))
                .collect()
        });
    Ok((record, Some(Fresh { staged, work })))
}

/// A batch's plan must be of the history this run works in.
pub(super) fn check_plan(
    ctx: &Context,
    off: &crate::checkpoint::Offsets,
    control: &crate::checkpoint::Control,
) -> Result<()> {
    if checkpoint::foreign(&off.history, &control.history) {
        return Err(ctx.conflict(format!(
            "the plan of batch {} is of history {}, not this run's ({}): a reset retired it; \
             this run stops",
            off.batch, off.history, control.history
        )));
    }
    Ok(())
}

/// The manifest publishing `record` makes readers see.
fn manifest_of(ctx: &Context, record: &Commit) -> Manifest {
    Manifest {
        format_version: checkpoint::FORMAT_VERSION,
        pipeline: ctx.pipeline.name.clone(),
        batch: record.batch,
        // (The staged files' etags are the commit's check's, not readers'.)
        files: record
            .outputs
            .iter()
            .map(|o| crate::checkpoint::OutputFile {
                etag: None,
                ..o.clone()
            })
            .collect(),
        rows: record.rows_out,
        complete: record.stateful.is_some()
            && ctx.pipeline.output_mode == crate::pipeline::OutputMode::Complete,
    }
}

/// What became of a batch's planned inputs, from its tasks' results.
struct Inputs {
    /// Left for the next run (changed since listed): not part of the
    /// batch, not counted, not marked processed.
    deferred: Vec<crate::checkpoint::InputFile>,
    /// Deleted before a task read them: nothing to process.
    gone: Vec<String>,
    /// Set aside as unreadable: taken (processed, not listed as new
    /// again) but not read.
    quarantined: Vec<crate::checkpoint::Quarantined>,
    /// The keys taken.
    taken: Vec<String>,
    /// Files read, and their bytes.
    files: u64,
    bytes: u64,
}

impl Inputs {
    fn of(off: &crate::checkpoint::Offsets, results: &[TaskResult]) -> Inputs {
        let mut deferred: Vec<crate::checkpoint::InputFile> = results
            .iter()
            .flat_map(|r| r.deferred.iter().cloned())
            .collect();
        deferred.sort_by(|a, b| a.key.cmp(&b.key));
        let mut gone: Vec<String> = results.iter().flat_map(|r| r.gone.clone()).collect();
        gone.sort();
        let taken: Vec<&crate::checkpoint::InputFile> = off
            .inputs
            .iter()
            .filter(|i| !deferred.iter().any(|d| d.key == i.key) && !gone.contains(&i.key))
            .collect();
        let mut quarantined: Vec<crate::checkpoint::Quarantined> = results
            .iter()
            .flat_map(|r| r.quarantined.iter().cloned())
            .collect();
        quarantined.sort_by(|a, b| a.key.cmp(&b.key));
        let read: Vec<&&crate::checkpoint::InputFile> = taken
            .iter()
            .filter(|i| !quarantined.iter().any(|q| q.key == i.key))
            .collect();
        Inputs {
            files: read.len() as u64,
            bytes: read.iter().map(|i| i.size).sum(),
            taken: taken.iter().map(|i| i.key.clone()).collect(),
            deferred,
            gone,
            quarantined,
        }
    }
}

/// The commit record of a batch from its tasks' (and merges') results,
/// before its usage and requests are known.
fn build_record(
    ctx: &Context,
    run: &RunState,
    control: &crate::checkpoint::Control,
    off: &crate::checkpoint::Offsets,
    results: &[TaskResult],
    merged: Option<&Merged>,
    started_ms: i64,
) -> Commit {
    let inputs = Inputs::of(off, results);
    let mut outputs: Vec<_> = match merged {
        Some(m) => m.outputs.clone(),
        None => results.iter().flat_map(|r| r.outputs.clone()).collect(),
    };
    outputs.sort_by(|a, b| a.key.cmp(&b.key));
    let rows_out = match merged {
        Some(_) => outputs.iter().map(|o| o.rows).sum(),
        None => results.iter().map(|r| r.rows_out).sum(),
    };
    Commit {
        format_version: checkpoint::FORMAT_VERSION,
        batch: off.batch,
        epoch: run.epoch,
        history: control.history.clone(),
        committed_ms: ctx.now(),
        files: inputs.files,
        // A record stream's planned ranges have no size: the bytes its
        // tasks read (the records as JSON lines).
        bytes_read: match off.stream {
            Some(_) => results.iter().map(|r| r.bytes_read).sum(),
            None => inputs.bytes,
        },
        rows_in: results.iter().map(|r| r.rows_in).sum(),
        rows_out,
        durations: Durations {
            plan_ms: off.plan_ms,
            // From the Plan that handed the batch out (a run plans its
            // batches ahead: from the plan, it would count the batches
            // before it).
            operate_ms: (started_ms
                - if run.batch_ms > 0 {
                    run.batch_ms
                } else {
                    off.planned_ms
                })
            .max(0) as u64,
            task_max_ms: results.iter().map(|r| r.millis).max().unwrap_or(0),
            merge_max_ms: merged.map_or(0, |m| m.millis),
            commit_ms: 0,
        },
        usage: Usage::default(),
        requests: RequestCounts::default(),
        input_keys: inputs.taken,
        trigger: run.trigger.clone(),
        consumed: off.consumed.clone(),
        deferred: inputs.deferred,
        gone: inputs.gone,
        source: off.source.clone(),
        stream: off.stream.clone().map(|mut s| {
            // A Kinesis batch: where each unit's read ended.
            s.read = results
                .iter()
                .flat_map(|r| r.shard_reads.iter().cloned())
                .collect();
            s
        }),
        quarantined: inputs.quarantined,
        rejected: results.iter().filter_map(|r| r.rejected.clone()).collect(),
        nulled_fields: results.iter().map(|r| r.nulled_fields).sum(),
        schema_version: off.schema.as_ref().map(|s| s.version),
        added_columns: off.added_columns.clone(),
        schema: (!off.added_columns.is_empty())
            .then(|| off.schema.clone())
            .flatten(),
        rescued_fields: results.iter().map(|r| r.rescued_fields).sum(),
        stateful: merged.map(|m| m.state.clone()),
        statics: off.statics.iter().map(|s| s.used()).collect(),
        table_schema: off
            .query
            .as_ref()
            .and_then(|q| q.table.clone())
            .filter(|_| outputs.iter().all(|o| o.delta.is_none())),
        outputs,
    }
}

/// What the batch used: the Plan invocation that handed it out, its tasks'
/// and merges' invocations of the operator function, this commit's
/// invocation (up to its record's write), and its state transitions.
fn batch_usage(
    run: &RunState,
    off: &crate::checkpoint::Offsets,
    results: &[TaskResult],
    merged: Option<&Merged>,
    record: &Commit,
    commit_cpu_ms: u64,
) -> Usage {
    use super::usage::retries;
    use crate::deploy::{COMMITTER, OPERATOR, PLANNER, batch_transitions, memory_mb};
    let merges = merged.map_or(0, |m| m.invocations);
    let dedups = merged.map_or(0, |m| m.dedups);
    // Failed attempts of the batch's steps: each an invocation and a
    // transition (their duration unknown: they left no result).
    let operator_retries =
        results.iter().map(|r| r.retries).sum::<u64>() + merged.map_or(0, |m| m.retries);
    let commit_retries = retries();
    let operator_ms: u64 =
        results.iter().map(|r| r.millis).sum::<u64>() + merged.map_or(0, |m| m.billed_ms);
    let operator_mb = results
        .iter()
        .map(|r| r.memory_mb)
        .chain(merged.map(|m| m.memory_mb))
        .find(|m| *m > 0)
        .unwrap_or_else(|| memory_mb(OPERATOR));
    let mut functions = Vec::new();
    if run.plan_ms > 0 {
        functions.push(
            FunctionUsage::new(
                PLANNER,
                1 + run.plan_retries,
                run.plan_ms,
                run.plan_memory_mb,
            )
            .with_cpu(run.plan_cpu_ms, run.plan_ms),
        );
    }
    // (CPU time is measured for the tasks, not for merges and dedups.)
    let task_cpu_ms: u64 = results.iter().map(|r| r.cpu_ms).sum();
    let task_ms: u64 = results.iter().map(|r| r.millis).sum();
    functions.push(
        FunctionUsage::new(
            OPERATOR,
            off.tasks.len() as u64 + merges + dedups + operator_retries,
            operator_ms,
            operator_mb,
        )
        .with_cpu(task_cpu_ms, task_ms),
    );
    functions.push(
        FunctionUsage::new(
            COMMITTER,
            1 + commit_retries,
            record.durations.commit_ms,
            memory_mb(COMMITTER),
        )
        .with_cpu(commit_cpu_ms, record.durations.commit_ms),
    );
    let transitions = batch_transitions(
        off.tasks.len() as u64,
        merges,
        dedups,
        run.plan_retries + operator_retries + commit_retries,
        run.express,
    );
    // In an Express execution the transitions are not billed: the
    // execution's duration is, recorded at its ending.
    if run.express {
        Usage {
            functions,
            transitions: 0,
            express: crate::checkpoint::ExpressUsage {
                transitions,
                ..Default::default()
            },
        }
    } else {
        Usage {
            functions,
            transitions,
            express: Default::default(),
        }
    }
}

/// What the merges of a stateful query's batch left for its commit.
struct Merged {
    /// The state and watermark after the batch.
    state: crate::checkpoint::StatefulState,
    /// The parts the merges staged.
    outputs: Vec<crate::checkpoint::OutputFile>,
    /// The longest merge, ms.
    millis: u64,
    /// The merges' storage requests.
    requests: RequestCounts,
    /// Merge invocations (one per state partition).
    invocations: u64,
    /// Dedup step invocations (one per state partition).
    dedups: u64,
    /// Their billed duration, ms.
    billed_ms: u64,
    /// The operator function's memory they ran with, MB.
    memory_mb: u64,
    /// Their failed attempts.
    retries: u64,
}

impl Merged {
    /// Count one merge or Dedup step: its duration, requests, failed
    /// attempts and memory.
    fn took(&mut self, millis: u64, requests: &RequestCounts, retries: u64, memory_mb: u64) {
        self.millis = self.millis.max(millis);
        self.requests = self.requests.plus(requests);
        self.retries += retries;
        self.billed_ms += millis;
        self.memory_mb = self.memory_mb.max(memory_mb);
    }
}

/// A stateful query's (or a `[deduplicate]` pipeline's) batch: the state
/// and watermark after it, and the parts its merges (or Dedup steps)
/// staged; `None` for a row-by-row query without `[deduplicate]`. Every
/// state partition's merge and Dedup step must have finished under this
/// run.
async fn merge_results(
    ctx: &Context,
    run: &RunState,
    off: &crate::checkpoint::Offsets,
    control: &crate::checkpoint::Control,
    results: &[TaskResult],
) -> Result<Option<Merged>> {
    let shape = super::state::stateful_shape(ctx, off).await?;
    let dedup_shape = super::state::dedup_shape(ctx, off).await?;
    if shape.is_none() && dedup_shape.is_none() {
        return Ok(None);
    }
    let partitions = crate::state::shape::partitions(&ctx.pipeline);
    let before = control.stateful.clone().unwrap_or_default();
    let mut m = Merged {
        state: crate::checkpoint::StatefulState {
            merged_watermark_us: before.watermark_us,
            late_rows: results.iter().map(|r| r.late_rows).sum(),
            late_files: results.iter().filter_map(|r| r.late_file.clone()).collect(),
            shape: shape.clone().unwrap_or_default(),
            dedup_shape: dedup_shape.clone().unwrap_or_default(),
            // Each key's later rows within a task, dropped there.
            duplicates: results.iter().map(|r| r.duplicates).sum(),
            ..Default::default()
        },
        outputs: Vec::new(),
        millis: 0,
        requests: RequestCounts::default(),
        invocations: 0,
        dedups: 0,
        billed_ms: 0,
        memory_mb: 0,
        retries: 0,
    };
    if dedup_shape.is_some() {
        for p in &partitions {
            let d = super::dedup::finished(ctx, run, off.batch, *p).await?;
            m.state.dedup.push(d.state);
            m.state.duplicates += d.dropped;
            m.state.dedup_keys += d.keys;
            m.state.next_expiry_us = match (m.state.next_expiry_us, d.next_expiry_us) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            m.outputs.extend(d.outputs);
            m.dedups += 1;
            m.took(d.millis, &d.requests, d.retries, d.memory_mb);
        }
    }
    if shape.is_some() {
        for p in partitions {
            let Some(r) = ctx
                .checkpoint
                .step_result::<super::merge::MergeResult>(
                    checkpoint::PartitionStep::Merge,
                    off.batch,
                    p,
                    run.epoch,
                )
                .await?
            else {
                let key = paths::checkpoint::merge(off.batch, p, run.epoch);
                return Err(Error::Execution {
                    pipeline: ctx.pipeline.name.clone(),
                    batch: off.batch,
                    task: None,
                    message: format!(
                        "no merge result at {key}: the merge of state partition {p} did not \
                         finish under this run; run again"
                    ),
                    class: ErrorClass::Fatal,
                });
            };
            m.state.state.push(r.state);
            m.outputs.extend(r.outputs);
            m.invocations += 1;
            m.took(r.millis, &r.requests, r.retries, r.memory_mb);
            m.state.next_close_us = match (m.state.next_close_us, r.next_close_us) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }
    let max_event = results.iter().filter_map(|r| r.max_event_us).max();
    m.state.watermark_us = crate::state::watermark::after_batch(&ctx.pipeline, &before, max_event);
    Ok(Some(m))
}

/// The results the tasks of `batch` recorded under this run, in task order;
/// a task without one did not finish under this run.
async fn task_results(
    ctx: &Context,
    run: &RunState,
    batch: u64,
    off: &crate::checkpoint::Offsets,
) -> Result<Vec<TaskResult>> {
    let mut results: Vec<TaskResult> = Vec::with_capacity(off.tasks.len());
    for t in &off.tasks {
        let result = super::operate::finished_task(
            ctx,
            run,
            crate::checkpoint::TaskId {
                epoch: run.epoch,
                batch,
                task: t.task,
            },
        )
        .await?;
        results.push(result);
    }
    Ok(results)
}

/// Whose requests [`finish_commit`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Charge {
    /// The commit step's, after its record: they go into control's
    /// `totals.after_commits` in the write that records the batch.
    AfterCommit,
    /// A Plan's that recovers a recorded batch: counted as the Plan's own.
    Plan,
}

/// After `commits/N` exists: publish the batch (its parts, side outputs
/// and manifest, copied from staging), remove what was staged for it and
/// its work files, advance the index (compare-and-swap) and control, prune
/// old records. Idempotent, so recovery can redo it. `control` is the one
/// this run read: its history names the index and claims it advances.
///
/// `end`: when the run may end here ([`may_end_run`]), its end is
/// recorded and the lease given back in the same write, unless a trigger
/// asked again meanwhile (then the Plan after discovers once more).
/// Returns whether the run ended.
pub(super) async fn finish_commit(
    ctx: &Context,
    run: &RunState,
    control: &crate::checkpoint::Control,
    record: &Commit,
    charge: Charge,
    fresh: Option<Fresh>,
    end: bool,
) -> Result<bool> {
    let started = ctx.counts();
    let ending = match end && may_end_run(ctx, run, control, record).await? {
        true => super::usage::commit_run_end(ctx.now()),
        false => None,
    };
    let p = &ctx.pipeline;
    let published_before = fresh.is_none();
    let (staged, work) = match fresh {
        // A sweep lists staging whatever the check did.
        Some(f) if checkpoint::sweeps_at(record.batch) => (Checked::Unlisted, f.work),
        Some(f) => (f.staged, f.work),
        None => (Checked::Unlisted, None),
    };
    ctx.sink.publish(record, !published_before).await?;
    ctx.sink.remove_staged_through(record, staged).await?;
    // This batch's work files of this run and older ones (a newer run's
    // are its own to remove): by name when the commit knows them all,
    // listed otherwise; and every so many batches, whatever earlier
    // batches left (runs that died, plans dropped after a refusal).
    match work {
        Some(keys) => ctx.checkpoint.remove_all(keys).await?,
        None => ctx.checkpoint.remove_work(record.batch, run.epoch).await?,
    }
    if checkpoint::sweeps_at(record.batch) {
        ctx.checkpoint.sweep_work(record.batch, run.epoch).await?;
    }
    let settled = discovery::Source::of(p)
        .settle(&ctx.scope(), control, record)
        .await?;
    // What goes once control names this batch: records below the
    // retention floor, and state files the batch's state no longer names.
    // Listed now so the control write can count their deletes.
    let floor = checkpoint::retention_floor(record.batch, p.retain_batches);
    let pruned = if floor > 0 {
        ctx.checkpoint
            .prunable(floor, checkpoint::sweeps_at(record.batch))
            .await?
    } else {
        Vec::new()
    };
    let stale = match &record.stateful {
        Some(s) => stale_state(ctx, record.batch, s).await?,
        None => Vec::new(),
    };
    let now = ctx.now();
    let spec_hash = p.spec_hash();
    let ended = std::sync::atomic::AtomicBool::new(false);
    let c = ctx
        .checkpoint
        .update_control(run.epoch, &|c| {
            ended.store(false, std::sync::atomic::Ordering::SeqCst);
            if c.records(record.batch) {
                return;
            }
            if charge == Charge::AfterCommit {
                // Everything since the record, this write and the deletes
                // to come.
                let mut spent = ctx.counts().since(&started);
                spent.put_update += 1;
                spent.delete += (pruned.len() + stale.len()) as u64;
                c.totals.after_commits = c.totals.after_commits.plus(&spent);
            }
            c.record_commit(record, settled.listing.as_ref(), now, &spec_hash);
            // (Cleared when the source keeps its index in its own object.)
            c.index = settled.index.clone();
            if let Some(end) = &ending {
                let (next, again) = checkpoint::end_of_run(c, now, &spec_hash);
                if !again {
                    *c = next;
                    c.totals.runs += 1;
                    c.totals.run_ends = c.totals.run_ends.plus(end);
                    ended.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
        .await?;
    // The index object control took the place of: removed once control
    // holds the index; and at each sweep, whatever a crash between the
    // two left.
    let moved = settled.moved.clone().or_else(|| {
        (checkpoint::sweeps_at(record.batch) && settled.index.is_some())
            .then(|| paths::checkpoint::index(control.first_batch))
    });
    if let Some(key) = moved
        && c.index.is_some()
    {
        ctx.checkpoint.remove_all(vec![key]).await?;
    }
    if c.last_committed == Some(record.batch) {
        // Oldest first, so a crash leaves a suffix of records.
        ctx.checkpoint.remove_in_order(pruned).await?;
        ctx.checkpoint.remove_all(stale).await?;
    }
    Ok(ended.load(std::sync::atomic::Ordering::SeqCst))
}

/// State files of batches up to `batch` that the committed state `s` no
/// longer names: replaced versions, and what merges of runs that lost their
/// lease wrote. No later batch can need them once control names `s` (each
/// merge starts from the state the last commit names).
async fn stale_state(
    ctx: &Context,
    batch: u64,
    s: &crate::checkpoint::StatefulState,
) -> Result<Vec<String>> {
    let listed = ctx
        .checkpoint
        .store()
        .list(paths::checkpoint::STATE_PREFIX, None)
        .await?;
    Ok(listed
        .into_iter()
        .map(|m| m.key)
        .filter(|k| {
            !s.state
                .iter()
                .chain(&s.dedup)
                .flatten()
                .any(|keep| keep == k)
        })
        .filter(|k| paths::checkpoint::state_batch(k).is_some_and(|n| n <= batch))
        .collect())
}

/// After a batch's input was refused: delete the plans of `batch` and every
/// later planned batch (highest first, so a crash here leaves a prefix of
/// plans that the next run resumes), remove what this run staged for them,
/// and release the lease. The next run plans afresh from what is there
/// then. Each plan is deleted only while it is the one read here, after a
/// last lease check: a run stopped past its lease cannot delete a plan a
/// newer run wrote since.
pub(crate) async fn abandon(ctx: &Context, run: &RunState, batch: u64) -> Result<()> {
    let (control, _) = ctx.checkpoint.owned_control(run.epoch).await?;
    let planned = ctx
        .checkpoint
        .store()
        .list(paths::checkpoint::OFFSETS_PREFIX, None)
        .await?;
    let mut batches: Vec<u64> = planned
        .iter()
        .filter_map(|m| paths::checkpoint::batch_of(&m.key))
        .filter(|n| *n >= batch)
        .collect();
    batches.sort_unstable_by(|a, b| b.cmp(a));
    let mut plans = Vec::new();
    for n in batches {
        if let Some((off, etag)) = ctx.checkpoint.offsets_tagged(n).await?
            && !checkpoint::foreign(&off.history, &control.history)
        {
            plans.push((n, etag));
        }
    }
    ctx.sink.remove_staged_from(batch, run.epoch).await?;
    ctx.checkpoint.owned_control(run.epoch).await?;
    for (n, etag) in plans {
        ctx.checkpoint.delete_offsets_if(n, &etag).await?;
    }
    release(ctx, run, RunStatus::Idle).await
}

/// After a Distributed Map over `batch` failed: the error to end the run
/// with. A refusal left by a task of this run abandons the batch (as the
/// inline Map's Catch does) and is reported as `Sluice.InvalidInput`;
/// anything else is `Sluice.Fatal` and keeps the lease for the next run.
pub(super) async fn settle(ctx: &Context, run: &RunState, batch: u64) -> Error {
    let found = ctx.checkpoint.refusal::<Refusal>(batch, run.epoch);
    match found.await {
        Err(e) => e,
        Ok(Some(r)) => match abandon(ctx, run, batch).await {
            Err(e) => e,
            Ok(()) => Error::Execution {
                pipeline: ctx.pipeline.name.clone(),
                batch,
                task: Some(r.task),
                message: format!(
                    "{} (the batch's plan was dropped; fix the input and run again)",
                    r.message
                ),
                class: ErrorClass::InvalidInput,
            },
        },
        Ok(None) => Error::Execution {
            pipeline: ctx.pipeline.name.clone(),
            batch,
            task: None,
            message: "a task of the Distributed Map failed (see its map run's failed child \
                      executions); the lease is kept and the next run resumes this batch"
                .into(),
            class: ErrorClass::Fatal,
        },
    }
}
