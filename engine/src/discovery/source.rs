//! The source seam: every question the engine's steps ask a source, and the
//! one place that knows which kind of source a pipeline reads.
//!
//! - planning, first look ([`Source::look`]): is there surely nothing new
//!   (no write needed), or what did the look read;
//! - planning, before the claim ([`Source::pending`]): is any of it new;
//! - planning, after the claim ([`Source::find_new`], [`Source::batches`]):
//!   the new input since the cursor, taken for this run, cut into batches
//!   within the limits, each batch with the source's own cursor;
//! - a task ([`Source::freshness`]): how a planned unit is checked before
//!   it is read;
//! - the commit ([`Source::settle`]): advance the cursor (index, claims)
//!   past a committed batch;
//! - `sluice show` ([`Source::waiting`]): what waits.
//!
//! The four file modes are the four kinds here. A record-stream source
//! (partition -> offset range) is one more kind, its planned unit and
//! cursor its own types serialised into the plan; no step outside
//! `discovery/` matches on the kind.

use std::collections::HashMap;

use super::{InboxEntry, Upstream};
use std::sync::Arc;

use crate::checkpoint::{
    self, Checkpoint, Commit, Control, Index, InputFile, ListingState, SourceCursor,
};
use crate::error::{Error, Result};
use crate::pipeline::{DiscoveryMode, Limits, Pipeline};
use crate::planning;
use crate::storage::fanout::{concurrently, delete_all};
use crate::storage::{ObjectMeta, Store};

/// What [`Source::settle`] leaves for the control write that records a
/// batch.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    /// The listing state of the processed inputs (`None`: the source keeps
    /// none).
    pub listing: Option<ListingState>,
    /// A bounded index, which control holds ([`Control::index`]).
    pub index: Option<Index>,
    /// The index object that control takes the place of: removed once
    /// control holds the index.
    pub moved: Option<String>,
}

/// What a source is asked through: the pipeline, the store its source is
/// read from, and its checkpoint (the handlers' context, seen from here).
pub(crate) struct Scope<'a> {
    /// Now, by the run's clock (ms since the epoch).
    pub now_ms: i64,
    /// The pipeline.
    pub pipeline: &'a Pipeline,
    /// Where its source is read from.
    pub source: &'a Arc<dyn Store>,
    /// Its checkpoint.
    pub checkpoint: &'a Checkpoint,
    /// `notify`: reconcile in this run whether or not it is due (`sluice
    /// run --reconcile`).
    pub reconcile: bool,
}

impl Scope<'_> {
    fn conflict(&self, message: String) -> Error {
        Error::Conflict {
            pipeline: self.pipeline.name.clone(),
            message,
        }
    }

    fn broken(&self, key: String, message: String) -> Error {
        Error::Checkpoint {
            pipeline: self.pipeline.name.clone(),
            key,
            message,
        }
    }
}

/// A pipeline's source, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// `list`: every processed key kept; new files in arrival order.
    List,
    /// `ordered`: keys sort by arrival; a window of `lookback` recent keys.
    Ordered { lookback: u64 },
    /// `notify`: an inbox of notified keys, each claimed create-only.
    Notify { reconcile_every: u64 },
    /// `manifests`: another pipeline's sink, through its manifests.
    Manifests,
    /// A Kafka topic: each partition's offset is the cursor.
    Kafka,
    /// A Kinesis stream: each shard's last sequence number read is the
    /// cursor.
    Kinesis,
    /// A Delta table: its log position is the cursor.
    Delta { ignore_changes: bool },
}

/// What a run's first look at its input found.
pub(crate) enum Look {
    /// Nothing new, for sure: no write is needed.
    Idle,
    /// Maybe something.
    Maybe(Looked),
}

/// What the first look read, handed on so discovery need not read it again.
pub(crate) struct Looked {
    /// Input files (`list`/`ordered`: after the cursor; `notify`: the
    /// notified files, or the whole source when reconciling; `manifests`:
    /// the files of the upstream manifests after the cursor): what the
    /// schema is inferred from.
    pub listed: Vec<ObjectMeta>,
    /// `notify`: the inbox.
    inbox: Option<Vec<InboxEntry>>,
    /// `notify`: `listed` is a listing of the source (a reconciliation).
    listed_source: bool,
    /// `manifests`: the source sink's manifests after the cursor.
    upstream: Option<Upstream>,
    /// A record stream: records wait, or the cursor is not where the
    /// topic is (records or partitions gone).
    pub(super) stream_due: bool,
}

impl Looked {
    /// A record stream's look: `listed` its sample, as files.
    pub(super) fn sampled(listed: Vec<ObjectMeta>, due: bool) -> Looked {
        Looked {
            listed,
            inbox: None,
            listed_source: false,
            upstream: None,
            stream_due: due,
        }
    }
}

/// What a run already read before it discovers.
pub(crate) enum Seen {
    /// Nothing: discovery reads what it needs.
    Nothing,
    /// `list`/`ordered`: the index and the source listing after its cursor.
    Listing(Index, Vec<ObjectMeta>),
    /// `notify`: the inbox, and the source listing if one was made (a
    /// reconciliation uses it instead of listing again).
    Inbox(Vec<InboxEntry>, Option<Vec<ObjectMeta>>),
    /// `manifests`: the source sink's manifests after the cursor.
    Manifests(Upstream),
}

/// New input, in processing order.
pub(crate) struct Fresh {
    /// The units to plan (files, here), files asked for again first.
    pub inputs: Vec<InputFile>,
    /// `notify`: the inbox entries of each key, consumed by its batch.
    entries: HashMap<String, Vec<String>>,
    /// More waits than one discovery takes (a `notify` backlog).
    pub more: bool,
    /// `manifests`: what the inputs came from.
    upstream: Option<Upstream>,
    /// A record stream: what waits in each partition.
    stream: Option<super::stream::Waiting>,
}

impl Fresh {
    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.inputs.is_empty() && self.stream.as_ref().is_none_or(|w| w.is_empty())
    }

    /// What the batch holding `inputs` consumes besides them (`notify`:
    /// their inbox entries).
    pub(crate) fn consumed(&self, inputs: &[InputFile]) -> Vec<String> {
        inputs
            .iter()
            .flat_map(|f| self.entries.get(&f.key).cloned().unwrap_or_default())
            .collect()
    }
}

/// One batch's input as discovery cuts it.
pub(crate) struct Planned {
    /// Its files, in processing order.
    pub inputs: Vec<InputFile>,
    /// `manifests`: the source's cursor after it.
    pub source: Option<SourceCursor>,
    /// A record stream: its ranges (one per partition, before they are
    /// cut into tasks) and the cursor after it.
    pub stream: Option<checkpoint::StreamPlan>,
}

/// How a task checks a planned file before reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// Against the size its notification gave (`notify`).
    Notified,
    /// Never: what it reads cannot change (a source sink's published parts).
    Immutable,
    /// Against its listing (`list`, `ordered`); `strict`: a change is an
    /// error, as keys that sort by arrival cannot be deferred.
    Listed { strict: bool },
}

impl Source {
    /// The source `p` reads.
    pub(crate) fn of(p: &Pipeline) -> Source {
        match p.source.discovery {
            DiscoveryMode::List => Source::List,
            DiscoveryMode::Ordered => Source::Ordered {
                lookback: p.source.lookback,
            },
            DiscoveryMode::Notify => Source::Notify {
                reconcile_every: p.source.reconcile_every,
            },
            DiscoveryMode::Manifests => Source::Manifests,
            DiscoveryMode::Kafka => Source::Kafka,
            DiscoveryMode::Kinesis => Source::Kinesis,
            DiscoveryMode::Delta => Source::Delta {
                ignore_changes: p.source.ignore_changes,
            },
        }
    }

    /// The idle check: a `settled` pipeline (idle, with the registered
    /// spec, nothing asked for again or owed) whose listing equals the
    /// processed one (`notify`: an empty inbox, and no reconciliation due;
    /// `manifests`: no manifest after the cursor) has nothing to do: one
    /// read and one listing.
    pub(crate) async fn look(
        self,
        ctx: &Scope<'_>,
        control: Option<&Control>,
        settled: bool,
    ) -> Result<Look> {
        let p = &ctx.pipeline;
        match self {
            Source::Kafka => super::stream::look(ctx, control, settled).await,
            Source::Kinesis => super::kinesis::look(ctx, control, settled).await,
            Source::Notify { reconcile_every } => {
                let entries = super::read_inbox(ctx.checkpoint.store().as_ref()).await?;
                let epoch = control.map_or(1, |c| c.epoch + 1);
                let due = ctx.reconcile || super::reconcile_due(control, epoch, reconcile_every);
                if settled && entries.is_empty() && !due {
                    return Ok(Look::Idle);
                }
                // The schema is inferred from a notified file, or any file
                // when this run lists the source anyway.
                let listed = if due {
                    super::list_inputs(ctx.source.as_ref(), &p.source, None).await?
                } else {
                    super::inbox_files(&entries)
                };
                Ok(Look::Maybe(Looked {
                    listed,
                    inbox: Some(entries),
                    listed_source: due,
                    upstream: None,
                    stream_due: false,
                }))
            }
            Source::Manifests | Source::Delta { .. } => {
                let upstream = self
                    .read_upstream(
                        ctx,
                        control.and_then(|c| c.listing.start_after.as_deref()),
                        control.and_then(|c| c.source_history.as_deref()),
                    )
                    .await?;
                super::check_history(
                    &p.name,
                    control.and_then(|c| c.source_history.as_deref()),
                    &upstream,
                )?;
                let listed = upstream.listed();
                if settled && listed.is_empty() {
                    return Ok(Look::Idle);
                }
                Ok(Look::Maybe(Looked {
                    listed,
                    inbox: None,
                    listed_source: false,
                    upstream: Some(upstream),
                    stream_due: false,
                }))
            }
            Source::List | Source::Ordered { .. } => {
                let start_after = control.and_then(|c| c.listing.start_after.clone());
                let listed =
                    super::list_inputs(ctx.source.as_ref(), &p.source, start_after.as_deref())
                        .await?;
                if let Some(c) = control
                    && settled
                    && super::listing_state(start_after, &listed) == c.listing
                {
                    return Ok(Look::Idle);
                }
                Ok(Look::Maybe(Looked {
                    listed,
                    inbox: None,
                    listed_source: false,
                    upstream: None,
                    stream_due: false,
                }))
            }
        }
    }

    /// Before the lease is claimed: whether what the look read holds new
    /// input, as what discovery then starts from; `None`: nothing is new
    /// and nothing is `owed` (files asked for again, windows to close), so
    /// the run is idle. A run that `recover`s a dead one, and `notify`
    /// (whose inbox is its news), always go on.
    pub(crate) async fn pending(
        self,
        ctx: &Scope<'_>,
        control: Option<&Control>,
        looked: Looked,
        recover: bool,
        owed: bool,
    ) -> Result<Option<Seen>> {
        if self == Source::Kafka {
            return Ok(super::stream::pending(control, &looked, recover, owed));
        }
        if self == Source::Kinesis {
            return Ok(super::kinesis::pending(control, &looked, recover, owed));
        }
        if recover || looked.inbox.is_some() {
            return Ok(Some(match looked.inbox {
                Some(entries) => {
                    Seen::Inbox(entries, looked.listed_source.then_some(looked.listed))
                }
                None => Seen::Nothing,
            }));
        }
        let (index, _) = ctx.checkpoint.index_of(control).await?;
        if !owed && super::new_inputs(&looked.listed, &index, self.mode()).is_empty() {
            return Ok(None);
        }
        Ok(Some(match looked.upstream {
            Some(upstream) => Seen::Manifests(upstream),
            None => Seen::Listing(index, looked.listed),
        }))
    }

    /// The `DiscoveryMode` this kind is (the pipeline file's name for it).
    fn mode(self) -> DiscoveryMode {
        match self {
            Source::List => DiscoveryMode::List,
            Source::Ordered { .. } => DiscoveryMode::Ordered,
            Source::Notify { .. } => DiscoveryMode::Notify,
            Source::Manifests => DiscoveryMode::Manifests,
            Source::Kafka => DiscoveryMode::Kafka,
            Source::Kinesis => DiscoveryMode::Kinesis,
            Source::Delta { .. } => DiscoveryMode::Delta,
        }
    }

    /// Before discovering: the checkpoint's own consistency where the
    /// source keeps no index to check control against (`notify`: the last
    /// commit control names must exist; the other kinds check it when they
    /// read their index).
    pub(crate) async fn check_checkpoint(self, ctx: &Scope<'_>, control: &Control) -> Result<()> {
        if let Source::Notify { .. } = self
            && let Some(last) = control.last_committed
            && ctx.checkpoint.commit(last).await?.is_none()
        {
            return Err(ctx.broken(
                crate::paths::checkpoint::CONTROL.into(),
                format!(
                    "says batches up to {last} are committed, but {} does not exist: the record \
                     was edited by hand. Restore it from a backup, or start over with `sluice \
                     reset` on the pipeline file",
                    crate::paths::checkpoint::commit(last)
                ),
            ));
        }
        Ok(())
    }

    /// The input no batch has taken, taken for this run (`notify`: each key
    /// claimed for `epoch`), files `sluice retry-quarantined` asked for
    /// first. `list`/`ordered`: diff a listing against the index.
    /// `notify`: the inbox, after a reconciliation listing when one is due
    /// (`reconcile` allows it in this discovery). `manifests`: the upstream
    /// manifests after the cursor.
    pub(crate) async fn find_new(
        self,
        ctx: &Scope<'_>,
        epoch: u64,
        control: &Control,
        seen: Seen,
        reconcile: bool,
    ) -> Result<Fresh> {
        let mut found = self
            .find_new_input(ctx, epoch, control, seen, reconcile)
            .await?;
        let retry = retry_inputs(ctx, epoch, control, &found.inputs).await?;
        if !retry.is_empty() {
            found.inputs.splice(0..0, retry);
        }
        Ok(found)
    }

    /// [`Self::find_new`] without the files asked for again.
    async fn find_new_input(
        self,
        ctx: &Scope<'_>,
        epoch: u64,
        control: &Control,
        seen: Seen,
        reconcile: bool,
    ) -> Result<Fresh> {
        let p = &ctx.pipeline;
        let reconcile_every = match self {
            Source::Manifests | Source::Delta { .. } => {
                let upstream = match seen {
                    Seen::Manifests(u) => u,
                    _ => {
                        let (index, _) = ctx.checkpoint.index_of(Some(control)).await?;
                        let upstream = self
                            .read_upstream(
                                ctx,
                                index.start_after.as_deref(),
                                control.source_history.as_deref(),
                            )
                            .await?;
                        super::check_history(
                            &p.name,
                            control.source_history.as_deref(),
                            &upstream,
                        )?;
                        upstream
                    }
                };
                return Ok(Fresh {
                    inputs: upstream.inputs(),
                    entries: Default::default(),
                    more: false,
                    upstream: Some(upstream),
                    stream: None,
                });
            }
            Source::Kafka => {
                return Ok(Fresh {
                    inputs: Vec::new(),
                    entries: Default::default(),
                    more: false,
                    upstream: None,
                    stream: Some(super::stream::find_new(ctx, epoch, control).await?),
                });
            }
            Source::Kinesis => {
                let waiting = super::kinesis::find_new(ctx, epoch, control).await?;
                return Ok(Fresh {
                    inputs: Vec::new(),
                    entries: Default::default(),
                    // One batch a plan (a shard's records are counted only
                    // by reading them): discover again after it commits.
                    more: !waiting.is_empty(),
                    upstream: None,
                    stream: Some(waiting),
                });
            }
            Source::List | Source::Ordered { .. } => {
                return self.listed_new(ctx, control, seen).await;
            }
            Source::Notify { reconcile_every } => reconcile_every,
        };
        let store = ctx.checkpoint.store().as_ref();
        let (mut entries, source) = match seen {
            Seen::Inbox(e, source) => (e, source),
            _ => (super::read_inbox(store).await?, None),
        };
        let asked = ctx.reconcile && control.reconciled_epoch != Some(epoch);
        if reconcile && (asked || super::reconcile_due(Some(control), epoch, reconcile_every)) {
            entries
                .extend(reconcile_inbox(ctx, epoch, control.first_batch, &entries, source).await?);
        }
        // One discovery claims at most what one execution commits: a backlog
        // (an outage, a long pause) is taken in slices, not claimed all at
        // once inside one Plan step.
        let mut files = super::inbox_files(&entries);
        let cap = p
            .limits
            .max_files_per_batch
            .saturating_mul(p.limits.max_batches_per_execution) as usize;
        let more = files.len() > cap;
        files.truncate(cap);
        let mut by_key: HashMap<String, Vec<String>> = Default::default();
        for e in entries {
            by_key.entry(e.key).or_default().push(e.entry);
        }
        let (inputs, duplicates) =
            claim_files(ctx, control.first_batch, epoch, files, &mut by_key).await?;
        if !duplicates.is_empty() {
            tracing::info!(pipeline = %p.name, entries = duplicates.len(), "notifications of keys already committed; consumed without processing");
            delete_all(ctx.checkpoint.store(), duplicates).await?;
        }
        Ok(Fresh {
            inputs,
            entries: by_key,
            more,
            upstream: None,
            stream: None,
        })
    }

    /// List and index modes: the listed files the index has not seen
    /// (`seen` may already hold the run's listing).
    async fn listed_new(self, ctx: &Scope<'_>, control: &Control, seen: Seen) -> Result<Fresh> {
        let p = &ctx.pipeline;
        let (index, listed) = match seen {
            Seen::Listing(i, l) => (i, l),
            _ => {
                let (index, _) = ctx.checkpoint.index_of(Some(control)).await?;
                let listed = super::list_inputs(
                    ctx.source.as_ref(),
                    &p.source,
                    index.start_after.as_deref(),
                )
                .await?;
                (index, listed)
            }
        };
        Ok(Fresh {
            inputs: super::new_inputs(&listed, &index, self.mode()),
            entries: Default::default(),
            more: false,
            upstream: None,
            stream: None,
        })
    }

    /// The new input in batches within the limits, each with the source's
    /// cursor after it: whole upstream manifests (`manifests`), files
    /// otherwise (their cursor is the index, advanced at commit).
    pub(crate) fn batches(self, fresh: &Fresh, limits: &Limits) -> Vec<Planned> {
        if let Some(w) = &fresh.stream {
            return w
                .batches(limits.max_records_per_batch)
                .into_iter()
                .map(|s| Planned {
                    inputs: Vec::new(),
                    source: None,
                    stream: Some(s),
                })
                .collect();
        }
        match &fresh.upstream {
            Some(u) => {
                let manifests: Vec<(String, Vec<InputFile>)> = u
                    .manifests
                    .iter()
                    .map(|m| (m.key.clone(), m.files.clone()))
                    .collect();
                planning::split_manifests(&manifests, limits)
                    .into_iter()
                    .map(|(inputs, manifest)| {
                        let history = u.history.clone();
                        Planned {
                            inputs,
                            source: Some(SourceCursor { manifest, history }),
                            stream: None,
                        }
                    })
                    .collect()
            }
            None => planning::split_batches(&fresh.inputs, limits)
                .into_iter()
                .map(|inputs| Planned {
                    inputs,
                    source: None,
                    stream: None,
                })
                .collect(),
        }
    }

    /// How a task checks a planned file before reading it.
    pub(crate) fn freshness(self) -> Freshness {
        match self {
            Source::Notify { .. } => Freshness::Notified,
            // A source sink's published parts never change: no check; nor
            // do a topic's records.
            Source::Manifests | Source::Kafka | Source::Kinesis | Source::Delta { .. } => {
                Freshness::Immutable
            }
            Source::List => Freshness::Listed { strict: false },
            Source::Ordered { .. } => Freshness::Listed { strict: true },
        }
    }

    /// After the commit record of `record` exists: advance the source's
    /// cursor past it, idempotently (`notify`: mark its keys' claims
    /// committed and consume their inbox entries; `list`: the index, by
    /// compare-and-swap; a bounded index is returned for the control
    /// write that records the batch to hold). Returns what control
    /// records.
    pub(crate) async fn settle(
        self,
        ctx: &Scope<'_>,
        control: &Control,
        record: &Commit,
    ) -> Result<Settled> {
        let first = control.first_batch;
        let keep = match self {
            // The cursor is the commit record's, recorded in control.
            Source::Kafka | Source::Kinesis => return Ok(Settled::default()),
            Source::Notify { .. } => {
                super::settle_claims(ctx.checkpoint.store(), first, record).await?;
                return Ok(Settled::default());
            }
            Source::List => checkpoint::IndexKeep::Every,
            Source::Ordered { lookback } => checkpoint::IndexKeep::Recent(lookback),
            Source::Manifests | Source::Delta { .. } => checkpoint::IndexKeep::Last,
        };
        let (index, etag) = ctx.checkpoint.index_of(Some(control)).await?;
        // `manifests` mode's offset is the last source manifest read.
        let keys = match &record.source {
            Some(cursor) => std::slice::from_ref(&cursor.manifest),
            None => record.input_keys.as_slice(),
        };
        let next = index.apply(record.batch, keys, keep);
        if keep.inline() {
            // Read from its own object (a checkpoint of an older release)
            // only until control holds it.
            let moved = etag.map(|_| crate::paths::checkpoint::index(first));
            return Ok(Settled {
                listing: Some(next.listing()),
                index: Some(next),
                moved,
            });
        }
        // Moving out of control (`lookback` raised past the bound): an
        // index object there is a leftover (a crash between a move into
        // control and its removal), superseded by control's: replace it.
        let etag = match &control.index {
            Some(_) => ctx.checkpoint.index(first).await?.1,
            None => etag,
        };
        if next != index
            && !ctx
                .checkpoint
                .swap_index(first, &next, etag.as_deref())
                .await?
        {
            return Err(ctx.conflict(format!(
                "{} changed while this run advanced it past batch {}: another run holds the \
                 lease; this run stops without writing",
                crate::paths::checkpoint::index(first),
                record.batch
            )));
        }
        Ok(Settled {
            listing: Some(next.listing()),
            ..Settled::default()
        })
    }

    /// What waits (`sluice show`): the input files no batch has taken, and
    /// the source files skipped for names that cannot be keys or links that
    /// lead nowhere (`list`/`ordered`). One listing.
    pub(crate) async fn waiting(
        self,
        ctx: &Scope<'_>,
        control: Option<&Control>,
    ) -> Result<(Vec<ObjectMeta>, Vec<String>)> {
        match self {
            Source::Kafka => Ok((super::stream::waiting(ctx, control).await?, Vec::new())),
            Source::Kinesis => Ok((super::kinesis::waiting(ctx, control).await?, Vec::new())),
            Source::Manifests | Source::Delta { .. } => {
                // The files of the source sink's manifests (the table's
                // versions) after the cursor.
                let (index, _) = ctx.checkpoint.index_of(control).await?;
                Ok((
                    self.read_upstream(
                        ctx,
                        index.start_after.as_deref(),
                        control.and_then(|c| c.source_history.as_deref()),
                    )
                    .await?
                    .listed(),
                    Vec::new(),
                ))
            }
            // Notified files; duplicates of committed keys are counted too.
            Source::Notify { .. } => Ok((
                super::inbox_files(&super::read_inbox(ctx.checkpoint.store().as_ref()).await?),
                Vec::new(),
            )),
            Source::List | Source::Ordered { .. } => {
                let (index, _) = ctx.checkpoint.index_of(control).await?;
                let (listed, mut skipped) = super::list_readable(
                    ctx.source.as_ref(),
                    &ctx.pipeline.source,
                    index.start_after.as_deref(),
                )
                .await?;
                let unnamed = ctx.source.unnamed().await?;
                skipped.extend(
                    unnamed
                        .into_iter()
                        .filter(|n| ctx.pipeline.source.is_input(n))
                        .map(|n| format!("{n:?}")),
                );
                let fresh = super::new_inputs(&listed, &index, self.mode());
                Ok((
                    fresh.into_iter().map(InputFile::into_meta).collect(),
                    skipped,
                ))
            }
        }
    }

    /// A task of a record-stream batch: read the units `task` names from
    /// `stream` (the plan's) into memory, as the JSON Lines files the
    /// operator scans into `schema`; with the task as it reads them (every file, in
    /// order, its bytes their size).
    pub(crate) async fn read_units(
        self,
        p: &Pipeline,
        stream: &checkpoint::StreamPlan,
        task: &checkpoint::TaskPlan,
        schema: &datafusion::arrow::datatypes::Schema,
    ) -> Result<ReadUnits> {
        if self == Source::Kinesis {
            return super::kinesis::read_task(p, stream, task, schema).await;
        }
        let units: Vec<checkpoint::RecordRange> = task
            .inputs
            .iter()
            .map(|i| stream.ranges.get(*i as usize).copied())
            .collect::<Option<_>>()
            .ok_or_else(|| Error::Checkpoint {
                pipeline: p.name.clone(),
                key: String::new(),
                message: format!(
                    "task {} names a range past the plan's {}; the plan is corrupt",
                    task.task,
                    stream.ranges.len()
                ),
            })?;
        let crate::storage::Location::Kafka { topic, .. } = &p.source.location else {
            return Err(Error::Checkpoint {
                pipeline: p.name.clone(),
                key: String::new(),
                message: "a plan of record ranges for a source that is not a topic".into(),
            });
        };
        let log = super::kafka::open(&p.source).await?;
        let (store, files, shapes) =
            super::kafka::read_units(log, topic, &units, schema, p.source.raw).await?;
        let plan = checkpoint::TaskPlan {
            task: task.task,
            inputs: (0..files.len() as u32).collect(),
            bytes: files.iter().map(|f| f.size).sum(),
        };
        Ok(ReadUnits {
            store,
            shapes: files.iter().map(|f| f.key.clone()).zip(shapes).collect(),
            files,
            plan,
            shard_reads: Vec::new(),
        })
    }

    /// Whether it is a record stream (its waiting input counts records,
    /// not files and bytes).
    pub(crate) fn is_stream(self) -> bool {
        matches!(self, Source::Kafka | Source::Kinesis)
    }

    /// Whether a trigger records `p`'s notified objects in its inbox.
    pub(crate) fn keeps_inbox(self) -> bool {
        matches!(self, Source::Notify { .. })
    }

    /// Whether a created object at `key` (relative to the source root)
    /// wakes the pipeline: a manifest of the source sink (`manifests`), a
    /// commit of the table's log (a Delta table), else `None`: an input
    /// file does.
    pub(crate) fn wakes_on(self, key: &str) -> Option<bool> {
        match self {
            Source::Manifests => Some(crate::paths::sink::manifest_batch(key).is_some()),
            Source::Delta { .. } => Some(super::delta::is_commit(key)),
            _ => None,
        }
    }

    /// Why a change of discovery mode from `old` to this one would process
    /// files again, if it would. `list` keeps every processed key and
    /// `ordered` a window of them, in `index/processed.json`; `notify` keeps
    /// one claim per key under `index/keys/`. Only `list` -> `ordered`
    /// keeps what the new mode needs.
    pub(crate) fn change_from(self, old: DiscoveryMode) -> Option<String> {
        use DiscoveryMode::{Delta, Kafka, Kinesis, List, Manifests, Notify, Ordered};
        let new = self.mode();
        // A stream's kind follows source.uri, and no discovery setting
        // brings it back.
        if old != new && (old == Kinesis || new == Kinesis) {
            return Some(format!(
                "discovery changed from {} to {} (source.uri names another kind of source): a \
                 Kinesis stream's sequence numbers and another source's offsets or processed \
                 files are different cursors, so the new source would be read from its start; \
                 restore source.uri, or run `sluice reset` on the pipeline file to start over",
                old.name(),
                new.name()
            ));
        }
        let why = match (old, new) {
            (a, b) if a == b => return None,
            (Kafka, _) | (_, Kafka) | (Kinesis, _) | (_, Kinesis) => {
                "a stream's positions and a folder's files are different cursors"
            }
            (Delta, _) | (_, Delta) => {
                "a Delta table's log position and processed files are different cursors"
            }
            (List, Ordered) => return None,
            (Manifests, _) => "manifests mode records a manifest number, not processed files",
            (_, Manifests) => "the checkpoint holds no manifest number to start after",
            (Ordered, List) => "the processed-file index only holds the ordered lookback window",
            (Notify, _) => "notify mode records processed files as claims, not in the index",
            (_, Notify) => "the processed-file index holds no notify claims",
            _ => unreachable!("all pairs covered"),
        };
        Some(format!(
            "discovery changed from {} to {}: {why}, so the new mode would process older files \
             again; keep discovery = \"{}\", or run `sluice reset` on the pipeline file to start \
             over",
            old.name(),
            new.name(),
            old.name()
        ))
    }
}

impl Source {
    /// `manifests` mode: the source sink's manifests after `start_after`;
    /// a Delta table: its versions after it, as pieces (`recorded`: the id
    /// of the table the committed batches read).
    async fn read_upstream(
        self,
        ctx: &Scope<'_>,
        start_after: Option<&str>,
        recorded: Option<&str>,
    ) -> Result<Upstream> {
        if let Source::Delta { ignore_changes } = self {
            return super::delta::TableSource {
                store: ctx.source,
                pipeline: &ctx.pipeline.name,
                ignore_changes,
                limits: &ctx.pipeline.limits,
            }
            .read(start_after, recorded)
            .await;
        }
        super::read_upstream(ctx.source.as_ref(), &ctx.pipeline.name, start_after).await
    }
}

/// The input files named by `control.retry` (`sluice retry-quarantined`)
/// that `fresh` does not hold, as they are now (one listing each); a key
/// gone from the source is dropped from the request with a warning.
async fn retry_inputs(
    ctx: &Scope<'_>,
    epoch: u64,
    control: &Control,
    fresh: &[InputFile],
) -> Result<Vec<InputFile>> {
    let mut out = Vec::new();
    let mut gone = Vec::new();
    for key in &control.retry {
        if fresh.iter().any(|f| &f.key == key) {
            continue;
        }
        let found = ctx.source.list(key, None).await?;
        match found.into_iter().find(|m| &m.key == key) {
            Some(m) => out.push(InputFile {
                key: m.key,
                size: m.size,
                etag: m.etag,
                modified_ms: m.last_modified.map(|t| t.timestamp_millis()),
                partition: None,
            }),
            None => {
                tracing::warn!(pipeline = %ctx.pipeline.name, %key, "a file asked for again is gone from the source; dropped");
                gone.push(key.clone());
            }
        }
    }
    if !gone.is_empty() {
        ctx.checkpoint
            .update_control(epoch, &|c| c.retry.retain(|k| !gone.contains(k)))
            .await?;
    }
    Ok(out)
}

/// Claims each inbox file for this run's epoch. Returns the files claimed
/// (the run's inputs) and the inbox entries of keys claimed before (already
/// committed: their entries are consumed, the files not processed again);
/// those keys leave `by_key`.
async fn claim_files(
    ctx: &Scope<'_>,
    first: u64,
    epoch: u64,
    files: Vec<ObjectMeta>,
    by_key: &mut HashMap<String, Vec<String>>,
) -> Result<(Vec<InputFile>, Vec<String>)> {
    let p = &ctx.pipeline;
    let claimed = concurrently(files.iter().map(|f| f.key.clone()).collect(), |k| {
        let store = ctx.checkpoint.store().clone();
        let pipeline = p.name.clone();
        async move { super::claim_key(&store, &pipeline, first, &k, epoch).await }
    })
    .await?;
    let mut inputs = Vec::new();
    let mut duplicates = Vec::new();
    for (f, fresh) in files.into_iter().zip(claimed) {
        if fresh {
            inputs.push(InputFile {
                key: f.key,
                size: f.size,
                etag: None,
                modified_ms: None,
                partition: None,
            });
        } else {
            duplicates.extend(by_key.remove(&f.key).unwrap_or_default());
        }
    }
    Ok((inputs, duplicates))
}

/// Notify mode's reconciliation: list the source (unless `source` is that
/// listing already) and the claims, record the source files that have
/// neither a claim nor an inbox entry as inbox entries (so a crash after
/// this loses nothing), note the epoch in control, and return the new
/// entries.
async fn reconcile_inbox(
    ctx: &Scope<'_>,
    epoch: u64,
    first: u64,
    inbox: &[InboxEntry],
    source: Option<Vec<ObjectMeta>>,
) -> Result<Vec<InboxEntry>> {
    let p = &ctx.pipeline;
    let store = ctx.checkpoint.store().as_ref();
    let source = match source {
        Some(s) => s,
        None => super::list_inputs(ctx.source.as_ref(), &p.source, None).await?,
    };
    let claims = store
        .list(&crate::paths::checkpoint::claims_prefix(first), None)
        .await?;
    let lost = super::unnotified(&source, &claims, inbox, first);
    let objects: Vec<(String, u64)> = lost.iter().map(|m| (m.key.clone(), m.size)).collect();
    super::record_notified(ctx.checkpoint.store(), objects).await?;
    ctx.checkpoint
        .update_control(epoch, &|c| c.reconciled_epoch = Some(epoch))
        .await?;
    tracing::info!(pipeline = %p.name, source_files = source.len(), claims = claims.len(), unnotified = lost.len(), "reconciled the inbox with a source listing");
    Ok(lost
        .into_iter()
        .map(|m| InboxEntry {
            entry: crate::paths::checkpoint::inbox_entry(&m.key, m.size),
            key: m.key,
            size: m.size,
            arrived: m.last_modified,
        })
        .collect())
}

/// A record-stream task's units, read ([`Source::read_units`]).
pub(crate) struct ReadUnits {
    /// Where they were read to.
    pub store: Arc<dyn Store>,
    /// A JSON Lines file a unit, in order.
    pub files: Vec<InputFile>,
    /// The task as it reads them (every file, in order).
    pub plan: checkpoint::TaskPlan,
    /// For each file's key, a file of one line of each of its shapes in
    /// the same store: the drift check infers from it.
    pub shapes: std::collections::HashMap<String, InputFile>,
    /// A Kinesis task: what it read of each of its shard units.
    pub shard_reads: Vec<checkpoint::ShardRead>,
}
