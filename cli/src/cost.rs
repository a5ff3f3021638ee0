//! `sluice cost`: what the last batches cost, per batch and per run, the
//! month at an arrival rate, and the always-on Spark job they replace.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sluice_engine::admin;
use sluice_engine::cost::{self, Prices, Report};
use sluice_engine::handlers::Context;

/// The price table: `--prices FILE`, else the built-in us-east-1 one.
pub fn prices(file: Option<&Path>) -> anyhow::Result<(Prices, String)> {
    match file {
        None => Ok((
            Prices::default_table(),
            "engine/prices/us-east-1.toml (built in)".into(),
        )),
        Some(f) => {
            // A price table that cannot be read is bad input (exit 4),
            // named, with what to do.
            let bad = |message: String| sluice_engine::Error::Spec {
                file: format!("--prices {}", f.display()),
                message: format!(
                    "{message}; fix the price table (see engine/prices/us-east-1.toml), or \
                     leave --prices out for the built-in us-east-1 prices"
                ),
            };
            let text = std::fs::read_to_string(f).map_err(|e| bad(e.to_string()))?;
            let p = Prices::parse(&text, &f.display().to_string()).map_err(bad)?;
            Ok((p, f.display().to_string()))
        }
    }
}

/// Dollars, with enough digits for a batch's fractions of a cent.
pub fn dollars(x: f64) -> String {
    if x >= 1.0 {
        format!("${x:.2}")
    } else {
        format!("${x:.6}")
    }
}

/// Which batches to price: at most `last`, newest first, and with
/// `since` (a duration such as "7 days") only those committed since then.
pub struct Window {
    /// At most this many.
    pub last: usize,
    /// Committed within this long before now.
    pub since: Option<String>,
}

/// The report for the batches of `ctx`'s pipeline in `window`.
pub async fn report(
    ctx: &Context,
    window: &Window,
    prices: &Prices,
    name: &str,
    rate: cost::Rate,
) -> anyhow::Result<Report> {
    let commits = commits(ctx, window).await?;
    let totals = ctx
        .checkpoint
        .control()
        .await?
        .map(|(c, _)| c.totals)
        .unwrap_or_default();
    Ok(cost::report(&commits, &totals, prices, name, rate))
}

/// The committed batches of `ctx`'s pipeline in `window`.
async fn commits(
    ctx: &Context,
    window: &Window,
) -> anyhow::Result<Vec<sluice_engine::checkpoint::Commit>> {
    let mut commits = admin::history(ctx, window.last).await?;
    if let Some(text) = &window.since {
        let us = sluice_engine::pipeline::duration_us(text)
            .map_err(|e| crate::Usage(format!("--since {text:?}: {e}")))?;
        let from = chrono::Utc::now().timestamp_millis() - us / 1000;
        commits.retain(|c| c.committed_ms >= from);
    }
    Ok(commits)
}

/// `sluice tune`.
pub async fn tune(
    ctx: &Context,
    window: &Window,
    prices_file: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (prices, name) = prices(prices_file.as_deref())?;
    let commits = commits(ctx, window).await?;
    let pace = ctx.checkpoint.control().await?.and_then(|(c, _)| c.pace);
    let r = sluice_engine::tune::tune(&commits, &prices, &ctx.pipeline.limits, pace.as_ref());
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    let p = &ctx.pipeline.name;
    if r.batches == 0 {
        println!("{p}: no committed batches to tune from");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{p}: from the last {} ({}), Lambda priced with {}",
        crate::text::count(r.batches as u64, "batch"),
        crate::text::count(r.runs as u64, "run"),
        name
    );
    for f in &r.functions {
        let measured = match f.cpu_share {
            Some(s) => format!(", CPU {:.0}% of it", s * 100.0),
            None => String::new(),
        };
        println!(
            "  {}: {} MB, {} invocations, {} ms billed{measured}",
            f.function, f.memory_mb, f.invocations, f.billed_ms
        );
        match f.recommended_mb {
            Some(_) => println!(
                "    {} a run -> {} a run; {}",
                dollars(f.per_run_now),
                dollars(f.per_run_after),
                f.why
            ),
            None => println!("    {}", f.why),
        }
    }
    match (&r.limits, &r.limits_note) {
        (Some(a), _) => print_limits(a),
        (None, Some(why)) => println!("  limits: {why}"),
        (None, None) => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// `sluice tune`'s batch and task limits.
fn print_limits(a: &sluice_engine::tune::LimitsAdvice) {
    use sluice_engine::tune::size_text;
    println!(
        "  limits: a task reads {:.1} MiB/s after {:.0} ms of fixed work ({})",
        a.task_bytes_per_s / (1024.0 * 1024.0),
        a.task_fixed_ms,
        a.fit
    );
    for l in &a.limits {
        // As it is written in the pipeline file: whole MiB or GiB as text,
        // any other size in bytes.
        let text = |v: u64| {
            if l.limit.starts_with("max_bytes") && v.is_multiple_of(1 << 20) {
                format!("\"{}\"", size_text(v))
            } else {
                v.to_string()
            }
        };
        let change = if l.now == l.recommended {
            format!("keep {}", text(l.now))
        } else {
            format!("{} -> {}", text(l.now), text(l.recommended))
        };
        println!("    {} = {change}: {}", l.limit, l.why);
    }
    let cut = if a.runs_cut == 0 {
        " (no run in the window took more than one batch: the limits cut nothing; they matter \
         when a backlog comes)"
            .to_string()
    } else {
        format!(
            " ({} cut into several batches)",
            crate::text::count(a.runs_cut as u64, "run")
        )
    };
    println!(
        "    a run's batches: {} -> {}{cut}",
        dollars(a.per_run_now),
        dollars(a.per_run_after)
    );
    let b = &a.backlog;
    println!(
        "    a backlog of {} ({} of the mean size): {}, {}, {} -> {}, {}, {}",
        size_text(b.bytes),
        crate::text::count(b.files, "file"),
        crate::text::count(b.now.batches, "batch"),
        crate::text::count(b.now.tasks, "task"),
        dollars(b.now.cost),
        crate::text::count(b.after.batches, "batch"),
        crate::text::count(b.after.tasks, "task"),
        dollars(b.after.cost)
    );
}

/// `sluice cost`.
pub async fn run(
    ctx: &Context,
    window: Window,
    prices_file: Option<PathBuf>,
    every: Option<String>,
    data_every: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (prices, name) = prices(prices_file.as_deref())?;
    let seconds = |flag: &str, text: Option<String>| -> anyhow::Result<Option<f64>> {
        match text {
            None => Ok(None),
            Some(text) => Ok(Some(
                sluice_engine::pipeline::duration_us(&text)
                    .map_err(|e| crate::Usage(format!("{flag} {text:?}: {e}")))?
                    as f64
                    / 1e6,
            )),
        }
    };
    let rate = cost::Rate {
        every_s: seconds("--every", every)?,
        data_every_s: seconds("--data-every", data_every)?,
    };
    let r = report(ctx, &window, &prices, &name, rate).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    let p = &ctx.pipeline.name;
    if r.batches.is_empty() {
        println!("{p}: no committed batches to price");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{p}: the last {} ({}), priced with {} (free tier not included)",
        crate::text::count(r.batches.len() as u64, "batch"),
        crate::text::count(r.runs, "run"),
        r.prices
    );
    print_batches(&r);
    print_totals(&r);
    print_kinesis(&r);
    Ok(ExitCode::SUCCESS)
}

/// What the batches read from a Kinesis stream, and what that added to the
/// stream's bill (nothing for a provisioned stream).
fn print_kinesis(r: &Report) {
    let reads: Vec<_> = r.batches.iter().filter_map(|b| b.kinesis).collect();
    if reads.is_empty() {
        return;
    }
    let bytes: u64 = reads.iter().map(|k| k.bytes).sum();
    let calls: u64 = reads.iter().map(|k| k.requests).sum();
    let on_demand = reads.iter().filter(|k| k.on_demand).count();
    let read = format!(
        "{} read in {} over the batches",
        crate::show::mib(bytes),
        crate::text::count(calls, "Kinesis call")
    );
    if on_demand == 0 {
        println!(
            "kinesis       {read}: the stream is provisioned, so they add nothing to its bill \
             (GetRecords is free; its shard-hours are paid whether Sluice reads or not)"
        );
    } else {
        println!(
            "kinesis       {read}: {} for the data retrieved from the on-demand stream \
             (in the totals above; the stream's own hourly and ingest charges are not)",
            dollars(r.batches_bill.kinesis)
        );
    }
}

/// `sluice cost`'s table: one line per batch, with its usage and bill (a
/// Kinesis source's: no files, and what its reads of the stream cost).
fn print_batches(r: &Report) {
    let kinesis = r.batches.iter().any(|b| b.kinesis.is_some());
    println!(
        "{:>6}  {:<20}  {:>5}  {:<8}  {:>6}  {:>10}  {:>6}  {:>8}  {:>6}  {:>8}  {:>11}  {:>11}  {:>11}  {}{:>11}",
        "batch",
        "committed",
        "epoch",
        "workflow",
        if kinesis { "shards" } else { "files" },
        "rows in",
        "calls",
        "GB-s",
        "trans.",
        "requests",
        "Lambda",
        "Step Fn",
        "S3",
        if kinesis {
            format!("{:>11}  ", "Kinesis")
        } else {
            String::new()
        },
        "total"
    );
    for b in &r.batches {
        let when = chrono::DateTime::from_timestamp_millis(b.committed_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|| "-".into());
        let read = match b.kinesis {
            Some(k) if kinesis => k.shards,
            _ => b.files,
        };
        println!(
            "{:>6}  {:<20}  {:>5}  {:<8}  {:>6}  {:>10}  {:>6}  {:>8.3}  {:>6}  {:>8}  {:>11}  {:>11}  {:>11}  {}{:>11}",
            b.batch,
            when,
            b.epoch,
            match b.workflow {
                sluice_engine::deploy::Workflow::Express => "express",
                sluice_engine::deploy::Workflow::Standard => "standard",
            },
            read,
            b.rows_in,
            b.invocations,
            b.gb_seconds,
            b.transitions,
            b.requests.total(),
            dollars(b.bill.lambda),
            dollars(b.bill.step_functions),
            dollars(b.bill.s3),
            if kinesis {
                format!("{:>11}  ", dollars(b.bill.kinesis))
            } else {
                String::new()
            },
            dollars(b.bill.total()),
        );
    }
}

/// `sluice cost`'s totals: per batch, per run, the month at the interval
/// between runs, the always-on job, and the break-even rate.
fn print_totals(r: &Report) {
    let t = &r.batches_bill;
    let kinesis = if t.kinesis > 0.0 {
        format!(", Kinesis {}", dollars(t.kinesis))
    } else {
        String::new()
    };
    println!(
        "per batch     {} (all batches: Lambda {}, Step Functions {}, S3 {}{kinesis}; and {} of \
         S3 requests after each record, the mean over all batches)",
        dollars(r.per_batch),
        dollars(t.lambda),
        dollars(t.step_functions),
        dollars(t.s3),
        dollars(r.after_commit.total())
    );
    println!(
        "per run       {} (its batches, and {} outside them: its ending and its trigger, the \
         mean over all runs)",
        dollars(r.per_run),
        dollars(r.run_end.total())
    );
    if r.batches
        .iter()
        .any(|b| b.workflow == sluice_engine::deploy::Workflow::Express)
    {
        println!(
            "workflow      express batches ran in Express executions, billed $1 per million \
             executions and their duration (64 MB, rounded up to 100 ms), not per transition: \
             in the run's ending above; a run that needs a Distributed Map or more than a few \
             minutes is handed to a Standard execution"
        );
    }
    let every = |s: f64| crate::text::duration_ms((s * 1000.0).round() as u64);
    match (r.interval_s, r.runs_per_month, r.month) {
        (Some(s), Some(n), Some(m)) => {
            println!(
                "month         {} at one run every {} ({}): {n:.0} runs",
                dollars(m),
                every(s),
                r.interval_from
            );
            if let (Some(d), Some(with), Some(idle)) = (
                r.data_interval_s,
                r.data_runs_per_month,
                r.idle_runs_per_month,
            ) {
                let basis = match r.idle_from {
                    "idle runs" => "the mean of the runs recorded as idle, and their trigger",
                    "Plan endings" => {
                        "a run's measured ending made by a Plan that found nothing left, and its \
                         trigger"
                    }
                    _ => {
                        "estimated: no idle run or ending Plan recorded yet, so the mean ending \
                         plus one Plan at the batches' mean planner duration and its idle check \
                         (one read, one listing); on AWS idle runs are recorded"
                    }
                };
                println!(
                    "              {with:.0} find data (one arrival every {}) at {} a run; {idle:.0} \
                     find nothing at {} each ({basis})",
                    every(d),
                    dollars(r.per_run),
                    dollars(r.idle_run.total())
                );
            }
        }
        _ => println!(
            "month         not projected: {}; give the arrival rate with --every (e.g. --every \"5 minutes\")",
            r.interval_note
                .as_deref()
                .unwrap_or("no interval between runs observed")
        ),
    }
    println!(
        "always on     {} a month ({} an hour; see [always_on] in the price table)",
        dollars(r.always_on_month),
        dollars(r.always_on_hourly)
    );
    if let Some(k) = r.break_even_runs_per_hour {
        println!(
            "break-even    {k:.0} runs an hour (one every {}): below that rate Sluice costs less",
            crate::text::duration_ms((3_600_000.0 / k).round() as u64)
        );
    }
}
