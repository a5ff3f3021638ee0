//! Reads pinned to the version a batch planned: an object store wrapper
//! that sends `If-Match` with the planned entity tag on every read of a
//! pinned object, so a file replaced after its batch was planned fails the
//! read (`Precondition`) instead of being read as a mix of two versions or
//! as input the plan did not name.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

use super::ScanAccess;

/// `inner`, with reads of the paths in `etags` made conditional on them.
#[derive(Debug)]
pub(crate) struct PinnedStore {
    inner: Arc<dyn ObjectStore>,
    etags: HashMap<Path, String>,
}

impl fmt::Display for PinnedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pinned({})", self.inner)
    }
}

impl ScanAccess {
    /// This access with reads of `keys` pinned to their entity tags (keys
    /// without one are read as they are).
    pub(crate) fn pinned<'a>(
        &self,
        keys: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> ScanAccess {
        let etags: HashMap<Path, String> = keys
            .into_iter()
            .filter_map(|(k, e)| e.map(|e| (self.path(k), e.to_string())))
            .collect();
        if etags.is_empty() {
            return self.clone();
        }
        ScanAccess {
            url: self.url.clone(),
            store: Arc::new(PinnedStore {
                inner: self.store.clone(),
                etags,
            }),
            root: self.root.clone(),
        }
    }
}

#[async_trait]
impl ObjectStore for PinnedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, mut options: GetOptions) -> Result<GetResult> {
        if options.if_match.is_none()
            && let Some(etag) = self.etags.get(location)
        {
            options.if_match = Some(etag.clone());
        }
        self.inner.get_opts(location, options).await
    }

    // `get_ranges` keeps the trait's coalescing default, which reads each
    // range through `get_opts` above: every range is conditional.

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
