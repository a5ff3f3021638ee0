//! `notify` discovery: the inbox that triggers fill, the create-only claim
//! each run takes per key, and the reconciliation that finds files whose
//! notification was lost.
//!
//! The claim decisions are pure ([`decide_key_claim`]); the model test
//! `tests/e2e/claim_model.rs` drives that very function.

use std::sync::Arc;

use crate::checkpoint::{Commit, Control, KeyClaim};
use crate::error::{Error, Result};
use crate::paths::checkpoint as ck;
use crate::storage::fanout::{concurrently, delete_all};
use crate::storage::{ObjectMeta, PutMode, Store};

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

/// Record notified source objects (`(relative key, size)`) in the inbox of
/// the checkpoint `store`. Idempotent: a repeated notification rewrites the
/// same entry.
pub async fn record_notified(store: &Arc<dyn Store>, objects: Vec<(String, u64)>) -> Result<()> {
    concurrently(objects, |(key, size)| {
        let store = store.clone();
        async move {
            // The body holds the key: the name does too, but for keys too
            // long to name.
            store
                .put(
                    &ck::inbox_entry(&key, size),
                    bytes::Bytes::from(key.into_bytes()),
                    PutMode::Overwrite,
                )
                .await?;
            Ok(())
        }
    })
    .await?;
    Ok(())
}

/// The inbox (one listing), oldest entry first. Entries that do not parse
/// (not written by Sluice) are skipped with a warning.
pub async fn read_inbox(store: &dyn Store) -> Result<Vec<InboxEntry>> {
    let mut out: Vec<InboxEntry> = Vec::new();
    let mut long = Vec::new();
    for m in store.list(ck::INBOX_PREFIX, None).await? {
        match ck::inbox_key_of(&m.key) {
            Some((Some(key), size)) => out.push(InboxEntry {
                entry: m.key,
                key,
                size,
                arrived: m.last_modified,
            }),
            Some((None, size)) => long.push((m, size)),
            None => tracing::warn!(entry = %m.key, "not an inbox entry Sluice wrote; ignored"),
        }
    }
    // Keys too long to name an entry are in its body: one read each.
    let read = concurrently(long, |(m, size)| async move {
        let body = store.get(&m.key).await?;
        Ok::<_, Error>(body.map(|b| (m, size, b.bytes)))
    })
    .await?;
    for (m, size, bytes) in read.into_iter().flatten() {
        match String::from_utf8(bytes.to_vec()) {
            Ok(key) if ck::inbox_entry(&key, size) == m.key => out.push(InboxEntry {
                entry: m.key,
                key,
                size,
                arrived: m.last_modified,
            }),
            _ => {
                tracing::warn!(entry = %m.key, "an inbox entry whose body is not its key; ignored")
            }
        }
    }
    out.sort_by(|a, b| a.arrived.cmp(&b.arrived).then(a.key.cmp(&b.key)));
    Ok(out)
}

/// The entries as listed objects (for schema inference and `sluice show`),
/// one per key: the latest entry's size.
pub(crate) fn inbox_files(entries: &[InboxEntry]) -> Vec<ObjectMeta> {
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
pub(crate) fn reconcile_due(control: Option<&Control>, epoch: u64, every: u64) -> bool {
    control
        .and_then(|c| c.reconciled_epoch)
        .is_none_or(|r| epoch >= r.saturating_add(every))
}

/// The source files that have neither a claim nor an inbox entry: their
/// notification was lost (or never sent). `source` is a full listing of
/// input files, `claims` a listing of the claims of the history starting
/// at batch `first`.
pub(crate) fn unnotified(
    source: &[ObjectMeta],
    claims: &[ObjectMeta],
    inbox: &[InboxEntry],
    first: u64,
) -> Vec<ObjectMeta> {
    let claimed: std::collections::HashSet<&str> = claims.iter().map(|m| m.key.as_str()).collect();
    let notified: std::collections::HashSet<&str> = inbox.iter().map(|e| e.key.as_str()).collect();
    source
        .iter()
        .filter(|m| {
            !notified.contains(m.key.as_str())
                && !claimed.contains(ck::claim(first, &m.key).as_str())
        })
        .cloned()
        .collect()
}

/// What a run does next while claiming a key, given what its last request
/// found. A pure function of the claim read, so the model test can drive it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimStep {
    /// The claim is this run's: plan the key.
    Taken,
    /// A committed batch holds the key: the notification is a duplicate;
    /// consume its entries without processing it.
    Duplicate,
    /// Write the claim create-only (none exists).
    Create,
    /// Take over a claim left by a plan that never committed, with
    /// compare-and-swap on the etag read, so a commit that marks it
    /// meanwhile wins.
    TakeOver(String),
}

/// The next step of claiming a key. `written`: the last put succeeded.
/// `read`: the claim as the last read found it (with its etag), if one
/// was made. Every planned batch is committed when a run discovers, so a
/// claim not marked committed was left by a plan that never committed.
pub fn decide_key_claim(written: bool, read: Option<Option<(&KeyClaim, &str)>>) -> ClaimStep {
    if written {
        return ClaimStep::Taken;
    }
    match read {
        // Nothing read yet: start with a create-only write.
        None => ClaimStep::Create,
        // Read and gone (deleted in between): create again.
        Some(None) => ClaimStep::Create,
        Some(Some((claim, _))) if claim.committed => ClaimStep::Duplicate,
        Some(Some((_, etag))) => ClaimStep::TakeOver(etag.to_string()),
    }
}

/// Claim source key `key` for the run with `epoch` in `pipeline`'s
/// checkpoint `store`, among the claims of the history starting at batch
/// `first`: `true` if this run takes it, `false` if a committed batch
/// holds it already (a duplicate notification).
pub(crate) async fn claim_key(
    store: &Arc<dyn Store>,
    pipeline: &str,
    first: u64,
    key: &str,
    epoch: u64,
) -> Result<bool> {
    use crate::storage::PutOutcome;
    let path = ck::claim(first, key);
    let mine = record(&KeyClaim {
        epoch,
        committed: false,
        batch: None,
    });
    let mut step = decide_key_claim(false, None);
    for _ in 0..16 {
        let mode = match step {
            ClaimStep::Taken => return Ok(true),
            ClaimStep::Duplicate => return Ok(false),
            ClaimStep::Create => PutMode::Create,
            ClaimStep::TakeOver(etag) => PutMode::Update(etag),
        };
        if let PutOutcome::Written(_) = store.put(&path, mine.clone(), mode).await? {
            step = decide_key_claim(true, None);
            continue;
        }
        let read = match store.get(&path).await? {
            None => None,
            Some(obj) => {
                let claim: KeyClaim =
                    serde_json::from_slice(&obj.bytes).map_err(|e| Error::Checkpoint {
                        pipeline: pipeline.to_string(),
                        key: path.clone(),
                        message: format!(
                            "unreadable claim ({e}); delete it to let the next run claim the \
                             key again"
                        ),
                    })?;
                Some((claim, obj.etag))
            }
        };
        step = decide_key_claim(false, Some(read.as_ref().map(|(c, e)| (c, e.as_str()))));
    }
    Err(Error::Conflict {
        pipeline: pipeline.to_string(),
        message: format!("the claim {path} keeps changing under this run; it stops"),
    })
}

fn record(claim: &KeyClaim) -> bytes::Bytes {
    serde_json::to_vec(claim)
        .expect("a claim of plain fields serializes")
        .into()
}

/// After `commits/N` exists: mark the claims of its keys committed (among
/// those of the history starting at batch `first`), record its deferred
/// inputs in the inbox again, then delete the inbox entries it consumed
/// (in that order, so a duplicate notification arriving at any point is
/// recognised, and a deferred input is never without an entry).
pub(crate) async fn settle_claims(
    store: &Arc<dyn Store>,
    first: u64,
    record_: &Commit,
) -> Result<()> {
    let done = record(&KeyClaim {
        epoch: record_.epoch,
        committed: true,
        batch: Some(record_.batch),
    });
    concurrently(record_.input_keys.clone(), |k| {
        let (store, done) = (store.clone(), done.clone());
        async move {
            store
                .put(&ck::claim(first, &k), done, PutMode::Overwrite)
                .await?;
            Ok(())
        }
    })
    .await?;
    // Inputs left for the next run (still being written) are notified
    // again with the size the task found, before their old entries go: the
    // next run claims them afresh (their claims were never committed).
    let again: Vec<(String, u64)> = record_
        .deferred
        .iter()
        .map(|f| (f.key.clone(), f.size))
        .collect();
    let kept: std::collections::HashSet<String> = again
        .iter()
        .map(|(k, size)| ck::inbox_entry(k, *size))
        .collect();
    record_notified(store, again).await?;
    let consumed = record_
        .consumed
        .iter()
        .filter(|e| !kept.contains(*e))
        .cloned()
        .collect();
    delete_all(store, consumed).await
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::tests::meta;

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
        let claims = vec![meta(&ck::claim(0, "a"), 1)];
        let inbox = vec![InboxEntry {
            entry: ck::inbox_entry("c", 1),
            key: "c".into(),
            size: 1,
            arrived: None,
        }];
        let lost: Vec<_> = unnotified(&source, &claims, &inbox, 0)
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
    fn claim_decisions() {
        let open = KeyClaim {
            epoch: 1,
            committed: false,
            batch: None,
        };
        let done = KeyClaim {
            committed: true,
            batch: Some(4),
            ..open.clone()
        };
        assert_eq!(decide_key_claim(false, None), ClaimStep::Create);
        assert_eq!(decide_key_claim(true, None), ClaimStep::Taken);
        assert_eq!(decide_key_claim(false, Some(None)), ClaimStep::Create);
        assert_eq!(
            decide_key_claim(false, Some(Some((&open, "e1")))),
            ClaimStep::TakeOver("e1".into())
        );
        assert_eq!(
            decide_key_claim(false, Some(Some((&done, "e2")))),
            ClaimStep::Duplicate
        );
    }
}
