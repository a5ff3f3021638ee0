//! The source schema and bad data: inference never pins a `Null` or empty
//! schema (issue "Bad data and schema drift", case 1).

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, Int64Array, NullArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use crate::support::*;

/// A pipeline `name` over `root/input` in `format` running `SELECT *`.
fn select_all(root: &Path, name: &str, format: &str) -> sluice_engine::pipeline::Pipeline {
    let toml = format!(
        r#"name = "{name}"
[source]
uri = "input"
format = "{format}"
table = "t"
[query]
sql = "SELECT * FROM t"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
"#
    );
    pipeline(root, &toml)
}

fn write(root: &Path, name: &str, text: &str) -> String {
    let path = root.join("input").join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// The pinned column types, in order.
async fn pinned(p: &sluice_engine::pipeline::Pipeline) -> Vec<(String, String)> {
    let ctx = local_context(p);
    let record = ctx.checkpoint.pipeline_record().await.unwrap().unwrap();
    record
        .schema
        .into_iter()
        .map(|c| (c.name, c.data_type))
        .collect()
}

fn cols(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

/// The review's cases: a first CSV with an empty `notes` column pinned it
/// as Null (every later value dropped); a header-only first CSV pinned every
/// column as Null. The type comes from the next file with values.
#[tokio::test(flavor = "multi_thread")]
async fn a_column_empty_in_the_first_csv_takes_its_type_from_the_next_file() {
    for (case, first) in [
        ("empty", "a,notes,b\n1,,x\n2,,y\n"),
        ("header", "a,notes,b\n"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let f1 = write(root, "1.csv", first);
        let f2 = write(root, "2.csv", "a,notes,b\n3,hello,z\n");
        let p = select_all(root, "csvnull", "csv");
        run(&local_context(&p)).await.unwrap();
        assert_eq!(
            pinned(&p).await,
            cols(&[("a", "bigint"), ("notes", "string"), ("b", "string")]),
            "{case}"
        );
        let expected = duckdb_sql(&format!("SELECT * FROM read_csv(['{f1}', '{f2}'])")).await;
        assert!(expected.iter().any(|r| r.contains("hello")), "{expected:?}");
        assert_eq!(
            committed_rows(&root.join("out/sink"), "csvnull").await,
            expected,
            "{case}"
        );
    }
}

/// A column with no value in any file read so far is pinned as text (as
/// Spark and DuckDB infer it), so a value arriving later is kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_csv_column_empty_everywhere_is_text_and_keeps_later_values() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "1.csv", "a,notes\n1,\n2,\n");
    let p = select_all(root, "csvtext", "csv");
    run(&local_context(&p)).await.unwrap();
    assert_eq!(
        pinned(&p).await,
        cols(&[("a", "bigint"), ("notes", "string")])
    );
    write(root, "2.csv", "a,notes\n3,late\n");
    run(&local_context(&p)).await.unwrap();
    let rows = committed_rows(&root.join("out/sink"), "csvtext").await;
    assert_eq!(rows, ["1|NULL", "2|NULL", "3|late"]);
}

/// The review's case: a 0-byte first JSONL pinned an empty schema, and
/// later files gave 0 columns (and were marked processed). A file with no
/// columns gives nothing to infer; the schema comes from the next one.
#[tokio::test(flavor = "multi_thread")]
async fn a_zero_byte_first_jsonl_does_not_pin_an_empty_schema() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "1.jsonl", "");
    let p = select_all(root, "jsonzero", "jsonl");
    // Only the empty file: nothing to infer from yet, so nothing is run.
    let first = run(&local_context(&p)).await.unwrap();
    assert!(first.batches.is_empty(), "{first:?}");
    let f2 = write(
        root,
        "2.jsonl",
        "{\"a\": 1, \"b\": \"x\"}\n{\"a\": 2, \"b\": \"y\"}\n",
    );
    run(&local_context(&p)).await.unwrap();
    assert_eq!(pinned(&p).await, cols(&[("a", "bigint"), ("b", "string")]));
    assert_eq!(
        committed_rows(&root.join("out/sink"), "jsonzero").await,
        duckdb_sql(&format!("SELECT * FROM read_json('{f2}')")).await
    );
}

pub fn write_parquet(path: &Path, batch: &RecordBatch) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w =
        datafusion::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// The review's case: a first Parquet file with a null-typed column (as
/// pandas writes an all-`None` column) made every later file with values
/// fail. The type comes from the next file; with none, the run says which
/// columns to declare.
#[tokio::test(flavor = "multi_thread")]
async fn a_null_typed_parquet_column_takes_its_type_from_the_next_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let nulls = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("x", DataType::Null, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(NullArray::new(2)),
        ],
    )
    .unwrap();
    let f1 = root.join("input/1.parquet");
    write_parquet(&f1, &nulls);
    // Alone, it cannot be typed: refused, naming the column and the remedy.
    let p = select_all(root, "pqnull", "parquet");
    let err = run(&local_context(&p)).await.unwrap_err().to_string();
    assert!(
        err.contains("x") && err.contains("source.schema") && err.contains("1.parquet"),
        "{err}"
    );
    let values = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("x", DataType::Float64, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![3])),
            Arc::new(Float64Array::from(vec![2.5])),
        ],
    )
    .unwrap();
    let f2 = root.join("input/2.parquet");
    write_parquet(&f2, &values);
    run(&local_context(&p)).await.unwrap();
    assert_eq!(pinned(&p).await, cols(&[("a", "bigint"), ("x", "double")]));
    let rows = committed_rows(&root.join("out/sink"), "pqnull").await;
    assert_eq!(rows, ["1|NULL", "2|NULL", "3|2.5"]);
}

/// A change made to a generated batch.
type Change = dyn Fn(RecordBatch) -> RecordBatch;

/// `taxi_batch(file, rows)` changed by `change`, written as Parquet at
/// `root/input/<name>`.
fn write_changed(
    root: &Path,
    name: &str,
    file: u64,
    change: impl Fn(RecordBatch) -> RecordBatch,
) -> std::path::PathBuf {
    let batch = change(sluice_cli::generator::taxi_batch(file, 40));
    let path = root.join("input").join(name);
    write_parquet(&path, &batch);
    path
}

/// The review's cases: files whose columns do not match the pinned schema
/// were read silently: a Float64 `passenger_count` of 1.7 committed as 1,
/// lower-cased names giving `PULocationID` all NULL, a missing
/// `fare_amount` giving NULLs (so the sample's WHERE dropped every row).
/// Each now fails its batch naming the file, the column and both types;
/// nothing of it is committed, and once the file is replaced the run goes
/// on.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_whose_columns_differ_from_the_pinned_schema_is_named_not_read() {
    use datafusion::arrow::datatypes::Schema as S;
    let float = |b: RecordBatch| {
        let i = b.schema().index_of("passenger_count").unwrap();
        let mut fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields[i] = Field::new("passenger_count", DataType::Float64, true);
        let mut cols = b.columns().to_vec();
        cols[i] = Arc::new(Float64Array::from(vec![1.7; b.num_rows()]));
        RecordBatch::try_new(Arc::new(S::new(fields)), cols).unwrap()
    };
    let lower = |b: RecordBatch| {
        let fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_name(f.name().to_lowercase()))
            .collect();
        RecordBatch::try_new(Arc::new(S::new(fields)), b.columns().to_vec()).unwrap()
    };
    let missing = |b: RecordBatch| {
        let i = b.schema().index_of("fare_amount").unwrap();
        let keep: Vec<usize> = (0..b.num_columns()).filter(|c| *c != i).collect();
        b.project(&keep).unwrap()
    };
    let cases: [(&str, &Change, &[&str]); 3] = [
        (
            "float",
            &float,
            &["column passenger_count is double in the file, pinned bigint"],
        ),
        (
            "lower",
            &lower,
            &["column PULocationID is missing (the file has pulocationid: renamed?)"],
        ),
        ("missing", &missing, &["column fare_amount is missing"]),
    ];
    for (case, change, wants) in cases {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let good = gen_files(&root.join("input"), 2, 40);
        let p = pipeline(root, &pipeline_toml("drift", "parquet", "", ""));
        run(&local_context(&p)).await.unwrap();
        let before = committed_rows(&root.join("out/sink"), "drift").await;
        let bad = write_changed(root, "zz-changed.parquet", 7, change);
        let err = run(&local_context(&p)).await.unwrap_err().to_string();
        assert!(err.contains("zz-changed.parquet"), "{case}: {err}");
        for want in wants {
            assert!(err.contains(want), "{case}: want \"{want}\" in: {err}");
        }
        assert_eq!(
            committed_rows(&root.join("out/sink"), "drift").await,
            before,
            "{case}: a refused file changed the output"
        );
        // Replaced by a file of the pinned schema: read, and all is there.
        write_changed(root, "zz-changed.parquet", 7, |b| b);
        run(&local_context(&p)).await.unwrap();
        let mut all = good.clone();
        all.push(bad);
        assert_eq!(
            committed_rows(&root.join("out/sink"), "drift").await,
            duckdb_rows(&all, SQL).await,
            "{case}"
        );
    }
}

/// CSV: a header whose names are not the pinned ones (renamed, dropped or
/// added columns) fails the batch the same way; the types of CSV values are
/// each value's own business, not the header's.
#[tokio::test(flavor = "multi_thread")]
async fn a_csv_header_that_differs_from_the_pinned_schema_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "1.csv", "a,b\n1,x\n");
    let p = select_all(root, "csvdrift", "csv");
    run(&local_context(&p)).await.unwrap();
    write(root, "2.csv", "a,B,c\n2,y,z\n");
    let err = run(&local_context(&p)).await.unwrap_err().to_string();
    assert!(
        err.contains("2.csv")
            && err.contains("column b is missing (the file has B: renamed?)")
            && err.contains("column c is new"),
        "{err}"
    );
}

/// The review's case: the first CSV file's timestamps had no fraction, so
/// the column was pinned in seconds, and later values were truncated
/// silently (`00:00:02.999` stored as `00:00:02`, `03.5+02:00` as
/// `22:00:03`). Inferred timestamps of text sources are pinned in
/// microseconds: later values are stored exactly (hand-computed).
#[tokio::test(flavor = "multi_thread")]
async fn csv_timestamps_pinned_from_whole_seconds_keep_later_fractions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    std::fs::create_dir_all(&input).unwrap();
    let toml = r#"name = "frac"
[source]
uri = "input"
format = "csv"
table = "t"
[query]
sql = "SELECT * FROM t"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_files_per_batch = 1
"#;
    std::fs::write(input.join("1.csv"), "id,ts\n1,2024-01-01T00:00:01\n").unwrap();
    run(&local_context(&pipeline(root, toml))).await.unwrap();
    std::fs::write(
        input.join("2.csv"),
        "id,ts\n2,2024-01-01T00:00:02.999\n3,2024-01-01T00:00:03.5+02:00\n",
    )
    .unwrap();
    run(&local_context(&pipeline(root, toml)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let base = 1_704_067_200_000_000i64; // 2024-01-01T00:00:00Z in microseconds
    assert_eq!(
        manifest_rows(&root.join("out/sink"), "frac", "id, epoch_us(ts)", "").await,
        [
            format!("1|{}", base + 1_000_000),
            format!("2|{}", base + 2_999_000),
            format!("3|{}", base - 2 * 3_600_000_000 + 3_500_000),
        ]
    );
}

/// The first hour's case (item 3): fixing one column's type meant
/// declaring every column with Arrow names. `schema_hints` types the named
/// columns (SQL names) and the rest are inferred: a CSV zip code keeps its
/// leading zero as text, an amount is an exact decimal, a JSON timestamp
/// written as text can be windowed. DuckDB, told the same types, is the
/// oracle.
#[tokio::test(flavor = "multi_thread")]
async fn schema_hints_type_the_named_columns_and_infer_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let f1 = write(
        root,
        "1.csv",
        "id,zip,ts,amount\n1,00501,2024-01-01T00:10:00,12.30\n2,10001,2024-01-01T00:20:00,7.05\n\
         3,02134,2024-01-01T01:05:00,1.10\n",
    );
    let toml = r#"name = "hinted"
[source]
uri = "input"
format = "csv"
table = "t"
schema_hints = { zip = "string", amount = "DECIMAL(10, 2)" }
[query]
sql = "SELECT window.start AS ws, sum(amount) AS total, min(zip) AS z, count(*) AS n FROM t GROUP BY window(ts, '1 hour')"
[sink]
uri = "out/sink"
mode = "complete"
[checkpoint]
uri = "out/checkpoint"
"#;
    let p = pipeline(root, toml);
    run(&local_context(&p)).await.unwrap();
    assert_eq!(
        pinned(&p).await,
        cols(&[
            ("id", "bigint"),
            ("zip", "string"),
            ("ts", "timestamp"),
            ("amount", "decimal(10,2)")
        ])
    );
    let expected = duckdb_sql(&format!(
        "SELECT time_bucket(INTERVAL 1 hour, ts) AS ws, sum(amount) AS total, min(zip) AS z, \
         count(*) AS n FROM read_csv('{f1}', types = {{'zip': 'VARCHAR', 'amount': \
         'DECIMAL(10,2)'}}) GROUP BY 1"
    ))
    .await;
    assert!(
        expected.iter().any(|r| r.contains("|00501|")),
        "{expected:?}"
    );
    assert!(
        expected.iter().any(|r| r.contains("|19.35|")),
        "{expected:?}"
    );
    assert_eq!(
        manifest_rows(&root.join("out/sink"), "hinted", "ws, total, z, n", "").await,
        expected
    );

    // JSON text timestamps: inferred as text (the window is refused); a
    // hint makes them timestamps, and a hinted column no file has yet
    // joins the schema as nulls (as Auto Loader adds it).
    let g = write(
        root,
        "j/1.jsonl",
        "{\"ts\": \"2024-01-01T00:10:00\", \"v\": 1}\n{\"ts\": \"2024-01-01T02:00:00.5\", \"v\": 2}\n",
    );
    let json = |name: &str, hints: &str| {
        format!(
            "name = \"{name}\"\n[source]\nuri = \"input/j\"\nformat = \"jsonl\"\ntable = \"t\"\n\
             {hints}\n[query]\nsql = \"SELECT window.start AS ws, sum(v) AS s, count(later) AS \
             l FROM t GROUP BY window(ts, '1 hour')\"\n[sink]\nuri = \"out/{name}\"\nmode = \
             \"complete\"\n[checkpoint]\nuri = \"out/checkpoint\"\n"
        )
    };
    let e = run(&local_context(&pipeline(
        root,
        &json("unhinted", "schema_hints = { later = \"int\" }"),
    )))
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("is string, not a timestamp")
            && e.contains("schema_hints = { ts = \"timestamp\" }"),
        "{e}"
    );
    let p = pipeline(
        root,
        &json(
            "jhinted",
            "schema_hints = { ts = \"timestamp\", later = \"int\" }",
        ),
    );
    run(&local_context(&p)).await.unwrap();
    let expected = duckdb_sql(&format!(
        "SELECT time_bucket(INTERVAL 1 hour, ts::TIMESTAMP) AS ws, sum(v)::BIGINT AS s, 0 AS l \
         FROM read_json('{g}') GROUP BY 1"
    ))
    .await;
    assert_eq!(expected.len(), 2, "{expected:?}");
    assert_eq!(
        manifest_rows(&root.join("out/jhinted"), "jhinted", "ws, s, l", "").await,
        expected
    );

    // A hint that the pin contradicts is refused, naming both types.
    let changed = json(
        "jhinted",
        "schema_hints = { ts = \"string\", later = \"int\" }",
    );
    let e = run(&local_context(&pipeline(root, &changed)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("source.schema_hints.ts = \"string\"") && e.contains("holds ts as timestamp"),
        "{e}"
    );
}

/// Hints are checked when the pipeline file is read: a type that does not
/// parse names the key and says what to write; hints beside a declared
/// schema are refused.
#[test]
fn a_bad_schema_hint_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = |extra: &str| {
        format!(
            "name = \"h\"\n[source]\nuri = \"input\"\nformat = \"csv\"\ntable = \"t\"\n{extra}\n\
             [query]\nsql = \"SELECT * FROM t\"\n[sink]\nuri = \"out/sink\"\n[checkpoint]\nuri = \
             \"out/checkpoint\"\n"
        )
    };
    let parse = |extra: &str| {
        let path = dir.path().join("p.toml");
        std::fs::write(&path, base(extra)).unwrap();
        sluice_engine::pipeline::Pipeline::load(&path)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let e = parse("schema_hints = { fare = \"duoble\" }").unwrap_err();
    assert!(
        e.contains("source.schema_hints.fare = \"duoble\"") && e.contains("double"),
        "{e}"
    );
    let e = parse("schema_hints = { t = \"timestamp(4)\" }").unwrap_err();
    assert!(e.contains("fractional digits"), "{e}");
    let e = parse("schema = [{ name = \"a\", type = \"bigint\" }]\nschema_hints = { a = \"int\" }")
        .unwrap_err();
    assert!(e.contains("keep one"), "{e}");
    parse("schema = [{ name = \"a\", type = \"bigint\" }, { name = \"d\", type = \"decimal(10,2)\" }]")
        .unwrap();
    // CSV holds text: a nested or binary type passed the pipeline file and
    // then failed every read blaming the file. Refused here, naming the key.
    let e = parse("schema_hints = { b = \"binary\" }").unwrap_err();
    assert!(
        e.contains("source.schema_hints.b = \"binary\"") && e.contains("use string"),
        "{e}"
    );
    let e = parse("schema_hints = { s = \"struct<a: int>\" }").unwrap_err();
    assert!(e.contains("cannot be read as struct<a: int>"), "{e}");
    let e = parse(
        "schema = [{ name = \"a\", type = \"bigint\" }, { name = \"l\", type = \"array<int>\" }]",
    )
    .unwrap_err();
    assert!(e.contains("source.schema[1] (column l)"), "{e}");
    parse("schema_hints = { t = \"timestamp\", d = \"date\", b = \"boolean\", x = \"time\" }")
        .unwrap();
}

/// A user's sweep of schema hints: a hint on a CSV column no file has made
/// every run fail; a hint in another case than the header was not applied
/// (the zip code lost its zero); JSON numbers could not be hinted int or
/// decimal; a hint changed after its column joined schema version 2 was
/// taken silently (leading zeros lost).
#[tokio::test(flavor = "multi_thread")]
async fn hints_hold_for_absent_columns_any_case_json_numbers_and_later_versions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let base = |name: &str, uri: &str, format: &str, extra: &str| {
        format!(
            "name = \"{name}\"\n[source]\nuri = \"{uri}\"\nformat = \"{format}\"\ntable = \"t\"\n\
             {extra}\n[query]\nsql = \"SELECT * FROM t\"\n[sink]\nuri = \"out/{name}\"\n\
             [checkpoint]\nuri = \"out/checkpoint\"\n"
        )
    };
    // CSV: a hinted column no file has waits; a hint in another case types
    // the header's column.
    let f = write(root, "c/1.csv", "id,zip\n1,01234\n2,10001\n");
    let p = pipeline(
        root,
        &base(
            "hcsv",
            "input/c",
            "csv",
            "schema_hints = { missing = \"double\", ZIP = \"string\" }",
        ),
    );
    run(&local_context(&p)).await.unwrap();
    run(&local_context(&p)).await.unwrap();
    assert_eq!(
        pinned(&p).await,
        cols(&[("id", "bigint"), ("zip", "string")])
    );
    assert_eq!(
        committed_rows(&root.join("out/hcsv"), "hcsv").await,
        duckdb_sql(&format!(
            "SELECT * FROM read_csv('{f}', types = {{'zip': 'VARCHAR'}})"
        ))
        .await
    );
    // JSON numbers read into hinted int and decimal.
    let j = write(
        root,
        "j/1.jsonl",
        "{\"id\": 1, \"amount\": 12.5}\n{\"id\": 2, \"amount\": 7}\n",
    );
    let p = pipeline(
        root,
        &base(
            "hjson",
            "input/j",
            "jsonl",
            "schema_hints = { id = \"int\", amount = \"decimal(10,2)\" }",
        ),
    );
    run(&local_context(&p)).await.unwrap();
    assert_eq!(
        pinned(&p).await,
        cols(&[("amount", "decimal(10,2)"), ("id", "int")])
    );
    assert_eq!(
        committed_rows(&root.join("out/hjson"), "hjson").await,
        duckdb_sql(&format!(
            "SELECT amount, id FROM read_json('{j}', columns = {{'id': 'INTEGER', 'amount': \
             'DECIMAL(10,2)'}})"
        ))
        .await
    );
    // A hint changed after its column joined schema version 2 is refused.
    write(root, "a/1.csv", "id\n1\n");
    let added = |hint: &str| {
        base(
            "hadd",
            "input/a",
            "csv",
            &format!("on_schema_change = \"add-columns\"\nschema_hints = {{ other = \"{hint}\" }}"),
        )
    };
    run(&local_context(&pipeline(root, &added("string"))))
        .await
        .unwrap();
    write(root, "a/2.csv", "id,other\n2,0008\n");
    run(&local_context(&pipeline(root, &added("string"))))
        .await
        .unwrap();
    write(root, "a/3.csv", "id,other\n3,0009\n");
    let e = run(&local_context(&pipeline(root, &added("int"))))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("schema version 2 holds it as string") && e.contains("other"),
        "{e}"
    );
}

/// The sweep's worst case: a JSONL file read apart (a number in a column
/// hinted `string`) had another column's text `"1e2"`, hinted
/// `decimal(10,2)`, stored as NULL with no count. A value the cast cannot
/// hold is now an error naming the file and the column; nothing is
/// committed.
#[tokio::test(flavor = "multi_thread")]
async fn a_value_that_does_not_fit_a_hint_is_never_a_silent_null() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(
        root,
        "a.jsonl",
        "{\"id\":1,\"amount\":12.345,\"zip\":\"01234\"}\n{\"id\":2,\"amount\":\"0.10\",\"zip\":1234}\n\
         {\"id\":4,\"amount\":\"1e2\",\"zip\":\"x\"}\n",
    );
    let toml = "name = \"nonull\"\n[source]\nuri = \"input\"\nformat = \"jsonl\"\ntable = \"t\"\n\
                schema_hints = { amount = \"decimal(10,2)\", zip = \"string\" }\n[query]\nsql = \
                \"SELECT * FROM t\"\n[sink]\nuri = \"out/sink\"\n[checkpoint]\nuri = \
                \"out/checkpoint\"\n";
    let p = pipeline(root, toml);
    let e = run(&local_context(&p)).await.unwrap_err().to_string();
    assert!(e.contains("a.jsonl") && e.contains("amount"), "{e}");
    assert!(
        committed_rows(&root.join("out/sink"), "nonull")
            .await
            .is_empty()
    );
}
