//! `on_bad_row`: malformed CSV and JSON Lines rows of each kind, at known
//! lines. Under `quarantine` every bad row is in the sink's quarantine with
//! its line and reason and every good row in the output; under `null` the
//! output equals DuckDB reading every value as text and `TRY_CAST`ing it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_engine::pipeline::SourceFormat;

use crate::support::*;

/// The bad lines put into the second file: (text, what the reason names).
const BAD: [(&[u8], &str); 5] = [
    (b"x,2024-01-01T00:00:00,2024-01-01T00:08:00,4,0.33,1,N,257,165,4,7.83,1.0,0.5,0.0,0.0,1.0,10.33,0.0", "column VendorID: \"x\" is not bigint"),
    (b"1,2024-01-01T00:00:00,2024-01-01T00:08:00,4", "4 fields, expected 18"),
    (b"1,2024-01-01T00:00:00,2024-01-01T00:08:00,4,0.33,1,N,257,165,4,7.83,1.0,0.5,0.0,0.0,1.0,10.33,0.0,9,9", "20 fields, expected 18"),
    (b"2,2024-01-01T00:00:00,2024-01-01T00:08:00,4,5.5,1,\xff\xfe,257,165,4,7.83,1.0,0.5,0.0,0.0,1.0,10.33,0.0", "invalid UTF-8"),
    (b"2,2024-01-01T00:00:00,2024-01-01T00:08:00,4,abc,1,N,257,165,4,7.83,1.0,0.5,0.0,0.0,1.0,10.33,0.0", "column trip_distance: \"abc\" is not double"),
];

/// Two taxi files of `rows` rows in `format` under `root/input`, and copies
/// of them under `root/clean` (as they were before a test spoils them).
fn taxi_with_copies(
    root: &Path,
    format: SourceFormat,
    rows: usize,
) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let files = sluice_cli::generator::write_taxi_files(&root.join("input"), 2, rows, format, None)
        .unwrap();
    let clean = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let to = root.join(format!(
                "clean/{i}.{}",
                f.extension().unwrap().to_str().unwrap()
            ));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(f, &to).unwrap();
            to
        })
        .collect();
    (files, clean)
}

/// Two clean CSV files under `root/input` (copies kept under `root/clean`)
/// and the bad lines inserted into the second at lines 3, 6, 9, ... Returns
/// (clean copies, the bad file's key, the line of each bad row).
fn csv_with_bad_rows(root: &Path) -> (Vec<PathBuf>, String, Vec<u64>) {
    let input = root.join("input");
    let (files, clean) = taxi_with_copies(root, SourceFormat::Csv, 30);
    let text = std::fs::read(&files[1]).unwrap();
    let mut lines: Vec<Vec<u8>> = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let mut at = Vec::new();
    for (i, (bad, _)) in BAD.iter().enumerate() {
        let line = 3 + 3 * i; // 1-based, after the inserts before it
        lines.insert(line - 1, bad.to_vec());
        at.push(line as u64);
    }
    let mut out = lines.join(&b'\n');
    out.push(b'\n');
    std::fs::write(&files[1], out).unwrap();
    let key = files[1]
        .strip_prefix(&input)
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    (clean, key, at)
}

fn toml(policy: &str) -> String {
    pipeline_toml(
        "rows",
        "csv",
        &format!("on_bad_row = \"{policy}\""),
        "max_files_per_batch = 1",
    )
}

/// The quarantined rows under the sink: (key, line, reason).
fn quarantined_rows(sink: &Path) -> Vec<(String, u64, String)> {
    let mut out = Vec::new();
    let dir = sink.join("_quarantine");
    for batch in std::fs::read_dir(&dir).into_iter().flatten() {
        for f in std::fs::read_dir(batch.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|x| x == "jsonl") {
                for line in std::fs::read_to_string(&p).unwrap().lines() {
                    let v: serde_json::Value = serde_json::from_str(line).unwrap();
                    out.push((
                        v["key"].as_str().unwrap().to_string(),
                        v["line"].as_u64().unwrap(),
                        v["reason"].as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn quarantine_keeps_every_good_row_and_names_every_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (clean, key, lines) = csv_with_bad_rows(root);
    let p = pipeline(root, &toml("quarantine"));
    let summary = run(&local_context(&p)).await.unwrap();
    assert_eq!(
        summary
            .batches
            .iter()
            .map(|b| b.rows_quarantined)
            .sum::<u64>(),
        BAD.len() as u64
    );
    let sink = root.join("out/sink");
    // Every good row: DuckDB over the files before the bad rows went in.
    let list: Vec<String> = clean.iter().map(|f| format!("'{}'", f.display())).collect();
    let expected = duckdb_sql(&SQL.replace(
        "FROM trips",
        &format!("FROM read_csv([{}])", list.join(", ")),
    ))
    .await;
    assert_eq!(committed_rows(&sink, "rows").await, expected);
    let got = quarantined_rows(&sink);
    assert_eq!(got.len(), BAD.len(), "{got:?}");
    let c = control_of(root, &toml("quarantine")).await;
    assert_eq!(c.totals.rows_quarantined, BAD.len() as u64);
    for ((k, line, reason), ((_, want), at)) in got.iter().zip(BAD.iter().zip(&lines)) {
        assert_eq!((k, line), (&key, at));
        assert!(
            reason.contains(want),
            "line {line}: want \"{want}\" in \"{reason}\""
        );
    }
}

/// Under `fail`, the error names the file's first bad line as an editor
/// counts it (the header is line 1) and its column by name and SQL type.
/// The reader's own error said "for column 0 at line 2": counted from the
/// first row after the header, the column by position, Arrow's type.
#[tokio::test(flavor = "multi_thread")]
async fn fail_names_the_first_bad_line_as_an_editor_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (_, key, lines) = csv_with_bad_rows(root);
    let p = pipeline(root, &toml("fail"));
    let e = run(&local_context(&p)).await.unwrap_err().to_string();
    let want = format!(
        "input {key}: line {}: column VendorID: \"x\" is not bigint (the line: x,2024-01-01T00:00:00,",
        lines[0]
    );
    assert!(e.contains(&want), "want {want:?} in {e:?}");
    assert!(e.contains("fix or replace the file"), "{e}");
}

/// A CSV file set aside whole (`on_bad_file = "quarantine"`) says why as
/// the `fail` error does: its first bad line and column with the SQL type,
/// not the reader's "Error while parsing value 'x' as type 'Int64' for
/// column 0 at line 2".
#[tokio::test(flavor = "multi_thread")]
async fn a_quarantined_csv_file_names_its_first_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (_, key, lines) = csv_with_bad_rows(root);
    let toml = pipeline_toml(
        "files",
        "csv",
        "on_bad_file = \"quarantine\"",
        "max_files_per_batch = 1",
    );
    let p = pipeline(root, &toml);
    run(&local_context(&p)).await.unwrap();
    let ctx = local_context(&p);
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(c.quarantined.len(), 1, "{:?}", c.quarantined);
    assert_eq!(c.quarantined[0].key, key);
    let reason = &c.quarantined[0].reason;
    assert!(
        reason.starts_with(&format!(
            "line {}: column VendorID: \"x\" is not bigint (the line: x,",
            lines[0]
        )),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn null_keeps_rows_with_bad_fields_as_duckdb_try_cast_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    // The first file pins the schema; the second has only type errors: a
    // value that is not a number in each of two columns.
    let files =
        sluice_cli::generator::write_taxi_files(&input, 2, 30, SourceFormat::Csv, None).unwrap();
    let f = files[1].clone();
    let text = std::fs::read_to_string(&f).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines[2] = lines[2].replacen('1', "x", 1); // VendorID
    let mut fields: Vec<String> = lines[4].split(',').map(str::to_string).collect();
    fields[4] = "abc".into(); // trip_distance
    lines[4] = fields.join(",");
    std::fs::write(&f, lines.join("\n") + "\n").unwrap();
    let p = pipeline(root, &toml("null"));
    let summary = run(&local_context(&p)).await.unwrap();
    assert_eq!(
        summary.batches.iter().map(|b| b.nulled_fields).sum::<u64>(),
        2
    );
    let expected = duckdb_sql(&format!(
        "SELECT TRY_CAST(\"VendorID\" AS BIGINT) AS \"VendorID\", \
         TRY_CAST(tpep_pickup_datetime AS TIMESTAMP) AS tpep_pickup_datetime, \
         TRY_CAST(\"PULocationID\" AS BIGINT) AS \"PULocationID\", \
         TRY_CAST(trip_distance AS DOUBLE) AS trip_distance, \
         TRY_CAST(fare_amount AS DOUBLE) AS fare_amount, \
         TRY_CAST(total_amount AS DOUBLE) - TRY_CAST(fare_amount AS DOUBLE) AS surcharges \
         FROM read_csv(['{}', '{}'], all_varchar = true) \
         WHERE TRY_CAST(trip_distance AS DOUBLE) > 1.0",
        files[0].display(),
        f.display()
    ))
    .await;
    assert_eq!(
        committed_rows(&root.join("out/sink"), "rows").await,
        expected
    );
    assert!(quarantined_rows(&root.join("out/sink")).is_empty());
}

/// A batch with quarantined rows, failed at each of its writes in turn,
/// then run again: the same output and the same quarantined rows, once.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_with_bad_rows_crashed_at_each_write_recovers() {
    let clean_dir = tempfile::tempdir().unwrap();
    let (clean, _, _) = csv_with_bad_rows(clean_dir.path());
    let writes = Arc::new(AtomicU64::new(0));
    run(&fault_context(
        clean_dir.path(),
        &toml("quarantine"),
        writes.clone(),
        0,
    ))
    .await
    .unwrap();
    let total = writes.load(Ordering::SeqCst);
    let list: Vec<String> = clean.iter().map(|f| format!("'{}'", f.display())).collect();
    let expected = duckdb_sql(&SQL.replace(
        "FROM trips",
        &format!("FROM read_csv([{}])", list.join(", ")),
    ))
    .await;
    let want_rows = quarantined_rows(&clean_dir.path().join("out/sink"));
    assert_eq!(want_rows.len(), BAD.len());
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        csv_with_bad_rows(root);
        let failed = run(&fault_context(
            root,
            &toml("quarantine"),
            Arc::new(AtomicU64::new(0)),
            k,
        ))
        .await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let again = run(&local_context(&pipeline(root, &toml("quarantine"))))
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        assert_recovered(root, "rows", &again.end, &expected, k).await;
        assert_eq!(
            quarantined_rows(&root.join("out/sink")),
            want_rows,
            "quarantined rows after failing write {k}"
        );
    }
}

/// JSON Lines: a line that is not JSON, a value of the wrong type, and a
/// truncated last line. Under `quarantine` the output equals DuckDB's over
/// the file without them and each is quarantined with its line.
#[tokio::test(flavor = "multi_thread")]
async fn jsonl_bad_lines_are_quarantined_and_good_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (files, clean) = taxi_with_copies(root, SourceFormat::Jsonl, 20);
    let text = std::fs::read_to_string(&files[1]).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.insert(2, "not json at all".into()); // line 3
    let (_, rest) = lines[0].split_once(',').unwrap();
    lines.insert(5, format!("{{\"VendorID\":\"x\",{rest}")); // line 6
    let mut out = lines.join("\n");
    out.push_str("\n{\"VendorID\":2,\"tpep_pick"); // truncated last line
    std::fs::write(&files[1], &out).unwrap();
    assert!(lines[5].contains("\"VendorID\":\"x\""), "{}", lines[5]);
    let last = out.lines().count() as u64;

    let toml = pipeline_toml(
        "jrows",
        "jsonl",
        "on_bad_row = \"quarantine\"",
        "max_files_per_batch = 1",
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let list: Vec<String> = clean.iter().map(|f| format!("'{}'", f.display())).collect();
    let expected = duckdb_sql(&SQL.replace(
        "FROM trips",
        &format!("FROM read_json([{}])", list.join(", ")),
    ))
    .await;
    let sink = root.join("out/sink");
    assert_eq!(committed_rows(&sink, "jrows").await, expected);
    let got: Vec<u64> = quarantined_rows(&sink).iter().map(|r| r.1).collect();
    assert_eq!(got, [3, 6, last]);
    // The reasons say the field and its SQL type, or where the line stops
    // being JSON (Arrow's said "failed to parse "x" as Int64").
    let reasons: Vec<String> = quarantined_rows(&sink).into_iter().map(|r| r.2).collect();
    assert!(reasons[0].starts_with("not valid JSON: "), "{reasons:?}");
    assert_eq!(reasons[1], "field VendorID: \"x\" is not bigint");
    assert!(reasons[2].contains("at column"), "{reasons:?}");

    // Under `fail`, the error names the first bad line and its reason.
    let failing = pipeline_toml("jfail", "jsonl", "", "max_files_per_batch = 1")
        .replace("out/sink", "out/jfail");
    let e = run(&local_context(&pipeline(root, &failing)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "line 3: not valid JSON: expected ident at column 2 (the line: not json at all)"
        ),
        "{e}"
    );
}

/// `corrupt_record = true` under `on_bad_row = "null"` (Spark's
/// `_corrupt_record`): a repaired row keeps its raw line there; rows read
/// whole (by the scan, or row by row without a flaw) have null. Golden rows
/// computed by hand; the SQL may select the column.
#[tokio::test(flavor = "multi_thread")]
async fn repaired_rows_keep_their_raw_text_in_corrupt_record() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = r#"name = "corrupt"
[source]
uri = "input"
format = "csv"
table = "t"
on_bad_row = "null"
corrupt_record = true
[query]
sql = "SELECT a, b, _corrupt_record FROM t"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
"#;
    let input = root.join("input");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("1.csv"), "a,b\n1,x\n2,y\n").unwrap();
    run(&local_context(&pipeline(root, toml))).await.unwrap();
    std::fs::write(input.join("2.csv"), "a,b\n3,z\nbad,w\n4\n").unwrap();
    run(&local_context(&pipeline(root, toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "corrupt").await,
        [
            "1|x|NULL",
            "2|y|NULL",
            "3|z|NULL",
            "4|NULL|4",
            "NULL|w|bad,w"
        ]
    );
    // Asked for without the null policy: refused, naming both.
    let refused = sluice_engine::pipeline::Pipeline::parse(
        &toml.replace("on_bad_row = \"null\"\n", ""),
        "test.toml",
        root,
    )
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("corrupt_record") && refused.contains("on_bad_row = \"null\""),
        "{refused}"
    );
}
