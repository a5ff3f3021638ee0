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

mod control;
mod index;
mod lease;
pub mod owner;
mod records;
mod work;
pub use work::{PartitionStep, TaskId};

pub use control::{Attempts, CONTROL_TRIES, ControlRead};
pub use index::{Index, IndexKeep, KeyClaim};
pub use lease::{
    Claim, ExecutionClaim, claimed, decide_claim, decide_execution, end_of_run, owns, requested,
};
pub use records::{
    Commit, Control, DeltaPart, Durations, ExpressUsage, FORMAT_VERSION, FunctionUsage, InputFile,
    ListingState, Manifest, Offsets, OutputFile, PipelineRecord, Quarantined, QueryShape,
    RecordRange, RunExecution, RunStatus, SchemaVersion, ShardCursor, ShardLoss, ShardRead,
    ShardUnit, ShardUntil, SinkOwner, SourceCursor, StatefulState, StaticPin, StaticUsed,
    StreamPlan, StreamUntil, TaskPace, TaskPlan, Totals, Usage, seq_cmp,
};

/// Whether a record of history `found` is not of history `ours`: both
/// known and different. (Records of builds before histories were recorded
/// carry none, and are taken as this checkpoint's.)
pub(crate) fn foreign(found: &str, ours: &str) -> bool {
    !found.is_empty() && !ours.is_empty() && found != ours
}

/// Whether a record of history `found`, written under `found_epoch`, is
/// a retired history's as the writer of `ours` under `epoch` sees it:
/// another history, and an older epoch (epochs grow across resets).
fn retired(found: &str, found_epoch: u64, ours: &str, epoch: u64) -> bool {
    foreign(found, ours) && found_epoch < epoch
}

/// Which batches' offsets and commits may be deleted once `last_committed`
/// is committed, keeping `retain` batches: all below the returned number.
pub(crate) fn retention_floor(last_committed: u64, retain: u64) -> u64 {
    (last_committed + 1).saturating_sub(retain)
}

/// Batches whose commit lists what earlier commits removed by name
/// (records below the retention floor, work files), so what a crash or an
/// abandoned plan left goes too: one in [`SWEEP_EVERY`].
pub(crate) fn sweeps_at(batch: u64) -> bool {
    batch.is_multiple_of(SWEEP_EVERY)
}

/// See [`sweeps_at`].
pub(crate) const SWEEP_EVERY: u64 = 64;

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
        /// The version field every versioned record has.
        #[derive(serde::Deserialize)]
        struct Versioned {
            #[serde(default)]
            format_version: u32,
        }
        if let Ok(v) = serde_json::from_slice::<Versioned>(&obj.bytes)
            && v.format_version > FORMAT_VERSION
        {
            return Err(Error::Checkpoint {
                pipeline: self.pipeline.clone(),
                key: format!("{}/{key}", self.store.describe()),
                message: format!(
                    "format version {} is not one this build reads (it reads up to {}): it was \
                     written by a newer Sluice, or edited by hand; use that Sluice, or restore \
                     the file from a backup",
                    v.format_version, FORMAT_VERSION
                ),
            });
        }
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

    /// Read `control.json` and its etag. A record no run could have
    /// written (an epoch that cannot grow, a history's first batch after
    /// its last committed one) is refused, naming it.
    pub async fn control(&self) -> Result<Option<(Control, String)>> {
        let read: Option<(Control, String)> = self.read(paths::checkpoint::CONTROL).await?;
        if let Some((c, _)) = &read {
            let wrong = if c.epoch == u64::MAX {
                Some(format!("epoch {} cannot grow", c.epoch))
            } else if !c.resetting && c.last_committed.is_some_and(|l| l < c.first_batch) {
                Some(format!(
                    "last_committed {:?} is before first_batch {}",
                    c.last_committed, c.first_batch
                ))
            } else {
                None
            };
            if let Some(wrong) = wrong {
                return Err(Error::Checkpoint {
                    pipeline: self.pipeline.clone(),
                    key: format!("{}/{}", self.store.describe(), paths::checkpoint::CONTROL),
                    message: format!(
                        "{wrong}: the record was edited by hand. Restore it from a backup, or \
                         start over with `sluice reset` on the pipeline file"
                    ),
                });
            }
        }
        Ok(read)
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
        Ok(self.pipeline_record_tagged().await?.map(|(r, _)| r))
    }

    /// Read `pipeline.json` with its etag.
    pub async fn pipeline_record_tagged(&self) -> Result<Option<(PipelineRecord, String)>> {
        self.read(paths::checkpoint::PIPELINE).await
    }

    /// Compare-and-swap `pipeline.json` (create it when `etag` is `None`):
    /// `false` when it changed since it was read.
    pub async fn swap_pipeline_record(
        &self,
        record: &PipelineRecord,
        etag: Option<&str>,
    ) -> Result<bool> {
        let mode = match etag {
            Some(e) => PutMode::Update(e.to_string()),
            None => PutMode::Create,
        };
        Ok(matches!(
            self.write(paths::checkpoint::PIPELINE, record, mode)
                .await?,
            PutOutcome::Written(_)
        ))
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
    /// the pipeline. A plan found there of another history and an older
    /// epoch (a run a reset retired wrote it late) is removed first.
    pub(crate) async fn create_offsets(&self, offsets: &Offsets) -> Result<()> {
        let key = paths::checkpoint::offsets(offsets.batch);
        for _ in 0..4 {
            let outcome = self.write(&key, offsets, PutMode::Create).await?;
            if outcome != PutOutcome::Conflict {
                return Ok(());
            }
            match self.read::<Offsets>(&key).await? {
                Some((there, etag))
                    if retired(&there.history, there.epoch, &offsets.history, offsets.epoch) =>
                {
                    tracing::info!(pipeline = %self.pipeline, key, history = %there.history, "removing a plan a retired history wrote late");
                    self.store.delete_if(&key, &etag).await?;
                }
                Some(_) => return self.must_create(&key, PutOutcome::Conflict, "batch plan"),
                None => {}
            }
        }
        self.must_create(&key, PutOutcome::Conflict, "batch plan")
    }

    /// The plan of batch `n` if it is of `history`, as the run holding
    /// lease `epoch` sees it. One of another history written by an older
    /// epoch (late, by a run a reset retired) is removed: `None`. One of a
    /// newer epoch means this run is the retired one: it stops.
    pub(crate) async fn offsets_of(
        &self,
        n: u64,
        history: &str,
        epoch: u64,
    ) -> Result<Option<Offsets>> {
        let key = paths::checkpoint::offsets(n);
        match self.read::<Offsets>(&key).await? {
            Some((off, etag)) if foreign(&off.history, history) => {
                self.drop_retired(&key, &etag, &off.history, off.epoch, epoch)
                    .await?;
                Ok(None)
            }
            found => Ok(found.map(|(off, _)| off)),
        }
    }

    /// Remove record `key` of history `found` written under `found_epoch`,
    /// read with `etag`, by the run holding `epoch` of another history: if
    /// it is older, it is a retired run's late write; if newer, the caller
    /// is the retired run and stops.
    async fn drop_retired(
        &self,
        key: &str,
        etag: &str,
        found: &str,
        found_epoch: u64,
        epoch: u64,
    ) -> Result<()> {
        if found_epoch < epoch {
            tracing::info!(pipeline = %self.pipeline, key, history = %found, "removing a record a retired history wrote late");
            self.store.delete_if(key, etag).await?;
            return Ok(());
        }
        Err(Error::Conflict {
            pipeline: self.pipeline.clone(),
            message: format!(
                "{key} is of history {found} (epoch {found_epoch}): this run (epoch {epoch}) was \
                 retired by a reset; it stops"
            ),
        })
    }

    /// Read the commit record of batch `n`.
    pub async fn commit(&self, n: u64) -> Result<Option<Commit>> {
        Ok(self
            .read(&paths::checkpoint::commit(n))
            .await?
            .map(|(r, _)| r))
    }

    /// The commit record of batch `n` if it is of `history`, as the run
    /// holding lease `epoch` sees it (see [`Checkpoint::offsets_of`]).
    pub(crate) async fn commit_of(
        &self,
        n: u64,
        history: &str,
        epoch: u64,
    ) -> Result<Option<Commit>> {
        let key = paths::checkpoint::commit(n);
        match self.read::<Commit>(&key).await? {
            Some((c, etag)) if foreign(&c.history, history) => {
                self.drop_retired(&key, &etag, &c.history, c.epoch, epoch)
                    .await?;
                Ok(None)
            }
            found => Ok(found.map(|(c, _)| c)),
        }
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

    /// Read the processed-input index of the history whose first batch is
    /// `first` (empty if none was written yet), with its etag.
    pub async fn index(&self, first: u64) -> Result<(Index, Option<String>)> {
        Ok(match self.read(&paths::checkpoint::index(first)).await? {
            Some((index, etag)) => (index, Some(etag)),
            None => (Index::default(), None),
        })
    }

    /// The index of the history `control` names (list, ordered and
    /// manifests discovery). Missing while `control` records a committed
    /// batch of that history, it is a broken checkpoint, not an empty
    /// index: reading it as empty would read every processed file again.
    ///
    /// A bounded index lives in `control` itself ([`Control::index`]; no
    /// etag then).
    pub async fn index_of(&self, control: Option<&Control>) -> Result<(Index, Option<String>)> {
        if let Some(c) = control
            && let Some(index) = &c.index
        {
            // Written in the same write as `last_committed`: behind it,
            // one of them was edited by hand.
            if let Some(last) = c.last_committed
                && index.through_batch.is_none_or(|t| t < last)
            {
                return Err(Error::Checkpoint {
                    pipeline: self.pipeline.clone(),
                    key: format!("{}/{}", self.store.describe(), paths::checkpoint::CONTROL),
                    message: format!(
                        "it says batches up to {last} are committed, yet its index of \
                         processed inputs goes only up to {:?}: a record was edited by hand. \
                         Restore it from a backup, or start over with `sluice reset` on the \
                         pipeline file",
                        index.through_batch
                    ),
                });
            }
            return Ok((index.clone(), None));
        }
        let first = control.map_or(0, |c| c.first_batch);
        let read = self.index(first).await?;
        let Some(last) = control.and_then(|c| c.last_committed) else {
            return Ok(read);
        };
        let wrong = match (&read.1, read.0.through_batch) {
            (None, _) => Some(format!(
                "{} is missing, yet batches up to {last} are committed: read as empty it would \
                 have every processed file read again",
                paths::checkpoint::index(first)
            )),
            // The index is written before control: it may be one batch
            // ahead, never behind.
            (Some(_), t) if t.is_none_or(|t| t < last) => Some(format!(
                "control.json says batches up to {last} are committed, {} only up to {t:?}",
                paths::checkpoint::index(first)
            )),
            _ => None,
        };
        // A run that was stopped while a newer run or `sluice reset` moved
        // the checkpoint on reads a view that no longer holds: it lost its
        // lease, nothing is broken.
        if wrong.is_some()
            && let Some(c) = control
            && let Some((now, _)) = self.control().await?
            && (now.epoch != c.epoch || now.first_batch != c.first_batch || now.resetting)
        {
            return Err(Error::Conflict {
                pipeline: self.pipeline.clone(),
                message: format!(
                    "this run (epoch {}) read the checkpoint of batches from {}, which has moved \
                     on since (epoch {}, batches from {}{}); it stops without writing",
                    c.epoch,
                    c.first_batch,
                    now.epoch,
                    now.first_batch,
                    if now.resetting {
                        ", a `sluice reset` under way"
                    } else {
                        ""
                    }
                ),
            });
        }
        match wrong {
            None => Ok(read),
            Some(wrong) => Err(Error::Checkpoint {
                pipeline: self.pipeline.clone(),
                key: format!("{}/{}", self.store.describe(), paths::checkpoint::CONTROL),
                message: format!(
                    "{wrong}: a record was edited or deleted by hand. Restore it from a backup, \
                     or start over with `sluice reset` on the pipeline file"
                ),
            }),
        }
    }

    /// Compare-and-swap the index of the history starting at `first`:
    /// `etag` is the one read (`None`: none was there). `false` when
    /// another writer changed it since: this run lost its lease, and a
    /// late write of its could otherwise undo a newer run's.
    pub async fn swap_index(&self, first: u64, index: &Index, etag: Option<&str>) -> Result<bool> {
        let mode = match etag {
            Some(e) => PutMode::Update(e.to_string()),
            None => PutMode::Create,
        };
        let key = paths::checkpoint::index(first);
        Ok(matches!(
            self.write(&key, index, mode).await?,
            PutOutcome::Written(_)
        ))
    }

    /// Read the plan of batch `n` with its etag.
    pub(crate) async fn offsets_tagged(&self, n: u64) -> Result<Option<(Offsets, String)>> {
        self.read(&paths::checkpoint::offsets(n)).await
    }

    /// Delete the plan of an uncommitted batch (after its input was
    /// refused) while it is the one read with `etag`.
    pub(crate) async fn delete_offsets_if(&self, n: u64, etag: &str) -> Result<bool> {
        Ok(self
            .store
            .delete_if(&paths::checkpoint::offsets(n), etag)
            .await?)
    }

    /// The offsets and commits of batches below `floor`, oldest first, all
    /// offsets before any commit: what pruning to `floor` deletes, in that
    /// order. Nothing reads pruned records. Each commit prunes the batch
    /// that fell below the floor by name; with `sweep`, the records are
    /// listed, so what a crash or a lowered `retain_batches` left goes too.
    pub(crate) async fn prunable(&self, floor: u64, sweep: bool) -> Result<Vec<String>> {
        if !sweep {
            let last = floor.saturating_sub(1);
            return Ok(vec![
                paths::checkpoint::offsets(last),
                paths::checkpoint::commit(last),
            ]);
        }
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
