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

/// A file limit that cuts every run into batches of one file: `sluice
/// tune` projects how the recommended limits cut the same run and what it
/// would cost; running the same files under those limits (a fresh
/// checkpoint and sink) takes the projected batches and tasks, its
/// measured cost a run is lower, and both outputs equal DuckDB's.
#[tokio::test(flavor = "multi_thread")]
async fn tune_raises_limits_that_cut_runs_and_the_run_costs_less() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("data"), 6, 2_000);
    let toml = |name: &str, limits: &str| {
        format!(
            r#"name = "{name}"
[source]
uri = "data/"
format = "parquet"
table = "trips"
[query]
sql = '''{SQL}'''
[sink]
uri = "out/{name}/sink"
[checkpoint]
uri = "out/{name}/checkpoint"
[limits]
{limits}
"#
        )
    };
    let before = root.join("before.toml");
    std::fs::write(&before, toml("before", "max_files_per_batch = 1")).unwrap();
    let before = before.to_str().unwrap();
    sluice(&["run", before]);
    let tuned: serde_json::Value =
        serde_json::from_str(&sluice(&["--json", "tune", before])).unwrap();
    let advice = &tuned["limits"];
    assert_eq!(advice["runs_cut"], 1, "{tuned}");
    let rec = |limit: &str| {
        advice["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["limit"] == limit)
            .unwrap_or_else(|| panic!("no {limit} in {advice}"))["recommended"]
            .as_u64()
            .unwrap()
    };
    let (task, batch, batch_files) = (
        rec("max_bytes_per_task"),
        rec("max_bytes_per_batch"),
        rec("max_files_per_batch"),
    );
    assert!(batch_files >= 6, "{advice}");
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    // By hand: the files fit one batch and one task under the advice.
    assert!(bytes <= task && bytes <= batch, "{bytes} bytes: {advice}");
    let printed = sluice(&["tune", before]);
    assert!(
        printed.contains("max_files_per_batch = 1 -> ")
            && printed.contains("a run's batches: $")
            && printed.contains("1 run cut into several batches"),
        "{printed}"
    );

    let after = root.join("after.toml");
    std::fs::write(
        &after,
        toml(
            "after",
            &format!(
                "max_files_per_batch = {batch_files}\nmax_bytes_per_batch = {batch}\n\
                 max_bytes_per_task = {task}"
            ),
        ),
    )
    .unwrap();
    let after = after.to_str().unwrap();
    sluice(&["run", after]);
    let cost = |file: &str| -> (f64, usize) {
        let r: serde_json::Value =
            serde_json::from_str(&sluice(&["--json", "cost", file])).unwrap();
        (
            r["per_run"].as_f64().unwrap(),
            r["batches"].as_array().unwrap().len(),
        )
    };
    let (cost_before, batches_before) = cost(before);
    let (cost_after, batches_after) = cost(after);
    assert_eq!((batches_before, batches_after), (6, 1));
    let tasks: u64 = commit_records(root, &std::fs::read_to_string(after).unwrap())
        .await
        .iter()
        .flat_map(|c| &c.usage.functions)
        .filter(|f| f.function == "operator")
        .map(|f| f.invocations)
        .sum();
    assert_eq!(tasks, 1);
    eprintln!("a run: ${cost_before:.6} in 6 batches, ${cost_after:.6} in 1");
    assert!(cost_after < cost_before, "{cost_before} -> {cost_after}");
    let expected = duckdb_rows(&files, SQL).await;
    for name in ["before", "after"] {
        assert_eq!(
            committed_rows(&root.join(format!("out/{name}/sink")), name).await,
            expected,
            "{name}"
        );
    }
}

/// `limits.task_seconds`: the planner cuts tasks at the bytes the
/// operator's tasks read in that time at the pace control recorded from
/// the batches before, records the cut in the plan, and never passes
/// `max_bytes_per_task`. The expected cut and tasks are computed here from
/// control's pace and the files' sizes; the output equals DuckDB's.
#[tokio::test(flavor = "multi_thread")]
async fn the_planner_cuts_tasks_at_the_measured_pace() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Tasks that compute (a hash of long strings): a few MiB a second.
    let mut files = gen_files(&root.join("data/a"), 3, 100_000);
    let toml = |batch_files: u64| {
        format!(
            r#"name = "paced"
[source]
uri = "data/"
format = "parquet"
table = "trips"
[query]
sql = '''SELECT "PULocationID" AS zone, md5(repeat(CAST(trip_distance AS VARCHAR), 1000)) AS h FROM trips'''
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_files_per_batch = {batch_files}
task_seconds = 1
"#
        )
    };
    let file = root.join("pipeline.toml");
    let file_str = file.to_str().unwrap().to_string();
    std::fs::write(&file, toml(1)).unwrap();
    sluice(&["run", &file_str]);
    let first = commit_records(root, &toml(1)).await;
    assert_eq!(first.len(), 3);
    let control = control_of(root, &toml(1)).await;
    let pace = control.pace.expect("the pace recorded");
    // By hand: each batch adds its bytes and billed task time to three
    // quarters of what came before.
    let mut want = (0u64, 0u64);
    for c in &first {
        let ms: u64 = c
            .usage
            .functions
            .iter()
            .filter(|f| f.function == "operator")
            .map(|f| f.billed_ms)
            .sum();
        want = (want.0 - want.0 / 4 + c.bytes_read, want.1 - want.1 / 4 + ms);
    }
    assert_eq!((pace.bytes, pace.ms), want);
    let cut = ((pace.bytes as f64 / pace.ms as f64 * 1000.0) as u64).clamp(1 << 20, 256 << 20);

    // Six more files, one batch: tasks cut at the pace.
    files.extend(gen_files(&root.join("data/b"), 6, 100_000));
    std::fs::write(&file, toml(6)).unwrap();
    sluice(&["run", &file_str]);
    let ctx = local_context(&pipeline(root, &toml(6)));
    let off = ctx
        .checkpoint
        .offsets(3)
        .await
        .unwrap()
        .expect("batch 3 planned");
    assert_eq!(off.task_bytes, Some(cut), "{off:?}");
    // The same packing, by hand: files in order, a new task when the next
    // would pass the cut.
    let mut tasks: Vec<(u64, usize)> = Vec::new();
    for f in &off.inputs {
        match tasks.last_mut() {
            Some(t) if t.0 + f.size <= cut => {
                t.0 += f.size;
                t.1 += 1;
            }
            _ => tasks.push((f.size, 1)),
        }
    }
    let planned: Vec<(u64, usize)> = off
        .tasks
        .iter()
        .map(|t| (t.bytes, t.inputs.len()))
        .collect();
    assert_eq!(planned, tasks);
    eprintln!(
        "pace {:.1} MiB/s: tasks cut at {:.1} MiB, {} tasks for 6 files",
        pace.bytes as f64 / pace.ms as f64 * 1000.0 / 1048576.0,
        cut as f64 / 1048576.0,
        tasks.len()
    );
    // Files of about 3 MiB against a pace of a few MiB a second in a
    // debug build: the batch is more than one task.
    assert!(tasks.len() > 1, "{tasks:?}");
    assert_eq!(
        committed_rows(&root.join("out/sink"), "paced").await,
        duckdb_rows(
            &files,
            "SELECT \"PULocationID\" AS zone, md5(repeat(CAST(trip_distance AS VARCHAR), 1000)) AS h FROM trips"
        )
        .await
    );
}
