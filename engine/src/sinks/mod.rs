//! Sinks: where a batch's rows go, and how a batch's output becomes
//! visible to readers. One today: [`ParquetSink`] (Parquet parts plus a
//! manifest per committed batch).

mod parquet;

pub use parquet::ParquetSink;
