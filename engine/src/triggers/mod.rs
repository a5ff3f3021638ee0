//! Triggers: every way a run starts ends here. An S3 notification (direct,
//! or through SNS), an EventBridge schedule or S3 "Object Created" event, a
//! Kafka event source mapping's records (a wake-up only), or a manual
//! refresh is parsed ([`parse_event`]), routed to the registered
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

mod events;
mod route;
mod sfn;
mod wake;

pub use events::{Event, ManualRefresh, ObjectRef, Via, decode_key, parse_event};
pub(crate) use route::input_key;
pub use route::{Routing, route};
pub use sfn::{ExecutionEnd, StepFunctions};
pub use wake::{
    Charge, ExecutionState, Executions, Started, Wake, WakeOutcome, decide_wake, execution_input,
    execution_name, wake,
};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::handlers::Context;
use crate::pipeline::Pipeline;
use crate::storage::RequestCounts;

/// Notify mode: record the objects of `event` that are input files of the
/// pipeline in its inbox (the size is 0 when the notification gave none).
async fn record_inbox(ctx: &Context, event: &Event) -> Result<()> {
    let p = &ctx.pipeline;
    let Event::Objects { objects, .. } = event else {
        return Ok(());
    };
    if !crate::discovery::Source::of(p).keeps_inbox() {
        return Ok(());
    }
    let files: Vec<(String, u64)> = objects
        .iter()
        .filter_map(|o| input_key(p, o).map(|k| (k.to_string(), o.size.unwrap_or(0))))
        .collect();
    crate::discovery::record_notified(ctx.checkpoint.store(), files).await
}

/// Record in control `c` what waking one pipeline used: the trigger's
/// time on it (for the invocation's `first_pipeline`, the whole invocation
/// so far) and its requests, with the control write itself (`created`: a
/// new record).
fn charge_wake(
    c: &mut crate::checkpoint::Control,
    created: bool,
    ctx: &Context,
    first_pipeline: bool,
    started: std::time::Instant,
) {
    use crate::deploy::{TRIGGER, memory_mb};
    use crate::handlers::usage::{billed_ms, invocation_ms};
    let first = u64::from(first_pipeline);
    let ms = if first_pipeline {
        invocation_ms().max(billed_ms(started))
    } else {
        billed_ms(started)
    };
    let mut requests = ctx.counts();
    if created {
        requests.put_create += 1;
    } else {
        requests.put_update += 1;
    }
    let usage = crate::checkpoint::Usage {
        functions: vec![crate::checkpoint::FunctionUsage::new(
            TRIGGER,
            first,
            ms,
            memory_mb(TRIGGER),
        )],
        ..Default::default()
    };
    c.totals.wakes = c.totals.wakes.plus(&usage);
    c.totals.wake_requests = c.totals.wake_requests.plus(&requests);
}

/// What one trigger invocation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerReport {
    /// The event's source (`s3`, `sns`, `eventbridge-s3`, `schedule`,
    /// `msk`, `kafka`, `manual`).
    pub source: String,
    /// Created objects the event carried (a Kafka mapping's event: its
    /// records).
    pub objects: u64,
    /// Records that were not object creations (test events, removals).
    pub skipped: u64,
    /// Objects outside every registered source, or with path tricks;
    /// records of topics no registered pipeline reads.
    pub ignored: u64,
    /// What happened to each pipeline the event concerns.
    pub woken: BTreeMap<String, WakeOutcome>,
}

/// The report of `event` before any pipeline is woken; `ignored` objects
/// were outside every registered source.
fn report_of(event: &Event, ignored: u64) -> TriggerReport {
    let (objects, skipped) = match event {
        Event::Objects {
            objects, skipped, ..
        } => (objects.len() as u64, *skipped),
        Event::Records { topics, .. } => (topics.values().sum(), 0),
        Event::Streams { streams } => (streams.values().sum(), 0),
        _ => (0, 0),
    };
    TriggerReport {
        source: event.source().to_string(),
        objects,
        skipped,
        ignored,
        woken: BTreeMap::new(),
    }
}

/// Route `event` to the `registered` pipelines and wake each. A pipeline
/// whose wake fails does not stop the others; the first error is returned
/// after all were tried, so the event is retried (waking is idempotent).
pub async fn trigger(
    event: &Event,
    registered: &[Context],
    executions: &dyn Executions,
) -> Result<TriggerReport> {
    trigger_carrying(event, registered, executions, RequestCounts::default()).await
}

/// [`trigger`], after `carried` requests of the same invocation (listing
/// the registry): the first pipeline it wakes records them with the
/// invocation itself; each pipeline records its own requests and the time
/// spent on it, in the control write that wakes it.
pub(crate) async fn trigger_carrying(
    event: &Event,
    registered: &[Context],
    executions: &dyn Executions,
    carried: RequestCounts,
) -> Result<TriggerReport> {
    let pipelines: Vec<Pipeline> = registered.iter().map(|c| (*c.pipeline).clone()).collect();
    let routing = route(event, &pipelines)?;
    let mut report = report_of(event, routing.ignored);
    let mut first_error = None;
    for (i, name) in routing.pipelines.keys().enumerate() {
        let started = std::time::Instant::now();
        let ctx = registered
            .iter()
            .find(|c| c.pipeline.name == *name)
            .expect("routed to a registered pipeline");
        let ctx = &if i == 0 {
            ctx.counted_with(carried)
        } else {
            ctx.counted()
        };
        let charge = |c: &mut crate::checkpoint::Control, created: bool| {
            charge_wake(c, created, ctx, i == 0, started)
        };
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
            event.workflow(),
            &charge,
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
