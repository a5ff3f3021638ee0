//! `list` and `ordered` discovery: a listing of the source diffed against
//! the processed-key index.

use crate::checkpoint::{Index, InputFile, ListingState};
use crate::error::Result;
use crate::pipeline::{DiscoveryMode, Source};
use crate::storage::{ObjectMeta, Store};

/// List the input files of `source` after `start_after` (one listing; pages
/// as the store needs), keeping only keys that name input files.
pub(crate) async fn list_inputs(
    store: &dyn Store,
    source: &Source,
    start_after: Option<&str>,
) -> Result<Vec<ObjectMeta>> {
    Ok(list_readable(store, source, start_after).await?.0)
}

/// [`list_inputs`], and the input files skipped because their names cannot
/// be read (rendered with escapes).
pub(crate) async fn list_readable(
    store: &dyn Store,
    source: &Source,
    start_after: Option<&str>,
) -> Result<(Vec<ObjectMeta>, Vec<String>)> {
    let mut listed = store.list("", start_after).await?;
    listed.retain(|m| source.is_input(&m.key));
    // A key with a control character (a tab, a newline) names no object a
    // scan can open (object paths refuse them): skipped with a warning,
    // never planned and failed for ever.
    let unreadable: Vec<String> = listed
        .iter()
        .filter(|m| !crate::paths::is_plain_key(&m.key))
        .map(|m| format!("{:?}", m.key))
        .collect();
    if !unreadable.is_empty() {
        tracing::warn!(
            source = %store.describe(),
            skipped = unreadable.len(),
            files = %unreadable.join(", "),
            "input files skipped: their names hold control characters; rename them to read them"
        );
        listed.retain(|m| crate::paths::is_plain_key(&m.key));
    }
    Ok((listed, unreadable))
}

/// The listing state of a listing (compare with the one in `control.json`).
pub(crate) fn listing_state(start_after: Option<String>, listed: &[ObjectMeta]) -> ListingState {
    ListingState::of(start_after, listed.iter().map(|m| m.key.as_str()))
}

/// The listed files that the index does not hold, in processing order:
/// arrival order (modification time, then key) in `list` mode, key order in
/// `ordered` mode.
pub(crate) fn new_inputs(
    listed: &[ObjectMeta],
    index: &Index,
    mode: DiscoveryMode,
) -> Vec<InputFile> {
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
            modified_ms: m.last_modified.map(|t| t.timestamp_millis()),
            partition: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::tests::meta;

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
