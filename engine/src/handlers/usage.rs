//! What a batch uses of what AWS bills by use, as the handlers see it:
//! each invocation's billed duration (its wall time rounded up to the
//! millisecond) and its function's configured memory, and the state
//! transitions a batch takes through `statemachines/microbatch.asl.json`.

use std::time::Instant;

/// The functions, as usage records name them.
pub(crate) const PLANNER: &str = "planner";
/// The operator function (tasks and merges).
pub(crate) const OPERATOR: &str = "operator";
/// The committer function.
pub(crate) const COMMITTER: &str = "committer";
/// The trigger function (the state machine's Continue step invokes it).
pub(crate) const TRIGGER: &str = "trigger";

/// The template, whose `MemorySize` settings are what each function runs
/// with on AWS.
const TEMPLATE: &str = include_str!("../../../template.yaml");

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
            PLANNER,
            1 + retries,
            invocation_ms(),
            memory_mb(PLANNER),
        )],
        transitions: if handover { 4 } else { 3 } + retries,
    }
}

/// Billed duration of an invocation that started at `started`: its wall
/// time so far rounded up to the millisecond (Lambda's billing unit).
pub(crate) fn billed_ms(started: Instant) -> u64 {
    (started.elapsed().as_micros() as u64).div_ceil(1000)
}

/// The configured memory of `function`, MB: on Lambda, what the runtime
/// says the running function has; in-process, what `template.yaml`
/// configures for it (its `MemorySize`, else the Globals one).
pub(crate) fn memory_mb(function: &str) -> u64 {
    std::env::var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| template_memory_mb(TEMPLATE, function))
}

/// `MemorySize` of the `<Function>Function` resource in `template`, or of
/// `Globals: Function:`; 128 (Lambda's default) if neither sets it.
fn template_memory_mb(template: &str, function: &str) -> u64 {
    let resource = format!(
        "  {}{}Function:",
        function[..1].to_ascii_uppercase(),
        &function[1..]
    );
    let memory_in = |header: &str, indent: usize| -> Option<u64> {
        let mut lines = template.lines().skip_while(|l| l.trim_end() != header);
        lines.next()?;
        for line in lines {
            let depth = line.len() - line.trim_start().len();
            if !line.trim().is_empty() && depth <= indent {
                return None;
            }
            if let Some(v) = line.trim().strip_prefix("MemorySize:") {
                return v.trim().parse().ok();
            }
        }
        None
    };
    memory_in(&resource, 2)
        .or_else(|| memory_in("  Function:", 2))
        .unwrap_or(128)
}

/// State transitions of one batch through the definition: `Plan`,
/// `HasBatch`, the `Operate` (or `OperateMany`) map and one `RunTask` per
/// task (a Distributed Map's child execution runs one state per task too),
/// `MergeOrCommit`, for a stateful query the `Merge` map and one `RunMerge`
/// per state partition, `Commit` and `NextBatch`; and one per failed
/// attempt of any of its steps (a `Retry` enters the state again).
pub(crate) fn batch_transitions(tasks: u64, merges: u64, retries: u64) -> u64 {
    let merge = if merges > 0 { 1 + merges } else { 0 };
    6 + tasks + merge + retries
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values template.yaml sets (read by hand): the operator 3008 MB,
    /// the trigger 256 MB, the planner and committer the Globals' 1769 MB.
    #[test]
    fn memory_comes_from_the_template() {
        assert_eq!(template_memory_mb(TEMPLATE, "operator"), 3008);
        assert_eq!(template_memory_mb(TEMPLATE, "trigger"), 256);
        assert_eq!(template_memory_mb(TEMPLATE, "planner"), 1769);
        assert_eq!(template_memory_mb(TEMPLATE, "committer"), 1769);
        let bare = "Resources:\n  PlannerFunction:\n    Type: AWS::Serverless::Function\n";
        assert_eq!(template_memory_mb(bare, "planner"), 128);
    }
}
