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
    // `sluice show` names both, and counts them apart from waiting input.
    let status = sluice_engine::admin::status(&local_context(&p))
        .await
        .unwrap();
    assert_eq!(status.waiting_files, 0);
    assert_eq!(
        status.skipped,
        [
            "\"with\\ttab.parquet\"",
            "\"latin1-\u{fffd}t\u{fffd}.parquet\""
        ],
        "{status:?}"
    );
}

/// The review's case: a local CSV still being written was read half (`67`
/// for `678`), and the rest never, since the key was then processed. A
/// `list`-mode file that changed between listing and reading is left for
/// the next run, which reads it whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_local_file_changed_since_listing_is_left_for_the_next_run() {
    half_written_file_is_read_whole_by_the_next_run("").await;
}

/// The same in `notify` mode, where a local folder's files are found by
/// reconciling: a file whose size is not the one its inbox entry recorded
/// is left for the next run, which finds it in the inbox again (the
/// commit records it anew, with the size the task saw) and reads it whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_local_file_changed_since_notified_is_left_for_the_next_run() {
    half_written_file_is_read_whole_by_the_next_run("discovery = \"notify\"").await;
}

/// Two CSV files under `root/input`, the second cut in the middle of a
/// line (half written); returns the files and the second's whole bytes.
fn half_written_input(root: &std::path::Path) -> (Vec<std::path::PathBuf>, Vec<u8>) {
    let input = root.join("input");
    let files =
        sluice_cli::generator::write_taxi_files(&input, 2, 80, SourceFormat::Csv, None).unwrap();
    let full = std::fs::read(&files[1]).unwrap();
    let cut = full.len() / 2;
    assert_ne!(full[cut - 1], b'\n');
    std::fs::write(&files[1], &full[..cut]).unwrap();
    (files, full)
}

/// Plan a batch with `ctx`, finish writing the half-written file, run the
/// tasks and commit: the first error stops it.
async fn batch_while_the_writer_finishes(
    ctx: &sluice_engine::handlers::Context,
    half: &std::path::Path,
    full: &[u8],
) -> sluice_engine::Result<sluice_engine::checkpoint::Commit> {
    use sluice_engine::handlers::{self, PlanOutcome};
    let PlanOutcome::Batch { run: r, batch } = handlers::plan(ctx, None).await? else {
        panic!("a batch was planned");
    };
    assert_eq!(batch.files, 2);
    std::fs::write(half, full).unwrap();
    for task in &batch.tasks {
        handlers::operate(ctx, &r, batch.batch, *task).await?;
    }
    handlers::commit(ctx, &r, batch.batch).await
}

async fn half_written_file_is_read_whole_by_the_next_run(discovery: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let (files, full) = half_written_input(root);
    let p = pipeline(root, &pipeline_toml("half", "csv", discovery, ""));
    let record = batch_while_the_writer_finishes(&local_context(&p), &files[1], &full)
        .await
        .unwrap();
    assert_eq!(record.files, 1, "{record:?}");
    let key = |f: &std::path::Path| {
        f.strip_prefix(&input)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(record.input_keys, [key(&files[0])]);
    let deferred: Vec<_> = record
        .deferred
        .iter()
        .map(|f| (f.key.clone(), f.size))
        .collect();
    assert_eq!(deferred, [(key(&files[1]), full.len() as u64)]);

    let next = run(&local_context(&p)).await.unwrap();
    assert_eq!(next.batches.iter().map(|b| b.files).sum::<u64>(), 1);
    // Both files, whole.
    assert_eq!(
        committed_rows(&root.join("out/sink"), "half").await,
        one_shot_csv_rows(&input).await
    );
}

/// A batch that defers a file, crashed at each of its writes (plan, tasks,
/// commit: the commit's renewed inbox entry included), then run again:
/// both files are committed whole, once, and nothing uncommitted is left.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_deferring_a_file_crashed_at_each_write_recovers() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    for discovery in ["", "discovery = \"notify\""] {
        let toml = pipeline_toml("halfc", "csv", discovery, "");
        let mut k = 1;
        loop {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path();
            let (files, full) = half_written_input(root);
            let ctx = fault_context(root, &toml, Arc::new(AtomicU64::new(0)), k);
            if batch_while_the_writer_finishes(&ctx, &files[1], &full)
                .await
                .is_ok()
            {
                assert!(k > 5, "{discovery}: only {k} writes");
                break;
            }
            std::fs::write(&files[1], &full).unwrap();
            let again = || async {
                run(&local_context(&pipeline(root, &toml)))
                    .await
                    .unwrap_or_else(|e| panic!("{discovery} rerun after failing write {k}: {e}"))
            };
            let first = again().await;
            // A file deferred by the recovered batch is taken by the next run.
            again().await;
            let expected = one_shot_csv_rows(&root.join("input")).await;
            assert_recovered(root, "halfc", &first.end, &expected, k).await;
            k += 1;
        }
    }
}

/// The review's case: an SQL error at run time (`CAST(store_and_fwd_flag
/// AS INT)` on `N`) was blamed on the input file ("fix or replace the
/// file"). The file reads fine; the error says the query is at fault.
#[tokio::test(flavor = "multi_thread")]
async fn a_query_failing_on_values_is_blamed_on_the_query_not_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 1, 50);
    let toml = pipeline_toml("castq", "parquet", "", "").replace(
        SQL,
        "SELECT CAST(store_and_fwd_flag AS INT) AS flag FROM trips",
    );
    let p = pipeline(root, &toml);
    let err = run(&local_context(&p)).await.unwrap_err().to_string();
    assert!(
        err.contains("query.sql fails on its values") && err.contains("TRY_CAST"),
        "{err}"
    );
    assert!(!err.contains("replace the file"), "{err}");
}

/// A file deleted between planning and reading has nothing left to
/// process: its batch commits the other files, the commit record names it
/// under `gone` (not among the batch's inputs, so a file uploaded again
/// under that key is read then), and nothing fails. Before: the task's
/// check of the local file failed the batch ("head ...: not found"), and
/// every run planned and failed it again until the plan was deleted.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_deleted_after_planning_is_left_out_of_its_batch() {
    use sluice_engine::handlers::{self, PlanOutcome};
    for (discovery, format) in [
        ("", "parquet"),
        ("discovery = \"ordered\"", "parquet"),
        ("", "csv"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let input = root.join("input");
        let files = sluice_cli::generator::write_taxi_files(
            &input,
            3,
            50,
            if format == "csv" {
                SourceFormat::Csv
            } else {
                SourceFormat::Parquet
            },
            None,
        )
        .unwrap();
        let p = pipeline(root, &pipeline_toml("gone", format, discovery, ""));
        let ctx = local_context(&p);
        let PlanOutcome::Batch { run: r, batch } = handlers::plan(&ctx, None).await.unwrap() else {
            panic!("a batch was planned");
        };
        assert_eq!(batch.files, 3);
        std::fs::remove_file(&files[1]).unwrap();
        for task in &batch.tasks {
            handlers::operate(&ctx, &r, batch.batch, *task)
                .await
                .unwrap_or_else(|e| panic!("{discovery} {format}: {e}"));
        }
        let record = handlers::commit(&ctx, &r, batch.batch).await.unwrap();
        let key = files[1].strip_prefix(&input).unwrap().to_str().unwrap();
        assert_eq!(record.gone, [key], "{discovery} {format}");
        assert_eq!(record.files, 2);
        assert!(!record.input_keys.iter().any(|k| k == key));
        handlers::release(&ctx, &r, sluice_engine::checkpoint::RunStatus::Idle)
            .await
            .unwrap();
        let left = [files[0].clone(), files[2].clone()];
        let expected = if format == "csv" {
            one_shot_csv_rows(&input).await
        } else {
            duckdb_rows(&left, SQL).await
        };
        assert_eq!(
            committed_rows(&root.join("out/sink"), "gone").await,
            expected,
            "{discovery} {format}"
        );
    }
}

/// Plan a batch with `ctx`, delete `doomed` from the source, run the tasks
/// and commit: the first error stops it (the file is deleted either way).
async fn batch_losing_a_file(
    ctx: &sluice_engine::handlers::Context,
    doomed: &std::path::Path,
) -> sluice_engine::Result<sluice_engine::checkpoint::Commit> {
    use sluice_engine::handlers::{self, PlanOutcome};
    let planned = handlers::plan(ctx, None).await;
    std::fs::remove_file(doomed).unwrap();
    let PlanOutcome::Batch { run: r, batch } = planned? else {
        panic!("a batch was planned");
    };
    for task in &batch.tasks {
        handlers::operate(ctx, &r, batch.batch, *task).await?;
    }
    handlers::commit(ctx, &r, batch.batch).await
}

/// A batch leaving out a deleted file, crashed at each of its writes, then
/// run again: the other files are committed once and nothing uncommitted
/// is left.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_losing_a_file_crashed_at_each_write_recovers() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    let toml = pipeline_toml("gonec", "parquet", "", "");
    let mut k = 1;
    loop {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files = gen_files(&root.join("input"), 3, 40);
        let ctx = fault_context(root, &toml, Arc::new(AtomicU64::new(0)), k);
        if batch_losing_a_file(&ctx, &files[1]).await.is_ok() {
            assert!(k > 5, "only {k} writes");
            break;
        }
        let again = run(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        let expected = duckdb_rows(&[files[0].clone(), files[2].clone()], SQL).await;
        assert_recovered(root, "gonec", &again.end, &expected, k).await;
        k += 1;
    }
}

/// The review's case: a 0-byte CSV stopped the pipeline ("column id is
/// missing") under `on_bad_file = "fail"` and `"quarantine"` alike. It holds
/// no rows: the batch commits the other files, the empty one counts as
/// processed (not quarantined, not read again), and the output equals
/// DuckDB's over the non-empty files.
#[tokio::test(flavor = "multi_thread")]
async fn a_zero_byte_csv_is_a_file_with_no_rows() {
    for policy in ["fail", "quarantine"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let input = root.join("input");
        let files = sluice_cli::generator::write_taxi_files(&input, 2, 40, SourceFormat::Csv, None)
            .unwrap();
        let toml = pipeline_toml(
            "empty",
            "csv",
            &format!("on_bad_file = \"{policy}\""),
            "max_files_per_batch = 10",
        );
        let p = pipeline(root, &toml);
        run(&local_context(&p)).await.unwrap();
        std::fs::write(input.join("trips-zero.csv"), b"").unwrap();
        let more = sluice_cli::generator::write_taxi_files(&input, 1, 40, SourceFormat::Csv, None)
            .unwrap();
        let s = run(&local_context(&p))
            .await
            .unwrap_or_else(|e| panic!("{policy}: {e}"));
        assert_eq!(s.batches.len(), 1, "{policy}");
        let control = control_of(root, &toml).await;
        assert_eq!(
            control.totals.files, 4,
            "{policy}: the empty file is processed"
        );
        assert!(
            control.quarantined.is_empty(),
            "{policy}: {:?}",
            control.quarantined
        );
        let all: Vec<_> = files.iter().chain(&more).cloned().collect();
        let cols = "\"VendorID\", \"PULocationID\", trip_distance, fare_amount, \
                    round(surcharges, 6)";
        let want = duckdb_sql(&format!(
            "SELECT {cols} FROM (SELECT *, total_amount - fare_amount AS surcharges FROM \
             read_csv([{}])) WHERE trip_distance > 1.0",
            quoted(&all)
        ))
        .await;
        let got = manifest_rows(&root.join("out/sink"), "empty", cols, "").await;
        assert!(!want.is_empty());
        assert_eq!(got, want, "{policy}");
        // Nothing is read again: the next run is idle.
        let idle = run(&local_context(&p)).await.unwrap();
        assert!(idle.batches.is_empty(), "{policy}");
    }
}

/// The review's cases: symlinked input. The listing sized the link, the
/// check before the read its target: in `ordered` mode every run failed
/// "changed since it was listed" and the files behind waited forever; in
/// `list` mode the file was never read and every run committed an empty
/// batch; a dangling link made an empty batch every run; a link loop failed
/// every run. A link is now followed, the same in listing and reading; one
/// that leads nowhere or loops is skipped (named by `sluice show`). The
/// output equals DuckDB's over the files the links lead to, and the next
/// run is idle.
#[tokio::test(flavor = "multi_thread")]
async fn symlinked_input_is_followed_and_broken_links_are_skipped() {
    for discovery in ["list", "ordered"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let input = root.join("input");
        let real = gen_files(&input, 1, 30);
        let elsewhere = root.join("elsewhere");
        let outside = gen_files(&elsewhere, 1, 30);
        std::os::unix::fs::symlink(&outside[0], input.join("trips-linked.parquet")).unwrap();
        std::os::unix::fs::symlink(
            root.join("nothing.parquet"),
            input.join("trips-dangling.parquet"),
        )
        .unwrap();
        std::fs::create_dir_all(input.join("sub")).unwrap();
        std::os::unix::fs::symlink(&input, input.join("sub/loop")).unwrap();
        let toml = pipeline_toml(
            "links",
            "parquet",
            &format!("discovery = \"{discovery}\""),
            "max_files_per_batch = 10",
        );
        let p = pipeline(root, &toml);
        let s = run(&local_context(&p))
            .await
            .unwrap_or_else(|e| panic!("{discovery}: {e}"));
        assert_eq!(
            s.batches.iter().map(|b| b.files).sum::<u64>(),
            2,
            "{discovery}: the file and the link"
        );
        let files = vec![real[0].clone(), outside[0].clone()];
        assert_eq!(
            committed_rows(&root.join("out/sink"), "links").await,
            duckdb_rows(&files, SQL).await,
            "{discovery}"
        );
        let again = run(&local_context(&p)).await.unwrap();
        assert!(again.batches.is_empty(), "{discovery}: {again:?}");
        let status = sluice_engine::admin::status(&local_context(&p))
            .await
            .unwrap();
        assert!(
            status
                .skipped
                .iter()
                .any(|s| s.contains("trips-dangling.parquet")),
            "{discovery}: {:?}",
            status.skipped
        );
    }
}
