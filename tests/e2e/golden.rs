//! Golden cases of stateful queries (`tests/golden/stateful/`): each case
//! is a pipeline file and the output expected from each batch, worked out
//! by hand (the reasoning is in each `expected.txt`), over the same three
//! arrivals of CSV rows (`input/run-N/`), one run each. A case per window
//! kind (tumbling, sliding, session, none), output mode (append, update,
//! complete) and late policy (drop, side output). The committed rows of
//! each batch are read back by DuckDB from the files its manifest names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::support::*;
use sluice_engine::checkpoint::Totals;

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/stateful")
}

/// An `expected.txt`, comments dropped: `late_rows = N` (and for a
/// `[deduplicate]` case `duplicates = N`), then per batch
/// with output a `[batch N]` (or `[batch N complete]`) header and its rows
/// sorted, then `[late]` and the late rows, if any.
fn expected(case: &Path) -> String {
    let text = std::fs::read_to_string(case.join("expected.txt")).unwrap();
    let mut out = Vec::new();
    let mut rows: Vec<String> = Vec::new();
    let flush = |out: &mut Vec<String>, rows: &mut Vec<String>| {
        rows.sort();
        out.append(rows);
    };
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') || line.starts_with("late_rows") || line.starts_with("duplicates")
        {
            flush(&mut out, &mut rows);
            out.push(line.to_string());
        } else {
            rows.push(line.to_string());
        }
    }
    flush(&mut out, &mut rows);
    out.join("\n")
}

/// What the case's runs committed, in the same form.
async fn actual(root: &Path, name: &str, columns: &str, totals: &Totals) -> String {
    let sink = root.join("out/sink");
    let mut out = vec![format!("late_rows = {}", totals.late_rows)];
    if name.starts_with("dedup") {
        out.push(format!("duplicates = {}", totals.duplicates));
    }
    let mut batches = BTreeMap::new();
    for (batch, complete, files) in manifest_files(&sink, name).await {
        if files.is_empty() {
            continue;
        }
        let mut rows = duckdb_sql(&format!(
            "SELECT {columns} FROM read_parquet([{}], hive_partitioning = false)",
            quoted(&files)
        ))
        .await;
        rows.sort();
        batches.insert(batch, (complete, rows));
    }
    for (batch, (complete, rows)) in batches {
        out.push(if complete {
            format!("[batch {batch} complete]")
        } else {
            format!("[batch {batch}]")
        });
        out.extend(rows);
    }
    let late: Vec<PathBuf> = std::fs::read_dir(sink.join("_late"))
        .into_iter()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .collect();
    if !late.is_empty() {
        out.push("[late]".into());
        let mut rows = duckdb_sql(&format!(
            "SELECT ts, k, v FROM read_parquet([{}], hive_partitioning = false)",
            quoted(&late)
        ))
        .await;
        rows.sort();
        out.extend(rows);
    }
    out.join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn stateful_golden_cases() {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(golden())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("pipeline.toml").exists())
        .collect();
    cases.sort();
    assert_eq!(cases.len(), 14, "{cases:?}");
    let mut failed = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_str().unwrap().to_string();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let toml = std::fs::read_to_string(case.join("pipeline.toml")).unwrap();
        for arrival in 1..=3 {
            let from = golden().join(format!("input/run-{arrival}"));
            std::fs::create_dir_all(root.join("input")).unwrap();
            for f in std::fs::read_dir(&from).unwrap() {
                let f = f.unwrap();
                std::fs::copy(f.path(), root.join("input").join(f.file_name())).unwrap();
            }
            run(&local_context(&pipeline(root, &toml)))
                .await
                .unwrap_or_else(|e| panic!("{name}, run {arrival}: {e}"));
        }
        let columns = if name.starts_with("groupby") {
            "k, n, total"
        } else if name == "dedup-rows" {
            "ts, k, v"
        } else {
            "ws, we, k, n, total"
        };
        let totals = control_of(root, &toml).await.totals;
        let (got, want) = (actual(root, &name, columns, &totals).await, expected(case));
        if got != want {
            failed.push(format!(
                "{name}:\n--- expected\n{want}\n--- committed\n{got}"
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
