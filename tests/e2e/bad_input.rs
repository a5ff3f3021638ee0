//! Bad input fails the batch naming the key, leaves the checkpoint's
//! committed state and the committed output unchanged, and the next run
//! succeeds once the file is fixed.

use sluice_engine::pipeline::SourceFormat;

use crate::support::*;

async fn committed_state(
    root: &std::path::Path,
    toml: &str,
) -> (Option<u64>, Vec<String>, Vec<String>) {
    let p = pipeline(root, toml);
    let ctx = local_context(&p);
    let control = ctx.checkpoint.control().await.unwrap().unwrap().0;
    let list = |prefix: &'static str| {
        let store = ctx.checkpoint.store().clone();
        async move {
            store
                .list(prefix, None)
                .await
                .unwrap()
                .into_iter()
                .map(|m| m.key)
                .collect::<Vec<_>>()
        }
    };
    let mut keys = list("commits/").await;
    keys.extend(list("offsets/").await);
    let sink: Vec<String> = ctx
        .sink
        .store()
        .list("", None)
        .await
        .unwrap()
        .into_iter()
        .map(|m| format!("{} {}", m.key, m.size))
        .collect();
    (control.last_committed, keys, sink)
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupt_and_truncated_parquet_fail_cleanly_and_recover() {
    corrupt_and_truncated("max_files_per_batch = 2").await;
}

/// The same through the Distributed Map: one task per file, more tasks
/// than `max_inline_tasks`. Its failure names no error, so the settle step
/// finds the task's refusal and abandons the batch the same way.
#[tokio::test(flavor = "multi_thread")]
async fn corrupt_parquet_under_a_distributed_map_fails_cleanly_and_recovers() {
    corrupt_and_truncated("max_files_per_batch = 2\nmax_bytes_per_task = 1\nmax_inline_tasks = 1")
        .await;
}

async fn corrupt_and_truncated(limits: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    gen_files(&input, 2, 100);
    let toml = pipeline_toml("bad", "parquet", "", limits);
    let p = pipeline(root, &toml);
    run(&local_context(&p)).await.unwrap();
    let before = committed_state(root, &toml).await;
    let rows_before = committed_rows(&root.join("out/sink"), "bad").await;

    // File 2 is garbage, file 3 is a valid file cut in half.
    let good = gen_files(&input, 2, 100);
    std::fs::write(&good[0], b"this is not parquet at all, not even close").unwrap();
    let full = std::fs::read(&good[1]).unwrap();
    std::fs::write(&good[1], &full[..full.len() / 2]).unwrap();

    for (broken, name) in [
        (&good[0], "trips-000002.parquet"),
        (&good[1], "trips-000003.parquet"),
    ] {
        let err = run(&local_context(&p)).await.unwrap_err();
        let msg = err.to_string();
        assert_eq!(
            err.class(),
            sluice_engine::ErrorClass::InvalidInput,
            "{msg}"
        );
        assert!(msg.contains(name), "error must name {name}: {msg}");
        assert!(
            msg.contains("run again"),
            "error must say what to do: {msg}"
        );
        assert_eq!(
            committed_state(root, &toml).await,
            before,
            "checkpoint or output changed"
        );
        assert_eq!(
            committed_rows(&root.join("out/sink"), "bad").await,
            rows_before
        );
        // Fix this file (same key) and go on to the next broken one.
        let i: u64 = name[6..12].parse().unwrap();
        let bytes = sluice_cli::generator::encode(
            &sluice_cli::generator::taxi_batch(i, 100),
            SourceFormat::Parquet,
            None,
        )
        .unwrap();
        std::fs::write(broken, bytes).unwrap();
    }
    let ok = run(&local_context(&p)).await.unwrap();
    assert_eq!(ok.batches.iter().map(|b| b.files).sum::<u64>(), 2);
    assert_eq!(
        committed_rows(&root.join("out/sink"), "bad").await,
        one_shot_rows(&input).await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_csv_line_that_does_not_fit_the_schema_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    sluice_cli::generator::write_taxi_files(&input, 2, 50, SourceFormat::Csv, None).unwrap();
    let toml = pipeline_toml("badcsv", "csv", "", "max_files_per_batch = 10");
    let p = pipeline(root, &toml);
    run(&local_context(&p)).await.unwrap();
    let added =
        sluice_cli::generator::write_taxi_files(&input, 1, 50, SourceFormat::Csv, None).unwrap();
    let mut text = std::fs::read_to_string(&added[0]).unwrap();
    text.push_str("1,not-a-time,x\n");
    std::fs::write(&added[0], text).unwrap();
    let err = run(&local_context(&p)).await.unwrap_err().to_string();
    assert!(err.contains("trips-000002.csv"), "{err}");
}

/// The review's case: a local file name with a tab, or one that is not
/// UTF-8, was listed under a mangled key, then "not found" on every run for
/// ever. Such files are skipped with a warning; the rest is processed.
#[tokio::test(flavor = "multi_thread")]
async fn files_whose_names_cannot_be_keys_are_skipped_not_failed_on() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let files = gen_files(&input, 2, 100);
    let tab = input.join("with\ttab.parquet");
    std::fs::copy(&files[0], &tab).unwrap();
    let bad_utf8 = input.join(std::ffi::OsStr::from_bytes(b"latin1-\xe9t\xe9.parquet"));
    std::fs::copy(&files[1], &bad_utf8).unwrap();

    let p = pipeline(root, &pipeline_toml("odd", "parquet", "", ""));
    let summary = run(&local_context(&p)).await.unwrap();
    assert_eq!(summary.batches.iter().map(|b| b.files).sum::<u64>(), 2);
    assert_eq!(
        committed_rows(&root.join("out/sink"), "odd").await,
        duckdb_rows(&files, SQL).await
    );
    // And the next run is idle, not failing on them.
    let again = run(&local_context(&p)).await.unwrap();
    assert!(again.batches.is_empty(), "{again:?}");
}

/// The review's case: a local CSV still being written was read half (`67`
/// for `678`), and the rest never, since the key was then processed. A
/// `list`-mode file that changed between listing and reading is left for
/// the next run, which reads it whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_local_file_changed_since_listing_is_left_for_the_next_run() {
    use sluice_engine::handlers::{self, PlanOutcome};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let files =
        sluice_cli::generator::write_taxi_files(&input, 2, 80, SourceFormat::Csv, None).unwrap();
    let full = std::fs::read(&files[1]).unwrap();
    // Half written: cut in the middle of a line.
    let cut = full.len() / 2;
    assert_ne!(full[cut - 1], b'\n');
    std::fs::write(&files[1], &full[..cut]).unwrap();
    let p = pipeline(root, &pipeline_toml("half", "csv", "", ""));
    let ctx = local_context(&p);
    let PlanOutcome::Batch { run: r, batch } = handlers::plan(&ctx, None).await.unwrap() else {
        panic!("a batch was planned");
    };
    assert_eq!(batch.files, 2);
    // The writer finishes while the batch runs.
    std::fs::write(&files[1], &full).unwrap();
    for task in &batch.tasks {
        handlers::operate(&ctx, &r, batch.batch, *task)
            .await
            .unwrap();
    }
    let record = handlers::commit(&ctx, &r, batch.batch).await.unwrap();
    assert_eq!(record.files, 1, "{record:?}");
    let first = files[0].strip_prefix(&input).unwrap().to_str().unwrap();
    assert_eq!(record.input_keys, [first]);

    let next = run(&local_context(&p)).await.unwrap();
    assert_eq!(next.batches.iter().map(|b| b.files).sum::<u64>(), 1);
    // Both files, whole: a one-shot DataFusion query over the CSV files.
    let one_shot = datafusion::prelude::SessionContext::new();
    one_shot
        .register_csv(
            "trips",
            input.to_str().unwrap(),
            datafusion::prelude::CsvReadOptions::new(),
        )
        .await
        .unwrap();
    let expected = rows_of(&one_shot.sql(SQL).await.unwrap().collect().await.unwrap());
    assert_eq!(
        committed_rows(&root.join("out/sink"), "half").await,
        expected
    );
}
