//! Fencing: a run stopped past its lease (a frozen container, a committer
//! Lambda that outlives its cancelled execution) and resumed after another
//! run took over, or after `sluice reset`, changes nothing a reader or a
//! later run sees. Proved the way the review found it: the stale run is
//! held at each of its writes in turn (a pause hook in the store, not
//! timing), the other run (or a reset and a run) goes to the end, the
//! stale run is let go, a last run goes to the end, and then the output
//! equals an oracle computed without Sluice and the checkpoint is
//! consistent. A second pipeline sharing the checkpoint root is never
//! touched. The same for a reset held at each of its writes while another
//! reset and a run go to the end.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_engine::admin;
use sluice_engine::discovery;
use sluice_engine::error::StoreError;
use sluice_engine::handlers::Context;
use sluice_engine::storage::{LocalStore, Store};

use crate::support::*;

/// Holds write number `at` (1-based, counted over every store sharing
/// `writes`; only writes of kind `only` when given) until `release` is
/// signalled; `at = 0` holds none.
#[derive(Debug, Default)]
struct Pause {
    writes: AtomicU64,
    at: u64,
    only: Option<&'static str>,
    reached: tokio::sync::Notify,
    release: tokio::sync::Notify,
    held: std::sync::Mutex<Option<String>>,
}

#[derive(Debug, Clone)]
struct PauseHook(Arc<Pause>);

#[async_trait::async_trait]
impl WriteHook for PauseHook {
    async fn before(&self, op: &'static str, key: &str) -> Result<(), StoreError> {
        if self.0.only.is_some_and(|o| o != op) {
            return Ok(());
        }
        let n = self.0.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.0.at {
            *self.0.held.lock().unwrap() = Some(format!("{op} {key}"));
            self.0.reached.notify_one();
            self.0.release.notified().await;
        }
        Ok(())
    }
}

/// The context of the pipeline `toml` under `root` whose sink and
/// checkpoint writes pass `pause`.
fn paused_context(root: &Path, toml: &str, pause: &Arc<Pause>) -> Context {
    let p = pipeline(root, toml);
    let wrap = |path: PathBuf| -> Arc<dyn Store> {
        Arc::new(Hooked {
            inner: Arc::new(LocalStore::new(path)),
            hook: PauseHook(pause.clone()),
        })
    };
    let checkpoint = root.join("out/checkpoint").join(&p.name);
    let mut ctx = Context::new(
        p,
        Arc::new(LocalStore::new(root.join("input"))),
        wrap(root.join("out/sink")),
        wrap(checkpoint),
    );
    test_mode(&mut ctx);
    ctx
}

/// A stream pipeline's declared source schema, where the scenario's
/// setup asked for one (`root/declared`): a trigger starts only a
/// registered pipeline, and a stream's is registered once its schema is
/// known (declared, or read by a first run); otherwise it is inferred
/// from the first records.
fn declared(root: &Path) -> &'static str {
    if root.join("declared").exists() {
        r#"schema = [{ name = "ride_id", type = "Int64" }, { name = "fare", type = "Float64" }, { name = "zone", type = "Utf8" }]"#
    } else {
        ""
    }
}

/// Before a trigger starts the stale writer: a stream pipeline declares
/// its schema, so it can be registered.
fn prepare(s: Scenario, stale: Stale, root: &Path) {
    if stale == Stale::Express && matches!(s, Scenario::Kafka | Scenario::Kinesis) {
        std::fs::write(root.join("declared"), "").unwrap();
    }
}

/// What the stale run is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stale {
    /// A run, stopped at a write of its plan, task, merge or commit steps.
    Run,
    /// `sluice reset`, stopped at one of its writes.
    Reset,
    /// An Express execution a trigger started, stopped at one of its
    /// writes; Express is at-least-once, so the same run (same epoch, same
    /// input) may run in a second execution meanwhile.
    Express,
}

/// The id of the held Express execution.
const HELD: &str = "arn:aws:states:local:000000000000:express:sluice:held";

/// An Express execution of `input` to its end, as execution `id` (a new
/// one if `None`).
async fn express(
    ctx: &Context,
    input: serde_json::Value,
    id: Option<&str>,
) -> sluice_engine::Result<()> {
    let runner = runner().starting(sluice_engine::deploy::Workflow::Express);
    let runner = match id {
        Some(id) => runner.as_execution(id),
        None => runner,
    };
    runner.execute(ctx, input, |_| {}).await.map(|_| ())
}

/// What happens while it is stopped.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Meanwhile {
    /// A new file arrives and another run takes over and goes to the end.
    TakeOver,
    /// `sluice reset`, then a run to the end.
    Reset,
    /// `sluice reset`, held at its first delete while the stale writer
    /// goes on to its end; then let go, and a run to the end.
    HeldReset,
    /// A duplicate of the stopped Express execution (same run, same
    /// input; a second copy of it under the same execution id, or another
    /// execution) goes to the end or stops.
    Duplicate,
}

/// The pipelines the stale writer is tried on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    /// `list` discovery, two batches, bad rows set aside (row files).
    List,
    /// [`Scenario::List`] with `ordered` discovery: the lookback window
    /// of processed keys lives in control, advanced with each commit.
    Ordered,
    /// `notify` discovery: inbox, claims, reconciliation.
    Notify,
    /// A windowed GROUP BY in append mode with late rows as side output:
    /// tasks' partial states, merges' state files, trailing batch.
    Windowed,
    /// A corrupt file refused: its batch abandoned (plans deleted, what was
    /// staged removed, the lease released); the file is fixed meanwhile.
    Refused,
    /// A Kafka topic of two partitions: record ranges planned, offsets
    /// committed in control; records arrive meanwhile (the test broker).
    Kafka,
    /// `list` discovery into a Delta table: each batch's publish ends with
    /// a Delta commit; a reset retires the table with one.
    Delta,
    /// The same into a Delta table in complete mode (a windowed GROUP BY;
    /// each commit replaces the table's files), with a log checkpoint
    /// after every version.
    DeltaComplete,
    /// A Parquet sink partitioned by a nullable, escaped tag (parts in
    /// `batch=N/tag=.../` folders).
    Partitioned,
    /// A join with a static table (`[[static]]`): each plan pins it, each
    /// task reads it.
    StaticJoin,
    /// [`Scenario::Delta`] with a query whose first batch keeps no row:
    /// that batch's commit creates the table (its schema from the plan).
    DeltaEmptyFirst,
    /// `[deduplicate]` with keys kept forever: tasks ship rows, a Dedup
    /// map keeps each key's first row and writes the keys seen.
    Dedup,
    /// A Kinesis stream of two shards: shard units planned one batch a
    /// plan, where the run stops in each shard recorded in control, the
    /// cursors moved by what the tasks read; records arrive meanwhile.
    Kinesis,
}

const CSV_SQL: &str = "SELECT id, v, v * 2 AS twice FROM t WHERE v > 1";

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::List => "fence",
            Scenario::Ordered => "fenceo",
            Scenario::Notify => "fencen",
            Scenario::Windowed => "fencew",
            Scenario::Refused => "fencer",
            Scenario::Kafka => "fencek",
            Scenario::Delta => "fenced",
            Scenario::DeltaComplete => "fencedc",
            Scenario::Partitioned => "fencep",
            Scenario::StaticJoin => "fencesj",
            Scenario::DeltaEmptyFirst => "fencede",
            Scenario::Dedup => "fencedd",
            Scenario::Kinesis => "fenceki",
        }
    }

    fn toml(self, root: &Path) -> String {
        match self {
            Scenario::Kinesis => crate::kinesis::kinesis_toml(
                self.name(),
                &std::fs::read_to_string(root.join("stream")).unwrap(),
                declared(root),
                "max_records_per_batch = 6\nmax_records_per_task = 3",
            ),
            Scenario::Kafka => crate::kafka::kafka_toml(
                self.name(),
                &std::fs::read_to_string(root.join("topic")).unwrap(),
                declared(root),
                "max_records_per_batch = 6\nmax_records_per_task = 3",
            ),
            Scenario::List => format!(
                r#"name = "fence"
[source]
uri = "input"
format = "csv"
table = "t"
on_bad_row = "quarantine"
schema = [{{ name = "id", type = "Int64" }}, {{ name = "v", type = "Int64" }}]
[query]
sql = "{CSV_SQL}"
[sink]
uri = "out/sink"
[checkpoint]
uri = "out/checkpoint"
[limits]
max_files_per_batch = 2
"#
            ),
            Scenario::Ordered => Scenario::List
                .toml(root)
                .replace("name = \"fence\"", "name = \"fenceo\"")
                .replace(
                    "table = \"t\"",
                    "table = \"t\"\ndiscovery = \"ordered\"\nlookback = 2",
                ),
            Scenario::Notify => pipeline_toml(
                "fencen",
                "parquet",
                "discovery = \"notify\"\nreconcile_every = 2",
                "max_files_per_batch = 2",
            ),
            Scenario::Windowed => crate::stateful::windowed_toml("fencew")
                .replace("state_partitions = 3", "state_partitions = 2"),
            Scenario::Refused => pipeline_toml("fencer", "parquet", "", "max_files_per_batch = 1"),
            Scenario::Delta => crate::delta::delta_toml("fenced", "max_files_per_batch = 2"),
            Scenario::DeltaEmptyFirst => {
                crate::delta::delta_toml("fencede", "max_files_per_batch = 2")
                    .replace(SQL, crate::delta::FROM_HOUR_2)
            }
            Scenario::Partitioned => {
                crate::partition::partitioned_toml("fencep", "parquet", r#"["tag"]"#)
            }
            Scenario::StaticJoin => crate::statics::join_toml("fencesj"),
            Scenario::Dedup => crate::dedup::dedup_toml(
                "fencedd",
                crate::dedup::ROWS_SQL,
                true,
                "max_files_per_batch = 2\nstate_partitions = 2",
            ),
            Scenario::DeltaComplete => crate::delta::complete_toml(
                "fencedc",
                "max_files_per_batch = 2\nstate_partitions = 2",
            )
            .replace(
                "format = \"delta\"\n",
                "format = \"delta\"\ndelta_checkpoint_interval = 1\n",
            ),
        }
    }

    /// The input before the stale run starts.
    async fn setup(self, root: &Path) {
        match self {
            Scenario::List | Scenario::Ordered => {
                for i in 0..3 {
                    write_csv(root, i);
                }
            }
            Scenario::Notify => {
                let input = root.join("input");
                let files = gen_files(&input, 3, 40);
                let ctx = local_context(&pipeline(root, &self.toml(root)));
                discovery::record_notified(ctx.checkpoint.store(), notified(&files, &input))
                    .await
                    .unwrap();
            }
            Scenario::Windowed => {
                crate::stateful::windowed_input(root);
            }
            Scenario::Refused => {
                let files = gen_files(&root.join("input"), 3, 40);
                std::fs::write(&files[1], b"not parquet at all").unwrap();
            }
            Scenario::Delta
            | Scenario::DeltaComplete
            | Scenario::Partitioned
            | Scenario::DeltaEmptyFirst => {
                gen_files(&root.join("input"), 3, 40);
            }
            Scenario::StaticJoin => {
                crate::statics::join_setup(root);
                gen_files(&root.join("input"), 3, 40);
            }
            Scenario::Dedup => {
                for i in 0..3 {
                    crate::dedup::write_rides(root, i, &crate::dedup::rides(i, 20, 25));
                }
            }
            Scenario::Kinesis => {
                let stream = crate::kinesis::fresh_stream("fence", 2).await;
                std::fs::write(root.join("stream"), &stream).unwrap();
                let records = root.join("produced.jsonl");
                crate::kinesis::put(
                    &stream,
                    &["a", "b", "c"],
                    &crate::kafka::rides(0, 14),
                    &records,
                )
                .await;
            }
            Scenario::Kafka => {
                let topic = crate::kafka::fresh_topic("fence", 2);
                std::fs::write(root.join("topic"), &topic).unwrap();
                let records = root.join("produced.jsonl");
                crate::kafka::produce(&topic, 0, &crate::kafka::rides(0, 9), &records);
                crate::kafka::produce(&topic, 1, &crate::kafka::rides(100, 5), &records);
            }
        }
    }

    /// What the user fixes while the stale run is stopped: the refused
    /// file, rewritten under its key.
    fn fix(self, root: &Path) {
        if self == Scenario::Refused {
            let bytes = sluice_cli::generator::encode(
                &sluice_cli::generator::taxi_batch(1, 40),
                sluice_engine::pipeline::SourceFormat::Parquet,
                None,
            )
            .unwrap();
            let (bad, _) = snapshot(&root.join("input"))
                .into_iter()
                .find(|(k, _)| k.ends_with("trips-000001.parquet"))
                .expect("the refused file");
            std::fs::write(root.join("input").join(bad), bytes).unwrap();
        }
    }

    /// One more file, arriving while the stale run is stopped (the
    /// windowed scenario's expected windows depend on the arrival order,
    /// so it gets none).
    async fn arrive(self, root: &Path) {
        match self {
            Scenario::List | Scenario::Ordered => write_csv(root, 9),
            Scenario::Notify => {
                let input = root.join("input");
                let files = gen_files(&input, 1, 40);
                let ctx = local_context(&pipeline(root, &self.toml(root)));
                discovery::record_notified(ctx.checkpoint.store(), notified(&files, &input))
                    .await
                    .unwrap();
            }
            Scenario::Delta
            | Scenario::DeltaComplete
            | Scenario::Partitioned
            | Scenario::DeltaEmptyFirst
            | Scenario::StaticJoin => {
                gen_files(&root.join("input"), 1, 40);
            }
            Scenario::Dedup => {
                crate::dedup::write_rides(root, 9, &crate::dedup::rides(9, 20, 25));
            }
            Scenario::Kafka => {
                let topic = std::fs::read_to_string(root.join("topic")).unwrap();
                let records = root.join("produced.jsonl");
                crate::kafka::produce(&topic, 1, &crate::kafka::rides(500, 4), &records);
            }
            Scenario::Kinesis => {
                let stream = std::fs::read_to_string(root.join("stream")).unwrap();
                let records = root.join("produced.jsonl");
                crate::kinesis::put(&stream, &["d", "e"], &crate::kafka::rides(500, 4), &records)
                    .await;
            }
            Scenario::Windowed | Scenario::Refused => {}
        }
    }

    /// The committed output as its reader sees it (for the windowed
    /// scenario, the late rows too).
    async fn got(self, root: &Path) -> Vec<String> {
        let sink = root.join("out/sink");
        match self {
            Scenario::List | Scenario::Ordered => {
                manifest_rows(&sink, self.name(), "id, v, twice", "").await
            }
            Scenario::Notify
            | Scenario::Refused
            | Scenario::Kafka
            | Scenario::Kinesis
            | Scenario::Partitioned
            | Scenario::StaticJoin
            | Scenario::Dedup => committed_rows(&sink, self.name()).await,
            // The table as deltalake reads it (DuckDB's delta extension
            // must agree).
            Scenario::Delta | Scenario::DeltaComplete | Scenario::DeltaEmptyFirst => {
                let v = crate::delta::delta_view(&sink, "-").await;
                assert_eq!(v.deltalake, v.duckdb, "the two Delta readers differ");
                v.deltalake
            }
            Scenario::Windowed => {
                let (mut got, _) = crate::stateful::windowed_output(root, self.name(), false).await;
                let (late, _) = crate::stateful::windowed_late(root, false).await;
                got.extend(late.into_iter().map(|r| format!("late {r}")));
                got
            }
        }
    }

    /// What the committed output must be, computed without Sluice from
    /// the input files under `root`.
    async fn want(self, root: &Path) -> Vec<String> {
        match self {
            Scenario::List | Scenario::Ordered => {
                let input = root.join("input");
                let mut files: Vec<PathBuf> = std::fs::read_dir(&input)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .collect();
                files.sort();
                // DuckDB over the CSV files, the malformed lines skipped.
                duckdb_sql(&format!(
                    "SELECT id, v, v * 2 AS twice FROM read_csv([{}], columns = {{'id': \
                     'BIGINT', 'v': 'BIGINT'}}, header = true, ignore_errors = true) WHERE v > 1",
                    quoted(&files)
                ))
                .await
            }
            Scenario::Notify | Scenario::Refused | Scenario::Delta => {
                one_shot_rows(&root.join("input")).await
            }
            // DuckDB's join with the static table over every input file.
            Scenario::StaticJoin => crate::statics::join_want(root).await,
            // DuckDB: each key's first row by arrival, then the query.
            Scenario::Dedup => {
                crate::dedup::forever_want(
                    &crate::stateful::walk(&root.join("input")),
                    crate::dedup::ROWS_SQL,
                )
                .await
            }
            // DuckDB's partitioned query over every input file.
            Scenario::Partitioned => {
                crate::partition::want(&crate::stateful::walk(&root.join("input"))).await
            }
            Scenario::DeltaEmptyFirst => {
                duckdb_rows(
                    &crate::stateful::walk(&root.join("input")),
                    crate::delta::FROM_HOUR_2,
                )
                .await
            }
            // DuckDB's windowed GROUP BY over every input file.
            Scenario::DeltaComplete => {
                crate::delta::windowed_oracle(crate::stateful::walk(&root.join("input"))).await
            }
            // DuckDB over the records as produced, kept by the test.
            Scenario::Kafka => crate::kafka::expected(&root.join("produced.jsonl")).await,
            Scenario::Kinesis => crate::kinesis::expected(&root.join("produced.jsonl")).await,
            Scenario::Windowed => {
                let (_, mut want) = crate::stateful::windowed_output(root, self.name(), true).await;
                let (_, late) = crate::stateful::windowed_late(root, true).await;
                want.extend(late.into_iter().map(|r| format!("late {r}")));
                want
            }
        }
    }
}

/// Input file `i` of the CSV scenario: rows `(i*10 + r, r)`, and a
/// malformed line every file (set aside as a bad row).
fn write_csv(root: &Path, i: u64) {
    let input = root.join("input");
    std::fs::create_dir_all(&input).unwrap();
    let mut text = String::from("id,v\n");
    for r in 0..6 {
        text.push_str(&format!("{},{r}\n", i * 10 + r));
    }
    text.push_str("not-a-number,x\n");
    std::fs::write(input.join(format!("f{i:02}.csv")), text).unwrap();
}

/// Everything under `dir`, with content: the second pipeline's folders
/// must be left exactly as they were.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).into_iter().flatten() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// A second pipeline in the same root, sharing the checkpoint root and
/// nothing else, run once before the stale writer starts.
async fn bystander(root: &Path) -> String {
    let toml = r#"name = "other"
[source]
uri = "other/input"
format = "parquet"
table = "trips"
[query]
sql = "SELECT * FROM trips"
[sink]
uri = "other/sink"
[checkpoint]
uri = "out/checkpoint"
"#
    .to_string();
    gen_files(&root.join("other/input"), 2, 30);
    run(&local_context(&pipeline(root, &toml))).await.unwrap();
    toml
}

fn bystander_files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all = snapshot(&root.join("other"));
    all.extend(
        snapshot(&root.join("out/checkpoint/other"))
            .into_iter()
            .map(|(k, v)| (format!("checkpoint/{k}"), v)),
    );
    all
}

/// After everything: the checkpoint is one consistent history. Control is
/// released; every batch from the history's first to the last committed
/// has a commit record of this history; no plan waits beyond it; the
/// index (list mode) is through the last batch; the totals count every
/// input file once; every Parquet file in the sink is named by a committed
/// record (a manifest, or a record's late rows), and every manifest by a
/// commit of this history.
async fn assert_consistent(root: &Path, s: Scenario, inputs: u64, what: &str) {
    let toml = s.toml(root);
    let ctx = local_context(&pipeline(root, &toml));
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert!(!c.resetting, "{what}: resetting");
    assert_eq!(
        c.status,
        sluice_engine::checkpoint::RunStatus::Idle,
        "{what}: lease held"
    );
    let last = c.last_committed.expect("something committed");
    let mut late_named = Vec::new();
    let mut batches = 0;
    for n in c.first_batch..=last {
        let commit = ctx
            .checkpoint
            .commit(n)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{what}: no commit record of batch {n}"));
        assert_eq!(commit.history, c.history, "{what}: batch {n}'s record");
        if let Some(st) = &commit.stateful {
            late_named.extend(st.late_files.iter().map(|f| f.key.clone()));
        }
        batches += 1;
    }
    assert_eq!(c.totals.batches, batches, "{what}: totals.batches");
    assert_eq!(
        c.totals.files, inputs,
        "{what}: totals.files (last committed {:?}, {} batches, epoch {})",
        c.last_committed, c.totals.batches, c.epoch
    );
    let plans: Vec<String> = ctx
        .checkpoint
        .store()
        .list("offsets/", None)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .filter(|k| k > &format!("offsets/{last:010}.json"))
        .collect();
    assert_eq!(
        plans,
        Vec::<String>::new(),
        "{what}: plans beyond the last commit"
    );
    if matches!(s, Scenario::List | Scenario::Ordered) {
        let (index, _) = ctx.checkpoint.index_of(Some(&c)).await.unwrap();
        assert_eq!(index.through_batch, Some(last), "{what}: index");
        // `ordered` keeps it in control, `list` in its own object.
        assert_eq!(c.index.is_some(), s == Scenario::Ordered, "{what}: {c:?}");
    }
    if s == Scenario::Kafka {
        // Every record produced was read, and control's offsets say so:
        // the end of each partition, counted from what the test produced.
        let mut ends = std::collections::BTreeMap::new();
        let produced = std::fs::read_to_string(root.join("produced.jsonl")).unwrap();
        for line in produced.lines() {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            let p = row["_partition"].as_i64().unwrap() as i32;
            let next = row["_offset"].as_i64().unwrap() + 1;
            let end = ends.entry(p).or_insert(0);
            *end = next.max(*end);
        }
        assert_eq!(c.stream_offsets, ends, "{what}: control's offsets");
    }
    if s == Scenario::Kinesis {
        // Every record put was read, and control's cursors say so: the
        // last record put to each shard, from what the test kept.
        let cursors: std::collections::BTreeMap<String, String> = c
            .stream_shards
            .iter()
            .filter_map(|(id, k)| k.after.clone().map(|a| (id.clone(), a)))
            .collect();
        assert_eq!(
            cursors,
            crate::kinesis::last_put(&root.join("produced.jsonl")),
            "{what}: control's cursors"
        );
    }
    if matches!(
        s,
        Scenario::Delta | Scenario::DeltaComplete | Scenario::DeltaEmptyFirst
    ) {
        // The table's transaction for this history is the last batch, and
        // no part was added twice.
        let app = format!("{}-{}", s.name(), c.history);
        let v = crate::delta::delta_view(&root.join("out/sink"), &app).await;
        assert_eq!(v.txn, Some(last), "{what}: the table's txn version");
        crate::delta::assert_added_once(&v);
    }
    let sink = root.join("out/sink");
    let manifests = manifest_files(&sink, s.name()).await;
    for (n, _, _) in &manifests {
        assert!(
            (c.first_batch..=last).contains(n),
            "{what}: manifest of batch {n}, not of this history ({}..={last})",
            c.first_batch
        );
    }
    let named: Vec<PathBuf> = manifests.into_iter().flat_map(|(_, _, f)| f).collect();
    let unnamed: Vec<String> = ctx
        .sink
        .store()
        .list("", None)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        // (A Delta log checkpoint is log, not output.)
        .filter(|k| {
            !k.starts_with("_sluice/") && !k.starts_with("_delta_log/") && k.ends_with(".parquet")
        })
        .filter(|k| !named.contains(&sink.join(k)) && !late_named.contains(k))
        .collect();
    assert_eq!(
        unnamed,
        Vec::<String>::new(),
        "{what}: files no record names"
    );
}

/// Input files of the scenario under `root` now (a topic has none).
fn input_files(s: Scenario, root: &Path) -> u64 {
    match s {
        Scenario::Kafka | Scenario::Kinesis => 0,
        _ => snapshot(&root.join("input")).len() as u64,
    }
}

/// Run the stale writer to completion without stopping it: how many
/// writes it makes.
async fn count_writes(s: Scenario, stale: Stale) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    s.setup(root).await;
    prepare(s, stale, root);
    let pause = Arc::new(Pause::default());
    let ctx = paused_context(root, &s.toml(root), &pause);
    match stale {
        // The refused scenario's run ends with the refusal.
        Stale::Run if s == Scenario::Refused => {
            run(&ctx).await.unwrap_err();
        }
        Stale::Run => {
            run(&ctx).await.unwrap();
        }
        Stale::Express => {
            let input = claim_express(&local_context(&pipeline(root, &s.toml(root)))).await;
            express(&ctx, input, Some(HELD)).await.unwrap();
        }
        Stale::Reset => {
            run(&local_context(&pipeline(root, &s.toml(root))))
                .await
                .unwrap();
            admin::reset(&ctx).await.unwrap();
        }
    }
    pause.writes.load(Ordering::SeqCst)
}

/// Hold the stale writer at each of its writes in turn; meanwhile let the
/// others go to the end; let it go; run once more; check.
async fn each_write_held(s: Scenario, stale: Stale, meanwhile: Meanwhile) {
    let total = count_writes(s, stale).await;
    assert!(total >= 5, "{s:?}: only {total} writes");
    // The input is the same in every round: the oracle's answer is too.
    let mut expected: Option<Vec<String>> = None;
    eprintln!("fencing {s:?} {stale:?} {meanwhile:?}: holding each of {total} writes");
    for k in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        s.setup(root).await;
        prepare(s, stale, root);
        let other = bystander(root).await;
        let before = bystander_files(root);
        let toml = s.toml(root);
        let local = || local_context(&pipeline(root, &toml));
        if stale == Stale::Reset {
            run(&local()).await.unwrap();
        }
        let pause = Arc::new(Pause {
            at: k,
            ..Pause::default()
        });
        let ctx = paused_context(root, &toml, &pause);
        let input = match stale {
            Stale::Express => Some(claim_express(&local()).await),
            _ => None,
        };
        let duplicate = input.clone();
        let held = tokio::spawn(async move {
            match stale {
                // Whether it was stale when it went on: a reset held
                // before its first write starts when let go, a reset of
                // the history that followed.
                Stale::Run => run(&ctx).await.map(|_| true),
                Stale::Express => express(&ctx, input.unwrap(), Some(HELD))
                    .await
                    .map(|_| true),
                Stale::Reset => admin::reset(&ctx).await.map(|r| r.finished_by_another),
            }
        });
        tokio::time::timeout(std::time::Duration::from_secs(60), pause.reached.notified())
            .await
            .unwrap_or_else(|_| panic!("{s:?}: write {k} of {total} was never reached"));
        let at = pause.held.lock().unwrap().clone().unwrap();
        let what = format!("{s:?} {stale:?} held at write {k} ({at}), {meanwhile:?}");
        s.fix(root);
        // Whether the held writer is the stale one: it is, unless a
        // duplicate of it stopped, leaving the run to it.
        let mut held_is_stale = true;
        match meanwhile {
            Meanwhile::Duplicate => {
                // The duplicate goes to the end (the held execution is
                // held before its first Plan claimed the run), or stops
                // at its first Plan, finding the run claimed by the held
                // one: a conflict, and nothing written (the run is the
                // held one's to finish, or the next run's).
                // (Its writes counted on its own stores: the held
                // execution's other tasks may still write meanwhile.)
                let dup_writes = Arc::new(AtomicU64::new(0));
                let dup = fault_context(root, &toml, dup_writes.clone(), 0);
                // Express may run the same execution twice under one id
                // (a second copy), or start the run twice: both, by
                // scenario.
                let same_id = matches!(s, Scenario::List | Scenario::Windowed | Scenario::Kinesis);
                let input = duplicate.expect("an Express execution's input");
                match express(&dup, input, same_id.then_some(HELD)).await {
                    Ok(()) => {}
                    Err(e) if e.class() == sluice_engine::ErrorClass::Conflict => {
                        eprintln!("{what}: the duplicate stopped: {e}");
                        assert!(
                            e.to_string().contains("Express is at-least-once"),
                            "{what}: the duplicate stopped on something else: {e}"
                        );
                        assert_eq!(
                            dup_writes.load(Ordering::SeqCst),
                            0,
                            "{what}: the duplicate that stopped wrote"
                        );
                        held_is_stale = false;
                    }
                    Err(e) => panic!("{what}: the duplicate execution: {e}"),
                }
                // The held execution's first write is its claim of the
                // run: held there, the duplicate claims the run and runs
                // it; held past it, the duplicate stops.
                assert_eq!(
                    held_is_stale,
                    k == 1,
                    "{what}: the duplicate {}",
                    if held_is_stale {
                        "ran the run the held execution had claimed"
                    } else {
                        "stopped, though the held execution had not claimed the run"
                    }
                );
            }
            Meanwhile::TakeOver => {
                s.arrive(root).await;
                run(&local())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the run taking over: {e}"));
            }
            Meanwhile::Reset => {
                admin::reset(&local())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: reset: {e}"));
                run(&local())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the run after the reset: {e}"));
            }
            Meanwhile::HeldReset => {
                let hold = Arc::new(Pause {
                    at: 1,
                    only: Some("delete"),
                    ..Pause::default()
                });
                let ctx = paused_context(root, &toml, &hold);
                let mut reset = tokio::spawn(async move { admin::reset(&ctx).await });
                // (A reset with nothing to delete, the stale run held
                // before it wrote anything, ends without being held.)
                let ended = tokio::time::timeout(std::time::Duration::from_secs(60), async {
                    tokio::select! {
                        _ = hold.reached.notified() => None,
                        r = &mut reset => Some(r),
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("{what}: the reset never deleted nor ended"));
                pause.release.notify_one();
                let late = tokio::time::timeout(std::time::Duration::from_secs(60), held)
                    .await
                    .unwrap_or_else(|_| panic!("{what}: the stale writer never finished"))
                    .unwrap();
                if let Err(e) = &late {
                    eprintln!("{what}: the stale writer ended with: {e}");
                }
                let reset = match ended {
                    Some(r) => r,
                    None => {
                        hold.release.notify_one();
                        tokio::time::timeout(std::time::Duration::from_secs(60), reset)
                            .await
                            .unwrap_or_else(|_| panic!("{what}: the reset never finished"))
                    }
                };
                reset
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{what}: reset: {e}"));
                run(&local())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the run after the reset: {e}"));
                check_end(s, root, &other, &before, &what, &mut expected).await;
                continue;
            }
        }
        let owner = root.join("out/sink/_sluice/sink.json");
        let owner_before = std::fs::read(&owner).ok();
        pause.release.notify_one();
        let late: sluice_engine::Result<bool> =
            tokio::time::timeout(std::time::Duration::from_secs(60), held)
                .await
                .unwrap_or_else(|_| panic!("{what}: the stale writer never finished"))
                .unwrap();
        if let Err(e) = &late {
            eprintln!("{what}: the stale writer ended with: {e}");
            // It lost its lease: nothing is broken, so nothing may tell the
            // user to restore a backup.
            assert_ne!(
                e.class(),
                sluice_engine::ErrorClass::Fatal,
                "{what}: the stale writer called it broken: {e}"
            );
        }
        // The sink's owner record names the history that followed: a reset
        // or run resumed late must not replace it (a downstream pipeline
        // would refuse the sink as another history's).
        // (A reset held before its first write starts afresh when let go:
        // a reset of the history that followed, which retires it.)
        if !held_is_stale {
            // The duplicate left the run to it: it goes to the end.
            if let Err(e) = &late {
                panic!("{what}: the execution whose duplicate stopped failed: {e}");
            }
        }
        let acted_stale =
            held_is_stale && (late.as_ref().is_ok_and(|stale| *stale) || late.is_err());
        if acted_stale {
            assert_eq!(
                std::fs::read(&owner).ok().map(String::from_utf8),
                owner_before.map(String::from_utf8),
                "{what}: the stale writer changed the sink's owner record"
            );
        }
        run(&local())
            .await
            .unwrap_or_else(|e| panic!("{what}: the last run: {e}"));
        check_end(s, root, &other, &before, &what, &mut expected).await;
    }
}

/// After the last run: the output is the oracle's, the checkpoint and the
/// sink consistent, the other pipeline untouched.
async fn check_end(
    s: Scenario,
    root: &Path,
    other: &str,
    before: &[(String, Vec<u8>)],
    what: &str,
    expected: &mut Option<Vec<String>>,
) {
    let want = match expected {
        // A stream's sequence numbers are new in each setup's stream.
        Some(w) if s != Scenario::Kinesis => w.clone(),
        _ => {
            let w = s.want(root).await;
            assert!(!w.is_empty());
            *expected = Some(w.clone());
            w
        }
    };
    let got = s.got(root).await;
    if got != want {
        let missing: Vec<&String> = want.iter().filter(|r| !got.contains(r)).collect();
        let extra: Vec<&String> = got.iter().filter(|r| !want.contains(r)).collect();
        panic!(
            "{what}: {} rows committed, want {}; missing {missing:?}; extra {extra:?}",
            got.len(),
            want.len()
        );
    }
    assert_consistent(root, s, input_files(s, root), what).await;
    assert_eq!(
        bystander_files(root),
        before,
        "{what}: the other pipeline changed"
    );
    let ctx = local_context(&pipeline(root, other));
    assert_eq!(
        ctx.checkpoint
            .control()
            .await
            .unwrap()
            .unwrap()
            .0
            .totals
            .files,
        2
    );
}

/// Express is at-least-once: a run's execution may run twice at once.
/// One held at each of its writes in turn while its duplicate goes to the
/// end changes nothing when let go.
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicated_express_execution_held_at_any_write_changes_nothing() {
    each_write_held(Scenario::List, Stale::Express, Meanwhile::Duplicate).await;
}

/// Before the first Plan claimed the run for one execution, this failed:
/// held at the publish copy of a part, the duplicate re-ran the batch's
/// merges and published; let go, the held execution's copy added a part
/// of the same epoch's staged keys (250 rows committed, 230 wanted).
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicated_express_execution_of_a_windowed_query_held_at_any_write_changes_nothing() {
    each_write_held(Scenario::Windowed, Stale::Express, Meanwhile::Duplicate).await;
}

/// The first Plan of a copy of an Express execution whose claim landed
/// and whose answer was lost is retried with the same token (drawn before
/// it) and goes on; another copy of the same execution, under the same
/// id, stops before writing, whether its Plan is a first attempt or a
/// retry (the claim rests on the token, not on the retry count).
#[tokio::test(flavor = "multi_thread")]
async fn a_retried_first_plan_keeps_its_claim_and_another_copy_stops() {
    use sluice_engine::handlers::{self, PlanOutcome, PlanRequest, RunState};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    Scenario::List.setup(root).await;
    let toml = Scenario::List.toml(root);
    let ctx = local_context(&pipeline(root, &toml));
    let input = claim_express(&ctx).await;
    let run: RunState = serde_json::from_value(input["run"].clone()).unwrap();
    // The claim's write landed; its answer was lost.
    ctx.checkpoint
        .claim_execution(run.epoch, HELD, "first")
        .await
        .unwrap();
    let plan = |copy: &str, retries: u64| PlanRequest {
        pipeline: ctx.pipeline.name.clone(),
        run: Some(run.clone()),
        retries,
        workflow: sluice_engine::deploy::Workflow::Express,
        started: None,
        execution: Some(HELD.into()),
        copy: Some(copy.into()),
    };
    for retries in [0, 1] {
        let writes = Arc::new(AtomicU64::new(0));
        let counted = fault_context(root, &toml, writes.clone(), 0);
        let e = handlers::handle_plan(&counted, plan("second", retries))
            .await
            .unwrap_err();
        assert_eq!(e.class(), sluice_engine::ErrorClass::Conflict, "{e}");
        assert!(e.to_string().contains("runs twice"), "{e}");
        assert_eq!(writes.load(Ordering::SeqCst), 0, "the second copy wrote");
    }
    let outcome = handlers::handle_plan(&ctx, plan("first", 1)).await.unwrap();
    assert!(
        matches!(outcome, PlanOutcome::Batch { .. }),
        "the claiming copy's retry: {outcome:?}"
    );
}

/// A topic's offsets and a stream's cursors are written to control from
/// what the run read of it: a duplicate must not write them from its own
/// older read.
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicated_express_execution_of_a_kafka_run_held_at_any_write_changes_nothing() {
    each_write_held(Scenario::Kafka, Stale::Express, Meanwhile::Duplicate).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicated_express_execution_of_a_kinesis_run_held_at_any_write_changes_nothing() {
    each_write_held(Scenario::Kinesis, Stale::Express, Meanwhile::Duplicate).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicated_express_execution_into_delta_held_at_any_write_changes_nothing() {
    each_write_held(Scenario::Delta, Stale::Express, Meanwhile::Duplicate).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::List, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::List, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ordered_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::Ordered, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ordered_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::Ordered, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notify_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::Notify, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notify_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::Notify, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_windowed_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::Windowed, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_windowed_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::Windowed, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reset_held_at_any_write_changes_nothing_after_another_reset() {
    each_write_held(Scenario::List, Stale::Reset, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notify_reset_held_at_any_write_changes_nothing_after_another_reset() {
    each_write_held(Scenario::Notify, Stale::Reset, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_abandoning_a_refused_batch_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::Refused, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_abandoning_a_refused_batch_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::Refused, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kafka_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::Kafka, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kafka_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::Kafka, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kinesis_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::Kinesis, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kinesis_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::Kinesis, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::Delta, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::Delta, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_reset_held_at_any_write_changes_nothing_after_another_reset() {
    each_write_held(Scenario::Delta, Stale::Reset, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_complete_delta_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::DeltaComplete, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_complete_delta_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::DeltaComplete, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::Partitioned, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::Partitioned, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_run_whose_first_batch_is_empty_held_at_any_write_changes_nothing_after_a_takeover()
{
    each_write_held(Scenario::DeltaEmptyFirst, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_run_whose_first_batch_is_empty_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::DeltaEmptyFirst, Stale::Run, Meanwhile::Reset).await;
}

/// The race the reset's order closes: a run stopped past its lease is
/// let go while a reset is held at its first delete (after it marked
/// control and listed the sink), publishes its parts and late rows
/// meanwhile, and the reset then goes on: nothing the stale run published
/// survives it (before the fix, a late-rows file published between the
/// reset's listing and its deletes stayed).
#[tokio::test(flavor = "multi_thread")]
async fn a_windowed_run_let_go_while_a_reset_is_held_publishes_nothing_that_survives() {
    each_write_held(Scenario::Windowed, Stale::Run, Meanwhile::HeldReset).await;
}

/// [`a_windowed_run_let_go_while_a_reset_is_held_publishes_nothing_that_survives`]
/// into a Delta table: the stale run's Delta commit, made while the reset
/// is held, does not survive the reset's retirement of the table.
#[tokio::test(flavor = "multi_thread")]
async fn a_delta_run_let_go_while_a_reset_is_held_publishes_nothing_that_survives() {
    each_write_held(Scenario::Delta, Stale::Run, Meanwhile::HeldReset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_static_join_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::StaticJoin, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_static_join_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::StaticJoin, Stale::Run, Meanwhile::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deduplicating_run_held_at_any_write_changes_nothing_after_a_takeover() {
    each_write_held(Scenario::Dedup, Stale::Run, Meanwhile::TakeOver).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deduplicating_run_held_at_any_write_changes_nothing_after_a_reset() {
    each_write_held(Scenario::Dedup, Stale::Run, Meanwhile::Reset).await;
}
