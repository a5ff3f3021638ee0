//! The checkpoint: its records ([`records`](self::Control) and friends), the
//! pure decisions of the lease protocol (`lease`), lease owners ([`owner`]),
//! and the thin layer that reads and writes the records through a [`Store`].
//!
//! Layout under `<checkpoint>/<pipeline>/` (keys from [`crate::paths`]):
//! `pipeline.json` (spec, pinned schema), `control.json` (lease, last
//! committed batch, listing fingerprint; compare-and-swap only),
//! `offsets/N.json` (plan, create-only, before any output), `commits/N.json`
//! (create-only, last), `index/processed.json` (processed inputs).

use std::sync::Arc;

use bytes::Bytes;
use serde::{Serialize, de::DeserializeOwned};

use crate::error::{Error, Result};
use crate::paths;
use crate::storage::{PutMode, PutOutcome, Store};

mod lease;
pub mod owner;
mod records;

pub use lease::{Claim, claimed, decide_claim, end_of_run, owns, requested};
pub use records::{
    Commit, Control, Durations, FORMAT_VERSION, FunctionUsage, Index, InputFile, KeyClaim,
    ListingState, Manifest, Offsets, OutputFile, PipelineRecord, Quarantined, RunStatus,
    SchemaVersion, SinkOwner, SourceCursor, StatefulState, TaskPlan, Totals, Usage,
};

/// Which batches' offsets and commits may be deleted once `last_committed`
/// is committed, keeping `retain` batches: all below the returned number.
pub(crate) fn retention_floor(last_committed: u64, retain: u64) -> u64 {
    (last_committed + 1).saturating_sub(retain)
}

/// The checkpoint of one pipeline, read and written through a store rooted at
/// `<checkpoint>/<pipeline>/`.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    store: Arc<dyn Store>,
    pipeline: String,
}

impl Checkpoint {
    /// The checkpoint of `pipeline` in `store`.
    pub fn new(store: Arc<dyn Store>, pipeline: &str) -> Checkpoint {
        Checkpoint {
            store,
            pipeline: pipeline.to_string(),
        }
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    async fn read<T: DeserializeOwned>(&self, key: &str) -> Result<Option<(T, String)>> {
        let fetched = self.store.get(key).await?;
        fetched.map(|obj| self.decode(key, obj)).transpose()
    }

    fn decode<T: DeserializeOwned>(
        &self,
        key: &str,
        obj: crate::storage::Object,
    ) -> Result<(T, String)> {
        let value = serde_json::from_slice(&obj.bytes).map_err(|e| Error::Checkpoint {
            pipeline: self.pipeline.clone(),
            key: format!("{}/{key}", self.store.describe()),
            message: format!(
                "unreadable ({e}); restore it from a backup, or start over with `sluice reset` \
                 on the pipeline file"
            ),
        })?;
        Ok((value, obj.etag))
    }

    async fn write<T: Serialize>(&self, key: &str, value: &T, mode: PutMode) -> Result<PutOutcome> {
        let bytes = serde_json::to_vec_pretty(value).expect("checkpoint records serialize");
        Ok(self.store.put(key, Bytes::from(bytes), mode).await?)
    }

    fn must_create(&self, key: &str, outcome: PutOutcome, what: &str) -> Result<()> {
        match outcome {
            PutOutcome::Written(_) => Ok(()),
            PutOutcome::Conflict => Err(Error::Conflict {
                pipeline: self.pipeline.clone(),
                message: format!("{what} {key} was written by another run; this run stops"),
            }),
        }
    }

    /// Read `control.json` and its etag.
    pub async fn control(&self) -> Result<Option<(Control, String)>> {
        self.read(paths::checkpoint::CONTROL).await
    }

    /// Compare-and-swap `control.json` (create it when `etag` is `None`).
    /// Returns the new etag, or `None` if another writer changed it first.
    pub async fn swap_control(&self, next: &Control, etag: Option<&str>) -> Result<Option<String>> {
        let mode = match etag {
            Some(e) => PutMode::Update(e.to_string()),
            None => PutMode::Create,
        };
        Ok(
            match self.write(paths::checkpoint::CONTROL, next, mode).await? {
                PutOutcome::Written(etag) => Some(etag),
                PutOutcome::Conflict => None,
            },
        )
    }

    /// Read `pipeline.json`.
    pub async fn pipeline_record(&self) -> Result<Option<PipelineRecord>> {
        Ok(self
            .read(paths::checkpoint::PIPELINE)
            .await?
            .map(|(r, _)| r))
    }

    /// Write `pipeline.json` (registration, or a compatible spec change).
    pub async fn put_pipeline_record(&self, record: &PipelineRecord) -> Result<()> {
        self.write(paths::checkpoint::PIPELINE, record, PutMode::Overwrite)
            .await?;
        Ok(())
    }

    /// Read the plan of batch `n`.
    pub async fn offsets(&self, n: u64) -> Result<Option<Offsets>> {
        Ok(self
            .read(&paths::checkpoint::offsets(n))
            .await?
            .map(|(r, _)| r))
    }

    /// Write the plan of a batch, create-only: losing means another run owns
    /// the pipeline.
    pub(crate) async fn create_offsets(&self, offsets: &Offsets) -> Result<()> {
        let key = paths::checkpoint::offsets(offsets.batch);
        let outcome = self.write(&key, offsets, PutMode::Create).await?;
        self.must_create(&key, outcome, "batch plan")
    }

    /// Read the commit record of batch `n`.
    pub async fn commit(&self, n: u64) -> Result<Option<Commit>> {
        Ok(self
            .read(&paths::checkpoint::commit(n))
            .await?
            .map(|(r, _)| r))
    }

    /// Write the commit record of a batch, create-only. Returns false if it
    /// already exists (a retried commit).
    pub(crate) async fn create_commit(&self, commit: &Commit) -> Result<bool> {
        let key = paths::checkpoint::commit(commit.batch);
        Ok(matches!(
            self.write(&key, commit, PutMode::Create).await?,
            PutOutcome::Written(_)
        ))
    }

    /// Read the processed-input index (empty if none was written yet).
    pub async fn index(&self) -> Result<Index> {
        Ok(self
            .read(paths::checkpoint::INDEX)
            .await?
            .map(|(r, _)| r)
            .unwrap_or_default())
    }

    /// Replace the processed-input index.
    pub async fn put_index(&self, index: &Index) -> Result<()> {
        self.write(paths::checkpoint::INDEX, index, PutMode::Overwrite)
            .await?;
        Ok(())
    }

    /// Delete the plan of an uncommitted batch (after its input was refused).
    pub(crate) async fn delete_offsets(&self, n: u64) -> Result<()> {
        Ok(self.store.delete(&paths::checkpoint::offsets(n)).await?)
    }

    /// The offsets and commits of batches below `floor`, oldest first, all
    /// offsets before any commit: what pruning to `floor` deletes, in that
    /// order. Nothing reads pruned records.
    pub(crate) async fn prunable(&self, floor: u64) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        for prefix in [
            paths::checkpoint::OFFSETS_PREFIX,
            paths::checkpoint::COMMITS_PREFIX,
        ] {
            for meta in self.store.list(prefix, None).await? {
                match paths::checkpoint::batch_of(&meta.key) {
                    Some(n) if n < floor => keys.push(meta.key),
                    _ => break,
                }
            }
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention() {
        assert_eq!(retention_floor(0, 10), 0);
        assert_eq!(retention_floor(9, 10), 0);
        assert_eq!(retention_floor(10, 10), 1);
    }
}
