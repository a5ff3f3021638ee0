//! A Kafka topic as a source, on the test broker tests/run.sh starts
//! (tansu, tests/kafka_stand.py): every record exactly once across runs,
//! batches and tasks, against DuckDB over the records as the test produced
//! them (kept by the test, never read back through Sluice); a crash at
//! every write; data loss under both policies; clear errors.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::crash::spawn_run;
use crate::support::*;

/// The broker's bootstrap address.
fn bootstrap() -> String {
    std::env::var("SLUICE_KAFKA").expect(
        "SLUICE_KAFKA is not set: run the suite with tests/run.sh, which starts a Kafka-compatible \
         broker on 127.0.0.1",
    )
}

/// Run tests/kafka_stand.py with `args`; its standard output.
fn stand(args: &[&str]) -> String {
    stand_with(&[], args)
}

/// `kafka_stand.py` with `env` set (a TLS or SASL broker's settings).
fn stand_with(env: &[(&str, &std::ffi::OsStr)], args: &[&str]) -> String {
    let python = std::env::var("SLUICE_KAFKA_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/kafka_stand.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kafka_stand {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

static TOPIC_SEQ: AtomicU64 = AtomicU64::new(0);

/// A new topic with `partitions` partitions.
pub(crate) fn fresh_topic(what: &str, partitions: u32) -> String {
    let topic = format!(
        "{what}-{}-{}",
        std::process::id(),
        TOPIC_SEQ.fetch_add(1, Ordering::SeqCst)
    );
    create_topic(&topic, partitions);
    topic
}

/// Create `topic` with `partitions` partitions.
fn create_topic(topic: &str, partitions: u32) {
    let b = bootstrap();
    let n = partitions.to_string();
    stand(&[
        "create-topic",
        "--bootstrap",
        &b,
        "--topic",
        topic,
        "--partitions",
        &n,
    ]);
}

/// Produce `values` (JSON texts) to `partition` of `topic`, one request
/// each, and append each record as DuckDB should see it (its value's
/// fields, `_partition`, `_offset`) to `expected` (JSON Lines).
pub(crate) fn produce(topic: &str, partition: i32, values: &[String], expected: &Path) {
    produce_with(topic, partition, values, expected, &[]);
}

/// [`produce`], with more options of `kafka_stand.py produce`.
fn produce_with(topic: &str, partition: i32, values: &[String], expected: &Path, options: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("records.jsonl");
    let lines: Vec<String> = values
        .iter()
        .map(|v| {
            serde_json::json!({"partition": partition, "key": "k", "value": v, "timestamp_ms": 1_764_680_400_000i64})
                .to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let b = bootstrap();
    let mut args = vec![
        "produce",
        "--bootstrap",
        &b,
        "--topic",
        topic,
        "--file",
        file.to_str().unwrap(),
    ];
    args.extend(options);
    let out = stand(&args);
    let mut keep = std::fs::read_to_string(expected).unwrap_or_default();
    for (line, value) in out.lines().zip(values) {
        let at: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut row: serde_json::Value = serde_json::from_str(value).unwrap();
        row["_partition"] = at["partition"].clone();
        row["_offset"] = at["offset"].clone();
        keep.push_str(&row.to_string());
        keep.push('\n');
    }
    std::fs::write(expected, keep).unwrap();
}

/// Produce the records of `file` (`kafka_stand.py produce` lines) to
/// `topic`; their offsets.
fn produce_file(topic: &str, file: &Path) -> Vec<i64> {
    let b = bootstrap();
    let out = stand(&[
        "produce",
        "--bootstrap",
        &b,
        "--topic",
        topic,
        "--file",
        file.to_str().unwrap(),
    ]);
    out.lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["offset"]
                .as_i64()
                .unwrap()
        })
        .collect()
}

/// Every quarantined row under `root`'s sink.
pub(crate) fn quarantined_rows(root: &Path) -> Vec<serde_json::Value> {
    walk_files(&root.join("out/sink/_quarantine"))
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `n` ride records numbered from `first`.
pub(crate) fn rides(first: u64, n: u64) -> Vec<String> {
    (first..first + n)
        .map(|i| {
            serde_json::json!({"ride_id": i, "fare": (i % 17) as f64 * 1.5, "zone": format!("z{}", i % 4)})
                .to_string()
        })
        .collect()
}

const COLS: &str = "ride_id, fare, zone, _partition, _offset";

/// A pipeline reading `topic`.
pub(crate) fn kafka_toml(name: &str, topic: &str, extra_source: &str, limits: &str) -> String {
    format!(
        r#"name = "{name}"
[source]
uri = "kafka://{b}/{topic}"
format = "jsonl"
table = "rides"
{extra_source}
[query]
sql = "SELECT {COLS} FROM rides WHERE fare > 3"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
{limits}
"#,
        b = bootstrap()
    )
}

/// What DuckDB makes of the records produced so far.
pub(crate) async fn expected(records: &Path) -> Vec<String> {
    duckdb_sql(&format!(
        "SELECT {COLS} FROM read_json('{}', format = 'newline_delimited') WHERE fare > 3",
        records.display()
    ))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_is_read_exactly_once_across_runs_batches_and_tasks() {
    let topic = fresh_topic("once", 3);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("produced.jsonl");
    for p in 0..3 {
        produce(
            &topic,
            p,
            &rides(p as u64 * 100, 12 + p as u64 * 3),
            &records,
        );
    }
    let toml = kafka_toml(
        "rides",
        &topic,
        "",
        "max_records_per_batch = 10\nmax_records_per_task = 4",
    );
    let ctx = local_context(&pipeline(root, &toml));
    run(&ctx).await.unwrap();
    let sink = root.join("out/sink");
    assert_eq!(
        committed_rows(&sink, "rides").await,
        expected(&records).await
    );
    let first = commit_records(root, &toml).await;
    assert!(first.len() >= 4, "{} batches", first.len());

    // More records, in two partitions: the next run reads only those.
    produce(&topic, 1, &rides(1000, 7), &records);
    produce(&topic, 2, &rides(2000, 2), &records);
    run(&ctx).await.unwrap();
    assert_eq!(
        committed_rows(&sink, "rides").await,
        expected(&records).await
    );
    // Nothing new: no batch.
    let before = commit_records(root, &toml).await.len();
    run(&ctx).await.unwrap();
    assert_eq!(commit_records(root, &toml).await.len(), before);

    // The commit records name ranges that tile each partition from 0.
    let mut next = std::collections::BTreeMap::new();
    let mut read = 0;
    for c in commit_records(root, &toml).await {
        let s = c.stream.expect("a stream batch's record names its ranges");
        for r in &s.ranges {
            assert_eq!(r.start, *next.get(&r.partition).unwrap_or(&0), "{r:?}");
            next.insert(r.partition, r.end);
            read += r.len();
        }
        assert!(
            s.records() <= 10 + 3,
            "{} records in one batch",
            s.records()
        );
    }
    assert_eq!(read, 12 + 15 + 18 + 7 + 2);
    let control = control_of(root, &toml).await;
    assert_eq!(control.stream_offsets, next);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kafka_run_crashed_at_each_write_recovers() {
    let topic = fresh_topic("crash", 2);
    let setup = tempfile::tempdir().unwrap();
    let records = setup.path().join("produced.jsonl");
    produce(&topic, 0, &rides(0, 9), &records);
    produce(&topic, 1, &rides(100, 6), &records);
    let want = expected(&records).await;
    let toml = kafka_toml(
        "kcrash",
        &topic,
        "",
        "max_records_per_batch = 6\nmax_records_per_task = 3",
    );
    let clean = tempfile::tempdir().unwrap();
    let writes = Arc::new(AtomicU64::new(0));
    run(&fault_context(clean.path(), &toml, writes.clone(), 0))
        .await
        .unwrap();
    assert_eq!(
        committed_rows(&clean.path().join("out/sink"), "kcrash").await,
        want
    );
    let total = writes.load(Ordering::SeqCst);
    assert!(total > 10, "{total} writes");
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let failed = run(&fault_context(root, &toml, Arc::new(AtomicU64::new(0)), k)).await;
        assert!(failed.is_err(), "write {k} was injected to fail");
        run(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        let sink = root.join("out/sink");
        assert_eq!(
            committed_rows(&sink, "kcrash").await,
            want,
            "after write {k}"
        );
        assert_eq!(orphan_files(&sink, "kcrash").await, Vec::<String>::new());
        assert_eq!(staged_files(&sink), Vec::<String>::new());
    }
}

/// A topic deleted and created again holds fewer records than were read:
/// `on_data_loss = "fail"` refuses, naming the partition, and writes no
/// batch; `skip` reads the new topic from its start and goes on.
#[tokio::test(flavor = "multi_thread")]
async fn records_gone_from_the_topic_fail_or_are_passed_over_as_the_policy_says() {
    let topic = fresh_topic("loss", 1);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let old = root.join("old.jsonl");
    produce(&topic, 0, &rides(0, 8), &old);
    let toml = kafka_toml("loss", &topic, "", "");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let b = bootstrap();
    stand(&["delete-topic", "--bootstrap", &b, "--topic", &topic]);
    create_topic(&topic, 1);
    let new = root.join("new.jsonl");
    produce(&topic, 0, &rides(500, 3), &new);
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("partition 0") && e.contains("on_data_loss"),
        "{e}"
    );
    assert_eq!(commit_records(root, &toml).await.len(), 1);
    // The refusal gives the lease back.
    assert_eq!(
        control_of(root, &toml).await.status,
        sluice_engine::checkpoint::RunStatus::Idle
    );
    let skip = kafka_toml("loss", &topic, "on_data_loss = \"skip\"", "");
    run(&local_context(&pipeline(root, &skip))).await.unwrap();
    let mut want = expected(&old).await;
    want.extend(expected(&new).await);
    want.sort();
    assert_eq!(committed_rows(&root.join("out/sink"), "loss").await, want);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_that_does_not_exist_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = kafka_toml("missing", "no-such-topic-here", "", "");
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"no-such-topic-here\" does not exist"), "{e}");
    assert!(!root.join("out/sink").join("batch=0000000000").exists());
    // `sluice check` asks the brokers too: refused the same way, and a
    // topic that is there is checked with its partitions.
    let e = sluice_engine::admin::check(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"no-such-topic-here\" does not exist"), "{e}");
    let there = fresh_topic("checked", 3);
    let toml = kafka_toml("checked", &there, "", "");
    let report = sluice_engine::admin::check(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap();
    assert!(
        report
            .checked
            .iter()
            .any(|c| c.contains("the topic has 3 partitions")),
        "{:?}",
        report.checked
    );
}

/// `starting_offsets = "latest"`: a new pipeline starts at the end of the
/// topic as its first run finds it, and reads every record produced after
/// that, also when the topic was empty then and no schema is declared
/// (the start is recorded although nothing can be inferred yet); records
/// produced before the first run are not read.
#[tokio::test(flavor = "multi_thread")]
async fn latest_starts_at_the_first_runs_end_even_on_an_empty_topic() {
    for (what, before) in [("empty", 0), ("older", 5)] {
        let topic = fresh_topic(&format!("latest-{what}"), 2);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        if before > 0 {
            produce(&topic, 0, &rides(900, before), &root.join("before.jsonl"));
        }
        let toml = kafka_toml("latest", &topic, "starting_offsets = \"latest\"", "");
        // Before the first run, nothing waits for it (`sluice show`).
        let status = sluice_engine::admin::status(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap();
        assert_eq!(status.waiting_records, Some(0), "{what}");
        let first = run(&local_context(&pipeline(root, &toml))).await.unwrap();
        assert!(first.batches.is_empty(), "{what}: {:?}", first.end);
        let records = root.join("produced.jsonl");
        produce(&topic, 1, &rides(0, 5), &records);
        run(&local_context(&pipeline(root, &toml))).await.unwrap();
        produce(&topic, 0, &rides(5, 3), &records);
        run(&local_context(&pipeline(root, &toml))).await.unwrap();
        assert_eq!(
            committed_rows(&root.join("out/sink"), "latest").await,
            expected(&records).await,
            "{what}"
        );
    }
}

/// Values that are not JSON objects are bad rows: under `fail` the batch
/// is refused with advice a topic can take; under
/// `on_bad_row = "quarantine"` they go to the batch's quarantine file,
/// each with its partition and offset, and the rest is read.
#[tokio::test(flavor = "multi_thread")]
async fn bad_records_are_quarantined_with_their_partition_and_offset() {
    let topic = fresh_topic("bad", 1);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("produced.jsonl");
    produce(&topic, 0, &rides(0, 4), &records);
    // Offsets 4 and 5: not objects; then good ones again.
    let bad = root.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"partition\": 0, \"value\": \"not json at all\"}\n{\"partition\": 0, \"value\": \"[1, 2]\"}\n",
    )
    .unwrap();
    let offsets = produce_file(&topic, &bad);
    assert_eq!(offsets, vec![4, 5]);
    produce(&topic, 0, &rides(10, 3), &records);
    // Under `fail` (the default) the batch is refused, saying what a topic
    // allows: records cannot be fixed in place as a file can.
    let strict = kafka_toml("bad", &topic, "", "");
    let e = run(&local_context(&pipeline(root, &strict)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot be changed")
            && e.contains("on_bad_row = \"quarantine\"")
            && !e.contains("replace the file"),
        "{e}"
    );
    assert!(!root.join("out/sink/_sluice/manifest").exists());
    let toml = kafka_toml("bad", &topic, "on_bad_row = \"quarantine\"", "");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "bad").await,
        expected(&records).await
    );
    let quarantined = quarantined_rows(root);
    assert_eq!(quarantined.len(), 2, "{quarantined:?}");
    for (q, offset) in quarantined.iter().zip([4, 5]) {
        let raw = q["raw"].as_str().unwrap();
        assert!(
            raw.contains(&format!("\"_offset\":{offset}")) && raw.contains("\"_partition\":0"),
            "{q}"
        );
    }
}

/// A windowed GROUP BY over the records' `_timestamp` equals DuckDB's over
/// the records as produced.
#[tokio::test(flavor = "multi_thread")]
async fn a_window_over_the_record_timestamp_equals_duckdb() {
    let topic = fresh_topic("win", 2);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let produced = root.join("produced.jsonl");
    let mut lines = String::new();
    let mut keep = String::new();
    for i in 0..24i64 {
        let partition = i % 2;
        let ts = 1_764_680_400_000 + i * 7 * 60_000; // every 7 minutes
        let value = serde_json::json!({"zone": format!("z{}", i % 3), "fare": i as f64});
        lines.push_str(
            &serde_json::json!({"partition": partition, "value": value.to_string(), "timestamp_ms": ts})
                .to_string(),
        );
        lines.push('\n');
        keep.push_str(
            &serde_json::json!({"zone": value["zone"], "fare": value["fare"], "ts_ms": ts})
                .to_string(),
        );
        keep.push('\n');
    }
    let file = root.join("records.jsonl");
    std::fs::write(&file, lines).unwrap();
    std::fs::write(&produced, keep).unwrap();
    let b = bootstrap();
    produce_file(&topic, &file);
    let toml = format!(
        r#"name = "win"
[source]
uri = "kafka://{b}/{topic}"
format = "jsonl"
table = "rides"
[query]
sql = "SELECT window.start AS window_start, zone, count(*) AS n, sum(fare) AS fares FROM rides GROUP BY window(_timestamp, '30 minutes'), zone"
[sink]
uri = "out/sink"
mode = "complete"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_records_per_batch = 9
"#
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let last = manifest_files(&root.join("out/sink"), "win").await;
    let (_, complete, files) = last.last().expect("a manifest").clone();
    assert!(complete);
    let got = duckdb_rows(&files, "SELECT window_start, zone, n, fares FROM trips").await;
    let want = duckdb_sql(&format!(
        "SELECT time_bucket(INTERVAL 30 MINUTE, make_timestamp(ts_ms * 1000)) AS window_start, \
         zone, count(*) AS n, sum(fare) AS fares FROM read_json('{}', format = \
         'newline_delimited') GROUP BY ALL",
        produced.display()
    ))
    .await;
    assert_eq!(got, want);
}

/// Every file under `dir`.
fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Brokers that do not answer: the run fails, naming the address and
/// what to check, and writes nothing to the sink.
#[tokio::test(flavor = "multi_thread")]
async fn unreachable_brokers_are_named_and_nothing_is_written() {
    let port = {
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml =
        kafka_toml("down", "rides", "", "").replace(&bootstrap(), &format!("127.0.0.1:{port}"));
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{port}")) && text.contains("reachable"),
        "{text}"
    );
    assert_eq!(e.class(), sluice_engine::ErrorClass::Retryable, "{text}");
    assert!(!root.join("out/sink").exists() || walk_files(&root.join("out/sink")).is_empty());
}

/// The checkpoint's offsets are one topic's: pointing the pipeline at
/// another topic is refused, naming both, until a reset.
#[tokio::test(flavor = "multi_thread")]
async fn another_topic_is_refused_while_the_offsets_are_the_first_ones() {
    let first = fresh_topic("swa", 1);
    let second = fresh_topic("swb", 1);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let kept = root.join("kept.jsonl");
    produce(&first, 0, &rides(0, 5), &kept);
    produce(&second, 0, &rides(100, 9), &root.join("other.jsonl"));
    run(&local_context(&pipeline(
        root,
        &kafka_toml("sw", &first, "", ""),
    )))
    .await
    .unwrap();
    let e = run(&local_context(&pipeline(
        root,
        &kafka_toml("sw", &second, "", ""),
    )))
    .await
    .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(&first) && text.contains(&second) && text.contains("sluice reset"),
        "{text}"
    );
    assert_eq!(
        committed_rows(&root.join("out/sink"), "sw").await,
        expected(&kept).await
    );
}

/// Waves of three `sluice run` processes started at once on one topic
/// while records arrive, one of each wave killed at a varying moment:
/// after a last run, every record produced is committed exactly once,
/// nothing is left staged or unnamed, and control's offsets are the ends
/// of the partitions as produced.
#[tokio::test(flavor = "multi_thread")]
async fn killed_and_racing_runs_of_a_topic_commit_every_record_once() {
    let topic = fresh_topic("storm", 3);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("produced.jsonl");
    let toml = kafka_toml(
        "kstorm",
        &topic,
        "",
        "max_records_per_batch = 5\nmax_records_per_task = 2",
    );
    std::fs::write(root.join("pipeline.toml"), &toml).unwrap();
    let mut killed = 0;
    let mut busy = 0;
    for wave in 0..6u64 {
        produce(
            &topic,
            (wave % 3) as i32,
            &rides(wave * 100, 10 + wave),
            &records,
        );
        let mut children: Vec<_> = (0..3).map(|_| spawn_run(root)).collect();
        let delay_ms = [20u64, 45, 80, 120, 180, 260][wave as usize];
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        // The first of them still running is killed.
        if let Some(i) = children
            .iter_mut()
            .position(|c| c.try_wait().unwrap().is_none())
        {
            let mut victim = children.remove(i);
            victim.kill().unwrap();
            victim.wait().unwrap();
            killed += 1;
        }
        for c in children {
            let out = c.wait_with_output().unwrap();
            // A run may find the lease held by the killed one until it
            // expires (test mode: short), or by its sibling.
            busy += String::from_utf8_lossy(&out.stdout)
                .matches("holds the lease")
                .count();
            assert!(
                out.status.success(),
                "wave {wave}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(killed >= 3, "only {killed} kills landed mid-run");
    eprintln!("kafka storm: {killed} runs killed, {busy} found the lease held");
    let last = spawn_run(root).wait_with_output().unwrap();
    assert!(
        last.status.success(),
        "{}",
        String::from_utf8_lossy(&last.stderr)
    );
    let sink = root.join("out/sink");
    assert_eq!(
        committed_rows(&sink, "kstorm").await,
        expected(&records).await
    );
    assert_eq!(orphan_files(&sink, "kstorm").await, Vec::<String>::new());
    assert_eq!(staged_files(&sink), Vec::<String>::new());
    let mut ends = std::collections::BTreeMap::new();
    for wave in 0..6i64 {
        *ends.entry((wave % 3) as i32).or_insert(0) += 10 + wave;
    }
    assert_eq!(control_of(root, &toml).await.stream_offsets, ends);
}

/// Records produced in `drops` (partition, count), a run after every
/// `every` drops and one at the end, batches of at most `per_batch`
/// records in tasks of `per_task`: the committed output equals DuckDB over
/// the records as produced, and control's offsets are each partition's end.
fn random_drops(drops: Vec<(i32, u64)>, every: usize, per_batch: u64, per_task: u64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let topic = fresh_topic("eq", 3);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let records = root.join("produced.jsonl");
        let toml = kafka_toml(
            "keq",
            &topic,
            "",
            &format!("max_records_per_batch = {per_batch}\nmax_records_per_task = {per_task}"),
        );
        let ctx = local_context(&pipeline(root, &toml));
        // Control names every partition, those never written to at 0.
        let mut ends: std::collections::BTreeMap<i32, i64> = (0..3).map(|p| (p, 0)).collect();
        for (i, (partition, n)) in drops.iter().enumerate() {
            produce(&topic, *partition, &rides(i as u64 * 100, *n), &records);
            *ends.entry(*partition).or_insert(0) += *n as i64;
            if (i + 1) % every == 0 {
                run(&ctx).await.unwrap();
            }
        }
        run(&ctx).await.unwrap();
        assert_eq!(
            committed_rows(&root.join("out/sink"), "keq").await,
            expected(&records).await,
            "drops {drops:?}, a run every {every}, {per_batch} per batch, {per_task} per task"
        );
        let control = control_of(root, &toml).await;
        assert_eq!(control.stream_offsets, ends);
        for c in commit_records(root, &toml).await {
            let s = c.stream.expect("a stream batch");
            // Spark's rate limit rounds each share down, but a share
            // below one record up: at most one more per partition.
            assert!(s.records() <= per_batch + 3, "{} records", s.records());
        }
    });
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 5, ..Default::default() })]

    #[test]
    fn splitting_a_topic_into_runs_batches_and_tasks_never_changes_the_result(
        drops in proptest::collection::vec((0i32..3, 1u64..6), 1..6),
        every in 1usize..4,
        per_batch in 1u64..12,
        per_task in 1u64..5,
    ) {
        random_drops(drops, every, per_batch, per_task);
    }
}

/// A transactional producer's records, committed, with plain records
/// between: each transaction's commit marker takes an offset that holds no
/// record. The run reads every committed record once and steps over the
/// markers (rskafka 0.6 failed to decode them: every fetch that met one
/// failed). Aborted transactions: see `discovery::kafka`'s unit test (the
/// test broker never lists them in a fetch).
#[tokio::test(flavor = "multi_thread")]
async fn committed_transactions_are_read_and_their_markers_stepped_over() {
    let topic = fresh_topic("txn", 2);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("produced.jsonl");
    produce_with(&topic, 0, &rides(0, 3), &records, &["--transactional"]);
    produce(&topic, 0, &rides(10, 2), &records);
    produce_with(&topic, 0, &rides(20, 4), &records, &["--transactional"]);
    produce_with(&topic, 1, &rides(30, 1), &records, &["--transactional"]);
    let toml = kafka_toml(
        "ktxn",
        &topic,
        "",
        "max_records_per_batch = 3\nmax_records_per_task = 2",
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "ktxn").await,
        expected(&records).await
    );
    // Control's offsets are past the last marker of each partition: 3
    // records, a marker, 2, 4 and a marker in 0; 1 and a marker in 1.
    let control = control_of(root, &toml).await;
    assert_eq!(
        control.stream_offsets,
        [(0, 11), (1, 2)].into_iter().collect()
    );
    // More, and a run again: nothing read twice.
    produce_with(&topic, 1, &rides(40, 2), &records, &["--transactional"]);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "ktxn").await,
        expected(&records).await
    );
}

/// Records whose timestamps lie past year 9999 or before year 0 (a
/// producer writing microseconds as milliseconds) are rows like any other,
/// `_timestamp` as DuckDB computes it from the milliseconds; a value with
/// a lone UTF-16 surrogate escape (`"\ud800"`: valid syntax, no
/// character) is a bad row, quarantined with its offset, even in the first
/// batch, whose schema is inferred (it stopped the pipeline, whatever the
/// policy).
#[tokio::test(flavor = "multi_thread")]
async fn far_timestamps_are_read_and_lone_surrogates_are_bad_rows() {
    let topic = fresh_topic("edge", 1);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let stamps: [i64; 5] = [
        1_764_680_400_123,
        253_402_300_800_000,   // 10000-01-01
        1_764_680_400_123_456, // microseconds written as milliseconds
        -62_167_219_200_001,   // -0001-12-31T23:59:59.999
        -1,
    ];
    let mut lines = String::new();
    for (i, ts) in stamps.iter().enumerate() {
        let value = serde_json::json!({"n": i}).to_string();
        lines.push_str(
            &serde_json::json!({"partition": 0, "value": value, "timestamp_ms": ts}).to_string(),
        );
        lines.push('\n');
    }
    for value in [
        r#"{"s":"\ud800"}"#,
        r#"{"s":"\udc00 x"}"#,
        r#"{"s":"\ud83d\ude00"}"#,
    ] {
        lines.push_str(&serde_json::json!({"partition": 0, "value": value}).to_string());
        lines.push('\n');
    }
    let file = root.join("records.jsonl");
    std::fs::write(&file, lines).unwrap();
    let b = bootstrap();
    produce_file(&topic, &file);
    let toml = format!(
        r#"name = "edge"
[source]
uri = "kafka://{b}/{topic}"
format = "jsonl"
table = "t"
on_bad_row = "quarantine"
[query]
sql = "SELECT n, s, _offset, CAST(_timestamp AS BIGINT) AS us FROM t"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
"#
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    // DuckDB: the microseconds of each record's milliseconds, and the
    // paired surrogates' character.
    let want = duckdb_sql(&format!(
        "SELECT * FROM (VALUES {}, (NULL, '\u{1F600}', 7, NULL)) v(n, s, _offset, us)",
        stamps
            .iter()
            .enumerate()
            .map(|(i, ts)| format!("({i}, NULL, {i}, epoch_us(epoch_ms({ts}::BIGINT)))"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .await;
    let mut got = committed_rows(&root.join("out/sink"), "edge").await;
    got.sort();
    let mut want_sorted = want;
    want_sorted.sort();
    // The paired record's timestamp is the broker's clock: compared apart.
    let clock = |rows: &mut Vec<String>| rows.retain(|r| !r.contains('\u{1F600}'));
    let (mut got_rest, mut want_rest) = (got.clone(), want_sorted.clone());
    clock(&mut got_rest);
    clock(&mut want_rest);
    assert_eq!(got_rest, want_rest);
    assert!(
        got.iter()
            .any(|r| r.contains('\u{1F600}') && r.contains("7")),
        "{got:?}"
    );
    let quarantined = quarantined_rows(root);
    assert_eq!(quarantined.len(), 2, "{quarantined:?}");
    for (q, offset) in quarantined.iter().zip([5, 6]) {
        let raw = q["raw"].as_str().unwrap();
        assert!(raw.contains(&format!("\"_offset\":{offset}")), "{q}");
    }
}

/// A field that first appears in the last record of a long range is
/// drift, as a new column of a file is (the drift check infers a range's
/// columns from one line of each shape, not from every line): `fail`
/// refuses the batch naming the column, `rescue` keeps the record with the
/// field in `_rescued`.
#[tokio::test(flavor = "multi_thread")]
async fn a_field_new_in_the_last_record_of_a_range_is_drift() {
    let topic = fresh_topic("drift", 1);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("produced.jsonl");
    let plain = |from: u64, n: u64| -> Vec<String> {
        (from..from + n)
            .map(|i| serde_json::json!({"id": i, "v": i * 2}).to_string())
            .collect()
    };
    produce(&topic, 0, &plain(0, 5), &records);
    let toml = |name: &str, policy: &str| {
        format!(
            r#"name = "{name}"
[source]
uri = "kafka://{b}/{topic}"
format = "jsonl"
table = "t"
on_schema_change = "{policy}"
[query]
sql = "SELECT * FROM t"
[sink]
uri = "out/{name}"
[checkpoint]
uri = "out/checkpoint"
"#,
            b = bootstrap()
        )
    };
    let fail = toml("dfail", "fail");
    let rescue = toml("drescue", "rescue");
    run(&local_context(&pipeline(root, &fail))).await.unwrap();
    run(&local_context(&pipeline(root, &rescue))).await.unwrap();
    let mut late = plain(5, 120);
    late.push(serde_json::json!({"id": 125, "v": 250, "extra": "x"}).to_string());
    produce(&topic, 0, &late, &records);
    let e = run(&local_context(&pipeline(root, &fail)))
        .await
        .unwrap_err()
        .to_string();
    // It offers what a topic takes: rescue, not add-columns, and no file
    // to replace.
    assert!(
        e.contains("extra") && e.contains("rescue") && !e.contains("add-columns"),
        "{e}"
    );
    assert!(!e.contains("replace the file"), "{e}");
    assert_eq!(commit_records(root, &fail).await.len(), 1);
    run(&local_context(&pipeline(root, &rescue))).await.unwrap();
    let rows = duckdb_sql(&format!(
        "SELECT id, v, _rescued FROM read_parquet('{}/out/drescue/batch=*/*.parquet') ORDER BY id",
        root.display()
    ))
    .await;
    assert_eq!(rows.len(), 126, "{rows:?}");
    let rescued: Vec<&String> = rows.iter().filter(|r| !r.ends_with("|NULL")).collect();
    assert_eq!(rescued.len(), 1, "{rescued:?}");
    assert!(
        rescued[0].starts_with("125|250|") && rescued[0].contains("extra"),
        "{rescued:?}"
    );
}

/// The TLS test broker (tests/run.sh starts it: tansu behind a TLS proxy,
/// its certificate signed by tests/fixtures/kafka-tls/ca.pem).
fn tls_bootstrap() -> String {
    std::env::var("SLUICE_KAFKA_TLS").expect(
        "SLUICE_KAFKA_TLS is not set: run the suite with tests/run.sh, which starts the TLS \
         test broker",
    )
}

fn tls_ca() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/kafka-tls/ca.pem")
}

/// `kafka_stand.py` against the TLS broker.
fn tls_stand(args: &[&str]) -> String {
    stand_with(&[("KAFKA_STAND_CA_FILE", tls_ca().as_os_str())], args)
}

/// A topic on a broker that takes TLS only: read exactly once with
/// `security_protocol = "ssl"` and the broker's CA in
/// `SLUICE_KAFKA_CA_FILE`; without the CA, refused naming that variable
/// (not retried as a network fault); with the plaintext default, an error
/// that names `security_protocol`. Nothing is written by a refused run.
#[tokio::test(flavor = "multi_thread")]
async fn a_tls_broker_is_read_when_its_certificate_is_trusted() {
    let b = tls_bootstrap();
    let topic = format!("tls-{}", std::process::id());
    tls_stand(&[
        "create-topic",
        "--bootstrap",
        &b,
        "--topic",
        &topic,
        "--partitions",
        "2",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut lines = String::new();
    for i in 0..7 {
        let value = serde_json::json!({"ride_id": i, "fare": 4.5}).to_string();
        lines.push_str(&serde_json::json!({"partition": i % 2, "value": value}).to_string());
        lines.push('\n');
    }
    let file = root.join("records.jsonl");
    std::fs::write(&file, &lines).unwrap();
    tls_stand(&[
        "produce",
        "--bootstrap",
        &b,
        "--topic",
        &topic,
        "--file",
        file.to_str().unwrap(),
    ]);
    let write = |security: &str| {
        std::fs::write(
            root.join("pipeline.toml"),
            format!(
                r#"name = "tls"
[source]
uri = "kafka://{b}/{topic}"
format = "jsonl"
table = "t"
{security}
[query]
sql = "SELECT ride_id, _partition FROM t"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
"#
            ),
        )
        .unwrap()
    };
    let sluice = |ca: Option<&Path>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        c.arg("run").arg(root.join("pipeline.toml"));
        // A refused connection is retried until this passes.
        c.env("SLUICE_KAFKA_TIMEOUT_S", "1");
        c.env_remove("SLUICE_KAFKA_CA_FILE");
        if let Some(ca) = ca {
            c.env("SLUICE_KAFKA_CA_FILE", ca);
        }
        c.output().unwrap()
    };
    // The plaintext default against a TLS listener.
    write("");
    let out = sluice(Some(&tls_ca()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("security_protocol"),
        "{err}"
    );
    // TLS, the CA not given: the platform's roots do not hold it.
    write("security_protocol = \"ssl\"");
    let out = sluice(None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("SLUICE_KAFKA_CA_FILE") && !err.contains("retried"),
        "{err}"
    );
    assert!(!root.join("out/sink/_sluice/manifest").exists());
    // TLS with the CA.
    let out = sluice(Some(&tls_ca()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want =
        duckdb_sql("SELECT ride_id, ride_id % 2 AS _partition FROM range(7) r(ride_id)").await;
    assert_eq!(committed_rows(&root.join("out/sink"), "tls").await, want);
}

/// The SASL/PLAIN credentials of the broker that tests/run.sh starts.
const SASL_USER: &str = "sluice";
const SASL_PASSWORD: &str = "stand-secret";

/// A secret in moto's Secrets Manager holding `text`: its ARN.
fn secret(name: &str, text: &str) -> String {
    let out = std::process::Command::new(python())
        .args([
            "-c",
            "import boto3, sys; c = boto3.client('secretsmanager', endpoint_url=sys.argv[1], \
             region_name='us-east-1', aws_access_key_id='test', aws_secret_access_key='test'); \
             print(c.create_secret(Name=sys.argv[2], SecretString=sys.argv[3])['ARN'])",
            &s3_endpoint(),
            name,
            text,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A topic on a broker that takes SASL/PLAIN only, read with the
/// credentials of a Secrets Manager secret (the functions' way on AWS):
/// the secret wins over the environment's credentials; a wrong password,
/// a secret without a password, a secret that is not there and the
/// environment's wrong credentials are each refused naming what to fix,
/// not retried, with nothing written; the right secret reads every record
/// exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn sasl_credentials_from_a_secret_are_what_the_broker_checks() {
    let b = std::env::var("SLUICE_KAFKA_SASL").expect(
        "SLUICE_KAFKA_SASL is not set: run the suite with tests/run.sh, which starts the SASL \
         test broker",
    );
    let plain = format!("{SASL_USER}:{SASL_PASSWORD}");
    let sasl = |args: &[&str]| stand_with(&[("KAFKA_STAND_SASL_PLAIN", plain.as_ref())], args);
    let topic = format!("sasl-{}", std::process::id());
    sasl(&[
        "create-topic",
        "--bootstrap",
        &b,
        "--topic",
        &topic,
        "--partitions",
        "2",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let lines: String = (0..9)
        .map(|i| {
            let value = serde_json::json!({"ride_id": i, "fare": 2.5 * f64::from(i)}).to_string();
            format!(
                "{}\n",
                serde_json::json!({"partition": i % 2, "value": value})
            )
        })
        .collect();
    let file = root.join("records.jsonl");
    std::fs::write(&file, &lines).unwrap();
    sasl(&[
        "produce",
        "--bootstrap",
        &b,
        "--topic",
        &topic,
        "--file",
        file.to_str().unwrap(),
    ]);
    std::fs::write(
        root.join("pipeline.toml"),
        format!(
            r#"name = "sasl"
[source]
uri = "kafka://{b}/{topic}"
format = "jsonl"
table = "t"
security_protocol = "sasl_plaintext"
sasl_mechanism = "PLAIN"
[query]
sql = "SELECT ride_id, fare FROM t WHERE fare > 3"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
"#
        ),
    )
    .unwrap();
    let pid = std::process::id();
    let good = secret(
        &format!("kafka-good-{pid}"),
        &serde_json::json!({"username": SASL_USER, "password": SASL_PASSWORD}).to_string(),
    );
    let wrong = secret(
        &format!("kafka-wrong-{pid}"),
        &serde_json::json!({"username": SASL_USER, "password": "not-it"}).to_string(),
    );
    let partial = secret(
        &format!("kafka-partial-{pid}"),
        &serde_json::json!({"username": SASL_USER}).to_string(),
    );
    let absent = good.replace(&format!("kafka-good-{pid}"), &format!("kafka-absent-{pid}"));
    let sluice = |secret: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        c.arg("run").arg(root.join("pipeline.toml"));
        c.env("SLUICE_KAFKA_TIMEOUT_S", "2");
        c.env("AWS_ENDPOINT_URL", s3_endpoint());
        // Wrong credentials in the environment: the secret, when named,
        // must win.
        c.env("SLUICE_KAFKA_SASL_USERNAME", SASL_USER);
        c.env("SLUICE_KAFKA_SASL_PASSWORD", "from-the-environment");
        match secret {
            Some(arn) => c.env("SLUICE_KAFKA_SASL_SECRET_ARN", arn),
            None => c.env_remove("SLUICE_KAFKA_SASL_SECRET_ARN"),
        };
        c.output().unwrap()
    };
    for (secret, says) in [
        (None, "SLUICE_KAFKA_SASL_PASSWORD"),
        (Some(wrong.as_str()), "credentials"),
        (Some(partial.as_str()), "no \"password\""),
        (Some(absent.as_str()), &format!("kafka-absent-{pid}")),
    ] {
        let out = sluice(secret);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says) && !err.contains("retried"),
            "{secret:?}: {err}"
        );
        assert!(
            !root.join("out/sink/_sluice/manifest").exists(),
            "{secret:?}"
        );
    }
    let out = sluice(Some(&good));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = duckdb_sql(
        "SELECT ride_id, fare FROM (SELECT r AS ride_id, 2.5 * r AS fare FROM range(9) t(r)) \
         WHERE fare > 3",
    )
    .await;
    assert_eq!(committed_rows(&root.join("out/sink"), "sasl").await, want);
}

/// SASL settings are checked before anything is asked of the brokers: a
/// mechanism without credentials in the environment is refused naming
/// the variables.
#[tokio::test(flavor = "multi_thread")]
async fn sasl_without_credentials_is_refused_naming_the_variables() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = kafka_toml(
        "sasl",
        "any-topic",
        "security_protocol = \"sasl_plaintext\"\nsasl_mechanism = \"SCRAM-SHA-512\"",
        "",
    );
    std::fs::write(root.join("pipeline.toml"), &toml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("run")
        .arg(root.join("pipeline.toml"))
        .env_remove("SLUICE_KAFKA_SASL_USERNAME")
        .env_remove("SLUICE_KAFKA_SASL_PASSWORD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("SLUICE_KAFKA_SASL_USERNAME")
            && err.contains("SLUICE_KAFKA_SASL_PASSWORD"),
        "{err}"
    );
    assert!(!root.join("out/sink/_sluice/manifest").exists());
    // A mechanism without a SASL protocol, and the reverse, are refused
    // when the file is read.
    for (extra, says) in [
        ("sasl_mechanism = \"PLAIN\"", "sasl_mechanism applies under"),
        ("security_protocol = \"sasl_ssl\"", "needs one"),
    ] {
        let toml = kafka_toml("sasl2", "any-topic", extra, "");
        std::fs::write(root.join("p2.toml"), &toml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("check")
            .arg(root.join("p2.toml"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{extra}: {err}"
        );
    }
}

/// `format = "raw"`: Spark's Kafka columns, every record as it is (bytes
/// that are not UTF-8 or not JSON, empty values, tombstones, keys), equal
/// to DuckDB over the bytes as produced; no bad rows. Options that read
/// values as JSON are refused with it.
#[tokio::test(flavor = "multi_thread")]
async fn raw_records_are_read_as_spark_reads_them() {
    use base64::Engine;
    let topic = fresh_topic("raw", 2);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    // (key, value) as produced.
    type Record<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);
    let values: [Record; 6] = [
        (Some(b"k1"), Some(b"{\"a\":1}")),
        (None, Some(&[0, 255, 10, 34, 92])),
        (Some(&[0xC3, 0x28]), Some(b"")),
        (Some(b"gone"), None),
        (None, Some("caf\u{e9} \u{1F600}".as_bytes())),
        (Some(b""), Some(b"not json, \"quoted\"")),
    ];
    let mut lines = String::new();
    let mut rows = Vec::new();
    for (i, (key, value)) in values.iter().enumerate() {
        let mut rec = serde_json::json!({"partition": i % 2, "timestamp_ms": 1_764_680_400_000i64 + i as i64});
        match value {
            Some(v) => rec["value_b64"] = b64(v).into(),
            None => rec["value"] = serde_json::Value::Null,
        }
        if let Some(k) = key {
            rec["key_b64"] = b64(k).into();
        }
        lines.push_str(&rec.to_string());
        lines.push('\n');
        let hex = |b: &Option<&[u8]>| match b {
            Some(b) => format!(
                "from_hex('{}')",
                b.iter().map(|x| format!("{x:02X}")).collect::<String>()
            ),
            None => "NULL::BLOB".to_string(),
        };
        rows.push((hex(key), hex(value), i % 2, i));
    }
    let file = root.join("records.jsonl");
    std::fs::write(&file, lines).unwrap();
    let b = bootstrap();
    let offsets = produce_file(&topic, &file);
    let toml = format!(
        r#"name = "raw"
[source]
uri = "kafka://{b}/{topic}"
format = "raw"
table = "t"
[query]
sql = 'SELECT key, value, topic, partition, "offset", timestamp FROM t'
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_records_per_batch = 4
max_records_per_task = 2
"#
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let want = duckdb_sql(&format!(
        "SELECT * FROM (VALUES {}) v(key, value, topic, partition, \"offset\", timestamp)",
        rows.iter()
            .zip(&offsets)
            .map(|((k, v, p, i), o)| format!(
                "({k}, {v}, '{topic}', {p}::INTEGER, {o}::BIGINT, epoch_ms({}::BIGINT))",
                1_764_680_400_000i64 + *i as i64
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .await;
    assert_eq!(committed_rows(&root.join("out/sink"), "raw").await, want);
    assert!(!root.join("out/sink/_quarantine").exists());
    for extra in [
        "on_bad_row = \"quarantine\"",
        "schema_hints = { key = \"string\" }",
    ] {
        let bad = toml.replace("format = \"raw\"", &format!("format = \"raw\"\n{extra}"));
        let e = sluice_engine::pipeline::Pipeline::parse(&bad, "p.toml", root)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("does not apply to format = \"raw\""),
            "{extra}: {e}"
        );
    }
}

/// A topic's metric lines: the planner's says how many records wait (the
/// offsets up to the ends the run captured), each batch's how many it read
/// and lost; an idle run's says none wait. Checked by `tests/e2e/emf.py`
/// against the EMF specification, and against the records produced.
#[tokio::test(flavor = "multi_thread")]
async fn a_topics_metric_lines_count_its_records() {
    let topic = fresh_topic("emf", 2);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("produced.jsonl");
    produce(&topic, 0, &rides(0, 5), &records);
    produce(&topic, 1, &rides(100, 4), &records);
    let toml = kafka_toml("kemf", &topic, "", "max_records_per_batch = 4");
    let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut ctx = local_context(&pipeline(root, &toml));
    let sink = lines.clone();
    ctx.metrics = Some(Arc::new(move |l: &str| {
        sink.lock().unwrap().push(l.to_string())
    }));
    let ran = run(&ctx).await.unwrap();
    assert!(ran.batches.len() >= 2);
    run(&ctx).await.unwrap();
    let lines = lines.lock().unwrap().clone();
    check_emf(root, &lines);
    let docs: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let waiting: Vec<f64> = docs
        .iter()
        .filter_map(|d| d["RecordsWaiting"].as_f64())
        .collect();
    assert_eq!(waiting.first(), Some(&9.0), "{lines:?}");
    assert_eq!(waiting.last(), Some(&0.0), "{lines:?}");
    let read: f64 = docs.iter().filter_map(|d| d["RecordsRead"].as_f64()).sum();
    assert_eq!(read, 9.0);
    let lost: f64 = docs.iter().filter_map(|d| d["RecordsLost"].as_f64()).sum();
    assert_eq!(lost, 0.0);
    assert!(docs.iter().all(|d| d.get("FilesWaiting").is_none()));
}

/// `[deduplicate]` over a topic: arrival order is offset order within a
/// partition, so over one partition read in several batches and tasks the
/// rows kept are each key's first record by offset (DuckDB's
/// `row_number()` over the records as produced), and the query's filter
/// applies after the deduplication.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_is_deduplicated_by_offset_order() {
    let topic = fresh_topic("dedup", 1);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("produced.jsonl");
    produce(&topic, 0, &rides(0, 14), &records);
    let toml = kafka_toml(
        "ddk",
        &topic,
        "",
        "max_records_per_batch = 5\nmax_records_per_task = 2\nstate_partitions = 2",
    )
    .replace(
        "[sink]",
        "[deduplicate]\nkey = [\"zone\"]\nkeep = \"forever\"\n[sink]",
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    produce(&topic, 0, &rides(100, 9), &records);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let want = duckdb_sql(&format!(
        "SELECT {COLS} FROM (SELECT *, row_number() OVER (PARTITION BY zone ORDER BY _offset) \
         AS rn FROM read_json('{}', format = 'newline_delimited')) WHERE rn = 1 AND fare > 3",
        records.display()
    ))
    .await;
    let got = committed_rows(&root.join("out/sink"), "ddk").await;
    assert_eq!(got, want);
    assert!(
        commit_records(root, &toml).await.len() >= 4,
        "several batches"
    );
    assert_eq!(control_of(root, &toml).await.totals.duplicates, 14 + 9 - 4);
}
