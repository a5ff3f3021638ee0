//! The handler steps of a run, shared by the local runner and (later) the
//! Lambda functions: [`plan`] (claim the lease, recover, resume or discover),
//! [`operate`] (one task), [`commit`] (make a batch visible, advance the
//! checkpoint), and [`release`] / [`abandon`] for the end of a run.
//!
//! Payloads between steps ([`RunState`], batch and task numbers) carry
//! references only; data and plans live in storage.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::execution::context::SessionContext;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{
    self, Checkpoint, Claim, Commit, Control, Durations, Index, InputFile, KeyClaim, Manifest,
    Offsets, PipelineRecord, RunStatus,
};
use crate::discovery::{self, InboxEntry};
use crate::error::{Error, ErrorClass, Result};
use crate::operators::{SqlOperator, TaskResult};
use crate::pipeline::{ColumnSpec, DiscoveryMode, Pipeline};
use crate::planning;
use crate::sinks::ParquetSink;
use crate::storage::{CountingStore, ObjectMeta, RequestCounts, S3Config, Store};

/// Milliseconds since the Unix epoch.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Whether the process named by a lease owner has exited.
pub type OwnerGone = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Everything a handler needs for one pipeline, built once per process.
#[derive(Clone)]
pub struct Context {
    /// The pipeline.
    pub pipeline: Arc<Pipeline>,
    /// Where input lands.
    pub source: Arc<dyn Store>,
    /// The sink.
    pub sink: ParquetSink,
    /// The pipeline's checkpoint.
    pub checkpoint: Checkpoint,
    /// This process's name as a lease owner.
    pub owner: String,
    /// The time.
    pub clock: Clock,
    /// Liveness of other owners.
    pub owner_gone: OwnerGone,
    /// How the local runner waits (Retry intervals); tests make it instant.
    pub sleep: crate::runner::asl::Sleeper,
    /// The checkpoint root shared by all pipelines (`<checkpoint uri>`),
    /// where `register` lists the pipeline for the trigger.
    pub registry: Option<Arc<dyn Store>>,
    /// Notify mode: reconcile (list the source) in the next run whether or
    /// not `reconcile_every` runs have passed (`sluice run --reconcile`).
    pub reconcile: bool,
    schema: Arc<tokio::sync::OnceCell<SchemaRef>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("pipeline", &self.pipeline.name)
            .field("owner", &self.owner)
            .finish()
    }
}

impl Context {
    /// A context over explicit stores (tests, embedding).
    pub fn new(
        pipeline: Pipeline,
        source: Arc<dyn Store>,
        sink: Arc<dyn Store>,
        checkpoint: Arc<dyn Store>,
    ) -> Context {
        let name = pipeline.name.clone();
        Context {
            pipeline: Arc::new(pipeline),
            source,
            sink: ParquetSink::new(sink, &name),
            checkpoint: Checkpoint::new(checkpoint, &name),
            owner: local_owner(),
            clock: Arc::new(|| chrono::Utc::now().timestamp_millis()),
            owner_gone: Arc::new(local_owner_gone),
            sleep: crate::runner::real_sleep(),
            registry: None,
            reconcile: false,
            schema: Arc::default(),
        }
    }

    /// This context with `registry` as the checkpoint root.
    pub fn with_registry(mut self, registry: Arc<dyn Store>) -> Context {
        self.registry = Some(registry);
        self
    }

    /// A context whose stores are opened from the pipeline's locations.
    pub fn open(pipeline: Pipeline, s3: Option<&S3Config>) -> Result<Context> {
        let open = |l: &crate::storage::Location| {
            l.open(s3).map_err(|message| Error::Spec {
                file: pipeline.name.clone(),
                message,
            })
        };
        let source = open(&pipeline.source.location)?;
        let sink = open(&pipeline.sink)?;
        let checkpoint = open(&pipeline.checkpoint)?;
        let registry = open(&pipeline.checkpoint.parent())?;
        Ok(Context::new(pipeline, source, sink, checkpoint).with_registry(registry))
    }

    /// Requests made so far through all of this pipeline's stores.
    pub fn counts(&self) -> RequestCounts {
        self.source
            .counts()
            .plus(&self.sink.store().counts())
            .plus(&self.checkpoint.store().counts())
    }

    pub(crate) fn now(&self) -> i64 {
        (self.clock)()
    }

    fn conflict(&self, message: String) -> Error {
        Error::Conflict {
            pipeline: self.pipeline.name.clone(),
            message,
        }
    }

    fn broken(&self, key: String, message: impl Into<String>) -> Error {
        Error::Checkpoint {
            pipeline: self.pipeline.name.clone(),
            key,
            message: message.into(),
        }
    }

    async fn planned(&self, batch: u64, when: &str) -> Result<Offsets> {
        self.checkpoint.offsets(batch).await?.ok_or_else(|| {
            self.broken(
                crate::paths::checkpoint::offsets(batch),
                format!("missing {when}"),
            )
        })
    }

    pub(crate) fn ttl_ms(&self) -> i64 {
        self.pipeline.limits.lease_ttl_seconds as i64 * 1000
    }

    /// Use `schema` as the source schema (from a registered `pipeline.json`).
    pub fn pin_schema(&self, schema: SchemaRef) {
        let _ = self.schema.set(schema);
    }

    /// The source schema, once the plan step resolved it (or from
    /// `pipeline.json`).
    pub async fn schema(&self) -> Result<SchemaRef> {
        if let Some(s) = self.schema.get() {
            return Ok(s.clone());
        }
        let record = self.checkpoint.pipeline_record().await?.ok_or_else(|| {
            self.broken(
                "pipeline.json".into(),
                "missing; the pipeline was never planned",
            )
        })?;
        let schema = schema_of(&record.schema);
        let _ = self.schema.set(schema.clone());
        Ok(schema)
    }
}

/// This process as a lease owner: `local:<host>:<pid>`.
pub fn local_owner() -> String {
    format!("local:{}:{}", hostname(), std::process::id())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Whether a `local:<host>:<pid>` owner on this host has exited. Owners on
/// other hosts, or not local, are never known to be gone (their lease expires).
pub fn local_owner_gone(owner: &str) -> bool {
    let mut parts = owner.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("local"), Some(host), Some(pid)) if host == hostname() => match pid.parse::<u32>() {
            Ok(pid) if pid != std::process::id() => {
                !std::path::Path::new(&format!("/proc/{pid}")).exists()
            }
            _ => false,
        },
        _ => false,
    }
}

/// Arrow schema of pinned columns.
pub fn schema_of(cols: &[ColumnSpec]) -> SchemaRef {
    Arc::new(Schema::new(
        cols.iter()
            .map(|c| {
                Field::new(
                    &c.name,
                    c.data_type.parse::<DataType>().unwrap_or(DataType::Utf8),
                    c.nullable,
                )
            })
            .collect::<Vec<_>>(),
    ))
}

/// Pinned columns of an Arrow schema.
pub fn columns_of(schema: &Schema) -> Vec<ColumnSpec> {
    schema
        .fields()
        .iter()
        .map(|f| ColumnSpec {
            name: f.name().clone(),
            data_type: f.data_type().to_string(),
            nullable: f.is_nullable(),
        })
        .collect()
}

/// What a run carries between steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// Pipeline name.
    pub pipeline: String,
    /// The lease epoch this run holds.
    pub epoch: u64,
    /// Whether this run has discovered new input yet (AvailableNow: once).
    pub discovered: bool,
    /// Batches handed out by this execution (`limits.max_batches_per_execution`).
    #[serde(default)]
    pub batches: u64,
    /// What started the run, recorded in its commits (`sluice history`).
    #[serde(default)]
    pub trigger: Option<String>,
}

/// Where a Distributed Map reads a batch's task list: an S3 object (on a
/// local checkpoint, `bucket` is empty and `key` relative to the pipeline's
/// checkpoint folder; the local runner reads it there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskList {
    /// Bucket.
    pub bucket: String,
    /// Key.
    pub key: String,
}

impl TaskList {
    /// The object `key` of the checkpoint at `checkpoint`.
    pub fn of(checkpoint: &crate::storage::Location, key: &str) -> TaskList {
        match checkpoint {
            crate::storage::Location::S3 { bucket, prefix } => TaskList {
                bucket: bucket.clone(),
                key: if prefix.is_empty() {
                    key.to_string()
                } else {
                    format!("{prefix}/{key}")
                },
            },
            crate::storage::Location::Local(_) => TaskList {
                bucket: String::new(),
                key: key.to_string(),
            },
        }
    }

    /// The key relative to the checkpoint at `checkpoint` that (`bucket`,
    /// `key`) names, if it is inside it.
    pub fn relative(
        checkpoint: &crate::storage::Location,
        bucket: &str,
        key: &str,
    ) -> Option<String> {
        match checkpoint {
            crate::storage::Location::S3 { bucket: b, prefix } if b == bucket => {
                if prefix.is_empty() {
                    Some(key.to_string())
                } else {
                    key.strip_prefix(prefix.as_str())?
                        .strip_prefix('/')
                        .map(str::to_string)
                }
            }
            crate::storage::Location::Local(_) if bucket.is_empty() => Some(key.to_string()),
            _ => None,
        }
    }
}

/// A batch to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRef {
    /// Batch number.
    pub batch: u64,
    /// Task numbers (empty when `distributed`: read them from `task_list`).
    pub tasks: Vec<u32>,
    /// How many tasks the batch has.
    pub task_count: u64,
    /// More tasks than `limits.max_inline_tasks`: the state machine fans out
    /// with a Distributed Map over `task_list`.
    pub distributed: bool,
    /// Where the task list is, when `distributed`.
    pub task_list: Option<TaskList>,
    /// Input files.
    pub files: u64,
    /// Input bytes.
    pub bytes: u64,
    /// Planned by an earlier run that did not commit it.
    pub resumed: bool,
}

/// What the plan step decided; `kind` is what the state machine's Choice
/// reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PlanOutcome {
    /// Nothing to do; no lease was taken and nothing written.
    Idle {
        /// Why.
        reason: String,
    },
    /// Another run holds a live lease.
    Busy {
        /// Its owner.
        owner: String,
        /// Seconds since its last heartbeat.
        heartbeat_age_s: i64,
    },
    /// Run this batch, then commit it and plan again.
    Batch {
        /// The run.
        run: RunState,
        /// The batch.
        batch: BatchRef,
    },
    /// The run is over and the lease released.
    Done {
        /// The run.
        run: RunState,
    },
    /// This execution used its batch budget: it released the lease with
    /// `requested` set and hands the rest to a new execution (the state
    /// machine's Continue step wakes the pipeline through the trigger).
    Continue {
        /// The run.
        run: RunState,
    },
}

/// Plan step. Without a run: check for new input cheaply (one control read
/// and one listing), and only then claim the lease, recover what a dead run
/// left, and plan the new input into batches. With a run: resume the next
/// planned batch, or release.
pub async fn plan(ctx: &Context, run: Option<RunState>) -> Result<PlanOutcome> {
    let clock = PlanClock {
        started: std::time::Instant::now(),
        counts: ctx.counts(),
    };
    match run {
        None => start(ctx, &clock).await,
        Some(run) => {
            let (mut control, _) = owned_control(ctx, run.epoch).await?;
            if run.discovered {
                // The next batch this run planned, else the end of the run.
                if let Some(off) = ctx.checkpoint.offsets(control.next_batch()).await? {
                    return batch_outcome(ctx, run, &off).await;
                }
                if release_idle(ctx, &run).await? {
                    return Ok(PlanOutcome::Done { run });
                }
            } else if control.resume {
                // A run whose lease a trigger claimed (`triggers::wake`)
                // after a dead run, a hand-over or a cancel.
                if let Some(off) = resume_planned(ctx, &run, control.next_batch()).await? {
                    return batch_outcome(ctx, run, &off).await;
                }
                control = owned_control(ctx, run.epoch).await?.0;
            }
            discover_and_plan(ctx, run, &control, Seen::Nothing, &clock).await
        }
    }
}

/// End this execution at its batch budget: give the lease back with
/// `requested` set, so whoever wakes the pipeline next (the state machine's
/// Continue step, or any event) starts the execution that resumes the
/// batches already planned.
async fn continue_run(ctx: &Context, run: RunState) -> Result<PlanOutcome> {
    let now = ctx.now();
    update_control(ctx, run.epoch, &|c| {
        c.status = RunStatus::Idle;
        c.requested = true;
        c.resume = true;
        c.heartbeat_ms = Some(now);
    })
    .await?;
    tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, batches = run.batches, "batch budget of this execution used; handing over");
    Ok(PlanOutcome::Continue { run })
}

/// Give the lease back (`Idle`) unless a trigger set `requested` since the
/// last discovery: then clear the flag and return `false`, and the run
/// discovers again. So every file that existed when a trigger returned is
/// seen by a discovery that started after it.
async fn release_idle(ctx: &Context, run: &RunState) -> Result<bool> {
    let now = ctx.now();
    let spec_hash = ctx.pipeline.spec_hash();
    for _ in 0..16 {
        let (c, etag) = owned_control(ctx, run.epoch).await?;
        let (c, again) = checkpoint::end_of_run(&c, now, &spec_hash);
        if ctx
            .checkpoint
            .swap_control(&c, Some(&etag))
            .await?
            .is_some()
        {
            if again {
                tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, "a trigger asked again; discovering once more");
            } else {
                tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, "lease released");
            }
            return Ok(!again);
        }
    }
    Err(ctx.conflict("control.json keeps changing under this run; it stops".into()))
}

/// The plan step's answer for a planned batch: the batch, or, once this
/// execution has handed out `limits.max_batches_per_execution` batches, the
/// hand-over to the next execution. A batch with more tasks than
/// `limits.max_inline_tasks` goes to the Distributed Map: its task list is
/// written to the checkpoint (idempotent: the same list on every resume) and
/// the payload carries only where it is.
async fn batch_outcome(ctx: &Context, mut run: RunState, off: &Offsets) -> Result<PlanOutcome> {
    if run.batches >= ctx.pipeline.limits.max_batches_per_execution {
        return continue_run(ctx, run).await;
    }
    let resumed = off.epoch != run.epoch;
    run.batches += 1;
    let tasks: Vec<u32> = off.tasks.iter().map(|t| t.task).collect();
    let distributed = tasks.len() as u64 > ctx.pipeline.limits.max_inline_tasks;
    let mut task_list = None;
    if distributed {
        let key = crate::paths::checkpoint::task_list(off.batch);
        ctx.checkpoint
            .store()
            .put(
                &key,
                serde_json::to_vec(&tasks).expect("serialisable").into(),
                crate::storage::PutMode::Overwrite,
            )
            .await?;
        task_list = Some(TaskList::of(&ctx.pipeline.checkpoint, &key));
    }
    Ok(PlanOutcome::Batch {
        run,
        batch: BatchRef {
            batch: off.batch,
            task_count: tasks.len() as u64,
            tasks: if distributed { Vec::new() } else { tasks },
            distributed,
            task_list,
            files: off.inputs.len() as u64,
            bytes: off.bytes(),
            resumed,
        },
    })
}

/// When and with how many requests a plan step started.
struct PlanClock {
    started: std::time::Instant,
    counts: RequestCounts,
}

async fn start(ctx: &Context, clock: &PlanClock) -> Result<PlanOutcome> {
    let p = &ctx.pipeline;
    let read = ctx.checkpoint.control().await?;
    let control = read.as_ref().map(|(c, _)| c);
    let now = ctx.now();
    let gone = control
        .and_then(|c| c.owner.as_deref())
        .is_some_and(|o| (ctx.owner_gone)(o));
    if let Some(c) = control
        && c.paused
    {
        return Ok(PlanOutcome::Idle {
            reason: "paused: `sluice resume` lets runs start again (triggers meanwhile are \
                     recorded)"
                .into(),
        });
    }
    let claim = checkpoint::decide_claim(control, now, ctx.ttl_ms(), gone);
    if let Claim::Busy {
        owner,
        heartbeat_age_ms,
    } = &claim
    {
        return Ok(PlanOutcome::Busy {
            owner: owner.clone(),
            heartbeat_age_s: heartbeat_age_ms / 1000,
        });
    }

    // The idle check: an idle pipeline with the registered spec and a
    // listing equal to the processed one (notify: an empty inbox, and no
    // reconciliation due) has nothing to do.
    let settled =
        control.is_some_and(|c| c.status == RunStatus::Idle && c.spec_hash == p.spec_hash());
    let mut listed = None;
    let mut inbox = None;
    let mut listed_source = false;
    if p.source.discovery == DiscoveryMode::Notify {
        let entries = discovery::read_inbox(ctx.checkpoint.store().as_ref()).await?;
        let epoch = control.map_or(1, |c| c.epoch + 1);
        let due =
            ctx.reconcile || discovery::reconcile_due(control, epoch, p.source.reconcile_every);
        if settled && entries.is_empty() && !due {
            return Ok(PlanOutcome::Idle {
                reason: "no new data".into(),
            });
        }
        // The schema is inferred from a notified file, or any file when
        // this run lists the source anyway.
        listed = Some(if due {
            discovery::list_inputs(ctx.source.as_ref(), &p.source, None).await?
        } else {
            discovery::inbox_files(&entries)
        });
        listed_source = due;
        inbox = Some(entries);
    } else if let Some(c) = control
        && settled
    {
        let l = discovery::list_inputs(
            ctx.source.as_ref(),
            &p.source,
            c.listing.start_after.as_deref(),
        )
        .await?;
        if discovery::listing_state(c.listing.start_after.clone(), &l) == c.listing {
            return Ok(PlanOutcome::Idle {
                reason: "no new data".into(),
            });
        }
        listed = Some(l);
    }

    // Resolve the schema and check the SQL before writing anything.
    let start_after = control.and_then(|c| c.listing.start_after.clone());
    if listed.is_none() {
        listed = Some(
            discovery::list_inputs(ctx.source.as_ref(), &p.source, start_after.as_deref()).await?,
        );
    }
    let listed = listed.expect("listed above");
    // A batch committed under this very spec means `pipeline.json` holds it
    // (a run writes it before planning); with the schema known here
    // (declared, or pinned earlier in this process) there is nothing to
    // read or check against it.
    let known = ctx
        .schema
        .get()
        .cloned()
        .or_else(|| p.source.declared_schema());
    let recorded =
        control.is_some_and(|c| c.spec_hash == p.spec_hash() && c.last_committed.is_some());
    let (record_current, schema) = match known {
        Some(schema) if recorded => (true, schema),
        _ => {
            let record = ctx.checkpoint.pipeline_record().await?;
            let schema = match resolve_schema(ctx, record.as_ref(), &listed).await? {
                Some(s) => s,
                None => {
                    return Ok(PlanOutcome::Idle {
                        reason: "no input files yet (and no schema declared)".into(),
                    });
                }
            };
            let current = record.is_some_and(|r| r.spec_hash == p.spec_hash());
            (current, schema)
        }
    };
    SqlOperator::new(p.clone(), schema.clone()).check().await?;
    let _ = ctx.schema.set(schema.clone());

    let Claim::Take { epoch, recover } = claim else {
        unreachable!("busy returned above")
    };
    // Batches may wait planned, or committed and not recorded.
    let recover = recover || control.is_some_and(|c| c.resume);
    // Without a dead run to recover, look for new input before writing
    // anything: processed files deleted from the source, or a changed spec,
    // change the listing without making work. (Notify mode looked above.)
    let mut index = None;
    if !recover && inbox.is_none() {
        let i = ctx.checkpoint.index().await?;
        if discovery::new_inputs(&listed, &i, p.source.discovery).is_empty() {
            return Ok(PlanOutcome::Idle {
                reason: "no new data".into(),
            });
        }
        index = Some(i);
    }
    let next = checkpoint::claimed(control, epoch, &ctx.owner, now, "");
    if ctx
        .checkpoint
        .swap_control(&next, read.as_ref().map(|(_, e)| e.as_str()))
        .await?
        .is_none()
    {
        return Ok(PlanOutcome::Busy {
            owner: "another run (it claimed the lease first)".into(),
            heartbeat_age_s: 0,
        });
    }
    let run = RunState {
        pipeline: p.name.clone(),
        epoch,
        discovered: false,
        batches: 0,
        trigger: Some(if ctx.owner.starts_with("local:") {
            "sluice run".into()
        } else {
            "execution input".into()
        }),
    };
    tracing::info!(pipeline = %p.name, epoch, recover, "lease taken");

    if !record_current {
        ctx.checkpoint
            .put_pipeline_record(&PipelineRecord {
                format_version: checkpoint::FORMAT_VERSION,
                spec_hash: p.spec_hash(),
                pipeline: (**p).clone(),
                schema: columns_of(&schema),
            })
            .await?;
    }

    let control = if recover {
        if let Some(off) = resume_planned(ctx, &run, next.next_batch()).await? {
            return batch_outcome(ctx, run, &off).await;
        }
        owned_control(ctx, epoch).await?.0
    } else {
        next
    };
    let seen = match (index, inbox) {
        (Some(i), _) => Seen::Listing(i, listed),
        (None, Some(entries)) => Seen::Inbox(entries, listed_source.then_some(listed)),
        (None, None) => Seen::Nothing,
    };
    discover_and_plan(ctx, run, &control, seen, clock).await
}

/// After a dead run, a hand-over or a cancel (`control.resume`): finish the
/// batches from `next` on that were committed but not recorded in control,
/// and return the first batch planned and not committed, if any (two reads
/// when there is nothing).
async fn resume_planned(ctx: &Context, run: &RunState, next: u64) -> Result<Option<Offsets>> {
    let mut n = next;
    while let Some(commit) = ctx.checkpoint.commit(n).await? {
        finish_commit(ctx, run, &commit).await?;
        n += 1;
    }
    let off = ctx.checkpoint.offsets(n).await?;
    if off.is_some() {
        tracing::info!(pipeline = %ctx.pipeline.name, batch = n, "resuming a batch planned by an earlier run");
    }
    Ok(off)
}

/// What a run already read before it discovers.
enum Seen {
    /// Nothing: discovery reads what it needs.
    Nothing,
    /// `list`/`ordered`: the index and the source listing after its cursor.
    Listing(Index, Vec<ObjectMeta>),
    /// `notify`: the inbox, and the source listing if one was made (a
    /// reconciliation uses it instead of listing again).
    Inbox(Vec<InboxEntry>, Option<Vec<ObjectMeta>>),
}

/// New input, in processing order, and (notify) the inbox entries of each
/// of its keys.
struct Fresh {
    inputs: Vec<InputFile>,
    entries: std::collections::HashMap<String, Vec<String>>,
    /// Notify mode: more entries wait than one discovery takes.
    more: bool,
}

/// Find the input no batch has taken. `list`/`ordered`: diff a listing
/// against the index. `notify`: the inbox, after a reconciliation listing
/// when one is due (`reconcile` allows it in this discovery), each key
/// claimed for this run.
async fn find_new(
    ctx: &Context,
    run: &RunState,
    control: &Control,
    seen: Seen,
    reconcile: bool,
) -> Result<Fresh> {
    let p = &ctx.pipeline;
    if p.source.discovery != DiscoveryMode::Notify {
        let (index, listed) = match seen {
            Seen::Listing(i, l) => (i, l),
            _ => {
                let index = ctx.checkpoint.index().await?;
                let listed = discovery::list_inputs(
                    ctx.source.as_ref(),
                    &p.source,
                    index.start_after.as_deref(),
                )
                .await?;
                (index, listed)
            }
        };
        return Ok(Fresh {
            inputs: discovery::new_inputs(&listed, &index, p.source.discovery),
            entries: Default::default(),
            more: false,
        });
    }
    let store = ctx.checkpoint.store().as_ref();
    let (mut entries, source) = match seen {
        Seen::Inbox(e, source) => (e, source),
        _ => (discovery::read_inbox(store).await?, None),
    };
    let asked = ctx.reconcile && control.reconciled_epoch != Some(run.epoch);
    if reconcile
        && (asked || discovery::reconcile_due(Some(control), run.epoch, p.source.reconcile_every))
    {
        entries.extend(reconcile_inbox(ctx, run, &entries, source).await?);
    }
    // One discovery claims at most what one execution commits: a backlog
    // (an outage, a long pause) is taken in slices, not claimed all at once
    // inside one Plan step.
    let mut files = discovery::inbox_files(&entries);
    let cap = p
        .limits
        .max_files_per_batch
        .saturating_mul(p.limits.max_batches_per_execution) as usize;
    let more = files.len() > cap;
    files.truncate(cap);
    let mut by_key: std::collections::HashMap<String, Vec<String>> = Default::default();
    for e in entries {
        by_key.entry(e.key).or_default().push(e.entry);
    }
    let epoch = run.epoch;
    let claimed = discovery::concurrently(files.iter().map(|f| f.key.clone()).collect(), |k| {
        let ctx = ctx.clone();
        async move { claim_key(&ctx, &k, epoch).await }
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
            });
        } else {
            duplicates.extend(by_key.remove(&f.key).unwrap_or_default());
        }
    }
    if !duplicates.is_empty() {
        tracing::info!(pipeline = %p.name, entries = duplicates.len(), "notifications of keys already committed; consumed without processing");
        discovery::delete_all(ctx.checkpoint.store(), duplicates).await?;
    }
    Ok(Fresh {
        inputs,
        entries: by_key,
        more,
    })
}

/// Notify mode's reconciliation: list the source (unless `source` is that
/// listing already) and the claims, record the source files that have
/// neither a claim nor an inbox entry as inbox entries (so a crash after
/// this loses nothing), note the epoch in control, and return the new
/// entries.
async fn reconcile_inbox(
    ctx: &Context,
    run: &RunState,
    inbox: &[InboxEntry],
    source: Option<Vec<ObjectMeta>>,
) -> Result<Vec<InboxEntry>> {
    let p = &ctx.pipeline;
    let store = ctx.checkpoint.store().as_ref();
    let source = match source {
        Some(s) => s,
        None => discovery::list_inputs(ctx.source.as_ref(), &p.source, None).await?,
    };
    let claims = store
        .list(crate::paths::checkpoint::CLAIMS_PREFIX, None)
        .await?;
    let lost = discovery::unnotified(&source, &claims, inbox);
    let objects: Vec<(String, u64)> = lost.iter().map(|m| (m.key.clone(), m.size)).collect();
    discovery::record_notified(ctx.checkpoint.store(), objects).await?;
    let epoch = run.epoch;
    update_control(ctx, epoch, &|c| c.reconciled_epoch = Some(epoch)).await?;
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

/// Claim source key `key` for the run with `epoch`: `true` if this run takes
/// it, `false` if a committed batch holds it already (a duplicate
/// notification). A claim left uncommitted is taken over with
/// compare-and-swap, so a commit that marks it meanwhile wins.
async fn claim_key(ctx: &Context, key: &str, epoch: u64) -> Result<bool> {
    use crate::storage::{PutMode, PutOutcome};
    let store = ctx.checkpoint.store();
    let path = crate::paths::checkpoint::claim(key);
    let mine = serde_json::to_vec(&KeyClaim {
        epoch,
        committed: false,
        batch: None,
    })
    .expect("a claim serializes");
    let mut mode = PutMode::Create;
    for _ in 0..16 {
        if let PutOutcome::Written(_) = store.put(&path, mine.clone().into(), mode).await? {
            return Ok(true);
        }
        mode = match store.get(&path).await? {
            None => PutMode::Create,
            Some(obj) => {
                let claim: KeyClaim = serde_json::from_slice(&obj.bytes)
                    .map_err(|e| ctx.broken(path.clone(), e.to_string()))?;
                if claim.committed {
                    return Ok(false);
                }
                PutMode::Update(obj.etag)
            }
        };
    }
    Err(ctx.conflict(format!(
        "the claim {path} keeps changing under this run; it stops"
    )))
}

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
        };
        registry
            .put(
                &crate::paths::registry::entry(&p.name),
                serde_json::to_vec_pretty(&entry)
                    .expect("serialisable")
                    .into(),
                crate::storage::PutMode::Overwrite,
            )
            .await?;
    }
    ctx.pin_schema(schema);
    Ok(record)
}

/// The source schema: declared, else pinned, else inferred from the first
/// listed input. `None` when there is nothing to infer from.
async fn resolve_schema(
    ctx: &Context,
    record: Option<&PipelineRecord>,
    listed: &[ObjectMeta],
) -> Result<Option<SchemaRef>> {
    let p = &ctx.pipeline;
    let pinned = record.map(|r| schema_of(&r.schema));
    if let Some(r) = record
        && r.pipeline.source.format != p.source.format
    {
        return Err(Error::Incompatible {
            pipeline: p.name.clone(),
            message: format!(
                "source format changed ({:?} -> {:?}); register a new pipeline (new name) or \
                 delete its checkpoint folder to start over",
                r.pipeline.source.format, p.source.format
            ),
        });
    }
    if let Some(r) = record
        && let Some(message) = discovery_change(r.pipeline.source.discovery, p.source.discovery)
    {
        return Err(Error::Incompatible {
            pipeline: p.name.clone(),
            message,
        });
    }
    if let Some(declared) = p.source.declared_schema() {
        if let Some(pinned) = &pinned
            && let Some(change) = schema_change(pinned, &declared)
        {
            return Err(Error::Incompatible {
                pipeline: p.name.clone(),
                message: format!(
                    "source schema changed ({change}); register a new pipeline (new name) or \
                     delete its checkpoint folder to start over"
                ),
            });
        }
        return Ok(Some(declared));
    }
    if pinned.is_some() {
        return Ok(pinned);
    }
    let Some(first) = discovery::new_inputs(listed, &Index::default(), p.source.discovery)
        .into_iter()
        .next()
    else {
        return Ok(None);
    };
    let access = ctx.source.scan_access()?;
    let format = SqlOperator::format(p);
    let session = SessionContext::new();
    let meta = object_store::ObjectMeta {
        location: access.path(&first.key),
        last_modified: chrono::Utc::now(),
        size: first.size,
        e_tag: None,
        version: None,
    };
    let schema = format
        .infer_schema(&session.state(), &access.store, &[meta])
        .await
        .map_err(|e| Error::Input {
            pipeline: p.name.clone(),
            batch: 0,
            key: first.key.clone(),
            message: format!(
                "cannot infer the source schema from it: {e}; fix the file or declare source.schema"
            ),
        })?;
    // Keep only names and types: file metadata does not belong in the pin.
    Ok(Some(schema_of(&columns_of(&schema))))
}

/// Why a change of discovery mode would process files again, if it would.
/// `list` keeps every processed key and `ordered` a window of them, in
/// `index/processed.json`; `notify` keeps one claim per key under
/// `index/keys/`. Only `list` -> `ordered` keeps what the new mode needs.
fn discovery_change(old: DiscoveryMode, new: DiscoveryMode) -> Option<String> {
    use DiscoveryMode::{List, Notify, Ordered};
    let why = match (old, new) {
        (a, b) if a == b => return None,
        (List, Ordered) => return None,
        (Ordered, List) => "the processed-file index only holds the ordered lookback window",
        (Notify, _) => "notify mode records processed files as claims, not in the index",
        (_, Notify) => "the processed-file index holds no notify claims",
        _ => unreachable!("all pairs covered"),
    };
    Some(format!(
        "discovery changed from {} to {}: {why}, so the new mode would process older files \
         again; keep discovery = \"{}\", or delete the checkpoint folder to start over",
        old.name(),
        new.name(),
        old.name()
    ))
}

fn schema_change(old: &Schema, new: &Schema) -> Option<String> {
    for f in old.fields() {
        match new.field_with_name(f.name()) {
            Err(_) => return Some(format!("column {} removed", f.name())),
            Ok(n) if n.data_type() != f.data_type() => {
                return Some(format!(
                    "column {}: {} -> {}",
                    f.name(),
                    f.data_type(),
                    n.data_type()
                ));
            }
            _ => {}
        }
    }
    for f in new.fields() {
        if old.field_with_name(f.name()).is_err() {
            return Some(format!("column {} added", f.name()));
        }
    }
    None
}

/// Discover new input (AvailableNow: what is there now) and write the plans
/// of all its batches, create-only, before any output exists.
async fn discover_and_plan(
    ctx: &Context,
    mut run: RunState,
    control: &Control,
    seen: Seen,
    clock: &PlanClock,
) -> Result<PlanOutcome> {
    let p = &ctx.pipeline;
    let mut seen = Some(seen);
    let mut first_look = true;
    let Fresh {
        inputs: fresh,
        entries,
        more,
    } = loop {
        let seen = seen.take().unwrap_or(Seen::Nothing);
        let found = find_new(ctx, &run, control, seen, first_look).await?;
        first_look = false;
        run.discovered = true;
        if !found.inputs.is_empty() {
            break found;
        }
        // A slice of duplicates only: take the next slice.
        if !found.more && release_idle(ctx, &run).await? {
            return Ok(PlanOutcome::Done { run });
        }
    };
    if more {
        // What this slice left in the inbox is discovered at the end of the
        // run (or by the execution that continues it).
        update_control(ctx, run.epoch, &|c| c.requested = true).await?;
    }
    let first = control.next_batch();
    let now = ctx.now();
    let mut plans = Vec::new();
    for (i, inputs) in planning::split_batches(&fresh, &p.limits)
        .into_iter()
        .enumerate()
    {
        let tasks = planning::split_tasks(&inputs, p.limits.max_bytes_per_task);
        let consumed = inputs
            .iter()
            .flat_map(|f| entries.get(&f.key).cloned().unwrap_or_default())
            .collect();
        plans.push(Offsets {
            format_version: checkpoint::FORMAT_VERSION,
            batch: first + i as u64,
            epoch: run.epoch,
            planned_ms: now,
            inputs,
            tasks,
            consumed,
            plan_ms: 0,
            plan_requests: RequestCounts::default(),
        });
    }
    let plan_ms = clock.started.elapsed().as_millis() as u64;
    let mut plan_requests = ctx.counts().since(&clock.counts);
    // Each plan's own create-only write is counted once, in its batch.
    plan_requests.put_create += 1;
    for off in &mut plans {
        off.plan_ms = plan_ms;
        off.plan_requests = plan_requests;
    }
    for off in &plans {
        ctx.checkpoint.create_offsets(off).await?;
    }
    tracing::info!(pipeline = %p.name, files = fresh.len(), batches = plans.len(), "planned new input");
    batch_outcome(ctx, run, &plans[0]).await
}

/// Read control and check this run still holds `epoch`.
async fn owned_control(ctx: &Context, epoch: u64) -> Result<(Control, String)> {
    match ctx.checkpoint.control().await? {
        Some((c, etag)) if checkpoint::owns(&c, epoch) => Ok((c, etag)),
        Some((c, _)) => Err(ctx.conflict(format!(
            "this run (epoch {epoch}) lost the lease to epoch {} ({}); it stops without writing",
            c.epoch,
            c.owner.unwrap_or_default()
        ))),
        None => Err(ctx.conflict("control.json is missing; this run stops".into())),
    }
}

/// Change control with compare-and-swap while this run holds `epoch`;
/// retries when another writer (a trigger) changed it in between.
async fn update_control(
    ctx: &Context,
    epoch: u64,
    change: &(dyn Fn(&mut Control) + Send + Sync),
) -> Result<Control> {
    for _ in 0..16 {
        let (mut c, etag) = owned_control(ctx, epoch).await?;
        change(&mut c);
        if ctx
            .checkpoint
            .swap_control(&c, Some(&etag))
            .await?
            .is_some()
        {
            return Ok(c);
        }
    }
    Err(ctx.conflict("control.json keeps changing under this run; it stops".into()))
}

/// Operate step: run one task of a batch, and leave its result in the
/// checkpoint for the committer (`work/N/task-T-eE.json`).
pub async fn operate(ctx: &Context, run: &RunState, batch: u64, task: u32) -> Result<TaskResult> {
    let off = ctx
        .planned(
            batch,
            &format!("while run epoch {} operates on it", run.epoch),
        )
        .await?;
    let plan = off.tasks.iter().find(|t| t.task == task).ok_or_else(|| {
        ctx.broken(
            crate::paths::checkpoint::offsets(batch),
            format!("has no task {task}"),
        )
    })?;
    let schema = ctx.schema().await?;
    let op = SqlOperator::new(ctx.pipeline.clone(), schema);
    // Views that count only this task's requests.
    let source = CountingStore::new(ctx.source.clone());
    let sink = ParquetSink::new(
        Arc::new(CountingStore::new(ctx.sink.store().clone())),
        &ctx.pipeline.name,
    );
    let mut result = op
        .run(&source, &sink, run.epoch, batch, &off.inputs, plan)
        .await?;
    result.requests.get += 1; // the plan read above
    result.requests.put += 1; // the result written below
    let bytes = serde_json::to_vec(&result).expect("a task result serializes");
    ctx.checkpoint
        .store()
        .put(
            &crate::paths::checkpoint::work(batch, task, run.epoch),
            bytes.into(),
            crate::storage::PutMode::Overwrite,
        )
        .await?;
    tracing::debug!(pipeline = %ctx.pipeline.name, batch, task, rows = result.rows_out, "task done");
    Ok(result)
}

/// Commit step: collect the task results, check the outputs, write
/// `commits/N` (create-only), then the manifest, the index and control.
/// Returns the commit record.
pub async fn commit(ctx: &Context, run: &RunState, batch: u64) -> Result<Commit> {
    let started = std::time::Instant::now();
    let counts_before = ctx.counts();
    let started_ms = ctx.now();
    owned_control(ctx, run.epoch).await?;
    let off = ctx.planned(batch, "at commit").await?;
    let mut results: Vec<TaskResult> = Vec::with_capacity(off.tasks.len());
    for t in &off.tasks {
        let key = crate::paths::checkpoint::work(batch, t.task, run.epoch);
        let Some(obj) = ctx.checkpoint.store().get(&key).await? else {
            return Err(Error::Execution {
                pipeline: ctx.pipeline.name.clone(),
                batch,
                task: t.task,
                message: format!(
                    "no result at {key}: the task did not finish under this run; run again"
                ),
                class: ErrorClass::Fatal,
            });
        };
        results
            .push(serde_json::from_slice(&obj.bytes).map_err(|e| ctx.broken(key, e.to_string()))?);
    }
    let mut outputs: Vec<_> = results.iter().flat_map(|r| r.outputs.clone()).collect();
    outputs.sort_by(|a, b| a.key.cmp(&b.key));
    ctx.sink.verify(batch, &outputs).await?;
    let task_requests = results
        .iter()
        .fold(RequestCounts::default(), |acc, r| acc.plus(&r.requests));
    let mut record = Commit {
        format_version: checkpoint::FORMAT_VERSION,
        batch,
        epoch: run.epoch,
        committed_ms: ctx.now(),
        files: off.inputs.len() as u64,
        bytes_read: off.bytes(),
        rows_in: results.iter().map(|r| r.rows_in).sum(),
        rows_out: results.iter().map(|r| r.rows_out).sum(),
        outputs,
        durations: Durations {
            plan_ms: off.plan_ms,
            operate_ms: (started_ms - off.planned_ms).max(0) as u64,
            task_max_ms: results.iter().map(|r| r.millis).max().unwrap_or(0),
            commit_ms: 0,
        },
        requests: RequestCounts::default(),
        input_keys: off.inputs.iter().map(|i| i.key.clone()).collect(),
        trigger: run.trigger.clone(),
        consumed: off.consumed.clone(),
    };
    record.durations.commit_ms = started.elapsed().as_millis() as u64;
    // Planner, tasks and this committer, including the commit write itself.
    let mut own = ctx.counts().since(&counts_before);
    own.put_create += 1;
    record.requests = off.plan_requests.plus(&task_requests).plus(&own);
    if !ctx.checkpoint.create_commit(&record).await? {
        // A retried commit: the record that won is the truth.
        record = ctx.checkpoint.commit(batch).await?.ok_or_else(|| {
            ctx.broken(
                crate::paths::checkpoint::commit(batch),
                "create-only write lost, yet no record is there",
            )
        })?;
    }
    finish_commit(ctx, run, &record).await?;
    Ok(record)
}

/// After `commits/N` exists: publish the manifest, advance the index and
/// control, prune old records. Idempotent, so recovery can redo it.
async fn finish_commit(ctx: &Context, run: &RunState, record: &Commit) -> Result<()> {
    let p = &ctx.pipeline;
    ctx.sink
        .commit(&Manifest {
            format_version: checkpoint::FORMAT_VERSION,
            pipeline: p.name.clone(),
            batch: record.batch,
            files: record.outputs.clone(),
            rows: record.rows_out,
        })
        .await?;
    ctx.sink
        .remove_uncommitted(record.batch, &record.outputs)
        .await?;
    let work = ctx.checkpoint.store();
    for m in work
        .list(&crate::paths::checkpoint::work_prefix(record.batch), None)
        .await?
    {
        work.delete(&m.key).await?;
    }
    let listing = if p.source.discovery == DiscoveryMode::Notify {
        settle_claims(ctx, record).await?;
        None
    } else {
        let index = ctx.checkpoint.index().await?;
        let index = index.apply(
            record.batch,
            &record.input_keys,
            p.source.discovery,
            p.source.lookback,
        );
        ctx.checkpoint.put_index(&index).await?;
        Some(index.listing())
    };
    let now = ctx.now();
    let spec_hash = p.spec_hash();
    let c = update_control(ctx, run.epoch, &|c| {
        if c.last_committed.is_some_and(|l| l >= record.batch) {
            return;
        }
        c.last_committed = Some(record.batch);
        c.last_commit_ms = Some(record.committed_ms);
        if let Some(l) = &listing {
            c.listing = l.clone();
        }
        c.heartbeat_ms = Some(now);
        c.spec_hash = spec_hash.clone();
        c.totals.batches += 1;
        c.totals.files += record.files;
        c.totals.bytes += record.bytes_read;
        c.totals.rows_in += record.rows_in;
        c.totals.rows_out += record.rows_out;
    })
    .await?;
    let floor = checkpoint::retention_floor(record.batch, p.retain_batches);
    if floor > 0 && c.last_committed == Some(record.batch) {
        ctx.checkpoint.prune_below(floor).await?;
    }
    Ok(())
}

/// Notify mode, after `commits/N` exists: mark the claims of its keys
/// committed, then delete the inbox entries it consumed (in that order, so
/// a duplicate notification arriving at any point is recognised).
async fn settle_claims(ctx: &Context, record: &Commit) -> Result<()> {
    let store = ctx.checkpoint.store();
    let done: bytes::Bytes = serde_json::to_vec(&KeyClaim {
        epoch: record.epoch,
        committed: true,
        batch: Some(record.batch),
    })
    .expect("a claim serializes")
    .into();
    discovery::concurrently(record.input_keys.clone(), |k| {
        let (store, done) = (store.clone(), done.clone());
        async move {
            store
                .put(
                    &crate::paths::checkpoint::claim(&k),
                    done,
                    crate::storage::PutMode::Overwrite,
                )
                .await?;
            Ok(())
        }
    })
    .await?;
    discovery::delete_all(store, record.consumed.clone()).await
}

/// Refresh this run's heartbeat, proving it still holds `run.epoch`.
pub async fn heartbeat(ctx: &Context, run: &RunState) -> Result<()> {
    let now = ctx.now();
    update_control(ctx, run.epoch, &|c| c.heartbeat_ms = Some(now)).await?;
    Ok(())
}

/// Give the lease back with `status` (`Idle` once no planned batch is left
/// uncommitted). A run that fails otherwise keeps the lease: the next run
/// takes it over when the owner is gone or its heartbeat expired, and
/// recovers.
pub async fn release(ctx: &Context, run: &RunState, status: RunStatus) -> Result<()> {
    let now = ctx.now();
    let spec_hash = ctx.pipeline.spec_hash();
    update_control(ctx, run.epoch, &|c| {
        c.status = status;
        c.heartbeat_ms = Some(now);
        // pipeline.json holds this spec since the lease was taken.
        c.spec_hash = spec_hash.clone();
    })
    .await?;
    tracing::info!(pipeline = %ctx.pipeline.name, epoch = run.epoch, "lease released");
    Ok(())
}

/// After a batch's input was refused: delete the plans of `batch` and every
/// later planned batch (highest first, so a crash here leaves a prefix of
/// plans that the next run resumes), remove their uncommitted output, and
/// release the lease. The next run plans afresh from what is there then.
pub async fn abandon(ctx: &Context, run: &RunState, batch: u64) -> Result<()> {
    owned_control(ctx, run.epoch).await?;
    let planned = ctx
        .checkpoint
        .store()
        .list(crate::paths::checkpoint::OFFSETS_PREFIX, None)
        .await?;
    let mut batches: Vec<u64> = planned
        .iter()
        .filter_map(|m| crate::paths::checkpoint::batch_of(&m.key))
        .filter(|n| *n >= batch)
        .collect();
    batches.sort_unstable_by(|a, b| b.cmp(a));
    for n in batches {
        for m in ctx
            .sink
            .store()
            .list(&crate::paths::sink::batch_prefix(n), None)
            .await?
        {
            ctx.sink.store().delete(&m.key).await?;
        }
        ctx.checkpoint.delete_offsets(n).await?;
    }
    release(ctx, run, RunStatus::Idle).await
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
    for _ in 0..16 {
        let read = ctx.checkpoint.control().await?;
        let mut next = read
            .as_ref()
            .map(|(c, _)| c.clone())
            .unwrap_or_else(|| Control::new(ctx.pipeline.spec_hash()));
        next.paused = paused;
        if ctx
            .checkpoint
            .swap_control(&next, read.as_ref().map(|(_, e)| e.as_str()))
            .await?
            .is_some()
        {
            return Ok(next);
        }
    }
    Err(ctx.conflict("control.json keeps changing; try again".into()))
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

/// Input of the planner function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// Pipeline name.
    pub pipeline: String,
    /// The run so far; `null` for the first plan of an execution.
    #[serde(default)]
    pub run: Option<RunState>,
}

/// Input of the operator function: one task of a planned batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRequest {
    /// Pipeline name.
    pub pipeline: String,
    /// The run.
    pub run: RunState,
    /// Batch number.
    pub batch: u64,
    /// Task number.
    pub task: u32,
}

/// Output of the operator function: an acknowledgement (the result itself
/// stays in the checkpoint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskAck {
    /// Task number.
    pub task: u32,
    /// Rows written.
    pub rows_out: u64,
    /// Files written.
    pub files: u64,
}

/// What the committer function is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitAction {
    /// Commit the batch.
    Commit,
    /// Drop the plans from this batch on after its input was refused.
    Abandon,
    /// After a Distributed Map failed (it reports only that a child failed):
    /// if a task of this run refused its input, abandon as above and fail
    /// with that refusal (`Sluice.InvalidInput`); otherwise fail
    /// (`Sluice.Fatal`) keeping the lease, so the next run resumes the batch.
    Settle,
}

/// Input of the committer function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRequest {
    /// Commit or abandon.
    pub action: CommitAction,
    /// Pipeline name.
    pub pipeline: String,
    /// The run.
    pub run: RunState,
    /// Batch number.
    pub batch: u64,
}

/// Output of the committer function: what was committed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitSummary {
    /// Batch number.
    pub batch: u64,
    /// Input files.
    pub files: u64,
    /// Input bytes.
    pub bytes: u64,
    /// Rows read.
    pub rows_in: u64,
    /// Rows written.
    pub rows_out: u64,
    /// Output files.
    pub outputs: u64,
    /// Requests of the batch.
    pub requests: RequestCounts,
}

impl From<&Commit> for CommitSummary {
    fn from(c: &Commit) -> Self {
        CommitSummary {
            batch: c.batch,
            files: c.files,
            bytes: c.bytes_read,
            rows_in: c.rows_in,
            rows_out: c.rows_out,
            outputs: c.outputs.len() as u64,
            requests: c.requests,
        }
    }
}

impl Context {
    fn check_pipeline(&self, name: &str) -> Result<()> {
        if name == self.pipeline.name {
            Ok(())
        } else {
            Err(Error::Execution {
                pipeline: self.pipeline.name.clone(),
                batch: 0,
                task: 0,
                message: format!(
                    "a request for pipeline \"{name}\" reached this pipeline's handler"
                ),
                class: ErrorClass::Fatal,
            })
        }
    }
}

/// A boxed handler future. Boxing here, where lifetimes are concrete, lets
/// callers that need `Send` for every lifetime (the state machine's task
/// invoker) hold it: rustc cannot prove that through nested async fns.
pub type HandlerFuture<'a, T> = futures::future::BoxFuture<'a, Result<T>>;

/// The planner function's entry point.
pub fn handle_plan(ctx: &Context, req: PlanRequest) -> HandlerFuture<'_, PlanOutcome> {
    Box::pin(async move {
        ctx.check_pipeline(&req.pipeline)?;
        plan(ctx, req.run).await
    })
}

/// The operator function's entry point.
pub fn handle_task(ctx: &Context, req: TaskRequest) -> HandlerFuture<'_, TaskAck> {
    Box::pin(async move {
        ctx.check_pipeline(&req.pipeline)?;
        let r = match operate(ctx, &req.run, req.batch, req.task).await {
            Ok(r) => r,
            Err(e) => {
                if e.class() == ErrorClass::InvalidInput {
                    record_refusal(ctx, &req, &e).await;
                }
                return Err(e);
            }
        };
        Ok(TaskAck {
            task: r.task,
            rows_out: r.rows_out,
            files: r.outputs.len() as u64,
        })
    })
}

/// What a task whose input was refused leaves for the settle step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The task.
    pub task: u32,
    /// The error, as the task reported it.
    pub message: String,
}

/// Leave the refusal where `settle` finds it. Best effort: without it a
/// Distributed Map's failure keeps the lease instead of abandoning the batch
/// (the inline Map sees the error name itself).
async fn record_refusal(ctx: &Context, req: &TaskRequest, e: &Error) {
    let r = Refusal {
        task: req.task,
        message: e.to_string(),
    };
    let key = crate::paths::checkpoint::refusal(req.batch, req.task, req.run.epoch);
    let put = ctx
        .checkpoint
        .store()
        .put(
            &key,
            serde_json::to_vec(&r).expect("serialisable").into(),
            crate::storage::PutMode::Overwrite,
        )
        .await;
    if let Err(w) = put {
        tracing::warn!(key, error = %w, "could not record the task's refusal");
    }
}

/// After a Distributed Map over `batch` failed: the error to end the run
/// with. A refusal left by a task of this run abandons the batch (as the
/// inline Map's Catch does) and is reported as `Sluice.InvalidInput`;
/// anything else is `Sluice.Fatal` and keeps the lease for the next run.
async fn settle(ctx: &Context, run: &RunState, batch: u64) -> Error {
    let found = async {
        let suffix = format!("-e{}.json", run.epoch);
        let listed = ctx
            .checkpoint
            .store()
            .list(&crate::paths::checkpoint::work_prefix(batch), None)
            .await?;
        for m in listed {
            let name = m.key.rsplit('/').next().unwrap_or_default();
            if name.starts_with("refused-")
                && name.ends_with(&suffix)
                && let Some(obj) = ctx.checkpoint.store().get(&m.key).await?
            {
                let r: Refusal = serde_json::from_slice(&obj.bytes)
                    .map_err(|e| ctx.broken(m.key.clone(), e.to_string()))?;
                return Ok(Some(r));
            }
        }
        Ok::<_, Error>(None)
    };
    match found.await {
        Err(e) => e,
        Ok(Some(r)) => match abandon(ctx, run, batch).await {
            Err(e) => e,
            Ok(()) => Error::Execution {
                pipeline: ctx.pipeline.name.clone(),
                batch,
                task: r.task,
                message: format!(
                    "{} (the batch's plan was dropped; fix the input and run again)",
                    r.message
                ),
                class: ErrorClass::InvalidInput,
            },
        },
        Ok(None) => Error::Execution {
            pipeline: ctx.pipeline.name.clone(),
            batch,
            task: 0,
            message: "a task of the Distributed Map failed (see its map run's failed child \
                      executions); the lease is kept and the next run resumes this batch"
                .into(),
            class: ErrorClass::Fatal,
        },
    }
}

/// The committer function's entry point.
pub fn handle_commit(ctx: &Context, req: CommitRequest) -> HandlerFuture<'_, CommitSummary> {
    Box::pin(async move {
        ctx.check_pipeline(&req.pipeline)?;
        match req.action {
            CommitAction::Commit => Ok(CommitSummary::from(
                &commit(ctx, &req.run, req.batch).await?,
            )),
            CommitAction::Abandon => {
                abandon(ctx, &req.run, req.batch).await?;
                Ok(CommitSummary {
                    batch: req.batch,
                    ..CommitSummary::default()
                })
            }
            CommitAction::Settle => Err(settle(ctx, &req.run, req.batch).await),
        }
    })
}
