//! Errors of the engine, each with a class that says what a caller should do.

use std::fmt;

/// What a caller (the local runner, a Step Functions Retry/Catch) should do
/// with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ErrorClass {
    /// Transient: the same call may succeed if retried (network, throttling).
    Retryable,
    /// Another run owns the pipeline, or a racing writer won: stop, write nothing.
    Conflict,
    /// The user's data or pipeline spec is wrong: fix it, then run again.
    InvalidInput,
    /// A bug or a broken invariant: needs a person.
    Fatal,
}

impl ErrorClass {
    /// The name reported to Step Functions and matched by Retry/Catch clauses.
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Retryable => "Sluice.Retryable",
            ErrorClass::Conflict => "Sluice.Conflict",
            ErrorClass::InvalidInput => "Sluice.InvalidInput",
            ErrorClass::Fatal => "Sluice.Fatal",
        }
    }

    /// The class a Step Functions error name reports, if it is one of
    /// Sluice's.
    pub fn from_name(name: &str) -> Option<ErrorClass> {
        [
            ErrorClass::Retryable,
            ErrorClass::Conflict,
            ErrorClass::InvalidInput,
            ErrorClass::Fatal,
        ]
        .into_iter()
        .find(|c| c.name() == name)
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error of the storage seam.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The request could not be completed; retrying may help.
    #[error("storage {op} {location}: {message}")]
    Transient {
        op: &'static str,
        location: String,
        message: String,
    },
    /// The request was refused for a reason a retry will not fix.
    #[error("storage {op} {location}: {message}")]
    Permanent {
        op: &'static str,
        location: String,
        message: String,
    },
}

impl StoreError {
    /// The class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            StoreError::Transient { .. } => ErrorClass::Retryable,
            StoreError::Permanent { .. } => ErrorClass::Fatal,
        }
    }
}

/// Any error of the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pipeline file is malformed or refers to something that cannot work.
    #[error("{file}: {message}")]
    Spec { file: String, message: String },
    /// The pipeline's SQL does not plan against the source schema.
    #[error("pipeline \"{pipeline}\": query does not plan: {message}")]
    Sql { pipeline: String, message: String },
    /// The pipeline changed in a way that would corrupt its checkpoint.
    #[error("pipeline \"{pipeline}\": {message}")]
    Incompatible { pipeline: String, message: String },
    /// An input file could not be read or does not match the source schema.
    #[error(
        "pipeline \"{pipeline}\"{}: input {key}: {message}",
        .batch.map(|b| format!(", batch {b}")).unwrap_or_default()
    )]
    Input {
        pipeline: String,
        /// The batch that read it (`None`: found while planning, before
        /// any batch).
        batch: Option<u64>,
        key: String,
        message: String,
    },
    /// Another run owns the pipeline or won a race.
    #[error("pipeline \"{pipeline}\": {message}")]
    Conflict { pipeline: String, message: String },
    /// A step of a run met a context built from another spec than the one
    /// the run was planned under (the pipeline was registered again).
    #[error(
        "pipeline \"{pipeline}\": this run was planned under spec {run}, but this step's \
         context holds spec {here} (the pipeline was registered again); the run stops and the \
         next run continues under the registered spec"
    )]
    StaleSpec {
        pipeline: String,
        run: String,
        here: String,
    },
    /// A checkpoint object is unreadable or inconsistent.
    #[error("pipeline \"{pipeline}\": checkpoint object {key}: {message}")]
    Checkpoint {
        pipeline: String,
        key: String,
        message: String,
    },
    /// A batch (or one task of it) failed for a reason not tied to one
    /// input file.
    #[error(
        "pipeline \"{pipeline}\", batch {batch}{}: {message}",
        .task.map(|t| format!(", task {t}")).unwrap_or_default()
    )]
    Execution {
        pipeline: String,
        batch: u64,
        task: Option<u32>,
        message: String,
        class: ErrorClass,
    },
    /// A step failed for a reason that concerns no batch (a payload that
    /// does not fit, a request for another pipeline).
    #[error("pipeline \"{pipeline}\": {message}")]
    Run {
        pipeline: String,
        message: String,
        class: ErrorClass,
    },
    /// A call to another service (Step Functions) failed.
    #[error("{service}: {message}")]
    Service {
        service: &'static str,
        message: String,
        class: ErrorClass,
    },
    /// The storage seam failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// The class of this error, which decides retry, release or stop.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Spec { .. } | Error::Sql { .. } | Error::Incompatible { .. } => {
                ErrorClass::InvalidInput
            }
            Error::Input { .. } => ErrorClass::InvalidInput,
            Error::Conflict { .. } | Error::StaleSpec { .. } => ErrorClass::Conflict,
            Error::Checkpoint { .. } => ErrorClass::Fatal,
            Error::Execution { class, .. }
            | Error::Run { class, .. }
            | Error::Service { class, .. } => *class,
            Error::Store(e) => e.class(),
        }
    }
}

/// Result with the engine's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_only_what_the_error_concerns() {
        let run = Error::Run {
            pipeline: "taxi".into(),
            message: "m".into(),
            class: ErrorClass::Fatal,
        };
        assert_eq!(run.to_string(), "pipeline \"taxi\": m");
        let batch = Error::Execution {
            pipeline: "taxi".into(),
            batch: 3,
            task: None,
            message: "m".into(),
            class: ErrorClass::Retryable,
        };
        assert_eq!(batch.to_string(), "pipeline \"taxi\", batch 3: m");
        let task = Error::Execution {
            pipeline: "taxi".into(),
            batch: 3,
            task: Some(0),
            message: "m".into(),
            class: ErrorClass::Retryable,
        };
        assert_eq!(task.to_string(), "pipeline \"taxi\", batch 3, task 0: m");
    }
}
