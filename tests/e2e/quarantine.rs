//! `on_bad_file = "quarantine"`: a file that cannot be read is set aside
//! with the reason, the batch commits the rest, and the file waits for
//! `sluice retry-quarantined`, which reads it once after it was fixed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_engine::admin;
use sluice_engine::paths;

use crate::support::*;

fn toml(limits: &str) -> String {
    pipeline_toml("quar", "parquet", "on_bad_file = \"quarantine\"", limits)
}

/// Four good files and three poison ones: not Parquet at all, cut in half
/// (no footer), and one whose footer is intact but whose data pages are
/// overwritten (it fails only when the scan reads them). Returns (good,
/// poison) paths.
fn poisoned_input(root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let input = root.join("input");
    let files = gen_files(&input, 7, 400);
    let (good, poison) = (files[..4].to_vec(), files[4..].to_vec());
    std::fs::write(&poison[0], b"this is not parquet at all").unwrap();
    let full = std::fs::read(&poison[1]).unwrap();
    std::fs::write(&poison[1], &full[..full.len() / 2]).unwrap();
    let mut pages = std::fs::read(&poison[2]).unwrap();
    let n = pages.len();
    pages[8..n / 2].fill(0xAB);
    std::fs::write(&poison[2], &pages).unwrap();
    (good, poison)
}

fn key(root: &Path, f: &Path) -> String {
    f.strip_prefix(root.join("input"))
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

/// What the quarantine holds after a run: control's entries (key, batch)
/// and the keys of every `_quarantine/batch=N/files.json` in the sink.
async fn quarantine_state(root: &Path) -> (Vec<(String, u64)>, Vec<String>) {
    let ctx = local_context(&pipeline(root, &toml("")));
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    let mut entries: Vec<(String, u64)> = c
        .quarantined
        .iter()
        .map(|q| (q.key.clone(), q.batch))
        .collect();
    entries.sort();
    let mut recorded = Vec::new();
    for m in ctx.sink.store().list("_quarantine/", None).await.unwrap() {
        let body = ctx.sink.store().get(&m.key).await.unwrap().unwrap();
        let files: Vec<sluice_engine::checkpoint::Quarantined> =
            serde_json::from_slice(&body.bytes).unwrap();
        recorded.extend(files.into_iter().map(|q| q.key));
    }
    recorded.sort();
    (entries, recorded)
}

/// The review's case: one poison upload stopped every later run. Under
/// quarantine the good files commit, each poison file is recorded with its
/// reason (in the commit record, under the sink's `_quarantine/`, in
/// `sluice show`), later runs do not retry it, and once it is replaced
/// `sluice retry-quarantined` reads it exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn poison_files_are_quarantined_and_read_once_after_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (good, poison) = poisoned_input(root);
    let p = pipeline(root, &toml("max_files_per_batch = 20"));
    let summary = run(&local_context(&p)).await.unwrap();
    assert_eq!(summary.batches.len(), 1, "{summary:?}");
    assert_eq!(
        (summary.batches[0].files, summary.batches[0].quarantined),
        (4, 3)
    );
    let sink = root.join("out/sink");
    assert_eq!(
        committed_rows(&sink, "quar").await,
        duckdb_rows(&good, SQL).await
    );
    let mut globbed = globbed_rows(&sink).await;
    globbed.sort();
    assert_eq!(
        globbed,
        duckdb_rows(&good, SQL).await,
        "the quarantine is not output"
    );

    let ctx = local_context(&p);
    let record = ctx.checkpoint.commit(0).await.unwrap().unwrap();
    let mut want: Vec<String> = poison.iter().map(|f| key(root, f)).collect();
    want.sort();
    let named: Vec<String> = record.quarantined.iter().map(|q| q.key.clone()).collect();
    assert_eq!(named, want);
    assert!(
        record.quarantined.iter().all(|q| !q.reason.is_empty()),
        "{:?}",
        record.quarantined
    );
    let (entries, recorded) = quarantine_state(root).await;
    assert_eq!(recorded, want);
    assert_eq!(
        entries.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        want
    );
    assert!(
        sink.join(paths::sink::quarantined_files(0)).exists(),
        "no quarantine record"
    );

    // Not retried by later runs: nothing to do.
    assert!(run(&local_context(&p)).await.unwrap().batches.is_empty());

    // Replaced under the same keys, then asked for again: read once.
    for (i, f) in poison.iter().enumerate() {
        let bytes = sluice_cli::generator::encode(
            &sluice_cli::generator::taxi_batch(100 + i as u64, 50),
            sluice_engine::pipeline::SourceFormat::Parquet,
            None,
        )
        .unwrap();
        std::fs::write(f, bytes).unwrap();
    }
    let asked = admin::retry_quarantined(&local_context(&p), None)
        .await
        .unwrap();
    assert_eq!(asked.len(), 3);
    let again = run(&local_context(&p)).await.unwrap();
    assert_eq!(again.batches.iter().map(|b| b.files).sum::<u64>(), 3);
    let mut all = good.clone();
    all.extend(poison.iter().cloned());
    assert_eq!(
        committed_rows(&sink, "quar").await,
        duckdb_rows(&all, SQL).await
    );
    let (entries, _) = quarantine_state(root).await;
    assert_eq!(entries, Vec::<(String, u64)>::new());
    assert!(run(&local_context(&p)).await.unwrap().batches.is_empty());
    // Nothing left to ask for.
    let err = admin::retry_quarantined(&local_context(&p), None)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no input file is quarantined"),
        "{err}"
    );
}

/// A poison file that is the first to land does not stop the schema from
/// being inferred (from the next file) under quarantine.
#[tokio::test(flavor = "multi_thread")]
async fn a_poison_first_file_is_passed_over_by_inference() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 3, 50);
    std::fs::write(&files[0], b"not parquet").unwrap();
    let p = pipeline(root, &toml(""));
    let summary = run(&local_context(&p)).await.unwrap();
    assert_eq!(
        summary.batches.iter().map(|b| b.quarantined).sum::<u64>(),
        1
    );
    assert_eq!(
        committed_rows(&root.join("out/sink"), "quar").await,
        duckdb_rows(&files[1..], SQL).await
    );
}

/// A file still unreadable when asked for again is set aside again (with
/// the later batch), never read half, and the rest goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_still_broken_when_retried_is_quarantined_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (_, poison) = poisoned_input(root);
    let p = pipeline(root, &toml("max_files_per_batch = 20"));
    run(&local_context(&p)).await.unwrap();
    let k = key(root, &poison[0]);
    admin::retry_quarantined(&local_context(&p), Some(&k))
        .await
        .unwrap();
    let again = run(&local_context(&p)).await.unwrap();
    assert_eq!(again.batches.len(), 1);
    assert_eq!(
        (again.batches[0].files, again.batches[0].quarantined),
        (0, 1)
    );
    let (entries, _) = quarantine_state(root).await;
    assert_eq!(entries.len(), 3);
    assert!(entries.contains(&(k, 1)), "{entries:?}");
}

/// A batch with quarantined files, failed at each of its writes in turn
/// (parts, quarantine record, manifest, index, control...), then run
/// again: the same output and the same quarantine, each once.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_with_quarantined_files_crashed_at_each_write_recovers() {
    let limits = "max_files_per_batch = 4";
    let clean = tempfile::tempdir().unwrap();
    let (good, _) = poisoned_input(clean.path());
    let writes = Arc::new(AtomicU64::new(0));
    run(&fault_context(
        clean.path(),
        &toml(limits),
        writes.clone(),
        0,
    ))
    .await
    .unwrap();
    let total = writes.load(Ordering::SeqCst);
    let expected = duckdb_rows(&good, SQL).await;
    assert_eq!(
        committed_rows(&clean.path().join("out/sink"), "quar").await,
        expected
    );
    let quarantine = quarantine_state(clean.path()).await;
    assert_eq!(quarantine.1.len(), 3);
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        poisoned_input(root);
        let failed = run(&fault_context(
            root,
            &toml(limits),
            Arc::new(AtomicU64::new(0)),
            k,
        ))
        .await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let again = run(&local_context(&pipeline(root, &toml(limits))))
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        assert_recovered(root, "quar", &again.end, &expected, k).await;
        assert_eq!(
            quarantine_state(root).await,
            quarantine,
            "quarantine after failing write {k}"
        );
    }
}
