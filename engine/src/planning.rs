//! Planning: splitting new input into batches (bounded by the pipeline's
//! limits) and batches into operator tasks (bounded by bytes, or by
//! records for a record stream).

use std::collections::BTreeMap;

use crate::checkpoint::{InputFile, RecordRange, TaskPlan};
use crate::pipeline::Limits;

/// Split `files` (in processing order) into consecutive batches of at most
/// `max_files_per_batch` files and `max_bytes_per_batch` bytes; a batch
/// always takes at least one file, however large.
pub(crate) fn split_batches(files: &[InputFile], limits: &Limits) -> Vec<Vec<InputFile>> {
    let mut out: Vec<Vec<InputFile>> = Vec::new();
    let mut cur: Vec<InputFile> = Vec::new();
    let mut bytes = 0u64;
    for f in files {
        let full = cur.len() as u64 >= limits.max_files_per_batch
            || (!cur.is_empty() && bytes + f.size > limits.max_bytes_per_batch);
        if full {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += f.size;
        cur.push(f.clone());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Split the files of consecutive source manifests (`(manifest key,
/// files)`, in order) into batches of whole manifests, within the limits as
/// [`split_batches`] (a batch always takes at least one manifest, however
/// large), each with the key of its last manifest: its offset. A manifest
/// with no files joins the batch before it, or the next; trailing ones with
/// no batch to join wait for a later manifest with files.
pub(crate) fn split_manifests(
    manifests: &[(String, Vec<InputFile>)],
    limits: &Limits,
) -> Vec<(Vec<InputFile>, String)> {
    let mut out: Vec<(Vec<InputFile>, String)> = Vec::new();
    let mut cur: Vec<InputFile> = Vec::new();
    let mut last: Option<&str> = None;
    for (key, files) in manifests {
        let bytes: u64 = cur.iter().map(|f| f.size).sum();
        let adding: u64 = files.iter().map(|f| f.size).sum();
        let full = !cur.is_empty()
            && !files.is_empty()
            && (cur.len() + files.len() > limits.max_files_per_batch as usize
                || bytes + adding > limits.max_bytes_per_batch);
        if full && let Some(l) = last {
            out.push((std::mem::take(&mut cur), l.to_string()));
        }
        cur.extend(files.iter().cloned());
        last = Some(key);
    }
    if !cur.is_empty()
        && let Some(l) = last
    {
        out.push((cur, l.to_string()));
    }
    out
}

/// The task size `limits.task_seconds` asks for at the measured `pace`:
/// the bytes a task reads in that time, at most `max_bytes_per_task` and at
/// least 1 MiB (`None`: not asked for, or nothing measured yet).
pub(crate) fn paced_task_bytes(
    limits: &Limits,
    pace: Option<&crate::checkpoint::TaskPace>,
) -> Option<u64> {
    let bytes = pace?.bytes_in(limits.task_seconds?)?;
    Some(bytes.max(1 << 20).min(limits.max_bytes_per_task))
}

/// Split a batch's inputs into tasks of at most `max_bytes_per_task` bytes
/// (at least one file each), keeping input order.
pub(crate) fn split_tasks(inputs: &[InputFile], max_bytes_per_task: u64) -> Vec<TaskPlan> {
    let mut tasks: Vec<TaskPlan> = Vec::new();
    for (i, f) in inputs.iter().enumerate() {
        let start_new = match tasks.last() {
            None => true,
            Some(t) => t.bytes + f.size > max_bytes_per_task,
        };
        if start_new {
            tasks.push(TaskPlan {
                task: tasks.len() as u32,
                inputs: Vec::new(),
                bytes: 0,
            });
        }
        let t = tasks.last_mut().expect("a task was pushed");
        t.inputs.push(i as u32);
        t.bytes += f.size;
    }
    tasks
}

/// The end offsets of the next batch of a record stream whose partitions
/// have read up to `from` and wait up to `until` (partitions not in
/// `from` are read from nothing: they are not waited on), at most about
/// `limit` records in all: Spark's `KafkaMicroBatchStream.rateLimit`.
/// Each partition takes its share in proportion to what it waits; a share
/// below one record is rounded up (no partition starves), others down, so
/// a batch may take a few more than `limit` when many partitions wait a
/// little. Every partition with waiting records advances.
pub(crate) fn rate_limit(
    from: &BTreeMap<i32, i64>,
    until: &BTreeMap<i32, i64>,
    limit: u64,
) -> BTreeMap<i32, i64> {
    let waiting = |p: &i32, end: i64| from.get(p).map_or(0, |b| (end - b).max(0) as u64);
    let total: u64 = until.iter().map(|(p, e)| waiting(p, *e)).sum();
    if total <= limit {
        return until.clone();
    }
    until
        .iter()
        .map(|(p, end)| {
            let size = waiting(p, *end);
            let Some(begin) = from.get(p).filter(|_| size > 0) else {
                return (*p, *end);
            };
            let prorate = limit as f64 * (size as f64 / total as f64);
            let take = if prorate < 1.0 {
                prorate.ceil()
            } else {
                prorate.floor()
            } as i64;
            (*p, begin.saturating_add(take).min(*end))
        })
        .collect()
}

/// Cut the records waiting after `from` up to `until` into batches of
/// about `max_records_per_batch` records ([`rate_limit`]), each the
/// partitions' ranges it reads, in partition order (empty ranges left
/// out). `from` names every partition to read (a new partition from its
/// earliest offset).
pub(crate) fn split_record_batches(
    from: &BTreeMap<i32, i64>,
    until: &BTreeMap<i32, i64>,
    max_records_per_batch: u64,
) -> Vec<Vec<RecordRange>> {
    let mut at = from.clone();
    let mut batches = Vec::new();
    loop {
        let ends = rate_limit(&at, until, max_records_per_batch.max(1));
        let ranges: Vec<RecordRange> = ends
            .iter()
            .filter_map(|(p, end)| {
                let start = *at.get(p)?;
                (*end > start).then_some(RecordRange {
                    partition: *p,
                    start,
                    end: *end,
                })
            })
            .collect();
        if ranges.is_empty() {
            return batches;
        }
        for r in &ranges {
            at.insert(r.partition, r.end);
        }
        batches.push(ranges);
    }
}

/// Pack a Kinesis batch's shard units (one per shard, at most `limit`
/// records each) into tasks of at most `max_records_per_task` records by
/// their limits (a unit is never split: where its records end is known
/// only by reading them). A task's `bytes` is its units' limits.
pub(crate) fn split_shard_tasks(
    units: &[crate::checkpoint::ShardUnit],
    max_records_per_task: u64,
) -> Vec<TaskPlan> {
    let max = max_records_per_task.max(1);
    let mut tasks: Vec<TaskPlan> = Vec::new();
    for (i, u) in units.iter().enumerate() {
        let fits = tasks.last().is_some_and(|t| t.bytes + u.limit <= max);
        if !fits {
            tasks.push(TaskPlan {
                task: tasks.len() as u32,
                inputs: Vec::new(),
                bytes: 0,
            });
        }
        let t = tasks.last_mut().expect("a task was pushed");
        t.inputs.push(i as u32);
        t.bytes += u.limit;
    }
    tasks
}

/// Cut a batch's ranges into units of at most `max_records_per_task`
/// records and pack consecutive units into tasks of at most that many
/// records (a unit never spans two tasks): the units, in order, and the
/// tasks indexing them. A task's `bytes` is its record count.
pub(crate) fn split_record_tasks(
    ranges: &[RecordRange],
    max_records_per_task: u64,
) -> (Vec<RecordRange>, Vec<TaskPlan>) {
    let max = max_records_per_task.max(1) as i64;
    let mut units = Vec::new();
    for r in ranges {
        let mut start = r.start;
        while start < r.end {
            let end = r.end.min(start.saturating_add(max));
            units.push(RecordRange {
                partition: r.partition,
                start,
                end,
            });
            start = end;
        }
    }
    let mut tasks: Vec<TaskPlan> = Vec::new();
    for (i, u) in units.iter().enumerate() {
        let fits = tasks
            .last()
            .is_some_and(|t| t.bytes + u.len() <= max as u64);
        if !fits {
            tasks.push(TaskPlan {
                task: tasks.len() as u32,
                inputs: Vec::new(),
                bytes: 0,
            });
        }
        let t = tasks.last_mut().expect("a task was pushed");
        t.inputs.push(i as u32);
        t.bytes += u.len();
    }
    (units, tasks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 40 MiB read in 8,000 ms: 5 MiB a second; 10 s of it is 50 MiB,
    /// within `max_bytes_per_task`, and never under 1 MiB or past it.
    #[test]
    fn paced_tasks() {
        let pace = crate::checkpoint::TaskPace {
            bytes: 40 << 20,
            ms: 8_000,
            tasks: 4,
        };
        let limits = |secs: Option<u64>, max: u64| Limits {
            task_seconds: secs,
            max_bytes_per_task: max,
            ..Limits::default()
        };
        assert_eq!(
            paced_task_bytes(&limits(Some(10), 256 << 20), Some(&pace)),
            Some(50 << 20)
        );
        assert_eq!(
            paced_task_bytes(&limits(Some(10), 32 << 20), Some(&pace)),
            Some(32 << 20)
        );
        let slow = crate::checkpoint::TaskPace {
            bytes: 1000,
            ms: 1000,
            tasks: 1,
        };
        assert_eq!(
            paced_task_bytes(&limits(Some(1), 256 << 20), Some(&slow)),
            Some(1 << 20)
        );
        assert_eq!(
            paced_task_bytes(&limits(None, 256 << 20), Some(&pace)),
            None
        );
        assert_eq!(paced_task_bytes(&limits(Some(10), 256 << 20), None), None);
    }

    fn files(sizes: &[u64]) -> Vec<InputFile> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, s)| InputFile {
                key: format!("{i:04}"),
                size: *s,
                etag: None,
                modified_ms: None,
                partition: None,
            })
            .collect()
    }

    fn offsets(pairs: &[(i32, i64)]) -> BTreeMap<i32, i64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn rate_limit_splits_in_proportion_to_what_waits_as_spark_does() {
        // 900 and 100 wait; a limit of 100 takes 90 and 10.
        let from = offsets(&[(0, 0), (1, 50)]);
        let until = offsets(&[(0, 900), (1, 150)]);
        assert_eq!(rate_limit(&from, &until, 100), offsets(&[(0, 90), (1, 60)]));
        // Everything fits: all of it.
        assert_eq!(rate_limit(&from, &until, 1000), until);
        // A share below one record is rounded up: no partition starves.
        let from = offsets(&[(0, 0), (1, 0), (2, 0)]);
        let until = offsets(&[(0, 1000), (1, 1), (2, 2)]);
        assert_eq!(
            rate_limit(&from, &until, 10),
            offsets(&[(0, 9), (1, 1), (2, 1)])
        );
        // A partition not in `from` is not read; one already at its end stays.
        let from = offsets(&[(0, 5)]);
        let until = offsets(&[(0, 5), (1, 7)]);
        assert_eq!(rate_limit(&from, &until, 1), until);
    }

    #[test]
    fn record_batches_and_tasks_by_hand() {
        let from = offsets(&[(0, 10), (1, 0)]);
        let until = offsets(&[(0, 40), (1, 10)]);
        let batches = split_record_batches(&from, &until, 20);
        let r = |partition, start, end| RecordRange {
            partition,
            start,
            end,
        };
        assert_eq!(
            batches,
            vec![
                vec![r(0, 10, 25), r(1, 0, 5)],
                vec![r(0, 25, 40), r(1, 5, 10)],
            ]
        );
        let (units, tasks) = split_record_tasks(&[r(0, 10, 25), r(1, 0, 5)], 6);
        assert_eq!(
            units,
            vec![r(0, 10, 16), r(0, 16, 22), r(0, 22, 25), r(1, 0, 5)]
        );
        let groups: Vec<Vec<u32>> = tasks.iter().map(|t| t.inputs.clone()).collect();
        assert_eq!(groups, vec![vec![0], vec![1], vec![2], vec![3]]);
        let (_, tasks) = split_record_tasks(&[r(0, 0, 2), r(1, 0, 3), r(2, 0, 9)], 6);
        let groups: Vec<Vec<u32>> = tasks.iter().map(|t| t.inputs.clone()).collect();
        assert_eq!(groups, vec![vec![0, 1], vec![2], vec![3]]);
    }

    proptest! {
        #[test]
        fn record_batches_read_every_record_once_in_order_within_about_the_limit(
            waits in proptest::collection::vec((0i64..50, 0i64..400), 1..8),
            limit in 1u64..500,
            per_task in 1u64..200,
        ) {
            let from: BTreeMap<i32, i64> =
                waits.iter().enumerate().map(|(p, (s, _))| (p as i32, *s)).collect();
            let until: BTreeMap<i32, i64> =
                waits.iter().enumerate().map(|(p, (s, w))| (p as i32, s + w)).collect();
            let batches = split_record_batches(&from, &until, limit);
            let mut next = from.clone();
            for b in &batches {
                prop_assert!(!b.is_empty());
                let n: u64 = b.iter().map(|r| r.len()).sum();
                // Rounding up gives each partition at most one extra record.
                prop_assert!(n <= limit + waits.len() as u64, "{} > {}", n, limit);
                for r in b {
                    prop_assert_eq!(r.start, next[&r.partition]);
                    prop_assert!(r.end > r.start);
                    next.insert(r.partition, r.end);
                }
                let (units, tasks) = split_record_tasks(b, per_task);
                let covered: u64 = units.iter().map(|u| u.len()).sum();
                prop_assert_eq!(covered, n);
                let mut seen = 0;
                for t in &tasks {
                    prop_assert!(t.bytes <= per_task);
                    for i in &t.inputs {
                        prop_assert_eq!(*i, seen);
                        seen += 1;
                    }
                }
                prop_assert_eq!(seen as usize, units.len());
            }
            prop_assert_eq!(next, until);
        }
    }

    proptest! {
        #[test]
        fn batches_cover_every_file_once_in_order_within_limits(
            sizes in proptest::collection::vec(0u64..1000, 0..60),
            max_files in 1u64..8,
            max_bytes in 1u64..3000,
        ) {
            let limits = Limits { max_files_per_batch: max_files, max_bytes_per_batch: max_bytes, ..Limits::default() };
            let fs = files(&sizes);
            let batches = split_batches(&fs, &limits);
            let flat: Vec<_> = batches.iter().flatten().cloned().collect();
            prop_assert_eq!(flat, fs);
            for b in &batches {
                prop_assert!(!b.is_empty());
                prop_assert!(b.len() as u64 <= max_files);
                let bytes: u64 = b.iter().map(|f| f.size).sum();
                prop_assert!(b.len() == 1 || bytes <= max_bytes);
            }
        }

        #[test]
        fn manifest_batches_take_whole_manifests_in_order(
            sizes in proptest::collection::vec(proptest::collection::vec(0u64..1000, 0..4), 0..20),
            max_files in 1u64..8,
            max_bytes in 1u64..3000,
        ) {
            let limits = Limits { max_files_per_batch: max_files, max_bytes_per_batch: max_bytes, ..Limits::default() };
            let manifests: Vec<(String, Vec<InputFile>)> = sizes
                .iter()
                .enumerate()
                .map(|(m, s)| {
                    let mut fs = files(s);
                    for f in &mut fs {
                        f.key = format!("{m:04}/{}", f.key);
                    }
                    (format!("{m:04}"), fs)
                })
                .collect();
            let batches = split_manifests(&manifests, &limits);
            // Every file of every manifest up to the last batch's, in order.
            let through = batches.last().map(|(_, k)| k.clone());
            let covered: Vec<InputFile> = manifests
                .iter()
                .filter(|(k, _)| Some(k) <= through.as_ref())
                .flat_map(|(_, f)| f.clone())
                .collect();
            let flat: Vec<InputFile> = batches.iter().flat_map(|(b, _)| b.clone()).collect();
            prop_assert_eq!(flat, covered);
            // What is left holds no file.
            prop_assert!(manifests
                .iter()
                .filter(|(k, _)| Some(k) > through.as_ref())
                .all(|(_, f)| f.is_empty()));
            for (b, through) in &batches {
                prop_assert!(!b.is_empty());
                // Whole manifests: the batch ends with its last manifest.
                let end = format!("{}/~", through);
                prop_assert!(b.iter().all(|f| f.key.as_str() < end.as_str()));
                let last = manifests.iter().find(|(k, _)| k == through).unwrap();
                prop_assert!(last.1.iter().all(|f| b.contains(f)));
                let bytes: u64 = b.iter().map(|f| f.size).sum();
                let one = b.iter().map(|f| &f.key[..4]).collect::<std::collections::BTreeSet<_>>().len() == 1;
                prop_assert!(one || (b.len() as u64 <= max_files && bytes <= max_bytes));
            }
        }

        #[test]
        fn tasks_cover_every_input_once_within_bytes(
            sizes in proptest::collection::vec(0u64..1000, 1..40),
            max_bytes in 1u64..3000,
        ) {
            let fs = files(&sizes);
            let tasks = split_tasks(&fs, max_bytes);
            let flat: Vec<u32> = tasks.iter().flat_map(|t| t.inputs.clone()).collect();
            prop_assert_eq!(flat, (0..fs.len() as u32).collect::<Vec<_>>());
            for (i, t) in tasks.iter().enumerate() {
                prop_assert_eq!(t.task as usize, i);
                prop_assert!(t.inputs.len() == 1 || t.bytes <= max_bytes);
            }
        }
    }
}
