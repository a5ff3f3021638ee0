//! Every change to `control.json`, through one compare-and-swap loop
//! ([`Checkpoint::attempts`], and [`Checkpoint::change_control`] over it):
//! read, decide, write if nothing changed in between, else read and decide
//! again. Runs, commands (`pause`,
//! `reset`, ...) and triggers all write through it; the decisions
//! themselves are the lease protocol's pure functions (`lease`).

use super::{Checkpoint, Control, owns};
use crate::error::{Error, Result};

/// How many times a change of `control.json` is decided and tried before
/// the writer gives up (another writer kept changing it in between).
pub const CONTROL_TRIES: usize = 16;

/// One reading of `control.json` for an attempt at changing it: the
/// record (absent: `None`) and the etag a compare-and-swap expects.
pub struct ControlRead {
    read: Option<(Control, String)>,
}

impl ControlRead {
    /// The record read (`None`: there is none yet).
    pub fn control(&self) -> Option<&Control> {
        self.read.as_ref().map(|(c, _)| c)
    }

    /// What a compare-and-swap against this reading expects (`None`:
    /// create).
    pub fn etag(&self) -> Option<&str> {
        self.read.as_ref().map(|(_, e)| e.as_str())
    }
}

/// The attempts of one change of `control.json`: each reads the record
/// afresh, decides, and writes with [`Checkpoint::swap_control`] against
/// that reading; a write that loses the race to another writer (a
/// trigger, a command, a run) makes the next attempt. At most
/// [`CONTROL_TRIES`].
pub struct Attempts {
    left: usize,
}

impl Attempts {
    /// Read `control.json` for the next attempt; `None` once every attempt
    /// lost its race (another writer kept changing it).
    pub async fn next(&mut self, checkpoint: &Checkpoint) -> Result<Option<ControlRead>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        Ok(Some(ControlRead {
            read: checkpoint.control().await?,
        }))
    }
}

impl Checkpoint {
    /// The compare-and-swap loop on `control.json`, for a writer whose
    /// decision does I/O (a trigger asks Step Functions about the run
    /// holding the lease, and starts the run it claimed):
    /// `while let Some(read) = attempts.next(checkpoint).await? { ... }`.
    pub fn attempts(&self) -> Attempts {
        Attempts {
            left: CONTROL_TRIES,
        }
    }

    /// Change `control.json` by a decision that needs no I/O: `decide`
    /// says what to write (created when absent) and what to return once
    /// written; decided again when another writer changed the record in
    /// between. A conflict error when it kept changing.
    pub async fn change_control<T>(
        &self,
        mut decide: impl FnMut(Option<&Control>) -> Result<(Control, T)>,
    ) -> Result<T> {
        let mut attempts = self.attempts();
        while let Some(read) = attempts.next(self).await? {
            let (next, value) = decide(read.control())?;
            if self.swap_control(&next, read.etag()).await?.is_some() {
                return Ok(value);
            }
        }
        Err(self.conflict("control.json keeps changing under this run; it stops"))
    }

    /// `control` if the run with `epoch` still holds the lease in it; a
    /// conflict error (the run stops without writing) otherwise.
    pub fn owned<'a>(&self, control: Option<&'a Control>, epoch: u64) -> Result<&'a Control> {
        match control {
            Some(c) if owns(c, epoch) => Ok(c),
            Some(c) => Err(self.conflict(&format!(
                "this run (epoch {epoch}) lost the lease to epoch {} ({}); it stops without \
                 writing",
                c.epoch,
                c.owner.as_deref().unwrap_or_default()
            ))),
            None => Err(self.conflict("control.json is missing; this run stops")),
        }
    }

    /// Read control and check the run with `epoch` still holds the lease:
    /// the record and its etag.
    pub async fn owned_control(&self, epoch: u64) -> Result<(Control, String)> {
        let read = self.control().await?;
        let c = self.owned(read.as_ref().map(|(c, _)| c), epoch)?.clone();
        Ok((c, read.map(|(_, e)| e).unwrap_or_default()))
    }

    /// The first Plan of copy `copy` of Express execution `id`: claim the
    /// run of `epoch` for it before anything else is written, or stop (a
    /// conflict) when another execution of the same run, or another copy
    /// of this one, claimed it:
    /// [`decide_execution`](super::lease::decide_execution).
    pub async fn claim_execution(&self, epoch: u64, id: &str, copy: &str) -> Result<()> {
        let mut attempts = self.attempts();
        while let Some(read) = attempts.next(self).await? {
            let c = self.owned(read.control(), epoch)?;
            let next = match super::lease::decide_execution(c, epoch, id, copy) {
                super::lease::ExecutionClaim::Claim(next) => *next,
                super::lease::ExecutionClaim::Ours => return Ok(()),
                super::lease::ExecutionClaim::Duplicate(message) => {
                    return Err(self.conflict(&message));
                }
            };
            if self.swap_control(&next, read.etag()).await?.is_some() {
                return Ok(());
            }
        }
        Err(self.conflict("control.json keeps changing under this run; it stops"))
    }

    /// Change control while the run with `epoch` holds the lease; the
    /// record written.
    pub async fn update_control(
        &self,
        epoch: u64,
        change: &(dyn Fn(&mut Control) + Send + Sync),
    ) -> Result<Control> {
        self.change_control(|read| {
            let mut c = self.owned(read, epoch)?.clone();
            change(&mut c);
            Ok((c.clone(), c))
        })
        .await
    }

    fn conflict(&self, message: &str) -> Error {
        Error::Conflict {
            pipeline: self.pipeline.clone(),
            message: message.to_string(),
        }
    }
}
