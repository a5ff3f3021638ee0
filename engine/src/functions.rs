//! Glue for the Lambda function binaries in `functions/`: JSON logs, one
//! context per registered pipeline (built once per cold start and cached),
//! and errors reported to Step Functions under their class name, which the
//! state machine's Retry and Catch clauses match.

use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use serde::{Serialize, de::DeserializeOwned};

use crate::error::Error;
use crate::handlers::{CommitRequest, Context, Contexts, HandlerFuture, PlanRequest, TaskRequest};
use crate::storage::{Location, S3Config};

/// The environment variable naming where pipelines are registered.
pub(crate) const CHECKPOINT_ENV: &str = "SLUICE_CHECKPOINT_URI";

/// The environment variable naming the state machine the trigger starts.
pub(crate) const STATE_MACHINE_ENV: &str = "SLUICE_STATE_MACHINE_ARN";
/// The Express state machine's ARN (optional: without it every run is
/// Standard).
pub(crate) const EXPRESS_STATE_MACHINE_ENV: &str = "SLUICE_EXPRESS_STATE_MACHINE_ARN";

/// The Step Functions view of an engine error: its class name and message.
pub(crate) fn diagnostic(e: &Error) -> Diagnostic {
    Diagnostic {
        error_type: e.class().name().to_string(),
        error_message: e.to_string(),
    }
}

/// A request that names its pipeline.
pub trait PipelineRequest {
    /// The pipeline the request is for.
    fn pipeline(&self) -> &str;

    /// Whether this request starts a run's work in a new execution (its
    /// context is then checked against `pipeline.json` first).
    fn starts_execution(&self) -> bool {
        false
    }

    /// The run's lease epoch, if the request carries a run.
    fn epoch(&self) -> Option<u64> {
        None
    }

    /// The batch, if the request is for one.
    fn batch(&self) -> Option<u64> {
        None
    }

    /// The task (or merged state partition), if the request is for one.
    fn task(&self) -> Option<String> {
        None
    }
}

/// The span every log line of one invocation carries (JSON `span`):
/// pipeline, execution (`<pipeline>-<epoch>`), batch and task.
pub(crate) fn invocation_span(req: &dyn PipelineRequest) -> tracing::Span {
    let execution = req
        .epoch()
        .map(|e| crate::triggers::execution_name(req.pipeline(), e));
    tracing::info_span!(
        "invocation",
        pipeline = req.pipeline(),
        execution = execution.as_deref(),
        batch = req.batch(),
        task = req.task().as_deref(),
    )
}

impl PipelineRequest for PlanRequest {
    fn pipeline(&self) -> &str {
        &self.pipeline
    }

    fn epoch(&self) -> Option<u64> {
        self.run.as_ref().map(|r| r.epoch)
    }

    fn starts_execution(&self) -> bool {
        self.run.as_ref().is_none_or(|r| r.spec.is_empty())
    }
}

impl PipelineRequest for TaskRequest {
    fn pipeline(&self) -> &str {
        &self.pipeline
    }

    fn epoch(&self) -> Option<u64> {
        Some(self.run.epoch)
    }

    fn batch(&self) -> Option<u64> {
        Some(self.batch)
    }

    fn task(&self) -> Option<String> {
        Some(match (self.merge, self.dedup) {
            (Some(p), _) => format!("merge-{p}"),
            (_, Some(p)) => format!("dedup-{p}"),
            _ => self.task.to_string(),
        })
    }
}

impl PipelineRequest for CommitRequest {
    fn pipeline(&self) -> &str {
        &self.pipeline
    }

    fn epoch(&self) -> Option<u64> {
        Some(self.run.epoch)
    }

    fn batch(&self) -> Option<u64> {
        Some(self.batch)
    }
}

/// The contexts of the pipelines registered under `SLUICE_CHECKPOINT_URI`;
/// fails with a message naming the variable when it is missing or
/// malformed.
pub(crate) async fn contexts_from_env() -> std::result::Result<Contexts, String> {
    let uri = std::env::var(CHECKPOINT_ENV).map_err(|_| {
        format!(
            "{CHECKPOINT_ENV} is not set: set it to the checkpoint location where pipelines \
             are registered (s3://bucket/prefix/)"
        )
    })?;
    let root = Location::parse(&uri, std::path::Path::new("/"))
        .map_err(|e| format!("{CHECKPOINT_ENV}: {e}"))?;
    let s3 = match root {
        Location::S3 { .. } => Some(S3Config::from_env().await),
        Location::Local(_) | Location::Kafka { .. } | Location::Kinesis { .. } => None,
    };
    Ok(Contexts::new(root, s3))
}

/// JSON logs, filtered by `RUST_LOG` (default `info`).
pub(crate) fn init_tracing() {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_current_span(true)
        .with_span_list(false)
        .without_time()
        .init();
}

/// Run one request through `handler` for the pipeline it names.
pub(crate) async fn handle<Req, Resp>(
    contexts: &Contexts,
    req: Req,
    handler: impl for<'a> Fn(&'a Context, Req) -> HandlerFuture<'a, Resp>,
) -> std::result::Result<Resp, Diagnostic>
where
    Req: PipelineRequest + Clone + Send + Sync,
{
    use tracing::Instrument;
    let pipeline = req.pipeline().to_string();
    let span = invocation_span(&req);
    contexts
        .dispatch(&pipeline, req.starts_execution(), |ctx| {
            handler(ctx, req.clone())
        })
        .instrument(span)
        .await
        .map_err(|e| {
            tracing::warn!(%pipeline, class = %e.class(), error = %e, "handler failed");
            diagnostic(&e)
        })
}

/// A function binary's whole `main`: logs, contexts from the environment
/// (failing fast with a clear message), then the Lambda runtime loop.
pub async fn serve<Req, Resp, H>(handler: H) -> std::result::Result<(), lambda_runtime::Error>
where
    Req: PipelineRequest + Clone + DeserializeOwned + Send + Sync + 'static,
    Resp: Serialize + Send + 'static,
    H: for<'a> Fn(&'a Context, Req) -> HandlerFuture<'a, Resp> + Copy + Send + Sync + 'static,
{
    init_tracing();
    let contexts = std::sync::Arc::new(contexts_from_env().await?);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Req>| {
        let contexts = contexts.clone();
        handle_owned(contexts, event.payload, handler)
    }))
    .await
}

/// The trigger function's whole `main`: logs, contexts and the state
/// machine from the environment, then the Lambda runtime loop over
/// [`crate::triggers::trigger`].
pub async fn serve_trigger() -> std::result::Result<(), lambda_runtime::Error> {
    init_tracing();
    let contexts = std::sync::Arc::new(contexts_from_env().await?);
    let arn = std::env::var(STATE_MACHINE_ENV).map_err(|_| {
        format!("{STATE_MACHINE_ENV} is not set: set it to the ARN of the Sluice state machine")
    })?;
    let sfn = std::sync::Arc::new(
        crate::triggers::StepFunctions::from_env(arn)
            .await
            .with_express(std::env::var(EXPRESS_STATE_MACHINE_ENV).ok()),
    );
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let contexts = contexts.clone();
        let sfn = sfn.clone();
        async move { trigger_event(&contexts, sfn.as_ref(), &event.payload).await }
    }))
    .await
}

/// One trigger invocation: parse, route to the registered pipelines, wake.
pub(crate) async fn trigger_event(
    contexts: &Contexts,
    executions: &dyn crate::triggers::Executions,
    payload: &serde_json::Value,
) -> std::result::Result<crate::triggers::TriggerReport, Diagnostic> {
    let run = async {
        let bytes = serde_json::to_vec(payload).expect("a JSON value serialises");
        let event = crate::triggers::parse_event(&bytes)?;
        let registered = contexts.registered().await?;
        let carried = contexts.take_requests();
        crate::triggers::trigger_carrying(&event, &registered, executions, carried).await
    };
    crate::handlers::usage::timed(0, run).await.map_err(|e| {
        tracing::warn!(class = %e.class(), error = %e, "trigger failed");
        diagnostic(&e)
    })
}

async fn handle_owned<Req, Resp, H>(
    contexts: std::sync::Arc<Contexts>,
    req: Req,
    handler: H,
) -> std::result::Result<Resp, Diagnostic>
where
    Req: PipelineRequest + Clone + Send + Sync,
    H: for<'a> Fn(&'a Context, Req) -> HandlerFuture<'a, Resp>,
{
    handle(&contexts, req, handler).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log line inside an invocation carries its pipeline, execution,
    /// batch and task as JSON fields (the subscriber the functions use,
    /// writing to a buffer).
    #[test]
    fn logs_carry_pipeline_execution_batch_and_task() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        let req = TaskRequest {
            retries: 0,
            pipeline: "taxi".into(),
            run: crate::handlers::RunState {
                pipeline: "taxi".into(),
                epoch: 7,
                discovered: true,
                batches: 1,
                trigger: None,
                spec: String::new(),
                ..Default::default()
            },
            batch: 3,
            task: 2,
            merge: None,
            dedup: None,
            carry: false,
        };
        tracing::subscriber::with_default(subscriber, || {
            let _in = invocation_span(&req).entered();
            tracing::info!(rows = 5, "task done");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let span = &line["span"];
        assert_eq!(span["pipeline"], "taxi", "{line}");
        assert_eq!(span["execution"], "taxi-7", "{line}");
        assert_eq!(span["batch"], 3, "{line}");
        assert_eq!(span["task"], "2", "{line}");
        assert_eq!(line["fields"]["message"], "task done", "{line}");
    }
    use crate::handlers::{PlanOutcome, handle_plan};
    use crate::pipeline::Pipeline;

    #[tokio::test(flavor = "multi_thread")]
    async fn registered_pipelines_are_served_and_errors_carry_their_class() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("input")).unwrap();
        std::fs::write(root.join("input/a.csv"), "fare_amount\n1.5\n2.5\n").unwrap();
        let toml = "name = \"fn\"\n[source]\nuri = \"input\"\nformat = \"csv\"\ntable = \"t\"\n\
                    [query]\nsql = \"SELECT fare_amount FROM t\"\n[sink]\nuri = \"out/sink\"\n\
                    [checkpoint]\nuri = \"out/cp\"\n";
        let p = Pipeline::parse(toml, "fn.toml", root).unwrap();
        let contexts = Contexts::new(Location::Local(root.join("out/cp")), None);

        // Not registered yet: a clear InvalidInput diagnostic.
        let req = || PlanRequest {
            retries: 0,
            pipeline: "fn".into(),
            run: None,
            workflow: Default::default(),
            started: None,
            execution: None,
            copy: None,
        };
        let d = handle(&contexts, req(), handle_plan).await.unwrap_err();
        assert_eq!(d.error_type, "Sluice.InvalidInput");
        assert!(
            d.error_message.contains("sluice register"),
            "{}",
            d.error_message
        );

        crate::admin::register(&Context::open(p, None).unwrap())
            .await
            .unwrap();
        let out = handle(&contexts, req(), handle_plan).await.unwrap();
        assert!(matches!(out, PlanOutcome::Batch { .. }), "{out:?}");
        let busy = handle(&contexts, req(), handle_plan).await.unwrap();
        assert!(matches!(busy, PlanOutcome::Busy { .. }), "{busy:?}");
    }
}
