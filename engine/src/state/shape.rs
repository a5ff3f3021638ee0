//! A query's stateful shape: whether it keeps state between batches, and
//! a hash of everything that state depends on (the rewritten SQL, the
//! window, the watermark column, the output mode, the state partitions).
//! The planner computes it once per batch and writes it into the plan;
//! the merges and the commit read it from there. State built under one
//! shape is never merged under another.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;

use crate::checkpoint::StatefulState;
use crate::error::{Error, Result};
use crate::operators::SqlOperator;
use crate::pipeline::Pipeline;

/// The stateful shape of `pipeline`'s query reading `schema`; `None` for
/// a row-by-row query.
pub(crate) async fn of(pipeline: &Arc<Pipeline>, schema: SchemaRef) -> Result<Option<String>> {
    let op = SqlOperator::new(pipeline.clone(), schema);
    Ok(op
        .stateful()
        .await?
        .map(|q| q.shape(partition_count(pipeline))))
}

/// The stateful shape of a stateful query `q` of `pipeline` that joins
/// the static tables as `statics` pins them: their columns are part of
/// it (the state's columns follow the join's).
pub(crate) fn of_query(
    pipeline: &Pipeline,
    q: &crate::operators::StatefulQuery,
    statics: &[crate::checkpoint::StaticPin],
) -> String {
    let shape = q.shape(partition_count(pipeline));
    if statics.is_empty() {
        return shape;
    }
    let columns: Vec<String> = statics
        .iter()
        .flat_map(|p| {
            p.columns
                .iter()
                .map(move |c| format!("{}.{}:{}", p.table, c.name, c.data_type))
        })
        .collect();
    let text = format!("{shape}|{}", columns.join(","));
    format!("{:016x}", crate::hash::fnv1a(text.as_bytes()))
}

/// The shape of `pipeline`'s `[deduplicate]` reading `schema` (none
/// without one): its key columns and their types, whether keys are kept
/// forever, the event-time column and the partition count.
pub(crate) fn of_dedup(
    pipeline: &Pipeline,
    schema: &datafusion::arrow::datatypes::Schema,
) -> Option<String> {
    let d = pipeline.deduplicate.as_ref()?;
    let keys: Vec<String> = d
        .key
        .iter()
        .map(|k| {
            let t = schema
                .field_with_name(k)
                .map(|f| f.data_type().to_string())
                .unwrap_or_default();
            format!("{k}:{t}")
        })
        .collect();
    let text = format!(
        "dedup|{}|{}|{:?}|{}",
        keys.join(","),
        d.forever,
        pipeline.watermark.as_ref().map(|w| &w.column),
        partition_count(pipeline)
    );
    Some(format!("{:016x}", crate::hash::fnv1a(text.as_bytes())))
}

/// Refuse to go on with `[deduplicate]`'s shape `now` while keys seen
/// under another shape exist.
pub(crate) fn check_dedup(p: &Pipeline, s: &StatefulState, now: Option<&str>) -> Result<()> {
    if s.dedup.iter().all(Option::is_none) || now == Some(s.dedup_shape.as_str()) {
        return Ok(());
    }
    Err(Error::Incompatible {
        pipeline: p.name.clone(),
        message: "[deduplicate]'s key columns or their types, keep, the watermark column or \
                  limits.state_partitions changed (or [deduplicate] was removed) while keys \
                  seen under the old ones exist: they would be looked up in the wrong place. \
                  Restore them, or run `sluice reset` on the pipeline file to start over"
            .into(),
    })
}

/// How many state partitions the pipeline's state is split into.
fn partition_count(p: &Pipeline) -> u32 {
    p.limits.state_partitions.max(1)
}

/// Every state partition of the pipeline: one merge each.
pub(crate) fn partitions(p: &Pipeline) -> Vec<u32> {
    (0..partition_count(p)).collect()
}

/// Refuse to go on with the query's shape `now` while state built under
/// another shape exists (`s`, the committed state).
pub(crate) fn check(p: &Pipeline, s: &StatefulState, now: Option<&str>) -> Result<()> {
    if s.state.iter().all(Option::is_none) || now == Some(s.shape.as_str()) {
        return Ok(());
    }
    Err(Error::Incompatible {
        pipeline: p.name.clone(),
        message: "the query's aggregate, keys, window, watermark column, sink.mode, \
                  limits.state_partitions or the columns of a static table it joins changed \
                  while state built under the old ones exists: merging it would give wrong \
                  answers. Restore them, or run `sluice reset` on the pipeline file to start \
                  over"
            .into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(shape: &str, files: Vec<Option<String>>) -> StatefulState {
        StatefulState {
            shape: shape.into(),
            state: files,
            ..StatefulState::default()
        }
    }

    #[test]
    fn state_is_merged_only_under_the_shape_it_was_built_under() {
        let toml = "name = \"w\"\n[source]\nuri = \"in\"\nformat = \"parquet\"\ntable = \"t\"\n\
                    [query]\nsql = \"SELECT * FROM t\"\n[sink]\nuri = \"out\"\n\
                    [checkpoint]\nuri = \"ck\"\n";
        let p = Pipeline::parse(toml, "w.toml", std::path::Path::new("/tmp")).unwrap();
        let built = state("abc", vec![Some("state/0.parquet".into()), None]);
        assert!(check(&p, &built, Some("abc")).is_ok());
        for other in [Some("abd"), None] {
            let e = check(&p, &built, other).unwrap_err();
            assert!(e.to_string().contains("sluice reset"), "{e}");
        }
        // No state file yet: nothing would be merged wrongly.
        assert!(check(&p, &state("abc", vec![None, None]), Some("xyz")).is_ok());
        assert!(check(&p, &state("abc", vec![]), None).is_ok());
    }
}
