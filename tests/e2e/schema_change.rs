//! `on_schema_change`: files whose columns differ from the schema in force
//! (issue "Bad data and schema drift", schema drift). `fail` names the file;
//! `add-columns` adds new columns as schema versions, reads missing ones as
//! null and CSV columns by name; `rescue` keeps the schema and moves what
//! does not fit into `_rescued`. Expected rows come from DuckDB over the
//! input files (`union_by_name`) or are hand-computed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{Field, Schema};

use crate::schema::write_parquet;
use crate::support::*;

/// A pipeline `name` over `root/input` running `sql` on table `t`, one file
/// per batch, with `on_schema_change = policy`.
fn toml(name: &str, format: &str, policy: &str, sql: &str) -> String {
    format!(
        r#"name = "{name}"
[source]
uri = "input"
format = "{format}"
table = "t"
on_schema_change = "{policy}"
[query]
sql = "{sql}"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_files_per_batch = 1
"#
    )
}

fn parquet(root: &Path, name: &str, cols: Vec<(&str, ArrayRef)>) -> PathBuf {
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, c)| Field::new(*n, c.data_type().clone(), true))
        .collect();
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        cols.into_iter().map(|(_, c)| c).collect(),
    )
    .unwrap();
    let path = root.join("input").join(name);
    write_parquet(&path, &batch);
    path
}

fn text(root: &Path, name: &str, body: &str) -> PathBuf {
    let path = root.join("input").join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, body).unwrap();
    path
}

fn ints(v: &[i64]) -> ArrayRef {
    Arc::new(Int64Array::from(v.to_vec()))
}

fn strs(v: &[&str]) -> ArrayRef {
    Arc::new(StringArray::from(v.to_vec()))
}

/// The committed output as a reader that merges schemas sees it: DuckDB
/// over exactly the files the manifests name, `union_by_name`.
async fn sink_rows(root: &Path, name: &str, cols: &str) -> Vec<String> {
    manifest_rows(&root.join("out/sink"), name, cols, ", union_by_name = true").await
}

/// A CSV file with the pinned columns in another order was read by
/// position, its values shifted into the wrong columns, silently (found on
/// the way: the header check compared names, not their order). `fail`
/// names the file and the order; `add-columns` reads it by name.
#[tokio::test(flavor = "multi_thread")]
async fn a_csv_whose_columns_come_in_another_order_is_named_or_read_by_name() {
    for policy in ["fail", "add-columns"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let toml = toml("order", "csv", policy, "SELECT a, b FROM t");
        text(root, "1.csv", "a,b\n1,10\n");
        run(&local_context(&pipeline(root, &toml))).await.unwrap();
        text(root, "2.csv", "b,a\n20,2\n");
        let outcome = run(&local_context(&pipeline(root, &toml))).await;
        let rows = sink_rows(root, "order", "a, b").await;
        if policy == "fail" {
            let err = outcome.unwrap_err().to_string();
            assert!(
                err.contains("2.csv") && err.contains("another order (b, a)"),
                "{err}"
            );
            assert!(err.contains("on_schema_change"), "{err}");
            assert_eq!(rows, ["1|10"]);
        } else {
            outcome.unwrap();
            assert_eq!(rows, ["1|10", "2|20"]);
        }
    }
}

/// `add-columns` over Parquet: a file with a new column adds it (schema
/// version 2), a file without a pinned column reads it as null, a narrower
/// integer type casts, and a second new column makes version 3; each new
/// version is in force from the batch that brings it. The output read with
/// `union_by_name` equals DuckDB's read of the inputs the same way.
#[tokio::test(flavor = "multi_thread")]
async fn add_columns_adds_new_columns_as_schema_versions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("grow", "parquet", "add-columns", "SELECT * FROM t");
    let mut files = vec![parquet(
        root,
        "1.parquet",
        vec![("a", ints(&[1, 2])), ("b", strs(&["x", "y"]))],
    )];
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    files.push(parquet(
        root,
        "2.parquet",
        vec![
            ("a", ints(&[3])),
            ("b", strs(&["z"])),
            ("c", Arc::new(Float64Array::from(vec![0.5]))),
        ],
    ));
    files.push(parquet(
        root,
        "3.parquet",
        vec![
            ("a", ints(&[4])),
            ("c", Arc::new(Float64Array::from(vec![1.5]))),
        ],
    ));
    files.push(parquet(
        root,
        "4.parquet",
        vec![
            ("a", Arc::new(Int32Array::from(vec![5]))),
            ("b", strs(&["w"])),
            ("d", strs(&["new"])),
        ],
    ));
    let summary = run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(summary.batches.len(), 3);
    let expected = duckdb_sql(&format!(
        "SELECT a, b, c, d FROM read_parquet([{}], union_by_name = true)",
        quoted(&files)
    ))
    .await;
    assert_eq!(sink_rows(root, "grow", "a, b, c, d").await, expected);
    assert_eq!(
        expected,
        [
            "1|x|NULL|NULL",
            "2|y|NULL|NULL",
            "3|z|0.5|NULL",
            "4|NULL|1.5|NULL",
            "5|w|NULL|new"
        ]
    );
    // The versions, as the checkpoint records them.
    let ctx = local_context(&pipeline(root, &toml));
    let mut seen = Vec::new();
    for n in 0..4 {
        let c = ctx.checkpoint.commit(n).await.unwrap().unwrap();
        seen.push((c.schema_version, c.added_columns.clone()));
    }
    assert_eq!(
        seen,
        [
            (Some(1), vec![]),
            (Some(2), vec!["c".to_string()]),
            (Some(2), vec![]),
            (Some(3), vec!["d".to_string()]),
        ]
    );
    let control = control_of(root, &toml).await;
    let schema = control.schema.expect("an evolved schema in force");
    assert_eq!(schema.version, 3);
    let names: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    // A later file of the old shape reads with version 3: nulls.
    files.push(parquet(
        root,
        "5.parquet",
        vec![("a", ints(&[6])), ("b", strs(&["v"]))],
    ));
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let c = ctx.checkpoint.commit(4).await.unwrap().unwrap();
    assert_eq!((c.schema_version, c.added_columns.len()), (Some(3), 0));
    assert!(
        sink_rows(root, "grow", "a, b, c, d")
            .await
            .contains(&"6|v|NULL|NULL".to_string())
    );
}

/// `add-columns` over CSV: each file is read by its header's names (new
/// columns, missing ones, another order), as DuckDB reads them with
/// `union_by_name`.
#[tokio::test(flavor = "multi_thread")]
async fn add_columns_reads_each_csv_header_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("csvgrow", "csv", "add-columns", "SELECT * FROM t");
    let mut files = vec![text(root, "1.csv", "a,b\n1,x\n")];
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    files.push(text(root, "2.csv", "b,a,c\ny,2,3.5\nq,7,\n"));
    files.push(text(root, "3.csv", "a\n4\n"));
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let expected = duckdb_sql(&format!(
        "SELECT a, b, c FROM read_csv([{}], union_by_name = true)",
        quoted(&files)
    ))
    .await;
    assert_eq!(expected, ["1|x|NULL", "2|y|3.5", "4|NULL|NULL", "7|q|NULL"]);
    assert_eq!(sink_rows(root, "csvgrow", "a, b, c").await, expected);
}

/// A changed type is not a new column: `add-columns` refuses the file,
/// naming it, the column, both types and the `rescue` policy; nothing of
/// the batch is committed.
#[tokio::test(flavor = "multi_thread")]
async fn add_columns_refuses_a_changed_type_and_names_rescue() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("retype", "parquet", "add-columns", "SELECT * FROM t");
    parquet(root, "1.parquet", vec![("a", ints(&[1]))]);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    parquet(
        root,
        "2.parquet",
        vec![("a", Arc::new(Float64Array::from(vec![1.7])))],
    );
    let err = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("2.parquet")
            && err.contains("column a is double in the file, pinned bigint")
            && err.contains("\"rescue\""),
        "{err}"
    );
    assert_eq!(sink_rows(root, "retype", "a").await, ["1"]);
}

/// `rescue` over Parquet: the schema stays; a value its column's type
/// cannot hold (1.7 as an integer) is null there and kept in `_rescued`,
/// one that it holds (1.0) is cast; a new column's values are rescued; a
/// missing column is null. Golden rows computed by hand. The query can use
/// `_rescued`, and the commit counts the rescued fields.
#[tokio::test(flavor = "multi_thread")]
async fn rescue_moves_what_does_not_fit_into_rescued() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml(
        "rescue",
        "parquet",
        "rescue",
        "SELECT a, b, _rescued FROM t",
    );
    parquet(
        root,
        "1.parquet",
        vec![("a", ints(&[1])), ("b", strs(&["x"]))],
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    parquet(
        root,
        "2.parquet",
        vec![
            ("a", Arc::new(Float64Array::from(vec![2.0, 1.7]))),
            ("b", strs(&["y", "z"])),
            ("e", Arc::new(Int64Array::from(vec![Some(7), None]))),
        ],
    );
    parquet(root, "3.parquet", vec![("b", strs(&["w"]))]);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        sink_rows(root, "rescue", "a, b, _rescued").await,
        [
            "1|x|NULL",
            "2|y|{\"e\":7,\"_file\":\"2.parquet\"}",
            "NULL|w|NULL",
            "NULL|z|{\"a\":1.7,\"_file\":\"2.parquet\"}",
        ]
    );
    let ctx = local_context(&pipeline(root, &toml));
    let c = ctx.checkpoint.commit(1).await.unwrap().unwrap();
    assert_eq!(c.rescued_fields, 2);
    assert_eq!(control_of(root, &toml).await.totals.rescued_fields, 2);
    assert!(control_of(root, &toml).await.schema.is_none());
}

/// `rescue` over JSON Lines: a key the schema lacks, and a text value in an
/// integer column, go into `_rescued`; the rest of each row is kept.
#[tokio::test(flavor = "multi_thread")]
async fn rescue_keeps_jsonl_keys_and_values_that_do_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("jrescue", "jsonl", "rescue", "SELECT * FROM t");
    text(root, "1.jsonl", "{\"a\":1,\"b\":\"x\"}\n");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    text(
        root,
        "2.jsonl",
        "{\"a\":\"5\",\"b\":\"y\",\"tip\":0.25}\n{\"a\":\"oops\",\"b\":\"z\"}\n",
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        sink_rows(root, "jrescue", "a, b, _rescued").await,
        [
            "1|x|NULL",
            "5|y|{\"tip\":0.25,\"_file\":\"2.jsonl\"}",
            "NULL|z|{\"a\":\"oops\",\"_file\":\"2.jsonl\"}",
        ]
    );
}

/// A file with a malformed line is read row by row with the pinned
/// schema; under `fail` (the default) a new key in its good lines is still
/// refused, naming the file (it was dropped without a word, because the
/// malformed line failed the inference the check compares).
#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_line_does_not_switch_the_schema_policy_off() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("jbad", "jsonl", "fail", "SELECT * FROM t").replace(
        "on_schema_change = \"fail\"",
        "on_schema_change = \"fail\"\non_bad_row = \"quarantine\"",
    );
    text(root, "1.jsonl", "{\"id\":1}\n");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    text(root, "2.jsonl", "garbage\n{\"id\":3,\"extra\":1}\n");
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("2.jsonl") && e.contains("extra"), "{e}");
    // Only the first file's batch is committed.
    assert_eq!(sink_rows(root, "jbad", "id").await, ["1"]);
    // Without the malformed line the same refusal comes (as before).
    text(root, "2.jsonl", "{\"id\":3,\"extra\":1}\n");
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("2.jsonl") && e.contains("extra"), "{e}");
}

/// Schema versions are part of the exactly-once batch: every checkpoint
/// and sink write of a run that adds columns (three batches, two new
/// versions) is failed in turn, then the run is repeated: the output equals
/// DuckDB's `union_by_name` read of the inputs, nothing uncommitted is left,
/// and the version in force is 3 with each commit naming its version.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_adding_columns_crashed_at_each_write_recovers() {
    fn inputs(root: &Path) -> Vec<PathBuf> {
        vec![
            parquet(
                root,
                "1.parquet",
                vec![("a", ints(&[1])), ("b", strs(&["x"]))],
            ),
            parquet(
                root,
                "2.parquet",
                vec![
                    ("a", ints(&[2])),
                    ("c", Arc::new(Float64Array::from(vec![0.5]))),
                ],
            ),
            parquet(
                root,
                "3.parquet",
                vec![("a", ints(&[3])), ("d", strs(&["n"]))],
            ),
        ]
    }
    let toml = toml("grow", "parquet", "add-columns", "SELECT * FROM t");
    let clean = tempfile::tempdir().unwrap();
    let files = inputs(clean.path());
    let writes = Arc::new(AtomicU64::new(0));
    run(&fault_context(clean.path(), &toml, writes.clone(), 0))
        .await
        .unwrap();
    let total = writes.load(Ordering::SeqCst);
    let expected = duckdb_sql(&format!(
        "SELECT a, b, c, d FROM read_parquet([{}], union_by_name = true)",
        quoted(&files)
    ))
    .await;
    assert_eq!(
        expected,
        ["1|x|NULL|NULL", "2|NULL|0.5|NULL", "3|NULL|NULL|n"]
    );
    assert!(total > 10, "{total} writes");
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        inputs(root);
        let failed = run(&fault_context(root, &toml, Arc::new(AtomicU64::new(0)), k)).await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let again = run(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        assert!(matches!(again.end, sluice_engine::runner::RunEnd::Done));
        assert_eq!(
            sink_rows(root, "grow", "a, b, c, d").await,
            expected,
            "output after failing write {k}"
        );
        assert_eq!(
            orphan_files(&root.join("out/sink"), "grow").await,
            Vec::<String>::new(),
            "uncommitted files after failing write {k}"
        );
        assert_eq!(staged_files(&root.join("out/sink")), Vec::<String>::new());
        let ctx = local_context(&pipeline(root, &toml));
        let mut versions = Vec::new();
        for n in 0..3 {
            let c = ctx.checkpoint.commit(n).await.unwrap().unwrap();
            versions.push(c.schema_version);
        }
        assert_eq!(
            versions,
            [Some(1), Some(2), Some(3)],
            "after failing write {k}"
        );
        let control = control_of(root, &toml).await;
        assert_eq!(
            control.schema.map(|s| s.version),
            Some(3),
            "after failing write {k}"
        );
    }
}

/// `rescue` with `on_bad_row = "quarantine"` over CSV: a new column's
/// values (text, as CSV holds them) go into `_rescued`; a value that does
/// not parse in a file whose header matches is a bad row, set aside as
/// `on_bad_row` says, and the salvaged rows carry a null `_rescued`.
#[tokio::test(flavor = "multi_thread")]
async fn rescue_and_bad_rows_work_together_over_csv() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("csvrescue", "csv", "rescue", "SELECT * FROM t").replace(
        "on_schema_change = \"rescue\"",
        "on_schema_change = \"rescue\"\non_bad_row = \"quarantine\"",
    );
    text(root, "1.csv", "a,b\n1,x\n");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    text(root, "2.csv", "a,b,tip\n2,y,0.5\n");
    text(root, "3.csv", "a,b\n3,z\nbad,w\n");
    let summary = run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        sink_rows(root, "csvrescue", "a, b, _rescued").await,
        [
            "1|x|NULL",
            "2|y|{\"tip\":\"0.5\",\"_file\":\"2.csv\"}",
            "3|z|NULL",
        ]
    );
    let bad: u64 = summary.batches.iter().map(|b| b.rows_quarantined).sum();
    let rescued: u64 = summary.batches.iter().map(|b| b.rescued_fields).sum();
    assert_eq!((bad, rescued), (1, 1));
}

/// The review's case: JSON Lines values past the first 1,000 rows skipped
/// the drift check. `a` pinned Int64, then a file of 1,000 integer rows and
/// `{"id":5000,"a":1.7,"newcol":"surprise"}`: under `fail`, `rescue` and
/// `add-columns` alike the run succeeded, stored `a = 1` and dropped
/// `newcol`. Now `fail` names the file, `rescue` keeps 1.7 and `newcol` in
/// `_rescued`, and `add-columns` refuses the changed type naming rescue.
#[tokio::test(flavor = "multi_thread")]
async fn jsonl_values_past_the_first_thousand_rows_are_checked() {
    for policy in ["fail", "rescue", "add-columns"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let toml = toml("deep", "jsonl", policy, "SELECT * FROM t");
        text(root, "1.jsonl", "{\"id\":1,\"a\":1}\n");
        run(&local_context(&pipeline(root, &toml))).await.unwrap();
        let mut body: String = (0..1000)
            .map(|i| format!("{{\"id\":{},\"a\":{i}}}\n", 1000 + i))
            .collect();
        body.push_str("{\"id\":5000,\"a\":1.7,\"newcol\":\"surprise\"}\n");
        text(root, "2.jsonl", &body);
        let result = run(&local_context(&pipeline(root, &toml))).await;
        match policy {
            "rescue" => {
                result.unwrap();
                let rows = sink_rows(root, "deep", "id, a, _rescued").await;
                assert_eq!(rows.len(), 1002, "{policy}");
                assert!(
                    rows.contains(
                        &"5000|NULL|{\"a\":1.7,\"newcol\":\"surprise\",\"_file\":\"2.jsonl\"}"
                            .to_string()
                    ),
                    "{policy}: {:?}",
                    rows.iter().find(|r| r.starts_with("5000"))
                );
            }
            _ => {
                let e = result.unwrap_err().to_string();
                assert!(
                    e.contains("2.jsonl") && e.contains("column a"),
                    "{policy}: {e}"
                );
                assert_eq!(
                    sink_rows(root, "deep", "id, a").await,
                    ["1|1"],
                    "{policy}: nothing of the file may be committed"
                );
            }
        }
    }
}

/// The review's case: a JSON column null throughout the first file is
/// pinned as text; later numbers stopped the pipeline ("the cast would lose
/// data"), though a number reads as its text without loss (Spark and DuckDB
/// take them). They are read as text now, under the default policy.
#[tokio::test(flavor = "multi_thread")]
async fn numbers_in_a_column_pinned_as_text_are_read_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("totext", "jsonl", "fail", "SELECT * FROM t");
    text(root, "1.jsonl", "{\"id\":1,\"note\":null}\n");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    text(
        root,
        "2.jsonl",
        "{\"id\":2,\"note\":7}\n{\"id\":3,\"note\":2.5}\n{\"id\":4,\"note\":true}\n",
    );
    run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        sink_rows(root, "totext", "id, note").await,
        ["1|NULL", "2|7", "3|2.5", "4|true"]
    );
}

/// The review's case: a Parquet file with two columns of one name (`id, a,
/// a`) was read as the first `a`, the second dropped without notice. Now
/// the file is refused naming the column (and set aside under
/// `on_bad_file = "quarantine"`).
#[tokio::test(flavor = "multi_thread")]
async fn a_parquet_file_with_a_column_name_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("dup", "parquet", "fail", "SELECT * FROM t");
    parquet(
        root,
        "1.parquet",
        vec![("id", ints(&[1])), ("a", ints(&[10]))],
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    parquet(
        root,
        "2.parquet",
        vec![("id", ints(&[2])), ("a", ints(&[20])), ("a", ints(&[21]))],
    );
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("2.parquet") && e.contains("column a appears more than once"),
        "{e}"
    );
    assert_eq!(sink_rows(root, "dup", "id, a").await, ["1|10"]);
    let quarantine = toml.replace(
        "on_schema_change = \"fail\"",
        "on_schema_change = \"fail\"\non_bad_file = \"quarantine\"",
    );
    run(&local_context(&pipeline(root, &quarantine)))
        .await
        .unwrap();
    let c = control_of(root, &quarantine).await;
    assert_eq!(c.quarantined.len(), 1);
    assert!(
        c.quarantined[0]
            .reason
            .contains("column a appears more than once")
    );
}

/// The review's case: under `add-columns` a new column took its type from
/// a 0-row Parquet file (text, from the file's declared schema), then
/// every later file with a value failed ("column z is Float64 in the file,
/// pinned Utf8View"). A file with no rows gives no column a type: `z`
/// joins with the type of the first file that has a value.
#[tokio::test(flavor = "multi_thread")]
async fn add_columns_takes_no_type_from_a_file_without_rows() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("norows", "parquet", "add-columns", "SELECT * FROM t");
    parquet(root, "1.parquet", vec![("id", ints(&[1]))]);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    parquet(root, "2.parquet", vec![("id", ints(&[])), ("z", strs(&[]))]);
    parquet(
        root,
        "3.parquet",
        vec![
            ("id", ints(&[3])),
            ("z", Arc::new(Float64Array::from(vec![2.5])) as ArrayRef),
        ],
    );
    run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        sink_rows(root, "norows", "id, z").await,
        ["1|NULL", "3|2.5"]
    );
    let c = control_of(root, &toml).await;
    let z = c
        .schema
        .unwrap()
        .columns
        .into_iter()
        .find(|c| c.name == "z")
        .unwrap();
    assert_eq!(z.data_type, "double");
}

/// The review's case: under `rescue`, CSV text in a number column (`3,abc,z`
/// where `a` is pinned Int64) stopped the pipeline ("Parser error ... fix or
/// replace the file"), though text in a number column goes to `_rescued`
/// for JSON Lines and Parquet. It does for CSV now; the rest of the row is
/// kept.
#[tokio::test(flavor = "multi_thread")]
async fn rescue_keeps_csv_text_in_a_number_column() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("csvrescue", "csv", "rescue", "SELECT * FROM t");
    text(root, "1.csv", "id,a,b\n1,10,x\n2,20,y\n");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    text(root, "2.csv", "id,a,b\n3,abc,z\n4,40,w\n");
    run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        sink_rows(root, "csvrescue", "id, a, b, _rescued").await,
        [
            "1|10|x|NULL",
            "2|20|y|NULL",
            "3|NULL|z|{\"a\":\"abc\",\"_file\":\"2.csv\"}",
            "4|40|w|NULL",
        ]
    );
    assert_eq!(control_of(root, &toml).await.totals.rescued_fields, 1);
}
