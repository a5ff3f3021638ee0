//! A storm of triggers against S3 on a moto server (real conditional
//! writes): 100 uploads, each followed by its own trigger invocation, all
//! concurrent, while the runs they start execute in-process. Every
//! successful write of `control.json` is recorded: the lease never passes
//! from one run to another without being idle in between (at most one
//! holder at any moment), every file is committed in exactly one batch, and
//! far fewer executions start than events arrive. The same storm in
//! `notify` mode, every notification delivered twice (S3 delivers at least
//! once), the second up to 1.5 s later: still every file exactly once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::Value;
use sluice_engine::admin;
use sluice_engine::checkpoint::RunStatus;
use sluice_engine::deploy::Workflow;
use sluice_engine::handlers::Context;
use sluice_engine::pipeline::Pipeline;
use sluice_engine::runner;
use sluice_engine::storage::{PutMode, S3Config, S3Store, Store};
use sluice_engine::triggers::{
    self, Event, ExecutionState, Executions, ObjectRef, Started, Via, WakeOutcome,
};

use crate::support::*;

/// Executions run in-process, each on its own task, as Step Functions would
/// run them.
struct InProcess {
    ctx: Context,
    runs:
        Mutex<BTreeMap<String, tokio::task::JoinHandle<sluice_engine::Result<runner::RunSummary>>>>,
}

#[async_trait::async_trait]
impl Executions for InProcess {
    fn express(&self) -> bool {
        true
    }
    async fn start(
        &self,
        name: &str,
        input: &Value,
        workflow: Workflow,
    ) -> sluice_engine::Result<Started> {
        let mut runs = self.runs.lock().unwrap();
        if runs.contains_key(name) {
            return Ok(Started {
                execution: name.into(),
                new: false,
            });
        }
        let ctx = self.ctx.clone();
        let input = input.clone();
        runs.insert(
            name.to_string(),
            tokio::spawn(async move {
                crate::support::runner()
                    .starting(workflow)
                    .execute(&ctx, input, |_| {})
                    .await
            }),
        );
        Ok(Started {
            execution: name.into(),
            new: true,
        })
    }
    async fn state(&self, name: &str) -> sluice_engine::Result<ExecutionState> {
        Ok(match self.runs.lock().unwrap().get(name) {
            Some(h) if h.is_finished() => ExecutionState::Ended,
            Some(_) => ExecutionState::Running,
            None => ExecutionState::Missing,
        })
    }
    async fn stop(&self, _name: &str, _cause: &str) -> sluice_engine::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_concurrent_triggers_start_few_runs_and_commit_every_file_once() {
    storm("list", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_notify_storm_with_every_notification_delivered_twice_commits_every_file_once() {
    storm("notify", true).await;
}

async fn storm(discovery: &str, twice: bool) {
    let cfg = S3Config::from_env().await;
    let bucket = fresh_bucket(&cfg, "storm").await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let files = gen_files(&input, 100, 20);
    let toml = format!(
        r#"name = "storm"
[source]
uri = "s3://{bucket}/landing/"
format = "parquet"
table = "trips"
discovery = "{discovery}"
[query]
sql = '''{SQL}'''
[sink]
uri = "s3://{bucket}/out/"
[checkpoint]
uri = "s3://{bucket}/checkpoints/"
[limits]
max_batches_per_execution = 2
"#
    );
    let p = Pipeline::parse(&toml, "storm.toml", dir.path()).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let checkpoint: Arc<dyn Store> = Arc::new(ControlLog::wrap(
        Arc::new(S3Store::new(&cfg, &bucket, "checkpoints/storm")),
        log.clone(),
    ));
    let mut ctx = Context::new(
        p.clone(),
        Arc::new(S3Store::new(&cfg, &bucket, "landing")),
        Arc::new(S3Store::new(&cfg, &bucket, "out")),
        checkpoint,
    );
    ctx.owner_gone = Arc::new(|_| false);
    let source = Arc::new(S3Store::new(&cfg, &bucket, "landing"));
    let upload = |i: usize| {
        let f = &files[i];
        let key = f.file_name().unwrap().to_str().unwrap().to_string();
        let bytes = Bytes::from(std::fs::read(f).unwrap());
        let source = source.clone();
        async move {
            let size = bytes.len() as u64;
            source.put(&key, bytes, PutMode::Overwrite).await.unwrap();
            (format!("landing/{key}"), size)
        }
    };
    // Registration pins the schema from the first file.
    upload(0).await;
    admin::register(&ctx).await.unwrap();

    let executions = Arc::new(InProcess {
        ctx: ctx.clone(),
        runs: Mutex::new(BTreeMap::new()),
    });
    // 100 events, each an upload then its notification, in ten bursts of
    // ten 0.7 s apart, so they land before, during and between runs.
    let mut events = Vec::new();
    for i in 0..100 {
        let ctx = ctx.clone();
        let executions = executions.clone();
        let bucket = bucket.clone();
        let upload = upload(i);
        events.push(tokio::spawn(async move {
            let burst = (i as u64 / 10) * 700 + (i as u64 % 10) * 3;
            tokio::time::sleep(std::time::Duration::from_millis(burst)).await;
            let (key, size) = upload.await;
            let event = Event::Objects {
                via: Via::S3,
                objects: vec![ObjectRef {
                    bucket,
                    key,
                    size: Some(size),
                }],
                skipped: 0,
            };
            let ctxs = std::slice::from_ref(&ctx);
            let mut reports = vec![triggers::trigger(&event, ctxs, executions.as_ref()).await?];
            if twice {
                let later = (i as u64 * 37) % 1500;
                tokio::time::sleep(std::time::Duration::from_millis(later)).await;
                reports.push(triggers::trigger(&event, ctxs, executions.as_ref()).await?);
            }
            Ok::<_, sluice_engine::Error>(reports)
        }));
    }
    let mut outcomes = BTreeMap::<&str, u64>::new();
    for e in events {
        for report in e.await.unwrap().expect("every trigger succeeds") {
            let kind = match report.woken["storm"] {
                WakeOutcome::Started { .. } => "started",
                WakeOutcome::Requested { .. } => "requested",
                WakeOutcome::Held => "held",
            };
            *outcomes.entry(kind).or_default() += 1;
        }
    }
    // Let every started execution finish.
    loop {
        let pending: Vec<String> = {
            let runs = executions.runs.lock().unwrap();
            runs.iter()
                .filter(|(_, h)| !h.is_finished())
                .map(|(n, _)| n.clone())
                .collect()
        };
        if pending.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let runs: Vec<_> = std::mem::take(&mut *executions.runs.lock().unwrap())
        .into_values()
        .collect();
    let started = runs.len();
    for r in runs {
        r.await.unwrap().expect("every execution succeeds");
    }

    // At most one holder at any moment: the lease only ever passes from idle
    // to a new epoch, never from one run to another.
    let log = log.lock().unwrap().clone();
    assert!(log.len() >= 2 * started, "{} control writes", log.len());
    for w in log.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        assert!(b.epoch >= a.epoch, "epoch went back: {a:?} -> {b:?}");
        if b.epoch != a.epoch {
            assert_eq!(
                a.status,
                RunStatus::Idle,
                "epoch {} claimed while epoch {} held the lease",
                b.epoch,
                a.epoch
            );
        }
    }
    let last = log.last().unwrap();
    assert_eq!((last.status, last.requested), (RunStatus::Idle, false));

    // Every uploaded file in exactly one committed batch.
    let mut seen = BTreeMap::<String, u32>::new();
    let mut n = 0;
    while let Some(c) = ctx.checkpoint.commit(n).await.unwrap() {
        for k in c.input_keys {
            *seen.entry(k).or_default() += 1;
        }
        n += 1;
    }
    assert_eq!(seen.len(), 100, "files committed: {}", seen.len());
    assert!(seen.values().all(|c| *c == 1), "a file committed twice");
    if discovery == "notify" {
        let inbox = ctx.checkpoint.store().list("inbox/", None).await.unwrap();
        assert_eq!(inbox.len(), 0, "entries left: {inbox:?}");
    }
    let events = if twice { 200 } else { 100 };
    eprintln!(
        "trigger storm ({discovery}): {events} events for 100 files -> {started} executions \
         started, {n} batches committed, {} control writes; trigger outcomes {outcomes:?}",
        log.len()
    );
    assert!(started <= 50, "{started} executions for 100 events");
}
