//! Parsing trigger payloads: S3 notifications (direct or through SNS),
//! EventBridge schedules and S3 "Object Created" events, manual refreshes,
//! and the record batches of a Kafka or Kinesis event source mapping (a
//! wake-up only).

use std::collections::BTreeMap;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::kafka::KafkaEvent;
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::s3::S3Event;
use aws_lambda_events::event::sns::SnsEvent;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// The largest event the trigger accepts (Lambda's asynchronous limit).
pub(crate) const MAX_EVENT_BYTES: usize = 256 * 1024;

/// A parsed trigger event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Objects were created.
    Objects {
        /// How the notification came.
        via: Via,
        /// The objects, keys decoded.
        objects: Vec<ObjectRef>,
        /// Records that were not object creations (test events, removals).
        skipped: u64,
    },
    /// An EventBridge schedule fired: every registered pipeline looks.
    Schedule {
        /// The rule's ARN, when the event names it.
        rule: Option<String>,
    },
    /// A Lambda event source mapping (Amazon MSK or self-managed Kafka)
    /// delivered records: the pipelines reading their topics look. The
    /// records themselves are not used: a run reads from its own
    /// checkpointed offsets (the mapping's consumer group is not Sluice's).
    Records {
        /// Amazon MSK or self-managed Kafka.
        msk: bool,
        /// Topic -> records the event carried.
        topics: BTreeMap<String, u64>,
    },
    /// A Kinesis event source mapping delivered records: the pipelines
    /// reading their streams look. The records are not used: a run reads
    /// from its own checkpointed positions.
    Streams {
        /// Stream name -> records the event carried.
        streams: BTreeMap<String, u64>,
    },
    /// A manual refresh of one pipeline.
    Manual {
        /// The pipeline.
        pipeline: String,
        /// Who asked.
        requested_by: Option<String>,
        /// The kind of execution to start (the Continue step asks for a
        /// Standard one); `None`: Express where the deployment has it.
        workflow: Option<crate::deploy::Workflow>,
    },
}

impl Event {
    /// A short name of the event's source, for logs and reports.
    pub fn source(&self) -> &'static str {
        match self {
            Event::Objects { via: Via::S3, .. } => "s3",
            Event::Objects { via: Via::Sns, .. } => "sns",
            Event::Objects {
                via: Via::EventBridge,
                ..
            } => "eventbridge-s3",
            Event::Schedule { .. } => "schedule",
            Event::Records { msk: true, .. } => "msk",
            Event::Records { msk: false, .. } => "kafka",
            Event::Streams { .. } => "kinesis",
            Event::Manual { .. } => "manual",
        }
    }

    /// The kind of execution this event starts: what a manual refresh
    /// asks for (the Continue step asks for Standard), else Express (a
    /// deployment without an Express state machine starts Standard).
    pub fn workflow(&self) -> crate::deploy::Workflow {
        match self {
            Event::Manual {
                workflow: Some(w), ..
            } => *w,
            _ => crate::deploy::Workflow::Express,
        }
    }

    /// What the run records as its trigger (`sluice history`).
    pub fn label(&self) -> String {
        match self {
            Event::Manual {
                requested_by: Some(by),
                ..
            } => format!("manual: {by}"),
            other => other.source().to_string(),
        }
    }
}

/// How an object notification came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// An S3 bucket notification sent to the function directly.
    S3,
    /// An S3 notification carried by SNS.
    Sns,
    /// An EventBridge "Object Created" event.
    EventBridge,
}

/// One created object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectRef {
    /// Bucket.
    pub bucket: String,
    /// Key, decoded.
    pub key: String,
    /// Size in bytes, as the notification gives it.
    pub size: Option<u64>,
}

/// The manual refresh payload (`sluice refresh`, or an EventBridge rule
/// whose target input is this constant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManualRefresh {
    /// The pipeline to refresh.
    pub pipeline: String,
    /// Who asked, for the logs.
    #[serde(default)]
    pub requested_by: Option<String>,
    /// `"standard"` or `"express"`: the kind of execution to start (the
    /// state machine's Continue step asks for `standard`).
    #[serde(default)]
    pub workflow: Option<crate::deploy::Workflow>,
}

/// The `detail` of an EventBridge S3 "Object Created" event.
#[derive(Debug, Clone, Deserialize)]
struct ObjectCreatedDetail {
    bucket: NameOnly,
    object: KeyOnly,
}

#[derive(Debug, Clone, Deserialize)]
struct NameOnly {
    name: String,
}

#[derive(Debug, Clone, Deserialize)]
struct KeyOnly {
    key: String,
    #[serde(default)]
    size: Option<u64>,
}

pub(super) fn refused(message: impl Into<String>) -> Error {
    Error::Spec {
        file: "trigger event".into(),
        message: message.into(),
    }
}

/// Decode an S3 notification key: S3 form-encodes keys (`+` for a space,
/// `%XX` for other bytes).
pub fn decode_key(raw: &str) -> Result<String> {
    let plus = raw.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8()
        .map(|k| k.into_owned())
        .map_err(|_| {
            refused(format!(
                "object key \"{raw}\" is not valid URL-encoded UTF-8"
            ))
        })
}

use crate::storage::kinesis_stream_name as stream_name;

/// Parse a trigger payload. Errors name what was expected; nothing is
/// started for a payload that does not parse.
pub fn parse_event(payload: &[u8]) -> Result<Event> {
    if payload.len() > MAX_EVENT_BYTES {
        return Err(refused(format!(
            "{} bytes is over the {MAX_EVENT_BYTES}-byte limit; nothing was started",
            payload.len()
        )));
    }
    let value: Value = serde_json::from_slice(payload)
        .map_err(|e| refused(format!("not JSON ({e}); nothing was started")))?;
    parse_value(value)
}

fn parse_value(value: Value) -> Result<Event> {
    let Some(obj) = value.as_object() else {
        return Err(refused("expected a JSON object; nothing was started"));
    };
    if let Some(records) = obj.get("Records").and_then(Value::as_array) {
        let kinesis = records
            .first()
            .and_then(|r| r.get("eventSource"))
            .and_then(Value::as_str)
            == Some("aws:kinesis");
        if kinesis {
            let ev: KinesisEvent = typed(value, "a Kinesis event source mapping's event")?;
            let mut streams = BTreeMap::new();
            for r in &ev.records {
                let arn = r.event_source_arn.as_deref().unwrap_or_default();
                *streams.entry(stream_name(arn).to_string()).or_insert(0) += 1;
            }
            return Ok(Event::Streams { streams });
        }
        let from_sns = records
            .first()
            .and_then(|r| r.get("EventSource"))
            .and_then(Value::as_str)
            == Some("aws:sns");
        return if from_sns {
            sns_objects(value)
        } else {
            let (objects, skipped) = s3_objects(typed(value, "an S3 event notification")?)?;
            Ok(Event::Objects {
                via: Via::S3,
                objects,
                skipped,
            })
        };
    }
    if obj.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
        return Ok(Event::Objects {
            via: Via::S3,
            objects: Vec::new(),
            skipped: 1,
        });
    }
    if obj.contains_key("detail-type") {
        return eventbridge(typed(value, "an EventBridge event")?);
    }
    if let Some(source @ ("aws:kafka" | "SelfManagedKafka")) =
        obj.get("eventSource").and_then(Value::as_str)
    {
        let msk = source == "aws:kafka";
        let ev: KafkaEvent = typed(value, "a Kafka event source mapping's event")?;
        let mut topics = BTreeMap::new();
        for (key, records) in &ev.records {
            for r in records {
                // The mapping keys records by "topic-partition"; a record
                // names its topic too.
                let topic = match &r.topic {
                    Some(t) => t.clone(),
                    None => key
                        .rsplit_once('-')
                        .map(|(t, _)| t.to_string())
                        .unwrap_or_else(|| key.clone()),
                };
                *topics.entry(topic).or_insert(0) += 1;
            }
        }
        return Ok(Event::Records { msk, topics });
    }
    if obj.contains_key("pipeline") {
        let m: ManualRefresh = typed(value, "a manual refresh {\"pipeline\": NAME}")?;
        return Ok(Event::Manual {
            pipeline: m.pipeline,
            requested_by: m.requested_by,
            workflow: m.workflow,
        });
    }
    Err(refused(
        "unrecognised event: expected an S3 notification ({\"Records\": [...]}), an SNS \
         message carrying one, an EventBridge \"Scheduled Event\" or S3 \"Object Created\" \
         event, a Kafka or Kinesis event source mapping's records, or a manual refresh \
         {\"pipeline\": NAME}; nothing was started",
    ))
}

/// The S3 objects of an SNS event whose messages carry S3 notifications
/// (test events are counted as skipped).
fn sns_objects(value: Value) -> Result<Event> {
    let ev: SnsEvent = typed(value, "an SNS event")?;
    let mut objects = Vec::new();
    let mut skipped = 0;
    for r in &ev.records {
        let inner: Value = serde_json::from_str(&r.sns.message).map_err(|e| {
            refused(format!(
                "SNS message {} is not JSON ({e}); expected an S3 event notification",
                r.sns.message_id
            ))
        })?;
        if inner.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
            skipped += 1;
            continue;
        }
        let (o, s) = s3_objects(typed(inner, "an S3 event inside an SNS message")?)?;
        objects.extend(o);
        skipped += s;
    }
    Ok(Event::Objects {
        via: Via::Sns,
        objects,
        skipped,
    })
}

/// An EventBridge schedule or S3 "Object Created" event.
fn eventbridge(ev: EventBridgeEvent) -> Result<Event> {
    match (ev.source.as_str(), ev.detail_type.as_str()) {
        ("aws.events" | "aws.scheduler", "Scheduled Event") => Ok(Event::Schedule {
            rule: ev.resources.and_then(|r| r.into_iter().next()),
        }),
        ("aws.s3", "Object Created") => {
            let d: ObjectCreatedDetail = typed(ev.detail, "an S3 Object Created detail")?;
            // EventBridge carries keys as stored (the S3 user guide's
            // examples show no form encoding), unlike bucket
            // notifications.
            Ok(Event::Objects {
                via: Via::EventBridge,
                objects: vec![ObjectRef {
                    bucket: d.bucket.name,
                    key: d.object.key,
                    size: d.object.size,
                }],
                skipped: 0,
            })
        }
        (source, detail_type) => Err(refused(format!(
            "EventBridge event from \"{source}\" of type \"{detail_type}\" is not a trigger; \
             send \"Scheduled Event\" (aws.events) or S3 \"Object Created\" (aws.s3)"
        ))),
    }
}

fn typed<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T> {
    serde_json::from_value(value)
        .map_err(|e| refused(format!("not {what}: {e}; nothing was started")))
}

fn s3_objects(ev: S3Event) -> Result<(Vec<ObjectRef>, u64)> {
    let mut objects = Vec::new();
    let mut skipped = 0;
    for r in ev.records {
        let created = r
            .event_name
            .as_deref()
            .is_some_and(|n| n.starts_with("ObjectCreated:"));
        match (created, r.s3.bucket.name, r.s3.object.key) {
            (true, Some(bucket), Some(key)) => objects.push(ObjectRef {
                bucket,
                key: decode_key(&key)?,
                size: r.s3.object.size.and_then(|s| u64::try_from(s).ok()),
            }),
            _ => skipped += 1,
        }
    }
    Ok((objects, skipped))
}
