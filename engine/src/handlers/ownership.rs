//! A sink belongs to one pipeline and one history of it (one checkpoint's
//! life), recorded in `_sluice/sink.json` by the first run that writes
//! there. A run checks it before it writes anything, so output of another
//! pipeline, or of an earlier checkpoint of the same pipeline (deleted to
//! start over), is never mixed with, overwritten or deleted by this one.

use super::context::Context;
use crate::checkpoint::{Control, SinkOwner};
use crate::error::{Error, ErrorClass, Result};

/// What the check before the claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SinkCheck {
    /// The sink records this pipeline and this checkpoint's history.
    Ours,
    /// The sink has no owner record (new, or written by a Sluice that kept
    /// none) and nothing in it contradicts this checkpoint: the run records
    /// itself once it holds the lease.
    Unclaimed,
    /// The sink records this pipeline, and this checkpoint has no history
    /// yet: either it was deleted since (the sink holds an earlier history:
    /// refused once this run's claim gives it a history of its own), or a
    /// concurrent first run claimed the lease and the sink just now (this
    /// run's claim then fails and it stops as busy).
    Earlier(SinkOwner),
}

/// Before the lease is taken: may this checkpoint (`control`, none for a
/// pipeline that never ran) write into the sink? One read; one listing
/// more while the sink has no owner record.
pub(super) async fn check_sink(ctx: &Context, control: Option<&Control>) -> Result<SinkCheck> {
    let history = control
        .map(|c| c.history.as_str())
        .filter(|h| !h.is_empty());
    match ctx.sink.owner().await? {
        Some(o) if o.pipeline != ctx.pipeline.name => Err(refused(
            ctx,
            format!(
                "it holds the output of pipeline \"{}\" (checkpoint {}); a sink belongs to one \
                 pipeline: give this one its own sink.uri",
                o.pipeline, o.checkpoint
            ),
        )),
        // `sluice reset` retired what it held: batches from its first on
        // are the next history's.
        Some(o) if o.history.is_empty() => unclaimed(ctx, control, o.first_batch).await,
        Some(o) if Some(o.history.as_str()) == history => Ok(SinkCheck::Ours),
        Some(o) if history.is_none() => Ok(SinkCheck::Earlier(o)),
        Some(o) => Err(earlier_history(ctx, &o, history.unwrap_or_default())),
        None => unclaimed(ctx, control, 0).await,
    }
}

/// `sluice check`: whether this checkpoint may write into the sink,
/// without writing (the checks a first claim would make included).
pub(crate) async fn check_sink_ownership(ctx: &Context, control: Option<&Control>) -> Result<()> {
    match check_sink(ctx, control).await? {
        SinkCheck::Ours => Ok(()),
        SinkCheck::Unclaimed => check_nesting(ctx).await,
        SinkCheck::Earlier(o) => Err(earlier_history(ctx, &o, "(none yet)")),
    }
}

/// The refusal of a sink that holds output of another history `o` of this
/// pipeline than `history`, this checkpoint's.
pub(super) fn earlier_history(ctx: &Context, o: &SinkOwner, history: &str) -> Error {
    refused(
        ctx,
        format!(
            "it holds the output of another history of this pipeline (checkpoint {}, history \
             {}; this checkpoint's is {history}): the checkpoint was deleted or replaced since. \
             Run `sluice reset` on the pipeline file to retire that output and start over, or \
             point sink.uri at a new folder",
            o.checkpoint, o.history
        ),
    )
}

/// A sink without an owner record (or with the one `sluice reset` leaves,
/// retiring batches below `retired`): fine if it holds no manifests from
/// `retired` on, or only manifests of this pipeline's batches this
/// checkpoint committed.
async fn unclaimed(ctx: &Context, control: Option<&Control>, retired: u64) -> Result<SinkCheck> {
    // A Delta sink over a table that is not this pipeline's: refused before
    // anything is written.
    if let Some(why) = ctx.sink.delta_foreign().await? {
        return Err(refused(ctx, why));
    }
    let mut batches = ctx.sink.manifest_batches().await?;
    batches.retain(|b| *b >= retired);
    let (Some(first), Some(last)) = (batches.first(), batches.last()) else {
        return Ok(SinkCheck::Unclaimed);
    };
    let committed = control.and_then(|c| c.last_committed);
    let known = committed.is_some_and(|l| *last <= l)
        && ctx
            .sink
            .manifest(*last)
            .await?
            .is_some_and(|m| m.pipeline == ctx.pipeline.name);
    if known {
        return Ok(SinkCheck::Unclaimed);
    }
    Err(refused(
        ctx,
        format!(
            "it holds manifests of batches {first}..={last} that this checkpoint did not commit \
             ({}); reading them with this pipeline's would mix two histories. Run `sluice \
             reset` on the pipeline file to retire them and start over, or point sink.uri at a \
             new folder",
            match committed {
                Some(l) => format!("it committed batches up to {l}"),
                None => "it committed none".into(),
            }
        ),
    ))
}

/// Once this run holds the lease of the history `control` names: record
/// it as the sink's owner (create-only, or in place of a reset's record; a
/// record written first by another must be ours).
pub(super) async fn claim_sink(ctx: &Context, control: &Control) -> Result<()> {
    check_nesting(ctx).await?;
    let mine = SinkOwner {
        pipeline: ctx.pipeline.name.clone(),
        history: control.history.clone(),
        checkpoint: ctx.checkpoint.store().describe(),
        first_batch: control.first_batch,
        epoch: control.epoch,
    };
    let there = ctx.sink.claim(&mine).await?;
    // `sluice reset` retired this run's history while the run was stopped
    // past its lease: it has lost the pipeline, not met a stranger's sink.
    if there.pipeline == mine.pipeline && there.history.is_empty() && there.epoch >= mine.epoch {
        return Err(Error::Conflict {
            pipeline: ctx.pipeline.name.clone(),
            message: format!(
                "`sluice reset` retired this run's history (epoch {}) while the run was \
                 stopped: it stops without writing",
                mine.epoch
            ),
        });
    }
    if there.pipeline != mine.pipeline || there.history != mine.history {
        return Err(refused(
            ctx,
            format!(
                "pipeline \"{}\" (checkpoint {}, history {}) claimed it first",
                there.pipeline, there.checkpoint, there.history
            ),
        ));
    }
    Ok(())
}

/// Before a sink is first claimed: it must not lie inside another
/// Sluice sink (whose readers, globbing it, would read this pipeline's
/// rows as theirs), nor hold one. One read per folder above it (up to the
/// bucket or the file system's root) and one listing of it, once.
async fn check_nesting(ctx: &Context) -> Result<()> {
    let at = &ctx.pipeline.sink;
    let mut up = at.parent();
    let mut seen = at.clone();
    while up != seen {
        // Local folders always open; S3 ones need the configuration (a
        // context over explicit stores has none: nothing to check there).
        if let Some(store) = ctx.open_counted(&up)
            && let Some(obj) = store.get(crate::paths::sink::OWNER).await?
        {
            let owner = serde_json::from_slice::<SinkOwner>(&obj.bytes)
                .map(|o| format!("pipeline \"{}\"", o.pipeline))
                .unwrap_or_else(|_| "another pipeline".into());
            return Err(refused(
                ctx,
                format!(
                    "it lies inside the sink of {owner} ({}), whose readers would read this \
                     pipeline's rows as theirs: give this pipeline a sink.uri outside it",
                    up.display()
                ),
            ));
        }
        seen = up.clone();
        up = up.parent();
    }
    let inner: Vec<String> = ctx
        .sink
        .store()
        .list("", None)
        .await?
        .into_iter()
        .map(|m| m.key)
        .filter(|k| {
            k.strip_suffix(crate::paths::sink::OWNER)
                .is_some_and(|folder| folder.ends_with('/'))
        })
        .collect();
    if let Some(k) = inner.first() {
        return Err(refused(
            ctx,
            format!(
                "it holds the sink of another pipeline ({k}), whose rows this pipeline's \
                 readers would read as its own: give this pipeline a sink.uri of its own"
            ),
        ));
    }
    Ok(())
}

fn refused(ctx: &Context, why: String) -> Error {
    Error::Run {
        pipeline: ctx.pipeline.name.clone(),
        message: format!(
            "sink {} is not this pipeline's to write: {why}; nothing was written",
            ctx.sink.store().describe()
        ),
        class: ErrorClass::InvalidInput,
    }
}
