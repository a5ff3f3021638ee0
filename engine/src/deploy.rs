//! What the deployment fixes, read from one place: the functions'
//! names and configured memory (`template.yaml`), and the state
//! transitions and history events a batch takes through the definition
//! (`statemachines/microbatch.asl.json`, which the runner executes). The
//! usage records, the cost model and the execution's event budget read
//! them here; `tests/e2e/usage.rs` checks the transition counts against
//! what the runner counts as it interprets the definition, and the unit
//! test below the memory sizes against the template.

/// The state machine definition, compiled in from `statemachines/`.
pub(crate) const DEFINITION: &str = include_str!("../../statemachines/microbatch.asl.json");

/// The Express definition: [`DEFINITION`] made fit for Express by
/// [`express_of`] (a unit test keeps the file equal to it).
pub(crate) const EXPRESS_DEFINITION: &str =
    include_str!("../../statemachines/microbatch-express.asl.json");

/// Which kind of Step Functions execution a run's step runs in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workflow {
    /// Exactly-once, up to a year, billed per state transition.
    #[default]
    Standard,
    /// At-least-once, 5 minutes at most, no Distributed Map, billed per
    /// execution and its duration.
    Express,
}

/// How long an Express execution may run: Step Functions stops it then.
pub const EXPRESS_LIMIT_MS: i64 = 300_000;

/// An Express execution hands its run over to a Standard one unless its
/// next batch is expected to end by this long after the execution started
/// (a minute of the limit kept for a slow batch, the commit and the end).
pub const EXPRESS_BUDGET_MS: i64 = 240_000;

/// The memory an Express execution is billed at: its definition and
/// payloads in 64 MB steps. Sluice's payloads carry references (a few KB)
/// and the definition is 20 KB: the first step.
pub const EXPRESS_MEMORY_MB: u64 = 64;

/// An Express execution's billed duration: rounded up to 100 ms.
pub fn express_billed_ms(ms: u64) -> u64 {
    ms.div_ceil(100) * 100
}

/// The Express definition made from the Standard one: no Distributed Map
/// (`OperateMany`, `Settle`, and the choice that leads there), the
/// 5-minute limit, the Plan and Commit told they run in Express and when
/// the execution started, and a `Committed` choice after Commit that ends
/// the execution when the commit ended the run (its last batch: one Plan
/// invocation and one control write fewer a run).
pub fn express_of(standard: &serde_json::Value) -> serde_json::Value {
    let mut e = standard.clone();
    e["Comment"] = serde_json::Value::String(
        "Sluice, Express: the short runs of a pipeline (5 minutes at most, at-least-once). The \
         same states as microbatch.asl.json without the Distributed Map (OperateMany, Settle): \
         a batch that needs one, a batch an earlier execution left unfinished, or a run that \
         would not end well inside 5 minutes is handed over to a Standard execution through \
         Continue. Generated from microbatch.asl.json (engine/src/deploy.rs: express_of; a \
         unit test keeps them equal)."
            .into(),
    );
    e["TimeoutSeconds"] = (EXPRESS_LIMIT_MS / 1000).into();
    let states = e["States"].as_object_mut().expect("States is an object");
    states.remove("OperateMany");
    states.remove("Settle");
    if let Some(choices) = states["HasBatch"]["Choices"].as_array_mut() {
        choices.retain(|c| c["Next"] != "OperateMany");
    }
    let plan = &mut states["Plan"]["Parameters"];
    plan["workflow"] = "express".into();
    plan["started.$"] = "$$.Execution.StartTime".into();
    plan["execution.$"] = "$$.Execution.Id".into();
    let commit = &mut states["Commit"];
    commit["Parameters"]["workflow"] = "express".into();
    commit["Parameters"]["started.$"] = "$$.Execution.StartTime".into();
    commit["Next"] = "Committed".into();
    states.insert(
        "Committed".into(),
        serde_json::json!({
            "Comment": "The commit of the run's last batch gave the lease back in the write \
                        that recorded it (no trigger asked again meanwhile): the run is over.",
            "Type": "Choice",
            "Choices": [{
                "And": [
                    { "Variable": "$.ended", "IsPresent": true },
                    { "Variable": "$.ended", "BooleanEquals": true }
                ],
                "Next": "Finished"
            }],
            "Default": "Plan"
        }),
    );
    // Express is at-least-once: the same execution may run twice, even
    // under the same id. Each copy draws a token before its first Plan
    // (a Pass state, so a retry of that Plan keeps it), and the first Plan
    // claims the run for it: a copy that finds another token stops.
    let mut first = states["Plan"].clone();
    first["Parameters"]["copy.$"] = "$.copy.token".into();
    first["Comment"] = "The first Plan of this copy of the execution: it claims the run for \
                        the copy's token before anything is written, or stops (Sluice.Conflict) \
                        when another copy claimed it."
        .into();
    states.insert("FirstPlan".into(), first);
    states.insert(
        "Copy".into(),
        serde_json::json!({
            "Comment": "A token of this copy of the execution (Express runs an execution at \
                        least once, possibly twice under one id).",
            "Type": "Pass",
            "Parameters": { "token.$": "States.UUID()" },
            "ResultPath": "$.copy",
            "Next": "FirstPlan"
        }),
    );
    e["StartAt"] = "Copy".into();
    e
}

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
const TEMPLATE: &str = include_str!("../../template.yaml");

/// The transitions of an execution's ending: `Plan`, `HasBatch` and
/// `Finished` (and `Continue` when it hands over to the next execution).
pub(crate) fn run_end_transitions(handover: bool) -> u64 {
    if handover { 4 } else { 3 }
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
/// per state partition, and `Commit` (whose answer is the next `Plan`'s
/// input; in Express, through the `Committed` choice); and one per failed
/// attempt of any of its steps (a `Retry` enters the state again).
pub(crate) fn batch_transitions(
    tasks: u64,
    merges: u64,
    dedups: u64,
    retries: u64,
    express: bool,
) -> u64 {
    let merge = if merges > 0 { 1 + merges } else { 0 };
    // The Dedup map, its steps and the choice after it.
    let dedup = if dedups > 0 { 2 + dedups } else { 0 };
    5 + tasks + merge + dedup + retries + u64::from(express)
}

/// History events an execution may spend on batches before it hands over
/// to the next one: Step Functions caps a Standard execution's history at
/// 25,000 events; the rest is headroom for retries, the plan of the
/// hand-over and the end of the run.
pub(crate) const EVENT_BUDGET: u64 = 20_000;

/// About how many history events one batch adds to its execution: the
/// Plan and Commit tasks and the choices around them (5 events per Lambda
/// task state, 2 per choice), the Operate map (4, plus 7 per inline
/// iteration: its start and end and a task state's 5; a Distributed Map
/// runs its iterations in child executions and adds about 10), and for a
/// stateful query the Merge map (4, plus 7 per state partition), for a
/// `[deduplicate]` pipeline the Dedup map (as many) and the choice after it.
pub(crate) fn batch_events(tasks: u64, distributed: bool, merges: u64, dedups: u64) -> u64 {
    let operate = if distributed { 10 } else { 4 + 7 * tasks };
    let merge = if merges > 0 { 4 + 7 * merges } else { 0 };
    let dedup = if dedups > 0 { 6 + 7 * dedups } else { 0 };
    30 + operate + merge + dedup
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Express file is the Standard one made fit for Express, and
    /// names no state the Standard one lacks.
    #[test]
    fn the_express_definition_is_made_from_the_standard_one() {
        let standard: serde_json::Value = serde_json::from_str(DEFINITION).unwrap();
        let express: serde_json::Value = serde_json::from_str(EXPRESS_DEFINITION).unwrap();
        assert_eq!(
            express,
            express_of(&standard),
            "statemachines/microbatch-express.asl.json differs from express_of(microbatch.asl.json)"
        );
        let text = express.to_string();
        assert!(
            !text.contains("\"DISTRIBUTED\"") && express["States"].get("OperateMany").is_none()
        );
        assert_eq!(express["TimeoutSeconds"], 300);
        assert_eq!(express_billed_ms(1), 100);
        assert_eq!(express_billed_ms(100), 100);
        assert_eq!(express_billed_ms(101), 200);
    }

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
