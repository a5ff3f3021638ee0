//! Sluice engine: continuous SQL over files landing in object storage, run
//! as short AvailableNow micro-batch runs with an exactly-once checkpoint.
//!
//! ```text
//!  event ──> plan ───────────────> operate (per task) ──> commit ──┐
//!            │ control.json  CAS    │ DataFusion SQL        │ commits/N   create-only
//!            │ discovery   (list)   │ over the batch's      │ manifest N  (sink)
//!            │ offsets/N   create   │ files only            │ index, control.json CAS
//!            └─<───────────── loop while planned batches remain ─────────┘
//!                                   then release the lease
//! ```
//!
//! Modules follow the data flow, and each imports only from the ones
//! before it (a test checks this):
//!
//! 1. [`error`], [`hash`] (stable FNV-1a), [`paths`] (every key, built and
//!    parsed);
//! 2. [`storage`]: the object-store seam (local, memory, S3), request
//!    counting, bounded fan-out;
//! 3. [`pipeline`]: the spec, its parser and its source schema;
//! 4. [`checkpoint`]: records, the lease's pure decisions, owners, and the
//!    thin layer that reads and writes them;
//! 5. [`discovery`] (listing; notify inbox and claims), [`planning`]
//!    (batches and tasks), [`sinks`] (Parquet parts and manifests);
//! 6. [`operators`]: the SQL of one task over exactly its files;
//! 7. `state`: a stateful query's rules between batches (its shape, the
//!    watermark, the merge of a state partition);
//! 8. [`handlers`]: the steps of a run (plan, operate, merge, commit),
//!    shared by the local runner and the Lambda functions;
//! 9. [`admin`] (register, show, history, pause, cancel) and [`triggers`]
//!    (events to runs: routing and the lease protocol's trigger side);
//! 10. [`runner`] (the local state machine interpreter) and, with the
//!     `lambda` feature, `functions` (the glue of the Lambda binaries).

pub mod admin;
pub mod checkpoint;
pub mod cost;
pub mod deploy;
pub mod discovery;
pub mod error;
#[cfg(feature = "lambda")]
pub mod functions;
pub mod handlers;
pub mod hash;
pub mod metrics;
pub mod operators;
pub mod paths;
pub mod pipeline;
pub mod planning;
mod process;
pub mod runner;
pub mod sinks;
mod state;
pub mod storage;
pub mod triggers;
pub mod tune;

pub use error::{Error, ErrorClass, Result};

#[cfg(test)]
mod layering {
    //! The modules' imports point one way, down the data flow.

    /// Each module with its layer: a module may import from lower layers
    /// and its own.
    const LAYERS: &[(&str, u32)] = &[
        ("error", 0),
        ("hash", 0),
        ("deploy", 0),
        ("process", 1),
        ("paths", 1),
        ("storage", 2),
        ("pipeline", 3),
        ("checkpoint", 4),
        ("cost", 5),
        ("planning", 5),
        ("sinks", 5),
        ("discovery", 6),
        ("metrics", 6),
        ("tune", 6),
        ("operators", 7),
        ("state", 8),
        ("handlers", 9),
        ("admin", 10),
        ("triggers", 10),
        ("runner", 11),
        ("functions", 11),
    ];

    fn layer(module: &str) -> u32 {
        LAYERS
            .iter()
            .find(|(m, _)| *m == module)
            .unwrap_or_else(|| panic!("module {module} has no layer: add it to LAYERS"))
            .1
    }

    /// `crate::<module>` references in the code (comments left out) of one
    /// file.
    fn imports(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or_default();
            let mut rest = code;
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
        }
        out
    }

    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    #[test]
    fn imports_point_down_the_data_flow() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        files(&src, &mut all);
        let mut wrong = Vec::new();
        for path in &all {
            let rel = path.strip_prefix(&src).unwrap();
            let module = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string();
            if module == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(path).unwrap();
            for used in imports(&text) {
                if used != module && layer(&used) >= layer(&module) {
                    wrong.push(format!("{} imports crate::{used}", rel.display()));
                }
            }
        }
        wrong.sort();
        wrong.dedup();
        assert!(
            wrong.is_empty(),
            "imports against the data flow:\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn the_check_finds_an_upward_import() {
        // The negative control: an upward reference is seen.
        assert_eq!(
            imports("use crate::handlers::Context; // crate::x"),
            ["handlers"]
        );
        assert!(layer("handlers") >= layer("checkpoint"));
    }
}
