//! `manifests` discovery: the source is another Sluice pipeline's sink, and
//! a run reads only what that pipeline committed, through its manifests
//! (`_sluice/manifest/N.json`, written by its commit after the batch's parts
//! are published), never a part that is staged, orphaned or half published.
//! The offset is the manifest number: the index keeps the key of the last
//! manifest read, and a run lists the manifests after it.
//!
//! The upstream writes manifest N+1 only after manifest N (a batch is
//! planned only once the one before it is committed, and recovery writes a
//! missing manifest before the next batch), so a run reads the unbroken run
//! of manifests after its cursor and stops at a gap: a later manifest
//! beyond one not written yet waits for the next run.

use crate::checkpoint::{InputFile, Manifest, SinkOwner};
use crate::error::{Error, Result};
use crate::paths::sink as sk;
use crate::storage::fanout::concurrently;
use crate::storage::{ObjectMeta, Store};

/// One upstream manifest and the files it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ManifestFiles {
    /// The manifest's key (`_sluice/manifest/N.json`).
    pub key: String,
    /// The committed files of that batch (none for a batch whose query
    /// kept no rows).
    pub files: Vec<InputFile>,
}

/// What a look at the source sink found after a cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Upstream {
    /// The source sink's history (its owner record's), if it has one.
    pub history: Option<String>,
    /// The unbroken run of manifests after the cursor, in order.
    pub manifests: Vec<ManifestFiles>,
}

impl Upstream {
    /// The files of every manifest, in order, as listed objects (for schema
    /// inference and the idle check).
    pub(crate) fn listed(&self) -> Vec<ObjectMeta> {
        self.inputs()
            .into_iter()
            .map(InputFile::into_meta)
            .collect()
    }

    /// The files of every manifest, in order.
    pub(crate) fn inputs(&self) -> Vec<InputFile> {
        self.manifests
            .iter()
            .flat_map(|m| m.files.iter().cloned())
            .collect()
    }
}

/// Read the source sink of `pipeline` after the manifest `start_after`: its
/// owner's history, then the manifests after the cursor (one listing, one
/// read each), up to the first gap.
pub(crate) async fn read_upstream(
    store: &dyn Store,
    pipeline: &str,
    start_after: Option<&str>,
) -> Result<Upstream> {
    let broken = |key: &str, message: String| Error::Input {
        pipeline: pipeline.to_string(),
        batch: None,
        key: format!("{}/{key}", store.describe()),
        message,
    };
    let (history, first) = match store.get(sk::OWNER).await? {
        None => (None, 0),
        Some(obj) => {
            let owner: SinkOwner = serde_json::from_slice(&obj.bytes).map_err(|e| {
                broken(
                    sk::OWNER,
                    format!("not the owner record of a Sluice sink ({e}); is source.uri a sink?"),
                )
            })?;
            (Some(owner.history), owner.first_batch)
        }
    };
    let after = start_after.map(|k| k.to_string());
    // From the cursor on; without one, from the source history's first
    // batch (a reset source numbers on past its retired batches).
    let next = match &after {
        None => first,
        Some(k) => sk::manifest_batch(k).map_or(first, |n| n + 1),
    };
    let mut numbered: Vec<(u64, String)> = store
        .list(sk::MANIFEST_PREFIX, after.as_deref())
        .await?
        .into_iter()
        .filter_map(|m| sk::manifest_batch(&m.key).map(|n| (n, m.key)))
        .collect();
    numbered.sort();
    let run = unbroken_run(numbered, next);
    let manifests = concurrently(run, |(n, key)| async move {
        let obj = store.get(&key).await?.ok_or_else(|| {
            broken(
                &key,
                "listed, then gone: was the source pipeline reset? Run again".into(),
            )
        })?;
        let files = manifest_files(&obj.bytes, n).map_err(|m| broken(&key, m))?;
        Ok(ManifestFiles { key, files })
    })
    .await?;
    Ok(Upstream { history, manifests })
}

/// Of the manifests `numbered` (sorted), the unbroken run from batch `next`
/// on.
fn unbroken_run(numbered: Vec<(u64, String)>, mut next: u64) -> Vec<(u64, String)> {
    let mut run = Vec::new();
    for (n, key) in numbered {
        // Below the cursor or the history's first batch: a retired
        // manifest (one a stopped run published after `sluice reset`
        // retired its batch) is never read; a gap above ends the run of
        // batches.
        if n < next {
            continue;
        }
        if n != next {
            break;
        }
        run.push((n, key));
        next += 1;
    }
    run
}

/// The files the manifest `bytes`, listed as batch `n`, names; or why it is
/// not a batch of new rows to read.
fn manifest_files(bytes: &[u8], n: u64) -> std::result::Result<Vec<InputFile>, String> {
    let manifest: Manifest =
        serde_json::from_slice(bytes).map_err(|e| format!("not a manifest Sluice wrote ({e})"))?;
    if manifest.batch != n {
        return Err(format!(
            "names batch {} under the name of batch {n}",
            manifest.batch
        ));
    }
    if manifest.complete {
        // Each batch of a complete-mode sink replaces the earlier ones:
        // read as new rows, every group would count once per batch.
        return Err(
            "is a complete snapshot (the source pipeline's sink.mode = \"complete\"): each \
             batch of it replaces the earlier ones, so reading its batches as new rows \
             would count every group again per batch; read that sink's last manifest as a \
             table instead, or give the source pipeline sink.mode = \"append\" or \
             \"update\""
                .into(),
        );
    }
    Ok(manifest
        .files
        .into_iter()
        .map(|f| InputFile {
            key: f.key,
            size: f.bytes,
            etag: None,
            modified_ms: None,
            partition: None,
        })
        .collect())
}

/// Refuse a source sink whose history is not the one the committed batches
/// read: its pipeline was reset (or the source now points at another sink),
/// so its manifest numbers start over and the cursor means nothing there.
pub(crate) fn check_history(pipeline: &str, read: Option<&str>, upstream: &Upstream) -> Result<()> {
    match (read, upstream.history.as_deref()) {
        (Some(was), Some(now)) if was != now => Err(Error::Incompatible {
            pipeline: pipeline.to_string(),
            message: format!(
                "the source sink now holds another history ({now}, was {was}): its pipeline \
                 was reset, or source.uri names another sink, so its batches are numbered \
                 afresh. Run `sluice reset` on this pipeline file to read it from the start"
            ),
        }),
        _ => Ok(()),
    }
}
