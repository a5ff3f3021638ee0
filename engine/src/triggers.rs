//! Triggers: every way a run starts ends here. An S3 notification (direct,
//! or through SNS), an EventBridge schedule or S3 "Object Created" event, or
//! a manual refresh is parsed ([`parse_event`]), routed to the registered
//! pipelines it concerns ([`route`]), and each of them is woken ([`wake`]):
//!
//! - idle, or its lease expired: swap in `running` with a new epoch
//!   (compare-and-swap on `control.json`) and start the execution
//!   `<pipeline>-<epoch>`; a retried trigger hits the same name;
//! - running: swap in `requested = true` and return; the run looks again
//!   before it releases (`handlers::plan`), so no wake-up is lost.
//!
//! A malformed, unknown or oversized payload is refused before anything is
//! read or written; a key outside every registered source prefix, or with
//! path tricks, is ignored and counted.

use std::collections::BTreeMap;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::s3::S3Event;
use aws_lambda_events::event::sns::SnsEvent;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::{Checkpoint, Control, RunStatus};
use crate::error::{Error, ErrorClass, Result};
use crate::handlers::RunState;
use crate::pipeline::Pipeline;
use crate::storage::Location;

/// The largest event the trigger accepts (Lambda's asynchronous limit).
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

/// Lease owners that are Step Functions executions start with this.
pub const EXECUTION_OWNER: &str = "sfn:";

/// A parsed trigger event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Objects were created.
    Objects {
        /// How the notification came.
        via: Via,
        /// The objects, keys decoded.
        objects: Vec<ObjectRef>,
        /// Records that were not object creations (test events, removals).
        skipped: u64,
    },
    /// An EventBridge schedule fired: every registered pipeline looks.
    Schedule {
        /// The rule's ARN, when the event names it.
        rule: Option<String>,
    },
    /// A manual refresh of one pipeline.
    Manual {
        /// The pipeline.
        pipeline: String,
        /// Who asked.
        requested_by: Option<String>,
    },
}

impl Event {
    /// A short name of the event's source, for logs and reports.
    pub fn source(&self) -> &'static str {
        match self {
            Event::Objects { via: Via::S3, .. } => "s3",
            Event::Objects { via: Via::Sns, .. } => "sns",
            Event::Objects {
                via: Via::EventBridge,
                ..
            } => "eventbridge-s3",
            Event::Schedule { .. } => "schedule",
            Event::Manual { .. } => "manual",
        }
    }

    /// What the run records as its trigger (`sluice history`).
    pub fn label(&self) -> String {
        match self {
            Event::Manual {
                requested_by: Some(by),
                ..
            } => format!("manual: {by}"),
            other => other.source().to_string(),
        }
    }
}

/// How an object notification came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// An S3 bucket notification sent to the function directly.
    S3,
    /// An S3 notification carried by SNS.
    Sns,
    /// An EventBridge "Object Created" event.
    EventBridge,
}

/// One created object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectRef {
    /// Bucket.
    pub bucket: String,
    /// Key, decoded.
    pub key: String,
    /// Size in bytes, as the notification gives it.
    pub size: Option<u64>,
}

/// The manual refresh payload (`sluice refresh`, or an EventBridge rule
/// whose target input is this constant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManualRefresh {
    /// The pipeline to refresh.
    pub pipeline: String,
    /// Who asked, for the logs.
    #[serde(default)]
    pub requested_by: Option<String>,
}

/// The `detail` of an EventBridge S3 "Object Created" event.
#[derive(Debug, Clone, Deserialize)]
struct ObjectCreatedDetail {
    bucket: NameOnly,
    object: KeyOnly,
}

#[derive(Debug, Clone, Deserialize)]
struct NameOnly {
    name: String,
}

#[derive(Debug, Clone, Deserialize)]
struct KeyOnly {
    key: String,
    #[serde(default)]
    size: Option<u64>,
}

fn refused(message: impl Into<String>) -> Error {
    Error::Spec {
        file: "trigger event".into(),
        message: message.into(),
    }
}

/// Decode an S3 notification key: S3 form-encodes keys (`+` for a space,
/// `%XX` for other bytes).
pub fn decode_key(raw: &str) -> Result<String> {
    let plus = raw.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8()
        .map(|k| k.into_owned())
        .map_err(|_| {
            refused(format!(
                "object key \"{raw}\" is not valid URL-encoded UTF-8"
            ))
        })
}

/// Parse a trigger payload. Errors name what was expected; nothing is
/// started for a payload that does not parse.
pub fn parse_event(payload: &[u8]) -> Result<Event> {
    if payload.len() > MAX_EVENT_BYTES {
        return Err(refused(format!(
            "{} bytes is over the {MAX_EVENT_BYTES}-byte limit; nothing was started",
            payload.len()
        )));
    }
    let value: Value = serde_json::from_slice(payload)
        .map_err(|e| refused(format!("not JSON ({e}); nothing was started")))?;
    parse_value(value)
}

fn parse_value(value: Value) -> Result<Event> {
    let Some(obj) = value.as_object() else {
        return Err(refused("expected a JSON object; nothing was started"));
    };
    if let Some(records) = obj.get("Records").and_then(Value::as_array) {
        let from_sns = records
            .first()
            .and_then(|r| r.get("EventSource"))
            .and_then(Value::as_str)
            == Some("aws:sns");
        return if from_sns {
            let ev: SnsEvent = typed(value, "an SNS event")?;
            let mut objects = Vec::new();
            let mut skipped = 0;
            for r in &ev.records {
                let inner: Value = serde_json::from_str(&r.sns.message).map_err(|e| {
                    refused(format!(
                        "SNS message {} is not JSON ({e}); expected an S3 event notification",
                        r.sns.message_id
                    ))
                })?;
                if inner.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
                    skipped += 1;
                    continue;
                }
                let (o, s) = s3_objects(typed(inner, "an S3 event inside an SNS message")?)?;
                objects.extend(o);
                skipped += s;
            }
            Ok(Event::Objects {
                via: Via::Sns,
                objects,
                skipped,
            })
        } else {
            let (objects, skipped) = s3_objects(typed(value, "an S3 event notification")?)?;
            Ok(Event::Objects {
                via: Via::S3,
                objects,
                skipped,
            })
        };
    }
    if obj.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
        return Ok(Event::Objects {
            via: Via::S3,
            objects: Vec::new(),
            skipped: 1,
        });
    }
    if obj.contains_key("detail-type") {
        let ev: EventBridgeEvent = typed(value, "an EventBridge event")?;
        return match (ev.source.as_str(), ev.detail_type.as_str()) {
            ("aws.events" | "aws.scheduler", "Scheduled Event") => Ok(Event::Schedule {
                rule: ev.resources.and_then(|r| r.into_iter().next()),
            }),
            ("aws.s3", "Object Created") => {
                let d: ObjectCreatedDetail = typed(ev.detail, "an S3 Object Created detail")?;
                // EventBridge carries keys as stored (the S3 user guide's
                // examples show no form encoding), unlike bucket
                // notifications.
                Ok(Event::Objects {
                    via: Via::EventBridge,
                    objects: vec![ObjectRef {
                        bucket: d.bucket.name,
                        key: d.object.key,
                        size: d.object.size,
                    }],
                    skipped: 0,
                })
            }
            (source, detail_type) => Err(refused(format!(
                "EventBridge event from \"{source}\" of type \"{detail_type}\" is not a trigger; \
                 send \"Scheduled Event\" (aws.events) or S3 \"Object Created\" (aws.s3)"
            ))),
        };
    }
    if obj.contains_key("pipeline") {
        let m: ManualRefresh = typed(value, "a manual refresh {\"pipeline\": NAME}")?;
        return Ok(Event::Manual {
            pipeline: m.pipeline,
            requested_by: m.requested_by,
        });
    }
    Err(refused(
        "unrecognised event: expected an S3 notification ({\"Records\": [...]}), an SNS \
         message carrying one, an EventBridge \"Scheduled Event\" or S3 \"Object Created\" \
         event, or a manual refresh {\"pipeline\": NAME}; nothing was started",
    ))
}

fn typed<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T> {
    serde_json::from_value(value)
        .map_err(|e| refused(format!("not {what}: {e}; nothing was started")))
}

fn s3_objects(ev: S3Event) -> Result<(Vec<ObjectRef>, u64)> {
    let mut objects = Vec::new();
    let mut skipped = 0;
    for r in ev.records {
        let created = r
            .event_name
            .as_deref()
            .is_some_and(|n| n.starts_with("ObjectCreated:"));
        match (created, r.s3.bucket.name, r.s3.object.key) {
            (true, Some(bucket), Some(key)) => objects.push(ObjectRef {
                bucket,
                key: decode_key(&key)?,
                size: r.s3.object.size.and_then(|s| u64::try_from(s).ok()),
            }),
            _ => skipped += 1,
        }
    }
    Ok((objects, skipped))
}

/// Whether `key` is a plain object key: no empty, `.` or `..` segment, no
/// leading `/`, no control characters.
pub fn is_plain_key(key: &str) -> bool {
    !key.is_empty()
        && !key.chars().any(char::is_control)
        && key
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
}

/// Whether the created object `o` is an input file of `p`.
pub fn concerns(p: &Pipeline, o: &ObjectRef) -> bool {
    input_key(p, o).is_some()
}

/// The key of `o` relative to `p`'s source root, if `o` is an input file
/// of `p`.
pub fn input_key<'a>(p: &Pipeline, o: &'a ObjectRef) -> Option<&'a str> {
    let Location::S3 { bucket, prefix } = &p.source.location else {
        return None;
    };
    if *bucket != o.bucket || !is_plain_key(&o.key) {
        return None;
    }
    let rel = if prefix.is_empty() {
        o.key.as_str()
    } else {
        o.key.strip_prefix(prefix.as_str())?.strip_prefix('/')?
    };
    p.source.is_input(rel).then_some(rel)
}

/// Which registered pipelines an event wakes, and how many objects it
/// carried that concern none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    /// Pipeline name -> objects of the event that concern it.
    pub pipelines: BTreeMap<String, u64>,
    /// Objects outside every registered source, or with path tricks.
    pub ignored: u64,
}

/// Route `event` to the pipelines in `registered`.
pub fn route(event: &Event, registered: &[Pipeline]) -> Result<Routing> {
    let mut r = Routing::default();
    match event {
        Event::Objects { objects, .. } => {
            for o in objects {
                let mut hit = false;
                for p in registered.iter().filter(|p| concerns(p, o)) {
                    *r.pipelines.entry(p.name.clone()).or_default() += 1;
                    hit = true;
                }
                if !hit {
                    r.ignored += 1;
                }
            }
        }
        Event::Schedule { .. } => {
            for p in registered {
                r.pipelines.insert(p.name.clone(), 0);
            }
        }
        Event::Manual { pipeline, .. } => {
            if !registered.iter().any(|p| p.name == *pipeline) {
                return Err(refused(format!(
                    "no pipeline \"{pipeline}\" is registered; run `sluice register` with its \
                     pipeline file first"
                )));
            }
            r.pipelines.insert(pipeline.clone(), 0);
        }
    }
    Ok(r)
}

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
/// whether the lease holder's execution has ended (a failed execution keeps
/// the lease deliberately; once it ended, the next trigger takes over
/// without waiting for the TTL).
pub fn decide_wake(
    control: Option<&Control>,
    now_ms: i64,
    ttl_ms: i64,
    holder_ended: bool,
) -> Wake {
    // The same rule as a run's own claim: the holder's execution having
    // ended is what a dead local process is to `sluice run`. A paused
    // pipeline starts nothing new (a run already going carries on).
    match crate::checkpoint::decide_claim(control, now_ms, ttl_ms, holder_ended) {
        crate::checkpoint::Claim::Take { .. } if control.is_some_and(|c| c.paused) => Wake::Hold {
            already: control.is_some_and(|c| c.requested),
        },
        crate::checkpoint::Claim::Take { epoch, recover } => Wake::Start { epoch, recover },
        crate::checkpoint::Claim::Busy { .. } => {
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
    serde_json::json!({
        "pipeline": pipeline,
        "run": RunState {
            pipeline: pipeline.to_string(),
            epoch,
            discovered: false,
            batches: 0,
            trigger: Some(trigger.to_string()),
        },
    })
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
    /// Start an execution named `name` with `input`; an existing execution
    /// of that name is not an error (`new: false`).
    async fn start(&self, name: &str, input: &Value) -> Result<Started>;

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

/// Apply the lease protocol to one pipeline: claim and start, or request.
/// `spec_hash` is the registered spec's hash (a first claim writes it);
/// `trigger` is what the run records as its cause.
pub async fn wake(
    checkpoint: &Checkpoint,
    pipeline: &str,
    spec_hash: &str,
    now_ms: i64,
    ttl_ms: i64,
    executions: &dyn Executions,
    trigger: &str,
) -> Result<WakeOutcome> {
    for _ in 0..16 {
        let read = checkpoint.control().await?;
        let control = read.as_ref().map(|(c, _)| c);
        let etag = read.as_ref().map(|(_, e)| e.as_str());
        // A live lease held by an execution: ask Step Functions whether it
        // still runs (one call; only while a run holds the lease).
        let holder = control
            .filter(|c| {
                c.status == RunStatus::Running
                    && now_ms - c.heartbeat_ms.unwrap_or(i64::MIN / 2) <= ttl_ms
            })
            .and_then(|c| c.owner.as_deref())
            .and_then(|o| o.strip_prefix(EXECUTION_OWNER));
        let holder_state = match holder {
            Some(name) => Some(executions.state(name).await?),
            None => None,
        };
        match decide_wake(
            control,
            now_ms,
            ttl_ms,
            holder_state == Some(ExecutionState::Ended),
        ) {
            Wake::Start { epoch, recover } => {
                let before = control.cloned();
                let name = execution_name(pipeline, epoch);
                let owner = format!("{EXECUTION_OWNER}{name}");
                let next = crate::checkpoint::claimed(control, epoch, &owner, now_ms, spec_hash);
                let Some(claimed) = checkpoint.swap_control(&next, etag).await? else {
                    continue; // another trigger or run changed it: decide again
                };
                match executions
                    .start(&name, &execution_input(pipeline, epoch, trigger))
                    .await
                {
                    Ok(s) => {
                        tracing::info!(pipeline, epoch, execution = %s.execution, recover, "run started");
                        return Ok(WakeOutcome::Started {
                            epoch,
                            execution: s.execution,
                            recover,
                        });
                    }
                    Err(e) => {
                        // Give the claim back so the retried event can
                        // start the run; if this fails too, the lease
                        // expires after its TTL.
                        if let Some(prev) = before {
                            let _ = checkpoint.swap_control(&prev, Some(&claimed)).await;
                        } else {
                            let mut idle = next.clone();
                            idle.status = RunStatus::Idle;
                            let _ = checkpoint.swap_control(&idle, Some(&claimed)).await;
                        }
                        return Err(e);
                    }
                }
            }
            Wake::Hold { already } => {
                let c = control.expect("a paused pipeline has a record");
                if !already
                    && checkpoint
                        .swap_control(&crate::checkpoint::requested(c), etag)
                        .await?
                        .is_none()
                {
                    continue;
                }
                tracing::info!(pipeline, "paused; request recorded");
                return Ok(WakeOutcome::Held);
            }
            Wake::Request { epoch, already } => {
                let c = control.expect("a running lease has a record");
                if !already {
                    let next = crate::checkpoint::requested(c);
                    if checkpoint.swap_control(&next, etag).await?.is_none() {
                        continue;
                    }
                }
                // The run's execution never started (its trigger died
                // between claim and start): start it now, by the same name.
                if holder_state == Some(ExecutionState::Missing)
                    && holder == Some(execution_name(pipeline, epoch).as_str())
                {
                    executions
                        .start(
                            &execution_name(pipeline, epoch),
                            &execution_input(pipeline, epoch, trigger),
                        )
                        .await?;
                }
                tracing::info!(pipeline, epoch, "run in progress; asked it to look again");
                return Ok(WakeOutcome::Requested { epoch });
            }
        }
    }
    Err(Error::Conflict {
        pipeline: pipeline.to_string(),
        message: "control.json kept changing while the trigger decided; retry the event".into(),
    })
}

/// Step Functions as the place executions start.
pub struct StepFunctions {
    client: aws_sdk_sfn::Client,
    state_machine_arn: String,
}

impl StepFunctions {
    /// Executions of `state_machine_arn`, through `client`.
    pub fn new(client: aws_sdk_sfn::Client, state_machine_arn: impl Into<String>) -> StepFunctions {
        StepFunctions {
            client,
            state_machine_arn: state_machine_arn.into(),
        }
    }

    /// A client from the environment's AWS configuration (respects
    /// `AWS_ENDPOINT_URL`).
    pub async fn from_env(state_machine_arn: impl Into<String>) -> StepFunctions {
        let conf = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        StepFunctions::new(aws_sdk_sfn::Client::new(&conf), state_machine_arn)
    }

    /// The client.
    pub fn client(&self) -> &aws_sdk_sfn::Client {
        &self.client
    }

    /// The ARN an execution named `name` of this state machine has.
    pub fn execution_arn(&self, name: &str) -> String {
        format!(
            "{}:{name}",
            self.state_machine_arn
                .replacen(":stateMachine:", ":execution:", 1)
        )
    }
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionEnd {
    /// SUCCEEDED, FAILED, TIMED_OUT or ABORTED.
    pub status: String,
    /// The error name of a failed execution.
    pub error: Option<String>,
    /// Its cause.
    pub cause: Option<String>,
}

impl StepFunctions {
    /// Poll the execution named `name` every `every` until it ends.
    pub async fn wait(&self, name: &str, every: std::time::Duration) -> Result<ExecutionEnd> {
        let arn = self.execution_arn(name);
        loop {
            let o = self
                .client
                .describe_execution()
                .execution_arn(&arn)
                .send()
                .await
                .map_err(|e| sfn_error("DescribeExecution", &arn, &e, ErrorClass::Retryable))?;
            if !matches!(
                o.status,
                aws_sdk_sfn::types::ExecutionStatus::Running
                    | aws_sdk_sfn::types::ExecutionStatus::PendingRedrive
            ) {
                return Ok(ExecutionEnd {
                    status: o.status.as_str().to_string(),
                    error: o.error,
                    cause: o.cause,
                });
            }
            tokio::time::sleep(every).await;
        }
    }
}

fn sfn_error<E>(
    op: &str,
    target: &str,
    e: &aws_sdk_sfn::error::SdkError<E>,
    class: ErrorClass,
) -> Error
where
    E: std::error::Error + 'static,
{
    Error::Service {
        service: "Step Functions",
        message: format!(
            "{op} {target}: {}",
            aws_sdk_sfn::error::DisplayErrorContext(e)
        ),
        class,
    }
}

#[async_trait::async_trait]
impl Executions for StepFunctions {
    async fn stop(&self, name: &str, cause: &str) -> Result<()> {
        use aws_sdk_sfn::operation::stop_execution::StopExecutionError as E;
        let arn = self.execution_arn(name);
        match self
            .client
            .stop_execution()
            .execution_arn(&arn)
            .cause(cause)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(E::ExecutionDoesNotExist(_)) => Ok(()),
                Some(E::InvalidArn(_) | E::ValidationException(_)) => {
                    Err(sfn_error("StopExecution", &arn, &e, ErrorClass::Fatal))
                }
                _ => Err(sfn_error("StopExecution", &arn, &e, ErrorClass::Retryable)),
            },
        }
    }

    async fn state(&self, name: &str) -> Result<ExecutionState> {
        use aws_sdk_sfn::operation::describe_execution::DescribeExecutionError as E;
        use aws_sdk_sfn::types::ExecutionStatus as S;
        let arn = self.execution_arn(name);
        match self
            .client
            .describe_execution()
            .execution_arn(&arn)
            .send()
            .await
        {
            Ok(o) => Ok(match o.status {
                S::Running | S::PendingRedrive => ExecutionState::Running,
                _ => ExecutionState::Ended,
            }),
            Err(e) => match e.as_service_error() {
                Some(E::ExecutionDoesNotExist(_)) => Ok(ExecutionState::Missing),
                Some(E::InvalidArn(_)) => {
                    Err(sfn_error("DescribeExecution", &arn, &e, ErrorClass::Fatal))
                }
                _ => Err(sfn_error(
                    "DescribeExecution",
                    &arn,
                    &e,
                    ErrorClass::Retryable,
                )),
            },
        }
    }

    async fn start(&self, name: &str, input: &Value) -> Result<Started> {
        use aws_sdk_sfn::operation::start_execution::StartExecutionError as E;
        let out = self
            .client
            .start_execution()
            .state_machine_arn(&self.state_machine_arn)
            .name(name)
            .input(input.to_string())
            .send()
            .await;
        match out {
            Ok(o) => Ok(Started {
                execution: o.execution_arn,
                new: true,
            }),
            Err(e) => {
                let class = match e.as_service_error() {
                    Some(E::ExecutionAlreadyExists(_)) => {
                        return Ok(Started {
                            execution: self.execution_arn(name),
                            new: false,
                        });
                    }
                    Some(
                        E::InvalidArn(_)
                        | E::InvalidName(_)
                        | E::InvalidExecutionInput(_)
                        | E::StateMachineDoesNotExist(_)
                        | E::StateMachineDeleting(_)
                        | E::ValidationException(_),
                    ) => ErrorClass::Fatal,
                    _ => ErrorClass::Retryable,
                };
                Err(sfn_error(
                    "StartExecution",
                    &format!("{name} on {}", self.state_machine_arn),
                    &e,
                    class,
                ))
            }
        }
    }
}

/// Notify mode: record the objects of `event` that are input files of the
/// pipeline in its inbox (the size is 0 when the notification gave none).
async fn record_inbox(ctx: &crate::handlers::Context, event: &Event) -> Result<()> {
    let p = &ctx.pipeline;
    let Event::Objects { objects, .. } = event else {
        return Ok(());
    };
    if p.source.discovery != crate::pipeline::DiscoveryMode::Notify {
        return Ok(());
    }
    let files: Vec<(String, u64)> = objects
        .iter()
        .filter_map(|o| input_key(p, o).map(|k| (k.to_string(), o.size.unwrap_or(0))))
        .collect();
    crate::discovery::record_notified(ctx.checkpoint.store(), files).await
}

/// The pipelines registered under a checkpoint root (`sluice register`).
pub async fn registered_names(root: &dyn crate::storage::Store) -> Result<Vec<String>> {
    let listed = root.list(crate::paths::registry::PREFIX, None).await?;
    Ok(listed
        .iter()
        .filter_map(|m| crate::paths::registry::pipeline_of(&m.key))
        .map(str::to_string)
        .collect())
}

/// What one trigger invocation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerReport {
    /// The event's source (`s3`, `sns`, `eventbridge-s3`, `schedule`, `manual`).
    pub source: String,
    /// Created objects the event carried.
    pub objects: u64,
    /// Records that were not object creations (test events, removals).
    pub skipped: u64,
    /// Objects outside every registered source, or with path tricks.
    pub ignored: u64,
    /// What happened to each pipeline the event concerns.
    pub woken: BTreeMap<String, WakeOutcome>,
}

/// Route `event` to the `registered` pipelines and wake each. A pipeline
/// whose wake fails does not stop the others; the first error is returned
/// after all were tried, so the event is retried (waking is idempotent).
pub async fn trigger(
    event: &Event,
    registered: &[crate::handlers::Context],
    executions: &dyn Executions,
) -> Result<TriggerReport> {
    let pipelines: Vec<Pipeline> = registered.iter().map(|c| (*c.pipeline).clone()).collect();
    let routing = route(event, &pipelines)?;
    let (objects, skipped) = match event {
        Event::Objects {
            objects, skipped, ..
        } => (objects.len() as u64, *skipped),
        _ => (0, 0),
    };
    let mut report = TriggerReport {
        source: event.source().to_string(),
        objects,
        skipped,
        ignored: routing.ignored,
        woken: BTreeMap::new(),
    };
    let mut first_error = None;
    for name in routing.pipelines.keys() {
        let ctx = registered
            .iter()
            .find(|c| c.pipeline.name == *name)
            .expect("routed to a registered pipeline");
        // Notify mode: the inbox entries first, so the discovery that the
        // wake-up below causes sees them.
        if let Err(e) = record_inbox(ctx, event).await {
            tracing::warn!(pipeline = %name, error = %e, "recording notifications failed");
            first_error.get_or_insert(e);
            continue;
        }
        match wake(
            &ctx.checkpoint,
            name,
            &ctx.pipeline.spec_hash(),
            ctx.now(),
            ctx.ttl_ms(),
            executions,
            &event.label(),
        )
        .await
        {
            Ok(w) => {
                report.woken.insert(name.clone(), w);
            }
            Err(e) => {
                tracing::warn!(pipeline = %name, error = %e, "wake failed");
                first_error.get_or_insert(e);
            }
        }
    }
    if routing.ignored > 0 {
        tracing::info!(
            ignored = routing.ignored,
            "objects outside every registered source ignored"
        );
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}
