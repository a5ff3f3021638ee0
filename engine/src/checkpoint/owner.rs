//! Who holds a lease, as written in `control.json`'s `owner`: a local
//! process (`local:<host>:<pid>/<namespace>/<start>`), a Lambda function
//! (`lambda:<log stream>`) or a Step Functions execution (`sfn:<execution
//! name>`). A local process is identified by its host, pid, a hash of the
//! boot id and pid namespace it runs in, and its start time, so a process
//! in another container with the same host name, or a later process that
//! reuses the pid, is never taken for it. Only a local process in this
//! host's boot and pid namespace can be seen to have exited; every other
//! owner's lease ends by release or by its TTL (an execution's also when
//! Step Functions says it ended). An Express execution
//! (`sfn-express:<name>@<claimed ms>`) cannot be asked (no
//! DescribeExecution): it has ended once its 5-minute limit (and a margin
//! for clocks) has passed since its lease was claimed for it.

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
        /// Which process with that pid: `<namespace>/<start time>`, where
        /// the namespace hashes the boot id and pid namespace. `None` in
        /// owners written before it was recorded (checked by TTL only).
        instance: Option<String>,
    },
    /// A Lambda function instance, by its log stream.
    Lambda(String),
    /// A Step Functions execution, by its name (`<pipeline>-<epoch>`).
    Execution(String),
    /// An Express execution, by its name, and when its lease was claimed
    /// (ms since the Unix epoch), before it started.
    Express {
        /// `<pipeline>-<epoch>`.
        name: String,
        /// When the trigger claimed the lease for it.
        claimed_ms: i64,
    },
    /// Anything else (written by another tool or a later version).
    Other(String),
}

const LOCAL: &str = "local:";
const LAMBDA: &str = "lambda:";
const EXECUTION: &str = "sfn:";
const EXPRESS: &str = "sfn-express:";

/// How long after its claim an Express execution has certainly ended: its
/// 5-minute limit, and a minute for the clocks of the trigger that
/// claimed it and the one that reads the claim.
pub const EXPRESS_ENDED_AFTER_MS: i64 = crate::deploy::EXPRESS_LIMIT_MS + 60_000;

impl Owner {
    /// This process, as a local owner.
    pub(crate) fn this_process() -> Owner {
        let pid = std::process::id();
        Owner::Local {
            host: hostname(),
            pid,
            instance: Some(format!(
                "{}/{}",
                crate::process::namespace(),
                crate::process::start_time(pid).unwrap_or_default()
            )),
        }
    }

    /// The owner an `owner` field names.
    pub fn parse(s: &str) -> Owner {
        if let Some(rest) = s.strip_prefix(LOCAL)
            && let Some((host, process)) = rest.rsplit_once(':')
        {
            let (pid, instance) = match process.split_once('/') {
                Some((pid, instance)) => (pid, Some(instance.to_string())),
                None => (process, None),
            };
            if let Ok(pid) = pid.parse() {
                return Owner::Local {
                    host: host.to_string(),
                    pid,
                    instance,
                };
            }
        }
        if let Some(stream) = s.strip_prefix(LAMBDA) {
            return Owner::Lambda(stream.to_string());
        }
        if let Some(name) = s.strip_prefix(EXECUTION) {
            return Owner::Execution(name.to_string());
        }
        if let Some((name, claimed)) = s
            .strip_prefix(EXPRESS)
            .and_then(|rest| rest.rsplit_once('@'))
            && let Ok(claimed_ms) = claimed.parse()
        {
            return Owner::Express {
                name: name.to_string(),
                claimed_ms,
            };
        }
        Owner::Other(s.to_string())
    }

    /// Whether this owner is known to have exited at `now_ms`: an Express
    /// execution past its limit since its claim, or what [`Owner::gone`]
    /// says.
    pub fn gone_at(&self, now_ms: i64) -> bool {
        match self {
            Owner::Express { claimed_ms, .. } => now_ms - claimed_ms > EXPRESS_ENDED_AFTER_MS,
            _ => self.gone(),
        }
    }

    /// Whether this owner is known to have exited: a local process on this
    /// host that no longer exists, or an Express execution past its limit
    /// now. Other owners are never known to be gone (their lease expires).
    pub fn gone(&self) -> bool {
        if let Owner::Express { .. } = self {
            return self.gone_at(chrono::Utc::now().timestamp_millis());
        }
        let Owner::Local {
            host,
            pid,
            instance: Some(instance),
        } = self
        else {
            return false;
        };
        let Some((ns, start)) = instance.split_once('/') else {
            return false;
        };
        if *host != hostname() || ns != crate::process::namespace() {
            // Another machine, boot or container: its processes cannot be
            // seen from here.
            return false;
        }
        // Gone if no process has the pid, or the one that has it started
        // at another time (the pid was reused).
        crate::process::start_time(*pid).is_none_or(|t| t.to_string() != start)
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
            Owner::Local {
                host,
                pid,
                instance: None,
            } => write!(f, "{LOCAL}{host}:{pid}"),
            Owner::Local {
                host,
                pid,
                instance: Some(i),
            } => write!(f, "{LOCAL}{host}:{pid}/{i}"),
            Owner::Lambda(stream) => write!(f, "{LAMBDA}{stream}"),
            Owner::Execution(name) => write!(f, "{EXECUTION}{name}"),
            Owner::Express { name, claimed_ms } => write!(f, "{EXPRESS}{name}@{claimed_ms}"),
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
                instance: None,
            },
            Owner::Local {
                host: "h".into(),
                pid: 7,
                instance: Some("0123456789abcdef/42".into()),
            },
            Owner::Lambda("2026/12/01/[$LATEST]ab".into()),
            Owner::Execution("taxi-3".into()),
            Owner::Express {
                name: "taxi-4".into(),
                claimed_ms: 1_000,
            },
            Owner::Other("someone".into()),
        ] {
            assert_eq!(Owner::parse(&o.to_string()), o);
        }
        // An Express execution has ended 6 minutes after its claim (its 5
        // and one for clocks), not before; an owner string without a claim
        // time is someone else's.
        let express = Owner::parse("sfn-express:taxi-4@1000");
        assert!(!express.gone_at(1_000 + 360_000));
        assert!(express.gone_at(1_000 + 360_001));
        assert_eq!(express.execution(), None);
        assert_eq!(
            Owner::parse("sfn-express:taxi-4"),
            Owner::Other("sfn-express:taxi-4".into())
        );
        assert_eq!(Owner::parse("sfn:taxi-3").execution(), Some("taxi-3"));
        assert!(!Owner::this_process().gone());
        assert!(!Owner::Lambda("x".into()).gone());
    }

    /// The review's case: a run in another pid namespace on the same host
    /// (a container with the host's name) took a live lease at once,
    /// because the owner's pid was absent there. Only an owner of this
    /// boot and namespace is checked; a reused pid is told apart by its
    /// start time; an owner that cannot be checked falls back to the TTL.
    #[test]
    fn only_owners_that_can_be_checked_are_ever_gone() {
        let Owner::Local {
            host,
            pid,
            instance: Some(instance),
        } = Owner::this_process()
        else {
            panic!("a local owner");
        };
        let (ns, start) = instance.split_once('/').unwrap();
        let absent = 4_999_999; // above any pid_max
        let local = |pid: u32, instance: Option<String>| Owner::Local {
            host: host.clone(),
            pid,
            instance,
        };
        // Another container: its pid is absent here, yet it may be alive.
        assert!(!local(absent, Some(format!("ffffffffffffffff/{start}"))).gone());
        assert!(!local(pid, Some("ffffffffffffffff/1".into())).gone());
        // Written before instances were recorded: TTL only.
        assert!(!local(absent, None).gone());
        // Another host.
        let other_host = Owner::Local {
            host: format!("{host}-elsewhere"),
            pid: absent,
            instance: Some(format!("{ns}/1")),
        };
        assert!(!other_host.gone());
        // This namespace: an exited process, and a reused pid, are gone.
        assert!(local(absent, Some(format!("{ns}/1"))).gone());
        let reused = start.parse::<u64>().unwrap() + 1;
        assert!(local(pid, Some(format!("{ns}/{reused}"))).gone());
        assert!(!local(pid, Some(instance.clone())).gone());
    }
}
