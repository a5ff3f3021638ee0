//! `sluice bench --query window`: a windowed GROUP BY (tumbling 15 minutes
//! x pickup zone, count/sum/avg) as a sluice run against raw DataFusion
//! running the same GROUP BY once over the same files; the merge stage with
//! 1, 2 and 4 state partitions; and the state's size and restore time after
//! 100 batches. Prints what it measured in this one run; nothing here is a
//! pass/fail test.

use std::path::Path;
use std::time::Instant;

use sluice_engine::handlers::{self, Context};
use sluice_engine::pipeline::{Pipeline, SourceFormat};
use sluice_engine::runner::{self, RunEnd, RunSummary};

/// The query as a user writes it (Spark's spelling).
const SQL: &str = "SELECT window.start AS window_start, window.end AS window_end, \
    \"PULocationID\", count(*) AS trips, sum(total_amount) AS revenue, \
    avg(trip_distance) AS avg_distance \
    FROM trips GROUP BY window(tpep_pickup_datetime, '15 minutes'), \"PULocationID\"";

/// The same GROUP BY in plain DataFusion SQL, run once over all files.
const RAW_SQL: &str = "SELECT \
    date_bin(INTERVAL '15 minutes', tpep_pickup_datetime, TIMESTAMP '1970-01-01T00:00:00') AS window_start, \
    date_bin(INTERVAL '15 minutes', tpep_pickup_datetime, TIMESTAMP '1970-01-01T00:00:00') + INTERVAL '15 minutes' AS window_end, \
    \"PULocationID\", count(*) AS trips, sum(total_amount) AS revenue, \
    avg(trip_distance) AS avg_distance \
    FROM trips GROUP BY 1, 2, 3";

/// A windowed pipeline over `input` writing under `out/<name>`.
fn pipeline_toml(name: &str, input: &str, mode: &str, partitions: u32, files: u64) -> String {
    format!(
        r#"name = "{name}"
[source]
uri = "{input}"
format = "parquet"
table = "trips"
discovery = "ordered"
[query]
sql = '''{SQL}'''
[watermark]
column = "tpep_pickup_datetime"
delay = "10 minutes"
[sink]
uri = "out/{name}"
mode = "{mode}"
[checkpoint]
uri = "out/{name}-checkpoint"
retain_batches = 200
[limits]
state_partitions = {partitions}
max_files_per_batch = {files}
max_bytes_per_batch = "100 GiB"
max_bytes_per_task = "100 GiB"
max_batches_per_execution = 1000
"#
    )
}

pub(crate) fn open(dir: &Path, toml: &str) -> anyhow::Result<Context> {
    let pipeline = Pipeline::parse(toml, "bench.toml", dir)?;
    Ok(Context::open(pipeline, None)?)
}

pub(crate) async fn run_to_end(ctx: &Context) -> anyhow::Result<(RunSummary, f64)> {
    let started = Instant::now();
    let summary = runner::run(ctx, |_| {}).await?;
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        summary.end == RunEnd::Done,
        "bench run ended {:?}",
        summary.end
    );
    Ok((summary, secs))
}

/// Sum over the run's batches of the longest merge of each (the merge
/// stage's time on the critical path), ms.
async fn merge_ms(ctx: &Context, summary: &RunSummary) -> anyhow::Result<u64> {
    let mut total = 0;
    for b in &summary.batches {
        let commit = ctx
            .checkpoint
            .commit(b.batch)
            .await?
            .ok_or_else(|| anyhow::anyhow!("batch {} has no commit record", b.batch))?;
        total += commit.durations.merge_max_ms;
    }
    Ok(total)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// Run the window benchmark over `files` x `rows` and print its report.
pub async fn run(dir: &Path, files: u64, rows: usize, rounds: usize) -> anyhow::Result<()> {
    let (input, out) = (dir.join("input"), dir.join("out"));
    let input100 = dir.join("input100");
    for d in [&input, &out, &input100] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
    }
    std::fs::create_dir_all(dir)?;
    println!(
        "generating {files} taxi files x {rows} rows (Parquet) in {}",
        dir.display()
    );
    sluice_cli::generator::write_taxi_files(&input, files, rows, SourceFormat::Parquet, None)?;
    let total_rows = files * rows as u64;

    // Rounds, merges with 1, 2, 4 partitions, state in two modes.
    let progress = crate::progress::Progress::new(rounds.max(1) as u64 + 5, "steps");
    let Throughput {
        raw_s,
        ours_s,
        raw_groups,
        our_groups,
        batches,
    } = throughput(dir, &input, &out, rounds, total_rows, &progress).await?;
    let merges = merge_runs(dir, &progress).await?;
    // State after 100 batches, in append mode (open windows only) and in
    // complete mode (every group kept).
    let small = (total_rows / 100).max(1) as usize;
    sluice_cli::generator::write_taxi_files(&input100, 100, small, SourceFormat::Parquet, None)?;
    let states = state_runs(dir, &progress).await?;
    progress.finish();

    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| input | {files} files, {total_rows} rows; tumbling 15 minutes x PULocationID, count/sum/avg |"
    );
    println!(
        "| raw DataFusion (same GROUP BY once, Parquet out), median of {rounds} | {raw_s:.3} s, {:.0} rows/s, {raw_groups} groups |",
        total_rows as f64 / raw_s
    );
    println!(
        "| sluice run (append, 4 state partitions, {batches} batches incl. closing), median of {rounds} | {ours_s:.3} s, {:.0} rows/s, {our_groups} windows emitted |",
        total_rows as f64 / ours_s
    );
    println!(
        "| **ratio sluice / raw DataFusion** (goal >= 0.7) | **{:.2}** |",
        raw_s / ours_s
    );
    for (partitions, batches, ms, secs) in merges {
        println!(
            "| one file per batch, {partitions} state partition(s): {batches} batches | run {secs:.3} s, merge stage {ms} ms (sum of each batch's longest merge) |"
        );
    }
    for StateRun {
        mode,
        secs,
        ms,
        size,
        restore_ms,
    } in states
    {
        println!(
            "| state after 100 batches ({mode}) | {} groups in {} partitions, {} bytes; restore {restore_ms:.1} ms (median of 5); run {secs:.3} s, merge stage {ms} ms |",
            size.groups, size.partitions, size.bytes
        );
    }
    Ok(())
}

/// What the throughput rounds measured: the median seconds of raw
/// DataFusion and of Sluice, the groups each wrote (the last round's), and
/// the batches of Sluice's run.
struct Throughput {
    raw_s: f64,
    ours_s: f64,
    raw_groups: u64,
    our_groups: u64,
    batches: usize,
}

/// Throughput: the whole backlog under `input` in one run (one data batch
/// and the closing batch), against the same GROUP BY once in raw
/// DataFusion, `rounds` times.
async fn throughput(
    dir: &Path,
    input: &Path,
    out: &Path,
    rounds: usize,
    total_rows: u64,
    progress: &crate::progress::Progress,
) -> anyhow::Result<Throughput> {
    let (mut raw, mut ours) = (Vec::new(), Vec::new());
    let (mut raw_groups, mut our_groups, mut batches): (u64, u64, usize) = (0, 0, 0);
    for round in 0..rounds.max(1) {
        let (secs, groups) =
            crate::bench::raw_datafusion(input, &out.join(format!("raw-{round}")), RAW_SQL).await?;
        raw.push(secs);
        raw_groups = groups;
        let ctx = open(
            dir,
            &pipeline_toml(&format!("window{round}"), "input", "append", 4, 100_000),
        )?;
        let (summary, secs) = run_to_end(&ctx).await?;
        ours.push(secs);
        let rows_in: u64 = summary.batches.iter().map(|b| b.rows_in).sum();
        anyhow::ensure!(
            rows_in == total_rows,
            "sluice read {rows_in} rows, expected {total_rows}"
        );
        our_groups = summary.batches.iter().map(|b| b.rows_out).sum();
        batches = summary.batches.len();
        progress.inc(1);
    }
    Ok(Throughput {
        raw_s: median(raw),
        ours_s: median(ours),
        raw_groups,
        our_groups,
        batches,
    })
}

/// The merge stage with 1, 2, 4 partitions: one file per batch, so state
/// carries across batches. Per partition count: its batches, the merge
/// stage's milliseconds and the run's seconds.
async fn merge_runs(
    dir: &Path,
    progress: &crate::progress::Progress,
) -> anyhow::Result<Vec<(u32, usize, u64, f64)>> {
    let mut merges = Vec::new();
    for partitions in [1u32, 2, 4] {
        let ctx = open(
            dir,
            &pipeline_toml(
                &format!("merge{partitions}"),
                "input",
                "append",
                partitions,
                1,
            ),
        )?;
        let (summary, secs) = run_to_end(&ctx).await?;
        let ms = merge_ms(&ctx, &summary).await?;
        merges.push((partitions, summary.batches.len(), ms, secs));
        progress.inc(1);
    }
    Ok(merges)
}

/// The state of a run of 100 batches in one output mode.
struct StateRun {
    mode: &'static str,
    /// The run's seconds.
    secs: f64,
    /// The merge stage's milliseconds.
    ms: u64,
    size: handlers::StateSize,
    /// The median of five restores, milliseconds.
    restore_ms: f64,
}

/// The state after the 100 batches under `input100`, in append mode (open
/// windows only) and in complete mode (every group kept): its size, and
/// how long restoring it takes.
async fn state_runs(
    dir: &Path,
    progress: &crate::progress::Progress,
) -> anyhow::Result<Vec<StateRun>> {
    let mut states = Vec::new();
    for mode in ["append", "complete"] {
        let ctx = open(
            dir,
            &pipeline_toml(&format!("state-{mode}"), "input100", mode, 4, 1),
        )?;
        let (summary, secs) = run_to_end(&ctx).await?;
        let data_batches = summary.batches.iter().filter(|b| b.files > 0).count();
        anyhow::ensure!(
            data_batches == 100,
            "{mode}: {data_batches} data batches, expected 100"
        );
        let ms = merge_ms(&ctx, &summary).await?;
        let mut restore = Vec::new();
        let mut size = handlers::StateSize::default();
        for _ in 0..5 {
            let started = Instant::now();
            size = handlers::restore_state(&ctx).await?;
            restore.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        states.push(StateRun {
            mode,
            secs,
            ms,
            size,
            restore_ms: median(restore),
        });
        progress.inc(1);
    }
    Ok(states)
}
