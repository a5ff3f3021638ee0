//! An interpreter for the subset of Amazon States Language that
//! `statemachines/microbatch.asl.json` uses, so the local runner executes the
//! very definition that is deployed.
//!
//! Supported: `Task`, `Choice`, `Map` (inline, and distributed with a JSON
//! `ItemReader` whose resource the Task invoker binds; a failed child fails
//! the Map with `States.ExceedToleratedFailureThreshold`, as on AWS), `Pass`,
//! `Succeed`, `Fail`,
//! `Wait`; `InputPath`, `Parameters` / `ItemSelector`, `ResultSelector`,
//! `ResultPath`, `OutputPath`; `Retry` (interval, backoff rate, max attempts,
//! max delay) and `Catch`; `TimeoutSeconds` on tasks; `MaxConcurrency` on
//! maps; the context object's `$$.Map.Item.Value` / `Index`,
//! `$$.State.Name` / `RetryCount` (in Task and Map states) and
//! `$$.Execution.Id` / `Input` / `StartTime`; the intrinsic `States.UUID()`. A definition using anything else is refused at
//! parse time with the state named. JSONPath queries use `serde_json_path`
//! (RFC 9535).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use serde_json_path::JsonPath;

/// A failure inside an execution: an error name (matched by Retry/Catch) and
/// a cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}: {cause}")]
pub struct Failure {
    /// Error name, e.g. `Sluice.Retryable` or `States.Timeout`.
    pub error: String,
    /// Human-readable cause.
    pub cause: String,
}

impl Failure {
    fn new(error: &str, cause: impl Into<String>) -> Failure {
        Failure {
            error: error.to_string(),
            cause: cause.into(),
        }
    }

    fn runtime(cause: impl Into<String>) -> Failure {
        Failure::new("States.Runtime", cause)
    }
}

/// A definition the interpreter refuses, naming the state and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("state machine: {0}")]
pub struct DefinitionError(pub String);

/// Runs Task states: `resource` is the state's `Resource` string.
pub trait TaskInvoker: Send + Sync {
    /// Invoke `resource` with `input`; an `Err` is a task failure.
    fn invoke<'a>(
        &'a self,
        resource: &'a str,
        input: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, Failure>> + Send + 'a>>;
}

/// Waits for Retry intervals and Wait states (tests record instead).
pub(crate) type Sleeper =
    Arc<dyn Fn(Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

tokio::task_local! {
    /// State transitions of the execution running in this task.
    static TRANSITIONS: Arc<std::sync::atomic::AtomicU64>;
}

/// Count one state transition of the execution in progress (each state
/// entered, inside Map iterations too, and each retry of a Task or Map).
fn transition() {
    let _ = TRANSITIONS.try_with(|c| c.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
}

/// A parsed, checked state machine.
#[derive(Debug, Clone)]
pub struct StateMachine {
    start_at: String,
    states: BTreeMap<String, Value>,
    timeout: Option<f64>,
}

const COMMON: &[&str] = &["Type", "Comment", "Next", "End", "InputPath", "OutputPath"];

fn allowed(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "Task" => &[
            "Resource",
            "Parameters",
            "ResultSelector",
            "ResultPath",
            "Retry",
            "Catch",
            "TimeoutSeconds",
        ],
        "Choice" => &["Choices", "Default"],
        "Map" => &[
            "ItemsPath",
            "ItemReader",
            "ItemSelector",
            "Parameters",
            "ItemProcessor",
            "Iterator",
            "MaxConcurrency",
            "ResultSelector",
            "ResultPath",
            "Retry",
            "Catch",
        ],
        "Pass" => &["Result", "Parameters", "ResultPath"],
        "Succeed" => &[],
        "Fail" => &["Error", "Cause", "ErrorPath", "CausePath"],
        "Wait" => &["Seconds", "SecondsPath"],
        _ => return None,
    })
}

impl StateMachine {
    /// Parse a definition and refuse anything outside the supported subset.
    pub fn parse(json: &str) -> Result<StateMachine, DefinitionError> {
        let v: Value = serde_json::from_str(json)
            .map_err(|e| DefinitionError(format!("not valid JSON: {e}")))?;
        Self::from_value(&v, "")
    }

    fn from_value(v: &Value, scope: &str) -> Result<StateMachine, DefinitionError> {
        let err = |m: String| DefinitionError(m);
        let start_at = v["StartAt"]
            .as_str()
            .ok_or_else(|| err(format!("{scope}StartAt is missing")))?
            .to_string();
        let states: BTreeMap<String, Value> = v["States"]
            .as_object()
            .ok_or_else(|| err(format!("{scope}States is missing")))?
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !states.contains_key(&start_at) {
            return Err(err(format!("{scope}StartAt names no state: {start_at}")));
        }
        for (name, s) in &states {
            Self::check_state(&states, scope, name, s)?;
        }
        Ok(StateMachine {
            start_at,
            states,
            timeout: v["TimeoutSeconds"].as_f64(),
        })
    }

    /// Checks one state: a type the local runner knows, only fields it
    /// supports, and transitions (Next, Catch, Choices) naming states.
    fn check_state(
        states: &BTreeMap<String, Value>,
        scope: &str,
        name: &str,
        s: &Value,
    ) -> Result<(), DefinitionError> {
        let err = |m: String| DefinitionError(m);
        let kind = s["Type"].as_str().unwrap_or_default();
        let Some(extra) = allowed(kind) else {
            return Err(err(format!(
                "state {scope}{name}: Type \"{kind}\" is not supported by the local runner"
            )));
        };
        for field in s.as_object().into_iter().flat_map(|o| o.keys()) {
            if !COMMON.contains(&field.as_str()) && !extra.contains(&field.as_str()) {
                return Err(err(format!(
                    "state {scope}{name}: field {field} is not supported by the local runner"
                )));
            }
        }
        if !matches!(kind, "Choice" | "Succeed" | "Fail") {
            match (&s["Next"], &s["End"]) {
                (Value::String(n), Value::Null) if states.contains_key(n) => {}
                (Value::Null, Value::Bool(true)) => {}
                _ => {
                    return Err(err(format!(
                        "state {scope}{name}: needs Next naming a state, or End: true"
                    )));
                }
            }
        }
        for c in s["Catch"].as_array().into_iter().flatten() {
            if !c["Next"].as_str().is_some_and(|n| states.contains_key(n)) {
                return Err(err(format!(
                    "state {scope}{name}: a Catch has no valid Next"
                )));
            }
        }
        if kind == "Map" {
            Self::check_map(scope, name, s)?;
        }
        if kind == "Choice" {
            for c in s["Choices"].as_array().into_iter().flatten() {
                if !c["Next"].as_str().is_some_and(|n| states.contains_key(n)) {
                    return Err(err(format!(
                        "state {scope}{name}: a choice has no valid Next"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Checks a Map state: its mode, execution type and item reader, and
    /// its processor as a state machine of its own.
    fn check_map(scope: &str, name: &str, s: &Value) -> Result<(), DefinitionError> {
        let err = |m: String| DefinitionError(m);
        let processor = if s["ItemProcessor"].is_object() {
            &s["ItemProcessor"]
        } else {
            &s["Iterator"]
        };
        let config = &processor["ProcessorConfig"];
        let distributed = match config["Mode"].as_str() {
            None | Some("INLINE") => false,
            Some("DISTRIBUTED") => true,
            Some(mode) => {
                return Err(err(format!(
                    "state {scope}{name}: Map mode {mode} is not supported by the local runner"
                )));
            }
        };
        if let Some(t) = config.get("ExecutionType")
            && !matches!(t.as_str(), Some("STANDARD" | "EXPRESS"))
        {
            return Err(err(format!(
                "state {scope}{name}: ExecutionType {t} is not STANDARD or EXPRESS"
            )));
        }
        if let Some(reader) = s.get("ItemReader") {
            if !distributed {
                return Err(err(format!(
                    "state {scope}{name}: ItemReader needs ProcessorConfig Mode DISTRIBUTED"
                )));
            }
            for field in reader.as_object().into_iter().flat_map(|o| o.keys()) {
                if !["Resource", "ReaderConfig", "Parameters"].contains(&field.as_str()) {
                    return Err(err(format!(
                        "state {scope}{name}: ItemReader field {field} is not supported by \
                         the local runner"
                    )));
                }
            }
            if reader["Resource"] != "arn:aws:states:::s3:getObject"
                || reader["ReaderConfig"] != json!({"InputType": "JSON"})
            {
                return Err(err(format!(
                    "state {scope}{name}: the local runner reads only a JSON array \
                     (ItemReader arn:aws:states:::s3:getObject, InputType JSON)"
                )));
            }
        }
        Self::from_value(processor, &format!("{scope}{name}/"))?;
        Ok(())
    }

    /// Run an execution with `input` to its end, as execution `id` (a new
    /// one if `None`); also returns the state transitions it took.
    pub async fn execute_counted(
        &self,
        input: Value,
        id: Option<&str>,
        tasks: &dyn TaskInvoker,
        sleep: &Sleeper,
    ) -> (Result<Value, Failure>, u64) {
        let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let result = TRANSITIONS
            .scope(counter.clone(), self.execute_as(input, id, tasks, sleep))
            .await;
        (result, counter.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Run an execution with `input` to its end.
    pub async fn execute(
        &self,
        input: Value,
        tasks: &dyn TaskInvoker,
        sleep: &Sleeper,
    ) -> Result<Value, Failure> {
        self.execute_as(input, None, tasks, sleep).await
    }

    /// Run an execution with `input` to its end as execution `id`: every
    /// execution has its own (`None`: a new one, as on AWS, where it is the
    /// ARN); Express may run one execution twice under the same id.
    pub async fn execute_as(
        &self,
        input: Value,
        id: Option<&str>,
        tasks: &dyn TaskInvoker,
        sleep: &Sleeper,
    ) -> Result<Value, Failure> {
        let started = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let id = id.map_or_else(
            || {
                format!(
                    "arn:aws:states:local:000000000000:execution:sluice:{}",
                    uuid::Uuid::new_v4()
                )
            },
            str::to_string,
        );
        let context = json!({
            "Execution": { "Id": id, "Input": input.clone(), "StartTime": started }
        });
        let run = self.run(input, &context, tasks, sleep);
        match self.timeout {
            Some(t) => tokio::time::timeout(Duration::from_secs_f64(t), run)
                .await
                .map_err(|_| Failure::new("States.Timeout", format!("execution ran past {t} s")))?,
            None => run.await,
        }
    }

    fn run<'a>(
        &'a self,
        input: Value,
        context: &'a Value,
        tasks: &'a dyn TaskInvoker,
        sleep: &'a Sleeper,
    ) -> Pin<Box<dyn Future<Output = Result<Value, Failure>> + Send + 'a>> {
        Box::pin(async move {
            let mut name = self.start_at.clone();
            let mut data = input;
            loop {
                let state = &self.states[&name];
                tracing::debug!(state = %name, "entering state");
                transition();
                match self.step(&name, state, data, context, tasks, sleep).await? {
                    (Some(next), out) => {
                        name = next;
                        data = out;
                    }
                    (None, out) => return Ok(out),
                }
            }
        })
    }

    /// Run one state; returns the next state (None at the end) and output.
    async fn step(
        &self,
        name: &str,
        s: &Value,
        raw_input: Value,
        context: &Value,
        tasks: &dyn TaskInvoker,
        sleep: &Sleeper,
    ) -> Result<(Option<String>, Value), Failure> {
        let next = s["Next"].as_str().map(str::to_string);
        let kind = s["Type"].as_str().unwrap_or_default();
        if kind == "Fail" {
            return Err(failure_of(s, &raw_input, context)?);
        }
        let input = match &s["InputPath"] {
            Value::Null if s.get("InputPath").is_some() => json!({}),
            Value::String(p) => get(p, &raw_input, context)?,
            _ => raw_input.clone(),
        };
        let outcome: Result<(Option<String>, Value), Failure> = match kind {
            "Succeed" => return Ok((None, output(s, input, context)?)),
            "Choice" => match choose(s, &input, context)? {
                Some(to) => return Ok((Some(to), output(s, input, context)?)),
                None => Err(Failure::new(
                    "States.NoChoiceMatched",
                    format!("state {name}: no choice matched and no Default"),
                )),
            },
            "Wait" => {
                let secs = match s["SecondsPath"].as_str() {
                    Some(p) => get(p, &input, context)?.as_f64().unwrap_or(0.0),
                    None => s["Seconds"].as_f64().unwrap_or(0.0),
                };
                sleep(Duration::from_secs_f64(secs.max(0.0))).await;
                Ok((next, output(s, input, context)?))
            }
            "Pass" => {
                let result = if let Some(p) = s.get("Parameters") {
                    resolve(p, &input, context)?
                } else if let Some(r) = s.get("Result") {
                    r.clone()
                } else {
                    input.clone()
                };
                let merged = place(s, &raw_input, result)?;
                Ok((next, output(s, merged, context)?))
            }
            "Task" | "Map" => {
                let result = self
                    .with_retry(name, s, &input, context, tasks, sleep)
                    .await;
                match result {
                    Ok(r) => {
                        let r = match s.get("ResultSelector") {
                            Some(sel) => resolve(sel, &r, context)?,
                            None => r,
                        };
                        let merged = place(s, &raw_input, r)?;
                        Ok((next, output(s, merged, context)?))
                    }
                    Err(f) => Err(f),
                }
            }
            other => Err(Failure::runtime(format!("state {name}: type {other}"))),
        };
        match outcome {
            Ok(r) => Ok(r),
            Err(f) => catch(s, &raw_input, f),
        }
    }

    async fn with_retry(
        &self,
        name: &str,
        s: &Value,
        input: &Value,
        context: &Value,
        tasks: &dyn TaskInvoker,
        sleep: &Sleeper,
    ) -> Result<Value, Failure> {
        let mut attempts: BTreeMap<usize, u64> = BTreeMap::new();
        loop {
            // `$$.State`: this state's name and the retries made so far.
            let mut context = context.clone();
            context["State"] = json!({
                "Name": name,
                "RetryCount": attempts.values().sum::<u64>(),
            });
            let context = &context;
            let result = if s["Type"] == "Map" {
                self.map(name, s, input, context, tasks, sleep).await
            } else {
                self.task(name, s, input, context, tasks).await
            };
            let f = match result {
                Ok(v) => return Ok(v),
                Err(f) => f,
            };
            let rules = s["Retry"].as_array().cloned().unwrap_or_default();
            let Some((i, rule)) = rules
                .iter()
                .enumerate()
                .find(|(_, r)| error_matches(r, &f.error))
            else {
                return Err(f);
            };
            let done = attempts.entry(i).or_insert(0);
            let max = rule["MaxAttempts"].as_u64().unwrap_or(3);
            if *done >= max {
                return Err(f);
            }
            let interval = rule["IntervalSeconds"].as_f64().unwrap_or(1.0);
            let rate = rule["BackoffRate"].as_f64().unwrap_or(2.0);
            let mut delay = interval * rate.powi(*done as i32);
            if let Some(cap) = rule["MaxDelaySeconds"].as_f64() {
                delay = delay.min(cap);
            }
            *done += 1;
            transition();
            tracing::info!(state = %name, error = %f.error, attempt = *done, delay_s = delay, "retrying");
            sleep(Duration::from_secs_f64(delay)).await;
        }
    }

    async fn task(
        &self,
        name: &str,
        s: &Value,
        input: &Value,
        context: &Value,
        tasks: &dyn TaskInvoker,
    ) -> Result<Value, Failure> {
        let payload = match s.get("Parameters") {
            Some(p) => resolve(p, input, context)?,
            None => input.clone(),
        };
        let resource = s["Resource"]
            .as_str()
            .ok_or_else(|| Failure::runtime(format!("state {name}: no Resource")))?;
        let call = tasks.invoke(resource, payload);
        match s["TimeoutSeconds"].as_f64() {
            Some(t) => tokio::time::timeout(Duration::from_secs_f64(t), call)
                .await
                .map_err(|_| {
                    Failure::new(
                        "States.Timeout",
                        format!("state {name}: no result within {t} s"),
                    )
                })?,
            None => call.await,
        }
    }

    async fn map(
        &self,
        name: &str,
        s: &Value,
        input: &Value,
        context: &Value,
        tasks: &dyn TaskInvoker,
        sleep: &Sleeper,
    ) -> Result<Value, Failure> {
        let items = match (s.get("ItemReader"), s["ItemsPath"].as_str()) {
            // A Distributed Map reads its items through the Task invoker,
            // which binds the reader's resource like any other.
            (Some(reader), _) => {
                let params = match reader.get("Parameters") {
                    Some(p) => resolve(p, input, context)?,
                    None => json!({}),
                };
                let resource = reader["Resource"].as_str().unwrap_or_default();
                tasks.invoke(resource, params).await.map_err(|f| {
                    Failure::new(
                        "States.ItemReaderFailed",
                        format!("state {name}: {}: {}", f.error, f.cause),
                    )
                })?
            }
            (None, Some(p)) => get(p, input, context)?,
            (None, None) => input.clone(),
        };
        let items = items
            .as_array()
            .ok_or_else(|| Failure::runtime(format!("state {name}: the items are not an array")))?
            .clone();
        let processor = if s["ItemProcessor"].is_object() {
            &s["ItemProcessor"]
        } else {
            &s["Iterator"]
        };
        let distributed = processor["ProcessorConfig"]["Mode"] == "DISTRIBUTED";
        let inner = Self::from_value(processor, "").map_err(|e| Failure::runtime(e.0))?;
        let selector = s.get("ItemSelector").or_else(|| s.get("Parameters"));
        let limit = match s["MaxConcurrency"].as_u64() {
            Some(0) | None => items.len().max(1),
            Some(n) => n as usize,
        };
        let runs = items.into_iter().enumerate().map(|(index, value)| {
            let mut ctx = context.clone();
            ctx["Map"] = json!({ "Item": { "Index": index, "Value": value.clone() } });
            let inner = &inner;
            async move {
                let item_input = match selector {
                    Some(sel) => resolve(sel, input, &ctx)?,
                    None => value,
                };
                inner.run(item_input, &ctx, tasks, sleep).await
            }
        });
        use futures::StreamExt;
        let results: Vec<Result<Value, Failure>> =
            futures::stream::iter(runs).buffered(limit).collect().await;
        let failed = results.iter().filter(|r| r.is_err()).count();
        let out = results.into_iter().collect::<Result<Vec<_>, _>>();
        match out {
            // A Distributed Map's children are executions of their own: with
            // no tolerated failures, any failed child fails the Map with this
            // name, not the child's error.
            Err(f) if distributed => Err(Failure::new(
                "States.ExceedToleratedFailureThreshold",
                format!(
                    "state {name}: {failed} of its child executions failed (first: {}: {})",
                    f.error, f.cause
                ),
            )),
            other => other.map(Value::Array),
        }
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn error_matches(rule: &Value, error: &str) -> bool {
    rule["ErrorEquals"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| match e.as_str() {
            Some("States.ALL") => true,
            Some("States.TaskFailed") => {
                error != "States.Timeout" && !error.starts_with("States.Runtime")
            }
            Some(name) => name == error,
            None => false,
        })
}

/// Evaluate a path (`$...` on the data, `$$...` on the context object).
fn get(path: &str, data: &Value, context: &Value) -> Result<Value, Failure> {
    let (target, query) = match path.strip_prefix("$$") {
        Some(rest) => (context, format!("${rest}")),
        None => (data, path.to_string()),
    };
    let jp = JsonPath::parse(&query)
        .map_err(|e| Failure::runtime(format!("path {path} is not valid JSONPath: {e}")))?;
    let nodes = jp.query(target);
    match nodes.at_most_one() {
        Ok(Some(v)) => Ok(v.clone()),
        Ok(None) => Err(Failure::runtime(format!(
            "path {path} matched nothing in {target}"
        ))),
        // Several matches (wildcards, filters): an array, as Step Functions does.
        Err(_) => Ok(Value::Array(nodes.all().into_iter().cloned().collect())),
    }
}

/// Apply a payload template: keys ending in `.$` take the value of a path.
fn resolve(template: &Value, data: &Value, context: &Value) -> Result<Value, Failure> {
    match template {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                match k.strip_suffix(".$") {
                    Some(key) => {
                        let path = v.as_str().ok_or_else(|| {
                            Failure::runtime(format!("{k} must be a path string"))
                        })?;
                        if path == "States.UUID()" {
                            out.insert(key.to_string(), uuid::Uuid::new_v4().to_string().into());
                            continue;
                        }
                        if path.starts_with("States.") {
                            return Err(Failure::runtime(format!(
                                "{k}: of the intrinsic functions the local runner supports only \
                                 States.UUID()"
                            )));
                        }
                        out.insert(key.to_string(), get(path, data, context)?);
                    }
                    None => {
                        out.insert(k.clone(), resolve(v, data, context)?);
                    }
                }
            }
            Ok(Value::Object(out))
        }
        Value::Array(a) => a
            .iter()
            .map(|v| resolve(v, data, context))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        other => Ok(other.clone()),
    }
}

/// Place `result` into `input` at the state's ResultPath (default `$`:
/// replace; `null`: discard the result).
fn place(s: &Value, input: &Value, result: Value) -> Result<Value, Failure> {
    match s.get("ResultPath") {
        None => Ok(result),
        Some(Value::Null) => Ok(input.clone()),
        Some(Value::String(p)) if p == "$" => Ok(result),
        Some(Value::String(p)) => {
            let segments = reference_segments(p)?;
            let mut out = input.clone();
            let mut cur = &mut out;
            for (i, seg) in segments.iter().enumerate() {
                if !cur.is_object() {
                    *cur = json!({});
                }
                let obj = cur.as_object_mut().expect("made an object");
                if i == segments.len() - 1 {
                    obj.insert(seg.clone(), result);
                    return Ok(out);
                }
                cur = obj.entry(seg.clone()).or_insert_with(|| json!({}));
            }
            Ok(out)
        }
        Some(other) => Err(Failure::runtime(format!(
            "ResultPath {other} is not a path"
        ))),
    }
}

/// Segments of a reference path `$.a.b` / `$['a']['b']`.
fn reference_segments(p: &str) -> Result<Vec<String>, Failure> {
    let rest = p
        .strip_prefix('$')
        .ok_or_else(|| Failure::runtime(format!("ResultPath {p} must start with $")))?;
    let mut out = Vec::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                let mut seg = String::new();
                while let Some(&n) = chars.peek() {
                    if n == '.' || n == '[' {
                        break;
                    }
                    seg.push(n);
                    chars.next();
                }
                out.push(seg);
            }
            '[' => {
                let quote = chars.next();
                if !matches!(quote, Some('\'') | Some('"')) {
                    return Err(Failure::runtime(format!(
                        "ResultPath {p}: only named fields"
                    )));
                }
                let mut seg = String::new();
                for n in chars.by_ref() {
                    if Some(n) == quote {
                        break;
                    }
                    seg.push(n);
                }
                if chars.next() != Some(']') {
                    return Err(Failure::runtime(format!("ResultPath {p}: unclosed [")));
                }
                out.push(seg);
            }
            _ => {
                return Err(Failure::runtime(format!(
                    "ResultPath {p} is not a reference path"
                )));
            }
        }
    }
    if out.iter().any(String::is_empty) || out.is_empty() {
        return Err(Failure::runtime(format!(
            "ResultPath {p} has an empty segment"
        )));
    }
    Ok(out)
}

fn output(s: &Value, data: Value, context: &Value) -> Result<Value, Failure> {
    match s.get("OutputPath") {
        None => Ok(data),
        Some(Value::Null) => Ok(json!({})),
        Some(Value::String(p)) => get(p, &data, context),
        Some(other) => Err(Failure::runtime(format!(
            "OutputPath {other} is not a path"
        ))),
    }
}

/// Evaluate a Choice rule.
fn matches(rule: &Value, data: &Value, context: &Value) -> Result<bool, Failure> {
    if let Some(all) = rule["And"].as_array() {
        for r in all {
            if !matches(r, data, context)? {
                return Ok(false);
            }
        }
        return Ok(true);
    }
    if let Some(any) = rule["Or"].as_array() {
        for r in any {
            if matches(r, data, context)? {
                return Ok(true);
            }
        }
        return Ok(false);
    }
    if rule.get("Not").is_some() {
        return Ok(!matches(&rule["Not"], data, context)?);
    }
    let var = rule["Variable"]
        .as_str()
        .ok_or_else(|| Failure::runtime("a choice rule has no Variable"))?;
    let value = get(var, data, context).ok();
    let obj = rule.as_object().expect("a rule is an object");
    for (op, operand) in obj {
        if matches!(op.as_str(), "Variable" | "Next" | "Comment") {
            continue;
        }
        let (op, operand) = match op.strip_suffix("Path") {
            Some(base) if op != "IsPresent" && !op.starts_with("Is") => {
                (base, get(operand.as_str().unwrap_or("$"), data, context)?)
            }
            _ => (op.as_str(), operand.clone()),
        };
        let v = value.as_ref();
        let num = |x: &Value| x.as_f64();
        return Ok(match op {
            "IsPresent" => v.is_some() == operand.as_bool().unwrap_or(true),
            "IsNull" => v.is_some_and(Value::is_null) == operand.as_bool().unwrap_or(true),
            "IsString" => v.is_some_and(Value::is_string) == operand.as_bool().unwrap_or(true),
            "IsNumeric" => v.is_some_and(Value::is_number) == operand.as_bool().unwrap_or(true),
            "IsBoolean" => v.is_some_and(Value::is_boolean) == operand.as_bool().unwrap_or(true),
            "StringEquals" => v.and_then(Value::as_str).is_some() && v == Some(&operand),
            "BooleanEquals" => v.and_then(Value::as_bool).is_some() && v == Some(&operand),
            "NumericEquals" => v
                .and_then(num)
                .zip(num(&operand))
                .is_some_and(|(a, b)| a == b),
            "NumericLessThan" => v
                .and_then(num)
                .zip(num(&operand))
                .is_some_and(|(a, b)| a < b),
            "NumericGreaterThan" => v
                .and_then(num)
                .zip(num(&operand))
                .is_some_and(|(a, b)| a > b),
            "NumericLessThanEquals" => v
                .and_then(num)
                .zip(num(&operand))
                .is_some_and(|(a, b)| a <= b),
            "NumericGreaterThanEquals" => v
                .and_then(num)
                .zip(num(&operand))
                .is_some_and(|(a, b)| a >= b),
            other => {
                return Err(Failure::runtime(format!(
                    "choice operator {other} is not supported by the local runner"
                )));
            }
        });
    }
    Err(Failure::runtime(format!(
        "choice rule on {var} has no operator"
    )))
}

/// The failure a Fail state ends the execution with (Error/ErrorPath,
/// Cause/CausePath).
fn failure_of(s: &Value, input: &Value, context: &Value) -> Result<Failure, Failure> {
    let error = match s["ErrorPath"].as_str() {
        Some(p) => text(&get(p, input, context)?),
        None => s["Error"].as_str().unwrap_or("States.Fail").to_string(),
    };
    let cause = match s["CausePath"].as_str() {
        Some(p) => text(&get(p, input, context)?),
        None => s["Cause"].as_str().unwrap_or_default().to_string(),
    };
    Ok(Failure { error, cause })
}

/// The state a Choice state goes to: the first matching rule's Next, else
/// its Default; None when neither.
fn choose(s: &Value, input: &Value, context: &Value) -> Result<Option<String>, Failure> {
    for rule in s["Choices"].as_array().into_iter().flatten() {
        if matches(rule, input, context)? {
            return Ok(rule["Next"].as_str().map(str::to_string));
        }
    }
    Ok(s["Default"].as_str().map(str::to_string))
}

/// The first Catch of state `s` matching `f` goes to its Next with the
/// error placed by its ResultPath; no match fails the execution with `f`.
fn catch(s: &Value, raw_input: &Value, f: Failure) -> Result<(Option<String>, Value), Failure> {
    for c in s["Catch"].as_array().into_iter().flatten() {
        if error_matches(c, &f.error) {
            let caught = json!({ "Error": f.error, "Cause": f.cause });
            let merged = place(c, raw_input, caught)?;
            return Ok((c["Next"].as_str().map(str::to_string), merged));
        }
    }
    Err(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Task resources for tests: `echo` returns its input, `hello` greets,
    /// `flaky` fails with Sluice.Retryable until its countdown runs out,
    /// `slow` never answers in time, `emr` returns the AWS docs' sample.
    #[derive(Default)]
    struct Tasks {
        flaky_left: AtomicUsize,
        calls: Mutex<Vec<(String, Value)>>,
        running: AtomicUsize,
        max_running: AtomicUsize,
    }

    impl TaskInvoker for Tasks {
        fn invoke<'a>(
            &'a self,
            resource: &'a str,
            input: Value,
        ) -> Pin<Box<dyn Future<Output = Result<Value, Failure>> + Send + 'a>> {
            Box::pin(async move {
                self.calls
                    .lock()
                    .unwrap()
                    .push((resource.to_string(), input.clone()));
                match resource {
                    "echo" => Ok(input),
                    "hello" => Ok(json!(format!(
                        "Hello, {}!",
                        input["who"].as_str().unwrap_or("?")
                    ))),
                    "flaky" => {
                        if self.flaky_left.load(Ordering::SeqCst) > 0 {
                            self.flaky_left.fetch_sub(1, Ordering::SeqCst);
                            Err(Failure::new("Sluice.Retryable", "try again"))
                        } else {
                            Ok(json!("ok"))
                        }
                    }
                    "fatal" => Err(Failure::new("Sluice.Fatal", "broken")),
                    "arn:aws:states:::s3:getObject" => match input["Key"].as_str() {
                        Some("items.json") => Ok(json!([1, 2, 3])),
                        Some("odd.json") => Ok(json!([1, -1, 3])),
                        _ => Err(Failure::new("S3.NoSuchKey", "no such key")),
                    },
                    "square_positive" => {
                        let n = input["n"].as_i64().unwrap();
                        if n < 0 {
                            Err(Failure::new("Sluice.InvalidInput", "negative"))
                        } else {
                            Ok(json!(n * n))
                        }
                    }
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        Ok(json!(null))
                    }
                    "square" => {
                        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                        self.max_running.fetch_max(now, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        self.running.fetch_sub(1, Ordering::SeqCst);
                        let n = input["n"].as_i64().unwrap();
                        Ok(json!(n * n))
                    }
                    "emr" => Ok(json!({
                        "resourceType": "elasticmapreduce",
                        "resource": "createCluster.sync",
                        "output": {
                            "SdkHttpMetadata": {"HttpStatusCode": 200},
                            "ClusterId": "AKIAIOSFODNN7EXAMPLE"
                        }
                    })),
                    other => Err(Failure::new(
                        "States.TaskFailed",
                        format!("no resource {other}"),
                    )),
                }
            })
        }
    }

    fn recorder() -> (Sleeper, Arc<Mutex<Vec<f64>>>) {
        let slept = Arc::new(Mutex::new(Vec::new()));
        let s = slept.clone();
        let sleeper: Sleeper = Arc::new(move |d: Duration| {
            s.lock().unwrap().push(d.as_secs_f64());
            Box::pin(async {})
        });
        (sleeper, slept)
    }

    async fn exec(def: Value, input: Value, tasks: &Tasks) -> (Result<Value, Failure>, Vec<f64>) {
        let sm = StateMachine::parse(&def.to_string()).unwrap();
        let (sleeper, slept) = recorder();
        let out = sm.execute(input, tasks, &sleeper).await;
        let slept = slept.lock().unwrap().clone();
        (out, slept)
    }

    fn one(state: Value) -> Value {
        json!({ "StartAt": "S", "States": { "S": state } })
    }

    // The AWS documentation's InputPath / ResultPath examples.
    #[tokio::test]
    async fn input_path_and_result_path() {
        let tasks = Tasks::default();
        let input = json!({
            "comment": "This is a test of the input and output of a Task state.",
            "details": "Default example",
            "who": "AWS Step Functions"
        });
        let (out, _) = exec(
            one(json!({"Type": "Task", "Resource": "hello", "ResultPath": "$.taskresult", "End": true})),
            input.clone(),
            &tasks,
        )
        .await;
        let mut expected = input.clone();
        expected["taskresult"] = json!("Hello, AWS Step Functions!");
        assert_eq!(out.unwrap(), expected);

        let (out, _) = exec(
            one(json!({"Type": "Pass", "InputPath": "$.dataset2", "End": true})),
            json!({"comment": "Example for InputPath.", "dataset1": {"val1": 1}, "dataset2": {"val1": "a", "val2": "b"}}),
            &tasks,
        )
        .await;
        assert_eq!(out.unwrap(), json!({"val1": "a", "val2": "b"}));

        // ResultPath null keeps the input; OutputPath selects.
        let (out, _) = exec(
            one(json!({"Type": "Task", "Resource": "hello", "ResultPath": null, "OutputPath": "$.who", "End": true})),
            input,
            &tasks,
        )
        .await;
        assert_eq!(out.unwrap(), json!("AWS Step Functions"));
    }

    // The AWS documentation's ResultSelector example, plus Parameters.
    #[tokio::test]
    async fn parameters_and_result_selector() {
        let tasks = Tasks::default();
        let (out, _) = exec(
            one(json!({
                "Type": "Task", "Resource": "emr",
                "Parameters": {"static": 1, "nested": {"who.$": "$.who"}, "list": [1, 2]},
                "ResultSelector": {"ClusterId.$": "$.output.ClusterId", "ResourceType.$": "$.resourceType"},
                "ResultPath": "$.EMROutput",
                "End": true
            })),
            json!({"who": "me"}),
            &tasks,
        )
        .await;
        assert_eq!(
            out.unwrap(),
            json!({"who": "me", "EMROutput": {"ClusterId": "AKIAIOSFODNN7EXAMPLE", "ResourceType": "elasticmapreduce"}})
        );
        let calls = tasks.calls.lock().unwrap();
        assert_eq!(
            calls[0].1,
            json!({"static": 1, "nested": {"who": "me"}, "list": [1, 2]})
        );
    }

    // The AWS documentation's Choice example (And, Not, numeric, string).
    #[tokio::test]
    async fn choice_rules() {
        let def = json!({
            "StartAt": "C",
            "States": {
                "C": {
                    "Type": "Choice",
                    "Choices": [
                        {"Not": {"Variable": "$.type", "StringEquals": "Private"}, "Next": "Public"},
                        {"And": [
                            {"Variable": "$.value", "IsPresent": true},
                            {"Variable": "$.value", "NumericGreaterThanEquals": 20},
                            {"Variable": "$.value", "NumericLessThan": 30}
                        ], "Next": "ValueInTwenties"}
                    ],
                    "Default": "DefaultState"
                },
                "Public": {"Type": "Pass", "Result": "public", "End": true},
                "ValueInTwenties": {"Type": "Pass", "Result": "twenties", "End": true},
                "DefaultState": {"Type": "Fail", "Error": "DefaultStateError", "Cause": "No Matches!"}
            }
        });
        let tasks = Tasks::default();
        let run = |input: Value| exec(def.clone(), input, &tasks);
        assert_eq!(
            run(json!({"type": "Public"})).await.0.unwrap(),
            json!("public")
        );
        assert_eq!(
            run(json!({"type": "Private", "value": 25}))
                .await
                .0
                .unwrap(),
            json!("twenties")
        );
        let f = run(json!({"type": "Private", "value": 35}))
            .await
            .0
            .unwrap_err();
        assert_eq!(f, Failure::new("DefaultStateError", "No Matches!"));
        let f = run(json!({"type": "Private"})).await.0.unwrap_err();
        assert_eq!(f.error, "DefaultStateError");
    }

    #[tokio::test]
    async fn retry_backs_off_then_gives_up_or_succeeds() {
        let retry = json!([{"ErrorEquals": ["Sluice.Retryable"], "IntervalSeconds": 1, "MaxAttempts": 3, "BackoffRate": 2.0, "MaxDelaySeconds": 3}]);
        let def = one(json!({"Type": "Task", "Resource": "flaky", "Retry": retry, "End": true}));
        let tasks = Tasks {
            flaky_left: AtomicUsize::new(2),
            ..Tasks::default()
        };
        let (out, slept) = exec(def.clone(), json!({}), &tasks).await;
        assert_eq!(out.unwrap(), json!("ok"));
        assert_eq!(slept, vec![1.0, 2.0]);

        let tasks = Tasks {
            flaky_left: AtomicUsize::new(10),
            ..Tasks::default()
        };
        let (out, slept) = exec(def, json!({}), &tasks).await;
        assert_eq!(out.unwrap_err().error, "Sluice.Retryable");
        assert_eq!(
            slept,
            vec![1.0, 2.0, 3.0],
            "the third delay is capped by MaxDelaySeconds"
        );
        assert_eq!(
            tasks.calls.lock().unwrap().len(),
            4,
            "one call and three retries"
        );
    }

    #[tokio::test]
    async fn catch_routes_by_error_name_and_keeps_the_input() {
        let def = json!({
            "StartAt": "T",
            "States": {
                "T": {
                    "Type": "Task", "Resource": "fatal",
                    "Retry": [{"ErrorEquals": ["Sluice.Retryable"]}],
                    "Catch": [
                        {"ErrorEquals": ["Sluice.InvalidInput"], "Next": "Wrong"},
                        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Handled"}
                    ],
                    "End": true
                },
                "Wrong": {"Type": "Succeed"},
                "Handled": {"Type": "Fail", "ErrorPath": "$.error.Error", "CausePath": "$.error.Cause"}
            }
        });
        let tasks = Tasks::default();
        let (out, slept) = exec(def, json!({"keep": 1}), &tasks).await;
        assert_eq!(out.unwrap_err(), Failure::new("Sluice.Fatal", "broken"));
        assert!(slept.is_empty(), "a fatal error is not retried");
    }

    #[tokio::test]
    async fn task_timeout_is_states_timeout() {
        let def = json!({
            "StartAt": "T",
            "States": {
                "T": {"Type": "Task", "Resource": "slow", "TimeoutSeconds": 0.05,
                      "Catch": [{"ErrorEquals": ["States.Timeout"], "Next": "Late"}], "End": true},
                "Late": {"Type": "Pass", "Result": "timed out", "End": true}
            }
        });
        let (out, _) = exec(def, json!({}), &Tasks::default()).await;
        assert_eq!(out.unwrap(), json!("timed out"));
    }

    #[tokio::test]
    async fn map_runs_items_with_the_context_object_and_bounded_concurrency() {
        let def = one(json!({
            "Type": "Map",
            "ItemsPath": "$.items",
            "MaxConcurrency": 2,
            "ItemSelector": {"n.$": "$$.Map.Item.Value", "i.$": "$$.Map.Item.Index", "tag.$": "$.tag"},
            "ItemProcessor": {
                "ProcessorConfig": {"Mode": "INLINE"},
                "StartAt": "Sq",
                "States": {"Sq": {"Type": "Task", "Resource": "square", "End": true}}
            },
            "ResultPath": "$.squares",
            "End": true
        }));
        let tasks = Tasks::default();
        let (out, _) = exec(def, json!({"items": [1, 2, 3, 4, 5], "tag": "t"}), &tasks).await;
        assert_eq!(out.unwrap()["squares"], json!([1, 4, 9, 16, 25]));
        let max = tasks.max_running.load(Ordering::SeqCst);
        assert!((1..=2).contains(&max), "max concurrency {max}");
        let calls = tasks.calls.lock().unwrap();
        assert!(
            calls
                .iter()
                .any(|(_, i)| *i == json!({"n": 3, "i": 2, "tag": "t"}))
        );
    }

    fn distributed(key: &str) -> Value {
        one(json!({
            "Type": "Map",
            "ItemReader": {
                "Resource": "arn:aws:states:::s3:getObject",
                "ReaderConfig": {"InputType": "JSON"},
                "Parameters": {"Bucket.$": "$.bucket", "Key": key}
            },
            "ItemSelector": {"n.$": "$$.Map.Item.Value"},
            "ItemProcessor": {
                "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                "StartAt": "Sq",
                "States": {"Sq": {"Type": "Task", "Resource": "square_positive", "End": true}}
            },
            "MaxConcurrency": 1000,
            "ResultPath": "$.squares",
            "End": true
        }))
    }

    #[tokio::test]
    async fn distributed_map_reads_items_and_reports_failed_children_as_the_threshold_error() {
        let tasks = Tasks::default();
        let (out, _) = exec(distributed("items.json"), json!({"bucket": "b"}), &tasks).await;
        assert_eq!(out.unwrap()["squares"], json!([1, 4, 9]));
        assert!(tasks.calls.lock().unwrap().iter().any(|(r, i)| {
            r == "arn:aws:states:::s3:getObject"
                && *i == json!({"Bucket": "b", "Key": "items.json"})
        }));
        // A failed child: the Map fails with States.ExceedToleratedFailureThreshold
        // (as on AWS), the child's error only in the cause.
        let (out, _) = exec(
            distributed("odd.json"),
            json!({"bucket": "b"}),
            &Tasks::default(),
        )
        .await;
        let f = out.unwrap_err();
        assert_eq!(f.error, "States.ExceedToleratedFailureThreshold");
        assert!(f.cause.contains("Sluice.InvalidInput"), "{}", f.cause);
        // The reader failing: States.ItemReaderFailed.
        let (out, _) = exec(
            distributed("gone.json"),
            json!({"bucket": "b"}),
            &Tasks::default(),
        )
        .await;
        assert_eq!(out.unwrap_err().error, "States.ItemReaderFailed");
    }

    #[test]
    fn unsupported_definitions_are_refused_with_the_state_named() {
        let e = StateMachine::parse(
            &one(json!({"Type": "Parallel", "Branches": [], "End": true})).to_string(),
        )
        .unwrap_err();
        assert!(e.0.contains("state S") && e.0.contains("Parallel"), "{e}");
        let e = StateMachine::parse(
            &one(json!({"Type": "Task", "Resource": "x", "Credentials": {}, "End": true}))
                .to_string(),
        )
        .unwrap_err();
        assert!(e.0.contains("Credentials"), "{e}");
        let e = StateMachine::parse(
            &one(json!({"Type": "Map", "ItemProcessor": {"ProcessorConfig": {"Mode": "SIDEWAYS"}, "StartAt": "A", "States": {"A": {"Type": "Succeed"}}}, "End": true}))
                .to_string(),
        )
        .unwrap_err();
        assert!(e.0.contains("SIDEWAYS"), "{e}");
        let mut csv = distributed("x.csv");
        csv["States"]["S"]["ItemReader"]["ReaderConfig"] = json!({"InputType": "CSV"});
        let e = StateMachine::parse(&csv.to_string()).unwrap_err();
        assert!(e.0.contains("state S") && e.0.contains("JSON"), "{e}");
        let mut inline = distributed("x.json");
        inline["States"]["S"]["ItemProcessor"]["ProcessorConfig"] = json!({"Mode": "INLINE"});
        let e = StateMachine::parse(&inline.to_string()).unwrap_err();
        assert!(e.0.contains("DISTRIBUTED"), "{e}");
        let e = StateMachine::parse(&one(json!({"Type": "Pass", "Next": "Nowhere"})).to_string())
            .unwrap_err();
        assert!(e.0.contains("Next"), "{e}");
    }
}
