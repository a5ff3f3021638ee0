//! `sink.partition_by`: Hive-style partition folders (`col=value/`) for
//! both sinks, and a Delta table's partition columns. Expected rows come
//! from DuckDB over the input; partition values are checked file by file
//! against what DuckDB reads in each; pruning is checked with the Delta
//! readers' own partition filters.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use serde_json::Value;

use crate::delta::delta_view;
use crate::support::*;

/// The partitioned query: a date and a tag with characters Hive escapes,
/// and nulls.
const PSQL: &str = r#"SELECT "VendorID", "PULocationID", trip_distance, fare_amount, CAST(tpep_pickup_datetime AS DATE) AS day, CASE WHEN "PULocationID" % 3 = 0 THEN 'a/b=c %' WHEN "PULocationID" % 3 = 1 THEN NULL ELSE 'plain é' END AS tag FROM trips WHERE trip_distance > 1.0"#;

/// A pipeline of [`PSQL`] partitioned by `by`, sink `format`.
pub(crate) fn partitioned_toml(name: &str, format: &str, by: &str) -> String {
    pipeline_toml(name, "parquet", "", "max_files_per_batch = 2")
        .replace(SQL, PSQL)
        .replace(
            "[sink]\nuri = \"out/sink\"\n",
            &format!("[sink]\nuri = \"out/sink\"\nformat = \"{format}\"\npartition_by = {by}\n"),
        )
}

/// DuckDB's one-shot rows of [`PSQL`] over `files`.
pub(crate) async fn want(files: &[std::path::PathBuf]) -> Vec<String> {
    duckdb_rows(files, PSQL).await
}

/// `delta_read.py` with `args`: its JSON answer.
fn delta_python(args: &[&str]) -> Value {
    serde_json::from_slice(&crate::delta::outside(args)).unwrap()
}

/// The distinct partition values DuckDB reads inside one file.
async fn values_in(file: &Path, cols: &str) -> Vec<String> {
    duckdb_sql(&format!(
        "SELECT DISTINCT {cols} FROM read_parquet('{}', hive_partitioning = false)",
        file.display()
    ))
    .await
}

/// A Parquet sink partitioned by a date and an escaped, nullable tag:
/// every committed part sits in the folders of the only values it holds
/// (Hive-escaped, nulls in `__HIVE_DEFAULT_PARTITION__`), the manifests'
/// rows are DuckDB's one-shot rows, and so are the rows DuckDB's Hive
/// reader reads from the folders' names.
#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_parquet_sink_writes_each_value_in_its_hive_folder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 4, 80);
    let toml = partitioned_toml("hive", "parquet", r#"["day", "tag"]"#);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let want = want(&files).await;
    assert_eq!(committed_rows(&root.join("out/sink"), "hive").await, want);
    let mut folders = std::collections::BTreeSet::new();
    for (_, _, parts) in manifest_files(&root.join("out/sink"), "hive").await {
        for part in parts {
            let rel = part.strip_prefix(root.join("out/sink")).unwrap();
            let segs: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            assert_eq!(segs.len(), 4, "batch=/day=/tag=/part: {rel:?}");
            let day = segs[1].strip_prefix("day=").unwrap().to_string();
            let tag = segs[2].strip_prefix("tag=").unwrap().to_string();
            let inside = values_in(&part, "CAST(day AS VARCHAR) AS d, tag").await;
            let tag_text = match tag.as_str() {
                "__HIVE_DEFAULT_PARTITION__" => "NULL".to_string(),
                "a%2Fb%3Dc %25" => "a/b=c %".to_string(),
                t => t.to_string(),
            };
            assert_eq!(inside, vec![format!("{day}|{tag_text}")], "{rel:?}");
            folders.insert(tag);
        }
    }
    assert_eq!(
        folders.into_iter().collect::<Vec<_>>(),
        ["__HIVE_DEFAULT_PARTITION__", "a%2Fb%3Dc %25", "plain é"]
    );
    // DuckDB's Hive reader takes day and tag from the folder names.
    let parts: Vec<std::path::PathBuf> = manifest_files(&root.join("out/sink"), "hive")
        .await
        .into_iter()
        .flat_map(|(_, _, f)| f)
        .collect();
    let hive = duckdb_sql(&format!(
        "SELECT \"VendorID\", \"PULocationID\", trip_distance, fare_amount, day, tag FROM \
         read_parquet([{}], hive_partitioning = true)",
        quoted(&parts)
    ))
    .await;
    assert_eq!(hive, want);
}

/// A Delta sink partitioned by a date and a tag: both readers read
/// DuckDB's one-shot rows; each add action's partitionValues are the only
/// values in its file; both readers prune by partition (deltalake's
/// partition filter, DuckDB's scanned files) to exactly the files of the
/// value.
#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_delta_sink_is_read_and_pruned_by_both_readers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 4, 80);
    let toml = partitioned_toml("dpart", "delta", r#"["day", "tag"]"#);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let table = root.join("out/sink");
    let want = want(&files).await;
    let v = delta_view(&table, "-").await;
    assert_eq!(v.deltalake, want);
    assert_eq!(v.duckdb, want);
    // The log's add actions name their partition values.
    let mut by_tag: std::collections::BTreeMap<String, usize> = Default::default();
    let mut adds = 0;
    for e in std::fs::read_dir(table.join("_delta_log")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        for line in std::fs::read_to_string(&p).unwrap().lines() {
            let a: Value = serde_json::from_str(line).unwrap();
            if let Some(m) = a.get("metaData") {
                assert_eq!(m["partitionColumns"], serde_json::json!(["day", "tag"]));
            }
            let Some(add) = a.get("add") else { continue };
            adds += 1;
            let path = percent_encoding::percent_decode_str(add["path"].as_str().unwrap())
                .decode_utf8_lossy()
                .into_owned();
            let pv = &add["partitionValues"];
            let inside = values_in(&table.join(&path), "CAST(day AS VARCHAR) AS d, tag").await;
            let tag = pv["tag"].as_str().unwrap_or("NULL");
            assert_eq!(
                inside,
                vec![format!("{}|{tag}", pv["day"].as_str().unwrap())],
                "{path}"
            );
            *by_tag.entry(tag.to_string()).or_default() += 1;
        }
    }
    assert_eq!(by_tag.len(), 3, "{by_tag:?}");
    // Pruning on a value Hive and URIs both escape.
    let n = by_tag["plain é"];
    let pruned = delta_python(&["prune", table.to_str().unwrap(), "tag", "plain é"]);
    assert_eq!(pruned["deltalake_files"], n);
    assert_eq!(pruned["duckdb_scanned"], n);
    assert_eq!(pruned["duckdb_total"], adds);
    assert!(n < adds);
}

/// What partition_by cannot take is refused when the query is checked,
/// naming the column and what to do: a column the query does not output
/// (and one that differs only in case), a timestamp; and a Delta table's
/// partition columns do not change (refused before anything is written;
/// `sluice reset` starts the table over with the new ones).
#[tokio::test(flavor = "multi_thread")]
async fn what_partition_by_cannot_take_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 30);
    let check = |toml: String| async move {
        run(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap_err()
            .to_string()
    };
    let e = check(partitioned_toml("p1", "parquet", r#"["zone"]"#)).await;
    assert!(e.contains("\"zone\"") && e.contains("partition_by"), "{e}");
    let e = check(partitioned_toml("p2", "parquet", r#"["Day"]"#)).await;
    assert!(e.contains("case-sensitive") && e.contains("\"day\""), "{e}");
    let e = check(
        partitioned_toml("p3", "delta", r#"["ts"]"#)
            .replace("AS tag FROM", "AS tag, tpep_pickup_datetime AS ts FROM"),
    )
    .await;
    assert!(e.contains("\"ts\"") && e.contains("CAST"), "{e}");
    // A stateful query's output is checked too.
    let e = check(partitioned_toml("p5", "parquet", r#"["zone"]"#).replace(
        PSQL,
        r#"SELECT "PULocationID", count(*) AS n FROM trips GROUP BY "PULocationID""#,
    ))
    .await;
    assert!(e.contains("\"zone\"") && e.contains("partition_by"), "{e}");
    assert!(!root.join("out/sink/_delta_log").exists());
    // A Delta table partitioned by day; the pipeline then says tag.
    let toml = partitioned_toml("p4", "delta", r#"["day"]"#);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let before = delta_view(&root.join("out/sink"), "-").await;
    gen_files(&root.join("input/more"), 1, 30);
    let changed = toml.replace(r#"partition_by = ["day"]"#, r#"partition_by = ["tag"]"#);
    let e = check(changed.clone()).await;
    assert!(e.contains("partition") && e.contains("sluice reset"), "{e}");
    let after = delta_view(&root.join("out/sink"), "-").await;
    assert_eq!(
        (after.version, after.deltalake),
        (before.version, before.deltalake)
    );
    sluice_engine::admin::reset(&local_context(&pipeline(root, &changed)))
        .await
        .unwrap();
    run(&local_context(&pipeline(root, &changed)))
        .await
        .unwrap();
    let v = delta_view(&root.join("out/sink"), "-").await;
    let mut files = walk_parquet(&root.join("input"));
    files.sort();
    assert_eq!(v.deltalake, want(&files).await);
    // The newest metaData (the new history's first commit) says tag.
    let newest = (0..=v.version)
        .rev()
        .map(|n| {
            std::fs::read_to_string(root.join(format!("out/sink/_delta_log/{n:020}.json"))).unwrap()
        })
        .find(|l| l.contains("\"metaData\""))
        .unwrap();
    assert!(newest.contains(r#""partitionColumns":["tag"]"#), "{newest}");
}

fn walk_parquet(dir: &Path) -> Vec<std::path::PathBuf> {
    crate::stateful::walk(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect()
}

/// A downstream Delta source reads a Sluice pipeline's partitioned Delta
/// table (its files keep the partition columns): DuckDB's one-shot rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_delta_table_of_sluice_is_read_as_a_source() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 3, 60);
    run(&local_context(&pipeline(
        root,
        &partitioned_toml("up", "delta", r#"["tag"]"#),
    )))
    .await
    .unwrap();
    let down = r#"name = "down"
[source]
uri = "out/sink"
format = "delta"
table = "up"
[query]
sql = "SELECT * FROM up"
[sink]
uri = "down/sink"
[checkpoint]
uri = "down/checkpoint"
"#;
    run(&local_context(&pipeline(root, down))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        want(&files).await
    );
}

/// Failing each write of a partitioned Delta run in turn, then running
/// again: both readers read DuckDB's rows, no file is added twice.
#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_of_a_partitioned_delta_run_then_rerunning_gives_the_clean_table() {
    let toml = partitioned_toml("pcrash", "delta", r#"["tag"]"#);
    let clean = tempfile::tempdir().unwrap();
    let files = gen_files(&clean.path().join("input"), 4, 30);
    let writes = Arc::new(AtomicU64::new(0));
    run(&fault_context(clean.path(), &toml, writes.clone(), 0))
        .await
        .unwrap();
    let total = writes.load(std::sync::atomic::Ordering::SeqCst);
    let want = want(&files).await;
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        gen_files(&dir.path().join("input"), 4, 30);
        let failed = run(&fault_context(
            dir.path(),
            &toml,
            Arc::new(AtomicU64::new(0)),
            k,
        ))
        .await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        run(&fault_context(
            dir.path(),
            &toml,
            Arc::new(AtomicU64::new(0)),
            0,
        ))
        .await
        .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        let v = delta_view(&dir.path().join("out/sink"), "-").await;
        assert_eq!(v.deltalake, want, "after failing write {k}: deltalake");
        assert_eq!(v.duckdb, want, "after failing write {k}: duckdb");
        crate::delta::assert_added_once(&v);
    }
}
