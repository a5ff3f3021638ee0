//! `sluice bench-planning`: what it costs to plan a batch of a few new files
//! as history grows, per discovery mode. The history (processed source
//! files and the checkpoint records a run leaves) is built in memory with
//! the engine's own record types; the measured step is the engine's real
//! Plan step of a triggered run (what the planner Lambda does), with
//! requests counted as S3 would bill them (a listing page per 1,000 keys);
//! and, for comparison, `sluice run`'s first Plan in a fresh process (it
//! checks for new input before it claims the lease, and reads the pinned
//! schema).
//! Prints the figures measured in this one run; nothing here is a
//! pass/fail test, but a plan that does not hold exactly the new files
//! stops the benchmark.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use clap::Args;
use sluice_engine::checkpoint::{
    Control, FORMAT_VERSION, Index, IndexKeep, KeyClaim, PipelineRecord, RunStatus,
};
use sluice_engine::handlers::{self, Context, PlanOutcome, RunState};
use sluice_engine::paths::checkpoint as ck;
use sluice_engine::pipeline::{DiscoveryMode, Pipeline};
use sluice_engine::storage::{MemoryStore, PutMode, RequestCounts, Store};
use sluice_engine::triggers::{self, ExecutionState, Executions, Started, WakeOutcome};

/// Options of `sluice bench-planning`.
#[derive(Args)]
pub struct PlanningArgs {
    /// Processed files in the largest history (the smaller one is a tenth).
    #[arg(long, default_value_t = 1_000_000)]
    history: u64,
    /// New files waiting.
    #[arg(long, default_value_t = 10)]
    new: u64,
}

fn pipeline(mode: DiscoveryMode) -> anyhow::Result<Pipeline> {
    let toml = format!(
        r#"name = "plan-{mode}"
[source]
uri = "input"
format = "csv"
table = "t"
discovery = "{mode}"
schema = [{{ name = "x", type = "Int64" }}]
[query]
sql = "SELECT x FROM t"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
"#,
        mode = mode.name()
    );
    Ok(Pipeline::parse(&toml, "bench.toml", &std::env::temp_dir())?)
}

/// Source keys sort by arrival (`ordered` needs that; the others do not care).
fn key(i: u64) -> String {
    format!("2026/11/30/part-{i:09}.csv")
}

/// Starts nothing: the benchmark runs the Plan step itself.
struct Noop;

#[async_trait::async_trait]
impl Executions for Noop {
    async fn start(
        &self,
        name: &str,
        _input: &serde_json::Value,
        _workflow: sluice_engine::deploy::Workflow,
    ) -> sluice_engine::Result<Started> {
        Ok(Started {
            execution: name.to_string(),
            new: true,
        })
    }
    async fn state(&self, _name: &str) -> sluice_engine::Result<ExecutionState> {
        Ok(ExecutionState::Running)
    }
    async fn stop(&self, _name: &str, _cause: &str) -> sluice_engine::Result<()> {
        Ok(())
    }
}

/// One measurement.
struct Row {
    mode: DiscoveryMode,
    history: u64,
    trigger: RequestCounts,
    plan: RequestCounts,
    plan_ms: f64,
    cold: RequestCounts,
}

/// Build a pipeline whose first `history` files were committed in batches
/// of 1,000 and whose next `new` files wait, as `mode` records them.
async fn build(mode: DiscoveryMode, history: u64, new: u64, warm: bool) -> anyhow::Result<Context> {
    let p = pipeline(mode)?;
    let source = MemoryStore::new();
    let checkpoint = MemoryStore::new();
    let one = Bytes::from_static(b"1\n");
    for i in 0..history + new {
        source.put(&key(i), one.clone(), PutMode::Overwrite).await?;
    }
    let processed: Vec<String> = (0..history).map(key).collect();
    let batches = history.div_ceil(1000);
    let mut control = Control::new(p.spec_hash());
    control.status = RunStatus::Idle;
    control.epoch = batches;
    control.last_committed = batches.checked_sub(1);
    let ctx = Context::new(
        p.clone(),
        Arc::new(source),
        Arc::new(MemoryStore::new()),
        Arc::new(checkpoint.clone()),
    );
    match mode {
        DiscoveryMode::List | DiscoveryMode::Ordered => {
            let keep = if mode == DiscoveryMode::Ordered {
                IndexKeep::Recent(p.source.lookback)
            } else {
                IndexKeep::Every
            };
            let index = Index::default().apply(control.epoch, &processed, keep);
            control.listing = index.listing();
            ctx.checkpoint.swap_index(0, &index, None).await?;
        }
        DiscoveryMode::Manifests
        | DiscoveryMode::Kafka
        | DiscoveryMode::Kinesis
        | DiscoveryMode::Delta => {
            anyhow::bail!("the planning benchmark covers list, ordered and notify discovery")
        }
        DiscoveryMode::Notify => {
            control.reconciled_epoch = Some(control.epoch);
            for (i, k) in processed.iter().enumerate() {
                let claim = KeyClaim {
                    epoch: i as u64 / 1000 + 1,
                    committed: true,
                    batch: Some(i as u64 / 1000),
                };
                checkpoint
                    .put(
                        &ck::claim(0, k),
                        serde_json::to_vec(&claim)?.into(),
                        PutMode::Overwrite,
                    )
                    .await?;
            }
            let waiting: Vec<(String, u64)> =
                (history..history + new).map(|i| (key(i), 2)).collect();
            sluice_engine::discovery::record_notified(ctx.checkpoint.store(), waiting).await?;
        }
    }
    ctx.checkpoint
        .put_pipeline_record(&PipelineRecord {
            format_version: FORMAT_VERSION,
            spec_hash: p.spec_hash(),
            pipeline: p.clone(),
            schema: p.source.schema.clone().unwrap_or_default(),
            first_batch: 0,
        })
        .await?;
    ctx.checkpoint.swap_control(&control, None).await?;
    if warm {
        // As the planner Lambda does at a cold start (`Contexts::registered`).
        ctx.pin_schema(ctx.schema().await?);
    }
    Ok(ctx)
}

async fn measure(mode: DiscoveryMode, history: u64, new: u64) -> anyhow::Result<Row> {
    let ctx = build(mode, history, new, true).await?;
    let name = ctx.pipeline.name.clone();
    let c0 = ctx.counts();
    let woken = triggers::wake(
        &ctx.checkpoint,
        &name,
        &ctx.pipeline.spec_hash(),
        chrono::Utc::now().timestamp_millis(),
        900_000,
        &Noop,
        "bench",
        sluice_engine::deploy::Workflow::Standard,
        &|_, _| {},
    )
    .await?;
    let WakeOutcome::Started { epoch, .. } = woken else {
        anyhow::bail!("{name}: the trigger did not start a run: {woken:?}");
    };
    let c1 = ctx.counts();
    let run = RunState {
        pipeline: name.clone(),
        epoch,
        trigger: Some("bench".into()),
        spec: String::new(),
        ..Default::default()
    };
    let started = Instant::now();
    let outcome = handlers::plan(&ctx, Some(run)).await?;
    let plan_ms = started.elapsed().as_secs_f64() * 1000.0;
    let c2 = ctx.counts();
    let PlanOutcome::Batch { batch, .. } = outcome else {
        anyhow::bail!("{name}: expected a batch, got {outcome:?}");
    };
    let off = ctx
        .checkpoint
        .offsets(batch.batch)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{name}: no plan written"))?;
    let planned: Vec<String> = off.inputs.iter().map(|f| f.key.clone()).collect();
    let expected: Vec<String> = (history..history + new).map(key).collect();
    let mut sorted = planned.clone();
    sorted.sort();
    anyhow::ensure!(
        sorted == expected,
        "{name}: planned {} files, not exactly the {new} new ones",
        planned.len()
    );
    drop(ctx);
    // `sluice run` in a fresh process over the same history.
    let cold = build(mode, history, new, false).await?;
    let before = cold.counts();
    let outcome = handlers::plan(&cold, None).await?;
    anyhow::ensure!(
        matches!(&outcome, PlanOutcome::Batch { batch, .. } if batch.files == new),
        "{name}: sluice run planned {outcome:?}"
    );
    Ok(Row {
        mode,
        history,
        trigger: c1.since(&c0),
        plan: c2.since(&c1),
        plan_ms,
        cold: cold.counts().since(&before),
    })
}

/// Run the benchmark and print its table.
pub async fn run(args: PlanningArgs) -> anyhow::Result<()> {
    let small = (args.history / 10).max(1);
    println!(
        "Planning {} new files after {small} and {} processed files (in-memory stores; \
         requests counted as S3 bills them, 1,000 keys a listing page)",
        args.new, args.history
    );
    println!(
        "{:<8} {:>10} {:>9} {:>6} {:>6} {:>8} {:>10} {:>14} {:>16}",
        "mode",
        "history",
        "list/get",
        "GET",
        "LIST",
        "writes",
        "plan ms",
        "trigger reqs",
        "sluice run l/g"
    );
    let mut rows = Vec::new();
    for mode in [
        DiscoveryMode::List,
        DiscoveryMode::Ordered,
        DiscoveryMode::Notify,
    ] {
        for history in [small, args.history] {
            let r = measure(mode, history, args.new).await?;
            println!(
                "{:<8} {:>10} {:>9} {:>6} {:>6} {:>8} {:>10.1} {:>14} {:>16}",
                r.mode.name(),
                r.history,
                r.plan.get + r.plan.list,
                r.plan.get,
                r.plan.list,
                r.plan.writes(),
                r.plan_ms,
                r.trigger.total(),
                r.cold.get + r.cold.list,
            );
            rows.push(r);
        }
    }
    println!();
    for pair in rows.chunks(2) {
        let (a, b) = (&pair[0], &pair[1]);
        println!(
            "{:<8} history x{:.0}: list/get requests {} -> {}, plan time x{:.1}",
            a.mode.name(),
            b.history as f64 / a.history as f64,
            a.plan.get + a.plan.list,
            b.plan.get + b.plan.list,
            b.plan_ms / a.plan_ms.max(0.001)
        );
    }
    Ok(())
}
