//! The object-store seam: every byte Sluice reads or writes goes through
//! [`Store`], so the checkpoint protocol runs the same on a local folder, in
//! memory and on S3.
//!
//! Guarantees an implementation must give (the protocols depend on them):
//! - **read-after-write**: a `get` or `list` after a successful `put` sees it;
//! - **create-only put** ([`PutMode::Create`]): of racing writers of one key,
//!   exactly one succeeds and the others get [`PutOutcome::Conflict`], also
//!   across processes;
//! - **compare-and-swap put** ([`PutMode::Update`]): succeeds only while the
//!   key's current etag equals the given one, atomically;
//! - **compare-and-delete** ([`Store::delete_if`]): deletes only while the
//!   key's current etag equals the given one, atomically (S3 `If-Match` on
//!   DeleteObject);
//! - **copy conditional on its source**: a [`Store::copy`] whose source is
//!   gone when it takes effect writes nothing (publishing from staging
//!   relies on it: a run that lost its lease cannot publish what a reset or
//!   a newer run removed);
//! - **atomic objects**: a reader sees a whole old or a whole new object, never
//!   a torn one;
//! - `list` returns keys in ascending byte order, starting after `start_after`.
//!
//! Every call is counted by kind ([`RequestCounts`]), so tests and benchmarks
//! can assert how many requests a run made.

mod counting;
pub mod fanout;
mod local;
mod memory;
mod pinned;
mod s3;

pub use counting::CountingStore;
pub use local::LocalStore;
pub use memory::MemoryStore;
pub(crate) use s3::root_cause;
pub use s3::{S3Config, S3Store};

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use datafusion::execution::object_store::ObjectStoreUrl;

use crate::error::StoreError;

/// One listed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Key relative to the store's root.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// Entity tag, where the listing gives one.
    pub etag: Option<String>,
    /// Last modification time.
    pub last_modified: Option<DateTime<Utc>>,
}

/// An object's content with the etag to use for a later compare-and-swap.
#[derive(Debug, Clone)]
pub struct Object {
    /// Whole content.
    pub bytes: Bytes,
    /// Version of this content, for [`PutMode::Update`].
    pub etag: String,
}

/// How a put treats an existing object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutMode {
    /// Replace whatever is there.
    Overwrite,
    /// Write only if the key does not exist (S3 `If-None-Match: *`).
    Create,
    /// Write only if the key exists with this etag (S3 `If-Match`).
    Update(String),
}

impl PutMode {
    /// The request kind a put in this mode is counted as.
    pub fn kind(&self) -> RequestKind {
        match self {
            PutMode::Overwrite => RequestKind::Put,
            PutMode::Create => RequestKind::PutCreate,
            PutMode::Update(_) => RequestKind::PutUpdate,
        }
    }
}

/// Result of a put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// Written; the new etag.
    Written(String),
    /// A create found the key, or an update found another etag or no key.
    Conflict,
}

impl PutOutcome {
    /// The new etag, if written.
    pub fn etag(&self) -> Option<String> {
        match self {
            PutOutcome::Written(e) => Some(e.clone()),
            PutOutcome::Conflict => None,
        }
    }
}

/// Kinds of request, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Read an object.
    Get,
    /// Unconditional write.
    Put,
    /// Create-only write.
    PutCreate,
    /// Compare-and-swap write.
    PutUpdate,
    /// One page of a listing.
    List,
    /// Delete an object.
    Delete,
}

/// Keys in one page of an S3 listing (ListObjectsV2's maximum).
pub(crate) const LIST_PAGE: usize = 1000;

/// Request counters of one store, by kind.
#[derive(Debug, Default)]
pub struct RequestCounter {
    counts: [AtomicU64; 6],
}

impl RequestCounter {
    /// Count one request of `kind`.
    pub(crate) fn add(&self, kind: RequestKind) {
        self.counts[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Count the pages S3 would return for a listing of `keys` objects
    /// (ListObjectsV2 returns at most [`LIST_PAGE`] keys a page), so stores
    /// that list in one call report what the same listing costs on S3.
    pub(crate) fn add_listing(&self, keys: usize) {
        let pages = keys.div_ceil(LIST_PAGE).max(1) as u64;
        self.counts[RequestKind::List as usize].fetch_add(pages, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> RequestCounts {
        let c = |k: RequestKind| self.counts[k as usize].load(Ordering::Relaxed);
        RequestCounts {
            get: c(RequestKind::Get),
            put: c(RequestKind::Put),
            put_create: c(RequestKind::PutCreate),
            put_update: c(RequestKind::PutUpdate),
            list: c(RequestKind::List),
            delete: c(RequestKind::Delete),
        }
    }
}

/// Request counts by kind.
#[derive(
    Debug, Clone, Copy, Default, Hash, PartialEq, Eq, serde::Serialize, serde::Deserialize,
)]
pub struct RequestCounts {
    /// Object reads.
    pub get: u64,
    /// Unconditional writes and server-side copies (S3 bills a COPY as a
    /// PUT).
    pub put: u64,
    /// Create-only writes.
    pub put_create: u64,
    /// Compare-and-swap writes.
    pub put_update: u64,
    /// Listing pages.
    pub list: u64,
    /// Deletes.
    pub delete: u64,
}

impl RequestCounts {
    /// No request at all.
    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.get + self.writes() + self.list + self.delete
    }

    /// All writes of any mode.
    pub fn writes(&self) -> u64 {
        self.put + self.put_create + self.put_update
    }

    /// Requests made since `earlier`.
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        RequestCounts {
            get: self.get - earlier.get,
            put: self.put - earlier.put,
            put_create: self.put_create - earlier.put_create,
            put_update: self.put_update - earlier.put_update,
            list: self.list - earlier.list,
            delete: self.delete - earlier.delete,
        }
    }

    /// Sum of two counts.
    pub fn plus(&self, other: &RequestCounts) -> RequestCounts {
        RequestCounts {
            get: self.get + other.get,
            put: self.put + other.put,
            put_create: self.put_create + other.put_create,
            put_update: self.put_update + other.put_update,
            list: self.list + other.list,
            delete: self.delete + other.delete,
        }
    }
}

impl fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (get {}, put {}, create {}, cas {}, list {}, delete {})",
            self.total(),
            self.get,
            self.put,
            self.put_create,
            self.put_update,
            self.list,
            self.delete
        )
    }
}

/// How DataFusion reaches the objects of a store, for scans.
#[derive(Debug, Clone)]
pub struct ScanAccess {
    /// URL the object store is registered under in a DataFusion session.
    pub url: ObjectStoreUrl,
    /// The object store.
    pub store: Arc<dyn object_store::ObjectStore>,
    /// Path of the store's root inside `store`, prepended to every key.
    pub root: String,
}

impl ScanAccess {
    /// The same access, its requests counted into `counter`.
    pub(crate) fn counted(self, counter: Arc<RequestCounter>) -> ScanAccess {
        ScanAccess {
            store: Arc::new(counting::CountedObjects::new(self.store, counter)),
            ..self
        }
    }

    /// The object-store path of `key`, taken as written: keys with spaces or
    /// non-ASCII characters name the same object as in the store
    /// (`Path::from` would percent-encode them into another key).
    pub fn path(&self, key: &str) -> object_store::path::Path {
        let full = if self.root.is_empty() {
            key.to_string()
        } else {
            format!("{}/{}", self.root, key)
        };
        object_store::path::Path::parse(&full)
            .unwrap_or_else(|_| object_store::path::Path::from(full))
    }
}

/// The seam every storage backend implements. Keys are relative to the
/// store's root, `/`-separated, never starting with `/`.
#[async_trait::async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// Read a whole object; `None` if the key does not exist.
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError>;

    /// Write a whole object atomically, honouring `mode`.
    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<PutOutcome, StoreError>;

    /// List every object whose key starts with `prefix` and sorts after
    /// `start_after`, in ascending key order (all pages).
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, StoreError>;

    /// Delete an object; deleting a missing key succeeds.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;

    /// Delete an object only while its etag is `etag` (S3 `If-Match`):
    /// `Ok(false)` when it changed or is gone. What a run that may have
    /// lost its lease deletes, it deletes this way.
    async fn delete_if(&self, key: &str, etag: &str) -> Result<bool, StoreError>;

    /// Copy object `from` to `to` inside the store, overwriting `to`
    /// atomically (readers see the old object or the whole new one); on S3
    /// a server-side CopyObject, billed and counted as a PUT. `Ok(false)`
    /// when `from` does not exist.
    async fn copy(&self, from: &str, to: &str) -> Result<bool, StoreError>;

    /// The size (and, where the store gives one, etag and time) of the
    /// object at `key`, without its bytes (`None`: not there). S3 bills a
    /// HEAD as a GET: a twelfth of a LIST.
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError>;

    /// Remove the temporary files that writes killed mid-way left under
    /// `prefix` (a local folder's hidden `.NAME.PID-NAMESPACE.N.tmp` files
    /// of processes of this boot and pid namespace no longer running). Stores whose writes leave nothing
    /// behind have nothing to do. Returns how many were removed.
    async fn sweep_temp(&self, _prefix: &str) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// Files under the root that listings skip with a warning: local file
    /// names that are not UTF-8 (they cannot be keys), and links that lead
    /// nowhere or in a loop; shown lossily relative to the root, for
    /// `sluice show`. Stores whose names are keys have none.
    async fn unnamed(&self) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }

    /// Requests made so far, by kind.
    fn counts(&self) -> RequestCounts;

    /// Where this store's root is, for messages (`/data/in`, `s3://b/p`).
    fn describe(&self) -> String;

    /// How DataFusion scans this store's objects.
    fn scan_access(&self) -> Result<ScanAccess, StoreError>;
}

/// Where a store lives: a local folder or an S3 bucket and prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A folder on the local file system (absolute).
    Local(PathBuf),
    /// An S3 bucket and a key prefix (no leading or trailing `/`).
    S3 {
        /// Bucket name.
        bucket: String,
        /// Key prefix, possibly empty.
        prefix: String,
    },
    /// A Kafka topic (`kafka://host:port,host:port/topic`): a source only,
    /// read through `discovery`'s record log, not a store.
    Kafka {
        /// Bootstrap brokers, `host:port`.
        brokers: Vec<String>,
        /// The topic.
        topic: String,
    },
    /// A Kinesis data stream (`kinesis://name` or `kinesis://arn:...`): a
    /// source only, read through `discovery::kinesis`; region, credentials
    /// and endpoint come from the AWS SDK's standard settings.
    Kinesis {
        /// The stream's name or ARN.
        stream: String,
    },
}

impl Location {
    /// Parse `s3://bucket/prefix/` or a path; a relative path resolves
    /// against `base`.
    pub fn parse(uri: &str, base: &std::path::Path) -> Result<Location, String> {
        if let Some(rest) = uri.strip_prefix("kafka://") {
            return kafka_location(uri, rest);
        }
        if let Some(rest) = uri.strip_prefix("kinesis://") {
            return kinesis_location(uri, rest);
        }
        if let Some(rest) = uri.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(format!(
                    "\"{uri}\" names no bucket; write s3://bucket/prefix/"
                ));
            }
            let prefix = prefix.trim_matches('/').to_string();
            if prefix.split('/').any(|p| p == ".." || p == ".") {
                return Err(format!("\"{uri}\" has a . or .. segment"));
            }
            return Ok(Location::S3 {
                bucket: bucket.to_string(),
                prefix,
            });
        }
        if let Some((scheme, _)) = uri.split_once("://") {
            let hint = if scheme == "file" {
                "write a plain path"
            } else {
                "use a local path, s3://, kafka:// or kinesis://"
            };
            return Err(format!(
                "\"{uri}\": scheme {scheme}:// is not supported; {hint}"
            ));
        }
        let path = std::path::Path::new(uri);
        let path = if path.is_absolute() {
            path.to_path_buf()
        } else {
            base.join(path)
        };
        Ok(Location::Local(normalize(&path)))
    }

    /// Whether it is a record stream (a Kafka topic or a Kinesis stream):
    /// a source only, read through `discovery`, not a store.
    pub fn is_stream(&self) -> bool {
        matches!(self, Location::Kafka { .. } | Location::Kinesis { .. })
    }

    /// A readable form, for messages and `sluice show`.
    pub fn display(&self) -> String {
        match self {
            Location::Local(p) => p.display().to_string(),
            Location::S3 { bucket, prefix } if prefix.is_empty() => format!("s3://{bucket}/"),
            Location::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}/"),
            Location::Kafka { brokers, topic } => format!("kafka://{}/{topic}", brokers.join(",")),
            Location::Kinesis { stream } => format!("kinesis://{stream}"),
        }
    }

    /// The location `child` below this one.
    pub fn join(&self, child: &str) -> Location {
        match self {
            Location::Local(p) => Location::Local(p.join(child)),
            Location::S3 { bucket, prefix } => Location::S3 {
                bucket: bucket.clone(),
                prefix: if prefix.is_empty() {
                    child.to_string()
                } else {
                    format!("{prefix}/{child}")
                },
            },
            Location::Kafka { .. } | Location::Kinesis { .. } => self.clone(),
        }
    }

    /// The location one level up (the checkpoint root above a pipeline's
    /// folder). The root of a file system or bucket is its own parent.
    pub fn parent(&self) -> Location {
        match self {
            Location::Local(p) => Location::Local(p.parent().unwrap_or(p).to_path_buf()),
            Location::S3 { bucket, prefix } => Location::S3 {
                bucket: bucket.clone(),
                prefix: prefix
                    .rsplit_once('/')
                    .map_or(String::new(), |(up, _)| up.to_string()),
            },
            Location::Kafka { .. } | Location::Kinesis { .. } => self.clone(),
        }
    }

    /// Open a store rooted here. S3 locations use `s3`, which must be given.
    pub fn open(&self, s3: Option<&S3Config>) -> Result<Arc<dyn Store>, String> {
        match self {
            Location::Local(p) => Ok(Arc::new(LocalStore::new(p.clone()))),
            Location::S3 { bucket, prefix } => {
                let cfg = s3
                    .ok_or_else(|| format!("{}: no S3 configuration was loaded", self.display()))?;
                Ok(Arc::new(S3Store::new(cfg, bucket, prefix)))
            }
            // What a task reads from a topic is put here, as files, by the
            // source (`discovery`): the store starts empty.
            Location::Kafka { .. } | Location::Kinesis { .. } => Ok(Arc::new(MemoryStore::new())),
        }
    }
}

/// The stream name of a Kinesis stream's ARN
/// (`arn:aws:kinesis:REGION:ACCOUNT:stream/NAME`), or of a name: a
/// pipeline may name its stream either way.
pub(crate) fn kinesis_stream_name(stream: &str) -> &str {
    match stream.strip_prefix("arn:") {
        Some(arn) => arn
            .split_once(":stream/")
            .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
            .unwrap_or(stream),
        None => stream,
    }
}

/// `kinesis://stream-name` or `kinesis://arn:aws:kinesis:region:account:stream/name`.
fn kinesis_location(uri: &str, rest: &str) -> Result<Location, String> {
    let usage =
        "write kinesis://stream-name (or kinesis://arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)";
    let stream = rest.trim_end_matches('/');
    let name = match stream.strip_prefix("arn:") {
        Some(arn) => {
            let parts: Vec<&str> = arn.splitn(5, ':').collect();
            match parts.as_slice() {
                [_, "kinesis", _, _, res] => res.strip_prefix("stream/").unwrap_or(""),
                _ => "",
            }
        }
        None => stream,
    };
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > 128 || !name.chars().all(legal) {
        return Err(format!(
            "\"{uri}\": \"{name}\" is not a Kinesis stream name (letters, digits, . _ -; 1 to \
             128); {usage}"
        ));
    }
    Ok(Location::Kinesis {
        stream: stream.to_string(),
    })
}

/// `kafka://host:port[,host:port...]/topic`.
fn kafka_location(uri: &str, rest: &str) -> Result<Location, String> {
    let usage = "write kafka://host:port,host:port/topic";
    let Some((brokers, topic)) = rest.split_once('/') else {
        return Err(format!("\"{uri}\" names no topic; {usage}"));
    };
    // Never echo what looks like credentials back.
    if brokers.contains('@') {
        return Err(format!(
            "source.uri holds credentials (user@ or user:password@ before the brokers); \
             credentials never go in the pipeline file: set source.security_protocol and \
             sasl_mechanism, and the credentials in the environment or a secret (docs/kafka.md); \
             {usage}"
        ));
    }
    let topic = topic.trim_end_matches('/');
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if topic.is_empty() || topic.len() > 249 || !topic.chars().all(legal) {
        return Err(format!(
            "\"{uri}\": \"{topic}\" is not a Kafka topic name (letters, digits, . _ -; at \
             most 249); {usage}"
        ));
    }
    let brokers: Vec<String> = brokers.split(',').map(|b| b.trim().to_string()).collect();
    for b in &brokers {
        let port_ok = b
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if !port_ok {
            return Err(format!(
                "\"{uri}\": broker \"{b}\" is not host:port; {usage}"
            ));
        }
    }
    Ok(Location::Kafka {
        brokers,
        topic: topic.to_string(),
    })
}

/// Remove `.` and `..` segments without touching the file system (the folder
/// may not exist yet).
fn normalize(path: &std::path::Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The storage error for a failed `object_store` request (the scans' HEADs
/// and reads): 403 / 401, a bad path or an unsupported call will fail again
/// and are permanent; the rest (throttling, 5xx, timeouts, connection
/// errors, which `object_store` has already retried with backoff) may pass
/// and are transient. A missing object is the caller's to handle.
pub(crate) fn object_store_error(
    op: &'static str,
    location: &str,
    e: &object_store::Error,
) -> StoreError {
    use object_store::Error as E;
    let location = location.to_string();
    let message = e.to_string();
    match e {
        E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::InvalidPath { .. }
        | E::NotSupported { .. }
        | E::NotImplemented { .. }
        | E::UnknownConfigurationKey { .. } => StoreError::Permanent {
            op,
            location,
            message: format!("{message}; check the function's permissions and the location"),
        },
        _ => StoreError::Transient {
            op,
            location,
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_locations() {
        let base = std::path::Path::new("/p/q");
        assert_eq!(
            Location::parse("s3://b/x/y/", base).unwrap(),
            Location::S3 {
                bucket: "b".into(),
                prefix: "x/y".into()
            }
        );
        assert_eq!(
            Location::parse("s3://b", base).unwrap(),
            Location::S3 {
                bucket: "b".into(),
                prefix: "".into()
            }
        );
        assert_eq!(
            Location::parse("../data", base).unwrap(),
            Location::Local("/p/data".into())
        );
        assert!(Location::parse("s3:///x", base).is_err());
        assert!(Location::parse("gs://b/x", base).is_err());
        assert!(Location::parse("s3://b/../x", base).is_err());
    }

    #[test]
    fn kinesis_locations_name_a_stream_or_its_arn() {
        let base = std::path::Path::new("/p");
        assert_eq!(
            Location::parse("kinesis://rides", base).unwrap(),
            Location::Kinesis {
                stream: "rides".into()
            }
        );
        let arn = "arn:aws:kinesis:us-east-1:123456789012:stream/rides";
        assert_eq!(
            Location::parse(&format!("kinesis://{arn}"), base).unwrap(),
            Location::Kinesis { stream: arn.into() }
        );
        for bad in ["kinesis://", "kinesis://ri des", "kinesis://arn:aws:s3:::b"] {
            let e = Location::parse(bad, base).unwrap_err();
            assert!(e.contains("not a Kinesis stream name"), "{bad}: {e}");
        }
    }

    #[test]
    fn kafka_locations_name_brokers_and_a_topic_and_no_credentials() {
        let base = std::path::Path::new("/p");
        assert_eq!(
            Location::parse("kafka://a:9092,b:9093/rides", base).unwrap(),
            Location::Kafka {
                brokers: vec!["a:9092".into(), "b:9093".into()],
                topic: "rides".into()
            }
        );
        for (uri, says) in [
            ("kafka://a:9092", "names no topic"),
            ("kafka://a/rides", "is not host:port"),
            ("kafka://a:9092/ri des", "not a Kafka topic name"),
        ] {
            let e = Location::parse(uri, base).unwrap_err();
            assert!(e.contains(says), "{uri}: {e}");
        }
        let e = Location::parse("kafka://alice:s3cret@a:9092/rides", base).unwrap_err();
        assert!(e.contains("credentials") && !e.contains("s3cret"), "{e}");
    }

    #[test]
    fn object_store_errors_are_classed() {
        use crate::error::ErrorClass;
        let boxed = || -> Box<dyn std::error::Error + Send + Sync> { "x".into() };
        let denied = object_store::Error::PermissionDenied {
            path: "k".into(),
            source: boxed(),
        };
        assert_eq!(
            object_store_error("head", "k", &denied).class(),
            ErrorClass::Fatal
        );
        let unauth = object_store::Error::Unauthenticated {
            path: "k".into(),
            source: boxed(),
        };
        assert_eq!(
            object_store_error("head", "k", &unauth).class(),
            ErrorClass::Fatal
        );
        let throttled = object_store::Error::Generic {
            store: "S3",
            source: boxed(),
        };
        assert_eq!(
            object_store_error("head", "k", &throttled).class(),
            ErrorClass::Retryable
        );
    }
}
