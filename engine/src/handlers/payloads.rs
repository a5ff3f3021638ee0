//! The payloads between steps and of the function entry points. They carry
//! references (pipeline, epoch, batch and task numbers), never data.

use serde::{Deserialize, Serialize};

use crate::checkpoint::Commit;
use crate::storage::{Location, RequestCounts};

/// What a run carries between steps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// Pipeline name.
    pub pipeline: String,
    /// The lease epoch this run holds.
    pub epoch: u64,
    /// Whether this run has discovered new input yet (AvailableNow: once).
    pub discovered: bool,
    /// Batches handed out by this execution (`limits.max_batches_per_execution`).
    #[serde(default)]
    pub batches: u64,
    /// About how many history events those batches add to this execution
    /// (Step Functions caps a Standard execution's history at 25,000).
    #[serde(default)]
    pub events: u64,
    /// What started the run, recorded in its commits (`sluice history`).
    #[serde(default)]
    pub trigger: Option<String>,
    /// Hash of the spec the run plans and operates under, set by its first
    /// Plan; every later step checks its context against it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub spec: String,
    /// Billed duration of the Plan invocation that handed out the current
    /// batch, ms (billed to that batch by its commit).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub plan_ms: u64,
    /// That invocation's configured memory, MB.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub plan_memory_mb: u64,
    /// When that invocation handed the batch out (ms since the Unix
    /// epoch): the batch's operate time runs from here, not from when it
    /// was planned (a run plans its batches ahead).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub batch_ms: i64,
    /// That invocation's CPU time, ms (`sluice tune`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub plan_cpu_ms: u64,
    /// That invocation's storage requests.
    #[serde(default, skip_serializing_if = "RequestCounts::is_empty")]
    pub plan_requests: RequestCounts,
    /// The attempts of that Plan step that failed before it (Step
    /// Functions' `Retry`): invocations and transitions billed too.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub plan_retries: u64,
    /// The current batch runs in an Express execution (its transitions
    /// are not billed; the execution's duration is).
    #[serde(default, skip_serializing_if = "is_false")]
    pub express: bool,
    /// The answers of the current batch's tasks, placed here by the
    /// state machine's inline Map (`ResultPath: $.plan.run.results`) for
    /// the commit: the results that travel in them are not read from the
    /// checkpoint. Cleared by the commit's answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<TaskAck>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where a Distributed Map reads a batch's task list: an S3 object (on a
/// local checkpoint, `bucket` is empty and `key` relative to the pipeline's
/// checkpoint folder; the local runner reads it there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskList {
    /// Bucket.
    pub bucket: String,
    /// Key.
    pub key: String,
}

impl TaskList {
    /// The object `key` of the checkpoint at `checkpoint`.
    pub fn of(checkpoint: &Location, key: &str) -> TaskList {
        match checkpoint {
            Location::S3 { bucket, prefix } => TaskList {
                bucket: bucket.clone(),
                key: if prefix.is_empty() {
                    key.to_string()
                } else {
                    format!("{prefix}/{key}")
                },
            },
            Location::Local(_) | Location::Kafka { .. } | Location::Kinesis { .. } => TaskList {
                bucket: String::new(),
                key: key.to_string(),
            },
        }
    }

    /// The key relative to the checkpoint at `checkpoint` that (`bucket`,
    /// `key`) names, if it is inside it.
    pub fn relative(checkpoint: &Location, bucket: &str, key: &str) -> Option<String> {
        match checkpoint {
            Location::S3 { bucket: b, prefix } if b == bucket => {
                if prefix.is_empty() {
                    Some(key.to_string())
                } else {
                    key.strip_prefix(prefix.as_str())?
                        .strip_prefix('/')
                        .map(str::to_string)
                }
            }
            Location::Local(_) if bucket.is_empty() => Some(key.to_string()),
            _ => None,
        }
    }
}

/// A batch to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRef {
    /// Batch number.
    pub batch: u64,
    /// Task numbers (empty when `distributed`: read them from `task_list`).
    pub tasks: Vec<u32>,
    /// How many tasks the batch has.
    pub task_count: u64,
    /// More tasks than `limits.max_inline_tasks`: the state machine fans out
    /// with a Distributed Map over `task_list`.
    pub distributed: bool,
    /// Where the task list is, when `distributed`.
    pub task_list: Option<TaskList>,
    /// Input files.
    pub files: u64,
    /// Input bytes.
    pub bytes: u64,
    /// Planned by an earlier run that did not commit it.
    pub resumed: bool,
    /// A stateful query: the state partitions to merge after the tasks
    /// (the state machine's Merge map); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merge: Vec<u32>,
    /// `[deduplicate]`: the state partitions to deduplicate after the
    /// tasks, before any merge (the state machine's Dedup map); empty
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dedup: Vec<u32>,
}

/// What the plan step decided; `kind` is what the state machine's Choice
/// reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PlanOutcome {
    /// Nothing to do; no lease was taken and nothing written.
    Idle {
        /// Why.
        reason: String,
    },
    /// The pipeline is paused: nothing started; the request is recorded
    /// (`control.requested`) for `sluice resume`.
    Paused,
    /// Another run holds a live lease.
    Busy {
        /// Its owner.
        owner: String,
        /// Seconds since its last heartbeat.
        heartbeat_age_s: i64,
        /// The run was asked to look for new input again before it ends
        /// (`requested`, as a trigger asks it), so it takes what landed
        /// since it looked.
        #[serde(default)]
        asked: bool,
    },
    /// Run this batch, then commit it and plan again.
    Batch {
        /// The run.
        run: RunState,
        /// The batch.
        batch: BatchRef,
    },
    /// The run is over and the lease released.
    Done {
        /// The run.
        run: RunState,
    },
    /// This execution used its batch budget: it released the lease with
    /// `requested` set and hands the rest to a new execution (the state
    /// machine's Continue step wakes the pipeline through the trigger).
    Continue {
        /// The run.
        run: RunState,
    },
}

/// Input of the planner function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// Pipeline name.
    pub pipeline: String,
    /// The run so far; `null` for the first plan of an execution.
    #[serde(default)]
    pub run: Option<RunState>,
    /// The attempts of this step that failed before this one (the state
    /// machine passes `$$.State.RetryCount`): each was an invocation and a
    /// transition too.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u64,
    /// The kind of execution this step runs in (the Express definition
    /// passes `express`).
    #[serde(default)]
    pub workflow: crate::deploy::Workflow,
    /// When that execution started (`$$.Execution.StartTime`, RFC 3339):
    /// an Express execution hands over before its 5 minutes run out, and
    /// its ending records its duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    /// That execution's id (`$$.Execution.Id`): the first Plan of an
    /// Express execution claims the run's epoch for it, so a duplicate
    /// execution of the same run (Express is at-least-once) stops before
    /// it writes anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<String>,
    /// The first Plan of an Express execution: the token this copy of the
    /// execution drew (`States.UUID()`, before its first Plan, so a retry
    /// keeps it). Express may run one execution twice, even under one id:
    /// the run is claimed for the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<String>,
}

/// Input of the operator function: one task of a planned batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRequest {
    /// Pipeline name.
    pub pipeline: String,
    /// The run.
    pub run: RunState,
    /// Batch number.
    pub batch: u64,
    /// Task number.
    #[serde(default)]
    pub task: u32,
    /// Merge this state partition instead of running a task (a stateful
    /// query's Merge map).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<u32>,
    /// Deduplicate this state partition instead of running a task (the
    /// Dedup map of a `[deduplicate]` pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup: Option<u32>,
    /// The attempts of this step that failed before this one (the state
    /// machine passes `$$.State.RetryCount`): each was an invocation and a
    /// transition too.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u64,
    /// The caller hands the task's answer to the commit (the inline Map
    /// of this release's definitions: `"carry": true`), so a small result
    /// may travel in it instead of the checkpoint. A definition of an
    /// earlier release drops the answers: its tasks' results are written.
    #[serde(default, skip_serializing_if = "is_false")]
    pub carry: bool,
}

/// Output of the operator function: an acknowledgement, with the task's
/// result itself when it is small (a task of an inline Map; the state
/// machine hands the Map's answers to the commit in `run.results`),
/// otherwise left in the checkpoint (`work/N/task-T-eE.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskAck {
    /// Task number.
    pub task: u32,
    /// Rows written.
    pub rows_out: u64,
    /// Files written.
    pub files: u64,
    /// The result, when it travels in the payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<crate::operators::TaskResult>,
}

/// The most the results of one batch's tasks may add to the state
/// machine's payload (256 KB in all), bytes: a task whose result is larger
/// than its share leaves it in the checkpoint instead.
pub const INLINE_RESULTS_BYTES: usize = 64 * 1024;

/// What the committer function is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitAction {
    /// Commit the batch.
    Commit,
    /// Drop the plans from this batch on after its input was refused.
    Abandon,
    /// After a Distributed Map failed (it reports only that a child failed):
    /// if a task of this run refused its input, abandon as above and fail
    /// with that refusal (`Sluice.InvalidInput`); otherwise fail
    /// (`Sluice.Fatal`) keeping the lease, so the next run resumes the batch.
    Settle,
}

/// Input of the committer function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRequest {
    /// Commit or abandon.
    pub action: CommitAction,
    /// Pipeline name.
    pub pipeline: String,
    /// The run.
    pub run: RunState,
    /// Batch number.
    pub batch: u64,
    /// The attempts of this step that failed before this one (the state
    /// machine passes `$$.State.RetryCount`): each was an invocation and a
    /// transition too.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u64,
    /// The kind of execution this step runs in (the Express definition
    /// passes `express`: there, the commit of a run's last batch may end
    /// the run itself).
    #[serde(default)]
    pub workflow: crate::deploy::Workflow,
    /// When that execution started (`$$.Execution.StartTime`, RFC 3339):
    /// a run that ends at its commit records the execution's duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
}

/// Output of the committer function: what was committed, and (a commit)
/// the pipeline and run it was given, so the state machine's next Plan
/// reads them from it with no state in between.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitSummary {
    /// The commit ended the run: the batch was its last, no trigger asked
    /// again meanwhile, and the lease was given back in the write that
    /// recorded the batch (an Express execution; its `Committed` choice
    /// then ends it, with no Plan after).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ended: bool,
    /// Pipeline name (a commit's: the next Plan's input).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pipeline: String,
    /// The run (a commit's: the next Plan's input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunState>,
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
    /// Requests of the batch.
    pub requests: RequestCounts,
    /// Input files set aside as unreadable.
    #[serde(default)]
    pub quarantined: u64,
    /// Malformed rows set aside.
    #[serde(default)]
    pub rows_quarantined: u64,
    /// Fields made null.
    #[serde(default)]
    pub nulled_fields: u64,
    /// Fields put into `_rescued`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rescued_fields: u64,
    /// Rows dropped as late (stateful queries).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub late_rows: u64,
    /// Rows dropped as duplicates (`[deduplicate]`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duplicates: u64,
    /// Columns the batch added to the schema.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added_columns: Vec<String>,
    /// The schema version the batch read with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<u32>,
}

impl From<&Commit> for CommitSummary {
    fn from(c: &Commit) -> Self {
        CommitSummary {
            ended: false,
            pipeline: String::new(),
            run: None,
            batch: c.batch,
            files: c.files,
            bytes: c.bytes_read,
            rows_in: c.rows_in,
            rows_out: c.rows_out,
            outputs: c.outputs.len() as u64,
            requests: c.requests,
            quarantined: c.quarantined.len() as u64,
            rows_quarantined: c.rejected.iter().map(|r| r.rows).sum(),
            nulled_fields: c.nulled_fields,
            rescued_fields: c.rescued_fields,
            late_rows: c.stateful.as_ref().map_or(0, |s| s.late_rows),
            duplicates: c.stateful.as_ref().map_or(0, |s| s.duplicates),
            added_columns: c.added_columns.clone(),
            schema_version: c.schema_version,
        }
    }
}

/// What a task whose input was refused leaves for the settle step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The task.
    pub task: u32,
    /// The error, as the task reported it.
    pub message: String,
}
