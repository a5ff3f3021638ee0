//! Deduplication within the watermark (`[deduplicate]`, Spark's
//! `dropDuplicatesWithinWatermark`). Expected rows:
//!
//! - `keep = "forever"`: DuckDB's `row_number() OVER (PARTITION BY key
//!   ORDER BY arrival) = 1` over every input row, then the query;
//! - within the watermark: Spark's state rule applied by the test to the
//!   rows in arrival order and the batches the limits make (a kept key
//!   stays until the watermark reaches its event time plus the delay; the
//!   state is evicted after each batch with the batch's watermark, and at
//!   the end of a run with the watermark then), then DuckDB runs the query
//!   over the kept rows.
//!
//! Arrival order is the order the batch plans its files (files here are
//! named and written in order) and then row order; every row carries its
//! position (`seq`) so the oracles can order by it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::support::*;

/// The row query the tests run after deduplication: a filter (applied
/// after the duplicates are dropped, as in Spark) and an expression.
pub(crate) const ROWS_SQL: &str =
    "SELECT seq, ride_id, fare * 2 AS twice FROM rides WHERE fare > 3";
/// The stateful query: every group in each batch (complete mode).
const GROUPED_SQL: &str =
    "SELECT ride_id, count(*) AS n, sum(fare) AS total FROM rides GROUP BY ride_id";

/// A deduplicating pipeline `name` over `root/input` (CSV), keys kept
/// `forever` or for the watermark's 10 minutes.
pub(crate) fn dedup_toml(name: &str, sql: &str, forever: bool, limits: &str) -> String {
    let keep = if forever {
        "keep = \"forever\"\n".to_string()
    } else {
        String::new()
    };
    let watermark = if forever {
        ""
    } else {
        "[watermark]\ncolumn = \"ts\"\ndelay = \"10 minutes\"\n"
    };
    let mode = if sql.contains("GROUP BY") {
        "mode = \"complete\"\n"
    } else {
        ""
    };
    format!(
        r#"name = "{name}"
[source]
uri = "input"
format = "csv"
table = "rides"
schema = [
  {{ name = "seq", type = "Int64" }},
  {{ name = "ride_id", type = "Utf8" }},
  {{ name = "ts", type = "Timestamp(Microsecond, None)" }},
  {{ name = "fare", type = "Float64" }},
]
[query]
sql = "{sql}"
[deduplicate]
key = ["ride_id"]
{keep}
{watermark}
[sink]
uri = "out/sink"
{mode}
[checkpoint]
uri = "out/checkpoint"
[limits]
{limits}
"#
    )
}

/// One input row: its arrival position, key, event time (minutes after
/// 2024-01-01T00:00) and fare.
#[derive(Debug, Clone)]
pub(crate) struct Ride {
    pub(crate) seq: i64,
    pub(crate) id: u32,
    pub(crate) minute: i64,
    pub(crate) fare: f64,
}

/// `rows` rides of file number `file`: keys from a small set (so keys
/// repeat within and across files), event times moving forward with the
/// file number with some rows far behind (late once the watermark moves).
pub(crate) fn rides(file: u64, rows: u64, keys: u32) -> Vec<Ride> {
    (0..rows)
        .map(|r| {
            let x = file * 1_000 + r;
            let behind = if (x * 7).is_multiple_of(11) { 45 } else { 0 };
            Ride {
                seq: x as i64,
                id: ((x * 2_654_435_761) >> 7) as u32 % keys,
                minute: (file * 6 + r % 9) as i64 - behind + 60,
                fare: (x % 13) as f64 + 0.5,
            }
        })
        .collect()
}

/// Write `rides` as input file number `file` (names sort in arrival order).
pub(crate) fn write_rides(root: &Path, file: u64, rides: &[Ride]) -> PathBuf {
    let input = root.join("input");
    std::fs::create_dir_all(&input).unwrap();
    let mut text = String::from("seq,ride_id,ts,fare\n");
    for r in rides {
        text.push_str(&format!(
            "{},r{},2024-01-01T{:02}:{:02}:00,{}\n",
            r.seq,
            r.id,
            r.minute / 60,
            r.minute % 60,
            r.fare
        ));
    }
    let path = input.join(format!("rides-{file:05}.csv"));
    std::fs::write(&path, text).unwrap();
    path
}

/// DuckDB: `sql` over each key's first row by arrival among `files`.
pub(crate) async fn forever_want(files: &[PathBuf], sql: &str) -> Vec<String> {
    let first = format!(
        "(SELECT seq, ride_id, ts, fare FROM (SELECT *, row_number() OVER (PARTITION BY \
         ride_id ORDER BY seq) AS rn FROM read_csv([{}], header = true, columns = {{'seq': \
         'BIGINT', 'ride_id': 'VARCHAR', 'ts': 'TIMESTAMP', 'fare': 'DOUBLE'}})) WHERE rn = 1)",
        quoted(files)
    );
    duckdb_sql(&sql.replace("FROM rides", &format!("FROM {first}"))).await
}

/// Spark's state rule over `runs` (each run's files in arrival order),
/// batched `max_files` files at a time, delay 10 minutes: the rows kept,
/// the rows late and the duplicates dropped.
fn spark_rule(runs: &[Vec<Vec<Ride>>], max_files: usize) -> (Vec<Ride>, u64, u64) {
    let delay = 10;
    let mut watermark: Option<i64> = None;
    let mut held: HashMap<u32, i64> = HashMap::new();
    let (mut kept, mut late, mut dropped) = (Vec::new(), 0, 0);
    for run in runs {
        for batch in run.chunks(max_files) {
            let mut max_event: Option<i64> = None;
            for r in batch.iter().flatten() {
                max_event = max_event.max(Some(r.minute));
                if watermark.is_some_and(|w| r.minute <= w) {
                    late += 1;
                } else if let std::collections::hash_map::Entry::Vacant(e) = held.entry(r.id) {
                    e.insert(r.minute + delay);
                    kept.push(r.clone());
                } else {
                    dropped += 1;
                }
            }
            if let Some(w) = watermark {
                held.retain(|_, expiry| *expiry > w);
            }
            if let Some(m) = max_event {
                watermark = watermark.max(Some(m - delay));
            }
        }
        // The run's batch with no input forgets what the watermark passed.
        if let Some(w) = watermark {
            held.retain(|_, expiry| *expiry > w);
        }
    }
    (kept, late, dropped)
}

/// DuckDB: `sql` over `rows` (written to a CSV of their own).
async fn duckdb_over(rows: &[Ride], sql: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = write_rides(dir.path(), 0, rows);
    let table = format!(
        "read_csv('{}', header = true, columns = {{'seq': 'BIGINT', 'ride_id': 'VARCHAR', \
         'ts': 'TIMESTAMP', 'fare': 'DOUBLE'}})",
        path.display()
    );
    duckdb_sql(&sql.replace("FROM rides", &format!("FROM {table}"))).await
}

/// The rows of the last complete snapshot of the local sink.
pub(crate) async fn last_snapshot(sink: &Path, name: &str) -> Vec<String> {
    let Some((_, complete, files)) = manifest_files(sink, name).await.pop() else {
        return Vec::new();
    };
    assert!(complete, "complete mode marks its manifests");
    if files.is_empty() {
        return Vec::new();
    }
    duckdb_sql(&format!(
        "SELECT * FROM read_parquet([{}], hive_partitioning = false)",
        quoted(&files)
    ))
    .await
}

/// `keep = "forever"`: over three runs, batches of two files, a task per
/// file and three state partitions, each key's first row by arrival is
/// kept and the query runs over the kept rows (its filter after the
/// deduplication); the commit records count the rest as duplicates.
#[tokio::test(flavor = "multi_thread")]
async fn forever_keeps_each_keys_first_arrival_across_runs_batches_tasks_and_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = dedup_toml(
        "dedupf",
        ROWS_SQL,
        true,
        "max_files_per_batch = 2\nmax_bytes_per_task = 1\nstate_partitions = 3",
    );
    let mut files = Vec::new();
    let mut total = 0;
    for run_no in 0..3u64 {
        for f in 0..3 {
            let rows = rides(run_no * 3 + f, 25, 40);
            total += rows.len() as u64;
            files.push(write_rides(root, run_no * 3 + f, &rows));
        }
        run(&local_context(&pipeline(root, &toml))).await.unwrap();
    }
    let want = forever_want(&files, ROWS_SQL).await;
    assert!(!want.is_empty());
    let got = committed_rows(&root.join("out/sink"), "dedupf").await;
    assert_eq!(got, want);
    let keys = duckdb_sql(&format!(
        "SELECT count(DISTINCT ride_id) FROM read_csv([{}], header = true)",
        quoted(&files)
    ))
    .await;
    let keys: u64 = keys[0].parse().unwrap();
    let commits = commit_records(root, &toml).await;
    assert!(commits.len() >= 5, "batches of two files over nine files");
    let dropped: u64 = commits
        .iter()
        .map(|c| c.stateful.as_ref().unwrap().duplicates)
        .sum();
    assert_eq!(dropped, total - keys);
    assert_eq!(
        control_of(root, &toml).await.totals.duplicates,
        total - keys
    );
    let last = commits.last().unwrap().stateful.clone().unwrap();
    assert_eq!(last.dedup_keys, keys, "every key is held forever");
    // What `sluice show` and `sluice history` say of it.
    let file = root.join("dedupf.toml");
    std::fs::write(&file, &toml).unwrap();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let show = cli(&["show"]);
    assert!(
        show.contains(&format!("{} duplicates dropped", total - keys)),
        "{show}"
    );
    assert!(
        show.contains(&format!("deduplicate  {keys} keys held")),
        "{show}"
    );
    let history = cli(&["history"]);
    assert!(history.contains("dups"), "{history}");
    for c in &commits {
        let line = history
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&c.batch.to_string()))
            .unwrap_or_else(|| panic!("batch {} in {history}", c.batch));
        let dups = c.stateful.as_ref().unwrap().duplicates.to_string();
        assert!(line.split_whitespace().any(|w| w == dups), "{line}");
    }
}

/// What `[deduplicate]` cannot do is refused by name, before anything is
/// written: no way to forget keys, keys that are not source columns, an
/// event time that is not a timestamp, bad-data policies, an output mode on
/// a row query, and a change of the key while keys seen exist.
#[tokio::test(flavor = "multi_thread")]
async fn what_deduplication_cannot_do_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_rides(root, 0, &rides(0, 10, 5));
    let forever = dedup_toml("dedupr", ROWS_SQL, true, "");
    let within = dedup_toml("dedupr", ROWS_SQL, false, "");
    let parse = |toml: &str| {
        sluice_engine::pipeline::Pipeline::parse(toml, "t.toml", root)
            .map(|_| String::from("parsed"))
            .unwrap_or_else(|e| e.to_string())
    };
    for (toml, says) in [
        (
            forever.replace("keep = \"forever\"\n", ""),
            "write keep = \"forever\"",
        ),
        (
            within.replace("[deduplicate]\n", "[deduplicate]\nkeep = \"forever\"\n"),
            "the watermark forgets keys",
        ),
        (
            forever.replace("keep = \"forever\"", "keep = \"1 hour\""),
            "the only value is \"forever\"",
        ),
        (
            forever.replace("key = [\"ride_id\"]", "key = []"),
            "deduplicate.key is empty",
        ),
    ] {
        let e = parse(&toml);
        assert!(e.contains(says), "want \"{says}\" in: {e}");
    }
    for (toml, says) in [
        (
            forever.replace("key = [\"ride_id\"]", "key = [\"rider\"]"),
            "deduplicate.key names \"rider\", which is not a source column",
        ),
        (
            within.replace("column = \"ts\"", "column = \"fare\""),
            "not a timestamp",
        ),
        (
            forever.replace(
                "table = \"rides\"",
                "table = \"rides\"\non_bad_row = \"quarantine\"",
            ),
            "[deduplicate] fails its batch on bad input",
        ),
        (
            forever.replace(
                "uri = \"out/sink\"",
                "uri = \"out/sink\"\nmode = \"update\"",
            ),
            "remove sink.mode",
        ),
    ] {
        let e = check_error(root, &toml).await;
        assert!(e.contains(says), "want \"{says}\" in: {e}");
    }
    // Keys seen under one key are not looked up under another.
    run(&local_context(&pipeline(root, &forever)))
        .await
        .unwrap();
    write_rides(root, 1, &rides(1, 10, 5));
    let other = forever.replace("key = [\"ride_id\"]", "key = [\"ride_id\", \"fare\"]");
    // `sluice check` says so before a run does.
    let e = check_error(root, &other).await;
    assert!(e.contains("[deduplicate]'s key columns"), "{e}");
    let e = run(&local_context(&pipeline(root, &other)))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("sluice reset"), "{e}");
    assert!(e.contains("[deduplicate]'s key columns"), "{e}");
}

/// Within the watermark, over random arrivals and batch, task and
/// partition splits: a row-by-row query and a GROUP BY (complete mode)
/// after deduplication equal DuckDB's over the rows Spark's state rule
/// keeps; late rows and duplicates are counted as the rule counts them.
/// Returns what the rule did: rows late, duplicates dropped, rows kept,
/// and keys kept more than once (kept again after they expired).
fn within_the_watermark(
    arrivals: Vec<u64>,
    max_files: u64,
    task_bytes: u64,
    partitions: u32,
) -> (u64, u64, usize, usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let limits = format!(
            "max_files_per_batch = {max_files}\nmax_bytes_per_task = {task_bytes}\n\
             state_partitions = {partitions}"
        );
        let rows_toml = dedup_toml("dedupw", ROWS_SQL, false, &limits);
        let grouped_toml =
            dedup_toml("dedupg", GROUPED_SQL, false, &limits).replace("out/", "grouped/");
        let mut runs = Vec::new();
        let mut file = 0;
        for n in arrivals {
            let mut run_files = Vec::new();
            for _ in 0..n {
                let rows = rides(file, 12, 15);
                write_rides(root, file, &rows);
                run_files.push(rows);
                file += 1;
            }
            runs.push(run_files);
            for toml in [&rows_toml, &grouped_toml] {
                run(&local_context(&pipeline(root, toml))).await.unwrap();
            }
        }
        let (kept, late, dropped) = spark_rule(&runs, max_files as usize);
        let got = committed_rows(&root.join("out/sink"), "dedupw").await;
        assert_eq!(got, duckdb_over(&kept, ROWS_SQL).await, "row query");
        let totals = control_of(root, &rows_toml).await.totals;
        assert_eq!((totals.late_rows, totals.duplicates), (late, dropped));
        let mut grouped = last_snapshot(&root.join("grouped/sink"), "dedupg").await;
        grouped.sort();
        let mut want = duckdb_over(&kept, GROUPED_SQL).await;
        want.sort();
        assert_eq!(grouped, want, "GROUP BY after deduplication");
        let totals = control_of(root, &grouped_toml).await.totals;
        assert_eq!((totals.late_rows, totals.duplicates), (late, dropped));
        let mut ids: Vec<u32> = kept.iter().map(|r| r.id).collect();
        ids.sort();
        let all = ids.len();
        ids.dedup();
        (late, dropped, kept.len(), all - ids.len())
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 6, ..Default::default() })]

    #[test]
    fn deduplication_equals_sparks_rule_however_the_input_is_split(
        arrivals in proptest::collection::vec(1u64..4, 1..4),
        max_files in 1u64..4,
        task_bytes in proptest::sample::select(vec![1u64, 1 << 30]),
        partitions in 1u32..4,
    ) {
        within_the_watermark(arrivals, max_files, task_bytes, partitions);
    }
}

/// The property's first case, fixed: three runs of three, two and one
/// files, two files a batch, a task per file, two partitions.
#[test]
fn deduplication_equals_sparks_rule_over_three_runs() {
    let (late, dropped, kept, again) = within_the_watermark(vec![3, 2, 1], 2, 1, 2);
    // The case exercises every part of the rule.
    assert!(
        late > 0 && dropped > 0 && again > 0,
        "{late} {dropped} {kept} {again}"
    );
}

/// Each write of a deduplicating run failing in turn, then a rerun: the
/// output equals DuckDB's over the rows Spark's rule keeps, each row once,
/// nothing uncommitted left. `sql`: a row query (the Dedup steps write
/// the sink's parts) or a GROUP BY (they write partial states, merged
/// after them).
async fn each_write_failing(name: &str, sql: &str) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let toml = dedup_toml(
        name,
        sql,
        false,
        "max_files_per_batch = 2\nstate_partitions = 2",
    );
    let setup = |root: &Path| {
        (0..4u64)
            .map(|i| {
                let rows = rides(i, 15, 12);
                write_rides(root, i, &rows);
                rows
            })
            .collect::<Vec<_>>()
    };
    let clean = tempfile::tempdir().unwrap();
    let files = setup(clean.path());
    let (kept, _, dropped) = spark_rule(&[files], 2);
    assert!(dropped > 0);
    let grouped = sql.contains("GROUP BY");
    let mut expected = duckdb_over(&kept, sql).await;
    expected.sort();
    let output = |root: PathBuf| async move {
        let sink = root.join("out/sink");
        let mut rows = if grouped {
            last_snapshot(&sink, name).await
        } else {
            committed_rows(&sink, name).await
        };
        rows.sort();
        rows
    };
    let writes = Arc::new(AtomicU64::new(0));
    let summary = run(&fault_context(clean.path(), &toml, writes.clone(), 0))
        .await
        .unwrap();
    assert!(summary.batches.len() >= 2);
    assert_eq!(output(clean.path().to_path_buf()).await, expected);
    let total = writes.load(Ordering::SeqCst);
    eprintln!("{name}: failing each of {total} writes in turn");
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        setup(dir.path());
        let failed = run(&fault_context(
            dir.path(),
            &toml,
            Arc::new(AtomicU64::new(0)),
            k,
        ))
        .await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let again = run(&fault_context(
            dir.path(),
            &toml,
            Arc::new(AtomicU64::new(0)),
            0,
        ))
        .await
        .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        assert!(
            matches!(again.end, sluice_engine::runner::RunEnd::Done),
            "after failing write {k}: {:?}",
            again.end
        );
        assert_eq!(
            output(dir.path().to_path_buf()).await,
            expected,
            "output after failing write {k}"
        );
        if !grouped {
            assert_recovered(dir.path(), name, &again.end, &expected, k).await;
        }
        assert_eq!(
            control_of(dir.path(), &toml).await.totals.duplicates,
            dropped,
            "duplicates counted once after failing write {k}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deduplicating_row_query_failing_at_any_write_recovers_to_the_rules_rows() {
    each_write_failing("crashdr", ROWS_SQL).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deduplicating_group_by_failing_at_any_write_recovers_to_the_rules_rows() {
    each_write_failing("crashdg", GROUPED_SQL).await;
}

/// The sweep's cases: a row with no event time is counted late and
/// dropped before deduplication (it has no expiry: kept, its key was held
/// forever and a row a month later was dropped); -0.0 and 0.0 are one key
/// (Spark's and DuckDB's rule). Hand-worked.
#[tokio::test(flavor = "multi_thread")]
async fn rows_without_event_time_are_late_and_signed_zeros_are_one_key() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = r#"name = "nullts"
[source]
uri = "input"
format = "csv"
table = "ev"
schema = [{ name = "k", type = "Utf8" }, { name = "x", type = "Float64" }, { name = "ts", type = "Timestamp(Microsecond, None)" }]
[query]
sql = "SELECT k, x, ts FROM ev"
[deduplicate]
key = ["k"]
[watermark]
column = "ts"
delay = "10 minutes"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
"#;
    let input = root.join("input");
    std::fs::create_dir_all(&input).unwrap();
    for (i, text) in [
        "k,x,ts\nb,1,\nb,2,2024-01-01T00:01:00\n",
        "k,x,ts\nb,3,2024-01-05T00:00:00\nx,4,2024-01-05T00:00:00\n",
        "k,x,ts\nb,5,2024-02-01T00:00:00\n",
    ]
    .iter()
    .enumerate()
    {
        std::fs::write(input.join(format!("{i}.csv")), text).unwrap();
        run(&local_context(&pipeline(root, toml))).await.unwrap();
    }
    // Run 1: b without a time is late; b@00:01 kept (held until 00:11);
    // watermark after: Dec 31 23:51. Run 2 (watermark Dec 31 23:51): b is
    // still held, so b@Jan 5 is a duplicate; x kept; watermark after Jan 4
    // 23:50 passes b's expiry: the run's no-input batch lets b go. Run 3:
    // b@Feb 1 kept.
    assert_eq!(
        committed_rows(&root.join("out/sink"), "nullts").await,
        [
            "b|2.0|2024-01-01T00:01:00",
            "b|5.0|2024-02-01T00:00:00",
            "x|4.0|2024-01-05T00:00:00"
        ]
    );
    let totals = control_of(root, toml).await.totals;
    assert_eq!((totals.late_rows, totals.duplicates), (1, 1));

    let zeros = toml
        .replace("\"nullts\"", "\"zeros\"")
        .replace("key = [\"k\"]", "key = [\"x\"]")
        .replace("out/", "zeros/");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("input")).unwrap();
    std::fs::write(
        root.join("input/z.csv"),
        "k,x,ts\na,0.0,2024-01-01T00:01:00\nb,-0.0,2024-01-01T00:02:00\nc,NaN,2024-01-01T00:03:00\nd,NaN,2024-01-01T00:04:00\n",
    )
    .unwrap();
    run(&local_context(&pipeline(root, &zeros))).await.unwrap();
    let got = committed_rows(&root.join("zeros/sink"), "zeros").await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(control_of(root, &zeros).await.totals.duplicates, 2);
}
