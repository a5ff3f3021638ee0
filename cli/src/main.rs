//! The `sluice` command: run a pipeline locally (or against S3), inspect
//! it, generate sample data, benchmark.

mod aws;
mod bench;
mod bench_breadth;
mod bench_delta;
mod bench_kafka;
mod bench_kinesis;
mod bench_planning;
mod bench_window;
mod cost;
mod progress;
mod show;
mod text;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use aws::{cancel, refresh, wake_on_aws};
use clap::{Parser, Subcommand, ValueEnum};
use show::{BadData, history, mib, show};
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

/// The pipeline and batches `sluice cost` and `sluice tune` read.
#[derive(clap::Args)]
struct Batches {
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
}

impl Batches {
    /// The pipeline's context, the window and the price table; `--last 0`
    /// is refused (`what`: what the command does with no batch).
    async fn open(self, what: &str) -> anyhow::Result<(Context, cost::Window, Option<PathBuf>)> {
        if self.last == 0 {
            return Err(Usage(format!("--last 0 {what} no batch: give 1 or more")).into());
        }
        Ok((
            open(&self.pipeline).await?,
            cost::Window {
                last: self.last,
                since: self.since,
            },
            self.prices,
        ))
    }
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
        /// How many batches at most (1 or more).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
    },
    /// What the last batches cost on AWS (Lambda, Step Functions, S3), per batch and per run, the month at an arrival rate, and the always-on Spark job it replaces.
    Cost {
        #[command(flatten)]
        batches: Batches,
        /// Project the month at one run every DURATION (e.g. "5 minutes") instead of the observed rate.
        #[arg(long)]
        every: Option<String>,
        /// With --every: data arrives only every DURATION (e.g. "1 hour"); the runs in between find nothing and are priced as the measured idle run.
        #[arg(long, requires = "every")]
        data_every: Option<String>,
    },
    /// The memory each function should run with, from what its invocations measured (CPU time over billed time), with the Lambda cost a run before and after.
    Tune {
        #[command(flatten)]
        batches: Batches,
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
    quiet_on_closed_stdout();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                // The Kafka client warns at every retry of a connection;
                // the step's own error says what failed.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rskafka=error")),
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
        Command::History { pipeline, limit } => history(&pipeline, limit as usize, json).await,
        Command::Register { pipeline } => register(&pipeline, json).await,
        Command::Check { pipeline } => check(&pipeline, json).await,
        Command::Cost {
            batches,
            every,
            data_every,
        } => {
            let (ctx, window, prices) = batches.open("prices").await?;
            cost::run(&ctx, window, prices, every, data_every, json).await
        }
        Command::Tune { batches } => {
            let (ctx, window, prices) = batches.open("reads").await?;
            cost::tune(&ctx, &window, prices, json).await
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
                " (the run in progress stops at the end of its current execution; batches it \
                 planned and did not run wait for `sluice resume`)"
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
        // A stream is read again from where a new pipeline starts.
        let again =
            if ctx.pipeline.source.discovery == sluice_engine::pipeline::DiscoveryMode::Kinesis {
                "reads the stream again from source.starting_position"
            } else {
                "reads every source file again"
            };
        return Err(Usage(format!(
            "{}: `sluice reset` deletes the output in {} (parts and manifests) and the checkpoint \
             in {}; the next run {again}. Run it again with --yes to do so.",
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

async fn run(path: &Path, json: bool, reconcile: bool) -> anyhow::Result<ExitCode> {
    let mut ctx = open(path).await?;
    // A misspelled source folder is an error, not "no input yet".
    ctx.check_source_exists()?;
    ctx.reconcile = reconcile;
    let name = ctx.pipeline.name.clone();
    // A topic's batches read partition ranges of records, not files.
    let stream = ctx.pipeline.source.location.is_stream();
    // On a terminal, a bar over the files (records) waiting now (one
    // listing, or the topic's offsets).
    let progress = if !json && progress::Progress::wanted() {
        let status = admin::status(&ctx).await?;
        match status.waiting_records {
            Some(records) => progress::Progress::new(records, "records"),
            None => progress::Progress::new(status.waiting_files, "files"),
        }
    } else {
        progress::Progress::none()
    };
    let summary = runner::run(&ctx, |b| {
        if !json {
            progress.inc(if stream {
                b.rows_in + b.rows_quarantined
            } else {
                b.files
            });
            progress.line(&batch_line(b, stream));
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
    match &summary.end {
        RunEnd::Idle(reason) => println!(
            "{name}: {reason}; nothing written ({}, {})",
            duration_ms(summary.millis),
            count(summary.requests.total(), "storage request")
        ),
        RunEnd::Busy(why) if summary.batches.is_empty() => {
            println!("{name}: not started: {why}")
        }
        RunEnd::Busy(why) => println!(
            "{}; then its next execution did not start: {why}",
            committed_line(&name, &summary, stream)
        ),
        RunEnd::Paused if summary.batches.is_empty() => {
            println!(
                "{name}: paused: nothing started; the request is recorded and `sluice resume` \
                 starts it"
            );
            return Ok(ExitCode::from(exit::PAUSED));
        }
        RunEnd::Paused => {
            println!(
                "{}; then paused: the batches it planned and did not run wait for `sluice \
                 resume`",
                committed_line(&name, &summary, stream)
            );
            return Ok(ExitCode::from(exit::PAUSED));
        }
        RunEnd::Done => println!("{}", committed_line(&name, &summary, stream)),
    }
    Ok(ExitCode::SUCCESS)
}

/// A reader that goes away before the output ends (`sluice history | head`)
/// makes printing fail; stop quietly then, with the status a shell gives a
/// command ended by SIGPIPE (141), instead of a panic and its backtrace.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

/// `sluice run`'s line for one committed batch (`stream`: of a topic,
/// whose inputs are records).
fn batch_line(b: &runner::BatchReport, stream: bool) -> String {
    // A topic's batch reads records: those read, and those set aside.
    let (what, inputs) = if stream {
        ("records", b.rows_in + b.rows_quarantined)
    } else {
        ("files", b.files)
    };
    format!(
        "batch {:>6}  {what} {inputs:>5}  {:>12}  rows in {:>10}  out {:>10}  {:>7} ms{}{}",
        b.batch,
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
            duplicates: b.duplicates,
            added: &b.added_columns,
            version: b.schema_version,
        }
    )
}

/// `sluice run`'s closing line after it committed batches: what they read
/// and wrote, and what they did with bad data and new columns.
fn committed_line(name: &str, summary: &runner::RunSummary, stream: bool) -> String {
    let files: u64 = summary
        .batches
        .iter()
        .map(|b| {
            if stream {
                b.rows_in + b.rows_quarantined
            } else {
                b.files
            }
        })
        .sum();
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
    format!(
        "{name}: committed {}: {}, {}, {} in, {} out in {} ({}){}",
        count(summary.batches.len() as u64, "batch"),
        count(files, if stream { "record" } else { "file" }),
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
    )
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
