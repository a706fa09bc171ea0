//! Stage 2, guard: one read decides whether the delivery has any work left, and a cached
//! read whether its job and run still want it. A copy the worker parked for its host's
//! booked start is guarded by its claim instead (the next stage), which costs no read.

use crate::contract::{NotWanted, Outcome, WaitFor};
use crate::domain::message::REDRIVE_GAP_MS;
use crate::domain::model::Tries;
use crate::domain::refresh::Prior;
use crate::polite::Gate;
use crate::ports::tasks::{TaskStore, TriesFrom};

use super::context::{Ctx, Stage};
use super::parents::{ParentsCache, Wanted};

/// A delivery the guard let through: the task wants work, and this is what its request is
/// for. A booked copy at its start (`booked`) is claimed next, as its guard; its claim
/// brings the URL and the earlier result.
#[derive(Debug)]
pub(super) struct Guarded {
    pub url: Option<String>,
    /// The earlier result a refresh task names: the fetch asks whether the page changed.
    pub prior: Option<Prior>,
    pub wanted: Wanted,
    /// The host's start the message's copy booked, unless the copy came too late for it.
    pub booked: Option<u64>,
    /// The set of tries the claim counts in (a fresh one for a message back from the
    /// dead-letter queue).
    pub tries: TriesFrom,
    /// The task's final attempt failed for a reason on our side, not the site's. So the
    /// task is no longer parked for its host but held back, and its receives move it to the
    /// dead-letter queue.
    pub spent: bool,
    /// `url` is where a redirect led, not the task's own URL (`hops`).
    pub redirected: bool,
    /// `url` is a hop this record followed, after a fetch of its own. A copy's paid wait
    /// (straight to the paid tier) was for its first fetch, not for this one.
    pub followed: bool,
}

/// What the guard reads: the task, its job and run (cached), and the host's schedule.
pub(super) struct Guard<'a, T> {
    pub tasks: &'a T,
    pub parents: &'a ParentsCache,
    pub gate: &'a Gate,
}

impl<T: TaskStore> Guard<'_, T> {
    /// Lets the delivery through, or ends it: no time left, a parked copy that arrived
    /// before its booked start, or the task gone, terminal or not wanted.
    pub async fn check(&self, ctx: &Ctx<'_>) -> Stage<Guarded> {
        if ctx.fetch_time().is_none() {
            return Err(Outcome::NoTimeLeft);
        }
        match ctx.delivery.message.carried.booking {
            Some(start) => self.booked(ctx, start).await,
            None => self.fresh(ctx).await,
        }
    }

    /// Reads the task (a terminal task costs this one read and nothing else), then whether
    /// its job and run want work. Every read is strongly consistent: an answer that leads to
    /// an ack must see the latest write.
    #[tracing::instrument(name = "guard", skip_all)]
    async fn fresh(&self, ctx: &Ctx<'_>) -> Stage<Guarded> {
        let task = ctx.task();
        let Some(current) = self.tasks.load_task(task).await? else {
            return Err(Outcome::NotWanted(NotWanted::TaskMissing));
        };
        if current.status.is_terminal() {
            return Err(Outcome::AlreadyTerminal);
        }
        let wanted = self.parents.wanted(self.tasks, task).await?;
        let mut wanted = wanted.map_err(Outcome::NotWanted)?;
        // The task's own `render` over its job's.
        wanted.render.render = wanted.render.for_task(current.render);
        let tries = in_tries(ctx.delivery.tries(), current.tries);
        Ok(Guarded {
            url: current.url,
            prior: current.prior,
            wanted,
            booked: None,
            spent: !tries.fresh && current.tries.spent,
            tries,
            redirected: false,
            followed: false,
        })
    }

    /// A booked copy. One that arrived early keeps waiting, without a request; a wait
    /// longer than SQS's maximum delay is split into several hops. One that arrived at its
    /// start goes on to its claim, which is its guard: a terminal or missing task refuses
    /// the claim, and the claim returns the task's URL. One that missed its start asks its
    /// host again like a fresh delivery.
    async fn booked(&self, ctx: &Ctx<'_>, start: u64) -> Stage<Guarded> {
        if let Some(delay) = self.gate.parked(start) {
            let booked = Some(start);
            return Err(Outcome::WaitHeld {
                delay,
                booked,
                waits_for: WaitFor::Host,
            });
        }
        let wanted = self.parents.wanted(self.tasks, ctx.task()).await?;
        let wanted = wanted.map_err(Outcome::NotWanted)?;
        if self.gate.missed(start, &wanted.politeness) {
            tracing::info!(start, "a booked start missed: asked again");
            return self.fresh(ctx).await;
        }
        Ok(Guarded {
            url: None,
            prior: None,
            wanted,
            booked: Some(start),
            tries: ctx.delivery.tries(),
            spent: false,
            redirected: false,
            followed: false,
        })
    }
}

/// Places the delivery in the task's set of tries. A message sent long after the set began
/// (back from the dead-letter queue, or re-queued) starts a fresh set.
fn in_tries(message: TriesFrom, task: Tries) -> TriesFrom {
    let fresh = task.fresh_for(message.since, REDRIVE_GAP_MS);
    if fresh {
        tracing::info!(attempts = task.attempts, "a fresh set of tries begins");
    }
    TriesFrom { fresh, ..message }
}
