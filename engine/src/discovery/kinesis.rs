//! A Kinesis data stream as a source (`kinesis://stream`), on the record
//! stream seam the Kafka source made: the idle look, where a run stops in
//! each shard (captured once by the run's first plan: Spark's
//! `Trigger.AvailableNow`), one batch of shard units a plan, and a task's
//! units read into the JSON Lines files the operator scans.
//!
//! Positions are Sluice's own (no KCL lease table): each shard's last
//! sequence number committed, in `control.json`. Shard iterators live five
//! minutes and are never stored: every read starts from a sequence number.
//!
//! **Where a run stops.** Kinesis has no end offset, so the first plan of
//! a run reads each open shard's newest records, from a little before now
//! to the tip (`AT_TIMESTAMP` 0.1 s back, widening ten times up to 6 h,
//! then from the cursor), and the last record's sequence number is where
//! the run stops in it. Timestamps only choose where to look: the tip is read to
//! whatever they say, so clock skew or arrival-time disorder costs reads,
//! never records. A closed shard is read to its end.
//!
//! **Lineage.** A shard is read only once every parent it was split or
//! merged from (ListShards' `ParentShardId`, `AdjacentParentShardId`) is
//! drained, so records of one partition key are read in order across a
//! reshard; a parent the stream no longer lists and the checkpoint never
//! knew (it expired before the pipeline started) does not hold its
//! children back.
//!
//! **A batch** reads one unit per readable shard: the records after its
//! cursor through the run's end in it, at most an equal share of
//! `limits.max_records_per_batch` (and of `max_records_per_task`). How many
//! records a unit holds is known only by reading it, so a plan makes one
//! batch; the task records where each unit's read ended, and the commit
//! moves the cursors there. Records never change, so a retried task reads
//! exactly the same records. Enhanced fan-out (`SubscribeToShard`) is not
//! used.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_kinesis::error::ProvideErrorMetadata;
use aws_sdk_kinesis::types::ShardIteratorType;
use bytes::Bytes;

use super::kafka::{LogRecord, Meta};
use super::source::{Look, Looked, ReadUnits, Scope, Seen};
use super::stream::Waiting;
use crate::checkpoint::{
    self, Control, InputFile, ShardCursor, ShardLoss, ShardRead, ShardUnit, ShardUntil,
    StreamUntil, seq_cmp,
};
use crate::error::{Error, ErrorClass, Result};
use crate::pipeline::{DataLossPolicy, Pipeline, StartingOffsets};
use crate::storage::{MemoryStore, ObjectMeta, PutMode, Store};

/// Records a look samples to infer a schema from.
const SAMPLE: i32 = 100;
/// The most records one GetRecords call returns.
const PAGE: u64 = 10_000;
/// How far back the look for a shard's newest record probes, widening ten
/// times while it finds none (then it reads from the cursor); an empty
/// window costs two calls ([`KinesisStream::newest`]).
const LOOK_BACK_MS: [i64; 7] = [
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    6 * 3_600_000,
];
/// The shortest retention a stream may have (24 hours): a cursor caught
/// up more recently than this cannot have lost records, whatever the
/// stream's retention, so the stream is not even asked.
const MIN_RETENTION_MS: i64 = 24 * 3_600_000;
/// Slack for the clocks of Sluice and Kinesis in the retention rule.
const RETENTION_MARGIN_MS: i64 = 5 * 60_000;
/// Between two GetRecords calls on one shard (Kinesis allows five a
/// second per shard, shared by every reader).
const PACE: Duration = Duration::from_millis(200);

/// How long one call may keep being refused for throughput before the
/// step fails (retryable: the state machine retries it): 60 seconds, or
/// `SLUICE_KINESIS_TIMEOUT_S`.
fn call_timeout() -> Duration {
    let secs = std::env::var("SLUICE_KINESIS_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}

/// A shard as ListShards gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shard {
    id: String,
    parents: Vec<String>,
    closed: bool,
}

/// Where a read starts in a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Start {
    After(String),
    /// At this sequence number (the record itself first).
    AtSeq(String),
    At(i64),
    TrimHorizon,
}

impl Start {
    fn of(after: Option<&str>, from_ms: Option<i64>) -> Start {
        match (after, from_ms) {
            (Some(a), _) => Start::After(a.to_string()),
            (None, Some(ms)) => Start::At(ms),
            (None, None) => Start::TrimHorizon,
        }
    }
}

/// One GetRecords answer.
struct Page {
    records: Vec<LogRecord>,
    /// `None`: the end of a closed shard.
    next: Option<String>,
    behind_ms: i64,
}

impl Page {
    /// Whether the reader is at the shard's tip: nothing more now.
    fn caught_up(&self, asked: u64) -> bool {
        self.behind_ms == 0 && (self.records.len() as u64) < asked
    }
}

/// A stream, through the AWS SDK (region, credentials and endpoint from
/// its standard settings: `AWS_ENDPOINT_URL` reaches an emulator).
pub(crate) struct KinesisStream {
    client: aws_sdk_kinesis::Client,
    /// As written in `source.uri`: a name, or an ARN.
    stream: String,
    by_arn: bool,
    /// Calls made, and calls refused for throughput.
    requests: AtomicU64,
    throttled: AtomicU64,
    /// The Plan step's: its calls and refusals are kept for the plan to
    /// record ([`planner_tally`]).
    planner: bool,
}

/// The Plan step's calls, and those refused for throughput, per stream,
/// not yet recorded in a plan: the look before the lease may not write,
/// so the plan that follows it in the same step records them.
static PLANNER_TALLY: std::sync::LazyLock<std::sync::Mutex<BTreeMap<String, (u64, u64)>>> =
    std::sync::LazyLock::new(Default::default);

/// Every Kinesis call this process made, whoever made it: what
/// `sluice bench` measures an idle run's calls with.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// How many Kinesis calls this process has made so far.
pub fn calls_made() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

/// Take the calls and refusals of a Plan step that found nothing to do
/// (`None` for a source that is not a Kinesis stream): they belong to its
/// idle line, not to the next batch's plan in this process.
pub(crate) fn idle_tally(p: &Pipeline) -> Option<(u64, u64)> {
    (p.source.discovery == crate::pipeline::DiscoveryMode::Kinesis)
        .then(|| planner_tally(stream_of(p)))
}

/// Take the Plan step's calls and refusals of `stream` so far.
fn planner_tally(stream: &str) -> (u64, u64) {
    PLANNER_TALLY
        .lock()
        .map(|mut m| m.remove(stream).unwrap_or_default())
        .unwrap_or_default()
}

/// An SDK call's failure, by what Sluice does about it.
enum Failure {
    /// Refused for throughput: back off and call again.
    Throttled,
    /// The iterator outlived its five minutes: get another.
    Expired,
    Other(Error),
}

impl KinesisStream {
    /// The stream of a `kinesis://` source, as the Plan step reads it.
    async fn for_plan(source: &crate::pipeline::Source) -> Result<KinesisStream> {
        let mut s = KinesisStream::open(source).await?;
        s.planner = true;
        Ok(s)
    }

    /// The stream of a `kinesis://` source.
    pub(crate) async fn open(source: &crate::pipeline::Source) -> Result<KinesisStream> {
        let crate::storage::Location::Kinesis { stream } = &source.location else {
            return Err(Error::Service {
                service: "kinesis",
                message: format!("{} is not a kinesis:// location", source.location.display()),
                class: ErrorClass::Fatal,
            });
        };
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .load()
            .await;
        // Every call is Sluice's to retry (and count): a throttled call
        // backs off here, within the step's time.
        let mut conf = aws_sdk_kinesis::config::Builder::from(&sdk).retry_config(
            aws_sdk_kinesis::config::retry::RetryConfig::standard().with_max_attempts(1),
        );
        // A stream named by its ARN is in the ARN's region, whatever
        // region the AWS settings name.
        if let Some(region) = arn_region(stream) {
            conf = conf.region(aws_sdk_kinesis::config::Region::new(region));
        }
        let conf = conf.build();
        Ok(KinesisStream {
            client: aws_sdk_kinesis::Client::from_conf(conf),
            stream: stream.clone(),
            by_arn: stream.starts_with("arn:"),
            requests: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            planner: false,
        })
    }

    /// Count a call (a Plan step's also in [`PLANNER_TALLY`]).
    fn count_call(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        CALLS.fetch_add(1, Ordering::Relaxed);
        if self.planner
            && let Ok(mut m) = PLANNER_TALLY.lock()
        {
            m.entry(self.stream.clone()).or_default().0 += 1;
        }
    }

    fn name(&self) -> Option<String> {
        (!self.by_arn).then(|| self.stream.clone())
    }

    fn arn(&self) -> Option<String> {
        self.by_arn.then(|| self.stream.clone())
    }

    /// Classify an SDK error of `what`.
    fn failure<E, R>(&self, what: &str, e: aws_sdk_kinesis::error::SdkError<E, R>) -> Failure
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug,
    {
        use aws_sdk_kinesis::error::SdkError;
        let code = e.code().unwrap_or_default().to_string();
        match code.as_str() {
            "ProvisionedThroughputExceededException" | "LimitExceededException" => {
                return Failure::Throttled;
            }
            "ExpiredIteratorException" => return Failure::Expired,
            _ => {}
        }
        let message = e.message().unwrap_or_default().to_string();
        let (class, message) = match (&e, code.as_str()) {
            (_, "ResourceNotFoundException") => (
                ErrorClass::InvalidInput,
                format!(
                    "stream \"{}\" does not exist (or is not visible to these credentials in \
                     this region): create it, or fix source.uri ({message})",
                    self.stream
                ),
            ),
            (_, "InvalidArgumentException") => (
                ErrorClass::InvalidInput,
                format!(
                    "{what} on stream \"{}\" was refused: {message}",
                    self.stream
                ),
            ),
            (_, "AccessDeniedException") => (
                ErrorClass::Fatal,
                format!(
                    "{what} on stream \"{}\" was denied: grant kinesis:ListShards, \
                     GetShardIterator and GetRecords on it ({message})",
                    self.stream
                ),
            ),
            (SdkError::DispatchFailure(_) | SdkError::TimeoutError(_), _) => (
                ErrorClass::Retryable,
                format!(
                    "{what} on stream \"{}\": the Kinesis endpoint did not answer: {}",
                    self.stream,
                    aws_sdk_kinesis::error::DisplayErrorContext(&e)
                ),
            ),
            _ => (
                ErrorClass::Retryable,
                format!(
                    "{what} on stream \"{}\" failed: {code} {message}",
                    self.stream
                ),
            ),
        };
        Failure::Other(Error::Service {
            service: "kinesis",
            message,
            class,
        })
    }

    /// Wait before calling again after a refusal for throughput (`tries`
    /// so far), or fail once the step's time for it is spent.
    async fn back_off(&self, what: &str, tries: u32, since: std::time::Instant) -> Result<()> {
        self.throttled.fetch_add(1, Ordering::Relaxed);
        if self.planner
            && let Ok(mut m) = PLANNER_TALLY.lock()
        {
            m.entry(self.stream.clone()).or_default().1 += 1;
        }
        if since.elapsed() >= call_timeout() {
            return Err(Error::Service {
                service: "kinesis",
                message: format!(
                    "{what} on stream \"{}\" was refused for throughput for {} s (another reader \
                     shares the shard's 5 reads a second and 2 MB/s); the step is retried",
                    self.stream,
                    since.elapsed().as_secs()
                ),
                class: ErrorClass::Retryable,
            });
        }
        let ms = (250u64 << tries.min(5)).min(5_000);
        tracing::debug!(stream = %self.stream, what, ms, "throttled; backing off");
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(())
    }

    /// The stream's shards, with their lineage (every page of ListShards).
    async fn shards(&self) -> Result<Vec<Shard>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        let (since, mut tries) = (std::time::Instant::now(), 0);
        loop {
            let call = match &token {
                // A page after the first names only its token.
                Some(t) => self.client.list_shards().next_token(t),
                None => self
                    .client
                    .list_shards()
                    .set_stream_name(self.name())
                    .set_stream_arn(self.arn()),
            };
            self.count_call();
            let page = match call.send().await {
                Ok(p) => p,
                Err(e) => match self.failure("ListShards", e) {
                    Failure::Throttled | Failure::Expired => {
                        self.back_off("ListShards", tries, since).await?;
                        tries += 1;
                        continue;
                    }
                    Failure::Other(e) => return Err(e),
                },
            };
            for s in page.shards() {
                let closed = s
                    .sequence_number_range()
                    .is_some_and(|r| r.ending_sequence_number().is_some());
                out.push(Shard {
                    id: s.shard_id().to_string(),
                    parents: [s.parent_shard_id(), s.adjacent_parent_shard_id()]
                        .into_iter()
                        .flatten()
                        .map(str::to_string)
                        .collect(),
                    closed,
                });
            }
            token = page.next_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// An iterator from `start` in `shard` (`None`: the shard is closed
    /// and nothing follows `start`).
    async fn iterator(&self, shard: &str, start: &Start) -> Result<Option<String>> {
        let (since, mut tries) = (std::time::Instant::now(), 0);
        loop {
            let mut call = self
                .client
                .get_shard_iterator()
                .set_stream_name(self.name())
                .set_stream_arn(self.arn())
                .shard_id(shard);
            call = match start {
                Start::After(s) => call
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .starting_sequence_number(s),
                Start::AtSeq(s) => call
                    .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                    .starting_sequence_number(s),
                Start::At(ms) => call
                    .shard_iterator_type(ShardIteratorType::AtTimestamp)
                    .timestamp(aws_sdk_kinesis::primitives::DateTime::from_millis(*ms)),
                Start::TrimHorizon => call.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            self.count_call();
            match call.send().await {
                Ok(o) => return Ok(o.shard_iterator().map(str::to_string)),
                Err(e) => match self.failure("GetShardIterator", e) {
                    Failure::Throttled | Failure::Expired => {
                        self.back_off("GetShardIterator", tries, since).await?;
                        tries += 1;
                    }
                    Failure::Other(e) => return Err(e),
                },
            }
        }
    }

    /// One page of at most `limit` records from `iterator` (`Ok(None)`:
    /// the iterator expired).
    async fn page(&self, iterator: &str, limit: u64) -> Result<Option<Page>> {
        let (since, mut tries) = (std::time::Instant::now(), 0);
        loop {
            self.count_call();
            let sent = self
                .client
                .get_records()
                .shard_iterator(iterator)
                .set_stream_arn(self.arn())
                .limit(limit.clamp(1, PAGE) as i32)
                .send()
                .await;
            let out = match sent {
                Ok(o) => o,
                Err(e) => match self.failure("GetRecords", e) {
                    Failure::Throttled => {
                        self.back_off("GetRecords", tries, since).await?;
                        tries += 1;
                        continue;
                    }
                    Failure::Expired => return Ok(None),
                    Failure::Other(e) => return Err(e),
                },
            };
            let records = out
                .records()
                .iter()
                .map(|r| LogRecord {
                    offset: 0,
                    timestamp_ms: r.approximate_arrival_timestamp().map_or(0, arrival_ms),
                    key: r.partition_key().map(|k| k.as_bytes().to_vec()),
                    value: Some(r.data().as_ref().to_vec()),
                    seq: Some(r.sequence_number().to_string()),
                })
                .collect();
            return Ok(Some(Page {
                records,
                next: out.next_shard_iterator().map(str::to_string),
                behind_ms: out.millis_behind_latest().unwrap_or(0),
            }));
        }
    }

    /// How long the stream keeps records, whether it is in on-demand
    /// capacity mode, and its ARN (DescribeStreamSummary).
    async fn summary(&self) -> Result<(i64, bool, String)> {
        let (since, mut tries) = (std::time::Instant::now(), 0);
        loop {
            self.count_call();
            let sent = self
                .client
                .describe_stream_summary()
                .set_stream_name(self.name())
                .set_stream_arn(self.arn())
                .send()
                .await;
            match sent {
                Ok(o) => {
                    let d = o.stream_description_summary();
                    let hours = d.map_or(24, |d| d.retention_period_hours());
                    let on_demand = d.and_then(|d| d.stream_mode_details()).is_some_and(|m| {
                        *m.stream_mode() == aws_sdk_kinesis::types::StreamMode::OnDemand
                    });
                    let arn = d.map(|d| d.stream_arn().to_string()).unwrap_or_default();
                    return Ok((i64::from(hours) * 3_600_000, on_demand, arn));
                }
                Err(e) => match self.failure("DescribeStreamSummary", e) {
                    Failure::Throttled | Failure::Expired => {
                        self.back_off("DescribeStreamSummary", tries, since).await?;
                        tries += 1;
                    }
                    Failure::Other(e) => return Err(e),
                },
            }
        }
    }

    /// Whether the record `seq` is still in `shard` (`None`: it is, so no
    /// record after it expired: retention takes only the oldest); else the
    /// first record the shard still holds (`Some(None)`: none).
    async fn gone(&self, shard: &str, seq: &str) -> Result<Option<Option<String>>> {
        let it = match self.iterator(shard, &Start::AtSeq(seq.to_string())).await {
            Ok(it) => it,
            // Kinesis may refuse a sequence number it no longer holds.
            Err(e) if e.class() == ErrorClass::InvalidInput => None,
            Err(e) => return Err(e),
        };
        if let Some(it) = it
            && let Some(page) = self.page(&it, 1).await?
            && let Some(first) = page.records.first()
            && first.seq.as_deref() == Some(seq)
        {
            return Ok(None);
        }
        let first = match self.iterator(shard, &Start::TrimHorizon).await? {
            Some(it) => self
                .page(&it, 1)
                .await?
                .and_then(|p| p.records.first().and_then(|r| r.seq.clone())),
            None => None,
        };
        Ok(Some(first))
    }

    /// The last sequence number `shard` holds after `start` now (`None`:
    /// none): pages read from `start` to the tip.
    async fn last_after(&self, shard: &str, start: &Start) -> Result<Option<String>> {
        let mut last = None;
        let mut it = self.iterator(shard, start).await?;
        let mut first = true;
        while let Some(i) = it {
            if !first {
                tokio::time::sleep(PACE).await;
            }
            first = false;
            let Some(page) = self.page(&i, PAGE).await? else {
                // Expired mid-look: go on after the last record seen.
                let from = last.clone().map_or(start.clone(), Start::After);
                it = self.iterator(shard, &from).await?;
                continue;
            };
            if let Some(r) = page.records.last() {
                last = r.seq.clone();
            }
            if page.caught_up(PAGE) {
                break;
            }
            it = page.next;
        }
        Ok(last)
    }

    /// Where the run stops in the open `shard`: its newest record's
    /// sequence number. Found by probing back from now (0.1 s, then ten
    /// times further each time: [`LOOK_BACK_MS`]) with one record, for the
    /// first window that holds one. That record's arrival time plus how far
    /// it is behind the tip (`MillisBehindLatest`) estimates the newest
    /// record's arrival; the look reads to the tip from a second before
    /// that (from the window's start if nothing is there). The answer is
    /// always read to the tip, so a wrong estimate or arrival times out of
    /// order cost calls, never the right end. With nothing in 6 hours, it
    /// reads from `from` (the cursor) to the tip.
    async fn newest(&self, shard: &str, from: &Start, now_ms: i64) -> Result<Option<String>> {
        for back in LOOK_BACK_MS {
            let at = now_ms - back;
            let Some(it) = self.iterator(shard, &Start::At(at)).await? else {
                return Ok(None);
            };
            let Some(page) = self.page(&it, 1).await? else {
                // Expired at once (not on Kinesis): read the window.
                return self.last_after(shard, &Start::At(at)).await;
            };
            let Some(first) = page.records.first() else {
                continue;
            };
            let tip_ms = first.timestamp_ms.saturating_add(page.behind_ms);
            let near = (tip_ms - 1_000).max(at);
            if near > at
                && let Some(last) = self.last_after(shard, &Start::At(near)).await?
            {
                return Ok(Some(last));
            }
            return self.last_after(shard, &Start::At(at)).await;
        }
        self.last_after(shard, from).await
    }

    /// The records of `unit`, and what was read.
    async fn read(&self, unit: &ShardUnit) -> Result<(Vec<LogRecord>, ShardRead)> {
        let before = self.requests.load(Ordering::Relaxed);
        let throttled_before = self.throttled.load(Ordering::Relaxed);
        let start = Start::of(unit.after.as_deref(), unit.from_ms);
        let mut out: Vec<LogRecord> = Vec::new();
        let mut read = ShardRead {
            shard: unit.shard.clone(),
            ..Default::default()
        };
        let mut it = self.iterator(&unit.shard, &start).await?;
        let mut first = true;
        'pages: loop {
            let Some(i) = it else {
                read.ended = true;
                break;
            };
            if !first {
                tokio::time::sleep(PACE).await;
            }
            first = false;
            let want = (unit.limit - out.len() as u64).min(PAGE);
            let Some(page) = self.page(&i, want).await? else {
                let from = out
                    .last()
                    .and_then(|r| r.seq.clone())
                    .map_or(start.clone(), Start::After);
                it = self.iterator(&unit.shard, &from).await?;
                continue;
            };
            let caught_up = page.caught_up(want);
            for r in page.records {
                let seq = r.seq.as_deref().unwrap_or_default();
                if unit
                    .until
                    .as_deref()
                    .is_some_and(|u| seq_cmp(seq, u).is_gt())
                {
                    break 'pages;
                }
                let reached = unit.until.as_deref() == Some(seq);
                out.push(r);
                if reached || out.len() as u64 >= unit.limit {
                    break 'pages;
                }
            }
            if page.next.is_none() {
                read.ended = true;
                break;
            }
            if caught_up {
                // At the tip before the run's end in this shard: nothing
                // up to it is left to read (trimming takes only the
                // oldest records), so the cursor may move to it.
                if let Some(u) = &unit.until {
                    read.last = Some(u.clone());
                }
                break;
            }
            it = page.next;
        }
        if let Some(r) = out.last() {
            read.last = r.seq.clone();
        }
        read.records = out.len() as u64;
        read.bytes = out
            .iter()
            .map(|r| r.value.as_ref().map_or(0, Vec::len) as u64)
            .sum();
        read.requests = self.requests.load(Ordering::Relaxed) - before;
        read.throttled = self.throttled.load(Ordering::Relaxed) - throttled_before;
        Ok((out, read))
    }
}

/// How many shards the stream of `source` lists, and how many are open
/// (`sluice check`).
/// `sluice check` and `sluice show`: the source still names the stream
/// its checkpoint's positions are in, by name and (once recorded) by the
/// ARN the AWS settings reach now (one DescribeStreamSummary call).
pub(crate) async fn same_stream_now(p: &Pipeline, control: &Control) -> Result<()> {
    same_stream_at(p, control, &KinesisStream::open(&p.source).await?).await
}

/// [`same_stream_now`] through `stream`, already open.
async fn same_stream_at(p: &Pipeline, control: &Control, stream: &KinesisStream) -> Result<()> {
    same_stream(p, control)?;
    if control.stream_arn.is_empty() {
        return Ok(());
    }
    same_arn(p, control, &stream.summary().await?.2)
}

pub(crate) async fn shard_counts(source: &crate::pipeline::Source) -> Result<(usize, usize)> {
    let shards = KinesisStream::open(source).await?.shards().await?;
    let open = shards.iter().filter(|s| !s.closed).count();
    Ok((shards.len(), open))
}

/// Whether records after a cursor last caught up at `caught_up_ms` may
/// have expired by `now_ms`: never caught up, or caught up longer ago than
/// the stream's retention (asked once, only when the shortest retention
/// does not settle it), less a margin for the clocks.
async fn may_have_lost(
    stream: &KinesisStream,
    retention: &mut Option<i64>,
    caught_up_ms: Option<i64>,
    now_ms: i64,
) -> Result<bool> {
    let Some(at) = caught_up_ms else {
        return Ok(true);
    };
    if at >= now_ms - MIN_RETENTION_MS + RETENTION_MARGIN_MS {
        return Ok(false);
    }
    let kept = match *retention {
        Some(r) => r,
        None => *retention.insert(stream.summary().await?.0),
    };
    Ok(at < now_ms - kept + RETENTION_MARGIN_MS)
}

/// An arrival time in ms. Kinesis gives milliseconds as fractional
/// seconds (`1796328796.021`), which parse to a hair under the
/// millisecond: rounded, not truncated.
fn arrival_ms(t: &aws_sdk_kinesis::primitives::DateTime) -> i64 {
    t.secs() * 1000 + i64::from((t.subsec_nanos() + 500_000) / 1_000_000)
}

/// The stream a `kinesis://` source names.
fn stream_of(p: &Pipeline) -> &str {
    match &p.source.location {
        crate::storage::Location::Kinesis { stream } => stream,
        _ => "",
    }
}

/// A shard's cursor in `control` (none yet: from its start).
fn cursor_of<'a>(control: &'a Control, shard: &str) -> Option<&'a ShardCursor> {
    control.stream_shards.get(shard)
}

/// Whether `shard` may be read: each parent is drained, or unknown to the
/// checkpoint and gone from the stream (expired before the pipeline knew
/// it, or before the pipeline started).
fn readable(
    parents: &[String],
    cursors: &BTreeMap<String, ShardCursor>,
    listed: &[String],
) -> bool {
    parents.iter().all(|p| match cursors.get(p) {
        Some(c) => c.drained,
        None => !listed.contains(p),
    })
}

/// Whether `cursor` has reached the run's end `until` in its shard.
fn reached(cursor: Option<&ShardCursor>, until: &ShardUntil) -> bool {
    if cursor.is_some_and(|c| c.drained) {
        return true;
    }
    if until.closed {
        return false;
    }
    match (&until.last, cursor.and_then(|c| c.after.as_deref())) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(last), Some(after)) => seq_cmp(after, last).is_ge(),
    }
}

/// The idle look: a started pipeline whose every listed shard is drained,
/// or has nothing after its cursor (one GetShardIterator and one
/// GetRecords of one record each), and that knows every shard, has
/// nothing to do. Otherwise the first waiting records are sampled into
/// the source's memory store as a file, for the schema.
pub(crate) async fn look(
    ctx: &Scope<'_>,
    control: Option<&Control>,
    settled: bool,
) -> Result<Look> {
    // Another stream's positions would make the look idle, or wrong.
    if let Some(c) = control {
        same_stream(ctx.pipeline, c)?;
    }
    let stream = KinesisStream::for_plan(&ctx.pipeline.source).await?;
    let shards = stream.shards().await?;
    let listed: Vec<String> = shards.iter().map(|s| s.id.clone()).collect();
    let cursors = control.map(|c| c.stream_shards.clone()).unwrap_or_default();
    let started = !cursors.is_empty();
    // A checkpoint shard gone from the stream before it was drained: the
    // plan decides (records lost).
    let mut due = cursors
        .iter()
        .any(|(id, c)| !c.drained && !listed.contains(id));
    let mut sample: Vec<LogRecord> = Vec::new();
    let mut sample_shard = String::new();
    for s in &shards {
        let cursor = cursors.get(&s.id);
        if cursor.is_some_and(|c| c.drained) || !readable(&s.parents, &cursors, &listed) {
            continue;
        }
        if cursor.is_none() && started {
            // A shard the checkpoint does not know yet (a reshard): the
            // plan records it.
            due = true;
        }
        let start = match cursor {
            Some(c) => Start::of(c.after.as_deref(), c.from_ms),
            None => Start::of(None, ctx.pipeline.source.starting_at_ms),
        };
        let Some(it) = stream.iterator(&s.id, &start).await? else {
            // Closed and nothing after the cursor: drained once a run
            // reads its end.
            due = true;
            continue;
        };
        let want = if sample.is_empty() { SAMPLE as u64 } else { 1 };
        let Some(page) = stream.page(&it, want).await? else {
            due = true;
            continue;
        };
        if page.next.is_none() {
            due = true;
        }
        if page.records.is_empty() {
            continue;
        }
        due = true;
        if sample.is_empty() {
            sample = page.records;
            sample_shard = s.id.clone();
        }
        if settled && started {
            // Something waits: no need to look at the other shards.
            break;
        }
    }
    if settled && started && !due {
        return Ok(Look::Idle);
    }
    let mut listed_files = Vec::new();
    let raw = ctx.pipeline.source.raw;
    let kept: Vec<LogRecord> = sample
        .into_iter()
        .filter(|r| {
            raw || r
                .value
                .as_deref()
                .and_then(super::kafka::one_object)
                .is_some_and(|b| !b.trim().is_empty())
        })
        .collect();
    if !kept.is_empty() {
        let meta = Meta::shard(
            &sample_shard,
            Some(datafusion::arrow::datatypes::TimeUnit::Microsecond),
            raw,
        );
        let (body, _) = super::kafka::shaped_lines(&meta, &kept);
        let key = crate::paths::stream::shard_unit(&sample_shard, None);
        let size = body.len() as u64;
        ctx.source
            .put(&key, body.into(), PutMode::Overwrite)
            .await?;
        listed_files.push(ObjectMeta {
            key,
            size,
            etag: None,
            last_modified: None,
        });
    }
    Ok(Look::Maybe(Looked::sampled(listed_files, due || !started)))
}

/// Before the lease: whether the run goes on.
pub(crate) fn pending(
    control: Option<&Control>,
    looked: &Looked,
    recover: bool,
    owed: bool,
) -> Option<Seen> {
    let started = control.is_some_and(|c| !c.stream_shards.is_empty());
    (recover || owed || !started || looked.stream_due).then_some(Seen::Nothing)
}

/// Under the lease: the next batch's shard units. The run's first plan
/// lists the shards and finds where the run stops in each (recorded in
/// control with any shard the checkpoint did not know, so every later plan
/// of the run, and a plan retried, reads the same ends); later plans read
/// only control.
pub(crate) async fn find_new(ctx: &Scope<'_>, epoch: u64, control: &Control) -> Result<Waiting> {
    let p = &ctx.pipeline;
    let name = stream_of(p).to_string();
    same_stream(p, control)?;
    let mut shard_losses = Vec::new();
    // The end an earlier execution recorded holds for the whole run: an
    // execution that handed over at its batch budget leaves the run to
    // the next, and records that arrived since wait for the next run (else
    // a run would never end under steady input). The end then passes to
    // this execution's epoch, so its later plans keep it too. A run that
    // died or was cancelled ended its run: the one taking over finishes the
    // batch it planned (`resume_planned`) and then looks anew, so it reads
    // what arrived meanwhile (Spark's `AvailableNow` after a restart).
    let control = match &control.stream_until {
        Some(u) if u.epoch == epoch => control.clone(),
        Some(u) if u.handed_over => {
            // A new execution: the same stream (region, account) still.
            let stream = KinesisStream::for_plan(&p.source).await?;
            same_arn(p, control, &stream.summary().await?.2)?;
            let mut next = control.clone();
            let mut kept = u.clone();
            kept.epoch = epoch;
            kept.handed_over = false;
            next.stream_until = Some(kept.clone());
            ctx.checkpoint
                .update_control(epoch, &|c| c.stream_until = Some(kept.clone()))
                .await?;
            next
        }
        _ => {
            let stream = KinesisStream::for_plan(&p.source).await?;
            let shards = stream.shards().await?;
            let listed: Vec<String> = shards.iter().map(|s| s.id.clone()).collect();
            let fresh = control.stream_shards.is_empty();
            // Where to look for the newest records: the wall clock (the
            // stream's arrival times are Kinesis'); the retention rule
            // runs on the run's clock.
            let wall_ms = chrono::Utc::now().timestamp_millis();
            let now_ms = ctx.now_ms;
            // How long the stream keeps records, and its capacity mode
            // (what its reads cost: `sluice cost`).
            let (kept, on_demand, arn) = stream.summary().await?;
            same_arn(p, control, &arn)?;
            let mut retention = Some(kept);
            let mut losses = Vec::new();
            let mut until = BTreeMap::new();
            let mut cursors = control.stream_shards.clone();
            for s in &shards {
                let mut cursor = cursors.get(&s.id).cloned().unwrap_or_else(|| ShardCursor {
                    from_ms: if fresh { p.source.starting_at_ms } else { None },
                    ..Default::default()
                });
                cursor.parents = s.parents.clone();
                // A cursor not caught up within the retention: its record
                // must still be there, or records after it may have
                // expired unread.
                if let Some(after) = cursor.after.clone()
                    && !cursor.drained
                    && may_have_lost(&stream, &mut retention, cursor.caught_up_ms, now_ms).await?
                    && let Some(first) = stream.gone(&s.id, &after).await?
                {
                    losses.push(format!(
                        "shard {}: the records after sequence number {after} (read up to there) \
                         expired (retention) before they were read{}",
                        s.id,
                        first
                            .as_deref()
                            .map(|f| format!("; the oldest left is {f}"))
                            .unwrap_or_default()
                    ));
                    shard_losses.push(ShardLoss {
                        shard: s.id.clone(),
                        after: Some(after),
                        message: match &first {
                            Some(f) => format!("expired unread up to the oldest left, {f}"),
                            None => "expired unread; the shard holds no record now".into(),
                        },
                    });
                    // On from the oldest record left (every record up to
                    // the cursor expired with it).
                    cursor.after = None;
                    cursor.from_ms = None;
                }
                cursors.insert(s.id.clone(), cursor);
            }
            // Each open shard's newest record, every shard at once (each
            // read paces itself on its own shard).
            let lasts = futures::future::join_all(shards.iter().map(|s| {
                let cursor = &cursors[&s.id];
                let (stream, closed, drained) = (&stream, s.closed, cursor.drained);
                let from = Start::of(cursor.after.as_deref(), cursor.from_ms);
                async move {
                    if closed || drained {
                        Ok(None)
                    } else {
                        stream.newest(&s.id, &from, wall_ms).await
                    }
                }
            }))
            .await;
            for (s, last) in shards.iter().zip(lasts) {
                let last = last?;
                let mut cursor = cursors[&s.id].clone();
                // A new pipeline reading from the stream's end starts
                // after each shard's newest record.
                if fresh
                    && p.source.starting_offsets == StartingOffsets::Latest
                    && cursor.after.is_none()
                {
                    cursor.after = last.clone();
                    if s.closed {
                        cursor.drained = true;
                    }
                }
                let end = ShardUntil {
                    last,
                    closed: s.closed,
                    parents: s.parents.clone(),
                };
                if reached(Some(&cursor), &end) && !s.closed {
                    cursor.caught_up_ms = Some(now_ms);
                }
                until.insert(s.id.clone(), end);
                cursors.insert(s.id.clone(), cursor);
            }
            // Shards of the checkpoint the stream no longer lists, not
            // read to their end: unless nothing followed the cursor within
            // the retention, their unread records expired.
            for (id, c) in cursors.iter_mut() {
                if listed.contains(id) || c.drained {
                    continue;
                }
                c.drained = true;
                if !may_have_lost(&stream, &mut retention, c.caught_up_ms, now_ms).await? {
                    continue;
                }
                losses.push(format!(
                    "shard {id} is gone from the stream (its retention passed) before it was \
                     read to its end{}",
                    c.after
                        .as_deref()
                        .map(|a| format!(" (read up to sequence number {a})"))
                        .unwrap_or_default()
                ));
                shard_losses.push(ShardLoss {
                    shard: id.clone(),
                    after: c.after.clone(),
                    message: "gone from the stream before it was read to its end".into(),
                });
            }
            if !losses.is_empty() {
                if p.source.on_data_loss == DataLossPolicy::Fail {
                    return Err(Error::Input {
                        pipeline: p.name.clone(),
                        batch: Some(control.next_batch()),
                        key: name.clone(),
                        message: format!(
                            "{}; nothing was read. Set source.on_data_loss = \"skip\" to go on \
                             (the loss is recorded), or `sluice reset` to start over",
                            losses.join("; ")
                        ),
                    });
                }
                tracing::warn!(pipeline = %p.name, lost = %losses.join("; "), "records lost; going on (on_data_loss = \"skip\")");
            }
            let record = StreamUntil {
                epoch,
                captured_ms: now_ms,
                shards: until,
                handed_over: false,
                on_demand,
            };
            let (record2, cursors2, name2) = (record.clone(), cursors.clone(), name.clone());
            let arn2 = arn.clone();
            ctx.checkpoint
                .update_control(epoch, &|c| {
                    c.stream_until = Some(record2.clone());
                    c.stream_shards = cursors2.clone();
                    c.stream_topic = name2.clone();
                    c.stream_arn = arn2.clone();
                })
                .await?;
            let mut next = control.clone();
            next.stream_until = Some(record);
            next.stream_shards = cursors;
            next.stream_topic = name.clone();
            next.stream_arn = arn;
            next
        }
    };
    let shards = units(p, &control);
    let (requests, throttled) = planner_tally(&name);
    Ok(Waiting {
        shards,
        shard_losses,
        throttled,
        requests,
        on_demand: control.stream_until.as_ref().is_some_and(|u| u.on_demand),
        ..Default::default()
    })
}

/// Refuse a `source.uri` that names another stream than the one the
/// checkpoint's positions are in (a name and its ARN are the same
/// stream): `sluice check` and every plan ask.
pub(crate) fn same_stream(p: &Pipeline, control: &Control) -> Result<()> {
    use crate::storage::kinesis_stream_name as short;
    let name = stream_of(p);
    if !control.stream_started()
        || control.stream_topic.is_empty()
        || short(&control.stream_topic) == short(name)
    {
        return Ok(());
    }
    Err(Error::Incompatible {
        pipeline: p.name.clone(),
        message: format!(
            "source.uri now names stream \"{name}\", but the checkpoint's positions are \
             stream \"{}\"'s: sequence numbers of another stream would skip or repeat \
             records. Restore source.uri, or run `sluice reset` on the pipeline file to \
             start over",
            control.stream_topic
        ),
    })
}

/// The region of a stream ARN (`arn:aws:kinesis:REGION:ACCOUNT:stream/NAME`);
/// `None` for a name.
fn arn_region(stream: &str) -> Option<String> {
    let mut parts = stream.strip_prefix("arn:")?.split(':');
    let region = parts.nth(2)?;
    (!region.is_empty()).then(|| region.to_string())
}

/// Refuse a stream of the source's name or ARN that is not the one the
/// checkpoint's positions are of: `arn` (what Kinesis calls the stream
/// now) differs from the one recorded, so the region or account the AWS
/// settings reach changed.
fn same_arn(p: &Pipeline, control: &Control, arn: &str) -> Result<()> {
    if control.stream_arn.is_empty() || arn.is_empty() || control.stream_arn == arn {
        return Ok(());
    }
    // An ARN written in source.uri names the other stream itself; a name
    // reaches it through the AWS settings.
    let (reaches, advice) = if stream_of(p).starts_with("arn:") {
        ("names", "Restore source.uri")
    } else {
        (
            "now reaches",
            "Check AWS_REGION, AWS_PROFILE and the credentials: run with the AWS settings that \
             reach the stream",
        )
    };
    Err(Error::Incompatible {
        pipeline: p.name.clone(),
        message: format!(
            "source.uri \"{}\" {reaches} stream {arn}, but the checkpoint's positions are \
             stream {}'s (another region or account): sequence numbers of another stream would \
             skip or repeat records. {advice}, or run `sluice reset` on the pipeline file to \
             start over on this one",
            p.source.location.display(),
            control.stream_arn
        ),
    })
}

/// The next batch's units: one per readable shard that has not reached
/// the end `control.stream_until` records in it, each at most an equal
/// share of the batch's records (at least one).
fn units(p: &Pipeline, control: &Control) -> Vec<ShardUnit> {
    let Some(until) = control.stream_until.as_ref() else {
        return Vec::new();
    };
    let listed: Vec<String> = until.shards.keys().cloned().collect();
    let mut open: Vec<(&String, &ShardUntil)> = Vec::new();
    for (id, u) in &until.shards {
        let cursor = cursor_of(control, id);
        if reached(cursor, u) || !readable(&u.parents, &control.stream_shards, &listed) {
            continue;
        }
        open.push((id, u));
    }
    let limits = &p.limits;
    let share = if open.is_empty() {
        0
    } else {
        (limits.max_records_per_batch / open.len() as u64)
            .min(limits.max_records_per_task)
            .max(1)
    };
    open.into_iter()
        .map(|(id, u)| {
            let c = cursor_of(control, id).cloned().unwrap_or_default();
            ShardUnit {
                shard: id.clone(),
                after: c.after.clone(),
                from_ms: if c.after.is_none() { c.from_ms } else { None },
                until: if u.closed { None } else { u.last.clone() },
                limit: share,
            }
        })
        .collect()
}

/// A task of a Kinesis batch: its units read (each shard on a task of its
/// own) into memory as JSON Lines files, with what was read of each.
pub(crate) async fn read_task(
    p: &Pipeline,
    stream_plan: &checkpoint::StreamPlan,
    task: &checkpoint::TaskPlan,
    schema: &datafusion::arrow::datatypes::Schema,
) -> Result<ReadUnits> {
    let units: Vec<ShardUnit> = task
        .inputs
        .iter()
        .map(|i| stream_plan.shards.get(*i as usize).cloned())
        .collect::<Option<_>>()
        .ok_or_else(|| Error::Checkpoint {
            pipeline: p.name.clone(),
            key: String::new(),
            message: format!(
                "task {} names a shard unit past the plan's {}; the plan is corrupt",
                task.task,
                stream_plan.shards.len()
            ),
        })?;
    let raw = p.source.raw;
    let column = if raw {
        "approximate_arrival_timestamp"
    } else {
        "_arrival_timestamp"
    };
    let timestamp_unit = match schema.field_with_name(column).map(|f| f.data_type()) {
        Ok(datafusion::arrow::datatypes::DataType::Timestamp(unit, _)) => Some(*unit),
        _ => None,
    };
    let stream = Arc::new(KinesisStream::open(&p.source).await?);
    let reads = units.into_iter().map(|u| {
        let stream = stream.clone();
        tokio::spawn(async move {
            let (records, read) = stream.read(&u).await?;
            let meta = Meta::shard(&u.shard, timestamp_unit, raw);
            let (body, shapes) = super::kafka::shaped_lines(&meta, &records);
            Ok::<_, Error>((u, body, shapes, read))
        })
    });
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut files = Vec::new();
    let mut shapes = std::collections::HashMap::new();
    let mut shard_reads = Vec::new();
    for done in futures::future::join_all(reads).await {
        let (u, body, lines, read) = done.map_err(|e| Error::Service {
            service: "kinesis",
            message: format!("a read task failed: {e}"),
            class: ErrorClass::Retryable,
        })??;
        let key = crate::paths::stream::shard_unit(&u.shard, u.after.as_deref());
        let shapes_key = crate::paths::stream::shapes(&key);
        let file = |key: &str, size: usize| InputFile {
            key: key.to_string(),
            size: size as u64,
            etag: None,
            modified_ms: None,
            partition: None,
        };
        shapes.insert(key.clone(), file(&shapes_key, lines.len()));
        files.push(file(&key, body.len()));
        store
            .put(&shapes_key, Bytes::from(lines), PutMode::Overwrite)
            .await?;
        store
            .put(&key, Bytes::from(body), PutMode::Overwrite)
            .await?;
        shard_reads.push(read);
    }
    let plan = checkpoint::TaskPlan {
        task: task.task,
        inputs: (0..files.len() as u32).collect(),
        bytes: files.iter().map(|f| f.size).sum(),
    };
    Ok(ReadUnits {
        store,
        files,
        plan,
        shapes,
        shard_reads,
    })
}

/// What waits (`sluice show`): per readable shard with records after its
/// cursor, the records one page holds (at most 10,000: a lower bound) and
/// the first one's arrival time.
pub(crate) async fn waiting(ctx: &Scope<'_>, control: Option<&Control>) -> Result<Vec<ObjectMeta>> {
    let stream = KinesisStream::open(&ctx.pipeline.source).await?;
    // Another stream's records are not this pipeline's backlog.
    if let Some(c) = control {
        same_stream_at(ctx.pipeline, c, &stream).await?;
    }
    let shards = stream.shards().await?;
    let listed: Vec<String> = shards.iter().map(|s| s.id.clone()).collect();
    let cursors = control.map(|c| c.stream_shards.clone()).unwrap_or_default();
    let from_end =
        cursors.is_empty() && ctx.pipeline.source.starting_offsets == StartingOffsets::Latest;
    let mut out = Vec::new();
    if from_end {
        return Ok(out);
    }
    for s in &shards {
        let cursor = cursors.get(&s.id);
        if cursor.is_some_and(|c| c.drained) || !readable(&s.parents, &cursors, &listed) {
            continue;
        }
        let start = match cursor {
            Some(c) => Start::of(c.after.as_deref(), c.from_ms),
            None => Start::of(None, ctx.pipeline.source.starting_at_ms),
        };
        let Some(it) = stream.iterator(&s.id, &start).await? else {
            continue;
        };
        let Some(page) = stream.page(&it, PAGE).await? else {
            continue;
        };
        let Some(first) = page.records.first() else {
            continue;
        };
        out.push(ObjectMeta {
            key: crate::paths::stream::shard_unit(&s.id, cursor.and_then(|c| c.after.as_deref())),
            size: page.records.len() as u64,
            etag: None,
            last_modified: chrono::DateTime::from_timestamp_millis(first.timestamp_ms),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(after: Option<&str>, drained: bool) -> ShardCursor {
        ShardCursor {
            after: after.map(str::to_string),
            drained,
            ..Default::default()
        }
    }

    #[test]
    fn a_stream_arn_names_its_region() {
        assert_eq!(
            arn_region("arn:aws:kinesis:eu-west-1:123456789012:stream/rides").as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(
            arn_region("arn:aws-cn:kinesis:cn-north-1:123456789012:stream/r").as_deref(),
            Some("cn-north-1")
        );
        assert_eq!(arn_region("rides"), None);
        assert_eq!(arn_region("arn:aws:kinesis::1:stream/r"), None);
    }

    #[test]
    fn arrival_times_are_rounded_to_their_millisecond() {
        for (secs, ms) in [
            (1_796_328_796.021, 1_796_328_796_021),
            (1_796_328_862.1, 1_796_328_862_100),
            (1_764_504_000.0, 1_764_504_000_000),
            (1_764_504_000.999, 1_764_504_000_999),
        ] {
            let t = aws_sdk_kinesis::primitives::DateTime::from_secs_f64(secs);
            assert_eq!(arrival_ms(&t), ms, "{secs}");
        }
    }

    #[test]
    fn a_child_waits_for_every_parent_it_knows_to_drain() {
        let listed = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let mut cursors = BTreeMap::new();
        cursors.insert("a".to_string(), cursor(Some("5"), false));
        cursors.insert("b".to_string(), cursor(None, true));
        let parents = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(readable(&parents(&[]), &cursors, &listed));
        assert!(!readable(&parents(&["a"]), &cursors, &listed));
        assert!(readable(&parents(&["b"]), &cursors, &listed));
        // A merge waits for both parents.
        assert!(!readable(&parents(&["a", "b"]), &cursors, &listed));
        // A listed parent the checkpoint does not know yet holds back.
        assert!(!readable(&parents(&["c"]), &cursors, &listed));
        // A parent gone from the stream and never known does not.
        assert!(readable(&parents(&["gone"]), &cursors, &listed));
    }

    #[test]
    fn a_shard_is_done_at_its_runs_end_and_a_closed_one_when_drained() {
        let open = |last: Option<&str>| ShardUntil {
            last: last.map(str::to_string),
            ..Default::default()
        };
        let closed = ShardUntil {
            closed: true,
            ..Default::default()
        };
        assert!(reached(None, &open(None)));
        assert!(!reached(None, &open(Some("9"))));
        assert!(!reached(Some(&cursor(Some("8"), false)), &open(Some("9"))));
        assert!(reached(Some(&cursor(Some("9"), false)), &open(Some("9"))));
        // Longer sequence numbers are larger, whatever their first digit.
        assert!(reached(Some(&cursor(Some("10"), false)), &open(Some("9"))));
        assert!(!reached(Some(&cursor(Some("9"), false)), &open(Some("10"))));
        assert!(!reached(Some(&cursor(Some("9"), false)), &closed));
        assert!(reached(Some(&cursor(Some("9"), true)), &closed));
    }
}
