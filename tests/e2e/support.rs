//! Shared helpers of the end-to-end tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use sluice_engine::error::StoreError;
use sluice_engine::handlers::Context;
use sluice_engine::pipeline::{Pipeline, SourceFormat};
use sluice_engine::runner::{self, RunSummary};
use sluice_engine::sinks::ParquetSink;
use sluice_engine::storage::{
    LocalStore, Object, ObjectMeta, PutMode, PutOutcome, RequestCounts, ScanAccess, Store,
};

/// The query most tests run: row-by-row, with a filter and expressions.
pub const SQL: &str = "SELECT \"VendorID\", tpep_pickup_datetime, \"PULocationID\", trip_distance, \
    fare_amount, total_amount - fare_amount AS surcharges FROM trips \
    WHERE trip_distance > 1.0";

/// A pipeline file over `root/input` with sink and checkpoint under `root/out`.
pub fn pipeline_toml(name: &str, format: &str, extra_source: &str, limits: &str) -> String {
    format!(
        r#"name = "{name}"
[source]
uri = "input"
format = "{format}"
table = "trips"
{extra_source}
[query]
sql = '''{SQL}'''
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
{limits}
"#
    )
}

/// A pipeline `down` whose source is the sink of the pipeline under the
/// same root (`out/sink`), read with `discovery`.
pub fn downstream_toml(discovery: &str, limits: &str) -> String {
    format!(
        r#"name = "down"
[source]
uri = "out/sink"
format = "parquet"
table = "up"
discovery = "{discovery}"
[query]
sql = "SELECT * FROM up"
[sink]
uri = "down/sink"
[checkpoint]
uri = "down/checkpoint"
[limits]
{limits}
"#
    )
}

/// Parse a pipeline whose relative paths resolve against `root`.
pub fn pipeline(root: &Path, toml: &str) -> Pipeline {
    Pipeline::parse(toml, "test.toml", root).expect("test pipeline parses")
}

/// A context over the pipeline's local folders, with every other owner
/// treated as gone (a restarted process in these in-process tests).
pub fn local_context(p: &Pipeline) -> Context {
    let mut ctx = Context::open(p.clone(), None).expect("local stores open");
    test_mode(&mut ctx);
    ctx
}

/// Every other lease owner counts as gone (a restarted process in these
/// in-process tests).
pub fn test_mode(ctx: &mut Context) {
    ctx.owner_gone = Arc::new(|_| true);
}

/// The local runner with Retry intervals that pass at once.
pub fn runner() -> runner::Runner {
    runner::Runner::with_sleep(Arc::new(|_| Box::pin(async {})))
}

/// The control record of the pipeline `toml` under `root`.
pub async fn control_of(root: &Path, toml: &str) -> sluice_engine::checkpoint::Control {
    let ctx = local_context(&pipeline(root, toml));
    let read = ctx.checkpoint.control().await.unwrap();
    read.expect("control.json exists").0
}

/// Every commit record of the pipeline `toml` under `root`, in order.
pub async fn commit_records(root: &Path, toml: &str) -> Vec<sluice_engine::checkpoint::Commit> {
    let ctx = local_context(&pipeline(root, toml));
    let mut out = Vec::new();
    let mut n = 0;
    while let Some(c) = ctx.checkpoint.commit(n).await.unwrap() {
        out.push(c);
        n += 1;
    }
    out
}

/// Run to the end and return the summary.
pub async fn run(ctx: &Context) -> sluice_engine::Result<RunSummary> {
    runner().run(ctx, |_| {}).await
}

/// Render batches as sorted text rows (a multiset).
pub fn rows_of(batches: &[RecordBatch]) -> Vec<String> {
    let opts = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let fmts: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts).expect("formattable"))
            .collect();
        for r in 0..b.num_rows() {
            rows.push(
                fmts.iter()
                    .map(|f| f.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            );
        }
    }
    rows.sort();
    rows
}

/// The committed output of a local sink: exactly the files its manifests
/// name, as sorted rows. Fails if a manifest names a missing file.
pub async fn committed_rows(sink_dir: &Path, name: &str) -> Vec<String> {
    let sink = ParquetSink::new(Arc::new(LocalStore::new(sink_dir.to_path_buf())), name);
    let ctx = SessionContext::new();
    let mut batches = Vec::new();
    for m in sink.manifests().await.expect("manifests readable") {
        for f in m.files {
            let path = sink_dir.join(&f.key);
            let df = ctx
                .read_parquet(path.to_str().unwrap(), ParquetReadOptions::default())
                .await
                .unwrap_or_else(|e| panic!("committed file {} unreadable: {e}", path.display()));
            batches.extend(df.collect().await.unwrap());
        }
    }
    rows_of(&batches)
}

/// The rows a reader that globs the sink sees: DuckDB's
/// `read_parquet('SINK/**/*.parquet')` (as Athena over the prefix or a
/// downstream job would read it), manifests ignored.
pub async fn globbed_rows(sink_dir: &Path) -> Vec<String> {
    fn any_parquet(dir: &Path) -> bool {
        std::fs::read_dir(dir).into_iter().flatten().any(|e| {
            let p = e.unwrap().path();
            if p.is_dir() {
                any_parquet(&p)
            } else {
                p.extension().is_some_and(|x| x == "parquet")
            }
        })
    }
    if !any_parquet(sink_dir) {
        return Vec::new();
    }
    let glob = sink_dir.join("**").join("*.parquet");
    // Without Hive partitioning: the `batch=N` folders would add a column.
    duckdb_read(
        &[glob],
        ", hive_partitioning = false",
        "SELECT * FROM trips",
    )
    .await
}

/// The rows of the pipeline's SQL over every CSV file under `input`, as
/// they are now: a one-shot DataFusion query.
pub async fn one_shot_csv_rows(input: &Path) -> Vec<String> {
    let one_shot = datafusion::prelude::SessionContext::new();
    one_shot
        .register_csv(
            "trips",
            input.to_str().unwrap(),
            datafusion::prelude::CsvReadOptions::new(),
        )
        .await
        .unwrap();
    rows_of(&one_shot.sql(SQL).await.unwrap().collect().await.unwrap())
}

/// Every file left under the sink's staging folder, hidden ones included.
pub fn staged_files(sink_dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(&sink_dir.join("_sluice/staging"), &mut out);
    out
}

/// Whether every row of `part` is in `whole`, each at most as often.
pub fn is_sub_multiset(part: &[String], whole: &[String]) -> bool {
    let mut left: std::collections::HashMap<&String, i64> = Default::default();
    for r in whole {
        *left.entry(r).or_default() += 1;
    }
    part.iter().all(|r| {
        let n = left.entry(r).or_default();
        *n -= 1;
        *n >= 0
    })
}

/// Parquet files in the sink folder that no manifest names.
pub async fn orphan_files(sink_dir: &Path, name: &str) -> Vec<String> {
    let store = Arc::new(LocalStore::new(sink_dir.to_path_buf()));
    let sink = ParquetSink::new(store.clone(), name);
    let named: Vec<String> = sink
        .manifests()
        .await
        .unwrap()
        .into_iter()
        .flat_map(|m| m.files.into_iter().map(|f| f.key))
        .collect();
    store
        .list("", None)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        // Late rows (`late = "side-output"`) are outside the manifests by
        // design; tests compare them on their own.
        .filter(|k| k.ends_with(".parquet") && !named.contains(k) && !k.starts_with("_late/"))
        .collect()
}

/// The same SQL run once, by plain DataFusion, over every file under
/// `input` (Parquet).
pub async fn one_shot_rows(input: &Path) -> Vec<String> {
    let ctx = SessionContext::new();
    ctx.register_parquet(
        "trips",
        input.to_str().unwrap(),
        ParquetReadOptions::default(),
    )
    .await
    .unwrap();
    rows_of(&ctx.sql(SQL).await.unwrap().collect().await.unwrap())
}

/// The source keys and sizes of `files` under `input`, as a trigger records
/// them from S3 notifications.
pub fn notified(files: &[PathBuf], input: &Path) -> Vec<(String, u64)> {
    files
        .iter()
        .map(|f| {
            let key = f
                .strip_prefix(input)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (key, std::fs::metadata(f).unwrap().len())
        })
        .collect()
}

/// Write taxi files into `dir`.
pub fn gen_files(dir: &Path, files: u64, rows: usize) -> Vec<PathBuf> {
    sluice_cli::generator::write_taxi_files(dir, files, rows, SourceFormat::Parquet, None).unwrap()
}

/// A context over `root`'s folders (`input`, `out/sink`, `out/checkpoint`)
/// for the pipeline `toml`, whose sink and checkpoint writes all count on
/// `writes` and fail from write number `fail_at` on (0: never): the crash
/// tests' context.
pub fn fault_context(root: &Path, toml: &str, writes: Arc<AtomicU64>, fail_at: u64) -> Context {
    gated_context(root, toml, writes, fail_at, None)
}

/// [`fault_context`] whose checkpoint writes also pass `gate`.
pub fn gated_context(
    root: &Path,
    toml: &str,
    writes: Arc<AtomicU64>,
    fail_at: u64,
    gate: Option<Arc<Gate>>,
) -> Context {
    let p = pipeline(root, toml);
    let checkpoint = root.join("out/checkpoint").join(&p.name);
    let wrap = |path: PathBuf, gate: Option<Arc<Gate>>| -> Arc<dyn Store> {
        Arc::new(FaultStore {
            inner: Arc::new(LocalStore::new(path)),
            hook: Fault {
                writes: writes.clone(),
                fail_at,
                gate,
            },
        })
    };
    let mut ctx = Context::new(
        p,
        Arc::new(LocalStore::new(root.join("input"))),
        wrap(root.join("out/sink"), None),
        wrap(checkpoint, gate),
    );
    test_mode(&mut ctx);
    ctx
}

/// After write `k` of a run failed and a rerun that ended `end`: the rerun
/// finished, the output under `root/out/sink` equals `expected` and no
/// uncommitted file is left (the crash tests' common check).
pub async fn assert_recovered(
    root: &Path,
    name: &str,
    end: &runner::RunEnd,
    expected: &[String],
    k: u64,
) {
    assert!(
        matches!(end, runner::RunEnd::Done),
        "after failing write {k}: {end:?}"
    );
    let sink = root.join("out/sink");
    assert_eq!(
        committed_rows(&sink, name).await,
        expected,
        "output after failing write {k}"
    );
    assert_eq!(
        orphan_files(&sink, name).await,
        Vec::<String>::new(),
        "uncommitted files left after failing write {k}"
    );
    let mut globbed = globbed_rows(&sink).await;
    globbed.sort();
    let mut want = expected.to_vec();
    want.sort();
    assert_eq!(
        globbed, want,
        "a glob over the sink after failing write {k}"
    );
    assert_eq!(
        staged_files(&sink),
        Vec::<String>::new(),
        "staged parts left after failing write {k}"
    );
}

/// A store whose reads pass through and whose writes go through `hook`
/// first (and after): the one wrapper behind the tests' fault injector,
/// control log and slow store.
#[derive(Debug)]
pub struct Hooked<H> {
    pub inner: Arc<dyn Store>,
    pub hook: H,
}

/// What a test store does around writes.
#[async_trait::async_trait]
pub trait WriteHook: Send + Sync + std::fmt::Debug {
    /// Before a `put`, `copy` or `delete` of `key` reaches the store; an
    /// error stops it.
    async fn before(&self, _op: &'static str, _key: &str) -> Result<(), StoreError> {
        Ok(())
    }
    /// After a put of `bytes` to `key` came back with `outcome`.
    fn after_put(&self, _key: &str, _bytes: &Bytes, _outcome: &PutOutcome) {}
}

#[async_trait::async_trait]
impl<H: WriteHook> Store for Hooked<H> {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.inner.get(key).await
    }
    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<PutOutcome, StoreError> {
        self.hook.before("put", key).await?;
        let out = self.inner.put(key, bytes.clone(), mode).await?;
        self.hook.after_put(key, &bytes, &out);
        Ok(out)
    }
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, StoreError> {
        self.inner.list(prefix, start_after).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.hook.before("delete", key).await?;
        self.inner.delete(key).await
    }
    async fn delete_if(&self, key: &str, etag: &str) -> Result<bool, StoreError> {
        self.hook.before("delete", key).await?;
        self.inner.delete_if(key, etag).await
    }
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        self.inner.head(key).await
    }
    async fn copy(&self, from: &str, to: &str) -> Result<bool, StoreError> {
        self.hook.before("copy", to).await?;
        self.inner.copy(from, to).await
    }
    async fn sweep_temp(&self, prefix: &str) -> Result<u64, StoreError> {
        self.inner.sweep_temp(prefix).await
    }
    fn counts(&self) -> RequestCounts {
        self.inner.counts()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn scan_access(&self) -> Result<ScanAccess, StoreError> {
        self.inner.scan_access()
    }
}

/// The tests' crash injector: every put, copy and delete counts as a write; write
/// number `fail_at` (1-based, counted across every store wrapped with the
/// same counter) and every later one fails with a transient error before
/// reaching the store, as if the process had died there (retries cannot get
/// past it). Puts also pass `gate`, if any.
#[derive(Debug)]
pub struct Fault {
    pub writes: Arc<AtomicU64>,
    pub fail_at: u64,
    pub gate: Option<Arc<Gate>>,
}

/// A store with the crash injector.
pub type FaultStore = Hooked<Fault>;

#[async_trait::async_trait]
impl WriteHook for Fault {
    async fn before(&self, op: &'static str, key: &str) -> Result<(), StoreError> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_at > 0 && n >= self.fail_at {
            return Err(StoreError::Transient {
                op,
                location: key.to_string(),
                message: format!("injected failure at write {n}"),
            });
        }
        if let (Some(g), "put") = (&self.gate, op) {
            g.pass(key).await;
        }
        Ok(())
    }
}

/// Holds the first write whose key starts with `prefix` until released:
/// the tests' way to stall a run at a chosen step while another runs.
#[derive(Debug, Default)]
pub struct Gate {
    pub prefix: String,
    /// Signalled when the held write arrives.
    pub reached: tokio::sync::Notify,
    /// Signal to let it go on.
    pub release: tokio::sync::Notify,
    used: std::sync::atomic::AtomicBool,
}

impl Gate {
    pub fn new(prefix: &str) -> Arc<Gate> {
        Arc::new(Gate {
            prefix: prefix.into(),
            ..Gate::default()
        })
    }

    async fn pass(&self, key: &str) {
        if key.starts_with(&self.prefix) && !self.used.swap(true, Ordering::SeqCst) {
            self.reached.notify_one();
            self.release.notified().await;
        }
    }
}

/// The Python with DuckDB that tests/run.sh installs.
pub fn python() -> String {
    std::env::var("SLUICE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The moto S3 endpoint that tests/run.sh starts.
pub fn s3_endpoint() -> String {
    std::env::var("SLUICE_S3_ENDPOINT").expect(
        "SLUICE_S3_ENDPOINT is not set: run the suite with tests/run.sh, which starts a moto S3 \
         server on 127.0.0.1",
    )
}

static BUCKET_SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh bucket on the moto server.
pub async fn fresh_bucket(cfg: &sluice_engine::storage::S3Config, what: &str) -> String {
    let name = format!(
        "sluice-{what}-{}-{}",
        std::process::id(),
        BUCKET_SEQ.fetch_add(1, Ordering::SeqCst)
    );
    cfg.client()
        .create_bucket()
        .bucket(&name)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create bucket {name} on {}: {e:?}", s3_endpoint()));
    name
}

/// Records every successful write of `control.json`, in order.
/// Compare-and-swap makes those writes a chain: each one's `If-Match` names
/// the previous one's version, so completion order is version order.
#[derive(Debug)]
pub struct ControlLog {
    pub log: Arc<std::sync::Mutex<Vec<sluice_engine::checkpoint::Control>>>,
}

impl ControlLog {
    /// `inner` with its control writes recorded in `log`.
    pub fn wrap(
        inner: Arc<dyn Store>,
        log: Arc<std::sync::Mutex<Vec<sluice_engine::checkpoint::Control>>>,
    ) -> Hooked<ControlLog> {
        Hooked {
            inner,
            hook: ControlLog { log },
        }
    }
}

impl WriteHook for ControlLog {
    fn after_put(&self, key: &str, bytes: &Bytes, outcome: &PutOutcome) {
        if key == "control.json" && matches!(outcome, PutOutcome::Written { .. }) {
            self.log
                .lock()
                .unwrap()
                .push(serde_json::from_slice(bytes).unwrap());
        }
    }
}

/// Puts take `delay` each (a slow sink, for long batches).
#[derive(Debug)]
pub struct Slow {
    pub delay: std::time::Duration,
}

impl Slow {
    /// `inner` with every put taking `delay`.
    pub fn wrap(inner: Arc<dyn Store>, delay: std::time::Duration) -> Hooked<Slow> {
        Hooked {
            inner,
            hook: Slow { delay },
        }
    }
}

#[async_trait::async_trait]
impl WriteHook for Slow {
    async fn before(&self, op: &'static str, _key: &str) -> Result<(), StoreError> {
        if op == "put" {
            tokio::time::sleep(self.delay).await;
        }
        Ok(())
    }
}

/// The rows `sql` (over the table `trips`) gives over the Parquet `files`,
/// computed by DuckDB, an engine independent of Sluice and DataFusion: it
/// writes its result to Parquet, which is read back only to render rows
/// the way [`rows_of`] renders Sluice's output.
pub async fn duckdb_rows(files: &[PathBuf], sql: &str) -> Vec<String> {
    duckdb_read(files, "", sql).await
}

/// The rows of any DuckDB query (`read_csv(...)`, `read_json(...)` over
/// files): DuckDB writes them to Parquet, read back only to render them as
/// [`rows_of`] renders Sluice's output.
pub async fn duckdb_sql(sql: &str) -> Vec<String> {
    duckdb_read(&[], "", sql).await
}

/// [`duckdb_rows`] with `options` for `read_parquet` (`, name = value`).
async fn duckdb_read(files: &[PathBuf], options: &str, sql: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("duckdb.parquet");
    let list: Vec<String> = files
        .iter()
        .map(|f| f.to_str().unwrap().to_string())
        .collect();
    let script = format!(
        "import duckdb, json, sys\n\
         con = duckdb.connect()\n\
         files = {list:?}\n\
         if files: con.execute('CREATE VIEW trips AS SELECT * FROM read_parquet(' + json.dumps(files) + '{options})')\n\
         con.execute('COPY (' + sys.argv[1] + ') TO ' + json.dumps({out:?}).replace('\"', \"'\") + ' (FORMAT parquet)')\n",
        list = list,
        out = out.to_str().unwrap(),
    );
    let run = std::process::Command::new(python())
        .arg("-c")
        .arg(&script)
        .arg(sql)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "duckdb: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let ctx = SessionContext::new();
    let df = ctx
        .read_parquet(out.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    rows_of(&df.collect().await.unwrap())
}

/// `files` as a DuckDB list body: `'a', 'b'`.
pub fn quoted(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| format!("'{}'", f.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The files each manifest of the local sink `sink_dir` names, in batch
/// order: (batch, a complete snapshot, its files).
pub async fn manifest_files(sink_dir: &Path, name: &str) -> Vec<(u64, bool, Vec<PathBuf>)> {
    let sink = ParquetSink::new(Arc::new(LocalStore::new(sink_dir.to_path_buf())), name);
    sink.manifests()
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            let files = m.files.into_iter().map(|f| sink_dir.join(f.key)).collect();
            (m.batch, m.complete, files)
        })
        .collect()
}

/// The committed rows of a local sink as DuckDB reads exactly the files
/// its manifests name (`options`: more `read_parquet` settings, such as
/// `, union_by_name = true`); none when nothing was committed.
pub async fn manifest_rows(sink_dir: &Path, name: &str, cols: &str, options: &str) -> Vec<String> {
    let files: Vec<PathBuf> = manifest_files(sink_dir, name)
        .await
        .into_iter()
        .flat_map(|(_, _, f)| f)
        .collect();
    if files.is_empty() {
        return Vec::new();
    }
    duckdb_sql(&format!(
        "SELECT {cols} FROM read_parquet([{}], hive_partitioning = false{options})",
        quoted(&files)
    ))
    .await
}

/// What `sluice check` refuses the pipeline `toml` under `root` with.
pub async fn check_error(root: &Path, toml: &str) -> String {
    sluice_engine::admin::check(&local_context(&pipeline(root, toml)))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

/// Check metric `lines` against the EMF specification with
/// `tests/e2e/emf.py` (written to `dir/emf.jsonl`); its output (the
/// count of lines it checked).
pub fn check_emf(dir: &Path, lines: &[String]) -> String {
    let path = dir.join("emf.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = std::process::Command::new(python())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/emf.py"))
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "emf.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Executions that start nothing: the test runs the execution a trigger
/// started itself (twice, for a duplicated Express execution).
pub struct Started;

#[async_trait::async_trait]
impl sluice_engine::triggers::Executions for Started {
    fn express(&self) -> bool {
        true
    }
    async fn start(
        &self,
        name: &str,
        _input: &serde_json::Value,
        _workflow: sluice_engine::deploy::Workflow,
    ) -> sluice_engine::Result<sluice_engine::triggers::Started> {
        Ok(sluice_engine::triggers::Started {
            execution: name.into(),
            new: true,
        })
    }
    async fn state(
        &self,
        _name: &str,
    ) -> sluice_engine::Result<sluice_engine::triggers::ExecutionState> {
        Ok(sluice_engine::triggers::ExecutionState::Running)
    }
    async fn stop(&self, _name: &str, _cause: &str) -> sluice_engine::Result<()> {
        Ok(())
    }
}

/// Claim the lease as a trigger does for an Express execution: the input
/// that execution (and any duplicate of it) runs with.
pub async fn claim_express(ctx: &Context) -> serde_json::Value {
    use sluice_engine::triggers::{self, WakeOutcome};
    let name = ctx.pipeline.name.clone();
    // A trigger wakes registered pipelines.
    sluice_engine::admin::register(ctx).await.unwrap();
    let woken = triggers::wake(
        &ctx.checkpoint,
        &name,
        &ctx.pipeline.spec_hash(),
        chrono::Utc::now().timestamp_millis(),
        ctx.pipeline.limits.lease_ttl_seconds as i64 * 1000,
        &Started,
        "test",
        sluice_engine::deploy::Workflow::Express,
        &|_, _| {},
    )
    .await
    .unwrap();
    let WakeOutcome::Started { epoch, .. } = woken else {
        panic!("the trigger did not start a run: {woken:?}");
    };
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert!(
        c.owner.as_deref().unwrap().starts_with("sfn-express:"),
        "{:?}",
        c.owner
    );
    triggers::execution_input(&name, epoch, "test")
}
