//! A Kafka topic as a source: the record log seam ([`RecordLog`], with an
//! rskafka implementation and an in-memory one for unit tests), where a
//! run starts and stops in each partition, and a task's planned ranges
//! read as JSON Lines files the file path then scans.
//!
//! Offsets are Sluice's own: no consumer group, nothing committed to the
//! brokers. rskafka reads with `read_committed` isolation and skips
//! transaction markers, but it does not drop the records of aborted
//! transactions (it does not expose the fetch's aborted list): a topic
//! written by transactional producers that abort is read with the aborted
//! records. The README says so.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::checkpoint::{InputFile, RecordRange};
use crate::error::{Error, ErrorClass, Result};
use crate::pipeline::{SaslMechanism, SecurityProtocol};
use crate::storage::{MemoryStore, PutMode, Store};

/// One record as the log gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogRecord {
    /// Its offset.
    pub offset: i64,
    /// Its timestamp, ms since the Unix epoch.
    pub timestamp_ms: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// A Kinesis record's sequence number (its `offset` is then unused).
    pub seq: Option<String>,
}

/// Which offset of each partition to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    /// The earliest record still kept.
    Earliest,
    /// One past the last record readable (committed).
    Latest,
}

/// A topic's partitioned log, as the source reads it.
#[async_trait]
pub(crate) trait RecordLog: Send + Sync {
    /// The topic's partitions, in order; an error names a topic that does
    /// not exist.
    async fn partitions(&self) -> Result<Vec<i32>>;
    /// The offset `at` of each of `partitions`.
    async fn offsets(&self, partitions: &[i32], at: At) -> Result<BTreeMap<i32, i64>>;
    /// The records of `range` (fewer when offsets hold transaction markers
    /// or were compacted away), in offset order.
    async fn fetch(&self, range: RecordRange) -> Result<Vec<LogRecord>>;
}

/// How long one call to the brokers may take, retries included, before
/// the step fails (retryable: the state machine retries it): 30 seconds,
/// or `SLUICE_KAFKA_TIMEOUT_S`.
fn call_timeout() -> Duration {
    let secs = std::env::var("SLUICE_KAFKA_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    Duration::from_secs(secs)
}

/// Bytes one fetch asks for.
const FETCH_BYTES: i32 = 8 << 20;

/// A topic on Kafka brokers, through rskafka.
pub(crate) struct KafkaLog {
    client: rskafka::client::Client,
    brokers: String,
    topic: String,
    clients: tokio::sync::Mutex<BTreeMap<i32, Arc<rskafka::client::partition::PartitionClient>>>,
}

impl KafkaLog {
    /// Connect to `brokers` for `topic` (one metadata request).
    pub(crate) async fn connect(
        brokers: &[String],
        topic: &str,
        security: SecurityProtocol,
        mechanism: Option<SaslMechanism>,
    ) -> Result<KafkaLog> {
        let shown = brokers.join(",");
        let backoff = rskafka::BackoffConfig {
            deadline: Some(call_timeout()),
            ..Default::default()
        };
        let mut builder = rskafka::client::ClientBuilder::new(brokers.to_vec())
            .client_id("sluice")
            .backoff_config(backoff);
        if security.tls() {
            builder = builder.tls_config(Arc::new(tls_config()?));
        }
        if let Some(m) = mechanism {
            builder = builder.sasl_config(sasl_config(m).await?);
        }
        let build = builder.build();
        let client = within(&shown, "connect", build).await?;
        Ok(KafkaLog {
            client,
            brokers: shown,
            topic: topic.to_string(),
            clients: Default::default(),
        })
    }

    async fn partition(
        &self,
        partition: i32,
    ) -> Result<Arc<rskafka::client::partition::PartitionClient>> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(&partition) {
            return Ok(c.clone());
        }
        let made = self.client.partition_client(
            self.topic.clone(),
            partition,
            rskafka::client::partition::UnknownTopicHandling::Error,
        );
        let c = Arc::new(within(&self.brokers, "connect to the partition leader", made).await?);
        clients.insert(partition, c.clone());
        Ok(c)
    }
}

/// The environment variable naming a PEM file of certificates to trust for
/// a Kafka source's TLS, besides the platform's.
pub const CA_FILE_VAR: &str = "SLUICE_KAFKA_CA_FILE";
/// The environment variables of a Kafka source's SASL credentials.
pub const SASL_USERNAME_VAR: &str = "SLUICE_KAFKA_SASL_USERNAME";
pub const SASL_PASSWORD_VAR: &str = "SLUICE_KAFKA_SASL_PASSWORD";
/// The environment variable naming a Secrets Manager secret that holds a
/// Kafka source's SASL credentials (wins over the two above).
pub const SASL_SECRET_VAR: &str = "SLUICE_KAFKA_SASL_SECRET_ARN";

/// The settings of the source's TLS: the platform's root certificates and
/// those of [`CA_FILE_VAR`]'s file.
fn tls_config() -> Result<rustls::ClientConfig> {
    let config_error = |message: String| Error::Service {
        service: "kafka",
        message,
        class: ErrorClass::InvalidInput,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Ok(path) = std::env::var(CA_FILE_VAR) {
        use rustls_pki_types::pem::PemObject;
        let read = rustls_pki_types::CertificateDer::pem_file_iter(&path)
            .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
            .map_err(|e| {
                config_error(format!(
                    "{CA_FILE_VAR}={path}: {e}; name a PEM file of the certificates that \
                     signed the brokers'"
                ))
            })?;
        if read.is_empty() {
            return Err(config_error(format!(
                "{CA_FILE_VAR}={path} holds no certificate; name a PEM file of the \
                 certificates that signed the brokers'"
            )));
        }
        for cert in read {
            roots.add(cert).map_err(|e| {
                config_error(format!(
                    "{CA_FILE_VAR}={path}: a certificate is not usable: {e}"
                ))
            })?;
        }
    }
    if roots.is_empty() {
        return Err(config_error(format!(
            "security_protocol uses TLS, but this machine has no trusted root certificates; \
             set {CA_FILE_VAR} to a PEM file of the certificates that signed the brokers'"
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The source's SASL settings: `mechanism` with the credentials of the
/// secret [`SASL_SECRET_VAR`] names, or else of [`SASL_USERNAME_VAR`] and
/// [`SASL_PASSWORD_VAR`].
async fn sasl_config(mechanism: SaslMechanism) -> Result<rskafka::client::SaslConfig> {
    let credentials = match std::env::var(SASL_SECRET_VAR)
        .ok()
        .filter(|v| !v.is_empty())
    {
        Some(arn) => secret_credentials(&arn).await?,
        None => {
            let var = |name: &str| {
                std::env::var(name)
                    .ok()
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| Error::Service {
                        service: "kafka",
                        message: format!(
                            "source.sasl_mechanism is set but {name} is not: set \
                             {SASL_SECRET_VAR} to the ARN of a secret holding \
                             {{\"username\": ..., \"password\": ...}}, or set \
                             {SASL_USERNAME_VAR} and {SASL_PASSWORD_VAR}"
                        ),
                        class: ErrorClass::InvalidInput,
                    })
            };
            rskafka::client::Credentials::new(var(SASL_USERNAME_VAR)?, var(SASL_PASSWORD_VAR)?)
        }
    };
    Ok(match mechanism {
        SaslMechanism::Plain => rskafka::client::SaslConfig::Plain(credentials),
        SaslMechanism::ScramSha256 => rskafka::client::SaslConfig::ScramSha256(credentials),
        SaslMechanism::ScramSha512 => rskafka::client::SaslConfig::ScramSha512(credentials),
    })
}

/// How long credentials read from a secret are used before the secret is
/// read again (a rotated secret reaches a warm function within this).
const SECRET_TTL: Duration = Duration::from_secs(300);

/// Credentials read from secrets, by ARN, with when they were read: a warm
/// function reads its secret once per [`SECRET_TTL`], not once per
/// connection (each read is a billed Secrets Manager request).
#[allow(clippy::type_complexity)]
static SECRETS: std::sync::Mutex<BTreeMap<String, (std::time::Instant, String, String)>> =
    std::sync::Mutex::new(BTreeMap::new());

/// The username and password of the secret `arn` (Amazon MSK's shape for
/// SASL/SCRAM: a JSON object with "username" and "password"), from
/// Secrets Manager through the AWS SDK's standard settings.
async fn secret_credentials(arn: &str) -> Result<rskafka::client::Credentials> {
    if let Some((at, user, pass)) = SECRETS.lock().expect("secret cache").get(arn)
        && at.elapsed() < SECRET_TTL
    {
        return Ok(rskafka::client::Credentials::new(
            user.clone(),
            pass.clone(),
        ));
    }
    let refused = |what: String| Error::Service {
        service: "secretsmanager",
        message: format!("{SASL_SECRET_VAR}={arn}: {what}"),
        class: ErrorClass::InvalidInput,
    };
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let client = aws_sdk_secretsmanager::Client::new(&sdk);
    let got = client.get_secret_value().secret_id(arn).send().await;
    let value = match got {
        Ok(v) => v,
        Err(e) => {
            use aws_sdk_secretsmanager::error::ProvideErrorMetadata;
            let code = e.code().unwrap_or_default().to_string();
            let text = e.message().map(str::to_string).unwrap_or_else(|| {
                aws_sdk_secretsmanager::error::DisplayErrorContext(&e).to_string()
            });
            return Err(match code.as_str() {
                "ResourceNotFoundException"
                | "AccessDeniedException"
                | "DecryptionFailure"
                | "InvalidParameterException"
                | "InvalidRequestException"
                | "UnrecognizedClientException" => refused(format!(
                    "{code}: {text}; name a secret that exists and that the functions may read \
                     (secretsmanager:GetSecretValue, and kms:Decrypt on its key)"
                )),
                _ => Error::Service {
                    service: "secretsmanager",
                    message: format!(
                        "{SASL_SECRET_VAR}={arn}: reading the secret failed: {text} (the step \
                         is retried)"
                    ),
                    class: ErrorClass::Retryable,
                },
            });
        }
    };
    let Some(text) = value.secret_string() else {
        return Err(refused(
            "the secret holds binary data; store {\"username\": ..., \"password\": ...} as \
             its text"
                .to_string(),
        ));
    };
    let json: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        refused(format!(
            "the secret's text is not JSON ({e}); store {{\"username\": ..., \"password\": ...}}"
        ))
    })?;
    let field = |name: &str| {
        json.get(name)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                refused(format!(
                    "the secret has no \"{name}\" text; store {{\"username\": ..., \
                     \"password\": ...}} (Amazon MSK's SASL/SCRAM secret shape)"
                ))
            })
    };
    let (user, pass) = (field("username")?, field("password")?);
    SECRETS.lock().expect("secret cache").insert(
        arn.to_string(),
        (std::time::Instant::now(), user.clone(), pass.clone()),
    );
    Ok(rskafka::client::Credentials::new(user, pass))
}

/// `call` within [`CALL_TIMEOUT`], its errors as the source's.
async fn within<T>(
    brokers: &str,
    what: &str,
    call: impl std::future::Future<Output = rskafka::client::error::Result<T>>,
) -> Result<T> {
    let limit = call_timeout();
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(kafka_error(brokers, what, &e)),
        Err(_) => Err(Error::Service {
            service: "kafka",
            message: format!(
                "{what} at {brokers}: no answer within {}s; check that the brokers are \
                 reachable from here (the step is retried)",
                limit.as_secs()
            ),
            class: ErrorClass::Retryable,
        }),
    }
}

/// A client error: an unknown topic or partition, or a request the broker
/// refused, will fail again; connection trouble may pass.
fn kafka_error(brokers: &str, what: &str, e: &rskafka::client::error::Error) -> Error {
    use rskafka::client::error::Error as E;
    let text = e.to_string();
    let (class, hint) = if text.contains("invalid peer certificate") {
        // Retrying changes nothing: the settings must.
        (
            ErrorClass::InvalidInput,
            format!(
                "; the brokers' TLS certificate is not trusted here: set {CA_FILE_VAR} to a PEM \
                 file of the certificate authority that signed it"
            ),
        )
    } else if text.contains("SASL") || text.contains("Sasl") {
        (
            ErrorClass::InvalidInput,
            format!(
                "; check source.sasl_mechanism and the credentials (the secret \
                 {SASL_SECRET_VAR} names, or {SASL_USERNAME_VAR} and {SASL_PASSWORD_VAR})"
            ),
        )
    } else {
        match e {
            E::ServerError { .. } | E::InvalidResponse(_) => (ErrorClass::Fatal, String::new()),
            _ => (
                ErrorClass::Retryable,
                "; check that the brokers are reachable from here and source.uri names them, \
                 and that source.security_protocol is the listener's (a TLS listener closes a \
                 plaintext connection at once: \"early eof\") (the step is retried)"
                    .to_string(),
            ),
        }
    };
    Error::Service {
        service: "kafka",
        message: format!("{what} at {brokers}: {text}{hint}"),
        class,
    }
}

#[async_trait]
impl RecordLog for KafkaLog {
    async fn partitions(&self) -> Result<Vec<i32>> {
        let topics = within(&self.brokers, "list topics", self.client.list_topics()).await?;
        match topics.into_iter().find(|t| t.name == self.topic) {
            Some(t) => Ok(t.partitions.into_iter().collect()),
            None => Err(Error::Service {
                service: "kafka",
                message: format!(
                    "topic \"{}\" does not exist at {}: create it, or fix source.uri",
                    self.topic, self.brokers
                ),
                class: ErrorClass::InvalidInput,
            }),
        }
    }

    async fn offsets(&self, partitions: &[i32], at: At) -> Result<BTreeMap<i32, i64>> {
        let mut out = BTreeMap::new();
        for p in partitions {
            let c = self.partition(*p).await?;
            let which = match at {
                At::Earliest => rskafka::client::partition::OffsetAt::Earliest,
                At::Latest => rskafka::client::partition::OffsetAt::Latest,
            };
            let what = format!("list offsets of {}/{p}", self.topic);
            out.insert(*p, within(&self.brokers, &what, c.get_offset(which)).await?);
        }
        Ok(out)
    }

    async fn fetch(&self, range: RecordRange) -> Result<Vec<LogRecord>> {
        let c = self.partition(range.partition).await?;
        let what = format!("fetch {}/{}", self.topic, range.partition);
        let mut out = Vec::new();
        let mut at = range.start;
        let mut empty = 0;
        while at < range.end {
            // Read committed: records of aborted transactions and the
            // transactions' markers are left out (vendor/rskafka), and
            // `next` steps over the offsets they took.
            let (records, _high, next) = within(
                &self.brokers,
                &what,
                c.fetch_records_and_next(at, 1..FETCH_BYTES, 100),
            )
            .await?;
            for r in records {
                if r.offset < at || r.offset >= range.end {
                    continue;
                }
                out.push(LogRecord {
                    offset: r.offset,
                    timestamp_ms: r.record.timestamp.timestamp_millis(),
                    key: r.record.key,
                    value: r.record.value,
                    seq: None,
                });
            }
            match next {
                Some(next) if next > at => {
                    at = next;
                    empty = 0;
                }
                // Nothing at `at`, below the end the plan saw: the broker
                // has not caught up (a new leader); a few tries, then the
                // step fails and is retried, never passed over.
                _ if empty < 3 => {
                    empty += 1;
                    tokio::time::sleep(Duration::from_millis(200 * empty)).await;
                }
                _ => {
                    return Err(Error::Service {
                        service: "kafka",
                        message: format!(
                            "{what} at {}: the broker returns no records at offset {at}, below \
                             the end {} the plan saw; the step is retried",
                            self.brokers, range.end
                        ),
                        class: ErrorClass::Retryable,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// A log in memory, for unit tests of the source's logic.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct MemoryLog {
    /// Each partition's earliest offset and its records.
    pub partitions: std::sync::Mutex<BTreeMap<i32, (i64, Vec<LogRecord>)>>,
}

#[cfg(test)]
#[async_trait]
impl RecordLog for MemoryLog {
    async fn partitions(&self) -> Result<Vec<i32>> {
        Ok(self.partitions.lock().unwrap().keys().copied().collect())
    }

    async fn offsets(&self, partitions: &[i32], at: At) -> Result<BTreeMap<i32, i64>> {
        let all = self.partitions.lock().unwrap();
        Ok(partitions
            .iter()
            .map(|p| {
                let (first, records) = &all[p];
                let end = records.last().map_or(*first, |r| r.offset + 1).max(*first);
                (*p, if at == At::Earliest { *first } else { end })
            })
            .collect())
    }

    async fn fetch(&self, range: RecordRange) -> Result<Vec<LogRecord>> {
        let all = self.partitions.lock().unwrap();
        Ok(all[&range.partition]
            .1
            .iter()
            .filter(|r| r.offset >= range.start && r.offset < range.end)
            .cloned()
            .collect())
    }
}

/// Connect to the topic of a `kafka://` location.
pub(crate) async fn open(source: &crate::pipeline::Source) -> Result<Arc<dyn RecordLog>> {
    match &source.location {
        crate::storage::Location::Kafka { brokers, topic } => Ok(Arc::new(
            KafkaLog::connect(
                brokers,
                topic,
                source.security_protocol,
                source.sasl_mechanism,
            )
            .await?,
        )),
        other => Err(Error::Service {
            service: "kafka",
            message: format!("{} is not a kafka:// location", other.display()),
            class: ErrorClass::Fatal,
        }),
    }
}

/// One record as a line of JSON: its value's fields, then its metadata as
/// `_topic`, `_partition`, `_offset`, `_timestamp` (UTC, ms) and `_key`
/// (written last: a value's own field of one of these names is
/// overwritten, as readers take the last of duplicate keys). A value must
/// be exactly one JSON object in UTF-8; its line breaks (whitespace, in
/// valid JSON) become spaces, so numbers keep every digit. Any other value
/// becomes a line that never reads, holding the metadata and the value as
/// text, so the bad-row policy applies to it and names its offset.
pub(crate) fn json_line(topic: &str, partition: i32, r: &LogRecord) -> Vec<u8> {
    let mut line = Vec::new();
    let meta = Meta {
        topic: quoted(topic),
        partition,
        timestamp_unit: Some(TimeUnit::Microsecond),
        raw: false,
        shard: None,
    };
    write_json_line(&mut line, &meta, r);
    line
}

/// One record as the line its pipeline reads (`raw`: Spark's columns;
/// else [`json_line`]), if it holds fields to infer a schema from.
pub(crate) fn sample_line(
    topic: &str,
    partition: i32,
    raw: bool,
    r: &LogRecord,
) -> Option<Vec<u8>> {
    if !raw {
        let fields = r
            .value
            .as_deref()
            .and_then(one_object)
            .is_some_and(|b| !b.trim().is_empty());
        return fields.then(|| json_line(topic, partition, r));
    }
    let meta = Meta {
        topic: quoted(topic),
        partition,
        timestamp_unit: Some(TimeUnit::Microsecond),
        raw,
        shard: None,
    };
    let mut line = Vec::new();
    write_raw_line(&mut line, &meta, r);
    Some(line)
}

/// What every line of one partition's range shares.
pub(crate) struct Meta {
    /// The topic, quoted as a JSON string.
    topic: String,
    partition: i32,
    /// The unit of the `_timestamp` column the lines are read into (None:
    /// not a timestamp column): a timestamp whose year has more than four
    /// digits is written as a number in it, which the JSON reader takes as
    /// is (its text form reads only years 0000 to 9999).
    timestamp_unit: Option<TimeUnit>,
    /// Spark's Kafka columns ([`crate::pipeline::RAW_COLUMNS`]), the key
    /// and value as hex (the JSON reader's binary), not the value's fields.
    raw: bool,
    /// A Kinesis shard's records (its id quoted as a JSON string): their
    /// metadata is `_shard_id`, `_sequence_number`, `_arrival_timestamp`
    /// and `_partition_key` ([`crate::pipeline::KINESIS_RAW_COLUMNS`] raw).
    shard: Option<String>,
}

impl Meta {
    /// The lines of a Kinesis shard's records.
    pub(crate) fn shard(shard: &str, timestamp_unit: Option<TimeUnit>, raw: bool) -> Meta {
        Meta {
            topic: String::new(),
            partition: 0,
            timestamp_unit,
            raw,
            shard: Some(quoted(shard)),
        }
    }
}

use datafusion::arrow::datatypes::TimeUnit;

/// `s` as a JSON string.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialise")
}

/// [`json_line`] appended to `out` (no line break), the topic already
/// quoted: this runs once per record, so it builds no string of its own
/// for the metadata and copies the value once.
fn write_json_line(out: &mut Vec<u8>, meta: &Meta, r: &LogRecord) {
    write_shaped_line(out, &mut Vec::new(), meta, r);
}

/// [`write_json_line`], and the line's shape into `shape` (cleared first):
/// [`Shape`]'s of the value, the kinds of `_timestamp` and `_key`, or `!`
/// for a line that never reads.
fn write_shaped_line(out: &mut Vec<u8>, shape: &mut Vec<u8>, meta: &Meta, r: &LogRecord) {
    shape.clear();
    if meta.raw {
        write_raw_line(out, meta, r);
        shape.extend_from_slice(b"raw");
        return;
    }
    out.push(b'{');
    let timestamp_kind = match r.value.as_deref().map(|v| object_shape(v, shape)) {
        None => write_meta(out, meta, r),
        Some(Some(body)) => {
            if !body.trim().is_empty() {
                out.extend_from_slice(body.as_bytes());
                out.push(b',');
            }
            write_meta(out, meta, r)
        }
        Some(None) => {
            // Not one JSON object: a line that never reads (`!` is not
            // JSON outside a string) holding the value as text.
            write_meta(out, meta, r);
            let value = r.value.as_deref().unwrap_or_default();
            out.extend_from_slice(b",\"_value\":");
            out.extend_from_slice(quoted(&String::from_utf8_lossy(value)).as_bytes());
            out.extend_from_slice(b" !}");
            shape.clear();
            shape.push(b'!');
            return;
        }
    };
    out.push(b'}');
    // The metadata's kinds (the others never change kind).
    shape.push(b'|');
    shape.push(if timestamp_kind == b'"' || timestamp_kind == b'n' {
        timestamp_kind
    } else {
        b'#'
    });
    shape.push(if r.key.is_some() { b's' } else { b'n' });
}

/// A record as Spark's Kafka columns: `key` and `value` as hex (or null),
/// `topic`, `partition`, `offset` and `timestamp`.
fn write_raw_line(out: &mut Vec<u8>, meta: &Meta, r: &LogRecord) {
    use std::io::Write;
    let hex = |out: &mut Vec<u8>, bytes: &Option<Vec<u8>>| match bytes {
        None => out.extend_from_slice(b"null"),
        Some(b) => {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            out.push(b'"');
            for byte in b {
                out.push(DIGITS[(byte >> 4) as usize]);
                out.push(DIGITS[(byte & 15) as usize]);
            }
            out.push(b'"');
        }
    };
    if let Some(shard) = &meta.shard {
        // A Kinesis record as GetRecords gives it.
        out.extend_from_slice(b"{\"data\":");
        hex(out, &r.value);
        out.extend_from_slice(b",\"partition_key\":");
        write_text(out, &r.key);
        let _ = write!(
            out,
            ",\"sequence_number\":\"{}\",\"shard_id\":{shard},\"approximate_arrival_timestamp\":",
            r.seq.as_deref().unwrap_or_default()
        );
        write_timestamp(out, r.timestamp_ms, meta.timestamp_unit);
        out.push(b'}');
        return;
    }
    out.extend_from_slice(b"{\"key\":");
    hex(out, &r.key);
    out.extend_from_slice(b",\"value\":");
    hex(out, &r.value);
    let _ = write!(
        out,
        ",\"topic\":{},\"partition\":{},\"offset\":{},\"timestamp\":",
        meta.topic, meta.partition, r.offset
    );
    write_timestamp(out, r.timestamp_ms, meta.timestamp_unit);
    out.push(b'}');
}

/// A record's metadata members; the first byte of `_timestamp`'s value
/// (`"` text, `n` null, else a number).
fn write_meta(out: &mut Vec<u8>, meta: &Meta, r: &LogRecord) -> u8 {
    use std::io::Write;
    if let Some(shard) = &meta.shard {
        let _ = write!(
            out,
            "\"_shard_id\":{shard},\"_sequence_number\":\"{}\",\"_arrival_timestamp\":",
            r.seq.as_deref().unwrap_or_default()
        );
        let at = out.len();
        write_timestamp(out, r.timestamp_ms, meta.timestamp_unit);
        let timestamp_kind = out[at];
        out.extend_from_slice(b",\"_partition_key\":");
        write_text(out, &r.key);
        return timestamp_kind;
    }
    let _ = write!(
        out,
        "\"_topic\":{},\"_partition\":{},\"_offset\":{},\"_timestamp\":",
        meta.topic, meta.partition, r.offset
    );
    let at = out.len();
    write_timestamp(out, r.timestamp_ms, meta.timestamp_unit);
    let timestamp_kind = out[at];
    out.extend_from_slice(b",\"_key\":");
    match &r.key {
        Some(k) => out.extend_from_slice(quoted(&String::from_utf8_lossy(k)).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    timestamp_kind
}

/// Bytes as a JSON string (lossy UTF-8), or `null`.
fn write_text(out: &mut Vec<u8>, bytes: &Option<Vec<u8>>) {
    match bytes {
        Some(k) => out.extend_from_slice(quoted(&String::from_utf8_lossy(k)).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

/// A Kinesis record set aside as a bad row, as its user knows it: by its
/// shard and sequence number, not by the line it was read into.
pub(crate) struct BadRecord {
    /// `shard shardId-000000000000, sequence number 4959...`.
    pub at: String,
    /// What is wrong with it.
    pub reason: String,
    /// Its data as text when that is what is wrong, else the row as read.
    pub text: String,
    /// Whether `text` is the record's data.
    pub data: bool,
}

/// The bad row `line` of a Kinesis shard's records ([`Meta::shard`]),
/// set aside for `reason`, as a [`BadRecord`]; `None` if it names no
/// record. Data that is not one JSON object was written into a line that
/// never reads ([`write_shaped_line`]): that is what is wrong with it,
/// not what the JSON parser says of a column of that line.
pub(crate) fn bad_shard_record(line: &str, reason: &str) -> Option<BadRecord> {
    let never_reads = line.strip_suffix(" !}");
    let read: serde_json::Value = match never_reads {
        Some(head) => serde_json::from_str(&format!("{head}}}")).ok()?,
        // (The metadata is written last, so it wins over a field of the
        // data's own of its name.)
        None => serde_json::from_str(line).ok()?,
    };
    let text = |name: &str| read.get(name).and_then(serde_json::Value::as_str);
    let at = format!(
        "shard {}, sequence number {}",
        text("_shard_id")?,
        text("_sequence_number")?
    );
    Some(match (never_reads, text("_value")) {
        (Some(_), Some(data)) => BadRecord {
            at,
            reason: if data.is_empty() {
                "its data is empty, not a JSON object"
            } else {
                "its data is not one JSON object"
            }
            .to_string(),
            text: data.to_string(),
            data: true,
        },
        _ => BadRecord {
            at,
            reason: reason.to_string(),
            text: line.to_string(),
            data: false,
        },
    })
}

/// A record's timestamp (ms since the epoch) as `"YYYY-MM-DDTHH:MM:SS.mmm"`
/// in UTC; a year outside 0000 to 9999 as a number in `unit` (the
/// column's, when it holds it), else as chrono writes it; `null` outside
/// what chrono holds.
fn write_timestamp(out: &mut Vec<u8>, ms: i64, unit: Option<TimeUnit>) {
    use chrono::{Datelike, Timelike};
    use std::io::Write;
    let Some(t) = chrono::DateTime::from_timestamp_millis(ms) else {
        out.extend_from_slice(b"null");
        return;
    };
    let (date, time) = (t.date_naive(), t.time());
    if !(0..=9999).contains(&date.year()) {
        let n = match unit {
            Some(TimeUnit::Second) => Some(ms.div_euclid(1000)),
            Some(TimeUnit::Millisecond) => Some(ms),
            Some(TimeUnit::Microsecond) => ms.checked_mul(1000),
            Some(TimeUnit::Nanosecond) => ms.checked_mul(1_000_000),
            None => None,
        };
        // Beyond the unit (nanoseconds end in 2262): the text, which the
        // reader refuses with the value named, a bad row.
        let _ = match n {
            Some(n) => write!(out, "{n}"),
            None => write!(out, "\"{}\"", t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.3f")),
        };
        return;
    }
    // Digits by hand: strftime parses its format on every call.
    out.push(b'"');
    let mut put = |n: u32, width: usize, after: u8| {
        let mut buf = [b'0'; 4];
        let mut n = n;
        for d in buf[..width].iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
        out.extend_from_slice(&buf[..width]);
        out.push(after);
    };
    put(date.year() as u32, 4, b'-');
    put(date.month(), 2, b'-');
    put(date.day(), 2, b'T');
    put(time.hour(), 2, b':');
    put(time.minute(), 2, b':');
    put(time.second(), 2, b'.');
    put((time.nanosecond() / 1_000_000) % 1000, 3, b'"');
}

/// The members of `value` (between its braces, line breaks as spaces) if
/// it is exactly one JSON object in UTF-8.
pub(crate) fn one_object(value: &[u8]) -> Option<std::borrow::Cow<'_, str>> {
    object_shape(value, &mut Vec::new())
}

/// [`one_object`], and the value's [`Shape`] appended to `shape`.
fn object_shape<'a>(value: &'a [u8], shape: &mut Vec<u8>) -> Option<std::borrow::Cow<'a, str>> {
    use serde::de::DeserializeSeed;
    let text = std::str::from_utf8(value).ok()?;
    // One pass that checks the syntax and notes the shape, building no
    // value.
    let mut de = serde_json::Deserializer::from_str(text);
    Shape(shape).deserialize(&mut de).ok()?;
    de.end().ok()?;
    if !surrogates_paired(text.as_bytes()) {
        return None;
    }
    let body = text.trim().strip_prefix('{')?.strip_suffix('}')?;
    Some(if body.contains(['\n', '\r']) {
        std::borrow::Cow::Owned(body.replace(['\n', '\r'], " "))
    } else {
        std::borrow::Cow::Borrowed(body)
    })
}

/// What schema inference (arrow-json's, which the drift check runs) sees of
/// a JSON value, written as bytes: `n` null, `b` a boolean, `i` an integer
/// that fits i64, `u` one that does not, `f` another number, `s` a string,
/// `[...]` an array's distinct element shapes in the order first seen,
/// `{...}` an object's keys (length-prefixed) and their values' shapes in
/// order. Inference takes the union of what each line shows, so one line
/// of each distinct shape, in the order first seen, infers the same
/// columns, types and column order as every line.
struct Shape<'a>(&'a mut Vec<u8>);

impl<'de> serde::de::DeserializeSeed<'de> for Shape<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Shape<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> std::result::Result<(), E> {
        self.0.push(b'b');
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<(), E> {
        self.0.push(b'i');
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> std::result::Result<(), E> {
        self.0
            .push(if i64::try_from(v).is_ok() { b'i' } else { b'u' });
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<(), E> {
        self.0.push(b'f');
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<(), E> {
        self.0.push(b's');
        Ok(())
    }

    fn visit_unit<E>(self) -> std::result::Result<(), E> {
        self.0.push(b'n');
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        self.0.push(b'[');
        let mut seen: Vec<Vec<u8>> = Vec::new();
        let mut element = Vec::new();
        while seq.next_element_seed(Shape(&mut element))?.is_some() {
            if !seen.contains(&element) {
                self.0.extend_from_slice(&element);
                self.0.push(b',');
                seen.push(std::mem::take(&mut element));
            }
            element.clear();
        }
        self.0.push(b']');
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<(), A::Error> {
        self.0.push(b'{');
        while map.next_key_seed(Key(&mut *self.0))?.is_some() {
            map.next_value_seed(Shape(&mut *self.0))?;
        }
        self.0.push(b'}');
        Ok(())
    }
}

/// An object's key into a [`Shape`]: its length, then its text.
struct Key<'a>(&'a mut Vec<u8>);

impl<'de> serde::de::DeserializeSeed<'de> for Key<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Key<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, v: &str) -> std::result::Result<(), E> {
        self.0.extend_from_slice(&(v.len() as u32).to_le_bytes());
        self.0.extend_from_slice(v.as_bytes());
        Ok(())
    }
}

/// `records` as lines ([`write_json_line`]), and the first line of each
/// [`Shape`] among them.
pub(crate) fn shaped_lines(meta: &Meta, records: &[LogRecord]) -> (Vec<u8>, Vec<u8>) {
    let mut body = Vec::with_capacity(records.len() * 160);
    let (mut shapes, mut seen, mut shape) = (Vec::new(), HashSet::new(), Vec::new());
    for r in records {
        let start = body.len();
        write_shaped_line(&mut body, &mut shape, meta, r);
        body.push(b'\n');
        if !seen.contains(&shape) {
            shapes.extend_from_slice(&body[start..]);
            seen.insert(std::mem::take(&mut shape));
        }
    }
    (body, shapes)
}

/// Whether every `\\uD800`-`\\uDFFF` escape in `json` (valid JSON) is half
/// of a pair, high then low: the syntax check lets a lone one through,
/// and the readers (arrow-json) then fail on it, so the record must be a
/// bad row, not a line that fails the whole range.
fn surrogates_paired(json: &[u8]) -> bool {
    let hex = |at: usize| -> Option<u16> {
        let digits = std::str::from_utf8(json.get(at..at + 4)?).ok()?;
        u16::from_str_radix(digits, 16).ok()
    };
    let mut high_before = false;
    let mut i = 0;
    while i < json.len() {
        if json[i] == b'\\' && json.get(i + 1) == Some(&b'u') {
            let Some(u) = hex(i + 2) else { return false };
            // A low half must follow a high one, and only a low one may.
            if high_before != (0xDC00..=0xDFFF).contains(&u) {
                return false;
            }
            high_before = (0xD800..=0xDBFF).contains(&u);
            i += 6;
        } else if high_before {
            return false;
        } else {
            i += if json[i] == b'\\' { 2 } else { 1 };
        }
    }
    !high_before
}

/// Read `units` from `log` into a fresh in-memory store as JSON Lines
/// files (one per unit, [`crate::paths::stream::unit`]): what a task's
/// operator then scans as it scans files, into `schema` (the batch's:
/// the `_timestamp` column's unit). Returns the store, the files, and for
/// each file one line of each of its [`Shape`]s
/// ([`crate::paths::stream::shapes`], in the store): what the drift check
/// infers its columns from.
pub(crate) async fn read_units(
    log: Arc<dyn RecordLog>,
    topic: &str,
    units: &[RecordRange],
    schema: &datafusion::arrow::datatypes::Schema,
    raw: bool,
) -> Result<(Arc<dyn Store>, Vec<InputFile>, Vec<InputFile>)> {
    let column = if raw { "timestamp" } else { "_timestamp" };
    let timestamp_unit = match schema.field_with_name(column).map(|f| f.data_type()) {
        Ok(datafusion::arrow::datatypes::DataType::Timestamp(unit, _)) => Some(*unit),
        _ => None,
    };
    // Each unit fetched and written out on a task of its own: the
    // partitions' leaders answer at once, and the lines are made on every
    // core.
    let reads = units.iter().map(|u| {
        let (log, topic, u) = (log.clone(), topic.to_string(), *u);
        tokio::spawn(async move {
            let records = log.fetch(u).await?;
            let meta = Meta {
                topic: quoted(&topic),
                partition: u.partition,
                timestamp_unit,
                raw,
                shard: None,
            };
            let (body, shapes) = shaped_lines(&meta, &records);
            Ok::<_, Error>((u, body, shapes))
        })
    });
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut files = Vec::with_capacity(units.len());
    let mut shapes = Vec::with_capacity(units.len());
    for read in futures::future::join_all(reads).await {
        let (u, body, lines) = read.map_err(|e| Error::Service {
            service: "kafka",
            message: format!("a fetch task failed: {e}"),
            class: ErrorClass::Retryable,
        })??;
        let key = crate::paths::stream::unit(u.partition, u.start, u.end);
        let size = body.len() as u64;
        store
            .put(&key, Bytes::from(body), PutMode::Overwrite)
            .await?;
        let shapes_key = crate::paths::stream::shapes(&key);
        shapes.push(InputFile {
            key: shapes_key.clone(),
            size: lines.len() as u64,
            etag: None,
            modified_ms: None,
            partition: None,
        });
        store
            .put(&shapes_key, Bytes::from(lines), PutMode::Overwrite)
            .await?;
        files.push(InputFile {
            key,
            size,
            etag: None,
            modified_ms: None,
            partition: None,
        });
    }
    Ok((store, files, shapes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, value: Option<&str>) -> LogRecord {
        LogRecord {
            offset,
            timestamp_ms: 1_764_680_400_123,
            key: Some(b"k1".to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
            seq: None,
        }
    }

    fn line(value: Option<&str>) -> String {
        String::from_utf8(json_line("rides", 2, &record(7, value))).unwrap()
    }

    #[test]
    fn a_record_is_one_json_line_with_its_metadata() {
        let read =
            |v: Option<&str>| -> serde_json::Value { serde_json::from_str(&line(v)).unwrap() };
        let meta = serde_json::json!({
            "_key": "k1", "_offset": 7, "_partition": 2,
            "_timestamp": "2025-12-02T13:00:00.123", "_topic": "rides",
        });
        let mut with_a = meta.clone();
        with_a["a"] = serde_json::json!(1);
        assert_eq!(read(Some(r#"{"a": 1}"#)), with_a);
        assert_eq!(read(Some(" {} ")), meta);
        assert_eq!(read(None), meta);
        // The metadata wins over a value's own field of its name.
        assert_eq!(
            read(Some(r#"{"a": 1, "_offset": 999, "_topic": "fake"}"#)),
            with_a
        );
        // Pretty-printed: one line, every digit kept.
        let l = line(Some(
            "{\n \"amt\": 12345678901234567.89,\r\n \"a\": [1,\n 2]\n}",
        ));
        assert!(
            !l.contains('\n') && l.contains("12345678901234567.89"),
            "{l}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&l).unwrap()["a"],
            serde_json::json!([1, 2])
        );
        // Not exactly one object in UTF-8: never reads, shows its offset.
        for bad in [
            "42",
            "[1]",
            "{\"a\": ",
            "not json\nat all",
            "\"a\": 1}",
            "{} {\"a\": 1}",
            "{}{\"a\":1}",
            "{}\n{\"a\":1}",
            ":1}",
        ] {
            let l = line(Some(bad));
            assert!(
                serde_json::from_str::<serde_json::Value>(&l).is_err(),
                "{bad:?}: {l}"
            );
            assert!(l.contains("\"_offset\":7") && !l.contains('\n'), "{l}");
        }
        let not_utf8 = LogRecord {
            value: Some(vec![b'{', b'"', b'a', b'"', b':', b'"', 0xff, b'"', b'}']),
            ..record(7, None)
        };
        let l = String::from_utf8_lossy(&json_line("rides", 2, &not_utf8)).into_owned();
        assert!(
            serde_json::from_str::<serde_json::Value>(&l).is_err(),
            "{l}"
        );
    }

    #[test]
    fn a_bad_kinesis_record_is_named_by_its_shard_and_sequence_number() {
        let seq = "49590338271490256608559692538361571095921575989136588898";
        let meta = Meta::shard("shardId-000000000001", Some(TimeUnit::Microsecond), false);
        let line = |data: &[u8]| {
            let r = LogRecord {
                seq: Some(seq.to_string()),
                value: Some(data.to_vec()),
                ..record(0, None)
            };
            let (body, _) = shaped_lines(&meta, &[r]);
            String::from_utf8(body).unwrap().trim_end().to_string()
        };
        let at = format!("shard shardId-000000000001, sequence number {seq}");
        let cases: [(&[u8], &str); 4] = [
            (b"", "its data is empty, not a JSON object"),
            (b"[1, 2]", "its data is not one JSON object"),
            (b"not \"json\" !}", "its data is not one JSON object"),
            (b"{\"a\": ", "its data is not one JSON object"),
        ];
        for (data, reason) in cases {
            let l = line(data);
            let r = bad_shard_record(&l, "not valid JSON: expected `,` or `}` at column 9")
                .unwrap_or_else(|| panic!("{l}"));
            assert_eq!(
                (r.at.as_str(), r.reason.as_str(), r.text.as_bytes(), r.data),
                (at.as_str(), reason, data, true),
                "{l}"
            );
        }
        // Data that reads, with a field its column's type cannot hold: the
        // row reader's reason, the record by its metadata (not the data's
        // own field of its name).
        let l = line(br#"{"fare": "abc", "_shard_id": "fake"}"#);
        let r = bad_shard_record(&l, "field fare: \"abc\" is not double").unwrap();
        assert_eq!(
            (r.at.as_str(), r.reason.as_str(), r.data),
            (at.as_str(), "field fare: \"abc\" is not double", false)
        );
        assert!(bad_shard_record("not a line of records", "x").is_none());
    }

    #[tokio::test]
    async fn units_read_as_files_of_their_records_only() {
        let log = MemoryLog::default();
        log.partitions.lock().unwrap().insert(
            0,
            (
                0,
                (0..10)
                    .map(|o| record(o, Some(&format!("{{\"n\":{o}}}"))))
                    .collect(),
            ),
        );
        let unit = RecordRange {
            partition: 0,
            start: 3,
            end: 6,
        };
        let log: Arc<dyn RecordLog> = Arc::new(log);
        let schema = datafusion::arrow::datatypes::Schema::empty();
        let (store, files, _) = read_units(log, "rides", &[unit], &schema, false)
            .await
            .unwrap();
        assert_eq!(files.len(), 1);
        let body = store.get(&files[0].key).await.unwrap().unwrap().bytes;
        let ns: Vec<i64> = String::from_utf8(body.to_vec())
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["n"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        assert_eq!(ns, vec![3, 4, 5]);
        assert_eq!(files[0].size, body.len() as u64);
    }

    /// The timestamps written by hand are chrono's, across eras, leap
    /// days and the edges of what a timestamp holds.
    #[test]
    fn timestamps_are_written_as_chrono_formats_them() {
        let mut ms: Vec<i64> = vec![
            0,
            -1,
            1,
            951_782_400_000,     // 2000-02-29
            1_764_680_400_123,   // 2025-12-02T13:00:00.123
            253_402_300_799_999, // 9999-12-31T23:59:59.999
            253_402_300_800_000, // 10000-01-01
            -62_167_219_200_000, // 0000-01-01
            -62_167_219_200_001, // -0001-12-31
            i64::MAX,
            i64::MIN,
        ];
        let mut x: i64 = 0x2545_f491;
        for _ in 0..2000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ms.push(x % 300_000_000_000_000);
        }
        for m in ms {
            let mut got = Vec::new();
            write_timestamp(&mut got, m, None);
            let want = match chrono::DateTime::from_timestamp_millis(m) {
                Some(t) => format!("\"{}\"", t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.3f")),
                None => "null".to_string(),
            };
            assert_eq!(String::from_utf8(got).unwrap(), want, "{m} ms");
            // Into a timestamp column: the text for years 0000 to 9999,
            // else the number in the column's unit.
            let mut got = Vec::new();
            write_timestamp(&mut got, m, Some(TimeUnit::Microsecond));
            let got = String::from_utf8(got).unwrap();
            match chrono::DateTime::from_timestamp_millis(m) {
                Some(t) if (0..=9999).contains(&chrono::Datelike::year(&t)) => {
                    assert_eq!(got, want, "{m} ms")
                }
                Some(_) => assert_eq!(got, (m * 1000).to_string(), "{m} ms"),
                None => assert_eq!(got, "null"),
            }
        }
    }

    /// The columns inferred from one line of each shape are those
    /// inferred from every line (names, types, nesting and order), over
    /// values that vary in every way inference looks at.
    #[test]
    fn one_line_of_each_shape_infers_what_every_line_does() {
        use datafusion::arrow::json::reader::infer_json_schema_from_seekable;
        let values = [
            r#"{"a":1,"b":"x"}"#,
            r#"{"a":2,"b":"y"}"#,
            r#"{"b":"z","a":3}"#,
            r#"{"a":1.5}"#,
            r#"{"a":18446744073709551615}"#,
            r#"{"a":-4,"c":null}"#,
            r#"{"c":true,"d":[1,2,3]}"#,
            r#"{"d":[1,2.5,3]}"#,
            r#"{"d":[],"e":{"x":1,"y":[{"p":1},{"q":"s"}]}}"#,
            r#"{"e":{"y":[{"q":"t","p":2},{"r":[null]}],"z":false}}"#,
            r#"{"e":null,"a":null}"#,
            r#"{"f":"late","a":7,"a":8}"#,
            r#"{}"#,
            r#"{"g":[[1],[2.0],["s"]]}"#,
            // The same keys as a line before, one kind other: each must
            // be a shape of its own.
            r#"{"a":1}"#,
            r#"{"a":2.5}"#,
            r#"{"a":9223372036854775808}"#,
            r#"{"a":"s"}"#,
            r#"{"j":{"n":1}}"#,
            r#"{"j":{"n":1.5}}"#,
            r#"{"k":[{"n":1},{"n":"s"}]}"#,
            r#"{"k":[{"n":1},{"m":1}]}"#,
            r#"{"h":["s",1]}"#,
            r#"{"h":[1,"s"]}"#,
        ];
        let mut records: Vec<LogRecord> = Vec::new();
        for i in 0..600 {
            let mut r = record(i, Some(values[i as usize % values.len()]));
            if i % 5 == 0 {
                r.key = None;
            }
            if i % 11 == 0 {
                r.timestamp_ms = 253_402_300_800_000;
            }
            records.push(r);
        }
        records.push(record(600, None));
        let meta = Meta {
            topic: quoted("rides"),
            partition: 0,
            timestamp_unit: Some(TimeUnit::Microsecond),
            raw: false,
            shard: None,
        };
        let (all, shapes) = shaped_lines(&meta, &records);
        let infer = |text: &[u8]| {
            infer_json_schema_from_seekable(std::io::Cursor::new(text), None)
                .map(|(s, _)| s)
                .map_err(|e| e.to_string())
        };
        let every = infer(&all).unwrap();
        assert_eq!(infer(&shapes).unwrap(), every);
        // Each of those values alone after the others: the same again.
        for (i, v) in values.iter().enumerate() {
            let records: Vec<LogRecord> = values[..=i].iter().map(|v| record(0, Some(v))).collect();
            let (all, shapes) = shaped_lines(&meta, &records);
            assert_eq!(infer(&shapes).unwrap(), infer(&all).unwrap(), "{v}");
        }
        let lines = shapes.iter().filter(|b| **b == b'\n').count();
        assert!(lines < 100, "{lines} shapes of {} records", records.len());
        // A line that never reads is a shape of its own: inference from
        // the shapes fails as it does from every line.
        records.push(record(601, Some("[1, 2]")));
        let (all, shapes) = shaped_lines(&meta, &records);
        assert!(shapes.ends_with(b"!}\n"));
        assert!(infer(&all).is_err() && infer(&shapes).is_err());
    }

    #[test]
    fn lone_surrogate_escapes_are_not_one_object() {
        for ok in [
            r#"{"s":"\ud83d\ude00"}"#,
            r#"{"s":"\\ud800"}"#,
            r#"{"s":"\u0041\n\"","t":"\uDBFF\uDFFF"}"#,
            r#"{}"#,
        ] {
            assert!(one_object(ok.as_bytes()).is_some(), "{ok}");
        }
        for bad in [
            r#"{"s":"\ud800"}"#,
            r#"{"s":"\udc00"}"#,
            r#"{"s":"\ud800x"}"#,
            r#"{"s":"\ud800\u0041"}"#,
            r#"{"s":"\ud800\ud800\udc00"}"#,
            r#"{"s":"\ude00\ud83d"}"#,
            r#"{"\ud800":1}"#,
        ] {
            assert!(one_object(bad.as_bytes()).is_none(), "{bad}");
        }
    }

    /// The read-committed rule of the vendored client (vendor/rskafka),
    /// against cases worked by hand from the Java consumer's
    /// `CompletedFetch.nextFetchedRecord`: the test broker never lists
    /// aborted transactions in a fetch, so this is where it is checked.
    #[test]
    fn records_of_aborted_transactions_are_not_read() {
        use rskafka::client::partition::{BatchHeader, read_committed};
        let data = |last_offset, producer_id, is_transactional| BatchHeader {
            last_offset,
            producer_id,
            is_transactional,
            control: None,
        };
        let marker = |last_offset, producer_id, abort| BatchHeader {
            last_offset,
            producer_id,
            is_transactional: true,
            control: Some(abort),
        };
        // No transactions: everything is read.
        let plain = [data(2, -1, false), data(5, 3, false)];
        assert_eq!(read_committed(&plain, vec![]), vec![true, true]);
        // Producer 7: a committed transaction (0..=2, COMMIT at 3), an
        // aborted one (4..=5, 6..=7, ABORT at 8), then a committed one
        // (9..=9, COMMIT at 10). Producer 8 writes plain batches between.
        let log = [
            data(2, 7, true),
            marker(3, 7, false),
            data(5, 7, true),
            data(6, 8, false),
            data(7, 7, true),
            marker(8, 7, true),
            data(9, 7, true),
            marker(10, 7, false),
            data(11, 8, false),
        ];
        assert_eq!(
            read_committed(&log, vec![(4, 7)]),
            vec![true, false, false, true, false, false, true, false, true]
        );
        // Interleaved transactions of two producers, one aborted: only
        // the aborted producer's batches are dropped.
        let log = [
            data(0, 1, true),
            data(1, 2, true),
            data(2, 1, true),
            marker(3, 2, false),
            marker(4, 1, true),
        ];
        assert_eq!(
            read_committed(&log, vec![(0, 1)]),
            vec![false, true, false, false, false]
        );
        // The list may hold transactions the response's batches start
        // after: they drop nothing before their first offset.
        let log = [data(1, 5, true), marker(2, 5, false), data(4, 5, true)];
        assert_eq!(read_committed(&log, vec![(3, 5)]), vec![true, false, false]);
        // A non-transactional batch of a producer with an aborted
        // transaction is read.
        let log = [data(0, 6, true), data(1, 6, false), marker(2, 6, true)];
        assert_eq!(read_committed(&log, vec![(0, 6)]), vec![false, true, false]);
    }
}
