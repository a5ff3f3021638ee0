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
}

/// Tune from `commits` (any order) at `prices`.
pub fn tune(commits: &[Commit], prices: &Prices) -> TuneReport {
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
    TuneReport {
        batches: commits.len(),
        runs: runs.len(),
        functions,
        operator_floor_mb: floor,
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
}
