//! A sink belongs to one pipeline and one history of it: starting over
//! without `sluice reset` and sharing a sink between pipelines are refused
//! (they mixed or deleted committed output), and `sluice reset` starts over
//! cleanly, even when interrupted at any write.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_engine::admin;
use sluice_engine::handlers::{self, Context, PlanOutcome};

use crate::support::*;

/// Every file under `dir` with its bytes, sorted.
fn snapshot(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).into_iter().flatten() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

fn manifests(sink: &std::path::Path) -> usize {
    std::fs::read_dir(sink.join("_sluice/manifest"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The review's case: 6 batches of 1 file, the checkpoint folder deleted
/// "to start over", then 4 files per batch. Before, manifests 2-5 of the
/// old history stayed beside the new 0-1 and a reader of the manifests got
/// 9,905 rows instead of 5,930. Now the second run is refused and the sink
/// is untouched; `reset` starts over with one history.
#[tokio::test(flavor = "multi_thread")]
async fn starting_over_needs_reset_and_reset_leaves_one_history() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 6, 300);
    let sink = root.join("out/sink");
    let one = pipeline(
        root,
        &pipeline_toml("taxi", "parquet", "", "max_files_per_batch = 1"),
    );
    assert_eq!(run(&local_context(&one)).await.unwrap().batches.len(), 6);
    let expected = one_shot_rows(&root.join("input")).await;
    let before = snapshot(&sink);

    std::fs::remove_dir_all(root.join("out/checkpoint")).unwrap();
    let four = pipeline(
        root,
        &pipeline_toml("taxi", "parquet", "", "max_files_per_batch = 4"),
    );
    let err = run(&local_context(&four)).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("another history") && msg.contains("sluice reset"),
        "{msg}"
    );
    assert_eq!(err.class(), sluice_engine::ErrorClass::InvalidInput);
    assert_eq!(snapshot(&sink), before, "a refused run changed the sink");

    let report = admin::reset(&local_context(&four)).await.unwrap();
    assert!(report.sink_objects >= 13, "{report:?}"); // 6 parts, 6 manifests, owner
    assert_eq!(globbed_rows(&sink).await, Vec::<String>::new());
    assert_eq!(manifests(&sink), 0);
    assert_eq!(run(&local_context(&four)).await.unwrap().batches.len(), 2);
    assert_eq!(manifests(&sink), 2);
    assert_eq!(committed_rows(&sink, "taxi").await, expected);
    let mut globbed = globbed_rows(&sink).await;
    globbed.sort();
    assert_eq!(globbed, expected);
}

/// The review's case: `taxi2` copied from `taxi` with the same sink. Before,
/// taxi2's commit deleted taxi's parts and overwrote its manifests. Now
/// taxi2 is refused before it writes anything.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_pipeline_cannot_write_into_another_pipelines_sink() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 3, 200);
    let sink = root.join("out/sink");
    let taxi = pipeline(
        root,
        &pipeline_toml("taxi", "parquet", "", "max_files_per_batch = 2"),
    );
    run(&local_context(&taxi)).await.unwrap();
    let before = snapshot(&sink);
    let expected = committed_rows(&sink, "taxi").await;
    assert_eq!(expected, one_shot_rows(&root.join("input")).await);

    let taxi2 = pipeline(
        root,
        &pipeline_toml("taxi2", "parquet", "", "max_files_per_batch = 2"),
    );
    let err = run(&local_context(&taxi2)).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("holds the output of pipeline \"taxi\""),
        "{err}"
    );
    assert_eq!(snapshot(&sink), before, "taxi2 changed taxi's sink");
    // The owner keeps running there.
    gen_files(&root.join("input"), 1, 50);
    run(&local_context(&taxi)).await.unwrap();
    assert_eq!(
        committed_rows(&sink, "taxi").await,
        one_shot_rows(&root.join("input")).await
    );
}

/// A sink with manifests but no owner record: adopted when they are this
/// checkpoint's committed batches (a sink written before owner records
/// existed), refused when this checkpoint never committed them.
#[tokio::test(flavor = "multi_thread")]
async fn a_sink_without_owner_is_adopted_only_if_its_manifests_are_ours() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 100);
    let sink = root.join("out/sink");
    let p = pipeline(
        root,
        &pipeline_toml("old", "parquet", "", "max_files_per_batch = 1"),
    );
    run(&local_context(&p)).await.unwrap();
    std::fs::remove_file(sink.join("_sluice/sink.json")).unwrap();
    gen_files(&root.join("input"), 1, 50);
    run(&local_context(&p)).await.unwrap();
    assert!(sink.join("_sluice/sink.json").exists(), "adopted");
    assert_eq!(
        committed_rows(&sink, "old").await,
        one_shot_rows(&root.join("input")).await
    );

    // Another pipeline's sink without owner record.
    let other = tempfile::tempdir().unwrap();
    gen_files(&other.path().join("input"), 1, 50);
    std::fs::create_dir_all(other.path().join("out/sink/_sluice/manifest")).unwrap();
    std::fs::copy(
        sink.join("_sluice/manifest/0000000000.json"),
        other
            .path()
            .join("out/sink/_sluice/manifest/0000000000.json"),
    )
    .unwrap();
    let q = pipeline(other.path(), &pipeline_toml("new", "parquet", "", ""));
    let err = run(&local_context(&q)).await.unwrap_err();
    assert!(
        err.to_string().contains("manifests of batches 0..=0"),
        "{err}"
    );
}

/// `reset` is refused while a live run holds the lease.
#[tokio::test(flavor = "multi_thread")]
async fn reset_waits_for_a_live_run() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 1, 50);
    let p = pipeline(root, &pipeline_toml("live", "parquet", "", ""));
    let PlanOutcome::Batch { .. } = handlers::plan(&local_context(&p), None).await.unwrap() else {
        panic!("a batch was planned");
    };
    // This process holds the lease and is alive.
    let err = admin::reset(&Context::open(p.clone(), None).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.class(), sluice_engine::ErrorClass::Conflict, "{err}");
    assert!(err.to_string().contains("holds the lease"), "{err}");
}

/// Fail each write of `reset` in turn: until it is run again to the end no
/// run starts, and after it the next run gives exactly the clean output of
/// one history.
#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_of_reset_then_resetting_again_gives_one_history() {
    let toml = pipeline_toml("rs", "parquet", "", "max_files_per_batch = 1");
    let setup = |root: &std::path::Path| {
        gen_files(&root.join("input"), 3, 100);
    };
    // A clean reset, counting its writes.
    let clean = tempfile::tempdir().unwrap();
    setup(clean.path());
    run(&fault_context(
        clean.path(),
        &toml,
        Arc::new(AtomicU64::new(0)),
        0,
    ))
    .await
    .unwrap();
    let writes = Arc::new(AtomicU64::new(0));
    admin::reset(&fault_context(clean.path(), &toml, writes.clone(), 0))
        .await
        .unwrap();
    let total = writes.load(Ordering::SeqCst);
    assert!(total >= 10, "only {total} writes");
    let expected = one_shot_rows(&clean.path().join("input")).await;

    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        setup(root);
        let ctx = || fault_context(root, &toml, Arc::new(AtomicU64::new(0)), 0);
        run(&ctx()).await.unwrap();
        let failed =
            admin::reset(&fault_context(root, &toml, Arc::new(AtomicU64::new(0)), k)).await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        if k > 1 {
            // The resetting mark is written: no run starts.
            let refused = run(&ctx()).await.unwrap_err();
            assert!(
                refused.to_string().contains("reset"),
                "after write {k}: {refused}"
            );
        }
        admin::reset(&ctx())
            .await
            .unwrap_or_else(|e| panic!("reset again after failing write {k}: {e}"));
        // Only the owner record is left, saying the output up to here is
        // retired (it keeps the next history past the retired batch
        // numbers).
        let left: Vec<String> = snapshot(&root.join("out/sink"))
            .into_iter()
            .map(|(p, _)| p)
            .filter(|p| !p.rsplit('/').next().unwrap().starts_with('.'))
            .collect();
        assert_eq!(
            left,
            [root
                .join("out/sink/_sluice/sink.json")
                .display()
                .to_string()],
            "after failing write {k}, the sink still holds files"
        );
        let owner = sluice_engine::sinks::ParquetSink::new(
            Arc::new(sluice_engine::storage::LocalStore::new(
                root.join("out/sink"),
            )),
            "rs",
        )
        .owner()
        .await
        .unwrap()
        .unwrap();
        assert_eq!(owner.history, "", "after failing write {k}");
        assert_eq!(owner.first_batch, 3, "after failing write {k}");
        let summary = run(&ctx()).await.unwrap();
        assert_eq!(summary.batches.len(), 3, "after failing write {k}");
        assert_recovered(root, "rs", &summary.end, &expected, k).await;
    }
}

/// Found while testing deferral: CSV inference types a timestamp column in
/// seconds, which Parquet has no logical type for; the sink wrote it as a
/// bare INT64 and DuckDB (as Athena or Spark) read integers. A reader that
/// globs the sink now reads the timestamps a one-shot query over the CSV
/// files gives.
#[tokio::test(flavor = "multi_thread")]
async fn csv_timestamps_reach_a_glob_reader_as_timestamps() {
    use sluice_engine::pipeline::SourceFormat;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    sluice_cli::generator::write_taxi_files(&input, 2, 30, SourceFormat::Csv, None).unwrap();
    let p = pipeline(root, &pipeline_toml("ts", "csv", "", ""));
    run(&local_context(&p)).await.unwrap();
    let mut globbed = globbed_rows(&root.join("out/sink")).await;
    globbed.sort();
    let expected = one_shot_csv_rows(&input).await;
    assert!(expected[0].contains("2024-01-01T"), "{}", expected[0]);
    assert_eq!(globbed, expected);
}

/// Moving `sink.uri` of a pipeline with history would leave the new sink
/// with only later batches: refused, naming both; `sluice reset` starts
/// over in the new sink (the old one is left as it is).
#[tokio::test(flavor = "multi_thread")]
async fn changing_the_sink_of_a_pipeline_with_history_is_refused_until_reset() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 2, 100);
    let toml = pipeline_toml("moved", "parquet", "", "");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let old = snapshot(&root.join("out/sink"));
    gen_files(&root.join("input"), 1, 100);
    let moved = toml.replace("uri = \"out/sink\"", "uri = \"out/sink2\"");
    let p = pipeline(root, &moved);
    let err = run(&local_context(&p)).await.unwrap_err().to_string();
    assert!(
        err.contains("sink.uri changed") && err.contains("sink2") && err.contains("sluice reset"),
        "{err}"
    );
    assert_eq!(snapshot(&root.join("out/sink")), old);
    admin::reset(&local_context(&p)).await.unwrap();
    run(&local_context(&p)).await.unwrap();
    let all: Vec<_> = std::fs::read_dir(root.join("input/date=2024-01-01"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(all.len(), files.len() + 1);
    assert_eq!(
        committed_rows(&root.join("out/sink2"), "moved").await,
        duckdb_rows(&all, SQL).await
    );
    assert_eq!(
        snapshot(&root.join("out/sink")),
        old,
        "the old sink is left as it is"
    );
}

/// The review's case: a sink nested inside another pipeline's sink was
/// accepted, and the outer sink's glob readers then read the inner
/// pipeline's rows as the outer's. Refused now both ways (inner inside an
/// outer sink, and an outer sink around an inner one), before anything is
/// written.
#[tokio::test(flavor = "multi_thread")]
async fn a_sink_inside_another_pipelines_sink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 1, 30);
    let outer = pipeline(root, &pipeline_toml("outer", "parquet", "", ""));
    run(&local_context(&outer)).await.unwrap();
    let before = snapshot(&root.join("out/sink"));
    let inner_toml = pipeline_toml("inner", "parquet", "", "")
        .replace("uri = \"out/sink\"", "uri = \"out/sink/nested\"")
        .replace("uri = \"out/checkpoint\"", "uri = \"inner/checkpoint\"");
    let err = run(&local_context(&pipeline(root, &inner_toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("lies inside the sink of pipeline \"outer\""),
        "{err}"
    );
    assert_eq!(
        snapshot(&root.join("out/sink")),
        before,
        "the outer sink changed"
    );

    // The other way round: a pipeline whose sink would hold another's.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 1, 30);
    let inner = pipeline(
        root,
        &pipeline_toml("inner", "parquet", "", "")
            .replace("uri = \"out/sink\"", "uri = \"out/sink/nested\""),
    );
    run(&local_context(&inner)).await.unwrap();
    let outer_toml = pipeline_toml("outer", "parquet", "", "")
        .replace("uri = \"out/checkpoint\"", "uri = \"outer/checkpoint\"");
    let err = run(&local_context(&pipeline(root, &outer_toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds the sink of another pipeline"), "{err}");
}
