//! The fetch with the host's permit (the paid proxy tier held back while a run has a
//! budget), its spend recorded, and the convergence of what it brought.

use crate::batch::Invocation;
use crate::batch::contract::Outcome;
use crate::domain::bounds::Reason;
use crate::domain::health::Sign;
use crate::domain::ids::{ResultKey, TaskRef};
use crate::domain::model::{Failure, Page};
use crate::metrics::Measures;
use crate::paid::{PaidHold, PaidTurn};
use crate::polite::{Later, Permit};
use crate::ports::error::AwsError;
use crate::ports::hosts::HostStore;
use crate::ports::queue::Visibility;
use crate::ports::results::{Checked, Earlier, ResultStore};
use crate::ports::spend::SpendStore;
use crate::ports::tasks::TaskStore;
use crate::pushback::retry::Patience;
use crate::scraper::{Ask, FetchError, Fetched, Fetcher, Retry, health_sign};
use crate::worker::converge::{Converged, Stores};
use std::time::Duration;
use tokio::time::Instant;

use super::{Attempt, DISALLOWED, MIN_FETCH, Work, Worker, outcome_of};

/// Why a fetch that needed the paid tier did not use it: its run's budget is held by
/// fetches in flight. The record waits (a parked copy, its try given back) for them to
/// settle.
const PAID_BUDGET_HELD: &str = "the paid tier's budget is held by fetches in flight";

/// How long a record waits for its run's paid budget held elsewhere: about when this
/// sandbox reads the run's budget again.
const PAID_BUDGET_WAIT: Duration = Duration::from_secs(5);

/// The outcome of carrying an earlier result forward.
fn carried(
    converged: Converged,
    earlier: &Earlier,
    attempt: Attempt,
    measures: &Measures,
) -> Outcome {
    if converged == (Converged::Succeeded { adopted: false }) {
        measures.not_modified(earlier.stored.size);
    }
    outcome_of(converged, attempt.redelivery, false)
}

impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility>
    Worker<T, R, F, V>
{
    /// Fetches and converges; what the fetch spent through proxies is counted in the
    /// terminal write, or recorded alone when no terminal write of this delivery counted it.
    pub(super) async fn scrape(
        &self,
        task: &TaskRef,
        mut work: Work,
        (mut stores, key): (Stores<'_, T, R>, &ResultKey),
        attempt: Attempt,
        invocation: &Invocation,
    ) -> Result<Outcome, AwsError> {
        let delivery = work.delivery.clone();
        let earlier = self.earlier(&mut work).await?;
        let fetched = self
            .fetch_polite(task, work, attempt.budget, invocation)
            .await;
        stores.spend = fetched.spend;
        stores.delivery = delivery;
        let measures = &invocation.measures;
        let page = (fetched.page, earlier.as_ref());
        let converged = self.converge(&stores, task, key, page, attempt, measures);
        let converged = converged.await;
        if !stores.spend_counted() {
            self.record_spend(task, &stores).await;
        }
        converged
    }

    /// A refresh task's earlier result, if it can be carried forward (its object is there,
    /// with the bytes the task names); otherwise the work forgets it and fetches in full.
    async fn earlier(&self, work: &mut Work) -> Result<Option<Earlier>, AwsError> {
        let Some(prior) = work.prior.take() else {
            return Ok(None);
        };
        if !prior.is_under(&self.settings.results_prefix) {
            tracing::warn!(key = %prior.key, "the earlier result is not one of the results: fetched in full");
            return Ok(None);
        }
        match self.results.check_earlier(&prior).await? {
            Checked::Usable(earlier) => {
                work.prior = Some(prior);
                Ok(Some(earlier))
            }
            Checked::Unusable(why) => {
                tracing::info!(%why, key = %prior.key, "the earlier result cannot be carried forward: fetched in full");
                Ok(None)
            }
        }
    }

    /// Fetches with the host's permit, given back with the answer after; without one (the
    /// URL refused, robots.txt forbids it, it waited too long), fails for good without a
    /// request. The paid tier's bytes are taken from this sandbox's share of the run's
    /// budget.
    pub(super) async fn fetch_polite(
        &self,
        task: &TaskRef,
        mut work: Work,
        budget: Duration,
        invocation: &Invocation,
    ) -> Fetched {
        let Some(permit) = work.permit.take() else {
            let refused = work.refused.take();
            let refused = refused.unwrap_or_else(|| FetchError::permanent(DISALLOWED));
            return Fetched::unspent(Err(refused));
        };
        let started = Instant::now();
        let fetched = self.fetch_budgeted(task, &work, budget, invocation).await;
        // What the site's answer says of its health; a proxy's own (ours) says nothing, nor
        // a fetch our own budget cut short (the invocation's end, not the site's slowness).
        let cut_short = fetched.page.as_ref().is_err_and(|e| e.timed_out)
            && budget < self.settings.scrape_timeout;
        // A block page met on any tier is the site's refusal of us: the fleet slows, as for a
        // 429, even when a later tier got the page.
        let sign = match fetched.spend.blocks() {
            0 => health_sign(&fetched.page, started.elapsed()).filter(|_| !cut_short),
            _ => Some(Sign::PushedBack(None)),
        };
        self.leave(Some(permit), sign, invocation).await;
        fetched
    }

    /// The fetch, with the paid proxy tier held back while the run has a budget for it:
    /// asked only once the other tiers are blocked, and only with a hold on its most bytes
    /// from this sandbox's reservations of that budget, settled with what it spent.
    pub(super) async fn fetch_budgeted(
        &self,
        task: &TaskRef,
        work: &Work,
        budget: Duration,
        invocation: &Invocation,
    ) -> Fetched {
        let url = work.url.as_deref();
        let within = |budget| Ask {
            if_changed: work.prior.as_ref().map(|prior| &prior.validators),
            detection: &work.wanted.detection,
            ..Ask::within(budget)
        };
        let (Some(run_budget), paid @ 1..) = (work.wanted.paid_budget, self.settings.proxy_tiers)
        else {
            return self.fetch(url, within(budget), invocation).await;
        };
        let started = Instant::now();
        let withheld = Ask {
            paid_tier: false,
            ..within(budget)
        };
        let first = self.fetch(url, withheld, invocation).await;
        if !first.wants_paid_tier {
            return first;
        }
        let cap = self.settings.paid_fetch_cap;
        let (hold, first) = match self.paid_hold(task, run_budget, first).await {
            Ok(held) => held,
            Err(ended) => return ended,
        };
        let ask = Ask {
            first_tier: paid,
            wire_most: Some(cap),
            ..within(budget.saturating_sub(started.elapsed()))
        };
        let last = self.fetch(url, ask, invocation).await;
        let spent = last.spend.tier(paid).billed();
        self.paid.settle(&self.tasks, hold, spent).await;
        Fetched {
            spend: first.spend.plus(&last.spend),
            ..last
        }
    }

    /// A hold on the paid tier's most bytes from the run's budget, with the first fetch; or
    /// what that fetch ends as without one: the budget spent, held by fetches in flight, or
    /// not readable (what the other tiers spent is spent all the same).
    async fn paid_hold(
        &self,
        task: &TaskRef,
        run_budget: u64,
        first: Fetched,
    ) -> Result<(PaidHold, Fetched), Fetched> {
        let cap = self.settings.paid_fetch_cap;
        let reason = match self.paid.hold(&self.tasks, task, run_budget, cap).await {
            Ok(PaidTurn::Go(hold)) => return Ok((hold, first)),
            Ok(PaidTurn::Spent) => return Err(first),
            Ok(PaidTurn::Held) => PAID_BUDGET_HELD.to_owned(),
            Err(err) => format!("the paid tier's budget could not be read: {err}"),
        };
        let page = Err(FetchError::ours(reason));
        Err(Fetched { page, ..first })
    }

    /// Marks the task's tries spent; a failure is logged (the task is then tried again as
    /// before, its messages parked while its host says wait).
    async fn spend_tries(&self, task: &TaskRef, reason: &str) {
        if let Err(err) = self.tasks.spend_tries(task, &Reason::new(reason)).await {
            tracing::warn!(error = %err, "could not mark the task's tries spent");
        }
    }

    /// Records what a fetch spent through proxies into its run's counters, once for this
    /// delivery, when no terminal write of its counted it (a retry, a lost race, a run
    /// without counters; or its answer was lost: the store counts it once for the
    /// delivery). A record that fails after the SDK's retries is logged with it.
    pub(super) async fn record_spend(&self, task: &TaskRef, stores: &Stores<'_, T, R>) {
        let spend = &stores.spend;
        if spend.is_zero() {
            return;
        }
        let recorded = self
            .tasks
            .record_spend(task, stores.counting, spend, &stores.delivery);
        if let Err(err) = recorded.await {
            tracing::error!(error = %err, ?spend, "the fetch's spend could not be recorded");
        }
    }

    /// The work once its host's start has come (`Err`: when to come back; the permit was
    /// given back).
    pub(super) async fn ready(
        &self,
        mut work: Work,
        invocation: &Invocation,
    ) -> Result<Result<Work, Later>, AwsError> {
        let Some(permit) = work.permit.take() else {
            return Ok(Ok(work));
        };
        let ends = invocation.cutoff.checked_sub(self.settings.store_reserve);
        let ends = ends.unwrap_or(invocation.cutoff);
        let ready = self
            .gate
            .ready(&self.tasks, permit, ends.into_std(), &invocation.measures);
        Ok(ready.await?.map(|permit| Work {
            permit: Some(permit),
            ..work
        }))
    }

    /// `ended`, once the permit of a record that did not fetch is given back.
    pub(super) async fn left(
        &self,
        permit: Option<Permit>,
        ended: Result<Outcome, AwsError>,
        invocation: &Invocation,
    ) -> Result<Outcome, AwsError> {
        self.leave(permit, None, invocation).await;
        ended
    }

    pub(super) async fn leave(
        &self,
        permit: Option<Permit>,
        sign: Option<Sign>,
        invocation: &Invocation,
    ) {
        if let Some(permit) = permit {
            self.gate
                .leave(&self.tasks, permit, sign, &invocation.measures)
                .await;
        }
    }

    /// How conflicting writes are tried again. On the final attempt a conflict that
    /// persists would send the message to the dead-letter queue with the task unfinished: it
    /// is tried again until the cutoff.
    pub(super) fn patience<'i>(
        &self,
        final_attempt: bool,
        invocation: &'i Invocation,
    ) -> Patience<'i> {
        let mut policy = self.settings.conflict_retries;
        if final_attempt {
            policy.attempts = u32::MAX;
        }
        Patience::new(invocation.cutoff, policy, &invocation.measures.conflicts)
    }

    /// Time for a fetch: the smaller of `SCRAPE_TIMEOUT_MS` and what is left before the
    /// cutoff once `STORE_RESERVE_MS` is kept for storing the page; `None` when that is
    /// under [`MIN_FETCH`] (the page would be fetched again on redelivery).
    pub(super) fn fetch_budget(&self, invocation: &Invocation) -> Option<Duration> {
        let left = invocation.cutoff.saturating_duration_since(Instant::now());
        let left = left.checked_sub(self.settings.store_reserve)?;
        (left >= MIN_FETCH).then(|| left.min(self.settings.scrape_timeout))
    }

    pub(super) async fn fetch(
        &self,
        url: Option<&str>,
        ask: Ask<'_>,
        invocation: &Invocation,
    ) -> Fetched {
        let Some(url) = url else {
            return Fetched::unspent(Err(FetchError::permanent("task has no url")));
        };
        let started = Instant::now();
        let fetched = self.fetcher.fetch(url, ask).await;
        invocation.measures.fetched(started.elapsed());
        invocation.measures.spent(&fetched.spend);
        fetched
    }

    /// Stores a page, or records a failure that is final; a failure worth a retry, or one
    /// of our own budget, ends without a terminal write.
    pub(super) async fn converge(
        &self,
        stores: &Stores<'_, T, R>,
        task: &TaskRef,
        key: &ResultKey,
        (fetched, earlier): (Result<Page, FetchError>, Option<&Earlier>),
        attempt: Attempt,
        measures: &Measures,
    ) -> Result<Outcome, AwsError> {
        let err = match (fetched, earlier) {
            (Ok(page), Some(earlier)) if page.not_modified() => {
                let converged = stores.carry_forward(task, key, earlier, &page).await?;
                return Ok(carried(converged, earlier, attempt, measures));
            }
            (Ok(page), _) if page.not_modified() => {
                FetchError::transient("HTTP 304 to a request that named no earlier result")
            }
            (Ok(page), _) => {
                let converged = stores.succeed(task, key, &page).await?;
                if converged == (Converged::Succeeded { adopted: false }) {
                    measures.stored(page.body.len() as u64);
                }
                return Ok(outcome_of(converged, attempt.redelivery, false));
            }
            (Err(err), _) => err,
        };
        self.failed(stores, task, key, err, attempt).await
    }

    /// A fetch that brought no page: a wait (the paid budget held elsewhere), no time left,
    /// a retry (ours, or the site's before the final attempt), or the task's failure.
    async fn failed(
        &self,
        stores: &Stores<'_, T, R>,
        task: &TaskRef,
        key: &ResultKey,
        err: FetchError,
        attempt: Attempt,
    ) -> Result<Outcome, AwsError> {
        // The paid tier's budget is held by other fetches for now: a wait, not a try.
        if err.retry == Retry::Ours && err.reason == PAID_BUDGET_HELD {
            let delay = PAID_BUDGET_WAIT;
            return Ok(Outcome::PoliteHeld {
                delay,
                booked: None,
            });
        }
        // Our own budget ended the fetch, not the site's slowness: not the page's failure.
        if err.timed_out && attempt.budget < self.settings.scrape_timeout {
            return Ok(Outcome::NoTimeLeft);
        }
        // A failure of ours is never the page's, whatever the attempt; on the final attempt
        // it spends the task's tries (its messages then go to the dead-letter queue).
        if err.retry == Retry::Ours && attempt.final_attempt {
            self.spend_tries(task, &err.reason).await;
        }
        if err.retry == Retry::Ours || (err.retry == Retry::Transient && !attempt.final_attempt) {
            return Ok(Outcome::ScrapeTransient {
                reason: err.reason,
                retry_after: err.retry_after,
            });
        }
        let gave_up = err.retry == Retry::Transient;
        let failure = Failure {
            reason: Reason::new(&err.reason),
            http_status: err.http_status,
        };
        let converged = stores.fail(task, key, failure).await?;
        Ok(outcome_of(converged, attempt.redelivery, gave_up))
    }
}
