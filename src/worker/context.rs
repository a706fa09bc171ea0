//! What every stage of one record reads: its delivery (which `parse` makes), its
//! invocation and the record's settings, with the time and patience they leave a stage.

use std::time::Duration;

use tokio::time::Instant;

use crate::batch::Invocation;
use crate::contract::Outcome;
use crate::domain::ids::{ResultKey, TaskRef};
use crate::domain::message::Message;
use crate::domain::model::{DuplicatePolicy, TriesFrom};
use crate::domain::time::MIN_FETCH;
use crate::metrics::Measures;
use crate::polite::Politeness;
use crate::ports::queue::QueueRef;
use crate::pushback::backoff::Backoff;
use crate::pushback::retry::{Patience, RetryPolicy};

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
    /// It is what the fetch earmarks of its run's budget while it runs, and where its relay
    /// cuts it off.
    pub paid_fetch_cap: u64,
    /// How long this sandbox's lease on its paid-tier reservations lasts
    /// ([`crate::paid::LEASE`]).
    pub paid_lease: Duration,
    /// The renderer's queue, which pages that need a browser are handed over to. None: the
    /// worker fetches every page plain (and the renderer itself has none).
    pub render_queue: Option<QueueRef>,
}

/// One delivery of a task: its message, how many times the message was received, and a
/// name for the delivery.
#[derive(Debug)]
pub(super) struct Delivery {
    /// The task, and what earlier copies of the message carried in its body.
    pub message: Message,
    /// How many times the message was received, counting earlier copies.
    pub receives: u32,
    /// The receives that count toward the task's tries. On a FIFO queue a wait is a hold
    /// that takes a receive, so there only the task's claims count (this is 1).
    pub counted_receives: u32,
    /// How much longer the task may wait for its host or its run's paid budget
    /// (`POLITE_MAX_WAIT_MS` from its first wait of either kind).
    pub wait_left: Duration,
    /// A name for this delivery (at most 36 characters), so its spend is recorded only once.
    pub id: String,
    /// Under `DUPLICATE_POLICY=lease`, the owner of the lease this delivery takes.
    pub owner: Option<String>,
    /// The message came from a FIFO queue.
    pub fifo: bool,
}

impl Delivery {
    pub fn task(&self) -> &TaskRef {
        &self.message.task
    }

    /// The set of tries the message belongs to, as its body says.
    pub fn tries(&self) -> TriesFrom {
        TriesFrom {
            since: self.message.carried.tries_since,
            fresh: false,
        }
    }
}

/// What a stage returns: the value for the next stage, or the outcome the record ended
/// with. A store error ends it as [`Outcome::Store`].
pub(super) type Stage<T> = Result<T, Outcome>;

/// One record's context, made once its body is parsed and handed to every stage.
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub delivery: &'a Delivery,
    pub invocation: &'a Invocation,
    pub settings: &'a RecordSettings,
}

impl<'a> Ctx<'a> {
    pub fn task(&self) -> &'a TaskRef {
        self.delivery.task()
    }

    pub fn measures(&self) -> &'a Measures {
        &self.invocation.measures
    }

    /// Time for a fetch: the smaller of `SCRAPE_TIMEOUT_MS` and what is left before the
    /// cutoff after keeping `STORE_RESERVE_MS` for storing the page. `None` when that is
    /// under [`MIN_FETCH`] (the page would be fetched again on redelivery).
    pub fn fetch_time(&self) -> Option<Duration> {
        let left = self
            .invocation
            .cutoff
            .saturating_duration_since(Instant::now());
        let left = left.checked_sub(self.settings.store_reserve)?;
        (left >= MIN_FETCH).then(|| left.min(self.settings.scrape_timeout))
    }

    /// Whether a transient failure of this try is final: the message's receives or the
    /// task's claims (`attempts`) reached `MAX_ATTEMPTS`.
    pub fn final_attempt(&self, attempts: u32) -> bool {
        let most = self.settings.max_attempts;
        self.delivery.counted_receives >= most || attempts >= most
    }

    /// How conflicting writes are retried. On the final attempt, a conflict that persists
    /// would send the message to the dead-letter queue with the task unfinished. So on the
    /// final attempt the write is retried until the cutoff.
    pub fn patience(&self, final_attempt: bool) -> Patience<'a> {
        let mut policy = self.settings.conflict_retries;
        if final_attempt {
            policy.attempts = u32::MAX;
        }
        let invocation = self.invocation;
        Patience::new(invocation.cutoff, policy, &invocation.measures.conflicts)
    }

    /// The key the task's result is stored under.
    pub fn result_key(&self) -> ResultKey {
        ResultKey::for_task(&self.settings.results_prefix, self.task())
    }
}
