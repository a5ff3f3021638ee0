//! `sluice show` and `sluice history`: a pipeline's state and its
//! committed batches, as a person reads them.

use super::*;

pub(crate) async fn show(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let ctx = open(path).await?;
    let status = admin::status(&ctx).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(ExitCode::SUCCESS);
    }
    let p = &ctx.pipeline;
    // A Kinesis batch reads records of shards, not files.
    let kinesis = p.source.discovery == sluice_engine::pipeline::DiscoveryMode::Kinesis;
    println!("pipeline     {}", p.name);
    if p.source.discovery == sluice_engine::pipeline::DiscoveryMode::Delta {
        println!(
            "source       {} (Delta table{})",
            p.source.location.display(),
            if p.source.ignore_changes {
                ", versions that remove files skipped"
            } else {
                ""
            }
        );
    } else {
        println!(
            "source       {} ({}, {} discovery)",
            p.source.location.display(),
            p.source.format.name(),
            p.source.discovery.name()
        );
    }
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
    match (ctx.sink.delta(), status.delta_version) {
        (false, _) => println!("sink         {}", p.sink.display()),
        (true, Some(v)) => println!(
            "sink         {} (Delta table, version {v})",
            p.sink.display()
        ),
        (true, None) => println!(
            "sink         {} (Delta table, not created yet)",
            p.sink.display()
        ),
    }
    println!("checkpoint   {}", p.checkpoint.display());
    match &status.control {
        None => println!("state        never run"),
        Some(c) => {
            print_state(c, status.holder_stopped);
            if let Some(lc) = &status.last_commit {
                print_last_batch(lc, kinesis);
            }
            if let Some(lc) = &status.last_commit {
                let run_commits = admin::run_commits(&ctx, lc.epoch).await?;
                let (prices, _) = cost::prices(None)?;
                let r = sluice_engine::cost::report(
                    &run_commits,
                    &c.totals,
                    &prices,
                    "",
                    Default::default(),
                );
                let run = r.per_run;
                println!(
                    "last run     cost {} on AWS at us-east-1 list prices (`sluice cost` for more)",
                    cost::dollars(run)
                );
            }
            print_so_far(c, kinesis);
        }
    }
    print_waiting(&status, kinesis);
    Ok(ExitCode::SUCCESS)
}

/// `sluice show`'s lease state (paused, running or idle, with its epoch,
/// owner and heartbeat) and its last committed batch.
fn print_state(c: &sluice_engine::checkpoint::Control, holder_stopped: bool) {
    let when = |ms: Option<i64>| {
        ms.and_then(chrono::DateTime::from_timestamp_millis)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|| "-".into())
    };
    let state = match (c.paused, c.status) {
        (true, _) if c.requested => "paused (a run was asked for: `sluice resume` starts it)",
        (true, _) => "paused",
        (false, sluice_engine::checkpoint::RunStatus::Running) if holder_stopped => {
            "stopped (the run holding the lease failed or was killed; the next run takes it \
             over and resumes its batch)"
        }
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
}

/// `sluice show`'s line on what the last committed batch read and wrote
/// (`kinesis`: records, not files).
fn print_last_batch(lc: &sluice_engine::checkpoint::Commit, kinesis: bool) {
    let read = match lc.stream.as_ref().filter(|_| kinesis) {
        Some(s) => count(s.records(), "record"),
        None => count(lc.files, "file"),
    };
    println!(
        "  that batch {read}, {}, {} in, {} out, {}{}",
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
            duplicates: lc.stateful.as_ref().map_or(0, |s| s.duplicates),
            added: &lc.added_columns,
            version: lc.schema_version,
        }
        .to_string()
        .replacen("  ", ", ", 1)
    );
}

/// `sluice show`'s totals so far (`kinesis`: no files), the state of a
/// stateful query, and the schema version once columns joined it.
fn print_so_far(c: &sluice_engine::checkpoint::Control, kinesis: bool) {
    let t = &c.totals;
    let files = if kinesis {
        String::new()
    } else {
        format!("{}, ", count(t.files, "file"))
    };
    println!(
        "so far       {}, {files}{}, {} in, {} out{}",
        count(t.batches, "batch"),
        mib(t.bytes),
        count(t.rows_in, "row"),
        count(t.rows_out, "row"),
        BadData {
            files: t.files_quarantined,
            rows: t.rows_quarantined,
            nulled: t.nulled_fields,
            rescued: t.rescued_fields,
            late: t.late_rows,
            duplicates: t.duplicates,
            ..BadData::default()
        }
        .to_string()
        .replacen("  ", ", ", 1)
    );
    if let Some(s) = &c.stateful {
        let held = s.state.iter().filter(|k| k.is_some()).count();
        let watermark = s
            .watermark_us
            .and_then(chrono::DateTime::from_timestamp_micros)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|| "none yet".into());
        if !s.state.is_empty() {
            println!(
                "stateful     {held} of {} partitions hold state; watermark {watermark}",
                s.state.len(),
            );
        }
        if !s.dedup.is_empty() {
            println!(
                "deduplicate  {} held in {} of {} partitions; watermark {watermark}",
                count(s.dedup_keys, "key"),
                s.dedup.iter().filter(|k| k.is_some()).count(),
                s.dedup.len(),
            );
        }
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

/// `sluice show`'s input waiting (with how long the oldest has waited;
/// `kinesis`: in shards, not partitions), the quarantined files, and the
/// files whose names cannot be keys.
fn print_waiting(status: &admin::Status, kinesis: bool) {
    let lag = match status.oldest_waiting_ms {
        Some(t) => format!(
            "; the oldest waiting for {}",
            duration_s(((chrono::Utc::now().timestamp_millis() - t).max(0) / 1000) as u64)
        ),
        None => String::new(),
    };
    if let Some(e) = &status.waiting_error {
        println!("waiting      cannot be read: {e}");
        print_quarantine(status);
        return;
    }
    match status.waiting_records {
        Some(records) => println!(
            "waiting      {} in {}{lag}",
            count(records, "record"),
            count(
                status.waiting_files,
                if kinesis { "shard" } else { "partition" }
            )
        ),
        None => println!(
            "waiting      {}, {}{lag}",
            count(status.waiting_files, "file"),
            mib(status.waiting_bytes)
        ),
    }
    print_quarantine(status);
    if !status.skipped.is_empty() {
        println!(
            "skipped      {} files whose names cannot be keys (rename them to read them): {}",
            status.skipped.len(),
            status.skipped.join(", ")
        );
    }
}

pub(crate) async fn history(path: &Path, limit: usize, json: bool) -> anyhow::Result<ExitCode> {
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
    // A Kinesis batch reads shards (one line each below it), not files.
    let kinesis = ctx.pipeline.source.discovery == sluice_engine::pipeline::DiscoveryMode::Kinesis;
    println!(
        "{:>6}  {:<20}  {:>5}  {:>6}  {:>6}  {:>10}  {:>10}  {:>8}  {:>7}  {:>8}  {:>6}  {:>8}  {:>8}  {:>9}  {:>10}  trigger",
        "batch",
        "committed",
        "epoch",
        if kinesis { "shards" } else { "files" },
        "quar.",
        "rows in",
        "rows out",
        "bad rows",
        "nulled",
        "rescued",
        "schema",
        "late",
        "dups",
        "ms",
        "cost"
    );
    let prices = sluice_engine::cost::Prices::default_table();
    for c in &commits {
        let when = chrono::DateTime::from_timestamp_millis(c.committed_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|| "-".into());
        let d = &c.durations;
        let read = match c.stream.as_ref().filter(|_| kinesis) {
            Some(s) => s.read.len() as u64,
            None => c.files,
        };
        println!(
            "{:>6}  {:<20}  {:>5}  {:>6}  {:>6}  {:>10}  {:>10}  {:>8}  {:>7}  {:>8}  {:>6}  {:>8}  {:>8}  {:>9}  {:>10}  {}",
            c.batch,
            when,
            c.epoch,
            read,
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
            c.stateful.as_ref().map_or(0, |s| s.duplicates),
            d.plan_ms + d.operate_ms + d.commit_ms,
            cost::dollars(sluice_engine::cost::commit_bill(c, &prices).total()),
            c.trigger.as_deref().unwrap_or("-")
        );
        // Which version of each static table the batch joined.
        for st in &c.statics {
            println!(
                "{:>6}  joined static table {} version {} ({}, {})",
                "",
                st.table,
                st.version,
                count(st.files, "file"),
                mib(st.bytes)
            );
        }
        // A Kinesis batch: what it read of each shard, the calls refused
        // for throughput, the records lost.
        if let Some(s) = &c.stream {
            for r in &s.read {
                println!(
                    "{:>6}  shard {}: {}, {} bytes{}{}{}",
                    "",
                    r.shard,
                    count(r.records, "record"),
                    r.bytes,
                    r.last
                        .as_deref()
                        .map(|l| format!(", up to {l}"))
                        .unwrap_or_default(),
                    if r.ended { ", read to its end" } else { "" },
                    if r.throttled > 0 {
                        format!(", {} refused for throughput", count(r.throttled, "call"))
                    } else {
                        String::new()
                    }
                );
            }
            if s.throttled > 0 {
                println!(
                    "{:>6}  the plan's calls refused for throughput: {}",
                    "", s.throttled
                );
            }
            for l in &s.lost_shards {
                println!("{:>6}  shard {}: records lost: {}", "", l.shard, l.message);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `sluice show`'s list of quarantined files, if any.
pub(crate) fn print_quarantine(status: &admin::Status) {
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
pub(crate) struct BadData<'a> {
    pub(crate) files: u64,
    pub(crate) rows: u64,
    pub(crate) nulled: u64,
    pub(crate) rescued: u64,
    pub(crate) late: u64,
    pub(crate) duplicates: u64,
    pub(crate) added: &'a [String],
    pub(crate) version: Option<u32>,
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
        if self.duplicates > 0 {
            parts.push(format!("{} dropped", count(self.duplicates, "duplicate")));
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

pub(crate) fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A pinned or declared type as a person reads it: its SQL name.
pub(crate) fn shown_type(written: &str) -> String {
    sluice_engine::pipeline::types::parse_type(written)
        .map(|t| sluice_engine::pipeline::types::type_name(&t))
        .unwrap_or_else(|_| written.to_string())
}
