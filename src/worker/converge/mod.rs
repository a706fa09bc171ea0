//! Stage 6, converge: the page is stored under the task's key, then the single terminal
//! write that can win is made (`stores`). A redelivery adopts a page an earlier delivery
//! stored instead of fetching it again. A failure worth a retry ends without a terminal
//! write. What the fetch spent through proxies is counted in that write, or recorded on its
//! own.

mod stores;

pub use stores::{Converged, Stores};

use std::time::Duration;

use crate::contract::{Outcome, WaitFor};
use crate::domain::bounds::Reason;
use crate::domain::ids::{ResultKey, TaskRef};
use crate::domain::model::{Counting, Failure, Page};
use crate::domain::render::Render;
use crate::domain::shells::shell_rule;
use crate::domain::spend::Spend;
use crate::metrics::Measures;
use crate::paid::{WAITED_TOO_LONG_FOR_PAID, paid_wait};
use crate::ports::error::StoreError;
use crate::ports::results::{Earlier, ResultStore};
use crate::ports::spend::SpendStore;
use crate::ports::tasks::TaskStore;
use crate::scraper::{FetchError, Retry};

use super::context::Ctx;
use super::fetch::{PaidTurn, Scraped};
use super::parents::Wanted;

/// The stores a task converges in.
pub(super) struct Converge<'a, T, R> {
    pub tasks: &'a T,
    pub results: &'a R,
}

impl<T: TaskStore + SpendStore, R: ResultStore> Converge<'_, T, R> {
    /// Stores the page, or records the fetch's failure. `redelivery`: an earlier delivery
    /// had claimed the task.
    pub async fn store_and_finish(
        &self,
        ctx: &Ctx<'_>,
        redelivery: bool,
        scraped: Scraped,
    ) -> Outcome {
        let (delivery, task) = (ctx.delivery, ctx.task());
        let stores = self.stores(ctx, &scraped.wanted, scraped.final_attempt);
        let stores = stores.for_delivery(&delivery.id, scraped.spend);
        let this_try = Try {
            redelivery,
            final_attempt: scraped.final_attempt,
            time: scraped.time,
            paid: scraped.paid,
            waited: (delivery.message.carried.paid_waits, delivery.wait_left),
            earlier: scraped.earlier.as_ref(),
            measures: ctx.measures(),
            shells_to_renderer: shells_to_renderer(ctx, &scraped.wanted),
        };
        let converged = self.converge_page(ctx, &stores, scraped.page, this_try);
        let outcome = converged.await.unwrap_or_else(Outcome::Store);
        if !stores.spend_counted() {
            let (counting, spend) = (stores.counting, &stores.spend);
            self.record_spend(task, counting, spend, &stores.delivery)
                .await;
        }
        outcome
    }

    /// For a redelivery: the page an earlier delivery already stored, converged instead of
    /// fetched again. A block page stored by an earlier release is not adopted.
    pub async fn adopted(
        &self,
        ctx: &Ctx<'_>,
        wanted: &Wanted,
        final_attempt: bool,
    ) -> Option<Outcome> {
        let (task, key) = (ctx.task(), ctx.result_key());
        let stores = self.stores(ctx, wanted, final_attempt);
        match stores.adopt_stored(task, &key).await {
            Ok(adopted) => adopted.map(|converged| outcome_of(converged, true, false)),
            Err(err) => Some(Outcome::Store(err)),
        }
    }

    /// Stores the page (or carries an unchanged refresh forward), or handles the fetch's
    /// failure.
    async fn converge_page(
        &self,
        ctx: &Ctx<'_>,
        stores: &Stores<'_, T, R>,
        page: Result<Page, FetchError>,
        this_try: Try<'_>,
    ) -> Result<Outcome, StoreError> {
        let (task, key) = (ctx.task(), &ctx.result_key());
        let (measures, redelivery) = (this_try.measures, this_try.redelivery);
        let err = match (page, this_try.earlier) {
            (Ok(page), Some(earlier)) if page.not_modified() => {
                let converged = stores.carry_forward(task, key, earlier, &page).await?;
                if converged == (Converged::Succeeded { adopted: false }) {
                    measures.not_modified(earlier.stored.size);
                }
                return Ok(outcome_of(converged, redelivery, false));
            }
            (Ok(page), _) if page.not_modified() => {
                FetchError::transient("HTTP 304 to a request that named no earlier result")
            }
            (Ok(page), _) => {
                let shell = shell_rule(&page.content_type, &page.body);
                if let Some(rule) = shell.as_ref().filter(|_| this_try.shells_to_renderer) {
                    let reason = rule.as_str().to_owned();
                    return Ok(Outcome::HandedOver { reason });
                }
                let counted = shell.is_some();
                let converged = stores.succeed(task, key, &page, shell).await?;
                if converged == (Converged::Succeeded { adopted: false }) {
                    measures.stored(page.body.len() as u64);
                    if counted {
                        measures.shell_stored();
                    }
                }
                return Ok(outcome_of(converged, redelivery, false));
            }
            (Err(err), _) => err,
        };
        self.failed(ctx, stores, key, err, this_try).await
    }

    /// A fetch that brought no page ends as a wait (the paid budget is held elsewhere, while
    /// the task may still wait), no time left, a retry (our failure, or the site's before the
    /// final attempt), or the task's failure.
    async fn failed(
        &self,
        ctx: &Ctx<'_>,
        stores: &Stores<'_, T, R>,
        key: &ResultKey,
        err: FetchError,
        this_try: Try<'_>,
    ) -> Result<Outcome, StoreError> {
        let task = ctx.task();
        let err = match held_for_paid(this_try) {
            Some(Ok(held)) => return Ok(held),
            Some(Err(waited_too_long)) => waited_too_long,
            None => err,
        };
        // Our own deadline ended the fetch (or its paid leg), not the site's slowness, so it is
        // not the page's failure. A paid leg left for lack of time did not start at all.
        let cut_short = err.timed_out && this_try.time < ctx.settings.scrape_timeout;
        if cut_short || this_try.paid == PaidTurn::NoTime {
            return Ok(Outcome::NoTimeLeft);
        }
        // Our failure is never the page's, on any attempt. On the final attempt it marks the
        // task's tries as used up, and its messages then go to the dead-letter queue.
        let final_attempt = this_try.final_attempt;
        if err.retry == Retry::Ours && final_attempt {
            self.spend_tries(task, &err.reason).await;
        }
        if err.retry == Retry::Ours || (err.retry == Retry::Transient && !final_attempt) {
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
        Ok(outcome_of(converged, this_try.redelivery, gave_up))
    }

    /// The stores as this try writes to them: conflicts retried with the try's patience,
    /// the run's counters updated the way the run counts, and a stored block page never
    /// adopted.
    fn stores<'a>(
        &'a self,
        ctx: &Ctx<'a>,
        wanted: &Wanted,
        final_attempt: bool,
    ) -> Stores<'a, T, R> {
        let patience = ctx.patience(final_attempt);
        let stores = Stores::new(self.tasks, self.results, patience, wanted.counting);
        let reason = ctx.delivery.message.render_reason();
        stores
            .checking(wanted.detection.clone())
            .handed_over(reason)
    }

    /// Marks the task's tries as used up. A failure is only logged; the task is then
    /// retried as before, with its messages parked while its host says to wait.
    async fn spend_tries(&self, task: &TaskRef, reason: &str) {
        if let Err(err) = self.tasks.spend_tries(task, &Reason::new(reason)).await {
            tracing::warn!(error = %err, "could not mark the task's tries spent");
        }
    }

    /// Records what a fetch spent through proxies in its run's counters, once for this
    /// delivery. This happens when no terminal write counted it: a retry, a lost race, a run
    /// without counters, or a write whose answer was lost (the store counts it once per
    /// delivery). If recording fails after the SDK's retries, the spend is logged with the
    /// error.
    pub async fn record_spend(
        &self,
        task: &TaskRef,
        counting: Counting,
        spend: &Spend,
        delivery: &str,
    ) {
        if spend.is_zero() {
            return;
        }
        let recorded = self.tasks.record_spend(task, counting, spend, delivery);
        if let Err(err) = recorded.await {
            tracing::error!(error = %err, ?spend, "the fetch's spend could not be recorded");
        }
    }
}

/// What converging this try's fetch result needs to know about the try.
#[derive(Clone, Copy)]
struct Try<'a> {
    /// An earlier delivery had claimed the task.
    redelivery: bool,
    /// A transient failure is final.
    final_attempt: bool,
    /// The time the fetch (its paid leg, if it ran) was given.
    time: Duration,
    /// What became of the paid tier.
    paid: PaidTurn,
    /// The waits the task had for its run's paid budget, and how much longer it may wait
    /// (`POLITE_MAX_WAIT_MS` from its first wait of any kind).
    waited: (u32, Duration),
    /// The earlier result a refresh carries forward if the page has not changed.
    earlier: Option<&'a Earlier>,
    measures: &'a Measures,
    /// An application shell is handed over to the renderer instead of stored.
    shells_to_renderer: bool,
}

/// Whether a page that is an application shell goes to the renderer: the job (or task)
/// says `render: auto`, the renderer's queue is known, and the task was not handed over
/// already (the renderer has no queue of its own to hand over to).
fn shells_to_renderer(ctx: &Ctx<'_>, wanted: &Wanted) -> bool {
    let handed = ctx.delivery.message.render_reason().is_some();
    let queue = ctx.settings.render_queue.is_some();
    queue && !handed && wanted.render.render == Render::Auto
}

/// For a record whose run's paid budget is held elsewhere: a wait for it, growing with its
/// paid waits, or, once it waited `POLITE_MAX_WAIT_MS`, the task's failure. `None` for any
/// other record.
fn held_for_paid(this_try: Try<'_>) -> Option<Result<Outcome, FetchError>> {
    if this_try.paid != PaidTurn::Busy {
        return None;
    }
    let (waits, wait_left) = this_try.waited;
    Some(match paid_wait(waits, wait_left) {
        Some(delay) => Ok(Outcome::WaitHeld {
            delay,
            booked: None,
            waits_for: WaitFor::PaidBudget,
        }),
        None => Err(FetchError::permanent(WAITED_TOO_LONG_FOR_PAID)),
    })
}

/// The outcome of a converged task.
pub(super) fn outcome_of(converged: Converged, redelivery: bool, gave_up: bool) -> Outcome {
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
