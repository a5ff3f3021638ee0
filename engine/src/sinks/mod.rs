//! Sinks: where a batch's rows go, and how a batch's output becomes
//! visible to readers: [`ParquetSink`] (Parquet parts plus a manifest per
//! committed batch), and, with `sink.format = "delta"`, the same parts
//! also committed to a Delta table (`sinks::delta`) as the last publish step.

pub(crate) mod delta;
pub use delta::DeltaSettings;
mod parquet;

pub use parquet::ParquetSink;
pub(crate) use parquet::{Checked, delta_check, partition_check, record_files};
