//! Every object key Sluice writes, built in one place. Batch numbers are
//! zero-padded so lexicographic order is numeric order.

/// Whether `key` is a plain object key: no empty, `.` or `..` segment, no
/// leading `/`, no control characters.
pub fn is_plain_key(key: &str) -> bool {
    !key.is_empty()
        && !key.chars().any(char::is_control)
        && key
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
}

/// The lease epoch a key written under one carries: every work file,
/// state file, part, late-row and set-aside-row file, and staged object
/// ends `-e<epoch>.<ext>` (then `.staged` when staged). A run removes only
/// its own and older epochs' files of these, never a newer run's.
pub(crate) fn epoch_of(key: &str) -> Option<u64> {
    let name = key.rsplit('/').next()?;
    let name = name.strip_suffix(".staged").unwrap_or(name);
    let stem = name.rsplit_once('.')?.0;
    stem.rsplit_once("-e")?.1.parse().ok()
}

/// Keys inside one pipeline's checkpoint folder (`<checkpoint>/<pipeline>/`).
pub mod checkpoint {
    /// Spec, pinned schema and format version.
    pub const PIPELINE: &str = "pipeline.json";
    /// The run lease and the pointer to the last committed batch.
    pub(crate) const CONTROL: &str = "control.json";
    /// Prefix of all batch plans.
    pub(crate) const OFFSETS_PREFIX: &str = "offsets/";
    /// Prefix of all commit records.
    pub(crate) const COMMITS_PREFIX: &str = "commits/";
    /// Notify mode: where triggers record notified objects (shared by
    /// every history: a reset leaves it, and the next run reads what it
    /// names again).
    pub(crate) const INBOX_PREFIX: &str = "inbox/";
    /// Where the index and claims of every history live.
    pub(crate) const INDEX_PREFIX: &str = "index/";

    /// The folder of the index and claims of the history whose first batch
    /// is `first`: `index/` for a pipeline never reset (as before
    /// histories had first batches), `index/h<first>/` after a reset. A
    /// history reads and writes only its own, so what a retired run writes
    /// there late is never read, and a late `reset` of an earlier history
    /// deletes only older ones.
    fn history_prefix(first: u64) -> String {
        if first == 0 {
            INDEX_PREFIX.to_string()
        } else {
            format!("{INDEX_PREFIX}h{first:010}/")
        }
    }

    /// The processed-input index of the history starting at batch `first`.
    pub(crate) fn index(first: u64) -> String {
        format!("{}processed.json", history_prefix(first))
    }

    /// Notify mode: the prefix of the claims of the history starting at
    /// batch `first` (one claim per input key a run took).
    pub(crate) fn claims_prefix(first: u64) -> String {
        format!("{}keys/", history_prefix(first))
    }

    /// The first batch of the history an `index/` key belongs to.
    pub(crate) fn index_history(key: &str) -> Option<u64> {
        let rest = key.strip_prefix(INDEX_PREFIX)?;
        match rest.strip_prefix('h') {
            Some(h) => h.split('/').next()?.parse().ok(),
            None => Some(0),
        }
    }

    /// Longest encoded key kept in an entry or claim name: with the
    /// `.size` ending it stays inside a local file name's 255 bytes, and
    /// with the checkpoint prefix inside S3's 1,024-byte keys.
    const MAX_ENCODED: usize = 180;

    /// The name part for source key `key`: the key base64url-encoded (so
    /// any key is a safe object name) when that is short enough, else
    /// `~` and a 128-bit hash of it (the key is then in the object's body).
    fn key_name(key: &str) -> String {
        let encoded = encode_key(key);
        if encoded.len() <= MAX_ENCODED {
            return encoded;
        }
        let mut second = crate::hash::Fnv::new();
        second.write(b"sluice-long-key");
        second.write(key.as_bytes());
        format!(
            "~{:016x}{:016x}",
            crate::hash::fnv1a(key.as_bytes()),
            second.finish()
        )
    }

    /// Notify mode: the inbox entry of source key `key` of `size` bytes:
    /// the key's name part, then the size, so one listing of the inbox is
    /// all a plan reads (but for keys too long to name, whose entry holds
    /// the key: [`inbox_key_of`] gives `None` for them).
    pub(crate) fn inbox_entry(key: &str, size: u64) -> String {
        format!("{INBOX_PREFIX}{}.{size}", key_name(key))
    }

    /// The source key (when the name holds it) and size an inbox entry
    /// names.
    pub(crate) fn inbox_key_of(entry: &str) -> Option<(Option<String>, u64)> {
        let name = entry.strip_prefix(INBOX_PREFIX)?;
        let (key, size) = name.rsplit_once('.')?;
        let size = size.parse().ok()?;
        match key.strip_prefix('~') {
            Some(hash) if hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Some((None, size))
            }
            Some(_) => None,
            None => Some((Some(decode_key(key)?), size)),
        }
    }

    /// Notify mode: the claim of source key `key` in the history starting
    /// at batch `first`.
    pub fn claim(first: u64, key: &str) -> String {
        format!("{}{}", claims_prefix(first), key_name(key))
    }

    fn encode_key(key: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
    }

    fn decode_key(encoded: &str) -> Option<String> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded)
            .ok()?;
        String::from_utf8(bytes).ok()
    }

    /// Where every batch's work files live.
    pub(crate) const WORK_PREFIX: &str = "work/";

    /// Prefix of the task results of batch `n`.
    pub(crate) fn work_prefix(n: u64) -> String {
        format!("{WORK_PREFIX}{n:010}/")
    }

    /// The batch of a work file (`work/N/...`).
    pub(crate) fn work_batch(key: &str) -> Option<u64> {
        key.strip_prefix(WORK_PREFIX)?
            .split('/')
            .next()?
            .parse()
            .ok()
    }

    /// The result of task `task` of batch `n` run under lease `epoch`,
    /// read by the committer (payloads between steps carry no data).
    pub(crate) fn work(n: u64, task: u32, epoch: u64) -> String {
        format!("{}task-{task:05}-e{epoch}.json", work_prefix(n))
    }

    /// The partial aggregate states task `task` of batch `n` wrote for
    /// state partition `p` under lease `epoch` (Arrow IPC).
    pub(crate) fn partial(n: u64, p: u32, task: u32, epoch: u64) -> String {
        format!(
            "{}partials/p={p:04}/task-{task:05}-e{epoch}.arrow",
            work_prefix(n)
        )
    }

    /// The result of the merge of state partition `p` of batch `n` under
    /// lease `epoch`, read by the committer.
    pub(crate) fn merge(n: u64, p: u32, epoch: u64) -> String {
        format!("{}merge-{p:04}-e{epoch}.json", work_prefix(n))
    }

    /// The partial states the Dedup step of partition `q` of batch `n`
    /// wrote for state partition `p` under lease `epoch`.
    pub(crate) fn dedup_partial(n: u64, p: u32, q: u32, epoch: u64) -> String {
        format!(
            "{}partials/p={p:04}/dedup-{q:04}-e{epoch}.arrow",
            work_prefix(n)
        )
    }

    /// The result of the Dedup step of partition `p` of batch `n`.
    pub(crate) fn dedup(n: u64, p: u32, epoch: u64) -> String {
        format!("{}dedup-{p:04}-e{epoch}.json", work_prefix(n))
    }

    /// The keys seen (`[deduplicate]`) of partition `p` after batch `n`,
    /// written by its Dedup step under lease `epoch` (Arrow IPC).
    pub(crate) fn dedup_state(p: u32, n: u64, epoch: u64) -> String {
        format!("{STATE_PREFIX}dedup/p={p:04}/v={n:010}-e{epoch}.arrow")
    }

    /// Where every state file lives.
    pub(crate) const STATE_PREFIX: &str = "state/";

    /// The state of partition `p` after batch `n`, written by its merge
    /// under lease `epoch` (Arrow IPC); the commit record names the one in
    /// force.
    pub(crate) fn state(p: u32, n: u64, epoch: u64) -> String {
        format!("{STATE_PREFIX}p={p:04}/v={n:010}-e{epoch}.arrow")
    }

    /// The batch a state file (`state/p=P/v=N-eE.arrow`) was written after.
    pub(crate) fn state_batch(key: &str) -> Option<u64> {
        let name = key.rsplit('/').next()?;
        name.strip_prefix("v=")?.split('-').next()?.parse().ok()
    }

    /// The task list of batch `n` written under lease `epoch`, read by
    /// the state machine's Distributed Map (a JSON array of task numbers).
    pub fn task_list(n: u64, epoch: u64) -> String {
        format!("{}tasks-e{epoch}.json", work_prefix(n))
    }

    /// The refusal a task of batch `n` under lease `epoch` left when its
    /// input was refused: the Distributed Map reports only that a child
    /// failed, so the settle step reads why here.
    pub fn refusal(n: u64, task: u32, epoch: u64) -> String {
        format!("{}{task:05}-e{epoch}.json", refusal_prefix(n))
    }

    /// Every refusal of batch `n`, of any task and run.
    pub(crate) fn refusal_prefix(n: u64) -> String {
        format!("{}refused-", work_prefix(n))
    }

    /// The plan of batch `n`, written create-only before any output.
    pub fn offsets(n: u64) -> String {
        format!("{OFFSETS_PREFIX}{n:010}.json")
    }

    /// The commit record of batch `n`, written create-only, last.
    pub fn commit(n: u64) -> String {
        format!("{COMMITS_PREFIX}{n:010}.json")
    }

    /// The batch number of an `offsets/` or `commits/` key.
    pub(crate) fn batch_of(key: &str) -> Option<u64> {
        key.rsplit('/').next()?.strip_suffix(".json")?.parse().ok()
    }
}

/// Keys inside the sink folder.
pub mod sink {
    /// Prefix of the output files of batch `n`.
    pub(crate) fn batch_prefix(n: u64) -> String {
        format!("batch={n:010}/")
    }

    /// Prefix of the output files of task `task` of batch `n`.
    pub(crate) fn task_prefix(n: u64, task: u32) -> String {
        format!("{}part-{task:05}-", batch_prefix(n))
    }

    /// Every staged part of task `task` of batch `n`, of any run.
    pub(crate) fn staged_task_prefix(n: u64, task: u32) -> String {
        format!("{STAGING_PREFIX}{}", task_prefix(n, task))
    }

    /// Output file `part` of task `task` of batch `n`, written by the run
    /// holding lease `epoch`: a retried task of the same run overwrites its
    /// own files, and a run that lost its lease can never overwrite the
    /// files another run committed.
    pub fn part(n: u64, task: u32, part: u32, epoch: u64) -> String {
        format!("{}{part:05}{}", task_prefix(n, task), epoch_suffix(epoch))
    }

    /// [`part`] of a partitioned sink: under the batch's folder, in the
    /// Hive-style folders `dir` of its partition values
    /// (`col=value/...`, ending in `/`).
    pub fn partitioned_part(n: u64, task: u32, part: u32, epoch: u64, dir: &str) -> String {
        format!(
            "{}{dir}part-{task:05}-{part:05}{}",
            batch_prefix(n),
            epoch_suffix(epoch)
        )
    }

    /// Whether published key `key` is a part of task `task` (in any
    /// partition folder of its batch).
    pub(crate) fn is_task_part(key: &str, task: u32) -> bool {
        key.rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with(&format!("part-{task:05}-")))
    }

    /// The ending of every part file written under lease `epoch`.
    pub(crate) fn epoch_suffix(epoch: u64) -> String {
        format!("-e{epoch}.parquet")
    }

    /// Prefix under which tasks write their parts, before the commit
    /// publishes them: readers that glob the sink (`**/*.parquet`, Hive,
    /// Spark, Athena skip `_` folders) never see a staged part.
    pub(crate) const STAGING_PREFIX: &str = "_sluice/staging/";

    /// Where a part to be published as `part` (a key from [`part`]) is
    /// staged. The `.staged` ending keeps it out of `*.parquet` globs.
    pub(crate) fn staged(part: &str) -> String {
        format!("{STAGING_PREFIX}{part}.staged")
    }

    /// The published key of staged part `staged`.
    pub(crate) fn published(staged: &str) -> Option<&str> {
        staged.strip_prefix(STAGING_PREFIX)?.strip_suffix(".staged")
    }

    /// The batch a staged object belongs to (its first `batch=N` folder).
    pub(crate) fn staged_batch(staged: &str) -> Option<u64> {
        staged
            .strip_prefix(STAGING_PREFIX)?
            .split('/')
            .find_map(|s| s.strip_prefix("batch="))?
            .parse()
            .ok()
    }

    /// The batch whose folder (`batch=N/`, `_late/batch=N/`,
    /// `_quarantine/batch=N/`) holds published key `key`.
    pub(crate) fn published_batch(key: &str) -> Option<u64> {
        key.split('/')
            .find_map(|s| s.strip_prefix("batch="))?
            .parse()
            .ok()
    }

    /// Where the commit of batch `n` under lease `epoch` stages its
    /// manifest before writing its record; publishing copies it to
    /// [`manifest`], so a run that lost its lease, or whose history was
    /// reset, cannot publish one (its staged copy is gone).
    pub(crate) fn staged_manifest(n: u64, epoch: u64) -> String {
        format!("{STAGING_PREFIX}batch={n:010}/manifest-e{epoch}.json")
    }

    /// Where the commit of batch `n` under lease `epoch` stages the record
    /// of the input files it set aside ([`quarantined_files`]).
    pub(crate) fn staged_quarantined(n: u64, epoch: u64) -> String {
        format!("{STAGING_PREFIX}batch={n:010}/quarantined-e{epoch}.json")
    }

    /// The sink's owner record: which pipeline, and which history of it
    /// (one checkpoint's life), writes here.
    pub const OWNER: &str = "_sluice/sink.json";

    /// Prefix of what batches set aside (`on_bad_file = "quarantine"`).
    pub(crate) const QUARANTINE_PREFIX: &str = "_quarantine/";

    /// The record of the input files batch `n` set aside.
    pub fn quarantined_files(n: u64) -> String {
        format!("{QUARANTINE_PREFIX}batch={n:010}/files.json")
    }

    /// The malformed rows task `task` of batch `n` set aside under lease
    /// `epoch`.
    pub(crate) fn rejected_rows(n: u64, task: u32, epoch: u64) -> String {
        format!("{QUARANTINE_PREFIX}batch={n:010}/rows-{task:05}-e{epoch}.jsonl")
    }

    /// The late rows task `task` of batch `n` read under lease `epoch`
    /// (`[watermark] late = "side-output"`).
    pub(crate) fn late_rows(n: u64, task: u32, epoch: u64) -> String {
        format!("{}late-{task:05}-e{epoch}.parquet", late_prefix(n))
    }

    /// Prefix of every batch's late rows.
    pub(crate) const LATE_PREFIX: &str = "_late/";

    /// Prefix of batch `n`'s late rows.
    pub(crate) fn late_prefix(n: u64) -> String {
        format!("{LATE_PREFIX}batch={n:010}/")
    }

    /// Prefix of the manifests.
    pub(crate) const MANIFEST_PREFIX: &str = "_sluice/manifest/";

    /// The manifest naming the committed files of batch `n`.
    pub fn manifest(n: u64) -> String {
        format!("{MANIFEST_PREFIX}{n:010}.json")
    }

    /// The batch a manifest key names.
    pub(crate) fn manifest_batch(key: &str) -> Option<u64> {
        key.strip_prefix(MANIFEST_PREFIX)?
            .strip_suffix(".json")?
            .parse()
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_numerically_and_parse_back() {
        assert!(checkpoint::offsets(9) < checkpoint::offsets(10));
        assert_eq!(checkpoint::batch_of(&checkpoint::commit(42)), Some(42));
        assert_eq!(
            checkpoint::work_batch(&checkpoint::work(42, 3, 7)),
            Some(42)
        );
        assert_eq!(
            checkpoint::work_batch(&checkpoint::partial(42, 1, 3, 7)),
            Some(42)
        );
        assert_eq!(checkpoint::work_batch(&checkpoint::offsets(42)), None);
        assert_eq!(
            sink::part(3, 1, 2, 7),
            "batch=0000000003/part-00001-00002-e7.parquet"
        );
        assert!(sink::part(3, 1, 2, 7).starts_with(&sink::task_prefix(3, 1)));
        let p = sink::partitioned_part(3, 1, 2, 7, "day=2026-12-01/tag=a%2Fb/");
        assert_eq!(
            p,
            "batch=0000000003/day=2026-12-01/tag=a%2Fb/part-00001-00002-e7.parquet"
        );
        assert_eq!(sink::published_batch(&p), Some(3));
        assert!(sink::is_task_part(&p, 1) && !sink::is_task_part(&p, 2));
        assert!(sink::is_task_part(&sink::part(3, 1, 2, 7), 1));
        assert!(sink::part(3, 1, 2, 7).ends_with(&sink::epoch_suffix(7)));
        let staged = sink::staged(&sink::part(3, 1, 2, 7));
        assert!(!staged.ends_with(".parquet"), "{staged}");
        assert_eq!(
            sink::published(&staged),
            Some(sink::part(3, 1, 2, 7).as_str())
        );
        assert_eq!(sink::staged_batch(&staged), Some(3));
        let late = sink::staged(&sink::late_rows(4, 2, 7));
        assert_eq!(sink::staged_batch(&late), Some(4));
        assert_eq!(
            sink::published(&late),
            Some(sink::late_rows(4, 2, 7).as_str())
        );
        assert_eq!(sink::staged_batch(&sink::staged_manifest(5, 7)), Some(5));
        assert_eq!(sink::published_batch(&sink::late_rows(4, 2, 7)), Some(4));
        assert_eq!(sink::published_batch(&sink::part(3, 1, 2, 7)), Some(3));
        assert_eq!(epoch_of(&checkpoint::work(3, 1, 12)), Some(12));
        assert_eq!(epoch_of(&checkpoint::partial(3, 1, 2, 9)), Some(9));
        assert_eq!(epoch_of(&checkpoint::task_list(3, 4)), Some(4));
        assert_eq!(epoch_of(&checkpoint::merge(3, 1, 5)), Some(5));
        assert_eq!(epoch_of(&sink::staged(&sink::part(3, 1, 2, 8))), Some(8));
        assert_eq!(epoch_of(&sink::staged_manifest(3, 6)), Some(6));
        assert_eq!(epoch_of(&checkpoint::state(1, 3, 11)), Some(11));
        assert_eq!(epoch_of("batch=0000000003/part-00001-00002.parquet"), None);
        assert_eq!(checkpoint::index(0), "index/processed.json");
        assert_eq!(checkpoint::index_history(&checkpoint::index(0)), Some(0));
        assert_eq!(
            checkpoint::index_history(&checkpoint::claim(0, "a")),
            Some(0)
        );
        assert_eq!(checkpoint::index_history(&checkpoint::index(57)), Some(57));
        assert_eq!(
            checkpoint::index_history(&checkpoint::claim(57, "a")),
            Some(57)
        );
        assert!(!checkpoint::claim(57, "a").starts_with(&checkpoint::claims_prefix(0)));
        assert_eq!(sink::manifest_batch(&sink::manifest(12)), Some(12));
    }

    #[test]
    fn inbox_entries_and_claims_name_any_key() {
        let long = "d/".repeat(400) + "x.csv"; // 805 bytes
        for key in [
            "a.csv",
            "2026/11/30/x y+z%41.csv",
            "ünï/cödé #().csv",
            "a.b.c",
            &"k".repeat(190),
            &long,
        ] {
            let e = checkpoint::inbox_entry(key, 1234);
            assert!(e.starts_with(checkpoint::INBOX_PREFIX));
            let name = &e[checkpoint::INBOX_PREFIX.len()..];
            assert!(!name.contains('/'), "{e}");
            assert!(name.len() <= 200, "{} bytes", name.len());
            let (named, size) = checkpoint::inbox_key_of(&e).unwrap();
            assert_eq!(size, 1234);
            if key.len() < 100 {
                assert_eq!(named.as_deref(), Some(key));
            } else {
                assert_eq!(named, None, "a long key is in the entry's body");
            }
            let c = checkpoint::claim(0, key);
            assert!(c.len() - checkpoint::claims_prefix(0).len() <= 200);
        }
        assert_ne!(
            checkpoint::claim(0, &long),
            checkpoint::claim(0, &long.replace("x.csv", "y.csv"))
        );
        assert_eq!(checkpoint::inbox_key_of("inbox/not base64!.1"), None);
        assert_eq!(checkpoint::inbox_key_of("inbox/YQ.x"), None);
        assert_eq!(checkpoint::inbox_key_of("inbox/YQ"), None);
        assert_eq!(checkpoint::inbox_key_of("inbox/~abc.1"), None);
    }
}

/// Keys at the checkpoint root, shared by all pipelines registered there.
/// Names of what a record-stream task reads, as the files its operator
/// scans (in memory, never stored).
pub mod stream {
    /// The records `[start, end)` of `partition` as one JSON Lines file.
    pub fn unit(partition: i32, start: i64, end: i64) -> String {
        format!("partition={partition}/offsets={start:020}-{end:020}.jsonl")
    }

    /// A Kinesis shard's records after `after` (`None`: from its start) as
    /// one JSON Lines file.
    pub fn shard_unit(shard: &str, after: Option<&str>) -> String {
        format!("shard={shard}/after={}.jsonl", after.unwrap_or("start"))
    }

    /// One line of each shape the unit `unit`'s lines have: what the
    /// drift check infers the unit's columns from.
    pub fn shapes(unit: &str) -> String {
        format!("_shapes/{unit}")
    }
}

pub mod registry {
    use serde::{Deserialize, Serialize};

    /// Prefix of the registry: one entry per registered pipeline. Pipeline
    /// names cannot start with `_`, so no pipeline folder collides with it.
    pub(crate) const PREFIX: &str = "_registry/";

    /// The entry of `pipeline`.
    pub fn entry(pipeline: &str) -> String {
        format!("{PREFIX}{pipeline}.json")
    }

    /// The pipeline an entry key names.
    pub(crate) fn pipeline_of(key: &str) -> Option<&str> {
        key.strip_prefix(PREFIX)?.strip_suffix(".json")
    }

    /// What the trigger needs to route an event without reading the spec.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Entry {
        /// Pipeline name (its folder under the checkpoint root).
        pub pipeline: String,
        /// Its source location, `s3://bucket/prefix/` or a local path.
        pub source: String,
        /// Hash of the registered spec: registering a changed spec changes
        /// the entry's bytes, so its etag too.
        #[serde(default)]
        pub spec: String,
    }
}
