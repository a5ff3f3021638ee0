//! Every change to `control.json`, through one compare-and-swap loop
//! ([`Checkpoint::retry_control`]): read, decide, write if nothing changed
//! in between, else read and decide again. Runs, commands (`pause`,
//! `reset`, ...) and triggers all write through it; the decisions
//! themselves are the lease protocol's pure functions (`lease`).

use super::{Checkpoint, Control, owns};
use crate::error::{Error, Result};

/// How many times a change of `control.json` is decided and tried before
/// the writer gives up (another writer kept changing it in between).
pub const CONTROL_TRIES: usize = 16;

impl Checkpoint {
    /// The compare-and-swap loop on `control.json`: read it, and let
    /// `attempt` decide and write with [`Checkpoint::swap_control`] against
    /// the etag read (`None` for an absent record), returning `Some` once
    /// done or `None` when another writer changed it first; then read and
    /// decide again, up to [`CONTROL_TRIES`] times. `Ok(None)` when it
    /// kept changing. `attempt` may do I/O between its decision and its
    /// write (a trigger asks Step Functions about the run holding the
    /// lease) and after it (starting the run it claimed).
    pub async fn retry_control<T>(
        &self,
        mut attempt: impl AsyncFnMut(Option<&Control>, Option<&str>) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        for _ in 0..CONTROL_TRIES {
            let read = self.control().await?;
            let control = read.as_ref().map(|(c, _)| c);
            let etag = read.as_ref().map(|(_, e)| e.as_str());
            if let Some(done) = attempt(control, etag).await? {
                return Ok(Some(done));
            }
        }
        Ok(None)
    }

    /// Change `control.json` by a decision that needs no I/O: `decide`
    /// says what to write (created when absent) and what to return once
    /// written; decided again when another writer changed the record in
    /// between. A conflict error when it kept changing.
    pub async fn change_control<T>(
        &self,
        mut decide: impl FnMut(Option<&Control>) -> Result<(Control, T)>,
    ) -> Result<T> {
        let done = self
            .retry_control(async |read, etag| {
                let (next, value) = decide(read)?;
                Ok(self.swap_control(&next, etag).await?.map(|_| value))
            })
            .await?;
        done.ok_or_else(|| self.conflict("control.json keeps changing under this run; it stops"))
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
