//! Stage 4, fetch: a redelivery whose page is already stored adopts it instead of fetching.
//! Otherwise the delivery sleeps until its host's start and fetches. The sleep comes after
//! the claim, so the claim's time is not added to it. The paid proxy tier is held back
//! while the run has a budget for it.

mod paid;

pub(super) use paid::PaidTurn;

use std::time::Duration;

use tokio::time::Instant;

use crate::batch::Invocation;
use crate::contract::{Outcome, WaitFor};
use crate::domain::blocks::Detection;
use crate::domain::health::Sign;
use crate::domain::ids::TaskRef;
use crate::domain::model::Page;
use crate::domain::refresh::Prior;
use crate::domain::spend::Spend;
use crate::polite::{Later, Permit};
use crate::ports::error::StoreError;
use crate::ports::hosts::HostStore;
use crate::ports::queue::Visibility;
use crate::ports::results::{Earlier, EarlierCheck, ResultStore};
use crate::ports::spend::SpendStore;
use crate::ports::tasks::TaskStore;
use crate::scraper::{Ask, FetchError, Fetched, Fetcher, health_sign};
use crate::trace;

use super::admit::{Admitted, Pass};
use super::blocked::stored_block;
use super::guard::Claimed;
use super::parents::Wanted;
use super::parse::Delivery;
use super::{Step, Worker};
use paid::Leg;

/// A delivery after its fetch: what the fetch brought, and what the converge stage needs.
#[derive(Debug)]
pub(super) struct Scraped {
    pub claim: Claimed,
    /// The URL fetched, and the earlier result it asked with (a refresh's).
    pub url: Option<String>,
    pub prior: Option<Prior>,
    pub wanted: Wanted,
    pub final_attempt: bool,
    /// The time the fetch (its paid leg, if it ran) was given. It is shorter than
    /// `SCRAPE_TIMEOUT_MS` when the invocation's end was near; a fetch that ran out of it is
    /// not the page's failure.
    pub time: Duration,
    /// What became of the paid tier.
    pub paid: PaidTurn,
    pub page: Result<Page, FetchError>,
    /// What the fetch sent through proxies.
    pub spend: Spend,
    /// The earlier result a refresh carries forward if the page has not changed.
    pub earlier: Option<Earlier>,
}

/// What one fetch is of: the task and the delivery, its URL, what its job and run want, and
/// the earlier result whose validators it asks with.
#[derive(Debug, Clone, Copy)]
pub(super) struct Target<'a> {
    pub task: &'a TaskRef,
    /// The delivery's name, so its paid spend is noted once.
    pub delivery: &'a str,
    /// The copy waited for its run's paid budget: only the paid tier gets its page.
    pub paid_next: bool,
    pub url: Option<&'a str>,
    pub wanted: &'a Wanted,
    pub prior: Option<&'a Prior>,
}

impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility>
    Worker<T, R, F, V>
{
    /// Adopts a stored page, or sleeps until the host's start and fetches. The claim's
    /// attempt is given back when no fetch follows it.
    pub(super) async fn scrape(
        &self,
        delivery: &Delivery,
        admitted: Admitted,
        invocation: &Invocation,
    ) -> Step<Scraped> {
        if admitted.claim.redelivery
            && let Some(adopted) = self.adopted(delivery, &admitted, invocation).await
        {
            let permit = admitted.pass.permit();
            return Err(self.without_permit(permit, adopted, invocation).await);
        }
        let admitted = self.at_start(delivery, admitted, invocation).await?;
        match self.fetch_time(invocation) {
            Some(time) => {
                self.fetch_admitted(delivery, admitted, time, invocation)
                    .await
            }
            None => {
                let ended = self.unclaimed(delivery, &admitted.claim, Outcome::NoTimeLeft);
                let ended = ended.await;
                Err(self
                    .without_permit(admitted.pass.permit(), ended, invocation)
                    .await)
            }
        }
    }

    /// Fetches, within `time`, what the delivery was admitted for.
    async fn fetch_admitted(
        &self,
        delivery: &Delivery,
        admitted: Admitted,
        time: Duration,
        invocation: &Invocation,
    ) -> Step<Scraped> {
        let Admitted {
            claim,
            url,
            prior,
            wanted,
            pass,
            final_attempt,
            followed,
        } = admitted;
        let (prior, earlier) = match self.earlier(prior, &wanted.detection).await {
            Ok(checked) => checked,
            Err(err) => {
                return Err(self
                    .without_permit(pass.permit(), err.into(), invocation)
                    .await);
            }
        };
        let target = Target {
            task: delivery.task(),
            delivery: &delivery.id,
            paid_next: delivery.message.carried.paid_waits > 0 && !followed,
            url: url.as_deref(),
            wanted: &wanted,
            prior: prior.as_ref(),
        };
        let leg = self.fetch_polite(target, pass, time, invocation).await;
        let (page, spend) = (leg.fetched.page, leg.fetched.spend);
        Ok(Scraped {
            claim,
            url,
            prior,
            wanted,
            final_attempt,
            time: leg.time,
            paid: leg.paid,
            page,
            spend,
            earlier,
        })
    }

    /// The delivery once its host's start has come. A cooldown set meanwhile (by any
    /// sandbox's fetch) gives the permit and the claim's attempt back, and the delivery
    /// waits.
    #[tracing::instrument(
        target = "conveyor_step",
        name = "host_start",
        skip_all,
        fields(waited_ms)
    )]
    async fn at_start(
        &self,
        delivery: &Delivery,
        admitted: Admitted,
        invocation: &Invocation,
    ) -> Step<Admitted> {
        let permit = match admitted.pass {
            Pass::Go(permit) => permit,
            refused => {
                return Ok(Admitted {
                    pass: refused,
                    ..admitted
                });
            }
        };
        let ends = invocation.cutoff.checked_sub(self.settings.store_reserve);
        let ends = ends.unwrap_or(invocation.cutoff).into_std();
        let (measures, started) = (&invocation.measures, Instant::now());
        let ready = self.gate.ready(&self.tasks, permit, ends, measures).await;
        let waited = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        tracing::Span::current().record("waited_ms", waited);
        match ready? {
            Ok(permit) => Ok(Admitted {
                pass: Pass::Go(permit),
                ..admitted
            }),
            Err(Later { delay, booked }) => {
                let held = Outcome::PoliteHeld {
                    delay,
                    booked,
                    waits_for: WaitFor::Host,
                };
                Err(self.unclaimed(delivery, &admitted.claim, held).await)
            }
        }
    }

    /// A refresh task's earlier result, if it can be carried forward: its object is there,
    /// with the bytes the task names, and it is not a block page (an older release stored
    /// those). Otherwise the prior is dropped and the page is fetched in full.
    async fn earlier(
        &self,
        prior: Option<Prior>,
        detection: &Detection,
    ) -> Result<(Option<Prior>, Option<Earlier>), StoreError> {
        let Some(prior) = prior else {
            return Ok((None, None));
        };
        if !prior.is_under(&self.settings.results_prefix) {
            tracing::warn!(key = %prior.key, "the earlier result is not one of the results: fetched in full");
            return Ok((None, None));
        }
        let why = match self.results.check_earlier(&prior).await? {
            EarlierCheck::Usable(earlier) => {
                let block = stored_block(&self.results, detection, &prior.key, &earlier.stored);
                match Box::pin(block).await? {
                    None => return Ok((Some(prior), Some(earlier))),
                    Some(_) => "the earlier result is a block page".to_owned(),
                }
            }
            EarlierCheck::Unusable(why) => why,
        };
        tracing::info!(%why, key = %prior.key, "the earlier result cannot be carried forward: fetched in full");
        Ok((None, None))
    }

    /// Fetches with the host's permit. Afterwards the permit is given back, with what the
    /// response said about the host's health. A refused delivery fails for good without a
    /// request.
    async fn fetch_polite(
        &self,
        target: Target<'_>,
        pass: Pass,
        time: Duration,
        invocation: &Invocation,
    ) -> Leg {
        let permit: Permit = match pass {
            Pass::Go(permit) => permit,
            Pass::Refused(refused) => {
                return Leg {
                    fetched: Fetched::unspent(Err(refused)),
                    time,
                    paid: PaidTurn::Done,
                };
            }
        };
        let started = Instant::now();
        let leg = self.fetch_paid_held_back(target, time, invocation).await;
        let fetched = &leg.fetched;
        // The last tier asked (0: direct), once the paid tier had its turn too.
        let tier = fetched.spend.spent().last().map_or(0, |(tier, _)| tier);
        trace::note("tier", tier as i64);
        // A proxy's own failure says nothing about the site's health. Neither does a fetch
        // that our own deadline cut short (the invocation's end, not the site's slowness):
        // the time of its last leg, the paid one if it ran, tells.
        let cut_short = fetched.page.as_ref().is_err_and(|e| e.timed_out)
            && leg.time < self.settings.scrape_timeout;
        // A block page on any tier means the site is refusing us. The fleet slows down, as
        // for a 429, even when a later tier got the page.
        let sign = match fetched.spend.blocks() {
            0 => health_sign(&fetched.page, started.elapsed()).filter(|_| !cut_short),
            _ => Some(Sign::PushedBack(None)),
        };
        self.return_permit(Some(permit), sign, invocation).await;
        leg
    }

    /// One fetch through the scraper, measured.
    async fn fetch(&self, url: Option<&str>, ask: Ask<'_>, invocation: &Invocation) -> Fetched {
        let Some(url) = url else {
            return Fetched::unspent(Err(FetchError::permanent("task has no url")));
        };
        let started = Instant::now();
        let fetched = self.fetcher.fetch(url, ask).await;
        invocation.measures.fetched(started.elapsed());
        invocation.measures.spent(&fetched.spend);
        fetched
    }
}
