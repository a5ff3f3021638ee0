//! Crash recovery: fail each storage write of a two-batch run in turn (and,
//! separately, kill a `sluice run` process at several points); running again
//! must give exactly the output of a clean run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_engine::deploy::Workflow;
use sluice_engine::handlers::Context;
use sluice_engine::operators::SqlOperator;

use crate::support::*;

const LIMITS: &str = "max_files_per_batch = 2";

/// Start `sluice run` on the pipeline file in `root`, output captured.
pub(crate) fn spawn_run(root: &std::path::Path) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("run")
        .arg(root.join("pipeline.toml"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn limited_context(
    root: &std::path::Path,
    source: &str,
    limits: &str,
    writes: Arc<AtomicU64>,
    fail_at: u64,
) -> Context {
    fault_context(
        root,
        &pipeline_toml("crash", "parquet", source, limits),
        writes,
        fail_at,
    )
}

/// Runs start as Express executions (as the trigger starts them); a rerun
/// after a crash resumes the planned batch in a Standard execution.
#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_then_rerunning_gives_the_clean_output() {
    each_write_fails_in_turn(LIMITS, 1, Workflow::Express).await;
}

/// A run a trigger started as an Express execution, whose first Plan
/// claims the run for that execution before any other write: each write
/// fails in turn (the claim among them; the trigger's lease claim is the
/// test's), then a run that takes over (the failed execution has
/// certainly ended) gives the clean output.
#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_of_a_triggered_express_run_then_taking_over_gives_the_clean_output() {
    each_write_fails_in_turn(LIMITS, 1, Triggered).await;
}

/// The same with `ordered` discovery, whose lookback window of processed
/// keys control holds, written with each commit's record of the batch.
#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_of_an_ordered_run_then_rerunning_gives_the_clean_output() {
    each_write_fails_in_turn_of(
        "discovery = \"ordered\"\nlookback = 2",
        LIMITS,
        1,
        Workflow::Express,
    )
    .await;
}

/// The same with every execution Standard (a deployment without the
/// Express state machine).
#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_of_a_standard_run_then_rerunning_gives_the_clean_output() {
    each_write_fails_in_turn(LIMITS, 1, Workflow::Standard).await;
}

/// The same where each execution hands over after one batch (the budget
/// path a long run takes before Step Functions' history cap): the
/// hand-over's control write, and the next execution's claim and resume,
/// fail in turn too.
#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_of_a_handed_over_run_then_rerunning_gives_the_clean_output() {
    each_write_fails_in_turn(
        "max_files_per_batch = 2\nmax_batches_per_execution = 1",
        2,
        Workflow::Express,
    )
    .await;
}

/// How the runs of [`each_write_fails_in_turn`] start.
trait Start: Copy + Send + 'static {
    /// Run `ctx`'s pipeline to its end, from `claims`, which counts no
    /// write (a trigger's claim is not the run's).
    fn run(
        self,
        ctx: Context,
        claims: Context,
    ) -> impl std::future::Future<Output = sluice_engine::Result<sluice_engine::runner::RunSummary>> + Send;
}

/// `sluice run`: the run claims the lease itself, its first execution
/// `Workflow`.
impl Start for Workflow {
    async fn run(
        self,
        ctx: Context,
        _: Context,
    ) -> sluice_engine::Result<sluice_engine::runner::RunSummary> {
        runner().starting(self).run(&ctx, |_| {}).await
    }
}

/// A trigger claims the lease and starts an Express execution.
#[derive(Clone, Copy)]
struct Triggered;

impl Start for Triggered {
    async fn run(
        self,
        ctx: Context,
        claims: Context,
    ) -> sluice_engine::Result<sluice_engine::runner::RunSummary> {
        let (c, _) = claims.checkpoint.control().await?.unwrap_or_else(|| {
            (
                sluice_engine::checkpoint::Control::new(String::new()),
                String::new(),
            )
        });
        if c.status == sluice_engine::checkpoint::RunStatus::Running {
            // A failed execution holds the lease: taking over once it has
            // certainly ended is `sluice run`'s (as a trigger's would be).
            let mut ctx = ctx;
            ctx.owner_gone = Arc::new(|_| true);
            return runner().run(&ctx, |_| {}).await;
        }
        let input = claim_express(&claims).await;
        runner()
            .starting(Workflow::Express)
            .execute(&ctx, input, |_| {})
            .await
    }
}

async fn each_write_fails_in_turn(limits: &str, executions: u64, start: impl Start) {
    each_write_fails_in_turn_of("", limits, executions, start).await
}

/// [`each_write_fails_in_turn`] with `source` options.
async fn each_write_fails_in_turn_of(
    source: &str,
    limits: &str,
    executions: u64,
    start: impl Start,
) {
    let faulty_context = |root: &std::path::Path, writes: Arc<AtomicU64>, fail_at: u64| {
        limited_context(root, source, limits, writes, fail_at)
    };
    let run = |root: &std::path::Path, writes: Arc<AtomicU64>, fail_at: u64| {
        start.run(
            faulty_context(root, writes, fail_at),
            faulty_context(root, Arc::new(AtomicU64::new(0)), 0),
        )
    };
    // A clean run, counting its writes.
    let clean = tempfile::tempdir().unwrap();
    gen_files(&clean.path().join("input"), 4, 60);
    let writes = Arc::new(AtomicU64::new(0));
    let summary = run(clean.path(), writes.clone(), 0).await.unwrap();
    assert_eq!(summary.batches.len(), 2, "the scenario needs two batches");
    assert_eq!(summary.executions, executions);
    let total_writes = writes.load(Ordering::SeqCst);
    let expected = committed_rows(&clean.path().join("out/sink"), "crash").await;
    assert_eq!(expected, one_shot_rows(&clean.path().join("input")).await);
    assert!(total_writes >= 10, "only {total_writes} writes");
    eprintln!("crash test: failing each of {total_writes} writes in turn");

    for k in 1..=total_writes {
        let dir = tempfile::tempdir().unwrap();
        gen_files(&dir.path().join("input"), 4, 60);
        let writes = Arc::new(AtomicU64::new(0));
        let failed = run(dir.path(), writes, k).await;
        assert!(
            failed.is_err(),
            "write {k} was injected to fail, yet the run succeeded"
        );
        // A reader globbing the sink now sees committed rows only, each
        // once (a batch whose publish was cut short shows some of its
        // parts: they are committed, and recovery publishes the rest).
        let seen = globbed_rows(&dir.path().join("out/sink")).await;
        let reader = faulty_context(dir.path(), Arc::new(AtomicU64::new(0)), 0);
        let committed = committed_input_rows(dir.path(), &reader).await;
        assert!(
            is_sub_multiset(&seen, &committed),
            "after failing write {k}, a glob over the sink sees {} rows that are not committed \
             rows each once",
            seen.len()
        );

        let again = run(dir.path(), Arc::new(AtomicU64::new(0)), 0)
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        assert_recovered(dir.path(), "crash", &again.end, &expected, k).await;
        let ctx = faulty_context(dir.path(), Arc::new(AtomicU64::new(0)), 0);
        let (control, _) = ctx.checkpoint.control().await.unwrap().unwrap();
        assert_eq!(control.last_committed, Some(1), "after failing write {k}");
        assert_eq!(control.totals.files, 4, "after failing write {k}");
        assert_eq!(control.totals.batches, 2, "after failing write {k}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_process_at_any_point_then_rerunning_gives_the_clean_output() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 12, 5_000);
    let toml = pipeline_toml("kill", "parquet", "", "max_files_per_batch = 1");
    std::fs::write(root.join("pipeline.toml"), &toml).unwrap();
    // Start a run and kill it after a delay, again and again with varying
    // delays, until a run finishes by itself.
    let mut killed_mid_run = 0;
    for attempt in 0..40 {
        let delay_ms = [10u64, 35, 70, 120, 200][attempt % 5];
        let mut child = spawn_run(root);
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        killed_mid_run += 1;
    }
    assert!(
        killed_mid_run >= 3,
        "only {killed_mid_run} kills landed mid-run"
    );
    let out = spawn_run(root).wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = committed_rows(&root.join("out/sink"), "kill").await;
    assert_eq!(got, one_shot_rows(&root.join("input")).await);
    assert_eq!(
        orphan_files(&root.join("out/sink"), "kill").await,
        Vec::<String>::new()
    );
    // Readers that glob see the same rows; nothing is left staged.
    let mut globbed = globbed_rows(&root.join("out/sink")).await;
    globbed.sort();
    assert_eq!(globbed, got);
    assert_eq!(staged_files(&root.join("out/sink")), Vec::<String>::new());
    let control = control_of(root, &toml).await;
    assert_eq!(control.totals.files, 12);
    assert_eq!(control.last_committed, Some(11));
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_runs_of_one_pipeline_commit_every_file_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let toml = pipeline_toml("conc", "parquet", "", "max_files_per_batch = 2");
    std::fs::write(root.join("pipeline.toml"), &toml).unwrap();
    // Waves of four runs started at once; at least three waves, and more
    // (up to eight) until runs were seen to overlap, so the check below
    // covers concurrent runs rather than runs that happened in turn.
    let mut busy = 0;
    let mut waves = 0;
    while waves < 3 || (busy == 0 && waves < 8) {
        gen_files(&root.join("input"), 4, 500);
        let children: Vec<_> = (0..4).map(|_| spawn_run(root)).collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "wave {waves}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            busy += text.matches("holds the lease").count();
        }
        waves += 1;
    }
    assert!(
        busy > 0,
        "in {waves} waves of 4 runs started at once, no run found the lease held: the runs never \
         overlapped, so this test checked nothing about concurrency"
    );
    // Whatever ran concurrently, one more run takes anything left behind.
    let last = spawn_run(root).wait_with_output().unwrap();
    assert!(last.status.success());
    eprintln!(
        "concurrent runs: {busy} of {} found the lease held",
        waves * 4
    );
    assert_eq!(
        committed_rows(&root.join("out/sink"), "conc").await,
        one_shot_rows(&root.join("input")).await
    );
    let control = control_of(root, &toml).await;
    assert_eq!(control.totals.files, 4 * waves);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_lost_its_lease_cannot_change_committed_output() {
    use sluice_engine::handlers::{self, PlanOutcome};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 3, 200);
    let p = pipeline(root, &pipeline_toml("zombie", "parquet", "", ""));

    // Run A claims the lease and plans batch 0, then stalls.
    let a = local_context(&p);
    let PlanOutcome::Batch { run: run_a, batch } = handlers::plan(&a, None).await.unwrap() else {
        panic!("run A should plan a batch");
    };
    // Run B takes over (A looks dead), resumes batch 0 and commits it.
    let b = run(&local_context(&p)).await.unwrap();
    assert!(b.batches[0].resumed);
    let sink = root.join("out/sink");
    let committed = committed_rows(&sink, "zombie").await;
    let snapshot = |dir: &std::path::Path| {
        let mut files: Vec<(String, Vec<u8>)> = walk(dir);
        files.sort();
        files
    };
    let before = snapshot(&sink.join("batch=0000000000"));

    // A wakes up: its task is fenced (the lease is B's) and writes nothing.
    let fenced = handlers::operate(&a, &run_a, batch.batch, 0)
        .await
        .unwrap_err();
    assert_eq!(
        fenced.class(),
        sluice_engine::ErrorClass::Conflict,
        "{fenced}"
    );
    assert_eq!(snapshot(&sink.join("batch=0000000000")), before);

    // A task of A that passed the fence before B took over and writes only
    // now: its parts stay staged, where a glob does not look.
    let off = a.checkpoint.offsets(batch.batch).await.unwrap().unwrap();
    let op = SqlOperator::new(a.pipeline.clone(), a.schema().await.unwrap());
    let late = op
        .run(
            a.source.as_ref(),
            &a.sink,
            sluice_engine::operators::Task {
                id: sluice_engine::checkpoint::TaskId {
                    epoch: run_a.epoch,
                    batch: batch.batch,
                    task: 0,
                },
                inputs: &off.inputs,
                plan: &off.tasks[0],
            },
        )
        .await
        .unwrap();
    assert!(late.rows_out > 0);
    assert!(!staged_files(&sink).is_empty());
    let err = handlers::commit(&a, &run_a, batch.batch).await.unwrap_err();
    assert_eq!(err.class(), sluice_engine::ErrorClass::Conflict, "{err}");
    let after: Vec<_> = snapshot(&sink.join("batch=0000000000"))
        .into_iter()
        .filter(|(k, _)| before.iter().any(|(b, _)| b == k))
        .collect();
    assert_eq!(after, before, "committed files changed");
    assert_eq!(committed_rows(&sink, "zombie").await, committed);
    assert_eq!(committed, one_shot_rows(&root.join("input")).await);
    // Every reader sees each committed row once, globbing included.
    let mut globbed = globbed_rows(&sink).await;
    globbed.sort();
    assert_eq!(globbed, committed);

    // What A staged stays in staging, where no reader looks, until the
    // next sweep (every 64th batch lists staging; the commits between
    // check their own outputs by name and list nothing), which removes it.
    for n in 1..=64u64 {
        let tmp = root.join(format!("gen{n}"));
        let made = gen_files(&tmp, 1, 50);
        std::fs::rename(&made[0], root.join(format!("input/more-{n:03}.parquet"))).unwrap();
        run(&local_context(&p)).await.unwrap();
        let left = staged_files(&sink);
        if n < 64 {
            assert!(!left.is_empty(), "batch {n} listed staging");
        } else {
            assert_eq!(left, Vec::<String>::new(), "the sweep at batch 64");
        }
    }
    let mut globbed = globbed_rows(&sink).await;
    globbed.sort();
    let mut all = one_shot_rows(&root.join("input")).await;
    all.sort();
    assert_eq!(globbed, all);
}

/// What the batches committed so far give, by DuckDB over their input
/// files (named in the commit records).
async fn committed_input_rows(root: &std::path::Path, ctx: &Context) -> Vec<String> {
    let mut files = Vec::new();
    let mut n = 0;
    while let Some(c) = ctx.checkpoint.commit(n).await.unwrap() {
        files.extend(c.input_keys.iter().map(|k| root.join("input").join(k)));
        n += 1;
    }
    if files.is_empty() {
        return Vec::new();
    }
    duckdb_rows(&files, SQL).await
}

fn walk(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// Writes killed mid-way leave hidden temporary files in local folders;
/// the run that recovers after them removes those of dead processes (and
/// keeps a live process's).
#[tokio::test(flavor = "multi_thread")]
async fn recovery_removes_the_temporary_files_of_killed_writes() {
    use sluice_engine::handlers::{self, PlanOutcome};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 50);
    let p = pipeline(root, &pipeline_toml("tmp", "parquet", "", ""));
    // A run plans a batch and dies holding the lease.
    let dead = local_context(&p);
    let PlanOutcome::Batch { .. } = handlers::plan(&dead, None).await.unwrap() else {
        panic!("a batch was planned");
    };
    // What its killed writes left: a staged part and a control write of a
    // process that is gone (no pid is this large), and one of a live
    // process (pid 1) that must stay.
    let staging = root.join("out/sink/_sluice/staging/batch=0000000000");
    std::fs::create_dir_all(&staging).unwrap();
    let killed = [
        staging.join(".part-00000-00000-e1.parquet.staged.4999999.0.tmp"),
        root.join("out/checkpoint/tmp/.control.json.4999999.3.tmp"),
    ];
    let live = staging.join(".part-00000-00001-e1.parquet.staged.1.0.tmp");
    let two_minutes_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    for f in killed.iter().chain([&live]) {
        std::fs::write(f, b"partial").unwrap();
        std::fs::File::options()
            .write(true)
            .open(f)
            .unwrap()
            .set_modified(two_minutes_ago)
            .unwrap();
    }
    // A fresh one of an absent pid may be a writer in another container.
    let fresh = staging.join(".part-00000-00002-e1.parquet.staged.4999999.1.tmp");
    std::fs::write(&fresh, b"partial").unwrap();

    let summary = run(&local_context(&p)).await.unwrap();
    assert!(summary.batches[0].resumed);
    for f in &killed {
        assert!(!f.exists(), "{} was left", f.display());
    }
    assert!(live.exists(), "a live process's temporary file was removed");
    assert!(fresh.exists(), "a fresh temporary file was removed");
    assert_eq!(
        committed_rows(&root.join("out/sink"), "tmp").await,
        one_shot_rows(&root.join("input")).await
    );
}

/// The review's case: a downstream pipeline whose source is this sink (list
/// mode) ingested an orphaned part for good (1,350,154 rows downstream
/// against 1,200,202 committed upstream). Fail each write of the upstream
/// run in turn, run the downstream pipeline on what the crash left, finish
/// the upstream run, run downstream again: downstream holds exactly the
/// upstream's committed rows, each once. Downstream lists the sink (`list`)
/// or reads its manifests (`manifests`).
#[tokio::test(flavor = "multi_thread")]
async fn a_pipeline_reading_this_sink_sees_only_committed_output_after_any_crash() {
    let up = |root: &std::path::Path, writes: Arc<AtomicU64>, fail_at: u64| {
        fault_context(
            root,
            &pipeline_toml("up", "parquet", "", LIMITS),
            writes,
            fail_at,
        )
    };
    let clean = tempfile::tempdir().unwrap();
    gen_files(&clean.path().join("input"), 4, 60);
    let writes = Arc::new(AtomicU64::new(0));
    run(&up(clean.path(), writes.clone(), 0)).await.unwrap();
    let total = writes.load(Ordering::SeqCst);

    for discovery in ["list", "manifests"] {
        let down_toml = downstream_toml(discovery, "");
        for k in 1..=total {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path();
            gen_files(&root.join("input"), 4, 60);
            assert!(
                run(&up(root, Arc::new(AtomicU64::new(0)), k))
                    .await
                    .is_err()
            );
            let down = || local_context(&pipeline(root, &down_toml));
            run(&down())
                .await
                .unwrap_or_else(|e| panic!("{discovery} downstream after failing write {k}: {e}"));
            run(&up(root, Arc::new(AtomicU64::new(0)), 0))
                .await
                .unwrap();
            run(&down()).await.unwrap();
            let upstream = committed_rows(&root.join("out/sink"), "up").await;
            assert_eq!(upstream, one_shot_rows(&root.join("input")).await);
            assert_eq!(
                committed_rows(&root.join("down/sink"), "down").await,
                upstream,
                "{discovery} downstream after failing upstream write {k}"
            );
        }
    }
}

/// A task renews the heartbeat (a compare-and-swap of control) when a third
/// of the TTL has passed: failing that write fails the task before it
/// writes anything, and the retried task and the commit give the clean
/// output.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_failing_at_its_heartbeat_write_is_retried_with_the_same_output() {
    use sluice_engine::handlers::{self, PlanOutcome};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 100);
    let toml = pipeline_toml("beat", "parquet", "", "");
    let ctx = local_context(&pipeline(root, &toml));
    let PlanOutcome::Batch { run: r, batch } = handlers::plan(&ctx, None).await.unwrap() else {
        panic!("a batch was planned");
    };
    let (before, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    // Six minutes later (TTL 15): the task's first write is the heartbeat.
    let later = |fail_at: u64| {
        let mut c = fault_context(root, &toml, Arc::new(AtomicU64::new(0)), fail_at);
        c.clock = Arc::new(|| chrono::Utc::now().timestamp_millis() + 6 * 60_000);
        c
    };
    let failed = handlers::operate(&later(1), &r, batch.batch, batch.tasks[0])
        .await
        .unwrap_err();
    assert!(
        failed.to_string().contains("injected failure at write 1"),
        "{failed}"
    );
    let (after, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(after, before, "the failed heartbeat changed control");
    assert_eq!(staged_files(&root.join("out/sink")), Vec::<String>::new());

    let retry = later(0);
    for t in &batch.tasks {
        handlers::operate(&retry, &r, batch.batch, *t)
            .await
            .unwrap();
    }
    let (beat, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert!(
        beat.heartbeat_ms > before.heartbeat_ms,
        "no heartbeat written"
    );
    handlers::commit(&retry, &r, batch.batch).await.unwrap();
    assert_eq!(
        committed_rows(&root.join("out/sink"), "beat").await,
        one_shot_rows(&root.join("input")).await
    );
}
