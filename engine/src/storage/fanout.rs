//! Bounded concurrency for many small requests (inbox entries, claims,
//! deletions, HEADs): at most `CONCURRENT_REQUESTS` (32) in flight, however
//! many items, so neither a Lambda's sockets nor S3's per-prefix rate is
//! overrun.

use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};

use super::Store;
use crate::error::Result;

/// How many inbox or claim requests a trigger or run keeps in flight.
pub(crate) const CONCURRENT_REQUESTS: usize = 32;

/// Apply `op` to every item with up to `CONCURRENT_REQUESTS` (32) in flight;
/// results in input order, the first error returned.
pub async fn concurrently<T, R, F, Fut>(items: Vec<T>, op: F) -> Result<Vec<R>>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<R>>,
{
    futures::stream::iter(items.into_iter().map(op))
        .buffered(CONCURRENT_REQUESTS)
        .try_collect()
        .await
}

/// Delete `keys` from `store`, concurrently.
pub(crate) async fn delete_all(store: &Arc<dyn Store>, keys: Vec<String>) -> Result<()> {
    concurrently(keys, |key| {
        let store = store.clone();
        async move { Ok(store.delete(&key).await?) }
    })
    .await?;
    Ok(())
}
