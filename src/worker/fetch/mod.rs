//! Stage 5, fetch: the request sleeps until its host's start, then fetches. The sleep comes
//! after the claim, so the claim's time is not added to it. The paid proxy tier is held
//! back while the run has a budget for it (`paid`).

mod paid;

pub(super) use paid::PaidTurn;

use std::time::Duration;

use tokio::time::Instant;

use crate::contract::{Outcome, WaitFor};
use crate::domain::blocks::Detection;
use crate::domain::health::Sign;
use crate::domain::ids::TaskRef;
use crate::domain::model::Page;
use crate::domain::refresh::Prior;
use crate::domain::spend::Spend;
use crate::paid::PaidAllowances;
use crate::polite::{Later, Permit, Schedule};
use crate::ports::error::StoreError;
use crate::ports::hosts::HostStore;
use crate::ports::results::{Earlier, EarlierCheck, ResultStore};
use crate::ports::spend::SpendStore;
use crate::scraper::{Ask, FetchError, Fetched, Fetcher, health_sign};
use crate::trace;

use super::admit::{Admitted, Pass};
use super::blocked::stored_block;
use super::context::{Ctx, Stage};
use super::parents::Wanted;
use paid::Leg;

/// A delivery after its fetch: what the fetch brought, and what the converge stage needs.
#[derive(Debug)]
pub(super) struct Scraped {
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

/// What a fetch uses: the host's schedule and item, the fetcher, the results (a refresh's
/// earlier one), and this sandbox's shares of the runs' paid budgets.
pub(super) struct Fetch<'a, T, R, F> {
    pub tasks: &'a T,
    pub results: &'a R,
    pub fetcher: &'a F,
    pub schedule: &'a Schedule,
    pub paid: &'a PaidAllowances,
}

impl<T: HostStore + SpendStore, R: ResultStore, F: Fetcher> Fetch<'_, T, R, F> {
    /// Sleeps until the host's start, then fetches what the request was admitted for. The
    /// stage holds the host's permit from here, and gives it back on every way out: with
    /// what the fetch said of the host's health, or without a fetch (a cooldown set
    /// meanwhile by any sandbox's fetch is a wait; too little time left ends it).
    pub async fn fetch_page(&self, ctx: &Ctx<'_>, admitted: Admitted) -> Stage<Scraped> {
        let pass = self.at_start(ctx, admitted.pass).await?;
        let Some(time) = ctx.fetch_time() else {
            self.leave(ctx, pass.permit(), None).await;
            return Err(Outcome::NoTimeLeft);
        };
        let admitted = Admitted { pass, ..admitted };
        self.fetch_admitted(ctx, admitted, time).await
    }

    /// Fetches, within `time`, what the request was admitted for.
    async fn fetch_admitted(
        &self,
        ctx: &Ctx<'_>,
        admitted: Admitted,
        time: Duration,
    ) -> Stage<Scraped> {
        let Admitted {
            url,
            prior,
            wanted,
            pass,
            final_attempt,
            followed,
        } = admitted;
        let (prior, earlier) = match self.earlier(ctx, prior, &wanted.detection).await {
            Ok(checked) => checked,
            Err(err) => {
                self.leave(ctx, pass.permit(), None).await;
                return Err(err.into());
            }
        };
        let carried = &ctx.delivery.message.carried;
        let target = Target {
            task: ctx.task(),
            delivery: &ctx.delivery.id,
            paid_next: carried.paid_waits > 0 && !followed,
            url: url.as_deref(),
            wanted: &wanted,
            prior: prior.as_ref(),
        };
        let leg = self.fetch_polite(ctx, target, pass, time).await;
        let (page, spend) = (leg.fetched.page, leg.fetched.spend);
        Ok(Scraped {
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

    /// The host's permit once its start has come. A cooldown set meanwhile (by any
    /// sandbox's fetch) ends the request with a wait; the schedule takes the permit back.
    #[tracing::instrument(
        target = "conveyor_step",
        name = "host_start",
        skip_all,
        fields(waited_ms)
    )]
    async fn at_start(&self, ctx: &Ctx<'_>, pass: Pass) -> Stage<Pass> {
        let permit = match pass {
            Pass::Go(permit) => permit,
            refused => return Ok(refused),
        };
        let cutoff = ctx.invocation.cutoff;
        let ends = cutoff.checked_sub(ctx.settings.store_reserve);
        let ends = ends.unwrap_or(cutoff).into_std();
        let (measures, started) = (ctx.measures(), Instant::now());
        let ready = self
            .schedule
            .ready(self.tasks, permit, ends, measures)
            .await;
        let waited = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        tracing::Span::current().record("waited_ms", waited);
        match ready? {
            Ok(permit) => Ok(Pass::Go(permit)),
            Err(Later { delay, booked }) => Err(Outcome::WaitHeld {
                delay,
                booked,
                waits_for: WaitFor::Host,
            }),
        }
    }

    /// A refresh task's earlier result, if it can be carried forward: its object is there,
    /// with the bytes the task names, and it is not a block page (an older release stored
    /// those). Otherwise the prior is dropped and the page is fetched in full.
    async fn earlier(
        &self,
        ctx: &Ctx<'_>,
        prior: Option<Prior>,
        detection: &Detection,
    ) -> Result<(Option<Prior>, Option<Earlier>), StoreError> {
        let Some(prior) = prior else {
            return Ok((None, None));
        };
        if !prior.is_under(&ctx.settings.results_prefix) {
            tracing::warn!(key = %prior.key, "the earlier result is not one of the results: fetched in full");
            return Ok((None, None));
        }
        let why = match self.results.check_earlier(&prior).await? {
            EarlierCheck::Usable(earlier) => {
                let block = stored_block(self.results, detection, &prior.key, &earlier.stored);
                match Box::pin(block).await? {
                    None => return Ok((Some(prior), Some(*earlier))),
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
        ctx: &Ctx<'_>,
        target: Target<'_>,
        pass: Pass,
        time: Duration,
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
        let leg = self.fetch_paid_held_back(ctx, target, time).await;
        let fetched = &leg.fetched;
        // The last tier asked (0: direct), once the paid tier had its turn too.
        let tier = fetched.spend.spent().last().map_or(0, |(tier, _)| tier);
        trace::note("tier", tier as i64);
        // A proxy's own failure says nothing about the site's health. Neither does a fetch
        // that our own deadline cut short (the invocation's end, not the site's slowness):
        // the time of its last leg, the paid one if it ran, tells.
        let cut_short = fetched.page.as_ref().is_err_and(|e| e.timed_out)
            && leg.time < ctx.settings.scrape_timeout;
        // A block page on any tier means the site is refusing us. The fleet slows down, as
        // for a 429, even when a later tier got the page.
        let sign = match fetched.spend.blocks() {
            0 => health_sign(&fetched.page, started.elapsed()).filter(|_| !cut_short),
            _ => Some(Sign::PushedBack(None)),
        };
        self.leave(ctx, Some(permit), sign).await;
        leg
    }

    /// One fetch through the scraper, measured.
    async fn fetch_once(&self, ctx: &Ctx<'_>, url: Option<&str>, ask: Ask<'_>) -> Fetched {
        let Some(url) = url else {
            return Fetched::unspent(Err(FetchError::permanent("task has no url")));
        };
        let started = Instant::now();
        let fetched = self.fetcher.fetch(url, ask).await;
        ctx.measures().fetched(started.elapsed());
        ctx.measures().spent(&fetched.spend);
        fetched
    }

    /// Gives the host's permit back, with what the fetch said of the host's health (the
    /// record's give-back uses it too, for a permit no fetch followed).
    pub async fn leave(&self, ctx: &Ctx<'_>, permit: Option<Permit>, sign: Option<Sign>) {
        if let Some(permit) = permit {
            let measures = ctx.measures();
            self.schedule
                .leave(self.tasks, permit, sign, measures)
                .await;
        }
    }
}
