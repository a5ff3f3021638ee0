//! The Delta sink (`sink.format = "delta"`): each batch one Delta commit,
//! read by two independent readers (deltalake, DuckDB's delta extension)
//! and compared with DuckDB's one-shot query over the input; exactly once
//! through failures at every write, an outside writer, and a reset.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::prelude::{ParquetReadOptions, SessionContext};
use serde_json::Value;

use crate::support::*;
use sluice_engine::storage::{PutMode, S3Config, S3Store, Store};

/// A pipeline file over `root/input` whose sink is a Delta table.
pub(crate) fn delta_toml(name: &str, limits: &str) -> String {
    pipeline_toml(name, "parquet", "", limits).replace(
        "[sink]\nuri = \"out/sink\"\n",
        "[sink]\nuri = \"out/sink\"\nformat = \"delta\"\n",
    )
}

/// What the two readers make of a table.
pub(crate) struct DeltaView {
    /// deltalake's rows of the latest version.
    pub(crate) deltalake: Vec<String>,
    /// DuckDB's `delta_scan` rows.
    pub(crate) duckdb: Vec<String>,
    /// The latest version.
    pub(crate) version: u64,
    /// The application's transaction version.
    pub(crate) txn: Option<u64>,
    /// The live files' add actions.
    pub(crate) adds: Vec<Value>,
    /// Every path any log entry adds.
    pub(crate) log_adds: Vec<String>,
}

fn delta_python() -> String {
    std::env::var("SLUICE_DELTA_PYTHON").expect(
        "SLUICE_DELTA_PYTHON is not set: run the suite with tests/run.sh, which installs the \
         Delta readers",
    )
}

fn delta_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/delta_read.py")
}

async fn parquet_rows(path: &Path) -> Vec<String> {
    let ctx = SessionContext::new();
    let df = ctx
        .read_parquet(path.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    rows_of(&df.collect().await.unwrap())
}

pub(crate) async fn delta_view(table: &Path, app: &str) -> DeltaView {
    delta_view_at(table.to_str().unwrap(), app).await
}

/// [`delta_view`] of a table at a folder or an `s3://` URI (moto, through
/// `AWS_ENDPOINT_URL`).
pub(crate) async fn delta_view_at(table: &str, app: &str) -> DeltaView {
    let out = tempfile::tempdir().unwrap();
    let run = std::process::Command::new(delta_python())
        .arg(delta_script())
        .args(["read", table, out.path().to_str().unwrap()])
        .args(["--app", app])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "delta_read: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let facts: Value = serde_json::from_slice(&run.stdout).unwrap();
    DeltaView {
        deltalake: parquet_rows(&out.path().join("deltalake.parquet")).await,
        duckdb: parquet_rows(&out.path().join("duckdb.parquet")).await,
        version: facts["version"].as_u64().unwrap(),
        txn: facts["txn"].as_u64(),
        adds: facts["adds"].as_array().unwrap().clone(),
        // Read from the log's files: local tables only.
        log_adds: facts["log_adds"]
            .as_array()
            .map(|a| a.iter().map(|p| p.as_str().unwrap().to_string()).collect())
            .unwrap_or_default(),
    }
}

/// The application id of the pipeline's current history in the table.
async fn app_of(root: &Path, toml: &str) -> String {
    let c = control_of(root, toml).await;
    format!("{}-{}", pipeline(root, toml).name, c.history)
}

/// No path was added twice across the log, and the table holds every
/// added path (appends only).
pub(crate) fn assert_added_once(v: &DeltaView) {
    let mut seen = std::collections::BTreeSet::new();
    for p in &v.log_adds {
        assert!(seen.insert(p.clone()), "{p} added twice: {:?}", v.log_adds);
    }
}

/// Input files arriving over three runs, two per batch: after each run
/// both readers read exactly DuckDB's one-shot rows over the input so
/// far; each batch is one Delta commit (the table's version is the last
/// batch), the txn version is the last batch, no file is added twice.
#[tokio::test(flavor = "multi_thread")]
async fn each_batch_is_one_commit_that_both_readers_read_as_duckdb_computes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("dl", "max_files_per_batch = 2");
    let input = root.join("input");
    let mut files = Vec::new();
    let mut batches = 0u64;
    for (round, n) in [(0, 3), (1, 1), (2, 4)] {
        let made = sluice_cli::generator::write_taxi_files(
            &input.join(format!("r{round}")),
            n,
            40,
            sluice_engine::pipeline::SourceFormat::Parquet,
            None,
        )
        .unwrap();
        files.extend(made);
        let summary = run(&local_context(&pipeline(root, &toml))).await.unwrap();
        batches += summary.batches.len() as u64;
        let app = app_of(root, &toml).await;
        let v = delta_view(&root.join("out/sink"), &app).await;
        let want = duckdb_rows(&files, SQL).await;
        assert_eq!(v.deltalake, want, "round {round}: deltalake");
        assert_eq!(v.duckdb, want, "round {round}: duckdb");
        assert_eq!(
            v.version,
            batches - 1,
            "round {round}: one commit per batch"
        );
        assert_eq!(v.txn, Some(batches - 1), "round {round}: txn version");
        assert_added_once(&v);
        // `sluice show` says the table's version.
        let status = sluice_engine::admin::status(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap();
        assert_eq!(status.delta_version, Some(v.version), "round {round}");
    }
    assert_eq!(batches, 2 + 1 + 2);
}

/// Every live file's statistics are its own: row count, and min, max and
/// null count of each numeric column, as DuckDB computes them over the
/// file.
#[tokio::test(flavor = "multi_thread")]
async fn each_files_statistics_are_what_duckdb_computes_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("stats", "max_files_per_batch = 1");
    gen_files(&root.join("input"), 2, 80);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let app = app_of(root, &toml).await;
    let v = delta_view(&root.join("out/sink"), &app).await;
    assert!(v.adds.len() >= 2, "{:?}", v.adds);
    for add in &v.adds {
        let path = root.join("out/sink").join(add["path"].as_str().unwrap());
        let want = duckdb_sql(&format!(
            "SELECT count(*) AS n, min(trip_distance), max(trip_distance), \
             min(fare_amount), max(fare_amount), min(\"PULocationID\"), max(\"PULocationID\"), \
             count(*) - count(fare_amount) FROM read_parquet('{}')",
            path.display()
        ))
        .await;
        let got = format!(
            "{}|{}|{}|{}|{}|{}|{}|{}",
            add["num_records"],
            add["min"]["trip_distance"],
            add["max"]["trip_distance"],
            add["min"]["fare_amount"],
            add["max"]["fare_amount"],
            add["min"]["PULocationID"],
            add["max"]["PULocationID"],
            add["null_count"]["fare_amount"],
        );
        assert_eq!(vec![got], want, "{}", add["path"]);
    }
}

/// A DuckDB oracle over some input files.
type Oracle = fn(Vec<PathBuf>) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<String>>>>;

fn append_oracle(
    files: Vec<PathBuf>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<String>>>> {
    Box::pin(async move { duckdb_rows(&files, SQL).await })
}

/// DuckDB's one-shot [`FROM_HOUR_2`] over `files`.
fn from_hour_2_oracle(
    files: Vec<PathBuf>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<String>>>> {
    Box::pin(async move { duckdb_rows(&files, FROM_HOUR_2).await })
}

/// The windowed GROUP BY of the complete-mode pipelines.
const WINDOWED: &str = r#"SELECT window.start AS window_start, window.end AS window_end, "PULocationID", count(*) AS trips, max(trip_distance) AS longest FROM trips GROUP BY window(tpep_pickup_datetime, '15 minutes'), "PULocationID""#;

/// DuckDB's one-shot result of [`WINDOWED`] over `files`.
pub(crate) fn windowed_oracle(
    files: Vec<PathBuf>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<String>>>> {
    Box::pin(async move {
        duckdb_rows(
            &files,
            "SELECT time_bucket(INTERVAL 15 MINUTES, tpep_pickup_datetime) AS window_start, \
             time_bucket(INTERVAL 15 MINUTES, tpep_pickup_datetime) + INTERVAL 15 MINUTES AS \
             window_end, \"PULocationID\", count(*) AS trips, max(trip_distance) AS longest \
             FROM trips WHERE tpep_pickup_datetime IS NOT NULL GROUP BY ALL",
        )
        .await
    })
}

/// [`SQL`] over the trips from 02:00 on: the first two generated files
/// (hours 0 and 1) give no row.
pub(crate) const FROM_HOUR_2: &str = "SELECT \"VendorID\", tpep_pickup_datetime, \"PULocationID\", \
    trip_distance, fare_amount, total_amount - fare_amount AS surcharges FROM trips \
    WHERE trip_distance > 1.0 AND tpep_pickup_datetime >= CAST('2024-01-01 02:00:00' AS TIMESTAMP)";

/// A Delta sink in complete mode over [`WINDOWED`], with `limits`.
pub(crate) fn complete_toml(name: &str, limits: &str) -> String {
    delta_toml(name, limits).replace(SQL, WINDOWED).replace(
        "format = \"delta\"\n",
        "format = \"delta\"\nmode = \"complete\"\n",
    )
}

/// Fail each sink and checkpoint write of a two-batch run into a Delta
/// table in turn (parts, Sluice's records, the Delta log entries, the log
/// checkpoints: one after every version here), then run again: both
/// readers read the clean run's rows, the txn version is the last batch,
/// no file is added twice; and right after each failure a reader of the
/// table sees committed rows only, whole batches of them. In append mode,
/// and in complete mode (where each commit replaces the table's content:
/// a reader sees the first batch's snapshot or the last one's).
#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_of_a_delta_batch_then_rerunning_gives_the_clean_table() {
    let append = delta_toml("crash", "max_files_per_batch = 2").replace(
        "format = \"delta\"\n",
        "format = \"delta\"\ndelta_checkpoint_interval = 1\n",
    );
    let complete = complete_toml("crashc", "max_files_per_batch = 2\nstate_partitions = 2")
        .replace(
            "format = \"delta\"\n",
            "format = \"delta\"\ndelta_checkpoint_interval = 1\n",
        );
    // A first batch without rows: its commit creates the table.
    let empty_first = append.replace(SQL, FROM_HOUR_2);
    for (toml, oracle) in [
        (append, append_oracle as Oracle),
        (complete, windowed_oracle as Oracle),
        (empty_first, from_hour_2_oracle as Oracle),
    ] {
        crash_at_every_write(&toml, oracle).await;
    }
}

async fn crash_at_every_write(toml: &str, oracle: Oracle) {
    let clean = tempfile::tempdir().unwrap();
    let files = gen_files(&clean.path().join("input"), 4, 30);
    let writes = Arc::new(AtomicU64::new(0));
    let summary = run(&fault_context(clean.path(), toml, writes.clone(), 0))
        .await
        .unwrap();
    assert_eq!(summary.batches.len(), 2, "the scenario needs two batches");
    assert!(
        clean
            .path()
            .join("out/sink/_delta_log/00000000000000000001.checkpoint.parquet")
            .exists(),
        "the scenario writes log checkpoints"
    );
    let total = writes.load(Ordering::SeqCst);
    let want = oracle(files.clone()).await;
    // The table after the first batch alone (its two files).
    let mut first_files = files.clone();
    first_files.sort();
    let first = oracle(first_files[..2].to_vec()).await;
    assert_ne!(first, want);
    eprintln!("delta crash test: failing each of {total} writes in turn");
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        gen_files(&dir.path().join("input"), 4, 30);
        let failed = run(&fault_context(
            dir.path(),
            toml,
            Arc::new(AtomicU64::new(0)),
            k,
        ))
        .await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let table = dir.path().join("out/sink");
        if table.join("_delta_log").exists() {
            let app = app_of(dir.path(), toml).await;
            let v = delta_view(&table, &app).await;
            // Whole batches only: none, the first, or both.
            let whole = v.deltalake.is_empty() || v.deltalake == first || v.deltalake == want;
            assert!(whole, "after failing write {k}: {} rows", v.deltalake.len());
            assert_eq!(v.deltalake, v.duckdb, "after failing write {k}");
        }
        run(&fault_context(
            dir.path(),
            toml,
            Arc::new(AtomicU64::new(0)),
            0,
        ))
        .await
        .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        let app = app_of(dir.path(), toml).await;
        let v = delta_view(&table, &app).await;
        assert_eq!(v.deltalake, want, "after failing write {k}: deltalake");
        assert_eq!(v.duckdb, want, "after failing write {k}: duckdb");
        assert_eq!(v.txn, Some(1), "after failing write {k}");
        assert_added_once(&v);
        // The rerun made the checkpoint a failure left out.
        assert!(
            table
                .join("_delta_log/00000000000000000001.checkpoint.parquet")
                .exists(),
            "after failing write {k}: no checkpoint of version 1"
        );
    }
}

/// Complete mode: each batch's commit removes every live file and adds
/// the batch's snapshot, so after each run both readers read exactly
/// DuckDB's one-shot windowed GROUP BY over the input so far, and only
/// the last batch's parts are live.
#[tokio::test(flavor = "multi_thread")]
async fn complete_mode_commits_replace_the_table_with_each_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = complete_toml("snap", "max_files_per_batch = 1\nstate_partitions = 2");
    let input = root.join("input");
    let mut files = Vec::new();
    let mut batches = 0u64;
    for (round, n) in [(0, 2), (1, 1), (2, 2)] {
        files.extend(
            sluice_cli::generator::write_taxi_files(
                &input.join(format!("r{round}")),
                n,
                60,
                sluice_engine::pipeline::SourceFormat::Parquet,
                None,
            )
            .unwrap(),
        );
        let summary = run(&local_context(&pipeline(root, &toml))).await.unwrap();
        batches += summary.batches.len() as u64;
        let app = app_of(root, &toml).await;
        let v = delta_view(&root.join("out/sink"), &app).await;
        let want = windowed_oracle(files.clone()).await;
        assert!(!want.is_empty());
        assert_eq!(v.deltalake, want, "round {round}: deltalake");
        assert_eq!(v.duckdb, want, "round {round}: duckdb");
        assert_eq!(v.version, batches - 1, "round {round}");
        assert_eq!(v.txn, Some(batches - 1), "round {round}");
        let last = format!("batch={:010}/", batches - 1);
        assert!(
            v.adds
                .iter()
                .all(|a| a["path"].as_str().unwrap().contains(&last)),
            "round {round}: live files of older batches: {:?}",
            v.adds
        );
    }
    assert_eq!(batches, 5);
}

/// Log checkpoints: every `delta_checkpoint_interval` versions the table's
/// state is written as the spec's checkpoint Parquet with
/// `_last_checkpoint`. With the entries before the newest checkpoint
/// deleted (as another engine's log cleanup does), both readers still
/// read DuckDB's rows (so the checkpoint alone holds the state), Sluice
/// appends on from it, and `sluice reset` retires the table from it.
#[tokio::test(flavor = "multi_thread")]
async fn log_checkpoints_hold_the_table_for_readers_and_for_sluice() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("cp", "max_files_per_batch = 1").replace(
        "format = \"delta\"\n",
        "format = \"delta\"\ndelta_checkpoint_interval = 4\n",
    );
    let mut files = gen_files(&root.join("input/a"), 10, 20);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let log = root.join("out/sink/_delta_log");
    let mut cps: Vec<String> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("checkpoint"))
        .collect();
    cps.sort();
    assert_eq!(
        cps,
        [
            "00000000000000000003.checkpoint.parquet",
            "00000000000000000007.checkpoint.parquet",
            "_last_checkpoint"
        ]
    );
    let hint: Value =
        serde_json::from_slice(&std::fs::read(log.join("_last_checkpoint")).unwrap()).unwrap();
    assert_eq!(hint["version"], 7);
    let app = app_of(root, &toml).await;
    let want = duckdb_rows(&files, SQL).await;
    let v = delta_view(&root.join("out/sink"), &app).await;
    assert_eq!((v.version, v.txn), (9, Some(9)));
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
    // Another engine's log cleanup: the entries up to the checkpoint go.
    for version in 0..=7u64 {
        std::fs::remove_file(log.join(format!("{version:020}.json"))).unwrap();
    }
    std::fs::remove_file(log.join("00000000000000000003.checkpoint.parquet")).unwrap();
    let v = delta_view(&root.join("out/sink"), &app).await;
    assert_eq!((v.version, v.txn), (9, Some(9)));
    assert_eq!(v.deltalake, want, "read from the checkpoint: deltalake");
    assert_eq!(v.duckdb, want, "read from the checkpoint: duckdb");
    assert_eq!(v.adds.len(), 10);
    // Sluice appends on from the checkpoint.
    files.extend(gen_files(&root.join("input/b"), 3, 20));
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let want = duckdb_rows(&files, SQL).await;
    let v = delta_view(&root.join("out/sink"), &app).await;
    assert_eq!((v.version, v.txn), (12, Some(12)));
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
    assert_eq!(v.adds.len(), 13);
    assert!(log.join("00000000000000000011.checkpoint.parquet").exists());
    // And a reset empties it, reading the state from the checkpoint.
    sluice_engine::admin::reset(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap();
    let v = delta_view(&root.join("out/sink"), &app).await;
    assert_eq!(v.version, 13);
    assert!(v.deltalake.is_empty() && v.duckdb.is_empty());
}

/// An outside writer (deltalake's blind append) between two runs: both
/// writers' rows are in the table, and Sluice's txn version is exact.
#[tokio::test(flavor = "multi_thread")]
async fn an_outside_writer_appending_between_batches_keeps_both_writers_rows() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("shared", "");
    let mut files = gen_files(&root.join("input/a"), 2, 30);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let table = root.join("out/sink");
    let outside = r#"[{"VendorID": 77, "tpep_pickup_datetime": null, "PULocationID": 7, "trip_distance": 7.5, "fare_amount": 70.25, "surcharges": 1.5}]"#;
    let append = std::process::Command::new(delta_python())
        .arg(delta_script())
        .args(["append", table.to_str().unwrap(), outside])
        .output()
        .unwrap();
    assert!(
        append.status.success(),
        "{}",
        String::from_utf8_lossy(&append.stderr)
    );
    files.extend(gen_files(&root.join("input/b"), 2, 30));
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let app = app_of(root, &toml).await;
    let v = delta_view(&table, &app).await;
    let want = duckdb_sql(&format!(
        "SELECT * FROM ({SQL_OVER_FILES}) UNION ALL SELECT 77, NULL::TIMESTAMP, 7, 7.5, 70.25, 1.5",
        SQL_OVER_FILES = SQL.replace(
            "FROM trips",
            &format!("FROM read_parquet([{}])", quoted(&files))
        )
    ))
    .await;
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
    // Sluice's two commits and the outside one.
    assert_eq!(v.version, 2);
    assert_eq!(v.txn, Some(1));
}

/// `sluice reset` replaces the table's content with nothing in one commit
/// (the log is kept), and the next history takes the table over: after it
/// runs, both readers read the input once, under the new history's txn.
#[tokio::test(flavor = "multi_thread")]
async fn a_reset_retires_the_table_and_the_next_history_takes_it_over() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("again", "");
    let files = gen_files(&root.join("input"), 2, 30);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let old_app = app_of(root, &toml).await;
    sluice_engine::admin::reset(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap();
    let table = root.join("out/sink");
    let v = delta_view(&table, &old_app).await;
    assert!(v.deltalake.is_empty() && v.duckdb.is_empty());
    assert_eq!(v.version, 1, "the reset is one commit after the batch");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let app = app_of(root, &toml).await;
    assert_ne!(app, old_app);
    let v = delta_view(&table, &app).await;
    let want = duckdb_rows(&files, SQL).await;
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
    let c = control_of(root, &toml).await;
    assert_eq!(v.txn, c.last_committed);
}

/// Another writer's changes to Sluice's table that Sluice cannot honour:
/// a CHECK constraint (deltalake raises the writer protocol to 3) makes
/// the next batch's publish refuse, naming the feature, and leaves the
/// table as it was; `delta.appendOnly` makes a complete-mode batch and
/// `sluice reset` refuse, naming the setting.
#[tokio::test(flavor = "multi_thread")]
async fn another_writers_features_are_honoured_or_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("feat", "");
    gen_files(&root.join("input/a"), 1, 30);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let status = sluice_engine::admin::status(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap();
    assert!(!status.holder_stopped);
    let table = root.join("out/sink");
    let t = table.to_str().unwrap();
    outside(&["alter", t, "constraint", "positive", "fare_amount > -1000"]);
    let app = app_of(root, &toml).await;
    let before = delta_view(&table, &app).await;
    gen_files(&root.join("input/b"), 1, 30);
    // `sluice check` and the run refuse before a batch is committed (the
    // sweep's case: check passed, and the run refused after the batch's
    // commit record, with advice that did not work).
    let e = check_error(root, &toml).await;
    assert!(
        e.contains("checkConstraints") && e.contains("new folder"),
        "{e}"
    );
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("checkConstraints") && e.contains("Delta table"),
        "{e}"
    );
    assert_eq!(commit_records(root, &toml).await.len(), 1);
    let after = delta_view(&table, &app).await;
    assert_eq!(
        (after.version, after.deltalake),
        (before.version, before.deltalake)
    );
    // The advice works: a reset, then a new sink.uri before the next run.
    sluice_engine::admin::reset(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap();
    let moved = toml.replace("uri = \"out/sink\"", "uri = \"out/sink2\"");
    run(&local_context(&pipeline(root, &moved))).await.unwrap();
    let all = crate::stateful::walk(&root.join("input"));
    let v = delta_view(&root.join("out/sink2"), "-").await;
    assert_eq!(v.deltalake, duckdb_rows(&all, SQL).await);
    assert_eq!(v.duckdb, v.deltalake);

    // A run that fails part-way keeps the lease: `sluice show` says its
    // run stopped, not that it runs.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 1, 30);
    let crash = delta_toml("crashed", "");
    assert!(
        run(&fault_context(root, &crash, Arc::new(AtomicU64::new(0)), 6))
            .await
            .is_err()
    );
    let status = sluice_engine::admin::status(&local_context(&pipeline(root, &crash)))
        .await
        .unwrap();
    assert!(status.holder_stopped);

    // Append-only: complete mode and reset refuse.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = complete_toml("ao", "max_files_per_batch = 1");
    gen_files(&root.join("input/a"), 1, 30);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let table = root.join("out/sink");
    let t = table.to_str().unwrap();
    outside(&["alter", t, "property", "delta.appendOnly", "true"]);
    let app = app_of(root, &toml).await;
    let before = delta_view(&table, &app).await;
    gen_files(&root.join("input/b"), 1, 30);
    // `sluice check` foresees it (before: only the publish refused).
    let e = check_error(root, &toml).await;
    assert!(
        e.contains("delta.appendOnly") && e.contains("complete"),
        "{e}"
    );
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("delta.appendOnly"), "{e}");
    let e = sluice_engine::admin::reset(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("delta.appendOnly") && e.contains("sluice reset"),
        "{e}"
    );
    let after = delta_view(&table, &app).await;
    assert_eq!(
        (after.version, after.deltalake),
        (before.version, before.deltalake)
    );
}

/// The rows of a DuckDB query over Delta tables (its `delta_scan`).
pub(crate) async fn delta_sql(sql: &str) -> Vec<String> {
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("sql.parquet");
    outside(&["sql", file.to_str().unwrap(), sql]);
    parquet_rows(&file).await
}

/// `delta_read.py` with `args` (an outside writer's calls): its output.
pub(crate) fn outside(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new(delta_python())
        .arg(delta_script())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A sink folder holding a table another writer created: `sluice check`,
/// the run and `sluice reset` refuse it before anything is written (no
/// commit record, no part, no manifest, no owner record).
#[tokio::test(flavor = "multi_thread")]
async fn a_table_another_writer_created_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let table = root.join("out/sink");
    outside(&["create", table.to_str().unwrap(), r#"[{"x": 1}, {"x": 2}]"#]);
    let toml = delta_toml("foreign", "");
    gen_files(&root.join("input"), 1, 20);
    let e = check_error(root, &toml).await;
    assert!(e.contains("did not create"), "{e}");
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("did not create") && e.contains("nothing was written"),
        "{e}"
    );
    assert!(!root.join("out/checkpoint/foreign/commits").exists());
    assert!(!table.join("_sluice/manifest").exists());
    assert!(!table.join("batch=0000000000").exists());
    // `sluice reset` refuses it too, changing nothing (before, it wrote
    // Sluice's owner record into the other writer's table folder).
    let e = sluice_engine::admin::reset(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("did not create") && e.contains("nothing was changed"),
        "{e}"
    );
    assert!(!table.join("_sluice").exists());
    let v = delta_view(&table, "-").await;
    assert_eq!(
        (v.version, v.deltalake.len()),
        (0, 2),
        "the table is left as it was"
    );
}

/// The sweep's case: a pipeline file copied with only its name changed
/// points at another pipeline's sink. `sluice reset` of the copy refuses,
/// naming the owner, and changes nothing (before, it deleted the owner's
/// parts and took its sink over), for a Parquet and a Delta sink; the
/// owner reads and runs on.
#[tokio::test(flavor = "multi_thread")]
async fn a_reset_of_another_pipelines_sink_is_refused_and_changes_nothing() {
    for delta in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let own = if delta {
            delta_toml("own", "")
        } else {
            pipeline_toml("own", "parquet", "", "")
        };
        let intruder = own.replace("name = \"own\"", "name = \"intruder\"");
        let mut files = gen_files(&root.join("input/a"), 2, 30);
        run(&local_context(&pipeline(root, &own))).await.unwrap();
        let e = sluice_engine::admin::reset(&local_context(&pipeline(root, &intruder)))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"own\"") && e.contains("nothing was changed"),
            "delta {delta}: {e}"
        );
        files.extend(gen_files(&root.join("input/b"), 1, 30));
        run(&local_context(&pipeline(root, &own))).await.unwrap();
        let want = duckdb_rows(&files, SQL).await;
        assert_eq!(committed_rows(&root.join("out/sink"), "own").await, want);
        if delta {
            let v = delta_view(&root.join("out/sink"), "-").await;
            assert_eq!(v.deltalake, want);
            assert_eq!(v.duckdb, want);
        }
    }
}

/// Another writer overwrites Sluice's table with another schema (a
/// column's type changed): the next batch is refused, naming the column,
/// and the table is left as that writer left it (before, Sluice appended
/// parts of the old schema without a word, and readers read them wrong).
/// Another writer's table setting on a table with timestamps without a
/// zone: a later metaData from Sluice keeps the features it brought.
#[tokio::test(flavor = "multi_thread")]
async fn another_writers_schema_and_protocol_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("over", "");
    gen_files(&root.join("input/a"), 1, 30);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let table = root.join("out/sink");
    outside(&[
        "overwrite",
        table.to_str().unwrap(),
        r#"[{"VendorID": "x", "other": 1}]"#,
    ]);
    let before = delta_view(&table, "-").await;
    gen_files(&root.join("input/b"), 1, 30);
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"VendorID\""), "{e}");
    let after = delta_view(&table, "-").await;
    assert_eq!(
        (after.version, after.deltalake),
        (before.version, before.deltalake)
    );

    // Protocol: deltalake's SET TBLPROPERTIES lists its features; a query
    // that adds a column makes Sluice write metaData, keeping them.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("proto", "");
    let mut files = gen_files(&root.join("input/a"), 1, 30);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let table = root.join("out/sink");
    outside(&[
        "alter",
        table.to_str().unwrap(),
        "property",
        "delta.logRetentionDuration",
        "interval 60 days",
    ]);
    let raised = newest(&table, "protocol");
    assert!(
        raised["writerFeatures"].as_array().unwrap().len() > 1,
        "deltalake listed more features than timestampNtz: {raised}"
    );
    files.extend(gen_files(&root.join("input/b"), 1, 30));
    let wider = toml.replace(
        "total_amount - fare_amount AS surcharges FROM",
        "total_amount - fare_amount AS surcharges, tip_amount AS tip FROM",
    );
    run(&local_context(&pipeline(root, &wider))).await.unwrap();
    let kept = newest(&table, "protocol");
    assert_eq!(kept, raised, "the protocol another writer left is kept");
    let v = delta_view(&table, "-").await;
    assert_eq!(v.deltalake.len(), duckdb_rows(&files, SQL).await.len());
    assert_eq!(v.deltalake, v.duckdb);
}

/// The newest `key` action (protocol, metaData) of a local table's log.
fn newest(table: &Path, key: &str) -> Value {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    entries.sort();
    for e in entries.iter().rev() {
        for line in std::fs::read_to_string(e).unwrap().lines() {
            let a: Value = serde_json::from_str(line).unwrap();
            if let Some(v) = a.get(key) {
                return v.clone();
            }
        }
    }
    panic!("no {key} in the log")
}

/// The sweep's case: `_delta_log/` deleted after batches wrote rows: the
/// next batch is refused, naming what to do, instead of creating a new
/// table that misses the earlier batches' rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_log_is_refused_not_replaced_by_a_table_missing_batches() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("gone", "");
    gen_files(&root.join("input/a"), 2, 30);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let table = root.join("out/sink");
    std::fs::rename(table.join("_delta_log"), root.join("saved_log")).unwrap();
    gen_files(&root.join("input/b"), 1, 30);
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("_delta_log") && e.contains("sluice reset"),
        "{e}"
    );
    assert!(!table.join("_delta_log").exists(), "no new table");
}

/// Switching `sink.format` after batches were written is refused like a
/// new sink.uri: the table would miss the earlier batches.
#[tokio::test(flavor = "multi_thread")]
async fn switching_the_sink_format_after_a_batch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let parquet = pipeline_toml("switch", "parquet", "", "");
    gen_files(&root.join("input"), 1, 20);
    run(&local_context(&pipeline(root, &parquet)))
        .await
        .unwrap();
    gen_files(&root.join("input"), 1, 20);
    let e = run(&local_context(&pipeline(root, &delta_toml("switch", ""))))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("sink.format changed (parquet -> delta)"), "{e}");
    assert!(!root.join("out/sink/_delta_log").exists());
}

/// Nested columns (a struct) next to a boolean: both readers read the
/// table (a struct's null count as a number made deltalake refuse it).
#[tokio::test(flavor = "multi_thread")]
async fn struct_columns_are_read_by_both_readers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let sql = "SELECT named_struct('fare', fare_amount, 'vendor', \"VendorID\") AS s, \
               trip_distance > 2 AS far FROM trips";
    let toml = delta_toml("nested", "").replace(SQL, sql);
    let files = gen_files(&root.join("input"), 2, 30);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let app = app_of(root, &toml).await;
    let v = delta_view(&root.join("out/sink"), &app).await;
    let want = duckdb_rows(
        &files,
        "SELECT {'fare': fare_amount, 'vendor': \"VendorID\"} AS s, trip_distance > 2 AS far \
         FROM trips",
    )
    .await;
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
}

/// The query changes between runs: a new column joins the table's
/// schema (the earlier rows read it as NULL in both readers); a column
/// whose type changes is refused naming it before any batch is committed
/// (before, the batch was committed and could not be published, so the
/// pipeline stayed stuck until a reset), the table stays readable, and the
/// restored query goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_query_adds_columns_and_a_changed_type_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let first = "SELECT \"VendorID\" AS v, fare_amount AS f FROM trips";
    let second = "SELECT \"VendorID\" AS v, fare_amount AS f, tip_amount AS tip FROM trips";
    let toml = |sql: &str| delta_toml("grow", "").replace(SQL, sql);
    let a = gen_files(&root.join("input/a"), 1, 30);
    run(&local_context(&pipeline(root, &toml(first))))
        .await
        .unwrap();
    let b = gen_files(&root.join("input/b"), 1, 30);
    run(&local_context(&pipeline(root, &toml(second))))
        .await
        .unwrap();
    let app = app_of(root, &toml(second)).await;
    let v = delta_view(&root.join("out/sink"), &app).await;
    let want = duckdb_sql(&format!(
        "SELECT \"VendorID\" AS v, fare_amount AS f, NULL::DOUBLE AS tip FROM read_parquet([{}]) \
         UNION ALL SELECT \"VendorID\", fare_amount, tip_amount FROM read_parquet([{}])",
        quoted(&a),
        quoted(&b)
    ))
    .await;
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
    // `v` becomes text: refused, naming it, by `sluice check` and by the
    // run before a batch is committed; the table is as it was.
    let c = gen_files(&root.join("input/c"), 1, 30);
    let third = "SELECT concat('x', \"VendorID\") AS v, fare_amount AS f FROM trips";
    let committed = control_of(root, &toml(second)).await.last_committed;
    let e = sluice_engine::admin::check(&local_context(&pipeline(root, &toml(third))))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("column \"v\"") && e.contains("sluice reset"),
        "{e}"
    );
    let e = run(&local_context(&pipeline(root, &toml(third))))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("column \"v\"") && e.contains("sluice reset"),
        "{e}"
    );
    assert_eq!(
        control_of(root, &toml(third)).await.last_committed,
        committed,
        "nothing committed"
    );
    let after = delta_view(&root.join("out/sink"), &app).await;
    assert_eq!((after.version, after.deltalake), (v.version, want.clone()));
    // Restoring the query goes on, with the file that waited.
    run(&local_context(&pipeline(root, &toml(second))))
        .await
        .unwrap();
    let mut want = want;
    want.extend(
        duckdb_sql(&format!(
            "SELECT \"VendorID\", fare_amount, tip_amount FROM read_parquet([{}])",
            quoted(&c)
        ))
        .await,
    );
    want.sort();
    let mut got = delta_view(&root.join("out/sink"), &app).await.deltalake;
    got.sort();
    assert_eq!(got, want);
}

/// What a Delta sink cannot take is refused before anything is written:
/// update mode (not built), and a column type Delta has no type for,
/// named with what to do.
#[tokio::test(flavor = "multi_thread")]
async fn what_a_delta_sink_cannot_take_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let update = delta_toml("modes", "").replace(
        "format = \"delta\"\n",
        "format = \"delta\"\nmode = \"update\"\n",
    );
    let e = sluice_engine::pipeline::Pipeline::parse(&update, "p.toml", root)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sink.mode") && e.contains("not built"), "{e}");
    let interval =
        delta_toml("modes", "").replace("format = \"delta\"\n", "delta_checkpoint_interval = 5\n");
    let e = sluice_engine::pipeline::Pipeline::parse(&interval, "p.toml", root)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("delta_checkpoint_interval") && e.contains("Delta sink only"),
        "{e}"
    );
    gen_files(&root.join("input"), 1, 10);
    let timed = delta_toml("timed", "").replace(
        SQL,
        "SELECT \"VendorID\", CAST(tpep_pickup_datetime AS TIME) AS t FROM trips",
    );
    let e = run(&local_context(&pipeline(root, &timed)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"t\"") && e.contains("CAST"), "{e}");
    assert!(!root.join("out/sink/_delta_log").exists());
    // Names that differ only in case: Delta's readers refuse such a table.
    let cased = delta_toml("cased", "").replace(
        SQL,
        "SELECT total_amount AS \"Total\", trip_distance AS total FROM trips",
    );
    let e = run(&local_context(&pipeline(root, &cased)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("differ only in case"), "{e}");
    assert!(!root.join("out/sink/_delta_log").exists());
}

/// On S3 (moto, with its conditional writes): the same Delta commits, and
/// both readers read the table there (DuckDB through httpfs with an S3
/// secret) as DuckDB computes over the input.
#[tokio::test(flavor = "multi_thread")]
async fn a_delta_table_on_s3_is_read_there_by_both_readers() {
    let cfg = S3Config::from_env().await;
    let bucket = fresh_bucket(&cfg, "delta").await;
    let dir = tempfile::tempdir().unwrap();
    let files = gen_files(&dir.path().join("input"), 4, 40);
    let source = S3Store::new(&cfg, &bucket, "landing/trips");
    for f in &files {
        let key = f.file_name().unwrap().to_str().unwrap();
        source
            .put(
                key,
                bytes::Bytes::from(std::fs::read(f).unwrap()),
                PutMode::Overwrite,
            )
            .await
            .unwrap();
    }
    let toml = format!(
        r#"name = "s3delta"
[source]
uri = "s3://{bucket}/landing/trips/"
format = "parquet"
table = "trips"
[query]
sql = '''{SQL}'''
[sink]
uri = "s3://{bucket}/curated/trips/"
format = "delta"
[checkpoint]
uri = "s3://{bucket}/_checkpoints/"
[limits]
max_files_per_batch = 2
"#
    );
    let p = sluice_engine::pipeline::Pipeline::parse(&toml, "s3.toml", dir.path()).unwrap();
    let mut ctx = sluice_engine::handlers::Context::open(p, Some(&cfg)).unwrap();
    test_mode(&mut ctx);
    let summary = run(&ctx).await.unwrap();
    assert_eq!(summary.batches.len(), 2);
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    let app = format!("s3delta-{}", c.history);
    let v = delta_view_at(&format!("s3://{bucket}/curated/trips"), &app).await;
    let want = duckdb_rows(&files, SQL).await;
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
    assert_eq!((v.version, v.txn), (1, Some(1)));
    // A downstream pipeline reads that table as a Delta source on S3 and
    // writes its own Delta table there: both readers read the same rows.
    let down = format!(
        r#"name = "s3down"
[source]
uri = "s3://{bucket}/curated/trips/"
format = "delta"
table = "up"
[query]
sql = "SELECT * FROM up"
[sink]
uri = "s3://{bucket}/curated/down/"
format = "delta"
[checkpoint]
uri = "s3://{bucket}/_checkpoints/"
"#
    );
    let p = sluice_engine::pipeline::Pipeline::parse(&down, "down.toml", dir.path()).unwrap();
    let mut ctx = sluice_engine::handlers::Context::open(p, Some(&cfg)).unwrap();
    test_mode(&mut ctx);
    assert_eq!(run(&ctx).await.unwrap().batches.len(), 1);
    let v = delta_view_at(&format!("s3://{bucket}/curated/down"), "-").await;
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
}

/// Waves of three `sluice run` processes started at once on a Delta sink
/// (a log checkpoint every two versions) while files arrive, one of each
/// wave killed at a varying moment: after a last run, both readers read
/// DuckDB's one-shot rows over every file, no file was added to the table
/// twice, the table's txn version is the last committed batch, and
/// nothing is left staged.
#[tokio::test(flavor = "multi_thread")]
async fn killed_and_racing_runs_into_a_delta_table_commit_every_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = delta_toml("dstorm", "max_files_per_batch = 1").replace(
        "format = \"delta\"\n",
        "format = \"delta\"\ndelta_checkpoint_interval = 2\n",
    );
    std::fs::write(root.join("pipeline.toml"), &toml).unwrap();
    let mut files = Vec::new();
    let mut killed = 0;
    for wave in 0..6usize {
        files.extend(gen_files(&root.join(format!("input/w{wave}")), 3, 2_000));
        let mut children: Vec<_> = (0..3).map(|_| crate::crash::spawn_run(root)).collect();
        let delay_ms = [20u64, 45, 80, 120, 180, 260][wave];
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        if let Some(i) = children
            .iter_mut()
            .position(|c| c.try_wait().unwrap().is_none())
        {
            let mut victim = children.remove(i);
            victim.kill().unwrap();
            victim.wait().unwrap();
            killed += 1;
        }
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "wave {wave}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(killed >= 3, "only {killed} kills landed mid-run");
    let last = crate::crash::spawn_run(root).wait_with_output().unwrap();
    assert!(
        last.status.success(),
        "{}",
        String::from_utf8_lossy(&last.stderr)
    );
    let app = app_of(root, &toml).await;
    let v = delta_view(&root.join("out/sink"), &app).await;
    let want = duckdb_rows(&files, SQL).await;
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
    assert_added_once(&v);
    let c = control_of(root, &toml).await;
    assert_eq!(v.txn, c.last_committed);
    assert_eq!(c.totals.files, files.len() as u64);
    assert_eq!(staged_files(&root.join("out/sink")), Vec::<String>::new());
}

/// A first batch whose query keeps no row still creates the table, with
/// the query's columns (as Spark's Delta sink does): readers open an
/// empty table, not a missing one, and a downstream pipeline can check
/// its query against it. Before: no table until a batch wrote rows. The
/// next batch's rows then read as DuckDB's one-shot query computes.
#[tokio::test(flavor = "multi_thread")]
async fn a_first_batch_without_rows_creates_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Trips over 1,000 miles: none in the first files.
    let sql = SQL.replace("trip_distance > 1.0", "trip_distance > 1000.0");
    let toml = delta_toml("empty", "").replace(SQL, &sql);
    let input = root.join("input");
    let files = gen_files(&input.join("a"), 2, 30);
    assert_eq!(
        run(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap()
            .batches
            .len(),
        1
    );
    let v = delta_view(&root.join("out/sink"), "-").await;
    assert!(v.deltalake.is_empty() && v.duckdb.is_empty());
    assert_eq!(v.version, 0);
    assert!(duckdb_rows(&files, &sql).await.is_empty());
    // The table's columns are the query's, as DuckDB names them.
    let entry = std::fs::read_to_string(root.join("out/sink/_delta_log/00000000000000000000.json"))
        .unwrap();
    let meta: Value = entry
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find_map(|a| a.get("metaData").cloned())
        .expect("the first commit holds the table's metaData");
    let schema: Value = serde_json::from_str(meta["schemaString"].as_str().unwrap()).unwrap();
    let names: Vec<String> = schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect();
    let described = duckdb_rows(&files, &format!("SELECT column_name FROM (DESCRIBE {sql})")).await;
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, described);
    assert_eq!(names.len(), 6);
    // A row that passes the filter arrives: the table takes it.
    let mut all = files;
    let late = input.join("b/long.parquet");
    std::fs::create_dir_all(late.parent().unwrap()).unwrap();
    let copy = format!(
        "import duckdb; duckdb.sql(\"COPY (SELECT * REPLACE (CAST(2000.0 AS DOUBLE) AS trip_distance) FROM \
         read_parquet('{}', hive_partitioning = false) LIMIT 3) TO '{}' (FORMAT parquet)\")",
        all[0].display(),
        late.display()
    );
    let out = std::process::Command::new(python())
        .args(["-c", &copy])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    all.push(late.clone());
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let v = delta_view(&root.join("out/sink"), "-").await;
    let want = duckdb_rows(&all, &sql).await;
    assert_eq!(want.len(), 3);
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);

    // A stateful query too (complete mode, a windowed GROUP BY whose
    // filter keeps nothing at first): the table is made with the columns
    // of the rows it writes, and the batch that writes rows adds them to
    // it without changing its schema.
    let grouped = complete_toml("grouped", "max_files_per_batch = 2")
        .replace(
            "FROM trips GROUP BY",
            "FROM trips WHERE trip_distance > 1000.0 GROUP BY",
        )
        .replace("out/sink", "grouped/sink")
        .replace("input\"", "input/a\"");
    run(&local_context(&pipeline(root, &grouped)))
        .await
        .unwrap();
    let v = delta_view(&root.join("grouped/sink"), "-").await;
    assert!(v.duckdb.is_empty() && v.deltalake.is_empty());
    let first = table_schema(&root.join("grouped/sink"), 0);
    std::fs::create_dir_all(input.join("a/late")).unwrap();
    std::fs::copy(&late, input.join("a/late/long.parquet")).unwrap();
    run(&local_context(&pipeline(root, &grouped)))
        .await
        .unwrap();
    let v = delta_view(&root.join("grouped/sink"), "-").await;
    let want = windowed_oracle(vec![input.join("a/late/long.parquet")]).await;
    assert!(!want.is_empty());
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
    assert_eq!(table_schema(&root.join("grouped/sink"), v.version), first);
}

/// The fields (name, type) of the newest `metaData` at or before
/// `version` of the local table at `table`.
fn table_schema(table: &Path, version: u64) -> Vec<(String, String)> {
    let mut found = None;
    for v in 0..=version {
        let entry =
            std::fs::read_to_string(table.join(format!("_delta_log/{v:020}.json"))).unwrap();
        for l in entry.lines() {
            let a: Value = serde_json::from_str(l).unwrap();
            if let Some(m) = a.get("metaData") {
                found = Some(m["schemaString"].as_str().unwrap().to_string());
            }
        }
    }
    let schema: Value = serde_json::from_str(&found.expect("a metaData")).unwrap();
    schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["type"].to_string(),
            )
        })
        .collect()
}
