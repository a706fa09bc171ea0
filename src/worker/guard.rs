//! Stage 2, guard: one read decides whether the delivery has any work left, and a cached
//! read whether its job and run still want it. A copy the worker parked for its host's
//! booked start is guarded by its claim instead, which costs no read.

use std::time::SystemTime;

use crate::batch::Invocation;
use crate::contract::{NotWanted, Outcome, WaitFor};
use crate::domain::ids::TaskRef;
use crate::domain::message::REDRIVE_GAP_MS;
use crate::domain::model::{TaskStatus, Tries};
use crate::domain::refresh::Prior;
use crate::ports::hosts::HostStore;
use crate::ports::queue::Visibility;
use crate::ports::results::ResultStore;
use crate::ports::spend::SpendStore;
use crate::ports::tasks::{Claim, Lease, TaskStore, TriesFrom};
use crate::pushback::retry::Patience;
use crate::scraper::Fetcher;

use super::parents::Wanted;
use super::parse::Delivery;
use super::{Step, Worker};

/// A delivery the guard let through: the task wants work, and this is what it works with.
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
    /// The claim of a booked copy, made as its guard.
    pub claim: Option<Claimed>,
    /// `url` is where a redirect led, not the task's own URL (`hops`).
    pub redirected: bool,
    /// `url` is a hop this record followed, after a fetch of its own. A copy's paid wait
    /// (straight to the paid tier) was for its first fetch, not for this one.
    pub followed: bool,
}

/// A claim this delivery made: its try of the task.
#[derive(Debug)]
pub struct Claimed {
    /// An earlier delivery had claimed the task.
    pub redelivery: bool,
    /// The task's claims so far, this one included: every fetch follows one, whatever
    /// copies and waits came between.
    pub attempts: u32,
    /// The task's final attempt had failed for a reason on our side
    /// (`TaskStore::spend_tries`).
    pub spent: bool,
    /// The task's URL and earlier result, as the claim found them.
    pub url: Option<String>,
    pub prior: Option<Prior>,
    /// The lease's owner, if the claim took one (`DUPLICATE_POLICY=lease`).
    pub owner: Option<String>,
}

impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility>
    Worker<T, R, F, V>
{
    /// Lets the delivery through, or ends it: no time left, a parked copy that arrived
    /// before its booked start, or the task gone, terminal or not wanted.
    pub(super) async fn guard(
        &self,
        delivery: &Delivery,
        invocation: &Invocation,
    ) -> Step<Guarded> {
        if self.fetch_time(invocation).is_none() {
            return Err(Outcome::NoTimeLeft);
        }
        match delivery.message.carried.booking {
            Some(start) => self.guard_booked(delivery, start, invocation).await,
            None => self.guard_fresh(delivery).await,
        }
    }

    /// Reads the task (a terminal task costs this one read and nothing else), then whether
    /// its job and run want work. Every read is strongly consistent: an answer that leads to
    /// an ack must see the latest write.
    #[tracing::instrument(name = "guard", skip_all)]
    async fn guard_fresh(&self, delivery: &Delivery) -> Step<Guarded> {
        let task = delivery.task();
        let Some(current) = self.tasks.load_task(task).await? else {
            return Err(Outcome::NotWanted(NotWanted::TaskMissing));
        };
        if current.status.is_terminal() {
            return Err(Outcome::AlreadyTerminal);
        }
        let wanted = self.parents.wanted(&self.tasks, task).await?;
        let wanted = wanted.map_err(Outcome::NotWanted)?;
        let tries = in_tries(delivery.tries(), current.tries);
        Ok(Guarded {
            url: current.url,
            prior: current.prior,
            wanted,
            booked: None,
            spent: !tries.fresh && current.tries.spent,
            tries,
            claim: None,
            redirected: false,
            followed: false,
        })
    }

    /// A booked copy. One that arrived early keeps waiting, without a request; a wait
    /// longer than SQS's maximum delay is split into several hops. One that arrived at its
    /// start is claimed as its guard: a terminal or missing task refuses the claim, and the
    /// claim returns the task's URL. One that missed its start asks its host again like a
    /// fresh delivery.
    async fn guard_booked(
        &self,
        delivery: &Delivery,
        start: u64,
        invocation: &Invocation,
    ) -> Step<Guarded> {
        if let Some(delay) = self.gate.parked(start) {
            let booked = Some(start);
            return Err(Outcome::PoliteHeld {
                delay,
                booked,
                waits_for: WaitFor::Host,
            });
        }
        let wanted = self.parents.wanted(&self.tasks, delivery.task()).await?;
        let wanted = wanted.map_err(Outcome::NotWanted)?;
        if self.gate.missed(start, &wanted.politeness) {
            tracing::info!(start, "a booked start missed: asked again");
            return self.guard_fresh(delivery).await;
        }
        let claim = match self.claim(delivery, delivery.tries(), invocation).await {
            Err(Outcome::LostRace) => return Err(Outcome::AlreadyTerminal),
            claimed => claimed?,
        };
        Ok(Guarded {
            url: claim.url.clone(),
            prior: claim.prior.clone(),
            wanted,
            booked: Some(start),
            tries: delivery.tries(),
            spent: claim.spent,
            claim: Some(claim),
            redirected: false,
            followed: false,
        })
    }

    /// Claims the task for this delivery, in the set of tries `tries`.
    pub(super) async fn claim(
        &self,
        delivery: &Delivery,
        tries: TriesFrom,
        invocation: &Invocation,
    ) -> Step<Claimed> {
        let owner = delivery.owner.as_deref();
        let lease = owner.map(|owner| Lease {
            owner,
            until: invocation.deadline,
        });
        let final_attempt = delivery.counted_receives >= self.settings.max_attempts;
        let patience = self.patience(final_attempt, invocation);
        let ask = ClaimAsk {
            now: SystemTime::now(),
            lease,
            tries,
        };
        claim_task(&self.tasks, delivery.task(), ask, &patience).await
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

/// What a claim asks of the task: when, a lease if the policy takes one, and its set of
/// tries.
pub struct ClaimAsk<'a> {
    pub now: SystemTime,
    pub lease: Option<Lease<'a>>,
    pub tries: TriesFrom,
}

/// Claims the task, retrying while another transaction on the task is in flight. The claim
/// may find that the task's tries began more than [`REDRIVE_GAP_MS`] before the tries of
/// this delivery's chain of copies. That is a copy of a redriven message, which waited
/// before its first claim. The claim is then made again, as the first of a fresh set.
#[tracing::instrument(name = "claim", skip_all)]
pub async fn claim_task<S: TaskStore>(
    store: &S,
    task: &TaskRef,
    ask: ClaimAsk<'_>,
    patience: &Patience<'_>,
) -> Step<Claimed> {
    let ClaimAsk { now, lease, tries } = ask;
    let owner = lease.map(|lease| lease.owner.to_owned());
    let claim = |tries| patience.retry(move || store.claim(task, now, lease, tries));
    let (found, was, url, prior) = match claim(tries).await? {
        Claim::Claimed {
            attempts,
            was,
            url,
            prior,
            tries,
        } => (Tries { attempts, ..tries }, was, url, prior),
        Claim::AlreadyTerminal => return Err(Outcome::LostRace),
        Claim::Missing => return Err(Outcome::NotWanted(NotWanted::TaskMissing)),
        Claim::Leased { until } => return Err(Outcome::LeaseHeld { until }),
    };
    let fresh = !tries.fresh && found.fresh_for(tries.since, REDRIVE_GAP_MS);
    let (attempts, spent) = match fresh {
        true => match claim(TriesFrom { fresh, ..tries }).await? {
            Claim::Claimed { attempts, .. } => (attempts, false),
            _ => (found.attempts, found.spent),
        },
        false => (found.attempts, found.spent && !tries.fresh),
    };
    tracing::debug!(attempts, was = was.as_str(), "claimed");
    Ok(Claimed {
        redelivery: was == TaskStatus::Processing,
        attempts,
        spent,
        url,
        prior,
        owner,
    })
}
