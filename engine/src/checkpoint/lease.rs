//! The run lease's decisions: pure functions of the control record read,
//! the time, and what the caller knows of the holder. The I/O around them
//! (reads, compare-and-swap) is the handlers' and the triggers'; the model
//! test `tests/e2e/lease_model.rs` drives these very functions.

use super::records::{Control, RunStatus};

/// What a run may do with the lease, given the control record it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Take the lease with this epoch; `recover` when the previous holder
    /// died and may have left a batch planned or committed but not recorded.
    Take {
        /// The new epoch.
        epoch: u64,
        /// The previous holder died holding the lease.
        recover: bool,
    },
    /// Another run holds a live lease.
    Busy {
        /// Its owner.
        owner: String,
        /// Milliseconds since its last heartbeat.
        heartbeat_age_ms: i64,
    },
}

/// Decide whether a run may take the lease. `owner_gone` is the caller's
/// knowledge that the holder has exited (a local process that no longer
/// exists); otherwise only an expired heartbeat frees a running lease.
pub fn decide_claim(
    control: Option<&Control>,
    now_ms: i64,
    ttl_ms: i64,
    owner_gone: bool,
) -> Claim {
    let Some(c) = control else {
        return Claim::Take {
            epoch: 1,
            recover: false,
        };
    };
    match c.status {
        RunStatus::Idle => Claim::Take {
            epoch: c.epoch + 1,
            recover: false,
        },
        RunStatus::Running => {
            let age = now_ms - c.heartbeat_ms.unwrap_or(i64::MIN / 2);
            if owner_gone || age > ttl_ms {
                Claim::Take {
                    epoch: c.epoch + 1,
                    recover: true,
                }
            } else {
                Claim::Busy {
                    owner: c.owner.clone().unwrap_or_default(),
                    heartbeat_age_ms: age,
                }
            }
        }
    }
}

/// The control record after `owner` claims the lease with `epoch` (a run's
/// own claim, or a trigger's on behalf of the execution it starts): running,
/// fresh heartbeat, and `requested` cleared, since the claimant's discovery
/// comes after it.
pub fn claimed(
    before: Option<&Control>,
    epoch: u64,
    owner: &str,
    now_ms: i64,
    spec_hash: &str,
) -> Control {
    let mut next = before
        .cloned()
        .unwrap_or_else(|| Control::new(spec_hash.to_string()));
    // A holder that died may have left batches planned or committed and
    // not recorded: whoever runs under the new epoch looks for them.
    next.resume |= next.status == RunStatus::Running;
    if next.history.is_empty() {
        // When and by whom the checkpoint was first claimed: distinct for
        // every checkpoint a pipeline ever has.
        next.history = format!(
            "{now_ms:x}-{:08x}",
            crate::hash::fnv1a(owner.as_bytes()) as u32
        );
    }
    next.status = RunStatus::Running;
    next.epoch = epoch;
    next.owner = Some(owner.to_string());
    next.heartbeat_ms = Some(now_ms);
    next.requested = false;
    next
}

/// What a run with nothing left to do swaps into control: the lease given
/// back (`Idle`), or, when a trigger set `requested` since the run's last
/// discovery, only the flag cleared; then the run discovers once more
/// (`true`). So every file that existed when a trigger returned is seen by
/// a discovery that started after it. A paused pipeline's run ends
/// whatever was asked: the request waits for `sluice resume`.
pub fn end_of_run(control: &Control, now_ms: i64, spec_hash: &str) -> (Control, bool) {
    let mut next = control.clone();
    // A run ends only with nothing planned left.
    next.resume = false;
    // Paused: the run ends and a request stays for `sluice resume`.
    if control.requested && !control.paused {
        next.requested = false;
        (next, true)
    } else {
        next.status = RunStatus::Idle;
        next.heartbeat_ms = Some(now_ms);
        next.spec_hash = spec_hash.to_string();
        (next, false)
    }
}

/// The control record after a trigger asks the running lease holder to look
/// again.
pub fn requested(control: &Control) -> Control {
    let mut next = control.clone();
    next.requested = true;
    next
}

/// What the first Plan of copy `copy` of execution `id` does with the run
/// of `epoch` a trigger started on Express (see [`Control::execution`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutionClaim {
    /// No copy claimed the run yet: write this control, then go on.
    Claim(Box<Control>),
    /// This copy claimed it in an earlier attempt of the same Plan (a
    /// retry keeps the token; so does a claim whose write succeeded and
    /// whose answer was lost).
    Ours,
    /// Another execution of the same run, or another copy of this one,
    /// claimed it. The message says which; this one stops without writing.
    Duplicate(String),
}

/// Decide [`ExecutionClaim`] from `control`, which the run of `epoch`
/// holds (the caller checked).
pub fn decide_execution(control: &Control, epoch: u64, id: &str, copy: &str) -> ExecutionClaim {
    match control.execution.as_ref().filter(|e| e.epoch == epoch) {
        None => {
            let mut next = control.clone();
            next.execution = Some(super::records::RunExecution {
                epoch,
                id: id.to_string(),
                copy: copy.to_string(),
            });
            ExecutionClaim::Claim(Box::new(next))
        }
        Some(e) if e.copy == copy => ExecutionClaim::Ours,
        Some(e) if e.id == id => ExecutionClaim::Duplicate(format!(
            "execution {id} runs twice (Express is at-least-once): the run of epoch {epoch} is \
             its other copy's ({}); this copy ({copy}) stops without writing",
            e.copy
        )),
        Some(e) => ExecutionClaim::Duplicate(format!(
            "the run of epoch {epoch} is execution {}'s; this one ({id}) is a duplicate of it \
             (Express is at-least-once) and stops without writing",
            e.id
        )),
    }
}

/// Whether the holder of `epoch` still owns the lease described by `control`.
pub fn owns(control: &Control, epoch: u64) -> bool {
    control.status == RunStatus::Running && control.epoch == epoch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(status: RunStatus, epoch: u64, heartbeat_ms: i64) -> Control {
        Control {
            status,
            epoch,
            owner: Some("a".into()),
            heartbeat_ms: Some(heartbeat_ms),
            ..Control::new("h".into())
        }
    }

    #[test]
    fn claim_decisions() {
        assert_eq!(
            decide_claim(None, 0, 10, false),
            Claim::Take {
                epoch: 1,
                recover: false
            }
        );
        let idle = control(RunStatus::Idle, 4, 0);
        assert_eq!(
            decide_claim(Some(&idle), 1_000, 10, false),
            Claim::Take {
                epoch: 5,
                recover: false
            }
        );
        let live = control(RunStatus::Running, 4, 1_000);
        assert!(matches!(
            decide_claim(Some(&live), 1_005, 10, false),
            Claim::Busy {
                heartbeat_age_ms: 5,
                ..
            }
        ));
        assert_eq!(
            decide_claim(Some(&live), 1_011, 10, false),
            Claim::Take {
                epoch: 5,
                recover: true
            }
        );
        assert_eq!(
            decide_claim(Some(&live), 1_005, 10, true),
            Claim::Take {
                epoch: 5,
                recover: true
            }
        );
        assert!(owns(&live, 4));
        assert!(!owns(&live, 3));
        assert!(!owns(&idle, 4));
    }
    /// One copy of one execution of an Express run claims it; its own
    /// retries go on; another execution, or another copy of the same
    /// execution, stops; a claim of an earlier epoch is no claim.
    #[test]
    fn execution_claims() {
        let live = control(RunStatus::Running, 4, 0);
        let ExecutionClaim::Claim(claimed) = decide_execution(&live, 4, "x", "c1") else {
            panic!("an unclaimed run is claimed");
        };
        assert_eq!(
            claimed.execution,
            Some(super::super::records::RunExecution {
                epoch: 4,
                id: "x".into(),
                copy: "c1".into(),
            })
        );
        assert_eq!(
            decide_execution(&claimed, 4, "x", "c1"),
            ExecutionClaim::Ours
        );
        for (id, copy, says) in [
            ("y", "c2", "is a duplicate of it"),
            ("x", "c2", "runs twice"),
        ] {
            assert!(
                matches!(
                    decide_execution(&claimed, 4, id, copy),
                    ExecutionClaim::Duplicate(m) if m.contains(says) && m.contains("stops without writing")
                ),
                "{id} {copy}"
            );
        }
        let next_run = Control {
            epoch: 5,
            ..(*claimed).clone()
        };
        assert!(matches!(
            decide_execution(&next_run, 5, "y", "c2"),
            ExecutionClaim::Claim(c) if c.execution.as_ref().is_some_and(|e| e.epoch == 5 && e.copy == "c2")
        ));
    }
}
