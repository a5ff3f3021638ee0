//! The lease and request-flag protocol, checked exhaustively: every
//! interleaving of two or three triggers (upload a file, read control,
//! claim or request by compare-and-swap) with the runs they start (discover,
//! commit, read control, release or look again), including a lease that
//! expires under a slow run that keeps going (a zombie). The decisions are
//! the engine's own pure functions (`triggers::decide_wake`,
//! `checkpoint::decide_claim` for a `sluice run` claiming on its own,
//! `checkpoint::claimed`, `checkpoint::requested`, `checkpoint::end_of_run`);
//! the model supplies only atomic reads and compare-and-swap on a versioned
//! control record, as S3 conditional writes do.
//!
//! Checked in every reachable state: never two live owners; a run commits
//! only while it owns the lease (a zombie is fenced); no file is committed
//! twice. Checked in every final state: every file whose trigger returned is
//! committed, and the lease is idle.

use std::collections::HashSet;

use sluice_engine::checkpoint::{
    Claim, Control, RunStatus, claimed, decide_claim, end_of_run, requested,
};
use sluice_engine::triggers::{Wake, decide_wake};

const TTL: i64 = 10;

// Model states are cloned and hashed, never stored in bulk: size is no concern.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Trig {
    Upload,
    Read,
    Decide { seen: Option<Control>, version: u32 },
    Returned,
}

/// A `sluice run` started by hand: its own claim in the plan step's
/// `start` (read control, `decide_claim`, `claimed` by compare-and-swap).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Local {
    Read,
    Decide { seen: Option<Control>, version: u32 },
    Done,
}

#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum RunPc {
    Discover,
    Commit { found: u8 },
    Read,
    End { seen: Control, version: u32 },
    Stopped,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Run {
    epoch: u64,
    pc: RunPc,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct State {
    control: Option<Control>,
    version: u32,
    /// The clock: 0 until the lease expires once, then past the TTL.
    now: i64,
    uploaded: u8,
    committed: u8,
    commits_per_file: [u8; 3],
    triggers: Vec<Trig>,
    locals: Vec<Local>,
    runs: Vec<Run>,
}

impl State {
    fn new(triggers: usize, locals: usize) -> State {
        State {
            control: None,
            version: 0,
            now: 0,
            uploaded: 0,
            committed: 0,
            commits_per_file: [0; 3],
            triggers: vec![Trig::Upload; triggers],
            locals: vec![Local::Read; locals],
            runs: Vec::new(),
        }
    }

    fn owns(&self, epoch: u64) -> bool {
        self.control
            .as_ref()
            .is_some_and(|c| c.status == RunStatus::Running && c.epoch == epoch)
    }

    /// Compare-and-swap on control: succeeds only at `version`.
    fn swap(&mut self, version: u32, next: Control) -> bool {
        if self.version != version {
            return false;
        }
        self.control = Some(next);
        self.version += 1;
        true
    }

    fn successors(&self, end: EndOfRun) -> Vec<State> {
        let mut out = Vec::new();
        for i in 0..self.triggers.len() {
            let mut s = self.clone();
            match &self.triggers[i] {
                Trig::Upload => {
                    s.uploaded |= 1 << i;
                    s.triggers[i] = Trig::Read;
                }
                Trig::Read => {
                    s.triggers[i] = Trig::Decide {
                        seen: s.control.clone(),
                        version: s.version,
                    };
                }
                Trig::Decide { seen, version } => {
                    match decide_wake(seen.as_ref(), s.now, TTL, None) {
                        Wake::Start { epoch, .. } => {
                            let next = claimed(seen.as_ref(), epoch, "exec", s.now, "h");
                            if s.swap(*version, next) {
                                s.runs.push(Run {
                                    epoch,
                                    pc: RunPc::Discover,
                                });
                                s.triggers[i] = Trig::Returned;
                            } else {
                                s.triggers[i] = Trig::Read;
                            }
                        }
                        Wake::Request { already: true, .. } => s.triggers[i] = Trig::Returned,
                        Wake::Hold { .. } => unreachable!("the model never pauses"),
                        Wake::Request { .. } => {
                            let next = requested(seen.as_ref().expect("running"));
                            s.triggers[i] = if s.swap(*version, next) {
                                Trig::Returned
                            } else {
                                Trig::Read
                            };
                        }
                    }
                }
                Trig::Returned => continue,
            }
            out.push(s);
        }
        for l in 0..self.locals.len() {
            let mut s = self.clone();
            match &self.locals[l] {
                // The idle check: nothing uploaded and uncommitted, no claim.
                Local::Read if s.uploaded & !s.committed == 0 => s.locals[l] = Local::Done,
                Local::Read => {
                    s.locals[l] = Local::Decide {
                        seen: s.control.clone(),
                        version: s.version,
                    }
                }
                Local::Decide { seen, version } => {
                    match decide_claim(seen.as_ref(), s.now, TTL, false) {
                        Claim::Take { epoch, .. } => {
                            let next = claimed(seen.as_ref(), epoch, "local", s.now, "");
                            // Claimed by another first: `sluice run` reports
                            // the lease busy and ends.
                            if s.swap(*version, next) {
                                s.runs.push(Run {
                                    epoch,
                                    pc: RunPc::Discover,
                                });
                            }
                            s.locals[l] = Local::Done;
                        }
                        Claim::Busy { .. } => s.locals[l] = Local::Done,
                    }
                }
                Local::Done => continue,
            }
            out.push(s);
        }
        for r in 0..self.runs.len() {
            let mut s = self.clone();
            let epoch = self.runs[r].epoch;
            match &self.runs[r].pc {
                RunPc::Discover => {
                    // Everything uploaded and not committed, at this moment.
                    s.runs[r].pc = RunPc::Commit {
                        found: s.uploaded & !s.committed,
                    };
                }
                RunPc::Commit { found } => {
                    // The commit is fenced by the lease (create-only commit
                    // records under an owned epoch).
                    if s.owns(epoch) {
                        for f in 0..3 {
                            if found & (1 << f) != 0 {
                                s.commits_per_file[f] += 1;
                            }
                        }
                        s.committed |= found;
                        s.runs[r].pc = RunPc::Read;
                    } else {
                        s.runs[r].pc = RunPc::Stopped;
                    }
                }
                RunPc::Read => match &s.control {
                    Some(c) if s.owns(epoch) => {
                        s.runs[r].pc = RunPc::End {
                            seen: c.clone(),
                            version: s.version,
                        }
                    }
                    // Lost the lease: stop without writing.
                    _ => s.runs[r].pc = RunPc::Stopped,
                },
                RunPc::End { seen, version } => {
                    let (next, again) = end(seen, s.now, "h");
                    s.runs[r].pc = if !s.swap(*version, next) {
                        RunPc::Read
                    } else if again {
                        RunPc::Discover
                    } else {
                        RunPc::Stopped
                    };
                }
                RunPc::Stopped => continue,
            }
            out.push(s);
        }
        // Time passes once beyond the lease TTL while a run holds it: the
        // next trigger may take over, and the old run becomes a zombie.
        if self.now == 0
            && self
                .control
                .as_ref()
                .is_some_and(|c| c.status == RunStatus::Running)
        {
            let mut s = self.clone();
            s.now = TTL + 1;
            out.push(s);
        }
        out
    }

    fn check(&self) {
        let live: Vec<&Run> = self
            .runs
            .iter()
            .filter(|r| r.pc != RunPc::Stopped && self.owns(r.epoch))
            .collect();
        assert!(live.len() <= 1, "two live owners: {self:?}");
        assert!(
            self.commits_per_file.iter().all(|n| *n <= 1),
            "a file committed twice: {self:?}"
        );
    }

    fn is_final(&self) -> bool {
        self.triggers.iter().all(|t| *t == Trig::Returned)
            && self.locals.iter().all(|l| *l == Local::Done)
            && self.runs.iter().all(|r| r.pc == RunPc::Stopped)
    }

    fn check_final(&self) {
        let returned = (1u8 << self.triggers.len()) - 1;
        assert_eq!(
            self.committed & returned,
            returned,
            "a file whose trigger returned was never committed: {self:?}"
        );
        assert!(
            self.control
                .as_ref()
                .is_some_and(|c| c.status == RunStatus::Idle),
            "ended holding the lease: {self:?}"
        );
    }
}

/// How a run ends: the engine's `end_of_run`, or a flawed variant.
type EndOfRun = fn(&Control, i64, &str) -> (Control, bool);

/// Explore every reachable state; returns (states, final states).
fn explore(triggers: usize, locals: usize, end: EndOfRun) -> (usize, usize) {
    let start = State::new(triggers, locals);
    let mut seen = HashSet::new();
    let mut stack = vec![start.clone()];
    seen.insert(start);
    let mut finals = 0;
    while let Some(s) = stack.pop() {
        s.check();
        let next = s.successors(end);
        if next.is_empty() {
            assert!(s.is_final(), "stuck before the end: {s:?}");
            s.check_final();
            finals += 1;
        }
        for n in next {
            if seen.insert(n.clone()) {
                stack.push(n);
            }
        }
    }
    (seen.len(), finals)
}

#[test]
fn two_triggers_and_their_runs_in_every_interleaving() {
    let (states, finals) = explore(2, 0, end_of_run);
    eprintln!("lease model, 2 triggers: {states} states, {finals} final");
    assert!(states > 100, "only {states} states explored");
}

#[test]
fn two_triggers_and_a_sluice_run_claiming_on_its_own_in_every_interleaving() {
    let (states, finals) = explore(2, 1, end_of_run);
    eprintln!("lease model, 2 triggers and a local run: {states} states, {finals} final");
    assert!(states > 1000, "only {states} states explored");
}

#[test]
fn three_triggers_and_their_runs_in_every_interleaving() {
    let (states, finals) = explore(3, 0, end_of_run);
    eprintln!("lease model, 3 triggers: {states} states, {finals} final");
    assert!(states > 1000, "only {states} states explored");
}

/// The model can fail: with a release that ignores the request flag, some
/// interleaving leaves a file whose trigger returned uncommitted.
#[test]
fn the_model_finds_the_lost_wake_up_of_a_release_that_ignores_the_flag() {
    fn ignore_flag(c: &Control, now: i64, hash: &str) -> (Control, bool) {
        let mut c = c.clone();
        c.requested = false;
        end_of_run(&c, now, hash)
    }
    let found = std::panic::catch_unwind(|| explore(2, 0, ignore_flag));
    let message = found
        .expect_err("the flawed protocol must fail the check")
        .downcast::<String>()
        .map(|m| *m)
        .unwrap_or_default();
    assert!(message.contains("never committed"), "{message}");
}
