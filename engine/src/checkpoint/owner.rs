//! Who holds a lease, as written in `control.json`'s `owner`: a local
//! process (`local:<host>:<pid>`), a Lambda function (`lambda:<log
//! stream>`) or a Step Functions execution (`sfn:<execution name>`). Only
//! a local process on this host can be seen to have exited; every other
//! owner's lease ends by release or by its TTL (an execution's also when
//! Step Functions says it ended).

use std::fmt;

/// A lease owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A process of `sluice run` (or a test) on `host`.
    Local {
        /// Host name.
        host: String,
        /// Process id.
        pid: u32,
    },
    /// A Lambda function instance, by its log stream.
    Lambda(String),
    /// A Step Functions execution, by its name (`<pipeline>-<epoch>`).
    Execution(String),
    /// Anything else (written by another tool or a later version).
    Other(String),
}

const LOCAL: &str = "local:";
const LAMBDA: &str = "lambda:";
const EXECUTION: &str = "sfn:";

impl Owner {
    /// This process, as a local owner.
    pub(crate) fn this_process() -> Owner {
        Owner::Local {
            host: hostname(),
            pid: std::process::id(),
        }
    }

    /// The owner an `owner` field names.
    pub fn parse(s: &str) -> Owner {
        if let Some(rest) = s.strip_prefix(LOCAL)
            && let Some((host, pid)) = rest.rsplit_once(':')
            && let Ok(pid) = pid.parse()
        {
            return Owner::Local {
                host: host.to_string(),
                pid,
            };
        }
        if let Some(stream) = s.strip_prefix(LAMBDA) {
            return Owner::Lambda(stream.to_string());
        }
        if let Some(name) = s.strip_prefix(EXECUTION) {
            return Owner::Execution(name.to_string());
        }
        Owner::Other(s.to_string())
    }

    /// Whether this owner is known to have exited: a local process on this
    /// host that no longer exists. Other owners are never known to be gone
    /// (their lease expires).
    pub fn gone(&self) -> bool {
        match self {
            Owner::Local { host, pid } if *host == hostname() && *pid != std::process::id() => {
                !std::path::Path::new(&format!("/proc/{pid}")).exists()
            }
            _ => false,
        }
    }

    /// The execution's name, if this owner is a Step Functions execution.
    pub fn execution(&self) -> Option<&str> {
        match self {
            Owner::Execution(name) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Local { host, pid } => write!(f, "{LOCAL}{host}:{pid}"),
            Owner::Lambda(stream) => write!(f, "{LAMBDA}{stream}"),
            Owner::Execution(name) => write!(f, "{EXECUTION}{name}"),
            Owner::Other(s) => f.write_str(s),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_round_trip() {
        for o in [
            Owner::Local {
                host: "h:x".into(),
                pid: 7,
            },
            Owner::Lambda("2026/12/01/[$LATEST]ab".into()),
            Owner::Execution("taxi-3".into()),
            Owner::Other("someone".into()),
        ] {
            assert_eq!(Owner::parse(&o.to_string()), o);
        }
        assert_eq!(Owner::parse("sfn:taxi-3").execution(), Some("taxi-3"));
        assert!(!Owner::this_process().gone());
        assert!(!Owner::Lambda("x".into()).gone());
    }
}
