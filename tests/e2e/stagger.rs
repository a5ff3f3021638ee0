//! Stagger windows (`stagger_window(ts, size)`) through the engine,
//! against windows computed from their definition by the test over the
//! rows as written (the rides of `crate::dedup`).

use crate::dedup::{Ride, dedup_toml, last_snapshot, rides, write_rides};
use crate::support::*;

/// Stagger windows of 10 minutes per ride id over `rows` (the rows not
/// late), from the definition: per key in time order, a window opens at
/// the key's first row and at its first row at or past the open window's
/// end. Rendered as `ws|we|key|n|total` rows, sorted.
fn stagger_oracle(rows: &[Ride]) -> Vec<String> {
    let mut rows = rows.to_vec();
    rows.sort_by_key(|r| (r.id, r.minute));
    let mut windows: Vec<(u32, i64, u64, f64)> = Vec::new();
    for r in &rows {
        match windows.last_mut() {
            Some((id, start, n, total)) if *id == r.id && r.minute < *start + 10 => {
                *n += 1;
                *total += r.fare;
            }
            _ => windows.push((r.id, r.minute, 1, r.fare)),
        }
    }
    let at = |m: i64| format!("2024-01-01T{:02}:{:02}:00", m / 60, m % 60);
    let mut out: Vec<String> = windows
        .into_iter()
        .map(|(id, s, n, total)| format!("{}|{}|r{id}|{n}|{total:?}", at(s), at(s + 10)))
        .collect();
    out.sort();
    out
}

/// Stagger windows through the engine (batches of two files, a task per
/// file, three state partitions): complete mode's last snapshot is every
/// window over every row; append mode emits each window the final
/// watermark closed, once, over the rows not late; both against windows
/// computed from the definition.
#[tokio::test(flavor = "multi_thread")]
async fn stagger_windows_through_the_engine_equal_their_definition() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let sql = "SELECT stagger_window.start AS ws, stagger_window.end AS we, ride_id, \
               count(*) AS n, sum(fare) AS total FROM rides \
               GROUP BY stagger_window(ts, '10 minutes'), ride_id";
    let limits = "max_files_per_batch = 2\nmax_bytes_per_task = 1\nstate_partitions = 3";
    let complete = dedup_toml("staggerc", sql, true, limits)
        .replace(
            "[deduplicate]\nkey = [\"ride_id\"]\nkeep = \"forever\"\n",
            "",
        )
        .replace("out/", "complete/");
    let append = dedup_toml("staggera", sql, false, limits)
        .replace("[deduplicate]\nkey = [\"ride_id\"]\n", "")
        .replace("mode = \"complete\"", "mode = \"append\"");
    assert!(!complete.contains("[deduplicate]") && !append.contains("[deduplicate]"));
    let mut runs = Vec::new();
    for (run_no, files) in [3u64, 2, 2].into_iter().enumerate() {
        let mut run_files = Vec::new();
        for f in 0..files {
            let file = run_no as u64 * 10 + f;
            let rows = rides(file, 14, 9);
            write_rides(root, file, &rows);
            run_files.push(rows);
        }
        runs.push(run_files);
        for toml in [&complete, &append] {
            run(&local_context(&pipeline(root, toml))).await.unwrap();
        }
    }
    let all: Vec<Ride> = runs.iter().flatten().flatten().cloned().collect();
    let mut got = last_snapshot(&root.join("complete/sink"), "staggerc").await;
    got.sort();
    assert_eq!(got, stagger_oracle(&all), "complete");
    // Append: the rows not late (the watermark from the batches the limits
    // make), the windows that end by the final watermark.
    let (mut watermark, mut kept) = (None::<i64>, Vec::new());
    for run in &runs {
        for batch in run.chunks(2) {
            let mut max_event = None;
            for r in batch.iter().flatten() {
                max_event = max_event.max(Some(r.minute));
                if watermark.is_none_or(|w| r.minute > w) {
                    kept.push(r.clone());
                }
            }
            if let Some(m) = max_event {
                watermark = watermark.max(Some(m - 10));
            }
        }
    }
    let wm = watermark.unwrap();
    let closed: Vec<String> = stagger_oracle(&kept)
        .into_iter()
        .filter(|row| {
            let end = row.split('|').nth(1).unwrap();
            let (h, m) = (&end[11..13], &end[14..16]);
            h.parse::<i64>().unwrap() * 60 + m.parse::<i64>().unwrap() <= wm
        })
        .collect();
    assert!(!closed.is_empty());
    let got = committed_rows(&root.join("out/sink"), "staggera").await;
    assert_eq!(got, closed, "append");
    assert_eq!(
        control_of(root, &append).await.totals.late_rows,
        (all.len() - kept.len()) as u64
    );
}

/// The sweep's engine cases: stagger and session windows over the whole
/// stream (no key) run (every run panicked); `sluice check` refuses a size
/// the column's unit cannot hold, as a run does. Hand-worked.
#[tokio::test(flavor = "multi_thread")]
async fn keyless_windows_run_and_check_refuses_what_a_run_would() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("input")).unwrap();
    std::fs::write(
        root.join("input/e.csv"),
        "ts,k,v\n2024-01-01T00:01:00,a,1\n2024-01-01T00:03:00,b,2\n2024-01-01T00:12:00,a,4\n",
    )
    .unwrap();
    let toml = |name: &str, kind: &str, unit: &str| {
        format!(
            r#"name = "{name}"
[source]
uri = "input"
format = "csv"
table = "events"
schema = [{{ name = "ts", type = "Timestamp({unit}, None)" }}, {{ name = "k", type = "Utf8" }}, {{ name = "v", type = "Int64" }}]
[query]
sql = "SELECT {kind}.start AS ws, {kind}.end AS we, count(*) AS n, sum(v) AS total FROM events GROUP BY {kind}(ts, '10 minutes')"
[sink]
uri = "{name}/sink"
mode = "complete"
[checkpoint]
uri = "{name}/checkpoint"
[limits]
state_partitions = 2
"#
        )
    };
    for (name, kind, want) in [
        (
            "stagger",
            "stagger_window",
            // 00:01 opens [00:01, 00:11) with 00:03; 00:12 opens the next.
            [
                "2024-01-01T00:01:00|2024-01-01T00:11:00|2|3",
                "2024-01-01T00:12:00|2024-01-01T00:22:00|1|4",
            ]
            .as_slice(),
        ),
        (
            "session",
            "session_window",
            // Each row within 10 minutes of the last: one session.
            ["2024-01-01T00:01:00|2024-01-01T00:22:00|3|7"].as_slice(),
        ),
    ] {
        let t = toml(name, kind, "Microsecond");
        run(&local_context(&pipeline(root, &t)))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut got = last_snapshot(&root.join(format!("{name}/sink")), name).await;
        got.sort();
        assert_eq!(got, want, "{name}");
    }
    let seconds =
        toml("secs", "stagger_window", "Second").replace("'10 minutes'", "'1500 milliseconds'");
    let e = check_error(root, &seconds).await;
    assert!(e.contains("not a whole number of seconds"), "{e}");
}
