//! `sluice bench`: throughput of a sluice run against raw DataFusion running
//! the same SQL over the same files in the same process, plus the cost of an
//! idle run and of a small incremental run. Prints ratios measured in this
//! one run; nothing here is a pass/fail test.

use std::path::Path;
use std::time::Instant;

use clap::{Args, ValueEnum};
use datafusion::dataframe::DataFrameWriteOptions;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use sluice_engine::handlers::Context;
use sluice_engine::pipeline::{Pipeline, SourceFormat};
use sluice_engine::runner::{self, RunEnd, RunSummary};
use sluice_engine::storage::RequestCounts;

/// Options of `sluice bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Input files to generate.
    #[arg(long, default_value_t = 20)]
    files: u64,
    /// Rows per file.
    #[arg(long, default_value_t = 50_000)]
    rows: usize,
    /// Rounds of (raw DataFusion, sluice) to alternate; the median is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Work folder (default: a temporary folder, removed afterwards).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Which query: a row-by-row filter and projection, a windowed
    /// GROUP BY (tumbling 15 minutes x zone, count/sum/avg), a join with a
    /// static zones table, or deduplication within the watermark.
    #[arg(long, value_enum, default_value_t = BenchQuery::Filter)]
    query: BenchQuery,
    /// Where the input comes from: generated files, or records produced
    /// into a new topic on `--bootstrap`'s broker.
    #[arg(long, value_enum, default_value_t = BenchSource::Files)]
    source: BenchSource,
    /// `--source kafka`: the broker, host:port.
    #[arg(long)]
    bootstrap: Option<String>,
    /// `--source kafka` or `kinesis`: records to produce (put).
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// `--source kafka`: partitions of the topic; `--source kinesis`:
    /// shards of the stream.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// The sink: Parquet against raw DataFusion (default), or a Delta
    /// table against the Parquet sink (`--sink delta`).
    #[arg(long, value_enum, default_value_t = BenchSink::Parquet)]
    sink: BenchSink,
}

/// The benchmark's sink.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchSink {
    /// The Parquet sink, against raw DataFusion writing Parquet.
    Parquet,
    /// A Delta table, against the Parquet sink.
    Delta,
}

/// The benchmark's input.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchSource {
    /// Generated taxi files.
    Files,
    /// A Kafka topic.
    Kafka,
    /// A Kinesis stream (on the endpoint `AWS_ENDPOINT_URL` names).
    Kinesis,
}

/// The benchmark's query.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchQuery {
    /// Row by row: WHERE and computed columns.
    Filter,
    /// A windowed GROUP BY through the merge stage.
    Window,
    /// A join of the input with a static table (`[[static]]`).
    Join,
    /// `[deduplicate]` within the watermark, 100 batches.
    Dedup,
}

const SQL: &str = "SELECT \"VendorID\", tpep_pickup_datetime, \"PULocationID\", \"DOLocationID\", \
    trip_distance, fare_amount, tip_amount, total_amount, \
    total_amount - fare_amount AS surcharges, \
    CASE WHEN fare_amount > 0 THEN tip_amount / fare_amount END AS tip_ratio \
    FROM trips WHERE trip_distance > 0.5 AND payment_type IN (1, 2)";

fn pipeline_toml(round: usize) -> String {
    files_toml(
        &format!("bench{round}"),
        &format!("out/sluice-{round}"),
        &format!("out/checkpoint-{round}"),
        "parquet",
    )
}

/// The files benchmark's pipeline: [`SQL`] over `input`, every file in one
/// batch and one task, into `sink` in `format`.
pub(crate) fn files_toml(name: &str, sink: &str, checkpoint: &str, format: &str) -> String {
    format!(
        r#"name = "{name}"
[source]
uri = "input"
format = "parquet"
table = "trips"
discovery = "ordered"
[query]
sql = '''{SQL}'''
[sink]
uri = "{sink}"
format = "{format}"
[checkpoint]
uri = "{checkpoint}"
[limits]
max_files_per_batch = 100000
max_bytes_per_batch = "100 GiB"
max_bytes_per_task = "100 GiB"
"#
    )
}

/// Raw DataFusion: `sql` over the Parquet files under `input` (table
/// `trips`), written as Parquet under `out`, in one session with as many
/// partitions as cores. Returns the seconds it took and the rows written.
pub(crate) async fn raw_datafusion(
    input: &Path,
    out: &Path,
    sql: &str,
) -> anyhow::Result<(f64, u64)> {
    raw_datafusion_with(input, None, out, sql).await
}

/// [`raw_datafusion`], with the CSV files under `zones` as table `zones`.
pub(crate) async fn raw_datafusion_with(
    input: &Path,
    zones: Option<&Path>,
    out: &Path,
    sql: &str,
) -> anyhow::Result<(f64, u64)> {
    let started = Instant::now();
    let parts = std::thread::available_parallelism().map_or(2, |n| n.get());
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(parts));
    ctx.register_parquet(
        "trips",
        input.to_str().expect("utf-8 path"),
        ParquetReadOptions::default().file_extension(".parquet"),
    )
    .await?;
    if let Some(zones) = zones {
        ctx.register_csv(
            "zones",
            zones.to_str().expect("utf-8 path"),
            datafusion::prelude::CsvReadOptions::new().has_header(true),
        )
        .await?;
    }
    let written = ctx
        .sql(sql)
        .await?
        .write_parquet(
            out.to_str().expect("utf-8 path"),
            DataFrameWriteOptions::new(),
            None,
        )
        .await?;
    let secs = started.elapsed().as_secs_f64();
    let rows = written
        .first()
        .and_then(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::UInt64Array>()
                .map(|a| a.value(0))
        })
        .unwrap_or(0);
    Ok((secs, rows))
}

/// One sluice run of the pipeline `toml` (paths under `dir`) to its end,
/// which must read `rows` rows: its seconds, and its context for the runs
/// after it.
pub(crate) async fn full_run(toml: &str, dir: &Path, rows: u64) -> anyhow::Result<(f64, Context)> {
    let ctx = Context::open(Pipeline::parse(toml, "bench.toml", dir)?, None)?;
    let started = Instant::now();
    let summary = runner::run(&ctx, |_| {}).await?;
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        summary.end == RunEnd::Done,
        "bench run ended {:?}",
        summary.end
    );
    let rows_in: u64 = summary.batches.iter().map(|b| b.rows_in).sum();
    anyhow::ensure!(
        rows_in == rows,
        "sluice read {rows_in} rows, expected {rows}"
    );
    Ok((secs, ctx))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// Run the benchmark and print its report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let tmp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let (input, out) = (dir.join("input"), dir.join("out"));
    for d in [&input, &out] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
    }
    if args.source == BenchSource::Kafka {
        let Some(b) = &args.bootstrap else {
            anyhow::bail!(
                "--source kafka needs --bootstrap host:port (a broker to write a topic to)"
            );
        };
        std::fs::create_dir_all(&dir)?;
        return crate::bench_kafka::run(&dir, b, args.records, args.partitions, args.rounds).await;
    }
    if args.source == BenchSource::Kinesis {
        std::fs::create_dir_all(&dir)?;
        return crate::bench_kinesis::run(&dir, args.records, args.partitions, args.rounds).await;
    }
    if args.query == BenchQuery::Join {
        return crate::bench_breadth::join(&dir, args.files, args.rows, args.rounds).await;
    }
    if args.query == BenchQuery::Dedup {
        return crate::bench_breadth::dedup(&dir, args.files, args.rows).await;
    }
    if args.query == BenchQuery::Window {
        return crate::bench_window::run(&dir, args.files, args.rows, args.rounds).await;
    }
    if args.sink == BenchSink::Delta {
        std::fs::create_dir_all(&dir)?;
        return crate::bench_delta::run(&dir, args.files, args.rows, args.rounds).await;
    }
    std::fs::create_dir_all(&dir)?;
    println!(
        "generating {} taxi files x {} rows (Parquet) in {}",
        args.files,
        args.rows,
        dir.display()
    );
    sluice_cli::generator::write_taxi_files(
        &input,
        args.files,
        args.rows,
        SourceFormat::Parquet,
        None,
    )?;
    let total_rows = args.files * args.rows as u64;

    let (raw_s, ours_s, ctx) = full_runs(&args, &dir, &input, &out, total_rows).await?;
    let raw_rate = total_rows as f64 / raw_s;
    let our_rate = total_rows as f64 / ours_s;

    let Incremental {
        idle_ms,
        idle_requests,
        inc_ms,
        inc_requests,
    } = idle_and_incremental(&ctx, &input, args.rows).await?;

    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!("| input | {} files, {} rows |", args.files, total_rows);
    println!(
        "| raw DataFusion (same SQL, Parquet out), median of {} | {:.3} s, {:.0} rows/s |",
        args.rounds, raw_s, raw_rate
    );
    println!(
        "| sluice run (plan + operate + commit), median of {} | {:.3} s, {:.0} rows/s |",
        args.rounds, ours_s, our_rate
    );
    println!(
        "| **ratio sluice / raw DataFusion** (goal >= 0.9) | **{:.2}** |",
        our_rate / raw_rate
    );
    println!(
        "| idle run | {:.1} ms, {} storage requests |",
        idle_ms,
        idle_requests.total()
    );
    println!(
        "| run with 5 new files | {:.1} ms, {} storage requests |",
        inc_ms,
        inc_requests.total()
    );
    Ok(())
}

/// `args.rounds` runs over all of `input`, each against a fresh checkpoint:
/// raw DataFusion and Sluice with the same SQL. Returns the median seconds of
/// each and the last round's Sluice context.
async fn full_runs(
    args: &BenchArgs,
    dir: &Path,
    input: &Path,
    out: &Path,
    total_rows: u64,
) -> anyhow::Result<(f64, f64, Context)> {
    let mut raw = Vec::new();
    let mut ours = Vec::new();
    let mut last_ctx = None;
    let progress = crate::progress::Progress::new(args.rounds.max(1) as u64, "rounds");
    for round in 0..args.rounds.max(1) {
        raw.push(
            raw_datafusion(input, &out.join(format!("raw-{round}")), SQL)
                .await?
                .0,
        );
        let toml = pipeline_toml(round);
        let (secs, ctx) = full_run(&toml, dir, total_rows).await?;
        ours.push(secs);
        last_ctx = Some(ctx);
        progress.inc(1);
    }
    progress.finish();
    let ctx = last_ctx.expect("at least one round");
    Ok((median(raw), median(ours), ctx))
}

/// What an idle run and a run over five new files each took: wall time in
/// milliseconds and storage requests.
struct Incremental {
    idle_ms: f64,
    idle_requests: RequestCounts,
    inc_ms: f64,
    inc_requests: RequestCounts,
}

/// After the full runs: an idle run (nothing new since the last), then a
/// run over five new files (`rows` each, written under `input`).
async fn idle_and_incremental(
    ctx: &Context,
    input: &Path,
    rows: usize,
) -> anyhow::Result<Incremental> {
    // Idle: nothing new since the last run.
    let (idle, idle_ms, idle_requests) = timed_run(ctx).await?;
    anyhow::ensure!(
        matches!(idle.end, RunEnd::Idle(_)),
        "idle run ended {:?}",
        idle.end
    );

    // Five new files.
    sluice_cli::generator::write_taxi_files(input, 5, rows, SourceFormat::Parquet, None)?;
    let (inc, inc_ms, inc_requests) = timed_run(ctx).await?;
    let inc_files: u64 = inc.batches.iter().map(|b| b.files).sum();
    anyhow::ensure!(
        inc_files == 5,
        "incremental run took {inc_files} files, expected 5"
    );

    Ok(Incremental {
        idle_ms,
        idle_requests,
        inc_ms,
        inc_requests,
    })
}

/// One `sluice run`: its summary, wall time in milliseconds and the storage
/// requests it made.
async fn timed_run(ctx: &Context) -> anyhow::Result<(RunSummary, f64, RequestCounts)> {
    let before = ctx.counts();
    let started = Instant::now();
    let summary = runner::run(ctx, |_| {}).await?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok((summary, ms, ctx.counts().since(&before)))
}
