//! `sluice bench --source kafka`: records per second of a sluice run
//! reading a topic into Parquet, against a plain consumer in the same
//! process that fetches the same ranges (rskafka), decodes the same JSON
//! values into Arrow, runs the same SQL with DataFusion and writes the
//! same Parquet. Prints ratios measured in this one run; also the idle
//! run. Needs a broker (`--bootstrap`); nothing here is a pass/fail test.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::json::ReaderBuilder;
use datafusion::arrow::json::reader::infer_json_schema_from_seekable;
use datafusion::dataframe::DataFrameWriteOptions;
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use sluice_engine::runner;

const SQL: &str = "SELECT ride_id, zone, fare, tip, fare + tip AS total FROM rides WHERE fare > 3";

/// Records per produce request.
const PRODUCE_BATCH: u64 = 2_000;

/// Run the Kafka benchmark: `records` records in `partitions` partitions.
pub async fn run(
    dir: &Path,
    bootstrap: &str,
    records: u64,
    partitions: i32,
    rounds: usize,
) -> anyhow::Result<()> {
    let client = ClientBuilder::new(vec![bootstrap.to_string()])
        .build()
        .await?;
    let topic = format!("sluice-bench-{}", std::process::id());
    client
        .controller_client()?
        .create_topic(&topic, partitions, 1, 5_000)
        .await?;
    println!("producing {records} records into {partitions} partitions of {topic} at {bootstrap}");
    let ends = produce(&client, &topic, records, partitions).await?;
    let total: i64 = ends.values().sum();
    let (mut plain, mut ours) = (Vec::new(), Vec::new());
    let mut last = None;
    for round in 0..rounds.max(1) {
        let out = dir.join(format!("plain-{round}"));
        plain.push(plain_consumer(&client, &topic, &ends, &out).await?);
        let toml = pipeline_toml(round, bootstrap, &topic);
        let (secs, ctx) = super::bench::full_run(&toml, dir, total as u64).await?;
        ours.push(secs);
        last = Some(ctx);
    }
    let ctx = last.expect("one round");
    let started = Instant::now();
    let idle = runner::run(&ctx, |_| {}).await?;
    let idle_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(idle.batches.is_empty(), "the idle run made a batch");
    let (plain_s, ours_s) = (super::bench::median(plain), super::bench::median(ours));
    let rate = |s: f64| total as f64 / s;
    println!("| measure ({total} records, {partitions} partitions, median of {rounds}) | |");
    println!("|---|---|");
    println!(
        "| plain consumer (rskafka fetch, arrow-json, same SQL, Parquet out) | {plain_s:.3} s, {:.0} records/s |",
        rate(plain_s)
    );
    println!(
        "| sluice run (plan + operate + commit) | {ours_s:.3} s, {:.0} records/s |",
        rate(ours_s)
    );
    println!(
        "| **ratio sluice / plain consumer** (goal >= 0.8) | **{:.2}** |",
        plain_s / ours_s
    );
    println!(
        "| idle run | {idle_ms:.1} ms, {} storage requests (and the Kafka requests: docs/kafka.md) |",
        idle.requests.total()
    );
    Ok(())
}

/// Produce `records` JSON rides round-robin into the partitions, in
/// requests of [`PRODUCE_BATCH`]; then one record per partition alone
/// (the test broker answers ListOffsets wrongly after a request of several
/// records: tests/kafka_stand.py). Returns each partition's end offset.
async fn produce(
    client: &Client,
    topic: &str,
    records: u64,
    partitions: i32,
) -> anyhow::Result<BTreeMap<i32, i64>> {
    let mut ends = BTreeMap::new();
    let per = records / partitions as u64;
    for p in 0..partitions {
        let pc = partition(client, topic, p).await?;
        let mut i = p as u64 * per;
        let last = i + per;
        while i < last {
            let n = PRODUCE_BATCH.min(last - i);
            let batch = if n > 1 {
                n - u64::from(i + n == last)
            } else {
                n
            };
            let rs: Vec<Record> = (i..i + batch).map(ride).collect();
            pc.produce(rs, Compression::NoCompression).await?;
            i += batch;
        }
        ends.insert(p, pc.get_offset(OffsetAt::Latest).await?);
    }
    Ok(ends)
}

/// One ride as a record.
fn ride(i: u64) -> Record {
    let value = serde_json::json!({
        "ride_id": i,
        "zone": format!("z{}", i % 263),
        "fare": (i % 97) as f64 * 0.75,
        "tip": (i % 13) as f64 * 0.5,
    });
    Record {
        key: Some(i.to_string().into_bytes()),
        value: Some(value.to_string().into_bytes()),
        headers: BTreeMap::new(),
        timestamp: chrono::Utc::now(),
    }
}

async fn partition(client: &Client, topic: &str, p: i32) -> anyhow::Result<PartitionClient> {
    Ok(client
        .partition_client(topic, p, UnknownTopicHandling::Retry)
        .await?)
}

/// The plain consumer: fetch every partition's `[0, end)`, decode the
/// values as JSON Lines into Arrow (schema inferred from them, as Sluice
/// infers it), run [`SQL`] and write Parquet under `out`. Seconds taken.
async fn plain_consumer(
    client: &Client,
    topic: &str,
    ends: &BTreeMap<i32, i64>,
    out: &Path,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut text = Vec::new();
    for (p, end) in ends {
        let pc = partition(client, topic, *p).await?;
        let mut at = 0;
        while at < *end {
            let (records, _) = pc.fetch_records(at, 1..(8 << 20), 100).await?;
            for r in records.into_iter().filter(|r| r.offset < *end) {
                at = r.offset + 1;
                text.extend(r.record.value.unwrap_or_default());
                text.push(b'\n');
            }
        }
    }
    let mut cursor = std::io::Cursor::new(&text);
    let (schema, _) = infer_json_schema_from_seekable(&mut cursor, Some(1000))?;
    let schema = Arc::new(schema);
    let reader = ReaderBuilder::new(schema.clone()).build(std::io::Cursor::new(&text))?;
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    let parts = std::thread::available_parallelism().map_or(2, |n| n.get());
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(parts));
    ctx.register_table("rides", Arc::new(MemTable::try_new(schema, vec![batches])?))?;
    ctx.sql(SQL)
        .await?
        .write_parquet(
            out.to_str().expect("utf-8 path"),
            DataFrameWriteOptions::new(),
            None,
        )
        .await?;
    Ok(started.elapsed().as_secs_f64())
}

fn pipeline_toml(round: usize, bootstrap: &str, topic: &str) -> String {
    format!(
        r#"name = "kbench{round}"
[source]
uri = "kafka://{bootstrap}/{topic}"
format = "jsonl"
table = "rides"
[query]
sql = "{SQL}"
[sink]
uri = "out/sluice-{round}"
[checkpoint]
uri = "out/checkpoint-{round}"
[limits]
max_records_per_batch = 1000000000
max_records_per_task = 1000000000
"#
    )
}
