//! An in-memory [`Store`] for unit tests of logic and benchmarks. It wraps
//! object_store's `InMemory`, whose conditional puts are atomic, so
//! DataFusion can scan the same objects; listings come from a sorted map of
//! its own, so a listing after a key costs what it returns, as on S3.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::execution::object_store::ObjectStoreUrl;
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
    listing: Arc<std::sync::Mutex<std::collections::BTreeMap<String, ObjectMeta>>>,
    counter: Arc<RequestCounter>,
    id: u64,
    /// Held by every write, so a compare-and-delete is atomic against
    /// puts (`InMemory` has no conditional delete of its own).
    writes: Arc<tokio::sync::Mutex<()>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        MemoryStore {
            inner: Arc::new(InMemory::new()),
            listing: Arc::default(),
            counter: Arc::default(),
            writes: Arc::default(),
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

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        self.counter.add(RequestKind::Get);
        match self.inner.head(&object_path(key)).await {
            Ok(m) => Ok(Some(ObjectMeta {
                key: key.to_string(),
                size: m.size,
                etag: m.e_tag,
                last_modified: Some(m.last_modified),
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(fail("head", key, e)),
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
        let _writing = self.writes.lock().await;
        let size = bytes.len() as u64;
        match self
            .inner
            .put_opts(&object_path(key), PutPayload::from_bytes(bytes), opts)
            .await
        {
            Ok(r) => {
                let etag = r.e_tag.unwrap_or_default();
                self.listing.lock().expect("not poisoned").insert(
                    key.to_string(),
                    ObjectMeta {
                        key: key.to_string(),
                        size,
                        etag: Some(etag.clone()),
                        last_modified: Some(chrono::Utc::now()),
                    },
                );
                Ok(PutOutcome::Written(etag))
            }
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
        use std::ops::Bound;
        let listing = self.listing.lock().expect("not poisoned");
        let from = match start_after {
            Some(s) if s >= prefix => Bound::Excluded(s.to_string()),
            _ => Bound::Included(prefix.to_string()),
        };
        let out: Vec<ObjectMeta> = listing
            .range((from, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, m)| m.clone())
            .collect();
        self.counter.add_listing(out.len());
        Ok(out)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.counter.add(RequestKind::Delete);
        let _writing = self.writes.lock().await;
        self.listing.lock().expect("not poisoned").remove(key);
        match self.inner.delete(&object_path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(fail("delete", key, e)),
        }
    }

    async fn delete_if(&self, key: &str, etag: &str) -> Result<bool, StoreError> {
        self.counter.add(RequestKind::Delete);
        let _writing = self.writes.lock().await;
        let path = object_path(key);
        match self.inner.head(&path).await {
            Ok(meta) if meta.e_tag.as_deref() == Some(etag) => {}
            Ok(_) | Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(fail("delete", key, e)),
        }
        self.listing.lock().expect("not poisoned").remove(key);
        match self.inner.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(true),
            Err(e) => Err(fail("delete", key, e)),
        }
    }

    async fn copy(&self, from: &str, to: &str) -> Result<bool, StoreError> {
        self.counter.add(RequestKind::Put);
        let _writing = self.writes.lock().await;
        match self.inner.copy(&object_path(from), &object_path(to)).await {
            Ok(()) => {}
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(fail("copy", to, e)),
        }
        let mut listing = self.listing.lock().expect("not poisoned");
        let Some(meta) = listing.get(from).cloned() else {
            return Ok(false);
        };
        listing.insert(
            to.to_string(),
            ObjectMeta {
                key: to.to_string(),
                last_modified: Some(chrono::Utc::now()),
                ..meta
            },
        );
        Ok(true)
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
        }
        .counted(self.counter.clone()))
    }
}
