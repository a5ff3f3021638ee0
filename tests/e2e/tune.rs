//! `sluice tune` on a pipeline whose tasks compute (a hash of long strings
//! over local files) and on one whose tasks wait (many small files read
//! from S3, a moto server on loopback): the operator's recommended memory
//! differs, each explained. The runs are `sluice` processes, so the CPU
//! time they measure is theirs, not the other tests'. The model's own
//! decisions are unit tests (`engine/src/tune.rs`); this checks the
//! measurement feeds it: a loaded machine lowers both CPU shares, so only
//! their order and the recommendations' order are asserted.

use std::path::Path;
use std::process::Command;

use bytes::Bytes;
use sluice_engine::storage::{PutMode, S3Config, S3Store, Store};

use crate::support::*;

fn sluice(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "sluice {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Run the pipeline at `dir/pipeline.toml`, then what `sluice tune` says
/// of its operator: (CPU share, recommended MB, why).
fn run_and_tune(dir: &Path, toml: &str) -> (f64, u64, String) {
    let file = dir.join("pipeline.toml");
    std::fs::write(&file, toml).unwrap();
    let file = file.to_str().unwrap();
    sluice(&["run", file]);
    let report: serde_json::Value =
        serde_json::from_str(&sluice(&["--json", "tune", file])).unwrap();
    let op = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == "operator")
        .unwrap_or_else(|| panic!("no operator in {report}"))
        .clone();
    // The planner and committer are measured and tuned too.
    let functions = report["functions"].as_array().unwrap();
    assert_eq!(functions.len(), 3, "{report}");
    assert!(
        functions
            .iter()
            .all(|f| f["cpu_share"].is_number() && f["recommended_mb"].is_number()),
        "{report}"
    );
    (
        op["cpu_share"].as_f64().unwrap_or_else(|| panic!("{op}")),
        op["recommended_mb"]
            .as_u64()
            .unwrap_or_else(|| panic!("{op}")),
        op["why"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn tune_tells_tasks_that_compute_from_tasks_that_wait() {
    let dir = tempfile::tempdir().unwrap();

    let computing = dir.path().join("cpu");
    gen_files(&computing.join("data"), 2, 100_000);
    let (cpu_share, cpu_mb, cpu_why) = run_and_tune(
        &computing,
        r#"name = "computes"
[source]
uri = "data/"
format = "parquet"
table = "trips"
[query]
sql = '''SELECT "PULocationID" AS zone, md5(repeat(CAST(trip_distance AS VARCHAR), 400)) AS h FROM trips'''
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_files_per_batch = 1
"#,
    );

    let cfg = S3Config::from_env().await;
    let bucket = fresh_bucket(&cfg, "tune").await;
    let waiting = dir.path().join("io");
    let files = gen_files(&waiting.join("data"), 40, 100);
    let source = S3Store::new(&cfg, &bucket, "landing");
    for f in &files {
        let key = f
            .strip_prefix(waiting.join("data"))
            .unwrap()
            .to_str()
            .unwrap();
        source
            .put(
                key,
                Bytes::from(std::fs::read(f).unwrap()),
                PutMode::Overwrite,
            )
            .await
            .unwrap();
    }
    let (io_share, io_mb, io_why) = run_and_tune(
        &waiting,
        &format!(
            r#"name = "waits"
[source]
uri = "s3://{bucket}/landing/"
format = "parquet"
table = "trips"
[query]
sql = '''SELECT "PULocationID" AS zone, fare_amount FROM trips WHERE fare_amount > 10'''
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_files_per_batch = 40
"#
        ),
    );
    eprintln!("computing: {cpu_share:.2} -> {cpu_mb} MB: {cpu_why}");
    eprintln!("waiting: {io_share:.2} -> {io_mb} MB: {io_why}");
    assert!(
        cpu_share > io_share,
        "CPU shares: computing {cpu_share}, waiting {io_share}"
    );
    assert!(
        cpu_mb > io_mb,
        "computing tasks get {cpu_mb} MB, waiting ones {io_mb} MB"
    );
    for (why, share) in [(&cpu_why, cpu_share), (&io_why, io_share)] {
        let pct = format!("{}%", (share.min(1.0) * 100.0).round());
        assert!(why.contains(&pct) && why.contains("MB"), "{why}");
    }
}
