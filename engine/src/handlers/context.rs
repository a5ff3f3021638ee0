//! What a handler needs for one pipeline ([`Context`], built once per
//! process) and, for the Lambda functions, the contexts of every pipeline
//! registered under one checkpoint root ([`Contexts`]), kept in step with
//! `pipeline.json`.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;

use super::payloads::RunState;
use crate::checkpoint::owner::Owner;
use crate::checkpoint::{Checkpoint, Offsets, PipelineRecord};
use crate::error::{Error, ErrorClass, Result};
use crate::pipeline::Pipeline;
use crate::pipeline::schema::schema_of;
use crate::sinks::ParquetSink;
use crate::storage::{Location, RequestCounts, S3Config, Store};

/// Milliseconds since the Unix epoch.
pub(crate) type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Whether the process named by a lease owner has exited.
pub(crate) type OwnerGone = Arc<dyn Fn(&str) -> bool + Send + Sync>;

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
    /// Whether the owner an `owner` field names has exited.
    pub owner_gone: OwnerGone,
    /// The checkpoint root shared by all pipelines (`<checkpoint uri>`),
    /// where `register` lists the pipeline for the trigger.
    pub registry: Option<Arc<dyn Store>>,
    /// Notify mode: reconcile (list the source) in the next run whether or
    /// not `reconcile_every` runs have passed (`sluice run --reconcile`).
    pub reconcile: bool,
    /// Where CloudWatch EMF metric lines go (on Lambda, stdout; else none).
    pub metrics: Option<crate::metrics::Metrics>,
    /// The S3 configuration the stores were opened with, to open other
    /// locations (the folders around the sink); `None` for a context over
    /// explicit stores.
    pub(crate) s3: Option<S3Config>,
    schema: Arc<tokio::sync::OnceCell<SchemaRef>>,
    /// A stateful query planned for merging, per input schema: planned
    /// once per context (process, warm Lambda container), not per merge.
    staged: Arc<std::sync::Mutex<StagedPlans>>,
    /// The static tables as this invocation pinned them (a counted
    /// context, one per invocation, starts without): listed once per plan.
    statics_pinned: Arc<std::sync::Mutex<Option<Vec<crate::checkpoint::StaticPin>>>>,
    /// Requests made for this invocation before its context was in hand
    /// (loading contexts, the trigger's registry listing): part of
    /// [`Context::counts`].
    carried: RequestCounts,
    /// Requests made through stores opened for one look (the folders
    /// around the sink): the last counter is this context's own (part of
    /// [`Context::counts`]); the ones before it are the contexts this one
    /// is a counting view of, which count the same requests as theirs.
    others: Vec<Arc<crate::storage::RequestCounter>>,
}

/// Stateful queries planned for merging, by input schema.
type StagedPlans =
    HashMap<String, Option<(crate::operators::StatefulQuery, crate::operators::Staged)>>;

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
        let delta = (pipeline.sink_format == crate::pipeline::SinkFormat::Delta).then(|| {
            crate::sinks::DeltaSettings {
                checkpoint_interval: pipeline
                    .delta_checkpoint_interval
                    .unwrap_or(crate::sinks::DeltaSettings::default().checkpoint_interval),
                complete: pipeline.output_mode == crate::pipeline::OutputMode::Complete,
                partition_by: pipeline.partition_by.clone(),
            }
        });
        let partition_by = pipeline.partition_by.clone();
        Context {
            pipeline: Arc::new(pipeline),
            source,
            sink: ParquetSink::new(sink, &name)
                .with_delta(delta)
                .with_partition_by(partition_by),
            checkpoint: Checkpoint::new(checkpoint, &name),
            owner: Owner::this_process().to_string(),
            clock: Arc::new(|| chrono::Utc::now().timestamp_millis()),
            owner_gone: Arc::new(|o| Owner::parse(o).gone()),
            registry: None,
            reconcile: false,
            metrics: crate::metrics::from_env(),
            s3: None,
            schema: Arc::default(),
            staged: Arc::default(),
            statics_pinned: Arc::default(),
            carried: RequestCounts::default(),
            others: vec![Arc::default()],
        }
    }

    /// This context with `registry` as the checkpoint root.
    pub(crate) fn with_registry(mut self, registry: Arc<dyn Store>) -> Context {
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
        let mut ctx = Context::new(pipeline, source, sink, checkpoint).with_registry(registry);
        ctx.s3 = s3.cloned();
        Ok(ctx)
    }

    /// The pipeline's query as a stateful query and its aggregate in
    /// stages, over input of `schema`, planned once per context (`None`:
    /// the query is row by row).
    pub(crate) async fn staged(
        &self,
        schema: SchemaRef,
        statics: Option<&[crate::checkpoint::StaticPin]>,
    ) -> Result<Option<(crate::operators::StatefulQuery, crate::operators::Staged)>> {
        // Static tables as a batch's plan pinned them, else as they stand.
        let pins = match statics {
            Some(p) => p.to_vec(),
            None if self.pipeline.statics.is_empty() => Vec::new(),
            None => self.pin_statics().await?,
        };
        let columns: Vec<_> = pins.iter().map(|p| &p.columns).collect();
        let key = format!("{schema:?}{columns:?}");
        if let Some(hit) = self.staged.lock().expect("not poisoned").get(&key) {
            return Ok(hit.clone());
        }
        let op = crate::operators::SqlOperator::new(self.pipeline.clone(), schema)
            .with_statics(pins, None);
        let planned = match op.stateful().await? {
            Some(q) => {
                let staged = op.staged(&q).await?;
                Some((q, staged))
            }
            None => None,
        };
        self.staged
            .lock()
            .expect("not poisoned")
            .insert(key, planned.clone());
        Ok(planned)
    }

    /// A store at `at`, opened with this context's S3 configuration, its
    /// requests counted as this context's; `None` where it cannot be opened
    /// (an S3 location in a context over explicit stores).
    /// The stores of the pipeline's static tables (`[[static]]`), in
    /// order, their requests counted as this context's.
    pub(crate) fn static_stores(&self) -> Result<Vec<Arc<dyn Store>>> {
        self.pipeline
            .statics
            .iter()
            .map(|t| {
                self.open_counted(&t.location).ok_or_else(|| Error::Spec {
                    file: self.pipeline.name.clone(),
                    message: format!(
                        "[[static]] table {}: {} cannot be opened (an s3:// location needs the \
                         AWS configuration)",
                        t.table,
                        t.location.display()
                    ),
                })
            })
            .collect()
    }

    /// The pipeline's static tables as they stand now: what a batch
    /// planned now reads (one listing each, and their columns inferred;
    /// once per invocation).
    pub(crate) async fn pin_statics(&self) -> Result<Vec<crate::checkpoint::StaticPin>> {
        if let Some(pins) = self.statics_pinned.lock().expect("not poisoned").clone() {
            return Ok(pins);
        }
        let stores = self.static_stores()?;
        let mut pins = Vec::new();
        for (t, store) in self.pipeline.statics.iter().zip(&stores) {
            pins.push(crate::operators::statics::pin(&self.pipeline, t, store).await?);
        }
        *self.statics_pinned.lock().expect("not poisoned") = Some(pins.clone());
        Ok(pins)
    }

    /// An operator for the pipeline reading `schema`, its static tables
    /// pinned as they stand now, for checking the query (no rows).
    pub(crate) async fn checking_operator(
        &self,
        schema: SchemaRef,
    ) -> Result<crate::operators::SqlOperator> {
        let op = crate::operators::SqlOperator::new(self.pipeline.clone(), schema);
        if self.pipeline.statics.is_empty() {
            return Ok(op);
        }
        Ok(op.with_statics(self.pin_statics().await?, None))
    }

    pub(crate) fn open_counted(&self, at: &Location) -> Option<Arc<dyn Store>> {
        let mut store = at.open(self.s3.as_ref()).ok()?;
        for counter in &self.others {
            store = Arc::new(crate::storage::CountingStore::sharing(
                store,
                counter.clone(),
            ));
        }
        Some(store)
    }

    /// A local source folder that does not exist is a mistake (a
    /// misspelled path), not a pipeline with no input yet. Checked by the
    /// commands a person runs (`sluice run`, `check`, `register`), not by
    /// the engine's steps: a pipeline reading another's sink may start
    /// before that sink's first commit made its folder.
    pub fn check_source_exists(&self) -> Result<()> {
        if let Location::Local(path) = &self.pipeline.source.location
            && !path.is_dir()
        {
            return Err(Error::Spec {
                file: self.pipeline.name.clone(),
                message: format!(
                    "source.uri: {} is not a folder; check the path (the folder must exist, \
                     even while empty)",
                    path.display()
                ),
            });
        }
        Ok(())
    }

    /// Write a metric line, if this context writes them.
    pub(crate) fn metric(&self, line: impl FnOnce() -> String) {
        if let Some(m) = &self.metrics {
            m(&line());
        }
    }

    /// This context with each store seen through a view that counts its
    /// own requests (DataFusion's scans included): a handler invocation
    /// run on it finds its own requests in [`Context::counts`], whatever
    /// else runs in the process (the local runner runs a batch's tasks side
    /// by side on one context). Caches stay shared.
    pub(crate) fn counted(&self) -> Context {
        let view = |s: &Arc<dyn Store>| -> Arc<dyn Store> {
            Arc::new(crate::storage::CountingStore::new(s.clone()))
        };
        let name = &self.pipeline.name;
        let mut others = self.others.clone();
        others.push(Arc::default());
        Context {
            others,
            source: view(&self.source),
            sink: ParquetSink::new(view(self.sink.store()), name)
                .with_delta(self.sink.delta_settings())
                .with_partition_by(self.sink.partition_by().to_vec()),
            checkpoint: Checkpoint::new(view(self.checkpoint.store()), name),
            registry: self.registry.as_ref().map(view),
            statics_pinned: Arc::default(),
            ..self.clone()
        }
    }

    /// [`Context::counted`], with `carried` requests made for the same
    /// invocation before.
    pub(crate) fn counted_with(&self, carried: RequestCounts) -> Context {
        Context {
            carried: self.carried.plus(&carried),
            ..self.counted()
        }
    }

    /// Requests made so far through all of this pipeline's stores (and
    /// those carried in).
    pub fn counts(&self) -> RequestCounts {
        self.source
            .counts()
            .plus(&self.sink.store().counts())
            .plus(&self.checkpoint.store().counts())
            .plus(&self.carried)
            .plus(&self.others.last().map(|c| c.snapshot()).unwrap_or_default())
    }

    pub(crate) fn now(&self) -> i64 {
        (self.clock)()
    }

    /// What the source seam is asked through.
    pub(crate) fn scope(&self) -> crate::discovery::Scope<'_> {
        crate::discovery::Scope {
            now_ms: self.now(),
            pipeline: &self.pipeline,
            source: &self.source,
            checkpoint: &self.checkpoint,
            reconcile: self.reconcile,
        }
    }

    pub(crate) fn conflict(&self, message: String) -> Error {
        Error::Conflict {
            pipeline: self.pipeline.name.clone(),
            message,
        }
    }

    pub(crate) fn broken(&self, key: String, message: impl Into<String>) -> Error {
        Error::Checkpoint {
            pipeline: self.pipeline.name.clone(),
            key,
            message: message.into(),
        }
    }

    pub(crate) async fn planned(&self, batch: u64, epoch: u64, when: &str) -> Result<Offsets> {
        if let Some(off) = self.checkpoint.offsets(batch).await? {
            return Ok(off);
        }
        // Gone because the run of `epoch` lost its lease meanwhile (a newer
        // run abandoned the batch, or `sluice reset` retired it): it stops;
        // nothing is broken.
        let moved = match self.checkpoint.control().await? {
            None => true,
            Some((c, _)) => c.epoch != epoch || c.resetting || batch < c.first_batch,
        };
        if moved {
            return Err(self.conflict(format!(
                "the plan of batch {batch} is gone: the run of epoch {epoch} lost its lease \
                 (another run took over, or the pipeline was reset); it stops without writing"
            )));
        }
        Err(self.broken(
            crate::paths::checkpoint::offsets(batch),
            format!("missing {when}"),
        ))
    }

    pub(crate) fn ttl_ms(&self) -> i64 {
        // Saturating: a spec read from a stored record was not bounded by
        // the parser.
        i64::try_from(self.pipeline.limits.lease_ttl_seconds)
            .unwrap_or(i64::MAX)
            .saturating_mul(1000)
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
        let schema = pinned_schema(&self.pipeline.name, &record)?;
        let _ = self.schema.set(schema.clone());
        Ok(schema)
    }

    /// The schema resolved in this process, if any.
    pub(crate) fn known_schema(&self) -> Option<SchemaRef> {
        self.schema.get().cloned()
    }

    /// Whether a step of the run `run` may use this context: the run's
    /// spec is this context's (a run records the spec it planned under).
    /// Otherwise a warm Lambda context may be older than `pipeline.json`:
    /// [`Contexts`] reloads it and tries again.
    pub(crate) fn check_spec(&self, run: &RunState) -> Result<()> {
        let mine = self.pipeline.spec_hash();
        if run.spec.is_empty() || run.spec == mine {
            return Ok(());
        }
        Err(Error::StaleSpec {
            pipeline: self.pipeline.name.clone(),
            run: run.spec.clone(),
            here: mine,
        })
    }
}

/// The schema pinned in a `pipeline.json`; a type that does not parse is a
/// broken record, named, not a panic or a silent fallback.
pub(crate) fn pinned_schema(pipeline: &str, record: &PipelineRecord) -> Result<SchemaRef> {
    schema_of(&record.schema).map_err(|e| Error::Checkpoint {
        pipeline: pipeline.to_string(),
        key: crate::paths::checkpoint::PIPELINE.into(),
        message: format!(
            "pinned schema{e}; register the pipeline again (sluice register) to rewrite it"
        ),
    })
}

impl Context {
    pub(crate) fn check_pipeline(&self, name: &str) -> Result<()> {
        if name == self.pipeline.name {
            Ok(())
        } else {
            Err(Error::Run {
                pipeline: self.pipeline.name.clone(),
                message: format!(
                    "a request for pipeline \"{name}\" reached this pipeline's handler"
                ),
                class: ErrorClass::Fatal,
            })
        }
    }
}

/// Contexts of the pipelines registered under one checkpoint root, built
/// from their `pipeline.json` once per process and cached. A step whose
/// run was planned under another spec than a cached context's (the
/// pipeline was registered again while the container stayed warm) gets a
/// context reloaded from `pipeline.json`, and is tried again with it.
pub struct Contexts {
    root: Location,
    s3: Option<S3Config>,
    cache: tokio::sync::Mutex<HashMap<String, Context>>,
    /// Per pipeline, the registry entry's etag and modification time when
    /// its cached context was built: a listing that shows another means
    /// the pipeline was registered again.
    stamps: tokio::sync::Mutex<HashMap<String, String>>,
    /// Requests made by these contexts themselves (registry listings,
    /// loading `pipeline.json`), and how many of them an invocation has
    /// taken on so far ([`Contexts::take_requests`]).
    requests: Arc<crate::storage::RequestCounter>,
    taken: std::sync::Mutex<RequestCounts>,
}

impl Contexts {
    /// Contexts of the pipelines registered under `root`.
    pub fn new(root: Location, s3: Option<S3Config>) -> Contexts {
        Contexts {
            root,
            s3,
            cache: tokio::sync::Mutex::new(HashMap::new()),
            stamps: tokio::sync::Mutex::new(HashMap::new()),
            requests: Arc::default(),
            taken: std::sync::Mutex::default(),
        }
    }

    /// `store`, its requests counted as these contexts' own.
    fn counting(&self, store: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(crate::storage::CountingStore::sharing(
            store,
            self.requests.clone(),
        ))
    }

    /// The requests these contexts made since last asked: the invocation
    /// that asks takes them on.
    pub(crate) fn take_requests(&self) -> RequestCounts {
        let now = self.requests.snapshot();
        let mut taken = self.taken.lock().expect("not poisoned");
        let new = now.since(&taken);
        *taken = now;
        new
    }

    /// Where the pipelines are registered.
    pub fn root(&self) -> &Location {
        &self.root
    }

    /// The store at the root (the registry lives there).
    pub(crate) fn root_store(&self) -> Result<Arc<dyn Store>> {
        let store = self
            .root
            .open(self.s3.as_ref())
            .map_err(|message| Error::Spec {
                file: self.root.display(),
                message,
            })?;
        Ok(self.counting(store))
    }

    /// The context of `pipeline`, from its registered `pipeline.json`.
    pub async fn get(&self, pipeline: &str) -> Result<Context> {
        let mut cache = self.cache.lock().await;
        if let Some(c) = cache.get(pipeline) {
            return Ok(c.clone());
        }
        let ctx = self.load(pipeline).await?;
        cache.insert(pipeline.to_string(), ctx.clone());
        Ok(ctx)
    }

    /// The contexts of every pipeline registered under the root, from one
    /// listing of the registry: a pipeline registered again since its
    /// context was cached (its entry's etag or modification time changed)
    /// is reloaded, and one no longer registered leaves the cache. The
    /// trigger routes each event with these.
    pub async fn registered(&self) -> Result<Vec<Context>> {
        let root = self.root_store()?;
        let listed = root.list(crate::paths::registry::PREFIX, None).await?;
        let mut out = Vec::new();
        let mut names = std::collections::HashSet::new();
        for m in &listed {
            let Some(name) = crate::paths::registry::pipeline_of(&m.key) else {
                continue;
            };
            names.insert(name.to_string());
            let stamp = format!("{:?} {:?}", m.etag, m.last_modified);
            let changed = self.stamps.lock().await.get(name) != Some(&stamp);
            let ctx = if changed {
                self.reload(name).await?
            } else {
                self.get(name).await?
            };
            self.stamps.lock().await.insert(name.to_string(), stamp);
            out.push(ctx);
        }
        self.cache.lock().await.retain(|k, _| names.contains(k));
        self.stamps.lock().await.retain(|k, _| names.contains(k));
        Ok(out)
    }

    /// Drop the cached context of `pipeline` and build it again.
    pub(crate) async fn reload(&self, pipeline: &str) -> Result<Context> {
        self.cache.lock().await.remove(pipeline);
        self.get(pipeline).await
    }

    /// Run `step` with the context of `pipeline`. With `check_registered`
    /// (the first Plan of an execution) the cached context is first
    /// compared with `pipeline.json` (one read) and rebuilt if the pipeline
    /// was registered again since. A step that finds its run planned under
    /// another spec than its context's gets a reloaded context and runs
    /// once more; if `pipeline.json` holds neither, the error stands (the
    /// run was planned under a spec since replaced).
    pub async fn dispatch<T, F>(&self, pipeline: &str, check_registered: bool, step: F) -> Result<T>
    where
        F: for<'a> Fn(&'a Context) -> super::HandlerFuture<'a, T>,
    {
        let mut ctx = self.get(pipeline).await?;
        if check_registered {
            let registered =
                Checkpoint::new(self.counting(ctx.checkpoint.store().clone()), pipeline)
                    .pipeline_record()
                    .await?;
            if registered.is_some_and(|r| r.spec_hash != ctx.pipeline.spec_hash()) {
                tracing::info!(
                    pipeline,
                    "registered again since this context was built; reloading"
                );
                ctx = self.reload(pipeline).await?;
            }
        }
        // The step's requests are counted from here, with what was read
        // to get its context.
        let ctx = ctx.counted_with(self.take_requests());
        match step(&ctx).await {
            Err(Error::StaleSpec { run, here, .. }) => {
                tracing::info!(pipeline, run = %run, cached = %here, "the run's spec differs from this context's; reloading");
                let fresh = self.reload(pipeline).await?;
                step(&fresh.counted_with(self.take_requests())).await
            }
            other => other,
        }
    }

    async fn load(&self, pipeline: &str) -> Result<Context> {
        let store = self
            .root
            .join(pipeline)
            .open(self.s3.as_ref())
            .map_err(|message| Error::Spec {
                file: pipeline.to_string(),
                message,
            })?;
        let store = self.counting(store);
        let record = Checkpoint::new(store, pipeline)
            .pipeline_record()
            .await?
            .ok_or_else(|| Error::Spec {
                file: pipeline.to_string(),
                message: format!(
                    "no pipeline \"{pipeline}\" is registered under {}; run `sluice register` \
                     with its pipeline file first",
                    self.root.display()
                ),
            })?;
        let schema = pinned_schema(pipeline, &record)?;
        let mut ctx = Context::open(record.pipeline, self.s3.as_ref())?;
        // In Lambda no process outlives its invocation in a way another
        // sandbox could see: a lease held by a function is freed by its TTL
        // (or, for executions, by the trigger seeing the execution ended).
        ctx.owner = Owner::Lambda(
            std::env::var("AWS_LAMBDA_LOG_STREAM_NAME")
                .or_else(|_| std::env::var("AWS_LAMBDA_FUNCTION_NAME"))
                .unwrap_or_else(|_| "function".into()),
        )
        .to_string();
        ctx.owner_gone = Arc::new(|_| false);
        ctx.pin_schema(schema);
        Ok(ctx)
    }
}
