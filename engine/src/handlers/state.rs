//! The run's steps' reads of a stateful query's rules (`crate::state`):
//! the shape a plan carries, the merges a batch needs, and the check that
//! the state in force was built under the query's shape.

use super::context::Context;
use super::schema::in_force;
use crate::checkpoint::{Control, Offsets, QueryShape, SchemaVersion};
use crate::error::Result;
use crate::state::shape;

/// What a plan says of its query when it reads with `schema` (planned
/// once, written into the plan).
pub(super) async fn plan_query(
    ctx: &Context,
    schema: &SchemaVersion,
    key: String,
) -> Result<QueryShape> {
    let arrow = super::schema::arrow_of(ctx, schema, key)?;
    let pins = if ctx.pipeline.statics.is_empty() {
        Vec::new()
    } else {
        ctx.pin_statics().await?
    };
    let op = crate::operators::SqlOperator::new(ctx.pipeline.clone(), arrow.clone())
        .with_statics(pins.clone(), None);
    let query = op.stateful().await?;
    let dedup = match op.deduplicating()? {
        Some(_) => shape::of_dedup(&ctx.pipeline, &arrow),
        None => None,
    };
    let stateful = query
        .as_ref()
        .map(|q| shape::of_query(&ctx.pipeline, q, &pins));
    // A Delta sink's table is made by the first batch, rows or not: with
    // the schema of the rows its query writes.
    let table = match (&query, ctx.pipeline.sink_format) {
        (_, crate::pipeline::SinkFormat::Parquet) => None,
        (Some(q), _) => ctx.sink.delta_table_schema(&q.output)?,
        (None, _) => match op.check_output().await?.1 {
            Some(rows) => ctx.sink.delta_table_schema(&rows)?,
            None => None,
        },
    };
    Ok(QueryShape {
        stateful,
        dedup,
        spec: ctx.pipeline.spec_hash(),
        table,
    })
}

/// The stateful shape of the query a batch runs: as its plan says when
/// the plan was made from the pipeline file as it is now; otherwise (a
/// plan of an older build, which says nothing, or of a query edited since)
/// planned again from the query now and the schema the plan reads with.
/// `None`: a row-by-row query.
pub(super) async fn stateful_shape(ctx: &Context, off: &Offsets) -> Result<Option<String>> {
    if let Some(q) = &off.query
        && q.spec == ctx.pipeline.spec_hash()
    {
        return Ok(q.stateful.clone());
    }
    let schema = match &off.schema {
        Some(v) => super::schema::arrow_of(ctx, v, crate::paths::checkpoint::offsets(off.batch))?,
        None => ctx.schema().await?,
    };
    if ctx.pipeline.statics.is_empty() {
        return shape::of(&ctx.pipeline, schema).await;
    }
    let op = crate::operators::SqlOperator::new(ctx.pipeline.clone(), schema)
        .with_statics(off.statics.clone(), None);
    Ok(op
        .stateful()
        .await?
        .map(|q| shape::of_query(&ctx.pipeline, &q, &off.statics)))
}

/// The shape of the `[deduplicate]` a batch runs (`None`: none), as its
/// plan says when the plan was made from the pipeline file as it is now;
/// otherwise from the pipeline now and the schema the plan reads with.
pub(super) async fn dedup_shape(ctx: &Context, off: &Offsets) -> Result<Option<String>> {
    if let Some(q) = &off.query
        && q.spec == ctx.pipeline.spec_hash()
    {
        return Ok(q.dedup.clone());
    }
    let schema = match &off.schema {
        Some(v) => super::schema::arrow_of(ctx, v, crate::paths::checkpoint::offsets(off.batch))?,
        None => ctx.schema().await?,
    };
    Ok(shape::of_dedup(&ctx.pipeline, &schema))
}

/// The state partitions a batch's Dedup steps cover: all of them for a
/// `[deduplicate]` pipeline, none otherwise.
pub(super) async fn dedups(ctx: &Context, off: &Offsets) -> Result<Vec<u32>> {
    Ok(match dedup_shape(ctx, off).await? {
        Some(_) => shape::partitions(&ctx.pipeline),
        None => Vec::new(),
    })
}

/// The state partitions a batch's merges cover: all of them for a
/// stateful query, none for a row-by-row one.
pub(super) async fn merges(ctx: &Context, off: &Offsets) -> Result<Vec<u32>> {
    Ok(match stateful_shape(ctx, off).await? {
        Some(_) => shape::partitions(&ctx.pipeline),
        None => Vec::new(),
    })
}

/// A stateful query whose shape is not the one its state was built under
/// is refused while that state exists.
pub(crate) async fn check_state_shape(ctx: &Context, control: &Control) -> Result<()> {
    let Some(s) = &control.stateful else {
        return Ok(());
    };
    if s.state.iter().all(Option::is_none) && s.dedup.iter().all(Option::is_none) {
        return Ok(());
    }
    let schema = ctx.schema().await?;
    let reading = in_force(&ctx.pipeline, Some(control), schema.as_ref());
    let now = plan_query(ctx, &reading, crate::paths::checkpoint::CONTROL.into()).await?;
    shape::check(&ctx.pipeline, s, now.stateful.as_deref())?;
    shape::check_dedup(&ctx.pipeline, s, now.dedup.as_deref())
}
