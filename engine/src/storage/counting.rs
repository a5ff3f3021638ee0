//! A store view that counts its own requests.

use std::sync::Arc;

use bytes::Bytes;

use super::{
    Object, ObjectMeta, PutMode, PutOutcome, RequestCounter, RequestCounts, RequestKind,
    ScanAccess, Store,
};
use crate::error::StoreError;

/// A view of a store that counts its own requests, so one task's requests
/// can be told apart from others running in the same process.
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn Store>,
    counter: RequestCounter,
}

impl CountingStore {
    /// Count the requests made through this view of `inner`.
    pub fn new(inner: Arc<dyn Store>) -> CountingStore {
        CountingStore {
            inner,
            counter: RequestCounter::default(),
        }
    }
}

#[async_trait::async_trait]
impl Store for CountingStore {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.counter.add(RequestKind::Get);
        self.inner.get(key).await
    }

    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<PutOutcome, StoreError> {
        self.counter.add(mode.kind());
        self.inner.put(key, bytes, mode).await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, StoreError> {
        // Pages are counted by the inner store; a view counts calls.
        self.counter.add(RequestKind::List);
        self.inner.list(prefix, start_after).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.counter.add(RequestKind::Delete);
        self.inner.delete(key).await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<bool, StoreError> {
        self.counter.add(RequestKind::Put);
        self.inner.copy(from, to).await
    }

    async fn sweep_temp(&self, prefix: &str) -> Result<u64, StoreError> {
        self.inner.sweep_temp(prefix).await
    }

    fn counts(&self) -> RequestCounts {
        self.counter.snapshot()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn scan_access(&self) -> Result<ScanAccess, StoreError> {
        self.inner.scan_access()
    }
}
