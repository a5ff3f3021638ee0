//! Triggers: every sample in events/ parses (with the aws_lambda_events
//! types and through the trigger) and routes to the right pipeline; bad
//! payloads and path tricks start nothing; the lease protocol claims,
//! requests and never loses a wake-up; a triggered run recovers from a
//! failure at every write.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::kafka::KafkaEvent;
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::s3::S3Event;
use aws_lambda_events::event::sns::SnsEvent;
use serde_json::Value;
use sluice_engine::admin;
use sluice_engine::checkpoint::RunStatus;
use sluice_engine::deploy::Workflow;
use sluice_engine::handlers::{self, Context, Contexts};
use sluice_engine::pipeline::Pipeline;
use sluice_engine::runner::{self, RunEnd};
use sluice_engine::storage::{LocalStore, Location};
use sluice_engine::triggers::{
    self, Event, ExecutionState, Executions, ObjectRef, Started, Via, WakeOutcome, execution_input,
};
use sluice_engine::{Error, ErrorClass};

use crate::support::*;

fn events_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../events")
}

fn sample(name: &str) -> Vec<u8> {
    std::fs::read(events_dir().join(name)).unwrap_or_else(|e| panic!("events/{name}: {e}"))
}

/// The pipeline the samples concern: `taxi` over s3://sluice-demo-landing/taxi/in/.
fn taxi_on_s3(root: &Path) -> Pipeline {
    let toml = format!(
        "name = \"taxi\"\n[source]\nuri = \"s3://sluice-demo-landing/taxi/in/\"\nformat = \
         \"parquet\"\ntable = \"trips\"\n[query]\nsql = '''{SQL}'''\n[sink]\nuri = \
         \"out/sink\"\n[checkpoint]\nuri = \"out/checkpoint\"\n"
    );
    Pipeline::parse(&toml, "taxi.toml", root).unwrap()
}

fn keys(e: &Event) -> Vec<String> {
    match e {
        Event::Objects { objects, .. } => objects.iter().map(|o| o.key.clone()).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn every_sample_event_parses_with_the_aws_types_and_routes_to_its_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let taxi = taxi_on_s3(dir.path());
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(events_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            seen.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "eventbridge-s3-object-created.json",
            "eventbridge-schedule.json",
            "kinesis-records.json",
            "manual-refresh.json",
            "msk-records.json",
            "s3-object-created.json",
            "self-managed-kafka-records.json",
            "sns-s3-object-created.json",
            "sns-s3-test-event.json",
        ],
        "every sample needs a case below"
    );

    // The AWS types read each sample as the service sends it.
    let s3: S3Event = serde_json::from_slice(&sample("s3-object-created.json")).unwrap();
    assert_eq!(s3.records.len(), 4);
    assert_eq!(
        s3.records[1].s3.object.key.as_deref(),
        Some("taxi/in/date%3D2026-11-30/trips+%C3%A9t%C3%A9+%232+%28copy%29.parquet")
    );
    let sns: SnsEvent = serde_json::from_slice(&sample("sns-s3-object-created.json")).unwrap();
    let inner: S3Event = serde_json::from_str(&sns.records[0].sns.message).unwrap();
    assert_eq!(inner.records.len(), 2);
    let _: SnsEvent = serde_json::from_slice(&sample("sns-s3-test-event.json")).unwrap();
    let sched: EventBridgeEvent =
        serde_json::from_slice(&sample("eventbridge-schedule.json")).unwrap();
    assert_eq!(sched.detail_type, "Scheduled Event");
    let eb: EventBridgeEvent =
        serde_json::from_slice(&sample("eventbridge-s3-object-created.json")).unwrap();
    assert_eq!(
        eb.detail["object"]["key"],
        "taxi/in/date=2026-11-30/trips-000010.parquet"
    );

    let msk: KafkaEvent = serde_json::from_slice(&sample("msk-records.json")).unwrap();
    assert_eq!(msk.event_source.as_deref(), Some("aws:kafka"));
    assert_eq!(msk.records["rides-0"][1].offset, 16);
    let own: KafkaEvent =
        serde_json::from_slice(&sample("self-managed-kafka-records.json")).unwrap();
    assert_eq!(own.event_source.as_deref(), Some("SelfManagedKafka"));
    let kinesis: KinesisEvent = serde_json::from_slice(&sample("kinesis-records.json")).unwrap();
    assert_eq!(kinesis.records.len(), 3);
    assert_eq!(
        kinesis.records[2].event_source_arn.as_deref(),
        Some("arn:aws:kinesis:us-east-1:123456789012:stream/rides")
    );

    // The trigger's reading: source, decoded keys, skipped records, routing.
    // (file, source, decoded keys, skipped records, objects for taxi, ignored)
    type Case = (&'static str, &'static str, Vec<&'static str>, u64, u64, u64);
    let cases: [Case; 9] = [
        (
            "s3-object-created.json",
            "s3",
            vec![
                "taxi/in/date=2026-11-30/trips-000007.parquet",
                "taxi/in/date=2026-11-30/trips été #2 (copy).parquet",
                "other/in/trips-000001.parquet",
            ],
            1, // the ObjectRemoved record
            2, // objects for taxi
            1, // ignored: outside every source
        ),
        (
            "sns-s3-object-created.json",
            "sns",
            vec![
                "taxi/in/date=2026-11-30/trips-000008.parquet",
                "taxi/in/date=2026-11-30/trips-000009.parquet",
            ],
            0,
            2,
            0,
        ),
        ("sns-s3-test-event.json", "sns", vec![], 1, 0, 0),
        (
            "eventbridge-s3-object-created.json",
            "eventbridge-s3",
            vec!["taxi/in/date=2026-11-30/trips-000010.parquet"],
            0,
            1,
            0,
        ),
        ("eventbridge-schedule.json", "schedule", vec![], 0, 0, 0),
        ("manual-refresh.json", "manual", vec![], 0, 0, 0),
        // A mapping's records wake only pipelines reading their topics:
        // every record is outside the taxi pipeline's source.
        ("msk-records.json", "msk", vec![], 0, 0, 4),
        ("self-managed-kafka-records.json", "kafka", vec![], 0, 0, 1),
        ("kinesis-records.json", "kinesis", vec![], 0, 0, 3),
    ];
    for (file, source, want_keys, want_skipped, want_taxi, want_ignored) in cases {
        let e = triggers::parse_event(&sample(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(e.source(), source, "{file}");
        assert_eq!(keys(&e), want_keys, "{file}");
        if let Event::Objects { skipped, .. } = &e {
            assert_eq!(*skipped, want_skipped, "{file}: skipped records");
        }
        let r = triggers::route(&e, std::slice::from_ref(&taxi)).unwrap();
        assert_eq!(r.ignored, want_ignored, "{file}: ignored");
        let wakes_taxi = r.pipelines.get("taxi").copied();
        match source {
            "schedule" | "manual" => assert_eq!(wakes_taxi, Some(0), "{file}"),
            _ if want_taxi == 0 => assert_eq!(wakes_taxi, None, "{file}: nothing to wake"),
            _ => assert_eq!(wakes_taxi, Some(want_taxi), "{file}"),
        }
    }
}

#[test]
fn bad_payloads_are_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let taxi = taxi_on_s3(dir.path());
    let huge = format!("{{\"pipeline\": \"{}\"}}", "a".repeat(300 * 1024));
    let cases: [(&[u8], &str); 7] = [
        (b"not json", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b"{\"hello\": 1}", "unrecognised event"),
        (
            br#"{"Records":[{"EventSource":"aws:sns","EventVersion":"1.0","EventSubscriptionArn":"arn:aws:sns:us-east-1:1:t:s","Sns":{"Type":"Notification","MessageId":"m-1","TopicArn":"arn:aws:sns:us-east-1:1:t","Message":"plain text","Timestamp":"2026-11-30T12:00:00Z","SignatureVersion":"1","Signature":"x","SigningCertUrl":"https://x","UnsubscribeUrl":"https://x","MessageAttributes":{}}}]}"#,
            "SNS message m-1 is not JSON",
        ),
        (
            br#"{"version":"0","id":"1","detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"1","time":"2026-11-30T12:00:00Z","region":"us-east-1","resources":[],"detail":{}}"#,
            "is not a trigger",
        ),
        (
            br#"{"pipeline": "taxi", "force": true}"#,
            "unknown field `force`",
        ),
        (huge.as_bytes(), "over the 262144-byte limit"),
    ];
    for (payload, want) in cases {
        let e = triggers::parse_event(payload).expect_err(want);
        assert_eq!(e.class(), ErrorClass::InvalidInput, "{e}");
        assert!(e.to_string().contains(want), "want \"{want}\" in: {e}");
    }
    // A key that decodes to invalid UTF-8 names the key.
    let e = triggers::decode_key("trips-%FF.parquet").unwrap_err();
    assert!(e.to_string().contains("trips-%FF.parquet"), "{e}");
    // A manual refresh of an unregistered pipeline says what to do.
    let e = triggers::route(
        &Event::Manual {
            pipeline: "nope".into(),
            requested_by: None,
            workflow: None,
        },
        std::slice::from_ref(&taxi),
    )
    .unwrap_err();
    assert!(e.to_string().contains("sluice register"), "{e}");
}

#[test]
fn keys_outside_the_source_or_with_path_tricks_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let taxi = taxi_on_s3(dir.path());
    let obj = |bucket: &str, key: &str| ObjectRef {
        bucket: bucket.into(),
        key: key.into(),
        size: Some(1),
    };
    let event = Event::Objects {
        via: Via::S3,
        objects: vec![
            obj("sluice-demo-landing", "taxi/in/a.parquet"),
            obj("sluice-demo-landing", "taxi/in/../secret/b.parquet"),
            obj("sluice-demo-landing", "taxi/in/./c.parquet"),
            obj("sluice-demo-landing", "taxi/in//d.parquet"),
            obj("sluice-demo-landing", "/taxi/in/e.parquet"),
            obj("sluice-demo-landing", "taxi/inbox/f.parquet"),
            obj("sluice-demo-landing", "taxi/in/.staging/g.parquet"),
            obj("sluice-demo-landing", "taxi/in/_tmp/h.parquet"),
            obj("sluice-demo-landing", "taxi/in/i.csv"),
            obj("another-bucket", "taxi/in/j.parquet"),
            obj("sluice-demo-landing", "taxi/in/k\n.parquet"),
        ],
        skipped: 0,
    };
    let r = triggers::route(&event, std::slice::from_ref(&taxi)).unwrap();
    assert_eq!(r.pipelines.get("taxi"), Some(&1), "only a.parquet is input");
    assert_eq!(r.ignored, 10);
}

/// A pipeline reading another's sink (`manifests`) wakes on a new manifest
/// of that sink, not on its parts (published before the manifest: waking
/// then would find nothing committed yet) nor on staged files.
#[test]
fn a_pipeline_reading_a_sink_wakes_on_its_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "name = \"down\"\n[source]\nuri = \"s3://lake/taxi/clean/\"\nformat = \"parquet\"\n\
         table = \"trips\"\ndiscovery = \"manifests\"\n[query]\nsql = '''{SQL}'''\n[sink]\n\
         uri = \"out/sink\"\n[checkpoint]\nuri = \"out/checkpoint\"\n"
    );
    let down = Pipeline::parse(&toml, "down.toml", dir.path()).unwrap();
    let obj = |key: &str| ObjectRef {
        bucket: "lake".into(),
        key: key.into(),
        size: Some(1),
    };
    let event = Event::Objects {
        via: Via::S3,
        objects: vec![
            obj("taxi/clean/_sluice/manifest/0000000007.json"),
            obj("taxi/clean/batch=0000000007/part-00000-00000-e3.parquet"),
            obj("taxi/clean/_sluice/staging/batch=0000000008/part-00000-00000-e3.parquet.staged"),
            obj("taxi/clean/_sluice/sink.json"),
        ],
        skipped: 0,
    };
    let r = triggers::route(&event, std::slice::from_ref(&down)).unwrap();
    assert_eq!(r.pipelines.get("down"), Some(&1));
    assert_eq!(r.ignored, 3);
}

/// A pipeline reading a Delta table (`format = "delta"`) wakes on a new
/// commit of the table's log, not on its data files (written before the
/// commit), its log checkpoints, `_last_checkpoint`, or Sluice's
/// manifests beside it.
#[test]
fn a_pipeline_reading_a_delta_table_wakes_on_its_log_commits() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "name = \"down\"\n[source]\nuri = \"s3://lake/taxi/clean/\"\nformat = \"delta\"\n\
         table = \"trips\"\n[query]\nsql = '''{SQL}'''\n[sink]\n\
         uri = \"out/sink\"\n[checkpoint]\nuri = \"out/checkpoint\"\n"
    );
    let down = Pipeline::parse(&toml, "down.toml", dir.path()).unwrap();
    let obj = |key: &str| ObjectRef {
        bucket: "lake".into(),
        key: key.into(),
        size: Some(1),
    };
    let event = Event::Objects {
        via: Via::S3,
        objects: vec![
            obj("taxi/clean/_delta_log/00000000000000000007.json"),
            obj("taxi/clean/_delta_log/00000000000000000007.checkpoint.parquet"),
            obj("taxi/clean/_delta_log/_last_checkpoint"),
            obj("taxi/clean/batch=0000000007/part-00000-00000-e3.parquet"),
            obj("taxi/clean/_sluice/manifest/0000000007.json"),
        ],
        skipped: 0,
    };
    let r = triggers::route(&event, std::slice::from_ref(&down)).unwrap();
    assert_eq!(r.pipelines.get("down"), Some(&1));
    assert_eq!(r.ignored, 4);
}

/// Executions recorded in memory; a start can be made to fail, and
/// executions can be marked ended.
#[derive(Default)]
struct Recorder {
    started: Mutex<Vec<(String, Value)>>,
    ended: Mutex<Vec<String>>,
    fail: AtomicBool,
    /// Express executions can be started (a deployment with the Express
    /// state machine).
    express: AtomicBool,
    /// The kind of each execution started.
    workflows: Mutex<Vec<Workflow>>,
    /// Times an execution's state was asked.
    asked: AtomicU64,
}

#[async_trait::async_trait]
impl Executions for Recorder {
    async fn stop(&self, name: &str, _cause: &str) -> sluice_engine::Result<()> {
        self.ended.lock().unwrap().push(name.to_string());
        Ok(())
    }

    fn express(&self) -> bool {
        self.express.load(Ordering::SeqCst)
    }

    async fn state(&self, name: &str) -> sluice_engine::Result<ExecutionState> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Ok(if self.ended.lock().unwrap().iter().any(|n| n == name) {
            ExecutionState::Ended
        } else if self.started.lock().unwrap().iter().any(|(n, _)| n == name) {
            ExecutionState::Running
        } else {
            ExecutionState::Missing
        })
    }

    async fn start(
        &self,
        name: &str,
        input: &Value,
        workflow: Workflow,
    ) -> sluice_engine::Result<Started> {
        self.workflows.lock().unwrap().push(workflow);
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::Service {
                service: "Step Functions",
                message: "injected throttling".into(),
                class: ErrorClass::Retryable,
            });
        }
        let mut started = self.started.lock().unwrap();
        let earlier = started.iter().find(|(n, _)| n == name);
        if let Some((_, i)) = earlier {
            assert_eq!(
                i, input,
                "a second start of {name} must carry the same input"
            );
        }
        let new = earlier.is_none();
        started.push((name.to_string(), input.clone()));
        Ok(Started {
            execution: format!("local:{name}"),
            new,
        })
    }
}

fn manual(name: &str) -> Event {
    Event::Manual {
        pipeline: name.into(),
        requested_by: None,
        workflow: None,
    }
}

async fn trigger(ctx: &Context, rec: &Recorder) -> sluice_engine::Result<WakeOutcome> {
    let report =
        triggers::trigger(&manual(&ctx.pipeline.name), std::slice::from_ref(ctx), rec).await?;
    Ok(report.woken[&ctx.pipeline.name].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trigger_claims_the_lease_a_second_one_requests_and_the_run_looks_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    gen_files(&root.join("input"), 2, 50);
    let p = pipeline(
        &root,
        &pipeline_toml("trig", "parquet", "", "max_files_per_batch = 1"),
    );
    let ctx = local_context(&p);
    admin::register(&ctx).await.unwrap();
    let registered = Contexts::new(Location::Local(root.join("out/checkpoint")), None)
        .registered()
        .await
        .unwrap();
    let names: Vec<_> = registered
        .iter()
        .map(|c| c.pipeline.name.as_str())
        .collect();
    assert_eq!(names, ["trig"]);
    let rec = Recorder::default();

    // Idle: claim epoch 1 and start "trig-1".
    let first = trigger(&ctx, &rec).await.unwrap();
    assert!(
        matches!(&first, WakeOutcome::Started { epoch: 1, recover: false, execution } if execution == "local:trig-1"),
        "{first:?}"
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.epoch, c.owner.as_deref(), c.requested),
        (RunStatus::Running, 1, Some("sfn:trig-1"), false)
    );
    // A second event while that run's execution runs: only request.
    let second = trigger(&ctx, &rec).await.unwrap();
    assert_eq!(second, WakeOutcome::Requested { epoch: 1 });
    assert!(ctx.checkpoint.control().await.unwrap().unwrap().0.requested);
    let input = {
        let started = rec.started.lock().unwrap();
        assert_eq!(started.len(), 1, "{started:?}");
        started[0].1.clone()
    };
    assert_eq!(input, execution_input("trig", 1, "manual"));
    // Had the first trigger died between its claim and its start, the
    // execution would be missing: the next event starts it, same name and
    // input.
    let lost = Recorder::default();
    assert_eq!(
        trigger(&ctx, &lost).await.unwrap(),
        WakeOutcome::Requested { epoch: 1 }
    );
    assert_eq!(
        *lost.started.lock().unwrap(),
        vec![("trig-1".to_string(), input.clone())]
    );

    // The execution runs; after its first batch two more files land and a
    // trigger fires: it must only request (the run holds the lease), and the
    // run must take those files before it releases.
    let mut woke_mid_run = None;
    let ctx2 = ctx.clone();
    let late_dir = root.join("input");
    let rec2 = &rec;
    let summary = crate::support::runner()
        .execute(&ctx, input, |_| {
            if woke_mid_run.is_none() {
                gen_files(&late_dir, 2, 50);
                woke_mid_run = Some(tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(trigger(&ctx2, rec2))
                }));
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(woke_mid_run, Some(Ok(WakeOutcome::Requested { epoch: 1 }))),
        "{woke_mid_run:?}"
    );
    assert!(matches!(summary.end, RunEnd::Done), "{:?}", summary.end);
    assert_eq!(
        summary.batches.iter().map(|b| b.files).sum::<u64>(),
        4,
        "the run took the late files too"
    );
    assert_eq!(
        committed_rows(&root.join("out/sink"), "trig").await,
        one_shot_rows(&root.join("input")).await
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.epoch, c.requested, c.totals.files),
        (RunStatus::Idle, 1, false, 4)
    );

    rec.ended.lock().unwrap().push("trig-1".into());
    // Idle again: the next event starts epoch 2, which finds nothing.
    let third = trigger(&ctx, &rec).await.unwrap();
    assert!(
        matches!(third, WakeOutcome::Started { epoch: 2, .. }),
        "{third:?}"
    );
    let summary = crate::support::runner()
        .execute(&ctx, execution_input("trig", 2, "manual"), |_| {})
        .await
        .unwrap();
    assert!(summary.batches.is_empty());
    assert_eq!(
        ctx.checkpoint.control().await.unwrap().unwrap().0.status,
        RunStatus::Idle
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_start_gives_the_claim_back_and_the_retried_event_starts_the_run() {
    let dir = tempfile::tempdir().unwrap();
    gen_files(&dir.path().join("input"), 1, 20);
    let p = pipeline(dir.path(), &pipeline_toml("retry", "parquet", "", ""));
    let ctx = local_context(&p);
    admin::register(&ctx).await.unwrap();
    let rec = Recorder::default();
    rec.fail.store(true, Ordering::SeqCst);
    let e = trigger(&ctx, &rec).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Retryable, "{e}");
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(c.status, RunStatus::Idle, "the claim was given back");
    rec.fail.store(false, Ordering::SeqCst);
    let again = trigger(&ctx, &rec).await.unwrap();
    assert!(matches!(again, WakeOutcome::Started { .. }), "{again:?}");
}

/// Two batches of two files, one task per file, and more tasks than
/// `max_inline_tasks`: every batch goes through the Distributed Map (its task
/// list is one more write to fail); one batch per execution, so the run is
/// handed to a second execution (the continuation's release and claim are
/// writes to fail too).
const TRIGGERED_LIMITS: &str = "max_files_per_batch = 2\nmax_bytes_per_task = 1\n\
                                max_inline_tasks = 1\nmax_batches_per_execution = 1";

fn faulty(root: &Path, writes: Arc<AtomicU64>, fail_at: u64, clock_skew_ms: i64) -> Context {
    let toml = pipeline_toml("trc", "parquet", "", TRIGGERED_LIMITS);
    let mut ctx = fault_context(root, &toml, writes, fail_at);
    ctx.clock = Arc::new(move || chrono::Utc::now().timestamp_millis() + clock_skew_ms);
    ctx
}

/// Trigger, then execute what the trigger started (as Step Functions would).
async fn triggered_run(ctx: &Context) -> sluice_engine::Result<Option<runner::RunSummary>> {
    let rec = Recorder::default();
    match trigger(ctx, &rec).await? {
        WakeOutcome::Started { epoch, .. } => crate::support::runner()
            .execute(
                ctx,
                execution_input(&ctx.pipeline.name, epoch, "manual"),
                |_| {},
            )
            .await
            .map(Some),
        WakeOutcome::Requested { .. } | WakeOutcome::Held => Ok(None),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_of_a_triggered_run_then_triggering_after_the_ttl_gives_the_clean_output()
{
    let clean = tempfile::tempdir().unwrap();
    gen_files(&clean.path().join("input"), 4, 40);
    let setup = faulty(clean.path(), Arc::new(AtomicU64::new(0)), 0, 0);
    admin::register(&setup).await.unwrap();
    let writes = Arc::new(AtomicU64::new(0));
    let summary = triggered_run(&faulty(clean.path(), writes.clone(), 0, 0))
        .await
        .unwrap()
        .expect("started");
    assert_eq!(summary.batches.len(), 2, "the scenario needs two batches");
    let commit = setup.checkpoint.commit(0).await.unwrap().unwrap();
    let tasks: std::collections::BTreeSet<&str> = commit
        .outputs
        .iter()
        .map(|o| o.key.rsplit('/').next().unwrap().split('-').nth(1).unwrap())
        .collect();
    assert_eq!(tasks.len(), 2, "two tasks per batch: {:?}", commit.outputs);
    let total = writes.load(Ordering::SeqCst);
    let expected = committed_rows(&clean.path().join("out/sink"), "trc").await;
    assert_eq!(expected, one_shot_rows(&clean.path().join("input")).await);
    assert!(total >= 12, "only {total} writes (trigger claim included)");
    eprintln!("triggered crash test: failing each of {total} writes in turn");
    let ttl_ms = 900_000 + 1_000;

    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        gen_files(&dir.path().join("input"), 4, 40);
        admin::register(&faulty(dir.path(), Arc::new(AtomicU64::new(0)), 0, 0))
            .await
            .unwrap();
        let failed = triggered_run(&faulty(dir.path(), Arc::new(AtomicU64::new(0)), k, 0)).await;
        assert!(
            failed.is_err(),
            "write {k} was injected to fail: {failed:?}"
        );

        // The next event comes after the dead run's lease expired.
        let later = faulty(dir.path(), Arc::new(AtomicU64::new(0)), 0, ttl_ms);
        let again = triggered_run(&later)
            .await
            .unwrap_or_else(|e| panic!("retrigger after failing write {k}: {e}"))
            .unwrap_or_else(|| panic!("after write {k}: the expired lease was not taken over"));
        assert_recovered(dir.path(), "trc", &again.end, &expected, k).await;
        let (c, _) = later.checkpoint.control().await.unwrap().unwrap();
        assert_eq!(
            (c.status, c.last_committed, c.totals.files),
            (RunStatus::Idle, Some(1), 4),
            "after failing write {k}"
        );
    }
}

/// A registered pipeline `name` over two small files whose first trigger
/// started epoch 1 (recorded, not run).
async fn started_once(name: &str) -> (tempfile::TempDir, Pipeline, Context, Recorder) {
    let dir = tempfile::tempdir().unwrap();
    gen_files(&dir.path().join("input"), 2, 20);
    let p = pipeline(dir.path(), &pipeline_toml(name, "parquet", "", ""));
    let ctx = local_context(&p);
    admin::register(&ctx).await.unwrap();
    let rec = Recorder::default();
    assert!(matches!(
        trigger(&ctx, &rec).await.unwrap(),
        WakeOutcome::Started { epoch: 1, .. }
    ));
    (dir, p, ctx, rec)
}

/// Express: the trigger starts runs on the Express state machine and
/// names the execution in the lease with the time it claimed it. Step
/// Functions cannot be asked about an Express execution, so until 6
/// minutes after the claim (its 5-minute limit and a minute for clocks) a
/// later trigger asks the run to look again; after that it takes over.
/// A continuation (the Continue step's payload) asks for Standard.
#[tokio::test(flavor = "multi_thread")]
async fn an_express_run_is_taken_over_once_its_limit_has_certainly_passed() {
    use sluice_engine::checkpoint::owner::Owner;
    let dir = tempfile::tempdir().unwrap();
    gen_files(&dir.path().join("input"), 2, 20);
    let p = pipeline(dir.path(), &pipeline_toml("quick", "parquet", "", ""));
    let ctx = local_context(&p);
    admin::register(&ctx).await.unwrap();
    let rec = Recorder {
        express: true.into(),
        ..Default::default()
    };
    let first = trigger(&ctx, &rec).await.unwrap();
    assert!(
        matches!(
            first,
            WakeOutcome::Started {
                epoch: 1,
                recover: false,
                ..
            }
        ),
        "{first:?}"
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    let Owner::Express { name, claimed_ms } = Owner::parse(c.owner.as_deref().unwrap()) else {
        panic!("the lease names an Express execution: {:?}", c.owner);
    };
    assert_eq!(name, "quick-1");
    let at = |after_ms: i64| {
        let mut later = local_context(&p);
        later.clock = Arc::new(move || claimed_ms + after_ms);
        later
    };
    // Five minutes on (heartbeat 5 minutes old, TTL 15): it may still run.
    assert_eq!(
        trigger(&at(5 * 60_000), &rec).await.unwrap(),
        WakeOutcome::Requested { epoch: 1 }
    );
    // Exactly 6 minutes on: not yet certain.
    assert_eq!(
        trigger(&at(6 * 60_000), &rec).await.unwrap(),
        WakeOutcome::Requested { epoch: 1 }
    );
    // A moment later it has certainly ended: taken over, as Express again.
    let next = trigger(&at(6 * 60_000 + 1), &rec).await.unwrap();
    assert!(
        matches!(
            next,
            WakeOutcome::Started {
                epoch: 2,
                recover: true,
                ..
            }
        ),
        "{next:?}"
    );
    assert_eq!(
        rec.asked.load(Ordering::SeqCst),
        0,
        "an Express execution cannot be described"
    );
    runner()
        .starting(Workflow::Express)
        .execute(&ctx, execution_input("quick", 2, "manual"), |_| {})
        .await
        .unwrap();
    assert_eq!(
        control_of(dir.path(), &pipeline_toml("quick", "parquet", "", ""))
            .await
            .totals
            .files,
        2
    );
    // The Continue step's payload asks for a Standard execution.
    let continuation = triggers::parse_event(
        br#"{"pipeline": "quick", "requested_by": "continuation", "workflow": "standard"}"#,
    )
    .unwrap();
    let report = triggers::trigger(&continuation, std::slice::from_ref(&ctx), &rec)
        .await
        .unwrap();
    assert!(
        matches!(report.woken["quick"], WakeOutcome::Started { epoch: 3, .. }),
        "{report:?}"
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(c.owner.as_deref(), Some("sfn:quick-3"));
    assert_eq!(
        *rec.workflows.lock().unwrap(),
        [Workflow::Express, Workflow::Express, Workflow::Standard]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_kept_by_an_ended_execution_is_taken_over_without_waiting_for_the_ttl() {
    let (dir, _p, ctx, rec) = started_once("ended").await;
    // The execution fails before it commits anything and keeps the lease
    // (the state machine's Catch): its heartbeat is fresh, the TTL 15 min.
    rec.ended.lock().unwrap().push("ended-1".into());
    let next = trigger(&ctx, &rec).await.unwrap();
    assert!(
        matches!(&next, WakeOutcome::Started { epoch: 2, recover: true, execution } if execution == "local:ended-2"),
        "{next:?}"
    );
    let summary = crate::support::runner()
        .execute(&ctx, execution_input("ended", 2, "manual"), |_| {})
        .await
        .unwrap();
    assert_eq!(summary.batches.iter().map(|b| b.files).sum::<u64>(), 2);
    assert_eq!(
        committed_rows(&dir.path().join("out/sink"), "ended").await,
        one_shot_rows(&dir.path().join("input")).await
    );
}

/// The review's case: nothing heartbeats between Plan and Commit on AWS,
/// and a trigger took over an expired lease without asking whether its
/// execution still ran, so a batch longer than the TTL was pre-empted by
/// the next event. Now Step Functions is asked first (a running execution
/// keeps its lease, however old its heartbeat), and tasks renew the
/// heartbeat.
#[tokio::test(flavor = "multi_thread")]
async fn an_expired_lease_of_a_running_execution_is_not_taken_over() {
    let (_dir, p, ctx, rec) = started_once("long").await;
    // Twenty minutes later (TTL 15), the execution still runs its batch.
    let mut later = local_context(&p);
    later.clock = Arc::new(|| chrono::Utc::now().timestamp_millis() + 20 * 60_000);
    let next = trigger(&later, &rec).await.unwrap();
    assert_eq!(next, WakeOutcome::Requested { epoch: 1 });
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!((c.epoch, c.requested), (1, true));

    // A task of that run, past a third of the TTL, renews the heartbeat.
    let run = sluice_engine::handlers::RunState {
        pipeline: "long".into(),
        epoch: 1,
        trigger: None,
        spec: String::new(),
        ..Default::default()
    };
    let handlers::PlanOutcome::Batch { run, batch } =
        handlers::plan(&later, Some(run)).await.unwrap()
    else {
        panic!("a batch was planned");
    };
    let mut task_time = local_context(&p);
    task_time.clock = Arc::new(|| chrono::Utc::now().timestamp_millis() + 40 * 60_000);
    handlers::operate(&task_time, &run, batch.batch, 0)
        .await
        .unwrap();
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    let age = chrono::Utc::now().timestamp_millis() + 40 * 60_000 - c.heartbeat_ms.unwrap();
    assert!(
        age < 60_000,
        "the task did not renew the heartbeat ({age} ms old)"
    );

    // Once the execution ended, the next trigger takes over.
    rec.ended.lock().unwrap().push("long-1".into());
    let mut much_later = local_context(&p);
    much_later.clock = Arc::new(|| chrono::Utc::now().timestamp_millis() + 60 * 60_000);
    let next = trigger(&much_later, &rec).await.unwrap();
    assert!(
        matches!(
            next,
            WakeOutcome::Started {
                epoch: 2,
                recover: true,
                ..
            }
        ),
        "{next:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_with_more_tasks_than_the_inline_limit_goes_to_the_distributed_map() {
    let dir = tempfile::tempdir().unwrap();
    gen_files(&dir.path().join("input"), 3, 30);
    let limits = "max_bytes_per_task = 1\nmax_inline_tasks = 2";
    let p = pipeline(dir.path(), &pipeline_toml("dmap", "parquet", "", limits));
    let ctx = local_context(&p);
    let plan = handlers::plan(&ctx, None).await.unwrap();
    let handlers::PlanOutcome::Batch { batch, .. } = plan else {
        panic!("{plan:?}")
    };
    assert!(batch.distributed && batch.tasks.is_empty(), "{batch:?}");
    assert_eq!(batch.task_count, 3);
    let list = batch.task_list.clone().expect("a task list");
    assert_eq!(list.bucket, "", "a local checkpoint");
    let obj = ctx
        .checkpoint
        .store()
        .get(&list.key)
        .await
        .unwrap()
        .unwrap();
    let tasks: Vec<u32> = serde_json::from_slice(&obj.bytes).unwrap();
    assert_eq!(tasks, [0, 1, 2]);
    // The payload stays small whatever the task count.
    assert!(serde_json::to_string(&batch).unwrap().len() < 400);
    // The local runner reads the list through the definition's ItemReader.
    let summary = run(&ctx).await.unwrap();
    assert_eq!(summary.batches.iter().map(|b| b.files).sum::<u64>(), 3);
    assert_eq!(
        committed_rows(&dir.path().join("out/sink"), "dmap").await,
        one_shot_rows(&dir.path().join("input")).await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_execution_that_used_its_batch_budget_hands_the_run_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    gen_files(&dir.path().join("input"), 5, 30);
    let limits = "max_files_per_batch = 2\nmax_batches_per_execution = 1";
    let p = pipeline(dir.path(), &pipeline_toml("budget", "parquet", "", limits));
    let ctx = local_context(&p);
    let summary = run(&ctx).await.unwrap();
    assert!(matches!(summary.end, RunEnd::Done), "{:?}", summary.end);
    assert_eq!(summary.batches.len(), 3);
    // One execution (one epoch) per batch; the batches were planned once.
    let mut epochs = Vec::new();
    for n in 0..3 {
        epochs.push(ctx.checkpoint.commit(n).await.unwrap().unwrap().epoch);
    }
    assert_eq!(epochs, [1, 2, 3]);
    assert_eq!(
        ctx.checkpoint.offsets(1).await.unwrap().unwrap().epoch,
        1,
        "planned by the first"
    );
    assert_eq!(
        committed_rows(&dir.path().join("out/sink"), "budget").await,
        one_shot_rows(&dir.path().join("input")).await
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.requested, c.totals.files),
        (RunStatus::Idle, false, 5)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_pipeline_records_requests_and_starts_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    gen_files(&dir.path().join("input"), 2, 20);
    let p = pipeline(dir.path(), &pipeline_toml("paused", "parquet", "", ""));
    let ctx = local_context(&p);
    admin::register(&ctx).await.unwrap();
    admin::set_paused(&ctx, true).await.unwrap();
    let rec = Recorder::default();
    assert_eq!(trigger(&ctx, &rec).await.unwrap(), WakeOutcome::Held);
    assert_eq!(trigger(&ctx, &rec).await.unwrap(), WakeOutcome::Held);
    assert!(rec.started.lock().unwrap().is_empty(), "nothing started");
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert!(c.paused && c.requested && c.status == RunStatus::Idle);
    // A local run respects the pause too, and writes nothing.
    let idle = run(&ctx).await.unwrap();
    assert_eq!(idle.end, RunEnd::Paused);
    assert_eq!(idle.requests.writes(), 0);
    // Resume: the recorded request starts a run.
    let c = admin::set_paused(&ctx, false).await.unwrap();
    assert!(!c.paused && c.requested);
    let started = trigger(&ctx, &rec).await.unwrap();
    assert!(
        matches!(started, WakeOutcome::Started { epoch: 1, .. }),
        "{started:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn history_names_what_started_each_run() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    gen_files(&input, 2, 20);
    let p = pipeline(
        dir.path(),
        &pipeline_toml("hist", "parquet", "", "max_files_per_batch = 1"),
    );
    let ctx = local_context(&p);
    admin::register(&ctx).await.unwrap();
    run(&ctx).await.unwrap();
    gen_files(&input, 1, 20);
    let rec = Recorder::default();
    let event = Event::Manual {
        pipeline: "hist".into(),
        requested_by: Some("sluice refresh".into()),
        workflow: None,
    };
    let report = triggers::trigger(&event, std::slice::from_ref(&ctx), &rec)
        .await
        .unwrap();
    let WakeOutcome::Started { epoch, .. } = report.woken["hist"] else {
        panic!("{report:?}")
    };
    let input_of_run = rec.started.lock().unwrap()[0].1.clone();
    assert_eq!(input_of_run["run"]["trigger"], "manual: sluice refresh");
    crate::support::runner()
        .execute(&ctx, input_of_run, |_| {})
        .await
        .unwrap();
    let h = admin::history(&ctx, 10).await.unwrap();
    let got: Vec<(u64, u64, Option<&str>)> = h
        .iter()
        .map(|c| (c.batch, c.epoch, c.trigger.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (2, epoch, Some("manual: sluice refresh")),
            (1, 1, Some("sluice run")),
            (0, 1, Some("sluice run")),
        ]
    );
    assert_eq!(admin::history(&ctx, 1).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_run_is_fenced_and_the_next_run_resumes_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    gen_files(&dir.path().join("input"), 2, 40);
    let p = pipeline(
        dir.path(),
        &pipeline_toml("cancel", "parquet", "", "max_files_per_batch = 1"),
    );
    let ctx = local_context(&p);
    admin::register(&ctx).await.unwrap();
    let rec = Recorder::default();
    let WakeOutcome::Started { epoch, .. } = trigger(&ctx, &rec).await.unwrap() else {
        panic!("not started")
    };
    // The execution plans and runs the task of batch 0, then is cancelled
    // before it commits: stop it and release its lease (what `sluice
    // cancel` does).
    let run_state = handlers::RunState {
        pipeline: "cancel".into(),
        epoch,
        trigger: Some("manual".into()),
        spec: String::new(),
        ..Default::default()
    };
    let handlers::PlanOutcome::Batch {
        run: planned,
        batch,
    } = handlers::plan(&ctx, Some(run_state)).await.unwrap()
    else {
        panic!("no batch")
    };
    handlers::operate(&ctx, &planned, batch.batch, batch.tasks[0])
        .await
        .unwrap();
    rec.stop(&triggers::execution_name("cancel", epoch), "test")
        .await
        .unwrap();
    admin::release_cancelled(&ctx, epoch).await.unwrap();
    // A late step of the stopped execution can commit nothing.
    let late = handlers::commit(&ctx, &planned, batch.batch).await;
    assert_eq!(
        late.unwrap_err().class(),
        ErrorClass::Conflict,
        "the cancelled run must be fenced"
    );
    // The next event starts a run that resumes batch 0 and commits all, once.
    let next = trigger(&ctx, &rec).await.unwrap();
    let WakeOutcome::Started { epoch: e2, .. } = next else {
        panic!("{next:?}")
    };
    assert_eq!(e2, epoch + 1);
    let summary = crate::support::runner()
        .execute(&ctx, execution_input("cancel", e2, "manual"), |_| {})
        .await
        .unwrap();
    assert!(summary.batches[0].resumed, "batch 0 resumed");
    assert_eq!(
        committed_rows(&dir.path().join("out/sink"), "cancel").await,
        one_shot_rows(&dir.path().join("input")).await
    );
    assert_eq!(
        orphan_files(&dir.path().join("out/sink"), "cancel").await,
        Vec::<String>::new()
    );
}

/// Every sample in events/ through the trigger, with a fresh checkpoint for
/// each: the decision it leads to for the `taxi` pipeline.
#[tokio::test(flavor = "multi_thread")]
async fn every_sample_event_leads_to_its_decision() {
    let cases = [
        ("s3-object-created.json", Some(1)),
        ("sns-s3-object-created.json", Some(1)),
        ("sns-s3-test-event.json", None),
        ("eventbridge-s3-object-created.json", Some(1)),
        ("eventbridge-schedule.json", Some(1)),
        ("manual-refresh.json", Some(1)),
        ("msk-records.json", None),
        ("self-managed-kafka-records.json", None),
        ("kinesis-records.json", None),
    ];
    for (file, want_epoch) in cases {
        let dir = tempfile::tempdir().unwrap();
        let taxi = taxi_on_s3(dir.path());
        let ctx = Context::new(
            taxi,
            Arc::new(sluice_engine::storage::MemoryStore::new()),
            Arc::new(sluice_engine::storage::MemoryStore::new()),
            Arc::new(LocalStore::new(dir.path().join("cp"))),
        );
        let rec = Recorder::default();
        let event = triggers::parse_event(&sample(file)).unwrap();
        let report = triggers::trigger(&event, std::slice::from_ref(&ctx), &rec)
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        match want_epoch {
            Some(epoch) => {
                assert_eq!(
                    report.woken.get("taxi"),
                    Some(&WakeOutcome::Started {
                        epoch,
                        execution: "local:taxi-1".into(),
                        recover: false
                    }),
                    "{file}: {report:?}"
                );
                let started = rec.started.lock().unwrap().clone();
                assert_eq!(started.len(), 1, "{file}");
                assert_eq!(started[0].1["run"]["trigger"], event.label(), "{file}");
                // The same event again, while that run holds the lease: a
                // request, no second execution.
                let again = triggers::trigger(&event, std::slice::from_ref(&ctx), &rec)
                    .await
                    .unwrap();
                assert_eq!(
                    again.woken["taxi"],
                    WakeOutcome::Requested { epoch: 1 },
                    "{file}"
                );
                assert_eq!(rec.started.lock().unwrap().len(), 1, "{file}");
            }
            None => {
                assert!(report.woken.is_empty(), "{file}: {report:?}");
                assert!(
                    ctx.checkpoint.control().await.unwrap().is_none(),
                    "{file}: wrote"
                );
            }
        }
    }
}

/// A Kafka event source mapping's records wake the pipelines that read
/// their topics, whatever the brokers (the mapping names its cluster, the
/// pipeline its bootstrap brokers: the topic decides), and only those; the
/// run the wake starts is labelled with the mapping's kind.
#[tokio::test(flavor = "multi_thread")]
async fn a_kafka_mappings_records_wake_the_pipelines_reading_their_topics() {
    let dir = tempfile::tempdir().unwrap();
    let on_topic = |name: &str, topic: &str| {
        let toml = format!(
            "name = \"{name}\"\n[source]\nuri = \"kafka://127.0.0.1:9/{topic}\"\nformat = \
             \"jsonl\"\ntable = \"rides\"\n[query]\nsql = 'SELECT * FROM rides'\n[sink]\nuri = \
             \"{name}/sink\"\n[checkpoint]\nuri = \"{name}/checkpoint\"\n"
        );
        let p = Pipeline::parse(&toml, &format!("{name}.toml"), dir.path()).unwrap();
        Context::new(
            p,
            Arc::new(sluice_engine::storage::MemoryStore::new()),
            Arc::new(sluice_engine::storage::MemoryStore::new()),
            Arc::new(LocalStore::new(dir.path().join(name).join("cp"))),
        )
    };
    let registered = [
        on_topic("rides", "rides"),
        on_topic("rides-copy", "rides"),
        on_topic("payments", "payments"),
    ];
    let taxi = taxi_on_s3(dir.path());
    for (file, source, records, ignored) in [
        ("msk-records.json", "msk", 3, 1),
        ("self-managed-kafka-records.json", "kafka", 1, 0),
    ] {
        let event = triggers::parse_event(&sample(file)).unwrap();
        assert_eq!(event.source(), source, "{file}");
        let pipelines: Vec<Pipeline> = registered
            .iter()
            .map(|c| (*c.pipeline).clone())
            .chain([taxi.clone()])
            .collect();
        let r = triggers::route(&event, &pipelines).unwrap();
        assert_eq!(
            r.pipelines.into_iter().collect::<Vec<_>>(),
            [
                ("rides".to_string(), records),
                ("rides-copy".to_string(), records)
            ],
            "{file}"
        );
        assert_eq!(r.ignored, ignored, "{file}");
    }
    let rec = Recorder::default();
    let event = triggers::parse_event(&sample("msk-records.json")).unwrap();
    let report = triggers::trigger(&event, &registered, &rec).await.unwrap();
    assert_eq!((report.objects, report.ignored), (4, 1));
    assert_eq!(
        report.woken.keys().collect::<Vec<_>>(),
        ["rides", "rides-copy"]
    );
    let started = rec.started.lock().unwrap().clone();
    assert_eq!(started.len(), 2);
    assert!(started.iter().all(|s| s.1["run"]["trigger"] == "msk"));
    assert!(registered[2].checkpoint.control().await.unwrap().is_none());
    // While those runs hold their leases, another delivery only requests a
    // look.
    let again = triggers::trigger(&event, &registered, &rec).await.unwrap();
    assert_eq!(again.woken["rides"], WakeOutcome::Requested { epoch: 1 });
    assert_eq!(rec.started.lock().unwrap().len(), 2);
}

/// A Kinesis event source mapping's records wake the pipelines reading
/// their stream, named by name or by ARN, and only those.
#[tokio::test(flavor = "multi_thread")]
async fn a_kinesis_mappings_records_wake_the_pipelines_reading_their_stream() {
    let dir = tempfile::tempdir().unwrap();
    let on_stream = |name: &str, uri: &str| {
        let toml = format!(
            "name = \"{name}\"\n[source]\nuri = \"{uri}\"\nformat = \"jsonl\"\ntable = \
             \"rides\"\n[query]\nsql = 'SELECT * FROM rides'\n[sink]\nuri = \"{name}/sink\"\n\
             [checkpoint]\nuri = \"{name}/checkpoint\"\n"
        );
        let p = Pipeline::parse(&toml, &format!("{name}.toml"), dir.path()).unwrap();
        Context::new(
            p,
            Arc::new(sluice_engine::storage::MemoryStore::new()),
            Arc::new(sluice_engine::storage::MemoryStore::new()),
            Arc::new(LocalStore::new(dir.path().join(name).join("cp"))),
        )
    };
    let registered = [
        on_stream("by-name", "kinesis://rides"),
        on_stream(
            "by-arn",
            "kinesis://arn:aws:kinesis:us-east-1:123456789012:stream/rides",
        ),
        on_stream("other", "kinesis://payments"),
    ];
    let event = triggers::parse_event(&sample("kinesis-records.json")).unwrap();
    assert_eq!(event.source(), "kinesis");
    let pipelines: Vec<Pipeline> = registered.iter().map(|c| (*c.pipeline).clone()).collect();
    let r = triggers::route(&event, &pipelines).unwrap();
    assert_eq!(
        r.pipelines.into_iter().collect::<Vec<_>>(),
        [("by-arn".to_string(), 3), ("by-name".to_string(), 3)]
    );
    assert_eq!(r.ignored, 0);
    let rec = Recorder::default();
    let report = triggers::trigger(&event, &registered, &rec).await.unwrap();
    assert_eq!(
        report.woken.keys().collect::<Vec<_>>(),
        ["by-arn", "by-name"]
    );
    let started = rec.started.lock().unwrap().clone();
    assert!(started.iter().all(|s| s.1["run"]["trigger"] == "kinesis"));
    assert!(registered[2].checkpoint.control().await.unwrap().is_none());
}

/// Your own bucket (`CreateBucket = false`): the template's EventBridge
/// rule, run by moto's EventBridge with the sample event's shape, delivers
/// "Object Created" events for new input (under SourcePrefix) and for
/// committed manifests (under SinkPrefix), and nothing else (how the
/// trigger reads such an event is checked above, on the same sample).
#[test]
fn the_own_bucket_rule_delivers_input_and_manifests_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let keys = [
        "taxi/in/date=2026-11-30/trips-000010.parquet",
        "curated/taxi/_sluice/manifest/0000000003.json",
        "elsewhere/trips-000001.parquet",
        "checkpoints/taxi/control.json",
    ];
    let mut child = std::process::Command::new(python())
        .arg(root.join("tests/e2e/eventbridge_rule.py"))
        .args([
            s3_endpoint().as_str(),
            root.join("template.yaml").to_str().unwrap(),
            events_dir()
                .join("eventbridge-s3-object-created.json")
                .to_str()
                .unwrap(),
            "sluice-demo-landing",
            "taxi/",
            "curated/",
        ])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(keys.join("\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let delivered: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(delivered, [keys[1], keys[0]]);
}

/// `sluice run` while another run holds the lease: it does not start; it
/// asks the running one to look again before it ends (sets `requested`,
/// as a trigger does), so a file that landed after that run looked is
/// taken by it rather than left for whatever runs next. Before, the second
/// run only reported the lease held, and the running one ended at its last
/// commit without the file.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_started_while_another_runs_asks_it_to_take_what_landed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let mut files = gen_files(&input, 2, 50);
    let p = pipeline(
        root,
        &pipeline_toml("asked", "parquet", "", "max_files_per_batch = 1"),
    );
    let holder = local_context(&p);
    // The second `sluice run`: another process, which sees the holder alive.
    let second = Context::open(p.clone(), None).unwrap();
    let late = input.clone();
    let mut busy = None;
    let summary = runner()
        .run(&holder, |_| {
            if busy.is_none() {
                // After the first of the two planned batches: a file
                // lands, and a second run starts.
                files.extend(gen_files(&late, 1, 50));
                busy = Some(tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(runner().run(&second, |_| {}))
                }));
            }
        })
        .await
        .unwrap();
    let busy = busy.expect("the second run ran").unwrap();
    assert!(busy.batches.is_empty(), "{busy:?}");
    match &busy.end {
        RunEnd::Busy(why) => assert!(
            why.contains("holds the lease") && why.contains("asked to look for new input again"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(summary.end, RunEnd::Done), "{:?}", summary.end);
    assert_eq!(
        summary.batches.iter().map(|b| b.files).sum::<u64>(),
        3,
        "the running run took the late file: {summary:?}"
    );
    assert_eq!(
        committed_rows(&root.join("out/sink"), "asked").await,
        duckdb_rows(&files, SQL).await
    );
    let (c, _) = holder.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.requested, c.totals.files),
        (RunStatus::Idle, false, 3)
    );
}

/// Paused while a run is going: a `sluice run` then records its request
/// for `sluice resume`, as it says, and the running run ends with what it
/// planned instead of taking that request as its own and looking again
/// (it took the file that landed after the pause, and `resume` then found
/// nothing requested). After `resume`, the next run takes the file.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_pipelines_run_ends_and_leaves_the_request_for_resume() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    gen_files(&input, 2, 50);
    let p = pipeline(
        root,
        &pipeline_toml("pausing", "parquet", "", "max_files_per_batch = 1"),
    );
    let holder = local_context(&p);
    let second = Context::open(p.clone(), None).unwrap();
    let late = input.clone();
    let mut asked = None;
    let summary = runner()
        .run(&holder, |_| {
            if asked.is_none() {
                asked = Some(tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(async {
                        admin::set_paused(&second, true).await.unwrap();
                        gen_files(&late, 1, 50);
                        runner().run(&second, |_| {}).await
                    })
                }));
            }
        })
        .await
        .unwrap();
    let asked = asked.expect("the second run ran").unwrap();
    assert!(
        matches!(asked.end, RunEnd::Paused) && asked.batches.is_empty(),
        "{asked:?}"
    );
    assert_eq!(
        summary.batches.iter().map(|b| b.files).sum::<u64>(),
        2,
        "the running run took only what it planned: {summary:?}"
    );
    let (c, _) = holder.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.paused, c.requested),
        (RunStatus::Idle, true, true)
    );
    let resumed = admin::set_paused(&holder, false).await.unwrap();
    assert!(resumed.requested);
    let after = run(&local_context(&p)).await.unwrap();
    assert_eq!(after.batches.iter().map(|b| b.files).sum::<u64>(), 1);
    assert_eq!(
        committed_rows(&root.join("out/sink"), "pausing").await,
        duckdb_rows(
            &std::fs::read_dir(input.join("date=2024-01-01"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect::<Vec<_>>(),
            SQL
        )
        .await
    );
}

/// The ask is a compare-and-swap on what the asking run read: held at that
/// write while the running run ends, it lands on nothing (the record
/// changed), and the asking run, finding the lease free, runs itself and
/// takes the file the running one had not seen; nothing twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_held_at_its_ask_while_the_holder_ends_runs_itself() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let mut files = gen_files(&input, 2, 50);
    let toml = pipeline_toml("asklate", "parquet", "", "max_files_per_batch = 1");
    let holder = local_context(&pipeline(root, &toml));
    let gate = Gate::new("control.json");
    let mut asker = gated_context(
        root,
        &toml,
        Arc::new(AtomicU64::new(0)),
        0,
        Some(gate.clone()),
    );
    // Another process, which sees the holder alive.
    asker.owner_gone = Arc::new(|_| false);
    let late = input.clone();
    let mut second = None;
    let summary = runner()
        .run(&holder, |_| {
            if second.is_none() {
                files.extend(gen_files(&late, 1, 50));
                let asker = asker.clone();
                let g = gate.clone();
                second = Some(tokio::spawn(
                    async move { runner().run(&asker, |_| {}).await },
                ));
                // The asking run is held at its ask; the holder goes on.
                tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(g.reached.notified())
                });
            }
        })
        .await
        .unwrap();
    assert_eq!(
        summary.batches.iter().map(|b| b.files).sum::<u64>(),
        2,
        "{summary:?}"
    );
    gate.release.notify_one();
    let second = second.expect("started").await.unwrap().unwrap();
    assert_eq!(
        second.batches.iter().map(|b| b.files).sum::<u64>(),
        1,
        "the asking run took the late file itself: {second:?}"
    );
    assert_eq!(
        committed_rows(&root.join("out/sink"), "asklate").await,
        duckdb_rows(&files, SQL).await
    );
    let (c, _) = holder.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.requested, c.totals.files),
        (RunStatus::Idle, false, 3)
    );
}
