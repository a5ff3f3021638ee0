//! CloudWatch Embedded Metric Format: one JSON log line per event that
//! CloudWatch Logs turns into metrics, namespace `Sluice`, per `Pipeline`
//! and over all pipelines (no dimension, what the template's alarm and
//! dashboard read). The committer writes a batch's line (duration, rows, files,
//! bytes, late and quarantined rows, its cost); the planner writes the lag
//! when it looks for new input (files and bytes waiting, age of the oldest
//! waiting file). On Lambda the lines go to stdout (the function's log);
//! elsewhere nowhere unless a sink is set ([`Metrics`]).

use std::sync::Arc;

use serde_json::{Map, Value, json};

/// Where a context's metric lines go: on Lambda, stdout.
pub type Metrics = Arc<dyn Fn(&str) + Send + Sync>;

/// The namespace of every metric.
pub const NAMESPACE: &str = "Sluice";

/// Stdout when running as a Lambda function (`AWS_LAMBDA_FUNCTION_NAME`
/// set), else none.
pub fn from_env() -> Option<Metrics> {
    std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").map(|_| {
        Arc::new(|line: &str| {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
        }) as Metrics
    })
}

/// A metric: name, CloudWatch unit, value.
pub type Metric = (&'static str, &'static str, f64);

/// One EMF document: `metrics` under namespace `Sluice` with the
/// `Pipeline` dimension, and `fields` as more root members (not metrics).
pub fn line(
    pipeline: &str,
    timestamp_ms: i64,
    metrics: &[Metric],
    fields: &[(&str, Value)],
) -> String {
    line_with(
        pipeline,
        timestamp_ms,
        metrics,
        fields,
        &[&["Pipeline"], &[]],
    )
}

/// [`line`] with these dimension sets (`[]`: the metric over every
/// pipeline, which the template's alarms and dashboard read).
fn line_with(
    pipeline: &str,
    timestamp_ms: i64,
    metrics: &[Metric],
    fields: &[(&str, Value)],
    dimensions: &[&[&str]],
) -> String {
    let mut root = Map::new();
    root.insert(
        "_aws".into(),
        json!({
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": dimensions,
                "Metrics": metrics
                    .iter()
                    .map(|(name, unit, _)| json!({"Name": name, "Unit": unit}))
                    .collect::<Vec<_>>(),
            }],
        }),
    );
    root.insert("Pipeline".into(), Value::from(pipeline));
    for (name, _, value) in metrics {
        root.insert((*name).into(), json!(value));
    }
    for (k, v) in fields {
        root.insert((*k).into(), v.clone());
    }
    Value::Object(root).to_string()
}

/// The line for a committed batch.
pub fn batch_line(c: &crate::checkpoint::Commit, pipeline: &str) -> String {
    let d = &c.durations;
    let bill = crate::cost::commit_bill(c, &crate::cost::Prices::default_table());
    let mut metrics = vec![
        (
            "BatchDuration",
            "Milliseconds",
            (d.plan_ms + d.operate_ms + d.commit_ms) as f64,
        ),
        ("RowsIn", "Count", c.rows_in as f64),
        ("RowsOut", "Count", c.rows_out as f64),
        ("Files", "Count", c.files as f64),
        ("BytesRead", "Bytes", c.bytes_read as f64),
        (
            "LateRows",
            "Count",
            c.stateful.as_ref().map_or(0, |s| s.late_rows) as f64,
        ),
        (
            "DuplicateRows",
            "Count",
            c.stateful.as_ref().map_or(0, |s| s.duplicates) as f64,
        ),
        (
            "QuarantinedRows",
            "Count",
            c.rejected.iter().map(|r| r.rows).sum::<u64>() as f64,
        ),
        ("QuarantinedFiles", "Count", c.quarantined.len() as f64),
        ("BatchCost", "None", bill.total()),
    ];
    if let Some(s) = &c.stream {
        // A record stream's batch: the offsets it read (transaction
        // markers included), and those lost before they were read.
        metrics.push(("RecordsRead", "Count", s.records() as f64));
        if s.shards.is_empty() {
            let lost: u64 = s.lost.iter().map(|r| r.len()).sum();
            metrics.push(("RecordsLost", "Count", lost as f64));
        } else {
            // A Kinesis batch: lost records cannot be counted, the shards
            // that lost some can; and the calls refused for throughput,
            // and the calls its tasks made.
            metrics.push(("ShardsWithLoss", "Count", s.lost_shards.len() as f64));
            let refused = s.throttled + s.read.iter().map(|r| r.throttled).sum::<u64>();
            metrics.push(("ThrottledRequests", "Count", refused as f64));
            let calls: u64 = s.requests + s.read.iter().map(|r| r.requests).sum::<u64>();
            metrics.push(("KinesisRequests", "Count", calls as f64));
        }
    }
    line(
        pipeline,
        c.committed_ms,
        &metrics,
        &[
            ("batch", json!(c.batch)),
            ("epoch", json!(c.epoch)),
            ("trigger", json!(c.trigger)),
        ],
    )
}

/// The lag line of a record stream: the records (offsets) waiting up to
/// the ends the run captured. (The age of the oldest one is not known
/// without reading it: `sluice show` reads it.)
/// `idle_calls`: a Kinesis run that found nothing, its calls and those
/// refused for throughput (a run that plans counts them in its batch).
pub fn stream_lag_line(
    pipeline: &str,
    now_ms: i64,
    records: u64,
    idle_calls: Option<(u64, u64)>,
) -> String {
    let mut metrics = vec![("RecordsWaiting", "Count", records as f64)];
    if let Some((calls, refused)) = idle_calls {
        metrics.push(("KinesisRequests", "Count", calls as f64));
        metrics.push(("ThrottledRequests", "Count", refused as f64));
    }
    line(pipeline, now_ms, &metrics, &[])
}

/// The lag line: files and bytes waiting, and the age of the oldest
/// waiting file (0 with none).
pub fn lag_line(
    pipeline: &str,
    now_ms: i64,
    files: u64,
    bytes: u64,
    oldest_ms: Option<i64>,
) -> String {
    let age_s = oldest_ms.map_or(0.0, |t| ((now_ms - t).max(0)) as f64 / 1000.0);
    line(
        pipeline,
        now_ms,
        &[
            ("FilesWaiting", "Count", files as f64),
            ("BytesWaiting", "Bytes", bytes as f64),
            ("OldestWaitingAge", "Seconds", age_s),
        ],
        &[],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record stream's batch line counts the offsets it read and those
    /// its record says were lost (no test broker here can delete records,
    /// so no run loses any).
    #[test]
    fn a_stream_batch_line_counts_records_read_and_lost() {
        let record: crate::checkpoint::Commit = serde_json::from_value(json!({
            "format_version": 1, "batch": 3, "epoch": 1, "history": "h",
            "committed_ms": 1_764_680_400_000i64, "files": 0, "bytes_read": 10,
            "rows_in": 7, "rows_out": 7, "outputs": [],
            "durations": {"plan_ms": 1, "operate_ms": 2, "task_max_ms": 2, "merge_max_ms": 0, "commit_ms": 3},
            "requests": crate::storage::RequestCounts::default(), "input_keys": [],
            "stream": {
                "next": {"0": 12, "1": 4},
                "ranges": [{"partition": 0, "start": 5, "end": 12}],
                "lost": [{"partition": 0, "start": 2, "end": 5}, {"partition": 1, "start": 0, "end": 4}],
            },
        }))
        .expect("a commit record");
        let line: Value = serde_json::from_str(&batch_line(&record, "p")).unwrap();
        assert_eq!(line["RecordsRead"], 7.0);
        assert_eq!(line["RecordsLost"], 7.0);
        let names: Vec<&str> = line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["Name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"RecordsRead") && names.contains(&"RecordsLost"));
        // A Kinesis batch's line counts refusals, calls and shards that
        // lost records, not lost records (Kinesis cannot count them).
        let kinesis: crate::checkpoint::Commit = serde_json::from_value(json!({
            "format_version": 1, "batch": 3, "epoch": 1, "history": "h",
            "committed_ms": 1_764_680_400_000i64, "files": 0, "bytes_read": 10,
            "rows_in": 7, "rows_out": 7, "outputs": [],
            "durations": {"plan_ms": 1, "operate_ms": 2, "task_max_ms": 2, "merge_max_ms": 0, "commit_ms": 3},
            "requests": crate::storage::RequestCounts::default(), "input_keys": [],
            "stream": {
                "next": {}, "ranges": [], "throttled": 2, "requests": 4,
                "shards": [{"shard": "s0", "limit": 10}, {"shard": "s1", "limit": 10}],
                "read": [
                    {"shard": "s0", "records": 5, "bytes": 50, "throttled": 1, "requests": 3},
                    {"shard": "s1", "records": 2, "bytes": 20, "requests": 2},
                ],
                "lost_shards": [{"shard": "s1", "after": "9", "message": "expired"}],
            },
        }))
        .expect("a Kinesis commit record");
        let line: Value = serde_json::from_str(&batch_line(&kinesis, "p")).unwrap();
        assert_eq!(line["RecordsRead"], 7.0);
        assert_eq!(line["ThrottledRequests"], 3.0);
        assert_eq!(line["KinesisRequests"], 9.0);
        assert_eq!(line["ShardsWithLoss"], 1.0);
        assert!(line.get("RecordsLost").is_none());
        // A file batch's line has neither.
        let mut files = record.clone();
        files.stream = None;
        let line: Value = serde_json::from_str(&batch_line(&files, "p")).unwrap();
        assert!(line.get("RecordsRead").is_none() && line.get("RecordsLost").is_none());
    }
}
