//! The plan step: claim the lease, recover what a dead run left, resume a
//! planned batch, or discover new input (AvailableNow: what is there when
//! the run looks) and write the plans of all its batches, create-only,
//! before any output exists.

use datafusion::arrow::datatypes::SchemaRef;

use super::commit::{Charge, finish_commit};
use super::context::Context;
use super::lease::{continue_run, release, release_idle};
use super::ownership::{self, SinkCheck};
use super::payloads::{BatchRef, PlanOutcome, RunState, TaskList};
use super::schema::{evolve, in_force, resolve_schema};
use super::state::{check_state_shape, dedups, merges, plan_query};

use crate::checkpoint::owner::Owner;
use crate::checkpoint::{self, Claim, Control, Offsets, PipelineRecord, RunStatus};
use crate::deploy::{EVENT_BUDGET, batch_events};
use crate::discovery::{Look, Seen, Source};
use crate::error::{Error, ErrorClass, Result};
use crate::paths;
use crate::pipeline::schema::columns_of;
use crate::planning;
use crate::state::watermark::{self, closing_owed};
use crate::storage::{ObjectMeta, RequestCounts};

/// Plan step. Without a run: check for new input cheaply (one control read
/// and one listing), and only then claim the lease, recover what a dead run
/// left, and plan the new input into batches. With a run: resume the next
/// planned batch, or release.
pub async fn plan(ctx: &Context, run: Option<RunState>) -> Result<PlanOutcome> {
    let ctx = &ctx.counted();
    let clock = PlanClock {
        started: std::time::Instant::now(),
        counts: ctx.counts(),
    };
    match run {
        None => start(ctx, &clock).await,
        Some(mut run) => {
            // The first Plan of an execution a trigger started fixes the
            // spec the run works under; later steps check it.
            let first = run.spec.is_empty();
            if first {
                run.spec = ctx.pipeline.spec_hash();
            } else {
                ctx.check_spec(&run)?;
            }
            let (mut control, _) = ctx.checkpoint.owned_control(run.epoch).await?;
            if first {
                if let Some(claim) = claim_execution(ctx, &run).await? {
                    control.execution = Some(claim);
                }
                own_sink(ctx, &run, &control).await?;
            }
            if run.discovered {
                // The next batch this run planned, else the end of the run.
                let next = control.next_batch();
                let found = ctx
                    .checkpoint
                    .offsets_of(next, &control.history, run.epoch)
                    .await?;
                if let Some(off) = found {
                    return batch_outcome(ctx, run, &off).await;
                }
                if let Some(off) = trailing_batch(ctx, &run, &control).await? {
                    return batch_outcome(ctx, run, &off).await;
                }
                if release_idle(ctx, &run).await? {
                    return Ok(PlanOutcome::Done { run });
                }
            } else {
                // A run whose lease a trigger claimed (`triggers::wake`)
                // after a dead run, a hand-over or a cancel
                // (`control.resume`); or a duplicate of this run's own
                // execution (Express is at-least-once) that another
                // execution of it got ahead of: its plans and records are
                // this run's, finished and resumed before anything new is
                // discovered, never left behind by a release (two reads
                // when there is nothing).
                let (planned, finished) = resume_planned(ctx, &run, &control).await?;
                if let Some(off) = planned {
                    return batch_outcome(ctx, run, &off).await;
                }
                if control.resume || finished {
                    control = ctx.checkpoint.owned_control(run.epoch).await?.0;
                }
            }
            discover_and_plan(ctx, run, &control, Seen::Nothing, &clock).await
        }
    }
}

/// The first Plan of an Express execution a trigger started: claim the
/// run for this copy of the execution before anything is written (the
/// claim it made). Express is at-least-once: the same run may be executed
/// twice at once, with the same input and epoch, even under the same
/// execution id, which the lease alone cannot tell apart; each copy draws
/// a token before its first Plan (the Express definition's `Copy` state),
/// and a copy that finds another's token stops without writing (a
/// conflict; it releases nothing). A Standard execution is started once by
/// name: nothing to claim.
async fn claim_execution(
    ctx: &Context,
    run: &RunState,
) -> Result<Option<checkpoint::RunExecution>> {
    let Some(express) = super::usage::express_execution() else {
        return Ok(None);
    };
    let (Some(id), Some(copy)) = (express.id, express.copy) else {
        return Err(Error::Run {
            pipeline: ctx.pipeline.name.clone(),
            message: "this Express execution's first Plan was not given its execution id and \
                      copy token (`execution.$: $$.Execution.Id`, `copy.$: $.copy.token`), \
                      without which a duplicate execution of the run cannot be told from it: \
                      deploy the Express state machine of this release \
                      (statemachines/microbatch-express.asl.json, template.yaml)"
                .into(),
            class: ErrorClass::InvalidInput,
        });
    };
    ctx.checkpoint
        .claim_execution(run.epoch, &id, &copy)
        .await?;
    tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, execution = %id, copy = %copy, "run claimed for this copy of the Express execution");
    Ok(Some(checkpoint::RunExecution {
        epoch: run.epoch,
        id,
        copy,
    }))
}

/// The plan step's answer for a planned batch: the batch, or, once this
/// execution has handed out `limits.max_batches_per_execution` batches, the
/// hand-over to the next execution. A batch with more tasks than
/// `limits.max_inline_tasks` goes to the Distributed Map: its task list is
/// written to the checkpoint (idempotent: the same list on every resume) and
/// the payload carries only where it is.
async fn batch_outcome(ctx: &Context, mut run: RunState, off: &Offsets) -> Result<PlanOutcome> {
    let tasks: Vec<u32> = off.tasks.iter().map(|t| t.task).collect();
    let distributed = tasks.len() as u64 > ctx.pipeline.limits.max_inline_tasks;
    let merge = merges(ctx, off).await?;
    let dedup = dedups(ctx, off).await?;
    let events = batch_events(
        tasks.len() as u64,
        distributed,
        merge.len() as u64,
        dedup.len() as u64,
    );
    let resumed = off.epoch != run.epoch;
    // The first batch of an execution always goes: one batch must fit.
    if run.batches >= ctx.pipeline.limits.max_batches_per_execution
        || (run.batches > 0 && run.events + events > EVENT_BUDGET)
    {
        return continue_run(ctx, run).await;
    }
    let express = super::usage::express_started();
    if let Some(why) =
        express.and_then(|started| needs_standard(&run, distributed, resumed, started, ctx.now()))
    {
        tracing::info!(pipeline = %ctx.pipeline.name, batch = off.batch, why, "handing the run over to a Standard execution");
        return continue_run(ctx, run).await;
    }
    run.express = express.is_some();
    run.batch_ms = ctx.now();
    run.batches += 1;
    run.events += events;
    let mut task_list = None;
    if distributed {
        let key = ctx
            .checkpoint
            .put_task_list(off.batch, run.epoch, &tasks)
            .await?;
        task_list = Some(TaskList::of(&ctx.pipeline.checkpoint, &key));
    }
    Ok(PlanOutcome::Batch {
        run,
        batch: BatchRef {
            batch: off.batch,
            task_count: tasks.len() as u64,
            tasks: if distributed { Vec::new() } else { tasks },
            distributed,
            task_list,
            files: off.inputs.len() as u64,
            bytes: off.bytes(),
            resumed,
            merge,
            dedup,
        },
    })
}

/// Why an Express execution that started at `started_ms` must hand its
/// run over to a Standard one before `run`'s next batch, if it must: the
/// batch needs a Distributed Map (Express has none); an earlier execution
/// planned it and did not finish it (it may not fit in 5 minutes, and an
/// Express execution stopped at its limit would leave it to the next one
/// again); or, at the mean pace of this execution's batches so far, the
/// batch would end past [`EXPRESS_BUDGET_MS`](crate::deploy::EXPRESS_BUDGET_MS).
fn needs_standard(
    run: &RunState,
    distributed: bool,
    resumed: bool,
    started_ms: i64,
    now_ms: i64,
) -> Option<&'static str> {
    if distributed {
        return Some("the batch needs a Distributed Map");
    }
    if resumed {
        return Some("an earlier execution planned the batch and did not finish it");
    }
    let elapsed = (now_ms - started_ms).max(0);
    let pace = if run.batches == 0 {
        0
    } else {
        elapsed / run.batches as i64
    };
    (elapsed + 2 * pace > crate::deploy::EXPRESS_BUDGET_MS)
        .then_some("the batch would not end well inside the Express execution's 5 minutes")
}

/// After a run's last batch of a stateful query over windows: when the
/// watermark that batch committed has moved past the one its merges
/// closed windows with, plan one more batch with no input, whose merges
/// close the windows the new watermark passed (Spark's AvailableNow does
/// the same; without it the last windows would wait for the next data).
async fn trailing_batch(
    ctx: &Context,
    run: &RunState,
    control: &Control,
) -> Result<Option<Offsets>> {
    if !closing_owed(&ctx.pipeline, control, ctx.now()) {
        return Ok(None);
    }
    // The wall clock's advance is recorded before the batch that closes
    // windows with it, so its tasks and merges read it from control.
    let wm = watermark::current(&ctx.pipeline, control, ctx.now());
    if wm != watermark::in_force(control) {
        ctx.checkpoint
            .update_control(run.epoch, &|c| {
                if let Some(s) = &mut c.stateful {
                    s.watermark_us = s.watermark_us.max(wm);
                }
            })
            .await?;
    }
    let schema = in_force(&ctx.pipeline, Some(control), ctx.schema().await?.as_ref());
    let batch = control.next_batch();
    let query = plan_query(ctx, &schema, paths::checkpoint::offsets(batch)).await?;
    let off = Offsets {
        format_version: checkpoint::FORMAT_VERSION,
        batch,
        epoch: run.epoch,
        history: control.history.clone(),
        planned_ms: ctx.now(),
        inputs: Vec::new(),
        tasks: Vec::new(),
        consumed: Vec::new(),
        source: None,
        stream: None,
        schema: Some(schema),
        added_columns: Vec::new(),
        query: Some(query),
        // (Its merges plan the query's stages with them.)
        statics: if ctx.pipeline.statics.is_empty() {
            Vec::new()
        } else {
            ctx.pin_statics().await?
        },
        plan_ms: 0,
        plan_requests: RequestCounts::default(),
        task_bytes: None,
    };
    ctx.checkpoint.create_offsets(&off).await?;
    tracing::info!(pipeline = %ctx.pipeline.name, batch = off.batch, "a batch with no input closes the windows the watermark passed");
    Ok(Some(off))
}

/// When and with how many requests a plan step started.
struct PlanClock {
    started: std::time::Instant,
    counts: RequestCounts,
}

/// The first Plan of a run that no trigger started (`sluice run`, or an
/// execution started without a run): check for new input without writing,
/// then claim the lease and plan (or resume).
// Long because it is the first plan's decisions in the order the lease
// protocol needs them (reset, pause, claimable, look, schema, pending,
// sink owner, claim, recover), each one call: split further, the order
// would no longer read in one place.
async fn start(ctx: &Context, clock: &PlanClock) -> Result<PlanOutcome> {
    let mut busy = None;
    // A second attempt when the run that held the lease had ended by the
    // time it was asked to look again.
    for _ in 0..2 {
        let outcome = start_once(ctx, clock).await?;
        let PlanOutcome::Busy {
            owner,
            heartbeat_age_s,
            ..
        } = outcome
        else {
            return Ok(outcome);
        };
        if ask_holder(ctx).await? {
            return Ok(PlanOutcome::Busy {
                owner,
                heartbeat_age_s,
                asked: true,
            });
        }
        busy = Some((owner, heartbeat_age_s));
    }
    let (owner, heartbeat_age_s) = busy.expect("busy twice");
    Ok(PlanOutcome::Busy {
        owner,
        heartbeat_age_s,
        asked: false,
    })
}

/// A live run holds the lease: set `requested`, as a trigger does, so it
/// discovers once more before it ends and takes what landed since it
/// looked. `false`: it had ended meanwhile. A heartbeat changing control
/// in between is decided again.
async fn ask_holder(ctx: &Context) -> Result<bool> {
    for _ in 0..5 {
        let Some((control, etag)) = ctx.checkpoint.control().await? else {
            return Ok(false);
        };
        if control.status != RunStatus::Running {
            return Ok(false);
        }
        if control.requested {
            return Ok(true);
        }
        let next = checkpoint::requested(&control);
        if ctx
            .checkpoint
            .swap_control(&next, Some(&etag))
            .await?
            .is_some()
        {
            tracing::info!(pipeline = %ctx.pipeline.name, epoch = control.epoch, "a run holds the lease; asked it to look again before it ends");
            return Ok(true);
        }
    }
    Err(ctx.conflict(
        "control.json kept changing while this run asked the running one to look again".into(),
    ))
}

/// One attempt of [`start`].
async fn start_once(ctx: &Context, clock: &PlanClock) -> Result<PlanOutcome> {
    let p = &ctx.pipeline;
    let read = ctx.checkpoint.control().await?;
    let control = read.as_ref().map(|(c, _)| c);
    if control.is_some_and(|c| c.resetting) {
        return Err(resetting(ctx));
    }
    let now = ctx.now();
    if let Some(c) = control.filter(|c| c.paused) {
        record_request(ctx, c).await?;
        return Ok(PlanOutcome::Paused);
    }
    let (epoch, recover) = match may_claim(ctx, control, now) {
        Ok(take) => take,
        Err(outcome) => return Ok(*outcome),
    };
    let source = Source::of(p);
    // (Files `sluice retry-quarantined` asked for are work too.)
    let settled = control.is_some_and(|c| {
        c.status == RunStatus::Idle
            && c.spec_hash == p.spec_hash()
            && c.retry.is_empty()
            && !closing_owed(p, c, ctx.now())
    });
    let looked = match source.look(&ctx.scope(), control, settled).await? {
        Look::Idle => {
            let calls = idle_calls(ctx);
            ctx.metric(|| idle_lag(ctx, source, calls));
            return Ok(idle("no new data"));
        }
        Look::Maybe(l) => l,
    };
    // Resolve the schema and check the SQL before writing anything.
    let Some((schema, recorded)) = checked_schema(ctx, control, &looked.listed).await? else {
        // What can be checked without a file is: a query that cannot run
        // whatever the columns (a join, a syntax error) is refused now.
        super::check_against_hints(ctx, control).await?;
        let kinesis = p.source.discovery == crate::pipeline::DiscoveryMode::Kinesis;
        // A topic read from its end: where it starts is recorded now, so
        // the records that arrive before a run can infer the schema are
        // read, not passed over by a later run's "latest".
        if !recover
            && source.is_stream()
            && p.source.starting_offsets == crate::pipeline::StartingOffsets::Latest
            && control.is_none_or(|c| !c.stream_started())
        {
            let etag = read.as_ref().map(|(_, e)| e.as_str());
            let (run, next) = match claim_run(ctx, control, etag, epoch, now, recover).await? {
                Ok(claimed) => claimed,
                Err(busy) => return Ok(busy),
            };
            source
                .find_new(&ctx.scope(), epoch, &next, Seen::Nothing, false)
                .await?;
            release(ctx, &run, RunStatus::Idle).await?;
            let calls = idle_calls(ctx);
            ctx.metric(|| idle_lag(ctx, source, calls));
            return Ok(idle(if kinesis {
                "started at the end of the stream (starting_position = \"latest\"); no record \
                 waits, and no source.schema is declared: the query is checked once records \
                 arrive"
            } else {
                "started at the end of the topic (starting_offsets = \"latest\"); no record \
                 waits, and no source.schema is declared: the query is checked once records \
                 arrive"
            }));
        }
        if p.source.discovery == crate::pipeline::DiscoveryMode::Delta {
            return Ok(idle(
                "no Delta table at the source yet (no _delta_log/ commit): the query is checked \
                 once the table has a schema",
            ));
        }
        if kinesis {
            return Ok(idle(
                "no record with fields in the stream yet (one whose data is a JSON object), and \
                 no source.schema declared: the query is checked once one arrives (declare \
                 source.schema to check it now; `sluice check` says what it could check)",
            ));
        }
        return Ok(idle(
            "no input files yet, and no source.schema declared: the query is checked once the \
             first file arrives (declare source.schema to check it now; `sluice check` says \
             what it could check)",
        ));
    };
    if let Some(c) = control {
        check_state_shape(ctx, c).await?;
    }
    // Batches may wait planned, or committed and not recorded.
    let recover = recover || control.is_some_and(|c| c.resume);
    // Without a dead run to recover, look for new input before writing
    // anything: processed files deleted from the source, or a changed spec,
    // change the listing without making work. (Notify mode looked above.)
    // Work without new input: files asked for again, or a batch that
    // closes windows (a stateful query's watermark moved).
    let owed = control.is_some_and(|c| !c.retry.is_empty() || closing_owed(p, c, ctx.now()));
    let Some(seen) = source
        .pending(&ctx.scope(), control, looked, recover, owed)
        .await?
    else {
        let calls = idle_calls(ctx);
        ctx.metric(|| idle_lag(ctx, source, calls));
        return Ok(idle("no new data"));
    };
    let etag = read.as_ref().map(|(_, e)| e.as_str());
    let (run, next) = match claim_run(ctx, control, etag, epoch, now, recover).await? {
        Ok(claimed) => claimed,
        Err(busy) => return Ok(busy),
    };
    if let Recorded::Not { etag } = &recorded {
        record_spec(ctx, &next, &schema, etag.as_deref()).await?;
    }
    let control = if recover {
        // Temporary files of the dead run's killed writes.
        ctx.sink.sweep().await?;
        ctx.checkpoint.sweep_temp().await?;
        if let (Some(off), _) = resume_planned(ctx, &run, &next).await? {
            return batch_outcome(ctx, run, &off).await;
        }
        ctx.checkpoint.owned_control(epoch).await?.0
    } else {
        next
    };
    discover_and_plan(ctx, run, &control, seen, clock).await
}

/// Before anything is written, whether the sink is this checkpoint's;
/// then claim the lease as `epoch` (compare-and-swap on `etag`, the
/// control read): the run and the control it wrote, or the outcome when
/// another run claimed it first.
async fn claim_run(
    ctx: &Context,
    control: Option<&Control>,
    etag: Option<&str>,
    epoch: u64,
    now: i64,
    recover: bool,
) -> Result<std::result::Result<(RunState, Control), PlanOutcome>> {
    let sink = ownership::check_sink(ctx, control).await?;
    let next = checkpoint::claimed(control, epoch, &ctx.owner, now, "");
    Ok(match take_lease(ctx, &next, etag, recover, sink).await? {
        Some(run) => Ok((run, next)),
        None => Err(PlanOutcome::Busy {
            owner: "another run (it claimed the lease first)".into(),
            heartbeat_age_s: 0,
            asked: false,
        }),
    })
}

/// A paused pipeline asked to run: recorded, so `sluice resume` knows a
/// run was asked for.
async fn record_request(ctx: &Context, control: &Control) -> Result<()> {
    if control.requested {
        return Ok(());
    }
    ctx.checkpoint
        .change_control(|read| match read {
            Some(c) if c.paused => {
                let mut next = c.clone();
                next.requested = true;
                Ok((next, ()))
            }
            _ => {
                Err(ctx.conflict("control.json changed while this run recorded its request".into()))
            }
        })
        .await
}

/// Claim the lease as `next` says (compare-and-swap on `etag`, the
/// control read), then make the sink this checkpoint's if no history
/// holds it yet. `None`: another run claimed the lease first. A sink of
/// an earlier history refuses the run and releases the lease.
async fn take_lease(
    ctx: &Context,
    next: &Control,
    etag: Option<&str>,
    recover: bool,
    sink: SinkCheck,
) -> Result<Option<RunState>> {
    let p = &ctx.pipeline;
    let epoch = next.epoch;
    if ctx.checkpoint.swap_control(next, etag).await?.is_none() {
        return Ok(None);
    }
    let run = RunState {
        pipeline: p.name.clone(),
        epoch,
        trigger: Some(match Owner::parse(&ctx.owner) {
            Owner::Local { .. } => "sluice run".into(),
            _ => "execution input".into(),
        }),
        spec: p.spec_hash(),
        ..Default::default()
    };
    tracing::info!(pipeline = %p.name, epoch, recover, "lease taken");
    let owned = match sink {
        SinkCheck::Ours => Ok(()),
        SinkCheck::Unclaimed => ownership::claim_sink(ctx, next).await,
        SinkCheck::Earlier(o) => Err(ownership::earlier_history(ctx, &o, &next.history)),
    };
    if let Err(e) = owned {
        release(ctx, &run, RunStatus::Idle).await?;
        return Err(e);
    }
    Ok(Some(run))
}

/// Records the spec this run plans under and the schema it pinned
/// (`pipeline.json`), once the run holds the lease: compare-and-swap on
/// the record read before the claim (`etag`; `None`: none was there), so a
/// run stopped past its lease cannot put back an older spec.
async fn record_spec(
    ctx: &Context,
    control: &Control,
    schema: &SchemaRef,
    etag: Option<&str>,
) -> Result<()> {
    let p = &ctx.pipeline;
    let record = PipelineRecord {
        format_version: checkpoint::FORMAT_VERSION,
        spec_hash: p.spec_hash(),
        pipeline: (**p).clone(),
        schema: columns_of(schema),
        first_batch: control.first_batch,
    };
    if ctx.checkpoint.swap_pipeline_record(&record, etag).await? {
        return Ok(());
    }
    Err(ctx.conflict(
        "pipeline.json changed while this run recorded its spec (a `sluice register`, or \
         another run); run again"
            .into(),
    ))
}

/// The first Plan of an execution a trigger started (the trigger claimed
/// the lease): check the sink is this checkpoint's and record it if it has
/// no owner yet; if not, give the lease back and stop.
async fn own_sink(ctx: &Context, run: &RunState, control: &Control) -> Result<()> {
    let owned = match ownership::check_sink(ctx, Some(control)).await {
        Ok(SinkCheck::Ours) => Ok(()),
        Ok(SinkCheck::Unclaimed) => ownership::claim_sink(ctx, control).await,
        Ok(SinkCheck::Earlier(o)) => Err(ownership::earlier_history(ctx, &o, &control.history)),
        Err(e) => Err(e),
    };
    if let Err(e) = owned {
        release(ctx, run, RunStatus::Idle).await?;
        return Err(e);
    }
    Ok(())
}

/// A run found `sluice reset` part-way.
fn resetting(ctx: &Context) -> Error {
    Error::Run {
        pipeline: ctx.pipeline.name.clone(),
        message: "a `sluice reset` is under way (or was interrupted); run it again to finish \
                  it before any run starts"
            .into(),
        class: crate::error::ErrorClass::InvalidInput,
    }
}

fn idle(reason: &str) -> PlanOutcome {
    PlanOutcome::Idle {
        reason: reason.into(),
    }
}

/// The epoch this run may claim (and whether its holder died), or why not:
/// paused, or a live run holds the lease.
fn may_claim(
    ctx: &Context,
    control: Option<&Control>,
    now: i64,
) -> std::result::Result<(u64, bool), Box<PlanOutcome>> {
    let gone = control
        .and_then(|c| c.owner.as_deref())
        .is_some_and(|o| (ctx.owner_gone)(o));
    match checkpoint::decide_claim(control, now, ctx.ttl_ms(), gone) {
        Claim::Take { epoch, recover } => Ok((epoch, recover)),
        Claim::Busy {
            owner,
            heartbeat_age_ms,
        } => Err(Box::new(PlanOutcome::Busy {
            owner,
            heartbeat_age_s: heartbeat_age_ms / 1000,
            asked: false,
        })),
    }
}

/// Whether `pipeline.json` holds the spec a run plans under.
enum Recorded {
    /// It does.
    Current,
    /// It does not; the record read has this etag (`None`: there is none,
    /// or it is of a history a reset retired).
    Not {
        /// What a compare-and-swap of the record expects.
        etag: Option<String>,
    },
}

/// The source schema, with the SQL checked against it, and whether
/// `pipeline.json` already holds this spec; `None` with nothing to infer
/// the schema from. A batch committed under this very spec means
/// `pipeline.json` holds it (a run writes it before planning); with the
/// schema known here (declared, or pinned earlier in this process) there is
/// nothing to read or check against it. A record of a history a reset
/// retired pins nothing: the schema is resolved again.
async fn checked_schema(
    ctx: &Context,
    control: Option<&Control>,
    listed: &[ObjectMeta],
) -> Result<Option<(SchemaRef, Recorded)>> {
    let p = &ctx.pipeline;
    let declared = p.source.declared_schema().map_err(|e| Error::Spec {
        file: p.name.clone(),
        message: format!("source.schema{e}"),
    })?;
    let known = ctx.known_schema().or(declared);
    let recorded =
        control.is_some_and(|c| c.spec_hash == p.spec_hash() && c.last_committed.is_some());
    let (schema, current) = match known {
        Some(schema) if recorded => (schema, Recorded::Current),
        _ => {
            let first = control.map_or(0, |c| c.first_batch);
            let read = ctx.checkpoint.pipeline_record_tagged().await?;
            let (record, etag) = match read {
                Some((r, etag)) if r.first_batch == first => (Some(r), Some(etag)),
                Some((_, etag)) => (None, Some(etag)),
                None => (None, None),
            };
            let Some(schema) = resolve_schema(ctx, record.as_ref(), listed).await? else {
                return Ok(None);
            };
            let current = match record {
                Some(r) if r.spec_hash == p.spec_hash() => Recorded::Current,
                _ => Recorded::Not { etag },
            };
            (schema, current)
        }
    };
    let reading = in_force(p, control, &schema);
    let reading = super::schema::arrow_of(ctx, &reading, crate::paths::checkpoint::CONTROL.into())?;
    // A query (or its spec) changed: a Delta table that could not take
    // its rows is refused now, before a batch is committed that could not
    // be published.
    if let (_, Some(output)) = ctx.checking_operator(reading).await?.check_output().await? {
        ctx.sink.delta_schema_check(&output).await?;
    }
    ctx.pin_schema(schema.clone());
    Ok(Some((schema, current)))
}

/// After a dead run, a hand-over or a cancel (`control.resume`), or
/// another execution of this run: finish the batches from the next one on
/// that were committed but not recorded in control (`true` if any), and
/// return the first batch planned and not committed, if any (two reads
/// when there is nothing). Records of another history (a run a
/// reset retired wrote them late) are not this history's: removed.
async fn resume_planned(
    ctx: &Context,
    run: &RunState,
    control: &Control,
) -> Result<(Option<Offsets>, bool)> {
    let first = control.next_batch();
    let mut n = first;
    while let Some(commit) = ctx
        .checkpoint
        .commit_of(n, &control.history, run.epoch)
        .await?
    {
        finish_commit(ctx, run, control, &commit, Charge::Plan, None, false).await?;
        n += 1;
    }
    let off = ctx
        .checkpoint
        .offsets_of(n, &control.history, run.epoch)
        .await?;
    if off.is_some() {
        tracing::info!(pipeline = %ctx.pipeline.name, batch = n, "resuming a batch planned by an earlier run");
    }
    Ok((off, n != first))
}

/// The plans of the batches `fresh` is cut into, numbered after the last
/// committed batch; each reads with the schema the batches before it
/// leave (`add-columns` may add columns at any of them), and says what
/// its query is.
async fn plan_batches(
    ctx: &Context,
    run: &RunState,
    control: &Control,
    source: &Source,
    fresh: &crate::discovery::Fresh,
) -> Result<Vec<Offsets>> {
    let p = &ctx.pipeline;
    let first = control.next_batch();
    let now = ctx.now();
    let mut plans = Vec::new();
    let mut schema = in_force(p, Some(control), ctx.schema().await?.as_ref());
    let mut planned_for: Option<(checkpoint::SchemaVersion, checkpoint::QueryShape)> = None;
    // The static tables as they stand now: every batch of this plan
    // joins this version of them.
    let statics = if p.statics.is_empty() {
        Vec::new()
    } else {
        ctx.pin_statics().await?
    };
    let task_bytes = planning::paced_task_bytes(&p.limits, control.pace.as_ref());
    for (i, planned) in source.batches(fresh, &p.limits).into_iter().enumerate() {
        let crate::discovery::Planned {
            inputs,
            source: cursor,
            mut stream,
        } = planned;
        let (read_with, added_columns) = evolve(ctx, &schema, &inputs).await?;
        schema = read_with;
        let tasks = match &mut stream {
            // A record stream's ranges, cut into the units its tasks read.
            Some(s) if !s.shards.is_empty() => {
                planning::split_shard_tasks(&s.shards, p.limits.max_records_per_task)
            }
            Some(s) => {
                let (units, tasks) =
                    planning::split_record_tasks(&s.ranges, p.limits.max_records_per_task);
                s.ranges = units;
                tasks
            }
            None => {
                planning::split_tasks(&inputs, task_bytes.unwrap_or(p.limits.max_bytes_per_task))
            }
        };
        let cut = if stream.is_none() { task_bytes } else { None };
        let consumed = fresh.consumed(&inputs);
        let batch = first + i as u64;
        // The query is planned once per schema the batches read with.
        let query = match &planned_for {
            Some((s, q)) if *s == schema => q.clone(),
            _ => plan_query(ctx, &schema, paths::checkpoint::offsets(batch)).await?,
        };
        planned_for = Some((schema.clone(), query.clone()));
        plans.push(Offsets {
            format_version: checkpoint::FORMAT_VERSION,
            batch,
            epoch: run.epoch,
            history: control.history.clone(),
            planned_ms: now,
            inputs,
            tasks,
            consumed,
            source: cursor,
            stream,
            schema: Some(schema.clone()),
            added_columns,
            query: Some(query),
            statics: statics.clone(),
            plan_ms: 0,
            plan_requests: RequestCounts::default(),
            task_bytes: cut,
        });
    }
    Ok(plans)
}

/// Discover new input (AvailableNow: what is there now) and write the plans
/// of all its batches, create-only, before any output exists.
async fn discover_and_plan(
    ctx: &Context,
    mut run: RunState,
    control: &Control,
    seen: Seen,
    clock: &PlanClock,
) -> Result<PlanOutcome> {
    let p = &ctx.pipeline;
    let source = Source::of(p);
    source.check_checkpoint(&ctx.scope(), control).await?;
    let mut seen = Some(seen);
    let mut first_look = true;
    let fresh = loop {
        let seen = seen.take().unwrap_or(Seen::Nothing);
        let found = match source
            .find_new(&ctx.scope(), run.epoch, control, seen, first_look)
            .await
        {
            Ok(found) => found,
            // Input this run cannot take (records lost, a topic changed):
            // the lease goes back, as for a refused query.
            Err(e) if e.class() == ErrorClass::InvalidInput => {
                release(ctx, &run, RunStatus::Idle).await?;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        first_look = false;
        run.discovered = true;
        if !found.is_empty() {
            break found;
        }
        if !found.more {
            // Nothing new: a stateful query may still owe the batch with
            // no input that closes windows (a resumed run reaches it here).
            let (now, _) = ctx.checkpoint.owned_control(run.epoch).await?;
            if let Some(off) = trailing_batch(ctx, &run, &now).await? {
                return batch_outcome(ctx, run, &off).await;
            }
        }
        // A slice of duplicates only: take the next slice.
        if !found.more && release_idle(ctx, &run).await? {
            return Ok(PlanOutcome::Done { run });
        }
    };
    if fresh.more {
        // What this slice left in the inbox is discovered at the end of the
        // run (or by the execution that continues it).
        ctx.checkpoint
            .update_control(run.epoch, &|c| c.requested = true)
            .await?;
    }
    if let Err(e) = check_state_shape(ctx, control).await {
        release(ctx, &run, RunStatus::Idle).await?;
        return Err(e);
    }
    let mut plans = plan_batches(ctx, &run, control, &source, &fresh).await?;
    let plan_ms = clock.started.elapsed().as_millis() as u64;
    let mut plan_requests = ctx.counts().since(&clock.counts);
    // Each plan's own create-only write is counted once, in its batch.
    plan_requests.put_create += 1;
    for off in &mut plans {
        off.plan_ms = plan_ms;
        off.plan_requests = plan_requests;
    }
    for off in &plans {
        ctx.checkpoint.create_offsets(off).await?;
    }
    tracing::info!(pipeline = %p.name, files = fresh.inputs.len(), batches = plans.len(), "planned new input");
    ctx.metric(|| {
        if source.is_stream() {
            let records = plans.iter().filter_map(|o| o.stream.as_ref());
            let records = records.map(|s| s.records()).sum();
            return crate::metrics::stream_lag_line(&p.name, ctx.now(), records, None);
        }
        let inputs = plans.iter().flat_map(|o| o.inputs.iter());
        let oldest = inputs.clone().filter_map(|i| i.modified_ms).min();
        let (files, bytes) = inputs.fold((0, 0), |(n, b), i| (n + 1, b + i.size));
        crate::metrics::lag_line(&p.name, ctx.now(), files, bytes, oldest)
    });
    batch_outcome(ctx, run, &plans[0]).await
}

/// A Kinesis run that finds nothing to do: its calls and those refused
/// for throughput, taken from the step's tally whether or not a metric
/// line is written, so the next batch planned in this process does not
/// count them as its own.
fn idle_calls(ctx: &Context) -> Option<(u64, u64)> {
    crate::discovery::kinesis_idle_tally(&ctx.pipeline)
}

/// The lag line of a run that finds nothing to do.
/// `calls`: a Kinesis run's ([`idle_calls`]).
fn idle_lag(ctx: &Context, source: Source, calls: Option<(u64, u64)>) -> String {
    match source.is_stream() {
        true => crate::metrics::stream_lag_line(&ctx.pipeline.name, ctx.now(), 0, calls),
        false => crate::metrics::lag_line(&ctx.pipeline.name, ctx.now(), 0, 0, None),
    }
}

#[cfg(test)]
mod tests {
    //! The plan step's decisions over in-memory stores: idle without a
    //! write, new input planned into batches within the limits (every plan
    //! written before any output), a live lease refused, a paused pipeline
    //! recording the request.

    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::pipeline::Pipeline;
    use crate::storage::{MemoryStore, PutMode, Store};

    fn pipeline() -> Pipeline {
        let toml = r#"name = "p"
[source]
uri = "input"
format = "csv"
table = "t"
schema = [{ name = "x", type = "bigint" }]
[query]
sql = "SELECT x FROM t"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_files_per_batch = 2
"#;
        Pipeline::parse(toml, "p.toml", std::path::Path::new("/w")).unwrap()
    }

    /// A pipeline over `files` CSV files in memory.
    async fn context(files: u64) -> Context {
        let source = MemoryStore::new();
        for i in 0..files {
            source
                .put(
                    &format!("f{i}.csv"),
                    Bytes::from_static(b"x\n1\n"),
                    PutMode::Overwrite,
                )
                .await
                .unwrap();
        }
        Context::new(
            pipeline(),
            Arc::new(source),
            Arc::new(MemoryStore::new()),
            Arc::new(MemoryStore::new()),
        )
    }

    #[tokio::test]
    async fn no_input_is_idle_and_writes_nothing() {
        let ctx = context(0).await;
        let out = plan(&ctx, None).await.unwrap();
        assert!(matches!(out, PlanOutcome::Idle { .. }), "{out:?}");
        let written = ctx.checkpoint.store().list("", None).await.unwrap();
        assert!(written.is_empty(), "{written:?}");
    }

    #[tokio::test]
    async fn new_files_are_planned_into_batches_within_the_limits() {
        let ctx = context(5).await;
        let out = plan(&ctx, None).await.unwrap();
        let PlanOutcome::Batch { batch, run } = out else {
            panic!("{out:?}");
        };
        assert_eq!((batch.batch, batch.files), (0, 2));
        // The plans of all three batches (2 + 2 + 1 files) exist before any
        // output does, and the lease is this run's.
        let mut planned = Vec::new();
        for b in 0..4 {
            planned.push(
                ctx.checkpoint
                    .store()
                    .get(&crate::paths::checkpoint::offsets(b))
                    .await
                    .unwrap()
                    .map(|o| serde_json::from_slice::<Offsets>(&o.bytes).unwrap()),
            );
        }
        let files: Vec<usize> = planned.iter().flatten().map(|o| o.inputs.len()).collect();
        assert_eq!(files, [2, 2, 1]);
        let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
        assert_eq!((c.status, c.epoch), (RunStatus::Running, run.epoch));
        assert!(ctx.sink.store().list("", None).await.unwrap().len() <= 1);
    }

    #[tokio::test]
    async fn a_live_lease_is_refused_and_a_paused_pipeline_records_the_request() {
        let ctx = context(1).await;
        let first = plan(&ctx, None).await.unwrap();
        assert!(matches!(first, PlanOutcome::Batch { .. }), "{first:?}");
        let second = plan(&ctx, None).await.unwrap();
        assert!(matches!(second, PlanOutcome::Busy { .. }), "{second:?}");

        let paused = context(1).await;
        paused
            .checkpoint
            .change_control(|_| {
                let mut c = Control::new(paused.pipeline.spec_hash());
                c.paused = true;
                Ok((c, ()))
            })
            .await
            .unwrap();
        let out = plan(&paused, None).await.unwrap();
        assert!(matches!(out, PlanOutcome::Paused), "{out:?}");
        let (c, _) = paused.checkpoint.control().await.unwrap().unwrap();
        assert!(c.requested && c.paused && c.owner.is_none());
    }
}
