//! `sluice tune`: the memory each function should run with, from what its
//! invocations measured (the commit records' usage), with the projected
//! Lambda cost per run before and after.
//!
//! Lambda gives a function CPU in proportion to its memory: one vCPU at
//! 1,769 MB, about 1.7 at 3,008 MB, six at 10,240 MB, and a fraction below
//! 1,769 MB. So an invocation's time splits in two: the time it computes,
//! which shrinks as memory grows up to the threads it can use, and the
//! time it waits (on S3, on a broker), which memory does not change. Its
//! bill is memory x duration. A task that mostly computes costs about the
//! same at any memory up to what its threads use, and is faster with more;
//! a task that mostly waits costs in proportion to its memory and is no
//! faster with more. The measured CPU time over the billed time tells the
//! two apart (`FunctionUsage::cpu_ms`: the operator's tasks, the Plan that
//! handed out the batch, the commit).
//!
//! The model, for a function billed `B` ms with `C` ms of CPU time at `M`
//! MB: it uses `p = max(1, C / B)` threads at once; at memory `m` it
//! computes at `speed(m) = min(m / 1769, p)` vCPUs; so it computed for
//! `c = min(B, C / speed(M))` ms of `B` and waited `B - c`; at `m` its
//! duration would be `(B - c) + c * speed(M) / speed(m)`. The
//! recommendation is the cheapest memory among the usual sizes that keeps
//! the duration within 1.5 times today's and stays at or above a floor for
//! the data a task holds (256 MB and four times the largest batch's mean
//! input per task: decoded Parquet takes several times its file size).
//!
//! The batch and task limits ([`advise_limits`]): a task's time is fixed
//! work plus its bytes at a measured pace (fitted over the batches' mean
//! tasks); a task may grow until it would take [`TASK_TARGET_MS`] or its
//! data would not fit the operator's memory, and a batch to one wave of
//! the inline Map of such tasks, so a backlog takes fewer batches (each
//! costs its Plan and commit whatever its size) and stays in Express. The
//! cost of a run before and after comes from a model fitted to the
//! measured bills: a part per batch, per task, per byte and per file.

use serde::Serialize;

use crate::checkpoint::Commit;
use crate::cost::{Prices, gb_seconds};

/// Memory sizes considered, MB (1,769: one vCPU).
pub const SIZES: [u64; 7] = [128, 256, 512, 1024, 1769, 3008, 10240];

/// Memory at which a function has one vCPU, MB.
pub const ONE_VCPU_MB: f64 = 1769.0;

/// How much slower than today a recommendation may make a function.
pub const MAX_SLOWDOWN: f64 = 1.5;

/// What `sluice tune` says of one function.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tuning {
    /// `operator`, `planner`, `committer`.
    pub function: String,
    /// Its memory today, MB.
    pub memory_mb: u64,
    /// Invocations in the window.
    pub invocations: u64,
    /// Their billed duration, ms.
    pub billed_ms: u64,
    /// Their CPU time, ms (of the invocations it was measured for).
    pub cpu_ms: u64,
    /// CPU time over billed time of those invocations (above 1: several
    /// threads at once); `None`: not measured.
    pub cpu_share: Option<f64>,
    /// The memory to run it with, MB (`None`: nothing measured to say).
    pub recommended_mb: Option<u64>,
    /// Its duration there over today's (model).
    pub duration_factor: f64,
    /// Its Lambda cost a run today and at the recommendation, dollars.
    pub per_run_now: f64,
    /// At the recommendation.
    pub per_run_after: f64,
    /// Why, in words.
    pub why: String,
}

/// `sluice tune`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TuneReport {
    /// Batches read.
    pub batches: usize,
    /// Runs they belong to.
    pub runs: usize,
    /// Per function.
    pub functions: Vec<Tuning>,
    /// The floor for the operator's memory, MB.
    pub operator_floor_mb: u64,
    /// The batch and task limits (`None`: see `limits_note`).
    pub limits: Option<LimitsAdvice>,
    /// Why there is no limits advice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits_note: Option<String>,
}

/// Tune from `commits` (any order) at `prices`, for a pipeline with
/// `limits` and control's `pace` today.
pub fn tune(
    commits: &[Commit],
    prices: &Prices,
    limits: &crate::pipeline::Limits,
    pace: Option<&crate::checkpoint::TaskPace>,
) -> TuneReport {
    let mut runs: Vec<u64> = commits.iter().map(|c| c.epoch).collect();
    runs.sort();
    runs.dedup();
    let run_count = runs.len().max(1) as f64;
    let floor = operator_floor_mb(commits);
    let mut functions: Vec<Tuning> = Vec::new();
    for name in [
        crate::deploy::OPERATOR,
        crate::deploy::PLANNER,
        crate::deploy::COMMITTER,
    ] {
        let mut invocations = 0;
        let mut billed_ms = 0;
        let mut cpu_ms = 0;
        let mut measured_ms = 0;
        let mut memory_mb = 0;
        for f in commits
            .iter()
            .flat_map(|c| &c.usage.functions)
            .filter(|f| f.function == name)
        {
            invocations += f.invocations;
            billed_ms += f.billed_ms;
            cpu_ms += f.cpu_ms;
            measured_ms += f.cpu_measured_ms;
            memory_mb = memory_mb.max(f.memory_mb);
        }
        if invocations == 0 {
            continue;
        }
        let per_run = |mb: u64, ms: f64| {
            (invocations as f64 * prices.lambda.per_request
                + gb_seconds(ms.round() as u64, mb) * prices.lambda_gb_second())
                / run_count
        };
        let now = per_run(memory_mb, billed_ms as f64);
        let mut t = Tuning {
            function: name.to_string(),
            memory_mb,
            invocations,
            billed_ms,
            cpu_ms,
            cpu_share: None,
            recommended_mb: None,
            duration_factor: 1.0,
            per_run_now: now,
            per_run_after: now,
            why: "no CPU time recorded (batches committed before it was measured): no \
                  recommendation"
                .into(),
        };
        if measured_ms > 0 {
            let share = cpu_ms as f64 / measured_ms as f64;
            t.cpu_share = Some(share);
            let floor = if name == crate::deploy::OPERATOR {
                floor
            } else {
                256
            };
            let (mb, factor) = recommend(memory_mb, share, floor);
            t.recommended_mb = Some(mb);
            t.duration_factor = factor;
            t.per_run_after = per_run(mb, billed_ms as f64 * factor);
            t.why = explain(memory_mb, share, mb, factor, floor);
        }
        functions.push(t);
    }
    let operator_mb = functions
        .iter()
        .find(|f| f.function == crate::deploy::OPERATOR)
        .map_or(3008, |f| f.recommended_mb.unwrap_or(f.memory_mb));
    let (limits, limits_note) = match advise_limits(commits, limits, prices, operator_mb, pace) {
        Ok(a) => (Some(a), None),
        Err(why) => (None, Some(why)),
    };
    TuneReport {
        batches: commits.len(),
        runs: runs.len(),
        functions,
        operator_floor_mb: floor,
        limits,
        limits_note,
    }
}

/// The duration at `m` MB over the duration at `at` MB of work that is
/// `share` CPU time over billed time (see the module's model).
pub fn duration_factor(at: u64, share: f64, m: u64) -> f64 {
    let threads = share.max(1.0);
    let speed = |mb: u64| (mb as f64 / ONE_VCPU_MB).min(threads);
    let computing = (share / speed(at)).min(1.0);
    (1.0 - computing) + computing * speed(at) / speed(m)
}

/// The cheapest size at or above `floor` that keeps the duration within
/// [`MAX_SLOWDOWN`] of today's at `at` MB (today's size if none is
/// cheaper), and its duration factor. Of sizes within 2% of the cheapest,
/// the fastest.
pub fn recommend(at: u64, share: f64, floor: u64) -> (u64, f64) {
    let cost = |m: u64| m as f64 * duration_factor(at, share, m);
    let fits: Vec<u64> = SIZES
        .iter()
        .copied()
        .chain([at])
        .filter(|m| *m >= floor.min(at) && duration_factor(at, share, *m) <= MAX_SLOWDOWN)
        .collect();
    let cheapest = fits.iter().map(|m| cost(*m)).fold(f64::INFINITY, f64::min);
    let best = fits
        .iter()
        .copied()
        .filter(|m| cost(*m) <= cheapest * 1.02)
        .min_by(|a, b| {
            duration_factor(at, share, *a)
                .total_cmp(&duration_factor(at, share, *b))
                .then(a.cmp(b))
        })
        .unwrap_or(at);
    (best, duration_factor(at, share, best))
}

/// Why `recommended` MB, in words.
fn explain(at: u64, share: f64, recommended: u64, factor: f64, floor: u64) -> String {
    let pct = (share.min(1.0) * 100.0).round();
    let kind = if share >= 0.6 {
        format!(
            "its invocations compute {pct}% of the time ({:.1} threads at once): below {} MB \
             (one vCPU) they would slow in proportion to memory, at the same cost; above what \
             their threads use, memory buys no speed",
            share.max(1.0),
            ONE_VCPU_MB
        )
    } else {
        format!(
            "its invocations wait {}% of the time (on storage or a broker) and compute {pct}%: \
             memory does not shorten the wait, and the bill is memory x duration, so less \
             memory costs less for little more time",
            100.0 - pct
        )
    };
    let change = if recommended == at {
        format!("keep {at} MB")
    } else {
        format!(
            "{at} MB -> {recommended} MB (duration x{factor:.2}; no smaller than {floor} MB, \
             for the data a task holds, and no more than x{MAX_SLOWDOWN} slower)"
        )
    };
    format!("{change}: {kind}")
}

/// The operator's memory floor: 256 MB and four times the largest batch's
/// mean input bytes per task.
fn operator_floor_mb(commits: &[Commit]) -> u64 {
    let per_task = commits
        .iter()
        .map(|c| {
            let tasks = c
                .usage
                .functions
                .iter()
                .find(|f| f.function == crate::deploy::OPERATOR)
                .map_or(1, |f| f.invocations.max(1));
            c.bytes_read / tasks
        })
        .max()
        .unwrap_or(0);
    (256 + 4 * per_task.div_ceil(1024 * 1024)).max(256)
}

/// The longest a task should take at the measured pace, ms: a quarter of
/// an Express execution's budget, so a batch of one wave of tasks, its
/// Plan and its commit end well inside one Express execution (and far
/// inside Lambda's 15 minutes).
pub const TASK_TARGET_MS: f64 = (crate::deploy::EXPRESS_BUDGET_MS / 4) as f64;

/// Tasks the inline Map runs at once (its `MaxConcurrency` in both
/// definitions).
pub const INLINE_CONCURRENCY: u64 = 40;

/// The most files `sluice tune` advises a batch to take: a batch's plan and
/// record name every input.
pub const MAX_FILES_ADVISED: u64 = 10_000;

/// The backlog the limits are projected on: 1 GiB of the measured files
/// (what an outage or a first run over old data leaves).
pub const BACKLOG_BYTES: u64 = 1 << 30;

const MIB: u64 = 1 << 20;

/// What `sluice tune` says of the batch and task limits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitsAdvice {
    /// Batches it measured (those with their operator's usage and input).
    pub batches: usize,
    /// A task's fixed work (start, requests, writing its part), ms: 0 when
    /// the measured tasks were all of one size and it could not be told
    /// apart from reading.
    pub task_fixed_ms: f64,
    /// Input bytes a task reads a second after its fixed work.
    pub task_bytes_per_s: f64,
    /// How those two were found, in words.
    pub fit: String,
    /// Runs the limits cut into more than one batch.
    pub runs_cut: usize,
    /// Each limit: today's value and the recommendation.
    pub limits: Vec<LimitChange>,
    /// What a batch costs whatever its size (Plan, commit, their requests
    /// and transitions), dollars: the measured bill less what the model
    /// gives its tasks, bytes and files.
    pub per_batch_fixed: f64,
    /// What one more task costs (invocation, fixed work, its Map
    /// iteration in a Standard execution), dollars.
    pub per_task: f64,
    /// A run of the window, dollars: as measured and as the recommended
    /// limits would cut it (the model).
    pub per_run_now: f64,
    /// With the recommended limits.
    pub per_run_after: f64,
    /// A backlog of [`BACKLOG_BYTES`] of the measured files, cut by today's
    /// limits and by the recommended ones.
    pub backlog: Backlog,
}

/// One limit's advice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitChange {
    /// `max_bytes_per_task`, `max_bytes_per_batch`, `max_files_per_batch`.
    pub limit: String,
    /// Today's value (bytes, or files).
    pub now: u64,
    /// The recommendation.
    pub recommended: u64,
    /// Why, in words.
    pub why: String,
}

/// Batches and tasks a run takes, and what it costs (model), dollars.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Shape {
    /// Batches.
    pub batches: u64,
    /// Operator tasks.
    pub tasks: u64,
    /// Dollars.
    pub cost: f64,
}

/// A backlog, cut two ways.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Backlog {
    /// Its bytes.
    pub bytes: u64,
    /// Its files (at the measured mean file size).
    pub files: u64,
    /// By today's limits.
    pub now: Shape,
    /// By the recommended ones.
    pub after: Shape,
}

/// What a run or a batch costs by its shape: a part per batch, per task,
/// per input byte (reading at the measured pace) and per input file (its
/// GET). Files and bytes are the same however the limits cut them; batches
/// and tasks are what the limits change.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CostModel {
    batch: f64,
    task: f64,
    byte: f64,
    file: f64,
}

impl CostModel {
    fn cost(&self, batches: u64, tasks: u64, files: u64, bytes: u64) -> f64 {
        batches as f64 * self.batch
            + tasks as f64 * self.task
            + files as f64 * self.file
            + bytes as f64 * self.byte
    }
}

/// Task time against task size: `ms = fixed + bytes / rate`, fitted over
/// the batches' mean tasks (weighted by their tasks) when their sizes
/// differ at least twofold; otherwise all of a task's time is taken as
/// reading (`fixed` 0), which overstates the time of a larger task. Returns (fixed ms, ms per byte,
/// whether it was fitted, in words).
fn fit_task_time(points: &[(f64, f64, f64)]) -> (f64, f64, bool, String) {
    let w: f64 = points.iter().map(|p| p.2).sum();
    let sum_x: f64 = points.iter().map(|p| p.0 * p.2).sum();
    let sum_y: f64 = points.iter().map(|p| p.1 * p.2).sum();
    let proportional = || {
        let s = if sum_x > 0.0 { sum_y / sum_x } else { 0.0 };
        (0.0, s, false)
    };
    let min_x = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let max_x = points.iter().map(|p| p.0).fold(0.0, f64::max);
    let n = points.len();
    let (fixed, slope, fitted) = if n >= 2 && min_x > 0.0 && max_x >= 2.0 * min_x {
        let mx = sum_x / w;
        let my = sum_y / w;
        let sxx: f64 = points.iter().map(|p| p.2 * (p.0 - mx).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
        let slope = sxy / sxx;
        if slope <= 0.0 {
            proportional()
        } else if my - slope * mx < 0.0 {
            // Through the origin.
            let sxx0: f64 = points.iter().map(|p| p.2 * p.0 * p.0).sum();
            let sxy0: f64 = points.iter().map(|p| p.2 * p.0 * p.1).sum();
            (0.0, sxy0 / sxx0, true)
        } else {
            (my - slope * mx, slope, true)
        }
    } else {
        proportional()
    };
    let words = if fitted {
        format!(
            "fitted over {n} batches whose mean task read {} to {}",
            size_text(min_x as u64),
            size_text(max_x as u64)
        )
    } else if n >= 2 && max_x >= 2.0 * min_x {
        format!(
            "over {n} batches, a task's time did not grow with its size: all of it taken as \
             reading, an upper bound for a larger task"
        )
    } else {
        format!(
            "the batches' mean tasks were all about {}, which cannot tell fixed work from reading; \
             all of their time taken as reading, an upper bound for a larger task",
            size_text(sum_x.max(0.0) as u64 / (w.max(1.0) as u64))
        )
    };
    (fixed, slope, fitted, words)
}

/// `bytes` as a limit is written in a pipeline file (`"64 MiB"`).
pub fn size_text(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= 1024 {
        format!("{:.0} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

/// The largest power-of-two number of MiB at or below `bytes` (1 MiB at
/// least).
fn round_down_mib(bytes: f64) -> u64 {
    let mib = (bytes / MIB as f64).floor().max(1.0) as u64;
    (1u64 << (63 - mib.leading_zeros())) * MIB
}

/// Batches and tasks `bytes` in `files` of the same size take under limits
/// (`task`, `batch` bytes, `batch_files`), as the planner cuts them: a
/// batch takes whole files up to its limits (at least one), and its tasks
/// whole files up to the task limit (at least one each).
fn shape(files: u64, bytes: u64, task: u64, batch: u64, batch_files: u64) -> (u64, u64) {
    let files = files.max(1);
    let mean = (bytes / files).max(1);
    let per_task = (task / mean).max(1);
    let per_batch = (batch / mean).min(batch_files).max(1);
    let (full, rest) = (files / per_batch, files % per_batch);
    let batches = full + u64::from(rest > 0);
    let tasks = full * per_batch.div_ceil(per_task) + rest.div_ceil(per_task);
    (batches, tasks)
}

/// Advise the batch and task limits from `commits`, for an operator that
/// would run with `operator_mb` (the memory recommendation, else today's).
/// `pace`: control's, which the planner cuts tasks with under
/// `limits.task_seconds` (without it, the window's). `Err`: why there is
/// no advice.
pub fn advise_limits(
    commits: &[Commit],
    limits: &crate::pipeline::Limits,
    prices: &Prices,
    operator_mb: u64,
    pace: Option<&crate::checkpoint::TaskPace>,
) -> std::result::Result<LimitsAdvice, String> {
    if commits.iter().any(|c| c.stream.is_some()) {
        return Err("a record stream's batches and tasks are cut by records \
                    (limits.max_records_per_batch and max_records_per_task): not tuned here"
            .into());
    }
    let operator = |c: &Commit| c.usage.invoked(crate::deploy::OPERATOR);
    let mut measured: Vec<&Commit> = commits
        .iter()
        .filter(|c| c.bytes_read > 0 && c.files > 0 && operator(c).0 > 0)
        .collect();
    if measured.is_empty() {
        return Err(
            "no batch recorded its tasks' use and input: nothing to size the limits from".into(),
        );
    }
    measured.sort_by_key(|c| c.batch);
    let points: Vec<(f64, f64, f64)> = measured
        .iter()
        .map(|c| {
            let (tasks, ms) = operator(c);
            let t = tasks as f64;
            (c.bytes_read as f64 / t, ms as f64 / t, t)
        })
        .collect();
    let (fixed_ms, ms_per_byte, fitted, fit) = fit_task_time(&points);
    let ms_per_byte = ms_per_byte.max(1e-12);
    // The planner's cut (`limits.task_seconds`): at control's pace, as
    // the planner takes it, else the window's (all of a task's time taken
    // as reading).
    let (all_bytes, all_ms) = measured.iter().fold((0u64, 0u64), |(b, ms), c| {
        (b + c.bytes_read, ms + operator(c).1)
    });
    let window = crate::checkpoint::TaskPace {
        bytes: all_bytes,
        ms: all_ms,
        tasks: 0,
    };
    let pace = *pace.unwrap_or(&window);
    let paced = |limit: u64| {
        let l = crate::pipeline::Limits {
            max_bytes_per_task: limit,
            ..*limits
        };
        crate::planning::paced_task_bytes(&l, Some(&pace)).unwrap_or(limit)
    };

    // The model's prices, at the operator's memory today (the memory the
    // tasks were measured at).
    let memory_now = measured
        .iter()
        .flat_map(|c| &c.usage.functions)
        .filter(|f| f.function == crate::deploy::OPERATOR)
        .map(|f| f.memory_mb)
        .max()
        .unwrap_or(operator_mb);
    let gb_ms = memory_now as f64 / 1024.0 / 1000.0 * prices.lambda_gb_second();
    let standard = measured
        .iter()
        .filter(|c| c.usage.express.transitions == 0 && c.usage.transitions > 0)
        .count();
    // One transition per inline Map iteration in a Standard execution;
    // none billed in Express (its duration hardly changes with parallel
    // tasks).
    let iteration =
        prices.step_functions.standard_per_transition * standard as f64 / measured.len() as f64;
    let mut model = CostModel {
        batch: 0.0,
        task: prices.lambda.per_request + fixed_ms * gb_ms + iteration,
        byte: ms_per_byte * gb_ms,
        file: prices.s3.get_head_per_1000 / 1000.0,
    };
    // What each batch's bill leaves once its tasks, bytes and files are
    // counted. A run's first batch also carries what a run costs once
    // (its claim, its discovery, a first run's schema and sink records):
    // the part per batch comes from the batches after a run's first when
    // there are any.
    let first_of_run = |c: &Commit| {
        measured
            .iter()
            .filter(|d| d.epoch == c.epoch)
            .all(|d| d.batch >= c.batch)
    };
    let parts = model;
    let residual = |c: &Commit| {
        crate::cost::commit_bill(c, prices).total()
            - parts.cost(0, operator(c).0, c.files, c.bytes_read)
    };
    let later: Vec<f64> = measured
        .iter()
        .filter(|c| !first_of_run(c))
        .map(|c| residual(c))
        .collect();
    let all: Vec<f64> = measured.iter().map(|c| residual(c)).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    model.batch = if later.is_empty() {
        mean(&all)
    } else {
        mean(&later)
    }
    .max(0.0);
    let firsts: Vec<f64> = measured
        .iter()
        .filter(|c| first_of_run(c))
        .map(|c| residual(c))
        .collect();
    let once_a_run = mean(&firsts) - model.batch;

    // max_bytes_per_task: as large as the time and memory allow. Without a
    // fit, all of a task's time is taken as reading: an upper bound for a
    // larger task, so a limit raised on it is safe, and one lowered on it
    // may be lowered more than needed (a larger backlog measures better).
    let by_memory = (operator_mb.saturating_sub(256) as f64 / 4.0) * MIB as f64;
    let by_time = (TASK_TARGET_MS - fixed_ms).max(0.0) / ms_per_byte;
    let now_task = limits.max_bytes_per_task;
    let (task, task_why) = {
        let bound = by_time.min(by_memory);
        let limited_by = if by_memory <= by_time {
            "limited by memory: four times a task's bytes plus 256 MB must fit the operator's \
             memory (give it more to raise this)"
                .to_string()
        } else if fitted {
            "limited by time: at most 60 s a task (a quarter of an Express run's budget)"
                .to_string()
        } else {
            "limited by time: at most 60 s a task (a quarter of an Express run's budget), with \
             all of a task's time taken as reading, which may cut tasks smaller than needed"
                .to_string()
        };
        let task = if bound >= now_task as f64 {
            round_down_mib(bound).max(now_task)
        } else {
            round_down_mib(bound)
        };
        let secs = (fixed_ms + task as f64 * ms_per_byte) / 1000.0;
        let mut why = format!(
            "a task of {} would take about {secs:.1} s at the measured pace and hold about {} MB \
             of the operator's {operator_mb} MB; {limited_by}",
            size_text(task),
            256 + 4 * task / MIB
        );
        match limits.task_seconds {
            Some(s) => why.push_str(&format!(
                "; limits.task_seconds = {s} cuts tasks at about {} at the measured pace, and \
                 this limit is its ceiling",
                size_text(paced(task))
            )),
            None => why.push_str(
                "; `limits.task_seconds = 60` has the planner cut tasks at the measured pace \
                 itself",
            ),
        }
        (task, why)
    };

    // max_bytes_per_batch: at most one wave of the inline Map. The planner
    // packs whole files into tasks in order, so two tasks in a row always
    // hold more than a task's bytes: `wave + 1` tasks would hold more than
    // `(wave + 1) / 2` tasks' bytes, so a batch of that many makes at most
    // `wave` tasks, whatever the file sizes.
    let wave = limits.max_inline_tasks.clamp(1, INLINE_CONCURRENCY);
    let cut = paced(task);
    let batch = (wave.div_ceil(2) * cut).max(MIB) / MIB * MIB;
    let batch_why = format!(
        "at most {wave} {} of {} (whole files packed in order: {} tasks' bytes never make \
         more), one wave of the inline Map (max_inline_tasks {}; it runs {INLINE_CONCURRENCY} \
         at once); no Distributed Map, so the run stays in an Express execution{}. Each batch \
         costs ${:.6} whatever its size (its Plan and commit, their requests and \
         transitions), so fewer, larger batches cost less",
        if wave == 1 { "task" } else { "tasks" },
        size_text(cut),
        wave.div_ceil(2),
        limits.max_inline_tasks,
        if limits.task_seconds.is_some() {
            " (at today's pace: a slower one cuts smaller tasks, and more of them)"
        } else {
            ""
        },
        model.batch
    );

    // max_files_per_batch: enough that bytes, not the count, cut a batch.
    let files: u64 = measured.iter().map(|c| c.files).sum();
    let mean_file = (all_bytes / files).max(1);
    let now_files = limits.max_files_per_batch;
    let fill = batch.div_ceil(mean_file);
    let files_limit = if now_files >= MAX_FILES_ADVISED {
        now_files
    } else {
        fill.clamp(now_files, MAX_FILES_ADVISED)
    };
    let files_why = format!(
        "at the mean input file of {}, {fill} of them fill the bytes limit{}",
        size_text(mean_file),
        if fill > MAX_FILES_ADVISED && files_limit == MAX_FILES_ADVISED {
            format!("; capped at {MAX_FILES_ADVISED} (a batch's plan and record name every input)")
        } else if fill < now_files {
            "; not lowered (the bytes limit cuts first)".to_string()
        } else {
            String::new()
        }
    );

    // The window's runs, as measured and as the recommended limits would
    // cut them: the measured bill less the batches and tasks saved.
    let mut runs: Vec<(u64, u64, u64, u64, u64, f64)> = Vec::new();
    for c in &measured {
        let tasks = operator(c).0;
        let bill = crate::cost::commit_bill(c, prices).total();
        match runs.iter_mut().find(|r| r.0 == c.epoch) {
            Some(r) => {
                r.1 += 1;
                r.2 += tasks;
                r.3 += c.files;
                r.4 += c.bytes_read;
                r.5 += bill;
            }
            None => runs.push((c.epoch, 1, tasks, c.files, c.bytes_read, bill)),
        }
    }
    let runs_cut = runs.iter().filter(|r| r.1 > 1).count();
    let mut now_total = 0.0;
    let mut after_total = 0.0;
    for &(_, batches, tasks, files, bytes, bill) in &runs {
        now_total += bill;
        let (b, t) = shape(files, bytes, cut, batch, files_limit);
        after_total += bill
            - (batches as f64 - b as f64) * model.batch
            - (tasks as f64 - t as f64) * model.task;
    }
    let n = runs.len() as f64;
    let backlog_files = BACKLOG_BYTES.div_ceil(mean_file);
    let project = |task, batch, batch_files| {
        let (b, t) = shape(backlog_files, BACKLOG_BYTES, task, batch, batch_files);
        Shape {
            batches: b,
            tasks: t,
            cost: once_a_run.max(0.0) + model.cost(b, t, backlog_files, BACKLOG_BYTES),
        }
    };
    Ok(LimitsAdvice {
        batches: measured.len(),
        task_fixed_ms: fixed_ms,
        task_bytes_per_s: 1000.0 / ms_per_byte,
        fit,
        runs_cut,
        limits: vec![
            LimitChange {
                limit: "max_bytes_per_task".into(),
                now: now_task,
                recommended: task,
                why: task_why,
            },
            LimitChange {
                limit: "max_bytes_per_batch".into(),
                now: limits.max_bytes_per_batch,
                recommended: batch,
                why: batch_why,
            },
            LimitChange {
                limit: "max_files_per_batch".into(),
                now: now_files,
                recommended: files_limit,
                why: files_why,
            },
        ],
        per_batch_fixed: model.batch,
        per_task: model.task,
        per_run_now: now_total / n,
        per_run_after: after_total / n,
        backlog: Backlog {
            bytes: BACKLOG_BYTES,
            files: backlog_files,
            now: project(paced(now_task), limits.max_bytes_per_batch, now_files),
            after: project(cut, batch, files_limit),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work that computes on one thread is as fast at one vCPU as at
    /// 1.7, and slower below; work that waits is as fast anywhere.
    #[test]
    fn the_model() {
        assert!((duration_factor(3008, 1.0, 1769) - 1.0).abs() < 1e-9);
        assert!((duration_factor(3008, 1.0, 1024) - 1769.0 / 1024.0).abs() < 1e-9);
        assert!((duration_factor(3008, 0.0, 128) - 1.0).abs() < 1e-9);
        // Two threads at once: 3,008 MB (1.7 vCPU) beats 1,769 MB.
        assert!(duration_factor(3008, 2.0, 1769) > 1.5);
        // A tenth computing: at 512 MB the computing part takes 3.5 times
        // as long.
        let f = duration_factor(3008, 0.1, 512);
        assert!((f - (0.9 + 0.1 * 1769.0 / 512.0)).abs() < 1e-9, "{f}");
    }

    /// Computing work goes to one vCPU, waiting work to the floor.
    #[test]
    fn recommendations() {
        assert_eq!(recommend(3008, 0.97, 256).0, 1769);
        assert_eq!(recommend(3008, 0.1, 256).0, 512);
        assert_eq!(recommend(3008, 0.02, 256).0, 256);
        // The floor holds.
        assert_eq!(recommend(3008, 0.02, 700).0, 1024);
        // Two threads busy: nothing cheaper keeps the speed within 1.5x.
        assert_eq!(recommend(3008, 1.9, 256).0, 3008);
    }

    /// A committed batch of `files` files, `bytes` bytes, read by `tasks`
    /// tasks billed `task_ms` each at 3,008 MB, in run `epoch`.
    fn batch(epoch: u64, files: u64, bytes: u64, tasks: u64, task_ms: u64) -> Commit {
        serde_json::from_value(serde_json::json!({
            "format_version": 1, "batch": 1, "epoch": epoch, "committed_ms": 0,
            "files": files, "bytes_read": bytes, "rows_in": 0, "rows_out": 0,
            "outputs": [], "durations": {"plan_ms": 0, "operate_ms": 0, "task_max_ms": 0,
            "commit_ms": 0}, "requests": {"get": 8, "put": 6, "put_create": 0, "put_update": 0,
            "list": 1, "delete": 3}, "input_keys": [],
            "usage": {"functions": [
                {"function": "operator", "invocations": tasks, "billed_ms": tasks * task_ms,
                 "memory_mb": 3008},
                {"function": "planner", "invocations": 1, "billed_ms": 40, "memory_mb": 1769},
                {"function": "committer", "invocations": 1, "billed_ms": 60, "memory_mb": 1769}
            ], "transitions": 0, "express": {"transitions": 7, "executions": 1,
            "billed_ms": 900}}
        }))
        .unwrap()
    }

    /// Control's pace: each older batch weighs a quarter less (integer
    /// arithmetic, by hand); batches that read nothing or whose tasks were
    /// not measured leave it as it is.
    #[test]
    fn the_pace_follows_recent_batches() {
        use crate::checkpoint::TaskPace;
        let p = TaskPace::default()
            .after(&batch(1, 1, 1000, 2, 50))
            .unwrap();
        assert_eq!(
            p,
            TaskPace {
                bytes: 1000,
                ms: 100,
                tasks: 2
            }
        );
        let p = p.after(&batch(1, 1, 3000, 1, 100)).unwrap();
        assert_eq!(
            p,
            TaskPace {
                bytes: 750 + 3000,
                ms: 75 + 100,
                tasks: 2 + 1
            }
        );
        assert_eq!(p.after(&batch(1, 1, 0, 1, 100)), None);
        assert_eq!(p.after(&batch(1, 1, 10, 1, 0)), None);
        // 3,750 bytes in 175 ms: 21,428 bytes a second.
        assert_eq!(p.bytes_in(1), Some(21_428));
    }

    /// Tasks of 1 and 4 MiB taking 300 and 900 ms: 100 ms fixed, 200 ms
    /// a MiB (hand-computed); tasks of one size: all of it reading.
    #[test]
    fn task_time_is_fixed_work_plus_reading() {
        let mib = MIB as f64;
        let (fixed, per_byte, fitted, _) =
            fit_task_time(&[(mib, 300.0, 1.0), (4.0 * mib, 900.0, 1.0)]);
        assert!(fitted);
        assert!((fixed - 100.0).abs() < 1e-6, "{fixed}");
        assert!((per_byte * mib - 200.0).abs() < 1e-6, "{per_byte}");
        let (fixed, per_byte, fitted, words) =
            fit_task_time(&[(mib, 300.0, 2.0), (1.2 * mib, 320.0, 1.0)]);
        assert!(!fitted && fixed == 0.0, "{words}");
        // (2 * 300 + 320) ms over 3.2 MiB.
        assert!((per_byte * mib - 920.0 / 3.2).abs() < 1e-6, "{per_byte}");
        assert!(
            words.contains("all of their time taken as reading"),
            "{words}"
        );
    }

    #[test]
    fn shapes_and_sizes() {
        // 10 files of 30 MiB: batches of 100 MiB (or 4 files) take 3
        // files, 4 batches; tasks of 64 MiB take 2 files: 2 tasks in each
        // full batch and 1 in the last.
        assert_eq!(shape(10, 300 * MIB, 64 * MIB, 100 * MIB, 4), (4, 7));
        assert_eq!(shape(10, 300 * MIB, 64 * MIB, 100 * MIB, 2), (5, 5));
        // Files over half the task size: a task each.
        assert_eq!(shape(3, 3 * 9 * MIB, 16 * MIB, 32 * MIB, 7), (1, 3));
        assert_eq!(shape(2, 300 * MIB, MIB, 1 << 40, 1000), (1, 2));
        assert_eq!(shape(1, 1000, 256 * MIB, 1 << 30, 1000), (1, 1));
        assert_eq!(round_down_mib(300.0 * MIB as f64), 256 * MIB);
        assert_eq!(round_down_mib(1000.0), MIB);
        assert_eq!(size_text(64 * MIB), "64 MiB");
        assert_eq!(size_text(2 << 30), "2 GiB");
        assert_eq!(size_text(1536 * MIB), "1536 MiB");
    }

    /// Runs of six one-file batches (a limit of one file a batch): the
    /// advice lifts the file limit so one batch takes them all, and the
    /// model, fitted to the measured bills, prices that run lower by five
    /// batches' fixed part.
    #[test]
    fn a_file_limit_that_cuts_runs_is_raised() {
        let mib = MIB;
        let mut commits = Vec::new();
        for epoch in 1..=2 {
            for size in [1, 2, 4, 1, 2, 4] {
                commits.push(batch(epoch, 1, size * mib, 1, 100 + 200 * size));
            }
        }
        let limits = crate::pipeline::Limits {
            max_files_per_batch: 1,
            ..Default::default()
        };
        let prices = Prices::default_table();
        let a = advise_limits(&commits, &limits, &prices, 3008, None).unwrap();
        assert_eq!(a.runs_cut, 2);
        assert!((a.task_fixed_ms - 100.0).abs() < 1e-6, "{a:?}");
        assert!((a.task_bytes_per_s - 5.0 * mib as f64).abs() < 1.0, "{a:?}");
        let rec = |name: &str| {
            a.limits
                .iter()
                .find(|l| l.limit == name)
                .unwrap()
                .recommended
        };
        // 60 s: (60,000 - 100) ms at 200 ms a MiB is 299.5 MiB: 256 MiB;
        // memory (3,008 - 256) / 4 = 688 MiB does not bind.
        assert_eq!(rec("max_bytes_per_task"), 256 * mib);
        // 20 tasks' bytes: at most 40 tasks whatever the files.
        assert_eq!(rec("max_bytes_per_batch"), 20 * 256 * mib);
        // Files of 2,446,677 bytes on average (28 MiB in 12).
        assert_eq!(rec("max_files_per_batch"), (5120 * mib).div_ceil(2_446_677));
        // Each run: 6 batches of a task each before, 1 of 1 task after
        // (14 MiB fit one task).
        let model_saving = 5.0 * (a.per_batch_fixed + a.per_task);
        assert!(a.per_batch_fixed > 0.0, "{a:?}");
        assert!(
            (a.per_run_now - a.per_run_after - model_saving).abs() < 1e-12,
            "{a:?}"
        );
        // The measured bills, as the model splits them, add up.
        let measured: f64 = commits
            .iter()
            .map(|c| crate::cost::commit_bill(c, &prices).total())
            .sum();
        assert!((a.per_run_now * 2.0 - measured).abs() < 1e-12, "{a:?}");
        // Memory binds at 512 MB: (512 - 256) / 4 = 64 MiB.
        let a = advise_limits(&commits, &limits, &prices, 512, None).unwrap();
        assert_eq!(
            a.limits
                .iter()
                .find(|l| l.limit == "max_bytes_per_task")
                .unwrap()
                .recommended,
            64 * mib
        );
        assert!(a.limits[0].why.contains("limited by memory"), "{a:?}");
    }

    /// Tasks of one size that take long: all of their time is taken as
    /// reading, and a limit whose task would pass 60 s at that pace is
    /// lowered (1 MiB in 2.6 s: 60 s is 23 MiB, so 16 MiB). With
    /// `task_seconds`, the planner's cut (10 s: 3.8 MiB) sizes the batch.
    #[test]
    fn slow_tasks_lower_the_task_limit() {
        let commits: Vec<Commit> = (0..4).map(|_| batch(1, 1, MIB, 1, 2_600)).collect();
        let limits = crate::pipeline::Limits::default();
        let prices = Prices::default_table();
        let a = advise_limits(&commits, &limits, &prices, 3008, None).unwrap();
        assert_eq!(a.limits[0].recommended, 16 * MIB, "{a:?}");
        assert!(a.limits[0].why.contains("smaller than needed"), "{a:?}");
        assert_eq!(a.limits[1].recommended, 20 * 16 * MIB, "{a:?}");
        let paced = crate::pipeline::Limits {
            task_seconds: Some(10),
            ..limits
        };
        let a = advise_limits(&commits, &paced, &prices, 3008, None).unwrap();
        let cut = (MIB as f64 / 2600.0 * 10_000.0) as u64;
        assert_eq!(a.limits[1].recommended, 20 * cut / MIB * MIB, "{a:?}");
        assert!(
            a.limits[0].why.contains("task_seconds = 10 cuts tasks"),
            "{a:?}"
        );
        // 1 GiB of 1 MiB files today: batches of 1,000 files then 24,
        // tasks of 3 files at the 3.8 MiB cut: 334 and 8.
        assert_eq!(
            (a.backlog.now.batches, a.backlog.now.tasks),
            (2, 342),
            "{a:?}"
        );
    }
}
