//! A delivery's way to its fetch: fresh (the guard's reads) or a parked copy come due (its
//! claim is its guard), the host's turn, the claim, and what follows it.

use crate::batch::Invocation;
use crate::batch::contract::Outcome;
use crate::domain::ids::{ResultKey, TaskRef};
use crate::domain::message::REDRIVE_GAP_MS;
use crate::domain::model::Tries;
use crate::polite::{Entry, Later, Permit, Visit};
use crate::ports::error::AwsError;
use crate::ports::hosts::HostStore;
use crate::ports::queue::Visibility;
use crate::ports::results::ResultStore;
use crate::ports::spend::SpendStore;
use crate::ports::tasks::{Lease, TaskStore, TriesFrom};
use crate::scraper::{FetchError, Fetcher};
use crate::worker::converge::Stores;
use crate::worker::guard::{self, Admission, Checked};
use crate::worker::parents::Wanted;
use std::time::{Duration, SystemTime};

use super::{
    Attempt, Claimed, DISALLOWED, Delivery, ROBOTS_PROXY_FAILED, TRIES_SPENT, WAITED_TOO_LONG,
    Work, Worker, backed_off, outcome_of,
};

impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility>
    Worker<T, R, F, V>
{
    pub(super) async fn process_task(
        &self,
        task: &TaskRef,
        delivery: &Delivery,
        invocation: &Invocation,
        owner: Option<&str>,
    ) -> Result<Outcome, AwsError> {
        if self.fetch_budget(invocation).is_none() {
            return Ok(Outcome::NoTimeLeft);
        }
        let Some(start) = delivery.booked else {
            return self.process_fresh(task, delivery, invocation, owner).await;
        };
        // A copy come early (a wait past SQS's longest delay goes in hops) waits on, at no
        // request; one come due is claimed as its guard; one that missed its start asks again
        // like a fresh delivery.
        if let Some(delay) = self.gate.parked(start) {
            let booked = Some(start);
            return Ok(Outcome::PoliteHeld { delay, booked });
        }
        let wanted = match self.parents.wanted(&self.tasks, task).await? {
            Ok(wanted) => wanted,
            Err(why) => return Ok(Outcome::NotWanted(why)),
        };
        if !self.gate.missed(start, &wanted.politeness) {
            return self
                .process_booked(task, delivery, wanted, invocation, owner)
                .await;
        }
        tracing::info!(start, "a booked start missed: asked again");
        let fresh = Delivery {
            booked: None,
            ..delivery.clone()
        };
        self.process_fresh(task, &fresh, invocation, owner).await
    }

    /// A delivery without a booking: the guard's reads, the host's turn, the claim.
    pub(super) async fn process_fresh(
        &self,
        task: &TaskRef,
        delivery: &Delivery,
        invocation: &Invocation,
        owner: Option<&str>,
    ) -> Result<Outcome, AwsError> {
        let checked = guard::check(&self.tasks, &self.parents, task).await?;
        let (url, prior, wanted, tries) = match checked {
            Checked::Wanted {
                url,
                prior,
                wanted,
                tries,
            } => (url, prior, wanted, tries),
            Checked::Skipped(outcome) => return Ok(outcome),
        };
        let delivery = &self.in_tries(delivery, tries);
        let Some(budget) = self.fetch_budget(invocation) else {
            return Ok(Outcome::NoTimeLeft);
        };
        let entered = self.enter_host(url.as_deref(), &wanted, delivery, budget, invocation);
        let pass = match entered.await? {
            Ok(pass) => pass,
            Err(held) => return Ok(held),
        };
        let work = Work::of((url, prior, wanted), pass, delivery);
        self.claimed(task, work, invocation, owner).await
    }

    /// The delivery in the task's set of tries: a fresh set for a message sent long after the
    /// set began (back from the dead-letter queue, a re-queue); spent when the set's
    /// attempts are.
    fn in_tries(&self, delivery: &Delivery, tries: Tries) -> Delivery {
        let fresh = tries.fresh_for(delivery.tries.since, REDRIVE_GAP_MS);
        if fresh {
            tracing::info!(attempts = tries.attempts, "a fresh set of tries begins");
        }
        Delivery {
            tries: TriesFrom {
                fresh,
                ..delivery.tries
            },
            spent: !fresh && tries.spent,
            ..delivery.clone()
        }
    }

    /// The host's turn for this record (`Ok(Err(_))`: it fails without a request: our own
    /// rules refuse the URL, robots.txt forbids it, or it waited too long), or the outcome
    /// of waiting for it. The checks that need no network come first: a refused URL touches
    /// neither the host's item nor robots.txt.
    pub(super) async fn enter_host(
        &self,
        url: Option<&str>,
        wanted: &Wanted,
        delivery: &Delivery,
        budget: Duration,
        invocation: &Invocation,
    ) -> Result<Result<Result<Permit, FetchError>, Outcome>, AwsError> {
        let Some(url) = url else {
            return Ok(Ok(Ok(Permit::default())));
        };
        if let Some(refused) = self.fetcher.refuses(url) {
            return Ok(Ok(Err(refused)));
        }
        let ports = (&self.tasks, &self.fetcher);
        let visit = Visit {
            url,
            booked: delivery.booked,
            booked_at: delivery.booked_at,
            wait_left: delivery.wait_left,
        };
        let job = &wanted.politeness;
        let entry = self
            .gate
            .enter(ports, visit, job, budget, &invocation.measures);
        Ok(after_entry(entry.await?, delivery))
    }

    /// Claims the task, then goes on as [`Worker::after_claim`]; the host's permit is given
    /// back at once if the claim lets nothing through.
    pub(super) async fn claimed(
        &self,
        task: &TaskRef,
        work: Work,
        invocation: &Invocation,
        owner: Option<&str>,
    ) -> Result<Outcome, AwsError> {
        let claim = match self
            .claim(task, (work.receives, work.tries), invocation, owner)
            .await
        {
            Ok(Ok(claim)) => claim,
            Ok(Err(outcome)) => return self.left(work.permit, Ok(outcome), invocation).await,
            Err(err) => return self.left(work.permit, Err(err), invocation).await,
        };
        self.after_claim(task, work, claim, invocation).await
    }

    /// The claim of this delivery, or the outcome when it lets nothing through.
    pub(super) async fn claim(
        &self,
        task: &TaskRef,
        (receives, tries): (u32, TriesFrom),
        invocation: &Invocation,
        owner: Option<&str>,
    ) -> Result<Result<Claimed, Outcome>, AwsError> {
        let lease = owner.map(|owner| Lease {
            owner,
            until: invocation.deadline,
        });
        let patience = self.patience(receives >= self.settings.max_attempts, invocation);
        let claim = (SystemTime::now(), lease, tries);
        Ok(
            match guard::claim(&self.tasks, task, claim, &patience).await? {
                Admission::Admitted {
                    redelivery,
                    attempts,
                    spent,
                    url,
                    prior,
                } => Ok(Claimed {
                    redelivery,
                    attempts,
                    spent,
                    url,
                    prior,
                    owner: owner.map(str::to_owned),
                }),
                Admission::Skipped(outcome) => Err(outcome),
            },
        )
    }

    /// A booked copy come due: its claim is its guard (a task that is terminal or gone
    /// refuses it, and the claim answers the task's URL), so the copy costs no read; then
    /// its host's turn. A turn not given (a cooldown known here, a missed booking booked
    /// again) gives the claim's attempt back.
    pub(super) async fn process_booked(
        &self,
        task: &TaskRef,
        delivery: &Delivery,
        wanted: Wanted,
        invocation: &Invocation,
        owner: Option<&str>,
    ) -> Result<Outcome, AwsError> {
        let claim = match self
            .claim(task, (delivery.receives, delivery.tries), invocation, owner)
            .await?
        {
            Ok(claim) => claim,
            Err(Outcome::LostRace) => return Ok(Outcome::AlreadyTerminal),
            Err(outcome) => return Ok(outcome),
        };
        let delivery = &Delivery {
            spent: claim.spent,
            ..delivery.clone()
        };
        let Some(budget) = self.fetch_budget(invocation) else {
            self.unclaim(task, &claim).await;
            return Ok(Outcome::NoTimeLeft);
        };
        let (url, prior) = (claim.url.clone(), claim.prior.clone());
        let entered = self.enter_host(url.as_deref(), &wanted, delivery, budget, invocation);
        let pass = match entered.await {
            Ok(Ok(pass)) => pass,
            Ok(Err(held)) => {
                self.unclaim(task, &claim).await;
                return Ok(held);
            }
            Err(err) => {
                self.unclaim(task, &claim).await;
                return Err(err);
            }
        };
        let work = Work::of((url, prior, wanted), pass, delivery);
        self.after_claim(task, work, claim, invocation).await
    }

    /// After the claim: adopts a stored page, or sleeps until the host's start and fetches
    /// (unless the task fails without a request) and converges. The claim's attempt is given
    /// back when no fetch follows it, or when the run's paid budget was held elsewhere.
    pub(super) async fn after_claim(
        &self,
        task: &TaskRef,
        work: Work,
        claim: Claimed,
        invocation: &Invocation,
    ) -> Result<Outcome, AwsError> {
        let (redelivery, attempts) = (claim.redelivery, claim.attempts);
        // Every fetch follows a claim: the task's claims count its attempts across copies and
        // waits; this message's own receives bound it too, before the dead-letter queue.
        let max_attempts = self.settings.max_attempts;
        let final_attempt = work.receives >= max_attempts || attempts >= max_attempts;
        let patience = self.patience(final_attempt, invocation);
        let mut stores = Stores::new(&self.tasks, &self.results, patience, work.wanted.counting);
        // A block page an earlier release stored is not adopted.
        stores.detection = work.wanted.detection.clone();
        let key = ResultKey::for_task(&self.settings.results_prefix, task);
        if redelivery && let Some(converged) = stores.adopt_stored(task, &key).await? {
            let adopted = Ok(outcome_of(converged, redelivery, false));
            return self.left(work.permit, adopted, invocation).await;
        }
        // The host's start is slept here, after the claim, so the claim's time is not added
        // to it; a cooldown set meanwhile holds the record instead.
        let work = match self.ready(work, invocation).await? {
            Ok(work) => work,
            Err(Later { delay, booked }) => {
                self.unclaim(task, &claim).await;
                return Ok(Outcome::PoliteHeld { delay, booked });
            }
        };
        let Some(budget) = self.fetch_budget(invocation) else {
            self.unclaim(task, &claim).await;
            return self
                .left(work.permit, Ok(Outcome::NoTimeLeft), invocation)
                .await;
        };
        let attempt = Attempt {
            redelivery,
            final_attempt,
            budget,
        };
        let scraped = self.scrape(task, work, (stores, &key), attempt, invocation);
        let outcome = scraped.await?;
        // The run's paid budget was held elsewhere: a wait, not a try of the task's (like a
        // claim no fetch followed), so a contended budget does not spend its tries.
        if matches!(outcome, Outcome::PoliteHeld { .. }) {
            self.unclaim(task, &claim).await;
        }
        Ok(outcome)
    }
}

/// What the host's answer makes of this delivery: a permit, a failure without a request
/// (robots.txt forbids the URL, our proxy could not fetch it, it waited too long), or a wait
/// (held back instead once the task's tries are spent).
fn after_entry(entry: Entry, delivery: &Delivery) -> Result<Result<Permit, FetchError>, Outcome> {
    let (delay, booked) = match entry {
        Entry::Go(permit) => return Ok(Ok(permit)),
        Entry::Disallowed => return Ok(Err(FetchError::permanent(DISALLOWED))),
        Entry::ProxyFailed => {
            let reason = ROBOTS_PROXY_FAILED.to_owned();
            return Ok(Err(FetchError::ours(reason)));
        }
        Entry::Hold(delay, why) => {
            let delay = backed_off(delay, why, delivery.waits);
            tracing::info!(
                delay_ms = delay.as_millis() as u64,
                ?why,
                "the host has no room"
            );
            (delay, None)
        }
        Entry::Booked { start, delay } => {
            tracing::info!(
                delay_ms = delay.as_millis() as u64,
                start,
                "the host's start booked"
            );
            (delay, Some(start))
        }
    };
    if delivery.spent {
        let reason = TRIES_SPENT.into();
        return Err(Outcome::ScrapeTransient {
            reason,
            retry_after: None,
        });
    }
    if delay > delivery.wait_left {
        return Ok(Err(FetchError::permanent(WAITED_TOO_LONG)));
    }
    Err(Outcome::PoliteHeld { delay, booked })
}
