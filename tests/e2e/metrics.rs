//! CloudWatch Embedded Metric Format lines: a run's lines (a lag line
//! when the planner looks for input, one per committed batch) checked by
//! `tests/e2e/emf.py` against the specification's structure (jsonschema),
//! and their values against the commit records and the input.

use std::sync::{Arc, Mutex};

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn metric_lines_follow_the_emf_specification_and_match_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 3, 80);
    let toml = pipeline_toml("emf", "parquet", "", "max_files_per_batch = 2");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut ctx = local_context(&pipeline(root, &toml));
    let sink = lines.clone();
    ctx.metrics = Some(Arc::new(move |l: &str| {
        sink.lock().unwrap().push(l.to_string())
    }));
    let ran = run(&ctx).await.unwrap();
    assert_eq!(ran.batches.len(), 2);
    let before_idle = lines.lock().unwrap().len();
    run(&ctx).await.unwrap(); // idle: a lag line of zeros
    let lines = lines.lock().unwrap().clone();
    assert_eq!(lines.len(), before_idle + 1, "one line from the idle run");
    let checked = check_emf(root, &lines);
    assert_eq!(checked, lines.len().to_string());
    let docs: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let batch_lines: Vec<&serde_json::Value> =
        docs.iter().filter(|d| d.get("RowsIn").is_some()).collect();
    let lag: Vec<&serde_json::Value> = docs
        .iter()
        .filter(|d| d.get("FilesWaiting").is_some())
        .collect();
    assert_eq!(batch_lines.len(), 2, "{lines:?}");
    // When the run planned, when it found nothing more, when idle.
    assert!(lag.len() >= 2, "{lines:?}");
    // The first lag line: every input file waiting, their bytes, and the
    // oldest one's age (its modification time to the plan).
    assert_eq!(lag[0]["FilesWaiting"], 3.0);
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert_eq!(lag[0]["BytesWaiting"].as_f64(), Some(bytes as f64));
    assert!(lag[0]["OldestWaitingAge"].as_f64().unwrap() >= 0.0);
    assert_eq!(lag.last().unwrap()["FilesWaiting"], 0.0);
    assert_eq!(lag.last().unwrap()["OldestWaitingAge"], 0.0);
    for (d, want) in batch_lines.iter().zip(&ran.batches) {
        assert_eq!(d["Pipeline"], "emf");
        assert_eq!(d["batch"], want.batch);
        assert_eq!(d["RowsIn"].as_f64(), Some(want.rows_in as f64));
        assert_eq!(d["RowsOut"].as_f64(), Some(want.rows_out as f64));
        assert_eq!(d["Files"].as_f64(), Some(want.files as f64));
        assert_eq!(d["BytesRead"].as_f64(), Some(want.bytes as f64));
        assert!(d["BatchCost"].as_f64().unwrap() > 0.0);
        assert_eq!(d["_aws"]["CloudWatchMetrics"][0]["Namespace"], "Sluice");
    }
}
