//! What a batch uses of what AWS bills by use, as the handlers see it:
//! each invocation's billed duration (its wall time rounded up to the
//! millisecond); its function's configured memory and the state
//! transitions it takes come from [`crate::deploy`].

use std::time::Instant;

tokio::task_local! {
    /// When the handler invocation running in this task started, how
    /// many attempts of its step failed before it, and the process's CPU
    /// time then (µs).
    static STARTED: (Instant, u64, u64);
}

tokio::task_local! {
    /// The Express execution the Plan invocation in progress runs in.
    static EXPRESS: Option<Express>;
}

/// An Express execution, as its Plan is told of it.
#[derive(Clone)]
struct Express {
    /// When it started, ms since the Unix epoch.
    started: i64,
    /// Its id (`$$.Execution.Id`).
    id: Option<String>,
    /// The token of this copy of it (first Plan only).
    copy: Option<String>,
}

/// The Express execution the Plan in progress runs in, as its first Plan
/// is told of it.
pub(crate) struct ExpressCopy {
    /// Its id (`$$.Execution.Id`), if the definition passes it.
    pub id: Option<String>,
    /// The token of this copy of it, if the definition draws one.
    pub copy: Option<String>,
}

/// Run `f` as one handler invocation, timed from now, after `retries`
/// failed attempts of the same step (`$$.State.RetryCount`).
pub(crate) async fn timed<F: std::future::Future>(retries: u64, f: F) -> F::Output {
    STARTED
        .scope((Instant::now(), retries, process_cpu_us()), f)
        .await
}

/// Run the Plan invocation `f` of `req` (its execution's workflow, id,
/// start time in RFC 3339, and on a first Plan the copy's token). An
/// Express execution without a start time is taken to have started now.
pub(crate) fn in_execution<F: std::future::Future>(
    req: &crate::handlers::PlanRequest,
    now_ms: i64,
    f: F,
) -> impl std::future::Future<Output = F::Output> {
    let express = express_of(req.workflow, req.started.as_deref(), now_ms).map(|started| Express {
        started,
        id: req.execution.clone(),
        copy: req.copy.clone(),
    });
    EXPRESS.scope(express, f)
}

/// Run the Commit invocation `f` of `req` (its execution's workflow and
/// start time), as [`in_execution`] a Plan.
pub(crate) fn in_commit<F: std::future::Future>(
    req: &crate::handlers::CommitRequest,
    now_ms: i64,
    f: F,
) -> impl std::future::Future<Output = F::Output> {
    let express = express_of(req.workflow, req.started.as_deref(), now_ms).map(|started| Express {
        started,
        id: None,
        copy: None,
    });
    EXPRESS.scope(express, f)
}

/// In an Express execution, when it started (RFC 3339 `started`) in ms
/// since the Unix epoch, now when not given or unreadable; `None` in a
/// Standard one.
fn express_of(
    workflow: crate::deploy::Workflow,
    started: Option<&str>,
    now_ms: i64,
) -> Option<i64> {
    (workflow == crate::deploy::Workflow::Express).then(|| {
        started
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map_or(now_ms, |t| t.timestamp_millis())
    })
}

/// When the Express execution the Plan in progress runs in started, ms
/// since the Unix epoch (`None`: a Standard execution, or no Plan).
pub(crate) fn express_started() -> Option<i64> {
    EXPRESS
        .try_with(|e| e.as_ref().map(|e| e.started))
        .ok()
        .flatten()
}

/// The Express execution the Plan in progress runs in (`None`: a
/// Standard execution, or no Plan).
pub(crate) fn express_execution() -> Option<ExpressCopy> {
    EXPRESS
        .try_with(|e| {
            e.as_ref().map(|e| ExpressCopy {
                id: e.id.clone(),
                copy: e.copy.clone(),
            })
        })
        .ok()
        .flatten()
}

/// Failed attempts of the step before the invocation in progress (0
/// outside [`timed`]).
pub(crate) fn retries() -> u64 {
    STARTED.try_with(|s| s.1).unwrap_or(0)
}

/// Whether the handler invocation in progress is its step's first attempt
/// (false outside [`timed`]: not known).
pub(crate) fn first_attempt() -> bool {
    STARTED.try_with(|s| s.1 == 0).unwrap_or(false)
}

/// CPU time of the process since the handler invocation in progress
/// started, ms (0 outside [`timed`]; see [`process_cpu_us`]).
pub(crate) fn invocation_cpu_ms() -> u64 {
    STARTED
        .try_with(|s| process_cpu_us().saturating_sub(s.2) / 1000)
        .unwrap_or(0)
}

/// Billed duration of the handler invocation in progress so far (0
/// outside [`timed`]).
pub(crate) fn invocation_ms() -> u64 {
    STARTED.try_with(|s| billed_ms(s.0)).unwrap_or(0)
}

/// The ending of an Express execution whose last commit ended the run
/// (`None` outside an Express execution's Commit): no Plan after it; one
/// request and the execution's duration up to now; its `Finished` and
/// `Copy` states (the `Committed` choice before them is the batch's).
pub(crate) fn commit_run_end(now_ms: i64) -> Option<crate::checkpoint::Usage> {
    let started = express_started()?;
    Some(crate::checkpoint::Usage {
        functions: Vec::new(),
        transitions: 0,
        express: crate::checkpoint::ExpressUsage {
            executions: 1,
            billed_ms: crate::deploy::express_billed_ms((now_ms - started).max(0) as u64),
            transitions: 2,
        },
    })
}

/// What one execution's ending used: the Plan invocation in progress
/// (and its failed attempts: invocations and transitions, their duration
/// unknown), and the transitions `Plan`, `HasBatch` and `Finished` (and
/// `Continue` when it hands over; the trigger invocation that step makes
/// records itself when it claims the lease).
pub(crate) fn run_end(handover: bool, now_ms: i64) -> crate::checkpoint::Usage {
    let retries = retries();
    let transitions = crate::deploy::run_end_transitions(handover) + retries;
    let functions = vec![crate::checkpoint::FunctionUsage::new(
        crate::deploy::PLANNER,
        1 + retries,
        invocation_ms(),
        crate::deploy::memory_mb(crate::deploy::PLANNER),
    )];
    match express_started() {
        // An Express execution: one request, its duration from its start
        // to now (what follows this Plan is a Choice and its end, or the
        // Continue step's trigger invocation), and its ending's
        // transitions, not billed.
        // (And its `Copy` state, entered once before its first Plan.)
        Some(started) => crate::checkpoint::Usage {
            functions,
            transitions: 0,
            express: crate::checkpoint::ExpressUsage {
                executions: 1,
                billed_ms: crate::deploy::express_billed_ms((now_ms - started).max(0) as u64),
                transitions: transitions + 1,
            },
        },
        None => crate::checkpoint::Usage {
            functions,
            transitions,
            express: Default::default(),
        },
    }
}

/// The CPU time (user and system) this process has used, microseconds
/// ([`timed`] takes it at the start of each invocation).
/// On Lambda a process runs one invocation at a time, so the difference
/// over an invocation is the invocation's; locally, invocations that
/// overlap (a batch's tasks) each count the others' too.
fn process_cpu_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec.max(0) as u64 * 1_000_000 + t.tv_nsec.max(0) as u64 / 1_000
}

/// Billed duration of an invocation that started at `started`: its wall
/// time so far rounded up to the millisecond (Lambda's billing unit).
pub(crate) fn billed_ms(started: Instant) -> u64 {
    (started.elapsed().as_micros() as u64).div_ceil(1000)
}
