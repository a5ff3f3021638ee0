//! Operating a pipeline: register it for the Lambda functions, show its
//! state, list its history, pause, resume and cancel. What a 24/7 job
//! offered for free, over the same checkpoint the runs use.

use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, Commit, Control, PipelineRecord, RunStatus};
use crate::discovery;
use crate::error::{Error, Result};
use crate::handlers::{Context, resolve_schema, swap_control, update_control};
use crate::operators::SqlOperator;
use crate::pipeline::DiscoveryMode;
use crate::pipeline::schema::columns_of;
use crate::storage::fanout::delete_all;
use crate::storage::{ObjectMeta, PutMode};

/// Register the pipeline: resolve its source schema (declared, pinned, or
/// inferred from the first input file), check its SQL against it, and write
/// `pipeline.json`, which the Lambda functions build their context from.
pub async fn register(ctx: &Context) -> Result<PipelineRecord> {
    let p = &ctx.pipeline;
    let record = ctx.checkpoint.pipeline_record().await?;
    let listed = discovery::list_inputs(ctx.source.as_ref(), &p.source, None).await?;
    let schema = resolve_schema(ctx, record.as_ref(), &listed)
        .await?
        .ok_or_else(|| Error::Spec {
            file: p.name.clone(),
            message: format!(
                "no input file under {} to infer the source schema from; declare \
                 source.schema or add a file, then register again",
                p.source.location.display()
            ),
        })?;
    let control = ctx.checkpoint.control().await?.map(|(c, _)| c);
    let reading = crate::handlers::in_force(p, control.as_ref(), &schema);
    let reading =
        crate::handlers::arrow_of(ctx, &reading, crate::paths::checkpoint::CONTROL.into())?;
    SqlOperator::new(p.clone(), reading).check().await?;
    let record = PipelineRecord {
        format_version: checkpoint::FORMAT_VERSION,
        spec_hash: p.spec_hash(),
        pipeline: (**p).clone(),
        schema: columns_of(&schema),
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

/// The committed batches still retained, newest first, at most `limit`.
pub async fn history(ctx: &Context, limit: usize) -> Result<Vec<Commit>> {
    let Some((control, _)) = ctx.checkpoint.control().await? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut n = control.last_committed;
    while let Some(b) = n {
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
    swap_control(ctx, |read| {
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
    swap_control(ctx, |read| {
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
    update_control(ctx, epoch, &|c| {
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
    /// When the oldest of them was last modified (ms since the Unix
    /// epoch), where the listing says: the lag is now minus this.
    #[serde(default)]
    pub oldest_waiting_ms: Option<i64>,
    /// Source files that are never read because their names cannot be
    /// keys (a control character such as a tab; locally, a name that is not
    /// UTF-8): rename them to read them. `list` and `ordered` discovery.
    #[serde(default)]
    pub skipped: Vec<String>,
}

/// Read the pipeline's state and count waiting input (one listing).
pub async fn status(ctx: &Context) -> Result<Status> {
    let control = ctx.checkpoint.control().await?.map(|(c, _)| c);
    let last_commit = match control.as_ref().and_then(|c| c.last_committed) {
        Some(n) => ctx.checkpoint.commit(n).await?,
        None => None,
    };
    let mut skipped = Vec::new();
    let waiting: Vec<ObjectMeta> = if ctx.pipeline.source.discovery == DiscoveryMode::Manifests {
        // The files of the source sink's manifests after the cursor.
        let index = ctx.checkpoint.index().await?;
        discovery::read_upstream(
            ctx.source.as_ref(),
            &ctx.pipeline.name,
            index.start_after.as_deref(),
        )
        .await?
        .listed()
    } else if ctx.pipeline.source.discovery == DiscoveryMode::Notify {
        // Notified files; duplicates of committed keys are counted too.
        discovery::inbox_files(&discovery::read_inbox(ctx.checkpoint.store().as_ref()).await?)
    } else {
        let index = ctx.checkpoint.index().await?;
        let (listed, unreadable) = discovery::list_readable(
            ctx.source.as_ref(),
            &ctx.pipeline.source,
            index.start_after.as_deref(),
        )
        .await?;
        skipped = unreadable;
        let unnamed = ctx.source.unnamed().await?;
        skipped.extend(
            unnamed
                .into_iter()
                .filter(|n| ctx.pipeline.source.is_input(n))
                .map(|n| format!("{n:?}")),
        );
        let fresh = discovery::new_inputs(&listed, &index, ctx.pipeline.source.discovery);
        fresh
            .into_iter()
            .map(crate::checkpoint::InputFile::into_meta)
            .collect()
    };
    Ok(Status {
        control,
        last_commit,
        waiting_files: waiting.len() as u64,
        waiting_bytes: waiting.iter().map(|f| f.size).sum(),
        oldest_waiting_ms: waiting
            .iter()
            .filter_map(|f| f.last_modified.map(|t| t.timestamp_millis()))
            .min(),
        skipped,
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
}

/// Start the pipeline over: retire its output and forget what it
/// processed, so the next run reads every source file again into a sink
/// that holds nothing of the old history. Refused while a run holds the
/// lease. First marks control `resetting` (no run starts meanwhile; the
/// epoch moves on, fencing any run of the old one), then deletes the sink's
/// manifests, parts, staged parts and owner record, then the checkpoint's
/// records, `pipeline.json` included (the next run or `sluice register`
/// records the spec again), and `control.json` last. Interrupted, it is run
/// again to the end; until then runs refuse to start.
pub async fn reset(ctx: &Context) -> Result<ResetReport> {
    let now = ctx.now();
    let ttl = ctx.ttl_ms();
    swap_control(ctx, |read| {
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
        next.epoch += u64::from(!next.resetting);
        next.status = RunStatus::Idle;
        next.owner = Some(ctx.owner.clone());
        next.resetting = true;
        next.paused = true;
        Ok((next, ()))
    })
    .await?;
    let mut report = ResetReport::default();
    let sink = ctx.sink.store();
    // Manifests first (readers that follow them see nothing rather than
    // names of deleted parts), then parts and staged parts, the owner last.
    let listed = sink.list("", None).await?;
    let sluice_owned = |k: &str| {
        k.starts_with("batch=")
            || k.starts_with("_sluice/")
            || k.starts_with(crate::paths::sink::QUARANTINE_PREFIX)
    };
    let mut order: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
    for m in listed.into_iter().filter(|m| sluice_owned(&m.key)) {
        if m.key == crate::paths::sink::OWNER {
            continue;
        }
        let manifest = m.key.starts_with(crate::paths::sink::MANIFEST_PREFIX);
        order[usize::from(!manifest)].push(m.key);
    }
    for keys in order {
        report.sink_objects += keys.len() as u64;
        delete_all(sink, keys).await?;
    }
    if sink.get(crate::paths::sink::OWNER).await?.is_some() {
        sink.delete(crate::paths::sink::OWNER).await?;
        report.sink_objects += 1;
    }
    sink.sweep_temp("_sluice/").await?;
    let store = ctx.checkpoint.store();
    let records: Vec<String> = store
        .list("", None)
        .await?
        .into_iter()
        .map(|m| m.key)
        .filter(|k| k != crate::paths::checkpoint::CONTROL)
        .collect();
    report.checkpoint_objects = records.len() as u64 + 1;
    delete_all(store, records).await?;
    store.delete(crate::paths::checkpoint::CONTROL).await?;
    tracing::info!(pipeline = %ctx.pipeline.name, ?report, "reset");
    Ok(report)
}
