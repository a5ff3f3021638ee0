//! A run's working records: what each task and merge of a batch leaves for
//! the commit, and the task list a Distributed Map reads. Each carries the
//! writing run's epoch in its key, is read by that run's commit and is
//! removed after it; the record types are the operators' and handlers'
//! own, so they are read and written here as any serde type.

use serde::{Serialize, de::DeserializeOwned};

use super::Checkpoint;
use crate::error::Result;
use crate::paths;
use crate::storage::PutMode;
use crate::storage::fanout::delete_all;

/// One task of one batch, run under one run's lease: what names
/// everything the task writes (its result, its staged parts, its set-aside
/// and late rows, its partial states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskId {
    /// The lease epoch of the run it runs under.
    pub epoch: u64,
    /// The batch.
    pub batch: u64,
    /// The task, within the batch.
    pub task: u32,
}

impl Checkpoint {
    /// The result task `id` recorded (`None`: it did not finish under its
    /// run).
    pub async fn task_result<T: DeserializeOwned>(&self, id: TaskId) -> Result<Option<T>> {
        let key = paths::checkpoint::work(id.batch, id.task, id.epoch);
        Ok(self.read(&key).await?.map(|(r, _)| r))
    }

    /// Record task `id`'s result (overwriting an earlier attempt's).
    pub async fn put_task_result<T: Serialize>(&self, id: TaskId, result: &T) -> Result<()> {
        let key = paths::checkpoint::work(id.batch, id.task, id.epoch);
        self.write(&key, result, PutMode::Overwrite).await?;
        Ok(())
    }

    /// Write the partial states task `id` made for state partition
    /// `partition` (overwriting an earlier attempt's); their key.
    pub(crate) async fn put_partial(
        &self,
        id: TaskId,
        partition: u32,
        bytes: Vec<u8>,
    ) -> Result<String> {
        let key = paths::checkpoint::partial(id.batch, partition, id.task, id.epoch);
        self.store()
            .put(&key, bytes.into(), PutMode::Overwrite)
            .await?;
        Ok(key)
    }

    /// Record why task `id` refused its input (overwriting an earlier
    /// attempt's), where the commit of a Distributed Map's failure finds
    /// it.
    pub(crate) async fn put_refusal<T: Serialize>(&self, id: TaskId, refusal: &T) -> Result<()> {
        let key = paths::checkpoint::refusal(id.batch, id.task, id.epoch);
        self.write(&key, refusal, PutMode::Overwrite).await?;
        Ok(())
    }

    /// A refusal a task of batch `batch` recorded under `epoch`, if any.
    pub(crate) async fn refusal<T: DeserializeOwned>(
        &self,
        batch: u64,
        epoch: u64,
    ) -> Result<Option<T>> {
        let listed = self
            .store()
            .list(&paths::checkpoint::refusal_prefix(batch), None)
            .await?;
        for m in listed {
            if paths::epoch_of(&m.key) == Some(epoch)
                && let Some((r, _)) = self.read(&m.key).await?
            {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// Remove batch `batch`'s working records of the run under `epoch` and
    /// of older runs (a newer run's are its own to remove).
    pub(crate) async fn remove_work(&self, batch: u64, epoch: u64) -> Result<()> {
        let done: Vec<String> = self
            .store()
            .list(&paths::checkpoint::work_prefix(batch), None)
            .await?
            .into_iter()
            .map(|m| m.key)
            .filter(|k| paths::epoch_of(k).is_none_or(|e| e <= epoch))
            .collect();
        delete_all(self.store(), done).await
    }

    /// Remove the work files of every batch up to `through` (all
    /// committed) of the run under `epoch` and older ones: what runs that
    /// died or whose plan was dropped left. One listing of `work/`.
    pub(crate) async fn sweep_work(&self, through: u64, epoch: u64) -> Result<()> {
        let done: Vec<String> = self
            .store()
            .list(paths::checkpoint::WORK_PREFIX, None)
            .await?
            .into_iter()
            .map(|m| m.key)
            .filter(|k| paths::checkpoint::work_batch(k).is_some_and(|b| b <= through))
            .filter(|k| paths::epoch_of(k).is_none_or(|e| e <= epoch))
            .collect();
        delete_all(self.store(), done).await
    }

    /// Remove `keys`, one at a time and in order (a crash leaves a suffix).
    pub(crate) async fn remove_in_order(&self, keys: Vec<String>) -> Result<()> {
        for key in keys {
            self.store().delete(&key).await?;
        }
        Ok(())
    }

    /// Remove the temporary files of writes killed part way (a local
    /// folder's; object stores leave none).
    pub(crate) async fn sweep_temp(&self) -> Result<()> {
        self.store().sweep_temp("").await?;
        Ok(())
    }

    /// Remove `keys`, in parallel.
    pub(crate) async fn remove_all(&self, keys: Vec<String>) -> Result<()> {
        delete_all(self.store(), keys).await
    }

    /// The result `step` of state partition `partition` of batch `batch`
    /// recorded under `epoch` (`None`: it did not finish under that run).
    pub async fn step_result<T: DeserializeOwned>(
        &self,
        step: PartitionStep,
        batch: u64,
        partition: u32,
        epoch: u64,
    ) -> Result<Option<T>> {
        let key = step.key(batch, partition, epoch);
        Ok(self.read(&key).await?.map(|(r, _)| r))
    }

    /// Record the result of `step` (overwriting an earlier attempt's).
    pub async fn put_step_result<T: Serialize>(
        &self,
        step: PartitionStep,
        batch: u64,
        partition: u32,
        epoch: u64,
        result: &T,
    ) -> Result<()> {
        let key = step.key(batch, partition, epoch);
        self.write(&key, result, PutMode::Overwrite).await?;
        Ok(())
    }

    /// Write the task list of batch `batch` under `epoch` for the
    /// Distributed Map to read (the same list on every resume); its key.
    pub async fn put_task_list(&self, batch: u64, epoch: u64, tasks: &[u32]) -> Result<String> {
        let key = paths::checkpoint::task_list(batch, epoch);
        self.write(&key, &tasks, PutMode::Overwrite).await?;
        Ok(key)
    }
}

/// A step that runs once per state partition of a batch, after its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionStep {
    /// A stateful query's merge.
    Merge,
    /// A `[deduplicate]` pipeline's Dedup step.
    Dedup,
}

impl PartitionStep {
    /// Where its result for partition `p` of batch `n` under `epoch` is.
    fn key(self, n: u64, p: u32, epoch: u64) -> String {
        match self {
            PartitionStep::Merge => paths::checkpoint::merge(n, p, epoch),
            PartitionStep::Dedup => paths::checkpoint::dedup(n, p, epoch),
        }
    }
}
