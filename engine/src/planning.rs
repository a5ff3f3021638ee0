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
