//! Stateful queries (GROUP BY, Spark's event-time windows): through the
//! same state machine as every run (tasks write partial states, one merge
//! per state partition, the commit records state and watermark). Expected
//! rows come from DuckDB over the input files, with late rows and the
//! final watermark computed from the arrival order the test chose.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::support::*;

const WINDOWED: &str = r#"SELECT window.start AS window_start, window.end AS window_end, "PULocationID", count(*) AS trips, sum(passenger_count) AS passengers, max(trip_distance) AS longest FROM trips GROUP BY window(tpep_pickup_datetime, '15 minutes'), "PULocationID""#;

const DELAY_MIN: i64 = 10;

fn toml(name: &str, sql: &str, mode: &str, watermark: bool, per_batch: u64) -> String {
    let wm = if watermark {
        format!("[watermark]\ncolumn = \"tpep_pickup_datetime\"\ndelay = \"{DELAY_MIN} minutes\"\n")
    } else {
        String::new()
    };
    format!(
        r#"name = "{name}"
[source]
uri = "input"
format = "parquet"
table = "trips"
[query]
sql = '''{sql}'''
[sink]
uri = "out/sink"
mode = "{mode}"
[checkpoint]
uri = "out/checkpoint"
{wm}[limits]
max_files_per_batch = {per_batch}
state_partitions = 3
"#
    )
}

/// Every committed row, as DuckDB reads the committed files.
async fn committed(root: &Path, name: &str, cols: &str) -> Vec<String> {
    manifest_rows(&root.join("out/sink"), name, cols, "").await
}

/// The rows under the sink's `_late/`, as DuckDB reads them.
async fn late_rows(root: &Path) -> Vec<String> {
    let files = walk(&root.join("out/sink/_late"));
    if files.is_empty() {
        return Vec::new();
    }
    duckdb_sql(&format!(
        "SELECT * FROM read_parquet([{}], hive_partitioning = false)",
        quoted(&files)
    ))
    .await
}

pub(crate) fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The largest pickup time of a file, microseconds (DuckDB).
async fn max_pickup_us(file: &Path) -> i64 {
    let got = duckdb_sql(&format!(
        "SELECT epoch_us(max(tpep_pickup_datetime)) FROM read_parquet('{}')",
        file.display()
    ))
    .await;
    got[0].parse().unwrap()
}

/// Append mode, computed without Sluice: files arrive one batch each, in
/// `arrivals` order; a row at or below the watermark before its batch
/// (largest pickup so far minus the delay) is late; the windows that end
/// at or before the final watermark are emitted, each once.
async fn expected_append(arrivals: &[PathBuf]) -> Vec<String> {
    let batches: Vec<Vec<PathBuf>> = arrivals.iter().map(|f| vec![f.clone()]).collect();
    let (parts, wm) = not_late(&batches, "*").await;
    duckdb_sql(&format!(
        "SELECT * FROM (SELECT time_bucket(INTERVAL 15 MINUTES, tpep_pickup_datetime) AS \
         window_start, time_bucket(INTERVAL 15 MINUTES, tpep_pickup_datetime) + INTERVAL 15 \
         MINUTES AS window_end, \"PULocationID\", count(*) AS trips, sum(passenger_count)::BIGINT AS \
         passengers, max(trip_distance) AS longest FROM ({}) GROUP BY ALL) WHERE \
         epoch_us(window_end) <= {wm}",
        parts.join(" UNION ALL ")
    ))
    .await
}

/// Tumbling windows in append mode, one file per run, with a late file
/// (an earlier hour, uploaded last): each closed window is committed
/// exactly once, late rows are dropped and counted, and the run's trailing
/// no-data batch emits the windows its last data batch's watermark closed.
#[tokio::test(flavor = "multi_thread")]
async fn tumbling_windows_in_append_mode_equal_duckdb() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let toml = toml("win", WINDOWED, "append", true, 10).replace(
        "delay = \"10 minutes\"",
        "delay = \"10 minutes\"\nlate = \"side-output\"",
    );
    let mut arrivals = Vec::new();
    for hour in 0..3u64 {
        let batch = sluice_cli::generator::taxi_batch(hour, 200);
        let path = input.join(format!("trips-{hour:03}.parquet"));
        crate::schema::write_parquet(&path, &batch);
        arrivals.push(path);
        let ran = run(&local_context(&pipeline(root, &toml))).await.unwrap();
        // The data batch, then the one with no input that closes the
        // windows its watermark passed.
        let files: Vec<u64> = ran.batches.iter().map(|b| b.files).collect();
        assert_eq!(files, [1, 0], "hour {hour}");
        assert!(
            ran.batches[1].rows_out > 0,
            "hour {hour}: {:?}",
            ran.batches
        );
    }
    // Late: hour 1 again, under a new key.
    let late = input.join("trips-009.parquet");
    crate::schema::write_parquet(&late, &sluice_cli::generator::taxi_batch(1, 50));
    arrivals.push(late.clone());
    let last = run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let cols = "window_start, window_end, \"PULocationID\", trips, passengers, longest";
    let want = expected_append(&arrivals).await;
    assert!(want.len() > 20, "{} windows", want.len());
    assert_eq!(committed(root, "win", cols).await, want);
    let control = control_of(root, &toml).await;
    assert_eq!(control.totals.late_rows, 50, "the late file's rows");
    // Side output: the late rows, as read, under the sink's _late/.
    assert_eq!(
        late_rows(root).await,
        duckdb_sql(&format!("SELECT * FROM read_parquet('{}')", late.display())).await
    );
    let s = control.stateful.expect("state recorded");
    assert_eq!(s.state.len(), 3);
    // Only the state files the last commit names are left.
    let mut on_disk: Vec<String> = walk(&root.join("out/checkpoint/win/state"))
        .into_iter()
        .map(|p| {
            p.strip_prefix(root.join("out/checkpoint/win"))
                .unwrap()
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    on_disk.sort();
    let mut named: Vec<String> = s.state.iter().flatten().cloned().collect();
    named.sort();
    assert!(!named.is_empty());
    assert_eq!(on_disk, named);
    // Every row of the late file was late: nothing emitted, the watermark
    // did not move, no batch with no input follows.
    let out: Vec<(u64, u64)> = last.batches.iter().map(|b| (b.files, b.rows_out)).collect();
    assert_eq!(out, [(1, 0)]);
}

/// Without a window: complete mode's last manifest is a complete snapshot
/// equal to the one-shot GROUP BY; update mode's last row per group is.
#[tokio::test(flavor = "multi_thread")]
async fn complete_and_update_modes_end_at_the_one_shot_group_by() {
    let sql = r#"SELECT "PULocationID", count(*) AS trips, sum(passenger_count) AS passengers FROM trips GROUP BY "PULocationID""#;
    for mode in ["complete", "update"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files = gen_files(&root.join("input"), 4, 150);
        let toml = toml("agg", sql, mode, false, 1);
        run(&local_context(&pipeline(root, &toml))).await.unwrap();
        let want = duckdb_sql(&format!(
            "SELECT \"PULocationID\", count(*) AS trips, sum(passenger_count)::BIGINT AS \
             passengers FROM read_parquet([{}]) GROUP BY ALL",
            quoted(&files)
        ))
        .await;
        let manifests = manifest_files(&root.join("out/sink"), "agg").await;
        assert_eq!(manifests.len(), 4, "{mode}");
        if mode == "complete" {
            let (_, complete, last) = manifests.last().unwrap().clone();
            assert!(complete);
            let got = duckdb_sql(&format!(
                "SELECT * FROM read_parquet([{}], hive_partitioning = false)",
                quoted(&last)
            ))
            .await;
            assert_eq!(got, want, "{mode}");
        } else {
            let mut latest: std::collections::BTreeMap<String, String> = Default::default();
            for (_, complete, files) in manifests {
                assert!(!complete);
                if files.is_empty() {
                    continue;
                }
                for row in duckdb_sql(&format!(
                    "SELECT * FROM read_parquet([{}], hive_partitioning = false)",
                    quoted(&files)
                ))
                .await
                {
                    latest.insert(row.split('|').next().unwrap().to_string(), row);
                }
            }
            let mut got: Vec<String> = latest.into_values().collect();
            got.sort();
            assert_eq!(got, want, "{mode}");
        }
    }
}

/// A windowed run of three batches (and its trailing no-data batch),
/// failed at each of its checkpoint and sink writes in turn (partial
/// states, merges' state files and parts, commits), then run again: the
/// committed windows equal DuckDB's, none twice, nothing uncommitted left.
/// The windowed pipeline of the crash and fencing tests: append mode,
/// late rows as side output, one file per batch.
pub(crate) fn windowed_toml(name: &str) -> String {
    toml(name, WINDOWED, "append", true, 1).replace(
        "delay = \"10 minutes\"",
        "delay = \"10 minutes\"\nlate = \"side-output\"",
    )
}

/// Its input: three hours, then a late file (hour 1 again, written last,
/// so read last: every row of it is late).
pub(crate) fn windowed_input(root: &Path) -> Vec<PathBuf> {
    let input = root.join("input");
    let mut files: Vec<PathBuf> = (0..3u64)
        .map(|h| {
            let path = input.join(format!("trips-{h:03}.parquet"));
            crate::schema::write_parquet(&path, &sluice_cli::generator::taxi_batch(h, 80));
            path
        })
        .collect();
    let late = input.join("trips-009.parquet");
    crate::schema::write_parquet(&late, &sluice_cli::generator::taxi_batch(1, 20));
    files.push(late);
    files
}

const WINDOWED_COLS: &str =
    "window_start, window_end, \"PULocationID\", trips, passengers, longest";

/// The committed windows, and (with `oracle`) DuckDB's (arrivals in key
/// order).
pub(crate) async fn windowed_output(
    root: &Path,
    name: &str,
    oracle: bool,
) -> (Vec<String>, Vec<String>) {
    let mut files = walk(&root.join("input"));
    files.sort();
    let want = if oracle {
        expected_append(&files).await
    } else {
        Vec::new()
    };
    (committed(root, name, WINDOWED_COLS).await, want)
}

/// The late rows under `_late/`, and (with `oracle`) DuckDB's read of the
/// late file.
pub(crate) async fn windowed_late(root: &Path, oracle: bool) -> (Vec<String>, Vec<String>) {
    let want = if oracle {
        duckdb_sql(&format!(
            "SELECT * FROM read_parquet('{}')",
            root.join("input/trips-009.parquet").display()
        ))
        .await
    } else {
        Vec::new()
    };
    (late_rows(root).await, want)
}

/// A windowed run of three batches (and its trailing no-data batch),
/// failed at each of its checkpoint and sink writes in turn (partial
/// states, merges' state files and parts, commits), then run again: the
/// committed windows equal DuckDB's, none twice, nothing uncommitted left.
#[tokio::test(flavor = "multi_thread")]
async fn a_windowed_run_crashed_at_each_write_recovers() {
    let toml = windowed_toml("winc");
    let setup = windowed_input;
    let clean = tempfile::tempdir().unwrap();
    let files = setup(clean.path());
    let writes = Arc::new(AtomicU64::new(0));
    run(&fault_context(clean.path(), &toml, writes.clone(), 0))
        .await
        .unwrap();
    let total = writes.load(Ordering::SeqCst);
    let cols = WINDOWED_COLS;
    let want = expected_append(&files).await;
    assert_eq!(committed(clean.path(), "winc", cols).await, want);
    let want_late = duckdb_sql(&format!(
        "SELECT * FROM read_parquet('{}')",
        files[3].display()
    ))
    .await;
    assert_eq!(late_rows(clean.path()).await, want_late);
    assert!(total > 10, "{total} writes");
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        setup(root);
        let failed = run(&fault_context(root, &toml, Arc::new(AtomicU64::new(0)), k)).await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let again = run(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        assert!(
            matches!(again.end, sluice_engine::runner::RunEnd::Done),
            "{k}"
        );
        let got = committed(root, "winc", cols).await;
        if got != want {
            let missing: Vec<&String> = want.iter().filter(|r| !got.contains(r)).collect();
            let extra: Vec<&String> = got.iter().filter(|r| !want.contains(r)).collect();
            panic!(
                "output after failing write {k}: {} rows, want {}; missing {missing:?}; extra \
                 {extra:?}",
                got.len(),
                want.len()
            );
        }
        assert_eq!(
            orphan_files(&root.join("out/sink"), "winc").await,
            Vec::<String>::new(),
            "uncommitted files after failing write {k}"
        );
        assert_eq!(staged_files(&root.join("out/sink")), Vec::<String>::new());
        assert_eq!(
            late_rows(root).await,
            want_late,
            "late rows after failing write {k}"
        );
    }
}

/// A batch planned by an older build, whose plan does not say what its
/// query is (`query` absent from `offsets/N.json`), and left uncommitted:
/// the next run plans the query's shape again from the plan's schema,
/// merges and commits it as a plan that says it, and the committed
/// windows equal DuckDB's.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_planned_by_an_older_build_resumes_with_its_shape_planned_again() {
    let toml = windowed_toml("winold");
    let mut stripped = 0;
    // Fail each write in turn until one leaves a planned, uncommitted batch.
    for k in 1..200 {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files = windowed_input(root);
        let failed = run(&fault_context(root, &toml, Arc::new(AtomicU64::new(0)), k)).await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let ck = root.join("out/checkpoint/winold");
        let planned: Vec<PathBuf> = walk(&ck.join("offsets"))
            .into_iter()
            .filter(|o| !ck.join("commits").join(o.file_name().unwrap()).exists())
            .collect();
        if planned.is_empty() {
            continue;
        }
        for o in &planned {
            let mut v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(o).unwrap()).unwrap();
            assert!(
                v.get("query").is_some(),
                "this build's plans say their query"
            );
            v.as_object_mut().unwrap().remove("query");
            std::fs::write(o, serde_json::to_vec(&v).unwrap()).unwrap();
            stripped += 1;
        }
        run(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap_or_else(|e| panic!("rerun of a plan without its query: {e}"));
        assert_eq!(
            committed(root, "winold", WINDOWED_COLS).await,
            expected_append(&files).await
        );
        break;
    }
    assert!(stripped > 0, "no injected failure left a planned batch");
}

/// Batches planned under a row-by-row query and left uncommitted, then
/// the query edited into a GROUP BY: the resumed batches run the query as
/// it is now, so the complete snapshot counts every row they read (a plan
/// that says what its query was is trusted only under the spec it was
/// planned from).
#[tokio::test(flavor = "multi_thread")]
async fn batches_resumed_after_the_query_became_a_group_by_are_aggregated() {
    let before = toml(
        "edit",
        "SELECT \"PULocationID\", fare_amount FROM trips",
        "append",
        false,
        1,
    );
    let after = toml(
        "edit",
        "SELECT \"PULocationID\", count(*) AS n FROM trips GROUP BY \"PULocationID\"",
        "complete",
        false,
        1,
    );
    for k in 1..200 {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files = windowed_input(root);
        let failed = run(&fault_context(
            root,
            &before,
            Arc::new(AtomicU64::new(0)),
            k,
        ))
        .await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        let ck = root.join("out/checkpoint/edit");
        let committed: Vec<String> = commit_records(root, &before)
            .await
            .into_iter()
            .flat_map(|c| c.input_keys)
            .collect();
        let pending = walk(&ck.join("offsets"))
            .into_iter()
            .any(|o| !ck.join("commits").join(o.file_name().unwrap()).exists());
        if !pending {
            continue;
        }
        run(&local_context(&pipeline(root, &after)))
            .await
            .unwrap_or_else(|e| panic!("run after the edit: {e}"));
        let unread: Vec<PathBuf> = files
            .iter()
            .filter(|f| {
                let key = f
                    .strip_prefix(root.join("input"))
                    .unwrap()
                    .to_str()
                    .unwrap();
                !committed.iter().any(|c| c == key)
            })
            .cloned()
            .collect();
        let want = duckdb_rows(
            &unread,
            "SELECT \"PULocationID\", count(*) AS n FROM trips GROUP BY \"PULocationID\"",
        )
        .await;
        let manifests = manifest_files(&root.join("out/sink"), "edit").await;
        let (_, complete, snapshot) = manifests.last().expect("a manifest").clone();
        assert!(complete);
        let got = duckdb_rows(&snapshot, "SELECT \"PULocationID\", n FROM trips").await;
        assert_eq!(got, want, "after failing write {k}");
        return;
    }
    panic!("no injected failure left a planned batch");
}

/// Once state exists, a change of the window, the keys, the aggregates,
/// the mode or the partition count would merge old state into wrong
/// answers: the run is refused, naming `sluice reset`, nothing is
/// committed, and the lease is not left held.
#[tokio::test(flavor = "multi_thread")]
async fn changing_what_the_state_is_of_is_refused_until_reset() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("shape", WINDOWED, "append", true, 10);
    crate::schema::write_parquet(
        &root.join("input/trips-000.parquet"),
        &sluice_cli::generator::taxi_batch(0, 50),
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let before = control_of(root, &toml).await;
    crate::schema::write_parquet(
        &root.join("input/trips-001.parquet"),
        &sluice_cli::generator::taxi_batch(1, 50),
    );
    for changed in [
        toml.replace("'15 minutes'", "'30 minutes'"),
        toml.replace("state_partitions = 3", "state_partitions = 4"),
        toml.replace("max(trip_distance)", "min(trip_distance)"),
    ] {
        // `sluice check` foresees it (it passed before the sweep's fix).
        let e = check_error(root, &changed).await;
        assert!(e.contains("sluice reset") && e.contains("state"), "{e}");
        let e = run(&local_context(&pipeline(root, &changed)))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("sluice reset") && e.contains("state"), "{e}");
        let after = control_of(root, &toml).await;
        assert_eq!(after.last_committed, before.last_committed);
        assert_eq!(after.status, sluice_engine::checkpoint::RunStatus::Idle);
    }
    // Unchanged, the run goes on.
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert!(control_of(root, &toml).await.last_committed > before.last_committed);
}

/// `[watermark] wallclock_bound`: a scheduled run with no new data
/// advances the watermark to the wall clock minus the bound and closes the
/// windows whose data can no longer arrive. Run 1 (clock 01:30, data of
/// hour 0) leaves the 00:45 window open (watermark about 00:50); run 2 at
/// 03:00 with no new data emits it: afterwards every window of the file is
/// committed (DuckDB's time_bucket over it). Without the bound, run 2 is
/// idle and the window waits.
#[tokio::test(flavor = "multi_thread")]
async fn a_wallclock_bound_closes_windows_on_a_run_with_no_data() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = toml("wall", WINDOWED, "append", true, 10).replace(
        "delay = \"10 minutes\"",
        "delay = \"10 minutes\"\nwallclock_bound = \"1 hour\"",
    );
    let file = root.join("input/trips-000.parquet");
    crate::schema::write_parquet(&file, &sluice_cli::generator::taxi_batch(0, 120));
    let at = |hh: i64, mm: i64| {
        let ms = 1_704_067_200_000 + (hh * 60 + mm) * 60_000; // 2024-01-01 hh:mm
        let mut ctx = local_context(&pipeline(root, &toml));
        ctx.clock = Arc::new(move || ms);
        ctx
    };
    run(&at(1, 30)).await.unwrap();
    let cols = "window_start, window_end, \"PULocationID\", trips, passengers, longest";
    let all = duckdb_sql(&format!(
        "SELECT time_bucket(INTERVAL 15 MINUTES, tpep_pickup_datetime) AS window_start, \
         time_bucket(INTERVAL 15 MINUTES, tpep_pickup_datetime) + INTERVAL 15 MINUTES AS \
         window_end, \"PULocationID\", count(*) AS trips, sum(passenger_count)::BIGINT AS \
         passengers, max(trip_distance) AS longest FROM read_parquet('{}') GROUP BY ALL",
        file.display()
    ))
    .await;
    let first = committed(root, "wall", cols).await;
    assert!(
        !first.is_empty() && first.len() < all.len(),
        "{} of {}",
        first.len(),
        all.len()
    );
    let second = run(&at(3, 0)).await.unwrap();
    let files: Vec<u64> = second.batches.iter().map(|b| b.files).collect();
    assert_eq!(files, [0], "one batch with no input");
    assert_eq!(committed(root, "wall", cols).await, all);
    // Nothing more is owed: the next run is idle.
    let third = run(&at(3, 5)).await.unwrap();
    assert!(third.batches.is_empty(), "{third:?}");
}

/// Session windows (`session_window(ts, '1 minute')` per vendor) in append
/// mode: run 1 takes hours 0 and 1 in one batch, one task per file, so
/// sessions that cross the hour are merged from two tasks' partials; run 2
/// takes hour 2, whose sessions continue those of hour 1 left in state;
/// run 3 a late copy of hour 1. Expected, without Sluice: DuckDB's
/// gaps-and-islands over the rows that were not late (a row more than the
/// gap after its vendor's previous row starts a session; a session ends at
/// its last row plus the gap), the sessions that end at or before the
/// final watermark.
#[tokio::test(flavor = "multi_thread")]
async fn session_windows_in_append_mode_equal_duckdb_gaps_and_islands() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let sql = r#"SELECT session_window.start AS session_start, session_window.end AS session_end, "VendorID", count(*) AS trips, sum(passenger_count) AS passengers FROM trips GROUP BY session_window(tpep_pickup_datetime, '1 minute'), "VendorID""#;
    let toml = toml("sess", sql, "append", true, 10)
        .replace("[limits]", "[limits]\nmax_bytes_per_task = \"1 KiB\"");
    let file = |name: &str, hour: u64, rows: usize| {
        let path = input.join(name);
        crate::schema::write_parquet(&path, &sluice_cli::generator::taxi_batch(hour, rows));
        path
    };
    let mut batches: Vec<Vec<PathBuf>> = Vec::new();
    batches.push(vec![
        file("trips-000.parquet", 0, 240),
        file("trips-001.parquet", 1, 240),
    ]);
    let first = run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(first.batches[0].files, 2);
    batches.push(vec![file("trips-002.parquet", 2, 240)]);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    batches.push(vec![file("trips-009.parquet", 1, 60)]);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();

    // The oracle: late rows and the final watermark from the batches.
    let (parts, wm) = not_late(&batches, "*").await;
    let want = duckdb_sql(&format!(
        "WITH r AS ({}), \
         f AS (SELECT *, CASE WHEN lag(tpep_pickup_datetime) OVER w IS NULL \
               OR tpep_pickup_datetime > lag(tpep_pickup_datetime) OVER w + INTERVAL 1 MINUTE \
               THEN 1 ELSE 0 END AS fresh FROM r \
               WINDOW w AS (PARTITION BY \"VendorID\" ORDER BY tpep_pickup_datetime)), \
         s AS (SELECT *, sum(fresh) OVER (PARTITION BY \"VendorID\" ORDER BY tpep_pickup_datetime \
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS sid FROM f) \
         SELECT * FROM (SELECT min(tpep_pickup_datetime) AS session_start, \
           max(tpep_pickup_datetime) + INTERVAL 1 MINUTE AS session_end, \"VendorID\", \
           count(*) AS trips, sum(passenger_count)::BIGINT AS passengers \
           FROM s GROUP BY \"VendorID\", sid) WHERE epoch_us(session_end) <= {wm}",
        parts.join(" UNION ALL ")
    ))
    .await;
    // Sessions of several rows, some crossing an hour (a file boundary).
    assert!(want.len() > 30, "{} sessions", want.len());
    let cols = "session_start, session_end, \"VendorID\", trips, passengers";
    assert_eq!(committed(root, "sess", cols).await, want);
    let hour = |h: i64| format!("2024-01-01T{h:02}:00:00");
    assert!(
        want.iter().any(|r| {
            let f: Vec<&str> = r.split('|').collect();
            f[0] < hour(1).as_str() && f[1] > hour(1).as_str()
        }),
        "no session crosses 01:00: the test would not check merging across tasks"
    );
    let control = control_of(root, &toml).await;
    assert_eq!(control.totals.late_rows, 60, "the late file's rows");
}

/// The issue's equivalence property, through the engine: for seeded random
/// arrival orders of five hours of trips and two late copies, grouped into
/// runs (each run's files one batch), one task per file or one per batch,
/// 1 to 8 state partitions, tumbling or sliding windows: the union of the
/// append-mode output equals DuckDB's one-shot windows over the rows that
/// were not late on arrival (computed here from the arrival order),
/// restricted to the windows the final watermark closed.
#[tokio::test(flavor = "multi_thread")]
async fn random_arrivals_batches_tasks_and_partitions_equal_duckdb() {
    let mut seed: u64 = 0x5107_ce11;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for case in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let input = root.join("input");
        let sliding = next(2) == 1;
        let (window, buckets) = if sliding {
            (
                "window(tpep_pickup_datetime, '30 minutes', '15 minutes')",
                2,
            )
        } else {
            ("window(tpep_pickup_datetime, '15 minutes')", 1)
        };
        let partitions = 1 + next(8);
        let per_file_tasks = next(2) == 1;
        let sql = format!(
            r#"SELECT window.start AS window_start, window.end AS window_end, "PULocationID", count(*) AS trips, sum(passenger_count) AS passengers FROM trips GROUP BY {window}, "PULocationID""#
        );
        let mut toml = toml(&format!("eq{case}"), &sql, "append", true, 100).replace(
            "state_partitions = 3",
            &format!("state_partitions = {partitions}"),
        );
        if per_file_tasks {
            toml = toml.replace("[limits]", "[limits]\nmax_bytes_per_task = \"1 KiB\"");
        }
        // Hours 0-4 (120 rows each) and copies of hours 1 and 3 (30 rows),
        // in a random order, grouped into runs of 1 to 3 files.
        let mut files: Vec<(u64, usize)> = (0..5).map(|h| (h, 120)).collect();
        files.extend([(1, 30), (3, 30)]);
        for i in (1..files.len()).rev() {
            files.swap(i, next(i as u64 + 1) as usize);
        }
        let mut batches: Vec<Vec<PathBuf>> = Vec::new();
        let mut at = 0;
        while at < files.len() {
            let take = (1 + next(3) as usize).min(files.len() - at);
            let mut batch = Vec::new();
            for (i, (hour, rows)) in files[at..at + take].iter().enumerate() {
                let path = input.join(format!("trips-{:03}.parquet", at + i));
                crate::schema::write_parquet(
                    &path,
                    &sluice_cli::generator::taxi_batch(*hour, *rows),
                );
                batch.push(path);
            }
            at += take;
            let ran = run(&local_context(&pipeline(root, &toml))).await.unwrap();
            assert_eq!(ran.batches[0].files, take as u64, "case {case}");
            batches.push(batch);
        }
        // The oracle.
        let (parts, wm) = not_late(
            &batches,
            "tpep_pickup_datetime, \"PULocationID\", passenger_count",
        )
        .await;
        let (size, slide) = if sliding { (30, 15) } else { (15, 15) };
        let starts: Vec<String> = (0..buckets)
            .map(|b| {
                format!(
                    "SELECT time_bucket(INTERVAL {slide} MINUTES, tpep_pickup_datetime) - \
                     INTERVAL {} MINUTES AS window_start, * FROM r",
                    b * slide
                )
            })
            .collect();
        let want = duckdb_sql(&format!(
            "WITH r AS ({}) SELECT * FROM (SELECT window_start, window_start + INTERVAL {size} \
             MINUTES AS window_end, \"PULocationID\", count(*) AS trips, \
             sum(passenger_count)::BIGINT AS passengers FROM ({}) GROUP BY ALL) \
             WHERE epoch_us(window_end) <= {wm}",
            parts.join(" UNION ALL "),
            starts.join(" UNION ALL ")
        ))
        .await;
        assert!(want.len() > 50, "case {case}: {} windows", want.len());
        let cols = "window_start, window_end, \"PULocationID\", trips, passengers";
        let got = committed(root, &format!("eq{case}"), cols).await;
        assert!(
            got == want,
            "case {case} (sliding {sliding}, {partitions} partitions, task per file \
             {per_file_tasks}, runs {:?}): {} rows, want {}",
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            got.len(),
            want.len()
        );
    }
}

/// A stateful batch with 1,024 state partitions adds about 7,200 events to
/// its execution's history (a merge per partition in an inline Map), so
/// the third batch would pass Step Functions' 25,000-event cap: the
/// planner hands over to a new execution before it (the same hand-over as
/// `max_batches_per_execution`), and the output is still DuckDB's windows.
#[tokio::test(flavor = "multi_thread")]
async fn many_state_partitions_hand_over_before_the_history_cap() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    let toml = toml("wide", WINDOWED, "append", true, 1)
        .replace("state_partitions = 3", "state_partitions = 1024");
    let files: Vec<PathBuf> = (0..2u64)
        .map(|h| {
            let path = input.join(format!("trips-{h:03}.parquet"));
            crate::schema::write_parquet(&path, &sluice_cli::generator::taxi_batch(h, 100));
            path
        })
        .collect();
    let ran = run(&local_context(&pipeline(root, &toml))).await.unwrap();
    // Two data batches and the closing one: 3 x ~7,200 events > 20,000.
    let files_per_batch: Vec<u64> = ran.batches.iter().map(|b| b.files).collect();
    assert_eq!(files_per_batch, [1, 1, 0]);
    assert_eq!(
        ran.executions, 2,
        "the closing batch runs in a second execution"
    );
    let cols = "window_start, window_end, \"PULocationID\", trips, passengers, longest";
    assert_eq!(
        committed(root, "wide", cols).await,
        expected_append(&[files[0].clone(), files[1].clone()]).await
    );
}

/// For files committed in `batches` (each one batch, in order): per batch
/// a DuckDB query of `cols` over its rows that were not late (above the
/// watermark before it: the largest pickup so far minus the delay), and
/// the final watermark, microseconds.
async fn not_late(batches: &[Vec<PathBuf>], cols: &str) -> (Vec<String>, i64) {
    let delay = DELAY_MIN * 60_000_000;
    let mut wm: Option<i64> = None;
    let mut parts = Vec::new();
    for files in batches {
        let cut = wm.map_or(String::new(), |w| {
            format!(" WHERE epoch_us(tpep_pickup_datetime) > {w}")
        });
        parts.push(format!(
            "SELECT {cols} FROM read_parquet([{}]){cut}",
            quoted(files)
        ));
        let mut m = i64::MIN;
        for f in files {
            m = m.max(max_pickup_us(f).await);
        }
        wm = Some(wm.map_or(m - delay, |w| w.max(m - delay)));
    }
    (parts, wm.expect("at least one batch"))
}

/// The first hour's case: `sluice gen taxi --format csv` writes pickup
/// times with and without fractions (`2024-01-01T02:00:00`,
/// `2024-01-01T02:00:01.800`); inference typed the column as text, so the
/// README's window query over generated CSV was refused. The column is a
/// timestamp now, and the windows equal DuckDB's over the CSV files (which
/// infers TIMESTAMP), in complete mode so every window shows.
#[tokio::test(flavor = "multi_thread")]
async fn the_readme_window_query_runs_over_generated_csv() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = sluice_cli::generator::write_taxi_files(
        &root.join("input"),
        2,
        1000,
        sluice_engine::pipeline::SourceFormat::Csv,
        None,
    )
    .unwrap();
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        text.contains(":00,") && text.contains('.'),
        "the generator writes mixed precision"
    );
    let sql = r#"SELECT window.start AS window_start, "PULocationID", count(*) AS trips FROM trips GROUP BY window(tpep_pickup_datetime, '15 minutes'), "PULocationID""#;
    let toml = toml("gencsv", sql, "complete", false, 1).replace("\"parquet\"", "\"csv\"");
    run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let manifests = manifest_files(&root.join("out/sink"), "gencsv").await;
    let (_, _, last) = manifests.last().unwrap().clone();
    let got = duckdb_sql(&format!(
        "SELECT * FROM read_parquet([{}], hive_partitioning = false)",
        quoted(&last)
    ))
    .await;
    let want = duckdb_sql(&format!(
        "SELECT time_bucket(INTERVAL 15 MINUTES, tpep_pickup_datetime) AS window_start, \
         \"PULocationID\", count(*) AS trips FROM read_csv([{}]) GROUP BY ALL",
        quoted(&files)
    ))
    .await;
    assert!(!want.is_empty());
    assert_eq!(got, want);
}

/// The first hour's case: the refusal of a window over a text column said
/// "cast it in a derived table", and doing so was refused ("the source has
/// no column ts"). Windows are assigned as the source is read, so the
/// column must be typed by the source schema: both refusals now say that,
/// and declaring the type works.
#[tokio::test(flavor = "multi_thread")]
async fn a_window_over_a_cast_says_what_works() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = root.join("input");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("1.csv"), "t,k\nmonday,a\n").unwrap();
    let base = |sql: &str, schema: &str| {
        format!(
            "name = \"cast\"\n[source]\nuri = \"input\"\nformat = \"csv\"\ntable = \"e\"\n{schema}\n[query]\nsql = \"{sql}\"\n[sink]\nuri = \"out/sink\"\nmode = \"complete\"\n[checkpoint]\nuri = \"out/checkpoint\"\n"
        )
    };
    for sql in [
        "SELECT window.start AS ws, count(*) AS n FROM e GROUP BY window(t, '1 hour')",
        "SELECT window.start AS ws, count(*) AS n FROM (SELECT CAST(t AS TIMESTAMP) AS ts FROM e) GROUP BY window(ts, '1 hour')",
    ] {
        let e = run(&local_context(&pipeline(root, &base(sql, ""))))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("source.schema")
                && !e.contains("derived table first")
                && !e.contains("cast it in a derived"),
            "{sql}: {e}"
        );
    }
    std::fs::write(input.join("1.csv"), "t,k\n2024-01-01T00:10:00,a\n").unwrap();
    let declared = base(
        "SELECT window.start AS ws, count(*) AS n FROM e GROUP BY window(t, '1 hour')",
        "schema = [{ name = \"t\", type = \"Timestamp(Microsecond, None)\" }, { name = \"k\", type = \"Utf8\" }]",
    );
    run(&local_context(&pipeline(root, &declared)))
        .await
        .unwrap();
    assert_eq!(
        manifest_rows(&root.join("out/sink"), "cast", "ws, n", "").await,
        ["2024-01-01T00:00:00|1"]
    );
}
