//! Checkpoint properties: retention, start-up cost independent of history,
//! refusal of spec changes that would corrupt state, and local atomicity
//! across processes.

use std::sync::Arc;

use bytes::Bytes;
use sluice_engine::handlers::Context;
use sluice_engine::storage::{LocalStore, PutMode, PutOutcome, Store};

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn old_records_are_pruned_and_planning_cost_does_not_grow_with_history() {
    let mut per_history = Vec::new();
    for history in [6u64, 24] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let toml = pipeline_toml(
            "hist",
            "parquet",
            "discovery = \"ordered\"\nlookback = 5",
            "max_files_per_batch = 1",
        )
        .replace("[checkpoint]\n", "[checkpoint]\nretain_batches = 4\n");
        let p = pipeline(root, &toml);
        gen_files(&root.join("input"), history, 10);
        let s = run(&local_context(&p)).await.unwrap();
        assert_eq!(s.batches.len() as u64, history);

        let ctx = local_context(&p);
        let kept = |prefix: &'static str| {
            let store = ctx.checkpoint.store().clone();
            async move { store.list(prefix, None).await.unwrap().len() }
        };
        assert_eq!(
            kept("offsets/").await,
            4,
            "offsets kept with history {history}"
        );
        assert_eq!(
            kept("commits/").await,
            4,
            "commits kept with history {history}"
        );

        // One new file: a new process plans and commits it.
        gen_files(&root.join("input"), 1, 10);
        let ctx = local_context(&p);
        let s = run(&ctx).await.unwrap();
        assert_eq!(s.batches.len(), 1);
        let reads = s.requests.get + s.requests.list;
        per_history.push(reads);
        assert_eq!(
            committed_rows(&root.join("out/sink"), "hist").await,
            one_shot_rows(&root.join("input")).await
        );
    }
    assert_eq!(
        per_history[0], per_history[1],
        "reads of a one-file run must not depend on history (6 vs 24 batches)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn spec_changes_that_would_corrupt_state_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 10);
    let ordered = pipeline_toml("spec", "parquet", "discovery = \"ordered\"", "");
    run(&local_context(&pipeline(root, &ordered)))
        .await
        .unwrap();
    let newest = gen_files(&root.join("input"), 1, 10).remove(0);

    let to_list = pipeline(root, &ordered.replace("\"ordered\"", "\"list\""));
    let e = run(&local_context(&to_list)).await.unwrap_err().to_string();
    assert!(e.contains("discovery changed from ordered to list"), "{e}");

    let declared = ordered.replace(
        "discovery = \"ordered\"",
        "discovery = \"ordered\"\nschema = [{ name = \"VendorID\", type = \"Utf8\" }]",
    );
    let e = run(&local_context(&pipeline(root, &declared)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("source schema changed"), "{e}");

    // A compatible change (the SQL) is accepted and used from then on: the
    // new file's batch holds what the new query gives over that file alone
    // (a one-shot DataFusion query), which the old query would not.
    let new_sql = ordered.replace("WHERE trip_distance > 1.0", "WHERE trip_distance > 5.0");
    let s = run(&local_context(&pipeline(root, &new_sql)))
        .await
        .unwrap();
    assert_eq!(s.batches.len(), 1);
    let committed = batch_rows(&root.join("out/sink"), "spec", s.batches[0].batch).await;
    let with_new = file_rows(&newest, &SQL.replace("> 1.0", "> 5.0")).await;
    assert_eq!(committed, with_new);
    assert_ne!(
        committed,
        file_rows(&newest, SQL).await,
        "the change must matter"
    );
}

/// The rows `sql` gives over one Parquet file, by plain DataFusion.
async fn file_rows(file: &std::path::Path, sql: &str) -> Vec<String> {
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.register_parquet("trips", file.to_str().unwrap(), Default::default())
        .await
        .unwrap();
    rows_of(&ctx.sql(sql).await.unwrap().collect().await.unwrap())
}

/// The rows of the files batch `batch`'s manifest names.
async fn batch_rows(sink_dir: &std::path::Path, name: &str, batch: u64) -> Vec<String> {
    let sink = sluice_engine::sinks::ParquetSink::new(
        Arc::new(LocalStore::new(sink_dir.to_path_buf())),
        name,
    );
    let m = sink
        .manifests()
        .await
        .unwrap()
        .into_iter()
        .find(|m| m.batch == batch)
        .expect("the batch's manifest");
    let ctx = datafusion::prelude::SessionContext::new();
    let mut batches = Vec::new();
    for f in m.files {
        let path = sink_dir.join(&f.key);
        let df = ctx
            .read_parquet(path.to_str().unwrap(), Default::default())
            .await
            .unwrap();
        batches.extend(df.collect().await.unwrap());
    }
    rows_of(&batches)
}

/// Child side of the cross-process race below: one put, outcome on stdout.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "run by local_conditional_writes_are_atomic_across_processes"]
async fn race_child() {
    let dir = std::env::var("SLUICE_RACE_DIR").expect("set by the parent test");
    let store = LocalStore::new(dir.into());
    let mode = match std::env::var("SLUICE_RACE_ETAG") {
        Ok(etag) => PutMode::Update(etag),
        Err(_) => PutMode::Create,
    };
    let me = std::process::id().to_string();
    let out = store.put("race.json", Bytes::from(me), mode).await.unwrap();
    println!(
        "RACE {}",
        if matches!(out, PutOutcome::Written(_)) {
            "won"
        } else {
            "lost"
        }
    );
}

fn race(dir: &std::path::Path, etag: Option<&str>) -> usize {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..8)
        .map(|_| {
            let mut c = std::process::Command::new(&exe);
            c.args([
                "--ignored",
                "--exact",
                "checkpoint::race_child",
                "--nocapture",
            ])
            .env("SLUICE_RACE_DIR", dir);
            if let Some(e) = etag {
                c.env("SLUICE_RACE_ETAG", e);
            }
            c.stdout(std::process::Stdio::piped()).spawn().unwrap()
        })
        .collect();
    let mut won = 0;
    let mut answered = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        won += text.matches("RACE won").count();
        answered += text.matches("RACE ").count();
    }
    assert_eq!(answered, 8, "every child process must report");
    won
}

#[tokio::test(flavor = "multi_thread")]
async fn local_conditional_writes_are_atomic_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        race(dir.path(), None),
        1,
        "racing create-only writers in 8 processes"
    );
    let store = Arc::new(LocalStore::new(dir.path().to_path_buf()));
    let etag = store.get("race.json").await.unwrap().unwrap().etag;
    assert_eq!(
        race(dir.path(), Some(&etag)),
        1,
        "racing compare-and-swap writers in 8 processes"
    );
}

/// A batch longer than a third of the lease TTL: the runner's heartbeat
/// refreshes the lease while it works (otherwise a trigger would take it
/// over), and the run still ends idle.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_batch_keeps_its_lease_alive_with_heartbeats() {
    use sluice_engine::checkpoint::RunStatus;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gen_files(&root.join("input"), 2, 50);
    // TTL 3 s: a heartbeat every second; every sink write takes 1.2 s.
    let p = pipeline(
        root,
        &pipeline_toml("beat", "parquet", "", "lease_ttl_seconds = 3"),
    );
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut ctx = Context::new(
        p,
        Arc::new(LocalStore::new(root.join("input"))),
        Arc::new(Slow::wrap(
            Arc::new(LocalStore::new(root.join("out/sink"))),
            std::time::Duration::from_millis(1200),
        )),
        Arc::new(ControlLog::wrap(
            Arc::new(LocalStore::new(root.join("out/checkpoint/beat"))),
            log.clone(),
        )),
    );
    test_mode(&mut ctx);
    let summary = run(&ctx).await.unwrap();
    assert_eq!(summary.batches.len(), 1);
    let log = log.lock().unwrap().clone();
    // Heartbeats: writes that change nothing but the heartbeat of the
    // running epoch.
    let beats = log
        .windows(2)
        .filter(|w| {
            let (a, b) = (&w[0], &w[1]);
            let mut same = b.clone();
            same.heartbeat_ms = a.heartbeat_ms;
            b.status == RunStatus::Running && same == *a && b.heartbeat_ms > a.heartbeat_ms
        })
        .count();
    assert!(
        beats >= 1,
        "no heartbeat during a {} ms run: {log:?}",
        summary.millis
    );
    assert_eq!(log.last().unwrap().status, RunStatus::Idle);
    eprintln!(
        "heartbeat: {beats} heartbeats in a {} ms run",
        summary.millis
    );
}

/// The review's cases: checkpoint records edited by hand were not caught.
/// A deleted index had every processed file read again (duplicates); an
/// epoch of u64::MAX wrapped to 0; a format version no build writes was
/// read; a `last_committed` past the last commit made the next batch
/// number jump. Each is now refused, naming the record, with nothing
/// written.
#[tokio::test(flavor = "multi_thread")]
async fn records_edited_by_hand_are_refused_naming_them() {
    for (case, discovery) in [
        ("index deleted", ""),
        ("epoch at its maximum", ""),
        ("format version from the future", ""),
        ("last_committed past the commits", ""),
        ("last_committed past the commits", "discovery = \"notify\""),
        // Its index is in control.json, written with `last_committed`.
        ("last_committed past the commits", "discovery = \"ordered\""),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let toml = pipeline_toml("edit", "parquet", discovery, "max_files_per_batch = 1");
        let input = root.join("input");
        let files = gen_files(&input, 2, 20);
        let ctx = || local_context(&pipeline(root, &toml));
        if !discovery.is_empty() {
            sluice_engine::discovery::record_notified(
                ctx().checkpoint.store(),
                notified(&files, &input),
            )
            .await
            .unwrap();
        }
        run(&ctx()).await.unwrap();
        let expected = committed_rows(&root.join("out/sink"), "edit").await;
        let ck = root.join("out/checkpoint/edit");
        let edit = |key: &str, change: &dyn Fn(&mut serde_json::Value)| {
            let path = ck.join(key);
            let mut v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            change(&mut v);
            std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
        };
        let named = match case {
            "index deleted" => {
                std::fs::remove_file(ck.join("index/processed.json")).unwrap();
                "index/processed.json"
            }
            "epoch at its maximum" => {
                edit("control.json", &|v| v["epoch"] = u64::MAX.into());
                "control.json"
            }
            "format version from the future" => {
                edit("control.json", &|v| v["format_version"] = 999.into());
                "control.json"
            }
            _ => {
                edit("control.json", &|v| v["last_committed"] = 99.into());
                "control.json"
            }
        };
        // New input, so the run has work to plan.
        let more = gen_files(&input, 1, 20);
        if !discovery.is_empty() {
            sluice_engine::discovery::record_notified(
                ctx().checkpoint.store(),
                notified(&more, &input),
            )
            .await
            .unwrap();
        }
        let before = std::fs::read_dir(ck.join("offsets")).unwrap().count();
        let err = run(&ctx()).await.unwrap_err().to_string();
        assert!(
            err.contains(named) && (err.contains("sluice reset") || err.contains("backup")),
            "{case} ({discovery}): {err}"
        );
        assert_eq!(
            std::fs::read_dir(ck.join("offsets")).unwrap().count(),
            before,
            "{case}: a batch was planned"
        );
        assert_eq!(
            committed_rows(&root.join("out/sink"), "edit").await,
            expected,
            "{case}: the committed output changed"
        );
    }
}
