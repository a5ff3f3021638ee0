//! A record-stream source (a Kafka topic) as the source seam asks it: the
//! idle look, where a run starts in each partition (new partitions from
//! their earliest offset, records lost to retention under
//! `on_data_loss`), the run's end offsets (captured once, by the plan:
//! Spark's `Trigger.AvailableNow`), its batches, and what waits.

use std::collections::BTreeMap;

use super::kafka::{self, At, RecordLog};
use super::source::{Look, Looked, Scope, Seen};
use crate::checkpoint::{Control, RecordRange, StreamPlan};
use crate::error::{Error, Result};
use crate::pipeline::{DataLossPolicy, StartingOffsets};
use crate::planning;
use crate::storage::{ObjectMeta, PutMode};

/// Records a look samples to infer a schema from.
const SAMPLE: i64 = 100;

/// What waits in each partition when a run plans: from each partition's
/// cursor up to the end offsets the plan captured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// Where each partition starts.
    pub from: BTreeMap<i32, i64>,
    /// Where the run stops in each partition.
    pub until: BTreeMap<i32, i64>,
    /// Records lost to retention, passed over (`on_data_loss = "skip"`).
    pub lost: Vec<RecordRange>,
    /// A Kinesis stream: the next batch's shard units (one batch a plan).
    pub shards: Vec<crate::checkpoint::ShardUnit>,
    /// A Kinesis stream: shards whose unread records were lost, passed
    /// over (`on_data_loss = "skip"`).
    pub shard_losses: Vec<crate::checkpoint::ShardLoss>,
    /// A Kinesis stream: calls of the Plan step refused for throughput.
    pub throttled: u64,
    /// A Kinesis stream: calls the Plan step made.
    pub requests: u64,
    /// A Kinesis stream in on-demand capacity mode when the run looked.
    pub on_demand: bool,
}

impl Waiting {
    /// Whether no record waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.shards.is_empty()
            && self
                .until
                .iter()
                .all(|(p, end)| self.from.get(p).is_none_or(|s| s >= end))
    }

    /// The run's batches of about `max_records` records each, each with
    /// every partition's offset after it; the first names the loss.
    pub(crate) fn batches(&self, max_records: u64) -> Vec<StreamPlan> {
        if !self.shards.is_empty() {
            return vec![StreamPlan {
                shards: self.shards.clone(),
                lost_shards: self.shard_losses.clone(),
                throttled: self.throttled,
                requests: self.requests,
                on_demand: self.on_demand,
                ..Default::default()
            }];
        }
        let mut next = self.from.clone();
        let mut lost = self.lost.clone();
        planning::split_record_batches(&self.from, &self.until, max_records)
            .into_iter()
            .map(|ranges| {
                for r in &ranges {
                    next.insert(r.partition, r.end);
                }
                StreamPlan {
                    next: next.clone(),
                    ranges,
                    lost: std::mem::take(&mut lost),
                    ..Default::default()
                }
            })
            .collect()
    }
}

/// The idle look: a settled pipeline whose every partition's end offset
/// is its cursor (an empty partition it has no cursor for counts as at
/// its end; a cursor past the end, or a partition gone, is not idle: the
/// plan refuses or passes over the loss) has nothing to do (one connection's metadata request, a
/// topic listing and one offsets request per partition). Otherwise a few
/// waiting records are sampled into the source's memory store as a file,
/// for the schema (a pipeline that has not started yet samples the last
/// records, whatever `starting_offsets` says: only to infer from).
pub(crate) async fn look(
    ctx: &Scope<'_>,
    control: Option<&Control>,
    settled: bool,
) -> Result<Look> {
    let log = kafka::open(&ctx.pipeline.source).await?;
    let parts = log.partitions().await?;
    let ends = log.offsets(&parts, At::Latest).await?;
    let cursor = control.map(|c| &c.stream_offsets).filter(|c| !c.is_empty());
    if let Some(cursor) = cursor
        && settled
        && cursor.keys().all(|p| ends.contains_key(p))
        && ends
            .iter()
            .all(|(p, end)| cursor.get(p).map_or(*end == 0, |c| c == end))
    {
        return Ok(Look::Idle);
    }
    let earliest = log.offsets(&parts, At::Earliest).await?;
    let moved = cursor.is_some_and(|c| {
        c.iter()
            .any(|(p, at)| ends.get(p).is_none_or(|end| at > end || *at < earliest[p]))
    });
    let sample = ends.iter().find_map(|(p, end)| {
        let first = earliest.get(p).copied().unwrap_or(0);
        let start = match cursor.and_then(|c| c.get(p)) {
            Some(c) if c > end => first,
            Some(c) => (*c).max(first),
            None if cursor.is_some() => first,
            None => (end - SAMPLE).max(first),
        };
        (start < *end).then_some(RecordRange {
            partition: *p,
            start,
            end: (*end).min(start + SAMPLE),
        })
    });
    let mut listed = Vec::new();
    if let Some(range) = sample {
        let topic = topic(ctx);
        let mut body = Vec::new();
        let raw = ctx.pipeline.source.raw;
        for r in log.fetch(range).await? {
            // Only records that read: the sample is for inferring the
            // schema; bad records meet the bad-row policy when read.
            // Tombstones and empty objects hold no columns to infer.
            if let Some(line) = kafka::sample_line(topic, range.partition, raw, &r) {
                body.extend(line);
                body.push(b'\n');
            }
        }
        // No record with fields: no file to infer from (a run with a
        // pinned schema goes on all the same, records wait).
        if !body.is_empty() {
            let key = crate::paths::stream::unit(range.partition, range.start, range.end);
            let size = body.len() as u64;
            ctx.source
                .put(&key, body.into(), PutMode::Overwrite)
                .await?;
            listed.push(ObjectMeta {
                key,
                size,
                etag: None,
                last_modified: None,
            });
        }
    }
    let waits = cursor.is_some() && sample.is_some();
    let due = moved || waits || !listed.is_empty();
    Ok(Look::Maybe(Looked::sampled(listed, due)))
}

/// Before the lease: whether the run goes on. A pipeline that has not
/// started goes on (its first run records where it starts), as does one
/// whose look sampled waiting records, one owed work, and a recovery.
pub(crate) fn pending(
    control: Option<&Control>,
    looked: &Looked,
    recover: bool,
    owed: bool,
) -> Option<Seen> {
    let started = control.is_some_and(|c| !c.stream_offsets.is_empty());
    (recover || owed || !started || looked.stream_due).then_some(Seen::Nothing)
}

/// The topic a `kafka://` source reads.
fn topic<'a>(ctx: &'a Scope<'_>) -> &'a str {
    match &ctx.pipeline.source.location {
        crate::storage::Location::Kafka { topic, .. } => topic,
        _ => "",
    }
}

/// Under the lease: what waits, from the cursor to the end offsets now
/// (captured here, once per plan of new input). A pipeline that has not
/// started, or whose start moved (records lost and passed over), records
/// its cursor now, so the start holds even when no batch follows.
pub(crate) async fn find_new(ctx: &Scope<'_>, epoch: u64, control: &Control) -> Result<Waiting> {
    let log = kafka::open(&ctx.pipeline.source).await?;
    let waiting = where_to_start(ctx, log.as_ref(), control).await?;
    if waiting.from != control.stream_offsets || control.stream_topic != topic(ctx) {
        let from = waiting.from.clone();
        let name = topic(ctx).to_string();
        ctx.checkpoint
            .update_control(epoch, &|c| {
                c.stream_offsets = from.clone();
                c.stream_topic = name.clone();
            })
            .await?;
    }
    Ok(waiting)
}

/// Each partition's start and end: the cursor, or for a partition it does
/// not name, the earliest offset (the latest for a pipeline that has not
/// started under `starting_offsets = "latest"`); a cursor the topic no
/// longer holds (retention passed it, or the topic was re-created with
/// fewer records or partitions) is data loss.
async fn where_to_start(
    ctx: &Scope<'_>,
    log: &dyn RecordLog,
    control: &Control,
) -> Result<Waiting> {
    let source = &ctx.pipeline.source;
    if !control.stream_offsets.is_empty()
        && !control.stream_topic.is_empty()
        && control.stream_topic != topic(ctx)
    {
        return Err(Error::Incompatible {
            pipeline: ctx.pipeline.name.clone(),
            message: format!(
                "source.uri now names topic \"{}\", but the checkpoint's offsets are topic \
                 \"{}\"'s: reading them in another topic would skip or repeat records. Restore \
                 source.uri, or run `sluice reset` on the pipeline file to start over",
                topic(ctx),
                control.stream_topic
            ),
        });
    }
    let parts = log.partitions().await?;
    let earliest = log.offsets(&parts, At::Earliest).await?;
    let until = log.offsets(&parts, At::Latest).await?;
    let cursor = &control.stream_offsets;
    let fresh = cursor.is_empty();
    let mut from = BTreeMap::new();
    let mut lost = Vec::new();
    let mut losses = Vec::new();
    for p in &parts {
        let (first, end) = (earliest[p], until[p]);
        let start = match cursor.get(p) {
            None if fresh && source.starting_offsets == StartingOffsets::Latest => end,
            None => first,
            Some(c) if *c < first => {
                lost.push(RecordRange {
                    partition: *p,
                    start: *c,
                    end: first,
                });
                losses.push(format!(
                    "partition {p}: offsets {c} to {} were removed (retention) before they were \
                     read",
                    first - 1
                ));
                first
            }
            Some(c) if *c > end => {
                losses.push(format!(
                    "partition {p}: the topic ends at offset {end}, before the {c} already read \
                     (was it deleted and created again?)"
                ));
                first
            }
            Some(c) => *c,
        };
        from.insert(*p, start);
    }
    for p in cursor.keys().filter(|p| !parts.contains(p)) {
        losses.push(format!("partition {p} is gone from the topic"));
    }
    if !losses.is_empty() {
        if source.on_data_loss == DataLossPolicy::Fail {
            return Err(Error::Input {
                pipeline: ctx.pipeline.name.clone(),
                batch: Some(control.next_batch()),
                key: topic(ctx).to_string(),
                message: format!(
                    "{}; nothing was read. Set source.on_data_loss = \"skip\" to go on from the \
                     earliest records left (the loss is recorded), or `sluice reset` to start \
                     over",
                    losses.join("; ")
                ),
            });
        }
        tracing::warn!(pipeline = %ctx.pipeline.name, lost = %losses.join("; "), "records lost; going on from the earliest left (on_data_loss = \"skip\")");
    }
    Ok(Waiting {
        from,
        until,
        lost,
        ..Default::default()
    })
}

/// What waits (`sluice show`): one entry per partition with records after
/// the cursor, its size the number of records, its time the first waiting
/// record's timestamp (one fetch per such partition).
pub(crate) async fn waiting(ctx: &Scope<'_>, control: Option<&Control>) -> Result<Vec<ObjectMeta>> {
    let log = kafka::open(&ctx.pipeline.source).await?;
    let parts = log.partitions().await?;
    let until = log.offsets(&parts, At::Latest).await?;
    let earliest = log.offsets(&parts, At::Earliest).await?;
    let cursor = control
        .map(|c| c.stream_offsets.clone())
        .unwrap_or_default();
    // A pipeline that has not started under `starting_offsets = "latest"`
    // will start at the ends: nothing waits for it yet.
    let from_end = cursor.is_empty()
        && ctx.pipeline.source.starting_offsets == crate::pipeline::StartingOffsets::Latest;
    let mut out = Vec::new();
    for (p, end) in &until {
        let start = match cursor.get(p) {
            None if from_end => *end,
            c => c.copied().unwrap_or(earliest[p]).max(earliest[p]),
        };
        if start >= *end {
            continue;
        }
        let first = log
            .fetch(RecordRange {
                partition: *p,
                start,
                end: start + 1,
            })
            .await?;
        out.push(ObjectMeta {
            key: crate::paths::stream::unit(*p, start, *end),
            size: (*end - start) as u64,
            etag: None,
            last_modified: first
                .first()
                .and_then(|r| chrono::DateTime::from_timestamp_millis(r.timestamp_ms)),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(pairs: &[(i32, i64)]) -> BTreeMap<i32, i64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn a_runs_batches_carry_every_partitions_cursor_and_the_loss_once() {
        let w = Waiting {
            from: offsets(&[(0, 10), (1, 0), (2, 5)]),
            until: offsets(&[(0, 30), (1, 10), (2, 5)]),
            lost: vec![RecordRange {
                partition: 2,
                start: 0,
                end: 5,
            }],
            ..Default::default()
        };
        assert!(!w.is_empty());
        let b = w.batches(15);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].next, offsets(&[(0, 20), (1, 5), (2, 5)]));
        assert_eq!(b[0].lost.len(), 1);
        assert_eq!(b[1].next, w.until);
        assert!(b[1].lost.is_empty());
        let all: u64 = b.iter().map(StreamPlan::records).sum();
        assert_eq!(all, 30);
        let done = Waiting {
            from: w.until.clone(),
            ..w
        };
        assert!(done.is_empty() && done.batches(15).is_empty());
    }
}
