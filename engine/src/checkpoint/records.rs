//! The checkpoint's records, as stored (JSON). Keys come from
//! [`crate::paths`]; how they are read and written is in the parent module.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::pipeline::{ColumnSpec, Pipeline};
use crate::storage::RequestCounts;

/// Version of the checkpoint format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// `pipeline.json`: the registered spec and the pinned source schema.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PipelineRecord {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Hash of the registered spec.
    pub spec_hash: String,
    /// The registered spec.
    pub pipeline: Pipeline,
    /// The source schema every batch is read with.
    pub schema: Vec<ColumnSpec>,
    /// The first batch of the history that pinned `schema`
    /// ([`Control::first_batch`]): after a reset the schema is resolved
    /// again, as for a new pipeline.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_batch: u64,
}

/// Whether a run holds the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// No run holds the lease; no batch is planned and uncommitted.
    Idle,
    /// A run holds the lease (or died holding it).
    Running,
}

/// What the last discovery listing of processed inputs looked like: a
/// listing from `start_after` whose input keys hash to `fingerprint` holds
/// nothing new.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ListingState {
    /// Where the listing starts (ordered mode's evicted cursor).
    pub start_after: Option<String>,
    /// How many input keys the listing holds.
    pub count: u64,
    /// Order-sensitive hash of the listed input keys.
    pub fingerprint: String,
}

impl ListingState {
    /// The state of a listing of `keys` (ascending) starting after `start_after`.
    pub fn of<'a>(
        start_after: Option<String>,
        keys: impl Iterator<Item = &'a str>,
    ) -> ListingState {
        let mut h = crate::hash::Fnv::new();
        let mut count = 0;
        for k in keys {
            h.write(k.as_bytes());
            h.write(b"\n");
            count += 1;
        }
        ListingState {
            start_after,
            count,
            fingerprint: format!("{:016x}", h.finish()),
        }
    }
}

/// Running totals over all committed batches, for `sluice show` in O(1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Totals {
    /// Batches committed.
    pub batches: u64,
    /// Input files processed.
    pub files: u64,
    /// Input bytes processed.
    pub bytes: u64,
    /// Rows read.
    pub rows_in: u64,
    /// Rows written.
    pub rows_out: u64,
    /// Input files set aside as unreadable (`on_bad_file = "quarantine"`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub files_quarantined: u64,
    /// Malformed rows set aside (`on_bad_row = "quarantine"`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rows_quarantined: u64,
    /// Fields made null (`on_bad_row = "null"`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nulled_fields: u64,
    /// Fields put into `_rescued` (`on_schema_change = "rescue"`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rescued_fields: u64,
    /// Rows dropped as late (a stateful query's event time at or below the
    /// watermark).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub late_rows: u64,
    /// Rows dropped as duplicates (`[deduplicate]`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duplicates: u64,
    /// Runs ended (each execution's ending, also one that handed over).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub runs: u64,
    /// What those endings used, outside any batch: the Plan invocation
    /// that found nothing more, and its transitions (`Plan`, `HasBatch`,
    /// `Finished`).
    #[serde(default, skip_serializing_if = "Usage::is_empty")]
    pub run_ends: Usage,
    /// The storage requests of those endings' Plan invocations.
    #[serde(default, skip_serializing_if = "RequestCounts::is_empty")]
    pub run_end_requests: RequestCounts,
    /// Storage requests committed batches made after their records were
    /// written (publishing parts and manifest, the index, control, pruning):
    /// each commit adds them in the control write that records it.
    #[serde(default, skip_serializing_if = "RequestCounts::is_empty")]
    pub after_commits: RequestCounts,
    /// Trigger invocations that wrote control (claimed the lease, asked a
    /// running run to look again, or recorded a request while paused): the
    /// invocations up to that write. A trigger that finds the request
    /// already recorded writes nothing and is in no record.
    #[serde(default, skip_serializing_if = "Usage::is_empty")]
    pub wakes: Usage,
    /// The storage requests of those trigger invocations.
    #[serde(default, skip_serializing_if = "RequestCounts::is_empty")]
    pub wake_requests: RequestCounts,
    /// Of the runs ended, those whose execution handed out no batch (a
    /// schedule or event that found nothing), counted apart as well:
    /// `sluice cost` prices an idle run from them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub idle_runs: u64,
    /// What their endings used (as `run_ends`).
    #[serde(default, skip_serializing_if = "Usage::is_empty")]
    pub idle_ends: Usage,
    /// Their endings' storage requests (as `run_end_requests`).
    #[serde(default, skip_serializing_if = "RequestCounts::is_empty")]
    pub idle_end_requests: RequestCounts,
    /// Executions that ended with a Plan that found nothing left (idle
    /// ones included), counted apart: an Express execution of a row query
    /// over files usually ends at its last commit instead, with no Plan,
    /// and an idle run always ends with one. `sluice cost` prices an idle
    /// run from these when none was recorded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub plan_ends: u64,
    /// What their endings used (as `run_ends`).
    #[serde(default, skip_serializing_if = "Usage::is_empty")]
    pub plan_end_usage: Usage,
    /// Their endings' storage requests (as `run_end_requests`).
    #[serde(default, skip_serializing_if = "RequestCounts::is_empty")]
    pub plan_end_requests: RequestCounts,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `control.json`: the run lease and the pointer to the last commit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Control {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Lease status.
    pub status: RunStatus,
    /// Incremented by every claim; a run acts only while it holds its epoch.
    pub epoch: u64,
    /// Who holds (or last held) the lease.
    pub owner: Option<String>,
    /// Last sign of life of the owner (ms since the Unix epoch).
    pub heartbeat_ms: Option<i64>,
    /// A trigger asked for another discovery while a run held the lease
    /// (or while the pipeline was paused).
    pub requested: bool,
    /// Paused (`sluice pause`): triggers record requests but start nothing.
    #[serde(default)]
    pub paused: bool,
    /// Last committed batch.
    pub last_committed: Option<u64>,
    /// When it was committed (ms since the Unix epoch).
    pub last_commit_ms: Option<i64>,
    /// Hash of the spec registered in `pipeline.json`.
    pub spec_hash: String,
    /// The listing of processed inputs, for an idle check without the index.
    pub listing: ListingState,
    /// Totals over committed batches.
    pub totals: Totals,
    /// Batches may be planned and not committed (a run handed over at its
    /// batch budget, was cancelled, or died): the next run looks for them
    /// before discovering. Cleared when a run ends with nothing planned.
    #[serde(default)]
    pub resume: bool,
    /// Notify mode: the epoch of the run that last listed the source to
    /// find files whose notification was lost.
    #[serde(default)]
    pub reconciled_epoch: Option<u64>,
    /// This checkpoint's history: set by the first claim, recorded in the
    /// sink it writes (`_sluice/sink.json`), so a sink holding the output of
    /// another checkpoint (an earlier one of the same pipeline, since
    /// deleted, or another pipeline's) is refused instead of mixed.
    #[serde(default)]
    pub history: String,
    /// `sluice reset` is under way (it ends by deleting this record): no
    /// run starts until it is run again to the end.
    #[serde(default)]
    pub resetting: bool,
    /// `manifests` discovery: the history of the source sink whose
    /// manifests the committed batches read (its owner record's), so a
    /// reset of the upstream pipeline is noticed, not read as old numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_history: Option<String>,
    /// Input files set aside as unreadable (`on_bad_file = "quarantine"`),
    /// until `sluice retry-quarantined` asks for them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<Quarantined>,
    /// Keys `sluice retry-quarantined` asked to read again: the next
    /// planned batch takes them, and its commit removes them here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry: Vec<String>,
    /// The source schema in force once `on_schema_change = "add-columns"`
    /// added columns (version 2 on); `None` while it is `pipeline.json`'s
    /// (version 1). Set by the commit of the batch that added them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<SchemaVersion>,
    /// A stateful query's state and watermark after the last committed
    /// batch (that batch's record's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stateful: Option<StatefulState>,
    /// The first batch number of this history. `sluice reset` starts the
    /// next history past every batch number, and (with the epoch, which a
    /// reset also carries on) every name, the retired history used: what a
    /// run of it writes late lands where this history never reads.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_batch: u64,
    /// A record stream: each partition's next offset to read (the last
    /// committed batch's [`StreamPlan::next`], or where a new pipeline
    /// starts).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stream_offsets: BTreeMap<i32, i64>,
    /// The topic whose offsets [`Self::stream_offsets`] are (a Kinesis
    /// source: the stream whose shards [`Self::stream_shards`] are).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stream_topic: String,
    /// A Kinesis source: the stream's ARN as Kinesis named it when a run
    /// last looked for its end (its region and account: a stream of the
    /// same name elsewhere is another stream).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stream_arn: String,
    /// A Kinesis source: each shard's cursor (the last sequence number
    /// committed), lineage and whether it was read to its end.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stream_shards: BTreeMap<String, ShardCursor>,
    /// A Kinesis source: where the run of `epoch` stops in each shard,
    /// captured once by its first plan (Spark's `Trigger.AvailableNow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_until: Option<StreamUntil>,
    /// The one copy of an execution that runs the run of an epoch a
    /// trigger started on Express, claimed by its first Plan before any
    /// write: a duplicate execution of the same run, or a second copy of
    /// the same execution (Express is at-least-once), finds another token
    /// here and stops without writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<RunExecution>,
    /// The processed-input index of this history, when the source keeps a
    /// bounded one (`ordered` mode's lookback window, `manifests` and Delta
    /// sources' last key): advanced in the write that records each commit,
    /// instead of in `index/processed.json` just before it (one write a
    /// batch fewer). `list` mode's index, every key ever processed, stays
    /// in its own object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<super::Index>,
    /// The operator's tasks' pace over recent batches, for
    /// `limits.task_seconds`: advanced in the write that records each
    /// commit that read files and measured its tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<TaskPace>,
}

/// What the operator's tasks read and how long they were billed, summed
/// over committed batches with each older batch weighing a quarter less
/// than the next (so the pace follows the data and the query as they
/// change, over about the last four batches).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskPace {
    /// Input bytes.
    pub bytes: u64,
    /// Billed task time, ms.
    pub ms: u64,
    /// Tasks.
    pub tasks: u64,
}

impl TaskPace {
    /// `self` with the batch `record` added, if it read files and its
    /// tasks' use was measured.
    pub fn after(self, record: &Commit) -> Option<TaskPace> {
        let (tasks, ms) = record.usage.invoked(crate::deploy::OPERATOR);
        if record.stream.is_some() || record.bytes_read == 0 || tasks == 0 || ms == 0 {
            return None;
        }
        let decay = |x: u64| x - x / 4;
        Some(TaskPace {
            bytes: decay(self.bytes) + record.bytes_read,
            ms: decay(self.ms) + ms,
            tasks: decay(self.tasks) + tasks,
        })
    }

    /// The bytes a task reads in `seconds` at this pace (fixed work
    /// included: a task's time taken as all reading, so a task cut this
    /// way takes at most about that long).
    pub fn bytes_in(&self, seconds: u64) -> Option<u64> {
        (self.ms > 0 && self.bytes > 0)
            .then(|| (self.bytes as f64 / self.ms as f64 * seconds as f64 * 1000.0) as u64)
    }
}

/// The execution an epoch's run is claimed for (see [`Control::execution`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunExecution {
    /// The epoch.
    pub epoch: u64,
    /// The execution's id (`$$.Execution.Id`, its ARN on AWS), for people.
    pub id: String,
    /// The token the claiming copy of the execution drew: what tells two
    /// copies of one execution (same id) apart.
    pub copy: String,
}

/// A Kinesis shard's place in the checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardCursor {
    /// The last sequence number committed (`None`: nothing read yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Nothing read yet: start at the first record that arrived at or
    /// after this time (ms; `starting_position` as a date), else at the
    /// shard's trim horizon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_ms: Option<i64>,
    /// The shards it was split or merged from (ListShards' lineage).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<String>,
    /// Closed, and read to its end: its children may be read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drained: bool,
    /// When a run last found nothing after the cursor (ms, the run's
    /// clock): every record after it arrived later. While that is within
    /// the stream's retention, no record after the cursor can have
    /// expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caught_up_ms: Option<i64>,
}

/// Where one run stops in each shard of a Kinesis stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StreamUntil {
    /// The run that captured it.
    pub epoch: u64,
    /// When it was captured (ms, the run's clock).
    #[serde(default)]
    pub captured_ms: i64,
    /// The shards listed when it was captured.
    pub shards: BTreeMap<String, ShardUntil>,
    /// The execution that holds it handed the run over at its batch
    /// budget: the next execution goes on to this end. (A run that died or
    /// was cancelled leaves it unmarked: the run that takes over is a new
    /// run, and reads to what is there when it looks, as Spark's
    /// `AvailableNow` does after a restart.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handed_over: bool,
    /// The stream was in on-demand capacity mode (DescribeStreamSummary).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_demand: bool,
}

/// Where a run stops in one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardUntil {
    /// The sequence number of the last record the shard held when the
    /// run looked (`None`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
    /// Closed when the run looked: it is read to its end.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closed: bool,
    /// Its parents (ListShards' lineage).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<String>,
}

/// Compare two Kinesis sequence numbers (decimal, no leading zeros, up to
/// 129 digits: longer is larger, then by digits).
pub fn seq_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// A stateful query's state after a batch: what the next batch's tasks
/// and merges start from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StatefulState {
    /// The watermark after the batch, microseconds since the epoch: the
    /// next batch drops rows at or below it as late and closes windows
    /// that end at or before it.
    pub watermark_us: Option<i64>,
    /// The watermark the batch's own merges closed windows with: when the
    /// watermark has since moved past it, a run ends with one batch with
    /// no input that closes the windows it passed.
    pub merged_watermark_us: Option<i64>,
    /// Per state partition, the state file in force (checkpoint key).
    pub state: Vec<Option<String>>,
    /// The earliest window end left in the state, microseconds: once the
    /// watermark reaches it a batch with no input has a window to close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_close_us: Option<i64>,
    /// Rows the batch dropped as late.
    #[serde(default)]
    pub late_rows: u64,
    /// `late = "side-output"`: the files under the sink's `_late/` holding
    /// them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub late_files: Vec<OutputFile>,
    /// What the state is of: a hash of the query's stateful shape (the
    /// rewritten SQL, the window, the watermark column, the output mode and
    /// the partition count). A run under another shape is refused while
    /// state exists: merging the old state would give wrong answers.
    #[serde(default)]
    pub shape: String,
    /// `[deduplicate]`: per state partition, the file of keys seen (and
    /// when each leaves) in force.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dedup: Vec<Option<String>>,
    /// `[deduplicate]`: rows the batch dropped as duplicates.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duplicates: u64,
    /// `[deduplicate]`: the earliest expiry of a key held, microseconds:
    /// once the watermark reaches it a batch with no input has keys to
    /// forget (Spark runs one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_expiry_us: Option<i64>,
    /// `[deduplicate]`: keys held after the batch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dedup_keys: u64,
    /// `[deduplicate]`: a hash of what the keys seen depend on (the key
    /// columns and their types, the event-time column, the partition
    /// count); the deduplication's state is refused under another.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dedup_shape: String,
}

/// A version of the source schema. Version 1 is the schema pinned in
/// `pipeline.json`; each batch that brings new columns under
/// `on_schema_change = "add-columns"` reads with the next version, which
/// its commit puts in force.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SchemaVersion {
    /// 1, 2, ...
    pub version: u32,
    /// The columns, in order.
    pub columns: Vec<ColumnSpec>,
}

impl Control {
    /// The record of a pipeline that has never run.
    pub fn new(spec_hash: String) -> Control {
        Control {
            format_version: FORMAT_VERSION,
            status: RunStatus::Idle,
            epoch: 0,
            owner: None,
            heartbeat_ms: None,
            requested: false,
            paused: false,
            last_committed: None,
            last_commit_ms: None,
            spec_hash,
            listing: ListingState::of(None, std::iter::empty()),
            totals: Totals::default(),
            resume: false,
            reconciled_epoch: None,
            history: String::new(),
            resetting: false,
            source_history: None,
            quarantined: Vec::new(),
            retry: Vec::new(),
            schema: None,
            stateful: None,
            first_batch: 0,
            stream_offsets: BTreeMap::new(),
            stream_topic: String::new(),
            stream_arn: String::new(),
            stream_shards: BTreeMap::new(),
            stream_until: None,
            execution: None,
            index: None,
            pace: None,
        }
    }

    /// The batch after the last committed one (this history's first).
    pub fn next_batch(&self) -> u64 {
        self.last_committed.map_or(self.first_batch, |n| n + 1)
    }

    /// Whether control already records batch `batch` (or a later one) as
    /// committed.
    pub fn records(&self, batch: u64) -> bool {
        self.last_committed.is_some_and(|l| l >= batch)
    }

    /// Whether a record-stream source has recorded where it starts (a
    /// Kafka topic's offsets, a Kinesis stream's shards).
    pub fn stream_started(&self) -> bool {
        !self.stream_offsets.is_empty() || !self.stream_shards.is_empty()
    }

    /// Record the commit `record` (its source settled into `listing`, for
    /// kinds that keep one) at `now_ms` under the spec `spec_hash`: the
    /// last committed batch, the source cursor, the files asked for again
    /// or set aside, the totals, the stateful state and the schema version
    /// in force from the next batch on. Idempotent: a batch already
    /// recorded changes nothing.
    pub fn record_commit(
        &mut self,
        record: &Commit,
        listing: Option<&ListingState>,
        now_ms: i64,
        spec_hash: &str,
    ) {
        if self.records(record.batch) {
            return;
        }
        self.last_committed = Some(record.batch);
        self.last_commit_ms = Some(record.committed_ms);
        if let Some(l) = listing {
            self.listing = l.clone();
        }
        if let Some(cursor) = &record.source {
            self.source_history = cursor.history.clone();
        }
        if let Some(s) = &record.stream {
            if s.shards.is_empty() {
                self.stream_offsets = s.next.clone();
            }
            // A Kinesis batch: each shard's cursor moves to the last
            // record its unit read; a closed shard read to its end is
            // drained.
            for read in &s.read {
                let cursor = self.stream_shards.entry(read.shard.clone()).or_default();
                if read.last.is_some() {
                    cursor.after = read.last.clone();
                    cursor.from_ms = None;
                }
                cursor.drained |= read.ended;
                // At the run's end in the shard: nothing followed the
                // cursor when the run looked.
                let end = self
                    .stream_until
                    .as_ref()
                    .and_then(|u| Some((u.captured_ms, u.shards.get(&read.shard)?)));
                if let (Some((at, end)), Some(after)) = (end, &cursor.after)
                    && !end.closed
                    && end
                        .last
                        .as_deref()
                        .is_none_or(|last| seq_cmp(after, last).is_ge())
                {
                    cursor.caught_up_ms = Some(at);
                }
            }
        }
        self.retry.retain(|k| !record.input_keys.contains(k));
        self.quarantined
            .retain(|q| !record.input_keys.contains(&q.key));
        self.quarantined.extend(record.quarantined.iter().cloned());
        self.heartbeat_ms = Some(now_ms);
        self.spec_hash = spec_hash.to_string();
        self.totals.add(record);
        if let Some(pace) = self.pace.unwrap_or_default().after(record) {
            self.pace = Some(pace);
        }
        if let Some(s) = &record.stateful {
            self.stateful = Some(s.clone());
        }
        // Columns this batch added are in force from the next batch on.
        if let Some(s) = &record.schema
            && self
                .schema
                .as_ref()
                .is_none_or(|now| now.version < s.version)
        {
            self.schema = Some(s.clone());
        }
    }
}

impl Totals {
    /// Add what the committed batch `record` read, wrote, set aside and
    /// repaired.
    pub fn add(&mut self, record: &Commit) {
        self.batches += 1;
        self.files += record.files;
        self.bytes += record.bytes_read;
        self.rows_in += record.rows_in;
        self.rows_out += record.rows_out;
        self.files_quarantined += record.quarantined.len() as u64;
        self.rows_quarantined += record.rejected.iter().map(|r| r.rows).sum::<u64>();
        self.nulled_fields += record.nulled_fields;
        self.rescued_fields += record.rescued_fields;
        if let Some(s) = &record.stateful {
            self.late_rows += s.late_rows;
            self.duplicates += s.duplicates;
        }
    }
}

/// `offsets/N.json`: the plan of one batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offsets {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Batch number.
    pub batch: u64,
    /// Epoch of the run that planned it.
    pub epoch: u64,
    /// The history ([`Control::history`]) of the run that planned it: a
    /// plan a retired run wrote late after a reset is not this history's.
    #[serde(default)]
    pub history: String,
    /// When it was planned (ms since the Unix epoch).
    pub planned_ms: i64,
    /// Exactly the inputs of this batch, in processing order.
    pub inputs: Vec<InputFile>,
    /// How the inputs split into operator tasks.
    pub tasks: Vec<TaskPlan>,
    /// Notify mode: the inbox entries this batch consumes (its inputs', and
    /// duplicates of keys already committed); deleted once it commits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumed: Vec<String>,
    /// `manifests` mode: the last source manifest this batch reads (every
    /// manifest up to it is read by it or an earlier batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceCursor>,
    /// A record stream: the ranges this batch reads and each partition's
    /// offset after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamPlan>,
    /// The source schema this batch reads with (plans of older builds have
    /// none: they read with `pipeline.json`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<SchemaVersion>,
    /// Columns this batch adds to the schema (its `schema` is a new version).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added_columns: Vec<String>,
    /// What the batch's query is, planned once with the schema it reads
    /// (plans of older builds have none: it is planned again from the
    /// query).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<QueryShape>,
    /// The static tables (`[[static]]`) as this batch reads them: their
    /// files as the plan listed them, read pinned to their entity tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statics: Vec<StaticPin>,
    /// Time the planner spent up to this plan, ms.
    #[serde(default)]
    pub plan_ms: u64,
    /// Requests the planner made up to this plan.
    #[serde(default)]
    pub plan_requests: RequestCounts,
    /// `limits.task_seconds`: the task size the planner cut this batch's
    /// tasks at, from control's pace when it planned (at most
    /// `max_bytes_per_task`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_bytes: Option<u64>,
}

impl Offsets {
    /// Bytes of all inputs.
    pub fn bytes(&self) -> u64 {
        self.inputs.iter().map(|i| i.size).sum()
    }
}

/// The records `[start, end)` of one partition of a record stream, by the
/// broker's offsets: a planned unit of a record-stream source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RecordRange {
    /// The partition.
    pub partition: i32,
    /// The first offset.
    pub start: i64,
    /// One past the last offset.
    pub end: i64,
}

impl RecordRange {
    /// How many offsets it spans.
    pub fn len(&self) -> u64 {
        (self.end - self.start).max(0) as u64
    }

    /// Whether it spans none.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// A record-stream batch: what it reads, and where each partition stands
/// after it (Spark's offset log entry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPlan {
    /// Each partition's next offset after this batch (every partition
    /// the topic had when the batch was planned).
    pub next: BTreeMap<i32, i64>,
    /// The records it reads, in units its tasks index
    /// ([`TaskPlan::inputs`]).
    pub ranges: Vec<RecordRange>,
    /// Records removed (retention) before they were read, passed over
    /// under `on_data_loss = "skip"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<RecordRange>,
    /// A Kinesis batch: the shard units it reads (its tasks index these,
    /// not `ranges`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardUnit>,
    /// A Kinesis batch's commit: where each unit's read ended, from its
    /// task's result (the plan cannot know: a shard's records are counted
    /// only by reading them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<ShardRead>,
    /// Kinesis shards whose unread records were gone (retention) when the
    /// batch was planned, passed over under `on_data_loss = "skip"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_shards: Vec<ShardLoss>,
    /// A Kinesis batch: calls its Plan step made that the stream refused
    /// for throughput, retried (its tasks' are in [`Self::read`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub throttled: u64,
    /// A Kinesis batch: calls its Plan step made (its tasks' are in
    /// [`Self::read`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub requests: u64,
    /// A Kinesis batch: the stream was in on-demand capacity mode when
    /// the run looked (its reads are billed per GB; `sluice cost`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_demand: bool,
}

/// The records of one Kinesis shard a batch reads: those after `after`
/// (else from `from_ms`, else the shard's trim horizon) through `until`
/// (else to the closed shard's end), at most `limit` of them. Records
/// never change, so a retried task reads exactly these again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardUnit {
    /// The shard.
    pub shard: String,
    /// Read after this sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Nothing read yet: from the first record at or after this time, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_ms: Option<i64>,
    /// The last sequence number to read (the run's end in an open shard);
    /// `None`: to the end of the closed shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// At most this many records.
    pub limit: u64,
}

/// What a task read of one [`ShardUnit`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardRead {
    /// The shard.
    pub shard: String,
    /// The last record's sequence number (`None`: it read none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
    /// Records read.
    pub records: u64,
    /// Bytes of their data.
    pub bytes: u64,
    /// It reached the end of the closed shard.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended: bool,
    /// Calls the stream refused for throughput, retried.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub throttled: u64,
    /// Calls made (GetShardIterator and GetRecords).
    #[serde(default)]
    pub requests: u64,
}

/// Records of a Kinesis shard lost to retention before they were read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardLoss {
    /// The shard.
    pub shard: String,
    /// The cursor that was no longer in the stream (`None`: a shard gone
    /// before anything of it was read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// What was found instead.
    pub message: String,
}

impl StreamPlan {
    /// Records it reads (offsets it spans: transaction markers included; a
    /// Kinesis batch: the records its units read, once committed, else at
    /// most their limits).
    pub fn records(&self) -> u64 {
        if !self.read.is_empty() {
            return self.read.iter().map(|r| r.records).sum();
        }
        if !self.shards.is_empty() {
            return self.shards.iter().map(|u| u.limit).sum();
        }
        self.ranges.iter().map(RecordRange::len).sum()
    }
}

/// A static table as a batch reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaticPin {
    /// Its name in the query.
    pub table: String,
    /// Its files as the plan listed them (keys relative to its folder).
    pub files: Vec<InputFile>,
    /// Its columns, inferred from those files when the plan was made.
    pub columns: Vec<crate::pipeline::ColumnSpec>,
    /// A hash of the files' keys, sizes and entity tags: equal versions
    /// are the same table.
    pub version: String,
}

impl StaticPin {
    /// What a commit record keeps of it.
    pub fn used(&self) -> StaticUsed {
        StaticUsed {
            table: self.table.clone(),
            version: self.version.clone(),
            files: self.files.len() as u64,
            bytes: self.files.iter().map(|f| f.size).sum(),
        }
    }
}

/// Which version of a static table a committed batch joined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaticUsed {
    /// Its name in the query.
    pub table: String,
    /// [`StaticPin::version`].
    pub version: String,
    /// How many files it had.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// What a plan says of its batch's query, for the steps after the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryShape {
    /// The stateful shape (as [`StatefulState::shape`]); `None`: a
    /// row-by-row query, with no merges and no state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stateful: Option<String>,
    /// `[deduplicate]`: its shape (as [`StatefulState::dedup_shape`]);
    /// the batch runs a Dedup map before any merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup: Option<String>,
    /// The spec hash of the pipeline file it was planned from: a batch
    /// resumed under another spec (the query edited while the batch was
    /// planned and not committed) runs the query as it is now, so its
    /// shape is planned again.
    #[serde(default)]
    pub spec: String,
    /// A Delta sink and a row-by-row query: the Delta schema
    /// (`schemaString`) of the rows the query writes, with which a batch
    /// that writes no row still creates the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
}

/// One input file of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// Key relative to the source root.
    pub key: String,
    /// Size when planned.
    pub size: u64,
    /// Entity tag when planned, if the listing gave one.
    pub etag: Option<String>,
    /// Modification time when listed (ms since the Unix epoch), where the
    /// listing gave one: a local file that changed since is still being
    /// written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_ms: Option<i64>,
    /// A Delta table's partition values for this file (its log's
    /// `partitionValues`: column -> value as text, `None` for null), which
    /// the file itself may lack; read as the columns' values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<std::collections::BTreeMap<String, Option<String>>>,
}

impl InputFile {
    /// As a listed object (size and key; no tag or time).
    pub(crate) fn into_meta(self) -> crate::storage::ObjectMeta {
        crate::storage::ObjectMeta {
            key: self.key,
            size: self.size,
            etag: None,
            last_modified: self
                .modified_ms
                .and_then(chrono::DateTime::from_timestamp_millis),
        }
    }
}

/// The inputs of one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPlan {
    /// Task number within the batch.
    pub task: u32,
    /// Indices into [`Offsets::inputs`].
    pub inputs: Vec<u32>,
    /// Bytes of those inputs.
    pub bytes: u64,
}

/// One committed output file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OutputFile {
    /// Key relative to the sink root.
    pub key: String,
    /// Rows in the file.
    pub rows: u64,
    /// Size of the file.
    pub bytes: u64,
    /// A Delta sink's part: its Delta schema and statistics, for its
    /// `add` action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<DeltaPart>,
    /// The entity tag the store gave the staged file when the task wrote
    /// it: the commit's check compares it as well as the size, so bytes
    /// written over it since (a late write of another attempt) are not
    /// published as this file. Not in manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

/// What a Delta sink knows of a part it wrote: the Delta schema of its
/// columns and its statistics, for the part's `add` action.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeltaPart {
    /// The table schema the part was written with (Delta's `schemaString`).
    pub schema: String,
    /// The part's statistics (Delta's `stats`: numRecords, minValues,
    /// maxValues, nullCount).
    pub stats: String,
    /// A partitioned table's part: its partition values (Delta's
    /// `partitionValues`; `None` for null).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub partition_values: std::collections::BTreeMap<String, Option<String>>,
}

/// Time spent in each step of a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Durations {
    /// Planning (discovery, offsets), ms.
    pub plan_ms: u64,
    /// From the plan to the start of the commit (tasks, fan-out), ms.
    pub operate_ms: u64,
    /// The longest task, ms.
    pub task_max_ms: u64,
    /// A stateful query: the longest merge of a state partition, ms.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub merge_max_ms: u64,
    /// Commit, ms.
    pub commit_ms: u64,
}

/// What a batch used of what AWS bills by use: Lambda invocations and
/// their billed duration per function, and Step Functions state
/// transitions. (Storage requests are the commit's `requests`.)
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Per function.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub functions: Vec<FunctionUsage>,
    /// State transitions of a Standard execution for this batch (Map
    /// iterations included): billed each.
    #[serde(default)]
    pub transitions: u64,
    /// What ran in Express executions, which bill requests and duration,
    /// not transitions.
    #[serde(default, skip_serializing_if = "ExpressUsage::is_empty")]
    pub express: ExpressUsage,
}

/// What Express executions used: each execution is a request, billed with
/// its duration (rounded up to 100 ms) at the memory it used; its
/// transitions are counted, not billed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExpressUsage {
    /// Executions ended (each an Express request).
    #[serde(default)]
    pub executions: u64,
    /// Their billed duration, ms: each execution's, from its start to its
    /// ending Plan, rounded up to 100 ms.
    #[serde(default)]
    pub billed_ms: u64,
    /// State transitions taken in them (not billed).
    #[serde(default)]
    pub transitions: u64,
}

impl ExpressUsage {
    /// Nothing used.
    pub fn is_empty(&self) -> bool {
        *self == ExpressUsage::default()
    }
}

/// The invocations of one function.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FunctionUsage {
    /// `planner`, `operator`, `committer` or `trigger`.
    pub function: String,
    /// Invocations.
    pub invocations: u64,
    /// Billed duration: each invocation's wall time rounded up to the
    /// millisecond, summed.
    pub billed_ms: u64,
    /// The function's configured memory, MB.
    pub memory_mb: u64,
    /// CPU time the invocations used, ms (the process's user and system
    /// time over each invocation; on Lambda, one invocation to a process
    /// at a time, that is the invocation's; merges, dedups and failed
    /// attempts are not measured). 0: not measured. `sluice tune` reads
    /// the share of the billed time it is.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_ms: u64,
    /// Of `billed_ms`, the invocations whose CPU time `cpu_ms` holds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_measured_ms: u64,
}

impl Usage {
    /// `function`'s invocations and billed ms, over every memory size it
    /// ran at.
    pub fn invoked(&self, function: &str) -> (u64, u64) {
        self.functions
            .iter()
            .filter(|f| f.function == function)
            .fold((0, 0), |(n, ms), f| (n + f.invocations, ms + f.billed_ms))
    }

    /// Nothing used.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty() && self.transitions == 0 && self.express.is_empty()
    }

    /// State transitions, whichever workflow took them.
    pub fn all_transitions(&self) -> u64 {
        self.transitions + self.express.transitions
    }

    /// `self` and `other` together (per function, by name and memory).
    pub fn plus(&self, other: &Usage) -> Usage {
        let mut functions = self.functions.clone();
        for f in &other.functions {
            match functions
                .iter_mut()
                .find(|g| g.function == f.function && g.memory_mb == f.memory_mb)
            {
                Some(g) => {
                    g.invocations += f.invocations;
                    g.billed_ms += f.billed_ms;
                    g.cpu_ms += f.cpu_ms;
                    g.cpu_measured_ms += f.cpu_measured_ms;
                }
                None => functions.push(f.clone()),
            }
        }
        Usage {
            functions,
            transitions: self.transitions + other.transitions,
            express: ExpressUsage {
                executions: self.express.executions + other.express.executions,
                billed_ms: self.express.billed_ms + other.express.billed_ms,
                transitions: self.express.transitions + other.express.transitions,
            },
        }
    }
}

impl FunctionUsage {
    /// `invocations` of `function` at `memory_mb`, `billed_ms` in all.
    pub fn new(function: &str, invocations: u64, billed_ms: u64, memory_mb: u64) -> FunctionUsage {
        FunctionUsage {
            function: function.to_string(),
            invocations,
            billed_ms,
            memory_mb,
            cpu_ms: 0,
            cpu_measured_ms: 0,
        }
    }

    /// The same, with `cpu_ms` of CPU time measured over invocations
    /// billed `measured_ms`.
    pub fn with_cpu(self, cpu_ms: u64, measured_ms: u64) -> FunctionUsage {
        FunctionUsage {
            cpu_ms,
            cpu_measured_ms: measured_ms,
            ..self
        }
    }
}

/// `commits/N.json`: the record that makes batch N committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Batch number.
    pub batch: u64,
    /// Epoch of the committing run.
    pub epoch: u64,
    /// The history of the committing run.
    #[serde(default)]
    pub history: String,
    /// When it was committed (ms since the Unix epoch).
    pub committed_ms: i64,
    /// Input files.
    pub files: u64,
    /// Input bytes.
    pub bytes_read: u64,
    /// Rows read.
    pub rows_in: u64,
    /// Rows written.
    pub rows_out: u64,
    /// Output files.
    pub outputs: Vec<OutputFile>,
    /// Step durations.
    pub durations: Durations,
    /// Storage requests made for this batch, all stores together.
    pub requests: RequestCounts,
    /// The input keys, so the index can be rebuilt from commits alone.
    pub input_keys: Vec<String>,
    /// What started the run that committed this batch (`s3`, `sns`,
    /// `schedule`, `manual: sluice refresh`, `sluice run`, ...).
    #[serde(default)]
    pub trigger: Option<String>,
    /// Notify mode: the inbox entries to delete once committed (from the plan).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumed: Vec<String>,
    /// Planned inputs left for the next run because they changed since
    /// they were listed or notified (a local file still being written), as
    /// the tasks found them. Notify mode records them in the inbox again
    /// with that size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deferred: Vec<InputFile>,
    /// Planned inputs deleted from the source before a task read them:
    /// nothing left to process; not among `input_keys`, so a file uploaded
    /// again under such a key is read by a later batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gone: Vec<String>,
    /// `manifests` mode: the plan's [`Offsets::source`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceCursor>,
    /// A record stream: the plan's [`Offsets::stream`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamPlan>,
    /// Input files the tasks could not read and set aside
    /// (`on_bad_file = "quarantine"`): part of the batch (its keys count as
    /// processed), not of its output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<Quarantined>,
    /// Malformed rows set aside (`on_bad_row = "quarantine"`): one
    /// quarantine file per task that had any, under `<sink>/_quarantine/`
    /// (`rows` is how many rows each holds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<OutputFile>,
    /// Fields made null (`on_bad_row = "null"`).
    #[serde(default)]
    pub nulled_fields: u64,
    /// The schema version the batch read with (absent: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<u32>,
    /// Columns the batch added to the schema (`on_schema_change =
    /// "add-columns"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added_columns: Vec<String>,
    /// With `added_columns`: the new schema version, which this commit puts
    /// in force (`control.schema`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<SchemaVersion>,
    /// Fields put into `_rescued` (`on_schema_change = "rescue"`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rescued_fields: u64,
    /// A stateful query: its state and watermark after this batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stateful: Option<StatefulState>,
    /// A Delta sink, and a batch that wrote no part: the Delta schema of
    /// the query's rows (its plan's [`QueryShape::table`]), with which its
    /// commit creates the table if there is none yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_schema: Option<String>,
    /// The static tables the batch joined, and which version of each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statics: Vec<StaticUsed>,
    /// What the batch used of what AWS bills by use (`sluice cost`).
    #[serde(default)]
    pub usage: Usage,
}

/// An input file set aside because it could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Quarantined {
    /// Key relative to the source root.
    pub key: String,
    /// Its size when planned.
    pub size: u64,
    /// The batch that set it aside.
    pub batch: u64,
    /// Why: the reader's error.
    pub reason: String,
}

/// Where a `manifests`-mode batch leaves off in its source sink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceCursor {
    /// The key of the last manifest read (`_sluice/manifest/N.json`).
    pub manifest: String,
    /// The source sink's history (its owner record's), if it has one.
    pub history: Option<String>,
}

/// `<sink>/_sluice/sink.json`: whose output the sink holds. A sink belongs
/// to one pipeline and one history of it (one checkpoint's life).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkOwner {
    /// Pipeline name.
    pub pipeline: String,
    /// The checkpoint history (`Control::history`) whose commits the sink
    /// holds; empty once `sluice reset` retired its output (the next run
    /// records its own).
    pub history: String,
    /// Where that checkpoint is, for messages.
    pub checkpoint: String,
    /// The history's first batch ([`Control::first_batch`]): batches below
    /// it belong to retired histories.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_batch: u64,
    /// The epoch of the run that claimed the sink, or (a reset's record)
    /// the epoch the reset moved control to: a reset's record is taken
    /// over only by a run of a later epoch, never by a run of the history
    /// it retired that was stopped past its lease and resumed (records of
    /// older builds have none: 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
}

/// `<sink>/_sluice/manifest/N.json`: what a reader needs to see exactly the
/// committed output of batch N.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Pipeline name.
    pub pipeline: String,
    /// Batch number.
    pub batch: u64,
    /// Output files of the batch, relative to the sink root.
    pub files: Vec<OutputFile>,
    /// Rows in those files.
    pub rows: u64,
    /// `sink.mode = "complete"`: the files are the whole result, replacing
    /// every earlier batch's (read the last manifest only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub complete: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit record of batch `batch` read from JSON as the committer
    /// writes it: 2 files, one quarantined, rows 10 in and 7 out.
    fn commit_of(batch: u64, extra: serde_json::Value) -> Commit {
        let mut v = serde_json::json!({
            "format_version": FORMAT_VERSION,
            "batch": batch,
            "epoch": 3,
            "history": "h",
            "committed_ms": 1_000 + batch as i64,
            "files": 2,
            "bytes_read": 300,
            "rows_in": 10,
            "rows_out": 7,
            "outputs": [],
            "durations": serde_json::to_value(Durations::default()).unwrap(),
            "requests": serde_json::to_value(RequestCounts::default()).unwrap(),
            "input_keys": ["a", "b"],
            "quarantined": [{"key": "b", "size": 5, "batch": batch, "reason": "not Parquet"}],
            "rejected": [{"key": "q", "rows": 2, "bytes": 9}],
            "nulled_fields": 4,
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    /// The control update after a commit, field by field, hand-computed:
    /// the cursor, the asked-for and quarantined files, the totals; the
    /// same record again changes nothing; a schema version only moves up.
    #[test]
    fn control_records_a_commit_once() {
        let mut c = Control::new("old".into());
        c.retry = vec!["a".into(), "z".into()];
        c.quarantined = vec![Quarantined {
            key: "a".into(),
            size: 1,
            batch: 0,
            reason: "bad".into(),
        }];
        let listing = ListingState::of(Some("k".into()), ["k", "l"].into_iter());
        let record = commit_of(
            0,
            serde_json::json!({"schema": {"version": 2, "columns": []}}),
        );
        c.record_commit(&record, Some(&listing), 77, "new");
        assert_eq!(c.last_committed, Some(0));
        assert_eq!(c.last_commit_ms, Some(1_000));
        assert_eq!(c.heartbeat_ms, Some(77));
        assert_eq!(c.spec_hash, "new");
        assert_eq!(c.listing, listing);
        assert_eq!(c.retry, ["z"]);
        assert_eq!(
            c.quarantined
                .iter()
                .map(|q| q.key.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
        let t = &c.totals;
        assert_eq!(
            (t.batches, t.files, t.bytes, t.rows_in, t.rows_out),
            (1, 2, 300, 10, 7)
        );
        assert_eq!(
            (t.files_quarantined, t.rows_quarantined, t.nulled_fields),
            (1, 2, 4)
        );
        assert_eq!(c.schema.as_ref().map(|s| s.version), Some(2));
        let once = c.clone();
        c.record_commit(&record, None, 99, "other");
        assert_eq!(c, once, "recording a batch twice changes nothing");
        assert!(c.records(0) && !c.records(1));
        // A later batch under an older schema version keeps the newer one.
        let later = commit_of(
            1,
            serde_json::json!({"schema": {"version": 1, "columns": []}}),
        );
        c.record_commit(&later, None, 100, "new");
        assert_eq!(c.schema.as_ref().map(|s| s.version), Some(2));
        assert_eq!(c.totals.batches, 2);
        assert_eq!(c.listing, listing, "no listing given: the cursor stays");
    }

    #[test]
    fn listing_state_changes_with_any_key() {
        let a = ListingState::of(None, ["x", "y"].into_iter());
        assert_eq!(a, ListingState::of(None, ["x", "y"].into_iter()));
        assert_ne!(a, ListingState::of(None, ["x", "z"].into_iter()));
        assert_ne!(a, ListingState::of(None, ["x"].into_iter()));
        assert_ne!(
            a,
            ListingState::of(Some("a".into()), ["x", "y"].into_iter())
        );
    }
}
