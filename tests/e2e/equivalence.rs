//! Micro-batch equivalence: however input arrives and is split into batches
//! and runs, the union of committed output equals the same SQL run once.

use proptest::prelude::*;

use crate::support::*;

/// `mode`: 0 list, 1 ordered, 2 notify (every arrival notified, and every
/// earlier file notified again: duplicates).
fn check(arrivals: Vec<u64>, max_files: u64, rows: usize, mode: u8) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let discovery = match mode {
            0 => "discovery = \"list\"",
            1 => "discovery = \"ordered\"\nlookback = 2",
            _ => "discovery = \"notify\"\nreconcile_every = 1000",
        };
        let p = pipeline(
            root,
            &pipeline_toml(
                "eq",
                "parquet",
                discovery,
                &format!("max_files_per_batch = {max_files}"),
            ),
        );
        let mut batches = 0;
        let input = root.join("input");
        let mut all = Vec::new();
        for a in &arrivals {
            all.extend(gen_files(&input, *a, rows));
            let ctx = local_context(&p);
            if mode == 2 {
                let store = ctx.checkpoint.store();
                sluice_engine::discovery::record_notified(store, notified(&all, &input))
                    .await
                    .unwrap();
            }
            let s = run(&ctx).await.unwrap();
            batches += s.batches.len();
        }
        let total: u64 = arrivals.iter().sum();
        assert!(batches as u64 >= total.div_ceil(max_files));
        let expected = one_shot_rows(&root.join("input")).await;
        assert!(!expected.is_empty());
        assert_eq!(committed_rows(&root.join("out/sink"), "eq").await, expected);
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 9, ..ProptestConfig::default() })]

    #[test]
    fn batch_splitting_never_changes_the_result(
        arrivals in proptest::collection::vec(1u64..4, 1..4),
        max_files in 1u64..4,
        rows in 20usize..200,
        mode in 0u8..3,
    ) {
        check(arrivals, max_files, rows, mode);
    }
}

#[test]
fn every_mode_in_a_fixed_case() {
    // The proptest picks modes at random; each one runs here at least once.
    for mode in 0..3 {
        check(vec![2, 1, 3], 2, 50, mode);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_with_spaces_unicode_and_specials_are_read_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = gen_files(&root.join("input"), 3, 40);
    for (i, name) in [
        "trips 001 (copy).parquet",
        "trips-ü-東京.parquet",
        "trips%20#1+[x].parquet",
    ]
    .iter()
    .enumerate()
    {
        std::fs::rename(&files[i], files[i].with_file_name(name)).unwrap();
    }
    let p = pipeline(root, &pipeline_toml("odd", "parquet", "", ""));
    let s = run(&local_context(&p)).await.unwrap();
    assert_eq!(s.batches.iter().map(|b| b.files).sum::<u64>(), 3);
    assert_eq!(
        committed_rows(&root.join("out/sink"), "odd").await,
        one_shot_rows(&root.join("input")).await
    );
}
