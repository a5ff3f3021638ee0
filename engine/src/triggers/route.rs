//! Which registered pipelines an event concerns.

use std::collections::BTreeMap;

use super::events::{Event, ObjectRef, refused};
use crate::error::Result;
use crate::paths::is_plain_key;
use crate::pipeline::Pipeline;
use crate::storage::Location;

/// Whether the created object `o` wakes `p`: an input file, or, for a
/// pipeline reading another's sink (`manifests` discovery), a manifest.
pub(crate) fn concerns(p: &Pipeline, o: &ObjectRef) -> bool {
    if let Some(k) = source_key(p, o)
        && let Some(wakes) = crate::discovery::Source::of(p).wakes_on(k)
    {
        return wakes;
    }
    input_key(p, o).is_some()
}

/// The key of `o` relative to `p`'s source root, if `o` is an input file
/// of `p`.
pub(crate) fn input_key<'a>(p: &Pipeline, o: &'a ObjectRef) -> Option<&'a str> {
    source_key(p, o).filter(|k| p.source.is_input(k))
}

/// The key of `o` relative to `p`'s source root, if it is under it.
fn source_key<'a>(p: &Pipeline, o: &'a ObjectRef) -> Option<&'a str> {
    let Location::S3 { bucket, prefix } = &p.source.location else {
        return None;
    };
    if *bucket != o.bucket || !is_plain_key(&o.key) {
        return None;
    }
    let rel = if prefix.is_empty() {
        o.key.as_str()
    } else {
        o.key.strip_prefix(prefix.as_str())?.strip_prefix('/')?
    };
    Some(rel)
}

/// Which registered pipelines an event wakes, and how many objects it
/// carried that concern none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    /// Pipeline name -> objects (or a topic's records) of the event that
    /// concern it.
    pub pipelines: BTreeMap<String, u64>,
    /// Objects outside every registered source, or with path tricks;
    /// records of topics no registered pipeline reads.
    pub ignored: u64,
}

/// Route `event` to the pipelines in `registered`.
pub fn route(event: &Event, registered: &[Pipeline]) -> Result<Routing> {
    let mut r = Routing::default();
    match event {
        Event::Objects { objects, .. } => {
            for o in objects {
                let mut hit = false;
                for p in registered.iter().filter(|p| concerns(p, o)) {
                    *r.pipelines.entry(p.name.clone()).or_default() += 1;
                    hit = true;
                }
                if !hit {
                    r.ignored += 1;
                }
            }
        }
        Event::Records { topics, .. } => {
            for (topic, records) in topics {
                let mut hit = false;
                for p in registered {
                    if matches!(&p.source.location, Location::Kafka { topic: t, .. } if t == topic)
                    {
                        *r.pipelines.entry(p.name.clone()).or_default() += records;
                        hit = true;
                    }
                }
                if !hit {
                    r.ignored += records;
                }
            }
        }
        Event::Streams { streams } => {
            for (stream, records) in streams {
                let mut hit = false;
                for p in registered {
                    if matches!(&p.source.location, Location::Kinesis { stream: s }
                        if crate::storage::kinesis_stream_name(s) == stream)
                    {
                        *r.pipelines.entry(p.name.clone()).or_default() += records;
                        hit = true;
                    }
                }
                if !hit {
                    r.ignored += records;
                }
            }
        }
        Event::Schedule { .. } => {
            for p in registered {
                r.pipelines.insert(p.name.clone(), 0);
            }
        }
        Event::Manual { pipeline, .. } => {
            if !registered.iter().any(|p| p.name == *pipeline) {
                return Err(refused(format!(
                    "no pipeline \"{pipeline}\" is registered; run `sluice register` with its \
                     pipeline file first"
                )));
            }
            r.pipelines.insert(pipeline.clone(), 0);
        }
    }
    Ok(r)
}
