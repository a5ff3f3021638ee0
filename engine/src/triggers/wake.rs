//! The trigger's side of the lease protocol: claim and start an
//! execution, or ask the running one to look again. The decision is pure
//! ([`decide_wake`], driven by `tests/e2e/lease_model.rs`); [`wake`] is the
//! I/O around it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::owner::Owner;
use crate::checkpoint::{self, Checkpoint, Control, RunStatus};
use crate::deploy::Workflow;
use crate::error::{Error, Result};
use crate::handlers::RunState;

/// What a trigger does to a pipeline, given its control record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Claim the lease with `epoch` and start the execution of that name.
    Start {
        /// The new epoch.
        epoch: u64,
        /// The previous holder died (its heartbeat expired).
        recover: bool,
    },
    /// A live run holds the lease: ask it to look again (unless already
    /// asked), and make sure its execution was started.
    Request {
        /// The running epoch.
        epoch: u64,
        /// The flag is already set: nothing to write.
        already: bool,
    },
    /// Paused and idle: record the request, start nothing.
    Hold {
        /// The flag is already set: nothing to write.
        already: bool,
    },
}

/// The trigger's decision, a pure function of the control record and of
/// what Step Functions says of the lease holder's execution, when an
/// execution holds it (`None` otherwise, or when it was not asked). A
/// failed execution keeps the lease deliberately; once it ended, the next
/// trigger takes over without waiting for the TTL. An execution that still
/// runs keeps its lease however old its heartbeat (a long batch is not
/// pre-empted); it is asked to look again.
pub fn decide_wake(
    control: Option<&Control>,
    now_ms: i64,
    ttl_ms: i64,
    holder: Option<ExecutionState>,
) -> Wake {
    if let Some(c) = control
        && c.status == RunStatus::Running
        && holder == Some(ExecutionState::Running)
    {
        return Wake::Request {
            epoch: c.epoch,
            already: c.requested,
        };
    }
    // The same rule as a run's own claim: the holder's execution having
    // ended is what a dead local process is to `sluice run`. A paused
    // pipeline starts nothing new (a run already going carries on).
    let holder_ended = holder == Some(ExecutionState::Ended);
    match checkpoint::decide_claim(control, now_ms, ttl_ms, holder_ended) {
        checkpoint::Claim::Take { .. } if control.is_some_and(|c| c.paused) => Wake::Hold {
            already: control.is_some_and(|c| c.requested),
        },
        checkpoint::Claim::Take { epoch, recover } => Wake::Start { epoch, recover },
        checkpoint::Claim::Busy { .. } => {
            let c = control.expect("a busy lease has a record");
            Wake::Request {
                epoch: c.epoch,
                already: c.requested,
            }
        }
    }
}

/// The execution name of a pipeline's run with `epoch`.
pub fn execution_name(pipeline: &str, epoch: u64) -> String {
    format!("{pipeline}-{epoch}")
}

/// The execution input of a run whose lease a trigger claimed: the state
/// machine's first Plan resumes it (`run.discovered = false`). Deterministic,
/// so a retried start of the same event with the same name is idempotent.
pub fn execution_input(pipeline: &str, epoch: u64, trigger: &str) -> Value {
    let run = RunState {
        pipeline: pipeline.to_string(),
        epoch,
        trigger: Some(trigger.to_string()),
        ..Default::default()
    };
    serde_json::json!({ "pipeline": pipeline, "run": run })
}

/// Whether `start` made a new execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    /// The execution's ARN (or local id).
    pub execution: String,
    /// False when an execution of that name already existed.
    pub new: bool,
}

/// Where an execution is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionState {
    /// Still running.
    Running,
    /// Ended (succeeded, failed, timed out or aborted).
    Ended,
    /// Never started.
    Missing,
}

/// Where executions start: Step Functions on AWS; tests record them.
#[async_trait::async_trait]
pub trait Executions: Send + Sync {
    /// Start an execution named `name` with `input`, of the kind
    /// `workflow`; an existing execution of that name is not an error
    /// (`new: false`; an Express one may start twice: Express does not
    /// keep names).
    async fn start(&self, name: &str, input: &Value, workflow: Workflow) -> Result<Started>;

    /// Whether Express executions can be started here (a deployment with
    /// an Express state machine); otherwise every run is Standard.
    fn express(&self) -> bool {
        false
    }

    /// Whether the execution named `name` runs, ended or never started.
    async fn state(&self, name: &str) -> Result<ExecutionState>;

    /// Stop the execution named `name` (`sluice cancel`); one that already
    /// ended or never started is not an error.
    async fn stop(&self, name: &str, cause: &str) -> Result<()>;
}

/// What waking one pipeline did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "lowercase")]
pub enum WakeOutcome {
    /// A run was started with a new epoch.
    Started {
        /// Its epoch.
        epoch: u64,
        /// The execution.
        execution: String,
        /// The previous holder's lease had expired.
        recover: bool,
    },
    /// A run holds the lease; it was asked to look again.
    Requested {
        /// The running epoch.
        epoch: u64,
    },
    /// The pipeline is paused: the request was recorded, nothing started.
    Held,
}

/// What a trigger adds to the control record it writes: its own usage
/// (`true` when the write creates the record).
pub type Charge<'a> = &'a (dyn Fn(&mut Control, bool) + Send + Sync);

/// Apply the lease protocol to one pipeline: claim and start, or request.
/// `spec_hash` is the registered spec's hash (a first claim writes it);
/// `trigger` is what the run records as its cause; `workflow` the kind of
/// execution it asks for (Express only where `executions` has it);
/// `charge` adds the trigger's usage to any control record it writes.
#[allow(clippy::too_many_arguments)]
pub async fn wake(
    checkpoint: &Checkpoint,
    pipeline: &str,
    spec_hash: &str,
    now_ms: i64,
    ttl_ms: i64,
    executions: &dyn Executions,
    trigger: &str,
    workflow: Workflow,
    charge: Charge<'_>,
) -> Result<WakeOutcome> {
    let workflow = match workflow {
        Workflow::Express if executions.express() => Workflow::Express,
        _ => Workflow::Standard,
    };
    // Another trigger or run changing control in between makes it decide
    // again.
    let mut attempts = checkpoint.attempts();
    while let Some(read) = attempts.next(checkpoint).await? {
        let (control, etag) = (read.control(), read.etag());
        let holder = holding_execution(control);
        let holder_state = match &holder {
            Some(Holder::Standard(name)) => Some(executions.state(name).await?),
            // An Express execution cannot be asked: it has ended once its
            // limit passed since its claim; until then its heartbeat and
            // TTL decide, as for any owner.
            Some(Holder::Express(owner)) => owner.gone_at(now_ms).then_some(ExecutionState::Ended),
            None => None,
        };
        let done = match decide_wake(control, now_ms, ttl_ms, holder_state) {
            Wake::Start { epoch, recover } => {
                let claim = Claim {
                    checkpoint,
                    pipeline,
                    epoch,
                    before: control,
                    etag,
                };
                let how = How {
                    executions,
                    trigger,
                    workflow,
                };
                start(claim, spec_hash, now_ms, recover, &how, charge).await?
            }
            Wake::Hold { already } => {
                let c = control.expect("a paused pipeline has a record");
                ask(checkpoint, c, etag, already, charge).await?.then(|| {
                    tracing::info!(pipeline, "paused; request recorded");
                    WakeOutcome::Held
                })
            }
            Wake::Request { epoch, already } => {
                let c = control.expect("a running lease has a record");
                if !ask(checkpoint, c, etag, already, charge).await? {
                    None
                } else {
                    // The run's execution never started (its trigger died
                    // between claim and start): start it now, by the same
                    // name.
                    let name = execution_name(pipeline, epoch);
                    if holder_state == Some(ExecutionState::Missing)
                        && holder == Some(Holder::Standard(name.clone()))
                    {
                        executions
                            .start(
                                &name,
                                &execution_input(pipeline, epoch, trigger),
                                Workflow::Standard,
                            )
                            .await?;
                    }
                    tracing::info!(pipeline, epoch, "run in progress; asked it to look again");
                    Some(WakeOutcome::Requested { epoch })
                }
            }
        };
        if let Some(outcome) = done {
            return Ok(outcome);
        }
    }
    Err(Error::Conflict {
        pipeline: pipeline.to_string(),
        message: "control.json kept changing while the trigger decided; retry the event".into(),
    })
}

/// An execution holding a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Holder {
    /// A Standard execution, by name: Step Functions is asked whether it
    /// still runs (DescribeExecution) before its lease is taken over,
    /// expired or not.
    Standard(String),
    /// An Express execution, which cannot be asked.
    Express(Owner),
}

/// The execution holding the lease, if an execution holds it.
fn holding_execution(control: Option<&Control>) -> Option<Holder> {
    let c = control.filter(|c| c.status == RunStatus::Running)?;
    match Owner::parse(c.owner.as_deref()?) {
        Owner::Execution(name) => Some(Holder::Standard(name)),
        o @ Owner::Express { .. } => Some(Holder::Express(o)),
        _ => None,
    }
}

/// How a claimed run is started: where, with what cause, as which kind of
/// execution.
#[derive(Clone, Copy)]
struct How<'a> {
    executions: &'a dyn Executions,
    trigger: &'a str,
    workflow: Workflow,
}

/// Set `requested` on `control` (unless `already` set). `false` when
/// another writer changed control first.
async fn ask(
    checkpoint: &Checkpoint,
    control: &Control,
    etag: Option<&str>,
    already: bool,
    charge: Charge<'_>,
) -> Result<bool> {
    if already {
        return Ok(true);
    }
    let mut next = checkpoint::requested(control);
    charge(&mut next, false);
    Ok(checkpoint.swap_control(&next, etag).await?.is_some())
}

/// A lease claim a trigger is about to make.
struct Claim<'a> {
    checkpoint: &'a Checkpoint,
    pipeline: &'a str,
    epoch: u64,
    before: Option<&'a Control>,
    etag: Option<&'a str>,
}

/// Claim the lease for the execution `<pipeline>-<epoch>` and start it.
/// `None` when another writer changed control first. If the start fails,
/// the claim is given back so the retried event can start the run; if that
/// fails too, the lease expires after its TTL.
async fn start(
    claim: Claim<'_>,
    spec_hash: &str,
    now_ms: i64,
    recover: bool,
    how: &How<'_>,
    charge: Charge<'_>,
) -> Result<Option<WakeOutcome>> {
    let How {
        executions,
        trigger,
        workflow,
    } = *how;
    let Claim {
        checkpoint,
        pipeline,
        epoch,
        before,
        etag,
    } = claim;
    let name = execution_name(pipeline, epoch);
    let owner = match workflow {
        Workflow::Standard => Owner::Execution(name.clone()),
        Workflow::Express => Owner::Express {
            name: name.clone(),
            claimed_ms: now_ms,
        },
    }
    .to_string();
    let mut next = checkpoint::claimed(before, epoch, &owner, now_ms, spec_hash);
    charge(&mut next, before.is_none());
    let Some(claimed) = checkpoint.swap_control(&next, etag).await? else {
        return Ok(None);
    };
    match executions
        .start(&name, &execution_input(pipeline, epoch, trigger), workflow)
        .await
    {
        Ok(s) => {
            tracing::info!(pipeline, epoch, execution = %s.execution, recover, ?workflow, "run started");
            Ok(Some(WakeOutcome::Started {
                epoch,
                execution: s.execution,
                recover,
            }))
        }
        Err(e) => {
            let back = match before {
                Some(prev) => prev.clone(),
                None => {
                    let mut idle = next.clone();
                    idle.status = RunStatus::Idle;
                    idle
                }
            };
            if let Err(undo) = checkpoint.swap_control(&back, Some(&claimed)).await {
                tracing::warn!(pipeline, epoch, error = %undo, "could not give the claim back; it expires with its TTL");
            }
            Err(e)
        }
    }
}
