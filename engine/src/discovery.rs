//! Discovery: finding the input files that no committed batch has taken.
//!
//! `list` mode lists the whole source prefix and diffs it against every
//! processed key; `ordered` mode lists after a cursor and diffs against a
//! window of recent keys. Both first compare the listing against the
//! fingerprint kept in `control.json`, so a run with nothing new needs no
//! index read.

use crate::checkpoint::{Index, InputFile, ListingState};
use crate::error::Result;
use crate::pipeline::{DiscoveryMode, Source};
use crate::storage::{ObjectMeta, Store};

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
