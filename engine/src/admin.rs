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
    SqlOperator::new(p.clone(), schema.clone()).check().await?;
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
        let mut next = read
            .cloned()
            .unwrap_or_else(|| Control::new(ctx.pipeline.spec_hash()));
        next.paused = paused;
        Ok((next.clone(), next))
    })
    .await
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
}

/// Read the pipeline's state and count waiting input (one listing).
pub async fn status(ctx: &Context) -> Result<Status> {
    let control = ctx.checkpoint.control().await?.map(|(c, _)| c);
    let last_commit = match control.as_ref().and_then(|c| c.last_committed) {
        Some(n) => ctx.checkpoint.commit(n).await?,
        None => None,
    };
    let waiting: Vec<ObjectMeta> = if ctx.pipeline.source.discovery == DiscoveryMode::Notify {
        // Notified files; duplicates of committed keys are counted too.
        discovery::inbox_files(&discovery::read_inbox(ctx.checkpoint.store().as_ref()).await?)
    } else {
        let index = ctx.checkpoint.index().await?;
        let listed = discovery::list_inputs(
            ctx.source.as_ref(),
            &ctx.pipeline.source,
            index.start_after.as_deref(),
        )
        .await?;
        let fresh = discovery::new_inputs(&listed, &index, ctx.pipeline.source.discovery);
        fresh
            .into_iter()
            .map(|f| ObjectMeta {
                key: f.key,
                size: f.size,
                etag: None,
                last_modified: None,
            })
            .collect()
    };
    Ok(Status {
        control,
        last_commit,
        waiting_files: waiting.len() as u64,
        waiting_bytes: waiting.iter().map(|f| f.size).sum(),
    })
}
