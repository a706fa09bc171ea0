//! One record, start to end: parse, guard, scrape, converge; the answer is an [`Outcome`].

use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::batch::Invocation;
use crate::budget::PaidAllowances;
use crate::contract::Outcome;
use crate::converge::{Converged, Stores};
use crate::domain::bounds::Reason;
use crate::domain::ids::{QuarantineKey, ResultKey, TaskRef};
use crate::domain::message::{self, Poison};
use crate::domain::model::DuplicatePolicy;
use crate::domain::model::{Failure, Page, TaskStatus};
use crate::domain::time::{epoch_millis, rfc3339};
use crate::guard::{self, Admission, Checked, ParentsCache, Wanted};
use crate::metrics::Measures;
use crate::polite::{Entry, Gate, HoldReason, Later, Permit, Politeness, Visit};
use crate::retry::{Patience, RetryPolicy};
use crate::scraper::{Ask, FetchError, Fetched, Fetcher, Retry};
use crate::store::error::AwsError;
use crate::store::hosts::HostStore;
use crate::store::queue::{QueueRef, SQS_MAX_DELAY, SQS_MAX_VISIBILITY, Visibility};
use crate::store::results::ResultStore;
use crate::store::spend::SpendStore;
use crate::store::tasks::{Lease, TaskStore};

/// The settings one record needs, from [`Config`].
#[derive(Debug, Clone)]
pub struct RecordSettings {
    pub results_prefix: String,
    pub quarantine_prefix: String,
    pub max_attempts: u32,
    pub scrape_timeout: Duration,
    /// Kept free before the cutoff for storing a fetched page.
    pub store_reserve: Duration,
    /// How a write that meets a concurrent one is tried again.
    pub conflict_retries: RetryPolicy,
    /// How long a sandbox keeps a run's "job active, run running" (`guard::ParentsCache`).
    pub parents_ttl: Duration,
    pub backoff: Backoff,
    pub duplicate_policy: DuplicatePolicy,
    /// Per-host limits shared by the fleet, and robots.txt.
    pub politeness: Politeness,
    /// How many proxy tiers `PROXY_URLS` has; the last is the paid one (0: direct).
    pub proxy_tiers: usize,
}

/// The worker's ports and settings, built once per cold start, and what a sandbox keeps
/// between invocations (the parents cache, the hosts' views and robots.txt).
#[derive(Debug)]
pub struct Worker<T, R, F, V> {
    pub tasks: T,
    pub results: R,
    pub fetcher: F,
    pub visibility: V,
    pub settings: RecordSettings,
    pub parents: ParentsCache,
    pub gate: Gate,
    /// This sandbox's shares of runs' paid-tier budgets.
    pub paid: PaidAllowances,
}

impl<T, R, F, V> Worker<T, R, F, V> {
    pub fn new(tasks: T, results: R, fetcher: F, visibility: V, settings: RecordSettings) -> Self {
        Self {
            parents: ParentsCache::new(settings.parents_ttl),
            gate: Gate::new(settings.politeness.clone()),
            paid: PaidAllowances::default(),
            tasks,
            results,
            fetcher,
            visibility,
            settings,
        }
    }
}

impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility>
    Worker<T, R, F, V>
{
    /// Processes one record within the invocation. Never fails: every end is an outcome.
    pub async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
        let task = match message::parse_body(record.body.as_deref()) {
            Ok(task) => task,
            Err(poison) => return self.quarantine(record, poison).await,
        };
        let span = tracing::Span::current();
        span.record("job_id", task.job_id.as_str());
        span.record("run_id", task.run_id.as_str());
        span.record("task_id", task.task_id.as_str());
        let body = record.body.as_deref();
        let receives = receive_count(record) + message::receives_before(body);
        let owner = self.lease_owner(invocation, record);
        let delivery = Delivery {
            receives,
            booked: message::booking(body),
            waits: message::polite_waits(body),
            wait_left: self.wait_left(body),
            id: delivery_id(record, receives),
        };
        let outcome = self
            .process_task(&task, &delivery, invocation, owner.as_deref())
            .await
            .unwrap_or_else(Outcome::Store);
        let outcome = self.requeue_politely(record, outcome).await;
        if let Some(owner) = owner.as_deref()
            && ends_without_terminal_write(&outcome)
        {
            self.release(&task, owner).await;
        }
        let outcome = self.send_again(record, outcome, receives).await;
        if let Some(delay) = self.hold_for(&outcome, receives) {
            self.hold(record, delay).await;
        }
        outcome
    }

    /// Under `DUPLICATE_POLICY=lease`, this delivery: the invocation's request id and the
    /// message id, so two copies of a task in one batch do not share a lease either.
    fn lease_owner(&self, invocation: &Invocation, record: &SqsMessage) -> Option<String> {
        match self.settings.duplicate_policy {
            DuplicatePolicy::Converge => None,
            DuplicatePolicy::Lease => Some(format!(
                "{}/{}",
                invocation.request_id,
                record.message_id.as_deref().unwrap_or_default()
            )),
        }
    }

    /// How much longer this task may wait for its host: `POLITE_MAX_WAIT_MS` from its first
    /// wait (which a copy's body carries).
    fn wait_left(&self, body: Option<&str>) -> Duration {
        let now = epoch_millis(SystemTime::now()) as u64;
        let waited = message::polite_since(body).map_or(0, |since| now.saturating_sub(since));
        let max_wait = self.settings.politeness.max_wait;
        max_wait.saturating_sub(Duration::from_millis(waited))
    }

    /// How long a message to retry stays invisible before it comes back, if not the
    /// queue's own visibility timeout.
    fn hold_for(&self, outcome: &Outcome, receives: u32) -> Option<Duration> {
        match outcome {
            Outcome::ScrapeTransient { retry_after, .. } => {
                Some(self.settings.backoff.delay(*retry_after, receives))
            }
            // Back exactly when the lease ends (not capped by the backoff's maximum: coming
            // back earlier would only find the lease again and burn a receive).
            Outcome::LeaseHeld { until } => {
                let left = until.duration_since(SystemTime::now()).unwrap_or_default();
                Some(left + Duration::from_secs(1))
            }
            // Contention passes in moments, not in a visibility timeout.
            Outcome::Store(err) if err.is_conflict() => {
                Some(self.settings.backoff.delay(None, receives))
            }
            Outcome::NoTimeLeft => Some(Duration::ZERO),
            Outcome::PoliteHeld { delay, .. } => Some((*delay).min(MAX_POLITE_HOLD)),
            _ => None,
        }
    }

    /// A record its host has no room for is sent again as a fresh copy, due after its wait
    /// (at most SQS's 15 minutes), so waiting burns no receive toward the dead-letter queue.
    /// A longer wait is held through the visibility timeout instead (up to
    /// [`MAX_POLITE_HOLD`]) on the first receive of a copy that carries its booking, so a
    /// day-long wait costs a copy or two; later receives send a fresh copy again. Not on a
    /// FIFO queue (a copy would lose its place), nor if the copy cannot be sent (then held
    /// back instead).
    async fn requeue_politely(&self, record: &SqsMessage, outcome: Outcome) -> Outcome {
        let Outcome::PoliteHeld { delay, booked } = outcome else {
            return outcome;
        };
        let arn = record.event_source_arn.as_deref().unwrap_or_default();
        let (Some(queue), Some(body)) = (QueueRef::from_arn(arn), record.body.as_deref()) else {
            return outcome;
        };
        let carries_booking = booked.is_some() && message::booking(Some(body)) == booked;
        let first_receive = receive_count(record) == 1;
        if arn.ends_with(".fifo") || (delay > SQS_MAX_DELAY && carries_booking && first_receive) {
            return outcome;
        }
        let now = epoch_millis(SystemTime::now()) as u64;
        let body = message::for_next_wait(body, booked, now);
        match self.visibility.requeue(&queue, &body, delay).await {
            Ok(()) => Outcome::PoliteRequeued { delay },
            Err(err) => {
                tracing::warn!(error = %err, "could not send the held record again; held back instead");
                outcome
            }
        }
    }

    /// A final attempt that ended for a reason of ours, not the page's (too little time
    /// left to fetch, a store error), is sent again as a fresh copy carrying the receives
    /// spent before it: the task still gets its last try instead of the dead-letter queue.
    /// Bounded ([`MAX_COPIES`]), and not on a FIFO queue; if the copy cannot be sent, the
    /// outcome stands (the message comes back and meets the redrive policy).
    async fn send_again(&self, record: &SqsMessage, outcome: Outcome, receives: u32) -> Outcome {
        let ours = matches!(outcome, Outcome::NoTimeLeft | Outcome::Store(_));
        let arn = record.event_source_arn.as_deref().unwrap_or_default();
        let body = record.body.as_deref();
        if !ours
            || receives < self.settings.max_attempts
            || arn.ends_with(".fifo")
            || message::copies(body) >= MAX_COPIES
        {
            return outcome;
        }
        let (Some(queue), Some(body)) = (QueueRef::from_arn(arn), body) else {
            return outcome;
        };
        let delay = self.hold_for(&outcome, receives).unwrap_or_default();
        // This receive did not try the page: it is not counted.
        let body = message::for_another_try(body, receives.saturating_sub(1));
        match self.visibility.requeue(&queue, &body, delay).await {
            Ok(()) => Outcome::SentAgain { delay },
            Err(err) => {
                tracing::warn!(error = %err, "could not send the final attempt again");
                outcome
            }
        }
    }

    /// Keeps a poison message in S3 before it is acknowledged; if that fails, it is retried
    /// rather than lost.
    async fn quarantine(&self, record: &SqsMessage, poison: Poison) -> Outcome {
        let message_id = record.message_id.as_deref().unwrap_or_default();
        let key = QuarantineKey::for_message(&self.settings.quarantine_prefix, message_id);
        let document = serde_json::json!({
            "reason": poison.0,
            "quarantined_at": rfc3339(SystemTime::now()),
            "record": record,
        });
        // Serialising a JSON value into a Vec cannot fail.
        let document = serde_json::to_vec_pretty(&document).unwrap_or_default();
        match self.results.quarantine(&key, document).await {
            Ok(()) => Outcome::Poison(poison),
            Err(err) => Outcome::Store(err),
        }
    }

    /// Keeps a message to retry invisible for `delay`. If that fails, the message still
    /// comes back, after the queue's own visibility timeout.
    async fn hold(&self, record: &SqsMessage, delay: Duration) {
        let queue = record
            .event_source_arn
            .as_deref()
            .and_then(QueueRef::from_arn);
        let (Some(queue), Some(handle)) = (queue, record.receipt_handle.as_deref()) else {
            tracing::warn!("no queue ARN or receipt handle: redelivery after the queue's timeout");
            return;
        };
        match self.visibility.hold(&queue, handle, delay).await {
            Ok(()) => tracing::info!(delay_ms = delay.as_millis() as u64, "held back for retry"),
            Err(err) => {
                tracing::warn!(error = %err, "could not hold back; redelivery after the queue's timeout")
            }
        }
    }

    /// Gives the lease up, so the next delivery need not wait for it to expire.
    async fn release(&self, task: &TaskRef, owner: &str) {
        if let Err(err) = self.tasks.release(task, owner).await {
            tracing::warn!(error = %err, "could not release the lease; it expires at the deadline");
        }
    }

    async fn process_task(
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
    async fn process_fresh(
        &self,
        task: &TaskRef,
        delivery: &Delivery,
        invocation: &Invocation,
        owner: Option<&str>,
    ) -> Result<Outcome, AwsError> {
        let (url, wanted) = match guard::check(&self.tasks, &self.parents, task).await? {
            Checked::Wanted { url, wanted } => (url, wanted),
            Checked::Skipped(outcome) => return Ok(outcome),
        };
        let Some(budget) = self.fetch_budget(invocation) else {
            return Ok(Outcome::NoTimeLeft);
        };
        let entered = self.enter_host(url.as_deref(), &wanted, delivery, budget, invocation);
        let pass = match entered.await? {
            Ok(pass) => pass,
            Err(held) => return Ok(held),
        };
        let work = Work::of((url, wanted), pass, delivery);
        self.claimed(task, work, invocation, owner).await
    }

    /// The host's turn for this record (`Ok(Err(_))`: it fails without a request: our own
    /// rules refuse the URL, robots.txt forbids it, or it waited too long), or the outcome
    /// of waiting for it. The checks that need no network come first: a refused URL touches
    /// neither the host's item nor robots.txt.
    async fn enter_host(
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
            wait_left: delivery.wait_left,
        };
        let job = &wanted.politeness;
        let entry = self
            .gate
            .enter(ports, visit, job, budget, &invocation.measures);
        let (delay, booked) = match entry.await? {
            Entry::Go(permit) => return Ok(Ok(Ok(permit))),
            Entry::Disallowed => return Ok(Ok(Err(FetchError::permanent(DISALLOWED)))),
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
        if delay > delivery.wait_left {
            return Ok(Ok(Err(FetchError::permanent(WAITED_TOO_LONG))));
        }
        Ok(Err(Outcome::PoliteHeld { delay, booked }))
    }

    /// Claims the task, then goes on as [`Worker::after_claim`]; the host's permit is given
    /// back at once if the claim lets nothing through.
    async fn claimed(
        &self,
        task: &TaskRef,
        work: Work,
        invocation: &Invocation,
        owner: Option<&str>,
    ) -> Result<Outcome, AwsError> {
        let claim = match self.claim(task, work.receives, invocation, owner).await {
            Ok(Ok(claim)) => claim,
            Ok(Err(outcome)) => return self.left(work.permit, Ok(outcome), invocation).await,
            Err(err) => return self.left(work.permit, Err(err), invocation).await,
        };
        self.after_claim(task, work, claim, invocation).await
    }

    /// The claim of this delivery, or the outcome when it lets nothing through.
    async fn claim(
        &self,
        task: &TaskRef,
        receives: u32,
        invocation: &Invocation,
        owner: Option<&str>,
    ) -> Result<Result<Claimed, Outcome>, AwsError> {
        let lease = owner.map(|owner| Lease {
            owner,
            until: invocation.deadline,
        });
        let patience = self.patience(receives >= self.settings.max_attempts, invocation);
        let claim = (SystemTime::now(), lease);
        Ok(
            match guard::claim(&self.tasks, task, claim, &patience).await? {
                Admission::Admitted {
                    redelivery,
                    attempts,
                    url,
                } => Ok(Claimed {
                    redelivery,
                    attempts,
                    url,
                }),
                Admission::Skipped(outcome) => Err(outcome),
            },
        )
    }

    /// A booked copy come due: its claim is its guard (a task that is terminal or gone
    /// refuses it, and the claim answers the task's URL), so the copy costs no read; then
    /// its host's turn. A turn not given (a cooldown known here, a missed booking booked
    /// again) gives the claim's attempt back.
    async fn process_booked(
        &self,
        task: &TaskRef,
        delivery: &Delivery,
        wanted: Wanted,
        invocation: &Invocation,
        owner: Option<&str>,
    ) -> Result<Outcome, AwsError> {
        let claim = match self
            .claim(task, delivery.receives, invocation, owner)
            .await?
        {
            Ok(claim) => claim,
            Err(Outcome::LostRace) => return Ok(Outcome::AlreadyTerminal),
            Err(outcome) => return Ok(outcome),
        };
        let Some(budget) = self.fetch_budget(invocation) else {
            self.unclaim(task, &claim).await;
            return Ok(Outcome::NoTimeLeft);
        };
        let url = claim.url.clone();
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
        let work = Work::of((url, wanted), pass, delivery);
        self.after_claim(task, work, claim, invocation).await
    }

    /// After the claim: adopts a stored page, or sleeps until the host's start and fetches
    /// (unless the task fails without a request) and converges. The claim's attempt is given
    /// back when no fetch follows it.
    async fn after_claim(
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
        let stores = Stores::new(&self.tasks, &self.results, patience, work.wanted.counting);
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
        self.scrape(task, work, (stores, &key), attempt, invocation)
            .await
    }

    /// Fetches and converges; what the fetch spent through proxies is counted in the
    /// terminal write, or recorded alone when no terminal write of this delivery counted it.
    async fn scrape(
        &self,
        task: &TaskRef,
        work: Work,
        (mut stores, key): (Stores<'_, T, R>, &ResultKey),
        attempt: Attempt,
        invocation: &Invocation,
    ) -> Result<Outcome, AwsError> {
        let delivery = work.delivery.clone();
        let fetched = self
            .fetch_polite(task, work, attempt.budget, invocation)
            .await;
        stores.spend = fetched.spend;
        let measures = &invocation.measures;
        let converged = self.converge(&stores, task, key, fetched.page, attempt, measures);
        let converged = converged.await;
        if !stores.spend_counted() {
            self.record_spend(task, &stores, &delivery).await;
        }
        converged
    }

    /// Fetches with the host's permit, given back with the answer after; without one (the
    /// URL refused, robots.txt forbids it, it waited too long), fails for good without a
    /// request. The paid tier's bytes are taken from this sandbox's share of the run's
    /// budget.
    async fn fetch_polite(
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
        let fetched = self.fetch_budgeted(task, &work, budget, invocation).await;
        if work.wanted.paid_budget.is_some() {
            let paid = fetched.spend.tier(self.settings.proxy_tiers);
            self.paid.spent(task, paid.bytes);
        }
        // The site's answer, for its cooldown; a proxy's own (ours) says nothing of the site.
        let answer = fetched
            .page
            .as_ref()
            .err()
            .filter(|e| e.retry != Retry::Ours)
            .and_then(|e| e.http_status.map(|s| (s, e.retry_after)));
        self.leave(Some(permit), answer, invocation).await;
        fetched
    }

    /// The fetch, with the paid proxy tier held back while the run has a budget for it:
    /// asked only once the other tiers are blocked, and only while this sandbox holds (or
    /// can reserve) some of that budget.
    async fn fetch_budgeted(
        &self,
        task: &TaskRef,
        work: &Work,
        budget: Duration,
        invocation: &Invocation,
    ) -> Fetched {
        let url = work.url.as_deref();
        let (Some(run_budget), paid @ 1..) = (work.wanted.paid_budget, self.settings.proxy_tiers)
        else {
            return self.fetch(url, Ask::within(budget), invocation).await;
        };
        let started = Instant::now();
        let withheld = Ask {
            paid_tier: false,
            ..Ask::within(budget)
        };
        let first = self.fetch(url, withheld, invocation).await;
        if !first.wants_paid_tier {
            return first;
        }
        match self.paid.may_use(&self.tasks, task, run_budget).await {
            Ok(true) => {}
            Ok(false) => return first,
            Err(err) => {
                let reason = format!("the paid tier's budget could not be read: {err}");
                return Fetched::unspent(Err(FetchError::ours(reason)));
            }
        }
        let ask = Ask {
            first_tier: paid,
            ..Ask::within(budget.saturating_sub(started.elapsed()))
        };
        let last = self.fetch(url, ask, invocation).await;
        Fetched {
            spend: first.spend.plus(&last.spend),
            ..last
        }
    }

    /// Records what a fetch spent through proxies into its run's counters, once for this
    /// delivery, when no terminal write of its counted it (a retry, a lost race, a run
    /// without counters). A record that fails after the SDK's retries is logged with it.
    async fn record_spend(&self, task: &TaskRef, stores: &Stores<'_, T, R>, delivery: &str) {
        let spend = &stores.spend;
        if spend.is_zero() {
            return;
        }
        let recorded = self
            .tasks
            .record_spend(task, stores.counting, spend, delivery);
        if let Err(err) = recorded.await {
            tracing::error!(error = %err, ?spend, "the fetch's spend could not be recorded");
        }
    }

    /// The work once its host's start has come (`Err`: when to come back; the permit was
    /// given back).
    async fn ready(
        &self,
        mut work: Work,
        invocation: &Invocation,
    ) -> Result<Result<Work, Later>, AwsError> {
        let Some(permit) = work.permit.take() else {
            return Ok(Ok(work));
        };
        let ready = self.gate.ready(&self.tasks, permit, &invocation.measures);
        Ok(ready.await?.map(|permit| Work {
            permit: Some(permit),
            ..work
        }))
    }

    /// `ended`, once the permit of a record that did not fetch is given back.
    async fn left(
        &self,
        permit: Option<Permit>,
        ended: Result<Outcome, AwsError>,
        invocation: &Invocation,
    ) -> Result<Outcome, AwsError> {
        self.leave(permit, None, invocation).await;
        ended
    }

    async fn leave(
        &self,
        permit: Option<Permit>,
        answer: Option<(u16, Option<Duration>)>,
        invocation: &Invocation,
    ) {
        if let Some(permit) = permit {
            self.gate
                .leave(&self.tasks, permit, answer, &invocation.measures)
                .await;
        }
    }

    /// How conflicting writes are tried again. On the final attempt a conflict that
    /// persists would send the message to the dead-letter queue with the task unfinished: it
    /// is tried again until the cutoff.
    fn patience<'i>(&self, final_attempt: bool, invocation: &'i Invocation) -> Patience<'i> {
        let mut policy = self.settings.conflict_retries;
        if final_attempt {
            policy.attempts = u32::MAX;
        }
        Patience::new(invocation.cutoff, policy, &invocation.measures.conflicts)
    }

    /// Gives back the attempt of a claim that was not followed by a fetch (and the status it
    /// found, so the next delivery is not taken for a redelivery). A failure is logged: the
    /// task then counts one attempt more than it was fetched.
    async fn unclaim(&self, task: &TaskRef, claim: &Claimed) {
        let was = if claim.redelivery {
            TaskStatus::Processing
        } else {
            TaskStatus::Pending
        };
        if let Err(err) = self.tasks.unclaim(task, was).await {
            tracing::warn!(error = %err, "could not give the claim's attempt back");
        }
    }

    /// Time for a fetch: the smaller of `SCRAPE_TIMEOUT_MS` and what is left before the
    /// cutoff once `STORE_RESERVE_MS` is kept for storing the page; `None` when that is
    /// under [`MIN_FETCH`] (the page would be fetched again on redelivery).
    fn fetch_budget(&self, invocation: &Invocation) -> Option<Duration> {
        let left = invocation.cutoff.saturating_duration_since(Instant::now());
        let left = left.checked_sub(self.settings.store_reserve)?;
        (left >= MIN_FETCH).then(|| left.min(self.settings.scrape_timeout))
    }

    async fn fetch(&self, url: Option<&str>, ask: Ask, invocation: &Invocation) -> Fetched {
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
    async fn converge(
        &self,
        stores: &Stores<'_, T, R>,
        task: &TaskRef,
        key: &ResultKey,
        fetched: Result<Page, FetchError>,
        attempt: Attempt,
        measures: &Measures,
    ) -> Result<Outcome, AwsError> {
        let err = match fetched {
            Ok(page) => {
                let converged = stores.succeed(task, key, &page).await?;
                if converged == (Converged::Succeeded { adopted: false }) {
                    measures.stored(page.body.len() as u64);
                }
                return Ok(outcome_of(converged, attempt.redelivery, false));
            }
            Err(err) => err,
        };
        // Our own budget ended the fetch, not the site's slowness: not the page's failure.
        if err.timed_out && attempt.budget < self.settings.scrape_timeout {
            return Ok(Outcome::NoTimeLeft);
        }
        // A failure of ours is never the page's, whatever the attempt.
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

/// What the guard's reads and the gate gave a delivery to work on.
struct Work {
    url: Option<String>,
    wanted: Wanted,
    /// The host's permit to fetch; `None`: the task fails without a request, for `refused`
    /// (robots.txt forbids the URL when there is no reason).
    permit: Option<Permit>,
    refused: Option<FetchError>,
    receives: u32,
    /// Names this delivery (its spend is recorded once).
    delivery: String,
}

impl Work {
    /// The work of `delivery` on the task at `url`, with the host's permit, or the reason
    /// it fails without a request.
    fn of(
        (url, wanted): (Option<String>, Wanted),
        pass: Result<Permit, FetchError>,
        delivery: &Delivery,
    ) -> Self {
        let (permit, refused) = match pass {
            Ok(permit) => (Some(permit), None),
            Err(refused) => (None, Some(refused)),
        };
        Self {
            url,
            wanted,
            permit,
            refused,
            receives: delivery.receives,
            delivery: delivery.id.clone(),
        }
    }
}

/// One delivery of a task: its receive count (earlier copies' included), the host's start a
/// copy carries, and a name for it.
#[derive(Debug, Clone)]
struct Delivery {
    receives: u32,
    booked: Option<u64>,
    /// Politeness waits earlier copies had, and how much longer it may wait.
    waits: u32,
    wait_left: Duration,
    id: String,
}

/// A name for this delivery, at most 36 characters (a DynamoDB idempotency token): the same
/// for the same receive of a message (its receipt handle, new at every receive), different
/// for any other.
fn delivery_id(record: &SqsMessage, receives: u32) -> String {
    let message = record.message_id.as_deref().unwrap_or_default();
    let receipt = record.receipt_handle.as_deref().unwrap_or_default();
    let digest = Sha256::digest(format!("{message}#{receipt}#{receives}").as_bytes());
    hex::encode(&digest[..16])
}

/// The longest a wait is held through the visibility timeout: SQS's 12 hours from the
/// receive, less what the invocation may have taken of them.
pub const MAX_POLITE_HOLD: Duration = SQS_MAX_VISIBILITY.saturating_sub(Duration::from_secs(3_600));

/// The reason a task robots.txt forbids fails with.
pub const DISALLOWED: &str = "disallowed by robots.txt";

/// The reason a task fails with once it waited `POLITE_MAX_WAIT_MS` for its host.
pub const WAITED_TOO_LONG: &str = "waited too long for its host";

/// A wait for robots.txt (being fetched elsewhere, or not to be had) grows with the copy's
/// waits past the first few, so a host whose robots.txt never answers costs a copy per task
/// every 15 minutes, not every minute; a wait for the host's schedule, slots or cooldown is
/// what the host says.
fn backed_off(delay: Duration, why: HoldReason, waits: u32) -> Duration {
    match why {
        HoldReason::Robots => {
            let backoff = Duration::from_secs(1 << waits.saturating_sub(4).min(10));
            delay.max(backoff).min(SQS_MAX_DELAY)
        }
        HoldReason::Host => delay,
    }
}

/// A claim made: whether an earlier delivery had claimed the task, the task's claims so far
/// (this one included), and its URL.
struct Claimed {
    redelivery: bool,
    attempts: u32,
    url: Option<String>,
}

/// What a delivery knows of its attempt at a task.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    /// An earlier delivery had claimed the task.
    redelivery: bool,
    /// `ApproximateReceiveCount >= MAX_ATTEMPTS`: a transient failure is final.
    final_attempt: bool,
    /// The fetch's time budget.
    budget: Duration,
}

/// Copies a message may have after final attempts that ended for reasons of ours; past them,
/// it meets the queue's redrive policy like any other.
pub const MAX_COPIES: u32 = 10;

pub use crate::domain::time::MIN_FETCH;

/// The outcome of a converged task.
fn outcome_of(converged: Converged, redelivery: bool, gave_up: bool) -> Outcome {
    match converged {
        Converged::Succeeded { adopted } => Outcome::Succeeded {
            redelivery,
            adopted,
        },
        Converged::LostRace => Outcome::LostRace,
        Converged::Failed { reason } if gave_up => Outcome::GaveUp { reason },
        Converged::Failed { reason } => Outcome::FailedPermanently { reason },
    }
}

/// Outcomes after which the task may still be open (no terminal write by this delivery).
fn ends_without_terminal_write(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::ScrapeTransient { .. } | Outcome::Store(_) | Outcome::NoTimeLeft
    )
}

/// SQS's `ApproximateReceiveCount`: 1 on the first delivery. Missing or odd values count as 1.
fn receive_count(record: &SqsMessage) -> u32 {
    record
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}
