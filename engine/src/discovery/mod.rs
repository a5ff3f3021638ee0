//! Discovery: finding the input files that no committed batch has taken.
//!
//! `list` mode lists the whole source prefix and diffs it against every
//! processed key; `ordered` mode lists after a cursor and diffs against a
//! window of recent keys. Both first compare the listing against the
//! fingerprint kept in `control.json`, so a run with nothing new needs no
//! index read.
//!
//! `notify` mode never lists the source to plan: triggers record each
//! notified object as a zero-byte inbox entry (`inbox/<key>.<size>`), a run
//! lists the inbox, and claims each key create-only (`index/keys/<key>`), so
//! a duplicate notification of a committed key is consumed without being
//! processed. Every `reconcile_every` runs a run also lists the source and
//! records, as inbox entries, the files that have neither a claim nor an
//! entry: those whose notification was lost.
//!
//! `manifests` mode reads another Sluice pipeline's sink through its
//! manifests, with the manifest number as the offset.
//!
//! `Source` is the seam: the steps ask it, and only it (and the pipeline
//! file's parser) knows the kinds.

mod delta;
mod kafka;
mod kinesis;
mod listing;
mod manifests;
mod notify;
mod source;
mod stream;

pub(crate) use delta::static_snapshot as delta_static_snapshot;
pub(crate) use delta::table_schema as delta_table_schema;
pub(crate) use kafka::bad_shard_record;
pub use kinesis::calls_made as kinesis_calls_made;
pub(crate) use kinesis::idle_tally as kinesis_idle_tally;
pub(crate) use listing::{list_inputs, list_readable, listing_state, new_inputs};
pub(crate) use manifests::{Upstream, check_history, read_upstream};
pub use notify::{ClaimStep, InboxEntry, decide_key_claim, read_inbox, record_notified};
pub(crate) use notify::{claim_key, inbox_files, reconcile_due, settle_claims, unnotified};
pub(crate) use source::{Fresh, Freshness, Look, Planned, Scope, Seen, Source};

/// How many shards a `kinesis://` source's stream lists, and how many are
/// open (one ListShards request a thousand shards): `sluice check`'s look
/// at the stream.
pub(crate) async fn stream_shards(
    source: &crate::pipeline::Source,
) -> crate::error::Result<(usize, usize)> {
    kinesis::shard_counts(source).await
}

/// `sluice check`: a `kinesis://` source still names the stream its
/// checkpoint's positions are in (by name, and by the ARN the AWS
/// settings reach now).
pub(crate) async fn check_same_stream(
    p: &crate::pipeline::Pipeline,
    control: &crate::checkpoint::Control,
) -> crate::error::Result<()> {
    kinesis::same_stream_now(p, control).await
}

/// How many partitions a `kafka://` source's topic has now (one metadata
/// request): `sluice check`'s look at the brokers and the topic.
pub(crate) async fn topic_partitions(
    source: &crate::pipeline::Source,
) -> crate::error::Result<usize> {
    kafka::open(source)
        .await?
        .partitions()
        .await
        .map(|p| p.len())
}

#[cfg(test)]
mod tests {
    use crate::storage::ObjectMeta;

    /// A listed object of size 1 modified at `t` (seconds).
    pub(super) fn meta(key: &str, t: i64) -> ObjectMeta {
        ObjectMeta {
            key: key.into(),
            size: 1,
            etag: None,
            last_modified: chrono::DateTime::from_timestamp(t, 0),
        }
    }
}
