//! The `sluice` binary as a user runs it: the sample pipeline, `show`,
//! `gen`, refused pipeline files, and DuckDB reading the committed output.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::*;

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "sluice failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_name() == "out" {
            continue;
        }
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// A copy of the sample pipeline in a fresh folder, and its pipeline file.
fn sample_copy() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../samples/taxi");
    copy_dir(&sample, dir.path());
    let file = dir.path().join("pipeline.toml");
    (dir, file.to_str().unwrap().to_string())
}

/// A reader that stops reading (`sluice history P | head -1`): sluice
/// stops quietly with status 141, as a command killed by SIGPIPE, not
/// with a panic and a backtrace.
#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    let (_dir, file) = sample_copy();
    stdout(&sluice(&["run", &file]));
    for command in ["history", "show"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([command, &file])
            .env("RUST_BACKTRACE", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before sluice prints anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{command}: {err}");
        assert!(!err.contains("panicked"), "{command}: {err}");
    }
}

#[test]
fn sample_run_idle_run_gen_and_show() {
    let (dir, file) = sample_copy();
    let file = file.as_str();

    let first = stdout(&sluice(&["run", file]));
    assert!(
        first.lines().filter(|l| l.starts_with("batch")).count() >= 2,
        "{first}"
    );
    assert!(first.contains("committed"), "{first}");

    let idle = stdout(&sluice(&["run", file]));
    assert!(idle.contains("no new data"), "{idle}");
    assert!(!idle.contains("batch "), "{idle}");

    let show = stdout(&sluice(&["show", file]));
    assert!(show.contains("waiting      0 files"), "{show}");
    assert!(show.contains("last batch"), "{show}");
    // What a person reads: the names written in pipeline files and SQL
    // type names, no Rust debug output.
    assert!(show.contains("(parquet, ordered discovery)"), "{show}");
    assert!(
        show.contains("tpep_pickup_datetime timestamp")
            && show.contains("fare_amount double")
            && show.contains("store_and_fwd_flag string"),
        "{show}"
    );

    let data = dir.path().join("data");
    stdout(&sluice(&[
        "gen",
        "taxi",
        "--files",
        "3",
        "--rows",
        "500",
        "--format",
        "parquet",
        "--out",
        data.to_str().unwrap(),
    ]));
    let show = stdout(&sluice(&["show", file]));
    assert!(show.contains("waiting      3 files"), "{show}");
    // Lag: the oldest waiting file's age, from its modification time.
    assert!(show.contains("the oldest waiting for"), "{show}");
    assert!(show.contains("last run     cost $"), "{show}");
    // Logs piped (not a terminal) carry no colour codes.
    let logged = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", file])
        .env("SLUICE_LOG", "info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&logged.stderr);
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains('\u{1b}'), "{log}");
    let again = stdout(&logged);
    let files: u64 = again
        .lines()
        .filter(|l| l.starts_with("batch"))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(files, 3, "only the new files are read: {again}");

    // DuckDB, an outside reader, sees exactly the committed rows.
    let sink = dir.path().join("out/sink");
    let script = format!(
        "import duckdb, json, glob, os\n\
         files = []\n\
         for m in sorted(glob.glob(os.path.join({sink:?}, '_sluice/manifest/*.json'))):\n\
         \x20   files += [os.path.join({sink:?}, f['key']) for f in json.load(open(m))['files']]\n\
         print(duckdb.sql(f'select count(*) from read_parquet({{files!r}})').fetchall()[0][0])\n",
        sink = sink.to_str().unwrap()
    );
    let out = Command::new(python())
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "duckdb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let duck: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let show = stdout(&sluice(&["show", file, "--json"]));
    let status: serde_json::Value = serde_json::from_str(&show).unwrap();
    let rows_out = status["control"]["totals"]["rows_out"].as_u64().unwrap();
    assert!(rows_out > 0);
    assert_eq!(duck, rows_out, "DuckDB count vs committed rows");
}

fn refused(toml: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    gen_files(&dir.path().join("input"), 1, 10);
    let file = dir.path().join("p.toml");
    std::fs::write(&file, toml).unwrap();
    let out = sluice(&["run", file.to_str().unwrap()]);
    assert!(!out.status.success(), "expected a refusal for:\n{toml}");
    // A bad pipeline file or query is bad input: exit code 4.
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !dir.path().join("out").exists(),
        "a refused pipeline wrote something"
    );
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn malformed_pipelines_and_bad_sql_are_refused_before_anything_runs() {
    let good = pipeline_toml("p", "parquet", "", "");
    let e = refused(&good.replace("table = \"trips\"", "table = \"trips\"\ntabel = \"x\""));
    assert!(e.contains("tabel") && e.contains("line 6"), "{e}");
    let e = refused(&good.replace("format = \"parquet\"\n", ""));
    assert!(e.contains("missing field `format`"), "{e}");
    let e = refused(&good.replace("[limits]\n", "[limits]\nmax_files_per_batch = -3\n"));
    assert!(e.contains("max_files_per_batch"), "{e}");
    let e = refused(&good.replace("fare_amount,", "fare_amont,"));
    assert!(
        e.contains("query does not plan") && e.contains("fare_amont"),
        "{e}"
    );
    let e = refused(&good.replace(
        SQL,
        "SELECT payment_type, count(*) FROM trips GROUP BY payment_type",
    ));
    assert!(e.contains("sink.mode = \"append\""), "{e}");
    let e = refused(&good.replace(SQL, "SELEC 1"));
    assert!(e.contains("query does not plan"), "{e}");
}

#[test]
fn pause_resume_and_history_on_the_sample() {
    let (_dir, file) = sample_copy();
    let file = file.as_str();

    let none = stdout(&sluice(&["history", file]));
    assert!(none.contains("no committed batches"), "{none}");
    let paused = stdout(&sluice(&["pause", file]));
    assert!(paused.contains("paused"), "{paused}");
    let shown = stdout(&sluice(&["show", file]));
    assert!(shown.contains("state        paused"), "{shown}");
    // The first hour's case: a run on a paused pipeline exited 0 without
    // recording the request, and `show` said "Idle". It exits 3 (paused),
    // the request is recorded, `show` says so, and `resume` reports it.
    let held = sluice(&["run", file]);
    assert_eq!(held.status.code(), Some(3), "{held:?}");
    let held = String::from_utf8(held.stdout).unwrap();
    assert!(
        held.contains("paused") && held.contains("request is recorded") && !held.contains("batch "),
        "{held}"
    );
    let shown = stdout(&sluice(&["show", file]));
    assert!(shown.contains("paused (a run was asked for"), "{shown}");
    let resumed = stdout(&sluice(&["resume", file]));
    assert!(
        resumed.contains("resumed") && resumed.contains("a run was requested while paused"),
        "{resumed}"
    );
    let ran = stdout(&sluice(&["run", file]));
    let batches = ran.lines().filter(|l| l.starts_with("batch")).count();
    assert!(batches >= 2, "{ran}");

    let history = stdout(&sluice(&["history", file]));
    let rows: Vec<&str> = history
        .lines()
        .skip(1)
        .filter(|l| l.contains("sluice run"))
        .collect();
    assert_eq!(rows.len(), batches, "{history}");
    // Newest first.
    assert!(
        rows[0].trim_start().starts_with(&(batches - 1).to_string()),
        "{history}"
    );
    let json: serde_json::Value = serde_json::from_str(&stdout(&sluice(&[
        "history", file, "--json", "--limit", "1",
    ])))
    .unwrap();
    assert_eq!(json.as_array().unwrap().len(), 1);
    assert_eq!(json[0]["trigger"], "sluice run");
}

/// `sluice reset` asks for --yes, then starts the sample over: the next run
/// commits every file again, once.
#[test]
fn reset_asks_then_starts_over() {
    let (_dir, file) = sample_copy();
    let file = file.as_str();
    let first = stdout(&sluice(&["run", file]));
    let batches = first.lines().filter(|l| l.starts_with("batch")).count();
    assert!(batches >= 2, "{first}");

    let asked = sluice(&["reset", file]);
    assert!(!asked.status.success());
    let text = String::from_utf8_lossy(&asked.stderr);
    assert!(text.contains("--yes"), "{text}");
    let idle = stdout(&sluice(&["run", file]));
    assert!(!idle.lines().any(|l| l.starts_with("batch")), "{idle}");

    let reset = stdout(&sluice(&["reset", file, "--yes"]));
    assert!(reset.contains("reset; removed"), "{reset}");
    let again = stdout(&sluice(&["run", file]));
    assert_eq!(
        again.lines().filter(|l| l.starts_with("batch")).count(),
        batches,
        "{again}"
    );
}

/// Quarantine through the binary: a poison upload among the sample's files
/// is reported by `run` (summary line), `show` (key and reason) and
/// `history` (count); `retry-quarantined --key` after the fix makes the next
/// run read it once.
#[test]
fn quarantine_and_retry_through_the_cli() {
    let (dir, file) = sample_copy();
    let toml = std::fs::read_to_string(&file).unwrap().replace(
        "lookback = 100             # ordered mode",
        "lookback = 100\non_bad_file = \"quarantine\" # ordered mode",
    );
    std::fs::write(&file, toml).unwrap();
    let file = file.as_str();
    let poison = dir
        .path()
        .join("data/date=2024-01-01/trips-000001x.parquet");
    std::fs::write(&poison, b"not parquet").unwrap();
    let key = "date=2024-01-01/trips-000001x.parquet";

    let ran = stdout(&sluice(&["run", file]));
    assert!(ran.contains("1 file quarantined"), "{ran}");
    let show = stdout(&sluice(&["show", file]));
    assert!(
        show.contains("quarantined  1 files") && show.contains(key),
        "{show}"
    );
    assert!(
        show.lines()
            .any(|l| l.starts_with("so far") && l.ends_with(", 1 file quarantined")),
        "{show}"
    );
    let history = stdout(&sluice(&["history", file]));
    assert!(history.contains("quar."), "{history}");
    let counts: Vec<&str> = history
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(4).unwrap())
        .collect();
    assert!(counts.contains(&"1"), "{history}");

    std::fs::copy(
        dir.path().join("data/date=2024-01-01/trips-000001.parquet"),
        &poison,
    )
    .unwrap();
    let asked = stdout(&sluice(&["retry-quarantined", file, "--key", key]));
    assert!(asked.contains("reads 1 quarantined file again"), "{asked}");
    let again = stdout(&sluice(&["run", file]));
    assert!(
        again.contains("committed 1 batch: 1 file,") && !again.contains("quarantined"),
        "{again}"
    );
    let show = stdout(&sluice(&["show", file]));
    assert!(!show.contains("quarantined  "), "{show}");
}

/// Schema changes through the binary: under `add-columns` an upload with a
/// new column is reported by `run` (summary line), `show` (the version in
/// force and its columns) and `history` (the version, `+` where added).
#[test]
fn schema_versions_show_in_run_show_and_history() {
    use datafusion::arrow::array::{RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let (dir, file) = sample_copy();
    let toml = std::fs::read_to_string(&file).unwrap().replace(
        "lookback = 100             # ordered mode",
        "lookback = 100\non_schema_change = \"add-columns\" # ordered mode",
    );
    std::fs::write(&file, toml).unwrap();
    let file = file.as_str();
    stdout(&sluice(&["run", file]));

    let base = sluice_cli::generator::taxi_batch(99, 40);
    let mut fields: Vec<Field> = base
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("congestion_note", DataType::Utf8, true));
    let mut cols = base.columns().to_vec();
    cols.push(std::sync::Arc::new(StringArray::from(vec!["slow"; 40])));
    let batch = RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), cols).unwrap();
    crate::schema::write_parquet(
        &dir.path().join("data/date=2024-01-01/trips-999999.parquet"),
        &batch,
    );

    let ran = stdout(&sluice(&["run", file]));
    assert!(
        ran.contains("column congestion_note added (schema version 2)")
            && ran.contains("new column congestion_note joined the output (schema version 2)"),
        "{ran}"
    );
    let show = stdout(&sluice(&["show", file]));
    assert!(
        show.contains("schema       version 2") && show.contains("congestion_note string"),
        "{show}"
    );
    let history = stdout(&sluice(&["history", file]));
    let schemas: Vec<&str> = history
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(10).unwrap())
        .collect();
    assert_eq!(schemas.first(), Some(&"v2+"), "{history}");
    assert!(schemas[1..].iter().all(|s| *s == "v1"), "{history}");
}

/// `sluice cost --json` on the sample (two runs), against the bill
/// computed here from the commit records and control.json as plain JSON,
/// with AWS's us-east-1 list prices typed in: Lambda arm64 $0.0000133334
/// per GB-s and $0.20 per million requests, Step Functions $0.025 per
/// 1,000 Standard transitions, Express $1 per million executions and
/// $0.00001667 per GB-s (64 MB), S3 $0.005 per 1,000 PUT/COPY/POST/LIST and $0.0004
/// per 1,000 GET; the always-on job 2 x (4 vCPU x $0.052624 + 16 GB x
/// $0.0057785) an hour. Then a price table of our own (`--prices`).
#[test]
fn cost_prices_the_recorded_usage() {
    let (dir, file) = sample_copy();
    let file = file.as_str();
    stdout(&sluice(&["run", file]));
    let data = dir.path().join("data");
    stdout(&sluice(&[
        "gen",
        "taxi",
        "--files",
        "1",
        "--rows",
        "500",
        "--out",
        data.to_str().unwrap(),
    ]));
    stdout(&sluice(&["run", file]));
    let ck = dir.path().join("out/checkpoint/taxi");
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let bill = |u: &serde_json::Value, r: Option<&serde_json::Value>, gb_s_price: f64| -> f64 {
        let mut gb_s = 0.0;
        let mut calls = 0.0;
        for f in u["functions"].as_array().into_iter().flatten() {
            gb_s += f["billed_ms"].as_f64().unwrap() / 1000.0 * f["memory_mb"].as_f64().unwrap()
                / 1024.0;
            calls += f["invocations"].as_f64().unwrap();
        }
        let mut total = gb_s * gb_s_price + calls * 0.0000002;
        total += u["transitions"].as_f64().unwrap() * 0.000025;
        // Express: $1 per million executions, $0.00001667 per GB-s at
        // 64 MB; its transitions are not billed.
        let x = |k: &str| u["express"][k].as_f64().unwrap_or(0.0);
        total += x("executions") * 0.000001 + x("billed_ms") / 1000.0 * 0.0625 * 0.00001667;
        if let Some(r) = r {
            // (Absent: none, as a run that ended at its commit records.)
            let n = |k: &str| r[k].as_f64().unwrap_or(0.0);
            total += (n("put") + n("put_create") + n("put_update") + n("list")) / 1000.0 * 0.005;
            total += n("get") / 1000.0 * 0.0004;
        }
        total
    };
    let mut commits = Vec::new();
    for e in std::fs::read_dir(ck.join("commits")).unwrap() {
        commits.push(read(&e.unwrap().path()));
    }
    assert_eq!(commits.len(), 3, "two batches, then one");
    let batches: f64 = commits
        .iter()
        .map(|c| bill(&c["usage"], Some(&c["requests"]), 0.0000133334))
        .sum();
    let totals = &read(&ck.join("control.json"))["totals"];
    assert_eq!(totals["runs"], 2);
    // Both runs were one Express execution each (the default), whose
    // transitions are counted and not billed (6 a batch and the
    // `Committed` choice); each ended at its last commit, with no Plan.
    assert_eq!(totals["run_ends"]["express"]["executions"], 2, "{totals}");
    assert!(
        commits
            .iter()
            .all(|c| c["usage"]["transitions"] == 0 && c["usage"]["express"]["transitions"] == 7),
        "{commits:?}"
    );
    assert!(totals.get("plan_ends").is_none(), "{totals}");
    // What no record holds: each run's ending (its Plan invocation,
    // transitions and requests), and each batch's work after its record.
    let outside = |gb_s_price: f64| {
        bill(
            &totals["run_ends"],
            Some(&totals["run_end_requests"]),
            gb_s_price,
        ) + bill(
            &serde_json::json!({"transitions": 0}),
            Some(&totals["after_commits"]),
            gb_s_price,
        )
    };
    assert!(totals["after_commits"]["put_update"].as_u64().unwrap() >= 3);
    let per_run = (batches + outside(0.0000133334)) / 2.0;
    let hourly = 2.0 * (4.0 * 0.052624 + 16.0 * 0.0057785);
    let got: serde_json::Value = serde_json::from_str(&stdout(&sluice(&[
        "cost",
        file,
        "--json",
        "--every",
        "5 minutes",
    ])))
    .unwrap();
    let close = |a: &serde_json::Value, b: f64, what: &str| {
        let a = a.as_f64().unwrap();
        assert!((a - b).abs() <= 1e-12 * b.max(1.0), "{what}: {a} vs {b}");
    };
    assert!(per_run > 0.0);
    close(&got["per_run"], per_run, "per run");
    close(
        &got["month"],
        per_run * 12.0 * 730.0,
        "month at one run every 5 minutes",
    );
    close(&got["always_on_month"], hourly * 730.0, "always on");
    close(
        &got["break_even_runs_per_hour"],
        hourly / per_run,
        "break-even",
    );
    assert_eq!(got["free_tier"], "not included");
    // A schedule every 5 minutes and data once an hour: 8,760 runs, 730
    // of them with data; the other 8,030 are priced as a run's measured
    // ending plus an idle Plan (no idle run or Plan-made ending is
    // recorded: both runs ended at their last commit): one planner
    // invocation at the batches' mean, one GET and one LIST.
    let (mut plan_ms, mut plans, mut plan_mb) = (0.0, 0.0, 0.0);
    for c in &commits {
        for f in c["usage"]["functions"].as_array().unwrap() {
            if f["function"] == "planner" {
                plan_ms += f["billed_ms"].as_f64().unwrap();
                plans += f["invocations"].as_f64().unwrap();
                plan_mb = f["memory_mb"].as_f64().unwrap();
            }
        }
    }
    assert!(plans > 0.0);
    let idle_plan = ((plan_ms / plans).floor() / 1000.0 * plan_mb / 1024.0) * 0.0000133334
        + 0.0000002
        + 0.0004 / 1000.0
        + 0.005 / 1000.0;
    let idle = bill(
        &totals["run_ends"],
        Some(&totals["run_end_requests"]),
        0.0000133334,
    ) / 2.0
        + idle_plan;
    assert!(idle > 0.0 && idle < per_run);
    let scheduled: serde_json::Value = serde_json::from_str(&stdout(&sluice(&[
        "cost",
        file,
        "--json",
        "--every",
        "5m",
        "--data-every",
        "1 hour",
    ])))
    .unwrap();
    close(
        &scheduled["month"],
        per_run * 730.0 + idle * (8760.0 - 730.0),
        "month at a 5-minute schedule with data once an hour",
    );
    assert_eq!(scheduled["idle_runs_per_month"].as_f64(), Some(8030.0));
    let text = stdout(&sluice(&[
        "cost",
        file,
        "--every",
        "5m",
        "--data-every",
        "1h",
    ]));
    assert!(
        text.contains("730 find data (one arrival every 1h 0m)")
            && text.contains("8030 find nothing at"),
        "{text}"
    );
    // --data-every says nothing without the schedule: a command line error.
    let alone = sluice(&["cost", file, "--data-every", "1h"]);
    assert_eq!(alone.status.code(), Some(2), "{alone:?}");
    let table = stdout(&sluice(&["cost", file, "--every", "5 minutes"]));
    assert!(
        table.contains("break-even") && table.contains("free tier not included"),
        "{table}"
    );
    // Durations read as durations: "every 5m 0s", not "every 300 s".
    assert!(
        table.contains("at one run every 5m 0s (") && !table.contains("300 s"),
        "{table}"
    );
    // The first hour's case: runs made back to back were projected as
    // "one run every 0 s" ($22,304.68 a month). Too few runs, or runs back
    // to back, project nothing and say to pass --every.
    let bursty = stdout(&sluice(&["cost", file]));
    assert!(
        bursty.contains("month         not projected") && bursty.contains("--every"),
        "{bursty}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&sluice(&["cost", file, "--json"]))).unwrap();
    assert!(json["month"].is_null(), "{json}");
    let recent: serde_json::Value = serde_json::from_str(&stdout(&sluice(&[
        "cost", file, "--json", "--since", "1 hour",
    ])))
    .unwrap();
    assert_eq!(recent["batches"].as_array().unwrap().len(), 3);
    let none: serde_json::Value = serde_json::from_str(&stdout(&sluice(&[
        "cost", file, "--json", "--since", "1 ms",
    ])))
    .unwrap();
    assert!(none["batches"].as_array().unwrap().is_empty(), "{none}");
    let history = stdout(&sluice(&["history", file]));
    assert!(
        history.lines().next().unwrap().contains("cost"),
        "{history}"
    );

    // Our own price table: x86_64 Lambda at $0.0000166667 per GB-s.
    let ours = dir.path().join("prices.toml");
    let default = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/prices/us-east-1.toml"),
    )
    .unwrap();
    std::fs::write(
        &ours,
        default.replace("architecture = \"arm64\"", "architecture = \"x86_64\""),
    )
    .unwrap();
    let x86: serde_json::Value = serde_json::from_str(&stdout(&sluice(&[
        "cost",
        file,
        "--json",
        "--prices",
        ours.to_str().unwrap(),
    ])))
    .unwrap();
    let batches_x86: f64 = commits
        .iter()
        .map(|c| bill(&c["usage"], Some(&c["requests"]), 0.0000166667))
        .sum();
    close(
        &x86["per_run"],
        (batches_x86 + outside(0.0000166667)) / 2.0,
        "per run, x86_64",
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[lambda]\n").unwrap();
    // A table that does not parse, or is not there, is bad input (exit
    // 4), named, with what to do (a missing one exited 1).
    let missing = dir.path().join("missing.toml");
    for table in [&bad, &missing] {
        let refused = sluice(&["cost", file, "--prices", table.to_str().unwrap()]);
        assert_eq!(refused.status.code(), Some(4), "{refused:?}");
        let e = String::from_utf8_lossy(&refused.stderr);
        let name = table.file_name().unwrap().to_str().unwrap();
        assert!(e.contains(name) && e.contains("leave --prices out"), "{e}");
    }
    // `history --limit 0` is a wrong command line, not "no committed
    // batches".
    let zero = sluice(&["history", file, "--limit", "0"]);
    assert_eq!(zero.status.code(), Some(2), "{zero:?}");
}

/// `sluice gen` and `sluice run` at a terminal (a pseudo-terminal) draw a
/// progress bar with rate and ETA; piped, they print plain lines only, no
/// escape sequences or carriage returns.
#[test]
fn progress_bars_on_a_terminal_and_plain_lines_otherwise() {
    let (dir, file) = sample_copy();
    let data = dir.path().join("data");
    let gen_args = [
        "gen",
        "taxi",
        "--files",
        "20",
        "--rows",
        "3000",
        "--out",
        data.to_str().unwrap(),
    ];
    let at_terminal = |args: &[&str]| -> String {
        let out = Command::new(python())
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/e2e/pty_run.py"
            ))
            .arg(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .env("TERM", "xterm")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let generated = at_terminal(&gen_args);
    assert!(
        generated.contains("ETA") && generated.contains("20/20 files"),
        "{generated}"
    );
    assert!(
        generated.contains("\\r") || generated.contains("\\x1b["),
        "redrawn in place: {generated}"
    );
    let run = at_terminal(&["run", &file]);
    assert!(run.contains("ETA") && run.contains("files"), "{run}");
    assert!(run.contains("batch "), "{run}");
    // The rate is rounded; the summary starts a line of its own (the bar
    // is cleared first), not after the bar's last state.
    assert!(!run.contains(".0501/s") && run.contains("/s ETA"), "{run}");
    let at = run.find("taxi: committed").expect("a summary");
    let before = &run[..at];
    assert!(
        before.ends_with("\\n") || before.ends_with("\\r") || before.ends_with("\\x1b[2K"),
        "the summary follows the bar on its line: {}",
        &run[at.saturating_sub(60)..(at + 20).min(run.len())]
    );

    // Piped: the same commands, plain lines.
    let piped = stdout(&sluice(&gen_args));
    assert_eq!(piped.lines().count(), 20, "{piped}");
    let run = stdout(&sluice(&["run", &file]));
    for text in [&piped, &run] {
        assert!(
            !text.contains('\r') && !text.contains('\x1b') && !text.contains("ETA"),
            "{text}"
        );
    }
    assert!(run.contains("batch ") && run.contains("committed"), "{run}");
}

/// The first hour's cases: with no input files yet, a JOIN query and a
/// misspelled source folder both passed ("no input files yet", exit 0).
/// A folder that is not there is an error naming it (exit 4); a query is
/// checked at once when the schema is declared; `sluice check` runs every
/// check without writing, exits 4 on a problem, and says what it could
/// not check yet and why.
#[test]
fn check_says_what_it_checked_and_what_it_could_not_yet() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("input")).unwrap();
    let write = |name: &str, toml: &str| {
        let f = root.join(name);
        std::fs::write(&f, toml).unwrap();
        f.to_str().unwrap().to_string()
    };
    let base = pipeline_toml("chk", "parquet", "", "");
    // A misspelled source folder.
    let typo = write(
        "typo.toml",
        &base.replace("uri = \"input\"", "uri = \"inptu\""),
    );
    for cmd in ["run", "check"] {
        let out = sluice(&[cmd, &typo]);
        assert_eq!(out.status.code(), Some(4), "{cmd}: {out:?}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            e.contains("inptu") && e.contains("not a folder"),
            "{cmd}: {e}"
        );
    }
    assert!(
        !root.join("out").exists(),
        "a refused check wrote something"
    );
    // No files, no schema: the query cannot be checked yet, and says so.
    let join = write(
        "join.toml",
        &base.replace(SQL, "SELECT a.x FROM trips a JOIN trips b ON a.x = b.x"),
    );
    let said = stdout(&sluice(&["check", &join]));
    assert!(
        said.contains("not checked yet: the source schema and the query")
            && said.contains("declare it"),
        "{said}"
    );
    // Hints that cover the query: planned at once, the join refused by
    // `check` and by `run`, with nothing written.
    let hinted = write(
        "hinted.toml",
        &base
            .replace(SQL, "SELECT a.x FROM trips a JOIN trips b ON a.x = b.x")
            .replace(
                "table = \"trips\"",
                "table = \"trips\"\nschema_hints = { x = \"bigint\" }",
            )
            .replace("out/sink", "out/hinted"),
    );
    for cmd in ["check", "run"] {
        let out = sluice(&[cmd, &hinted]);
        assert_eq!(out.status.code(), Some(4), "{cmd}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("joins"),
            "{cmd}: {out:?}"
        );
    }
    // A syntax error needs no column at all.
    let typo = write(
        "syntax.toml",
        &base
            .replace(SQL, "SELEC x FROM trips")
            .replace("out/sink", "out/syntax"),
    );
    let out = sluice(&["check", &typo]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    // A hinted query that plans: checked, the rest of the schema waits.
    let covered = write(
        "covered.toml",
        &base
            .replace(SQL, "SELECT x + 1 AS y FROM trips WHERE x > 0")
            .replace(
                "table = \"trips\"",
                "table = \"trips\"\nschema_hints = { x = \"bigint\" }",
            )
            .replace("out/sink", "out/covered"),
    );
    let said = stdout(&sluice(&["check", &covered]));
    assert!(
        said.contains("query.sql against the 1 hinted column alone")
            && said.contains("not checked yet: the rest of the source schema"),
        "{said}"
    );
    let ran = stdout(&sluice(&["run", &join]));
    assert!(
        ran.contains("the query is checked once the first file arrives"),
        "{ran}"
    );
    // Declared: the join is refused at once, by name, with nothing written.
    let declared = write(
        "declared.toml",
        &base
            .replace(SQL, "SELECT a.x FROM trips a JOIN trips b ON a.x = b.x")
            .replace(
                "table = \"trips\"",
                "table = \"trips\"\nschema = [{ name = \"x\", type = \"Int64\" }]",
            ),
    );
    let out = sluice(&["check", &declared]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("joins"),
        "{out:?}"
    );
    // Files arrive: everything is checked.
    gen_files(&root.join("input"), 1, 10);
    let good = write("good.toml", &base);
    let said = stdout(&sluice(&["check", &good]));
    assert!(
        said.contains("checked: query.sql against it") && !said.contains("not checked yet"),
        "{said}"
    );
    assert!(
        !root.join("out/checkpoint").exists(),
        "check wrote to the checkpoint"
    );
}

/// AWS errors say their root cause and what to do, never the SDK's debug
/// dump (`DispatchFailure(DispatchFailure { ... })`): no region set; an
/// endpoint that refuses connections. `--json` prints errors as an object
/// with the class, the message and the exit code.
#[test]
fn aws_errors_say_their_root_cause() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(
        &file,
        "name = \"a\"\n[source]\nuri = \"s3://some-bucket/in/\"\nformat = \"csv\"\ntable = \"t\"\n\
         [query]\nsql = \"SELECT * FROM t\"\n[sink]\nuri = \"s3://some-bucket/out/\"\n\
         [checkpoint]\nuri = \"s3://some-bucket/ck/\"\n",
    )
    .unwrap();
    let run = |env: &[(&str, &str)], json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.args(["run", file.to_str().unwrap()]);
        if json {
            cmd.arg("--json");
        }
        for k in [
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_ENDPOINT_URL",
            "AWS_PROFILE",
        ] {
            cmd.env_remove(k);
        }
        cmd.env("AWS_CONFIG_FILE", dir.path().join("none"))
            .env("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("none"))
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_EC2_METADATA_DISABLED", "true");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let no_region = run(&[], false);
    let said = String::from_utf8_lossy(&no_region.stderr);
    assert!(
        said.contains("set AWS_REGION") && !said.contains("DispatchFailure"),
        "{said}"
    );
    assert_eq!(
        no_region.status.code(),
        Some(1),
        "a setting to fix, not to retry: {said}"
    );
    let refused = run(
        &[
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
        ],
        true,
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!said.contains("DispatchFailure"), "{said}");
    let json: serde_json::Value = serde_json::from_slice(&refused.stdout).unwrap_or_else(|e| {
        panic!(
            "--json error: {e}: {}",
            String::from_utf8_lossy(&refused.stdout)
        )
    });
    assert_eq!(json["error"]["class"], "Sluice.Retryable", "{json}");
    assert_eq!(json["error"]["exit_code"], 5, "{json}");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("Connection refused") && message.contains("is the endpoint reachable"),
        "{message}"
    );
    assert_eq!(refused.status.code(), Some(5));
}

/// `--json` on every command that prints a result (anywhere on the line,
/// before or after the subcommand): one JSON object on stdout with the
/// same text as `message`.
#[test]
fn every_command_prints_json_when_asked() {
    let (dir, file) = sample_copy();
    let file = file.as_str();
    let data = dir.path().join("data");
    let json_of = |args: &[&str]| -> serde_json::Value {
        let out = sluice(args);
        let text = stdout(&out);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
    };
    let generated = json_of(&[
        "gen",
        "taxi",
        "--files",
        "2",
        "--rows",
        "10",
        "--out",
        data.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        generated["files"].as_array().unwrap().len(),
        2,
        "{generated}"
    );
    let registered = json_of(&["--json", "register", file]);
    assert!(
        registered["schema"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "fare_amount" && c["type"] == "double"),
        "{registered}"
    );
    let paused = json_of(&["pause", file, "--json"]);
    assert_eq!(paused["paused"], true, "{paused}");
    assert!(paused["message"].as_str().unwrap().contains("paused"));
    let resumed = json_of(&["resume", file, "--json"]);
    assert_eq!(resumed["paused"], false, "{resumed}");
    let ran = json_of(&["run", file, "--json"]);
    assert_eq!(ran["end"]["state"], "done", "{ran}");
    let idle = json_of(&["run", file, "--json"]);
    assert_eq!(idle["end"]["state"], "idle", "{idle}");
    assert_eq!(idle["end"]["reason"], "no new data", "{idle}");
    // Nothing quarantined: bad input, as an error object on stdout.
    let retried = sluice(&["retry-quarantined", file, "--json"]);
    assert_eq!(retried.status.code(), Some(4));
    let error: serde_json::Value = serde_json::from_slice(&retried.stdout).unwrap();
    assert_eq!(error["error"]["class"], "Sluice.InvalidInput", "{error}");
    assert_eq!(error["error"]["exit_code"], 4, "{error}");
    let reset = json_of(&["reset", file, "--yes", "--json"]);
    assert!(reset["sink_objects"].as_u64().unwrap() > 0, "{reset}");
    // Refused (the command line lacks --yes): the error object, exit code
    // 2 as for any wrong command line; `cost --last 0` likewise.
    let last0 = sluice(&["cost", file, "--last", "0"]);
    assert_eq!(last0.status.code(), Some(2));
    // A duration that does not parse is a wrong command line too (it
    // exited 1, the code of Sluice.Fatal).
    for bad in [["--every", "abc"], ["--since", "1y"]] {
        let out = sluice(&["cost", file, bad[0], bad[1], "--json"]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
        let error: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(error["error"]["exit_code"], 2, "{error}");
    }
    let refused = sluice(&["reset", file, "--json"]);
    assert_eq!(refused.status.code(), Some(2));
    let error: serde_json::Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--yes"),
        "{error}"
    );
    // clap's own refusals carry the error object too, wherever --json is.
    let unknown = sluice(&["--json", "run", file, "--bogus"]);
    assert_eq!(unknown.status.code(), Some(2));
    let error: serde_json::Value = serde_json::from_slice(&unknown.stdout).unwrap();
    assert_eq!(error["error"]["exit_code"], 2, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("--bogus") && !message.contains('\u{1b}'),
        "{error}"
    );
    let missing = sluice(&["show", "--json"]);
    assert_eq!(missing.status.code(), Some(2));
    let error: serde_json::Value = serde_json::from_slice(&missing.stdout).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("<PIPELINE>"),
        "{error}"
    );
    // --help is not an error: no object, exit code 0.
    let help = sluice(&["run", "--help", "--json"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage"));
}
