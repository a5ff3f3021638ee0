//! `sluice bench --sink delta`: a run into a Delta table against the same
//! run into the Parquet sink (the files benchmark's query), over the same
//! generated files in the same process (alternating, the median of each),
//! and the storage requests of one batch into each. Prints ratios measured
//! in this one run; nothing here is a pass/fail test.

use std::path::Path;

use sluice_engine::pipeline::SourceFormat;
use sluice_engine::storage::RequestCounts;

use crate::bench::{files_toml, full_run, median};

/// Run the benchmark and print its report.
pub(crate) async fn run(dir: &Path, files: u64, rows: usize, rounds: usize) -> anyhow::Result<()> {
    let input = dir.join("input");
    println!(
        "generating {files} taxi files x {rows} rows (Parquet) in {}",
        dir.display()
    );
    sluice_cli::generator::write_taxi_files(&input, files, rows, SourceFormat::Parquet, None)?;
    let total = files * rows as u64;
    let mut parquet = Vec::new();
    let mut delta = Vec::new();
    let mut last = None;
    let progress = crate::progress::Progress::new(rounds.max(1) as u64, "rounds");
    for round in 0..rounds.max(1) {
        let toml = |f: &str| {
            files_toml(
                &format!("{f}{round}"),
                &format!("out/{f}{round}"),
                "out/checkpoint",
                f,
            )
        };
        let (p_s, p_ctx) = full_run(&toml("parquet"), dir, total).await?;
        let (d_s, d_ctx) = full_run(&toml("delta"), dir, total).await?;
        parquet.push(p_s);
        delta.push(d_s);
        last = Some((p_ctx, d_ctx));
        progress.inc(1);
    }
    progress.finish();
    let (p_ctx, d_ctx) = last.expect("at least one round");
    // One more batch into each: five new files, the requests it makes.
    sluice_cli::generator::write_taxi_files(&input, 5, rows, SourceFormat::Parquet, None)?;
    let batch = |ctx: sluice_engine::handlers::Context| async move {
        let before = ctx.counts();
        let summary = sluice_engine::runner::run(&ctx, |_| {}).await?;
        anyhow::ensure!(
            summary.batches.len() == 1,
            "the incremental run made {} batches, expected 1",
            summary.batches.len()
        );
        Ok::<_, anyhow::Error>((ctx.counts().since(&before), summary.batches[0].rows_out))
    };
    let (p_req, p_rows) = batch(p_ctx).await?;
    let (d_req, d_rows) = batch(d_ctx).await?;
    anyhow::ensure!(
        p_rows == d_rows,
        "the two sinks wrote {p_rows} and {d_rows} rows for the same batch"
    );
    let (p_s, d_s) = (median(parquet), median(delta));
    let rate = |s: f64| total as f64 / s;
    let shown = |r: &RequestCounts| {
        format!(
            "{} (GET {}, PUT {}, LIST {}, DELETE {})",
            r.total(),
            r.get,
            r.writes(),
            r.list,
            r.delete
        )
    };
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!("| input | {files} files, {total} rows |");
    println!(
        "| sluice run into Parquet, median of {rounds} | {p_s:.3} s, {:.0} rows/s |",
        rate(p_s)
    );
    println!(
        "| sluice run into Delta, median of {rounds} | {d_s:.3} s, {:.0} rows/s |",
        rate(d_s)
    );
    println!(
        "| **ratio Delta / Parquet** (goal >= 0.9) | **{:.2}** |",
        rate(d_s) / rate(p_s)
    );
    println!(
        "| one batch (5 files) into Parquet: storage requests | {} |",
        shown(&p_req)
    );
    println!(
        "| one batch (5 files) into Delta: storage requests | {} |",
        shown(&d_req)
    );
    Ok(())
}
