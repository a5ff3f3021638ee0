//! `index.json`: the keys a `list`- or `ordered`-mode source has
//! processed (its cursor), and `claims/`: a `notify`-mode key's claim.

use serde::{Deserialize, Serialize};

use super::{FORMAT_VERSION, ListingState};

/// What an [`Index`] keeps of the keys its batches processed (the source
/// kind decides: `discovery::Source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKeep {
    /// Every key (`list`).
    Every,
    /// The most recent this many; the largest evicted is the cursor
    /// (`ordered`).
    Recent(u64),
    /// Only the last key, as the cursor (`manifests`: the last manifest
    /// read).
    Last,
}

/// The largest lookback whose index `control.json` holds itself (keys of
/// about 100 bytes: 100 KB).
pub const INLINE_LOOKBACK: u64 = 1000;

impl IndexKeep {
    /// Whether an index kept this way is small enough to live in
    /// `control.json` ([`super::Control::index`]).
    pub fn inline(self) -> bool {
        match self {
            IndexKeep::Every => false,
            IndexKeep::Recent(n) => n <= INLINE_LOOKBACK,
            IndexKeep::Last => true,
        }
    }
}

/// `index/processed.json`: processed input keys. In `list` mode all of them;
/// in `ordered` mode the most recent `lookback`, with the largest key evicted
/// from the window as the cursor later listings start after.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Index {
    /// Checkpoint format version.
    pub format_version: u32,
    /// The last batch whose inputs are in the index.
    pub through_batch: Option<u64>,
    /// Ordered mode: listings start after this key.
    pub start_after: Option<String>,
    /// Processed keys (ascending).
    pub keys: Vec<String>,
}

impl Index {
    /// The index after batch `batch` processed `new_keys`. Idempotent: an
    /// index already through `batch` is returned unchanged.
    pub fn apply(&self, batch: u64, new_keys: &[String], keep: IndexKeep) -> Index {
        if self.through_batch.is_some_and(|t| t >= batch) {
            return self.clone();
        }
        if keep == IndexKeep::Last {
            // The keys are the manifests read: only the last one is kept.
            return Index {
                format_version: FORMAT_VERSION,
                through_batch: Some(batch),
                start_after: new_keys.iter().max().cloned().max(self.start_after.clone()),
                keys: Vec::new(),
            };
        }
        let mut keys = self.keys.clone();
        keys.extend(new_keys.iter().cloned());
        keys.sort();
        keys.dedup();
        let mut start_after = self.start_after.clone();
        if let IndexKeep::Recent(lookback) = keep
            && keys.len() as u64 > lookback
        {
            let evict = keys.len() - lookback as usize;
            let evicted = keys.drain(..evict).next_back();
            if evicted.as_ref() > start_after.as_ref() {
                start_after = evicted;
            }
        }
        Index {
            format_version: FORMAT_VERSION,
            through_batch: Some(batch),
            start_after,
            keys,
        }
    }

    /// The listing state this index corresponds to.
    pub fn listing(&self) -> ListingState {
        ListingState::of(
            self.start_after.clone(),
            self.keys.iter().map(String::as_str),
        )
    }
}

/// `index/keys/<key>` (notify mode): a run took this input key. A run
/// writes it create-only before planning the key; the commit of the batch
/// holding the key rewrites it with `committed` set, before it deletes the
/// key's inbox entries. So a claim with `committed` unset seen by a run that
/// discovers (every planned batch is committed by then) was left by a plan
/// that never committed, and that run takes it over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyClaim {
    /// Epoch of the run that wrote it.
    pub epoch: u64,
    /// The key is in a committed batch.
    pub committed: bool,
    /// That batch.
    #[serde(default)]
    pub batch: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ks: &[&str]) -> Vec<String> {
        ks.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn index_list_mode_keeps_everything_and_is_idempotent() {
        let i = Index::default().apply(0, &keys(&["b", "a"]), IndexKeep::Every);
        assert_eq!(i.keys, keys(&["a", "b"]));
        let j = i.apply(1, &keys(&["c"]), IndexKeep::Every);
        assert_eq!(j.keys, keys(&["a", "b", "c"]));
        assert_eq!(j.apply(1, &keys(&["z"]), IndexKeep::Every), j);
        assert_eq!(j.start_after, None);
    }

    #[test]
    fn index_ordered_mode_keeps_a_window() {
        let i = Index::default().apply(0, &keys(&["a", "b", "c"]), IndexKeep::Recent(2));
        assert_eq!(i.keys, keys(&["b", "c"]));
        assert_eq!(i.start_after.as_deref(), Some("a"));
        let j = i.apply(1, &keys(&["d", "e"]), IndexKeep::Recent(2));
        assert_eq!(j.keys, keys(&["d", "e"]));
        assert_eq!(j.start_after.as_deref(), Some("c"));
        let z = Index::default().apply(0, &keys(&["a"]), IndexKeep::Recent(0));
        assert!(z.keys.is_empty());
        assert_eq!(z.start_after.as_deref(), Some("a"));
    }
}
