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
    /// The processed-input index.
    pub(crate) const INDEX: &str = "index/processed.json";
    /// Notify mode: where triggers record notified objects.
    pub(crate) const INBOX_PREFIX: &str = "inbox/";
    /// Notify mode: one claim per input key taken by a run.
    pub(crate) const CLAIMS_PREFIX: &str = "index/keys/";

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

    /// Notify mode: the claim of source key `key`.
    pub fn claim(key: &str) -> String {
        format!("{CLAIMS_PREFIX}{}", key_name(key))
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

    /// Prefix of the task results of batch `n`.
    pub(crate) fn work_prefix(n: u64) -> String {
        format!("work/{n:010}/")
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

    /// The task list of batch `n`, read by the state machine's Distributed
    /// Map (a JSON array of task numbers).
    pub fn task_list(n: u64) -> String {
        format!("{}tasks.json", work_prefix(n))
    }

    /// The refusal a task of batch `n` under lease `epoch` left when its
    /// input was refused: the Distributed Map reports only that a child
    /// failed, so the settle step reads why here.
    pub fn refusal(n: u64, task: u32, epoch: u64) -> String {
        format!("{}refused-{task:05}-e{epoch}.json", work_prefix(n))
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

    /// Output file `part` of task `task` of batch `n`, written by the run
    /// holding lease `epoch`: a retried task of the same run overwrites its
    /// own files, and a run that lost its lease can never overwrite the
    /// files another run committed.
    pub fn part(n: u64, task: u32, part: u32, epoch: u64) -> String {
        format!("{}{part:05}{}", task_prefix(n, task), epoch_suffix(epoch))
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

    /// The batch a staged part belongs to.
    pub(crate) fn staged_batch(staged: &str) -> Option<u64> {
        let rest = published(staged)?.strip_prefix("batch=")?;
        rest.split('/').next()?.parse().ok()
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

    /// Prefix of batch `n`'s late rows.
    pub(crate) fn late_prefix(n: u64) -> String {
        format!("_late/batch={n:010}/")
    }

    /// Prefix of what batch `n` set aside.
    pub(crate) fn quarantine_prefix(n: u64) -> String {
        format!("{QUARANTINE_PREFIX}batch={n:010}/")
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
            sink::part(3, 1, 2, 7),
            "batch=0000000003/part-00001-00002-e7.parquet"
        );
        assert!(sink::part(3, 1, 2, 7).starts_with(&sink::task_prefix(3, 1)));
        assert!(sink::part(3, 1, 2, 7).ends_with(&sink::epoch_suffix(7)));
        let staged = sink::staged(&sink::part(3, 1, 2, 7));
        assert!(!staged.ends_with(".parquet"), "{staged}");
        assert_eq!(
            sink::published(&staged),
            Some(sink::part(3, 1, 2, 7).as_str())
        );
        assert_eq!(sink::staged_batch(&staged), Some(3));
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
            let c = checkpoint::claim(key);
            assert!(c.len() - checkpoint::CLAIMS_PREFIX.len() <= 200);
        }
        assert_ne!(
            checkpoint::claim(&long),
            checkpoint::claim(&long.replace("x.csv", "y.csv"))
        );
        assert_eq!(checkpoint::inbox_key_of("inbox/not base64!.1"), None);
        assert_eq!(checkpoint::inbox_key_of("inbox/YQ.x"), None);
        assert_eq!(checkpoint::inbox_key_of("inbox/YQ"), None);
        assert_eq!(checkpoint::inbox_key_of("inbox/~abc.1"), None);
    }
}

/// Keys at the checkpoint root, shared by all pipelines registered there.
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
