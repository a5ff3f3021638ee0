//! A stateful query's rules as the run's steps need them: its shape (is
//! it stateful, and how: computed from the query and the schema a batch
//! reads), the state partitions its merges cover, and the watermark the
//! state is under and whether it owes a batch that closes windows.

use super::context::Context;
use super::schema::in_force;
use crate::checkpoint::{Control, Offsets};
use crate::error::{Error, Result};
use crate::operators::SqlOperator;

/// The state partitions a batch's merges cover: all of them for a
/// stateful query, none for a row-by-row one.
pub(super) async fn merges(ctx: &Context, off: &Offsets) -> Result<Vec<u32>> {
    Ok(match stateful_shape(ctx, off).await? {
        Some(_) => state_partitions(ctx),
        None => Vec::new(),
    })
}

/// Every state partition of the pipeline.
pub(super) fn state_partitions(ctx: &Context) -> Vec<u32> {
    (0..ctx.pipeline.limits.state_partitions.max(1)).collect()
}

/// The stateful shape of the query a batch runs
/// ([`crate::operators::StatefulQuery::shape`]); `None` for a row-by-row
/// query.
pub(super) async fn stateful_shape(ctx: &Context, off: &Offsets) -> Result<Option<String>> {
    let schema = match &off.schema {
        Some(v) => super::schema::arrow_of(ctx, v, crate::paths::checkpoint::offsets(off.batch))?,
        None => ctx.schema().await?,
    };
    let op = SqlOperator::new(ctx.pipeline.clone(), schema);
    Ok(op
        .stateful()
        .await?
        .map(|q| q.shape(ctx.pipeline.limits.state_partitions.max(1))))
}

/// A stateful query whose shape is not the one its state was built under
/// is refused while that state exists.
pub(super) async fn check_state_shape(ctx: &Context, control: &Control) -> Result<()> {
    let Some(s) = &control.stateful else {
        return Ok(());
    };
    if s.state.iter().all(Option::is_none) {
        return Ok(());
    }
    let schema = ctx.schema().await?;
    let reading = in_force(&ctx.pipeline, Some(control), schema.as_ref());
    let op = SqlOperator::new(
        ctx.pipeline.clone(),
        super::schema::arrow_of(ctx, &reading, crate::paths::checkpoint::CONTROL.into())?,
    );
    let now = op
        .stateful()
        .await?
        .map(|q| q.shape(ctx.pipeline.limits.state_partitions.max(1)));
    if now.as_deref() != Some(s.shape.as_str()) {
        return Err(Error::Incompatible {
            pipeline: ctx.pipeline.name.clone(),
            message: "the query's aggregate, keys, window, watermark column, sink.mode or \
                      limits.state_partitions changed while state built under the old ones \
                      exists: merging it would give wrong answers. Restore them, or run \
                      `sluice reset` on the pipeline file to start over"
                .into(),
        });
    }
    Ok(())
}

/// The watermark a stateful query's state is under now: the committed
/// one, advanced to the wall clock minus `wallclock_bound` if set.
pub(super) fn current_watermark(
    p: &crate::pipeline::Pipeline,
    control: &Control,
    now_ms: i64,
) -> Option<i64> {
    let w = p.watermark.as_ref()?;
    let committed = control.stateful.as_ref().and_then(|s| s.watermark_us);
    let clock = w
        .wallclock_bound_us
        .map(|b| now_ms.saturating_mul(1000).saturating_sub(b));
    committed.max(clock).filter(|_| control.stateful.is_some())
}

/// Whether a stateful query owes a batch with no input: the watermark
/// (committed, or advanced by the wall clock) has reached the end of a
/// window still in the state. Append and update modes only: complete mode
/// keeps every window and writes them all with each batch.
pub(super) fn closing_owed(p: &crate::pipeline::Pipeline, control: &Control, now_ms: i64) -> bool {
    let Some(s) = &control.stateful else {
        return false;
    };
    if p.output_mode == crate::pipeline::OutputMode::Complete {
        return false;
    }
    match (current_watermark(p, control, now_ms), s.next_close_us) {
        (Some(now), Some(end)) => now >= end,
        _ => false,
    }
}
