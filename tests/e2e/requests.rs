//! The storage requests a run makes, request by request: what the
//! checkpoint protocol needs and nothing more. S3 bills PUT, COPY and LIST
//! at $0.005 per 1,000 and GET at $0.0004, so on the one-file runs a
//! pipeline fed every few minutes makes, these requests are most of what a
//! run costs. The expected lists are written out by hand from the
//! protocol (docs/architecture.md), not taken from a run.

use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sluice_engine::error::StoreError;
use sluice_engine::handlers::Context;
use sluice_engine::storage::{
    LocalStore, Object, ObjectMeta, PutMode, PutOutcome, RequestCounts, ScanAccess, Store,
};

use crate::support::*;
use crate::support::{Hooked, WriteHook};

/// A store that logs every request as `"<KIND> <key or prefix>"`.
#[derive(Debug)]
struct Logged {
    inner: Arc<dyn Store>,
    /// Where this store is (`source`, `sink`, `checkpoint`): the log's
    /// key prefix.
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
}

impl Logged {
    fn note(&self, kind: &str, key: &str) {
        let line = format!("{kind} {}/{key}", self.name);
        self.log.lock().unwrap().push(line);
    }
}

#[async_trait::async_trait]
impl Store for Logged {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.note("GET", key);
        self.inner.get(key).await
    }
    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<PutOutcome, StoreError> {
        self.note("PUT", key);
        self.inner.put(key, bytes, mode).await
    }
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, StoreError> {
        self.note("LIST", prefix);
        self.inner.list(prefix, start_after).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.note("DELETE", key);
        self.inner.delete(key).await
    }
    async fn delete_if(&self, key: &str, etag: &str) -> Result<bool, StoreError> {
        self.note("DELETE", key);
        self.inner.delete_if(key, etag).await
    }
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        self.note("HEAD", key);
        self.inner.head(key).await
    }
    async fn copy(&self, from: &str, to: &str) -> Result<bool, StoreError> {
        self.note("COPY", to);
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

/// A context over `root`'s folders whose every request is logged in `log`.
fn logged_context(root: &Path, toml: &str, log: &Arc<Mutex<Vec<String>>>) -> Context {
    let p = pipeline(root, toml);
    let wrap = |name: &'static str, path: std::path::PathBuf| -> Arc<dyn Store> {
        Arc::new(Logged {
            inner: Arc::new(LocalStore::new(path)),
            name,
            log: log.clone(),
        })
    };
    let checkpoint = root.join("out/checkpoint").join(&p.name);
    let mut ctx = Context::new(
        p,
        wrap("source", root.join("input")),
        wrap("sink", root.join("out/sink")),
        wrap("checkpoint", checkpoint),
    );
    test_mode(&mut ctx);
    ctx
}

/// The requests S3 bills at the PUT price (PUT, COPY, LIST), in order.
fn put_class(log: &[String]) -> Vec<String> {
    log.iter()
        .filter(|l| l.starts_with("PUT ") || l.starts_with("COPY ") || l.starts_with("LIST "))
        .cloned()
        .collect()
}

/// Add one taxi file to `root/input` under a name that sorts after the
/// ones before it (`ordered` discovery).
fn add_file(root: &Path, n: u64) {
    let tmp = root.join(format!("gen{n}"));
    let made = gen_files(&tmp, 1, 200);
    std::fs::create_dir_all(root.join("input")).unwrap();
    std::fs::rename(&made[0], root.join(format!("input/f-{n:04}.parquet"))).unwrap();
}

fn ordered_toml(limits: &str) -> String {
    pipeline_toml(
        "req",
        "parquet",
        "discovery = \"ordered\"\nlookback = 10",
        limits,
    )
}

/// The committed output under `root/out/sink` of pipeline `name` equals
/// DuckDB's answer to [`SQL`] over every file in `root/input` (multisets).
async fn assert_output_is_duckdbs(root: &Path, name: &str) {
    let inputs: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("input"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let mut want = duckdb_rows(&inputs, SQL).await;
    want.sort();
    let mut got = committed_rows(&root.join("out/sink"), name).await;
    got.sort();
    assert_eq!(got.len(), want.len(), "rows of {name}");
    assert_eq!(got, want, "rows of {name}");
}

/// A run that finds one new file, in a pipeline that committed before:
/// the PUT-class requests are the protocol's own, in its order. Before
/// this was measured, such a run also listed the task's staged parts
/// (to remove an earlier attempt's, on a first attempt), staging twice,
/// the batch's sink folder (empty: its record had just been written) and
/// its work folder, advanced the index in its own object, wrote the task's
/// result for the commit to read, and ended with a Plan that gave the lease
/// back in a write of its own: 17 of them instead of 9 (and one Lambda
/// invocation fewer); the staging listing that checked the output is a
/// HEAD now.
#[tokio::test(flavor = "multi_thread")]
async fn a_one_file_run_makes_only_the_requests_the_protocol_needs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = ordered_toml("max_files_per_batch = 4");
    let log = Arc::new(Mutex::new(Vec::new()));
    add_file(root, 0);
    let first = run(&logged_context(root, &toml, &log)).await.unwrap();
    assert_eq!(first.batches.len(), 1, "{first:?}");
    add_file(root, 1);
    log.lock().unwrap().clear();
    let second = run(&logged_context(root, &toml, &log)).await.unwrap();
    assert_eq!(second.batches.len(), 1, "{second:?}");
    let log = log.lock().unwrap().clone();
    let want: Vec<String> = [
        // Discovery: one listing after the cursor.
        "LIST source/",
        // The lease, then the batch's plan, create-only.
        "PUT checkpoint/control.json",
        "PUT checkpoint/offsets/0000000001.json",
        // The task: its part, staged (its result travels back in the
        // state machine's payload to the commit).
        "PUT sink/_sluice/staging/batch=0000000001/part-00000-00000-e2.parquet.staged",
        // The commit: check the staged output (a HEAD, billed as a GET),
        // stage the manifest, write the record, publish both, then record
        // it in control (with the index of processed inputs: ordered
        // discovery's lookback window).
        "PUT sink/_sluice/staging/batch=0000000001/manifest-e2.json",
        "PUT checkpoint/commits/0000000001.json",
        "COPY sink/batch=0000000001/part-00000-00000-e2.parquet",
        "COPY sink/_sluice/manifest/0000000001.json",
        // The run's last batch: the same write ends the run (the lease
        // given back) and the Express execution ends after it, with no
        // Plan.
        "PUT checkpoint/control.json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(put_class(&log), want, "every request: {log:#?}");
    // What the commit staged is removed by name; no task result was
    // written or read.
    for gone in [
        "DELETE sink/_sluice/staging/batch=0000000001/part-00000-00000-e2.parquet.staged",
        "DELETE sink/_sluice/staging/batch=0000000001/manifest-e2.json",
    ] {
        assert!(log.iter().any(|l| l == gone), "no {gone}: {log:#?}");
    }
    assert!(
        !log.iter().any(|l| l.contains("checkpoint/work/")),
        "work files: {log:#?}"
    );
    assert!(
        log.iter().any(|l| l
            == "HEAD sink/_sluice/staging/batch=0000000001/part-00000-00000-e2.parquet.staged"),
        "the output checked: {log:#?}"
    );
    assert_eq!(staged_files(&root.join("out/sink")), Vec::<String>::new());
    assert!(
        !root.join("out/checkpoint/req/work/0000000001").exists()
            || std::fs::read_dir(root.join("out/checkpoint/req/work/0000000001"))
                .unwrap()
                .next()
                .is_none(),
        "work files left"
    );
}

/// Once `retain_batches` records are kept, each commit prunes the batch
/// that fell below the floor by name: no listing of `offsets/` and
/// `commits/` on every commit (two LIST requests a run, for ever, before).
/// The records kept are exactly the last `retain_batches`.
#[tokio::test(flavor = "multi_thread")]
async fn steady_state_pruning_lists_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = ordered_toml("max_files_per_batch = 4").replace(
        "uri = \"out/checkpoint\"",
        "uri = \"out/checkpoint\"\nretain_batches = 2",
    );
    assert!(toml.contains("retain_batches = 2"), "{toml}");
    let log = Arc::new(Mutex::new(Vec::new()));
    for n in 0..5 {
        add_file(root, n);
        log.lock().unwrap().clear();
        let s = run(&logged_context(root, &toml, &log)).await.unwrap();
        assert_eq!(s.batches.len(), 1, "run {n}: {s:?}");
        let log = log.lock().unwrap().clone();
        assert!(
            !log.iter()
                .any(|l| l == "LIST checkpoint/offsets/" || l == "LIST checkpoint/commits/"),
            "run {n} listed the records: {log:#?}"
        );
    }
    let names = |sub: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(root.join("out/checkpoint/req").join(sub))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let kept = vec!["0000000003.json".to_string(), "0000000004.json".to_string()];
    assert_eq!(names("offsets"), kept);
    assert_eq!(names("commits"), kept);
}

/// What commits by name cannot see (a dead run's work files and staged
/// parts of a batch since committed, a record a crash kept from pruning)
/// goes at the next sweep: every 64th batch lists work, staging and the
/// records, and removes them; the batches before it leave them alone.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_every_64_batches_removes_what_dead_runs_left() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = pipeline_toml(
        "sweep",
        "parquet",
        "discovery = \"ordered\"\nlookback = 10",
        "max_files_per_batch = 1",
    )
    .replace(
        "uri = \"out/checkpoint\"",
        "uri = \"out/checkpoint\"\nretain_batches = 100",
    );
    std::fs::create_dir_all(root.join("input")).unwrap();
    for n in 0..60 {
        add_file(root, n);
    }
    let ctx = local_context(&pipeline(root, &toml));
    let s = run(&ctx).await.unwrap();
    assert_eq!(s.batches.len(), 60, "{s:?}");
    // Left by a run of epoch 1 that died working on batch 3, and by one
    // that staged a part of batch 5 and lost its lease.
    let ck = root.join("out/checkpoint/sweep");
    let dead_work = ck.join("work/0000000003/task-00000-e1.json");
    std::fs::create_dir_all(dead_work.parent().unwrap()).unwrap();
    std::fs::write(&dead_work, b"{}").unwrap();
    let dead_part =
        root.join("out/sink/_sluice/staging/batch=0000000005/part-00000-00000-e1.parquet.staged");
    std::fs::create_dir_all(dead_part.parent().unwrap()).unwrap();
    std::fs::write(&dead_part, b"x").unwrap();
    // Batches 60 to 63: nothing lists work or staging (their commits
    // name their own files, and check their one output with a HEAD).
    for n in 60..64 {
        add_file(root, n);
    }
    let s = run(&ctx).await.unwrap();
    assert_eq!(s.batches.len(), 4, "{s:?}");
    assert!(
        dead_work.exists(),
        "work of batch 3 removed before the sweep"
    );
    assert!(dead_part.exists(), "staging listed before the sweep");
    // Batch 64 sweeps.
    add_file(root, 64);
    let s = run(&ctx).await.unwrap();
    assert_eq!(s.batches.len(), 1, "{s:?}");
    assert!(
        !dead_work.exists(),
        "the sweep at batch 64 left {dead_work:?}"
    );
    assert!(
        !dead_part.exists(),
        "the sweep at batch 64 left {dead_part:?}"
    );
    assert_eq!(staged_files(&root.join("out/sink")), Vec::<String>::new());
    // The output is every input row once (DuckDB over the inputs).
    assert_output_is_duckdbs(root, "sweep").await;
}

/// A checkpoint an older release wrote keeps an `ordered` pipeline's
/// index in `index/processed.json`: the next commit moves it into control
/// and removes the object, and no processed file is read again.
#[tokio::test(flavor = "multi_thread")]
async fn an_ordered_index_of_an_older_release_moves_into_control() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = ordered_toml("max_files_per_batch = 4");
    for n in 0..3 {
        add_file(root, n);
    }
    let ctx = local_context(&pipeline(root, &toml));
    assert_eq!(run(&ctx).await.unwrap().batches.len(), 1);
    // As the older release left it: the index in its own object, none in
    // control.
    let ck = root.join("out/checkpoint/req");
    let mut control: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("control.json")).unwrap()).unwrap();
    let index = control["index"].take();
    assert_eq!(index["keys"].as_array().unwrap().len(), 3, "{index}");
    control.as_object_mut().unwrap().remove("index");
    std::fs::write(
        ck.join("control.json"),
        serde_json::to_vec_pretty(&control).unwrap(),
    )
    .unwrap();
    std::fs::create_dir_all(ck.join("index")).unwrap();
    std::fs::write(
        ck.join("index/processed.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
    add_file(root, 3);
    let s = run(&ctx).await.unwrap();
    assert_eq!(s.batches.len(), 1, "{s:?}");
    assert_eq!(s.batches[0].files, 1, "{s:?}");
    let c = control_of(root, &toml).await;
    let moved = c.index.expect("control holds the index");
    assert_eq!(moved.through_batch, Some(1));
    assert_eq!(moved.keys.len(), 4, "{moved:?}");
    assert!(!ck.join("index/processed.json").exists());
    assert_output_is_duckdbs(root, "req").await;
}

/// A task's result travels in the payload only while it fits its share of
/// the 64 KB the batch's results may add to it (Step Functions caps a
/// payload at 256 KB): a task writing a part per pickup zone (hundreds of
/// output files) leaves its result in the checkpoint, and the commit reads
/// it there. The output is the same either way (DuckDB).
#[tokio::test(flavor = "multi_thread")]
async fn a_large_task_result_is_left_in_the_checkpoint_not_the_payload() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = pipeline_toml("req", "parquet", "", "max_bytes_per_task = 1").replace(
        "[sink]\nuri = \"out/sink\"",
        "[sink]\nuri = \"out/sink\"\npartition_by = [\"PULocationID\"]",
    );
    assert!(toml.contains("partition_by"), "{toml}");
    // Eight tasks (8 KB each), each result about 12 KB.
    for n in 0..8 {
        add_file(root, n);
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let s = run(&logged_context(root, &toml, &log)).await.unwrap();
    assert_eq!(s.batches.len(), 1, "{s:?}");
    let log = log.lock().unwrap().clone();
    let written: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("PUT checkpoint/work/0000000000/task-"))
        .collect();
    assert_eq!(written.len(), 8, "each task's result written: {log:#?}");
    let parts = std::fs::read_dir(root.join("out/sink/batch=0000000000"))
        .unwrap()
        .count();
    assert!(parts > 100, "{parts} zone folders");
    assert_output_is_duckdbs(root, "req").await;
}

/// Asks a running run to look again, as a trigger does (`requested` set
/// by compare-and-swap), and lands a new file, just before the commit
/// record of batch `at` is written.
#[derive(Debug)]
struct AskAgain {
    at: String,
    control: Arc<dyn Store>,
    input: std::path::PathBuf,
    done: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl WriteHook for AskAgain {
    async fn before(&self, op: &'static str, key: &str) -> Result<(), StoreError> {
        if op != "put"
            || key != self.at
            || self.done.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        let made = gen_files(&self.input.join("../late"), 1, 200);
        std::fs::rename(&made[0], self.input.join("f-9999.parquet")).unwrap();
        let obj = self.control.get("control.json").await?.unwrap();
        let mut c: serde_json::Value = serde_json::from_slice(&obj.bytes).unwrap();
        c["requested"] = true.into();
        let put = self
            .control
            .put(
                "control.json",
                Bytes::from(serde_json::to_vec(&c).unwrap()),
                PutMode::Update(obj.etag),
            )
            .await?;
        assert!(matches!(put, PutOutcome::Written(_)), "{put:?}");
        Ok(())
    }
}

/// The commit of a run's last batch ends the run in the write that records
/// it, unless a trigger asked again meanwhile: then it keeps the lease, the
/// Plan after it discovers once more, and the file that landed is
/// committed by the same run (before, its Plan's release did the same; a
/// commit that released regardless would have left the file waiting for
/// another trigger).
#[tokio::test(flavor = "multi_thread")]
async fn a_trigger_during_the_last_commit_keeps_the_run_going() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = ordered_toml("max_files_per_batch = 4");
    add_file(root, 0);
    let p = pipeline(root, &toml);
    let checkpoint: Arc<dyn Store> =
        Arc::new(LocalStore::new(root.join("out/checkpoint").join(&p.name)));
    let hooked: Arc<dyn Store> = Arc::new(Hooked {
        inner: checkpoint.clone(),
        hook: AskAgain {
            at: "commits/0000000000.json".into(),
            control: checkpoint,
            input: root.join("input"),
            done: false.into(),
        },
    });
    let mut ctx = Context::new(
        p,
        Arc::new(LocalStore::new(root.join("input"))),
        Arc::new(LocalStore::new(root.join("out/sink"))),
        hooked,
    );
    test_mode(&mut ctx);
    let s = run(&ctx).await.unwrap();
    assert_eq!(s.executions, 1, "{s:?}");
    assert_eq!(
        s.batches.iter().map(|b| b.files).collect::<Vec<_>>(),
        vec![1, 1],
        "{s:?}"
    );
    let c = control_of(root, &toml).await;
    assert!(!c.requested, "{c:?}");
    assert_eq!(c.status, sluice_engine::checkpoint::RunStatus::Idle);
    // The second batch's commit ended the run; the first's could not.
    assert_eq!(c.totals.runs, 1, "{:?}", c.totals);
    assert_eq!(c.totals.plan_ends, 0, "{:?}", c.totals);
    assert_eq!(std::fs::read_dir(root.join("input")).unwrap().count(), 2);
    assert_output_is_duckdbs(root, "req").await;
}

/// The review's case: a crash between the commit that moved an ordered
/// index into control and the removal of `index/processed.json` left the
/// object behind; with `lookback` then raised past 1,000 (the index moves
/// out of control again) every run failed with "index/processed.json
/// changed while this run advanced it" and new files were never taken.
/// Control's index supersedes the leftover, which is replaced.
#[tokio::test(flavor = "multi_thread")]
async fn a_leftover_index_object_does_not_stop_the_index_moving_out_of_control() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = ordered_toml("max_files_per_batch = 4");
    for n in 0..3 {
        add_file(root, n);
    }
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    // What the crash left: the index as it was, in its own object too.
    let ck = root.join("out/checkpoint/req");
    let control: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("control.json")).unwrap()).unwrap();
    std::fs::create_dir_all(ck.join("index")).unwrap();
    std::fs::write(
        ck.join("index/processed.json"),
        serde_json::to_vec_pretty(&control["index"]).unwrap(),
    )
    .unwrap();
    add_file(root, 3);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let raised = toml.replace("lookback = 10", "lookback = 2000");
    assert_ne!(raised, toml);
    for n in 4..6 {
        add_file(root, n);
        let s = run(&local_context(&pipeline(root, &raised)))
            .await
            .unwrap_or_else(|e| panic!("run after file {n}: {e}"));
        assert_eq!(s.batches.len(), 1, "{s:?}");
        assert_eq!(s.batches[0].files, 1, "{s:?}");
    }
    let c = control_of(root, &raised).await;
    assert!(c.index.is_none(), "{c:?}");
    assert_output_is_duckdbs(root, "req").await;
}
