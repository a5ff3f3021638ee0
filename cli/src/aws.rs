//! The commands that act on a deployed pipeline through Step Functions:
//! `sluice refresh` (wake it as the trigger does, and follow the run) and
//! `sluice cancel`.

use super::*;

pub(crate) async fn refresh(
    path: &Path,
    state_machine_arn: &str,
    wait: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let ctx = open_registered(path).await?;
    wake_on_aws(&ctx, state_machine_arn, "sluice refresh", wait, json).await
}

/// Wake a registered pipeline through the lease protocol, as the trigger
/// function does, and optionally follow the execution.
pub(crate) async fn wake_on_aws(
    ctx: &Context,
    state_machine_arn: &str,
    requested_by: &str,
    wait: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use sluice_engine::triggers::{self, Event, StepFunctions, WakeOutcome};
    let name = ctx.pipeline.name.clone();
    let sfn = StepFunctions::from_env(state_machine_arn).await;
    let report = triggers::trigger(
        &Event::Manual {
            pipeline: name.clone(),
            requested_by: Some(requested_by.into()),
            // Standard: `--wait` follows the execution with
            // DescribeExecution, which Express executions do not answer.
            workflow: Some(sluice_engine::deploy::Workflow::Standard),
        },
        std::slice::from_ref(ctx),
        &sfn,
    )
    .await?;
    let (epoch, text, value) = match &report.woken[&name] {
        WakeOutcome::Held => {
            emit(
                json,
                format!(
                    "{name}: paused; the request is recorded and a run starts on `sluice resume`"
                ),
                serde_json::json!({"pipeline": name, "outcome": "held"}),
            );
            return Ok(ExitCode::SUCCESS);
        }
        WakeOutcome::Started {
            epoch, execution, ..
        } => (
            *epoch,
            format!("{name}: started {execution} (epoch {epoch})"),
            serde_json::json!({"pipeline": name, "outcome": "started", "epoch": epoch,
                "execution": execution}),
        ),
        WakeOutcome::Requested { epoch } => {
            let execution = sfn.execution_arn(&triggers::execution_name(&name, *epoch));
            (
                *epoch,
                format!(
                    "{name}: a run (epoch {epoch}, execution {execution}) is in progress; it will \
                     look for new input again before it finishes"
                ),
                serde_json::json!({"pipeline": name, "outcome": "requested", "epoch": epoch,
                    "execution": execution}),
            )
        }
    };
    if !wait {
        emit(json, text, value);
        return Ok(ExitCode::SUCCESS);
    }
    if !json {
        println!("{text}");
    }
    follow(ctx, &sfn, epoch, value, json).await
}

/// Wait for the execution of `epoch` to end, then report it and the
/// batches it committed (into `value` with `--json`); the command fails
/// unless the execution succeeded.
async fn follow(
    ctx: &Context,
    sfn: &sluice_engine::triggers::StepFunctions,
    epoch: u64,
    mut value: serde_json::Value,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use sluice_engine::triggers;
    let name = &ctx.pipeline.name;
    let end = sfn
        .wait(
            &triggers::execution_name(name, epoch),
            std::time::Duration::from_secs(1),
        )
        .await?;
    let committed = admin::run_commits(ctx, epoch).await?;
    if json {
        value["status"] = end.status.clone().into();
        value["error"] = serde_json::json!(end.error);
        value["cause"] = serde_json::json!(end.cause);
        value["batches"] = serde_json::to_value(&committed)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(if end.status == "SUCCEEDED" {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    // A Kinesis batch reads records of shards, not files.
    let kinesis = ctx.pipeline.source.discovery == sluice_engine::pipeline::DiscoveryMode::Kinesis;
    for c in &committed {
        let read = match c.stream.as_ref().filter(|_| kinesis) {
            Some(s) => format!("{} records", s.records()),
            None => format!("{} files", c.files),
        };
        println!(
            "  batch {}: {read}, {} rows in, {} rows out, {} output files",
            c.batch,
            c.rows_in,
            c.rows_out,
            c.outputs.len()
        );
    }
    println!(
        "{name}: execution {} ({} batches committed){}",
        end.status,
        committed.len(),
        match (&end.error, &end.cause) {
            (Some(e), Some(c)) => format!(": {e}: {c}"),
            (Some(e), None) => format!(": {e}"),
            _ => String::new(),
        }
    );
    Ok(if end.status == "SUCCEEDED" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub(crate) async fn cancel(
    path: &Path,
    state_machine_arn: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use sluice_engine::checkpoint::RunStatus;
    use sluice_engine::checkpoint::owner::Owner;
    use sluice_engine::triggers::{Executions, StepFunctions};
    let ctx = open_registered(path).await?;
    let name = &ctx.pipeline.name;
    let Some((c, _)) = ctx.checkpoint.control().await? else {
        emit(
            json,
            format!("{name}: never ran; nothing to cancel"),
            serde_json::json!({"pipeline": name, "cancelled": false}),
        );
        return Ok(ExitCode::SUCCESS);
    };
    if c.status != RunStatus::Running {
        emit(
            json,
            format!("{name}: no run in progress; nothing to cancel"),
            serde_json::json!({"pipeline": name, "cancelled": false}),
        );
        return Ok(ExitCode::SUCCESS);
    }
    let owner = Owner::parse(c.owner.as_deref().unwrap_or_default());
    if let Owner::Express {
        name: execution, ..
    } = &owner
    {
        // Express executions cannot be stopped (nor described): released,
        // the run can commit nothing more, and it ends within its limit.
        admin::release_cancelled(&ctx, c.epoch).await?;
        emit(
            json,
            format!(
                "{name}: released the lease of the Express execution {execution} (epoch {}); \
                 it can commit nothing more and ends within its 5 minutes; the next run \
                 resumes any planned batch",
                c.epoch
            ),
            serde_json::json!({"pipeline": name, "cancelled": true, "execution": execution,
                "epoch": c.epoch, "workflow": "express"}),
        );
        return Ok(ExitCode::SUCCESS);
    }
    let Some(execution) = owner.execution() else {
        anyhow::bail!(
            "{name}: the lease is held by {owner}, not by a Step Functions execution; stop that \
             process (a local run) and the next run takes over"
        );
    };
    let sfn = StepFunctions::from_env(state_machine_arn).await;
    sfn.stop(execution, "sluice cancel").await?;
    admin::release_cancelled(&ctx, c.epoch).await?;
    let arn = sfn.execution_arn(execution);
    emit(
        json,
        format!(
            "{name}: stopped {arn} and released its lease (epoch {}); the next run resumes any \
             planned batch, and the stopped run can commit nothing",
            c.epoch
        ),
        serde_json::json!({"pipeline": name, "cancelled": true, "execution": arn,
            "epoch": c.epoch}),
    );
    Ok(ExitCode::SUCCESS)
}
