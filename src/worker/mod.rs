//! One record, start to end: parse, guard, scrape, converge; the answer is an [`Outcome`].
//! Its way to the fetch is in `turn`, the fetch and its convergence in `fetch`, and where a
//! record goes when it is not done here (a copy, a hold, the quarantine) in `park`.

mod admit;
pub mod converge;
mod fetch;
pub mod guard;
pub mod parents;
mod park;

use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use sha2::{Digest, Sha256};

use crate::batch::contract::Outcome;
use crate::batch::{Invocation, ProcessRecord};
use crate::domain::ids::TaskRef;
use crate::domain::message::Message;
use crate::domain::model::DuplicatePolicy;
use crate::domain::model::TriesFrom;
use crate::domain::refresh::Prior;
use crate::domain::time::epoch_millis;
use crate::paid::PaidAllowances;
use crate::polite::{Gate, HoldReason, Permit, Politeness};
use crate::ports::error::AwsFault;
use crate::ports::hosts::HostStore;
use crate::ports::queue::{SQS_MAX_DELAY, SQS_MAX_VISIBILITY, Visibility};
use crate::ports::results::ResultStore;
use crate::ports::spend::SpendStore;
use crate::ports::tasks::TaskStore;
use crate::pushback::backoff::Backoff;
use crate::pushback::pressure::Pressure;
use crate::pushback::retry::RetryPolicy;
use crate::scraper::{FetchError, Fetcher};
use crate::worker::converge::Converged;
use crate::worker::parents::{ParentsCache, Wanted};

/// The settings one record needs, made from the configuration by the wiring
/// (`wiring/settings.rs`).
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
    /// How long a sandbox keeps a run's "job active, run running" (`parents::ParentsCache`).
    pub parents_ttl: Duration,
    pub backoff: Backoff,
    pub duplicate_policy: DuplicatePolicy,
    /// Per-host limits shared by the fleet, and robots.txt.
    pub politeness: Politeness,
    /// How many proxy tiers `PROXY_URLS` has; the last is the paid one (0: direct).
    pub proxy_tiers: usize,
    /// The most bytes on the wire one paid fetch may take ([`crate::scraper::most_spent`]):
    /// what it holds of its run's budget while it runs, and where its relay cuts it.
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
    /// This sandbox's records at once under AWS push-back (AIMD).
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
    /// Processes one record within the invocation. Never fails: every end is an outcome.
    pub async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
        let message = match Message::parse(record.body.as_deref(), sent_at(record)) {
            Ok(message) => message,
            Err(poison) => return self.quarantine(record, poison).await,
        };
        let task = &message.task;
        name_span(task);
        if message.redriven {
            tracing::info!("sent again long after its copy was written: a fresh set of tries");
        }
        let carried = &message.carried;
        let receives = receive_count(record) + carried.receives_before;
        let owner = self.lease_owner(invocation, record);
        let delivery = Delivery {
            // On a FIFO queue a wait is a hold that burns a receive: the task's claims, which
            // a wait gives back, count its tries there, not the message's receives.
            receives: if on_fifo(record) { 1 } else { receives },
            booked: carried.booking,
            booked_at: carried.copied_at,
            waits: carried.waits,
            wait_left: self.wait_left(carried.polite_since),
            id: delivery_id(record, receives),
            tries: TriesFrom {
                since: carried.tries_since,
                fresh: false,
            },
            spent: false,
        };
        let outcome = self
            .process_task(task, &delivery, invocation, owner.as_deref())
            .await
            .unwrap_or_else(Outcome::Store);
        let outcome = self.requeue_politely(record, &message, outcome).await;
        if let Some(owner) = owner.as_deref()
            && ends_without_terminal_write(&outcome)
        {
            self.release(task, owner).await;
        }
        let outcome = self.send_again(record, &message, outcome, receives).await;
        let outcome = self.to_back_of_group(record, &message, outcome).await;
        if let Some(delay) = self.hold_for(&outcome, receives, carried.copies) {
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
    fn wait_left(&self, polite_since: Option<u64>) -> Duration {
        let now = epoch_millis(SystemTime::now()) as u64;
        let waited = polite_since.map_or(0, |since| now.saturating_sub(since));
        let max_wait = self.settings.politeness.max_wait;
        max_wait.saturating_sub(Duration::from_millis(waited))
    }

    /// The hold of a record AWS pushed back on: it grows with the receives and copies while
    /// the sandbox's pressure is strained.
    fn pressed_hold(&self, receives: u32, copies: u32) -> Duration {
        let strain = self.pressure.strain();
        self.settings.backoff.pressed(receives + copies, strain)
    }

    /// How long a message to retry stays invisible before it comes back, if not the
    /// queue's own visibility timeout. `copies`: the fresh copies of it sent before.
    fn hold_for(&self, outcome: &Outcome, receives: u32, copies: u32) -> Option<Duration> {
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
            // AWS pushed back (throttled, failed, timed out, unreachable): a hold growing
            // with the receives and copies while the sandbox's pressure is strained (short
            // once it has eased: held records are not kept away from a resource that has
            // room), jittered so they do not all return at once, never next to nothing. The
            // copies are bounded by time (PRESSED_COPIES_FOR), so they outlast a table's
            // warm-up. A refusal (access, a missing table) waits out the queue's timeout.
            outcome if pushed_back(outcome) => Some(self.pressed_hold(receives, copies)),
            Outcome::NoTimeLeft => Some(Duration::ZERO),
            Outcome::PoliteHeld { delay, .. } => Some((*delay).min(MAX_POLITE_HOLD)),
            _ => None,
        }
    }
}

/// Names the task in the record's span, so its every line says which task it is of.
fn name_span(task: &TaskRef) {
    let span = tracing::Span::current();
    span.record("job_id", task.job_id.as_str());
    span.record("run_id", task.run_id.as_str());
    span.record("task_id", task.task_id.as_str());
}

/// What the guard's reads and the gate gave a delivery to work on.
struct Work {
    url: Option<String>,
    /// The earlier result a refresh task names; once checked, only one that can be carried
    /// forward, whose validators the fetch asks with (`None`: the page is fetched in full).
    prior: Option<Prior>,
    wanted: Wanted,
    /// The host's permit to fetch; `None`: the task fails without a request, for `refused`
    /// (robots.txt forbids the URL when there is no reason).
    permit: Option<Permit>,
    refused: Option<FetchError>,
    receives: u32,
    /// The set of tries its claim counts in.
    tries: TriesFrom,
    /// Names this delivery (its spend is recorded once).
    delivery: String,
}

impl Work {
    /// The work of `delivery` on the task at `url`, with the host's permit, or the reason
    /// it fails without a request.
    fn of(
        (url, prior, wanted): (Option<String>, Option<Prior>, Wanted),
        pass: Result<Permit, FetchError>,
        delivery: &Delivery,
    ) -> Self {
        let (permit, refused) = match pass {
            Ok(permit) => (Some(permit), None),
            Err(refused) => (None, Some(refused)),
        };
        Self {
            url,
            prior,
            wanted,
            permit,
            refused,
            receives: delivery.receives,
            tries: delivery.tries,
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
    /// When the copy carrying the booking was sent (about when it was booked).
    booked_at: Option<u64>,
    /// Politeness waits earlier copies had, and how much longer it may wait.
    waits: u32,
    wait_left: Duration,
    id: String,
    /// The set of tries its claim counts in (a fresh one for a message back from the
    /// dead-letter queue).
    tries: TriesFrom,
    /// The task's final attempt failed for a reason of ours, not the site's: it is no
    /// longer parked for its host, but held back, so its receives take it to the
    /// dead-letter queue.
    spent: bool,
}

/// Why a task whose tries are spent is held back rather than parked for its host.
pub const TRIES_SPENT: &str =
    "its tries are spent on failures of ours: held back, toward the dead-letter queue";

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

/// The reason of ours a task's try ends with while our proxy cannot fetch its host's
/// robots.txt.
pub const ROBOTS_PROXY_FAILED: &str =
    "the host's robots.txt could not be fetched through the proxy";

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
/// (this one included), its URL and its earlier result.
struct Claimed {
    redelivery: bool,
    attempts: u32,
    /// The task's final attempt had failed for a reason of ours.
    spent: bool,
    url: Option<String>,
    prior: Option<Prior>,
    /// The lease's owner, if the claim took one (`DUPLICATE_POLICY=lease`).
    owner: Option<String>,
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
/// How long copies are sent for a record AWS keeps pushing back on, from its first such
/// copy: longer than a new table takes to double its rate (30 minutes) a few times, or a
/// hot key to split.
pub const PRESSED_COPIES_FOR: Duration = Duration::from_secs(2 * 3_600);

/// AWS pushed back (throttled, failed, timed out, unreachable).
fn pushed_back(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Store(err) if err.aws_fault().is_some_and(AwsFault::is_push_back))
}

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

/// Whether the record came from a FIFO queue (its ARN ends in `.fifo`).
fn on_fifo(record: &SqsMessage) -> bool {
    record
        .event_source_arn
        .as_deref()
        .is_some_and(|arn| arn.ends_with(".fifo"))
}

/// SQS's `SentTimestamp` (ms since the epoch), if the record has it.
fn sent_at(record: &SqsMessage) -> Option<u64> {
    record.attributes.get("SentTimestamp")?.parse().ok()
}

/// SQS's `ApproximateReceiveCount`: 1 on the first delivery. Missing or odd values count as 1.
fn receive_count(record: &SqsMessage) -> u32 {
    record
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// The worker as the batch runs it: each record to its outcome, the sandbox's pressure, and
/// the paid-tier bytes given back after the batch.
impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility> ProcessRecord
    for Worker<T, R, F, V>
{
    async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
        Worker::process(self, record, invocation).await
    }

    async fn out_of_time(&self, record: &SqsMessage) -> Outcome {
        Worker::out_of_time(self, record).await
    }

    async fn held_in_group(&self, record: &SqsMessage) -> Outcome {
        Worker::held_in_group(self, record).await
    }

    fn pressure(&self) -> Option<&Pressure> {
        Some(&self.pressure)
    }

    /// Gives the paid-tier bytes reserved and not spent back to their runs.
    async fn after_batch(&self) {
        self.paid.give_back(&self.tasks).await;
    }
}
