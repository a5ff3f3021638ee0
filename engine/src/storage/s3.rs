//! S3 as a [`Store`], through `aws-sdk-s3` for the control plane (conditional
//! writes, listings) and `object_store`'s AmazonS3 for DataFusion scans; both
//! built from one configuration (region, endpoint, credentials).

use std::sync::Arc;

use aws_sdk_s3::config::ProvideCredentials;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use datafusion::execution::object_store::ObjectStoreUrl;
use object_store::aws::{AmazonS3Builder, AwsCredential};

use super::{
    Object, ObjectMeta, PutMode, PutOutcome, RequestCounter, RequestCounts, RequestKind,
    ScanAccess, Store,
};
use crate::error::StoreError;

/// Characters percent-encoded in a CopySource: all but unreserved ones and
/// the `/` separating key segments.
const COPY_SOURCE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'/')
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// One S3 configuration shared by every S3 store of a process.
#[derive(Debug, Clone)]
pub struct S3Config {
    client: aws_sdk_s3::Client,
    region: String,
    endpoint: Option<String>,
    credentials: Option<aws_sdk_s3::config::SharedCredentialsProvider>,
}

impl S3Config {
    /// Load region, endpoint (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_S3`) and
    /// credentials from the standard AWS chain. A custom endpoint switches to
    /// path-style addressing, as emulators and most S3-compatible servers need.
    pub async fn from_env() -> S3Config {
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .load()
            .await;
        S3Config::from_sdk(sdk)
    }

    /// As [`S3Config::from_env`], with `endpoint` in place of the
    /// environment's (tests that start their own S3 server).
    pub async fn for_endpoint(endpoint: &str) -> S3Config {
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(endpoint)
            .load()
            .await;
        S3Config::from_sdk(sdk)
    }

    fn from_sdk(sdk: aws_config::SdkConfig) -> S3Config {
        let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
            .ok()
            .or_else(|| sdk.endpoint_url().map(str::to_string));
        let mut builder = aws_sdk_s3::config::Builder::from(&sdk);
        if let Some(ep) = &endpoint {
            builder = builder.endpoint_url(ep).force_path_style(true);
        }
        S3Config {
            client: aws_sdk_s3::Client::from_conf(builder.build()),
            region: sdk
                .region()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "us-east-1".to_string()),
            endpoint,
            credentials: sdk.credentials_provider(),
        }
    }

    /// The S3 client, for callers that create buckets in tests.
    pub fn client(&self) -> &aws_sdk_s3::Client {
        &self.client
    }
}

/// Lets object_store sign with the AWS SDK's credential chain.
#[derive(Debug)]
struct SdkCredentials(aws_sdk_s3::config::SharedCredentialsProvider);

#[async_trait::async_trait]
impl object_store::CredentialProvider for SdkCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let c = self
            .0
            .provide_credentials()
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "S3",
                source: Box::new(e),
            })?;
        Ok(Arc::new(AwsCredential {
            key_id: c.access_key_id().to_string(),
            secret_key: c.secret_access_key().to_string(),
            token: c.session_token().map(str::to_string),
        }))
    }
}

/// A [`Store`] over one bucket and prefix.
#[derive(Debug)]
pub struct S3Store {
    config: S3Config,
    bucket: String,
    prefix: String,
    counter: Arc<RequestCounter>,
}

impl S3Store {
    /// A store rooted at `s3://bucket/prefix/`.
    pub fn new(config: &S3Config, bucket: &str, prefix: &str) -> S3Store {
        S3Store {
            config: config.clone(),
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            counter: Arc::default(),
        }
    }

    fn full_key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    fn location(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.full_key(key))
    }

    fn classify<E: ProvideErrorMetadata + std::error::Error + 'static>(
        &self,
        op: &'static str,
        key: &str,
        e: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
    ) -> StoreError {
        let status = e.raw_response().map(|r| r.status().as_u16());
        let message = match e {
            SdkError::ServiceError(s) => format!(
                "{} ({})",
                s.err().message().unwrap_or("service error"),
                s.err().code().unwrap_or("no code")
            ),
            other => root_cause(other),
        };
        let location = self.location(key);
        // No region or no credentials: a setting to fix, not a passing
        // failure.
        let setting = {
            let m = message.to_ascii_lowercase();
            m.contains("region must be set") || m.contains("no credentials")
        };
        let transient = match e {
            _ if setting => false,
            SdkError::TimeoutError(_)
            | SdkError::DispatchFailure(_)
            | SdkError::ResponseError(_) => true,
            // 409: a conditional write on the same key is in flight; 429/5xx:
            // throttling or a server fault.
            _ => matches!(status, Some(409 | 429 | 500..=599)),
        };
        if transient {
            StoreError::Transient {
                op,
                location,
                message,
            }
        } else {
            StoreError::Permanent {
                op,
                location,
                message,
            }
        }
    }
}

fn to_chrono(t: &aws_sdk_s3::primitives::DateTime) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.secs(), t.subsec_nanos())
}

#[async_trait::async_trait]
impl Store for S3Store {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.counter.add(RequestKind::Get);
        let resp = self
            .config
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await;
        match resp {
            Ok(out) => {
                let etag = out.e_tag().unwrap_or_default().to_string();
                let bytes = out
                    .body
                    .collect()
                    .await
                    .map_err(|e| StoreError::Transient {
                        op: "get",
                        location: self.location(key),
                        message: e.to_string(),
                    })?;
                Ok(Some(Object {
                    bytes: bytes.into_bytes(),
                    etag,
                }))
            }
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => Ok(None),
            Err(e) => Err(self.classify("get", key, &e)),
        }
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        self.counter.add(RequestKind::Get);
        let resp = self
            .config
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await;
        match resp {
            Ok(out) => Ok(Some(ObjectMeta {
                key: key.to_string(),
                size: out.content_length().unwrap_or_default().max(0) as u64,
                etag: out.e_tag().map(str::to_string),
                last_modified: out
                    .last_modified()
                    .and_then(|t| chrono::DateTime::from_timestamp(t.secs(), t.subsec_nanos())),
            })),
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => Ok(None),
            Err(e) => Err(self.classify("head", key, &e)),
        }
    }

    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<PutOutcome, StoreError> {
        let mut req = self
            .config
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .body(ByteStream::from(bytes));
        match &mode {
            PutMode::Overwrite => {}
            PutMode::Create => req = req.if_none_match("*"),
            PutMode::Update(etag) => req = req.if_match(etag),
        }
        self.counter.add(mode.kind());
        match req.send().await {
            Ok(out) => Ok(PutOutcome::Written(
                out.e_tag().unwrap_or_default().to_string(),
            )),
            Err(e) => {
                let status = e.raw_response().map(|r| r.status().as_u16());
                match (status, &mode) {
                    (Some(412), PutMode::Create | PutMode::Update(_)) => Ok(PutOutcome::Conflict),
                    (Some(404), PutMode::Update(_)) => Ok(PutOutcome::Conflict),
                    _ => Err(self.classify("put", key, &e)),
                }
            }
        }
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, StoreError> {
        let root = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            self.counter.add(RequestKind::List);
            let mut req = self
                .config
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(format!("{root}{prefix}"));
            if let Some(t) = &token {
                req = req.continuation_token(t);
            } else if let Some(s) = start_after {
                req = req.start_after(format!("{root}{s}"));
            }
            let page = req
                .send()
                .await
                .map_err(|e| self.classify("list", prefix, &e))?;
            for o in page.contents() {
                let Some(full) = o.key() else { continue };
                let Some(key) = full.strip_prefix(&root) else {
                    continue;
                };
                out.push(ObjectMeta {
                    key: key.to_string(),
                    size: o.size().unwrap_or(0).max(0) as u64,
                    etag: o.e_tag().map(str::to_string),
                    last_modified: o.last_modified().and_then(to_chrono),
                });
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) => token = Some(t.to_string()),
                _ => break,
            }
        }
        Ok(out)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.counter.add(RequestKind::Delete);
        self.config
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await
            .map_err(|e| self.classify("delete", key, &e))?;
        Ok(())
    }

    async fn delete_if(&self, key: &str, etag: &str) -> Result<bool, StoreError> {
        self.counter.add(RequestKind::Delete);
        let resp = self
            .config
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .if_match(etag)
            .send()
            .await;
        match resp {
            Ok(_) => Ok(true),
            Err(e)
                if e.raw_response()
                    .is_some_and(|r| matches!(r.status().as_u16(), 404 | 412)) =>
            {
                Ok(false)
            }
            Err(e) => Err(self.classify("delete", key, &e)),
        }
    }

    async fn copy(&self, from: &str, to: &str) -> Result<bool, StoreError> {
        self.counter.add(RequestKind::Put);
        // CopySource is "bucket/key", URL-encoded.
        let source = format!(
            "{}/{}",
            self.bucket,
            percent_encoding::utf8_percent_encode(&self.full_key(from), COPY_SOURCE)
        );
        let resp = self
            .config
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(self.full_key(to))
            .copy_source(source)
            .send()
            .await;
        match resp {
            Ok(_) => Ok(true),
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => Ok(false),
            Err(e) => Err(self.classify("copy", to, &e)),
        }
    }

    fn counts(&self) -> RequestCounts {
        self.counter.snapshot()
    }

    fn describe(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    fn scan_access(&self) -> Result<ScanAccess, StoreError> {
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(&self.config.region);
        if let Some(ep) = &self.config.endpoint {
            b = b
                .with_endpoint(ep)
                .with_allow_http(ep.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        if let Some(c) = &self.config.credentials {
            b = b.with_credentials(Arc::new(SdkCredentials(c.clone())));
        }
        let store = b.build().map_err(|e| StoreError::Permanent {
            op: "configure",
            location: self.describe(),
            message: e.to_string(),
        })?;
        let url = ObjectStoreUrl::parse(format!("s3://{}", self.bucket)).map_err(|e| {
            StoreError::Permanent {
                op: "configure",
                location: self.describe(),
                message: e.to_string(),
            }
        })?;
        Ok(ScanAccess {
            url,
            store: Arc::new(store),
            root: self.prefix.clone(),
        }
        .counted(self.counter.clone()))
    }
}

/// What a person needs from an SDK error that is not the service's answer
/// (no region, no credentials, the endpoint unreachable): the chain of
/// causes, each said once, and what to do where that is known, never the
/// SDK's debug dump.
pub(crate) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut said: Vec<String> = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if !text.is_empty() && !said.iter().any(|s| s.contains(&text)) {
            said.push(text);
        }
        next = err.source();
    }
    let all = said.join(": ");
    let lower = all.to_ascii_lowercase();
    let hint = if lower.contains("region") {
        "; set AWS_REGION (or a region in your AWS profile)"
    } else if lower.contains("credential") {
        "; set AWS credentials (AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
    } else if lower.contains("connection refused")
        || lower.contains("dns error")
        || lower.contains("timed out")
    {
        "; is the endpoint reachable (AWS_ENDPOINT_URL, network)?"
    } else {
        ""
    };
    format!("{all}{hint}")
}
