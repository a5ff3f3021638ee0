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

impl Checkpoint {
    /// The result task `task` of batch `batch` recorded under `epoch`
    /// (`None`: it did not finish under that run).
    pub async fn task_result<T: DeserializeOwned>(
        &self,
        batch: u64,
        task: u32,
        epoch: u64,
    ) -> Result<Option<T>> {
        let key = paths::checkpoint::work(batch, task, epoch);
        Ok(self.read(&key).await?.map(|(r, _)| r))
    }

    /// Record task `task`'s result (overwriting an earlier attempt's).
    pub async fn put_task_result<T: Serialize>(
        &self,
        batch: u64,
        task: u32,
        epoch: u64,
        result: &T,
    ) -> Result<()> {
        let key = paths::checkpoint::work(batch, task, epoch);
        self.write(&key, result, PutMode::Overwrite).await?;
        Ok(())
    }

    /// The result of the merge of state partition `partition` of batch
    /// `batch` under `epoch` (`None`: it did not finish under that run).
    pub async fn merge_result<T: DeserializeOwned>(
        &self,
        batch: u64,
        partition: u32,
        epoch: u64,
    ) -> Result<Option<T>> {
        let key = paths::checkpoint::merge(batch, partition, epoch);
        Ok(self.read(&key).await?.map(|(r, _)| r))
    }

    /// Record a merge's result (overwriting an earlier attempt's).
    pub async fn put_merge_result<T: Serialize>(
        &self,
        batch: u64,
        partition: u32,
        epoch: u64,
        result: &T,
    ) -> Result<()> {
        let key = paths::checkpoint::merge(batch, partition, epoch);
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
