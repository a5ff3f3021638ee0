//! `sluice bench --source kinesis`: records per second of a sluice run
//! reading a Kinesis stream into Parquet, against a plain reader in the
//! same process that reads the same shards with the AWS SDK (every shard at
//! once, 10,000 records a call, 200 ms between calls on a shard as
//! Kinesis' 5 reads a second per shard allow, as Sluice does), decodes the
//! same JSON data into Arrow, runs the same SQL with DataFusion and writes
//! the same Parquet. Prints ratios measured in this one run; also the idle
//! run. Needs a Kinesis endpoint (`AWS_ENDPOINT_URL`: the test stand,
//! tests/kinesis_stand.py); nothing here is a pass/fail test.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};
use datafusion::arrow::json::ReaderBuilder;
use datafusion::arrow::json::reader::infer_json_schema_from_seekable;
use datafusion::dataframe::DataFrameWriteOptions;
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use sluice_engine::runner;

const SQL: &str = "SELECT ride_id, zone, fare, tip, fare + tip AS total FROM rides WHERE fare > 3";

/// Records per PutRecords call (Kinesis' most).
const PUT_BATCH: u64 = 500;

/// Run the Kinesis benchmark: `records` records in `shards` shards.
pub async fn run(dir: &Path, records: u64, shards: i32, rounds: usize) -> anyhow::Result<()> {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    anyhow::ensure!(
        sdk.endpoint_url().is_some(),
        "--source kinesis writes a stream of {records} records: set AWS_ENDPOINT_URL to a test \
         stand (tests/kinesis_stand.py), not a real account"
    );
    let client = aws_sdk_kinesis::Client::new(&sdk);
    let stream = format!("sluice-bench-{}", std::process::id());
    client
        .create_stream()
        .stream_name(&stream)
        .shard_count(shards)
        .send()
        .await?;
    println!("putting {records} records into {shards} shards of {stream}");
    put(&client, &stream, records).await?;
    let (mut plain, mut ours) = (Vec::new(), Vec::new());
    let mut last = None;
    for round in 0..rounds.max(1) {
        let out = dir.join(format!("plain-{round}"));
        plain.push(plain_reader(&client, &stream, &out).await?);
        let toml = pipeline_toml(round, &stream);
        let (secs, ctx) = super::bench::full_run(&toml, dir, records).await?;
        ours.push(secs);
        last = Some(ctx);
    }
    let ctx = last.expect("one round");
    let started = Instant::now();
    let calls_before = sluice_engine::discovery::kinesis_calls_made();
    let idle = runner::run(&ctx, |_| {}).await?;
    let idle_ms = started.elapsed().as_secs_f64() * 1000.0;
    // Nothing else in this process calls Kinesis meanwhile.
    let idle_calls = sluice_engine::discovery::kinesis_calls_made() - calls_before;
    anyhow::ensure!(idle.batches.is_empty(), "the idle run made a batch");
    let (plain_s, ours_s) = (super::bench::median(plain), super::bench::median(ours));
    let rate = |s: f64| records as f64 / s;
    println!("| measure ({records} records, {shards} shards, median of {rounds}) | |");
    println!("|---|---|");
    println!(
        "| plain reader (AWS SDK GetRecords, arrow-json, same SQL, Parquet out) | {plain_s:.3} s, {:.0} records/s |",
        rate(plain_s)
    );
    println!(
        "| sluice run (plan + operate + commit) | {ours_s:.3} s, {:.0} records/s |",
        rate(ours_s)
    );
    println!(
        "| **ratio sluice / plain reader** (goal >= 0.8) | **{:.2}** |",
        plain_s / ours_s
    );
    println!(
        "| idle run | {idle_ms:.1} ms, {} storage requests, {idle_calls} Kinesis calls (docs/kinesis.md: 1 ListShards + 2 a shard) |",
        idle.requests.total()
    );
    Ok(())
}

/// Put `records` JSON rides, spread over the shards by partition key.
async fn put(client: &aws_sdk_kinesis::Client, stream: &str, records: u64) -> anyhow::Result<()> {
    let mut i = 0;
    while i < records {
        let n = PUT_BATCH.min(records - i);
        let entries = (i..i + n)
            .map(|k| {
                PutRecordsRequestEntry::builder()
                    .partition_key(format!("ride-{k}"))
                    .data(Blob::new(ride(k).into_bytes()))
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let out = client
            .put_records()
            .stream_name(stream)
            .set_records(Some(entries))
            .send()
            .await?;
        anyhow::ensure!(
            out.failed_record_count().unwrap_or(0) == 0,
            "the stand refused records"
        );
        i += n;
    }
    Ok(())
}

/// One ride as JSON.
fn ride(i: u64) -> String {
    serde_json::json!({
        "ride_id": i,
        "zone": format!("z{}", i % 263),
        "fare": (i % 97) as f64 * 0.75,
        "tip": (i % 13) as f64 * 0.5,
    })
    .to_string()
}

/// The plain reader: every shard from its trim horizon to its tip, at
/// once; the data as JSON Lines into Arrow (schema inferred from them, as
/// Sluice infers it), [`SQL`], Parquet under `out`. Seconds taken.
async fn plain_reader(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    out: &Path,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let shards = client
        .list_shards()
        .stream_name(stream)
        .send()
        .await?
        .shards()
        .to_vec();
    let reads = shards.into_iter().map(|s| {
        let (client, stream) = (client.clone(), stream.to_string());
        tokio::spawn(async move {
            let mut text = Vec::new();
            let mut it = client
                .get_shard_iterator()
                .stream_name(&stream)
                .shard_id(s.shard_id())
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await?
                .shard_iterator()
                .map(str::to_string);
            let mut first = true;
            while let Some(i) = it {
                if !first {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                first = false;
                let page = client
                    .get_records()
                    .shard_iterator(i)
                    .limit(10_000)
                    .send()
                    .await?;
                for r in page.records() {
                    text.extend_from_slice(r.data().as_ref());
                    text.push(b'\n');
                }
                let caught_up =
                    page.millis_behind_latest() == Some(0) && page.records().len() < 10_000;
                it = if caught_up {
                    None
                } else {
                    page.next_shard_iterator().map(str::to_string)
                };
            }
            Ok::<_, anyhow::Error>(text)
        })
    });
    let mut text = Vec::new();
    for read in futures::future::join_all(reads).await {
        text.extend(read??);
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

fn pipeline_toml(round: usize, stream: &str) -> String {
    format!(
        r#"name = "kibench{round}"
[source]
uri = "kinesis://{stream}"
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
