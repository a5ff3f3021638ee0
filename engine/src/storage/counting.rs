//! A store view that counts its own requests.

use std::sync::Arc;

use bytes::Bytes;

use super::{
    Object, ObjectMeta, PutMode, PutOutcome, RequestCounter, RequestCounts, RequestKind,
    ScanAccess, Store,
};
use crate::error::StoreError;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// A view of a store that counts its own requests, so one task's requests
/// can be told apart from others running in the same process.
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn Store>,
    counter: Arc<RequestCounter>,
}

impl CountingStore {
    /// Count the requests made through this view of `inner`.
    pub fn new(inner: Arc<dyn Store>) -> CountingStore {
        CountingStore::sharing(inner, Arc::default())
    }

    /// Count the requests made through this view of `inner` into `counter`
    /// (shared with other views).
    pub fn sharing(inner: Arc<dyn Store>, counter: Arc<RequestCounter>) -> CountingStore {
        CountingStore { inner, counter }
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
        let listed = self.inner.list(prefix, start_after).await;
        // The pages S3 returns such a listing in (the inner store counts
        // the same).
        self.counter
            .add_listing(listed.as_ref().map_or(0, |l: &Vec<ObjectMeta>| l.len()));
        listed
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.counter.add(RequestKind::Delete);
        self.inner.delete(key).await
    }

    async fn delete_if(&self, key: &str, etag: &str) -> Result<bool, StoreError> {
        self.counter.add(RequestKind::Delete);
        self.inner.delete_if(key, etag).await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        self.counter.add(RequestKind::Get);
        self.inner.head(key).await
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
        Ok(self.inner.scan_access()?.counted(self.counter.clone()))
    }
}

/// The object store DataFusion scans through, counting its requests as S3
/// bills them into a store's counter: each read (a range, a footer, a
/// HEAD) one GET, each listing page one LIST. Ranged reads are coalesced
/// as `object_store`'s S3 client coalesces them, whatever the store
/// underneath, so a local run counts what the same scan costs on S3.
/// (Scans only read; a multipart upload would count its start only.)
#[derive(Debug)]
pub(crate) struct CountedObjects {
    inner: Arc<dyn ObjectStore>,
    counter: Arc<RequestCounter>,
}

impl CountedObjects {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, counter: Arc<RequestCounter>) -> Self {
        CountedObjects { inner, counter }
    }
}

impl std::fmt::Display for CountedObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for CountedObjects {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.counter.add(RequestKind::Put);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.counter.add(RequestKind::Put);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.counter.add(RequestKind::Get);
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let counter = self.counter.clone();
        self.inner.delete_stream(
            locations
                .inspect(move |_| counter.add(RequestKind::Delete))
                .boxed(),
        )
    }

    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        // The first page is a request even when empty; each further
        // LIST_PAGE keys another.
        self.counter.add(RequestKind::List);
        let counter = self.counter.clone();
        let mut seen = 0usize;
        self.inner
            .list(prefix)
            .inspect(move |_| {
                seen += 1;
                if seen > 1 && (seen - 1).is_multiple_of(super::LIST_PAGE) {
                    counter.add(RequestKind::List);
                }
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.counter.add(RequestKind::List);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.counter.add(RequestKind::Put);
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    /// What a scan's requests count as, worked out by hand from S3's
    /// billing: a whole read, a ranged read and a HEAD are one GET each;
    /// ranges close together are read in one request (object_store
    /// coalesces ranges within 1 MiB), far apart in two; a listing of
    /// 2,500 keys is three pages.
    #[tokio::test]
    async fn scans_count_as_s3_bills_them() {
        let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let counter = Arc::new(RequestCounter::default());
        let store = CountedObjects::new(inner.clone(), counter.clone());
        let big = Path::from("big");
        inner
            .put(&big, PutPayload::from(vec![7u8; 4 << 20]))
            .await
            .unwrap();
        store.get(&big).await.unwrap().bytes().await.unwrap();
        store.get_range(&big, 0..10).await.unwrap();
        store.head(&big).await.unwrap();
        assert_eq!(counter.snapshot().get, 3);
        store.get_ranges(&big, &[0..10, 20..30]).await.unwrap();
        assert_eq!(counter.snapshot().get, 4, "close ranges: one request");
        store
            .get_ranges(&big, &[0..10, (3 << 20)..(3 << 20) + 10])
            .await
            .unwrap();
        assert_eq!(counter.snapshot().get, 6, "far apart: two");
        for i in 0..2500 {
            inner
                .put(&Path::from(format!("l/{i:05}")), PutPayload::from("x"))
                .await
                .unwrap();
        }
        let listed: Vec<_> = store.list(Some(&Path::from("l"))).collect::<Vec<_>>().await;
        assert_eq!(listed.len(), 2500);
        assert_eq!(counter.snapshot().list, 3);
        let none: Vec<_> = store
            .list(Some(&Path::from("nothing")))
            .collect::<Vec<_>>()
            .await;
        assert!(none.is_empty());
        assert_eq!(counter.snapshot().list, 4, "an empty listing is a request");
        assert_eq!(
            counter.snapshot().put,
            0,
            "the test's own puts were not through it"
        );
    }
}
