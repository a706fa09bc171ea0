//! One record, start to end, in six stages, a file each, run in this order by
//! [`Worker::process`]:
//!
//! 1. `parse`: the SQS record becomes a delivery of one task. A poison body goes to
//!    quarantine.
//! 2. `guard`: one read says whether the task still wants work (`parents` caches the
//!    job's and run's "yes").
//! 3. `admit`: the politeness gate gives the fetch its host's turn, then the task is
//!    claimed.
//! 4. `fetch`: a page already stored is adopted, or the record sleeps until the host's
//!    start and fetches the page (`fetch/paid`: the paid proxy tier).
//!    A redirect, or a `304` that does not confirm the validators sent, leads to another
//!    request: it goes through admit and fetch again (`hops`).
//! 5. `converge`: the page is stored, then the single terminal write is made
//!    (`converge/stores`).
//! 6. `park`: a record not finished here is sent again as a copy or held back, and its
//!    outcome goes into the batch's reply.
//!
//! Each stage hands the next a value of its own type (`Delivery`, `Guarded`, `Admitted`,
//! `Scraped`), or ends the delivery with its [`Outcome`].

mod admit;
mod blocked;
pub mod converge;
mod fetch;
pub mod guard;
mod hops;
pub mod parents;
mod park;
mod parse;

pub use park::MAX_COPIES;

use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use tokio::time::Instant;

use crate::batch::{Invocation, ProcessRecord};
use crate::contract::Outcome;
use crate::domain::hops::Hops;
use crate::domain::model::DuplicatePolicy;
use crate::paid::PaidAllowances;
use crate::polite::{Gate, Politeness};
use crate::ports::hosts::HostStore;
use crate::ports::queue::Visibility;
use crate::ports::results::ResultStore;
use crate::ports::spend::SpendStore;
use crate::ports::tasks::TaskStore;
use crate::pushback::backoff::Backoff;
use crate::pushback::pressure::Pressure;
use crate::pushback::retry::{Patience, RetryPolicy};
use crate::scraper::Fetcher;
use parents::ParentsCache;
use parse::Delivery;

pub use crate::domain::time::MIN_FETCH;

/// The settings one record needs, made from the configuration by the wiring
/// (`wiring/settings.rs`).
#[derive(Debug, Clone)]
pub struct RecordSettings {
    pub results_prefix: String,
    pub quarantine_prefix: String,
    pub max_attempts: u32,
    /// Redirects followed before the task fails for good, counted across its copies.
    pub max_redirects: usize,
    pub scrape_timeout: Duration,
    /// Time kept free before the cutoff for storing a fetched page.
    pub store_reserve: Duration,
    /// How a write that meets a concurrent one is tried again.
    pub conflict_retries: RetryPolicy,
    /// How long a sandbox keeps a run's "job active, run running" (`parents::ParentsCache`).
    pub parents_ttl: Duration,
    pub backoff: Backoff,
    pub duplicate_policy: DuplicatePolicy,
    /// Per-host limits shared by the fleet, and robots.txt.
    pub politeness: Politeness,
    /// How many proxy tiers `PROXY_URLS` has; the last is the paid one (0: direct).
    pub proxy_tiers: usize,
    /// The most bytes on the wire one paid fetch may use ([`crate::scraper::most_spent`]).
    /// It is what the fetch holds of its run's budget while it runs, and where its relay
    /// cuts it off.
    pub paid_fetch_cap: u64,
    /// How long this sandbox's lease on its paid-tier reservations lasts
    /// ([`crate::paid::LEASE`]).
    pub paid_lease: Duration,
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
    /// How many records this sandbox runs at once while AWS pushes back (AIMD).
    pub pressure: Pressure,
}

impl<T, R, F, V> Worker<T, R, F, V> {
    pub fn new(tasks: T, results: R, fetcher: F, visibility: V, settings: RecordSettings) -> Self {
        Self {
            parents: ParentsCache::new(settings.parents_ttl),
            gate: Gate::new(settings.politeness.clone()),
            paid: PaidAllowances::new(settings.paid_lease),
            pressure: Pressure::default(),
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
    /// Runs one record through the stages within the invocation. Never fails: every end is
    /// an outcome.
    pub async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
        let mut delivery = match self.parse(record, invocation) {
            Ok(delivery) => delivery,
            Err(poison) => return self.quarantine(record, poison).await,
        };
        let mut chain = delivery.message.hops.clone();
        let outcome = match self.stages(&delivery, &mut chain, invocation).await {
            Ok(outcome) | Err(outcome) => outcome,
        };
        // A copy sent from here on goes on from where the redirects led.
        delivery.message.hops = chain;
        let handoffs = &invocation.handoffs;
        self.park(record, (&delivery, handoffs), outcome).await
    }

    /// Stages 2 to 5: each hands the delivery on to the next, or ends it with its outcome.
    /// A redirect (`hops`) is another request, so it goes through admit and fetch again;
    /// `chain` is where the redirects have led.
    async fn stages(
        &self,
        delivery: &Delivery,
        chain: &mut Option<Hops>,
        invocation: &Invocation,
    ) -> Step<Outcome> {
        let guarded = self.guard(delivery, invocation).await?;
        let guarded = hops::resumed(guarded, chain.as_ref());
        let admitted = self.admit(delivery, guarded, invocation).await?;
        let mut scraped = self.scrape(delivery, admitted, invocation).await?;
        let most = self.settings.max_redirects;
        while let Some(next) = hops::next_hop(&mut scraped, chain.as_ref(), most) {
            let next = chain.insert(next);
            scraped = self.hop(delivery, scraped, next, invocation).await?;
        }
        Ok(self.converge(delivery, scraped, invocation).await)
    }

    /// How conflicting writes are retried. On the final attempt, a conflict that persists
    /// would send the message to the dead-letter queue with the task unfinished. So on the
    /// final attempt the write is retried until the cutoff.
    fn patience<'i>(&self, final_attempt: bool, invocation: &'i Invocation) -> Patience<'i> {
        let mut policy = self.settings.conflict_retries;
        if final_attempt {
            policy.attempts = u32::MAX;
        }
        Patience::new(invocation.cutoff, policy, &invocation.measures.conflicts)
    }

    /// Time for a fetch: the smaller of `SCRAPE_TIMEOUT_MS` and what is left before the
    /// cutoff after keeping `STORE_RESERVE_MS` for storing the page. `None` when that is
    /// under [`MIN_FETCH`] (the page would be fetched again on redelivery).
    fn fetch_time(&self, invocation: &Invocation) -> Option<Duration> {
        let left = invocation.cutoff.saturating_duration_since(Instant::now());
        let left = left.checked_sub(self.settings.store_reserve)?;
        (left >= MIN_FETCH).then(|| left.min(self.settings.scrape_timeout))
    }
}

/// What a stage returns: the delivery for its next stage, or the outcome it ended with. A
/// store error ends it as [`Outcome::Store`].
type Step<T> = Result<T, Outcome>;

/// The worker as the batch runs it: each record to its outcome, and the paid-tier bytes
/// given back after the batch.
impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility> ProcessRecord
    for Worker<T, R, F, V>
{
    /// A record waits for its turn under the sandbox's pressure limit (AWS push-back), and
    /// the limit then learns from its outcome.
    async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
        let _turn = self.pressure.admit().await;
        let outcome = Worker::process(self, record, invocation).await;
        self.pressure.learn(&outcome);
        outcome
    }

    async fn out_of_time(&self, record: &SqsMessage) -> Outcome {
        Worker::out_of_time(self, record).await
    }

    async fn held_in_group(&self, record: &SqsMessage) -> Outcome {
        Worker::held_in_group(self, record).await
    }

    /// Gives the paid-tier bytes reserved and not spent back to their runs.
    async fn after_batch(&self) {
        self.paid.give_back(&self.tasks).await;
    }
}
