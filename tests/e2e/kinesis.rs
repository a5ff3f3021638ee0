//! A Kinesis data stream as a source, on the test stand tests/run.sh
//! starts (moto patched to behave as Kinesis documents:
//! tests/kinesis_stand.py): every record exactly once across runs,
//! batches, tasks and reshards, against DuckDB over the records as the
//! test put them (kept by the test with the sequence numbers PutRecord
//! answered, never read back through Sluice); a crash at every write; kill
//! storms; clear errors.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_engine::handlers::Context;

use crate::crash::spawn_run;
use crate::support::*;

/// A client of the stand (`AWS_ENDPOINT_URL`, set by tests/run.sh).
async fn client() -> aws_sdk_kinesis::Client {
    assert!(
        std::env::var("AWS_ENDPOINT_URL").is_ok(),
        "AWS_ENDPOINT_URL is not set: run the suite with tests/run.sh, which starts the AWS \
         stand on 127.0.0.1"
    );
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    aws_sdk_kinesis::Client::new(&sdk)
}

static STREAM_SEQ: AtomicU64 = AtomicU64::new(0);

/// A new stream of `shards` shards.
pub(crate) async fn fresh_stream(what: &str, shards: i32) -> String {
    let name = format!(
        "{what}-{}-{}",
        std::process::id(),
        STREAM_SEQ.fetch_add(1, Ordering::SeqCst)
    );
    client()
        .await
        .create_stream()
        .stream_name(&name)
        .shard_count(shards)
        .send()
        .await
        .unwrap();
    name
}

/// Put `values` (JSON texts) to `stream`, the i-th under partition key
/// `keys[i % keys.len()]`, one request each, and append each record as
/// DuckDB should see it (its data's fields, `_shard_id`,
/// `_sequence_number`, `_partition_key`) to `expected` (JSON Lines).
pub(crate) async fn put(stream: &str, keys: &[&str], values: &[String], expected: &Path) {
    let c = client().await;
    let mut keep = std::fs::read_to_string(expected).unwrap_or_default();
    for (i, v) in values.iter().enumerate() {
        let key = keys[i % keys.len()];
        let out = c
            .put_record()
            .stream_name(stream)
            .partition_key(key)
            .data(aws_sdk_kinesis::primitives::Blob::new(v.as_bytes()))
            .send()
            .await
            .unwrap();
        let mut row: serde_json::Value = serde_json::from_str(v).unwrap();
        row["_shard_id"] = out.shard_id().into();
        row["_sequence_number"] = out.sequence_number().into();
        row["_partition_key"] = key.into();
        keep.push_str(&row.to_string());
        keep.push('\n');
    }
    std::fs::write(expected, keep).unwrap();
}

/// `n` ride records numbered from `first`.
fn rides(first: u64, n: u64) -> Vec<String> {
    crate::kafka::rides(first, n)
}

const COLS: &str = "ride_id, fare, zone, _shard_id, _sequence_number, _partition_key";

/// Partition keys that spread over the shards.
const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];

/// A pipeline reading `stream`.
pub(crate) fn kinesis_toml(name: &str, stream: &str, extra_source: &str, limits: &str) -> String {
    format!(
        r#"name = "{name}"
[source]
uri = "kinesis://{stream}"
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
"#
    )
}

/// What DuckDB makes of the records put so far.
pub(crate) async fn expected(records: &Path) -> Vec<String> {
    duckdb_sql(&format!(
        "SELECT {COLS} FROM read_json('{}', format = 'newline_delimited', \
         columns = {{ride_id: 'BIGINT', fare: 'DOUBLE', zone: 'VARCHAR', _shard_id: 'VARCHAR', \
         _sequence_number: 'VARCHAR', _partition_key: 'VARCHAR'}}) WHERE fare > 3",
        records.display()
    ))
    .await
}

/// The last sequence number put to each shard, from the kept records.
pub(crate) fn last_put(records: &Path) -> std::collections::BTreeMap<String, String> {
    let mut last = std::collections::BTreeMap::new();
    for line in std::fs::read_to_string(records).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let shard = v["_shard_id"].as_str().unwrap().to_string();
        let seq = v["_sequence_number"].as_str().unwrap().to_string();
        let e = last.entry(shard).or_insert_with(String::new);
        if (seq.len(), &seq) > (e.len(), &*e) {
            *e = seq;
        }
    }
    last
}

/// Each shard's committed cursor.
async fn cursors(root: &Path, toml: &str) -> std::collections::BTreeMap<String, String> {
    control_of(root, toml)
        .await
        .stream_shards
        .into_iter()
        .filter_map(|(id, c)| c.after.map(|a| (id, a)))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_is_read_exactly_once_across_runs_batches_and_tasks() {
    let stream = fresh_stream("once", 3).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 40), &records).await;
    let toml = kinesis_toml(
        "rides",
        &stream,
        "",
        "max_records_per_batch = 9\nmax_records_per_task = 2",
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
    // Every shard's cursor is the last record put to it.
    assert_eq!(cursors(root, &toml).await, last_put(&records));

    // More records: `sluice show` counts them, the next run reads only
    // those.
    put(&stream, &KEYS[..2], &rides(1000, 11), &records).await;
    let status = sluice_engine::admin::status(&ctx).await.unwrap();
    assert_eq!(status.waiting_records, Some(11));
    run(&ctx).await.unwrap();
    let status = sluice_engine::admin::status(&ctx).await.unwrap();
    assert_eq!(status.waiting_records, Some(0));
    assert_eq!(
        committed_rows(&sink, "rides").await,
        expected(&records).await
    );
    assert_eq!(cursors(root, &toml).await, last_put(&records));
    // Nothing new: no batch.
    let before = commit_records(root, &toml).await.len();
    let idle = run(&ctx).await.unwrap();
    assert!(idle.batches.is_empty());
    assert_eq!(commit_records(root, &toml).await.len(), before);

    // Each batch's units are within the limits, one per shard, tasks of at
    // most two records, and the reads add up to the records put.
    let mut read = 0;
    for c in commit_records(root, &toml).await {
        let s = c.stream.expect("a stream batch's record names its units");
        assert!(!s.shards.is_empty());
        let mut shards: Vec<&str> = s.shards.iter().map(|u| u.shard.as_str()).collect();
        shards.dedup();
        assert_eq!(shards.len(), s.shards.len(), "one unit a shard");
        for u in &s.shards {
            assert!(u.limit <= 2, "{u:?}");
        }
        assert_eq!(s.read.len(), s.shards.len());
        // The first batch's plan looked (ListShards, then where each shard
        // ends); later plans of the run read control only.
        if c.batch == 0 {
            assert!(s.requests >= 3, "{} plan calls", s.requests);
        }
        assert!(s.read.iter().all(|r| r.requests >= 2), "{:?}", s.read);
        for (u, r) in s.shards.iter().zip(&s.read) {
            assert!(r.records <= u.limit, "{r:?} of {u:?}");
        }
        read += s.records();
    }
    assert_eq!(read, 51);
    // `sluice check` lists the shards.
    let report = sluice_engine::admin::check(&ctx).await.unwrap();
    assert!(
        report
            .checked
            .iter()
            .any(|c| c.contains("it has 3 shards (3 open)")),
        "{:?}",
        report.checked
    );
}

/// A settled pipeline whose stream holds nothing new writes nothing: not
/// the lease, not control.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_run_of_a_stream_writes_nothing() {
    let stream = fresh_stream("idle", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 8), &records).await;
    let toml = kinesis_toml("kidle", &stream, "", "");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let writes = Arc::new(AtomicU64::new(0));
    let mut ctx = fault_context(root, &toml, writes.clone(), 0);
    let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    ctx.metrics = Some(Arc::new(move |l: &str| {
        sink.lock().unwrap().push(l.to_string())
    }));
    let idle = run(&ctx).await.unwrap();
    assert!(idle.batches.is_empty());
    assert_eq!(writes.load(Ordering::SeqCst), 0, "an idle run wrote");
    // Its metric line (valid EMF) counts its calls, by the API's shape: one
    // ListShards, and for each of the 2 shards one GetShardIterator and one
    // GetRecords. They are its own, not the next batch's.
    let lines = lines.lock().unwrap().clone();
    check_emf(root, &lines);
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        (
            &line["RecordsWaiting"],
            &line["KinesisRequests"],
            &line["ThrottledRequests"]
        ),
        (&0.0.into(), &5.0.into(), &0.0.into()),
        "{line}"
    );
    // One record more: the next run is not idle.
    put(&stream, &KEYS, &rides(50, 1), &records).await;
    let busy = run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(busy.batches.len(), 1);
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kidle").await,
        expected(&records).await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kinesis_run_crashed_at_each_write_recovers() {
    let stream = fresh_stream("crash", 2).await;
    let setup = tempfile::tempdir().unwrap();
    let records = setup.path().join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 15), &records).await;
    let want = expected(&records).await;
    let toml = kinesis_toml(
        "kcrash",
        &stream,
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
        // Records that arrive after the crash: the run that takes over
        // is a new run, so it reads them too (the dead run's end does not
        // hold for it).
        put(&stream, &KEYS, &rides(1000 + 10 * k, 2), &records).await;
        run(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        let sink = root.join("out/sink");
        assert_eq!(
            committed_rows(&sink, "kcrash").await,
            expected(&records).await,
            "after write {k}"
        );
        assert_eq!(orphan_files(&sink, "kcrash").await, Vec::<String>::new());
        assert_eq!(staged_files(&sink), Vec::<String>::new());
        assert_eq!(cursors(root, &toml).await, last_put(&records), "write {k}");
    }
}

/// Runs of the `sluice` binary, three at a time, one killed in each wave,
/// while records keep arriving: every record committed once.
#[tokio::test(flavor = "multi_thread")]
async fn killed_and_racing_runs_of_a_stream_commit_every_record_once() {
    let stream = fresh_stream("storm", 3).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    let toml = kinesis_toml(
        "kstorm",
        &stream,
        "",
        "max_records_per_batch = 5\nmax_records_per_task = 2",
    );
    std::fs::write(root.join("pipeline.toml"), &toml).unwrap();
    let mut killed = 0;
    for wave in 0..5u64 {
        put(&stream, &KEYS, &rides(wave * 100, 8 + wave), &records).await;
        let mut children: Vec<_> = (0..3).map(|_| spawn_run(root)).collect();
        let delay_ms = [30u64, 80, 150, 250, 400][wave as usize];
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
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
            assert!(
                out.status.success(),
                "wave {wave}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(killed >= 2, "only {killed} kills landed mid-run");
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
    assert_eq!(cursors(root, &toml).await, last_put(&records));
}

/// Records put in `drops` (count, keys used), a run after every `every`
/// drops and one at the end, batches of at most `per_batch` records in
/// tasks of `per_task`: the committed output equals DuckDB over the
/// records as put, and each shard's cursor is its last record.
fn random_drops(drops: Vec<(u64, usize)>, every: usize, per_batch: u64, per_task: u64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let stream = fresh_stream("eq", 3).await;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let records = root.join("put.jsonl");
        let toml = kinesis_toml(
            "keq",
            &stream,
            "",
            &format!("max_records_per_batch = {per_batch}\nmax_records_per_task = {per_task}"),
        );
        let ctx = local_context(&pipeline(root, &toml));
        for (i, (n, keys)) in drops.iter().enumerate() {
            put(
                &stream,
                &KEYS[..*keys],
                &rides(i as u64 * 100, *n),
                &records,
            )
            .await;
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
        assert_eq!(cursors(root, &toml).await, last_put(&records));
        for c in commit_records(root, &toml).await {
            let s = c.stream.expect("a stream batch");
            // Equal shares of the batch's records, at least one a shard.
            assert!(s.records() <= per_batch.max(3), "{} records", s.records());
        }
    });
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 4, ..Default::default() })]

    #[test]
    fn splitting_a_stream_into_runs_batches_and_tasks_never_changes_the_result(
        drops in proptest::collection::vec((1u64..12, 1usize..=6), 1..5),
        every in 1usize..4,
        per_batch in 1u64..20,
        per_task in 1u64..8,
    ) {
        random_drops(drops, every, per_batch, per_task);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_does_not_exist_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = kinesis_toml("kmissing", "no-such-stream-here", "", "");
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("stream \"no-such-stream-here\" does not exist"),
        "{e}"
    );
    assert!(!root.join("out/sink").join("batch=0000000000").exists());
    let e = sluice_engine::admin::check(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("stream \"no-such-stream-here\" does not exist"),
        "{e}"
    );
}

/// `starting_position = "latest"`: records put before the first run are
/// not read, those after are; a date: records that arrived before it are
/// not read.
#[tokio::test(flavor = "multi_thread")]
async fn latest_and_a_date_start_where_they_say() {
    let stream = fresh_stream("latest", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    put(&stream, &KEYS, &rides(900, 6), &root.join("before.jsonl")).await;
    let toml = kinesis_toml("klatest", &stream, "starting_position = \"latest\"", "");
    let first = run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert!(first.batches.is_empty(), "{:?}", first.end);
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 9), &records).await;
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "klatest").await,
        expected(&records).await
    );

    // A date between two puts: only the later records.
    let stream = fresh_stream("dated", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    put(&stream, &KEYS, &rides(900, 6), &root.join("before.jsonl")).await;
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let at = chrono::Utc::now();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 9), &records).await;
    let toml = kinesis_toml(
        "kdated",
        &stream,
        &format!(
            "starting_position = \"{}\"",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        "",
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kdated").await,
        expected(&records).await
    );
}

/// A reshard between runs (the case that makes Spark's Kinesis users
/// delete their checkpoint): split one shard and merge two others; the
/// next run reads the parents' last records, then the children, each
/// record once, and no child is read in a batch before its parents are
/// drained, so each partition key's records commit in the order they
/// were put.
#[tokio::test(flavor = "multi_thread")]
async fn a_reshard_between_runs_reads_parents_before_children() {
    let stream = fresh_stream("reshard", 3).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 12), &records).await;
    let toml = kinesis_toml(
        "kreshard",
        &stream,
        "",
        "max_records_per_batch = 6\nmax_records_per_task = 3",
    );
    let ctx = local_context(&pipeline(root, &toml));
    run(&ctx).await.unwrap();
    // Records the first run does not read, in the parents.
    put(&stream, &KEYS, &rides(100, 9), &records).await;
    let c = client().await;
    let shards = c
        .list_shards()
        .stream_name(&stream)
        .send()
        .await
        .unwrap()
        .shards()
        .to_vec();
    let s0 = &shards[0];
    let lo: u128 = s0
        .hash_key_range()
        .unwrap()
        .starting_hash_key()
        .parse()
        .unwrap();
    let hi: u128 = s0
        .hash_key_range()
        .unwrap()
        .ending_hash_key()
        .parse()
        .unwrap();
    c.split_shard()
        .stream_name(&stream)
        .shard_to_split(s0.shard_id())
        .new_starting_hash_key((lo + (hi - lo) / 2).to_string())
        .send()
        .await
        .unwrap();
    c.merge_shards()
        .stream_name(&stream)
        .shard_to_merge(shards[1].shard_id())
        .adjacent_shard_to_merge(shards[2].shard_id())
        .send()
        .await
        .unwrap();
    // Records in the children (forty keys: every child gets some).
    let many: Vec<String> = (0..40).map(|i| format!("key{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    put(&stream, &many, &rides(200, 40), &records).await;
    run(&ctx).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kreshard").await,
        expected(&records).await
    );
    // Parents drained before any child is read.
    let control = control_of(root, &toml).await;
    let parents_of: std::collections::BTreeMap<String, Vec<String>> = control
        .stream_shards
        .iter()
        .map(|(id, c)| (id.clone(), c.parents.clone()))
        .collect();
    assert_eq!(parents_of.len(), 6, "{parents_of:?}");
    let mut drained_in = std::collections::BTreeMap::new();
    let mut first_read_in = std::collections::BTreeMap::new();
    for c in commit_records(root, &toml).await {
        let s = c.stream.unwrap();
        for r in &s.read {
            if r.ended {
                drained_in.insert(r.shard.clone(), c.batch);
            }
            if r.records > 0 {
                first_read_in.entry(r.shard.clone()).or_insert(c.batch);
            }
        }
    }
    for (child, parents) in &parents_of {
        for p in parents {
            let (Some(d), Some(f)) = (drained_in.get(p), first_read_in.get(child)) else {
                panic!("{p} drained {drained_in:?}, {child} read {first_read_in:?}");
            };
            assert!(
                d < f,
                "{child} read in batch {f}, its parent {p} drained in {d}"
            );
        }
    }
    for p in parents_of.values().flatten() {
        assert!(control.stream_shards[p].drained, "{p} not drained");
    }
    // Nothing more: an idle run.
    let idle = run(&ctx).await.unwrap();
    assert!(idle.batches.is_empty());
}

/// `format = "raw"`: each record as GetRecords gives it, the data as
/// bytes, whatever it holds.
#[tokio::test(flavor = "multi_thread")]
async fn raw_records_are_read_as_get_records_gives_them() {
    let stream = fresh_stream("raw", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let c = client().await;
    let datas: [&[u8]; 3] = [b"{\"a\": 1}", b"not json", &[0, 255, 10]];
    let mut want = Vec::new();
    for (i, d) in datas.iter().enumerate() {
        let out = c
            .put_record()
            .stream_name(&stream)
            .partition_key(format!("key-{i}"))
            .data(aws_sdk_kinesis::primitives::Blob::new(*d))
            .send()
            .await
            .unwrap();
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        want.push(format!(
            "{hex}|key-{i}|{}|{}",
            out.sequence_number(),
            out.shard_id()
        ));
    }
    want.sort();
    let toml = format!(
        r#"name = "kraw"
[source]
uri = "kinesis://{stream}"
format = "raw"
table = "recs"
[query]
sql = "SELECT encode(data, 'hex') AS data, partition_key, sequence_number, shard_id FROM recs"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
"#
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(committed_rows(&root.join("out/sink"), "kraw").await, want);
}

/// Ask the stand (`SLUICE_KINESIS_CONTROL`) to refuse `stream`'s next
/// calls for throughput; how many it refused so far, per call.
fn throttle(stream: &str, get_records: u64, get_shard_iterator: u64) -> serde_json::Value {
    stand_control(
        "/throttle",
        serde_json::json!({
            "stream": stream,
            "get_records": get_records,
            "get_shard_iterator": get_shard_iterator,
        }),
    )
}

/// POST `body` to the stand's control port at `path`; its answer.
fn stand_control(path: &str, body: serde_json::Value) -> serde_json::Value {
    let control = std::env::var("SLUICE_KINESIS_CONTROL").expect(
        "SLUICE_KINESIS_CONTROL is not set: run the suite with tests/run.sh, which starts the \
         stand's control port",
    );
    let script = "import sys, urllib.request\n\
                  r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], \
                  data=sys.argv[2].encode(), method='POST'))\n\
                  print(r.read().decode())\n";
    let out = std::process::Command::new(python())
        .args(["-c", script, &format!("{control}{path}"), &body.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Calls refused for throughput are backed off and made again, counted in
/// the commit record; the output is exact. Refused for longer than the
/// step may wait (`SLUICE_KINESIS_TIMEOUT_S`), the run fails, retryably,
/// writing no batch, and the next run reads everything.
#[tokio::test(flavor = "multi_thread")]
async fn throttled_reads_are_retried_counted_and_exact() {
    let stream = fresh_stream("throttle", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 12), &records).await;
    let toml = kinesis_toml("kthrottle", &stream, "", "");
    let ctx = local_context(&pipeline(root, &toml));
    run(&ctx).await.unwrap();
    put(&stream, &KEYS, &rides(100, 12), &records).await;
    throttle(&stream, 3, 1);
    run(&ctx).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kthrottle").await,
        expected(&records).await
    );
    let refused = throttle(&stream, 0, 0);
    assert_eq!(refused["get_records"], 3, "{refused}");
    assert_eq!(refused["get_shard_iterator"], 1, "{refused}");
    // Every refusal is counted in the commit records: the Plan step's in
    // the plan, the tasks' with what they read.
    let counted: u64 = commit_records(root, &toml)
        .await
        .iter()
        .map(|c| {
            let s = c.stream.clone().unwrap();
            s.throttled + s.read.iter().map(|r| r.throttled).sum::<u64>()
        })
        .sum();
    assert_eq!(counted, 4);
    // `sluice history` shows each shard's read and the refusals.
    std::fs::write(root.join("pipeline.toml"), &toml).unwrap();
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["history", root.join("pipeline.toml").to_str().unwrap()])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("shard shardId-000000000000:") && shown.contains("refused for throughput"),
        "{shown}"
    );

    // Refused without end: the run fails, nothing is committed, the next
    // run reads everything.
    let before = commit_records(root, &toml).await.len();
    put(&stream, &KEYS, &rides(200, 5), &records).await;
    throttle(&stream, 1_000_000, 0);
    let e = run(&ctx).await.unwrap_err().to_string();
    assert!(e.contains("refused for throughput"), "{e}");
    assert_eq!(commit_records(root, &toml).await.len(), before);
    throttle(&stream, 0, 0);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kthrottle").await,
        expected(&records).await
    );
}

/// A DynamoDB table's changes through Kinesis Data Streams for DynamoDB:
/// each record's data is the change record (`eventName`, `dynamodb.Keys`,
/// `NewImage`, `OldImage`, typed attribute values). A query reads the
/// latest image of inserted and modified items, and the keys of removed
/// ones, equal to DuckDB over the same records.
#[tokio::test(flavor = "multi_thread")]
async fn dynamodb_change_records_are_a_query_input() {
    let stream = fresh_stream("ddb", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    let image = |id: u64, fare: f64, zone: &str| {
        serde_json::json!({
            "ride_id": {"N": id.to_string()},
            "fare": {"N": fare.to_string()},
            "zone": {"S": zone},
        })
    };
    let mut changes = Vec::new();
    for id in 0..12u64 {
        let new = image(id, id as f64 * 1.5, &format!("z{}", id % 3));
        let (name, body) = match id % 3 {
            0 => ("INSERT", serde_json::json!({"NewImage": new})),
            1 => (
                "MODIFY",
                serde_json::json!({"NewImage": new, "OldImage": image(id, 1.0, "old")}),
            ),
            _ => (
                "REMOVE",
                serde_json::json!({"OldImage": image(id, 2.0, "gone")}),
            ),
        };
        let mut dynamodb = body;
        dynamodb["Keys"] = serde_json::json!({"ride_id": {"N": id.to_string()}});
        dynamodb["ApproximateCreationDateTime"] = (1_764_680_400_000u64 + id * 1000).into();
        dynamodb["SizeBytes"] = 64.into();
        changes.push(
            serde_json::json!({
                "awsRegion": "us-east-1",
                "eventID": format!("e-{id}"),
                "eventName": name,
                "userIdentity": null,
                "recordFormat": "application/json",
                "tableName": "rides",
                "dynamodb": dynamodb,
                "eventSource": "aws:dynamodb",
            })
            .to_string(),
        );
    }
    put(&stream, &["pk-a", "pk-b", "pk-c"], &changes, &records).await;
    let sql = "SELECT \"eventName\" AS event, \
               CAST(dynamodb['Keys']['ride_id']['N'] AS BIGINT) AS ride_id, \
               CAST(dynamodb['NewImage']['fare']['N'] AS DOUBLE) AS fare, \
               dynamodb['NewImage']['zone']['S'] AS zone \
               FROM changes";
    let toml = format!(
        r#"name = "ddb"
[source]
uri = "kinesis://{stream}"
format = "jsonl"
table = "changes"
[query]
sql = '''{sql}'''
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
"#
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let want = duckdb_sql(&format!(
        "SELECT eventName AS event, CAST(dynamodb.Keys.ride_id.N AS BIGINT) AS ride_id, \
         CAST(dynamodb.NewImage.fare.N AS DOUBLE) AS fare, dynamodb.NewImage.zone.S AS zone \
         FROM read_json('{}', format = 'newline_delimited')",
        records.display()
    ))
    .await;
    assert_eq!(want.len(), 12);
    assert_eq!(committed_rows(&root.join("out/sink"), "ddb").await, want);
}

/// Records put after the cursor expire (the stand trims them, as the
/// retention would) while no run happens for longer than the retention
/// (the run's clock moved 25 hours on): `on_data_loss = "fail"` refuses
/// the run, naming the shard and the cursor, commits nothing and gives
/// the lease back; `skip` goes on from the oldest record left, reads
/// everything after the loss once, and the batch's records name the loss.
/// A run within the retention asks nothing about it.
#[tokio::test(flavor = "multi_thread")]
async fn records_expired_unread_fail_or_are_passed_over_as_the_policy_says() {
    let stream = fresh_stream("expired", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 6), &records).await;
    let toml = kinesis_toml("kexpired", &stream, "", "");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let cursor = cursors(root, &toml).await;
    // Four more, then everything so far expires; three arrive after.
    put(&stream, &KEYS, &rides(100, 4), &root.join("lost.jsonl")).await;
    std::thread::sleep(std::time::Duration::from_millis(50));
    let now_s = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
    let trimmed = stand_control(
        "/trim",
        serde_json::json!({"stream": stream, "before_epoch_s": now_s}),
    );
    assert_eq!(trimmed["trimmed"], 10, "{trimmed}");
    std::thread::sleep(std::time::Duration::from_millis(50));
    put(&stream, &KEYS, &rides(200, 3), &records).await;
    let later = |toml: &str| {
        let mut ctx = local_context(&pipeline(root, toml));
        ctx.clock = Arc::new(|| chrono::Utc::now().timestamp_millis() + 25 * 3_600_000);
        ctx
    };
    let e = run(&later(&toml)).await.unwrap_err().to_string();
    let shard = cursor.keys().next().unwrap();
    assert!(
        e.contains(shard.as_str())
            && e.contains(cursor[shard].as_str())
            && e.contains("on_data_loss"),
        "{e}"
    );
    assert_eq!(commit_records(root, &toml).await.len(), 1);
    assert_eq!(
        control_of(root, &toml).await.status,
        sluice_engine::checkpoint::RunStatus::Idle
    );
    let skip = kinesis_toml("kexpired", &stream, "on_data_loss = \"skip\"", "");
    run(&later(&skip)).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kexpired").await,
        expected(&records).await
    );
    let commits = commit_records(root, &skip).await;
    let lost = &commits[1].stream.as_ref().unwrap().lost_shards;
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].after.as_deref(), Some(cursor[shard].as_str()));
    assert_eq!(cursors(root, &skip).await, last_put(&records));
}

/// At the batch's first commit write, once: records into the open shards,
/// then split one and merge the other two, then records into the
/// children.
#[derive(Debug)]
struct ReshardMidRun {
    stream: String,
    records: std::path::PathBuf,
    done: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl WriteHook for ReshardMidRun {
    async fn before(
        &self,
        op: &'static str,
        key: &str,
    ) -> Result<(), sluice_engine::error::StoreError> {
        if op != "put" || !key.starts_with("commits/") || self.done.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        put(&self.stream, &KEYS, &rides(300, 6), &self.records).await;
        reshard(&self.stream).await;
        let many: Vec<String> = (0..40).map(|i| format!("key{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        put(&self.stream, &many, &rides(400, 40), &self.records).await;
        Ok(())
    }
}

/// Split the stream's first shard at its middle and merge its other two.
async fn reshard(stream: &str) {
    let c = client().await;
    let shards = c
        .list_shards()
        .stream_name(stream)
        .send()
        .await
        .unwrap()
        .shards()
        .to_vec();
    let s0 = &shards[0];
    let range = s0.hash_key_range().unwrap();
    let lo: u128 = range.starting_hash_key().parse().unwrap();
    let hi: u128 = range.ending_hash_key().parse().unwrap();
    c.split_shard()
        .stream_name(stream)
        .shard_to_split(s0.shard_id())
        .new_starting_hash_key((lo + (hi - lo) / 2).to_string())
        .send()
        .await
        .unwrap();
    c.merge_shards()
        .stream_name(stream)
        .shard_to_merge(shards[1].shard_id())
        .adjacent_shard_to_merge(shards[2].shard_id())
        .send()
        .await
        .unwrap();
}

/// A reshard during a run: the run reads what the shards held when it
/// looked (records put to the parents or the children afterwards wait),
/// parents it read to their end are drained; the next run reads the rest,
/// parents before children, every record once.
#[tokio::test(flavor = "multi_thread")]
async fn a_reshard_during_a_run_is_read_by_the_next_parents_first() {
    let stream = fresh_stream("midrun", 3).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 12), &records).await;
    let first_look = root.join("first.jsonl");
    std::fs::copy(&records, &first_look).unwrap();
    let toml = kinesis_toml(
        "kmidrun",
        &stream,
        "",
        "max_records_per_batch = 6\nmax_records_per_task = 3",
    );
    let p = pipeline(root, &toml);
    let checkpoint = root.join("out/checkpoint").join(&p.name);
    let mut ctx = Context::new(
        p,
        Arc::new(sluice_engine::storage::LocalStore::new(root.join("input"))),
        Arc::new(sluice_engine::storage::LocalStore::new(
            root.join("out/sink"),
        )),
        Arc::new(Hooked {
            inner: Arc::new(sluice_engine::storage::LocalStore::new(checkpoint)),
            hook: ReshardMidRun {
                stream: stream.clone(),
                records: records.clone(),
                done: Default::default(),
            },
        }),
    );
    test_mode(&mut ctx);
    run(&ctx).await.unwrap();
    // Only what the shards held when the run looked.
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kmidrun").await,
        expected(&first_look).await
    );
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kmidrun").await,
        expected(&records).await
    );
    let control = control_of(root, &toml).await;
    let mut drained_in = std::collections::BTreeMap::new();
    let mut first_read_in = std::collections::BTreeMap::new();
    for c in commit_records(root, &toml).await {
        for r in &c.stream.unwrap().read {
            if r.ended {
                drained_in.insert(r.shard.clone(), c.batch);
            }
            if r.records > 0 {
                first_read_in.entry(r.shard.clone()).or_insert(c.batch);
            }
        }
    }
    let children: Vec<(&String, &Vec<String>)> = control
        .stream_shards
        .iter()
        .filter(|(_, c)| !c.parents.is_empty())
        .map(|(id, c)| (id, &c.parents))
        .collect();
    assert_eq!(children.len(), 3, "{:?}", control.stream_shards);
    for (child, parents) in children {
        for p in parents {
            let (Some(d), Some(f)) = (drained_in.get(p), first_read_in.get(child)) else {
                panic!("{p} drained {drained_in:?}, {child} read {first_read_in:?}");
            };
            assert!(
                d < f,
                "{child} read in batch {f}, its parent {p} drained in {d}"
            );
        }
    }
    assert!(
        run(&local_context(&pipeline(root, &toml)))
            .await
            .unwrap()
            .batches
            .is_empty()
    );
}

/// More records than one GetRecords call answers, put at once: the look
/// for where the run stops halves its time window until one page from
/// there reaches the tip, and the run reads every record once, up to the
/// last one put.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_larger_than_a_page_is_read_to_its_last_record() {
    let stream = fresh_stream("burst", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    let c = client().await;
    let mut keep = String::new();
    for chunk in 0..25u64 {
        let values = rides(chunk * 500, 500);
        let entries = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                    .partition_key(format!("k{i}"))
                    .data(aws_sdk_kinesis::primitives::Blob::new(v.as_bytes()))
                    .build()
                    .unwrap()
            })
            .collect();
        let out = c
            .put_records()
            .stream_name(&stream)
            .set_records(Some(entries))
            .send()
            .await
            .unwrap();
        for (i, (v, r)) in values.iter().zip(out.records()).enumerate() {
            let mut row: serde_json::Value = serde_json::from_str(v).unwrap();
            row["_shard_id"] = r.shard_id().unwrap().into();
            row["_sequence_number"] = r.sequence_number().unwrap().into();
            row["_partition_key"] = format!("k{i}").into();
            keep.push_str(&row.to_string());
            keep.push('\n');
        }
    }
    std::fs::write(&records, keep).unwrap();
    let toml = kinesis_toml("kburst", &stream, "", "");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let want = expected(&records).await;
    assert!(want.len() > 10_000, "{}", want.len());
    assert_eq!(committed_rows(&root.join("out/sink"), "kburst").await, want);
    assert_eq!(cursors(root, &toml).await, last_put(&records));
    let control = control_of(root, &toml).await;
    let until = control.stream_until.unwrap();
    assert_eq!(
        until.shards.values().next().unwrap().last.as_ref(),
        last_put(&records).values().next()
    );
}

/// At every commit write, one record more into the stream (kept in
/// `records`).
#[derive(Debug)]
struct PutAtEachCommit {
    stream: String,
    records: std::path::PathBuf,
    n: AtomicU64,
}

#[async_trait::async_trait]
impl WriteHook for PutAtEachCommit {
    async fn before(
        &self,
        op: &'static str,
        key: &str,
    ) -> Result<(), sluice_engine::error::StoreError> {
        if op == "put" && key.starts_with("commits/") {
            let i = self.n.fetch_add(1, Ordering::SeqCst);
            put(&self.stream, &KEYS, &rides(5000 + i, 1), &self.records).await;
        }
        Ok(())
    }
}

/// A run whose executions hand over at their batch budget is one run: it
/// stops at the end its first plan found, however many records keep
/// arriving meanwhile (it used to find a new end at each hand-over and,
/// with records arriving faster than it read them, never stopped).
#[tokio::test(flavor = "multi_thread")]
async fn a_run_handed_over_at_its_batch_budget_stops_at_its_first_end() {
    let stream = fresh_stream("handover", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 10), &records).await;
    let first_look = root.join("first.jsonl");
    std::fs::copy(&records, &first_look).unwrap();
    let toml = kinesis_toml(
        "khandover",
        &stream,
        "",
        "max_records_per_batch = 1\nmax_records_per_task = 1\nmax_batches_per_execution = 3",
    );
    let p = pipeline(root, &toml);
    let checkpoint = root.join("out/checkpoint").join(&p.name);
    let mut ctx = Context::new(
        p,
        Arc::new(sluice_engine::storage::LocalStore::new(root.join("input"))),
        Arc::new(sluice_engine::storage::LocalStore::new(
            root.join("out/sink"),
        )),
        Arc::new(Hooked {
            inner: Arc::new(sluice_engine::storage::LocalStore::new(checkpoint)),
            hook: PutAtEachCommit {
                stream: stream.clone(),
                records: records.clone(),
                n: AtomicU64::new(0),
            },
        }),
    );
    test_mode(&mut ctx);
    let summary = tokio::time::timeout(std::time::Duration::from_secs(120), run(&ctx))
        .await
        .expect("the run stops")
        .unwrap();
    assert!(summary.executions >= 4, "{} executions", summary.executions);
    assert_eq!(
        committed_rows(&root.join("out/sink"), "khandover").await,
        expected(&first_look).await
    );
    // The next run reads what arrived meanwhile.
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "khandover").await,
        expected(&records).await
    );
}

/// The checkpoint's positions are one stream's: another stream is refused
/// by `sluice check` and by the run alike; the same stream by its ARN is
/// the same stream.
#[tokio::test(flavor = "multi_thread")]
async fn another_stream_is_refused_and_the_same_one_by_arn_is_not() {
    let stream = fresh_stream("same", 1).await;
    let other = fresh_stream("other", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 5), &records).await;
    let toml = kinesis_toml("ksame", &stream, "", "");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    let moved = kinesis_toml("ksame", &other, "", "");
    for e in [
        sluice_engine::admin::check(&local_context(&pipeline(root, &moved)))
            .await
            .map(|_| ())
            .unwrap_err(),
        run(&local_context(&pipeline(root, &moved)))
            .await
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert!(e.to_string().contains("now names stream"), "{e}");
    }
    let arn = format!("arn:aws:kinesis:us-east-1:123456789012:stream/{stream}");
    let by_arn = kinesis_toml("ksame", &arn, "", "");
    sluice_engine::admin::check(&local_context(&pipeline(root, &by_arn)))
        .await
        .unwrap();
    put(&stream, &KEYS, &rides(100, 3), &records).await;
    run(&local_context(&pipeline(root, &by_arn))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "ksame").await,
        expected(&records).await
    );
}

/// `sluice cost` over a Kinesis source: the bytes each batch read are the
/// record data as put, summed; an on-demand stream's reads are priced at
/// the table's per-GB retrieval price, a provisioned stream's add nothing.
#[tokio::test(flavor = "multi_thread")]
async fn cost_prices_what_reads_of_an_on_demand_stream_retrieve() {
    use aws_sdk_kinesis::types::{StreamMode, StreamModeDetails};
    let on_demand = format!("ondemand-{}", std::process::id());
    client()
        .await
        .create_stream()
        .stream_name(&on_demand)
        .stream_mode_details(
            StreamModeDetails::builder()
                .stream_mode(StreamMode::OnDemand)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let provisioned = fresh_stream("provisioned", 2).await;
    let prices = sluice_engine::cost::Prices::default_table();
    for (stream, billed) in [(&on_demand, true), (&provisioned, false)] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let records = root.join("put.jsonl");
        let values = rides(0, 40);
        put(stream, &KEYS, &values, &records).await;
        let toml = kinesis_toml("kcost", stream, "", "max_records_per_batch = 16");
        let ctx = local_context(&pipeline(root, &toml));
        let done = run(&ctx).await.unwrap();
        assert!(done.batches.len() >= 2, "{} batches", done.batches.len());
        let commits = sluice_engine::admin::history(&ctx, 100).await.unwrap();
        let report = sluice_engine::cost::report(
            &commits,
            &Default::default(),
            &prices,
            "built in",
            Default::default(),
        );
        let read: u64 = report
            .batches
            .iter()
            .map(|b| b.kinesis.expect("a Kinesis batch says what it read").bytes)
            .sum();
        let put_bytes: u64 = values.iter().map(|v| v.len() as u64).sum();
        assert_eq!(read, put_bytes, "{stream}");
        assert!(
            report
                .batches
                .iter()
                .all(|b| b.kinesis.unwrap().on_demand == billed && b.kinesis.unwrap().requests > 0)
        );
        let want = if billed {
            put_bytes as f64 / (1024.0 * 1024.0 * 1024.0) * 0.04
        } else {
            0.0
        };
        let got = report.batches_bill.kinesis;
        assert!((got - want).abs() <= 1e-15, "{stream}: {got} vs {want}");
        let total: f64 = report.batches.iter().map(|b| b.bill.total()).sum();
        let rest: f64 = report
            .batches
            .iter()
            .map(|b| b.bill.lambda + b.bill.step_functions + b.bill.s3)
            .sum();
        assert!((total - rest - want).abs() <= 1e-15);
    }
}

/// Put `data` to `stream` under key `k0` as one record; its shard and
/// sequence number.
async fn put_one(stream: &str, data: &[u8]) -> (String, String) {
    let out = client()
        .await
        .put_record()
        .stream_name(stream)
        .partition_key("k0")
        .data(aws_sdk_kinesis::primitives::Blob::new(data))
        .send()
        .await
        .unwrap();
    (
        out.shard_id().to_string(),
        out.sequence_number().to_string(),
    )
}

/// Records whose data is not one JSON object: refused under `fail`, the
/// error naming the first by its shard and sequence number; set aside
/// under `quarantine`, each named so, and the good records read exactly
/// once (DuckDB over the good records as put).
#[tokio::test(flavor = "multi_thread")]
async fn bad_records_are_quarantined_with_their_shard_and_sequence_number() {
    let stream = fresh_stream("bad", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 4), &records).await;
    let bad = [
        put_one(&stream, b"not json at all").await,
        put_one(&stream, b"[1, 2]").await,
    ];
    put(&stream, &KEYS, &rides(10, 3), &records).await;
    let strict = kinesis_toml("kbad", &stream, "", "");
    let e = run(&local_context(&pipeline(root, &strict)))
        .await
        .unwrap_err()
        .to_string();
    let first = format!("shard {}, sequence number {}", bad[0].0, bad[0].1);
    assert!(
        e.contains("cannot be changed")
            && e.contains("on_bad_row = \"quarantine\"")
            && e.contains(&first)
            && e.contains("not one JSON object")
            && !e.contains("replace the file")
            && !e.contains(": line "),
        "{e}"
    );
    assert!(!root.join("out/sink/_sluice/manifest").exists());
    let toml = kinesis_toml("kbad", &stream, "on_bad_row = \"quarantine\"", "");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kbad").await,
        expected(&records).await
    );
    let quarantined = crate::kafka::quarantined_rows(root);
    assert_eq!(quarantined.len(), 2, "{quarantined:?}");
    for (shard, seq) in &bad {
        let at = format!("shard {shard}, sequence number {seq}");
        assert!(
            quarantined
                .iter()
                .any(|q| q.to_string().contains(&at) && q.to_string().contains("JSON object")),
            "{at} in {quarantined:?}"
        );
    }
}

/// A windowed GROUP BY over an event time in the records' data, read over
/// three shards in small batches and two runs, equals DuckDB's over the
/// records as put.
#[tokio::test(flavor = "multi_thread")]
async fn a_window_over_an_event_time_equals_duckdb() {
    let stream = fresh_stream("win", 3).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let kept = root.join("put.jsonl");
    let values: Vec<String> = (0..40i64)
        .map(|i| {
            // Every 7 minutes, one in five an hour late.
            let minutes = i * 7 - if i % 5 == 4 { 60 } else { 0 };
            let ts = chrono::NaiveDate::from_ymd_opt(2026, 12, 1)
                .unwrap()
                .and_hms_opt(10, 0, 0)
                .unwrap()
                + chrono::Duration::minutes(minutes);
            serde_json::json!({
                "zone": format!("z{}", i % 3),
                "fare": i as f64 * 0.5,
                "ts": ts.format("%Y-%m-%dT%H:%M:%S").to_string(),
            })
            .to_string()
        })
        .collect();
    let toml = format!(
        r#"name = "kwin"
[source]
uri = "kinesis://{stream}"
format = "jsonl"
table = "rides"
schema = [{{ name = "zone", type = "Utf8" }}, {{ name = "fare", type = "Float64" }}, {{ name = "ts", type = "Timestamp(Microsecond, None)" }}]
[query]
sql = "SELECT window.start AS window_start, zone, count(*) AS n, sum(fare) AS fares FROM rides GROUP BY window(ts, '30 minutes'), zone"
[sink]
uri = "out/sink"
mode = "complete"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_records_per_batch = 9
"#
    );
    let want = || async {
        duckdb_sql(&format!(
            "SELECT time_bucket(INTERVAL 30 MINUTE, CAST(ts AS TIMESTAMP)) AS window_start, \
             zone, count(*) AS n, sum(fare) AS fares FROM read_json('{}', format = \
             'newline_delimited') GROUP BY ALL",
            kept.display()
        ))
        .await
    };
    for half in values.chunks(20) {
        put(&stream, &KEYS, half, &kept).await;
        let done = run(&local_context(&pipeline(root, &toml))).await.unwrap();
        assert!(done.batches.len() >= 2, "{} batches", done.batches.len());
        let last = manifest_files(&root.join("out/sink"), "kwin").await;
        let (_, complete, files) = last.last().expect("a manifest").clone();
        assert!(complete);
        let got = duckdb_rows(&files, "SELECT window_start, zone, n, fares FROM trips").await;
        assert_eq!(got, want().await);
    }
}

/// A Kinesis client of `region`.
async fn client_in(region: &'static str) -> aws_sdk_kinesis::Client {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region))
        .load()
        .await;
    aws_sdk_kinesis::Client::new(&sdk)
}

/// A stream of the same name in another region is another stream: named
/// by its ARN, it is read in the ARN's region, and a checkpoint of the
/// first one refuses it (it once read it on the first one's positions,
/// then marked a shard the other lacked as drained and lost its records).
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_of_the_same_name_in_another_region_is_another_stream() {
    let stream = fresh_stream("region", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = root.join("put.jsonl");
    put(&stream, &KEYS, &rides(0, 12), &records).await;
    let toml = kinesis_toml("kregion", &stream, "", "");
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    // The same name in eu-west-1, one shard, its own records.
    let eu = client_in("eu-west-1").await;
    eu.create_stream()
        .stream_name(&stream)
        .shard_count(1)
        .send()
        .await
        .unwrap();
    let mut eu_kept = String::new();
    for v in rides(500, 6) {
        let out = eu
            .put_record()
            .stream_name(&stream)
            .partition_key("k0")
            .data(aws_sdk_kinesis::primitives::Blob::new(v.as_bytes()))
            .send()
            .await
            .unwrap();
        let mut row: serde_json::Value = serde_json::from_str(&v).unwrap();
        row["_shard_id"] = out.shard_id().into();
        row["_sequence_number"] = out.sequence_number().into();
        row["_partition_key"] = "k0".into();
        eu_kept.push_str(&format!("{row}\n"));
    }
    let arn = eu
        .describe_stream_summary()
        .stream_name(&stream)
        .send()
        .await
        .unwrap()
        .stream_description_summary()
        .unwrap()
        .stream_arn()
        .to_string();
    assert!(arn.contains(":eu-west-1:"), "{arn}");
    // The EU stream by its ARN, on the us-east-1 pipeline's checkpoint:
    // refused, naming both, nothing written.
    let before = committed_rows(&root.join("out/sink"), "kregion").await;
    let other = kinesis_toml("kregion", &arn, "", "");
    let e = run(&local_context(&pipeline(root, &other)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&arn) && e.contains(":us-east-1:") && e.contains("another region or account"),
        "{e}"
    );
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kregion").await,
        before
    );
    // `sluice check` refuses it as the run does, and `sluice show` does not
    // count the other stream's records as this pipeline's backlog.
    let ctx = local_context(&pipeline(root, &other));
    let e = sluice_engine::admin::check(&ctx)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("another region or account"), "{e}");
    let status = sluice_engine::admin::status(&ctx).await.unwrap();
    let e = status.waiting_error.unwrap_or_default();
    assert!(
        e.contains("another region or account") && status.waiting_files == 0,
        "{e}"
    );
    // Nothing of the first stream is lost: its new records are read.
    put(&stream, &KEYS, &rides(100, 9), &records).await;
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "kregion").await,
        expected(&records).await
    );
    // A new pipeline of the EU ARN reads the EU stream (in its region,
    // whatever AWS_REGION says).
    let eu_dir = tempfile::tempdir().unwrap();
    let eu_records = eu_dir.path().join("put.jsonl");
    std::fs::write(&eu_records, eu_kept).unwrap();
    run(&local_context(&pipeline(eu_dir.path(), &other)))
        .await
        .unwrap();
    assert_eq!(
        committed_rows(&eu_dir.path().join("out/sink"), "kregion").await,
        expected(&eu_records).await
    );
}

/// A stateful query takes no bad-row policy yet, and a stream's record
/// cannot be fixed: a record whose field its column's type cannot hold
/// fails the batch naming the record by shard and sequence number and
/// saying what can be done; nothing is committed.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_record_under_a_stateful_query_is_named_with_a_way_out() {
    let stream = fresh_stream("swin", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    put_one(
        &stream,
        br#"{"zone": "z1", "fare": 2.5, "ts": "2026-12-01T10:00:00"}"#,
    )
    .await;
    let (shard, seq) = put_one(
        &stream,
        br#"{"zone": "z1", "fare": "abc", "ts": "2026-12-01T10:01:00"}"#,
    )
    .await;
    let toml = format!(
        r#"name = "kswin"
[source]
uri = "kinesis://{stream}"
format = "jsonl"
table = "rides"
schema = [{{ name = "zone", type = "Utf8" }}, {{ name = "fare", type = "Float64" }}, {{ name = "ts", type = "Timestamp(Microsecond, None)" }}]
[query]
sql = "SELECT window.start AS window_start, zone, count(*) AS n, sum(fare) AS fares FROM rides GROUP BY window(ts, '30 minutes'), zone"
[sink]
uri = "out/sink"
mode = "complete"
[checkpoint]
uri = "out/checkpoint"
"#
    );
    let e = run(&local_context(&pipeline(root, &toml)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("shard {shard}, sequence number {seq}"))
            && e.contains("fare")
            && e.contains("row-by-row pipeline")
            && e.contains("on_bad_row = \"quarantine\""),
        "{e}"
    );
    assert!(!root.join("out/sink/_sluice/manifest").exists());
}
