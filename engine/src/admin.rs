//! Operating a pipeline: register it for the Lambda functions, show its
//! state, list its history, pause, resume and cancel. What a 24/7 job
//! offered for free, over the same checkpoint the runs use.

use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, Commit, Control, PipelineRecord, RunStatus};
use crate::discovery;
use crate::error::{Error, Result};
use crate::handlers::{Context, resolve_schema};
use crate::pipeline::ColumnSpec;
use crate::pipeline::schema::columns_of;
use crate::storage::fanout::delete_all;
use crate::storage::{ObjectMeta, PutMode};

/// Register the pipeline: resolve its source schema (declared, pinned, or
/// inferred from the first input file), check its SQL against it, and write
/// `pipeline.json`, which the Lambda functions build their context from.
pub async fn register(ctx: &Context) -> Result<PipelineRecord> {
    let p = &ctx.pipeline;
    let control = ctx.checkpoint.control().await?.map(|(c, _)| c);
    let first_batch = control.as_ref().map_or(0, |c| c.first_batch);
    // A record of a history a reset retired pins nothing.
    let record = ctx
        .checkpoint
        .pipeline_record()
        .await?
        .filter(|r| r.first_batch == first_batch);
    let listed = discovery::list_inputs(ctx.source.as_ref(), &p.source, None).await?;
    let schema = resolve_schema(ctx, record.as_ref(), &listed)
        .await?
        .ok_or_else(|| Error::Spec {
            file: p.name.clone(),
            message: if discovery::Source::of(p).is_stream() {
                let what = if p.source.discovery == crate::pipeline::DiscoveryMode::Kinesis {
                    "stream"
                } else {
                    "topic"
                };
                format!(
                    "no records of {} read yet to infer the source schema from (a run infers it \
                     from the {what}'s first records); declare source.schema, or run the \
                     pipeline once with `sluice run`, then register again",
                    p.source.location.display()
                )
            } else {
                format!(
                    "no input file under {} to infer the source schema from; declare \
                     source.schema or add a file, then register again",
                    p.source.location.display()
                )
            },
        })?;
    let reading = crate::handlers::in_force(p, control.as_ref(), &schema);
    let reading =
        crate::handlers::arrow_of(ctx, &reading, crate::paths::checkpoint::CONTROL.into())?;
    ctx.checking_operator(reading).await?.check().await?;
    let record = PipelineRecord {
        format_version: checkpoint::FORMAT_VERSION,
        spec_hash: p.spec_hash(),
        pipeline: (**p).clone(),
        schema: columns_of(&schema),
        first_batch,
    };
    ctx.checkpoint.put_pipeline_record(&record).await?;
    if let Some(registry) = &ctx.registry {
        let entry = crate::paths::registry::Entry {
            pipeline: p.name.clone(),
            source: p.source.location.display(),
            spec: p.spec_hash(),
        };
        registry
            .put(
                &crate::paths::registry::entry(&p.name),
                serde_json::to_vec_pretty(&entry)
                    .expect("serialisable")
                    .into(),
                PutMode::Overwrite,
            )
            .await?;
    }
    ctx.pin_schema(schema);
    Ok(record)
}

/// What `sluice check` found: what it checked, and what it could not check
/// yet and why. A problem is an error instead.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Checks that passed.
    pub checked: Vec<String>,
    /// Checks that could not run yet, each with why.
    pub not_yet: Vec<String>,
}

/// Every check a run makes before it writes anything, without writing:
/// the pipeline file (already parsed), the source folder, the checkpoint's
/// records, the source schema (declared, pinned or inferred from the first
/// files) and the SQL against it, and whether the sink is this pipeline's
/// to write.
pub async fn check(ctx: &Context) -> Result<CheckReport> {
    let p = &ctx.pipeline;
    let mut report = CheckReport::default();
    report
        .checked
        .push("the pipeline file: fields, values and limits".into());
    ctx.check_source_exists()?;
    report.checked.push(match &p.source.location {
        crate::storage::Location::Local(_) => {
            format!("source {} exists", p.source.location.display())
        }
        // The brokers answer and the topic is there (one metadata
        // request).
        crate::storage::Location::Kafka { .. } => format!(
            "source {}: the brokers answer, the topic has {} partitions",
            p.source.location.display(),
            discovery::topic_partitions(&p.source).await?
        ),
        // The stream answers (one ListShards request a thousand shards).
        crate::storage::Location::Kinesis { .. } => {
            let (all, open) = discovery::stream_shards(&p.source).await?;
            format!(
                "source {}: the stream answers, it has {all} shards ({open} open)",
                p.source.location.display()
            )
        }
        _ => format!(
            "source {} (its objects are first listed by a run)",
            p.source.location.display()
        ),
    });
    let control = ctx.checkpoint.control().await?.map(|(c, _)| c);
    if control.as_ref().is_some_and(|c| c.resetting) {
        return Err(Error::Run {
            pipeline: p.name.clone(),
            message: "a `sluice reset` is under way (or was interrupted); run it again to finish \
                      it"
            .into(),
            class: crate::error::ErrorClass::InvalidInput,
        });
    }
    report.checked.push(match &control {
        Some(c) => format!(
            "checkpoint {} (epoch {}, history from batch {})",
            p.checkpoint.display(),
            c.epoch,
            c.first_batch
        ),
        None => format!("checkpoint {}: never run", p.checkpoint.display()),
    });
    if let (crate::storage::Location::Kinesis { .. }, Some(c)) =
        (&ctx.pipeline.source.location, &control)
    {
        discovery::check_same_stream(&ctx.pipeline, c).await?;
    }
    check_schema_and_query(ctx, control.as_ref(), &mut report).await?;
    crate::handlers::check_sink_ownership(ctx, control.as_ref()).await?;
    report.checked.push(format!(
        "sink {} is this pipeline's to write",
        p.sink.display()
    ));
    Ok(report)
}

/// [`check`]'s source schema (declared, pinned or inferred from the first
/// files) and the SQL against it; without a schema yet, the SQL against
/// the hinted columns alone, and what waits for a file.
async fn check_schema_and_query(
    ctx: &Context,
    control: Option<&Control>,
    report: &mut CheckReport,
) -> Result<()> {
    let p = &ctx.pipeline;
    let first = control.map_or(0, |c| c.first_batch);
    let record = ctx
        .checkpoint
        .pipeline_record()
        .await?
        .filter(|r| r.first_batch == first);
    let listed = if p.source.discovery == crate::pipeline::DiscoveryMode::Delta {
        // The table's files after the cursor, as the run reads them (what
        // it refuses, refused here).
        discovery::Source::of(p)
            .waiting(&ctx.scope(), control)
            .await?
            .0
    } else {
        discovery::list_inputs(ctx.source.as_ref(), &p.source, None).await?
    };
    match resolve_schema(ctx, record.as_ref(), &listed).await? {
        Some(schema) => {
            let reading = crate::handlers::in_force(p, control, &schema);
            if p.source.discovery == crate::pipeline::DiscoveryMode::Delta
                && p.source.declared_schema().ok().flatten().is_none()
                && p.source.on_schema_change == crate::pipeline::SchemaChangePolicy::Fail
                && let Some(table) = discovery::delta_table_schema(&ctx.source, &p.name).await?
            {
                let in_force = crate::handlers::arrow_of(
                    ctx,
                    &reading,
                    crate::paths::checkpoint::CONTROL.into(),
                )?;
                let new = crate::pipeline::schema::lacking(&table, &in_force);
                if !new.is_empty() {
                    return Err(Error::Incompatible {
                        pipeline: p.name.clone(),
                        message: format!(
                            "the Delta table's schema gained column(s) {} since this pipeline \
                             pinned its schema, and under source.on_schema_change = \"fail\" \
                             a batch reading a file that holds them is refused: set \
                             on_schema_change = \"add-columns\" (they join the output) or \
                             \"rescue\", or run `sluice reset` on the pipeline file to read \
                             the table anew",
                            new.join(", ")
                        ),
                    });
                }
            }
            let reading =
                crate::handlers::arrow_of(ctx, &reading, crate::paths::checkpoint::CONTROL.into())?;
            if let (_, Some(output)) = ctx.checking_operator(reading).await?.check_output().await? {
                ctx.sink.delta_schema_check(&output).await?;
            }
            // State built under another shape (the aggregate, its keys,
            // the window, [deduplicate]'s key...) is refused by a run.
            if let Some(c) = control {
                crate::handlers::check_state_shape(ctx, c).await?;
            }
            report
                .checked
                .push(format!("source schema ({} columns)", schema.fields().len()));
            report.checked.push("query.sql against it".into());
        }
        None => {
            let waiting = if p.source.discovery == crate::pipeline::DiscoveryMode::Delta {
                format!(
                    "no Delta table under {} yet (no _delta_log/ commit) to take the schema from",
                    p.source.location.display()
                )
            } else if p.source.discovery == crate::pipeline::DiscoveryMode::Kinesis {
                format!(
                    "no records of {} read yet (a run infers the schema from the stream's first \
                     records), and no source.schema declared (declare it to check everything \
                     now)",
                    p.source.location.display()
                )
            } else {
                format!(
                    "no input file under {} to infer the schema from, and no source.schema \
                     declared (declare it to check everything now)",
                    p.source.location.display()
                )
            };
            match crate::handlers::check_against_hints(ctx, control).await? {
                crate::handlers::HintCheck::Planned(n) => {
                    report.checked.push(format!(
                        "query.sql against the {n} hinted column{} alone",
                        if n == 1 { "" } else { "s" }
                    ));
                    report
                        .not_yet
                        .push(format!("the rest of the source schema: {waiting}"));
                }
                crate::handlers::HintCheck::Waits(missing) => {
                    report.checked.push(
                        "query.sql's syntax and tables (planned against the hinted columns \
                         alone)"
                            .into(),
                    );
                    report.not_yet.push(format!(
                        "the source schema and the query's columns: {waiting}; query.sql names \
                         a column no hint covers ({missing})"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The batches the run of `epoch` committed that are still retained,
/// oldest first: back from the last committed batch while the epoch is
/// the same (the last run's, for `sluice show`'s cost of the last run and
/// `sluice refresh --wait`'s report).
pub async fn run_commits(ctx: &Context, epoch: u64) -> Result<Vec<Commit>> {
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

/// The committed batches still retained, newest first, at most `limit`.
pub async fn history(ctx: &Context, limit: usize) -> Result<Vec<Commit>> {
    let Some((control, _)) = ctx.checkpoint.control().await? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut n = control.last_committed;
    // Batches before this history's first are a retired history's.
    while let Some(b) = n.filter(|b| *b >= control.first_batch) {
        if out.len() >= limit {
            break;
        }
        match ctx.checkpoint.commit(b).await? {
            Some(c) => out.push(c),
            None => break, // pruned past retain_batches
        }
        n = b.checked_sub(1);
    }
    Ok(out)
}

/// Pause or resume the pipeline (compare-and-swap on `control.json`). A
/// paused pipeline's triggers record `requested` and start nothing; a run
/// already going finishes. Returns the record written.
pub async fn set_paused(ctx: &Context, paused: bool) -> Result<Control> {
    ctx.checkpoint
        .change_control(|read| {
            if read.is_some_and(|c| c.resetting) {
                return Err(Error::Run {
                    pipeline: ctx.pipeline.name.clone(),
                    message: "a `sluice reset` is under way (or was interrupted); run it again to \
                          finish it"
                        .into(),
                    class: crate::error::ErrorClass::InvalidInput,
                });
            }
            let mut next = read
                .cloned()
                .unwrap_or_else(|| Control::new(ctx.pipeline.spec_hash()));
            next.paused = paused;
            Ok((next.clone(), next))
        })
        .await
}

/// Ask the next run to read quarantined input files again (`sluice
/// retry-quarantined`): all of them, or the one with `key`, after they were
/// fixed or replaced under the same key. Their entries move from
/// `control.quarantined` to `control.retry` (one compare-and-swap); the
/// next planned batch takes them and its commit clears them, so each is
/// processed once (or set aside again if still unreadable). Returns the
/// keys asked for.
pub async fn retry_quarantined(ctx: &Context, key: Option<&str>) -> Result<Vec<String>> {
    ctx.checkpoint
        .change_control(|read| {
            let Some(c) = read else {
                return Err(nothing_quarantined(ctx, key));
            };
            let mut next = c.clone();
            let (asked, kept): (Vec<_>, Vec<_>) = next
                .quarantined
                .into_iter()
                .partition(|q| key.is_none_or(|k| q.key == k));
            if asked.is_empty() {
                return Err(nothing_quarantined(ctx, key));
            }
            next.quarantined = kept;
            let keys: Vec<String> = asked.into_iter().map(|q| q.key).collect();
            for k in &keys {
                if !next.retry.contains(k) {
                    next.retry.push(k.clone());
                }
            }
            Ok((next, keys))
        })
        .await
}

fn nothing_quarantined(ctx: &Context, key: Option<&str>) -> Error {
    Error::Run {
        pipeline: ctx.pipeline.name.clone(),
        message: match key {
            // A stream's bad records are rows, never read again.
            _ if ctx.pipeline.source.discovery == crate::pipeline::DiscoveryMode::Kinesis => {
                "a kinesis:// source quarantines no file to read again: its bad records are kept \
                 as rows under the sink's _quarantine/"
                    .to_string()
            }
            Some(k) => format!(
                "no quarantined file has key {k}; `sluice show` lists the quarantined files"
            ),
            None => "no input file is quarantined".to_string(),
        },
        class: crate::error::ErrorClass::InvalidInput,
    }
}

/// Give up the lease of the run with `epoch` on its behalf (`sluice
/// cancel`, after its execution was stopped): the lease becomes idle with
/// the epoch kept, so the stopped run can write nothing more and the next
/// run resumes the planned batch.
pub async fn release_cancelled(ctx: &Context, epoch: u64) -> Result<Control> {
    let now = ctx.now();
    ctx.checkpoint
        .update_control(epoch, &|c| {
            c.status = RunStatus::Idle;
            c.resume = true;
            c.heartbeat_ms = Some(now);
        })
        .await
}

/// What `sluice show` prints: the checkpoint's state and what is waiting.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// The control record, if the pipeline ever ran.
    pub control: Option<Control>,
    /// The last commit record.
    pub last_commit: Option<Commit>,
    /// Input files not yet in a committed batch.
    pub waiting_files: u64,
    /// Their bytes.
    pub waiting_bytes: u64,
    /// A record stream: the records after the cursor, in
    /// `waiting_files` partitions (no bytes are known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_records: Option<u64>,
    /// When the oldest of them was last modified (ms since the Unix
    /// epoch), where the listing says: the lag is now minus this.
    #[serde(default)]
    pub oldest_waiting_ms: Option<i64>,
    /// Source files that are never read because their names cannot be
    /// keys (a control character such as a tab; locally, a name that is not
    /// UTF-8): rename them to read them. `list` and `ordered` discovery.
    #[serde(default)]
    pub skipped: Vec<String>,
    /// The source schema pinned at the first run (or declared), types by
    /// their SQL names; `None` before the first run infers it.
    #[serde(default)]
    pub schema: Option<Vec<ColumnSpec>>,
    /// A Delta sink: the table's version (`None` before its first commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_version: Option<u64>,
    /// Why what waits could not be read (the source refuses the next
    /// batch, e.g. a Delta version that removes files): the next run
    /// fails with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_error: Option<String>,
    /// The lease is held by a run that is no longer running (its process
    /// is gone, or its heartbeat expired): a run that failed or was
    /// killed. The next run takes the lease over and resumes its batch.
    #[serde(default)]
    pub holder_stopped: bool,
}

/// Read the pipeline's state and count waiting input (one listing).
pub async fn status(ctx: &Context) -> Result<Status> {
    let control = ctx.checkpoint.control().await?.map(|(c, _)| c);
    let last_commit = match control.as_ref().and_then(|c| c.last_committed) {
        Some(n) => ctx.checkpoint.commit(n).await?,
        None => None,
    };
    // A source that refuses what comes next (a Delta version that removes
    // files, a replaced table) is shown, not a reason to show nothing.
    let (waiting, skipped, waiting_error) = match discovery::Source::of(&ctx.pipeline)
        .waiting(&ctx.scope(), control.as_ref())
        .await
    {
        Ok((w, s)) => (w, s, None),
        Err(e @ (Error::Input { .. } | Error::Incompatible { .. } | Error::Spec { .. })) => {
            (Vec::new(), Vec::new(), Some(e.to_string()))
        }
        Err(e) => return Err(e),
    };
    let stream = discovery::Source::of(&ctx.pipeline).is_stream();
    let schema = match ctx.checkpoint.pipeline_record().await? {
        Some(r) => Some(r.schema),
        None => ctx.pipeline.source.schema.clone(),
    };
    Ok(Status {
        schema,
        last_commit,
        waiting_files: waiting.len() as u64,
        waiting_bytes: if stream {
            0
        } else {
            waiting.iter().map(|f| f.size).sum()
        },
        waiting_records: stream.then(|| waiting.iter().map(|f| f.size).sum()),
        oldest_waiting_ms: waiting
            .iter()
            .filter_map(|f| f.last_modified.map(|t| t.timestamp_millis()))
            .min(),
        skipped,
        delta_version: ctx.sink.delta_version().await?,
        waiting_error,
        holder_stopped: control.as_ref().is_some_and(|c| {
            c.status == RunStatus::Running
                && (c.owner.as_deref().is_some_and(|o| (ctx.owner_gone)(o))
                    || ctx.now() - c.heartbeat_ms.unwrap_or(i64::MIN / 2) > ctx.ttl_ms())
        }),
        control,
    })
}

/// What `sluice reset` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetReport {
    /// Objects removed from the sink (parts, staged parts, manifests, its
    /// owner record).
    pub sink_objects: u64,
    /// Objects removed from the checkpoint.
    pub checkpoint_objects: u64,
    /// Another `sluice reset` finished this one while it was stopped (the
    /// history after it may already have run): nothing of that history
    /// was touched.
    #[serde(default)]
    pub finished_by_another: bool,
}

/// Start the pipeline over: retire its output and forget what it
/// processed, so the next run reads every source file again into a sink
/// that holds nothing of the old history. Refused while a run holds the
/// lease.
///
/// The next history starts past every batch number and epoch the retired
/// one used (`control.json` is kept, with `first_batch` past them), and its
/// index and claims live under its own names: so whatever a run of the
/// retired history, stopped past its lease, writes late lands where the new
/// history never reads, and publishes nothing (reset removes the staged
/// files every publish copies from, before anything else). Steps: mark
/// control `resetting` (no run starts meanwhile; the epoch moves on,
/// fencing any run of the old one); delete the sink's staged files, then
/// its manifests, then its parts and side outputs, of batches below the new
/// first batch; record in `_sluice/sink.json` that they are retired; delete
/// the checkpoint's records of those batches and the index, claims and
/// pinned spec of earlier histories (the notify inbox stays: what it names
/// is read again); clear control for the new history. Interrupted, it is
/// run again to the end; until then runs refuse to start. A reset resumed
/// late deletes only what is below its first batch, so it cannot touch the
/// history that followed it.
pub async fn reset(ctx: &Context) -> Result<ResetReport> {
    // A Delta table another writer made append-only: refused before
    // anything changes.
    ctx.sink.check_reset().await?;
    let marked = mark_resetting(ctx).await?;
    let sink = ctx.sink.store();
    let store = ctx.checkpoint.store();
    // Listed once the mark is in: no run of the new history can have
    // written yet.
    let sink_keys = sink.list("", None).await?;
    let records = store.list("", None).await?;
    let marked = past_used_batches(ctx, marked, &sink_keys, &records).await?;
    let first = marked.first_batch;
    let sink_objects = retire_sink(ctx, &sink_keys, &marked).await?;
    let checkpoint_objects = retire_records(ctx, records, first).await?;
    let done = clear_control(ctx, &marked).await?;
    let report = ResetReport {
        sink_objects,
        checkpoint_objects,
        finished_by_another: !done,
    };
    if !done {
        tracing::info!(pipeline = %ctx.pipeline.name, "another reset finished this one");
    }
    tracing::info!(pipeline = %ctx.pipeline.name, ?report, first_batch = first, "reset");
    Ok(report)
}

/// [`reset`]'s first step: mark control `resetting` (refused while a run
/// holds the lease). The epoch moves on, fencing any run of the old one,
/// and the new history starts at the next batch; a reset resumed keeps the
/// mark it made.
async fn mark_resetting(ctx: &Context) -> Result<Control> {
    let now = ctx.now();
    let ttl = ctx.ttl_ms();
    ctx.checkpoint
        .change_control(|read| {
            if let Some(c) = read
                && !c.resetting
            {
                let gone = c.owner.as_deref().is_some_and(|o| (ctx.owner_gone)(o));
                if let checkpoint::Claim::Busy { owner, .. } =
                    checkpoint::decide_claim(Some(c), now, ttl, gone)
                {
                    return Err(Error::Run {
                        pipeline: ctx.pipeline.name.clone(),
                        message: format!(
                            "a run holds the lease ({owner}); cancel it or let it finish, then reset"
                        ),
                        class: crate::error::ErrorClass::Conflict,
                    });
                }
            }
            let mut next = read
                .cloned()
                .unwrap_or_else(|| Control::new(ctx.pipeline.spec_hash()));
            if !next.resetting {
                next.epoch = next_epoch(ctx, next.epoch)?;
                next.first_batch = next.next_batch();
            }
            next.status = RunStatus::Idle;
            next.owner = Some(ctx.owner.clone());
            next.resetting = true;
            next.paused = true;
            Ok((next.clone(), next))
        })
        .await
}

/// `marked` with its first batch moved past every batch number the sink
/// and the checkpoint hold (`sink_keys`, `records`: a checkpoint deleted by
/// hand, plans written beyond the last commit).
async fn past_used_batches(
    ctx: &Context,
    marked: Control,
    sink_keys: &[ObjectMeta],
    records: &[ObjectMeta],
) -> Result<Control> {
    let used = sink_keys
        .iter()
        .filter_map(|m| sink_batch(&m.key))
        .chain(records.iter().filter_map(|m| checkpoint_batch(&m.key)))
        .max()
        .map_or(0, |n| n + 1);
    if used > marked.first_batch {
        ctx.checkpoint
            .change_control(|read| match read {
                Some(c) if c.resetting && c.epoch == marked.epoch => {
                    let mut next = c.clone();
                    next.first_batch = next.first_batch.max(used);
                    Ok((next.clone(), next))
                }
                _ => Err(taken_over(ctx)),
            })
            .await
    } else {
        Ok(marked)
    }
}

/// Delete the sink's objects of batches below `marked`'s first (of
/// `sink_keys`, then any staged since) and record in the sink that they
/// are retired. Returns how many objects went.
async fn retire_sink(ctx: &Context, sink_keys: &[ObjectMeta], marked: &Control) -> Result<u64> {
    let sink = ctx.sink.store();
    let first = marked.first_batch;
    let mut removed: u64 = 0;
    // Staged files first (every publish copies from them), then manifests
    // (readers that follow them see nothing rather than names of deleted
    // parts), then parts and side outputs, from a listing made after the
    // staged files went.
    let rank_of = |key: &str| {
        if key.starts_with(crate::paths::sink::STAGING_PREFIX) {
            0
        } else if key.starts_with(crate::paths::sink::MANIFEST_PREFIX) {
            1
        } else {
            2
        }
    };
    let retired = |key: &str| sink_batch(key).is_some_and(|b| b < first);
    let staged: Vec<String> = sink_keys
        .iter()
        .map(|m| m.key.clone())
        .filter(|k| retired(k) && rank_of(k) == 0)
        .collect();
    removed += staged.len() as u64;
    delete_all(sink, staged).await?;
    // Anything staged since the listing above.
    let late: Vec<String> = sink
        .list(crate::paths::sink::STAGING_PREFIX, None)
        .await?
        .into_iter()
        .map(|m| m.key)
        .filter(|k| retired(k))
        .collect();
    removed += late.len() as u64;
    delete_all(sink, late).await?;
    // Listed again now that nothing of the retired batches is staged: a
    // run stopped past its lease may have published a part or a side
    // output (copied from its staged file) after the first listing and
    // before the staged files went; after this point its copies find no
    // staged file. Manifests go first, then parts and side outputs.
    let mut order: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
    for m in sink.list("", None).await? {
        let rank = rank_of(&m.key);
        if rank > 0 && retired(&m.key) {
            order[rank - 1].push(m.key);
        }
    }
    for keys in order {
        removed += keys.len() as u64;
        delete_all(sink, keys).await?;
    }
    if ctx
        .sink
        .retire(
            first,
            marked.epoch,
            &marked.history,
            &ctx.checkpoint.store().describe(),
        )
        .await?
    {
        removed += 1;
        // A Delta sink: once the owner record is retired, one commit that
        // removes every live file and marks the table retired, so a run
        // of the old history stopped past its lease can publish nothing
        // (sinks::delta). Readers of the table's latest version between
        // the deletes above and this commit find its files gone.
        if ctx.sink.delta() {
            ctx.sink.retire_table(ctx.now(), &marked.history).await?;
            removed += 1;
        }
    }
    sink.sweep_temp("_sluice/").await?;
    Ok(removed)
}

/// Delete the checkpoint's records of batches below `first` (of
/// `records`), the index and claims of earlier histories, and the spec and
/// schema the retired history pinned. Returns how many objects went.
async fn retire_records(ctx: &Context, records: Vec<ObjectMeta>, first: u64) -> Result<u64> {
    let store = ctx.checkpoint.store();
    let retired: Vec<String> = records
        .into_iter()
        .map(|m| m.key)
        .filter(|k| checkpoint_batch(k).is_some_and(|b| b < first) || index_retired(k, first))
        .collect();
    let mut removed = retired.len() as u64;
    delete_all(store, retired).await?;
    // The spec and schema the retired history pinned (a record of the new
    // history, written since by a run or `sluice register`, stays).
    if let Some((r, etag)) = ctx.checkpoint.pipeline_record_tagged().await?
        && r.first_batch < first
        && store
            .delete_if(crate::paths::checkpoint::PIPELINE, &etag)
            .await?
    {
        removed += 1;
    }
    Ok(removed)
}

/// [`reset`]'s last step: clear control for the new history starting at
/// `marked`'s first batch. `false` when another `sluice reset` finished
/// this one meanwhile.
async fn clear_control(ctx: &Context, marked: &Control) -> Result<bool> {
    let first = marked.first_batch;
    let spec = ctx.pipeline.spec_hash();
    ctx.checkpoint
        .change_control(|read| match read {
            Some(c) if c.resetting && c.epoch == marked.epoch => {
                let mut next = Control::new(spec.clone());
                next.epoch = c.epoch;
                next.first_batch = first;
                Ok((next, true))
            }
            // Finished by another `sluice reset` meanwhile.
            Some(c) if !c.resetting && c.first_batch >= first => Ok((c.clone(), false)),
            _ => Err(taken_over(ctx)),
        })
        .await
}

/// A reset found control changed under it by another reset.
fn taken_over(ctx: &Context) -> Error {
    Error::Run {
        pipeline: ctx.pipeline.name.clone(),
        message: "control.json changed under this reset (another reset took it over); run \
                  `sluice reset` again"
            .into(),
        class: crate::error::ErrorClass::Conflict,
    }
}

/// The epoch after `epoch`; one that cannot grow is a broken record.
fn next_epoch(ctx: &Context, epoch: u64) -> Result<u64> {
    epoch.checked_add(1).ok_or_else(|| Error::Checkpoint {
        pipeline: ctx.pipeline.name.clone(),
        key: crate::paths::checkpoint::CONTROL.into(),
        message: format!(
            "epoch {epoch} cannot grow; the record was edited by hand: restore it from a backup"
        ),
    })
}

/// The batch a Sluice-owned sink key belongs to (parts, manifests, side
/// outputs, staged files); `None` for the owner record and anything else.
fn sink_batch(key: &str) -> Option<u64> {
    use crate::paths::sink;
    if let Some(n) = sink::manifest_batch(key) {
        return Some(n);
    }
    let owned = key.starts_with("batch=")
        || key.starts_with(sink::STAGING_PREFIX)
        || key.starts_with(sink::QUARANTINE_PREFIX)
        || key.starts_with(sink::LATE_PREFIX);
    owned.then(|| sink::published_batch(key)).flatten()
}

/// The batch a numbered checkpoint record belongs to (plans, commits, work
/// files, state files).
fn checkpoint_batch(key: &str) -> Option<u64> {
    use crate::paths::checkpoint as ck;
    if key.starts_with(ck::OFFSETS_PREFIX) || key.starts_with(ck::COMMITS_PREFIX) {
        return ck::batch_of(key);
    }
    if let Some(rest) = key.strip_prefix("work/") {
        return rest.split('/').next()?.parse().ok();
    }
    if key.starts_with(ck::STATE_PREFIX) {
        return ck::state_batch(key);
    }
    None
}

/// An index or claim of a history before the one starting at `first`.
fn index_retired(key: &str, first: u64) -> bool {
    crate::paths::checkpoint::index_history(key).is_some_and(|h| h < first)
}
