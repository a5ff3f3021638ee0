//! A pipeline whose source is another pipeline's sink, read through its
//! manifests (`discovery = "manifests"`): only committed batches, whole,
//! with the manifest number as the offset.

use std::path::{Path, PathBuf};

use sluice_engine::admin;
use sluice_engine::checkpoint::{FORMAT_VERSION, Manifest, OutputFile};
use sluice_engine::paths;

use crate::support::*;

/// The committed records of `down`'s checkpoint under `root`, in order.
async fn down_commits(root: &Path) -> Vec<sluice_engine::checkpoint::Commit> {
    commit_records(root, &downstream_toml("manifests", "")).await
}

/// Upstream batches of two tasks each (two parts per manifest); the
/// downstream asks for one file per batch, yet takes whole manifests, and
/// its offset is the manifest number. New upstream batches are read by the
/// next downstream run, and only they.
#[tokio::test(flavor = "multi_thread")]
async fn a_downstream_reads_whole_upstream_batches_by_manifest_number() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let mut files = gen_files(&input, 4, 50);
    let up = pipeline(
        root,
        &pipeline_toml(
            "up",
            "parquet",
            "",
            "max_files_per_batch = 2\nmax_bytes_per_task = 1",
        ),
    );
    assert_eq!(run(&local_context(&up)).await.unwrap().batches.len(), 2);
    let down_toml = downstream_toml("manifests", "max_files_per_batch = 1");
    let down = || local_context(&pipeline(root, &down_toml));
    let first = run(&down()).await.unwrap();
    assert_eq!(
        first.batches.iter().map(|b| b.files).collect::<Vec<_>>(),
        [2, 2],
        "{first:?}"
    );
    let commits = down_commits(root).await;
    let cursors: Vec<String> = commits
        .iter()
        .map(|c| c.source.as_ref().unwrap().manifest.clone())
        .collect();
    assert_eq!(
        cursors,
        [paths::sink::manifest(0), paths::sink::manifest(1)]
    );
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files, SQL).await
    );

    // Nothing new upstream: the downstream is idle.
    assert!(run(&down()).await.unwrap().batches.is_empty());

    // Two more input files: one more upstream batch, read alone.
    let more = sluice_cli::generator::write_taxi_files(
        &root.join("more"),
        2,
        50,
        sluice_engine::pipeline::SourceFormat::Parquet,
        None,
    )
    .unwrap();
    for (i, f) in more.iter().enumerate() {
        let to = input.join(format!("late-{i}.parquet"));
        std::fs::copy(f, &to).unwrap();
        files.push(to);
    }
    assert_eq!(run(&local_context(&up)).await.unwrap().batches.len(), 1);
    let again = run(&down()).await.unwrap();
    assert_eq!(again.batches.len(), 1, "{again:?}");
    assert_eq!(again.batches[0].batch, 2);
    let last = down_commits(root).await.pop().unwrap();
    assert_eq!(last.source.unwrap().manifest, paths::sink::manifest(2));
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files, SQL).await
    );
}

/// Write a hand-made source sink under `root/out/sink`: `parts[n]` holds the
/// files (copies of `files`) of batch `n`, with a manifest unless `n` is in
/// `missing`.
fn fake_sink(root: &Path, files: &[PathBuf], parts: &[&[usize]], missing: &[usize]) {
    let sink = root.join("out/sink");
    for (n, idx) in parts.iter().enumerate() {
        let mut outputs = Vec::new();
        for (p, i) in idx.iter().enumerate() {
            let key = paths::sink::part(n as u64, 0, p as u32, 1);
            let to = sink.join(&key);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&files[*i], &to).unwrap();
            outputs.push(OutputFile {
                key,
                rows: 0,
                bytes: std::fs::metadata(&to).unwrap().len(),
                delta: None,
                etag: None,
            });
        }
        if !missing.contains(&n) {
            write_manifest(&sink, n as u64, outputs);
        }
    }
}

fn write_manifest(sink: &Path, n: u64, files: Vec<OutputFile>) {
    let m = Manifest {
        format_version: FORMAT_VERSION,
        pipeline: "up".into(),
        batch: n,
        files,
        rows: 0,
        complete: false,
    };
    let path = sink.join(paths::sink::manifest(n));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, serde_json::to_vec(&m).unwrap()).unwrap();
}

/// Manifests 0 (no files), 1, then a gap (2's manifest not written yet, as
/// when the upstream commit is cut short before it), then 3: the downstream
/// reads batch 1 only (and passes over 0); once 2's manifest exists it reads
/// 2, 3 and an empty 4 in one batch; a trailing manifest with no files then
/// changes nothing. Parts without a manifest are never read.
#[tokio::test(flavor = "multi_thread")]
async fn manifests_are_read_in_order_up_to_a_gap_and_empty_ones_are_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("gen"), 3, 40);
    fake_sink(root, &files, &[&[], &[0], &[1], &[2]], &[2]);
    let down_toml = downstream_toml("manifests", "");
    let down = || local_context(&pipeline(root, &down_toml));
    // (The generated files sit under `date=...` folders: no Hive column.)
    let sql = "SELECT * EXCLUDE (date) FROM trips";
    let first = run(&down()).await.unwrap();
    assert_eq!(first.batches.len(), 1, "{first:?}");
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files[..1], sql).await
    );
    let status = admin::status(&down()).await.unwrap();
    assert_eq!(status.waiting_files, 0, "batch 3 waits behind the gap");

    let sink = root.join("out/sink");
    let key = paths::sink::part(2, 0, 0, 1);
    let bytes = std::fs::metadata(sink.join(&key)).unwrap().len();
    write_manifest(
        &sink,
        2,
        vec![OutputFile {
            key,
            rows: 0,
            bytes,
            delta: None,
            etag: None,
        }],
    );
    write_manifest(&sink, 4, Vec::new());
    assert_eq!(admin::status(&down()).await.unwrap().waiting_files, 2);
    let second = run(&down()).await.unwrap();
    assert_eq!(second.batches.len(), 1, "{second:?}");
    assert_eq!(second.batches[0].files, 2);
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files, sql).await
    );
    // Manifest 4, with no files, joined the batch before it.
    let cursor = down_commits(root).await.pop().unwrap().source.unwrap();
    assert_eq!(cursor.manifest, paths::sink::manifest(4));
    // A trailing manifest with no files: nothing to do, nothing written.
    write_manifest(&sink, 5, Vec::new());
    let before = std::fs::read(root.join("down/checkpoint/down/control.json")).unwrap();
    assert!(run(&down()).await.unwrap().batches.is_empty());
    let after = std::fs::read(root.join("down/checkpoint/down/control.json")).unwrap();
    assert_eq!(before, after);
}

/// The upstream pipeline is reset and runs again: its batches are numbered
/// afresh under a new history. The downstream refuses to read them as if
/// they followed its cursor (it would skip or repeat rows), naming the
/// reset; after `sluice reset` on the downstream it reads them from the
/// start.
#[tokio::test(flavor = "multi_thread")]
async fn a_reset_upstream_is_refused_until_the_downstream_is_reset() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 3, 40);
    let up_toml = pipeline_toml("up", "parquet", "", "max_files_per_batch = 1");
    let up = || local_context(&pipeline(root, &up_toml));
    run(&up()).await.unwrap();
    let down_toml = downstream_toml("manifests", "");
    let down = || local_context(&pipeline(root, &down_toml));
    run(&down()).await.unwrap();
    admin::reset(&up()).await.unwrap();
    run(&up()).await.unwrap();
    let err = run(&down()).await.unwrap_err().to_string();
    assert!(
        err.contains("another history") && err.contains("sluice reset"),
        "{err}"
    );
    // A run of the retired history, stopped past its lease, publishes its
    // manifest late (the local store's copy was between its link and its
    // rename when the reset removed the staged file): it names a part that
    // is gone, below the new history's first batch. Readers skip it.
    write_manifest(
        &root.join("out/sink"),
        1,
        vec![OutputFile {
            key: paths::sink::part(1, 0, 0, 1),
            rows: 40,
            bytes: 1000,
            delta: None,
            etag: None,
        }],
    );
    admin::reset(&down()).await.unwrap();
    run(&down()).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files, SQL).await
    );
}

/// The downstream's own run (plan, tasks, commit with its manifest cursor)
/// failed at each of its writes in turn, then run again: exactly the rows
/// an independent engine computes, each once, nothing uncommitted left.
#[tokio::test(flavor = "multi_thread")]
async fn a_downstream_run_crashed_at_each_write_recovers() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let setup = |dir: &Path| gen_files(&dir.join("up/input"), 4, 60);
    let toml = r#"name = "down"
[source]
uri = "input"
format = "parquet"
table = "trips"
discovery = "manifests"
[query]
sql = "SELECT * FROM trips WHERE trip_distance > 2.0"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_files_per_batch = 1
"#;
    // The upstream's sink becomes the downstream root's `input`.
    async fn upstream(dir: &Path) {
        let up = dir.join("up");
        let p = pipeline(
            &up,
            &pipeline_toml("up", "parquet", "", "max_files_per_batch = 2"),
        );
        assert_eq!(run(&local_context(&p)).await.unwrap().batches.len(), 2);
        std::fs::create_dir_all(dir.join("down")).unwrap();
        std::fs::rename(up.join("out/sink"), dir.join("down/input")).unwrap();
    }
    let clean = tempfile::tempdir().unwrap();
    let files = setup(clean.path());
    upstream(clean.path()).await;
    let expected = duckdb_rows(
        &files,
        &format!("SELECT * FROM ({SQL}) WHERE trip_distance > 2.0"),
    )
    .await;
    let writes = Arc::new(AtomicU64::new(0));
    let down_root = clean.path().join("down");
    let summary = run(&fault_context(&down_root, toml, writes.clone(), 0))
        .await
        .unwrap();
    assert_eq!(summary.batches.len(), 2);
    assert_eq!(
        committed_rows(&down_root.join("out/sink"), "down").await,
        expected
    );
    let total = writes.load(Ordering::SeqCst);
    assert!(total >= 10, "only {total} writes");
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        setup(dir.path());
        upstream(dir.path()).await;
        let root = dir.path().join("down");
        let failed = run(&fault_context(&root, toml, Arc::new(AtomicU64::new(0)), k)).await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let again = run(&local_context(&pipeline(&root, toml)))
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        assert_recovered(&root, "down", &again.end, &expected, k).await;
    }
}

/// A complete-mode upstream writes the whole result every batch: read as
/// new rows, each group would count once per upstream batch. The
/// downstream refuses it, naming the manifest and what to do, and commits
/// nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_complete_mode_upstream_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 40);
    let up = pipeline_toml("up", "parquet", "", "max_files_per_batch = 1").replace(
        "[sink]\nuri = \"out/sink\"",
        "[sink]\nuri = \"out/sink\"\nmode = \"complete\"",
    );
    let up = up.replace(
        &up[up.find("sql = ").unwrap()..up.find("\n[sink]").unwrap()],
        r#"sql = 'SELECT "PULocationID", count(*) AS trips FROM trips GROUP BY "PULocationID"'"#,
    );
    assert!(up.contains("mode = \"complete\""), "{up}");
    let ran = run(&local_context(&pipeline(root, &up))).await.unwrap();
    assert_eq!(ran.batches.len(), 2);
    let down = local_context(&pipeline(root, &downstream_toml("manifests", "")));
    let e = run(&down).await.unwrap_err().to_string();
    assert!(
        e.contains("_sluice/manifest/") && e.contains("complete snapshot"),
        "{e}"
    );
    assert!(down_commits(root).await.is_empty());
}
