//! `notify` discovery: runs plan from the inbox the triggers fill, without
//! listing the source; duplicate notifications never process a key twice;
//! a reconciliation listing every `reconcile_every` runs (or on request)
//! finds files whose notification was lost; and failing any write of such
//! a run, then running again, gives the clean output.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_engine::checkpoint::RunStatus;
use sluice_engine::discovery;
use sluice_engine::handlers::Context;
use sluice_engine::storage::{LocalStore, MemoryStore, Store};
use sluice_engine::triggers::{self, WakeOutcome};

use crate::support::*;

const NOTIFY: &str = "discovery = \"notify\"\nreconcile_every = 3";

async fn inbox(ctx: &Context) -> Vec<String> {
    discovery::read_inbox(ctx.checkpoint.store().as_ref())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect()
}

fn files_of(s: &sluice_engine::runner::RunSummary) -> u64 {
    s.batches.iter().map(|b| b.files).sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn notify_mode_plans_from_the_inbox_and_reconciles_every_k_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let sink = root.join("out/sink");
    let first = gen_files(&input, 4, 50);
    let p = pipeline(
        root,
        &pipeline_toml("ntf", "parquet", NOTIFY, "max_files_per_batch = 2"),
    );
    let mut ctx = local_context(&p);
    let store = ctx.checkpoint.store().clone();

    // Three notifications arrive; the fourth was lost. The first run
    // reconciles (lists the source once) and takes all four.
    discovery::record_notified(&store, notified(&first[..3], &input))
        .await
        .unwrap();
    let s1 = run(&ctx).await.unwrap();
    assert_eq!(files_of(&s1), 4);
    assert_eq!(
        ctx.source.counts().list,
        1,
        "one source listing per reconciliation"
    );
    assert_eq!(
        committed_rows(&sink, "ntf").await,
        one_shot_rows(&input).await
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(c.reconciled_epoch, Some(1));
    assert_eq!(inbox(&ctx).await, Vec::<String>::new());

    // Notified files are planned without listing the source. The reader
    // does not trust a notification's size (here stale: the key was written
    // again since; in a local folder, as if still being written, so the file
    // is left for the next run, notified again with its size), and a file
    // deleted after its notification is skipped.
    let second = gen_files(&input, 2, 50);
    let mut stale = notified(&second, &input);
    stale[1].1 = 1;
    stale.push(("gone/trips-deleted.parquet".into(), 1000));
    discovery::record_notified(&store, stale).await.unwrap();
    let before = ctx.source.counts();
    let s2 = run(&ctx).await.unwrap();
    assert_eq!(files_of(&s2), 2, "a file and the deleted one's claim");
    assert_eq!(
        ctx.source.counts().since(&before).list,
        0,
        "a notify run listed the source without a reconciliation due"
    );
    let mut all = first.clone();
    all.push(second[0].clone());
    assert_eq!(
        committed_rows(&sink, "ntf").await,
        duckdb_rows(&all, SQL).await
    );
    all.push(second[1].clone());

    // Duplicate notifications of committed keys (one of them with another
    // size, as a re-upload would give) are consumed without processing, and
    // the file left for this run is read whole; a file whose notification
    // is lost waits for the next reconciliation.
    discovery::record_notified(&store, notified(&first[..2], &input))
        .await
        .unwrap();
    let (key, _) = notified(&second[..1], &input).remove(0);
    discovery::record_notified(&store, vec![(key, 1)])
        .await
        .unwrap();
    let lost = gen_files(&input, 1, 50);
    let s3 = run(&ctx).await.unwrap();
    assert_eq!(files_of(&s3), 1, "duplicates were processed: {s3:?}");
    assert_eq!(inbox(&ctx).await, Vec::<String>::new());
    assert_eq!(
        committed_rows(&sink, "ntf").await,
        duckdb_rows(&all, SQL).await
    );

    // Epoch 4 = reconciled epoch 1 + 3: this run lists the source.
    let s4 = run(&ctx).await.unwrap();
    assert_eq!(files_of(&s4), 1, "the lost file: {lost:?}");
    assert_eq!(
        committed_rows(&sink, "ntf").await,
        one_shot_rows(&input).await
    );

    // `sluice run --reconcile` lists at once.
    gen_files(&input, 1, 50);
    assert_eq!(run(&ctx).await.unwrap().batches.len(), 0, "not due yet");
    ctx.reconcile = true;
    assert_eq!(files_of(&run(&ctx).await.unwrap()), 1);
    assert_eq!(
        committed_rows(&sink, "ntf").await,
        one_shot_rows(&input).await
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!((c.totals.files, c.status), (9, RunStatus::Idle));
}

fn faulty_notify(root: &Path, writes: Arc<AtomicU64>, fail_at: u64) -> Context {
    let limits = "max_files_per_batch = 2\nmax_batches_per_execution = 1";
    let toml = pipeline_toml("nfc", "parquet", NOTIFY, limits);
    fault_context(root, &toml, writes, fail_at)
}

/// Five files: four notified (one of them twice), one found by the first
/// run's reconciliation; three batches, one per execution (so each
/// discovery claims one slice of the inbox and asks for another look).
async fn notify_scenario(root: &Path) {
    let input = root.join("input");
    let files = gen_files(&input, 5, 40);
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(root.join("out/checkpoint/nfc")));
    let mut objects = notified(&files[..4], &input);
    objects.push(objects[0].clone());
    discovery::record_notified(&store, objects).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_of_a_notify_run_then_rerunning_gives_the_clean_output() {
    let clean = tempfile::tempdir().unwrap();
    notify_scenario(clean.path()).await;
    let writes = Arc::new(AtomicU64::new(0));
    let summary = run(&faulty_notify(clean.path(), writes.clone(), 0))
        .await
        .unwrap();
    assert_eq!(summary.batches.len(), 3, "the scenario needs three batches");
    let total = writes.load(Ordering::SeqCst);
    let sink = |d: &Path| d.join("out/sink");
    let expected = committed_rows(&sink(clean.path()), "nfc").await;
    assert_eq!(expected, one_shot_rows(&clean.path().join("input")).await);
    eprintln!("notify crash test: failing each of {total} writes in turn");

    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        notify_scenario(dir.path()).await;
        let failed = run(&faulty_notify(dir.path(), Arc::new(AtomicU64::new(0)), k)).await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let ctx = faulty_notify(dir.path(), Arc::new(AtomicU64::new(0)), 0);
        let again = run(&ctx)
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        assert_recovered(dir.path(), "nfc", &again.end, &expected, k).await;
        let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
        assert_eq!(
            (c.status, c.last_committed, c.totals.files),
            (RunStatus::Idle, Some(2), 5),
            "after failing write {k}"
        );
        assert_eq!(inbox(&ctx).await, Vec::<String>::new(), "after write {k}");
        // Every key holds a committed claim: a late duplicate is refused.
        let claims = ctx
            .checkpoint
            .store()
            .list("index/keys/", None)
            .await
            .unwrap();
        assert_eq!(claims.len(), 5, "after write {k}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_stalls_before_claiming_cannot_process_keys_another_run_committed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let files = gen_files(&input, 2, 50);
    let toml = pipeline_toml("zmb", "parquet", NOTIFY, "");
    let writes = || Arc::new(AtomicU64::new(0));
    let b = fault_context(root, &toml, writes(), 0);
    discovery::record_notified(b.checkpoint.store(), notified(&files, &input))
        .await
        .unwrap();

    // Run A takes the lease, lists the inbox and stalls at its first claim.
    let gate = Gate::new("index/keys/");
    let a = gated_context(root, &toml, writes(), 0, Some(gate.clone()));
    let a_run = tokio::spawn(async move { run(&a).await });
    gate.reached.notified().await;

    // Run B takes over (A looks dead) and commits both files.
    let sb = run(&b).await.unwrap();
    assert_eq!(files_of(&sb), 2);
    let sink = root.join("out/sink");
    let committed = committed_rows(&sink, "zmb").await;
    assert_eq!(committed, one_shot_rows(&input).await);

    // A wakes up: the claims say committed, so it plans nothing, and it
    // cannot release a lease it lost.
    gate.release.notify_one();
    let err = a_run.await.unwrap().unwrap_err();
    assert_eq!(err.class(), sluice_engine::ErrorClass::Conflict, "{err}");
    assert_eq!(committed_rows(&sink, "zmb").await, committed);
    assert_eq!(orphan_files(&sink, "zmb").await, Vec::<String>::new());
    assert_eq!(inbox(&b).await, Vec::<String>::new());
    // Late duplicates of both notifications: still nothing to process.
    discovery::record_notified(b.checkpoint.store(), notified(&files, &input))
        .await
        .unwrap();
    let after = run(&b).await.unwrap();
    assert_eq!(after.batches.len(), 0, "{after:?}");
    assert_eq!(committed_rows(&sink, "zmb").await, committed);
    let (c, _) = b.checkpoint.control().await.unwrap().unwrap();
    assert_eq!((c.totals.files, c.status), (2, RunStatus::Idle));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_is_claimed_one_execution_at_a_time() {
    use sluice_engine::handlers::{self, PlanOutcome};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let files = gen_files(&input, 5, 30);
    let limits = "max_files_per_batch = 1\nmax_batches_per_execution = 2";
    let p = pipeline(root, &pipeline_toml("blg", "parquet", NOTIFY, limits));
    let ctx = local_context(&p);
    discovery::record_notified(ctx.checkpoint.store(), notified(&files, &input))
        .await
        .unwrap();
    let claims = || async {
        let keys = ctx.checkpoint.store().list("index/keys/", None).await;
        keys.unwrap().len()
    };

    // The first Plan claims what one execution commits (2 batches of 1),
    // and asks for another look at the end of the run.
    let PlanOutcome::Batch { batch, .. } = handlers::plan(&ctx, None).await.unwrap() else {
        panic!("a batch");
    };
    assert_eq!(batch.files, 1);
    assert_eq!(claims().await, 2);
    assert_eq!(inbox(&ctx).await.len(), 5);
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert!(c.requested, "{c:?}");

    // Carried on (a new process takes the lease over): everything, once.
    let summary = run(&local_context(&p)).await.unwrap();
    assert_eq!(files_of(&summary), 5);
    assert_eq!(
        committed_rows(&root.join("out/sink"), "blg").await,
        one_shot_rows(&input).await
    );
    assert_eq!((claims().await, inbox(&ctx).await.len()), (5, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trigger_records_s3_notifications_in_the_inbox_of_a_notify_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "name = \"taxi\"\n[source]\nuri = \"s3://sluice-demo-landing/taxi/in/\"\nformat = \
         \"parquet\"\ntable = \"trips\"\ndiscovery = \"notify\"\n[query]\nsql = '''{SQL}'''\n\
         [sink]\nuri = \"out/sink\"\n[checkpoint]\nuri = \"out/checkpoint\"\n"
    );
    let p = sluice_engine::pipeline::Pipeline::parse(&toml, "taxi.toml", dir.path()).unwrap();
    let checkpoint: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let ctx = Context::new(
        p,
        Arc::new(MemoryStore::new()),
        Arc::new(MemoryStore::new()),
        checkpoint.clone(),
    );
    let payload = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../events/s3-object-created.json"),
    )
    .unwrap();
    let event = triggers::parse_event(&payload).unwrap();
    let execs = NoExecutions;
    for attempt in 0..2 {
        let report = triggers::trigger(&event, std::slice::from_ref(&ctx), &execs)
            .await
            .unwrap();
        let expected = if attempt == 0 { "started" } else { "requested" };
        let got = match report.woken["taxi"] {
            WakeOutcome::Started { .. } => "started",
            WakeOutcome::Requested { .. } => "requested",
            WakeOutcome::Held => "held",
        };
        assert_eq!(got, expected, "delivery {attempt}");
        // At-least-once delivery: the second one rewrites the same entries.
        let mut entries: Vec<(String, u64)> = discovery::read_inbox(checkpoint.as_ref())
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.key, e.size))
            .collect();
        entries.sort();
        assert_eq!(
            entries,
            vec![
                (
                    "date=2026-11-30/trips été #2 (copy).parquet".to_string(),
                    48811
                ),
                ("date=2026-11-30/trips-000007.parquet".to_string(), 51234),
            ],
            "delivery {attempt}"
        );
    }
}

/// Executions that start (by name, idempotently) and always run.
struct NoExecutions;

#[async_trait::async_trait]
impl triggers::Executions for NoExecutions {
    async fn start(
        &self,
        name: &str,
        _input: &serde_json::Value,
        _workflow: sluice_engine::deploy::Workflow,
    ) -> sluice_engine::Result<triggers::Started> {
        Ok(triggers::Started {
            execution: format!("local:{name}"),
            new: true,
        })
    }
    async fn state(&self, _name: &str) -> sluice_engine::Result<triggers::ExecutionState> {
        Ok(triggers::ExecutionState::Running)
    }
    async fn stop(&self, _name: &str, _cause: &str) -> sluice_engine::Result<()> {
        Ok(())
    }
}

/// The review's case: a 190-character key made the base64 inbox entry's
/// local file name too long; every reconciliation failed and the file was
/// never processed. Entries and claims work for any key length S3 allows:
/// a 190-character name and an 805-byte key, notified, then duplicated.
#[tokio::test(flavor = "multi_thread")]
async fn keys_too_long_to_name_an_entry_are_notified_claimed_and_processed_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let made = gen_files(&input, 2, 60);
    let long_name = input.join(format!("{}.parquet", "n".repeat(182)));
    let deep = input.join(format!("{}x.parquet", "d/".repeat(400)));
    std::fs::create_dir_all(deep.parent().unwrap()).unwrap();
    std::fs::rename(&made[0], &long_name).unwrap();
    std::fs::rename(&made[1], &deep).unwrap();
    let files = vec![long_name.clone(), deep.clone()];
    let rel = |p: &Path| {
        p.strip_prefix(&input)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    };
    let objects: Vec<(String, u64)> = files
        .iter()
        .map(|f| (rel(f), std::fs::metadata(f).unwrap().len()))
        .collect();
    assert!(objects[1].0.len() > 800);

    let toml = pipeline_toml("lng", "parquet", NOTIFY, "max_files_per_batch = 1");
    let ctx = local_context(&pipeline(root, &toml));
    let store = ctx.checkpoint.store().clone();
    discovery::record_notified(&store, objects.clone())
        .await
        .unwrap();
    let mut listed = inbox(&ctx).await;
    listed.sort();
    let mut want: Vec<String> = objects.iter().map(|(k, _)| k.clone()).collect();
    want.sort();
    assert_eq!(listed, want);

    let s = run(&ctx).await.unwrap();
    assert_eq!(files_of(&s), 2);
    // A duplicate notification of both is consumed without processing.
    discovery::record_notified(&store, objects).await.unwrap();
    let again = run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(files_of(&again), 0);
    assert!(inbox(&ctx).await.is_empty());
    // A reconciliation finds nothing unclaimed.
    let mut asked = local_context(&pipeline(root, &toml));
    asked.reconcile = true;
    let reconciled = run(&asked).await.unwrap();
    assert_eq!(files_of(&reconciled), 0);
    assert_eq!(
        committed_rows(&root.join("out/sink"), "lng").await,
        duckdb_rows(&files, SQL).await
    );
}
