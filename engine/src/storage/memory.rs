//! An in-memory [`Store`] for unit tests of logic. It wraps object_store's
//! `InMemory`, whose conditional puts are atomic, so DataFusion can scan the
//! same objects.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::execution::object_store::ObjectStoreUrl;
use futures::TryStreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore as _, ObjectStoreExt as _, PutOptions, PutPayload, UpdateVersion};

use super::{
    Object, ObjectMeta, PutMode, PutOutcome, RequestCounter, RequestCounts, RequestKind,
    ScanAccess, Store,
};
use crate::error::StoreError;

/// A [`Store`] in memory; cheap to clone (clones share the objects).
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<InMemory>,
    counter: Arc<RequestCounter>,
    id: u64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        MemoryStore {
            inner: Arc::new(InMemory::new()),
            counter: Arc::default(),
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }
}

fn object_path(key: &str) -> Path {
    Path::parse(key).unwrap_or_else(|_| Path::from(key))
}

fn fail(op: &'static str, key: &str, e: object_store::Error) -> StoreError {
    StoreError::Permanent {
        op,
        location: format!("memory:{key}"),
        message: e.to_string(),
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.counter.add(RequestKind::Get);
        match self.inner.get(&object_path(key)).await {
            Ok(r) => {
                let etag = r.meta.e_tag.clone().unwrap_or_default();
                let bytes = r.bytes().await.map_err(|e| fail("get", key, e))?;
                Ok(Some(Object { bytes, etag }))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(fail("get", key, e)),
        }
    }

    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<PutOutcome, StoreError> {
        self.counter.add(mode.kind());
        let mode = match mode {
            PutMode::Overwrite => object_store::PutMode::Overwrite,
            PutMode::Create => object_store::PutMode::Create,
            PutMode::Update(etag) => object_store::PutMode::Update(UpdateVersion {
                e_tag: Some(etag),
                version: None,
            }),
        };
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        match self
            .inner
            .put_opts(&object_path(key), PutPayload::from_bytes(bytes), opts)
            .await
        {
            Ok(r) => Ok(PutOutcome::Written(r.e_tag.unwrap_or_default())),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }
                | object_store::Error::NotFound { .. },
            ) => Ok(PutOutcome::Conflict),
            Err(e) => Err(fail("put", key, e)),
        }
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, StoreError> {
        self.counter.add(RequestKind::List);
        // InMemory lists by path segments; filter on the raw key prefix.
        let dir = prefix.rsplit_once('/').map(|(d, _)| object_path(d));
        let stream = match start_after {
            Some(s) => self.inner.list_with_offset(dir.as_ref(), &object_path(s)),
            None => self.inner.list(dir.as_ref()),
        };
        let mut out: Vec<ObjectMeta> = stream
            .map_err(|e| fail("list", prefix, e))
            .try_filter_map(|m| async move {
                let key = m.location.to_string();
                Ok(key.starts_with(prefix).then_some(ObjectMeta {
                    key,
                    size: m.size,
                    etag: m.e_tag,
                    last_modified: Some(m.last_modified),
                }))
            })
            .try_collect()
            .await?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.counter.add(RequestKind::Delete);
        match self.inner.delete(&object_path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(fail("delete", key, e)),
        }
    }

    fn counts(&self) -> RequestCounts {
        self.counter.snapshot()
    }

    fn describe(&self) -> String {
        format!("memory://{}", self.id)
    }

    fn scan_access(&self) -> Result<ScanAccess, StoreError> {
        Ok(ScanAccess {
            url: ObjectStoreUrl::parse(format!("memory://{}", self.id)).expect("valid url"),
            store: self.inner.clone(),
            root: String::new(),
        })
    }
}
