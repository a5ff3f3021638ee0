//! `sluice bench --query join` and `--query dedup`: a stream-static join as
//! a sluice run against raw DataFusion running the same join over the same
//! files; and deduplication within the watermark over 100 batches (the
//! keys seen, their size and restore time, and the run against the same
//! pipeline without `[deduplicate]`). Prints what it measured in this one
//! run; nothing here is a pass/fail test.

use std::path::Path;
use std::time::Instant;

use crate::bench_window::{open, run_to_end};
use sluice_engine::handlers;
use sluice_engine::pipeline::SourceFormat;

/// Each trip with its pickup zone's name and borough.
const JOIN_SQL: &str = "SELECT t.\"PULocationID\", t.tpep_pickup_datetime, t.fare_amount, \
    t.total_amount, z.zone, z.borough FROM trips t JOIN zones z ON t.\"PULocationID\" = z.id \
    WHERE t.trip_distance > 0.5";

/// The zones table: 265 ids, a name and a borough each.
fn zones_csv() -> String {
    let boroughs = ["Manhattan", "Queens", "Brooklyn", "Bronx", "Staten Island"];
    let mut text = String::from("id,zone,borough\n");
    for id in 1..=265 {
        text.push_str(&format!("{id},Zone {id},{}\n", boroughs[id % 5]));
    }
    text
}

fn join_toml(name: &str) -> String {
    format!(
        r#"name = "{name}"
[source]
uri = "input"
format = "parquet"
table = "trips"
discovery = "ordered"
[[static]]
table = "zones"
uri = "zones"
format = "csv"
[query]
sql = '''{JOIN_SQL}'''
[sink]
uri = "out/{name}"
[checkpoint]
uri = "out/{name}-checkpoint"
[limits]
max_files_per_batch = 100000
max_bytes_per_batch = "100 GiB"
max_bytes_per_task = "100 GiB"
"#
    )
}

/// `sluice bench --query join`.
pub async fn join(dir: &Path, files: u64, rows: usize, rounds: usize) -> anyhow::Result<()> {
    let (input, out, zones) = (dir.join("input"), dir.join("out"), dir.join("zones"));
    for d in [&input, &out, &zones] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
    }
    std::fs::create_dir_all(&zones)?;
    std::fs::write(zones.join("zones.csv"), zones_csv())?;
    println!(
        "generating {files} taxi files x {rows} rows (Parquet) and a 265-row zones table in {}",
        dir.display()
    );
    sluice_cli::generator::write_taxi_files(&input, files, rows, SourceFormat::Parquet, None)?;
    let total_rows = files * rows as u64;
    let progress = crate::progress::Progress::new(rounds.max(1) as u64, "rounds");
    let (mut raw, mut ours) = (Vec::new(), Vec::new());
    let (mut raw_rows, mut our_rows, mut requests) = (0, 0, 0);
    for round in 0..rounds.max(1) {
        let (secs, written) = crate::bench::raw_datafusion_with(
            &input,
            Some(&zones),
            &out.join(format!("raw-{round}")),
            JOIN_SQL,
        )
        .await?;
        raw.push(secs);
        raw_rows = written;
        let ctx = open(dir, &join_toml(&format!("join{round}")))?;
        let (summary, secs) = run_to_end(&ctx).await?;
        ours.push(secs);
        our_rows = summary.batches.iter().map(|b| b.rows_out).sum();
        requests = 0;
        for b in &summary.batches {
            if let Some(c) = ctx.checkpoint.commit(b.batch).await? {
                requests += c.requests.total();
            }
        }
        progress.inc(1);
    }
    progress.finish();
    anyhow::ensure!(
        raw_rows == our_rows,
        "sluice wrote {our_rows} rows, raw DataFusion {raw_rows}"
    );
    let (raw_s, ours_s) = (crate::bench::median(raw), crate::bench::median(ours));
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| input | {files} files, {total_rows} rows; inner join with a 265-row CSV zones table, {our_rows} rows out |"
    );
    println!(
        "| raw DataFusion (same join, Parquet out), median of {rounds} | {raw_s:.3} s, {:.0} rows/s |",
        total_rows as f64 / raw_s
    );
    println!(
        "| sluice run (the static table pinned by the plan, read by the task), median of {rounds} | {ours_s:.3} s, {:.0} rows/s, {requests} storage requests |",
        total_rows as f64 / ours_s
    );
    println!(
        "| **ratio sluice / raw DataFusion** (goal >= 0.8) | **{:.2}** |",
        raw_s / ours_s
    );
    Ok(())
}

/// A pipeline over `input100` (one file per batch), deduplicated by pickup
/// and drop-off zone within a one-hour watermark, or not.
fn dedup_toml(name: &str, dedup: bool) -> String {
    let section = if dedup {
        "[deduplicate]\nkey = [\"PULocationID\", \"DOLocationID\"]\n"
    } else {
        ""
    };
    format!(
        r#"name = "{name}"
[source]
uri = "input100"
format = "parquet"
table = "trips"
discovery = "ordered"
[query]
sql = "SELECT \"PULocationID\", \"DOLocationID\", tpep_pickup_datetime, fare_amount FROM trips"
{section}[watermark]
column = "tpep_pickup_datetime"
delay = "1 hour"
[sink]
uri = "out/{name}"
[checkpoint]
uri = "out/{name}-checkpoint"
retain_batches = 200
[limits]
state_partitions = 4
max_files_per_batch = 1
max_batches_per_execution = 1000
"#
    )
}

/// `sluice bench --query dedup`.
pub async fn dedup(dir: &Path, files: u64, rows: usize) -> anyhow::Result<()> {
    let (input, out) = (dir.join("input100"), dir.join("out"));
    for d in [&input, &out] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
    }
    let total_rows = files * rows as u64;
    let small = (total_rows / 100).max(1) as usize;
    println!(
        "generating 100 taxi files x {small} rows (Parquet) in {}",
        dir.display()
    );
    sluice_cli::generator::write_taxi_files(&input, 100, small, SourceFormat::Parquet, None)?;
    let progress = crate::progress::Progress::new(3, "steps");
    let ctx = open(dir, &dedup_toml("dedup", true))?;
    let (summary, dedup_s) = run_to_end(&ctx).await?;
    progress.inc(1);
    let duplicates: u64 = summary.batches.iter().map(|b| b.duplicates).sum();
    let kept: u64 = summary.batches.iter().map(|b| b.rows_out).sum();
    let mut restore = Vec::new();
    let mut size = handlers::StateSize::default();
    for _ in 0..5 {
        let started = Instant::now();
        size = handlers::restore_dedup_state(&ctx).await?;
        restore.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    progress.inc(1);
    let plain = open(
        dir,
        &dedup_toml("plain", false).replace(
            "[watermark]\ncolumn = \"tpep_pickup_datetime\"\ndelay = \"1 hour\"\n",
            "",
        ),
    )?;
    let (plain_summary, plain_s) = run_to_end(&plain).await?;
    progress.inc(1);
    progress.finish();
    let batches = summary.batches.len();
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| input | 100 files x {small} rows, one file per batch; key (PULocationID, DOLocationID), watermark delay 1 hour, 4 partitions |"
    );
    println!(
        "| sluice run with [deduplicate] | {batches} batches, {dedup_s:.3} s, {:.0} rows/s; {kept} rows kept, {duplicates} duplicates dropped |",
        (100 * small) as f64 / dedup_s
    );
    println!(
        "| the same pipeline without [deduplicate] | {} batches, {plain_s:.3} s, {:.0} rows/s |",
        plain_summary.batches.len(),
        (100 * small) as f64 / plain_s
    );
    println!(
        "| keys seen after {batches} batches | {} keys in {} partitions, {} bytes; restore {:.1} ms (median of 5) |",
        size.groups,
        size.partitions,
        size.bytes,
        crate::bench::median(restore)
    );
    Ok(())
}
