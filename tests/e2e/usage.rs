//! Usage in commit records (what `sluice cost` prices): each batch's
//! record names its Lambda invocations per function and its state
//! transitions, computed by the handlers from what the batch did. The
//! local runner counts the same things independently, as it interprets
//! the definition (every state entered, every handler call): the records
//! plus each execution's ending, recorded in `control.json` totals (its
//! last Plan, `HasBatch`, `Finished`, and `Continue` when it hands over),
//! must add up to the runner's count exactly (the trigger invocation of
//! `Continue` aside). The storage requests in the records and in control's
//! totals (work after each record, run endings) must add up to every
//! request the run made through the context's stores, DataFusion's scans
//! included. Failed attempts that Step Functions retries count as
//! invocations and transitions.

use crate::support::*;
use sluice_engine::deploy::Workflow;
use sluice_engine::handlers::Context;
use sluice_engine::storage::{LocalStore, Store};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Per function: (invocations, billed ms) in `u`.
fn by_function(u: &sluice_engine::checkpoint::Usage) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for f in &u.functions {
        let e = out.entry(f.function.clone()).or_default();
        e.0 += f.invocations;
        e.1 += f.billed_ms;
    }
    out
}

/// Run `toml` over `files` files with the run's first execution a
/// `workflow` one; `expect` executions of each kind (Standard, Express).
async fn check(
    name: &str,
    toml: &str,
    files: u64,
    workflow: Workflow,
    expect: (u64, u64),
    tasks_per_batch: u64,
) {
    // An Express execution of a row-by-row query that runs to its end
    // ends at its last commit (the `Committed` choice), with no Plan.
    let commit_ends = u64::from(
        workflow == Workflow::Express
            && expect == (0, 1)
            && !toml.contains("[watermark]")
            && !toml.contains("[deduplicate]"),
    );
    let name = &format!("{name} ({workflow:?} first)");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), files, 60);
    let ctx = local_context(&pipeline(root, toml));
    let before = ctx.counts();
    let ran = runner().starting(workflow).run(&ctx, |_| {}).await.unwrap();
    let spent = ctx.counts().since(&before);
    assert_eq!(ran.executions, expect.0 + expect.1, "{name}");
    assert_eq!(ran.usage.express.executions, expect.1, "{name}");
    let commits = commit_records(root, toml).await;
    assert_eq!(commits.len(), ran.batches.len(), "{name}");
    assert!(
        commits
            .iter()
            .all(|c| c.usage.all_transitions() > 0 && c.usage.functions.len() == 3),
        "{name}: every record has its usage: {:?}",
        commits.iter().map(|c| &c.usage).collect::<Vec<_>>()
    );
    if tasks_per_batch > 1 {
        assert!(
            commits
                .iter()
                .any(|c| by_function(&c.usage)["operator"].0 >= tasks_per_batch),
            "{name}: a batch of {tasks_per_batch} tasks"
        );
    }
    let mut recorded: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut transitions = 0;
    let mut express = sluice_engine::checkpoint::ExpressUsage::default();
    for c in &commits {
        transitions += c.usage.transitions;
        express.transitions += c.usage.express.transitions;
        // A batch's Express duration is its execution's, recorded at the
        // execution's ending.
        assert_eq!(c.usage.express.executions, 0, "{name}");
        for (f, (n, ms)) in by_function(&c.usage) {
            let e = recorded.entry(f).or_default();
            e.0 += n;
            e.1 += ms;
        }
    }
    // Each execution's ending (a Plan that hands out no batch, HasBatch and
    // Finished, and Continue for one that hands over) is in control.json.
    let totals = control_of(root, toml).await.totals;
    assert_eq!(totals.runs, ran.executions, "{name}: runs ended");
    let recorded_requests = commits
        .iter()
        .fold(totals.after_commits, |acc, c| acc.plus(&c.requests))
        .plus(&totals.run_end_requests)
        .plus(&totals.wake_requests);
    assert_eq!(
        recorded_requests, spent,
        "{name}: requests recorded vs made through the stores"
    );
    // (A batch's commit checks a few outputs with HEADs, counted as GETs;
    // the first batch's Plan listed the source.)
    assert!(
        commits.iter().all(|c| c.requests.get > 0) && commits[0].requests.list > 0,
        "{name}"
    );
    let handovers = ran.executions - 1;
    // (An Express execution also enters its Copy state, once. One that
    // ends at its commit enters only `Finished` after it: its `Committed`
    // choice is the batch's.)
    assert_eq!(
        totals.run_ends.all_transitions(),
        3 * (ran.executions - commit_ends) + commit_ends + handovers + expect.1,
        "{name}: transitions of the executions' endings"
    );
    assert_eq!(
        by_function(&totals.run_ends)
            .get("planner")
            .map_or(0, |(n, _)| *n),
        ran.executions - commit_ends,
        "{name}: one ending Plan per execution that did not end at its commit"
    );
    transitions += totals.run_ends.transitions;
    express.transitions += totals.run_ends.express.transitions;
    express.executions += totals.run_ends.express.executions;
    express.billed_ms += totals.run_ends.express.billed_ms;
    for (f, (n, ms)) in by_function(&totals.run_ends) {
        let e = recorded.entry(f).or_default();
        e.0 += n;
        e.1 += ms;
    }
    // The trigger invocation Continue makes is not recorded (the trigger
    // writes control only when it claims the lease).
    if handovers > 0 {
        recorded.entry("trigger".into()).or_default().0 += handovers;
    }
    let counted = by_function(&ran.usage);
    assert_eq!(ran.usage.transitions, transitions, "{name}: transitions");
    // Express: the transitions (counted, not billed) and executions as
    // the runner counted them; the duration recorded from the execution's
    // start to its ending Plan, the runner's to the execution's end: no
    // more, each rounded up to 100 ms.
    assert_eq!(
        ran.usage.express.transitions, express.transitions,
        "{name}: Express transitions"
    );
    assert_eq!(
        ran.usage.express.executions, express.executions,
        "{name}: Express executions"
    );
    assert!(
        express.billed_ms <= ran.usage.express.billed_ms
            && (express.executions == 0) == (express.billed_ms == 0)
            && express.billed_ms % 100 == 0,
        "{name}: Express duration recorded {} ms, counted {} ms",
        express.billed_ms,
        ran.usage.express.billed_ms
    );
    let invocations = |m: &BTreeMap<String, (u64, u64)>| -> BTreeMap<String, u64> {
        m.iter().map(|(f, (n, _))| (f.clone(), *n)).collect()
    };
    assert_eq!(
        invocations(&counted),
        invocations(&recorded),
        "{name}: invocations"
    );
    // Billed time: the records measure inside the handlers, the runner
    // around each call, which also holds the last Plan of each execution.
    for (f, (_, ms)) in &recorded {
        assert!(
            *ms <= counted[f].1,
            "{name}: {f} billed {ms} ms > counted {}",
            counted[f].1
        );
    }
    assert!(recorded["operator"].1 > 0, "{name}: the tasks took time");
}

#[tokio::test(flavor = "multi_thread")]
async fn recorded_usage_adds_up_to_what_the_runner_counted() {
    // Row by row, three batches of two tasks each (inline Map).
    let plain = pipeline_toml(
        "plain",
        "parquet",
        "",
        "max_files_per_batch = 2\nmax_bytes_per_task = 1",
    );
    let (standard, express) = (Workflow::Standard, Workflow::Express);
    check("inline", &plain, 6, standard, (1, 0), 2).await;
    check("inline", &plain, 6, express, (0, 1), 2).await;
    // The same through the Distributed Map (one child execution per task):
    // an Express execution hands the batch over to a Standard one.
    let many = plain.replace(
        "max_bytes_per_task = 1",
        "max_bytes_per_task = 1\nmax_inline_tasks = 1",
    );
    check("distributed", &many, 4, standard, (1, 0), 2).await;
    check("distributed", &many, 4, express, (1, 1), 2).await;
    // Two executions: the first hands over after one batch.
    let handed = plain.replace("max_bytes_per_task = 1", "max_batches_per_execution = 1");
    check("handed over", &handed, 4, standard, (2, 0), 1).await;
    check("handed over", &handed, 4, express, (1, 1), 1).await;
    // A stateful query: two state partitions merged per batch, and the
    // closing batch with no input.
    let windowed = r#"SELECT window.start AS ws, "PULocationID", count(*) AS n FROM trips GROUP BY window(tpep_pickup_datetime, '15 minutes'), "PULocationID""#;
    let stateful = pipeline_toml(
        "win",
        "parquet",
        "",
        "max_files_per_batch = 1\nstate_partitions = 2",
    )
    .replace(&plain_sql(), windowed)
    .replace(
        "[checkpoint]",
        "[watermark]\ncolumn = \"tpep_pickup_datetime\"\ndelay = \"10 minutes\"\n[checkpoint]",
    );
    assert!(
        stateful.contains("window(") && stateful.contains("[watermark]"),
        "{stateful}"
    );
    check("stateful", &stateful, 2, standard, (1, 0), 1).await;
    check("stateful", &stateful, 2, express, (0, 1), 1).await;
    // `[deduplicate]`: a Dedup map of two steps per batch before the
    // commit (a row query), or before the Merge map (the windowed query).
    let dedup = "[deduplicate]\nkey = [\"PULocationID\"]\n[watermark]\ncolumn = \
                 \"tpep_pickup_datetime\"\ndelay = \"10 minutes\"\n[checkpoint]";
    let dedup_rows = plain.replace("[checkpoint]", dedup).replace(
        "max_bytes_per_task = 1",
        "max_bytes_per_task = 1\nstate_partitions = 2",
    );
    check("dedup", &dedup_rows, 4, standard, (1, 0), 2).await;
    check("dedup", &dedup_rows, 4, express, (0, 1), 2).await;
    let dedup_windowed = stateful.replace(
        "[watermark]",
        "[deduplicate]\nkey = [\"PULocationID\"]\n[watermark]",
    );
    check("dedup windowed", &dedup_windowed, 2, standard, (1, 0), 1).await;
    check("dedup windowed", &dedup_windowed, 2, express, (0, 1), 1).await;
}

/// The SQL `pipeline_toml` writes.
fn plain_sql() -> String {
    let t = pipeline_toml("x", "parquet", "", "");
    let from = t.find("sql = '''").unwrap() + "sql = '''".len();
    let to = t[from..].find("'''").unwrap() + from;
    t[from..to].to_string()
}

/// Fails the first `left` puts whose key contains `pattern` with a
/// transient error (Sluice.Retryable: the state machine retries the step).
#[derive(Debug)]
struct FailFirst {
    pattern: &'static str,
    left: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl WriteHook for FailFirst {
    async fn before(
        &self,
        op: &'static str,
        key: &str,
    ) -> Result<(), sluice_engine::error::StoreError> {
        use std::sync::atomic::Ordering;
        if op == "put"
            && key.contains(self.pattern)
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(sluice_engine::error::StoreError::Transient {
                op,
                location: key.to_string(),
                message: "injected once by the usage test".into(),
            });
        }
        Ok(())
    }
}

/// Retried steps: a task's part write fails twice and a commit record's
/// write once (each a Sluice.Retryable the state machine retries). The
/// records count each failed attempt as an invocation and a transition,
/// as the runner counted them (Step Functions bills both).
#[tokio::test(flavor = "multi_thread")]
async fn retried_steps_count_as_invocations_and_transitions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 60);
    let toml = pipeline_toml("retried", "parquet", "", "max_files_per_batch = 1");
    let p = pipeline(root, &toml);
    let checkpoint = root.join("out/checkpoint").join(&p.name);
    let hooked = |path: std::path::PathBuf, pattern: &'static str, left: u64| -> Arc<dyn Store> {
        Arc::new(Hooked {
            inner: Arc::new(LocalStore::new(path)),
            hook: FailFirst {
                pattern,
                left: left.into(),
            },
        })
    };
    // A task's staged parts live in the sink, commit records in the
    // checkpoint. (A task's result travels in the payload: it writes none.)
    let mut ctx = Context::new(
        p,
        Arc::new(LocalStore::new(root.join("input"))),
        hooked(root.join("out/sink"), "part-", 2),
        hooked(checkpoint, "commits/", 1),
    );
    test_mode(&mut ctx);
    let ran = run(&ctx).await.unwrap();
    assert_eq!(ran.batches.len(), 2);
    let commits = commit_records(root, &toml).await;
    let totals = control_of(root, &toml).await.totals;
    let mut recorded: BTreeMap<String, u64> = BTreeMap::new();
    let mut transitions = totals.run_ends.all_transitions();
    for u in commits.iter().map(|c| &c.usage).chain([&totals.run_ends]) {
        for (f, (n, _)) in by_function(u) {
            *recorded.entry(f).or_default() += n;
        }
    }
    transitions += commits
        .iter()
        .map(|c| c.usage.all_transitions())
        .sum::<u64>();
    let counted: BTreeMap<String, u64> = by_function(&ran.usage)
        .into_iter()
        .map(|(f, (n, _))| (f, n))
        .collect();
    // Two batches of one task: 2 plans + 1 ending, 2 tasks + 2 failed
    // attempts, 2 commits + 1 failed attempt.
    assert_eq!(counted["operator"], 4, "{counted:?}");
    assert_eq!(counted["committer"], 3, "{counted:?}");
    assert_eq!(recorded, counted, "invocations recorded vs counted");
    assert_eq!(transitions, ran.usage.all_transitions(), "transitions");
}

/// A batch's operate time runs from the Plan that handed it out, not from
/// when the run planned it (a run plans all its batches first): it fits
/// in the time since the batch before it was committed. (It counted the
/// batches before it: 21, 36, 51 ms... for batches of 14 ms each.)
#[tokio::test(flavor = "multi_thread")]
async fn a_batchs_operate_time_is_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 5, 2_000);
    let toml = pipeline_toml("own", "parquet", "", "max_files_per_batch = 1");
    let ctx = local_context(&pipeline(root, &toml));
    runner().run(&ctx, |_| {}).await.unwrap();
    let commits = commit_records(root, &toml).await;
    assert_eq!(commits.len(), 5);
    for w in commits.windows(2) {
        assert!(
            w[1].durations.operate_ms as i64 <= w[1].committed_ms - w[0].committed_ms,
            "batch {}: operate {} ms, yet committed {} ms after batch {}",
            w[1].batch,
            w[1].durations.operate_ms,
            w[1].committed_ms - w[0].committed_ms,
            w[0].batch
        );
    }
}
