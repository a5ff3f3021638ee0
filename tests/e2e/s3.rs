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
