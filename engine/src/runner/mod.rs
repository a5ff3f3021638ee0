//! The local runner: executes `statemachines/microbatch.asl.json`, the very
//! definition that is deployed, with its Task resources bound to the
//! in-process handlers (plan -> operate each task -> commit -> plan ...),
//! until the run is done.

pub mod asl;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{Error, ErrorClass, Result};
use crate::handlers::{self, CommitRequest, Context, PlanOutcome, PlanRequest, TaskRequest};
use asl::{Failure, Sleeper, StateMachine, TaskInvoker};

use crate::deploy::Workflow;
/// The state machine definitions, compiled in from `statemachines/`.
pub(crate) use crate::deploy::{DEFINITION, EXPRESS_DEFINITION};

/// Task resources of the definition, as SAM substitutes them.
pub(crate) const PLANNER: &str = "${PlannerFunctionArn}";
/// The operator function's resource.
pub(crate) const OPERATOR: &str = "${OperatorFunctionArn}";
/// The committer function's resource.
pub(crate) const COMMITTER: &str = "${CommitterFunctionArn}";
/// The trigger function: the Continue step wakes the pipeline again when an
/// execution used its batch budget.
pub(crate) const TRIGGER: &str = "${TriggerFunctionArn}";
/// The Distributed Map's ItemReader resource (the task list in S3).
pub(crate) const ITEM_READER: &str = "arn:aws:states:::s3:getObject";

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
    /// Input files set aside as unreadable (`on_bad_file = "quarantine"`).
    #[serde(default)]
    pub quarantined: u64,
    /// Malformed rows set aside (`on_bad_row = "quarantine"`).
    #[serde(default)]
    pub rows_quarantined: u64,
    /// Fields made null (`on_bad_row = "null"`).
    #[serde(default)]
    pub nulled_fields: u64,
    /// Fields put into `_rescued` (`on_schema_change = "rescue"`).
    #[serde(default)]
    pub rescued_fields: u64,
    /// Rows dropped as late (stateful queries).
    #[serde(default)]
    pub late_rows: u64,
    /// Rows dropped as duplicates (`[deduplicate]`).
    #[serde(default)]
    pub duplicates: u64,
    /// Columns the batch added (`on_schema_change = "add-columns"`).
    #[serde(default)]
    pub added_columns: Vec<String>,
    /// The schema version the batch read with.
    #[serde(default)]
    pub schema_version: Option<u32>,
    /// Wall time of plan + tasks + commit, ms.
    pub millis: u64,
    /// Planned by an earlier run that did not finish it.
    pub resumed: bool,
}

/// How a run ended. As JSON: `{"state": "idle", "reason": "no new data"}`,
/// `{"state": "done"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "reason", rename_all = "lowercase")]
pub enum RunEnd {
    /// Nothing to do.
    Idle(String),
    /// The pipeline is paused: nothing started, the request recorded.
    Paused,
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
    /// Executions of the state machine it took (more than one when an
    /// execution used its batch or history budget and handed over).
    #[serde(default)]
    pub executions: u64,
    /// Wall time, ms.
    pub millis: u64,
    /// Storage requests of the whole run.
    pub requests: crate::storage::RequestCounts,
    /// What the run used as this runner counted it: each handler call
    /// (billed as its wall time rounded up to the millisecond, at the
    /// memory template.yaml configures) and each state transition.
    #[serde(default)]
    pub usage: crate::checkpoint::Usage,
}

/// A real sleep, for Retry intervals and Wait states.
pub(crate) fn real_sleep() -> Sleeper {
    Arc::new(|d: Duration| Box::pin(tokio::time::sleep(d)))
}

/// What the in-process Task resources saw during one execution.
struct Observed {
    end: Option<RunEnd>,
    batches: Vec<BatchReport>,
    batch_started: Instant,
    resumed: bool,
    /// The engine error behind the last failed task, to report with its
    /// class and fields rather than as a string.
    last_error: Option<Error>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    /// The execution used its batch budget and handed the run over.
    continued: bool,
    /// Invocations per function: (invocations, billed ms).
    invocations: std::collections::BTreeMap<&'static str, (u64, u64)>,
    /// State transitions.
    transitions: u64,
}

/// Binds the definition's Task resources to the in-process handlers.
struct LocalInvoker<'a> {
    ctx: &'a Context,
    observed: Mutex<Observed>,
    on_batch: Mutex<&'a mut (dyn FnMut(&BatchReport) + Send)>,
}

impl LocalInvoker<'_> {
    async fn call(&self, resource: &str, input: Value) -> Result<Value> {
        use crate::deploy;
        let function = match resource {
            PLANNER => Some(deploy::PLANNER),
            OPERATOR => Some(deploy::OPERATOR),
            COMMITTER => Some(deploy::COMMITTER),
            TRIGGER => Some(deploy::TRIGGER),
            _ => None,
        };
        let started = Instant::now();
        let out = self.call_handler(resource, input).await;
        if let Some(f) = function {
            let billed = crate::handlers::usage::billed_ms(started);
            let mut o = self.observed.lock().expect("not poisoned");
            let e = o.invocations.entry(f).or_default();
            e.0 += 1;
            e.1 += billed;
        }
        out
    }

    async fn call_handler(&self, resource: &str, input: Value) -> Result<Value> {
        let bad = |e: serde_json::Error| Error::Run {
            pipeline: self.ctx.pipeline.name.clone(),
            message: format!("{resource}: payload does not fit its request type: {e}"),
            class: ErrorClass::Fatal,
        };
        let out = match resource {
            PLANNER => {
                let req: PlanRequest = serde_json::from_value(input).map_err(bad)?;
                let outcome = handlers::handle_plan(self.ctx, req).await?;
                self.on_plan(&outcome);
                serde_json::to_value(&outcome)
            }
            OPERATOR => {
                let req: TaskRequest = serde_json::from_value(input).map_err(bad)?;
                serde_json::to_value(handlers::handle_task(self.ctx, req).await?)
            }
            COMMITTER => {
                let req: CommitRequest = serde_json::from_value(input).map_err(bad)?;
                let summary = handlers::handle_commit(self.ctx, req.clone()).await?;
                if req.action == handlers::CommitAction::Commit {
                    self.on_commit(&summary);
                }
                serde_json::to_value(summary)
            }
            TRIGGER => {
                // In-process, the next execution starts when this one ends
                // (`execute` loops); on AWS the trigger function starts it.
                self.observed.lock().expect("not poisoned").continued = true;
                return Ok(json!({}));
            }
            ITEM_READER => {
                // A Distributed Map's ItemReader: the task list the planner
                // wrote to the checkpoint.
                let bucket = input["Bucket"].as_str().unwrap_or_default();
                let key = input["Key"].as_str().unwrap_or_default();
                let rel = handlers::TaskList::relative(&self.ctx.pipeline.checkpoint, bucket, key)
                    .ok_or_else(|| Error::Run {
                        pipeline: self.ctx.pipeline.name.clone(),
                        message: format!(
                            "ItemReader: s3://{bucket}/{key} is outside the checkpoint {}",
                            self.ctx.pipeline.checkpoint.display()
                        ),
                        class: ErrorClass::Fatal,
                    })?;
                let obj = self
                    .ctx
                    .checkpoint
                    .store()
                    .get(&rel)
                    .await?
                    .ok_or_else(|| Error::Checkpoint {
                        pipeline: self.ctx.pipeline.name.clone(),
                        key: rel.clone(),
                        message: "missing (the task list of a planned batch)".into(),
                    })?;
                return serde_json::from_slice::<Value>(&obj.bytes).map_err(|e| {
                    Error::Checkpoint {
                        pipeline: self.ctx.pipeline.name.clone(),
                        key: rel.clone(),
                        message: format!("not JSON: {e}"),
                    }
                });
            }
            other => {
                return Err(Error::Run {
                    pipeline: self.ctx.pipeline.name.clone(),
                    message: format!("the state machine names an unknown resource {other}"),
                    class: ErrorClass::Fatal,
                });
            }
        };
        Ok(out.expect("handler outputs serialize"))
    }

    fn on_plan(&self, outcome: &PlanOutcome) {
        let mut o = self.observed.lock().expect("not poisoned");
        match outcome {
            PlanOutcome::Idle { reason } => o.end = Some(RunEnd::Idle(reason.clone())),
            PlanOutcome::Paused => o.end = Some(RunEnd::Paused),
            PlanOutcome::Busy {
                owner,
                heartbeat_age_s,
                asked,
            } => {
                o.end = Some(RunEnd::Busy(format!(
                    "{owner} holds the lease (heartbeat {heartbeat_age_s}s ago){}",
                    if *asked {
                        "; it was asked to look for new input again before it ends, so it takes \
                         what landed since it looked"
                    } else {
                        ""
                    }
                )))
            }
            PlanOutcome::Done { .. } => o.end = Some(RunEnd::Done),
            PlanOutcome::Continue { .. } => o.continued = true,
            PlanOutcome::Batch { run, batch } => {
                o.resumed = batch.resumed;
                if o.heartbeat.is_none() {
                    o.heartbeat = Some(spawn_heartbeat(self.ctx, run));
                }
            }
        }
    }

    fn on_commit(&self, c: &handlers::CommitSummary) {
        let report = {
            let mut o = self.observed.lock().expect("not poisoned");
            let report = BatchReport {
                batch: c.batch,
                files: c.files,
                bytes: c.bytes,
                rows_in: c.rows_in,
                rows_out: c.rows_out,
                outputs: c.outputs,
                quarantined: c.quarantined,
                rows_quarantined: c.rows_quarantined,
                nulled_fields: c.nulled_fields,
                rescued_fields: c.rescued_fields,
                late_rows: c.late_rows,
                duplicates: c.duplicates,
                added_columns: c.added_columns.clone(),
                schema_version: c.schema_version,
                millis: o.batch_started.elapsed().as_millis() as u64,
                resumed: o.resumed,
            };
            o.batches.push(report.clone());
            o.batch_started = Instant::now();
            report
        };
        (self.on_batch.lock().expect("not poisoned"))(&report);
    }
}

impl TaskInvoker for LocalInvoker<'_> {
    fn invoke<'a>(
        &'a self,
        resource: &'a str,
        input: Value,
    ) -> Pin<Box<dyn Future<Output = std::result::Result<Value, Failure>> + Send + 'a>> {
        Box::pin(async move {
            self.call(resource, input).await.map_err(|e| {
                let failure = Failure {
                    error: e.class().name().to_string(),
                    cause: e.to_string(),
                };
                self.observed.lock().expect("not poisoned").last_error = Some(e);
                failure
            })
        })
    }
}

/// How the local runner waits between Retry attempts and in Wait states,
/// and which workflow a run's first execution runs as.
#[derive(Clone)]
pub struct Runner {
    sleep: Sleeper,
    workflow: Workflow,
    execution_id: Option<String>,
}

impl Default for Runner {
    fn default() -> Self {
        Runner {
            sleep: real_sleep(),
            workflow: DEFAULT_WORKFLOW,
            execution_id: None,
        }
    }
}

/// The workflow a run's first execution runs as, as a deployment's
/// trigger starts it: Express; an execution that hands over starts a
/// Standard one.
pub const DEFAULT_WORKFLOW: Workflow = Workflow::Express;

impl Runner {
    /// A runner that waits with `sleep` (tests pass one that returns at once).
    pub fn with_sleep(sleep: Sleeper) -> Runner {
        Runner {
            sleep,
            ..Runner::default()
        }
    }

    /// The same runner, starting runs as `workflow` executions.
    pub fn starting(self, workflow: Workflow) -> Runner {
        Runner { workflow, ..self }
    }

    /// The same runner, whose first execution has id `id` (tests: a second
    /// copy of one Express execution, which AWS may run under the same id).
    pub fn as_execution(self, id: &str) -> Runner {
        Runner {
            execution_id: Some(id.to_string()),
            ..self
        }
    }

    /// Run the pipeline until everything available at the start is
    /// committed (Spark's `Trigger.AvailableNow`), by executing the state
    /// machine in-process. `on_batch` sees each committed batch.
    pub async fn run(
        &self,
        ctx: &Context,
        on_batch: impl FnMut(&BatchReport) + Send,
    ) -> Result<RunSummary> {
        self.execute(
            ctx,
            json!({ "pipeline": ctx.pipeline.name, "run": null }),
            on_batch,
        )
        .await
    }

    /// Execute the state machine in-process with `input`: `{"pipeline":
    /// NAME, "run": null}` (the run claims the lease itself), or the input a
    /// trigger gave the execution whose lease it claimed
    /// (`triggers::execution_input`).
    pub async fn execute(
        &self,
        ctx: &Context,
        input: Value,
        mut on_batch: impl FnMut(&BatchReport) + Send,
    ) -> Result<RunSummary> {
        let parse = |definition: &str| {
            StateMachine::parse(definition).map_err(|e| Error::Run {
                pipeline: ctx.pipeline.name.clone(),
                message: format!("the compiled-in state machine does not parse: {e}"),
                class: ErrorClass::Fatal,
            })
        };
        let standard = parse(DEFINITION)?;
        let express = parse(EXPRESS_DEFINITION)?;
        let started = Instant::now();
        let counts_at_start = ctx.counts();
        let mut batches = Vec::new();
        let mut input = input;
        let mut executions = 0;
        let mut counted: std::collections::BTreeMap<&'static str, (u64, u64)> = Default::default();
        let mut transitions = 0;
        let mut express_usage = crate::checkpoint::ExpressUsage::default();
        let mut workflow = self.workflow;
        loop {
            let machine = match workflow {
                Workflow::Standard => &standard,
                Workflow::Express => &express,
            };
            let began = Instant::now();
            let id = if executions == 0 {
                self.execution_id.as_deref()
            } else {
                None
            };
            let observed = Box::pin(execute_once(
                ctx,
                machine,
                input,
                id,
                &self.sleep,
                &mut on_batch,
            ))
            .await?;
            executions += 1;
            match workflow {
                Workflow::Standard => transitions += observed.transitions,
                Workflow::Express => {
                    express_usage.executions += 1;
                    express_usage.transitions += observed.transitions;
                    express_usage.billed_ms +=
                        crate::deploy::express_billed_ms(began.elapsed().as_millis() as u64);
                }
            }
            for (f, (n, ms)) in &observed.invocations {
                let e = counted.entry(f).or_default();
                e.0 += n;
                e.1 += ms;
            }
            batches.extend(observed.batches);
            if !observed.continued {
                return Ok(RunSummary {
                    end: observed.end.unwrap_or(RunEnd::Done),
                    batches,
                    executions,
                    usage: crate::checkpoint::Usage {
                        functions: counted
                            .iter()
                            .map(|(f, (n, ms))| {
                                crate::checkpoint::FunctionUsage::new(
                                    f,
                                    *n,
                                    *ms,
                                    crate::deploy::memory_mb(f),
                                )
                            })
                            .collect(),
                        transitions,
                        express: express_usage,
                    },
                    millis: started.elapsed().as_millis() as u64,
                    requests: ctx.counts().since(&counts_at_start),
                });
            }
            // The execution used its batch budget and released the lease;
            // the next one claims it and resumes the planned batches, as the
            // trigger's execution would on AWS.
            input = json!({ "pipeline": ctx.pipeline.name, "run": null });
            // The Continue step's trigger starts a Standard execution.
            workflow = Workflow::Standard;
        }
    }
}

/// [`Runner::run`] with real waits.
pub async fn run(ctx: &Context, on_batch: impl FnMut(&BatchReport) + Send) -> Result<RunSummary> {
    Runner::default().run(ctx, on_batch).await
}

/// [`Runner::execute`] with real waits.
pub async fn execute(
    ctx: &Context,
    input: Value,
    on_batch: impl FnMut(&BatchReport) + Send,
) -> Result<RunSummary> {
    Runner::default().execute(ctx, input, on_batch).await
}

/// One execution of the definition.
async fn execute_once(
    ctx: &Context,
    machine: &StateMachine,
    input: Value,
    id: Option<&str>,
    sleep: &Sleeper,
    on_batch: &mut (dyn FnMut(&BatchReport) + Send),
) -> Result<Observed> {
    let invoker = LocalInvoker {
        ctx,
        observed: Mutex::new(Observed {
            end: None,
            batches: Vec::new(),
            batch_started: Instant::now(),
            resumed: false,
            last_error: None,
            heartbeat: None,
            continued: false,
            invocations: Default::default(),
            transitions: 0,
        }),
        on_batch: Mutex::new(on_batch),
    };
    let (result, transitions) = machine.execute_counted(input, id, &invoker, sleep).await;
    let mut observed = invoker.observed.into_inner().expect("not poisoned");
    observed.transitions = transitions;
    if let Some(h) = &observed.heartbeat {
        h.abort();
    }
    match result {
        Ok(_) => Ok(observed),
        Err(failure) => Err(match observed.last_error {
            Some(e) if e.class().name() == failure.error => e,
            // The failure's own class (a step's error whose record was
            // replaced by a later step's), else a failure of the machine.
            _ => Error::Run {
                pipeline: ctx.pipeline.name.clone(),
                message: failure.to_string(),
                class: ErrorClass::from_name(&failure.error).unwrap_or(ErrorClass::Fatal),
            },
        }),
    }
}

/// Keep the lease alive while the run works: a heartbeat every third of
/// the lease TTL. Stops by itself if the lease is lost.
fn spawn_heartbeat(ctx: &Context, run: &handlers::RunState) -> tokio::task::JoinHandle<()> {
    let ctx = ctx.clone();
    let run = run.clone();
    let every = Duration::from_secs((ctx.pipeline.limits.lease_ttl_seconds / 3).max(1));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn walk<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        out.push(v);
        match v {
            Value::Object(m) => m.values().for_each(|c| walk(c, out)),
            Value::Array(a) => a.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }

    #[test]
    fn definition_parses_and_names_exactly_the_known_errors_and_resources() {
        use std::collections::BTreeSet;
        StateMachine::parse(EXPRESS_DEFINITION).expect("the local runner accepts the definition");
        let express: Value = serde_json::from_str(EXPRESS_DEFINITION).unwrap();
        let mut nodes = Vec::new();
        walk(&express, &mut nodes);
        assert!(
            nodes
                .iter()
                .filter_map(|n| n["Resource"].as_str())
                .all(|r| r != ITEM_READER),
            "the Express definition reads no task list"
        );
        StateMachine::parse(DEFINITION).expect("the local runner accepts the definition");
        let v: Value = serde_json::from_str(DEFINITION).unwrap();
        let mut nodes = Vec::new();
        walk(&v, &mut nodes);
        let mut names = BTreeSet::new();
        let mut resources = BTreeSet::new();
        for n in &nodes {
            for e in n["ErrorEquals"].as_array().into_iter().flatten() {
                names.insert(e.as_str().unwrap());
            }
            if let Some(r) = n["Resource"].as_str() {
                resources.insert(r);
            }
        }
        // Every error class a handler returns that a clause must tell
        // apart (Fatal ends the run through States.ALL), AWS's transient
        // Lambda errors, and the two States errors used.
        let classes = [
            ErrorClass::Retryable,
            ErrorClass::Conflict,
            ErrorClass::InvalidInput,
        ]
        .map(|c| c.name());
        let mut expected: BTreeSet<&str> = classes.into_iter().collect();
        expected.extend([
            "Lambda.AWSLambdaException",
            "Lambda.SdkClientException",
            "Lambda.ServiceException",
            "Lambda.TooManyRequestsException",
            "States.ALL",
            "States.Timeout",
        ]);
        assert_eq!(names, expected, "ErrorEquals names");
        let expected: BTreeSet<&str> = [PLANNER, OPERATOR, COMMITTER, TRIGGER, ITEM_READER].into();
        assert_eq!(resources, expected, "Task and ItemReader resources");
    }
}
