//! The same pipeline pointed at S3 (a moto server on loopback, through
//! AWS_ENDPOINT_URL) commits the same output as on a local folder, and an
//! idle run there also needs at most two requests.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use sluice_engine::handlers::Context;
use sluice_engine::pipeline::Pipeline;
use sluice_engine::sinks::ParquetSink;
use sluice_engine::storage::{PutMode, S3Config, S3Store, Store};

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn s3_pipeline_matches_the_local_one() {
    let cfg = S3Config::from_env().await;
    let bucket = fresh_bucket(&cfg, "e2e").await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let files = gen_files(&input, 5, 300);

    let upload = |from: &[std::path::PathBuf]| {
        let source = S3Store::new(&cfg, &bucket, "landing/trips");
        let input = input.clone();
        let from = from.to_vec();
        async move {
            for f in from {
                let mut key = f
                    .strip_prefix(&input)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                if key.ends_with("trips-000004.parquet") {
                    // S3 keys may hold spaces and non-ASCII: read them as written.
                    key = key.replace("trips-000004", "trips-000004 ü copy");
                }
                source
                    .put(
                        &key,
                        Bytes::from(std::fs::read(&f).unwrap()),
                        PutMode::Overwrite,
                    )
                    .await
                    .unwrap();
            }
        }
    };
    upload(&files[..3]).await;

    let toml = format!(
        r#"name = "s3e2e"
[source]
uri = "s3://{bucket}/landing/trips/"
format = "parquet"
table = "trips"
discovery = "ordered"
[query]
sql = '''{SQL}'''
[sink]
uri = "s3://{bucket}/curated/trips/"
[checkpoint]
uri = "s3://{bucket}/_checkpoints/"
[limits]
max_files_per_batch = 2
"#
    );
    let p = Pipeline::parse(&toml, "s3.toml", dir.path()).unwrap();
    let open = || {
        let mut ctx = Context::open(p.clone(), Some(&cfg)).unwrap();
        test_mode(&mut ctx);
        ctx
    };
    let first = run(&open()).await.unwrap();
    assert_eq!(first.batches.len(), 2);
    let idle_ctx = open();
    let idle = run(&idle_ctx).await.unwrap();
    assert!(
        matches!(idle.end, sluice_engine::runner::RunEnd::Idle(_)),
        "{:?}",
        idle.end
    );
    assert!(idle.requests.total() <= 2, "{}", idle.requests);
    assert_eq!(idle.requests.writes(), 0);

    upload(&files[3..]).await;
    let second = run(&open()).await.unwrap();
    assert_eq!(second.batches.iter().map(|b| b.files).sum::<u64>(), 2);

    // Read exactly the committed files from S3 and compare with one-shot SQL.
    let sink_store = Arc::new(S3Store::new(&cfg, &bucket, "curated/trips"));
    let access = sink_store.scan_access().unwrap();
    let sink = ParquetSink::new(sink_store, "s3e2e");
    let df = SessionContext::new();
    df.register_object_store(access.url.as_ref(), access.store.clone());
    let mut batches = Vec::new();
    for m in sink.manifests().await.unwrap() {
        for f in m.files {
            let url = format!("s3://{bucket}/curated/trips/{}", f.key);
            batches.extend(
                df.read_parquet(url, ParquetReadOptions::default())
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap(),
            );
        }
    }
    assert_eq!(rows_of(&batches), one_shot_rows(&input).await);
}

/// A file replaced on S3 after its batch was planned is not read (every
/// read is pinned to the planned ETag with If-Match): the batch fails
/// naming it, nothing is committed, and the next run plans afresh and
/// commits the new version, once.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_replaced_after_planning_is_not_read_as_planned() {
    use sluice_engine::handlers::{self, PlanOutcome};
    let case = S3Case::new("pinned", 2, 300).await;
    let (files, keys) = (&case.files, &case.keys);
    let ctx = case.context();
    let PlanOutcome::Batch { run: r, batch } = handlers::plan(&ctx, None).await.unwrap() else {
        panic!("a batch was planned");
    };
    // The second file is replaced by another (other rows, other size).
    let other = sluice_cli::generator::encode(
        &sluice_cli::generator::taxi_batch(77, 500),
        sluice_engine::pipeline::SourceFormat::Parquet,
        None,
    )
    .unwrap();
    std::fs::write(&files[1], &other).unwrap();
    case.source
        .put(&keys[1], Bytes::from(other), PutMode::Overwrite)
        .await
        .unwrap();
    let mut failed = None;
    for task in &batch.tasks {
        if let Err(e) = handlers::operate(&ctx, &r, batch.batch, *task).await {
            failed = Some(e.to_string());
        }
    }
    let err = failed.expect("a task read the replaced file");
    assert!(
        err.contains(&keys[1]) && err.contains("replaced since the batch was planned"),
        "{err}"
    );
    // The run ends as the state machine would end it (the refusal drops
    // the plan); the next run commits the new version, once.
    let req = handlers::CommitRequest {
        retries: 0,
        action: handlers::CommitAction::Abandon,
        pipeline: "pinned".into(),
        run: r.clone(),
        batch: batch.batch,
        workflow: Default::default(),
        started: None,
    };
    handlers::handle_commit(&ctx, req).await.unwrap();
    let next = run(&case.context()).await.unwrap();
    assert_eq!(next.batches.iter().map(|b| b.files).sum::<u64>(), 2);
    assert_eq!(case.committed().await, duckdb_rows(files, SQL).await);
}

/// A file deleted from S3 between planning and reading (its pinned read
/// finds no object): the batch commits the other files and names it under
/// `gone`; no failure, nothing read twice. Before: "not found; fix or
/// replace the file", and every run planned and failed it again.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_deleted_from_s3_after_planning_is_left_out() {
    use sluice_engine::handlers::{self, PlanOutcome};
    let case = S3Case::new("gone", 3, 100).await;
    let ctx = case.context();
    let PlanOutcome::Batch { run: r, batch } = handlers::plan(&ctx, None).await.unwrap() else {
        panic!("a batch was planned");
    };
    case.source.delete(&case.keys[1]).await.unwrap();
    for task in &batch.tasks {
        handlers::operate(&ctx, &r, batch.batch, *task)
            .await
            .unwrap();
    }
    let record = handlers::commit(&ctx, &r, batch.batch).await.unwrap();
    assert_eq!(record.gone, [case.keys[1].clone()]);
    assert_eq!(record.files, 2);
    assert_eq!(
        case.committed().await,
        duckdb_rows(&[case.files[0].clone(), case.files[2].clone()], SQL).await
    );
}

/// Generated Parquet files uploaded under `s3://<fresh bucket>/in/`, and a
/// pipeline over them (sink `out/`, checkpoint `ck/`).
struct S3Case {
    name: String,
    cfg: S3Config,
    bucket: String,
    _dir: tempfile::TempDir,
    files: Vec<std::path::PathBuf>,
    keys: Vec<String>,
    source: S3Store,
    pipeline: Pipeline,
}

impl S3Case {
    async fn new(name: &str, files: u64, rows: usize) -> S3Case {
        let cfg = S3Config::from_env().await;
        let bucket = fresh_bucket(&cfg, name).await;
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("input");
        let files = gen_files(&input, files, rows);
        let source = S3Store::new(&cfg, &bucket, "in");
        let keys: Vec<String> = files
            .iter()
            .map(|f| {
                f.strip_prefix(&input)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        for (f, k) in files.iter().zip(&keys) {
            let bytes = Bytes::from(std::fs::read(f).unwrap());
            source.put(k, bytes, PutMode::Overwrite).await.unwrap();
        }
        let toml = format!(
            r#"name = "{name}"
[source]
uri = "s3://{bucket}/in/"
format = "parquet"
table = "trips"
[query]
sql = '''{SQL}'''
[sink]
uri = "s3://{bucket}/out/"
[checkpoint]
uri = "s3://{bucket}/ck/"
"#
        );
        let pipeline = Pipeline::parse(&toml, "case.toml", dir.path()).unwrap();
        S3Case {
            name: name.to_string(),
            cfg,
            bucket,
            _dir: dir,
            files,
            keys,
            source,
            pipeline,
        }
    }

    fn context(&self) -> Context {
        let mut ctx = Context::open(self.pipeline.clone(), Some(&self.cfg)).unwrap();
        test_mode(&mut ctx);
        ctx
    }

    /// The committed rows, read from a local copy of the sink.
    async fn committed(&self) -> Vec<String> {
        let out = tempfile::tempdir().unwrap();
        let sink = S3Store::new(&self.cfg, &self.bucket, "out");
        for m in sink.list("", None).await.unwrap() {
            let obj = sink.get(&m.key).await.unwrap().unwrap();
            let path = out.path().join(&m.key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, obj.bytes).unwrap();
        }
        committed_rows(out.path(), &self.name).await
    }
}

/// `[deduplicate]` over an S3 source: the tasks read the bucket through
/// its own store (a local folder needs none, so only an S3 or record
/// stream source showed they did not register it); each key's first row by
/// arrival, against DuckDB over the same files.
#[tokio::test(flavor = "multi_thread")]
async fn an_s3_source_is_deduplicated() {
    let cfg = S3Config::from_env().await;
    let bucket = fresh_bucket(&cfg, "dedup").await;
    let dir = tempfile::tempdir().unwrap();
    let source = S3Store::new(&cfg, &bucket, "landing/rides");
    let mut files = Vec::new();
    for i in 0..3 {
        let f = crate::dedup::write_rides(dir.path(), i, &crate::dedup::rides(i, 20, 15));
        let key = f.file_name().unwrap().to_str().unwrap().to_string();
        source
            .put(
                &key,
                Bytes::from(std::fs::read(&f).unwrap()),
                PutMode::Overwrite,
            )
            .await
            .unwrap();
        files.push(f);
    }
    let toml = crate::dedup::dedup_toml(
        "s3dedup",
        crate::dedup::ROWS_SQL,
        true,
        "max_files_per_batch = 2\nstate_partitions = 2",
    )
    .replace(
        "uri = \"input\"",
        &format!("uri = \"s3://{bucket}/landing/rides/\"\ndiscovery = \"ordered\""),
    );
    let p = Pipeline::parse(&toml, "s3.toml", dir.path()).unwrap();
    let mut ctx = Context::open(p, Some(&cfg)).unwrap();
    test_mode(&mut ctx);
    let summary = run(&ctx).await.unwrap();
    assert_eq!(summary.batches.len(), 2);
    let want = crate::dedup::forever_want(&files, crate::dedup::ROWS_SQL).await;
    assert!(!want.is_empty());
    assert_eq!(
        committed_rows(&dir.path().join("out/sink"), "s3dedup").await,
        want
    );
}

/// A staged part written over between its task and the commit with other
/// bytes of the same size (as a late write of another attempt of the task
/// would) is refused by the commit's check, which compares the entity tag
/// the task's write returned as well as the size; nothing is published,
/// and the next run writes the batch again: the output equals DuckDB's.
/// Before, the check compared sizes only and published the altered bytes.
#[tokio::test(flavor = "multi_thread")]
async fn a_staged_part_written_over_at_the_same_size_is_not_published() {
    use sluice_engine::handlers::{self, PlanOutcome};
    let case = S3Case::new("overwritten", 2, 300).await;
    let ctx = case.context();
    let PlanOutcome::Batch { run: r, batch } = handlers::plan(&ctx, None).await.unwrap() else {
        panic!("a batch was planned");
    };
    for task in &batch.tasks {
        handlers::operate(&ctx, &r, batch.batch, *task)
            .await
            .unwrap();
    }
    let sink = S3Store::new(&case.cfg, &case.bucket, "out");
    let staged: Vec<String> = sink
        .list("_sluice/staging/", None)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .filter(|k| k.ends_with(".parquet.staged"))
        .collect();
    assert!(!staged.is_empty());
    for key in &staged {
        let mut bytes = sink.get(key).await.unwrap().unwrap().bytes.to_vec();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        sink.put(key, Bytes::from(bytes), PutMode::Overwrite)
            .await
            .unwrap();
    }
    let err = handlers::commit(&ctx, &r, batch.batch).await.unwrap_err();
    assert_eq!(err.class(), sluice_engine::ErrorClass::Retryable, "{err}");
    assert!(err.to_string().contains("written over"), "{err}");
    assert!(
        sink.list("_sluice/manifest/", None)
            .await
            .unwrap()
            .is_empty(),
        "published"
    );
    let next = run(&case.context()).await.unwrap();
    assert_eq!(next.batches.iter().map(|b| b.files).sum::<u64>(), 2);
    assert_eq!(case.committed().await, duckdb_rows(&case.files, SQL).await);
}
