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
//! Modules follow the data flow: [`pipeline`] (the spec), [`storage`] (the
//! object-store seam), [`discovery`], [`checkpoint`] (records and protocol
//! decisions), [`planning`], [`operators`], [`sinks`], [`handlers`] (the
//! steps, shared by the local runner and Lambda), [`triggers`] (events to
//! runs: routing and the lease protocol), [`runner`] (the local
//! state machine interpreter) and, with the `lambda` feature, `functions`
//! (the glue of the Lambda binaries).

pub mod checkpoint;
pub mod discovery;
pub mod error;
#[cfg(feature = "lambda")]
pub mod functions;
pub mod generator;
pub mod handlers;
pub mod operators;
pub mod paths;
pub mod pipeline;
pub mod planning;
pub mod runner;
pub mod sinks;
pub mod storage;
pub mod triggers;

pub use error::{Error, ErrorClass, Result};
