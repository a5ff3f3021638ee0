//! The notify-mode claim protocol, checked exhaustively for one key: every
//! interleaving of three notifications of it (the first, a redelivery of
//! the same entry, and one with another size) with two runs, the first of
//! which loses its lease at any point and goes on as a zombie, then a last
//! run on its own. Each step is one atomic storage request, as the engine
//! makes them: list the inbox; create the claim (create-only); read it;
//! take an uncommitted claim over (If-Match); create the plan (create-only,
//! at the batch after the last committed one as read when the run started);
//! check the lease and create the commit record (create-only); mark the
//! claim committed (overwrite); delete the consumed entries; advance control
//! (fenced by epoch). A run that finds the claim committed deletes the
//! entries it listed and ends. What a run does after each claim request is
//! decided by the engine's own `discovery::decide_key_claim`; the model
//! supplies only the storage (a versioned claim, create-only and If-Match
//! writes).
//!
//! Checked in every reachable state: the key is in at most one commit
//! record. In every final state (after the last run): exactly one, the
//! inbox empty, the claim committed.

use std::collections::{BTreeSet, HashSet};

use sluice_engine::checkpoint::KeyClaim;
use sluice_engine::discovery::{ClaimStep, decide_key_claim};

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Pc {
    /// Not started (the second run starts when it takes the lease over).
    Waiting,
    /// Read control: recover a commit not yet recorded, resume a plan, or
    /// discover.
    Start,
    List {
        next: usize,
    },
    Create {
        next: usize,
        seen: Vec<u8>,
    },
    Get {
        next: usize,
        seen: Vec<u8>,
    },
    Cas {
        next: usize,
        seen: Vec<u8>,
        version: u32,
    },
    DeleteDuplicates {
        seen: Vec<u8>,
    },
    Plan {
        next: usize,
        seen: Vec<u8>,
    },
    CheckLease {
        batch: usize,
    },
    CreateCommit {
        batch: usize,
    },
    Mark {
        batch: usize,
    },
    DeleteConsumed {
        batch: usize,
    },
    Advance {
        batch: usize,
    },
    Done,
    Failed,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Run {
    epoch: u8,
    pc: Pc,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct State {
    /// The key's claim: committed?, and its version (etag).
    claim: Option<(bool, u32)>,
    /// Inbox entries of the key (by size variant).
    inbox: BTreeSet<u8>,
    /// Notifications not delivered yet, in order.
    deliveries: Vec<u8>,
    /// Plans by batch: the entries each consumes (every plan holds the key).
    plans: Vec<Option<Vec<u8>>>,
    /// Commit records by batch.
    commits: Vec<bool>,
    /// control.json: the last committed batch.
    last_committed: Option<usize>,
    /// The epoch holding the lease.
    owner: u8,
    runs: Vec<Run>,
}

const BATCHES: usize = 4;

/// The protocol as built, or with one safeguard removed (to show that the
/// check finds what each safeguard prevents).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Flaw {
    None,
    /// Take an uncommitted claim over without If-Match.
    BlindTakeover,
    /// Treat a committed claim as one left by a plan that never committed.
    IgnoreCommitted,
}

fn initial() -> State {
    State {
        claim: None,
        inbox: BTreeSet::new(),
        deliveries: vec![0, 0, 1],
        plans: vec![None; BATCHES],
        commits: vec![false; BATCHES],
        last_committed: None,
        owner: 1,
        runs: vec![
            Run {
                epoch: 1,
                pc: Pc::Start,
            },
            Run {
                epoch: 2,
                pc: Pc::Waiting,
            },
        ],
    }
}

fn next_batch(s: &State) -> usize {
    s.last_committed.map_or(0, |b| b + 1)
}

/// The engine's claim decision, or (for the negative control) one that
/// treats a committed claim as left by a plan that never committed.
fn decide(flaw: Flaw, written: bool, read: Option<Option<(&KeyClaim, &str)>>) -> ClaimStep {
    match read {
        Some(Some((claim, etag))) if flaw == Flaw::IgnoreCommitted && claim.committed => {
            ClaimStep::TakeOver(etag.to_string())
        }
        _ => decide_key_claim(written, read),
    }
}

/// Where a run goes after the claim decision `step`.
fn after_claim(step: ClaimStep, next: usize, seen: Vec<u8>) -> Pc {
    match step {
        ClaimStep::Taken => Pc::Plan { next, seen },
        ClaimStep::Duplicate => Pc::DeleteDuplicates { seen },
        ClaimStep::Create => Pc::Create { next, seen },
        ClaimStep::TakeOver(etag) => Pc::Cas {
            next,
            seen,
            version: etag.parse().expect("the model's etags are versions"),
        },
    }
}

/// One step of run `r`; `None` when it has nothing to do.
fn step(s: &State, r: usize, flaw: Flaw) -> Option<State> {
    let mut t = s.clone();
    let epoch = s.runs[r].epoch;
    let pc = match s.runs[r].pc.clone() {
        Pc::Waiting | Pc::Done | Pc::Failed => return None,
        Pc::Start => {
            let next = next_batch(s);
            if s.commits[next] {
                Pc::Mark { batch: next }
            } else if s.plans[next].is_some() {
                Pc::CheckLease { batch: next }
            } else {
                Pc::List { next }
            }
        }
        Pc::List { next } => {
            let seen: Vec<u8> = s.inbox.iter().copied().collect();
            if seen.is_empty() {
                Pc::Done
            } else {
                Pc::Create { next, seen }
            }
        }
        Pc::Create { next, seen } => match s.claim {
            None => {
                t.claim = Some((false, 1));
                after_claim(decide(flaw, true, None), next, seen)
            }
            Some(_) => Pc::Get { next, seen },
        },
        Pc::Get { next, seen } => {
            let read = s.claim.map(|(committed, version)| {
                (
                    KeyClaim {
                        epoch: 0,
                        committed,
                        batch: None,
                    },
                    version.to_string(),
                )
            });
            let step = decide(
                flaw,
                false,
                Some(read.as_ref().map(|(c, v)| (c, v.as_str()))),
            );
            after_claim(step, next, seen)
        }
        Pc::Cas {
            next,
            seen,
            version,
        } => match s.claim {
            Some((_, v)) if v == version || flaw == Flaw::BlindTakeover => {
                t.claim = Some((false, v + 1));
                after_claim(decide(flaw, true, None), next, seen)
            }
            // If-Match failed (or the claim is gone): read again.
            _ => Pc::Get { next, seen },
        },
        Pc::DeleteDuplicates { seen } => {
            for e in &seen {
                t.inbox.remove(e);
            }
            Pc::Done
        }
        Pc::Plan { next, seen } => {
            if s.plans[next].is_some() {
                Pc::Failed // create-only: another run planned this batch
            } else {
                t.plans[next] = Some(seen);
                Pc::CheckLease { batch: next }
            }
        }
        Pc::CheckLease { batch } => {
            if s.owner == epoch {
                Pc::CreateCommit { batch }
            } else {
                Pc::Failed
            }
        }
        Pc::CreateCommit { batch } => {
            t.commits[batch] = true; // create-only: the same plan either way
            Pc::Mark { batch }
        }
        Pc::Mark { batch } => {
            let v = s.claim.map_or(0, |(_, v)| v);
            t.claim = Some((true, v + 1));
            Pc::DeleteConsumed { batch }
        }
        Pc::DeleteConsumed { batch } => {
            for e in s.plans[batch].as_deref().unwrap_or_default() {
                t.inbox.remove(e);
            }
            Pc::Advance { batch }
        }
        Pc::Advance { batch } => {
            if s.owner != epoch {
                Pc::Failed
            } else {
                if s.last_committed.is_none_or(|l| l < batch) {
                    t.last_committed = Some(batch);
                }
                if next_batch(&t) >= BATCHES {
                    return None; // out of modelled batches
                }
                Pc::Start
            }
        }
    };
    t.runs[r].pc = pc;
    Some(t)
}

fn successors(s: &State, flaw: Flaw) -> Vec<State> {
    let mut out = Vec::new();
    if let Some((first, rest)) = s.deliveries.split_first() {
        let mut t = s.clone();
        t.inbox.insert(*first);
        t.deliveries = rest.to_vec();
        out.push(t);
    }
    // The second run takes the lease over (the first looks dead) at any time.
    if s.runs[1].pc == Pc::Waiting {
        let mut t = s.clone();
        t.owner = 2;
        t.runs[1].pc = Pc::Start;
        out.push(t);
    }
    for r in 0..s.runs.len() {
        out.extend(step(s, r, flaw));
    }
    out
}

fn commits_of_key(s: &State) -> usize {
    s.commits.iter().filter(|c| **c).count()
}

/// The last run, alone, to its end.
fn last_run(mut s: State, flaw: Flaw) -> State {
    s.owner = 3;
    s.runs.push(Run {
        epoch: 3,
        pc: Pc::Start,
    });
    let r = s.runs.len() - 1;
    for _ in 0..100 {
        match step(&s, r, flaw) {
            Some(t) => s = t,
            None => return s,
        }
    }
    panic!("the last run does not end: {s:?}");
}

/// Explore every interleaving; the first violation found, if any, and the
/// number of states.
fn explore(flaw: Flaw) -> (Option<String>, usize, usize) {
    let mut seen = HashSet::new();
    let mut stack = vec![initial()];
    let mut finals = 0;
    while let Some(s) = stack.pop() {
        if !seen.insert(s.clone()) {
            continue;
        }
        if commits_of_key(&s) > 1 {
            return (
                Some(format!("the key committed twice: {s:?}")),
                seen.len(),
                finals,
            );
        }
        let next = successors(&s, flaw);
        if next.is_empty() {
            finals += 1;
            if s.commits.iter().skip(BATCHES - 1).any(|c| *c) {
                return (
                    Some(format!("out of modelled batches: {s:?}")),
                    seen.len(),
                    finals,
                );
            }
            let end = last_run(s.clone(), flaw);
            let why = match commits_of_key(&end) {
                0 => "the key never committed",
                1 if !end.inbox.is_empty() => "entries left in the inbox",
                1 if end.claim.map(|(c, _)| c) != Some(true) => "the claim not committed",
                1 => "",
                _ => "the key committed twice (by the last run)",
            };
            if !why.is_empty() {
                return (
                    Some(format!("{why}: from {s:?}\nto {end:?}")),
                    seen.len(),
                    finals,
                );
            }
        }
        stack.extend(next);
    }
    (None, seen.len(), finals)
}

#[test]
fn claims_commit_a_key_once_in_every_interleaving() {
    let (violation, states, finals) = explore(Flaw::None);
    eprintln!("claim model: {states} states, {finals} final");
    assert_eq!(violation, None);
    assert!(states > 1000, "only {states} states");
}

#[test]
fn the_model_finds_what_each_safeguard_prevents() {
    for flaw in [Flaw::BlindTakeover, Flaw::IgnoreCommitted] {
        let (violation, states, _) = explore(flaw);
        let v = violation.unwrap_or_else(|| panic!("{flaw:?}: no violation in {states} states"));
        assert!(v.contains("committed twice"), "{flaw:?}: {v}");
    }
}
