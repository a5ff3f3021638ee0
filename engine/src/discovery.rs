//! Discovery: finding the input files that no committed batch has taken.
//!
//! `list` mode lists the whole source prefix and diffs it against every
//! processed key; `ordered` mode lists after a cursor and diffs against a
//! window of recent keys. Both first compare the listing against the
//! fingerprint kept in `control.json`, so a run with nothing new needs no
//! index read.
//!
//! `notify` mode never lists the source to plan: triggers record each
//! notified object as a zero-byte inbox entry (`inbox/<key>.<size>`), a run
//! lists the inbox, and claims each key create-only (`index/keys/<key>`), so
//! a duplicate notification of a committed key is consumed without being
//! processed. Every `reconcile_every` runs a run also lists the source and
//! records, as inbox entries, the files that have neither a claim nor an
//! entry: those whose notification was lost.

use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};

use crate::checkpoint::{Control, Index, InputFile, ListingState};
use crate::error::Result;
use crate::paths::checkpoint as ck;
use crate::pipeline::{DiscoveryMode, Source};
use crate::storage::{ObjectMeta, PutMode, Store};

/// How many inbox or claim requests a trigger or run keeps in flight.
pub const CONCURRENT_REQUESTS: usize = 32;

/// 64-bit FNV-1a: a stable hash for fingerprints and local etags (std's
/// hasher may change between Rust releases; these values are persisted).
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv::new()
    }
}

impl Fnv {
    /// A fresh hasher.
    pub fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    /// Feed bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// FNV-1a of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = Fnv::new();
    h.write(bytes);
    h.finish()
}

/// List the input files of `source` after `start_after` (one listing; pages
/// as the store needs), keeping only keys that name input files.
pub async fn list_inputs(
    store: &dyn Store,
    source: &Source,
    start_after: Option<&str>,
) -> Result<Vec<ObjectMeta>> {
    let mut listed = store.list("", start_after).await?;
    listed.retain(|m| source.is_input(&m.key));
    Ok(listed)
}

/// The listing state of a listing (compare with the one in `control.json`).
pub fn listing_state(start_after: Option<String>, listed: &[ObjectMeta]) -> ListingState {
    ListingState::of(start_after, listed.iter().map(|m| m.key.as_str()))
}

/// The listed files that the index does not hold, in processing order:
/// arrival order (modification time, then key) in `list` mode, key order in
/// `ordered` mode.
pub fn new_inputs(listed: &[ObjectMeta], index: &Index, mode: DiscoveryMode) -> Vec<InputFile> {
    let mut fresh: Vec<&ObjectMeta> = listed
        .iter()
        .filter(|m| index.keys.binary_search(&m.key).is_err())
        .filter(|m| match (&index.start_after, mode) {
            (Some(s), DiscoveryMode::Ordered) => m.key.as_str() > s.as_str(),
            _ => true,
        })
        .collect();
    if mode == DiscoveryMode::List {
        fresh.sort_by(|a, b| {
            a.last_modified
                .cmp(&b.last_modified)
                .then(a.key.cmp(&b.key))
        });
    }
    fresh
        .into_iter()
        .map(|m| InputFile {
            key: m.key.clone(),
            size: m.size,
            etag: m.etag.clone(),
        })
        .collect()
}

/// One notified object waiting in the inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEntry {
    /// The entry's key in the checkpoint store.
    pub entry: String,
    /// The source key (relative to the source root).
    pub key: String,
    /// The object's size as notified.
    pub size: u64,
    /// When the entry was written (arrival order).
    pub arrived: Option<chrono::DateTime<chrono::Utc>>,
}

/// Apply `op` to every item with up to [`CONCURRENT_REQUESTS`] in flight;
/// results in input order, the first error returned.
pub async fn concurrently<T, R, F, Fut>(items: Vec<T>, op: F) -> Result<Vec<R>>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<R>>,
{
    futures::stream::iter(items.into_iter().map(op))
        .buffered(CONCURRENT_REQUESTS)
        .try_collect()
        .await
}

/// Record notified source objects (`(relative key, size)`) in the inbox of
/// the checkpoint `store`. Idempotent: a repeated notification rewrites the
/// same empty entry.
pub async fn record_notified(store: &Arc<dyn Store>, objects: Vec<(String, u64)>) -> Result<()> {
    concurrently(objects, |(key, size)| {
        let store = store.clone();
        async move {
            store
                .put(
                    &ck::inbox_entry(&key, size),
                    bytes::Bytes::new(),
                    PutMode::Overwrite,
                )
                .await?;
            Ok(())
        }
    })
    .await?;
    Ok(())
}

/// Delete `keys` from `store`, concurrently.
pub async fn delete_all(store: &Arc<dyn Store>, keys: Vec<String>) -> Result<()> {
    concurrently(keys, |key| {
        let store = store.clone();
        async move { Ok(store.delete(&key).await?) }
    })
    .await?;
    Ok(())
}

/// The inbox (one listing), oldest entry first. Entries that do not parse
/// (not written by Sluice) are skipped with a warning.
pub async fn read_inbox(store: &dyn Store) -> Result<Vec<InboxEntry>> {
    let mut out: Vec<InboxEntry> = Vec::new();
    for m in store.list(ck::INBOX_PREFIX, None).await? {
        match ck::inbox_key_of(&m.key) {
            Some((key, size)) => out.push(InboxEntry {
                entry: m.key,
                key,
                size,
                arrived: m.last_modified,
            }),
            None => tracing::warn!(entry = %m.key, "not an inbox entry Sluice wrote; ignored"),
        }
    }
    out.sort_by(|a, b| a.arrived.cmp(&b.arrived).then(a.key.cmp(&b.key)));
    Ok(out)
}

/// The entries as listed objects (for schema inference and `sluice show`),
/// one per key: the latest entry's size.
pub fn inbox_files(entries: &[InboxEntry]) -> Vec<ObjectMeta> {
    let mut by_key: std::collections::BTreeMap<&str, &InboxEntry> = Default::default();
    for e in entries {
        by_key.insert(&e.key, e);
    }
    let mut out: Vec<ObjectMeta> = by_key
        .values()
        .map(|e| ObjectMeta {
            key: e.key.clone(),
            size: e.size,
            etag: None,
            last_modified: e.arrived,
        })
        .collect();
    out.sort_by(|a, b| {
        a.last_modified
            .cmp(&b.last_modified)
            .then(a.key.cmp(&b.key))
    });
    out
}

/// Whether a run with `epoch` lists the source to reconcile: the first run,
/// then every `every` runs.
pub fn reconcile_due(control: Option<&Control>, epoch: u64, every: u64) -> bool {
    control
        .and_then(|c| c.reconciled_epoch)
        .is_none_or(|r| epoch >= r.saturating_add(every))
}

/// The source files that have neither a claim nor an inbox entry: their
/// notification was lost (or never sent). `source` is a full listing of
/// input files, `claims` a listing of `index/keys/`.
pub fn unnotified(
    source: &[ObjectMeta],
    claims: &[ObjectMeta],
    inbox: &[InboxEntry],
) -> Vec<ObjectMeta> {
    let mut known: std::collections::HashSet<String> = claims
        .iter()
        .filter_map(|m| ck::claim_key_of(&m.key))
        .collect();
    known.extend(inbox.iter().map(|e| e.key.clone()));
    source
        .iter()
        .filter(|m| !known.contains(&m.key))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str, t: i64) -> ObjectMeta {
        ObjectMeta {
            key: key.into(),
            size: 1,
            etag: None,
            last_modified: chrono::DateTime::from_timestamp(t, 0),
        }
    }

    #[test]
    fn reconciliation_is_due_first_then_every_k_runs() {
        let mut c = Control::new("h".into());
        assert!(reconcile_due(None, 1, 10));
        assert!(reconcile_due(Some(&c), 1, 10));
        c.reconciled_epoch = Some(3);
        assert!(!reconcile_due(Some(&c), 3, 10));
        assert!(!reconcile_due(Some(&c), 12, 10));
        assert!(reconcile_due(Some(&c), 13, 10));
        assert!(reconcile_due(Some(&c), 4, 1));
    }

    #[test]
    fn unnotified_is_source_minus_claims_and_inbox() {
        let source = vec![meta("a", 1), meta("b", 1), meta("c", 1), meta("d", 1)];
        let claims = vec![meta(&ck::claim("a"), 1)];
        let inbox = vec![InboxEntry {
            entry: ck::inbox_entry("c", 1),
            key: "c".into(),
            size: 1,
            arrived: None,
        }];
        let lost: Vec<_> = unnotified(&source, &claims, &inbox)
            .into_iter()
            .map(|m| m.key)
            .collect();
        assert_eq!(lost, vec!["b", "d"]);
    }

    #[tokio::test]
    async fn the_inbox_records_once_per_key_and_size_and_reads_back() {
        let store: Arc<dyn Store> = Arc::new(crate::storage::MemoryStore::new());
        let objects = vec![("x/1.csv".to_string(), 5), ("x/2.csv".to_string(), 7)];
        record_notified(&store, objects.clone()).await.unwrap();
        record_notified(&store, objects[..1].to_vec())
            .await
            .unwrap(); // a duplicate
        let entries = read_inbox(store.as_ref()).await.unwrap();
        let mut keys: Vec<_> = entries.iter().map(|e| (e.key.as_str(), e.size)).collect();
        keys.sort();
        assert_eq!(keys, vec![("x/1.csv", 5), ("x/2.csv", 7)]);
        store
            .put("inbox/junk", bytes::Bytes::new(), PutMode::Overwrite)
            .await
            .unwrap();
        assert_eq!(read_inbox(store.as_ref()).await.unwrap().len(), 2);
    }

    #[test]
    fn fnv_is_stable() {
        // Persisted in checkpoints: must never change.
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn new_inputs_diff_and_order() {
        let index = Index {
            keys: vec!["b".into()],
            ..Index::default()
        };
        let listed = vec![meta("a", 5), meta("b", 1), meta("c", 2)];
        let list: Vec<_> = new_inputs(&listed, &index, DiscoveryMode::List)
            .into_iter()
            .map(|f| f.key)
            .collect();
        assert_eq!(list, vec!["c", "a"]);
        let ordered: Vec<_> = new_inputs(&listed, &index, DiscoveryMode::Ordered)
            .into_iter()
            .map(|f| f.key)
            .collect();
        assert_eq!(ordered, vec!["a", "c"]);
    }
}
