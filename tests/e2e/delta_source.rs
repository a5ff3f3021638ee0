//! A Delta table as a source (`source.format = "delta"`): a pipeline
//! reads another's Delta sink (or any writer's table) snapshot first, then
//! version by version, exactly once. Expected rows come from DuckDB over
//! the upstream's input files (and the rows an outside writer appended).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::delta::{delta_sql, delta_toml, delta_view, outside};
use crate::support::*;

/// A pipeline `down` reading the Delta table at `out/sink` (the upstream
/// `up` under the same root), writing `down/sink` (`sink_format`).
fn down_toml(limits: &str, extra_source: &str, sink_format: &str) -> String {
    format!(
        r#"name = "down"
[source]
uri = "out/sink"
format = "delta"
table = "up"
{extra_source}
[query]
sql = "SELECT * FROM up"
[sink]
uri = "down/sink"
format = "{sink_format}"
[checkpoint]
uri = "down/checkpoint"
[limits]
{limits}
"#
    )
}

/// The upstream: a Delta sink over `root/input`, a batch per file.
fn up_toml() -> String {
    delta_toml("up", "max_files_per_batch = 1")
}

async fn up(root: &Path) -> u64 {
    run(&local_context(&pipeline(root, &up_toml())))
        .await
        .unwrap()
        .batches
        .len() as u64
}

async fn down(root: &Path, toml: &str) -> sluice_engine::Result<u64> {
    run(&local_context(&pipeline(root, toml)))
        .await
        .map(|s| s.batches.len() as u64)
}

/// The downstream's Delta table as both readers read it (they must agree).
async fn down_rows(root: &Path) -> Vec<String> {
    let v = delta_view(&root.join("down/sink"), "-").await;
    assert_eq!(v.deltalake, v.duckdb, "the two readers differ");
    v.deltalake
}

/// A chain over Delta: the downstream's first run reads the upstream
/// table's snapshot (three versions, in batches of two files), later runs
/// only the versions after its cursor (the upstream's next batches, then
/// an outside writer's append); each time both readers of the
/// downstream's own Delta table read DuckDB's one-shot rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_delta_table_is_read_snapshot_first_then_version_by_version() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = down_toml("max_files_per_batch = 2", "", "delta");
    let mut files = gen_files(&root.join("input/a"), 3, 30);
    assert_eq!(up(root).await, 3);
    assert_eq!(down(root, &toml).await.unwrap(), 2, "3 files, 2 a batch");
    assert_eq!(down_rows(root).await, duckdb_rows(&files, SQL).await);
    // Nothing new: no batch.
    assert_eq!(down(root, &toml).await.unwrap(), 0);
    files.extend(gen_files(&root.join("input/b"), 2, 30));
    assert_eq!(up(root).await, 2);
    assert_eq!(
        down(root, &toml).await.unwrap(),
        1,
        "two versions, one file each"
    );
    assert_eq!(down_rows(root).await, duckdb_rows(&files, SQL).await);
    // An outside writer's blind append is read too.
    let row = r#"[{"VendorID": 77, "tpep_pickup_datetime": null, "PULocationID": 7, "trip_distance": 7.5, "fare_amount": 70.25, "surcharges": 1.5}]"#;
    outside(&["append", root.join("out/sink").to_str().unwrap(), row]);
    assert_eq!(down(root, &toml).await.unwrap(), 1);
    let mut want = duckdb_rows(&files, SQL).await;
    want.extend(
        duckdb_sql(
            "SELECT 77::INTEGER AS \"VendorID\", NULL::TIMESTAMP AS tpep_pickup_datetime, \
             7::INTEGER AS \"PULocationID\", 7.5::DOUBLE AS trip_distance, 70.25::DOUBLE AS \
             fare_amount, 1.5::DOUBLE AS surcharges",
        )
        .await,
    );
    want.sort();
    let mut got = down_rows(root).await;
    got.sort();
    assert_eq!(got, want);
}

/// A version with more files than a batch takes is read across batches:
/// the cursor records the position inside it.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_larger_than_a_batch_spans_batches() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // One upstream batch of four tasks: one version adding four parts.
    let up = delta_toml(
        "up",
        "max_files_per_batch = 4\nmax_bytes_per_task = \"1 B\"",
    );
    let files = gen_files(&root.join("input"), 4, 30);
    let s = run(&local_context(&pipeline(root, &up))).await.unwrap();
    assert_eq!(s.batches.len(), 1);
    let toml = down_toml("max_files_per_batch = 1", "", "parquet");
    // The first run reads the snapshot one file a batch.
    assert_eq!(down(root, &toml).await.unwrap(), 4);
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files, SQL).await
    );
    // A second version of four parts, read one part a batch.
    let more = gen_files(&root.join("input/b"), 4, 30);
    let s = run(&local_context(&pipeline(root, &up))).await.unwrap();
    assert_eq!(s.batches.len(), 1);
    assert_eq!(down(root, &toml).await.unwrap(), 4);
    let all: Vec<_> = files.iter().chain(&more).cloned().collect();
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&all, SQL).await
    );
}

/// A version that removes files (an outside writer's DELETE) fails the
/// downstream's batch, naming the version and `ignore_changes`; with
/// `ignore_changes = true` it is skipped whole and later appends are read.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_that_removes_files_fails_unless_changes_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut files = gen_files(&root.join("input/a"), 2, 30);
    up(root).await;
    let toml = down_toml("", "", "parquet");
    down(root, &toml).await.unwrap();
    outside(&[
        "delete",
        root.join("out/sink").to_str().unwrap(),
        "\"VendorID\" = 1",
    ]);
    files.extend(gen_files(&root.join("input/b"), 1, 30));
    up(root).await;
    let e = down(root, &toml).await.unwrap_err().to_string();
    assert!(
        e.contains("version 2") && e.contains("ignore_changes"),
        "{e}"
    );
    let c = control_of(root, &toml).await;
    assert_eq!(c.last_committed, Some(0), "nothing committed");
    // `sluice check` says so too, and `sluice show` shows why nothing can
    // be read (before, check passed and show printed nothing).
    let e = check_error(root, &toml).await;
    assert!(e.contains("ignore_changes"), "{e}");
    let s = sluice_engine::admin::status(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap();
    assert!(
        s.waiting_error
            .as_deref()
            .is_some_and(|w| w.contains("ignore_changes")),
        "{:?}",
        s.waiting_error
    );
    let ignoring = down_toml("", "ignore_changes = true", "parquet");
    assert_eq!(down(root, &ignoring).await.unwrap(), 1);
    // Every row once: the deleted rows were read before the DELETE, whose
    // rewritten files are skipped.
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files, SQL).await
    );
}

/// The upstream pipeline is reset: its table gets a new id. The
/// downstream refuses it, naming `sluice reset`; after its own reset it
/// reads the table anew.
#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_table_is_refused_until_the_downstream_is_reset() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 2, 30);
    up(root).await;
    let toml = down_toml("", "", "parquet");
    down(root, &toml).await.unwrap();
    sluice_engine::admin::reset(&local_context(&pipeline(root, &up_toml())))
        .await
        .unwrap();
    up(root).await;
    let e = down(root, &toml).await.unwrap_err().to_string();
    assert!(e.contains("replaced") && e.contains("sluice reset"), "{e}");
    sluice_engine::admin::reset(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap();
    down(root, &toml).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files, SQL).await
    );
}

/// The issue's proof: the upstream Delta sink fails at each of its writes
/// in turn; the downstream Delta source runs on what the failure left,
/// then the upstream finishes and the downstream runs again: the
/// downstream holds exactly the rows DuckDB computes over the input, each
/// once.
#[tokio::test(flavor = "multi_thread")]
async fn a_chain_over_delta_holds_the_one_shot_rows_after_any_upstream_failure() {
    let up_ctx = |root: &Path, writes: Arc<AtomicU64>, fail_at: u64| {
        fault_context(
            root,
            &delta_toml("up", "max_files_per_batch = 2").replace(
                "format = \"delta\"\n",
                "format = \"delta\"\ndelta_checkpoint_interval = 1\n",
            ),
            writes,
            fail_at,
        )
    };
    let clean = tempfile::tempdir().unwrap();
    gen_files(&clean.path().join("input"), 4, 40);
    let writes = Arc::new(AtomicU64::new(0));
    run(&up_ctx(clean.path(), writes.clone(), 0)).await.unwrap();
    let total = writes.load(Ordering::SeqCst);
    let toml = down_toml("max_files_per_batch = 1", "", "parquet");
    eprintln!("delta chain: failing each of {total} upstream writes in turn");
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files = gen_files(&root.join("input"), 4, 40);
        assert!(
            run(&up_ctx(root, Arc::new(AtomicU64::new(0)), k))
                .await
                .is_err()
        );
        down(root, &toml)
            .await
            .unwrap_or_else(|e| panic!("downstream after failing upstream write {k}: {e}"));
        run(&up_ctx(root, Arc::new(AtomicU64::new(0)), 0))
            .await
            .unwrap();
        down(root, &toml).await.unwrap();
        assert_eq!(
            committed_rows(&root.join("down/sink"), "down").await,
            duckdb_rows(&files, SQL).await,
            "downstream after failing upstream write {k}"
        );
    }
}

/// A table whose older log entries another engine cleaned up is read from
/// its newest checkpoint (the snapshot), then version by version; a
/// version cleaned up before the downstream read it is refused, naming
/// `sluice reset`; a partitioned table (another writer's) is refused,
/// naming its partition columns.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_is_read_from_its_checkpoint_and_what_cannot_be_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let up = delta_toml("up", "max_files_per_batch = 1").replace(
        "format = \"delta\"\n",
        "format = \"delta\"\ndelta_checkpoint_interval = 2\n",
    );
    let mut files = gen_files(&root.join("input/a"), 5, 20);
    run(&local_context(&pipeline(root, &up))).await.unwrap();
    let log = root.join("out/sink/_delta_log");
    assert!(log.join("00000000000000000003.checkpoint.parquet").exists());
    for v in 0..=3u64 {
        std::fs::remove_file(log.join(format!("{v:020}.json"))).unwrap();
    }
    std::fs::remove_file(log.join("00000000000000000001.checkpoint.parquet")).unwrap();
    let toml = down_toml("", "", "parquet");
    down(root, &toml).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files, SQL).await
    );
    files.extend(gen_files(&root.join("input/b"), 1, 20));
    run(&local_context(&pipeline(root, &up))).await.unwrap();
    assert_eq!(down(root, &toml).await.unwrap(), 1);
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        duckdb_rows(&files, SQL).await
    );
    // Versions 6 and 7; 6 is cleaned up before the downstream reads it.
    gen_files(&root.join("input/c"), 2, 20);
    run(&local_context(&pipeline(root, &up))).await.unwrap();
    std::fs::remove_file(log.join(format!("{:020}.json", 6))).unwrap();
    let e = down(root, &toml).await.unwrap_err().to_string();
    assert!(
        e.contains("version 6") && e.contains("gone") && e.contains("sluice reset"),
        "{e}"
    );

    // A folder of Parquet files is not a Delta table: said, not waited on.
    let toml = down_toml("", "", "parquet")
        .replace("uri = \"out/sink\"", "uri = \"input\"")
        .replace("name = \"down\"", "name = \"files\"");
    let e = down(root, &toml).await.unwrap_err().to_string();
    assert!(e.contains("not a Delta table"), "{e}");
}

/// The sweep's case: a table another engine wrote with a list column
/// (deltalake names the element `element`; Arrow, `item`) and timestamps
/// in another zone: read as DuckDB's delta_scan reads it (before, every
/// file was refused as "array<bigint> in the file, pinned array<bigint>").
#[tokio::test(flavor = "multi_thread")]
async fn another_engines_list_columns_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let table = root.join("lists");
    outside(&[
        "create",
        table.to_str().unwrap(),
        r#"[{"id": 1, "arr": [1, 2, 3]}, {"id": 2, "arr": []}, {"id": 3, "arr": null}]"#,
    ]);
    outside(&[
        "append",
        table.to_str().unwrap(),
        r#"[{"id": 4, "arr": [40, null]}]"#,
    ]);
    let toml = down_toml("", "", "parquet").replace("uri = \"out/sink\"", "uri = \"lists\"");
    down(root, &toml).await.unwrap();
    let v = delta_view(&table, "-").await;
    assert_eq!(v.duckdb.len(), 4);
    assert_eq!(v.deltalake, v.duckdb);
    assert_eq!(
        committed_rows(&root.join("down/sink"), "down").await,
        v.duckdb
    );
}

/// A pipeline `name` reading the table at `root/<table>` with
/// `on_schema_change = policy`, writing Parquet under `<name>/`.
fn table_toml(name: &str, table: &str, policy: &str) -> String {
    down_toml("", &format!("on_schema_change = \"{policy}\""), "parquet")
        .replace("uri = \"out/sink\"", &format!("uri = \"{table}\""))
        .replace("name = \"down\"", &format!("name = \"{name}\""))
        .replace("down/", &format!("{name}/"))
}

/// Another engine's table is read with the schema its log holds, not the
/// one of its first file: a table another writer evolved (a column added
/// by a later version) reads the column as null in the older files
/// (before: the schema came from the oldest file and the newer file was
/// refused); an empty table created with a schema is checked against it
/// at once (before: `sluice check` waited for a file), and its map column is read whatever
/// its writer named the entries; a change of the table's schema after the
/// pin is refused naming the Delta table, or taken under add-columns.
/// Expected rows: DuckDB's delta_scan (and deltalake, which must agree).
#[tokio::test(flavor = "multi_thread")]
async fn another_engines_tables_are_read_with_the_schema_in_their_log() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let evolved = root.join("evolved");
    let t = evolved.to_str().unwrap();
    outside(&["create", t, r#"[{"id": 1, "v": "a"}, {"id": 3, "v": "c"}]"#]);
    outside(&["merge", t, r#"[{"id": 2, "v": "b", "tip": 2.5}]"#]);
    down(root, &table_toml("ev", "evolved", "fail"))
        .await
        .unwrap();
    let v = delta_view(&evolved, "-").await;
    assert_eq!(v.deltalake, v.duckdb);
    assert_eq!(v.duckdb, ["1|a|NULL", "2|b|2.5", "3|c|NULL"]);
    assert_eq!(committed_rows(&root.join("ev/sink"), "ev").await, v.duckdb);

    let maps = root.join("maps");
    let t = maps.to_str().unwrap();
    outside(&["empty", t, r#"{"id": "int64", "m": "map<string, int64>"}"#]);
    let toml = table_toml("mp", "maps", "fail");
    assert_eq!(down(root, &toml).await.unwrap(), 0);
    // `sluice check` checks the query against the empty table's schema
    // now (before: "no input file ... to infer the schema from").
    let report = sluice_engine::admin::check(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap();
    assert!(
        report
            .checked
            .iter()
            .any(|c| c == "source schema (2 columns)"),
        "{:?}",
        report.checked
    );
    let wrong = toml.replace("SELECT * FROM up", "SELECT nope FROM up");
    let e = check_error(root, &wrong).await;
    assert!(e.contains("nope"), "{e}");
    outside(&[
        "append",
        t,
        r#"[{"id": 1, "m": [["a", 1], ["b", 2]]}, {"id": 2, "m": null}, {"id": 3, "m": []}]"#,
    ]);
    assert_eq!(down(root, &toml).await.unwrap(), 1);
    let v = delta_view(&maps, "-").await;
    assert_eq!(v.deltalake, v.duckdb);
    assert_eq!(v.duckdb.len(), 3);
    assert_eq!(committed_rows(&root.join("mp/sink"), "mp").await, v.duckdb);

    // The table's schema changes after the pin: refused under `fail`,
    // naming the table's change and what to do; nothing committed.
    outside(&["merge", t, r#"[{"id": 4, "tip": 1.5}]"#]);
    let e = down(root, &toml).await.unwrap_err().to_string();
    assert!(
        e.contains("Delta table's schema") && e.contains("add-columns") && e.contains("tip"),
        "{e}"
    );
    assert_eq!(committed_rows(&root.join("mp/sink"), "mp").await.len(), 3);
    // `sluice check` foresees the refusal (before: it passed).
    let e = check_error(root, &toml).await;
    assert!(e.contains("gained column(s) tip"), "{e}");
    // Hints type an inferred schema; a Delta table's log types its own.
    let hinted = toml.replace(
        "on_schema_change",
        "schema_hints = { id = \"double\" }\non_schema_change",
    );
    let e = sluice_engine::pipeline::Pipeline::parse(&hinted, "t.toml", root)
        .unwrap_err()
        .to_string();
    assert!(e.contains("schema_hints") && e.contains("log"), "{e}");
    // A pipeline that takes new columns reads the same table through.
    let toml = table_toml("mq", "maps", "add-columns");
    down(root, &toml).await.unwrap();
    let v = delta_view(&maps, "-").await;
    assert_eq!(v.duckdb.len(), 4);
    assert_eq!(committed_rows(&root.join("mq/sink"), "mq").await, v.duckdb);
}

/// A table whose writer kept nanosecond timestamps in its files (the log
/// types the column as Delta's microsecond `timestamp`) reads them cut to
/// microseconds, as Delta readers do (before: every file was refused as a
/// changed type unless `rescue`). Expected: DuckDB's cast of the file's
/// values to a microsecond timestamp.
#[tokio::test(flavor = "multi_thread")]
async fn a_tables_finer_timestamps_read_in_its_unit() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let table = root.join("nanos");
    outside(&[
        "rawlog",
        table.to_str().unwrap(),
        r#"[{"id": 1, "ts": 1700000000123456789}, {"id": 2, "ts": 1700000001000000999}, {"id": 3, "ts": null}]"#,
        r#"{"id": "int64", "ts": "timestamp[ns, UTC]"}"#,
    ]);
    down(root, &table_toml("ns", "nanos", "fail"))
        .await
        .unwrap();
    let file = table.join("part-00000.parquet");
    let expected = duckdb_sql(&format!(
        "SELECT id, epoch_us(CAST(ts AS TIMESTAMP_NS)) AS us FROM read_parquet('{}')",
        file.display()
    ))
    .await;
    let got = duckdb_sql(&format!(
        "SELECT id, CAST(epoch_us(ts) AS BIGINT) AS us FROM read_parquet('{}/batch=*/*.parquet')",
        root.join("ns/sink").display()
    ))
    .await;
    assert_eq!(got, expected);
    assert!(
        expected.contains(&"1|1700000000123456".to_string()),
        "{expected:?}"
    );
}

/// A table another engine partitioned (its files lack the partition
/// columns; the values live in the log's `partitionValues`) reads the
/// values from the log, typed as the table's schema types them, a null
/// partition included: a row query, a filter on a partition column, and
/// a grouped (stateful) query over two versions. Before: refused as
/// "partitioned by a writer other than Sluice". Expected: DuckDB's
/// delta_scan (and deltalake, which must agree).
#[tokio::test(flavor = "multi_thread")]
async fn another_engines_partitioned_table_reads_its_values_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let table = root.join("parts");
    let t = table.to_str().unwrap();
    outside(&[
        "create",
        t,
        r#"[{"day": "2026-12-01", "n": 1, "k": 7}, {"day": "2026-12-02", "n": 2, "k": 7},
            {"day": null, "n": 3, "k": 8}, {"day": "2026-12-01", "n": 4, "k": 8}]"#,
        "day",
        "k",
    ]);
    let all = table_toml("pa", "parts", "fail");
    let filtered = table_toml("pf", "parts", "fail")
        .replace("SELECT * FROM up", "SELECT n, day FROM up WHERE k = 8");
    let grouped = table_toml("pg", "parts", "fail")
        .replace(
            "SELECT * FROM up",
            "SELECT day, count(*) AS rows, sum(k) AS k FROM up GROUP BY day",
        )
        .replace(
            "format = \"parquet\"\n",
            "format = \"parquet\"\nmode = \"complete\"\n",
        );
    let rescuing = table_toml("pr", "parts", "rescue");
    for toml in [&all, &filtered, &rescuing] {
        down(root, toml).await.unwrap();
    }
    outside(&[
        "append",
        t,
        r#"[{"day": "2026-12-03", "n": 5, "k": 9}, {"day": null, "n": 6, "k": 7}]"#,
    ]);
    for toml in [&all, &filtered, &grouped] {
        down(root, toml).await.unwrap();
    }
    let v = delta_view(&table, "-").await;
    assert_eq!(v.deltalake, v.duckdb);
    assert_eq!(v.duckdb.len(), 6);
    assert!(v.duckdb.contains(&"NULL|6|7".to_string()), "{:?}", v.duckdb);
    assert_eq!(committed_rows(&root.join("pa/sink"), "pa").await, v.duckdb);
    let scan = format!("delta_scan('{}')", table.display());
    let oracle = |sql: String| async move { delta_sql(&sql).await };
    assert_eq!(
        committed_rows(&root.join("pf/sink"), "pf").await,
        oracle(format!("SELECT n, day FROM {scan} WHERE k = 8")).await
    );
    assert_eq!(
        committed_rows(&root.join("pg/sink"), "pg").await,
        oracle(format!(
            "SELECT day, count(*) AS rows, CAST(sum(k) AS BIGINT) AS k FROM {scan} GROUP BY day"
        ))
        .await
    );
    // A file read apart (`rescue`: a version merged in a new column) gets
    // its partition values from the log too.
    outside(&[
        "merge",
        t,
        r#"[{"day": "2026-12-04", "n": 7, "k": 9, "tip": 1.5}]"#,
    ]);
    down(root, &rescuing).await.unwrap();
    let rows = committed_rows(&root.join("pr/sink"), "pr").await;
    let rescued: Vec<&String> = rows.iter().filter(|r| r.contains("tip")).collect();
    assert_eq!(rescued.len(), 1, "{rows:?}");
    assert!(
        rescued[0].starts_with("2026-12-04|7|9|") && rescued[0].contains("1.5"),
        "{rows:?}"
    );
    let mut kept: Vec<String> = rows
        .iter()
        .map(|r| r.rsplit_once('|').unwrap().0.to_string())
        .collect();
    kept.sort();
    assert_eq!(kept, oracle(format!("SELECT day, n, k FROM {scan}")).await);
}

/// A Sluice pipeline's Parquet sink read with `format = "delta"`: with
/// two committed batches and no log it cannot be a Delta sink (which
/// makes each batch's Delta commit before its next batch), and is refused
/// naming what to write (before: the pipeline waited for a log forever);
/// with one batch it may be a Delta sink whose first commit is still to
/// come, and waits.
#[tokio::test(flavor = "multi_thread")]
async fn a_parquet_sink_read_as_delta_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let up = pipeline_toml("up", "parquet", "", "max_files_per_batch = 1");
    gen_files(&root.join("input"), 1, 20);
    run(&local_context(&pipeline(root, &up))).await.unwrap();
    let toml = down_toml("", "", "parquet");
    assert_eq!(down(root, &toml).await.unwrap(), 0);
    let report = sluice_engine::admin::check(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap();
    assert!(
        report.not_yet.iter().any(|n| n.contains("no Delta table")),
        "{:?}",
        report.not_yet
    );
    gen_files(&root.join("input"), 1, 20);
    run(&local_context(&pipeline(root, &up))).await.unwrap();
    let e = down(root, &toml).await.unwrap_err().to_string();
    assert!(
        e.contains("Parquet sink") && e.contains("discovery = \"manifests\""),
        "{e}"
    );
}

/// A declared `source.schema` on a Delta source is checked against the
/// table's schema in its log, naming what does not fit (the sweep's case:
/// `sluice check` passed, then every batch was refused as if the table's
/// schema had changed): a column left out or unknown, a narrower type, a
/// never-null column the table may hold null in. A declaration of every
/// column, a type widened, reads the table.
#[tokio::test(flavor = "multi_thread")]
async fn a_declared_schema_is_checked_against_the_tables() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let t = root.join("tbl");
    outside(&["create", t.to_str().unwrap(), r#"[{"id": 1, "v": "a"}]"#]);
    outside(&[
        "merge",
        t.to_str().unwrap(),
        r#"[{"id": 2, "v": "b", "extra": 2.5}]"#,
    ]);
    let declared = |name: &str, cols: &str| {
        table_toml(name, "tbl", "fail").replace(
            "on_schema_change = \"fail\"",
            &format!("on_schema_change = \"fail\"\nschema = [{cols}]"),
        )
    };
    for (cols, says) in [
        (
            r#"{ name = "id", type = "bigint" }, { name = "v", type = "string" }"#,
            "leaves out extra",
        ),
        (
            r#"{ name = "id", type = "int" }, { name = "v", type = "string" }, { name = "extra", type = "double" }"#,
            "id is bigint in the table, declared int",
        ),
        (
            r#"{ name = "id", type = "bigint" }, { name = "v", type = "string" }, { name = "extra", type = "double", nullable = false }"#,
            "extra may be null",
        ),
        (
            r#"{ name = "id", type = "bigint" }, { name = "v", type = "string" }, { name = "extra", type = "double" }, { name = "nope", type = "int" }"#,
            "no column nope",
        ),
    ] {
        let toml = declared("bad", cols);
        let e = check_error(root, &toml).await;
        assert!(e.contains(says), "{cols}: {e}");
    }
    let toml = declared(
        "good",
        r#"{ name = "id", type = "double" }, { name = "v", type = "string" }, { name = "extra", type = "double" }"#,
    );
    down(root, &toml).await.unwrap();
    let want = delta_sql(&format!(
        "SELECT CAST(id AS DOUBLE) AS id, v, extra FROM delta_scan('{}')",
        t.display()
    ))
    .await;
    assert_eq!(committed_rows(&root.join("good/sink"), "good").await, want);
}
