//! End-to-end tests of Sluice: the engine through its public seams, the
//! `sluice` binary as a child process, S3 on a moto server on loopback, and
//! DuckDB as an outside reader. Run with tests/run.sh (it starts moto).

mod support;

mod bad_input;
mod bad_rows;
mod chained;
mod checkpoint;
mod claim_model;
mod cli;
mod contexts;
mod crash;
mod dedup;
mod delta;
mod delta_source;
mod equivalence;
mod fencing;
mod golden;
mod idle;
mod kafka;
mod kinesis;
mod lease_model;
mod metrics;
mod notify;
mod partition;
mod quarantine;
mod requests;
mod s3;
mod schema;
mod schema_change;
mod sink;
mod stagger;
mod stateful;
mod statics;
mod storage_contract;
mod trigger_storm;
mod triggers;
mod tune;
mod usage;
