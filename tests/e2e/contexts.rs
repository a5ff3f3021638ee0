//! The Lambda functions' contexts (`handlers::Contexts`): built from a
//! registered `pipeline.json` once per container and cached, they must
//! follow a spec registered again while containers stay warm; and a
//! corrupt checkpoint record gives an error naming its key, never a panic.

use std::path::Path;

use sluice_engine::admin;
use sluice_engine::handlers::{
    self, CommitAction, CommitRequest, Contexts, PlanOutcome, PlanRequest, TaskRequest,
};
use sluice_engine::storage::Location;

use crate::support::*;

fn contexts(root: &Path) -> Contexts {
    Contexts::new(Location::Local(root.join("out/checkpoint")), None)
}

/// One run driven as the state machine drives the functions, each step
/// through the contexts of its own function (planner, operator, committer).
async fn run_through(planner: &Contexts, operator: &Contexts, committer: &Contexts) -> usize {
    let mut run = None;
    let mut batches = 0;
    loop {
        let req = PlanRequest {
            retries: 0,
            pipeline: "warm".into(),
            run: run.clone(),
            workflow: Default::default(),
            started: None,
            execution: None,
            copy: None,
        };
        let first = run
            .as_ref()
            .is_none_or(|r: &handlers::RunState| r.spec.is_empty());
        let outcome = planner
            .dispatch("warm", first, |ctx| handlers::handle_plan(ctx, req.clone()))
            .await
            .unwrap();
        let PlanOutcome::Batch { run: r, batch } = outcome else {
            assert!(matches!(outcome, PlanOutcome::Done { .. }), "{outcome:?}");
            return batches;
        };
        // As the inline Map does: each task's answer (with its result)
        // goes to the commit in `run.results`.
        let mut results = Vec::new();
        for task in &batch.tasks {
            let req = TaskRequest {
                retries: 0,
                pipeline: "warm".into(),
                run: r.clone(),
                batch: batch.batch,
                task: *task,
                merge: None,
                dedup: None,
                carry: true,
            };
            let ack = operator
                .dispatch("warm", false, |ctx| handlers::handle_task(ctx, req.clone()))
                .await
                .unwrap();
            assert!(ack.result.is_some(), "a small result travels: {ack:?}");
            results.push(ack);
        }
        let req = CommitRequest {
            retries: 0,
            action: CommitAction::Commit,
            pipeline: "warm".into(),
            run: handlers::RunState {
                results,
                ..r.clone()
            },
            batch: batch.batch,
            workflow: Default::default(),
            started: None,
        };
        committer
            .dispatch("warm", false, |ctx| {
                handlers::handle_commit(ctx, req.clone())
            })
            .await
            .unwrap();
        batches += 1;
        run = Some(r);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_function_contexts_run_the_spec_registered_since() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 3, 200);
    let toml_a = pipeline_toml("warm", "parquet", "", "max_files_per_batch = 2");
    admin::register(&local_context(&pipeline(root, &toml_a)))
        .await
        .unwrap();
    // Three warm containers, each with spec A cached.
    let (planner, operator, committer) = (contexts(root), contexts(root), contexts(root));
    for c in [&planner, &operator, &committer] {
        let ctx = c.get("warm").await.unwrap();
        assert!(ctx.pipeline.sql.contains("> 1.0"));
    }
    // The pipeline is registered again with another query.
    let sql_b = SQL.replace("> 1.0", "> 2.0");
    let toml_b = toml_a.replace("> 1.0", "> 2.0");
    let p_b = pipeline(root, &toml_b);
    admin::register(&local_context(&p_b)).await.unwrap();

    let batches = run_through(&planner, &operator, &committer).await;
    assert_eq!(batches, 2);
    // Every batch ran the registered query: the output is what spec B
    // gives over all input, by one DuckDB query.
    let expected = duckdb_rows(&files, &sql_b).await;
    assert_eq!(
        committed_rows(&root.join("out/sink"), "warm").await,
        expected
    );
    assert_ne!(
        expected,
        one_shot_rows(&root.join("input")).await,
        "the change must matter"
    );
}

/// The trigger routes with the contexts of every registered pipeline: one
/// registered again since is seen with its new spec, one unregistered is
/// gone, one registered later appears.
#[tokio::test(flavor = "multi_thread")]
async fn the_trigger_sees_pipelines_registered_again_since_it_cached_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 1, 10);
    let toml_a = pipeline_toml("warm", "parquet", "", "");
    admin::register(&local_context(&pipeline(root, &toml_a)))
        .await
        .unwrap();
    let trigger = contexts(root);
    let sqls = |cs: Vec<sluice_engine::handlers::Context>| -> Vec<(String, String)> {
        cs.into_iter()
            .map(|c| (c.pipeline.name.clone(), c.pipeline.sql.clone()))
            .collect()
    };
    let first = sqls(trigger.registered().await.unwrap());
    assert_eq!(first.len(), 1);
    assert!(first[0].1.contains("> 1.0"), "{first:?}");

    let toml_b = toml_a.replace("> 1.0", "> 2.0");
    admin::register(&local_context(&pipeline(root, &toml_b)))
        .await
        .unwrap();
    let other = pipeline_toml("other", "parquet", "", "").replace("out/sink", "out/sink2");
    admin::register(&local_context(&pipeline(root, &other)))
        .await
        .unwrap();
    let second = sqls(trigger.registered().await.unwrap());
    let names: Vec<_> = second.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["other", "warm"]);
    assert!(second[1].1.contains("> 2.0"), "{second:?}");

    std::fs::remove_file(root.join("out/checkpoint/_registry/warm.json")).unwrap();
    let third = sqls(trigger.registered().await.unwrap());
    let names: Vec<_> = third.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["other"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_whose_run_spec_is_no_longer_registered_stops_with_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 1, 200);
    let toml_a = pipeline_toml("warm", "parquet", "", "");
    admin::register(&local_context(&pipeline(root, &toml_a)))
        .await
        .unwrap();
    let (planner, operator) = (contexts(root), contexts(root));
    let req = PlanRequest {
        retries: 0,
        pipeline: "warm".into(),
        run: None,
        workflow: Default::default(),
        started: None,
        execution: None,
        copy: None,
    };
    let PlanOutcome::Batch { run, batch } = planner
        .dispatch("warm", true, |ctx| handlers::handle_plan(ctx, req.clone()))
        .await
        .unwrap()
    else {
        panic!("a batch was planned");
    };
    // Registered again while the run is under way.
    let toml_b = toml_a.replace("> 1.0", "> 2.0");
    admin::register(&local_context(&pipeline(root, &toml_b)))
        .await
        .unwrap();
    let req = TaskRequest {
        retries: 0,
        pipeline: "warm".into(),
        run,
        batch: batch.batch,
        task: 0,
        merge: None,
        dedup: None,
        carry: true,
    };
    let e = operator
        .dispatch("warm", false, |ctx| handlers::handle_task(ctx, req.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.class(), sluice_engine::ErrorClass::Conflict, "{e}");
    assert!(e.to_string().contains("registered again"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupt_checkpoint_records_are_named_not_panicked_on() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 50);
    let toml = pipeline_toml("warm", "parquet", "", "");
    let p = pipeline(root, &toml);
    admin::register(&local_context(&p)).await.unwrap();

    // A task whose plan names an input index past its inputs.
    let ctx = local_context(&p);
    let PlanOutcome::Batch { run, batch } = handlers::plan(&ctx, None).await.unwrap() else {
        panic!("a batch was planned");
    };
    let key = root.join("out/checkpoint/warm/offsets/0000000000.json");
    let mut plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&key).unwrap()).unwrap();
    plan["tasks"][0]["inputs"] = serde_json::json!([99]);
    std::fs::write(&key, serde_json::to_vec(&plan).unwrap()).unwrap();
    let e = handlers::operate(&ctx, &run, batch.batch, 0)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("offsets/0000000000.json"), "{e}");
    assert_eq!(e.class(), sluice_engine::ErrorClass::Fatal, "{e}");

    // A pinned type that is not an Arrow type, in a registered spec.
    let key = root.join("out/checkpoint/warm/pipeline.json");
    let text = std::fs::read_to_string(&key).unwrap();
    let broken = text.replacen("\"bigint\"", "\"bigjnt\"", 1);
    assert_ne!(broken, text);
    std::fs::write(&key, broken).unwrap();
    let e = contexts(root).get("warm").await.unwrap_err();
    assert!(e.to_string().contains("pipeline.json"), "{e}");
    assert!(e.to_string().contains("bigjnt"), "{e}");
}
