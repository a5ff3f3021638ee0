//! What runs cost, from what they used: Lambda (GB-seconds and requests),
//! Step Functions (state transitions), S3 (requests by class) and, for a
//! Kinesis source in on-demand mode, the data its reads retrieved, priced
//! from a price table (`engine/prices/us-east-1.toml` by default, any file
//! of the same shape with `sluice cost --prices`), and the always-on Spark
//! job Sluice replaces, for comparison. The free tier is left out.

use serde::Deserialize;

use crate::checkpoint::Usage;
use crate::storage::RequestCounts;

/// The default price table: us-east-1 list prices.
pub const DEFAULT_PRICES: &str = include_str!("../prices/us-east-1.toml");

/// A price table (see `engine/prices/us-east-1.toml` for each field).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    /// Lambda.
    pub lambda: LambdaPrices,
    /// Step Functions.
    pub step_functions: StepFunctionsPrices,
    /// S3 requests.
    pub s3: S3Prices,
    /// EMR Serverless, for the always-on comparison.
    pub emr_serverless: EmrPrices,
    /// The always-on job compared against.
    pub always_on: AlwaysOn,
    /// Kinesis Data Streams (optional in a table: the built-in prices).
    #[serde(default)]
    pub kinesis: KinesisPrices,
}

/// What a run's reads add to a Kinesis stream's bill. A provisioned stream
/// bills shard-hours, which are the stream's whether Sluice reads it or
/// not, and GetRecords is free: a run adds nothing. An on-demand stream
/// bills every GB read.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KinesisPrices {
    /// On-demand capacity mode: per GB of data retrieved.
    pub on_demand_per_gb_retrieved: f64,
}

impl Default for KinesisPrices {
    fn default() -> Self {
        Prices::default_table().kinesis
    }
}

/// Lambda prices.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LambdaPrices {
    /// `arm64` or `x86_64`: which GB-second price applies.
    pub architecture: String,
    /// Per GB-second, arm64.
    pub arm64_per_gb_second: f64,
    /// Per GB-second, x86_64.
    pub x86_64_per_gb_second: f64,
    /// Per invocation.
    pub per_request: f64,
}

/// Step Functions prices.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepFunctionsPrices {
    /// Standard workflows, per state transition.
    pub standard_per_transition: f64,
    /// Express workflows, per request.
    pub express_per_request: f64,
    /// Express workflows, per GB-second.
    pub express_per_gb_second: f64,
}

/// S3 request prices.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Prices {
    /// PUT, COPY, POST, LIST per 1,000.
    pub put_copy_post_list_per_1000: f64,
    /// GET, HEAD and other reads per 1,000.
    pub get_head_per_1000: f64,
}

/// EMR Serverless prices.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmrPrices {
    /// Per vCPU-hour.
    pub per_vcpu_hour: f64,
    /// Per GB-hour of memory.
    pub per_gb_hour: f64,
}

/// The always-on Spark job.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlwaysOn {
    /// Driver and executors.
    pub workers: u32,
    /// vCPU of each.
    pub vcpu_per_worker: f64,
    /// Memory of each, GB.
    pub gb_per_worker: f64,
    /// Hours in a month.
    pub hours_per_month: f64,
}

impl Prices {
    /// Parse a price table; `what` names it in errors.
    pub fn parse(text: &str, what: &str) -> Result<Prices, String> {
        let p: Prices = toml::from_str(text).map_err(|e| format!("{what}: {e}"))?;
        if !matches!(p.lambda.architecture.as_str(), "arm64" | "x86_64") {
            return Err(format!(
                "{what}: lambda.architecture is \"{}\"; write \"arm64\" or \"x86_64\"",
                p.lambda.architecture
            ));
        }
        Ok(p)
    }

    /// The default table (us-east-1).
    pub fn default_table() -> Prices {
        Prices::parse(DEFAULT_PRICES, "engine/prices/us-east-1.toml")
            .expect("the built-in price table parses")
    }

    /// Lambda's price per GB-second for the configured architecture.
    pub fn lambda_gb_second(&self) -> f64 {
        if self.lambda.architecture == "arm64" {
            self.lambda.arm64_per_gb_second
        } else {
            self.lambda.x86_64_per_gb_second
        }
    }

    /// The always-on job's price per hour.
    pub fn always_on_hourly(&self) -> f64 {
        let a = &self.always_on;
        let e = &self.emr_serverless;
        a.workers as f64 * (a.vcpu_per_worker * e.per_vcpu_hour + a.gb_per_worker * e.per_gb_hour)
    }

    /// The always-on job's price per month.
    pub fn always_on_monthly(&self) -> f64 {
        self.always_on_hourly() * self.always_on.hours_per_month
    }
}

/// Dollars, split by service.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Bill {
    /// Lambda: GB-seconds and requests.
    pub lambda: f64,
    /// Step Functions: state transitions.
    pub step_functions: f64,
    /// S3: requests.
    pub s3: f64,
    /// Kinesis: data an on-demand stream's reads retrieved.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kinesis: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl Bill {
    /// All of it.
    pub fn total(&self) -> f64 {
        self.lambda + self.step_functions + self.s3 + self.kinesis
    }

    /// Sum of two bills.
    pub fn plus(&self, o: &Bill) -> Bill {
        Bill {
            lambda: self.lambda + o.lambda,
            step_functions: self.step_functions + o.step_functions,
            s3: self.s3 + o.s3,
            kinesis: self.kinesis + o.kinesis,
        }
    }
}

/// GB-seconds of `billed_ms` at `memory_mb`.
pub fn gb_seconds(billed_ms: u64, memory_mb: u64) -> f64 {
    (billed_ms as f64 / 1000.0) * (memory_mb as f64 / 1024.0)
}

/// The bill for `usage` and `requests` at `prices`.
pub fn bill(usage: &Usage, requests: &RequestCounts, prices: &Prices) -> Bill {
    let gb_s: f64 = usage
        .functions
        .iter()
        .map(|f| gb_seconds(f.billed_ms, f.memory_mb))
        .sum();
    let invocations: u64 = usage.functions.iter().map(|f| f.invocations).sum();
    let lambda = gb_s * prices.lambda_gb_second() + invocations as f64 * prices.lambda.per_request;
    let sfn = &prices.step_functions;
    let express = &usage.express;
    let step_functions = usage.transitions as f64 * sfn.standard_per_transition
        + express.executions as f64 * sfn.express_per_request
        + gb_seconds(express.billed_ms, crate::deploy::EXPRESS_MEMORY_MB)
            * sfn.express_per_gb_second;
    // S3 bills a conditional write as a PUT; a DELETE is free.
    let put_class = requests.put + requests.put_create + requests.put_update + requests.list;
    let s3 = put_class as f64 / 1000.0 * prices.s3.put_copy_post_list_per_1000
        + requests.get as f64 / 1000.0 * prices.s3.get_head_per_1000;
    Bill {
        lambda,
        step_functions,
        s3,
        kinesis: 0.0,
    }
}

/// What reading a batch's records added to its Kinesis stream's bill: the
/// bytes its tasks read, at the on-demand price if the stream was in
/// on-demand mode when the run looked (a provisioned stream's reads add
/// nothing). The plan's own reads (the look at each shard's newest
/// records) are not counted: a few records a shard.
pub fn kinesis_bill(stream: Option<&crate::checkpoint::StreamPlan>, prices: &Prices) -> f64 {
    match stream {
        Some(s) if s.on_demand => {
            kinesis_bytes(Some(s)) as f64 / GB * prices.kinesis.on_demand_per_gb_retrieved
        }
        _ => 0.0,
    }
}

/// The bytes a batch's tasks read from Kinesis (record data).
pub fn kinesis_bytes(stream: Option<&crate::checkpoint::StreamPlan>) -> u64 {
    stream.map_or(0, |s| s.read.iter().map(|r| r.bytes).sum())
}

/// A GB, as AWS bills data.
const GB: f64 = 1024.0 * 1024.0 * 1024.0;

/// One batch's usage and bill.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BatchCost {
    /// Batch number.
    pub batch: u64,
    /// The run (lease epoch) that committed it.
    pub epoch: u64,
    /// When (ms since the Unix epoch).
    pub committed_ms: i64,
    /// Input files.
    pub files: u64,
    /// Rows read.
    pub rows_in: u64,
    /// Rows written.
    pub rows_out: u64,
    /// Lambda GB-seconds.
    pub gb_seconds: f64,
    /// Lambda invocations.
    pub invocations: u64,
    /// State transitions.
    pub transitions: u64,
    /// `standard` or `express`: the kind of execution that ran the batch.
    /// (An Express batch's Step Functions cost is its execution's
    /// duration, billed with the run's ending.)
    pub workflow: crate::deploy::Workflow,
    /// Storage requests.
    pub requests: RequestCounts,
    /// Kinesis: bytes read, and whether the stream was on-demand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinesis: Option<KinesisRead>,
    /// Dollars.
    pub bill: Bill,
}

/// What a batch read from a Kinesis stream.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct KinesisRead {
    /// Shards its tasks read.
    pub shards: u64,
    /// Record data read.
    pub bytes: u64,
    /// Calls made for the batch (its plan's and its tasks').
    pub requests: u64,
    /// The stream's capacity mode when the run looked was on-demand.
    pub on_demand: bool,
}

/// What `sluice cost` prints: the batches' bills, per batch and per run,
/// the month at an arrival rate, the always-on job, and the break-even
/// rate.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The price table used.
    pub prices: String,
    /// Always "not included".
    pub free_tier: &'static str,
    /// The batches priced, oldest first.
    pub batches: Vec<BatchCost>,
    /// Runs (lease epochs) among them.
    pub runs: u64,
    /// All of the batches' bills.
    pub batches_bill: Bill,
    /// The mean cost per committed batch of its work after its record
    /// (publishing, manifest, index, control, pruning: S3 requests), over
    /// every batch committed so far.
    pub after_commit: Bill,
    /// The mean cost of a run outside its batches, over every run ended
    /// so far: its ending (the last Plan invocation, its transitions and
    /// requests) and the trigger invocations that wrote control.
    pub run_end: Bill,
    /// Mean dollars per batch: its record's bill and the mean work after it.
    pub per_batch: f64,
    /// Mean dollars per run: its batches and its share outside them.
    pub per_run: f64,
    /// Seconds between runs used for the month: observed (first to last
    /// commit over the runs) or given (`--every`).
    pub interval_s: Option<f64>,
    /// `observed` or `given`.
    pub interval_from: &'static str,
    /// Why no interval was observed (too few runs, or runs back to back):
    /// the month is projected only at a given interval then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_note: Option<String>,
    /// Runs in a month at that interval.
    pub runs_per_month: Option<f64>,
    /// Seconds between arrivals of data when runs come more often than
    /// data (`--data-every`: a schedule that often finds nothing); `None`
    /// when every run finds data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_interval_s: Option<f64>,
    /// Of `runs_per_month`, those that find data (all of them without a
    /// data interval).
    pub data_runs_per_month: Option<f64>,
    /// Of `runs_per_month`, those that find nothing.
    pub idle_runs_per_month: Option<f64>,
    /// What a run that finds nothing costs: see `idle_from`.
    pub idle_run: Bill,
    /// What `idle_run` is made of: `idle runs` (the mean of the runs
    /// recorded as idle, and their trigger), `Plan endings` (the mean
    /// ending made by a Plan that found nothing left, as an idle run's
    /// Plan does, and its trigger), or `estimated` (none of those
    /// recorded, as when every run ended at its last commit: the mean
    /// ending, plus one Plan invocation at the batches' mean planner
    /// duration and its idle check, one control read and one listing).
    pub idle_from: &'static str,
    /// Dollars in a month at that interval: the runs that find data at
    /// `per_run`, the idle ones at `idle_run`.
    pub month: Option<f64>,
    /// The always-on job, per hour and per month.
    pub always_on_hourly: f64,
    /// The always-on job per month.
    pub always_on_month: f64,
    /// Runs per hour at which Sluice costs as much as the always-on job.
    pub break_even_runs_per_hour: Option<f64>,
}

/// How often runs come, and data with them, when given (`sluice cost
/// --every`, `--data-every`) instead of observed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rate {
    /// Seconds between runs (a schedule, or one upload every so often).
    pub every_s: Option<f64>,
    /// Seconds between arrivals of data, when longer than between runs:
    /// the runs in between find nothing.
    pub data_every_s: Option<f64>,
}

/// Price `commits` (any order) with `prices`; `totals` give what is in no
/// commit record (work after each record, runs' endings, triggers), as
/// means over all batches and runs so far; `rate` overrides the observed
/// interval between runs and adds idle runs between arrivals of data.
pub fn report(
    commits: &[crate::checkpoint::Commit],
    totals: &crate::checkpoint::Totals,
    prices: &Prices,
    prices_name: &str,
    rate: Rate,
) -> Report {
    let mut batches: Vec<BatchCost> = commits.iter().map(|c| batch_cost(c, prices)).collect();
    batches.sort_by_key(|b| b.batch);
    let mut epochs: Vec<u64> = batches.iter().map(|b| b.epoch).collect();
    epochs.sort();
    epochs.dedup();
    let runs = epochs.len() as u64;
    let batches_bill = batches
        .iter()
        .fold(Bill::default(), |acc, b| acc.plus(&b.bill));
    let ends = bill(&totals.run_ends, &totals.run_end_requests, prices).plus(&bill(
        &totals.wakes,
        &totals.wake_requests,
        prices,
    ));
    let run_end = mean(ends, totals.runs);
    let after_commit = mean(
        bill(&Usage::default(), &totals.after_commits, prices),
        totals.batches,
    );
    let per_batch = if batches.is_empty() {
        0.0
    } else {
        batches_bill.total() / batches.len() as f64 + after_commit.total()
    };
    let per_run = if runs == 0 {
        0.0
    } else {
        (batches_bill.total() + after_commit.total() * batches.len() as f64) / runs as f64
            + run_end.total()
    };
    // Observed: the median gap between the runs' first commits. A mean
    // over the span would be thrown by a burst (runs back to back, as a
    // backlog or a demo makes them) and by a long pause alike.
    let (observed, interval_note) = observed_interval(&batches, &epochs);
    let (interval_s, interval_from, interval_note) = match rate.every_s {
        Some(s) => (Some(s), "given", None),
        None => (observed, "observed", interval_note),
    };
    let month_s = prices.always_on.hours_per_month * 3600.0;
    let runs_per_month = interval_s.map(|s| month_s / s);
    // Data arriving less often than runs come leaves the runs in between
    // idle: each costs what a run's ending and its trigger cost.
    let data_interval_s = rate
        .data_every_s
        .filter(|d| interval_s.is_some_and(|s| *d > s));
    let data_runs_per_month =
        runs_per_month.map(|n| data_interval_s.map_or(n, |d| (month_s / d).min(n)));
    let idle_runs_per_month = runs_per_month.zip(data_runs_per_month).map(|(n, d)| n - d);
    // An idle run: its ending as recorded for executions that handed out
    // no batch (on AWS, a trigger's run that found nothing), else the mean
    // ending made by a Plan that found nothing left (a run that ended at
    // its last commit had no such Plan, which an idle run has), else the
    // mean ending; and its trigger's share.
    let wake = mean(
        bill(&totals.wakes, &totals.wake_requests, prices),
        totals.runs,
    );
    let (idle_run, idle_from) = if totals.idle_runs > 0 {
        let idle = mean(
            bill(&totals.idle_ends, &totals.idle_end_requests, prices),
            totals.idle_runs,
        );
        (idle.plus(&wake), "idle runs")
    } else if totals.plan_ends > 0 {
        let ended = mean(
            bill(&totals.plan_end_usage, &totals.plan_end_requests, prices),
            totals.plan_ends,
        );
        (ended.plus(&wake), "Plan endings")
    } else {
        (run_end.plus(&idle_plan(commits, prices)), "estimated")
    };
    let month = data_runs_per_month
        .zip(idle_runs_per_month)
        .map(|(d, i)| d * per_run + i * idle_run.total());
    Report {
        prices: prices_name.to_string(),
        free_tier: "not included",
        batches,
        runs,
        batches_bill,
        after_commit,
        run_end,
        per_batch,
        per_run,
        interval_s,
        interval_from,
        interval_note,
        runs_per_month,
        data_interval_s,
        data_runs_per_month,
        idle_runs_per_month,
        idle_run,
        idle_from,
        month,
        always_on_hourly: prices.always_on_hourly(),
        always_on_month: prices.always_on_monthly(),
        break_even_runs_per_hour: (per_run > 0.0).then(|| prices.always_on_hourly() / per_run),
    }
}

/// One commit's usage and its bill at `prices`.
fn batch_cost(c: &crate::checkpoint::Commit, prices: &Prices) -> BatchCost {
    BatchCost {
        batch: c.batch,
        epoch: c.epoch,
        committed_ms: c.committed_ms,
        files: c.files,
        rows_in: c.rows_in,
        rows_out: c.rows_out,
        gb_seconds: c
            .usage
            .functions
            .iter()
            .map(|f| gb_seconds(f.billed_ms, f.memory_mb))
            .sum(),
        invocations: c.usage.functions.iter().map(|f| f.invocations).sum(),
        transitions: c.usage.all_transitions(),
        workflow: if c.usage.express.transitions > 0 {
            crate::deploy::Workflow::Express
        } else {
            crate::deploy::Workflow::Standard
        },
        requests: c.requests,
        kinesis: c
            .stream
            .as_ref()
            .filter(|s| !s.shards.is_empty() || !s.read.is_empty())
            .map(|s| KinesisRead {
                shards: s.read.len() as u64,
                bytes: kinesis_bytes(Some(s)),
                requests: s.requests + s.read.iter().map(|r| r.requests).sum::<u64>(),
                on_demand: s.on_demand,
            }),
        bill: commit_bill(c, prices),
    }
}

/// What a batch's record says it cost: its Lambda, Step Functions and S3
/// use, and what its reads of an on-demand Kinesis stream retrieved.
pub fn commit_bill(c: &crate::checkpoint::Commit, prices: &Prices) -> Bill {
    Bill {
        kinesis: kinesis_bill(c.stream.as_ref(), prices),
        ..bill(&c.usage, &c.requests, prices)
    }
}

/// `b` shared over `n` (nothing over none).
/// What an idle run's Plan costs, where no such Plan was recorded: one
/// planner invocation at the mean duration and memory of the planner
/// invocations the batches record (each batch's Plan did more than an
/// idle check), and the idle check's requests (one control read and one
/// listing, as `tests/e2e/idle.rs` holds an idle run to).
fn idle_plan(commits: &[crate::checkpoint::Commit], prices: &Prices) -> Bill {
    let planner: Vec<&crate::checkpoint::FunctionUsage> = commits
        .iter()
        .flat_map(|c| &c.usage.functions)
        .filter(|f| f.function == crate::deploy::PLANNER && f.invocations > 0)
        .collect();
    let invocations: u64 = planner.iter().map(|f| f.invocations).sum();
    let functions = match planner.first() {
        Some(first) => vec![crate::checkpoint::FunctionUsage::new(
            crate::deploy::PLANNER,
            1,
            planner.iter().map(|f| f.billed_ms).sum::<u64>() / invocations.max(1),
            first.memory_mb,
        )],
        None => Vec::new(),
    };
    let usage = Usage {
        functions,
        ..Default::default()
    };
    let check = RequestCounts {
        get: 1,
        list: 1,
        ..Default::default()
    };
    bill(&usage, &check, prices)
}

fn mean(b: Bill, n: u64) -> Bill {
    if n == 0 {
        return Bill::default();
    }
    let n = n as f64;
    Bill {
        lambda: b.lambda / n,
        step_functions: b.step_functions / n,
        s3: b.s3 / n,
        kinesis: b.kinesis / n,
    }
}

/// Runs a month is projected from at the least: two gaps between them.
const MIN_RUNS_OBSERVED: usize = 3;

/// Gaps shorter than this are runs back to back, not an arrival rate.
const MIN_GAP_S: f64 = 1.0;

/// The interval between runs the commits show (the median gap between the
/// runs' first commits), or why none can be told.
fn observed_interval(batches: &[BatchCost], epochs: &[u64]) -> (Option<f64>, Option<String>) {
    let mut starts: Vec<i64> = epochs
        .iter()
        .filter_map(|e| {
            batches
                .iter()
                .filter(|b| b.epoch == *e)
                .map(|b| b.committed_ms)
                .min()
        })
        .collect();
    starts.sort();
    if starts.len() < MIN_RUNS_OBSERVED {
        return (
            None,
            Some(format!(
                "{} recorded: too few to tell how often runs come",
                if starts.len() == 1 {
                    "1 run".to_string()
                } else {
                    format!("{} runs", starts.len())
                }
            )),
        );
    }
    let mut gaps: Vec<f64> = starts
        .windows(2)
        .map(|w| (w[1] - w[0]) as f64 / 1000.0)
        .collect();
    gaps.sort_by(f64::total_cmp);
    let median = if gaps.len() % 2 == 1 {
        gaps[gaps.len() / 2]
    } else {
        (gaps[gaps.len() / 2 - 1] + gaps[gaps.len() / 2]) / 2.0
    };
    if median < MIN_GAP_S {
        return (
            None,
            Some(format!(
                "the runs recorded came back to back (a median of {median:.3} s apart): they tell \
                 nothing of how often data arrives"
            )),
        );
    }
    (Some(median), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::FunctionUsage;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} != {b}");
    }

    /// The figures: 1 driver + 1 executor of 4 vCPU / 16 GB on EMR
    /// Serverless: 8 x 0.052624 + 32 x 0.0057785 = 0.605904 $/hour, x 730
    /// = 442.30992 $/month.
    #[test]
    fn the_always_on_job_costs_about_442_a_month() {
        let p = Prices::default_table();
        close(p.always_on_hourly(), 0.605904);
        close(p.always_on_monthly(), 442.30992);
    }

    /// By hand: planner 1 x 12 ms at 1769 MB, operator 4 invocations
    /// 1,000 ms in all at 3008 MB, committer 1 x 40 ms at 1769 MB.
    /// GB-s = 0.012 x 1769/1024 + 1.0 x 3008/1024 + 0.040 x 1769/1024
    ///      = 0.020730469 + 2.9375 + 0.069101563 = 3.027332031;
    /// x 0.0000133334 = 0.0000403647..., + 6 requests x 0.0000002 =
    /// 0.0000012. 30 transitions x 0.000025 = 0.00075. S3: 10 PUT + 3
    /// create + 2 compare-and-swap + 5 LIST = 20 PUT-class: 0.0001; 100 GET:
    /// 0.00004; 7 DELETE: free.
    #[test]
    fn a_batch_is_billed_by_hand() {
        let usage = Usage {
            functions: vec![
                FunctionUsage::new("planner", 1, 12, 1769),
                FunctionUsage::new("operator", 4, 1000, 3008),
                FunctionUsage::new("committer", 1, 40, 1769),
            ],
            transitions: 30,
            ..Default::default()
        };
        let requests = RequestCounts {
            get: 100,
            put: 10,
            put_create: 3,
            put_update: 2,
            list: 5,
            delete: 7,
        };
        let b = bill(&usage, &requests, &Prices::default_table());
        let gb_s = 0.012 * 1769.0 / 1024.0 + 1.0 * 3008.0 / 1024.0 + 0.040 * 1769.0 / 1024.0;
        close(gb_s, 3.027_332_031_25);
        close(
            b.lambda,
            3.027_332_031_25 * 0.000_013_333_4 + 6.0 * 0.000_000_2,
        );
        close(b.step_functions, 0.000_75);
        close(b.s3, 0.000_1 + 0.000_04);
        close(b.total(), b.lambda + 0.000_75 + 0.000_14);
    }

    /// The first hour's case: six runs in quick succession projected "one
    /// run every 0 s". The median gap is robust to a burst and to one long
    /// pause; runs back to back give no interval. Hand-computed gaps.
    #[test]
    fn the_interval_between_runs_is_the_median_gap() {
        let cost = |epoch: u64, at_ms: i64| BatchCost {
            batch: epoch,
            epoch,
            committed_ms: at_ms,
            files: 1,
            rows_in: 1,
            rows_out: 1,
            gb_seconds: 0.0,
            invocations: 0,
            transitions: 0,
            workflow: Default::default(),
            requests: RequestCounts::default(),
            kinesis: None,
            bill: Bill::default(),
        };
        let at = |times: &[i64]| -> (Vec<BatchCost>, Vec<u64>) {
            let b: Vec<BatchCost> = times
                .iter()
                .enumerate()
                .map(|(i, t)| cost(i as u64 + 1, *t))
                .collect();
            let e = (1..=times.len() as u64).collect();
            (b, e)
        };
        // Gaps 300, 300, 300 s and one pause of 3 hours: the median is 300.
        let (b, e) = at(&[0, 300_000, 600_000, 900_000, 11_700_000]);
        assert_eq!(observed_interval(&b, &e).0, Some(300.0));
        // A burst of six runs 40 ms apart: no interval.
        let (b, e) = at(&[0, 40, 80, 120, 160, 200]);
        let (i, why) = observed_interval(&b, &e);
        assert_eq!(i, None);
        assert!(why.unwrap().contains("back to back"));
        // Gaps 10, 20, 30, 40 s: an even count's median is the mean of
        // the middle two, (20 + 30) / 2 = 25.
        let (b, e) = at(&[0, 10_000, 30_000, 60_000, 100_000]);
        assert_eq!(observed_interval(&b, &e).0, Some(25.0));
    }

    #[test]
    fn x86_and_bad_tables() {
        let x86 = DEFAULT_PRICES.replace("architecture = \"arm64\"", "architecture = \"x86_64\"");
        let p = Prices::parse(&x86, "x86.toml").unwrap();
        close(p.lambda_gb_second(), 0.000_016_666_7);
        let bad = DEFAULT_PRICES.replace("architecture = \"arm64\"", "architecture = \"sparc\"");
        let e = Prices::parse(&bad, "bad.toml").unwrap_err();
        assert!(e.contains("bad.toml") && e.contains("\"sparc\""), "{e}");
        let missing = DEFAULT_PRICES.replace("per_request = 0.0000002\n", "");
        let e = Prices::parse(&missing, "short.toml").unwrap_err();
        assert!(e.contains("short.toml") && e.contains("per_request"), "{e}");
    }

    /// Two runs of one batch each, ten minutes apart, each batch 7
    /// transitions and nothing else: $0.000175 per batch; two run endings
    /// of 3 transitions ($0.000075 each). Per run 0.00025; every 10
    /// minutes is 4,380 runs in a 730-hour month: $1.095; break-even with
    /// $0.605904 an hour at 2,423.616 runs an hour. Then the same with
    /// what no record holds: 2,000 PUTs after the two commits (1,000 a
    /// batch at $0.005: $0.005 more a batch), and two trigger invocations
    /// of 1,000 ms at 1,024 MB with 1,000 GETs in all ($0.0000166667 and
    /// $0.0000002 a GB-s and request; $0.0004 per 1,000 GETs): per run
    /// (2 GB-s, 2 invocations, 1,000 GETs) / 2 = $0.0002168667 more.
    fn every(s: f64) -> Rate {
        Rate {
            every_s: Some(s),
            data_every_s: None,
        }
    }

    #[test]
    fn a_report_by_hand() {
        use crate::checkpoint::{Commit, Totals};
        let commit = |batch: u64, epoch: u64, at_ms: i64| {
            let mut c: Commit = serde_json::from_value(serde_json::json!({
                "format_version": 1, "batch": batch, "epoch": epoch, "committed_ms": at_ms,
                "files": 1, "bytes_read": 10, "rows_in": 5, "rows_out": 5, "outputs": [],
                "durations": {"plan_ms": 0, "operate_ms": 0, "task_max_ms": 0, "commit_ms": 0},
                "requests": {"get": 0, "put": 0, "put_create": 0, "put_update": 0, "list": 0, "delete": 0},
                "input_keys": []
            }))
            .unwrap();
            c.usage.transitions = 7;
            c
        };
        let commits = [commit(1, 8, 600_000), commit(0, 7, 0)];
        // Two runs are too few to observe an interval: projected only at
        // a given one (checked below with three runs).
        let totals = Totals {
            runs: 2,
            run_ends: Usage {
                functions: Vec::new(),
                transitions: 6,
                ..Default::default()
            },
            ..Totals::default()
        };
        let p = Prices::default_table();
        let r = report(&commits, &totals, &p, "default", Rate::default());
        assert_eq!(r.runs, 2);
        assert_eq!(r.batches[0].batch, 0);
        close(r.per_batch, 0.000_175);
        close(r.run_end.total(), 0.000_075);
        close(r.per_run, 0.000_25);
        assert_eq!(r.interval_s, None);
        assert!(r.interval_note.as_deref().unwrap().contains("too few"));
        let every10 = report(&commits, &totals, &p, "default", every(600.0));
        close(every10.runs_per_month.unwrap(), 4380.0);
        close(every10.month.unwrap(), 1.095);
        close(r.break_even_runs_per_hour.unwrap(), 0.605_904 / 0.000_25);
        let given = report(&commits, &totals, &p, "default", every(300.0));
        assert_eq!(given.interval_from, "given");
        close(given.month.unwrap(), 2.19);
        // A schedule every 5 minutes with data once an hour: 8,760 runs,
        // 730 with data at $0.00025 and 8,030 idle at the ending's
        // $0.000075 and, as no idle run or Plan-made ending is recorded,
        // an idle Plan's check (one GET, $0.0000004, and one LIST,
        // $0.000005; these records name no planner invocation):
        // $0.0000804, so 0.1825 + 0.645612 = 0.828112.
        let scheduled = report(
            &commits,
            &totals,
            &p,
            "default",
            Rate {
                every_s: Some(300.0),
                data_every_s: Some(3600.0),
            },
        );
        close(scheduled.runs_per_month.unwrap(), 8760.0);
        close(scheduled.data_runs_per_month.unwrap(), 730.0);
        close(scheduled.idle_runs_per_month.unwrap(), 8030.0);
        close(scheduled.idle_run.total(), 0.000_080_4);
        assert_eq!(scheduled.idle_from, "estimated");
        close(scheduled.month.unwrap(), 0.828_112);
        // One of the runs ended with a Plan (its 4 transitions: $0.0001),
        // the other at its commit (2 transitions): an idle run, which
        // ends with a Plan, is priced from the Plan's ending alone.
        let mut planned = totals.clone();
        planned.plan_ends = 1;
        planned.plan_end_usage = Usage {
            functions: Vec::new(),
            transitions: 4,
            ..Default::default()
        };
        let by_plan = report(
            &commits,
            &planned,
            &p,
            "default",
            Rate {
                every_s: Some(300.0),
                data_every_s: Some(3600.0),
            },
        );
        close(by_plan.idle_run.total(), 0.000_1);
        assert_eq!(by_plan.idle_from, "Plan endings");
        close(by_plan.run_end.total(), 0.000_075);
        // Data as often as runs, or more often: every run finds data.
        for d in [300.0, 60.0] {
            let all = report(
                &commits,
                &totals,
                &p,
                "default",
                Rate {
                    every_s: Some(300.0),
                    data_every_s: Some(d),
                },
            );
            close(all.idle_runs_per_month.unwrap(), 0.0);
            close(all.month.unwrap(), 2.19);
        }
        let mut more = totals.clone();
        more.batches = 2;
        more.after_commits = RequestCounts {
            put: 2000,
            ..Default::default()
        };
        more.wakes = Usage {
            functions: vec![FunctionUsage::new("trigger", 2, 2000, 1024)],
            ..Default::default()
        };
        more.wake_requests = RequestCounts {
            get: 1000,
            ..Default::default()
        };
        let p86 = Prices {
            lambda: LambdaPrices {
                architecture: "x86_64".into(),
                ..p.lambda.clone()
            },
            ..p.clone()
        };
        let r = report(&commits, &more, &p86, "x86", Rate::default());
        close(r.after_commit.total(), 0.005);
        close(r.per_batch, 0.000_175 + 0.005);
        let trigger = 1.0 * 0.000_016_666_7 + 0.000_000_2 + 0.000_2;
        close(r.run_end.total(), 0.000_075 + trigger);
        close(r.per_run, 0.000_175 + 0.005 + 0.000_075 + trigger);
    }
}
