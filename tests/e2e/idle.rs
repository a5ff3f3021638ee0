//! A run with nothing new reads at most two objects and writes nothing.

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn idle_run_makes_at_most_two_requests_and_writes_nothing() {
    for discovery in ["discovery = \"list\"", "discovery = \"ordered\""] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        gen_files(&root.join("input"), 3, 50);
        let p = pipeline(root, &pipeline_toml("idle", "parquet", discovery, ""));
        let first = run(&local_context(&p)).await.unwrap();
        assert_eq!(first.batches.len(), 1);

        // A new process: fresh counters.
        let ctx = local_context(&p);
        let idle = run(&ctx).await.unwrap();
        assert!(
            matches!(idle.end, sluice_engine::runner::RunEnd::Idle(_)),
            "{:?}",
            idle.end
        );
        assert!(idle.batches.is_empty());
        assert!(idle.requests.total() <= 2, "{discovery}: {}", idle.requests);
        assert_eq!(
            idle.requests.writes() + idle.requests.delete,
            0,
            "{}",
            idle.requests
        );

        // New data is still seen after an idle run.
        gen_files(&root.join("input"), 1, 50);
        let next = run(&local_context(&p)).await.unwrap();
        assert_eq!(next.batches.iter().map(|b| b.files).sum::<u64>(), 1);
    }
}

/// A run a trigger started that finds nothing is recorded apart as an
/// idle run (its ending: one Plan invocation and, on Express, one
/// execution), which `sluice cost` prices an idle run from, not from the
/// mean ending of runs that committed batches.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_run_is_recorded_apart_and_priced_from_itself() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 100);
    let toml = pipeline_toml("idler", "parquet", "", "");
    let ctx = local_context(&pipeline(root, &toml));
    runner().run(&ctx, |_| {}).await.unwrap();
    let input = claim_express(&ctx).await;
    let ran = runner()
        .starting(sluice_engine::deploy::Workflow::Express)
        .execute(&ctx, input, |_| {})
        .await
        .unwrap();
    assert!(ran.batches.is_empty());
    let totals = control_of(root, &toml).await.totals;
    assert_eq!((totals.runs, totals.idle_runs), (2, 1), "{totals:?}");
    assert_eq!(totals.idle_ends.express.executions, 1, "{totals:?}");
    assert_eq!(
        totals
            .idle_ends
            .functions
            .iter()
            .map(|f| (f.function.as_str(), f.invocations))
            .collect::<Vec<_>>(),
        vec![("planner", 1)]
    );
    let commits = commit_records(root, &toml).await;
    let prices = sluice_engine::cost::Prices::default_table();
    let r = sluice_engine::cost::report(&commits, &totals, &prices, "t", Default::default());
    // The idle run's ending by hand: its Plan (GB-s at the planner's
    // memory, one request), its Express execution, its requests; and the
    // trigger's wakes shared over both runs.
    let e = &totals.idle_ends;
    let planner = &e.functions[0];
    let lambda = planner.billed_ms as f64 / 1000.0 * planner.memory_mb as f64 / 1024.0
        * prices.lambda_gb_second()
        + prices.lambda.per_request;
    let sfn = prices.step_functions.express_per_request
        + e.express.billed_ms as f64 / 1000.0 * 64.0 / 1024.0
            * prices.step_functions.express_per_gb_second;
    let q = &totals.idle_end_requests;
    let s3 = (q.put + q.put_create + q.put_update + q.list) as f64 / 1000.0
        * prices.s3.put_copy_post_list_per_1000
        + q.get as f64 / 1000.0 * prices.s3.get_head_per_1000;
    let wakes =
        sluice_engine::cost::bill(&totals.wakes, &totals.wake_requests, &prices).total() / 2.0;
    let by_hand = lambda + sfn + s3 + wakes;
    assert!(
        (r.idle_run.total() - by_hand).abs() < 1e-12,
        "idle run priced {} vs by hand {by_hand}",
        r.idle_run.total()
    );
}
