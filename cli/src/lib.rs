//! Parts of the `sluice` command that its tests and benchmarks share: the
//! sample-data generator. Kept out of the engine, so the Lambda functions
//! do not link it.

pub mod generator;
