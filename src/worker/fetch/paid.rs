//! The paid proxy tier, held back while a run has a budget for it. It is used only once the
//! other tiers are blocked. Its fetch first takes a hold on the most bytes it may use, from
//! this sandbox's share of the run's budget (`crate::paid`). The hold is then settled with
//! what the fetch spent.

use std::time::Duration;

use tokio::time::Instant;

use crate::batch::Invocation;
use crate::paid::{PAID_BUDGET_HELD, PaidAnswer, PaidHold};
use crate::ports::hosts::HostStore;
use crate::ports::queue::Visibility;
use crate::ports::results::ResultStore;
use crate::ports::spend::SpendStore;
use crate::ports::tasks::TaskStore;
use crate::scraper::{Ask, FetchError, Fetched, Fetcher};

use super::super::Worker;
use super::Target;

impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility>
    Worker<T, R, F, V>
{
    /// The fetch. The paid tier is tried last, and only with a hold on the run's budget.
    pub(super) async fn fetch_paid_held_back(
        &self,
        target: Target<'_>,
        time: Duration,
        invocation: &Invocation,
    ) -> Fetched {
        let within = |time| Ask {
            if_changed: target.prior.map(|prior| &prior.validators),
            detection: &target.wanted.detection,
            ..Ask::within(time)
        };
        let (Some(run_budget), paid @ 1..) = (target.wanted.paid_budget, self.settings.proxy_tiers)
        else {
            return self.fetch(target.url, within(time), invocation).await;
        };
        let started = Instant::now();
        let withheld = Ask {
            paid_tier: false,
            ..within(time)
        };
        let first = self.fetch(target.url, withheld, invocation).await;
        if !first.wants_paid_tier {
            return first;
        }
        let (hold, first) = match self.paid_hold(target, run_budget, first).await {
            Ok(held) => held,
            Err(ended) => return ended,
        };
        let ask = Ask {
            first_tier: paid,
            wire_most: Some(self.settings.paid_fetch_cap),
            ..within(time.saturating_sub(started.elapsed()))
        };
        let last = self.fetch(target.url, ask, invocation).await;
        let spent = last.spend.tier(paid).billed();
        self.paid
            .settle(&self.tasks, hold, spent, target.delivery)
            .await;
        Fetched {
            spend: first.spend.plus(&last.spend),
            ..last
        }
    }

    /// A hold on the paid tier's most bytes from the run's budget, returned with the first
    /// fetch. Without a hold, returns what that first fetch ends as: the budget is spent,
    /// held by fetches in flight, or could not be read. What the other tiers spent stays
    /// spent either way.
    async fn paid_hold(
        &self,
        target: Target<'_>,
        run_budget: u64,
        first: Fetched,
    ) -> Result<(PaidHold, Fetched), Fetched> {
        let cap = self.settings.paid_fetch_cap;
        let held = self.paid.hold(&self.tasks, target.task, run_budget, cap);
        let reason = match held.await {
            Ok(PaidAnswer::Go(hold)) => return Ok((hold, first)),
            Ok(PaidAnswer::Spent) => return Err(first),
            Ok(PaidAnswer::Held) => PAID_BUDGET_HELD.to_owned(),
            Err(err) => format!("the paid tier's budget could not be read: {err}"),
        };
        let page = Err(FetchError::ours(reason));
        Err(Fetched { page, ..first })
    }
}
