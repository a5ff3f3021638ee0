//! The checkpoint: records, the pure decisions of the lease and commit
//! protocols, and a thin layer that reads and writes them through a
//! [`Store`].
//!
//! Layout under `<checkpoint>/<pipeline>/` (keys from [`crate::paths`]):
//! `pipeline.json` (spec, pinned schema), `control.json` (lease, last
//! committed batch, listing fingerprint; compare-and-swap only),
//! `offsets/N.json` (plan, create-only, before any output), `commits/N.json`
//! (create-only, last), `index/processed.json` (processed inputs).

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::error::{Error, Result};
use crate::paths;
use crate::pipeline::{ColumnSpec, DiscoveryMode, Pipeline};
use crate::storage::{PutMode, PutOutcome, RequestCounts, Store};

/// Version of the checkpoint format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// `pipeline.json`: the registered spec and the pinned source schema.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PipelineRecord {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Hash of the registered spec.
    pub spec_hash: String,
    /// The registered spec.
    pub pipeline: Pipeline,
    /// The source schema every batch is read with.
    pub schema: Vec<ColumnSpec>,
}

/// Whether a run holds the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// No run holds the lease; no batch is planned and uncommitted.
    Idle,
    /// A run holds the lease (or died holding it).
    Running,
}

/// What the last discovery listing of processed inputs looked like: a
/// listing from `start_after` whose input keys hash to `fingerprint` holds
/// nothing new.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ListingState {
    /// Where the listing starts (ordered mode's evicted cursor).
    pub start_after: Option<String>,
    /// How many input keys the listing holds.
    pub count: u64,
    /// Order-sensitive hash of the listed input keys.
    pub fingerprint: String,
}

impl ListingState {
    /// The state of a listing of `keys` (ascending) starting after `start_after`.
    pub fn of<'a>(
        start_after: Option<String>,
        keys: impl Iterator<Item = &'a str>,
    ) -> ListingState {
        let mut h = crate::discovery::Fnv::new();
        let mut count = 0;
        for k in keys {
            h.write(k.as_bytes());
            h.write(b"\n");
            count += 1;
        }
        ListingState {
            start_after,
            count,
            fingerprint: format!("{:016x}", h.finish()),
        }
    }
}

/// Running totals over all committed batches, for `sluice show` in O(1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Totals {
    /// Batches committed.
    pub batches: u64,
    /// Input files processed.
    pub files: u64,
    /// Input bytes processed.
    pub bytes: u64,
    /// Rows read.
    pub rows_in: u64,
    /// Rows written.
    pub rows_out: u64,
}

/// `control.json`: the run lease and the pointer to the last commit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Control {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Lease status.
    pub status: RunStatus,
    /// Incremented by every claim; a run acts only while it holds its epoch.
    pub epoch: u64,
    /// Who holds (or last held) the lease.
    pub owner: Option<String>,
    /// Last sign of life of the owner (ms since the Unix epoch).
    pub heartbeat_ms: Option<i64>,
    /// A trigger asked for another discovery while a run held the lease
    /// (or while the pipeline was paused).
    pub requested: bool,
    /// Paused (`sluice pause`): triggers record requests but start nothing.
    #[serde(default)]
    pub paused: bool,
    /// Last committed batch.
    pub last_committed: Option<u64>,
    /// When it was committed (ms since the Unix epoch).
    pub last_commit_ms: Option<i64>,
    /// Hash of the spec registered in `pipeline.json`.
    pub spec_hash: String,
    /// The listing of processed inputs, for an idle check without the index.
    pub listing: ListingState,
    /// Totals over committed batches.
    pub totals: Totals,
    /// Batches may be planned and not committed (a run handed over at its
    /// batch budget, was cancelled, or died): the next run looks for them
    /// before discovering. Cleared when a run ends with nothing planned.
    #[serde(default)]
    pub resume: bool,
    /// Notify mode: the epoch of the run that last listed the source to
    /// find files whose notification was lost.
    #[serde(default)]
    pub reconciled_epoch: Option<u64>,
}

impl Control {
    /// The record of a pipeline that has never run.
    pub fn new(spec_hash: String) -> Control {
        Control {
            format_version: FORMAT_VERSION,
            status: RunStatus::Idle,
            epoch: 0,
            owner: None,
            heartbeat_ms: None,
            requested: false,
            paused: false,
            last_committed: None,
            last_commit_ms: None,
            spec_hash,
            listing: ListingState::of(None, std::iter::empty()),
            totals: Totals::default(),
            resume: false,
            reconciled_epoch: None,
        }
    }

    /// The batch after the last committed one.
    pub fn next_batch(&self) -> u64 {
        self.last_committed.map_or(0, |n| n + 1)
    }
}

/// What a run may do with the lease, given the control record it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Take the lease with this epoch; `recover` when the previous holder
    /// died and may have left a batch planned or committed but not recorded.
    Take {
        /// The new epoch.
        epoch: u64,
        /// The previous holder died holding the lease.
        recover: bool,
    },
    /// Another run holds a live lease.
    Busy {
        /// Its owner.
        owner: String,
        /// Milliseconds since its last heartbeat.
        heartbeat_age_ms: i64,
    },
}

/// Decide whether a run may take the lease. `owner_gone` is the caller's
/// knowledge that the holder has exited (a local process that no longer
/// exists); otherwise only an expired heartbeat frees a running lease.
pub fn decide_claim(
    control: Option<&Control>,
    now_ms: i64,
    ttl_ms: i64,
    owner_gone: bool,
) -> Claim {
    let Some(c) = control else {
        return Claim::Take {
            epoch: 1,
            recover: false,
        };
    };
    match c.status {
        RunStatus::Idle => Claim::Take {
            epoch: c.epoch + 1,
            recover: false,
        },
        RunStatus::Running => {
            let age = now_ms - c.heartbeat_ms.unwrap_or(i64::MIN / 2);
            if owner_gone || age > ttl_ms {
                Claim::Take {
                    epoch: c.epoch + 1,
                    recover: true,
                }
            } else {
                Claim::Busy {
                    owner: c.owner.clone().unwrap_or_default(),
                    heartbeat_age_ms: age,
                }
            }
        }
    }
}

/// The control record after `owner` claims the lease with `epoch` (a run's
/// own claim, or a trigger's on behalf of the execution it starts): running,
/// fresh heartbeat, and `requested` cleared, since the claimant's discovery
/// comes after it.
pub fn claimed(
    before: Option<&Control>,
    epoch: u64,
    owner: &str,
    now_ms: i64,
    spec_hash: &str,
) -> Control {
    let mut next = before
        .cloned()
        .unwrap_or_else(|| Control::new(spec_hash.to_string()));
    // A holder that died may have left batches planned or committed and
    // not recorded: whoever runs under the new epoch looks for them.
    next.resume |= next.status == RunStatus::Running;
    next.status = RunStatus::Running;
    next.epoch = epoch;
    next.owner = Some(owner.to_string());
    next.heartbeat_ms = Some(now_ms);
    next.requested = false;
    next
}

/// What a run with nothing left to do swaps into control: the lease given
/// back (`Idle`), or, when a trigger set `requested` since the run's last
/// discovery, only the flag cleared; then the run discovers once more
/// (`true`). So every file that existed when a trigger returned is seen by
/// a discovery that started after it.
pub fn end_of_run(control: &Control, now_ms: i64, spec_hash: &str) -> (Control, bool) {
    let mut next = control.clone();
    // A run ends only with nothing planned left.
    next.resume = false;
    if control.requested {
        next.requested = false;
        (next, true)
    } else {
        next.status = RunStatus::Idle;
        next.heartbeat_ms = Some(now_ms);
        next.spec_hash = spec_hash.to_string();
        (next, false)
    }
}

/// The control record after a trigger asks the running lease holder to look
/// again.
pub fn requested(control: &Control) -> Control {
    let mut next = control.clone();
    next.requested = true;
    next
}

/// Whether the holder of `epoch` still owns the lease described by `control`.
pub fn owns(control: &Control, epoch: u64) -> bool {
    control.status == RunStatus::Running && control.epoch == epoch
}

/// `offsets/N.json`: the plan of one batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offsets {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Batch number.
    pub batch: u64,
    /// Epoch of the run that planned it.
    pub epoch: u64,
    /// When it was planned (ms since the Unix epoch).
    pub planned_ms: i64,
    /// Exactly the inputs of this batch, in processing order.
    pub inputs: Vec<InputFile>,
    /// How the inputs split into operator tasks.
    pub tasks: Vec<TaskPlan>,
    /// Notify mode: the inbox entries this batch consumes (its inputs', and
    /// duplicates of keys already committed); deleted once it commits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumed: Vec<String>,
    /// Time the planner spent up to this plan, ms.
    #[serde(default)]
    pub plan_ms: u64,
    /// Requests the planner made up to this plan.
    #[serde(default)]
    pub plan_requests: RequestCounts,
}

impl Offsets {
    /// Bytes of all inputs.
    pub fn bytes(&self) -> u64 {
        self.inputs.iter().map(|i| i.size).sum()
    }
}

/// One input file of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// Key relative to the source root.
    pub key: String,
    /// Size when planned.
    pub size: u64,
    /// Entity tag when planned, if the listing gave one.
    pub etag: Option<String>,
}

/// The inputs of one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPlan {
    /// Task number within the batch.
    pub task: u32,
    /// Indices into [`Offsets::inputs`].
    pub inputs: Vec<u32>,
    /// Bytes of those inputs.
    pub bytes: u64,
}

/// One committed output file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Key relative to the sink root.
    pub key: String,
    /// Rows in the file.
    pub rows: u64,
    /// Size of the file.
    pub bytes: u64,
}

/// Time spent in each step of a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Durations {
    /// Planning (discovery, offsets), ms.
    pub plan_ms: u64,
    /// From the plan to the start of the commit (tasks, fan-out), ms.
    pub operate_ms: u64,
    /// The longest task, ms.
    pub task_max_ms: u64,
    /// Commit, ms.
    pub commit_ms: u64,
}

/// `commits/N.json`: the record that makes batch N committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Batch number.
    pub batch: u64,
    /// Epoch of the committing run.
    pub epoch: u64,
    /// When it was committed (ms since the Unix epoch).
    pub committed_ms: i64,
    /// Input files.
    pub files: u64,
    /// Input bytes.
    pub bytes_read: u64,
    /// Rows read.
    pub rows_in: u64,
    /// Rows written.
    pub rows_out: u64,
    /// Output files.
    pub outputs: Vec<OutputFile>,
    /// Step durations.
    pub durations: Durations,
    /// Storage requests made for this batch, all stores together.
    pub requests: RequestCounts,
    /// The input keys, so the index can be rebuilt from commits alone.
    pub input_keys: Vec<String>,
    /// What started the run that committed this batch (`s3`, `sns`,
    /// `schedule`, `manual: sluice refresh`, `sluice run`, ...).
    #[serde(default)]
    pub trigger: Option<String>,
    /// Notify mode: the inbox entries to delete once committed (from the plan).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumed: Vec<String>,
}

/// `<sink>/_sluice/manifest/N.json`: what a reader needs to see exactly the
/// committed output of batch N.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Checkpoint format version.
    pub format_version: u32,
    /// Pipeline name.
    pub pipeline: String,
    /// Batch number.
    pub batch: u64,
    /// Output files of the batch, relative to the sink root.
    pub files: Vec<OutputFile>,
    /// Rows in those files.
    pub rows: u64,
}

/// `index/processed.json`: processed input keys. In `list` mode all of them;
/// in `ordered` mode the most recent `lookback`, with the largest key evicted
/// from the window as the cursor later listings start after.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    pub fn apply(
        &self,
        batch: u64,
        new_keys: &[String],
        mode: DiscoveryMode,
        lookback: u64,
    ) -> Index {
        if self.through_batch.is_some_and(|t| t >= batch) {
            return self.clone();
        }
        let mut keys = self.keys.clone();
        keys.extend(new_keys.iter().cloned());
        keys.sort();
        keys.dedup();
        let mut start_after = self.start_after.clone();
        if mode == DiscoveryMode::Ordered && keys.len() as u64 > lookback {
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

/// Which batches' offsets and commits may be deleted once `last_committed`
/// is committed, keeping `retain` batches: all below the returned number.
pub fn retention_floor(last_committed: u64, retain: u64) -> u64 {
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
                "unreadable ({e}); restore it from a backup or reset the pipeline by deleting \
                 its checkpoint folder"
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
    pub async fn create_offsets(&self, offsets: &Offsets) -> Result<()> {
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
    pub async fn create_commit(&self, commit: &Commit) -> Result<bool> {
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
    pub async fn delete_offsets(&self, n: u64) -> Result<()> {
        Ok(self.store.delete(&paths::checkpoint::offsets(n)).await?)
    }

    /// Delete offsets and commits of batches below `floor`, listing from the
    /// oldest kept. Best effort is not enough for correctness here, so errors
    /// propagate; nothing reads pruned records.
    pub async fn prune_below(&self, floor: u64) -> Result<u64> {
        let mut deleted = 0;
        for prefix in [
            paths::checkpoint::OFFSETS_PREFIX,
            paths::checkpoint::COMMITS_PREFIX,
        ] {
            for meta in self.store.list(prefix, None).await? {
                match paths::checkpoint::batch_of(&meta.key) {
                    Some(n) if n < floor => {
                        self.store.delete(&meta.key).await?;
                        deleted += 1;
                    }
                    _ => break,
                }
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(status: RunStatus, epoch: u64, heartbeat_ms: i64) -> Control {
        Control {
            status,
            epoch,
            owner: Some("a".into()),
            heartbeat_ms: Some(heartbeat_ms),
            ..Control::new("h".into())
        }
    }

    #[test]
    fn claim_decisions() {
        assert_eq!(
            decide_claim(None, 0, 10, false),
            Claim::Take {
                epoch: 1,
                recover: false
            }
        );
        let idle = control(RunStatus::Idle, 4, 0);
        assert_eq!(
            decide_claim(Some(&idle), 1_000, 10, false),
            Claim::Take {
                epoch: 5,
                recover: false
            }
        );
        let live = control(RunStatus::Running, 4, 1_000);
        assert!(matches!(
            decide_claim(Some(&live), 1_005, 10, false),
            Claim::Busy {
                heartbeat_age_ms: 5,
                ..
            }
        ));
        assert_eq!(
            decide_claim(Some(&live), 1_011, 10, false),
            Claim::Take {
                epoch: 5,
                recover: true
            }
        );
        assert_eq!(
            decide_claim(Some(&live), 1_005, 10, true),
            Claim::Take {
                epoch: 5,
                recover: true
            }
        );
        assert!(owns(&live, 4));
        assert!(!owns(&live, 3));
        assert!(!owns(&idle, 4));
    }

    fn keys(ks: &[&str]) -> Vec<String> {
        ks.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn index_list_mode_keeps_everything_and_is_idempotent() {
        let i = Index::default().apply(0, &keys(&["b", "a"]), DiscoveryMode::List, 1);
        assert_eq!(i.keys, keys(&["a", "b"]));
        let j = i.apply(1, &keys(&["c"]), DiscoveryMode::List, 1);
        assert_eq!(j.keys, keys(&["a", "b", "c"]));
        assert_eq!(j.apply(1, &keys(&["z"]), DiscoveryMode::List, 1), j);
        assert_eq!(j.start_after, None);
    }

    #[test]
    fn index_ordered_mode_keeps_a_window() {
        let i = Index::default().apply(0, &keys(&["a", "b", "c"]), DiscoveryMode::Ordered, 2);
        assert_eq!(i.keys, keys(&["b", "c"]));
        assert_eq!(i.start_after.as_deref(), Some("a"));
        let j = i.apply(1, &keys(&["d", "e"]), DiscoveryMode::Ordered, 2);
        assert_eq!(j.keys, keys(&["d", "e"]));
        assert_eq!(j.start_after.as_deref(), Some("c"));
        let z = Index::default().apply(0, &keys(&["a"]), DiscoveryMode::Ordered, 0);
        assert!(z.keys.is_empty());
        assert_eq!(z.start_after.as_deref(), Some("a"));
    }

    #[test]
    fn listing_state_changes_with_any_key() {
        let a = ListingState::of(None, ["x", "y"].into_iter());
        assert_eq!(a, ListingState::of(None, ["x", "y"].into_iter()));
        assert_ne!(a, ListingState::of(None, ["x", "z"].into_iter()));
        assert_ne!(a, ListingState::of(None, ["x"].into_iter()));
        assert_ne!(
            a,
            ListingState::of(Some("a".into()), ["x", "y"].into_iter())
        );
    }

    #[test]
    fn retention() {
        assert_eq!(retention_floor(0, 10), 0);
        assert_eq!(retention_floor(9, 10), 0);
        assert_eq!(retention_floor(10, 10), 1);
    }
}
