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
