//! Crash recovery: fail each storage write of a two-batch run in turn (and,
//! separately, kill a `sluice run` process at several points); running again
//! must give exactly the output of a clean run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_engine::handlers::Context;
use sluice_engine::storage::{LocalStore, Store};

use crate::support::*;

const LIMITS: &str = "max_files_per_batch = 2";

fn faulty_context(root: &std::path::Path, writes: Arc<AtomicU64>, fail_at: u64) -> Context {
    let p = pipeline(root, &pipeline_toml("crash", "parquet", "", LIMITS));
    let wrap = |path: std::path::PathBuf| -> Arc<dyn Store> {
        Arc::new(FaultStore {
            inner: Arc::new(LocalStore::new(path)),
            writes: writes.clone(),
            fail_at,
        })
    };
    let source: Arc<dyn Store> = Arc::new(LocalStore::new(root.join("input")));
    let mut ctx = Context::new(
        p,
        source,
        wrap(root.join("out/sink")),
        wrap(root.join("out/checkpoint/crash")),
    );
    ctx.owner_gone = Arc::new(|_| true);
    ctx
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_any_write_then_rerunning_gives_the_clean_output() {
    // A clean run, counting its writes.
    let clean = tempfile::tempdir().unwrap();
    gen_files(&clean.path().join("input"), 4, 60);
    let writes = Arc::new(AtomicU64::new(0));
    let summary = run(&faulty_context(clean.path(), writes.clone(), 0))
        .await
        .unwrap();
    assert_eq!(summary.batches.len(), 2, "the scenario needs two batches");
    let total_writes = writes.load(Ordering::SeqCst);
    let expected = committed_rows(&clean.path().join("out/sink"), "crash").await;
    assert_eq!(expected, one_shot_rows(&clean.path().join("input")).await);
    assert!(total_writes >= 10, "only {total_writes} writes");
    eprintln!("crash test: failing each of {total_writes} writes in turn");

    for k in 1..=total_writes {
        let dir = tempfile::tempdir().unwrap();
        gen_files(&dir.path().join("input"), 4, 60);
        let writes = Arc::new(AtomicU64::new(0));
        let failed = run(&faulty_context(dir.path(), writes, k)).await;
        assert!(
            failed.is_err(),
            "write {k} was injected to fail, yet the run succeeded"
        );

        let again = run(&faulty_context(dir.path(), Arc::new(AtomicU64::new(0)), 0))
            .await
            .unwrap_or_else(|e| panic!("rerun after failing write {k}: {e}"));
        assert!(
            matches!(again.end, sluice_engine::runner::RunEnd::Done),
            "after write {k}: {:?}",
            again.end
        );
        let got = committed_rows(&dir.path().join("out/sink"), "crash").await;
        assert_eq!(
            got.len(),
            expected.len(),
            "row count after failing write {k}"
        );
        assert_eq!(got, expected, "output after failing write {k}");
        assert_eq!(
            orphan_files(&dir.path().join("out/sink"), "crash").await,
            Vec::<String>::new(),
            "uncommitted files left after failing write {k}"
        );
        let ctx = faulty_context(dir.path(), Arc::new(AtomicU64::new(0)), 0);
        let (control, _) = ctx.checkpoint.control().await.unwrap().unwrap();
        assert_eq!(control.last_committed, Some(1), "after failing write {k}");
        assert_eq!(control.totals.files, 4, "after failing write {k}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_process_at_any_point_then_rerunning_gives_the_clean_output() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 12, 5_000);
    let toml = pipeline_toml("kill", "parquet", "", "max_files_per_batch = 1");
    std::fs::write(root.join("pipeline.toml"), &toml).unwrap();
    let bin = env!("CARGO_BIN_EXE_sluice");
    // Start a run and kill it after a delay, again and again with varying
    // delays, until a run finishes by itself.
    let mut killed_mid_run = 0;
    for attempt in 0..40 {
        let delay_ms = [10u64, 35, 70, 120, 200][attempt % 5];
        let mut child = std::process::Command::new(bin)
            .arg("run")
            .arg(root.join("pipeline.toml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
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
    let out = std::process::Command::new(bin)
        .arg("run")
        .arg(root.join("pipeline.toml"))
        .output()
        .unwrap();
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
    let p = pipeline(root, &toml);
    let (control, _) = local_context(&p)
        .checkpoint
        .control()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(control.totals.files, 12);
    assert_eq!(control.last_committed, Some(11));
}
