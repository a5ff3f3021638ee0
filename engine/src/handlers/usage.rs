//! What a batch uses of what AWS bills by use, as the handlers see it:
//! each invocation's billed duration (its wall time rounded up to the
//! millisecond); its function's configured memory and the state
//! transitions it takes come from [`crate::deploy`].

use std::time::Instant;

tokio::task_local! {
    /// When the handler invocation running in this task started, and how
    /// many attempts of its step failed before it.
    static STARTED: (Instant, u64);
}

/// Run `f` as one handler invocation, timed from now, after `retries`
/// failed attempts of the same step (`$$.State.RetryCount`).
pub(crate) async fn timed<F: std::future::Future>(retries: u64, f: F) -> F::Output {
    STARTED.scope((Instant::now(), retries), f).await
}

/// Failed attempts of the step before the invocation in progress (0
/// outside [`timed`]).
pub(crate) fn retries() -> u64 {
    STARTED.try_with(|s| s.1).unwrap_or(0)
}

/// Billed duration of the handler invocation in progress so far (0
/// outside [`timed`]).
pub(crate) fn invocation_ms() -> u64 {
    STARTED.try_with(|s| billed_ms(s.0)).unwrap_or(0)
}

/// What one execution's ending used: the Plan invocation in progress
/// (and its failed attempts: invocations and transitions, their duration
/// unknown), and the transitions `Plan`, `HasBatch` and `Finished` (and
/// `Continue` when it hands over; the trigger invocation that step makes
/// records itself when it claims the lease).
pub(crate) fn run_end(handover: bool) -> crate::checkpoint::Usage {
    let retries = retries();
    crate::checkpoint::Usage {
        functions: vec![crate::checkpoint::FunctionUsage::new(
            crate::deploy::PLANNER,
            1 + retries,
            invocation_ms(),
            crate::deploy::memory_mb(crate::deploy::PLANNER),
        )],
        transitions: crate::deploy::run_end_transitions(handover) + retries,
    }
}

/// Billed duration of an invocation that started at `started`: its wall
/// time so far rounded up to the millisecond (Lambda's billing unit).
pub(crate) fn billed_ms(started: Instant) -> u64 {
    (started.elapsed().as_micros() as u64).div_ceil(1000)
}
