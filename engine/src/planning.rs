//! Planning: splitting new input into batches (bounded by the pipeline's
//! limits) and batches into operator tasks (bounded by bytes).

use crate::checkpoint::{InputFile, TaskPlan};
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn files(sizes: &[u64]) -> Vec<InputFile> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, s)| InputFile {
                key: format!("{i:04}"),
                size: *s,
                etag: None,
                modified_ms: None,
            })
            .collect()
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
