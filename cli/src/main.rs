//! The `sluice` command: run a pipeline locally (or against S3), inspect
//! it, generate sample data, benchmark.

mod bench;
mod bench_planning;
mod bench_window;
mod cost;
mod progress;
mod text;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use sluice_engine::admin;
use sluice_engine::handlers::Context;
use sluice_engine::pipeline::{Compression, Pipeline, SourceFormat};
use sluice_engine::runner::{self, RunEnd};
use sluice_engine::storage::{Location, S3Config};
use text::{count, duration_ms, duration_s, noun};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Continuous SQL over files landing in S3, with nothing running while idle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print the result (or the error: class, message, exit code) as JSON on stdout.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Process everything that arrived since the last checkpoint, in batches, then stop.
    Run {
        /// The pipeline file.
        pipeline: PathBuf,
        /// Notify mode: list the source now to find files whose notification was lost (otherwise every `source.reconcile_every` runs).
        #[arg(long)]
        reconcile: bool,
    },
    /// Register a pipeline: pin its schema, check its SQL, write pipeline.json (what the Lambda functions read).
    Register {
        /// The pipeline file.
        pipeline: PathBuf,
    },
    /// Run every check a run makes before it writes anything, without writing: exits 4 on a problem, and says what it could not check yet and why.
    Check {
        /// The pipeline file.
        pipeline: PathBuf,
    },
    /// Start a run on AWS now: claim the lease and start the Step Functions execution `<pipeline>-<epoch>` (or, while a run is going, ask it to look again).
    Refresh {
        /// The pipeline file (registered with `sluice register`).
        pipeline: PathBuf,
        /// The Sluice state machine (the stack output StateMachineArn).
        #[arg(long, env = "SLUICE_STATE_MACHINE_ARN")]
        state_machine_arn: String,
        /// Poll until the execution ends, then print the batches it committed.
        #[arg(long)]
        wait: bool,
    },
    /// Read quarantined input files again (after fixing or replacing them): the next run takes them once.
    RetryQuarantined {
        /// The pipeline file.
        pipeline: PathBuf,
        /// Only this source key (default: every quarantined file).
        #[arg(long)]
        key: Option<String>,
    },
    /// Pause a pipeline: triggers record requests but start no run (a run in progress finishes).
    Pause {
        /// The pipeline file.
        pipeline: PathBuf,
    },
    /// Resume a paused pipeline; with --state-machine-arn, start the run requested while paused.
    Resume {
        /// The pipeline file.
        pipeline: PathBuf,
        /// The Sluice state machine.
        #[arg(long, env = "SLUICE_STATE_MACHINE_ARN")]
        state_machine_arn: Option<String>,
    },
    /// Stop the running execution and release its lease; the next run resumes its batch.
    Cancel {
        /// The pipeline file.
        pipeline: PathBuf,
        /// The Sluice state machine.
        #[arg(long, env = "SLUICE_STATE_MACHINE_ARN")]
        state_machine_arn: String,
    },
    /// Start over: delete the pipeline's output (parts, manifests) and its checkpoint, so the next run reads every source file again.
    Reset {
        /// The pipeline file.
        pipeline: PathBuf,
        /// Confirm: the sink's Sluice output and the checkpoint are deleted.
        #[arg(long)]
        yes: bool,
    },
    /// List committed batches, newest first: files, rows, duration and what started the run.
    History {
        /// The pipeline file.
        pipeline: PathBuf,
        /// How many batches at most.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// What the last batches cost on AWS (Lambda, Step Functions, S3), per batch and per run, the month at an arrival rate, and the always-on Spark job it replaces.
    Cost {
        /// The pipeline file.
        pipeline: PathBuf,
        /// How many batches, newest first.
        #[arg(long, default_value_t = 100)]
        last: usize,
        /// Only batches committed within this long before now (e.g. "7 days").
        #[arg(long)]
        since: Option<String>,
        /// A price table (default: us-east-1 list prices, engine/prices/us-east-1.toml).
        #[arg(long)]
        prices: Option<PathBuf>,
        /// Project the month at one run every DURATION (e.g. "5 minutes") instead of the observed rate.
        #[arg(long)]
        every: Option<String>,
    },
    /// Show the last committed batch, totals and what is waiting.
    Show {
        /// The pipeline file.
        pipeline: PathBuf,
    },
    /// Generate deterministic sample input.
    Gen {
        /// What to generate.
        #[arg(value_enum)]
        dataset: Dataset,
        /// Number of files.
        #[arg(long, default_value_t = 4)]
        files: u64,
        /// Rows per file.
        #[arg(long, default_value_t = 1000)]
        rows: usize,
        /// File format.
        #[arg(long, value_enum, default_value_t = Format::Parquet)]
        format: Format,
        /// Whole-file compression (csv and jsonl).
        #[arg(long, value_enum)]
        compression: Option<Comp>,
        /// Output folder; numbering continues after the files already there.
        #[arg(long)]
        out: PathBuf,
    },
    /// Measure a run against raw DataFusion on the same files, an idle run, and a small incremental run.
    Bench(bench::BenchArgs),
    /// Benchmark: storage requests and time to plan a few new files as the history of processed files grows, per discovery mode (in-memory stores).
    BenchPlanning(bench_planning::PlanningArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Dataset {
    /// NYC-yellow-taxi-like trips.
    Taxi,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Parquet,
    Csv,
    Jsonl,
}

#[derive(Clone, Copy, ValueEnum)]
enum Comp {
    Gzip,
    Zstd,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal, and never under NO_COLOR (no-color.org).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    let json = cli.json;
    match rt.block_on(dispatch(cli.command, json)) {
        Ok(code) => code,
        Err(e) => {
            let class = e
                .downcast_ref::<sluice_engine::Error>()
                .map(sluice_engine::Error::class);
            let code = if e.downcast_ref::<Usage>().is_some() {
                exit::USAGE
            } else {
                exit::of_error(class)
            };
            if json {
                // Scripts read the failure where they read the result.
                println!(
                    "{}",
                    serde_json::json!({"error": {
                        "class": class.map(|c| c.name()),
                        "message": format!("{e:#}"),
                        "exit_code": code,
                    }})
                );
            }
            eprintln!(
                "error{}: {e:#}",
                class.map(|c| format!(" [{c}]")).unwrap_or_default()
            );
            ExitCode::from(code)
        }
    }
}

/// clap's own refusal of a command line (or its --help and --version):
/// with `--json` anywhere on the line, the error object goes to stdout
/// as every other error's does.
fn usage_error(e: clap::Error) -> ExitCode {
    let code = e.exit_code();
    if code != 0 && std::env::args_os().any(|a| a == "--json") {
        println!(
            "{}",
            serde_json::json!({"error": {
                "class": null,
                "message": e.to_string().trim().trim_start_matches("error: "),
                "exit_code": exit::USAGE,
            }})
        );
    }
    let _ = e.print();
    ExitCode::from(u8::try_from(code).unwrap_or(exit::USAGE))
}

/// A command line that is wrong in a way clap does not see (reset without
/// --yes, --last 0): exit code 2, as clap's own.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// The exit codes of `sluice` (README: "Exit codes").
mod exit {
    use sluice_engine::ErrorClass;

    /// Done: batches committed, or nothing new to do, or another run holds
    /// the lease and does the work.
    pub const SUCCESS: u8 = 0;
    /// A failure that running again will not fix by itself
    /// (`Sluice.Fatal`): read the message.
    pub const FATAL: u8 = 1;
    /// The command line is wrong (clap's code, and [`super::Usage`]).
    pub const USAGE: u8 = 2;
    /// The pipeline is paused: nothing started; the request is recorded
    /// and `sluice resume` starts it.
    pub const PAUSED: u8 = 3;
    /// Bad input or a bad pipeline file (`Sluice.InvalidInput`): fix what
    /// the message names, then run again.
    pub const BAD_INPUT: u8 = 4;
    /// A passing failure, or another run changed the pipeline meanwhile
    /// (`Sluice.Retryable`, `Sluice.Conflict`): run again.
    pub const RETRY: u8 = 5;

    /// The code for an error of `class` (an error of no class: fatal).
    pub fn of_error(class: Option<ErrorClass>) -> u8 {
        match class {
            Some(ErrorClass::InvalidInput) => BAD_INPUT,
            Some(ErrorClass::Retryable | ErrorClass::Conflict) => RETRY,
            Some(ErrorClass::Fatal) | None => FATAL,
        }
    }
}

async fn dispatch(command: Command, json: bool) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run {
            pipeline,
            reconcile,
        } => run(&pipeline, json, reconcile).await,
        Command::Show { pipeline } => show(&pipeline, json).await,
        Command::Refresh {
            pipeline,
            state_machine_arn,
            wait,
        } => refresh(&pipeline, &state_machine_arn, wait, json).await,
        Command::Pause { pipeline } => pause(&pipeline, json).await,
        Command::RetryQuarantined { pipeline, key } => {
            let ctx = open(&pipeline).await?;
            let keys = admin::retry_quarantined(&ctx, key.as_deref()).await?;
            emit(
                json,
                format!(
                    "{}: the next run reads {} again: {}",
                    ctx.pipeline.name,
                    count(keys.len() as u64, "quarantined file"),
                    keys.join(", ")
                ),
                serde_json::json!({"pipeline": ctx.pipeline.name, "keys": keys}),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Resume {
            pipeline,
            state_machine_arn,
        } => resume(&pipeline, state_machine_arn, json).await,
        Command::Cancel {
            pipeline,
            state_machine_arn,
        } => cancel(&pipeline, &state_machine_arn, json).await,
        Command::Reset { pipeline, yes } => reset(&pipeline, yes, json).await,
        Command::History { pipeline, limit } => history(&pipeline, limit, json).await,
        Command::Register { pipeline } => register(&pipeline, json).await,
        Command::Check { pipeline } => check(&pipeline, json).await,
        Command::Cost {
            pipeline,
            last,
            since,
            prices,
            every,
        } => {
            if last == 0 {
                return Err(Usage("--last 0 prices no batch: give 1 or more".into()).into());
            }
            cost::run(
                &open(&pipeline).await?,
                cost::Window { last, since },
                prices,
                every,
                json,
            )
            .await
        }
        Command::Gen {
            dataset: Dataset::Taxi,
            files,
            rows,
            format,
            compression,
            out,
        } => gen_taxi(&out, files, rows, format, compression, json),
        Command::Bench(args) => bench::run(args).await.map(|()| ExitCode::SUCCESS),
        Command::BenchPlanning(args) => bench_planning::run(args).await.map(|()| ExitCode::SUCCESS),
    }
}

async fn pause(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let ctx = open(path).await?;
    let c = admin::set_paused(&ctx, true).await?;
    let running = c.status == sluice_engine::checkpoint::RunStatus::Running;
    emit(
        json,
        format!(
            "{}: paused; triggers record requests and start nothing{}",
            ctx.pipeline.name,
            if running {
                " (the run in progress finishes)"
            } else {
                ""
            }
        ),
        serde_json::json!({"pipeline": ctx.pipeline.name, "paused": true, "run_in_progress": running}),
    );
    Ok(ExitCode::SUCCESS)
}

async fn reset(path: &Path, yes: bool, json: bool) -> anyhow::Result<ExitCode> {
    let ctx = open(path).await?;
    if !yes {
        return Err(Usage(format!(
            "{}: `sluice reset` deletes the output in {} (parts and manifests) and the checkpoint \
             in {}; the next run reads every source file again. Run it again with --yes to do so.",
            ctx.pipeline.name,
            ctx.sink.store().describe(),
            ctx.checkpoint.store().describe()
        ))
        .into());
    }
    let r = admin::reset(&ctx).await?;
    let text = if r.finished_by_another {
        format!(
            "{}: another `sluice reset` finished this reset while it was stopped; removed {} \
             leftover objects of the retired history from the sink and {} from the \
             checkpoint, and left the history after it as it was.",
            ctx.pipeline.name, r.sink_objects, r.checkpoint_objects
        )
    } else {
        format!(
            "{}: reset; removed {} objects from the sink and {} from the checkpoint. The next \
             run (or `sluice register`, for AWS) starts a new history.",
            ctx.pipeline.name, r.sink_objects, r.checkpoint_objects
        )
    };
    let mut value = serde_json::to_value(&r)?;
    value["pipeline"] = ctx.pipeline.name.clone().into();
    emit(json, text, value);
    Ok(ExitCode::SUCCESS)
}

async fn resume(
    path: &Path,
    state_machine_arn: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let ctx = open(path).await?;
    let c = admin::set_paused(&ctx, false).await?;
    let name = &ctx.pipeline.name;
    let value = serde_json::json!({"pipeline": name, "paused": false, "requested": c.requested});
    match (c.requested, state_machine_arn) {
        (false, _) => {
            emit(
                json,
                format!("{name}: resumed; nothing was requested while paused"),
                value,
            );
            Ok(ExitCode::SUCCESS)
        }
        (true, Some(arn)) => {
            if !json {
                println!("{name}: resumed; starting the run requested while paused");
            }
            wake_on_aws(&ctx, &arn, "sluice resume", false, json).await
        }
        (true, None) => {
            emit(
                json,
                format!(
                    "{name}: resumed; a run was requested while paused: start it with \
                     `sluice run` (local) or pass --state-machine-arn"
                ),
                value,
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn check(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let ctx = open(path).await?;
    let name = ctx.pipeline.name.clone();
    let report = admin::check(&ctx).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    for c in &report.checked {
        println!("{name}: checked: {c}");
    }
    for n in &report.not_yet {
        println!("{name}: not checked yet: {n}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn register(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let ctx = open(path).await?;
    ctx.check_source_exists()?;
    let record = admin::register(&ctx).await?;
    emit(
        json,
        format!(
            "registered pipeline \"{}\" in {} ({} source columns pinned)",
            record.pipeline.name,
            ctx.pipeline.checkpoint.display(),
            record.schema.len()
        ),
        serde_json::json!({
            "pipeline": record.pipeline.name,
            "checkpoint": ctx.pipeline.checkpoint.display(),
            "schema": record.schema,
        }),
    );
    Ok(ExitCode::SUCCESS)
}

fn gen_taxi(
    out: &Path,
    files: u64,
    rows: usize,
    format: Format,
    compression: Option<Comp>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let format = match format {
        Format::Parquet => SourceFormat::Parquet,
        Format::Csv => SourceFormat::Csv,
        Format::Jsonl => SourceFormat::Jsonl,
    };
    let compression = compression.map(|c| match c {
        Comp::Gzip => Compression::Gzip,
        Comp::Zstd => Compression::Zstd,
    });
    if compression.is_some() && format == SourceFormat::Parquet {
        anyhow::bail!("--compression applies to csv and jsonl; Parquet compresses inside the file");
    }
    let progress = if json {
        progress::Progress::none()
    } else {
        progress::Progress::new(files, "files")
    };
    let mut all = Vec::new();
    for _ in 0..files {
        let written = sluice_cli::generator::write_taxi_files(out, 1, rows, format, compression)
            .with_context(|| format!("writing taxi files into {}", out.display()))?;
        for p in &written {
            if !json {
                progress.line(&p.display().to_string());
            }
            all.push(p.display().to_string());
        }
        progress.inc(1);
    }
    progress.finish();
    if json {
        println!(
            "{}",
            serde_json::json!({"files": all, "rows_per_file": rows})
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Open a pipeline's context, loading the S3 configuration only if a
/// location is on S3.
async fn open(path: &Path) -> anyhow::Result<Context> {
    let pipeline = Pipeline::load(path)?;
    let on_s3 = [
        &pipeline.source.location,
        &pipeline.sink,
        &pipeline.checkpoint,
    ]
    .iter()
    .any(|l| matches!(l, Location::S3 { .. }));
    let s3 = if on_s3 {
        Some(S3Config::from_env().await)
    } else {
        None
    };
    Ok(Context::open(pipeline, s3.as_ref())?)
}

/// The context of a registered pipeline (refresh, resume, cancel act on
/// what the functions see).
async fn open_registered(path: &Path) -> anyhow::Result<Context> {
    let ctx = open(path).await?;
    if ctx.checkpoint.pipeline_record().await?.is_none() {
        anyhow::bail!(
            "pipeline \"{}\" is not registered in {}; run `sluice register {}` first",
            ctx.pipeline.name,
            ctx.pipeline.checkpoint.display(),
            path.display()
        );
    }
    Ok(ctx)
}

async fn refresh(
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
async fn wake_on_aws(
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
        },
        std::slice::from_ref(ctx),
        &sfn,
    )
    .await?;
    let (epoch, text, mut value) = match &report.woken[&name] {
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
    let end = sfn
        .wait(
            &triggers::execution_name(&name, epoch),
            std::time::Duration::from_secs(1),
        )
        .await?;
    let committed = committed_by(ctx, epoch).await?;
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
    for c in &committed {
        println!(
            "  batch {}: {} files, {} rows in, {} rows out, {} output files",
            c.batch,
            c.files,
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

/// The batches the run of `epoch` committed, oldest first: the last ones,
/// back to the first of another epoch.
async fn committed_by(
    ctx: &Context,
    epoch: u64,
) -> anyhow::Result<Vec<sluice_engine::checkpoint::Commit>> {
    let mut committed = Vec::new();
    if let Some((control, _)) = ctx.checkpoint.control().await? {
        let mut n = control.last_committed;
        while let Some(b) = n.filter(|b| *b >= control.first_batch) {
            match ctx.checkpoint.commit(b).await? {
                Some(c) if c.epoch == epoch => committed.push(c),
                _ => break,
            }
            n = b.checked_sub(1);
        }
    }
    committed.reverse();
    Ok(committed)
}

async fn cancel(path: &Path, state_machine_arn: &str, json: bool) -> anyhow::Result<ExitCode> {
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

async fn history(path: &Path, limit: usize, json: bool) -> anyhow::Result<ExitCode> {
    let ctx = open(path).await?;
    let commits = admin::history(&ctx, limit).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&commits)?);
        return Ok(ExitCode::SUCCESS);
    }
    if commits.is_empty() {
        println!("{}: no committed batches", ctx.pipeline.name);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>6}  {:<20}  {:>5}  {:>6}  {:>6}  {:>10}  {:>10}  {:>8}  {:>7}  {:>8}  {:>6}  {:>8}  {:>9}  {:>10}  trigger",
        "batch",
        "committed",
        "epoch",
        "files",
        "quar.",
        "rows in",
        "rows out",
        "bad rows",
        "nulled",
        "rescued",
        "schema",
        "late",
        "ms",
        "cost"
    );
    let prices = sluice_engine::cost::Prices::default_table();
    for c in &commits {
        let when = chrono::DateTime::from_timestamp_millis(c.committed_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|| "-".into());
        let d = &c.durations;
        println!(
            "{:>6}  {:<20}  {:>5}  {:>6}  {:>6}  {:>10}  {:>10}  {:>8}  {:>7}  {:>8}  {:>6}  {:>8}  {:>9}  {:>10}  {}",
            c.batch,
            when,
            c.epoch,
            c.files,
            c.quarantined.len(),
            c.rows_in,
            c.rows_out,
            c.rejected.iter().map(|r| r.rows).sum::<u64>(),
            c.nulled_fields,
            c.rescued_fields,
            format!(
                "v{}{}",
                c.schema_version.unwrap_or(1),
                if c.added_columns.is_empty() { "" } else { "+" }
            ),
            c.stateful.as_ref().map_or(0, |s| s.late_rows),
            d.plan_ms + d.operate_ms + d.commit_ms,
            cost::dollars(sluice_engine::cost::bill(&c.usage, &c.requests, &prices).total()),
            c.trigger.as_deref().unwrap_or("-")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `sluice show`'s list of quarantined files, if any.
fn print_quarantine(status: &admin::Status) {
    let Some(c) = &status.control else {
        return;
    };
    if c.quarantined.is_empty() {
        return;
    }
    println!(
        "quarantined  {} files (unreadable; fix or replace, then `sluice retry-quarantined`):",
        c.quarantined.len()
    );
    for q in &c.quarantined {
        println!("  {} (batch {}): {}", q.key, q.batch, q.reason);
    }
    if !c.retry.is_empty() {
        println!("  asked for again: {}", c.retry.join(", "));
    }
}

/// What a batch (or all of them) did with bad data and schema changes.
#[derive(Default)]
struct BadData<'a> {
    files: u64,
    rows: u64,
    nulled: u64,
    rescued: u64,
    late: u64,
    added: &'a [String],
    version: Option<u32>,
}

impl std::fmt::Display for BadData<'_> {
    /// Nothing, or `  <what>, <what>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.files > 0 {
            parts.push(format!("{} quarantined", count(self.files, "file")));
        }
        if self.rows > 0 {
            parts.push(format!("{} quarantined", count(self.rows, "row")));
        }
        if self.nulled > 0 {
            parts.push(format!("{} made null", count(self.nulled, "field")));
        }
        if self.rescued > 0 {
            parts.push(format!("{} rescued", count(self.rescued, "field")));
        }
        if self.late > 0 {
            parts.push(format!("{} dropped", count(self.late, "late row")));
        }
        if !self.added.is_empty() {
            parts.push(format!(
                "{} {} added (schema version {})",
                noun(self.added.len() as u64, "column"),
                self.added.join(", "),
                self.version.unwrap_or(1)
            ));
        }
        if !parts.is_empty() {
            write!(f, "  {}", parts.join(", "))?;
        }
        Ok(())
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

async fn run(path: &Path, json: bool, reconcile: bool) -> anyhow::Result<ExitCode> {
    let mut ctx = open(path).await?;
    // A misspelled source folder is an error, not "no input yet".
    ctx.check_source_exists()?;
    ctx.reconcile = reconcile;
    let name = ctx.pipeline.name.clone();
    // On a terminal, a bar over the files waiting now (one listing).
    let progress = if !json && progress::Progress::wanted() {
        progress::Progress::new(admin::status(&ctx).await?.waiting_files, "files")
    } else {
        progress::Progress::none()
    };
    let summary = runner::run(&ctx, |b| {
        if !json {
            progress.inc(b.files);
            progress.line(&format!(
                "batch {:>6}  files {:>5}  {:>12}  rows in {:>10}  out {:>10}  {:>7} ms{}{}",
                b.batch,
                b.files,
                mib(b.bytes),
                b.rows_in,
                b.rows_out,
                b.millis,
                if b.resumed { "  (resumed)" } else { "" },
                BadData {
                    files: b.quarantined,
                    rows: b.rows_quarantined,
                    nulled: b.nulled_fields,
                    rescued: b.rescued_fields,
                    late: b.late_rows,
                    added: &b.added_columns,
                    version: b.schema_version,
                }
            ));
        }
    })
    .await?;
    progress.finish();
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(ExitCode::from(if summary.end == RunEnd::Paused {
            exit::PAUSED
        } else {
            exit::SUCCESS
        }));
    }
    let files: u64 = summary.batches.iter().map(|b| b.files).sum();
    let bytes: u64 = summary.batches.iter().map(|b| b.bytes).sum();
    let rows_in: u64 = summary.batches.iter().map(|b| b.rows_in).sum();
    let rows_out: u64 = summary.batches.iter().map(|b| b.rows_out).sum();
    let quarantined: u64 = summary.batches.iter().map(|b| b.quarantined).sum();
    let bad_rows: u64 = summary.batches.iter().map(|b| b.rows_quarantined).sum();
    let nulled: u64 = summary.batches.iter().map(|b| b.nulled_fields).sum();
    let rescued: u64 = summary.batches.iter().map(|b| b.rescued_fields).sum();
    let added: Vec<String> = summary
        .batches
        .iter()
        .flat_map(|b| b.added_columns.iter().cloned())
        .collect();
    let version = summary
        .batches
        .iter()
        .filter_map(|b| b.schema_version)
        .max();
    match &summary.end {
        RunEnd::Idle(reason) => println!(
            "{name}: {reason}; nothing written ({}, {})",
            duration_ms(summary.millis),
            count(summary.requests.total(), "storage request")
        ),
        RunEnd::Busy(why) => println!("{name}: not started: {why}"),
        RunEnd::Paused => {
            println!(
                "{name}: paused: nothing started; the request is recorded and `sluice resume` \
                 starts it"
            );
            return Ok(ExitCode::from(exit::PAUSED));
        }
        RunEnd::Done => println!(
            "{name}: committed {}: {}, {}, {} in, {} out in {} ({}){}",
            count(summary.batches.len() as u64, "batch"),
            count(files, "file"),
            mib(bytes),
            count(rows_in, "row"),
            count(rows_out, "row"),
            duration_ms(summary.millis),
            count(summary.requests.total(), "storage request"),
            if quarantined > 0 {
                format!(
                    "; {} quarantined: `sluice show` lists them, `sluice retry-quarantined` \
                     reads them again once fixed",
                    count(quarantined, "file")
                )
            } else {
                String::new()
            } + &if bad_rows + nulled > 0 {
                format!(
                    "; {} quarantined under the sink's _quarantine/, {} made null",
                    count(bad_rows, "malformed row"),
                    count(nulled, "bad field")
                )
            } else {
                String::new()
            } + &if rescued > 0 {
                format!(
                    "; {} that did not fit the schema kept in _rescued",
                    count(rescued, "field")
                )
            } else {
                String::new()
            } + &if added.is_empty() {
                String::new()
            } else {
                format!(
                    "; new {} {} joined the output (schema version {})",
                    noun(added.len() as u64, "column"),
                    added.join(", "),
                    version.unwrap_or(1)
                )
            }
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// A command's result: `text` for a person, or (`--json`) `value` with
/// the same text as its `message`.
fn emit(json: bool, text: String, mut value: serde_json::Value) {
    if json {
        if let Some(o) = value.as_object_mut() {
            o.insert("message".into(), text.into());
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("JSON values serialize")
        );
    } else {
        println!("{text}");
    }
}

/// A pinned or declared type as a person reads it: its SQL name.
fn shown_type(written: &str) -> String {
    sluice_engine::pipeline::types::parse_type(written)
        .map(|t| sluice_engine::pipeline::types::type_name(&t))
        .unwrap_or_else(|_| written.to_string())
}

async fn show(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let ctx = open(path).await?;
    let status = admin::status(&ctx).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(ExitCode::SUCCESS);
    }
    let p = &ctx.pipeline;
    println!("pipeline     {}", p.name);
    println!(
        "source       {} ({}, {} discovery)",
        p.source.location.display(),
        p.source.format.name(),
        p.source.discovery.name()
    );
    // The first pinned schema; one that grew since prints with its
    // version below.
    let grown = status.control.as_ref().is_some_and(|c| c.schema.is_some());
    if let Some(cols) = status.schema.as_ref().filter(|_| !grown) {
        let columns: Vec<String> = cols
            .iter()
            .map(|c| format!("{} {}", c.name, shown_type(&c.data_type)))
            .collect();
        println!("schema       {}", columns.join(", "));
    }
    println!("sink         {}", p.sink.display());
    println!("checkpoint   {}", p.checkpoint.display());
    match &status.control {
        None => println!("state        never run"),
        Some(c) => {
            let when = |ms: Option<i64>| {
                ms.and_then(chrono::DateTime::from_timestamp_millis)
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_else(|| "-".into())
            };
            let state = match (c.paused, c.status) {
                (true, _) if c.requested => {
                    "paused (a run was asked for: `sluice resume` starts it)"
                }
                (true, _) => "paused",
                (false, sluice_engine::checkpoint::RunStatus::Running) => "running",
                (false, sluice_engine::checkpoint::RunStatus::Idle) => "idle",
            };
            println!(
                "state        {state} (epoch {}, owner {}, heartbeat {})",
                c.epoch,
                c.owner.as_deref().unwrap_or("-"),
                when(c.heartbeat_ms)
            );
            match c.last_committed {
                Some(n) => println!("last batch   {n} committed {}", when(c.last_commit_ms)),
                None => println!("last batch   none committed"),
            }
            if let Some(lc) = &status.last_commit {
                println!(
                    "  that batch {}, {}, {} in, {} out, {}{}",
                    count(lc.files, "file"),
                    mib(lc.bytes_read),
                    count(lc.rows_in, "row"),
                    count(lc.rows_out, "row"),
                    count(lc.outputs.len() as u64, "output file"),
                    BadData {
                        files: lc.quarantined.len() as u64,
                        rows: lc.rejected.iter().map(|r| r.rows).sum(),
                        nulled: lc.nulled_fields,
                        rescued: lc.rescued_fields,
                        late: lc.stateful.as_ref().map_or(0, |s| s.late_rows),
                        added: &lc.added_columns,
                        version: lc.schema_version,
                    }
                    .to_string()
                    .replacen("  ", ", ", 1)
                );
            }
            if let Some(lc) = &status.last_commit {
                // The last run's batches: back from the last commit while
                // the epoch is the same (no read for the one already here).
                let mut run_commits = vec![lc.clone()];
                let mut n = lc.batch;
                while let Some(prev) = n.checked_sub(1) {
                    match ctx.checkpoint.commit(prev).await? {
                        Some(c) if c.epoch == lc.epoch => run_commits.push(c),
                        _ => break,
                    }
                    n = prev;
                }
                let (prices, _) = cost::prices(None)?;
                let r = sluice_engine::cost::report(&run_commits, &c.totals, &prices, "", None);
                let run = r.per_run;
                println!(
                    "last run     cost {} on AWS at us-east-1 list prices (`sluice cost` for more)",
                    cost::dollars(run)
                );
            }
            let t = &c.totals;
            println!(
                "so far       {}, {}, {}, {} in, {} out{}",
                count(t.batches, "batch"),
                count(t.files, "file"),
                mib(t.bytes),
                count(t.rows_in, "row"),
                count(t.rows_out, "row"),
                BadData {
                    files: t.files_quarantined,
                    rows: t.rows_quarantined,
                    nulled: t.nulled_fields,
                    rescued: t.rescued_fields,
                    late: t.late_rows,
                    ..BadData::default()
                }
                .to_string()
                .replacen("  ", ", ", 1)
            );
            if let Some(s) = &c.stateful {
                let held = s.state.iter().filter(|k| k.is_some()).count();
                println!(
                    "stateful     {held} of {} partitions hold state; watermark {}",
                    s.state.len(),
                    s.watermark_us
                        .and_then(chrono::DateTime::from_timestamp_micros)
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                        .unwrap_or_else(|| "none yet".into())
                );
            }
            if let Some(v) = &c.schema {
                let columns: Vec<String> = v
                    .columns
                    .iter()
                    .map(|c| format!("{} {}", c.name, shown_type(&c.data_type)))
                    .collect();
                println!(
                    "schema       version {} (columns added since the first run): {}",
                    v.version,
                    columns.join(", ")
                );
            }
        }
    }
    let lag = match status.oldest_waiting_ms {
        Some(t) => format!(
            "; the oldest waiting for {}",
            duration_s(((chrono::Utc::now().timestamp_millis() - t).max(0) / 1000) as u64)
        ),
        None => String::new(),
    };
    println!(
        "waiting      {}, {}{lag}",
        count(status.waiting_files, "file"),
        mib(status.waiting_bytes)
    );
    print_quarantine(&status);
    if !status.skipped.is_empty() {
        println!(
            "skipped      {} files whose names cannot be keys (rename them to read them): {}",
            status.skipped.len(),
            status.skipped.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
